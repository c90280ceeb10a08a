//! The mid-block kwargs of two more video U-Nets' `config.json` (diffusers 0.42.1), following
//! their `__init__`s line for line (used by [`super::mid_blocks`]):
//!
//! * `UNetMotionModel` (`unets/unet_motion_model.py`, AnimateDiff): with `use_motion_mid_block`
//!   (default true) `UNetMidBlockCrossAttnMotion(in_channels=block_out_channels[-1],
//!   temb_channels=block_out_channels[0] * 4, resnet_eps=norm_eps, resnet_act_fn=act_fn,
//!   output_scale_factor=mid_block_scale_factor, cross_attention_dim=cross_attention_dim[-1],
//!   num_attention_heads=num_attention_heads[-1], resnet_groups=norm_num_groups,
//!   dual_cross_attention=False, use_linear_projection, num_layers=mid_block_layers,
//!   temporal_num_attention_heads=motion_num_attention_heads[-1],
//!   temporal_max_seq_length=motion_max_seq_length,
//!   transformer_layers_per_block=transformer_layers_per_mid_block,
//!   temporal_transformer_layers_per_block=temporal_transformer_layers_per_mid_block)`, where a
//!   null `transformer_layers_per_mid_block` is `transformer_layers_per_block[-1]` when that is
//!   an int, else 1; without it the same arguments, minus the temporal ones, build a
//!   `UNetMidBlock2DCrossAttn`. Here `num_attention_heads` is a head *count*.
//! * `I2VGenXLUNet` (`unets/unet_i2vgen_xl.py`): `num_attention_heads = attention_head_dim` (the
//!   config's own `num_attention_heads` is ignored, as the constructor overwrites it), then
//!   `UNetMidBlock3DCrossAttn(in_channels=block_out_channels[-1],
//!   temb_channels=block_out_channels[0] * 4, resnet_eps=1e-05, resnet_act_fn="silu",
//!   output_scale_factor=1, cross_attention_dim, num_attention_heads=num_attention_heads[-1],
//!   resnet_groups=norm_num_groups, dual_cross_attention=False)` (the block reads
//!   `num_attention_heads` as the per-head width).
//!
//! A `MotionAdapter` config (AnimateDiff's motion modules alone) is refused with what to do
//! instead ([`MOTION_ADAPTER`]).

use super::{bad, Cfg, MidBlockSpec};
use crate::diffusers::unets::mid_block::UNetMidBlock2DCrossAttn;
use crate::diffusers::unets::mid_block_3d::UNetMidBlock3DCrossAttn;
use crate::diffusers::unets::mid_block_motion::UNetMidBlockCrossAttnMotion;
use crate::Result;
use serde_json::{json, Value};

/// What `model_config` and `detect` say about a `MotionAdapter`.
pub const MOTION_ADAPTER: &str = "a MotionAdapter (AnimateDiff motion modules: `down_blocks.*.motion_modules`, \
     `mid_block.motion_modules`, `up_blocks.*.motion_modules`) is not a whole mid block: it has no resnets or \
     spatial transformers. Load it into a UNetMotionModel (`UNetMotionModel.from_unet2d(unet, motion_adapter)`, as \
     AnimateDiffPipeline does) and `save_pretrained` that: its `mid_block` is a UNetMidBlockCrossAttnMotion. A \
     motion module alone is an AnimateDiffTransformer3D (the same class as TransformerTemporalModel), not a \
     registered block";

