//! Check *your* Candle port against a PyTorch bundle: any forward you write (a
//! candle-transformers block, your own U-Net's mid block), judged by the same pass rule as
//! `unet-parity check`, stage by stage where you record stages.
//!
//! ```no_run
//! use unet_parity::port::{record, PortCheck};
//!
//! # fn main() -> anyhow::Result<()> {
//! let check = PortCheck::open("weights/own/diffusers_vae_decoder_mid_block.safetensors")?;
//! let vb = check.var_builder()?; // the block's weights, under its PyTorch key names
//! let norm = candle_nn::group_norm(4, 16, 1e-6, vb.pp("resnets.0.norm1"))?;
//! let report = check.run(|inputs| {
//!     let h = inputs.get("hidden_states")?.apply(&norm)?;
//!     record("resnets.0/norm1", &h); // a stage PyTorch recorded under this name
//!     // ... the rest of your forward ...
//!     anyhow::Ok(h)
//! })?;
//! println!("{report}"); // PASS/FAIL per output, the stage table, the first divergent stage
//! # Ok(())
//! # }
//! ```
//!
//! * [`PortCheck::open`] reads the bundle (its stage traces included); [`PortCheck::var_builder`]
//!   gives its weights (the bundle's own state dict, or the checkpoint it references under its
//!   prefix) in the run dtype on the run device; [`PortInputs::get`] its forward inputs.
//! * Your forward returns the outputs in the bundle's order (a `Tensor`, a `Vec<Tensor>` or a
//!   pair). Each is judged as the CLI judges a block's output (the crate's [`crate::compare`]
//!   rules, the dtype's default tolerances unless you set them, [`PortCheck::strict`] for
//!   "bit-identical or within the dtype's tolerance").
//! * Stages: call [`record`] (the same function our blocks call, free outside a check) with the
//!   stage names the bundle's exporter wrote (`parity.trace`, listed by `unet-parity inspect`).
//!   Bundles from the named-stage tracers call a nested block's output `<name>/output`
//!   (`resnets.0/output`); recording `resnets.0` counts as that. Bundles exported with
//!   module-path stages (`scripts/export_own.py --trace modules`) name every submodule's output
//!   by its path (`attentions.0/transformer_blocks.0/ff`), and each attention module's core
//!   under its path (`.../attn1/q`, `k`, `v`, `probs`, `attn`: docs/tracing.md gives the
//!   layouts). A name you record that the bundle lacks is listed with the closest one it has. Stages you do not record are shown as
//!   `not recorded` and never fail; the first recorded stage that fails is the first divergence.
//!   Stage `output` is what the forward returns. Our blocks record their stages too when they run
//!   inside a check (under [`scope`] names you give them, else at the top level, where names the
//!   bundle lacks are listed as ours only and a block's own `output` is ignored), so this crate's
//!   blocks can stand in for the parts of your port you have not written yet.

use crate::bundle::{Bundle, Load};
use crate::check::{
    apply_strict, compare_outputs, device_name, dtype_name, explain_lower_precision, tolerances, weight_source, Options,
};
use crate::compare::{Outcome, OutputReport};
use crate::error::{ParityError, Result};
use crate::trace::{self, TraceReport};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;
use unet_attention::float64_run::StepsMet;

pub use unet_attention::trace::{record, scope};

/// A bundle, and how your port is to be run against it. Built with [`PortCheck::open`], then
/// set with the builder methods; nothing runs until [`PortCheck::run`].
pub struct PortCheck {
    bundle: Bundle,
    device: Device,
    dtype: Option<DType>,
    atol: Option<f64>,
    rtol: Option<f64>,
    strict: bool,
}

