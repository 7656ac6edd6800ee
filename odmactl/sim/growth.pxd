# Cython declarations for growth.py (pure Python source; see setup.py): Growth as an extension type
# whose methods the engine calls as C functions.
from odmactl.allocator.base cimport Allocation, AllocatorBase
from odmactl.sim.batch cimport Batch
from odmactl.sim.schedulers.base cimport Scheduler
from odmactl.sim.tally cimport Tally


cdef class Growth:
    cdef public Batch batch
    cdef public AllocatorBase alloc
    cdef public Scheduler sched
    cdef public Tally tally
    cdef public object cost, cache, prefix
    cdef public object resumed_at
    cpdef void unpin(self, long long i) except *
    cpdef void first_token_room(self, long long i, long long k) except *
    cpdef void preempt(self, long long i) except *
    cpdef void give_back(self, long long i, long long v, bint completed) except *
    cdef void _evict(self, long long i, long long v) except *
    cdef long long _extend(self, Allocation a, long long total) except? -2
    cpdef void stall(self, long long i) except *
    cpdef long long resume(self) except? -1
    cpdef long long unstall(self) except? -1
    cpdef void release_offloaded(self, long long i) except *
    cpdef void preempt_stalled(self) except *
    cpdef long long contiguous(self, long long i) except? -1
    cpdef void until_fits(self, long long need_at, long long limit) except *
    cpdef long long fast(self) except? -1
    cpdef long long stepping(self) except? -1
