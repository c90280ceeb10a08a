//! The `R × 16` AVX2 + FMA register tile (`R` ≤ 6: 12 of the 16 `ymm` registers accumulate),
//! part of the bottom layer ([`crate::cpu`]): the layer GEMM's tile on CPUs without AVX-512, and
//! the attention kernel's score and output tiles there (with K and V packed into 16-wide panels
//! here).
//! Four reduction steps per loop trip: alone in L1 the tile runs at 98 GFLOP/s on a Zen 3 core
//! (its FMA peak is 98 – 100), where one step per trip ran at 89 – 92.

use super::ALayout;
use crate::cpu::isa::Isa;

/// Columns of a tile: the width of a `B` panel.
pub(crate) const NR: usize = 16;
/// Rows of a full tile, and of an interleaved `A` micro-panel.
pub(crate) const MR: usize = 6;

/// Whether the CPU has AVX2 and FMA (detected once).
pub(crate) fn available() -> bool {
    Isa::detect() >= Isa::Avx2
}

/// How a tile's sums meet what `c` holds.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Write<'a> {
    /// `c = sum`.
    Store,
    /// `c = c + sum`: a reduction split into blocks is a blocked sum.
    Add,
    /// The sums continue from `c` (one FMA chain through the blocks, as one unsplit sum).
    Continue,
    /// `c = alpha[r]·c + sum` (one rounding): an output row rescaled as its softmax max grows.
    Rescale(&'a [f32]),
}

/// One tile: `c[r·ldc + j] (+)= Σ_p A[r, p] · b[p·NR + j]` for `rows` rows (1 to [`MR`]) and
/// [`NR`] columns. The block's products are summed from zero and the sum added to `c` once
/// (`accumulate`), so a reduction split into blocks is a blocked sum. Panics where the CPU lacks
/// AVX2 + FMA (callers check [`available`]) or an operand is too short.
#[allow(clippy::too_many_arguments)]
pub(crate) fn tile(
    rows: usize,
    a: (&[f32], ALayout),
    kc: usize,
    b: &[f32],
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    let write = if accumulate { Write::Add } else { Write::Store };
    attention_tile(rows, a, kc, (b, NR), (c, ldc), write, None);
}

