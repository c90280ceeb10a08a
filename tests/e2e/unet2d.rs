//! diffusers' `UNet2DModel` (the unconditional DDPM / LDM U-Net) as a library user runs it: the
//! committed whole-model bundle passes through `PortCheck` with `UNet2DModel::load`, and the three
//! bugs a port of it makes are each caught by a wide margin (the check's own verdict, and the
//! error against PyTorch's output at least 100 times PyTorch's own float32 error): a timestep not
//! truncated to an integer as diffusers' `torch.tensor([t], dtype=long)` truncates it, a swapped
//! pair of weights (an attention's `to_q` and `to_k`), and a wrong key map (a weight loaded under
//! another module's name is refused by name). And a user's own whole models (configs in no other
//! committed folder, `scripts/export_own.py --whole`) through `PortCheck` (issue 57).

use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use unet_attention::models::{UNet2DModel, UNet2DModelConfig};
use unet_parity::port::PortCheck;

const BUNDLE: &str = "weights/whole/unet2d.safetensors";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn folder() -> PathBuf {
    root().join("weights/models/diffusers_unet2d")
}

/// The bundle's `timestep` kwarg (421.9: diffusers runs timestep 421).
fn timestep(check: &PortCheck) -> f64 {
    check.bundle().kwargs["timestep"].as_f64().unwrap()
}

/// `(passes, max |ours − PyTorch|, PyTorch's own float32 error against its float64 run)` of a
/// forward of `model` on the bundle, at `t`.
fn run(model: &UNet2DModel, t: f64) -> (bool, f64, f64) {
    let check = PortCheck::open(root().join(BUNDLE)).unwrap();
    let report = check.run(|i| model.forward(i.get("sample")?, t)).unwrap();
    let o = &report.outputs[0];
    (report.pass, o.max_abs, o.torch_vs_f64.unwrap())
}

#[test]
fn the_committed_unet2d_passes_and_three_port_bugs_fail_widely() {
    let check = PortCheck::open(root().join(BUNDLE)).unwrap();
    let t = timestep(&check);
    assert!(t.fract() != 0.0, "the bundle's timestep shows the truncation");
    let model = UNet2DModel::load(folder(), DType::F32, &Device::Cpu).unwrap();
    let (pass, err, torch) = run(&model, t);
    assert!(pass, "ours: {err:e} (PyTorch's own {torch:e})");
    assert!(err < 1e-5, "{err:e}");

    // diffusers runs the truncated timestep: 421.0 gives the same output; a port that rounds
    // instead (422, the integer the float embedding of 421.9 is nearest) fails widely.
    let (pass, err_trunc, _) = run(&model, t.trunc());
    assert!(pass && err_trunc == err, "{err_trunc:e} vs {err:e}");
    let (pass, err_t, _) = run(&model, t.round());
    assert!(
        !pass && err_t > 100.0 * torch,
        "rounded timestep: {err_t:e} vs PyTorch's own {torch:e}"
    );

    // A swapped pair of weights: the first attention's to_q and to_k.
    let mut w =
        candle_core::safetensors::load(folder().join("diffusion_pytorch_model.safetensors"), &Device::Cpu).unwrap();
    let q = "down_blocks.1.attentions.0.to_q.weight".to_string();
    let k = "down_blocks.1.attentions.0.to_k.weight".to_string();
    let (wq, wk) = (w[&q].clone(), w[&k].clone());
    w.insert(q, wk);
    w.insert(k, wq);
    let swapped = build(&w);
    let (pass, err_s, _) = run(&swapped, t);
    assert!(!pass && err_s > 100.0 * torch, "swapped to_q / to_k: {err_s:e}");
    eprintln!("ours {err:.2e}, PyTorch's own {torch:.2e}; rounded timestep {err_t:.2e}, swapped to_q/to_k {err_s:.2e}");

    // A wrong key map: a resnet's weights under another name are refused, naming both.
    let mut w =
        candle_core::safetensors::load(folder().join("diffusion_pytorch_model.safetensors"), &Device::Cpu).unwrap();
    let renamed: HashMap<String, Tensor> = w
        .drain()
        .map(|(k, v)| (k.replace("up_blocks.0.resnets.1.", "up_blocks.0.resnet.1."), v))
        .collect();
    let dir = crate::common::scratch("keys");
    std::fs::copy(folder().join("config.json"), dir.join("config.json")).unwrap();
    candle_core::safetensors::save(&renamed, dir.join("diffusion_pytorch_model.safetensors")).unwrap();
    let e = UNet2DModel::load(&dir, DType::F32, &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("up_blocks.0.resnets.1.") && e.contains("up_blocks.0.resnet.1."),
        "{e}"
    );
}

