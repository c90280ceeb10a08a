#!/usr/bin/env bash
# The GPU kit: everything a GPU machine without Rust or network needs to prove the CUDA path.
#
#   scripts/gpu_kit.sh build [DIR]      build it here (no GPU needed) into DIR (default target/gpu-kit)
#   scripts/gpu_kit.sh build --dry-run  only check that what the build needs is here, and say what it
#                                       would do (CI runs this)
#   scripts/gpu_kit.sh kit-data DIR     the kit but its binaries (bundles, Python packages, scripts,
#                                       run.sh): what scripts/lend_sim.sh measures and runs in CI
#   scripts/gpu_kit.sh selftest         on a machine without a GPU: the kit's run.sh must stop with
#                                       exit code 3 and one line, for every stage; and every binary
#                                       run.sh calls must be one the build puts in the kit (CI runs this)
#   scripts/gpu_kit.sh strip-check      unet-parity check (CPU) over weights/ and over the
#                                       kit's copy of it without stage traces: the same verdicts
#   scripts/gpu_kit.sh lend-tree on|off|size
#                                       on: leave weights/ out of this checkout's working tree (git
#                                       sparse-checkout; the index's entries stay, nothing is staged),
#                                       so that tree + kit fit a lent GPU machine's copy; off: bring
#                                       weights/ back; size: what would travel, in MiB (fails over 56)
#
# The kit: bin.tar.xz with bin/{unet-parity,bench_sdpa,bench_bundle,fused_check,layers_check,conv_check,bench_whole}
# built with `--features cudnn` (cuda plus this crate's cuDNN convolutions; release, stripped;
# candle-kernels' PTX for CUDA_COMPUTE_CAP, default 90 = H100/H200; this crate's kernels as SASS
# for UNET_ATTENTION_CUDA_ARCHS, default sm_80 and sm_90, plus compute_80 PTX; run.sh unpacks
# them into a temporary folder), weights.tar.xz (the committed bundles less weights/accuracy and
# the CPU-only comparison models, and without their stage traces, which `check` reads only with
# --trace: scripts/gpu_kit/kit_weights.py; about 17 MiB packed), py.tar.xz (diffusers,
# denoising-diffusion-pytorch, stable-diffusion-sdkit, guided-diffusion-sdk and the packages they
# import that a plain PyTorch install lacks, installed here from their wheels with --no-deps and
# packed as one tree: 2.2 MiB where the wheels took 6.9), scripts/ (bench_torch.py and what it
# imports: KIT_SCRIPTS), run.sh, pack.py (its results into at most six files), fakes.sh (its
# self-test's stand-ins) and MANIFEST.json (commit, compute capability, sizes). Copy the folder to
# the GPU machine and run `./run.sh` there (see its header).
#
# Room on a lent GPU machine: the working tree travels with the carried paths under a 64 MiB
# limit (56 MiB is this project's bound, for a margin), and the tracked tree is about 96 MiB
# (weights/ 91 MiB). So, before the call, `scripts/gpu_kit.sh lend-tree on` (weights/ leaves the
# working tree: about 5 MiB travel), carry target/gpu-kit (about 31 MiB), run
# `target/gpu-kit/run.sh candidate "$OUT"` there, and `scripts/gpu_kit.sh lend-tree off`
# afterwards. `lend-tree size` prints tree + kit and fails over 56 MiB; scripts/lend_sim.sh (CI)
# builds that copy and runs the kit's self-test in it.
#
# Building links against CUDA 13.0: scripts/cuda_toolkit.sh installs nvcc, cuBLAS, cuRAND and NVRTC
# from PyPI wheels into ~/.cache/unet-attention/cuda-13.0 (about 1.2 GB, once) and builds a stub
# libcuda and a stub libcudnn (soname libcudnn.so.9; the GPU machine's PyTorch brings cuDNN 9); the release build gets its own target folder there. First build: about 15 min on two
# cores (candle-kernels' PTX); later ones reuse it. The kit's bundles and Python packages are kept
# in ~/.cache/unet-attention/gpu-kit-data by a hash of what they are made from.
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

# The binaries of the kit (`--bin unet-parity`, the rest `--example`): run.sh calls these only.
KIT_BINS=(unet-parity bench_sdpa bench_bundle fused_check layers_check conv_check bench_whole)
# The features the kit is built with: cuda, and cuDNN for the convolutions (the crate's own, f16/bf16
# accumulated in f32 as PyTorch's).
KIT_FEATURES=cudnn
# Wheels of the Python packages bench_torch.py's whole-block cases import, pinned as in
# scripts/requirements.txt, and those they pull in that PyTorch's own install does not have
# (accelerate and psutil are in the lent machines' image, not in every PyTorch install); with
# scripts/requirements-nodeps.txt's, installed here into one tree (py.tar.xz).
KIT_WHEELS=(diffusers==0.42.1 denoising-diffusion-pytorch==2.3.4 ema-pytorch==0.8.3 accelerate==1.15.0
    pytorch-fid==0.3.0 "psutil==7.2.2")
