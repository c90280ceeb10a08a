//! A PASS cannot be had without a real comparison: NaN against NaN, infinite or negative
//! tolerances, and a float64 output that is not PyTorch's own twin are refused, each with its
//! reason. (Issue 20, "Wrong PASS".)

mod common;
use candle_core::Tensor;
use common::*;
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

/// Weights ×1e30: PyTorch's f32 output overflows to NaN (its float64 output stays finite) and so
/// does ours. NaN against NaN proved nothing, and used to pass with max abs 0.
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
    // With the float64 twin: PyTorch's own run is broken there, so the bundle is unusable.
    let p = RawBundle::edited(TEXTBOOK, &dir, overflow);
    let (code, out, err) = check(&p, &[]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("NaN or inf at") && err.contains("float64 output is finite"),
        "{err}"
    );
    assert!(!out.contains("PASS"), "{out}");
    // Without it: nothing finite is compared, a FAIL.
    let p = RawBundle::edited(TEXTBOOK, &dir, |b| {
        overflow(b);
        b.tensors.retain(|k, _| !k.ends_with(".float64"));
    });
    let (code, out, err) = check(&p, &[]);
    assert!(code != 0 && !out.contains("PASS"), "{code}\n{out}{err}");
    let (_, json, _) = check(&p, &["--json"]);
    assert!(
        json.contains("no finite value to compare") || json.contains("non-finite output"),
        "{json}"
    );
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
    assert!(
        err.contains("differ by up to") && err.contains("rounding error"),
        "{err}"
    );
}
