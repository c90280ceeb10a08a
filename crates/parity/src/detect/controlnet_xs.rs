//! ControlNet-XS in a checkpoint: `UNetControlNetXSModel`'s `ControlNetXSCrossAttnMidBlock2D`
//! (`base_to_ctrl`, `base_midblock`, `ctrl_midblock`, `ctrl_to_base` under `mid_block.`, or a
//! bare block at the top level), and a `ControlNetXSAdapter`'s `MidBlockControlNetXSAdapter`
//! (`mid_block.base_to_ctrl`, `mid_block.midblock`, `mid_block.ctrl_to_base`: no base mid block),
//! named with what to do.

use super::{diffusers, dim, has, prefixes, Found};
use crate::checkpoint::Checkpoint;
use serde_json::{json, Map, Value};
use unet_attention::diffusers::model_config::controlnet_xs::CONTROLNET_XS_ADAPTER;
use unet_attention::diffusers::ControlNetXSCrossAttnMidBlock2D;

/// The ControlNet-XS mid blocks (and adapters) in `ck`.
pub(super) fn find(ck: &Checkpoint) -> Vec<Found> {
    prefixes(ck, "base_to_ctrl.weight")
        .into_iter()
        .filter(|p| p.ends_with("mid_block.") || p.is_empty())
        .filter_map(|p| {
            if has(ck, &format!("{p}base_midblock.resnets.0.conv1.weight")) {
                Some(block(ck, &p))
            } else if has(ck, &format!("{p}midblock.resnets.0.conv1.weight")) {
                Some(adapter(ck, &p))
            } else {
                None
            }
        })
        .collect()
}

/// `base_channels` and `ctrl_channels` from the zero convolutions.
fn channels(ck: &Checkpoint, p: &str) -> Map<String, Value> {
    let mut config = Map::new();
    config.insert(
        "base_channels".into(),
        json!(dim(ck, &format!("{p}base_to_ctrl.weight"), 0)),
    );
    config.insert(
        "ctrl_channels".into(),
        json!(dim(ck, &format!("{p}ctrl_to_base.weight"), 1)),
    );
    config
}

fn block(ck: &Checkpoint, p: &str) -> Found {
    let base = diffusers(ck, &format!("{p}base_midblock."));
    let mut config = channels(ck, p);
    for (ours, theirs) in [
        ("temb_channels", "temb_channels"),
        ("transformer_layers_per_block", "transformer_layers_per_block"),
        ("cross_attention_dim", "cross_attention_dim"),
        ("use_linear_projection", "use_linear_projection"),
    ] {
        if let Some(v) = base.config.get(theirs) {
            config.insert(ours.into(), v.clone());
        }
    }
    let inner = |m: &str| {
        dim(
            ck,
            &format!("{p}{m}.attentions.0.transformer_blocks.0.attn1.to_q.weight"),
            0,
        )
    };
    Found {
        prefix: p.to_string(),
        block: Some(ControlNetXSCrossAttnMidBlock2D::BLOCK),
        variant: format!(
            "diffusers ControlNetXSCrossAttnMidBlock2D (UNetControlNetXSModel: base_to_ctrl + base_midblock ({} \
             channels) + ctrl_midblock ({} channels) + ctrl_to_base; outputs h_base, h_ctrl)",
            inner("base_midblock").unwrap_or(0),
            inner("ctrl_midblock").unwrap_or(0),
        ),
        config,
        unknown: vec![
            "base_num_attention_heads (the config's `num_attention_heads`, last entry; 8 by default: pass the \
             model's config.json)"
                .to_string(),
            "ctrl_num_attention_heads (the config's `ctrl_num_attention_heads`, last entry)".to_string(),
            "norm_num_groups (32 in SD)".to_string(),
            "ctrl_max_norm_num_groups (32 by default; ctrl_midblock's groups are find_largest_factor(gcd(ctrl, \
             ctrl + base), it))"
                .to_string(),
            "upcast_attention (true by default in UNetControlNetXSModel)".to_string(),
        ],
        from_config: None,
    }
}

fn adapter(ck: &Checkpoint, p: &str) -> Found {
    Found {
        prefix: p.to_string(),
        block: None,
        variant: format!("diffusers ControlNetXSAdapter mid block, not supported as it is: {CONTROLNET_XS_ADAPTER}"),
        config: channels(ck, p),
        unknown: vec![],
        from_config: None,
    }
}
