# Cython declarations for contiguous.py (see setup.py).
from odmactl.allocator.base cimport AllocatorBase

cdef class ContiguousAllocator(AllocatorBase):
    cdef public dict regions
    cdef public object _main, _realized, _realized_batch
