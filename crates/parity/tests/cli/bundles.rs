//! The committed reference bundles (exported from PyTorch by scripts/export_reference.py)
//! pass through the CLI, every block id has at least two of them, and a wrong port fails.

use crate::common::*;

#[test]
fn every_committed_bundle_passes() {
    let n = committed_bundles().len();
    let (code, out, err) = cli(&["check", weights().to_str().unwrap()]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains(&format!("{n} passed, 0 failed")), "{out}");
}

#[test]
fn every_committed_bundle_passes_in_float64_against_pytorch_float64() {
    let (code, out, err) = cli(&["check", "--dtype", "f64", weights().to_str().unwrap()]);
    assert_eq!(code, 0, "{out}\n{err}");
}

#[test]
fn every_registered_block_has_at_least_two_bundles() {
    let mut counts = std::collections::BTreeMap::new();
    for path in committed_bundles() {
        let b = unet_parity::bundle::Bundle::read(&path).unwrap();
        *counts.entry(b.block).or_insert(0) += 1;
    }
    for info in unet_parity::registry::all() {
        let n = counts.get(info.id).copied().unwrap_or(0);
        assert!(n >= 2, "{} has {n} bundles", info.id);
    }
}

#[test]
fn json_report_is_machine_readable() {
    let dir = weights().join("textbook");
    let n = unet_parity::bundle::collect(std::slice::from_ref(&dir)).unwrap().len();
    let (code, out, _) = cli(&["check", "--json", dir.to_str().unwrap()]);
    assert_eq!(code, 0);
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["failed"], 0);
    assert_eq!(doc["bundles"].as_array().unwrap().len(), n);
    assert!(doc["bundles"][0]["outputs"][0]["max_abs"].as_f64().unwrap() < 1e-5);
}

#[test]
fn a_perturbed_weight_fails_with_exit_code_1() {
    let dir = scratch("perturbed");
    let path = RawBundle::edited("diffusers/attention_vae_mid.safetensors", &dir, |b| {
        let w = b.tensors["to_k.weight"].clone();
        b.tensors.insert("to_k.weight".into(), (w * 1.001).unwrap());
    });
    let (code, out, _) = cli(&["check", path.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("FAIL") && out.contains("0 passed, 1 failed"), "{out}");
}

#[test]
fn a_wrong_head_count_fails() {
    // Same weights, 2 heads instead of 3: a plausible porting mistake.
    let dir = scratch("heads");
    let path = RawBundle::edited("fastai/self_attention_multihead_ni24_h4.safetensors", &dir, |b| {
        b.metadata
            .insert("parity.config".into(), r#"{"ni": 24, "nheads": 2}"#.into());
    });
    let (code, out, _) = cli(&["check", path.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
}

#[test]
fn blocks_lists_every_id_with_its_pytorch_class() {
    let (code, out, _) = cli(&["blocks"]);
    assert_eq!(code, 0);
    for id in [
        "denoising_diffusion_pytorch.Attention",
        "denoising_diffusion_pytorch.LinearAttention",
        "annotated_diffusion.Attention",
        "annotated_diffusion.LinearAttention",
        "ldm.LinearAttention",
        "diffusers.Attention",
        "fastai.SelfAttention",
        "fastai.SelfAttentionMultiHead",
        "torch.nn.MultiheadAttention",
        "textbook.SelfAttention",
        "textbook.MultiHeadAttention",
    ] {
        assert!(out.contains(id), "{id} missing from:\n{out}");
    }
}

#[test]
fn inspect_shows_metadata_and_tensors() {
    let f = weights().join("torch/mha_self_batch_first.safetensors");
    let (code, out, err) = cli(&["inspect", f.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("parity.block = torch.nn.MultiheadAttention"), "{out}");
    assert!(out.contains("in_proj_weight") && out.contains("[72, 24]"), "{out}");
}
