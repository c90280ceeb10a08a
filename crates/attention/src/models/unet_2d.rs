//! diffusers 0.42.1 `UNet2DModel` (`models/unets/unet_2d.py`): the unconditional U-Net of DDPM
//! (`google/ddpm-cifar10-32`, `ddpm-celebahq-256`, ...) and of latent diffusion's unconditional
//! models (`CompVis/ldm-celebahq-256`), the model people train themselves with diffusers'
//! examples.
//!
//! ```text
//! forward(sample, timestep):
//!   sample = 2 * sample - 1                      # center_input_sample
//!   t = torch.tensor([timestep], dtype=long)     # a Python number: truncated toward zero
//!   emb = time_embedding(time_proj(t).to(dtype)) # Timesteps(block_out_channels[0], flip, shift)
//!   h = conv_in(sample); res = (h,)
//!   for down in down_blocks: h, states = down(h, emb); res += states   # DownBlock2D / AttnDownBlock2D
//!   h = mid_block(h, emb)                        # UNetMidBlock2D (attn_norm_num_groups, add_attention)
//!   for up in up_blocks: h = up(h, res[-len(up.resnets):], emb)         # UpBlock2D / AttnUpBlock2D
//!   return conv_out(silu(conv_norm_out(h)))
//! ```
//!
//! Each layer runs in the trace scope of its module path (`down_blocks.1/attentions.0`,
//! `mid_block`, `up_blocks.0/upsamplers.0`), as whole-model bundles name them.

use super::folder::ModelFolder;
use super::time_embedding::{TimestepEmbedding, Timesteps};
use super::unet_2d_config::UNet2DModelConfig;
use super::unet_blocks::{self, image_attention_config, layer, Context, DownBlock, UpBlock, UpChannels};
use crate::diffusers::model_config::ModelClass;
use crate::diffusers::resnet::{ResnetBlock2DConfig, TimeEmbeddingNorm};
use crate::diffusers::{AttentionConfig, UNetMidBlock2D, UNetMidBlock2DConfig};
use crate::layers::{group_norm, Activation, Conv2d, GroupNorm};
use crate::trace;
use crate::{Error, Result};
use candle_core::{DType, Device, Tensor};
use candle_nn::{Module, VarBuilder};
use std::path::Path;

/// `diffusers.models.unets.unet_2d.UNet2DModel`.
#[derive(Debug, Clone)]
pub struct UNet2DModel {
    config: UNet2DModelConfig,
    conv_in: Conv2d,
    time_proj: Timesteps,
    time_embedding: TimestepEmbedding,
    down_blocks: Vec<DownBlock>,
    mid_block: Option<UNetMidBlock2D>,
    up_blocks: Vec<UpBlock>,
    conv_norm_out: GroupNorm,
    conv_out: Conv2d,
}

impl UNet2DModel {
    pub const BLOCK: &'static str = "diffusers.UNet2DModel";

    /// Build the model from its weights (the state dict at the `vb`'s root) and its config.
    pub fn new(vb: VarBuilder, cfg: &UNet2DModelConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        check_supported(cfg)?;
        let ch = &cfg.block_out_channels;
        let (first, temb) = (ch[0], cfg.time_embed_dim());
        let time_embedding =
            TimestepEmbedding::new(vb.pp("time_embedding"), Self::BLOCK, (first, temb), cfg.act_fn, None)?;
        let resnet = resnet_config(cfg, temb)?;
        Ok(Self {
            conv_in: Conv2d::load(vb.pp("conv_in"), cfg.in_channels, first, 3, true)?,
            time_proj: Timesteps {
                num_channels: first,
                flip_sin_to_cos: cfg.flip_sin_to_cos,
                downscale_freq_shift: cfg.freq_shift,
            },
            time_embedding,
            down_blocks: down_blocks(&vb, cfg, &resnet)?,
            mid_block: mid_block(&vb, cfg)?,
            up_blocks: up_blocks(&vb, cfg, &resnet)?,
            conv_norm_out: group_norm(
                vb.pp("conv_norm_out"),
                Self::BLOCK,
                cfg.norm_num_groups,
                first,
                cfg.norm_eps,
            )?,
            conv_out: Conv2d::load(vb.pp("conv_out"), first, cfg.out_channels, 3, true)?,
            config: cfg.clone(),
        })
    }

    /// A diffusers model folder (`config.json` and `diffusion_pytorch_model.safetensors`, or its
    /// sharded index), the weights converted to `dtype`; weights the model does not read are
    /// refused by name.
    pub fn load(folder: impl AsRef<Path>, dtype: DType, device: &Device) -> Result<Self> {
        let folder = ModelFolder::open(folder.as_ref(), Self::BLOCK)?;
        let cfg = UNet2DModelConfig::from_config_json(&folder.config)?;
        folder.build(Self::BLOCK, dtype, device, |vb| Self::new(vb, &cfg))
    }

