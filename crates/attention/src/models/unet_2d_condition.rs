//! diffusers 0.42.1 `UNet2DConditionModel` (`models/unets/unet_2d_condition.py`), the U-Net of
//! Stable Diffusion 1.x, 2.x and XL, built from the checked blocks: [`ResnetBlock2D`],
//! `Transformer2DModel`, [`UNetMidBlock2DCrossAttn`] and the down/up blocks of
//! [`super::unet_blocks`].
//!
//! ```text
//! forward(sample, timestep, encoder_hidden_states, added_cond_kwargs):
//!   emb = time_embedding(time_proj(timestep).to(dtype))          (+ add_embedding(cat[text_embeds,
//!         add_time_proj(time_ids).reshape(B, -1)]) for addition_embed_type "text_time": SDXL)
//!   h = conv_in(sample); res = (h,)
//!   for down in down_blocks: h, states = down(h, emb, context); res += states
//!   h = mid_block(h, emb, context)
//!   for up in up_blocks: h = up(h, res[-len(up.resnets):], emb, context)   (upsample_size when
//!                                                   the sample is not a multiple of 2^upsamplers)
//!   return conv_out(conv_act(conv_norm_out(h)))
//! ```
//!
//! Built as `__init__` builds it (the per-block lists of [`UNet2DConditionModelConfig`], the up
//! blocks' reversed head counts, `attention_head_dim` read as a head count), weights under the
//! PyTorch state-dict names. The forward records each module's output under its module path
//! (`conv_in`, `down_blocks.0`, `down_blocks.0/resnets.1`, `mid_block`, `up_blocks.1/upsamplers.0`)
//! for `unet-parity check --trace` on module-path bundles.

use super::folder::ModelFolder;
use super::time_embedding::{TimestepEmbedding, Timesteps};
use super::unet_2d_condition_config::UNet2DConditionModelConfig;
use super::unet_blocks::{self, layer, BlockKwargs, Context, DownBlock, Downsample2D, UpBlock, UpChannels};
use crate::diffusers::model_config::ModelClass;
use crate::diffusers::resnet::{ResnetBlock2DConfig, TimeEmbeddingNorm};
use crate::diffusers::transformers::transformer::Transformer2DModelConfig;
use crate::diffusers::unets::mid_block::{UNetMidBlock2DCrossAttn, UNetMidBlock2DCrossAttnConfig};
use crate::layers::{group_norm, Activation, Conv2d, GroupNorm};
use crate::trace;
use crate::{Error, Result};
use candle_core::{DType, Device, Tensor};
use candle_nn::{Module, VarBuilder};
use std::path::Path;

#[cfg(doc)]
use crate::diffusers::resnet::ResnetBlock2D;

/// SDXL's `added_cond_kwargs`: `text_embeds` `(B, D)` (the pooled text embedding) and `time_ids`
/// `(B, n)` (original size, crop, target size).
#[derive(Debug, Clone, Copy)]
pub struct AddedCond<'a> {
    pub text_embeds: &'a Tensor,
    pub time_ids: &'a Tensor,
}

/// The optional arguments of `UNet2DConditionModel.forward` this port takes.
#[derive(Debug, Clone, Copy, Default)]
pub struct ForwardArgs<'a> {
    /// `added_cond_kwargs` (required with `addition_embed_type: "text_time"`).
    pub added_cond: Option<AddedCond<'a>>,
    /// `attention_mask` `(B, tokens)`: 1 keep, 0 discard (as diffusers, a bias `(1 − m)·−10000`).
    pub attention_mask: Option<&'a Tensor>,
    /// `encoder_attention_mask` `(B, context tokens)`, the same way.
    pub encoder_attention_mask: Option<&'a Tensor>,
    /// A ControlNet's residuals (`down_block_additional_residuals` and
    /// `mid_block_additional_residual`, which diffusers takes as a ControlNet's only together).
    pub controlnet: Option<ControlNetResiduals<'a>>,
}

/// A ControlNet's output, added as diffusers' `UNet2DConditionModel.forward` adds it: `down[i]`
/// to the `i`-th skip of the down path (`conv_in`'s output first, then every resnet and
/// downsampler output; as many as there are skips), `mid` to the mid block's output.
#[derive(Debug, Clone, Copy)]
pub struct ControlNetResiduals<'a> {
    pub down: &'a [Tensor],
    pub mid: &'a Tensor,
}

