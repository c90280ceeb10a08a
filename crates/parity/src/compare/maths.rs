//! The maths check: our float64 run of the block against PyTorch's float64 output.
//!
//! A bundle's float64 twin `r` is PyTorch's run of the block in float64 on the same (dtype-rounded)
//! weights and inputs. Our float64 run `o64` of the same block computes the same mathematics in
//! the same precision, so the two differ only by float64 rounding, amplified as the block
//! amplifies any rounding: PyTorch's own error in the bundle's dtype, `U_i` (its local RMS relative
//! error, [`ErrorModel`]), measures that amplification in units of float32's epsilon (PyTorch
//! computes in at least float32 inside; a float64 bundle's own epsilon). Element `i` matches when
//!
//! `|o64_i − r_i| ≤ m_i · (MATHS_FACTOR · eps64 · (1 + U_i / eps32) + EMBEDDING_FACTOR · S_i)`
//!
//! with `m_i` the local magnitude and `S_i` the local RMS effect of the float32 steps PyTorch's
//! float64 run takes (`unet_attention::float64_run`), measured on our own float64 runs: the
//! float32 embeddings PyTorch builds in every dtype (our run with them exact, against the run as
//! PyTorch builds them), plus, for a twin that kept the published `.float()` casts, those casts
//! (our run with them kept, against our run with them off). Each is 0 where the block has no such
//! step. Two float32 computations of the same step (PyTorch's softmax and ours) differ by a few
//! float32 roundings, which is what a multiple of the step's own effect allows. A port whose
//! mathematics differs (a head split, a swapped key and value, a scale, an eps, a bias, tanh GELU)
//! differs from `r` by its whole effect, which float64 does not hide: millions of times this
//! allowance on the generated bundles, where an honest block needs at most thousands
//! (docs/cli.md, "Calibration"). This is what catches, in float16 and bfloat16, a bug whose effect
//! is below the dtype's rounding.

use super::{epsilon, model::window_rms, unravel, values, ErrorModel, NEIGHBOURHOOD};
use candle_core::{DType, Tensor};
use serde::Serialize;

/// The multiple of `eps64 · (1 + U_i / eps32)` our float64 run may be off PyTorch's: twice the
/// largest an honest block needed on the calibration half, rounded up.
pub const MATHS_FACTOR: f64 = 390.0;

/// The multiple of the float32 steps' local effect `S_i` (embeddings, kept casts) allowed on top.
pub const EMBEDDING_FACTOR: f64 = 32.0;

/// The maths check of one output.
#[derive(Debug, Clone, Serialize)]
pub struct MathsReport {
    /// Whether every element matched.
    pub matches: bool,
    /// The largest `|o64_i − r_i|` over its allowance (at most 1 when it matches).
    pub ratio: f64,
    /// The largest `|o64_i − r_i| / m_i`: our float64 run's relative distance from PyTorch's.
    pub max_rel_diff: f64,
    /// The element of the largest ratio, with ours, PyTorch's and the allowance there.
    pub worst_index: Vec<usize>,
    pub worst_ours64: f64,
    pub worst_float64: f64,
    pub worst_allowed: f64,
    /// Which float64 run of ours matched best: `casts off` (the exporters' twins) or `casts kept`
    /// (a plain `.double()`'s).
    pub convention: String,
    /// Whether the allowance includes float32 steps' effect (embeddings, kept casts).
    pub embeddings: bool,
}

impl MathsReport {
    /// `our float64 run matches PyTorch's float64 output` or where it does not.
    pub fn text(&self) -> String {
        if self.matches {
            return format!(
                "our float64 run matches PyTorch's float64 output ({} twin{}; at most {:.2e} relative, {:.3} of the \
                 allowance)",
                self.convention,
                if self.embeddings {
                    ", with its float32 steps' effect"
                } else {
                    ""
                },
                self.max_rel_diff,
                self.ratio
            );
        }
        format!(
            "our float64 run differs from PyTorch's float64 output: {:.6e} against {:.6e} at {:?}, {:.3e} apart, {:.3e} \
             times what float64 rounding in this block allows there ({:.1e}); the block computes something else than \
             PyTorch's",
            self.worst_ours64,
            self.worst_float64,
            self.worst_index,
            (self.worst_ours64 - self.worst_float64).abs(),
            self.ratio,
            self.worst_allowed
        )
    }
}