    /// The model's config.
    pub fn config(&self) -> &UNet2DModelConfig {
        &self.config
    }

    /// `forward(sample, timestep)`: `sample` `(B, in_channels, H, W)` with `H` and `W` multiples
    /// of `2^(down blocks − 1)`; `timestep` as a Python number, truncated to an integer as
    /// diffusers' `torch.tensor([timestep], dtype=torch.long)` truncates it.
    pub fn forward(&self, sample: &Tensor, timestep: f64) -> Result<Tensor> {
        self.check_input(sample, timestep)?;
        let sample = if self.config.center_input_sample {
            ((sample * 2.0)? - 1.0)?
        } else {
            sample.clone()
        };
        let b = sample.dim(0)?;
        let t_emb = self.time_proj.embed(&vec![timestep.trunc(); b], sample.device())?;
        trace::record("time_proj", &t_emb);
        let t_emb = t_emb.to_dtype(sample.dtype())?;
        let emb = trace::scope("time_embedding", || self.time_embedding.forward(&t_emb))?;
        trace::record("time_embedding", &emb);
        let ctx = Context {
            temb: &emb,
            encoder_hidden_states: None,
            attention_mask: None,
            encoder_attention_mask: None,
        };
        let mut h = self.conv_in.forward_traced(&sample, "conv_in", Default::default())?;
        let mut res = vec![h.clone()];
        for (i, down) in self.down_blocks.iter().enumerate() {
            let mut states = vec![];
            h = layer("down_blocks", i, || {
                let (h, s) = down.forward(&h, &ctx)?;
                states = s;
                Ok(h)
            })?;
            res.extend(states);
        }
        if let Some(mid) = &self.mid_block {
            h = trace::scope("mid_block", || mid.forward(&h, Some(&emb)))?;
            trace::record("mid_block", &h);
        }
        for (i, up) in self.up_blocks.iter().enumerate() {
            let skips = res.split_off(res.len().saturating_sub(up.skips()));
            h = layer("up_blocks", i, || up.forward(&h, &skips, &ctx, None))?;
        }
        let normed = self.conv_norm_out.forward(&h)?;
        trace::record("conv_norm_out", &normed);
        let act = Activation::Swish.forward(&normed)?;
        trace::record("conv_act", &act);
        let out = self.conv_out.forward_traced(&act, "conv_out", Default::default())?;
        trace::record("output", &out);
        Ok(out)
    }

    /// Rank, channels, a float dtype, sizes the down and up paths meet at, a finite timestep.
    fn check_input(&self, sample: &Tensor, timestep: f64) -> Result<()> {
        let block = Self::BLOCK;
        crate::validate::input(block, "sample", sample, &[4])?;
        let (b, c, h, w) = sample.dims4()?;
        let f = 1usize << self.down_blocks.len().saturating_sub(1);
        if c != self.config.in_channels || b == 0 || h == 0 || w == 0 || h % f != 0 || w % f != 0 {
            return Err(Error::input(
                block,
                "sample",
                format!(
                    "expected (B ≥ 1, {}, H, W) with H and W multiples of {f} (the down path halves them {} times \
                     and the up path doubles them back), found {:?}",
                    self.config.in_channels,
                    self.down_blocks.len().saturating_sub(1),
                    sample.dims()
                ),
            ));
        }
        if !timestep.is_finite() || timestep.abs() >= 9.0e15 {
            return Err(Error::input(
                block,
                "timestep",
                format!("a finite integer, found {timestep}"),
            ));
        }
        Ok(())
    }
}

/// Refuse what this port does not implement, naming it.
fn check_supported(cfg: &UNet2DModelConfig) -> Result<()> {
    let block = UNet2DModel::BLOCK;
    let refuse = |what: String| Err(Error::unsupported(block, what));
    let n = cfg.block_out_channels.len();
    if n == 0 || cfg.down_block_types.len() != n || cfg.up_block_types.len() != n {
        return Err(Error::config(
            block,
            format!(
                "block_out_channels ({n}), down_block_types ({}) and up_block_types ({}) must have one entry per \
                 block",
                cfg.down_block_types.len(),
                cfg.up_block_types.len()
            ),
        ));
    }
    if cfg.time_embedding_type != "positional" {
        return refuse(format!(
            "time_embedding_type {:?} (only \"positional\")",
            cfg.time_embedding_type
        ));
    }
    if cfg.class_embed_type.is_some() || cfg.num_class_embeds.is_some() {
        return refuse("class embeddings (class_embed_type / num_class_embeds)".into());
    }
    for (key, value) in [
        ("downsample_type", &cfg.downsample_type),
        ("upsample_type", &cfg.upsample_type),
    ] {
        if value != "conv" {
            return refuse(format!("{key} {value:?} (only \"conv\")"));
        }
    }
    for t in &cfg.down_block_types {
        if !matches!(t.as_str(), "DownBlock2D" | "AttnDownBlock2D") {
            return refuse(format!("down block type {t:?} (DownBlock2D and AttnDownBlock2D are)"));
        }
    }
    for t in &cfg.up_block_types {
        if !matches!(t.as_str(), "UpBlock2D" | "AttnUpBlock2D") {
            return refuse(format!("up block type {t:?} (UpBlock2D and AttnUpBlock2D are)"));
        }
    }
    match cfg.mid_block_type.as_deref() {
        None | Some("UNetMidBlock2D") => Ok(()),
        Some(other) => refuse(format!("mid_block_type {other:?}")),
    }
}

