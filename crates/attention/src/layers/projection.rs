//! Learned projections: [`Projection`] (`nn.Linear` or 1×1 conv weights, on the packed GEMM
//! where it applies) and the fused `to_qkv` conv of lucidrains' blocks ([`FusedQkvConv`]).
//!
//! **On CUDA in f16/bf16** ([`crate::ops::native_half`]) the product runs in the input's dtype:
//! cuBLAS accumulates in f32 and rounds once, the weight (and bias) converted to that dtype once
//! per projection and kept. Where PyTorch rounds once, so does this: `nn.Linear` on a contiguous
//! input is `addmm`, the bias summed into cuBLAS's f32 accumulator
//! ([`Projection::linear_native`], on `unet_attention::cuda::linear_with_bias` (feature
//! `cuda`)). Where PyTorch rounds twice, so does this: `F.linear` on a strided input
//! (`matmul`, then the bias added) and the 1×1 convolution (cuDNN, then the bias added) take
//! [`Projection::product_native`] / [`Projection::product_channels_native`] and add the bias to
//! the rounded product (the fused epilogue kernel, `unet_attention::cuda::epilogue`, else
//! `broadcast_add`). On the CPU nothing changes (f32 products, one rounding, as PyTorch's CPU).

use crate::cpu::contiguous;
use crate::cpu_kernels::PackedLinear;
use crate::ops::{is_half, native_half, upcast, CastTo};
use crate::{Error, Result};
use candle_core::{DType, Tensor};
use candle_nn::{Module, VarBuilder};
use std::sync::{Arc, OnceLock};

/// A learned projection `y = W·x + b` whose weight may be stored as an `nn.Linear` `(out, in)`,
/// a `Conv1d` with kernel 1 `(out, in, 1)` or a `Conv2d` 1×1 `(out, in, 1, 1)`. An f32 weight on
/// a CPU with AVX2+FMA or AVX-512 is packed once, here, for the CPU GEMM
/// ([`crate::cpu_kernels::PackedLinear`]; the unpacked copy is dropped); everything else runs
/// Candle's ops.
#[derive(Debug, Clone)]
pub struct Projection {
    /// The weight `(out, in)`, where it is not packed.
    weight: Option<Tensor>,
    packed: Option<PackedLinear>,
    bias: Option<Tensor>,
    out_dim: usize,
    /// The weight and bias in f16 / bf16, made on the first native half call (see the module
    /// docs) and shared by clones.
    half: Arc<HalfParams>,
}

/// `(weight, bias)` converted to a half dtype, once.
type HalfPair = OnceLock<(Tensor, Option<Tensor>)>;

/// The converted parameters of a [`Projection`], per half dtype.
#[derive(Debug, Default)]
struct HalfParams {
    f16: HalfPair,
    bf16: HalfPair,
}

/// The dimension a native product's bias runs along.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BiasAlong {
    /// The last (tokens).
    Last,
    /// Dimension 1 (channels first).
    Channels,
}

/// `y + bias` along `along`, rounded to `y`'s dtype: the fused epilogue kernel on CUDA where it
/// applies, else `broadcast_add`.
fn add_bias(y: Tensor, bias: Option<&Tensor>, along: BiasAlong) -> candle_core::Result<Tensor> {
    let Some(bias) = bias else { return Ok(y) };
    #[cfg(feature = "cuda")]
    {
        let axis = match along {
            BiasAlong::Last => crate::cuda::BiasAxis::Last,
            BiasAlong::Channels => crate::cuda::BiasAxis::Channels,
        };
        if let Some(out) = crate::cuda::epilogue(&y, Some((bias, axis)), None, None)? {
            return Ok(out);
        }
    }
    match along {
        BiasAlong::Last => y.broadcast_add(bias),
        BiasAlong::Channels => {
            let mut shape = vec![1; y.rank()];
            shape[1] = bias.elem_count();
            y.broadcast_add(&bias.reshape(shape)?)
        }
    }
}