/// What the maths check compares: our float64 run (under the convention named), and the pairs
/// of our float64 runs that measure the effect `S_i` of the float32 steps PyTorch's float64 run
/// takes: the embeddings (as PyTorch builds them, and exact) where the block builds float32 ones,
/// the published casts (kept, and off) under the `casts kept` convention.
pub struct Float64Runs<'a> {
    pub ours64: &'a Tensor,
    pub embeddings: Option<(&'a Tensor, &'a Tensor)>,
    pub casts: Option<(&'a Tensor, &'a Tensor)>,
    pub convention: &'a str,
}

/// Per element: our float64 run's relative distance from the float64 output `d_i / m_i`, the
/// float64 rounding scale `eps64 · (1 + U_i / eps32)`, and the embeddings' local effect `S_i`
/// (0 without a run with exact embeddings), with the local magnitudes `m_i`.
struct Elements {
    dims: Vec<usize>,
    ours64: Vec<f64>,
    reference: Vec<f64>,
    scale: Vec<f64>,
    distance: Vec<f64>,
    rounding: Vec<f64>,
    embeddings: Option<Vec<f64>>,
}

impl Elements {
    fn new(runs: &Float64Runs, torch: &Tensor, reference: &Tensor, dtype: DType) -> candle_core::Result<Option<Self>> {
        let dims = reference.dims().to_vec();
        if runs.ours64.dims() != dims.as_slice() {
            return Ok(None);
        }
        let (t, r, o64) = (values(torch)?, values(reference)?, values(runs.ours64)?);
        let model = ErrorModel::new(&t, &r);
        let mut embeddings: Option<Vec<f64>> = None;
        for (a, b) in [runs.embeddings, runs.casts].into_iter().flatten() {
            if a.dims() != dims.as_slice() || b.dims() != dims.as_slice() {
                continue;
            }
            let (a, b) = (values(a)?, values(b)?);
            let squares: Vec<f64> = a
                .iter()
                .zip(&b)
                .zip(&model.scale)
                .map(|((a, b), m)| relative(a - b, *m).powi(2))
                .collect();
            let effect = window_rms(&squares, NEIGHBOURHOOD);
            embeddings = Some(match embeddings {
                Some(sum) => sum.iter().zip(&effect).map(|(x, y)| x + y).collect(),
                None => effect,
            });
        }
        // PyTorch computes in at least float32 inside whatever the dtype (half precision is
        // rounded per op): its error in float32 units bounds how much the block amplifies a
        // rounding. In float16/bfloat16 units the output's own rounding would hide an
        // amplification of thousands (an outlier's logits in the millions: our float64 run 6e-10
        // off PyTorch's at the median, a bfloat16 error of one ulp).
        let eps = epsilon(dtype).min(epsilon(DType::F32));
        let distance = o64
            .iter()
            .zip(&r)
            .zip(&model.scale)
            .map(|((a, b), m)| relative(a - b, *m))
            .collect();
        let rounding = model.torch_rms.iter().map(|u| f64::EPSILON * (1.0 + u / eps)).collect();
        Ok(Some(Self {
            dims,
            ours64: o64,
            reference: r,
            scale: model.scale,
            distance,
            rounding,
            embeddings,
        }))
    }

    /// `S_i` (0 without float32 steps).
    fn effect(&self, i: usize) -> f64 {
        self.embeddings.as_ref().map_or(0.0, |s| s[i])
    }
}

