"""Every mistake gets a clear answer (issue 25): hostile input for every command, table-driven.

Each case runs odmactl in-process through its real entry point in a folder that holds a good trace,
a good config and a good CSV, and asserts the exit code (1 for bad data or input, 2 for a
command-line usage error), that stderr carries no traceback and no "internal error", that a data
error is one line naming what is wrong, that a usage error shows click's usage line and hint, and
that no file in the folder was written, removed or changed."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import polars as pl
import pytest

GOOD_CONFIG = """[allocator]
num_buckets = 4

[scheduler]
max_num_seqs = 64

[thresholds]
min_utilization = 0.05

[meta]
predictor = "oracle"
"""
DEVICE = ["--device", "mlu370-x4", "--model", "DeepSeek-R1-Distill-Qwen-7B"]
REPLAY = ["replay", "{trace}", *DEVICE, "--predictor", "oracle"]
CHECK = ["check", "{trace}", "--config", "{config}", *DEVICE]
PLAN = ["plan", "{trace}", *DEVICE, "--out", "plan.toml"]
FIT = ["fit", "{trace}", "--out", "pred"]


def _config(folder: Path, name: str, text: str) -> str:
    (folder / name).write_text(text)
    return name


# (arguments, exit code, words the message must hold); "{trace}", "{config}", "{csv}" name the good files
CASES: dict[str, tuple[list[str], int, tuple[str, ...]]] = {
    # the command line itself: click's usage errors, exit 2
    "unknown_command": (["replai"], 2, ("No such command", "Try 'odmactl --help'")),
    "unknown_root_option": (["--bogus"], 2, ("No such option",)),
    "bare_odmactl": ([], 2, ("Usage: odmactl",)),
    "bare_profiles": (["profiles"], 2, ("Usage: odmactl profiles",)),
    "install_completion": (["--install-completion"], 2, ("No such option",)),
    "replay_typo_option": (["replay", "{trace}", "--devic", "mlu370-x4"], 2, ("No such option: --devic",)),
    "replay_missing_argument": (["replay", "--device", "mlu370-x4", "--model", "Llama-3-8B"], 2, ("Missing argument",)),
    "replay_missing_option": (["replay", "{trace}", "--device", "mlu370-x4"], 2, ("Missing option '--model'",)),
    # an option without its value: click's parser raises it without a context; the usage is still given
    "capacity_option_without_value": (["capacity", "{trace}", "--slo"], 2, (
        "Usage: odmactl capacity", "Try 'odmactl capacity --help'", "Option '--slo' requires an argument")),
    "profiles_show_option_without_value": (["profiles", "show", "mlu370-x4", "--model"], 2, (
        "Usage: odmactl profiles show", "requires an argument")),
    "replay_limit_not_a_number": ([*REPLAY, "--limit", "abc"], 2, ("Invalid value for '--limit'",)),
    "replay_limit_float": ([*REPLAY, "--limit", "1e21"], 2, ("Invalid value for '--limit'",)),
    "ingest_rate_not_a_number": (["ingest", "{csv}", "--out", "o.parquet", "--rate", "abc"], 2, ("--rate",)),
    "ingest_missing_out": (["ingest", "{csv}"], 2, ("Missing option '--out'",)),
    "stats_missing_argument": (["stats"], 2, ("Missing argument 'TRACE'",)),
    "stats_window_not_a_number": (["stats", "{trace}", "--window", "abc"], 2, ("--window",)),
    "plan_missing_out": (["plan", "{trace}", *DEVICE], 2, ("Missing option '--out'",)),
    "check_missing_config": (["check", "{trace}", *DEVICE], 2, ("Missing option '--config'",)),
    "calibrate_missing_out": (["calibrate"], 2, ("Missing option '--out'",)),
    # ingest
    "ingest_missing_source": (["ingest", "nope.csv", "--out", "o.parquet"], 1, ("nope.csv", "no such file")),
    "ingest_out_is_input": (["ingest", "{csv}", "--out", "{csv}", "--force"], 1, ("is also an input",)),
    "ingest_negative_seed": (["ingest", "{csv}", "--out", "o.parquet", "--seed", "-1"], 1, ("--seed", "from 0")),
    "ingest_huge_seed": (["ingest", "{csv}", "--out", "o.parquet", "--seed", str(2**64)], 1, ("--seed", "from 0")),
    "ingest_out_dev_null": (["ingest", "{csv}", "--out", "/dev/null", "--force"], 1, ("not a regular file",)),
    "ingest_arrival_overflow": (["ingest", "huge_times.csv", "--out", "o.parquet"], 1,
                                ("huge_times.csv", "row 2", "TIMESTAMP", "float")),
    "ingest_ragged_csv": (["ingest", "ragged.csv", "--out", "o.parquet"], 1, ("ragged.csv, row 2", "expected 3 fields")),
    "ingest_unclosed_quote": (["ingest", "quote.csv", "--out", "o.parquet"], 1, ("quote.csv", "never closed")),
    "ingest_control_characters": (["ingest", "ctrl.csv", "--out", "o.parquet"], 1, ("row 1", "\\x1b[31m")),
    "ingest_numeric_time_bad_row": (["ingest", "numtime.csv", "--out", "o.parquet", "--map", "arrival_s=timestamp"], 1,
                                    ("numtime.csv, row 3", "could not parse 'abc'")),
    "ingest_mixed_json_time": (["ingest", "mixed.jsonl", "--format", "mooncake", "--out", "o.parquet"], 1,
                               ("mixed.jsonl, row 3", "could not parse 'x'")),
    "ingest_list_column": (["ingest", "lists.jsonl", "--out", "o.parquet", "--offline"], 1,
                           ("prompt_tokens", "one value per row", "List")),
    "ingest_servegen_dataset_not_object": (["ingest", "sg_list", "--format", "servegen", "--out", "o.parquet"], 1,
                                           ("chunk-0-dataset.json", "expected a JSON object")),
    "ingest_servegen_pdf_nan": (["ingest", "sg_nan", "--format", "servegen", "--out", "o.parquet"], 1,
                                ("chunk-0-dataset.json", "0.input_tokens", "finite")),
    "ingest_servegen_gamma_shape": (["ingest", "sg_shape", "--format", "servegen", "--out", "o.parquet"], 1,
                                    ("chunk-0-trace.csv", "row 1", "shape", "> 0")),
    "ingest_zero_rate": (["ingest", "{csv}", "--out", "o.parquet", "--rate", "0"], 1, ("--rate",)),
    "ingest_nan_rate": (["ingest", "{csv}", "--out", "o.parquet", "--rate", "nan"], 1, ("--rate",)),
    "ingest_rate_and_offline": (["ingest", "{csv}", "--out", "o.parquet", "--rate", "2", "--offline"], 1,
                                ("exclude each other",)),
    "ingest_unknown_format": (["ingest", "{csv}", "--out", "o.parquet", "--format", "sharegpt"], 1,
                              ("--format expects one of", "got 'sharegpt'")),
    "ingest_bad_map": (["ingest", "{csv}", "--out", "o.parquet", "--format", "csv", "--map", "prompt_tokens"], 1,
                       ("--map expects canonical=source",)),
    "ingest_negative_duration": (["ingest", "servegen", "--format", "servegen", "--out", "o.parquet",
                                  "--duration", "-5"], 1, ("--duration",)),
    "ingest_inf_start": (["ingest", "servegen", "--format", "servegen", "--out", "o.parquet", "--start", "inf"], 1,
                         ("--start",)),
    "ingest_huge_rate_scale": (["ingest", "servegen", "--format", "servegen", "--out", "o.parquet",
                                "--rate-scale", "1e12"], 1, ("would generate", "--rate-scale")),
    "ingest_markup_cell": (["ingest", "markup.csv", "--out", "o.parquet"], 1, ("'[/x]'", "row 1")),
    "ingest_markup_out_path": (["ingest", "{csv}", "--out", "[/x]/o.parquet"], 1, ("[/x]", "does not exist")),
    "ingest_existing_out": (["ingest", "{csv}", "--out", "{trace}"], 1, ("already exists", "--force")),
    # stats
    "stats_missing_file": (["stats", "nope.parquet"], 1, ("nope.parquet", "no such file")),
    "stats_not_parquet": (["stats", "{csv}"], 1, ("not a readable parquet",)),
    "stats_directory": (["stats", "servegen"], 1, ("servegen", "is a directory")),
    "stats_zero_window": (["stats", "{trace}", "--window", "0"], 1, ("--window",)),
    "stats_tiny_window": (["stats", "{trace}", "--window", "1e-300"], 1, ("drift windows",)),
    "stats_inf_window": (["stats", "{trace}", "--window", "inf"], 1, ("--window",)),
    # fit
    "fit_holdout": ([*FIT, "--holdout", "1.5"], 1, ("--holdout",)),
    "fit_holdout_tiny": ([*FIT, "--holdout", "0.0001"], 1, ("--holdout", "between 0.05 and 0.8")),
    "fit_epochs": ([*FIT, "--epochs", "0"], 1, ("--epochs",)),
    "fit_max_model_len": ([*FIT, "--max-model-len", "0"], 1, ("--max-model-len",)),
    "fit_buckets": ([*FIT, "--buckets", "0"], 1, ("--buckets",)),
    "fit_split": ([*FIT, "--split-by", "colour"], 1, ("--split-by",)),
    "fit_gamma_nan": ([*FIT, "--gamma", "nan"], 1, ("--gamma",)),
    "fit_tau_inf": ([*FIT, "--tau", "inf"], 1, ("--tau",)),
    "fit_seed": ([*FIT, "--seed", "-3"], 1, ("--seed",)),
    "fit_seeds_zero": ([*FIT, "--seeds", "0"], 1, ("--seeds", "from 1 to 100")),
    "fit_seeds_huge": ([*FIT, "--seeds", "101"], 1, ("--seeds", "from 1 to 100")),
    "fit_seeds_float": ([*FIT, "--seeds", "1.5"], 2, ("Invalid value for '--seeds'",)),
    "fit_out_is_trace": (["fit", "{trace}", "--out", "{trace}", "--force"], 1, ("is also an input",)),
    "fit_out_holds_trace": (["fit", "d/t.parquet", "--out", "d", "--force"], 1, ("contains", "an input")),
    "fit_out_dot": (["fit", "{trace}", "--out", ".", "--force"], 1, ("is empty or the current directory",)),
    "replay_out_empty": ([*REPLAY, "--out", ""], 1, ("is empty or the current directory",)),
    "replay_out_blank": ([*REPLAY, "--out", " "], 1, ("is empty or the current directory",)),
    "replay_plot_empty": ([*REPLAY, "--plot", ""], 1, ("is empty or the current directory",)),
    # a trailing slash names a folder: Path dropped it, and `--out x/` wrote a file named x
    "replay_out_folder": ([*REPLAY, "--out", "x/"], 1, ("x/: ends with '/', which names a folder",)),
    "ingest_out_root": (["ingest", "{csv}", "--out", "/"], 1, ("/: ends with '/', which names a folder",)),
    "replay_out_dot_folder": ([*REPLAY, "--out", "x/."], 1, ("x/.: ends with '.', which names a folder",)),
    # refused after the parse: a usage error typed after it is still one (exit 2)
    "replay_out_folder_then_usage": ([*REPLAY, "--out", "x/", "--limit", "abc"], 2, ("Invalid value for '--limit'",)),
    "fit_out_foreign_dir": (["fit", "{trace}", "--out", "servegen", "--force"], 1, ("holds no predictor.toml",)),
    "fit_gamma_huge": ([*FIT, "--gamma", "1e300"], 1, ("--gamma", "from 0 to 1000")),
    "fit_buckets_huge": ([*FIT, "--buckets", "100000000"], 1, ("--buckets", "4,096")),
    "fit_epochs_huge": ([*FIT, "--epochs", "10000000"], 1, ("max_epochs", "--epochs")),
    # replay
    "replay_max_num_seqs_zero": ([*REPLAY, "--max-num-seqs", "0"], 1, ("--max-num-seqs",)),
    "replay_block_size": ([*REPLAY, "--block-size", "24"], 1, ("--block-size expects one of 8, 16, 32",)),
    "replay_block_size_word": ([*REPLAY, "--block-size", "big"], 2, ("Invalid value for '--block-size'",)),
    "replay_max_new_tokens_zero": ([*REPLAY, "--max-new-tokens", "0"], 1, ("--max-new-tokens", "from 1")),
    "replay_max_new_tokens_huge": ([*REPLAY, "--max-new-tokens", "99999999999"], 1, ("--max-new-tokens", "16,777,216")),
    "profiles_kernels_unknown_device": (["profiles", "kernels", "nope"], 1, ("unknown device 'nope'",)),
    "profiles_kernels_no_database": (["profiles", "kernels", "mlu370-x4"], 1, ("MLU370-X4",)),
    "profiles_show_model_with_model": (["profiles", "show", "Llama-3-8B", "--model", "Llama-3-8B"], 1,
                                       ("--model goes with a device",)),
    "profiles_show_unknown_model": (["profiles", "show", "mlu370-x4", "--model", "nope"], 1, ("unknown model 'nope'",)),
    "replay_max_num_seqs_negative": ([*REPLAY, "--max-num-seqs", "-3"], 1, ("--max-num-seqs",)),
    "replay_max_model_len_zero": ([*REPLAY, "--max-model-len", "0"], 1, ("--max-model-len",)),
    "replay_max_model_len_huge": ([*REPLAY, "--max-model-len", "999999999999"], 1, ("--max-model-len", "16,777,216")),
    "replay_max_num_seqs_huge": ([*REPLAY, "--max-num-seqs", "10000000"], 1, ("--max-num-seqs", "65,536")),
    "replay_tp_zero": ([*REPLAY, "--tp", "0"], 1, ("--tp", "from 1")),
    "replay_tp_not_dividing": ([*REPLAY, "--tp", "8"], 1, ("--tp 8 cannot split", "28 attention heads", "--tp 1, 2, 4 can")),
    "replay_tp_without_interconnect": (["replay", "{trace}", "--device", "cloud-ai-100-ultra", "--model",
                                        "Llama-3-8B", "--predictor", "oracle", "--tp", "2"], 1, ("[interconnect]",)),
    "replay_tp_on_device": (["replay", "{trace}", "--device", "cpu", "--model", "DeepSeek-R1-Distill-Qwen-7B",
                             "--on-device", "--tp", "2"], 1, ("--on-device", "--tp")),
    "replay_batched_tokens_below_max_len": ([*REPLAY, "--max-num-batched-tokens", "100"], 1,
                                            ("max_num_batched_tokens (100) is smaller than max_model_len",)),
    "replay_seed_negative": ([*REPLAY, "--seed", "-1"], 1, ("--seed",)),
    "replay_out_is_config_by_another_path": ([*REPLAY, "--config", "cfgdir/c.toml", "--out", "d/../cfgdir/c.toml",
                                              "--force"], 1, ("is also an input",)),
    "replay_limit_zero": ([*REPLAY, "--limit", "0"], 1, ("--limit",)),
    "replay_kv_pool_huge": ([*REPLAY, "--kv-pool", "1e30 B"], 1, ("--kv-pool", "does not fit")),
    "replay_kv_pool_over_device": ([*REPLAY, "--kv-pool", "64GiB"], 1, ("--kv-pool 64 GiB does not fit",)),
    "replay_kv_pool_unit": ([*REPLAY, "--kv-pool", "12 GB/s"], 1, ("--kv-pool", "bandwidth")),
    "replay_kv_pool_zero": ([*REPLAY, "--kv-pool", "0 B"], 1, ("--kv-pool",)),
    "replay_rate_tiny": ([*REPLAY, "--rate", "1e-12"], 1, ("clock", "--rate")),
    "replay_rate_negative": ([*REPLAY, "--rate", "-1"], 1, ("--rate",)),
    "replay_unknown_policy": ([*REPLAY, "--policy", "buddy"], 1, ("unknown policy 'buddy'",)),
    "replay_compare_and_policy": ([*REPLAY, "--compare", "static,paged", "--policy", "odma"], 1,
                                  ("--compare and --policy exclude each other",)),
    "replay_model_head_dim_zero": (["replay", "{trace}", "--device", "mlu370-x4", "--model", "mdl", "--predictor",
                                    "oracle"], 1, ("mdl/config.json", "head_dim", "positive integer")),
    "replay_compare_twice": ([*REPLAY, "--compare", "static,static"], 1, ("twice",)),
    "replay_compare_empty": ([*REPLAY, "--compare", ","], 1, ("names no policy",)),
    "replay_odma_without_predictor": (["replay", "{trace}", *DEVICE, "--compare", "static,odma"], 1,
                                      ("policy odma", "--predictor none")),
    "replay_unknown_device": (["replay", "{trace}", "--device", "tpu9", "--model", "Llama-3-8B"], 1,
                              ("unknown device 'tpu9'",)),
    "replay_unknown_model": (["replay", "{trace}", "--device", "mlu370-x4", "--model", "gpt-9"], 1,
                             ("unknown model 'gpt-9'",)),
    "replay_unknown_kv_dtype": ([*REPLAY, "--kv-dtype", "fp3"], 2, ("--kv-dtype", "fp3", "fp8")),  # issue 40: names the flag
    "replay_missing_config": ([*REPLAY, "--config", "nope.toml"], 1, ("nope.toml", "no such file")),
    "replay_missing_predictor": (["replay", "{trace}", *DEVICE, "--predictor", "nope/"], 1, ("nope",)),
    "replay_out_is_trace": ([*REPLAY, "--out", "{trace}", "--force"], 1, ("is also an input",)),
    "replay_out_is_plot": ([*REPLAY, "--out", "r.png", "--plot", "r.png"], 1, ("two outputs",)),
    "replay_plot_not_png": ([*REPLAY, "--plot", "r.svg"], 1, ("--plot writes a PNG",)),
    "replay_scale_without_device": ([*REPLAY, "--scale", "0.5"], 1, ("--on-device",)),
    "replay_markup_out": ([*REPLAY, "--out", "[/x].json"], 1, ("[/x].json", "does not exist")),
    # the config file
    "config_max_num_seqs_zero": ([*REPLAY, "--config", "seqs0.toml"], 1, ("scheduler.max_num_seqs", "from 1")),
    "config_max_num_seqs_huge": ([*REPLAY, "--config", "seqs_huge.toml"], 1, ("scheduler.max_num_seqs", "65,536")),
    "config_hedge_zero": ([*REPLAY, "--config", "hedge0.toml"], 1, ("allocator.hedge_output_tokens", "from 1")),
    "config_refit_window_huge": ([*REPLAY, "--config", "refit_huge.toml"], 1, ("allocator.refit_window", "10,000,000")),
    "config_num_buckets_huge": ([*REPLAY, "--config", "buckets_huge.toml"], 1, ("allocator.num_buckets", "4,096")),
    "config_gamma_huge": ([*REPLAY, "--config", "gamma_huge.toml"], 1, ("allocator.gamma", "1000")),
    "config_prefill_negative": ([*REPLAY, "--config", "prefill.toml"], 1, ("scheduler.max_num_batched_tokens",)),
    "config_scheduler_wrong_type": ([*REPLAY, "--config", "seqs_str.toml"], 1,
                                    ("scheduler.max_num_seqs", "expected a whole number")),
    "config_gamma_inf": ([*REPLAY, "--config", "gamma_inf.toml"], 1, ("allocator.gamma", "finite")),
    "config_unknown_allocator_key": ([*REPLAY, "--config", "gama.toml"], 1, ("allocator.gama", "unknown key")),
    "config_meta_not_a_table": ([*REPLAY, "--config", "meta5.toml"], 1, ("meta5.toml", "key 'meta'", "a table")),
    "config_unknown_table": ([*REPLAY, "--config", "table.toml"], 1, ("unknown table 'foo'",)),
    "config_not_toml": ([*REPLAY, "--config", "{csv}"], 1, ("not valid TOML",)),
    "config_markup_key": ([*REPLAY, "--config", "markup.toml"], 1, ("[/x]",)),
    # plan
    "plan_tiny_pool": ([*PLAN, "--kv-pool", "1 MiB"], 1, ("plan needs half of it",)),
    "plan_holdout": ([*PLAN, "--holdout", "0.95"], 1, ("--holdout",)),
    "plan_replays": ([*PLAN, "--replays", "0"], 1, ("--replays",)),
    "plan_baselines_twice": ([*PLAN, "--baselines", "paged,s3,paged"], 1, ("--baselines names 'paged' twice",)),
    "plan_workers": ([*PLAN, "--workers", "0"], 1, ("--workers",)),
    "plan_workers_huge": ([*PLAN, "--workers", "100000"], 1, ("--workers", "256")),
    "plan_out_inside_predictor": (["plan", "{trace}", *DEVICE, "--predictor", "servegen", "--out", "servegen/c.toml"],
                                  1, ("is inside", "servegen", "an input")),
    "plan_executor": ([*PLAN, "--executor", "slurm"], 1, ("--executor",)),
    "plan_objective": ([*PLAN, "--objective", "joy"], 1, ("--objective",)),
    "plan_predictor_none": ([*PLAN, "--predictor", "none"], 1, ("--predictor",)),
    "plan_migration_rate": ([*PLAN, "--max-migration-rate", "2"], 1, ("--max-migration-rate",)),
    "plan_ttft": ([*PLAN, "--ttft-p99", "-1"], 1, ("--ttft-p99",)),
    # the text as typed, not the float it reads as ('inf', '-0.0')
    "plan_ttft_overflow": ([*PLAN, "--ttft-p99", "1e400"], 1, ("--ttft-p99 expects a time in seconds", "got '1e400'")),
    "plan_ttft_minus_zero": ([*PLAN, "--ttft-p99", "-0"], 1, ("got '-0'",)),
    "plan_out_is_trace": (["plan", "{trace}", *DEVICE, "--out", "{trace}", "--force"], 1, ("is also an input",)),
    "plan_report_is_out": ([*PLAN, "--report", "plan.toml"], 1, ("two outputs",)),
    # check
    "check_no_thresholds": (["check", "{trace}", "--config", "empty.toml", *DEVICE], 1, ("nothing to check",)),
    "check_utilization_range": ([*CHECK, "--min-utilization", "2"], 1, ("min_utilization",)),
    "check_threshold_typo": (["check", "{trace}", "--config", "thresholds.toml", *DEVICE], 1,
                             ("thresholds.min_util", "unknown key")),
    "check_unknown_baseline": ([*CHECK, "--min-tps-gain", "0.1", "--baseline", "buddy"], 1, ("unknown policy",)),
    "check_junit_is_trace": ([*CHECK, "--junit", "{trace}", "--force"], 1, ("is also an input",)),
    "check_max_num_seqs_zero": (["check", "{trace}", "--config", "seqs0.toml", *DEVICE], 1, ("max_num_seqs",)),
    # capacity
    "capacity_unknown_slo_metric": (["capacity", "{trace}", *DEVICE, "--slo", "p99=2s", "--predictor", "oracle"], 1,
                                    ("unknown metric 'p99'",)),
    "capacity_slo_unit": (["capacity", "{trace}", *DEVICE, "--slo", "ttft_p99=2 GB/s", "--predictor", "oracle"], 1,
                          ("--slo ttft_p99", "bandwidth")),
    "capacity_tp_zero": (["capacity", "{trace}", *DEVICE, "--slo", "ttft_p99=2s", "--tp", "0", "--predictor",
                          "oracle"], 1, ("--tp",)),
    "capacity_odma_without_predictor": (["capacity", "{trace}", *DEVICE, "--slo", "ttft_p99=2s"], 1,
                                        ("--predictor none",)),
    "capacity_out_is_trace": (["capacity", "{trace}", *DEVICE, "--slo", "ttft_p99=2s", "--predictor", "oracle",
                               "--out", "{trace}", "--force"], 1, ("is also an input",)),
    "capacity_missing_slo": (["capacity", "{trace}", *DEVICE], 2, ("Missing option '--slo'",)),
    # profiles and calibrate
    "profiles_unknown": (["profiles", "show", "tpu9"], 1, ("neither a device nor a model",)),
    "profiles_broken_device": (["profiles", "show", "broken.toml"], 1, ("broken.toml", "not valid TOML")),
    "calibrate_unknown_device": (["calibrate", "--out", "c.toml", "--device", "tpu"], 1, ("--device expects",)),
    "calibrate_existing_out": (["calibrate", "--out", "{config}"], 1, ("already exists",)),
    "calibrate_negative_seed": (["calibrate", "--out", "c.toml", "--seed", "-1", "--device", "cpu"], 1, ("--seed",)),
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory, conv_sample_head) -> Path:
    """The good inputs every case starts from (copied fresh for each case)."""
    base = tmp_path_factory.mktemp("hostile")
    shutil.copy(conv_sample_head(300), base / "trace.parquet")
    (base / "good.toml").write_text(GOOD_CONFIG)
    (base / "a.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,4808,10\n"
                                "2023-11-16 18:17:04.0319600,3180,8\n")
    (base / "markup.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,[/x],10\n")
    sg = base / "servegen"
    sg.mkdir()
    (sg / "chunk-0-trace.csv").write_text("0,2.0,1.0,Gamma,1.0,2.0\n600,2.0,1.0,Gamma,1.0,2.0\n")
    pdf = '{"0": {"input_tokens": "{10: 0.5, 20: 0.5}", "output_tokens": "{5: 1.0}"}}'
    for name, trace, dataset in (("sg_list", "0,2.0,1.0,Gamma,1.0,2.0\n", "[1, 2]"),
                                 ("sg_nan", "0,2.0,1.0,Gamma,1.0,2.0\n", pdf.replace("0.5, 20", "NaN, 20")),
                                 ("sg_shape", "0,2.0,1.0,Gamma,-1.0,2.0\n", pdf)):
        (base / name).mkdir()
        (base / name / "chunk-0-trace.csv").write_text(trace)
        (base / name / "chunk-0-dataset.json").write_text(dataset)
    (base / "d").mkdir()
    shutil.copy(base / "trace.parquet", base / "d" / "t.parquet")
    (base / "cfgdir").mkdir()
    (base / "cfgdir" / "c.toml").write_text(GOOD_CONFIG)
    (base / "huge_times.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n-1e308,10,10\n1e308,10,10\n")
    header = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    (base / "ragged.csv").write_text(header + "2023-01-01 00:00:00,1,2\n2023-01-01 00:00:01,1,2,5,6\n")
    (base / "quote.csv").write_text(header + '2023-01-01 00:00:00,1,2\n"2023-01-01 00:00:02,1,2\n')
    (base / "ctrl.csv").write_text(header + "2023-01-01 00:00:00,1\x1b[31mred,2\n")
    (base / "mdl").mkdir()
    (base / "mdl" / "config.json").write_text(
        '{"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, '
        '"num_hidden_layers": 32, "head_dim": 0, "intermediate_size": 11008, "vocab_size": 32000}')
    (base / "numtime.csv").write_text("timestamp,prompt_tokens,output_tokens\n1.5,1,2\n2.5,1,2\nabc,1,2\n")
    (base / "mixed.jsonl").write_text('{"timestamp": 1, "input_length": 5, "output_length": 3}\n\n'
                                      '{"timestamp": "x", "input_length": 5, "output_length": 3}\n')
    (base / "lists.jsonl").write_text('{"prompt_tokens": [1, 2], "output_tokens": 3}\n')
    for name, text in {"seqs0.toml": "[scheduler]\nmax_num_seqs = 0\n[thresholds]\nmin_utilization = 0.1\n",
                       "prefill.toml": "[scheduler]\nmax_num_batched_tokens = -1\n",
                       "seqs_str.toml": '[scheduler]\nmax_num_seqs = "8"\n',
                       "gamma_inf.toml": "[allocator]\ngamma = inf\n",
                       "meta5.toml": "meta = 5\n[allocator]\n",
                       "gamma_huge.toml": "[allocator]\ngamma = 1e300\n",
                       "seqs_huge.toml": "[scheduler]\nmax_num_seqs = 10000000\n",
                       "hedge0.toml": "[allocator]\nhedge_edges = [10.0]\nhedge_output_tokens = [0, 0]\n",
                       "refit_huge.toml": "[allocator]\nrefit_window = 100000000000000000\n",
                       "buckets_huge.toml": "[allocator]\nnum_buckets = 100000000\n",
                       "gama.toml": "[allocator]\ngama = 0.2\n",
                       "table.toml": "[foo]\nbar = 1\n",
                       "markup.toml": '[allocator]\n"[/x]" = 1\n',
                       "empty.toml": "[allocator]\n",
                       "thresholds.toml": "[thresholds]\nmin_util = 0.5\n",
                       "broken.toml": "format = \n"}.items():
        _config(base, name, text)
    return base


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.rglob("*"))}


def test_the_corpus_covers_every_command():
    assert len(CASES) >= 60
    commands = {args[0] for args, _, _ in CASES.values() if args and not args[0].startswith("-")}
    assert {"ingest", "stats", "fit", "replay", "plan", "check", "capacity", "profiles", "calibrate"} <= commands


@pytest.mark.parametrize("case", sorted(CASES))
def test_hostile_input(cli, folder, tmp_path, monkeypatch, case):
    work = tmp_path / "w"
    shutil.copytree(folder, work)
    monkeypatch.chdir(work)
    args, code, needles = CASES[case]
    names = {"{trace}": "trace.parquet", "{config}": "good.toml", "{csv}": "a.csv"}
    args = [names.get(a, a) for a in args]
    before = _snapshot(work)
    result = cli(*args)
    assert result.code == code, (result.code, result.err)
    assert "Traceback" not in result.err and "internal error" not in result.err, result.err
    text = " ".join(result.err.split())
    for needle in needles:
        assert needle in text, (needle, result.err)
    if code == 1:
        assert len([line for line in result.err.splitlines() if line.strip()]) == 1, result.err
        assert result.err.startswith("error: ")
    else:
        assert "Usage: odmactl" in result.err
    assert _snapshot(work) == before, "nothing may be written, removed or changed"


def test_usage_errors_exit_2_with_the_hint_in_a_subprocess(tmp_path):
    """Acceptance 3, through the installed entry point: --version, an unknown option, an unknown
    command and a missing argument."""
    import subprocess
    import sys

    run = lambda *a: subprocess.run([sys.executable, "-m", "odmactl", *a], capture_output=True, text=True,  # noqa: E731
                                    cwd=tmp_path)
    version = run("--version")
    assert version.returncode == 0 and version.stdout.startswith("odmactl ")
    for args, words in ((["replay", "--bogus"], "No such option: --bogus"), (["replai"], "No such command 'replai'"),
                        (["stats"], "Missing argument 'TRACE'")):
        done = run(*args)
        assert done.returncode == 2, (args, done.stderr)
        assert "Usage: odmactl" in done.stderr and "--help' for help" in done.stderr and words in done.stderr
        assert "Traceback" not in done.stderr


def test_max_num_seqs_zero_fails_at_once(cli, folder, tmp_path, monkeypatch):
    """Acceptance 2: a batch cap of 0 could loop forever; replay and check refuse it in well under
    a second (the flag and the config's [scheduler])."""
    monkeypatch.chdir(folder)
    for args in ([*[a.replace("{trace}", "trace.parquet") for a in REPLAY], "--max-num-seqs", "0"],
                 ["check", "trace.parquet", "--config", "seqs0.toml", *DEVICE]):
        started = time.perf_counter()
        result = cli(*args)
        assert result.code == 1 and "max_num_seqs" in result.err.replace("-", "_")
        assert time.perf_counter() - started < 1.0


def test_a_bom_csv_ingests(cli, tmp_path):
    src = tmp_path / "bom.csv"
    src.write_bytes(b"\xef\xbb\xbfTIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,4808,10\n"
                    b"2023-11-16 18:17:04.0319600,3180,8\n")
    result = cli("ingest", src, "--out", tmp_path / "o.parquet", "--json")
    assert result.code == 0, result.err
    assert '"requests": 2' in result.out


def test_a_text_dataset_without_arrivals_fails_before_tokenizing(cli, tmp_path, monkeypatch):
    """The timestamp check comes before the (slow) tokenizer is even loaded."""
    import odmactl.trace.readers.text as text

    def no_tokenizer(*_):
        raise AssertionError("the tokenizer was loaded")

    monkeypatch.setattr(text, "load_tokenizer", no_tokenizer)
    src = tmp_path / "al.json"
    src.write_text('[{"instruction": "hi", "input": "", "output": "hello"}]')
    result = cli("ingest", src, "--out", tmp_path / "o.parquet")
    assert result.code == 1 and "has no timestamps" in result.err and "--offline" in result.err


def test_the_replay_clock_limit_is_a_message(cli, folder, monkeypatch):
    """A backlog that outlasts the 64-bit clock (here: a replay stepping past it) is a message."""
    import odmactl.run.replay as run_replay

    class Overflowing:  # Replay is an extension type: its method cannot be patched, its name can
        def __init__(self, *args, **kwargs):
            pass

        def run(self):
            raise OverflowError("Python int too large to convert to C long")

    monkeypatch.setattr(run_replay, "Replay", Overflowing)
    monkeypatch.chdir(folder)
    result = cli(*[a.replace("{trace}", "trace.parquet") for a in REPLAY])
    assert result.code == 1 and "simulated clock" in result.err and "--limit" in result.err


def test_help_and_messages_show_table_names_as_written(cli, folder, monkeypatch):
    """Square brackets are never read as markup: check's help names [thresholds], and a message
    quoting a TOML key or a CSV cell keeps its brackets."""
    result = cli("check", "--help")
    assert result.code == 0 and "[thresholds]" in result.out and "[allocator]" in result.out


def test_stats_tables_fit_80_columns_without_cutting_names(cli, tmp_path):
    long_name = "a-model-name-of-fifty-characters-that-goes-on-and-on"
    frame = pl.DataFrame({"request_id": [f"r{i}" for i in range(40)], "arrival_s": [float(i) * 30 for i in range(40)],
                          "prompt_tokens": [10 + i for i in range(40)], "output_tokens": [5 + i for i in range(40)],
                          "prompt_text": [None] * 40, "model": [long_name] * 20 + ["short"] * 20, "tenant": [None] * 40},
                         schema={"request_id": pl.String, "arrival_s": pl.Float64, "prompt_tokens": pl.Int32,
                                 "output_tokens": pl.Int32, "prompt_text": pl.String, "model": pl.String,
                                 "tenant": pl.String})
    frame.write_parquet(tmp_path / "t.parquet")
    result = cli("stats", tmp_path / "t.parquet", "--window", "60")
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in result.out  # nothing cut: long names wrap
    assert long_name in "".join(line.strip().split(" ")[0] for line in lines)


def test_a_kv_pool_reads_the_same_in_profiles_and_replay(cli, folder, monkeypatch):
    monkeypatch.chdir(folder)
    shown = cli("profiles", "show", "mlu370-x4")
    replayed = cli(*[a.replace("{trace}", "trace.parquet") for a in REPLAY], "--policy", "static", "--limit", "20")
    assert shown.code == 0 and replayed.code == 0
    from odmactl.core.units import format_bytes
    from odmactl.run.serving import serving

    pool = format_bytes(serving("mlu370-x4", "DeepSeek-R1-Distill-Qwen-7B").pool_bytes)
    assert pool.endswith("GiB") and pool in shown.out and pool in " ".join(replayed.out.split())


def test_an_on_device_replay_that_does_not_fit_suggests_a_scale():
    import dataclasses

    from odmactl.core.errors import ConfigError
    from odmactl.device.ondevice import check_fits, free_device_bytes
    from odmactl.hw.profiles import load_model

    free = free_device_bytes("cpu")
    model = dataclasses.replace(load_model("DeepSeek-R1-Distill-Qwen-7B"), num_layers=10)

    def per_layer(pool_share: float, probe_share: float, fixed_share: float = 0.0):
        """Needs that follow the layers kept (of 10), plus a part that does not."""
        return lambda m: (int(free * pool_share * m.num_layers / 10),
                          int(free * (probe_share * m.num_layers / 10 + fixed_share)))

    with pytest.raises(ConfigError) as info:  # 2.5x the free memory at 10 layers; half may be taken: 2 layers fit
        check_fits("cpu", per_layer(0.5, 2.0), model, 1.0)
    assert "--scale 0.2 keeps 2 of its 10 layers" in info.value.hint
    with pytest.raises(ConfigError) as info:  # buffers that do not shrink with the layers: no scale fits
        check_fits("cpu", per_layer(0.01, 0.01, fixed_share=0.6), model, 1.0)
    assert "even one of the model's 10 layers" in info.value.hint and "--max-num-batched-tokens" in info.value.hint
    check_fits("cpu", lambda m: (1 << 20, 1 << 20), model, 1.0)


@pytest.mark.parametrize("kind", ["duration", "datetime"])
def test_typed_time_columns_ingest(cli, tmp_path, kind):
    """A parquet file whose timestamps are typed (a Duration since a start, or a Datetime) is read as
    such, not as text that fails to parse."""
    import datetime as dt

    from odmactl.trace.schema import read_trace

    values = ([dt.timedelta(seconds=5), dt.timedelta(seconds=7.25)] if kind == "duration"
              else [dt.datetime(2024, 1, 1, 12), dt.datetime(2024, 1, 1, 12, 0, 2, 250000)])
    pl.DataFrame({"ts": values, "prompt_tokens": [5, 6], "output_tokens": [7, 8]}).write_parquet(tmp_path / "a.parquet")
    result = cli("ingest", tmp_path / "a.parquet", "--out", tmp_path / "o.parquet", "--map", "arrival_s=ts")
    assert result.code == 0, result.err
    assert read_trace(tmp_path / "o.parquet")["arrival_s"].to_list() == [0.0, 2.25]


def test_a_profiles_folder_that_is_not_one_is_named(cli, monkeypatch, tmp_path):
    monkeypatch.setenv("ODMACTL_PROFILES", str(tmp_path / "nope"))
    result = cli("profiles", "list")
    assert result.code == 1 and "$ODMACTL_PROFILES=" in result.err and "devices/ and models/" in result.err


def _prepare(folder: Path, case: str) -> list[str]:
    """Inputs for the red-team's second round (issue 25): each returns the arguments."""
    trace = folder / "trace.parquet"
    if case == "glob_name":
        shutil.copy(trace, folder / "tr*.parquet")
        shutil.copy(trace, folder / "tr_other.parquet")
        return ["stats", "tr*.parquet", "--json"]
    if case == "out_symlink":
        (folder / "real.json").write_text("{}")
        (folder / "link.json").symlink_to(folder / "real.json")
        return [*REPLAY, "--out", "link.json", "--force"]
    if case == "fit_force_foreign_manifest":
        (folder / "mine").mkdir()
        (folder / "mine" / "predictor.toml").write_text('model = "my other tool"\n')
        (folder / "mine" / "thesis.txt").write_text("keep")
        return [*FIT[:3], "mine", "--force"]
    if case == "config_predictor_folder":
        (folder / "cfgp" / "P").mkdir(parents=True)
        (folder / "cfgp" / "P" / "predictor.toml").write_text('format = "odmactl-predictor"\n')
        (folder / "cfgp" / "c.toml").write_text('[meta]\npredictor = "P"\n')
        return ["replay", "{trace}", *DEVICE, "--config", "cfgp/c.toml", "--out", "cfgp/P/predictor.toml", "--force"]
    if case == "duplicate_header":
        (folder / "dup.csv").write_text("TIMESTAMP,ContextTokens,ContextTokens,GeneratedTokens\n"
                                        "2023-01-01 00:00:00,1,2,3\n")
        return ["ingest", "dup.csv", "--out", "o.parquet"]
    if case == "map_twice":
        return ["ingest", "{csv}", "--out", "o.parquet", "--format", "csv", "--map", "arrival_s=a", "--map", "arrival_s=b"]
    if case == "deep_json":
        (folder / "deep.jsonl").write_text('{"input_length": 5, "output_length": 3, "hash_ids": '
                                           + "[" * 100_000 + "]" * 100_000 + "}\n")
        return ["ingest", "deep.jsonl", "--format", "mooncake", "--out", "o.parquet", "--offline"]
    if case == "servegen_tiny_shape":
        (folder / "sgt").mkdir()
        (folder / "sgt" / "chunk-0-trace.csv").write_text("0,2.0,1.0,Gamma,1e-300,1e-300\n")
        (folder / "sgt" / "chunk-0-dataset.json").write_text('{"0": {"input_tokens": "{10: 1.0}", '
                                                             '"output_tokens": "{5: 1.0}"}}')
        return ["ingest", "sgt", "--format", "servegen", "--out", "o.parquet"]
    if case == "huge_device":
        from conftest import ROOT

        text = (ROOT / "profiles" / "devices" / "mlu370-x4.toml").read_text()
        (folder / "huge.toml").write_text(text.replace('value = "24 GB"', 'value = "1e30 GB"'))
        return ["replay", "{trace}", "--device", "huge.toml", "--model", "DeepSeek-R1-Distill-Qwen-7B",
                "--policy", "paged", "--predictor", "none"]
    raise AssertionError(case)


MORE = {
    "glob_name": (0, ()),  # a file name with `*` is that file, not a pattern
    "out_symlink": (1, ("symbolic link",)),
    "fit_force_foreign_manifest": (1, ("not an odmactl predictor",)),
    "config_predictor_folder": (1, ("is inside", "an input")),
    "duplicate_header": (1, ("column 'ContextTokens'", "twice")),
    "map_twice": (1, ("--map names arrival_s twice",)),
    "deep_json": (1, ("row 1", "nested too deeply")),
    "servegen_tiny_shape": (1, ("chunk-0-trace.csv, row 1", "shape")),
    "huge_device": (1, ("more than odmactl replays",)),
}


@pytest.mark.parametrize("case", sorted(MORE))
def test_second_round_of_hostile_input(cli, folder, tmp_path, monkeypatch, case):
    work = tmp_path / "w"
    shutil.copytree(folder, work)
    monkeypatch.chdir(work)
    args = _prepare(work, case)
    args = [{"{trace}": "trace.parquet", "{csv}": "a.csv"}.get(a, a) for a in args]
    before = _snapshot(work)
    result = cli(*args)
    code, needles = MORE[case]
    assert result.code == code, (result.code, result.err)
    assert "Traceback" not in result.err and "internal error" not in result.err
    if code == 0:
        assert json_requests(result.out) == 300  # the one file, not both
    else:
        assert len(result.err.strip().splitlines()) == 1 and all(n in result.err for n in needles), result.err
        assert _snapshot(work) == before


def json_requests(text: str) -> int:
    import json

    return json.loads(text)["requests"]
