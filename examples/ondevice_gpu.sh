#!/usr/bin/env bash
# On-device replay on a GPU, real size: calibrate the GPU into a measured profile, then replay the
# shipped Azure conv sample with the full DeepSeek-R1-Distill-Qwen-7B on it (no --scale), every
# policy, and compare each iteration's measured time (decodes, prompt chunks, prefills) with the cost
# model's. On an H200: PROFILE_NAME=nvidia-h200 DATASHEET=h200 (examples/ondevice_h200.md). A second replay
# compares the same iterations with the datasheet profile of the card instead of the measured one.
#
#   bash examples/ondevice_gpu.sh OUTDIR
#
# Writes the profile to profiles/devices/measured/$PROFILE_NAME.toml and, under OUTDIR, the ingested
# trace, ondevice_gpu.json (measured profile), ondevice_gpu_datasheet.json and ondevice_gpu.png.
# Settings (environment): ODMACTL (how to run odmactl), DEVICE (torch device, cuda), PROFILE_NAME,
# DATASHEET (the card's profile in profiles/devices/), LIMIT (requests replayed), SCALE (share of
# the model's layers kept, 1 = real size), KV_POOL (the same pool for both replays, so an offline
# replay runs the same iterations under either profile), CALIBRATE_FLAGS (e.g. --quick).
set -euo pipefail
out_dir=${1:?usage: bash examples/ondevice_gpu.sh OUTDIR}
odmactl=${ODMACTL:-odmactl}
device=${DEVICE:-cuda}
profile_name=${PROFILE_NAME:-nvidia-h100-80gb-hbm3}
datasheet=${DATASHEET:-h100-sxm}
limit=${LIMIT:-1000}
scale=${SCALE:-1}
kv_pool=${KV_POOL:-48 GiB}
model=DeepSeek-R1-Distill-Qwen-7B
mkdir -p "$out_dir"

$odmactl calibrate --device "$device" ${CALIBRATE_FLAGS:-} --out "profiles/devices/measured/$profile_name.toml" --force
$odmactl ingest traces/azure_conv_2023_sample.csv.gz --out "$out_dir/azure_conv.parquet" --force
# offline: all requests wait at t=0, so batches fill to max_num_seqs and the KV term of each step is large
$odmactl replay "$out_dir/azure_conv.parquet" --device "$device" --on-device --scale "$scale" --model "$model" \
    --compare static,paged,s3,odma --predictor oracle --offline --limit "$limit" --kv-pool "$kv_pool" \
    --out "$out_dir/ondevice_gpu.json" --plot "$out_dir/ondevice_gpu.png" --force
$odmactl replay "$out_dir/azure_conv.parquet" --device "$device" --on-device --scale "$scale" --model "$model" \
    --profile "$datasheet" --compare paged,odma --predictor oracle --offline --limit "$limit" --kv-pool "$kv_pool" \
    --out "$out_dir/ondevice_gpu_datasheet.json" --force
