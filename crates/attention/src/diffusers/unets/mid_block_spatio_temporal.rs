//! Stable Video Diffusion's mid blocks, diffusers 0.42.1 (`models/unets/unet_3d_blocks.py`):
//!
//! * [`UNetMidBlockSpatioTemporal`], the mid block of `UNetSpatioTemporalConditionModel`:
//!   `resnets.0`, then per layer `attentions.i` ([`TransformerSpatioTemporalModel`] with
//!   `num_attention_heads` heads of `in_channels // num_attention_heads`) and `resnets.i+1`
//!   ([`SpatioTemporalResBlock`]s with eps 1e-5 and the `learned_with_images` mixer).
//! * [`MidBlockTemporalDecoder`], the mid block of `AutoencoderKLTemporalDecoder`'s decoder:
//!   `resnets.0`, then `zip(resnets[1:], attentions)`: `attentions.0` (a VAE-style `Attention`:
//!   GroupNorm(32, eps 1e-6), `in_channels // attention_head_dim` heads, biases, the residual
//!   inside) and `resnets.1`. The resnets are `SpatioTemporalResBlock(temb_channels=None,
//!   eps=1e-6, temporal_eps=1e-5, merge_strategy="learned", switch_spatial_to_temporal_mix=True)`.
//!   There is one attention whatever `num_layers` is, so `resnets.2`... are built (their keys
//!   are loaded) and never run, as in diffusers; with `num_layers=1` no attention runs.
//!
//! Both take `hidden_states` `(B·F, C, H, W)` and `image_only_indicator` `(B, F)`: the frame
//! count is its last dim, as in diffusers (the U-Net and the decoder pass zeros; 1 marks a frame
//! as an image, which the U-Net's `learned_with_images` mixers then take from the spatial path).

use crate::config::defaults;
use crate::cpu_kernels::MemoryFormat;
use crate::diffusers::attention::{Attention, AttentionConfig};
use crate::diffusers::spatio_temporal::{MergeStrategy, SpatioTemporalResBlock, SpatioTemporalResBlockSpec};
use crate::diffusers::transformers::transformer_spatio_temporal::{
    TransformerSpatioTemporalModel, TransformerSpatioTemporalModelConfig,
};
use crate::diffusers::unets::mid_block::{LayersPerBlock, MidStack};
use crate::trace;
use crate::{Error, Result};
use candle_core::Tensor;
use candle_nn::VarBuilder;
use serde::Deserialize;

/// Keyword arguments of `UNetMidBlockSpatioTemporal(in_channels, temb_channels, num_layers=1,
/// transformer_layers_per_block=1, num_attention_heads=1, cross_attention_dim=1280)`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct UNetMidBlockSpatioTemporalConfig {
    pub in_channels: usize,
    /// `null`: the resnets have no `time_emb_proj` and ignore `temb`.
    pub temb_channels: Option<usize>,
    #[serde(default = "defaults::usize::<1>")]
    pub num_layers: usize,
    #[serde(default)]
    pub transformer_layers_per_block: LayersPerBlock,
    /// The number of heads (of width `in_channels // num_attention_heads`).
    #[serde(default = "defaults::usize::<1>")]
    pub num_attention_heads: usize,
    #[serde(default = "defaults::usize::<1280>")]
    pub cross_attention_dim: usize,
}

impl UNetMidBlockSpatioTemporalConfig {
    /// `UNetMidBlockSpatioTemporal(in_channels, temb_channels)` with diffusers' defaults.
    pub fn new(in_channels: usize, temb_channels: Option<usize>) -> Self {
        Self {
            in_channels,
            temb_channels,
            num_layers: defaults::usize::<1>(),
            transformer_layers_per_block: LayersPerBlock::default(),
            num_attention_heads: defaults::usize::<1>(),
            cross_attention_dim: defaults::usize::<1280>(),
        }
    }
}

/// `diffusers.models.unets.unet_3d_blocks.UNetMidBlockSpatioTemporal`.
#[derive(Debug, Clone)]
pub struct UNetMidBlockSpatioTemporal {
    layers: MidStack<SpatioTemporalResBlock, TransformerSpatioTemporalModel>,
}

impl UNetMidBlockSpatioTemporal {
    pub const BLOCK: &'static str = "diffusers.UNetMidBlockSpatioTemporal";

