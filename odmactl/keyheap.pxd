# Cython declarations for keyheap.py (pure Python source; see setup.py): KeyHeap as an extension
# type whose methods other compiled modules (replay.pxd cimports it) call as C functions.
cdef class KeyHeap:
    cdef public long long size, capacity
    cdef object _buffer
    cdef long long[:] _keys
    cpdef void push(self, long long key) except *
    cpdef long long top(self) except? -1
    cpdef long long pop(self) except? -1
    cdef void _grow(self) except *
