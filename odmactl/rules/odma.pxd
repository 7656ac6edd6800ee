# Cython declarations for odma.py (see setup.py): the scalar rule, a C call from the allocator
# (allocator/odma.pxd cimports it), in C numbers: token counts stay far below 2**63, and a
# predicted length, an uncertainty and gamma are Python floats (C doubles).
cimport cython

cdef double CEIL_LIMIT

@cython.locals(whole=cython.longlong)
cpdef long long ceil_tokens(double x) except? -1

@cython.locals(need=cython.longlong, u=cython.double)
cpdef long long need_tokens(long long prompt_tokens, double predicted_output_tokens, object uncertainty, double gamma,
                            object hedge_edges, object hedge_output_tokens) except? -1

cpdef object large_slot_tokens(object prompt_tokens, object max_new_tokens, object max_tokens)
