//! What a dtype allows: `torch.testing.assert_close`'s default tolerances, the machine epsilon,
//! and how far PyTorch's output may be from its float64 twin before the twin is refused.

use super::{index_text, values, ErrorModel, NEIGHBOURHOOD};
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

/// How far PyTorch's output may be from its float64 twin, in units of the dtype's epsilon,
/// relative to the local magnitude of [`ErrorModel`]: at any one element, and as the RMS over an
/// element's neighbourhood.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TwinBounds {
    pub element: f64,
    pub rms: f64,
}

/// The twin bounds of a dtype: PyTorch's largest errors on the well-conditioned ("normal")
/// generated calibration bundles (docs/cli.md, "Calibration"), rounded up. Float32 accumulates many
/// roundings in deep blocks; float16 and bfloat16 outputs are computed in f32 inside and rounded
/// once per op. Beyond them a twin is used only once our float64 run confirms it ([`confirm_twin`]).
pub fn twin_bounds(dtype: DType) -> TwinBounds {
    match dtype {
        DType::F32 | DType::F64 => TwinBounds {
            element: 60.0,
            rms: 16.0,
        },
        _ => TwinBounds {
            element: 24.0,
            rms: 4.3,
        },
    }
}

/// Why a float64 twin cannot be used as it is.
#[derive(Debug, Clone, PartialEq)]
pub enum TwinProblem {
    /// Its shape differs, or PyTorch's output is NaN or inf where the twin is finite: the bundle
    /// is unusable.
    Unusable(String),
    /// PyTorch's error against it is beyond what rounding in the dtype reaches on the generated
    /// bundles ([`twin_bounds`]): a block too ill-conditioned for the dtype, or a twin that is
    /// not PyTorch's. Usable only once an independent float64 run confirms it ([`confirm_twin`]).
    BeyondRounding(String),
}

impl std::fmt::Display for TwinProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TwinProblem::Unusable(why) | TwinProblem::BeyondRounding(why) => f.write_str(why),
        }
    }
}

/// The twin bounds of a *stage* (`parity.trace.<stage>.float64`, `.float64_delta`): PyTorch's
/// largest errors on the normal calibration bundles' stages, which are wider than the outputs'
/// (a GEGLU's `ff/act` multiplies two rounded halves; attention weights near 0). A stage twin
/// beyond them is ignored and the stage judged by rule (a) alone.
pub fn stage_twin_bounds(dtype: DType) -> TwinBounds {
    match dtype {
        DType::F32 | DType::F64 => TwinBounds {
            element: 350.0,
            rms: 60.0,
        },
        _ => TwinBounds {
            element: 250.0,
            rms: 32.0,
        },
    }
}

/// Whether PyTorch's output `torch` (in `dtype`) and its float64 twin `reference` agree as two runs
/// of the same computation can, element by element: every element where the float64 output is
/// finite is finite in `torch` too, and PyTorch's relative error (see [`ErrorModel`]) is within
/// [`twin_bounds`] at every element and as an RMS over every neighbourhood. A float64 output that
/// differs more would license rule (b) to pass what PyTorch's dtype cannot explain. `Err` says what
/// is wrong and where.
pub fn check_reference(
    torch: &Tensor,
    reference: &Tensor,
    dtype: DType,
) -> candle_core::Result<Result<(), TwinProblem>> {
    check_reference_within(torch, reference, dtype, twin_bounds(dtype))
}

/// [`check_reference`] against other bounds ([`stage_twin_bounds`] for a stage's twin).
pub fn check_reference_within(
    torch: &Tensor,
    reference: &Tensor,
    dtype: DType,
    bounds: TwinBounds,
) -> candle_core::Result<Result<(), TwinProblem>> {
    if torch.dims() != reference.dims() {
        return Ok(Err(TwinProblem::Unusable(format!(
            "the float64 output has shape {:?}, the output {:?}",
            reference.dims(),
            torch.dims()
        ))));
    }
    let (t, r) = (values(torch)?, values(reference)?);
    let broken = t
        .iter()
        .zip(&r)
        .filter(|(x, y)| !x.is_finite() && y.is_finite())
        .count();
    if broken > 0 {
        return Ok(Err(TwinProblem::Unusable(format!(
            "PyTorch's output is NaN or inf at {broken} elements where its float64 output is finite \
             (an overflow in PyTorch's own run): these cannot be verified; export with smaller weights or inputs"
        ))));
    }
    Ok(twin_within_bounds(&t, &r, dtype, bounds, torch.dims()).map_err(TwinProblem::BeyondRounding))
}

