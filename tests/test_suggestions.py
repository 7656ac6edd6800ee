"""Names a user types (issue 40): any case, a family that names one profile, and for anything else
"did you mean ...?" naming the close ones: devices, models, policies, predictors, SLO metrics, time
units; and `profiles list` never wraps a name one types."""

from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest
from rich.console import Console

from odmactl.capacity.slo import Slo
from odmactl.core.errors import ConfigError, ProfileError, did_you_mean
from odmactl.core.units import QuantityError, parse_quantity
from odmactl.hw.profiles import device_paths, load_device, load_model, model_dirs, shipped_name

DEVICE, MODEL = "mlu370-x4", "DeepSeek-R1-Distill-Qwen-7B"


@pytest.fixture(scope="module")
def trace(conv_sample_head):
    return conv_sample_head(30)


# --------------------------------------------------------------------------------- profile names

def test_a_unique_family_names_its_profile_and_any_case_is_the_name():
    assert load_device("a100").name == load_device("a100-80gb-sxm").name == "A100-80GB-SXM"
    assert load_device("A100-80GB").name == "A100-80GB-SXM"
    assert load_device("H100").name == "H100-SXM"  # h100-sxm is the only name starting h100-
    assert load_device("MLU370-X4").name == "MLU370-X4"
    assert load_model("llama-3").name == "Llama-3-8B"
    assert load_model("llama-2-7B").name == "Llama-2-7B"


def test_a_family_of_several_is_refused_naming_them():
    with pytest.raises(ProfileError) as info:
        load_device("mlu370")
    assert "mlu370-x4, mlu370-x8" in str(info.value) and "give one of them" in str(info.value)
    with pytest.raises(ProfileError, match="Llama-2-13B, Llama-2-7B"):
        load_model("llama-2")


def test_aliases_come_from_the_names_present():
    """Two A100 profiles make `a100` a family of two: refused, both named, none guessed."""
    names = ["a100-40gb-pcie", "a100-80gb-sxm", "h100-sxm"]
    with pytest.raises(ProfileError, match="a100-40gb-pcie, a100-80gb-sxm"):
        shipped_name("a100", names, "device")
    assert shipped_name("A100-80GB", names, "device") == "a100-80gb-sxm"
    assert shipped_name("h100", names, "device") == "h100-sxm"
    assert shipped_name("a10", names, "device", required=False) is None  # a family ends at a dash
    with pytest.raises(ProfileError, match="did you mean 'a100-80gb-sxm'"):
        shipped_name("a100-80gb-sm", names, "device")


def test_an_unknown_name_suggests_the_close_ones():
    with pytest.raises(ProfileError) as info:
        load_device("mlu37-x4")
    assert "unknown device 'mlu37-x4'; did you mean 'mlu370-x4' or 'mlu370-x8'?" in str(info.value)
    assert all(p.stem in str(info.value) for p in device_paths())  # and every shipped name
    with pytest.raises(ProfileError, match="unknown model 'llama-3-7b'; did you mean 'Llama-3-8B'"):
        load_model("llama-3-7b")
    with pytest.raises(ProfileError) as info:
        load_device("tpu9")
    assert "did you mean" not in str(info.value)


def test_the_cli_takes_an_alias_and_suggests(cli, trace):
    result = cli("replay", trace, "--device", "a100", "--model", "llama-3", "--policy", "paged", "--json")
    assert result.code == 0, result.err
    result = cli("replay", trace, "--device", "mlu370", "--model", MODEL, "--policy", "paged")
    assert result.code == 1 and "mlu370-x4, mlu370-x8" in result.err and "Traceback" not in result.err
    result = cli("replay", trace, "--device", "h200x", "--model", MODEL, "--policy", "paged")
    assert result.code == 1 and "unknown device 'h200x'; did you mean 'h200'" in result.err


