"""On-device replay: a replay's decode iterations executed on a torch arena and timed, so the cost
model's step time is checked against the device it claims to describe.

What lies inside a block (the allocator decides where a block lies, this decides its contents):
- contiguous policies (static, s3, odma), token-major: token t of a block at offset o holds every
  layer's K and V in [o + t * bytes_per_token, o + (t + 1) * bytes_per_token), so a request's first
  `kv` tokens are one slice;
- paged, layer-major inside a block: layer l of block b is `block_tokens * bytes_per_token_layer`
  bytes at b * block_bytes + l * block_tokens * bytes_per_token_layer, so one layer of a request is
  its blocks' runs, scattered (vLLM keeps one block table per layer).

One decode iteration (`DecodeProbe.step`) runs, on the device:
1. the weights, as the batch's GEMM in the nn.Linear layout: activations [batch, hidden] times the
   transpose of the weight bytes viewed as a 16-bit matrix [weight_bytes / (2 * hidden), hidden]:
   every weight byte read once, 2 * batch * params FLOPs (the product, batch / hidden of the weight
   bytes, is written into a preallocated buffer). The column count is rounded down to a multiple of
   GEMM_ALIGN, as every layer shape of a real model is: an odd count leaves the product's rows
   misaligned, and on an H100 cuBLAS then ran the batch-256 product at about a tenth of its
   tensor-core rate. Weights and activations hold small random values, not zeros: a tensor core
   multiplying zeros draws less power and runs faster than on real weights. The dtype is the
   profile's faster 16-bit rate (`compute_dtype`: bf16 on CPUs, whose fp16 kernels are slow), the
   one the cost model is given;
2. every running request's KV, read in the runs the layout gives it (`_runs`: one run per
   contiguous block; for paged, one per block and layer, and one per layer for the last partial
   block). Nothing as large as the KV is written. Two readers:
   - on CUDA with Triton (torch's CUDA wheels ship it): `_read_runs_kernel` splits the runs into
     tiles of at most TILE_BYTES and sums each tile in one program, so the read goes at the rate
     the memory gives runs of that length, as an attention kernel's KV loads do. On an H100,
     `embedding_bag` (below) read the same runs at about 1.8 TB/s against about 3 TB/s streamed;
   - elsewhere: `embedding_bag` sums over row views of the arena (rows of one token for contiguous
     blocks; for paged, rows of one block-layer for full blocks and of one token-layer for the
     last partial block), bags of 64 rows: at most two kernels whatever the batch.
The run tiles or row indices are built and copied to the device before the clock starts; the clock is CUDA
events on cuda, synchronise + perf_counter elsewhere. The replay's clock still advances by the
modelled step time, so scheduling and every replay metric equal the virtual replay's under
--stepping; the probe adds measured against modelled step times.

`--scale F` keeps round(F * layers) layers (at least one): the weights are recounted for that many
layers and the KV per token shrinks with them, while the pool keeps its size in tokens, so the
scaled replay makes the same admission and growth decisions as the full one.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import os
import time
from itertools import chain

import numpy as np

from odmactl.core.stops import import_whole
from odmactl.core.errors import ConfigError, ProfileError
from odmactl.core.units import format_bytes
from odmactl.device.calibrate import device_backend, device_name
from odmactl.hw.profiles import DeviceProfile, ModelProfile, device_paths, read_device

BAG_ROWS = 64
TILE_BYTES = 32 << 10  # one program of the run reader: a paged block-layer of 16 tokens of a 7B GQA model
GEMM_ALIGN = 128  # weight columns per multiple: every hidden and intermediate size of the shipped models is one
TORCH_DEVICES = ("auto", "cpu", "cuda", "mlu")


@dataclasses.dataclass(frozen=True)
class OnDeviceSpec:
    """`torch_device`: auto, cpu, cuda or mlu; `scale`: the share of the model's layers kept."""

    torch_device: str
    scale: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 < self.scale <= 1.0:
            raise ConfigError(f"--scale must be in (0, 1], got {self.scale}")


