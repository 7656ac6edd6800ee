"""`odmactl calibrate` on the CPU: a valid measured profile whose figures agree with numpy."""

from __future__ import annotations

import json
import re
import statistics
import time

import numpy as np
import pytest
import torch

from odmactl.device.calibrate import CHUNK_BYTES
from odmactl.hw.cost import CostModel, KvLayout
from odmactl.hw.profiles import load_model, read_device


def numpy_copy_bytes_per_s(num_bytes: int = 256 << 20, repeats: int = 5) -> float:
    """STREAM-convention copy bandwidth (bytes read + bytes written per second) of np.copyto."""
    src = np.ones(num_bytes, dtype=np.uint8)
    dst = np.empty_like(src)
    np.copyto(dst, src)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return 2 * num_bytes / statistics.median(times)


def test_calibrate_cpu_quick_writes_a_valid_measured_profile(tmp_path, cli, conv_sample_head):
    out = tmp_path / "host.toml"
    result = cli("calibrate", "--device", "cpu", "--quick", "--out", out, "--json")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    profile = read_device(out)
    assert profile.measured and profile.memory_type == "unknown"
    assert profile.measurement["command"] == f"odmactl calibrate --device cpu --quick --out {out}"
    assert profile.measurement["torch"] == torch.__version__
    assert profile.measurement["device"].startswith("CPU")
    assert profile.bandwidth.chunk_bytes == CHUNK_BYTES
    assert all(0 < e <= 1 for e in profile.bandwidth.efficiency)
    assert profile.bandwidth.sequential_efficiency == 1.0
    for key in ("memory.peak_bandwidth", "compute.peak_fp16", "bandwidth.scattered"):
        assert profile.sources[key].startswith("measured ")
    # the [kernels] gemm table: each row's efficiency is the roofline at this profile's peaks over the time taken
    gemm = report["calibration"]["gemm"]
    kernels = profile.kernels
    assert kernels is not None and kernels.gemm_tokens == (1, 16, 64) and kernels.decode_layer_fixed_s == 0.0
    assert gemm["dtype"] == profile.compute_dtype
    n_k = gemm["weight_bytes"] // 2
    for row, eff in zip(gemm["rows"], kernels.gemm_efficiency):
        ideal = max(gemm["weight_bytes"] / profile.peak_bandwidth_bytes_per_s, 2 * n_k * row["tokens"] / profile.peak_flops(gemm["dtype"]))
        assert eff == pytest.approx(min(1.0, max(0.01, ideal / row["seconds"])), abs=2e-4)
    cost = CostModel(profile, load_model("DeepSeek-R1-Distill-Qwen-7B"), compute_dtype=profile.compute_dtype)
    assert cost.gemms.efficiency == tuple(float(e) for e in kernels.gemm_efficiency)  # the model reads it
    sizes = [int(re.search(r"(\d+)\^3 matmul", profile.sources[f"compute.peak_{d}"]).group(1)) for d in ("fp16", "bf16")]
    assert all(256 <= n <= 1024 and n & (n - 1) == 0 for n in sizes)  # the size timed, at most --quick's on a CPU

    # sequential read of the same order as numpy's copy, measured here: within 4x either way (a
    # units slip, bits for bytes or a 1000x, fails; a shared 2-vCPU machine's drift between the two
    # measurements, seen at 2.7x in a CI run, does not)
    numpy_bw = numpy_copy_bytes_per_s()
    seq = profile.peak_bandwidth_bytes_per_s
    assert 0.25 <= seq / numpy_bw <= 4.0, (seq, numpy_bw)

    cal = report["calibration"]
    assert cal["sequential_read_bytes_per_s"] == pytest.approx(seq, rel=1e-4)
    assert cal["copy_bytes_per_s"] > 0 and cal["matmul_fp16_flops"] > 0
    attention = cal["attention"]
    assert attention["paged_s"] > 0 and attention["contiguous_s"] > 0
    assert attention["paged_over_contiguous"] == pytest.approx(attention["paged_s"] / attention["contiguous_s"], rel=1e-4)
    # 64-byte runs cannot beat a contiguous copy on any real memory system
    assert cal["scattered"][0]["ratio"] < 0.9

    # how disturbed the run was is kept with the profile (the console warns past NOISY_SPREAD)
    noise = cal["noise"]
    assert noise["timings"] == 2 + 2 * len(CHUNK_BYTES) + 2 + len(kernels.gemm_tokens) + 2
    assert noise["widest_repeat_spread"] >= 0 and noise["copy_rate_spread"] >= 0 and isinstance(noise["noisy"], list)
    assert profile.calibration["noise"] == noise

    # the measured profile drives the cost model like a shipped one
    cost = CostModel(profile, load_model("Llama-2-7B"))
    assert cost.decode_step_s(np.full(4, 512), KvLayout.paged(16)) > cost.decode_step_s(np.full(4, 512), KvLayout.contiguous()) * 0.99
    shown = cli("profiles", "show", out, "--json")
    assert shown.code == 0 and json.loads(shown.out)["measured"] is True

    # `profiles show` repeats the warnings of a disturbed run, from the profile's own record
    text = out.read_text(encoding="utf-8")
    start = text.index("[calibration.noise]")
    end = text.find("\n[", start + 1)
    busy = ('[calibration.noise]\ntimings = 27\nwidest_repeat_spread = 1.0\nwidest = "256 KiB runs gathered"\n'
            'noisy = []\ncopy_rate_spread = 0.06\nefficiency_dips = ["1 MiB", "2 MiB"]\ngathers_past_copy = []\n')
    noisy = tmp_path / "noisy.toml"
    noisy.write_text(text[:start] + busy + (text[end + 1:] if end >= 0 else ""), encoding="utf-8")
    shown = cli("profiles", "show", noisy)
    assert shown.code == 0, shown.err
    assert "warning: scattered reads of 1 MiB and 2 MiB runs had under 25%" in " ".join(shown.out.split())
    # and every command that replays on it says so on stderr before its work; a shipped one says nothing
    from odmactl.cli.inputs import profile_warnings

    assert profile_warnings(str(noisy)) == [f"device profile {noisy}: scattered reads of 1 MiB and 2 MiB runs had "
                                            "under 25% of a shorter run's efficiency, which longer runs do not have on "
                                            "an idle device: run calibrate again on an idle machine"]
    assert profile_warnings("mlu370-x4") == profile_warnings("no-such") == []
    trace = conv_sample_head(200)
    for command in (["replay", trace, "--policy", "paged"],
                    ["capacity", trace, "--policies", "paged", "--slo", "ttft_p99=3000s", "--predictor", "oracle"]):
        said = cli(*command, "--device", noisy, "--model", "Llama-2-7B", "--json")
        assert said.code == 0, said.err
        assert said.err.startswith(f"warning: device profile {noisy}: scattered reads"), said.err
        assert json.loads(said.out)["warnings"][0].startswith(f"device profile {noisy}:")
    # a hand-edited record is refused where the profile is read, naming the key, for every command
    for bad, key in [("timings = 0", "timings"), ('timings = "27"', "timings"), ("noisy = 3", "noisy"),
                     ('efficiency_dips = "1 MiB"', "efficiency_dips"), ("efficiency_dips = [1, 2]", "efficiency_dips"),
                     ('gathers_past_copy = ["\\u001b[31mx"]', "gathers_past_copy"),
                     ('widest_repeat_spread = "x"', "widest_repeat_spread"), ("copy_rate_spread = -1", "copy_rate_spread"),
                     ('noisy = ["a", "b"]\ntimings = 1', "noisy")]:
        edited = busy
        for line in bad.split("\n"):
            name = line.split(" = ")[0]
            edited = "\n".join(line if row.startswith(name + " = ") else row for row in edited.split("\n"))
        noisy.write_text(text[:start] + edited + (text[end + 1:] if end >= 0 else ""), encoding="utf-8")
        for args in (("profiles", "show", noisy), ("profiles", "show", noisy, "--json")):
            r = cli(*args)
            assert r.code == 1 and f"calibration.noise.{key}" in r.err and "internal error" not in r.err, (bad, r.err)
    tables = text.split("\n[")  # every [calibration...] table out, and calibration a string at the top
    kept = "\n[".join(t for t in tables if not t.lstrip("[").startswith("calibration"))
    noisy.write_text('calibration = "hello"\n' + kept, encoding="utf-8")
    r = cli("profiles", "show", noisy)
    assert r.code == 1 and "key 'calibration': expected a table" in r.err, r.err