def test_a_torch_device_suggests_the_close_one():
    from odmactl.device.calibrate import resolve_device

    with pytest.raises(ProfileError, match="got 'cdua'; did you mean 'cuda'?"):
        resolve_device("cdua")
    assert resolve_device("CPU") == "cpu"


# -------------------------------------------------------------------------- policies, predictors

def test_a_mistyped_policy_suggests_the_registered_one(cli, trace, tmp_path):
    result = cli("replay", trace, "--device", DEVICE, "--model", MODEL, "--compare", "pagd,static")
    assert result.code == 1 and "unknown policy 'pagd'; did you mean 'paged'?" in result.err
    result = cli("capacity", trace, "--device", DEVICE, "--model", MODEL, "--slo", "ttft_p99=2s",
                 "--policies", "statik")
    assert result.code == 1 and "unknown policy 'statik'; did you mean 'static'?" in result.err
    config = tmp_path / "c.toml"
    config.write_text("[allocator]\n")
    result = cli("check", trace, "--device", DEVICE, "--model", MODEL, "--config", config, "--min-tps-gain", "0.1",
                 "--baseline", "pagd")
    assert result.code == 1 and "--baseline: unknown policy 'pagd'; did you mean 'paged'?" in result.err


def test_a_predictor_name_close_to_a_choice_suggests_it(cli, trace):
    result = cli("replay", trace, "--device", DEVICE, "--model", MODEL, "--policy", "odma", "--predictor", "oracel")
    assert result.code == 1 and "no such predictor directory; did you mean 'oracle'?" in result.err
    result = cli("replay", trace, "--device", DEVICE, "--model", MODEL, "--policy", "odma", "--predictor", "nnoe")
    assert result.code == 1 and "did you mean 'none'?" in result.err
    result = cli("replay", trace, "--device", DEVICE, "--model", MODEL, "--policy", "odma", "--predictor",
                 "runs/oracel")
    assert result.code == 1 and "no such predictor directory" in result.err and "did you mean" not in result.err


def test_did_you_mean_names_up_to_three_in_their_own_spelling():
    assert did_you_mean("PAGD", ["static", "paged"]) == "did you mean 'paged'?"
    assert did_you_mean("zzz", ["static", "paged"]) is None


# ------------------------------------------------------------------------------------ time units

def test_a_time_without_its_unit_suggests_seconds():
    with pytest.raises(QuantityError) as info:
        parse_quantity("2", "seconds")
    assert str(info.value).endswith("did you mean '2 s'?") and info.value.suggested("") == "2s"
    for text, meant in [("2 sec", "2 s"), ("100 msec", "100 ms"), ("100MS", "100ms"), ("5 usec", "5 us")]:
        with pytest.raises(ValueError, match=f"did you mean '{meant}'"):
            parse_quantity(text, "seconds")
    with pytest.raises(ValueError, match="did you mean '8 GiB'"):
        parse_quantity("8 gib", "bytes")
    with pytest.raises(ValueError) as info:  # a size without its unit: bytes or gigabytes? no guess
        parse_quantity("80", "bytes")
    assert "without its unit" in str(info.value) and "did you mean" not in str(info.value)
    with pytest.raises(ValueError, match="'GB/s' is a unit of bandwidth"):
        parse_quantity("24 GB/s", "bytes")


