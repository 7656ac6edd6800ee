# Cython declarations for sortedints.py (pure Python source; see setup.py): SortedInts as an
# extension type whose methods the allocator's free extents (allocator/extents.pxd) call as C functions.
from odmactl.int64buffer cimport Int64Buffer


cdef class SortedInts(Int64Buffer):
    cdef long long _index(self, long long x) except? -1
    cpdef long long ceiling(self, long long x) except? -2
    cpdef void add(self, long long x) except *
    cpdef void remove(self, long long x) except *
