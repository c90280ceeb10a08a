#!/usr/bin/env bash
# The GPU kit's runner (copied into the kit by `scripts/gpu_kit.sh build`; run it there, on a
# machine with an NVIDIA GPU, its driver and PyTorch with CUDA as `python3`; no Rust needed).
#
#   ./run.sh [candidate|all|fused|layers|conv|check|core|fusedcore|splits|whole|models] [OUT]     (default: all, into $OUT or ./results)
#
#   candidate  what a lent GPU's first minutes should return, most valuable first, each stage
#           held to its own cap (seconds, CAP_<STAGE>) and all within CANDIDATE_BUDGET_S
#           (default 320 s: with unpacking and loading, within 6 minutes on an H100):
#           fused (70 s)  fused_check: the fused attention in every variant against the chunked
#                         path, large finite masks included, and `first_call_s`;
#           sdpa (75 s)   our fused core (the default variant) against PyTorch's SDPA on the seven
#                         core shapes, f16 then bf16, one round;
#           layers (40 s) layers_check then conv_check: the CUDA layers and convolutions;
#           whole (80 s)  the SD 1.5 and SDXL mid blocks in f16, one round, ours with the fused
#                         attention and the CUDA layers on (only those two bundles exported);
#           check (55 s)  unet-parity check over the kit's bundles in their dtypes with the fused
#                         attention and the CUDA layers on (what flipping AUTO_PICKS_FUSED and
#                         AUTO_PICKS_CUDA_LAYERS needs).
#   fused   fused_check, then unet-parity check over the bundles with UNET_ATTENTION_SDPA=fused.
#   layers  layers_check (the fused CUDA layers and native half products against CPU references,
#           with UNET_ATTENTION_CUDA_LAYERS=on).
#   conv    conv_check (the cuDNN convolution against an f64 reference, with the CUDA layers on).
#   check   unet-parity check over the kit's bundles on cuda: in each bundle's dtype, then
#           --dtype f16 and --dtype bf16 (CHECK_DTYPES), with the settings of the environment.
#   core    the attention core and blocks, ours (bench_sdpa) against PyTorch, in f32 and f16.
#   fusedcore  the core shapes with UNET_ATTENTION_SDPA=fused against PyTorch's SDPA, in f16 and
#           bf16 (DTYPES_FUSED), once per kernel variant (FUSED_VARIANTS, default "exp2 base w8
#           w8-exp2 chunked r32"; `default` runs the binary's default without naming it).
#   splits  the fused kernel's key splits (FUSED_SPLITS, default "auto 1 2 3 4") on the VAE's 64²
#           core shape and SDXL's, f16. Not part of `all`.
#   whole   the whole mid blocks of scripts/bench_torch.py (WHOLE_CASES, default all of them:
#           "whole"), exported on the CPU (only the selected ones), timed on the GPU, ours with the
#           fused attention and the CUDA layers on: f16 and bf16 (DTYPES_WHOLE), then
#           (WHOLE_F32=yes) f32 against --strict-f32 and f32 in our TF32 mode against PyTorch's
#           default.
#   models  one SD 1.5-size UNet2DConditionModel step and one SD VAE decode, PyTorch and ours
#           (bench_whole) alternately, in DTYPES_MODELS (default f16). Last in `all`.
#
# Results: each stage appends JSON lines (and logs, Markdown tables) to a temporary folder, and
# after every stage (and every PACK_EVERY_S seconds, default 20, while one runs) they are packed
# into at most six files in OUT, so that a run cut short still returns every finished stage
# (a lent machine returns at most 8 files): summary.jsonl (the machine, one line a stage, each
# check's tally, the Markdown tables and the last lines of each log), fused.jsonl, sdpa.jsonl
# (core, fusedcore, splits, block), layers.jsonl (layers and conv), whole.jsonl (whole, models),
# check.jsonl (one line a bundle and a tally per check run). Each packed line says where it came
# from (`src`).
#
# Environment: ROUNDS (alternating rounds per case, default 2; 1 in candidate), DTYPES (core and
# block, default "f32 f16"), DTYPES_FUSED, FUSED_VARIANTS, FUSED_SPLITS, DTYPES_WHOLE,
# WHOLE_CASES, WHOLE_F32, BENCH_ARGS (more bench_torch.py compare flags), UNET_KIT_WEIGHTS (a
# weights/ folder instead of the kit's), CAP_FUSED, CAP_SDPA, CAP_LAYERS, CAP_WHOLE, CAP_CHECK,
# CANDIDATE_BUDGET_S. UNET_KIT_SELFTEST=1: the self-test mode (no GPU used: the kit's programs
# are replaced by the stand-ins of fakes.sh, which print lines shaped like theirs; the stages,
# caps, packing and unpacking run as on a GPU; scripts/lend_sim.sh runs it in CI).
#
# Exit codes: 0 all stages ran (failures of cases and bundles are in the JSON), 1 a stage failed,
# 2 usage, 3 no NVIDIA GPU here, 4 a CUDA library the binaries need is not found.
set -uo pipefail
kit="$(cd "$(dirname "$0")" && pwd)"
stage_arg="${1:-all}"
out="${2:-${OUT:-$PWD/results}}"
selftest="${UNET_KIT_SELFTEST:-0}"
case "$stage_arg" in candidate | all | fused | layers | conv | check | core | fusedcore | splits | whole | models) ;; *)
    echo "usage: run.sh [candidate|all|fused|layers|conv|check|core|fusedcore|splits|whole|models] [OUT]" >&2
    exit 2
    ;;
