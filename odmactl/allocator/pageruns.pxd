# Cython declarations for pageruns.py (pure Python source; see setup.py): PageRuns as an extension
# type whose methods the unified allocator (allocator/unified.pxd) calls as C functions.
from odmactl.allocator.extentlist cimport ExtentList
from odmactl.allocator.int64buffer cimport Int64Buffer


cdef class PageRuns(Int64Buffer):
    cdef public long long free_node
    cdef long long _node(self) except? -1
    cdef void _drop(self, long long n) except *
    cpdef long long new(self) except? -1
    cpdef void discard(self, long long h) except *
    cpdef void append(self, long long h, long long start, long long pages) except *
    cpdef long long runs(self, long long h) except? -1
    cpdef long long first_page(self, long long h) except? -1
    cpdef long long last(self, long long h) except? -2
    cpdef long long end(self, long long n) except? -1
    cpdef void widen(self, long long n, long long pages) except *
    cpdef bint join_next(self, long long h, long long n) except *
    cpdef long long give_all(self, long long h, ExtentList free) except? -1
