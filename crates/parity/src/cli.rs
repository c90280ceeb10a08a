//! The `unet-parity` command line. `main.rs` only forwards to [`run`], so the tests drive the
//! exact code path the binary runs.

use crate::bundle::{self, parse_dtype, Bundle};
use crate::check::{check_file, Options, Report, WeightsFrom};
use crate::checkpoint::Checkpoint;
use crate::error::ParityError;
use crate::hub::HubRepo;
use crate::weights::conversion_note;
use crate::{guard, registry};
use clap::{Args, Parser, Subcommand};
use std::io::Write;
use std::path::PathBuf;

/// Exit code: every bundle passed.
pub const EXIT_PASS: i32 = 0;
/// Exit code: at least one output did not match.
pub const EXIT_MISMATCH: i32 = 1;
/// Exit code: unusable input (unreadable file, not a bundle, unknown block, bad config or
/// weights, bad command line).
pub const EXIT_UNUSABLE: i32 = 2;

#[derive(Parser, Debug)]
#[command(
    name = "unet-parity",
    version,
    about = "Check Candle ports of diffusion U-Net attention blocks against PyTorch reference bundles"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run every bundle's block and compare with PyTorch's outputs.
    Check {
        /// Bundle files or folders (searched recursively for *.safetensors).
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Print one JSON document instead of the table.
        #[arg(long)]
        json: bool,
        /// Absolute tolerance, finite and ≥ 0 (default: torch.testing.assert_close's for the
        /// dtype, or the bundle's).
        #[arg(long, value_parser = parse_tolerance)]
        atol: Option<f64>,
        /// Relative tolerance, finite and ≥ 0 (default: torch.testing.assert_close's for the
        /// dtype, or the bundle's).
        #[arg(long, value_parser = parse_tolerance)]
        rtol: Option<f64>,
        /// Run in this dtype instead of the bundle's, and compare with PyTorch's float64 output
        /// (f64: at float64 tolerances; f32/f16/bf16: also passes within 2× PyTorch's own error
        /// in the bundle's dtype).
        #[arg(long, value_parser = ["f32", "f16", "bf16", "f64"])]
        dtype: Option<String>,
        /// Where the blocks run: cpu, cuda[:N] or metal[:N] (N defaults to 0). CUDA and Metal
        /// need a build with `--features cuda` / `--features metal` and the device present.
        #[arg(long, default_value = "cpu", value_parser = parse_device)]
        device: DeviceSpec,
        /// Do not fail when the bundle holds weights the block does not use.
        #[arg(long)]
        allow_unused: bool,
        /// Take the block's weights from this checkpoint (safetensors, sharded
        /// `*.safetensors.index.json`, or a torch.save `.bin`/`.pt`/`.pth`/`.ckpt`), read lazily.
        #[arg(long, value_name = "FILE")]
        weights: Option<PathBuf>,
        /// The block's key prefix in the checkpoint (`mid_block.`, `model.`, `ema_model.model.`,
        /// `first_stage_model.decoder.mid.`, `model.diffusion_model.middle_block.` ...; the final
        /// dot may be left out); see `detect`.
        #[arg(long, value_name = "P")]
        prefix: Option<String>,
        /// A diffusers `config.json` (UNet2DModel, UNet2DConditionModel, AutoencoderKL): the mid
        /// block's config comes from it instead of the bundle.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Accept config.json keys the model class does not have.
        #[arg(long)]
        allow_unknown_config: bool,
        /// Also compare the intermediate stages (`parity.trace.*`: norm, q, k, v, probs, attn,
        /// proj, output) and name the first stage that diverges, with its usual causes.
        #[arg(long)]
        trace: bool,
        #[command(flatten)]
        hub: HubArgs,
    },
    /// Find the mid blocks in a checkpoint: family, variant, the config its keys tell and what
    /// they cannot.
    Detect {
        /// A checkpoint file (or use --repo).
        file: Option<PathBuf>,
        /// Only blocks under this prefix.
        #[arg(long, value_name = "P")]
        prefix: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        hub: HubArgs,
    },
    /// Print a bundle's metadata and tensors (or a torch.save checkpoint's sections and tensors).
    Inspect {
        /// A safetensors file or a torch.save zip checkpoint.
        file: PathBuf,
    },
    /// List the blocks this tool knows, with the PyTorch class each matches.
    Blocks,
    /// Write PNG pictures of the error: over (H, W) per batch item and for the worst channels of
    /// an image-shaped output, and the attention map of one query pixel (PyTorch | ours | diff).
    Show {
        /// A bundle file.
        bundle: PathBuf,
        /// Folder for the PNGs (created).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// The query pixel `y,x` of the attention map (default: the image centre).
        #[arg(long, value_name = "Y,X", value_parser = parse_query)]
        query: Option<(usize, usize)>,
        /// The batch item of the attention map.
        #[arg(long, default_value_t = 0)]
        batch: usize,
        /// Take the block's weights from this checkpoint, as `check --weights` does.
        #[arg(long, value_name = "FILE")]
        weights: Option<PathBuf>,
        /// The block's key prefix in the checkpoint, as `check --prefix`.
        #[arg(long, value_name = "P")]
        prefix: Option<String>,
        /// A diffusers `config.json` for the block's config, as `check --config`.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Accept config.json keys the model class does not have.
        #[arg(long)]
        allow_unknown_config: bool,
        #[command(flatten)]
        hub: HubArgs,
    },
}

