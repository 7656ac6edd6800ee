# Cython declarations for base.py (see setup.py): extension types with the same attributes as the
# Python classes. Fields are Python objects (values behave exactly as in the .py), except the
# containers, which are always the declared type.
cdef class Allocation:
    cdef public object request_id, offset_bytes, nbytes, capacity_tokens, used_tokens, bucket, region, block_ids, live

cdef class AllocatorBase:
    cdef public object pool_bytes, bytes_per_token, config, arena, max_tokens
    cdef public dict _live
    cdef public object reserved_bytes, peak_reserved_bytes, failed_reserves, extends, failed_extends
    cdef public object migrations, migrated_bytes, releases
    cdef dict __dict__
