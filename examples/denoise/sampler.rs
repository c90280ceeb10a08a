//! The denoising loop shared by `examples/denoise` and its test (`tests/e2e/denoise.rs`): a plain
//! DDIM scheduler, classifier-free guidance over our `UNet2DConditionModel`, our `AutoencoderKL`'s
//! decoder, and the reference file `scripts/denoise.py` writes from diffusers' run of the same loop.
//!
//! The arithmetic follows PyTorch's operation by operation, so that in float32 the scheduler adds
//! no error of its own: the schedule's scalars are float32 as diffusers' 0-d tensors are, every
//! tensor operation is the one PyTorch does (a true division where it divides), and the only
//! differences left are the models'.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context as _, Result};
use candle_core::{DType, Device, Tensor};
use unet_attention::models::{AutoencoderKL, UNet2DConditionModel};

/// The reference file, relative to the repository root.
pub const REFERENCE: &str = "weights/whole/denoise_sd1.safetensors";
/// The tiny models the loop runs (the ones `scripts/denoise.py` loads).
pub const UNET: &str = "weights/models/diffusers_sd1";
pub const VAE: &str = "weights/models/diffusers_vae";

pub use crate::schedule::Ddim;
use crate::schedule::SchedulerConfig;

/// Stable Diffusion 1.5's scheduler config: `scaled_linear` betas from 0.00085 to 0.012 over 1000
/// training steps, `set_alpha_to_one = false`, `leading` timestep spacing with `steps_offset = 1`,
/// epsilon prediction, no clipping.
pub fn sd15_scheduler() -> SchedulerConfig {
    SchedulerConfig {
        num_train_timesteps: 1000,
        beta_start: 0.00085,
        beta_end: 0.012,
        beta_schedule: "scaled_linear".into(),
        clip_sample: None,
        set_alpha_to_one: false,
        steps_offset: 1,
    }
}

impl Ddim {
    /// DDIM with eta 0 and [`sd15_scheduler`]'s config.
    pub fn new(steps: usize) -> Result<Self> {
        Self::with_config(&sd15_scheduler(), steps)
    }
}

/// What `scripts/denoise.py` saved: the loop's inputs and PyTorch's results.
pub struct Reference {
    /// Initial latents (1, 4, S, S).
    pub noise: Tensor,
    /// (2, 7, 24): the unconditional context, then the conditional one.
    pub context: Tensor,
    /// The schedule diffusers used.
    pub timesteps: Vec<usize>,
    pub alphas_cumprod: Vec<f32>,
    /// (steps, 1, 4, S, S): PyTorch's latents after each step (float32 run).
    pub latents: Tensor,
    /// (1, 3, 2S, 2S) in [0, 1]: PyTorch's float32 image before 8-bit quantization, and the same
    /// loop run by PyTorch with both models in float16 / bfloat16 (stored as float32).
    pub image: Tensor,
    pub image_f16: Tensor,
    pub image_bf16: Tensor,
    pub guidance_scale: f64,
    /// The file's metadata (the settings and the torch / diffusers versions).
    pub metadata: HashMap<String, String>,
}

impl Reference {
    pub fn load(path: impl AsRef<Path>, device: &Device) -> Result<Self> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let (_, header) = safetensors::SafeTensors::read_metadata(&bytes)?;
        let metadata = header.metadata().clone().unwrap_or_default();
        let mut t = candle_core::safetensors::load_buffer(&bytes, device)?;
        let mut take = |name: &str| {
            t.remove(name)
                .with_context(|| format!("{}: no tensor {name}", path.display()))
        };
        let usizes = |v: Vec<i64>| v.into_iter().map(|x| x as usize).collect();
        let guidance_scale = metadata
            .get("denoise.guidance_scale")
            .context("no denoise.guidance_scale metadata")?
            .parse()?;
        Ok(Self {
            noise: take("noise")?,
            context: take("context")?,
            timesteps: usizes(take("timesteps")?.to_vec1()?),
            alphas_cumprod: take("alphas_cumprod")?.to_vec1()?,
            latents: take("latents")?,
            image: take("image")?,
            image_f16: take("image_f16")?,
            image_bf16: take("image_bf16")?,
            guidance_scale,
            metadata,
        })
    }

    /// The steps PyTorch took.
    pub fn steps(&self) -> usize {
        self.timesteps.len()
    }
}

/// The loop's result: the latents after each step (float32) and the image in [0, 1] (float32).
pub struct Denoised {
    pub latents: Vec<Tensor>,
    pub image: Tensor,
}

