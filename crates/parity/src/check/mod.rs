//! Checking one bundle: build the block from its config and weights, run it on the bundle's
//! inputs, and compare with PyTorch's outputs under the pass rule.
//!
//! **Running in another dtype** (`Options::dtype` differing from the bundle's `parity.dtype`):
//! the weights and float inputs are cast to the run dtype, and our output is compared with the
//! bundle's float64 output (required), never with PyTorch's output in the bundle's dtype:
//! * f64: rule (a) at float64 tolerances (`1e-7`/`1e-7`) only: a float64 port must reproduce
//!   PyTorch's float64 run;
//! * f32, f16, bf16: rule (a) at the run dtype's tolerances against the float64 output, or rule (b)
//!   element by element with PyTorch's own error at the *bundle's* dtype (`|torch − float64|`, the
//!   only PyTorch error the bundle holds) in each element's neighbourhood ([`crate::compare`]).
//!   Running more precisely than the bundle (an f16 bundle in f32) must therefore be about as
//!   accurate as PyTorch in the bundle's dtype; running less precisely (an f32 bundle in f16) is
//!   held to PyTorch's f32 error and normally fails: check an f16/bf16 bundle itself for PyTorch's
//!   half-precision error.
//!
//! **Mixed-dtype bundles**: an f16/bf16 bundle may store some inputs in f32 (PyTorch was given them
//! in f32, e.g. guided-diffusion's `emb` under `convert_to_fp16`). Run in the bundle's own dtype,
//! those inputs reach the block in f32, unconverted; the weights are loaded in the run dtype (an f32
//! conv weight of such a bundle would be reported as converted), except where a block loads them
//! in its compute dtype (GroupNorm, the openai `ResBlock`'s `emb_layers`).
//!
//! Split by step: `judge` (the pass rule: tolerances, `--strict`, the output comparison) and
//! `weights` (where the weights and config come from, and the weights left unread).

mod judge;
mod weights;

pub(crate) use judge::{apply_strict, compare_outputs, explain_lower_precision, tolerances, Float64Run, Tolerances};
pub(crate) use weights::{referenced_checkpoint, weight_source};

use crate::bundle::Bundle;
use crate::compare::{Outcome, OutputReport};
use crate::error::{ParityError, Result};
use crate::registry::{self, BlockInfo, Inputs, Runnable};
use crate::trace::{self, TraceReport};
use crate::weights::{Conversion, TrackedWeights};
use candle_core::{DType, Device};
use serde::Serialize;
use std::path::{Path, PathBuf};
use unet_attention::float64_run::StepsMet;
use weights::{block_config, check_finite, check_unused};

/// Weights taken from a whole checkpoint instead of the bundle (`--weights FILE --prefix P`).
#[derive(Debug, Clone)]
pub struct WeightsFrom {
    pub file: PathBuf,
    pub prefix: String,
}

/// How to run the checks.
#[derive(Debug, Clone)]
pub struct Options {
    /// Override the bundle's absolute tolerance.
    pub atol: Option<f64>,
    /// Override the bundle's relative tolerance.
    pub rtol: Option<f64>,
    /// Run in this dtype instead of the bundle's (`F64` compares with the float64 outputs).
    pub dtype: Option<DType>,
    /// Do not fail on weights the block did not use.
    pub allow_unused: bool,
    /// Where the blocks run (the CPU by default). Outputs come back to the CPU to be compared.
    pub device: Device,
    /// Load the block's weights from this checkpoint (overrides the bundle's own or referenced
    /// weights).
    pub weights: Option<WeightsFrom>,
    /// A diffusers model `config.json` (UNet2DModel, UNet2DConditionModel, AutoencoderKL): the
    /// mid block's config comes from it instead of `parity.config`.
    pub model_config: Option<PathBuf>,
    /// Accept `config.json` keys the model class does not have.
    pub allow_unknown_config: bool,
    /// Record our stages and compare them with the bundle's `parity.trace.*` ([`crate::trace`]).
    pub trace: bool,
    /// Exactness only: an output passes when it is bit-identical to PyTorch's or within the
    /// dtype's tolerance of it (rule (a)), not by PyTorch's own error (rule (b)); a tolerance above
    /// the dtype's default, from the bundle or the options, is refused.
    pub strict: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            atol: None,
            rtol: None,
            dtype: None,
            allow_unused: false,
            device: Device::Cpu,
            weights: None,
            model_config: None,
            allow_unknown_config: false,
            trace: false,
            strict: false,
        }
    }
}

