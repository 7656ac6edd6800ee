"""Build hook for the optional compiled core (everything else is in pyproject.toml).

Cython compiles two groups of modules from their own .py files, which stay the single source:
- TYPED: the replay core (odmactl/sim/: the engine, its batch, scheduler, growth step, tally,
  host link, closed-form segment sums, event heap and prefill clock), the coalesced free
  extents of a region (allocator/extentlist.py) and the int64 storage of those two
  (allocator/int64buffer.py). Their `cython.*` annotations become C integers and doubles (Python
  never evaluates them); their .pxd files make each class an extension type with C fields, and
  cimport one another and the allocator base so the engine calls their methods as C functions.
- UNTYPED: the allocator library and ODMA's reservation rule (rules/odma.py). Their .pxd files
  make every class an extension type with the same attributes, held as Python objects (unified's
  page counts as C integers, the values Python's would be), and declare the operations
  (reserve, extend, release), their hot helpers and the rule cpdef: C calls from compiled
  callers, overridable as before. Annotations are not read as C types (annotation_typing off), so
  every value behaves exactly as in Python: a float prediction stays a float.
The pure-Python modules give byte-identical results (tests/test_native.py), and
odmactl/core/native.py falls back to them when a compiled module is older than its source.

ODMACTL_PURE_PYTHON=1 at install time skips the compilation; a failed compile (no C compiler)
installs the pure-Python package with a warning (the extensions are optional).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

from setuptools import Extension, setup

ROOT = Path(__file__).resolve().parent


def _native():
    """odmactl/core/native.py, loaded by path: the module lists live there (importing the package here
    would run its import-time code in the build)."""
    spec = importlib.util.spec_from_file_location("_odmactl_native", ROOT / "odmactl" / "core" / "native.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


NATIVE = _native()
TYPED, UNTYPED, COMPILED = NATIVE.TYPED, NATIVE.UNTYPED, NATIVE.COMPILED
DIRECTIVES = {
    "language_level": 3,
    "binding": False,
    # Python semantics for // and % on C integers, and an OverflowError (never a silent wrap)
    # should a 64-bit value overflow
    "cdivision": False,
    "overflowcheck": True,
    # typed views are set when their object is made (and replaced only while a buffer grows), so
    # an index need not test that the view is initialized
    "initializedcheck": False,
}


# Python never fuses a * b + c into one rounding; the compiled float arithmetic (prefill.py) must
# not either (GCC and Clang may, for targets with FMA instructions)
C_FLAGS = [] if sys.platform == "win32" else ["-ffp-contract=off"]


def extensions() -> list[Extension]:
    if os.environ.get(NATIVE.PURE_ENV):
        return []
    from Cython.Build import cythonize

    # what the extensions are built from: odmactl.core.native compares it with the sources at import
    digests = {name: NATIVE.source_digest(name) for name in COMPILED}
    stamp = ROOT / "odmactl" / "_native_build.py"
    stamp.write_text('"""Written by setup.py when it compiles the core: sha256 of each compiled module\'s source."""\n\n'
                     f"SOURCE_SHA256 = {digests!r}\n")

    def group(names: tuple[str, ...], annotation_typing: bool) -> list[Extension]:
        modules = [Extension(name, [name.replace(".", "/") + ".py"], optional=True, extra_compile_args=C_FLAGS)
                   for name in names]
        return cythonize(modules, compiler_directives={**DIRECTIVES, "annotation_typing": annotation_typing},
                         quiet=True)

    return group(TYPED, True) + group(UNTYPED, False)


setup(ext_modules=extensions())
