"""The predictor's settings and what a fit learns besides the weights (an artifact's [settings]
and [state] tables), with the constants both the network and the artifact reader use."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from odmactl.core.errors import PredictorError
from odmactl.core.limits import MAX_BUCKETS, MAX_EPOCHS, MAX_TOKENS, whole_number_problem

PREDICTOR_CHOICES = ("none", "oracle")  # what --predictor takes besides an artifact folder (predict/source.py)
FAMILIES = ("embedded", "encoder")
MODES = ("odma", "s3")
# odma mode's u: "entropy", the papers' (seeds/001 §3.2: the normalised entropy of the bucket
# classification head's softmax), or "headroom", odmactl's earlier one (predictor.py's docstring)
UNCERTAINTIES = ("entropy", "headroom")
DEFAULT_UNCERTAINTY = "headroom"  # measured to serve better (README, "ODMA as its papers describe it")
ProgressFn = Callable[[str, int, int], None]
UPPER_QUANTILE = 0.99
MAX_GAMMA = 1.0e6


@dataclass(frozen=True)
class PredictorSettings:
    family: str = "embedded"
    mode: str = "odma"
    num_hash_buckets: int = 1 << 16
    max_words: int = 256
    text_dim: int = 32
    id_dim: int = 8
    hidden: int = 64
    num_classes: int = 8
    max_epochs: int = 30
    patience_epochs: int = 3
    batch_size: int = 512
    learning_rate: float = 3e-3
    weight_decay: float = 1e-5
    validation: float = 0.1  # share of the training prompts held back for early stopping
    max_model_len_tokens: int = 4096
    s3_num_buckets: int = 10
    encoder_max_length_tokens: int = 256
    uncertainty: str | None = None  # one of UNCERTAINTIES; None: "headroom" (an artifact from before the choice)

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise PredictorError(f"expected one of {', '.join(FAMILIES)}, got {self.family!r}", key="family")
        if self.mode not in MODES:
            raise PredictorError(f"expected one of {', '.join(MODES)}, got {self.mode!r}", key="mode")
        if self.uncertainty is not None and self.uncertainty not in UNCERTAINTIES:
            raise PredictorError(f"expected one of {', '.join(UNCERTAINTIES)}, got {self.uncertainty!r}",
                                 key="uncertainty")
        for key, low, high, flag in (("max_model_len_tokens", 16, MAX_TOKENS, " (--max-model-len)"),
                                     ("max_epochs", 1, MAX_EPOCHS, " (--epochs)"),
                                     ("num_hash_buckets", 1, 1 << 24, ""), ("hidden", 1, 1 << 16, ""),
                                     ("num_classes", 1, MAX_BUCKETS, ""), ("batch_size", 1, 1 << 20, ""),
                                     ("s3_num_buckets", 1, MAX_BUCKETS, ""), ("max_words", 1, 1 << 20, ""),
                                     ("text_dim", 1, 1 << 16, ""), ("id_dim", 1, 1 << 16, ""),
                                     ("patience_epochs", 1, MAX_EPOCHS, ""),
                                     ("encoder_max_length_tokens", 1, MAX_TOKENS, "")):
            problem = whole_number_problem(getattr(self, key), low, high)
            if problem is not None:
                raise PredictorError(problem + flag, key=key)
        for key, ok, what in (("learning_rate", self.learning_rate > 0, "> 0"),
                              ("weight_decay", self.weight_decay >= 0, ">= 0"),
                              ("validation", 0 < self.validation < 1, "between 0 and 1")):
            if not ok:
                raise PredictorError(f"expected a number {what}, got {getattr(self, key)!r}", key=key)


@dataclass
class FittedState:
    """What a fit learned besides the weights: everything `predict` needs to rebuild the inputs."""

    models: list[str]
    tenants: list[str]
    log_prompt_mean: float
    log_prompt_std: float
    target_mean: float  # of log(output_tokens) over the training rows
    target_std: float
    class_edges_tokens: list[int]  # odma mode: upper edges of the length classes but the last
    headroom_scale: float = 1.0  # K: the 99th percentile of L_hi / L_hat over the training rows (odma mode)
    coverage_gamma: float = 0.0  # gamma at which UPPER_QUANTILE of the held-back rows fit (odma mode)
    encoder_dir: str | None = None
    encoder_sha256: str | None = None
    training: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Invariant: positive spreads, a headroom scale >= 1, class edges strictly increasing
        whole token counts >= 1 (what `predict` divides by and searches)."""
        for key in ("log_prompt_std", "target_std"):
            if not getattr(self, key) > 0:
                raise PredictorError(f"expected a number > 0, got {getattr(self, key)!r}", key=key)
        if not self.headroom_scale >= 1.0:
            raise PredictorError(f"expected a number >= 1, got {self.headroom_scale!r}", key="headroom_scale")
        edges = list(self.class_edges_tokens)
        if any(isinstance(e, bool) or not isinstance(e, int) or e < 1 for e in edges) or edges != sorted(set(edges)):
            raise PredictorError(f"expected strictly increasing token counts >= 1, got {edges}", key="class_edges_tokens")
