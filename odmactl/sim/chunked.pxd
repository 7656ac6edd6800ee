# Cython declarations for chunked.py (pure Python source; see setup.py): Chunker as an extension
# type whose methods the engine calls as C functions.
from odmactl.sim.batch cimport Batch
from odmactl.sim.growth cimport Growth
from odmactl.sim.prefill cimport PrefillClock
from odmactl.sim.segment cimport Segment
from odmactl.sim.schedulers.base cimport Scheduler
from odmactl.sim.tally cimport Tally


cdef class Chunker:
    cdef public Batch batch
    cdef public Scheduler sched
    cdef public Growth growth
    cdef public Tally tally
    cdef public long long budget_tokens, tokens, squares, count
    cdef public PrefillClock clock
    cdef public Segment segment
    cpdef long long extra_ps(self, long long n) except? -1
    cpdef list plan(self, long long n, bint admit)
    cdef void _add(self, list chunks, long long i, long long c) except *
    cpdef list computed(self, list chunks)
