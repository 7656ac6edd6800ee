"""`odmactl capacity` (issue 27): the bracket holds, replicas are found by replay, the result is
deterministic and independent of the workers, and bad input is a message."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import polars as pl
import pytest

from odmactl.capacity.run import CapacitySpec, capacity
from odmactl.capacity.search import CapacityTarget, failures, served
from odmactl.capacity.slo import Slo
from odmactl.core.errors import ConfigError
from odmactl.run.replay import prepare
from odmactl.run.serving import serving
from odmactl.trace.schema import read_trace

DEVICE = ["--device", "mlu370-x4", "--model", "DeepSeek-R1-Distill-Qwen-7B"]
SLO = "ttft_p99=2s,tpot_p99=100ms"


@pytest.fixture(scope="module")
def small(conv_sample_head):
    return conv_sample_head(400)


def _spec(**kw) -> CapacitySpec:
    base = dict(device="mlu370-x4", model="DeepSeek-R1-Distill-Qwen-7B", predictor="oracle",
                policies=("static", "paged", "odma"), tps=(1, 2), slo=Slo.parse(SLO))
    return CapacitySpec(**{**base, **kw})


def test_the_reported_rate_meets_the_slo_and_a_higher_one_does_not(small):
    """Acceptance 1's bracket: at the reported scale the SLO holds, at 1.05x it does not."""
    frame = read_trace(small)
    spec = _spec()
    doc = capacity(frame, spec)
    target = CapacityTarget(spec.slo, spec.max_migration_rate)
    for row in doc["rows"]:
        setup = serving(spec.device, spec.model, tp=row["tp"])
        ctx, _ = prepare(frame, dataclasses.replace(spec, tp=row["tp"]), setup, policies=spec.policies)
        policy, table = row["replayed_as"]["policy"], row["replayed_as"]["allocator"]
        at = served(ctx, policy, table, row["rate_scale"])
        above = served(ctx, policy, table, row["rate_scale"] * 1.05)
        assert not failures(at, policy, target), row
        assert failures(above, policy, target), row
        assert row["next_rate_scale"] / row["rate_scale"] <= 1.02 and row["monotone"]
        # devices for the target: found by replaying with that many replicas, and one fewer fails
        replicas = row["replicas_for_target"]
        scale = doc["target_rate_per_s"] / doc["trace"]["mean_rate_per_s"]
        assert not failures(served(ctx, policy, table, scale, replicas, spec.routers[0]), policy, target)
        if replicas > 1:
            assert failures(served(ctx, policy, table, scale, replicas - 1, spec.routers[0]), policy, target)
        assert row["devices_for_target"] == replicas * row["tp"]


def test_the_gate_rate_is_written_as_printed_holds_and_check_passes_there(cli, small):
    """gate_rate: the highest rate written to three significant digits at which one engine meets
    the SLO, from the rate found as the table prints it (rounded) down 1% a try (cut); each rate
    tried before it broke, and `check --rate` at it passes, since check replays the one engine
    capacity did."""
    from odmactl.core.units import floor_sig3, round_sig3
    from odmactl.render.console_replay import gate_lines

    frame = read_trace(small)
    spec = _spec(policies=("paged", "odma"), tps=(1,))
    doc = capacity(frame, spec)
    target = CapacityTarget(spec.slo, spec.max_migration_rate)
    setup = serving(spec.device, spec.model)
    ctx, _ = prepare(frame, spec, setup, policies=spec.policies)
    mean = doc["trace"]["mean_rate_per_s"]
    for row in doc["rows"]:
        gate, tried = row["gate_rate_per_replica"], row["gate_rates_tried"]
        assert gate is not None and tried[-1] == gate and floor_sig3(gate) == gate
        assert tried[0] == round_sig3(row["max_rate_per_replica"]) and all(a > b for a, b in zip(tried, tried[1:]))
        policy, table = row["replayed_as"]["policy"], row["replayed_as"]["allocator"]
        for rate in tried:
            assert bool(failures(served(ctx, policy, table, rate / mean), policy, target)) == (rate != gate), rate
    # a row whose rate as printed did not hold says so, and check at the gate rate passes
    gated = {"max_rate_per_replica": 0.34544, "gate_rate_per_replica": 0.341, "gate_rates_tried": [0.345, 0.341],
             "policy": "odma", "tp": 1, "replayed_as": {"policy": "odma", "allocator": {}}}
    held = {**gated, "max_rate_per_replica": 0.3412, "gate_rates_tried": [0.341]}
    assert gate_lines({"rows": [held]}) == []
    assert gate_lines({"rows": [gated, held]}) == [
        "to gate one engine with check, give odma tp 1: --policy odma --rate 0.341 (req/s): the SLO broke at this "
        "row's rate as printed, just below the rate found (at its edge it is not monotone in the rate); the other "
        "rows' rates held as printed; --json: gate_rate_per_replica, gate_rates_tried"]
    assert "no rate as printed" in gate_lines({"rows": [{**gated, "gate_rate_per_replica": None}]})[0]
    # the flags check needs: static at prompt + N is --policy static --max-new-tokens N, and the tp;
    # drawn arrivals are not check's
    plus = gate_lines({"rows": [{**gated, "policy": "static+1024", "tp": 4, "replayed_as": {
        "policy": "static", "allocator": {"static_slot": "prompt_plus_max_new", "max_new_tokens": 1024}}}]})[0]
    assert "give static+1024 tp 4: --policy static --max-new-tokens 1024 --tp 4 --rate 0.341 (req/s)" in plus
    assert gate_lines({"rows": [gated], "arrivals": {"process": "poisson"}}) == []
    row = doc["rows"][1]
    config = small.parent / "odma_defaults.toml"  # odma at its defaults, as capacity replayed it
    config.write_text("[allocator]\n")
    args = ["check", small, "--config", config, *DEVICE, "--policy", "odma", "--predictor", "oracle", "--slo", SLO,
            "--rate", str(row["gate_rate_per_replica"])]
    r = cli(*args)
    assert r.code == 0, r.out + r.err