# What of scripts/ the kit carries: bench_torch.py and every module it imports, directly or not (the
# dry run checks this list against `scripts/check_imports.py --needs bench_torch`).
KIT_SCRIPTS=(scripts/bench_torch.py scripts/export_models.py scripts/parity_bundle.py scripts/parity_trace.py
    scripts/upstream.py scripts/bench scripts/parity scripts/reference scripts/export)
# Copied to the kit's top: the runner, its packer and its self-test's stand-ins.
KIT_RUNNER=(scripts/gpu_kit/run.sh scripts/gpu_kit/pack.py scripts/gpu_kit/fakes.sh)
# What `lend-tree on` leaves out of the working tree (git sparse-checkout patterns' paths).
LEND_TREE_OUT=(weights)
# The bound on tree + kit (a lent machine copies up to 64 MiB; the rest is margin).
LEND_LIMIT_MIB=56
kit_data_cache="${XDG_CACHE_HOME:-$HOME/.cache}/unet-attention/gpu-kit-data"

usage() {
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//' >&2
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
    for stage in candidate all fused layers conv check core fusedcore splits whole models; do
        err=$(PATH=/usr/bin:/bin bash scripts/gpu_kit/run.sh "$stage" "$tmp/out" 2>&1 >/dev/null)
        code=$?
        [[ $code -eq 3 ]] || { rm -rf "$tmp"; cuda_fail "selftest: run.sh $stage without a GPU exited $code, expected 3: $err"; }
        [[ $(printf '%s\n' "$err" | grep -c .) -eq 1 ]] || { rm -rf "$tmp"; cuda_fail "selftest: run.sh $stage: expected one line, got: $err"; }
    done
    PATH=/usr/bin:/bin bash scripts/gpu_kit/run.sh nosuchstage "$tmp/out" >/dev/null 2>&1
    code=$?
    set -e
    [[ ! -e "$tmp/out" ]] || { rm -rf "$tmp"; cuda_fail "selftest: run.sh wrote $tmp/out without a GPU"; }
    rm -rf "$tmp"
    [[ $code -eq 2 ]] || cuda_fail "selftest: run.sh with an unknown stage exited $code, expected 2"
    # Wiring: every binary run.sh calls is one the build puts in the kit, each has a stand-in in
    # fakes.sh, and candidate runs its stages in the order of value.
    local called name
    # Called as "$bin/NAME", or through `gpu_check STAGE NAME ...`.
    called=$({
        grep -oE '"\$bin/[A-Za-z0-9_-]+"' scripts/gpu_kit/run.sh | sed 's/"\$bin\///; s/"$//'
        grep -oE 'gpu_check [a-z]+ [A-Za-z0-9_-]+' scripts/gpu_kit/run.sh | awk '{ print $3 }'
    } | sort -u | tr '\n' ' ')
    for name in $called; do
        # (bench_torch_py and whole_models_py: the self-test mode's stand-ins for the Python scripts)
        [[ " ${KIT_BINS[*]} bench_torch_py whole_models_py " == *" $name "* ]] ||
            cuda_fail "selftest: run.sh calls $name, which the kit does not build (KIT_BINS)"
    done
    for name in "${KIT_BINS[@]}"; do
        grep -q "\"\$dir/$name\"\\|for name in .*\\b$name\\b" scripts/gpu_kit/fakes.sh ||
            cuda_fail "selftest: fakes.sh has no stand-in for $name"
    done
    for name in fused_check layers_check conv_check unet-parity bench_sdpa bench_bundle; do
        [[ " $called " == *" $name "* ]] || cuda_fail "selftest: run.sh never calls $name"
    done
    local order
    order=$(sed -n '/^run_candidate() {/,/^}/p' scripts/gpu_kit/run.sh | grep -oE 'stage [a-z]+ "\$\{CAP_' | awk '{ print $2 }' | tr '\n' ' ')
    [[ "$order" == "fused sdpa layers whole check " ]] ||
        cuda_fail "selftest: candidate's stages are '$order', expected 'fused sdpa layers whole check '"
    local f
    for f in crates/attention/examples/fused_check.rs crates/attention/examples/layers_check.rs \
        crates/attention/examples/conv_check.rs; do
        [[ -f "$f" ]] || cuda_fail "selftest: $f is missing"
    done
    echo "gpu-kit selftest: run.sh without a GPU: exit 3 and one line for every stage, exit 2 for an unknown one;" \
        "binaries called: $(echo $called); candidate: $order"
}

