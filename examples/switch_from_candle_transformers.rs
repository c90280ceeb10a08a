//! Before and after the one-line switch: candle-transformers 0.11.1's whole
//! `stable_diffusion::unet_2d::UNet2DConditionModel` and `vae::AutoEncoderKL`, then this crate's
//! drop-ins (`unet_attention::models::stable_diffusion::{unet_2d, vae}`, the same constructors and
//! forwards), built from the same weights and run on the same inputs, each output held against
//! diffusers' (PyTorch's float32 output, and its float64 run).
//!
//! ```sh
//! cargo run --release --example switch_from_candle_transformers --features candle-transformers
//! ```
//!
//! The switch in your code is the `use` line:
//!
//! ```ignore
//! use candle_transformers::models::stable_diffusion::{unet_2d, vae};   // before
//! use unet_attention::models::stable_diffusion::{unet_2d, vae};        // after
//! ```
//!
//! The models are the committed 32-group folders `weights/models/diffusers_sd1_g32` (an SD 1.x
//! U-Net, widths 32 and 64) and `weights/models/diffusers_vae_g32` (the SD VAE's layout, widths
//! 32 and 64): candle-transformers' whole models hard-code 32 GroupNorm groups in places, so they
//! cannot build the repository's 16-channel tiny models (`diffusers_sd1`: "num_groups (32) must
//! divide num_channels (8)"). The inputs and diffusers' outputs are the whole-model bundles
//! `weights/whole/sd1_g32_unet.safetensors` and `vae_g32.safetensors` (`scripts/export_whole.py`),
//! or whole-model bundles you give as arguments (`scripts/export_own.py FOLDER --whole`).
//! docs/candle-transformers.md has the printed table and what the drop-ins fix;
//! `examples/candle_transformers.rs` also shows where candle-transformers' error arises.

#[path = "candle_transformers_whole/mod.rs"]
mod whole;

use std::path::Path;

const DEFAULT: [&str; 2] = [
    "weights/whole/sd1_g32_unet.safetensors",
    "weights/whole/vae_g32.safetensors",
];

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let paths: Vec<&Path> = if args.is_empty() {
        DEFAULT.iter().map(Path::new).collect()
    } else {
        args.iter().map(Path::new).collect()
    };
    whole::run(&paths, false)
}
