#!/usr/bin/env bash
# The GPU kit: everything a GPU machine without Rust or network needs to prove the CUDA path.
#
#   scripts/gpu_kit.sh build [DIR]      build it here (no GPU needed) into DIR (default target/gpu-kit)
#   scripts/gpu_kit.sh build --dry-run  only check that what the build needs is here, and say what it
#                                       would do (CI runs this)
#   scripts/gpu_kit.sh selftest         on a machine without a GPU: the kit's run.sh must stop with
#                                       exit code 3 and one line, for every stage; and every binary
#                                       run.sh calls must be one the build puts in the kit (CI runs this)
#   scripts/gpu_kit.sh lend-tree on|off|size
#                                       on: leave weights/ out of this checkout's working tree (git
#                                       sparse-checkout; the index's entries stay, nothing is staged),
#                                       so that tree + kit fit the 64 MiB a lent GPU machine copies;
#                                       off: bring weights/ back; size: what would travel, in MiB
#
# The kit: bin.tar.xz with bin/{unet-parity,bench_sdpa,bench_bundle,fused_check,layers_check,conv_check,bench_whole}
# built with `--features cudnn` (cuda plus this crate's cuDNN convolutions; release, stripped;
# candle-kernels' PTX for CUDA_COMPUTE_CAP, default 90 = H100/H200; this crate's kernels as SASS
# for UNET_ATTENTION_CUDA_ARCHS, default sm_80 and sm_90, plus compute_80 PTX; run.sh unpacks
# them into a temporary folder), weights.tar.xz (the committed bundles less
# weights/accuracy, about 39 MiB packed; run.sh unpacks them likewise), scripts/ (bench_torch.py and what it imports: KIT_SCRIPTS), wheels/
# (diffusers, denoising-diffusion-pytorch, stable-diffusion-sdkit, guided-diffusion-sdk and the
# packages they import that a plain PyTorch install lacks; pure-Python, installed --no-deps by
# run.sh), run.sh and MANIFEST.json (commit, compute capability, sizes). Copy the folder to the GPU
# machine and run `./run.sh` there (see its header).
#
# Room on a lent GPU machine: the working tree travels with the carried paths under a 64 MiB
# limit, and the tracked tree alone is about 77 MiB (weights/ 75 MiB). So, before the call,
# `scripts/gpu_kit.sh lend-tree on` (weights/ leaves the working tree: about 3 MiB travel), carry
# target/gpu-kit (about 55 MiB: its weights.tar.xz holds the bundles), run
# `target/gpu-kit/run.sh all "$OUT"` there, and `scripts/gpu_kit.sh lend-tree off` afterwards.
# `lend-tree size` prints tree + kit and fails over 64 MiB.
#
# Building links against CUDA 13.0: scripts/cuda_toolkit.sh installs nvcc, cuBLAS, cuRAND and NVRTC
# from PyPI wheels into ~/.cache/unet-attention/cuda-13.0 (about 1.2 GB, once) and builds a stub
# libcuda and a stub libcudnn (soname libcudnn.so.9; the GPU machine's PyTorch brings cuDNN 9); the release build gets its own target folder there. First build: about 15 min on two
# cores (candle-kernels' PTX); later ones reuse it.
#
# Not in the kit: `--features flash-attn` (candle-flash-attn's build script fetches CUTLASS from
# GitHub, which these machines cannot reach, then compiles for hours), so attention on CUDA runs
# the Candle tensor-op path (key-chunked), not FlashAttention.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
cuda_who=gpu-kit
# shellcheck source=cuda_toolkit.sh
source scripts/cuda_toolkit.sh

# Wheels of the Python packages bench_torch.py's whole-block cases import, pinned as in
# scripts/requirements.txt, and those they pull in that PyTorch's own install does not have.
# The binaries of the kit (`--bin unet-parity`, the rest `--example`): run.sh calls these only.
KIT_BINS=(unet-parity bench_sdpa bench_bundle fused_check layers_check conv_check bench_whole)
# The features the kit is built with: cuda, and cuDNN for the convolutions (the crate's own, f16/bf16
# accumulated in f32 as PyTorch's).
KIT_FEATURES=cudnn
KIT_WHEELS=(diffusers==0.42.1 denoising-diffusion-pytorch==2.3.4 ema-pytorch==0.8.3 accelerate==1.15.0
    pytorch-fid==0.3.0 "psutil==7.2.2")