/// The result of checking one bundle.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub file: String,
    pub block: String,
    /// The dtype the block ran in.
    pub dtype: String,
    /// The bundle's dtype (`parity.dtype`).
    pub bundle_dtype: String,
    /// The device the block ran on: `cpu`, `cuda:N`, `metal:N`.
    pub device: String,
    /// What our outputs were compared with: `pytorch` (the bundle's outputs, rule (a); rule (b)
    /// with the float64 outputs) or `float64` (a run in another dtype, see the module docs).
    pub reference: String,
    /// `name shape` of each input.
    pub inputs: Vec<(String, Vec<usize>)>,
    pub outputs: Vec<OutputReport>,
    pub pass: bool,
    /// `pass`, `fail`, or `inconclusive` (no output failed, and some could not be judged: see the
    /// output's reason).
    pub outcome: Outcome,
    /// Weights and inputs stored in another dtype than the run's, converted for it.
    pub conversions: Vec<Conversion>,
    /// Where the weights came from when not from the bundle: `FILE (prefix `P`)`.
    pub weights: Option<String>,
    /// The `config.json` the block's config came from, when not from the bundle.
    pub config_from: Option<String>,
    /// The stage-by-stage comparison (`--trace`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceReport>,
    /// Tolerances above the dtype's defaults that rule (a) used, and where they came from
    /// (`atol 1e30 from the bundle (default 1e-5)`): shown beside the result.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub loosened: Vec<String>,
}

/// Check one bundle file.
pub fn check_file(path: &Path, opts: &Options) -> Result<Report> {
    // The stage traces are read only to be compared.
    let load = if opts.trace {
        crate::bundle::Load::All
    } else {
        crate::bundle::Load::NoStages
    };
    let bundle = Bundle::read_with(path, load)?;
    check_bundle(&bundle, opts)
}

/// Check a parsed bundle.
pub fn check_bundle(bundle: &Bundle, opts: &Options) -> Result<Report> {
    Ok(run_bundle(bundle, opts)?.report)
}

/// A checked bundle with our tensors: outputs (on the CPU, in the bundle's output order) and,
/// with `Options::trace`, the stages we recorded.
pub struct Run {
    pub report: Report,
    pub ours: Vec<candle_core::Tensor>,
    pub stages: Vec<(String, candle_core::Tensor)>,
}

/// A bundle's block, built from its config and weights, with its inputs ready on the run device:
/// what [`run_bundle`] runs once and `examples/bench_bundle.rs` times.
pub struct Prepared {
    pub block: Box<dyn Runnable>,
    pub inputs: Inputs,
    /// The dtype the block runs in (`Options::dtype`, else the bundle's).
    pub dtype: DType,
    /// The bundle's dtype (`parity.dtype`).
    pub bundle_dtype: DType,
    /// The `config.json` the block's config came from, when not from the bundle.
    pub config_from: Option<String>,
    /// Where the weights came from, and which weights and inputs were converted.
    weights: TrackedWeights,
}

/// Validate a bundle against the registry, build its block and prepare its inputs (cast to the run
/// dtype, on `Options::device`). Fails on weights the block did not use unless
/// `Options::allow_unused`.
pub fn prepare_bundle(bundle: &Bundle, opts: &Options) -> Result<Prepared> {
    prepare_bundle_rounded(bundle, opts, None)
}

/// [`prepare_bundle`] with each weight rounded first to the dtype the run of `rounded_as` converted
/// it to (our float64 run of a half-precision bundle: the weights PyTorch's half module held).
fn prepare_bundle_rounded(bundle: &Bundle, opts: &Options, rounded_as: Option<&TrackedWeights>) -> Result<Prepared> {
    let path = bundle.path.as_path();
    let info = registry::find(&bundle.block).ok_or_else(|| ParityError::UnknownBlock {
        path: path.to_path_buf(),
        id: bundle.block.clone(),
        known: registry::all().iter().map(|b| b.id).collect::<Vec<_>>().join(", "),
    })?;
    check_forward_args(bundle, &info)?;
    bundle.check_values()?;
    let bundle_dtype = bundle.run_dtype()?;
    let dtype = opts.dtype.unwrap_or(bundle_dtype);
    // A run in another dtype is compared with the float64 outputs: known missing before it runs.
    if dtype != bundle_dtype {
        if let Some(name) = bundle.outputs.iter().find(|n| bundle.output_f64(n).is_none()) {
            return Err(ParityError::bundle(
                path,
                format!(
                    "--dtype {} needs `parity.output.{name}.float64` to compare a run in another dtype than \
                     the bundle's ({}), and the bundle lacks it",
                    dtype_name(dtype),
                    dtype_name(bundle_dtype)
                ),
            ));
        }
    }
    let weights = match rounded_as {
        Some(run) => weight_source(bundle, opts)?.rounded_as(run),
        None => weight_source(bundle, opts)?,
    };
    let (config, config_from) = block_config(bundle, opts, info.id, weights.location().as_deref())?;
    let vb = weights.var_builder(dtype, &opts.device);
    let block = (info.build)(vb, &config).map_err(|e| ParityError::block(path, info.id, e))?;
    check_finite(path, &weights)?;
    check_unused(path, info.id, &weights, opts)?;
    let inputs = bundle_inputs(bundle, info.id, &weights, dtype, bundle_dtype, &opts.device)?;
    Ok(Prepared {
        block,
        inputs,
        dtype,
        bundle_dtype,
        config_from,
        weights,
    })
}

