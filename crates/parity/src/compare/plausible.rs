//! Whether PyTorch's output is a plausible rounding of its float64 twin, judged by our own run.
//!
//! Rule (b) lets our output differ from PyTorch's by about PyTorch's own error against the twin.
//! That error is the bundle's word: a PyTorch output replaced by zeros, negated, scaled by 1.05,
//! or computed by a module with a bug in its dtype run only (an eps, a missing upcast) is far
//! from its twin, and a rule that trusted the distance would pass anything close to the twin. But
//! our own run in the same dtype shows how far an honest run of this block on these inputs lands:
//! PyTorch's error may exceed ours (its kernels round differently), by a bounded factor on honest
//! bundles. Beyond it, the bundle cannot show that a port close to the twin reproduces PyTorch's
//! output, and the verdict is **inconclusive**, not PASS.
//!
//! Measured relative to the local magnitude ([`ErrorModel`]): PyTorch's relative error `e_t` and
//! ours `e_o` against the twin, and the twin's own rounding to the dtype `e_f` (no output in the
//! dtype can be closer than that). PyTorch's error is plausible when
//!
//! * over the whole output, `RMS(e_t) ≤ global · max(RMS(e_o), RMS(e_f))`, and
//! * in every neighbourhood, `U_i ≤ window · max(O_i, F_i)` (local RMS of each), and
//! * on average, `|mean(e_t)| ≤ bias · max(|mean(e_o)|, RMS(e_o)/√n, RMS(e_f)/√n)`: honest
//!   rounding errors nearly cancel over `n` elements, a shift of a few ulps everywhere (a forged
//!   `+1e-3`, a dtype-only bias) does not.
//!
//! The bounds ([`plausibility_bounds`]) are chosen on generated bundles, per dtype class and per
//! regime (PyTorch's error within the twin bounds, or beyond them: ill-conditioned blocks, where
//! PyTorch's kernels can lose more than ours).

use super::{model::window_rms, unravel, values, ErrorModel, NEIGHBOURHOOD};
use candle_core::{DType, Tensor};
use serde::Serialize;

/// How much less accurate than ours PyTorch's output may be.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PlausibilityBounds {
    pub global: f64,
    pub window: f64,
    pub bias: f64,
}

/// The bounds of a dtype, for PyTorch's error within the twin bounds (`beyond` false) or beyond
/// them: twice the largest honest bundles needed on the calibration half, rounded up, the larger
/// of the choices on two CPUs (AMD Zen 3 and an Intel Xeon with AVX-512; docs/cli.md,
/// "Calibration").
pub fn plausibility_bounds(dtype: DType, beyond: bool) -> PlausibilityBounds {
    match (dtype, beyond) {
        (DType::F32 | DType::F64, false) => PlausibilityBounds {
            global: 4.1,
            window: 14.0,
            bias: 6.3,
        },
        (DType::F32 | DType::F64, true) => PlausibilityBounds {
            global: 16.0,
            window: 42.0,
            bias: 15.0,
        },
        (_, false) => PlausibilityBounds {
            global: 3.1,
            window: 4.4,
            bias: 5.7,
        },
        (_, true) => PlausibilityBounds {
            global: 2.3,
            window: 12.0,
            bias: 2.3,
        },
    }
}

/// PyTorch's error against ours, for one output.
#[derive(Debug, Clone, Serialize)]
pub struct Plausibility {
    pub plausible: bool,
    /// `RMS(e_t) / max(RMS(e_o), RMS(e_f))` over the whole output.
    pub global_ratio: f64,
    /// The largest `U_i / max(O_i, F_i)`, and where.
    pub window_ratio: f64,
    /// `|mean(e_t)| / max(|mean(e_o)|, RMS(e_o)/√n, RMS(e_f)/√n)`: PyTorch's average error
    /// against ours and the noise floor of an average.
    pub bias_ratio: f64,
    pub window_index: Vec<usize>,
    pub bounds: PlausibilityBounds,
}

impl Plausibility {
    /// Why the verdict is inconclusive (when it is).
    pub fn text(&self) -> String {
        format!(
            "PyTorch's output is {} times further from its float64 output than ours over the whole output (at most \
             {}), {} times in the neighbourhood of {:?} (at most {}), and its average error {} times ours (at most \
             {}): not a rounding of that float64 output an honest run makes, so the bundle cannot show that ours reproduces it. Either the output is not PyTorch's \
             run of this block, or PyTorch's run in this dtype computes something its float64 run does not (a \
             dtype-specific path); ours matches the float64 output. Check `--dtype f64`, or the bundle's float32 twin",
            times(self.global_ratio),
            self.bounds.global,
            times(self.window_ratio),
            self.window_index,
            self.bounds.window,
            times(self.bias_ratio),
            self.bounds.bias
        )
    }
}