impl PortCheck {
    /// Read the bundle at `path`, stage traces included.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Ok(Self::from_bundle(Bundle::read_with(path.as_ref(), Load::All)?))
    }

    /// A bundle already read (read it with [`Load::All`] to compare stages).
    pub fn from_bundle(bundle: Bundle) -> Self {
        Self {
            bundle,
            device: Device::Cpu,
            dtype: None,
            atol: None,
            rtol: None,
            strict: false,
        }
    }

    /// Run on this device (the CPU by default); outputs come back to the CPU to be compared.
    pub fn device(mut self, device: &Device) -> Self {
        self.device = device.clone();
        self
    }

    /// Run in this dtype instead of the bundle's: the outputs are then held against PyTorch's
    /// float64 outputs (stages are compared only in the bundle's own dtype).
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = Some(dtype);
        self
    }

    /// Rule (a)'s absolute tolerance, instead of the bundle's or the dtype's default: a finite
    /// number ≥ 0 ([`PortCheck::run`] refuses anything else).
    pub fn atol(mut self, atol: f64) -> Self {
        self.atol = Some(atol);
        self
    }

    /// Rule (a)'s relative tolerance, instead of the bundle's or the dtype's default: a finite
    /// number ≥ 0 ([`PortCheck::run`] refuses anything else).
    pub fn rtol(mut self, rtol: f64) -> Self {
        self.rtol = Some(rtol);
        self
    }

    /// Exactness only (the CLI's `--strict`): an output passes when every element is
    /// bit-identical to PyTorch's or within the dtype's tolerance of it, never by PyTorch's own
    /// error alone; tolerances above the dtype's defaults are refused.
    pub fn strict(mut self, strict: bool) -> Self {
        self.strict = strict;
        self
    }

    /// The bundle (its metadata, config, inputs, outputs and stages).
    pub fn bundle(&self) -> &Bundle {
        &self.bundle
    }

    /// The dtype the forward runs in: the one set with [`PortCheck::dtype`], else the bundle's.
    pub fn run_dtype(&self) -> Result<DType> {
        match self.dtype {
            Some(d) => Ok(d),
            None => self.bundle.run_dtype(),
        }
    }

    fn options(&self) -> Options {
        Options {
            atol: self.atol,
            rtol: self.rtol,
            dtype: self.dtype,
            device: self.device.clone(),
            trace: true,
            strict: self.strict,
            ..Options::default()
        }
    }

    /// The block's weights under their PyTorch names, in the run dtype on the run device: the
    /// bundle's own state dict, or the checkpoint it references (`parity.weights`) seen from the
    /// block's prefix (`parity.prefix`, e.g. `mid_block.`), so `vb.pp("resnets.0")` works either
    /// way. A missing key or a wrong shape fails with the key and both shapes named.
    pub fn var_builder(&self) -> Result<VarBuilder<'static>> {
        self.var_builder_in(self.run_dtype()?, &self.device)
    }

    fn var_builder_in(&self, dtype: DType, device: &Device) -> Result<VarBuilder<'static>> {
        let weights = weight_source(&self.bundle, &self.options())?;
        Ok(weights.var_builder(dtype, device))
    }

    /// The bundle's forward inputs, floats in the run dtype, on the run device.
    pub fn inputs(&self) -> Result<PortInputs> {
        self.inputs_in(self.run_dtype()?, &self.device)
    }

    fn inputs_in(&self, dtype: DType, device: &Device) -> Result<PortInputs> {
        self.bundle.validate()?;
        let path = &self.bundle.path;
        let mut tensors = BTreeMap::new();
        for name in &self.bundle.inputs {
            let t = self.bundle.input(name).ok_or_else(|| {
                ParityError::bundle(path, format!("input `{name}` is listed but its tensor is missing"))
            })?;
            let t = if t.dtype().is_float() {
                t.to_dtype(dtype)
            } else {
                Ok(t.clone())
            };
            let t = t
                .and_then(|t| t.to_device(device))
                .map_err(|e| ParityError::bundle(path, format!("input `{name}`: {e}")))?;
            tensors.insert(name.clone(), t);
        }
        Ok(PortInputs {
            file: path.display().to_string(),
            tensors,
            kwargs: self.bundle.kwargs.clone(),
        })
    }

    /// The tolerances set with [`PortCheck::atol`] / [`PortCheck::rtol`], each a finite number ≥ 0.
    fn check_tolerances(&self) -> Result<()> {
        for (name, tol) in [("atol", self.atol), ("rtol", self.rtol)] {
            if let Some(Err(why)) = tol.map(crate::compare::check_tolerance) {
                return Err(ParityError::Invalid {
                    path: self.bundle.path.clone(),
                    message: format!("PortCheck::{name}: {why}"),
                });
            }
        }
        Ok(())
    }

    /// Run `forward` on the bundle's inputs, recording the stages it [`record`]s, and judge its
    /// outputs and stages against PyTorch's. An error from `forward` comes back as
    /// [`ParityError::Port`], naming the bundle; a bundle whose fields contradict each other, or a
    /// tolerance that is not a finite number ≥ 0, as an error before the forward runs.
    pub fn run<O, E, F>(&self, forward: F) -> Result<PortReport>
    where
        O: PortOutputs,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
        F: FnOnce(&PortInputs) -> std::result::Result<O, E>,
    {
        self.run_inner(forward, None)
    }

    /// [`PortCheck::run`], with a float64 run of your port for the maths check (docs/cli.md, "The
    /// pass rule"): `forward64` is given the bundle's weights and inputs in float64 on the CPU;
    /// build your port from that `VarBuilder` and run it as `forward` does. Its outputs are held
    /// against PyTorch's float64 outputs at float64's rounding (a wrong eps, scale or head split
    /// shows there even where the bundle's dtype rounds it away), and a float64 output beyond the
    /// twin bounds becomes usable instead of refused. It may be called more than once (with the
    /// float32 steps of `unet_attention::float64_run` set differently, for the crate's blocks your
    /// port uses).
    pub fn run_with_float64<O, E, F, O64, E64, G>(&self, forward: F, mut forward64: G) -> Result<PortReport>
    where
        O: PortOutputs,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
        F: FnOnce(&PortInputs) -> std::result::Result<O, E>,
        O64: PortOutputs,
        E64: Into<Box<dyn std::error::Error + Send + Sync>>,
        G: FnMut(VarBuilder<'static>, &PortInputs) -> std::result::Result<O64, E64>,
    {
        let path = self.bundle.path.clone();
        let (vb, inputs) = (
            self.var_builder_in(DType::F64, &Device::Cpu)?,
            self.inputs_in(DType::F64, &Device::Cpu)?,
        );
        let mut run64 = |settings| -> Result<(Vec<Tensor>, StepsMet)> {
            let (out, met) = unet_attention::float64_run::with(settings, || forward64(vb.clone(), &inputs));
            let out = out.map_err(|e| ParityError::Port {
                path: path.clone(),
                message: format!("the float64 run: {}", forward_message(&path, &e.into().to_string())),
            })?;
            Ok((out.into_outputs(), met))
        };
        self.run_inner(forward, Some(&mut run64))
    }

    fn run_inner<O, E, F>(&self, forward: F, float64_run: crate::check::Float64Run) -> Result<PortReport>
    where
        O: PortOutputs,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
        F: FnOnce(&PortInputs) -> std::result::Result<O, E>,
    {
        let bundle = &self.bundle;
        let path = bundle.path.as_path();
        bundle.validate()?;
        self.check_tolerances()?;
        bundle.check_values()?;
        let opts = self.options();
        let bundle_dtype = bundle.run_dtype()?;
        let dtype = self.run_dtype()?;
        let mut tol = tolerances(bundle, &opts, dtype, bundle_dtype).map_err(library_words)?;
        tol.loosened = tol.loosened.iter().map(|l| library_text(l)).collect();
        let inputs = self.inputs()?;
        let (result, stages) = unet_attention::trace::with_trace(|| forward(&inputs));
        let ours = result
            .map_err(|e| ParityError::Port {
                path: path.to_path_buf(),
                message: forward_message(path, &e.into().to_string()),
            })?
            .into_outputs();
        if ours.len() != bundle.outputs.len() {
            return Err(ParityError::Port {
                path: path.to_path_buf(),
                message: format!(
                    "the bundle has {} outputs ({}) and the forward returned {}",
                    bundle.outputs.len(),
                    bundle.outputs.join(", "),
                    ours.len()
                ),
            });
        }
        let ours = ours
            .iter()
            .map(|t| t.to_device(&Device::Cpu))
            .collect::<candle_core::Result<Vec<_>>>()
            .map_err(|e| ParityError::bundle(path, format!("moving the outputs to the CPU: {e}")))?;
        let mut outputs = compare_outputs(
            bundle,
            &bundle.block,
            &ours,
            dtype,
            bundle_dtype,
            tol.rtol,
            tol.atol,
            float64_run,
        )
        .map_err(library_words)?;
        if self.strict {
            outputs.iter_mut().for_each(apply_strict);
        }
        explain_lower_precision(&mut outputs, path, dtype, bundle_dtype);
        let mut drawn = vec![];
        let trace = if dtype == bundle_dtype {
            // The `output` stage is what the forward returned: a block used as a part records its
            // own `output` at the top level, which is not the bundle's.
            let mut stages: Vec<_> = stages.into_iter().filter(|(n, _)| !is_top_output(n)).collect();
            if let Some(first) = ours.first() {
                stages.push(("output".into(), first.clone()));
            }
            drawn = stage_aliases(bundle, stages)?;
            trace::compare_stages(
                bundle,
                &drawn,
                &trace::StageRule {
                    rtol: tol.rtol,
                    atol: tol.atol,
                    strict: self.strict,
                    outputs_pass: outputs.iter().all(|o| o.pass),
                    output: outputs.first(),
                },
            )?
        } else {
            trace::without_table(format!(
                "stages are compared only in the bundle's dtype ({}), not in {}",
                dtype_name(bundle_dtype),
                dtype_name(dtype)
            ))
        };
        Ok(PortReport {
            file: path.display().to_string(),
            dtype: dtype_name(dtype).into(),
            device: device_name(&self.device),
            pass: outputs.iter().all(|o| o.pass),
            outcome: Outcome::of(&outputs),
            outputs,
            trace,
            loosened: tol.loosened,
            ours,
            stages: drawn,
        })
    }

    /// Write `show`'s pictures of a [`PortCheck::run`] of this check into the folder `out`: the
    /// output error maps and, for each attention-weight stage the forward [`record`]ed (`probs`,
    /// `attentions.0/probs`, ...), PyTorch's and your attention maps, of query pixel `query`
    /// (default: the image's centre) of batch item `batch` (see [`crate::show`]).
    /// [`Shown::left_out`](crate::show::Shown) says which pictures were not drawn and why.
    /// Stages are drawn only from a run in the bundle's own dtype.
    pub fn show(
        &self,
        report: &PortReport,
        out: impl AsRef<Path>,
        query: Option<(usize, usize)>,
        batch: usize,
    ) -> Result<crate::show::Shown> {
        crate::show::draw(&self.bundle, &report.ours, &report.stages, out.as_ref(), (query, batch))
    }
}

