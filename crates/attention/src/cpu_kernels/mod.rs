//! The kernels layer: CPU kernels on the bottom layer (`crate::cpu`: instruction set, caches,
//! scratch, microkernels), used by the tensor ops, the attention core ([`crate::sdpa`]) and the
//! layers above, never using them.
//!
//! * The attention core's tiled online-softmax kernel (`attention`).
//! * The layer operations around the attention core that Candle 0.11 runs slowly, each a
//!   drop-in for the tensor-op chain it replaces (same results up to f32 summation order),
//!   taken only on CPU tensors of the dtypes named, with the generic Candle ops everywhere else:
//!   * the linear layers and convolutions of every block: weights packed once when the block is
//!     built ([`PackedLinear`], [`PackedConv`]), one cache-blocked GEMM per call with the bias,
//!     time embedding, residual and divisor applied as the output is written (`gemm`, on the
//!     register tiles of `crate::cpu`'s microkernels; `im2col`: a convolution's input packed a
//!     block at a time; `winograd`: large 3×3 convolutions as 16 GEMMs of Winograd's
//!     F(2×2, 3×3)), chosen per call by [`layer_path`];
//!   * GroupNorm (and GroupNorm + SiLU in one pass: `group_norm`, PyTorch's two CPU kernels) and
//!     LayerNorm (`layer_norm`) on PyTorch's moments (`moments`), RMSNorm's channel sum of
//!     squares, GEGLU, below.
//!
//! Measured on a `(1, 512, 64, 64)` f32 input, 2 threads (AMD Zen 5): Candle's `GroupNorm`
//! 9.5 ms (every step a full pass with a fresh 8 MiB allocation), [`group_norm`] 0.40 ms; a
//! transposed copy `(B, C, N)` → `(B, N, C)` 3.4 ms (Candle copies a transposed view one element
//! at a time through a strided index), `crate::cpu::contiguous` 0.63 ms; the sum of squares over the
//! channels 5.8 ms, [`channel_sum_squares`] 0.16 ms.

use candle_core::{DType, Device, Result, Tensor};
use rayon::prelude::*;

use crate::cpu::{contiguous, cpu_slice};

pub(crate) mod attention;
mod dense;
mod gemm;
mod group_norm;
mod im2col;
mod layer_norm;
pub(crate) mod moments;
mod packed;
mod rms_norm;
mod winograd;

pub use crate::cpu::workers::join_rayon_pool;
pub use dense::{
    bf16_layer_kernel, layer_kernel_isa, layer_path, set_layer_path, ConvExtras, LayerPath, PackedConv, PackedLinear,
};
pub use group_norm::{group_norm, group_norm_act, group_norm_as, MemoryFormat, NormForm};
pub use layer_norm::layer_norm;
pub use rms_norm::rms_norm_act;

/// The swish that follows a norm, as the PyTorch code writes it (each step an f32 rounding).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Swish {
    /// `F.silu(y)` / `nn.SiLU`: `y / (1 + exp(−y))`.
    Silu,
    /// ldm's `nonlinearity`, `y * torch.sigmoid(y)`: `y · (1 / (1 + exp(−y)))`.
    TimesSigmoid,
}

/// Whether the row kernels below are compiled 16 lanes wide: where the AVX-512 tiles run (the
/// same bits as 8 lanes wide, every step the same operation; on Intel's two 512-bit FMA ports
/// twice the rate).
#[cfg(target_arch = "x86_64")]
fn rows_512() -> bool {
    crate::cpu::microkernel::avx512::available()
}

