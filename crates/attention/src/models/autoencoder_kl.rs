//! diffusers 0.42.1 `AutoencoderKL` (`models/autoencoders/autoencoder_kl.py`, with `Encoder`,
//! `Decoder` and `DiagonalGaussianDistribution` of `autoencoders/vae.py` and the
//! `DownEncoderBlock2D` / `UpDecoderBlock2D` of `unets/unet_2d_blocks.py`): the VAE of Stable
//! Diffusion 1.x, 2.x and XL, built from the checked blocks ([`ResnetBlock2D`],
//! [`UNetMidBlock2D`], [`Downsample2D`], [`Upsample2D`]).
//!
//! ```text
//! encode(x): moments = quant_conv(encoder(x))              (quant_conv when use_quant_conv)
//!            → DiagonalGaussianDistribution(moments): mean, logvar = chunk(2, dim=1),
//!              logvar.clamp(-30, 20), std = exp(logvar / 2)
//! decode(z): decoder(post_quant_conv(z))                   (post_quant_conv when use_post_quant_conv)
//! forward(x) = decode(encode(x).mode())                    (sample_posterior=False)
//! Encoder: conv_in; down_blocks (resnets, downsamplers.0: 3×3 stride 2 after a (0,1,0,1) pad);
//!          mid_block; conv_norm_out (eps 1e-6); SiLU; conv_out (2 × latent channels)
//! Decoder: conv_in; mid_block; up_blocks (layers_per_block + 1 resnets, upsamplers.0: nearest
//!          ×2 then 3×3); conv_norm_out; SiLU; conv_out
//! ```
//!
//! The scaling factor is the pipeline's: latents = `encode(x).sample() · scaling_factor`, and
//! `decode(latents / scaling_factor)`, as candle-transformers' VAE and diffusers' pipelines.
//! Each module records its output under its module path (`encoder/down_blocks.0/resnets.1`,
//! `quant_conv`, `decoder/up_blocks.0/upsamplers.0`) for `unet-parity check --trace`.

use super::autoencoder_kl_config::AutoencoderKLConfig;
use super::folder::ModelFolder;
use super::unet_blocks::{layer, Downsample2D, Upsample2D};
use crate::cpu_kernels::MemoryFormat;
use crate::diffusers::model_config::{mid_blocks, ModelClass};
use crate::diffusers::resnet::{ResnetBlock2D, ResnetBlock2DConfig};
use crate::diffusers::unets::mid_block::{UNetMidBlock2D, UNetMidBlock2DConfig};
use crate::layers::{group_norm, Activation, Conv2d, GroupNorm};
use crate::trace;
use crate::{Error, Result};
use candle_core::{DType, Device, Tensor};
use candle_nn::{Module, VarBuilder};
use std::path::Path;

const BLOCK: &str = "diffusers.AutoencoderKL";

/// The encoder's output as a distribution over latents (diffusers' `DiagonalGaussianDistribution`,
/// candle-transformers' of the same name).
#[derive(Debug, Clone)]
pub struct DiagonalGaussianDistribution {
    mean: Tensor,
    std: Tensor,
}

impl DiagonalGaussianDistribution {
    /// From the moments `(B, 2·C, h, w)`: the first `C` channels the mean, the rest the log
    /// variance, clamped to [-30, 20].
    pub fn new(moments: &Tensor) -> Result<Self> {
        let c = moments.dim(1)?;
        if c % 2 != 0 {
            return Err(Error::input(
                BLOCK,
                "moments",
                format!("an even channel count, found {:?}", moments.dims()),
            ));
        }
        let mean = moments.narrow(1, 0, c / 2)?;
        let logvar = moments.narrow(1, c / 2, c / 2)?.clamp(-30f32, 20f32)?;
        let std = (logvar * 0.5)?.exp()?;
        Ok(Self { mean, std })
    }

    pub fn mean(&self) -> &Tensor {
        &self.mean
    }

    pub fn std(&self) -> &Tensor {
        &self.std
    }

    /// The mean (diffusers' `mode()`).
    pub fn mode(&self) -> &Tensor {
        &self.mean
    }

    /// `mean + std · noise` with Candle's random normal noise (candle-transformers' `sample`).
    pub fn sample(&self) -> Result<Tensor> {
        self.sample_with(&self.mean.randn_like(0.0, 1.0)?)
    }

    /// `mean + std · noise` for the caller's `noise` (the mean's shape), e.g. the same noise a
    /// PyTorch run drew.
    pub fn sample_with(&self, noise: &Tensor) -> Result<Tensor> {
        if noise.dims() != self.mean.dims() {
            return Err(Error::input(
                BLOCK,
                "noise",
                format!("expected {:?}, found {:?}", self.mean.dims(), noise.dims()),
            ));
        }
        Ok((&self.mean + (&self.std * noise.to_dtype(self.mean.dtype())?)?)?)
    }
}

