//! The configs of original-layout (`ldm`) checkpoints and the diffusers configs they become, as
//! diffusers 0.42.1's `loaders/single_file_utils.py` derives them
//! (`create_unet_diffusers_config_from_ldm`, `create_vae_diffusers_config_from_ldm`).

use crate::models::unet_2d_condition_config::PerBlock;
use crate::models::{AutoencoderKLConfig, UNet2DConditionModelConfig};
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub(crate) const UNET_BLOCK: &str = "ldm.UNetModel";
pub(crate) const VAE_BLOCK: &str = "ldm.AutoencoderKL";

/// `ldm.modules.diffusionmodules.openaimodel.UNetModel`'s keyword arguments: an inference YAML's
/// `model.params.unet_config.params` (Stable Diffusion 1.x's `v1-inference.yaml`, 2.x's
/// `v2-inference.yaml`), or Stability's `sgm` `UNetModel`'s, `model.params.network_config.params`
/// (SDXL's `sd_xl_base.yaml`, `sd_xl_refiner.yaml`). Unknown keys are refused by name; options that
/// change the forward and that diffusers' conversion does not carry are refused by
/// [`Self::to_diffusers`].
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LdmUNetConfig {
    #[serde(default)]
    pub image_size: Option<usize>,
    pub in_channels: usize,
    pub out_channels: usize,
    pub model_channels: usize,
    /// Downsampling factors (1, 2, 4, ...) of the levels that have attention.
    pub attention_resolutions: Vec<usize>,
    pub num_res_blocks: usize,
    #[serde(default = "sd_mult")]
    pub channel_mult: Vec<usize>,
    /// Present in SD 1.x's YAML (8); absent in 2.x's, which gives `num_head_channels`.
    #[serde(default)]
    pub num_heads: Option<i64>,
    #[serde(default)]
    pub num_head_channels: Option<i64>,
    /// ldm's switch (SD's YAMLs set it); `sgm` has none and always builds `SpatialTransformer`s,
    /// as ldm must with a `context_dim`. Only `false` is refused.
    #[serde(default)]
    pub use_spatial_transformer: Option<bool>,
    #[serde(default)]
    pub transformer_depth: Option<PerBlock<usize>>,
    #[serde(default)]
    pub context_dim: Option<PerBlock<usize>>,
    #[serde(default)]
    pub use_linear_in_transformer: bool,
    #[serde(default)]
    pub use_checkpoint: bool,
    #[serde(default)]
    pub use_fp16: bool,
    #[serde(default = "yes")]
    pub legacy: bool,
    #[serde(default)]
    pub dropout: f64,
    #[serde(default = "yes")]
    pub conv_resample: bool,
    #[serde(default = "two")]
    pub dims: usize,
    #[serde(default)]
    pub num_heads_upsample: Option<i64>,
    #[serde(default)]
    pub use_scale_shift_norm: bool,
    #[serde(default)]
    pub resblock_updown: bool,
    #[serde(default)]
    pub use_new_attention_order: bool,
    #[serde(default)]
    pub num_classes: Option<Value>,
    #[serde(default)]
    pub adm_in_channels: Option<usize>,
    #[serde(default)]
    pub disable_self_attentions: Option<Value>,
    #[serde(default)]
    pub num_attention_blocks: Option<Value>,
    #[serde(default)]
    pub disable_middle_self_attn: bool,
    #[serde(default)]
    pub n_embed: Option<usize>,
    /// `sgm` (earlier versions): the middle block's depth (default: the last level's
    /// `transformer_depth`, which later versions always take).
    #[serde(default)]
    pub transformer_depth_middle: Option<usize>,
    /// `sgm`: the middle block without its transformer (refused: diffusers' mid block has one).
    #[serde(default)]
    pub disable_middle_transformer: bool,
    /// `sgm`: `softmax` or `softmax-xformers` (the same function).
    #[serde(default)]
    pub spatial_transformer_attn_type: Option<String>,
}

fn sd_mult() -> Vec<usize> {
    vec![1, 2, 4, 8]
}
fn yes() -> bool {
    true
}
fn two() -> usize {
    2
}

/// What an ldm option the conversion does not carry does, for the refusal.
fn refuse(what: &str) -> Error {
    Error::config(
        UNET_BLOCK,
        format!("{what}: not implemented (diffusers' single-file conversion does not carry it either)"),
    )
}

impl LdmUNetConfig {
    /// The config from the YAML's `unet_config.params` as JSON (integers bounded, unknown keys refused).
    pub fn from_json(params: &Value) -> Result<Self> {
        crate::config::from_json(UNET_BLOCK, params)
    }

