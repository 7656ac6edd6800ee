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
   bytes, is written into a preallocated buffer). The dtype is the profile's faster 16-bit rate
   (`compute_dtype`: bf16 on CPUs, whose fp16 kernels are slow), the one the cost model is given;
2. every running request's KV, read as gathers: `embedding_bag` sums over row views of the arena
   (rows of one token for contiguous blocks; for paged, rows of one block-layer for full blocks and
   of one token-layer for the last partial block), bags of 64 rows, so a step is at most three
   kernels whatever the batch and nothing as large as the KV is written.
The row indices are built and copied to the device before the clock starts; the clock is CUDA
events on cuda, synchronise + perf_counter elsewhere. The replay's clock still advances by the
modelled step time, so scheduling and every replay metric equal the virtual replay's under
--stepping; the probe adds measured against modelled step times.

`--scale F` keeps round(F * layers) layers (at least one): the weights are recounted for that many
layers and the KV per token shrinks with them, while the pool keeps its size in tokens, so the
scaled replay makes the same admission and growth decisions as the full one.
"""

from __future__ import annotations

import dataclasses
import os
import time
from itertools import chain

import numpy as np

from odmactl.calibrate import device_backend, device_name
from odmactl.errors import ConfigError, ProfileError
from odmactl.profiles import DeviceProfile, ModelProfile, device_paths, read_device
from odmactl.units import format_bytes

BAG_ROWS = 64
TORCH_DEVICES = ("auto", "cpu", "cuda", "mlu")


@dataclasses.dataclass(frozen=True)
class OnDeviceSpec:
    """`torch_device`: auto, cpu, cuda or mlu; `scale`: the share of the model's layers kept."""

    torch_device: str
    scale: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 < self.scale <= 1.0:
            raise ConfigError(f"--scale must be in (0, 1], got {self.scale}")


def scaled_model(model: ModelProfile, scale: float) -> ModelProfile:
    """The model with round(scale * layers) layers, at least one (the parameter count follows)."""
    if scale >= 1.0:
        return model
    layers = max(1, round(model.num_layers * scale))
    return dataclasses.replace(model, num_layers=layers, name=f"{model.name} ({layers}/{model.num_layers} layers)")


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


def compute_dtype(profile: DeviceProfile) -> str:
    """The 16-bit format the device computes faster by its profile (fp16 unless bf16 is faster)."""
    bf16 = profile.peak_bf16_flops
    return "bf16" if bf16 is not None and bf16 > profile.peak_fp16_flops else "fp16"


def free_device_bytes(torch_device: str) -> int:
    """Memory the arena and weights can take now: free device memory, or available host memory."""
    if torch_device == "cpu":
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    return int(device_backend(torch_device.split(":")[0]).mem_get_info()[0])


def check_fits(torch_device: str, pool_bytes: int, weight_bytes: int, scale: float) -> None:
    need = pool_bytes + weight_bytes
    free = free_device_bytes(torch_device)
    if need > 0.9 * free:
        suggest = max(0.9 * free / need * scale, 1e-3)
        raise ConfigError(
            f"an on-device replay needs {format_bytes(need)} on {torch_device} (KV pool {format_bytes(pool_bytes)} + "
            f"weights {format_bytes(weight_bytes)}) and {format_bytes(free)} is free",
            hint=f"scale the model down, e.g. --scale {suggest:.3g}, or shrink the pool with --kv-pool")


