"""On-device replay: a replay's iterations executed on a torch arena and timed, so the cost
model's step time is checked against the device it claims to describe.

What lies inside a block (the allocator decides where a block lies, this decides its contents):
- contiguous policies (static, s3, odma), token-major: token t of a block at offset o holds every
  layer's K and V in [o + t * bytes_per_token, o + (t + 1) * bytes_per_token), so a request's first
  `kv` tokens are one slice;
- paged, layer-major inside a block: layer l of block b is `block_tokens * bytes_per_token_layer`
  bytes at b * block_bytes + l * block_tokens * bytes_per_token_layer, so one layer of a request is
  its blocks' runs, scattered (vLLM keeps one block table per layer).

One iteration (`StepProbe.step`) runs, on the device, what the cost model charges it for
(hw/cost.py: decode, prefill and "mixed", the chunked step of vLLM v1):
1. the weights, as the step's GEMMs in the nn.Linear layout, activations [rows, hidden] times the
   transpose of weight bytes viewed as a 16-bit matrix [columns, hidden]: the layers' weights
   (ModelProfile.layer_weight_bytes: all but the embedding table and the head) one GEMM per layer
   for every token the step computes (its decodes and its prompt chunks' tokens), and the head
   (vocab x hidden) for the decodes and the last token of each chunk, as the model's gemm_layers
   and gemm_head; every weight byte read once, 2 * rows * params FLOPs. The embedding table is not
   read: a step reads only its tokens' rows (the model's `row` term, 7 KiB a token of a 7B model),
   which the probe leaves out. Before 2026-11-28 the probe streamed the whole weight file (the
   embedding table too: 1.09 of 15.23 GB for DeepSeek-R1-Distill-Qwen-7B) in one GEMM at every
   decode step, which the model, rightly, does not charge. A layer's column count is rounded down
   to a multiple of GEMM_ALIGN, as every layer shape of a real model is: an odd count leaves the
   product's rows misaligned, and on an H100 cuBLAS then ran the batch-256 product at about a tenth
   of its tensor-core rate. Weights and activations hold small random values, not zeros: a tensor
   core multiplying zeros draws less power and runs faster than on real weights. The dtype is the
   profile's faster 16-bit rate (`compute_dtype`: bf16 on CPUs, whose fp16 kernels are slow), the
   one the cost model is given. A mixture-of-experts model's layers are multiplied densely here,
   where the model charges the routed experts' FLOPs: its compute-bound steps measure slow;
2. every decoding request's KV, read in the runs the layout gives it (`_runs`: one run per
   contiguous block; for paged, one per block and layer, and one per layer for the last partial
   block). Nothing as large as the KV is written. Two readers:
   - on CUDA with Triton (torch's CUDA wheels ship it): `_read_runs_kernel` splits the runs into
     tiles of at most TILE_BYTES and sums each tile in one program, so the read goes at the rate
     the memory gives runs of that length, as an attention kernel's KV loads do. On an H100,
     `embedding_bag` (below) read the same runs at about 1.8 TB/s against about 3 TB/s streamed;
   - elsewhere: `embedding_bag` sums over row views of the arena (rows of one token for contiguous
     blocks; for paged, rows of one block-layer for full blocks and of one token-layer for the
     last partial block), bags of 64 rows: at most two kernels whatever the batch;
3. each prompt chunk's attention, c new queries after x computed tokens, every layer at once:
   torch's scaled_dot_product_attention of the c queries over the x earlier keys (no mask), then
   over their own c keys (causal): the lower-triangle band ((x + c)^2 - x^2) / 2 of query-key
   pairs the model's squares term charges. The keys and values are scratch tensors of
   max_model_len tokens with a head per query head, not the chunk's blocks in the arena: a prompt's
   attention is compute-bound (the model charges its FLOPs only), and where the KV lies does not
   move it; without GQA's grouping, torch picks its flash kernel on every version it has one
   (enable_gqa is not taken by every backend, and the math fallback would hold every score).
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
from odmactl.hw.profiles import KV_DTYPE_BITS, DeviceProfile, ModelProfile, device_paths, read_device

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


def check_fits(torch_device: str, need_at, full_model: ModelProfile, scale: float) -> None:
    """Raise ConfigError when the replay of `full_model` at `scale` needs more than its share of
    the memory free now. `need_at(model)` gives (arena bytes, probe bytes: StepProbe's tensors,
    StepShape) for the model scaled any way; the hint names the largest whole number of layers that
    fits and the --scale that keeps them, or says that even one layer does not (the probe's step
    buffers follow the token budget, not the layers)."""
    share = HOST_SHARE if torch_device == "cpu" else DEVICE_SHARE
    free = free_device_bytes(torch_device)
    now = full_model.scaled(scale)
    pool_bytes, probe_bytes = need_at(now)
    if pool_bytes + probe_bytes <= share * free:
        return
    layers_full = full_model.num_layers
    scales = (_scale_for(layers, full_model) for layers in range(now.num_layers - 1, 0, -1))
    fits = next((text for text in scales if sum(need_at(full_model.scaled(float(text)))) <= share * free), None)
    if fits is not None:
        hint = (f"scale the model down: --scale {fits} keeps {full_model.scaled(float(fits)).num_layers} of its "
                f"{layers_full} layers; or shrink the pool with --kv-pool")
    else:
        one = sum(need_at(full_model.scaled(float(_scale_for(1, full_model)))))
        hint = (f"even one of the model's {layers_full} layers needs {format_bytes(one)}: shrink the pool with "
                f"--kv-pool, or the step's token budget with --max-num-batched-tokens (the probe's buffers hold "
                f"max_num_seqs + that many tokens)")
    raise ConfigError(
        f"an on-device replay needs {format_bytes(pool_bytes + probe_bytes)} on {torch_device} (KV pool "
        f"{format_bytes(pool_bytes)} + weights and step buffers {format_bytes(probe_bytes)}) and "
        f"{format_bytes(free)} is free, of which it may take {share:.0%}", hint=hint)


def _scale_for(layers: int, full_model: ModelProfile) -> str:
    """The shortest --scale that `full_model.scaled` turns into `layers` layers."""
    for digits in range(2, 17):
        text = f"{layers / full_model.num_layers:.{digits}g}"
        if full_model.scaled(float(text)).num_layers == layers:
            return text
    return repr(layers / full_model.num_layers)


def _aligned_columns(weight_bytes: int, hidden: int) -> int:
    """Columns of a [columns, hidden] 16-bit view of `weight_bytes`, rounded down to GEMM_ALIGN."""
    cols = weight_bytes // (2 * hidden)
    return cols - cols % GEMM_ALIGN if cols >= GEMM_ALIGN else max(1, cols)


@dataclasses.dataclass(frozen=True)
class StepShape:
    """The tensors a StepProbe holds for `model`: per-layer and head GEMM columns, the most rows a
    step computes (`max_rows`: decodes + prompt-chunk tokens) and the attention scratch (the most
    chunk tokens, `max_chunk_tokens`, and the longest context, `max_context_tokens`, with a key
    and value head per query head)."""

    layers: int
    hidden: int
    layer_columns: int
    head_columns: int
    max_rows: int
    heads: int
    head_dim: int
    max_chunk_tokens: int
    max_context_tokens: int

    @classmethod
    def of(cls, model: ModelProfile, max_batch: int, max_chunk_tokens: int, max_context_tokens: int) -> StepShape:
        hidden, layers = model.hidden_size, model.num_layers
        return cls(layers=layers, hidden=hidden,
                   layer_columns=_aligned_columns(model.layer_weight_bytes // layers, hidden),
                   head_columns=_aligned_columns(model.head_params * 2, hidden),
                   max_rows=max_batch + max_chunk_tokens, heads=model.num_attention_heads, head_dim=model.head_dim,
                   max_chunk_tokens=max_chunk_tokens, max_context_tokens=max_context_tokens if max_chunk_tokens else 0)

    @property
    def weight_bytes(self) -> int:
        """What a step's GEMMs read: the layers' and the head's 16-bit weights."""
        return 2 * (self.layers * self.layer_columns + self.head_columns) * self.hidden

    @property
    def device_bytes(self) -> int:
        """2-byte values: weights, activations, one GEMM's product, and the attention's queries, its
        output (as large) and the keys and values."""
        product = self.max_rows * max(self.layer_columns, self.head_columns)
        queries = self.layers * self.heads * self.max_chunk_tokens * self.head_dim
        keys = self.layers * self.heads * self.max_context_tokens * self.head_dim
        return self.weight_bytes + 2 * (self.max_rows * self.hidden + product + 2 * queries + 2 * keys)