    /// Stable Diffusion 1.x's `v1-inference.yaml`.
    pub fn sd1() -> Self {
        let mut cfg = Self::base(768);
        cfg.num_heads = Some(8);
        cfg
    }

    /// Stable Diffusion 2.x's `v2-inference.yaml` / `v2-inference-v.yaml` (the U-Net is the same).
    pub fn sd2() -> Self {
        let mut cfg = Self::base(1024);
        cfg.num_head_channels = Some(64);
        cfg.use_linear_in_transformer = true;
        cfg.use_fp16 = true;
        cfg
    }

    /// SDXL base's `sd_xl_base.yaml` (`network_config.params`): three levels, attention at the two
    /// inner ones with 2 and 10 transformer layers, 2048-wide context, `label_emb` over 2,816
    /// added-condition features (the pooled text embedding and six size / crop embeddings).
    pub fn sdxl() -> Self {
        let mut cfg = Self::base(2048);
        cfg.image_size = None;
        cfg.attention_resolutions = vec![4, 2];
        cfg.channel_mult = vec![1, 2, 4];
        cfg.num_head_channels = Some(64);
        cfg.use_linear_in_transformer = true;
        cfg.transformer_depth = Some(PerBlock::List(vec![1, 2, 10]));
        cfg.num_classes = Some(Value::from("sequential"));
        cfg.adm_in_channels = Some(2816);
        cfg.spatial_transformer_attn_type = Some("softmax-xformers".into());
        cfg
    }

    /// SDXL refiner's `sd_xl_refiner.yaml`: 384 channels, four levels, 4 transformer layers,
    /// 1280-wide context, 2,560 added-condition features.
    pub fn sdxl_refiner() -> Self {
        let mut cfg = Self::sdxl();
        cfg.model_channels = 384;
        cfg.channel_mult = vec![1, 2, 4, 4];
        cfg.transformer_depth = Some(PerBlock::One(4));
        cfg.context_dim = Some(PerBlock::List(vec![1280; 4]));
        cfg.adm_in_channels = Some(2560);
        cfg
    }

    fn base(context_dim: usize) -> Self {
        Self {
            image_size: Some(32),
            in_channels: 4,
            out_channels: 4,
            model_channels: 320,
            attention_resolutions: vec![4, 2, 1],
            num_res_blocks: 2,
            channel_mult: vec![1, 2, 4, 4],
            num_heads: None,
            num_head_channels: None,
            use_spatial_transformer: Some(true),
            transformer_depth: Some(PerBlock::One(1)),
            context_dim: Some(PerBlock::One(context_dim)),
            use_linear_in_transformer: false,
            use_checkpoint: true,
            use_fp16: false,
            legacy: false,
            dropout: 0.0,
            conv_resample: true,
            dims: 2,
            num_heads_upsample: None,
            use_scale_shift_norm: false,
            resblock_updown: false,
            use_new_attention_order: false,
            num_classes: None,
            adm_in_channels: None,
            disable_self_attentions: None,
            num_attention_blocks: None,
            disable_middle_self_attn: false,
            n_embed: None,
            transformer_depth_middle: None,
            disable_middle_transformer: false,
            spatial_transformer_attn_type: None,
        }
    }

    /// The context width diffusers takes (`context_dim`, or its first entry).
    fn context_width(&self) -> Option<usize> {
        match &self.context_dim {
            Some(PerBlock::One(d)) => Some(*d),
            Some(PerBlock::List(ds)) => ds.first().copied(),
            None => None,
        }
    }

    /// `num_classes: sequential` with a 2048- or 1280-wide context: SDXL's added conditions
    /// (diffusers' `text_time`); `Ok(false)` without `num_classes`.
    fn sdxl_conditions(&self) -> Result<bool> {
        let Some(classes) = &self.num_classes else {
            return Ok(false);
        };
        if classes.as_str() != Some("sequential") {
            return Err(refuse(
                "num_classes other than \"sequential\" (class-conditioned U-Nets)",
            ));
        }
        if !matches!(self.context_width(), Some(2048 | 1280)) {
            return Err(refuse(
                "num_classes \"sequential\" with a context other than SDXL's 2048 / 1280 (diffusers' \"projection\" class embedding)",
            ));
        }
        if self.adm_in_channels.is_none() {
            return Err(Error::config(
                UNET_BLOCK,
                "num_classes \"sequential\" needs adm_in_channels",
            ));
        }
        Ok(true)
    }

    /// Whether level `i` (0 = full resolution) has attention: its downsampling factor 2^i is in
    /// `attention_resolutions`.
    pub fn has_attention(&self, level: usize) -> bool {
        self.attention_resolutions.contains(&(1usize << level.min(63)))
    }

