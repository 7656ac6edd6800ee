"""`odmactl check`: does a configuration still hold on this trace? The config's tables and the
flags give the thresholds; the checked policy (and the baseline a TPS gain is measured against)
is replayed with the config; each threshold gets a verdict."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from odmactl.core.errors import OdmaError
from odmactl.gate.thresholds import Thresholds, Verdict, evaluate, policies_needed
from odmactl.run.config import read_config
from odmactl.run.replay import run_policies
from odmactl.run.spec import ReplaySpec


@dataclass(frozen=True)
class CheckSetup:
    """What check settles before any work: the config's tables, the merged thresholds (flags over
    the config's [thresholds]) and the policies to replay."""

    tables: dict[str, dict]
    thresholds: Thresholds
    policies: list[str]


@dataclass(frozen=True)
class CheckOutcome:
    doc: dict  # the replay document (run/replay.run_policies)
    verdicts: list[Verdict]
    seconds: float

    @property
    def passed(self) -> bool:
        return all(v.passed for v in self.verdicts)

    def document(self, policy: str, config: Path) -> dict:
        """What `check --json` prints: the verdicts and every replayed policy's metrics."""
        return {"passed": self.passed, "policy": policy, "config": str(config),
                "verdicts": [dataclasses.asdict(v) for v in self.verdicts],
                "metrics": {p: r["metrics"] for p, r in self.doc["results"].items()},
                "mismatches": self.doc["mismatches"],
                "queue": {p: r["queue"] for p, r in self.doc["results"].items()}}


def prepare_check(config: Path, policy: str, flags: dict) -> CheckSetup:
    tables = read_config(config)
    thresholds = Thresholds.merged(tables["thresholds"], flags, config)
    if thresholds.empty:
        raise OdmaError("nothing to check: give a threshold flag or a [thresholds] table in the config",
                        hint="e.g. --min-utilization 0.6 --max-migration-rate 0.005, or --slo ttft_p99=2s")
    return CheckSetup(tables, thresholds, policies_needed(policy, thresholds))


def run_check(frame: pl.DataFrame, spec: ReplaySpec, policy: str, setup: CheckSetup, progress=None,
              started: float | None = None, sustainable=None) -> CheckOutcome:
    """Replay and judge; `started` (perf_counter) is when the check began, for the JUnit time;
    `sustainable` as run_policies takes it (an overloaded policy's rate)."""
    started = time.perf_counter() if started is None else started
    doc = run_policies(frame, setup.policies, spec, progress=progress, tables=setup.tables, sustainable=sustainable)
    verdicts = evaluate(doc, policy, setup.thresholds)
    return CheckOutcome(doc, verdicts, time.perf_counter() - started)
