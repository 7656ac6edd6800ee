"""Device and model profiles: DeviceProfile from a TOML file, ModelProfile from a Hugging Face config.json.

Device files live in `profiles/devices/` (measured ones in `profiles/devices/measured/`), models in
`profiles/models/<name>/config.json`; either can also be given as a path. Every device figure is a
`{ value = "...", source = "..." }` pair with its unit in the value; see profiles/README.md.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from odmactl.core.errors import ProfileError, did_you_mean
from odmactl.core.tomltable import TomlTable, load_toml
from odmactl.rules.engines import DEFAULT_ENGINE, ENGINES

DEVICE_FORMAT = "odmactl-device/1"
MEMORY_TYPES = ("LPDDR4X", "LPDDR5", "LPDDR5X", "HBM2", "HBM2e", "HBM3", "HBM3e",
                "DDR4", "DDR5", "GDDR6", "GDDR6X", "unknown")

# KV precision: bits per stored value. Oaken (ISCA'25, seeds/002 §4.4-4.5): every value is 4 bits in
# the dense matrix and the 10% outliers (4% outer + 6% inner groups) add one 8-bit COO entry each,
# 4 + 0.1 * 8 = 4.8 bits; each per-token K or V vector also carries min and max for its three
# groups, 3 * 2 * 16 = 96 bits. That reproduces the paper's Table 2: 4.82 bits for Llama2-7B/13B
# (vectors of 4096/5120 values) and 4.89 for Llama2-70B (1024 values, GQA).
KV_DTYPE_BITS = {"fp16": 16.0, "bf16": 16.0, "fp8": 8.0, "int8": 8.0, "int4": 4.0, "oaken": 4.8}
OAKEN_SCALE_BITS_PER_VECTOR = 96
VLLM_KV_CACHE_DTYPES = {"auto": "fp16 or bf16 (the model's dtype)", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8"}
"""vLLM's --kv-cache-dtype names that are not odmactl's, and what they are here (8 or 16 bits a value)."""


def kv_dtype_problem(value: str) -> str | None:
    """Why `value` names no KV precision odmactl models, with the close names (or what vLLM's name
    is here); None when it names one. What --kv-dtype and a config's kv_dtype say."""
    if value in KV_DTYPE_BITS:
        return None
    near = (f"vLLM's {value} is {VLLM_KV_CACHE_DTYPES[value]} here" if value in VLLM_KV_CACHE_DTYPES
            else did_you_mean(value, KV_DTYPE_BITS))
    return (f"{value!r} is not a KV precision odmactl models; expected one of {', '.join(KV_DTYPE_BITS)}"
            + (f" ({near})" if near else ""))
WEIGHT_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "mixtral", "qwen2", "qwen3")


def profiles_dir() -> Path:
    """$ODMACTL_PROFILES, else the shipped profiles: inside an installed wheel they are the data
    package odmactl/_profiles; in a source checkout (editable install) the top-level profiles/."""
    env = os.environ.get("ODMACTL_PROFILES")
    if env:
        if not (Path(env) / "devices").is_dir() or not (Path(env) / "models").is_dir():
            raise ProfileError("expected a profiles directory holding devices/ and models/ (like the shipped "
                               "profiles/)", file=f"$ODMACTL_PROFILES={env}", hint="unset it to use the shipped ones")
        return Path(env)
    package = Path(__file__).resolve().parents[1]  # odmactl/
    packaged = package / "_profiles"
    return packaged if packaged.is_dir() else package.parent / "profiles"


# ---------------------------------------------------------------------------------------- devices

@dataclass(frozen=True)
class BandwidthTable:
    """Share of peak bandwidth reached reading contiguous runs of `chunk_bytes` at scattered offsets.

    Invariant: `chunk_bytes` strictly increasing and >= 1, every efficiency in (0, 1]. `eff(c)` is
    linear in log2(c) between entries; below the smallest run the throughput shrinks with the run
    (a fixed cost per access dominates), and at or beyond the largest run it stays at that run's
    value. `sequential_efficiency` is one unbroken stream (weights, migration copies). Where the
    figures come from is in DeviceProfile.sources ("bandwidth.scattered", "bandwidth.sequential").
    """

    chunk_bytes: tuple[int, ...]
    efficiency: tuple[float, ...]
    sequential_efficiency: float

    def eff(self, chunk_bytes: float | np.ndarray) -> np.ndarray:
        c = np.maximum(np.asarray(chunk_bytes, dtype=np.float64), 1e-9)
        sizes = np.log2(np.asarray(self.chunk_bytes, dtype=np.float64))
        values = np.asarray(self.efficiency, dtype=np.float64)
        inside = np.interp(np.log2(c), sizes, values)
        below = values[0] * c / self.chunk_bytes[0]
        return np.where(c < self.chunk_bytes[0], below, inside)


