"""The odmactl command line: one thin function per command and the single error boundary (`main`)."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Iterator, Optional

import click
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from odmactl import __version__
from odmactl.core.errors import OdmaError

app = typer.Typer(
    name="odmactl",
    help="Trace replay and KV-cache capacity planning for LLM serving (ODMA).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
out = Console()
err = Console(stderr=True)


@contextmanager
def progress_bar(enabled: bool) -> Iterator:
    """A progress callback (label, done, total) drawing a bar on stderr, or a no-op."""
    if not enabled:
        yield None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as bar:
        tasks: dict[str, int] = {}

        def update(label: str, done: int, total: int) -> None:
            if label not in tasks:
                tasks[label] = bar.add_task(label, total=total)
            bar.update(tasks[label], completed=done, total=total)

        yield update


def _parse_map(items: list[str]) -> dict[str, str]:
    from odmactl.core.errors import TraceError

    mapping = {}
    for item in items:
        canonical, sep, source = item.partition("=")
        if not sep or not canonical or not source:
            raise TraceError(f"--map expects canonical=source, got '{item}'")
        mapping[canonical.strip()] = source.strip()
    return mapping


@app.command()
def ingest(
    sources: Annotated[list[Path], typer.Argument(help="trace or dataset files (gzip ok), or a ServeGen model folder")],
    out_path: Annotated[Path, typer.Option("--out", "-o", help="canonical parquet to write")],
    fmt: Annotated[str, typer.Option("--format", "-f", help="auto, azure, burstgpt, mooncake, vidur, alpaca, alpaca-eval, arena-hard, servegen, csv, jsonl, parquet")] = "auto",
    tokenizer: Annotated[Optional[Path], typer.Option(help="local Hugging Face tokenizer directory for text datasets (default: shipped Qwen2 tokenizer)")] = None,
    force: Annotated[bool, typer.Option(help="replace --out if it exists")] = False,
    column_map: Annotated[list[str], typer.Option("--map", help="canonical=source column mapping for csv/jsonl/parquet (repeatable)")] = [],
    rate: Annotated[Optional[float], typer.Option(help="Poisson arrivals at this many requests/s for sources without timestamps")] = None,
    offline: Annotated[bool, typer.Option(help="all requests of sources without timestamps arrive at t=0")] = False,
    seed: Annotated[int, typer.Option(help="seed for generated arrivals and ServeGen sampling")] = 0,
    start: Annotated[float, typer.Option(help="servegen: start of the generated span, seconds into the data")] = 0.0,
    duration: Annotated[Optional[float], typer.Option(help="servegen: length of the generated span in seconds (default 3600)")] = None,
    rate_scale: Annotated[float, typer.Option(help="servegen: multiply every client's rate by this")] = 1.0,
    json_out: Annotated[bool, typer.Option("--json", help="print the summary as JSON")] = False,
) -> None:
    """Normalize traces or prompt/response datasets into the canonical parquet schema."""
    from odmactl.core.atomic import check_writable
    from odmactl.trace.readers import ingest as run_ingest
    from odmactl.trace.readers.options import ReadOptions
    from odmactl.render.report import render_ingest, to_json
    from odmactl.trace.schema import ArrivalOptions, write_trace

    check_writable(out_path, force=force)
    with progress_bar(not json_out and err.is_terminal) as progress:
        opts = ReadOptions(column_map=_parse_map(column_map), tokenizer_dir=tokenizer, seed=seed, start_s=start,
                           duration_s=duration, rate_scale=rate_scale, progress=progress)
        trace, formats = run_ingest(sources, fmt, opts, ArrivalOptions(rate_per_s=rate, offline=offline, seed=seed))
        write_trace(trace, out_path, force=force)
    frame = trace.frame
    summary = {
        "out": str(out_path),
        "format_detected": fmt == "auto",
        "sources": trace.sources,
        "requests": frame.height,
        "duration_s": float(frame["arrival_s"].max()),
        "total_prompt_tokens": int(frame["prompt_tokens"].cast(int).sum()),
        "total_output_tokens": int(frame["output_tokens"].cast(int).sum()),
        "moved_rows": trace.moved_rows,
        "arrivals": trace.arrival_note,
    }
    if json_out:
        print(to_json(summary))
        return
    if fmt == "auto":
        for path, f in zip(sources, formats):
            err.print(f"{path}: detected format '{f}'")
    render_ingest(out, summary)


@app.command()
def stats(
    trace_path: Annotated[Path, typer.Argument(metavar="TRACE", help="canonical parquet from `odmactl ingest`")],
    window: Annotated[float, typer.Option(help="drift window in seconds")] = 600.0,
    json_out: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Length and arrival statistics, breakdowns by model and tenant, drift over time windows."""
    from odmactl.core.errors import TraceError
    from odmactl.render.report import render_stats, to_json
    from odmactl.trace.stats import trace_stats
    from odmactl.trace.schema import read_trace

    if not window > 0:
        raise TraceError(f"--window must be a positive number of seconds, got {window}")
    result = trace_stats(read_trace(trace_path), window)
    if json_out:
        print(to_json({"trace": str(trace_path), **result}))
    else:
        render_stats(out, str(trace_path), result)


