"""`--metrics-out M.prom` (issue 30): a run's metrics in the Prometheus text format, written with
prometheus_client and read back with its parser."""

from __future__ import annotations

import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

DEVICE, MODEL = "mlu370-x4", "DeepSeek-R1-Distill-Qwen-7B"


@pytest.fixture(scope="module")
def trace(conv_sample_head):
    return conv_sample_head(300)


def _families(path) -> dict:
    return {f.name: f for f in text_string_to_metric_families(path.read_text())}


def _sample(family, name: str, **labels) -> float:
    return next(s.value for s in family.samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))


def test_replay_metrics_parse_and_match_the_json(cli, trace, tmp_path):
    prom = tmp_path / "m.prom"
    r = cli("replay", trace, "--device", DEVICE, "--model", MODEL, "--compare", "static,paged,s3", "--predictor",
            "oracle", "--metrics-out", prom, "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    families = _families(prom)
    info = families["odmactl_run_info"]  # an info metric is exposed as a gauge named *_info
    assert _sample(info, "odmactl_run_info", command="replay", device="MLU370-X4") == 1.0
    for policy, result in doc["results"].items():
        m = result["metrics"]
        assert _sample(families["odmactl_kv_utilization_ratio"], "odmactl_kv_utilization_ratio",
                       policy=policy) == pytest.approx(m["kv_utilization"])
        assert _sample(families["odmactl_preemptions"], "odmactl_preemptions_total", policy=policy) == m["preemptions"]
        ttft = families["odmactl_ttft_seconds"]
        assert _sample(ttft, "odmactl_ttft_seconds_count", policy=policy) == m["completed"]
        assert _sample(ttft, "odmactl_ttft_seconds_bucket", policy=policy, le="+Inf") == m["completed"]
        buckets = [s.value for s in ttft.samples if s.name.endswith("_bucket") and s.labels["policy"] == policy]
        assert buckets == sorted(buckets)  # cumulative
    assert families["odmactl_ttft_seconds"].type == "histogram"
    assert families["odmactl_migrations"].type == "counter"
    assert families["odmactl_allocator_escalations"].type == "counter"
    assert _sample(families["odmactl_allocator_escalations"], "odmactl_allocator_escalations_total", policy="s3") >= 0
    again = tmp_path / "again.prom"
    assert cli("replay", trace, "--device", DEVICE, "--model", MODEL, "--compare", "static,paged,s3", "--predictor",
               "oracle", "--metrics-out", again).code == 0
    assert again.read_bytes() == prom.read_bytes()  # deterministic


def test_check_and_capacity_write_metrics(cli, trace, tmp_path):
    config = tmp_path / "c.toml"
    config.write_text("[thresholds]\nmin_utilization = 0.01\n")
    prom = tmp_path / "check.prom"
    r = cli("check", trace, "--config", config, "--device", DEVICE, "--model", MODEL, "--predictor", "oracle",
            "--metrics-out", prom)
    assert r.code == 0, r.err
    assert "odma" in {s.labels.get("policy") for f in _families(prom).values() for s in f.samples}
    prom = tmp_path / "cap.prom"
    r = cli("capacity", trace, "--device", DEVICE, "--model", MODEL, "--predictor", "oracle", "--policies", "paged",
            "--slo", "tpot_p99=500ms", "--metrics-out", prom, "--json")
    assert r.code == 0, r.err
    row = json.loads(r.out)["rows"][0]
    families = _families(prom)
    assert _sample(families["odmactl_capacity_requests_per_second_per_engine"],
                   "odmactl_capacity_requests_per_second_per_engine", policy="paged", tp="1") == \
        pytest.approx(row["max_rate_per_replica"])


def test_metrics_out_is_never_clobbered_or_half_written(cli, trace, tmp_path):
    prom = tmp_path / "m.prom"
    prom.write_text("keep me\n")
    r = cli("replay", trace, "--device", DEVICE, "--model", MODEL, "--policy", "paged", "--metrics-out", prom)
    assert r.code == 1 and "--force" in r.err
    assert prom.read_text() == "keep me\n"
    r = cli("replay", trace, "--device", DEVICE, "--model", MODEL, "--policy", "paged", "--metrics-out", tmp_path)
    assert r.code == 1 and "Traceback" not in r.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.prom"]


def test_the_new_designs_export_evictions_offloads_and_the_host_link(cli, trace, tmp_path):
    """ellm with a host buffer on a small pool (offloads, fetches), unified with adapters (loads)."""
    import polars as pl

    frame = pl.read_parquet(trace).with_columns(pl.Series("tenant", [f"t{i % 3}" for i in range(300)]))
    tenants = tmp_path / "tenants.parquet"
    frame.write_parquet(tenants)
    config = tmp_path / "c.toml"
    config.write_text("[allocator]\nellm_host_buffer_bytes = 8000000000\nellm_borrow_bytes = 0\n")
    prom = tmp_path / "m.prom"
    r = cli("replay", tenants, "--device", DEVICE, "--model", MODEL, "--compare", "paged,ellm,unified", "--predictor",
            "none", "--config", config, "--kv-pool", "600MiB", "--metrics-out", prom, "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    families = _families(prom)
    for name, policy in (("offloads", "ellm"), ("fetched_bytes", "ellm"), ("adapter_loads", "unified"),
                         ("evictions", "unified")):
        family = families[f"odmactl_allocator_{name}"]
        assert family.type == "counter"
        value = _sample(family, f"odmactl_allocator_{name}_total", policy=policy)
        assert value == doc["results"][policy]["allocator"]["policy_counters"][name]
    assert _sample(families["odmactl_allocator_offloads"], "odmactl_allocator_offloads_total", policy="ellm") > 0
    assert _sample(families["odmactl_allocator_adapter_loads"], "odmactl_allocator_adapter_loads_total",
                   policy="unified") >= 3
    assert families["odmactl_allocator_resident_adapters"].type == "gauge"
    for policy in ("ellm", "unified"):
        m = doc["results"][policy]["metrics"]
        assert _sample(families["odmactl_host_link_bytes"], "odmactl_host_link_bytes_total", policy=policy) \
            == m["host_link_bytes"] > 0
        assert _sample(families["odmactl_kv_runs_per_request"], "odmactl_kv_runs_per_request",
                       policy=policy) == pytest.approx(m["kv_runs_per_request"])