@dataclass(frozen=True)
class Interconnect:
    """The link between the devices of one tensor-parallel group, as a ring all-reduce sees it.

    Invariant: `bandwidth_bytes_per_s` (one direction of one device's link) > 0, latencies >= 0.
    A ring all-reduce of S bytes over N devices takes 2 (N - 1) steps, each sending S / N bytes:
    base_latency_s + 2 (N - 1) * step_latency_s + 2 (N - 1) / N * S / bandwidth_bytes_per_s (the
    formula NCCL's tuning model uses for its ring algorithm; sources in DeviceProfile.sources).
    """

    kind: str
    bandwidth_bytes_per_s: float
    step_latency_s: float
    base_latency_s: float

    def allreduce_latency_s(self, ranks: int) -> float:
        """The size-independent part of one all-reduce over `ranks` devices."""
        return self.base_latency_s + 2 * (ranks - 1) * self.step_latency_s

    def allreduce_s_per_byte(self, ranks: int) -> float:
        """Seconds each all-reduced byte adds."""
        return 2 * (ranks - 1) / ranks / self.bandwidth_bytes_per_s

    def allreduce_s(self, num_bytes: float, ranks: int) -> float:
        """One ring all-reduce of `num_bytes` over `ranks` devices (0 on one device)."""
        if ranks == 1:
            return 0.0
        return self.allreduce_latency_s(ranks) + self.allreduce_s_per_byte(ranks) * num_bytes


@dataclass(frozen=True)
class HostLink:
    """The link between a device and its host's memory (PCIe), one direction: what moves KV to a
    host buffer and back (eLLM's offload) and LoRA adapters from the host tier (ADR-006).

    Invariant: `bandwidth_bytes_per_s` > 0; `kind` names the generation and width."""

    kind: str
    bandwidth_bytes_per_s: float


def gemm_efficiency(tokens: tuple[float, ...], efficiency: tuple[float, ...], m: float) -> float:
    """The GEMM efficiency at m tokens: linear in m between the table's entries, flat outside. The
    one form of it (the replay's compiled prefill clock does these float operations in this order)."""
    if m <= tokens[0]:
        return efficiency[0]
    for i in range(1, len(tokens)):
        if m <= tokens[i]:
            return efficiency[i - 1] + (efficiency[i] - efficiency[i - 1]) * ((m - tokens[i - 1]) / (tokens[i] - tokens[i - 1]))
    return efficiency[-1]


@dataclass(frozen=True)
class Kernels:
    """What the device's kernels reach, beside the memory and compute peaks: the [kernels] table of
    a device profile (profiles/README.md, "Kernels", has the derivation and the formulas of
    hw/cost.py that use it).

    - `gemm_tokens` / `gemm_efficiency`: the share of the roofline, max(weight bytes / peak
      bandwidth, flops / peak flops), that a linear layer's GEMM reaches at m tokens (the batch of
      a decode step, the prompt tokens of a prefill); linear in m between entries, flat outside.
    - decode attention, per layer: `decode_layer_fixed_s` once per step, `decode_per_request_s` per
      running request, and the KV read: `decode_kv_efficiency`, when given, is the share of peak
      bandwidth the engine's paged attention kernel reaches reading its 16-token per-head runs of
      KV_ANCHOR_RUN_BYTES; the scattered-read table is scaled to meet it there (None: the table as
      it is).
    - prefill attention, per layer: `prefill_layer_fixed_s` per prefill, `prefill_per_token_s` per
      prompt token, and the causal QK^T and AV flops at `prefill_attention_efficiency` of peak.
    - elementwise kernels (norms, residual adds, the gated activation), per layer:
      `elementwise_layer_fixed_s` per iteration and `elementwise_per_token_s` per token.

    Invariant: `gemm_tokens` strictly increasing whole numbers >= 1, efficiencies in
    (MIN_EFFICIENCY, 1], times from 0 to 1 ms. A profile without [kernels] gets
    `Kernels.flat(sequential_efficiency)`: every GEMM and the
    prefill attention at the sequential share, no fixed costs, the KV table unscaled. A [kernels]
    table with its gemm rows alone (what `odmactl calibrate` measures) gets those rows and the flat
    figures for the rest.
    """

    gemm_tokens: tuple[int, ...]
    gemm_efficiency: tuple[float, ...]
    decode_kv_efficiency: float | None
    decode_layer_fixed_s: float
    decode_per_request_s: float
    prefill_attention_efficiency: float
    prefill_layer_fixed_s: float
    prefill_per_token_s: float
    elementwise_layer_fixed_s: float
    elementwise_per_token_s: float

    @classmethod
    def flat(cls, efficiency: float) -> Kernels:
        return cls((1,), (efficiency,), None, 0.0, 0.0, efficiency, 0.0, 0.0, 0.0, 0.0)

    def gemm_eff(self, tokens: float) -> float:
        return gemm_efficiency(tuple(float(t) for t in self.gemm_tokens), self.gemm_efficiency, float(tokens))


KV_ANCHOR_RUN_BYTES = 4096  # 16 tokens x 128 dims x 2 B: one KV head's run in a 16-token paged block
MIN_EFFICIENCY = 0.01  # a kernel at 1% of its roofline is a broken figure, not a slow device