@app.command()
def fit(
    trace_path: Annotated[Path, typer.Argument(metavar="TRACE", help="canonical parquet from `odmactl ingest`")],
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="predictor artifact directory to write")],
    encoder: Annotated[Optional[Path], typer.Option(help="local Hugging Face encoder directory: the encoder family")] = None,
    s3: Annotated[bool, typer.Option("--s3", help="the S3 baseline: a classifier over equal-width length buckets")] = False,
    buckets: Annotated[int, typer.Option(help="number of quantile buckets B over KV tokens")] = 4,
    holdout: Annotated[float, typer.Option(help="share held out for evaluation")] = 0.2,
    split_by: Annotated[str, typer.Option(help="prompt (distinct prompts held out) or time (the latest requests)")] = "prompt",
    seed: Annotated[int, typer.Option(help="seed for the split, initialisation and shuffling")] = 0,
    gamma: Annotated[float, typer.Option(help="inflation: reserve L_hat * (1 + gamma * u)")] = 0.2,
    tau: Annotated[float, typer.Option(help="u above this goes to the large pool")] = 0.8,
    max_model_len: Annotated[int, typer.Option(help="max KV tokens per request: the large pool's block and S3's range")] = 4096,
    epochs: Annotated[int, typer.Option(help="most training epochs (early stopping usually ends sooner)")] = 30,
    force: Annotated[bool, typer.Option(help="replace --out if it exists")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print the evaluation as JSON")] = False,
) -> None:
    """Train the generation-length predictor, fit quantile buckets, evaluate on a held-out part."""
    import time

    from odmactl.core.atomic import atomic_output_dir, check_writable_dir
    from odmactl.predict.fitting import FitRequest, run_fit
    from odmactl.predict.predictor import PredictorSettings
    from odmactl.render.report import render_fit, to_json
    from odmactl.trace.schema import read_trace

    check_writable_dir(out_dir, force=force)
    if max_model_len < 16 or epochs < 1:
        raise OdmaError(f"--max-model-len must be >= 16 and --epochs >= 1, got {max_model_len} and {epochs}")
    frame = read_trace(trace_path)
    settings = PredictorSettings(family="encoder" if encoder else "embedded", mode="s3" if s3 else "odma",
                                 max_model_len_tokens=max_model_len, max_epochs=epochs)
    request = FitRequest(num_buckets=buckets, holdout=holdout, split_by=split_by, seed=seed, gamma=gamma, tau=tau)
    started = time.perf_counter()
    with progress_bar(not json_out and err.is_terminal) as progress:
        outcome = run_fit(frame, trace_path.name, settings, request, encoder_dir=encoder, progress=progress)
    seconds = time.perf_counter() - started
    with atomic_output_dir(out_dir, force=force) as tmp:
        outcome.predictor.save(tmp, {"trace": outcome.summary["trace"], "split": outcome.summary["split"],
                                     "buckets": outcome.summary["buckets"],
                                     "evaluation": outcome.summary["evaluation"]})
    if json_out:
        print(to_json({"out": str(out_dir), **outcome.summary}))
    else:
        render_fit(out, str(out_dir), outcome.summary, seconds)


