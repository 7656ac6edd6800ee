# Cython declarations for extentlist.py (pure Python source; see setup.py): ExtentList as an
# extension type whose methods the allocator's free extents (allocator/extents.pxd) call as C functions.
from libc.string cimport memmove

from odmactl.allocator.int64buffer cimport Int64Buffer


cdef class ExtentList(Int64Buffer):
    cpdef long long take(self, long long nbytes) except? -2
    cpdef void add(self, long long start, long long nbytes) except *
    cpdef bint take_at(self, long long start, long long nbytes) except *
    cpdef long long take_first(self, long long nbytes) except? -2
    cpdef long long largest(self) except? -2
    cpdef long long size_at(self, long long start) except? -1
    cdef long long _after(self, long long start) except? -1
    cdef void _open(self, long long j) except *
    cdef void _close(self, long long j) except *