/// `UNetMotionModel.__init__` arguments (0.42.1).
pub(super) const UNET_MOTION_KEYS: &[&str] = &[
    "sample_size",
    "in_channels",
    "out_channels",
    "down_block_types",
    "up_block_types",
    "block_out_channels",
    "layers_per_block",
    "downsample_padding",
    "mid_block_scale_factor",
    "act_fn",
    "norm_num_groups",
    "norm_eps",
    "cross_attention_dim",
    "transformer_layers_per_block",
    "reverse_transformer_layers_per_block",
    "temporal_transformer_layers_per_block",
    "reverse_temporal_transformer_layers_per_block",
    "transformer_layers_per_mid_block",
    "temporal_transformer_layers_per_mid_block",
    "use_linear_projection",
    "num_attention_heads",
    "motion_max_seq_length",
    "motion_num_attention_heads",
    "reverse_motion_num_attention_heads",
    "use_motion_mid_block",
    "mid_block_layers",
    "encoder_hid_dim",
    "encoder_hid_dim_type",
    "addition_embed_type",
    "addition_time_embed_dim",
    "projection_class_embeddings_input_dim",
    "time_cond_proj_dim",
];

/// `I2VGenXLUNet.__init__` arguments (0.42.1).
pub(super) const I2VGEN_XL_KEYS: &[&str] = &[
    "sample_size",
    "in_channels",
    "out_channels",
    "down_block_types",
    "up_block_types",
    "block_out_channels",
    "layers_per_block",
    "norm_num_groups",
    "cross_attention_dim",
    "attention_head_dim",
    "num_attention_heads",
];

/// `UNetMotionModel.__init__`'s mid block (see the module docs).
pub(super) fn unet_motion(c: &Cfg) -> Result<MidBlockSpec> {
    let (first, last) = c.last_channels(&[320, 640, 1280, 1280])?;
    let layers = match c.value("transformer_layers_per_mid_block", Value::Null) {
        Value::Null => match c.last_of("transformer_layers_per_block", json!(1))? {
            n @ Value::Number(_) => n,
            _ => json!(1),
        },
        v => v,
    };
    let mut config = json!({
        "in_channels": last,
        "temb_channels": first * 4,
        "resnet_eps": c.value("norm_eps", json!(1e-5)),
        "resnet_act_fn": c.value("act_fn", json!("silu")),
        "output_scale_factor": c.value("mid_block_scale_factor", json!(1)),
        "cross_attention_dim": c.last_of("cross_attention_dim", json!(1280))?,
        "num_attention_heads": c.last_of("num_attention_heads", json!(8))?,
        "resnet_groups": c.value("norm_num_groups", json!(32)),
        "dual_cross_attention": false,
        "use_linear_projection": c.value("use_linear_projection", json!(false)),
        "num_layers": c.value("mid_block_layers", json!(1)),
        "transformer_layers_per_block": layers,
    });
    if c.value("use_motion_mid_block", json!(true)) == json!(false) {
        return Ok(MidBlockSpec {
            block: UNetMidBlock2DCrossAttn::BLOCK,
            config,
            prefix: "mid_block",
        });
    }
    let temporal_layers = match c.value("temporal_transformer_layers_per_mid_block", json!(1)) {
        Value::Null => {
            return Err(bad(
                "`temporal_transformer_layers_per_mid_block` is null: UNetMidBlockCrossAttnMotion takes len(None) \
                 (diffusers fails with a TypeError)",
            ))
        }
        v => v,
    };
    if let Some(obj) = config.as_object_mut() {
        obj.insert(
            "temporal_num_attention_heads".into(),
            c.last_of("motion_num_attention_heads", json!(8))?,
        );
        obj.insert(
            "temporal_max_seq_length".into(),
            c.value("motion_max_seq_length", json!(32)),
        );
        obj.insert("temporal_transformer_layers_per_block".into(), temporal_layers);
    }
    Ok(MidBlockSpec {
        block: UNetMidBlockCrossAttnMotion::BLOCK,
        config,
        prefix: "mid_block",
    })
}

