//! What the commands print: the `check` table and `--trace` tables, `detect`, `inspect` and
//! `blocks`. Every name from a file goes through [`line`] (and the whole output through
//! [`crate::terminal::Safe`]).

use super::HubArgs;
use crate::bundle::{self, Bundle};
use crate::check::Report;
use crate::checkpoint::Checkpoint;
use crate::error::ParityError;
use crate::registry;
use std::io::Write;
use std::path::PathBuf;

/// `detect` reads model checkpoints: a parity bundle (safetensors with `parity.*` metadata) is
/// not one, and saying "no mid block found" of it would mislead.
fn refuse_bundle(file: &std::path::Path) -> Result<(), ParityError> {
    let Ok((metadata, _)) = crate::bundle::read_header(file) else {
        return Ok(());
    };
    if !metadata.keys().any(|k| k.starts_with("parity.")) {
        return Ok(());
    }
    let block = metadata
        .get("parity.block")
        .map(|b| format!(" of `{}`", line(b)))
        .unwrap_or_default();
    Err(ParityError::Usage(format!(
        "{}: this is a parity bundle{block}, not a model checkpoint: `detect` finds mid blocks in \
         checkpoints; check the bundle with `unet-parity check {0}`, or list it with `unet-parity inspect {0}`",
        line(&file.display().to_string())
    )))
}