def test_an_slo_without_a_unit_suggests_the_flag_as_it_is_written():
    # a bare number may be milliseconds (a TPOT of 100) or seconds (a TTFT of 2): both are offered
    with pytest.raises(ConfigError, match="did you mean ttft_p99=2ms or ttft_p99=2s\\?"):
        Slo.parse("ttft_p99=2")
    with pytest.raises(ConfigError, match="did you mean tpot_p99=100ms or tpot_p99=100s\\?"):
        Slo.parse("tpot_p99=100")
    # every mistake of one flag at once, numbered, so that it is mended in one go
    with pytest.raises(ConfigError) as info:
        Slo.parse("ttft_p99=2,foo=3s,tpot_p99=100,ttft_p99=1s")
    assert info.value.message == (
        "--slo has 4 mistakes: 1. ttft_p99: expected a time such as 2s or 100ms, got '2': a number without its unit; "
        "did you mean ttft_p99=2ms or ttft_p99=2s?; 2. unknown metric 'foo'; 3. tpot_p99: expected a time such as 2s "
        "or 100ms, got '100': a number without its unit; did you mean tpot_p99=100ms or tpot_p99=100s?; 4. names "
        "ttft_p99 twice")
    assert info.value.hint == "metrics: ttft_p50, ttft_p99, tpot_p50, tpot_p99"
    with pytest.raises(ConfigError, match="did you mean tpot_p99=100ms\\?"):
        Slo.parse("ttft_p99=2s,tpot_p99=100 msec")
    with pytest.raises(ConfigError, match="unknown metric 'ttft_99'; did you mean 'ttft_p99'"):
        Slo.parse("ttft_99=2s")


def test_the_cli_suggests_the_slo(cli, trace):
    result = cli("capacity", trace, "--device", DEVICE, "--model", MODEL, "--slo", "ttft_p99=2", "--policies", "paged")
    assert result.code == 1 and "did you mean ttft_p99=2ms or ttft_p99=2s?" in result.err and "Traceback" not in result.err


# ------------------------------------------------------------------------------- profiles list

def _names() -> list[str]:
    return [p.stem for p in device_paths()] + [p.name for p in model_dirs()]


def test_profiles_list_never_wraps_a_name_at_80_columns():
    from odmactl.hw.profiles import read_device, read_model
    from odmactl.hw.summary import device_summary, model_summary
    from odmactl.render.console_profiles import render_profiles_list

    devices = [device_summary(read_device(p), []) for p in device_paths()]
    models = [model_summary(read_model(p)) for p in model_dirs()]
    buffer = io.StringIO()
    render_profiles_list(Console(file=buffer, width=80), devices, models)
    words = {word for line in buffer.getvalue().splitlines() for word in line.split()}
    assert all(name in words for name in _names()), buffer.getvalue()
    assert max(len(line.rstrip()) for line in buffer.getvalue().splitlines()) <= 80


def test_profiles_list_piped_and_at_80_columns_keeps_names_whole():
    for columns in ("80", None):
        env = {k: v for k, v in os.environ.items() if k != "COLUMNS"} | ({"COLUMNS": columns} if columns else {})
        out = subprocess.run([sys.executable, "-m", "odmactl", "profiles", "list"], capture_output=True, text=True,
                             env=env, check=True).stdout
        words = {word for line in out.splitlines() for word in line.split()}
        assert all(name in words for name in _names()), out


@pytest.mark.parametrize("args, hint", [
    (["capacity", "T", "--device", DEVICE, "--model", MODEL, "--slo", "ttft_p99=2s", "--tp", "1", "2", "4"],
     "several values go in one argument, separated by commas: --tp 1,2,4"),
    (["replay", "T", "--device", DEVICE, "--model", MODEL, "--compare", "paged", "odma"],
     "separated by commas: --compare paged,odma"),
    # the shell split a number from its unit: not "--slo ttft_p99=2,s"
    (["check", "T", "--config", "C", "--device", DEVICE, "--model", MODEL, "--slo", "ttft_p99=2", "s"],
     'a value and its unit go in one argument: --slo ttft_p99=2s (or quote it: "ttft_p99=2 s")'),
    (["replay", "T", "--device", DEVICE, "--model", MODEL, "--kv-pool", "2", "GiB"], "--kv-pool 2GiB"),
])
def test_a_list_given_as_several_arguments_says_how_to_give_it(cli, trace, args, hint):
    r = cli(*[str(trace) if a == "T" else a for a in args])
    assert r.code == 2 and "unexpected extra argument" in r.err and hint in r.err and "Usage:" in r.err