def test_calibrate_never_clobbers_and_refuses_a_missing_device(tmp_path, cli):
    out = tmp_path / "kept.toml"
    out.write_text("good = true\n", encoding="utf-8")
    result = cli("calibrate", "--device", "cpu", "--quick", "--out", out)
    assert result.code == 1 and "already exists" in result.err
    assert out.read_text(encoding="utf-8") == "good = true\n"
    bad = cli("calibrate", "--device", "tpu", "--out", tmp_path / "x.toml")
    assert bad.code == 1 and "--device expects one of" in bad.err
    missing_dir = cli("calibrate", "--device", "cpu", "--out", tmp_path / "nope" / "x.toml")
    assert missing_dir.code == 1 and "does not exist" in missing_dir.err
    not_toml = cli("calibrate", "--device", "cpu", "--quick", "--out", tmp_path / "p.json")
    assert not_toml.code == 1 and "ending in .toml" in not_toml.err and not (tmp_path / "p.json").exists()
    if not torch.cuda.is_available():
        cuda = cli("calibrate", "--device", "cuda", "--out", tmp_path / "gpu.toml")
        assert cuda.code == 1 and "no CUDA device" in cuda.err
        assert not (tmp_path / "gpu.toml").exists()


class _SlowTorch:
    """torch, but its matmul sleeps `first_s` on its first call (a GPU creating its BLAS handle) and
    `each_s` on every call (a slow kernel)."""

    def __init__(self, first_s: float, each_s: float) -> None:
        self.first_s, self.each_s, self.calls, self.sizes = first_s, each_s, 0, []

    def __getattr__(self, name):
        return getattr(torch, name)

    def matmul(self, a, b):
        self.calls += 1
        self.sizes.append(a.shape[0])
        time.sleep(self.each_s + (self.first_s if self.calls == 1 else 0.0))
        return torch.matmul(a, b)


