"""What the commands check before any work: flag values that need parsing, policy names, and
outputs that can be written."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Optional

import typer

from odmactl.allocator import ALLOCATORS
from odmactl.cli.app import print_warnings
from odmactl.allocator.registry import unknown_policy
from odmactl.core.atomic import absolute, check_writable, check_writable_dir
from odmactl.core.errors import ConfigError, OutputError, named_twice, quoted
from odmactl.core.units import parse_quantity
from odmactl.hw.profiles import KV_DTYPE_BITS, kv_dtype_problem
from odmactl.run.config import predictor_from_config
from odmactl.sim.metrics import LATENCY_LIMIT_SECONDS, latency_limit_ok


def _known_kv_dtype(value: str) -> str:
    problem = kv_dtype_problem(value)
    if problem is not None:
        raise typer.BadParameter(problem)
    return value


KvDtypeOption = Annotated[str, typer.Option("--kv-dtype", help=f"KV precision: {', '.join(KV_DTYPE_BITS)}",
                                            callback=_known_kv_dtype)]
"""--kv-dtype, one definition for every command that takes it: a name outside hw/'s table is a
usage error naming the flag (exit 2)."""


def parse_map(items: list[str]) -> dict[str, str]:
    """--map canonical=source pairs."""
    mapping = {}
    for item in items:
        canonical, sep, source = item.partition("=")
        if not sep or not canonical.strip() or not source.strip():
            raise ConfigError(f"--map expects canonical=source, got '{item}'")
        if canonical.strip() in mapping:
            raise ConfigError(f"--map names {canonical.strip()} twice ({mapping[canonical.strip()]} and {source.strip()})")
        mapping[canonical.strip()] = source.strip()
    return mapping


def parse_policies(compare: str | None, policy: str | None, default: str = "odma", flag: str = "--compare") -> list[str]:
    """`flag`'s (--compare's) comma-separated policies, else --policy (None: `default`); every name
    a registered policy, once; the two flags exclude each other."""
    if compare is not None and policy is not None:
        raise ConfigError(f"{flag} and --policy exclude each other", hint=f"list the policy in {flag}")
    policies = [p.strip() for p in compare.split(",") if p.strip()] if compare is not None else [policy or default]
    if not policies:
        raise ConfigError(f"{flag} names no policy", hint=f"e.g. {flag} {','.join(ALLOCATORS)}")
    check_policy_names(policies)
    twice = named_twice(flag, policies)
    if twice is not None:
        raise ConfigError(twice)
    return policies


def check_policy_names(policies: list[str]) -> None:
    for p in policies:
        problem = unknown_policy(p)
        if problem is not None:
            raise ConfigError(problem)


def parse_kv_pool(kv_pool: str | None) -> int | None:
    """--kv-pool as whole bytes (None when not given)."""
    if kv_pool is None:
        return None
    try:
        value = parse_quantity(kv_pool, "bytes")
    except ValueError as exc:
        raise ConfigError(f"--kv-pool: {exc}") from None
    if value < 1:
        raise ConfigError(f"--kv-pool must be at least 1 byte, got {kv_pool!r}")
    return int(value)


_BARE_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def parse_seconds(text: str | None, flag: str) -> float | None:
    """A time limit as seconds (None when not given): a time with its unit as --slo writes it
    ('2s', '500 ms'), or a bare number of seconds (what the flag took before it took units)."""
    if text is None:
        return None
    if _BARE_NUMBER.fullmatch(text.strip()):  # ASCII digits only: float() also takes '2_0' and Arabic-Indic digits
        seconds = float(text)
    else:
        try:
            seconds = parse_quantity(text, "seconds")
        except ValueError as exc:
            raise ConfigError(f"{flag}: {exc}") from None
    if not latency_limit_ok(seconds):  # the text as typed: 1e400 had been echoed as 'inf', -0 as '-0.0'
        raise ConfigError(f"{flag} expects {LATENCY_LIMIT_SECONDS}, got {quoted(text.strip())}")
    return seconds


def input_paths(*values: str | Path | None) -> list[Path]:
    """The values that name an existing file or directory: the inputs an output must not touch
    (a --device or --model given as a path, a --predictor folder, a trace, a config), and what
    those read in turn: the predictor a config's [plan] names, the encoder folder a predictor uses."""
    named = [Path(v) for v in values if v is not None and str(v) and Path(v).exists()]
    found = list(named)
    for path in named:
        if path.is_file() and path.suffix == ".toml":
            found += _config_predictor(path)
    for path in list(found):
        if path.is_dir():
            found += _encoder_dir(path)
    return found