    pub fn new(vb: VarBuilder, cfg: &UNetMidBlockSpatioTemporalConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let block = Self::BLOCK;
        let c = cfg.in_channels;
        let heads = cfg.num_attention_heads;
        let head_dim = c.checked_div(heads).unwrap_or(0);
        if head_dim == 0 {
            return Err(Error::config(
                block,
                format!("num_attention_heads {heads} gives heads of width in_channels // it = 0 at {c} channels"),
            ));
        }
        let layers = match &cfg.transformer_layers_per_block {
            LayersPerBlock::One(n) => vec![*n; cfg.num_layers],
            LayersPerBlock::PerLayer(list) if list.len() >= cfg.num_layers => list.clone(),
            LayersPerBlock::PerLayer(list) => {
                return Err(Error::config(
                    block,
                    format!(
                    "transformer_layers_per_block has {} entries for num_layers {} (diffusers indexes it per layer)",
                    list.len(),
                    cfg.num_layers
                ),
                ))
            }
        };
        let resnet = SpatioTemporalResBlockSpec {
            in_channels: c,
            out_channels: c,
            temb_channels: cfg.temb_channels,
            eps: 1e-5,
            temporal_eps: 1e-5,
            merge_strategy: MergeStrategy::LearnedWithImages,
            switch_spatial_to_temporal_mix: false,
        };
        let vb_res = vb.pp("resnets");
        let mut resnets = vec![SpatioTemporalResBlock::new(vb_res.pp(0), &resnet)?];
        let mut attentions = vec![];
        for (i, n) in layers.iter().take(cfg.num_layers).enumerate() {
            let tcfg = TransformerSpatioTemporalModelConfig {
                num_attention_heads: heads,
                attention_head_dim: head_dim,
                in_channels: Some(c),
                num_layers: *n,
                cross_attention_dim: Some(cfg.cross_attention_dim),
                ..TransformerSpatioTemporalModelConfig::default()
            };
            attentions.push(TransformerSpatioTemporalModel::new(vb.pp("attentions").pp(i), &tcfg)?);
            resnets.push(SpatioTemporalResBlock::new(vb_res.pp(i + 1), &resnet)?);
        }
        Ok(Self {
            layers: MidStack::new(resnets, attentions),
        })
    }

    /// `forward(hidden_states, temb=None, encoder_hidden_states=None, image_only_indicator=None)`:
    /// `hidden_states` `(B·F, C, H, W)`, `temb` `(B·F, temb_channels)`, `encoder_hidden_states`
    /// `(B·F, S, cross_attention_dim)` (required with one layer or more: the temporal blocks take
    /// their context from it), `image_only_indicator` `(B, F)` (required: diffusers reads the frame
    /// count from it).
    pub fn forward(
        &self,
        hidden_states: &Tensor,
        temb: Option<&Tensor>,
        encoder_hidden_states: Option<&Tensor>,
        image_only_indicator: Option<&Tensor>,
    ) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "hidden_states", hidden_states, &[])?;
        crate::validate::optional(Self::BLOCK, "temb", temb, &[])?;
        crate::validate::optional(Self::BLOCK, "encoder_hidden_states", encoder_hidden_states, &[])?;
        crate::validate::optional_shape(Self::BLOCK, "image_only_indicator", image_only_indicator)?;
        let ioi = required_indicator(Self::BLOCK, image_only_indicator)?;
        let h = self.layers.forward(
            hidden_states,
            |resnet, h| resnet.forward(h, temb, ioi),
            |attn, h| attn.forward(h, encoder_hidden_states, ioi),
        )?;
        trace::record("output", &h);
        Ok(h)
    }
}

fn required_indicator<'a>(block: &'static str, ioi: Option<&'a Tensor>) -> Result<&'a Tensor> {
    ioi.ok_or_else(|| {
        Error::input(
            block,
            "image_only_indicator",
            "required: (batch, num_frames), the frame count is its last dim (the pipelines pass zeros)",
        )
    })
}

/// Keyword arguments of `MidBlockTemporalDecoder(in_channels, out_channels,
/// attention_head_dim=512, num_layers=1, upcast_attention=False)`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct MidBlockTemporalDecoderConfig {
    pub in_channels: usize,
    pub out_channels: usize,
    #[serde(default = "defaults::usize::<512>")]
    pub attention_head_dim: usize,
    #[serde(default = "defaults::usize::<1>")]
    pub num_layers: usize,
    #[serde(default)]
    pub upcast_attention: bool,
}

/// `diffusers.models.unets.unet_3d_blocks.MidBlockTemporalDecoder`.
#[derive(Debug, Clone)]
pub struct MidBlockTemporalDecoder {
    resnets: Vec<SpatioTemporalResBlock>,
    attention: Attention,
}