/// Whether our float64 run confirms the float64 output `reference` of a block whose PyTorch error
/// (`torch` against it) is beyond [`twin_bounds`] (an ill-conditioned block, or a twin that is not
/// PyTorch's): our float64 run `ours64` agrees with it to a hundredth of PyTorch's own error,
/// element by element: `|ours64_i − reference_i| ≤ m_i · (U_i / 100 + 64 · eps(f64))` (the model's local
/// magnitude and PyTorch's local RMS error), so it is as good a reference as a float64 run can be
/// for that error. A twin forged far from PyTorch's output fails this unless it was forged onto
/// the float64 output of the very port being checked (docs/cli.md says so). `Err` names the worst
/// element.
pub fn confirm_twin(ours64: &Tensor, torch: &Tensor, reference: &Tensor) -> candle_core::Result<Result<(), String>> {
    if ours64.dims() != reference.dims() {
        return Ok(Err(format!(
            "our float64 run has shape {:?}, the float64 output {:?}",
            ours64.dims(),
            reference.dims()
        )));
    }
    let (o64, t, r) = (values(ours64)?, values(torch)?, values(reference)?);
    let model = ErrorModel::new(&t, &r);
    let mut worst: Option<(usize, f64, f64)> = None;
    for i in 0..r.len() {
        let allowed = model.scale[i] * (model.torch_rms[i] / 100.0 + 64.0 * epsilon(DType::F64));
        let diff = (o64[i] - r[i]).abs();
        let excess = if diff.is_nan() { f64::INFINITY } else { diff / allowed };
        if excess > 1.0 && worst.is_none_or(|(_, e, _)| excess > e) {
            worst = Some((i, excess, allowed));
        }
    }
    if let Some((i, _, allowed)) = worst {
        return Ok(Err(format!(
            "our float64 run does not confirm the float64 output: it differs by {:.3e} at {}, more than a hundredth \
             of PyTorch's own error there ({allowed:.1e})",
            (o64[i] - r[i]).abs(),
            index_text(i, ours64.dims())
        )));
    }
    Ok(Ok(()))
}

/// PyTorch's largest relative error against the float64 output, at one element and as a
/// neighbourhood RMS, in epsilons of `dtype` (relative to the local magnitude, as
/// [`twin_bounds`] measures them): for the calibration.
pub fn twin_error_eps(torch: &Tensor, reference: &Tensor, dtype: DType) -> candle_core::Result<(f64, f64)> {
    let (t, r) = (values(torch)?, values(reference)?);
    let model = ErrorModel::new(&t, &r);
    let eps = epsilon(dtype);
    let element = (0..t.len())
        .map(|i| model.torch_error(t[i], r[i], i))
        .fold(0.0, f64::max);
    let rms = model.torch_rms.iter().copied().fold(0.0, f64::max);
    Ok((element / eps, rms / eps))
}

/// [`check_reference`] on values: the worst element against the elementwise bound, then the worst
/// neighbourhood against the RMS bound.
fn twin_within_bounds(t: &[f64], r: &[f64], dtype: DType, bounds: TwinBounds, dims: &[usize]) -> Result<(), String> {
    let model = ErrorModel::new(t, r);
    let eps = epsilon(dtype);
    let worst = |v: &mut dyn Iterator<Item = f64>| {
        v.enumerate()
            .fold((0, 0.0), |(wi, w), (i, x)| if x > w { (i, x) } else { (wi, w) })
    };
    let (i, u) = worst(
        &mut t
            .iter()
            .zip(r)
            .enumerate()
            .map(|(i, (x, y))| model.torch_error(*x, *y, i)),
    );
    if u > bounds.element * eps {
        return Err(format!(
            "PyTorch's output and its float64 output differ by {:.3e} at {}, {:.1} eps of {} × the local magnitude \
             {:.3e}, more than a rounding error in {} reaches there (at most {} eps): they are not two runs of the \
             same computation",
            (t[i] - r[i]).abs(),
            index_text(i, dims),
            u / eps,
            dtype.as_str(),
            model.scale[i],
            dtype.as_str(),
            bounds.element
        ));
    }
    let (i, rms) = worst(&mut model.torch_rms.iter().copied());
    if rms > bounds.rms * eps {
        return Err(format!(
            "PyTorch's output and its float64 output differ by {:.1} eps of {} (relative to the local magnitude) as \
             an RMS over the {NEIGHBOURHOOD} places each side of {}, more than a rounding error in {} reaches (at most {} eps): \
             they are not two runs of the same computation",
            rms / eps,
            dtype.as_str(),
            index_text(i, dims),
            dtype.as_str(),
            bounds.rms
        ));
    }
    Ok(())
}
