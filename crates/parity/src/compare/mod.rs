//! The pass rule, element by element.
//!
//! Each element of an output is judged on its own. With `o` ours, `t` PyTorch's output (in the
//! bundle's dtype) and `r` PyTorch's float64 output (`parity.output.<name>.float64`), element `i`
//! passes when
//!
//! * **(a)** `|o_i − t_i| ≤ atol + rtol·|t_i|` (`torch.testing.assert_close`'s test, at the
//!   dtype's defaults unless a bundle or flag sets them), or
//! * **(b)** the bundle has `r`, and our error `|o_i − r_i|` is of the kind PyTorch itself makes
//!   there ([`model`]): beyond `atol + rtol·|r_i|`, at most [`FACTORS`]`.element` times PyTorch's
//!   local RMS error (relative to the local magnitude) at the element, and at most
//!   [`FACTORS`]`.window` times it as an RMS over the element's neighbourhood.
//!
//! An output passes when every element passes (bit-identical NaNs and equal infinities count as
//! equal; a NaN or inf of ours where PyTorch's is finite fails), at least one element is finite on
//! both sides, and the output is not empty.
//!
//! Before `r` is used it must be PyTorch's own float64 twin ([`check_reference`]): elementwise and
//! as a local RMS, within what PyTorch's dtype can explain.

use candle_core::{DType, Tensor};
use serde::Serialize;

pub mod maths;
pub mod model;
pub mod plausible;
mod tolerance;
pub use maths::{maths_check, Float64Runs, MathsReport, EMBEDDING_FACTOR, MATHS_FACTOR};
pub use model::{ErrorModel, Factors, CONFIRMED_FACTORS, FACTORS, NEIGHBOURHOOD};
pub use plausible::{plausibility, plausibility_bounds, Plausibility, PlausibilityBounds};
pub use tolerance::{
    check_reference, check_reference_within, check_tolerance, confirm_twin, default_tolerance, epsilon,
    stage_twin_bounds, twin_bounds, twin_error_eps, TwinBounds, TwinProblem,
};

/// How an output (or one element) met the rule, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Every element equal to PyTorch's (NaN where PyTorch has NaN).
    Identical,
    /// Rule (a): within `atol + rtol·|torch|` of PyTorch's output.
    Close,
    /// Rule (b): some elements only within PyTorch's own error nearby (times the rule's factors).
    TorchError,
    /// Rule (b) would pass, but PyTorch's output is not a plausible rounding of its float64
    /// output ([`plausible`]): the bundle cannot show that ours reproduces it. Not a PASS.
    Inconclusive,
    /// Some element met neither rule, or our float64 run differs from PyTorch's ([`maths`]).
    Fail,
}

impl Verdict {
    /// `identical`, `close`, `torch-error`, `inconclusive`, `fail`.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Identical => "identical",
            Verdict::Close => "close",
            Verdict::TorchError => "torch-error",
            Verdict::Inconclusive => "inconclusive",
            Verdict::Fail => "fail",
        }
    }
}

/// A bundle's (or port's) verdict: every output passed; some output failed; or none failed and
/// some could not be judged ([`Verdict::Inconclusive`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    Pass,
    Fail,
    Inconclusive,
}

impl Outcome {
    /// The outcome of these outputs.
    pub fn of(outputs: &[OutputReport]) -> Self {
        if outputs.iter().all(|o| o.pass) {
            Outcome::Pass
        } else if outputs.iter().any(|o| !o.pass && !o.inconclusive()) {
            Outcome::Fail
        } else {
            Outcome::Inconclusive
        }
    }

    /// `PASS`, `FAIL`, `INCONCLUSIVE`.
    pub fn word(self) -> &'static str {
        match self {
            Outcome::Pass => "PASS",
            Outcome::Fail => "FAIL",
            Outcome::Inconclusive => "INCONCLUSIVE",
        }
    }
}

