"""The config TOML `plan` writes: what `replay --config`, `check` and `capacity --config` read, what
it was planned for, the metrics it expects, and the same settings in engines' terms.

    [plan]          the deployment (device, model, kv_dtype, tp, KV pool), predictor and trace it was
                    planned for, which part of the trace it was validated on, the command that made
                    it; [plan.expected] the recommendation's metrics on that part,
                    [plan.baselines.*] the other policies'
    [allocator]     ODMA's settings: the levels by their shape's name, tau "never" when infinite,
                    the starting boundaries once (last: the longest list)
    [scheduler]     the batch caps replayed
    [thresholds]    check's gate, the one plan held the recommendation to on the held-out part
    [engine.vllm]   the vLLM launch settings the plan corresponds to (plan/engine.py)
    [engine.odma]   the pools and bucket table in bytes for an ODMA engine (plan/engine.py)
"""

from __future__ import annotations

import json
import math
import re
import shlex
import tomllib
from pathlib import Path

import tomli_w

from odmactl.allocator import AllocatorConfig
from odmactl.gate.thresholds import Thresholds
from odmactl.plan.engine import odma_settings, vllm_settings
from odmactl.plan.spec import DEFAULT_BASELINES, PlanSpec
from odmactl.run.config import config_tables, scheduler_table
from odmactl.run.serving import Serving
from odmactl.sim.settings import SchedulerSettings

EXPECTED_KEYS = ("kv_utilization", "tps", "migration_rate", "overflow_rate", "rejections", "ttft_p99", "tpot_p99",
                 "peak_concurrency", "overloaded")
UTILIZATION_SLACK = 0.9  # [thresholds] min_utilization: this share of the expected, room for drift
LINE_CHARS = 100  # the config's arrays wrap at this width
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def thresholds(spec: PlanSpec, expected_utilization: float) -> Thresholds:
    """The gate plan holds its recommendation to and writes as [thresholds]: the migration-rate and
    rejection limits it was given, and UTILIZATION_SLACK of the utilization expected (rounded down
    to 0.1%)."""
    return Thresholds(min_utilization=math.floor(expected_utilization * UTILIZATION_SLACK * 1000) / 1000,
                      max_overflow_rate=spec.max_overflow_rate, max_rejection_rate=spec.max_rejection_rate)


def config_document(doc: dict, setup: Serving, command: str, predictor: str, trace: str,
                    odma_config: AllocatorConfig) -> dict:
    """The config as a dict of tables (the module docstring). `predictor` is how the config names
    the predictor (`run.config.predictor_for_config`); `odma_config` the [allocator] settings the
    held-out replay ran with (the large pool sized)."""
    validation = doc["validation"]
    expected = validation["odma"]["metrics"]
    # TOML has no null: a latency no request had (TPOT when every reply is one token) is left out
    baselines = {name: {k: v["metrics"][k] for k in EXPECTED_KEYS if v["metrics"][k] is not None}
                 for name, v in validation.items() if name != "odma"}
    t = doc["trace"]
    record = {
        "generated_by": command, "policy": "odma", "device": doc["device"], "model": doc["model"],
        "kv_dtype": doc["kv_dtype"], "tp": doc["tp"], "kv_pool_bytes": doc["kv_pool_bytes"],
        "kv_pool_tokens": setup.pool_tokens,
        "kv_bytes_per_token": doc["kv_bytes_per_token"], "predictor": predictor, "trace": trace,
        "trace_digest": t["digest"], "trace_requests": t["requests"], "search_requests": t["search_requests"],
        "holdout_requests": t["holdout_requests"],
        "validated_on": f"requests {t['search_requests'] + 1:,} to {t['requests']:,} of the trace "
                        f"(`check --skip {t['search_requests']}` replays them)",
        "objective": doc["objective"], "chosen": doc["chosen"]["label"], "candidates": doc["candidates"],
        "replayed": doc["replayed"], "constraints_met_on_search": doc["constraints_met_on_search"],
        "expected": {k: expected[k] for k in EXPECTED_KEYS if expected[k] is not None}, "baselines": baselines}
    gate = doc["gate"]["thresholds"]
    return {
        "plan": record,
        "allocator": {**allocator_table(doc["chosen"]["allocator"], doc["max_model_len"]),
                      **({"block_size_tokens": doc["block_size_tokens"]} if doc["block_size_given"] else {})},
        "scheduler": scheduler_table(SchedulerSettings(doc["max_num_seqs"], doc["max_num_batched_tokens"],
                                                       doc["max_new_tokens"], policy=doc["scheduler"],
                                                       engine=doc["engine"], prefix_caching=doc["prefix_caching"]),
                                     doc["max_model_len"], "odma"),
        "thresholds": {k: v for k, v in gate.items() if v is not None and k != "baseline"},
        "engine": {"vllm": vllm_settings(setup, doc["kv_dtype"], doc["max_model_len"], doc["max_num_seqs"],
                                         doc["max_num_batched_tokens"], doc["block_size_tokens"], doc["engine"],
                                         doc["prefix_caching"]),
                   "odma": odma_settings(setup, odma_config, doc["max_new_tokens"],
                                         doc["pool_fit"]["longest_prompt_tokens"], doc["scheduler"],
                                         SchedulerSettings().aging_s)},
    }


