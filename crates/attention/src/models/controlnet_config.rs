//! The keyword arguments of diffusers 0.42.1 `ControlNetModel.__init__`
//! (`models/controlnets/controlnet.py`), as its `config.json` stores them.

use super::unet_2d_condition_config::{PerBlock, UNet2DConditionModelConfig};
use crate::diffusers::unets::mid_block::LayersPerBlock;
use crate::layers::Activation;
use crate::Result;
use serde::{Deserialize, Serialize};
use serde_json::Value;

const BLOCK: &str = "diffusers.ControlNetModel";

/// Keyword arguments of `ControlNetModel.__init__` (diffusers 0.42.1), every one with its default;
/// a key the class does not have is refused by name. The options this port does not implement
/// (class embeddings, addition embeddings other than SDXL's `text_time`, `encoder_hid_proj`) are
/// refused when the model is built.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ControlNetModelConfig {
    #[serde(default = "four")]
    pub in_channels: usize,
    #[serde(default = "three")]
    pub conditioning_channels: usize,
    #[serde(default = "yes")]
    pub flip_sin_to_cos: bool,
    #[serde(default)]
    pub freq_shift: f64,
    #[serde(default = "down_types")]
    pub down_block_types: Vec<String>,
    #[serde(default = "some_mid")]
    pub mid_block_type: Option<String>,
    #[serde(default = "no")]
    pub only_cross_attention: PerBlock<bool>,
    #[serde(default = "sd_channels")]
    pub block_out_channels: Vec<usize>,
    #[serde(default = "two")]
    pub layers_per_block: usize,
    #[serde(default = "one")]
    pub downsample_padding: usize,
    #[serde(default = "one_f")]
    pub mid_block_scale_factor: f64,
    #[serde(default = "silu")]
    pub act_fn: Activation,
    #[serde(default = "some_32")]
    pub norm_num_groups: Option<usize>,
    #[serde(default = "eps")]
    pub norm_eps: f64,
    #[serde(default = "cross_1280")]
    pub cross_attention_dim: usize,
    #[serde(default = "one_layer")]
    pub transformer_layers_per_block: PerBlock<LayersPerBlock>,
    #[serde(default)]
    pub encoder_hid_dim: Option<usize>,
    #[serde(default)]
    pub encoder_hid_dim_type: Option<String>,
    #[serde(default = "heads_8")]
    pub attention_head_dim: PerBlock<usize>,
    #[serde(default)]
    pub num_attention_heads: Option<PerBlock<usize>>,
    #[serde(default)]
    pub use_linear_projection: bool,
    #[serde(default)]
    pub class_embed_type: Option<String>,
    #[serde(default)]
    pub addition_embed_type: Option<String>,
    #[serde(default)]
    pub addition_time_embed_dim: Option<usize>,
    #[serde(default)]
    pub num_class_embeds: Option<usize>,
    #[serde(default)]
    pub upcast_attention: bool,
    #[serde(default = "default_shift")]
    pub resnet_time_scale_shift: String,
    #[serde(default)]
    pub projection_class_embeddings_input_dim: Option<usize>,
    /// `"rgb"` or `"bgr"` (the condition's channels flipped before the embedding).
    #[serde(default = "rgb")]
    pub controlnet_conditioning_channel_order: String,
    #[serde(default = "cond_channels")]
    pub conditioning_embedding_out_channels: Option<Vec<usize>>,
    #[serde(default)]
    pub global_pool_conditions: bool,
    #[serde(default = "heads_64")]
    pub addition_embed_type_num_heads: usize,
}

fn four() -> usize {
    4
}
fn three() -> usize {
    3
}
fn two() -> usize {
    2
}
fn one() -> usize {
    1
}
fn one_f() -> f64 {
    1.0
}
fn yes() -> bool {
    true
}
fn no() -> PerBlock<bool> {
    PerBlock::One(false)
}
fn eps() -> f64 {
    1e-5
}
fn silu() -> Activation {
    Activation::Swish
}
fn some_32() -> Option<usize> {
    Some(32)
}
fn cross_1280() -> usize {
    1280
}
fn heads_8() -> PerBlock<usize> {
    PerBlock::One(8)
}
fn heads_64() -> usize {
    64
}
fn one_layer() -> PerBlock<LayersPerBlock> {
    PerBlock::One(LayersPerBlock::One(1))
}
fn default_shift() -> String {
    "default".into()
}
fn rgb() -> String {
    "rgb".into()
}
fn some_mid() -> Option<String> {
    Some(crate::config::defaults::cross_attn_mid_block())
}
fn sd_channels() -> Vec<usize> {
    vec![320, 640, 1280, 1280]
}
fn cond_channels() -> Option<Vec<usize>> {
    Some(vec![16, 32, 96, 256])
}
fn down_types() -> Vec<String> {
    [
        "CrossAttnDownBlock2D",
        "CrossAttnDownBlock2D",
        "CrossAttnDownBlock2D",
        "DownBlock2D",
    ]
    .map(String::from)
    .to_vec()
}

impl Default for ControlNetModelConfig {
    /// `ControlNetModel()`: every argument at its diffusers default (SD 1.5's ControlNets).
    fn default() -> Self {
        serde_json::from_value(Value::Object(Default::default())).expect("every field has a default")
    }
}

impl ControlNetModelConfig {
    /// The config from a `config.json` (or a bundle's `parity.config`): `_`-prefixed keys are
    /// metadata and dropped; a `_class_name` other than `ControlNetModel` is an error.
    pub fn from_config_json(config: &Value) -> Result<Self> {
        crate::config::from_json(BLOCK, &crate::config::class_kwargs(BLOCK, config, "ControlNetModel")?)
    }

    /// The U-Net config whose down blocks and mid block are this ControlNet's (the two build them
    /// with the same `get_down_block` arguments; `num_attention_heads or attention_head_dim` is
    /// the head count, as the U-Net's `attention_head_dim`).
    pub fn unet_config(&self) -> UNet2DConditionModelConfig {
        let up: Vec<String> = self
            .down_block_types
            .iter()
            .rev()
            .map(|t| t.replace("Down", "Up"))
            .collect();
        UNet2DConditionModelConfig {
            in_channels: self.in_channels,
            flip_sin_to_cos: self.flip_sin_to_cos,
            freq_shift: self.freq_shift,
            down_block_types: self.down_block_types.clone(),
            mid_block_type: self.mid_block_type.clone(),
            up_block_types: up,
            only_cross_attention: self.only_cross_attention.clone(),
            block_out_channels: self.block_out_channels.clone(),
            layers_per_block: PerBlock::One(self.layers_per_block),
            downsample_padding: self.downsample_padding,
            mid_block_scale_factor: self.mid_block_scale_factor,
            act_fn: self.act_fn,
            norm_num_groups: self.norm_num_groups,
            norm_eps: self.norm_eps,
            cross_attention_dim: PerBlock::One(self.cross_attention_dim),
            transformer_layers_per_block: self.transformer_layers_per_block.clone(),
            attention_head_dim: self
                .num_attention_heads
                .clone()
                .unwrap_or(self.attention_head_dim.clone()),
            use_linear_projection: self.use_linear_projection,
            upcast_attention: self.upcast_attention,
            resnet_time_scale_shift: self.resnet_time_scale_shift.clone(),
            addition_embed_type: self.addition_embed_type.clone(),
            addition_time_embed_dim: self.addition_time_embed_dim,
            projection_class_embeddings_input_dim: self.projection_class_embeddings_input_dim,
            ..Default::default()
        }
    }
}
