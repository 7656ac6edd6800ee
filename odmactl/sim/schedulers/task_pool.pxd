# Cython declarations for task_pool.py (pure Python source; see setup.py).
from odmactl.sim.schedulers.fcfs cimport FcfsScheduler


cdef class Waiting:
    cdef public long long n


cdef class TaskPoolScheduler(FcfsScheduler):
    cdef public dict queues, tags, failed, pools
    cdef public list records
    cdef long long[:] tagged_at
    cdef public long long aging_ps, shape
    cdef public tuple wake
    cdef object _heads_buffer
    cdef long long[:] heads
    cdef object _upcoming_tag(self, long long i)
    cdef long long _record(self, object tag) except? -1
    cdef void _to_front(self, long long i, object tag) except *
    cdef object _tag(self, long long i)
    cdef bint _tagged_now(self, long long i) except *
    cdef void _pop(self, long long t) except *
    cdef bint _stale(self, long long i, long long t, object tag) except *
    cdef long long _tried(self, object tag, long long i, long long tokens, long long admitted) except? -1