/// `DownEncoderBlock2D` (resnets without a time embedding, then `Downsample2D(padding=0)`) or
/// `UpDecoderBlock2D` (resnets, then `Upsample2D`).
#[derive(Debug, Clone)]
struct VaeBlock {
    resnets: Vec<ResnetBlock2D>,
    downsampler: Option<Downsample2D>,
    upsampler: Option<Upsample2D>,
}

impl VaeBlock {
    fn resnets(
        vb: &VarBuilder,
        cfg: &AutoencoderKLConfig,
        (c_in, c_out): (usize, usize),
        n: usize,
    ) -> Result<Vec<ResnetBlock2D>> {
        (0..n)
            .map(|i| {
                let rc = ResnetBlock2DConfig {
                    out_channels: Some(c_out),
                    temb_channels: None,
                    eps: 1e-6,
                    groups: cfg.norm_num_groups,
                    non_linearity: cfg.act_fn,
                    ..ResnetBlock2DConfig::new(if i == 0 { c_in } else { c_out })
                };
                ResnetBlock2D::new(vb.pp("resnets").pp(i), &rc)
            })
            .collect()
    }

    /// `x` laid out in PyTorch as `format` (resnets, interpolation and convolutions keep it).
    fn forward(&self, x: &Tensor, format: MemoryFormat) -> Result<Tensor> {
        let mut h = x.clone();
        for (i, r) in self.resnets.iter().enumerate() {
            h = layer("resnets", i, || r.forward_as(&h, None, format))?;
        }
        if let Some(d) = &self.downsampler {
            h = layer("downsamplers", 0, || d.forward(&h))?;
        }
        if let Some(u) = &self.upsampler {
            h = layer("upsamplers", 0, || u.forward(&h, None))?;
        }
        Ok(h)
    }
}

/// The end of the encoder and of the decoder: `conv_out(SiLU(conv_norm_out(h)))`.
#[derive(Debug, Clone)]
struct Head {
    conv_norm_out: GroupNorm,
    act: Activation,
    conv_out: Conv2d,
}

impl Head {
    fn new(vb: &VarBuilder, cfg: &AutoencoderKLConfig, channels: usize, out: usize) -> Result<Self> {
        Ok(Self {
            conv_norm_out: group_norm(vb.pp("conv_norm_out"), BLOCK, cfg.norm_num_groups, channels, 1e-6)?,
            act: Activation::Swish,
            conv_out: Conv2d::load(vb.pp("conv_out"), channels, out, 3, true)?,
        })
    }

    fn forward(&self, h: &Tensor, format: MemoryFormat) -> Result<Tensor> {
        let normed = self.conv_norm_out.forward_as(h, format)?;
        trace::record("conv_norm_out", &normed);
        let act = self.act.forward(&normed)?;
        trace::record("conv_act", &act);
        Ok(self.conv_out.forward_traced(&act, "conv_out", Default::default())?)
    }
}

/// `Encoder` or `Decoder` (diffusers' `vae.py`): `conv_in`, the blocks around the mid block, the head.
#[derive(Debug, Clone)]
struct Coder {
    conv_in: Conv2d,
    blocks: Vec<VaeBlock>,
    mid_block: UNetMidBlock2D,
    head: Head,
    /// The blocks run after the mid block (the decoder's up blocks).
    blocks_after_mid: bool,
}

impl Coder {
    fn encoder(vb: VarBuilder, cfg: &AutoencoderKLConfig, mid: &UNetMidBlock2DConfig) -> Result<Self> {
        let ch = &cfg.block_out_channels;
        let last = ch.len() - 1;
        let mut blocks = Vec::with_capacity(ch.len());
        for (i, &c) in ch.iter().enumerate() {
            let bvb = vb.pp("down_blocks").pp(i);
            let c_in = if i == 0 { ch[0] } else { ch[i - 1] };
            let downsampler = if i < last {
                Some(Downsample2D::new(bvb.pp("downsamplers").pp(0), c, c, 0)?)
            } else {
                None
            };
            blocks.push(VaeBlock {
                resnets: VaeBlock::resnets(&bvb, cfg, (c_in, c), cfg.layers_per_block)?,
                downsampler,
                upsampler: None,
            });
        }
        Ok(Self {
            conv_in: Conv2d::load(vb.pp("conv_in"), cfg.in_channels, ch[0], 3, true)?,
            blocks,
            mid_block: UNetMidBlock2D::new(vb.pp("mid_block"), mid)?,
            head: Head::new(&vb, cfg, ch[last], 2 * cfg.latent_channels)?,
            blocks_after_mid: false,
        })
    }