/// `<vb>.weight` of a projection in any of its stored layouts, `(out, in)`, `(out, in, 1, 1)` or
/// `(out, in, 1)`, as `(out, in)`. Each layout is asked for by its shape, so a backend that knows
/// a tensor's shape before reading it (unet-parity's checkpoints) refuses a wrong one without
/// reading its data; Candle's backends report the mismatch as `UnexpectedShape` too.
fn load_weight(vb: &VarBuilder, block: &'static str, in_dim: usize, out_dim: usize) -> Result<Tensor> {
    let mut found = None;
    // `vb.dtype()`: a `vb.to_dtype(..)` is honoured.
    for shape in [
        vec![out_dim, in_dim],
        vec![out_dim, in_dim, 1, 1],
        vec![out_dim, in_dim, 1],
    ] {
        match vb.get_with_hints_dtype(shape, "weight", candle_nn::Init::Const(0.), vb.dtype()) {
            Ok(weight) => return Ok(weight.reshape((out_dim, in_dim))?),
            Err(e) => match unexpected_shape(&e) {
                Some(got) => found = Some(got.dims().to_vec()),
                None => return Err(e.into()),
            },
        }
    }
    Err(Error::WeightShape {
        block,
        name: format!("{}.weight", vb.prefix()),
        expected: format!("({out_dim}, {in_dim}) or ({out_dim}, {in_dim}, 1[, 1])"),
        found: found.unwrap_or_default(),
    })
}

/// The shape found, when `e` is (or wraps) Candle's shape-mismatch error.
pub(crate) fn unexpected_shape(e: &candle_core::Error) -> Option<&candle_core::Shape> {
    use candle_core::Error as E;
    match e {
        E::UnexpectedShape { got, .. } => Some(got),
        E::WithBacktrace { inner, .. } | E::Context { inner, .. } | E::WithPath { inner, .. } => {
            unexpected_shape(inner)
        }
        _ => None,
    }
}

impl Projection {
    /// Load `<vb>.weight` (and `<vb>.bias` when `bias`) mapping `in_dim` to `out_dim` features.
    pub fn load(vb: VarBuilder, block: &'static str, in_dim: usize, out_dim: usize, bias: bool) -> Result<Self> {
        Self::load_packed(vb, block, (in_dim, out_dim), bias, false)
    }

    /// [`Self::load`] for a GEGLU projection (`out_dim` = `2·n`, `[hidden | gate]`): a packed
    /// weight is paired so that [`Self::forward_geglu`] applies.
    pub fn load_gated(vb: VarBuilder, block: &'static str, in_dim: usize, out_dim: usize, bias: bool) -> Result<Self> {
        Self::load_packed(vb, block, (in_dim, out_dim), bias, true)
    }

    fn load_packed(
        vb: VarBuilder,
        block: &'static str,
        (in_dim, out_dim): (usize, usize),
        bias: bool,
        gated: bool,
    ) -> Result<Self> {
        let weight = load_weight(&vb, block, in_dim, out_dim)?;
        let bias = if bias { Some(vb.get(out_dim, "bias")?) } else { None };
        let packed = if gated {
            PackedLinear::new_gated(&weight)?
        } else {
            PackedLinear::new(&weight)?
        };
        Ok(Self {
            weight: if packed.is_some() { None } else { Some(weight) },
            packed,
            bias,
            out_dim,
            half: Arc::default(),
        })
    }

    /// Output features.
    pub fn out_dim(&self) -> usize {
        self.out_dim
    }

    /// The weight `(out, in)` (unpacked again where it is packed).
    fn weight(&self) -> candle_core::Result<Tensor> {
        match (&self.weight, &self.packed) {
            (Some(w), _) => Ok(w.clone()),
            (None, Some(p)) => p.weight(),
            (None, None) => unreachable!("a Projection holds its weight one way or the other"),
        }
    }

    /// Whether `x` takes the native half path (see the module docs): [`native_half`], and the
    /// weight on `x`'s device.
    fn native(&self, x: &Tensor) -> bool {
        native_half(x) && self.weight.as_ref().is_some_and(|w| w.device().same_device(x.device()))
    }

