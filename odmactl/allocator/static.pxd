# Cython declarations for static.py (see setup.py).
from odmactl.allocator.contiguous cimport ContiguousAllocator

cdef class StaticAllocator(ContiguousAllocator):
    cdef public object _fixed
