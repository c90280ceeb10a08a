//! The U-Net bottleneck of OpenAI guided-diffusion (`guided_diffusion/unet.py`, 22e0df8) and of
//! CompVis/Stability ldm `openaimodel.py` (SD 1.x a506df5 / 21f890f, SD 2.x cf1d67a):
//! `middle_block = TimestepEmbedSequential(ResBlock, AttentionBlock | SpatialTransformer, ResBlock)`,
//! keys `0.*`, `1.*`, `2.*` under `middle_block.` (`model.diffusion_model.middle_block.` in SD
//! checkpoints).
//!
//! `ResBlock(channels, emb_channels, dropout, out_channels=None, use_conv=False,
//! use_scale_shift_norm=False, dims=2, use_checkpoint=False, up=False, down=False)`:
//! ```text
//! in_layers  = [GroupNorm32(32, C), SiLU, conv(C, out, 3)]          # in_layers.0, in_layers.2
//! emb_layers = [SiLU, Linear(emb, 2·out if use_scale_shift_norm else out)]   # emb_layers.1
//! out_layers = [GroupNorm32(32, out), SiLU, Dropout, conv(out, out, 3)]     # out_layers.0, out_layers.3
//! skip_connection = Identity | conv 3×3 (use_conv) | conv 1×1             # skip_connection
//! h = in_layers(x); emb_out = emb_layers(emb)[..., None, None]
//! scale-shift: h = out_rest(out_norm(h) * (1 + scale) + shift)   else: h = out_layers(h + emb_out)
//! return skip_connection(x) + h
//! ```
//! GroupNorm32 computes in float32 (eps 1e-5). Only `dims=2` is implemented.
//!
//! Half precision as guided-diffusion runs it (`UNetModel.convert_to_fp16()`): only the convs are
//! half, `x` is half, while `emb` (the un-converted `time_embed`'s output), the `GroupNorm32`
//! parameters and the `emb_layers` `Linear` stay f32. So `emb_layers` runs in `emb`'s dtype with its
//! weights loaded in the compute dtype (f32 for half runs, never rounded to the half type), and
//! `.type(h.dtype)` casts its output to `h`'s dtype.

use super::{AttentionBlock, AttentionBlockConfig};
use crate::config::defaults;
use crate::cpu_kernels::{ConvExtras, Swish};
use crate::layers::{scale_shift, Activation, Conv2d, GroupNorm, Projection};
use crate::ldm::transformer::{ContextDim, SpatialTransformer, SpatialTransformerConfig};
use crate::trace;
use crate::{Error, Result};
use candle_core::{Module, Tensor};
use candle_nn::VarBuilder;
use serde::Deserialize;

const NORM_GROUPS: usize = 32;
const NORM_EPS: f64 = 1e-5;

/// Keyword arguments of `ResBlock(...)` (see the module docs).
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ResBlockConfig {
    pub channels: usize,
    pub emb_channels: usize,
    /// Identity in eval mode.
    #[serde(default)]
    pub dropout: f64,
    #[serde(default)]
    pub out_channels: Option<usize>,
    #[serde(default)]
    pub use_conv: bool,
    #[serde(default)]
    pub use_scale_shift_norm: bool,
    #[serde(default = "defaults::usize::<2>")]
    pub dims: usize,
    /// Gradient checkpointing only.
    #[serde(default)]
    pub use_checkpoint: bool,
    #[serde(default)]
    pub up: bool,
    #[serde(default)]
    pub down: bool,
}

/// `ResBlock` of guided-diffusion / ldm `openaimodel.py`.
#[derive(Debug, Clone)]
pub struct ResBlock {
    channels: usize,
    in_norm: GroupNorm,
    in_conv: Conv2d,
    emb_proj: Projection,
    out_norm: GroupNorm,
    out_conv: Conv2d,
    skip: Option<Conv2d>,
    scale_shift: bool,
}

impl ResBlock {
    pub const BLOCK: &'static str = "openai.ResBlock";

