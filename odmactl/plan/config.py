"""The config TOML `plan` writes: what `replay --config` and `check` read, the command that made it
and the metrics it expects."""

from __future__ import annotations

import math
import shlex
import tomllib
from pathlib import Path

import tomli_w

from odmactl.plan.spec import PlanSpec
from odmactl.run.config import config_tables

EXPECTED_KEYS = ("kv_utilization", "tps", "migration_rate", "overflow_rate", "rejections", "ttft_p99", "tpot_p99", "peak_concurrency")


def config_document(doc: dict, command: str, predictor: str) -> dict:
    """The config TOML plan writes: what `replay --config` and `check` read, and the expected metrics.
    `predictor` is how the config names the predictor (`run.config.predictor_for_config`)."""
    odma = doc["validation"]["odma"]["metrics"]
    allocator = {**doc["chosen"]["allocator"], "max_model_len_tokens": doc["max_model_len"]}
    baselines = {name: {k: v["metrics"][k] for k in EXPECTED_KEYS} for name, v in doc["validation"].items()
                 if name != "odma"}
    return {
        "meta": {"generated_by": command, "policy": "odma", "device": doc["device"], "tp": doc["tp"], "model": doc["model"],
                 "predictor": predictor, "objective": doc["objective"], "trace_digest": doc["trace"]["digest"],
                 "search_requests": doc["trace"]["search_requests"],
                 "holdout_requests": doc["trace"]["holdout_requests"],
                 "candidates": doc["candidates"], "replayed": doc["replayed"], "chosen": doc["chosen"]["label"],
                 "constraints_met_on_search": doc["constraints_met_on_search"],
                 "expected": {k: odma[k] for k in EXPECTED_KEYS}, "baselines": baselines},
        "allocator": allocator,
        "scheduler": {"max_num_seqs": doc["max_num_seqs"], "max_num_batched_tokens": doc["max_num_batched_tokens"]},
        "thresholds": {"min_utilization": math.floor(odma["kv_utilization"] * 0.9 * 1000) / 1000,
                       "max_overflow_rate": doc["max_overflow_rate"], "max_rejection_rate": 0.0},
    }


def plan_command(trace_path: Path, spec: PlanSpec, out_path: Path) -> str:
    """The command line a config records (`[meta] generated_by`): the settings that decided it."""
    args = ["odmactl", "plan", trace_path, "--device", spec.device, "--model", spec.model, "--predictor", spec.predictor,
            "--objective", spec.objective, "--max-migration-rate", spec.max_overflow_rate, "--holdout", spec.holdout,
            "--replays", spec.replays, "--out", out_path]
    if spec.slo is not None:
        args += ["--slo", spec.slo.flag]
    if spec.ttft_p99_s is not None:
        args += ["--ttft-p99", spec.ttft_p99_s]
    for flag, value, default in (("--tp", spec.tp, 1), ("--max-model-len", spec.max_model_len, None),
                                 ("--max-num-seqs", spec.max_num_seqs, None),
                                 ("--max-num-batched-tokens", spec.max_num_batched_tokens, None),
                                 ("--kv-dtype", spec.kv_dtype, "fp16"), ("--kv-pool", spec.kv_pool_bytes, None)):
        if value != default:
            args += [flag, f"{value} B" if flag == "--kv-pool" else value]
    return " ".join(shlex.quote(str(a)) for a in args)


def config_text(config: dict) -> str:
    """The config as TOML, checked to read back as a valid config."""
    text = "# Written by odmactl plan; [meta] says how and what it expects.\n" + tomli_w.dumps(config)
    config_tables(tomllib.loads(text), None)
    return text
