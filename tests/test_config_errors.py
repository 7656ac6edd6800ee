"""Config errors (issue 40): one validation path for every config table whichever command reads
it, and every error names the file, the full key (`[table] key` as `table.key`) and the key the
user set, also where a policy finds the problem only as it completes its config against the
deployment."""

from __future__ import annotations

import os

import polars as pl
import pytest

from odmactl.core.errors import ConfigError, ProfileError
from odmactl.hw.profiles import load_device, read_device
from odmactl.run.config import config_setting_error, read_config

DEVICE, MODEL = "mlu370-x4", "DeepSeek-R1-Distill-Qwen-7B"


@pytest.fixture(scope="module")
def trace(conv_sample_head):
    return conv_sample_head(60)


@pytest.fixture(scope="module")
def tenants_trace(conv_sample_head, tmp_path_factory):
    """The 60 requests, four tenants (a LoRA adapter each)."""
    frame = pl.read_parquet(conv_sample_head(60))
    path = tmp_path_factory.mktemp("tenants") / "tenants.parquet"
    frame.with_columns(pl.Series("tenant", [f"t{i % 4}" for i in range(frame.height)])).write_parquet(path)
    return path


def _write(tmp_path, text: str):
    path = tmp_path / "c.toml"
    path.write_text(text)
    return path


def _replay(cli, trace, config, policy: str):
    return cli("replay", trace, "--device", DEVICE, "--model", MODEL, "--policy", policy, "--predictor", "oracle",
               "--config", config)


def _capacity(cli, trace, config, policy: str):
    return cli("capacity", trace, "--device", DEVICE, "--model", MODEL, "--slo", "ttft_p99=2s", "--policies", policy,
               "--predictor", "oracle", "--workers", "1", "--config", config)


COMMANDS = {"replay": _replay, "capacity": _capacity}


def _refused(result, config, key: str, *words: str) -> None:
    """Exit 1, one message naming the file and the full key (as OdmaError writes them), no traceback."""
    assert result.code == 1, (result.out, result.err)
    assert f"{config}, key '{key}'" in result.err, result.err
    for word in words:
        assert word in result.err, (word, result.err)
    assert "Traceback" not in result.err and result.err.count("error:") == 1, result.err


# ------------------------------------------------------------------------ [thresholds], everywhere

THRESHOLDS = [
    ("max_overflow_rate = \"low\"", "thresholds.max_overflow_rate", ("expected a number", "'low'")),
    ("max_rejection_rate = 2.0", "thresholds.max_rejection_rate", ("between 0 and 1",)),
    ("min_tps_gain = -3", "thresholds.min_tps_gain", ("> -1",)),
    ("min_utilisation = 0.5", "thresholds.min_utilisation", ("unknown key",)),
    ("baseline = \"pagd\"", "thresholds.baseline", ("unknown policy 'pagd'", "did you mean 'paged'?")),
]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("line, key, words", THRESHOLDS, ids=[t[1] for t in THRESHOLDS])
def test_thresholds_are_checked_by_every_command_that_reads_a_config(cli, trace, tmp_path, command, line, key, words):
    """capacity --config and replay --config accepted a [thresholds] table check refuses."""
    config = _write(tmp_path, f"[thresholds]\n{line}\n")
    _refused(COMMANDS[command](cli, trace, config, "paged"), config, key, *words)


def test_thresholds_are_checked_when_a_config_is_read(tmp_path):
    config = _write(tmp_path, "[thresholds]\nmax_overflow_rate = \"low\"\n")
    with pytest.raises(ConfigError) as info:
        read_config(config)
    assert info.value.file == str(config) and info.value.key == "thresholds.max_overflow_rate"


# ------------------------------------------------------------------------ wrong types, by table

WRONG_TYPES = [
    ("[scheduler]\nmax_num_seqs = \"many\"\n", "scheduler.max_num_seqs", "expected a whole number"),
    ("[scheduler]\nprefix_caching = \"yes\"\n", "scheduler.prefix_caching", "expected true or false"),
    ("[scheduler]\naging_s = [1, 2]\n", "scheduler.aging_s", "expected a number"),
    ("[thresholds]\nmin_utilization = \"high\"\n", "thresholds.min_utilization", "expected a number"),
    ("[thresholds]\nbaseline = 3\n", "thresholds.baseline", "expected a string"),
]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("text, key, words", WRONG_TYPES, ids=[w[1] for w in WRONG_TYPES])
def test_a_wrong_type_names_the_file_and_the_full_key(cli, trace, tmp_path, command, text, key, words):
    config = _write(tmp_path, text)
    _refused(COMMANDS[command](cli, trace, config, "paged"), config, key, words)


