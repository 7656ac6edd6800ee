# Cython declarations for series.py (pure Python source; see setup.py): Series as an extension type
# whose `add` the tally (tally.py) calls at every sampled event boundary of every replay.
cdef class Series:
    cdef public long long points, gap_ps, next_ps
    cdef public list rows
    cpdef long long add(self, long long t_ps, object reserved_bytes, long long batch, long long queue) except? -1