@dataclass(frozen=True)
class DeviceProfile:
    """One accelerator (or host) as the cost model sees it.

    Invariant: capacity, bandwidth and compute are positive; `memory_fraction` in (0, 1];
    `activation_reserve_bytes` is below the usable memory. `sources` maps each figure's key to the
    datasheet, paper or measurement it came from.
    """

    name: str
    description: str
    path: Path
    measured: bool
    memory_type: str
    capacity_bytes: float
    peak_bandwidth_bytes_per_s: float
    peak_fp16_flops: float
    peak_bf16_flops: float | None
    memory_fraction: float
    activation_reserve_bytes: float
    step_overhead_s: float
    bandwidth: BandwidthTable
    sources: Mapping[str, str]
    measurement: Mapping[str, object] | None = None
    calibration: Mapping[str, object] | None = None
    interconnect: Interconnect | None = None  # None: the profile knows no link, so tp is 1
    kernels: Kernels | None = None  # None: no [kernels] table; see `kernel_figures`
    host_link: HostLink | None = None  # None: the profile knows no host link (a host is its own memory)
    engine: str = DEFAULT_ENGINE  # the serving engine this device runs by default ([engine] default, rules/engines.py)

    @property
    def kernel_figures(self) -> Kernels:
        """The [kernels] table, or without one the flat figures (Kernels.flat)."""
        return self.kernels or Kernels.flat(self.bandwidth.sequential_efficiency)

    def interconnect_for(self, tp: int) -> Interconnect | None:
        """The link a tensor-parallel group of `tp` of these devices uses (None for tp 1)."""
        if tp == 1:
            return None
        if self.interconnect is None:
            raise ProfileError(f"tensor parallelism over {tp} devices needs the device's interconnect, and this "
                               "profile has no [interconnect] table", file=self.path,
                               hint="add [interconnect] (kind, bandwidth, step_latency, base_latency) or use --tp 1")
        return self.interconnect

    @property
    def sequential_bandwidth_bytes_per_s(self) -> float:
        return self.peak_bandwidth_bytes_per_s * self.bandwidth.sequential_efficiency

    @property
    def usable_bytes(self) -> float:
        return self.capacity_bytes * self.memory_fraction

    def kv_pool_bytes(self, model: ModelProfile, tp: int = 1) -> int:
        """capacity * memory_fraction - weights - activation reserve, 0 when the model does not fit;
        with `model` one shard of a tensor-parallel group, that much on each of its `tp` devices."""
        return max(0, int(self.usable_bytes - model.weight_bytes - self.activation_reserve_bytes)) * tp

    def peak_flops(self, dtype: str = "fp16") -> float:
        if dtype == "bf16" and self.peak_bf16_flops is not None:
            return self.peak_bf16_flops
        return self.peak_fp16_flops

    @property
    def compute_dtype(self) -> str:
        """The 16-bit format the device computes faster by its profile (`faster_16bit`)."""
        return faster_16bit(self.peak_fp16_flops, self.peak_bf16_flops)


def faster_16bit(fp16_flops: float, bf16_flops: float | None) -> str:
    """The 16-bit format a device computes faster at these rates: fp16 unless bf16 is faster (None:
    no bf16 kernel)."""
    return "bf16" if bf16_flops is not None and bf16_flops > fp16_flops else "fp16"


def _figure(table: TomlTable, name: str, kind: str | None, sources: dict[str, str], required: bool = True,
            high: float = math.inf, allow_zero: bool = False) -> float | str | None:
    """A `{ value, source }` pair; `kind` is a unit kind, None for a plain number in (0, high],
    "text" for a string. A quantity must be positive (or zero, with `allow_zero`)."""
    pair = table.table(name, required)
    if pair is None:
        return None
    sources[pair.prefix] = pair.string("source")
    if kind == "text":
        value = pair.string("value")
    elif kind is None:
        value = pair.number("value", 0.0, high)
    else:
        value = pair.quantity("value", kind)
        if value < 0 or (value == 0 and not allow_zero):
            limit = "must not be negative" if allow_zero else "must be positive"
            raise pair.error("value", f"impossible value {pair.raw('value')!r}: {limit}")
    pair.finish()
    return value


def _bandwidth(table: TomlTable, sources: dict[str, str]) -> BandwidthTable:
    sources[table.key("scattered")] = table.string("source")
    sequential = table.table("sequential")
    seq_eff = sequential.number("efficiency", 0.0, 1.0)
    sources[sequential.prefix] = sequential.string("source")
    sequential.finish()
    rows = table.raw("scattered")
    if not isinstance(rows, list) or not rows:
        raise table.error("scattered", "expected a non-empty array of { chunk, efficiency } tables")
    chunks, effs = [], []
    for i, row in enumerate(rows):
        entry = TomlTable(row, table.file, f"{table.key('scattered')}[{i}]", ProfileError)
        chunk = entry.quantity("chunk", "bytes")
        if chunk < 1 or chunk != int(chunk) or (chunks and chunk <= chunks[-1]):
            raise entry.error("chunk", "expected whole byte counts >= 1, strictly increasing down the table")
        chunks.append(int(chunk))
        effs.append(entry.number("efficiency", 0.0, 1.0))
        if entry.raw("source", required=False) is not None:
            sources[entry.key("source")] = entry.string("source")
        entry.finish()
    table.finish()
    return BandwidthTable(tuple(chunks), tuple(effs), seq_eff)


