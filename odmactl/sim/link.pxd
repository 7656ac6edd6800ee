# Cython declarations for link.py (pure Python source; see setup.py): HostLink as an extension type
# whose methods the engine calls as C functions.
cdef class HostLink:
    cdef public object cost, sources, seen, moved_bytes
    cdef public long long link_ps, bottleneck_ps, pending_ps
    cdef object _total(self)
    cpdef long long moved_ps(self) except? -1
    cpdef long long with_moves(self, long long compute_ps) except? -1
    cpdef long long beyond(self, long long link_ps, long long compute_ps) except? -1
    cpdef long long overlap_pending(self, long long first_ps) except? -1