def allocator_table(chosen: dict, max_len: int) -> dict:
    """[allocator]: max_model_len first, the settings as the candidate names them, the boundaries last."""
    table = {"max_model_len_tokens": max_len, **{k: v for k, v in chosen.items() if k != "boundaries_tokens"}}
    table["boundaries_tokens"] = chosen["boundaries_tokens"]
    return table


def plan_command(trace_path: Path, spec: PlanSpec, out_path: Path) -> str:
    """The command line a config records (`[plan] generated_by`): the settings that decided it."""
    args = ["odmactl", "plan", trace_path, "--device", spec.device, "--model", spec.model, "--predictor", spec.predictor,
            "--objective", spec.objective, "--max-migration-rate", spec.max_overflow_rate, "--holdout", spec.holdout,
            "--replays", spec.replays, "--out", out_path]
    if spec.slo is not None:
        args += ["--slo", spec.slo.flag]
    if spec.ttft_p99_s is not None:
        args += ["--ttft-p99", spec.ttft_p99_s]
    for flag, value, default in (("--tp", spec.tp, 1), ("--max-model-len", spec.max_model_len, None),
                                 ("--max-rejection-rate", spec.max_rejection_rate, 0.0),
                                 ("--max-num-seqs", spec.max_num_seqs, None),
                                 ("--max-num-batched-tokens", spec.max_num_batched_tokens, None),
                                 ("--kv-dtype", spec.kv_dtype, "fp16"), ("--kv-pool", spec.kv_pool_bytes, None),
                                 ("--block-size", spec.block_size_tokens, None), ("--engine", spec.engine, None),
                                 ("--max-new-tokens", spec.max_new_tokens, None),
                                 ("--baselines", ",".join(spec.baselines), ",".join(DEFAULT_BASELINES))):
        if value != default:
            args += [flag, f"{value} B" if flag == "--kv-pool" else value]
    if spec.prefix_caching is not None:
        args.append("--prefix-caching" if spec.prefix_caching else "--no-prefix-caching")
    return " ".join(shlex.quote(str(a)) for a in args)


def config_text(config: dict, heading: str) -> str:
    """The config as TOML (scalars first in each table, then its sub-tables; arrays wrapped at
    LINE_CHARS), checked to read back as an equal and valid config."""
    lines = [f"# {line}" for line in heading.splitlines()]
    for name, table in config.items():
        _table(lines, [name], table)
    text = "\n".join(lines) + "\n"
    parsed = tomllib.loads(text)
    assert parsed == json.loads(json.dumps(config)), "the config TOML does not read back as written"
    config_tables(parsed, None)
    return text


def _table(lines: list[str], path: list[str], table: dict) -> None:
    if any(not isinstance(v, dict) for v in table.values()) or not table:  # no header for sub-tables alone
        lines += ["", "[" + ".".join(_key(k) for k in path) + "]"]
    for key, value in table.items():
        if not isinstance(value, dict):
            lines.extend(_value_lines(_key(key), value))
    for key, value in table.items():
        if isinstance(value, dict):
            _table(lines, path + [key], value)


def _key(key: str) -> str:
    return key if _BARE_KEY.match(key) else json.dumps(key)


def _value_lines(key: str, value) -> list[str]:
    """`key = value`; an array wrapped at LINE_CHARS, four spaces in."""
    if not isinstance(value, list):
        return [tomli_w.dumps({"k": value}).strip().replace("k = ", f"{key} = ", 1)]
    items = [tomli_w.dumps({"k": v}).strip()[4:] for v in value]
    if len(key) + 5 + sum(len(i) + 2 for i in items) <= LINE_CHARS:
        return [f"{key} = [{', '.join(items)}]"]
    out, line = [f"{key} = ["], "   "
    for item in items:
        if len(line) + len(item) + 2 > LINE_CHARS:
            out.append(line.rstrip())
            line = "   "
        line += f" {item},"
    return out + [line.rstrip(), "]"]