/// `I2VGenXLUNet.__init__`'s mid block (see the module docs).
pub(super) fn i2vgen_xl(c: &Cfg) -> Result<MidBlockSpec> {
    let (first, last) = c.last_channels(&[320, 640, 1280, 1280])?;
    let heads = match c.last_of("attention_head_dim", json!(64))? {
        Value::Null => {
            return Err(bad(
                "`attention_head_dim` is null: I2VGenXLUNet uses it as the mid block's num_attention_heads, which \
                 UNetMidBlock3DCrossAttn divides by (diffusers fails with a TypeError)",
            ))
        }
        v => v,
    };
    Ok(MidBlockSpec {
        block: UNetMidBlock3DCrossAttn::BLOCK,
        config: json!({
            "in_channels": last,
            "temb_channels": first * 4,
            "resnet_eps": 1e-5,
            "resnet_act_fn": "silu",
            "output_scale_factor": 1,
            "cross_attention_dim": c.value("cross_attention_dim", json!(1024)),
            "num_attention_heads": heads,
            "resnet_groups": c.value("norm_num_groups", json!(32)),
            "dual_cross_attention": false,
        }),
        prefix: "mid_block",
    })
}

/// `UNet3DConditionModel.__init__`: `UNetMidBlock3DCrossAttn(...)` (see the module docs).
pub(super) fn unet_3d_condition(c: &Cfg) -> Result<MidBlockSpec> {
    if c.value("num_attention_heads", Value::Null) != Value::Null {
        return Err(bad(
            "`num_attention_heads` is set: UNet3DConditionModel raises NotImplementedError (\"not possible to define \
             the number of attention heads via `num_attention_heads`\"); it takes `attention_head_dim`",
        ));
    }
    let (first, last) = c.last_channels(&[320, 640, 1280, 1280])?;
    Ok(MidBlockSpec {
        block: UNetMidBlock3DCrossAttn::BLOCK,
        config: json!({
            "in_channels": last,
            "temb_channels": first * 4,
            "resnet_eps": c.value("norm_eps", json!(1e-5)),
            "resnet_act_fn": c.value("act_fn", json!("silu")),
            "output_scale_factor": c.value("mid_block_scale_factor", json!(1)),
            "cross_attention_dim": c.value("cross_attention_dim", json!(1024)),
            "num_attention_heads": c.last_of("attention_head_dim", json!(64))?,
            "resnet_groups": c.value("norm_num_groups", json!(32)),
            "dual_cross_attention": false,
        }),
        prefix: "mid_block",
    })
}

#[cfg(test)]
mod tests {
    use super::super::{mid_blocks, tests::one};
    use super::*;

    #[test]
    fn unet_motion_configs_give_the_motion_mid_block() {
        // shaped like an SD 1.5 AnimateDiff U-Net (UNetMotionModel.from_unet2d with a v1-5-2 adapter)
        let sd15 = json!({"_class_name": "UNetMotionModel", "_diffusers_version": "0.26.0", "act_fn": "silu",
            "block_out_channels": [320, 640, 1280, 1280], "cross_attention_dim": 768,
            "down_block_types": ["CrossAttnDownBlockMotion", "CrossAttnDownBlockMotion", "CrossAttnDownBlockMotion",
                "DownBlockMotion"], "layers_per_block": 2, "mid_block_scale_factor": 1, "motion_max_seq_length": 32,
            "motion_num_attention_heads": 8, "norm_eps": 1e-05, "norm_num_groups": 32, "num_attention_heads": 8,
            "use_linear_projection": false, "use_motion_mid_block": true,
            "up_block_types": ["UpBlockMotion", "CrossAttnUpBlockMotion", "CrossAttnUpBlockMotion",
                "CrossAttnUpBlockMotion"]});
        let spec = one(sd15.clone());
        assert_eq!(
            (spec.block, spec.prefix),
            (UNetMidBlockCrossAttnMotion::BLOCK, "mid_block")
        );
        assert_eq!(
            spec.config,
            json!({"in_channels": 1280, "temb_channels": 1280, "resnet_eps": 1e-05, "resnet_act_fn": "silu",
                "output_scale_factor": 1, "cross_attention_dim": 768, "num_attention_heads": 8, "resnet_groups": 32,
                "dual_cross_attention": false, "use_linear_projection": false, "num_layers": 1,
                "transformer_layers_per_block": 1, "temporal_num_attention_heads": 8,
                "temporal_max_seq_length": 32, "temporal_transformer_layers_per_block": 1})
        );
        let cfg: crate::diffusers::UNetMidBlockCrossAttnMotionConfig =
            crate::config::from_json("test", &spec.config).unwrap();
        assert_eq!(cfg.temporal_max_seq_length, 32);
        // transformer_layers_per_mid_block null: the last per-block count if an int, else 1.
        let mut c = sd15.clone();
        c["transformer_layers_per_block"] = json!([1, 2, 10, 10]);
        c["motion_num_attention_heads"] = json!([8, 8, 8, 4]);
        let spec = one(c.clone());
        assert_eq!(spec.config["transformer_layers_per_block"], 10);
        assert_eq!(spec.config["temporal_num_attention_heads"], 4);
        c["transformer_layers_per_block"] = json!([1, 2, [10, 10], [10, 10]]);
        c["reverse_transformer_layers_per_block"] = json!([[10, 10], [10, 10], 2, 1]);
        assert_eq!(one(c.clone()).config["transformer_layers_per_block"], 1);
        c["transformer_layers_per_mid_block"] = json!(3);
        assert_eq!(one(c).config["transformer_layers_per_block"], 3);
        // No motion mid block: the plain cross-attention one.
        let mut c = sd15.clone();
        c["use_motion_mid_block"] = json!(false);
        let spec = one(c);
        assert_eq!(spec.block, UNetMidBlock2DCrossAttn::BLOCK);
        assert!(spec.config.get("temporal_max_seq_length").is_none());
        // A null temporal count: diffusers fails.
        let mut c = sd15;
        c["temporal_transformer_layers_per_mid_block"] = Value::Null;
        let e = mid_blocks(&c, None, false).unwrap_err().to_string();
        assert!(e.contains("temporal_transformer_layers_per_mid_block"), "{e}");
    }