/// The CLI's flags in a message named as this API's methods: a library user set
/// `PortCheck::atol`, never `--atol`.
fn library_text(s: &str) -> String {
    ["atol", "rtol", "strict", "dtype"]
        .iter()
        .fold(s.to_string(), |s, name| {
            s.replace(&format!("--{name}"), &format!("PortCheck::{name}"))
        })
}

/// [`library_text`] on the message of a bundle error.
fn library_words(e: ParityError) -> ParityError {
    match e {
        ParityError::Bundle { path, message } => ParityError::Bundle {
            message: library_text(&message),
            path,
        },
        other => other,
    }
}

/// The message of an error the forward returned, without the `<file>: your port: ` that an error
/// of [`PortInputs::get`] already carries (it is added once, by the caller).
fn forward_message(path: &Path, message: &str) -> String {
    let prefix = ParityError::Port {
        path: path.to_path_buf(),
        message: String::new(),
    }
    .to_string();
    match message.find(&prefix) {
        Some(at) => format!("{}{}", &message[..at], &message[at + prefix.len()..]),
        None => message.to_string(),
    }
}

/// `output`, `output#2`, ...: a top-level block output, which the forward's return value replaces.
fn is_top_output(name: &str) -> bool {
    name == "output" || name.strip_prefix("output#").is_some_and(|k| k.parse::<usize>().is_ok())
}