fn parse_query(s: &str) -> Result<(usize, usize), String> {
    let (y, x) = s.split_once(',').ok_or_else(|| format!("expected Y,X, found {s:?}"))?;
    let num = |v: &str| {
        v.trim()
            .parse::<usize>()
            .map_err(|_| format!("expected Y,X, found {s:?}"))
    };
    Ok((num(y)?, num(x)?))
}

/// A diffusers model on the Hugging Face Hub (local cache first).
#[derive(Args, Debug, Clone)]
struct HubArgs {
    /// `org/name`: take `config.json` and the weights from this Hub repository (with --subfolder),
    /// from the local cache when present.
    #[arg(long, value_name = "ORG/NAME")]
    repo: Option<String>,
    /// Branch, tag or commit of --repo.
    #[arg(long, requires = "repo")]
    revision: Option<String>,
    /// Folder inside --repo (`unet`, `vae`).
    #[arg(long, requires = "repo")]
    subfolder: Option<String>,
    /// The Hugging Face cache folder (default: HF_HUB_CACHE, $HF_HOME/hub, ~/.cache/huggingface/hub).
    #[arg(long, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// Never use the network (also HF_HUB_OFFLINE=1).
    #[arg(long)]
    offline: bool,
}

impl HubArgs {
    fn repo(&self) -> Option<HubRepo> {
        self.repo.as_ref().map(|repo| HubRepo {
            repo: repo.clone(),
            revision: self.revision.clone(),
            subfolder: self.subfolder.clone(),
            cache_dir: self.cache_dir.clone(),
            offline: self.offline,
        })
    }
}

/// Run the CLI on `args` (including the program name); returns the exit code. Everything it
/// prints passes through [`crate::terminal::Safe`]: names from files cannot steer the terminal.
pub fn run<I, T>(args: I, out: &mut dyn Write, err: &mut dyn Write) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let (mut out, mut err) = (crate::terminal::Safe::new(out), crate::terminal::Safe::new(err));
    let code = run_unescaped(args, &mut out, &mut err);
    // Output that could not be written (a full disk, /dev/full) is a failed run, said once; a
    // reader that went away (`| head`) is not worth a message.
    match out.failed().map(|e| (e.kind(), e.to_string())) {
        Some((std::io::ErrorKind::BrokenPipe, _)) => code,
        Some((_, e)) => {
            let _ = writeln!(err, "error: cannot write the output: {e}");
            EXIT_UNUSABLE
        }
        None => code,
    }
}