    pub fn new(vb: VarBuilder, cfg: &ResBlockConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let block = Self::BLOCK;
        if cfg.dims != 2 || cfg.up || cfg.down {
            return Err(Error::unsupported(
                block,
                format!(
                    "only dims=2 without up/down resampling is implemented (found dims={}, up={}, down={})",
                    cfg.dims, cfg.up, cfg.down
                ),
            ));
        }
        let (c, out) = (cfg.channels, cfg.out_channels.unwrap_or(cfg.channels));
        let emb_out = if cfg.use_scale_shift_norm { 2 * out } else { out };
        let skip = match (out == c, cfg.use_conv) {
            (true, _) => None,
            (false, true) => Some(Conv2d::load(vb.pp("skip_connection"), c, out, 3, true)?),
            (false, false) => Some(Conv2d::load(vb.pp("skip_connection"), c, out, 1, true)?),
        };
        Ok(Self {
            channels: c,
            in_norm: GroupNorm::load(
                vb.pp("in_layers.0").to_dtype(crate::ops::compute_dtype(vb.dtype())),
                block,
                NORM_GROUPS,
                c,
                NORM_EPS,
            )?
            .float_input(),
            in_conv: Conv2d::load(vb.pp("in_layers.2"), c, out, 3, true)?,
            // `emb_layers` is not converted by `convert_to_fp16`: its Linear keeps f32 weights (a
            // half-precision weight upcasts exactly); it runs in `emb`'s dtype (see `forward`).
            emb_proj: Projection::load(
                vb.pp("emb_layers.1").to_dtype(crate::ops::compute_dtype(vb.dtype())),
                block,
                cfg.emb_channels,
                emb_out,
                true,
            )?,
            out_norm: GroupNorm::load(
                vb.pp("out_layers.0").to_dtype(crate::ops::compute_dtype(vb.dtype())),
                block,
                NORM_GROUPS,
                out,
                NORM_EPS,
            )?
            .float_input(),
            out_conv: Conv2d::load(vb.pp("out_layers.3"), out, out, 3, true)?,
            skip,
            scale_shift: cfg.use_scale_shift_norm,
        })
    }

    /// `forward(x, emb)`: `x` `(B, channels, H, W)`, `emb` `(B, emb_channels)`.
    pub fn forward(&self, x: &Tensor, emb: &Tensor) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "x", x, &[])?;
        crate::validate::input(Self::BLOCK, "emb", emb, &[])?;
        let block = Self::BLOCK;
        if x.rank() != 4 || x.dim(1)? != self.channels {
            return Err(Error::input(
                block,
                "x",
                format!("expected (B, {}, H, W), found {:?}", self.channels, x.dims()),
            ));
        }
        if emb.rank() != 2 || emb.dim(0)? != x.dim(0)? {
            return Err(Error::input(
                block,
                "emb",
                format!("expected (B={}, emb_channels), found {:?}", x.dim(0)?, emb.dims()),
            ));
        }
        let act = Activation::Swish;
        // emb_out = self.emb_layers(emb).type(h.dtype): SiLU and Linear in emb's dtype (f32 in
        // guided-diffusion's half mode; a half emb: f32 accumulation rounded once, as `addmm`).
        let emb_out = self.emb_proj.forward_tokens(&act.forward(emb)?)?;
        trace::record("temb", &emb_out);
        let silu = |y: &Tensor| act.forward(y);
        let h = self.in_norm.forward_swish(x, "norm1", Swish::Silu, silu)?;
        // `.type(h.dtype)`: the convolutions' dtype, that of `x`.
        let emb_out = emb_out.to_dtype(x.dtype())?;
        let h = if self.scale_shift {
            let h = self.in_conv.forward_traced(&h, "conv1", ConvExtras::default())?;
            let normed = self.out_norm.forward(&h)?;
            trace::record("norm2", &normed);
            let half = emb_out.dim(1)? / 2;
            let (scale, shift) = (emb_out.narrow(1, 0, half)?, emb_out.narrow(1, half, half)?);
            act.forward(&scale_shift(&normed, &scale, &shift)?)?
        } else {
            // `h + emb_out[..., None, None]`, in in_conv's write-out (on CUDA in out_norm's
            // fused kernel instead).
            if GroupNorm::fuses_pre_add(&h, &emb_out) {
                let h = self.in_conv.forward_traced(&h, "conv1", ConvExtras::default())?;
                self.out_norm
                    .forward_swish_add(&h, &emb_out, "norm2", Swish::Silu, silu)?
            } else {
                let extras = ConvExtras {
                    channel_add: Some(&emb_out),
                    ..ConvExtras::default()
                };
                let h = self.in_conv.forward_traced(&h, "conv1", extras)?;
                self.out_norm.forward_swish(&h, "norm2", Swish::Silu, silu)?
            }
        };
        // skip_connection: a conv, or nn.Identity when the channels match
        let skip = match &self.skip {
            Some(conv) => conv.forward(x)?,
            None => x.clone(),
        };
        trace::record("shortcut", &skip);
        let extras = ConvExtras {
            residual: Some(&skip),
            ..ConvExtras::default()
        };
        let out = self.out_conv.forward_traced(&h, "conv2", extras)?;
        trace::record("output", &out);
        Ok(out)
    }
}

