# Cython declarations for paged.py (see setup.py).
from odmactl.allocator.base cimport AllocatorBase

cdef class PagedAllocator(AllocatorBase):
    cdef public object tail_bytes, _head, _free, prefix, cached_free_blocks
    cpdef reserve(self, request_id, prompt_tokens, predicted_output_tokens=*, uncertainty=*)
    cpdef extend(self, allocation, total_tokens)
    cpdef release(self, allocation, final_tokens=*)
    cpdef _take(self, n)