/// The maths check of `runs` against PyTorch's output `torch` (in `dtype`) and its float64 output
/// `reference` (same shape; the caller checked the twin is usable).
pub fn maths_check(
    runs: &Float64Runs,
    torch: &Tensor,
    reference: &Tensor,
    dtype: DType,
) -> candle_core::Result<MathsReport> {
    let elements = Elements::new(runs, torch, reference, dtype)?;
    let mut report = MathsReport {
        matches: false,
        ratio: f64::INFINITY,
        max_rel_diff: f64::INFINITY,
        worst_index: vec![],
        worst_ours64: f64::NAN,
        worst_float64: f64::NAN,
        worst_allowed: f64::NAN,
        convention: runs.convention.to_string(),
        embeddings: false,
    };
    let Some(e) = elements else {
        return Ok(report);
    };
    report.embeddings = e.embeddings.is_some();
    (report.ratio, report.max_rel_diff) = (0.0, 0.0);
    let mut worst = None;
    for i in 0..e.distance.len() {
        let allowed = MATHS_FACTOR * e.rounding[i] + EMBEDDING_FACTOR * e.effect(i);
        let ratio = if e.distance[i] == 0.0 {
            0.0
        } else if allowed == 0.0 {
            f64::INFINITY
        } else {
            e.distance[i] / allowed
        };
        report.max_rel_diff = report.max_rel_diff.max(e.distance[i]);
        if worst.is_none() || ratio > report.ratio {
            worst = Some(i);
            report.ratio = ratio;
            report.worst_allowed = allowed * e.scale[i];
        }
    }
    if let Some(i) = worst {
        report.worst_index = unravel(i, &e.dims);
        report.worst_ours64 = e.ours64[i];
        report.worst_float64 = e.reference[i];
    }
    report.matches = report.ratio <= 1.0;
    Ok(report)
}

/// For the calibration: the smallest [`MATHS_FACTOR`] under which `runs` would match, with the
/// embeddings' effect allowed `embedding_factor` times (infinite where our float64 run has another
/// shape or is NaN where the float64 output is not).
pub fn needed_factor(
    runs: &Float64Runs,
    torch: &Tensor,
    reference: &Tensor,
    dtype: DType,
    embedding_factor: f64,
) -> candle_core::Result<f64> {
    let Some(e) = Elements::new(runs, torch, reference, dtype)? else {
        return Ok(f64::INFINITY);
    };
    Ok((0..e.distance.len())
        .map(|i| {
            let left = (e.distance[i] - embedding_factor * e.effect(i)).max(0.0);
            if left == 0.0 {
                0.0
            } else {
                left / e.rounding[i]
            }
        })
        .fold(0.0, f64::max))
}

/// Whether PyTorch's output is much closer to our float64 run than to its own float64 output
/// (RMS distances relative to the local magnitude, a quarter or less): then the float64 output is
/// the odd one of the three, not our block.
pub fn twin_is_the_odd_one(torch: &Tensor, reference: &Tensor, ours64: &Tensor) -> candle_core::Result<bool> {
    let flat = |t: &Tensor| t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>();
    let (t, r, o) = (flat(torch)?, flat(reference)?, flat(ours64)?);
    if o.len() != r.len() {
        return Ok(false);
    }
    let scale = super::model::local_scale(&r);
    let rms = |a: &[f64], b: &[f64]| {
        let sum: f64 = a
            .iter()
            .zip(b)
            .zip(&scale)
            .map(|((x, y), m)| {
                if *m > 0.0 && (x - y).is_finite() {
                    ((x - y) / m).powi(2)
                } else {
                    0.0
                }
            })
            .sum();
        (sum / a.len().max(1) as f64).sqrt()
    };
    Ok(rms(&t, &o) <= rms(&t, &r) / 4.0)
}

/// The best of several maths checks (the conventions tried): the smallest ratio.
pub fn best(reports: Vec<MathsReport>) -> Option<MathsReport> {
    reports.into_iter().min_by(|a, b| a.ratio.total_cmp(&b.ratio))
}