def expand_runs(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Every index of every run [start, start + len), runs in order."""
    return np.arange(int(lens.sum()), dtype=np.int64) + np.repeat(starts - (np.cumsum(lens) - lens), lens)


def split_runs(starts: np.ndarray, lens: np.ndarray, tile: int) -> tuple[np.ndarray, np.ndarray]:
    """The runs cut into tiles of at most `tile`: (tile starts, tile lengths), runs in order, each
    run's tiles in order; an empty run has none."""
    counts = -(-lens // tile)
    k = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    return np.repeat(starts, counts) + k * tile, np.minimum(np.repeat(lens, counts) - k * tile, tile)


def run_reader(kind: str):
    """The Triton run reader (odmactl/device/runread.py) for a CUDA device, or None: another device, or
    no Triton in this torch install."""
    if kind != "cuda":
        return None
    try:
        from odmactl.device import runread
    except ImportError:
        return None
    return runread.read_tiles


def measured_profile(torch_device: str) -> DeviceProfile:
    """The measured profile (profiles/devices/measured/) whose [measurement] names this device."""
    name = device_name(torch_device)
    for path in device_paths():
        profile = read_device(path)
        if profile.measured and profile.measurement and profile.measurement.get("device") == name:
            return profile
    raise ProfileError(f"no measured profile describes {name}",
                       hint=f"run `odmactl calibrate --device {torch_device} --out profiles/devices/measured/NAME.toml`, "
                            f"or pass --profile with a device profile to compare against")


def free_device_bytes(torch_device: str) -> int:
    """Memory the arena and weights can take now: free device memory plus what torch's caching
    allocator holds unused (an earlier policy's arena), or available host memory."""
    if torch_device == "cpu":
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    backend = device_backend(torch_device.split(":")[0])
    cached = backend.memory_reserved() - backend.memory_allocated()
    return int(backend.mem_get_info()[0]) + int(cached)


def release_device_memory(torch_device: str) -> None:
    """Hand the memory of dropped arenas back to the device (torch caches freed blocks otherwise)."""
    gc.collect()
    if torch_device != "cpu":
        device_backend(torch_device.split(":")[0]).empty_cache()


HOST_SHARE = 0.5  # of the host's available memory an on-device replay on the CPU may take (the rest is the system's)
DEVICE_SHARE = 0.9  # of an accelerator's free memory


def check_fits(torch_device: str, pool_bytes: int, weight_bytes: int, scale: float) -> None:
    """Raise ConfigError, suggesting a --scale that fits, when the arena and the weights' GEMM need
    more than their share of the memory free now."""
    need = pool_bytes + weight_bytes
    share = HOST_SHARE if torch_device == "cpu" else DEVICE_SHARE
    free = free_device_bytes(torch_device)
    if need > share * free:
        suggest = max(share * free / need * scale, 1e-3)
        raise ConfigError(
            f"an on-device replay needs {format_bytes(need)} on {torch_device} (KV pool {format_bytes(pool_bytes)} + "
            f"weights {format_bytes(weight_bytes)}) and {format_bytes(free)} is free, of which it may take {share:.0%}",
            hint=f"scale the model down, e.g. --scale {suggest:.3g}, or shrink the pool with --kv-pool")


class DecodeProbe:
    """Runs and times each decode iteration of one replay on `arena` (a TorchArena) for `model`.

    `reader`: "auto" reads the KV with the Triton run reader where there is one (CUDA), else with
    embedding_bag; "embedding_bag" always with embedding_bag.

    Invariant: `modelled_ps[j]`, `measured_s[j]`, `batch[j]` and `kv_bytes[j]` (KV bytes the
    iteration read, every layer) describe the same iteration j; the arena's
    bytes are zeroed once (no denormals, pages touched) and only read afterwards, apart from the
    allocator's migration copies.
    """

    def __init__(self, arena, model: ModelProfile, block_tokens: int | None, max_batch: int,
                 compute_dtype: str = "fp16", reader: str = "auto", kv_ranges=None) -> None:
        """`kv_ranges(a)`: the byte ranges of a request's KV in token order, for a policy with
        contiguous growth (one range, or ADR-006's few page ranges); None: its blocks."""
        torch = import_whole("torch")  # never interrupted half-way (core/stops.py)

        self.kv_ranges = kv_ranges
        self.torch = torch
        self.arena = arena
        self.dev = arena.buffer.device
        self.kind = self.dev.type
        per_layer = model.kv_bytes_per_token_layer
        if per_layer != int(per_layer) or int(per_layer) % 4:
            raise ConfigError(f"on-device replay reads KV as 4-byte words; {model.kv_dtype} KV has "
                              f"{per_layer} bytes per token and layer", hint="use --kv-dtype fp16, bf16, fp8 or int8")
        self.bpl = int(per_layer)
        self.layers = model.num_layers
        self.bpt = model.kv_bytes_per_token
        self.block_tokens = block_tokens
        arena.buffer.zero_()
        self.words = arena.buffer[: arena.pool_bytes // 4 * 4].view(torch.float32)
        if reader not in ("auto", "embedding_bag"):
            raise ValueError(f"reader must be auto or embedding_bag, got {reader!r}")
        self.kernel = run_reader(self.kind) if reader == "auto" else None
        self.align_words = math.gcd(self.bpl // 4, TILE_BYTES // 4, 16)  # divides every run and tile start
        hidden = model.hidden_size
        cols = model.weight_bytes // (2 * hidden)
        cols = cols - cols % GEMM_ALIGN if cols >= GEMM_ALIGN else max(1, cols)
        dtype = torch.bfloat16 if compute_dtype == "bf16" else torch.float16
        gen = torch.Generator(device=self.dev).manual_seed(0)
        self.weights = torch.empty(cols, hidden, dtype=dtype, device=self.dev).uniform_(-0.05, 0.05, generator=gen)
        self.activations = torch.empty(max_batch, hidden, dtype=dtype, device=self.dev).uniform_(-1.0, 1.0,
                                                                                                 generator=gen)
        self.product = torch.empty(max_batch, cols, dtype=dtype, device=self.dev)
        self.compute_dtype = compute_dtype
        self.weight_bytes = hidden * cols * 2
        self.modelled_ps: list[int] = []
        self.measured_s: list[float] = []
        self.batch: list[int] = []
        self.kv_bytes: list[int] = []

    # ------------------------------------------------------------------------------ runs

    def _runs(self, allocations: list, kv_tokens: list[int]) -> list[tuple[np.ndarray, np.ndarray, int]]:
        """The KV the batch reads, as groups of (start words, length words, row words): runs of
        4-byte words into the arena; each group's starts and lengths are multiples of its row width
        (the unit embedding_bag reads them in)."""
        lens = np.asarray(kv_tokens, dtype=np.int64)
        if self.kv_ranges is not None:  # ranges, token-major like a contiguous block: each up to its share
            row = self.bpt // 4
            starts, words = [], []
            for a, tokens in zip(allocations, lens.tolist()):
                left = tokens * self.bpt
                for start, n in self.kv_ranges(a):
                    if left <= 0:
                        break
                    starts.append(start // 4)
                    words.append(min(n, left) // 4)
                    left -= n
            return [(np.array(starts, dtype=np.int64), np.array(words, dtype=np.int64), row)]
        if self.block_tokens is None:
            offsets = np.fromiter((a.offset_bytes for a in allocations), np.int64, len(allocations))
            assert not (offsets % self.bpt).any(), "a contiguous block does not start on a token row"
            row = self.bpt // 4
            return [(offsets // 4, lens * row, row)]
        T, L = self.block_tokens, self.layers
        layer_words = T * self.bpl // 4  # one layer of one block
        full, rest = (lens // T).tolist(), (lens % T)
        blocks = np.fromiter(chain.from_iterable(a.block_ids[:f] for a, f in zip(allocations, full)),
                             np.int64, int(sum(full)))
        full_starts = ((blocks[:, None] * L + np.arange(L, dtype=np.int64)) * layer_words).ravel()
        groups = [(full_starts, np.full(full_starts.size, layer_words, dtype=np.int64), layer_words)]
        tails = [(a.block_ids[f], r) for a, f, r in zip(allocations, full, rest.tolist()) if r]
        if tails:
            tail_block = np.array([b for b, _ in tails], dtype=np.int64)
            tail_starts = ((tail_block[:, None] * L + np.arange(L, dtype=np.int64)) * layer_words).ravel()
            tail_lens = np.repeat(np.array([r for _, r in tails], dtype=np.int64), L) * (self.bpl // 4)
            groups.append((tail_starts, tail_lens, self.bpl // 4))
        return groups

    def _bag_reads(self, groups: list) -> list[tuple]:
        """embedding_bag's inputs per group: (rows view, row index tensor, bag offsets), on the device."""
        torch = self.torch
        out = []
        for starts, lens, row in groups:
            idx = expand_runs(starts // row, lens // row)
            if idx.size:
                rows = self.words[: self.words.numel() // row * row].view(-1, row)
                out.append((rows, torch.from_numpy(idx).to(self.dev),
                            torch.arange(0, idx.size, BAG_ROWS, dtype=torch.int64).to(self.dev)))
        return out

    def _tile_reads(self, groups: list) -> tuple | None:
        """The run reader's inputs: (tile starts, tile lengths, per-tile sums), on the device."""
        starts = np.concatenate([g[0] for g in groups])
        lens = np.concatenate([g[1] for g in groups])
        tile_starts, tile_lens = split_runs(starts, lens, TILE_BYTES // 4)
        if not tile_starts.size:
            return None
        torch = self.torch
        return (torch.from_numpy(tile_starts).to(self.dev), torch.from_numpy(tile_lens).to(self.dev),
                torch.empty(tile_starts.size, dtype=torch.float32, device=self.dev))

    # ------------------------------------------------------------------------------ one step

    def step(self, allocations: list, kv_tokens: list[int], modelled_ps: int) -> float:
        """Run one decode iteration of this batch on the device; returns its measured seconds."""
        torch = self.torch
        groups = self._runs(allocations, kv_tokens)
        n = len(allocations)
        x, out = self.activations[:n], self.product[:n]
        if self.kernel is not None:
            tiles = self._tile_reads(groups)

            def read_kv() -> None:
                if tiles is not None:
                    self.kernel(self.words, *tiles, self.align_words)
        else:
            bags = self._bag_reads(groups)

            def read_kv() -> None:
                for rows, idx, offsets in bags:
                    torch.nn.functional.embedding_bag(idx, rows, offsets, mode="sum")

        def run() -> None:
            torch.matmul(x, self.weights.T, out=out)
            read_kv()

        device = None if self.kind == "cpu" else device_backend(self.kind)
        if not self.measured_s:
            run()  # untimed: the first launch compiles the Triton reader and picks cuBLAS kernels (0.7 s on an H100)
        if device is not None:
            device.synchronize()
        if self.kind == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            run()
            if device is not None:
                device.synchronize()
            seconds = time.perf_counter() - t0
        self.modelled_ps.append(modelled_ps)
        self.measured_s.append(seconds)
        self.batch.append(n)
        self.kv_bytes.append(sum(kv_tokens) * self.bpt)
        return seconds

    # ------------------------------------------------------------------------------ report

    def summary(self, profile: DeviceProfile, model: ModelProfile, full_model: ModelProfile, scale: float,
                points: int = 256) -> dict:
        """Measured against modelled decode time: totals, per-step relative error, a sampled series."""
        torch = import_whole("torch")  # never interrupted half-way (core/stops.py)

        modelled = np.asarray(self.modelled_ps, dtype=np.float64) / 1e12
        measured = np.asarray(self.measured_s, dtype=np.float64)
        error = measured / np.maximum(modelled, 1e-30) - 1.0 if modelled.size else np.zeros(0)
        batch, kv_bytes = np.asarray(self.batch, dtype=np.float64), np.asarray(self.kv_bytes, dtype=np.float64)
        stride = max(1, -(-modelled.size // points))

        def pct(values: np.ndarray, q: float) -> float:
            return float(np.percentile(values, q)) if values.size else 0.0

        return {
            "torch_device": str(self.dev), "device_name": device_name(self.kind), "torch": torch.__version__,
            "profile": profile.name, "model": model.name,
            "scale": scale, "layers": model.num_layers, "layers_full": full_model.num_layers,
            "weight_bytes_read_per_step": self.weight_bytes, "compute_dtype": self.compute_dtype,
            "kv_reader": "triton runs" if self.kernel is not None else "embedding_bag",
            "decode_steps": int(modelled.size),
            "modelled_decode_s": float(modelled.sum()), "measured_decode_s": float(measured.sum()),
            "total_error": float(measured.sum() / modelled.sum() - 1.0) if modelled.sum() > 0 else 0.0,
            "step_error_p50": pct(error, 50), "step_abs_error_p50": pct(np.abs(error), 50),
            "step_abs_error_p90": pct(np.abs(error), 90),
            # the same least squares on both sides: the terms the model misjudges
            "measured_fit": step_time_fit(measured, batch, kv_bytes),
            "modelled_fit": step_time_fit(modelled, batch, kv_bytes),
            "series": {"step": list(range(0, modelled.size, stride)),
                       "modelled_s": modelled[::stride].tolist(), "measured_s": measured[::stride].tolist(),
                       "batch": self.batch[::stride], "kv_bytes": self.kv_bytes[::stride]},
        }


def step_time_fit(measured_s: np.ndarray, batch: np.ndarray, kv_bytes: np.ndarray) -> dict | None:
    """Least squares of the measured step times on the cost model's shape,
    measured_s = fixed_s + per_request_s * batch + kv_bytes / kv_bytes_per_s, so the measurement says
    which term the model misjudges: `fixed_s` is mostly the weight read, `kv_bytes_per_s` the rate the
    KV gathers reached. None when the steps cannot separate the three terms (fewer than 8 steps, or
    batch or KV bytes that do not vary independently)."""
    if measured_s.size < 8:
        return None
    design = np.column_stack([np.ones_like(batch), batch, kv_bytes])
    scaled = design / np.maximum(np.abs(design).max(axis=0), 1e-30)
    if np.linalg.matrix_rank(scaled, tol=1e-9) < 3:
        return None
    coef, *_ = np.linalg.lstsq(design, measured_s, rcond=None)
    residual = measured_s - design @ coef
    spread = float(((measured_s - measured_s.mean()) ** 2).sum())
    return {"fixed_s": float(coef[0]), "per_request_s": float(coef[1]),
            "kv_bytes_per_s": float(1.0 / coef[2]) if coef[2] > 0 else None,
            "r2": 1.0 - float((residual ** 2).sum()) / spread if spread > 0 else None,
            "residual_rms_s": float(np.sqrt((residual ** 2).mean()))}
