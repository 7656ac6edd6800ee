# Cython declarations for s3.py (see setup.py).
from odmactl.allocator.contiguous cimport ContiguousAllocator

cpdef Py_ssize_t bucket_of(tuple capacities_tokens, object predicted_output_tokens) except? -1
cpdef long long block_tokens(long long prompt_tokens, long long capacity_tokens, bint predicted, long long max_tokens)


cdef class S3Allocator(ContiguousAllocator):
    cdef public object capacities_tokens, preempts, escalations
    cdef public dict _escalated
    cpdef reserve(self, request_id, prompt_tokens, predicted_output_tokens=*, uncertainty=*)
    cpdef extend(self, allocation, total_tokens)
    cpdef reservation_tokens(self, prompt_tokens, predicted_output_tokens, uncertainty)
