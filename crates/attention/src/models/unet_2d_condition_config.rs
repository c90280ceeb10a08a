//! The keyword arguments of diffusers 0.42.1 `UNet2DConditionModel.__init__`
//! (`models/unets/unet_2d_condition.py`), as its `config.json` stores them: [`UNet2DConditionModelConfig`],
//! and the per-block lists `__init__` expands them to ([`BlockArgs`]).

use crate::config::defaults;
use crate::diffusers::unets::mid_block::LayersPerBlock;
use crate::layers::Activation;
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// An argument diffusers takes as one value for every down block or as a list of them
/// (`attention_head_dim: 8` or `[5, 10, 20, 20]`). `List` is tried first, so a list of lists
/// (`transformer_layers_per_block: [[1], [2, 2]]`) reads as one entry per block.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(untagged)]
pub enum PerBlock<T> {
    List(Vec<T>),
    One(T),
}

impl<T: Clone> PerBlock<T> {
    /// One entry per block (`n` blocks), as `__init__` expands an int to `(x,) * n`; a list of
    /// another length is an error (diffusers' `_check_config` raises).
    pub fn expand(&self, key: &str, n: usize) -> Result<Vec<T>> {
        match self {
            PerBlock::One(v) => Ok(vec![v.clone(); n]),
            PerBlock::List(items) if items.len() == n => Ok(items.clone()),
            PerBlock::List(items) => Err(Error::config(
                BLOCK,
                format!(
                    "`{key}` has {} entries; the model takes one per down block ({n})",
                    items.len()
                ),
            )),
        }
    }
}

const BLOCK: &str = "diffusers.UNet2DConditionModel";

fn per_block<const N: usize>() -> PerBlock<usize> {
    PerBlock::One(N)
}

fn sd_channels() -> Vec<usize> {
    vec![320, 640, 1280, 1280]
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

fn up_types() -> Vec<String> {
    [
        "UpBlock2D",
        "CrossAttnUpBlock2D",
        "CrossAttnUpBlock2D",
        "CrossAttnUpBlock2D",
    ]
    .map(String::from)
    .to_vec()
}

fn silu() -> Activation {
    Activation::Swish
}

fn positional() -> String {
    "positional".into()
}

fn default_str() -> String {
    "default".into()
}

fn some_mid() -> Option<String> {
    Some(defaults::cross_attn_mid_block())
}

fn some_groups() -> Option<usize> {
    Some(32)
}

fn heads_64() -> usize {
    64
}

/// Keyword arguments of `UNet2DConditionModel.__init__` (diffusers 0.42.1), every one with its
/// default; a key the class does not have is refused by name. Options that change the forward
/// and are not implemented (class embeddings, `encoder_hid_proj`, addition embeddings other than
/// SDXL's `text_time`, Fourier time embeddings, `time_cond_proj_dim`, dual cross-attention,
/// GLIGEN, block types other than SD's) are refused when the model is built.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UNet2DConditionModelConfig {
    #[serde(default)]
    pub sample_size: Option<PerBlock<usize>>,
    #[serde(default = "defaults::usize::<4>")]
    pub in_channels: usize,
    #[serde(default = "defaults::usize::<4>")]
    pub out_channels: usize,
    #[serde(default)]
    pub center_input_sample: bool,
    #[serde(default = "defaults::yes")]
    pub flip_sin_to_cos: bool,
    #[serde(default)]
    pub freq_shift: f64,
    #[serde(default = "down_types")]
    pub down_block_types: Vec<String>,
    #[serde(default = "some_mid")]
    pub mid_block_type: Option<String>,
    #[serde(default = "up_types")]
    pub up_block_types: Vec<String>,
    #[serde(default = "no_cross_only")]
    pub only_cross_attention: PerBlock<bool>,
    #[serde(default = "sd_channels")]
    pub block_out_channels: Vec<usize>,
    #[serde(default = "per_block::<2>")]
    pub layers_per_block: PerBlock<usize>,
    #[serde(default = "defaults::usize::<1>")]
    pub downsample_padding: usize,
    #[serde(default = "defaults::one_f")]
    pub mid_block_scale_factor: f64,
    #[serde(default)]
    pub dropout: f64,
    #[serde(default = "silu")]
    pub act_fn: Activation,
    #[serde(default = "some_groups")]
    pub norm_num_groups: Option<usize>,
    #[serde(default = "defaults::eps_1e5")]
    pub norm_eps: f64,
    #[serde(default = "per_block::<1280>")]
    pub cross_attention_dim: PerBlock<usize>,
    #[serde(default = "one_layer")]
    pub transformer_layers_per_block: PerBlock<LayersPerBlock>,
    #[serde(default)]
    pub reverse_transformer_layers_per_block: Option<Vec<LayersPerBlock>>,
    #[serde(default)]
    pub encoder_hid_dim: Option<usize>,
    #[serde(default)]
    pub encoder_hid_dim_type: Option<String>,
    /// The head count of the cross-attention blocks (diffusers' historical naming: SD's
    /// `attention_head_dim: 8` means 8 heads).
    #[serde(default = "per_block::<8>")]
    pub attention_head_dim: PerBlock<usize>,
    /// Must be null: diffusers 0.42.1 raises `ValueError` for any other value.
    #[serde(default)]
    pub num_attention_heads: Option<PerBlock<usize>>,
    #[serde(default)]
    pub dual_cross_attention: bool,
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
    #[serde(default = "default_str")]
    pub resnet_time_scale_shift: String,
    #[serde(default)]
    pub resnet_skip_time_act: bool,
    #[serde(default = "defaults::one_f")]
    pub resnet_out_scale_factor: f64,
    #[serde(default = "positional")]
    pub time_embedding_type: String,
    #[serde(default)]
    pub time_embedding_dim: Option<usize>,
    #[serde(default)]
    pub time_embedding_act_fn: Option<Activation>,
    #[serde(default)]
    pub timestep_post_act: Option<Activation>,
    #[serde(default)]
    pub time_cond_proj_dim: Option<usize>,
    #[serde(default = "defaults::usize::<3>")]
    pub conv_in_kernel: usize,
    #[serde(default = "defaults::usize::<3>")]
    pub conv_out_kernel: usize,
    #[serde(default)]
    pub projection_class_embeddings_input_dim: Option<usize>,
    #[serde(default = "default_str")]
    pub attention_type: String,
    #[serde(default)]
    pub class_embeddings_concat: bool,
    #[serde(default)]
    pub mid_block_only_cross_attention: Option<bool>,
    #[serde(default)]
    pub cross_attention_norm: Option<String>,
    #[serde(default = "heads_64")]
    pub addition_embed_type_num_heads: usize,
}