class DecodeProbe:
    """Runs and times each decode iteration of one replay on `arena` (a TorchArena) for `model`.

    Invariant: `modelled_ps[j]` and `measured_s[j]` describe the same iteration j; the arena's
    bytes are zeroed once (no denormals, pages touched) and only read afterwards, apart from the
    allocator's migration copies.
    """

    def __init__(self, arena, model: ModelProfile, block_tokens: int | None, max_batch: int,
                 compute_dtype: str = "fp16") -> None:
        import torch

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
        words = arena.buffer[: arena.pool_bytes // 4 * 4].view(torch.float32)
        if block_tokens is None:
            n = arena.pool_bytes // self.bpt
            self.token_rows = words[: n * self.bpt // 4].view(n, self.bpt // 4)
        else:
            block_bytes = block_tokens * self.bpt
            n = arena.pool_bytes // block_bytes
            body = words[: n * block_bytes // 4]
            self.block_rows = body.view(n * self.layers, block_tokens * self.bpl // 4)
            self.layer_rows = body.view(n * self.layers * block_tokens, self.bpl // 4)
        hidden = model.hidden_size
        cols = max(1, model.weight_bytes // (2 * hidden))
        dtype = torch.bfloat16 if compute_dtype == "bf16" else torch.float16
        self.weights = torch.zeros(cols, hidden, dtype=dtype, device=self.dev)
        self.activations = torch.zeros(max_batch, hidden, dtype=dtype, device=self.dev)
        self.product = torch.empty(max_batch, cols, dtype=dtype, device=self.dev)
        self.compute_dtype = compute_dtype
        self.weight_bytes = hidden * cols * 2
        self.modelled_ps: list[int] = []
        self.measured_s: list[float] = []

    # ------------------------------------------------------------------------------ indices

    def _contiguous_rows(self, allocations: list, kv_tokens: list[int]) -> np.ndarray:
        offsets = np.fromiter((a.offset_bytes for a in allocations), np.int64, len(allocations))
        assert not (offsets % self.bpt).any(), "a contiguous block does not start on a token row"
        starts = offsets // self.bpt
        lens = np.asarray(kv_tokens, dtype=np.int64)
        return np.arange(int(lens.sum()), dtype=np.int64) + np.repeat(starts - (np.cumsum(lens) - lens), lens)

    def _paged_rows(self, allocations: list, kv_tokens: list[int]) -> tuple[np.ndarray, np.ndarray]:
        T, L = self.block_tokens, self.layers
        lens = np.asarray(kv_tokens, dtype=np.int64)
        full, rest = (lens // T).tolist(), (lens % T)
        blocks = np.fromiter(chain.from_iterable(a.block_ids[:f] for a, f in zip(allocations, full)),
                             np.int64, int(sum(full)))
        block_rows = (blocks[:, None] * L + np.arange(L, dtype=np.int64)).ravel()
        tails = [(a.block_ids[f], r) for a, f, r in zip(allocations, full, rest.tolist()) if r]
        if not tails:
            return block_rows, np.empty(0, dtype=np.int64)
        tail_block = np.array([b for b, _ in tails], dtype=np.int64)
        tail_len = np.repeat(np.array([r for _, r in tails], dtype=np.int64), L)
        starts = (tail_block[:, None] * (L * T) + np.arange(L, dtype=np.int64) * T).ravel()
        token_rows = np.arange(int(tail_len.sum()), dtype=np.int64) + \
            np.repeat(starts - (np.cumsum(tail_len) - tail_len), tail_len)
        return block_rows, token_rows

    def _gathers(self, allocations: list, kv_tokens: list[int]) -> list[tuple]:
        """(rows view, index tensor, bag offsets) per gather, on the device."""
        if self.block_tokens is None:
            parts = [(self.token_rows, self._contiguous_rows(allocations, kv_tokens))]
        else:
            block_rows, token_rows = self._paged_rows(allocations, kv_tokens)
            parts = [(self.block_rows, block_rows), (self.layer_rows, token_rows)]
        torch = self.torch
        out = []
        for rows, idx in parts:
            if idx.size:
                out.append((rows, torch.from_numpy(idx).to(self.dev),
                            torch.arange(0, idx.size, BAG_ROWS, dtype=torch.int64).to(self.dev)))
        return out

    # ------------------------------------------------------------------------------ one step

    def step(self, allocations: list, kv_tokens: list[int], modelled_ps: int) -> float:
        """Run one decode iteration of this batch on the device; returns its measured seconds."""
        torch = self.torch
        embedding_bag = torch.nn.functional.embedding_bag
        gathers = self._gathers(allocations, kv_tokens)
        n = len(allocations)
        x, out = self.activations[:n], self.product[:n]

        def run() -> None:
            torch.matmul(x, self.weights.T, out=out)
            for rows, idx, offsets in gathers:
                embedding_bag(idx, rows, offsets, mode="sum")

        device = None if self.kind == "cpu" else device_backend(self.kind)
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
        return seconds

    # ------------------------------------------------------------------------------ report

    def summary(self, profile: DeviceProfile, model: ModelProfile, full_model: ModelProfile, scale: float,
                points: int = 256) -> dict:
        """Measured against modelled decode time: totals, per-step relative error, a sampled series."""
        import torch

        modelled = np.asarray(self.modelled_ps, dtype=np.float64) / 1e12
        measured = np.asarray(self.measured_s, dtype=np.float64)
        error = measured / np.maximum(modelled, 1e-30) - 1.0 if modelled.size else np.zeros(0)
        stride = max(1, -(-modelled.size // points))

        def pct(values: np.ndarray, q: float) -> float:
            return float(np.percentile(values, q)) if values.size else 0.0

        return {
            "torch_device": str(self.dev), "device_name": device_name(self.kind), "torch": torch.__version__,
            "profile": profile.name, "model": model.name,
            "scale": scale, "layers": model.num_layers, "layers_full": full_model.num_layers,
            "weight_bytes_read_per_step": self.weight_bytes, "compute_dtype": self.compute_dtype,
            "decode_steps": int(modelled.size),
            "modelled_decode_s": float(modelled.sum()), "measured_decode_s": float(measured.sum()),
            "total_error": float(measured.sum() / modelled.sum() - 1.0) if modelled.sum() > 0 else 0.0,
            "step_error_p50": pct(error, 50), "step_abs_error_p50": pct(np.abs(error), 50),
            "step_abs_error_p90": pct(np.abs(error), 90),
            "series": {"step": list(range(0, modelled.size, stride)),
                       "modelled_s": modelled[::stride].tolist(), "measured_s": measured[::stride].tolist()},
        }