/// `dst = scale · xs + shift`, fused (one rounding) when `fused` (callers pass
/// [`fma_reported`]).
fn scale_shift(fused: bool, xs: &[f32], scale: f32, shift: f32, dst: &mut [f32]) {
    #[inline(always)]
    fn body(xs: &[f32], scale: f32, shift: f32, dst: &mut [f32]) {
        for (d, &v) in dst.iter_mut().zip(xs) {
            *d = scale.mul_add(v, shift);
        }
    }
    #[cfg(target_arch = "x86_64")]
    if fused {
        #[target_feature(enable = "avx512f,avx2,fma")]
        fn go512(xs: &[f32], scale: f32, shift: f32, dst: &mut [f32]) {
            body(xs, scale, shift, dst)
        }
        #[target_feature(enable = "avx2,fma")]
        fn go(xs: &[f32], scale: f32, shift: f32, dst: &mut [f32]) {
            body(xs, scale, shift, dst)
        }
        if rows_512() {
            // SAFETY: AVX-512F detected (with AVX2 and FMA).
            unsafe { go512(xs, scale, shift, dst) };
        } else {
            // SAFETY: `fused` is only true where AVX2 and FMA were detected.
            unsafe { go(xs, scale, shift, dst) };
        }
        return;
    }
    if fused {
        return body(xs, scale, shift, dst);
    }
    for (d, &v) in dst.iter_mut().zip(xs) {
        *d = scale * v + shift;
    }
}

