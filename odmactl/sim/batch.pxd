# Cython declarations for batch.py (pure Python source; see setup.py): Batch as an extension type
# whose state is C fields (per-request int64 buffers) and whose methods the engine and the
# schedulers (engine.pxd, schedulers/*.pxd cimport it) call as C functions.
from odmactl.sim.keyheap cimport KeyHeap


cdef class Batch:
    cdef public long long num, next_seq, span, it, kv_sum, B, num_blocks, runs_now, peak_blocks, rejections, prefilling_blocks, shared
    cdef public bint block_growth, ff
    cdef long long[::1] prompt, target, output, arrival, gen, base, seq_of, start_ps, first_ps, done_ps, reserved_tokens
    cdef long long[::1] request_of_seq, phase, adapters, cached
    cdef public list allocs
    cdef public dict offloaded, running, prefilling
    cdef public KeyHeap finish, overflow
    cdef public list ids, pred, unc
    cpdef object timeline(self, object mine=*)
    cpdef bint started(self, long long i) except *
    cpdef long long kv(self, long long i) except? -1
    cpdef void join(self, long long i, long long v) except *
    cpdef void note_peak(self) except *
    cpdef void begin_prefill(self, long long i) except *
    cpdef void end_prefill(self, long long i) except *
    cpdef long long leave(self, long long i) except? -1
    cpdef long long newest(self) except? -1
    cpdef void reject(self, long long i) except *
    cpdef long long held_blocks(self, object alloc) except? -1
    cpdef long long blocks_next(self) except? -1
    cpdef void fill_runs(self, long long[::1] runs) except *
    cpdef void push_finish(self, long long i, long long seq) except *
    cpdef void push_overflow(self, long long i, long long seq, long long capacity) except *
    cpdef bint live(self, long long key) except *
    cpdef long long live_top(self, KeyHeap heap) except? -2
    cpdef long long next_event(self) except? -1
    cpdef bint overflow_now(self) except *
    cpdef bint completes_now(self) except *
    cpdef long long due(self, KeyHeap heap) except? -2