/// SDXL's `add_time_proj` and `add_embedding` (the U-Net's and an SDXL ControlNet's).
#[derive(Debug, Clone)]
pub(super) struct TextTime {
    add_time_proj: Timesteps,
    add_embedding: TimestepEmbedding,
    /// `projection_class_embeddings_input_dim`: `add_embedding`'s input width.
    input: usize,
}

impl TextTime {
    /// `emb + add_embedding(cat[text_embeds, add_time_proj(time_ids).reshape(B, -1)])`, the
    /// conditions' shapes checked (`block` names them in errors).
    pub(super) fn add(&self, block: &'static str, emb: Tensor, added: Option<AddedCond>) -> Result<Tensor> {
        let b = emb.dim(0)?;
        let added = added.ok_or_else(|| {
            Error::input(
                block,
                "added_cond_kwargs",
                "addition_embed_type \"text_time\" (SDXL) needs text_embeds and time_ids",
            )
        })?;
        let (text, ids) = (added.text_embeds, added.time_ids);
        if text.rank() != 2 || text.dim(0)? != b || ids.rank() != 2 || ids.dim(0)? != b {
            return Err(Error::input(
                block,
                "added_cond_kwargs",
                format!(
                    "expected text_embeds (B={b}, D) and time_ids (B, n), found {:?} and {:?}",
                    text.dims(),
                    ids.dims()
                ),
            ));
        }
        let width = text
            .dim(1)?
            .saturating_add(ids.dim(1)?.saturating_mul(self.add_time_proj.num_channels));
        if width != self.input {
            return Err(Error::input(
                block,
                "added_cond_kwargs",
                format!(
                    "text_embeds (B, D) and time_ids (B, n) with D + n · {} = {} \
                     (projection_class_embeddings_input_dim), found {:?} and {:?}",
                    self.add_time_proj.num_channels,
                    self.input,
                    text.dims(),
                    ids.dims()
                ),
            ));
        }
        let time_embeds = self.add_time_proj.forward(ids)?;
        trace::record("add_time_proj", &time_embeds);
        let time_embeds = time_embeds.reshape((b, ()))?.to_dtype(emb.dtype())?;
        let add = Tensor::cat(&[&text.to_dtype(emb.dtype())?, &time_embeds], 1)?;
        let aug = trace::scope("add_embedding", || self.add_embedding.forward(&add))?;
        trace::record("add_embedding", &aug);
        Ok((emb + aug)?)
    }
}

/// `diffusers.models.unets.unet_2d_condition.UNet2DConditionModel`.
#[derive(Debug, Clone)]
pub struct UNet2DConditionModel {
    config: UNet2DConditionModelConfig,
    conv_in: Conv2d,
    time_proj: Timesteps,
    time_embedding: TimestepEmbedding,
    text_time: Option<TextTime>,
    down_blocks: Vec<DownBlock>,
    mid_block: Option<UNetMidBlock2DCrossAttn>,
    up_blocks: Vec<UpBlock>,
    conv_norm_out: GroupNorm,
    conv_out: Conv2d,
}

impl UNet2DConditionModel {
    pub const BLOCK: &'static str = "diffusers.UNet2DConditionModel";

    /// Build the model from its weights (the state dict at the `vb`'s root) and its config.
    pub fn new(vb: VarBuilder, cfg: &UNet2DConditionModelConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        check_supported(cfg)?;
        let block = Self::BLOCK;
        let ch = &cfg.block_out_channels;
        let (first, groups) = (ch[0], cfg.norm_num_groups.unwrap_or(0));
        let temb = cfg.time_embed_dim();
        let kernel = |k: usize| {
            if k % 2 == 1 {
                Ok(k)
            } else {
                Err(Error::unsupported(block, format!("an even conv kernel ({k})")))
            }
        };
        let conv_in = Conv2d::load(
            vb.pp("conv_in"),
            cfg.in_channels,
            first,
            kernel(cfg.conv_in_kernel)?,
            true,
        )?;
        let time_proj = Timesteps {
            num_channels: first,
            flip_sin_to_cos: cfg.flip_sin_to_cos,
            downscale_freq_shift: cfg.freq_shift,
        };
        let time_embedding = TimestepEmbedding::new(
            vb.pp("time_embedding"),
            block,
            (first, temb),
            cfg.act_fn,
            cfg.timestep_post_act,
        )?;
        let text_time = text_time(&vb, cfg, temb, Self::BLOCK)?;
        let kw = block_kwargs(cfg, temb)?;
        let down_blocks = down_blocks(&vb, cfg, &kw)?;
        let mid_block = mid_block(&vb, cfg)?;
        let up_blocks = up_blocks(&vb, cfg, &kw)?;
        Ok(Self {
            config: cfg.clone(),
            conv_in,
            time_proj,
            time_embedding,
            text_time,
            down_blocks,
            mid_block,
            up_blocks,
            conv_norm_out: group_norm(vb.pp("conv_norm_out"), block, groups, first, cfg.norm_eps)?,
            conv_out: Conv2d::load(
                vb.pp("conv_out"),
                first,
                cfg.out_channels,
                kernel(cfg.conv_out_kernel)?,
                true,
            )?,
        })
    }

