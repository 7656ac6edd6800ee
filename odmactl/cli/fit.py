"""`odmactl fit`: train the length predictor and write its artifact."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from odmactl.cli.app import app, out, progress_for
from odmactl.cli.inputs import check_outputs, input_paths
from odmactl.predict.settings import DEFAULT_UNCERTAINTY


@app.command(short_help="Train the length predictor and quantile buckets; evaluate them.")  # the line `odmactl --help` lists
def fit(
    trace_path: Annotated[Path, typer.Argument(metavar="TRACE", help="canonical parquet from `odmactl ingest`")],
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="predictor artifact directory to write")],
    encoder: Annotated[Optional[Path], typer.Option(help="local Hugging Face encoder directory: the encoder family")] = None,
    s3: Annotated[bool, typer.Option("--s3", help="the S3 baseline: a classifier over equal-width length buckets")] = False,
    buckets: Annotated[int, typer.Option(help="number of quantile buckets B over KV tokens")] = 4,
    holdout: Annotated[float, typer.Option(help="share held out for evaluation")] = 0.2,
    split_by: Annotated[str, typer.Option(help="prompt (distinct prompts held out) or time (the latest requests)")] = "prompt",
    seed: Annotated[int, typer.Option(help="seed for the split, initialisation and shuffling")] = 0,
    seeds: Annotated[int, typer.Option(
        help="fit this many times (1 to 100), with seeds --seed, --seed + 1, ..., and report Kendall tau and the "
             "bucket accuracies (the predictor's and the constant predictor's) as mean and sample sd (ddof=1) over "
             "them; the artifact and the evaluation shown in full are the first seed's. Under --split-by time the "
             "held-out rows do not depend on the seed: the seeds vary the training alone (initialisation, "
             "shuffling, validation prompts)")] = 1,
    gamma: Annotated[float, typer.Option(help="inflation: reserve L_hat * (1 + gamma * u)")] = 0.2,
    tau: Annotated[float, typer.Option(help="u above this goes to the large pool")] = 0.8,
    uncertainty: Annotated[str, typer.Option(
        help="u: headroom (the quantile head's headroom over L_hat) or entropy (the papers': the "
             "classification head's normalised entropy)")] = DEFAULT_UNCERTAINTY,
    max_model_len: Annotated[int, typer.Option(help="max KV tokens per request: the large pool's block and S3's range")] = 4096,
    epochs: Annotated[int, typer.Option(help="most training epochs (early stopping usually ends sooner)")] = 30,
    force: Annotated[bool, typer.Option(help="replace --out if it exists")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print the evaluation as JSON")] = False,
) -> None:
    """Train the generation-length predictor, fit quantile buckets, evaluate on a held-out part.

    Beside each bucket accuracy stands the constant predictor's: always the most common bucket of the
    training part."""
    import time

    from odmactl.core.atomic import atomic_output_dir
    from odmactl.predict.artifact import not_an_artifact, write_artifact
    from odmactl.predict.fitting import FitRequest, run_fits
    from odmactl.predict.settings import UNCERTAINTIES, PredictorSettings
    from odmactl.render.console_trace import render_fit
    from odmactl.render.json import to_json
    from odmactl.trace.schema import read_trace

    check_outputs([out_dir], force, input_paths(trace_path, encoder), directory_owned=not_an_artifact)
    if uncertainty not in UNCERTAINTIES:
        raise typer.BadParameter(f"expected one of {', '.join(UNCERTAINTIES)}, got {uncertainty!r}",
                                 param_hint="--uncertainty")
    settings = PredictorSettings(family="encoder" if encoder else "embedded", mode="s3" if s3 else "odma",
                                 max_model_len_tokens=max_model_len, max_epochs=epochs,
                                 uncertainty=None if s3 else uncertainty)
    request = FitRequest(num_buckets=buckets, holdout=holdout, split_by=split_by, seed=seed, gamma=gamma, tau=tau,
                         seeds=seeds)
    frame = read_trace(trace_path)
    started = time.perf_counter()
    with progress_for(json_out) as progress:
        outcome = run_fits(frame, trace_path.name, settings, request, encoder_dir=encoder, progress=progress)
    seconds = time.perf_counter() - started
    with atomic_output_dir(out_dir, force=force, owned=not_an_artifact) as tmp:
        write_artifact(outcome.predictor, tmp, outcome.artifact_tables())
    if json_out:
        print(to_json({"out": str(out_dir), **outcome.summary}))
    else:
        render_fit(out, str(out_dir), outcome.summary, seconds)
