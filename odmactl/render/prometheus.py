"""A run's metrics in the Prometheus / OpenMetrics text format (`--metrics-out M.prom` on replay,
check and capacity), written with prometheus_client so that a team can load a replay beside its
production dashboards (a textfile collector, or `promtool` / any exposition-format reader).

One registry per run; every sample carries `policy` (and capacity's `tp`) as labels, and an
`odmactl_run_info` info metric names the device, model, KV precision and predictor. From a replay
(or check) document, per policy:
- histograms `odmactl_ttft_seconds` and `odmactl_tpot_seconds` of the completed requests
  (sim/metrics.latency_histograms' buckets);
- gauges for KV utilization, pool occupancy, output tokens per second, peak concurrency, the
  overflow and migration rates and the makespan;
- counters for completed, rejected and truncated requests, migrations, migrated bytes,
  preemptions and recomputed tokens, and the allocator's own counts when it keeps some, as
  `odmactl_allocator_<name>`: counters for its running totals (`policy_totals`: s3's escalations,
  unified's evictions and adapter loads, ellm's offloads and fetches), gauges for its levels at
  the end (unified's resident adapters, ellm's peak borrowed bytes);
- the KV runs per request (a gauge), the bytes moved over the host link and the link's time
  (counters) and the link time no compute hid (a gauge).
From a capacity document, per policy and tp: the rate one engine and one device sustain at the
SLO, and the devices the target rate needs (absent where none was found).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily

PREFIX = "odmactl"
# replay metric -> (Prometheus name, help, kind): a gauge's value as the metric gives it, a
# counter's as a running total (prometheus_client adds the _total suffix)
REPLAY_SAMPLES = (
    ("kv_utilization", "kv_utilization_ratio", "KV tokens used over KV tokens reserved, completed requests", "gauge"),
    ("pool_occupancy", "pool_occupancy_ratio", "time-weighted share of the KV pool reserved", "gauge"),
    ("tps", "output_tokens_per_second", "output tokens per second over the makespan", "gauge"),
    ("peak_concurrency", "peak_concurrency_requests", "most requests running at once", "gauge"),
    ("overflow_rate", "overflow_rate_ratio", "(migrations + preemptions) per request", "gauge"),
    ("migration_rate", "migration_rate_ratio", "migrations per request", "gauge"),
    ("makespan_s", "makespan_seconds", "first arrival to last completion", "gauge"),
    ("completed", "completed_requests", "requests completed", "counter"),
    ("rejections", "rejected_requests", "requests rejected (they could never fit)", "counter"),
    ("truncated", "truncated_requests", "outputs cut at max_model_len or max_new_tokens", "counter"),
    ("migrations", "migrations", "blocks moved by a copy", "counter"),
    ("migrated_bytes", "migrated_bytes", "bytes copied by migrations", "counter"),
    ("preemptions", "preemptions", "requests preempted (their KV freed and recomputed)", "counter"),
    ("recomputed_tokens", "recomputed_tokens", "tokens prefilled again after preemptions", "counter"),
    ("kv_runs_per_request", "kv_runs_per_request", "KV runs a completed request is read as (per head, K and V, layer)",
     "gauge"),
    ("host_link_bytes", "host_link_bytes", "bytes moved between host memory and the devices", "counter"),
    ("host_link_time_s", "host_link_seconds", "host-link time of those bytes", "counter"),
    ("link_bottleneck_s", "link_bottleneck_seconds", "host-link time no compute hid", "gauge"),
    # only for the policies that kept a prefix cache (paged, on a trace with prefix hashes)
    ("prefix_hit_rate", "prefix_cache_hit_ratio", "prompt tokens found in the prefix cache over those looked up",
     "gauge"),
    ("prefill_tokens_saved", "prefill_tokens_saved", "prompt tokens taken from the prefix cache, not computed", "counter"),
    ("prefix_evictions", "prefix_cache_evictions", "cached prefix blocks evicted for new ones (hash blocks)", "counter"),
)
CAPACITY_SAMPLES = (
    ("max_rate_per_replica", "capacity_requests_per_second_per_engine", "highest arrival rate one engine serves within the SLO"),
    ("max_rate_per_device", "capacity_requests_per_second_per_device", "that rate over the engine's devices"),
    ("devices_for_target", "devices_for_target", "devices the target rate needs"),
)


class _Collector:
    """The document's samples as metric families (a collector yields them once, on registration
    and on each generate_latest)."""

    def __init__(self, doc: dict, kind: str) -> None:
        self.doc, self.kind = doc, kind

    def collect(self):
        doc = self.doc
        info = InfoMetricFamily(f"{PREFIX}_run", "what the run modelled")
        info.add_metric([], {"command": self.kind, "device": str(doc["device"]), "model": str(doc["model"]),
                             "kv_dtype": str(doc["kv_dtype"]), "predictor": str(doc["predictor"])})
        yield info
        yield from (self._replay() if self.kind != "capacity" else self._capacity())

    def _replay(self):
        results = self.doc["results"]
        for histogram, name, text in (("ttft_s", "ttft_seconds", "time to first token, completed requests"),
                                      ("tpot_s", "tpot_seconds", "time per output token after the first")):
            family = HistogramMetricFamily(f"{PREFIX}_{name}", text, labels=["policy"])
            for policy, r in results.items():
                h = r["latency_histograms"][histogram]
                buckets = [(str(le) if le == "+Inf" else repr(float(le)), count)
                           for le, count in zip(h["le"], h["cumulative"])]
                family.add_metric([policy], buckets, sum_value=h["sum"])
            yield family
        for key, name, text, kind in REPLAY_SAMPLES:
            family_type = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            family = family_type(f"{PREFIX}_{name}", text, labels=["policy"])
            have = [(policy, r["metrics"][key]) for policy, r in results.items()
                    if r["metrics"].get(key) is not None]  # a latency no request had is left out, not 0
            for policy, value in have:
                family.add_metric([policy], float(value))
            if have:
                yield family
        counters: dict[str, list] = {}
        totals: set[str] = set()
        for policy, r in results.items():
            totals.update(r["allocator"].get("policy_totals", ()))
            for key, value in sorted(r["allocator"].get("policy_counters", {}).items()):
                counters.setdefault(key, []).append((policy, value))
        for key, values in sorted(counters.items()):
            if key in totals:  # evictions, offloads, adapter loads, escalations: running totals
                family = CounterMetricFamily(f"{PREFIX}_allocator_{key}", f"the allocator's total: {key}",
                                             labels=["policy"])
            else:
                family = GaugeMetricFamily(f"{PREFIX}_allocator_{key}", f"the allocator's own count at the end: {key}",
                                           labels=["policy"])
            for policy, value in values:
                family.add_metric([policy], float(value))
            yield family

    def _capacity(self):
        for key, name, text in CAPACITY_SAMPLES:
            family = GaugeMetricFamily(f"{PREFIX}_{name}", text, labels=["policy", "tp"])
            for row in self.doc["rows"]:
                if row[key] is not None:
                    family.add_metric([row["policy"], str(row["tp"])], float(row[key]))
            yield family
        cached = [(row, (row.get("metrics_at_capacity") or {}).get("prefix_hit_rate")) for row in self.doc["rows"]]
        if any(hits is not None for _, hits in cached):  # paged with a prefix cache
            family = GaugeMetricFamily(f"{PREFIX}_capacity_prefix_cache_hit_ratio",
                                       "prompt tokens found in the prefix cache at the rate found", labels=["policy", "tp"])
            for row, hits in cached:
                if hits is not None:
                    family.add_metric([row["policy"], str(row["tp"])], float(hits))
            yield family


def metrics_text(doc: dict, kind: str) -> str:
    """The document (`kind` "replay", "check" or "capacity") in the Prometheus text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(doc, kind))
    return generate_latest(registry).decode("utf-8")
