# Cython declarations for s3.py (see setup.py).
from odmactl.allocator.contiguous cimport ContiguousAllocator

cdef class S3Allocator(ContiguousAllocator):
    cdef public object capacities_tokens, preempts, escalations
    cdef public dict _escalated
    cpdef reserve(self, request_id, prompt_tokens, predicted_output_tokens=*, uncertainty=*)
    cpdef extend(self, allocation, total_tokens)
