//! Checking one bundle: build the block from its config and weights, run it on the bundle's
//! inputs, and compare with PyTorch's outputs under the pass rule.

use crate::bundle::Bundle;
use crate::compare::{compare, default_tolerance, OutputReport};
use crate::error::{ParityError, Result};
use crate::registry::{self, Inputs};
use crate::weights::{closest, TrackedWeights};
use candle_core::{DType, Device};
use serde::Serialize;
use std::path::Path;

/// How to run the checks.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Override the bundle's absolute tolerance.
    pub atol: Option<f64>,
    /// Override the bundle's relative tolerance.
    pub rtol: Option<f64>,
    /// Run in this dtype instead of the bundle's (`F64` compares with the float64 outputs).
    pub dtype: Option<DType>,
    /// Do not fail on weights the block did not use.
    pub allow_unused: bool,
}

/// The result of checking one bundle.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub file: String,
    pub block: String,
    pub dtype: String,
    /// `name shape` of each input.
    pub inputs: Vec<(String, Vec<usize>)>,
    pub outputs: Vec<OutputReport>,
    pub pass: bool,
}

/// Check one bundle file.
pub fn check_file(path: &Path, opts: &Options) -> Result<Report> {
    let bundle = Bundle::read(path)?;
    check_bundle(&bundle, opts)
}

/// Check a parsed bundle.
pub fn check_bundle(bundle: &Bundle, opts: &Options) -> Result<Report> {
    let path = bundle.path.as_path();
    let info = registry::find(&bundle.block).ok_or_else(|| ParityError::UnknownBlock {
        path: path.to_path_buf(),
        id: bundle.block.clone(),
        known: registry::all().iter().map(|b| b.id).collect::<Vec<_>>().join(", "),
    })?;
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

    let bundle_dtype = bundle.run_dtype()?;
    let dtype = opts.dtype.unwrap_or(bundle_dtype);
    let device = Device::Cpu;
    let weights = TrackedWeights::new(bundle.weights());
    let vb = weights.var_builder(dtype, &device);
    let block = (info.build)(vb, &bundle.config).map_err(|e| ParityError::block(path, info.id, e))?;
    let unused = weights.unused();
    if !unused.is_empty() && !opts.allow_unused {
        let all = bundle.weights().into_keys().collect::<Vec<_>>();
        let expected: Vec<String> = all.iter().filter(|k| !unused.contains(k)).cloned().collect();
        let hints: Vec<String> = unused
            .iter()
            .map(|u| match closest(u, expected.iter()) {
                Some(c) => format!("`{u}` (closest used: `{c}`)"),
                None => format!("`{u}`"),
            })
            .collect();
        return Err(ParityError::bundle(
            path,
            format!(
                "{} weights not used by {}: {} (pass --allow-unused to ignore)",
                unused.len(),
                info.id,
                hints.join(", ")
            ),
        ));
    }

    let mut tensors = std::collections::BTreeMap::new();
    for name in &bundle.inputs {
        let t = bundle.input(name).expect("validated when the bundle was read");
        let t = if t.dtype().is_float() {
            t.to_dtype(dtype)
        } else {
            Ok(t.clone())
        };
        let t = t
            .and_then(|t| t.to_device(&device))
            .map_err(|e| ParityError::block(path, info.id, e))?;
        tensors.insert(name.clone(), t);
    }
    let inputs = Inputs {
        block: info.id,
        tensors,
        kwargs: bundle.kwargs.clone(),
    };
    let ours = block.run(&inputs).map_err(|e| ParityError::block(path, info.id, e))?;
    if ours.len() != bundle.outputs.len() {
        return Err(ParityError::bundle(
            path,
            format!(
                "the bundle lists {} outputs ({}) but {} returns {}",
                bundle.outputs.len(),
                bundle.outputs.join(", "),
                info.id,
                ours.len()
            ),
        ));
    }

    let (def_rtol, def_atol) = default_tolerance(dtype);
    let same_dtype = dtype == bundle_dtype;
    let rtol = opts
        .rtol
        .or(if same_dtype { bundle.rtol } else { None })
        .unwrap_or(def_rtol);
    let atol = opts
        .atol
        .or(if same_dtype { bundle.atol } else { None })
        .unwrap_or(def_atol);
    let mut outputs = vec![];
    for (name, ours) in bundle.outputs.iter().zip(&ours) {
        let torch = bundle.output(name).expect("validated when the bundle was read");
        let torch_f64 = bundle.output_f64(name);
        let report = if dtype == DType::F64 && bundle_dtype != DType::F64 {
            let reference = torch_f64.ok_or_else(|| {
                ParityError::bundle(
                    path,
                    format!("--dtype f64 needs `parity.output.{name}.float64`, which the bundle lacks"),
                )
            })?;
            compare(name, ours, reference, None, rtol, atol)
        } else {
            compare(name, ours, torch, torch_f64, rtol, atol)
        }
        .map_err(|e| ParityError::block(path, info.id, e))?;
        outputs.push(report);
    }
    Ok(Report {
        file: path.display().to_string(),
        block: bundle.block.clone(),
        dtype: format!("{dtype:?}").to_lowercase(),
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
    })
}
