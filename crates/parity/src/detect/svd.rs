//! Stable Video Diffusion's mid blocks in a checkpoint: `SpatioTemporalResBlock`s
//! (`resnets.<i>.spatial_res_block`, `temporal_res_block`, `time_mixer.mix_factor`) with either
//! `TransformerSpatioTemporalModel` attentions and a time embedding (`UNetMidBlockSpatioTemporal`,
//! `UNetSpatioTemporalConditionModel`) or one VAE-style attention and none
//! (`MidBlockTemporalDecoder`, `AutoencoderKLTemporalDecoder`'s decoder).

use super::{count, dim, has, Found};
use serde_json::{json, Map};
use unet_attention::diffusers::{MidBlockTemporalDecoder, UNetMidBlockSpatioTemporal};

/// The anchor key of a `SpatioTemporalResBlock` stack.
pub(super) const ANCHOR: &str = "resnets.0.spatial_res_block.conv1.weight";

/// Whether the prefix `p` (found by [`ANCHOR`]) is a mid block: `…mid_block.`, or a bare
/// mid-block state dict at the top level (no down/upsamplers, which the SVD down/up blocks have).
pub(super) fn is_mid(ck: &crate::checkpoint::Checkpoint, p: &str) -> bool {
    p.ends_with("mid_block.")
        || (p.is_empty()
            && !ck
                .names()
                .any(|k| k.starts_with("downsamplers.") || k.starts_with("upsamplers.")))
}

pub(super) fn spatio_temporal(ck: &crate::checkpoint::Checkpoint, p: &str) -> Found {
    let r0 = format!("{p}resnets.0.spatial_res_block.");
    let c_in = dim(ck, &format!("{r0}conv1.weight"), 1).unwrap_or(0);
    let c_out = dim(ck, &format!("{r0}conv1.weight"), 0).unwrap_or(0);
    let temb = dim(ck, &format!("{r0}time_emb_proj.weight"), 1);
    let mut config = Map::new();
    if has(
        ck,
        &format!("{p}attentions.0.temporal_transformer_blocks.0.norm_in.weight"),
    ) {
        let layers = count(ck, &format!("{p}attentions."));
        let per_layer: Vec<usize> = (0..layers)
            .map(|i| count(ck, &format!("{p}attentions.{i}.transformer_blocks.")))
            .collect();
        config.insert("in_channels".into(), json!(c_in));
        config.insert("temb_channels".into(), json!(temb));
        config.insert("num_layers".into(), json!(layers));
        match per_layer.as_slice() {
            [first, rest @ ..] if rest.iter().all(|n| n == first) => {
                config.insert("transformer_layers_per_block".into(), json!(first))
            }
            _ => config.insert("transformer_layers_per_block".into(), json!(per_layer)),
        };
        let attn2 = format!("{p}attentions.0.transformer_blocks.0.attn2.to_k.weight");
        config.insert("cross_attention_dim".into(), json!(dim(ck, &attn2, 1)));
        return Found {
            prefix: p.to_string(),
            block: Some(UNetMidBlockSpatioTemporal::BLOCK),
            variant: "diffusers UNetMidBlockSpatioTemporal (UNetSpatioTemporalConditionModel, Stable Video Diffusion: \
                      spatio-temporal ResNets and transformers over num_frames)"
                .to_string(),
            config,
            unknown: vec!["num_attention_heads (the config's `num_attention_heads`, last entry; SVD: 20)".to_string()],
            from_config: None,
        };
    }
    config.insert("in_channels".into(), json!(c_in));
    config.insert("out_channels".into(), json!(c_out));
    config.insert("num_layers".into(), json!(count(ck, &format!("{p}resnets."))));
    Found {
        prefix: p.to_string(),
        block: Some(MidBlockTemporalDecoder::BLOCK),
        variant: "diffusers MidBlockTemporalDecoder (AutoencoderKLTemporalDecoder's decoder, Stable Video Diffusion's \
                  VAE: spatio-temporal ResNets without a time embedding, one attention)"
            .to_string(),
        config,
        unknown: vec![
            "attention_head_dim (AutoencoderKLTemporalDecoder: block_out_channels[-1], one head)".to_string(),
            "upcast_attention (AutoencoderKLTemporalDecoder: false)".to_string(),
        ],
        from_config: None,
    }
}