/// The element that failed worst (largest excess over what the rule allowed it).
#[derive(Debug, Clone, Serialize)]
pub struct Element {
    /// Its index in the output.
    pub index: Vec<usize>,
    pub ours: f64,
    /// What rule (a) compared with: PyTorch's output, or the float64 output in a run in another
    /// dtype.
    pub expected: f64,
    /// PyTorch's float64 output there, when the bundle has it.
    pub float64: Option<f64>,
    /// `atol + rtol·|expected|`.
    pub tolerance: f64,
    /// Rule (b)'s allowance for this element alone, `atol + rtol·|float64| + element factor ×
    /// PyTorch's local RMS error × the local magnitude`, when the bundle has the float64 output.
    pub torch_error_allowance: Option<f64>,
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
    /// Rule (a) held at every element.
    pub close: bool,
    /// Max |ours − torch_f64|, when the bundle has the float64 output.
    pub ours_vs_f64: Option<f64>,
    /// Max |torch − torch_f64|: PyTorch's own error.
    pub torch_vs_f64: Option<f64>,
    pub pass: bool,
    /// The best verdict every element meets.
    pub verdict: Verdict,
    /// Elements that met rule (b) only.
    pub torch_error_elements: usize,
    /// Elements that met neither rule.
    pub failed_elements: usize,
    /// The worst failing element.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worst: Option<Element>,
    /// Elements where ours is NaN or ±inf and PyTorch's is not that same value.
    pub non_finite: usize,
    /// Elements where PyTorch's is NaN or ±inf and ours is finite.
    pub torch_non_finite: usize,
    /// The largest ratio, over the elements outside rule (a), of our excess error to PyTorch's
    /// local RMS error (both relative to the local magnitude): rule (b) holds element by element
    /// while this is at most `factors.element`. Absent without a float64 output or when every
    /// element met rule (a); infinite where PyTorch was exact all around.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub element_factor: Option<f64>,
    /// The same for the RMS of our excess errors over each such element's neighbourhood: at most
    /// `factors.window` under rule (b).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window_factor: Option<f64>,
    /// The factors rule (b) was held to.
    pub factors: Factors,
    /// Why it failed, when it did.
    pub reason: Option<String>,
    /// How the float64 output came to be trusted when PyTorch's own error was beyond what rounding
    /// in its dtype reaches: confirmed by our float64 run ([`maths`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub twin_note: Option<String>,
    /// Our float64 run against PyTorch's float64 output ([`maths`]), where both exist.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub maths: Option<MathsReport>,
    /// PyTorch's error against ours ([`plausible`]), where the output passed by rule (b).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plausibility: Option<Plausibility>,
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

/// `[b, c, h, w]` of a flat index in `dims`.
pub fn index_text(flat: usize, dims: &[usize]) -> String {
    format!("{:?}", unravel(flat, dims))
}

pub(crate) fn unravel(mut flat: usize, dims: &[usize]) -> Vec<usize> {
    let mut index = vec![0; dims.len()];
    for (slot, &d) in index.iter_mut().zip(dims).rev() {
        if d > 0 {
            *slot = flat % d;
            flat /= d;
        }
    }
    index
}

/// What the elements of an output are compared with.
struct Sides<'a> {
    ours: &'a [f64],
    /// Rule (a)'s anchor: PyTorch's output, or the float64 output in a run in another dtype.
    expected: &'a [f64],
    /// The float64 output and the error model of PyTorch's run against it.
    reference: Option<(&'a [f64], ErrorModel)>,
}

/// Counts of the elementwise verdicts.
struct Tally {
    verdict: Verdict,
    torch_error: usize,
    failed: usize,
    worst: Option<(usize, f64)>,
    element_factor: Option<f64>,
    window_factor: Option<f64>,
}

/// `x / y`, 0 when both are 0, infinite when only `y` is.
fn ratio(x: f64, y: f64) -> f64 {
    if x == 0.0 {
        0.0
    } else {
        x / y
    }
}

/// Our relative excess over rule (a)'s tolerance against the float64 output, per element: rule
/// (b)'s `v_i` (0 where either side is not finite: those are judged by the non-finite counts).
fn excess_errors(ours: &[f64], r: &[f64], model: &ErrorModel, rtol: f64, atol: f64) -> Vec<f64> {
    ours.iter()
        .zip(r)
        .zip(&model.scale)
        .map(|((o, r), m)| {
            let over = (o - r).abs() - atol - rtol * r.abs();
            if over.is_finite() && over > 0.0 {
                ratio(over, *m)
            } else {
                0.0
            }
        })
        .collect()
}

fn tally(sides: &Sides, rtol: f64, atol: f64, factors: Factors) -> Tally {
    let mut t = Tally {
        verdict: Verdict::Identical,
        torch_error: 0,
        failed: 0,
        worst: None,
        element_factor: None,
        window_factor: None,
    };
    let rule_b = sides.reference.as_ref().map(|(r, model)| {
        let excess = excess_errors(sides.ours, r, model, rtol, atol);
        let squares: Vec<f64> = excess.iter().map(|v| v * v).collect();
        (excess, model::window_rms(&squares, NEIGHBOURHOOD), &model.torch_rms)
    });
    for (i, (&o, &e)) in sides.ours.iter().zip(sides.expected).enumerate() {
        if o == e || (o.is_nan() && e.is_nan()) {
            continue;
        }
        let diff = (o - e).abs();
        let tolerance = atol + rtol * e.abs();
        let verdict = if diff <= tolerance {
            Verdict::Close
        } else {
            match (&rule_b, &sides.reference) {
                (Some((excess, window, torch)), Some((r, _))) if o.is_finite() && r[i].is_finite() => {
                    let (element, around) = (ratio(excess[i], torch[i]), ratio(window[i], torch[i]));
                    t.element_factor = Some(t.element_factor.unwrap_or(0.0).max(element));
                    t.window_factor = Some(t.window_factor.unwrap_or(0.0).max(around));
                    if element <= factors.element && around <= factors.window {
                        Verdict::TorchError
                    } else {
                        Verdict::Fail
                    }
                }
                _ => Verdict::Fail,
            }
        };
        t.verdict = t.verdict.max(verdict);
        match verdict {
            Verdict::TorchError => t.torch_error += 1,
            Verdict::Fail => {
                t.failed += 1;
                // NaN differences rank first.
                let excess = if diff.is_nan() { f64::INFINITY } else { diff - tolerance };
                if t.worst.is_none_or(|(_, w)| excess > w) {
                    t.worst = Some((i, excess));
                }
            }
            _ => {}
        }
    }
    t
}

/// Compare our output with PyTorch's (`expected`) and, if present, PyTorch's float64 output,
/// element by element (see the module docs).
pub fn compare(
    name: &str,
    ours: &Tensor,
    expected: &Tensor,
    expected_f64: Option<&Tensor>,
    rtol: f64,
    atol: f64,
) -> candle_core::Result<OutputReport> {
    compare_with(name, ours, expected, expected_f64, None, (rtol, atol), FACTORS)
}

/// [`compare`] with other factors for rule (b) ([`CONFIRMED_FACTORS`] for an ill-conditioned block
/// whose float64 output our float64 run confirmed).
pub fn compare_with_factors(
    name: &str,
    ours: &Tensor,
    expected: &Tensor,
    expected_f64: Option<&Tensor>,
    (rtol, atol): (f64, f64),
    factors: Factors,
) -> candle_core::Result<OutputReport> {
    compare_with(name, ours, expected, expected_f64, None, (rtol, atol), factors)
}

/// A run in another dtype than the bundle's: rule (a) against the float64 output `reference`, rule
/// (b) with PyTorch's own error in the bundle's dtype (`torch` against `reference`).
pub fn compare_across_dtypes(
    name: &str,
    ours: &Tensor,
    torch: &Tensor,
    reference: &Tensor,
    (rtol, atol): (f64, f64),
    factors: Factors,
) -> candle_core::Result<OutputReport> {
    compare_with(
        name,
        ours,
        reference,
        Some(reference),
        Some(torch),
        (rtol, atol),
        factors,
    )
}

/// `expected` is rule (a)'s anchor; PyTorch's own error is `torch_run` (else `expected`) against
/// `expected_f64`.
fn compare_with(
    name: &str,
    ours: &Tensor,
    expected: &Tensor,
    expected_f64: Option<&Tensor>,
    torch_run: Option<&Tensor>,
    (rtol, atol): (f64, f64),
    factors: Factors,
) -> candle_core::Result<OutputReport> {
    let mut report = OutputReport::unjudged(name, ours.dims(), rtol, atol);
    report.factors = factors;
    if ours.dims() != expected.dims() || torch_run.is_some_and(|t| t.dims() != expected.dims()) {
        report.reason = Some(format!("shape {:?}, PyTorch's is {:?}", ours.dims(), expected.dims()));
        return Ok(report);
    }
    let (a, e) = (values(ours)?, values(expected)?);
    let t = match torch_run {
        Some(t) => values(t)?,
        None => e.clone(),
    };
    let reference = match expected_f64 {
        Some(r) if r.dims() == expected.dims() => Some(values(r)?),
        _ => None,
    };
    count_non_finite(&mut report, &a, &e);
    measure_differences(&mut report, &a, &e, &t, reference.as_deref());
    let sides = Sides {
        ours: &a,
        expected: &e,
        reference: reference.as_deref().map(|r| (r, ErrorModel::new(&t, r))),
    };
    let tally = tally(&sides, rtol, atol, factors);
    judge(&mut report, &sides, &tally, expected.dims());
    Ok(report)
}

impl OutputReport {
    /// The report of `name` before any comparison: failing, with no reason yet.
    fn unjudged(name: &str, shape: &[usize], rtol: f64, atol: f64) -> Self {
        Self {
            name: name.to_string(),
            shape: shape.to_vec(),
            max_abs: f64::NAN,
            max_rel: f64::NAN,
            atol,
            rtol,
            close: false,
            ours_vs_f64: None,
            torch_vs_f64: None,
            pass: false,
            verdict: Verdict::Fail,
            torch_error_elements: 0,
            failed_elements: 0,
            worst: None,
            non_finite: 0,
            torch_non_finite: 0,
            element_factor: None,
            window_factor: None,
            factors: FACTORS,
            reason: None,
            twin_note: None,
            maths: None,
            plausibility: None,
        }
    }

