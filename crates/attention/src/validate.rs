//! The checks every public constructor and forward runs on its arguments before any arithmetic,
//! so that a wrong argument is an [`Error`] naming the block, the argument, what was expected and
//! what was found, never a panic inside Candle or a kernel:
//!
//! * [`input`]: a forward input is a float tensor (`f16`, `bf16`, `f32`, `f64`) of an accepted
//!   rank, with no dimension of size 0;
//! * [`mask`]: a mask is a float tensor, or `u8` where the block reads it as a boolean;
//! * [`same_dtype`]: inputs that meet in one operation (`q`, `k`, `v`) share a dtype;
//! * [`constructor`]: weights load as a float dtype, and [`config`]: a config built in Rust passes the same integer bound as one read from JSON
//!   ([`crate::config::MAX_CONFIG_INT`]), so sizes computed from it cannot overflow.

use crate::{Error, Result};
use candle_core::{DType, Tensor};

/// Name of a dtype as PyTorch prints it.
fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::U8 => "u8",
        DType::U32 => "u32",
        DType::I16 => "i16",
        DType::I32 => "i32",
        DType::I64 => "i64",
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        DType::F32 => "f32",
        DType::F64 => "f64",
        _ => "an unsupported dtype",
    }
}

/// `t`'s dtype is a float.
pub(crate) fn float(block: &'static str, name: &str, t: &Tensor) -> Result<()> {
    if t.dtype().is_float() {
        return Ok(());
    }
    Err(Error::input(
        block,
        name,
        format!(
            "expected a float tensor (f16, bf16, f32 or f64), found {} of shape {:?}",
            dtype_name(t.dtype()),
            t.dims()
        ),
    ))
}

/// `t` has one of `ranks` (any rank where `ranks` is empty) and no dimension of size 0.
pub(crate) fn shape(block: &'static str, name: &str, t: &Tensor, ranks: &[usize]) -> Result<()> {
    if !ranks.is_empty() && !ranks.contains(&t.rank()) {
        let expected = match ranks {
            [r] => format!("rank {r}"),
            _ => format!("rank {ranks:?}"),
        };
        return Err(Error::input(
            block,
            name,
            format!("expected {expected}, found rank {} (shape {:?})", t.rank(), t.dims()),
        ));
    }
    if t.dims().contains(&0) {
        return Err(Error::input(
            block,
            name,
            format!("expected every dimension ≥ 1, found {:?}", t.dims()),
        ));
    }
    Ok(())
}

/// A norm's `eps`: a finite number > 0 (a negative one makes `var + eps` negative somewhere and
/// the block NaN; zero divides by zero on a constant group).
pub(crate) fn eps(block: &'static str, eps: f64) -> Result<()> {
    if eps.is_finite() && eps > 0.0 {
        return Ok(());
    }
    Err(Error::config(
        block,
        format!("a norm's eps must be a finite number > 0, found {eps}"),
    ))
}

/// A forward input: [`float`] and [`shape`].
pub(crate) fn input(block: &'static str, name: &str, t: &Tensor, ranks: &[usize]) -> Result<()> {
    float(block, name, t)?;
    shape(block, name, t, ranks)
}

/// [`input`] on an optional input.
pub(crate) fn optional(block: &'static str, name: &str, t: Option<&Tensor>, ranks: &[usize]) -> Result<()> {
    t.map_or(Ok(()), |t| input(block, name, t, ranks))
}

/// An optional tensor whose dtype the block checks itself (a mask, an indicator): no dimension 0.
pub(crate) fn optional_shape(block: &'static str, name: &str, t: Option<&Tensor>) -> Result<()> {
    t.map_or(Ok(()), |t| shape(block, name, t, &[]))
}

/// A mask: a float tensor, or `u8` (a boolean) where `boolean` says the block reads it as one;
/// of one of `ranks` and no dimension of size 0.
pub(crate) fn mask(block: &'static str, name: &str, t: Option<&Tensor>, ranks: &[usize], boolean: bool) -> Result<()> {
    let Some(t) = t else { return Ok(()) };
    if !(t.dtype().is_float() || (boolean && t.dtype() == DType::U8)) {
        let expected = if boolean {
            "a boolean (u8) or float mask"
        } else {
            "a float mask (f16, bf16, f32 or f64)"
        };
        return Err(Error::input(
            block,
            name,
            format!(
                "expected {expected}, found {} of shape {:?}",
                dtype_name(t.dtype()),
                t.dims()
            ),
        ));
    }
    shape(block, name, t, ranks)
}

