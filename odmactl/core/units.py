"""Quantities with units in profile files: "24 GB", "307.2 GB/s", "96 TFLOPS", "12 us".

A profile states every figure with its unit so that a wrong unit (a bandwidth where a size belongs)
is caught when the file is read rather than silently scaling a plan by 1e3. Decimal prefixes are
powers of 1000 and binary prefixes (KiB, MiB, GiB, TiB) powers of 1024, as the datasheets use them.
"""

from __future__ import annotations

import math
import re

_DECIMAL = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}

_BYTES = {f"{p}B": v for p, v in (_DECIMAL | _BINARY).items()}
_BANDWIDTH = {f"{unit}/s": v for unit, v in _BYTES.items()}
_FLOPS = {f"{p}FLOPS": v for p, v in _DECIMAL.items()}
_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}

KINDS = {
    "bytes": (_BYTES, "a size such as '24 GB' or '2 GiB'"),
    "bandwidth": (_BANDWIDTH, "a bandwidth such as '307.2 GB/s'"),
    "flops": (_FLOPS, "a rate such as '96 TFLOPS'"),
    "seconds": (_SECONDS, "a time such as '12 us'"),
}
_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z/]+)\s*$")


def parse_quantity(text: object, kind: str) -> float:
    """The value of `text` in base units (bytes, bytes/s, FLOP/s, s); ValueError says what was expected."""
    units, expected = KINDS[kind]
    if not isinstance(text, str):
        raise ValueError(f"expected {expected} (a string with its unit), got {text!r}")
    match = _QUANTITY.match(text)
    if not match:
        raise ValueError(f"expected {expected}, got {text!r}")
    number, unit = float(match.group(1)), match.group(2)
    if unit not in units:
        other = next((k for k, (table, _) in KINDS.items() if unit in table), None)
        what = f"'{unit}' is a unit of {other}" if other else f"'{unit}' is not a unit odmactl knows"
        raise ValueError(f"expected {expected}, got {text!r}: {what}")
    value = number * units[unit]
    if not math.isfinite(value):
        raise ValueError(f"expected a finite value, got {text!r}")
    return value


def format_bytes(num_bytes: float, binary: bool = True) -> str:
    """A readable size with a unit parse_quantity reads back ("2 GiB", "64 B"). Memory a pool or a
    model takes is shown in binary units everywhere (a KV pool reads the same in `profiles show`
    and in `replay`); `binary=False` is for datasheet capacities, which are decimal."""
    steps = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)) if binary else \
        (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3))
    for unit, size in steps:
        if abs(num_bytes) >= size:
            return f"{num_bytes / size:.6g} {unit}"
    return f"{num_bytes:.6g} B"


def format_rate(value: float, unit: str) -> str:
    """A readable decimal rate: format_rate(3.1e11, 'B/s') -> '310 GB/s'; unit is 'B/s' or 'FLOPS'."""
    for prefix, size in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(value) >= size:
            return f"{value / size:.6g} {prefix}{unit}"
    return f"{value:.6g} {unit}"


def format_seconds(seconds: float, space: str = " ") -> str:
    """A duration the way an SLO is written: "100 ms" below a second, "2 s" from one up."""
    return f"{seconds * 1000:g}{space}ms" if seconds < 1 else f"{seconds:g}{space}s"

