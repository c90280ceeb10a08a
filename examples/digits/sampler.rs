//! The sampling loops of `examples/digits` and its test (`tests/e2e/digits.rs`): our
//! `UNet2DModel` with the DDPM weights `scripts/digits_ddpm.py train` wrote, driven by DDPM and
//! DDIM (`examples/common/schedule.rs`) from noise both sides draw from the same generator
//! ([`normal`]), and the reference file `scripts/digits_ddpm.py sample` wrote from diffusers' run.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{Context as _, Result};
use candle_core::{DType, Device, Tensor};
use unet_attention::models::UNet2DModel;

use crate::schedule::{Ddim, Ddpm, SchedulerConfig};

/// The trained model's folder and the reference run, relative to the repository root.
pub const MODEL: &str = "weights/models/digits_ddpm";
pub const REFERENCE: &str = "weights/whole/digits_samples.safetensors";
/// Samples per run: a 4 × 4 grid.
pub const BATCH: usize = 16;

/// SplitMix64's output function of `x + golden`.
fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `n` standard normal float32 values of stream `stream` of `seed`, the generator
/// `scripts/digits_ddpm.py`'s `normal` implements: key = mix(mix(seed) ^ stream),
/// bits(c) = mix(key + c); pair p takes u = ((bits >> 11) + 0.5) / 2⁵³ from counters 2p and 2p + 1,
/// then Box–Muller in float64 (r = √(−2 ln u₁), r·cos 2πu₂, r·sin 2πu₂), each rounded to float32.
/// Stream 0 is the initial noise, stream k the noise of DDPM's k-th step.
pub fn normal(seed: u64, stream: u64, n: usize) -> Vec<f32> {
    let key = splitmix(splitmix(seed) ^ stream);
    let uniform = |c: u64| ((splitmix(key.wrapping_add(c)) >> 11) as f64 + 0.5) * 2f64.powi(-53);
    let mut out = Vec::with_capacity(n + 1);
    for p in 0..n.div_ceil(2) as u64 {
        let r = (-2.0 * uniform(2 * p).ln()).sqrt();
        let theta = 2.0 * std::f64::consts::PI * uniform(2 * p + 1);
        out.push((r * theta.cos()) as f32);
        out.push((r * theta.sin()) as f32);
    }
    out.truncate(n);
    out
}

/// [`normal`] as a (BATCH, channels, size, size) float32 tensor.
pub fn noise(seed: u64, stream: u64, shape: (usize, usize, usize, usize), dev: &Device) -> Result<Tensor> {
    let n = shape.0 * shape.1 * shape.2 * shape.3;
    Ok(Tensor::from_vec(normal(seed, stream, n), shape, dev)?)
}

/// The model and its scheduler config, from the folder `scripts/digits_ddpm.py` saved.
pub struct Model {
    pub unet: UNet2DModel,
    pub scheduler: SchedulerConfig,
    pub dtype: DType,
    pub dev: Device,
}

impl Model {
    pub fn load(folder: &Path, dtype: DType, dev: &Device) -> Result<Self> {
        let unet = UNet2DModel::load(folder, dtype, dev)?;
        let path = folder.join("scheduler_config.json");
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let json = serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let scheduler = SchedulerConfig::from_json(&json).with_context(|| path.display().to_string())?;
        Ok(Self {
            unet,
            scheduler,
            dtype,
            dev: dev.clone(),
        })
    }

    /// The sample's shape: (BATCH, in_channels, size, size) from the config's `sample_size`.
    pub fn shape(&self) -> Result<(usize, usize, usize, usize)> {
        let cfg = self.unet.config();
        let size = cfg
            .sample_size
            .as_ref()
            .and_then(|v| v.as_u64())
            .context("the config's sample_size is not one number")?;
        Ok((BATCH, cfg.in_channels, size as usize, size as usize))
    }

    /// ε at timestep `t` for the float32 sample `x`, the U-Net in its dtype, ε back in float32.
    fn eps(&self, x: &Tensor, t: usize) -> Result<Tensor> {
        let x = x.to_dtype(self.dtype)?;
        Ok(self.unet.forward(&x, t as f64)?.to_dtype(DType::F32)?)
    }

    /// DDPM from [`normal`]'s stream 0 of `seed`, step k adding stream k's noise.
    pub fn ddpm(&self, ddpm: &Ddpm, seed: u64) -> Result<Tensor> {
        let shape = self.shape()?;
        let dev = &self.dev;
        let mut x = noise(seed, 0, shape, dev)?;
        for (k, &t) in ddpm.timesteps.iter().enumerate() {
            let eps = self.eps(&x, t)?;
            let z = if t > 0 {
                noise(seed, k as u64 + 1, shape, dev)?
            } else {
                x.zeros_like()?
            };
            x = ddpm.step(&eps, t, &x, &z)?;
        }
        Ok(x)
    }

    /// DDIM (eta 0) from [`normal`]'s stream 0 of `seed`: the samples after each step.
    pub fn ddim(&self, ddim: &Ddim, seed: u64) -> Result<Vec<Tensor>> {
        let mut x = noise(seed, 0, self.shape()?, &self.dev)?;
        let mut steps = Vec::with_capacity(ddim.timesteps.len());
        for &t in &ddim.timesteps {
            x = ddim.step(&self.eps(&x, t)?, t, &x)?;
            steps.push(x.clone());
        }
        Ok(steps)
    }
}

