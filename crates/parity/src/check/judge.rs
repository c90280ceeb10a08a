//! The pass rule of a check: rule (a)'s tolerances (the options', the bundle's or the run
//! dtype's defaults, and `--strict`'s refusal of looser ones), and our outputs compared with
//! the bundle's PyTorch outputs in the bundle's dtype or, for a run in another dtype, with its
//! float64 outputs (see [`super`]'s module docs). The PyTorch side is the bundle's recorded
//! outputs: `scripts/parity_bundle.py`'s export.

use super::{dtype_name, Options};
use crate::bundle::Bundle;
pub(crate) use crate::compare::apply_strict;
use crate::compare::{
    check_reference, compare, compare_with_factors, default_tolerance, maths_check, plausibility, Factors, Float64Runs,
    MathsReport, OutputReport, TwinProblem, CONFIRMED_FACTORS, FACTORS,
};
use crate::error::{ParityError, Result};
use candle_core::DType;
use std::path::Path;
use unet_attention::float64_run::{Casts, Embeddings, Float64Run as F64Settings, StepsMet};

/// Rule (a)'s tolerances for a run: the options', else the bundle's (in its own dtype only), else
/// the run dtype's defaults; with each one above its default named in `loosened`.
pub(crate) struct Tolerances {
    pub(crate) rtol: f64,
    pub(crate) atol: f64,
    pub(crate) loosened: Vec<String>,
}

pub(crate) fn tolerances(bundle: &Bundle, opts: &Options, dtype: DType, bundle_dtype: DType) -> Result<Tolerances> {
    let (def_rtol, def_atol) = default_tolerance(dtype);
    let same_dtype = dtype == bundle_dtype;
    let mut loosened = vec![];
    let mut pick = |name: &str, flag: Option<f64>, from_bundle: Option<f64>, default: f64| {
        let (value, source) = match (flag, from_bundle.filter(|_| same_dtype)) {
            (Some(v), _) => (v, format!("--{name}")),
            (None, Some(v)) => (v, format!("the bundle (parity.{name})")),
            (None, None) => (default, String::new()),
        };
        if value > default {
            loosened.push(format!("{name} {value:e} from {source} (default {default:e})"));
        }
        value
    };
    let rtol = pick("rtol", opts.rtol, bundle.rtol, def_rtol);
    let atol = pick("atol", opts.atol, bundle.atol, def_atol);
    if opts.strict && !loosened.is_empty() {
        return Err(ParityError::bundle(
            &bundle.path,
            format!(
                "--strict refuses tolerances above {}'s defaults: {}",
                dtype_name(dtype),
                loosened.join(", ")
            ),
        ));
    }
    Ok(Tolerances { rtol, atol, loosened })
}

/// Our float64 run of the block under the given twin convention (on the CPU, in the bundle's
/// output order) and the float32 steps it met (`unet_attention::float64_run`). `None` where there
/// is no float64 run (a user's port).
pub(crate) type Float64Run<'a> = Option<&'a mut dyn FnMut(F64Settings) -> Result<(Vec<candle_core::Tensor>, StepsMet)>>;

/// Our float64 runs, each computed on first use: as PyTorch builds its float32 embeddings, with
/// them exact (where the block has any), and with the published casts kept (where it has any).
struct OurFloat64<'a, 'r> {
    path: &'a Path,
    block: &'a str,
    run: Float64Run<'r>,
    plain: Option<(Vec<candle_core::Tensor>, StepsMet)>,
    exact: Option<Vec<candle_core::Tensor>>,
    kept: Option<Vec<candle_core::Tensor>>,
}

impl OurFloat64<'_, '_> {
    fn available(&self) -> bool {
        self.run.is_some()
    }

    fn get(&mut self, settings: F64Settings) -> Result<(Vec<candle_core::Tensor>, StepsMet)> {
        match self.run.as_mut() {
            Some(run) => run(settings),
            None => Ok((vec![], StepsMet::default())),
        }
    }

    /// Run what output `index`'s maths check needs: the plain run, and the one with exact
    /// embeddings where the block builds float32 ones.
    fn prepare(&mut self) -> Result<StepsMet> {
        if self.plain.is_none() {
            self.plain = Some(self.get(F64Settings::default())?);
        }
        let met = self.plain.as_ref().map(|(_, m)| *m).unwrap_or_default();
        if met.embeddings && self.exact.is_none() {
            let settings = F64Settings {
                embeddings: Embeddings::Exact,
                ..Default::default()
            };
            self.exact = Some(self.get(settings)?.0);
        }
        Ok(met)
    }

