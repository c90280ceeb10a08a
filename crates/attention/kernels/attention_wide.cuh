// Head dims over 256 (the VAE's 512) in one thread block per query tile, q·kᵀ computed once.
// Included by fused_attention.cu (inside its anonymous namespace, after `attention_mma`), whose
// helpers it uses: `SmemTile`, `load_tile16`, `ldsm_x4(_t)` and the shared steps of the mma
// kernels (`head_inputs`, `key_tiles`, `load_first_tiles`, `scores`, `mask_and_max`, `rescale`, `exponentiate`,
// `quad_sum`, `store_rows`).
//
// The column-chunk kernels (`attention_mma` with DVC = 256) run head dim 512 as two thread
// blocks per query tile, each recomputing the whole q·kᵀ for its 256 output columns: 1.5× the
// useful work. Here 8 warps share one tile of 64 queries: warp w owns query rows
// 16·(w mod 4) … +16 as one of two halves (h = w / 4). For each key tile of BC keys, half h
// computes q·kᵀ for keys h·BC/2 … +BC/2 over the whole head dim (each score once), the two
// halves of a row block exchange their row maxima through shared memory (`row_max`), each
// writes its probabilities, rounded to the input dtype, into a shared p tile, and then each
// computes p·v over all BC keys for its own 256 output columns (h·256 …). The row sums are
// kept per half (over its own keys, with the common running maximum) and added at the end.
// Shared memory: q (64 × dp), one k tile (BC × dp), one v tile (BC × 512), the p tile (64 × BC)
// and 2 × 64 floats: at head dim 512, 200.5 KiB with key tiles of 64 (an H100's opt-in limit is
// 227 KiB) and 133.5 KiB with tiles of 32 (an A100's is 163 KiB); one block, 8 warps, a SM.
// Tiles of 64 read each q fragment from shared memory for 32 keys a warp instead of 16.

template <typename T, int BC, bool EXP2, bool RAW>
__device__ __forceinline__ void attention_wide_tiles(const Args a) {
    constexpr int BR = 64, HALF = BC / 2, DVC = 256;
    uint16_t* smem = dynamic_smem<uint16_t>();
    const SmemTile qs = smem_tile(smem, a.dp);
    const SmemTile ks = smem_tile(qs.base + BR * qs.stride, a.dp);
    const SmemTile vs = smem_tile(ks.base + BC * ks.stride, 2 * DVC);
    const SmemTile ps = smem_tile(vs.base + BC * vs.stride, BC);
    float* row_max = reinterpret_cast<float*>(ps.base + BR * ps.stride); // [2][BR]: maxima, then sums

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
    const int rows0 = (warp % 4) * 16, half = warp / 4;
    const int key_off = half * HALF, col0 = half * DVC;
    const int q0 = blockIdx.x * BR;
    const int bh = blockIdx.y, split = blockIdx.z;
    const bool vec = a.vec != 0;
    const HeadInputs in = head_inputs(a, bh, q0);
    const KeyTiles kt_range = key_tiles(a, split, BC);
    const Softmax sm = softmax_of<RAW>(a);

    load_first_tiles(qs, ks, in, a, q0, BR, BC, kt_range, vec);
    float o[DVC / 8][4];
    zero_blocks<DVC / 8>(o);
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
    const int local[2] = {rows0 + g, rows0 + g + 8}; // this lane's rows in the tile
    const int qrow[2] = {q0 + local[0], q0 + local[1]};

    for (int kt = kt_range.begin; kt < kt_range.end; ++kt) {
        const int kv0 = kt * BC;
        cp_async_wait_all();
        __syncthreads(); // k tile kt (and q) in shared memory; every warp done with the last v and p tiles
        load_tile16(vs, in.v + (long long)kv0 * a.v_sr, a.v_sr, BC, a.lk - kv0, 0, 2 * DVC, a.d, vec);
        cp_async_commit();

        // s = q·kᵀ for this warp's 16 rows × its HALF keys of the tile.
        float s[HALF / 8][4];
        scores<T, HALF / 8>(s, qs, ks, rows0, key_off, a.dp, lane);

        // Scale, mask, key bounds; this half's row maxima, then both halves'.
        float mx[2], sub[2];
        mask_and_max<EXP2, HALF / 8>(s, mx, a, in.mask, kv0 + key_off, qrow, t, sm);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            if (t == 0) row_max[half * BR + local[r]] = mx[r];
        }
        __syncthreads(); // both halves' maxima written
#pragma unroll
        for (int r = 0; r < 2; ++r) mx[r] = fmaxf(mx[r], row_max[(1 - half) * BR + local[r]]);
        rescale<EXP2, DVC / 8>(m, l, o, mx, sub, sm);
        // p = e^(s − m), summed unrounded, stored rounded (as PyTorch's kernels use it in p·v).
        exponentiate<EXP2, HALF / 8>(s, sub, l, sm);
#pragma unroll
        for (int j = 0; j < HALF / 8; ++j) {
            const int c = key_off + j * 8; // this block's 8 keys: one 16-byte chunk of a p row
            *reinterpret_cast<uint32_t*>(ps.chunk(local[0], c) + 2 * t) = T::pack(s[j][0], s[j][1]);
            *reinterpret_cast<uint32_t*>(ps.chunk(local[1], c) + 2 * t) = T::pack(s[j][2], s[j][3]);
        }

        cp_async_wait_all();
        __syncthreads(); // v and p tiles in shared memory; every warp done with the k tile and maxima
        if (kt + 1 < kt_range.end) {
            load_tile16(ks, in.k + (long long)(kv0 + BC) * a.k_sr, a.k_sr, BC, a.lk - kv0 - BC, 0, a.dp, a.d, vec);
        }
        cp_async_commit();

        // o += p·v for this warp's 16 rows × all BC keys × its 256 output columns.
#pragma unroll
        for (int k16 = 0; k16 < BC / 16; ++k16) {
            uint32_t af[4];
            ldsm_x4(af, ps.chunk(rows0 + (lane % 8) + ((lane / 8) % 2) * 8, k16 * 16 + (lane / 16) * 8));
#pragma unroll
            for (int n = 0; n < DVC / 16; ++n) {
                uint32_t bf[4];
                ldsm_x4_t(bf, vs.chunk(k16 * 16 + (lane % 8) + ((lane / 8) % 2) * 8, col0 + n * 16 + (lane / 16) * 8));
                T::mma(o[2 * n], af, bf[0], bf[1]);
                T::mma(o[2 * n + 1], af, bf[2], bf[3]);
            }
        }
    }
    cp_async_wait_all();

    // Each half's row sums (over its keys, with the common running max), then both halves'.
    quad_sum(l);
    __syncthreads(); // every warp done reading the maxima
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        if (t == 0) row_max[half * BR + local[r]] = l[r];
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < 2; ++r) l[r] += row_max[(1 - half) * BR + local[r]];
    logit_max<EXP2>(m, sm);
    store_rows<T, DVC / 8>(a, bh, split, qrow, col0, t, o, m, l, half == 0 && t == 0);
}

// `attention_wide_tiles` in the softmax form the call takes (`Softmax`).
template <typename T, int BC, bool EXP2>
__device__ void attention_wide(const Args a) {
    if (EXP2 && raw_scores(a)) {
        attention_wide_tiles<T, BC, EXP2, EXP2>(a);
    } else {
        attention_wide_tiles<T, BC, EXP2, false>(a);
    }
}
