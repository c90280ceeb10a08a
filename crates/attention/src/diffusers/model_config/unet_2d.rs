//! The mid blocks of `UNet2DModel`'s and `UNet2DConditionModel`'s `config.json` (diffusers
//! 0.42.1, `unets/unet_2d.py` and `unets/unet_2d_condition.py`): `get_mid_block`'s kwargs for
//! `UNetMidBlock2D`, `UNetMidBlock2DCrossAttn` and `UNetMidBlock2DSimpleCrossAttn`, and the
//! `encoder_hid_dim_type` / `addition_embed_type` checks of `__init__` (used by
//! [`super::mid_blocks`]).

use super::{bad, Cfg, MidBlockSpec, CONTEXT};
use crate::diffusers::unets::mid_block::{UNetMidBlock2D, UNetMidBlock2DCrossAttn};
use crate::diffusers::unets::mid_block_simple_cross::UNetMidBlock2DSimpleCrossAttn;
use crate::{Error, Result};
use serde_json::{json, Value};

pub(super) fn unet_2d(c: &Cfg) -> Result<Option<MidBlockSpec>> {
    match c.value("mid_block_type", json!("UNetMidBlock2D")) {
        Value::Null => return Ok(None),
        Value::String(s) if s == "UNetMidBlock2D" => {}
        other => {
            return Err(Error::unsupported(
                CONTEXT,
                format!("UNet2DModel mid_block_type {other}"),
            ))
        }
    }
    let (first, last) = c.last_channels(&[224, 448, 672, 896])?;
    let head_dim = match c.value("attention_head_dim", json!(8)) {
        Value::Null => json!(last),
        v => v,
    };
    Ok(Some(MidBlockSpec {
        block: UNetMidBlock2D::BLOCK,
        config: json!({
            "in_channels": last,
            "temb_channels": c.time_embed_dim(first, 4)?,
            "dropout": c.value("dropout", json!(0.0)),
            "resnet_eps": c.value("norm_eps", json!(1e-5)),
            "resnet_act_fn": c.value("act_fn", json!("silu")),
            "output_scale_factor": c.value("mid_block_scale_factor", json!(1)),
            "resnet_time_scale_shift": c.value("resnet_time_scale_shift", json!("default")),
            "attention_head_dim": head_dim,
            "resnet_groups": c.value("norm_num_groups", json!(32)),
            "attn_groups": c.value("attn_norm_num_groups", Value::Null),
            "add_attention": c.value("add_attention", json!(true)),
        }),
        prefix: "mid_block",
    }))
}

pub(super) fn unet_2d_condition(c: &Cfg) -> Result<Option<MidBlockSpec>> {
    let (first, last) = c.last_channels(&[320, 640, 1280, 1280])?;
    let fourier = c.value("time_embedding_type", json!("positional")) == json!("fourier");
    let mut temb = c.time_embed_dim(first, if fourier { 2 } else { 4 })?;
    if c.value("class_embeddings_concat", json!(false)) == json!(true) {
        temb = json!(
            temb.as_u64()
                .ok_or_else(|| bad("`time_embedding_dim` is not a count"))?
                * 2
        );
    }
    check_encoder_hid_and_addition(c, UNET_HID_TYPES, UNET_ADDITION_TYPES)?;
    let common = json!({
        "in_channels": last,
        "temb_channels": temb,
        "dropout": c.value("dropout", json!(0.0)),
        "resnet_eps": c.value("norm_eps", json!(1e-5)),
        "resnet_act_fn": c.value("act_fn", json!("silu")),
        "output_scale_factor": c.value("mid_block_scale_factor", json!(1)),
        "resnet_groups": c.value("norm_num_groups", json!(32)),
        "resnet_time_scale_shift": c.value("resnet_time_scale_shift", json!("default")),
    });
    let mut config = common.as_object().cloned().unwrap_or_default();
    let (block, extra) = match c.value("mid_block_type", json!("UNetMidBlock2DCrossAttn")) {
        Value::Null => return Ok(None),
        Value::String(s) if s == "UNetMidBlock2DCrossAttn" => (UNetMidBlock2DCrossAttn::BLOCK, cross_attn_kwargs(c)?),
        Value::String(s) if s == "UNetMidBlock2DSimpleCrossAttn" => {
            (UNetMidBlock2DSimpleCrossAttn::BLOCK, simple_cross_attn_kwargs(c)?)
        }
        Value::String(s) if s == "UNetMidBlock2D" => (
            UNetMidBlock2D::BLOCK,
            vec![("num_layers", json!(0)), ("add_attention", json!(false))],
        ),
        other => {
            return Err(Error::unsupported(
                CONTEXT,
                format!("UNet2DConditionModel mid_block_type {other}"),
            ))
        }
    };
    for (k, v) in extra {
        config.insert(k.into(), v);
    }
    Ok(Some(MidBlockSpec {
        block,
        config: Value::Object(config),
        prefix: "mid_block",
    }))
}

