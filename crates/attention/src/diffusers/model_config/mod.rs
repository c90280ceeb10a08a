//! The mid block's constructor kwargs from a whole model's `config.json` (diffusers 0.42.1
//! `UNet2DModel`, `UNet2DConditionModel`, `AutoencoderKL`, `VQModel`, `ControlNetModel`), so nobody retypes
//! `attention_head_dim`. Each function follows the model's `__init__` line for line:
//!
//! * `UNet2DModel`: `UNetMidBlock2D(in_channels=block_out_channels[-1], temb_channels=time_embed_dim,
//!   dropout, resnet_eps=norm_eps, resnet_act_fn=act_fn, output_scale_factor=mid_block_scale_factor,
//!   resnet_time_scale_shift, attention_head_dim=attention_head_dim or block_out_channels[-1],
//!   resnet_groups=norm_num_groups, attn_groups=attn_norm_num_groups, add_attention)`;
//! * `UNet2DConditionModel`: `get_mid_block(mid_block_type, ...)` with the per-block lists'
//!   last entries (`num_attention_heads = num_attention_heads or attention_head_dim`, the
//!   historical naming: SD's `attention_head_dim: 8` means 8 heads; `UNetMidBlock2DSimpleCrossAttn`
//!   (IF, Kandinsky, UnCLIP) takes `attention_head_dim` as the per-head width;
//!   `dual_cross_attention: true`, Versatile Diffusion's converted image U-Net, gives
//!   `DualTransformer2DModel` attentions, whose pipeline-set attributes are in no `config.json`:
//!   diffusers' defaults unless the spec's config gets `mix_ratio` / `condition_lengths` /
//!   `transformer_index_for_condition` keys);
//! * `AutoencoderKL`: encoder and decoder `UNetMidBlock2D(in_channels=block_out_channels[-1],
//!   resnet_eps=1e-6, output_scale_factor=1, attention_head_dim=block_out_channels[-1],
//!   temb_channels=None, add_attention=mid_block_add_attention, ...)`;
//! * `UNet1DModel`: `UNetMidBlock1D` (Dance Diffusion), `MidResTemporalBlock1D` or
//!   `ValueFunctionMidBlock1D` (the Diffuser planning models) by `mid_block_type`, at
//!   `block_out_channels[-1]` channels with `embed_dim=block_out_channels[0]`;
//! * `VQModel`: the same two, except that with `norm_type="spatial"` (Kandinsky 2.x's MoVQ) the
//!   decoder's has `resnet_time_scale_shift="spatial"` and `temb_channels=latent_channels` (its
//!   `temb` is the quantized latent);
//! * `UNet3DConditionModel` (`unets/unet_3d_condition.py`, ModelScope / Zeroscope text-to-video):
//!   `num_attention_heads` must be null (diffusers raises `NotImplementedError`), then
//!   `UNetMidBlock3DCrossAttn(in_channels=block_out_channels[-1], temb_channels=block_out_channels[0] * 4,
//!   resnet_eps=norm_eps, resnet_act_fn=act_fn, output_scale_factor=mid_block_scale_factor,
//!   cross_attention_dim, num_attention_heads=attention_head_dim[-1], resnet_groups=norm_num_groups,
//!   dual_cross_attention=False)` (the mid block reads `num_attention_heads` as the per-head width);
//! * `UNetSpatioTemporalConditionModel` and `AutoencoderKLTemporalDecoder` (Stable Video
//!   Diffusion): see `model_config/svd.rs`;
//! * `ControlNetModel` (`controlnets/controlnet.py`): `UNetMidBlock2DCrossAttn(transformer_layers_per_block[-1],
//!   in_channels=block_out_channels[-1], temb_channels=block_out_channels[0] * 4, resnet_eps=norm_eps,
//!   resnet_act_fn=act_fn, output_scale_factor=mid_block_scale_factor, resnet_time_scale_shift,
//!   cross_attention_dim, num_attention_heads=(num_attention_heads or attention_head_dim)[-1],
//!   resnet_groups=norm_num_groups, use_linear_projection, upcast_attention)` (or, for
//!   `mid_block_type: "UNetMidBlock2D"`, `UNetMidBlock2D(..., num_layers=0, add_attention=False)`)
//!   and the `controlnet_mid_block` convolution: two specs, the whole `ControlNetMidBlock` at the
//!   top level (prefix `""`) and its mid block alone at `mid_block`;
//! * `UNetMotionModel` (AnimateDiff) and `I2VGenXLUNet`: see [`video`];
//! * `UNetControlNetXSModel` (ControlNet-XS): `ControlNetXSCrossAttnMidBlock2D` at `mid_block`, see
//!   [`controlnet_xs`] (a `ControlNetXSAdapter` config is refused with what to do).
//!
//! Keys the class does not have are an error (a config from another class or a newer diffusers
//! may change the block) unless `allow_unknown`; keys starting with `_` (`_class_name`,
//! `_diffusers_version`, `_name_or_path`) are metadata.

use crate::diffusers::model_keys::*;