esac

if [[ "$selftest" != 1 ]] && { ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; }; then
    echo "run.sh: no NVIDIA GPU on this machine (nvidia-smi is missing or lists none); run the kit where one is" >&2
    exit 3
fi

# untar ARCHIVE DIR: ARCHIVE (.tar.xz) unpacked into DIR, with xz or with Python's lzma.
untar() {
    if command -v xz >/dev/null 2>&1; then
        tar -C "$2" -xJf "$1"
    else
        python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$1" "$2"
    fi
}
# unpacked ARCHIVE NAME: the folder NAME of ARCHIVE, unpacked once per kit build into $TMPDIR.
unpacked() {
    local dir
    dir="${TMPDIR:-/tmp}/unet-gpu-kit-$2-$(cksum <"$1" | cut -d' ' -f1)"
    if [[ ! -d "$dir" ]]; then
        rm -rf "$dir.partial" && mkdir -p "$dir.partial" || return 1
        untar "$1" "$dir.partial" || { echo "run.sh: could not unpack $1" >&2; return 1; }
        rm -rf "$dir" && mv "$dir.partial/$2" "$dir" && rm -rf "$dir.partial" || return 1
    fi
    echo "$dir"
}

bin=$(unpacked "$kit/bin.tar.xz" bin) || exit 1
work=$(mktemp -d "${TMPDIR:-/tmp}/unet-gpu-kit-work.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
bench_py=(python3 "$kit/scripts/bench_torch.py")
models_py=(python3 "$kit/scripts/bench/whole_models.py")
if [[ "$selftest" == 1 ]]; then
    # shellcheck source=fakes.sh
    source "$kit/fakes.sh"
    bin="$work/.fake-bin"
    make_fakes "$bin" || exit 1
    bench_py=("$bin/bench_torch_py")
    models_py=("$bin/whole_models_py")
fi

# PyTorch's CUDA wheels (site-packages/nvidia/*/lib: cuBLAS, NVRTC, ... and cuDNN's
# nvidia/cudnn/lib), then a system toolkit and cuDNN; the driver's libcuda is found by the loader
# as usual.
libdirs=$(python3 - 2>/dev/null <<'PY'
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
print(":".join(d for r in roots for d in sorted(glob.glob(os.path.join(r, "nvidia", "*", "lib")))))
PY
)
for d in "${CUDA_HOME:-/nonexistent}/lib64" /usr/local/cuda/lib64 "${CUDNN_HOME:-/nonexistent}/lib" "${CUDNN_HOME:-/nonexistent}/lib64"; do
    [[ -d "$d" ]] && libdirs="${libdirs:+$libdirs:}$d"
done
export LD_LIBRARY_PATH="${libdirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
missing=$(ldd "$bin/unet-parity" 2>&1 | awk '/not found/ { print $1 }' | sort -u | tr '\n' ' ')
if [[ " $missing" == *" libcudnn.so"* ]]; then
    echo "run.sh: the kit's binaries need cuDNN 9 (libcudnn.so.9) and it is not in PyTorch's nvidia/cudnn/lib (pip install nvidia-cudnn-cu13), \$CUDNN_HOME/lib, \$CUDA_HOME/lib64, /usr/local/cuda/lib64 or the loader's path" >&2
    exit 4
fi
if [[ -n "$missing" ]]; then
    echo "run.sh: the kit's binaries need ${missing% } and it is not in PyTorch's nvidia/*/lib, \$CUDA_HOME/lib64, /usr/local/cuda/lib64 or the loader's path" >&2
    exit 4
fi

mkdir -p "$out" || exit 1
summary="$work/summary.jsonl"
failed=0
note() { echo "== run.sh: $*" >&2; }

# Packing: every file of $work into at most six files of $out (see the header), each written
# beside its final name and renamed over it. One packer at a time (a lock folder in $work).
pack() {
    local tries=0
    until mkdir "$work/.lock" 2>/dev/null; do
        ((++tries > 100)) && { note "pack: $work/.lock held for 20 s; not packed"; return 1; }
        sleep 0.2
    done
    python3 "$kit/pack.py" "$work" "$out" || note "pack.py failed: $out may lack the latest lines"
    rmdir "$work/.lock"
}
pack_loop() {
    trap 'exit 0' TERM
    while sleep "${PACK_EVERY_S:-20}"; do pack; done
}
pack_loop &
packer=$!
finish() {
    kill "$packer" 2>/dev/null
    wait "$packer" 2>/dev/null
    rm -rf "$work/.lock"
    pack
    rm -rf "$work"
}
trap finish EXIT

record_env() {
    python3 - "$kit" "$selftest" >"$work/env.json" <<'PY'
import json, platform, subprocess, sys
kit, selftest = sys.argv[1], sys.argv[2] == "1"
env = {"kit": json.load(open(f"{kit}/MANIFEST.json")), "host": platform.node(), "python": platform.python_version(),
       "selftest": selftest}
try:
    import torch
    env.update(torch=torch.__version__, torch_cuda=torch.version.cuda,
               gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else None)
except Exception as e:  # noqa: BLE001
    env["torch_error"] = repr(e)
q = "name,driver_version,compute_cap,memory.total,clocks.max.sm"
try:
    env["nvidia_smi"] = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
                                       capture_output=True, text=True).stdout.strip()
except OSError as e:
    env["nvidia_smi"] = repr(e)
with open("/proc/cpuinfo") as f:
    env["cpu"] = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), None)
