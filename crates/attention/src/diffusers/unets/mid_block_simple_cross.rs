//! diffusers' `UNetMidBlock2DSimpleCrossAttn` (`models/unets/unet_2d_blocks.py`, 0.42.1): the
//! mid block of `UNet2DConditionModel(mid_block_type="UNetMidBlock2DSimpleCrossAttn")`, used by
//! DeepFloyd IF (stages I and II), Kandinsky 2.1 / 2.2 and UnCLIP (Karlo).
//!
//! ```text
//! resnets.i    = ResnetBlock2D(in, in, temb_channels, eps=resnet_eps, groups=resnet_groups, dropout,
//!                              time_embedding_norm=resnet_time_scale_shift, non_linearity=resnet_act_fn,
//!                              output_scale_factor, pre_norm=resnet_pre_norm, skip_time_act)
//! attentions.i = Attention(query_dim=in, cross_attention_dim=in, heads=in // attention_head_dim,
//!                          dim_head=attention_head_dim, added_kv_proj_dim=cross_attention_dim,
//!                          norm_num_groups=resnet_groups, bias=True, upcast_softmax=True,
//!                          only_cross_attention, cross_attention_norm,
//!                          processor=AttnAddedKVProcessor2_0())      (AttnAddedKVProcessor before torch 2)
//! forward(h, temb, encoder_hidden_states, attention_mask, encoder_attention_mask):
//!   mask = attention_mask if attention_mask is not None
//!          else (None if encoder_hidden_states is None else encoder_attention_mask)
//!   h = resnets[0](h, temb)
//!   for attn, resnet in zip(attentions, resnets[1:]):
//!       h = attn(h, encoder_hidden_states=encoder_hidden_states, attention_mask=mask); h = resnet(h, temb)
//! ```
//!
//! The pieces are the crate's [`ResnetBlock2D`] and [`Attention`] (its added-key/value
//! processors); this module only wires them as diffusers does.

use crate::config::defaults;
use crate::cpu_kernels::MemoryFormat;
use crate::diffusers::attention::{Attention, AttentionConfig, CrossAttentionNorm, Processor};
use crate::diffusers::resnet::{ResnetBlock2D, ResnetBlock2DConfig};
use crate::diffusers::unets::mid_block::{mid_block_config, MidStack};
use crate::trace;
use crate::{Error, Result};
use candle_core::Tensor;
use candle_nn::VarBuilder;

mid_block_config! {
    /// Keyword arguments of `UNetMidBlock2DSimpleCrossAttn(in_channels, temb_channels, dropout=0.0,
    /// num_layers=1, resnet_eps=1e-6, resnet_time_scale_shift="default", resnet_act_fn="swish",
    /// resnet_groups=32, resnet_pre_norm=True, attention_head_dim=1, output_scale_factor=1.0,
    /// cross_attention_dim=1280, skip_time_act=False, only_cross_attention=False,
    /// cross_attention_norm=None)`, plus `processor` (not a constructor argument): the processor
    /// class the attentions run. `resnet_time_scale_shift` `"spatial"`/`"ada_group"` are not
    /// supported; `resnet_groups` is also the attentions' `norm_num_groups`.
    pub struct UNetMidBlock2DSimpleCrossAttnConfig {
        [
            pub in_channels: usize,
            /// `null`: the resnets have no `time_emb_proj` (diffusers accepts `None` there).
            pub temb_channels: Option<usize>,
        ]
        #[serde(default = "defaults::usize::<1>")]
        pub num_layers: usize = defaults::usize::<1>(),
        /// The per-head width; the attentions have `in_channels // attention_head_dim` heads.
        #[serde(default = "defaults::usize::<1>")]
        pub attention_head_dim: usize = defaults::usize::<1>(),
        /// The attentions' `added_kv_proj_dim`: the width of `encoder_hidden_states`.
        #[serde(default = "defaults::usize::<1280>")]
        pub cross_attention_dim: usize = defaults::usize::<1280>(),
        /// The resnets apply no activation to `temb` before `time_emb_proj`.
        #[serde(default)]
        pub skip_time_act: bool = false,
        /// The attentions attend to the projected context only (no `to_k`/`to_v`).
        #[serde(default)]
        pub only_cross_attention: bool = false,
        /// `null`, `"layer_norm"` (`LayerNorm(in_channels)`, so `cross_attention_dim` must equal
        /// `in_channels`) or `"group_norm"` (`GroupNorm(32, cross_attention_dim)`).
        #[serde(default)]
        pub cross_attention_norm: Option<CrossAttentionNorm> = None,
        /// `AttnAddedKVProcessor2_0` (absent: what diffusers picks under torch ≥ 2) or
        /// `AttnAddedKVProcessor` (torch < 2, or `set_attn_processor(AttnAddedKVProcessor())`).
        #[serde(default)]
        pub processor: Option<Processor> = None,
    }
    with [resnet]
}

