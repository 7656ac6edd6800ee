# Cython declarations for keyheap.py (pure Python source; see setup.py): KeyHeap as an extension
# type whose methods other compiled modules (sim/loop.pxd cimports it) call as C functions.
from odmactl.allocator.int64buffer cimport Int64Buffer


cdef class KeyHeap(Int64Buffer):
    cpdef void push(self, long long key) except *
    cpdef long long top(self) except? -1
    cpdef long long pop(self) except? -1
