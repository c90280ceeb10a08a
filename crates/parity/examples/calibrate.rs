//! The pass rule's calibration data: for every bundle of a generated folder
//! (`scripts/calibrate_bundles.py`; never the committed `weights/`), how much of rule (b) our honest
//! block needed, how much the planted bugs would need, and how far PyTorch's own output is from its
//! float64 twin, as JSON lines. `scripts/calibration/summary.py` chooses the constants on one half
//! and reports false FAILs and power on the other (docs/cli.md, "Calibration").
//!
//! ```text
//! cargo run --release -p unet-parity --example calibrate -- DIR [--lane NAME] [--half validate] > lines.jsonl
//! cargo run --release -p unet-parity --example calibrate -- --constants
//! ```
//!
//! (`--constants` prints the library's rule constants for the summary's comparison.)
//!
//! Each line: `kind` (`output`, `stage`, `bug`, `twin`, `error`), the bundle's `id`, `block`,
//! `dtype`, `condition`, `half`, `lane`, then for `output`/`stage`/`bug`: `name`, `outside_a`
//! (some element is outside rule (a)), `element_factor` and `window_factor` (the factors rule (b)
//! would need; `null` when no element is outside rule (a), `"inf"` where PyTorch is exact all
//! around), `non_finite`; for `twin`: `name`, `element_eps` and `rms_eps` (PyTorch's largest
//! relative error against its float64 twin, at one element and as a neighbourhood RMS, in units
//! of the dtype's epsilon). Bias bugs are planted here: our honest output plus a constant of
//! 10^-2 … 10^-6 times the output's RMS, on the whole output (`bias_all_1e-3`) or on its first
//! channel (`bias_channel_1e-3`).

use candle_core::{DType, Tensor};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use unet_parity::bundle::Bundle;
use unet_parity::compare::{
    check_reference, compare, confirm_twin, default_tolerance, epsilon, twin_bounds, ErrorModel, OutputReport,
    CONFIRMED_FACTORS, FACTORS,
};
use unet_parity::{prepare_bundle, trace, Options};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--constants") {
        let (f32, half) = (twin_bounds(DType::F32), twin_bounds(DType::F16));
        println!(
            "{},{},{},{},{},{},{},{}",
            FACTORS.element,
            FACTORS.window,
            CONFIRMED_FACTORS.element,
            CONFIRMED_FACTORS.window,
            f32.element,
            f32.rms,
            half.element,
            half.rms
        );
        return Ok(());
    }
    let dir = PathBuf::from(args.first().ok_or("usage: calibrate DIR [--lane NAME]")?);
    let option = |name: &str| -> Res<Option<String>> {
        match args.iter().position(|a| a == name) {
            Some(i) => Ok(Some(args.get(i + 1).cloned().ok_or(format!("{name} needs a value"))?)),
            None => Ok(None),
        }
    };
    let lane = option("--lane")?.unwrap_or_else(|| "default".into());
    // `--half validate`: only the validation half (a slow lane, e.g. aarch64 under qemu).
    let only_half = option("--half")?;
    // `--dump`: beside each bundle, `<id>.ours.<lane>.safetensors` with our outputs (`ours/<output>`)
    // and our float64 run's (`ours64/<output>`), as float64, for the rule's prototypes
    // (scripts/calibration/rule.py).
    let dump = args.iter().any(|a| a == "--dump");
    let manifest = std::fs::File::open(dir.join("manifest.jsonl"))?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for line in std::io::BufReader::new(manifest).lines() {
        let entry: Value = serde_json::from_str(&line?)?;
        if entry.get("error").is_some() || entry.get("path").is_none() {
            continue;
        }
        if only_half
            .as_deref()
            .is_some_and(|h| entry.get("half").and_then(Value::as_str) != Some(h))
        {
            continue;
        }
        let mut base = serde_json::Map::new();
        for key in ["id", "block", "dtype", "condition", "half"] {
            base.insert(key.into(), entry.get(key).cloned().unwrap_or(Value::Null));
        }
        base.insert("lane".into(), lane.clone().into());
        let path = resolve(&dir, entry["path"].as_str().unwrap_or_default());
        let dump_to = dump.then(|| path.with_extension(format!("ours.{lane}.safetensors")));
        let lines = bundle_lines(&path, dump_to.as_deref());
        for record in lines.unwrap_or_else(|e| vec![json!({"kind": "error", "error": e.to_string()})]) {
            let mut line = base.clone();
            line.extend(record.as_object().cloned().unwrap_or_default());
            writeln!(out, "{}", Value::Object(line))?;
        }
    }
    Ok(())
}

fn resolve(dir: &Path, path: &str) -> PathBuf {
    let p = PathBuf::from(path);
    if p.is_absolute() || p.exists() {
        p
    } else {
        dir.join(p.file_name().unwrap_or_default())
    }
}