fn relative(d: f64, m: f64) -> f64 {
    if d == 0.0 {
        0.0
    } else if !d.is_finite() || m == 0.0 {
        f64::INFINITY
    } else {
        d.abs() / m
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn tensor(v: &[f64]) -> Tensor {
        Tensor::from_vec(v.to_vec(), v.len(), &Device::Cpu).unwrap()
    }

    #[test]
    fn float64_rounding_matches_and_a_changed_computation_does_not() {
        let r: Vec<f64> = (0..300).map(|i| (i as f64 * 0.37).sin() * 3.0).collect();
        // PyTorch's f32 run: a few f32 roundings off
        let t: Vec<f64> = r.iter().map(|x| (*x as f32) as f64 * (1.0 + 2e-7)).collect();
        let ours64: Vec<f64> = r.iter().map(|x| x * (1.0 + 4.0 * f64::EPSILON)).collect();
        let runs = Float64Runs {
            ours64: &tensor(&ours64),
            embeddings: None,
            casts: None,
            convention: "casts off",
        };
        let ok = maths_check(&runs, &tensor(&t), &tensor(&r), DType::F32).unwrap();
        assert!(ok.matches, "{}", ok.text());
        // A scale bug of 1e-6 relative: invisible in f32 rule (a), not in float64.
        let wrong: Vec<f64> = r.iter().map(|x| x * (1.0 + 1e-6)).collect();
        let runs = Float64Runs {
            ours64: &tensor(&wrong),
            embeddings: None,
            casts: None,
            convention: "casts off",
        };
        let bad = maths_check(&runs, &tensor(&t), &tensor(&r), DType::F32).unwrap();
        assert!(!bad.matches && bad.ratio > 100.0, "{}", bad.text());
        assert!(bad.text().contains("differs"), "{}", bad.text());
    }

    #[test]
    fn the_embeddings_effect_widens_the_allowance_where_it_is() {
        let r: Vec<f64> = (0..200).map(|i| 1.0 + (i % 5) as f64).collect();
        let t: Vec<f64> = r.iter().map(|x| x * (1.0 + 1e-7)).collect();
        let ours64: Vec<f64> = r.iter().map(|x| x * (1.0 + 3e-8)).collect();
        let exact: Vec<f64> = r.iter().map(|x| x * (1.0 + 1e-8)).collect();
        let (ours64, exact) = (tensor(&ours64), tensor(&exact));
        let without = Float64Runs {
            ours64: &ours64,
            embeddings: None,
            casts: None,
            convention: "casts off",
        };
        assert!(
            !maths_check(&without, &tensor(&t), &tensor(&r), DType::F32)
                .unwrap()
                .matches
        );
        let with = Float64Runs {
            embeddings: Some((&ours64, &exact)),
            ..without
        };
        assert!(
            maths_check(&with, &tensor(&t), &tensor(&r), DType::F32)
                .unwrap()
                .matches
        );
    }

    #[test]
    fn a_kept_cast_widens_the_allowance_by_its_own_effect_only() {
        let r: Vec<f64> = (0..200).map(|i| 1.0 + (i % 7) as f64).collect();
        let t: Vec<f64> = r.iter().map(|x| x * (1.0 + 1e-7)).collect();
        // PyTorch's twin kept a float32 softmax: 2e-8 off; ours kept it too, rounded elsewhere
        let ours_kept: Vec<f64> = r.iter().map(|x| x * (1.0 + 3e-8)).collect();
        let ours_off: Vec<f64> = r.iter().map(|x| x * (1.0 + 1e-15)).collect();
        let (kept, off) = (tensor(&ours_kept), tensor(&ours_off));
        let twin = tensor(&r.iter().map(|x| x * (1.0 + 2e-8)).collect::<Vec<_>>());
        let runs = Float64Runs {
            ours64: &kept,
            embeddings: None,
            casts: Some((&kept, &off)),
            convention: "casts kept",
        };
        let ok = maths_check(&runs, &tensor(&t), &twin, DType::F32).unwrap();
        assert!(ok.matches, "{}", ok.text());
        // a bug of 1e-5 relative is far beyond the casts' effect (measured on the bug's own runs,
        // which differ by the cast as the honest ones do)
        let wrong = tensor(&r.iter().map(|x| x * (1.0 + 1e-5)).collect::<Vec<_>>());
        let bad_runs = Float64Runs {
            ours64: &wrong,
            embeddings: None,
            casts: Some((&kept, &off)),
            convention: "casts kept",
        };
        let bad = maths_check(&bad_runs, &tensor(&t), &twin, DType::F32).unwrap();
        assert!(!bad.matches, "{}", bad.text());
    }
}
