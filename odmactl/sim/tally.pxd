# Cython declarations for tally.py (pure Python source; see setup.py): Tally as an extension type
# whose counters are C fields and whose methods the engine calls as C functions.
from odmactl.sim.series cimport Series

cdef unsigned long long HI_FLUSH  # tally.py's, a C constant (a module global would be looked up at each call)


cdef class Tally:
    cdef public long long preemptions, stalls, too_long, truncated, recomputed, migrations, peak, prefills, decodes, completed
    cdef public long long series_next_ps, updates_seen
    cdef public unsigned long long occupancy_hi, occupancy_lo
    cdef public object migrated_bytes, migration_ps, occupancy_byte_ps, boundaries
    cdef public Series series
    cdef public bint track_boundaries
    cpdef void occupy(self, long long reserved_now, long long dt) except *
    cpdef void migrated(self, object copied, long long dt, object reserved_now) except *
    cpdef bint observe(self, long long t, object alloc, long long n) except *
    cpdef void sample(self, long long t, object reserved_now, long long n, long long waiting) except *
    cpdef dict counters(self, long long end_ps, long long rejections, object link, object kv_pool_bytes, object prefix=*)