def test_the_matmul_is_sized_after_a_warm_up_and_says_its_size():
    """The first product on a device can take far longer than the rest (on an H200 the sizing probe
    was that product, and calibrate measured launch-bound 256^3 products: 884 GFLOP/s for a card
    of 750 TFLOP/s); a kernel that is slow throughout keeps a small matrix."""
    from odmactl.device.calibrate import MATMUL_PROBE_N, _matmul_rate, _Timer

    first_slow = _SlowTorch(first_s=0.3, each_s=0.0)
    rate, n = _matmul_rate(first_slow, _Timer(torch, "cpu", 1, 0), torch.device("cpu"), torch.float32, "fp32", 512)
    assert n == 512 and rate > 0 and first_slow.sizes[0] == MATMUL_PROBE_N
    slow = _SlowTorch(first_s=0.0, each_s=0.03)  # 8 x 0.03 s > MATMUL_TARGET_S: no larger probe
    rate, n = _matmul_rate(slow, _Timer(torch, "cpu", 1, 0), torch.device("cpu"), torch.float32, "fp32", 512)
    assert n == MATMUL_PROBE_N and set(slow.sizes) == {MATMUL_PROBE_N}


def test_a_disturbed_calibration_says_so():
    """Each timing's repeats are kept as a spread, (max - min) / median, and those past NOISY_SPREAD
    are named; copies of the same bytes at different run lengths must agree. A run with a few noisy
    timings (an idle 2-vCPU VM: 1-3 of 27) says nothing; a disturbed one (a CI install compiling
    beside it: 20 of 27, copies 109% apart) warns."""
    from odmactl.device.calibrate import NOISY_SPREAD, noise
    from odmactl.render.console_profiles import noise_lines

    idle = noise([("sequential read", 0.02), ("device copy", 0.05), ("64 B runs gathered", 2.4), ("bf16 matmul", 0.1)],
                 [10e9, 12e9, 8.5e9])
    assert idle == {"timings": 4, "widest_repeat_spread": 2.4, "widest": "64 B runs gathered",
                    "noisy": ["64 B runs gathered"], "copy_rate_spread": 0.35, "efficiency_dips": [],
                    "gathers_past_copy": []}
    assert noise_lines({"noise": idle}) == [] and noise_lines({}) == []  # a profile from before the record
    busy = noise([("sequential read", 0.02), ("64 B runs gathered", 3.5), ("device copy", NOISY_SPREAD + 0.01)],
                 [4.2e9, 28e9, 23e9])
    assert busy["noisy"] == ["64 B runs gathered", "device copy"] and busy["widest"] == "64 B runs gathered"
    lines = noise_lines({"noise": busy})
    assert len(lines) == 2 and lines[0].startswith("2 of 3 timings spread more than 25% over their repeats (widest: "
                                                    "64 B runs gathered, 350%)")
    assert "103% apart" in lines[1]


