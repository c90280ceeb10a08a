//! diffusers 0.42.1's `DDPMScheduler` and `DDIMScheduler` (eta 0) for epsilon-predicting models,
//! shared by the sampling examples (`examples/denoise`, `examples/digits`) and their tests.
//!
//! The arithmetic follows PyTorch's operation by operation, so that in float32 a scheduler adds
//! no error of its own: ᾱ is built as torch builds it (a float32 `linspace`, a `cumprod`
//! accumulated in float64 on the CPU), the scalars of a step are float32 as diffusers' 0-d tensors
//! are, and each tensor operation is the one PyTorch does, in its order.

use anyhow::{bail, Context as _, Result};
use candle_core::Tensor;
use serde_json::Value;

/// The fields of a `scheduler_config.json` the two schedulers read, with diffusers' defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerConfig {
    pub num_train_timesteps: usize,
    pub beta_start: f64,
    pub beta_end: f64,
    /// `linear` or `scaled_linear`.
    pub beta_schedule: String,
    /// `Some(range)`: x₀ predictions clamped to ±range (`clip_sample`, `clip_sample_range`).
    pub clip_sample: Option<f32>,
    /// DDIM only: ᾱ past the last timestep is 1 (else ᾱ_0).
    pub set_alpha_to_one: bool,
    /// `leading` spacing only: added to every timestep.
    pub steps_offset: usize,
}

impl Default for SchedulerConfig {
    /// `DDPMScheduler()` / `DDIMScheduler()`: 1000 linear betas from 1e-4 to 0.02, clipping to ±1.
    fn default() -> Self {
        Self {
            num_train_timesteps: 1000,
            beta_start: 1e-4,
            beta_end: 0.02,
            beta_schedule: "linear".into(),
            clip_sample: Some(1.0),
            set_alpha_to_one: true,
            steps_offset: 0,
        }
    }
}

impl SchedulerConfig {
    /// From a `scheduler_config.json`'s object; settings these schedulers do not implement
    /// (another prediction type, variance type, spacing, thresholding) are refused by name.
    pub fn from_json(config: &Value) -> Result<Self> {
        let mut cfg = Self::default();
        let field = |key: &str| config.get(key).filter(|v| !v.is_null());
        let expect = |key: &str, want: &str| -> Result<()> {
            match field(key).and_then(Value::as_str) {
                Some(found) if found != want => bail!("{key} = {found:?}: only {want:?} is implemented"),
                _ => Ok(()),
            }
        };
        expect("prediction_type", "epsilon")?;
        expect("variance_type", "fixed_small")?;
        expect("timestep_spacing", "leading")?;
        if field("thresholding").and_then(Value::as_bool) == Some(true) {
            bail!("thresholding = true is not implemented");
        }
        if field("trained_betas").is_some() {
            bail!("trained_betas is not implemented");
        }
        let number = |key: &str| field(key).map(|v| v.as_f64().with_context(|| format!("{key} is not a number")));
        if let Some(v) = number("num_train_timesteps") {
            cfg.num_train_timesteps = v? as usize;
        }
        if let Some(v) = number("beta_start") {
            cfg.beta_start = v?;
        }
        if let Some(v) = number("beta_end") {
            cfg.beta_end = v?;
        }
        if let Some(v) = number("steps_offset") {
            cfg.steps_offset = v? as usize;
        }
        if let Some(v) = field("beta_schedule") {
            cfg.beta_schedule = v.as_str().context("beta_schedule is not a string")?.into();
        }
        let clip = field("clip_sample").map(|v| v.as_bool().context("clip_sample is not a bool"));
        let range = number("clip_sample_range").transpose()?.unwrap_or(1.0) as f32;
        cfg.clip_sample = if clip.transpose()?.unwrap_or(true) {
            Some(range)
        } else {
            None
        };
        if let Some(v) = field("set_alpha_to_one") {
            cfg.set_alpha_to_one = v.as_bool().context("set_alpha_to_one is not a bool")?;
        }
        Ok(cfg)
    }