    /// The weight `(out, in)` and the bias in the half dtype `dtype`, converted on first use.
    fn half_params(&self, dtype: DType) -> candle_core::Result<(Tensor, Option<Tensor>)> {
        let cell = match dtype {
            DType::F16 => &self.half.f16,
            DType::BF16 => &self.half.bf16,
            other => candle_core::bail!("Projection: no native half parameters for {other:?}"),
        };
        if let Some(pair) = cell.get() {
            return Ok(pair.clone());
        }
        let weight = self.weight()?.to_dtype(dtype)?;
        let bias = self.bias.as_ref().map(|b| b.to_dtype(dtype)).transpose()?;
        Ok(cell.get_or_init(|| (weight, bias)).clone())
    }

    /// `x · Wᵀ` on the last dimension in `x`'s half dtype (cuBLAS, f32 accumulation, one
    /// rounding), and the bias in that dtype; `None` off the native path.
    pub fn product_native(&self, x: &Tensor) -> candle_core::Result<Option<(Tensor, Option<Tensor>)>> {
        if !self.native(x) {
            return Ok(None);
        }
        let (weight, bias) = self.half_params(x.dtype())?;
        let y = candle_nn::Linear::new(weight, None).forward(&x.contiguous()?)?;
        Ok(Some((y, bias)))
    }

    /// `x · Wᵀ + b` on the last dimension in `x`'s half dtype with the bias inside cuBLAS's f32
    /// sum, rounded once, as PyTorch's CUDA `addmm` (`nn.Linear` on a contiguous input); `None`
    /// off the native path. Without a bias, [`Self::product_native`]'s product.
    pub fn linear_native(&self, x: &Tensor) -> candle_core::Result<Option<Tensor>> {
        if !self.native(x) {
            return Ok(None);
        }
        let (weight, bias) = self.half_params(x.dtype())?;
        #[cfg(feature = "cuda")]
        if let Some(bias) = &bias {
            if let Some(y) = crate::cuda::linear_with_bias(x, &weight, bias)? {
                return Ok(Some(y));
            }
        }
        let y = candle_nn::Linear::new(weight, None).forward(&x.contiguous()?)?;
        add_bias(y, bias.as_ref(), BiasAlong::Last).map(Some)
    }

    /// [`Self::product_native`] on dimension 1 (a 1×1 convolution without its bias): `(B, in,
    /// ...)` → `(B, out, ...)`, and the bias in `x`'s dtype; `None` off the native path.
    pub fn product_channels_native(&self, x: &Tensor) -> candle_core::Result<Option<(Tensor, Option<Tensor>)>> {
        if !self.native(x) || x.rank() < 2 {
            return Ok(None);
        }
        let mut dims = x.dims().to_vec();
        let (b, c) = (dims[0], dims[1]);
        let n: usize = dims[2..].iter().product();
        dims[1] = self.out_dim;
        let (weight, bias) = self.half_params(x.dtype())?;
        let y = weight.broadcast_matmul(&x.reshape((b, c, n))?.contiguous()?)?;
        Ok(Some((y.reshape(dims)?, bias)))
    }

    /// `x · Wᵀ (+ b)` on the last dimension, in the dtype [`upcast`] gives `x` (f32 or f64; an f16
    /// or bf16 `x` is exact in f32): the packed GEMM where it applies, else Candle's `Linear`.
    fn product(&self, x: &Tensor, with_bias: bool) -> candle_core::Result<Tensor> {
        let bias = if with_bias { self.bias.as_ref() } else { None };
        if let Some(p) = &self.packed {
            if let Some(y) = p.forward(x, bias)? {
                return Ok(y);
            }
        }
        let linear = candle_nn::Linear::new(upcast(&self.weight()?)?, bias.map(upcast).transpose()?);
        // Candle's batched matmul mishandles some transposed (B, N, C) views of (B, C, N)
        // tensors; a contiguous copy is also what the GEMM wants.
        linear.forward(&contiguous(&upcast(x)?)?)
    }

