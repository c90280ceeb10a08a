//! The cases of one bundle output: our honest run and the wrong ones, each as the raw numbers
//! the pass rule decides on, so that `scripts/calibrate_summary.py` can choose the constants and
//! replay the verdicts under them.
//!
//! A case is `(ours, ours64, torch, float64)`: our output in the bundle's dtype and our float64
//! run against PyTorch's output and its float64 twin.
//!
//! * `honest`: our block on the bundle.
//! * `bug` (a wrong port): PyTorch's run of the module with a planted bug (the generator's bugs
//!   file) as "ours", with its float64 run as our float64 run where the file has it; and bias
//!   bugs planted here on our honest outputs (`bias_all_1e-3`: plus 10^-3 × the output's RMS
//!   everywhere, in both runs; `bias_channel_1e-3`: on the first slice of axis 1 only).
//! * `refbug` (a bundle from a wrong module, our block honest): the bug's output and its float64
//!   run as PyTorch's, ours honest.
//! * `tbug` (a wrong PyTorch run in the dtype only, e.g. an eps changed in float32 alone): the
//!   bug's output as PyTorch's, the honest float64 twin.
//! * `forge` (a PyTorch output replaced): zeros, negated, × 1.05, + 1e-3, plus noise of half its
//!   RMS, each rounded to the dtype; the honest twin.

use candle_core::{DType, Tensor};
use serde_json::{json, Value};
use unet_parity::compare::{
    check_reference, compare,
    maths::{needed_factor, twin_is_the_odd_one},
    plausibility, twin_error_eps, Float64Runs,
};

/// The embedding factors at which the maths check's needed factor is reported.
pub const EMBEDDING_GRID: [f64; 6] = [0.0, 4.0, 8.0, 16.0, 32.0, 64.0];

/// Our float64 runs of the bundle: as PyTorch builds its float32 embeddings, exact, and with the
/// published casts kept (`None` where the block has no such step).
pub struct Ours64 {
    pub plain: Vec<Tensor>,
    pub exact: Option<Vec<Tensor>>,
    pub kept: Option<Vec<Tensor>>,
}

/// One case's tensors.
pub struct Case<'a> {
    pub scenario: &'a str,
    pub bug: &'a str,
    pub ours: Tensor,
    /// Our float64 run under the exporters' convention (and the kept-casts one where it exists);
    /// `None` where the case has none (a PyTorch bug output without its float64 run).
    pub ours64: Option<(Tensor, Option<Tensor>)>,
    pub torch: Tensor,
    pub reference: Tensor,
}

/// The line of one case (see the module docs), for output `name` of a bundle in `dtype`; `emb`
/// is the pair of our honest float64 runs that measures the embeddings' effect.
pub fn case_line(case: &Case, name: &str, dtype: DType, emb: Option<(&Tensor, &Tensor)>) -> candle_core::Result<Value> {
    let (rtol, atol) = unet_parity::compare::default_tolerance(dtype);
    let report = compare(name, &case.ours, &case.torch, Some(&case.reference), rtol, atol)?;
    let beyond = check_reference(&case.torch, &case.reference, dtype)?.is_err();
    let (twin_e, twin_w) = twin_error_eps(&case.torch, &case.reference, dtype)?;
    let p = plausibility(&case.ours, &case.torch, &case.reference, dtype, beyond)?;
    let mut line = json!({
        "kind": "case",
        "scenario": case.scenario,
        "bug": case.bug,
        "name": name,
        "elements": case.ours.elem_count(),
        "outside_a": report.failed_elements + report.torch_error_elements > 0,
        "element_factor": factor(report.element_factor),
        "window_factor": factor(report.window_factor),
        "non_finite": report.non_finite,
        "beyond": beyond,
        "twin_element_eps": factor(Some(twin_e)),
        "twin_rms_eps": factor(Some(twin_w)),
        "plaus_global": factor(Some(p.global_ratio)),
        "plaus_window": factor(Some(p.window_ratio)),
        "plaus_bias": factor(Some(p.bias_ratio)),
    });
    if let Some((ours64, kept)) = &case.ours64 {
        let needed = |run: &Tensor, convention: &str| -> candle_core::Result<Vec<f64>> {
            // under the kept convention, the casts' effect: this run against the plain one
            let casts = (convention == "casts kept").then_some((run, ours64));
            let runs = Float64Runs {
                ours64: run,
                embeddings: emb,
                casts,
                convention,
            };
            EMBEDDING_GRID
                .iter()
                .map(|b| needed_factor(&runs, &case.torch, &case.reference, dtype, *b))
                .collect()
        };
        let off = needed(ours64, "casts off")?;
        line["maths_off"] = off.iter().map(|x| factor(Some(*x))).collect::<Vec<_>>().into();
        if let Some(kept) = kept {
            let k = needed(kept, "casts kept")?;
            line["maths_kept"] = k.iter().map(|x| factor(Some(*x))).collect::<Vec<_>>().into();
        }
        line["odd_twin"] = twin_is_the_odd_one(&case.torch, &case.reference, ours64)?.into();
    }
    Ok(line)
}

/// The forged PyTorch outputs of `t` (in `dtype`).
pub fn forgeries(t: &Tensor, dtype: DType, seed: u64) -> candle_core::Result<Vec<(&'static str, Tensor)>> {
    let t64 = t.to_dtype(DType::F64)?;
    let rms = t64.sqr()?.mean_all()?.to_scalar::<f64>()?.sqrt();
    let noise = deterministic_normal(t64.elem_count(), seed);
    let noise = Tensor::from_vec(noise, t64.dims(), t64.device())?;
    let out = vec![
        ("zeros", t64.zeros_like()?),
        ("neg", t64.neg()?),
        ("x1.05", (&t64 * 1.05)?),
        ("+1e-3", (&t64 + 1e-3)?),
        ("noise", (&t64 + (noise * (0.5 * rms))?)?),
    ];
    out.into_iter().map(|(k, x)| Ok((k, x.to_dtype(dtype)?))).collect()
}

/// Standard normal draws from a fixed generator (xorshift and Box–Muller).
fn deterministic_normal(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ((s >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    (0..n)
        .map(|_| (-2.0 * next().ln()).sqrt() * (std::f64::consts::TAU * next()).cos())
        .collect()
}

/// `value + shift·mask` where `mask` is the first slice of axis 1 (`channel`) or everything.
pub fn shifted(value: &Tensor, shift: f64, channel: bool) -> candle_core::Result<Tensor> {
    let v = value.to_dtype(DType::F64)?;
    if !channel {
        return (&v + shift)?.to_dtype(value.dtype());
    }
    let per_channel = v.dims()[2..].iter().product::<usize>();
    let mut mask = vec![0f64; v.elem_count()];
    mask[..per_channel].iter_mut().for_each(|m| *m = shift);
    let mask = Tensor::from_vec(mask, v.dims(), v.device())?;
    (&v + mask)?.to_dtype(value.dtype())
}

/// The RMS of `t`.
pub fn rms(t: &Tensor) -> candle_core::Result<f64> {
    Ok(t.to_dtype(DType::F64)?.sqr()?.mean_all()?.to_scalar::<f64>()?.sqrt())
}

pub fn factor(f: Option<f64>) -> Value {
    match f {
        Some(f) if f.is_infinite() => "inf".into(),
        Some(f) if f.is_nan() => "nan".into(),
        Some(f) => f.into(),
        None => Value::Null,
    }
}
