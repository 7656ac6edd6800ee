# Cython declarations for int64buffer.py (pure Python source; see setup.py): the base extension
# type of KeyHeap and ExtentList, whose fields they index in C.
cdef class Int64Buffer:
    cdef public long long size, capacity
    cdef object _buffer
    cdef long long[::1] _values  # C-contiguous (an array('q')): indexed without a stride
    cdef void _grow(self) except *