pub(super) fn detect(
    file: Option<PathBuf>,
    prefix: Option<&str>,
    json: bool,
    hub: &HubArgs,
    out: &mut dyn Write,
) -> Result<(), ParityError> {
    let (file, config) = checkpoint_and_config(file, hub)?;
    refuse_bundle(&file)?;
    let ck = Checkpoint::open(&file)?;
    let mut found = crate::detect::detect(&ck, prefix);
    let config_note = match &config {
        Some(config) => Some(apply_config(config, &mut found)?),
        None => None,
    };
    if json {
        let doc = serde_json::json!({ "file": file.display().to_string(), "format": ck.format.to_string(), "tensors": ck.len(), "sections": ck.sections, "config": config_note, "mid_blocks": found });
        let _ = writeln!(out, "{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
        return Ok(());
    }
    let sections = if ck.sections.is_empty() {
        String::new()
    } else {
        format!(", sections: {}", ck.sections.join(", "))
    };
    let file_name = line(&file.display().to_string());
    let _ = writeln!(
        out,
        "{file_name}: {}, {} tensors{}",
        ck.format,
        ck.len(),
        line(&sections)
    );
    if let Some(note) = &config_note {
        let _ = writeln!(out, "{}", line(note));
    }
    if found.is_empty() {
        let _ = writeln!(out, "no mid block found");
    }
    for f in &found {
        print_found(f, out);
    }
    Ok(())
}

/// The checkpoint `detect` reads and the model's config.json: the repo's, or one beside a
/// checkpoint in a diffusers folder.
fn checkpoint_and_config(file: Option<PathBuf>, hub: &HubArgs) -> Result<(PathBuf, Option<PathBuf>), ParityError> {
    match (file, hub.repo()) {
        // A diffusers model folder: its weight file, and its config.json when it has one.
        (Some(f), None) if f.is_dir() => {
            let weights = crate::model::weight_file(&f).ok_or_else(|| ParityError::Checkpoint {
                path: f.clone(),
                message: format!(
                    "a folder: detect looks in a diffusers model folder for {}, and this one has none",
                    crate::model::WEIGHT_FILES.join(", ")
                ),
            })?;
            Ok((weights, Some(f.join("config.json")).filter(|c| c.is_file())))
        }
        (Some(f), None) => {
            let beside = f.parent().map(|d| d.join("config.json")).filter(|c| c.is_file());
            Ok((f, beside))
        }
        (None, Some(repo)) => {
            let (config, file) = repo.model_files()?;
            Ok((file, Some(config)))
        }
        _ => Err(ParityError::Usage(
            "detect takes a checkpoint FILE or --repo, one of them".into(),
        )),
    }
}

/// Fill in the found blocks' kwargs from the model's config.json; the note saying so. A
/// config.json that is not a diffusers model's is left out, with a note.
fn apply_config(config: &std::path::Path, found: &mut [crate::detect::Found]) -> Result<String, ParityError> {
    let json = match crate::files::read_json(config) {
        Ok(json) => json,
        Err(ParityError::Checkpoint { .. }) => return Ok(format!("config: {} not used (not JSON)", config.display())),
        Err(e) => return Err(e),
    };
    Ok(match crate::detect::apply_config(found, &json) {
        Ok(()) => format!("config: {}", config.display()),
        Err(e) => format!("config: {} not used ({e})", config.display()),
    })
}

/// One found block: where, which, its variant, and its config from the keys or config.json.
fn print_found(f: &crate::detect::Found, out: &mut dyn Write) {
    let at = if f.prefix.is_empty() && f.block == Some(unet_attention::diffusers::ControlNetMidBlock::BLOCK) {
        "the top level (ControlNetModel: mid_block.* and controlnet_mid_block.*; no --prefix needed)".to_string()
    } else if f.prefix.is_empty() {
        "the top level (a bare mid-block state dict; no --prefix needed)".to_string()
    } else {
        format!("prefix `{}`", line(&f.prefix))
    };
    let _ = writeln!(out, "{at}: {}", f.block.unwrap_or("(not implemented)"));
    let _ = writeln!(out, "  variant: {}", f.variant);
    let _ = writeln!(out, "  from the keys: {}", serde_json::Value::Object(f.config.clone()));
    match &f.from_config {
        Some(kwargs) => {
            let _ = writeln!(out, "  from config.json (what `check --config` builds): {kwargs}");
        }
        None => {
            for u in &f.unknown {
                let _ = writeln!(out, "  not in the keys: {}", line(u));
            }
        }
    }
}

/// A name or note from a file, on one line with nothing a terminal would act on
/// ([`crate::terminal::one_line`]).
pub(super) fn line(s: &str) -> String {
    crate::terminal::one_line(s).into_owned()
}

pub(super) use crate::trace::sci;

pub(super) fn print_table(results: &[(PathBuf, Result<Report, ParityError>)], out: &mut dyn Write) {
    let header = [
        "FILE",
        "BLOCK",
        "INPUTS",
        "MAX_ABS",
        "MAX_REL",
        "TOL(atol/rtol)",
        "VS_F64(ours/torch)",
        "RESULT",
    ];
    let mut rows: Vec<[String; 8]> = vec![header.map(String::from)];
    for (file, r) in results {
        match r {
            Ok(rep) => {
                // The row shows the worst output: the first failing one, else the largest error.
                let worst = rep
                    .outputs
                    .iter()
                    .find(|o| !o.pass)
                    .or_else(|| rep.outputs.iter().max_by(|a, b| a.max_abs.total_cmp(&b.max_abs)));
                let inputs = rep
                    .inputs
                    .iter()
                    .map(|(n, s)| format!("{n}{s:?}"))
                    .collect::<Vec<_>>()
                    .join(" ")
                    .replace(' ', "");
                let (abs, rel, tol, f64s) = match worst {
                    Some(o) => (
                        sci(o.max_abs),
                        sci(o.max_rel),
                        format!("{:.1e}/{:.1e}", o.atol, o.rtol),
                        match (o.ours_vs_f64, o.torch_vs_f64) {
                            (Some(a), Some(b)) => format!("{}/{}", sci(a), sci(b)),
                            _ => "-".into(),
                        },
                    ),
                    None => Default::default(),
                };
                let mut result = rep.outcome.word().to_string();
                if let Some(stage) = rep.trace.as_ref().and_then(|t| t.diverging_under_pass()) {
                    result.push_str(&format!(" (stage `{stage}` differs: see the warning)"));
                }
                if !rep.loosened.is_empty() {
                    result.push_str(&format!(" (loosened: {})", rep.loosened.join(", ")));
                }
                rows.push([rep.file.clone(), rep.block.clone(), inputs, abs, rel, tol, f64s, result]);
            }
            Err(_) => rows.push([
                file.display().to_string(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "ERROR".into(),
            ]),
        }
    }
    let rows: Vec<[String; 8]> = rows.into_iter().map(|r| r.map(|c| line(&c))).collect();
    let widths: Vec<usize> = (0..8)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    for row in rows {
        let line: Vec<String> = row.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
}

/// The `--trace` table of one bundle.
pub(super) fn print_trace(file: &str, t: &crate::trace::TraceReport, out: &mut dyn Write) {
    let _ = writeln!(out, "trace {}:", line(file));
    let _ = write!(out, "{t}");
}

pub(super) fn inspect(file: &std::path::Path, out: &mut dyn Write) -> Result<(), ParityError> {
    let is_pickle = crate::files::open_regular(file).ok().and_then(|mut f| {
        let mut magic = [0u8; 4];
        std::io::Read::read_exact(&mut f, &mut magic)
            .ok()
            .map(|_| magic == *b"PK\x03\x04")
    });
    if is_pickle == Some(true) {
        return inspect_checkpoint(file, out);
    }
    // The header only: a 5 GB file is listed without reading its tensors.
    let (metadata, infos) = bundle::read_header(file)?;
    if metadata.contains_key("parity.format") {
        // Validate as a bundle too, so a broken bundle is reported here as well (before any
        // output: an error leaves no partial listing).
        Bundle::from_raw(file, (metadata.clone(), infos.clone(), Default::default()))?;
    }
    let _ = writeln!(out, "{}", line(&file.display().to_string()));
    let _ = writeln!(out, "metadata:");
    for (k, v) in &metadata {
        let _ = writeln!(out, "  {} = {}", line(k), line(v));
    }
    let _ = writeln!(out, "tensors ({}):", infos.len());
    let names: Vec<String> = infos.iter().map(|i| line(&i.name)).collect();
    let width = names.iter().map(|n| n.chars().count()).max().unwrap_or(0);
    for (i, name) in infos.iter().zip(&names) {
        let _ = writeln!(out, "  {name:<width$}  {:<5}  {:?}", i.dtype, i.shape);
    }
    Ok(())
}

/// A `torch.save` checkpoint: sections, string entries, every tensor's flattened name, dtype, shape.
pub(super) fn inspect_checkpoint(file: &std::path::Path, out: &mut dyn Write) -> Result<(), ParityError> {
    let ck = Checkpoint::open(file)?;
    let _ = writeln!(out, "{}: {}", line(&file.display().to_string()), ck.format);
    if !ck.sections.is_empty() {
        let _ = writeln!(out, "sections: {}", line(&ck.sections.join(", ")));
    }
    for (k, v) in &ck.strings {
        let _ = writeln!(out, "  {} = {}", line(k), line(&format!("{v:?}")));
    }
    let _ = writeln!(out, "tensors ({}):", ck.len());
    let width = ck.names().map(|n| n.len()).max().unwrap_or(0);
    for name in ck.names() {
        let dtype = ck.dtype(name).map(crate::check::dtype_name).unwrap_or("unsupported");
        let shape = ck.shape(name).map(|s| format!("{s:?}")).unwrap_or_default();
        let _ = writeln!(out, "  {:<width$}  {dtype:<5}  {shape}", line(name));
    }
    Ok(())
}

pub(super) fn blocks(out: &mut dyn Write) -> Result<(), ParityError> {
    let all = registry::all();
    let width = all.iter().map(|b| b.id.len()).max().unwrap_or(0);
    for b in &all {
        let _ = writeln!(out, "{:<width$}  {}", b.id, b.pytorch);
        let _ = writeln!(out, "{:<width$}    inputs: {}", "", b.inputs.join(", "));
        if !b.kwargs.is_empty() {
            let _ = writeln!(out, "{:<width$}    kwargs: {}", "", b.kwargs.join(", "));
        }
    }
    Ok(())
}