/// Every line of one bundle: the twins, our outputs and stages, the planted bugs. Measured
/// directly with [`compare`] (the library's rule), never through a check that could refuse the
/// bundle, so that the twins' bounds are chosen from the data too.
fn bundle_lines(path: &Path, dump: Option<&Path>) -> Res<Vec<Value>> {
    let bundle = Bundle::read(path)?;
    let dtype = bundle.run_dtype()?;
    let (rtol, atol) = default_tolerance(dtype);
    let prepared = prepare_bundle(&bundle, &Options::default())?;
    let (ours, stages) = unet_attention::trace::with_trace(|| prepared.block.run(&prepared.inputs));
    let ours = ours?
        .iter()
        .map(|t| t.to_device(&candle_core::Device::Cpu))
        .collect::<candle_core::Result<Vec<_>>>()?;
    if let Some(to) = dump {
        dump_runs(&bundle, &ours, to)?;
    }
    let mut lines = vec![];
    for (name, ours) in bundle.outputs.iter().zip(&ours) {
        let (Some(t), Some(r)) = (bundle.output(name), bundle.output_f64(name)) else {
            continue;
        };
        lines.push(twin_line(&format!("output:{name}"), t, r, dtype)?);
        lines.push(factor_line(
            "output",
            name,
            &compare(name, ours, t, Some(r), rtol, atol)?,
        ));
        // Whether our float64 run would confirm the twin if it were beyond the bounds (measured for
        // every output, so that the bounds can be chosen from the data).
        let mut confirm = confirm_line(&bundle, name, (ours, t, r));
        confirm["beyond_bounds"] = check_reference(t, r, dtype)?.is_err().into();
        lines.push(confirm);
    }
    for name in trace::stage_names(&bundle)? {
        let (Some(t), Some((_, mine))) = (
            trace::torch_stage(&bundle, &name),
            stages.iter().find(|(n, _)| *n == name),
        ) else {
            continue;
        };
        let Ok(Some(r)) = trace::float64_stage(&bundle, &name, t) else {
            continue;
        };
        let mine = mine.to_device(&candle_core::Device::Cpu)?;
        let mine = if mine.dims() != t.dims() && mine.elem_count() == t.elem_count() {
            mine.reshape(t.dims())?
        } else {
            mine
        };
        lines.push(twin_line(&format!("stage:{name}"), t, &r, dtype)?);
        lines.push(factor_line(
            "stage",
            &name,
            &compare(&name, &mine, t, Some(&r), rtol, atol)?,
        ));
    }
    for (bug, name, wrong) in bugs(path, &bundle, &ours)? {
        let (Some(t), Some(r)) = (bundle.output(&name), bundle.output_f64(&name)) else {
            continue;
        };
        let mut line = factor_line("bug", &name, &compare(&name, &wrong, t, Some(r), rtol, atol)?);
        line["bug"] = bug.into();
        lines.push(line);
    }
    Ok(lines)
}

/// Our outputs and our float64 run's, as float64, into `to` (see `--dump`).
fn dump_runs(bundle: &Bundle, ours: &[Tensor], to: &Path) -> Res<()> {
    let opts = Options {
        dtype: Some(DType::F64),
        ..Options::default()
    };
    let prepared = prepare_bundle(bundle, &opts)?;
    let ours64 = prepared.block.run(&prepared.inputs)?;
    let mut tensors = std::collections::HashMap::new();
    for (index, name) in bundle.outputs.iter().enumerate() {
        if let Some(o) = ours.get(index) {
            tensors.insert(format!("ours/{name}"), o.to_dtype(DType::F64)?);
        }
        if let Some(o) = ours64.get(index) {
            tensors.insert(
                format!("ours64/{name}"),
                o.to_device(&candle_core::Device::Cpu)?.to_dtype(DType::F64)?,
            );
        }
    }
    candle_core::safetensors::save(&tensors, to)?;
    Ok(())
}

fn factor(f: Option<f64>) -> Value {
    match f {
        Some(f) if f.is_infinite() => "inf".into(),
        Some(f) => f.into(),
        None => Value::Null,
    }
}

fn factor_line(kind: &str, name: &str, r: &OutputReport) -> Value {
    json!({
        "kind": kind,
        "name": name,
        "pass": r.pass,
        "outside_a": r.failed_elements + r.torch_error_elements > 0,
        "element_factor": factor(r.element_factor),
        "window_factor": factor(r.window_factor),
        "non_finite": r.non_finite,
        "elements": r.shape.iter().product::<usize>(),
    })
}

