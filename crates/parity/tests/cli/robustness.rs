//! A non-finite result on our side is a FAIL with its own message, never a pass; dtype
//! conversions are said, not silent.

use crate::common::*;
use candle_core::{DType, Device, Tensor};
use unet_parity::compare::compare;

fn t(v: &[f32]) -> Tensor {
    Tensor::new(v, &Device::Cpu).unwrap()
}

#[test]
fn non_finite_values_pass_only_where_pytorch_has_the_same() {
    let (nan, inf) = (f32::NAN, f32::INFINITY);
    // NaN where PyTorch has NaN (a fully masked row), +inf where it has +inf: a pass.
    let r = compare("o", &t(&[1.0, nan, inf]), &t(&[1.0, nan, inf]), None, 1e-6, 1e-6).unwrap();
    assert!(r.pass && r.non_finite == 0, "{r:?}");
    // NaN where PyTorch is finite: a fail, whatever the float64 reference says.
    let r = compare("o", &t(&[1.0, nan]), &t(&[1.0, 2.0]), Some(&t(&[1.0, 2.0])), 1e-6, 1e-6).unwrap();
    assert!(!r.pass && r.non_finite == 1, "{r:?}");
    let reason = r.reason.unwrap();
    assert!(reason.starts_with("non-finite output: 1 of our values"), "{reason}");
    // NaN where PyTorch has inf, -inf where it has +inf: different non-finite values fail too.
    let r = compare("o", &t(&[nan, -inf]), &t(&[inf, inf]), None, 1e-6, 1e-6).unwrap();
    assert!(!r.pass && r.non_finite == 2, "{r:?}");
    assert!(r
        .reason
        .unwrap()
        .contains("for 2 of them, a different non-finite value"));
    // PyTorch non-finite where ours is finite: a fail with its own message.
    let r = compare("o", &t(&[1.0, 0.0]), &t(&[1.0, nan]), None, 1e-6, 1e-6).unwrap();
    assert!(!r.pass && r.torch_non_finite == 1, "{r:?}");
    assert!(r.reason.unwrap().contains("PyTorch's output has 1 NaN or inf"));
    // Rule (b) cannot rescue a NaN: ours NaN, PyTorch finite but far from float64.
    let r = compare("o", &t(&[nan]), &t(&[5.0]), Some(&t(&[1.0])), 1e-6, 1e-6).unwrap();
    assert!(!r.pass, "{r:?}");
}

#[test]
fn an_overflowing_forward_fails_with_the_non_finite_message() {
    // Finite weights so large that our f32 attention scores overflow: the block's output is
    // NaN/inf where PyTorch's (from the original weights) is finite.
    let dir = scratch("overflow-forward");
    let p = RawBundle::edited("textbook/self_attention_dx6_d5_dv7.safetensors", &dir, |b| {
        for k in ["q.weight", "k.weight"] {
            let w = (&b.tensors[k] * 1e30).unwrap();
            b.tensors.insert(k.into(), w);
        }
    });
    let (code, out, err) = cli(&["check", p.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("FAIL") && out.contains("non-finite output:"), "{out}");
    let (_, json, _) = cli(&["check", "--json", p.to_str().unwrap()]);
    let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(
        doc["bundles"][0]["outputs"][0]["non_finite"].as_u64().unwrap() > 0,
        "{json}"
    );
}

#[test]
fn dtype_conversions_are_reported_once_per_bundle() {
    let dir = scratch("conversions");
    // A float64 weight and a float16 one in a float32 bundle.
    let p = RawBundle::edited("diffusers/attention_vae_mid.safetensors", &dir, |b| {
        let w = b.tensors["to_q.weight"].to_dtype(DType::F64).unwrap();
        b.tensors.insert("to_q.weight".into(), w);
        let w = b.tensors["to_k.bias"].to_dtype(DType::F16).unwrap();
        b.tensors.insert("to_k.bias".into(), w);
    });
    let (code, out, err) = cli(&["check", p.to_str().unwrap()]);
    assert!(code != 2, "{out}{err}");
    let notes: Vec<&str> = err.lines().filter(|l| l.starts_with("note:")).collect();
    assert_eq!(notes.len(), 1, "{err}");
    assert!(
        notes[0].contains("converted f16 -> f32: to_k.bias (1 tensor)")
            && notes[0].contains("converted f64 -> f32: to_q.weight (1 tensor)"),
        "{err}"
    );
    let (_, json, err) = cli(&["check", "--json", p.to_str().unwrap()]);
    assert!(!err.contains("note:"), "the JSON report carries the conversions: {err}");
    let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
    let conv = &doc["bundles"][0]["conversions"];
    assert_eq!(conv[0]["from"], "f16");
    assert_eq!(conv[0]["tensors"], serde_json::json!(["to_k.bias"]));
    assert_eq!(conv[1]["from"], "f64");
    // A bundle stored in its run dtype converts nothing and says nothing.
    let (code, _, err) = cli(&[
        "check",
        weights()
            .join("diffusers/attention_vae_mid.safetensors")
            .to_str()
            .unwrap(),
    ]);
    assert_eq!(code, 0);
    assert!(!err.contains("note:"), "{err}");
    // --dtype f64 converts every weight and input: said once, with the count.
    let (_, _, err) = cli(&[
        "check",
        "--dtype",
        "f64",
        weights()
            .join("textbook/self_attention_dx6_d5_dv7.safetensors")
            .to_str()
            .unwrap(),
    ]);
    assert!(
        err.lines().filter(|l| l.starts_with("note:")).count() == 1
            && err.contains("f32 -> f64")
            && err.contains("parity.input.x"),
        "{err}"
    );
}
