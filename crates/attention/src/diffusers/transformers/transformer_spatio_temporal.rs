//! Stable Video Diffusion's transformer, diffusers 0.42.1: [`TransformerSpatioTemporalModel`]
//! (`models/transformers/transformer_temporal.py`) with its `TemporalBasicTransformerBlock`s
//! (`models/attention.py`), the attention of `UNetMidBlockSpatioTemporal`.
//!
//! ```text
//! forward(h, encoder_hidden_states, image_only_indicator):     F = image_only_indicator.shape[-1], B = B·F / F
//!   time_context = encoder_hidden_states.reshape(B, F, S, D)[:, 0]     # the first frame's context,
//!                  broadcast to (B, H·W, S, D).reshape(B·H·W, S, D)   # one per pixel
//!   x = proj_in(norm(h).permute(0, 2, 3, 1).reshape(B·F, H·W, C))      # GroupNorm(32, C, eps 1e-6), Linear
//!   emb = time_pos_embed(time_proj(arange(F).repeat(B)))               # Timesteps(C, flip_sin_to_cos, 0) → Linear, SiLU, Linear
//!   for block, temporal_block in zip(transformer_blocks, temporal_transformer_blocks):
//!     x = block(x, encoder_hidden_states)                              # BasicTransformerBlock over the pixels of a frame
//!     mix = temporal_block(x + emb[:, None], F, time_context)           # over the frames of a pixel
//!     x = time_mixer(x, mix, image_only_indicator)                      # AlphaBlender "learned_with_images"
//!   return proj_out(x).reshape(B·F, H, W, C).permute(0, 3, 1, 2) + h
//! TemporalBasicTransformerBlock.forward(x (B·F, N, C), F, ctx):  x = x.reshape(B, F, N, C).permute(0, 2, 1, 3).reshape(B·N, F, C)
//!   x = ff_in(norm_in(x)) + x;  x = attn1(norm1(x)) + x;  x = attn2(norm2(x), ctx) + x;  x = ff(norm3(x)) + x
//!   return x.reshape(B, N, F, C).permute(0, 2, 1, 3).reshape(B·F, N, C)
//! ```
//!
//! `encoder_hidden_states` is required (diffusers reads `time_context` from it unconditionally);
//! the temporal blocks' `is_res` is always true here (`time_mix_inner_dim = inner_dim`).

use crate::config::defaults;
use crate::diffusers::feed_forward::{FeedForward, FeedForwardConfig};
use crate::diffusers::spatio_temporal::{frames_of, AlphaBlender, MergeStrategy};
use crate::diffusers::transformers::transformer::{
    BasicTransformerBlockConfig, TransformerBlock, TransformerBlockSpec,
};
use crate::layers::{group_norm, Activation, GroupNorm, LayerNorm, Projection};
use crate::trace;
use crate::{Error, Result};
use candle_core::{DType, Module, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;

/// Keyword arguments of `TransformerSpatioTemporalModel(num_attention_heads=16,
/// attention_head_dim=88, in_channels=320, out_channels=None, num_layers=1,
/// cross_attention_dim=None)`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct TransformerSpatioTemporalModelConfig {
    #[serde(default = "defaults::usize::<16>")]
    pub num_attention_heads: usize,
    #[serde(default = "defaults::usize::<88>")]
    pub attention_head_dim: usize,
    #[serde(default = "defaults::some::<320>")]
    pub in_channels: Option<usize>,
    /// Stored by diffusers but not used: `proj_out` maps back to `in_channels`.
    #[serde(default)]
    pub out_channels: Option<usize>,
    #[serde(default = "defaults::usize::<1>")]
    pub num_layers: usize,
    #[serde(default)]
    pub cross_attention_dim: Option<usize>,
}

