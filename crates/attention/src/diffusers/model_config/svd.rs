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

use super::autoencoder::autoencoder;
use super::{Cfg, MidBlockSpec};
use crate::diffusers::unets::mid_block_spatio_temporal::{MidBlockTemporalDecoder, UNetMidBlockSpatioTemporal};
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

#[cfg(test)]
mod tests {
    use super::super::{mid_blocks, MidBlockSpec};
    use serde_json::{json, Value};

    fn specs(config: Value) -> Vec<MidBlockSpec> {
        mid_blocks(&config, None, false).unwrap()
    }

    #[test]
    fn svd_configs_give_the_mid_blocks() {
        // stabilityai/stable-video-diffusion-img2vid unet/config.json
        let unet = json!({"_class_name": "UNetSpatioTemporalConditionModel", "_diffusers_version": "0.24.0.dev0",
            "addition_time_embed_dim": 256, "block_out_channels": [320, 640, 1280, 1280], "cross_attention_dim": 1024,
            "down_block_types": ["CrossAttnDownBlockSpatioTemporal", "CrossAttnDownBlockSpatioTemporal",
                "CrossAttnDownBlockSpatioTemporal", "DownBlockSpatioTemporal"], "in_channels": 8, "layers_per_block": 2,
            "num_attention_heads": [5, 10, 20, 20], "num_frames": 14, "out_channels": 4,
            "projection_class_embeddings_input_dim": 768, "sample_size": 96, "transformer_layers_per_block": 1,
            "up_block_types": ["UpBlockSpatioTemporal", "CrossAttnUpBlockSpatioTemporal",
                "CrossAttnUpBlockSpatioTemporal", "CrossAttnUpBlockSpatioTemporal"]});
        let s = specs(unet.clone());
        assert_eq!(
            (s.len(), s[0].block, s[0].prefix),
            (1, "diffusers.UNetMidBlockSpatioTemporal", "mid_block")
        );
        assert_eq!(
            s[0].config,
            json!({"in_channels": 1280, "temb_channels": 1280, "transformer_layers_per_block": 1,
                "cross_attention_dim": 1024, "num_attention_heads": 20})
        );
        let cfg: crate::diffusers::UNetMidBlockSpatioTemporalConfig =
            crate::config::from_json("test", &s[0].config).unwrap();
        assert_eq!(cfg.num_attention_heads, 20);
        // the defaults (an empty config) are SVD's, per-block lists take their last entry
        let s =
            specs(json!({"_class_name": "UNetSpatioTemporalConditionModel", "cross_attention_dim": [8, 16, 24, 32]}));
        assert_eq!(s[0].config["num_attention_heads"], 20);
        assert_eq!(s[0].config["cross_attention_dim"], 32);
        let mut bad = unet;
        bad["attention_head_dim"] = json!(64);
        let e = mid_blocks(&bad, None, false).unwrap_err().to_string();
        assert!(e.contains("attention_head_dim"), "{e}");
        // stabilityai/stable-video-diffusion-img2vid vae/config.json
        let vae = json!({"_class_name": "AutoencoderKLTemporalDecoder", "_diffusers_version": "0.24.0.dev0",
            "block_out_channels": [128, 256, 512, 512], "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D",
                "DownEncoderBlock2D", "DownEncoderBlock2D"], "force_upcast": true, "in_channels": 3, "latent_channels": 4,
            "layers_per_block": 2, "out_channels": 3, "sample_size": 768, "scaling_factor": 0.18215});
        let s = specs(vae.clone());
        assert_eq!(s.len(), 2);
        assert_eq!(
            (s[0].block, s[0].prefix),
            ("diffusers.UNetMidBlock2D", "encoder.mid_block")
        );
        assert_eq!(
            s[0].config,
            json!({"in_channels": 512, "resnet_eps": 1e-6, "resnet_act_fn": "silu", "output_scale_factor": 1,
                "resnet_time_scale_shift": "default", "attention_head_dim": 512, "resnet_groups": 32,
                "temb_channels": null, "add_attention": true})
        );
        assert_eq!(
            (s[1].block, s[1].prefix),
            ("diffusers.MidBlockTemporalDecoder", "decoder.mid_block")
        );
        assert_eq!(
            s[1].config,
            json!({"num_layers": 2, "in_channels": 512, "out_channels": 512, "attention_head_dim": 512})
        );
        // keys of AutoencoderKL that this class does not take: refused, and ignored when allowed
        let mut other = vae;
        other["norm_num_groups"] = json!(16);
        other["act_fn"] = json!("gelu");
        let e = mid_blocks(&other, None, false).unwrap_err().to_string();
        assert!(
            e.contains("norm_num_groups") && e.contains("AutoencoderKLTemporalDecoder"),
            "{e}"
        );
        let s = mid_blocks(&other, None, true).unwrap();
        assert_eq!(
            (&s[0].config["resnet_groups"], &s[0].config["resnet_act_fn"]),
            (&json!(32), &json!("silu"))
        );
    }
}