def test_profiles_show_suggests_devices_and_models_and_names_a_family(cli):
    r = cli("profiles", "show", "lama-3-8b")
    assert r.code == 1 and "neither a device nor a model profile; did you mean 'Llama-3-8B'" in r.err
    r = cli("profiles", "show", "mlu370")
    assert r.code == 1 and "could be any of the device profiles mlu370-x4, mlu370-x8" in r.err


@pytest.mark.parametrize("command", [
    ["replay", "T", "--device", DEVICE, "--model", MODEL, "--policy", "paged"],
    ["capacity", "T", "--device", DEVICE, "--model", MODEL, "--slo", "ttft_p99=2s"],
    ["plan", "T", "--device", DEVICE, "--model", MODEL, "--predictor", "oracle"],
    ["check", "T", "--config", "c.toml", "--device", DEVICE, "--model", MODEL],
    ["profiles", "show", MODEL],
])
def test_an_unknown_kv_dtype_is_a_usage_error_naming_the_flag(cli, trace, command):
    """A red team's case (issue 40): `--kv-dtype fp7` said "unknown KV dtype" without the flag, exit 1."""
    r = cli(*[str(trace) if a == "T" else a for a in command], "--kv-dtype", "fp7")
    assert r.code == 2 and "Invalid value for '--kv-dtype'" in r.err and "did you mean 'fp8'" in r.err, r.err


def test_vllms_kv_cache_dtype_names_say_what_they_are_here(cli, trace):
    """A new user's case (issue 40): `--kv-dtype fp8_e4m3`, vLLM's name, got no suggestion."""
    r = cli("profiles", "show", MODEL, "--kv-dtype", "fp8_e4m3")
    assert r.code == 2 and "vLLM's fp8_e4m3 is fp8 here" in r.err, r.err


def test_floor_sig3_cuts_to_what_the_tables_print():
    """capacity's gate rate is written as the table writes a rate (render/metrics SIG3), cut rather
    than rounded, exactly on the float's shortest decimal form (0.345 is not cut to 0.344)."""
    from odmactl.core.units import floor_sig3
    from odmactl.render.metrics import format_metric

    for value, cut in [(0.34544, 0.345), (0.345, 0.345), (0.2546, 0.254), (4.64765, 4.64), (1234.7, 1234.0),
                       (0.0023499, 0.00234), (99.999, 99.9), (100.0, 100.0)]:
        assert floor_sig3(value) == cut, value
        assert float(format_metric("max_rate_per_replica", cut).replace(",", "")) == cut
    from odmactl.core.units import round_sig3

    for value in (0.34544, 0.33079, 4.64765, 1234.7, 99.96, 0.0023499):  # the figure the table shows
        assert round_sig3(value) == float(format_metric("max_rate_per_replica", value).replace(",", "")), value


def test_a_precise_figure_keeps_its_format_s_decimals():
    """A precise figure has at least ten significant digits, as many more as read it back, and
    never fewer decimals than the metric's format: a TPOT bound of 100 ms reads "100.0", as the
    other rows do, not "100"."""
    from odmactl.render.metrics import METRICS

    tpot, ttft, share = METRICS["tpot_p99"], METRICS["ttft_p99"], METRICS["kv_utilization"]
    assert [tpot.text(v, precise=True) for v in (0.1, 0.09999786952, 0.1000134267)] == ["100.0", "99.99786952",
                                                                                       "100.0134267"]
    assert (ttft.text(2.0, precise=True), ttft.text(852.0505, precise=True)) == ("2.000", "852.0505")
    assert (share.text(0.5, precise=True), share.text(0.51234567891, precise=True)) == ("50.0%", "51.234567891%")
    assert METRICS["migration_rate"].text(0.005, precise=True) == "0.500%"


