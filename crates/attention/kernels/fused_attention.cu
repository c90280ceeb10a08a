// Fused attention forward for CUDA: softmax(q·kᵀ·scale + mask)·v without the score matrix.
//
// Written for this project from the published FlashAttention-2 algorithm (Dao, 2023): each
// thread block (CTA) owns a tile of queries; key/value tiles stream through shared memory; a
// running row maximum `m` and row sum `l` rescale the output accumulator (online softmax); the
// output is divided by `l` once at the end. No code was copied from any implementation.
//
// Kernels (all `extern "C"`, launched from crates/attention/src/cuda/mod.rs):
//
// * `fattn_{f16,bf16}_dv{16,32,64,96,128,160,192,256}[_w8][_e2]`: 4 warps (`_w8`: 8), 16 query
//   rows a warp (64 or 128 per CTA); `_e2` takes the exponentials as FlashAttention-2 does, one
//   FFMA with the scale and log2 e folded in and the max subtracted, then `ex2.approx.ftz`
//   (`Softmax`), instead of a multiply, a subtraction and `expf`; with a mask, the max is
//   subtracted from the masked logit before the multiply by log2 e (a subtraction, a multiply and
//   `ex2`: right for masks of −1e9, −1e10 or finfo(f32).min, where the fold is not). The variants exist to be timed against each other on a
//   GPU (`UNET_ATTENTION_FUSED_VARIANT`); the default is the 4-warp `_e2` one. Key tiles of 64 (32 when the output chunk is wider than 160 columns). q·kᵀ and p·v
//   with `mma.sync.aligned.m16n8k16` (f32 accumulate) on fragments read with `ldmatrix`
//   (`.trans` for v); q, k and v tiles copied with `cp.async` (16 bytes, zero-filled past the
//   ends) when every row is 16-byte aligned, element by element otherwise. The head dim is
//   padded with zeros to `dp`, a multiple of 16, in shared memory; rows of a multiple of 64
//   elements are stored with their 16-byte chunks swizzled (XOR with the row), other rows 8
//   elements longer (`SmemTile`), so that the 8 row addresses of an `ldmatrix` fall in 8
//   different bank groups. The
//   output columns are split into chunks of `DVC` (grid y), each chunk's CTA recomputing q·kᵀ:
//   this keeps the accumulator at most 128 f32 registers a thread (head dim 512 = 2 chunks of
//   256) and doubles the CTAs where there are few. The probabilities `exp(s − m)` are rounded to
//   the input dtype before p·v (PyTorch's GPU kernels do so); the row sum `l` is taken before
//   rounding; `m` is the running maximum.
// * `fattn_{f16,bf16}_dv{16,32,64,96,128}_r32_e2`: the `_e2` kernel with 32 query rows a warp
//   (FlashAttention-2's warp tile; the `r32` variant): 4 warps of two 16-row blocks, 128 queries
//   a CTA. Each k fragment read with `ldmatrix` serves the q·kᵀ mmas of both row blocks, each v
//   fragment both blocks' p·v mmas (about 0.31 `ldmatrix` an mma at head dim 64 against 0.56
//   with 16 rows); the softmax steps run per row block. Chunks up to 128 columns only; key tiles
//   of 32 where 64 would spill (`FATTN_MMA_R32_FAMILIES`).
// * `fattn_{f16,bf16}_wide[32][_e2]` (attention_wide.cuh): head dims over 256 (the VAE's 512) as
//   8 warps on one tile of 64 queries: the two halves of each 16-row block split the keys of a
//   tile for q·kᵀ (each score computed once, where the column chunks above compute it twice),
//   share their rounded probabilities through shared memory and split the 512 output columns
//   for p·v. The chunk kernels still run head dims over 256 as the `chunked` and `w8` variants.
// * `fattn_f32_ni{1,2,4,8,16}`: plain f32 FMA, no tensor cores: 4 warps of `RW` query rows each (4 up to head dim 128, else 2);
//   key tiles of 32, one key per lane for q·kᵀ, output columns spread over the lanes (`NI` per
//   lane) for p·v.
// * `fattn_merge_{f16,bf16,f32}`: split-KV. When the grid above has too few CTAs to fill the
//   GPU, grid z splits the key tiles; each split writes its unnormalised f32 output and its
//   `(m, l)` to a workspace, and this kernel merges them: `M = max m_s`,
//   `out = Σ o_s·exp(m_s − M) / Σ l_s·exp(m_s − M)`.
//
// Layouts: q (B, H, Lq, D), k (B, H, Lk, D), v (B, H, Lk, D) with any batch/head/row strides
// (in elements) and a contiguous last dim; out contiguous (B, H, Lq, D). `mask` (nullable) is
// additive f32 with strides (b, h, q, k), 0 where broadcast. Keys past Lk score −inf; a row with
// every key at −inf gives 0 (as PyTorch's fused kernels); one with every key at the same finite
// mask value (−1e9, finfo(f32).min) their mean, the softmax of equal logits. Memory:
// O(tokens × head dim) (the split workspace, null when unsplit, is splits × B·H·Lq·(D + 2)
// floats).
//
// Requires sm_80+ for the mma/ldmatrix/cp.async kernels (build.rs builds nothing below that).
// Status: compiled by nvcc in CI; it has NOT yet run on a GPU (see crates/attention/src/cuda).
// Built with -DUNET_CUDA_EMULATE, this same source runs on the CPU under kernels/emu/cuda_emu.h
// (crates/attention/src/cuda_plan/emulated.rs): a check of its logic, not of the GPU.

