# Cython declarations for paged.py (see setup.py).
cimport cython

from odmactl.allocator.base cimport Allocation, AllocatorBase

cdef class PagedAllocator(AllocatorBase):
    cdef public object tail_bytes, _head, _free, prefix, cached_free_blocks
    cpdef reserve(self, request_id, prompt_tokens, predicted_output_tokens=*, uncertainty=*)
    @cython.locals(a=Allocation)
    cpdef extend(self, allocation, total_tokens)
    @cython.locals(a=Allocation)
    cpdef release(self, allocation, final_tokens=*)
    cpdef _take(self, n)