fn run_unescaped<I, T>(args: I, out: &mut dyn Write, err: &mut dyn Write) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_UNUSABLE } else { EXIT_PASS };
            let _ = if e.use_stderr() {
                write!(err, "{e}")
            } else {
                write!(out, "{e}")
            };
            return code;
        }
    };
    let result = match cli.command {
        Command::Check {
            paths,
            json,
            atol,
            rtol,
            dtype,
            device,
            allow_unused,
            weights,
            prefix,
            config,
            allow_unknown_config,
            trace,
            hub,
        } => {
            let device = match open_device(device) {
                Ok(device) => device,
                Err(message) => {
                    let _ = writeln!(err, "error: {message}");
                    return EXIT_UNUSABLE;
                }
            };
            let (weights, config) = match resolve_model(weights, prefix, config, &hub) {
                Ok(resolved) => resolved,
                Err(e) => {
                    let _ = writeln!(err, "error: {e}");
                    return EXIT_UNUSABLE;
                }
            };
            let opts = Options {
                atol,
                rtol,
                dtype: dtype.as_deref().and_then(parse_dtype),
                allow_unused,
                device,
                weights,
                model_config: config,
                allow_unknown_config,
                trace,
            };
            return check(&paths, &opts, json, out, err);
        }
        Command::Detect {
            file,
            prefix,
            json,
            hub,
        } => {
            let label = file
                .clone()
                .unwrap_or_else(|| PathBuf::from(hub.repo.clone().unwrap_or_default()));
            guard::catch(&label, || detect(file, prefix.as_deref(), json, &hub, out))
        }
        Command::Inspect { file } => guard::catch(&file, || inspect(&file, out)),
        Command::Blocks => blocks(out),
        Command::Show {
            bundle,
            out: dir,
            query,
            batch,
            weights,
            prefix,
            config,
            allow_unknown_config,
            hub,
        } => guard::catch(&bundle, || {
            let (weights, model_config) = resolve_model(weights, prefix, config, &hub)?;
            let opts = Options {
                weights,
                model_config,
                allow_unknown_config,
                ..Options::default()
            };
            let b = Bundle::read(&bundle)?;
            for p in crate::show::show(&b, &dir, query, batch, opts)? {
                let _ = writeln!(
                    out,
                    "wrote {}: {}",
                    line(&p.path.display().to_string()),
                    line(&p.caption)
                );
            }
            Ok(())
        }),
    };
    match result {
        Ok(()) => EXIT_PASS,
        Err(e) => {
            let _ = writeln!(err, "error: {e}");
            EXIT_UNUSABLE
        }
    }
}

/// A `--device` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSpec {
    Cpu,
    Cuda(usize),
    Metal(usize),
}

impl std::fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceSpec::Cpu => write!(f, "cpu"),
            DeviceSpec::Cuda(n) => write!(f, "cuda:{n}"),
            DeviceSpec::Metal(n) => write!(f, "metal:{n}"),
        }
    }
}

/// Parse `cpu`, `cuda`, `cuda:N`, `metal`, `metal:N`.
pub fn parse_device(s: &str) -> Result<DeviceSpec, String> {
    let (kind, ordinal) = match s.split_once(':') {
        Some((kind, n)) => {
            let n = n
                .parse::<usize>()
                .map_err(|_| format!("`{s}`: the device ordinal after `:` must be a number, e.g. cuda:0"))?;
            (kind, Some(n))
        }
        None => (s, None),
    };
    match (kind, ordinal) {
        ("cpu", None) => Ok(DeviceSpec::Cpu),
        ("cuda", n) => Ok(DeviceSpec::Cuda(n.unwrap_or(0))),
        ("metal", n) => Ok(DeviceSpec::Metal(n.unwrap_or(0))),
        _ => Err(format!("`{s}` is not a device; expected cpu, cuda[:N] or metal[:N]")),
    }
}

