//! The `unet-parity` command line. `main.rs` only forwards to [`run_main`] ([`run`] plus rayon's
//! pool joined by the main thread), so the tests drive the code path the binary runs.

use crate::bundle::{Bundle, Load};
use crate::check::{Options, WeightsFrom};
use crate::error::ParityError;
use crate::guard;
use args::{Cli, Command, HubArgs, ShowArgs};
use clap::Parser;
use print::{blocks, detect, inspect, line};
use std::io::Write;
use std::path::PathBuf;

mod args;
mod check;
mod memory_args;
mod print;
mod threads;

/// Exit code: every bundle passed.
pub const EXIT_PASS: i32 = 0;
/// Exit code: at least one output did not match.
pub const EXIT_MISMATCH: i32 = 1;
/// Exit code: unusable input (unreadable file, not a bundle, unknown block, bad config or
/// weights, bad command line).
pub const EXIT_UNUSABLE: i32 = 2;
/// Exit code: no output failed, and at least one could not be judged (inconclusive: PyTorch's
/// output is not a plausible rounding of its float64 output; the reason says what to check).
pub const EXIT_INCONCLUSIVE: i32 = 3;

/// Run the CLI on `args` (including the program name); returns the exit code. Everything it
/// prints passes through [`crate::terminal::Safe`]: names from files cannot steer the terminal.
pub fn run<I, T>(args: I, out: &mut dyn Write, err: &mut dyn Write) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    run_with(args, out, err, false)
}

/// [`run`] as the binary runs it, from its main thread: once the thread counts are capped,
/// rayon's global pool is built with this thread as one of its workers
/// (`unet_attention::cpu_kernels::join_rayon_pool`), so the blocks' parallel loops start here
/// rather than being handed to the pool. The tests call [`run`], which leaves the pool alone
/// (their threads come and go).
pub fn run_main<I, T>(args: I, out: &mut dyn Write, err: &mut dyn Write) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    run_with(args, out, err, true)
}

fn run_with<I, T>(args: I, out: &mut dyn Write, err: &mut dyn Write, join_pool: bool) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let (mut out, mut err) = (crate::terminal::Safe::new(out), crate::terminal::Safe::new(err));
    threads::cap(&mut err);
    if join_pool {
        unet_attention::cpu_kernels::join_rayon_pool();
    }
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
        // `check` counts passes and failures itself; the others pass or fail as a whole.
        Command::Check(args) => return check::run(args, out, err),
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
        Command::Show(args) => guard::catch(&args.bundle, || show(&args, out, err)),
    };
    match result {
        Ok(()) => EXIT_PASS,
        Err(e) => {
            let _ = writeln!(err, "error: {e}");
            EXIT_UNUSABLE
        }
    }
}

/// `show`: the pictures of one bundle's error, one line per file written, and a `note:` on
/// `err` for each picture left out, with why.
fn show(args: &ShowArgs, out: &mut dyn Write, err: &mut dyn Write) -> Result<(), ParityError> {
    let (weights, model_config) = resolve_model(
        args.weights.clone(),
        args.prefix.clone(),
        args.config.clone(),
        &args.hub,
    )?;
    args.memory
        .check_fits(&args.bundle, Load::All, None, weights.as_ref())?;
    let opts = Options {
        weights,
        model_config,
        allow_unknown_config: args.allow_unknown_config,
        ..Options::default()
    };
    let b = Bundle::read(&args.bundle)?;
    let shown = crate::show::show(&b, &args.out, args.query, args.batch, opts)?;
    for p in &shown.pictures {
        let _ = writeln!(
            out,
            "wrote {}: {}",
            line(&p.path.display().to_string()),
            line(&p.caption)
        );
    }
    for why in &shown.left_out {
        let _ = writeln!(err, "note: {}: {}", line(&args.bundle.display().to_string()), line(why));
    }
    Ok(())
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
    let device = opened.map_err(|e| match e {
        ParityError::Internal { message, .. } => format!("device {spec} failed to initialise: {message}"),
        other => format!("device {spec} is not available: {other}"),
    })?;
    // The TF32 mode (`UNET_ATTENTION_TF32`) read now, before the first f32 GEMM, and a bad value
    // reported here.
    #[cfg(feature = "cuda")]
    if device.is_cuda() {
        unet_attention::cuda::tf32().map_err(|e| format!("device {spec}: {e}"))?;
    }
    Ok(device)
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
            let json = crate::files::read_json(&config)?;
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
