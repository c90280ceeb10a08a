//! Stable Video Diffusion's two model classes (diffusers 0.42.1), read like the others in
//! [`super`]:
//!
//! * `UNetSpatioTemporalConditionModel` (`unets/unet_spatio_temporal_condition.py`):
//!   `UNetMidBlockSpatioTemporal(block_out_channels[-1], temb_channels=block_out_channels[0] * 4,
//!   transformer_layers_per_block=transformer_layers_per_block[-1],
//!   cross_attention_dim=cross_attention_dim[-1], num_attention_heads=num_attention_heads[-1])`
//!   (the per-block keys as an int or one entry per down block);
//! * `AutoencoderKLTemporalDecoder` (`autoencoders/autoencoder_kl_temporal_decoder.py`): the
//!   encoder is `vae.py`'s `Encoder` with its defaults (`act_fn="silu"`, `norm_num_groups=32`,
//!   `mid_block_add_attention=True`, none of them config keys of this class), so its mid block is
//!   `AutoencoderKL`'s `UNetMidBlock2D` with those; the decoder (`TemporalDecoder`) builds
//!   `MidBlockTemporalDecoder(num_layers=layers_per_block, in_channels=block_out_channels[-1],
//!   out_channels=block_out_channels[-1], attention_head_dim=block_out_channels[-1])`.

use super::{autoencoder, Cfg, MidBlockSpec};
use crate::diffusers::mid_block_spatio_temporal::{MidBlockTemporalDecoder, UNetMidBlockSpatioTemporal};
use crate::Result;
use serde_json::json;

/// `UNetSpatioTemporalConditionModel.__init__` (see the module docs).
pub(super) fn unet_spatio_temporal(c: &Cfg) -> Result<MidBlockSpec> {
    let (first, last) = c.last_channels(&[320, 640, 1280, 1280])?;
    Ok(MidBlockSpec {
        block: UNetMidBlockSpatioTemporal::BLOCK,
        config: json!({
            "in_channels": last,
            "temb_channels": first * 4,
            "transformer_layers_per_block": c.last_of("transformer_layers_per_block", json!(1))?,
            "cross_attention_dim": c.last_of("cross_attention_dim", json!(1024))?,
            "num_attention_heads": c.last_of("num_attention_heads", json!([5, 10, 20, 20]))?,
        }),
        prefix: "mid_block",
    })
}

/// `AutoencoderKLTemporalDecoder.__init__` (see the module docs): the encoder's
/// `UNetMidBlock2D`, then the decoder's `MidBlockTemporalDecoder`.
pub(super) fn autoencoder_temporal_decoder(c: &Cfg) -> Result<Vec<MidBlockSpec>> {
    let mut encoder = autoencoder(c, None)?.remove(0);
    // Encoder(...) is built without these: its defaults, whatever the config holds.
    encoder.config["resnet_act_fn"] = json!("silu");
    encoder.config["resnet_groups"] = json!(32);
    encoder.config["add_attention"] = json!(true);
    let (_, last) = c.last_channels(&[64])?;
    let decoder = MidBlockSpec {
        block: MidBlockTemporalDecoder::BLOCK,
        config: json!({
            "num_layers": c.value("layers_per_block", json!(1)),
            "in_channels": last,
            "out_channels": last,
            "attention_head_dim": last,
        }),
        prefix: "decoder.mid_block",
    };
    Ok(vec![encoder, decoder])
}