print(json.dumps(env, indent=1))
PY
}

# stage NAME CAP COMMAND...: COMMAND (a function here; variables set before `stage` reach it) as
# stage NAME, its commands stopped CAP seconds after it starts (0: never) or when what is left of
# the candidate budget runs out (then skipped when under 10 s are left); then one line in
# summary.jsonl (`kit_stage`) and the results packed into OUT.
stage_end=0
stage_stopped=0
stage() {
    local name="$1" cap="$2" start=$SECONDS left
    shift 2
    if [[ -n "${budget_end:-}" ]]; then
        left=$((budget_end - SECONDS))
        if ((left < 10)); then
            echo "{\"kit_stage\": \"$name\", \"skipped\": \"CANDIDATE_BUDGET_S spent\"}" >>"$summary"
            note "skipped $name: the candidate budget is spent"
            pack
            return
        fi
        ((cap == 0 || cap > left)) && cap=$left
    fi
    note "stage $name (cap ${cap} s)"
    stage_stopped=0
    stage_end=$((cap > 0 ? SECONDS + cap : 0))
    "$@"
    stage_end=0
    local stopped=false
    ((stage_stopped)) && stopped=true
    echo "{\"kit_stage\": \"$name\", \"cap_s\": $cap, \"seconds\": $((SECONDS - start)), \"stopped\": $stopped}" >>"$summary"
    pack
}
# limited COMMAND...: COMMAND, stopped at the running stage's end where it has one (exit 124).
limited() {
    ((stage_end > 0)) || { "$@"; return; }
    local left=$((stage_end - SECONDS)) rc
    ((left > 0)) || { stage_stopped=1; return 124; }
    timeout --kill-after=5 "$left" "$@"
    rc=$?
    ((rc == 124 || rc == 137)) && stage_stopped=1
    return $rc
}