/// What `scripts/digits_ddpm.py sample` saved.
pub struct Reference {
    /// Stream 0 of the seed, as Python's generator drew it.
    pub noise: Tensor,
    pub alphas_cumprod: Vec<f32>,
    pub ddpm_timesteps: Vec<usize>,
    pub ddim_timesteps: Vec<usize>,
    /// PyTorch's final samples (BATCH, 1, S, S) in [-1, 1] before quantization.
    pub ddpm: Tensor,
    pub ddim: Tensor,
    /// DDPM with 100 steps (`set_timesteps(100)`): the loop the test runs.
    pub ddpm_short: Tensor,
    pub ddpm_short_timesteps: Vec<usize>,
    /// (steps, BATCH, 1, S, S): DDIM's samples after each step.
    pub ddim_steps: Tensor,
    pub seed: u64,
    pub metadata: HashMap<String, String>,
}

impl Reference {
    pub fn load(path: impl AsRef<Path>, dev: &Device) -> Result<Self> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let (_, header) = safetensors::SafeTensors::read_metadata(&bytes)?;
        let metadata = header.metadata().clone().unwrap_or_default();
        let mut t = candle_core::safetensors::load_buffer(&bytes, dev)?;
        let mut take = |name: &str| {
            t.remove(name)
                .with_context(|| format!("{}: no tensor {name}", path.display()))
        };
        let usizes =
            |v: Tensor| -> Result<Vec<usize>> { Ok(v.to_vec1::<i64>()?.into_iter().map(|x| x as usize).collect()) };
        let seed = metadata
            .get("digits.seed")
            .context("no digits.seed metadata")?
            .parse()?;
        Ok(Self {
            noise: take("noise")?,
            alphas_cumprod: take("alphas_cumprod")?.to_vec1()?,
            ddpm_timesteps: usizes(take("ddpm_timesteps")?)?,
            ddim_timesteps: usizes(take("ddim_timesteps")?)?,
            ddpm: take("ddpm")?,
            ddim: take("ddim")?,
            ddpm_short: take("ddpm_short")?,
            ddpm_short_timesteps: usizes(take("ddpm_short_timesteps")?)?,
            ddim_steps: take("ddim_steps")?,
            seed,
            metadata,
        })
    }
}

/// 8-bit grey values of samples in [-1, 1], as diffusers' `numpy_to_pil` rounds them
/// (`round((x / 2 + 0.5).clamp(0, 1) * 255)`, ties to even).
pub fn to_8bit(samples: &Tensor) -> Result<Vec<u8>> {
    let x = samples.to_dtype(DType::F32)?.affine(0.5, 0.5)?.clamp(0f32, 1f32)?;
    let x = x.flatten_all()?.to_vec1::<f32>()?;
    Ok(x.into_iter().map(|v| (v * 255.0).round_ties_even() as u8).collect())
}

/// A 4 × 4 grid of (16, 1, S, S) samples, tiles one pixel apart on grey 64, every pixel drawn
/// `scale` × `scale` (as `scripts/digits_ddpm.py`'s `grid_png`): (width, height, grey values).
pub fn grid(samples: &Tensor, scale: usize) -> Result<(usize, usize, Vec<u8>)> {
    let (n, _, s, _) = samples.dims4()?;
    let values = to_8bit(&samples.narrow(1, 0, 1)?)?;
    let pitch = s + 1;
    let side = 4 * pitch - 1;
    let mut small = vec![64u8; side * side];
    for (i, tile) in values.chunks(s * s).take(n.min(16)).enumerate() {
        let (top, left) = (i / 4 * pitch, i % 4 * pitch);
        for (y, row) in tile.chunks(s).enumerate() {
            small[(top + y) * side + left..][..s].copy_from_slice(row);
        }
    }
    let big = side * scale;
    let img = (0..big * big)
        .map(|i| small[i / big / scale * side + i % big / scale])
        .collect();
    Ok((big, big, img))
}

/// Two grids beside each other (ours left, PyTorch's right), a mid-grey bar between.
pub fn side_by_side(left: &Tensor, right: &Tensor, scale: usize) -> Result<(usize, usize, Vec<u8>)> {
    let (w, h, a) = grid(left, scale)?;
    let (_, _, b) = grid(right, scale)?;
    let bar = 2 * scale;
    let width = 2 * w + bar;
    let mut img = Vec::with_capacity(width * h);
    for y in 0..h {
        img.extend_from_slice(&a[y * w..(y + 1) * w]);
        img.extend(std::iter::repeat_n(128u8, bar));
        img.extend_from_slice(&b[y * w..(y + 1) * w]);
    }
    Ok((width, h, img))
}

/// Max |a − b| over all elements, in float32.
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> Result<f32> {
    Ok((a.to_dtype(DType::F32)? - b.to_dtype(DType::F32)?)?
        .abs()?
        .flatten_all()?
        .max(0)?
        .to_scalar()?)
}

/// How many 8-bit values of the two sample sets differ.
pub fn differing_8bit(a: &Tensor, b: &Tensor) -> Result<usize> {
    let (a, b) = (to_8bit(a)?, to_8bit(b)?);
    Ok(a.iter().zip(&b).filter(|(x, y)| x != y).count())
}
