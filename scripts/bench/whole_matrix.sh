#!/usr/bin/env bash
# The whole-model matrix of BENCHMARKS.md ("Whole models in every dtype"): for each dtype (f32,
# bf16, f16) the SD 1.5 U-Net step, the SD VAE decode and the SDXL U-Net step, PyTorch's
# (scripts/bench/whole_models.py run) then ours (examples/bench_whole), one model a process,
# alternating row by row in one run; one JSON line each, tagged with the case and the side.
#
#   scripts/bench/whole_models.py make DIR && scripts/bench/whole_models.py make SDXL_DIR --sdxl
#   cargo build --release -p unet-attention --example bench_whole
#   scripts/bench/whole_matrix.sh DIR SDXL_DIR [PYTHON] > docs/bench/<date>-<cpu>-whole-models.jsonl
#
# Timed runs: 2 for SD 1.5 and the VAE, 1 for SDXL (after one warm-up each).
set -euo pipefail
cd "$(dirname "$0")/../.."
dir="$1"
sdxl="$2"
python="${3:-python}"
ours=target/release/examples/bench_whole
cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
tag() { jq -c --arg case "$1" --arg cpu "$cpu" '. + {case: $case, cpu: $cpu}'; }
for dtype in f32 bf16 f16; do
  for case in "sd15-unet|$dir/unet|unet|2|2" "sd-vae|$dir/vae|vae|2|1" "sdxl-unet|$sdxl/unet|unet|1|1"; do
    IFS='|' read -r name folder model runs batch <<<"$case"
    "$python" scripts/bench/whole_models.py run "$folder" "$model" --runs "$runs" --dtype "$dtype" --batch "$batch" \
      | tail -n 1 | tag "$name"
    "$ours" "$folder" "$model" "$runs" --dtype "$dtype" --batch "$batch" | tail -n 1 | tag "$name"
  done
done