    /// The check of output `index` of `runs` (`plain` or `kept`) under `convention`.
    fn check(
        &self,
        runs: Option<&Vec<candle_core::Tensor>>,
        convention: &str,
        index: usize,
        (torch, reference, dtype): (&candle_core::Tensor, &candle_core::Tensor, DType),
    ) -> Result<Option<MathsReport>> {
        let Some(ours64) = runs.and_then(|r| r.get(index)) else {
            return Ok(None);
        };
        let plain = self.plain.as_ref().and_then(|(p, _)| p.get(index));
        let exact = self.exact.as_ref().and_then(|e| e.get(index));
        // Under the kept convention, the casts' effect: this run against the plain one.
        let casts = plain.filter(|p| !std::ptr::eq(*p, ours64)).map(|p| (ours64, p));
        let runs = Float64Runs {
            ours64,
            embeddings: plain.zip(exact),
            casts,
            convention,
        };
        maths_check(&runs, torch, reference, dtype)
            .map(Some)
            .map_err(|e| ParityError::block(self.path, self.block, e))
    }

    /// The maths check of output `index` ([`crate::compare::maths`]): against the exporters'
    /// convention, then a plain `.double()`'s where the block has published casts and the first
    /// does not match; the better of the two.
    fn maths(
        &mut self,
        index: usize,
        torch: &candle_core::Tensor,
        reference: &candle_core::Tensor,
        dtype: DType,
    ) -> Result<Option<MathsReport>> {
        let met = self.prepare()?;
        let sides = (torch, reference, dtype);
        let plain = self.plain.as_ref().map(|(p, _)| p);
        let Some(off) = self.check(plain, "casts off", index, sides)? else {
            return Ok(None);
        };
        if off.matches || !met.casts {
            return Ok(Some(off));
        }
        if self.kept.is_none() {
            let settings = F64Settings {
                casts: Casts::Kept,
                ..Default::default()
            };
            // PyTorch cannot run some blocks with the casts kept (diffusers' `upcast_attention`
            // under a mask: `baddbmm` of a float64 mask and a float32 query), so no such twin
            // exists; our run errs the same way, and only the exporters' convention is tried.
            self.kept = Some(self.get(settings).map(|(outs, _)| outs).unwrap_or_default());
        }
        let kept = self.check(self.kept.as_ref(), "casts kept", index, sides)?;
        Ok(crate::compare::maths::best(std::iter::once(off).chain(kept).collect()))
    }

    /// Our plain float64 output `index`, once computed.
    fn plain_output(&self, index: usize) -> Option<&candle_core::Tensor> {
        self.plain.as_ref().and_then(|(p, _)| p.get(index))
    }
}

/// Our outputs (on the CPU, in the bundle's output order) against the bundle's, under the pass
/// rule of the run's dtype (see the module docs): rule (a) and (b) in the dtype, the maths check
/// of our float64 run where there is one, the plausibility of PyTorch's output where an output
/// passed by rule (b).
#[allow(clippy::too_many_arguments)]
pub(crate) fn compare_outputs(
    bundle: &Bundle,
    block: &str,
    ours: &[candle_core::Tensor],
    dtype: DType,
    bundle_dtype: DType,
    rtol: f64,
    atol: f64,
    float64_run: Float64Run,
) -> Result<Vec<OutputReport>> {
    let path = bundle.path.as_path();
    let mut ours64 = OurFloat64 {
        path,
        block,
        run: float64_run,
        plain: None,
        exact: None,
        kept: None,
    };
    let mut outputs = vec![];
    for (index, (name, ours)) in bundle.outputs.iter().zip(ours).enumerate() {
        let torch = bundle.output(name).ok_or_else(|| {
            ParityError::bundle(
                path,
                format!("`parity.outputs` names `{name}` but tensor `parity.output.{name}` is missing"),
            )
        })?;
        let torch_f64 = bundle.output_f64(name);
        let (mut beyond, mut maths) = (None, None);
        if let Some(reference) = torch_f64 {
            match check_reference(torch, reference, bundle_dtype).map_err(|e| ParityError::block(path, block, e))? {
                Ok(()) => {}
                Err(TwinProblem::Unusable(why)) => {
                    return Err(ParityError::bundle(path, format!("output `{name}`: {why}")))
                }
                Err(TwinProblem::BeyondRounding(why)) => beyond = Some(why),
            }
            if ours64.available() && dtype != DType::F64 {
                maths = ours64.maths(index, torch, reference, bundle_dtype)?;
            }
            // `--dtype f64` compares our float64 run with the twin directly, at float64's tolerances:
            // the twin needs no confirmation there.
            if let Some(why) = beyond.as_ref().filter(|_| dtype != DType::F64) {
                beyond_twin(path, name, why, maths.as_ref(), || {
                    let o64 = ours64.plain_output(index)?;
                    crate::compare::maths::twin_is_the_odd_one(torch, reference, o64).ok()
                })?;
            }
        }
        let confirmed = beyond.is_some() && maths.as_ref().is_some_and(|m| m.matches);
        let factors = if confirmed { CONFIRMED_FACTORS } else { FACTORS };
        let mut report = if dtype == bundle_dtype {
            compare_with_factors(name, ours, torch, torch_f64, (rtol, atol), factors)
        } else {
            let reference = torch_f64.ok_or_else(|| {
                ParityError::bundle(
                    path,
                    format!(
                        "--dtype {} needs `parity.output.{name}.float64` to compare a run in another dtype than \
                         the bundle's, and the bundle lacks it",
                        dtype_name(dtype)
                    ),
                )
            })?;
            compare_across_dtypes(name, ours, torch, reference, dtype, (rtol, atol), factors)
        }
        .map_err(|e| ParityError::block(path, block, e))?;
        if confirmed {
            report.twin_note = Some(format!(
                "PyTorch's own error is beyond rounding in {} (an ill-conditioned block); its float64 output was \
                 confirmed by our float64 run",
                dtype_name(bundle_dtype)
            ));
        }
        if let Some(m) = maths {
            report.apply_maths(m);
        }
        if let (Some(reference), true) = (torch_f64, dtype == bundle_dtype) {
            let p = plausibility(ours, torch, reference, dtype, beyond.is_some())
                .map_err(|e| ParityError::block(path, block, e))?;
            report.apply_plausibility(p);
        }
        outputs.push(report);
    }
    Ok(outputs)
}

