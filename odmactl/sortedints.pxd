# Cython declarations for sortedints.py (pure Python source; see setup.py): SortedInts as an
# extension type whose methods the allocator's free extents (allocator/extents.pxd) call as C functions.
cdef class SortedInts:
    cdef public long long size, capacity
    cdef object _buffer
    cdef long long[:] _values
    cdef long long _index(self, long long x) except? -1
    cpdef long long ceiling(self, long long x) except? -2
    cpdef void add(self, long long x) except *
    cpdef void remove(self, long long x) except *
    cdef void _grow(self) except *