def _interconnect(table: TomlTable | None, sources: dict[str, str]) -> Interconnect | None:
    if table is None:
        return None
    kind = _figure(table, "kind", "text", sources)
    bandwidth = _figure(table, "bandwidth", "bandwidth", sources)
    step = _figure(table, "step_latency", "seconds", sources, allow_zero=True)
    base = _figure(table, "base_latency", "seconds", sources, allow_zero=True)
    for key, value in (("step_latency", step), ("base_latency", base)):
        if value > 1e-3:  # links take microseconds; a millisecond per step is already a broken network
            raise table.error(key, f"impossible value: {value:g} s; an all-reduce step takes microseconds (at most 1 ms)")
    table.finish()
    return Interconnect(kind, bandwidth, step, base)


MIN_HOST_LINK_BYTES_PER_S = 2.5e8  # PCIe 1.0 x1 moves 0.25 GB/s each way: no host link is slower
MAX_HOST_LINK_BYTES_PER_S = 1e12  # PCIe 6.0 x16 moves 121 GB/s each way: past a TB/s is a typo


def _host_link(table: TomlTable | None, sources: dict[str, str]) -> HostLink | None:
    if table is None:
        return None
    kind = _figure(table, "kind", "text", sources)
    bandwidth = _figure(table, "bandwidth", "bandwidth", sources)
    if not MIN_HOST_LINK_BYTES_PER_S <= bandwidth <= MAX_HOST_LINK_BYTES_PER_S:
        raise table.error("bandwidth", f"impossible value: {bandwidth:.4g} B/s; a host link moves from "
                          f"{MIN_HOST_LINK_BYTES_PER_S / 1e9:g} GB/s (PCIe 1.0 x1) to at most "
                          f"{MAX_HOST_LINK_BYTES_PER_S / 1e12:g} TB/s each way (PCIe 6.0 x16 moves 121 GB/s)")
    table.finish()
    return HostLink(kind, bandwidth)


def _engine(table: TomlTable | None, sources: dict[str, str]) -> str:
    """[engine] default: the engine version the device serves with (rules/engines.py), with its source."""
    if table is None:
        return DEFAULT_ENGINE
    name = _figure(table, "default", "text", sources)
    if name not in ENGINES:
        raise table.error("default", f"expected one of {', '.join(ENGINES)}, got {name!r}")
    table.finish()
    return name


def _kernel_time(table: TomlTable, name: str) -> float:
    value = table.quantity(name, "seconds")
    if value < 0 or value > 1e-3:  # a kernel's fixed or per-token cost takes microseconds at most
        raise table.error(name, f"impossible value {table.raw(name)!r}: expected 0 to 1 ms")
    return value


def _kernels(table: TomlTable | None, sources: dict[str, str], sequential_efficiency: float) -> Kernels | None:
    if table is None:
        return None
    sources[table.prefix] = table.string("source")
    rows = table.raw("gemm")
    if not isinstance(rows, list) or not rows:
        raise table.error("gemm", "expected a non-empty array of { tokens, efficiency } tables")
    tokens, effs = [], []
    for i, row in enumerate(rows):
        entry = TomlTable(row, table.file, f"{table.key('gemm')}[{i}]", ProfileError)
        m = entry.raw("tokens")
        if isinstance(m, bool) or not isinstance(m, int) or m < 1 or (tokens and m <= tokens[-1]):
            raise entry.error("tokens", "expected whole token counts >= 1, strictly increasing down the table")
        tokens.append(m)
        effs.append(entry.number("efficiency", MIN_EFFICIENCY, 1.0))
        entry.finish()
    names = ("decode_attention", "prefill_attention", "elementwise")
    subs = [table.table(name, required=False) for name in names]
    if all(sub is None for sub in subs):  # a GEMM table alone (odmactl calibrate): the rest flat, as without [kernels]
        flat = Kernels.flat(sequential_efficiency)
        table.finish()
        return replace(flat, gemm_tokens=tuple(tokens), gemm_efficiency=tuple(effs))
    for name, sub in zip(names, subs):
        if sub is None:
            raise table.error(name, "expected a table: give decode_attention, prefill_attention and elementwise "
                                    "together, or none of them (the gemm table alone)")
    decode, prefill, elementwise = subs
    kv_eff = decode.number("kv_efficiency", MIN_EFFICIENCY, 1.0, required=False)
    figures = Kernels(
        gemm_tokens=tuple(tokens), gemm_efficiency=tuple(effs), decode_kv_efficiency=kv_eff,
        decode_layer_fixed_s=_kernel_time(decode, "layer_fixed"),
        decode_per_request_s=_kernel_time(decode, "per_request"),
        prefill_attention_efficiency=prefill.number("efficiency", MIN_EFFICIENCY, 1.0),
        prefill_layer_fixed_s=_kernel_time(prefill, "layer_fixed"),
        prefill_per_token_s=_kernel_time(prefill, "per_token"),
        elementwise_layer_fixed_s=_kernel_time(elementwise, "layer_fixed"),
        elementwise_per_token_s=_kernel_time(elementwise, "per_token"))
    for sub in (decode, prefill, elementwise, table):
        sub.finish()
    return figures


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ProfileError(f"cannot read: {exc.strerror or exc}", file=path) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProfileError(f"not valid JSON: {exc}", file=path) from None


