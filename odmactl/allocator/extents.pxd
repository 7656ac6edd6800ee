# Cython declarations for extents.py (see setup.py): FreeExtents as an extension type.
from odmactl.sortedints cimport SortedInts


cdef class FreeExtents:
    cdef public object base, size_bytes, free_bytes, binned_bytes, consolidations
    cdef public dict _bins, _size_at, _start_ending_at, _starts_of_size
    cdef public SortedInts _sizes
    # the operations, C calls from compiled callers; the helpers, C calls only
    cpdef take(self, nbytes)
    cpdef give(self, start, nbytes)
    cdef _reset(self)
    cdef _take_extent(self, nbytes)
    cdef _merge(self, start, nbytes)
    cdef _insert(self, start, nbytes)
    cdef _unfile(self, start, nbytes)