/// The `UNetModel` keyword arguments that shape `middle_block`, with `channels` the bottleneck
/// width (`model_channels · channel_mult[-1]`) and `emb_channels` the time-embedding width
/// (`4 · model_channels`). Heads follow `UNetModel`'s rule:
/// ```text
/// if num_head_channels == -1: dim_head = ch // num_heads
/// else: num_heads = ch // num_head_channels; dim_head = num_head_channels
/// if legacy: dim_head = ch // num_heads if use_spatial_transformer else num_head_channels
/// AttentionBlock(ch, num_heads=num_heads, num_head_channels=dim_head, use_new_attention_order)
/// SpatialTransformer(ch, num_heads, dim_head, depth=transformer_depth, context_dim, ...)
/// ```
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct MiddleBlockConfig {
    pub channels: usize,
    pub emb_channels: usize,
    #[serde(default)]
    pub dropout: f64,
    #[serde(default = "defaults::usize::<2>")]
    pub dims: usize,
    #[serde(default)]
    pub use_scale_shift_norm: bool,
    #[serde(default = "defaults::minus_one")]
    pub num_heads: i64,
    #[serde(default = "defaults::minus_one")]
    pub num_head_channels: i64,
    #[serde(default)]
    pub use_new_attention_order: bool,
    #[serde(default)]
    pub use_spatial_transformer: bool,
    #[serde(default = "defaults::usize::<1>")]
    pub transformer_depth: usize,
    #[serde(default)]
    pub context_dim: Option<serde_json::Value>,
    #[serde(default)]
    pub use_linear_in_transformer: bool,
    #[serde(default)]
    pub disable_middle_self_attn: bool,
    #[serde(default = "defaults::yes")]
    pub legacy: bool,
    /// Gradient checkpointing only.
    #[serde(default)]
    pub use_checkpoint: bool,
}

#[derive(Debug, Clone)]
enum MiddleAttention {
    Attention(AttentionBlock),
    Transformer(SpatialTransformer),
}

/// `UNetModel.middle_block`.
#[derive(Debug, Clone)]
pub struct MiddleBlock {
    res0: ResBlock,
    attn: MiddleAttention,
    res2: ResBlock,
}

impl MiddleBlock {
    pub const BLOCK: &'static str = "openai.MiddleBlock";