/// `get_mid_block("UNetMidBlock2DCrossAttn", ...)`: the per-block lists' last entries,
/// `num_attention_heads = num_attention_heads or attention_head_dim`.
pub(super) fn cross_attn_kwargs(c: &Cfg) -> Result<Vec<(&'static str, Value)>> {
    let heads = match c.value("num_attention_heads", Value::Null) {
        Value::Null => c.last_of("attention_head_dim", json!(8))?,
        _ => c.last_of("num_attention_heads", Value::Null)?,
    };
    Ok(vec![
        (
            "transformer_layers_per_block",
            c.last_of("transformer_layers_per_block", json!(1))?,
        ),
        ("num_attention_heads", heads),
        ("cross_attention_dim", c.last_of("cross_attention_dim", json!(1280))?),
        ("dual_cross_attention", c.value("dual_cross_attention", json!(false))),
        ("use_linear_projection", c.value("use_linear_projection", json!(false))),
        ("upcast_attention", c.value("upcast_attention", json!(false))),
        ("attention_type", c.value("attention_type", json!("default"))),
    ])
}

/// `get_mid_block("UNetMidBlock2DSimpleCrossAttn", ...)`: `cross_attention_dim[-1]` (the
/// `added_kv_proj_dim`; `encoder_hid_proj`, when there is one, projects the context to the
/// config's `cross_attention_dim` before any block sees it), `attention_head_dim[-1]` as the
/// per-head width (here it is not a head count), `skip_time_act=resnet_skip_time_act`,
/// `only_cross_attention=mid_block_only_cross_attention` (`None`: `only_cross_attention` when
/// that is a bool, else False) and `cross_attention_norm`. `resnet_out_scale_factor` goes to the
/// down and up blocks only.
fn simple_cross_attn_kwargs(c: &Cfg) -> Result<Vec<(&'static str, Value)>> {
    let head_dim = match c.last_of("attention_head_dim", json!(8))? {
        Value::Null => return Err(bad(
            "`attention_head_dim` is null: UNetMidBlock2DSimpleCrossAttn computes in_channels // attention_head_dim \
                 (diffusers fails with a TypeError)",
        )),
        v => v,
    };
    let only_cross = match c.value("mid_block_only_cross_attention", Value::Null) {
        Value::Null => match c.value("only_cross_attention", json!(false)) {
            Value::Bool(b) => json!(b),
            _ => json!(false),
        },
        v => v,
    };
    Ok(vec![
        ("attention_head_dim", head_dim),
        ("cross_attention_dim", c.last_of("cross_attention_dim", json!(1280))?),
        ("skip_time_act", c.value("resnet_skip_time_act", json!(false))),
        ("only_cross_attention", only_cross),
        ("cross_attention_norm", c.value("cross_attention_norm", Value::Null)),
    ])
}

const UNET_HID_TYPES: &[&str] = &["text_proj", "text_image_proj", "image_proj"];
const UNET_ADDITION_TYPES: &[&str] = &["text", "text_image", "text_time", "image", "image_hint"];

fn quoted(names: &[&str]) -> String {
    names.iter().map(|n| format!("\"{n}\"")).collect::<Vec<_>>().join(", ")
}

/// What `UNet2DConditionModel.__init__` (and `ControlNetModel.__init__`, with fewer types)
/// raises on in `_set_encoder_hid_proj` and `_set_add_embedding`: an `encoder_hid_dim_type`
/// without `encoder_hid_dim`, a type it does not know, and an unknown `addition_embed_type`.
/// (`encoder_hid_dim` alone means `"text_proj"`.)
pub(super) fn check_encoder_hid_and_addition(c: &Cfg, hid_types: &[&str], addition_types: &[&str]) -> Result<()> {
    let hid_dim = c.value("encoder_hid_dim", Value::Null);
    match (c.value("encoder_hid_dim_type", Value::Null), &hid_dim) {
        (Value::Null, _) => {}
        (kind, Value::Null) => {
            return Err(bad(format!(
                "`encoder_hid_dim` has to be defined when `encoder_hid_dim_type` is set to {kind}"
            )))
        }
        (Value::String(k), _) if hid_types.contains(&k.as_str()) => {}
        (kind, _) => {
            return Err(bad(format!(
                "`encoder_hid_dim_type` {kind} must be null or one of {}",
                quoted(hid_types)
            )))
        }
    }
    match c.value("addition_embed_type", Value::Null) {
        Value::Null => Ok(()),
        Value::String(k) if addition_types.contains(&k.as_str()) => Ok(()),
        other => Err(bad(format!(
            "`addition_embed_type` {other} must be null or one of {}",
            quoted(addition_types)
        ))),
    }
}
