#!/usr/bin/env bash
# A lent GPU machine, simulated without a GPU (CI runs this; issue 55): the copy it would receive
# must fit, and what the kit's `candidate` returns must come back.
#
#   scripts/lend_sim.sh            (KIT_BIN_MIB: the binaries' packed size where no kit was built)
#
# 1. The travelling tree, built as the device tool builds it after `scripts/gpu_kit.sh lend-tree on`:
#    the tracked files and the untracked ones git does not ignore, less LEND_TREE_OUT (weights/),
#    plus the carried kit at target/gpu-kit: target/gpu-kit itself where `scripts/gpu_kit.sh build`
#    made one, else `gpu_kit.sh kit-data` (the real bundles, Python packages, scripts and runner;
#    cached in ~/.cache) with a stand-in bin.tar.xz of KIT_BIN_MIB incompressible MiB (default 12:
#    the binaries packed to 10 - 11 MiB in the builds issue 55 counted; CI builds no release CUDA
#    binaries). Fails over 56 MiB (scripts/gpu_kit.sh LEND_LIMIT_MIB; a lent machine copies 64).
# 2. In that copy, `run.sh candidate` in its self-test mode (UNET_KIT_SELFTEST=1: the kit's programs
#    replaced by stand-ins writing lines shaped and sized like theirs; stages, caps, unpacking and
#    packing as on a GPU) against a fake $OUT, three times: as is; with the sdpa stage hanging
#    (its cap must stop it, and the later stages must still run); and killed mid-run, every
#    process at once, while the layers stage hangs (the finished stages must be in $OUT). Each
#    $OUT must hold what a lent machine returns: at most 8 files (the kit promises 6), each at
#    most 16 MiB, 64 MiB together, none more than 2 folders down, names of letters, digits,
#    '.', '_' and '-'.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
cuda_who=lend-sim
# shellcheck source=cuda_toolkit.sh
source scripts/cuda_toolkit.sh
eval "$(sed -n 's/^\(LEND_TREE_OUT\|LEND_LIMIT_MIB\)=/&/p' scripts/gpu_kit.sh)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tree="$tmp/tree"
kit="$tree/target/gpu-kit"
mib() { awk -v b="$1" 'BEGIN { printf "%.2f", b / 1048576 }'; }

# 1. The copy.
echo "== lend-sim: the travelling tree (tracked + untracked-not-ignored, less ${LEND_TREE_OUT[*]}/)"
mkdir -p "$tree"
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
    for out in "${LEND_TREE_OUT[@]}"; do [[ "$f" == "$out/"* ]] && continue 2; done
    [[ -f "$f" ]] && printf '%s\0' "$f"
done | tar --null -T - -cf - | tar -C "$tree" -xf -
tree_bytes=$(du -sb "$tree" | cut -f1)
if [[ -f target/gpu-kit/MANIFEST.json && -f target/gpu-kit/bin.tar.xz ]]; then
    echo "== lend-sim: carrying the kit scripts/gpu_kit.sh build made (target/gpu-kit)"
    mkdir -p "$kit" && cp -r target/gpu-kit/. "$kit/"
    bins="built"
else
    bins="a stand-in of ${KIT_BIN_MIB:=12} MiB (no kit built here)"
    echo "== lend-sim: the kit but its binaries (scripts/gpu_kit.sh kit-data), binaries: $bins"
    scripts/gpu_kit.sh kit-data "$kit" >"$tmp/kit-data.log" 2>&1 || { cat "$tmp/kit-data.log" >&2; cuda_fail "gpu_kit.sh kit-data"; }
    mkdir -p "$tmp/bin/bin"
    for b in unet-parity bench_sdpa bench_bundle fused_check layers_check conv_check bench_whole; do
        printf '#!/bin/sh\nexit 3\n' >"$tmp/bin/bin/$b" && chmod +x "$tmp/bin/bin/$b"
    done
    head -c $((KIT_BIN_MIB << 20)) /dev/urandom >"$tmp/bin/bin/.size-of-the-real-binaries"
    tar -C "$tmp/bin" -cf - bin | xz -0 -T1 >"$kit/bin.tar.xz"
    echo '{"commit": "lend-sim", "cuda_compute_cap": "none: self-test kit"}' >"$kit/MANIFEST.json"
fi
kit_bytes=$(du -sb "$kit" | cut -f1)
total=$(du -sb "$tree" | cut -f1)
echo "== lend-sim: tree $(mib "$tree_bytes") MiB + kit $(mib "$kit_bytes") MiB = $(mib "$total") MiB of $LEND_LIMIT_MIB (64 copied); kit:"
(cd "$kit" && du -sb -- * | while read -r b f; do echo "     $f $(mib "$b") MiB"; done)
((total <= LEND_LIMIT_MIB << 20)) || cuda_fail "the copy is $(mib "$total") MiB, over $LEND_LIMIT_MIB"

