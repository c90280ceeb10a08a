//! The `unet-parity` command line. `main.rs` only forwards to [`run`], so the tests drive the
//! exact code path the binary runs.

use crate::bundle::{parse_dtype, Bundle, Load};
use crate::check::{check_file, Options, Report, WeightsFrom};
use crate::error::ParityError;
use crate::guard;
use crate::hub::HubRepo;
use crate::weights::conversion_note;
use clap::{Args, Parser, Subcommand};
use print::{blocks, detect, inspect, line, print_table, print_trace};
use std::io::Write;
use std::path::PathBuf;

mod memory_args;
mod print;
mod threads;
use memory_args::MemoryArgs;

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
        /// (f64: at float64 tolerances; f32/f16/bf16: also passes within PyTorch's own error
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
        /// Exactness only: pass an output only when it is bit-identical to PyTorch's or within
        /// the dtype's tolerance of it, never by PyTorch's own error against float64; refuse
        /// tolerances above the dtype's defaults (from the bundle or --atol/--rtol).
        #[arg(long)]
        strict: bool,
        #[command(flatten)]
        memory: MemoryArgs,
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
        memory: MemoryArgs,
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
    threads::cap(&mut err);
    let code = run_unescaped(args, &mut out, &mut err);
    // Output that could not be written (a full disk, /dev/full, a reader that went away) is a
    // failed run, said once: the table or the JSON was lost.
    match out.failed().map(|e| (e.kind(), e.to_string())) {
        Some((std::io::ErrorKind::BrokenPipe, _)) => {
            let _ = writeln!(
                err,
                "error: cannot write the output: standard output was closed before everything was written"
            );
            EXIT_UNUSABLE
        }
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
            strict,
            memory,
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
                strict,
            };
            return check(&paths, &opts, &memory, json, out, err);
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
            memory,
            hub,
        } => guard::catch(&bundle, || {
            let (weights, model_config) = resolve_model(weights, prefix, config, &hub)?;
            memory.check_fits(&bundle, Load::All, None)?;
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

fn check(
    paths: &[PathBuf],
    opts: &Options,
    memory: &MemoryArgs,
    json: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> i32 {
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
        .map(|f| {
            let load = if opts.trace { Load::All } else { Load::NoStages };
            let checked = guard::catch(f, || {
                memory.check_fits(f, load, opts.dtype.map(crate::check::dtype_name))?;
                check_file(f, opts)
            });
            (f.clone(), checked)
        })
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

/// `--atol` / `--rtol`: a finite number ≥ 0 (an infinite, NaN or negative tolerance would pass
/// anything or nothing), else a usage error (exit 2).
fn parse_tolerance(s: &str) -> std::result::Result<f64, String> {
    let t: f64 = s.trim().parse().map_err(|_| format!("not a number: {s:?}"))?;
    crate::compare::check_tolerance(t).map(|()| t)
}
