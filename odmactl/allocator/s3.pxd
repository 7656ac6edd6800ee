# Cython declarations for s3.py (see setup.py).
from odmactl.allocator.contiguous cimport ContiguousAllocator

cdef class S3Allocator(ContiguousAllocator):
    cdef public object capacities_tokens