/// A float64 output beyond the twin bounds (`why`) is usable only once our float64 run matches it
/// (`maths`): with no float64 run of the port, or where PyTorch's own output is closer to our
/// float64 run than to it (`twin_is_odd`), the bundle is refused; where our float64 run differs
/// and PyTorch's output does not side with it, the maths check fails the output.
fn beyond_twin(
    path: &Path,
    name: &str,
    why: &str,
    maths: Option<&MathsReport>,
    twin_is_odd: impl FnOnce() -> Option<bool>,
) -> Result<()> {
    match maths {
        None => Err(ParityError::bundle(
            path,
            format!("output `{name}`: {why} (and no float64 run of the port can confirm it)"),
        )),
        Some(m) if !m.matches && twin_is_odd().unwrap_or(false) => Err(ParityError::bundle(
            path,
            format!(
                "output `{name}`: {why}; {}; and PyTorch's output is closer to our float64 run than to its own float64 \
                 output: the float64 output is not PyTorch's float64 run of this block",
                m.text()
            ),
        )),
        Some(_) => Ok(()),
    }
}

/// The comparison of a run in `dtype`, another dtype than the bundle's (see the module docs):
/// rule (a) against the float64 output `reference`; rule (b) with PyTorch's own error at the
/// bundle's dtype (`torch` against `reference`) in each element's neighbourhood. f64 runs: rule (a)
/// only.
fn compare_across_dtypes(
    name: &str,
    ours: &candle_core::Tensor,
    torch: &candle_core::Tensor,
    reference: &candle_core::Tensor,
    dtype: DType,
    (rtol, atol): (f64, f64),
    factors: Factors,
) -> candle_core::Result<OutputReport> {
    if dtype == DType::F64 {
        return compare(name, ours, reference, None, rtol, atol);
    }
    let mut report = crate::compare::compare_across_dtypes(name, ours, torch, reference, (rtol, atol), factors)?;
    report.reason = report.reason.map(|why| {
        format!(
            "run in {} against the float64 output, with PyTorch's own error in the bundle's dtype: {why}",
            dtype_name(dtype)
        )
    });
    Ok(report)
}

/// The unit roundoff of a float dtype: larger is less precise.
fn roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::BF16 => 2f64.powi(-8),
        DType::F16 => 2f64.powi(-11),
        DType::F32 => 2f64.powi(-24),
        _ => 2f64.powi(-53),
    }
}

/// A failed output of a run in a lower precision than the bundle's (`--dtype bf16` on an f32
/// bundle) is told why that run may fail by design, and where a check in that dtype is: rule (a)
/// holds it to the run dtype's tolerances against the float64 output, and rule (b) licenses only
/// PyTorch's own error in the bundle's (higher) precision, which the run's rounding exceeds.
pub(crate) fn explain_lower_precision(outputs: &mut [OutputReport], path: &Path, dtype: DType, bundle_dtype: DType) {
    if roundoff(dtype) <= roundoff(bundle_dtype) {
        return;
    }
    let (run, ours) = (dtype_name(dtype), dtype_name(bundle_dtype));
    let twin = path
        .file_stem()
        .map(|stem| path.with_file_name(format!("{}_{run}.safetensors", stem.to_string_lossy())))
        .filter(|p| p.is_file());
    let next = match twin {
        Some(twin) => format!(
            "check its {run} twin, {}, which holds PyTorch's own {run} output",
            twin.display()
        ),
        None => format!(
            "check a bundle exported in {run}, which holds PyTorch's own {run} output (export_bundle(..., \
             dtype=torch.{}), docs/exporting.md; the committed bundles have `_f16`/`_bf16` twins)",
            if dtype == DType::BF16 { "bfloat16" } else { "float16" }
        ),
    };
    let note = format!(
        ". This may fail by design: a {run} run of this {ours} bundle is judged against its float64 twin at {run}'s \
         tolerances, and rule (b) allows only PyTorch's own {ours} error, which {run} rounding exceeds, even where \
         the block rounds exactly as PyTorch does in {run}. To check {run}, {next}"
    );
    for o in outputs.iter_mut().filter(|o| !o.pass) {
        if let Some(reason) = o.reason.as_mut() {
            reason.push_str(&note);
        }
    }
}
