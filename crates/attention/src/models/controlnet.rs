//! diffusers 0.42.1 `ControlNetModel` (`models/controlnets/controlnet.py`), SD 1.x / 2.x layout:
//! the U-Net's down half and mid block (the same blocks as [`super::UNet2DConditionModel`]'s), a
//! conditioning embedding for the control image, and zero convolutions turning every skip and the
//! mid output into the residuals the U-Net adds ([`ControlNetResiduals`]).
//!
//! ```text
//! forward(sample, timestep, encoder_hidden_states, controlnet_cond, conditioning_scale):
//!   emb = time_embedding(time_proj(timestep).to(dtype))   (+ SDXL's add_embedding, as the U-Net's)
//!   if controlnet_conditioning_channel_order == "bgr": controlnet_cond = flip(controlnet_cond, [1])
//!   h = conv_in(sample) + controlnet_cond_embedding(controlnet_cond)
//!   res = (h,); for down in down_blocks: h, states = down(h, emb, context); res += states
//!   h = mid_block(h, emb, context)
//!   down = [controlnet_down_blocks[i](r) * conditioning_scale for i, r in enumerate(res)]
//!   mid = controlnet_mid_block(h) * conditioning_scale
//!   guess_mode (without global_pool_conditions): the residuals times
//!     logspace(-1, 0, len(down) + 1) * conditioning_scale instead (0.1 ... 1, the mid's 1)
//!   global_pool_conditions: every residual (down and mid) mean-pooled over H, W
//! controlnet_cond_embedding(c): silu(conv_in(c)), then per block silu(conv), the odd ones stride 2;
//!   conv_out (to block_out_channels[0])
//! ```
//!
//! SDXL ControlNets (`addition_embed_type` "text_time") add the embedding of their added
//! conditions to `emb` as the U-Net does ([`ControlNetArgs::added_cond`]). Stages are recorded by module path
//! (`controlnet_cond_embedding/blocks.1`, `down_blocks.0/resnets.1`, `controlnet_down_blocks.3`).
//!
//! [`ControlNetResiduals`]: super::ControlNetResiduals

use super::controlnet_config::ControlNetModelConfig;
use super::folder::ModelFolder;
use super::time_embedding::{TimestepEmbedding, Timesteps};
use super::unet_2d_condition::{block_kwargs, down_blocks, text_time, AddedCond, TextTime};
use super::unet_blocks::{layer, Context, DownBlock, Downsample2D};
use crate::cpu_kernels::ConvExtras;
use crate::diffusers::controlnets::controlnet::{mean_hw, scale, ControlNetMidBlock, ControlNetMidBlockConfig};
use crate::diffusers::model_config::{mid_blocks, ModelClass};
use crate::layers::Conv2d;
use crate::trace;
use crate::{Error, Result};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use std::path::Path;

/// `ControlNetConditioningEmbedding`: the control image to the width of `conv_in`'s output.
#[derive(Debug, Clone)]
struct ConditioningEmbedding {
    conv_in: Conv2d,
    /// (same-size conv, stride-2 conv) per level after the first.
    blocks: Vec<(Conv2d, Downsample2D)>,
    conv_out: Conv2d,
}

impl ConditioningEmbedding {
    fn new(vb: VarBuilder, cond_channels: usize, widths: &[usize], out: usize) -> Result<Self> {
        let first = *widths
            .first()
            .ok_or_else(|| Error::config(ControlNetModel::BLOCK, "conditioning_embedding_out_channels is empty"))?;
        let mut blocks = Vec::new();
        for (i, pair) in widths.windows(2).enumerate() {
            let (c_in, c_out) = (pair[0], pair[1]);
            let same = Conv2d::load(vb.pp("blocks").pp(2 * i), c_in, c_in, 3, true)?;
            let down = Downsample2D::at(vb.pp("blocks").pp(2 * i + 1), c_in, c_out, 1)?;
            blocks.push((same, down));
        }
        Ok(Self {
            conv_in: Conv2d::load(vb.pp("conv_in"), cond_channels, first, 3, true)?,
            blocks,
            conv_out: Conv2d::load(vb.pp("conv_out"), *widths.last().unwrap_or(&first), out, 3, true)?,
        })
    }

