"""The schedulers a replay may run, by name ([scheduler] policy): each decides every iteration's
batch (schedulers/base.py). A scheduler of one's own is added by its module and one
`register_scheduler(TheScheduler)` call."""

from __future__ import annotations

from odmactl.core.errors import ConfigError
from odmactl.sim.schedulers.base import Scheduler
from odmactl.sim.schedulers.fcfs import FcfsScheduler

SCHEDULERS: dict[str, type] = {}
DEFAULT_SCHEDULER = "fcfs"


def register_scheduler(cls: type) -> type:
    """Add a Scheduler subclass under its `name`; returns it (usable as a decorator)."""
    if SCHEDULERS.get(cls.name, cls) is not cls:
        raise ConfigError(f"scheduler '{cls.name}' is registered already ({SCHEDULERS[cls.name].__name__})")
    SCHEDULERS[cls.name] = cls
    return cls


def make_scheduler(name: str) -> Scheduler:
    if name not in SCHEDULERS:
        raise ConfigError(f"unknown scheduler '{name}' (choose from: {', '.join(SCHEDULERS)})", key="policy")
    return SCHEDULERS[name]()


register_scheduler(FcfsScheduler)

__all__ = ["DEFAULT_SCHEDULER", "SCHEDULERS", "Scheduler", "make_scheduler", "register_scheduler"]