def test_a_bound_reads_as_it_was_set():
    """check writes a bound to its last set digit: a 1.5 ms TTFT limit read "expected <= 0.002 s",
    which is not the limit checked; a value keeps its format unless it would read as the bound."""
    from odmactl.gate.thresholds import Verdict

    def texts(name, bound, value):
        v = Verdict(name, "m", "<=", bound, value, value is not None and value <= bound)
        return v.threshold_text, v.value_text

    assert texts("max_ttft_p99_s", 0.0015, 3140.389) == ("0.0015 s", "3,140.389 s")
    assert texts("max_ttft_p99_s", 0.0015, 0.0016) == ("0.0015 s", "0.002 s")  # above the bound as written too
    assert texts("max_ttft_p50_s", 98.6769203854715, 98.6769) == ("98.6769203854715 s", "98.6769 s")  # not "98.677"
    assert texts("max_ttft_p50_s", 98.6769203854715, 98.6769203854715) == ("98.6769203854715 s",) * 2  # equal: alike
    assert texts("max_tpot_p99_s", 0.1783, 0.178343739122684) == ("178.3 ms", "178.34 ms")  # no more digits than tell them apart
    assert texts("max_ttft_p99_s", 1 / 3, 0.2) == ("0.3333333333333333 s", "0.200 s")
    assert texts("max_ttft_p99_s", 2.0, 2.0004) == ("2.000 s", "2.0004 s")  # "2.000 s" twice would read as a pass
    assert texts("max_ttft_p99_s", 2.0015, 2.0014) == ("2.0015 s", "2.001 s")
    assert texts("max_tpot_p99_s", 0.1, 0.0995612) == ("100.0 ms", "99.6 ms")
    assert texts("max_overflow_rate", 0.005, 0.00652) == ("0.500%", "0.652%")
    assert texts("max_overflow_rate", 0.00525, None) == ("0.525%", "n/a")
    # ten digits were not always enough: a FAIL read "214.4842921 s, expected <= 214.4842921 s"
    assert texts("max_ttft_p99_s", 214.4842921, 214.48429210833) == ("214.4842921 s", "214.4843 s")
    assert texts("max_ttft_p99_s", 999999999.9999, 5.0) == ("999,999,999.9999 s", "5.000 s")  # not rounded up past it
    assert texts("max_tpot_p99_s", 1e9, 0.05) == ("1,000,000,000,000.0 ms", "50.0 ms")  # no exponent
    assert texts("max_overflow_rate", 1e-7, 0.0) == ("0.00001%", "0.000%")
    assert texts("max_overflow_rate", 1e-12, 0.0)[0] == "1e-10%"  # past 1e-9 of its unit, an exponent, not "1e-010"
    assert texts("max_overflow_rate", 1e-11, 0.0)[0] == "0.000000001%"  # at 1e-9 of the unit, none
    assert texts("min_tps_gain", -0.0, 0.1) == ("+0.0%", "+10.0%")
    assert texts("min_tps_gain", 0.2, 120 / 100 - 1) == ("+20.0%", "+20.0%")  # equal but for rounding: meets, reads so


def test_a_verdict_agrees_with_its_figures():
    """A value past its bound by more than float rounding fails, however small the gap: a TPOT
    p99 of 178.3437391 ms passed a 178.343739 ms limit (an absolute tolerance of 1e-9 s), and
    82.52219502% passed a minimum of 82.52219505%."""
    from odmactl.gate.thresholds import at_least, at_most

    assert not at_most(0.1783437391, 0.178343739) and at_most(0.178343739, 0.178343739)
    assert not at_least(0.8252219502, 0.8252219505)
    assert at_least(120 / 100 - 1, 0.2) and at_most(0.1 + 0.2, 0.3) and at_most(0.0, 0.0)
    assert not at_most(1e-300, 0.0)


