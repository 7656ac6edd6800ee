# Cython declarations for prefill.py (pure Python source; see setup.py): PrefillClock as an
# extension type with C double fields, whose `ps` the replay calls as a C function.
cdef class PrefillClock:
    cdef public double layer_bytes, layer_flops_per_token, head_bytes, head_flops_per_token, peak_bw, peak_flops
    cdef public double attention_flops_per_square, attention_efficiency, fixed_s, per_token_s, attention_fixed_s
    cdef public object tokens, efficiency
    cdef double[::1] _tokens, _efficiency_table
    cdef public Py_ssize_t entries
    cdef double _efficiency(self, double m)
    cdef double _roofline(self, double weight_bytes, double flops_per_token, double m)
    cpdef long long ps(self, long long total_tokens, long long squared_tokens, long long prompts) except? -1
    cpdef long long beside_decodes_ps(self, long long decodes, long long total_tokens, long long squared_tokens,
                                      long long chunks) except? -1

cpdef long long _round_half_even(double y) except? -1
