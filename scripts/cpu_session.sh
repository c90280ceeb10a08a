#!/usr/bin/env bash
# The measurements a session on a CPU we have not tuned on (an Intel Xeon first: issue 31) takes,
# in one command, into one folder of raw lines for docs/bench/ (docs/bench/notes.md, "For a
# session on an Intel CPU", says what each answers):
#
#   scripts/cpu_session.sh [--python PY] [--out DIR] [--rounds N] [--only SUBSTR] [--no-whole]
#
# 1. lscpu, and `bench_sdpa fma-peak` (the FMA peak per core, AVX2 and AVX-512; the layer GEMM's
#    tile alone, rows / interleaved / three-base-register rows: `tile_*_gflops`) into kernels.jsonl;
# 2. `bench_sdpa linear` on SD/SDXL's projection shapes (1024 × 1280 → 1280, 1024 × 5120 → 1280,
#    1024 × 1280 → 10240) under UNET_ATTENTION_ISA=auto with UNET_ATTENTION_GEMM_TILE=auto and
#    rows3, and under UNET_ATTENTION_ISA=avx2, each line prefixed with those settings, into
#    kernels.jsonl (against fma-peak: the 80 % target of issue 31);
# 3. unless --no-whole, with PY (default python3) able to import torch: `bench_torch.py compare
#    --only whole` (or --only SUBSTR), ROUNDS alternating rounds (default 2), with the default GEMM
#    loop (whole.jsonl, whole.md) and with UNET_ATTENTION_GEMM_TILE=rows3 (whole-rows3.*). About
#    10 minutes each on 2 cores; the first run also exports the bundles to target/bench_blocks.
# 4. with those bundles, lucidrains 32² and SD 1.5 mid by `bench_bundle` with rayon's default pool
#    (`--rayon-default`) and with the main thread a worker (the default), alternating, 3 rounds,
#    into pool.jsonl: the spread between calls (issue 31 saw ours twice as wide as PyTorch's).
#
# DIR defaults to docs/bench/<date>-<cpu>-<commit>. Builds the two release examples first (the
# first build compiles Candle: minutes). Exit 0: everything ran; 1: a step failed (the others still
# ran; see DIR/session.log).
set -uo pipefail
cd "$(dirname "$0")/.."

py=python3 out="" rounds=2 only=whole whole=yes
while [[ $# -gt 0 ]]; do
    case "$1" in
    --python) py="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --only) only="$2"; shift 2 ;;
    --no-whole) whole=no; shift ;;
    -h | --help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "cpu_session.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

model=$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -n1)
slug=$(printf '%s' "${model:-unknown-cpu}" | tr '[:upper:]' '[:lower:]' | tr -cs 'a-z0-9' '-' | sed 's/^-//; s/-$//' | cut -c1-40)
out="${out:-docs/bench/$(date +%F)-$slug-$(git rev-parse --short HEAD 2>/dev/null || echo nogit)}"
mkdir -p "$out" || exit 1
log="$out/session.log"
failed=0
note() { echo "cpu_session: $*" | tee -a "$log" >&2; }
step() { "$@" 2>>"$log" || { note "failed: $*"; failed=1; }; }

note "CPU: ${model:-unknown}; results in $out"
lscpu >"$out/lscpu.txt" 2>&1
note "building the release examples (bench_sdpa, bench_bundle)"
step cargo build --release --example bench_sdpa -p unet-attention
step cargo build --release --example bench_bundle -p unet-parity
bench=target/release/examples/bench_sdpa
[[ -x "$bench" ]] || { note "no $bench: stopping"; exit 1; }

kernels="$out/kernels.jsonl"
note "fma-peak"
step "$bench" fma-peak >>"$kernels"
# One linear shape under the given ISA cap and GEMM loop, the settings prefixed to its line.
linear() {
    local isa="$1" tile="$2"
    shift 2
    UNET_ATTENTION_ISA="$isa" UNET_ATTENTION_GEMM_TILE="$tile" "$bench" linear "$@" |
        sed "s/^{/{\"isa_setting\": \"$isa\", \"gemm_tile\": \"$tile\", /" >>"$kernels"
}
for shape in "1024 1280 1280" "1024 5120 1280" "1024 1280 10240"; do
    note "linear $shape"
    for round in 1 2; do
        # shellcheck disable=SC2086 # the shape is three words
        step linear auto auto $shape
        step linear auto rows3 $shape
        step linear avx2 auto $shape
    done
done

if [[ "$whole" == yes ]]; then
    if ! "$py" -c 'import torch' 2>>"$log"; then
        note "$py cannot import torch: no whole blocks (set up the venv of scripts/README.md, or --python)"
        failed=1
    else
        for tile in auto rows3; do
            tag=whole
            [[ "$tile" == auto ]] || tag="whole-$tile"
            note "bench_torch.py compare --only $only --rounds $rounds (UNET_ATTENTION_GEMM_TILE=$tile)"
            UNET_ATTENTION_GEMM_TILE="$tile" step "$py" scripts/bench_torch.py compare "$bench" \
                --bundle-bin target/release/examples/bench_bundle --only "$only" --rounds "$rounds" \
                --out "$out/$tag.jsonl" >"$out/$tag.md"
        done
    fi
fi
for case in ddpm_mid_32 sd15_mid; do
    bundle="target/bench_blocks/$case.safetensors"
    [[ -f "$bundle" ]] || continue
    note "bench_bundle $case, rayon's default pool against the main thread a worker"
    for round in 1 2 3; do
        step target/release/examples/bench_bundle "$bundle" --reps 10 --rayon-default >>"$out/pool.jsonl"
        step target/release/examples/bench_bundle "$bundle" --reps 10 >>"$out/pool.jsonl"
    done
done
note "done (exit $failed)"
exit "$failed"