/// `t` has the dtype of `like` (named `like_name`), as PyTorch requires of tensors that meet in
/// one matmul.
pub(crate) fn same_dtype(block: &'static str, name: &str, t: &Tensor, like_name: &str, like: &Tensor) -> Result<()> {
    if t.dtype() == like.dtype() {
        return Ok(());
    }
    Err(Error::input(
        block,
        name,
        format!(
            "expected the dtype of `{like_name}` ({}), found {}",
            dtype_name(like.dtype()),
            dtype_name(t.dtype())
        ),
    ))
}

/// A constructor's arguments: weights loaded as a float dtype (an integer one would reach
/// Candle's float-only ops, which panic on integers) and [`config`].
pub(crate) fn constructor<C: serde::Serialize>(block: &'static str, vb: &candle_nn::VarBuilder, cfg: &C) -> Result<()> {
    if !vb.dtype().is_float() {
        return Err(Error::config(
            block,
            format!(
                "weights must load as a float dtype (f16, bf16, f32 or f64), found {}",
                dtype_name(vb.dtype())
            ),
        ));
    }
    config(block, cfg)
}

/// A config built in Rust (not only one read by [`crate::config::from_json`]) passes the JSON
/// integer bound: every integer within ±[`crate::config::MAX_CONFIG_INT`].
pub(crate) fn config<C: serde::Serialize>(block: &'static str, cfg: &C) -> Result<()> {
    let value = serde_json::to_value(cfg).map_err(|e| Error::config(block, e.to_string()))?;
    crate::config::check_integers(block, &value, "")
}

/// The arguments of the attention core ([`crate::sdpa::sdpa`], [`crate::sdpa::eager_attention`],
/// named `func`): `q`, `k`, `v` float tensors of one dtype and one rank ≥ 2, no dimension 0,
/// `q` and `k` with one head dim, `k` and `v` with one length; `mask` a float tensor (PyTorch's
/// SDPA refuses `uint8` masks: a boolean mask is turned additive by the block first).
pub(crate) fn attention(func: &'static str, q: &Tensor, k: &Tensor, v: &Tensor, mask_: Option<&Tensor>) -> Result<()> {
    input(func, "q", q, &[])?;
    for (name, t) in [("k", k), ("v", v)] {
        input(func, name, t, &[])?;
        same_dtype(func, name, t, "q", q)?;
    }
    if q.rank() < 2 || k.rank() != q.rank() || v.rank() != q.rank() {
        return Err(Error::input(
            func,
            "q`, `k`, `v",
            format!(
                "expected one rank ≥ 2, found shapes {:?}, {:?}, {:?}",
                q.dims(),
                k.dims(),
                v.dims()
            ),
        ));
    }
    let r = q.rank();
    if q.dims()[r - 1] != k.dims()[r - 1] || k.dims()[r - 2] != v.dims()[r - 2] {
        return Err(Error::input(
            func,
            "q`, `k`, `v",
            format!(
                "expected q (.., L, E), k (.., S, E), v (.., S, Ev), found {:?}, {:?}, {:?}",
                q.dims(),
                k.dims(),
                v.dims()
            ),
        ));
    }
    mask(func, "mask", mask_, &[], false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn integer_inputs_zero_dims_and_ranks_are_errors() {
        let dev = Device::Cpu;
        let u8s = Tensor::zeros((1, 2, 2, 2), DType::U8, &dev).unwrap();
        let msg = input("b", "x", &u8s, &[4]).unwrap_err().to_string();
        assert!(msg.contains("`x`") && msg.contains("found u8"), "{msg}");
        let empty = Tensor::zeros((1, 0, 2, 2), DType::F32, &dev).unwrap();
        assert!(input("b", "x", &empty, &[4]).is_err());
        let ok = Tensor::zeros((1, 2, 2, 2), DType::F32, &dev).unwrap();
        input("b", "x", &ok, &[4]).unwrap();
        let msg = input("b", "x", &ok, &[3]).unwrap_err().to_string();
        assert!(msg.contains("expected rank 3, found rank 4"), "{msg}");
        assert!(mask("b", "m", Some(&u8s), &[], false).is_err());
        mask("b", "m", Some(&u8s), &[], true).unwrap();
    }
}
