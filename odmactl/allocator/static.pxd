# Cython declarations for static.py (see setup.py).
from odmactl.allocator.contiguous cimport ContiguousAllocator

cdef class StaticAllocator(ContiguousAllocator):
    cdef public object _fixed, _max_new
    cpdef reserve(self, request_id, prompt_tokens, predicted_output_tokens=*, uncertainty=*)
    cpdef extend(self, allocation, total_tokens)
    cpdef reservation_tokens(self, prompt_tokens, predicted_output_tokens, uncertainty)
