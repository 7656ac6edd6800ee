"""`odmactl plan`: search ODMA's settings and write the recommended config."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from odmactl.allocator import ALLOCATORS
from odmactl.cli.app import app, out, print_warnings, progress_for
from odmactl.cli.inputs import BlockSizeOption, EngineOption, KvDtypeOption, MaxNumBatchedTokensOption, MaxNumSeqsOption, PrefixCachingOption, MaxNewTokensOption, check_outputs, input_paths, OUTPUT_FILE, parse_kv_pool, parse_seconds, warn_of_profile


@app.command(short_help="Search ODMA's settings; write a config that passes its gate.")  # the line `odmactl --help` lists
def plan(
    trace_path: Annotated[Path, typer.Argument(metavar="TRACE", help="canonical parquet from `odmactl ingest`")],
    device: Annotated[str, typer.Option(help="device profile name or TOML path")],
    model: Annotated[str, typer.Option(help="model profile name or config.json folder")],
    out_path: Annotated[Path, typer.Option("--out", "-o", **OUTPUT_FILE, help="config TOML to write (read by `replay --config` and `check`)")],
    predictor: Annotated[str, typer.Option(help="`odmactl fit` artifact folder or `oracle` (true lengths, the upper bound)")] = "oracle",
    report: Annotated[Optional[Path], typer.Option(**OUTPUT_FILE, help="write an HTML report with plots")] = None,
    objective: Annotated[str, typer.Option(help="what to maximise: tps, utilization, or capacity (the request rate sustained within --slo)")] = "tps",
    slo: Annotated[Optional[list[str]], typer.Option(metavar="<metric=time,...>", help="with --objective capacity: latency limits, e.g. ttft_p99=2s,tpot_p99=100ms")] = None,
    max_migration_rate: Annotated[float, typer.Option(help="most overflows (migrations + preemptions) per request the recommendation may cause")] = 0.005,
    max_rejection_rate: Annotated[float, typer.Option(help="most rejected requests (prompts past max_model_len) per request")] = 0.0,
    ttft_p99: Annotated[Optional[str], typer.Option(metavar="<time>", help="most TTFT p99 the recommendation may cause "
                                                    "(2s, 500ms; a bare number is seconds), judged where plan replays: "
                                                    "the trace at its own rate on one engine; for a latency limit at "
                                                    "the rate an engine serves, --objective capacity --slo")] = None,
    holdout: Annotated[float, typer.Option(help="share of the trace, at its end, held out to validate on")] = 0.3,
    replays: Annotated[int, typer.Option(help="candidates replayed after the cheap bounds")] = 12,
    workers: Annotated[int, typer.Option(help="worker processes for the cheap bounds and the replays")] = 1,
    executor: Annotated[str, typer.Option(help="process (local workers) or ray (a Ray cluster; the ray extra)")] = "process",
    max_model_len: Annotated[Optional[int], typer.Option(help="max KV tokens per request (default: the trace's longest, within model and pool)")] = None,
    max_num_seqs: MaxNumSeqsOption = None,
    max_num_batched_tokens: MaxNumBatchedTokensOption = None,
    tp: Annotated[int, typer.Option(help="tensor parallelism: split the model over this many devices of the profile, as vLLM does")] = 1,
    kv_dtype: KvDtypeOption = "fp16",
    block_size: BlockSizeOption = None,
    engine: EngineOption = None,
    prefix_caching: PrefixCachingOption = None,
    max_new_tokens: MaxNewTokensOption = None,
    kv_pool: Annotated[Optional[str], typer.Option(help="KV pool size, e.g. '8 GiB' (default: the profile's)")] = None,
    baselines: Annotated[str, typer.Option(help="comma-separated policies validated beside the recommendation, besides "
                                                "static's slots: of " + ", ".join(p for p in ALLOCATORS
                                                                                 if p not in ("static", "odma")))] = "paged,s3",
    force: Annotated[bool, typer.Option(help="replace --out / --report if they exist")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print the plan (search, replays, validation) as JSON")] = False,
) -> int:
    """Search ODMA's buckets, gamma, tau, large pool and refit on the trace's earlier part; validate on its later part.

    Exit 0 when the recommendation passes its own [thresholds] on the later part and met every
    constraint on the earlier part but the margin for sampling noise (the config is written); 1
    otherwise (no config; the message and the report, if asked, say why)."""
    from odmactl.allocator import AllocatorConfig
    from odmactl.cli.app import print_error
    from odmactl.core.atomic import write_outputs
    from odmactl.plan.config import config_document, config_text, plan_command
    from odmactl.plan.search import plan as run_plan
    from odmactl.plan.spec import PlanSpec
    from odmactl.render.console_replay import render_plan
    from odmactl.render.html import write_plan_report
    from odmactl.render.json import to_json
    from odmactl.render.plan_text import config_heading, failure_message
    from odmactl.render.warnings import plan_warnings
    from odmactl.run.config import predictor_for_config
    from odmactl.trace.schema import read_trace

    check_outputs([out_path, report], force, input_paths(trace_path, predictor, device, model))
    warned = warn_of_profile(device)
    from odmactl.capacity.slo import Slo

    spec = PlanSpec(device=device, model=model, kv_dtype=kv_dtype, block_size_tokens=block_size, engine=engine,
                    prefix_caching=prefix_caching,
                    max_new_tokens=max_new_tokens, predictor=predictor, objective=objective,
                    slo=Slo.from_flags(slo) if slo else None,
                    max_overflow_rate=max_migration_rate, max_rejection_rate=max_rejection_rate, ttft_p99_s=parse_seconds(ttft_p99, "--ttft-p99"), holdout=holdout, replays=replays,
                    workers=workers, executor=executor, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                    max_num_batched_tokens=max_num_batched_tokens,
                    kv_pool_bytes=parse_kv_pool(kv_pool), tp=tp,
                    baselines=tuple(p.strip() for p in baselines.split(",") if p.strip()))
    frame = read_trace(trace_path)
    with progress_for(json_out) as progress:
        doc, setup = run_plan(frame, spec, progress=progress)
    doc["trace"]["path"] = str(trace_path)
    found = plan_warnings(doc)
    doc["warnings"] = warned + found  # what the console warns of, for a reader of the JSON
    config = config_document(doc, setup, plan_command(trace_path, spec, out_path),
                             predictor_for_config(predictor, out_path), str(trace_path),
                             AllocatorConfig.from_mapping(doc["validation"]["odma"]["config"]))
    text = config_text(config, config_heading(doc))
    holds = doc["holds"]
    written = [p for p in (report, out_path if holds else None) if p is not None]
    outputs = [(report, lambda tmp: write_plan_report(doc, config, tmp, warned))] if report is not None else []
    if holds:
        outputs.append((out_path, lambda tmp: tmp.write_text(text, encoding="utf-8")))
    write_outputs(outputs, force=force)
    if json_out:  # stdout is the JSON alone; the warnings the console would show go to stderr
        print(to_json({"out": str(out_path) if holds else None, **doc}))
        print_warnings(found)
    else:
        render_plan(out, doc, [str(p) for p in written])
    if not holds:
        kept = f" (the existing {out_path} is left as it was)" if out_path.exists() else ""
        print_error(failure_message(doc, out_path) + kept)
        return 1
    return 0
