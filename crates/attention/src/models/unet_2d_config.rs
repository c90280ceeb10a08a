//! The keyword arguments of diffusers 0.42.1 `UNet2DModel.__init__` (`models/unets/unet_2d.py`),
//! the unconditional U-Net of DDPM (`google/ddpm-*`) and of latent diffusion's unconditional
//! models (`CompVis/ldm-celebahq-256`), as its `config.json` stores them.

use crate::config::defaults;
use crate::layers::Activation;
use crate::Result;
use serde::{Deserialize, Serialize};
use serde_json::Value;

const BLOCK: &str = "diffusers.UNet2DModel";

/// Keyword arguments of `UNet2DModel.__init__` (diffusers 0.42.1), every one with its default; a
/// key the class does not have is refused by name. Options that change the forward and are not
/// implemented (Fourier and learned time embeddings, class embeddings, resnet resamplers, the
/// score-SDE skip blocks) are refused when the model is built.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UNet2DModelConfig {
    #[serde(default)]
    pub sample_size: Option<Value>,
    #[serde(default = "defaults::usize::<3>")]
    pub in_channels: usize,
    #[serde(default = "defaults::usize::<3>")]
    pub out_channels: usize,
    #[serde(default)]
    pub center_input_sample: bool,
    #[serde(default = "positional")]
    pub time_embedding_type: String,
    #[serde(default)]
    pub time_embedding_dim: Option<usize>,
    #[serde(default)]
    pub freq_shift: f64,
    #[serde(default = "defaults::yes")]
    pub flip_sin_to_cos: bool,
    #[serde(default = "down_types")]
    pub down_block_types: Vec<String>,
    #[serde(default = "some_mid")]
    pub mid_block_type: Option<String>,
    #[serde(default = "up_types")]
    pub up_block_types: Vec<String>,
    #[serde(default = "ddpm_channels")]
    pub block_out_channels: Vec<usize>,
    #[serde(default = "defaults::usize::<2>")]
    pub layers_per_block: usize,
    #[serde(default = "defaults::one_f")]
    pub mid_block_scale_factor: f64,
    #[serde(default = "defaults::usize::<1>")]
    pub downsample_padding: usize,
    #[serde(default = "conv")]
    pub downsample_type: String,
    #[serde(default = "conv")]
    pub upsample_type: String,
    #[serde(default)]
    pub dropout: f64,
    #[serde(default = "silu")]
    pub act_fn: Activation,
    /// `None`: each attention one head as wide as its block (diffusers' fallback).
    #[serde(default = "defaults::some::<8>")]
    pub attention_head_dim: Option<usize>,
    #[serde(default = "defaults::usize::<32>")]
    pub norm_num_groups: usize,
    #[serde(default)]
    pub attn_norm_num_groups: Option<usize>,
    #[serde(default = "eps")]
    pub norm_eps: f64,
    #[serde(default = "default_shift")]
    pub resnet_time_scale_shift: String,
    #[serde(default = "defaults::yes")]
    pub add_attention: bool,
    #[serde(default)]
    pub class_embed_type: Option<String>,
    #[serde(default)]
    pub num_class_embeds: Option<usize>,
    #[serde(default)]
    pub num_train_timesteps: Option<usize>,
}

fn positional() -> String {
    "positional".into()
}
fn conv() -> String {
    "conv".into()
}
fn default_shift() -> String {
    "default".into()
}
fn silu() -> Activation {
    Activation::Swish
}
fn eps() -> f64 {
    1e-5
}
fn some_mid() -> Option<String> {
    Some("UNetMidBlock2D".into())
}
fn ddpm_channels() -> Vec<usize> {
    vec![224, 448, 672, 896]
}
fn down_types() -> Vec<String> {
    ["DownBlock2D", "AttnDownBlock2D", "AttnDownBlock2D", "AttnDownBlock2D"]
        .map(String::from)
        .to_vec()
}
fn up_types() -> Vec<String> {
    ["AttnUpBlock2D", "AttnUpBlock2D", "AttnUpBlock2D", "UpBlock2D"]
        .map(String::from)
        .to_vec()
}

impl Default for UNet2DModelConfig {
    /// `UNet2DModel()`: every argument at its diffusers default.
    fn default() -> Self {
        serde_json::from_value(Value::Object(Default::default())).expect("every field has a default")
    }
}

impl UNet2DModelConfig {
    /// The config from a `config.json` (or a bundle's `parity.config`): `_`-prefixed keys are
    /// metadata and dropped; a `_class_name` other than `UNet2DModel` is an error; other unknown
    /// keys are refused.
    pub fn from_config_json(config: &Value) -> Result<Self> {
        crate::config::from_json(BLOCK, &crate::config::class_kwargs(BLOCK, config, "UNet2DModel")?)
    }

    /// `time_embedding_dim or block_out_channels[0] * 4`.
    pub fn time_embed_dim(&self) -> usize {
        self.time_embedding_dim
            .unwrap_or(self.block_out_channels.first().copied().unwrap_or(0) * 4)
    }

    /// The head width of a block `channels` wide (`attention_head_dim`, else `channels`).
    pub fn head_dim(&self, channels: usize) -> usize {
        self.attention_head_dim.unwrap_or(channels)
    }
}