# What of scripts/ the kit carries: bench_torch.py and every module it imports, directly or not (the
# dry run checks this list against `scripts/check_imports.py --needs bench_torch`).
KIT_SCRIPTS=(scripts/bench_torch.py scripts/export_models.py scripts/parity_bundle.py scripts/parity_trace.py
    scripts/upstream.py scripts/bench scripts/parity scripts/reference scripts/export)

usage() {
    sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
}

selftest() {
    local tmp err code stage
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
        echo "gpu-kit selftest: skipped, this machine has a GPU"
        return 0
    fi
    tmp=$(mktemp -d)
    set +e
    # A PATH without nvidia-smi: what a machine without a GPU looks like to run.sh.
    for stage in candidate all fused layers conv check core fusedcore splits whole; do
        err=$(PATH=/usr/bin:/bin bash scripts/gpu_kit/run.sh "$stage" "$tmp/out" 2>&1 >/dev/null)
        code=$?
        [[ $code -eq 3 ]] || { rm -rf "$tmp"; cuda_fail "selftest: run.sh $stage without a GPU exited $code, expected 3: $err"; }
        [[ $(printf '%s\n' "$err" | grep -c .) -eq 1 ]] || { rm -rf "$tmp"; cuda_fail "selftest: run.sh $stage: expected one line, got: $err"; }
    done
    PATH=/usr/bin:/bin bash scripts/gpu_kit/run.sh nosuchstage "$tmp/out" >/dev/null 2>&1
    code=$?
    set -e
    rm -rf "$tmp"
    [[ $code -eq 2 ]] || cuda_fail "selftest: run.sh with an unknown stage exited $code, expected 2"
    # Wiring: every binary run.sh calls is one the build puts in the kit, and `all` runs the fused
    # kernel's stage.
    local called name
    # Called as "$bin/NAME", or through `gpu_check STAGE NAME ...`.
    called=$({
        grep -oE '"\$bin/[A-Za-z0-9_-]+"' scripts/gpu_kit/run.sh | sed 's/"\$bin\///; s/"$//'
        grep -oE 'gpu_check [a-z]+ [A-Za-z0-9_-]+' scripts/gpu_kit/run.sh | awk '{ print $3 }'
    } | sort -u)
    for name in $called; do
        [[ " ${KIT_BINS[*]} " == *" $name "* ]] || cuda_fail "selftest: run.sh calls $name, which the kit does not build (KIT_BINS)"
    done
    [[ " $called " == *fused_check* ]] || cuda_fail "selftest: run.sh never calls fused_check"
    [[ " $called " == *conv_check* ]] || cuda_fail "selftest: run.sh never calls conv_check"
    grep -qE '^all\).*run_fused' scripts/gpu_kit/run.sh || cuda_fail "selftest: run.sh all does not run the fused stage"
    grep -qE '^all\).*run_fused;.* run_conv;.* run_check' scripts/gpu_kit/run.sh ||
        cuda_fail "selftest: run.sh all does not run the conv stage after fused and before check"
    [[ -f crates/attention/examples/fused_check.rs ]] || cuda_fail "selftest: crates/attention/examples/fused_check.rs is missing"
    [[ -f crates/attention/examples/conv_check.rs ]] || cuda_fail "selftest: crates/attention/examples/conv_check.rs is missing"
    [[ " $called " == *layers_check* ]] || cuda_fail "selftest: run.sh never calls layers_check"
    grep -qE '^all\).*run_fused; run_layers' scripts/gpu_kit/run.sh || cuda_fail "selftest: run.sh all does not run the layers stage right after fused"
    [[ -f crates/attention/examples/layers_check.rs ]] || cuda_fail "selftest: crates/attention/examples/layers_check.rs is missing"
    echo "gpu-kit selftest: run.sh without a GPU: exit 3 and one line for every stage, exit 2 for an unknown one;" \
        "binaries called: $(echo $called)"
}

