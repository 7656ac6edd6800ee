"""`odmactl profiles list | show`: the device and model profiles and what they imply."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from odmactl.cli.app import app, out
from odmactl.cli.inputs import KvDtypeOption

profiles_app = typer.Typer(help="List and show device and model profiles.", short_help="Device and model profiles.",
                           no_args_is_help=True, rich_markup_mode=None)
app.add_typer(profiles_app, name="profiles")


@profiles_app.command("list", short_help="The device profiles and model configs.")
def profiles_list(
    json_out: Annotated[bool, typer.Option("--json", help="print as JSON")] = False,
) -> None:
    """The shipped (and measured) device profiles and model configs."""
    from odmactl.hw.profiles import device_paths, model_dirs, read_device, read_model
    from odmactl.hw.summary import device_summary, model_summary
    from odmactl.render.console_profiles import render_profiles_list
    from odmactl.render.json import to_json

    devices = [device_summary(read_device(p), []) for p in device_paths()]
    models = [model_summary(read_model(p)) for p in model_dirs()]
    if json_out:
        print(to_json({"devices": devices, "models": models}))
    else:
        render_profiles_list(out, devices, models)


@profiles_app.command("show", short_help="One profile and what it implies.")
def profiles_show(
    name: Annotated[str, typer.Argument(help="a device or model name, a device TOML, or a local HF model directory")],
    kv_dtype: KvDtypeOption = "fp16",
    model: Annotated[Optional[str], typer.Option(help="with a device: also the decode step of this model at a full KV "
                                                     "pool, paged at block sizes 8, 16 and 32 against contiguous")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print as JSON")] = False,
) -> None:
    """One profile with its derived quantities (usable memory, KV pool per model, KV bytes per token;
    for a device with --model, the paged/contiguous decode-step ratio at a full pool)."""
    from odmactl.core.errors import ProfileError, did_you_mean
    from odmactl.hw.profiles import device_paths, find_model_dir, load_device, load_model, model_dirs, read_model
    from odmactl.hw.summary import device_summary, model_summary, paged_vs_contiguous
    from odmactl.render.console_profiles import render_device, render_model
    from odmactl.render.json import to_json

    if find_model_dir(name) is not None:
        if model is not None:
            raise ProfileError(f"--model goes with a device; '{name}' is a model", hint=f"odmactl profiles show DEVICE --model {name}")
        summary = model_summary(load_model(name, kv_dtype=kv_dtype))
        render = render_model
    else:
        try:
            device = load_device(name)
        except ProfileError as exc:
            if exc.file is None and str(exc).startswith("unknown device"):  # not a family of several: that names them
                near = did_you_mean(name, [p.stem for p in device_paths()] + [p.name for p in model_dirs()])
                raise ProfileError(f"'{name}' is neither a device nor a model profile" + (f"; {near}" if near else ""),
                                   hint="`odmactl profiles list` shows the shipped ones") from None
            raise
        models = [read_model(p, kv_dtype=kv_dtype) for p in model_dirs()]
        summary = device_summary(device, models)
        if model is not None:
            summary["paged_vs_contiguous"] = paged_vs_contiguous(device, load_model(model, kv_dtype=kv_dtype))
        render = render_device
    if json_out:
        print(to_json(summary))
    else:
        render(out, summary)


@profiles_app.command("kernels", short_help="A [kernels] table from aiconfigurator's data.")
def profiles_kernels(
    device: Annotated[str, typer.Argument(help="a device aiconfigurator has a database for: a100-80gb-sxm, h100-sxm, h200")],
    json_out: Annotated[bool, typer.Option("--json", help="print as JSON")] = False,
) -> None:
    """Derive a device's [kernels] table from aiconfigurator-core's measured vLLM kernel database
    (offline; `pip install 'odmactl[aic]'`), and compare the cost model with aiconfigurator's
    estimate for Llama-3-8B (decode at 1k context, prefill at 1k and 4k tokens)."""
    import dataclasses

    from odmactl.hw import aic
    from odmactl.hw.cost import CostModel
    from odmactl.hw.profiles import device_paths, load_device, load_model
    from odmactl.render.console_profiles import render_kernels
    from odmactl.render.json import to_json

    profile = load_device(device)
    model = load_model(aic.MODEL)
    estimator = aic.Estimator(aic.system_of(profile))
    derivation = aic.derive(profile, model, estimator)
    derived = dataclasses.replace(profile, kernels=derivation.kernels)
    rows = aic.compare(CostModel(derived, model, compute_dtype=derived.compute_dtype), estimator)
    shipped = None
    if profile.kernels is not None:
        shipped = aic.compare(CostModel(profile, model, compute_dtype=profile.compute_dtype), estimator)
    shipped_name = next((path.stem for path in device_paths() if path == profile.path), None)
    toml = aic.kernels_toml(derivation, f"odmactl profiles kernels {shipped_name or profile.path}")
    doc = {"device": profile.name, "system": derivation.system, "database": f"{aic.AIC_BACKEND} {derivation.version}",
           "model": aic.MODEL, "kernels": dataclasses.asdict(derivation.kernels),
           "fit_worst_relative_error": derivation.worst_error, "toml": toml,
           "comparison": [dict(step=r.label, aiconfigurator_ms=r.aic_ms, derived_ms=r.model_ms, derived_ratio=r.ratio,
                               **({} if shipped is None else {"profile_ms": s.model_ms, "profile_ratio": s.ratio}))
                          for r, s in zip(rows, shipped or rows)]}
    if json_out:
        print(to_json(doc))
    else:
        render_kernels(out, doc)