# ------------------------------------------------------- what a policy checks as it completes its config

COMPLETED = [
    # more activation memory to borrow than the profile keeps aside (ellm's complete_config)
    ("ellm", "[allocator]\nellm_borrow_bytes = 1000000000000000\n", "allocator.ellm_borrow_bytes",
     ("nothing more to borrow",)),
    # a host buffer that holds no chunk of KV (ellm's complete_config)
    ("ellm", "[allocator]\nellm_host_buffer_bytes = 1000\n", "allocator.ellm_host_buffer_bytes",
     ("holds no", "chunk of KV")),
    # a large pool past the pool (odma's complete_config)
    ("odma", "[allocator]\nlarge_pool_bytes = 100000000000\n", "allocator.large_pool_bytes", ("exceeds",)),
    # a boundary past the run's max_model_len (the settings' check against max_model_len)
    ("odma", "[allocator]\nboundaries_tokens = [100, 9000]\n", "allocator.boundaries_tokens",
     ("exceeds max_model_len_tokens (5120)",)),
]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("policy, text, key, words", COMPLETED, ids=[c[2] for c in COMPLETED])
def test_a_policys_own_check_names_the_file_and_the_full_key(cli, trace, tmp_path, command, policy, text, key, words):
    config = _write(tmp_path, text)
    _refused(COMMANDS[command](cli, trace, config, policy), config, key, *words)


def test_a_boundary_within_the_runs_max_model_len_is_not_held_to_a_default(cli, trace, tmp_path):
    """The config sets no max_model_len: a boundary of 5,000 fits the run's 5,120 (the trace's
    longest request, rounded up), and was refused against a default of 4,096 as the config was read."""
    config = _write(tmp_path, "[allocator]\nboundaries_tokens = [100, 1000, 5000]\n")
    result = _replay(cli, trace, config, "odma")
    assert result.code == 0, result.err


@pytest.mark.parametrize("command", COMMANDS)
def test_a_lora_rank_too_large_blames_lora_rank(cli, tenants_trace, tmp_path, command):
    """adapter_bytes is derived from lora_rank when the config sets only lora_rank: the message
    blames the key the user set."""
    config = _write(tmp_path, "[allocator]\nlora_rank = 4096\n")
    _refused(COMMANDS[command](cli, tenants_trace, config, "unified"), config, "allocator.lora_rank",
             "LoRA adapter", "do not fit")
    config = _write(tmp_path, "[allocator]\nadapter_bytes = 5000000000\n")
    _refused(COMMANDS[command](cli, tenants_trace, config, "unified"), config, "allocator.adapter_bytes")


def test_a_value_the_config_did_not_set_is_not_blamed_on_it(tmp_path):
    """A policy's error names the config's key only when the config set it to the value that ran
    (a flag over it, or a value the command derived, is not the config's)."""
    config = tmp_path / "c.toml"
    exc = ConfigError("too large", key="block_size_tokens")
    named = config_setting_error(exc, config, "allocator", {"block_size_tokens": 32}, {"block_size_tokens": 32})
    assert (named.file, named.key, named.message) == (str(config), "allocator.block_size_tokens", "too large")
    for from_file, ran in [({"block_size_tokens": 16}, {"block_size_tokens": 32}), ({}, {"block_size_tokens": 32})]:
        assert config_setting_error(exc, config, "allocator", from_file, ran) is exc
    assert config_setting_error(exc, None, "allocator", {"block_size_tokens": 32}, {"block_size_tokens": 32}) is exc


# ------------------------------------------------------------------- the engine's refusals, by who set them

ENGINE = [
    ("[scheduler]\nmax_num_batched_tokens = 100\n", "scheduler.max_num_batched_tokens",
     ("max_num_batched_tokens (100) is smaller than max_model_len (5,120)",)),
    ("[scheduler]\nmax_num_seqs = 6000\n", "scheduler.max_num_seqs", ("max_num_seqs (6,000) is above",)),
    ("[allocator]\nblock_size_tokens = 16777216\n", "allocator.block_size_tokens",
     ("vllm-v0 takes blocks of 8, 16, 32 tokens, not 16777216",)),
    ("[allocator]\nmax_model_len_tokens = 900000\n", "allocator.max_model_len_tokens", ("900,000 is past",)),
]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("text, key, words", ENGINE, ids=[e[1] for e in ENGINE])
def test_what_the_engine_refuses_names_the_config_key(cli, trace, tmp_path, command, text, key, words):
    config = _write(tmp_path, text)
    _refused(COMMANDS[command](cli, trace, config, "paged"), config, key, *words)