/// Our recorded stages with `name` read as `name/output` where the bundle has no stage `name`
/// but has `name/output` (the named-stage tracers' name for a nested block's output). A stage
/// recorded twice under the name the bundle holds is an error: only the first would be compared.
fn stage_aliases(bundle: &Bundle, stages: Vec<(String, Tensor)>) -> Result<Vec<(String, Tensor)>> {
    let names = trace::stage_names(bundle)?;
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::with_capacity(stages.len());
    for (name, t) in stages {
        let output = format!("{name}/output");
        let name = if !names.contains(&name) && names.contains(&output) {
            output
        } else {
            name
        };
        if !seen.insert(name.clone()) {
            return Err(ParityError::Port {
                path: bundle.path.clone(),
                message: format!("stage `{name}` was recorded twice; record each stage once"),
            });
        }
        out.push((name, t));
    }
    Ok(out)
}

/// A bundle's forward inputs, as [`PortCheck::run`] gives them to your forward.
pub struct PortInputs {
    file: String,
    tensors: BTreeMap<String, Tensor>,
    kwargs: serde_json::Map<String, serde_json::Value>,
}

impl PortInputs {
    /// The input `name` (`hidden_states`, `temb`, `encoder_hidden_states`, ...); an error
    /// naming the bundle and the inputs it has when it has no such input.
    pub fn get(&self, name: &str) -> Result<&Tensor> {
        self.tensors.get(name).ok_or_else(|| ParityError::Port {
            path: self.file.clone().into(),
            message: format!(
                "the forward asked for input `{name}`; the bundle's inputs are: {}",
                self.names().collect::<Vec<_>>().join(", ")
            ),
        })
    }

