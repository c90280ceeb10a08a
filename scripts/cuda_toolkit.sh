# shellcheck shell=bash
# Sourced by `.ci/cuda-check` and `scripts/gpu_kit.sh`: a CUDA 13.0 toolkit from PyPI wheels, in a
# cache folder outside the repository, for machines without a GPU or a system CUDA.
#
#   cuda_toolkit_install   nvcc 13.0.88 and the pinned 13.0 headers/runtime (about 270 MB): enough
#                          for `cargo check --features cuda` (cudarc's and candle-kernels' build
#                          scripts need `nvcc`, no GPU).
#   cuda_link_libs         also what linking `--features cuda` / `--features cudnn` needs (about
#                          910 MB): cuBLAS, cuBLASLt, cuRAND and NVRTC from their 13.0 wheels, a
#                          stub `libcuda` (every `cu*` entry point cudarc's driver bindings declare,
#                          as empty functions, soname `libcuda.so.1`) and a stub `libcudnn` (every
#                          `cudnn*` entry point of cudarc's cuDNN bindings, soname `libcudnn.so.9`:
#                          cuDNN 9, what PyTorch's cu13 wheels ship as nvidia-cudnn-cu13; no 700 MB
#                          wheel downloaded), built with `cc`. The binaries then load the real
#                          driver and libraries of the machine they run on.
#   cuda_env               PATH, CUDA_HOME, CUDA_PATH for cargo.
#
# Environment: UNET_CUDA_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/unet-attention/cuda-13.0).
# See shared reference ecosystem.md §6 for why wheels and why these pins (unpinned, pip mixes 13.5
# runtime headers with nvcc 13.0).

cuda_cache="${UNET_CUDA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/unet-attention/cuda-13.0}"
cuda_toolkit="$cuda_cache/toolkit"
cuda_home="$cuda_toolkit/nvidia/cu13"
cuda_libs="$cuda_cache/linklibs"
cuda_link_dir="$cuda_cache/link"

cuda_fail() {
    echo "${cuda_who:-cuda}: FAILED: $*" >&2
    exit 1
}

# cuda_pip_install DEST WHEEL...: install the wheels into DEST (atomically, with a stamp of what
# was asked for) unless DEST already holds exactly them.
cuda_pip_install() {
    local dest="$1"
    shift
    local want="$*" stamp="$dest/.installed"
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
        echo "== ${cuda_who:-cuda}: reusing the wheels in $dest"
        return 0
    fi
    echo "== ${cuda_who:-cuda}: installing $want into $dest"
    command -v python3 >/dev/null || cuda_fail "python3 is needed to install the CUDA wheels from PyPI"
    python3 -m pip --version >/dev/null 2>&1 || cuda_fail "python3 -m pip is not available"
    mkdir -p "$(dirname "$dest")"
    rm -rf "$dest.partial"
    local start
    start=$(date +%s)
    if ! python3 -m pip install --quiet --disable-pip-version-check --no-input --no-compile \
        --root-user-action=ignore --target "$dest.partial" "$@"; then
        rm -rf "$dest.partial"
        cuda_fail "pip could not install $want (see the pip error above)"
    fi
    echo "$want" >"$dest.partial/.installed"
    rm -rf "$dest"
    mv "$dest.partial" "$dest"
    echo "== ${cuda_who:-cuda}: wheels installed in $(($(date +%s) - start)) s ($(du -sh "$dest" | cut -f1))"
}

cuda_toolkit_install() {
    cuda_pip_install "$cuda_toolkit" "nvidia-cuda-nvcc==13.0.88" "nvidia-nvvm==13.0.*" \
        "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-crt==13.0.*" "nvidia-cuda-cccl==13.0.*"
    [[ -x "$cuda_home/bin/nvcc" ]] || cuda_fail "the wheels installed, but $cuda_home/bin/nvcc is missing"
}