impl Default for TransformerSpatioTemporalModelConfig {
    /// `TransformerSpatioTemporalModel()`: every argument at its diffusers default.
    fn default() -> Self {
        Self {
            num_attention_heads: defaults::usize::<16>(),
            attention_head_dim: defaults::usize::<88>(),
            in_channels: defaults::some::<320>(),
            out_channels: None,
            num_layers: defaults::usize::<1>(),
            cross_attention_dim: None,
        }
    }
}

/// `TemporalBasicTransformerBlock(dim, time_mix_inner_dim=dim, num_attention_heads,
/// attention_head_dim, cross_attention_dim)`: keys `norm_in`, `ff_in`, then the
/// `BasicTransformerBlock` keys `norm1`, `attn1`, `norm2`, `attn2`, `norm3`, `ff`.
#[derive(Debug, Clone)]
struct TemporalBasicTransformerBlock {
    norm_in: LayerNorm,
    ff_in: FeedForward,
    block: TransformerBlock,
}

impl TemporalBasicTransformerBlock {
    fn new(vb: VarBuilder, block: &'static str, spec: &TransformerBlockSpec) -> Result<Self> {
        Ok(Self {
            norm_in: LayerNorm::load(vb.pp("norm_in"), spec.dim, 1e-5, true)?,
            ff_in: FeedForward::load(vb.pp("ff_in"), block, &FeedForwardConfig::new(spec.dim), "net.0.proj")?,
            block: TransformerBlock::load(vb, block, spec)?,
        })
    }

    /// `x` `(B·F, N, C)`, `context` `(B·N, S, D)`.
    fn forward(&self, x: &Tensor, num_frames: usize, context: Option<&Tensor>) -> Result<Tensor> {
        let (bf, n, c) = x.dims3()?;
        let (b, f) = (bf / num_frames, num_frames);
        let x = x.reshape((b, f, n, c))?.permute((0, 2, 1, 3))?.reshape((b * n, f, c))?;
        let normed = self.norm_in.forward(&x)?;
        let h = (trace::scope("ff_in", || self.ff_in.forward(&normed))? + &x)?;
        let h = self.block.forward_unrecorded(&h, context, None, None)?;
        let out = h.reshape((b, n, f, c))?.permute((0, 2, 1, 3))?.reshape((bf, n, c))?;
        trace::record("output", &out);
        Ok(out)
    }
}

/// `TimestepEmbedding(C, 4·C, out_dim=C)` on `Timesteps(C, flip_sin_to_cos=True,
/// downscale_freq_shift=0)` of the frame indices: keys `time_pos_embed.linear_1`, `linear_2`.
#[derive(Debug, Clone)]
struct FrameEmbedding {
    linear_1: Projection,
    linear_2: Projection,
    channels: usize,
}

impl FrameEmbedding {
    fn new(vb: VarBuilder, block: &'static str, c: usize) -> Result<Self> {
        Ok(Self {
            linear_1: Projection::load(vb.pp("linear_1"), block, c, 4 * c, true)?,
            linear_2: Projection::load(vb.pp("linear_2"), block, 4 * c, c, true)?,
            channels: c,
        })
    }

    /// diffusers' `get_timestep_embedding(arange(F).repeat(B), C, flip_sin_to_cos=True,
    /// downscale_freq_shift=0)` in f32: `[cos, sin]` of `t · exp(−ln(10000)·i / (C/2))`, zero
    /// padded for an odd `C`. `(B·F, C)`.
    /// Under [`crate::float64_run::Embeddings::Exact`]: in float64 throughout (a float64 tensor).
    fn sinusoid(&self, batch: usize, frames: usize, dev: &candle_core::Device) -> Result<Tensor> {
        let c = self.channels;
        let half = c / 2;
        if crate::float64_run::embeddings_exact() {
            let freqs: Vec<f64> = (0..half)
                .map(|i| (-(10000f64.ln()) * i as f64 / half as f64).exp())
                .collect();
            let mut data = Vec::with_capacity(batch * frames * c);
            for _ in 0..batch {
                for t in 0..frames {
                    data.extend(freqs.iter().map(|w| (t as f64 * w).cos()));
                    data.extend(freqs.iter().map(|w| (t as f64 * w).sin()));
                    if c % 2 == 1 {
                        data.push(0.0);
                    }
                }
            }
            return Ok(Tensor::from_vec(data, (batch * frames, c), dev)?);
        }
        let freqs: Vec<f32> = (0..half)
            .map(|i| ((-(10000f64.ln()) as f32) * i as f32 / half as f32).exp())
            .collect();
        let mut data = Vec::with_capacity(batch * frames * c);
        for _ in 0..batch {
            for t in 0..frames {
                let args: Vec<f32> = freqs.iter().map(|w| t as f32 * w).collect();
                data.extend(args.iter().map(|a| a.cos()));
                data.extend(args.iter().map(|a| a.sin()));
                if c % 2 == 1 {
                    data.push(0.0);
                }
            }
        }
        Ok(Tensor::from_vec(data, (batch * frames, c), dev)?)
    }

