//! The pass rule's calibration data: for every bundle of a generated folder
//! (`scripts/calibrate_bundles.py`; never the committed `weights/`), the raw numbers each part of
//! the rule decides on, for our honest block and for wrong ports, wrong bundles and forged PyTorch
//! outputs ([`cases`]), as JSON lines. `scripts/calibrate_summary.py` chooses the constants on one
//! half and replays the verdicts on the other (docs/cli.md, "Calibration").
//!
//! ```text
//! cargo run --release -p unet-parity --example calibrate -- DIR [--lane NAME] [--half validate] [--only ID] [--dump] > lines.jsonl
//! cargo run --release -p unet-parity --example calibrate -- --constants
//! ```
//!
//! (`--constants` prints the library's rule constants as JSON for the summary's comparison.)
//!
//! Lines: `kind` `case` (see [`cases::case_line`]: the scenario, rule (b)'s needed factors, the
//! twin's error in epsilons, the maths check's needed factor at each embedding factor of
//! [`cases::EMBEDDING_GRID`] for both twin conventions, the plausibility ratios), `stage` (rule
//! (b)'s factors for one stage of our honest run, and its twin's error), `error`; each with the
//! bundle's `id`, `block`, `dtype`, `condition`, `half`, `float64_casts` and the `lane`.

mod cases;