    /// A diffusers model folder (the `unet/` of a pipeline): `config.json` and
    /// `diffusion_pytorch_model.safetensors` (or its sharded `.safetensors.index.json`), the
    /// weights converted to `dtype`. Strict: weights the model does not read are refused by name
    /// (`models::folder`).
    pub fn load(folder: impl AsRef<Path>, dtype: DType, device: &Device) -> Result<Self> {
        let folder = ModelFolder::open(folder.as_ref(), Self::BLOCK)?;
        let cfg = UNet2DConditionModelConfig::from_config_json(&folder.config)?;
        folder.build(Self::BLOCK, dtype, device, |vb| Self::new(vb, &cfg))
    }

    /// The model's config.
    pub fn config(&self) -> &UNet2DConditionModelConfig {
        &self.config
    }

    /// `forward(sample, timestep, encoder_hidden_states)`, candle-transformers' signature:
    /// `sample` `(B, in_channels, H, W)`, `encoder_hidden_states` `(B, tokens, cross_attention_dim)`.
    /// A model with SDXL's `text_time` addition embedding needs [`Self::forward_with`].
    pub fn forward(&self, sample: &Tensor, timestep: f64, encoder_hidden_states: &Tensor) -> Result<Tensor> {
        self.forward_with(sample, timestep, encoder_hidden_states, ForwardArgs::default())
    }

    /// The forward with `added_cond_kwargs` and the attention masks.
    pub fn forward_with(
        &self,
        sample: &Tensor,
        timestep: f64,
        encoder_hidden_states: &Tensor,
        args: ForwardArgs,
    ) -> Result<Tensor> {
        self.check_inputs(sample, encoder_hidden_states, &args)?;
        let sample = if self.config.center_input_sample {
            ((sample * 2.0)? - 1.0)?
        } else {
            sample.clone()
        };
        let emb = self.time_embed(&sample, timestep, args.added_cond)?;
        let ctx = Context {
            temb: &emb,
            encoder_hidden_states: Some(encoder_hidden_states),
            attention_mask: args.attention_mask,
            encoder_attention_mask: args.encoder_attention_mask,
        };
        let h = self.conv_in.forward_traced(&sample, "conv_in", Default::default())?;
        let mut res = vec![h.clone()];
        let mut h = h;
        for (i, down) in self.down_blocks.iter().enumerate() {
            let mut states = vec![];
            h = layer("down_blocks", i, || {
                let (h, s) = down.forward(&h, &ctx)?;
                states = s;
                Ok(h)
            })?;
            res.extend(states);
        }
        if let Some(control) = &args.controlnet {
            if control.down.len() != res.len() {
                return Err(Error::input(
                    Self::BLOCK,
                    "down_block_additional_residuals",
                    format!(
                        "{} tensors for the {} skips of the down path",
                        control.down.len(),
                        res.len()
                    ),
                ));
            }
            for (skip, add) in res.iter_mut().zip(control.down) {
                *skip = crate::ops::add(&*skip, add)?;
            }
        }
        if let Some(mid) = &self.mid_block {
            h = trace::scope("mid_block", || {
                mid.forward(
                    &h,
                    Some(&emb),
                    Some(encoder_hidden_states),
                    ctx.attention_mask,
                    ctx.encoder_attention_mask,
                )
            })?;
            trace::record("mid_block", &h);
        }
        if let Some(control) = &args.controlnet {
            h = crate::ops::add(&h, control.mid)?;
        }
        let h = self.up(h, res, &ctx)?;
        self.out(&h)
    }

