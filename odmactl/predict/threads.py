"""One CPU thread for the predictor's arithmetic, so a fit or a prediction gives the same bits on
every run.

torch's CPU kernels split reductions (bias and embedding gradients, sums) into one chunk a thread,
and MKL may use fewer threads than asked when the machine is busy (MKL_DYNAMIC), so the order of
float additions, and with it the low bits of every weight, followed the thread count: two fits of
the same trace and seed in one process gave different weights on a loaded CI machine. With one
thread the order is fixed. The predictor's network is small: `odmactl fit` of the 2,000-request
Alpaca sample took 16.6 s on one thread against 18.9 s on two, on this project's 2-vCPU machine.
The frozen encoder (encoder family) does pay: MiniLM-L6 embedded 800 Alpaca prompts in 14.8 s on
one thread against 8.8 s on two; its embeddings feed the fit, so they are held to the same rule.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from odmactl.core.stops import import_whole

torch = import_whole("torch")  # never interrupted half-way (core/stops.py)


@contextmanager
def single_thread() -> Iterator[None]:
    """Run the body with torch (and MKL) on one intra-op thread; restore the previous count after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
