//! The encoder and decoder mid blocks of `AutoencoderKL` and `VQModel` `config.json`s (diffusers
//! 0.42.1, `autoencoders/vae.py`'s `Encoder` / `Decoder`; used by [`super::mid_blocks`]).

use super::{bad, Cfg, MidBlockSpec};
use crate::diffusers::unets::mid_block::UNetMidBlock2D;
use crate::Result;
use serde_json::{json, Value};

/// The encoder and decoder mid blocks of `AutoencoderKL` and `VQModel`: `UNetMidBlock2D(
/// in_channels=block_out_channels[-1], resnet_eps=1e-6, resnet_act_fn=act_fn, output_scale_factor=1,
/// attention_head_dim=block_out_channels[-1], resnet_groups=norm_num_groups, temb_channels=None,
/// add_attention=mid_block_add_attention)`; `spatial_zq`: the decoder's `"spatial"` time scale
/// shift with `temb_channels=latent_channels` (`VQModel(norm_type="spatial")`).
pub(super) fn autoencoder(c: &Cfg, spatial_zq: Option<Value>) -> Result<Vec<MidBlockSpec>> {
    let (_, last) = c.last_channels(&[64])?;
    let encoder = json!({
        "in_channels": last,
        "resnet_eps": 1e-6,
        "resnet_act_fn": c.value("act_fn", json!("silu")),
        "output_scale_factor": 1,
        "resnet_time_scale_shift": "default",
        "attention_head_dim": last,
        "resnet_groups": c.value("norm_num_groups", json!(32)),
        "temb_channels": null,
        "add_attention": c.value("mid_block_add_attention", json!(true)),
    });
    let mut decoder = encoder.clone();
    if let Some(zq) = spatial_zq {
        decoder["resnet_time_scale_shift"] = json!("spatial");
        decoder["temb_channels"] = zq;
    }
    Ok(vec![
        MidBlockSpec {
            block: UNetMidBlock2D::BLOCK,
            config: encoder,
            prefix: "encoder.mid_block",
        },
        MidBlockSpec {
            block: UNetMidBlock2D::BLOCK,
            config: decoder,
            prefix: "decoder.mid_block",
        },
    ])
}

/// `VQModel`: the encoder's mid block as `AutoencoderKL`'s; the decoder's conditions on the
/// quantized latent with `norm_type="spatial"` (`temb_channels=latent_channels`, default 3).
pub(super) fn vq_model(c: &Cfg) -> Result<Vec<MidBlockSpec>> {
    match c.value("norm_type", json!("group")).as_str() {
        Some("group") => autoencoder(c, None),
        Some("spatial") => autoencoder(c, Some(c.value("latent_channels", json!(3)))),
        _ => Err(bad(format!(
            "norm_type {}: VQModel takes \"group\" or \"spatial\"",
            c.value("norm_type", Value::Null)
        ))),
    }
}
