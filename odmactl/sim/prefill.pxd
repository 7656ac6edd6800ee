# Cython declarations for prefill.py (pure Python source; see setup.py): PrefillClock as an
# extension type whose `ps` the replay calls as a C function.
cdef class PrefillClock:
    cdef public object coeff
    cpdef long long ps(self, long long total_tokens, long long squared_tokens, long long prompts) except? -1

cpdef long long _round_half_even(double y) except? -1
