//! diffusers 0.42.1 `FeedForward` (`models/attention.py`) and its activation layers
//! (`models/activations.py`: `GEGLU`, `GELU`, `ApproximateGELU`, `SwiGLU`, `LinearActivation`).
//!
//! `FeedForward.net` is `[act_fn, Dropout, Linear(inner, dim_out), (Dropout)]`, where `act_fn`
//! owns the input projection `net.0.proj`. GEGLU is the Stable Diffusion choice: the projection
//! to `2·inner` is split into `hidden, gate` (first half, second half) and
//! `hidden · GELU(gate)` with the exact erf GELU. ldm's `FeedForward` has the same layout with
//! `glu=True` and is built from here too (see [`crate::ldm::transformer`]).

use crate::config::defaults;
use crate::layers::Projection;
use crate::ops::{mul, upcast};
use crate::trace;
use crate::{Error, Result};
use candle_core::{Module, Tensor, D};
use candle_nn::VarBuilder;
use serde::Deserialize;

/// `FeedForward(activation_fn=...)`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
pub enum ActivationFn {
    /// `GEGLU`: `hidden · gelu(gate)`, exact GELU (the default of every diffusers class here).
    #[default]
    #[serde(rename = "geglu")]
    Geglu,
    /// `GELU`: `gelu(proj(x))`, exact.
    #[serde(rename = "gelu")]
    Gelu,
    /// `GELU(approximate="tanh")`.
    #[serde(rename = "gelu-approximate")]
    GeluApproximate,
    /// `ApproximateGELU`: `x · sigmoid(1.702 x)` (not gated).
    #[serde(rename = "geglu-approximate")]
    GegluApproximate,
    /// `SwiGLU`: `hidden · silu(gate)`.
    #[serde(rename = "swiglu")]
    Swiglu,
    /// `LinearActivation(activation="silu")`.
    #[serde(rename = "linear-silu")]
    LinearSilu,
}

impl ActivationFn {
    /// Whether the projection outputs `2·inner` features split into value and gate.
    fn gated(self) -> bool {
        matches!(self, Self::Geglu | Self::Swiglu)
    }
}

/// The projection-plus-activation that opens a feed-forward (`net.0`).
#[derive(Debug, Clone)]
pub struct ProjectIn {
    proj: Projection,
    activation: ActivationFn,
}

impl ProjectIn {
    /// Load the projection at `vb` (its `weight`/`bias`) mapping `dim_in` to `inner` features
    /// (`2·inner` for the gated activations).
    pub fn load(
        vb: VarBuilder,
        block: &'static str,
        dim_in: usize,
        inner: usize,
        activation: ActivationFn,
        bias: bool,
    ) -> Result<Self> {
        let out = if activation.gated() { 2 * inner } else { inner };
        let proj = if activation == ActivationFn::Geglu {
            Projection::load_gated(vb, block, dim_in, out, bias)?
        } else {
            Projection::load(vb, block, dim_in, out, bias)?
        };
        Ok(Self { proj, activation })
    }
}

impl Module for ProjectIn {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        crate::validate::input("diffusers.FeedForward", "x", x, &[])?;
        // GEGLU straight from the projection's GEMM where it runs (unless the trace wants the
        // projection's output).
        if self.activation == ActivationFn::Geglu && !trace::enabled() {
            if let Some(out) = self.proj.forward_geglu(x)? {
                return Ok(out);
            }
        }
        let h = self.proj.forward_tokens(x)?;
        trace::record("proj_in", &h);
        #[cfg(feature = "cuda")]
        if let Some(out) = self.gated_cuda(&h)? {
            return Ok(out);
        }
        let halves = || -> candle_core::Result<(Tensor, Tensor)> {
            let n = h.dim(D::Minus1)? / 2;
            Ok((h.narrow(D::Minus1, 0, n)?, h.narrow(D::Minus1, n, n)?))
        };
        // Each PyTorch op computes in at least f32 and rounds once to the input dtype.
        let gelu = |x: &Tensor| upcast(x)?.gelu_erf()?.to_dtype(x.dtype());
        let gelu_tanh = |x: &Tensor| upcast(x)?.gelu()?.to_dtype(x.dtype());
        let silu = |x: &Tensor| candle_nn::ops::silu(&upcast(x)?)?.to_dtype(x.dtype());
        let sigmoid = |x: &Tensor| candle_nn::ops::sigmoid(&upcast(x)?)?.to_dtype(x.dtype());
        match self.activation {
            ActivationFn::Geglu => match crate::cpu_kernels::geglu(&h)? {
                Some(out) => Ok(out),
                None => {
                    let (hidden, gate) = halves()?;
                    hidden * gelu(&gate)?
                }
            },
            ActivationFn::Swiglu => {
                let (hidden, gate) = halves()?;
                hidden * silu(&gate)?
            }
            ActivationFn::Gelu => gelu(&h),
            ActivationFn::GeluApproximate => gelu_tanh(&h),
            // x * torch.sigmoid(1.702 * x)
            ActivationFn::GegluApproximate => &h * sigmoid(&mul(&h, 1.702)?)?,
            ActivationFn::LinearSilu => silu(&h),
        }
    }
}