# content_hash PATH...: a hash of the files under PATH (git's blob ids of tracked files, and of
# changed and untracked ones as they are now).
content_hash() {
    {
        git ls-files -s -- "$@"
        git ls-files -z -m -o --exclude-standard -- "$@" | xargs -0 -r git hash-object --
    } | sha1sum | cut -c1-16
}

# cached NAME KEY COMMAND...: the file $kit_data_cache/NAME-KEY, made by COMMAND (which writes
# the file named by its last argument) unless it is there already; prints its path.
cached() {
    local name="$1" key="$2" file
    shift 2
    file="$kit_data_cache/$name-$key"
    if [[ ! -f "$file" ]]; then
        mkdir -p "$kit_data_cache"
        rm -f "$kit_data_cache/$name"-* # older keys
        "$@" "$file.partial" >&2 || { rm -f "$file.partial"; return 1; }
        mv "$file.partial" "$file"
    fi
    echo "$file"
}

# make_weights FILE: weights/ as the kit carries it (kit_weights.py), packed.
make_weights() {
    local tmp
    tmp=$(mktemp -d)
    echo "== gpu-kit: packing weights/ without what the GPU stages do not read (xz -9e, about 1 min)"
    python3 scripts/gpu_kit/kit_weights.py weights "$tmp" &&
        tar -C "$tmp" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - weights |
        xz -9e -T2 >"$1"
    local rc=$?
    rm -rf "$tmp"
    return $rc
}

