#!/usr/bin/env bash
# Stand-ins for the GPU kit's programs, for run.sh's self-test mode (UNET_KIT_SELFTEST=1; sourced
# by run.sh, which then calls `make_fakes DIR`): each takes the arguments run.sh gives the real
# one and writes lines shaped and sized like the real one's (the fields the kit's summaries read,
# as many lines as a real run writes or more: FAKE_FUSED_CASES, FAKE_LAYERS_CASES,
# FAKE_CONV_CASES; unet-parity one line a bundle of the weights folder it is given), so that
# run.sh's stages, caps, unpacking and packing run as on a GPU and what a lent machine would
# return can be checked for size (scripts/lend_sim.sh). No GPU and no PyTorch are used.
#
# FAKE_HANG=NAME[,NAME...]: those stand-ins write half their lines and then hang (a stage cut by
# its cap, or a run cut short). Names: fused_check, layers_check, conv_check, unet-parity,
# bench_torch_py, whole_models_py, bench_whole.

# make_fakes DIR: the stand-ins, as executables in DIR.
make_fakes() {
    local dir="$1" name
    mkdir -p "$dir" || return 1
    # The shared part: `emit N LINE_COMMAND`, hanging halfway when this program is in FAKE_HANG.
    cat >"$dir/.common" <<'SH'
me=$(basename "$0")
hangs() { [[ ",${FAKE_HANG:-}," == *",$me,"* ]]; }
# emit N FUNCTION: FUNCTION i for i in 0..N-1; with FAKE_HANG naming this program, half of them and a hang.
emit() {
    local n="$1" i
    for ((i = 0; i < n; i++)); do
        if hangs && ((i == n / 2)); then
            echo "$me: FAKE_HANG: hanging" >&2
            exec sleep 3600
        fi
        "$2" "$i"
    done
}
arg() { # arg FLAG ARGS...: the value after FLAG
    local flag="$1"
    shift
    while (($#)); do [[ "$1" == "$flag" ]] && { echo "$2"; return; }; shift; done
}
ms_list() { local i s=""; for ((i = 0; i < ${1:-20}; i++)); do s+="${s:+, }0.$((RANDOM % 900 + 100))$((RANDOM % 90 + 10))"; done; echo "$s"; }
SH
    cat >"$dir/fused_check" <<'SH'
#!/usr/bin/env bash
source "$(dirname "$0")/.common"
out=$(arg --out "$@")
exec >"$out"
echo '{"stage": "fused", "case": "first_call", "first_call_s": 0.0412345678, "target_s": 2.0, "image": "sm_90 machine code (self-test stand-in)", "ran": true, "error": null, "pass": true}'
line() {
    local variants=(exp2 base w8 w8-exp2 chunked r32) masks=(none additive boolean keypadding "finite(firsttile)" "finite(causal)")
    printf '{"stage": "fused", "dtype": "f16", "b": 5, "h": 2, "lq": 70, "lk": 150, "d": %d, "mask": "%s", "splits": 3, "layout": "contiguous", "variant": "%s", "max_abs": 0.0009765625, "tol": 0.005, "max_want": 2.3456789016723633, "rel": 0.00041631585939764, "rel_tol": 0.004, "finite": true, "chunked_vs_cpu_max_abs": 0.00048828125, "chunked_vs_cpu_rel": 0.000208157929698, "pass": true, "fused_ms": 0.012345678901234, "chunked_ms": 0.34567890123456, "fused_tflops": 12.345678901234567}\n' \
        $((8 * ($1 % 64 + 1))) "${masks[$1 % 6]}" "${variants[$1 % 6]}"
}
emit "${FAKE_FUSED_CASES:-600}" line
echo "{\"stage\": \"fused\", \"summary\": true, \"passed\": ${FAKE_FUSED_CASES:-600}, \"failed\": 0}"
echo "fused_check: ${FAKE_FUSED_CASES:-600} passed, 0 failed (self-test stand-in)" >&2
SH
    cat >"$dir/layers_check" <<'SH'
#!/usr/bin/env bash
source "$(dirname "$0")/.common"
out=$(arg --out "$@")
exec >"$out"
echo '{"stage": "layers", "case": "first_call", "first_call_s": 0.0212345678, "target_s": 2.0, "image": "sm_90 machine code (self-test stand-in)", "ran": true, "error": null, "pass": true}'
line() {
    printf '{"stage": "layers", "kernel": "group_norm", "dtype": "bf16", "b": 2, "c": 1280, "groups": 32, "hw": %d, "act": "silu", "worst": 0.4567890123456789, "max_abs": 0.0078125, "tol": 0.0234375, "pass": true, "ms": 0.0234567890123}\n' $(($1 * 64))
}
emit "${FAKE_LAYERS_CASES:-150}" line
echo "{\"stage\": \"layers\", \"summary\": true, \"passed\": ${FAKE_LAYERS_CASES:-150}, \"failed\": 0}"
SH
    cat >"$dir/conv_check" <<'SH'
#!/usr/bin/env bash
source "$(dirname "$0")/.common"
out=$(arg --out "$@")
exec >"$out"
line() {
    printf '{"stage": "conv", "dtype": "f16", "b": 2, "cin": %d, "cout": 1280, "k": 3, "h": 8, "w": 8, "noncontig": true, "extras": true, "worst_ratio": 0.345678901234, "max_abs": 0.0009765625, "tf32_max_abs": null, "algo": "IMPLICIT_PRECOMP_GEMM", "pass": true, "ms": 0.0456789012345}\n' $(($1 % 1280 + 3))
}
emit "${FAKE_CONV_CASES:-250}" line
echo "{\"stage\": \"conv\", \"summary\": true, \"passed\": ${FAKE_CONV_CASES:-250}, \"failed\": 0}"
SH
    cat >"$dir/unet-parity" <<'SH'
#!/usr/bin/env bash
# unet-parity check WEIGHTS --device cuda [--dtype D] --json: one report a bundle (every
# .safetensors under WEIGHTS but the model checkpoints' folders), as one JSON document.
source "$(dirname "$0")/.common"
[[ "${1:-}" == check ]] || { echo "unet-parity (self-test stand-in): only check" >&2; exit 2; }
mapfile -t files < <(find "$2" -name '*.safetensors' -not -path '*/models/*' | sort)
n=${#files[@]}
echo '{"bundles": ['
line() {
    printf '%s{"file": "%s", "block": "diffusers.UNetMidBlock2DCrossAttn", "dtype": "float16", "run_dtype": "float16", "inputs": "hidden_states[2,32,4,6], temb[2,64], encoder_hidden_states[2,7,24]", "pass": true, "outputs": [{"name": "out", "max_abs": 0.0009765625, "max_rel": 0.0012345678901, "atol": 1e-05, "rtol": 0.001, "vs_f64_ours": 0.00061035156, "vs_f64_torch": 0.00061035156, "rule": "a"}], "error": null, "seconds": 0.0812345}\n' \
        "$([[ $1 -gt 0 ]] && echo ,)" "${files[$1]}"
}
emit "$n" line
echo "], \"passed\": $n, \"failed\": 0, \"errors\": 0, \"exit_code\": 0}"
echo "unet-parity: $n passed, 0 failed (self-test stand-in)" >&2
SH
    cat >"$dir/bench_torch_py" <<'SH'
#!/usr/bin/env bash
# bench_torch.py compare RUST_EXAMPLE --bundle-bin BIN --only SUBSTR --rounds N --device D --dtype T --out FILE [...]:
# two lines (PyTorch, ours) a case a round appended to FILE, the Markdown table on stdout.
source "$(dirname "$0")/.common"
[[ "${1:-}" == compare ]] || { echo "bench_torch.py (self-test stand-in): only compare" >&2; exit 2; }
only=$(arg --only "$@") rounds=$(arg --rounds "$@") dtype=$(arg --dtype "$@") out=$(arg --out "$@")
case "$only" in core) n=7 ;; whole) n=8 ;; block) n=4 ;; *) n=1 ;; esac
line() {
    local impl
    for impl in torch candle; do
        printf '{"impl": "%s", "case": "%s %d", "torch": "2.11.0+cu130", "threads": 2, "cpu": "self-test", "mkl_avx512": false, "ms": [%s], "median_ms": 0.42, "rss_before_mib": 1234.5, "peak_rss_mib": 1300.1, "io_mib": 12.5, "device": "cuda", "dtype": "%s", "gpu": "self-test stand-in", "gpu_before_mib": 100.0, "gpu_peak_mib": 180.5, "gpu_device_used_mib": 2048.0, "tf32_convs": true, "tf32_matmuls": false}\n' \
            "$impl" "$only" "$1" "$(ms_list 20)" "$dtype" >>"$out"
    done
    echo "$only case $1 done" >&2
}
emit $((n * ${rounds:-1})) line
echo "| case | PyTorch ms | ours ms | speed ours/PyTorch |"
echo "|---|---:|---:|---:|"
for ((i = 0; i < n; i++)); do echo "| $only $i | 0.42 | 0.40 | 1.05 |"; done
SH
    cat >"$dir/whole_models_py" <<'SH'
#!/usr/bin/env bash
source "$(dirname "$0")/.common"
case "${1:-}" in
make) mkdir -p "$2/unet" "$2/vae" && echo '{}' >"$2/unet/config.json" && echo '{}' >"$2/vae/config.json" ;;
run) hangs && exec sleep 3600; printf '{"impl": "torch", "model": "%s", "dtype": "f16", "ms": [%s], "median_ms": 12.3}\n' "$3" "$(ms_list 3)" ;;
*) exit 2 ;;
esac
SH
    cat >"$dir/bench_whole" <<'SH'
#!/usr/bin/env bash
source "$(dirname "$0")/.common"
hangs && exec sleep 3600
printf '{"impl": "candle", "model": "%s", "dtype": "f16", "ms": [%s], "median_ms": 11.1}\n' "$2" "$(ms_list 3)"
SH
    for name in bench_sdpa bench_bundle; do
        printf '#!/usr/bin/env bash\necho "%s (self-test stand-in): run through bench_torch_py" >&2\nexit 2\n' "$name" >"$dir/$name"
    done
    chmod +x "$dir"/*
}
