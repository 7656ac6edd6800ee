# Cython declarations for base.py (pure Python source; see setup.py): Scheduler as an extension type
# whose methods the engine calls as C functions (engine.pxd cimports it); a scheduler in Python
# may subclass it and override them.
from odmactl.allocator.base cimport AllocatorBase
from odmactl.sim.batch cimport Batch


cdef class Scheduler:
    cdef public object waiting, parked, stalled, tier, cache, prefix
    cdef public Batch batch
    cdef public AllocatorBase alloc
    cdef public long long max_num_seqs, max_prefill_tokens, free_blocks, now, budget
    cdef public bint chunked
    cpdef void start(self, Batch batch, AllocatorBase alloc, object tier, object cache, long long max_num_seqs,
                     long long max_prefill_tokens, object settings=*) except *
    cpdef void arrive(self, long long i) except *
    cpdef void requeue(self, long long i) except *
    cpdef void released(self) except *
    cpdef void preempted(self) except *
    cpdef void decoded(self) except *
    cpdef bint idle(self) except *
    cpdef bint quiet(self) except *
    cpdef list schedule(self)
    cpdef long long seats(self) except? -1
    cpdef bint over_budget(self, long long tokens, long long kv, long long admitted) except *
    cpdef long long charged(self, long long tokens, long long kv) except? -1
    cpdef long long victim(self) except? -1
    cpdef long long decode_limit(self) except? -1
    cpdef long long first_waking(self, long long n, long long j) except? -2
    cpdef void begin_round(self) except *
    cpdef long long new_tokens(self, long long i) except? -1
    cpdef long long _take(self, long long i, long long tokens, long long admitted) except? -1
    cpdef object left(self, long long i)
    cpdef bint never_fits(self, long long admitted) except *
    cpdef void swap_in(self) except *
