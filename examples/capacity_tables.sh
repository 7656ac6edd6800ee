#!/usr/bin/env bash
# The capacity tables of docs/capacity.md ("Capacity: devices at a latency SLO"), made again:
#   bash examples/capacity_tables.sh [WORK]     (needs ../shared/traces; about 4 minutes on 2 cores)
#   ROUTER=round-robin-ready bash examples/capacity_tables.sh [WORK]   (every capacity run behind that --router)
# Azure conv 2023: the predictor is fitted on the first 6,000 requests, plan chooses ODMA's config on
# the other 13,366 for one MLU370-X4 with a 1% migration-rate limit (at 0.5% its pick fails the gate
# on the held-out part and plan writes no config), and capacity runs on those 13,366 on MLU370-X4
# (vllm-v0) and A100-80GB-SXM (vllm-v1) at tp 1, 2 and 4, applying that config to every size (--allow-mismatch).
# Mooncake conversation: four MLU370-X4 at tp 4, oracle lengths, a looser SLO; then prefix caching on and
# off (docs/capacity.md, "Prefix caching on Mooncake"): MLU370-X4 at tp 4 (vllm-v0), A100 and H100 at tp 1, 2 and 4 (vllm-v1).
set -euo pipefail
WORK=${1:-/tmp/odmactl-capacity}
SHARED=$(cd "$(dirname "$0")/../.." && pwd)/shared/traces
MODEL=DeepSeek-R1-Distill-Qwen-7B
mkdir -p "$WORK" && cd "$WORK"
ROUTE=${ROUTER:+--router $ROUTER}  # capacity's default router unless ROUTER is set

odmactl ingest "$SHARED/AzureLLMInferenceTrace_conv.csv.gz" --out conv.parquet --force > /dev/null
python -c "
import polars as pl
f = pl.read_parquet('conv.parquet')
f.head(6000).write_parquet('train.parquet'); f.slice(6000).write_parquet('rest.parquet')"
odmactl fit train.parquet --out pred --split-by time --max-model-len 8192 --force > /dev/null
odmactl plan rest.parquet --device mlu370-x4 --model $MODEL --predictor pred --workers 2 --max-migration-rate 0.01 \
  --out c.toml --force > /dev/null
# the same config with a full large pool's blocks waiting for it (plan writes large_spill = true here,
# docs/plan.md; without it they wait: docs/policies.md, large_spill)
python -c "
s = open('c.toml').read()
i = s.index('\n[allocator]\n')
j = s.index('\n[', i + 1)
assert '\nlarge_spill = true\n' in s[i:j], 'plan wrote no large_spill: c.toml is the waiting config'
open('c_wait.toml', 'w').write(s[:i] + s[i:j].replace('\nlarge_spill = true\n', '\n', 1) + s[j:])"
odmactl capacity rest.parquet --device mlu370-x4 --model $MODEL --slo ttft_p99=2s,tpot_p99=100ms --config c_wait.toml \
  --allow-mismatch --max-migration-rate 0.01 --predictor pred --tp 1 --workers 2 $ROUTE --policies odma \
  --out conv-mlu370-x4-wait.json --force
# each row sized behind both least-kv and round-robin-ready, keeping the fewest (README, "Which policy wins")
odmactl capacity rest.parquet --device mlu370-x4 --model $MODEL --slo ttft_p99=2s,tpot_p99=100ms --config c.toml \
  --allow-mismatch --max-migration-rate 0.01 --predictor pred --tp 1 --workers 2 --router least-kv,round-robin-ready \
  --out conv-mlu370-x4-routers.json --markdown conv-mlu370-x4-routers.md --force > /dev/null
# each device under the engine it runs (the config, planned on the MLU370, records vllm-v0; the A100 runs vLLM v1)
for run in mlu370-x4:vllm-v0 a100-80gb-sxm:vllm-v1; do
  device=${run%%:*} engine=${run##*:}
  odmactl capacity rest.parquet --device $device --model $MODEL --slo ttft_p99=2s,tpot_p99=100ms --config c.toml \
    --allow-mismatch --max-migration-rate 0.01 --predictor pred --tp 1,2,4 --workers 2 $ROUTE --engine $engine \
    --out "conv-$device.json" --report "conv-$device.html" --force
done

odmactl ingest "$SHARED/mooncake_conversation_trace.jsonl.gz" --out mc.parquet --force > /dev/null
odmactl capacity mc.parquet --device mlu370-x4 --model $MODEL --slo ttft_p99=60s,tpot_p99=2s --predictor oracle \
  --tp 4 --workers 2 $ROUTE --out mooncake-tp4.json --report mooncake-tp4.html --force
for run in mlu370-x4:4 a100-80gb-sxm:1,2,4 h100-sxm:1,2,4; do
  device=${run%%:*} tp=${run##*:}
  for caching in prefix-caching no-prefix-caching; do
    odmactl capacity mc.parquet --device $device --model $MODEL --slo ttft_p99=60s,tpot_p99=2s --predictor oracle \
      --tp $tp --workers 2 $ROUTE --$caching --out "mooncake-$device-$caching.json" --force > /dev/null
  done
done

# Azure code and conv 2023, whole, both arrival processes (docs/capacity.md, "Azure code and conv, both arrival processes")
odmactl ingest "$SHARED/AzureLLMInferenceTrace_code.csv.gz" --out code.parquet --force > /dev/null
for trace in code conv; do
  for device in a100-80gb-sxm mlu370-x4; do
    for arrivals in trace poisson; do
      odmactl capacity $trace.parquet --device $device --model $MODEL --slo ttft_p99=2s,tpot_p99=100ms \
        --policies static,paged,s3,odma --predictor oracle --tp 1,2,4 --workers 2 $ROUTE --arrivals $arrivals \
        --out "$trace-$device-$arrivals.json" --force > /dev/null
    done
  done
done