mod autoencoder;
mod cfg;
mod controlnet;
pub mod controlnet_xs;
mod svd;
mod unet_1d;
mod unet_2d;
pub mod video;
use crate::{Error, Result};
use cfg::Cfg;
use serde_json::Value;

/// Which model class a `config.json` describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelClass {
    UNet2DModel,
    UNet2DConditionModel,
    AutoencoderKL,
    ControlNetModel,
    /// The VQ-VAE (Kandinsky 2.x's MoVQ with `norm_type="spatial"`).
    VQModel,
    /// The 1-D U-Net (Dance Diffusion).
    UNet1DModel,
    /// The video U-Net of ModelScope text-to-video / Zeroscope.
    UNet3DConditionModel,
    /// Stable Video Diffusion's U-Net.
    UNetSpatioTemporalConditionModel,
    /// Stable Video Diffusion's VAE.
    AutoencoderKLTemporalDecoder,
    /// AnimateDiff's U-Net (see [`video`]).
    UNetMotionModel,
    /// I2VGen-XL's image-to-video U-Net (see [`video`]).
    I2VGenXLUNet,
    /// A U-Net fused with a ControlNet-XS adapter (see [`controlnet_xs`]).
    UNetControlNetXSModel,
}

impl ModelClass {
    pub fn name(self) -> &'static str {
        match self {
            ModelClass::UNet2DModel => "UNet2DModel",
            ModelClass::UNet2DConditionModel => "UNet2DConditionModel",
            ModelClass::AutoencoderKL => "AutoencoderKL",
            ModelClass::ControlNetModel => "ControlNetModel",
            ModelClass::VQModel => "VQModel",
            ModelClass::UNet1DModel => "UNet1DModel",
            ModelClass::UNet3DConditionModel => "UNet3DConditionModel",
            ModelClass::UNetSpatioTemporalConditionModel => "UNetSpatioTemporalConditionModel",
            ModelClass::AutoencoderKLTemporalDecoder => "AutoencoderKLTemporalDecoder",
            ModelClass::UNetMotionModel => "UNetMotionModel",
            ModelClass::I2VGenXLUNet => "I2VGenXLUNet",
            ModelClass::UNetControlNetXSModel => "UNetControlNetXSModel",
        }
    }

    fn keys(self) -> &'static [&'static str] {
        match self {
            ModelClass::UNet2DModel => UNET_2D_KEYS,
            ModelClass::UNet2DConditionModel => UNET_2D_CONDITION_KEYS,
            ModelClass::AutoencoderKL => AUTOENCODER_KL_KEYS,
            ModelClass::ControlNetModel => CONTROLNET_KEYS,
            ModelClass::VQModel => VQ_MODEL_KEYS,
            ModelClass::UNet1DModel => UNET_1D_KEYS,
            ModelClass::UNet3DConditionModel => UNET_3D_CONDITION_KEYS,
            ModelClass::UNetSpatioTemporalConditionModel => UNET_SPATIO_TEMPORAL_KEYS,
            ModelClass::AutoencoderKLTemporalDecoder => AUTOENCODER_KL_TEMPORAL_DECODER_KEYS,
            ModelClass::UNetMotionModel => video::UNET_MOTION_KEYS,
            ModelClass::I2VGenXLUNet => video::I2VGEN_XL_KEYS,
            ModelClass::UNetControlNetXSModel => controlnet_xs::UNET_CONTROLNET_XS_KEYS,
        }
    }
}

/// A mid block to build: its block id, constructor kwargs and where it sits in the model's
/// state dict.
#[derive(Debug, Clone, PartialEq)]
pub struct MidBlockSpec {
    /// `diffusers.UNetMidBlock2D`, `diffusers.UNetMidBlock2DCrossAttn`,
    /// `diffusers.UNetMidBlock2DSimpleCrossAttn` or `diffusers.ControlNetMidBlock`.
    pub block: &'static str,
    /// The constructor kwargs (what [`crate::config::from_json`] takes).
    pub config: Value,
    /// Where the block sits, as a `VarBuilder` prefix (`vb.pp(spec.prefix)`): `mid_block`,
    /// `encoder.mid_block`, `decoder.mid_block`; `""` for `ControlNetMidBlock`, whose keys
    /// (`mid_block.*`, `controlnet_mid_block.*`) start at the model's top level (use the
    /// `VarBuilder` itself there: candle's `pp("")` would add a dot). [`MidBlockSpec::key_prefix`]
    /// is the same with the dot that state-dict keys continue with.
    pub prefix: &'static str,
}

impl MidBlockSpec {
    /// The state-dict key prefix: [`MidBlockSpec::prefix`] and a dot (`mid_block.`), what the
    /// block's keys start with and what `unet-parity --prefix` takes.
    pub fn key_prefix(&self) -> String {
        if self.prefix.is_empty() {
            String::new()
        } else {
            format!("{}.", self.prefix)
        }
    }
}

pub(super) const CONTEXT: &str = "config.json";

