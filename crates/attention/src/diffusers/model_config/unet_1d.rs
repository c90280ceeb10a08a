//! The mid block of `UNet1DModel`'s `config.json` (diffusers 0.42.1, `unets/unet_1d.py`): Dance
//! Diffusion's `UNetMidBlock1D` and the Diffuser planning models' `MidResTemporalBlock1D` /
//! `ValueFunctionMidBlock1D` (used by [`super::mid_blocks`]).

use super::{bad, Cfg, MidBlockSpec};
use crate::diffusers::unets::mid_block_1d::UNetMidBlock1D;
use crate::diffusers::unets::mid_block_1d_temporal::{MidResTemporalBlock1D, ValueFunctionMidBlock1D};
use crate::Result;
use serde_json::{json, Value};

/// `UNet1DModel`: `get_mid_block(mid_block_type, num_layers=layers_per_block,
/// in_channels=mid_channels=out_channels=block_out_channels[-1], embed_dim=block_out_channels[0],
/// add_downsample=downsample_each_block)`, each class taking the arguments it has.
pub(super) fn unet_1d(c: &Cfg) -> Result<Option<MidBlockSpec>> {
    let (first, last) = c.last_channels(&[32, 32, 64])?;
    let (block, config) = match c.value("mid_block_type", json!("UNetMidBlock1D")) {
        Value::String(s) if s == "UNetMidBlock1D" => (
            UNetMidBlock1D::BLOCK,
            json!({"in_channels": last, "mid_channels": last, "out_channels": last}),
        ),
        Value::String(s) if s == "MidResTemporalBlock1D" => (
            MidResTemporalBlock1D::BLOCK,
            json!({"in_channels": last, "out_channels": last, "embed_dim": first,
                   "num_layers": c.value("layers_per_block", json!(1)),
                   "add_downsample": c.value("downsample_each_block", json!(false))}),
        ),
        Value::String(s) if s == "ValueFunctionMidBlock1D" => (
            ValueFunctionMidBlock1D::BLOCK,
            json!({"in_channels": last, "out_channels": last, "embed_dim": first}),
        ),
        other => {
            return Err(bad(format!(
                "UNet1DModel mid_block_type {other} (diffusers raises too)"
            )))
        }
    };
    Ok(Some(MidBlockSpec {
        block,
        config,
        prefix: "mid_block",
    }))
}