    /// `(B·F, C)` in `dtype`.
    fn forward(&self, batch: usize, frames: usize, dtype: DType, dev: &candle_core::Device) -> Result<Tensor> {
        let t = self.sinusoid(batch, frames, dev)?.to_dtype(dtype)?;
        let h = self.linear_1.forward_tokens(&t)?;
        let h = Activation::Swish.forward(&h)?;
        let out = self.linear_2.forward_tokens(&h)?;
        trace::record("output", &out);
        Ok(out)
    }
}

/// `diffusers.models.transformers.transformer_temporal.TransformerSpatioTemporalModel`: keys
/// `norm`, `proj_in`, `transformer_blocks.<i>`, `temporal_transformer_blocks.<i>`,
/// `time_pos_embed`, `time_mixer.mix_factor`, `proj_out`.
#[derive(Debug, Clone)]
pub struct TransformerSpatioTemporalModel {
    norm: GroupNorm,
    proj_in: Projection,
    blocks: Vec<TransformerBlock>,
    temporal_blocks: Vec<TemporalBasicTransformerBlock>,
    time_pos_embed: FrameEmbedding,
    time_mixer: AlphaBlender,
    proj_out: Projection,
    channels: usize,
}

impl TransformerSpatioTemporalModel {
    pub const BLOCK: &'static str = "diffusers.TransformerSpatioTemporalModel";

