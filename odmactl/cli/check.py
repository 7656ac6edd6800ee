"""`odmactl check`: the CI capacity gate."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from odmactl.cli.app import app, out, print_error, print_warnings, print_written, progress_for
from odmactl.cli.inputs import (
    BlockSizeOption,
    KvDtypeOption,
    EngineOption,
    PrefixCachingOption,
    MaxNewTokensOption,
    MetricsOutOption,
    check_outputs,
    check_policy_names,
    input_paths,
    parse_kv_pool,
    warn_of_profile,
    OUTPUT_FILE,
)


@app.command(short_help="Replay a config and test thresholds (exit 1 when one fails).")  # the line `odmactl --help` lists
def check(
    trace_path: Annotated[Path, typer.Argument(metavar="TRACE", help="canonical parquet from `odmactl ingest`")],
    config: Annotated[Path, typer.Option(help="config TOML (plan's output): [allocator], [scheduler], [thresholds]")],
    device: Annotated[str, typer.Option(help="device profile name or TOML path")],
    model: Annotated[str, typer.Option(help="model profile name or config.json folder")],
    policy: Annotated[str, typer.Option(help="the policy the config is for")] = "odma",
    predictor: Annotated[Optional[str], typer.Option(help="`odmactl fit` artifact folder, `oracle` or `none` "
                                                          "(default: the config's [plan] predictor; odma and s3 need one)")] = None,
    min_utilization: Annotated[Optional[float], typer.Option(help="fail when kv_utilization is below this (0-1)")] = None,
    max_migration_rate: Annotated[Optional[float], typer.Option(help="fail when migration_rate is above this")] = None,
    max_overflow_rate: Annotated[Optional[float], typer.Option(help="fail when (migrations + preemptions) / requests is above this")] = None,
    max_rejection_rate: Annotated[Optional[float], typer.Option(help="fail when rejections / requests is above this")] = None,
    min_tps_gain: Annotated[Optional[float], typer.Option(help="fail when tps / baseline tps - 1 is below this (0.2 = +20%)")] = None,
    baseline: Annotated[Optional[str], typer.Option(help="policy min_tps_gain compares with (default static)")] = None,
    slo: Annotated[Optional[list[str]], typer.Option(metavar="<metric=time,...>", help="fail when a latency passes its limit, written as capacity's --slo: "
                                                    "e.g. ttft_p99=2s,tpot_p99=100ms (ttft_p50, ttft_p99, tpot_p50, "
                                                    "tpot_p99; [thresholds] max_ttft_p99_s and the like)")] = None,
    rate: Annotated[Optional[float], typer.Option(help="rescale arrivals to this many requests/s")] = None,
    offline: Annotated[bool, typer.Option(help="every request arrives at t=0")] = False,
    skip: Annotated[int, typer.Option(help="leave out the first N requests (e.g. the part plan searched on)")] = 0,
    limit: Annotated[Optional[int], typer.Option(help="replay only the first N requests (after --skip)")] = None,
    max_model_len: Annotated[Optional[int], typer.Option(help="max KV tokens per request (default: the config's, else the trace's)")] = None,
    tp: Annotated[int, typer.Option(help="tensor parallelism: split the model over this many devices of the profile, as vLLM does")] = 1,
    kv_dtype: KvDtypeOption = "fp16",
    block_size: BlockSizeOption = None,
    engine: EngineOption = None,
    prefix_caching: PrefixCachingOption = None,
    max_new_tokens: MaxNewTokensOption = None,
    allow_mismatch: Annotated[bool, typer.Option(help="apply a --config planned for another device, model, kv_dtype, tp "
                                                     "or KV pool (a warning instead of an error)")] = False,
    kv_pool: Annotated[Optional[str], typer.Option(help="KV pool size, e.g. '8 GiB' (default: the profile's)")] = None,
    junit: Annotated[Optional[Path], typer.Option(**OUTPUT_FILE, help="write the verdicts as JUnit XML")] = None,
    markdown_path: Annotated[Optional[Path], typer.Option("--markdown", **OUTPUT_FILE, help="write a markdown summary (for a pull request)")] = None,
    out_path: Annotated[Optional[Path], typer.Option("--out", "-o", **OUTPUT_FILE, help="write the replay result as JSON")] = None,
    force: Annotated[bool, typer.Option(help="replace --junit / --markdown / --out if they exist")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print the verdicts and metrics as JSON")] = False,
    metrics_out: MetricsOutOption = None,
) -> int:
    """Replay a trace with a config and test it against thresholds: exit 0 when all hold, 1 when one fails."""
    import time

    from odmactl.capacity.search import sustainable_scale
    from odmactl.capacity.slo import Slo
    from odmactl.core.atomic import write_outputs
    from odmactl.gate.check import prepare_check, run_check
    from odmactl.render.console_replay import render_check
    from odmactl.render.json import to_json
    from odmactl.render.junit import junit_xml
    from odmactl.render.markdown import check_markdown
    from odmactl.render.warnings import check_warnings
    from odmactl.run.config import LATENCY_THRESHOLDS
    from odmactl.run.spec import LoadOptions, ReplaySpec
    from odmactl.trace.schema import read_trace

    started = time.perf_counter()
    flags = {"min_utilization": min_utilization, "max_migration_rate": max_migration_rate,
             "max_overflow_rate": max_overflow_rate, "max_rejection_rate": max_rejection_rate,
             "min_tps_gain": min_tps_gain, "baseline": baseline}
    if slo:  # each limit to its [thresholds] key (ttft_p99 -> max_ttft_p99_s)
        key_of = {metric: key for key, metric in LATENCY_THRESHOLDS.items()}
        flags.update({key_of[metric]: limit for metric, limit in Slo.from_flags(slo).limits_s})
    setup = prepare_check(config, policy, flags)
    check_policy_names(setup.policies)
    check_outputs([metrics_out, junit, markdown_path, out_path], force, input_paths(trace_path, config, predictor, device, model))
    warned = warn_of_profile(device)
    spec = ReplaySpec(device=device, model=model, kv_dtype=kv_dtype, block_size_tokens=block_size, engine=engine,
                      prefix_caching=prefix_caching,
                      max_new_tokens=max_new_tokens, predictor=predictor, config=config,
                      load=LoadOptions(rate_per_s=rate, offline=offline, limit=limit, skip=skip), max_model_len=max_model_len,
                      kv_pool_bytes=parse_kv_pool(kv_pool), tp=tp, allow_mismatch=allow_mismatch)
    frame = read_trace(trace_path)
    with progress_for(json_out) as progress:
        outcome = run_check(frame, spec, policy, setup, progress=progress, started=started,
                            sustainable=sustainable_scale)
    doc = outcome.doc
    doc["trace"]["path"] = str(trace_path)
    warnings = check_warnings(doc, policy, outcome.verdicts)
    summary = {**outcome.document(policy, config), "warnings": warned + warnings}  # --json: what the console warns of too
    outputs = []
    if out_path is not None:  # the replay, with the verdicts
        replayed = to_json({**doc, "passed": summary["passed"], "verdicts": summary["verdicts"],
                            "warnings": summary["warnings"]}) + "\n"
        outputs.append((out_path, lambda tmp: tmp.write_text(replayed)))
    if metrics_out is not None:
        from odmactl.render.prometheus import metrics_text

        outputs.append((metrics_out, lambda tmp: tmp.write_text(metrics_text(doc, "check"), encoding="utf-8")))
    if junit is not None:
        outputs.append((junit, lambda tmp: tmp.write_text(
            junit_xml(outcome.verdicts, f"{trace_path.name} / {config.name} / {policy}", outcome.seconds,
                      summary["warnings"]), encoding="utf-8")))
    if markdown_path is not None:
        outputs.append((markdown_path, lambda tmp: tmp.write_text(check_markdown(outcome.verdicts, doc, policy, config,
                                                                                 summary["warnings"]),
                                                                  encoding="utf-8")))
    write_outputs(outputs, force=force)
    if json_out:  # stdout is the JSON alone; the warnings the console would show go to stderr
        print(to_json(summary))
        print_warnings(warnings)
    else:
        render_check(out, doc, policy, outcome.verdicts, outcome.passed)
    print_written([path for path, _ in outputs])
    if not outcome.passed:  # the failed gate on stderr too, where CI logs and `2>` look for it
        failed = [v for v in outcome.verdicts if not v.passed]
        print_error(f"check failed: {len(failed)} of {len(outcome.verdicts)} thresholds violated: "
                    + "; ".join(f"{v.name}: {v.metric} {v.value_text}, expected {v.comparison} {v.threshold_text}"
                                for v in failed))
    return 0 if outcome.passed else 1
