//! Single-file checkpoints (`unet_attention::models::single_file`): the tiny SD 1.x / 2.x files
//! `scripts/export_single_file.py` wrote with the real ldm code (`weights/single_file/`), loaded in
//! one call and run against the ldm forward (the whole bundles `weights/whole/single_*`), the tiny
//! SDXL file (sgm's layout, read back by diffusers' `from_single_file`) against diffusers' forward,
//! the configs against the ones diffusers derives, and the ways a load must fail.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::helpers::{bundle, max_abs_diff, root};
use candle_core::{DType, Device, Tensor};
use serde_json::Value;
use unet_attention::models::single_file::{LdmUNetConfig, LdmVaeConfig, UNET_PREFIX};
use unet_attention::models::{AddedCond, AutoencoderKL, ForwardArgs, UNet2DConditionModel};
use unet_attention::weights::WeightSource;

fn json(rel: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(root(rel)).unwrap()).unwrap()
}

/// The original config a file stands for (`<name>.yaml.json`, the YAML's `model.params`: ldm's
/// `unet_config` or sgm's `network_config`).
fn unet_config(name: &str) -> LdmUNetConfig {
    let yaml = json(&format!("weights/single_file/{name}.yaml.json"));
    let params = &yaml["model"]["params"];
    let unet = match params.get("unet_config") {
        Some(u) => u,
        None => &params["network_config"],
    };
    LdmUNetConfig::from_json(&unet["params"]).unwrap()
}

fn vae_config(name: &str) -> LdmVaeConfig {
    let yaml = json(&format!("weights/single_file/{name}.yaml.json"));
    let params = &yaml["model"]["params"];
    let mut first = params["first_stage_config"]["params"].clone();
    first["scale_factor"] = params["scale_factor"].clone();
    LdmVaeConfig::from_json(&first).unwrap()
}

/// Every key diffusers' derived config (`<name>.unet.json` / `.vae.json`) gives equals ours, but
/// `sample_size` (diffusers puts the pipeline's image size there; the forward never reads it).
fn assert_same_config(ours: &Value, diffusers: &Value, what: &str) {
    for (key, want) in diffusers.as_object().unwrap() {
        if key == "sample_size" {
            continue;
        }
        let got = &ours[key];
        let same = match (got, want) {
            // diffusers writes one value where a list of equal ones means the same
            (Value::Array(items), one) if !one.is_array() && !one.is_null() => items.iter().all(|v| v == one),
            (a, b) => a == b || (a.as_f64().is_some() && a.as_f64() == b.as_f64()),
        };
        assert!(same, "{what}: `{key}` is {got}, diffusers derives {want}");
    }
}

#[test]
fn configs_are_the_ones_diffusers_derives() {
    for name in ["sd1_tiny", "sd2_tiny", "sdxl_tiny", "sdxl_base", "sdxl_refiner"] {
        let ours = serde_json::to_value(unet_config(name).to_diffusers().unwrap()).unwrap();
        assert_same_config(&ours, &json(&format!("weights/single_file/{name}.unet.json")), name);
    }
    // the presets are Stability's YAMLs
    let diffusers = |cfg: LdmUNetConfig| serde_json::to_value(cfg.to_diffusers().unwrap()).unwrap();
    assert_eq!(diffusers(LdmUNetConfig::sdxl()), diffusers(unet_config("sdxl_base")));
    assert_eq!(
        diffusers(LdmUNetConfig::sdxl_refiner()),
        diffusers(unet_config("sdxl_refiner"))
    );
    let ours = serde_json::to_value(vae_config("sd1_tiny").to_diffusers().unwrap()).unwrap();
    assert_same_config(&ours, &json("weights/single_file/sd1_tiny.vae.json"), "sd1_tiny VAE");
    // the full-size configs: SD 1.x's eight heads, SD 2.x's per-level head counts (320 / 64 = 5 × mult)
    let sd1 = serde_json::to_value(LdmUNetConfig::sd1().to_diffusers().unwrap()).unwrap();
    assert_eq!(sd1["attention_head_dim"], 8);
    assert_eq!(sd1["cross_attention_dim"], 768);
    let sd2 = serde_json::to_value(LdmUNetConfig::sd2().to_diffusers().unwrap()).unwrap();
    assert_eq!(sd2["attention_head_dim"], serde_json::json!([5, 10, 20, 20]));
    assert_eq!(sd2["use_linear_projection"], true);
}

