# Cython declarations for segment.py (pure Python source; see setup.py): Segment as an extension
# type with C fields. Every time field is a step time or a coefficient, far below 2**63 ps; runs,
# m0 and held are int64 buffers (array('q') in Python; `runs` is also the caller's to fill), and
# gemm_ps the GEMM time by batch size.
# The cpdef methods are C calls from the replay (sim/loop.pxd cimports Segment).
cdef class Segment:
    cdef public long long fixed_ps, per_seq_ps, per_token_ps, per_run_ps, batch_ps
    cdef public long long period, dm, d_held
    cdef public bint block_growth, read_per_request
    cdef public object runs
    cdef long long[::1] _runs, m0, held, gemm_ps
    cpdef Segment reset(self, long long n, long long kv_tokens_sum)
    cpdef long long elapsed_ps(self, long long k) except? -1
    cpdef tuple advance(self, long long k, bint held=*)
    cpdef long long first_over(self, long long limit_runs, long long k) except? -1
    cpdef long long iterations_until(self, long long deadline_ps, long long k) except? -1

cdef long long _occupancy_c(long long h0, long long g, long long ov, long long m0, long long dm, long long terms)
