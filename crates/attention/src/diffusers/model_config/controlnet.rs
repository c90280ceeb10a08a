//! The mid block of `ControlNetModel`'s `config.json` (diffusers 0.42.1,
//! `controlnets/controlnet.py`): its `UNetMidBlock2DCrossAttn` (or `UNetMidBlock2D`) and the
//! whole `ControlNetMidBlock` with the `controlnet_mid_block` convolution (used by
//! [`super::mid_blocks`]).

use super::unet_2d::{check_encoder_hid_and_addition, cross_attn_kwargs};
use super::{Cfg, MidBlockSpec, CONTEXT};
use crate::diffusers::controlnets::controlnet::ControlNetMidBlock;
use crate::diffusers::unets::mid_block::{UNetMidBlock2D, UNetMidBlock2DCrossAttn};
use crate::{Error, Result};
use serde_json::json;

/// `ControlNetModel.__init__`: the mid block (`get_mid_block` is not used; the kwargs are the
/// `UNetMidBlock2DCrossAttn` ones of [`cross_attn_kwargs`] without `dual_cross_attention` and
/// `attention_type`, which it does not pass, and without `dropout`), then the two specs.
pub(super) fn controlnet(c: &Cfg) -> Result<Vec<MidBlockSpec>> {
    check_encoder_hid_and_addition(
        c,
        &["text_proj", "text_image_proj"],
        &["text", "text_image", "text_time"],
    )?;
    let (first, last) = c.last_channels(&[320, 640, 1280, 1280])?;
    let mut mid = json!({
        "in_channels": last,
        "temb_channels": first * 4,
        "resnet_eps": c.value("norm_eps", json!(1e-5)),
        "resnet_act_fn": c.value("act_fn", json!("silu")),
        "output_scale_factor": c.value("mid_block_scale_factor", json!(1)),
        "resnet_time_scale_shift": c.value("resnet_time_scale_shift", json!("default")),
        "resnet_groups": c.value("norm_num_groups", json!(32)),
    });
    let kind = c.value("mid_block_type", json!("UNetMidBlock2DCrossAttn"));
    let (block, extra) = match kind.as_str() {
        Some("UNetMidBlock2DCrossAttn") => (
            UNetMidBlock2DCrossAttn::BLOCK,
            cross_attn_kwargs(c)?
                .into_iter()
                .filter(|(k, _)| !["dual_cross_attention", "attention_type"].contains(k))
                .collect(),
        ),
        Some("UNetMidBlock2D") => (
            UNetMidBlock2D::BLOCK,
            vec![("num_layers", json!(0)), ("add_attention", json!(false))],
        ),
        _ => {
            return Err(Error::unsupported(
                CONTEXT,
                format!(
                    "ControlNetModel mid_block_type {kind} (diffusers raises \"unknown mid_block_type\"; it builds \
                     UNetMidBlock2DCrossAttn or UNetMidBlock2D)"
                ),
            ))
        }
    };
    if let Some(obj) = mid.as_object_mut() {
        for (k, v) in extra {
            obj.insert(k.into(), v);
        }
    }
    Ok(vec![
        MidBlockSpec {
            block: ControlNetMidBlock::BLOCK,
            config: json!({
                "mid_block_type": kind,
                "mid_block": mid.clone(),
                "global_pool_conditions": c.value("global_pool_conditions", json!(false)),
            }),
            prefix: "",
        },
        MidBlockSpec {
            block,
            config: mid,
            prefix: "mid_block",
        },
    ])
}
