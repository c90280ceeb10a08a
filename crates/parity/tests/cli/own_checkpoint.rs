//! Your own checkpoint in one command (issue 19): the bundles `scripts/export_own.py` wrote from
//! the committed whole models (`weights/own/`) pass stage by stage, carry the config the Rust side
//! derives from the model's `config.json`, and a copy of the checkpoint with one weight changed is
//! caught at the first stage that reads it, and drawn by `show`. No Python runs here.

use crate::common::{cli, probs_panels_agree, scratch, weights};
use std::path::{Path, PathBuf};

const SD1_BUNDLE: &str = "own/diffusers_sd1_mid_block.safetensors";
const SD1_MODEL: &str = "models/diffusers_sd1/diffusion_pytorch_model.safetensors";
/// The weight the broken copy changes: the mid block's first self-attention query projection.
const TO_Q: &str = "mid_block.attentions.0.transformer_blocks.0.attn1.to_q.weight";
const TO_Q_STAGE: &str = "attentions.0/transformer_blocks.0/attn1/q";

/// (bundle, model folder, the block's key prefix) of every bundle in `weights/own/`.
const OWN: [(&str, &str, &str); 4] = [
    (SD1_BUNDLE, "models/diffusers_sd1", "mid_block."),
    (
        "own/diffusers_unet2d_mid_block.safetensors",
        "models/diffusers_unet2d",
        "mid_block.",
    ),
    (
        "own/diffusers_vae_encoder_mid_block.safetensors",
        "models/diffusers_vae",
        "encoder.mid_block.",
    ),
    (
        "own/diffusers_vae_decoder_mid_block.safetensors",
        "models/diffusers_vae",
        "decoder.mid_block.",
    ),
];

#[test]
fn own_bundles_pass_stage_by_stage() {
    let dir = weights().join("own");
    let (code, out, err) = cli(&["check", "--trace", dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    // The four bundles export_own.py writes, own/modules/: two of them again with module-path
    // stages (for `unet_parity::port`), of which our blocks record the ones named alike, and
    // own/whole/: `--whole` bundles of two models of configs in no other folder (f32 and a half
    // twin each), every module of which our whole models record.
    assert!(out.contains("10 passed, 0 failed"), "{out}");
    assert_eq!(out.matches("no stage diverges").count(), 10, "{out}");
    assert!(!out.contains("DIVERGES"), "{out}");
}

/// Each bundle references its checkpoint and holds the block id and config that
/// `model_config::mid_blocks` derives from the model's `config.json` for that prefix (what
/// `detect` prints and `check --config` builds).
#[test]
fn own_bundles_hold_the_config_the_rust_side_derives() {
    for (rel, model, prefix) in OWN {
        let b = unet_parity::bundle::Bundle::read(&weights().join(rel)).unwrap();
        let model_file = Path::new(model).join("diffusion_pytorch_model.safetensors");
        let want_ref = Path::new("..").join(&model_file);
        assert_eq!(b.metadata["parity.weights"], want_ref.to_str().unwrap(), "{rel}");
        assert_eq!(b.metadata["parity.prefix"], prefix, "{rel}");
        assert!(
            !b.tensors.keys().any(|k| !k.starts_with("parity.")),
            "{rel}: a referencing bundle holds no weights"
        );
        let text = std::fs::read_to_string(weights().join(model).join("config.json")).unwrap();
        let config: serde_json::Value = serde_json::from_str(&text).unwrap();
        let specs = unet_attention::diffusers::model_config::mid_blocks(&config, None, false).unwrap();
        let spec = specs.iter().find(|s| s.key_prefix() == prefix).unwrap();
        assert_eq!(b.block, spec.block, "{rel}");
        let stored: serde_json::Value = serde_json::from_str(&b.metadata["parity.config"]).unwrap();
        assert_eq!(stored, spec.config, "{rel}");
    }
}

/// A copy of `weights/<SD1_MODEL>` with one element of [`TO_Q`] changed, at the same path below
/// `dir` (so a copy of the bundle below `dir/own/` finds it through its `parity.weights`).
fn broken_checkpoint(dir: &Path) -> PathBuf {
    let mut bytes = std::fs::read(weights().join(SD1_MODEL)).unwrap();
    let (header_len, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let info = meta.info(TO_Q).expect("the committed SD-1-like model has TO_Q");
    assert_eq!(info.dtype, safetensors::Dtype::F32);
    // element 5 (row 0): the data start after the 8-byte length and the header
    let at = 8 + header_len + info.data_offsets.0 + 5 * 4;
    let old = f32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    bytes[at..at + 4].copy_from_slice(&(old + 0.5).to_le_bytes());
    let path = dir.join(SD1_MODEL);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, bytes).unwrap();
    path
}

fn first_divergence(out: &str) -> Option<&str> {
    let line = out.lines().find(|l| l.contains("first divergence: `"))?;
    line.split('`').nth(1)
}

/// The stages before the changed weight match, the query diverges first, and `show` draws the
/// difference; through the bundle's own reference and through `--weights`.
#[test]
fn a_broken_checkpoint_names_the_first_divergent_stage_and_is_drawn() {
    let dir = scratch("own-broken");
    let model = broken_checkpoint(&dir);
    let bundle = dir.join(SD1_BUNDLE);
    std::fs::create_dir_all(bundle.parent().unwrap()).unwrap();
    std::fs::copy(weights().join(SD1_BUNDLE), &bundle).unwrap();

    let (code, out, err) = cli(&["check", "--trace", bundle.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("0 passed, 1 failed"), "{out}");
    assert_eq!(first_divergence(&out), Some(TO_Q_STAGE), "{out}");
    let stage_line = |name: &str| {
        let row = out.lines().find(|l| l.split_whitespace().next() == Some(name));
        row.unwrap_or_else(|| panic!("no row {name} in {out}")).to_string()
    };
    for before in [
        "resnets.0/output",
        "attentions.0/proj_in",
        "attentions.0/transformer_blocks.0/norm1",
    ] {
        assert!(stage_line(before).ends_with("match"), "{before}: {out}");
    }
    assert!(stage_line(TO_Q_STAGE).ends_with("DIVERGES"), "{out}");
    let k = "attentions.0/transformer_blocks.0/attn1/k";
    assert!(stage_line(k).ends_with("match"), "{out}");

    // The committed bundle with the broken file given on the command line: the same verdict.
    let committed = weights().join(SD1_BUNDLE);
    let (code, out2, err) = cli(&[
        "check",
        "--trace",
        committed.to_str().unwrap(),
        "--weights",
        model.to_str().unwrap(),
        "--prefix",
        "mid_block.",
    ]);
    assert_eq!(code, 1, "{out2}{err}");
    assert_eq!(first_divergence(&out2), Some(TO_Q_STAGE), "{out2}");

    let pics = dir.join("pics");
    let (code, out, err) = cli(&["show", bundle.to_str().unwrap(), "--out", pics.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    let probs = pics.join("attentions.0__transformer_blocks.0__attn1__probs_query_2_3.png");
    for png in [pics.join("output_error.png"), probs.clone()] {
        let head = std::fs::read(&png).unwrap_or_else(|e| panic!("{}: {e}\n{out}", png.display()));
        assert!(head.starts_with(b"\x89PNG\r\n\x1a\n"), "{}", png.display());
    }
    assert!(!probs_panels_agree(&probs), "PyTorch's and our attention maps differ");

    // The untouched checkpoint draws the same map on both sides.
    let ok = dir.join("ok");
    let (code, ..) = cli(&["show", committed.to_str().unwrap(), "--out", ok.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(probs_panels_agree(&ok.join(probs.file_name().unwrap())));
}