cuda_env() {
    export PATH="$cuda_home/bin:$PATH"
    export CUDA_HOME="$cuda_home"
    export CUDA_PATH="$cuda_home"
    nvcc --version | tail -n 2 || cuda_fail "nvcc from $cuda_home does not run"
}

# The oldest 13.0 builds, so that the versioned symbols the binaries record exist in every 13.x
# the GPU machine has (PyTorch 2.11 cu130 ships cuBLAS 13.1, cuRAND 10.4.0, NVRTC 13.0.88).
cuda_link_libs() {
    cuda_toolkit_install
    cuda_pip_install "$cuda_libs" --no-deps "nvidia-cublas==13.0.0.19" "nvidia-curand==10.4.0.35" \
        "nvidia-cuda-nvrtc==13.0.48"
    command -v cc >/dev/null || cuda_fail "a C compiler (cc) is needed to build the libcuda stub"
    # The entry points: every `fn cu...(` of cudarc 0.19.10's driver bindings and every
    # `fn cudnn...(` of its cuDNN bindings (the version Cargo.lock pins), read from the registry's
    # unpacked sources or its downloaded .crate.
    local registry="${CARGO_HOME:-$HOME/.cargo}/registry" crate
    mkdir -p "$cuda_link_dir"
    # cuda_bindings PATH-IN-CRATE: that file of cudarc 0.19.10 on stdout.
    cuda_bindings() {
        local src
        src=$(find "$registry/src" -path "*/cudarc-0.19.10/$1" 2>/dev/null | head -n 1)
        if [[ -n "$src" ]]; then cat "$src"; return; fi
        crate=$(find "$registry/cache" -name 'cudarc-0.19.10.crate' 2>/dev/null | head -n 1)
        [[ -n "$crate" ]] && tar -xzOf "$crate" "cudarc-0.19.10/$1"
    }
    # cuda_stub SYS_RS PATTERN SONAME LIB: an empty C function for every `fn NAME(` of SYS_RS whose
    # NAME matches PATTERN, built into $cuda_link_dir/LIB with SONAME.
    cuda_stub() {
        local sys="$1" pattern="$2" soname="$3" lib="$4" rs="$cuda_link_dir/${4%.so}_sys.rs"
        if ! cuda_bindings "$sys" >"$rs" 2>/dev/null || [[ ! -s "$rs" ]]; then
            cargo fetch --quiet || cuda_fail "cargo fetch (for cudarc's sources)"
            cuda_bindings "$sys" >"$rs" || cuda_fail "cudarc 0.19.10's $sys is not in $registry after cargo fetch"
        fi
        grep -ohE "fn $pattern\(" "$rs" | sed 's/^fn //; s/($//' | sort -u |
            awk '{ print "void " $1 "(void) {}" }' >"$cuda_link_dir/${lib%.so}_stub.c"
        [[ -s "$cuda_link_dir/${lib%.so}_stub.c" ]] || cuda_fail "no entry points matching $pattern in cudarc's $sys"
        cc -shared -fPIC -Wl,-soname,"$soname" -o "$cuda_link_dir/$lib" "$cuda_link_dir/${lib%.so}_stub.c" ||
            cuda_fail "cc could not build the $lib stub"
    }
    cuda_stub src/driver/sys/mod.rs 'cu[A-Z][A-Za-z0-9_]*' libcuda.so.1 libcuda.so
    cuda_stub src/cudnn/sys/mod.rs 'cudnn[A-Z][A-Za-z0-9_]*' libcudnn.so.9 libcudnn.so
    local lib
    for lib in cublas.so.13 cublasLt.so.13 curand.so.10 nvrtc.so.13; do
        [[ -f "$cuda_libs/nvidia/cu13/lib/lib$lib" ]] || cuda_fail "lib$lib is missing from $cuda_libs"
        ln -sf "$cuda_libs/nvidia/cu13/lib/lib$lib" "$cuda_link_dir/lib${lib%%.so*}.so"
    done
    ln -sf "$cuda_home/lib/libcudart.so.13" "$cuda_link_dir/libcudart.so"
}