def test_replicas_split_the_requests_round_robin_and_pool_the_percentiles(small):
    frame = read_trace(small)
    spec = _spec()
    ctx, _ = prepare(frame, spec, serving(spec.device, spec.model), policies=("paged",))
    one, three = served(ctx, "paged", {}, 2.0, 1), served(ctx, "paged", {}, 2.0, 3)
    assert one["requests"] == three["requests"] == frame.height
    assert three["ttft_p99"] <= one["ttft_p99"]  # a third of the load per engine queues less
    parts = [ctx.workload.replica(r, 3) for r in range(3)]
    assert sorted(sum((p.request_ids for p in parts), [])) == sorted(ctx.workload.request_ids)
    assert np.array_equal(ctx.workload.at_rate_scale(2.0).arrival_ps, np.round(ctx.workload.arrival_ps / 2.0))


def test_the_result_is_byte_identical_and_independent_of_workers(cli, small, tmp_path):
    args = ["capacity", small, *DEVICE, "--slo", SLO, "--predictor", "oracle", "--tp", "1,2", "--json"]
    one = cli(*args)
    again = cli(*args)
    two = cli(*args, "--workers", "2")
    assert one.code == 0, one.err
    assert one.out == again.out == two.out
    doc = json.loads(one.out)
    papers = next(r["policy"] for r in doc["rows"] if r["policy"].startswith("static+"))  # prompt + max_new_tokens
    assert {(r["policy"], r["tp"]) for r in doc["rows"]} == {(p, t) for p in ("static", papers, "paged", "s3", "odma")
                                                              for t in (1, 2)}
    for r in doc["rows"]:  # tok/s per device is its req/s times the output tokens a request yields, not a makespan's
        if r["max_rate_per_device"] is None:
            continue
        m = r["metrics_at_capacity"]
        assert r["output_tps_per_device"] == pytest.approx(r["max_rate_per_device"] * m["generated_tokens"]
                                                           / m["requests"], rel=1e-12)


def test_the_console_table_and_the_plot(cli, small, tmp_path):
    plot = tmp_path / "c.png"
    r = cli("capacity", small, *DEVICE, "--slo", SLO, "--predictor", "oracle", "--policies", "static,paged",
            "--plot", plot, "--out", tmp_path / "c.json", "--report", tmp_path / "c.html")
    assert r.code == 0, r.err
    assert "engine" in r.out and "target" in r.out and "static tp 1" in r.out and "paged tp 1" in r.out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (tmp_path / "c.html").read_text()
    assert "static tp 1" in report and "data:image/png;base64," in report and "req/s per engine" in report
    assert json.loads((tmp_path / "c.json").read_text())["slo"] == {"ttft_p99": 2.0, "tpot_p99": 0.1}
    # which router found the devices, in the JSON, the console and the report
    assert json.loads((tmp_path / "c.json").read_text())["routers"] == ["least-kv"]
    assert "least-kv router" in " ".join(r.out.split()) and "behind the least-kv router" in report


@pytest.mark.parametrize("args, words", [
    (["--slo", "ttft_p95=2s"], ("unknown metric 'ttft_p95'",)),
    (["--slo", "ttft_p99=2"], ("--slo ttft_p99", "a time such as")),
    (["--slo", "ttft_p99=2 GB"], ("--slo ttft_p99", "unit of bytes")),
    (["--slo", "ttft_p99=0s"], ("--slo ttft_p99: expected a time from 1 ms",)),
    (["--slo", "ttft_p99"], ("METRIC=TIME",)),
    (["--slo", SLO, "--tp", "0"], ("--tp", "from 1")),
    (["--slo", SLO, "--tp", "1,1"], ("--tp names '1' twice: give distinct sizes",)),
    (["--slo", SLO, "--tp", ",".join(["1", "2"] * 2000)], ("--tp names '1' twice",)),
    (["--slo", SLO, "--tp", "a"], ("comma-separated whole numbers",)),
    (["--slo", SLO, "--tp", "8"], ("--tp 8 cannot split", "--tp 1, 2, 4 can")),
    (["--slo", SLO, "--target-rate", "0"], ("--target-rate",)),
    (["--slo", SLO, "--target-rate", "1000", "--max-replicas", "2"], ("no policy serves 1,000.000 req/s",
                                                                       "2 engines behind the least-kv router")),
    (["--slo", SLO, "--target-rate", "1000", "--max-replicas", "2", "--router", "least-kv,round-robin"],
     ("2 engines behind any of least-kv, round-robin",)),
    (["--slo", SLO, "--max-replicas", "0"], ("--max-replicas",)),
    (["--slo", SLO, "--target-rate", "1e-9"], ("--target-rate", "outside the rates")),
    (["--slo", SLO, "--target-rate", "1e12"], ("--target-rate", "outside the rates")),
    (["--slo", SLO, "--policies", "static,static"], ("--policies names 'static' twice",)),
    (["--slo", "ttft_p99=1ms"], ("no policy meets the SLO", "ttft_p99 =", "even at")),
    (["--slo", "ttft_p99=0.5ms"], ("expected a time from 1 ms to 1,000,000,000 s, got '0.5ms'",)),
    (["--slo", SLO, "--router", "random"], ("--router expects one of round-robin, least-outstanding",)),
    (["--slo", SLO, "--router", "round-robin-redy"], ("round-robin-ready", "did you mean 'round-robin-ready'")),
    (["--slo", SLO, "--router", "least-kv,least-kv"], ("--router names 'least-kv' twice",)),
    (["--slo", SLO, "--router", "least-kv,round-robin-redy"], ("did you mean 'round-robin-ready'",)),
    (["--slo", SLO, "--router", " , "], ("--router names no router",)),
    (["--slo", SLO, "--engine", "vllm-v3"], ("--engine expects one of vllm-v0, vllm-v1",)),
    (["--slo", SLO, "--arrivals", "bursty"], ("--arrivals expects one of trace, poisson, gamma:CV",)),
    (["--slo", SLO, "--arrivals", "gamma:0"], ("--arrivals gamma:CV", "coefficient of variation")),
    (["--slo", SLO, "--arrivals", "gamma:x"], ("--arrivals gamma:CV",)),
    (["--slo", SLO, "--arrivals", "gamma:1e-200"], ("--arrivals gamma:CV", "from 0.01 to 100")),
    (["--slo", SLO, "--arrivals", "poisson", "--seed", "-1"], ("seed",)),
    (["--slo", "ttft_p99=50ms"], ("no policy meets the SLO", "ttft_p99 alone is", "the longest prompt")),
])
def test_bad_input_is_one_message(cli, small, tmp_path, args, words):
    policies = [] if "--policies" in args else ["--policies", "static"]
    r = cli("capacity", small, *DEVICE, "--predictor", "oracle", *policies, *args, "--out", tmp_path / "c.json")
    assert r.code == 1, r.err
    assert all(w in " ".join(r.err.split()) for w in words), r.err
    assert "Traceback" not in r.err and len(r.err.strip().splitlines()) == 1
    assert not (tmp_path / "c.json").exists()


