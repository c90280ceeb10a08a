#!/usr/bin/env bash
# The GPU kit's runner (copied into the kit by `scripts/gpu_kit.sh build`; run it there, on a
# machine with an NVIDIA GPU, its driver and PyTorch with CUDA as `python3`; no Rust needed).
#
#   ./run.sh [candidate|all|fused|layers|conv|check|core|fusedcore|splits|whole|models] [OUT]     (default: all, into $OUT or ./results)
#
#   candidate  what flipping unet_attention::cuda::{AUTO_PICKS_FUSED, AUTO_PICKS_CUDA_LAYERS}
#           needs, in one short run (about 5 min on an H100, held within CANDIDATE_BUDGET_S,
#           default 330 s; run it first when GPU time is short): fused_check and layers_check
#           (each opening with its first call's latency, loading the kernels included:
#           `first_call_s`, target under 2 s), conv_check, every bundle in its dtype with
#           UNET_ATTENTION_SDPA=fused (check_fused_bundle.json) and, apart, with
#           UNET_ATTENTION_CUDA_LAYERS=on (check_layers_bundle.json), the whole mid blocks in f16
#           with both on, one round (bench_whole_f16.*).
#   fused   the crate's own fused CUDA attention kernel against the chunked path (fused_check:
#           every head-dim bucket 8-512, odd lengths, masks, f16/bf16/f32, split-KV on and off;
#           fused.jsonl, one line a case), then unet-parity check over the bundles with
#           UNET_ATTENTION_SDPA=fused in each bundle's dtype (check_fused_bundle.json). Runs first in
#           `all`: the kernel has not run on a GPU before this stage.
#   layers  the crate's fused CUDA layers (GroupNorm with pre-add and swish, GEGLU/SwiGLU gates,
#           the bias/residual/rescale epilogue) against f64 CPU references, and the native
#           half-precision projections and matmul against the CPU's (layers_check; layers.jsonl,
#           one line a case; run with UNET_ATTENTION_CUDA_LAYERS=on). Runs right after `fused` in `all`.
#   conv    the crate's cuDNN convolution and the Conv2d layer on it against an f64 CPU reference
#           (conv_check: 1x1 and 3x3, 3-1280 channels, images 1x1-64x64, a non-contiguous input,
#           bias and extras, f32/f16/bf16; the TF32 mode's error recorded; the algorithm cache;
#           conv.jsonl, one line a case; with UNET_ATTENTION_CUDA_LAYERS=on). Runs after `layers`.
#   check   unet-parity check over the kit's bundles on cuda: in each bundle's dtype, then
#           --dtype f16 and --dtype bf16 (CHECK_DTYPES; check_<dtype>.json, the CLI's JSON, and one
#           summary line each in summary.jsonl), with the settings of the environment (by
#           default the validated paths: chunked attention, the CUDA layers off).
#   core    the attention core and the attention blocks, ours (bench_sdpa) against PyTorch's SDPA
#           and the same PyTorch blocks, in f32 and f16 (bench_core_<dtype>.jsonl/.md, bench_block_<dtype>.jsonl/.md).
#   fusedcore  the core shapes with UNET_ATTENTION_SDPA=fused against PyTorch's SDPA, in f16 and
#           bf16 (DTYPES_FUSED; bench_fused_<dtype>.jsonl/.md), once per kernel variant
#           (FUSED_VARIANTS, default "exp2 base w8 w8-exp2 chunked r32": UNET_ATTENTION_FUSED_VARIANT;
#           bench_fused_<variant>_<dtype>.* for all but exp2, the default): which one should be the default.
#   splits  the fused kernel's key splits (UNET_ATTENTION_FUSED_SPLITS: each of FUSED_SPLITS,
#           default "auto 1 2 3 4") on the VAE's 64² core shape (head dim 512) and SDXL's, f16,
#           against PyTorch's SDPA (bench_splits_<n>_<case>.*): whether the automatic count is
#           the fastest. Not part of `all`.
#   whole   the whole mid blocks of scripts/bench_torch.py (diffusers, guided-diffusion,
#           denoising-diffusion-pytorch; their wheels come with the kit and are installed with
#           --no-deps into a temporary folder), exported on the CPU, timed on the GPU with both
#           sides' GPU memory, ours with the fused attention and the CUDA layers on (unless
#           UNET_ATTENTION_SDPA / UNET_ATTENTION_CUDA_LAYERS say otherwise): f16 and bf16 with
#           PyTorch's defaults (DTYPES_WHOLE), then (WHOLE_F32=yes) f32 against --strict-f32 and
#           f32 with UNET_ATTENTION_TF32=on against PyTorch's default
#           (bench_whole_<dtype>.jsonl/.md, bench_whole_f32_strict.*, bench_whole_f32_tf32.*).
#   models  whole models (issue 48): one SD 1.5-size UNet2DConditionModel step and one SD VAE
#           decode, PyTorch and ours (bench_whole) alternately, in DTYPES_MODELS (default f16);
#           seeded random weights made on the machine (bench_models.jsonl). Last in `all`.
#
# Environment: ROUNDS (alternating rounds per case, default 2), DTYPES (core and block stages,
# default "f32 f16"), DTYPES_FUSED (fusedcore, "f16 bf16"), FUSED_VARIANTS (fusedcore), FUSED_SPLITS (splits), DTYPES_WHOLE (whole, "f16 bf16"),
# BENCH_ARGS (more bench_torch.py compare flags, e.g. --strict-f32), UNET_KIT_WEIGHTS (bundles).
#
# Exit codes: 0 all stages ran (failures of bundles are in the JSON, and counted in
# summary.jsonl), 1 a stage failed, 2 usage, 3 no NVIDIA GPU here, 4 a CUDA library the binaries
# need is not found (cuDNN 9's libcudnn.so.9 included: PyTorch's nvidia-cudnn-cu13 wheel has it).
set -uo pipefail
kit="$(cd "$(dirname "$0")" && pwd)"
stage="${1:-all}"
out="${2:-${OUT:-$PWD/results}}"
case "$stage" in candidate | all | fused | layers | conv | check | core | fusedcore | splits | whole | models) ;; *)
    echo "usage: run.sh [candidate|all|fused|layers|conv|check|core|fusedcore|splits|whole|models] [OUT]" >&2
    exit 2
    ;;
