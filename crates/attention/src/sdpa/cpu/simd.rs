//! Row kernels, written once as plain loops that auto-vectorise and compiled three times: for
//! AVX-512 and for AVX2+FMA (`#[target_feature]`, chosen at run time with
//! `is_x86_feature_detected!`), and for the baseline target (any architecture).

use super::ScoreScale;

/// Rounding of the unnormalised weights to a half type (as f32 values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Round {
    F16,
    BF16,
}

const LANES: usize = 16;

/// `a · b + c`, one rounding (a fused multiply-add) when `FUSED`, two otherwise.
#[inline(always)]
fn mad<const FUSED: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FUSED {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// Whether the portable row kernels use fused multiply-adds: where the target has them in
/// hardware (elsewhere `mul_add` is a slow library call).
const PORTABLE_FUSED: bool = cfg!(any(target_arch = "aarch64", target_feature = "fma"));

/// `exp(x)` for f32: Cephes' `expf` range reduction (2^n · e^r) and a degree-6 polynomial for
/// e^r (within 1 ulp), as branch-free selects so that it vectorises, with fused multiply-adds
/// when `FUSED`; 0 below -87.3 (where `expf` is subnormal), +inf above 88, NaN for NaN.
#[inline(always)]
pub(crate) fn exp<const FUSED: bool>(x: f32) -> f32 {
    const HI: f32 = 88.0;
    const LO: f32 = -87.33654;
    let xc = if x > HI { HI } else { x };
    let xc = if xc < LO { LO } else { xc };
    // n = round(x · log2 e) by the 1.5 · 2^23 trick (ties to even; |n| < 2^22): the sum's
    // low mantissa bits hold n, so 2^n needs no float-to-int conversion (which does not
    // vectorise).
    let big = mad::<FUSED>(xc, std::f32::consts::LOG2_E, 12582912.0);
    let n = big - 12582912.0;
    let n_int = (big.to_bits() as i32).wrapping_sub(0x4B40_0000);
    let r = mad::<FUSED>(n, 2.121_944_4e-4, mad::<FUSED>(n, -0.693_359_4, xc));
    // e^r = 1 + r·(1 + r·q(r)) on |r| ≤ ln 2 / 2, q of degree 4 fitted (weighted least squares
    // to the relative error, 3e-9) in f64 and rounded to f32: within 0.6 ulp of e^x in f32
    // (0.72 ulp unfused), six multiply-adds.
    let q = mad::<FUSED>(1.381_461_9e-3, r, 8.368_71e-3);
    let q = mad::<FUSED>(q, r, 4.166_839e-2);
    let q = mad::<FUSED>(q, r, 1.666_652_1e-1);
    let q = mad::<FUSED>(q, r, 4.999_999_4e-1);
    let y = mad::<FUSED>(mad::<FUSED>(q, r, 1.0), r, 1.0);
    let pow2 = f32::from_bits((n_int.wrapping_add(127) as u32) << 23);
    let res = y * pow2;
    if x < LO {
        0.0
    } else if x > HI {
        f32::INFINITY
    } else {
        res
    }
}

/// `erf(x)` for f32, within 2.4 ulp of the exact value (measured against f64 `erf` on 300 000
/// points of [-5, 5]), as branch-free selects so that it vectorises: `x · P(x²)` below 1,
/// `1 − e^(−x²) · Q(1/x)` from 1 to 4, ±1 beyond (where f32 `erf` rounds to ±1), NaN for NaN.
/// `P` (degree 6, for `erf(x)/x`) and `Q` (degree 10, for `erfc(x)·e^(x²)`) are least-squares
/// fits in f64 on Chebyshev nodes (relative error 1.4e-9 and 3e-9), rounded to f32; evaluated
/// without fused multiply-adds, so every CPU gives the same bits.
#[inline(always)]
pub(crate) fn erf(x: f32) -> f32 {
    // The constant term is the fit's (one f32 ulp below 2/√π), not the constant itself.
    #[allow(clippy::approx_constant)]
    const P: [f32; 7] = [
        7.882_499_6e-5,
        -8.018_858e-4,
        5.189_312_6e-3,
        -2.685_432_9e-2,
        1.128_359_7e-1,
        -3.761_262_6e-1,
        1.128_379_1,
    ];
    const Q: [f32; 11] = [
        -3.516_658e-2,
        2.458_168_3e-1,
        -7.593_004e-1,
        1.343_049,
        -1.442_154_4,
        8.440_487_4e-1,
        -4.386_929_4e-2,
        -2.929_564_4e-1,
        4.533_323_5e-3,
        5.635_483e-1,
        3.438_05e-5,
    ];
    let horner = |c: &[f32], v: f32| c[1..].iter().fold(c[0], |p, &k| p * v + k);
    let a = x.abs();
    let t = a * a;
    let small = a * horner(&P, t);
    let large = 1.0 - exp::<false>(-t) * horner(&Q, 1.0 / if a > 1.0 { a } else { 1.0 });
    let r = if a >= 4.0 {
        1.0
    } else if a >= 1.0 {
        large
    } else {
        small
    };
    r.copysign(x)
}

/// `x` rounded to the nearest bf16 (ties to even), as f32.
#[inline(always)]
pub(crate) fn round_bf16(x: f32) -> f32 {
    let b = x.to_bits();
    let r = f32::from_bits(b.wrapping_add(0x7FFF + ((b >> 16) & 1)) & 0xFFFF_0000);
    if x.is_nan() {
        x
    } else {
        r
    }
}

/// `x` rounded to the nearest f16 (ties to even; subnormals and overflow to ±inf), as f32.
#[inline(always)]
pub(crate) fn round_f16(x: f32) -> f32 {
    let a = x.abs();
    let b = a.to_bits();
    // Normal f16 range: keep 10 mantissa bits.
    let normal = f32::from_bits(b.wrapping_add(0x0FFF + ((b >> 13) & 1)) & 0xFFFF_E000);
    // Subnormal f16 range (below 2^-14): a multiple of 2^-24, the ulp of 0.75 in f32.
    let sub = (a + 0.75) - 0.75;
    let r = if a < 6.103_515_6e-5 { sub } else { normal };
    let r = if a >= 65520.0 { f32::INFINITY } else { r };
    let r = if x.is_sign_negative() { -r } else { r };
    if x.is_nan() {
        x
    } else {
        r
    }
}

/// `x[0] ∘ x[1] ∘ ..` as a tree of pairs (vector shuffles, not a chain of 16 scalar steps).
#[inline(always)]
fn tree(mut x: [f32; LANES], op: impl Fn(f32, f32) -> f32) -> f32 {
    let mut w = LANES / 2;
    while w > 0 {
        for i in 0..w {
            x[i] = op(x[i], x[i + w]);
        }
        w /= 2;
    }
    x[0]
}

/// The max of 16 lanes (NaN lanes ignored, as in the row kernels).
pub(crate) fn max_of(x: &[f32]) -> f32 {
    let lanes: [f32; LANES] = x.try_into().expect("16 lanes");
    tree(lanes, |a, b| if b > a { b } else { a })
}

#[inline(always)]
fn max_lanes(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for l in 0..LANES {
            acc[l] = if c[l] > acc[l] { c[l] } else { acc[l] };
        }
    }
    for (l, &r) in rest.iter().enumerate() {
        acc[l] = if r > acc[l] { r } else { acc[l] };
    }
    tree(acc, |a, b| if b > a { b } else { a })
}