    /// ᾱ_t for t in 0..num_train_timesteps, float32 as diffusers holds them.
    pub fn alphas_cumprod(&self) -> Result<Vec<f32>> {
        let n = self.num_train_timesteps;
        if !(2..=100_000).contains(&n) {
            bail!("num_train_timesteps = {n}: 2 to 100000 supported");
        }
        let betas: Vec<f32> = match self.beta_schedule.as_str() {
            "linear" => linspace_f32(self.beta_start as f32, self.beta_end as f32, n),
            "scaled_linear" => linspace_f32(self.beta_start.sqrt() as f32, self.beta_end.sqrt() as f32, n)
                .into_iter()
                .map(|root| root * root)
                .collect(),
            other => bail!("beta_schedule = {other:?}: linear or scaled_linear"),
        };
        // torch.cumprod over float32 accumulates in float64 on the CPU, rounding each product
        // it stores.
        let mut acc = 1f64;
        Ok(betas
            .into_iter()
            .map(|beta| {
                acc *= f64::from(1.0 - beta);
                acc as f32
            })
            .collect())
    }

    /// `leading` spacing: `steps` timesteps `n / steps` apart from 0, noisiest first, plus the offset.
    fn leading_timesteps(&self, steps: usize) -> Result<(Vec<usize>, usize)> {
        let n = self.num_train_timesteps;
        if steps == 0 || steps > n {
            bail!("{steps} sampling steps: 1 to {n} (num_train_timesteps)");
        }
        let ratio = n / steps;
        let timesteps: Vec<usize> = (0..steps).rev().map(|i| i * ratio + self.steps_offset).collect();
        if timesteps[0] >= n {
            bail!(
                "steps_offset {} puts timestep {} past {n}",
                self.steps_offset,
                timesteps[0]
            );
        }
        Ok((timesteps, ratio))
    }
}

/// `torch.linspace(start, end, n, dtype=float32)` on the CPU: counted from the start for the first
/// half and back from the end for the second, each value one fused multiply-add, rounded once.
pub fn linspace_f32(start: f32, end: f32, n: usize) -> Vec<f32> {
    let delta = (end - start) / (n - 1) as f32;
    (0..n)
        .map(|i| {
            if i < n / 2 {
                delta.mul_add(i as f32, start)
            } else {
                (-delta).mul_add((n - 1 - i) as f32, end)
            }
        })
        .collect()
}

/// A float32 scalar as a 0-d tensor on `like`'s device, to broadcast as PyTorch's 0-d tensors do.
fn scalar(v: f32, like: &Tensor) -> Result<Tensor> {
    Ok(Tensor::new(v, like.device())?)
}

/// x₀ = (x − √(1−ᾱ_t)·ε) / √ᾱ_t, clamped when the config clips.
fn predict_x0(eps: &Tensor, x: &Tensor, alpha_t: f32, clip: Option<f32>) -> Result<Tensor> {
    let x0 =
        (x - eps.broadcast_mul(&scalar((1.0 - alpha_t).sqrt(), x)?)?)?.broadcast_div(&scalar(alpha_t.sqrt(), x)?)?;
    Ok(match clip {
        Some(range) => x0.clamp(-range, range)?,
        None => x0,
    })
}

/// DDIM with eta 0 (`DDIMScheduler.step(..., eta=0)`).
#[derive(Debug, Clone)]
pub struct Ddim {
    /// ᾱ_t for t in 0..num_train_timesteps, float32.
    pub alphas_cumprod: Vec<f32>,
    /// The timesteps of the loop, from the noisiest.
    pub timesteps: Vec<usize>,
    /// Training steps between two timesteps of the loop.
    ratio: usize,
    /// ᾱ past t = 0: 1 (`set_alpha_to_one`) or ᾱ_0.
    final_alpha: f32,
    clip: Option<f32>,
}

