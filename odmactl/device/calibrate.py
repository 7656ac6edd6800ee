"""`odmactl calibrate`: measure the machine at hand with torch and describe it as a device profile.

Measured: sequential read bandwidth (a full-buffer reduction), device copy bandwidth, reads of
contiguous runs of each table size at random offsets (an index gather, timed against a contiguous
copy of the same bytes, so both sides read and write the same amount), the fp16 and bf16 matmul
rate, a linear layer's GEMM at m tokens as a share of its roofline (the [kernels] gemm table the
cost model reads), and a decode-attention cross-check: scaled_dot_product_attention over
contiguous KV versus the same KV gathered from randomly placed 16-token blocks first. Buffers are several times the
last-level cache; each timing warms up, synchronises (device events on CUDA) and keeps the median.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from odmactl import __version__
from odmactl.core.stops import import_whole
from odmactl.core.errors import ProfileError, not_one_of
from odmactl.core.limits import check_seed
from odmactl.rules.engines import DEFAULT_ENGINE, VLLM_V1
from odmactl.core.units import format_bytes, format_rate
from odmactl.hw.cost import Gemms
from odmactl.hw.profiles import MIN_EFFICIENCY, faster_16bit

CHUNK_BYTES = (64, 256, 1024, 4096, 16384, 65536, 262144, 1 << 20, 2 << 20)
DEVICES = ("auto", "cpu", "cuda", "mlu")
Progress = Callable[[str, int, int], None] | None

# Budget figures a measurement cannot give; the same cited values as the shipped profiles.
MEMORY_FRACTION_SOURCE = ("vLLM's default gpu_memory_utilization = 0.90 (vLLM engine arguments; shown in "
                          "the vllm-project/vllm PR #10511 profiling log)")
ACTIVATION_RESERVE = "3.05 GiB"
ACTIVATION_RESERVE_SOURCE = ("vllm-project/vllm PR #10511 memory-profiling log, Meta-Llama-3-8B on an 80 GB GPU: "
                             "PyTorch activation peak 1.26 GiB + non-torch memory 1.79 GiB = 3.05 GiB")


@dataclass(frozen=True)
class CalibrationSettings:
    """Sizes and repeats of one calibration run. Invariant: buffers are multiples of 2 MiB and
    larger than `gather_bytes`; `repeats` >= 1 timed runs follow `warmup` untimed ones."""

    device: str
    quick: bool
    buffer_bytes: int
    gather_bytes: int
    repeats: int
    warmup: int
    matmul_n: int
    attn_batch: int
    attn_heads: int
    attn_head_dim: int
    attn_context_tokens: int
    attn_block_tokens: int
    gemm_hidden: int  # the GEMM table's layer: [m, gemm_hidden] times [gemm_hidden, gemm_weight_bytes / 2 / gemm_hidden]
    gemm_weight_bytes: int  # several times the last-level cache, as a model's weights are
    gemm_tokens: tuple[int, ...]
    seed: int = 0

    @classmethod
    def for_device(cls, device: str, quick: bool, seed: int = 0) -> CalibrationSettings:
        check_seed(seed)
        if device == "cpu":
            return cls(device, quick, buffer_bytes=(256 if quick else 512) << 20, gather_bytes=(32 if quick else 64) << 20,
                       repeats=3 if quick else 5, warmup=1, matmul_n=1024 if quick else 2048, attn_batch=8,
                       attn_heads=8, attn_head_dim=128, attn_context_tokens=2048, attn_block_tokens=16,
                       gemm_hidden=2048, gemm_weight_bytes=(128 if quick else 256) << 20,
                       gemm_tokens=(1, 16, 64) if quick else (1, 16, 64, 256), seed=seed)
        return cls(device, quick, buffer_bytes=(1 if quick else 4) << 30, gather_bytes=(256 if quick else 512) << 20,
                   repeats=5 if quick else 20, warmup=2 if quick else 5, matmul_n=8192, attn_batch=32,
                   attn_heads=32, attn_head_dim=128, attn_context_tokens=4096, attn_block_tokens=16,
                   gemm_hidden=4096, gemm_weight_bytes=(256 if quick else 1024) << 20,
                   gemm_tokens=(1, 16, 64, 256, 1024, 4096) + (() if quick else (8192,)), seed=seed)


def resolve_device(name: str) -> str:
    """'auto' picks cuda, then mlu, then cpu (any case: CUDA is cuda); an explicit device that is
    not there is an error, and a name that is none of them suggests the close ones."""
    if name.casefold() not in DEVICES:
        raise ProfileError(not_one_of("--device", name, DEVICES),
                           hint="the torch device to measure on; a profile name (`odmactl profiles list`) is for "
                                "replays without --on-device")
    name = name.casefold()
    torch = import_whole("torch")  # never interrupted half-way (core/stops.py)

    mlu_ok = hasattr(torch, "mlu") and torch.mlu.is_available()
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "mlu" if mlu_ok else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ProfileError("no CUDA device is visible to torch", hint=f"torch {torch.__version__} was built "
                           f"{'without CUDA' if torch.version.cuda is None else 'with CUDA ' + torch.version.cuda}; see README for a CUDA install")
    if name == "mlu" and not mlu_ok:
        raise ProfileError("no MLU device is visible to torch", hint="install Cambricon's torch_mlu and its driver")
    return name


# a timing whose repeats spread more than this ((max - min) / median) is noisy (`noise` names it);
# the console warns of a disturbed run (another job, throttling) when more than NOISY_SHARE of the
# timings are, or the scattered table's copies of the same bytes differ by more than
# COPY_SPREAD_LIMIT. Measured on this 2-vCPU VM: idle, `--quick` had 1-3 of 27 timings noisy and
# copies 13-43% apart over four runs; beside a CI run compiling the package, 20 of 27 and 109%.
NOISY_SPREAD = 0.25
NOISY_SHARE = 0.25
COPY_SPREAD_LIMIT = 0.75
# a scattered run length whose efficiency is below EFFICIENCY_DIP times the best of any shorter run
# dips (longer runs read at least as well, but for cache sizes): idle, this VM's `--quick` runs had
# their deepest dip at 256 KiB, 0.42-0.70 of 64 KiB's (0.43 at worst, three runs); beside two
# memory-bound jobs, 1 MiB and 2 MiB read 0.031 and 0.063 after 1.0 at 256 KiB, the copies 6% apart
EFFICIENCY_DIP = 0.25
# a gather of random runs this many times as fast as a contiguous copy of the same bytes is not a
# property of the memory: idle, the highest ratio of four `--quick` runs was 1.04 (64 KiB runs);
# beside memory-bound jobs, 256 KiB runs read 2.3-5.5 times the copy's rate
GATHER_PAST_COPY = 1.5


class _Timer:
    """Median wall time of a callable on one device: device events on CUDA, synchronise + perf_counter
    elsewhere. `spreads` keeps each timing's label and the spread of its repeats, (max - min) / median."""

    def __init__(self, torch, device: str, repeats: int, warmup: int) -> None:
        self.torch, self.device, self.repeats, self.warmup = torch, device, repeats, warmup
        self.spreads: list[tuple[str, float]] = []

    def sync(self) -> None:
        if self.device != "cpu":
            device_backend(self.device).synchronize()

    def median_s(self, fn: Callable[[], object], label: str) -> float:
        for _ in range(self.warmup):
            fn()
        self.sync()
        times = []
        for _ in range(self.repeats):
            if self.device == "cuda":
                start, end = self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                self.sync()
                times.append(time.perf_counter() - t0)
        median = float(statistics.median(times))
        self.spreads.append((label, (max(times) - min(times)) / median if median > 0 else 0.0))
        return median