/// The factor the exp pass applies to the raw scores: `c` for `Mul(c)` with `c > 0` and no
/// mask, whose scaling pass is skipped, 1 otherwise. The weights are the same bits either way:
/// the exp pass computes `s · c − m` with the same two roundings, and for `c > 0` the max of
/// the scaled row is `max(s) · c`.
#[inline(always)]
pub(crate) fn deferred_scale(scale: ScoreScale, masked: bool) -> f32 {
    match scale {
        ScoreScale::Mul(c) if !masked && c > 0.0 && c.is_finite() => c,
        _ => 1.0,
    }
}

/// Scores in place: `s · c` or `s / c`, plus the mask row; returns the row max of the scaled
/// scores. A scale [`deferred_scale`] defers is not applied here (the row is only read).
#[inline(always)]
fn scale_mask_max_body(s: &mut [f32], mask: Option<&[f32]>, scale: ScoreScale) -> f32 {
    let pre = deferred_scale(scale, mask.is_some());
    if pre != 1.0 {
        return max_lanes(s) * pre;
    }
    match (scale, mask) {
        (ScoreScale::Mul(1.0), None) => {}
        (ScoreScale::Mul(c), None) => s.iter_mut().for_each(|x| *x *= c),
        (ScoreScale::Div(c), None) => s.iter_mut().for_each(|x| *x /= c),
        (ScoreScale::Mul(1.0), Some(m)) => s.iter_mut().zip(m).for_each(|(x, m)| *x += m),
        (ScoreScale::Mul(c), Some(m)) => s.iter_mut().zip(m).for_each(|(x, m)| *x = *x * c + m),
        (ScoreScale::Div(c), Some(m)) => s.iter_mut().zip(m).for_each(|(x, m)| *x = *x / c + m),
    }
    max_lanes(s)
}