    fn decoder(vb: VarBuilder, cfg: &AutoencoderKLConfig, mid: &UNetMidBlock2DConfig) -> Result<Self> {
        let rev: Vec<usize> = cfg.block_out_channels.iter().rev().copied().collect();
        let last = rev.len() - 1;
        let mut blocks = Vec::with_capacity(rev.len());
        for (i, &c) in rev.iter().enumerate() {
            let bvb = vb.pp("up_blocks").pp(i);
            let prev = if i == 0 { rev[0] } else { rev[i - 1] };
            let upsampler = if i < last {
                Some(Upsample2D::new(bvb.pp("upsamplers").pp(0), c, c)?)
            } else {
                None
            };
            blocks.push(VaeBlock {
                resnets: VaeBlock::resnets(&bvb, cfg, (prev, c), cfg.layers_per_block + 1)?,
                downsampler: None,
                upsampler,
            });
        }
        Ok(Self {
            conv_in: Conv2d::load(vb.pp("conv_in"), cfg.latent_channels, rev[0], 3, true)?,
            blocks,
            mid_block: UNetMidBlock2D::new(vb.pp("mid_block"), mid)?,
            head: Head::new(&vb, cfg, rev[last], cfg.out_channels)?,
            blocks_after_mid: true,
        })
    }

    /// `x` laid out in PyTorch as `format`; the output with its layout. PyTorch's tensor turns
    /// channels_last at the mid block's attention (see [`UNetMidBlock2D::forward_as`]) and stays
    /// so to the end, so the decoder of `forward` (fed the encoder's output) is channels_last
    /// throughout, that of `decode` from the mid attention on.
    fn forward(&self, x: &Tensor, format: MemoryFormat) -> Result<(Tensor, MemoryFormat)> {
        let mut h = self.conv_in.forward_traced(x, "conv_in", Default::default())?;
        let mut format = format;
        let (name, mid_first) = if self.blocks_after_mid {
            ("up_blocks", true)
        } else {
            ("down_blocks", false)
        };
        if mid_first {
            (h, format) = self.mid(&h, format)?;
        }
        for (i, b) in self.blocks.iter().enumerate() {
            h = layer(name, i, || b.forward(&h, format))?;
        }
        if !mid_first {
            (h, format) = self.mid(&h, format)?;
        }
        Ok((self.head.forward(&h, format)?, format))
    }

    fn mid(&self, h: &Tensor, format: MemoryFormat) -> Result<(Tensor, MemoryFormat)> {
        let (out, format) = trace::scope("mid_block", || self.mid_block.forward_as(h, None, format))?;
        trace::record("mid_block", &out);
        Ok((out, format))
    }
}

/// `diffusers.models.autoencoders.autoencoder_kl.AutoencoderKL`.
#[derive(Debug, Clone)]
pub struct AutoencoderKL {
    config: AutoencoderKLConfig,
    encoder: Coder,
    decoder: Coder,
    quant_conv: Option<Conv2d>,
    post_quant_conv: Option<Conv2d>,
}

impl AutoencoderKL {
    pub const BLOCK: &'static str = BLOCK;

    /// Build the model from its weights (the state dict at the `vb`'s root) and its config.
    pub fn new(vb: VarBuilder, cfg: &AutoencoderKLConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        cfg.check()?;
        let (enc_mid, dec_mid) = mid_configs(cfg)?;
        let latent2 = 2 * cfg.latent_channels;
        let quant_conv = cfg
            .use_quant_conv
            .then(|| Conv2d::load(vb.pp("quant_conv"), latent2, latent2, 1, true))
            .transpose()?;
        let post_quant_conv = cfg
            .use_post_quant_conv
            .then(|| {
                Conv2d::load(
                    vb.pp("post_quant_conv"),
                    cfg.latent_channels,
                    cfg.latent_channels,
                    1,
                    true,
                )
            })
            .transpose()?;
        Ok(Self {
            config: cfg.clone(),
            encoder: Coder::encoder(vb.pp("encoder"), cfg, &enc_mid)?,
            decoder: Coder::decoder(vb.pp("decoder"), cfg, &dec_mid)?,
            quant_conv,
            post_quant_conv,
        })
    }

    /// A diffusers model folder (the `vae/` of a pipeline): `config.json` and
    /// `diffusion_pytorch_model.safetensors` (or its shards), the weights converted to `dtype`.
    /// Strict: weights the model does not read are refused by name.
    pub fn load(folder: impl AsRef<Path>, dtype: DType, device: &Device) -> Result<Self> {
        let folder = ModelFolder::open(folder.as_ref(), Self::BLOCK)?;
        let cfg = AutoencoderKLConfig::from_config_json(&folder.config)?;
        folder.build(Self::BLOCK, dtype, device, |vb| Self::new(vb, &cfg))
    }