/// The model built from `weights` with the folder's config.
fn build(weights: &HashMap<String, Tensor>) -> UNet2DModel {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(folder().join("config.json")).unwrap()).unwrap();
    let cfg = UNet2DModelConfig::from_config_json(&json).unwrap();
    let vb = candle_nn::VarBuilder::from_tensors(weights.clone(), DType::F32, &Device::Cpu);
    UNet2DModel::new(vb, &cfg).unwrap()
}

#[test]
fn bad_inputs_and_unsupported_configs_are_errors_naming_them() {
    let model = UNet2DModel::load(folder(), DType::F32, &Device::Cpu).unwrap();
    let dev = Device::Cpu;
    for (shape, what) in [((1, 3, 5, 8), "multiples of 2"), ((1, 4, 6, 8), "(B ≥ 1, 3, H, W)")] {
        let x = Tensor::zeros(shape, DType::F32, &dev).unwrap();
        let e = model.forward(&x, 10.0).unwrap_err().to_string();
        assert!(e.contains("sample") && e.contains(what), "{e}");
    }
    let x = Tensor::zeros((1, 3, 6, 8), DType::F32, &dev).unwrap();
    assert!(model
        .forward(&x, f64::NAN)
        .unwrap_err()
        .to_string()
        .contains("timestep"));
    for (key, value, named) in [
        ("time_embedding_type", serde_json::json!("fourier"), "fourier"),
        ("num_class_embeds", serde_json::json!(10), "class embeddings"),
        ("downsample_type", serde_json::json!("resnet"), "downsample_type"),
        ("no_such_key", serde_json::json!(1), "no_such_key"),
    ] {
        let mut json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(folder().join("config.json")).unwrap()).unwrap();
        json[key] = value;
        let e = match UNet2DModelConfig::from_config_json(&json) {
            Err(e) => e.to_string(),
            Ok(cfg) => {
                let vb = candle_nn::VarBuilder::zeros(DType::F32, &dev);
                UNet2DModel::new(vb, &cfg).unwrap_err().to_string()
            }
        };
        assert!(e.contains(named), "{key}: {e}");
    }
}

/// Issue 57: a user's own whole model (a config in no other committed folder, exported by
/// `scripts/export_own.py FOLDER --whole`) checked with `PortCheck`, our loaders standing in for
/// the port: both U-Nets pass module by module, f32 and the half twin.
#[test]
fn own_whole_models_pass_through_portcheck() {
    use unet_attention::models::UNet2DConditionModel;
    let own = root().join("weights/own/whole");
    for (bundle, dtype) in [
        ("unseen_unet_whole.safetensors", DType::F32),
        ("unseen_unet_whole_bf16.safetensors", DType::BF16),
    ] {
        let check = PortCheck::open(own.join(bundle)).unwrap();
        let t = timestep(&check);
        let unet = UNet2DConditionModel::load(own.join("unseen_unet"), dtype, &Device::Cpu).unwrap();
        let report = check
            .run(|i| unet.forward(i.get("sample")?, t, i.get("encoder_hidden_states")?))
            .unwrap();
        assert!(report.pass, "{bundle}: {report}");
        let compared = report.trace.stages.iter().filter(|s| s.compare.is_some()).count();
        assert!(
            compared > 40 && report.trace.unrecorded_before.is_empty(),
            "{bundle}: {report}"
        );
    }
    for (bundle, dtype) in [
        ("unseen_unet2d_whole.safetensors", DType::F32),
        ("unseen_unet2d_whole_f16.safetensors", DType::F16),
    ] {
        let check = PortCheck::open(own.join(bundle)).unwrap();
        let t = timestep(&check);
        let unet = UNet2DModel::load(own.join("unseen_unet2d"), dtype, &Device::Cpu).unwrap();
        let report = check.run(|i| unet.forward(i.get("sample")?, t)).unwrap();
        assert!(report.pass, "{bundle}: {report}");
    }
}