/// Open the device, or say in one line why it cannot be used. The backend is chosen at run
/// time: `Device::new_cuda`/`new_metal` exist in every build and return an error when Candle
/// was built without the feature; a panic while initialising a driver is caught too.
pub fn open_device(spec: DeviceSpec) -> Result<candle_core::Device, String> {
    use candle_core::utils::{cuda_is_available, metal_is_available};
    let (compiled, feature) = match spec {
        DeviceSpec::Cpu => return Ok(candle_core::Device::Cpu),
        DeviceSpec::Cuda(_) => (cuda_is_available(), "cuda"),
        DeviceSpec::Metal(_) => (metal_is_available(), "metal"),
    };
    if !compiled {
        return Err(format!(
            "device {spec}: this unet-parity was built without {} support; rebuild with `--features {feature}` \
             (e.g. `cargo run --release -p unet-parity --features {feature} -- check --device {spec} ...`)",
            feature.to_uppercase().replace("METAL", "Metal")
        ));
    }
    let label = std::path::PathBuf::from(format!("device {spec}"));
    let opened = guard::catch(&label, || {
        let device = match spec {
            DeviceSpec::Cuda(n) => candle_core::Device::new_cuda(n),
            DeviceSpec::Metal(n) => candle_core::Device::new_metal(n),
            DeviceSpec::Cpu => Ok(candle_core::Device::Cpu),
        };
        device.map_err(|e| ParityError::Usage(e.to_string()))
    });
    opened.map_err(|e| match e {
        ParityError::Internal { message, .. } => format!("device {spec} failed to initialise: {message}"),
        other => format!("device {spec} is not available: {other}"),
    })
}