/// The bundle's inputs and `parity.kwargs` must be ones the block's forward takes, and every
/// input tensor it stores must be listed in `parity.inputs` (one left out would silently not be
/// given to the block: PyTorch's outputs were computed with it).
fn check_forward_args(bundle: &Bundle, info: &BlockInfo) -> Result<()> {
    let path = bundle.path.as_path();
    let stored_inputs = bundle
        .infos
        .iter()
        .filter_map(|i| i.name.strip_prefix(crate::bundle::INPUT_PREFIX));
    for name in stored_inputs {
        if !bundle.inputs.iter().any(|listed| listed == name) {
            return Err(ParityError::bundle(
                path,
                format!(
                    "tensor `{}{name}` is an input but `parity.inputs` ({}) does not list it; list it or \
                     remove the tensor",
                    crate::bundle::INPUT_PREFIX,
                    bundle.inputs.join(", ")
                ),
            ));
        }
    }
    for name in &bundle.inputs {
        if !info.accepts_input(name) {
            return Err(ParityError::bundle(
                path,
                format!(
                    "input `{name}` is not a forward input of {}; expected some of: {}",
                    info.id,
                    info.inputs.join(", ")
                ),
            ));
        }
    }
    for (name, value) in &bundle.kwargs {
        // An argument left at Python's `None` default changes nothing.
        if !info.kwargs.contains(&name.as_str()) && !value.is_null() {
            let known = if info.kwargs.is_empty() {
                "none".to_string()
            } else {
                info.kwargs.join(", ")
            };
            return Err(ParityError::bundle(
                path,
                format!(
                    "forward argument `{name}` in `parity.kwargs` is not supported by {}; supported: {known}",
                    info.id
                ),
            ));
        }
    }
    Ok(())
}

/// The bundle's inputs as the block gets them: floats in the run dtype (conversions recorded in
/// `weights`), on `device`.
/// Whether a bundle input goes to the run dtype: floats do, except that a half-precision bundle
/// that stores an input in f32 was run by PyTorch with that input in f32 (guided-diffusion's
/// `convert_to_fp16`: `x` half, `emb` f32), so in a run in the bundle's own dtype it is given to
/// the block as stored.
pub(crate) fn input_converts(t: &candle_core::Tensor, dtype: DType, bundle_dtype: DType) -> bool {
    let as_stored = dtype == bundle_dtype && is_half(bundle_dtype) && t.dtype() == DType::F32;
    t.dtype().is_float() && !as_stored
}

fn bundle_inputs(
    bundle: &Bundle,
    block: &'static str,
    weights: &TrackedWeights,
    dtype: DType,
    bundle_dtype: DType,
    device: &Device,
) -> Result<Inputs> {
    let mut tensors = std::collections::BTreeMap::new();
    for name in &bundle.inputs {
        let t = bundle.input(name).ok_or_else(|| {
            ParityError::bundle(
                &bundle.path,
                format!("`parity.inputs` names `{name}` but tensor `parity.input.{name}` is missing"),
            )
        })?;
        let t = if input_converts(t, dtype, bundle_dtype) {
            weights.record_conversion(&format!("{}{name}", crate::bundle::INPUT_PREFIX), t.dtype(), dtype);
            t.to_dtype(dtype)
        } else {
            Ok(t.clone())
        };
        let t = t
            .and_then(|t| t.to_device(device))
            .map_err(|e| ParityError::block(&bundle.path, block, e))?;
        tensors.insert(name.clone(), t);
    }
    Ok(Inputs {
        block,
        tensors,
        kwargs: bundle.kwargs.clone(),
    })
}

