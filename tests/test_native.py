"""The compiled core (setup.py, odmactl/core/native.py): the Cython-compiled replay gives byte-identical
results to its Python source, and a compiled module older than its source is never run.

The comparisons run the same script in two subprocesses, one with ODMACTL_PURE_PYTHON set and no
Cython importable (so the modules' stand-ins for `cython` run, as where Cython is not installed). They
skip when this install has no compiled core (a pure-Python install), unless
ODMACTL_REQUIRE_NATIVE is set, as .ci/run does: there a missing build fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from odmactl.core import native

TESTS = Path(__file__).resolve().parent

# every fast-forward case of test_replay, stepped both ways; every policy overloaded (test_engine's
# regime), both ways; and the CLI's --compare on the sample
SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import test_engine
from test_replay import CASES, DEVICE, MODEL, _replay, case_workload
from odmactl.sim.settings import SchedulerSettings
from odmactl.core import native
from odmactl.cli import main
from odmactl.hw.cost import CostModel
from odmactl.hw.profiles import load_device, load_model
from odmactl.render.json import to_json
from odmactl.trace.schema import read_trace

frame = read_trace(sys.argv[2])
cost = CostModel(load_device(DEVICE), load_model(MODEL))
results = {}
for n, (policy, pool_tokens, config, predictor, offline) in enumerate(CASES):
    w = case_workload(frame.head(220), predictor, offline)
    for fast_forward in (True, False):
        r = _replay(w, cost, policy, pool_tokens, config, fast_forward, max_num_seqs=48)
        results[f"{n}:{policy}:{fast_forward}"] = {"metrics": r.metrics, "series": r.series, "allocator": r.allocator}
overloaded = test_engine._workload(frame.head(160), 40.0)
for policy in sorted(test_engine.POLICY_SETTINGS):
    for fast_forward in (True, False):
        r = test_engine._run(policy, overloaded, cost, 12_000 if policy in ("paged", "ellm", "unified") else 60_000,
                             SchedulerSettings(fast_forward=fast_forward, max_num_seqs=64))
        results[f"overloaded:{policy}:{fast_forward}"] = {"metrics": r.metrics, "series": r.series,
                                                          "allocator": r.allocator}
print(to_json(results))
sys.stdout.flush()
code = main(["replay", sys.argv[2], "--device", DEVICE, "--model", MODEL, "--compare", "static,paged,s3,odma",
             "--predictor", "oracle", "--json"])
sys.stdout.flush()
print(json.dumps(native.status()), file=sys.stderr)
sys.exit(code)
"""


# the from-source run imports no Cython, as an install without it (a wheel, or .ci/run's venv) does:
# the modules' stand-ins for the `cython` names they read then run, whether or not Cython is here
NO_CYTHON = r"""
import sys
class _NoCython:
    def find_spec(self, name, path=None, target=None):
        if name == "cython" or name.startswith("cython."):
            raise ImportError("no Cython in this run")
sys.meta_path.insert(0, _NoCython())
"""


def _compiled_here() -> bool:
    compiled = all(state == "compiled" for state in native.status().values())
    if not compiled and os.environ.get("ODMACTL_REQUIRE_NATIVE"):
        pytest.fail(f"ODMACTL_REQUIRE_NATIVE is set but the core is not compiled: {native.status()}")
    return compiled


def _run(trace: Path, pure: bool) -> tuple[str, str]:
    env = {k: v for k, v in os.environ.items() if k != native.PURE_ENV}
    if pure:
        env[native.PURE_ENV] = "1"
    done = subprocess.run([sys.executable, "-c", (NO_CYTHON if pure else "") + SCRIPT, str(TESTS), str(trace)], env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, done.stderr.strip().splitlines()[-1]


def test_compiled_and_python_replays_are_byte_identical(conv_sample_head):
    if not _compiled_here():
        pytest.skip(f"no compiled core in this install: {native.status()}")
    trace = conv_sample_head(400)
    compiled_out, compiled_state = _run(trace, pure=False)
    python_out, python_state = _run(trace, pure=True)
    assert '"compiled"' in compiled_state and "python" not in compiled_state
    assert "compiled" not in python_state
    assert compiled_out == python_out
    cases, _ = json.JSONDecoder().raw_decode(compiled_out)  # then the CLI's document
    assert sum(r["metrics"]["migrations"] for r in cases.values()) > 0
    assert sum(r["metrics"]["preemptions"] for r in cases.values()) > 0


def test_a_compiled_module_older_than_its_source_is_not_run():
    if not _compiled_here():
        pytest.skip(f"no compiled core in this install: {native.status()}")
    # a build record that does not match the sources, as after editing a .py without rebuilding
    script = ("import sys, types, warnings\n"
              "sys.modules['odmactl._native_build'] = types.SimpleNamespace(SOURCE_SHA256={})\n"
              "with warnings.catch_warnings(record=True) as caught:\n"
              "    warnings.simplefilter('always')\n"
              "    import odmactl.sim.engine, odmactl.sim.segment\n"
              "from odmactl.core import native\n"
              "print(odmactl.sim.engine.__file__, odmactl.sim.segment.__file__, native.status(), [str(w.message) for w in caught])\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    replay_file, segment_file, rest = done.stdout.split(" ", 2)
    assert replay_file.endswith("sim/engine.py") and segment_file.endswith("sim/segment.py")
    assert "the core's sources changed since it was compiled" in rest and "pip install -e ." in rest


def test_a_declarations_file_is_part_of_what_makes_a_build_current():
    """Editing only a .pxd changes the machine code, so the digest a build is checked against
    covers it: the engine's is of sim/engine.py followed by sim/engine.pxd."""
    import hashlib

    source = Path(native.__file__).parents[1] / "sim" / "engine.py"
    expected = hashlib.sha256(source.read_bytes() + source.with_suffix(".pxd").read_bytes()).hexdigest()
    assert native.source_digest("odmactl.sim.engine") == expected
    assert native.source_digest("odmactl.sim.engine") != hashlib.sha256(source.read_bytes()).hexdigest()