    pub fn config(&self) -> &AutoencoderKLConfig {
        &self.config
    }

    /// `encode(x).latent_dist`: `x` `(B, in_channels, H, W)` (images in [-1, 1]), H and W
    /// multiples of 2^(blocks − 1).
    pub fn encode(&self, xs: &Tensor) -> Result<DiagonalGaussianDistribution> {
        Ok(self.encode_as(xs)?.0)
    }

    /// [`Self::encode`], with the layout of PyTorch's moments (that of the encoder's output).
    fn encode_as(&self, xs: &Tensor) -> Result<(DiagonalGaussianDistribution, MemoryFormat)> {
        self.check_input("sample", xs, self.config.in_channels)?;
        let downsamplers = self.config.block_out_channels.len().saturating_sub(1);
        let need = Downsample2D::min_input(downsamplers, 0);
        let (_, _, h, w) = xs.dims4()?;
        if h < need || w < need {
            return Err(Error::input(
                Self::BLOCK,
                "sample",
                format!(
                    "expected (B, {}, H, W) with H and W ≥ {need}: the encoder's {downsamplers} downsampling(s) \
                     (3 × 3, stride 2, padded (0, 1, 0, 1)) need that much; found {:?}",
                    self.config.in_channels,
                    xs.dims()
                ),
            ));
        }
        let (h, format) = trace::scope("encoder", || self.encoder.forward(xs, MemoryFormat::Contiguous))?;
        trace::record("encoder", &h);
        let moments = match &self.quant_conv {
            Some(q) => q.forward_traced(&h, "quant_conv", Default::default())?,
            None => h,
        };
        Ok((DiagonalGaussianDistribution::new(&moments)?, format))
    }

    /// `decode(z).sample`: `z` `(B, latent_channels, h, w)` (latents already divided by the
    /// scaling factor), to `(B, out_channels, h·2^(blocks − 1), w·2^(blocks − 1))`.
    pub fn decode(&self, z: &Tensor) -> Result<Tensor> {
        self.decode_as(z, MemoryFormat::Contiguous)
    }

    /// [`Self::decode`] of a `z` PyTorch lays out as `format` (the mean of `encode`'s moments,
    /// a channel slice of a channels_last tensor, in `forward`).
    fn decode_as(&self, z: &Tensor, format: MemoryFormat) -> Result<Tensor> {
        self.check_input("z", z, self.config.latent_channels)?;
        let z = match &self.post_quant_conv {
            Some(p) => p.forward_traced(z, "post_quant_conv", Default::default())?,
            None => z.clone(),
        };
        let (out, _) = trace::scope("decoder", || self.decoder.forward(&z, format))?;
        trace::record("decoder", &out);
        Ok(out)
    }

    /// `forward(sample, sample_posterior=False)`: `decode(encode(sample).mode())`.
    pub fn forward(&self, sample: &Tensor) -> Result<Tensor> {
        let (posterior, format) = self.encode_as(sample)?;
        let out = self.decode_as(posterior.mode(), format)?;
        trace::record("output", &out);
        Ok(out)
    }

    fn check_input(&self, name: &str, x: &Tensor, channels: usize) -> Result<()> {
        crate::validate::input(Self::BLOCK, name, x, &[4])?;
        if x.dim(1)? != channels {
            return Err(Error::input(
                Self::BLOCK,
                name,
                format!("expected (B, {channels}, H, W), found {:?}", x.dims()),
            ));
        }
        Ok(())
    }
}

/// The encoder's and decoder's `UNetMidBlock2D` kwargs, as `crate::diffusers::model_config`
/// derives them from the same config.
fn mid_configs(cfg: &AutoencoderKLConfig) -> Result<(UNetMidBlock2DConfig, UNetMidBlock2DConfig)> {
    let json = serde_json::to_value(cfg).map_err(|e| Error::config(BLOCK, e.to_string()))?;
    let specs = mid_blocks(&json, Some(ModelClass::AutoencoderKL), false)?;
    let find = |prefix: &str| -> Result<UNetMidBlock2DConfig> {
        let spec = specs
            .iter()
            .find(|s| s.prefix == prefix)
            .ok_or_else(|| Error::config(BLOCK, format!("no {prefix} in the derived mid blocks")))?;
        crate::config::from_json(UNetMidBlock2D::BLOCK, &spec.config)
    };
    Ok((find("encoder.mid_block")?, find("decoder.mid_block")?))
}
