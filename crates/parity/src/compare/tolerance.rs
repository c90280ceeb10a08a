//! What a dtype allows: `torch.testing.assert_close`'s default tolerances, the machine epsilon,
//! and how far PyTorch's output may be from its float64 twin before the twin is refused.

use super::{index_text, local_max, values, NEIGHBOURHOOD};
use candle_core::{DType, Tensor};

/// `torch.testing.assert_close` default `(rtol, atol)` for a dtype.
pub fn default_tolerance(dtype: DType) -> (f64, f64) {
    match dtype {
        DType::F16 => (1e-3, 1e-5),
        DType::BF16 => (1.6e-2, 1e-5),
        DType::F64 => (1e-7, 1e-7),
        _ => (1.3e-6, 1e-5),
    }
}

/// A tolerance is a finite number ≥ 0.
pub fn check_tolerance(t: f64) -> Result<(), String> {
    if t.is_finite() && t >= 0.0 {
        Ok(())
    } else {
        Err(format!("a tolerance must be a finite number ≥ 0, found {t}"))
    }
}

/// The machine epsilon of a float dtype (the spacing of values at 1.0).
pub fn epsilon(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 2f64.powi(-10),
        DType::BF16 => 2f64.powi(-7),
        DType::F64 => f64::EPSILON,
        _ => 2f64.powi(-23),
    }
}

/// How many units of its dtype's epsilon, relative to the local magnitude (see
/// [`check_reference`]), PyTorch's output may be from its float64 twin: 64 in f32 (the committed
/// bundles reach 15.2, deep f32 blocks accumulating many roundings), 16 in f16 and bf16 (they
/// reach 2.9: PyTorch computes inside in f32 and rounds each op's result), 16 in f64.
pub fn twin_epsilons(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 64.0,
        _ => 16.0,
    }
}

/// Whether PyTorch's output `torch` (in `dtype`) and its float64 twin `reference` agree as two runs
/// of the same computation can, element by element: every element where the float64 output is
/// finite is finite in `torch` too, and
/// `|torch_i − reference_i| ≤ twin_epsilons(dtype) · eps(dtype) · S_i`, with `S_i` the largest of `|reference_j|`
/// over [`NEIGHBOURHOOD`] and the output's root mean square (so an element that cancels to near
/// zero keeps the scale of its surroundings). PyTorch's own error on the committed bundles is at
/// most a quarter of that in f32 and a fifth in f16/bf16. A float64 output that differs more would license rule (b) to pass
/// what PyTorch's dtype cannot explain: the bundle is refused. `Err` says what is wrong and where.
pub fn check_reference(torch: &Tensor, reference: &Tensor, dtype: DType) -> candle_core::Result<Result<(), String>> {
    if torch.dims() != reference.dims() {
        return Ok(Err(format!(
            "the float64 output has shape {:?}, the output {:?}",
            reference.dims(),
            torch.dims()
        )));
    }
    let (t, r) = (values(torch)?, values(reference)?);
    let broken = t
        .iter()
        .zip(&r)
        .filter(|(x, y)| !x.is_finite() && y.is_finite())
        .count();
    if broken > 0 {
        return Ok(Err(format!(
            "PyTorch's output is NaN or inf at {broken} elements where its float64 output is finite \
             (an overflow in PyTorch's own run): these cannot be verified; export with smaller weights or inputs"
        )));
    }
    let magnitudes: Vec<f64> = r.iter().map(|y| if y.is_finite() { y.abs() } else { 0.0 }).collect();
    let finite = magnitudes.iter().filter(|m| **m > 0.0).count().max(1);
    let rms = (magnitudes.iter().map(|m| m * m).sum::<f64>() / finite as f64).sqrt();
    let scale = local_max(&magnitudes, NEIGHBOURHOOD);
    let (eps, epsilons) = (epsilon(dtype), twin_epsilons(dtype));
    let mut worst: Option<(usize, f64, f64)> = None;
    for (i, (x, y)) in t.iter().zip(&r).enumerate() {
        if !(x.is_finite() && y.is_finite()) {
            continue;
        }
        let bound = epsilons * eps * scale[i].max(rms);
        let excess = (x - y).abs() / bound;
        if excess > 1.0 && worst.is_none_or(|(_, e, _)| excess > e) {
            worst = Some((i, excess, bound));
        }
    }
    if let Some((i, _, bound)) = worst {
        return Ok(Err(format!(
            "PyTorch's output and its float64 output differ by {:.3e} at {}, more than a rounding error in {} \
             could there ({bound:.1e} = {epsilons} eps × the local magnitude): they are not two runs of the \
             same computation",
            (t[i] - r[i]).abs(),
            index_text(i, torch.dims()),
            dtype.as_str()
        )));
    }
    Ok(Ok(()))
}
