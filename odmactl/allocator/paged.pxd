# Cython declarations for paged.py (see setup.py).
cimport cython

from odmactl.allocator.base cimport Allocation, AllocatorBase

cpdef long long prompt_blocks(long long prompt_tokens, long long block_size_tokens) except? -1


cdef class PagedAllocator(AllocatorBase):
    cdef public object tail_bytes, _head, _free, prefix, cached_free_blocks
    cpdef reserve(self, request_id, prompt_tokens, predicted_output_tokens=*, uncertainty=*)
    cpdef reservation_tokens(self, prompt_tokens, predicted_output_tokens, uncertainty)
    cpdef room_for(self, prompt_tokens, predicted_output_tokens, uncertainty)
    @cython.locals(a=Allocation)
    cpdef extend(self, allocation, total_tokens)
    @cython.locals(a=Allocation)
    cpdef release(self, allocation, final_tokens=*)
    cpdef _take(self, n)