    fn forward(&self, cond: &Tensor) -> Result<Tensor> {
        let silu = |x: &Tensor| candle_nn::Module::forward(&crate::layers::Activation::Swish, x);
        let mut h = silu(&self.conv_in.forward_traced(cond, "conv_in", ConvExtras::default())?)?;
        for (i, (same, down)) in self.blocks.iter().enumerate() {
            h = silu(&same.forward_traced(&h, &format!("blocks.{}", 2 * i), ConvExtras::default())?)?;
            let d = down.forward(&h)?;
            trace::record(&format!("blocks.{}", 2 * i + 1), &d);
            h = silu(&d)?;
        }
        Ok(self.conv_out.forward_traced(&h, "conv_out", ConvExtras::default())?)
    }
}

/// A ControlNet's output: one residual per skip of the U-Net's down path, and the mid block's.
#[derive(Debug, Clone)]
pub struct ControlNetOutput {
    pub down: Vec<Tensor>,
    pub mid: Tensor,
}

impl ControlNetOutput {
    /// The residuals as [`super::UNet2DConditionModel::forward_with`] takes them.
    pub fn residuals(&self) -> super::ControlNetResiduals<'_> {
        super::ControlNetResiduals {
            down: &self.down,
            mid: &self.mid,
        }
    }
}

/// The arguments of `ControlNetModel.forward` besides the tensors every call takes.
#[derive(Debug, Clone, Copy)]
pub struct ControlNetArgs<'a> {
    /// `conditioning_scale` (1.0 by default).
    pub conditioning_scale: f64,
    /// `guess_mode`: the residuals times `logspace(-1, 0, n)` (ignored with
    /// `global_pool_conditions`, as diffusers ignores it).
    pub guess_mode: bool,
    /// `added_cond_kwargs` (SDXL ControlNets: required).
    pub added_cond: Option<AddedCond<'a>>,
}

impl Default for ControlNetArgs<'_> {
    fn default() -> Self {
        Self {
            conditioning_scale: 1.0,
            guess_mode: false,
            added_cond: None,
        }
    }
}

/// `diffusers.models.controlnets.controlnet.ControlNetModel`.
#[derive(Debug, Clone)]
pub struct ControlNetModel {
    config: ControlNetModelConfig,
    conv_in: Conv2d,
    time_proj: Timesteps,
    time_embedding: TimestepEmbedding,
    text_time: Option<TextTime>,
    cond_embedding: ConditioningEmbedding,
    down_blocks: Vec<DownBlock>,
    controlnet_down_blocks: Vec<Conv2d>,
    mid: ControlNetMidBlock,
}

impl ControlNetModel {
    pub const BLOCK: &'static str = "diffusers.ControlNetModel";

    /// Build the model from its weights (the state dict at the `vb`'s root) and its config.
    pub fn new(vb: VarBuilder, cfg: &ControlNetModelConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        check_supported(cfg)?;
        let unet = cfg.unet_config();
        let first = cfg.block_out_channels[0];
        let temb = first * 4;
        let kw = block_kwargs(&unet, temb)?;
        let widths = cfg.conditioning_embedding_out_channels.clone().unwrap_or_default();
        let mut zero = vec![Conv2d::load(
            vb.pp("controlnet_down_blocks").pp(0),
            first,
            first,
            1,
            true,
        )?];
        let layers = cfg.layers_per_block;
        for (i, &ch) in cfg.block_out_channels.iter().enumerate() {
            let last = i + 1 == cfg.block_out_channels.len();
            for _ in 0..layers + usize::from(!last) {
                let vb = vb.pp("controlnet_down_blocks").pp(zero.len());
                zero.push(Conv2d::load(vb, ch, ch, 1, true)?);
            }
        }
        Ok(Self {
            config: cfg.clone(),
            conv_in: Conv2d::load(vb.pp("conv_in"), cfg.in_channels, first, 3, true)?,
            time_proj: Timesteps {
                num_channels: first,
                flip_sin_to_cos: cfg.flip_sin_to_cos,
                downscale_freq_shift: cfg.freq_shift,
            },
            time_embedding: TimestepEmbedding::new(
                vb.pp("time_embedding"),
                Self::BLOCK,
                (first, temb),
                cfg.act_fn,
                None,
            )?,
            text_time: text_time(&vb, &unet, temb, Self::BLOCK)?,
            cond_embedding: ConditioningEmbedding::new(
                vb.pp("controlnet_cond_embedding"),
                cfg.conditioning_channels,
                &widths,
                first,
            )?,
            down_blocks: down_blocks(&vb, &unet, &kw)?,
            controlnet_down_blocks: zero,
            mid: ControlNetMidBlock::new(vb.clone(), &mid_config(cfg)?)?,
        })
    }

