//! A newcomer's first hour (issue 47): every dead end says what to do next. A model folder or a
//! raw checkpoint given to `check` names `export_own.py`, `detect` and `check --weights`; a run in
//! a lower precision than the bundle's says that it may fail by design and where the half twin
//! is; `show` names every picture it leaves out, and draws a `PortCheck` run.

use crate::common::*;
use std::path::Path;
use unet_attention::diffusers::{UNetMidBlock2D, UNetMidBlock2DConfig};
use unet_parity::port::PortCheck;

/// The `error:` line of a check that must exit 2.
fn error_line(args: &[&str]) -> String {
    let (code, out, err) = cli(args);
    assert_eq!(code, 2, "stdout:\n{out}\nstderr:\n{err}");
    let line = err.lines().find(|l| l.starts_with("error:"));
    line.unwrap_or_else(|| panic!("no error line in {err:?}")).to_string()
}

fn assert_names_next_steps(line: &str) {
    for needle in ["scripts/export_own.py", "unet-parity detect", "--weights", "--prefix"] {
        assert!(line.contains(needle), "{needle:?} not in {line:?}");
    }
}

#[test]
fn a_model_folder_says_how_to_get_bundles() {
    let dir = scratch("first-hour-model-folder");
    let model = weights().join("models/diffusers_vae");
    for name in ["config.json", "diffusion_pytorch_model.safetensors"] {
        std::fs::copy(model.join(name), dir.join(name)).unwrap();
    }
    let line = error_line(&["check", dir.to_str().unwrap()]);
    assert!(line.contains("no parity bundles"), "{line}");
    assert!(line.contains("a model checkpoint without parity metadata"), "{line}");
    assert_names_next_steps(&line);
    // The folder itself is named to export_own.py: it is a diffusers model folder.
    assert!(
        line.contains(&format!("scripts/export_own.py {} --out", dir.display())),
        "{line}"
    );
    // ... and so is its whole-model export.
    assert!(
        line.contains(&format!("scripts/export_own.py {} --whole --out", dir.display())),
        "{line}"
    );
    // Without config.json: the checkpoint's commands, export_own.py for a model folder elsewhere.
    std::fs::remove_file(dir.join("config.json")).unwrap();
    let line = error_line(&["check", dir.to_str().unwrap()]);
    assert!(line.contains("export_own.py MODEL_FOLDER"), "{line}");
    assert_names_next_steps(&line);
    // An empty folder: no hint to give.
    let empty = scratch("first-hour-empty");
    let line = error_line(&["check", empty.to_str().unwrap()]);
    assert!(line.ends_with("no parity bundles (*.safetensors) found"), "{line}");
}

#[test]
fn a_pipeline_folder_names_its_diffusers_model_not_the_text_encoder() {
    let dir = scratch("first-hour-pipeline");
    let (vae, text) = (dir.join("vae"), dir.join("text_encoder"));
    for d in [&vae, &text] {
        std::fs::create_dir_all(d).unwrap();
    }
    let model = weights().join("models/diffusers_vae");
    for name in ["config.json", "diffusion_pytorch_model.safetensors"] {
        std::fs::copy(model.join(name), vae.join(name)).unwrap();
    }
    std::fs::write(text.join("config.json"), "{}").unwrap();
    std::fs::copy(
        model.join("diffusion_pytorch_model.safetensors"),
        text.join("model.safetensors"),
    )
    .unwrap();
    let line = error_line(&["check", dir.to_str().unwrap()]);
    assert!(line.contains("2 model checkpoints"), "{line}");
    assert!(
        line.contains(&format!("scripts/export_own.py {} --out", vae.display())),
        "{line}"
    );
    assert!(!line.contains("text_encoder"), "{line}");
}

#[test]
fn a_raw_checkpoint_says_it_is_one_and_what_to_run() {
    let ckpt = weights().join("models/diffusers_sd1/diffusion_pytorch_model.safetensors");
    let line = error_line(&["check", ckpt.to_str().unwrap()]);
    assert!(line.contains("metadata `parity.format` is missing"), "{line}");
    assert!(
        line.contains("it looks like a model checkpoint (a state dict of"),
        "{line}"
    );
    assert!(
        line.contains(&format!("unet-parity detect {}", ckpt.display())),
        "{line}"
    );
    assert_names_next_steps(&line);
    // Said from the header: not refused by the memory estimate first (a 10 GB checkpoint), for
    // `check` and `show` alike.
    for cmd in [&["check"][..], &["show", "--out", "/nonexistent-never-written"][..]] {
        let mut args = cmd.to_vec();
        args.extend([ckpt.to_str().unwrap(), "--max-memory", "1M"]);
        let line = error_line(&args);
        assert!(line.contains("it looks like a model checkpoint"), "{line}");
    }
    // A safetensors file whose names are no state dict's: how a bundle is written.
    let dir = scratch("first-hour-plain");
    let plain = dir.join("plain.safetensors");
    let t = candle_core::Tensor::zeros(3, candle_core::DType::F32, &candle_core::Device::Cpu).unwrap();
    candle_core::safetensors::save(&std::collections::HashMap::from([("x".to_string(), t)]), &plain).unwrap();
    let line = error_line(&["check", plain.to_str().unwrap()]);
    assert!(line.contains("no `parity.*` metadata or tensors"), "{line}");
    assert!(line.contains("export_bundle"), "{line}");
}