/// `diffusers.models.unets.unet_2d_blocks.UNetMidBlock2DSimpleCrossAttn`.
#[derive(Debug, Clone)]
pub struct UNetMidBlock2DSimpleCrossAttn {
    layers: MidStack<ResnetBlock2D, Attention>,
}

impl UNetMidBlock2DSimpleCrossAttn {
    pub const BLOCK: &'static str = "diffusers.UNetMidBlock2DSimpleCrossAttn";

    /// The `Attention(...)` of each layer, as the constructor builds it.
    fn attention_config(cfg: &UNetMidBlock2DSimpleCrossAttnConfig, groups: usize) -> Result<AttentionConfig> {
        let block = Self::BLOCK;
        let (c, d) = (cfg.in_channels, cfg.attention_head_dim);
        if d == 0 {
            return Err(Error::config(block, "attention_head_dim must be positive"));
        }
        let heads = c / d;
        if heads == 0 {
            return Err(Error::config(
                block,
                format!("attention_head_dim {d} is larger than in_channels {c}: in_channels // attention_head_dim = 0 heads"),
            ));
        }
        let processor = cfg.processor.unwrap_or(Processor::AttnAddedKVProcessor2_0);
        if !matches!(
            processor,
            Processor::AttnAddedKVProcessor2_0 | Processor::AttnAddedKVProcessor
        ) {
            return Err(Error::unsupported(
                block,
                format!(
                    "processor {processor:?}: the block's attentions have added key/value projections and run \
                     AttnAddedKVProcessor2_0 or AttnAddedKVProcessor"
                ),
            ));
        }
        Ok(AttentionConfig {
            cross_attention_dim: Some(c),
            heads,
            dim_head: d,
            added_kv_proj_dim: Some(cfg.cross_attention_dim),
            norm_num_groups: Some(groups),
            bias: true,
            upcast_softmax: true,
            only_cross_attention: cfg.only_cross_attention,
            cross_attention_norm: cfg.cross_attention_norm,
            processor: Some(processor),
            ..AttentionConfig::new(c)
        })
    }

    pub fn new(vb: VarBuilder, cfg: &UNetMidBlock2DSimpleCrossAttnConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let block = Self::BLOCK;
        let c = cfg.in_channels;
        if c == 0 {
            return Err(Error::config(block, "in_channels must be greater than 0"));
        }
        let kwargs = cfg.resnet_kwargs();
        let groups = kwargs.groups(c);
        let resnet = ResnetBlock2DConfig {
            skip_time_act: cfg.skip_time_act,
            ..kwargs.resnet(block, (c, c), cfg.temb_channels, (groups, None))?
        };
        let attn = Self::attention_config(cfg, groups)?;
        let vb_res = vb.pp("resnets");
        let vb_attn = vb.pp("attentions");
        let mut resnets = vec![ResnetBlock2D::new(vb_res.pp(0), &resnet)?];
        let mut attentions = vec![];
        for i in 0..cfg.num_layers {
            attentions.push(Attention::new(vb_attn.pp(i), &attn)?);
            resnets.push(ResnetBlock2D::new(vb_res.pp(i + 1), &resnet)?);
        }
        Ok(Self {
            layers: MidStack::new(resnets, attentions),
        })
    }

    /// The processor the attentions run.
    pub fn processor(&self) -> Option<Processor> {
        self.layers.attentions().first().map(Attention::processor)
    }

