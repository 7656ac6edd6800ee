# Cython declarations for segment.py (pure Python source; see setup.py): Segment as an extension
# type with C fields. Every time field is a step time or a coefficient, far below 2**63 ps; runs,
# m0 and held are int64 buffers (array('q') in Python; `runs` is also the caller's to fill).
# The cpdef methods are C calls from the replay (sim/loop.pxd cimports Segment).
cdef class Segment:
    cdef public long long weights_ps, per_token_ps, per_run_ps, compute_per_seq_ps, overhead_ps
    cdef public long long comm_fixed_ps, comm_per_seq_ps, batch_overhead_ps
    cdef public long long period, compute_ps, dm, d_held
    cdef public bint paged
    cdef public object runs
    cdef long long[:] _runs, m0, held
    cpdef Segment reset(self, long long n, long long kv_tokens_sum)
    cpdef long long elapsed_ps(self, long long k) except? -1
    cpdef tuple advance(self, long long k, bint held=*)
    cpdef long long first_over(self, long long limit_runs, long long k) except? -1
    cpdef long long iterations_until(self, long long deadline_ps, long long k) except? -1

cdef long long _occupancy_c(long long h0, long long g, long long c, long long ov, long long m0, long long dm,
                            long long cut, long long terms)