    /// The up blocks, each taking its skips from the end of `res`.
    fn up(&self, mut h: Tensor, mut res: Vec<Tensor>, ctx: &Context) -> Result<Tensor> {
        let factor = 1usize << self.up_blocks.len().saturating_sub(1);
        let (_, _, sh, sw) = res[0].dims4()?;
        let forward_size = sh % factor != 0 || sw % factor != 0;
        let last = self.up_blocks.len().saturating_sub(1);
        for (i, up) in self.up_blocks.iter().enumerate() {
            let skips = res.split_off(res.len().saturating_sub(up.skips()));
            let size = match res.last() {
                Some(next) if i != last && forward_size => {
                    let (_, _, nh, nw) = next.dims4()?;
                    Some((nh, nw))
                }
                _ => None,
            };
            h = layer("up_blocks", i, || up.forward(&h, &skips, ctx, size))?;
        }
        Ok(h)
    }

    /// `conv_out(conv_act(conv_norm_out(h)))`.
    fn out(&self, h: &Tensor) -> Result<Tensor> {
        let normed = self.conv_norm_out.forward(h)?;
        trace::record("conv_norm_out", &normed);
        let act = self.config.act_fn.forward(&normed)?;
        trace::record("conv_act", &act);
        let out = self.conv_out.forward_traced(&act, "conv_out", Default::default())?;
        trace::record("output", &out);
        Ok(out)
    }

    /// `emb`: the time embedding (plus SDXL's addition embedding), in `sample`'s dtype.
    fn time_embed(&self, sample: &Tensor, timestep: f64, added: Option<AddedCond>) -> Result<Tensor> {
        let b = sample.dim(0)?;
        // `time_proj`'s float32 output, then `.to(sample.dtype)`.
        let t_emb = self.time_proj.embed(&vec![timestep; b], sample.device())?;
        trace::record("time_proj", &t_emb);
        let t_emb = t_emb.to_dtype(sample.dtype())?;
        let emb = trace::scope("time_embedding", || self.time_embedding.forward(&t_emb))?;
        trace::record("time_embedding", &emb);
        match &self.text_time {
            Some(tt) => tt.add(Self::BLOCK, emb, added),
            None => Ok(emb),
        }
    }

    /// Ranks, float dtypes (one for `sample`, the context and the added conditions), batch.
    fn check_inputs(&self, sample: &Tensor, context: &Tensor, args: &ForwardArgs) -> Result<()> {
        let block = Self::BLOCK;
        crate::validate::input(block, "sample", sample, &[4])?;
        crate::validate::input(block, "encoder_hidden_states", context, &[3])?;
        crate::validate::same_dtype(block, "encoder_hidden_states", context, "sample", sample)?;
        crate::validate::optional_shape(block, "attention_mask", args.attention_mask)?;
        crate::validate::optional_shape(block, "encoder_attention_mask", args.encoder_attention_mask)?;
        if let Some(a) = &args.added_cond {
            for (name, t) in [("text_embeds", a.text_embeds), ("time_ids", a.time_ids)] {
                crate::validate::input(block, name, t, &[2])?;
                crate::validate::same_dtype(block, name, t, "sample", sample)?;
            }
        }
        if let Some(c) = &args.controlnet {
            crate::validate::same_dtype(block, "mid_block_additional_residual", c.mid, "sample", sample)?;
            for t in c.down {
                crate::validate::same_dtype(block, "down_block_additional_residuals", t, "sample", sample)?;
            }
        }
        if sample.dim(1)? != self.config.in_channels {
            return Err(Error::input(
                Self::BLOCK,
                "sample",
                format!(
                    "expected (B, {}, H, W), found {:?}",
                    self.config.in_channels,
                    sample.dims()
                ),
            ));
        }
        self.check_sizes(sample, context)?;
        if context.dim(0)? != sample.dim(0)? {
            return Err(Error::input(
                Self::BLOCK,
                "encoder_hidden_states",
                format!("batch {} for a sample batch of {}", context.dim(0)?, sample.dim(0)?),
            ));
        }
        Ok(())
    }
}