def device_backend(device: str):
    """torch.cuda or torch.mlu: the two expose the same device API."""
    torch = import_whole("torch")  # never interrupted half-way (core/stops.py)

    return getattr(torch, device)


def device_name(device: str) -> str:
    if device != "cpu":
        backend = device_backend(device)
        return backend.get_device_name(backend.current_device())
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return f"CPU {line.split(':', 1)[1].strip()} ({os.cpu_count()} threads)"
    except OSError:
        pass
    return f"CPU {platform.processor() or platform.machine()} ({os.cpu_count()} threads)"


def device_capacity_bytes(device: str) -> tuple[int, str]:
    if device != "cpu":
        backend = device_backend(device)
        return backend.get_device_properties(backend.current_device()).total_memory, \
            f"measured: torch.{device}.get_device_properties().total_memory"
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "measured: host physical memory (sysconf)"


def measure(settings: CalibrationSettings, progress: Progress = None) -> dict:
    """Run every measurement; returns raw figures (bytes/s, FLOP/s, seconds) keyed by name."""
    torch = import_whole("torch")  # never interrupted half-way (core/stops.py)

    step, total = 0, 4 + len(CHUNK_BYTES) + 2

    def tick(label: str) -> None:
        nonlocal step
        step += 1
        if progress:
            progress(f"calibrate: {label}", step, total)

    dev = torch.device(settings.device)
    timer = _Timer(torch, settings.device, settings.repeats, settings.warmup)
    gen = torch.Generator(device="cpu").manual_seed(settings.seed)
    results = _bandwidths(torch, timer, dev, settings, gen, tick)
    for dtype_name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        rate_n = _matmul_rate(torch, timer, dev, dtype, dtype_name, settings.matmul_n)
        results[f"matmul_{dtype_name}_flops"], results[f"matmul_{dtype_name}_n"] = rate_n or (None, None)
        tick(f"{dtype_name} matmul")
    results["gemm"] = _gemm_table(torch, timer, dev, settings, results)
    tick("linear-layer GEMMs")
    results["attention"] = _attention_check(torch, timer, dev, settings, gen)
    tick("decode attention")
    scattered = results["scattered"]
    results["noise"] = noise(timer.spreads, [row["contiguous_bytes_per_s"] for row in scattered],
                             [(format_bytes(row["chunk_bytes"]), row["ratio"]) for row in scattered])
    return results


