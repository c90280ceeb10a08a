//! diffusers 0.42.1 `Timesteps` / `get_timestep_embedding` and `TimestepEmbedding`
//! (`models/embeddings.py`): the sinusoidal time projection and its MLP; and lucidrains'
//! `SinusoidalPosEmb` / `RandomOrLearnedSinusoidalPosEmb` (the Annotated Diffusion post's
//! `SinusoidalPositionEmbeddings` is the first), crate-internal.
//!
//! ```text
//! get_timestep_embedding(t, dim, flip_sin_to_cos, downscale_freq_shift, scale=1, max_period=10000):
//!   half = dim // 2
//!   exponent = -ln(max_period) * arange(0, half, float32) / (half - downscale_freq_shift)
//!   emb = t[:, None].float() * exp(exponent)[None, :]          # float32 whatever t's dtype
//!   emb = cat([sin(emb), cos(emb)], -1)  (cos first with flip_sin_to_cos); zero pad an odd dim
//! TimestepEmbedding: linear_2(act(linear_1(sample))), then post_act if any
//! ```

use crate::layers::{Activation, Projection};
use crate::Result;
use candle_core::{DType, Device, Tensor};
use candle_nn::{Module, VarBuilder};

/// `Timesteps(num_channels, flip_sin_to_cos, downscale_freq_shift)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timesteps {
    pub num_channels: usize,
    pub flip_sin_to_cos: bool,
    pub downscale_freq_shift: f64,
}

impl Timesteps {
    /// The embedding `(N, num_channels)` in float32 of the timesteps `t` (any float values;
    /// PyTorch rounds them to float32 first). Each float32 step rounds as PyTorch's does: the
    /// exponent (`f32(i) * f32(-ln 10000)`, then `/ f32(half - shift)`), the frequency
    /// (`exp`), the argument (`t * freq`); `exp`, `sin` and `cos` here are correctly rounded
    /// (computed in f64), PyTorch's vectorised ones within an ulp of that.
    ///
    /// Under [`crate::float64_run::Embeddings::Exact`] the embedding is computed in float64 instead
    /// (a float64 tensor), to measure how much the float32 rounding moves a float64 run.
    pub fn embed(&self, t: &[f64], device: &Device) -> Result<Tensor> {
        if crate::float64_run::embeddings_exact() {
            return self.embed_exact(t, device);
        }
        let half = self.num_channels / 2;
        let log = -(10000f64.ln()) as f32;
        let div = (half as f64 - self.downscale_freq_shift) as f32;
        let freqs: Vec<f32> = (0..half)
            .map(|i| ((i as f32 * log) / div) as f64)
            .map(|e| e.exp() as f32)
            .collect();
        let mut out = Vec::with_capacity(t.len() * self.num_channels);
        for &ts in t {
            let ts = ts as f32;
            let args: Vec<f64> = freqs.iter().map(|f| (ts * f) as f64).collect();
            let sin = args.iter().map(|a| a.sin() as f32);
            let cos = args.iter().map(|a| a.cos() as f32);
            self.push_row(&mut out, sin, cos);
        }
        Ok(Tensor::from_vec(out, (t.len(), self.num_channels), device)?)
    }

    /// One timestep's row: the sines and cosines in the configured order, and a zero column where
    /// `num_channels` is odd.
    fn push_row<T: Default>(&self, out: &mut Vec<T>, sin: impl Iterator<Item = T>, cos: impl Iterator<Item = T>) {
        if self.flip_sin_to_cos {
            out.extend(cos.chain(sin));
        } else {
            out.extend(sin.chain(cos));
        }
        if self.num_channels % 2 == 1 {
            out.push(T::default());
        }
    }

    /// The embedding in float64 throughout (see [`Self::embed`]).
    fn embed_exact(&self, t: &[f64], device: &Device) -> Result<Tensor> {
        let half = self.num_channels / 2;
        let div = half as f64 - self.downscale_freq_shift;
        let freqs: Vec<f64> = (0..half).map(|i| (-(10000f64.ln()) * i as f64 / div).exp()).collect();
        let mut out = Vec::with_capacity(t.len() * self.num_channels);
        for &ts in t {
            let args: Vec<f64> = freqs.iter().map(|f| ts * f).collect();
            self.push_row(&mut out, args.iter().map(|a| a.sin()), args.iter().map(|a| a.cos()));
        }
        Ok(Tensor::from_vec(out, (t.len(), self.num_channels), device)?)
    }

    /// [`Self::embed`] of a tensor of timesteps (any rank, flattened), as `Timesteps.forward`.
    pub fn forward(&self, t: &Tensor) -> Result<Tensor> {
        let values = t.flatten_all()?.to_dtype(DType::F64)?.to_vec1::<f64>()?;
        self.embed(&values, t.device())
    }
}

/// `TimestepEmbedding(in_channels, time_embed_dim, act_fn, post_act_fn)` without `cond_proj`:
/// keys `linear_1`, `linear_2`.
#[derive(Debug, Clone)]
pub struct TimestepEmbedding {
    linear_1: Projection,
    act: Activation,
    linear_2: Projection,
    post_act: Option<Activation>,
}