impl UNet2DConditionModel {
    /// What the blocks need of the inputs' sizes: H and W that go through the downsamplers, the
    /// context's width the cross-attention's.
    fn check_sizes(&self, sample: &Tensor, context: &Tensor) -> Result<()> {
        let cfg = &self.config;
        let downsamplers = self.down_blocks.len().saturating_sub(1);
        let need = Downsample2D::min_input(downsamplers, cfg.downsample_padding);
        let (_, _, h, w) = sample.dims4()?;
        if h < need || w < need {
            return Err(Error::input(
                Self::BLOCK,
                "sample",
                format!(
                    "expected H and W ≥ {need}: {downsamplers} downsampling(s) with downsample_padding {} need that \
                     much; found {:?}",
                    cfg.downsample_padding,
                    sample.dims()
                ),
            ));
        }
        let widths = cfg
            .cross_attention_dim
            .expand("cross_attention_dim", cfg.block_out_channels.len())?;
        let width = context.dim(2)?;
        if let Some(want) = widths.iter().find(|&&d| d != width) {
            return Err(Error::input(
                Self::BLOCK,
                "encoder_hidden_states",
                format!(
                    "expected (B, tokens, {want}) (cross_attention_dim), found {:?}",
                    context.dims()
                ),
            ));
        }
        // (SDXL's added conditions: checked where they are used, `TextTime::add`)
        Ok(())
    }
}

/// The options of `__init__` this port does not implement, refused by name.
fn check_supported(cfg: &UNet2DConditionModelConfig) -> Result<()> {
    let block = UNet2DConditionModel::BLOCK;
    let refuse = |what: &str| Err(Error::unsupported(block, what.to_string()));
    if cfg.num_attention_heads.is_some() {
        return Err(Error::config(
            block,
            "num_attention_heads must be null (diffusers 0.42.1 raises ValueError; attention_head_dim is the head count)",
        ));
    }
    if cfg.block_out_channels.is_empty() || cfg.down_block_types.len() != cfg.block_out_channels.len() {
        return Err(Error::config(
            block,
            "down_block_types and block_out_channels need one entry per block",
        ));
    }
    if cfg.up_block_types.len() != cfg.down_block_types.len() {
        return Err(Error::config(
            block,
            "up_block_types needs as many entries as down_block_types",
        ));
    }
    if cfg.norm_num_groups.is_none() {
        return refuse("norm_num_groups null (diffusers' resnets then fail to build)");
    }
    if cfg.time_embedding_type != "positional" {
        return refuse("time_embedding_type other than \"positional\"");
    }
    if cfg.class_embed_type.is_some() || cfg.num_class_embeds.is_some() {
        return refuse("class embeddings (class_embed_type / num_class_embeds)");
    }
    if cfg.encoder_hid_dim.is_some() || cfg.encoder_hid_dim_type.is_some() {
        return refuse("encoder_hid_proj (encoder_hid_dim / encoder_hid_dim_type)");
    }
    if !matches!(cfg.addition_embed_type.as_deref(), None | Some("text_time")) {
        return refuse("addition_embed_type other than \"text_time\" (SDXL)");
    }
    if cfg.time_cond_proj_dim.is_some() {
        return refuse("time_cond_proj_dim (LCM's timestep_cond)");
    }
    if cfg.time_embedding_act_fn.is_some() {
        return refuse("time_embedding_act_fn");
    }
    if cfg.dual_cross_attention || cfg.attention_type != "default" {
        return refuse("dual_cross_attention / attention_type other than \"default\"");
    }
    if cfg.resnet_skip_time_act || cfg.cross_attention_norm.is_some() {
        return refuse("resnet_skip_time_act / cross_attention_norm (SimpleCrossAttn blocks)");
    }
    let known = |t: &String, a: &str, b: &str| t == a || t == b;
    let down_ok = cfg
        .down_block_types
        .iter()
        .all(|t| known(t, DownBlock::CROSS_ATTN, DownBlock::PLAIN));
    let up_ok = cfg
        .up_block_types
        .iter()
        .all(|t| known(t, UpBlock::CROSS_ATTN, UpBlock::PLAIN));
    if !down_ok || !up_ok {
        return refuse("block types other than CrossAttnDownBlock2D, DownBlock2D, CrossAttnUpBlock2D, UpBlock2D");
    }
    if !matches!(cfg.mid_block_type.as_deref(), None | Some("UNetMidBlock2DCrossAttn")) {
        return refuse("mid_block_type other than UNetMidBlock2DCrossAttn or null");
    }
    Ok(())
}