#[cfg(feature = "cuda")]
impl ProjectIn {
    /// GEGLU / SwiGLU's `hidden * act(gate)` in one CUDA kernel (`unet_attention::cuda::gated` (feature `cuda`): the
    /// activation rounded, then the product, as PyTorch's two ops), where it applies and no trace
    /// is recorded; `None` otherwise.
    fn gated_cuda(&self, h: &Tensor) -> candle_core::Result<Option<Tensor>> {
        use crate::cuda::GateAct;
        let act = match self.activation {
            ActivationFn::Geglu => GateAct::Gelu,
            ActivationFn::Swiglu => GateAct::Silu,
            _ => return Ok(None),
        };
        if trace::enabled() {
            return Ok(None);
        }
        crate::cuda::gated(h, act)
    }
}

/// Keyword arguments of `GEGLU(dim_in, dim_out, bias=True)`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct GegluConfig {
    pub dim_in: usize,
    pub dim_out: usize,
    #[serde(default = "defaults::yes")]
    pub bias: bool,
}

/// `diffusers.models.activations.GEGLU`: key `proj.{weight,bias}` `(2·dim_out, dim_in)`.
#[derive(Debug, Clone)]
pub struct Geglu(ProjectIn);

impl Geglu {
    pub const BLOCK: &'static str = "diffusers.GEGLU";

    pub fn new(vb: VarBuilder, cfg: &GegluConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        Ok(Self(ProjectIn::load(
            vb.pp("proj"),
            Self::BLOCK,
            cfg.dim_in,
            cfg.dim_out,
            ActivationFn::Geglu,
            cfg.bias,
        )?))
    }
}

impl Module for Geglu {
    /// `hidden_states`: `(.., dim_in)` → `(.., dim_out)`.
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        crate::validate::input(Self::BLOCK, "x", x, &[])?;
        let out = self.0.forward(x)?;
        trace::record("output", &out);
        Ok(out)
    }
}

/// Keyword arguments of `FeedForward(dim, dim_out=None, mult=4, dropout=0.0,
/// activation_fn="geglu", final_dropout=False, inner_dim=None, bias=True)`.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct FeedForwardConfig {
    pub dim: usize,
    #[serde(default)]
    pub dim_out: Option<usize>,
    #[serde(default = "defaults::four_f")]
    pub mult: f64,
    /// Identity in eval mode.
    #[serde(default)]
    pub dropout: f64,
    #[serde(default)]
    pub activation_fn: ActivationFn,
    /// Identity in eval mode.
    #[serde(default)]
    pub final_dropout: bool,
    #[serde(default)]
    pub inner_dim: Option<usize>,
    #[serde(default = "defaults::yes")]
    pub bias: bool,
}

impl FeedForwardConfig {
    /// diffusers' defaults for a block of width `dim`.
    pub fn new(dim: usize) -> Self {
        Self {
            dim,
            dim_out: None,
            mult: defaults::four_f(),
            dropout: 0.0,
            activation_fn: ActivationFn::default(),
            final_dropout: false,
            inner_dim: None,
            bias: defaults::yes(),
        }
    }

    /// `inner_dim if not None else int(dim * mult)`.
    pub fn inner(&self) -> usize {
        self.inner_dim.unwrap_or((self.dim as f64 * self.mult) as usize)
    }
}

/// `diffusers.models.attention.FeedForward`: keys `net.0.proj.*`, `net.2.*`.
#[derive(Debug, Clone)]
pub struct FeedForward {
    project_in: ProjectIn,
    project_out: Projection,
}

impl FeedForward {
    pub const BLOCK: &'static str = "diffusers.FeedForward";

    pub fn new(vb: VarBuilder, cfg: &FeedForwardConfig) -> Result<Self> {
        crate::validate::constructor(Self::BLOCK, &vb, cfg)?;
        Self::load(vb, Self::BLOCK, cfg, "net.0.proj")
    }

    /// Load with the input projection under `project_in_key` (diffusers and ldm's GEGLU:
    /// `net.0.proj`; ldm's plain `Sequential(Linear, GELU)`: `net.0.0`).
    pub fn load(vb: VarBuilder, block: &'static str, cfg: &FeedForwardConfig, project_in_key: &str) -> Result<Self> {
        let inner = cfg.inner();
        if inner == 0 {
            return Err(Error::config(block, "the inner dim (inner_dim or dim * mult) is 0"));
        }
        let dim_out = cfg.dim_out.unwrap_or(cfg.dim);
        Ok(Self {
            project_in: ProjectIn::load(
                vb.pp(project_in_key),
                block,
                cfg.dim,
                inner,
                cfg.activation_fn,
                cfg.bias,
            )?,
            project_out: Projection::load(vb.pp("net.2"), block, inner, dim_out, cfg.bias)?,
        })
    }
}

impl Module for FeedForward {
    /// `hidden_states`: `(.., dim)` → `(.., dim_out)`.
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        crate::validate::input(Self::BLOCK, "x", x, &[])?;
        let act = self.project_in.forward(x)?;
        trace::record("act", &act);
        let out = self.project_out.forward_tokens(&act)?;
        trace::record("proj", &out);
        trace::record("output", &out);
        Ok(out)
    }
}