def test_an_offline_trace_has_no_rate_to_scale(cli, tmp_path):
    import polars as pl

    src = tmp_path / "a.csv"
    pl.DataFrame({"prompt_tokens": [100] * 5, "output_tokens": [10] * 5}).write_csv(src)
    assert cli("ingest", src, "--out", tmp_path / "t.parquet", "--offline").code == 0
    r = cli("capacity", tmp_path / "t.parquet", *DEVICE, "--slo", SLO, "--predictor", "oracle")
    assert r.code == 1 and "all of its requests arrive at once" in r.err


def test_the_slo_parser():
    slo = Slo.parse("ttft_p99=2s, tpot_p99=100ms")
    assert slo.limits_s == (("ttft_p99", 2.0), ("tpot_p99", 0.1))
    assert slo.failures({"ttft_p99": 3.0, "tpot_p99": 0.05}) == [("ttft_p99", 3.0, 2.0)]
    with pytest.raises(ConfigError, match="twice"):
        Slo.parse("ttft_p99=1s,ttft_p99=2s")


def test_ray_gives_the_same_result(cli, small):
    ray = pytest.importorskip("ray", reason="the ray extra is not installed")
    args = ["capacity", small, *DEVICE, "--slo", SLO, "--predictor", "oracle", "--policies", "static,paged", "--json"]
    try:
        local = cli(*args)
        remote = cli(*args, "--executor", "ray")
    finally:
        from odmactl.run.executors import close_ray

        close_ray()  # what the CLI's exit does: the instance, its processes and its temporary folder go
        ray.shutdown()
    assert local.code == remote.code == 0, remote.err
    assert local.out == remote.out


