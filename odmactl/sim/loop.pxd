# Cython declarations for loop.py (pure Python source; see setup.py): Replay as an extension type
# whose run state is C fields and whose helpers are C methods, and the extension types whose
# methods the loop calls as C functions. Locals are typed by loop.py's own `cython.*` annotations.
from odmactl.allocator.base cimport Allocation, AllocatorBase
from odmactl.sim.keyheap cimport KeyHeap
from odmactl.sim.prefill cimport PrefillClock
from odmactl.sim.segment cimport Segment


cdef class Replay:
    cdef public object w, settings, block, coeff, cost, progress, probe
    cdef public AllocatorBase alloc
    cdef public long long max_len
    cdef public bint paged
    # per run (see the class docstring)
    cdef bint ff, track_boundaries, dirty, retry
    cdef long long B, num, max_seqs, max_prefill, num_blocks
    cdef object block_bytes, pred, unc, ids, queue, series, boundaries
    cdef long long[:] prompt, target, output, arrival, gen, base, seq_of, start_ps, first_ps, done_ps, reserved_tokens
    cdef long long[:] request_of_seq, phase, runs
    cdef list allocs
    cdef dict running
    cdef KeyHeap finish, overflow
    cdef Segment segment
    cdef PrefillClock prefill_clock
    cdef long long t, it, span, kv_sum, runs_now, peak_blocks, next_arrival, next_seq
    cdef long long preemptions, rejections, too_long, truncated, recomputed, migrations, peak, prefills, decodes
    cdef long long completed, occupancy_acc, series_next_ps, updates_seen
    cdef object migrated_bytes, migration_ps, occupancy_byte_ps
    cdef bint runs_tracked, borrows, serves_adapters, offload, slo_aware
    cdef long long[:] adapters
    cdef object parked, offloaded, host_seen, host_link_bytes, kv_pool_bytes
    cdef long long link_ps, link_bottleneck_ps, pending_link_ps

    cdef tuple _start(self)
    cdef object _finish(self, object prompt_np, object target_np)
    cdef object _reserved_bytes(self)
    cdef void _arrive(self) except *
    cdef void _leave(self, long long i) except *
    cdef long long _catch_up(self, long long i) except? -1
    cdef void _unpin(self, long long i) except *
    cdef void _finish_request(self, long long i) except *
    cdef void _done(self, long long i) except *
    cdef void _preempt(self, long long i) except *
    cdef void _reject(self, long long i) except *
    cdef void _push_events(self, long long i, long long seq) except *
    cdef list _admit(self)
    cdef void _prefill(self, list admitted) except *
    cdef void _join(self, long long i, long long v) except *
    cdef long long _link_ps(self) except? -1
    cdef void _fetch(self) except *
    cdef void _finish_offloaded(self, long long i) except *
    cdef long long _blocks_limit(self, long long tokens, long long sequences) except? -1
    cdef long long _overlap_fetch(self, long long first_ps) except? -1
    cdef long long _link_beyond(self, long long link_ps, long long compute_ps) except? -1
    cdef void _grow_contiguous(self, long long i) except *
    cdef void _preempt_newest_until_fits(self, long long need_at, long long limit) except *
    cdef void _grow_fast(self) except *
    cdef void _grow_stepping(self) except *
    cdef long long _next_event(self) except? -1
    cdef void _decode_fast(self) except *
    cdef void _decode_stepping(self) except *
    cdef void _advance(self, long long n, long long k, long long dt) except *
    cdef void _complete(self) except *
