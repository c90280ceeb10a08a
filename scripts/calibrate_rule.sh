#!/usr/bin/env bash
# The pass rule's calibration in one command (docs/cli.md, "Calibration"): generate fresh honest
# bundles with planted bugs (never committed), measure our blocks on them under the CPU kernel
# choices of CI's lanes (and on aarch64 under qemu where the cross toolchain is installed, see
# .ci/aarch64-check), choose the constants on one half and report false FAILs and power on the
# other. With --validate-only: a fresh set, every bundle judged at the library's constants (the
# validation of constants already set).
#
#   scripts/calibrate_rule.sh --python ../venv/bin/python [--out DIR] [--count N] [--seed S] [--no-aarch64] [--validate-only]
#
# Defaults: --out ../calib (outside the repository), --count 2600, --seed 21 (the set the
# constants were chosen on; the published validation sets are seeds 22 and 23, 2,200 each). About
# 5 minutes to generate on 2 cores, 3 minutes per x86 lane; the table goes to DIR/summary.md.
set -euo pipefail
cd "$(dirname "$0")/.."

python=python3
out=../calib
count=2600
seed=21
aarch64=1
validate_only=0
while [ $# -gt 0 ]; do
    case "$1" in
    --python) python="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --count) count="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --no-aarch64) aarch64=0; shift ;;
    --validate-only) validate_only=1; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
mkdir -p "$out"
out=$(cd "$out" && pwd)

echo "== generating $count bundles into $out (seed $seed, two processes)"
"$python" scripts/calibrate_bundles.py --out "$out" --count "$count" --seed "$seed" --shard 0/2 >"$out/log.0" 2>&1 &
"$python" scripts/calibrate_bundles.py --out "$out" --count "$count" --seed "$seed" --shard 1/2 >"$out/log.1" 2>&1 &
wait
cargo build --release -q -p unet-parity --example calibrate
run=target/release/examples/calibrate

lane() {
    local name="$1"
    shift
    echo "== lane $name: $*"
    env "$@" "$run" "$out" --lane "$name" >"$out/lines.$name.jsonl"
}
lane default UNET_ATTENTION_ISA=auto
lane avx2 UNET_ATTENTION_ISA=avx2
lane none UNET_ATTENTION_ISA=none
lane emerald-rapids-caches UNET_ATTENTION_CACHE=l1d=48K,l2=2M UNET_ATTENTION_GEMM_TILE=rows3
lane small-caches-avx2 UNET_ATTENTION_ISA=avx2 UNET_ATTENTION_CACHE=l1d=32K,l2=256K
lane large-caches UNET_ATTENTION_CACHE=l1d=128K,l2=4M

if [ "$aarch64" = 1 ] && command -v qemu-aarch64-static >/dev/null && command -v aarch64-linux-gnu-gcc >/dev/null; then
    echo "== lane aarch64 (Candle's kernels, under qemu)"
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
    export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
    export CXX_aarch64_unknown_linux_gnu=aarch64-linux-gnu-g++
    cargo build --release -q -p unet-parity --example calibrate --target aarch64-unknown-linux-gnu
    half=(--half validate)
    [ "$validate_only" = 1 ] && half=()
    qemu-aarch64-static -L /usr/aarch64-linux-gnu target/aarch64-unknown-linux-gnu/release/examples/calibrate \
        "$out" --lane aarch64 "${half[@]}" >"$out/lines.aarch64.jsonl"
else
    echo "== no aarch64 lane (needs qemu-aarch64-static and gcc-aarch64-linux-gnu: see .ci/aarch64-check)"
fi

only=()
[ "$validate_only" = 1 ] && only=(--validate-only)
"$python" scripts/calibrate_summary.py "$out"/lines.*.jsonl "${only[@]}" --current "$(
    cargo run --release -q -p unet-parity --example calibrate -- --constants
)" | tee "$out/summary.md"