# The bundles: UNET_KIT_WEIGHTS (a repository checkout's weights/), else the kit's weights.tar.xz
# unpacked (once per kit build), else kit/weights. Unpacked when a stage first needs them.
weights_dir() {
    if [[ -z "${UNET_KIT_WEIGHTS:-}" && -f "$kit/weights.tar.xz" ]]; then
        UNET_KIT_WEIGHTS=$(unpacked "$kit/weights.tar.xz" weights) || return 1
    fi
    weights="${UNET_KIT_WEIGHTS:-$kit/weights}"
    [[ -d "$weights" ]] || { note "no bundles at $weights (set UNET_KIT_WEIGHTS to a weights/ folder)"; return 1; }
}

# The Python packages bench_torch.py's blocks import beyond a PyTorch install: the kit's py.tar.xz
# (installed from wheels when the kit was built; pure Python), unpacked once into $TMPDIR.
python_packages() {
    [[ -n "${kit_py:-}" ]] && return
    kit_py=$(unpacked "$kit/py.tar.xz" py) || { note "could not unpack the kit's Python packages"; failed=1; return 1; }
    export PYTHONPATH="$kit_py${PYTHONPATH:+:$PYTHONPATH}"
}

run_check() {
    local dt args file start rc tag="${CHECK_TAG:-}"
    weights_dir || { failed=1; return; }
    for dt in ${CHECK_DTYPES:-bundle f16 bf16}; do
        args=()
        [[ "$dt" != bundle ]] && args=(--dtype "$dt")
        file="$work/check${tag}_$dt.json"
        note "unet-parity check weights --device cuda ${args[*]}" \
            "(UNET_ATTENTION_CUDA_LAYERS=${UNET_ATTENTION_CUDA_LAYERS:-auto} UNET_ATTENTION_SDPA=${UNET_ATTENTION_SDPA:-auto})"
        start=$SECONDS
        limited "$bin/unet-parity" check "$weights" --device cuda "${args[@]}" --json >"$file" 2>"$work/check${tag}_$dt.stderr"
        rc=$?
        python3 - "$file" "$dt" "$rc" "$((SECONDS - start))" "${UNET_ATTENTION_CUDA_LAYERS:-auto}" "${UNET_ATTENTION_SDPA:-auto}" >>"$summary" <<'PY' || failed=1
import json, sys
path, dt, rc, secs, layers, sdpa = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5], sys.argv[6]
head = {"stage": "check", "dtype": dt, "cuda_layers": layers, "sdpa": sdpa, "exit": rc}
try:
    doc = json.load(open(path))
except Exception as e:  # noqa: BLE001
    print(json.dumps({**head, "error": f"no JSON: {e}"}))
    sys.exit(0)