build() {
    local dir="${1:-$repo/target/gpu-kit}" cap="${CUDA_COMPUTE_CAP:-90}" target_dir="$cuda_cache/kit-target"
    echo "== gpu-kit: kit folder $dir, CUDA_COMPUTE_CAP=$cap, cargo target $target_dir"
    cuda_link_libs
    cuda_env
    export CUDA_COMPUTE_CAP="$cap"
    # This crate's kernel images, kept by a hash of their sources (shared with .ci/cuda-check).
    export UNET_ATTENTION_KERNEL_CACHE="${UNET_ATTENTION_KERNEL_CACHE:-$cuda_cache/kernels}"
    export RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }-L native=$cuda_link_dir"
    local start
    start=$(date +%s)
    local examples=() name
    for name in "${KIT_BINS[@]:1}"; do examples+=(--example "$name"); done
    cargo build --release --features "$KIT_FEATURES" -p unet-parity -p unet-attention --bin unet-parity \
        "${examples[@]}" --target-dir "$target_dir" ||
        cuda_fail "cargo build --release --features $KIT_FEATURES"
    echo "== gpu-kit: cargo build took $(($(date +%s) - start)) s"

    rm -rf "$dir.partial"
    mkdir -p "$dir.partial"/{bin,scripts,wheels}
    local rel="$target_dir/release"
    cp "$rel/unet-parity" "$dir.partial/bin/"
    for name in "${KIT_BINS[@]:1}"; do cp "$rel/examples/$name" "$dir.partial/bin/"; done
    strip "$dir.partial"/bin/* 2>/dev/null || echo "== gpu-kit: strip not found; binaries left unstripped"
    # Each binary is about 55 MB (candle-kernels' PTX and its sm_90a GGUF cubins, linked whole);
    # the three share most bytes, so one xz stream with a dictionary larger than a binary packs
    # them into about 7 MB (2 min). run.sh unpacks them.
    echo "== gpu-kit: packing the binaries (xz, about 2 min)"
    tar -C "$dir.partial" -cf - bin | xz -9 -T2 --lzma2=preset=9,dict=192MiB >"$dir.partial/bin.tar.xz" ||
        cuda_fail "tar | xz of the binaries"
    rm -rf "$dir.partial/bin"
    # The bundles packed, without weights/accuracy (the CPU accuracy test's 19 MB of perturbed f32
    # blocks, never run on the GPU): 78 MB of bundles with their float64 stage twins pack to about
    # 55 MiB whole, too much beside the binaries and wheels for a 64 MiB copy; without accuracy/
    # about 42 MiB with xz -6, 39 MiB with -9e (3 MiB of room the 64 MiB copy needs: tree 3.6 MiB +
    # kit 56 MiB).
    echo "== gpu-kit: packing weights/ without weights/accuracy (xz -9e, about 2 min)"
    # Also left out: the 32-group models and bundles that exist for the CPU comparison with
    # candle-transformers (examples/candle_transformers.rs; about 10 MB of random weights, which xz
    # does not shrink), and weights/whole's float32 bundles and denoising reference (the float16
    # whole-model twins travel: they are what the CUDA layers change). weights/whole packs to
    # 4.0 MB with all of its SD / VAE bundles; the kit's size has not been re-measured since
    # (2026-11-29, no GPU lent): `lend-tree size` says before a GPU is started.
    tar --exclude=weights/accuracy --exclude='weights/models/*_g32' --exclude='weights/whole/*_g16_*' \
        --exclude='weights/whole/*_g32_*' --exclude='weights/whole/vae_g*' \
        --exclude='weights/whole/*_unet.safetensors' --exclude='weights/whole/vae.safetensors' \
        --exclude='weights/whole/denoise_*' -cf - weights |
        xz -9e -T2 >"$dir.partial/weights.tar.xz" ||
        cuda_fail "tar | xz of weights/"
    cp -r "${KIT_SCRIPTS[@]}" "$dir.partial/scripts/"
    find "$dir.partial/scripts" -name __pycache__ -prune -exec rm -rf {} +
    python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --dest "$dir.partial/wheels" "${KIT_WHEELS[@]}" || cuda_fail "pip could not download ${KIT_WHEELS[*]}"
    # The ldm and guided-diffusion packages the exporters import (scripts/upstream.py), pinned in
    # requirements-nodeps.txt; guided-diffusion-sdk is published as a source archive only, so both
    # are built into wheels here (run.sh installs wheels only, offline).
    python3 -m pip wheel --quiet --disable-pip-version-check --no-deps --wheel-dir "$dir.partial/wheels" \
        -r scripts/requirements-nodeps.txt || cuda_fail "pip could not build wheels of scripts/requirements-nodeps.txt"
    cp scripts/gpu_kit/run.sh "$dir.partial/run.sh"
    chmod +x "$dir.partial/run.sh"
    python3 - "$dir.partial" "$cap" "$(git rev-parse HEAD)" "$(git status --porcelain | grep -c . || true)" <<'PY'
import json, os, sys, time
kit, cap, commit, dirty = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
sizes = {}
for root, _, files in os.walk(kit):
    for f in files:
        top = os.path.relpath(os.path.join(root, f), kit).split(os.sep)[0]
        sizes[top] = sizes.get(top, 0) + os.path.getsize(os.path.join(root, f))
json.dump({"commit": commit, "uncommitted_changes": dirty, "cuda_compute_cap": cap, "cuda": "13.0",
           "kernel_archs": os.environ.get("UNET_ATTENTION_CUDA_ARCHS") or "80,90",
           "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "mib": {k: round(v / 2**20, 1) for k, v in sorted(sizes.items())}},
          open(os.path.join(kit, "MANIFEST.json"), "w"), indent=1)
PY
    rm -rf "$dir"
    mv "$dir.partial" "$dir"
    echo "== gpu-kit: $dir, $(du -sh "$dir" | cut -f1): $(cat "$dir/MANIFEST.json" | tr -d '\n ')"
}

# What a lent machine's copy would hold: the working tree's tracked files that are present and
# its untracked files that git does not ignore, plus the kit folder; fails over 64 MiB.
tree_size() {
    local kit="${1:-$repo/target/gpu-kit}" tree kitb total
    # Files left out by sparse checkout are still listed: stat skips them (and fails, hence || true).
    tree=$({ git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s -- 2>/dev/null || true; } |
        awk '{ s += $1 } END { print s + 0 }')
    kitb=$([[ -d "$kit" ]] && du -sb "$kit" | cut -f1 || echo 0)
    total=$((tree + kitb))
    echo "gpu-kit lend-tree: working tree $((tree >> 20)) MiB + kit $((kitb >> 20)) MiB ($kit) = $((total >> 20)) MiB of 64"
    [[ $total -le $((64 << 20)) ]] || cuda_fail "over the 64 MiB a lent machine copies: run scripts/gpu_kit.sh lend-tree on"
}

lend_tree() {
    case "${1:-}" in
    on)
        git sparse-checkout set --no-cone '/*' '!/weights/' || cuda_fail "git sparse-checkout set"
        echo "gpu-kit lend-tree: weights/ left out of the working tree (scripts/gpu_kit.sh lend-tree off brings it back)"
        tree_size
        ;;
    off)
        git sparse-checkout disable || cuda_fail "git sparse-checkout disable"
        echo "gpu-kit lend-tree: weights/ back in the working tree"
        ;;
    size) tree_size ;;
    *) usage ;;
    esac
}

dry_run() {
    local ok=1 tool
    for tool in python3 cc cargo strip git xz tar; do
        if command -v "$tool" >/dev/null 2>&1; then echo "gpu-kit dry run: $tool: $(command -v "$tool")"; else
            echo "gpu-kit dry run: $tool is missing" >&2
            ok=0
        fi
    done
    python3 -m pip --version >/dev/null 2>&1 || { echo "gpu-kit dry run: python3 -m pip is missing" >&2; ok=0; }
    for f in scripts/gpu_kit/run.sh "${KIT_SCRIPTS[@]}" scripts/requirements-nodeps.txt weights; do
        [[ -e "$f" ]] || { echo "gpu-kit dry run: $f is missing" >&2; ok=0; }
    done
    local needed carried
    if needed=$(python3 scripts/check_imports.py --needs bench_torch); then
        for f in $needed; do
            for carried in "${KIT_SCRIPTS[@]}"; do
                [[ "scripts/$f" == "$carried" || "scripts/$f" == "$carried"/* ]] && continue 2
            done
            echo "gpu-kit dry run: bench_torch.py imports scripts/$f, which KIT_SCRIPTS leaves out" >&2
            ok=0
        done
    else
        ok=0
    fi
    bash -n scripts/gpu_kit/run.sh || ok=0
    if [[ -f "$cuda_toolkit/.installed" && -f "$cuda_libs/.installed" ]]; then
        echo "gpu-kit dry run: the CUDA wheels are cached in $cuda_cache"
    else
        echo "gpu-kit dry run: build would install the CUDA wheels into $cuda_cache (about 1.2 GB)"
    fi
    echo "gpu-kit dry run: build would link against stub libcuda.so.1 and libcudnn.so.9 (cc) and run" \
        "cargo build --release --features $KIT_FEATURES (CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}), binaries: ${KIT_BINS[*]}"
    for f in crates/attention/examples/fused_check.rs crates/attention/examples/layers_check.rs crates/attention/examples/conv_check.rs; do
        [[ -f "$f" ]] || { echo "gpu-kit dry run: $f is missing" >&2; ok=0; }
    done
    [[ $ok -eq 1 ]] || cuda_fail "dry run: something the build needs is missing (above)"
    echo "gpu-kit dry run: ok"
}

case "${1:-}" in
build)
    if [[ "${2:-}" == --dry-run ]]; then dry_run; else build "${2:-}"; fi
    ;;
selftest) selftest ;;
lend-tree) lend_tree "${2:-}" ;;
*) usage ;;
esac