esac

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    echo "run.sh: no NVIDIA GPU on this machine (nvidia-smi is missing or lists none); run the kit where one is" >&2
    exit 3
fi

# The binaries, unpacked from the kit's bin.tar.xz (once per kit build) with xz or Python's lzma.
bin="${TMPDIR:-/tmp}/unet-gpu-kit-bin-$(cksum <"$kit/bin.tar.xz" | cut -d' ' -f1)"
if [[ ! -x "$bin/unet-parity" ]]; then
    rm -rf "$bin.partial" && mkdir -p "$bin.partial"
    if command -v xz >/dev/null 2>&1; then
        tar -C "$bin.partial" -xJf "$kit/bin.tar.xz"
    else
        python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$kit/bin.tar.xz" "$bin.partial"
    fi || { echo "run.sh: could not unpack $kit/bin.tar.xz" >&2; exit 1; }
    rm -rf "$bin" && mv "$bin.partial/bin" "$bin" && rm -rf "$bin.partial"
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

# The bundles: UNET_KIT_WEIGHTS (a repository checkout's weights/), else the kit's weights.tar.xz
# unpacked (once per kit build; packed so that kit and tree fit a 64 MiB copy), else kit/weights.
if [[ -z "${UNET_KIT_WEIGHTS:-}" && -f "$kit/weights.tar.xz" ]]; then
    UNET_KIT_WEIGHTS="${TMPDIR:-/tmp}/unet-gpu-kit-weights-$(cksum <"$kit/weights.tar.xz" | cut -d' ' -f1)"
    if [[ ! -d "$UNET_KIT_WEIGHTS" ]]; then
        rm -rf "$UNET_KIT_WEIGHTS.partial" && mkdir -p "$UNET_KIT_WEIGHTS.partial"
        if command -v xz >/dev/null 2>&1; then
            tar -C "$UNET_KIT_WEIGHTS.partial" -xJf "$kit/weights.tar.xz"
        else
            python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$kit/weights.tar.xz" "$UNET_KIT_WEIGHTS.partial"
        fi || { echo "run.sh: could not unpack $kit/weights.tar.xz" >&2; exit 1; }
        mv "$UNET_KIT_WEIGHTS.partial/weights" "$UNET_KIT_WEIGHTS" && rm -rf "$UNET_KIT_WEIGHTS.partial"
    fi
