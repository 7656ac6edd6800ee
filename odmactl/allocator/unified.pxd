# Cython declarations for unified.py (see setup.py): UnifiedAllocator as an extension type whose
# operations the replay calls as C functions, its page counts as C integers and its watermarks
# and growth share as C doubles (the same values as Python's ints and floats: page counts stay far
# below 2**53), its free page ranges as the compiled ExtentList and the page ranges held as the compiled
# PageRuns.
from odmactl.allocator.base cimport Allocation, AllocatorBase
from odmactl.allocator.extentlist cimport ExtentList
from odmactl.allocator.pageruns cimport PageRuns

cpdef long long prompt_pages(long long prompt_tokens, long long page_tokens) except? -1


cdef class UnifiedAllocator(AllocatorBase):
    cdef public long long page_tokens, page_bytes, num_pages, tail_bytes, max_pages, adapter_pages, hot_limit
    cdef public long long free_pages, runs_released, scattered, evictions, evicted_pages, adapter_loads, adapter_hits
    cdef public long long adapter_bytes, host_bytes
    cdef public double growth_fraction, high_pages, low_pages
    cdef public bint best_fit, last_acquire_hit
    cdef public object _adapters, _lru
    cdef public PageRuns _runs
    cdef public ExtentList _free
    cpdef reserve(self, request_id, prompt_tokens, predicted_output_tokens=*, uncertainty=*)
    cpdef reservation_tokens(self, prompt_tokens, predicted_output_tokens, uncertainty)
    cpdef room_for(self, prompt_tokens, predicted_output_tokens, uncertainty)
    cpdef extend(self, allocation, total_tokens)
    cpdef release(self, allocation, final_tokens=*)
    cpdef void _evict_lru(self) except *
    cpdef void _evict_until(self, double free_pages) except *
    cpdef void _after_allocation(self) except *
    cpdef long long _give(self, long long h) except? -1
    cpdef long long _range(self, long long pages) except? -2
    cpdef bint _take(self, long long pages, bint contiguous, long long h) except *
    cpdef long long _grow(self, long long h, long long need, long long step) except? -1
