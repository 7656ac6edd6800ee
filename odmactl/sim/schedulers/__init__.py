"""The schedulers a replay may run, by name ([scheduler] policy): each decides every iteration's
batch (schedulers/base.py). A scheduler of one's own is added by its module and one
`register_scheduler(TheScheduler)` call."""

from __future__ import annotations

from odmactl.core.errors import ConfigError
from odmactl.sim.schedulers.base import Scheduler
from odmactl.sim.schedulers.fcfs import FcfsScheduler
from odmactl.sim.schedulers.task_pool import TaskPoolScheduler

SCHEDULERS: dict[str, type] = {}
DEFAULT_SCHEDULER = "fcfs"  # where neither [scheduler] policy nor the KV policy (its `scheduler`) names one


def register_scheduler(cls: type) -> type:
    """Add a Scheduler subclass under its `name` (a non-empty string); returns it (usable as a
    decorator). A name another class holds is refused."""
    if not (isinstance(cls, type) and issubclass(cls, Scheduler)):
        raise ConfigError(f"a scheduler is a subclass of odmactl.sim.schedulers.Scheduler, got {cls!r}")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name.strip() or name != name.strip() or name == Scheduler.name:
        raise ConfigError(f"a scheduler class needs a `name` of its own (a non-empty string), got {name!r}")
    if SCHEDULERS.get(name, cls) is not cls:
        raise ConfigError(f"scheduler '{name}' is registered already ({SCHEDULERS[name].__name__})")
    SCHEDULERS[name] = cls
    return cls


def unregister_scheduler(name: str) -> None:
    if not isinstance(name, str) or name not in SCHEDULERS:
        raise ConfigError(f"no scheduler {name!r} is registered (registered: {', '.join(SCHEDULERS)})")
    del SCHEDULERS[name]


def make_scheduler(name: str) -> Scheduler:
    if name not in SCHEDULERS:
        raise ConfigError(f"unknown scheduler '{name}' (choose from: {', '.join(SCHEDULERS)})", key="policy")
    return SCHEDULERS[name]()


register_scheduler(FcfsScheduler)
register_scheduler(TaskPoolScheduler)

__all__ = ["DEFAULT_SCHEDULER", "SCHEDULERS", "Scheduler", "make_scheduler", "register_scheduler", "unregister_scheduler"]
