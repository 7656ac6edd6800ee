# Cython declarations for unified.py (see setup.py): UnifiedAllocator as an extension type whose
# operations the replay calls as C functions, and its free page ranges as the compiled ExtentList.
from odmactl.allocator.base cimport AllocatorBase
from odmactl.allocator.extentlist cimport ExtentList

cdef class UnifiedAllocator(AllocatorBase):
    cdef public object page_tokens, page_bytes, num_pages, tail_bytes, best_fit, high_pages, low_pages
    cdef public object growth_fraction, max_pages, adapter_pages, hot_limit, free_pages, _kv, _adapters, _lru
    cdef public object last_acquire_hit, runs_released, scattered, evictions, evicted_pages, adapter_loads, adapter_hits
    cdef public ExtentList _free
    cpdef reserve(self, request_id, prompt_tokens, predicted_output_tokens=*, uncertainty=*)
    cpdef extend(self, allocation, total_tokens)
    cpdef release(self, allocation, final_tokens=*)
