//! `check --device` and `check --dtype`: a device this build cannot use is a one-line error with
//! exit code 2 (never a panic), and a run in another dtype than the bundle's is compared with the
//! float64 output under the documented rule (`unet_parity::check`).

use crate::common::*;

const F32: &str = "textbook/self_attention_dx6_d5_dv7.safetensors";
const F16: &str = "textbook/self_attention_dx6_d5_dv7_f16.safetensors";

fn bundle(rel: &str) -> String {
    weights().join(rel).to_str().unwrap().to_string()
}

/// Exit code 2 and exactly one `error:` line on stderr that contains every needle.
fn expect_device_error(args: &[&str], needles: &[&str]) {
    let (code, out, err) = cli(args);
    assert_eq!(code, 2, "stdout:\n{out}\nstderr:\n{err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one error line, got {err:?}");
    assert!(lines[0].starts_with("error:"), "{err}");
    for needle in needles {
        assert!(lines[0].contains(needle), "{needle:?} not in {:?}", lines[0]);
    }
    assert!(out.is_empty(), "nothing is checked when the device is unusable: {out}");
}

#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_without_the_feature_is_a_one_line_error_naming_the_device() {
    let f = bundle(F32);
    expect_device_error(&["check", "--device", "cuda", &f], &["cuda:0", "--features cuda"]);
    expect_device_error(
        &["check", "--device", "cuda:1", &f],
        &["cuda:1", "without CUDA support"],
    );
}

#[cfg(not(feature = "metal"))]
#[test]
fn metal_without_the_feature_is_a_one_line_error_naming_the_device() {
    let f = bundle(F32);
    expect_device_error(&["check", "--device", "metal:2", &f], &["metal:2", "--features metal"]);
}

#[test]
fn candle_reports_backends_that_are_not_compiled_in_as_errors() {
    // What the CLI relies on: the constructors exist in every build and fail instead of panicking.
    if !candle_core::utils::cuda_is_available() {
        let e = candle_core::Device::new_cuda(0).unwrap_err().to_string();
        assert!(e.to_lowercase().contains("cuda"), "{e}");
    }
    if !candle_core::utils::metal_is_available() {
        let e = candle_core::Device::new_metal(0).unwrap_err().to_string();
        assert!(e.to_lowercase().contains("metal"), "{e}");
    }
}

#[test]
fn a_device_that_does_not_parse_is_a_usage_error() {
    let f = bundle(F32);
    for bad in ["tpu", "cuda:x", "cpu:0", "cuda:-1"] {
        let (code, _, err) = cli(&["check", "--device", bad, &f]);
        assert_eq!(code, 2, "{bad}: {err}");
        assert!(err.contains(bad) || err.contains("--device"), "{bad}: {err}");
    }
}

#[test]
fn cpu_is_the_default_device_and_is_reported() {
    let f = bundle(F32);
    for args in [
        vec!["check", "--json", &f],
        vec!["check", "--json", "--device", "cpu", &f],
    ] {
        let (code, out, err) = cli(&args);
        assert_eq!(code, 0, "{out}\n{err}");
        let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
        let report = &doc["bundles"][0];
        assert_eq!(report["device"], "cpu");
        assert_eq!(report["dtype"], "f32");
        assert_eq!(report["bundle_dtype"], "f32");
        assert_eq!(report["reference"], "pytorch");
    }
}

#[test]
fn dtype_accepts_the_four_float_types_and_nothing_else() {
    let f = bundle(F32);
    let (code, _, err) = cli(&["check", "--dtype", "f8", &f]);
    assert_eq!(code, 2, "{err}");
    for dtype in ["f32", "f16", "bf16", "f64"] {
        let (code, out, err) = cli(&["check", "--json", "--dtype", dtype, &f]);
        assert!(code == 0 || code == 1, "--dtype {dtype}: {out}\n{err}");
        let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(doc["bundles"][0]["dtype"], dtype);
    }
}

#[test]
fn a_half_bundle_run_in_f32_is_checked_against_float64_and_passes() {
    // Rule (b) against PyTorch's float16 error: f32 arithmetic is far more accurate than that.
    let (code, out, err) = cli(&["check", "--json", "--dtype", "f32", &bundle(F16)]);
    assert_eq!(code, 0, "{out}\n{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    let report = &doc["bundles"][0];
    assert_eq!(report["reference"], "float64");
    assert_eq!(report["bundle_dtype"], "f16");
    let o = &report["outputs"][0];
    assert!(o["ours_vs_f64"].as_f64().unwrap() < 1e-5, "{o}");
    assert!(o["torch_vs_f64"].as_f64().unwrap() > 1e-4, "{o}");
}

#[test]
fn an_f32_bundle_run_in_f16_is_held_to_pytorchs_f32_error() {
    // The only PyTorch error an f32 bundle holds is its float32 one: half precision cannot reach
    // it, and the reason says which yardstick failed.
    let (code, out, err) = cli(&["check", "--dtype", "f16", &bundle(F32)]);
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(out.contains("run in f16") && out.contains("bundle's dtype"), "{out}");
    // The f16 twin is the bundle that measures PyTorch's half-precision error; it passes.
    let (code, out, err) = cli(&["check", &bundle(F16)]);
    assert_eq!(code, 0, "{out}\n{err}");
}

/// With `--features cuda` on a machine with a GPU, every committed bundle must pass there too;
/// without a usable GPU the CLI must say so in one line (exit 2).
#[cfg(feature = "cuda")]
#[test]
fn cuda_runs_every_committed_bundle_or_says_why_not() {
    let (code, out, err) = cli(&["check", "--device", "cuda", weights().to_str().unwrap()]);
    if candle_core::Device::new_cuda(0).is_ok() {
        assert_eq!(code, 0, "{out}\n{err}");
    } else {
        assert_eq!(code, 2, "{out}\n{err}");
        assert!(err.contains("cuda:0"), "{err}");
    }
}

/// The same for Metal (`--features metal`, macOS only).
#[cfg(feature = "metal")]
#[test]
fn metal_runs_every_committed_bundle_or_says_why_not() {
    let (code, out, err) = cli(&["check", "--device", "metal", weights().to_str().unwrap()]);
    if candle_core::Device::new_metal(0).is_ok() {
        assert_eq!(code, 0, "{out}\n{err}");
    } else {
        assert_eq!(code, 2, "{out}\n{err}");
        assert!(err.contains("metal:0"), "{err}");
    }
}
