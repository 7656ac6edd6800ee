# Cython declarations for engine.py (pure Python source; see setup.py): Replay as an extension type
# whose run state is C fields and whose helpers are C methods, and the extension types whose
# methods the engine calls as C functions. Locals are typed by engine.py's own `cython.*` annotations.
from odmactl.allocator.base cimport Allocation, AllocatorBase
from odmactl.sim.batch cimport Batch
from odmactl.sim.chunked cimport Chunker
from odmactl.sim.growth cimport Growth
from odmactl.sim.link cimport HostLink
from odmactl.sim.prefill cimport PrefillClock
from odmactl.sim.schedulers.base cimport Scheduler
from odmactl.sim.segment cimport Segment
from odmactl.sim.tally cimport Tally


cdef class Replay:
    cdef public object w, settings, coeff, cost, progress, probe, tier, cache
    cdef public AllocatorBase alloc
    cdef public long long max_len
    cdef public Batch batch
    cdef public Scheduler sched
    cdef public HostLink link
    cdef Segment segment
    cdef PrefillClock prefill_clock
    cdef long long[::1] runs
    cdef public Tally tally
    cdef public Growth growth
    cdef Chunker chunker
    cdef object block_bytes
    cdef bint ff, chunked
    cdef public bint paused
    cdef public object owner
    cdef long long me
    cdef long long num, next_arrival
    cdef public long long t

    cpdef bint resume(self) except *

    cpdef void start(self, object owner, long long me, object requests=*) except *
    cpdef object finish(self)
    cpdef object reserved_bytes(self)
    cdef void _arrive(self) except *
    cdef void _finish_request(self, long long i) except *
    cdef void _done(self, long long i) except *
    cdef void _first_token(self, long long i) except *
    cdef bint _step_chunked(self) except *
    cdef void _prefill(self, list admitted) except *
    cdef bint _decode_fast(self) except *
    cdef bint _grow(self) except *
    cdef void _decode_segment(self) except *
    cdef void _load_segment(self, long long n) except *
    cdef long long _run_segment(self, long long n, long long k, long long extra, bint mixed) except? -1
    cdef long long _decode_stepping(self, long long extra=*, list chunks=*) except? -1
    cdef void _advance(self, long long n, long long k, long long dt) except *
    cdef void _complete(self) except *