def read_device(path: Path) -> DeviceProfile:
    """Parse and check one device TOML; every problem is a ProfileError naming the file and key."""
    path = Path(path)
    return parse_device(load_toml(path, ProfileError), path)


def parse_device(data: dict, path: Path) -> DeviceProfile:
    """A device profile from a parsed TOML document that came from (or is going to) `path`."""
    top = TomlTable(data, path, "", ProfileError)
    fmt = top.string("format")
    if fmt != DEVICE_FORMAT:
        raise top.error("format", f"expected '{DEVICE_FORMAT}', got {fmt!r}")
    sources: dict[str, str] = {}
    name = top.string("name")
    description = top.string("description", required=False) or name
    measured = top.raw("measured")
    if not isinstance(measured, bool):
        raise top.error("measured", f"expected true or false, got {measured!r}")
    memory, compute, budget = top.table("memory"), top.table("compute"), top.table("budget")
    memory_type = _figure(memory, "type", "text", sources)
    if memory_type not in MEMORY_TYPES:
        raise memory.error("type", f"expected one of {', '.join(MEMORY_TYPES)}, got {memory_type!r}")
    capacity = _figure(memory, "capacity", "bytes", sources)
    peak_bw = _figure(memory, "peak_bandwidth", "bandwidth", sources)
    memory.finish()
    fp16 = _figure(compute, "peak_fp16", "flops", sources)
    bf16 = _figure(compute, "peak_bf16", "flops", sources, required=False)
    overhead = _figure(compute, "step_overhead", "seconds", sources, required=False, allow_zero=True)
    compute.finish()
    fraction = _figure(budget, "memory_fraction", None, sources, high=1.0)
    reserve = _figure(budget, "activation_reserve", "bytes", sources, allow_zero=True)
    budget.finish()
    if reserve >= capacity * fraction:
        raise budget.error("activation_reserve", f"impossible value: {reserve:.4g} bytes is not below the usable "
                           f"memory (capacity * memory_fraction = {capacity * fraction:.4g} bytes)")
    bandwidth = _bandwidth(top.table("bandwidth"), sources)
    measurement = top.raw("measurement", required=measured)
    if measurement is not None and not isinstance(measurement, dict):
        raise top.error("measurement", "expected a table (date, device, torch, command)")
    if measured:
        for key in ("date", "device", "torch", "command"):
            if not isinstance(measurement.get(key), str):
                raise top.error(f"measurement.{key}", "missing: a measured profile records date, device, torch and command")
    calibration = _calibration(top.table("calibration", required=False))
    interconnect = _interconnect(top.table("interconnect", required=False), sources)
    kernels = _kernels(top.table("kernels", required=False), sources, bandwidth.sequential_efficiency)
    host_link = _host_link(top.table("host_link", required=False), sources)
    engine = _engine(top.table("engine", required=False), sources)
    top.finish()
    return DeviceProfile(name=name, description=description, path=path, measured=measured, memory_type=memory_type,
                         capacity_bytes=capacity, peak_bandwidth_bytes_per_s=peak_bw, peak_fp16_flops=fp16,
                         peak_bf16_flops=bf16, memory_fraction=fraction, activation_reserve_bytes=reserve,
                         step_overhead_s=overhead or 0.0, bandwidth=bandwidth, sources=sources,
                         measurement=measurement, calibration=calibration, interconnect=interconnect,
                         kernels=kernels, host_link=host_link, engine=engine)