def test_the_same_refusal_by_a_flag_names_the_flag(cli, trace):
    result = cli("replay", trace, "--device", DEVICE, "--model", MODEL, "--policy", "paged",
                 "--max-num-batched-tokens", "100")
    assert result.code == 1 and "error: --max-num-batched-tokens: max_num_batched_tokens (100)" in result.err
    result = cli("replay", trace, "--device", DEVICE, "--model", MODEL, "--policy", "paged", "--max-num-seqs", "6000")
    assert result.code == 1 and "error: --max-num-seqs: max_num_seqs (6,000) is above" in result.err


# ----------------------------------------------------------------------------- a profile's host link

def _host_link(tmp_path, bandwidth: str):
    """The shipped profile with its [host_link] bandwidth replaced."""
    text = load_device(DEVICE).path.read_text(encoding="utf-8")
    head, link = text.split("[host_link]")
    value = link[link.index('bandwidth = { value = "'):].split('"')[1]
    path = tmp_path / "link.toml"
    path.write_text(head + "[host_link]" + link.replace(f'value = "{value}"', f'value = "{bandwidth}"', 1),
                    encoding="utf-8")
    return path


def test_a_host_link_below_a_quarter_gb_per_s_is_refused_as_its_message_says(tmp_path):
    with pytest.raises(ProfileError) as info:
        read_device(_host_link(tmp_path, "0.2 GB/s"))
    assert info.value.key == "host_link.bandwidth" and "0.25 GB/s (PCIe 1.0 x1)" in str(info.value)
    assert read_device(_host_link(tmp_path, "0.25 GB/s")).host_link.bandwidth_bytes_per_s == 2.5e8
    with pytest.raises(ProfileError, match="at most 1 TB/s"):
        read_device(_host_link(tmp_path, "2 TB/s"))


def test_a_fifo_as_a_config_or_a_device_profile_is_refused_not_read(cli, trace, tmp_path):
    """A red team's case (issue 40): `--config` a FIFO blocked forever on its read; `--device` a
    FIFO was "no such device profile file"."""
    fifo = tmp_path / "c.toml"
    os.mkfifo(fifo)
    r = cli("check", trace, "--config", fifo, "--device", "mlu370-x4", "--model", "DeepSeek-R1-Distill-Qwen-7B")
    assert r.code == 1 and "c.toml: is not a regular file" in r.err, r.err
    r = cli("replay", trace, "--device", fifo, "--model", "DeepSeek-R1-Distill-Qwen-7B", "--policy", "paged")
    assert r.code == 1 and "c.toml: is not a regular file" in r.err and "no such" not in r.err, r.err


def test_a_configs_kv_dtype_is_checked_as_a_precision(cli, trace, tmp_path):
    """A red team's case (issue 40): [plan] kv_dtype = "fp7" was only a mismatch with fp16."""
    config = tmp_path / "c.toml"
    config.write_text('[plan]\nkv_dtype = "fp7"\n')
    r = cli("check", trace, "--config", config, "--device", "mlu370-x4", "--model", "DeepSeek-R1-Distill-Qwen-7B")
    assert r.code == 1 and "key 'plan.kv_dtype': 'fp7' is not a KV precision" in r.err and "did you mean 'fp8'" in r.err


def test_an_integer_past_what_python_or_a_float_holds_is_a_message(tmp_path):
    """A red team's case: 400 digits where a float is due (OverflowError), 6,000 anywhere (Python's
    4,300-digit limit on int(), raised inside tomllib) were internal errors."""
    from odmactl.core.tomltable import load_toml
    from odmactl.run.config import read_config

    big = tmp_path / "big.toml"
    big.write_text("[thresholds]\nmax_migration_rate = 1" + "0" * 400 + "\n")
    with pytest.raises(ConfigError, match="a float can hold.*about 401 digits") as info:
        read_config(big)
    assert info.value.key == "thresholds.max_migration_rate"
    big.write_text("[thresholds]\nmax_migration_rate = 1" + "0" * 6000 + "\n")
    with pytest.raises(ConfigError, match="an integer of more than 4,300 digits") as info:
        load_toml(big)
    assert info.value.file == str(big)
