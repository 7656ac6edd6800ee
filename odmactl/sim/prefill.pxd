# Cython declarations for prefill.py (pure Python source; see setup.py): PrefillClock as an
# extension type with C double fields, whose `ps` the replay calls as a C function.
cdef class PrefillClock:
    cdef public double flops_per_token, flops_per_square, weight_bytes, kv_bytes_per_token, peak_flops
    cdef public double seq_bw, overhead_s, comm_fixed_s, comm_per_token_s
    cpdef long long ps(self, long long total_tokens, long long squared_tokens) except? -1

cpdef long long _round_half_even(double y) except? -1