impl Ddim {
    pub fn with_config(cfg: &SchedulerConfig, steps: usize) -> Result<Self> {
        let alphas_cumprod = cfg.alphas_cumprod()?;
        let (timesteps, ratio) = cfg.leading_timesteps(steps)?;
        let final_alpha = if cfg.set_alpha_to_one { 1.0 } else { alphas_cumprod[0] };
        Ok(Self {
            alphas_cumprod,
            timesteps,
            ratio,
            final_alpha,
            clip: cfg.clip_sample,
        })
    }

    fn alpha_prev(&self, t: usize) -> f32 {
        match t.checked_sub(self.ratio) {
            Some(prev) => self.alphas_cumprod[prev],
            None => self.final_alpha,
        }
    }

    /// One step from `x` at timestep `t` with the predicted noise `eps` (both float32):
    /// x₀ as [`predict_x0`], then √ᾱ_prev·x₀ + √(1−ᾱ_prev)·ε.
    pub fn step(&self, eps: &Tensor, t: usize, x: &Tensor) -> Result<Tensor> {
        let a_prev = self.alpha_prev(t);
        let x0 = predict_x0(eps, x, self.alphas_cumprod[t], self.clip)?;
        let direction = eps.broadcast_mul(&scalar((1.0 - a_prev).sqrt(), x)?)?;
        Ok((x0.broadcast_mul(&scalar(a_prev.sqrt(), x)?)? + direction)?)
    }
}

/// DDPM (`DDPMScheduler.step`), `fixed_small` variance: each step but the last adds
/// √σ²_t · z for a fresh standard normal z the caller draws.
#[derive(Debug, Clone)]
pub struct Ddpm {
    pub alphas_cumprod: Vec<f32>,
    pub timesteps: Vec<usize>,
    ratio: usize,
    clip: Option<f32>,
}

/// The float32 coefficients of one DDPM step, computed as `DDPMScheduler.step` computes them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DdpmCoefficients {
    /// Of the predicted x₀: √ᾱ_prev·β_t / (1 − ᾱ_t).
    pub x0: f32,
    /// Of the current sample: √α_t·(1 − ᾱ_prev) / (1 − ᾱ_t).
    pub sample: f32,
    /// The noise's standard deviation, √max((1 − ᾱ_prev) / (1 − ᾱ_t)·β_t, 1e-20); 0 at t = 0.
    pub noise_std: f32,
}

impl Ddpm {
    pub fn with_config(cfg: &SchedulerConfig, steps: usize) -> Result<Self> {
        let (timesteps, ratio) = cfg.leading_timesteps(steps)?;
        Ok(Self {
            alphas_cumprod: cfg.alphas_cumprod()?,
            timesteps,
            ratio,
            clip: cfg.clip_sample,
        })
    }

    pub fn coefficients(&self, t: usize) -> DdpmCoefficients {
        let a_t = self.alphas_cumprod[t];
        let a_prev = t.checked_sub(self.ratio).map_or(1.0, |p| self.alphas_cumprod[p]);
        let (b_t, b_prev) = (1.0 - a_t, 1.0 - a_prev);
        let alpha = a_t / a_prev;
        let beta = 1.0 - alpha;
        let variance = ((1.0 - a_prev) / (1.0 - a_t) * (1.0 - a_t / a_prev)).max(1e-20);
        DdpmCoefficients {
            x0: a_prev.sqrt() * beta / b_t,
            sample: alpha.sqrt() * b_prev / b_t,
            noise_std: if t > 0 { variance.sqrt() } else { 0.0 },
        }
    }

    /// One step from `x` at `t` with the predicted noise `eps` and the step's standard normal
    /// `z` (ignored at t = 0), all float32.
    pub fn step(&self, eps: &Tensor, t: usize, x: &Tensor, z: &Tensor) -> Result<Tensor> {
        let c = self.coefficients(t);
        let x0 = predict_x0(eps, x, self.alphas_cumprod[t], self.clip)?;
        let mean = (x0.broadcast_mul(&scalar(c.x0, x)?)? + x.broadcast_mul(&scalar(c.sample, x)?)?)?;
        if t == 0 {
            return Ok(mean);
        }
        Ok((mean + z.broadcast_mul(&scalar(c.noise_std, x)?)?)?)
    }
}