/// PyTorch's largest relative error against the twin, in epsilons of `dtype`.
fn twin_line(name: &str, t: &Tensor, r: &Tensor, dtype: DType) -> Res<Value> {
    let t = t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    let r = r.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
    if t.len() != r.len() {
        return Ok(json!({"kind": "error", "error": format!("{name}: twin shape")}));
    }
    let model = ErrorModel::new(&t, &r);
    let eps = epsilon(dtype);
    let element = (0..t.len())
        .map(|i| model.torch_error(t[i], r[i], i))
        .fold(0.0, f64::max);
    let rms = model.torch_rms.iter().copied().fold(0.0, f64::max);
    Ok(
        json!({"kind": "twin", "name": name, "element_eps": factor(Some(element / eps)), "rms_eps": factor(Some(rms / eps))}),
    )
}

/// The planted bugs: the generator's (`<id>.bugs.safetensors`, tensors `<bug>/<output>`) and the
/// bias shifts made here from our honest outputs.
fn bugs(path: &Path, bundle: &Bundle, ours: &[Tensor]) -> Res<Vec<(String, String, Tensor)>> {
    let mut found = vec![];
    let file = path.with_extension("bugs.safetensors");
    if file.exists() {
        let tensors: BTreeMap<String, Tensor> = candle_core::safetensors::load(&file, &candle_core::Device::Cpu)?
            .into_iter()
            .collect();
        for (key, tensor) in tensors {
            if let Some((bug, output)) = key.split_once('/') {
                found.push((bug.to_string(), output.to_string(), tensor));
            }
        }
    }
    for (name, ours) in bundle.outputs.iter().zip(ours) {
        let dtype = ours.dtype();
        let values = ours.to_dtype(DType::F64)?;
        let rms = values.sqr()?.mean_all()?.to_scalar::<f64>()?.sqrt();
        for exponent in 2..=6 {
            let shift = rms * 10f64.powi(-exponent);
            let all = (&values + shift)?.to_dtype(dtype)?;
            found.push((format!("bias_all_1e-{exponent}"), name.clone(), all));
            if values.rank() >= 2 {
                let mut mask = vec![0f64; values.elem_count()];
                let per_channel = values.dims()[2..].iter().product::<usize>();
                mask[..per_channel].iter_mut().for_each(|m| *m = shift);
                let mask = Tensor::from_vec(mask, values.dims(), values.device())?;
                found.push((
                    format!("bias_channel_1e-{exponent}"),
                    name.clone(),
                    (&values + mask)?.to_dtype(dtype)?,
                ));
            }
        }
    }
    Ok(found)
}

/// Whether our float64 run confirms a float64 output beyond the twin bounds (as `check` does).
fn confirm_line(bundle: &Bundle, name: &str, (ours, t, r): (&Tensor, &Tensor, &Tensor)) -> Value {
    let run = || -> Res<(Result<(), String>, f64)> {
        let opts = Options {
            dtype: Some(DType::F64),
            ..Options::default()
        };
        let prepared = prepare_bundle(bundle, &opts)?;
        let outs = prepared.block.run(&prepared.inputs)?;
        let index = bundle.outputs.iter().position(|n| n == name).unwrap_or(0);
        let mine = outs.get(index).ok_or("no such output")?;
        let flat = |x: &Tensor| -> Res<Vec<f64>> { Ok(x.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?) };
        let (o, o64, tv, rv) = (flat(ours)?, flat(mine)?, flat(t)?, flat(r)?);
        let ratio = error_ratio(&o, &o64, &tv, &rv, &ErrorModel::new(&tv, &rv).scale);
        Ok((confirm_twin(mine, t, r)?, ratio))
    };
    match run() {
        Ok((Ok(()), ratio)) => json!({"kind": "confirm", "name": name, "confirmed": true, "ratio": ratio}),
        Ok((Err(why), ratio)) => {
            json!({"kind": "confirm", "name": name, "confirmed": false, "why": why, "ratio": ratio})
        }
        Err(e) => json!({"kind": "confirm", "name": name, "confirmed": false, "why": e.to_string()}),
    }
}

/// PyTorch's RMS relative error (`t` against `r`) over ours (`o` against `o64`), relative to `scale`.
fn error_ratio(o: &[f64], o64: &[f64], t: &[f64], r: &[f64], scale: &[f64]) -> f64 {
    let rms = |a: &[f64], b: &[f64]| {
        let sum: f64 = a
            .iter()
            .zip(b)
            .zip(scale)
            .map(|((x, y), m)| {
                if (x - y).is_finite() && *m > 0.0 {
                    ((x - y) / m).powi(2)
                } else {
                    0.0
                }
            })
            .sum();
        (sum / a.len().max(1) as f64).sqrt()
    };
    let (torch, ours) = (rms(t, r), rms(o, o64));
    if torch == 0.0 {
        0.0
    } else {
        torch / ours
    }
}