    fn check_supported(&self) -> Result<()> {
        let bad = [
            (
                self.use_spatial_transformer == Some(false),
                "use_spatial_transformer = false (AttentionBlock levels)",
            ),
            (self.use_scale_shift_norm, "use_scale_shift_norm = true"),
            (self.resblock_updown, "resblock_updown = true"),
            (self.dims != 2, "dims other than 2"),
            (!self.conv_resample, "conv_resample = false"),
            (self.disable_self_attentions.is_some(), "disable_self_attentions"),
            (
                !matches!(
                    self.spatial_transformer_attn_type.as_deref(),
                    None | Some("softmax" | "softmax-xformers")
                ),
                "spatial_transformer_attn_type other than softmax / softmax-xformers",
            ),
            (
                self.transformer_depth_middle.is_some_and(|d| Some(d) != self.last_depth()),
                "transformer_depth_middle other than the last level's transformer_depth (diffusers' mid block takes that)",
            ),
            (self.num_attention_blocks.is_some(), "num_attention_blocks"),
            (self.disable_middle_self_attn, "disable_middle_self_attn = true"),
            (self.disable_middle_transformer, "disable_middle_transformer = true"),
            (self.n_embed.is_some(), "n_embed (codebook prediction)"),
        ];
        match bad.iter().find(|(is, _)| *is) {
            Some((_, what)) => Err(refuse(what)),
            None => self.sdxl_conditions().map(|_| ()),
        }
    }

    fn last_depth(&self) -> Option<usize> {
        match &self.transformer_depth {
            Some(PerBlock::One(d)) => Some(*d),
            Some(PerBlock::List(ds)) => ds.last().copied(),
            None => Some(1),
        }
    }

    /// The diffusers `UNet2DConditionModel` config, as `create_unet_diffusers_config_from_ldm`
    /// makes it: block types from `attention_resolutions`, `attention_head_dim` = `num_heads` when
    /// the YAML gives it (diffusers' name for the head count), else with linear projections the
    /// per-level head counts `model_channels / num_head_channels × mult`, else diffusers' default
    /// (8); SDXL's `num_classes: sequential` becomes the `text_time` added embedding over
    /// `adm_in_channels` features. `sample_size` is the YAML's `image_size` (diffusers puts the pipeline's pixel size over
    /// 8 there; the forward never reads it).
    pub fn to_diffusers(&self) -> Result<UNet2DConditionModelConfig> {
        self.check_supported()?;
        let levels = self.channel_mult.len();
        if levels == 0 || self.model_channels == 0 || self.num_res_blocks == 0 {
            return Err(Error::config(
                UNET_BLOCK,
                "channel_mult, model_channels and num_res_blocks must be non-empty / positive",
            ));
        }
        let block_type = |i: usize, kind: &str| {
            let cross = if self.has_attention(i) { "CrossAttn" } else { "" };
            format!("{cross}{kind}Block2D")
        };
        let mut cfg = UNet2DConditionModelConfig {
            sample_size: self.image_size.map(PerBlock::One),
            in_channels: self.in_channels,
            out_channels: self.out_channels,
            down_block_types: (0..levels).map(|i| block_type(i, "Down")).collect(),
            up_block_types: (0..levels).rev().map(|i| block_type(i, "Up")).collect(),
            block_out_channels: self.channel_mult.iter().map(|m| m * self.model_channels).collect(),
            layers_per_block: PerBlock::One(self.num_res_blocks),
            use_linear_projection: self.use_linear_in_transformer,
            ..Default::default()
        };
        if let Some(depth) = &self.transformer_depth {
            cfg.transformer_layers_per_block = match depth {
                PerBlock::One(d) => PerBlock::One(crate::diffusers::unets::mid_block::LayersPerBlock::One(*d)),
                PerBlock::List(ds) => PerBlock::List(
                    ds.iter()
                        .map(|d| crate::diffusers::unets::mid_block::LayersPerBlock::One(*d))
                        .collect(),
                ),
            };
        }
        match (self.num_heads, self.num_head_channels) {
            (Some(heads), _) => cfg.attention_head_dim = PerBlock::One(positive(heads, "num_heads")?),
            (None, Some(per_head)) if self.use_linear_in_transformer => {
                let per_level = self.model_channels / positive(per_head, "num_head_channels")?;
                cfg.attention_head_dim = PerBlock::List(self.channel_mult.iter().map(|m| per_level * m).collect());
            }
            _ => {}
        }
        match self.context_width() {
            Some(d) => cfg.cross_attention_dim = PerBlock::One(d),
            None => {
                return Err(Error::config(
                    UNET_BLOCK,
                    "context_dim is required (a text-conditioned U-Net)",
                ))
            }
        }
        if self.sdxl_conditions()? {
            // diffusers: SDXL's `label_emb` is `add_embedding` over `text_embeds` and six 256-wide
            // time-id embeddings
            cfg.addition_embed_type = Some("text_time".into());
            cfg.addition_time_embed_dim = Some(256);
            cfg.projection_class_embeddings_input_dim = self.adm_in_channels;
        }
        Ok(cfg)
    }
}

