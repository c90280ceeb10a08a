//! The keyword arguments of diffusers 0.42.1 `AutoencoderKL.__init__`
//! (`models/autoencoders/autoencoder_kl.py`), as its `config.json` stores them.

use crate::config::defaults;
use crate::layers::Activation;
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;

const BLOCK: &str = "diffusers.AutoencoderKL";

fn down_types() -> Vec<String> {
    vec!["DownEncoderBlock2D".into()]
}

fn up_types() -> Vec<String> {
    vec!["UpDecoderBlock2D".into()]
}

fn channels() -> Vec<usize> {
    vec![64]
}

fn silu() -> Activation {
    Activation::Swish
}

fn sd_scaling() -> f64 {
    0.18215
}

/// Keyword arguments of `AutoencoderKL.__init__` (diffusers 0.42.1), every one with its default;
/// a key the class does not have is refused by name. `scaling_factor`, `shift_factor`,
/// `latents_mean` / `latents_std` and `force_upcast` are stored for the pipeline (the model's own
/// forward never reads them): a pipeline multiplies the encoder's latents by `scaling_factor`
/// and divides by it before [`super::AutoencoderKL::decode`].
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AutoencoderKLConfig {
    #[serde(default = "defaults::usize::<3>")]
    pub in_channels: usize,
    #[serde(default = "defaults::usize::<3>")]
    pub out_channels: usize,
    #[serde(default = "down_types")]
    pub down_block_types: Vec<String>,
    #[serde(default = "up_types")]
    pub up_block_types: Vec<String>,
    #[serde(default = "channels")]
    pub block_out_channels: Vec<usize>,
    #[serde(default = "defaults::usize::<1>")]
    pub layers_per_block: usize,
    #[serde(default = "silu")]
    pub act_fn: Activation,
    #[serde(default = "defaults::usize::<4>")]
    pub latent_channels: usize,
    #[serde(default = "defaults::usize::<32>")]
    pub norm_num_groups: usize,
    /// An int or `[h, w]`; only the pipeline's default size.
    #[serde(default)]
    pub sample_size: Option<Value>,
    #[serde(default = "sd_scaling")]
    pub scaling_factor: f64,
    #[serde(default)]
    pub shift_factor: Option<f64>,
    #[serde(default)]
    pub latents_mean: Option<Vec<f64>>,
    #[serde(default)]
    pub latents_std: Option<Vec<f64>>,
    #[serde(default = "defaults::yes")]
    pub force_upcast: bool,
    #[serde(default = "defaults::yes")]
    pub use_quant_conv: bool,
    #[serde(default = "defaults::yes")]
    pub use_post_quant_conv: bool,
    #[serde(default = "defaults::yes")]
    pub mid_block_add_attention: bool,
}

impl Default for AutoencoderKLConfig {
    /// `AutoencoderKL()`: diffusers' defaults (one block of 64 channels).
    fn default() -> Self {
        crate::config::from_json(BLOCK, &serde_json::json!({})).unwrap_or_else(|_| unreachable!("the defaults parse"))
    }
}

impl AutoencoderKLConfig {
    /// Stable Diffusion 1.x / 2.x's VAE (`stabilityai/sd-vae-ft-mse`, the `vae/` of SD 1.5 and
    /// 2.1): four blocks of 128, 256, 512, 512 channels, two resnets a block.
    pub fn stable_diffusion() -> Self {
        Self {
            down_block_types: vec!["DownEncoderBlock2D".into(); 4],
            up_block_types: vec!["UpDecoderBlock2D".into(); 4],
            block_out_channels: vec![128, 256, 512, 512],
            layers_per_block: 2,
            sample_size: Some(Value::from(512)),
            ..Self::default()
        }
    }

    /// The kwargs of a `config.json` object (its `_class_name`, when present, must be
    /// `AutoencoderKL`; other `_` keys are ignored).
    pub fn from_config_json(config: &Value) -> Result<Self> {
        crate::config::from_json(BLOCK, &crate::config::class_kwargs(BLOCK, config, "AutoencoderKL")?)
    }

    /// The blocks' shape, checked: one type and one channel count per block, the same number of
    /// up blocks, channels divisible by the groups.
    pub(crate) fn check(&self) -> Result<()> {
        let n = self.block_out_channels.len();
        if n == 0 || self.down_block_types.len() != n || self.up_block_types.len() != n {
            return Err(Error::config(
                BLOCK,
                format!(
                    "down_block_types ({}), up_block_types ({}) and block_out_channels ({n}) need one entry per block",
                    self.down_block_types.len(),
                    self.up_block_types.len()
                ),
            ));
        }
        let refuse = |what: String| Err(Error::unsupported(BLOCK, what));
        if let Some(t) = self.down_block_types.iter().find(|t| *t != "DownEncoderBlock2D") {
            return refuse(format!("down block {t:?} (only DownEncoderBlock2D)"));
        }
        if let Some(t) = self.up_block_types.iter().find(|t| *t != "UpDecoderBlock2D") {
            return refuse(format!("up block {t:?} (only UpDecoderBlock2D)"));
        }
        let g = self.norm_num_groups;
        if g == 0 || self.block_out_channels.iter().any(|c| *c == 0 || c % g != 0) {
            return Err(Error::config(
                BLOCK,
                format!(
                    "norm_num_groups {g} must divide every block_out_channels entry ({:?})",
                    self.block_out_channels
                ),
            ));
        }
        if self.in_channels == 0 || self.out_channels == 0 || self.latent_channels == 0 {
            return Err(Error::config(
                BLOCK,
                "in_channels, out_channels and latent_channels must be positive",
            ));
        }
        Ok(())
    }
}
