"""examples/servegen_ceiling.py: the per-tenant ceiling against exhaustive search on a small case."""

from __future__ import annotations

import importlib.util
import itertools
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "servegen_ceiling.py"


def _load():
    spec = importlib.util.spec_from_file_location("servegen_ceiling", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _exhaustive(prompt, output, tenant, max_len, limit, overflow_to_max):
    """The best kv_utilization over every per-tenant choice of r among the tenant's output lengths."""
    kv = np.minimum(prompt + output, max_len)
    tenants = np.unique(tenant)
    best = 0.0
    for rs in itertools.product(*(np.unique(output[tenant == t]) for t in tenants)):
        r = np.zeros(prompt.size)
        for t, value in zip(tenants, rs):
            r[tenant == t] = value
        need = np.minimum(prompt + r, max_len)
        outgrown = kv > need
        if outgrown.sum() > limit * prompt.size:
            continue
        reserved = np.where(outgrown, max_len if overflow_to_max else kv, need).sum()
        best = max(best, kv.sum() / reserved)
    return best


@pytest.mark.parametrize("overflow_to_max", [False, True])
def test_ceiling_brackets_the_exhaustive_optimum(overflow_to_max):
    mod = _load()
    rng = np.random.default_rng(3)
    n = 60
    tenant = np.array(["a", "b", "c"])[rng.integers(0, 3, n)]
    scale = np.where(tenant == "a", 50.0, np.where(tenant == "b", 400.0, 1500.0))
    output = np.maximum(1, np.round(rng.lognormal(0.0, 0.8, n) * scale))
    prompt = rng.integers(10, 2_000, n).astype(np.float64)
    max_len, limit = 8_192, 0.05
    over, found, bound = mod.ceiling(prompt, output, tenant, max_len, limit, overflow_to_max)
    exact = _exhaustive(prompt, output, tenant, max_len, limit, overflow_to_max)
    assert over <= limit
    assert found <= exact + 1e-12  # what it found is a feasible rule
    assert exact <= bound + 1e-12  # and the bound holds
    assert found > 0.9 * exact     # and it is close on this case
