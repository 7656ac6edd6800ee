# Cython declarations for base.py (see setup.py): extension types with the same attributes as the
# Python classes. Fields are Python objects (values behave exactly as in the .py), except the
# containers, which are always the declared type, and the sizes and counters (an Allocation's
# offset, bytes and tokens; the allocator's bytes and counts: whole numbers far below 2**63), C
# integers so that every reserve, extend and release reads and adds to them without making a
# Python int (a byte count past 2**30 took a new one at each addition). A policy reads an
# Allocation's fields in C once it holds it in a typed local (`@cython.locals(a=Allocation)`, in
# its .pxd or on the method, after `_own` or `_growth` found it live); the helpers below take it
# typed.
cimport cython


cdef class Allocation:
    cdef public object request_id, bucket, region, block_ids, live, limit_tokens, owner
    cdef public long long offset_bytes, nbytes, capacity_tokens, used_tokens, handle

cdef class AllocatorBase:
    cdef public object pool_bytes, kv_pool_bytes, bytes_per_token, config, arena, max_tokens, deployment
    cdef public dict _live
    cdef public long long reserved_bytes, peak_reserved_bytes, failed_reserves, extends, failed_extends
    cdef public long long migrations, migrated_bytes, releases
    # the replay's questions (the Allocator protocol): growth geometry and boundary changes
    cdef public object block_size_tokens, num_blocks, block_bytes, boundaries_tokens, boundary_updates
    cdef public object read_block_tokens, kv_runs
    # no __dict__: every attribute is declared (here or in a policy's .pxd), so a cpdef call from
    # compiled code need not look for a Python-level override on the instance
    # the operations: C calls from compiled callers (the replay); policies override them in their .pxd
    cpdef reserve(self, request_id, prompt_tokens, predicted_output_tokens=*, uncertainty=*)
    cpdef extend(self, allocation, total_tokens)
    cpdef release(self, allocation, final_tokens=*)
    @cython.locals(x=Allocation, total=cython.longlong)
    cpdef _growth(self, a, total_tokens)
    cpdef _final_growth(self, Allocation a, final_tokens, capacity_tokens)
    cpdef _admit(self, request_id, prompt_tokens)
    cpdef _own(self, a)
    cpdef _admitted(self, Allocation a)
    cpdef _forget(self, Allocation a)
    cpdef block_limit(self, tokens, sequences)
    cpdef tag_of(self, prompt_tokens, predicted_output_tokens, uncertainty)
    cpdef reservation_tokens(self, prompt_tokens, predicted_output_tokens, uncertainty)
    cpdef room_for(self, prompt_tokens, predicted_output_tokens, uncertainty)
    cpdef overflow_waits(self, allocation, total_tokens)
    cpdef room_version(self, tag)
