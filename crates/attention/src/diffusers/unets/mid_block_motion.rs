//! diffusers' `UNetMidBlockCrossAttnMotion` (`models/unets/unet_motion_model.py`, 0.42.1): the
//! mid block of AnimateDiff's `UNetMotionModel`. A `UNetMidBlock2DCrossAttn` (resnets and
//! `Transformer2DModel`s) with a motion module after each transformer: an
//! `AnimateDiffTransformer3D`, attention over the frames of each pixel with a sinusoidal
//! positional embedding; `hidden_states` is `(batch·num_frames, C, H, W)`.
//!
//! ```text
//! forward(h, temb, encoder_hidden_states, attention_mask, cross_attention_kwargs, encoder_attention_mask, num_frames):
//!   h = resnets[0](h, temb)
//!   for attn, resnet, motion_module in zip(attentions, resnets[1:], motion_modules):
//!     h = attn(h, encoder_hidden_states, attention_mask=attention_mask, encoder_attention_mask=encoder_attention_mask)
//!     h = motion_module(h, None, None, None, num_frames, None)   # no context
//!     h = resnet(h, temb)
//! ```
//!
//! `AnimateDiffTransformer3D` has `TransformerTemporalModel`'s constructor and forward line for
//! line (GroupNorm over `(B, C, F, H, W)`, `proj_in`, `BasicTransformerBlock`s over `(B·H·W, F,
//! inner)` tokens, `proj_out`, residual), so it runs as a [`TransformerTemporalModel`], built as
//! the mid block builds it: `temporal_num_attention_heads` heads of width `in_channels //
//! temporal_num_attention_heads`, `temporal_transformer_layers_per_block` blocks,
//! `double_self_attention` (both attentions self-attention: `temporal_cross_attention_dim` is
//! taken and reaches no weight, and the block passes no context), `positional_embeddings=
//! "sinusoidal"` with `num_positional_embeddings=temporal_max_seq_length` (the `pos_embed.pe`
//! table is a persistent buffer read from the checkpoint; see
//! [`crate::diffusers::embeddings`]), GroupNorm `resnet_groups`, no attention bias, `geglu`.
//!
//! As in diffusers: `num_attention_heads` is the spatial transformers' head *count* (width
//! `in_channels // num_attention_heads`); `cross_attention_kwargs` only reach the processors and
//! with the default ones change nothing, so this forward does not take them. Not supported:
//! `dual_cross_attention=True`, whose forward passes `encoder_attention_mask` to
//! `DualTransformer2DModel.forward`, which has no such parameter (a `TypeError` on every call;
//! `UNetMotionModel` always passes `False`).

use crate::config::defaults;
use crate::diffusers::feed_forward::ActivationFn;
use crate::diffusers::resnet::ResnetBlock2D;
use crate::diffusers::transformers::temporal::{TransformerTemporalModel, TransformerTemporalModelConfig};
use crate::diffusers::transformers::transformer::Transformer2DModel;
use crate::diffusers::unets::mid_block::{mid_block_config, LayersPerBlock, MidStack, Step};
use crate::trace;
use crate::{Error, Result};
use candle_core::Tensor;
use candle_nn::VarBuilder;

mid_block_config! {
    /// Keyword arguments of `UNetMidBlockCrossAttnMotion(in_channels, temb_channels, dropout=0.0,
    /// num_layers=1, transformer_layers_per_block=1, resnet_eps=1e-6, resnet_time_scale_shift="default",
    /// resnet_act_fn="swish", resnet_groups=32, resnet_pre_norm=True, num_attention_heads=1,
    /// output_scale_factor=1.0, cross_attention_dim=1280, dual_cross_attention=False,
    /// use_linear_projection=False, upcast_attention=False, attention_type="default",
    /// temporal_num_attention_heads=1, temporal_cross_attention_dim=None, temporal_max_seq_length=32,
    /// temporal_transformer_layers_per_block=1)`. `transformer_layers_per_block` lists exactly
    /// `num_layers` counts, as diffusers checks; `dual_cross_attention` is not supported (see the
    /// module docs); `resnet_groups` `null` is `min(in_channels // 4, 32)` for the transformers and
    /// motion modules too.
    pub struct UNetMidBlockCrossAttnMotionConfig {
        [
            pub in_channels: usize,
            pub temb_channels: Option<usize>,
        ]
        #[serde(default = "defaults::usize::<1>")]
        pub num_layers: usize = defaults::usize::<1>(),
        /// The motion modules' head count.
        #[serde(default = "defaults::usize::<1>")]
        pub temporal_num_attention_heads: usize = defaults::usize::<1>(),
        /// Taken and unused, as in diffusers (see the module docs).
        #[serde(default)]
        pub temporal_cross_attention_dim: Option<usize> = None,
        /// The sinusoidal table's length: the most frames the motion modules take.
        #[serde(default = "defaults::usize::<32>")]
        pub temporal_max_seq_length: usize = defaults::usize::<32>(),
        /// One count, or one per layer (exactly `num_layers`).
        #[serde(default)]
        pub temporal_transformer_layers_per_block: LayersPerBlock = LayersPerBlock::default(),
    }
    with [resnet, transformer]
}