bad = [r for r in doc["bundles"] if not r.get("pass", False)]
worst = lambda r: max((o.get("max_abs") or 0 for o in r.get("outputs", [])), default=None)
print(json.dumps({**head, "seconds": round(secs, 1), "bundles": len(doc["bundles"]),
                  "passed": doc["passed"], "failed": doc["failed"], "errors": doc["errors"],
                  "not_passing": [{"file": r["file"], "error": r.get("error"), "max_abs": worst(r)} for r in bad]}))
PY
        tail -n 1 "$summary" >&2
        [[ $rc -le 1 ]] || failed=1
    done
}

# gpu_check STAGE BINARY WHAT [FIELD...]: one of the kit's GPU checks (its JSON lines in
# STAGE.jsonl, stderr in STAGE.stderr), summarised in one line of summary.jsonl: cases, passed,
# failed, the first 20 failing cases and, for each FIELD, its largest value over the cases.
gpu_check() {
    local stage="$1" binary="$2" what="$3" start rc
    shift 3
    note "$binary ($what)"
    start=$SECONDS
    limited "$bin/$binary" --out "$work/$stage.jsonl" 2>"$work/$stage.stderr"
    rc=$?
    python3 - "$stage" "$work/$stage.jsonl" "$rc" "$((SECONDS - start))" "$@" >>"$summary" <<'PY' || failed=1
import json, sys
stage, path, rc, secs, fields = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5:]
try:
    rows = [json.loads(l) for l in open(path) if l.strip()]
except Exception as e:  # noqa: BLE001
    print(json.dumps({"stage": stage, "exit": rc, "error": f"no JSON lines: {e}"}))
    sys.exit(0)
cases = [r for r in rows if not r.get("summary")]
bad = [r for r in cases if not r.get("pass")]
line = {"stage": stage, "exit": rc, "seconds": round(secs, 1), "cases": len(cases),
        "passed": len(cases) - len(bad), "failed": len(bad)}
for f in fields:
    line[f"max_{f}"] = max((r[f] for r in cases if isinstance(r.get(f), (int, float))), default=None)
print(json.dumps({**line, "not_passing": bad[:20]}))
PY
    tail -n 1 "$summary" >&2
    [[ $rc -eq 0 ]] || failed=1
}

# The fused kernel against the chunked path.
run_fused_check() {
    gpu_check fused fused_check "the fused CUDA kernel against the chunked path" max_abs rel
}

# The fused kernel against the chunked path, then the bundles through it (check_fused_bundle.json).
run_fused() {
    run_fused_check
    UNET_ATTENTION_SDPA=fused CHECK_DTYPES=bundle CHECK_TAG=_fused run_check
}

# The fused layer kernels and the native half products against the CPU references.
run_layers() {
    UNET_ATTENTION_CUDA_LAYERS=on gpu_check layers layers_check \
        "the fused CUDA layers and native half products against CPU references" worst
}

# The cuDNN convolution against an f64 reference.
run_conv() {
    UNET_ATTENTION_CUDA_LAYERS=on gpu_check conv conv_check "the cuDNN convolution against an f64 CPU reference" \
        worst_ratio tf32_max_abs
}

# bench_one ONLY DTYPE TAG [FLAGS...]: bench_torch.py compare for one dtype into bench_TAG.jsonl and
# bench_TAG.md; FLAGS go to compare (and so to PyTorch's side, e.g. --strict-f32).
bench_one() {
    local only="$1" dt="$2" tag="$3"
    shift 3
    note "bench_torch.py compare --only $only --device cuda --dtype $dt $* ${BENCH_ARGS:-}" \
        "(UNET_ATTENTION_SDPA=${UNET_ATTENTION_SDPA:-auto} UNET_ATTENTION_CUDA_LAYERS=${UNET_ATTENTION_CUDA_LAYERS:-auto}" \
        "UNET_ATTENTION_TF32=${UNET_ATTENTION_TF32:-off} UNET_ATTENTION_FUSED_VARIANT=${UNET_ATTENTION_FUSED_VARIANT:-default}" \
        "UNET_ATTENTION_FUSED_SPLITS=${UNET_ATTENTION_FUSED_SPLITS:-auto})"
    # shellcheck disable=SC2086 # BENCH_ARGS: more flags, word-split
    limited "${bench_py[@]}" compare "$bin/bench_sdpa" --bundle-bin "$bin/bench_bundle" \
        --only "$only" --rounds "${ROUNDS:-2}" --device cuda --dtype "$dt" --out "$work/bench_$tag.jsonl" "$@" ${BENCH_ARGS:-} \
        >"$work/bench_$tag.md" 2>>"$work/bench.stderr" || { note "the benchmarks bench_$tag failed (bench.stderr)"; failed=1; }
    cat "$work/bench_$tag.md" >&2
}