/// The checker's verdict on our output (`unet_parity::port::PortCheck`, the rule `unet-parity
/// check` applies), with ours and PyTorch's float32 distances from the bundle's float64 output
/// printed. Measured (2-core Xeon, default / AVX2 / no-vector kernels): ours 1.0e-6 to 1.3e-6 vs
/// PyTorch 1.55e-6 (SD 1.x U-Net), 5.5e-6 to 8.7e-6 vs 5.65e-6 (VAE), 2.4e-6 to 3.8e-6 vs 1.91e-6
/// (SD 2.x U-Net from the `.ckpt`).
/// `forward64` builds the model from the bundle's weights in float64 and runs it (the checker's
/// float64 run, which tells a twin that is not one from rounding).
fn assert_matches(
    what: &str,
    rel: &str,
    ours: &Tensor,
    forward64: impl FnMut(candle_nn::VarBuilder<'static>, &unet_parity::port::PortInputs) -> unet_attention::Result<Tensor>,
) {
    let b = bundle(rel);
    let f64_out = b["parity.output.output.float64"].to_dtype(DType::F32).unwrap();
    let (err, torch) = (
        max_abs_diff(ours, &f64_out),
        max_abs_diff(&b["parity.output.output"], &f64_out),
    );
    eprintln!("{what} vs ldm's float64 output: {err:.2e} (PyTorch's float32: {torch:.2e})");
    let report = unet_parity::port::PortCheck::open(root(rel))
        .unwrap()
        .run_with_float64(|_| Ok::<_, candle_core::Error>(ours.clone()), forward64)
        .unwrap();
    assert!(report.pass, "{what}: {report}");
}

/// The bound the negative checks must exceed widely: the checker's float32 atol (1e-5).
const ATOL: f32 = 1e-5;

fn unet_output(model: &UNet2DConditionModel, rel: &str) -> (Tensor, BTreeMap<String, Tensor>) {
    let b = bundle(rel);
    let ours = model
        .forward(&b["parity.input.x"], 421.0, &b["parity.input.context"])
        .unwrap();
    (ours, b)
}

/// The safetensors SD 1.x file and the `.ckpt` SD 2.x file, each in one call, against ldm's forward.
#[test]
fn single_files_load_in_one_call_and_match_ldm() {
    let dev = Device::Cpu;
    let path = root("weights/single_file/sd1_tiny.safetensors");
    let unet = UNet2DConditionModel::from_single_file(&path, Some(&unet_config("sd1_tiny")), DType::F32, &dev).unwrap();
    let rel = "weights/whole/single_sd1_tiny_unet.safetensors";
    let cfg = unet_config("sd1_tiny");
    assert_matches("sd1_tiny U-Net", rel, &unet_output(&unet, rel).0, |vb, i| {
        UNet2DConditionModel::from_ldm(vb, &cfg)?.forward(i.get("x").unwrap(), 421.0, i.get("context").unwrap())
    });

    let vae = AutoencoderKL::from_single_file(&path, Some(&vae_config("sd1_tiny")), DType::F32, &dev).unwrap();
    let rel = "weights/whole/single_sd1_tiny_vae.safetensors";
    let cfg = vae_config("sd1_tiny");
    let ours = vae.forward(&bundle(rel)["parity.input.sample"]).unwrap();
    assert_matches("sd1_tiny VAE", rel, &ours, |vb, i| {
        AutoencoderKL::from_ldm(vb, &cfg)?.forward(i.get("sample").unwrap())
    });

    let source = unet_parity::checkpoint::open_single_file(&root("weights/single_file/sd2_tiny.ckpt")).unwrap();
    let unet = UNet2DConditionModel::from_single_file_weights(source, Some(&unet_config("sd2_tiny")), DType::F32, &dev)
        .unwrap();
    let rel = "weights/whole/single_sd2_tiny_unet.safetensors";
    let cfg = unet_config("sd2_tiny");
    assert_matches("sd2_tiny U-Net (.ckpt)", rel, &unet_output(&unet, rel).0, |vb, i| {
        UNet2DConditionModel::from_ldm(vb, &cfg)?.forward(i.get("x").unwrap(), 421.0, i.get("context").unwrap())
    });
}

/// The SDXL-style file in one call against diffusers' forward (with the added conditions); a
/// swapped pair of weights in a second transformer layer misses widely, and `label_emb` under
/// another name is an error naming both.
#[test]
fn an_sdxl_single_file_loads_and_matches_diffusers() {
    let (path, rel) = (
        root("weights/single_file/sdxl_tiny.safetensors"),
        "weights/whole/single_sdxl_tiny_unet.safetensors",
    );
    let cfg = unet_config("sdxl_tiny");
    let unet = UNet2DConditionModel::from_single_file(&path, Some(&cfg), DType::F32, &Device::Cpu).unwrap();
    let b = bundle(rel);
    let run = |unet: &UNet2DConditionModel, text_embeds: &Tensor, time_ids: &Tensor| {
        let added_cond = Some(AddedCond { text_embeds, time_ids });
        let args = ForwardArgs {
            added_cond,
            ..ForwardArgs::default()
        };
        unet.forward_with(&b["parity.input.x"], 421.0, &b["parity.input.context"], args)
            .unwrap()
    };
    let (text, ids) = (&b["parity.input.text_embeds"], &b["parity.input.time_ids"]);
    let ours = run(&unet, text, ids);
    assert_matches("sdxl_tiny U-Net", rel, &ours, |vb, i| {
        let added_cond = Some(AddedCond {
            text_embeds: i.get("text_embeds").unwrap(),
            time_ids: i.get("time_ids").unwrap(),
        });
        let args = ForwardArgs {
            added_cond,
            ..ForwardArgs::default()
        };
        UNet2DConditionModel::from_ldm(vb, &cfg)?.forward_with(
            i.get("x").unwrap(),
            421.0,
            i.get("context").unwrap(),
            args,
        )
    });
    // The added conditions barely move this model's output (2e-6: its 32-channel levels have one
    // channel per GroupNorm group, which normalizes the time embedding's per-channel shift away);
    // their arithmetic is the SDXL folder's (weights/whole/sdxl_*), checked there. Here: the key
    // map, a second transformer layer's q and k swapped.
    let attn = format!("{UNET_PREFIX}middle_block.1.transformer_blocks.1.attn1");
    let mut swapped = tensors("weights/single_file/sdxl_tiny.safetensors");
    let q = swapped.remove(&format!("{attn}.to_q.weight")).unwrap();
    let k = swapped.insert(format!("{attn}.to_k.weight"), q).unwrap();
    swapped.insert(format!("{attn}.to_q.weight"), k);
    let source: Arc<dyn WeightSource> = Arc::new(swapped);
    let unet = UNet2DConditionModel::from_single_file_weights(source, Some(&cfg), DType::F32, &Device::Cpu).unwrap();
    let err = max_abs_diff(&run(&unet, text, ids), &b["parity.output.output"]);
    eprintln!("the mid block's second layer's to_q / to_k swapped: {err:.2e}");
    assert!(err > 100.0 * ATOL, "swapped to_q / to_k passed: {err:e}");

    let mut renamed = tensors("weights/single_file/sdxl_tiny.safetensors");
    let t = renamed.remove(&format!("{UNET_PREFIX}label_emb.0.0.weight")).unwrap();
    renamed.insert(format!("{UNET_PREFIX}label_emb.0.1.weight"), t);
    let source: Arc<dyn WeightSource> = Arc::new(renamed);
    let err = UNet2DConditionModel::from_single_file_weights(source, Some(&cfg), DType::F32, &Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("missing weight `model.diffusion_model.label_emb.0.0.weight`")
            && err.contains("label_emb.0.1.weight"),
        "{err}"
    );
}

/// The file's tensors as a map (full names) to tamper with.
fn tensors(rel: &str) -> BTreeMap<String, Tensor> {
    bundle(rel)
}

fn load(map: BTreeMap<String, Tensor>) -> unet_attention::Result<UNet2DConditionModel> {
    let source: Arc<dyn WeightSource> = Arc::new(map);
    UNet2DConditionModel::from_single_file_weights(source, Some(&unet_config("sd1_tiny")), DType::F32, &Device::Cpu)
}

/// A swapped pair of weights fails the bound widely; a key under another name, an extra key and a
/// config the file does not match are errors naming the keys.
#[test]
fn wrong_keys_and_swapped_weights_fail() {
    let file = tensors("weights/single_file/sd1_tiny.safetensors");
    let attn = format!("{UNET_PREFIX}input_blocks.1.1.transformer_blocks.0.attn1");
    let mut swapped = file.clone();
    let q = swapped.remove(&format!("{attn}.to_q.weight")).unwrap();
    let k = swapped.insert(format!("{attn}.to_k.weight"), q).unwrap();
    swapped.insert(format!("{attn}.to_q.weight"), k);
    let (ours, b) = unet_output(
        &load(swapped).unwrap(),
        "weights/whole/single_sd1_tiny_unet.safetensors",
    );
    let err = max_abs_diff(&ours, &b["parity.output.output"]);
    eprintln!("to_q / to_k swapped: {err:.2e}");
    assert!(err > 100.0 * ATOL, "swapped to_q / to_k passed: {err:e}");

    // the mid block's second resnet under the wrong index: missing where the model looks, and unread
    let mut moved = file.clone();
    let from = format!("{UNET_PREFIX}middle_block.2.in_layers.0.weight");
    let t = moved.remove(&from).unwrap();
    moved.insert(format!("{UNET_PREFIX}middle_block.3.in_layers.0.weight"), t);
    let err = load(moved).expect_err("a moved key loaded").to_string();
    assert!(err.contains("middle_block.2.in_layers.0.weight"), "{err}");

    let mut extra = file.clone();
    extra.insert(
        format!("{UNET_PREFIX}output_blocks.9.0.stray.weight"),
        Tensor::zeros(3, DType::F32, &Device::Cpu).unwrap(),
    );
    let err = load(extra).expect_err("an extra key loaded").to_string();
    assert!(
        err.contains("output_blocks.9.0.stray.weight") && err.contains("not used"),
        "{err}"
    );

    // SD 2.x's config on SD 1.x's file: a shape error naming the key
    let source: Arc<dyn WeightSource> = Arc::new(file);
    let err = UNet2DConditionModel::from_single_file_weights(
        source,
        Some(&unet_config("sd2_tiny")),
        DType::F32,
        &Device::Cpu,
    )
    .expect_err("the wrong config loaded")
    .to_string();
    assert!(
        err.contains("model.diffusion_model.input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight"),
        "{err}"
    );
}

/// Without a config the file's cross-attention width decides (768: SD 1.x, 1024: SD 2.x; with
/// `label_emb`, SDXL base at 2048 wide over 2816 features, the refiner at 1280 over 2560, and the
/// VAE of an SDXL file takes SDXL's scale factor); the tiny files are neither and the error asks
/// for the config.
#[test]
fn configs_are_inferred_or_asked_for() {
    let file = tensors("weights/single_file/sd1_tiny.safetensors");
    let err = LdmUNetConfig::infer(&file).err().unwrap().to_string();
    assert!(err.contains("24 wide") && err.contains("give the config"), "{err}");
    let err = LdmVaeConfig::infer(&file).err().unwrap().to_string();
    assert!(err.contains("give the config"), "{err}");
    let key = format!("{UNET_PREFIX}input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight");
    let shaped = |width: usize| {
        let mut m = BTreeMap::new();
        m.insert(
            key.clone(),
            Tensor::zeros((320, width), DType::F32, &Device::Cpu).unwrap(),
        );
        m
    };
    assert_eq!(LdmUNetConfig::infer(&shaped(768)).unwrap(), LdmUNetConfig::sd1());
    assert_eq!(LdmUNetConfig::infer(&shaped(1024)).unwrap(), LdmUNetConfig::sd2());
    let xl = |width: usize, features: usize| {
        let mut m = shaped(width);
        let label = Tensor::zeros((1280, features), DType::F32, &Device::Cpu).unwrap();
        m.insert(format!("{UNET_PREFIX}label_emb.0.0.weight"), label);
        m
    };
    assert_eq!(LdmUNetConfig::infer(&xl(2048, 2816)).unwrap(), LdmUNetConfig::sdxl());
    assert_eq!(
        LdmUNetConfig::infer(&xl(1280, 2560)).unwrap(),
        LdmUNetConfig::sdxl_refiner()
    );
    let err = LdmUNetConfig::infer(&xl(2048, 2560)).err().unwrap().to_string();
    assert!(
        err.contains("label_emb") && err.contains("2048 wide") && err.contains("give the config"),
        "{err}"
    );
    let mut vae = xl(2048, 2816);
    let conv_in = Tensor::zeros((128, 3, 3, 3), DType::F32, &Device::Cpu).unwrap();
    vae.insert("first_stage_model.encoder.conv_in.weight".into(), conv_in);
    assert_eq!(LdmVaeConfig::infer(&vae).unwrap().scale_factor, Some(0.13025));
    vae.retain(|k, _| !k.contains("label_emb"));
    assert_eq!(LdmVaeConfig::infer(&vae).unwrap(), LdmVaeConfig::sd());
    // a file with no U-Net at all
    let err = UNet2DConditionModel::from_single_file(
        root("weights/models/diffusers_sd1/diffusion_pytorch_model.safetensors"),
        Some(&unet_config("sd1_tiny")),
        DType::F32,
        &Device::Cpu,
    )
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains("no tensor under `model.diffusion_model.`"), "{err}");
}