/// A per-layer count list as diffusers' constructor makes it: an int repeated, or a list of
/// exactly `num_layers` entries (a `ValueError` otherwise).
fn per_layer(key: &str, v: &LayersPerBlock, num_layers: usize) -> Result<Vec<usize>> {
    match v {
        LayersPerBlock::One(n) => Ok(vec![*n; num_layers]),
        LayersPerBlock::PerLayer(list) if list.len() == num_layers => Ok(list.clone()),
        LayersPerBlock::PerLayer(list) => Err(Error::config(
            UNetMidBlockCrossAttnMotion::BLOCK,
            format!(
                "{key} lists {} counts for num_layers {num_layers} (diffusers raises ValueError)",
                list.len()
            ),
        )),
    }
}

/// `in_channels // heads` as Python computes it; zero heads or a zero width is an error.
fn head_width(key: &str, channels: usize, heads: usize) -> Result<usize> {
    match channels.checked_div(heads) {
        Some(w) if w > 0 => Ok(w),
        _ => Err(Error::config(
            UNetMidBlockCrossAttnMotion::BLOCK,
            format!("{key} {heads} at {channels} channels gives heads of width in_channels // {key} = 0 or none"),
        )),
    }
}

/// `diffusers.models.unets.unet_motion_model.UNetMidBlockCrossAttnMotion`. Keys `resnets.<i>`,
/// `attentions.<i>` (`Transformer2DModel`), `motion_modules.<i>` (`AnimateDiffTransformer3D`:
/// `norm`, `proj_in`, `transformer_blocks.<j>` with `pos_embed.pe`, `proj_out`).
#[derive(Debug, Clone)]
pub struct UNetMidBlockCrossAttnMotion {
    layers: MidStack<ResnetBlock2D, Transformer2DModel>,
    /// After `attentions.i`.
    motion_modules: Vec<TransformerTemporalModel>,
}

impl UNetMidBlockCrossAttnMotion {
    pub const BLOCK: &'static str = "diffusers.UNetMidBlockCrossAttnMotion";

    pub fn new(vb: VarBuilder, cfg: &UNetMidBlockCrossAttnMotionConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let block = Self::BLOCK;
        if cfg.dual_cross_attention {
            return Err(Error::unsupported(
                block,
                "dual_cross_attention: diffusers' forward passes encoder_attention_mask to \
                 DualTransformer2DModel.forward, which has no such parameter (a TypeError on every call); \
                 UNetMotionModel always builds this block with dual_cross_attention=False",
            ));
        }
        let kwargs = cfg.resnet_kwargs();
        let c = cfg.in_channels;
        let groups = kwargs.groups(c);
        let resnet = kwargs.resnet(block, (c, c), cfg.temb_channels, (groups, None))?;
        let layers = per_layer(
            "transformer_layers_per_block",
            &cfg.transformer_layers_per_block,
            cfg.num_layers,
        )?;
        let temporal_layers = per_layer(
            "temporal_transformer_layers_per_block",
            &cfg.temporal_transformer_layers_per_block,
            cfg.num_layers,
        )?;
        let width = head_width("num_attention_heads", c, cfg.num_attention_heads)?;
        let motion = Self::motion_module(cfg, groups)?;
        let transformer = cfg.transformer_kwargs();
        let vb_res = vb.pp("resnets");
        let mut resnets = vec![ResnetBlock2D::new(vb_res.pp(0), &resnet)?];
        let (mut attentions, mut motion_modules) = (vec![], vec![]);
        for (i, (&n, &tn)) in layers.iter().zip(&temporal_layers).enumerate() {
            let spatial = transformer.transformer((c, width), n, groups);
            attentions.push(Transformer2DModel::new(vb.pp("attentions").pp(i), &spatial)?);
            resnets.push(ResnetBlock2D::new(vb_res.pp(i + 1), &resnet)?);
            let motion = TransformerTemporalModelConfig {
                num_layers: tn,
                ..motion.clone()
            };
            motion_modules.push(TransformerTemporalModel::new(vb.pp("motion_modules").pp(i), &motion)?);
        }
        Ok(Self {
            layers: MidStack::new(resnets, attentions),
            motion_modules,
        })
    }

