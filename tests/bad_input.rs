//! Bad input gets a one-line error naming what is wrong and exit code 2, never a panic.

mod common;
use common::*;
use std::path::Path;

/// Check `path` and expect exit code 2 with an error line containing every `needle`.
fn expect_unusable(path: &Path, needles: &[&str]) {
    let (code, out, err) = cli(&["check", path.to_str().unwrap()]);
    assert_eq!(code, 2, "stdout:\n{out}\nstderr:\n{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_else(|| panic!("no error line in {err:?}"));
    for needle in needles {
        assert!(line.contains(needle), "{needle:?} not in {line:?}");
    }
}

const VAE: &str = "diffusers/attention_vae_mid.safetensors";

#[test]
fn missing_weight_names_the_key_and_the_block() {
    let dir = scratch("missing");
    let p = RawBundle::edited(VAE, &dir, |b| {
        b.tensors.remove("to_v.bias");
    });
    expect_unusable(
        &p,
        &[
            "to_v.bias",
            "missing",
            "attention_vae_mid.safetensors",
            "diffusers.Attention",
        ],
    );
}

#[test]
fn shape_mismatch_says_expected_and_found() {
    let dir = scratch("shape");
    let p = RawBundle::edited(VAE, &dir, |b| {
        let w = b.tensors["to_q.weight"].narrow(0, 0, 16).unwrap();
        b.tensors.insert("to_q.weight".into(), w);
    });
    expect_unusable(&p, &["to_q.weight", "[16, 32]", "expected", "diffusers.Attention"]);
}

#[test]
fn unknown_block_lists_the_known_ones() {
    let dir = scratch("block");
    let p = RawBundle::edited(VAE, &dir, |b| {
        b.metadata.insert("parity.block".into(), "diffusers.Atention".into());
    });
    expect_unusable(
        &p,
        &[
            "diffusers.Atention",
            "known blocks",
            "diffusers.Attention",
            "torch.nn.MultiheadAttention",
        ],
    );
}

#[test]
fn unknown_config_key_is_named() {
    let dir = scratch("config-key");
    let p = RawBundle::edited(
        "denoising_diffusion_pytorch/attention_dim24_h3_d8_mem4.safetensors",
        &dir,
        |b| {
            b.metadata.insert(
                "parity.config".into(),
                r#"{"dim": 24, "heads": 3, "dim_head": 8, "num_mem_kv": 4, "head_dim": 8}"#.into(),
            );
        },
    );
    expect_unusable(&p, &["head_dim", "unknown field"]);
}

#[test]
fn config_of_the_wrong_json_type_is_an_error() {
    let dir = scratch("config-type");
    let p = RawBundle::edited("ldm/linear_attention_dim24_h3_d8.safetensors", &dir, |b| {
        b.metadata.insert("parity.config".into(), r#"{"dim": "24"}"#.into());
    });
    expect_unusable(&p, &["invalid config", "dim"]);
    let p = RawBundle::edited("ldm/linear_attention_dim24_h3_d8.safetensors", &dir, |b| {
        b.metadata.insert("parity.config".into(), "[24]".into());
    });
    expect_unusable(&p, &["parity.config", "JSON object"]);
}

#[test]
fn heads_not_dividing_channels_is_an_error() {
    let dir = scratch("heads");
    let p = RawBundle::edited("fastai/self_attention_multihead_ni24_h4.safetensors", &dir, |b| {
        b.metadata
            .insert("parity.config".into(), r#"{"ni": 24, "nheads": 5}"#.into());
    });
    expect_unusable(&p, &["5", "24"]);
    let p = RawBundle::edited(VAE, &dir, |b| {
        let mut cfg: serde_json::Value = serde_json::from_str(&b.metadata["parity.config"]).unwrap();
        cfg["norm_num_groups"] = 5.into();
        b.metadata.insert("parity.config".into(), cfg.to_string());
    });
    expect_unusable(&p, &["5 norm groups do not divide 32 channels"]);
}

#[test]
fn truncated_and_foreign_files_are_rejected() {
    let dir = scratch("truncated");
    let bytes = std::fs::read(weights().join(VAE)).unwrap();
    let cases: [(&str, &[u8]); 4] = [
        ("truncated.safetensors", &bytes[..bytes.len() / 2]),
        ("header-only.safetensors", &bytes[..6]),
        ("empty.safetensors", b""),
        ("text.safetensors", b"this is not a safetensors file at all"),
    ];
    for (name, content) in cases {
        let p = dir.join(name);
        std::fs::write(&p, content).unwrap();
        expect_unusable(&p, &[name, "not a valid safetensors file"]);
    }
}

#[test]
fn a_bundle_without_inputs_or_outputs_is_rejected() {
    let dir = scratch("no-io");
    let p = RawBundle::edited(VAE, &dir, |b| {
        b.tensors.retain(|k, _| !k.starts_with("parity.input."));
        b.metadata.remove("parity.inputs");
    });
    expect_unusable(&p, &["no inputs"]);
    let p = RawBundle::edited(VAE, &dir, |b| {
        b.tensors.retain(|k, _| !k.starts_with("parity.output."));
        b.metadata.remove("parity.outputs");
    });
    expect_unusable(&p, &["no outputs"]);
    let p = RawBundle::edited(VAE, &dir, |b| {
        b.tensors.remove("parity.input.hidden_states");
    });
    expect_unusable(&p, &["parity.input.hidden_states", "missing"]);
}

#[test]
fn wrong_format_version_and_missing_metadata() {
    let dir = scratch("format");
    let p = RawBundle::edited(VAE, &dir, |b| {
        b.metadata.insert("parity.format".into(), "2".into());
    });
    expect_unusable(&p, &["parity.format", "\"2\""]);
    let p = RawBundle::edited(VAE, &dir, |b| {
        b.metadata.remove("parity.block");
    });
    expect_unusable(&p, &["parity.block", "missing"]);
}

#[test]
fn unused_weights_are_an_error_unless_allowed() {
    let dir = scratch("unused");
    let p = RawBundle::edited(VAE, &dir, |b| {
        let w = b.tensors["to_q.weight"].clone();
        b.tensors.insert("to_qq.weight".into(), w);
    });
    expect_unusable(&p, &["to_qq.weight", "not used", "to_q.weight", "--allow-unused"]);
    let (code, out, _) = cli(&["check", "--allow-unused", p.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
}

#[test]
fn unknown_input_name_and_wrong_rank() {
    let dir = scratch("inputs");
    let p = RawBundle::edited("ldm/linear_attention_dim24_h3_d8.safetensors", &dir, |b| {
        let x = b.tensors.remove("parity.input.x").unwrap();
        b.tensors.insert("parity.input.hidden_states".into(), x);
        b.metadata.insert("parity.inputs".into(), r#"["hidden_states"]"#.into());
    });
    expect_unusable(&p, &["hidden_states", "expected some of: x"]);
    let p = RawBundle::edited("ldm/linear_attention_dim24_h3_d8.safetensors", &dir, |b| {
        let x = b.tensors["parity.input.x"].flatten_from(2).unwrap();
        b.tensors.insert("parity.input.x".into(), x);
    });
    expect_unusable(&p, &["x", "rank"]);
}

#[test]
fn folders_without_bundles_and_missing_paths() {
    let dir = scratch("empty-dir");
    expect_unusable(&dir, &["no parity bundles"]);
    expect_unusable(&dir.join("nope.safetensors"), &["nope.safetensors", "cannot read"]);
}

#[test]
fn bad_command_lines_exit_2() {
    let (code, _, err) = cli(&["check"]);
    assert_eq!(code, 2, "{err}");
    let (code, _, _) = cli(&["frobnicate"]);
    assert_eq!(code, 2);
    let (code, _, _) = cli(&["check", "--dtype", "f8", "weights"]);
    assert_eq!(code, 2);
}

#[test]
fn one_bad_bundle_among_good_ones_still_exits_2_and_reports_the_rest() {
    let dir = scratch("mixed");
    std::fs::copy(weights().join(VAE), dir.join("good.safetensors")).unwrap();
    std::fs::write(dir.join("bad.safetensors"), b"garbage").unwrap();
    let (code, out, err) = cli(&["check", dir.to_str().unwrap()]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        out.contains("PASS") && out.contains("ERROR") && out.contains("1 passed, 0 failed, 1 unusable"),
        "{out}"
    );
}
