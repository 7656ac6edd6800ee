"""Benchmark (issue 6, acceptance 5): the two kernels of an on-device decode step on a CUDA GPU.

Run:  python tests/benchmarks/bench_ondevice_gpu.py [--json]

1. The weight GEMM as the on-device probe ran it before StepProbe (one product over the whole
   weight file; the probe now runs one per layer and one for the head): activations [batch, 3584]
   times the transpose of DeepSeek-R1-Distill-Qwen-7B's 15.23 GB of bf16 weights viewed as
   [columns, 3584], with the column count as it falls (2,124,893, odd) and rounded down to a
   multiple of 128 (the probe's GEMM_ALIGN), on zeros and on uniform random values; ms per
   product at batch 1 to 256.
2. The KV reader: 16 GiB read as 256 runs of 64 MiB (contiguous blocks) and as 524,288 runs of
   32 KiB (paged block-layers) at random places in a 20 GiB buffer, by the Triton run reader
   (odmactl/device/runread.py) and by embedding_bag over row views (the reader used without Triton);
   TB/s of bytes read, against a plain sum over 16 GiB.

Each timing is the mean of 5 (KV) or 10 (GEMM) calls after warm-up, by CUDA events. Needs a CUDA
device and about 60 GiB of its memory; exits with a message otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np


def _mean_s(torch, fn, reps: int) -> float:
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def bench_gemm(torch) -> list[dict]:
    hidden, weight_bytes = 3584, 15_231_233_024  # DeepSeek-R1-Distill-Qwen-7B, bf16
    odd = weight_bytes // (2 * hidden)
    rows = []
    for cols in (odd, odd - odd % 128):
        for fill in ("zeros", "uniform"):
            w = torch.zeros(cols, hidden, dtype=torch.bfloat16, device="cuda")
            if fill == "uniform":
                w.uniform_(-0.05, 0.05)
            x = torch.empty(256, hidden, dtype=torch.bfloat16, device="cuda").uniform_(-1, 1)
            out = torch.empty(256, cols, dtype=torch.bfloat16, device="cuda")
            ms = {}
            for n in (1, 16, 64, 128, 256):
                ms[n] = 1e3 * _mean_s(torch, lambda: torch.matmul(x[:n], w.T, out=out[:n]), 10)
            rows.append({"columns": cols, "fill": fill, "ms_by_batch": ms})
            w = out = None  # free the 15 GB before the next fill
            torch.cuda.empty_cache()
    return rows


def bench_reader(torch) -> dict:
    from odmactl.device.ondevice import expand_runs, split_runs
    from odmactl.device.runread import read_tiles

    words = torch.zeros(20 << 28, device="cuda")  # 20 GiB of 4-byte words
    n, total = words.numel(), 16 << 30
    rng = np.random.default_rng(0)
    slot = 16 << 20  # 64 MiB of words
    layouts = {
        "contiguous 64 MiB runs": (rng.permutation(n // slot)[:256] * slot, np.full(256, slot, np.int64)),
        "paged 32 KiB runs": (rng.permutation(n // 8192)[: total // (8192 * 4)] * 8192,
                              np.full(total // (8192 * 4), 8192, np.int64)),
    }
    out = {"sum_tb_per_s": total / _mean_s(torch, lambda: words[: total // 4].sum(), 5) / 1e12}
    for name, (starts, lens) in layouts.items():
        tile_starts, tile_lens = split_runs(starts, lens, 8192)
        a, b = torch.from_numpy(tile_starts).cuda(), torch.from_numpy(tile_lens).cuda()
        sums = torch.empty(tile_starts.size, device="cuda")
        triton_s = _mean_s(torch, lambda: read_tiles(words, a, b, sums, 16), 5)
        want = torch.stack([words[s:s + k].sum() for s, k in list(zip(tile_starts.tolist(), tile_lens.tolist()))[:50]])
        assert torch.allclose(sums[:50], want), "the run reader's sums differ from torch's"
        row = 8192
        rows = words[: n // row * row].view(-1, row)
        idx = torch.from_numpy(expand_runs(starts // row, lens // row)).cuda()
        offsets = torch.arange(0, idx.numel(), 64, device="cuda")
        bag_s = _mean_s(torch, lambda: torch.nn.functional.embedding_bag(idx, rows, offsets, mode="sum"), 5)
        out[name] = {"triton_tb_per_s": total / triton_s / 1e12, "embedding_bag_tb_per_s": total / bag_s / 1e12}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("bench_ondevice_gpu: no CUDA device visible to torch", file=sys.stderr)
        return 1
    doc = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "gemm": bench_gemm(torch), "kv_reader": bench_reader(torch)}
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(f"{doc['device']}, torch {doc['torch']}")
    for row in doc["gemm"]:
        print(f"GEMM {row['columns']:,} columns, {row['fill']}: " +
              " ".join(f"b{n}={ms:.2f} ms" for n, ms in row["ms_by_batch"].items()))
    reader = doc["kv_reader"]
    print(f"sum over 16 GiB: {reader['sum_tb_per_s']:.3f} TB/s")
    for name, rates in reader.items():
        if isinstance(rates, dict):
            print(f"{name}: Triton run reader {rates['triton_tb_per_s']:.3f} TB/s, "
                  f"embedding_bag {rates['embedding_bag_tb_per_s']:.3f} TB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
