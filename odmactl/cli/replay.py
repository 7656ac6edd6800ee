"""`odmactl replay`: a trace through one or more allocator policies."""

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


@app.command(short_help="Replay a trace through allocator policies; report the metrics.")  # the line `odmactl --help` lists
def replay(
    trace_path: Annotated[Path, typer.Argument(metavar="TRACE", help="canonical parquet from `odmactl ingest`")],
    device: Annotated[str, typer.Option(help="device profile name or TOML path (`odmactl profiles list`); "
                                             "with --on-device the torch device: auto, cpu, cuda or mlu")],
    model: Annotated[str, typer.Option(help="model profile name or config.json folder")],
    policy: Annotated[Optional[str], typer.Option(help=f"allocator policy: {', '.join(ALLOCATORS)} (default odma)")] = None,
    compare: Annotated[Optional[str], typer.Option(help="comma-separated policies replayed on the same trace, side by side")] = None,
    predictor: Annotated[Optional[str], typer.Option(help="`odmactl fit` artifact folder, `oracle` (true lengths) or `none` "
                                                          "(default: the --config's [plan] predictor; odma and s3 need one)")] = None,
    config: Annotated[Optional[Path], typer.Option(help="config TOML with [allocator] and [scheduler] tables (plan's output)")] = None,
    rate: Annotated[Optional[float], typer.Option(help="rescale arrivals to this many requests/s")] = None,
    offline: Annotated[bool, typer.Option(help="every request arrives at t=0")] = False,
    skip: Annotated[int, typer.Option(help="leave out the first N requests (e.g. the part plan searched on)")] = 0,
    limit: Annotated[Optional[int], typer.Option(help="replay only the first N requests (after --skip)")] = None,
    max_model_len: Annotated[Optional[int], typer.Option(help="max KV tokens per request (default: the trace's longest, within model and pool)")] = None,
    max_num_seqs: MaxNumSeqsOption = None,
    max_num_batched_tokens: MaxNumBatchedTokensOption = None,
    tp: Annotated[int, typer.Option(help="tensor parallelism: split the model over this many devices of the profile, as vLLM does")] = 1,
    kv_dtype: KvDtypeOption = "fp16",
    block_size: BlockSizeOption = None,
    engine: EngineOption = None,
    prefix_caching: PrefixCachingOption = None,
    max_new_tokens: MaxNewTokensOption = None,
    stepping: Annotated[bool, typer.Option(help="advance token by token instead of in closed form (slow; a check)")] = False,
    seed: Annotated[int, typer.Option(help="seed for generated arrivals (--rate on a trace without timestamps)")] = 0,
    allow_mismatch: Annotated[bool, typer.Option(help="apply a --config planned for another device, model, kv_dtype, tp "
                                                     "or KV pool (a warning instead of an error)")] = False,
    kv_pool: Annotated[Optional[str], typer.Option(help="KV pool size, e.g. '8 GiB' (default: what the device profile leaves)")] = None,
    on_device: Annotated[bool, typer.Option(help="also run every iteration (decodes, prompt chunks, prefills) on the torch device given by --device and time it")] = False,
    profile: Annotated[Optional[str], typer.Option(help="with --on-device: the device profile the measured steps are compared with "
                                                        "(default: the measured profile of this device)")] = None,
    scale: Annotated[float, typer.Option(help="with --on-device: keep this share of the model's layers (the pool keeps its tokens)")] = 1.0,
    out_path: Annotated[Optional[Path], typer.Option("--out", "-o", **OUTPUT_FILE, help="write the full result (metrics and time series) as JSON")] = None,
    plot: Annotated[Optional[Path], typer.Option(**OUTPUT_FILE, help="write a PNG of occupancy, batch, queue and boundaries over time (with --on-device, also measured and modelled step times)")] = None,
    force: Annotated[bool, typer.Option(help="replace --out / --plot if they exist")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print the full result as JSON")] = False,
    metrics_out: MetricsOutOption = None,
) -> None:
    """Replay a trace through allocator policies under continuous batching; report DESIGN.md's metrics."""
    from odmactl.core.atomic import write_outputs
    from odmactl.core.errors import OdmaError
    from odmactl.render.console_replay import render_replay
    from odmactl.render.json import to_json
    from odmactl.render.plots import write_replay_plot
    from odmactl.render.warnings import replay_warnings
    from odmactl.run.spec import LoadOptions, ReplaySpec
    from odmactl.trace.schema import read_trace

    policies = parse_policies(compare, policy)
    check_outputs([metrics_out, out_path, plot], force, input_paths(trace_path, config, predictor, device, model, profile))
    if plot is not None and plot.suffix.lower() != ".png":
        raise OdmaError(f"--plot writes a PNG image; give a path ending in .png, got '{plot}'")
    pool_bytes = parse_kv_pool(kv_pool)
    device_spec = None
    if on_device and tp > 1:  # a --tp below 1 is refused as a setting (run/spec.py)
        raise OdmaError("--on-device runs on one device: it takes no --tp", hint="replay --tp N without --on-device")
    if on_device:
        from odmactl.device.calibrate import resolve_device
        from odmactl.device.ondevice import OnDeviceSpec, measured_profile

        torch_device = resolve_device(device)
        device_spec = OnDeviceSpec(torch_device, scale)
        device = profile if profile is not None else str(measured_profile(torch_device).path)
    elif profile is not None or scale != 1.0:
        raise OdmaError("--profile and --scale apply to --on-device replays only")
    warned = warn_of_profile(device)
    spec = ReplaySpec(device=device, model=model, kv_dtype=kv_dtype, block_size_tokens=block_size, engine=engine,
                      prefix_caching=prefix_caching,
                      max_new_tokens=max_new_tokens, predictor=predictor, config=config,
                      load=LoadOptions(rate_per_s=rate, offline=offline, limit=limit, seed=seed, skip=skip),
                      max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                      max_num_batched_tokens=max_num_batched_tokens, fast_forward=not stepping,
                      kv_pool_bytes=pool_bytes, tp=tp, allow_mismatch=allow_mismatch)
    frame = read_trace(trace_path)
    with progress_for(json_out) as progress:
        if device_spec is None:
            from odmactl.capacity.search import sustainable_scale
            from odmactl.run.replay import run_policies

            doc = run_policies(frame, policies, spec, progress=progress, sustainable=sustainable_scale)
        else:
            from odmactl.device.replay import replay_on_device

            doc = replay_on_device(frame, policies, spec, device_spec, progress=progress)
    doc["trace"]["path"] = str(trace_path)
    replayed = replay_warnings(doc)
    doc["warnings"] = warned + replayed  # what the console warns of, for a reader of the JSON
    text = to_json(doc)
    outputs = []
    if out_path is not None:
        outputs.append((out_path, lambda tmp: tmp.write_text(text + "\n")))
    if metrics_out is not None:
        from odmactl.render.prometheus import metrics_text

        outputs.append((metrics_out, lambda tmp: tmp.write_text(metrics_text(doc, "replay"), encoding="utf-8")))
    if plot is not None:
        outputs.append((plot, lambda tmp: write_replay_plot(doc, tmp)))
    write_outputs(outputs, force=force)
    if json_out:  # stdout is the JSON alone; the warnings the console would show go to stderr
        print(text)
        print_warnings(replayed)
    else:
        render_replay(out, doc)
    print_written([path for path, _ in outputs])
