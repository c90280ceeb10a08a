//! Whole models loaded from diffusers model folders (`UNet2DConditionModel::load`,
//! `AutoencoderKL::load`): the committed tiny folders load and run; a sharded copy gives the same
//! output as the single file; and a stranger's folder gets an error naming the file or key, never
//! a panic: a weight the model never reads, a missing weight, another class's `config.json`, an
//! unknown config key, a shard name that leaves the folder, no weights at all, an oversized
//! `config.json`, a truncated safetensors file.

use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use unet_attention::models::{AutoencoderKL, UNet2DConditionModel};

fn models() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("weights/models")
}

/// A scratch copy of a committed model folder.
fn copy_folder(name: &str, tag: &str) -> PathBuf {
    let dst = std::env::temp_dir().join(format!("unet-folders-{}-{name}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dst);
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(models().join(name)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
    }
    dst
}

fn tensors(folder: &Path) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(folder.join("diffusion_pytorch_model.safetensors"), &Device::Cpu).unwrap()
}

fn save(folder: &Path, file: &str, t: &HashMap<String, Tensor>) {
    candle_core::safetensors::save(t, folder.join(file)).unwrap();
}

/// The VAE's load as an error message (a panic fails the test, naming the case).
fn vae_error(folder: &Path, case: &str) -> String {
    match catch_unwind(AssertUnwindSafe(|| {
        AutoencoderKL::load(folder, DType::F32, &Device::Cpu)
    })) {
        Ok(Ok(_)) => panic!("{case}: loaded"),
        Ok(Err(e)) => e.to_string(),
        Err(_) => panic!("{case}: panicked"),
    }
}

#[test]
fn committed_model_folders_load_and_run() {
    let dev = Device::Cpu;
    let vae = AutoencoderKL::load(models().join("diffusers_vae"), DType::F32, &dev).unwrap();
    let x = Tensor::zeros((2, 3, 8, 6), DType::F32, &dev).unwrap();
    let dist = vae.encode(&x).unwrap();
    assert_eq!(dist.mean().dims(), &[2, 4, 4, 3]);
    assert_eq!(vae.decode(dist.mode()).unwrap().dims(), &[2, 3, 8, 6]);
    let unet = UNet2DConditionModel::load(models().join("diffusers_sd1"), DType::F16, &dev).unwrap();
    let latents = Tensor::zeros((1, 4, 8, 8), DType::F16, &dev).unwrap();
    let context = Tensor::zeros((1, 7, 24), DType::F16, &dev).unwrap();
    assert_eq!(unet.forward(&latents, 10.0, &context).unwrap().dims(), &[1, 4, 8, 8]);
}

#[test]
fn a_sharded_folder_gives_the_same_model() {
    let dev = Device::Cpu;
    let single = models().join("diffusers_vae");
    let sharded = copy_folder("diffusers_vae", "sharded");
    let all = tensors(&sharded);
    std::fs::remove_file(sharded.join("diffusion_pytorch_model.safetensors")).unwrap();
    let (mut a, mut b) = (HashMap::new(), HashMap::new());
    let mut map = serde_json::Map::new();
    for (i, (k, v)) in all.into_iter().enumerate() {
        let file = if i % 2 == 0 {
            "part-1.safetensors"
        } else {
            "part-2.safetensors"
        };
        map.insert(k.clone(), file.into());
        if i % 2 == 0 { &mut a } else { &mut b }.insert(k, v);
    }
    save(&sharded, "part-1.safetensors", &a);
    save(&sharded, "part-2.safetensors", &b);
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(
        sharded.join("diffusion_pytorch_model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    let x = Tensor::randn(0f32, 1., (1, 3, 4, 4), &dev).unwrap();
    let one = AutoencoderKL::load(&single, DType::F32, &dev)
        .unwrap()
        .forward(&x)
        .unwrap();
    let two = AutoencoderKL::load(&sharded, DType::F32, &dev)
        .unwrap()
        .forward(&x)
        .unwrap();
    let diff = (one - two)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert_eq!(diff, 0.0);
    let _ = std::fs::remove_dir_all(&sharded);
}

#[test]
fn a_strangers_folder_gets_errors_naming_file_and_key() {
    // A weight the model never reads: refused by name, as a strict load_state_dict.
    let f = copy_folder("diffusers_vae", "extra");
    let mut t = tensors(&f);
    t.insert(
        "decoder.extra.weight".into(),
        Tensor::zeros(3, DType::F32, &Device::Cpu).unwrap(),
    );
    save(&f, "diffusion_pytorch_model.safetensors", &t);
    let e = vae_error(&f, "extra weight");
    assert!(e.contains("decoder.extra.weight") && e.contains("not used"), "{e}");

    // A weight the model needs, missing: named.
    let mut t = tensors(&models().join("diffusers_vae"));
    t.remove("encoder.conv_in.weight");
    save(&f, "diffusion_pytorch_model.safetensors", &t);
    let e = vae_error(&f, "missing weight");
    assert!(e.contains("encoder.conv_in.weight"), "{e}");

    // Another class's config, an unknown key, a config that is not an object.
    let f = copy_folder("diffusers_vae", "config");
    let config_path = f.join("config.json");
    let config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    let mut other = config.clone();
    other["_class_name"] = "UNet2DConditionModel".into();
    std::fs::write(&config_path, other.to_string()).unwrap();
    let e = vae_error(&f, "other class");
    assert!(
        e.contains("UNet2DConditionModel") && e.contains("expected `AutoencoderKL`"),
        "{e}"
    );
    let mut unknown = config.clone();
    unknown["latent_chanels"] = 4.into();
    std::fs::write(&config_path, unknown.to_string()).unwrap();
    let e = vae_error(&f, "unknown key");
    assert!(e.contains("latent_chanels"), "{e}");
    std::fs::write(&config_path, "[1, 2]").unwrap();
    let e = vae_error(&f, "not an object");
    assert!(e.contains("JSON object"), "{e}");

    // An oversized config.json is not read whole.
    std::fs::write(&config_path, " ".repeat(5 << 20)).unwrap();
    let e = vae_error(&f, "oversized config");
    assert!(e.contains("config.json") && e.contains("larger than"), "{e}");
    std::fs::write(&config_path, config.to_string()).unwrap();

    // A shard name that leaves the folder; an index without a weight map; no weights at all.
    std::fs::remove_file(f.join("diffusion_pytorch_model.safetensors")).unwrap();
    let e = vae_error(&f, "no weights");
    assert!(e.contains("diffusion_pytorch_model.safetensors"), "{e}");
    let index = f.join("diffusion_pytorch_model.safetensors.index.json");
    std::fs::write(
        &index,
        r#"{"weight_map": {"encoder.conv_in.weight": "../diffusers_sd1/x.safetensors"}}"#,
    )
    .unwrap();
    let e = vae_error(&f, "shard outside");
    assert!(
        e.contains("encoder.conv_in.weight") && e.contains("file name in the folder"),
        "{e}"
    );
    std::fs::write(&index, r#"{"metadata": {}}"#).unwrap();
    let e = vae_error(&f, "no weight map");
    assert!(e.contains("weight_map"), "{e}");

    // A truncated safetensors file.
    std::fs::remove_file(&index).unwrap();
    let bytes = std::fs::read(models().join("diffusers_vae/diffusion_pytorch_model.safetensors")).unwrap();
    std::fs::write(f.join("diffusion_pytorch_model.safetensors"), &bytes[..bytes.len() / 2]).unwrap();
    let e = vae_error(&f, "truncated");
    assert!(!e.is_empty());

    // The U-Net's loader shares all of this; one case for it.
    let u = copy_folder("diffusers_sd1", "unet-extra");
    let mut t = tensors(&u);
    t.insert(
        "mid_block.spare".into(),
        Tensor::zeros(1, DType::F32, &Device::Cpu).unwrap(),
    );
    save(&u, "diffusion_pytorch_model.safetensors", &t);
    let e = match UNet2DConditionModel::load(&u, DType::F32, &Device::Cpu) {
        Ok(_) => panic!("loaded with an extra weight"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("mid_block.spare"), "{e}");
    for d in [f, u] {
        let _ = std::fs::remove_dir_all(d);
    }
}