def test_a_scattered_run_reading_far_below_a_shorter_one_is_a_dip():
    """Longer runs read at least as well on an idle device, but for cache sizes: an idle run's
    deepest dip here (256 KiB at 0.42 of 64 KiB's 1.0) passes; beside two memory-bound jobs 1 MiB
    and 2 MiB read 0.031 and 0.063 after 1.0 (the copies and the repeats agreeing), a warning."""
    from odmactl.device.calibrate import EFFICIENCY_DIP, noise
    from odmactl.render.console_profiles import noise_lines

    spreads, copies = [("sequential read", 0.02)], [10e9, 10.5e9]
    idle = noise(spreads, copies, [("64 B", 0.155), ("64 KiB", 1.0), ("256 KiB", 0.4226), ("1 MiB", 0.79)])
    assert idle["efficiency_dips"] == [] and noise_lines({"noise": idle}) == []
    busy = noise(spreads, copies, [("64 B", 0.52), ("256 KiB", 1.0), ("1 MiB", 0.031), ("2 MiB", 0.0626)])
    assert busy["efficiency_dips"] == ["1 MiB", "2 MiB"]
    assert noise_lines({"noise": busy}) == [
        f"scattered reads of 1 MiB and 2 MiB runs had under {EFFICIENCY_DIP:.0%} of a shorter run's efficiency, "
        "which longer runs do not have on an idle device: run calibrate again on an idle machine"]
    one = noise(spreads, copies, [("256 KiB", 1.0), ("1 MiB", 0.031)])
    assert noise_lines({"noise": one})[0].startswith("scattered reads of 1 MiB runs had under")
    # a gather 2.3 times as fast as the copy (256 KiB beside the same jobs) is flagged, 1.04 (the
    # highest of four idle runs, 64 KiB) is not; a dip is judged on the capped efficiencies
    fast = noise(spreads, copies, [("64 B", 0.5), ("64 KiB", 1.04), ("256 KiB", 2.31), ("1 MiB", 0.2)])
    assert fast["gathers_past_copy"] == ["256 KiB"] and fast["efficiency_dips"] == ["1 MiB"]
    assert noise_lines({"noise": fast})[1] == (
        "random 256 KiB runs were gathered more than 1.5 times as fast as a contiguous copy of the same bytes, which "
        "no memory does (the profile caps their efficiency at 1): run calibrate again on an idle machine")
    assert noise(spreads, copies, [("64 B", 0.5), ("1 MiB", 4.0), ("2 MiB", 0.3)])["efficiency_dips"] == []
    # just above the limit is no dip; the first run length has nothing to dip below
    edge = noise(spreads, copies, [("64 B", 0.01), ("1 KiB", 0.8), ("4 KiB", EFFICIENCY_DIP * 0.8 + 1e-9)])
    assert edge["efficiency_dips"] == []