def test_a_bound_typed_in_a_smaller_unit_reads_back_as_typed():
    """36 ms was parsed as 36 * 0.001 = 0.036000000000000004 s and printed "36.000000000000007 ms";
    a share's or a time's bound is scaled to % or ms in decimal, not in floats."""
    from odmactl.core.units import parse_quantity
    from odmactl.render.metrics import METRICS

    assert [parse_quantity(t, "seconds") for t in ("36ms", "4.1ms", "1007us", "1000000000000000000ns")] == \
        [0.036, 0.0041, 0.001007, 1e9]
    assert parse_quantity("2 GiB", "bytes") == 2 ** 31
    assert METRICS["tpot_p99"].text(parse_quantity("178.3ms", "seconds"), precise=True) == "178.3"
    assert METRICS["kv_utilization"].text(0.8252219501518426, precise=True) == "82.52219501518426%"
    assert METRICS["tps_gain"].text(1.9916577926316488, precise=True) == "+199.16577926316488%"
    assert METRICS["overflow_rate"].text(1e-11, precise=True) == "0.000000001%"  # 1e-9 of the unit: no exponent


def test_a_gain_over_nothing_served_by_either_fails():
    """Where neither the policy nor its baseline served a token, the TPS gain is none, not
    infinite: it fails and reads n/a (it passed, printed as its bound, "+500.0%")."""
    from odmactl.gate.thresholds import Thresholds, evaluate

    def doc(tps, base):
        return {"results": {"odma": {"metrics": {"tps": tps}}, "static": {"metrics": {"tps": base}}}}

    [v] = evaluate(doc(0.0, 0.0), "odma", Thresholds(min_tps_gain=5.0))
    assert (v.passed, v.value, v.value_text, v.threshold_text) == (False, None, "n/a", "+500.0%")
    [v] = evaluate(doc(10.0, 0.0), "odma", Thresholds(min_tps_gain=5.0))  # over a baseline that served nothing
    assert v.passed and v.value_text == "n/a"


def test_a_quantity_past_any_range_is_a_plain_error():
    """Exponents past a float's range, either way, and whatever the unit, are an error naming what
    was expected (1e999999 GiB raised decimal.Overflow: "internal error"); a 10,000-digit number is
    quoted cut; the product with the unit is exact, then rounded once."""
    from odmactl.core.units import QuantityError, format_seconds, parse_quantity

    for text, kind, why in (("1e999999 GiB", "bytes", "past 1e+400"), ("1e99999999999999999999s", "seconds", "past 1e+400"),
                            ("1e-99999999999999999999s", "seconds", "past 1e-400"), ("1e400GB", "bytes", "too large"),
                            ("1e308 TB/s", "bandwidth", "too large"), ("1e-400 us", "seconds", "too small"),
                            ("5e-330 s", "seconds", "too small"), ("1" * 10_000 + " s", "seconds", "past 1e+400")):
        with pytest.raises(QuantityError) as e:
            parse_quantity(text, kind)
        assert why in str(e.value) and len(str(e.value)) < 200, str(e.value)
    assert parse_quantity("9007199254740993.0000000000000000001 B", "bytes") == 9007199254740994.0
    assert parse_quantity("1.00000000000000011102230246251 s", "seconds") == 1.0  # just below the midpoint
    assert [format_seconds(s) for s in (0.178343739, 1234.5678, 0.1, 2.0, 1e9)] == \
        ["178.343739 ms", "1234.5678 s", "100 ms", "2 s", "1000000000 s"]


def test_an_unknown_option_suggests_only_options_like_it(cli, trace):
    """click compared option names with their dashes, and '--bogus' drew 'Possible options: --out'."""
    r = cli("check", str(trace), "--bogus")
    assert r.code == 2 and "No such option: --bogus" in r.err and "Possible options" not in r.err
    r = cli("check", str(trace), "--confg", "x.toml")
    assert r.code == 2 and "(Possible options: --config)" in r.err