/// `s ← exp(s · pre − m)` (then rounded to `round`'s type, if any; `pre` is the
/// [`deferred_scale`], 1 when the scores are scaled already: `s · 1` is `s`); returns the sum
/// of the unrounded values.
#[inline(always)]
fn exp_sum_body<const FUSED: bool>(s: &mut [f32], pre: f32, m: f32, round: Option<Round>) -> f32 {
    #[inline(always)]
    fn go(s: &mut [f32], pre: f32, m: f32, exp: impl Fn(f32) -> f32, rnd: impl Fn(f32) -> f32) -> f32 {
        let mut acc = [0f32; LANES];
        let mut chunks = s.chunks_exact_mut(LANES);
        for c in &mut chunks {
            for l in 0..LANES {
                let p = exp(c[l] * pre - m);
                acc[l] += p;
                c[l] = rnd(p);
            }
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            // The tail as one chunk padded with -inf (weights 0), vectorised like the others.
            let mut p = [f32::NEG_INFINITY; LANES];
            p[..rest.len()].copy_from_slice(rest);
            for l in 0..LANES {
                p[l] = exp(p[l] * pre - m);
                acc[l] += p[l];
            }
            for (x, &p) in rest.iter_mut().zip(&p) {
                *x = rnd(p);
            }
        }
        tree(acc, |a, b| a + b)
    }
    // Half precision rounds each weight: there the weights use the exact (libm) `exp` of
    // the reference path, so the rounded weights are the reference's (a last-bit
    // difference of the polynomial would move some by a whole half-precision step).
    match round {
        None => go(s, pre, m, exp::<FUSED>, |p| p),
        Some(Round::F16) => go(s, pre, m, f32::exp, round_f16),
        Some(Round::BF16) => go(s, pre, m, f32::exp, round_bf16),
    }
}

#[inline(always)]
fn scale_body(x: &mut [f32], a: f32) {
    x.iter_mut().for_each(|v| *v *= a);
}

/// The row kernels of one instruction set.
#[derive(Clone, Copy)]
pub(crate) struct Ops {
    pub(crate) scale_mask_max: fn(&mut [f32], Option<&[f32]>, ScoreScale) -> f32,
    pub(crate) exp_sum: fn(&mut [f32], f32, f32, Option<Round>) -> f32,
    pub(crate) scale: fn(&mut [f32], f32),
    pub(crate) name: &'static str,
    /// Whether its `exp` uses fused multiply-adds (kernels that agree here give the same bits).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fused: bool,
}