/// PyTorch's output `torch` and ours `ours` (both in `dtype`) against the float64 output
/// `reference`; `beyond` says whether PyTorch's error is beyond the twin bounds.
pub fn plausibility(
    ours: &Tensor,
    torch: &Tensor,
    reference: &Tensor,
    dtype: DType,
    beyond: bool,
) -> candle_core::Result<Plausibility> {
    let dims = reference.dims().to_vec();
    let (o, t, r) = (values(ours)?, values(torch)?, values(reference)?);
    let rounded = values(&reference.to_dtype(dtype)?)?;
    let scale = ErrorModel::new(&t, &r).scale;
    // (x − r) / m, 0 where it is not finite or has no magnitude
    let relative = |a: &[f64]| -> Vec<f64> {
        a.iter()
            .zip(&r)
            .zip(&scale)
            .map(|((x, y), m)| {
                let d = x - y;
                if d == 0.0 || !d.is_finite() || *m == 0.0 {
                    0.0
                } else {
                    d / m
                }
            })
            .collect()
    };
    let (et, eo, ef) = (relative(&t), relative(&o), relative(&rounded));
    let squares = |e: &[f64]| -> Vec<f64> { e.iter().map(|x| x * x).collect() };
    let (st, so, sf) = (squares(&et), squares(&eo), squares(&ef));
    let signed_mean = |e: &[f64]| -> f64 { e.iter().sum::<f64>() / e.len().max(1) as f64 };
    let mean = |v: &[f64]| (v.iter().sum::<f64>() / v.len().max(1) as f64).sqrt();
    let global_ratio = ratio(mean(&st), mean(&so).max(mean(&sf)));
    let root_n = (t.len().max(1) as f64).sqrt();
    let bias_ratio = ratio(
        signed_mean(&et).abs(),
        signed_mean(&eo).abs().max(mean(&so) / root_n).max(mean(&sf) / root_n),
    );
    let (u, ov, fv) = (
        window_rms(&st, NEIGHBOURHOOD),
        window_rms(&so, NEIGHBOURHOOD),
        window_rms(&sf, NEIGHBOURHOOD),
    );
    let (mut window_ratio, mut at) = (0.0, 0);
    for i in 0..u.len() {
        let q = ratio(u[i], ov[i].max(fv[i]));
        if q > window_ratio {
            (window_ratio, at) = (q, i);
        }
    }
    let bounds = plausibility_bounds(dtype, beyond);
    Ok(Plausibility {
        plausible: global_ratio <= bounds.global && window_ratio <= bounds.window && bias_ratio <= bounds.bias,
        global_ratio,
        window_ratio,
        bias_ratio,
        window_index: unravel(at, &dims),
        bounds,
    })
}

/// `12.3` or `4.56e5`.
fn times(x: f64) -> String {
    if x < 1000.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2e}")
    }
}

fn ratio(x: f64, y: f64) -> f64 {
    if x == 0.0 {
        0.0
    } else if y == 0.0 {
        f64::INFINITY
    } else {
        x / y
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn tensor(v: &[f64]) -> Tensor {
        Tensor::from_vec(v.to_vec(), v.len(), &Device::Cpu).unwrap()
    }

    /// Honest: PyTorch and ours two f32 roundings of the twin. Forged: PyTorch's output ×1.05.
    #[test]
    fn a_scaled_pytorch_output_is_not_plausible() {
        let r: Vec<f64> = (0..500).map(|i| (i as f64 * 0.61).sin() * 2.0 + 0.1).collect();
        let f32r = |x: f64| (x as f32) as f64;
        let t: Vec<f64> = r.iter().map(|x| f32r(x * (1.0 + 3e-7))).collect();
        let o: Vec<f64> = r.iter().map(|x| f32r(x * (1.0 - 2e-7))).collect();
        let p = plausibility(&tensor(&o), &tensor(&t), &tensor(&r), DType::F32, false).unwrap();
        assert!(p.plausible, "{p:?}");
        let forged: Vec<f64> = t.iter().map(|x| f32r(x * 1.05)).collect();
        let p = plausibility(&tensor(&o), &tensor(&forged), &tensor(&r), DType::F32, true).unwrap();
        assert!(!p.plausible && p.global_ratio > 1e4, "{p:?}");
        assert!(p.text().contains("inconclusive") || p.text().contains("cannot show"));
    }

    /// A shift of about one rounding everywhere: within the global and local bounds, not on average.
    #[test]
    fn a_shifted_pytorch_output_is_not_plausible_on_average() {
        let r: Vec<f64> = (0..2000).map(|i| (i as f64 * 0.61).sin() * 2.0 + 0.1).collect();
        let f16 = |v: Vec<f64>| tensor(&v).to_dtype(DType::F16).unwrap();
        let t = f16(r.clone());
        let o = f16(r.iter().map(|x| x * (1.0 + 1e-4)).collect());
        let p = plausibility(&o, &t, &tensor(&r), DType::F16, false).unwrap();
        assert!(p.bias_ratio < 10.0, "{p:?}");
        let shifted = f16(r.iter().map(|x| x + 1e-3).collect());
        let p = plausibility(&o, &shifted, &tensor(&r), DType::F16, false).unwrap();
        assert!(p.bias_ratio > 30.0, "{p:?}");
    }
}
