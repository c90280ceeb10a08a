// The steps the two mma attention kernels share (`attention_mma` in fused_attention.cu and
// `attention_wide` in attention_wide.cuh). Included by fused_attention.cu inside its anonymous
// namespace, after `Args`, `SmemTile`, `load_tile16`, `store_out`, `store_ml`, `PutHalf` and
// `Softmax`.
//
// A lane holds its warp's scores and outputs as m16n8 accumulator fragments: for each block j of
// 8 columns, elements 0, 1 in row g = lane / 4 and 2, 3 in row g + 8, at columns 2·(lane % 4)
// and + 1.

// What the (batch, head) `bh` of a thread block reads: its q rows from query q0, k and v from
// key 0, and its mask (null when there is none).
struct HeadInputs {
    const uint16_t* q;
    const uint16_t* k;
    const uint16_t* v;
    const float* mask;
};
__device__ __forceinline__ HeadInputs head_inputs(const Args& a, int bh, int q0) {
    const int b = bh / a.heads, h = bh % a.heads;
    return HeadInputs{static_cast<const uint16_t*>(a.q) + b * a.q_sb + h * a.q_sh + q0 * a.q_sr,
                      static_cast<const uint16_t*>(a.k) + b * a.k_sb + h * a.k_sh,
                      static_cast<const uint16_t*>(a.v) + b * a.v_sb + h * a.v_sh,
                      a.mask ? a.mask + b * a.m_sb + h * a.m_sh : nullptr};
}

// The key tiles [begin, end) of split `split` (tiles of `bc` keys).
struct KeyTiles {
    int begin, end;
};
__device__ __forceinline__ KeyTiles key_tiles(const Args& a, int split, int bc) {
    const int tiles = (a.lk + bc - 1) / bc;
    const int begin = split * a.tiles_per_split;
    return KeyTiles{begin, min(tiles, begin + a.tiles_per_split)};
}

// The block's q tile (`br` queries from q0) and its first k tile (`bc` keys), copied as one
// commit group.
__device__ __forceinline__ void load_first_tiles(const SmemTile& qs, const SmemTile& ks, const HeadInputs& in,
                                                 const Args& a, int q0, int br, int bc, KeyTiles range, bool vec) {
    load_tile16(qs, in.q, a.q_sr, br, a.lq - q0, 0, a.dp, a.d, vec);
    if (range.begin < range.end) {
        const int kv0 = range.begin * bc;
        load_tile16(ks, in.k + (long long)kv0 * a.k_sr, a.k_sr, bc, a.lk - kv0, 0, a.dp, a.d, vec);
    }
    cp_async_commit();
}

template <int N> __device__ __forceinline__ void zero_blocks(float o[N][4]) {
#pragma unroll
    for (int j = 0; j < N; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;
}

// s = q·kᵀ for RB blocks of 16 query rows (block b from row row0 + 16·b of the q tile) and the
// NJ·8 keys from `key0` of the k tile, over the padded head dim `dp`. Each k fragment is read
// from shared memory once a k step and serves every row block (RB mmas a fragment half).
template <typename T, int NJ, int RB>
__device__ __forceinline__ void scores_rows(float s[RB][NJ][4], const SmemTile& qs, const SmemTile& ks, int row0,
                                            int key0, int dp, int lane) {
#pragma unroll
    for (int b = 0; b < RB; ++b) zero_blocks<NJ>(s[b]);
    for (int k0 = 0; k0 < dp; k0 += 16) {
        uint32_t af[RB][4];
#pragma unroll
        for (int b = 0; b < RB; ++b) {
            ldsm_x4(af[b], qs.chunk(row0 + 16 * b + (lane % 8) + ((lane / 8) % 2) * 8, k0 + (lane / 16) * 8));
        }
#pragma unroll
        for (int n = 0; n < NJ / 2; ++n) {
            uint32_t bf[4];
            ldsm_x4(bf, ks.chunk(key0 + n * 16 + (lane % 8) + (lane / 16) * 8, k0 + ((lane / 8) % 2) * 8));
#pragma unroll
            for (int b = 0; b < RB; ++b) {
                T::mma(s[b][2 * n], af[b], bf[0], bf[1]);
                T::mma(s[b][2 * n + 1], af[b], bf[2], bf[3]);
            }
        }
    }
}

// `scores_rows` for the 16 query rows from `row0`.
template <typename T, int NJ>
__device__ __forceinline__ void scores(float s[NJ][4], const SmemTile& qs, const SmemTile& ks, int row0, int key0,
                                       int dp, int lane) {
    scores_rows<T, NJ, 1>(reinterpret_cast<float(*)[NJ][4]>(s), qs, ks, row0, key0, dp, lane);
}

// The scores of NJ column blocks from key `key0` on scaled, masked (keys past lk at −∞, plus the
// additive mask) in place; each row's maximum over them, across the 4 lanes of the row. With
// EXP2 they become `Softmax`'s u: the raw scores (`sm.raw`), else s·scale + mask by one FFMA.
template <bool EXP2, int NJ>
__device__ __forceinline__ void mask_and_max(float s[NJ][4], float mx[2], const Args& a, const float* mg, int key0,
                                             const int qrow[2], int t, const Softmax& sm) {
    mx[0] = mx[1] = NEG_INF;
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = e / 2, key = key0 + j * 8 + 2 * t + (e & 1);
            float x = NEG_INF;
            if (key < a.lk) {
                const bool masked = mg && qrow[r] < a.lq;
                if (EXP2) {
                    x = sm.raw ? s[j][e] : fmaf(s[j][e], a.scale, masked ? mg[qrow[r] * a.m_sq + key * a.m_sk] : 0.f);
                } else {
                    x = s[j][e] * a.scale;
                    if (masked) x += mg[qrow[r] * a.m_sq + key * a.m_sk];
                }
            }
            s[j][e] = x;
            mx[r] = fmaxf(mx[r], x);
        }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 2));
    }
}

