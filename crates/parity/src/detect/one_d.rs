//! `detect` for the 1-D mid blocks of `UNet1DModel` (diffusers 0.42.1): Dance Diffusion's
//! `UNetMidBlock1D` and the Diffuser planning models' `MidResTemporalBlock1D` /
//! `ValueFunctionMidBlock1D`.

use super::{count, dim, has, Found};
use crate::checkpoint::Checkpoint;
use serde_json::{json, Map};

/// `UNetMidBlock1D` (UNet1DModel, Dance Diffusion): everything its constructor takes is in the
/// keys.
pub(super) fn diffusers_1d(ck: &Checkpoint, p: &str) -> Found {
    let mut config = Map::new();
    config.insert(
        "in_channels".into(),
        json!(dim(ck, &format!("{p}resnets.0.conv_1.weight"), 1)),
    );
    config.insert(
        "mid_channels".into(),
        json!(dim(ck, &format!("{p}resnets.0.conv_1.weight"), 0)),
    );
    config.insert(
        "out_channels".into(),
        json!(dim(ck, &format!("{p}resnets.5.conv_2.weight"), 0)),
    );
    Found {
        prefix: p.to_string(),
        block: Some(unet_attention::diffusers::UNetMidBlock1D::BLOCK),
        variant: "diffusers UNetMidBlock1D (UNet1DModel, Dance Diffusion)".into(),
        config,
        unknown: vec![],
        from_config: None,
    }
}

/// `MidResTemporalBlock1D` / `ValueFunctionMidBlock1D` (UNet1DModel of the Diffuser planning
/// models): channels, time embedding width, layers and resampling from the keys.
pub(super) fn diffusers_1d_temporal(ck: &Checkpoint, p: &str, value: bool) -> Found {
    let first = if value { "res1" } else { "resnets.0" };
    let c_in = dim(ck, &format!("{p}{first}.conv_in.conv1d.weight"), 1);
    let embed = dim(ck, &format!("{p}{first}.time_emb.weight"), 1);
    let mut config = Map::new();
    config.insert("in_channels".into(), json!(c_in));
    config.insert("embed_dim".into(), json!(embed));
    let (block, variant) = if value {
        config.insert("out_channels".into(), json!(c_in));
        (
            unet_attention::diffusers::ValueFunctionMidBlock1D::BLOCK,
            "diffusers ValueFunctionMidBlock1D (UNet1DModel value function, Diffuser)",
        )
    } else {
        let out = dim(ck, &format!("{p}resnets.0.conv_in.conv1d.weight"), 0);
        config.insert("out_channels".into(), json!(out));
        config.insert(
            "num_layers".into(),
            json!(count(ck, &format!("{p}resnets.")).saturating_sub(1)),
        );
        config.insert(
            "add_downsample".into(),
            json!(has(ck, &format!("{p}downsample.conv.weight"))),
        );
        config.insert(
            "add_upsample".into(),
            json!(has(ck, &format!("{p}upsample.conv.weight"))),
        );
        (
            unet_attention::diffusers::MidResTemporalBlock1D::BLOCK,
            "diffusers MidResTemporalBlock1D (UNet1DModel trajectory U-Net, Diffuser)",
        )
    };
    Found {
        prefix: p.to_string(),
        block: Some(block),
        variant: variant.into(),
        config,
        unknown: vec![],
        from_config: None,
    }
}