    /// The input `name`, `None` when the bundle has none (an optional forward argument).
    pub fn optional(&self, name: &str) -> Option<&Tensor> {
        self.tensors.get(name)
    }

    /// The input names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// A non-tensor forward argument the bundle records (`parity.kwargs`: `num_frames`,
    /// `conditioning_scale`, ...).
    pub fn kwarg(&self, name: &str) -> Option<&serde_json::Value> {
        self.kwargs.get(name)
    }
}

/// What a forward returns: its outputs, in the bundle's order.
pub trait PortOutputs {
    fn into_outputs(self) -> Vec<Tensor>;
}

impl PortOutputs for Tensor {
    fn into_outputs(self) -> Vec<Tensor> {
        vec![self]
    }
}

impl PortOutputs for Vec<Tensor> {
    fn into_outputs(self) -> Vec<Tensor> {
        self
    }
}

impl PortOutputs for (Tensor, Tensor) {
    fn into_outputs(self) -> Vec<Tensor> {
        vec![self.0, self.1]
    }
}

/// The result of [`PortCheck::run`]. `Display` prints the verdict per output, the stage table
/// and the first divergent stage with its usual causes.
#[derive(Debug, Clone, Serialize)]
pub struct PortReport {
    pub file: String,
    /// The dtype the forward ran in.
    pub dtype: String,
    pub device: String,
    /// Every output passed.
    pub pass: bool,
    /// `pass`, `fail` or `inconclusive` (no output failed and some could not be judged).
    pub outcome: Outcome,
    pub outputs: Vec<OutputReport>,
    /// The stage-by-stage comparison of the stages the forward recorded.
    pub trace: TraceReport,
    /// Tolerances above the dtype's defaults, and where they came from.
    pub loosened: Vec<String>,
    /// Our outputs (on the CPU) and recorded stages, kept for [`PortCheck::show`].
    #[serde(skip)]
    ours: Vec<Tensor>,
    #[serde(skip)]
    stages: Vec<(String, Tensor)>,
}

impl PortReport {
    /// The first recorded stage that fails, in the bundle's stage order, when some output failed
    /// (`None` whenever [`PortReport::pass`] holds: the verdict is the outputs'; see
    /// [`crate::trace::compare_stages`]).
    pub fn first_divergence(&self) -> Option<&str> {
        self.trace.first_divergence.as_deref()
    }
}

impl std::fmt::Display for PortReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let line = |s: &str| crate::terminal::one_line(s).into_owned();
        let mut verdict = self.outcome.word().to_string();
        if let Some(stage) = self.trace.diverging_under_pass() {
            verdict.push_str(&format!(" (stage `{}` differs: see the warning)", line(stage)));
        }
        writeln!(f, "{} ({} on {}): {verdict}", line(&self.file), self.dtype, self.device)?;
        if !self.loosened.is_empty() {
            writeln!(f, "  loosened: {}", line(&self.loosened.join(", ")))?;
        }
        for o in &self.outputs {
            let vs_f64 = match (o.ours_vs_f64, o.torch_vs_f64) {
                (Some(a), Some(b)) => format!(", vs float64 {a:.2e} (PyTorch's own {b:.2e})"),
                _ => String::new(),
            };
            writeln!(
                f,
                "  output `{}` {:?}: {} ({}), max abs {:.2e}, max rel {:.2e}{vs_f64}",
                line(&o.name),
                o.shape,
                Outcome::of(std::slice::from_ref(o)).word(),
                o.verdict.name(),
                o.max_abs,
                o.max_rel
            )?;
            if let Some(reason) = &o.reason {
                writeln!(f, "    {}", line(reason))?;
            }
        }
        self.trace.render(f, true)
    }
}
