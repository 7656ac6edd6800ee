"""Generate a request trace from Alibaba ServeGen per-client production distributions.

A ServeGen model folder holds, per client N, `chunk-N-trace.csv` (no header: 600 s window start,
rate in req/s, cv, inter-arrival distribution name, shape, scale) and `chunk-N-dataset.json`
(per 6 h window, PDFs of input and output tokens as Python-dict strings).

Per client and 600 s window the request count is rate x overlap (stochastically rounded, so the
expected count is exact); arrival gaps are drawn from the window's fitted distribution (Gamma or
Weibull with the given shape and scale, exponential when none is named) and scaled to span the window,
which keeps the burstiness and the exact rate. Lengths are drawn from the client's 6 h window PDFs
covering the arrival; input and output are sampled independently because ServeGen publishes only the
marginals. Clients without a dataset file, and sampled zero-token requests, are excluded and reported.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import zlib
from pathlib import Path

import numpy as np
import polars as pl

from odmactl.core.errors import TraceError
from odmactl.trace.readers.options import ReadOptions
from odmactl.trace.schema import SourceFrame

WINDOW_S = 600.0
DEFAULT_DURATION_S = 3600.0
MAX_GENERATED = 50_000_000  # requests one ServeGen ingest may generate (a replay of 13M takes minutes)
TRACE_COLUMNS = ["window_start_s", "rate_per_s", "cv", "distribution", "shape", "scale"]
CHUNK = re.compile(r"chunk-(\d+)-(trace\.csv|dataset\.json)(\.gz)?$")


def is_servegen_dir(path: Path) -> bool:
    return path.is_dir() and any(CHUNK.match(p.name) and "trace" in p.name for p in path.iterdir())


def _clients(folder: Path) -> dict[int, dict[str, Path]]:
    found: dict[int, dict[str, Path]] = {}
    for p in folder.iterdir():
        m = CHUNK.match(p.name)
        if m:
            found.setdefault(int(m.group(1)), {})["trace" if m.group(2).startswith("trace") else "dataset"] = p
    return dict(sorted(found.items()))


def _read_rates(path: Path) -> pl.DataFrame:
    schema = {"window_start_s": pl.Float64, "rate_per_s": pl.Float64, "cv": pl.Float64,
              "distribution": pl.String, "shape": pl.Float64, "scale": pl.Float64}
    try:
        frame = pl.read_csv(path, has_header=False, schema=schema, glob=False)
    except (pl.exceptions.PolarsError, OSError, EOFError) as exc:
        raise TraceError(f"not a ServeGen rate table ({str(exc).splitlines()[0]})", file=path,
                         hint="expected rows of: window start, rate, cv, distribution, shape, scale") from exc
    frame = frame.with_row_index("_row", offset=1)
    bad = frame.filter(pl.col("window_start_s").is_null() | ~pl.col("window_start_s").is_finite())
    if bad.height:
        raise TraceError(f"expected a window start in seconds, got {bad['window_start_s'][0]}", file=path,
                         row=bad["_row"][0], column="window start (1)")
    bad = frame.filter((pl.col("rate_per_s") < 0) | pl.col("rate_per_s").is_null() | ~pl.col("rate_per_s").is_finite())
    if bad.height:
        raise TraceError(f"expected a finite rate >= 0, got {bad['rate_per_s'][0]}", file=path, row=bad["_row"][0],
                         column="rate (2)")
    bad = frame.filter((pl.col("rate_per_s") > 0) & pl.col("distribution").is_not_null()
                       & ~pl.col("distribution").is_in(["Gamma", "Weibull", "Exponential"]))
    if bad.height:
        raise TraceError(f"unknown inter-arrival distribution '{bad['distribution'][0]}' (expected Gamma, Weibull or Exponential)",
                         file=path, row=bad["_row"][0], column="distribution (4)")
    shaped = (pl.col("rate_per_s") > 0) & pl.col("distribution").is_in(["Gamma", "Weibull"])
    for column, label in (("shape", "shape (5)"), ("scale", "scale (6)")):
        value = pl.col(column)
        bad = frame.filter(shaped & (value.is_null() | ~value.is_finite() | (value <= 0)))
        if bad.height:
            raise TraceError(f"a {bad['distribution'][0]} distribution needs a finite {column} > 0, got "
                             f"{bad[column][0]}", file=path, row=bad["_row"][0], column=label)
    return frame


def _parse_pdf(text: str, path: Path, key: str) -> tuple[np.ndarray, np.ndarray]:
    """'{45: 0.0097, 46: 0.0117}' -> (values, cumulative probabilities)."""
    body = text.strip().strip("{}").strip()
    if not body:
        return np.empty(0), np.empty(0)
    try:
        pairs = np.array(body.replace(":", ",").split(","), dtype=np.float64).reshape(-1, 2)
    except ValueError as exc:
        raise TraceError("expected a PDF written as {value: probability, ...}", file=path, column=key) from exc
    order = np.argsort(pairs[:, 0], kind="stable")
    values, probs = pairs[order, 0], pairs[order, 1]
    if not np.all(np.isfinite(pairs)):
        raise TraceError("expected finite token counts and probabilities in the PDF", file=path, column=key)
    if np.any(values < 0) or np.any(values != np.floor(values)):  # 0 occurs (requests excluded later, counted)
        raise TraceError("expected whole token counts >= 0 as the PDF's values", file=path, column=key)
    if np.any(probs < 0) or probs.sum() <= 0:
        raise TraceError("PDF probabilities must be >= 0 with a positive sum", file=path, column=key)
    return values, np.cumsum(probs) / probs.sum()


def _read_pdfs(path: Path) -> dict[float, dict[str, tuple[np.ndarray, np.ndarray]]]:
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        data = json.loads(raw)
    except (OSError, EOFError, zlib.error, json.JSONDecodeError) as exc:
        raise TraceError(f"not a readable ServeGen dataset file ({exc})", file=path) from exc
    except RecursionError:
        raise TraceError("not a readable ServeGen dataset file (nested too deeply)", file=path) from None
    shape = 'a JSON object {"<window start s>": {"input_tokens": "{value: probability, ...}", "output_tokens": ...}}'
    if not isinstance(data, dict) or not data:
        raise TraceError(f"expected {shape}", file=path)
    out = {}
    for window, fields in data.items():
        try:
            start_s = float(window)
        except ValueError:
            start_s = math.nan
        if not math.isfinite(start_s):
            raise TraceError(f"expected a window start in seconds as the key, got '{window}'", file=path)
        if not isinstance(fields, dict):
            raise TraceError(f"window {window}: expected {shape}", file=path)
        for key in ("input_tokens", "output_tokens"):
            if key not in fields:
                raise TraceError(f"window {window} has no {key} PDF (multimodal token fields are not supported)",
                                 file=path, column=key)
            if not isinstance(fields[key], str):
                raise TraceError("expected a PDF written as the text {value: probability, ...}", file=path,
                                 column=f"{window}.{key}")
        out[start_s] = {k: _parse_pdf(fields[k], path, f"{window}.{k}") for k in ("input_tokens", "output_tokens")}
    return dict(sorted(out.items()))


def _gaps(rng: np.random.Generator, dist: str | None, shape: float, scale: float, n: int) -> np.ndarray:
    ok = shape is not None and scale is not None and shape > 0 and scale > 0
    if dist == "Gamma" and ok:
        return rng.gamma(shape, scale, n)
    if dist == "Weibull" and ok:
        return scale * rng.weibull(shape, n)
    return rng.exponential(1.0, n)


def _arrivals(rng: np.random.Generator, rates: pl.DataFrame, start_s: float, end_s: float, rate_scale: float,
              path: Path) -> np.ndarray:
    times = []
    columns = ("window_start_s", "rate_per_s", "distribution", "shape", "scale", "_row")
    for w0, rate, dist, shape, scale, row in rates.select(columns).iter_rows():
        lo, hi = max(w0, start_s), min(w0 + WINDOW_S, end_s)
        if hi <= lo or rate <= 0:
            continue
        expected = rate * rate_scale * (hi - lo)
        if expected > MAX_GENERATED:
            raise TraceError(f"a client's {rate:g} req/s x --rate-scale {rate_scale:g} over {hi - lo:g} s would generate "
                             f"{expected:.3g} requests, more than odmactl generates ({MAX_GENERATED:,})",
                             hint="lower --rate-scale or --duration")
        count = int(np.floor(expected)) + int(rng.random() < expected - np.floor(expected))
        if count == 0:
            continue
        with np.errstate(all="ignore"):  # a shape or scale at the edge of the float range: checked below
            gaps = _gaps(rng, dist, shape, scale, count + 1)
            cum = np.cumsum(gaps)
            placed = lo + (hi - lo) * cum[:count] / cum[-1]
        if not (np.isfinite(cum[-1]) and cum[-1] > 0 and np.isfinite(placed).all()):
            raise TraceError(f"the {dist} distribution with shape {shape:g} and scale {scale:g} gives no usable "
                             "inter-arrival times (they underflow or overflow a float)", file=path, row=row,
                             column="shape (5), scale (6)")
        times.append(placed)
    return np.concatenate(times) if times else np.empty(0)


def _sample_lengths(rng: np.random.Generator, pdfs: dict, arrivals: np.ndarray, key: str) -> np.ndarray:
    starts = np.array(list(pdfs))
    usable = [s for s in starts if pdfs[s][key][0].size]
    out = np.empty(arrivals.size)
    which = np.searchsorted(starts, arrivals, side="right") - 1
    for i in np.unique(which):
        s = starts[max(i, 0)]
        if not pdfs[s][key][0].size:  # no requests recorded in that window: nearest earlier, else later
            earlier = [u for u in usable if u <= s]
            s = earlier[-1] if earlier else usable[0]
        values, cdf = pdfs[s][key]
        mask = which == i
        idx = np.minimum(np.searchsorted(cdf, rng.random(mask.sum()), side="right"), values.size - 1)
        out[mask] = values[idx]
    return out


def read_servegen(path: Path, opts: ReadOptions) -> SourceFrame:
    if not path.is_dir():
        raise TraceError("servegen expects a model folder with chunk-N-trace.csv(.gz) files", file=path)
    clients = _clients(path)
    if not any("trace" in c for c in clients.values()):
        raise TraceError("no chunk-N-trace.csv(.gz) files in this folder", file=path)
    duration = DEFAULT_DURATION_S if opts.duration_s is None else opts.duration_s
    start, end = opts.start_s, opts.start_s + duration
    parts, skipped_requests, skipped_clients, generated = [], 0, 0, 0
    for done, (number, files) in enumerate(clients.items(), start=1):
        if opts.progress:
            opts.progress(f"generating from {path.name}", done, len(clients))
        if "trace" not in files:
            continue
        # client `number`'s own stream: the child `number` of SeedSequence(seed).spawn(...), made
        # without spawning the children before it (a chunk numbered in the millions costs nothing)
        rng = np.random.default_rng(np.random.SeedSequence(opts.seed, spawn_key=(number,)))
        arrivals = _arrivals(rng, _read_rates(files["trace"]), start, end, opts.rate_scale, files["trace"])
        if arrivals.size == 0:
            continue
        generated += arrivals.size
        if generated > MAX_GENERATED:
            raise TraceError(f"--rate-scale {opts.rate_scale:g} over --duration {duration:g} s generates more than "
                             f"{MAX_GENERATED:,} requests", file=path, hint="lower --rate-scale or --duration")
        if "dataset" not in files:
            skipped_requests += arrivals.size
            skipped_clients += 1
            continue
        pdfs = _read_pdfs(files["dataset"])
        if not any(p["input_tokens"][0].size and p["output_tokens"][0].size for p in pdfs.values()):
            skipped_requests += arrivals.size
            skipped_clients += 1
            continue
        parts.append(pl.DataFrame({
            "arrival": arrivals,
            "prompt_tokens": _sample_lengths(rng, pdfs, arrivals, "input_tokens"),
            "output_tokens": _sample_lengths(rng, pdfs, arrivals, "output_tokens"),
            "tenant": [f"chunk-{number}"] * arrivals.size,
        }))
    if not parts:
        raise TraceError(f"no requests in [{start:g} s, {end:g} s): every client's rate is 0 there", file=path)
    frame = pl.concat(parts).sort("arrival", maintain_order=True)
    zero = (pl.col("prompt_tokens") < 1) | (pl.col("output_tokens") < 1)
    n_zero = int(frame.select(zero.sum()).item())
    frame = frame.filter(~zero)
    if frame.height == 0:
        raise TraceError("every generated request has a zero-token length", file=path)
    first_arrival = float(frame["arrival"][0])
    frame = frame.with_row_index("_row", offset=1).with_columns(
        pl.col("_row").cast(pl.Int64), pl.lit(path.name).alias("model"))
    sf = SourceFrame(path=path, format="servegen", frame=frame, clock="relative",
                     columns={"prompt_tokens": "input_tokens PDF", "output_tokens": "output_tokens PDF"},
                     token_source="ServeGen PDFs")
    if skipped_requests:
        sf.excluded[f"requests of {skipped_clients} clients without length data"] = int(skipped_requests)
    if n_zero:
        sf.excluded["sampled zero-token requests"] = n_zero
    sf.params = {"start_s": start, "duration_s": duration, "seed": opts.seed, "rate_scale": opts.rate_scale,
                 "first_arrival_s": first_arrival, "window_s": WINDOW_S}
    return sf