#ifdef UNET_CUDA_EMULATE
#include "emu/cuda_emu.h" // the CPU emulation the unit tests build this file with
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#endif

#define NEG_INF __int_as_float(0xff800000)

namespace {

constexpr int THREADS = 128; // 4 warps (f32 and merge kernels)
constexpr float LOG2E = 1.4426950408889634f;

#ifdef UNET_CUDA_EMULATE
using emu::BF16;
using emu::cp_async16;
using emu::cp_async_commit;
using emu::cp_async_wait_all;
using emu::dynamic_smem;
using emu::F16;
__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void* p) { emu::ldmatrix_x4(r, p, false); }
__device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], const void* p) { emu::ldmatrix_x4(r, p, true); }
using emu::exp2_approx;
#else

struct F16 {
    static __device__ __forceinline__ uint32_t pack(float a, float b) {
        __half2 h = __floats2half2_rn(a, b);
        return *reinterpret_cast<uint32_t*>(&h);
    }
    static __device__ __forceinline__ uint16_t bits(float x) { return __half_as_ushort(__float2half_rn(x)); }
    static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                     "{%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

struct BF16 {
    static __device__ __forceinline__ uint32_t pack(float a, float b) {
        __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
        return *reinterpret_cast<uint32_t*>(&h);
    }
    static __device__ __forceinline__ uint16_t bits(float x) { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }
    static __device__ __forceinline__ void mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                     "{%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global → shared, asynchronously; zero-filled when `valid` is false (nothing is read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

__device__ __forceinline__ void ldsm_x4(uint32_t r[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

// 2^x by ex2.approx.ftz.f32 (the special-function unit; 2^-126 and below flush to 0).
__device__ __forceinline__ float exp2_approx(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// The block's dynamic shared memory (its size is the launch's).
template <typename T> __device__ __forceinline__ T* dynamic_smem() {
    extern __shared__ __align__(16) unsigned char dynamic_smem_bytes[];
    return reinterpret_cast<T*>(dynamic_smem_bytes);
}
#endif

// A tile of 16-bit elements in shared memory, addressed by 8-element chunks (16 bytes: what one
// `ldmatrix` row address and one `cp.async` cover). Rows of a multiple of 64 elements are stored
// `swizzled`: chunk j of row r at chunk j ^ (r % 8) of the same row, so the 8 rows an `ldmatrix`
// phase reads at one column, and the 8 chunks of one row that 8 lanes copy, fall in 8 different
// bank groups without padding. Other rows are padded by 8 elements (an odd number of chunks a
// row) for the same effect on `ldmatrix`.
struct SmemTile {
    uint16_t* base;
    int stride; // elements a row
    bool swizzled;
    __device__ __forceinline__ uint16_t* chunk(int r, int c) const { // c: a multiple of 8
        return base + r * stride + (swizzled ? (((c >> 3) ^ (r & 7)) << 3) : c);
    }
};

// The tile of `rows` rows of `cols` elements (a multiple of 16) at `base`.
__device__ __forceinline__ SmemTile smem_tile(uint16_t* base, int cols) {
    const bool swizzled = cols % 64 == 0;
    return SmemTile{base, swizzled ? cols : cols + 8, swizzled};
}

// Fill tile element (r, c) (r < rows, c < cols, cols a multiple of 8) with
// src[r·src_stride + col0 + c] where r < rows_valid and col0 + c < d, else 0. 16-bit elements.
// `vec`: every 8-element chunk is 16-byte aligned and wholly inside or outside d (cp.async).
__device__ __forceinline__ void load_tile16(const SmemTile& dst, const uint16_t* src, long long src_stride, int rows,
                                            int rows_valid, int col0, int cols, int d, bool vec) {
    const int chunks = cols / 8;
    for (int i = threadIdx.x; i < rows * chunks; i += blockDim.x) {
        const int r = i / chunks, c = (i % chunks) * 8;
        uint16_t* out = dst.chunk(r, c);
        if (vec) {
            const bool ok = r < rows_valid && col0 + c < d;
            cp_async16(out, ok ? src + r * src_stride + col0 + c : src, ok);
        } else {
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                const bool ok = r < rows_valid && col0 + c + e < d;
                out[e] = ok ? src[r * src_stride + col0 + c + e] : uint16_t(0);
            }
        }
    }
}

struct Args {
    const void* q;
    const void* k;
    const void* v;
    const float* mask;
    void* out;
    float* ws_o;
    float* ws_ml;
    int heads, bhs, lq, lk, d, dp, chunks, splits, tiles_per_split, vec;
    long long q_sb, q_sh, q_sr, k_sb, k_sh, k_sr, v_sb, v_sh, v_sr;
    long long m_sb, m_sh, m_sq, m_sk;
    float scale;
};

// One output element: normalised by `l` and stored through `put` (one split), or the f32 partial
// into the split workspace.
template <typename Put>
__device__ __forceinline__ void store_out(const Args& a, int bh, int split, int q, int col, float o, float l, Put put) {
    const long long row = (long long)bh * a.lq + q;
    if (a.splits > 1) {
        a.ws_o[((long long)split * a.bhs * a.lq + row) * a.d + col] = o;
    } else {
        put(row * a.d + col, l > 0.f ? o * (1.f / l) : 0.f);
    }
}

// Where a kernel's results go: f32, or 16-bit bits of `T`.
struct PutF32 {
    float* out;
    __device__ __forceinline__ void operator()(long long i, float x) const { out[i] = x; }
};
template <typename T>
struct PutHalf {
    uint16_t* out;
    __device__ __forceinline__ void operator()(long long i, float x) const { out[i] = T::bits(x); }
};

// The (m, l) of one row of one split.
__device__ __forceinline__ void store_ml(const Args& a, int bh, int split, int q, float m, float l) {
    float* ml = a.ws_ml + (((long long)split * a.bhs + bh) * a.lq + q) * 2;
    ml[0] = m;
    ml[1] = l;
}

// How the mma kernels turn scores into probabilities. The `expf` kernels (EXP2 false): x =
// s·scale (+ mask), the row max m over x, p = e^(x − m). The `_e2` kernels, FlashAttention-2's
// form: the scores are kept as u, the logit being u·unit: the raw score (unit = scale) where
// there is no mask and scale > 0, else s·scale + mask by one FFMA (unit = 1); the row max m is
// taken over u, and p = 2^(u·k − fl(m·k)) with k = unit·log2 e for raw scores (one FFMA and one
// `ex2.approx.ftz` a score; relative error about 2^-22, results below 2^-126 flushed to 0), else
// p = 2^((u − m)·k) (a masked row max can be −1e9 or finfo(f32).min, where fl(m·k) is 18 off,
// a factor 2^18 in every p of the row, or overflows: `exponentiate`). The split workspace gets m·unit, a logit, as the merge
// reads it.
struct Softmax {
    bool raw;   // u is the raw score
    float unit; // logit = u·unit
    float k;    // unit·log2 e
};
template <bool RAW> __device__ __forceinline__ Softmax softmax_of(const Args& a) {
    const float unit = RAW ? a.scale : 1.f;
    return Softmax{RAW, unit, unit * LOG2E};
}
// Whether an `_e2` kernel keeps the raw scores (no mask, a positive scale): decided once a
// kernel, so that each form is compiled on its own (no branch, and no register held for it).
__device__ __forceinline__ bool raw_scores(const Args& a) { return a.mask == nullptr && a.scale > 0.f; }

#include "attention_steps.cuh" // head_inputs, key_tiles, scores, mask_and_max, rescale, ...

// WARPS warps, each holding RB blocks of 16 query rows (RB = 2: 32 rows, FlashAttention-2's
// warp tile): each k and v fragment read from shared memory feeds RB mmas, one a row block.
template <typename T, int DVC, int BC, int WARPS, int RB, bool EXP2, bool RAW>
__device__ __forceinline__ void attention_mma_tiles(const Args a) {
    constexpr int BR = 16 * RB * WARPS; // queries per CTA: 16·RB a warp
    uint16_t* smem = dynamic_smem<uint16_t>();
    const SmemTile qs = smem_tile(smem, a.dp);
    const SmemTile ks = smem_tile(qs.base + BR * qs.stride, a.dp);
    const SmemTile vs = smem_tile(ks.base + BC * ks.stride, DVC);

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    const int q0 = blockIdx.x * BR, row0 = warp * 16 * RB; // row block b: tile rows row0 + 16·b …
    const int bh = blockIdx.y / a.chunks, chunk = blockIdx.y % a.chunks, split = blockIdx.z;
    const int col0 = chunk * DVC;
    const bool vec = a.vec != 0;
    const HeadInputs in = head_inputs(a, bh, q0);
    const KeyTiles kt_range = key_tiles(a, split, BC);
    const Softmax sm = softmax_of<RAW>(a);

    load_first_tiles(qs, ks, in, a, q0, BR, BC, kt_range, vec);
    // Per row block: the output accumulator, the running (m, l) and the query rows (g and g + 8).
    float o[RB][DVC / 8][4], m[RB][2], l[RB][2];
    int qrow[RB][2];
#pragma unroll
    for (int b = 0; b < RB; ++b) {
        zero_blocks<DVC / 8>(o[b]);
        m[b][0] = m[b][1] = NEG_INF;
        l[b][0] = l[b][1] = 0.f;
        qrow[b][0] = q0 + row0 + 16 * b + g;
        qrow[b][1] = qrow[b][0] + 8;
    }

    for (int kt = kt_range.begin; kt < kt_range.end; ++kt) {
        const int kv0 = kt * BC;
        cp_async_wait_all();
        __syncthreads(); // k tile kt (and q) in shared memory; every warp done with the last v tile
        load_tile16(vs, in.v + (long long)kv0 * a.v_sr, a.v_sr, BC, a.lk - kv0, col0, DVC, a.d, vec);
        cp_async_commit();

        // s = q·kᵀ for this warp's RB·16 rows × BC keys.
        float s[RB][BC / 8][4];
        scores_rows<T, BC / 8, RB>(s, qs, ks, row0, 0, a.dp, lane);

        // Scale, mask, key bounds; online softmax over each row block's rows g and g + 8.
#pragma unroll
        for (int b = 0; b < RB; ++b) {
            float mx[2], sub[2];
            mask_and_max<EXP2, BC / 8>(s[b], mx, a, in.mask, kv0, qrow[b], t, sm);
            rescale<EXP2, DVC / 8>(m[b], l[b], o[b], mx, sub, sm);
            exponentiate<EXP2, BC / 8>(s[b], sub, l[b], sm);
        }

        cp_async_wait_all();
        __syncthreads(); // v tile in shared memory; every warp done with the k tile
        if (kt + 1 < kt_range.end) {
            load_tile16(ks, in.k + (long long)(kv0 + BC) * a.k_sr, a.k_sr, BC, a.lk - kv0 - BC, 0, a.dp, a.d, vec);
        }
        cp_async_commit();

        // o += round(p)·v (p rounded to the input dtype, as PyTorch's kernels do); each v
        // fragment serves every row block.
#pragma unroll
        for (int ks16 = 0; ks16 < BC / 16; ++ks16) {
            uint32_t af[RB][4];
#pragma unroll
            for (int b = 0; b < RB; ++b) p_fragment<T, BC / 8>(af[b], s[b], ks16);
#pragma unroll
            for (int n = 0; n < DVC / 16; ++n) {
                uint32_t bf[4];
                ldsm_x4_t(bf, vs.chunk(ks16 * 16 + (lane % 8) + ((lane / 8) % 2) * 8, n * 16 + (lane / 16) * 8));
#pragma unroll
                for (int b = 0; b < RB; ++b) {
                    T::mma(o[b][2 * n], af[b], bf[0], bf[1]);
                    T::mma(o[b][2 * n + 1], af[b], bf[2], bf[3]);
                }
            }
        }
    }
    cp_async_wait_all();
#pragma unroll
    for (int b = 0; b < RB; ++b) {
        quad_sum(l[b]);
        logit_max<EXP2>(m[b], sm);
        store_rows<T, DVC / 8>(a, bh, split, qrow[b], col0, t, o[b], m[b], l[b], chunk == 0 && t == 0);
    }
}

// `attention_mma_tiles` in the softmax form the call takes (`Softmax`).
template <typename T, int DVC, int BC, int WARPS, int RB, bool EXP2>
__device__ void attention_mma(const Args a) {
    if (EXP2 && raw_scores(a)) {
        attention_mma_tiles<T, DVC, BC, WARPS, RB, EXP2, EXP2>(a);
    } else {
        attention_mma_tiles<T, DVC, BC, WARPS, RB, EXP2, false>(a);
    }
}

#include "attention_wide.cuh" // head dims over 256 in one block: attention_wide<T, BC, EXP2>

// f32: RW query rows a warp, key tiles of 32 (one key a lane for q·kᵀ), NI output columns a lane.
template <int NI, int RW>
__device__ void attention_f32(const Args a) {
    float* fsm = dynamic_smem<float>();
    constexpr int KT = 32, ROWS = 4 * RW;
    const int d = a.d, ksd = a.d | 1; // odd k row stride: lane-per-key reads hit 32 banks
    float* qs = fsm;
    float* ks = qs + ROWS * d;
    float* vs = ks + KT * ksd;

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int q0 = blockIdx.x * ROWS, bh = blockIdx.y, split = blockIdx.z;
    const int b = bh / a.heads, h = bh % a.heads;
    const float* qg = static_cast<const float*>(a.q) + b * a.q_sb + h * a.q_sh;
    const float* kg = static_cast<const float*>(a.k) + b * a.k_sb + h * a.k_sh;
    const float* vg = static_cast<const float*>(a.v) + b * a.v_sb + h * a.v_sh;
    const float* mg = a.mask ? a.mask + b * a.m_sb + h * a.m_sh : nullptr;
    for (int i = threadIdx.x; i < ROWS * d; i += blockDim.x) {
        const int r = i / d, c = i % d;
        qs[i] = q0 + r < a.lq ? qg[(long long)(q0 + r) * a.q_sr + c] : 0.f;
    }
    const int tiles = (a.lk + KT - 1) / KT;
    const int kt_begin = split * a.tiles_per_split, kt_end = min(tiles, kt_begin + a.tiles_per_split);

    float o[RW][NI], m[RW], l[RW];
#pragma unroll
    for (int r = 0; r < RW; ++r) {
        m[r] = NEG_INF;
        l[r] = 0.f;
#pragma unroll
        for (int i = 0; i < NI; ++i) o[r][i] = 0.f;
    }
    for (int kt = kt_begin; kt < kt_end; ++kt) {
        const int kv0 = kt * KT;
        __syncthreads(); // every warp done with the last tiles
        for (int i = threadIdx.x; i < KT * d; i += blockDim.x) {
            const int r = i / d, c = i % d;
            const bool ok = kv0 + r < a.lk;
            ks[r * ksd + c] = ok ? kg[(long long)(kv0 + r) * a.k_sr + c] : 0.f;
            vs[i] = ok ? vg[(long long)(kv0 + r) * a.v_sr + c] : 0.f;
        }
        __syncthreads();
        const int key = kv0 + lane;
        float s[RW];
#pragma unroll
        for (int r = 0; r < RW; ++r) s[r] = 0.f;
        for (int c = 0; c < d; ++c) {
            const float kc = ks[lane * ksd + c];
#pragma unroll
            for (int r = 0; r < RW; ++r) s[r] = fmaf(qs[(warp * RW + r) * d + c], kc, s[r]);
        }
#pragma unroll
        for (int r = 0; r < RW; ++r) {
            const int qr = q0 + warp * RW + r;
            float x = NEG_INF;
            if (key < a.lk) {
                x = s[r] * a.scale;
                if (mg && qr < a.lq) x += mg[qr * a.m_sq + key * a.m_sk];
            }
            float mx = x;
#pragma unroll
            for (int w = 16; w > 0; w /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, w));
            const float m_new = fmaxf(m[r], mx);
            const float m_use = m_new == NEG_INF ? 0.f : m_new;
            const float alpha = expf(m[r] - m_use);
            const float p = expf(x - m_use);
            float ps = p;
#pragma unroll
            for (int w = 16; w > 0; w /= 2) ps += __shfl_xor_sync(0xffffffff, ps, w);
            m[r] = m_new;
            l[r] = l[r] * alpha + ps;
#pragma unroll
            for (int i = 0; i < NI; ++i) o[r][i] *= alpha;
            for (int j = 0; j < KT; ++j) {
                const float pj = __shfl_sync(0xffffffff, p, j);
#pragma unroll
                for (int i = 0; i < NI; ++i) {
                    const int c = lane + 32 * i;
                    if (c < d) o[r][i] = fmaf(pj, vs[j * d + c], o[r][i]);
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < RW; ++r) {
        const int qr = q0 + warp * RW + r;
        if (qr >= a.lq) continue;
#pragma unroll
        for (int i = 0; i < NI; ++i) {
            const int c = lane + 32 * i;
            if (c < d) store_out(a, bh, split, qr, c, o[r][i], l[r], PutF32{static_cast<float*>(a.out)});
        }
        if (a.splits > 1 && lane == 0) store_ml(a, bh, split, qr, m[r], l[r]);
    }
}

// Merge the splits of one (b·h, query) row: grid x = rows, threads over columns.
template <typename Put>
__device__ void merge_rows(const float* ws_o, const float* ws_ml, int rows, int d, int splits, Put put) {
    const long long row = blockIdx.x;
    float big = NEG_INF;
    for (int s = 0; s < splits; ++s) big = fmaxf(big, ws_ml[((long long)s * rows + row) * 2]);
    float l = 0.f;
    for (int s = 0; s < splits; ++s) {
        const float* ml = ws_ml + ((long long)s * rows + row) * 2;
        if (big != NEG_INF) l += ml[1] * expf(ml[0] - big);
    }
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float o = 0.f;
        if (big != NEG_INF) {
            for (int s = 0; s < splits; ++s) {
                const float ms = ws_ml[((long long)s * rows + row) * 2];
                o += ws_o[((long long)s * rows + row) * d + c] * expf(ms - big);
            }
        }
        put(row * d + c, l > 0.f ? o * (1.f / l) : 0.f);
    }
}

} // namespace

// The mma kernel families: (dtype name, type, output-column chunk, key tile). Each comes in four
// variants: `fattn_<ty>_dv<DVC>` (4 warps: 64 queries a CTA; expf), `_e2` (exp2 with the log2 e
// factor), `_w8` (8 warps: 128 queries a CTA, k and v tiles shared by twice the queries), `_w8_e2`.
#define FATTN_MMA_FAMILIES(X)                                                                                   \
    X(f16, F16, 16, 64) X(f16, F16, 32, 64) X(f16, F16, 64, 64) X(f16, F16, 96, 64) X(f16, F16, 128, 64)        \
    X(f16, F16, 160, 64) X(f16, F16, 192, 32) X(f16, F16, 256, 32) X(bf16, BF16, 16, 64) X(bf16, BF16, 32, 64)  \
    X(bf16, BF16, 64, 64) X(bf16, BF16, 96, 64) X(bf16, BF16, 128, 64) X(bf16, BF16, 160, 64)                   \
    X(bf16, BF16, 192, 32) X(bf16, BF16, 256, 32)

// The four variants of family (TY, DVC), for a macro `V(X, name, warps, exp2)` (X passed through).
#define FATTN_MMA_VARIANTS(V, X, TY, DVC)                                                                       \
    V(X, fattn_##TY##_dv##DVC, 4, false)                                                                       \
    V(X, fattn_##TY##_dv##DVC##_e2, 4, true)                                                                   \
    V(X, fattn_##TY##_dv##DVC##_w8, 8, false)                                                                  \
    V(X, fattn_##TY##_dv##DVC##_w8_e2, 8, true)

#define FATTN_MMA_KERNEL(FAMILY, NAME, WARPS, EXP2)                                                             \
    extern "C" __global__ void __launch_bounds__(32 * WARPS) NAME(const Args a) {                              \
        FAMILY::run<WARPS, EXP2>(a);                                                                           \
    }
#define FATTN_MMA_FAMILY(TY, T, DVC, BC)                                                                        \
    struct Family_##TY##_##DVC {                                                                               \
        template <int WARPS, bool EXP2> static __device__ __forceinline__ void run(const Args a) {             \
            attention_mma<T, DVC, BC, WARPS, 1, EXP2>(a);                                                      \
        }                                                                                                      \
    };                                                                                                         \
    FATTN_MMA_VARIANTS(FATTN_MMA_KERNEL, Family_##TY##_##DVC, TY, DVC)

FATTN_MMA_FAMILIES(FATTN_MMA_FAMILY)

// The 32-row variant, `fattn_<ty>_dv<DVC>_r32_e2`: 4 warps of two 16-row blocks (128 queries a
// CTA), each k and v fragment feeding both blocks' mmas, the exp2 softmax; only for chunks up to
// 128 columns (two row blocks' accumulators over wider chunks do not fit the registers).
// (dtype name, type, chunk, key tile): key tiles of 64 where the two blocks' scores (2·BC/2
// floats a lane) and outputs (2·DVC/2) fit without spilling (sm_90: 168 registers at chunk 32,
// 234 at 64), else 32 (chunk 96: 202, 128: 236; chunk 16 with tiles of 64 spilled 12 bytes at
// ptxas's own 168-register choice, with 32 it takes 116). cuda_plan.rs's `R32_KEY_TILES`.
#define FATTN_MMA_R32_FAMILIES(X)                                                                               \
    X(f16, F16, 16, 32) X(f16, F16, 32, 64) X(f16, F16, 64, 64) X(f16, F16, 96, 32) X(f16, F16, 128, 32)        \
    X(bf16, BF16, 16, 32) X(bf16, BF16, 32, 64) X(bf16, BF16, 64, 64) X(bf16, BF16, 96, 32)                     \
    X(bf16, BF16, 128, 32)

#define FATTN_MMA_R32(TY, T, DVC, BC)                                                                           \
    extern "C" __global__ void __launch_bounds__(128) fattn_##TY##_dv##DVC##_r32_e2(const Args a) {             \
        attention_mma<T, DVC, BC, 4, 2, true>(a);                                                              \
    }

FATTN_MMA_R32_FAMILIES(FATTN_MMA_R32)

// Head dims over 256: 8 warps sharing one 64-query tile, q·kᵀ once (attention_wide.cuh); key
// tiles of 64 (`_wide`) or, where that shared memory does not fit, 32 (`_wide32`).
#define FATTN_WIDE_KERNEL(NAME, T, BC, EXP2)                                                                    \
    extern "C" __global__ void __launch_bounds__(256) NAME(const Args a) { attention_wide<T, BC, EXP2>(a); }
#define FATTN_WIDE(TY, T)                                                                                       \
    FATTN_WIDE_KERNEL(fattn_##TY##_wide, T, 64, false)                                                         \
    FATTN_WIDE_KERNEL(fattn_##TY##_wide_e2, T, 64, true)                                                       \
    FATTN_WIDE_KERNEL(fattn_##TY##_wide32, T, 32, false)                                                       \
    FATTN_WIDE_KERNEL(fattn_##TY##_wide32_e2, T, 32, true)

FATTN_WIDE(f16, F16)
FATTN_WIDE(bf16, BF16)

#define FATTN_F32(NAME, NI, RW)                                                                                  \
    extern "C" __global__ void __launch_bounds__(THREADS) NAME(const Args a) { attention_f32<NI, RW>(a); }

FATTN_F32(fattn_f32_ni1, 1, 4)
FATTN_F32(fattn_f32_ni2, 2, 4)
FATTN_F32(fattn_f32_ni4, 4, 4)
FATTN_F32(fattn_f32_ni8, 8, 2)
FATTN_F32(fattn_f32_ni16, 16, 2)

extern "C" __global__ void fattn_merge_f32(const float* ws_o, const float* ws_ml, float* out, int rows, int d, int splits) {
    merge_rows(ws_o, ws_ml, rows, d, splits, PutF32{out});
}
extern "C" __global__ void fattn_merge_f16(const float* ws_o, const float* ws_ml, uint16_t* out, int rows, int d, int splits) {
    merge_rows(ws_o, ws_ml, rows, d, splits, PutHalf<F16>{out});
}
extern "C" __global__ void fattn_merge_bf16(const float* ws_o, const float* ws_ml, uint16_t* out, int rows, int d, int splits) {
    merge_rows(ws_o, ws_ml, rows, d, splits, PutHalf<BF16>{out});
}
