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
mod controlnet;
pub mod controlnet_xs;
mod svd;
mod unet_1d;
mod unet_2d;
pub mod video;
use crate::{Error, Result};
use serde_json::{json, Map, Value};

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

/// Typed access to config keys with the class defaults.
pub(super) struct Cfg<'a>(&'a Map<String, Value>);

impl Cfg<'_> {
    pub(super) fn value(&self, key: &str, default: Value) -> Value {
        match self.0.get(key) {
            Some(v) => v.clone(),
            None => default,
        }
    }

    fn usize_list(&self, key: &str, default: &[usize]) -> Result<Vec<usize>> {
        match self.0.get(key) {
            None => Ok(default.to_vec()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_u64()
                        .map(|n| n as usize)
                        .ok_or_else(|| bad(format!("`{key}` holds {v}, not a count")))
                })
                .collect(),
            Some(v) => Err(bad(format!("`{key}` must be a list, found {v}"))),
        }
    }

    pub(super) fn last_channels(&self, default: &[usize]) -> Result<(usize, usize)> {
        let channels = self.usize_list("block_out_channels", default)?;
        match (channels.first(), channels.last()) {
            (Some(&first), Some(&last)) => Ok((first, last)),
            _ => Err(bad("`block_out_channels` is empty")),
        }
    }

    /// What the model's `__init__` checks before it builds anything, for the keys a mid block
    /// config reads or that only type-check there: the per-down-block lists (`attention_head_dim`,
    /// `num_attention_heads`, `cross_attention_dim`, `only_cross_attention`, `layers_per_block`,
    /// `transformer_layers_per_block`) hold one entry per down block, and the counts among them
    /// are whole numbers (a `layers_per_block` of `1e308` is not a model).
    fn check_shapes(&self, default_blocks: usize) -> Result<()> {
        // Every model class indexes its first down block (`block_out_channels[0]`): none is no model.
        if matches!(self.0.get("down_block_types"), Some(Value::Array(types)) if types.is_empty()) {
            return Err(bad(
                "`down_block_types` is empty; the model has at least one down block",
            ));
        }
        let blocks = match (self.0.get("down_block_types"), self.0.get("block_out_channels")) {
            (Some(Value::Array(types)), _) => Some(types.len()),
            (_, Some(Value::Array(channels))) => Some(channels.len()),
            (None, None) => Some(default_blocks),
            _ => None,
        };
        const PER_BLOCK: [&str; 6] = [
            "attention_head_dim",
            "num_attention_heads",
            "cross_attention_dim",
            "only_cross_attention",
            "layers_per_block",
            "transformer_layers_per_block",
        ];
        for key in PER_BLOCK {
            let Some(value) = self.0.get(key) else { continue };
            if let (Value::Array(items), Some(n)) = (value, blocks) {
                if items.len() != n {
                    return Err(bad(format!(
                        "`{key}` has {} entries; the model takes one per down block ({n})",
                        items.len()
                    )));
                }
            }
            if key == "only_cross_attention" {
                continue;
            }
            // Whole numbers, or lists of them (of lists, for transformer_layers_per_block);
            // null where the class default is computed.
            fn counts(v: &Value) -> bool {
                match v {
                    Value::Null => true,
                    Value::Number(n) => n.is_u64(),
                    Value::Array(items) => items.iter().all(counts),
                    _ => false,
                }
            }
            if !counts(value) {
                return Err(bad(format!(
                    "`{key}` must be a whole number or a list of them, found {value}"
                )));
            }
        }
        Ok(())
    }

    /// An int-or-list key's last entry (`cross_attention_dim: 768` or `[..., 1280]`).
    pub(super) fn last_of(&self, key: &str, default: Value) -> Result<Value> {
        match self.value(key, default) {
            Value::Array(items) => items
                .last()
                .cloned()
                .ok_or_else(|| bad(format!("`{key}` is an empty list"))),
            v => Ok(v),
        }
    }

    fn time_embed_dim(&self, first: usize, fourier_factor: usize) -> Result<Value> {
        match self.0.get("time_embedding_dim") {
            Some(Value::Null) | None => Ok(json!(first * fourier_factor)),
            Some(v) => Ok(v.clone()),
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::diffusers::controlnet::ControlNetMidBlock;
    use crate::diffusers::mid_block::{UNetMidBlock2D, UNetMidBlock2DCrossAttn};
    use crate::diffusers::mid_block_1d::UNetMidBlock1D;
    use crate::diffusers::mid_block_3d::UNetMidBlock3DCrossAttn;
    use crate::diffusers::mid_block_simple_cross::UNetMidBlock2DSimpleCrossAttn;

    /// The one spec of a config (also for [`video`]'s tests).
    pub(in crate::diffusers) fn one(config: Value) -> MidBlockSpec {
        let mut specs = mid_blocks(&config, None, false).unwrap();
        assert_eq!(specs.len(), 1);
        specs.remove(0)
    }

    #[test]
    fn lists_and_counts_are_checked_as_the_model_checks_them() {
        let base = || {
            json!({"_class_name": "UNet2DConditionModel", "block_out_channels": [320, 640, 1280, 1280],
            "attention_head_dim": 8, "cross_attention_dim": 768})
        };
        let err = |edit: &dyn Fn(&mut Value)| {
            let mut c = base();
            edit(&mut c);
            mid_blocks(&c, None, false).unwrap_err().to_string()
        };
        let e = err(&|c| c["attention_head_dim"] = json!(vec![8; 1_000_000]));
        assert!(
            e.contains("`attention_head_dim` has 1000000 entries") && e.contains("(4)"),
            "{e}"
        );
        let e = err(&|c| c["down_block_types"] = json!([]));
        assert!(e.contains("`down_block_types` is empty"), "{e}");
        let e = err(&|c| c["layers_per_block"] = json!(1e308));
        assert!(e.contains("`layers_per_block` must be a whole number"), "{e}");
        let e = err(&|c| c["cross_attention_dim"] = json!([768, 768]));
        assert!(e.contains("`cross_attention_dim` has 2 entries"), "{e}");
        let e = err(&|c| c["transformer_layers_per_block"] = json!([1, 2, -10, 1]));
        assert!(e.contains("whole number"), "{e}");
        // Without block_out_channels or down_block_types: the class default's four down blocks.
        let mut c = base();
        c.as_object_mut().unwrap().remove("block_out_channels");
        c["attention_head_dim"] = json!([5, 10, 20]);
        assert!(mid_blocks(&c, None, false).unwrap_err().to_string().contains("(4)"));
        // The real shapes pass: per-block lists and nulls.
        let mut c = base();
        c["layers_per_block"] = json!([2, 2, 2, 1]);
        c["transformer_layers_per_block"] = json!([1, 2, 10, 1]);
        c["num_attention_heads"] = Value::Null;
        assert!(mid_blocks(&c, None, false).is_ok());
    }

    #[test]
    fn sd_configs_mean_heads_by_attention_head_dim() {
        // SD 1.5's unet/config.json essentials: `attention_head_dim: 8` is 8 heads.
        let spec = one(
            json!({"_class_name": "UNet2DConditionModel", "_diffusers_version": "0.6.0",
            "block_out_channels": [320, 640, 1280, 1280], "attention_head_dim": 8, "cross_attention_dim": 768,
            "norm_eps": 1e-5, "norm_num_groups": 32}),
        );
        assert_eq!(spec.block, UNetMidBlock2DCrossAttn::BLOCK);
        assert_eq!((spec.prefix, spec.key_prefix().as_str()), ("mid_block", "mid_block."));
        assert_eq!(spec.config["in_channels"], 1280);
        assert_eq!(spec.config["temb_channels"], 1280);
        assert_eq!(spec.config["num_attention_heads"], 8);
        assert_eq!(spec.config["cross_attention_dim"], 768);
        // SD 2.x: a per-block list, the last entry counts; SDXL: num_attention_heads wins.
        let spec = one(
            json!({"_class_name": "UNet2DConditionModel", "attention_head_dim": [5, 10, 20, 20],
            "use_linear_projection": true, "cross_attention_dim": 1024}),
        );
        assert_eq!(spec.config["num_attention_heads"], 20);
        assert_eq!(spec.config["use_linear_projection"], true);
        let spec = one(
            json!({"_class_name": "UNet2DConditionModel", "block_out_channels": [320, 640, 1280],
            "attention_head_dim": [5, 10, 20], "num_attention_heads": null, "transformer_layers_per_block": [1, 2, 10],
            "class_embeddings_concat": true}),
        );
        assert_eq!(spec.config["transformer_layers_per_block"], 10);
        assert_eq!(spec.config["temb_channels"], 2560);
    }

    #[test]
    fn unet_2d_and_vae_configs() {
        let spec =
            one(json!({"_class_name": "UNet2DModel", "block_out_channels": [128, 256], "attention_head_dim": null}));
        assert_eq!(spec.block, UNetMidBlock2D::BLOCK);
        assert_eq!(spec.config["attention_head_dim"], 256);
        assert_eq!(spec.config["temb_channels"], 512);
        assert_eq!(spec.config["resnet_eps"], 1e-5);
        let specs = mid_blocks(
            &json!({"_class_name": "AutoencoderKL", "block_out_channels": [128, 512]}),
            None,
            false,
        )
        .unwrap();
        let prefixes: Vec<_> = specs.iter().map(|s| s.prefix).collect();
        assert_eq!(prefixes, ["encoder.mid_block", "decoder.mid_block"]);
        assert_eq!(specs[0].config["attention_head_dim"], 512);
        assert_eq!(specs[0].config["temb_channels"], Value::Null);
    }

    #[test]
    fn unet_1d_configs_give_unet_mid_block_1d() {
        // harmonai/maestro-150k's unet/config.json (Dance Diffusion), abridged to the keys that matter.
        let dance = json!({"_class_name": "UNet1DModel", "block_out_channels": [32, 32, 64, 64, 128, 128, 256, 256,
            512, 512, 512, 512, 512], "down_block_types": ["DownBlock1DNoSkip", "DownBlock1D", "DownBlock1D",
            "DownBlock1D", "DownBlock1D", "DownBlock1D", "AttnDownBlock1D", "AttnDownBlock1D", "AttnDownBlock1D",
            "AttnDownBlock1D", "AttnDownBlock1D", "AttnDownBlock1D", "AttnDownBlock1D"], "extra_in_channels": 16,
            "mid_block_type": "UNetMidBlock1D", "sample_size": 65536, "time_embedding_type": "fourier"});
        let spec = one(dance);
        assert_eq!(spec.block, UNetMidBlock1D::BLOCK);
        assert_eq!(
            spec.config,
            json!({"in_channels": 512, "mid_channels": 512, "out_channels": 512})
        );
        let value = one(
            json!({"_class_name": "UNet1DModel", "mid_block_type": "ValueFunctionMidBlock1D",
            "block_out_channels": [32, 64, 128, 256], "down_block_types": ["DownResnetBlock1D", "DownResnetBlock1D",
            "DownResnetBlock1D", "DownResnetBlock1D"]}),
        );
        assert_eq!(
            value.config,
            json!({"in_channels": 256, "out_channels": 256, "embed_dim": 32})
        );
        let e = mid_blocks(
            &json!({"_class_name": "UNet1DModel", "mid_block_type": "MidBlock1D"}),
            None,
            false,
        )
        .unwrap_err();
        assert!(e.to_string().contains("MidBlock1D"), "{e}");
    }

    #[test]
    fn vq_model_configs_condition_the_decoder_on_zq_with_spatial_norm() {
        // Kandinsky 2.2's movq/config.json (kandinsky-community/kandinsky-2-2-decoder).
        let movq = json!({"_class_name": "VQModel", "_diffusers_version": "0.18.0.dev0", "act_fn": "silu",
            "block_out_channels": [128, 256, 256, 512], "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D",
            "DownEncoderBlock2D", "AttnDownEncoderBlock2D"], "in_channels": 3, "latent_channels": 4,
            "layers_per_block": 2, "norm_num_groups": 32, "norm_type": "spatial", "num_vq_embeddings": 16384,
            "out_channels": 3, "sample_size": 32, "up_block_types": ["AttnUpDecoderBlock2D", "UpDecoderBlock2D",
            "UpDecoderBlock2D", "UpDecoderBlock2D"], "vq_embed_dim": 4});
        let specs = mid_blocks(&movq, None, false).unwrap();
        assert_eq!(specs[0].config["resnet_time_scale_shift"], "default");
        assert_eq!(specs[0].config["temb_channels"], Value::Null);
        assert_eq!(specs[1].prefix, "decoder.mid_block");
        assert_eq!(specs[1].config["resnet_time_scale_shift"], "spatial");
        assert_eq!(specs[1].config["temb_channels"], 4);
        assert_eq!(specs[1].config["in_channels"], 512);
        // norm_type "group" is AutoencoderKL's pair; anything else is refused.
        let group = mid_blocks(&json!({"_class_name": "VQModel"}), None, false).unwrap();
        assert_eq!(group[1].config["resnet_time_scale_shift"], "default");
        let e = mid_blocks(&json!({"_class_name": "VQModel", "norm_type": "ada"}), None, false).unwrap_err();
        assert!(e.to_string().contains("norm_type"), "{e}");
    }

    #[test]
    fn unknown_keys_and_classes_are_errors() {
        let cfg = json!({"_class_name": "UNet2DModel", "mid_block_flavour": 1});
        let e = mid_blocks(&cfg, None, false).unwrap_err().to_string();
        assert!(e.contains("mid_block_flavour"), "{e}");
        assert!(mid_blocks(&cfg, None, true).is_ok());
        let e = mid_blocks(&json!({"_class_name": "Kandinsky3UNet"}), None, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("Kandinsky3UNet"), "{e}");
        let e = mid_blocks(&json!({"block_out_channels": [4]}), None, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("_class_name"), "{e}");
        let spec = mid_blocks(
            &json!({"block_out_channels": [8]}),
            Some(ModelClass::UNet2DModel),
            false,
        )
        .unwrap();
        assert_eq!(spec[0].config["in_channels"], 8);
    }

    #[test]
    fn simple_cross_attn_configs_follow_unet_2d_condition_model() {
        // DeepFloyd IF-I-like: attention_head_dim is the head width, scale_shift resnets, the
        // T5 context projected by encoder_hid_proj to cross_attention_dim, group_norm cross norm.
        let spec = one(
            json!({"_class_name": "UNet2DConditionModel", "mid_block_type": "UNetMidBlock2DSimpleCrossAttn",
            "block_out_channels": [64, 128, 192], "attention_head_dim": 64, "cross_attention_dim": 256,
            "encoder_hid_dim": 4096, "encoder_hid_dim_type": "text_proj", "addition_embed_type": "text",
            "resnet_time_scale_shift": "scale_shift", "resnet_skip_time_act": true, "resnet_out_scale_factor": 1.414,
            "cross_attention_norm": "group_norm", "only_cross_attention": false, "norm_num_groups": 32}),
        );
        assert_eq!(spec.block, UNetMidBlock2DSimpleCrossAttn::BLOCK);
        let c = &spec.config;
        assert_eq!(
            (c["in_channels"].clone(), c["temb_channels"].clone()),
            (json!(192), json!(256))
        );
        assert_eq!(c["attention_head_dim"], 64);
        assert_eq!(c["cross_attention_dim"], 256);
        assert_eq!(c["skip_time_act"], true);
        assert_eq!(c["cross_attention_norm"], "group_norm");
        assert_eq!(c["resnet_time_scale_shift"], "scale_shift");
        assert_eq!(c["only_cross_attention"], false);
        assert!(c.get("output_scale_factor") == Some(&json!(1)) && c.get("num_attention_heads").is_none());
        let built: crate::diffusers::UNetMidBlock2DSimpleCrossAttnConfig =
            crate::config::from_json(UNetMidBlock2DSimpleCrossAttn::BLOCK, c).unwrap();
        assert_eq!(built.attention_head_dim, 64);
        // UnCLIP-like: a bool only_cross_attention carries to the mid block unless
        // mid_block_only_cross_attention says otherwise; a list does not.
        let base = json!({"_class_name": "UNet2DConditionModel", "mid_block_type": "UNetMidBlock2DSimpleCrossAttn",
            "attention_head_dim": [8, 16], "block_out_channels": [32, 64], "cross_attention_dim": [48, 64],
            "only_cross_attention": true, "cross_attention_norm": "layer_norm"});
        let spec = one(base.clone());
        assert_eq!(spec.config["only_cross_attention"], true);
        assert_eq!(spec.config["attention_head_dim"], 16);
        assert_eq!(spec.config["cross_attention_dim"], 64);
        let mut v = base.clone();
        v["mid_block_only_cross_attention"] = json!(false);
        assert_eq!(one(v).config["only_cross_attention"], false);
        let mut v = base.clone();
        v["only_cross_attention"] = json!([true, true]);
        assert_eq!(one(v).config["only_cross_attention"], false);
        let mut v = base;
        v["attention_head_dim"] = Value::Null;
        let e = mid_blocks(&v, None, false).unwrap_err().to_string();
        assert!(e.contains("attention_head_dim"), "{e}");
    }

    #[test]
    fn controlnet_configs_give_the_whole_bottleneck_and_its_mid_block() {
        // lllyasviel/sd-controlnet-canny's config.json essentials: attention_head_dim 8 = 8 heads.
        let sd15 = json!({"_class_name": "ControlNetModel", "_diffusers_version": "0.16.0.dev0",
            "block_out_channels": [320, 640, 1280, 1280], "attention_head_dim": 8, "cross_attention_dim": 768,
            "norm_eps": 1e-5, "norm_num_groups": 32, "conditioning_embedding_out_channels": [16, 32, 96, 256],
            "controlnet_conditioning_channel_order": "rgb", "global_pool_conditions": false});
        let specs = mid_blocks(&sd15, None, false).unwrap();
        assert_eq!(specs.len(), 2);
        let (whole, mid) = (&specs[0], &specs[1]);
        assert_eq!(
            (whole.block, whole.prefix, whole.key_prefix().as_str()),
            (ControlNetMidBlock::BLOCK, "", "")
        );
        assert_eq!(
            (mid.block, mid.key_prefix().as_str()),
            (UNetMidBlock2DCrossAttn::BLOCK, "mid_block.")
        );
        assert_eq!(whole.config["mid_block"], mid.config);
        assert_eq!(whole.config["mid_block_type"], "UNetMidBlock2DCrossAttn");
        assert_eq!(whole.config["global_pool_conditions"], false);
        let m = &mid.config;
        assert_eq!(
            (m["in_channels"].clone(), m["temb_channels"].clone()),
            (json!(1280), json!(1280))
        );
        assert_eq!(m["num_attention_heads"], 8);
        assert_eq!(m["cross_attention_dim"], 768);
        assert!(
            m.get("dropout").is_none() && m.get("dual_cross_attention").is_none() && m.get("attention_type").is_none()
        );
        let built: crate::diffusers::ControlNetMidBlockConfig =
            crate::config::from_json(ControlNetMidBlock::BLOCK, &whole.config).unwrap();
        assert!(!built.global_pool_conditions);
        // SDXL-like: num_attention_heads wins, per-block lists' last entries.
        let mut v = sd15.clone();
        v["attention_head_dim"] = json!([5, 10, 20]);
        v["num_attention_heads"] = json!([5, 10, 20]);
        v["block_out_channels"] = json!([320, 640, 1280]);
        v["transformer_layers_per_block"] = json!([1, 2, 10]);
        v["use_linear_projection"] = json!(true);
        v["addition_embed_type"] = json!("text_time");
        v["global_pool_conditions"] = json!(true);
        let specs = mid_blocks(&v, None, false).unwrap();
        assert_eq!(specs[1].config["num_attention_heads"], 20);
        assert_eq!(specs[1].config["transformer_layers_per_block"], 10);
        assert_eq!(specs[1].config["temb_channels"], 1280);
        assert_eq!(specs[0].config["global_pool_conditions"], true);
        // mid_block_type UNetMidBlock2D: one ResNet.
        let mut v = sd15.clone();
        v["mid_block_type"] = json!("UNetMidBlock2D");
        let specs = mid_blocks(&v, None, false).unwrap();
        assert_eq!(specs[1].block, UNetMidBlock2D::BLOCK);
        assert_eq!(specs[1].config["num_layers"], 0);
        // What ControlNetModel rejects: another mid block type, image_proj, an added embedding of
        // the IF / Kandinsky kind, and UNet2DConditionModel-only keys.
        for (key, value, needle) in [
            (
                "mid_block_type",
                json!("UNetMidBlock2DSimpleCrossAttn"),
                "UNetMidBlock2DSimpleCrossAttn",
            ),
            ("mid_block_type", Value::Null, "mid_block_type null"),
            ("addition_embed_type", json!("image"), "\"image\""),
            (
                "mid_block_only_cross_attention",
                json!(true),
                "mid_block_only_cross_attention",
            ),
        ] {
            let mut v = sd15.clone();
            v[key] = value;
            let e = mid_blocks(&v, None, false).unwrap_err().to_string();
            assert!(e.contains(needle), "{needle}: {e}");
        }
        let mut v = sd15;
        v["encoder_hid_dim"] = json!(16);
        v["encoder_hid_dim_type"] = json!("image_proj");
        let e = mid_blocks(&v, None, false).unwrap_err().to_string();
        assert!(e.contains("image_proj") && e.contains("text_image_proj"), "{e}");
    }

    #[test]
    fn encoder_hid_and_addition_types_diffusers_rejects_are_errors() {
        let base = json!({"_class_name": "UNet2DConditionModel", "mid_block_type": "UNetMidBlock2DSimpleCrossAttn",
            "attention_head_dim": 8});
        for (key, value, needle) in [
            (
                "encoder_hid_dim_type",
                json!("image_proj"),
                "`encoder_hid_dim` has to be defined",
            ),
            ("encoder_hid_dim_type", json!("ip_image_proj"), "ip_image_proj"),
            ("addition_embed_type", json!("clip"), "clip"),
        ] {
            let mut v = base.clone();
            v[key] = value;
            if key == "encoder_hid_dim_type" && needle != "`encoder_hid_dim` has to be defined" {
                v["encoder_hid_dim"] = json!(16);
            }
            let e = mid_blocks(&v, None, false).unwrap_err().to_string();
            assert!(e.contains(needle), "{e}");
        }
        let mut v = base;
        v["encoder_hid_dim"] = json!(16);
        v["encoder_hid_dim_type"] = json!("text_image_proj");
        v["addition_embed_type"] = json!("text_image");
        assert!(mid_blocks(&v, None, false).is_ok());
    }

    #[test]
    fn unet_3d_condition_configs_give_the_video_mid_block() {
        // shaped like ModelScope text-to-video (1.7b): attention_head_dim 64, 1280 mid channels, context 1024
        let ms = json!({"_class_name": "UNet3DConditionModel", "_diffusers_version": "0.17.0.dev0", "act_fn": "silu",
            "attention_head_dim": 64, "block_out_channels": [320, 640, 1280, 1280], "cross_attention_dim": 1024,
            "down_block_types": ["CrossAttnDownBlock3D", "CrossAttnDownBlock3D", "CrossAttnDownBlock3D", "DownBlock3D"],
            "downsample_padding": 1, "in_channels": 4, "layers_per_block": 2, "mid_block_scale_factor": 1,
            "norm_eps": 1e-05, "norm_num_groups": 32, "out_channels": 4, "sample_size": 32,
            "up_block_types": ["UpBlock3D", "CrossAttnUpBlock3D", "CrossAttnUpBlock3D", "CrossAttnUpBlock3D"]});
        let spec = one(ms.clone());
        assert_eq!(spec.block, UNetMidBlock3DCrossAttn::BLOCK);
        assert_eq!(spec.prefix, "mid_block");
        assert_eq!(
            spec.config,
            json!({"in_channels": 1280, "temb_channels": 1280, "resnet_eps": 1e-05, "resnet_act_fn": "silu",
                "output_scale_factor": 1, "cross_attention_dim": 1024, "num_attention_heads": 64,
                "resnet_groups": 32, "dual_cross_attention": false})
        );
        let cfg: crate::diffusers::UNetMidBlock3DCrossAttnConfig =
            crate::config::from_json("test", &spec.config).unwrap();
        assert!(cfg.use_linear_projection && cfg.num_layers == 1);
        // Defaults (an empty config) and a per-block attention_head_dim list.
        let spec = one(json!({"_class_name": "UNet3DConditionModel", "attention_head_dim": [8, 8, 16, 32]}));
        assert_eq!(spec.config["num_attention_heads"], 32);
        assert_eq!(spec.config["cross_attention_dim"], 1024);
        // num_attention_heads set: diffusers raises.
        let mut bad = ms;
        bad["num_attention_heads"] = json!(8);
        let e = mid_blocks(&bad, None, false).unwrap_err().to_string();
        assert!(e.contains("NotImplementedError"), "{e}");
    }
}
