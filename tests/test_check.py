"""`odmactl check`: exit 0 when every threshold holds and 1 when one is violated, thresholds from the
flags or the config's [thresholds] table, JUnit XML a standard parser reads, a markdown summary,
and clear errors."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import polars as pl
import pytest

from odmactl.core.errors import ConfigError
from odmactl.gate.thresholds import Thresholds, evaluate
from odmactl.render.junit import junit_xml

DEVICE, MODEL = "mlu370-x4", "DeepSeek-R1-Distill-Qwen-7B"


@pytest.fixture(scope="module")
def trace(conv_sample_head):
    return conv_sample_head(300)


def _config(path, thresholds: str = "") -> object:
    path.write_text("[allocator]\nnum_buckets = 4\nlarge_pool_fraction = 0.2\n\n" + thresholds)
    return path


def _run(cli, trace, config, *args):
    return cli("check", trace, "--config", config, "--device", DEVICE, "--model", MODEL, "--predictor", "oracle", *args)


def test_pass_exits_0_and_writes_junit_and_markdown(cli, trace, tmp_path):
    config = _config(tmp_path / "c.toml", "[thresholds]\nmin_utilization = 0.3\nmax_migration_rate = 0.005\n")
    junit, summary = tmp_path / "j.xml", tmp_path / "s.md"
    r = _run(cli, trace, config, "--min-tps-gain", "0.1", "--junit", junit, "--markdown", summary)
    assert r.code == 0, r.err
    assert "PASS" in r.out and "tps gain over static" in r.out
    root = ET.parse(junit).getroot()  # a standard parser reads it
    suite = root.find("testsuite")
    assert root.tag == "testsuites" and suite.get("tests") == "3" and suite.get("failures") == "0"
    assert [c.get("name") for c in suite.iter("testcase")] == ["min_utilization", "max_migration_rate", "min_tps_gain"]
    assert not list(suite.iter("failure"))
    text = summary.read_text()
    assert text.startswith("### odmactl check: PASS") and "| min_tps_gain |" in text and "| static |" in text


def test_violation_exits_1_with_a_failure_per_violated_threshold(cli, trace, tmp_path):
    config = _config(tmp_path / "c.toml", "[thresholds]\nmin_utilization = 0.99\n")
    junit = tmp_path / "j.xml"
    r = _run(cli, trace, config, "--max-rejection-rate", "0", "--junit", junit, "--json")
    assert r.code == 1
    doc = json.loads(r.out)
    assert doc["passed"] is False
    # the failed gate is said on stderr too, naming the threshold, the value and what was expected
    # (after the warnings the console would show and the line saying what was written: the verdict
    # is the last line)
    *warnings, written, failed_line = r.err.splitlines()
    assert written == f"wrote {junit}" and all(w.startswith("warning: ") for w in warnings)
    assert failed_line.startswith("error: check failed: 1 of ") and "min_utilization: kv_utilization 6" in failed_line
    assert "expected >= 99.0%" in failed_line
    by_name = {v["name"]: v for v in doc["verdicts"]}
    assert by_name["min_utilization"]["passed"] is False and by_name["min_utilization"]["value"] < 0.99
    assert by_name["max_rejection_rate"]["passed"] is True
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("failures") == "1"
    failed = [c for c in suite.iter("testcase") if c.find("failure") is not None]
    assert [c.get("name") for c in failed] == ["min_utilization"]
    assert "violates >= 99.0%" in failed[0].find("failure").get("message")
    # a flag overrides the config's value: the same run passes with a lower bound
    r = _run(cli, trace, config, "--min-utilization", "0.2")
    assert r.code == 0, r.err


def test_thresholds_merge_and_validate(tmp_path):
    t = Thresholds.merged({"min_utilization": 0.5, "baseline": "paged"}, {"min_utilization": 0.6, "min_tps_gain": None},
                          tmp_path / "c.toml")
    assert t.min_utilization == 0.6 and t.baseline == "paged" and t.min_tps_gain is None and not t.empty
    assert Thresholds().empty
    for table, words in [({"min_util": 0.5}, "unknown key"), ({"min_utilization": "high"}, "expected a number"),
                         ({"max_migration_rate": 2.0}, "between 0 and 1"), ({"baseline": 3}, "expected a string")]:
        with pytest.raises(ConfigError, match=words) as info:
            Thresholds.merged(table, {}, tmp_path / "c.toml")
        assert info.value.file == str(tmp_path / "c.toml") and info.value.key.startswith("thresholds.")
    with pytest.raises(ConfigError, match="> -1"):
        Thresholds(min_tps_gain=-2)


def test_evaluate_compares_with_the_baseline():
    doc = {"results": {"odma": {"metrics": {"kv_utilization": 0.7, "migration_rate": 0.01, "rejections": 0,
                                            "requests": 10, "tps": 120.0}},
                       "static": {"metrics": {"tps": 100.0}}}}
    verdicts = evaluate(doc, "odma", Thresholds(min_utilization=0.7, max_migration_rate=0.005, min_tps_gain=0.2))
    assert [(v.name, v.passed) for v in verdicts] == [("min_utilization", True), ("max_migration_rate", False),
                                                       ("min_tps_gain", True)]
    assert verdicts[2].value == pytest.approx(0.2)
    # plan's limit counts preemptions too (an overflow with nowhere to go): a config whose large
    # pool is too small passes a migration_rate bound and fails the overflow_rate one
    doc["results"]["odma"]["metrics"].update(migration_rate=0.0, overflow_rate=0.3)
    verdicts = evaluate(doc, "odma", Thresholds(max_migration_rate=0.005, max_overflow_rate=0.005))
    assert [(v.name, v.metric, v.passed) for v in verdicts] == [
        ("max_migration_rate", "migration_rate", True), ("max_overflow_rate", "overflow_rate", False)]
    root = ET.fromstring(junit_xml(verdicts, "suite", 1.5))
    assert root.get("failures") == "1" and root.find("testsuite").get("time") == "1.500"


def test_errors_exit_1_without_output(cli, trace, tmp_path):
    config = _config(tmp_path / "c.toml")
    junit = tmp_path / "j.xml"
    for args, words in [([], "nothing to check"), (["--min-utilization", "1.5"], "between 0 and 1"),
                        (["--min-tps-gain", "0.2", "--baseline", "buddy"], "unknown policy")]:
        r = _run(cli, trace, config, *args, "--junit", junit)
        assert r.code == 1 and words in r.err and "Traceback" not in r.err, (args, r.err)
    bad = _config(tmp_path / "bad.toml", "[thresholds]\nmin_utilisation = 0.5\n")
    r = _run(cli, trace, bad, "--junit", junit)
    assert r.code == 1 and "min_utilisation" in r.err and str(bad) in r.err
    r = _run(cli, trace, tmp_path / "missing.toml", "--min-utilization", "0.5")
    assert r.code == 1 and "no such file" in r.err
    assert not junit.exists()


def test_latency_thresholds_from_slo_and_config(cli, trace, tmp_path):
    """`--slo` (capacity's syntax) sets [thresholds]' max_<metric>_s keys; each limit is a verdict
    with its unit, a flag overrides the config's key, and a config's bad limit names file and key."""
    config = _config(tmp_path / "c.toml", "[thresholds]\nmax_ttft_p99_s = 1e-3\n")
    r = _run(cli, trace, config, "--json")
    assert r.code == 1
    doc = json.loads(r.out)
    (v,) = doc["verdicts"]
    assert (v["name"], v["metric"], v["passed"]) == ("max_ttft_p99_s", "ttft_p99", False)
    assert v["value"] == doc["metrics"]["odma"]["ttft_p99"] > 1e-9
    assert "max_ttft_p99_s: ttft_p99 " in r.err and "expected <= 0.001 s" in r.err
    # the flag replaces the config's limit and adds TPOT's, written in ms
    junit = tmp_path / "j.xml"
    r = _run(cli, trace, config, "--slo", "ttft_p99=3600s,tpot_p99=1ms", "--junit", junit)
    assert r.code == 1
    failed = [c for c in ET.parse(junit).getroot().iter("testcase") if c.find("failure") is not None]
    assert [c.get("name") for c in failed] == ["max_tpot_p99_s"]
    assert "violates <= 1.0 ms" in failed[0].find("failure").get("message")
    assert "<= 3,600.000 s" in r.out and "pass" in r.out
    r = _run(cli, trace, config, "--slo", "ttft_p99=3600s,tpot_p99=10s")
    assert r.code == 0, r.err
    # mistakes: the flag's, as capacity gives them; the config's, naming the file and the key
    for slo, words in [("ttft_p98=2s", "did you mean 'ttft_p99'"), ("ttft_p99=2", "ttft_p99=2s"),
                       ("ttft_p99=0s", "a time from 1 ms"), ("ttft_p99", "METRIC=TIME")]:
        r = _run(cli, trace, config, "--slo", slo)
        assert r.code == 1 and words in r.err and "Traceback" not in r.err, (slo, r.err)
    for table, words in [("max_ttft_p99_s = 0", "from 0.001 to"), ("max_tpot_p99_s = '100ms'", "expected a number"),
                         ("max_ttft_p99_s = inf", "finite")]:
        bad = _config(tmp_path / "bad.toml", f"[thresholds]\n{table}\n")
        r = _run(cli, trace, bad)
        assert r.code == 1 and str(bad) in r.err and "thresholds.max_t" in r.err and words in r.err, (table, r.err)


def test_a_latency_no_request_had_meets_its_bound():
    """TPOT where every reply is one token is None: it breaks no limit (capacity's SLO reads it so)."""
    doc = {"results": {"odma": {"metrics": {"ttft_p99": 0.5, "tpot_p99": None, "tpot_p50": 0.09, "completed": 10}}}}
    verdicts = evaluate(doc, "odma", Thresholds(max_ttft_p99_s=0.4, max_tpot_p99_s=0.1, max_tpot_p50_s=0.08))
    assert [(v.name, v.passed, v.value_text) for v in verdicts] == [
        ("max_ttft_p99_s", False, "0.500 s"), ("max_tpot_p50_s", False, "90.0 ms"), ("max_tpot_p99_s", True, "n/a")]


def test_the_report_says_what_a_latency_was_judged_on(cli, trace, tmp_path):
    """The scope line names the requests, their arrival rate and the one engine; a latency judged
    from fewer than 50 completed requests is warned about (console, markdown, JUnit, and stderr with
    --json); the markdown lists every metric a threshold judged."""
    config = _config(tmp_path / "c.toml")
    summary, junit = tmp_path / "s.md", tmp_path / "j.xml"
    r = _run(cli, trace, config, "--limit", "20", "--rate", "0.5", "--slo", "tpot_p50=10s",
             "--markdown", summary, "--junit", junit)
    assert r.code == 0, r.err
    assert "20 requests (rescaled to 0.5 req/s) on one engine" in " ".join(r.out.split())
    few = "tpot_p50 judged from 20 completed requests"
    assert few in " ".join(r.out.split())
    text = summary.read_text()
    assert few in text and "| TPOT p50 (ms) |" in text and "| TPOT p99 (ms) |" in text
    assert few in ET.parse(junit).getroot().find("testsuite").find("system-err").text
    r = _run(cli, trace, config, "--limit", "20", "--slo", "tpot_p50=10s", "--json")
    assert r.code == 0 and json.loads(r.out)["passed"] and few in r.err and r.err.startswith("warning: ")
    r = _run(cli, trace, config, "--slo", "tpot_p50=10s")  # 300 completed: no warning
    assert r.code == 0 and "judged from" not in r.out
    assert "300 requests (trace timestamps, " in " ".join(r.out.split())


def test_a_gain_that_rounds_to_zero_has_no_minus_sign():
    from odmactl.render.metrics import METRICS

    assert METRICS["tps_gain"].text(-0.0004) == "+0.0%" and METRICS["tps_gain"].text(-0.004) == "-0.4%"
    assert METRICS["kv_utilization"].text(-1e-9) == "0.0%" and METRICS["tps"].text(-0.01) == "0.0"


def test_latency_bounds_red_team_cases(cli, tmp_path, conv_sample_head):
    """From a red team: a latency bound fails where no request completed (n/a is no pass there); a
    repeated --slo is one SLO (a metric in two is refused, not the earlier dropped); a value its
    format would write as the bound is written to ten digits; a huge limit or integer is a
    message; a stderr that cannot be written does not fail a passing check."""
    trace = conv_sample_head(300)
    config = _config(tmp_path / "c.toml")
    huge = tmp_path / "huge.parquet"
    frame = pl.read_parquet(trace).head(20).with_columns(pl.lit(100_000).alias("prompt_tokens"))
    frame.write_parquet(huge)
    r = _run(cli, huge, config, "--slo", "ttft_p99=1s,tpot_p99=10ms", "--json")
    assert r.code == 1
    doc = json.loads(r.out)
    assert doc["metrics"]["odma"]["completed"] == 0 and [v["passed"] for v in doc["verdicts"]] == [False, False]
    r = _run(cli, trace, config, "--slo", "ttft_p99=3600s", "--slo", "ttft_p99=1ms")
    assert r.code == 1 and "--slo names ttft_p99 twice" in r.err
    r = _run(cli, trace, config, "--slo", "ttft_p99=3600s", "--slo", "tpot_p99=1ms", "--json")
    assert [(v["name"], v["passed"]) for v in json.loads(r.out)["verdicts"]] == [("max_ttft_p99_s", True),
                                                                              ("max_tpot_p99_s", False)]
    ttft = json.loads(r.out)["metrics"]["odma"]["ttft_p99"]
    r = _run(cli, trace, config, "--slo", f"ttft_p99={ttft - 0.0004}s")  # both 287.101 s to the format's 3 decimals
    value, bound = (float(t.replace(",", "")) for t in
                    re.search(r"ttft_p99 ([\d,.]+) s, expected <= ([\d,.]+) s", r.err).groups())
    assert r.code == 1 and value > bound == ttft - 0.0004  # the bound as set, the value written on its side of it
    for slo in ("ttft_p99=1e300s", "ttft_p99=2e9s", "ttft_p99=5ns", "tpot_p99=0.9ms"):  # "<= 0.000 s" read as 0
        r = _run(cli, trace, config, "--slo", slo)
        assert r.code == 1 and "from 1 ms to 1,000,000,000 s" in r.err, r.err
    bad = _config(tmp_path / "bad.toml", "[thresholds]\nmax_ttft_p99_s = 1" + "0" * 400 + "\n")
    r = _run(cli, trace, bad)
    assert r.code == 1 and "thresholds.max_ttft_p99_s" in r.err and "about 401 digits" in r.err and "internal" not in r.err


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_stderr_that_cannot_be_written_does_not_fail_a_passing_check(conv_sample_head, tmp_path):
    trace = conv_sample_head(300)
    config = _config(tmp_path / "c.toml")
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "odmactl", "check", str(trace), "--config", str(config),
                                 "--device", DEVICE, "--model", MODEL, "--predictor", "oracle", "--slo",
                                 "ttft_p99=3600s", "--out", str(tmp_path / "r.json"), "--json"],
                                stdout=subprocess.PIPE, stderr=full, text=True, timeout=300)
    assert result.returncode == 0 and json.loads(result.stdout)["passed"] and (tmp_path / "r.json").exists()
