//! The pass rule of a check: rule (a)'s tolerances (the options', the bundle's or the run
//! dtype's defaults, and `--strict`'s refusal of looser ones), and our outputs compared with
//! the bundle's PyTorch outputs in the bundle's dtype or, for a run in another dtype, with its
//! float64 outputs (see [`super`]'s module docs). The PyTorch side is the bundle's recorded
//! outputs: `scripts/parity_bundle.py`'s export.

use super::{dtype_name, Options};
use crate::bundle::Bundle;
pub(crate) use crate::compare::apply_strict;
use crate::compare::{
    check_reference, compare, compare_with_factors, confirm_twin, default_tolerance, Factors, OutputReport,
    TwinProblem, CONFIRMED_FACTORS, FACTORS,
};
use crate::error::{ParityError, Result};
use candle_core::DType;
use std::path::Path;

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

/// Our float64 outputs, computed on first use: what confirms a float64 twin that PyTorch's own
/// error puts beyond rounding ([`crate::compare::confirm_twin`]). `None` where there is no float64
/// run (a user's port).
pub(crate) type Float64Run<'a> = Option<&'a mut dyn FnMut() -> Result<Vec<candle_core::Tensor>>>;

/// Our outputs (on the CPU, in the bundle's output order) against the bundle's, under the pass
/// rule of the run's dtype (see the module docs).
#[allow(clippy::too_many_arguments)]
pub(crate) fn compare_outputs(
    bundle: &Bundle,
    block: &str,
    ours: &[candle_core::Tensor],
    dtype: DType,
    bundle_dtype: DType,
    rtol: f64,
    atol: f64,
    mut float64_run: Float64Run,
) -> Result<Vec<OutputReport>> {
    let path = bundle.path.as_path();
    let mut outputs = vec![];
    let mut ours64: Option<Vec<candle_core::Tensor>> = None;
    for (index, (name, ours)) in bundle.outputs.iter().zip(ours).enumerate() {
        let torch = bundle.output(name).ok_or_else(|| {
            ParityError::bundle(
                path,
                format!("`parity.outputs` names `{name}` but tensor `parity.output.{name}` is missing"),
            )
        })?;
        let torch_f64 = bundle.output_f64(name);
        let mut twin_note = None;
        if let Some(reference) = torch_f64 {
            let problem =
                check_reference(torch, reference, bundle_dtype).map_err(|e| ParityError::block(path, block, e))?;
            match problem {
                Ok(()) => {}
                Err(TwinProblem::Unusable(why)) => {
                    return Err(ParityError::bundle(path, format!("output `{name}`: {why}")))
                }
                Err(TwinProblem::BeyondRounding(why)) => {
                    let run = float64_run.as_mut().ok_or_else(|| {
                        ParityError::bundle(
                            path,
                            format!("output `{name}`: {why} (and no float64 run of the port can confirm it)"),
                        )
                    })?;
                    if ours64.is_none() {
                        ours64 = Some(run()?);
                    }
                    let mine = ours64.as_ref().and_then(|o| o.get(index)).ok_or_else(|| {
                        ParityError::bundle(
                            path,
                            format!("output `{name}`: {why} (our float64 run returned no such output)"),
                        )
                    })?;
                    confirm_twin(mine, torch, reference)
                        .map_err(|e| ParityError::block(path, block, e))?
                        .map_err(|not| ParityError::bundle(path, format!("output `{name}`: {why}; {not}")))?;
                    twin_note = Some(format!(
                        "PyTorch's own error is beyond rounding in {} (an ill-conditioned block); its float64 output \
                         was confirmed by our float64 run",
                        dtype_name(bundle_dtype)
                    ));
                }
            }
        }
        let factors = if twin_note.is_some() {
            CONFIRMED_FACTORS
        } else {
            FACTORS
        };
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
        report.twin_note = twin_note;
        outputs.push(report);
    }
    Ok(outputs)
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
