# Cython declarations for odma.py (see setup.py).
cimport cython

from odmactl.allocator.contiguous cimport ContiguousAllocator
from odmactl.rules.odma cimport large_slot_tokens, need_tokens as need_rule

cdef class OdmaAllocator(ContiguousAllocator):
    cdef public object large_block_bytes, _large, gamma, tau, refitter
    cdef public object hedge_edges, hedge_output_tokens
    cdef public object _deferred, refit_due, routed_large, max_new_tokens, peak_large_bytes
    cdef public object large_spill, large_spills
    cdef public tuple _bucket_tags
    cdef public long long _main_top
    cdef long long[::1] _bounds
    cpdef reserve(self, request_id, prompt_tokens, predicted_output_tokens=*, uncertainty=*)
    cpdef extend(self, allocation, total_tokens)
    @cython.locals(need=cython.longlong, lo=cython.Py_ssize_t, hi=cython.Py_ssize_t, mid=cython.Py_ssize_t)
    cpdef _route(self, prompt_tokens, predicted_output_tokens, uncertainty)
    cpdef _large_peak(self)
    cpdef _large_home(self, slot_tokens)
    @cython.locals(capacity=cython.longlong)
    cdef long long _block_tokens(self, long long bucket, long long slot_tokens) except? -1
    cpdef reservation_tokens(self, prompt_tokens, predicted_output_tokens, uncertainty)
    cpdef room_for(self, prompt_tokens, predicted_output_tokens, uncertainty)
    cpdef tag_of(self, prompt_tokens, predicted_output_tokens, uncertainty)
    cpdef overflow_waits(self, allocation, total_tokens)
    cpdef room_version(self, tag)