// The online softmax's step for a tile whose row maxima are `mx`: the running max `m` moves to
// max(m, mx), `l` and the NO output blocks `o` are rescaled by e^(m_old − m_new) (EXP2:
// 2^((m_old − m_new)·k)), and `sub` is what the tile's exponents take off: m_use·k in the raw
// form (`sm.raw`), else m_use (m_use: the new max, 0 while a row has no finite score).
template <bool EXP2, int NO>
__device__ __forceinline__ void rescale(float m[2], float l[2], float o[NO][4], const float mx[2], float sub[2],
                                        const Softmax& sm) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float m_new = fmaxf(m[r], mx[r]);
        const float m_use = m_new == NEG_INF ? 0.f : m_new;
        sub[r] = EXP2 && sm.raw ? m_use * sm.k : m_use;
        const float alpha = EXP2 ? exp2_approx((m[r] - m_use) * sm.k) : expf(m[r] - m_use);
        m[r] = m_new;
        l[r] *= alpha;
#pragma unroll
        for (int j = 0; j < NO; ++j) {
            o[j][2 * r] *= alpha;
            o[j][2 * r + 1] *= alpha;
        }
    }
}

// p = e^(x − m_use) in place over NJ column blocks, summed (unrounded) into `l`. EXP2: in the
// raw form (no mask) 2^(u·k − fl(m_use·k)), one FFMA and `ex2.approx`; with a mask (or a scale
// ≤ 0) 2^((x − m_use)·k), the max subtracted before scaling. The fold keeps fl(m·k)'s rounding
// error e as a factor 2^e common to the row, which the division by `l` cancels while it stays in
// range, as it does for raw scores; a row max of masked logits is where it does not: e = +18.4
// at −1e9 (p = 2^18.4, past f16), +440 at −1e10 (past f32), and m·k overflows at
// finfo(f32).min: NaN or all-zero rows. x − m is exact for equal masked logits (p = 1 each: a
// wholly masked row averages its keys uniformly, as PyTorch's softmax of equal logits does).
template <bool EXP2, int NJ>
__device__ __forceinline__ void exponentiate(float s[NJ][4], const float sub[2], float l[2], const Softmax& sm) {
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float x = s[j][e], m = sub[e / 2];
            const float p = !EXP2 ? expf(x - m) : exp2_approx(sm.raw ? fmaf(x, sm.k, -m) : (x - m) * sm.k);
            s[j][e] = p;
            l[e / 2] += p;
        }
    }
}

// The A fragment (16 rows × 16 keys) of p·v for keys 16·kk … +15 of the probabilities `p` (NJ
// column blocks of 8 keys), rounded to the input dtype (as PyTorch's kernels use them).
template <typename T, int NJ>
__device__ __forceinline__ void p_fragment(uint32_t af[4], const float p[NJ][4], int kk) {
    af[0] = T::pack(p[2 * kk][0], p[2 * kk][1]);
    af[1] = T::pack(p[2 * kk][2], p[2 * kk][3]);
    af[2] = T::pack(p[2 * kk + 1][0], p[2 * kk + 1][1]);
    af[3] = T::pack(p[2 * kk + 1][2], p[2 * kk + 1][3]);
}

// The running maxima as logits (m·unit: what the merge of split keys reads) for EXP2's u.
template <bool EXP2> __device__ __forceinline__ void logit_max(float m[2], const Softmax& sm) {
    if (EXP2) {
        m[0] *= sm.unit;
        m[1] *= sm.unit;
    }
}

// A row's sum across the 4 lanes that hold it.
__device__ __forceinline__ void quad_sum(float l[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] += __shfl_xor_sync(0xffffffff, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffff, l[r], 2);
    }
}

// The NO output blocks from column col0 of rows `qrow` (divided by the row sums `l`, or into
// the split workspace), and with `with_ml` (one lane of a row when the keys are split) the rows'
// (m, l).
template <typename T, int NO>
__device__ __forceinline__ void store_rows(const Args& a, int bh, int split, const int qrow[2], int col0, int t,
                                           const float o[NO][4], const float m[2], const float l[2], bool with_ml) {
    const PutHalf<T> put{static_cast<uint16_t*>(a.out)};
#pragma unroll
    for (int j = 0; j < NO; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = e / 2, col = col0 + j * 8 + 2 * t + (e & 1);
            if (qrow[r] < a.lq && col < a.d) store_out(a, bh, split, qrow[r], col, o[j][e], l[r], put);
        }
    }
    if (a.splits > 1 && with_ml) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            if (qrow[r] < a.lq) store_ml(a, bh, split, qrow[r], m[r], l[r]);
        }
    }
}
