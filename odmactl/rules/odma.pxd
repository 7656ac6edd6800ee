# Cython declarations for odma.py (see setup.py): the scalar rule, a C call from the allocator
# (allocator/odma.pxd cimports it).
cpdef object need_tokens(object prompt_tokens, object predicted_output_tokens, object uncertainty, object gamma,
                         object hedge_edges, object hedge_output_tokens)
cpdef object large_slot_tokens(object prompt_tokens, object max_new_tokens, object max_tokens)