use candle_core::{DType, Device, Tensor};
use cases::{case_line, forgeries, shifted, Case, Ours64};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use unet_attention::float64_run::{self, Casts, Embeddings, Float64Run as F64Settings, StepsMet};
use unet_parity::bundle::Bundle;
use unet_parity::compare::{
    compare, default_tolerance, plausibility_bounds, twin_bounds, twin_error_eps, CONFIRMED_FACTORS, EMBEDDING_FACTOR,
    FACTORS, MATHS_FACTOR,
};
use unet_parity::{prepare_bundle, trace, Options};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--constants") {
        println!("{}", constants());
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
    // `--only ID`: that bundle alone (with `--dump`, for scripts/accuracy_spread.py).
    let only_id = option("--only")?;
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
        if only_id
            .as_deref()
            .is_some_and(|id| entry.get("id").and_then(Value::as_str) != Some(id))
        {
            continue;
        }
        let mut base = serde_json::Map::new();
        for key in ["id", "block", "dtype", "condition", "half", "float64_casts"] {
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

/// Every line of one bundle: its outputs' cases and our stages. Measured directly with the
/// library's comparisons, never through a check that could refuse the bundle, so that every bound
/// is chosen from the data too.
fn bundle_lines(path: &Path, dump: Option<&Path>) -> Res<Vec<Value>> {
    let bundle = Bundle::read(path)?;
    let dtype = bundle.run_dtype()?;
    let prepared = prepare_bundle(&bundle, &Options::default())?;
    let (ours, stages) = unet_attention::trace::with_trace(|| prepared.block.run(&prepared.inputs));
    let ours = ours?
        .iter()
        .map(|t| t.to_device(&Device::Cpu))
        .collect::<candle_core::Result<Vec<_>>>()?;
    let ours64 = float64_runs(&bundle)?;
    if let Some(to) = dump {
        dump_runs(&bundle, &ours, &ours64, to)?;
    }
    let bugs = bugs_file(path)?;
    let mut lines = vec![];
    for (index, (name, ours)) in bundle.outputs.iter().zip(&ours).enumerate() {
        let (Some(t), Some(r)) = (bundle.output(name), bundle.output_f64(name)) else {
            continue;
        };
        let plain = ours64.plain.get(index).ok_or("our float64 run has too few outputs")?;
        let kept = ours64.kept.as_ref().and_then(|k| k.get(index));
        let emb = ours64.exact.as_ref().and_then(|e| e.get(index)).map(|x| (plain, x));
        let honest64 = || Some((plain.clone(), kept.cloned()));
        let mut push = |case: Case| -> Res<()> {
            lines.push(case_line(&case, name, dtype, emb)?);
            Ok(())
        };
        push(Case {
            scenario: "honest",
            bug: "",
            ours: ours.clone(),
            ours64: honest64(),
            torch: t.clone(),
            reference: r.clone(),
        })?;
        for (bug, wrong, wrong64) in bugs
            .iter()
            .filter(|(_, o, _, _)| o == name)
            .map(|(b, _, w, w64)| (b, w, w64))
        {
            let ours64 = wrong64.as_ref().map(|w| (w.clone(), None));
            push(Case {
                scenario: "bug",
                bug,
                ours: wrong.clone(),
                ours64,
                torch: t.clone(),
                reference: r.clone(),
            })?;
            if let Some(w64) = wrong64 {
                push(Case {
                    scenario: "refbug",
                    bug,
                    ours: ours.clone(),
                    ours64: honest64(),
                    torch: wrong.clone(),
                    reference: w64.clone(),
                })?;
            }
            push(Case {
                scenario: "tbug",
                bug,
                ours: ours.clone(),
                ours64: honest64(),
                torch: wrong.clone(),
                reference: r.clone(),
            })?;
        }
        for (bug, shift_ours) in biases(ours)? {
            let shift64 = |x: &Tensor| shift_ours(x);
            let ours64 = Some((shift64(plain)?, kept.map(shift64).transpose()?));
            push(Case {
                scenario: "bug",
                bug: &bug,
                ours: shift_ours(ours)?,
                ours64,
                torch: t.clone(),
                reference: r.clone(),
            })?;
        }
        for (kind, forged) in forgeries(t, dtype, index as u64 + 1)? {
            push(Case {
                scenario: "forge",
                bug: kind,
                ours: ours.clone(),
                ours64: honest64(),
                torch: forged,
                reference: r.clone(),
            })?;
        }
    }
    lines.extend(stage_lines(&bundle, &stages, dtype)?);
    Ok(lines)
}

/// The bias bugs of an output: name and the shift, as a function of the run it applies to (both
/// runs of a biased port carry it).
#[allow(clippy::type_complexity)]
fn biases(ours: &Tensor) -> Res<Vec<(String, Box<dyn Fn(&Tensor) -> candle_core::Result<Tensor>>)>> {
    let size = cases::rms(ours)?;
    let mut out: Vec<(String, Box<dyn Fn(&Tensor) -> candle_core::Result<Tensor>>)> = vec![];
    for exponent in 2..=4 {
        let shift = size * 10f64.powi(-exponent);
        out.push((
            format!("bias_all_1e-{exponent}"),
            Box::new(move |x| shifted(x, shift, false)),
        ));
        if ours.rank() >= 2 {
            out.push((
                format!("bias_channel_1e-{exponent}"),
                Box::new(move |x| shifted(x, shift, true)),
            ));
        }
    }
    Ok(out)
}

/// Our float64 runs: as PyTorch builds the float32 embeddings, with them exact where the block has
/// any, and with the published casts kept where it has any.
fn float64_runs(bundle: &Bundle) -> Res<Ours64> {
    let opts = Options {
        dtype: Some(DType::F64),
        ..Options::default()
    };
    let prepared = prepare_bundle(bundle, &opts)?;
    let run = |settings: F64Settings| -> Res<(Vec<Tensor>, StepsMet)> {
        let (outs, met) = float64_run::with(settings, || prepared.block.run(&prepared.inputs));
        Ok((outs?, met))
    };
    let (plain, met) = run(F64Settings::default())?;
    let exact = match met.embeddings {
        true => Some(
            run(F64Settings {
                embeddings: Embeddings::Exact,
                ..Default::default()
            })?
            .0,
        ),
        false => None,
    };
    // As in `check`: a block PyTorch cannot run with its casts kept has no such run.
    let kept = match met.casts {
        true => run(F64Settings {
            casts: Casts::Kept,
            ..Default::default()
        })
        .ok()
        .map(|(outs, _)| outs),
        false => None,
    };
    Ok(Ours64 { plain, exact, kept })
}

/// One planted bug's output: `(bug, output, tensor, its float64 run)`.
type PlantedBug = (String, String, Tensor, Option<Tensor>);

/// The generator's bugs (`<id>.bugs.safetensors`, tensors `<bug>/<output>` and
/// `<bug>/<output>.float64`).
fn bugs_file(path: &Path) -> Res<Vec<PlantedBug>> {
    let file = path.with_extension("bugs.safetensors");
    if !file.exists() {
        return Ok(vec![]);
    }
    let tensors: BTreeMap<String, Tensor> = candle_core::safetensors::load(&file, &Device::Cpu)?
        .into_iter()
        .collect();
    let mut out = vec![];
    for (key, tensor) in &tensors {
        if key.ends_with(".float64") {
            continue;
        }
        if let Some((bug, output)) = key.split_once('/') {
            let f64_run = tensors.get(&format!("{key}.float64")).cloned();
            out.push((bug.to_string(), output.to_string(), tensor.clone(), f64_run));
        }
    }
    Ok(out)
}

/// Rule (b)'s factors for each stage of our run, with its twin's error.
fn stage_lines(bundle: &Bundle, stages: &[(String, Tensor)], dtype: DType) -> Res<Vec<Value>> {
    let (rtol, atol) = default_tolerance(dtype);
    let mut lines = vec![];
    for name in trace::stage_names(bundle)? {
        let (Some(t), Some((_, mine))) = (
            trace::torch_stage(bundle, &name),
            stages.iter().find(|(n, _)| *n == name),
        ) else {
            continue;
        };
        let Ok(Some(r)) = trace::float64_stage(bundle, &name, t) else {
            continue;
        };
        let mine = mine.to_device(&Device::Cpu)?;
        let mine = if mine.dims() != t.dims() && mine.elem_count() == t.elem_count() {
            mine.reshape(t.dims())?
        } else {
            mine
        };
        let report = compare(&name, &mine, t, Some(&r), rtol, atol)?;
        let (twin_e, twin_w) = twin_error_eps(t, &r, dtype)?;
        lines.push(json!({
            "kind": "stage",
            "name": name,
            "outside_a": report.failed_elements + report.torch_error_elements > 0,
            "element_factor": factor(report.element_factor),
            "window_factor": factor(report.window_factor),
            "non_finite": report.non_finite,
            "twin_element_eps": factor(Some(twin_e)),
            "twin_rms_eps": factor(Some(twin_w)),
        }));
    }
    Ok(lines)
}

/// The library's constants, for the summary's comparison.
fn constants() -> Value {
    let bounds = |d: DType| {
        let b = twin_bounds(d);
        json!([b.element, b.rms])
    };
    let plaus = |d: DType, beyond: bool| {
        let b = plausibility_bounds(d, beyond);
        json!([b.global, b.window, b.bias])
    };
    json!({
        "factors": [FACTORS.element, FACTORS.window],
        "confirmed_factors": [CONFIRMED_FACTORS.element, CONFIRMED_FACTORS.window],
        "twin_bounds": {"f32": bounds(DType::F32), "half": bounds(DType::F16)},
        "maths_factor": MATHS_FACTOR,
        "embedding_factor": EMBEDDING_FACTOR,
        "plausibility": {
            "f32": {"within": plaus(DType::F32, false), "beyond": plaus(DType::F32, true)},
            "half": {"within": plaus(DType::F16, false), "beyond": plaus(DType::F16, true)},
        },
    })
}

/// Our outputs and our float64 runs, as float64, into `to` (see `--dump`): `ours/<output>`,
/// `ours64/<output>`, and where they exist `ours64_exact/<output>`, `ours64_kept/<output>`.
fn dump_runs(bundle: &Bundle, ours: &[Tensor], ours64: &Ours64, to: &Path) -> Res<()> {
    let mut tensors = std::collections::HashMap::new();
    for (index, name) in bundle.outputs.iter().enumerate() {
        let runs = [
            ("ours", Some(ours)),
            ("ours64", Some(&ours64.plain[..])),
            ("ours64_exact", ours64.exact.as_deref()),
            ("ours64_kept", ours64.kept.as_deref()),
        ];
        for (key, run) in runs {
            if let Some(t) = run.and_then(|r| r.get(index)) {
                tensors.insert(
                    format!("{key}/{name}"),
                    t.to_device(&Device::Cpu)?.to_dtype(DType::F64)?,
                );
            }
        }
    }
    candle_core::safetensors::save(&tensors, to)?;
    Ok(())
}

use cases::factor;