#[test]
fn a_lower_precision_run_says_it_may_fail_by_design_and_names_the_twin() {
    let bundle = weights().join("diffusers/attention_vae_mid.safetensors");
    let (code, out, err) = cli(&["check", bundle.to_str().unwrap(), "--dtype", "bf16"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("This may fail by design"), "{out}");
    assert!(out.contains("at bf16's tolerances"), "{out}");
    assert!(out.contains("attention_vae_mid_bf16.safetensors"), "{out}");
    // The JSON reason says the same.
    let (_, json, _) = cli(&["check", bundle.to_str().unwrap(), "--dtype", "f16", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let reason = v["bundles"][0]["outputs"][0]["reason"].as_str().unwrap();
    assert!(
        reason.contains("may fail by design") && reason.contains("_f16.safetensors"),
        "{reason}"
    );
    // Without a twin beside it: how to export one.
    let dir = scratch("first-hour-no-twin");
    std::fs::copy(&bundle, dir.join("vae.safetensors")).unwrap();
    let (code, out, _) = cli(&[
        "check",
        dir.join("vae.safetensors").to_str().unwrap(),
        "--dtype",
        "bf16",
    ]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("dtype=torch.bfloat16"), "{out}");
    // A run in a higher precision than the bundle's gets no such note.
    let half = weights().join("diffusers/attention_vae_mid_f16.safetensors");
    let (code, out, err) = cli(&["check", half.to_str().unwrap(), "--dtype", "f32"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(!out.contains("by design"), "{out}");
}

/// `show`'s `note:` lines on stderr.
fn show_notes(bundle: &Path, dir: &Path) -> Vec<String> {
    let (code, out, err) = cli(&["show", bundle.to_str().unwrap(), "--out", dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("output_error.png"), "{out}");
    err.lines()
        .filter(|l| l.starts_with("note:"))
        .map(String::from)
        .collect()
}

#[test]
fn show_says_why_it_leaves_a_picture_out() {
    // A ResNet block: no attention weights to draw.
    let resnet = weights().join("mid/resnet_block_2d_unet2d.safetensors");
    let notes = show_notes(&resnet, &scratch("first-hour-show-resnet"));
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].contains("no attention map: the bundle records no attention-weight stage"),
        "{notes:?}"
    );
    // An attention block with its `probs` stage: nothing left out.
    let vae = weights().join("diffusers/attention_vae_mid.safetensors");
    assert_eq!(show_notes(&vae, &scratch("first-hour-show-vae")), Vec::<String>::new());
}

fn vae_mid(check: &PortCheck) -> UNetMidBlock2D {
    let cfg: UNetMidBlock2DConfig =
        unet_attention::config::from_json("diffusers.UNetMidBlock2D", &check.bundle().config).unwrap();
    UNetMidBlock2D::new(check.var_builder().unwrap(), &cfg).unwrap()
}

#[test]
fn a_port_check_run_is_drawn_as_show_draws_a_bundle() {
    let check = PortCheck::open(root().join("weights/own/diffusers_vae_decoder_mid_block.safetensors")).unwrap();
    let mid = vae_mid(&check);
    let report = check
        .run(|inputs| mid.forward(inputs.get("hidden_states")?, None))
        .unwrap();
    assert!(report.pass, "{report}");
    let dir = scratch("first-hour-port-show");
    let shown = check.show(&report, &dir, Some((1, 2)), 1).unwrap();
    let names: Vec<String> = shown
        .pictures
        .iter()
        .map(|p| p.path.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "output_error.png",
            "output_worst_channels.png",
            "attentions.0__probs_query_1_2.png"
        ],
        "{shown:?}"
    );
    assert!(shown.left_out.is_empty(), "{:?}", shown.left_out);
    for p in &shown.pictures {
        assert!(std::fs::metadata(&p.path).unwrap().len() > 100, "{}", p.path.display());
    }
    // A forward that records no stage (its output computed outside the check): the output maps,
    // and the attention map left out, saying why.
    let out = mid
        .forward(check.inputs().unwrap().get("hidden_states").unwrap(), None)
        .unwrap();
    let report = check.run(|_| Ok::<_, candle_core::Error>(out.clone())).unwrap();
    let shown = check
        .show(&report, scratch("first-hour-port-show-bare"), None, 0)
        .unwrap();
    assert_eq!(shown.pictures.len(), 2, "{shown:?}");
    assert!(
        shown
            .left_out
            .iter()
            .any(|w| w.contains("our run recorded no such stage")),
        "{:?}",
        shown.left_out
    );
}