def _calibration(table: TomlTable | None) -> dict | None:
    """[calibration]: calibrate's raw measurements, kept for the record (the cost model reads none
    of them), as written. Its [calibration.noise] record is checked, since `profiles show` and
    calibrate's warnings read it (device/calibrate.py `noise`): whole `timings` >= 1, spreads >= 0,
    and timing or run-length names as printable strings (the last two lists came later and may be
    missing)."""
    if table is None:
        return None
    noise = table.table("noise", required=False)
    if noise is not None:
        timings = noise.raw("timings")
        if isinstance(timings, bool) or not isinstance(timings, int) or timings < 1:
            raise noise.error("timings", f"expected a whole number >= 1, got {timings!r}")
        for key in ("widest_repeat_spread", "copy_rate_spread"):
            value = noise.raw(key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < math.inf:
                raise noise.error(key, f"expected a finite number >= 0, got {value!r}")
        widest = noise.raw("widest")
        if not isinstance(widest, str) or not widest.isprintable():
            raise noise.error("widest", f"expected the name of a timing (printable text), got {widest!r}")
        for key, required in (("noisy", True), ("efficiency_dips", False), ("gathers_past_copy", False)):
            names = noise.raw(key, required)
            if names is not None and (not isinstance(names, list)
                                      or not all(isinstance(n, str) and n.isprintable() for n in names)):
                raise noise.error(key, f"expected a list of names (printable text), got {names!r:.80}")
        if len(noise.data["noisy"]) > timings:
            raise noise.error("noisy", f"names {len(noise.data['noisy'])} timings of {timings}")
    return table.data


def device_paths() -> list[Path]:
    root = profiles_dir() / "devices"
    return sorted(root.glob("*.toml")) + sorted((root / "measured").glob("*.toml"))


def load_device(ref: str | Path) -> DeviceProfile:
    """A device by shipped name (its file's stem, any case, or a unique family of stems:
    `shipped_name`; or the profile's `name`, any case) or by path to a TOML file."""
    candidate = Path(ref)
    if candidate.suffix == ".toml" or candidate.exists():
        if not candidate.is_file():
            raise ProfileError("no such device profile file" if not candidate.exists() else
                               "is not a regular file (a directory, device, FIFO or socket), expected a device "
                               "profile TOML", file=candidate)
        return read_device(candidate)
    paths = {path.stem: path for path in device_paths()}
    stem = shipped_name(str(ref), list(paths), "device", required=False)
    if stem is not None:
        return read_device(paths[stem])
    wanted = str(ref).casefold()
    for path in paths.values():
        profile = read_device(path)
        if profile.name.casefold() == wanted:
            return profile
    shipped_name(str(ref), list(paths), "device", hint="or give a path to a device TOML")
    raise AssertionError("shipped_name raises for a name it does not find")


# ----------------------------------------------------------------------------------------- models

@dataclass(frozen=True)
class ModelProfile:
    """A decoder-only transformer's shape, from its config.json, and the KV precision it is served at.

    Invariant: all counts positive, `num_attention_heads` a multiple of `num_kv_heads`,
    `num_experts_per_token <= num_experts` (1 and 1 for dense models), `kv_dtype` a key of
    KV_DTYPE_BITS. Parameter counts are computed from the shapes (embeddings, attention, gated MLP
    or experts, norms, untied head).
    """

    name: str
    path: Path
    model_type: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_experts: int
    num_experts_per_token: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    max_position_embeddings: int | None
    weight_dtype: str
    kv_dtype: str = "fp16"
    tp: int = 1  # > 1: this is one device's shard of a model split over tp devices (`shard`)
    total_params: int = field(init=False)
    active_params: int = field(init=False)

    def __post_init__(self) -> None:
        if self.kv_dtype not in KV_DTYPE_BITS:
            raise ProfileError(f"unknown KV dtype '{self.kv_dtype}'", hint=f"one of {', '.join(KV_DTYPE_BITS)}")
        total, active = _count_params(self)
        object.__setattr__(self, "total_params", total)
        object.__setattr__(self, "active_params", active)

    @property
    def weight_bytes(self) -> int:
        return self.total_params * WEIGHT_DTYPE_BYTES[self.weight_dtype]

    @property
    def kv_values_per_token_layer(self) -> int:
        """K and V values one token stores in one layer."""
        return 2 * self.num_kv_heads * self.head_dim

    @property
    def kv_bytes_per_token_layer(self) -> float:
        """Average bytes per token per layer at `kv_dtype` (fractional for Oaken)."""
        bits = self.kv_values_per_token_layer * KV_DTYPE_BITS[self.kv_dtype]
        if self.kv_dtype == "oaken":
            bits += 2 * OAKEN_SCALE_BITS_PER_VECTOR  # one K and one V vector per token per layer
        return bits / 8

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes a token's KV occupies across all layers; rounded up to whole bytes for Oaken."""
        return int(math.ceil(self.kv_bytes_per_token_layer * self.num_layers - 1e-9))

    @property
    def head_params(self) -> int:
        """The output head's vocab x hidden matrix: what lm_head reads, tied to the embedding or not."""
        return self.vocab_size * self.hidden_size

    @property
    def layer_weight_bytes(self) -> int:
        """The weights a forward pass streams through its layers' GEMMs: everything but the embedding
        table (a step reads only its tokens' rows) and the head (its own GEMM)."""
        untied_head = 0 if self.tie_word_embeddings else self.head_params
        return (self.total_params - self.head_params - untied_head) * WEIGHT_DTYPE_BYTES[self.weight_dtype]

    @property
    def layer_active_params(self) -> int:
        """Parameters one token multiplies through in the layers (the experts it is routed to)."""
        untied_head = 0 if self.tie_word_embeddings else self.head_params
        return self.active_params - self.head_params - untied_head

    @property
    def weight_bytes_per_value(self) -> int:
        return WEIGHT_DTYPE_BYTES[self.weight_dtype]

    @property
    def kv_run_bytes_per_token(self) -> float:
        """Bytes one token adds to one KV head's K (or V) run in one layer: the run a kernel reads."""
        return self.kv_bytes_per_token_layer / (2 * self.num_kv_heads)

    def with_kv_dtype(self, kv_dtype: str) -> ModelProfile:
        return replace(self, kv_dtype=kv_dtype)

    @property
    def lora_bytes_per_rank(self) -> int:
        """A rank-1 LoRA adapter on the attention projections q, k, v and o (S-LoRA's targets), in
        16 bits: A (in x r) and B (r x out) for each, every layer. An adapter of rank r is r times
        this."""
        q = self.num_attention_heads * self.head_dim
        kv = self.num_kv_heads * self.head_dim
        h = self.hidden_size
        return self.num_layers * ((h + q) + 2 * (h + kv) + (q + h)) * 2

    def shard(self, tp: int) -> ModelProfile:
        """What one of `tp` tensor-parallel devices holds, split as vLLM splits it: the attention
        heads, the MLP's intermediate size and the vocabulary (embedding and head) over the `tp`
        devices; the KV heads too, or, when there are fewer KV heads than devices, one KV head per
        device (replicated, so the group stores each KV head tp / num_kv_heads times). Norms stay
        whole. `tp` must divide the attention heads and the intermediate size, and the KV heads
        must divide or be divided by it, as vLLM requires."""
        if tp == 1:
            return self
        heads, kv = self.num_attention_heads, self.num_kv_heads
        problems = []
        if heads % tp:
            problems.append(f"{tp} does not divide its {heads} attention heads")
        if kv % tp and tp % kv:
            problems.append(f"{tp} neither divides nor is a multiple of its {kv} KV heads")
        if self.intermediate_size % tp:
            problems.append(f"{tp} does not divide its intermediate_size {self.intermediate_size}")
        if problems:
            good = [n for n in range(1, heads + 1) if not heads % n and not (kv % n and n % kv)
                    and not self.intermediate_size % n]
            raise ProfileError(f"--tp {tp} cannot split {self.name}: " + "; ".join(problems),
                               file=self.path / "config.json" if self.path.is_dir() else self.path,
                               hint=f"--tp {', '.join(map(str, good))} can")
        return replace(self, num_attention_heads=heads // tp, num_kv_heads=max(1, kv // tp),
                       intermediate_size=self.intermediate_size // tp, vocab_size=-(-self.vocab_size // tp),
                       name=f"{self.name} (1/{tp} shard)", tp=tp)

    def scaled(self, scale: float) -> ModelProfile:
        """The model with round(scale * layers) layers, at least one (the parameter count and the
        KV per token follow): what an on-device replay runs when the whole model does not fit."""
        if scale >= 1.0:
            return self
        layers = max(1, round(self.num_layers * scale))
        return replace(self, num_layers=layers, name=f"{self.name} ({layers}/{self.num_layers} layers)")


def _count_params(m: ModelProfile) -> tuple[int, int]:
    q_out = m.num_attention_heads * m.head_dim
    kv_out = m.num_kv_heads * m.head_dim
    attention = m.hidden_size * q_out + 2 * m.hidden_size * kv_out + q_out * m.hidden_size
    if m.qkv_bias:
        attention += q_out + 2 * kv_out
    if m.qk_norm:
        attention += 2 * m.head_dim
    expert = 3 * m.hidden_size * m.intermediate_size  # gate, up, down
    router = m.hidden_size * m.num_experts if m.num_experts > 1 else 0
    norms = 2 * m.hidden_size
    embed = m.vocab_size * m.hidden_size
    head = 0 if m.tie_word_embeddings else embed
    per_layer_fixed = attention + router + norms
    total = m.num_layers * (per_layer_fixed + m.num_experts * expert) + embed + head + m.hidden_size
    active = m.num_layers * (per_layer_fixed + m.num_experts_per_token * expert) + embed + head + m.hidden_size
    return total, active


REQUIRED_CONFIG_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                        "intermediate_size", "vocab_size")


