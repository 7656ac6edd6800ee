# Cython declarations for fcfs.py (pure Python source; see setup.py).
from odmactl.sim.schedulers.base cimport Scheduler


cdef class FcfsScheduler(Scheduler):
    cdef public bint dirty, retry
