//! The pass rule of a check: rule (a)'s tolerances (the options', the bundle's or the run
//! dtype's defaults, and `--strict`'s refusal of looser ones), and our outputs compared with
//! the bundle's PyTorch outputs in the bundle's dtype or, for a run in another dtype, with its
//! float64 outputs (see [`super`]'s module docs). The PyTorch side is the bundle's recorded
//! outputs: `scripts/parity_bundle.py`'s export.

use super::{dtype_name, Options};
use crate::bundle::Bundle;
use crate::compare::{check_reference, compare, default_tolerance, OutputReport, Verdict, ERROR_FACTOR};
use crate::error::{ParityError, Result};
use candle_core::DType;

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

/// Under `--strict`, an output that passed only within PyTorch's own error (rule (b)) fails.
pub(crate) fn apply_strict(report: &mut OutputReport) {
    if report.pass && report.verdict == Verdict::TorchError {
        report.pass = false;
        report.verdict = Verdict::Fail;
        report.reason = Some(format!(
            "--strict: {} elements are neither equal to PyTorch's output nor within atol {:.1e} + rtol {:.1e}·|expected| \
             of it (they are within {ERROR_FACTOR} × PyTorch's own error against float64, which --strict does not accept)",
            report.torch_error_elements, report.atol, report.rtol
        ));
    }
}

/// Our outputs (on the CPU, in the bundle's output order) against the bundle's, under the pass
/// rule of the run's dtype (see the module docs).
pub(crate) fn compare_outputs(
    bundle: &Bundle,
    block: &str,
    ours: &[candle_core::Tensor],
    dtype: DType,
    bundle_dtype: DType,
    rtol: f64,
    atol: f64,
) -> Result<Vec<OutputReport>> {
    let path = bundle.path.as_path();
    let mut outputs = vec![];
    for (name, ours) in bundle.outputs.iter().zip(ours) {
        let torch = bundle.output(name).ok_or_else(|| {
            ParityError::bundle(
                path,
                format!("`parity.outputs` names `{name}` but tensor `parity.output.{name}` is missing"),
            )
        })?;
        let torch_f64 = bundle.output_f64(name);
        if let Some(reference) = torch_f64 {
            check_reference(torch, reference, bundle_dtype)
                .map_err(|e| ParityError::block(path, block, e))?
                .map_err(|why| ParityError::bundle(path, format!("output `{name}`: {why}")))?;
        }
        let report = if dtype == bundle_dtype {
            compare(name, ours, torch, torch_f64, rtol, atol)
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
            compare_across_dtypes(name, ours, torch, reference, dtype, rtol, atol)
        }
        .map_err(|e| ParityError::block(path, block, e))?;
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
    rtol: f64,
    atol: f64,
) -> candle_core::Result<OutputReport> {
    if dtype == DType::F64 {
        return compare(name, ours, reference, None, rtol, atol);
    }
    let mut report = crate::compare::compare_across_dtypes(name, ours, torch, reference, rtol, atol)?;
    report.reason = report.reason.map(|why| {
        format!(
            "run in {} against the float64 output, with PyTorch's own error in the bundle's dtype: {why}",
            dtype_name(dtype)
        )
    });
    Ok(report)
}