impl MidBlockTemporalDecoder {
    pub const BLOCK: &'static str = "diffusers.MidBlockTemporalDecoder";

    pub fn new(vb: VarBuilder, cfg: &MidBlockTemporalDecoderConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let block = Self::BLOCK;
        let (c_in, c_out) = (cfg.in_channels, cfg.out_channels);
        if cfg.num_layers == 0 {
            return Err(Error::config(
                block,
                "num_layers 0: diffusers' forward runs resnets[0], which then does not exist",
            ));
        }
        if cfg.num_layers >= 2 && c_in != c_out {
            return Err(Error::config(
                block,
                format!(
                    "in_channels {c_in} != out_channels {c_out} with num_layers {}: the attention (query_dim=in_channels) \
                     runs on resnets[0]'s out_channels output, which PyTorch refuses",
                    cfg.num_layers
                ),
            ));
        }
        let heads = c_in.checked_div(cfg.attention_head_dim).unwrap_or(0);
        if heads == 0 {
            return Err(Error::config(
                block,
                format!(
                    "attention_head_dim {} gives in_channels // it = 0 heads at {c_in} channels",
                    cfg.attention_head_dim
                ),
            ));
        }
        let resnets = (0..cfg.num_layers)
            .map(|i| {
                let spec = SpatioTemporalResBlockSpec {
                    in_channels: if i == 0 { c_in } else { c_out },
                    out_channels: c_out,
                    temb_channels: None,
                    eps: 1e-6,
                    temporal_eps: 1e-5,
                    merge_strategy: MergeStrategy::Learned,
                    switch_spatial_to_temporal_mix: true,
                };
                SpatioTemporalResBlock::new(vb.pp("resnets").pp(i), &spec)
            })
            .collect::<Result<Vec<_>>>()?;
        // Attention(query_dim=in_channels, heads=in_channels // attention_head_dim, dim_head=attention_head_dim,
        //           eps=1e-6, upcast_attention, norm_num_groups=32, bias=True, residual_connection=True)
        let attn = AttentionConfig {
            heads,
            dim_head: cfg.attention_head_dim,
            eps: 1e-6,
            upcast_attention: cfg.upcast_attention,
            norm_num_groups: Some(32),
            bias: true,
            residual_connection: true,
            ..AttentionConfig::new(c_in)
        };
        Ok(Self {
            resnets,
            attention: Attention::new(vb.pp("attentions").pp(0), &attn)?,
        })
    }

