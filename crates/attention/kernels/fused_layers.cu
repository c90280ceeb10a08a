// Fused elementwise and normalisation layers for CUDA: GroupNorm (with an optional pre-add of a
// per-(batch, channel) vector and an optional swish), LayerNorm, the gated activations of a GEGLU/SwiGLU
// projection, and the bias + residual + rescale epilogue of a projection.
//
// Written for this project from the PyTorch ops' definitions; no code was copied. Arithmetic is
// f32 inside; storage is f32, f16 or bf16 (`T`), and every place where PyTorch's separate ops
// would round to the storage dtype is rounded here too (`round_to<T>`), so that the fused result
// equals the unfused chain of half-precision ops up to f32 evaluation order.
//
// Kernels (all `extern "C"`, launched from crates/attention/src/cuda/layers_launch.rs; `{ty}` is
// `f32`, `f16` or `bf16`):
//
// * `gn_stats_{ty}` (grid (splits, B·G), GN_THREADS threads): for group `bg` and its chunk
//   `blockIdx.x` of `chunk` elements, `s = x (+ add[b, c])` rounded to T, then a two-pass
//   chunk mean and sum of squared deviations (M2), block-reduced in f32. With one split it writes
//   the group's final `(mean, rstd)`; else the chunk's `(mean, M2)` to the workspace.
// * `gn_finalize` (one thread per group): Chan's pairwise combination of the chunks'
//   `(count, mean, M2)`, then `rstd = 1 / sqrt(M2 / n + eps)` (biased variance).
// * `gn_apply_{ty}` (grid (tiles, B·G)): `y = s·a + b` with `a = rstd·γ[c]`,
//   `b = β[c] − mean·a` (PyTorch's per-channel scale and shift), rounded to T; `act` 1: `F.silu`
//   of the rounded `y` (`y / (1 + exp(−y))`), 2: ldm's `y * torch.sigmoid(y)` (the sigmoid
//   rounded to T, then the product rounded), each computed in f32. γ and β are f32.
// * `ln_{ty}` (one GN_THREADS block a row, rows strided over grid x): `nn.LayerNorm` over the
//   last dimension, two-pass mean and biased variance in f32, `(x − mean)·rstd·γ + β` in f32
//   (γ, β f32, or none), rounded once to T (PyTorch's CUDA kernel: f32 statistics, one rounding).
// * `gated_{ty}` (rows over grid y, columns over grid x): from `h` (rows, 2n) `[hidden | gate]`
//   to (rows, n):
//   `act(gate)` in f32 rounded to T, then `hidden · act` rounded: act 0 is the erf GELU
//   (`g · 0.5 · (1 + erf(g / √2))`, PyTorch's exact GELU), 1 is SiLU.
// * `epilogue_{ty}` (rows over grid y, columns over grid x): `out = ((h + bias) + residual) /
//   div`, each part optional and each step rounded to T; `h` as (rows, cols), the bias along the
//   columns (token layout: cols = C) or along the rows modulo C (channel layout: rows = B·C,
//   cols = spatial size).
//
// Built with -DUNET_CUDA_EMULATE, this same source runs on the CPU under kernels/emu/cuda_emu.h
// (crates/attention/src/cuda_plan/emulated_layers.rs): a check of its logic, not of the GPU.
//
// Layouts: every tensor contiguous. Sizes: a group (C/G · spatial) and a row length fit in an
// int; row counts and offsets are 64-bit. Channel indices within a group are walked without a
// division per element where a thread's step is at most a channel's length (`ChannelWalk`).

#ifdef UNET_CUDA_EMULATE
#include "emu/cuda_emu.h" // the CPU emulation the unit tests build this file with
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#endif