/// The shared kwargs of the down and up blocks' resnets and transformers.
pub(super) fn block_kwargs(cfg: &UNet2DConditionModelConfig, temb: usize) -> Result<BlockKwargs> {
    let block = UNet2DConditionModel::BLOCK;
    let time_embedding_norm = match cfg.resnet_time_scale_shift.as_str() {
        "default" => TimeEmbeddingNorm::Default,
        "scale_shift" => TimeEmbeddingNorm::ScaleShift,
        other => return Err(Error::unsupported(block, format!("resnet_time_scale_shift {other:?}"))),
    };
    let groups = cfg.norm_num_groups.unwrap_or(32);
    Ok(BlockKwargs {
        resnet: ResnetBlock2DConfig {
            temb_channels: Some(temb),
            eps: cfg.norm_eps,
            groups,
            dropout: cfg.dropout,
            time_embedding_norm,
            non_linearity: cfg.act_fn,
            ..ResnetBlock2DConfig::new(1)
        },
        transformer: Transformer2DModelConfig {
            norm_num_groups: groups,
            use_linear_projection: cfg.use_linear_projection,
            upcast_attention: cfg.upcast_attention,
            ..Transformer2DModelConfig::default()
        },
        downsample_padding: cfg.downsample_padding,
    })
}

/// `add_time_proj` and `add_embedding` for `addition_embed_type: "text_time"` (`block`'s).
pub(super) fn text_time(
    vb: &VarBuilder,
    cfg: &UNet2DConditionModelConfig,
    temb: usize,
    block: &'static str,
) -> Result<Option<TextTime>> {
    if cfg.addition_embed_type.as_deref() != Some("text_time") {
        return Ok(None);
    }
    let need = |v: Option<usize>, key: &str| {
        v.ok_or_else(|| Error::config(block, format!("addition_embed_type \"text_time\" needs `{key}`")))
    };
    let dim = need(cfg.addition_time_embed_dim, "addition_time_embed_dim")?;
    let input = need(
        cfg.projection_class_embeddings_input_dim,
        "projection_class_embeddings_input_dim",
    )?;
    Ok(Some(TextTime {
        add_time_proj: Timesteps {
            num_channels: dim,
            flip_sin_to_cos: cfg.flip_sin_to_cos,
            downscale_freq_shift: cfg.freq_shift,
        },
        add_embedding: TimestepEmbedding::new(vb.pp("add_embedding"), block, (input, temb), Activation::Swish, None)?,
        input,
    }))
}

pub(super) fn down_blocks(
    vb: &VarBuilder,
    cfg: &UNet2DConditionModelConfig,
    kw: &BlockKwargs,
) -> Result<Vec<DownBlock>> {
    let ch = &cfg.block_out_channels;
    let args = cfg.down_args()?;
    let mut blocks = Vec::new();
    for (i, (kind, a)) in cfg.down_block_types.iter().zip(&args).enumerate() {
        let input = if i == 0 { ch[0] } else { ch[i - 1] };
        let last = i + 1 == ch.len();
        blocks.push(DownBlock::new(
            vb.pp("down_blocks").pp(i),
            kind,
            (input, ch[i]),
            a,
            kw,
            !last,
        )?);
    }
    Ok(blocks)
}

fn up_blocks(vb: &VarBuilder, cfg: &UNet2DConditionModelConfig, kw: &BlockKwargs) -> Result<Vec<UpBlock>> {
    let rev: Vec<usize> = cfg.block_out_channels.iter().rev().copied().collect();
    let args = cfg.up_args()?;
    let mut blocks = Vec::new();
    let mut out = rev[0];
    for (i, (kind, a)) in cfg.up_block_types.iter().zip(&args).enumerate() {
        let prev = out;
        out = rev[i];
        let ch = UpChannels {
            in_channels: rev[(i + 1).min(rev.len() - 1)],
            out_channels: out,
            prev_output_channel: prev,
        };
        let last = i + 1 == rev.len();
        blocks.push(UpBlock::new(vb.pp("up_blocks").pp(i), kind, ch, a, kw, !last)?);
    }
    Ok(blocks)
}

/// The mid block, with the kwargs `crate::diffusers::model_config` derives from the same config.
fn mid_block(vb: &VarBuilder, cfg: &UNet2DConditionModelConfig) -> Result<Option<UNetMidBlock2DCrossAttn>> {
    let model = (UNet2DConditionModel::BLOCK, ModelClass::UNet2DConditionModel);
    let mid = UNetMidBlock2DCrossAttn::BLOCK;
    unet_blocks::mid_block(vb, model, cfg, mid, |vb, k: &UNetMidBlock2DCrossAttnConfig| {
        UNetMidBlock2DCrossAttn::new(vb, k)
    })
}
