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

use crate::bundle::Bundle;
use crate::checkpoint::{Checkpoint, PrefixView};
use crate::compare::{check_reference, compare, default_tolerance, OutputReport, Verdict, ERROR_FACTOR};
use crate::error::{ParityError, Result};
use crate::registry::{self, BlockInfo, Inputs, Runnable};
use crate::trace::{self, TraceReport};
use crate::weights::{closest, Conversion, TrackedWeights};
use candle_core::{DType, Device};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;

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
    let weights = weight_source(bundle, opts)?;
    let (config, config_from) = block_config(bundle, opts, info.id, weights.location().as_deref())?;
    let vb = weights.var_builder(dtype, &opts.device);
    let block = (info.build)(vb, &config).map_err(|e| ParityError::block(path, info.id, e))?;
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

/// Fail on weights the block did not read, with the closest used name for each (unless
/// `Options::allow_unused`).
fn check_unused(path: &Path, block: &str, weights: &TrackedWeights, opts: &Options) -> Result<()> {
    let unused = unused_weights(weights);
    if unused.is_empty() || opts.allow_unused {
        return Ok(());
    }
    let all = weights.names().cloned().collect::<Vec<_>>();
    let expected: Vec<String> = all.iter().filter(|k| !unused.contains(k)).cloned().collect();
    let hints: Vec<String> = unused
        .iter()
        .map(|u| match closest(u, expected.iter()) {
            Some(c) => format!("`{u}` (closest used: `{c}`)"),
            None => format!("`{u}`"),
        })
        .collect();
    let place = weights.location().map(|l| format!(" in {l}")).unwrap_or_default();
    Err(ParityError::bundle(
        path,
        format!(
            "{} weights{place} not used by {block}: {} (pass --allow-unused to ignore)",
            unused.len(),
            hints.join(", ")
        ),
    ))
}

/// The bundle's inputs as the block gets them: floats in the run dtype (conversions recorded in
/// `weights`), on `device`.
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
        let t = bundle.input(name).expect("validated when the bundle was read");
        // A half-precision bundle that stores an input in f32 was run by PyTorch with that input
        // in f32 (guided-diffusion's `convert_to_fp16`: `x` half, `emb` f32): in a run in the
        // bundle's own dtype it is given to the block as stored. Otherwise floats go to the run dtype.
        let as_stored = dtype == bundle_dtype && is_half(bundle_dtype) && t.dtype() == DType::F32;
        let t = if t.dtype().is_float() && !as_stored {
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
    let prepared = prepare_bundle(bundle, opts)?;
    let (block, inputs) = (&prepared.block, &prepared.inputs);
    let (dtype, bundle_dtype) = (prepared.dtype, prepared.bundle_dtype);
    let Tolerances { rtol, atol, loosened } = tolerances(bundle, opts, dtype, bundle_dtype)?;
    let (ours, stages) = if opts.trace {
        unet_attention::trace::with_trace(|| block.run(inputs))
    } else {
        (block.run(inputs), vec![])
    };
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

    let mut outputs = compare_outputs(bundle, inputs.block, &ours, dtype, bundle_dtype, rtol, atol)?;
    if opts.strict {
        outputs.iter_mut().for_each(apply_strict);
    }
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
        Some(trace::compare_stages(bundle, &stages, rtol, atol)?)
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
        outputs,
        conversions: prepared.weights.conversions(),
        weights: prepared.weights.location(),
        config_from: prepared.config_from,
        trace,
        loosened,
    };
    Ok(Run { report, ours, stages })
}

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
        let torch = bundle.output(name).expect("validated when the bundle was read");
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

/// The block's weights: `--weights` (a checkpoint under a prefix), else the checkpoint the bundle
/// references (`parity.weights`, relative to the bundle's folder, with `parity.prefix`), else the
/// bundle's own state dict. A bundle may not both hold weights and reference a checkpoint.
pub(crate) fn weight_source(bundle: &Bundle, opts: &Options) -> Result<TrackedWeights> {
    let path = bundle.path.as_path();
    let embedded = bundle.weights();
    let referenced = bundle.metadata.get("parity.weights");
    let (file, prefix) = match (&opts.weights, referenced) {
        (Some(w), _) => (w.file.clone(), w.prefix.clone()),
        (None, Some(rel)) => {
            if !embedded.is_empty() {
                return Err(ParityError::bundle(
                    path,
                    format!(
                        "the bundle holds {} weights and also references `parity.weights` = {rel:?}; keep one",
                        embedded.len()
                    ),
                ));
            }
            let dir = path.parent().unwrap_or(Path::new("."));
            let prefix = bundle.metadata.get("parity.prefix").cloned().unwrap_or_default();
            // `parity.weights_key`: the top-level pickle entry holding the state dict.
            let prefix = match bundle.metadata.get("parity.weights_key") {
                Some(key) => format!("{key}.{prefix}"),
                None => prefix,
            };
            (dir.join(rel), prefix)
        }
        (None, None) => return Ok(TrackedWeights::new(embedded)),
    };
    let checkpoint = Arc::new(Checkpoint::open(&file)?);
    Ok(TrackedWeights::from_source(Arc::new(PrefixView::new(
        checkpoint, &prefix,
    )?)))
}

/// The block's constructor kwargs: from `--config` (a diffusers `config.json`) when given, else
/// `parity.config`.
fn block_config(
    bundle: &Bundle,
    opts: &Options,
    block: &'static str,
    weights_at: Option<&str>,
) -> Result<(serde_json::Value, Option<String>)> {
    let Some(file) = &opts.model_config else {
        return Ok((bundle.config.clone(), None));
    };
    let text = crate::files::read_text(file)?;
    let bad = |message: String| ParityError::Checkpoint {
        path: file.clone(),
        message,
    };
    let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
    let specs = unet_attention::diffusers::model_config::mid_blocks(&json, None, opts.allow_unknown_config)
        .map_err(|e| bad(e.to_string()))?;
    let matching: Vec<_> = specs.iter().filter(|s| s.block == block).collect();
    // The VAE has an encoder and a decoder mid block of the same config: any will do, but prefer
    // the one the weights come from.
    let spec = matching
        .iter()
        .find(|s| {
            weights_at.is_some_and(|w| w.contains(&format!("`{}", s.key_prefix())) || w.contains(&s.key_prefix()))
        })
        .or(matching.first())
        .ok_or_else(|| {
            bad(if specs.is_empty() {
                format!("the model has no mid block, and the bundle's block is {block}")
            } else {
                format!(
                    "the model's mid block is {}, not {block}",
                    specs.iter().map(|s| s.block).collect::<Vec<_>>().join(", ")
                )
            })
        })?;
    Ok((spec.config.clone(), Some(file.display().to_string())))
}

/// Weights the block did not read. For a bundle's own state dict, all of them; for a checkpoint,
/// only those under the top-level names the block used (`mid_attn.extra` when it read
/// `mid_attn.*`), since the rest of the model shares the prefix.
fn unused_weights(weights: &TrackedWeights) -> Vec<String> {
    let unused = weights.unused();
    if weights.location().is_none() {
        return unused;
    }
    let first = |n: &str| n.split('.').next().unwrap_or("").to_string();
    let used: std::collections::BTreeSet<String> = weights
        .names()
        .filter(|n| !unused.contains(n))
        .map(|n| first(n))
        .collect();
    unused.into_iter().filter(|n| used.contains(&first(n))).collect()
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