namespace {

constexpr int GN_THREADS = 256;

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

// `x` rounded to T (round to nearest even) and back: the cast point of a separate PyTorch op.
template <typename T> __device__ __forceinline__ float round_to(float x) { return to_f32(from_f32<T>(x)); }

// Sum over the block; every thread gets the result. `red` holds 32 floats.
__device__ __forceinline__ float block_sum(float v, float* red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    __syncthreads(); // `red` may still be read from a previous call
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < warps ? red[lane] : 0.f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// The normalised value of element `e` (channel `ch` of the group) of group `bg`: x, or
// x + add[b, c] rounded to T.
template <typename T> struct GroupInput {
    const T* x;
    const T* add; // (B, C) or null
    int first_channel; // b·C + g·cpg: the add index of the group's first channel
    __device__ __forceinline__ float at(int e, int ch) const {
        const float v = to_f32(x[e]);
        if (add == nullptr) return v;
        return round_to<T>(v + to_f32(add[first_channel + ch]));
    }
};

// A thread's walk over a group's elements `e0, e0 + step, ...` that keeps the channel (`e /
// spatial`) without a division per element where the step is at most a channel's length.
struct ChannelWalk {
    int e, ch, rem;
    const int spatial, step;
    __device__ __forceinline__ ChannelWalk(int e0, int spatial_, int step_)
        : e(e0), ch(e0 / spatial_), rem(e0 - (e0 / spatial_) * spatial_), spatial(spatial_), step(step_) {}
    __device__ __forceinline__ void next() {
        e += step;
        if (step <= spatial) {
            rem += step;
            if (rem >= spatial) {
                rem -= spatial;
                ++ch;
            }
        } else {
            ch = e / spatial;
        }
    }
};

template <typename T>
__device__ void gn_stats(const T* x, const T* add, float* part, float* stats, int channels, int groups,
                         int spatial, int chunk, int splits, float eps) {
    __shared__ float red[32];
    const int bg = blockIdx.y, cpg = channels / groups;
    const int group_len = cpg * spatial;
    const long long base = (long long)bg * group_len;
    const int start = blockIdx.x * chunk;
    const int end = min(group_len, start + chunk);
    const int count = end - start;
    GroupInput<T> in{x + base, add, (bg / groups) * channels + (bg % groups) * cpg};
    float sum = 0.f;
    for (ChannelWalk w(start + threadIdx.x, spatial, blockDim.x); w.e < end; w.next()) sum += in.at(w.e, w.ch);
    const float mean = block_sum(sum, red) / (float)count;
    float m2 = 0.f;
    for (ChannelWalk w(start + threadIdx.x, spatial, blockDim.x); w.e < end; w.next()) {
        const float d = in.at(w.e, w.ch) - mean;
        m2 = fmaf(d, d, m2);
    }
    m2 = block_sum(m2, red);
    if (threadIdx.x != 0) return;
    if (splits == 1) {
        stats[2 * bg] = mean;
        stats[2 * bg + 1] = 1.f / sqrtf(fmaxf(m2 / (float)count, 0.f) + eps);
    } else {
        part[2 * ((long long)bg * splits + blockIdx.x)] = mean;
        part[2 * ((long long)bg * splits + blockIdx.x) + 1] = m2;
    }
}

template <typename T>
__device__ void gn_apply(const T* x, const T* add, const float* stats, const float* gamma, const float* beta, T* out,
                         int channels, int groups, int spatial, int tile, int act) {
    const int bg = blockIdx.y, cpg = channels / groups, g = bg % groups;
    const int group_len = cpg * spatial;
    const long long base = (long long)bg * group_len;
    const int start = blockIdx.x * tile;
    const int end = min(group_len, start + tile);
    const float mean = stats[2 * bg], rstd = stats[2 * bg + 1];
    GroupInput<T> in{x + base, add, (bg / groups) * channels + g * cpg};
    for (ChannelWalk w(start + threadIdx.x, spatial, blockDim.x); w.e < end; w.next()) {
        const int c = g * cpg + w.ch;
        const float a = rstd * gamma[c];
        const float b = fmaf(-mean, a, beta[c]);
        float y = round_to<T>(fmaf(in.at(w.e, w.ch), a, b));
        if (act == 1) {
            y = y / (1.f + expf(-y));
        } else if (act == 2) {
            y = y * round_to<T>(1.f / (1.f + expf(-y)));
        }
        out[base + w.e] = from_f32<T>(y);
    }
}

// `nn.LayerNorm` over rows of `n`: one block a row (rows over grid x, strided), two-pass mean
// and biased variance in f32, `y = (x − mean)·rstd·γ + β` in f32, rounded once to T. γ and β f32,
// both null without the affine.
template <typename T>
__device__ void layer_norm(const T* x, const float* gamma, const float* beta, T* out, long long rows, int n,
                           float eps) {
    __shared__ float red[32];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        const T* row = x + r * n;
        float sum = 0.f;
        for (int j = threadIdx.x; j < n; j += blockDim.x) sum += to_f32(row[j]);
        const float mean = block_sum(sum, red) / (float)n;
        float m2 = 0.f;
        for (int j = threadIdx.x; j < n; j += blockDim.x) {
            const float d = to_f32(row[j]) - mean;
            m2 = fmaf(d, d, m2);
        }
        const float rstd = 1.f / sqrtf(block_sum(m2, red) / (float)n + eps);
        for (int j = threadIdx.x; j < n; j += blockDim.x) {
            float y = (to_f32(row[j]) - mean) * rstd;
            if (gamma != nullptr) y = fmaf(y, gamma[j], beta[j]);
            out[r * n + j] = from_f32<T>(y);
        }
    }
}

// Rows over grid y (strided), columns over grid x and the threads: no division per element.
template <typename T> __device__ void gated(const T* h, T* out, long long rows, int n, int act) {
    for (long long r = blockIdx.y; r < rows; r += gridDim.y) {
        const T* row = h + r * 2 * n;
        for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += gridDim.x * blockDim.x) {
            const float hidden = to_f32(row[j]);
            const float g = to_f32(row[n + j]);
            const float a = act == 0 ? g * 0.5f * (1.f + erff(g * 0.70710678118654752f)) : g / (1.f + expf(-g));
            out[r * n + j] = from_f32<T>(hidden * round_to<T>(a));
        }
    }
}