def noise(spreads: list[tuple[str, float]], copy_rates: list[float],
          efficiencies: list[tuple[str, float]] = ()) -> dict:
    """How disturbed the run was: the widest spread of any timing's repeats and which timing, the
    timings past NOISY_SPREAD, the spread of the contiguous copies of the scattered table (the
    same bytes copied at every run length, so one rate in an idle run), the run lengths whose
    efficiency (capped at 1, as the profile keeps it) dips below EFFICIENCY_DIP of a shorter run's,
    and those whose gather outran the copy GATHER_PAST_COPY times over (`efficiencies`: run length
    and gather / copy rate, shortest first). A busy 2-vCPU machine (two fresh clones installing beside a
    --quick run) gave copies of 4.2 to 28 GB/s and an efficiency of 1.0 at 256-byte runs between
    0.49 at 64 B and 0.67 at 1 KiB; beside two memory-bound jobs, copies that agreed and 1 MiB runs
    at 0.031."""
    worst_label, worst = max(spreads, key=lambda item: item[1])
    mid = statistics.median(copy_rates)
    dips, best = [], 0.0
    for label, ratio in efficiencies:
        if min(1.0, ratio) < EFFICIENCY_DIP * best:
            dips.append(label)
        best = max(best, min(1.0, ratio))
    return {"timings": len(spreads), "widest_repeat_spread": round(worst, 4), "widest": worst_label,
            "noisy": [label for label, spread in spreads if spread > NOISY_SPREAD],
            "copy_rate_spread": round((max(copy_rates) - min(copy_rates)) / mid, 4) if mid > 0 else 0.0,
            "efficiency_dips": dips,
            "gathers_past_copy": [label for label, ratio in efficiencies if ratio > GATHER_PAST_COPY]}