    /// The `AnimateDiffTransformer3D(...)` of every layer but its `num_layers`, as the module
    /// docs list its arguments.
    fn motion_module(cfg: &UNetMidBlockCrossAttnMotionConfig, groups: usize) -> Result<TransformerTemporalModelConfig> {
        let (c, heads) = (cfg.in_channels, cfg.temporal_num_attention_heads);
        Ok(TransformerTemporalModelConfig {
            num_attention_heads: heads,
            attention_head_dim: head_width("temporal_num_attention_heads", c, heads)?,
            in_channels: Some(c),
            norm_num_groups: groups,
            cross_attention_dim: cfg.temporal_cross_attention_dim,
            attention_bias: false,
            positional_embeddings: Some("sinusoidal".into()),
            num_positional_embeddings: Some(cfg.temporal_max_seq_length),
            activation_fn: ActivationFn::Geglu,
            ..TransformerTemporalModelConfig::default()
        })
    }

    /// `forward(hidden_states, temb=None, encoder_hidden_states=None, attention_mask=None,
    /// encoder_attention_mask=None, num_frames=1)`: `hidden_states` `(B·F, C, H, W)`, `temb`
    /// `(B·F, temb_channels)` (the U-Net repeats it per frame) and `encoder_hidden_states` `(B·F,
    /// S, cross_attention_dim)` (AnimateDiff's pipeline repeats the prompt per frame); the masks
    /// go to the spatial transformers, as [`Transformer2DModel::forward`] takes them.
    pub fn forward(
        &self,
        hidden_states: &Tensor,
        temb: Option<&Tensor>,
        encoder_hidden_states: Option<&Tensor>,
        attention_mask: Option<&Tensor>,
        encoder_attention_mask: Option<&Tensor>,
        num_frames: usize,
    ) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "hidden_states", hidden_states, &[])?;
        crate::validate::optional(Self::BLOCK, "temb", temb, &[])?;
        crate::validate::optional(Self::BLOCK, "encoder_hidden_states", encoder_hidden_states, &[])?;
        crate::validate::optional_shape(Self::BLOCK, "attention_mask", attention_mask)?;
        crate::validate::optional_shape(Self::BLOCK, "encoder_attention_mask", encoder_attention_mask)?;
        let h = self.layers.forward_then(
            hidden_states,
            |resnet, h| resnet.forward(h, temb),
            |attn, h| attn.forward(h, encoder_hidden_states, attention_mask, encoder_attention_mask),
            |step, h| match step {
                Step::Attention(i) => trace::scope_at("motion_modules", i, || {
                    self.motion_modules[i].forward(&h, None, num_frames)
                }),
                Step::Resnet(_) => Ok(h),
            },
        )?;
        trace::record("output", &h);
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    fn build(edit: impl FnOnce(&mut UNetMidBlockCrossAttnMotionConfig)) -> String {
        let mut cfg = UNetMidBlockCrossAttnMotionConfig::new(8, Some(16));
        cfg.resnet_groups = Some(4);
        edit(&mut cfg);
        let vb = VarBuilder::zeros(DType::F32, &Device::Cpu);
        match UNetMidBlockCrossAttnMotion::new(vb, &cfg) {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        }
    }

    /// diffusers' defaults, and the constructor's refusals as errors naming the option.
    #[test]
    fn defaults_and_refused_options() {
        let cfg = UNetMidBlockCrossAttnMotionConfig::new(8, None);
        assert_eq!(cfg.temporal_max_seq_length, 32);
        assert_eq!((cfg.num_attention_heads, cfg.temporal_num_attention_heads), (1, 1));
        assert!(!cfg.use_linear_projection && !cfg.dual_cross_attention);
        assert_eq!(cfg.cross_attention_dim, 1280);
        assert_eq!(build(|_| {}), "");
        let e = build(|c| c.dual_cross_attention = true);
        assert!(e.contains("not supported") && e.contains("dual_cross_attention"), "{e}");
        let e = build(|c| c.transformer_layers_per_block = LayersPerBlock::PerLayer(vec![1, 1]));
        assert!(e.contains("transformer_layers_per_block lists 2"), "{e}");
        let e = build(|c| c.temporal_transformer_layers_per_block = LayersPerBlock::PerLayer(vec![]));
        assert!(e.contains("temporal_transformer_layers_per_block lists 0"), "{e}");
        let e = build(|c| c.temporal_num_attention_heads = 16);
        assert!(e.contains("temporal_num_attention_heads 16"), "{e}");
        let e = build(|c| c.num_attention_heads = 0);
        assert!(e.contains("num_attention_heads 0"), "{e}");
        // An odd motion-module width has no sinusoidal table (diffusers fails to build it too).
        let e = build(|c| {
            (c.in_channels, c.resnet_groups) = (9, Some(1));
            c.temporal_num_attention_heads = 3;
        });
        assert!(e.contains("odd width 9"), "{e}");
        let e = build(|c| c.resnet_time_scale_shift = crate::diffusers::unets::mid_block::TimeScaleShift::Spatial);
        assert!(e.contains("spatial"), "{e}");
    }
}