    /// GEGLU of the projection, `hidden · gelu(gate)` in one pass from the packed GEMM (for a
    /// [`Self::load_gated`] projection on f32 CPU tokens); `None` where that does not apply.
    pub fn forward_geglu(&self, x: &Tensor) -> candle_core::Result<Option<Tensor>> {
        match &self.packed {
            Some(p) => Ok(p.forward_geglu(x, self.bias.as_ref())?),
            None => Ok(None),
        }
    }

    /// Apply to the last dimension, like `nn.Linear`: `(.., in)` → `(.., out)`.
    ///
    /// f16/bf16: product and bias in f32, rounded once, as PyTorch's `addmm` does (Candle's
    /// half-precision `Linear` rounds the product and then the sum); on CUDA natively
    /// ([`Self::linear_native`]).
    pub fn forward_tokens(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        if let Some(y) = self.linear_native(x)? {
            return Ok(y);
        }
        if is_half(x.dtype()) {
            return self.product(x, true)?.cast_to(x.dtype());
        }
        self.product(x, true)
    }

    /// `nn.Linear` on an input PyTorch holds as a non-contiguous view (a `transpose`d image, a
    /// `batch_first` query): there `F.linear` runs `matmul` and then adds the bias, so in
    /// f16/bf16 the product and the sum are each rounded (two roundings; on a contiguous input
    /// it is one fused `addmm`, [`Self::forward_tokens`]). Same values as
    /// [`Self::forward_tokens`] in f32/f64.
    pub fn forward_tokens_strided(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        if let Some((y, bias)) = self.product_native(x)? {
            return add_bias(y, bias.as_ref(), BiasAlong::Last);
        }
        if !is_half(x.dtype()) {
            return self.forward_tokens(x);
        }
        let product = self.product(x, false)?.cast_to(x.dtype())?;
        match &self.bias {
            Some(bias) => product.broadcast_add(&bias.cast_to(x.dtype())?),
            None => Ok(product),
        }
    }

    /// Apply to dimension 1, like a 1×1 conv: `(B, in, ...)` → `(B, out, ...)`; f16/bf16 in f32
    /// and rounded once, as PyTorch's convolution does (natively on CUDA, see the module docs).
    pub fn forward_channels(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let dims = x.dims().to_vec();
        let (b, c) = (dims[0], dims[1]);
        let n: usize = dims[2..].iter().product();
        let mut out = dims;
        out[1] = self.out_dim;
        if let Some((y, bias)) = self.product_channels_native(x)? {
            return add_bias(y, bias.as_ref(), BiasAlong::Channels);
        }
        if let Some(p) = self.packed.as_ref().filter(|_| x.dtype() != DType::F64) {
            // The GEMM runs on token rows: (B, in, N) → (B, N, in) and back, fast copies.
            let tokens = contiguous(&x.reshape((b, c, n))?.transpose(1, 2)?)?;
            if let Some(y) = p.forward(&tokens, self.bias.as_ref())? {
                return contiguous(&y.transpose(1, 2)?)?.reshape(out)?.cast_to(x.dtype());
            }
        }
        let x32 = upcast(x)?.reshape((b, c, n))?;
        let y = upcast(&self.weight()?)?.broadcast_matmul(&x32)?;
        let y = match &self.bias {
            Some(bias) => y.broadcast_add(&upcast(bias)?.reshape((self.out_dim, 1))?)?,
            None => y,
        };
        y.reshape(out)?.cast_to(x.dtype())
    }
}

/// The bias-free fused `to_qkv` 1×1 conv of lucidrains' blocks and their derivatives
/// (Annotated Diffusion, ldm `LinearAttention`): `3·heads·dim_head` output channels laid out
/// `[Q | K | V]`, each split into heads `(h c)`.
#[derive(Debug, Clone)]
pub struct FusedQkvConv {
    proj: Projection,
    heads: usize,
}