    /// `forward(hidden_states, temb=None, encoder_hidden_states=None, attention_mask=None,
    /// cross_attention_kwargs=None, encoder_attention_mask=None)`: `hidden_states`
    /// `(B, in_channels, H, W)`, `temb` `(B, temb_channels)`, `encoder_hidden_states`
    /// `(B, S, cross_attention_dim)`. The mask the attentions get is `attention_mask`, or (only
    /// with `encoder_hidden_states`) `encoder_attention_mask`, as in diffusers (UnCLIP passes its
    /// cross-attention mask as `attention_mask`); an additive float or boolean mask as
    /// [`Attention::forward`] takes it, padded by diffusers' `prepare_attention_mask` to the
    /// `S + H·W` keys.
    pub fn forward(
        &self,
        hidden_states: &Tensor,
        temb: Option<&Tensor>,
        encoder_hidden_states: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
        encoder_attention_mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "hidden_states", hidden_states, &[])?;
        crate::validate::optional(Self::BLOCK, "temb", temb, &[])?;
        crate::validate::optional(Self::BLOCK, "encoder_hidden_states", encoder_hidden_states, &[])?;
        crate::validate::optional_shape(Self::BLOCK, "attention_mask", attention_mask)?;
        crate::validate::optional_shape(Self::BLOCK, "encoder_attention_mask", encoder_attention_mask)?;
        let mask = match attention_mask {
            Some(m) => Some(m),
            None => encoder_hidden_states.and(encoder_attention_mask),
        };
        // After an attention PyTorch's tensor is channels_last (`AttnAddedKVProcessor`'s
        // `transpose(-1, -2).reshape(residual.shape) + residual`): the resnets after it take the
        // channels_last GroupNorm kernel.
        let layout = std::cell::Cell::new(MemoryFormat::Contiguous);
        let h = self.layers.forward(
            hidden_states,
            |resnet, h| resnet.forward_as(h, temb, layout.get()),
            |attn, h| {
                layout.set(MemoryFormat::of_attention_output(h.dims()));
                attn.forward(h, encoder_hidden_states, mask)
            },
        )?;
        trace::record("output", &h);
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::from_json;
    use candle_core::{DType, Device};
    use serde_json::json;
    use std::collections::HashMap;

    fn cfg(value: serde_json::Value) -> UNetMidBlock2DSimpleCrossAttnConfig {
        from_json(UNetMidBlock2DSimpleCrossAttn::BLOCK, &value).unwrap()
    }

    fn err(value: serde_json::Value) -> String {
        let vb = VarBuilder::from_tensors(HashMap::new(), DType::F32, &Device::Cpu);
        UNetMidBlock2DSimpleCrossAttn::new(vb, &cfg(value))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn new_gives_the_diffusers_defaults() {
        let built = UNetMidBlock2DSimpleCrossAttnConfig::new(64, Some(128));
        let parsed = cfg(json!({"in_channels": 64, "temb_channels": 128}));
        assert_eq!(format!("{built:?}"), format!("{parsed:?}"));
        assert_eq!(built.attention_head_dim, 1);
        assert_eq!(built.cross_attention_dim, 1280);
        assert_eq!(built.resnet_groups, Some(32));
        assert!(!built.skip_time_act && !built.only_cross_attention);
        assert!(built.cross_attention_norm.is_none() && built.processor.is_none());
    }

    #[test]
    fn unknown_keys_and_unsupported_options_are_named() {
        let e = from_json::<UNetMidBlock2DSimpleCrossAttnConfig>(
            UNetMidBlock2DSimpleCrossAttn::BLOCK,
            &json!({"in_channels": 8, "temb_channels": 8, "dual_cross_attention": true}),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("dual_cross_attention"), "{e}");
        let e = from_json::<UNetMidBlock2DSimpleCrossAttnConfig>(
            UNetMidBlock2DSimpleCrossAttn::BLOCK,
            &json!({"in_channels": 8, "temb_channels": 8, "cross_attention_norm": "rms_norm"}),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("rms_norm"), "{e}");
        let e = err(json!({"in_channels": 8, "temb_channels": 8, "resnet_time_scale_shift": "spatial"}));
        assert!(
            e.contains("resnet_time_scale_shift") && e.contains("diffusers refuses"),
            "{e}"
        );
        let e = err(json!({"in_channels": 8, "temb_channels": 8, "processor": "AttnProcessor2_0"}));
        assert!(e.contains("not supported") && e.contains("AttnProcessor2_0"), "{e}");
        let e = err(json!({"in_channels": 8, "temb_channels": 8, "attention_head_dim": 16}));
        assert!(e.contains("attention_head_dim 16") && e.contains("0 heads"), "{e}");
        let e = err(json!({"in_channels": 8, "temb_channels": 8, "attention_head_dim": 0}));
        assert!(e.contains("attention_head_dim"), "{e}");
    }

    #[test]
    fn missing_weights_name_the_key() {
        let e = err(json!({"in_channels": 8, "temb_channels": 8, "resnet_groups": 2,
                           "attention_head_dim": 4, "cross_attention_dim": 6}));
        assert!(e.contains("resnets.0"), "{e}");
    }
}
