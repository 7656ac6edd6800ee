# Cython declarations for extentlist.py (pure Python source; see setup.py): ExtentList as an
# extension type whose methods the allocator's free extents (allocator/extents.pxd) call as C functions.
from libc.string cimport memmove

from odmactl.allocator.int64buffer cimport Int64Buffer


cdef class ExtentList(Int64Buffer):
    cdef ExtentList _pieces
    cpdef long long take(self, long long nbytes) except? -2
    cpdef long long take_first(self, long long nbytes) except? -2
    cpdef bint holds(self, long long nbytes) except *
    cdef long long _take_fit(self, long long nbytes, bint first) except? -2
    cdef long long _fit(self, long long nbytes, bint first) except? -1
    cpdef long long take_largest_first(self, long long nbytes) except? -2
    cdef long long _give_piece(self, long long start, long long size, long long nbytes) except? -1
    cpdef long long piece_start(self, long long i) except? -1
    cpdef long long piece_size(self, long long i) except? -1
    cpdef void add(self, long long start, long long nbytes) except *
    cpdef long long take_at(self, long long start, long long most, long long least) except? -1
    cdef void _take_front(self, long long j, long long nbytes) except *
    cdef long long _after(self, long long start) except? -1
    cdef void _insert(self, long long j, long long first, long long second) except *
    cdef void _clear(self)
    cdef void _close(self, long long j) except *