impl FusedQkvConv {
    /// Load `<vb>.weight` of shape `(3·heads·dim_head, dim, 1, 1)`.
    pub fn load(vb: VarBuilder, block: &'static str, dim: usize, heads: usize, dim_head: usize) -> Result<Self> {
        if heads == 0 || dim_head == 0 {
            return Err(Error::config(
                block,
                format!("heads ({heads}) and dim_head ({dim_head}) must be positive"),
            ));
        }
        Ok(Self {
            proj: Projection::load(vb, block, dim, 3 * heads * dim_head, false)?,
            heads,
        })
    }

    /// `(B, dim, H, W)` → q, k, v, each `(B, heads, dim_head, H·W)` (channels first).
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<[Tensor; 3]> {
        crate::heads::chunk_qkv_channels(&self.proj.forward_channels(x)?, self.heads)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};
    use std::collections::HashMap;

    #[test]
    fn projection_agrees_on_transposed_views_and_conv_shaped_weights() {
        let dev = Device::Cpu;
        let w = Tensor::randn(0f32, 1., (5, 4), &dev).unwrap();
        let b = Tensor::randn(0f32, 1., 5, &dev).unwrap();
        let ts = HashMap::from([
            ("p.weight".to_string(), w.reshape((5, 4, 1, 1)).unwrap()),
            ("p.bias".to_string(), b),
        ]);
        let vb = VarBuilder::from_tensors(ts, DType::F32, &dev);
        let p = Projection::load(vb.pp("p"), "test", 4, 5, true).unwrap();
        // (B, C, N) contiguous, viewed as (B, N, C): the layout of image tokens.
        let x = Tensor::randn(0f32, 1., (3, 4, 7), &dev).unwrap();
        let view = x.transpose(1, 2).unwrap();
        let a = p.forward_tokens(&view).unwrap();
        let c = p.forward_tokens(&view.contiguous().unwrap()).unwrap();
        let diff = (a - &c)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(diff < 1e-6, "{diff}");
        let by_channels = p.forward_channels(&x).unwrap().transpose(1, 2).unwrap();
        let diff = (by_channels - c)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(diff < 1e-5, "{diff}");
        let vb = VarBuilder::from_tensors(HashMap::from([("p.weight".to_string(), w)]), DType::F32, &dev);
        let err = Projection::load(vb.pp("p"), "test", 5, 4, false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("p.weight") && err.contains("[5, 4]"), "{err}");
    }

    /// The half-precision parameters of the CUDA layers' native products: made once per dtype
    /// (clones of the projection share them), the unpacked weight's values, refused for f32; and
    /// off CUDA the native path is never taken.
    #[test]
    fn half_parameters_are_made_once_and_only_for_half_dtypes() {
        let dev = Device::Cpu;
        let w = Tensor::randn(0f32, 1., (6, 3), &dev).unwrap();
        let b = Tensor::randn(0f32, 1., 6, &dev).unwrap();
        let ts = HashMap::from([("p.weight".to_string(), w.clone()), ("p.bias".to_string(), b)]);
        let p = Projection::load(
            VarBuilder::from_tensors(ts, DType::F32, &dev).pp("p"),
            "test",
            3,
            6,
            true,
        )
        .unwrap();
        let (w16, b16) = p.half_params(DType::F16).unwrap();
        let (again, _) = p.clone().half_params(DType::F16).unwrap();
        assert_eq!(w16.id(), again.id(), "made once, shared by clones");
        assert_eq!((w16.dtype(), b16.unwrap().dtype()), (DType::F16, DType::F16));
        let want = w.to_dtype(DType::F16).unwrap().to_vec2::<half::f16>().unwrap();
        assert_eq!(
            w16.to_vec2::<half::f16>().unwrap(),
            want,
            "the (out, in) weight, packed or not"
        );
        assert_eq!(p.half_params(DType::BF16).unwrap().0.dtype(), DType::BF16);
        assert!(p.half_params(DType::F32).is_err());
        let x = Tensor::zeros((2, 3), DType::F16, &dev).unwrap();
        assert!(p.product_native(&x).unwrap().is_none(), "never native off CUDA");
    }
}
