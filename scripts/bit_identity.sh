#!/usr/bin/env bash
# Bit-identity of every committed half-precision bundle (weights/**/*_f16*, *_bf16*) under each
# CPU kernel lane of CI (.ci/run): one JSON line per lane, bundle and output, with
# max|ours - torch| (0 = bit-identical) and the verdict of the plain and the --strict rule.
#
#   scripts/bit_identity.sh [BINARY] > docs/calibration/bit-identity/<date>-<cpu>.jsonl
#
# BINARY defaults to target/release/unet-parity (cargo build --release -p unet-parity).
# Each lane is a fresh process: the kernels read UNET_ATTENTION_* once per process.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
bin="${1:-target/release/unet-parity}"
cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
family="$(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')"
model="$(grep -m1 '^model[[:space:]]*:' /proc/cpuinfo | cut -d: -f2 | tr -d ' ')"
mapfile -t bundles < <(find weights -name '*.safetensors' | grep -E '_(b?f16)(_|\.)' | sort)
lanes=(
  "default|"
  "isa-avx2|UNET_ATTENTION_ISA=avx2"
  "isa-none|UNET_ATTENTION_ISA=none"
  "emerald-rapids-rows3|UNET_ATTENTION_CACHE=l1d=48K,l2=2M UNET_ATTENTION_GEMM_TILE=rows3"
  "small-caches-avx2|UNET_ATTENTION_ISA=avx2 UNET_ATTENTION_CACHE=l1d=32K,l2=256K"
  "large-caches-no-amx|UNET_ATTENTION_ISA=avx512 UNET_ATTENTION_CACHE=l1d=128K,l2=4M"
)
for entry in "${lanes[@]}"; do
  lane="${entry%%|*}"
  vars="${entry#*|}"
  # shellcheck disable=SC2086
  env $vars "$bin" check "${bundles[@]}" --json >"$tmp/plain.json" || true
  # shellcheck disable=SC2086
  env $vars "$bin" check "${bundles[@]}" --json --strict >"$tmp/strict.json" || true
  jq -nc --slurpfile p "$tmp/plain.json" --slurpfile s "$tmp/strict.json" --arg lane "$lane" --arg vars "$vars" \
    --arg cpu "$cpu" --arg family "$family" --arg model "$model" '
    ($s[0].bundles | map({key: .file, value: .outputs}) | from_entries) as $strict
    | $p[0].bundles[] as $b | $b.outputs[] as $o
    | ($strict[$b.file] // [] | map(select(.name == $o.name)) | first) as $so
    | {cpu: $cpu, cpu_family: $family, cpu_model: $model, lane: $lane, env: $vars,
       file: $b.file, block: $b.block, dtype: $b.dtype, output: $o.name,
       max_abs: $o.max_abs, bit_identical: ($o.max_abs == 0), verdict: $o.verdict,
       pass: $o.pass, strict_verdict: $so.verdict, strict_pass: $so.pass}'
done
