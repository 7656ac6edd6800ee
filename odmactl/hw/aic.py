"""Kernel figures for a device profile's [kernels] table, derived from NVIDIA aiconfigurator's measured
kernel databases (the optional extra `odmactl[aic]`, package aiconfigurator-core, read offline).

aiconfigurator-core ships per-GPU databases of kernel latencies collected on real engines (here:
vLLM 0.14.0 on A100-SXM, vLLM 0.24.0 on H100-SXM and H200-SXM) and an estimator that interpolates them for a model's
operations. `derive` asks that estimator for Llama-3.1-8B's operations (the same shapes as the
shipped Llama-3-8B) at a grid of batch sizes, contexts and prompt lengths and fits the figures of
profiles.Kernels to them (profiles/README.md, "Kernels", has the derivation):

- GEMM efficiency at m tokens: the layers' roofline (hw/cost.py, `Gemms.roofline_s` at efficiency
  1) over the measured time of their four GEMMs (QKV, output projection, gate/up, down), at decode
  batches m <= 256 and prompt lengths m > 256;
- decode attention per layer: least squares of layer_fixed + per_request * B + KV bytes / rate over
  batches 1-256 and contexts 512-8,192 (vLLM's FlashAttention kernel over its paged cache), the
  rate as a share of peak bandwidth;
- prefill attention per layer: layer_fixed + per_token * P + causal flops / (peak * efficiency)
  over prompts of 256-16,384 tokens;
- elementwise kernels per layer (the two fused add-RMSNorms and the SiLU gate): layer_fixed +
  per_token * tokens over decode batches and prompt lengths.
Each least-squares fit weighs points by 1 / measured time (relative errors) and keeps every
coefficient >= 0. `reference` gives the estimator's totals that acceptance compares the cost model
with (tests/test_kernels.py, docs/cost-model.md, "Step times against aiconfigurator").
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
from dataclasses import dataclass

import numpy as np

from odmactl.core.errors import ProfileError
from odmactl.hw.cost import CostModel, KvLayout
from odmactl.hw.profiles import MIN_EFFICIENCY, DeviceProfile, Kernels, ModelProfile

AIC_PACKAGE = "aiconfigurator-core"
AIC_BACKEND = "vllm"
AIC_VERSION = "current"  # the database version aiconfigurator maintains for the system (0.14.0 on A100, 0.24.0 on H100/H200)
AIC_MODEL = "meta-llama/Meta-Llama-3.1-8B"  # Llama-3-8B's shapes (profiles/models/Llama-3-8B)
MODEL = "Llama-3-8B"
SYSTEMS = {"A100-80GB-SXM": "a100_sxm", "H100-SXM": "h100_sxm", "H200": "h200_sxm"}  # profile name -> AIC system
GEMM_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
DECODE_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DECODE_CONTEXTS = (512, 1024, 2048, 4096, 8192)
PREFILL_TOKENS = (256, 512, 1024, 2048, 4096, 8192, 16384)
ELEMENTWISE_OPS = ("add_norm_1", "add_norm_2", "act_gate")
LAYER_GEMMS = ("qkv_gemm", "proj_gemm", "gate_ffn1_gemm", "ffn2_gemm")
MAX_DERIVED_EFFICIENCY = 1.05  # a measured kernel a little above the roofline is rounding; far above, wrong peaks
# the comparison acceptance asks for: decode at 1k context, prefill of one prompt
REFERENCE_BATCHES = (1, 8, 32, 128)
REFERENCE_CONTEXT = 1024
REFERENCE_PROMPTS = (1024, 4096)


def available() -> bool:
    try:
        import aiconfigurator_core  # noqa: F401
    except ImportError:
        return False
    return True


def system_of(device: DeviceProfile) -> str:
    system = SYSTEMS.get(device.name)
    if system is None:
        raise ProfileError(f"aiconfigurator has no database odmactl maps to device '{device.name}'",
                           hint=f"devices with one: {', '.join(SYSTEMS)}")
    return system


class Estimator:
    """aiconfigurator's vLLM estimator for Llama-3.1-8B on one system: per-operation milliseconds."""

    def __init__(self, system: str, version: str = AIC_VERSION) -> None:
        if not available():
            raise ProfileError(f"deriving kernel figures needs {AIC_PACKAGE}",
                               hint="pip install 'odmactl[aic]'; its databases are read offline")
        from aiconfigurator_core.sdk import config
        from aiconfigurator_core.sdk.backends.factory import get_backend
        from aiconfigurator_core.sdk.models import get_model
        from aiconfigurator_core.sdk.perf_database import get_database, get_version_slots

        self._config = config
        with _quiet():
            self._db = get_database(system, AIC_BACKEND, version)
            if self._db is None:
                raise ProfileError(f"{AIC_PACKAGE} has no {AIC_BACKEND} {version} database for '{system}'")
            self._model = get_model(AIC_MODEL, config.ModelConfig(tp_size=1), AIC_BACKEND)
            self._backend = get_backend(AIC_BACKEND)
        slots = get_version_slots(system, AIC_BACKEND) or {}
        self.system, self.version = system, slots.get(version, version)

    def decode(self, batch: int, context: int) -> dict[str, float]:
        """One decode step of `batch` requests at `context` tokens: operation -> ms."""
        runtime = self._config.RuntimeConfig(batch_size=batch, isl=context, osl=2)
        with _quiet():
            ops = self._backend._run_static_breakdown(self._model, self._db, runtime, "static_gen", stride=1)[2]
        return {k.removeprefix("generation_"): v for k, v in ops.items()}

    def prefill(self, prompt_tokens: int, prompts: int = 1) -> dict[str, float]:
        """One prefill of `prompts` prompts of `prompt_tokens` tokens each: operation -> ms."""
        runtime = self._config.RuntimeConfig(batch_size=prompts, isl=prompt_tokens, osl=1)
        with _quiet():
            ops = self._backend._run_static_breakdown(self._model, self._db, runtime, "static_ctx")[0]
        return {k.removeprefix("context_"): v for k, v in ops.items()}