macro_rules! isa {
    ($name:ident, $feat:literal) => {
        #[cfg(target_arch = "x86_64")]
        mod $name {
            use super::*;
            #[target_feature(enable = $feat)]
            unsafe fn scale_mask_max_tf(s: &mut [f32], m: Option<&[f32]>, c: ScoreScale) -> f32 {
                scale_mask_max_body(s, m, c)
            }
            #[target_feature(enable = $feat)]
            unsafe fn exp_sum_tf(s: &mut [f32], pre: f32, m: f32, r: Option<Round>) -> f32 {
                exp_sum_body::<true>(s, pre, m, r)
            }
            #[target_feature(enable = $feat)]
            unsafe fn scale_tf(x: &mut [f32], a: f32) {
                scale_body(x, a)
            }
            // SAFETY (all three): `ops()` hands these out only after detecting the features.
            fn scale_mask_max(s: &mut [f32], m: Option<&[f32]>, c: ScoreScale) -> f32 {
                unsafe { scale_mask_max_tf(s, m, c) }
            }
            fn exp_sum(s: &mut [f32], pre: f32, m: f32, r: Option<Round>) -> f32 {
                unsafe { exp_sum_tf(s, pre, m, r) }
            }
            fn scale(x: &mut [f32], a: f32) {
                unsafe { scale_tf(x, a) }
            }
            pub(super) const OPS: Ops = Ops {
                scale_mask_max,
                exp_sum,
                scale,
                name: stringify!($name),
                fused: true,
            };
        }
    };
}
isa!(avx512, "avx512f,avx2,fma");
isa!(avx2, "avx2,fma");

mod portable {
    use super::*;
    fn scale_mask_max(s: &mut [f32], m: Option<&[f32]>, c: ScoreScale) -> f32 {
        scale_mask_max_body(s, m, c)
    }
    fn exp_sum(s: &mut [f32], pre: f32, m: f32, r: Option<Round>) -> f32 {
        exp_sum_body::<PORTABLE_FUSED>(s, pre, m, r)
    }
    fn scale(x: &mut [f32], a: f32) {
        scale_body(x, a)
    }
    pub(super) const OPS: Ops = Ops {
        scale_mask_max,
        exp_sum,
        scale,
        name: "portable",
        fused: PORTABLE_FUSED,
    };
}

/// The best row kernels this CPU runs (detected once).
pub(crate) fn ops() -> Ops {
    static OPS: std::sync::OnceLock<Ops> = std::sync::OnceLock::new();
    *OPS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if super::isa::avx512() {
                return avx512::OPS;
            }
            if super::isa::avx2_fma() {
                return avx2::OPS;
            }
        }
        portable::OPS
    })
}

/// Every row-kernel set this CPU can run, best first (for tests).
#[cfg(test)]
#[allow(clippy::vec_init_then_push)] // the pushes before the last exist on x86-64 only
pub(crate) fn all_ops() -> Vec<Ops> {
    let mut v = vec![];
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
        {
            v.push(avx512::OPS);
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            v.push(avx2::OPS);
        }
    }
    v.push(portable::OPS);
    v
}

#[cfg(test)]
mod tests {
    use super::{all_ops, deferred_scale, exp, round_bf16, round_f16, Round};
    use crate::sdpa::cpu::ScoreScale;
    use candle_core::{DType, Device, Tensor};

