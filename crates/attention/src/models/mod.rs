//! Whole models built from the checked blocks (diffusers 0.42.1), one file per model:
//!
//! * [`UNet2DConditionModel`] (`unet_2d_condition`): the U-Net of Stable Diffusion 1.x, 2.x and
//!   XL (`text_time` addition embedding), with its config ([`UNet2DConditionModelConfig`], the
//!   `config.json` kwargs), its down / up blocks (`unet_blocks`: `CrossAttnDownBlock2D`,
//!   `DownBlock2D`, `CrossAttnUpBlock2D`, `UpBlock2D`, `Downsample2D`, `Upsample2D`) and time
//!   embeddings (`time_embedding`: `Timesteps`, `TimestepEmbedding`).
//!
//! * [`UNet2DModel`] (`unet_2d`): the unconditional U-Net of DDPM and of latent diffusion's
//!   unconditional models (`DownBlock2D`, `AttnDownBlock2D`, `UNetMidBlock2D`, `AttnUpBlock2D`,
//!   `UpBlock2D`), with its config ([`UNet2DModelConfig`]).
//!
//! * [`ControlNetModel`] (`controlnet`): SD 1.x / 2.x ControlNets, the residuals the U-Net takes
//!   ([`ForwardArgs::controlnet`]), with its config ([`ControlNetModelConfig`]).
//!
//! * [`LucidrainsUnet`] (`lucidrains_unet`) and [`AnnotatedUnet`] (`annotated_unet`): the DDPM
//!   U-Nets of denoising-diffusion-pytorch 2.x and of the Hugging Face "Annotated Diffusion" post,
//!   under their own state-dict names.
//!
//! * [`AutoencoderKL`] (`autoencoder_kl`): the VAE of Stable Diffusion 1.x, 2.x and XL
//!   (`Encoder`, `Decoder`, `DownEncoderBlock2D`, `UpDecoderBlock2D`, the quant convs), with its
//!   config ([`AutoencoderKLConfig`]) and [`DiagonalGaussianDistribution`].
//!
//! Both load from a diffusers model folder in one call (`load(folder, dtype, device)`, `folder`:
//! `config.json` and the safetensors, sharded or not), refusing weights they do not read; the SD
//! U-Net and VAE also from a single-file checkpoint in the original ldm layout (`single_file`:
//! `from_single_file(path, config, dtype, device)`, the config given or inferred).
//!
//! The forward signatures follow candle-transformers 0.11's
//! (`UNet2DConditionModel::forward(xs, timestep: f64, encoder_hidden_states)`, `AutoEncoderKL::encode`
//! / `decode`); weights load
//! under the exact PyTorch state-dict names.

pub mod annotated_unet;
pub mod autoencoder_kl;
pub mod autoencoder_kl_config;
pub mod controlnet;
pub mod controlnet_config;
mod ddpm_unet;
mod folder;
pub mod lucidrains_unet;
pub mod single_file;
pub mod stable_diffusion;
pub mod time_embedding;
pub mod unet_2d;
pub mod unet_2d_condition;
pub mod unet_2d_condition_config;
pub mod unet_2d_config;
pub mod unet_blocks;

pub use annotated_unet::{AnnotatedUnet, AnnotatedUnetConfig};
pub use autoencoder_kl::{AutoencoderKL, DiagonalGaussianDistribution};
pub use autoencoder_kl_config::AutoencoderKLConfig;
pub use controlnet::{ControlNetArgs, ControlNetModel, ControlNetOutput};
pub use controlnet_config::ControlNetModelConfig;
pub use lucidrains_unet::{LucidrainsUnet, LucidrainsUnetConfig};
pub use single_file::{LdmUNetConfig, LdmVaeConfig};
pub use time_embedding::{TimestepEmbedding, Timesteps};
pub use unet_2d::UNet2DModel;
pub use unet_2d_condition::{AddedCond, ControlNetResiduals, ForwardArgs, UNet2DConditionModel};
pub use unet_2d_condition_config::{BlockArgs, PerBlock, UNet2DConditionModelConfig};
pub use unet_2d_config::UNet2DModelConfig;