/// [`check_bundle`], keeping our outputs and stages (for `show`).
pub fn run_bundle(bundle: &Bundle, opts: &Options) -> Result<Run> {
    let path = bundle.path.as_path();
    let Prepared {
        block,
        inputs,
        dtype,
        bundle_dtype,
        config_from,
        weights,
    } = prepare_bundle(bundle, opts)?;
    let Tolerances { rtol, atol, loosened } = tolerances(bundle, opts, dtype, bundle_dtype)?;
    // Only the stages the bundle holds are kept: the others are never compared, and a whole
    // model records hundreds (their names are still listed).
    let (ours, stages, left_out) = if opts.trace {
        let wanted: std::collections::HashSet<String> = trace::stage_names(bundle)?.into_iter().collect();
        unet_attention::trace::with_trace_keeping(move |name| wanted.contains(name), || block.run(&inputs))
    } else {
        (block.run(&inputs), vec![], vec![])
    };
    // The block in the run dtype is done: its weights go before the float64 runs load theirs.
    drop(block);
    let ours = ours
        .and_then(|outs| {
            Ok(outs
                .iter()
                .map(|t| t.to_device(&Device::Cpu))
                .collect::<candle_core::Result<Vec<_>>>()?)
        })
        .map_err(|e| ParityError::block(path, inputs.block, e))?;
    if ours.len() != bundle.outputs.len() {
        return Err(ParityError::bundle(
            path,
            format!(
                "the bundle lists {} outputs ({}) but {} returns {}",
                bundle.outputs.len(),
                bundle.outputs.join(", "),
                inputs.block,
                ours.len()
            ),
        ));
    }

    // Our float64 runs (on the CPU), for the maths check: built once, run under each twin
    // convention asked for.
    let mut prepared64: Option<Prepared> = None;
    let mut float64 =
        |settings: unet_attention::float64_run::Float64Run| -> Result<(Vec<candle_core::Tensor>, StepsMet)> {
            if prepared64.is_none() {
                let opts64 = Options {
                    dtype: Some(DType::F64),
                    device: Device::Cpu,
                    trace: false,
                    ..opts.clone()
                };
                prepared64 = Some(prepare_bundle_rounded(bundle, &opts64, Some(&weights))?);
            }
            let prepared = prepared64.as_ref().expect("prepared above");
            let (outs, met) = unet_attention::float64_run::with(settings, || prepared.block.run(&prepared.inputs));
            Ok((
                outs.map_err(|e| ParityError::block(path, prepared.inputs.block, e))?,
                met,
            ))
        };
    let mut outputs = compare_outputs(
        bundle,
        inputs.block,
        &ours,
        dtype,
        bundle_dtype,
        rtol,
        atol,
        Some(&mut float64),
    )?;
    if opts.strict {
        outputs.iter_mut().for_each(apply_strict);
    }
    explain_lower_precision(&mut outputs, path, dtype, bundle_dtype);
    let same_dtype = dtype == bundle_dtype;
    let trace = if !opts.trace {
        None
    } else if !same_dtype {
        Some(trace::without_table(format!(
            "stages are compared only in the bundle's dtype ({}), not in {}",
            dtype_name(bundle_dtype),
            dtype_name(dtype)
        )))
    } else {
        let mut report = trace::compare_stages(
            bundle,
            &stages,
            &trace::StageRule {
                rtol,
                atol,
                strict: opts.strict,
                outputs_pass: outputs.iter().all(|o| o.pass),
                output: outputs.first(),
            },
        )?;
        report.ours_only.extend(left_out);
        Some(report)
    };
    let report = Report {
        file: path.display().to_string(),
        block: bundle.block.clone(),
        dtype: dtype_name(dtype).into(),
        bundle_dtype: dtype_name(bundle_dtype).into(),
        device: device_name(&opts.device),
        reference: if same_dtype { "pytorch" } else { "float64" }.into(),
        inputs: bundle
            .inputs
            .iter()
            .map(|n| {
                (
                    n.clone(),
                    bundle.input(n).map(|t| t.dims().to_vec()).unwrap_or_default(),
                )
            })
            .collect(),
        pass: outputs.iter().all(|o| o.pass),
        outcome: Outcome::of(&outputs),
        outputs,
        conversions: weights.conversions(),
        weights: weights.location(),
        config_from,
        trace,
        loosened,
    };
    Ok(Run { report, ours, stages })
}

fn is_half(dtype: DType) -> bool {
    matches!(dtype, DType::F16 | DType::BF16)
}

/// `f32`, `f16`, `bf16`, `f64` (as `--dtype` spells them).
pub fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::F32 => "f32",
        DType::F64 => "f64",
        other => other.as_str(),
    }
}

/// `cpu`, `cuda:N`, `metal:N`.
pub fn device_name(device: &Device) -> String {
    match device.location() {
        candle_core::DeviceLocation::Cpu => "cpu".into(),
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        candle_core::DeviceLocation::Metal { gpu_id } => format!("metal:{gpu_id}"),
    }
}
