//! The pass rule.
//!
//! An output passes when either
//! (a) ours matches PyTorch's output elementwise at `torch.testing.assert_close` tolerances
//!     for the dtype (`|ours − torch| ≤ atol + rtol·|torch|`), or
//! (b) the bundle carries PyTorch's float64 output and our max abs error against it is at most
//!     twice PyTorch's own max abs error against it (a port cannot be asked to be more accurate
//!     than the reference).
//! A non-finite value on our side always fails (the row's reason says how many, so an overflow
//! on our side is never mistaken for a near miss). A bundle whose PyTorch output (or its float64
//! twin) holds NaN or ±inf anywhere is refused before any comparison
//! (`Bundle::check_values`, exit 2): such a reference cannot vouch for ours, so it is never a
//! PASS. [`compare`] alone (used outside `check` too) accepts NaN where PyTorch has NaN and the
//! same ±inf where PyTorch has it, but fails an output with no element finite on both sides.
//!
//! The bundle's float64 output is checked against its own PyTorch output before either is used
//! ([`check_reference`]): where PyTorch's output is NaN or inf and its float64 twin is finite, or
//! the two differ by more than a rounding error could, the bundle cannot vouch for the output
//! (it is unusable, not a licence to pass under rule (b)).

use candle_core::{DType, Tensor};
use serde::Serialize;

/// `torch.testing.assert_close` default `(rtol, atol)` for a dtype.
pub fn default_tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F16 => (1e-3, 1e-5),
        DType::BF16 => (1.6e-2, 1e-5),
        DType::F64 => (1e-7, 1e-7),
        _ => (1.3e-6, 1e-5),
    }
}

/// A tolerance is a finite number ≥ 0.
pub fn check_tolerance(t: f64) -> Result<(), String> {
    if t.is_finite() && t >= 0.0 {
        Ok(())
    } else {
        Err(format!("a tolerance must be a finite number ≥ 0, found {t}"))
    }
}

/// Whether PyTorch's output `torch` (in `dtype`) and its float64 twin `reference` agree as two
/// runs of the same computation can: every element where the float64 output is finite is finite
/// in `torch` too, and `max |torch − reference|` is within `100 × rtol(dtype) × max(1, max
/// |reference|)` (with `rtol` `torch.testing.assert_close`'s: 1.3e-4 of the output's scale in
/// f32, 0.1 in f16; PyTorch's own error on the committed bundles is 1e-6 – 1e-5 of the scale in
/// f32). `Err` says what is wrong.
pub fn check_reference(torch: &Tensor, reference: &Tensor, dtype: DType) -> candle_core::Result<Result<(), String>> {
    if torch.dims() != reference.dims() {
        return Ok(Err(format!(
            "the float64 output has shape {:?}, the output {:?}",
            reference.dims(),
            torch.dims()
        )));
    }
    let (t, r) = (values(torch)?, values(reference)?);
    let broken = t
        .iter()
        .zip(&r)
        .filter(|(x, y)| !x.is_finite() && y.is_finite())
        .count();
    if broken > 0 {
        return Ok(Err(format!(
            "PyTorch's output is NaN or inf at {broken} elements where its float64 output is finite              (an overflow in PyTorch's own run): these cannot be verified; export with smaller weights or inputs"
        )));
    }
    let finite = |(x, y): &(&f64, &f64)| x.is_finite() && y.is_finite();
    let scale = r.iter().filter(|y| y.is_finite()).fold(1.0f64, |m, y| m.max(y.abs()));
    let diff = t
        .iter()
        .zip(&r)
        .filter(finite)
        .fold(0.0f64, |m, (x, y)| m.max((x - y).abs()));
    let bound = 100.0 * default_tolerance(dtype).0 * scale;
    if diff > bound {
        return Ok(Err(format!(
            "PyTorch's output and its float64 output differ by up to {diff:.3e}, more than a rounding error \
             could ({bound:.1e}): they are not two runs of the same computation"
        )));
    }
    Ok(Ok(()))
}

/// The comparison of one output.
#[derive(Debug, Clone, Serialize)]
pub struct OutputReport {
    pub name: String,
    pub shape: Vec<usize>,
    /// Max |ours − torch|.
    pub max_abs: f64,
    /// Max |ours − torch| / |torch| over elements where torch ≠ 0.
    pub max_rel: f64,
    pub atol: f64,
    pub rtol: f64,
    /// Rule (a) held.
    pub close: bool,
    /// Max |ours − torch_f64|, when the bundle has the float64 output.
    pub ours_vs_f64: Option<f64>,
    /// Max |torch − torch_f64|: PyTorch's own error.
    pub torch_vs_f64: Option<f64>,
    pub pass: bool,
    /// Elements where ours is NaN or ±inf and PyTorch's is not that same value.
    pub non_finite: usize,
    /// Elements where PyTorch's is NaN or ±inf and ours is finite.
    pub torch_non_finite: usize,
    /// Why it failed, when it did.
    pub reason: Option<String>,
}

