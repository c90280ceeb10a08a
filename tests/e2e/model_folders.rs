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

/// A scratch copy of a committed model folder (removed when dropped).
fn copy_folder(name: &str, tag: &str) -> crate::common::Scratch {
    let dst = crate::common::scratch(&format!("{name}-{tag}"));
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
    std::fs::write(&config_path, " ".repeat(17 << 20)).unwrap();
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
}

// ---- Issue 54: the folder loaders read as `unet-parity` reads ----

/// `load` on `folder` in a thread: its error, or a failure of the test when it has not returned
/// within 20 s (a FIFO opened for reading blocks until a writer comes).
fn load_error_within(folder: &Path, unet: bool) -> String {
    let folder = folder.to_path_buf();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let e = if unet {
            UNet2DConditionModel::load(&folder, DType::F32, &Device::Cpu)
                .err()
                .map(|e| e.to_string())
        } else {
            AutoencoderKL::load(&folder, DType::F32, &Device::Cpu)
                .err()
                .map(|e| e.to_string())
        };
        let _ = tx.send(e);
    });
    match rx.recv_timeout(std::time::Duration::from_secs(20)) {
        Ok(Some(e)) => e,
        Ok(None) => panic!("{}: loaded", folder_name(unet)),
        Err(_) => panic!("{}: load did not return within 20 s", folder_name(unet)),
    }
}

fn folder_name(unet: bool) -> &'static str {
    if unet {
        "UNet2DConditionModel"
    } else {
        "AutoencoderKL"
    }
}

fn mkfifo(path: &Path) {
    let ok = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .map(|s| s.success());
    assert!(matches!(ok, Ok(true)), "mkfifo {path:?}");
}

/// A FIFO as `config.json`, as the weights, or as a shard: an error naming it (the loaders
/// blocked forever in `open`).
#[cfg(unix)]
#[test]
fn fifos_in_a_model_folder_are_refused_not_opened() {
    for (unet, model) in [(true, "diffusers_sd1"), (false, "diffusers_vae")] {
        let f = copy_folder(model, "fifo-config");
        std::fs::remove_file(f.join("config.json")).unwrap();
        mkfifo(&f.join("config.json"));
        let e = load_error_within(&f, unet);
        assert!(e.contains("config.json") && e.contains("not a regular file"), "{e}");

        let f = copy_folder(model, "fifo-weights");
        std::fs::remove_file(f.join("diffusion_pytorch_model.safetensors")).unwrap();
        mkfifo(&f.join("diffusion_pytorch_model.safetensors"));
        let e = load_error_within(&f, unet);
        assert!(
            e.contains("diffusion_pytorch_model.safetensors") && e.contains("not a regular file"),
            "{e}"
        );

        std::fs::remove_file(f.join("diffusion_pytorch_model.safetensors")).unwrap();
        let index = serde_json::json!({"weight_map": {"conv_in.weight": "shard.safetensors"}});
        std::fs::write(
            f.join("diffusion_pytorch_model.safetensors.index.json"),
            index.to_string(),
        )
        .unwrap();
        mkfifo(&f.join("shard.safetensors"));
        let e = load_error_within(&f, unet);
        assert!(
            e.contains("shard.safetensors") && e.contains("not a regular file"),
            "{e}"
        );
    }
}

/// The committed VAE split into two shards as `write` says: its tensors by name, and the index's
/// `weight_map` it writes (name → shard).
fn shard_vae(tag: &str, write: impl Fn(&str, usize) -> (Vec<&'static str>, &'static str)) -> crate::common::Scratch {
    let f = copy_folder("diffusers_vae", tag);
    let all = tensors(&f);
    std::fs::remove_file(f.join("diffusion_pytorch_model.safetensors")).unwrap();
    let mut shards: [HashMap<String, Tensor>; 2] = Default::default();
    let mut map = serde_json::Map::new();
    let mut names: Vec<&String> = all.keys().collect();
    names.sort();
    for (i, name) in names.into_iter().enumerate() {
        let (into, named) = write(name, i);
        for shard in into {
            let k = usize::from(shard == "part-2.safetensors");
            shards[k].insert(name.clone(), all[name].clone());
        }
        map.insert(name.clone(), named.into());
    }
    save(&f, "part-1.safetensors", &shards[0]);
    save(&f, "part-2.safetensors", &shards[1]);
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(
        f.join("diffusion_pytorch_model.safetensors.index.json"),
        index.to_string(),
    )
    .unwrap();
    f
}