run_bench() {
    local only="$1" dt v tag
    case "$only" in
    # fusedcore: the core shapes on the fused kernel, in half precision, in each kernel variant
    # (FUSED_VARIANTS; `default`, and exp2 when it is the default, keep the names bench_fused_<dtype>.*).
    fusedcore)
        for v in ${FUSED_VARIANTS:-exp2 base w8 w8-exp2 chunked r32}; do
            for dt in ${DTYPES_FUSED:-f16 bf16}; do
                tag="fused_$dt"
                if [[ "$v" == default ]]; then
                    UNET_ATTENTION_SDPA=fused bench_one core "$dt" "$tag"
                    continue
                fi
                [[ "$v" == exp2 ]] || tag="fused_${v}_$dt"
                UNET_ATTENTION_SDPA=fused UNET_ATTENTION_FUSED_VARIANT="$v" bench_one core "$dt" "$tag"
            done
        done
        ;;
    # splits: the fused kernel's key splits, each count of FUSED_SPLITS on the VAE's head dim 512
    # at 64² and SDXL's 20 heads; f16 (bench_splits_<n>_<case>.*).
    splits)
        local s shape
        for s in ${FUSED_SPLITS:-auto 1 2 3 4}; do
            for shape in "vae64:1 1 4096 4096 512" "sdxl:2 20 1024 1024 64"; do
                tag="splits_${s}_${shape%%:*}"
                UNET_ATTENTION_SDPA=fused UNET_ATTENTION_FUSED_SPLITS="$s" bench_one "core ${shape#*:}" f16 "$tag"
            done
        done
        ;;
    # whole: each of WHOLE_CASES (compare's --only: `whole` is every whole block; only the
    # selected blocks are exported) in f16 and bf16 with PyTorch's defaults; f32 against PyTorch in
    # strict f32 (ours is strict by default); f32 with our TF32 mode against PyTorch's default. Ours
    # with the fused attention and the CUDA layers on (set UNET_ATTENTION_SDPA /
    # UNET_ATTENTION_CUDA_LAYERS to time another).
    whole)
        python_packages || return
        local -x UNET_ATTENTION_SDPA="${UNET_ATTENTION_SDPA:-fused}" UNET_ATTENTION_CUDA_LAYERS="${UNET_ATTENTION_CUDA_LAYERS:-on}"
        local w sfx
        for w in ${WHOLE_CASES:-whole}; do
            sfx=$([[ "$w" == whole ]] || echo "_$w")
            for dt in ${DTYPES_WHOLE:-f16 bf16}; do bench_one "$w" "$dt" "whole${sfx}_$dt"; done
            if [[ "${WHOLE_F32:-yes}" == yes ]]; then
                bench_one "$w" f32 "whole${sfx}_f32_strict" --strict-f32
                UNET_ATTENTION_TF32=on bench_one "$w" f32 "whole${sfx}_f32_tf32"
            fi
        done
        ;;
    block)
        python_packages || return
        for dt in ${DTYPES:-f32 f16}; do bench_one block "$dt" "block_$dt"; done
        ;;
    *) for dt in ${DTYPES:-f32 f16}; do bench_one "$only" "$dt" "${only}_$dt"; done ;;
    esac
}