def test_plan_can_choose_by_capacity_at_the_slo(cli, conv_sample_head, tmp_path):
    """plan --objective capacity: every replayed candidate gets its sustainable rate by bisection,
    and the pick is the highest among those that keep the constraints."""
    trace = conv_sample_head(1500)
    r = cli("plan", trace, *DEVICE, "--predictor", "oracle", "--objective", "capacity", "--slo", SLO,
            "--out", tmp_path / "c.toml", "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    replays = doc["search"]["replays"]
    assert all(rep["measured"]["capacity_rate_scale"] > 0 for rep in replays)
    chosen = next(rep for rep in replays if rep["label"] == doc["chosen"]["label"])
    if doc["constraints_met_on_search"]:
        feasible = [rep for rep in replays if rep["measured"]["overflow_rate"] <= 0.005]
        assert chosen["measured"]["capacity_rate_scale"] == max(rep["measured"]["capacity_rate_scale"]
                                                                for rep in feasible)
    assert 'objective = "capacity"' in (tmp_path / "c.toml").read_text()


@pytest.mark.parametrize("args, words", [
    (["--objective", "capacity"], "needs --slo"),
    (["--slo", SLO], "--slo applies to --objective capacity"),
])
def test_plan_capacity_flags_go_together(cli, small, tmp_path, args, words):
    r = cli("plan", small, *DEVICE, "--predictor", "oracle", *args, "--out", tmp_path / "c.toml")
    assert r.code == 1 and words in r.err, r.err


def test_a_loose_slo_is_bounded_by_the_queue_growing(cli, small):
    """An SLO that holds at every rate still stops where the queue grows through the run: the
    rate above the one reported fails with "overloaded" and no other limit."""
    r = cli("capacity", small, *DEVICE, "--predictor", "oracle", "--policies", "static", "--slo", "ttft_p99=1e9s",
            "--json")
    assert r.code == 0, r.err
    row = json.loads(r.out)["rows"][0]
    assert not row["unbounded"] and row["rate_scale"] < row["next_rate_scale"] < 2.0 ** 20
    above = next(p for p in row["probes"] if p["rate_scale"] == row["next_rate_scale"])
    assert [f[0] for f in above["failures"]] == ["overloaded"]
    assert not row["metrics_at_capacity"]["overloaded"]


def test_plan_by_capacity_flags_an_slo_no_candidate_meets_and_refuses_an_offline_trace(cli, small, tmp_path):
    import polars as pl

    r = cli("plan", small, *DEVICE, "--predictor", "oracle", "--objective", "capacity", "--slo", "ttft_p99=1ms",
            "--out", tmp_path / "c.toml", "--json")
    assert r.code == 1 and "no config written" in r.err and not (tmp_path / "c.toml").exists(), r.err
    doc = json.loads(r.out)
    assert doc["constraints_met_on_search"] is False and doc["out"] is None
    offline = tmp_path / "off.parquet"
    pl.read_parquet(small).with_columns(pl.lit(0.0).alias("arrival_s")).write_parquet(offline)
    r = cli("plan", offline, *DEVICE, "--predictor", "oracle", "--objective", "capacity", "--slo", SLO,
            "--out", tmp_path / "d.toml")
    assert r.code == 1 and "arrive at once" in r.err and not (tmp_path / "d.toml").exists()


def test_an_interconnect_latency_past_a_millisecond_is_refused(tmp_path):
    from conftest import ROOT

    from odmactl.core.errors import ProfileError
    from odmactl.hw.profiles import read_device

    text = (ROOT / "profiles" / "devices" / "a100-80gb-sxm.toml").read_text()
    bad = tmp_path / "lat.toml"
    bad.write_text(text.replace('base_latency = { value = "6.6 us"', 'base_latency = { value = "1e30 s"'))
    with pytest.raises(ProfileError, match="interconnect.base_latency"):
        read_device(bad)


def test_arrival_processes_keep_the_mean_rate_and_are_seeded(small):
    from odmactl.run.arrivals import parse_arrivals, with_arrivals

    frame = read_trace(small)
    spec = _spec()
    ctx, _ = prepare(frame, spec, serving(spec.device, spec.model), policies=("paged",))
    w = ctx.workload
    assert with_arrivals(w, "trace", None, 0) is w
    for kind, cv in (("poisson", None), ("gamma", 0.5), ("gamma", 3.0)):
        a = with_arrivals(w, kind, cv, 7)
        assert np.array_equal(a.arrival_ps, with_arrivals(w, kind, cv, 7).arrival_ps)  # seeded
        assert not np.array_equal(a.arrival_ps, with_arrivals(w, kind, cv, 8).arrival_ps)
        gaps = np.diff(a.arrival_ps).astype(float)
        mean = (w.arrival_ps[-1] - w.arrival_ps[0]) / (w.size - 1)
        assert (gaps >= 0).all() and a.request_ids == w.request_ids
        assert gaps.mean() == pytest.approx(mean, rel=1e-6)  # scaled to the trace's span: its mean rate, any seed
        assert a.arrival_ps[0] == w.arrival_ps[0] and a.arrival_ps[-1] == w.arrival_ps[-1]
        assert gaps.std() / gaps.mean() == pytest.approx(1.0 if cv is None else cv, rel=0.3)
    assert parse_arrivals("Gamma:2") == ("gamma", 2.0) and parse_arrivals("poisson") == ("poisson", None)


def test_the_command_says_the_arrivals_and_poisson_smooths_the_bursts(cli, small, tmp_path):
    docs = {}
    for arrivals in ("trace", "poisson"):
        r = cli("capacity", small, *DEVICE, "--slo", SLO, "--predictor", "oracle", "--policies", "paged",
                "--arrivals", arrivals, "--json")
        assert r.code == 0, r.err
        docs[arrivals] = json.loads(r.out)
    assert docs["trace"]["arrivals"]["process"] == "trace" and "bursts kept" in docs["trace"]["arrivals"]["label"]
    assert docs["poisson"]["arrivals"]["label"].startswith("exponential (Poisson) gaps")
    assert docs["trace"]["target_rate_per_s"] == docs["poisson"]["target_rate_per_s"]  # one target, two processes
    assert docs["trace"]["rows"][0]["probes"] != docs["poisson"]["rows"][0]["probes"]
    assert docs["poisson"]["arrivals"]["seed"] == 0 and docs["trace"]["arrivals"]["seed"] is None
    spelled = json.loads(cli("capacity", small, *DEVICE, "--slo", SLO, "--predictor", "oracle", "--policies", "paged",
                             "--arrivals", "GAMMA:2.0", "--json").out)
    assert spelled["arrivals"]["process"] == "gamma:2"  # one spelling in the JSON, whatever was typed


def test_the_zero_load_floor_is_each_request_alone():
    import polars as pl

    from odmactl.capacity.binds import floor_cause, near_floor, zero_load
    from odmactl.hw.cost import KvLayout

    frame = pl.DataFrame({"request_id": ["a", "b", "c"], "arrival_s": [0.0, 1.0, 2.0],
                          "prompt_tokens": pl.Series([100, 4000, 900], dtype=pl.Int32),
                          "output_tokens": pl.Series([11, 1, 101], dtype=pl.Int32),
                          "prompt_text": [None] * 3, "model": [None] * 3, "tenant": [None] * 3})
    spec = _spec(tps=(1,))
    setup = serving(spec.device, spec.model)
    ctx, _ = prepare(frame, spec, setup, policies=("paged",))
    floor = zero_load(ctx)
    cost = setup.cost
    ttft = [cost.prefill.seconds(p, p * p, 1) for p in (100, 4000, 900)]
    step = cost.step_coefficients(KvLayout.contiguous(), max_batch=1)  # the cheapest read: a lower bound
    tpot = [step.step_ps([100 + 5]) / 1e12, step.step_ps([900 + 50]) / 1e12]  # b has one token: no TPOT
    assert floor["ttft_p99"] == pytest.approx(np.percentile(ttft, 99))
    assert floor["ttft_p50"] == pytest.approx(ttft[2])
    assert floor["tpot_p99"] == pytest.approx(np.percentile(tpot, 99))
    assert floor["longest_prompt_tokens"] == 4000 and floor["longest_prefill_s"] == pytest.approx(ttft[1])
    limit = floor["ttft_p99"] * 1.1
    assert near_floor(floor, (("ttft_p99", limit), ("tpot_p99", 10.0))) == ["ttft_p99"]  # within 20%
    assert near_floor(floor, (("ttft_p99", floor["ttft_p99"] * 1.3),)) == []
    said = floor_cause(floor, (("ttft_p99", floor["ttft_p99"] / 2),), chunked=False)
    assert "ttft_p99 alone is" in said and "4,000 tokens" in said
    said = floor_cause(floor, (("tpot_p99", floor["tpot_p99"] / 2),), chunked=True)
    assert "tpot_p99 alone is" in said and "batch-1 decode step" in said and "prefills" not in said
    said = floor_cause(floor, (("ttft_p99", 100.0),), chunked=False)
    assert "queueing" in said and "--engine vllm-v1" in said and "--arrivals poisson" in said


def test_a_limit_near_its_floor_is_warned_of(cli, small):
    from odmactl.capacity.binds import zero_load

    frame = read_trace(small)
    spec = _spec(tps=(1,))
    ctx, _ = prepare(frame, spec, serving(spec.device, spec.model), policies=("paged",))
    near = zero_load(ctx)["ttft_p99"] * 1.15
    r = cli("capacity", small, *DEVICE, "--slo", f"ttft_p99={near}s", "--predictor", "oracle", "--policies", "paged")
    text = " ".join(r.out.split())
    assert "warning: tp 1: the ttft_p99 limit" in text and "is only 1.15x its zero-load floor" in text
    r = cli("capacity", small, *DEVICE, "--slo", f"ttft_p99={near}s", "--predictor", "oracle", "--policies", "paged",
            "--json")  # the JSON lists the warning, and stderr gives it beside the JSON
    said = [w for w in json.loads(r.out)["warnings"] if "x its zero-load floor" in w]
    assert len(said) == 1 and said[0].startswith("tp 1: the ttft_p99 limit") and said[0] in " ".join(r.err.split())
    r = cli("capacity", small, *DEVICE, "--slo", SLO, "--predictor", "oracle", "--policies", "paged", "--json")
    assert json.loads(r.out)["rows"][0]["near_floor"] == []
    assert not [w for w in json.loads(r.out)["warnings"] if "zero-load floor" in w]
    under = zero_load(ctx)["ttft_p99"] * 0.9  # under the floor: said as such, not as "within 20%"
    r = cli("capacity", small, *DEVICE, "--slo", f"ttft_p99={under}s", "--predictor", "oracle", "--policies", "paged",
            "--tp", "1,2")
    if r.code == 0:
        assert "is under its zero-load floor" in " ".join(r.out.split())


def test_the_headline_names_the_cheapest_row_its_ties_and_savings(cli, small):
    from odmactl.capacity.binds import headline

    def row(policy, tp, devices, rate=1.0):
        return {"policy": policy, "tp": tp, "devices_for_target": devices, "replicas_for_target": None if devices is None else devices // tp,
                "max_rate_per_replica": rate, "router": "least-kv"}

    rows = [row("static", 1, 12), row("static+1024", 1, 8), row("paged", 1, 9), row("odma", 1, 7),
            row("s3", 2, 8), row("odma", 2, 8), row("paged", 2, 7, 2.0), row("static", 2, None)]
    h = headline(rows)
    # odma tp 1 and paged tp 2 both need 7 devices: paged's 3 engines of tp 2 (7 // 2 here) are fewer
    assert (h["devices"], h["policy"], h["tp"]) == (7, "paged", 2) and h["ties"] == ["odma tp 1"]
    assert h["vs_static"] == {"policy": "static+1024", "tp": 1, "devices": 8, "saved": 1, "router": "least-kv"}
    assert h["vs_paged"] == {"policy": "paged", "tp": 2, "devices": 7, "saved": 0, "router": "least-kv"}
    assert headline([row("paged", 1, None)]) is None
    r = cli("capacity", small, *DEVICE, "--slo", SLO, "--predictor", "oracle", "--policies", "static,paged",
            "--tp", "1,2", "--json")
    doc = json.loads(r.out)
    fewest = min(x["devices_for_target"] for x in doc["rows"] if x["devices_for_target"])
    assert doc["headline"]["devices"] == fewest
    text = " ".join(cli("capacity", small, *DEVICE, "--slo", SLO, "--predictor", "oracle", "--policies",
                        "static,paged", "--tp", "1,2").out.split())
    assert f"cheapest for {doc['target_rate_per_s']:,.3g} req/s: {fewest} x MLU370-X4" in text
    assert "memory" in text and "breaks first" in text and "the rate per engine is one engine on the whole trace" in text
    assert "at the target on" in text and "under its limit" in text  # the headline's latency at the target
    assert "engines x" in text or "engine x" in text or "one engine meets the SLO at no rate" in text


def test_stats_and_capacity_use_one_busiest_window(cli, small):
    r = cli("stats", small, "--json")
    busiest = json.loads(r.out)["busiest_10min_rate_per_s"]
    doc = json.loads(cli("capacity", small, *DEVICE, "--slo", SLO, "--predictor", "oracle", "--policies", "paged",
                         "--json").out)
    assert doc["trace"]["peak_10min_rate_per_s"] == busiest == doc["target_rate_per_s"]


def test_rates_are_never_rounded_to_zero():
    from odmactl.render.metrics import format_metric

    assert format_metric("max_rate_per_device", 0.0023456) == "0.00235"
    assert format_metric("max_rate_per_replica", 0.107295) == "0.107"
    assert format_metric("output_tps_per_device", 0.0912) == "0.0912"
    assert format_metric("output_tps_per_device", 1234.4) == "1,234"
    assert format_metric("max_rate_per_replica", 1_048_576_000_000.0) == "1.05e+12"



@pytest.mark.parametrize("replicas, rate, said", [
    (4, 0.715, "R engines carry more than R times one engine's rate"),  # 2.86 < 4.56
    (1, 10.3, "the target rounded up to whole engines"),
    (3, 2.4, "one engine fewer does not absorb"),  # 2 x 2.4 = 4.8 >= 4.56, yet 3 engines
    (5, None, "one engine meets the SLO at no rate, yet 5 engines carry the target"),
])
def test_the_headline_says_why_engines_times_rate_is_not_the_target(replicas, rate, said):
    from odmactl.render.console_replay import headline_detail

    row = {"policy": "paged", "tp": 2, "replicas_for_target": replicas, "max_rate_per_replica": rate,
           "metrics_at_target": {"ttft_p99": 1.5, "tpot_p99": 0.05}}
    doc = {"headline": {"policy": "paged", "tp": 2}, "rows": [row], "target_rate_per_s": 4.56,
           "slo": {"ttft_p99": 2.0, "tpot_p99": 0.1}}
    lines = headline_detail(doc)
    assert "ttft_p99 1.500 s (25% under its limit)" in lines[0] and "tpot_p99 50.0 ms (50% under its limit)" in lines[0]
    assert said in lines[1]


def test_an_slo_on_p50s_is_shown_by_its_own_terms(cli, small, tmp_path):
    """An SLO on p50s was reported with p99 figures (the headline's 'tpot_p99 75.5 ms' beside a
    71 ms p50 limit looked like a violation; the table's columns were the p99s)."""
    r = cli("capacity", small, *DEVICE, "--slo", "ttft_p50=2s,tpot_p50=100ms", "--predictor", "oracle", "--policies",
            "paged", "--tp", "2", "--markdown", tmp_path / "c.md")
    text = " ".join(r.out.split())
    assert r.code == 0 and "ttft_p50" in text, r.err
    detail = text[text.index("at the target on"):].split(" engines:")[1].split("under its limit)")[:2]
    assert "ttft_p50" in detail[0] and "tpot_p50" in detail[1] and "p99" not in "".join(detail), detail
    header = next(line for line in (tmp_path / "c.md").read_text().splitlines() if line.startswith("| policy"))
    assert "TTFT p50 (s)" in header and "TPOT p50 (ms)" in header and "p99" not in header, header
    # the plot (and the HTML report's) draws the p50s its probes now record, with the limits
    import matplotlib.pyplot as plt

    from odmactl.render.plots import capacity_figure

    doc = json.loads(cli("capacity", small, *DEVICE, "--slo", "ttft_p50=2s,tpot_p50=100ms", "--predictor", "oracle",
                         "--policies", "paged", "--tp", "2", "--json").out)
    fig = capacity_figure(doc)
    try:
        assert [ax.get_title() for ax in fig.axes] == ["tp 2: TTFT p50 (s)", "tp 2: TPOT p50 (s)"]
        assert all(p["ttft_p50"] is not None for p in doc["rows"][0]["probes"])
    finally:
        plt.close(fig)


@pytest.mark.parametrize("case, args, said", [
    ("every request rejected", ["--max-model-len", "2"],
     "300 of 300 requests are rejected at any rate (300 with a prompt at or past max_model_len); a rate is reported "
     "only when at most 10% are"),
    ("297 of 300 rejected", ["--max-model-len", "PICK"], "requests are rejected at any rate"),
    ("a two-request trace", ["--limit", "2"], "all 2 requests complete; a rate is reported only from at least 50"),
])
def test_no_rate_from_too_few_served_requests(cli, conv_sample_head, case, args, said):
    """Issue 40: an all-rejected trace reported 3,731,138 req/s per engine, a two-request one 243,031;
    a rate now needs 50 completed requests and at most 10% rejected, and the message names the cause."""
    trace = conv_sample_head(300)
    if "PICK" in args:  # a max_model_len that only the three shortest prompts fit under
        prompts = sorted(read_trace(trace)["prompt_tokens"].to_list())
        args = ["--max-model-len", str(prompts[2] + 2)]
    if "--limit" in args:
        trace = conv_sample_head(2)
        args = []
    r = cli("capacity", trace, *DEVICE, "--slo", SLO, "--policies", "paged", *args)
    assert r.code == 1 and said in r.err and "Traceback" not in r.err, r.err
    assert "req/s per engine" not in r.out


def test_more_engines_than_requests_is_never_tried(cli, conv_sample_head):
    """Issue 40: --target-rate 1000 on 50 requests asked for more engines than requests (IndexError)."""
    r = cli("capacity", conv_sample_head(60), *DEVICE, "--slo", "ttft_p99=2s", "--policies", "paged",
            "--target-rate", "1000", "--json")
    assert r.code == 0, r.err
    row = json.loads(r.out)["rows"][0]
    assert 1 <= row["replicas_for_target"] <= 60


def test_capacity_says_where_the_slo_binds_not_the_queue_and_writes_markdown(cli, small, tmp_path):
    """Issue 39: plan and replay say a run keeps up at a rate (its queue stops growing); capacity
    reports that rate per row beside the SLO's, and says so where the SLO binds below it."""
    md = tmp_path / "c.md"
    r = cli("capacity", small, *DEVICE, "--slo", SLO, "--predictor", "oracle", "--policies", "paged,odma",
            "--markdown", md, "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    from odmactl.capacity.search import served
    from odmactl.render.console_replay import queue_lines

    binding = []
    for row in doc["rows"]:
        keeps, slo = row["keeps_up_rate_per_replica"], row["max_rate_per_replica"]
        assert keeps is not None and keeps > 0
        if slo is None or keeps > (1 + doc["tolerance"]) * slo:
            binding.append(row["policy"])
    lines = queue_lines(doc)
    assert binding and len(lines) == 1 and "the SLO binds, not the queue" in lines[0]
    assert all(f"{name} " in lines[0] for name in binding)
    text = md.read_text()
    assert text.startswith("### odmactl capacity\n\n**cheapest for ") and "| paged tp 1 |" in text
    assert "- tp 1: the SLO binds, not the queue" in text
    # the queue's rate is the one replay reports: sustainable_scale's, at which the queue keeps up
    from odmactl.capacity.search import sustainable_scale

    frame = read_trace(small)
    spec = _spec(policies=("paged",), tps=(1,))
    ctx, _ = prepare(frame, spec, serving(spec.device, spec.model), policies=("paged",))
    row = next(r for r in doc["rows"] if r["policy"] == "paged" and r["tp"] == 1)
    scale = row["keeps_up_rate_per_replica"] / doc["trace"]["mean_rate_per_s"]
    assert abs(sustainable_scale(ctx, "paged", {})["rate_scale"] / scale - 1) < 1e-9
    assert not served(ctx, "paged", {}, scale)["falling_behind"]


def test_a_trace_longer_than_the_replay_clock_is_named_as_such(cli, small, tmp_path):
    """A red team's case (issue 40): it blamed a --target-rate nobody gave, with a range printed backwards."""
    import polars as pl

    trace = tmp_path / "span.parquet"
    pl.read_parquet(small).with_columns(pl.col("arrival_s") * 1e12).write_parquet(trace)
    r = cli("capacity", trace, *DEVICE, "--slo", "ttft_p99=2s", "--policies", "paged")
    assert r.code == 1 and "the trace's arrivals span" in r.err and "--target-rate" not in r.err, r.err


def test_a_device_file_as_the_trace_is_named_as_such(cli):
    """A red team's case (issue 40): /dev/null as the trace was reported as missing."""
    r = cli("capacity", "/dev/null", *DEVICE, "--slo", "ttft_p99=2s")
    assert r.code == 1 and "/dev/null: is not a regular file" in r.err, r.err


def test_a_replayed_peak_far_from_the_target_is_said(cli, small, tmp_path):
    """A red team's case (issue 40): 300 requests in a burst, then one 5,000 s later; the target
    (a mean rate) compresses the whole trace, burst included, and the output now says how fast the
    replayed trace's own busiest 10 minutes arrive."""
    frame = pl.read_parquet(small)
    last = frame.tail(1).with_columns(pl.col("arrival_s") + 5_000.0, pl.lit("late").alias("request_id"))
    trace = tmp_path / "gap.parquet"
    pl.concat([frame, last.select(frame.columns)]).write_parquet(trace)
    out = tmp_path / "c.json"
    r = cli("capacity", trace, *DEVICE, "--slo", SLO, "--predictor", "oracle", "--policies", "paged", "--out", out)
    assert r.code == 0, r.err
    doc = json.loads(out.read_text())
    replayed = doc["target_replay_peak_10min_rate_per_s"]
    assert replayed > 1.25 * doc["target_rate_per_s"]
    assert f"busiest 10 minutes arrive at {replayed:,.3g} req/s" in " ".join(r.out.split())


def test_the_replayed_peak_line_is_only_said_when_far_off():
    from odmactl.render.console_replay import headline_detail

    row = {"policy": "paged", "tp": 1, "replicas_for_target": 2, "max_rate_per_replica": 1.0, "metrics_at_target": {}}
    doc = {"headline": {"policy": "paged", "tp": 1}, "rows": [row], "target_rate_per_s": 2.0, "slo": {},
           "trace": {"peak_10min_rate_per_s": 3.0, "mean_rate_per_s": 1.0}}
    for replayed, said in ((2.4, False), (2.6, True), (1.5, True), (1.7, False)):
        lines = headline_detail({**doc, "target_replay_peak_10min_rate_per_s": replayed, "target_is_peak": True})
        assert lines[0].startswith("the target, 2 req/s, is the trace's busiest 10 minutes (--target-rate sets "
                                   "another); it is a mean rate: the whole trace is replayed at 2x its own rate")
        assert ("busiest 10 minutes arrive at" in lines[0]) == said, replayed


def test_memory_binds_where_static_at_max_model_len_serves_less_than_the_best():
    """A new user's case (issue 40): "tp 4: memory binds" was said because paged alone served 3%
    less (its block reads in the step time), while static at max_model_len tied the best."""
    from odmactl.capacity.binds import memory_binding, rates_differ

    def rows(tp, **rates):
        return [{"tp": tp, "policy": name.replace("_", "+"), "max_rate_per_replica": rate} for name, rate in rates.items()]

    table = (rows(4, static=4.65, static_1024=4.65, paged=4.50, odma=4.65)
             + rows(1, static=0.12, static_1024=0.25, paged=0.25, odma=0.257)
             + rows(2, paged=1.34, odma=1.51))  # no static row: any two rows
    assert memory_binding(table, 0.02) == {1: True, 2: True, 4: False}
    assert rates_differ(table, 0.02) == {1: True, 2: True, 4: True}
    assert memory_binding(rows(1, static=None, paged=0.3), 0.02) == {1: True}  # static has no rate at all


@pytest.mark.parametrize("guess_scale, holding, want, tried", [
    # the guess holds and one fewer fails: the guess, in two replays
    (1 / 12, lambda r: r >= 12, 12, [12, 11]),
    # one engine never meets it: up by doubling from one, then bisection between 8 and 16, which
    # must not stop at 15 failing (a tiny trace's overload test; docs/capacity.md) when 9 holds
    (None, lambda r: r >= 9 and r != 15, 9, [1, 2, 4, 8, 16, 12, 10, 9]),
    # monotone, the guess low: doubling, then bisection
    (1 / 5, lambda r: r >= 11, 11, [5, 6, 8, 12, 10, 11]),
])
def test_the_replica_search_bisects_between_a_failing_and_a_holding_count(monkeypatch, guess_scale, holding, want, tried):
    from odmactl.capacity import search

    calls = []

    def fake_served(ctx, policy, table, scale, replicas, router):
        calls.append(replicas)
        return {"holds": holding(replicas)}

    monkeypatch.setattr(search, "served", fake_served)
    monkeypatch.setattr(search, "failures", lambda metrics, policy, target: [] if metrics["holds"] else [("x", 1, 0)])
    ctx = type("Ctx", (), {"workload": type("W", (), {"arrival_ps": np.zeros(1000)})()})()
    target = search.CapacityTarget(Slo.parse("ttft_p99=2s"), 1.0)
    found = search.replicas_for(ctx, "paged", {}, target, 1.0, guess_scale or 1.0)
    assert found["replicas"] == want and calls == tried


def test_one_policy_at_a_tp_says_nothing_of_memory():
    """A new user's case: `capacity --policies odma` said "memory does not bind one engine (every
    policy within 2%)" with no other policy to compare."""
    from odmactl.render.console_replay import binding_lines

    row = {"tp": 1, "policy": "odma", "max_rate_per_replica": 0.3, "devices_for_target": 12}
    doc = {"memory_binds": {"1": False}, "rates_differ": {"1": False}, "tolerance": 0.02, "rows": [row],
           "routers": ["least-kv"]}
    assert not [line for line in binding_lines(doc) if "memory" in line]
    two = {**doc, "rows": [row, {**row, "policy": "paged"}]}
    assert [line for line in binding_lines(two) if "memory" in line] == [
        "tp 1: memory does not bind one engine (every policy within 2%): choose by latency or simplicity"]


def test_fewest_router_prefers_fewer_then_lower_latencies_then_the_first_listed():
    from odmactl.capacity.search import fewest_router

    def need(replicas, ttft=1.0, tpot=0.05):
        return {"replicas": replicas, "metrics": {"ttft_p99": ttft, "tpot_p99": tpot}}

    assert fewest_router({"least-kv": need(19), "round-robin-ready": need(18, ttft=1.9)}) == "round-robin-ready"
    assert fewest_router({"least-kv": need(18, ttft=0.9), "round-robin-ready": need(18, ttft=0.8)}) == "round-robin-ready"
    assert fewest_router({"least-kv": need(18, tpot=0.07), "round-robin-ready": need(18, tpot=0.08)}) == "least-kv"
    assert fewest_router({"round-robin-ready": need(18), "least-kv": need(18)}) == "round-robin-ready"
    assert fewest_router({"least-kv": need(None, ttft=0.1), "round-robin": need(40)}) == "round-robin"  # None: none found
    assert fewest_router({"least-kv": need(None, ttft=9), "round-robin": need(None, ttft=1)}) == "least-kv"


def test_several_routers_size_each_row_behind_each_and_keep_the_fewest(cli, small, tmp_path):
    """`--router a,b`: a row's devices behind each router are those capacity finds with that router
    alone, and the row keeps the fewest (among ties, the lower latencies); the console, the markdown and
    the report show the devices behind each."""
    routers = ("least-kv", "round-robin")
    args = [small, *DEVICE, "--slo", SLO, "--predictor", "oracle", "--policies", "static,paged", "--tp", "1,2"]
    alone = {}
    for router in routers:
        r = cli("capacity", *args, "--router", router, "--json")
        assert r.code == 0, r.err
        alone[router] = {(row["policy"], row["tp"]): row for row in json.loads(r.out)["rows"]}
    r = cli("capacity", *args, "--router", ",".join(routers), "--out", tmp_path / "c.json",
            "--markdown", tmp_path / "c.md", "--report", tmp_path / "c.html")
    assert r.code == 0, r.err
    doc = json.loads((tmp_path / "c.json").read_text())
    assert doc["routers"] == list(routers)
    differ = 0
    for row in doc["rows"]:
        key = (row["policy"], row["tp"])
        each = {router: alone[router][key]["devices_for_target"] for router in routers}
        assert row["devices_by_router"] == each
        chosen = min(routers, key=lambda x: (each[x], alone[x][key]["metrics_at_target"]["ttft_p99"],
                                             alone[x][key]["metrics_at_target"]["tpot_p99"], routers.index(x)))
        assert row["router"] == chosen and row["devices_for_target"] == each[chosen]
        assert row["metrics_at_target"] == alone[chosen][key]["metrics_at_target"]
        differ += each[routers[0]] != each[routers[1]]
    assert differ, "the trace should tell the routers apart, or this test checks only ties"
    assert doc["headline"]["router"] in routers
    text = " ".join(r.out.split())
    assert "behind each router" in text and f"behind {doc['headline']['router']}" in text
    markdown = (tmp_path / "c.md").read_text()
    assert "| policy | least-kv | round-robin |" in markdown and "the lower latencies)" in markdown
    kept = next(row for row in doc["rows"] if row["policy"] == "paged" and row["tp"] == 1)
    marked = [f"{kept['devices_by_router'][x]}*" if x == kept["router"] else f"{kept['devices_by_router'][x]}"
              for x in routers]
    assert f"| paged tp 1 | {' | '.join(marked)} |" in markdown
    assert "<th>least-kv</th><th>round-robin</th>" in (tmp_path / "c.html").read_text()