fn check(paths: &[PathBuf], opts: &Options, json: bool, out: &mut dyn Write, err: &mut dyn Write) -> i32 {
    let files = match crate::files::collect(paths) {
        Ok(found) => {
            let names = |paths: &[PathBuf]| {
                let names: Vec<String> = paths.iter().map(|p| line(&p.display().to_string())).collect();
                names.join(", ")
            };
            if !found.skipped.is_empty() {
                let _ = writeln!(
                    err,
                    "note: skipped {} safetensors files without parity.* metadata (model checkpoints, not bundles): {}",
                    found.skipped.len(),
                    names(&found.skipped)
                );
            }
            if !found.links.is_empty() {
                let _ = writeln!(
                    err,
                    "note: did not follow {} symbolic links to folders (name the folder itself to check it): {}",
                    found.links.len(),
                    names(&found.links)
                );
            }
            found.bundles
        }
        Err(e) => {
            let _ = writeln!(err, "error: {e}");
            return EXIT_UNUSABLE;
        }
    };
    let results: Vec<(PathBuf, Result<Report, ParityError>)> = files
        .iter()
        .map(|f| (f.clone(), guard::catch(f, || check_file(f, opts))))
        .collect();
    let passed = results.iter().filter(|(_, r)| matches!(r, Ok(r) if r.pass)).count();
    let failed = results.iter().filter(|(_, r)| matches!(r, Ok(r) if !r.pass)).count();
    let errors = results.len() - passed - failed;
    let code = if errors > 0 {
        EXIT_UNUSABLE
    } else if failed > 0 {
        EXIT_MISMATCH
    } else {
        EXIT_PASS
    };
    if json {
        let items: Vec<serde_json::Value> = results
            .iter()
            .map(|(f, r)| match r {
                Ok(report) => serde_json::to_value(report).unwrap_or_default(),
                Err(e) => serde_json::json!({ "file": f.display().to_string(), "error": e.to_string() }),
            })
            .collect();
        let doc = serde_json::json!({ "bundles": items, "passed": passed, "failed": failed, "errors": errors, "exit_code": code });
        let _ = writeln!(out, "{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
    } else {
        print_table(&results, out);
        for (_, r) in &results {
            match r {
                Err(e) => {
                    let _ = writeln!(err, "error: {e}");
                }
                Ok(report) => {
                    if let Some(w) = &report.weights {
                        let _ = writeln!(err, "note: {}: weights from {}", line(&report.file), line(w));
                    }
                    if let Some(c) = &report.config_from {
                        let _ = writeln!(err, "note: {}: config from {}", line(&report.file), line(c));
                    }
                    if let Some(note) = conversion_note(&report.conversions) {
                        let _ = writeln!(err, "note: {}: {}", line(&report.file), line(&note));
                    }
                    if let Some(t) = &report.trace {
                        print_trace(&report.file, t, out);
                    }
                    for o in report.outputs.iter().filter(|o| !o.pass) {
                        let _ = writeln!(
                            out,
                            "FAIL {} output `{}`: {}",
                            line(&report.file),
                            line(&o.name),
                            line(o.reason.as_deref().unwrap_or(""))
                        );
                    }
                }
            }
        }
        let tail = if errors > 0 {
            format!(", {errors} unusable")
        } else {
            String::new()
        };
        let _ = writeln!(out, "{passed} passed, {failed} failed{tail}");
    }
    code
}

/// `--weights`/`--prefix`/`--config`, or `--repo` resolving `config.json` and the weights
/// (with the mid block's prefix from the config unless `--prefix`).
fn resolve_model(
    weights: Option<PathBuf>,
    prefix: Option<String>,
    config: Option<PathBuf>,
    hub: &HubArgs,
) -> Result<(Option<WeightsFrom>, Option<PathBuf>), ParityError> {
    let Some(repo) = hub.repo() else {
        if prefix.is_some() && weights.is_none() {
            return Err(ParityError::Usage("--prefix needs --weights (or --repo)".into()));
        }
        let weights = weights.map(|file| WeightsFrom {
            file,
            prefix: key_prefix(prefix.unwrap_or_default()),
        });
        return Ok((weights, config));
    };
    if weights.is_some() || config.is_some() {
        return Err(ParityError::Usage(
            "--repo resolves config.json and the weights itself; drop --weights / --config".into(),
        ));
    }
    let (config, file) = repo.model_files()?;
    let prefix = match prefix {
        Some(p) => p,
        None => {
            let text = crate::files::read_text(&config)?;
            let json: serde_json::Value = serde_json::from_str(&text).map_err(|e| ParityError::Checkpoint {
                path: config.clone(),
                message: format!("not JSON: {e}"),
            })?;
            let specs = unet_attention::diffusers::model_config::mid_blocks(&json, None, true).map_err(|e| {
                ParityError::Checkpoint {
                    path: config.clone(),
                    message: e.to_string(),
                }
            })?;
            match specs.as_slice() {
                [one] => one.key_prefix(),
                [] => {
                    return Err(ParityError::Usage(format!(
                        "{}: the model has no mid block",
                        config.display()
                    )))
                }
                many => {
                    return Err(ParityError::Usage(format!(
                        "the model has several mid blocks ({}); pick one with --prefix",
                        many.iter().map(|s| s.key_prefix()).collect::<Vec<_>>().join(", ")
                    )))
                }
            }
        }
    };
    Ok((
        Some(WeightsFrom {
            file,
            prefix: key_prefix(prefix),
        }),
        Some(config),
    ))
}

/// A `--prefix` as the keys continue it: `mid_block` and `mid_block.` both mean `mid_block.`
/// (empty: the whole file).
fn key_prefix(mut prefix: String) -> String {
    if !prefix.is_empty() && !prefix.ends_with('.') {
        prefix.push('.');
    }
    prefix
}

fn detect(
    file: Option<PathBuf>,
    prefix: Option<&str>,
    json: bool,
    hub: &HubArgs,
    out: &mut dyn Write,
) -> Result<(), ParityError> {
    // The model's config.json: the repo's, or one beside a checkpoint in a diffusers folder.
    let (file, config) = match (file, hub.repo()) {
        (Some(f), None) => {
            let beside = f.parent().map(|d| d.join("config.json")).filter(|c| c.is_file());
            (f, beside)
        }
        (None, Some(repo)) => {
            let (config, file) = repo.model_files()?;
            (file, Some(config))
        }
        _ => {
            return Err(ParityError::Usage(
                "detect takes a checkpoint FILE or --repo, one of them".into(),
            ))
        }
    };
    let ck = Checkpoint::open(&file)?;
    let mut found = crate::detect::detect(&ck, prefix);
    let mut config_note = None;
    if let Some(config) = &config {
        let text = crate::files::read_text(config)?;
        let json: Option<serde_json::Value> = serde_json::from_str(&text).ok();
        // A config.json that is not a diffusers model's is left out, with a note.
        config_note = Some(match json.map(|j| crate::detect::apply_config(&mut found, &j)) {
            Some(Ok(())) => format!("config: {}", config.display()),
            Some(Err(e)) => format!("config: {} not used ({e})", config.display()),
            None => format!("config: {} not used (not JSON)", config.display()),
        });
    }
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
    Ok(())
}

/// A name or note from a file, on one line with nothing a terminal would act on
/// ([`crate::terminal::one_line`]).
fn line(s: &str) -> String {
    crate::terminal::one_line(s).into_owned()
}

fn sci(x: f64) -> String {
    if x.is_nan() {
        "-".into()
    } else {
        format!("{x:.2e}")
    }
}

fn print_table(results: &[(PathBuf, Result<Report, ParityError>)], out: &mut dyn Write) {
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
                let result = if rep.pass { "PASS" } else { "FAIL" };
                rows.push([
                    rep.file.clone(),
                    rep.block.clone(),
                    inputs,
                    abs,
                    rel,
                    tol,
                    f64s,
                    result.into(),
                ]);
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
fn print_trace(file: &str, t: &crate::trace::TraceReport, out: &mut dyn Write) {
    let _ = writeln!(out, "trace {}:", line(file));
    if let Some(note) = &t.note {
        let _ = writeln!(out, "  ({})", line(note));
    }
    if !t.stages.is_empty() {
        let mut rows: Vec<[String; 6]> =
            vec![["STAGE", "SHAPE(torch)", "SHAPE(ours)", "MAX_ABS", "MAX_REL", "RESULT"].map(String::from)];
        for s in &t.stages {
            let (abs, rel) = s
                .compare
                .as_ref()
                .map_or(("-".into(), "-".into()), |c| (sci(c.max_abs), sci(c.max_rel)));
            let shape = |d: &[usize]| format!("{d:?}").replace(' ', "");
            rows.push([
                s.stage.clone(),
                shape(&s.shape),
                s.ours_shape.as_deref().map_or("-".into(), shape),
                abs,
                rel,
                s.status.clone(),
            ]);
        }
        let rows: Vec<[String; 6]> = rows.into_iter().map(|r| r.map(|c| line(&c))).collect();
        let widths: Vec<usize> = (0..6)
            .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
            .collect();
        for row in rows {
            let line: Vec<String> = row.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
            let _ = writeln!(out, "  {}", line.join("  ").trim_end());
        }
    }
    match (&t.first_divergence, &t.hint) {
        (Some(stage), Some(hint)) => {
            let _ = writeln!(out, "  first divergence: `{stage}` — usual causes: {hint}");
        }
        _ if !t.stages.is_empty() => {
            let _ = writeln!(out, "  no stage diverges");
        }
        _ => {}
    }
}

fn inspect(file: &std::path::Path, out: &mut dyn Write) -> Result<(), ParityError> {
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
fn inspect_checkpoint(file: &std::path::Path, out: &mut dyn Write) -> Result<(), ParityError> {
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

fn blocks(out: &mut dyn Write) -> Result<(), ParityError> {
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

/// `--atol` / `--rtol`: a finite number ≥ 0 (an infinite, NaN or negative tolerance would pass
/// anything or nothing), else a usage error (exit 2).
fn parse_tolerance(s: &str) -> std::result::Result<f64, String> {
    let t: f64 = s.trim().parse().map_err(|_| format!("not a number: {s:?}"))?;
    crate::compare::check_tolerance(t).map(|()| t)
}