/// The index's `weight_map` is honoured: a tensor also in another shard (where the reader used
/// to take whichever came last), or in another shard than the index names, is an error naming
/// the tensor and both files. Tensors where the index says load as the single file does.
#[test]
fn the_index_weight_map_is_honoured() {
    let (one, two) = ("part-1.safetensors", "part-2.safetensors");
    let split = |_: &str, i: usize| {
        if i.is_multiple_of(2) {
            (vec!["part-1.safetensors"], "part-1.safetensors")
        } else {
            (vec!["part-2.safetensors"], "part-2.safetensors")
        }
    };
    let f = shard_vae("index-good", split);
    AutoencoderKL::load(&f, DType::F32, &Device::Cpu).unwrap();

    let dup = "encoder.conv_in.weight";
    let f = shard_vae("index-duplicate", |name, i| {
        if name == dup {
            (vec!["part-1.safetensors", "part-2.safetensors"], "part-1.safetensors")
        } else {
            split(name, i)
        }
    });
    let e = vae_error(&f, "a tensor in two shards");
    assert!(e.contains(dup) && e.contains(one) && e.contains(two), "{e}");

    let f = shard_vae("index-wrong-shard", |name, i| {
        if name == dup {
            (vec!["part-2.safetensors"], "part-1.safetensors")
        } else {
            split(name, i)
        }
    });
    let e = vae_error(&f, "a tensor in the wrong shard");
    assert!(
        e.contains(dup) && e.contains(one) && e.contains(two) && e.contains("weight_map"),
        "{e}"
    );
}

/// Shapes the models cannot take are errors naming the input and what the model needs: too
/// small for the downsamplers (`AutoencoderKL::encode` on 1×1 panicked inside Candle's conv2d),
/// channels other than the config's, batch 0. Sizes that are not multiples of the downsampling
/// run, as in PyTorch.
#[test]
fn no_shape_panics_a_whole_model() {
    let dev = Device::Cpu;
    let vae = AutoencoderKL::load(models().join("diffusers_vae"), DType::F32, &dev).unwrap();
    let unet = UNet2DConditionModel::load(models().join("diffusers_sd1"), DType::F32, &dev).unwrap();
    let (vae, unet) = (&vae, &unet);
    let zeros = |dims: &[usize]| Tensor::zeros(dims, DType::F32, &dev).unwrap();
    let ctx = zeros(&[1, 7, 24]);
    let caught = |what: &str, f: &dyn Fn() -> Result<Vec<usize>, String>| {
        catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| panic!("{what}: panicked"))
    };
    let encode = |x: Tensor| {
        move || {
            vae.encode(&x)
                .map(|d| d.mean().dims().to_vec())
                .map_err(|e| e.to_string())
        }
    };
    let decode = |x: Tensor| move || vae.decode(&x).map(|d| d.dims().to_vec()).map_err(|e| e.to_string());
    let run_unet = |x: Tensor, c: Tensor| {
        move || {
            unet.forward(&x, 10.0, &c)
                .map(|d| d.dims().to_vec())
                .map_err(|e| e.to_string())
        }
    };

    let e = caught("encode 1×1", &encode(zeros(&[1, 3, 1, 1]))).unwrap_err();
    assert!(
        e.contains("`sample`") && e.contains("H and W ≥ 2") && e.contains("[1, 3, 1, 1]"),
        "{e}"
    );
    assert_eq!(
        caught("encode 3×5", &encode(zeros(&[1, 3, 3, 5]))).unwrap(),
        [1, 4, 1, 2]
    );
    let e = caught("encode 4 channels", &encode(zeros(&[1, 4, 8, 8]))).unwrap_err();
    assert!(e.contains("`sample`") && e.contains("(B, 3, H, W)"), "{e}");
    let e = caught("encode batch 0", &encode(zeros(&[0, 3, 8, 8]))).unwrap_err();
    assert!(e.contains("`sample`") && e.contains("≥ 1"), "{e}");
    assert_eq!(
        caught("decode 1×1", &decode(zeros(&[1, 4, 1, 1]))).unwrap(),
        [1, 3, 2, 2]
    );
    let e = caught("decode 3 channels", &decode(zeros(&[1, 3, 2, 2]))).unwrap_err();
    assert!(e.contains("`z`") && e.contains("(B, 4, H, W)"), "{e}");

    for (h, w) in [(1, 1), (3, 5), (1, 9)] {
        let out = caught("unet", &run_unet(zeros(&[1, 4, h, w]), ctx.clone())).unwrap();
        assert_eq!(out, [1, 4, h, w], "{h}×{w}");
    }
    let e = caught("unet channels", &run_unet(zeros(&[1, 3, 8, 8]), ctx.clone())).unwrap_err();
    assert!(e.contains("`sample`") && e.contains("(B, 4, H, W)"), "{e}");
    let e = caught(
        "unet context width",
        &run_unet(zeros(&[1, 4, 8, 8]), zeros(&[1, 7, 25])),
    )
    .unwrap_err();
    assert!(
        e.contains("`encoder_hidden_states`") && e.contains("(B, tokens, 24)"),
        "{e}"
    );
    let e = caught("unet batch 0", &run_unet(zeros(&[0, 4, 8, 8]), zeros(&[0, 7, 24]))).unwrap_err();
    assert!(e.contains("`sample`") && e.contains("≥ 1"), "{e}");
}