    /// A diffusers model folder (a ControlNet repository): `config.json` and the safetensors.
    /// Strict: weights the model does not read are refused by name.
    pub fn load(folder: impl AsRef<Path>, dtype: DType, device: &Device) -> Result<Self> {
        let folder = ModelFolder::open(folder.as_ref(), Self::BLOCK)?;
        let cfg = ControlNetModelConfig::from_config_json(&folder.config)?;
        folder.build(Self::BLOCK, dtype, device, |vb| Self::new(vb, &cfg))
    }

    pub fn config(&self) -> &ControlNetModelConfig {
        &self.config
    }

    /// `forward(sample, timestep, encoder_hidden_states, controlnet_cond, conditioning_scale)`:
    /// `sample` `(B, in_channels, H, W)`, `controlnet_cond` `(B, conditioning_channels, 8H, 8W)`
    /// for SD's three stride-2 embedding levels (2^levels − 1 times H in general).
    pub fn forward(
        &self,
        sample: &Tensor,
        timestep: f64,
        encoder_hidden_states: &Tensor,
        controlnet_cond: &Tensor,
        conditioning_scale: f64,
    ) -> Result<ControlNetOutput> {
        let args = ControlNetArgs {
            conditioning_scale,
            ..ControlNetArgs::default()
        };
        self.forward_with(sample, timestep, encoder_hidden_states, controlnet_cond, args)
    }

    /// [`Self::forward`] with the other arguments of diffusers' forward ([`ControlNetArgs`]):
    /// `guess_mode` (the residuals scaled from 0.1, the first, to 1, the mid block's,
    /// logarithmically, times `conditioning_scale`) and SDXL's `added_cond_kwargs`.
    pub fn forward_with(
        &self,
        sample: &Tensor,
        timestep: f64,
        encoder_hidden_states: &Tensor,
        controlnet_cond: &Tensor,
        args: ControlNetArgs,
    ) -> Result<ControlNetOutput> {
        let (conditioning_scale, guess_mode) = (args.conditioning_scale, args.guess_mode);
        self.check_inputs(sample, encoder_hidden_states, controlnet_cond)?;
        let b = sample.dim(0)?;
        let t_emb = self.time_proj.embed(&vec![timestep; b], sample.device())?;
        trace::record("time_proj", &t_emb);
        let t_emb = t_emb.to_dtype(sample.dtype())?;
        let emb = trace::scope("time_embedding", || self.time_embedding.forward(&t_emb))?;
        trace::record("time_embedding", &emb);
        let emb = match &self.text_time {
            Some(tt) => tt.add(Self::BLOCK, emb, args.added_cond)?,
            None => emb,
        };
        let cond = match self.config.controlnet_conditioning_channel_order.as_str() {
            "bgr" => flip_channels(controlnet_cond)?,
            _ => controlnet_cond.clone(),
        };
        let h = self.conv_in.forward_traced(sample, "conv_in", ConvExtras::default())?;
        let cond = trace::scope("controlnet_cond_embedding", || self.cond_embedding.forward(&cond))?;
        trace::record("controlnet_cond_embedding", &cond);
        let mut h = crate::ops::add(&h, &cond)?;
        let ctx = Context {
            temb: &emb,
            encoder_hidden_states: Some(encoder_hidden_states),
            attention_mask: None,
            encoder_attention_mask: None,
        };
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
        let guess = guess_mode && !self.config.global_pool_conditions;
        let scales = residual_scales(res.len(), conditioning_scale, guess);
        let (mid, _) = self
            .mid
            .residual(&h, Some(&emb), Some(encoder_hidden_states), None, scales[res.len()])?;
        let mut down = Vec::with_capacity(res.len());
        for (i, (r, conv)) in res.iter().zip(&self.controlnet_down_blocks).enumerate() {
            let z = conv.forward_traced(r, &format!("controlnet_down_blocks.{i}"), ConvExtras::default())?;
            let z = scale(&z, scales[i])?;
            down.push(if self.config.global_pool_conditions {
                mean_hw(&z)?
            } else {
                z
            });
        }
        Ok(ControlNetOutput { down, mid })
    }

