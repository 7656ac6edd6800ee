"""What each output says where a red-team trial found it wrong: a row with no rate is not written as
the figure "none", a floor warning writes the limit as it was set and the floor to the digits that
tell them apart, a Markdown code span survives backticks in a file name, and the files (markdown,
HTML) carry the warnings the JSON lists, a noisy measured profile's included."""

from __future__ import annotations

from odmactl.render.console_replay import queue_lines
from odmactl.render.markdown import capacity_markdown, code
from odmactl.render.warnings import capacity_warnings


def _capacity_doc(**extra) -> dict:
    row = {"policy": "paged", "tp": 1, "max_rate_per_replica": None, "keeps_up_rate_per_replica": 0.98,
           "rate_scale": None, "devices_for_target": None, "monotone": True, "near_floor": ["ttft_p99"],
           "rejected_never_fit": 0, "breaks_above": [], "metrics_at_capacity": {}, "infeasible": "ttft_p99 breaks",
           "floor_cause": None, "too_few_served": None, "unbounded": False, "devices_saved_vs_static": None,
           "max_rate_per_device": None, "output_tps_per_device": None, "gate_rate_per_replica": None,
           "replicas_for_target": None}
    return {"tolerance": 0.02, "rows": [row], "slo": {"ttft_p99": 0.794}, "zero_load": {"1": {"ttft_p99": 0.7941}},
            "trace": {"path": "we`ird|<b>x.parquet", "requests": 300, "mean_rate_per_s": 3.5},
            "model": "M", "device": "D", "predictor": "oracle", "scheduler": {"engine": "vllm-v0"},
            "arrivals": {"label": "the trace"}, "slo_label": "ttft_p99 <= 794 ms", "target_rate_per_s": 3.5,
            "target_is_peak": True, "routers": ["least-kv"], "memory_binds": {}, **extra}


def test_a_row_with_no_rate_is_not_a_figure():
    """'one engine meets the SLO up to paged none req/s' followed 'meets the SLO at no rate'."""
    assert queue_lines(_capacity_doc()) == []


def test_a_floor_warning_tells_the_limit_from_the_floor():
    """A 794 ms limit under a 794.1 ms floor read 'the ttft_p99 limit (0.794 s) is under its
    zero-load floor (0.794 s ...)'."""
    (line,) = capacity_warnings(_capacity_doc())
    assert "limit (0.794 s) is under its zero-load floor (0.7941 s," in line, line


def test_a_code_span_holds_any_file_name():
    assert code("a.parquet") == "`a.parquet`"
    assert code("we`ird|<b>x.parquet") == "`` we`ird|<b>x.parquet ``"
    assert code("a``b") == "``` a``b ```"
    text = capacity_markdown(_capacity_doc())
    assert "`` we`ird|<b>x.parquet ``:" in text


def test_the_files_carry_the_warnings_the_json_lists():
    """A noisy measured profile's warning reached capacity's and check's JSON and stderr, not
    their markdown, HTML or JUnit."""
    noisy = "device profile p.toml: scattered reads were disturbed: run calibrate again on an idle machine"
    doc = _capacity_doc(warnings=[noisy])
    assert f"> **warning:** {noisy}" in capacity_markdown(doc)
    assert "> **warning:** tp 1: the ttft_p99 limit" not in capacity_markdown(doc)  # the list is the whole story
    # check's markdown and JUnit take the list the CLI gives its JSON (cli/check.py: summary["warnings"])



def test_a_table_latency_keeps_its_side_of_the_limit():
    """A TPOT p50 of 5.4587 ms at the rate found, under a 5.46 ms limit, read 5.5 in the table."""
    from odmactl.render.console_replay import capacity_value

    row = {"rate_scale": 1.0, "metrics_at_capacity": {"tpot_p50": 0.0054587}}
    assert capacity_value(row, "tpot_p50", {"tpot_p50": 0.00546}) == "5.459"
    assert capacity_value(row, "tpot_p50") == "5.5"  # no limit on it: the metric's format


def test_the_plot_draws_the_latencies_the_slo_bounds():
    from odmactl.render.metrics import slo_latencies

    assert slo_latencies({}) == slo_latencies({"ttft_p99": 2.0}) == ("ttft_p99", "tpot_p99")
    assert slo_latencies({"ttft_p50": 0.2, "tpot_p50": 0.07}) == ("ttft_p50", "tpot_p50")
    assert slo_latencies({"tpot_p50": 0.07, "ttft_p99": 2.0, "ttft_p50": 1.0}) == ("ttft_p50", "ttft_p99", "tpot_p50")


def test_the_headline_keeps_a_latency_on_its_side_of_the_limit():
    """'tpot_p50 79.2 ms' was printed under a 79.1995 ms limit it met (79.19945 ms)."""
    from odmactl.render.console_replay import headline_detail

    row = {"policy": "paged", "tp": 1, "replicas_for_target": 8, "max_rate_per_replica": 1.0,
           "metrics_at_target": {"ttft_p99": 0.5, "tpot_p50": 0.07919945}}
    doc = {"headline": {"policy": "paged", "tp": 1}, "rows": [row], "target_rate_per_s": 4.0,
           "slo": {"tpot_p50": 0.0791995}}
    (line, *_) = headline_detail(doc)
    assert "tpot_p50 79.199 ms" in line and "79.2 ms" not in line, line


def test_capacity_on_all_four_latencies_keeps_every_column_at_80(cli, conv_sample_head):
    """With an SLO on all four latencies the table lost its 'never fit' column at 80 columns."""
    r = cli("capacity", conv_sample_head(300), "--device", "mlu370-x4", "--model", "DeepSeek-R1-Distill-Qwen-7B",
            "--predictor", "oracle", "--policies", "paged", "--tp", "2",
            "--slo", "ttft_p50=0.6s,ttft_p99=1.5s,tpot_p50=80ms,tpot_p99=100ms")
    assert r.code == 0, r.err
    lines = [x.rstrip() for x in r.out.splitlines()]
    assert max(len(x) for x in lines) <= 80
    assert any(x.endswith("never") for x in lines) and any(x.endswith(" fit") for x in lines), r.out  # whole header
    assert [x for x in lines if x.startswith(" paged tp 2") and x.split()[-1] == "0"], r.out  # and its value
