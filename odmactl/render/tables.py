"""Console tables and lines that fit a narrow terminal."""

from __future__ import annotations

import re
import textwrap

from rich import box
from rich.console import Console
from rich.cells import cell_len
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table


# the space between a figure and its unit, or a comparison's sign and its figure, where a wrapped
# line must not break ("2.000 s", "8 GiB", "<= 100.0", "> 1.2345 s", "= 0.5")
_UNIT_GAP = re.compile(r"(?<=\d) (?=(?:[KMGT]i?B|B|s|ms|us|ns|req/s|tok/s|[KMGT]?i?B/s|bytes|tokens|requests)(?![\w/]))"
                       r"|(?<=[<>=]) (?=[\d-])")
_GLUE = "\u00a0"  # textwrap breaks only at ASCII whitespace, so a no-break space holds the two together
_WIDE = "\uffff"  # a noncharacter: the second cell of a wide character while textwrap counts


def wrapped_lines(line: str, width: int) -> list[str]:
    """`line` wrapped at `width` terminal cells between words, never between a figure and its unit
    (or a bound's sign), never at a hyphen (names such as least-kv stay whole), without trailing
    spaces. textwrap counts characters: a character two cells wide (CJK, in a path or a value
    echoed) is counted twice by a `_WIDE` mark after it, taken out after the wrap."""
    marked = "".join(ch + _WIDE if cell_len(ch) == 2 else ch for ch in _UNIT_GAP.sub(_GLUE, line))
    pieces = _CellWrapper(width=max(width, 40), break_on_hyphens=False).wrap(marked)
    return [piece.replace(_WIDE, "").replace(_GLUE, " ") for piece in pieces] or [""]


class _CellWrapper(textwrap.TextWrapper):
    """textwrap, cutting a word longer than a line never between a wide character and its mark
    (its second cell would be counted on the next line, and this one be a cell too wide)."""

    def _handle_long_word(self, reversed_chunks, cur_line, cur_len, width):
        chunk = reversed_chunks[-1]
        end = max(width - cur_len, 1)
        if end < len(chunk) and chunk[end] == _WIDE:
            end -= 1  # 0 only after other words on the line (width >= 40): the word starts the next one
        cur_line.append(chunk[:end])
        reversed_chunks[-1] = chunk[end:]


def print_wrapped(console: Console, line: str, style: str) -> None:
    """A long line in `style`, wrapped at the console's width (`wrapped_lines`)."""
    for piece in wrapped_lines(line, console.width):
        console.print(f"[{style}]{escape(piece)}[/]", highlight=False, soft_wrap=True)


def print_warnings(console: Console, lines: list[str]) -> None:
    """The one console form of a warning (render/warnings.py's lines, a profile's noise lines):
    "warning: ..." in yellow, wrapped at the console's width."""
    for line in lines:
        print_wrapped(console, f"warning: {line}", "yellow")


def fits(console: Console, table: Table) -> bool:
    """Whether `table` at its natural width (every cell whole, no column squeezed) fits the
    console: where it does not, a caller prints it another way rather than let rich cut a name or
    fold a figure mid-number."""
    return Measurement.get(console, console.options.update(max_width=1 << 16), table).maximum <= console.width


def narrow_table(title: str, headers: tuple[str, ...], rows: list[list[str]], key: str | None = None) -> Table:
    """A table that fits a narrow terminal (80 columns, or a pipe): no vertical rules or edge
    padding; right-aligned number columns exactly as wide as each header's longest word or value,
    whichever is wider, so headers wrap between words and no number is cut; an optional first `key`
    column of names (rows start with it) that takes the rest and wraps a long name."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    if key is not None:  # the names take the width the numbers leave, and wrap within it
        table.add_column(key, overflow="fold")
    first = 0 if key is None else 1
    for j, header in enumerate(headers, start=first):
        width = max([len(word) for word in header.split()] + [len(row[j]) for row in rows])
        table.add_column(header, justify="right", min_width=width, max_width=width)
    for row in rows:
        table.add_row(*row)
    return table


def check_scope(doc: dict, policy: str) -> str:
    """What check replayed, as its console and markdown say it: the requests, how they arrived and
    at what mean rate, on one engine (its latencies are that engine's)."""
    t = doc["trace"]
    rate = doc["results"][policy]["queue"].get("arrival_rate_per_s")
    at = f", {rate:,.3g} req/s" if rate and "req/s" not in t["arrivals"] else ""  # a rescale says its rate
    n = t["requests"]
    return f"{n:,} request{'' if n == 1 else 's'} ({t['arrivals']}{at}) on one engine, {deployment(doc)}"


def deployment(doc: dict) -> str:
    """'MODEL on DEVICE', or with tensor parallelism 'MODEL on 4 x DEVICE (tp 4)': how every
    report names what was replayed."""
    tp = doc.get("tp", 1)
    return f"{doc['model']} on {doc['device']}" if tp == 1 else f"{doc['model']} on {tp} x {doc['device']} (tp {tp})"