/// A VAE decoder: latents (already divided by the scaling factor) to an image in [-1, 1].
pub type Decode = Box<dyn Fn(&Tensor) -> Result<Tensor>>;

/// Our two models as the loop runs them, in one dtype.
pub struct Models {
    pub unet: UNet2DConditionModel,
    /// Our VAE's decoder, taking latents already divided by the scaling factor.
    pub decode: Decode,
    /// The VAE's `scaling_factor` (0.18215 here, as SD 1.x's).
    pub scaling_factor: f64,
    pub dtype: DType,
}

impl Models {
    /// The tiny models of [`UNET`] and [`VAE`], `root` the repository's root.
    pub fn load(root: &Path, dtype: DType, device: &Device) -> Result<Self> {
        let unet = UNet2DConditionModel::load(root.join(UNET), dtype, device)?;
        let vae = AutoencoderKL::load(root.join(VAE), dtype, device)?;
        let scaling_factor = vae.config().scaling_factor;
        Ok(Self {
            unet,
            decode: Box::new(move |z| Ok(vae.decode(z)?)),
            scaling_factor,
            dtype,
        })
    }
}

/// Classifier-free guidance on the U-Net's batch of two (unconditional first):
/// ε_uncond + scale · (ε_cond − ε_uncond).
pub fn guide(eps: &Tensor, scale: f64) -> Result<Tensor> {
    let uncond = eps.narrow(0, 0, 1)?;
    let cond = eps.narrow(0, 1, 1)?;
    Ok((&uncond + (cond - &uncond)?.affine(scale, 0.0)?)?)
}

/// Runs the loop from `noise` with the contexts (2, 7, 24): the U-Net in the models' dtype on the
/// latents (and contexts) cast to it, the guidance and the DDIM step in float32 (the latents cast
/// back to the models' dtype after each step), then the decoder on the last latents divided by
/// the scaling factor, and `(x / 2 + 0.5).clamp(0, 1)` in float32.
pub fn denoise(
    models: &Models,
    ddim: &Ddim,
    noise: &Tensor,
    context: &Tensor,
    guidance_scale: f64,
) -> Result<Denoised> {
    let dtype = models.dtype;
    let context = context.to_dtype(dtype)?;
    let mut latents = noise.to_dtype(dtype)?;
    let mut trajectory = Vec::with_capacity(ddim.timesteps.len());
    for &t in &ddim.timesteps {
        let both = Tensor::cat(&[&latents, &latents], 0)?;
        let eps = models.unet.forward(&both, t as f64, &context)?.to_dtype(DType::F32)?;
        let eps = guide(&eps, guidance_scale)?;
        let next = ddim.step(&eps, t, &latents.to_dtype(DType::F32)?)?;
        latents = next.to_dtype(dtype)?;
        trajectory.push(next);
    }
    // latents / scaling_factor: a true division by the float32 factor, as PyTorch's.
    let scale = Tensor::new(models.scaling_factor as f32, latents.device())?.to_dtype(dtype)?;
    let image = (models.decode)(&latents.broadcast_div(&scale)?)?.to_dtype(DType::F32)?;
    let image = image.affine(0.5, 0.5)?.clamp(0f32, 1f32)?;
    Ok(Denoised {
        latents: trajectory,
        image,
    })
}

/// The image (1, 3, H, W) in [0, 1] as 8-bit RGB rows, rounded as diffusers' `numpy_to_pil`
/// does (`round(x * 255)` in float32, ties to even).
pub fn to_8bit(image: &Tensor) -> Result<(usize, usize, Vec<u8>)> {
    let (_, _, h, w) = image.dims4()?;
    let hwc = image.squeeze(0)?.permute((1, 2, 0))?.flatten_all()?.to_vec1::<f32>()?;
    Ok((
        w,
        h,
        hwc.into_iter().map(|x| (x * 255.0).round_ties_even() as u8).collect(),
    ))
}

/// Max |a − b| over all elements, in float32.
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
    Ok((a.to_dtype(DType::F32)? - b.to_dtype(DType::F32)?)?
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_scalar()?)
}

/// How many 8-bit values of the two images differ.
pub fn differing_8bit(a: &Tensor, b: &Tensor) -> Result<usize> {
    let (_, _, a) = to_8bit(a)?;
    let (_, _, b) = to_8bit(b)?;
    Ok(a.iter().zip(&b).filter(|(x, y)| x != y).count())
}
