"""Quantities with units in profile files: "24 GB", "307.2 GB/s", "96 TFLOPS", "12 us".

A profile states every figure with its unit so that a wrong unit (a bandwidth where a size belongs)
is caught when the file is read rather than silently scaling a plan by 1e3. Decimal prefixes are
powers of 1000 and binary prefixes (KiB, MiB, GiB, TiB) powers of 1024, as the datasheets use them.
"""

from __future__ import annotations

import math
import re
from decimal import ROUND_FLOOR, Decimal, localcontext

from odmactl.core.errors import quoted

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
# the unit a number written without one most likely means, where one does: a time in seconds (a
# size of "80" may mean bytes or gigabytes, so it gets no guess)
BARE_UNIT = {"seconds": "s"}
_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)(\s*)([A-Za-z/]*)\s*$")


class QuantityError(ValueError):
    """A quantity that does not read: `problem` says what was expected; where the text is a number
    with a unit of the right kind misspelt (`2 sec`, `100 MS`) or, for a time, missing (`2`),
    `number` and `unit` are what it likely meant, and the message ends "did you mean '2 s'?"."""

    def __init__(self, problem: str, number: str | None = None, unit: str | None = None, space: str = " ") -> None:
        self.problem, self.number, self.unit = problem, number, unit
        super().__init__(problem if unit is None else f"{problem}; did you mean '{self.suggested(space)}'?")

    def suggested(self, space: str = " ") -> str | None:
        """The quantity it likely meant, the number and unit `space` apart; None without a guess."""
        return None if self.unit is None else f"{self.number}{space}{self.unit}"


def _likely_unit(unit: str, units: dict[str, float]) -> str | None:
    """The unit of `units` a misspelt `unit` likely means: the same in another case (`MS`, `gib`),
    else the longest one it starts with, as written (`sec` and `seconds` are s, `msec` ms, `GBytes`
    GB; `bits` is not B)."""
    folded = unit.casefold()
    same = [u for u in units if u.casefold() == folded]
    if len(same) == 1:
        return same[0]
    starts = sorted((u for u in units if unit.startswith(u)), key=len, reverse=True)
    return starts[0] if starts else None


def parse_quantity(text: object, kind: str, expected: str | None = None) -> float:
    """The value of `text` in base units (bytes, bytes/s, FLOP/s, s); a QuantityError (a
    ValueError) says what was expected (`expected`, else the kind's example: "a time such as
    '12 us'"), and what was likely meant where that is clear."""
    units, example = KINDS[kind]
    expected = expected or example
    if not isinstance(text, str):
        raise QuantityError(f"expected {expected} (a string with its unit), got {text!r}")
    match = _QUANTITY.match(text)
    if not match:
        raise QuantityError(f"expected {expected}, got {quoted(text)}")
    number, space, unit = match.group(1), match.group(2), match.group(3)
    if not unit:
        raise QuantityError(f"expected {expected}, got {quoted(text)}: a number without its unit", number,
                            BARE_UNIT.get(kind))
    if unit not in units:
        other = next((k for k, (table, _) in KINDS.items() if unit in table), None)
        if other is not None:
            raise QuantityError(f"expected {expected}, got {quoted(text)}: '{unit}' is a unit of {other}")
        likely = _likely_unit(unit, units)
        if likely is not None:
            raise QuantityError(f"expected {expected}, got {quoted(text)}", number, likely, space)
        raise QuantityError(f"expected {expected}, got {quoted(text)}: '{unit}' is not a unit odmactl knows")
    exponent = number.lower().partition("e")[2]
    exact = Decimal(number) if len(exponent.lstrip("+-")) <= 6 else None  # past that, Decimal refuses it
    if exact is None or exact and not -MAX_EXPONENT <= exact.adjusted() <= MAX_EXPONENT:
        big = not exponent.startswith("-") if exact is None else exact > 1
        raise QuantityError(f"expected {expected}, got {quoted(text)}: a number past 1e{'+' if big else '-'}"
                            f"{MAX_EXPONENT} is out of any range odmactl reads")
    with localcontext() as ctx:  # the product exact (the factor has at most 17 digits), then rounded once
        ctx.prec = len(exact.as_tuple().digits) + 20
        value = float(exact * Decimal(repr(units[unit])))  # 36 ms is 0.036 s, not 36 * 0.001 = 0.036000000000000004
    if not math.isfinite(value) or (exact and not value):
        raise QuantityError(f"expected {expected}, got {quoted(text)}: too {'large' if value else 'small'} for a float")
    return value


MAX_EXPONENT = 400  # a number's decimal exponent past this is out of any float's range, whatever its unit


def decimal_text(x: float, scale: int = 1) -> str:
    """x times `scale` written out in full, to the digits x was set with (its shortest round trip),
    without the noise a float product adds: 0.178343739 x 1000 is "178.343739", 0.1 x 1000 "100"."""
    return format((Decimal(repr(x)) * scale).normalize(), "f")


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
    """A duration the way an SLO is written, to the digits it was set with: "100 ms" below a
    second, "2 s" from one up, "178.343739 ms", "1234.5678 s"."""
    return f"{decimal_text(seconds, 1000)}{space}ms" if seconds < 1 else f"{decimal_text(seconds)}{space}s"


def sig3_decimals(value: float) -> int:
    """The decimals that write `value` (non-zero) to three significant digits, none from 100 up:
    0.00234, 0.107, 12.4, 1,235 (render/metrics.py SIG3, capacity's rates)."""
    return max(0, 2 - math.floor(math.log10(abs(value))))


def round_sig3(value: float) -> float:
    """`value` (> 0) as `sig3_decimals` writes it, rounded: the figure a table shows (0.3308 -> 0.331)."""
    return float(format(value, f".{sig3_decimals(value)}f"))


def floor_sig3(value: float) -> float:
    """The largest figure `sig3_decimals` writes that is at most `value` (> 0): cut, not rounded
    (0.34544 -> 0.345, 0.2546 -> 0.254); exact on the shortest decimal form of the float."""
    step = Decimal(1).scaleb(-sig3_decimals(value))
    return float(Decimal(repr(value)).quantize(step, rounding=ROUND_FLOOR))