impl TimestepEmbedding {
    pub fn new(
        vb: VarBuilder,
        block: &'static str,
        (in_channels, time_embed_dim): (usize, usize),
        act: Activation,
        post_act: Option<Activation>,
    ) -> Result<Self> {
        Ok(Self {
            linear_1: Projection::load(vb.pp("linear_1"), block, in_channels, time_embed_dim, true)?,
            act,
            linear_2: Projection::load(vb.pp("linear_2"), block, time_embed_dim, time_embed_dim, true)?,
            post_act,
        })
    }

    pub fn forward(&self, sample: &Tensor) -> Result<Tensor> {
        let h = self.linear_1.forward_tokens(sample)?;
        crate::trace::record("linear_1", &h);
        let h = self.act.forward(&h)?;
        let h = self.linear_2.forward_tokens(&h)?;
        crate::trace::record("linear_2", &h);
        Ok(match self.post_act {
            Some(a) => a.forward(&h)?,
            None => h,
        })
    }
}

/// lucidrains' `time_mlp.0` (denoising-diffusion-pytorch 2.x), the sinusoidal embedding of the
/// timesteps; `Sinusoidal { theta: 10000 }` is also the Annotated Diffusion post's
/// `SinusoidalPositionEmbeddings` (the same lines).
#[derive(Debug, Clone)]
pub(crate) enum PosEmb {
    /// `SinusoidalPosEmb(dim, theta)`: sin then cos.
    Sinusoidal { dim: usize, theta: f64 },
    /// `RandomOrLearnedSinusoidalPosEmb`: `[t, sin(2π t w), cos(2π t w)]`.
    Fourier { weights: Tensor },
}

impl PosEmb {
    /// `(B, fourier_dim)`, computed as PyTorch computes it for timesteps of `time`'s dtype: the
    /// frequencies of `SinusoidalPosEmb` are float32 (`torch.arange`'s default dtype) and the
    /// products take the wider of the two operands' dtypes (float64 timesteps, as a float64 run's,
    /// give float64 arguments), each float32 step rounded as PyTorch rounds it. Under
    /// [`crate::float64_run`]'s exact embeddings everything is float64.
    pub(crate) fn forward(&self, time: &Tensor) -> Result<Tensor> {
        let exact = crate::float64_run::embeddings_exact();
        let wide = exact || time.dtype() == DType::F64;
        let t = time.to_dtype(DType::F64)?.to_vec1::<f64>()?;
        let (dev, pi) = (time.device(), std::f64::consts::PI);
        let rows = match self {
            PosEmb::Sinusoidal { dim, theta } => {
                let half = dim / 2;
                let step = theta.ln() / (half as f64 - 1.0);
                let freqs: Vec<f64> = (0..half)
                    .map(|i| match exact {
                        true => (-step * i as f64).exp(),
                        false => (((i as f32) * (-step as f32)) as f64).exp() as f32 as f64,
                    })
                    .collect();
                let mut out = Vec::with_capacity(t.len() * 2 * half);
                for &t in &t {
                    let args: Vec<f64> = freqs
                        .iter()
                        .map(|&f| if wide { t * f } else { (t as f32 * f as f32) as f64 })
                        .collect();
                    out.extend(args.iter().map(|a| a.sin()));
                    out.extend(args.iter().map(|a| a.cos()));
                }
                Tensor::from_vec(out, (t.len(), 2 * half), dev)?
            }
            PosEmb::Fourier { weights } => {
                let w = weights.to_dtype(DType::F64)?.to_vec1::<f64>()?;
                let wide = wide || weights.dtype() == DType::F64;
                let mut out = Vec::with_capacity(t.len() * (2 * w.len() + 1));
                for &t in &t {
                    let args: Vec<f64> = w
                        .iter()
                        .map(|&w| match wide {
                            true => t * w * 2.0 * pi,
                            false => ((t as f32 * w as f32) * 2.0 * pi as f32) as f64,
                        })
                        .collect();
                    out.push(t);
                    out.extend(args.iter().map(|a| a.sin()));
                    out.extend(args.iter().map(|a| a.cos()));
                }
                Tensor::from_vec(out, (t.len(), 2 * w.len() + 1), dev)?
            }
        };
        Ok(rows.to_dtype(if wide { DType::F64 } else { DType::F32 })?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `get_timestep_embedding(tensor([0., 1., 999.]), 6, True, 0)` from diffusers 0.42.1 on
    /// torch 2.15 (float32).
    #[test]
    fn matches_diffusers_values() {
        let ts = Timesteps {
            num_channels: 6,
            flip_sin_to_cos: true,
            downscale_freq_shift: 0.0,
        };
        let e = ts.embed(&[0.0, 1.0, 999.0], &Device::Cpu).unwrap();
        let v = e.to_vec2::<f32>().unwrap();
        assert_eq!(v[0], [1.0, 1.0, 1.0, 0.0, 0.0, 0.0]);
        // freqs: 1, 10000^(-1/3), 10000^(-2/3)
        let f1 = (-(10000f64.ln()) / 3.0).exp();
        assert!((v[1][1] as f64 - f1.cos()).abs() < 1e-6);
        assert!((v[1][4] as f64 - f1.sin()).abs() < 1e-6);
        assert!((v[2][3] as f64 - 999f64.sin()).abs() < 1e-6);
    }
}