# check_out OUT WHAT: OUT within what a lent machine returns.
check_out() {
    local out="$1" what="$2" n=0 sum=0 f rel size part parts
    while IFS= read -r -d '' f; do
        rel="${f#"$out"/}"
        size=$(stat -c %s "$f")
        n=$((n + 1)) sum=$((sum + size))
        ((size <= 16 << 20)) || cuda_fail "$what: $rel is $(mib "$size") MiB, over 16"
        [[ $(tr -cd / <<<"$rel" | wc -c) -le 2 ]] || cuda_fail "$what: $rel is more than 2 folders down"
        IFS=/ read -r -a parts <<<"$rel"
        for part in "${parts[@]}"; do
            [[ "$part" =~ ^[A-Za-z0-9._-]+$ ]] || cuda_fail "$what: $rel: '$part' is not letters, digits, '.', '_', '-'"
        done
    done < <(find "$out" -mindepth 1 \( -type f -o -type l \) -print0)
    [[ -z "$(find "$out" -mindepth 1 ! -type f ! -type d)" ]] || cuda_fail "$what: something in OUT is not a plain file"
    ((n <= 8)) || cuda_fail "$what: $n files in OUT, over 8: $(ls -A "$out" | tr '\n' ' ')"
    ((sum <= 64 << 20)) || cuda_fail "$what: $(mib "$sum") MiB in OUT, over 64"
    echo "== lend-sim: $what: $n files, $(mib "$sum") MiB: $(cd "$out" && for f in *; do printf '%s (%s KiB) ' "$f" $(($(stat -c %s "$f") >> 10)); done)"
}
# summary_has OUT PYTHON-CONDITION MESSAGE: summary.jsonl's lines `s` satisfy the condition.
summary_has() {
    python3 - "$1/summary.jsonl" "$2" <<'PY' || cuda_fail "$3"
import json, sys
s = [json.loads(l) for l in open(sys.argv[1])]
stages = {l["kit_stage"]: l for l in s if "kit_stage" in l}
sys.exit(0 if eval(sys.argv[2]) else 1)
PY
}

# 2. The self-test runs, in the copy, as the lent machine would run them.
run_kit() { # run_kit NAME [ENV...]: candidate in self-test mode into $tmp/NAME
    local name="$1"
    shift
    mkdir -p "$tmp/tmpdir-$name"
    env "$@" UNET_KIT_SELFTEST=1 TMPDIR="$tmp/tmpdir-$name" PACK_EVERY_S=1 \
        bash "$kit/run.sh" candidate "$tmp/$name" >"$tmp/$name.log" 2>&1
}
start=$SECONDS
run_kit plain || { cat "$tmp/plain.log" >&2; cuda_fail "run.sh candidate in self-test mode failed"; }
check_out "$tmp/plain" "candidate"
for f in summary fused sdpa layers whole check; do
    [[ -s "$tmp/plain/$f.jsonl" ]] || cuda_fail "candidate: no $f.jsonl in OUT"
done
summary_has "$tmp/plain" 'list(stages) == ["fused", "sdpa", "layers", "whole", "check"] and not any(v["stopped"] for v in stages.values())' \
    "candidate: the summary lacks a stage, or one was stopped"
summary_has "$tmp/plain" 'sum(1 for l in open(sys.argv[1].replace("summary", "check"))) > 100' \
    "candidate: check.jsonl has no line for most bundles"

set +e
# (bench_torch.py's stand-in hangs in the whole stage too.)
run_kit hang FAKE_HANG=bench_torch_py CAP_SDPA=3 CAP_WHOLE=3
set -e
check_out "$tmp/hang" "candidate with the sdpa stage hanging"
summary_has "$tmp/hang" 'all(stages[s]["stopped"] and stages[s]["seconds"] <= 10 for s in ("sdpa", "whole")) and not stages["layers"]["stopped"] and not stages["check"]["stopped"]' \
    "candidate with the sdpa stage hanging: its cap did not stop it, or the later stages did not run"

# Killed mid-run: the whole process group at once (as a lent machine's limit ends a command),
# while the layers stage hangs in conv_check (its first half of lines written, packed into OUT by
# the periodic packer); the stages finished by then, and those lines, must be in OUT. (The
# hanging stand-in runs under `timeout`, in a process group of its own, which its cap ends.)
mkdir -p "$tmp/tmpdir-cut"
setsid env UNET_KIT_SELFTEST=1 TMPDIR="$tmp/tmpdir-cut" PACK_EVERY_S=1 FAKE_HANG=conv_check CAP_LAYERS=30 \
    bash "$kit/run.sh" candidate "$tmp/cut" >"$tmp/cut.log" 2>&1 &
pid=$!
for _ in $(seq 150); do
    grep -q '"stage": "conv"' "$tmp/cut/layers.jsonl" 2>/dev/null && break
    sleep 0.2
done
kill -KILL -- "-$pid" 2>/dev/null || true
wait "$pid" 2>/dev/null || true
check_out "$tmp/cut" "candidate killed in its layers stage"
for f in summary fused sdpa layers; do
    [[ -s "$tmp/cut/$f.jsonl" ]] || cuda_fail "candidate killed in its layers stage: no $f.jsonl in OUT"
done
summary_has "$tmp/cut" '"fused" in stages and "sdpa" in stages and "layers" not in stages' \
    "candidate killed in its layers stage: the finished stages are not in OUT, or it was not killed in layers"
grep -q '"stage": "conv"' "$tmp/cut/layers.jsonl" || cuda_fail "candidate killed in its layers stage: conv_check's lines so far are not in OUT"
echo "== lend-sim: passed in $((SECONDS - start)) s of self-test runs: copy $(mib "$total") MiB (tree $(mib "$tree_bytes"), kit $(mib "$kit_bytes"), binaries $bins)"
