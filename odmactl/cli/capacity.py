"""`odmactl capacity`: the request rate each policy sustains at a latency SLO, and the devices a
target rate needs, per tensor-parallel size."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from odmactl.allocator import ALLOCATORS
from odmactl.cli.app import app, out, print_warnings, print_written, progress_for
from odmactl.cli.inputs import (
    BlockSizeOption,
    KvDtypeOption,
    MaxNumBatchedTokensOption,
    MaxNumSeqsOption,
    EngineOption,
    PrefixCachingOption,
    MaxNewTokensOption,
    MetricsOutOption,
    check_outputs,
    input_paths,
    parse_kv_pool,
    parse_policies,
    warn_of_profile,
    OUTPUT_FILE,
)
from odmactl.sim.router import DEFAULT_ROUTER, ROUTER_SUMMARIES


def _sizes(text: str) -> tuple[int, ...]:
    from odmactl.core.errors import ConfigError

    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ConfigError(f"--tp expects comma-separated whole numbers such as 1,2,4, got '{text}'") from None


@app.command(short_help="Each policy's highest rate within an SLO; devices for a target.")  # the line `odmactl --help` lists
def capacity(
    trace_path: Annotated[Path, typer.Argument(metavar="TRACE", help="canonical parquet from `odmactl ingest` (with arrival times)")],
    device: Annotated[str, typer.Option(help="device profile name or TOML path")],
    model: Annotated[str, typer.Option(help="model profile name or config.json folder")],
    slo: Annotated[list[str], typer.Option(metavar="<metric=time,...>", help="latency limits, e.g. ttft_p99=2s,tpot_p99=100ms (ttft_p50, ttft_p99, tpot_p50, tpot_p99)")],
    policies: Annotated[str, typer.Option(help=f"comma-separated policies, of {', '.join(ALLOCATORS)}")] = "static,paged,s3,odma",
    config: Annotated[Optional[Path], typer.Option(help="config TOML (plan's output): its [allocator] and [scheduler] apply")] = None,
    predictor: Annotated[Optional[str], typer.Option(help="`odmactl fit` artifact folder, `oracle` or `none` "
                                                          "(default: the --config's [plan] predictor; odma and s3 need one)")] = None,
    tp: Annotated[str, typer.Option(help="tensor-parallel sizes to try, comma-separated")] = "1",
    max_migration_rate: Annotated[float, typer.Option(help="most overflows (migrations + preemptions) per request odma and s3 may cause")] = 0.005,
    target_rate: Annotated[Optional[float], typer.Option(help="requests/s to size the deployment for (default: the trace's peak 10-minute rate)")] = None,
    workers: Annotated[int, typer.Option(help="worker processes, one policy and size each")] = 1,
    max_replicas: Annotated[int, typer.Option(help="most engines tried for the target rate")] = 256,
    arrivals: Annotated[str, typer.Option(help="the arrival process replayed: trace (the trace's own gaps, rescaled: "
                                               "bursts kept), poisson (its requests at exponential gaps of the same "
                                               "mean rate, seeded) or gamma:CV (gamma gaps, coefficient of variation CV)")] = "trace",
    seed: Annotated[int, typer.Option(help="seed of the generated arrivals (--arrivals poisson or gamma:CV)")] = 0,
    router: Annotated[str, typer.Option(help="how the engines for the target share its requests: "
                                             + "; ".join(f"{name} ({what})" for name, what in ROUTER_SUMMARIES.items())
                                             + ". Several, comma-separated: each row is sized behind each and keeps "
                                               "the fewest devices, among ties the lower latencies (docs/capacity.md "
                                               "compares them)")] = DEFAULT_ROUTER,
    executor: Annotated[str, typer.Option(help="process (local workers) or ray (a Ray cluster; the ray extra)")] = "process",
    max_model_len: Annotated[Optional[int], typer.Option(help="max KV tokens per request (default: the config's, else the trace's longest)")] = None,
    max_num_seqs: MaxNumSeqsOption = None,
    max_num_batched_tokens: MaxNumBatchedTokensOption = None,
    kv_dtype: KvDtypeOption = "fp16",
    block_size: BlockSizeOption = None,
    engine: EngineOption = None,
    prefix_caching: PrefixCachingOption = None,
    max_new_tokens: MaxNewTokensOption = None,
    allow_mismatch: Annotated[bool, typer.Option(help="apply a --config planned for another device, model, kv_dtype, tp "
                                                     "or KV pool (a warning instead of an error)")] = False,
    kv_pool: Annotated[Optional[str], typer.Option(help="KV pool per engine, e.g. '8 GiB' (default: the profile's)")] = None,
    out_path: Annotated[Optional[Path], typer.Option("--out", "-o", **OUTPUT_FILE, help="write the result (every probe included) as JSON")] = None,
    plot: Annotated[Optional[Path], typer.Option(**OUTPUT_FILE, help="write a PNG of the latencies the SLO bounds against the offered rate")] = None,
    report: Annotated[Optional[Path], typer.Option(**OUTPUT_FILE, help="write an HTML report: the table and the curves")] = None,
    markdown_path: Annotated[Optional[Path], typer.Option("--markdown", **OUTPUT_FILE, help="write the headline, the table and what "
                                                          "binds as Markdown (a pull request, a planning document)")] = None,
    force: Annotated[bool, typer.Option(help="replace --out / --plot / --report / --markdown if they exist")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
    metrics_out: MetricsOutOption = None,
) -> None:
    """Find, by replay and bisection, the highest request rate each policy serves within the SLO, and the devices a target rate needs."""
    from odmactl.capacity.run import CapacitySpec
    from odmactl.capacity.run import capacity as run_capacity
    from odmactl.capacity.slo import Slo
    from odmactl.core.atomic import write_outputs
    from odmactl.core.errors import OdmaError
    from odmactl.render.console_replay import render_capacity
    from odmactl.render.html import write_capacity_report
    from odmactl.render.json import to_json
    from odmactl.render.plots import write_capacity_plot
    from odmactl.render.warnings import capacity_warnings
    from odmactl.trace.schema import read_trace

    chosen = parse_policies(policies, None, flag="--policies")
    check_outputs([metrics_out, out_path, plot, report, markdown_path], force, input_paths(trace_path, config, predictor, device, model))
    if plot is not None and plot.suffix.lower() != ".png":
        raise OdmaError(f"--plot writes a PNG image; give a path ending in .png, got '{plot}'")
    warned = warn_of_profile(device)
    spec = CapacitySpec(device=device, model=model, kv_dtype=kv_dtype, block_size_tokens=block_size, engine=engine,
                        prefix_caching=prefix_caching,
                        max_new_tokens=max_new_tokens, predictor=predictor,
                        max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                        max_num_batched_tokens=max_num_batched_tokens, kv_pool_bytes=parse_kv_pool(kv_pool),
                        allow_mismatch=allow_mismatch,
                        policies=tuple(chosen), tps=_sizes(tp), slo=Slo.from_flags(slo),
                        max_migration_rate=max_migration_rate, target_rate_per_s=target_rate, config=config,
                        workers=workers, executor=executor, max_replicas=max_replicas,
                        routers=tuple(part.strip() for part in router.split(",") if part.strip()),
                        arrivals=arrivals, seed=seed)
    frame = read_trace(trace_path)
    with progress_for(json_out, lines_when_piped=True) as progress:
        doc = run_capacity(frame, spec, progress=progress)
    doc = {"trace": {"path": str(trace_path), **doc["trace"]}, **{k: v for k, v in doc.items() if k != "trace"}}
    found = capacity_warnings(doc)
    doc["warnings"] = warned + found  # what the console warns of, for a reader of the JSON
    outputs = []
    if plot is not None:
        outputs.append((plot, lambda tmp: write_capacity_plot(doc, tmp)))
    if report is not None:
        outputs.append((report, lambda tmp: write_capacity_report(doc, tmp)))
    if out_path is not None:
        outputs.append((out_path, lambda tmp: tmp.write_text(to_json(doc) + "\n", encoding="utf-8")))
    if metrics_out is not None:
        from odmactl.render.prometheus import metrics_text

        outputs.append((metrics_out, lambda tmp: tmp.write_text(metrics_text(doc, "capacity"), encoding="utf-8")))
    if markdown_path is not None:
        from odmactl.render.markdown import capacity_markdown

        outputs.append((markdown_path, lambda tmp: tmp.write_text(capacity_markdown(doc), encoding="utf-8")))
    write_outputs(outputs, force=force)
    if json_out:  # stdout is the JSON alone; the warnings the console would show go to stderr
        print(to_json(doc))
        print_warnings(found)
    else:
        render_capacity(out, doc)
    print_written([path for path, _ in outputs])
