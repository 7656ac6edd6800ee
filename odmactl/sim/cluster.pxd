# Cython declarations for cluster.py (pure Python source; see setup.py): Cluster as an extension
# type whose routing loop calls the engines' (engine.pxd) methods as C functions.
from odmactl.sim.batch cimport Batch
from odmactl.sim.engine cimport Replay


cpdef long long outstanding(Replay engine) except? -1
cpdef long long pick(long long rule, long long j, list engines, long long[::1] pending) except? -1
cpdef long long ready_in_turn(list engines, long long[::1] pending, long long turn, long long i) except? -2


cdef class Cluster:
    cdef public list engines, unstarted
    cdef public long long rule, turn
    cdef public object owner, prompt_tokens, arrival_ps, pending
    cpdef void _settle(self) except *
    cpdef list run(self)
    cdef list _route(self)