fi
weights="${UNET_KIT_WEIGHTS:-$kit/weights}"
[[ -d "$weights" ]] || { echo "run.sh: no bundles at $weights (set UNET_KIT_WEIGHTS to a weights/ folder)" >&2; exit 2; }
mkdir -p "$out"
summary="$out/summary.jsonl"
failed=0
note() { echo "== run.sh: $*" >&2; }

record_env() {
    python3 - "$kit" >"$out/env.json" <<'PY'
import json, platform, subprocess, sys
kit = sys.argv[1]
env = {"kit": json.load(open(f"{kit}/MANIFEST.json")), "host": platform.node(), "python": platform.python_version()}
try:
    import torch
    env.update(torch=torch.__version__, torch_cuda=torch.version.cuda,
               gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else None)
except Exception as e:  # noqa: BLE001
    env["torch_error"] = repr(e)
q = "name,driver_version,compute_cap,memory.total,clocks.max.sm"
env["nvidia_smi"] = subprocess.run(["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"],
                                   capture_output=True, text=True).stdout.strip()
with open("/proc/cpuinfo") as f:
    env["cpu"] = next((l.split(":", 1)[1].strip() for l in f if l.startswith("model name")), None)
print(json.dumps(env, indent=1))
PY
}

run_check() {
    local dt args file start rc tag="${CHECK_TAG:-}"
    for dt in ${CHECK_DTYPES:-bundle f16 bf16}; do
        args=()
        [[ "$dt" != bundle ]] && args=(--dtype "$dt")
        file="$out/check${tag}_$dt.json"
        note "unet-parity check weights --device cuda ${args[*]}" \
            "(UNET_ATTENTION_CUDA_LAYERS=${UNET_ATTENTION_CUDA_LAYERS:-auto} UNET_ATTENTION_SDPA=${UNET_ATTENTION_SDPA:-auto})"
        start=$SECONDS
        limited "$bin/unet-parity" check "$weights" --device cuda "${args[@]}" --json >"$file" 2>"$out/check${tag}_$dt.stderr"
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

# What flipping AUTO_PICKS_FUSED and AUTO_PICKS_CUDA_LAYERS needs, in one short run (about 5 min on
# an H100): the three kernel checks, every bundle in its own dtype with the fused attention alone
# (check_fused_bundle.json) and with the CUDA layers alone (check_layers_bundle.json), so that each
# constant is decided by its own run, and the whole mid blocks in f16 with both on, one round
# (bench_whole_f16.*).
# Each stage runs within what is left of CANDIDATE_BUDGET_S (default 330 s: the whole command,
# unpacking and loading included, within 6 minutes): a stage past it is stopped (its JSON lines
# so far stay) and the stages after it are skipped, each with a line in summary.jsonl.
run_candidate() {
    candidate_start=$SECONDS
    within_budget fused run_fused_check
    within_budget layers run_layers
    within_budget conv run_conv
    UNET_ATTENTION_SDPA=fused CHECK_DTYPES=bundle CHECK_TAG=_fused within_budget check_fused run_check
    UNET_ATTENTION_CUDA_LAYERS=on CHECK_DTYPES=bundle CHECK_TAG=_layers within_budget check_layers run_check
    ROUNDS="${ROUNDS:-1}" DTYPES_WHOLE="${DTYPES_WHOLE:-f16}" WHOLE_F32="${WHOLE_F32:-no}" within_budget whole run_bench whole
}
# within_budget STAGE COMMAND...: COMMAND (a function of this script; variables set before
# within_budget reach it) with KIT_TIMEOUT set to the seconds left of CANDIDATE_BUDGET_S, or a
# skip line in summary.jsonl when fewer than 15 are left.
within_budget() {
    local stage="$1" left
    shift
    left=$((${CANDIDATE_BUDGET_S:-330} - (SECONDS - candidate_start)))
    if ((left < 15)); then
        echo "{\"stage\": \"$stage\", \"skipped\": \"CANDIDATE_BUDGET_S=${CANDIDATE_BUDGET_S:-330} spent\"}" >>"$summary"
        note "skipped $stage: the candidate budget is spent"
        return
    fi
    KIT_TIMEOUT="$left" "$@"
    (((SECONDS - candidate_start) < ${CANDIDATE_BUDGET_S:-330})) ||
        echo "{\"stage\": \"$stage\", \"stopped\": \"past CANDIDATE_BUDGET_S=${CANDIDATE_BUDGET_S:-330}\"}" >>"$summary"
}
# limited COMMAND...: COMMAND, stopped after KIT_TIMEOUT seconds where that is set (exit 124).
limited() {
    if [[ -n "${KIT_TIMEOUT:-}" ]]; then timeout --kill-after=5 "$KIT_TIMEOUT" "$@"; else "$@"; fi
}

# gpu_check STAGE BINARY WHAT [FIELD...]: one of the kit's GPU checks (its JSON lines in
# STAGE.jsonl, stderr in STAGE.stderr), summarised in one line of summary.jsonl: cases, passed,
# failed, the first 20 failing cases and, for each FIELD, its largest value over the cases.
gpu_check() {
    local stage="$1" binary="$2" what="$3" start rc
    shift 3
    note "$binary ($what)"
    start=$SECONDS
    limited "$bin/$binary" --out "$out/$stage.jsonl" 2>"$out/$stage.stderr"
    rc=$?
    python3 - "$stage" "$out/$stage.jsonl" "$rc" "$((SECONDS - start))" "$@" >>"$summary" <<'PY' || failed=1
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

python_packages() {
    local py="${TMPDIR:-/tmp}/unet-gpu-kit-py"
    if [[ ! -f "$py/.done" ]]; then
        rm -rf "$py"
        python3 -m pip install --quiet --no-deps --no-index --disable-pip-version-check --target "$py" \
            "$kit"/wheels/*.whl >&2 || return 1
        touch "$py/.done"
    fi
    export PYTHONPATH="$py${PYTHONPATH:+:$PYTHONPATH}"
}

# bench_one ONLY DTYPE TAG [FLAGS...]: bench_torch.py compare for one dtype into bench_TAG.jsonl and
# bench_TAG.md; FLAGS go to compare (and so to PyTorch's side, e.g. --strict-f32).
bench_one() {
    local only="$1" dt="$2" tag="$3"
    shift 3
    note "bench_torch.py compare --only $only --device cuda --dtype $dt $* ${BENCH_ARGS:-}" \
        "(UNET_ATTENTION_SDPA=${UNET_ATTENTION_SDPA:-auto} UNET_ATTENTION_CUDA_LAYERS=${UNET_ATTENTION_CUDA_LAYERS:-auto}" \
        "UNET_ATTENTION_TF32=${UNET_ATTENTION_TF32:-off} UNET_ATTENTION_FUSED_VARIANT=${UNET_ATTENTION_FUSED_VARIANT:-exp2}" \
        "UNET_ATTENTION_FUSED_SPLITS=${UNET_ATTENTION_FUSED_SPLITS:-auto})"
    limited python3 "$kit/scripts/bench_torch.py" compare "$bin/bench_sdpa" --bundle-bin "$bin/bench_bundle" \
        --only "$only" --rounds "${ROUNDS:-2}" --device cuda --dtype "$dt" --out "$out/bench_$tag.jsonl" "$@" ${BENCH_ARGS:-} \
        >"$out/bench_$tag.md" 2>>"$out/bench.stderr" || { note "the benchmarks bench_$tag failed (bench.stderr)"; failed=1; }
    cat "$out/bench_$tag.md" >&2
}

run_bench() {
    local only="$1" dt
    case "$only" in
    # fusedcore: the core shapes on the fused kernel, in half precision, in each kernel variant
    # (FUSED_VARIANTS; the default variant's files keep the names bench_fused_<dtype>.*).
    fusedcore)
        local v tag
        for v in ${FUSED_VARIANTS:-exp2 base w8 w8-exp2 chunked r32}; do
            for dt in ${DTYPES_FUSED:-f16 bf16}; do
                tag="fused_$dt"
                [[ "$v" == exp2 ]] || tag="fused_${v}_$dt"
                UNET_ATTENTION_SDPA=fused UNET_ATTENTION_FUSED_VARIANT="$v" bench_one core "$dt" "$tag"
            done
        done
        ;;
    # splits: the fused kernel's key splits, each count of FUSED_SPLITS (default "auto 1 2 3 4":
    # UNET_ATTENTION_FUSED_SPLITS) on the core shapes that split or nearly do: the VAE's head dim
    # 512 at 64² (one query tile column per SM) and SDXL's 20 heads; f16 (bench_splits_<n>_<case>.*).
    splits)
        local s shape tag
        for s in ${FUSED_SPLITS:-auto 1 2 3 4}; do
            for shape in "vae64:1 1 4096 4096 512" "sdxl:2 20 1024 1024 64"; do
                tag="splits_${s}_${shape%%:*}"
                UNET_ATTENTION_SDPA=fused UNET_ATTENTION_FUSED_SPLITS="$s" bench_one "core ${shape#*:}" f16 "$tag"
            done
        done
        ;;
    # whole: f16 and bf16 with PyTorch's defaults; f32 against PyTorch in strict f32 (ours is
    # strict by default); f32 with our TF32 mode against PyTorch's default (TF32 convolutions).
    # Ours with the fused attention and the CUDA layers on (what flipping their AUTO_PICKS
    # constants would give; set UNET_ATTENTION_SDPA / UNET_ATTENTION_CUDA_LAYERS to time another).
    whole)
        export UNET_ATTENTION_SDPA="${UNET_ATTENTION_SDPA:-fused}" UNET_ATTENTION_CUDA_LAYERS="${UNET_ATTENTION_CUDA_LAYERS:-on}"
        for dt in ${DTYPES_WHOLE:-f16 bf16}; do bench_one whole "$dt" "whole_$dt"; done
        if [[ "${WHOLE_F32:-yes}" == yes ]]; then
            bench_one whole f32 whole_f32_strict --strict-f32
            UNET_ATTENTION_TF32=on bench_one whole f32 whole_f32_tf32
        fi
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
    export UNET_ATTENTION_SDPA="${UNET_ATTENTION_SDPA:-fused}" UNET_ATTENTION_CUDA_LAYERS="${UNET_ATTENTION_CUDA_LAYERS:-on}"
    [[ -f "$dir/vae/config.json" ]] || limited python3 "$kit/scripts/bench/whole_models.py" make "$dir" \
        2>>"$out/bench_models.stderr" || { note "whole_models.py make failed (bench_models.stderr)"; failed=1; return; }
    for dt in ${DTYPES_MODELS:-f16}; do
        for m in unet vae; do
            note "models: $m $dt (UNET_ATTENTION_SDPA=$UNET_ATTENTION_SDPA UNET_ATTENTION_CUDA_LAYERS=$UNET_ATTENTION_CUDA_LAYERS)"
            limited python3 "$kit/scripts/bench/whole_models.py" run "$dir/$m" "$m" --device cuda --dtype "$dt" \
                >>"$out/bench_models.jsonl" 2>>"$out/bench_models.stderr" || { note "PyTorch $m $dt failed"; failed=1; }
            limited "$bin/bench_whole" "$dir/$m" "$m" 3 --device cuda --dtype "$dt" \
                >>"$out/bench_models.jsonl" 2>>"$out/bench_models.stderr" || { note "ours $m $dt failed"; failed=1; }
        done
    done
    cat "$out/bench_models.jsonl" >&2
}

record_env
python_packages || { note "could not install the kit's wheels"; failed=1; }
case "$stage" in
candidate) run_candidate ;;
all) run_fused; run_layers; run_conv; run_check; run_bench core; run_bench fusedcore; run_bench block; run_bench whole; run_models ;;
fused) run_fused ;;
layers) run_layers ;;
conv) run_conv ;;
fusedcore) run_bench fusedcore ;;
splits) run_bench splits ;;
check) run_check ;;
core) run_bench core; run_bench block ;;
whole) run_bench whole ;;
models) run_models ;;
esac
note "results in $out"
exit "$failed"