/// A U-Net whose `transformer_layers_per_block` is `[1, 2]` under a plain last block (its mid
/// block two layers deep, which candle-transformers' config cannot express): the drop-in refuses
/// the weights it does not read, by name, where it built another model and ran 0.93 off; the
/// folder loader builds it. A config that matches the weights still loads.
#[test]
fn the_drop_in_refuses_weights_it_cannot_express() {
    use unet_attention::models::stable_diffusion::{unet_2d, vae};
    use unet_attention::models::UNet2DConditionModelConfig;
    let dir = crate::common::scratch("depth12");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(models().join("diffusers_sd1/config.json")).unwrap()).unwrap();
    config["transformer_layers_per_block"] = serde_json::json!([1, 2]);
    let cfg = UNet2DConditionModelConfig::from_config_json(&config).unwrap();
    let weights = crate::common::synth_folder(&dir, &config, |vb| UNet2DConditionModel::new(vb, &cfg));
    assert!(weights.contains_key("mid_block.attentions.0.transformer_blocks.1.norm1.weight"));
    UNet2DConditionModel::load(&dir, DType::F32, &Device::Cpu).unwrap();

    let block = |out_channels, use_cross_attn, attention_head_dim| unet_2d::BlockConfig {
        out_channels,
        use_cross_attn,
        attention_head_dim,
    };
    let drop_in = unet_2d::UNet2DConditionModelConfig {
        blocks: vec![block(8, Some(1), 2), block(16, None, 2)],
        layers_per_block: 1,
        norm_num_groups: 4,
        cross_attention_dim: 24,
        ..Default::default()
    };
    let vb = |dir: &Path| {
        let file = [dir.join("diffusion_pytorch_model.safetensors")];
        // SAFETY: the files are not modified while mapped.
        unsafe { candle_nn::VarBuilder::from_mmaped_safetensors(&file, DType::F32, &Device::Cpu).unwrap() }
    };
    let e = unet_2d::UNet2DConditionModel::new(vb(&dir), 4, 4, false, drop_in.clone())
        .expect_err("the drop-in built a model that leaves weights unread")
        .to_string();
    assert!(
        e.contains("weight(s) under the VarBuilder's root not read")
            && e.contains("`mid_block.attentions.0.transformer_blocks.1.attn1.to_k.weight` (closest used: `mid_block.attentions.0.transformer_blocks.0.attn1.to_k.weight`)")
            && e.contains("UNet2DConditionModel::load"),
        "{e}"
    );
    // The committed folder matches the config: it loads, as before (the README's snippet).
    unet_2d::UNet2DConditionModel::new(vb(&models().join("diffusers_sd1")), 4, 4, false, drop_in).unwrap();

    // The VAE drop-in: a config without the quant convs leaves theirs unread.
    let vae_config = vae::AutoEncoderKLConfig {
        block_out_channels: vec![8, 16],
        norm_num_groups: 4,
        use_quant_conv: false,
        ..Default::default()
    };
    let e = vae::AutoEncoderKL::new(vb(&models().join("diffusers_vae")), 3, 3, vae_config.clone())
        .expect_err("the VAE drop-in left quant_conv unread")
        .to_string();
    assert!(e.contains("`quant_conv.weight`") && e.contains("use_quant_conv"), "{e}");
    let one_block = vae::AutoEncoderKLConfig {
        block_out_channels: vec![8],
        use_quant_conv: true,
        ..vae_config
    };
    let e = vae::AutoEncoderKL::new(vb(&models().join("diffusers_vae")), 3, 3, one_block).err();
    assert!(e.is_some(), "a one-block config loaded the two-block VAE");
}