    /// Values spread over every binade of f32 that matters here, plus edge cases.
    fn samples() -> Vec<f32> {
        let mut v = vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            65504.0,
            65519.99,
            65520.0,
            1e-8,
            6.0e-5,
            6.1035156e-5,
            3.0e-8,
        ];
        let mut x = 1.0e-9f32;
        while x < 1.0e6 {
            for m in [
                1.0f32,
                1.000_061,
                1.000_488_3,
                1.3,
                1.5,
                1.999_9,
                1.000_976_6,
                1.001_953_1,
            ] {
                v.push(x * m);
                v.push(-x * m);
            }
            x *= 1.37;
        }
        v
    }

    #[test]
    fn half_rounding_matches_candle_conversions() {
        let xs = samples();
        let t = Tensor::new(xs.as_slice(), &Device::Cpu).unwrap();
        for (dtype, f) in [(DType::F16, round_f16 as fn(f32) -> f32), (DType::BF16, round_bf16)] {
            let want = t
                .to_dtype(dtype)
                .unwrap()
                .to_dtype(DType::F32)
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            for (x, w) in xs.iter().zip(&want) {
                assert_eq!(f(*x).to_bits(), w.to_bits(), "{dtype:?} {x:e}: {} vs {w}", f(*x));
            }
        }
        assert!(round_f16(f32::NAN).is_nan() && round_bf16(f32::NAN).is_nan());
        assert_eq!(round_f16(f32::INFINITY), f32::INFINITY);
    }

    #[test]
    fn exp_is_within_one_ulp_of_the_exact_value() {
        for exp in [exp::<true>, exp::<false>] {
            let mut x = -87.3f32;
            while x < 0.0 {
                let got = exp(x) as f64;
                let want = (x as f64).exp();
                let ulp = (want as f32).abs() * f32::EPSILON;
                assert!((got - want).abs() <= 2.0 * ulp as f64, "exp({x}) = {got} vs {want}");
                x += 0.0137;
            }
            assert_eq!(exp(0.0), 1.0);
            assert_eq!(exp(f32::NEG_INFINITY), 0.0);
            assert_eq!(exp(-100.0), 0.0);
            assert_eq!(exp(f32::INFINITY), f32::INFINITY);
            assert!(exp(f32::NAN).is_nan());
        }
    }

    /// Without a mask, `Mul(c)` is applied in the exp pass instead of a pass of its own: the
    /// weights, their sum and the row max are the same bits as scaling first.
    #[test]
    fn a_deferred_scale_gives_the_same_bits() {
        let s: Vec<f32> = Tensor::randn(0f32, 3., 999, &Device::Cpu).unwrap().to_vec1().unwrap();
        for ops in all_ops() {
            for c in [0.125f32, 0.3, 1.7] {
                for round in [None, Some(Round::F16), Some(Round::BF16)] {
                    let mut eager: Vec<f32> = s.iter().map(|x| x * c).collect();
                    let m_eager = (ops.scale_mask_max)(&mut eager, None, ScoreScale::Mul(1.0));
                    let sum_eager = (ops.exp_sum)(&mut eager, 1.0, m_eager, round);
                    let mut deferred = s.clone();
                    let m = (ops.scale_mask_max)(&mut deferred, None, ScoreScale::Mul(c));
                    assert_eq!(deferred, s, "{}: the scores were rewritten", ops.name);
                    let pre = deferred_scale(ScoreScale::Mul(c), false);
                    assert_eq!(pre, c);
                    let sum = (ops.exp_sum)(&mut deferred, pre, m, round);
                    assert_eq!(m.to_bits(), m_eager.to_bits(), "{}", ops.name);
                    assert_eq!(sum.to_bits(), sum_eager.to_bits(), "{}", ops.name);
                    assert!(
                        deferred.iter().zip(&eager).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{}",
                        ops.name
                    );
                }
            }
        }
    }

    #[test]
    fn every_instruction_set_gives_the_same_bits() {
        let n = 1000;
        let s: Vec<f32> = Tensor::randn(0f32, 3., n, &Device::Cpu).unwrap().to_vec1().unwrap();
        let mask: Vec<f32> = (0..n)
            .map(|i| if i % 7 == 0 { f32::NEG_INFINITY } else { 0.5 })
            .collect();
        let mut results = vec![];
        for ops in all_ops() {
            let mut r = vec![];
            for len in [n, 37, 16, 3] {
                for round in [None, Some(Round::F16), Some(Round::BF16)] {
                    for scale in [ScoreScale::Mul(0.3), ScoreScale::Div(1.7)] {
                        let mut x = s[..len].to_vec();
                        let m = (ops.scale_mask_max)(&mut x, Some(&mask[..len]), scale);
                        let sum = (ops.exp_sum)(&mut x, 1.0, m, round);
                        (ops.scale)(&mut x, 1.0 / sum);
                        r.push((
                            m.to_bits(),
                            sum.to_bits(),
                            x.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        ));
                    }
                }
            }
            results.push((ops.name, ops.fused, r));
        }
        // Kernels whose `exp` is fused alike give the same bits (the portable one is unfused on
        // x86 without FMA: its exp is within 2 ulp either way, tested above).
        for (name, fused, r) in &results[1..] {
            let same = results.iter().find(|(_, f, _)| f == fused).unwrap();
            assert!(r == &same.2, "{name} differs from {}", same.0);
        }
    }
}