    pub fn new(vb: VarBuilder, cfg: &TransformerSpatioTemporalModelConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let block = Self::BLOCK;
        let c = cfg
            .in_channels
            .ok_or_else(|| Error::config(block, "in_channels is required (GroupNorm(num_channels=in_channels))"))?;
        let inner = cfg.num_attention_heads * cfg.attention_head_dim;
        if inner == 0 {
            return Err(Error::config(block, "num_attention_heads · attention_head_dim is 0"));
        }
        // BasicTransformerBlock(inner_dim, num_attention_heads, attention_head_dim, cross_attention_dim)
        // and TemporalBasicTransformerBlock(inner_dim, inner_dim, ...) share the attention and FF layout.
        let block_cfg = BasicTransformerBlockConfig {
            cross_attention_dim: cfg.cross_attention_dim,
            ..BasicTransformerBlockConfig::new(inner, cfg.num_attention_heads, cfg.attention_head_dim)
        };
        let spec = block_cfg.spec(block)?;
        let blocks = (0..cfg.num_layers)
            .map(|i| TransformerBlock::load(vb.pp("transformer_blocks").pp(i), block, &spec))
            .collect::<Result<Vec<_>>>()?;
        let temporal_blocks = (0..cfg.num_layers)
            .map(|i| TemporalBasicTransformerBlock::new(vb.pp("temporal_transformer_blocks").pp(i), block, &spec))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            norm: group_norm(vb.pp("norm"), block, 32, c, 1e-6)?,
            proj_in: Projection::load(vb.pp("proj_in"), block, c, inner, true)?,
            blocks,
            temporal_blocks,
            time_pos_embed: FrameEmbedding::new(vb.pp("time_pos_embed"), block, c)?,
            time_mixer: AlphaBlender::new(vb.pp("time_mixer"), MergeStrategy::LearnedWithImages, false)?,
            proj_out: Projection::load(vb.pp("proj_out"), block, inner, c, true)?,
            channels: c,
        })
    }

    /// `encoder_hidden_states` `(B·F, S, D)` → the first frame's, one copy per pixel `(B·H·W, S, D)`.
    fn time_context(context: &Tensor, b: usize, f: usize, pixels: usize) -> Result<Tensor> {
        let (_, s, d) = context.dims3()?;
        let first = context.reshape((b, f, s, d))?.narrow(1, 0, 1)?;
        Ok(first.broadcast_as((b, pixels, s, d))?.reshape((b * pixels, s, d))?)
    }

    /// `forward(hidden_states, encoder_hidden_states, image_only_indicator, return_dict=False)`:
    /// `hidden_states` `(B·F, C, H, W)`, `encoder_hidden_states` `(B·F, S, D)`,
    /// `image_only_indicator` `(B, F)`.
    pub fn forward(
        &self,
        hidden_states: &Tensor,
        encoder_hidden_states: Option<&Tensor>,
        image_only_indicator: &Tensor,
    ) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "hidden_states", hidden_states, &[])?;
        crate::validate::optional(Self::BLOCK, "encoder_hidden_states", encoder_hidden_states, &[])?;
        crate::validate::input(Self::BLOCK, "image_only_indicator", image_only_indicator, &[])?;
        let block = Self::BLOCK;
        let dims = hidden_states.dims();
        if dims.len() != 4 || dims[1] != self.channels {
            return Err(Error::input(
                block,
                "hidden_states",
                format!("expected (batch·num_frames, {}, H, W), found {dims:?}", self.channels),
            ));
        }
        let (bf, c, h, w) = hidden_states.dims4()?;
        let (b, f) = frames_of(block, image_only_indicator, bf)?;
        let context = encoder_hidden_states.ok_or_else(|| {
            Error::input(
                block,
                "encoder_hidden_states",
                "required: diffusers takes the temporal blocks' context (time_context) from it",
            )
        })?;
        if context.rank() != 3 || context.dim(0)? != bf {
            return Err(Error::input(
                block,
                "encoder_hidden_states",
                format!("expected (B·F={bf}, S, D), found {:?}", context.dims()),
            ));
        }
        let time_context = Self::time_context(context, b, f, h * w)?;
        let normed = self.norm.forward(hidden_states)?;
        trace::record("norm", &normed);
        // permute(0, 2, 3, 1).reshape(...) is a strided view: F.linear rounds product and bias apart
        let tokens = normed.permute((0, 2, 3, 1))?.reshape((bf, h * w, c))?;
        let mut x = self.proj_in.forward_tokens_strided(&tokens)?;
        trace::record("proj_in", &x);
        let emb = trace::scope("time_pos_embed", || {
            self.time_pos_embed.forward(b, f, x.dtype(), x.device())
        })?;
        let emb = emb.unsqueeze(1)?;
        for (i, (spatial, temporal)) in self.blocks.iter().zip(&self.temporal_blocks).enumerate() {
            x = trace::scope_at("transformer_blocks", i, || {
                spatial.forward(&x, Some(context), None, None)
            })?;
            let mix = x.broadcast_add(&emb)?;
            let mix = trace::scope_at("temporal_transformer_blocks", i, || {
                temporal.forward(&mix, f, Some(&time_context))
            })?;
            x = self.time_mixer.forward(&x, &mix, Some(image_only_indicator))?;
        }
        let x = self.proj_out.forward_tokens(&x)?;
        trace::record("proj_out", &x);
        let x = x.reshape((bf, h, w, c))?.permute((0, 3, 1, 2))?;
        let out = crate::ops::add(&x, hidden_states)?;
        trace::record("output", &out);
        Ok(out)
    }
}