def _config_predictor(config: Path) -> list[Path]:
    """The predictor folder a config's [plan] (or older [meta]) names, if it is one (a config that
    does not read is reported by the command itself)."""
    try:
        with open(config, "rb") as fh:
            data = tomllib.load(fh)
        named = data.get("plan", data.get("meta", {})).get("predictor")
    except (OSError, ValueError, AttributeError):
        return []
    if not isinstance(named, str):
        return []
    path = Path(predictor_from_config(named, config))
    return [path] if path.is_dir() else []


def _encoder_dir(predictor: Path) -> list[Path]:
    """The encoder folder a predictor artifact was fitted with, if it has one."""
    try:
        with open(predictor / "predictor.toml", "rb") as fh:
            where = tomllib.load(fh).get("state", {}).get("encoder_dir")
    except (OSError, ValueError, AttributeError):
        return []
    return [Path(where)] if isinstance(where, str) and where and Path(where).is_dir() else []


def _collision(output: Path, source: Path) -> str | None:
    """Why writing `output` would destroy or change input `source`, or None (both absolute)."""
    if output == source:
        return "is also an input of this command; writing it would destroy that input"
    if output in source.parents:
        return f"contains {source}, an input of this command; replacing it would destroy that input"
    if source.is_dir() and source in output.parents:
        return f"is inside {source}, an input of this command; writing it would change that input"
    return None


def check_outputs(outputs: list[Path | None], force: bool, inputs: list[Path | None] = (), *,
                  directory_owned: Callable[[Path], str | None] | None = None) -> None:
    """Every output can be written (and replaced only with --force), before any expensive work; no
    output is, contains or lies inside an input (not even with --force), or is another output, or
    is `-` (read as stdout by many tools; it would be a file of that name), or is empty or `.`.
    With `directory_owned` the outputs are directories, which --force replaces only where it
    returns None (core/atomic.py, check_writable_dir)."""
    for p in outputs:
        if p is not None and str(p).strip() in ("", "."):  # `--out ''` arrives as Path('.'); ' ' would be a file
            raise OutputError("is empty or the current directory, not a path to write", file=p,
                              hint="name the file (or folder) to write")
        if p is not None and (ending := _folder_ending(p)) is not None:
            raise OutputError(f"ends with '{ending}', which names a folder; this option writes one file",
                              file=p.typed, hint="name the file to write")
        if p is not None and str(p) == "-":  # many tools read it as stdout; here it would be a file named "-"
            raise OutputError("is not standard output here: odmactl writes its outputs as files", file=p,
                              hint="name a file (one called '-' by its full path, as ./- reads as -); --json, where a "
                                   "command has it, prints the result on standard output")
    named = [absolute(p) for p in outputs if p is not None]
    sources = [absolute(p) for p in inputs if p is not None]  # compared as given and resolved (links followed)
    for path in named:
        for source in sources:
            reason = _collision(path.resolve(), source.resolve()) or _collision(path, source)
            if reason is not None:
                raise OutputError(reason, file=path, hint="choose another output path")
        if directory_owned is None:
            check_writable(path, force=force)
        else:
            check_writable_dir(path, force=force, owned=directory_owned)
    resolved = [p.resolve() for p in named]
    if len(set(resolved)) != len(named):
        twice = next(p for p, r in zip(named, resolved) if resolved.count(r) > 1)
        raise OutputError("is given for two outputs (through a link, or as two spellings of one path)"
                          if named.count(twice) == 1 else "is given for two outputs", file=twice,
                          hint="give each output its own path")


# options several replaying commands share (one declaration each)
BlockSizeOption = Annotated[Optional[int], typer.Option(
    "--block-size", help="the block in tokens of paged (vLLM's --block-size), ellm's chunks and unified's pages: 8, 16 "
    "or 32 (default: the config's, else 16)")]