pub(super) fn bad(message: impl Into<String>) -> Error {
    Error::config(CONTEXT, message)
}

/// The class a config names (`_class_name`), or `None`.
pub fn model_class(config: &Value) -> Result<Option<ModelClass>> {
    match config.get("_class_name").and_then(Value::as_str) {
        None => Ok(None),
        Some("UNet2DModel") => Ok(Some(ModelClass::UNet2DModel)),
        Some("UNet2DConditionModel") => Ok(Some(ModelClass::UNet2DConditionModel)),
        Some("AutoencoderKL") => Ok(Some(ModelClass::AutoencoderKL)),
        Some("ControlNetModel") => Ok(Some(ModelClass::ControlNetModel)),
        Some("VQModel") => Ok(Some(ModelClass::VQModel)),
        Some("UNet1DModel") => Ok(Some(ModelClass::UNet1DModel)),
        Some("UNet3DConditionModel") => Ok(Some(ModelClass::UNet3DConditionModel)),
        Some("UNetSpatioTemporalConditionModel") => Ok(Some(ModelClass::UNetSpatioTemporalConditionModel)),
        Some("AutoencoderKLTemporalDecoder") => Ok(Some(ModelClass::AutoencoderKLTemporalDecoder)),
        Some("UNetMotionModel") => Ok(Some(ModelClass::UNetMotionModel)),
        Some("I2VGenXLUNet") => Ok(Some(ModelClass::I2VGenXLUNet)),
        Some("UNetControlNetXSModel") => Ok(Some(ModelClass::UNetControlNetXSModel)),
        Some("MotionAdapter") => Err(Error::unsupported(CONTEXT, video::MOTION_ADAPTER)),
        Some("ControlNetXSAdapter") => Err(Error::unsupported(CONTEXT, controlnet_xs::CONTROLNET_XS_ADAPTER)),
        Some(other) => Err(Error::unsupported(
            CONTEXT,
            format!(
                "model class `{other}`; known: UNet1DModel, UNet2DModel, UNet2DConditionModel, AutoencoderKL, VQModel, \
                 ControlNetModel, UNet3DConditionModel, UNetSpatioTemporalConditionModel, AutoencoderKLTemporalDecoder, \
                 UNetMotionModel, I2VGenXLUNet, UNetControlNetXSModel"
            ),
        )),
    }
}

/// The mid blocks of the model `config` describes (`_class_name` picks the class; `class` when
/// the file has none). The VAE has two (encoder and decoder).
pub fn mid_blocks(config: &Value, class: Option<ModelClass>, allow_unknown: bool) -> Result<Vec<MidBlockSpec>> {
    let obj = config.as_object().ok_or_else(|| bad("expected a JSON object"))?;
    let class = match (model_class(config)?, class) {
        (Some(c), _) | (None, Some(c)) => c,
        (None, None) => return Err(bad("no `_class_name`: say which model class the config is for")),
    };
    if !allow_unknown {
        let unknown: Vec<&String> = obj
            .keys()
            .filter(|k| !k.starts_with('_') && !class.keys().contains(&k.as_str()))
            .collect();
        if !unknown.is_empty() {
            return Err(bad(format!(
                "keys that diffusers 0.42.1 {} does not have: {} (a newer diffusers or another class?)",
                class.name(),
                unknown.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ")
            )));
        }
    }
    let c = Cfg(obj);
    // Down blocks where the config does not list them: the class defaults' count.
    let default_blocks = match class {
        ModelClass::AutoencoderKL | ModelClass::VQModel | ModelClass::AutoencoderKLTemporalDecoder => 1,
        ModelClass::UNet1DModel => 3,
        _ => 4,
    };
    c.check_shapes(default_blocks)?;
    match class {
        ModelClass::UNet2DModel => unet_2d::unet_2d(&c).map(|s| s.into_iter().collect()),
        ModelClass::UNet2DConditionModel => unet_2d::unet_2d_condition(&c).map(|s| s.into_iter().collect()),
        ModelClass::AutoencoderKL => autoencoder::autoencoder(&c, None),
        ModelClass::VQModel => autoencoder::vq_model(&c),
        ModelClass::UNet1DModel => unet_1d::unet_1d(&c).map(|s| s.into_iter().collect()),
        ModelClass::ControlNetModel => controlnet::controlnet(&c),
        ModelClass::UNet3DConditionModel => video::unet_3d_condition(&c).map(|s| vec![s]),
        ModelClass::UNetSpatioTemporalConditionModel => svd::unet_spatio_temporal(&c).map(|s| vec![s]),
        ModelClass::AutoencoderKLTemporalDecoder => svd::autoencoder_temporal_decoder(&c),
        ModelClass::UNetMotionModel => video::unet_motion(&c).map(|s| vec![s]),
        ModelClass::I2VGenXLUNet => video::i2vgen_xl(&c).map(|s| vec![s]),
        ModelClass::UNetControlNetXSModel => controlnet_xs::unet_controlnet_xs(&c).map(|s| vec![s]),
    }
}

#[cfg(test)]
pub(super) mod tests;