def _replay_inputs(policies: list[str], outputs: list[Path | None], force: bool, kv_pool: str | None) -> int | None:
    """What replay and check validate before any work: policy names, writable outputs, the
    --kv-pool size (returned in bytes, None when not given)."""
    from odmactl.allocator import ALLOCATORS
    from odmactl.core.atomic import check_writable
    from odmactl.core.units import parse_quantity

    for p in policies:
        if p not in ALLOCATORS:
            raise OdmaError(f"unknown policy '{p}' (choose from: {', '.join(ALLOCATORS)})")
    for path in outputs:
        if path is not None:
            check_writable(path, force=force)
    if kv_pool is None:
        return None
    try:
        return int(parse_quantity(kv_pool, "bytes"))
    except ValueError as exc:
        raise OdmaError(f"--kv-pool: {exc}") from None


@app.command()
def replay(
    trace_path: Annotated[Path, typer.Argument(metavar="TRACE", help="canonical parquet from `odmactl ingest`")],
    device: Annotated[str, typer.Option(help="device profile name or TOML path (`odmactl profiles list`); "
                                             "with --on-device the torch device: auto, cpu, cuda or mlu")],
    model: Annotated[str, typer.Option(help="model profile name or config.json folder")],
    policy: Annotated[str, typer.Option(help="allocator policy: static, paged, s3, odma")] = "odma",
    compare: Annotated[Optional[str], typer.Option(help="comma-separated policies replayed on the same trace, side by side")] = None,
    predictor: Annotated[Optional[str], typer.Option(help="`odmactl fit` artifact folder, `oracle` (true lengths) or `none` "
                                                          "(default: the --config's [meta] predictor, else none)")] = None,
    config: Annotated[Optional[Path], typer.Option(help="config TOML with [allocator] and [scheduler] tables (plan's output)")] = None,
    rate: Annotated[Optional[float], typer.Option(help="rescale arrivals to this many requests/s")] = None,
    offline: Annotated[bool, typer.Option(help="every request arrives at t=0")] = False,
    limit: Annotated[Optional[int], typer.Option(help="replay only the first N requests")] = None,
    max_model_len: Annotated[Optional[int], typer.Option(help="max KV tokens per request (default: the trace's longest, within model and pool)")] = None,
    max_num_seqs: Annotated[Optional[int], typer.Option(help="most requests in a batch (default 256)")] = None,
    kv_dtype: Annotated[str, typer.Option(help="KV precision: fp16, bf16, fp8, int8, int4, oaken")] = "fp16",
    stepping: Annotated[bool, typer.Option(help="advance token by token instead of in closed form (slow; a check)")] = False,
    seed: Annotated[int, typer.Option(help="seed for generated arrivals (--rate on a trace without timestamps)")] = 0,
    kv_pool: Annotated[Optional[str], typer.Option(help="KV pool size, e.g. '8 GiB' (default: what the device profile leaves)")] = None,
    on_device: Annotated[bool, typer.Option(help="also run every decode iteration on the torch device given by --device and time it")] = False,
    profile: Annotated[Optional[str], typer.Option(help="with --on-device: the device profile the measured steps are compared with "
                                                        "(default: the measured profile of this device)")] = None,
    scale: Annotated[float, typer.Option(help="with --on-device: keep this share of the model's layers (the pool keeps its tokens)")] = 1.0,
    out_path: Annotated[Optional[Path], typer.Option("--out", "-o", help="write the full result (metrics and time series) as JSON")] = None,
    plot: Annotated[Optional[Path], typer.Option(help="write a PNG of occupancy, batch, queue and boundaries over time")] = None,
    force: Annotated[bool, typer.Option(help="replace --out / --plot if they exist")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print the full result as JSON")] = False,
) -> None:
    """Replay a trace through allocator policies under continuous batching; report DESIGN.md's metrics."""
    from odmactl.core.atomic import atomic_output
    from odmactl.render.report import render_replay, to_json, write_replay_plot
    from odmactl.trace.schema import read_trace
    from odmactl.run.workload import LoadOptions, ReplaySpec, run_policies

    policies = [p.strip() for p in compare.split(",") if p.strip()] if compare else [policy]
    if len(set(policies)) != len(policies):
        raise OdmaError(f"--compare names a policy twice: {compare}")
    pool_bytes = _replay_inputs(policies, [out_path, plot], force, kv_pool)
    device_spec = None
    if on_device:
        from odmactl.device.calibrate import resolve_device
        from odmactl.device.ondevice import OnDeviceSpec, measured_profile

        torch_device = resolve_device(device)
        device_spec = OnDeviceSpec(torch_device, scale)
        device = profile if profile is not None else str(measured_profile(torch_device).path)
    elif profile is not None or scale != 1.0:
        raise OdmaError("--profile and --scale apply to --on-device replays only")
    spec = ReplaySpec(device=device, model=model, kv_dtype=kv_dtype, predictor=predictor, config=config,
                      load=LoadOptions(rate_per_s=rate, offline=offline, limit=limit, seed=seed),
                      max_model_len=max_model_len, max_num_seqs=max_num_seqs, fast_forward=not stepping,
                      kv_pool_bytes=pool_bytes, on_device=device_spec)
    frame = read_trace(trace_path)
    with progress_bar(not json_out and err.is_terminal) as progress:
        doc = run_policies(frame, policies, spec, progress=progress)
    doc["trace"]["path"] = str(trace_path)
    text = to_json(doc)
    if out_path is not None:
        with atomic_output(out_path, force=force) as tmp:
            tmp.write_text(text + "\n")
    if plot is not None:
        with atomic_output(plot, force=force) as tmp:
            write_replay_plot(doc, tmp)
    if json_out:
        print(text)
    else:
        render_replay(out, doc)


@app.command()
def plan(
    trace_path: Annotated[Path, typer.Argument(metavar="TRACE", help="canonical parquet from `odmactl ingest`")],
    device: Annotated[str, typer.Option(help="device profile name or TOML path")],
    model: Annotated[str, typer.Option(help="model profile name or config.json folder")],
    out_path: Annotated[Path, typer.Option("--out", "-o", help="config TOML to write (read by `replay --config` and `check`)")],
    predictor: Annotated[str, typer.Option(help="`odmactl fit` artifact folder or `oracle` (true lengths, the upper bound)")] = "oracle",
    report: Annotated[Optional[Path], typer.Option(help="write an HTML report with plots")] = None,
    objective: Annotated[str, typer.Option(help="what to maximise: tps or utilization")] = "tps",
    max_migration_rate: Annotated[float, typer.Option(help="most overflows (migrations + preemptions) per request the recommendation may cause")] = 0.005,
    ttft_p99: Annotated[Optional[float], typer.Option(help="most seconds of TTFT p99 the recommendation may cause")] = None,
    holdout: Annotated[float, typer.Option(help="share of the trace, at its end, held out to validate on")] = 0.3,
    replays: Annotated[int, typer.Option(help="candidates replayed after the cheap bounds")] = 12,
    workers: Annotated[int, typer.Option(help="worker processes for the cheap bounds and the replays")] = 1,
    executor: Annotated[str, typer.Option(help="process (local workers) or ray (a Ray cluster; the ray extra)")] = "process",
    max_model_len: Annotated[Optional[int], typer.Option(help="max KV tokens per request (default: the trace's longest, within model and pool)")] = None,
    max_num_seqs: Annotated[Optional[int], typer.Option(help="most requests in a batch (default 256)")] = None,
    kv_dtype: Annotated[str, typer.Option(help="KV precision")] = "fp16",
    kv_pool: Annotated[Optional[str], typer.Option(help="KV pool size, e.g. '8 GiB' (default: the profile's)")] = None,
    force: Annotated[bool, typer.Option(help="replace --out / --report if they exist")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print the plan (search, replays, validation) as JSON")] = False,
) -> None:
    """Search ODMA's buckets, gamma, tau, large pool and refit on the trace's earlier part; validate on its later part."""
    import shlex

    import tomli_w

    from odmactl.core.atomic import atomic_output
    from odmactl.plan.search import PlanSpec, config_document, plan as run_plan
    from odmactl.render.html import write_plan_report
    from odmactl.render.report import render_plan, to_json
    from odmactl.trace.schema import read_trace
    from odmactl.run.workload import predictor_for_config, read_config

    pool_bytes = _replay_inputs([], [out_path, report], force, kv_pool)
    spec = PlanSpec(device=device, model=model, kv_dtype=kv_dtype, predictor=predictor, objective=objective,
                    max_overflow_rate=max_migration_rate, ttft_p99_s=ttft_p99, holdout=holdout, replays=replays,
                    workers=workers, executor=executor, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                    kv_pool_bytes=pool_bytes)
    frame = read_trace(trace_path)
    with progress_bar(not json_out and err.is_terminal) as progress:
        doc = run_plan(frame, spec, progress=progress)
    doc["trace"]["path"] = str(trace_path)
    command = " ".join(shlex.quote(str(a)) for a in [
        "odmactl", "plan", trace_path, "--device", device, "--model", model, "--predictor", predictor,
        "--objective", objective, "--max-migration-rate", max_migration_rate, "--holdout", holdout,
        "--replays", replays, "--out", out_path] + (["--ttft-p99", ttft_p99] if ttft_p99 is not None else []))
    config = config_document(doc, command, predictor_for_config(predictor, out_path))
    with atomic_output(out_path, force=force) as tmp:
        tmp.write_text("# Written by odmactl plan; [meta] says how and what it expects.\n" + tomli_w.dumps(config),
                       encoding="utf-8")
        read_config(tmp)  # what we write must read back as a valid config
    if report is not None:
        with atomic_output(report, force=force) as tmp:
            write_plan_report(doc, config, tmp)
    if json_out:
        print(to_json({"out": str(out_path), **doc}))
    else:
        render_plan(out, doc, str(out_path))


@app.command()
def check(
    trace_path: Annotated[Path, typer.Argument(metavar="TRACE", help="canonical parquet from `odmactl ingest`")],
    config: Annotated[Path, typer.Option(help="config TOML (plan's output): [allocator], [scheduler], [thresholds]")],
    device: Annotated[str, typer.Option(help="device profile name or TOML path")],
    model: Annotated[str, typer.Option(help="model profile name or config.json folder")],
    policy: Annotated[str, typer.Option(help="the policy the config is for")] = "odma",
    predictor: Annotated[Optional[str], typer.Option(help="`odmactl fit` artifact folder, `oracle` or `none` "
                                                          "(default: the config's [meta] predictor, else none)")] = None,
    min_utilization: Annotated[Optional[float], typer.Option(help="fail when kv_utilization is below this (0-1)")] = None,
    max_migration_rate: Annotated[Optional[float], typer.Option(help="fail when migration_rate is above this")] = None,
    max_overflow_rate: Annotated[Optional[float], typer.Option(help="fail when (migrations + preemptions) / requests is above this")] = None,
    max_rejection_rate: Annotated[Optional[float], typer.Option(help="fail when rejections / requests is above this")] = None,
    min_tps_gain: Annotated[Optional[float], typer.Option(help="fail when tps / baseline tps - 1 is below this (0.2 = +20%)")] = None,
    baseline: Annotated[Optional[str], typer.Option(help="policy min_tps_gain compares with (default static)")] = None,
    rate: Annotated[Optional[float], typer.Option(help="rescale arrivals to this many requests/s")] = None,
    offline: Annotated[bool, typer.Option(help="every request arrives at t=0")] = False,
    limit: Annotated[Optional[int], typer.Option(help="replay only the first N requests")] = None,
    max_model_len: Annotated[Optional[int], typer.Option(help="max KV tokens per request (default: the config's, else the trace's)")] = None,
    kv_dtype: Annotated[str, typer.Option(help="KV precision")] = "fp16",
    kv_pool: Annotated[Optional[str], typer.Option(help="KV pool size, e.g. '8 GiB' (default: the profile's)")] = None,
    junit: Annotated[Optional[Path], typer.Option(help="write the verdicts as JUnit XML")] = None,
    markdown_path: Annotated[Optional[Path], typer.Option("--markdown", help="write a markdown summary (for a pull request)")] = None,
    out_path: Annotated[Optional[Path], typer.Option("--out", "-o", help="write the replay result as JSON")] = None,
    force: Annotated[bool, typer.Option(help="replace --junit / --markdown / --out if they exist")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print the verdicts and metrics as JSON")] = False,
) -> int:
    """Replay a trace with a config and test it against thresholds: exit 0 when all hold, 1 when one fails."""
    import dataclasses
    import time

    from odmactl.core.atomic import atomic_output
    from odmactl.gate.thresholds import Thresholds, evaluate, junit_xml, markdown, policies_needed
    from odmactl.render.report import render_check, to_json
    from odmactl.trace.schema import read_trace
    from odmactl.run.workload import LoadOptions, ReplaySpec, read_config, run_policies

    flags = {"min_utilization": min_utilization, "max_migration_rate": max_migration_rate,
             "max_overflow_rate": max_overflow_rate, "max_rejection_rate": max_rejection_rate,
             "min_tps_gain": min_tps_gain, "baseline": baseline}
    tables = read_config(config)
    thresholds = Thresholds.merged(tables["thresholds"], flags, config)
    if thresholds.empty:
        raise OdmaError("nothing to check: give a threshold flag or a [thresholds] table in the config",
                        hint="e.g. --min-utilization 0.6 --max-migration-rate 0.005")
    policies = policies_needed(policy, thresholds)
    pool_bytes = _replay_inputs(policies, [junit, markdown_path, out_path], force, kv_pool)
    spec = ReplaySpec(device=device, model=model, kv_dtype=kv_dtype, predictor=predictor, config=config,
                      load=LoadOptions(rate_per_s=rate, offline=offline, limit=limit), max_model_len=max_model_len,
                      kv_pool_bytes=pool_bytes)
    started = time.perf_counter()
    frame = read_trace(trace_path)
    with progress_bar(not json_out and err.is_terminal) as progress:
        doc = run_policies(frame, policies, spec, progress=progress, tables=tables)
    doc["trace"]["path"] = str(trace_path)
    verdicts = evaluate(doc, policy, thresholds)
    seconds = time.perf_counter() - started
    passed = all(v.passed for v in verdicts)
    if out_path is not None:
        with atomic_output(out_path, force=force) as tmp:
            tmp.write_text(to_json(doc) + "\n")
    if junit is not None:
        with atomic_output(junit, force=force) as tmp:
            tmp.write_text(junit_xml(verdicts, f"{trace_path.name} / {config.name} / {policy}", seconds), encoding="utf-8")
    if markdown_path is not None:
        with atomic_output(markdown_path, force=force) as tmp:
            tmp.write_text(markdown(verdicts, doc, policy, config), encoding="utf-8")
    if json_out:
        print(to_json({"passed": passed, "policy": policy, "config": str(config),
                       "verdicts": [dataclasses.asdict(v) for v in verdicts],
                       "metrics": {p: r["metrics"] for p, r in doc["results"].items()}}))
    else:
        render_check(out, doc, policy, verdicts, passed)
    return 0 if passed else 1


profiles_app = typer.Typer(help="List and show device and model profiles.", no_args_is_help=True)
app.add_typer(profiles_app, name="profiles")


@profiles_app.command("list")
def profiles_list(
    json_out: Annotated[bool, typer.Option("--json", help="print as JSON")] = False,
) -> None:
    """The shipped (and measured) device profiles and model configs."""
    from odmactl.hw.profiles import device_paths, model_dirs, read_device, read_model
    from odmactl.render.report import device_summary, model_summary, render_profiles_list, to_json

    devices = [device_summary(read_device(p), []) for p in device_paths()]
    models = [model_summary(read_model(p)) for p in model_dirs()]
    if json_out:
        print(to_json({"devices": devices, "models": models}))
    else:
        render_profiles_list(out, devices, models)


@profiles_app.command("show")
def profiles_show(
    name: Annotated[str, typer.Argument(help="a device or model name, a device TOML, or a local HF model directory")],
    kv_dtype: Annotated[str, typer.Option(help="KV precision for the KV pool figures: fp16, bf16, fp8, int8, int4, oaken")] = "fp16",
    json_out: Annotated[bool, typer.Option("--json", help="print as JSON")] = False,
) -> None:
    """One profile with its derived quantities (usable memory, KV pool per model, KV bytes per token)."""
    from odmactl.core.errors import ProfileError
    from odmactl.hw.profiles import find_model_dir, load_device, load_model, model_dirs, read_model
    from odmactl.render.report import device_summary, model_summary, render_device, render_model, to_json

    if find_model_dir(name) is not None:
        summary = model_summary(load_model(name, kv_dtype=kv_dtype))
        render = render_model
    else:
        try:
            device = load_device(name)
        except ProfileError as exc:
            if exc.file is None:
                raise ProfileError(f"'{name}' is neither a device nor a model profile",
                                   hint="`odmactl profiles list` shows the shipped ones") from None
            raise
        models = [read_model(p, kv_dtype=kv_dtype) for p in model_dirs()]
        summary = device_summary(device, models)
        render = render_device
    if json_out:
        print(to_json(summary))
    else:
        render(out, summary)


@app.command()
def calibrate(
    out_path: Annotated[Path, typer.Option("--out", "-o", help="device profile TOML to write")],
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or mlu")] = "auto",
    quick: Annotated[bool, typer.Option(help="smaller buffers and fewer repeats (about a minute on a CPU)")] = False,
    seed: Annotated[int, typer.Option(help="seed for the random run offsets and block placement")] = 0,
    force: Annotated[bool, typer.Option(help="replace --out if it exists")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print the profile as JSON")] = False,
) -> None:
    """Measure this machine with torch (bandwidth by run length, copy, matmul, paged attention) into a profile."""
    import datetime as dt
    import time

    import tomli_w

    from odmactl.core.atomic import atomic_output, check_writable
    from odmactl.device.calibrate import CalibrationSettings, measure, profile_document, resolve_device
    from odmactl.hw.profiles import read_device
    from odmactl.render.report import render_calibration, to_json

    check_writable(out_path, force=force)
    resolved = resolve_device(device)
    settings = CalibrationSettings.for_device(resolved, quick, seed)
    command = f"odmactl calibrate --device {device}{' --quick' if quick else ''} --out {out_path}"
    started = time.perf_counter()
    with progress_bar(not json_out and err.is_terminal) as progress:
        results = measure(settings, progress)
    seconds = time.perf_counter() - started
    doc = profile_document(results, settings, command, dt.datetime.now(dt.timezone.utc))
    header = "# Measured by odmactl calibrate; see [measurement] for when, where and how.\n"
    with atomic_output(out_path, force=force) as tmp:
        tmp.write_text(header + tomli_w.dumps(doc), encoding="utf-8")
        read_device(tmp)  # what we write must read back as a valid profile
    if json_out:
        print(to_json({"out": str(out_path), "seconds": round(seconds, 3), **doc}))
    else:
        render_calibration(out, str(out_path), doc, seconds)


@app.command()
def version() -> None:
    """Print the odmactl version."""
    print(__version__)


def main(argv: list[str] | None = None) -> int:
    """Entry point: runs the app and is the single place errors become messages and exit codes."""
    debug = os.environ.get("ODMACTL_DEBUG") == "1"
    try:
        result = app(args=argv, prog_name="odmactl", standalone_mode=False)
        return result if isinstance(result, int) else 0
    except OdmaError as exc:
        if debug:
            raise
        err.print(f"[bold red]error:[/] {exc}", markup=True, highlight=False, soft_wrap=True)
        return 1
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.exceptions.Abort:
        err.print("aborted")
        return 130
    except click.ClickException as exc:
        if debug:
            raise
        err.print(f"[bold red]error:[/] {exc.format_message()}", highlight=False, soft_wrap=True)
        if isinstance(exc, click.UsageError) and exc.ctx is not None:
            err.print(f"see `{exc.ctx.command_path} --help`", highlight=False)
        return 1
    except KeyboardInterrupt:
        err.print("interrupted; nothing was written")
        return 130
    except Exception as exc:  # a bug in odmactl, not bad input
        if debug:
            raise
        err.print(f"[bold red]internal error:[/] {exc.__class__.__name__}: {exc} "
                  "(this is a bug in odmactl; rerun with ODMACTL_DEBUG=1 for the traceback)", highlight=False, soft_wrap=True)
        return 1


def entry() -> None:
    sys.exit(main())
