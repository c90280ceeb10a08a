//! The elementwise nonlinearities ([`Activation`]) and the scale-shift conditioning of the
//! ResNet blocks ([`scale_shift`]).

use crate::ops::{upcast, CastTo};
use candle_core::Tensor;
use candle_nn::Module;

/// The nonlinearities diffusers' `get_activation` names (`swish`/`silu`, `mish`, `gelu`,
/// `relu`), elementwise in at least f32 and rounded once, as PyTorch's CPU kernels do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    #[serde(alias = "silu")]
    Swish,
    Mish,
    Gelu,
    Relu,
}

impl Module for Activation {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        // SiLU of a half-precision CPU tensor in one parallel pass: Candle's f32 `silu`
        // (`x / (1 + exp(-x))`) on each widened value, rounded once, as below.
        if *self == Activation::Swish {
            if let Some(y) = crate::cpu::map_half(x, |v| v / (1.0 + (-v).exp()))? {
                return Ok(y);
            }
        }
        let y = upcast(x)?;
        let y = match self {
            Activation::Swish => candle_nn::ops::silu(&y)?,
            // x · tanh(softplus(x)), softplus = log(1 + exp(x)) (PyTorch switches to x above 20)
            Activation::Mish => {
                let softplus = y.exp()?.affine(1.0, 1.0)?.log()?;
                let big = y.ge(20.0)?;
                let softplus = big.where_cond(&y, &softplus)?;
                (&y * softplus.tanh()?)?
            }
            Activation::Gelu => y.gelu_erf()?,
            Activation::Relu => y.relu()?,
        };
        y.cast_to(x.dtype())
    }
}

/// `x * (1 + scale) + shift` with `scale`, `shift` `(B, C)` broadcast over the spatial dims:
/// the FiLM / scale-shift conditioning of the ResNet blocks.
pub fn scale_shift(x: &Tensor, scale: &Tensor, shift: &Tensor) -> candle_core::Result<Tensor> {
    let spatial = vec![1; x.rank() - 2];
    let as_map = |t: &Tensor| -> candle_core::Result<Tensor> {
        let mut dims = t.dims()[..2].to_vec();
        dims.extend(&spatial);
        t.reshape(dims)
    };
    x.broadcast_mul(&(as_map(scale)? + 1.0)?)?
        .broadcast_add(&as_map(shift)?)
}
