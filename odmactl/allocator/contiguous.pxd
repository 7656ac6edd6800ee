# Cython declarations for contiguous.py (see setup.py).
cimport cython

from odmactl.allocator.base cimport Allocation, AllocatorBase
from odmactl.allocator.extents cimport FreeExtents

cdef class ContiguousAllocator(AllocatorBase):
    cdef public dict regions
    cdef public object _main, _realized, _realized_batch
    @cython.locals(a=Allocation)
    cpdef release(self, allocation, final_tokens=*)
    cpdef room_for(self, prompt_tokens, predicted_output_tokens, uncertainty)
    cpdef _reserve_in(self, FreeExtents extents, region, request_id, capacity_tokens, prompt_tokens, bucket)
    @cython.locals(x=Allocation)
    cpdef _grow_in_place(self, a, total_tokens)
