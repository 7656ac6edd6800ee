"""`odmactl profiles list | show`: the device and model profiles and what they imply."""

from __future__ import annotations

from typing import Annotated

import typer

from odmactl.cli.app import app, out

profiles_app = typer.Typer(help="List and show device and model profiles.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(profiles_app, name="profiles")


@profiles_app.command("list")
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


@profiles_app.command("show")
def profiles_show(
    name: Annotated[str, typer.Argument(help="a device or model name, a device TOML, or a local HF model directory")],
    kv_dtype: Annotated[str, typer.Option(help="KV precision for the KV pool figures: fp16, bf16, fp8, int8, int4, oaken")] = "fp16",
    json_out: Annotated[bool, typer.Option("--json", help="print as JSON")] = False,
) -> None:
    """One profile with its derived quantities (usable memory, KV pool per model, KV bytes per token)."""
    from odmactl.core.errors import ProfileError
    from odmactl.hw.profiles import find_model_dir, load_device, load_model, model_dirs, read_model
    from odmactl.hw.summary import device_summary, model_summary
    from odmactl.render.console_profiles import render_device, render_model
    from odmactl.render.json import to_json

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