    /// Whether the verdict is inconclusive (neither PASS nor FAIL).
    pub fn inconclusive(&self) -> bool {
        self.verdict == Verdict::Inconclusive
    }

    /// Record the maths check: a float64 run that differs from PyTorch's fails the output, whatever
    /// the comparison in the dtype said.
    pub fn apply_maths(&mut self, maths: MathsReport) {
        if !maths.matches {
            let in_dtype = match &self.reason {
                Some(why) => format!("; in the bundle's dtype: {why}"),
                None => " (in the bundle's dtype our output passes: the difference is below its rounding)".to_string(),
            };
            self.reason = Some(format!("{}{in_dtype}", maths.text()));
            self.pass = false;
            self.verdict = Verdict::Fail;
        }
        self.maths = Some(maths);
    }

    /// Record the plausibility of PyTorch's output: an output that passed by rule (b) against an
    /// implausible PyTorch output is inconclusive.
    pub fn apply_plausibility(&mut self, p: Plausibility) {
        if self.pass && self.verdict == Verdict::TorchError && !p.plausible {
            self.pass = false;
            self.verdict = Verdict::Inconclusive;
            self.reason = Some(format!("inconclusive: {}", p.text()));
        }
        self.plausibility = Some(p);
    }
}

/// The report's summary numbers: the largest absolute and relative differences from `e`, and,
/// with the float64 output `reference`, ours' and PyTorch's (`t`) distance from it.
fn measure_differences(report: &mut OutputReport, a: &[f64], e: &[f64], t: &[f64], reference: Option<&[f64]>) {
    report.max_abs = max_abs_diff(a, e);
    report.max_rel = a
        .iter()
        .zip(e)
        .filter(|(x, y)| **y != 0.0 && !(x.is_nan() && y.is_nan()))
        .map(|(x, y)| (x - y).abs() / y.abs())
        .fold(0.0, f64::max);
    if let Some(r) = reference {
        report.ours_vs_f64 = Some(max_abs_diff(a, r));
        report.torch_vs_f64 = Some(max_abs_diff(t, r));
    }
}

/// The verdict from the elementwise tally: the worst element, pass or fail, and why.
fn judge(report: &mut OutputReport, sides: &Sides, tally: &Tally, dims: &[usize]) {
    let (a, e) = (sides.ours, sides.expected);
    let (rtol, atol) = (report.rtol, report.atol);
    report.verdict = tally.verdict;
    report.close = tally.verdict <= Verdict::Close;
    report.torch_error_elements = tally.torch_error;
    report.failed_elements = tally.failed;
    report.element_factor = tally.element_factor;
    report.window_factor = tally.window_factor;
    report.worst = tally.worst.map(|(i, _)| Element {
        index: unravel(i, dims),
        ours: a[i],
        expected: e[i],
        float64: sides.reference.as_ref().map(|(r, _)| r[i]),
        tolerance: atol + rtol * e[i].abs(),
        torch_error_allowance: sides
            .reference
            .as_ref()
            .map(|(r, model)| atol + rtol * r[i].abs() + model.allowance(i, report.factors.element)),
    });
    let compared = a.iter().zip(e).filter(|(x, y)| x.is_finite() && y.is_finite()).count();
    report.pass = report.non_finite == 0 && compared > 0 && tally.failed == 0;
    if !report.pass {
        report.verdict = Verdict::Fail;
    }
    report.reason = failure_reason(report, a, e, compared);
}

fn count_non_finite(report: &mut OutputReport, a: &[f64], e: &[f64]) {
    let same = |x: &f64, y: &f64| (x.is_nan() && y.is_nan()) || x == y;
    report.non_finite = a.iter().zip(e).filter(|(x, y)| !x.is_finite() && !same(x, y)).count();
    report.torch_non_finite = a.iter().zip(e).filter(|(x, y)| x.is_finite() && !y.is_finite()).count();
}

/// The one-line reason of a failed output.
fn failure_reason(report: &OutputReport, a: &[f64], e: &[f64], compared: usize) -> Option<String> {
    let len = a.len();
    if report.pass {
        return None;
    }
    if compared == 0 && report.non_finite == 0 {
        return Some(if len == 0 {
            "the output is empty: nothing to compare".to_string()
        } else {
            format!("no finite value to compare: all {len} of PyTorch's values are NaN or inf, and ours the same")
        });
    }
    if report.non_finite > 0 {
        return Some(non_finite_reason(a, e, report.non_finite));
    }
    if report.torch_non_finite > 0 {
        return Some(format!(
            "PyTorch's output has {} NaN or inf values where ours is finite",
            report.torch_non_finite
        ));
    }
    let w = report.worst.as_ref()?;
    let (atol, rtol) = (report.atol, report.rtol);
    let head = format!(
        "{} of {len} elements fail; worst at {:?}: ours {:.6e}, expected {:.6e}, |diff| {:.3e} > atol {atol:.1e} + rtol {rtol:.1e}·|expected| = {:.3e}",
        report.failed_elements,
        w.index,
        w.ours,
        w.expected,
        (w.ours - w.expected).abs(),
        w.tolerance
    );
    Some(match (w.float64, w.torch_error_allowance) {
        (Some(r), Some(allow)) => format!(
            "{head}; against float64, |ours − float64| {:.3e}{}",
            (w.ours - r).abs(),
            rule_b_text(report, allow)
        ),
        _ => format!("{head} (no float64 output in the bundle)"),
    })
}

/// Why rule (b) did not accept the output: the element's allowance, and our error against
/// PyTorch's as the rule's two factors measure them.
fn rule_b_text(report: &OutputReport, allow: f64) -> String {
    let factor = |f: Option<f64>| match f {
        Some(f) if f.is_infinite() => "∞ (PyTorch exact all around)".to_string(),
        Some(f) => format!("{f:.3}"),
        None => "-".to_string(),
    };
    let Factors { element, window } = report.factors;
    format!(
        " (rule (b) allows {allow:.3e} there: atol + rtol·|float64| + {element} × PyTorch's RMS error within \
         {NEIGHBOURHOOD} places, relative to the local magnitude); our error is up to {} × PyTorch's at one element \
         (at most {element}) and {} × as an RMS over a neighbourhood (at most {window})",
        factor(report.element_factor),
        factor(report.window_factor)
    )
}

/// Under `--strict`, an output that passed only within PyTorch's own error (rule (b)) fails.
pub fn apply_strict(report: &mut OutputReport) {
    let by_rule_b = (report.pass && report.verdict == Verdict::TorchError) || report.verdict == Verdict::Inconclusive;
    if by_rule_b {
        report.pass = false;
        report.verdict = Verdict::Fail;
        report.reason = Some(format!(
            "--strict: {} elements are neither equal to PyTorch's output nor within atol {:.1e} + rtol {:.1e}·|expected| \
             of it (they are within PyTorch's own error against float64, rule (b), which --strict does not accept)",
            report.torch_error_elements, report.atol, report.rtol
        ));
    }
}

/// How many elements of `t` are NaN or infinite.
pub fn count_non_finite_values(t: &Tensor) -> candle_core::Result<usize> {
    Ok(values(t)?.iter().filter(|x| !x.is_finite()).count())
}

/// `non-finite output: N of our values are NaN or inf (n NaN, m inf) where PyTorch's is finite`.
fn non_finite_reason(a: &[f64], e: &[f64], non_finite: usize) -> String {
    let same = |x: &f64, y: &f64| (x.is_nan() && y.is_nan()) || x == y;
    let bad: Vec<(&f64, &f64)> = a.iter().zip(e).filter(|(x, y)| !x.is_finite() && !same(x, y)).collect();
    let where_torch_finite = bad.iter().filter(|(_, y)| y.is_finite()).count();
    let nan = bad.iter().filter(|(x, _)| x.is_nan()).count();
    let elsewhere = non_finite - where_torch_finite;
    let tail = if elsewhere > 0 {
        format!(" or, for {elsewhere} of them, a different non-finite value")
    } else {
        String::new()
    };
    format!(
        "non-finite output: {non_finite} of our values are NaN or inf ({nan} NaN, {} inf) where PyTorch's is finite{tail}",
        non_finite - nan
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    fn tensor(v: &[f64]) -> Tensor {
        Tensor::from_vec(v.to_vec(), v.len(), &Device::Cpu).unwrap()
    }

    /// A small deterministic generator (xorshift), so the cases are the same on every run.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> f64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    /// Whenever `compare` says PASS, every element meets the documented rule, checked naively
    /// (the scale as the block median, the RMS windows summed directly); and an element that meets
    /// neither rule makes the output fail.
    #[test]
    fn pass_means_every_element_meets_the_rule() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let (rtol, atol) = (1e-3, 1e-5);
        let mut passes = 0;
        for case in 0..400 {
            let n = 1 + (rng.next() * 300.0) as usize;
            let r: Vec<f64> = (0..n).map(|_| rng.next() * 4.0 - 2.0).collect();
            // PyTorch's error: small everywhere, large at one place in some cases.
            let t: Vec<f64> = r
                .iter()
                .enumerate()
                .map(|(i, x)| x + (rng.next() - 0.5) * if i == n / 2 && case % 3 == 0 { 1e-1 } else { 1e-4 })
                .collect();
            let o: Vec<f64> = r
                .iter()
                .map(|x| x + (rng.next() - 0.5) * 10f64.powf(-2.0 - 3.0 * rng.next()))
                .collect();
            let report = compare("x", &tensor(&o), &tensor(&t), Some(&tensor(&r)), rtol, atol).unwrap();
            let scale: Vec<f64> = (0..n)
                .map(|i| {
                    let b = i / model::MAGNITUDE_BLOCK * model::MAGNITUDE_BLOCK;
                    let mut block: Vec<f64> = r[b..(b + model::MAGNITUDE_BLOCK).min(n)]
                        .iter()
                        .map(|x| x.abs())
                        .collect();
                    block.sort_by(f64::total_cmp);
                    r[i].abs().max(block[block.len() / 2])
                })
                .collect();
            let window = |i: usize| i.saturating_sub(NEIGHBOURHOOD)..(i + NEIGHBOURHOOD + 1).min(n);
            let rms = |f: &dyn Fn(usize) -> f64, i: usize| {
                (window(i).map(|j| f(j).powi(2)).sum::<f64>() / window(i).len() as f64).sqrt()
            };
            let u = |j: usize| (t[j] - r[j]).abs() / scale[j];
            let v = |j: usize| ((o[j] - r[j]).abs() - atol - rtol * r[j].abs()).max(0.0) / scale[j];
            let allowed = |i: usize| {
                let torch = rms(&u, i);
                o[i] == t[i]
                    || (o[i] - t[i]).abs() <= atol + rtol * t[i].abs()
                    || (v(i) <= FACTORS.element * torch * (1.0 + 1e-9)
                        && rms(&v, i) <= FACTORS.window * torch * (1.0 + 1e-9))
            };
            let all = (0..n).all(allowed);
            assert_eq!(report.pass, all, "case {case}: {:?}", report.reason);
            assert_eq!(report.failed_elements, (0..n).filter(|&i| !allowed(i)).count());
            passes += usize::from(all);
        }
        // Both outcomes occur, so the comparison above is not vacuous.
        assert!(passes > 40 && passes < 360, "{passes} of 400 passed");
    }

    /// PyTorch's error is large at one element only (an outlier's own rounding); ours is off by a
    /// little everywhere, the outlier's neighbours included: every element but the outlier fails.
    #[test]
    fn an_error_at_a_huge_element_licenses_nothing_around_it() {
        let n = 400;
        let mut r: Vec<f64> = (0..n).map(|i| (i as f64 * 0.37).sin()).collect();
        r[5] = 1e6;
        let mut t: Vec<f64> = r.iter().map(|x| x + x * 1e-7).collect();
        t[5] += 0.06;
        let mut o: Vec<f64> = r.iter().map(|x| x + 1e-3).collect();
        o[5] = t[5];
        let report = compare("x", &tensor(&o), &tensor(&t), Some(&tensor(&r)), 1.3e-6, 1e-5).unwrap();
        assert!(!report.pass);
        assert_eq!(report.failed_elements, n - 1);
    }

    #[test]
    fn verdicts_rank_identical_close_torch_error() {
        let r = [1.0, 2.0, 3.0];
        let t = [1.0 + 1e-3, 2.0 - 1e-3, 3.0 + 1e-3];
        let v = |o: &[f64]| {
            compare("x", &tensor(o), &tensor(&t), Some(&tensor(&r)), 1e-6, 1e-6)
                .unwrap()
                .verdict
        };
        assert_eq!(v(&t), Verdict::Identical);
        assert_eq!(v(&[1.0 + 1e-3 + 1e-7, 2.0 - 1e-3, 3.0 + 1e-3]), Verdict::Close);
        assert_eq!(v(&[1.0 - 1e-3, 2.0 + 1e-3, 3.0 - 1e-3]), Verdict::TorchError);
        assert_eq!(v(&[1.0 + 1e-1, 2.0, 3.0]), Verdict::Fail);
        // A bias about twelve times PyTorch's error everywhere: within the element factor, beyond
        // the window's.
        let biased = compare(
            "x",
            &tensor(&[1.012, 2.012, 3.012]),
            &tensor(&t),
            Some(&tensor(&r)),
            1e-6,
            1e-6,
        )
        .unwrap();
        assert!(biased.element_factor.unwrap() < FACTORS.element, "{biased:?}");
        assert_eq!(biased.verdict, Verdict::Fail);
    }

    #[test]
    fn a_twin_beyond_the_dtypes_rounding_is_refused() {
        let t = tensor(&[1.0, 2.0, -3.0, 0.5]);
        let close = tensor(&[1.0, 2.0 + 1e-6, -3.0, 0.5]);
        assert!(check_reference(&t, &close, DType::F32).unwrap().is_ok());
        // Beyond the elementwise bound at one element: refused, and the element named.
        let far = tensor(&[1.0, 2.0, -3.0 + 100.0 * 3.0 * epsilon(DType::F32), 0.5]);
        let why = check_reference(&t, &far, DType::F32).unwrap().unwrap_err().to_string();
        assert!(why.contains("[2]"), "{why}");
        // Within the elementwise bound everywhere, beyond the RMS bound.
        let wide: Vec<f64> = (0..200).map(|i| 1.0 + (i % 3) as f64).collect();
        let shifted: Vec<f64> = wide.iter().map(|x| x * (1.0 + 10.0 * epsilon(DType::F16))).collect();
        let why = check_reference(&tensor(&wide), &tensor(&shifted), DType::F16)
            .unwrap()
            .unwrap_err()
            .to_string();
        assert!(why.contains("RMS"), "{why}");
    }

    /// The twin's bound is local: one huge element does not widen what the others may differ by.
    #[test]
    fn a_huge_element_does_not_widen_the_twins_bound_elsewhere() {
        let mut t: Vec<f64> = (0..300).map(|i| (i as f64 * 0.1).cos()).collect();
        t[7] = 1e6;
        let mut r = t.clone();
        r[200] += 0.01;
        let why = check_reference(&tensor(&t), &tensor(&r), DType::F32)
            .unwrap()
            .unwrap_err()
            .to_string();
        assert!(why.contains("[200]"), "{why}");
    }
}