fn positive(v: i64, key: &str) -> Result<usize> {
    usize::try_from(v)
        .ok()
        .filter(|&v| v > 0)
        .ok_or_else(|| Error::config(UNET_BLOCK, format!("{key} = {v}: expected a positive number")))
}

/// ldm's `Encoder` / `Decoder` keyword arguments (`first_stage_config.params.ddconfig`).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LdmDdConfig {
    #[serde(default = "yes")]
    pub double_z: bool,
    pub z_channels: usize,
    #[serde(default)]
    pub resolution: Option<usize>,
    pub in_channels: usize,
    pub out_ch: usize,
    pub ch: usize,
    pub ch_mult: Vec<usize>,
    pub num_res_blocks: usize,
    #[serde(default)]
    pub attn_resolutions: Vec<usize>,
    #[serde(default)]
    pub dropout: f64,
    #[serde(default)]
    pub attn_type: Option<String>,
}

/// `ldm.models.autoencoder.AutoencoderKL`'s config: the YAML's `first_stage_config.params`
/// (`ddconfig`, `embed_dim`) and `model.params.scale_factor`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LdmVaeConfig {
    pub ddconfig: LdmDdConfig,
    pub embed_dim: usize,
    /// `model.params.scale_factor` (diffusers' `scaling_factor`; 0.18215 when absent).
    #[serde(default)]
    pub scale_factor: Option<f64>,
}

impl LdmVaeConfig {
    pub fn from_json(params: &Value) -> Result<Self> {
        crate::config::from_json(VAE_BLOCK, params)
    }

    /// Stable Diffusion 1.x / 2.x's first stage (`ch` 128, `ch_mult` 1, 2, 4, 4, `scale_factor` 0.18215).
    pub fn sd() -> Self {
        Self {
            ddconfig: LdmDdConfig {
                double_z: true,
                z_channels: 4,
                resolution: Some(256),
                in_channels: 3,
                out_ch: 3,
                ch: 128,
                ch_mult: vec![1, 2, 4, 4],
                num_res_blocks: 2,
                attn_resolutions: vec![],
                dropout: 0.0,
                attn_type: None,
            },
            embed_dim: 4,
            scale_factor: Some(0.18215),
        }
    }

    /// The diffusers `AutoencoderKL` config, as `create_vae_diffusers_config_from_ldm` makes it.
    /// Refused: attention inside the levels (`attn_resolutions`, which diffusers' blocks lack), a
    /// single-moment encoder (`double_z = false`), `embed_dim` other than `z_channels`, and
    /// attention other than the plain one (`attn_type` `vanilla`, or `vanilla-xformers`: the same
    /// weights).
    pub fn to_diffusers(&self) -> Result<AutoencoderKLConfig> {
        let dd = &self.ddconfig;
        let refuse = |what: &str| Err(Error::config(VAE_BLOCK, format!("{what}: not implemented")));
        if !dd.attn_resolutions.is_empty() {
            return refuse("attn_resolutions (attention inside the levels)");
        }
        if !dd.double_z {
            return refuse("double_z = false");
        }
        if self.embed_dim != dd.z_channels {
            return refuse("embed_dim other than z_channels");
        }
        if let Some(kind) = dd.attn_type.as_deref().filter(|k| !k.starts_with("vanilla")) {
            return refuse(&format!("attn_type {kind:?}"));
        }
        if dd.ch_mult.is_empty() || dd.ch == 0 {
            return Err(Error::config(VAE_BLOCK, "ch and ch_mult must be positive / non-empty"));
        }
        let levels = dd.ch_mult.len();
        Ok(AutoencoderKLConfig {
            in_channels: dd.in_channels,
            out_channels: dd.out_ch,
            down_block_types: vec!["DownEncoderBlock2D".into(); levels],
            up_block_types: vec!["UpDecoderBlock2D".into(); levels],
            block_out_channels: dd.ch_mult.iter().map(|m| m * dd.ch).collect(),
            layers_per_block: dd.num_res_blocks,
            latent_channels: dd.z_channels,
            sample_size: dd.resolution.map(Value::from),
            scaling_factor: self.scale_factor.unwrap_or(0.18215),
            ..Default::default()
        })
    }
}