def _bandwidths(torch, timer: _Timer, dev, settings: CalibrationSettings, gen, tick) -> dict:
    """Sequential read, copy, and scattered runs of each table size; the buffers die on return."""
    n = settings.buffer_bytes
    src = torch.ones(n // 4, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    results: dict = {}
    t = timer.median_s(lambda: torch.sum(src), "sequential read")
    results["sequential_read_bytes_per_s"] = n / t
    tick("sequential read")
    t = timer.median_s(lambda: dst.copy_(src), "device copy")
    results["copy_bytes_per_s"] = 2 * n / t  # STREAM convention: bytes read + bytes written
    tick("device copy")
    words, out = src.view(torch.int64), dst.view(torch.int64)
    scattered = []
    for chunk in CHUNK_BYTES:
        rows = words.view(-1, chunk // 8)
        k = min(rows.shape[0], max(1, settings.gather_bytes // chunk))
        index = torch.randperm(rows.shape[0], generator=gen)[:k].to(dev)
        gathered = out[: k * chunk // 8].view(k, chunk // 8)
        t_gather = timer.median_s(lambda: torch.index_select(rows, 0, index, out=gathered),
                                  f"{format_bytes(chunk)} runs gathered")
        flat_src, flat_dst = words[: k * chunk // 8], out[: k * chunk // 8]
        t_copy = timer.median_s(lambda: flat_dst.copy_(flat_src), f"{format_bytes(chunk)} runs' contiguous copy")
        scattered.append({"chunk_bytes": chunk, "gather_bytes_per_s": k * chunk / t_gather,
                          "contiguous_bytes_per_s": k * chunk / t_copy, "ratio": t_copy / t_gather})
        tick(f"scattered {format_bytes(chunk)} runs")
    results["scattered"] = scattered
    return results


MATMUL_TARGET_S = 0.2  # one timed matmul at most this long: a slow kernel (fp16 on many CPUs) gets a smaller n
MATMUL_PROBE_N = 256


def _matmul_rate(torch, timer: _Timer, dev, dtype, dtype_name: str, n_max: int) -> tuple[float, int] | None:
    """(FLOP/s, n) of an n x n x n matmul, or None where this device has no kernel for the dtype.
    n doubles from MATMUL_PROBE_N up to `n_max` while a timed probe at the current n says the next
    one takes at most MATMUL_TARGET_S (8 times as long): on a 2-vCPU AMD EPYC the fp16 CPU kernel
    ran at 0.27 GFLOPS, where 6 runs at n = 2,048 took minutes. The probes follow one untimed
    matmul: the first on a GPU creates the BLAS handle, and when it was itself the probe (before
    2026-11-28) an H200's rate read as 0.9 TFLOPS, from launch-bound 256^3 products, not the card's
    800."""
    try:
        n = MATMUL_PROBE_N
        probe = torch.randn(n, n, device=dev).to(dtype)
        torch.matmul(probe, probe)
        timer.sync()
        while n < n_max:
            started = time.perf_counter()
            torch.matmul(probe, probe)
            timer.sync()
            if 8 * (time.perf_counter() - started) > MATMUL_TARGET_S:
                break
            n = min(2 * n, n_max)
            probe = torch.randn(n, n, device=dev).to(dtype)
        a = torch.randn(n, n, device=dev).to(dtype)
        b = torch.randn(n, n, device=dev).to(dtype)
        t = timer.median_s(lambda: torch.matmul(a, b), f"{dtype_name} matmul")
    except RuntimeError:
        return None
    return 2.0 * n**3 / t, n


def _gemm_table(torch, timer: _Timer, dev, s: CalibrationSettings, results: dict) -> dict:
    """A linear layer's GEMM, activations [m, gemm_hidden] times the transpose of gemm_weight_bytes
    of weights (nn.Linear's layout, random values), at each of `gemm_tokens`, in the faster 16-bit
    format as the cost model computes (DeviceProfile.compute_dtype): each one's median time and its
    efficiency, the roofline at this run's measured sequential read and matmul rate (hw/cost.Gemms,
    efficiency 1) over that time, capped at 1. That is the [kernels] gemm table (profiles.Kernels)."""
    dtype_name = faster_16bit(results["matmul_fp16_flops"], results["matmul_bf16_flops"])
    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float16
    k = s.gemm_hidden
    n = s.gemm_weight_bytes // (2 * k)
    weights = torch.empty(n, k, dtype=dtype, device=dev).uniform_(-0.05, 0.05)
    activations = torch.empty(max(s.gemm_tokens), k, dtype=dtype, device=dev).uniform_(-1.0, 1.0)
    out = torch.empty(max(s.gemm_tokens), n, dtype=dtype, device=dev)
    weight_bytes, flops_per_token = float(2 * n * k), float(2 * n * k)
    roofline = Gemms(weight_bytes, flops_per_token, 0.0, 0.0, results["sequential_read_bytes_per_s"],
                     results[f"matmul_{dtype_name}_flops"], (1.0,), (1.0,))
    rows = []
    for m in s.gemm_tokens:
        x, y = activations[:m], out[:m]
        t = timer.median_s(lambda: torch.matmul(x, weights.T, out=y), f"GEMM at {m:,} tokens")
        ideal = roofline.roofline_s(weight_bytes, flops_per_token, float(m))
        rows.append({"tokens": m, "seconds": t, "efficiency": max(MIN_EFFICIENCY, min(1.0, ideal / t))})
    return {"dtype": dtype_name, "hidden": k, "weight_bytes": int(weight_bytes), "rows": rows}


def _attention_check(torch, timer: _Timer, dev, s: CalibrationSettings, gen) -> dict:
    """One decode step of attention: contiguous K/V, and K/V gathered from shuffled blocks first."""
    import torch.nn.functional as F

    dtype = torch.float16 if s.device != "cpu" else torch.float32
    b, h, d, ctx, blk = s.attn_batch, s.attn_heads, s.attn_head_dim, s.attn_context_tokens, s.attn_block_tokens
    blocks_per_req = ctx // blk
    num_blocks = b * blocks_per_req
    q = torch.randn(b, h, 1, d, device=dev, dtype=dtype)
    k = torch.randn(b, h, ctx, d, device=dev, dtype=dtype)
    v = torch.randn(b, h, ctx, d, device=dev, dtype=dtype)
    # paged pools, one per head: [h, num_blocks, blk, d]; block i (request i // blocks_per_req) sits at slot table[i]
    table = torch.randperm(num_blocks, generator=gen).to(dev)
    k_pool = torch.empty(h, num_blocks, blk, d, device=dev, dtype=dtype)
    v_pool = torch.empty_like(k_pool)
    k_pool[:, table] = k.permute(1, 0, 2, 3).reshape(h, num_blocks, blk, d)
    v_pool[:, table] = v.permute(1, 0, 2, 3).reshape(h, num_blocks, blk, d)

    k_buf, v_buf = torch.empty_like(k_pool), torch.empty_like(v_pool)  # reused: no allocation in the timing
    rows = (torch.arange(h, device=dev)[:, None] * num_blocks + table[None, :]).flatten()  # block rows per head

    def gathered(pool, buf):  # one row gather of the blocks, then a strided view as [b, h, ctx, d]
        torch.index_select(pool.view(h * num_blocks, blk * d), 0, rows, out=buf.view(h * num_blocks, blk * d))
        return buf.view(h, b, ctx, d).permute(1, 0, 2, 3)

    contiguous = F.scaled_dot_product_attention(q, k, v)
    paged = F.scaled_dot_product_attention(q, gathered(k_pool, k_buf), gathered(v_pool, v_buf))
    assert torch.allclose(contiguous, paged, atol=1e-3, rtol=1e-3), "the paged gather reordered the KV"
    t_contig = timer.median_s(lambda: F.scaled_dot_product_attention(q, k, v), "contiguous attention")
    t_paged = timer.median_s(lambda: F.scaled_dot_product_attention(q, gathered(k_pool, k_buf), gathered(v_pool, v_buf)),
                             "paged attention")
    kv_bytes = 2 * k.numel() * k.element_size()
    return {"batch": b, "heads": h, "head_dim": d, "context_tokens": ctx, "block_tokens": blk,
            "dtype": str(dtype).removeprefix("torch."), "kv_bytes": kv_bytes,
            "contiguous_s": t_contig, "paged_s": t_paged, "paged_over_contiguous": t_paged / t_contig}


def profile_document(results: dict, settings: CalibrationSettings, command: str, now: dt.datetime) -> dict:
    """The measured device profile (a TOML-ready dict) built from `measure`'s results."""
    torch = import_whole("torch")  # never interrupted half-way (core/stops.py)

    name = device_name(settings.device)
    capacity, capacity_source = device_capacity_bytes(settings.device)
    date = now.date().isoformat()
    how = f"measured {date} on {name} with `{command}`"
    mode = "quick" if settings.quick else "full"
    seq = results["sequential_read_bytes_per_s"]
    compute = {}
    for key, dtype_name in (("peak_fp16", "fp16"), ("peak_bf16", "bf16")):
        rate = results[f"matmul_{dtype_name}_flops"]
        if rate is not None:
            compute[key] = {"value": format_rate(rate, "FLOPS"),
                            "source": f"{how}: {dtype_name} {results[f'matmul_{dtype_name}_n']}^3 matmul, "
                                      f"median of {settings.repeats}"}
    if "peak_fp16" not in compute:
        raise ProfileError(f"the fp16 matmul did not run on {settings.device}; cannot describe its compute rate")
    scattered = [{"chunk": format_bytes(row["chunk_bytes"]), "efficiency": round(min(1.0, row["ratio"]), 4)}
                 for row in results["scattered"]]
    gemm = results["gemm"]
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:60]
    return {
        "format": "odmactl-device/1",
        "name": f"measured-{slug}",
        "description": f"{name}, measured by odmactl calibrate ({mode})",
        "measured": True,
        "measurement": {"date": date, "device": name, "torch": torch.__version__, "command": command,
                        "odmactl": __version__, "mode": mode, "statistic": "median", "repeats": settings.repeats,
                        "warmup": settings.warmup, "buffer_bytes": settings.buffer_bytes, "seed": settings.seed},
        "memory": {
            "type": {"value": "unknown", "source": "torch does not report the memory technology"},
            "capacity": {"value": format_bytes(capacity), "source": f"{capacity_source} ({date})"},
            "peak_bandwidth": {"value": format_rate(seq, "B/s"),
                               "source": f"{how}: sequential read (sum over {format_bytes(settings.buffer_bytes)}), "
                                         f"median of {settings.repeats}"},
        },
        "compute": compute,
        "budget": {
            "memory_fraction": {"value": 0.9, "source": MEMORY_FRACTION_SOURCE},
            "activation_reserve": {"value": ACTIVATION_RESERVE, "source": ACTIVATION_RESERVE_SOURCE},
        },
        "bandwidth": {
            "source": (f"{how}: random runs gathered with index_select from a {format_bytes(settings.buffer_bytes)} "
                       f"buffer ({format_bytes(settings.gather_bytes)} per size), as a share of a contiguous copy of "
                       "the same bytes, median of each; capped at 1"),
            "sequential": {"efficiency": 1.0,
                           "source": "by definition: peak_bandwidth is this device's measured sequential read rate"},
            "scattered": scattered,
        },
        "kernels": {
            "source": (f"{how}: a linear layer's GEMM, [m, {gemm['hidden']}] activations times "
                       f"{format_bytes(gemm['weight_bytes'])} of {gemm['dtype']} weights, median of {settings.repeats}, "
                       "as a share of its roofline at this profile's peak_bandwidth and matmul rate; capped at 1. "
                       "Attention and elementwise kernels are not measured: their figures are the flat ones "
                       "(no fixed costs)"),
            "gemm": [{"tokens": row["tokens"], "efficiency": round(row["efficiency"], 4)} for row in gemm["rows"]],
        },
        "calibration": _calibration_record(results),
        "engine": {"default": _engine_default(settings.device)},
    }


def _engine_default(device: str) -> dict:
    """[engine] default of a measured profile: vLLM v1 on a CUDA device (the engine GPU users run,
    as the shipped NVIDIA profiles say), else rules/engines.DEFAULT_ENGINE."""
    if str(device).startswith("cuda"):
        return {"value": VLLM_V1, "source": "a CUDA device runs vLLM v1 (vllm/v1/core/sched/scheduler.py), as the "
                                            "shipped NVIDIA profiles' [engine] say"}
    return {"value": DEFAULT_ENGINE, "source": f"no vLLM v1 build is assumed on {device}: odmactl's default engine"}


def _calibration_record(results: dict) -> dict:
    """The raw measurements, kept in the profile for the record (the cost model does not read them)."""
    seq, copy = results["sequential_read_bytes_per_s"], results["copy_bytes_per_s"]
    record = {
        "sequential_read_bytes_per_s": round(seq),
        "copy_bytes_per_s": round(copy),
        "sequential_read_over_copy": round(seq / copy, 4),
        "scattered": [{k: (round(v) if k.endswith("per_s") else round(v, 4) if isinstance(v, float) else v)
                       for k, v in row.items()} for row in results["scattered"]],
        "attention": {k: (float(f"{v:.6g}") if isinstance(v, float) else v) for k, v in results["attention"].items()},
        "gemm": {**{k: v for k, v in results["gemm"].items() if k != "rows"},
                 "rows": [{"tokens": r["tokens"], "seconds": float(f"{r['seconds']:.6g}"),
                           "efficiency": round(r["efficiency"], 4)} for r in results["gemm"]["rows"]]},
        "noise": results["noise"],
    }
    for key in ("matmul_fp16_flops", "matmul_bf16_flops"):
        if results[key] is not None:
            record[key] = round(results[key])
    return record


def calibrate(device: str, quick: bool, seed: int, out_path: Path, progress: Progress = None) -> tuple[dict, str]:
    """Measure `device` (auto, cpu, cuda, mlu) and describe it as a profile for `out_path`: (the
    profile document, its TOML text, checked to read back as a valid profile)."""
    import tomllib

    import tomli_w

    from odmactl.hw.profiles import parse_device

    resolved = resolve_device(device)
    settings = CalibrationSettings.for_device(resolved, quick, seed)
    command = f"odmactl calibrate --device {device}{' --quick' if quick else ''} --out {out_path}"
    results = measure(settings, progress)
    doc = profile_document(results, settings, command, dt.datetime.now(dt.timezone.utc))
    text = "# Measured by odmactl calibrate; see [measurement] for when, where and how.\n" + tomli_w.dumps(doc)
    parse_device(tomllib.loads(text), out_path)
    return doc, text
