//! A PASS cannot be had without a real comparison: a PyTorch output (or float64 twin) with NaN
//! or ±inf, infinite or negative tolerances, and a float64 output that is not PyTorch's own twin
//! are refused, each with its reason. (Issue 20, "Wrong PASS"; issue 18, non-finite references.)

use crate::common::*;
use candle_core::Tensor;
use std::path::Path;

const TEXTBOOK: &str = "textbook/self_attention_dx6_d5_dv7.safetensors";

fn output_name(b: &RawBundle) -> String {
    let key = b
        .tensors
        .keys()
        .find(|k| k.starts_with("parity.output.") && !k.ends_with(".float64"))
        .expect("an output");
    key.clone()
}

fn check(p: &Path, extra: &[&str]) -> (i32, String, String) {
    let mut args = vec!["check"];
    args.extend_from_slice(extra);
    args.push(p.to_str().unwrap());
    cli(&args)
}

/// Exit code 2, nothing reported as PASS, and the error names PyTorch's output and the count.
fn expect_refused(p: &Path, needle: &str) {
    for extra in [
        &[][..],
        &["--json"][..],
        &["--dtype", "f64"][..],
        &["--atol", "1e9", "--rtol", "1e9"][..],
    ] {
        let (code, out, err) = check(p, extra);
        assert_eq!(code, 2, "{extra:?}: {out}{err}");
        assert!(
            !out.contains("PASS") && !out.contains("\"pass\": true"),
            "{extra:?}: {out}"
        );
        let all = format!("{out}{err}");
        assert!(
            all.contains("PyTorch's output `parity.output.") && all.contains(needle),
            "{extra:?}: {all}"
        );
    }
}

/// Weights ×1e30: PyTorch's f32 output overflows to NaN (its float64 output stays finite) and so
/// does ours. NaN against NaN proves nothing, and used to pass with max abs 0.
#[test]
fn nan_against_nan_never_passes() {
    let dir = scratch("forged-nan");
    let overflow = |b: &mut RawBundle| {
        for k in ["q.weight", "k.weight", "v.weight"] {
            let w = (&b.tensors[k] * 1e30).unwrap();
            b.tensors.insert(k.into(), w);
        }
        let out = output_name(b);
        let nan = (b.tensors[&out].zeros_like().unwrap() * f64::NAN).unwrap();
        b.tensors.insert(out, nan);
    };
    // With the float64 twin and without it: a reference that is NaN cannot vouch for anything.
    expect_refused(&RawBundle::edited(TEXTBOOK, &dir, overflow), "NaN");
    let p = RawBundle::edited(TEXTBOOK, &dir, |b| {
        overflow(b);
        b.tensors.retain(|k, _| !k.ends_with(".float64"));
    });
    expect_refused(&p, "NaN");
}

/// PyTorch's output with one +inf and one -inf, the rest untouched: ours matches everywhere
/// else, and before, `inf` against a finite float64 value made "within 2× PyTorch's error"
/// infinite. Refused in the bundle's f32, in the f16 and bf16 twins, with and without the
/// float64 output.
#[test]
fn an_infinite_reference_output_is_never_a_pass() {
    let dir = scratch("forged-inf");
    for (rel, twin) in [
        (TEXTBOOK, true),
        (TEXTBOOK, false),
        ("textbook/self_attention_dx6_d5_dv7_f16.safetensors", true),
        ("textbook/self_attention_dx6_d5_dv7_f16.safetensors", false),
        ("textbook/self_attention_dx6_d5_dv7_bf16.safetensors", false),
    ] {
        let p = RawBundle::edited(rel, &dir, |b| {
            let out = output_name(b);
            let t = &b.tensors[&out];
            let mut v = t
                .to_dtype(candle_core::DType::F64)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f64>()
                .unwrap();
            v[0] = f64::INFINITY;
            v[1] = f64::NEG_INFINITY;
            let edited = Tensor::from_vec(v, t.dims(), t.device())
                .unwrap()
                .to_dtype(t.dtype())
                .unwrap();
            b.tensors.insert(out, edited);
            if !twin {
                b.tensors.retain(|k, _| !k.ends_with(".float64"));
            }
        });
        expect_refused(&p, "1 +inf, 1 -inf");
        let (code, out, _) = check(&weights().join(rel), &[]);
        assert_eq!(code, 0, "{rel}: the committed bundle passes: {out}");
    }
}

/// A float64 twin with NaN where PyTorch's own output is finite is refused the same way.
#[test]
fn a_non_finite_float64_output_is_refused() {
    let dir = scratch("forged-nan64");
    let p = RawBundle::edited(TEXTBOOK, &dir, |b| {
        let key = format!("{}.float64", output_name(b));
        let t = &b.tensors[&key];
        let mut v = t.flatten_all().unwrap().to_vec1::<f64>().unwrap();
        v[3] = f64::NAN;
        b.tensors
            .insert(key, Tensor::from_vec(v, t.dims(), t.device()).unwrap());
    });
    expect_refused(&p, "1 NaN");
}

#[test]
fn tolerances_must_be_finite_and_not_negative() {
    let p = weights().join(TEXTBOOK);
    for (flag, value) in [
        ("--atol", "inf"),
        ("--rtol", "1e400"),
        ("--atol", "-1e-5"),
        ("--rtol", "NaN"),
    ] {
        let arg = format!("{flag}={value}");
        let (code, out, err) = check(&p, &[&arg]);
        assert_eq!(code, 2, "{arg}: {out}{err}");
        assert!(err.contains("finite number ≥ 0"), "{err}");
        assert!(!out.contains("PASS"), "{out}");
    }
    // A good explicit tolerance still runs.
    let (code, out, err) = check(&p, &["--atol", "1e-5", "--rtol", "0"]);
    assert_eq!(code, 0, "{out}{err}");
    // The same from a bundle's metadata.
    let dir = scratch("forged-tolerance");
    for (key, value) in [("parity.atol", "inf"), ("parity.rtol", "1e400"), ("parity.atol", "-1")] {
        let p = RawBundle::edited(TEXTBOOK, &dir, |b| {
            b.metadata.insert(key.into(), value.into());
        });
        let (code, out, err) = check(&p, &[]);
        assert_eq!(code, 2, "{key}={value}: {out}{err}");
        assert!(err.contains(key) && err.contains("finite number ≥ 0"), "{err}");
    }
}

/// Rule (b) holds ours against the bundle's float64 output; a float64 output that is not a twin
/// of PyTorch's (here PyTorch's + 100) must not let a wrong port through.
#[test]
fn a_float64_output_that_is_not_pytorchs_twin_is_refused() {
    let dir = scratch("forged-f64");
    let p = RawBundle::edited(TEXTBOOK, &dir, |b| {
        let out = output_name(b);
        let f64_key = format!("{out}.float64");
        let shifted = (&b.tensors[&f64_key] + 100.0).unwrap();
        b.tensors.insert(f64_key, shifted);
        // And our side made wrong by 5, which rule (b) would then have accepted.
        let off: Tensor = (&b.tensors[&out] - 5.0).unwrap();
        b.tensors.insert(out, off);
    });
    let (code, out, err) = check(&p, &[]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("differ by") && err.contains("rounding error"), "{err}");
}