/// [`tile`] down a column of micro-panels: the `rows` rows of `A` in micro-panels of [`MR`]
/// rows (the last one shorter), micro-panel `i` starting at `a[i·step ..]` (laid out as
/// `layout` says), each against the same `B` panel into `c` rows `i·MR ..`. One call instead of
/// one per tile: the checks and dispatch are paid once per panel.
pub(crate) fn tile_column(
    rows: usize,
    (a, layout, step): (&[f32], ALayout, usize),
    kc: usize,
    b: &[f32],
    (c, ldc): (&mut [f32], usize),
    accumulate: bool,
) {
    let panels = rows.div_ceil(MR);
    if panels == 0 {
        return;
    }
    let last_rows = rows - (panels - 1) * MR;
    let (lda, il) = match layout {
        ALayout::Rows(lda) => (lda, false),
        ALayout::Interleaved => (MR, true),
    };
    let last_extent = if il { kc * MR } else { (last_rows - 1) * lda + kc };
    assert!(kc > 0 && (il || (lda >= kc && step >= MR * lda)) && (!il || step >= kc * MR));
    assert!(a.len() >= (panels - 1) * step + last_extent && b.len() >= kc * NR);
    assert!(ldc >= NR && c.len() >= (rows - 1) * ldc + NR);
    assert!(available(), "the AVX2 tile on a CPU without AVX2 and FMA");
    #[cfg(target_arch = "x86_64")]
    {
        let (a, b, c) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
        let rescale = accumulate.then_some(std::ptr::null());
        // SAFETY: AVX2 and FMA are present (asserted); the asserts bound every access.
        unsafe {
            if il {
                x86::column::<true>((a, step), lda, b, kc, (c, ldc), (panels, last_rows), rescale)
            } else {
                x86::column::<false>((a, step), lda, b, kc, (c, ldc), (panels, last_rows), rescale)
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (lda, il, accumulate, last_rows);
}

/// The attention kernel's score and output tiles on AVX2 CPUs: as [`tile`], with `B` rows `ldb`
/// apart, the sums written as `write` says, and with `max = (lanes, keys)` each written row also
/// folded into its 16 running maxima `lanes[r·16 ..]` over its first `keys` columns (a NaN sum
/// keeps the running value, as the row kernels' max does).
pub(crate) fn attention_tile(
    rows: usize,
    (a, layout): (&[f32], ALayout),
    kc: usize,
    (b, ldb): (&[f32], usize),
    (c, ldc): (&mut [f32], usize),
    write: Write,
    max: Option<(&mut [f32], usize)>,
) {
    let (lda, il) = match layout {
        ALayout::Rows(lda) => (lda, false),
        ALayout::Interleaved => (MR, true),
    };
    assert!((1..=MR).contains(&rows) && kc > 0);
    let a_ok = if il {
        a.len() >= kc * MR
    } else {
        lda >= kc && a.len() >= (rows - 1) * lda + kc
    };
    assert!(a_ok && ldb >= NR && b.len() >= (kc - 1) * ldb + NR);
    assert!(ldc >= NR && c.len() >= (rows - 1) * ldc + NR);
    assert!(match write {
        Write::Rescale(alpha) => alpha.len() >= rows,
        _ => true,
    });
    assert!(max
        .as_ref()
        .is_none_or(|(l, keys)| l.len() >= rows * 16 && (1..=NR).contains(keys)));
    assert!(available(), "the AVX2 tile on a CPU without AVX2 and FMA");
    #[cfg(target_arch = "x86_64")]
    {
        let (a, b, c) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
        let out = x86::Out {
            c,
            ldc,
            rescale: match write {
                Write::Store | Write::Continue => None,
                Write::Add => Some(std::ptr::null()),
                Write::Rescale(alpha) => Some(alpha.as_ptr()),
            },
            chain: matches!(write, Write::Continue),
            max: max.map(|(l, keys)| (l.as_mut_ptr(), keys)),
        };
        // SAFETY: AVX2 and FMA are present (asserted); the asserts bound every access.
        // `B` rows a panel width apart get a constant stride.
        unsafe {
            match (il, ldb == NR) {
                (true, true) => x86::by_rows::<true, true>(rows, a, lda, (b, ldb), kc, out),
                (true, false) => x86::by_rows::<true, false>(rows, a, lda, (b, ldb), kc, out),
                (false, true) => x86::by_rows::<false, true>(rows, a, lda, (b, ldb), kc, out),
                (false, false) => x86::by_rows::<false, false>(rows, a, lda, (b, ldb), kc, out),
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (lda, il, write, max);
}

/// `K` of one batch·head, `(Lk, D)` row-major, into [`NR`]-key panels `(D, NR)`: `dst` holds
/// `⌈Lk/NR⌉·D·NR` values, keys past `Lk` zero. Copied in 16 × 16 blocks.
pub(crate) fn pack_keys(k: &[f32], lk: usize, d: usize, dst: &mut [f32]) {
    assert!(k.len() >= lk * d && dst.len() == lk.div_ceil(NR) * d * NR);
    for (jp, panel) in dst.chunks_exact_mut(d * NR).enumerate() {
        let keys = NR.min(lk - jp * NR);
        let rows = &k[jp * NR * d..][..keys * d];
        for p0 in (0..d).step_by(16) {
            let pn = 16.min(d - p0);
            for (i, row) in rows.chunks_exact(d).enumerate() {
                for (p, &x) in row[p0..p0 + pn].iter().enumerate() {
                    panel[(p0 + p) * NR + i] = x;
                }
            }
            if keys < NR {
                for p in p0..p0 + pn {
                    panel[p * NR + keys..(p + 1) * NR].fill(0.0);
                }
            }
        }
    }
}

/// `V` of one batch·head, `(Lk, Dv)` row-major, into [`NR`]-channel panels `(Lk, NR)` from panel
/// `first` on: `dst` holds whole panels (`Lk·NR` values each), channels past `Dv` zero.
pub(crate) fn pack_values(v: &[f32], lk: usize, dv: usize, first: usize, dst: &mut [f32]) {
    let panels = dst.len() / (lk * NR);
    assert!(v.len() >= lk * dv && dst.len() == panels * lk * NR && first + panels <= dv.div_ceil(NR));
    for (cp, panel) in dst.chunks_exact_mut(lk * NR).enumerate() {
        let c0 = (first + cp) * NR;
        let w = NR.min(dv - c0);
        for (j, out) in panel.chunks_exact_mut(NR).enumerate() {
            out[..w].copy_from_slice(&v[j * dv + c0..j * dv + c0 + w]);
            out[w..].fill(0.0);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Where a tile's sums go: `c`, rows `ldc` apart; `rescale` `None`: stored; `Some(null)`:
    /// added to `c`; `Some(alpha)`: `c = alpha[r]·c + sum`; `chain`: the sums start from `c`;
    /// `max`: running row maxima.
    pub(super) struct Out {
        pub(super) c: *mut f32,
        pub(super) ldc: usize,
        pub(super) rescale: Option<*const f32>,
        pub(super) chain: bool,
        pub(super) max: Option<(*mut f32, usize)>,
    }

    /// Full tiles down a column of micro-panels, then the last (`last` rows).
    ///
    /// # Safety
    ///
    /// The CPU has AVX2 and FMA, and every pointer is valid for the reads and writes the tile
    /// makes: the bounds its safe wrapper asserts.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn column<const IL: bool>(
        (a, step): (*const f32, usize),
        lda: usize,
        b: *const f32,
        kc: usize,
        (c, ldc): (*mut f32, usize),
        (panels, last): (usize, usize),
        rescale: Option<*const f32>,
    ) {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            for i in 0..panels {
                let out = Out {
                    c: c.add(i * super::MR * ldc),
                    ldc,
                    rescale,
                    chain: false,
                    max: None,
                };
                let a = a.add(i * step);
                if i + 1 < panels {
                    tile::<6, IL, true>(a, lda, (b, 16), kc, out);
                } else {
                    by_rows::<IL, true>(last, a, lda, (b, 16), kc, out);
                }
            }
        }
    }

    /// The tile of height `rows` (1 to 6).
    ///
    /// # Safety
    ///
    /// The CPU has AVX2 and FMA, and every pointer is valid for the reads and writes the tile
    /// makes: the bounds its safe wrapper asserts.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn by_rows<const IL: bool, const PANEL: bool>(
        rows: usize,
        a: *const f32,
        lda: usize,
        b: (*const f32, usize),
        kc: usize,
        out: Out,
    ) {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            match rows {
                1 => tile::<1, IL, PANEL>(a, lda, b, kc, out),
                2 => tile::<2, IL, PANEL>(a, lda, b, kc, out),
                3 => tile::<3, IL, PANEL>(a, lda, b, kc, out),
                4 => tile::<4, IL, PANEL>(a, lda, b, kc, out),
                5 => tile::<5, IL, PANEL>(a, lda, b, kc, out),
                _ => tile::<6, IL, PANEL>(a, lda, b, kc, out),
            }
        }
    }

    /// `R × 16` tile: two 8-lane accumulators per row, one broadcast `A` value per row and step;
    /// `A[r, p]` at `a[p·MR + r]` when interleaved, else `a[r·lda + p]`; `B` rows 16 apart when
    /// `PANEL`, else `ldb`.
    ///
    /// # Safety
    ///
    /// The CPU has AVX2 and FMA, and every pointer is valid for the reads and writes the tile
    /// makes: the bounds its safe wrapper asserts.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile<const R: usize, const IL: bool, const PANEL: bool>(
        a: *const f32,
        lda: usize,
        (b, ldb): (*const f32, usize),
        kc: usize,
        out: Out,
    ) {
        let ldb = if PANEL { 16 } else { ldb };
        // SAFETY: every access is within the bounds the safe wrapper asserted.
        unsafe {
            let mut acc = [[_mm256_setzero_ps(); 2]; R];
            if out.chain {
                for (r, acc) in acc.iter_mut().enumerate() {
                    acc[0] = _mm256_loadu_ps(out.c.add(r * out.ldc));
                    acc[1] = _mm256_loadu_ps(out.c.add(r * out.ldc + 8));
                }
            }
            // One reduction step: `B` row `p` (two vectors) times each row's broadcast `A` value.
            let step = |acc: &mut [[__m256; 2]; R], p: usize| {
                let b0 = _mm256_loadu_ps(b.add(p * ldb));
                let b1 = _mm256_loadu_ps(b.add(p * ldb + 8));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let at = if IL { p * super::MR + r } else { r * lda + p };
                    let x = _mm256_broadcast_ss(&*a.add(at));
                    acc[0] = _mm256_fmadd_ps(x, b0, acc[0]);
                    acc[1] = _mm256_fmadd_ps(x, b1, acc[1]);
                }
            };
            // Four steps per loop trip: less loop and address overhead between the FMAs.
            let mut p = 0;
            while p + 4 <= kc {
                step(&mut acc, p);
                step(&mut acc, p + 1);
                step(&mut acc, p + 2);
                step(&mut acc, p + 3);
                p += 4;
            }
            while p < kc {
                step(&mut acc, p);
                p += 1;
            }
            // The block's sum added to the running one (one rounding per block), not a chain
            // continued from it: blocked accumulation.
            let Out {
                c, ldc, rescale, max, ..
            } = out;
            for (r, acc) in acc.iter().enumerate() {
                let (mut s0, mut s1) = (acc[0], acc[1]);
                let at = c.add(r * ldc);
                match rescale {
                    None => {}
                    Some(alpha) if alpha.is_null() => {
                        s0 = _mm256_add_ps(_mm256_loadu_ps(at), s0);
                        s1 = _mm256_add_ps(_mm256_loadu_ps(at.add(8)), s1);
                    }
                    Some(alpha) => {
                        let f = _mm256_set1_ps(*alpha.add(r));
                        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(at), f, s0);
                        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(at.add(8)), f, s1);
                    }
                }
                _mm256_storeu_ps(at, s0);
                _mm256_storeu_ps(at.add(8), s1);
                if let Some((lanes, keys)) = max {
                    fold_max(lanes.add(r * 16), keys, s0, s1);
                }
            }
        }
    }

    /// `lanes[0..16] = max(sums, lanes)` over the first `keys` of the 16 columns (a NaN sum keeps
    /// the running value: `max_ps` returns its second operand when either is NaN).
    ///
    /// # Safety
    ///
    /// The CPU has AVX2 and FMA, and every pointer is valid for the reads and writes the tile
    /// makes: the bounds its safe wrapper asserts.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn fold_max(lanes: *mut f32, keys: usize, s0: __m256, s1: __m256) {
        // SAFETY: the caller's bounds (16 lanes).
        unsafe {
            let k = _mm256_set1_epi32(keys as i32);
            let m0 = _mm256_castsi256_ps(_mm256_cmpgt_epi32(k, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
            let m1 = _mm256_castsi256_ps(_mm256_cmpgt_epi32(k, _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15)));
            let (r0, r1) = (_mm256_loadu_ps(lanes), _mm256_loadu_ps(lanes.add(8)));
            let n0 = _mm256_blendv_ps(r0, _mm256_max_ps(s0, r0), m0);
            let n1 = _mm256_blendv_ps(r1, _mm256_max_ps(s1, r1), m1);
            _mm256_storeu_ps(lanes, n0);
            _mm256_storeu_ps(lanes.add(8), n1);
        }
    }
}

#[cfg(test)]
mod tile_speed {
    /// The 6-row tile alone with its operands in L1, in GFLOP/s (a probe, not a check: run with
    /// `cargo test --release -p unet-attention tile_in_l1 -- --ignored --nocapture` and compare
    /// with `bench_sdpa fma-peak`; 89 – 92 GFLOP/s against a 99 GFLOP/s peak on Zen 3).
    #[test]
    #[ignore]
    fn tile_in_l1() {
        if !super::available() {
            return;
        }
        let kc = 168;
        let a = vec![0.5f32; 6 * kc];
        let b = vec![0.25f32; kc * 16];
        let mut c = vec![0f32; 6 * 16];
        let n = 200_000;
        for _ in 0..3 {
            let t = std::time::Instant::now();
            for i in 0..n {
                super::tile(6, (&a, super::ALayout::Rows(kc)), kc, &b, &mut c, 16, i > 0);
            }
            let s = t.elapsed().as_secs_f64();
            println!(
                "tile 6x16 kc {kc}: {:.1} GFLOP/s",
                (n * 6 * 16 * kc * 2) as f64 / s / 1e9
            );
        }
    }
}