    /// `vb` at `middle_block` (`model.diffusion_model.middle_block` in SD checkpoints).
    pub fn new(vb: VarBuilder, cfg: &MiddleBlockConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        let block = Self::BLOCK;
        let ch = cfg.channels;
        let positive = |name: &str, v: i64| -> Result<usize> {
            usize::try_from(v)
                .ok()
                .filter(|&v| v > 0)
                .ok_or_else(|| Error::config(block, format!("{name} must be positive here, found {v}")))
        };
        let (num_heads, dim_head) = if cfg.num_head_channels == -1 {
            let heads = positive("num_heads (with num_head_channels -1)", cfg.num_heads)?;
            (heads, ch / heads)
        } else {
            let d = positive("num_head_channels", cfg.num_head_channels)?;
            (ch / d, d)
        };
        let resnet = ResBlockConfig {
            channels: ch,
            emb_channels: cfg.emb_channels,
            dropout: cfg.dropout,
            out_channels: None,
            use_conv: false,
            use_scale_shift_norm: cfg.use_scale_shift_norm,
            dims: cfg.dims,
            use_checkpoint: cfg.use_checkpoint,
            up: false,
            down: false,
        };
        let attn = if cfg.use_spatial_transformer {
            let dim_head = if cfg.legacy { ch / num_heads.max(1) } else { dim_head };
            // `context_dim` is kept as the kwargs give it (any JSON) and read only here.
            let context_dim = match &cfg.context_dim {
                None | Some(serde_json::Value::Null) => None,
                Some(v) => Some(
                    ContextDim::deserialize(v).map_err(|e| Error::config(block, format!("context_dim {v}: {e}")))?,
                ),
            };
            let st = SpatialTransformerConfig {
                depth: cfg.transformer_depth,
                dropout: cfg.dropout,
                context_dim,
                disable_self_attn: cfg.disable_middle_self_attn,
                use_linear: cfg.use_linear_in_transformer,
                ..SpatialTransformerConfig::new(ch, num_heads, dim_head)
            };
            MiddleAttention::Transformer(SpatialTransformer::new(vb.pp("1"), &st)?)
        } else {
            let num_head_channels = if cfg.legacy {
                cfg.num_head_channels
            } else {
                dim_head as i64
            };
            let ab = AttentionBlockConfig {
                channels: ch,
                num_heads,
                num_head_channels,
                use_checkpoint: cfg.use_checkpoint,
                use_new_attention_order: cfg.use_new_attention_order,
            };
            MiddleAttention::Attention(AttentionBlock::new(vb.pp("1"), &ab)?)
        };
        Ok(Self {
            res0: ResBlock::new(vb.pp("0"), &resnet)?,
            attn,
            res2: ResBlock::new(vb.pp("2"), &resnet)?,
        })
    }

    /// `forward(x, emb, context=None)` (`TimestepEmbedSequential`): `x` `(B, channels, H, W)`,
    /// `emb` `(B, emb_channels)`, `context` `(B, S, context_dim)` for the spatial transformer.
    pub fn forward(&self, x: &Tensor, emb: &Tensor, context: Option<&Tensor>) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "x", x, &[])?;
        crate::validate::input(Self::BLOCK, "emb", emb, &[])?;
        crate::validate::optional(Self::BLOCK, "context", context, &[])?;
        self.forward_with(x, emb, |t, h| t.forward(h, context))
    }

    /// `forward` with a list `context`, one per transformer block (SD 2.x's `SpatialTransformer`
    /// indexes `context[i]` per block, so `transformer_depth > 1` takes one context per depth).
    /// The middle block's attention must be a spatial transformer.
    pub fn forward_per_block(&self, x: &Tensor, emb: &Tensor, contexts: &[&Tensor]) -> Result<Tensor> {
        crate::validate::input(Self::BLOCK, "x", x, &[])?;
        crate::validate::input(Self::BLOCK, "emb", emb, &[])?;
        for t in contexts {
            crate::validate::input(Self::BLOCK, "contexts", t, &[])?;
        }
        if matches!(self.attn, MiddleAttention::Attention(_)) {
            return Err(Error::input(
                Self::BLOCK,
                "context.0",
                "this middle block's attention is an AttentionBlock, which takes no context".to_string(),
            ));
        }
        self.forward_with(x, emb, |t, h| t.forward_per_block(h, contexts))
    }

    fn forward_with(
        &self,
        x: &Tensor,
        emb: &Tensor,
        transformer: impl Fn(&SpatialTransformer, &Tensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let h = trace::scope("0", || self.res0.forward(x, emb))?;
        let h = trace::scope("1", || match &self.attn {
            MiddleAttention::Attention(a) => a.forward_checked(&h),
            MiddleAttention::Transformer(t) => transformer(t, &h),
        })?;
        let out = trace::scope("2", || self.res2.forward(&h, emb))?;
        trace::record("output", &out);
        Ok(out)
    }
}