/// The resnets' shared config (`in_channels` / `out_channels` set per resnet).
fn resnet_config(cfg: &UNet2DModelConfig, temb: usize) -> Result<ResnetBlock2DConfig> {
    let time_embedding_norm = match cfg.resnet_time_scale_shift.as_str() {
        "default" => TimeEmbeddingNorm::Default,
        "scale_shift" => TimeEmbeddingNorm::ScaleShift,
        other => {
            return Err(Error::unsupported(
                UNet2DModel::BLOCK,
                format!("resnet_time_scale_shift {other:?}"),
            ))
        }
    };
    Ok(ResnetBlock2DConfig {
        temb_channels: Some(temb),
        eps: cfg.norm_eps,
        groups: cfg.norm_num_groups,
        dropout: cfg.dropout,
        time_embedding_norm,
        non_linearity: cfg.act_fn,
        ..ResnetBlock2DConfig::new(1)
    })
}

/// An `Attn*Block2D`'s attention kwargs at `channels`, `None` for a plain block.
fn attention(cfg: &UNet2DModelConfig, kind: &str, channels: usize) -> Result<Option<AttentionConfig>> {
    if !kind.starts_with("Attn") {
        return Ok(None);
    }
    let head_dim = cfg.head_dim(channels);
    image_attention_config(
        UNet2DModel::BLOCK,
        channels,
        head_dim,
        cfg.norm_num_groups,
        cfg.norm_eps,
    )
    .map(Some)
}

fn down_blocks(vb: &VarBuilder, cfg: &UNet2DModelConfig, resnet: &ResnetBlock2DConfig) -> Result<Vec<DownBlock>> {
    let ch = &cfg.block_out_channels;
    let mut blocks = Vec::with_capacity(ch.len());
    for (i, kind) in cfg.down_block_types.iter().enumerate() {
        let input = if i == 0 { ch[0] } else { ch[i - 1] };
        let last = i + 1 == ch.len();
        blocks.push(DownBlock::unconditional(
            vb.pp("down_blocks").pp(i),
            (input, ch[i]),
            cfg.layers_per_block,
            resnet,
            attention(cfg, kind, ch[i])?.as_ref(),
            (!last).then_some(cfg.downsample_padding),
        )?);
    }
    Ok(blocks)
}

fn up_blocks(vb: &VarBuilder, cfg: &UNet2DModelConfig, resnet: &ResnetBlock2DConfig) -> Result<Vec<UpBlock>> {
    let rev: Vec<usize> = cfg.block_out_channels.iter().rev().copied().collect();
    let mut blocks = Vec::with_capacity(rev.len());
    let mut out = rev[0];
    for (i, kind) in cfg.up_block_types.iter().enumerate() {
        let prev = out;
        out = rev[i];
        let ch = UpChannels {
            in_channels: rev[(i + 1).min(rev.len() - 1)],
            out_channels: out,
            prev_output_channel: prev,
        };
        let last = i + 1 == rev.len();
        blocks.push(UpBlock::unconditional(
            vb.pp("up_blocks").pp(i),
            ch,
            cfg.layers_per_block + 1,
            resnet,
            attention(cfg, kind, out)?.as_ref(),
            !last,
        )?);
    }
    Ok(blocks)
}

/// The mid block, with the kwargs `crate::diffusers::model_config` derives from the same config.
fn mid_block(vb: &VarBuilder, cfg: &UNet2DModelConfig) -> Result<Option<UNetMidBlock2D>> {
    let model = (UNet2DModel::BLOCK, ModelClass::UNet2DModel);
    unet_blocks::mid_block(vb, model, cfg, UNetMidBlock2D::BLOCK, |vb, k: &UNetMidBlock2DConfig| {
        UNetMidBlock2D::new(vb, k)
    })
}
