#!/usr/bin/env bash
# The plan examples of docs/plan.md ("Plan: what to configure"), made again; the console outputs and
# the configs land in examples/plan_holds/ (OUT) and the rest in WORK:
#   bash examples/plan_holds.sh [WORK] [OUT]     (needs ../shared/traces; about 1 minute on 2 cores)
# 1. Azure conv 2023: a predictor fitted on the first 3,000 requests (--split-by time), plan on the
#    other 16,366 for one MLU370-X4, then check of what plan validated on (--skip).
# 2. Mooncake conversation (mean prompt 12k tokens): a predictor on the first 20%, plan on the next
#    40% for one MLU370-X4 (too small: plan says so and writes nothing) and for four at tp 4, then
#    check of the tp-4 config on the last 40%, which plan never saw.
# A plan that fails its own gate exits 1; the script records the exit code and goes on.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=${1:-/tmp/odmactl-plan-holds}
OUT=${2:-$HERE/plan_holds}
SHARED=$(cd "$HERE/../.." && pwd)/shared/traces
MODEL=DeepSeek-R1-Distill-Qwen-7B
mkdir -p "$WORK" "$OUT" && cd "$WORK"
export COLUMNS=100

run() {  # run NAME COMMAND...: the command's stdout and stderr to OUT/NAME.txt, with its exit code
  local name=$1
  shift
  { echo "\$ ${*/#$WORK\//}"; "$@" 2>&1; echo "exit code $?"; } > "$OUT/$name.txt"
  tail -1 "$OUT/$name.txt"
}

odmactl ingest "$SHARED/AzureLLMInferenceTrace_conv.csv.gz" --out conv.parquet --force > /dev/null
odmactl ingest "$SHARED/mooncake_conversation_trace.jsonl.gz" --out mc.parquet --force > /dev/null
python - <<'EOF'
import polars as pl
conv = pl.read_parquet("conv.parquet")
conv.head(3000).write_parquet("conv_fit.parquet")
conv.slice(3000).write_parquet("conv_plan.parquet")
mc = pl.read_parquet("mc.parquet")
fit, plan = int(mc.height * 0.2), int(mc.height * 0.6)
mc.head(fit).write_parquet("mc_fit.parquet")
mc.slice(fit, plan - fit).write_parquet("mc_plan.parquet")
mc.slice(plan).write_parquet("mc_later.parquet")
EOF
odmactl fit conv_fit.parquet --split-by time --out conv_pred --force > /dev/null
odmactl fit mc_fit.parquet --split-by time --max-model-len 131072 --out mc_pred --force > /dev/null

run azure_conv_plan odmactl plan conv_plan.parquet --device mlu370-x4 --model $MODEL --predictor conv_pred \
  --workers 2 --out conv.toml --report conv.html --force
if [ -f conv.toml ]; then  # plan wrote a config only if it passed its gate on requests 11,457 on
  run azure_conv_check odmactl check conv_plan.parquet --config conv.toml --device mlu370-x4 --model $MODEL \
    --skip 11456
else
  rm -f "$OUT/azure_conv_check.txt"
fi
run mooncake_tp1_plan odmactl plan mc_plan.parquet --device mlu370-x4 --model $MODEL --predictor mc_pred \
  --workers 2 --out mc_tp1.toml --force
run mooncake_tp4_plan odmactl plan mc_plan.parquet --device mlu370-x4 --model $MODEL --predictor mc_pred --tp 4 \
  --workers 2 --out mc_tp4.toml --report mc_tp4.html --force
run mooncake_tp4_check_later odmactl check mc_later.parquet --config mc_tp4.toml --device mlu370-x4 --model $MODEL \
  --tp 4
run mooncake_tp4_on_tp1 odmactl check mc_later.parquet --config mc_tp4.toml --device mlu370-x4 --model $MODEL
for config in conv.toml mc_tp4.toml; do
  [ -f "$config" ] && cp "$config" "$OUT/$config"
done
exit 0
