//! The command line's grammar: the subcommands and their flags (clap derives the parser and the
//! help from these doc comments).

use super::memory_args::MemoryArgs;
use super::{parse_device, DeviceSpec};
use crate::hub::HubRepo;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "unet-parity",
    version,
    about = "Check Candle ports of diffusion U-Net attention blocks against PyTorch reference bundles"
)]
pub(super) struct Cli {
    #[command(subcommand)]
    pub(super) command: Command,
}

#[derive(Subcommand, Debug)]
pub(super) enum Command {
    /// Run every bundle's block and compare with PyTorch's outputs.
    Check(CheckArgs),
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
    Show(ShowArgs),
}

// `check`'s arguments; its help is the doc comment on `Command::Check`.
#[derive(Args, Debug)]
pub(super) struct CheckArgs {
    /// Bundle files or folders (searched recursively for *.safetensors).
    #[arg(required = true)]
    pub(super) paths: Vec<PathBuf>,
    /// Print one JSON document instead of the table.
    #[arg(long)]
    pub(super) json: bool,
    /// Absolute tolerance, finite and ≥ 0 (default: torch.testing.assert_close's for the
    /// dtype, or the bundle's).
    #[arg(long, value_parser = parse_tolerance)]
    pub(super) atol: Option<f64>,
    /// Relative tolerance, finite and ≥ 0 (default: torch.testing.assert_close's for the
    /// dtype, or the bundle's).
    #[arg(long, value_parser = parse_tolerance)]
    pub(super) rtol: Option<f64>,
    /// Run in this dtype instead of the bundle's, and compare with PyTorch's float64 output
    /// (f64: at float64 tolerances; f32/f16/bf16: also passes within PyTorch's own error
    /// in the bundle's dtype).
    #[arg(long, value_parser = ["f32", "f16", "bf16", "f64"])]
    pub(super) dtype: Option<String>,
    /// Where the blocks run: cpu, cuda[:N] or metal[:N] (N defaults to 0). CUDA and Metal
    /// need a build with `--features cuda` / `--features metal` and the device present.
    #[arg(long, default_value = "cpu", value_parser = parse_device)]
    pub(super) device: DeviceSpec,
    /// Do not fail when the bundle holds weights the block does not use.
    #[arg(long)]
    pub(super) allow_unused: bool,
    /// Take the block's weights from this checkpoint (safetensors, sharded
    /// `*.safetensors.index.json`, or a torch.save `.bin`/`.pt`/`.pth`/`.ckpt`), read lazily.
    #[arg(long, value_name = "FILE")]
    pub(super) weights: Option<PathBuf>,
    /// The block's key prefix in the checkpoint (`mid_block.`, `model.`, `ema_model.model.`,
    /// `first_stage_model.decoder.mid.`, `model.diffusion_model.middle_block.` ...; the final
    /// dot may be left out); see `detect`.
    #[arg(long, value_name = "P")]
    pub(super) prefix: Option<String>,
    /// A diffusers `config.json` (UNet2DModel, UNet2DConditionModel, AutoencoderKL): the mid
    /// block's config comes from it instead of the bundle.
    #[arg(long, value_name = "FILE")]
    pub(super) config: Option<PathBuf>,
    /// Accept config.json keys the model class does not have.
    #[arg(long)]
    pub(super) allow_unknown_config: bool,
    /// Also compare the intermediate stages (`parity.trace.*`: norm, q, k, v, probs, attn,
    /// proj, output) and name the first stage that diverges, with its usual causes.
    #[arg(long)]
    pub(super) trace: bool,
    /// Exactness only: pass an output only when it is bit-identical to PyTorch's or within
    /// the dtype's tolerance of it, never by PyTorch's own error against float64; refuse
    /// tolerances above the dtype's defaults (from the bundle or --atol/--rtol).
    #[arg(long)]
    pub(super) strict: bool,
    #[command(flatten)]
    pub(super) memory: MemoryArgs,
    #[command(flatten)]
    pub(super) hub: HubArgs,
}

// `show`'s arguments; its help is the doc comment on `Command::Show`.
#[derive(Args, Debug)]
pub(super) struct ShowArgs {
    /// A bundle file.
    pub(super) bundle: PathBuf,
    /// Folder for the PNGs (created).
    #[arg(long, value_name = "DIR")]
    pub(super) out: PathBuf,
    /// The query pixel `y,x` of the attention map (default: the image centre).
    #[arg(long, value_name = "Y,X", value_parser = parse_query)]
    pub(super) query: Option<(usize, usize)>,
    /// The batch item of the attention map.
    #[arg(long, default_value_t = 0)]
    pub(super) batch: usize,
    /// Take the block's weights from this checkpoint, as `check --weights` does.
    #[arg(long, value_name = "FILE")]
    pub(super) weights: Option<PathBuf>,
    /// The block's key prefix in the checkpoint, as `check --prefix`.
    #[arg(long, value_name = "P")]
    pub(super) prefix: Option<String>,
    /// A diffusers `config.json` for the block's config, as `check --config`.
    #[arg(long, value_name = "FILE")]
    pub(super) config: Option<PathBuf>,
    /// Accept config.json keys the model class does not have.
    #[arg(long)]
    pub(super) allow_unknown_config: bool,
    #[command(flatten)]
    pub(super) memory: MemoryArgs,
    #[command(flatten)]
    pub(super) hub: HubArgs,
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
pub(super) struct HubArgs {
    /// `org/name`: take `config.json` and the weights from this Hub repository (with --subfolder),
    /// from the local cache when present.
    #[arg(long, value_name = "ORG/NAME")]
    pub(super) repo: Option<String>,
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
    /// The most one downloaded file may write (`20G`, `512M`; default: the free space of the
    /// cache's file system less a tenth, at least 1 GiB, kept free).
    #[arg(long, value_name = "SIZE", value_parser = crate::memory::parse_size, requires = "repo")]
    max_download: Option<u64>,
    /// The slowest a download may go, bytes a second averaged over 3 × HF_HUB_DOWNLOAD_TIMEOUT
    /// (`1M`; default 256K).
    #[arg(long, value_name = "SIZE", value_parser = crate::memory::parse_size, requires = "repo")]
    min_download_rate: Option<u64>,
}

impl HubArgs {
    pub(super) fn repo(&self) -> Option<HubRepo> {
        self.repo.as_ref().map(|repo| HubRepo {
            repo: repo.clone(),
            revision: self.revision.clone(),
            subfolder: self.subfolder.clone(),
            cache_dir: self.cache_dir.clone(),
            offline: self.offline,
            limits: crate::hub::DownloadLimits {
                max_bytes: self.max_download,
                min_rate: self
                    .min_download_rate
                    .unwrap_or(crate::hub::DownloadLimits::default().min_rate),
                window: None,
            },
        })
    }
}

/// `--atol` / `--rtol`: a finite number ≥ 0 (an infinite, NaN or negative tolerance would pass
/// anything or nothing), else a usage error (exit 2).
fn parse_tolerance(s: &str) -> std::result::Result<f64, String> {
    let t: f64 = s.trim().parse().map_err(|_| format!("not a number: {s:?}"))?;
    crate::compare::check_tolerance(t).map(|()| t)
}