# make_py FILE: the kit's Python packages (KIT_WHEELS, requirements-nodeps.txt) installed from
# their wheels into one tree, packed. Pure Python but psutil (manylinux x86_64, as the GPU
# machines are), so the tree runs on any CPython 3 there.
make_py() {
    local tmp
    tmp=$(mktemp -d)
    echo "== gpu-kit: the Python packages: ${KIT_WHEELS[*]} and scripts/requirements-nodeps.txt"
    python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
        --dest "$tmp/wheels" "${KIT_WHEELS[@]}" &&
        # guided-diffusion-sdk is published as a source archive only: built into a wheel here.
        python3 -m pip wheel --quiet --disable-pip-version-check --no-deps --wheel-dir "$tmp/wheels" \
            -r scripts/requirements-nodeps.txt &&
        python3 -m pip install --quiet --disable-pip-version-check --no-deps --no-index --no-compile \
            --root-user-action=ignore --target "$tmp/py" "$tmp"/wheels/*.whl &&
        find "$tmp/py" -name __pycache__ -prune -exec rm -rf {} + &&
        tar -C "$tmp" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - py | xz -9e -T2 >"$1"
    local rc=$?
    rm -rf "$tmp"
    return $rc
}

# kit_data DIR: the kit but its binaries and manifest: weights.tar.xz and py.tar.xz (from the
# cache when what they are made from is unchanged), scripts/, run.sh, pack.py, fakes.sh.
kit_data() {
    local dir="$1" weights_xz py_xz key
    key=$(content_hash weights scripts/gpu_kit/kit_weights.py)
    weights_xz=$(cached weights.tar.xz "$key" make_weights) || cuda_fail "packing weights/"
    key=$(printf '%s\n' "${KIT_WHEELS[@]}" | cat - scripts/requirements-nodeps.txt | sha1sum | cut -c1-16)
    py_xz=$(cached py.tar.xz "$key" make_py) || cuda_fail "pip could not fetch or install the kit's Python packages"
    mkdir -p "$dir/scripts"
    cp "$weights_xz" "$dir/weights.tar.xz"
    cp "$py_xz" "$dir/py.tar.xz"
    cp -r "${KIT_SCRIPTS[@]}" "$dir/scripts/"
    find "$dir/scripts" -name __pycache__ -prune -exec rm -rf {} +
    cp "${KIT_RUNNER[@]}" "$dir/"
    chmod +x "$dir/run.sh"
}

# manifest DIR: MANIFEST.json (commit, compute capability, the sizes of the kit's parts).
manifest() {
    python3 - "$1" "${CUDA_COMPUTE_CAP:-90}" "$(git rev-parse HEAD)" "$(git status --porcelain | grep -c . || true)" <<'PY'
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
           "mib": {k: round(v / 2**20, 2) for k, v in sorted(sizes.items())}},
          open(os.path.join(kit, "MANIFEST.json"), "w"), indent=1)
PY
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
    mkdir -p "$dir.partial/bin"
    local rel="$target_dir/release"
    cp "$rel/unet-parity" "$dir.partial/bin/"
    for name in "${KIT_BINS[@]:1}"; do cp "$rel/examples/$name" "$dir.partial/bin/"; done
    strip "$dir.partial"/bin/* 2>/dev/null || echo "== gpu-kit: strip not found; binaries left unstripped"
    # Each binary is about 55 MB (candle-kernels' PTX and its sm_90a GGUF cubins, linked whole);
    # they share most bytes, so one xz stream with a dictionary larger than a binary packs them
    # into about 10 MB (2 min). run.sh unpacks them.
    echo "== gpu-kit: packing the binaries (xz, about 2 min)"
    tar -C "$dir.partial" --sort=name -cf - bin | xz -9e -T2 --lzma2=preset=9e,dict=192MiB >"$dir.partial/bin.tar.xz" ||
        cuda_fail "tar | xz of the binaries"
    rm -rf "$dir.partial/bin"
    kit_data "$dir.partial"
    manifest "$dir.partial"
    rm -rf "$dir"
    mv "$dir.partial" "$dir"
    echo "== gpu-kit: $dir, $(du -sh "$dir" | cut -f1): $(cat "$dir/MANIFEST.json" | tr -d '\n ')"
    tree_size "$dir"
}

# What a lent machine's copy would hold: the working tree's tracked files that are present and
# its untracked files that git does not ignore, plus the kit folder; fails over LEND_LIMIT_MIB.
tree_size() {
    local kit="${1:-$repo/target/gpu-kit}" tree kitb total
    # Files left out by sparse checkout are still listed: stat skips them (and fails, hence || true).
    tree=$({ git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s -- 2>/dev/null || true; } |
        awk '{ s += $1 } END { print s + 0 }')
    kitb=$([[ -d "$kit" ]] && du -sb "$kit" | cut -f1 || echo 0)
    total=$((tree + kitb))
    echo "gpu-kit lend-tree: working tree $((tree >> 20)) MiB + kit $((kitb >> 20)) MiB ($kit) = $((total >> 20)) MiB of $LEND_LIMIT_MIB (64 copied)"
    [[ $total -le $((LEND_LIMIT_MIB << 20)) ]] || cuda_fail "over $LEND_LIMIT_MIB MiB: run scripts/gpu_kit.sh lend-tree on"
}

lend_tree() {
    case "${1:-}" in
    on)
        local patterns=('/*') p
        for p in "${LEND_TREE_OUT[@]}"; do patterns+=("!/$p/"); done
        git sparse-checkout set --no-cone "${patterns[@]}" || cuda_fail "git sparse-checkout set"
        echo "gpu-kit lend-tree: ${LEND_TREE_OUT[*]} left out of the working tree (scripts/gpu_kit.sh lend-tree off brings it back)"
        tree_size
        ;;
    off)
        git sparse-checkout disable || cuda_fail "git sparse-checkout disable"
        echo "gpu-kit lend-tree: ${LEND_TREE_OUT[*]} back in the working tree"
        ;;
    size) tree_size ;;
    *) usage ;;
    esac
}

# strip-check: the kit's bundles (stage traces left out) give the verdicts, errors and VS_F64 of
# the committed ones under unet-parity check on the CPU (the dev build `cargo test` makes; 7 min
# of CPU, 2026-12-07: 256 bundles, none different).
strip_check() {
    local tmp
    tmp=$(mktemp -d)
    python3 scripts/gpu_kit/kit_weights.py weights "$tmp"
    cargo build -q -p unet-parity || cuda_fail "cargo build -p unet-parity"
    target/debug/unet-parity check weights --json >"$tmp/full.json" || true
    target/debug/unet-parity check "$tmp/weights" --json >"$tmp/kit.json" || true
    python3 - "$tmp/full.json" "$tmp/kit.json" <<'PY' || { rm -rf "$tmp"; cuda_fail "strip-check: the kit's bundles check differently"; }
import json, sys
def by_file(path, root):
    doc = json.load(open(path))
    return {r["file"].split(root, 1)[1]: {k: r.get(k) for k in ("pass", "error", "outputs")} for r in doc["bundles"]}
full, kit = by_file(sys.argv[1], "weights/"), by_file(sys.argv[2], "weights/")
missing = sorted(set(kit) - set(full))
differ = sorted(f for f in kit if f in full and kit[f] != full[f])
print(f"strip-check: {len(kit)} kit bundles, {len(full)} committed; {len(differ)} differ, {len(missing)} unknown")
for f in differ[:20]:
    print(f"  {f}: kit {kit[f]} committed {full[f]}")
sys.exit(1 if differ or missing or not kit else 0)
PY
    rm -rf "$tmp"
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
    for f in "${KIT_RUNNER[@]}" scripts/gpu_kit/kit_weights.py "${KIT_SCRIPTS[@]}" scripts/requirements-nodeps.txt weights; do
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
    bash -n scripts/gpu_kit/fakes.sh || ok=0
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
kit-data)
    [[ -n "${2:-}" ]] || usage
    kit_data "$2"
    ;;
selftest) selftest ;;
strip-check) strip_check ;;
lend-tree) lend_tree "${2:-}" ;;
*) usage ;;
esac