def test_the_json_lists_the_warnings_the_console_gives(cli, trace):
    """A CI reading check's or replay's --json saw `queue.overloaded` but not the warning lines."""
    import json

    r = cli("replay", str(trace), "--device", DEVICE, "--model", MODEL, "--predictor", "oracle", "--limit", "300",
            "--rate", "50", "--json")
    doc = json.loads(r.out)
    assert r.code == 0 and doc["results"]["odma"]["queue"]["overloaded"]
    assert [w for w in doc["warnings"] if w.startswith("overloaded:")] and "overloaded:" in r.err


def test_every_choice_flag_names_its_choices_and_the_close_one(cli, trace):
    """--router and --policies suggested the close name, --engine, --objective, --executor and
    --split-by did not (and --engine said "must be" where the others say "expects")."""
    base = [str(trace), "--device", DEVICE, "--model", MODEL, "--predictor", "oracle"]
    cases = [
        (["replay", *base, "--engine", "VLLM-V1"], "--engine expects one of vllm-v0, vllm-v1, got 'VLLM-V1'",
         "'vllm-v1'"),
        (["plan", *base, "--objective", "TPS", "--out", "x.toml"], "--objective expects one of", "'tps'"),
        (["plan", *base, "--executor", "proces", "--out", "x.toml"], "--executor expects one of process, ray",
         "'process'"),
        (["capacity", *base, "--slo", "ttft_p99=2s", "--executor", "Ray"], "--executor expects one of", "'ray'"),
        (["capacity", *base, "--slo", "ttft_p99=2s", "--router", "Least-KV"], "--router expects one of", "'least-kv'"),
        (["capacity", *base, "--slo", "ttft_p99=2s", "--arrivals", "Poison"], "--arrivals expects one of",
         "'poisson'"),
        (["fit", str(trace), "--split-by", "Time", "--out", "p"], "--split-by expects one of prompt, time", "'time'"),
    ]
    for args, said, near in cases:
        r = cli(*args)
        text = " ".join(r.err.split())
        assert r.code == 1 and said in text and f"did you mean {near}" in text, (args, r.err)


def test_a_wrapped_line_counts_terminal_cells_not_characters():
    """A path in CJK is two cells a character: a line of 80 characters was 120 cells, and the
    terminal cut it again."""
    from rich.cells import cell_len

    from odmactl.render.tables import wrapped_lines

    line = ("error: /data/跟踪文件/生产环境请求记录/二零二六年十一月.parquet: row 17, column arrival_s: expected "
            "seconds since the first request, got '二零二四年' (a date among seconds)")
    for width in range(40, 121):
        lines = wrapped_lines(line, width)  # the path is longer than a line at 40: cut, as textwrap cuts
        assert "".join(lines).replace(" ", "") == line.replace(" ", ""), lines
        assert all(cell_len(x) <= width for x in lines), (width, [cell_len(x) for x in lines])


def test_a_wrapped_line_keeps_each_figure_with_its_unit_and_bound():
    """At 80 columns a new user read '<= 2.000' on one line and 's' on the next: lines wrap between
    words, never between a figure and its unit or a bound's sign and its figure."""
    from odmactl.render.tables import wrapped_lines

    line = ("error: check failed: 2 of 5 thresholds violated: max_ttft_p99_s: ttft_p99 1,053.863 s, expected "
            "<= 2.000 s; max_tpot_p99_s: tpot_p99 144.8 ms, expected <= 100.0 ms; a pool of 8 GiB at 0.3 req/s; "
            "TTFT p99 2.818 s > 1.2345 s; a copy at 12.5 GiB/s")
    for width in range(40, 121):
        lines = wrapped_lines(line, width)
        assert " ".join(lines) == line and all(len(x) <= width or " " not in x for x in lines)
        for x in lines:
            assert not x.endswith(("<=", ">", " 2.000", " 100.0", " 8", " 0.3", "1,053.863", "144.8", " 12.5")), \
                (width, lines)
            assert not x.startswith(("s;", "s,", "ms", "GiB", "req/s", "1.2345")), (width, lines)
