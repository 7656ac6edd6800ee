# Cython declarations for extents.py (see setup.py): FreeExtents as an extension type.
from odmactl.allocator.extentlist cimport ExtentList


cdef class FreeExtents:
    cdef public object base, size_bytes, free_bytes, binned_bytes, consolidations, gives
    cdef public dict _bins
    cdef public ExtentList _extents
    # the operations, C calls from compiled callers; the helper, a C call only
    cpdef take(self, nbytes)
    cpdef give(self, start, nbytes)
    cpdef bint can_take(self, nbytes) except *
    cdef _reset(self)