EngineOption = Annotated[Optional[str], typer.Option(
    "--engine", help="the engine version whose schedule is replayed: vllm-v0 (whole-prompt prefills; Cambricon-vLLM "
    "0.6.2) or vllm-v1 (decodes first, prompts chunked into each step's token budget); default: the config's, else "
    "the device profile's")]
PrefixCachingOption = Annotated[Optional[bool], typer.Option(
    "--prefix-caching/--no-prefix-caching", help="vLLM's automatic prefix caching, replayed for paged on a trace "
    "with prefix hashes (Mooncake's hash_ids); default: the config's, else the engine's (on in vllm-v1, off in "
    "vllm-v0)")]
MaxNewTokensOption = Annotated[Optional[int], typer.Option(
    "--max-new-tokens", help="vLLM's max_tokens: every request stops after this many output tokens (counted as "
    "truncated), and static reserves prompt + this, the ODMA papers' Cambricon-vLLM baseline (default: no cap, and "
    "static reserves max_model_len; plan and capacity compare static both ways, at prompt + the power of two that holds "
    "the longest output when this is not given)")]
MaxNumSeqsOption = Annotated[Optional[int], typer.Option(
    "--max-num-seqs", help="most requests in a batch, as vLLM's (default: the engine's on the device: 256; 1,024 "
    "under vllm-v1 on a device of 70 GiB or more other than an A100)")]
MaxNumBatchedTokensOption = Annotated[Optional[int], typer.Option(
    "--max-num-batched-tokens", help="token budget of one iteration, as vLLM's (default: the engine's: vllm-v0 "
    "max(max_model_len, 2048), vllm-v1 8,192 on a device of 70 GiB or more other than an A100, else 2,048)")]
class TypedPath(type(Path())):
    """A Path that keeps the text typed (`typed`): Path('x/') and Path('x/.') are Path('x'), and an
    output so named was written as a file x (core's checks see only the Path)."""

    typed = ""


def output_file(text: str) -> Path:
    """A file output as typed (`parser=` of each option that writes one file; fit's --out is a
    folder): the Path, keeping its text for `check_outputs`, which refuses one that names a
    folder (after the parse, so that a usage error still exits 2 whatever the options' order)."""
    path = TypedPath(text)
    path.typed = text
    return path


def _folder_ending(path: Path) -> str | None:
    """How an output typed as a folder ends ('/', '.' or '..', after its last '/'), or None where it
    was not typed so (`output_file`)."""
    typed = getattr(path, "typed", "")
    last = typed.rsplit("/", 1)[1] if "/" in typed else None
    return (last or "/") if last in ("", ".", "..") else None


# typer.Option's settings for an option that writes one file: `output_file` reads it, shown as <path>
OUTPUT_FILE = {"parser": output_file, "metavar": "<path>"}
MetricsOutOption = Annotated[Optional[Path], typer.Option(
    "--metrics-out", **OUTPUT_FILE, help="write the run's metrics in the Prometheus / OpenMetrics text format (e.g. M.prom)")]


def profile_warnings(device_ref: str) -> list[str]:
    """The warnings of a measured device profile's record of how disturbed its calibration was
    (render/console_profiles.noise_lines), for a command that is about to use it: calibrate and
    `profiles show` say them too, and a replay on such a profile inherits its figures. None for a
    shipped profile, or one that does not load (the command reports that itself)."""
    from odmactl.core.errors import OdmaError
    from odmactl.hw.profiles import load_device
    from odmactl.render.console_profiles import noise_lines

    try:
        profile = load_device(device_ref)
    except OdmaError:
        return []
    if not profile.measured:
        return []
    return [f"device profile {profile.path}: {line}" for line in noise_lines(dict(profile.calibration or {}))]


def warn_of_profile(device_ref: str) -> list[str]:
    """`profile_warnings`, said on stderr before the command's work (cli/app.print_warnings) and
    returned for its JSON's and reports' `warnings`: replay, plan, check and capacity."""
    warned = profile_warnings(device_ref)
    print_warnings(warned)
    return warned
