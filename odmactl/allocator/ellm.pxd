# Cython declarations for ellm.py (see setup.py): EllmAllocator as an extension type whose block
# limit and release the replay calls as C functions.
from odmactl.allocator.paged cimport PagedAllocator

cdef class EllmAllocator(PagedAllocator):
    cdef public object borrow_bytes, _activation_per_token, _activation_per_sequence, host_bytes, host_buffer_bytes
    cdef public object ttft_slo_s, tpot_slo_s, slo_aware, min_buffer_bytes, logical_buffer_bytes, alpha, host_used_bytes
    cdef public object offloads, fetches, offloaded_bytes, fetched_bytes, buffer_scalings, _ttft_window, _tpot_window
    cdef public dict _offloaded
    cpdef block_limit(self, tokens, sequences)
    cpdef release(self, allocation, final_tokens=*)
