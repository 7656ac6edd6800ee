# Cython declarations for replay.py (pure Python source; see setup.py): the extension types whose
# methods the event loop calls as C functions. Everything else in replay.py is typed by its own
# `cython.*` annotations.
from odmactl.allocator.base cimport Allocation, AllocatorBase
from odmactl.sim.keyheap cimport KeyHeap
from odmactl.sim.prefill cimport PrefillClock
from odmactl.sim.segment cimport Segment