// `h` as (rows, cols): the bias index is the column (token layout, `bias_on_rows` 0) or the row
// modulo `bias_len` (channel layout: rows are (batch, channel), columns the spatial positions).
template <typename T>
__device__ void epilogue(const T* h, const T* bias, const T* residual, T* out, long long rows, int cols,
                         int bias_len, int bias_on_rows, float div, int has_div) {
    for (long long r = blockIdx.y; r < rows; r += gridDim.y) {
        const float row_bias = (bias != nullptr && bias_on_rows) ? to_f32(bias[r % bias_len]) : 0.f;
        for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < cols; j += gridDim.x * blockDim.x) {
            const long long i = r * cols + j;
            float v = to_f32(h[i]);
            if (bias != nullptr) v = round_to<T>(v + (bias_on_rows ? row_bias : to_f32(bias[j])));
            if (residual != nullptr) v = round_to<T>(v + to_f32(residual[i]));
            if (has_div) v = v / div;
            out[i] = from_f32<T>(v);
        }
    }
}

} // namespace

// Chan et al.'s pairwise update over a group's chunks (all `chunk` long but the last).
extern "C" __global__ void gn_finalize(const float* part, float* stats, int n_groups, int group_len, int chunk,
                                       int splits, float eps) {
    const int bg = blockIdx.x * blockDim.x + threadIdx.x;
    if (bg >= n_groups) return;
    float n = 0.f, mean = 0.f, m2 = 0.f;
    for (int s = 0; s < splits; ++s) {
        const float nb = (float)min(chunk, group_len - s * chunk);
        const float mb = part[2 * ((long long)bg * splits + s)];
        const float m2b = part[2 * ((long long)bg * splits + s) + 1];
        const float nn = n + nb;
        const float delta = mb - mean;
        mean += delta * (nb / nn);
        m2 += m2b + delta * delta * (n * nb / nn);
        n = nn;
    }
    stats[2 * bg] = mean;
    stats[2 * bg + 1] = 1.f / sqrtf(fmaxf(m2 / n, 0.f) + eps);
}

#define LAYER_KERNELS(SUFFIX, T)                                                                                  \
    extern "C" __global__ void __launch_bounds__(GN_THREADS)                                                     \
        gn_stats_##SUFFIX(const T* x, const T* add, float* part, float* stats, int channels, int groups,         \
                          int spatial, int chunk, int splits, float eps) {                                       \
        gn_stats<T>(x, add, part, stats, channels, groups, spatial, chunk, splits, eps);                          \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(GN_THREADS)                                                     \
        gn_apply_##SUFFIX(const T* x, const T* add, const float* stats, const float* gamma, const float* beta,    \
                          T* out, int channels, int groups, int spatial, int tile, int act) {                    \
        gn_apply<T>(x, add, stats, gamma, beta, out, channels, groups, spatial, tile, act);                      \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(GN_THREADS)                                                     \
        ln_##SUFFIX(const T* x, const float* gamma, const float* beta, T* out, long long rows, int n, float eps) {  \
        layer_norm<T>(x, gamma, beta, out, rows, n, eps);                                                          \
    }                                                                                                            \
    extern "C" __global__ void gated_##SUFFIX(const T* h, T* out, long long rows, int n, int act) {              \
        gated<T>(h, out, rows, n, act);                                                                          \
    }                                                                                                            \
    extern "C" __global__ void epilogue_##SUFFIX(const T* h, const T* bias, const T* residual, T* out,          \
                                                 long long rows, int cols, int bias_len, int bias_on_rows,       \
                                                 float div, int has_div) {                                       \
        epilogue<T>(h, bias, residual, out, rows, cols, bias_len, bias_on_rows, div, has_div);                  \
    }

LAYER_KERNELS(f32, float)
LAYER_KERNELS(f16, __half)
LAYER_KERNELS(bf16, __nv_bfloat16)