    /// `forward(hidden_states, image_only_indicator)`: `hidden_states` `(B·F, in_channels, H, W)`,
    /// `image_only_indicator` `(B, F)` (its values do not matter to the `learned` mixers; its
    /// shape gives the frame count).
    pub fn forward(&self, hidden_states: &Tensor, image_only_indicator: Option<&Tensor>) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "hidden_states", hidden_states, &[])?;
        crate::validate::optional_shape(Self::BLOCK, "image_only_indicator", image_only_indicator)?;
        let ioi = required_indicator(Self::BLOCK, image_only_indicator)?;
        let mut h = trace::scope("resnets.0", || self.resnets[0].forward(hidden_states, None, ioi))?;
        if let Some(resnet) = self.resnets.get(1) {
            // The attention returns a channels_last tensor in PyTorch: `resnets.1` then takes
            // the channels_last GroupNorm kernels.
            let format = MemoryFormat::of_attention_output(h.dims());
            h = trace::scope("attentions.0", || self.attention.forward(&h, None, None))?;
            h = trace::scope("resnets.1", || resnet.forward_as(&h, None, ioi, format))?;
        }
        trace::record("output", &h);
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config;
    use candle_core::{DType, Device};
    use serde_json::json;

    fn unet(cfg: serde_json::Value) -> Result<UNetMidBlockSpatioTemporal> {
        let cfg: UNetMidBlockSpatioTemporalConfig = config::from_json("test", &cfg)?;
        UNetMidBlockSpatioTemporal::new(VarBuilder::zeros(DType::F32, &Device::Cpu), &cfg)
    }

    fn decoder(cfg: serde_json::Value) -> Result<MidBlockTemporalDecoder> {
        let cfg: MidBlockTemporalDecoderConfig = config::from_json("test", &cfg)?;
        MidBlockTemporalDecoder::new(VarBuilder::zeros(DType::F32, &Device::Cpu), &cfg)
    }

    #[test]
    fn svd_configs_take_diffusers_defaults_and_refuse_unknown_keys() {
        let cfg = UNetMidBlockSpatioTemporalConfig::new(320, Some(1280));
        assert_eq!(
            (cfg.num_layers, cfg.num_attention_heads, cfg.cross_attention_dim),
            (1, 1, 1280)
        );
        assert!(matches!(cfg.transformer_layers_per_block, LayersPerBlock::One(1)));
        let cfg: MidBlockTemporalDecoderConfig =
            config::from_json("test", &json!({"in_channels": 512, "out_channels": 512})).unwrap();
        assert_eq!(
            (cfg.attention_head_dim, cfg.num_layers, cfg.upcast_attention),
            (512, 1, false)
        );
        // resnet_eps is fixed inside diffusers' constructors, not an argument
        let e = unet(json!({"in_channels": 32, "temb_channels": 8, "resnet_eps": 1e-6}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("resnet_eps"), "{e}");
        let e = decoder(json!({"in_channels": 32, "out_channels": 32, "merge_strategy": "fixed"}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("merge_strategy"), "{e}");
    }

    #[test]
    fn svd_mid_blocks_refuse_what_diffusers_cannot_build_or_run() {
        let e = unet(json!({"in_channels": 32, "temb_channels": 8, "num_attention_heads": 64}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("num_attention_heads 64"), "{e}");
        let e =
            unet(json!({"in_channels": 32, "temb_channels": 8, "num_layers": 2, "transformer_layers_per_block": [1]}))
                .unwrap_err()
                .to_string();
        assert!(e.contains("transformer_layers_per_block"), "{e}");
        let e = decoder(json!({"in_channels": 32, "out_channels": 64, "num_layers": 2, "attention_head_dim": 32}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("in_channels 32 != out_channels 64"), "{e}");
        let e = decoder(json!({"in_channels": 32, "out_channels": 32}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("attention_head_dim 512"), "{e}");
        let e = decoder(json!({"in_channels": 32, "out_channels": 32, "num_layers": 0, "attention_head_dim": 32}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("num_layers 0"), "{e}");
        // in != out runs with one layer (resnets.0 only; the attention is built and never run)
        assert!(decoder(json!({"in_channels": 32, "out_channels": 64, "attention_head_dim": 32})).is_ok());
    }

    /// diffusers reads the frame count from `image_only_indicator`: without it, or with a batch
    /// it does not divide into, the blocks say so.
    #[test]
    fn svd_mid_blocks_need_image_only_indicator() {
        let dev = Device::Cpu;
        let x = Tensor::zeros((4, 32, 2, 3), DType::F32, &dev).unwrap();
        let temb = Tensor::zeros((4, 8), DType::F32, &dev).unwrap();
        let ctx = Tensor::zeros((4, 3, 16), DType::F32, &dev).unwrap();
        let u =
            unet(json!({"in_channels": 32, "temb_channels": 8, "num_attention_heads": 2, "cross_attention_dim": 16}))
                .unwrap();
        let d =
            decoder(json!({"in_channels": 32, "out_channels": 32, "num_layers": 2, "attention_head_dim": 32})).unwrap();
        let e = u.forward(&x, Some(&temb), Some(&ctx), None).unwrap_err().to_string();
        assert!(e.contains("image_only_indicator"), "{e}");
        let e = d.forward(&x, None).unwrap_err().to_string();
        assert!(e.contains("image_only_indicator"), "{e}");
        let three = Tensor::zeros((1, 3), DType::F32, &dev).unwrap();
        let e = u
            .forward(&x, Some(&temb), Some(&ctx), Some(&three))
            .unwrap_err()
            .to_string();
        assert!(e.contains("image_only_indicator") && e.contains("[1, 3]"), "{e}");
        let e = d.forward(&x, Some(&three)).unwrap_err().to_string();
        assert!(e.contains("image_only_indicator"), "{e}");
        // the transformer's context is required (diffusers takes the temporal context from it)
        let two = Tensor::zeros((2, 2), DType::F32, &dev).unwrap();
        let e = u.forward(&x, Some(&temb), None, Some(&two)).unwrap_err().to_string();
        assert!(e.contains("encoder_hidden_states"), "{e}");
        assert_eq!(
            u.forward(&x, Some(&temb), Some(&ctx), Some(&two)).unwrap().dims(),
            x.dims()
        );
        assert_eq!(d.forward(&x, Some(&two)).unwrap().dims(), x.dims());
    }
}