    fn check_inputs(&self, sample: &Tensor, context: &Tensor, cond: &Tensor) -> Result<()> {
        let block = Self::BLOCK;
        crate::validate::input(block, "sample", sample, &[4])?;
        crate::validate::input(block, "encoder_hidden_states", context, &[3])?;
        crate::validate::input(block, "controlnet_cond", cond, &[4])?;
        crate::validate::same_dtype(block, "encoder_hidden_states", context, "sample", sample)?;
        crate::validate::same_dtype(block, "controlnet_cond", cond, "sample", sample)?;
        let (b, c, h, w) = sample.dims4()?;
        let levels = self.cond_embedding.blocks.len();
        let want = (b, self.config.conditioning_channels, h << levels, w << levels);
        if cond.dims4()? != want || c != self.config.in_channels {
            return Err(Error::input(
                block,
                "controlnet_cond",
                format!(
                    "expected sample (B, {}, H, W) and controlnet_cond (B, {}, H·{f}, W·{f}) (the embedding's {levels} \
                     stride-2 convolutions), found {:?} and {:?}",
                    self.config.in_channels,
                    self.config.conditioning_channels,
                    sample.dims(),
                    cond.dims(),
                    f = 1usize << levels,
                ),
            ));
        }
        if context.dim(0)? != b || context.dim(2)? != self.config.cross_attention_dim {
            return Err(Error::input(
                block,
                "encoder_hidden_states",
                format!(
                    "expected ({b}, tokens, {}) (cross_attention_dim), found {:?}",
                    self.config.cross_attention_dim,
                    context.dims()
                ),
            ));
        }
        Ok(())
    }
}

/// `torch.flip(x, dims=[1])`.
fn flip_channels(x: &Tensor) -> Result<Tensor> {
    let c = x.dim(1)?;
    let idx: Vec<u32> = (0..c as u32).rev().collect();
    let idx = Tensor::new(idx.as_slice(), x.device())?;
    Ok(x.index_select(&idx, 1)?)
}

/// The mid block's kwargs as `crate::diffusers::model_config` derives them from the same config.
fn mid_config(cfg: &ControlNetModelConfig) -> Result<ControlNetMidBlockConfig> {
    let json = serde_json::to_value(cfg).map_err(|e| Error::config(ControlNetModel::BLOCK, e.to_string()))?;
    let specs = mid_blocks(&json, Some(ModelClass::ControlNetModel), false)?;
    let spec = specs
        .into_iter()
        .find(|s| s.block == ControlNetMidBlock::BLOCK)
        .ok_or_else(|| Error::config(ControlNetModel::BLOCK, "no mid block derived (mid_block_type null?)"))?;
    crate::config::from_json(ControlNetMidBlock::BLOCK, &spec.config)
}

/// The options of `__init__` this port does not implement, refused by name.
fn check_supported(cfg: &ControlNetModelConfig) -> Result<()> {
    let refuse = |what: &str| Err(Error::unsupported(ControlNetModel::BLOCK, what.to_string()));
    if cfg.block_out_channels.is_empty() || cfg.down_block_types.len() != cfg.block_out_channels.len() {
        return Err(Error::config(
            ControlNetModel::BLOCK,
            "down_block_types and block_out_channels need one entry per block",
        ));
    }
    if cfg.class_embed_type.is_some() || cfg.num_class_embeds.is_some() {
        return refuse("class embeddings (class_embed_type / num_class_embeds)");
    }
    if cfg.addition_embed_type.as_deref().is_some_and(|t| t != "text_time") {
        return refuse("addition_embed_type other than SDXL's \"text_time\"");
    }
    if cfg.encoder_hid_dim.is_some() || cfg.encoder_hid_dim_type.is_some() {
        return refuse("encoder_hid_proj (encoder_hid_dim / encoder_hid_dim_type)");
    }
    if cfg.mid_block_type.is_none() {
        return refuse("mid_block_type null");
    }
    if !matches!(cfg.controlnet_conditioning_channel_order.as_str(), "rgb" | "bgr") {
        return refuse("controlnet_conditioning_channel_order other than \"rgb\" or \"bgr\"");
    }
    if cfg
        .conditioning_embedding_out_channels
        .as_ref()
        .is_none_or(|w| w.is_empty())
    {
        return refuse("conditioning_embedding_out_channels null or empty");
    }
    Ok(())
}

/// The scale of each of the `down` residuals and, last, the mid block's: `conditioning_scale`
/// for all, or with `guess` `torch.logspace(-1, 0, down + 1) * conditioning_scale` as diffusers
/// computes it (the powers in float64 rounded to float32, as PyTorch's CPU `logspace`; the
/// product rounded to float32).
fn residual_scales(down: usize, conditioning_scale: f64, guess: bool) -> Vec<f64> {
    if !guess {
        return vec![conditioning_scale; down + 1];
    }
    (0..=down)
        .map(|i| {
            let power = 10f64.powf(-1.0 + i as f64 / down.max(1) as f64) as f32;
            (power * conditioning_scale as f32) as f64
        })
        .collect()
}