fn no_cross_only() -> PerBlock<bool> {
    PerBlock::One(false)
}

fn one_layer() -> PerBlock<LayersPerBlock> {
    PerBlock::One(LayersPerBlock::One(1))
}

impl Default for UNet2DConditionModelConfig {
    /// `UNet2DConditionModel()`: every argument at its diffusers default (SD 1.x's shape).
    fn default() -> Self {
        serde_json::from_value(Value::Object(Default::default())).expect("every field has a default")
    }
}

/// What `__init__` gives one down block and its mirror up block (the per-block lists at index
/// `i`; the up block's are the reversed lists at its own index).
#[derive(Debug, Clone, PartialEq)]
pub struct BlockArgs {
    pub heads: usize,
    pub cross_attention_dim: usize,
    pub layers: usize,
    pub transformer_layers: LayersPerBlock,
    pub only_cross_attention: bool,
}

impl UNet2DConditionModelConfig {
    /// The config from a `config.json` (or the `parity.config` of a bundle): keys starting with
    /// `_` (`_class_name`, `_diffusers_version`, `_name_or_path`) are metadata and dropped; a
    /// `_class_name` other than `UNet2DConditionModel` is an error; other unknown keys are refused.
    pub fn from_config_json(config: &Value) -> Result<Self> {
        crate::config::from_json(
            BLOCK,
            &crate::config::class_kwargs(BLOCK, config, "UNet2DConditionModel")?,
        )
    }

    /// The number of down blocks.
    pub fn blocks(&self) -> usize {
        self.down_block_types.len()
    }

    /// The per-down-block arguments `__init__` passes `get_down_block` (index `i`), after its
    /// `num_attention_heads = num_attention_heads or attention_head_dim` and int expansions.
    pub fn down_args(&self) -> Result<Vec<BlockArgs>> {
        let n = self.blocks();
        let heads = self.attention_head_dim.expand("attention_head_dim", n)?;
        let cross = self.cross_attention_dim.expand("cross_attention_dim", n)?;
        let layers = self.layers_per_block.expand("layers_per_block", n)?;
        let tlayers = self
            .transformer_layers_per_block
            .expand("transformer_layers_per_block", n)?;
        let only = self.only_cross_attention.expand("only_cross_attention", n)?;
        Ok((0..n)
            .map(|i| BlockArgs {
                heads: heads[i],
                cross_attention_dim: cross[i],
                layers: layers[i],
                transformer_layers: tlayers[i].clone(),
                only_cross_attention: only[i],
            })
            .collect())
    }

    /// The per-up-block arguments (index `i` of the reversed lists; `layers` is
    /// `reversed_layers_per_block[i] + 1`, and the transformer depths are
    /// `reverse_transformer_layers_per_block` where given).
    pub fn up_args(&self) -> Result<Vec<BlockArgs>> {
        let mut args = self.down_args()?;
        args.reverse();
        if let Some(rev) = &self.reverse_transformer_layers_per_block {
            if rev.len() != args.len() {
                return Err(Error::config(
                    BLOCK,
                    "`reverse_transformer_layers_per_block` must have one entry per up block",
                ));
            }
            for (a, t) in args.iter_mut().zip(rev) {
                a.transformer_layers = t.clone();
            }
        }
        for a in &mut args {
            a.layers += 1;
        }
        Ok(args)
    }

    /// `time_embedding_dim or block_out_channels[0] * 4` (positional time embeddings).
    pub fn time_embed_dim(&self) -> usize {
        self.time_embedding_dim.unwrap_or(self.block_out_channels[0] * 4)
    }
}