fn values(t: &Tensor) -> candle_core::Result<Vec<f64>> {
    t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()
}

fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .filter(|(x, y)| !(x.is_nan() && y.is_nan()))
        .map(|(x, y)| if x == y { 0.0 } else { (x - y).abs() })
        .fold(0.0, |m, d| if d.is_nan() || d > m { d } else { m })
}

/// Compare our output with PyTorch's (`expected`) and, if present, PyTorch's float64 output.
/// `expected_is_f64` marks a run where `expected` already is the float64 output.
pub fn compare(
    name: &str,
    ours: &Tensor,
    expected: &Tensor,
    expected_f64: Option<&Tensor>,
    rtol: f64,
    atol: f64,
) -> candle_core::Result<OutputReport> {
    let mut report = OutputReport {
        name: name.to_string(),
        shape: ours.dims().to_vec(),
        max_abs: f64::NAN,
        max_rel: f64::NAN,
        atol,
        rtol,
        close: false,
        ours_vs_f64: None,
        torch_vs_f64: None,
        pass: false,
        non_finite: 0,
        torch_non_finite: 0,
        reason: None,
    };
    if ours.dims() != expected.dims() {
        report.reason = Some(format!("shape {:?}, PyTorch's is {:?}", ours.dims(), expected.dims()));
        return Ok(report);
    }
    let (a, e) = (values(ours)?, values(expected)?);
    // Ours non-finite where PyTorch's is finite, or a different non-finite value.
    let same = |x: &f64, y: &f64| (x.is_nan() && y.is_nan()) || x == y;
    let ours_bad: Vec<(&f64, &f64)> = a
        .iter()
        .zip(&e)
        .filter(|(x, y)| !x.is_finite() && !same(x, y))
        .collect();
    let non_finite = ours_bad.len();
    let where_torch_finite = ours_bad.iter().filter(|(_, y)| y.is_finite()).count();
    let ours_nan = ours_bad.iter().filter(|(x, _)| x.is_nan()).count();
    report.non_finite = non_finite;
    report.torch_non_finite = a
        .iter()
        .zip(&e)
        .filter(|(x, y)| x.is_finite() && !y.is_finite())
        .count();
    report.max_abs = max_abs_diff(&a, &e);
    report.max_rel = a
        .iter()
        .zip(&e)
        .filter(|(x, y)| **y != 0.0 && !(x.is_nan() && y.is_nan()))
        .map(|(x, y)| (x - y).abs() / y.abs())
        .fold(0.0, f64::max);
    report.close = a
        .iter()
        .zip(&e)
        .all(|(x, y)| (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= atol + rtol * y.abs());
    if let Some(r) = expected_f64 {
        if r.dims() == expected.dims() {
            let r = values(r)?;
            report.ours_vs_f64 = Some(max_abs_diff(&a, &r));
            report.torch_vs_f64 = Some(max_abs_diff(&e, &r));
        }
    }
    let within_reference = match (report.ours_vs_f64, report.torch_vs_f64) {
        (Some(ours), Some(torch)) => ours <= 2.0 * torch,
        _ => false,
    };
    let compared = a.iter().zip(&e).filter(|(x, y)| x.is_finite() && y.is_finite()).count();
    report.pass = non_finite == 0 && compared > 0 && (report.close || within_reference);
    if compared == 0 && non_finite == 0 {
        report.reason = Some(if a.is_empty() {
            "the output is empty: nothing to compare".to_string()
        } else {
            format!(
                "no finite value to compare: all {} of PyTorch's values are NaN or inf, and ours the same",
                a.len()
            )
        });
    } else if non_finite > 0 {
        let elsewhere = non_finite - where_torch_finite;
        let tail = if elsewhere > 0 {
            format!(" or, for {elsewhere} of them, a different non-finite value")
        } else {
            String::new()
        };
        report.reason = Some(format!(
            "non-finite output: {non_finite} of our values are NaN or inf ({ours_nan} NaN, {} inf) where PyTorch's is finite{tail}",
            non_finite - ours_nan
        ));
    } else if report.torch_non_finite > 0 && !report.pass {
        report.reason = Some(format!(
            "PyTorch's output has {} NaN or inf values where ours is finite",
            report.torch_non_finite
        ));
    } else if !report.pass {
        report.reason = Some(match (report.ours_vs_f64, report.torch_vs_f64) {
            (Some(o), Some(t)) => format!(
                "max abs error {:.3e} > atol {atol:.1e} + rtol {rtol:.1e}·|torch|, and error vs float64 {o:.3e} > 2 × PyTorch's {t:.3e}",
                report.max_abs
            ),
            _ => format!("max abs error {:.3e} > atol {atol:.1e} + rtol {rtol:.1e}·|torch| (no float64 output in the bundle)", report.max_abs),
        });
    }
    Ok(report)
}