def _config_int(raw: Mapping, key: str, file: Path, default: int | None = None) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ProfileError(f"expected a positive integer, got {value!r}", file=file, key=key)
    return value


def read_model(model_dir: Path, name: str | None = None, kv_dtype: str = "fp16",
               weight_dtype: str | None = None) -> ModelProfile:
    """A ModelProfile from a local HF model directory's config.json (read as JSON, strictly: the keys
    that size the model are required and checked; transformers, which imports torch, is not used)."""
    model_dir = Path(model_dir)
    file = model_dir / "config.json"
    raw = _read_json(file)
    if not isinstance(raw, dict):
        raise ProfileError("expected a JSON object", file=file)
    for key in REQUIRED_CONFIG_KEYS:
        if key not in raw:
            raise ProfileError("missing (needed to size the model)", file=file, key=key)
    if raw["model_type"] not in SUPPORTED_MODEL_TYPES:
        raise ProfileError(f"model_type {raw['model_type']!r} is not one odmactl can size",
                           file=file, key="model_type", hint=f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    layers = _config_int(raw, "num_hidden_layers", file)
    hidden = _config_int(raw, "hidden_size", file)
    heads = _config_int(raw, "num_attention_heads", file)
    kv_heads = _config_int(raw, "num_key_value_heads", file, default=heads)
    if heads % kv_heads:
        raise ProfileError(f"num_attention_heads ({heads}) is not a multiple of num_key_value_heads ({kv_heads})",
                           file=file, key="num_key_value_heads")
    if raw.get("head_dim") is not None:  # absent or null: hidden_size / num_attention_heads, as transformers does
        head_dim = _config_int(raw, "head_dim", file)
    elif hidden % heads:
        raise ProfileError(f"hidden_size ({hidden}) is not a multiple of num_attention_heads ({heads})",
                           file=file, key="hidden_size")
    else:
        head_dim = hidden // heads
    experts = _config_int(raw, "num_local_experts", file, default=1)
    per_token = _config_int(raw, "num_experts_per_tok", file, default=1)
    if per_token > experts:
        raise ProfileError(f"num_experts_per_tok ({per_token}) exceeds num_local_experts ({experts})",
                           file=file, key="num_experts_per_tok")
    dtype = weight_dtype or str(raw.get("dtype") or raw.get("torch_dtype") or "bfloat16")
    dtype = dtype.removeprefix("torch.")
    if dtype not in WEIGHT_DTYPE_BYTES:
        raise ProfileError(f"unknown weight dtype {dtype!r}", file=file, key="torch_dtype",
                           hint=f"one of {', '.join(WEIGHT_DTYPE_BYTES)}")
    max_pos = raw.get("max_position_embeddings")
    if max_pos is not None:
        max_pos = _config_int(raw, "max_position_embeddings", file)
    for key in ("tie_word_embeddings", "attention_bias"):  # JSON true/false: "false" as text would read as True
        if raw.get(key) is not None and not isinstance(raw[key], bool):
            raise ProfileError(f"expected true or false, got {raw[key]!r}", file=file, key=key)
    return ModelProfile(
        name=name or model_dir.name, path=model_dir, model_type=raw["model_type"], num_layers=layers,
        hidden_size=hidden, num_attention_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        intermediate_size=_config_int(raw, "intermediate_size", file), vocab_size=_config_int(raw, "vocab_size", file),
        num_experts=experts, num_experts_per_token=per_token,
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        qkv_bias=raw["model_type"] == "qwen2" or bool(raw.get("attention_bias", False)),
        qk_norm=raw["model_type"] == "qwen3",
        max_position_embeddings=max_pos,
        weight_dtype=dtype, kv_dtype=kv_dtype)


def model_dirs() -> list[Path]:
    return sorted(p.parent for p in (profiles_dir() / "models").glob("*/config.json"))


def find_model_dir(ref: str | Path) -> Path | None:
    """The directory `ref` names: itself if it is one, else the shipped model it names
    (`shipped_name`: any case, or a unique family), else None; a family of several is an error."""
    candidate = Path(ref)
    if candidate.is_dir():
        return candidate
    dirs = {p.name: p for p in model_dirs()}
    name = shipped_name(str(ref), list(dirs), "model", required=False)
    return None if name is None else dirs[name]


def load_model(ref: str | Path, kv_dtype: str = "fp16", weight_dtype: str | None = None) -> ModelProfile:
    """A model by shipped name (any case) or by path to a local HF model directory."""
    model_dir = find_model_dir(ref)
    if model_dir is not None:
        if not (model_dir / "config.json").is_file():
            raise ProfileError("no config.json in this directory", file=model_dir)
        return read_model(model_dir, kv_dtype=kv_dtype, weight_dtype=weight_dtype)
    shipped_name(str(ref), [p.name for p in model_dirs()], "model", hint="or give a local HF model directory")
    raise AssertionError("shipped_name raises for a name it does not find")


# ---------------------------------------------------------------------------------------- names


def shipped_name(given: str, names: list[str], what: str, *, required: bool = True, hint: str = "") -> str | None:
    """The one of the shipped profile `names` that `given` names, read in this order:

    1. a name, in any case: `A100-80GB-SXM` is `a100-80gb-sxm`;
    2. a family: the leading dash-separated parts of exactly one name, in any case (`a100` and
       `A100-80GB` name `a100-80gb-sxm` while it is the only A100 profile; `mlu370` names
       `mlu370-x4` and `mlu370-x8`, and is refused naming both rather than guessed);
    3. nothing: an error that suggests the names close to `given` (core/errors.did_you_mean), or
       None when not `required` (the caller tries another reading first).

    Aliases are derived from the names present, never from a table: adding a second A100 profile
    makes `a100` a family of two, which is then refused with both named. `what` is "device" or
    "model", for the message; `hint` is added to the list of shipped names."""
    folded = given.casefold()
    exact = [n for n in names if n.casefold() == folded]
    if exact:
        return exact[0]
    family = [n for n in names if n.casefold().startswith(folded + "-")]
    if len(family) == 1:
        return family[0]
    if len(family) > 1:
        raise ProfileError(f"'{given}' could be any of the {what} profiles {', '.join(family)}",
                           hint="give one of them")
    if not required:
        return None
    near = did_you_mean(given, names)
    listed = f"shipped: {', '.join(names)}" + (f"; {hint}" if hint else "")
    raise ProfileError(f"unknown {what} '{given}'" + (f"; {near}" if near else ""), hint=listed)
