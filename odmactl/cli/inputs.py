"""What the commands check before any work: flag values that need parsing, policy names, and
outputs that can be written."""

from __future__ import annotations

from pathlib import Path

from odmactl.allocator import ALLOCATORS
from odmactl.core.atomic import check_writable
from odmactl.core.errors import ConfigError, OutputError
from odmactl.core.units import parse_quantity


def parse_map(items: list[str]) -> dict[str, str]:
    """--map canonical=source pairs."""
    mapping = {}
    for item in items:
        canonical, sep, source = item.partition("=")
        if not sep or not canonical.strip() or not source.strip():
            raise ConfigError(f"--map expects canonical=source, got '{item}'")
        mapping[canonical.strip()] = source.strip()
    return mapping


def parse_policies(compare: str | None, policy: str) -> list[str]:
    """--compare's comma-separated policies, else --policy; every name a registered policy, once."""
    policies = [p.strip() for p in compare.split(",") if p.strip()] if compare is not None else [policy]
    if not policies:
        raise ConfigError("--compare names no policy", hint=f"e.g. --compare {','.join(ALLOCATORS)}")
    check_policy_names(policies)
    if len(set(policies)) != len(policies):
        raise ConfigError(f"--compare names a policy twice: {compare}")
    return policies


def check_policy_names(policies: list[str]) -> None:
    for p in policies:
        if p not in ALLOCATORS:
            raise ConfigError(f"unknown policy '{p}' (choose from: {', '.join(ALLOCATORS)})")


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


def check_outputs(outputs: list[Path | None], force: bool, inputs: list[Path | None] = ()) -> None:
    """Every output can be written (and replaced only with --force), before any expensive work; no
    output is an input (not even with --force) or another output."""
    named = [p for p in outputs if p is not None]
    sources = {Path(p).resolve() for p in inputs if p is not None}
    for path in named:
        if path.resolve() in sources:
            raise OutputError("is also an input of this command; writing it would destroy that input", file=path,
                              hint="choose another output path")
        check_writable(path, force=force)
    if len({p.resolve() for p in named}) != len(named):
        raise OutputError("two outputs name the same file", hint="give each output its own path")