    #[test]
    fn i2vgen_xl_configs_give_the_video_mid_block_with_fixed_eps() {
        // shaped like ali-vilab/i2vgen-xl's unet/config.json
        let xl = json!({"_class_name": "I2VGenXLUNet", "_diffusers_version": "0.25.0.dev0", "attention_head_dim": 64,
            "block_out_channels": [320, 640, 1280, 1280], "cross_attention_dim": 1024,
            "down_block_types": ["CrossAttnDownBlock3D", "CrossAttnDownBlock3D", "CrossAttnDownBlock3D", "DownBlock3D"],
            "in_channels": 4, "layers_per_block": 2, "norm_num_groups": 32, "num_attention_heads": null,
            "out_channels": 4, "sample_size": 32,
            "up_block_types": ["UpBlock3D", "CrossAttnUpBlock3D", "CrossAttnUpBlock3D", "CrossAttnUpBlock3D"]});
        let spec = one(xl.clone());
        assert_eq!((spec.block, spec.prefix), (UNetMidBlock3DCrossAttn::BLOCK, "mid_block"));
        assert_eq!(
            spec.config,
            json!({"in_channels": 1280, "temb_channels": 1280, "resnet_eps": 1e-5, "resnet_act_fn": "silu",
                "output_scale_factor": 1, "cross_attention_dim": 1024, "num_attention_heads": 64,
                "resnet_groups": 32, "dual_cross_attention": false})
        );
        // num_attention_heads is overwritten by attention_head_dim, as the constructor does.
        let mut c = xl.clone();
        c["num_attention_heads"] = json!(5);
        c["attention_head_dim"] = json!([8, 8, 16, 32]);
        assert_eq!(one(c).config["num_attention_heads"], 32);
        let mut c = xl;
        c["attention_head_dim"] = Value::Null;
        let e = mid_blocks(&c, None, false).unwrap_err().to_string();
        assert!(e.contains("attention_head_dim"), "{e}");
    }

    #[test]
    fn motion_adapter_configs_say_what_to_do() {
        let e = mid_blocks(&json!({"_class_name": "MotionAdapter"}), None, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a whole mid block") && e.contains("from_unet2d"), "{e}");
    }
}