/// `act` of every value of `ys`, in place (the attention kernel's vectorised `exp`, within 1 ulp).
fn swish_in_place(fused: bool, act: Swish, ys: &mut [f32]) {
    use crate::cpu::math::exp;
    #[inline(always)]
    fn body<const FUSED: bool>(act: Swish, ys: &mut [f32]) {
        match act {
            Swish::Silu => ys.iter_mut().for_each(|y| *y /= 1.0 + exp::<FUSED>(-*y)),
            Swish::TimesSigmoid => ys.iter_mut().for_each(|y| *y *= 1.0 / (1.0 + exp::<FUSED>(-*y))),
        }
    }
    #[cfg(target_arch = "x86_64")]
    if fused {
        #[target_feature(enable = "avx512f,avx2,fma")]
        fn go512(act: Swish, ys: &mut [f32]) {
            body::<true>(act, ys)
        }
        #[target_feature(enable = "avx2,fma")]
        fn go(act: Swish, ys: &mut [f32]) {
            body::<true>(act, ys)
        }
        if rows_512() {
            // SAFETY: AVX-512F detected (with AVX2 and FMA).
            unsafe { go512(act, ys) };
        } else {
            // SAFETY: `fused` is only true where AVX2 and FMA were detected.
            unsafe { go(act, ys) };
        }
        return;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = fused;
    body::<false>(act, ys)
}

/// GEGLU's `hidden · gelu(gate)` (exact erf GELU) of an f32 CPU tensor `(..., 2·n)` whose last
/// dim is `[hidden | gate]`, in one parallel vectorised pass: each element as Candle's
/// `gelu_erf` then `mul` compute it (`(erf(g / √2) + 1) · 0.5 · g`, then `· hidden`), with the
/// kernel family's f32 `erf` (within 2.4 ulp, where Candle's scalar `erff` is within 1: the
/// GELU within a few ulp of Candle's), without their two strided passes and intermediate tensor.
/// `None` where it does not apply (not CPU, not f32, odd last dim, [`LayerPath::Candle`]).
///
/// In f16 / bf16 each step rounds as PyTorch's `hidden * F.gelu(gate)` does: the GELU computed in
/// f32 and rounded to the dtype, then the product in f32, rounded.
pub fn geglu(h: &Tensor) -> Result<Option<Tensor>> {
    let n2 = h.dims().last().copied().unwrap_or(0);
    let dtype_ok = matches!(h.dtype(), DType::F32 | DType::F16 | DType::BF16);
    let applies = h.device().is_cpu() && dtype_ok && n2 % 2 == 0 && h.elem_count() > 0;
    if !applies || layer_path()? == LayerPath::Candle {
        return Ok(None);
    }
    let n = n2 / 2;
    let h = h.contiguous()?;
    let mut dims = h.dims().to_vec();
    *dims.last_mut().expect("rank ≥ 1") = n;
    match h.dtype() {
        DType::F16 => return Ok(Some(geglu_half::<half::f16>(&h, n, dims)?)),
        DType::BF16 => return Ok(Some(geglu_half::<half::bf16>(&h, n, dims)?)),
        _ => {}
    }
    let (storage, layout) = h.storage_and_layout();
    let src = &cpu_slice::<f32>(&storage, layout).expect("a CPU tensor")[..h.elem_count()];
    let mut out = vec![0f32; h.elem_count() / 2];
    out.par_chunks_mut(n).zip(src.par_chunks(n2)).for_each(|(dst, row)| {
        let (hidden, gate) = row.split_at(n);
        geglu_row(dst, hidden, gate);
    });
    drop(storage);
    Ok(Some(Tensor::from_vec(out, dims, &Device::Cpu)?))
}

/// [`geglu`] of a contiguous f16 / bf16 tensor: per run of a row, the halves widened, the GELU
/// rounded to `T` and widened again, the product rounded.
fn geglu_half<T: crate::cpu::Half + candle_core::WithDType>(h: &Tensor, n: usize, dims: Vec<usize>) -> Result<Tensor> {
    const RUN: usize = 256;
    let (storage, layout) = h.storage_and_layout();
    let src = &cpu_slice::<T>(&storage, layout).expect("a CPU tensor")[..h.elem_count()];
    let mut out = vec![T::ZERO; h.elem_count() / 2];
    out.par_chunks_mut(n).zip(src.par_chunks(2 * n)).for_each(|(dst, row)| {
        let (hidden, gate) = row.split_at(n);
        let (mut x, mut g, mut y) = ([0f32; RUN], [0f32; RUN], [0f32; RUN]);
        let mut gelu_t = [T::ZERO; RUN];
        for ((d, hs), gs) in dst.chunks_mut(RUN).zip(hidden.chunks(RUN)).zip(gate.chunks(RUN)) {
            let len = d.len();
            T::widen(hs, &mut x[..len]);
            T::widen(gs, &mut g[..len]);
            gelu_row(&mut y[..len], &g[..len]);
            T::narrow(&y[..len], &mut gelu_t[..len]);
            T::widen(&gelu_t[..len], &mut g[..len]);
            x[..len].iter_mut().zip(&g[..len]).for_each(|(x, &g)| *x *= g);
            T::narrow(&x[..len], d);
        }
    });
    drop(storage);
    Tensor::from_vec(out, dims, &Device::Cpu)
}

/// `dst[i] = gelu(gate[i])` (the GELU of [`geglu_row`], compiled as it is).
fn gelu_row(dst: &mut [f32], gate: &[f32]) {
    #[inline(always)]
    fn body(dst: &mut [f32], gate: &[f32]) {
        for (d, &g) in dst.iter_mut().zip(gate) {
            *d = (crate::cpu::math::erf(g * std::f32::consts::FRAC_1_SQRT_2) + 1.0) * 0.5 * g;
        }
    }
    #[cfg(target_arch = "x86_64")]
    if rows_512() {
        #[target_feature(enable = "avx512f,avx2,fma")]
        fn avx512(dst: &mut [f32], gate: &[f32]) {
            body(dst, gate)
        }
        // SAFETY: AVX-512F detected (with AVX2 and FMA).
        unsafe { avx512(dst, gate) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::microkernel::avx2::available() {
        #[target_feature(enable = "avx2,fma")]
        fn avx2(dst: &mut [f32], gate: &[f32]) {
            body(dst, gate)
        }
        // SAFETY: AVX2 and FMA detected.
        unsafe { avx2(dst, gate) };
        return;
    }
    body(dst, gate)
}

/// `dst[i] = hidden[i] · gelu(gate[i])`, compiled for AVX-512 or AVX2 where the CPU has it (the
/// same bits either way: no step is fused).
pub(crate) fn geglu_row(dst: &mut [f32], hidden: &[f32], gate: &[f32]) {
    #[inline(always)]
    fn body(dst: &mut [f32], hidden: &[f32], gate: &[f32]) {
        for ((d, &x), &g) in dst.iter_mut().zip(hidden).zip(gate) {
            let gelu = (crate::cpu::math::erf(g * std::f32::consts::FRAC_1_SQRT_2) + 1.0) * 0.5 * g;
            *d = x * gelu;
        }
    }
    #[cfg(target_arch = "x86_64")]
    if rows_512() {
        #[target_feature(enable = "avx512f,avx2,fma")]
        fn avx512(dst: &mut [f32], hidden: &[f32], gate: &[f32]) {
            body(dst, hidden, gate)
        }
        // SAFETY: AVX-512F detected (with AVX2 and FMA).
        unsafe { avx512(dst, hidden, gate) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if crate::cpu::microkernel::avx2::available() {
        #[target_feature(enable = "avx2,fma")]
        fn avx2(dst: &mut [f32], hidden: &[f32], gate: &[f32]) {
            body(dst, hidden, gate)
        }
        // SAFETY: AVX2 and FMA detected.
        unsafe { avx2(dst, hidden, gate) };
        return;
    }
    body(dst, hidden, gate)
}

/// The layer GEMM's register tile alone, for `bench_sdpa fma-peak`: `calls` calls of this CPU's
/// tile ([`layer_kernel_isa`]) on operands that stay in L1 (a `kc`-deep `B` panel, a `C` tile the
/// sums are added to, and `A` as `layout` says: `"rows"` `kc` apart, `"interleaved"` one
/// micro-panel, `"rows3"` rows read by the AVX-512 candidate loop with three base registers),
/// on this thread. Returns the floating-point operations done (`None` without register tiles,
/// for an unknown layout, or `"rows3"` without AVX-512), so that the caller's clock gives the
/// tile's own rate against the FMA peak: where it falls short, the loop is what limits the layers
/// on that CPU, not how the GEMM feeds it.
#[doc(hidden)]
pub fn tile_flops(layout: &str, kc: usize, calls: usize) -> Option<f64> {
    use crate::cpu::aligned::Aligned;
    use crate::cpu::isa::Isa;
    use crate::cpu::microkernel::avx512::{self, RowsTile};
    use crate::cpu::microkernel::{tile, ALayout};
    let isa = Isa::with_tiles()?;
    let (mr, nr) = (isa.mr(), isa.nr());
    let (mut a, mut b, mut c) = (
        Aligned::zeroed(mr * kc),
        Aligned::zeroed(kc * nr),
        Aligned::zeroed(mr * nr),
    );
    a.fill(0.5);
    b.fill(0.25);
    match layout {
        "rows" | "interleaved" => {
            let layout = if layout == "rows" {
                ALayout::Rows(kc)
            } else {
                ALayout::Interleaved
            };
            for _ in 0..calls {
                if isa == Isa::Avx512 {
                    // The default loop whatever UNET_ATTENTION_GEMM_TILE says: "rows3" is the other.
                    avx512::gemm_tile_using(RowsTile::Plain, mr, (&a, layout), &b, kc, &mut c, nr, true);
                } else {
                    tile(isa, mr, (&a, layout), kc, &b, &mut c, nr, true);
                }
            }
        }
        "rows3" if isa == Isa::Avx512 => {
            for _ in 0..calls {
                avx512::gemm_tile_using(
                    RowsTile::RowBases,
                    mr,
                    (&a, ALayout::Rows(kc)),
                    &b,
                    kc,
                    &mut c,
                    nr,
                    true,
                );
            }
        }
        _ => return None,
    }
    std::hint::black_box(&c[..]);
    Some(2.0 * (mr * nr * kc) as f64 * calls as f64)
}

/// `Σ_c x[b, c, ...]²` of an f32 CPU tensor `(B, C, ...)`, keeping the channel dim (size 1): the
/// channels summed in order in f32, each position on its own (PyTorch's reduction over a
/// non-innermost dim). `None` where it does not apply (not CPU, not f32, rank below 2).
pub fn channel_sum_squares(x: &Tensor) -> Result<Option<Tensor>> {
    if !x.device().is_cpu() || x.dtype() != DType::F32 || x.rank() < 2 {
        return Ok(None);
    }
    let x = contiguous(x)?;
    let (b, c) = (x.dim(0)?, x.dim(1)?);
    let spatial = x.elem_count() / (b * c).max(1);
    let (storage, layout) = x.storage_and_layout();
    let src = &cpu_slice::<f32>(&storage, layout).expect("a CPU tensor")[..x.elem_count()];
    let mut out = vec![0f32; b * spatial];
    if spatial > 0 && c > 0 {
        out.par_chunks_mut(spatial)
            .zip(src.par_chunks(c * spatial))
            .for_each(|(acc, xs)| {
                for row in xs.chunks_exact(spatial) {
                    for (a, &v) in acc.iter_mut().zip(row) {
                        *a += v * v;
                    }
                }
            });
    }
    drop(storage);
    let mut dims = x.dims().to_vec();
    dims[1] = 1;
    Ok(Some(Tensor::from_vec(out, dims, &Device::Cpu)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The benchmark's candidate tile with three row bases gives the GEMM tile's bits (rows read
    /// in place, `lda` past `kc`, a fresh and an accumulating call), and `tile_flops` counts every
    /// layout it knows and refuses the others.
    #[test]
    fn row_bases_tile_gives_the_gemm_tiles_bits() {
        use crate::cpu::microkernel::avx512::{self, RowsTile};
        use crate::cpu::microkernel::ALayout;
        if !avx512::available() {
            assert!(tile_flops("rows3", 8, 1).is_none());
            return;
        }
        let (mr, nr, kc, lda, ldc) = (avx512::MR, avx512::NR, 37, 45, 40);
        let values = |n: usize, seed: u32| -> Vec<f32> {
            (0..n)
                .map(|i| ((i as u32).wrapping_mul(2654435761) ^ seed) % 1000)
                .map(|v| v as f32 / 250.0 - 2.0)
                .collect()
        };
        let (a, b) = (values((mr - 1) * lda + kc, 1), values(kc * nr, 2));
        let start = values((mr - 1) * ldc + nr, 3);
        for accumulate in [false, true] {
            let (mut want, mut got) = (start.clone(), start.clone());
            let rows = (&a[..], ALayout::Rows(lda));
            avx512::gemm_tile_using(RowsTile::Plain, mr, rows, &b, kc, &mut want, ldc, accumulate);
            avx512::gemm_tile_using(RowsTile::RowBases, mr, rows, &b, kc, &mut got, ldc, accumulate);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "accumulate {accumulate}");
        }
        for layout in ["rows", "interleaved", "rows3"] {
            assert!(tile_flops(layout, 16, 2).is_some_and(|f| f > 0.0), "{layout}");
        }
        assert!(tile_flops("columns", 16, 2).is_none());
    }
    /// The fused GEGLU is `hidden · gelu(gate)` to within its `erf`'s error (2.4 ulp) and the
    /// rounding of a few f32 steps, against an f64 GELU, and no further from it than Candle's
    /// `hidden * gelu_erf(gate)` is plus that.
    #[test]
    fn geglu_matches_an_f64_gelu() {
        let h = (Tensor::randn(0f32, 2.0, (3, 5, 2 * 37), &Device::Cpu).unwrap() - 0.5).unwrap();
        let got = super::geglu(&h).unwrap().unwrap();
        let (hidden, gate) = (h.narrow(2, 0, 37).unwrap(), h.narrow(2, 37, 37).unwrap());
        let candle = (&hidden * gate.gelu_erf().unwrap()).unwrap();
        let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let (got, candle, hidden, gate) = (flat(&got), flat(&candle), flat(&hidden), flat(&gate));
        assert_eq!(got.len(), 3 * 5 * 37);
        for i in 0..got.len() {
            let (x, g) = (hidden[i] as f64, gate[i] as f64);
            let want = x * 0.5 * g * (1.0 + libm::erf(g / std::f64::consts::SQRT_2));
            let slack = 2.5e-7 * x.abs() * (g.abs() + 1.0);
            let (ours, theirs) = ((got[i] as f64 - want).abs(), (candle[i] as f64 - want).abs());
            assert!(
                ours <= slack && ours <= theirs + slack,
                "{x} · gelu({g}): {} vs {want}",
                got[i]
            );
        }
        assert!(super::geglu(&h.narrow(2, 0, 3).unwrap()).unwrap().is_none());
    }

    fn max_abs(t: Tensor) -> f32 {
        t.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap()
    }

    /// Every kernel against the Candle ops it replaces, on shapes with remainders.
    #[test]
    fn kernels_match_the_candle_ops() {
        let dev = Device::Cpu;
        for (b, c, h, w) in [(2, 64, 5, 7), (1, 96, 33, 35), (3, 8, 4, 1)] {
            let x = Tensor::randn(0f32, 1., (b, c, h, w), &dev).unwrap();
            let x = (x + 0.5).unwrap();
            // Transposes of every float dtype, and of a rank-3 token view.
            let tokens = x.reshape((b, c, h * w)).unwrap().transpose(1, 2).unwrap();
            for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64] {
                let t = tokens.to_dtype(dtype).unwrap();
                let want = t
                    .contiguous()
                    .unwrap()
                    .to_dtype(DType::F64)
                    .unwrap()
                    .to_vec3::<f64>()
                    .unwrap();
                let got = contiguous(&t).unwrap();
                assert!(got.is_contiguous());
                assert_eq!(got.to_dtype(DType::F64).unwrap().to_vec3::<f64>().unwrap(), want);
            }
            let back = contiguous(&x.transpose(2, 3).unwrap()).unwrap();
            let want = x.transpose(2, 3).unwrap().contiguous().unwrap();
            let diff = max_abs((back - want).unwrap());
            assert_eq!(diff, 0.0);

            // GroupNorm against candle_nn's in f64.
            for groups in [1, 4, 8] {
                let wt = Tensor::randn(1f32, 0.2, c, &dev).unwrap();
                let bs = Tensor::randn(0f32, 0.2, c, &dev).unwrap();
                let f64 = |t: &Tensor| t.to_dtype(DType::F64).unwrap();
                let norm = candle_nn::GroupNorm::new(f64(&wt), f64(&bs), c, groups, 1e-6).unwrap();
                let want = candle_core::Module::forward(&norm, &f64(&x))
                    .unwrap()
                    .to_dtype(DType::F32)
                    .unwrap();
                let got = group_norm(&x, &wt, &bs, groups, 1e-6).unwrap().unwrap();
                let diff = max_abs((got - want).unwrap());
                assert!(diff < 1e-5, "group norm {:?} groups {groups}: {diff}", (b, c, h, w));
            }

            // Sum of squares over channels.
            let want = x.sqr().unwrap().sum_keepdim(1).unwrap();
            let got = channel_sum_squares(&x).unwrap().unwrap();
            assert_eq!(got.dims(), want.dims());
            let rel = max_abs(((got - &want).unwrap() / &want).unwrap());
            assert!(rel < 1e-5, "channel sum {:?}: {rel}", (b, c, h, w));
        }
        // Not applicable: half precision input.
        let x = Tensor::zeros((1, 4, 2, 2), DType::F16, &dev).unwrap();
        assert!(channel_sum_squares(&x).unwrap().is_none());
    }
}