# models: whole models at Stable Diffusion 1.5's size (issue 48): one U-Net step (batch 2, 64 x 64
# latent, 77 tokens) and one VAE decode (64 x 64 latent to 512 x 512), seeded random weights made
# here by scripts/bench/whole_models.py (3.7 GB in $TMPDIR), PyTorch and ours alternately in each of
# DTYPES_MODELS (default "f16"), 3 runs after a warm-up; ours with the fused attention and the CUDA
# layers on, as `whole`. One JSON line a run of either side in bench_models.jsonl.
run_models() {
    local dir="${TMPDIR:-/tmp}/unet-gpu-kit-models" dt m
    python_packages || return
    local -x UNET_ATTENTION_SDPA="${UNET_ATTENTION_SDPA:-fused}" UNET_ATTENTION_CUDA_LAYERS="${UNET_ATTENTION_CUDA_LAYERS:-on}"
    [[ -f "$dir/vae/config.json" ]] || limited "${models_py[@]}" make "$dir" \
        2>>"$work/bench_models.stderr" || { note "whole_models.py make failed (bench_models.stderr)"; failed=1; return; }
    for dt in ${DTYPES_MODELS:-f16}; do
        for m in unet vae; do
            note "models: $m $dt (UNET_ATTENTION_SDPA=$UNET_ATTENTION_SDPA UNET_ATTENTION_CUDA_LAYERS=$UNET_ATTENTION_CUDA_LAYERS)"
            limited "${models_py[@]}" run "$dir/$m" "$m" --device cuda --dtype "$dt" \
                >>"$work/bench_models.jsonl" 2>>"$work/bench_models.stderr" || { note "PyTorch $m $dt failed"; failed=1; }
            limited "$bin/bench_whole" "$dir/$m" "$m" 3 --device cuda --dtype "$dt" \
                >>"$work/bench_models.jsonl" 2>>"$work/bench_models.stderr" || { note "ours $m $dt failed"; failed=1; }
        done
    done
}

# The kit's stages for a lent GPU (see the header): most valuable first, each within its cap and
# all within CANDIDATE_BUDGET_S.
run_candidate() {
    budget_end=$((SECONDS + ${CANDIDATE_BUDGET_S:-320}))
    stage fused "${CAP_FUSED:-70}" run_fused_check
    ROUNDS=1 FUSED_VARIANTS=default DTYPES_FUSED="f16 bf16" stage sdpa "${CAP_SDPA:-75}" run_bench fusedcore
    stage layers "${CAP_LAYERS:-40}" run_layers_conv
    ROUNDS=1 WHOLE_CASES="sd15_mid sdxl_mid" DTYPES_WHOLE=f16 WHOLE_F32=no stage whole "${CAP_WHOLE:-80}" run_bench whole
    UNET_ATTENTION_SDPA=fused UNET_ATTENTION_CUDA_LAYERS=on CHECK_DTYPES=bundle CHECK_TAG=_fused_layers \
        stage check "${CAP_CHECK:-55}" run_check
}
run_layers_conv() {
    run_layers
    run_conv
}
run_all() {
    stage fused 0 run_fused
    stage layers 0 run_layers
    stage conv 0 run_conv
    stage check 0 run_check
    stage core 0 run_bench core
    stage fusedcore 0 run_bench fusedcore
    stage block 0 run_bench block
    stage whole 0 run_bench whole
    stage models 0 run_models
}

record_env
pack
case "$stage_arg" in
candidate) run_candidate ;;
all) run_all ;;
fused) stage fused 0 run_fused ;;
layers) stage layers 0 run_layers ;;
conv) stage conv 0 run_conv ;;
fusedcore) stage fusedcore 0 run_bench fusedcore ;;
splits) stage splits 0 run_bench splits ;;
check) stage check 0 run_check ;;
core)
    stage core 0 run_bench core
    stage block 0 run_bench block
    ;;
whole) stage whole 0 run_bench whole ;;
models) stage models 0 run_models ;;
esac
note "results in $out"
exit "$failed"