@contextlib.contextmanager
def _quiet():
    """aiconfigurator logs and prints while it loads; odmactl's output stays its own."""
    level = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logging.disable(level)


def _nonnegative_fit(columns: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares of y ~ columns @ x weighted by 1 / y, every coefficient >= 0 (a negative one is
    dropped and the rest refitted: at most a few columns, so by elimination)."""
    weights = 1.0 / y
    active = list(range(columns.shape[1]))
    while True:
        x = np.zeros(columns.shape[1])
        sol, *_ = np.linalg.lstsq(columns[:, active] * weights[:, None], y * weights, rcond=None)
        x[active] = sol
        if (sol >= 0).all():
            return x
        active.pop(int(np.argmin(sol)))


@dataclass(frozen=True)
class Derivation:
    """The kernel figures and how well each fit reproduces its points (largest relative error)."""

    kernels: Kernels
    system: str
    version: str
    worst_error: dict[str, float]


def derive(device: DeviceProfile, model: ModelProfile, estimator: Estimator) -> Derivation:
    """Fit profiles.Kernels for `device` to the estimator's operations of `model` (Llama-3-8B)."""
    layers = model.num_layers
    peak_bw, peak_flops = device.peak_bandwidth_bytes_per_s, device.peak_flops(device.compute_dtype)
    gemms = CostModel(device, model, compute_dtype=device.compute_dtype).gemms
    worst: dict[str, float] = {}

    def phase(m: int) -> dict[str, float]:
        return estimator.decode(m, 128) if m <= 256 else estimator.prefill(m)

    points = {m: phase(m) for m in GEMM_TOKENS}
    roofline = [max(gemms.layer_bytes / peak_bw, gemms.layer_flops_per_token * m / peak_flops) for m in GEMM_TOKENS]
    measured = [sum(points[m][op] for op in LAYER_GEMMS) * 1e-3 for m in GEMM_TOKENS]
    shares = [r / t for r, t in zip(roofline, measured)]
    if not all(MIN_EFFICIENCY <= e <= MAX_DERIVED_EFFICIENCY for e in shares):
        raise ProfileError(f"aiconfigurator's measured GEMMs reach {min(shares):.3g} to {max(shares):.3g} of this "
                           "profile's roofline, which no real peaks give: check memory.peak_bandwidth and "
                           "compute.peak_fp16", file=device.path)
    efficiency = tuple(round(min(1.0, e), 4) for e in shares)

    # elementwise: per layer, a fixed cost and one per token
    tokens = np.array(GEMM_TOKENS, dtype=np.float64)
    y = np.array([sum(points[m][op] for op in ELEMENTWISE_OPS) * 1e-3 / layers for m in GEMM_TOKENS])
    elem = _nonnegative_fit(np.column_stack([np.ones_like(tokens), tokens]), y)
    worst["elementwise"] = float(np.max(np.abs(np.column_stack([np.ones_like(tokens), tokens]) @ elem / y - 1)))

    # decode attention: per layer, fixed + per request + KV bytes / rate
    rows, y = [], []
    for b in DECODE_BATCHES:
        for c in DECODE_CONTEXTS:
            kv_bytes = b * (c + 1) * model.kv_bytes_per_token_layer
            rows.append((1.0, b, kv_bytes))
            y.append(estimator.decode(b, c)["attention"] * 1e-3 / layers)
    cols, y = np.array(rows), np.array(y)
    attn = _nonnegative_fit(cols, y)
    worst["decode_attention"] = float(np.max(np.abs(cols @ attn / y - 1)))
    kv_efficiency = min(1.0, 1.0 / (attn[2] * peak_bw)) if attn[2] > 0 else None

    # prefill attention: per layer, fixed + per token + causal flops / (peak * efficiency)
    flops_per_square = 2.0 * model.num_attention_heads * model.head_dim
    rows = [(1.0, p, flops_per_square * p * p / peak_flops) for p in PREFILL_TOKENS]
    y = np.array([estimator.prefill(p)["attention"] * 1e-3 / layers for p in PREFILL_TOKENS])
    cols = np.array(rows)
    pre = _nonnegative_fit(cols, y)
    worst["prefill_attention"] = float(np.max(np.abs(cols @ pre / y - 1)))
    pre_eff = min(1.0, 1.0 / pre[2]) if pre[2] > 0 else 1.0

    kernels = Kernels(
        gemm_tokens=GEMM_TOKENS, gemm_efficiency=efficiency,
        decode_kv_efficiency=None if kv_efficiency is None else round(kv_efficiency, 4),
        decode_layer_fixed_s=_us(attn[0]), decode_per_request_s=_us(attn[1]),
        prefill_attention_efficiency=round(pre_eff, 4), prefill_layer_fixed_s=_us(pre[0]),
        prefill_per_token_s=_us(pre[1]),
        elementwise_layer_fixed_s=_us(elem[0]), elementwise_per_token_s=_us(elem[1]))
    return Derivation(kernels, estimator.system, estimator.version, worst)


def _us(seconds: float) -> float:
    """Seconds rounded to 1e-4 microseconds (the precision the TOML writes)."""
    return round(float(seconds) * 1e6, 4) * 1e-6


def kernels_toml(derivation: Derivation, command: str) -> str:
    """The [kernels] table of a device profile, with its source."""
    k = derivation.kernels
    source = (f"derived from {AIC_PACKAGE}'s measured {AIC_BACKEND} {derivation.version} database for "
              f"{derivation.system} (kernel latencies, interpolated by its estimator for {AIC_MODEL}'s operations) "
              f"by `{command}`; fits and residuals in profiles/README.md, 'Kernels'")
    rows = ",\n".join(f"  {{ tokens = {t}, efficiency = {e} }}" for t, e in zip(k.gemm_tokens, k.gemm_efficiency))
    kv = "" if k.decode_kv_efficiency is None else f"kv_efficiency = {k.decode_kv_efficiency}, "
    return "\n".join([
        "[kernels]",
        f"source = {_quote(source)}",
        f"gemm = [\n{rows},\n]",
        f'decode_attention = {{ {kv}layer_fixed = "{_fmt_us(k.decode_layer_fixed_s)}", '
        f'per_request = "{_fmt_us(k.decode_per_request_s)}" }}',
        f'prefill_attention = {{ efficiency = {k.prefill_attention_efficiency}, '
        f'layer_fixed = "{_fmt_us(k.prefill_layer_fixed_s)}", per_token = "{_fmt_us(k.prefill_per_token_s)}" }}',
        f'elementwise = {{ layer_fixed = "{_fmt_us(k.elementwise_layer_fixed_s)}", '
        f'per_token = "{_fmt_us(k.elementwise_per_token_s)}" }}',
        "",
    ])


def _fmt_us(seconds: float) -> str:
    return f"{round(seconds * 1e6, 4):g} us"


def _quote(text: str) -> str:
    """A TOML basic string: JSON's escapes (quotes, backslashes, control characters) are TOML's too."""
    return json.dumps(text, ensure_ascii=False)


@dataclass(frozen=True)
class Comparison:
    """One step, as the estimator and as the cost model give it, in milliseconds."""

    label: str
    aic_ms: float
    model_ms: float

    @property
    def ratio(self) -> float:
        return self.model_ms / self.aic_ms


def compare(cost: CostModel, estimator: Estimator, block_tokens: int = 16) -> list[Comparison]:
    """Decode at REFERENCE_BATCHES x 1k context (vLLM's paged layout) and single-prompt prefills:
    the cost model's step against the estimator's total."""
    out = []
    layout = KvLayout.paged(block_tokens)
    for b in REFERENCE_BATCHES:
        aic = sum(estimator.decode(b, REFERENCE_CONTEXT).values())
        ours = cost.decode_step_s(np.full(b, REFERENCE_CONTEXT + 1), layout) * 1e3
        out.append(Comparison(f"decode B={b} @ {REFERENCE_CONTEXT} ctx", aic, ours))
    for p in REFERENCE_PROMPTS:
        aic = sum(estimator.prefill(p).values())
        out.append(Comparison(f"prefill {p} tokens", aic, cost.prefill_s([p]) * 1e3))
    return out
