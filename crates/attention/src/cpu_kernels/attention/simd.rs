//! The attention kernel's row kernels (kernels layer: scale, mask, max, `exp` and sums of a
//! score row, on the `exp` of [`crate::cpu::math`]), written once as plain loops that
//! auto-vectorise and compiled three times: for
//! AVX-512 and for AVX2+FMA (`#[target_feature]`, chosen at run time with
//! `is_x86_feature_detected!`), and for the baseline target (any architecture).

use super::ScoreScale;
use crate::cpu::isa::Isa;
use crate::cpu::math::{exp, PORTABLE_FUSED};

/// Rounding of the unnormalised weights to a half type (as f32 values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Round {
    F16,
    BF16,
}

const LANES: usize = 16;

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
    // Half precision rounds each weight: a last-bit difference of the `exp` moves a weight by a
    // whole half-precision step where it lies that close to a rounding boundary (about one in
    // 2^13 f16 weights, 2^16 bf16). PyTorch's flash kernel uses its own vectorised `exp`, not
    // libm's, so neither is "its" bits; the polynomial (within an ulp) keeps the pass vectorised.
    match round {
        None => go(s, pre, m, exp::<FUSED>, |p| p),
        Some(Round::F16) => go(s, pre, m, exp::<FUSED>, round_f16),
        Some(Round::BF16) => go(s, pre, m, exp::<FUSED>, round_bf16),
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
            /// # Safety
            ///
            /// The CPU has the features `$feat` names.
            #[target_feature(enable = $feat)]
            unsafe fn scale_mask_max_tf(s: &mut [f32], m: Option<&[f32]>, c: ScoreScale) -> f32 {
                scale_mask_max_body(s, m, c)
            }
            /// # Safety
            ///
            /// The CPU has the features `$feat` names.
            #[target_feature(enable = $feat)]
            unsafe fn exp_sum_tf(s: &mut [f32], pre: f32, m: f32, r: Option<Round>) -> f32 {
                exp_sum_body::<true>(s, pre, m, r)
            }
            /// # Safety
            ///
            /// The CPU has the features `$feat` names.
            #[target_feature(enable = $feat)]
            unsafe fn scale_tf(x: &mut [f32], a: f32) {
                scale_body(x, a)
            }
            // The three below are handed out by `ops()` only after it detected the features.
            fn scale_mask_max(s: &mut [f32], m: Option<&[f32]>, c: ScoreScale) -> f32 {
                // SAFETY: the features were detected (`ops()`).
                unsafe { scale_mask_max_tf(s, m, c) }
            }
            fn exp_sum(s: &mut [f32], pre: f32, m: f32, r: Option<Round>) -> f32 {
                // SAFETY: the features were detected (`ops()`).
                unsafe { exp_sum_tf(s, pre, m, r) }
            }
            fn scale(x: &mut [f32], a: f32) {
                // SAFETY: the features were detected (`ops()`).
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
        name: "none",
        fused: PORTABLE_FUSED,
    };
}

/// The best row kernels this CPU runs (detected once).
pub(crate) fn ops() -> Ops {
    static OPS: std::sync::OnceLock<Ops> = std::sync::OnceLock::new();
    *OPS.get_or_init(|| match Isa::detect() {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => avx512::OPS,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => avx2::OPS,
        _ => portable::OPS,
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
    use super::{all_ops, deferred_scale, round_bf16, round_f16, Round};
    use crate::cpu::math::exp;
    use crate::cpu_kernels::attention::ScoreScale;
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