class StepProbe:
    """Runs and times each iteration of one replay on `arena` (a TorchArena) for `model`: its
    decodes, and the prompt chunks beside them (module docstring).

    `reader`: "auto" reads the KV with the Triton run reader where there is one (CUDA), else with
    embedding_bag; "embedding_bag" always with embedding_bag. `shape`: StepShape.of(model, ...).

    Invariant: `modelled_ps[j]`, `measured_s[j]`, `batch[j]` (decodes), `chunk_tokens[j]` (prompt
    tokens computed beside them), `kv_bytes[j]` (KV bytes its decodes read, every layer) and, on
    CUDA, `device_mallocs[j]` describe the same iteration j; the arena's bytes are zeroed once (no
    denormals, pages touched) and only read afterwards, apart from the allocator's migration copies.
    """

    def __init__(self, arena, model: ModelProfile, block_tokens: int | None, shape: StepShape,
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
            sizes = {d: dataclasses.replace(model, kv_dtype=d).kv_bytes_per_token_layer for d in KV_DTYPE_BITS}
            whole = [d for d, size in sizes.items() if size == int(size) and int(size) % 4 == 0]
            raise ConfigError(f"on-device replay reads KV as 4-byte words; {model.kv_dtype} KV has "
                              f"{per_layer:g} bytes per token and layer for {model.name}",
                              hint=f"use --kv-dtype {', '.join(whole[:-1]) + ' or ' if whole[:-1] else ''}{whole[-1]}, "
                                   "which give this model whole words"
                              if whole else "no KV dtype gives this model whole 4-byte words per token and layer")
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
        self.shape = shape
        dtype = torch.bfloat16 if compute_dtype == "bf16" else torch.float16
        gen = torch.Generator(device=self.dev).manual_seed(0)

        def uniform(*size, bound=0.05):
            return torch.empty(*size, dtype=dtype, device=self.dev).uniform_(-bound, bound, generator=gen)

        sh = shape
        self.layer_weights = uniform(sh.layers, sh.layer_columns, sh.hidden)
        self.head_weights = uniform(sh.head_columns, sh.hidden)
        self.activations = uniform(sh.max_rows, sh.hidden, bound=1.0)
        self.product = torch.empty(sh.max_rows * max(sh.layer_columns, sh.head_columns), dtype=dtype, device=self.dev)
        self.queries = uniform(sh.layers, sh.heads, sh.max_chunk_tokens, sh.head_dim, bound=1.0)
        self.keys = uniform(sh.layers, sh.heads, sh.max_context_tokens, sh.head_dim, bound=1.0)
        self.values = uniform(sh.layers, sh.heads, sh.max_context_tokens, sh.head_dim, bound=1.0)
        self.compute_dtype = compute_dtype
        self.weight_bytes = sh.weight_bytes
        self.modelled_ps: list[int] = []
        self.measured_s: list[float] = []
        self.batch: list[int] = []
        self.chunk_tokens: list[int] = []
        self.kv_bytes: list[int] = []
        self.device_mallocs: list[int] = []  # CUDA: segments torch's caching allocator took from the driver in the step

    # ------------------------------------------------------------------------------ runs

    def _runs(self, allocations: list, kv_tokens: list[int],
              lead_blocks: list | None = None) -> list[tuple[np.ndarray, np.ndarray, int]]:
        """The KV the batch reads, as groups of (start words, length words, row words): runs of
        4-byte words into the arena; each group's starts and lengths are multiples of its row width
        (the unit embedding_bag reads them in). `lead_blocks`: per request, the paged blocks of the
        cached prefix it shares, which lead its KV (allocator/prefix.PrefixCache.hit_blocks)."""
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
        ids = [a.block_ids for a in allocations] if lead_blocks is None else \
            [lead + a.block_ids if lead else a.block_ids for a, lead in zip(allocations, lead_blocks)]
        blocks = np.fromiter(chain.from_iterable(b[:f] for b, f in zip(ids, full)), np.int64, int(sum(full)))
        full_starts = ((blocks[:, None] * L + np.arange(L, dtype=np.int64)) * layer_words).ravel()
        groups = [(full_starts, np.full(full_starts.size, layer_words, dtype=np.int64), layer_words)]
        tails = [(b[f], r) for b, f, r in zip(ids, full, rest.tolist()) if r]
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

    def step(self, allocations: list, kv_tokens: list[int], modelled_ps: int, chunks=(),
             lead_blocks: list | None = None) -> float:
        """Run one iteration on the device: the decodes of `allocations`, holding `kv_tokens` each
        (a shared cached prefix's `lead_blocks` first, see `_runs`), beside prompt `chunks`, (tokens
        computed before, new tokens) pairs (none: a decode step; no decodes: a prefill iteration);
        returns its measured seconds."""
        torch = self.torch
        sdpa = torch.nn.functional.scaled_dot_product_attention
        n, sh = len(allocations), self.shape
        chunk_tokens = sum(c for _, c in chunks)
        rows, head_rows = n + chunk_tokens, n + len(chunks)
        if rows > sh.max_rows or any(c > sh.max_chunk_tokens or x + c > sh.max_context_tokens for x, c in chunks):
            raise ValueError(f"a step of {n} decodes and chunks {list(chunks)} exceeds the probe's {sh}")
        groups = self._runs(allocations, kv_tokens, lead_blocks) if n else []
        x_rows, head_x = self.activations[:rows], self.activations[:head_rows]
        layer_out = self.product[: rows * sh.layer_columns].view(rows, sh.layer_columns)
        head_out = self.product[: head_rows * sh.head_columns].view(head_rows, sh.head_columns)
        if self.kernel is not None:
            tiles = self._tile_reads(groups) if groups else None

            def read_kv() -> None:
                if tiles is not None:
                    self.kernel(self.words, *tiles, self.align_words)
        else:
            bags = self._bag_reads(groups) if groups else []

            def read_kv() -> None:
                for rows_view, idx, offsets in bags:
                    torch.nn.functional.embedding_bag(idx, rows_view, offsets, mode="sum")

        def run() -> None:
            for layer in self.layer_weights:
                torch.matmul(x_rows, layer.T, out=layer_out)
            torch.matmul(head_x, self.head_weights.T, out=head_out)
            read_kv()
            for x, c in chunks:
                q = self.queries[:, :, :c]
                if x:
                    sdpa(q, self.keys[:, :, :x], self.values[:, :, :x])
                sdpa(q, self.keys[:, :, x:x + c], self.values[:, :, x:x + c], is_causal=True)

        device = None if self.kind == "cpu" else device_backend(self.kind)
        if not self.measured_s:
            run()  # untimed: the first launch compiles the Triton reader and picks cuBLAS kernels (0.7 s on an H100)
        if device is not None:
            device.synchronize()
        if self.kind == "cuda":
            segments = torch.cuda.memory_stats().get("segment.all.allocated", 0)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
            self.device_mallocs.append(torch.cuda.memory_stats().get("segment.all.allocated", 0) - segments)
        else:
            t0 = time.perf_counter()
            run()
            if device is not None:
                device.synchronize()
            seconds = time.perf_counter() - t0
        self.modelled_ps.append(modelled_ps)
        self.measured_s.append(seconds)
        self.batch.append(n)
        self.chunk_tokens.append(chunk_tokens)
        self.kv_bytes.append(sum(kv_tokens) * self.bpt)
        return seconds

    # ------------------------------------------------------------------------------ report

    def summary(self, profile: DeviceProfile, model: ModelProfile, full_model: ModelProfile, scale: float,
                points: int = 256) -> dict:
        """Measured against modelled step time, over every iteration and over the decode-only ones:
        totals, per-step relative error; the least-squares terms of the decode-only steps; a sampled
        series."""
        torch = import_whole("torch")  # never interrupted half-way (core/stops.py)

        modelled = np.asarray(self.modelled_ps, dtype=np.float64) / 1e12
        measured = np.asarray(self.measured_s, dtype=np.float64)
        batch, kv_bytes = np.asarray(self.batch, dtype=np.float64), np.asarray(self.kv_bytes, dtype=np.float64)
        chunked = np.asarray(self.chunk_tokens, dtype=np.int64) > 0
        decode_only, mixed = ~chunked & (batch > 0), chunked & (batch > 0)
        stride = max(1, -(-modelled.size // points))

        def compare(mask: np.ndarray) -> dict:
            m, t = modelled[mask], measured[mask]
            error = t / np.maximum(m, 1e-30) - 1.0

            def pct(values: np.ndarray, q: float) -> float:
                return float(np.percentile(values, q)) if values.size else 0.0

            return {"steps": int(m.size), "modelled_s": float(m.sum()), "measured_s": float(t.sum()),
                    "total_error": float(t.sum() / m.sum() - 1.0) if m.sum() > 0 else 0.0,
                    "step_error_p50": pct(error, 50), "step_abs_error_p50": pct(np.abs(error), 50),
                    "step_abs_error_p90": pct(np.abs(error), 90)}

        return {
            "torch_device": str(self.dev), "device_name": device_name(self.kind), "torch": torch.__version__,
            "profile": profile.name, "model": model.name,
            # a measured profile of another machine: the modelled side describes that one
            "profile_measured_on": profile.measurement.get("device") if profile.measured and profile.measurement else None,
            "scale": scale, "layers": model.num_layers, "layers_full": full_model.num_layers,
            "weight_bytes_read_per_step": self.weight_bytes, "compute_dtype": self.compute_dtype,
            "kv_reader": "triton runs" if self.kernel is not None else "embedding_bag",
            # iterations by kind: decodes alone, decodes beside prompt chunks (vLLM v1), prompts alone
            "decode_steps": int(decode_only.sum()), "mixed_steps": int(mixed.sum()),
            "prefill_steps": int((batch == 0).sum()),
            # CUDA: steps in which torch's caching allocator took new memory from the driver (cudaMalloc)
            "steps_with_device_malloc": int(np.count_nonzero(self.device_mallocs)) if self.device_mallocs else None,
            "all_steps": compare(np.ones(modelled.size, dtype=bool)),
            "decode_only": compare(decode_only),
            "mixed_only": compare(mixed),
            # the same least squares on both sides, over the decode-only steps: the terms the model misjudges
            "measured_fit": step_time_fit(measured[decode_only], batch[decode_only], kv_bytes[decode_only]),
            "modelled_fit": step_time_fit(modelled[decode_only], batch[decode_only], kv_bytes[decode_only]),
            "series": {"step": list(range(0, modelled.size, stride)),
                       "modelled_s": modelled[::stride].tolist(), "measured_s": measured[::stride].tolist(),
                       "batch": self.batch[::stride], "chunk_tokens": self.chunk_tokens[::stride],
                       "kv_bytes": self.kv_bytes[::stride],
                       "device_mallocs": self.device_mallocs[::stride] if self.device_mallocs else None},
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
