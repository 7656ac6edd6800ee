"""The optional compiled core: which of its modules run compiled, and the fall back to Python.

setup.py compiles the modules in COMPILED with Cython from their own .py files (they stay the
single source) and records the sha256 of each source it compiled (with its .pxd) in
odmactl/_native_build.py.
`select()`, run once when the package is imported, makes every such module import from its .py
source instead when
- ODMACTL_PURE_PYTHON is set (a comparison, or a debugger that needs Python frames), or
- any compiled module was built from a different source (an editable install whose .py changed
  since the last `pip install -e .`): stale machine code must never run in place of the code a
  developer is looking at, so the sources run, with a warning to rebuild.
Both forms give byte-identical results (tests/test_native.py).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sys
import warnings
from pathlib import Path

# The compiled core, as setup.py builds it (it reads these lists from this file). TYPED modules'
# `cython.*` annotations become C types; UNTYPED ones are compiled with annotations ignored, their
# classes made extension types by the .pxd files beside them.
TYPED = ("odmactl.allocator.int64buffer", "odmactl.allocator.extentlist", "odmactl.allocator.pageruns",
         "odmactl.sim.keyheap", "odmactl.sim.prefill",
         "odmactl.sim.segment", "odmactl.sim.series", "odmactl.sim.batch", "odmactl.sim.link", "odmactl.sim.tally",
         "odmactl.sim.growth", "odmactl.sim.chunked",
         "odmactl.sim.schedulers.base", "odmactl.sim.schedulers.fcfs", "odmactl.sim.schedulers.task_pool",
         "odmactl.sim.engine", "odmactl.sim.cluster")
UNTYPED = ("odmactl.rules.odma", "odmactl.allocator.base", "odmactl.allocator.extents", "odmactl.allocator.contiguous",
           "odmactl.allocator.static", "odmactl.allocator.s3", "odmactl.allocator.odma", "odmactl.allocator.paged",
           "odmactl.allocator.ellm", "odmactl.allocator.unified")
COMPILED = TYPED + UNTYPED
PURE_ENV = "ODMACTL_PURE_PYTHON"

_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # odmactl/
_state: dict[str, str] = {}  # module -> "compiled" or why it runs from its Python source


class _SourceFinder:
    """Finds the listed modules' .py sources ahead of the extension modules beside them (a meta
    path finder: `find_spec` is all sys.meta_path asks; not derived from importlib.abc, whose
    import costs 9 ms of every command's start, before the CLI takes the stop signals)."""

    def __init__(self, sources: dict[str, Path]) -> None:
        self.sources = sources

    def find_spec(self, fullname, path, target=None):
        source = self.sources.get(fullname)
        return None if source is None else importlib.util.spec_from_file_location(fullname, source)


def _paths(name: str) -> tuple[Path, Path | None]:
    """The module's .py source and its compiled extension module (None when not built)."""
    stem = _PACKAGE_DIR / name.split(".", 1)[1].replace(".", "/")
    binary = next((p for s in importlib.machinery.EXTENSION_SUFFIXES if (p := stem.with_name(stem.name + s)).exists()),
                  None)
    return stem.with_suffix(".py"), binary


def source_digest(name: str) -> str:
    """sha256 of a compiled module's .py source and, when it has one, the .pxd beside it (its C
    declarations change the machine code too): what setup.py records and `select` compares."""
    source = _paths(name)[0]
    declarations = source.with_suffix(".pxd")
    digest = hashlib.sha256(source.read_bytes())
    if declarations.exists():
        digest.update(declarations.read_bytes())
    return digest.hexdigest()


def select() -> None:
    """Decide, before any of them is imported, whether the COMPILED modules run from source. It is
    all of them or none: compiled extension types inherit from each other across modules (the
    policies from AllocatorBase), so a compiled module cannot sit on a Python-source base."""
    if _state:
        return
    try:
        from odmactl._native_build import SOURCE_SHA256
    except ImportError:
        SOURCE_SHA256 = {}
    built: dict[str, Path] = {}
    stale: list[str] = []
    for name in COMPILED:
        source, binary = _paths(name)
        if binary is None:
            _state[name] = "python (not compiled)"
        elif not source.exists():
            _state[name] = "compiled"
        else:
            built[name] = source
            if SOURCE_SHA256.get(name) != source_digest(name):
                stale.append(name)
    if os.environ.get(PURE_ENV):
        reason = f"python ({PURE_ENV} is set)"
    elif stale:
        reason = "python (the core's sources changed since it was compiled)"
        warnings.warn(f"{', '.join(stale)}: the compiled core is older than its source; running the Python "
                      "source (slower) until you rebuild with `pip install -e .`", RuntimeWarning, stacklevel=2)
    else:
        reason = "compiled"
    for name in built:
        _state[name] = reason
    if reason != "compiled" and built:
        sys.meta_path.insert(0, _SourceFinder(built))


def status() -> dict[str, str]:
    """Each compiled-core module -> "compiled", or "python (why)"."""
    select()
    return dict(_state)
