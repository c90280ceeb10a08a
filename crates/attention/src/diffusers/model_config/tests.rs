//! Tests of the `config.json` → mid-block kwargs mapping (also used by `video`'s tests).

use super::*;
use crate::diffusers::controlnets::controlnet::ControlNetMidBlock;
use crate::diffusers::unets::mid_block::{UNetMidBlock2D, UNetMidBlock2DCrossAttn};
use crate::diffusers::unets::mid_block_1d::UNetMidBlock1D;
use crate::diffusers::unets::mid_block_3d::UNetMidBlock3DCrossAttn;
use crate::diffusers::unets::mid_block_simple_cross::UNetMidBlock2DSimpleCrossAttn;
use serde_json::json;

/// The one spec of a config (also for [`video`]'s tests).
pub(in crate::diffusers) fn one(config: Value) -> MidBlockSpec {
    let mut specs = mid_blocks(&config, None, false).unwrap();
    assert_eq!(specs.len(), 1);
    specs.remove(0)
}

#[test]
fn lists_and_counts_are_checked_as_the_model_checks_them() {
    let base = || {
        json!({"_class_name": "UNet2DConditionModel", "block_out_channels": [320, 640, 1280, 1280],
        "attention_head_dim": 8, "cross_attention_dim": 768})
    };
    let err = |edit: &dyn Fn(&mut Value)| {
        let mut c = base();
        edit(&mut c);
        mid_blocks(&c, None, false).unwrap_err().to_string()
    };
    let e = err(&|c| c["attention_head_dim"] = json!(vec![8; 1_000_000]));
    assert!(
        e.contains("`attention_head_dim` has 1000000 entries") && e.contains("(4)"),
        "{e}"
    );
    let e = err(&|c| c["down_block_types"] = json!([]));
    assert!(e.contains("`down_block_types` is empty"), "{e}");
    let e = err(&|c| c["layers_per_block"] = json!(1e308));
    assert!(e.contains("`layers_per_block` must be a whole number"), "{e}");
    let e = err(&|c| c["cross_attention_dim"] = json!([768, 768]));
    assert!(e.contains("`cross_attention_dim` has 2 entries"), "{e}");
    let e = err(&|c| c["transformer_layers_per_block"] = json!([1, 2, -10, 1]));
    assert!(e.contains("whole number"), "{e}");
    // Without block_out_channels or down_block_types: the class default's four down blocks.
    let mut c = base();
    c.as_object_mut().unwrap().remove("block_out_channels");
    c["attention_head_dim"] = json!([5, 10, 20]);
    assert!(mid_blocks(&c, None, false).unwrap_err().to_string().contains("(4)"));
    // The real shapes pass: per-block lists and nulls.
    let mut c = base();
    c["layers_per_block"] = json!([2, 2, 2, 1]);
    c["transformer_layers_per_block"] = json!([1, 2, 10, 1]);
    c["num_attention_heads"] = Value::Null;
    assert!(mid_blocks(&c, None, false).is_ok());
}

#[test]
fn norm_eps_must_be_a_finite_number_above_zero() {
    for bad in [json!(-1), json!(0), json!(-1e-6), json!("1e-5")] {
        let c = json!({"_class_name": "UNet2DModel", "norm_eps": bad});
        let e = mid_blocks(&c, None, false).unwrap_err().to_string();
        assert!(
            e.contains("`norm_eps` must be a finite number > 0") && e.contains("config.json"),
            "{e}"
        );
    }
    let c = json!({"_class_name": "UNet2DModel", "norm_eps": 1e-6});
    assert!(mid_blocks(&c, None, false).is_ok());
}

#[test]
fn sd_configs_mean_heads_by_attention_head_dim() {
    // SD 1.5's unet/config.json essentials: `attention_head_dim: 8` is 8 heads.
    let spec = one(
        json!({"_class_name": "UNet2DConditionModel", "_diffusers_version": "0.6.0",
        "block_out_channels": [320, 640, 1280, 1280], "attention_head_dim": 8, "cross_attention_dim": 768,
        "norm_eps": 1e-5, "norm_num_groups": 32}),
    );
    assert_eq!(spec.block, UNetMidBlock2DCrossAttn::BLOCK);
    assert_eq!((spec.prefix, spec.key_prefix().as_str()), ("mid_block", "mid_block."));
    assert_eq!(spec.config["in_channels"], 1280);
    assert_eq!(spec.config["temb_channels"], 1280);
    assert_eq!(spec.config["num_attention_heads"], 8);
    assert_eq!(spec.config["cross_attention_dim"], 768);
    // SD 2.x: a per-block list, the last entry counts; SDXL: num_attention_heads wins.
    let spec = one(
        json!({"_class_name": "UNet2DConditionModel", "attention_head_dim": [5, 10, 20, 20],
        "use_linear_projection": true, "cross_attention_dim": 1024}),
    );
    assert_eq!(spec.config["num_attention_heads"], 20);
    assert_eq!(spec.config["use_linear_projection"], true);
    let spec = one(
        json!({"_class_name": "UNet2DConditionModel", "block_out_channels": [320, 640, 1280],
        "attention_head_dim": [5, 10, 20], "num_attention_heads": null, "transformer_layers_per_block": [1, 2, 10],
        "class_embeddings_concat": true}),
    );
    assert_eq!(spec.config["transformer_layers_per_block"], 10);
    assert_eq!(spec.config["temb_channels"], 2560);
}

#[test]
fn unet_2d_and_vae_configs() {
    let spec = one(json!({"_class_name": "UNet2DModel", "block_out_channels": [128, 256], "attention_head_dim": null}));
    assert_eq!(spec.block, UNetMidBlock2D::BLOCK);
    assert_eq!(spec.config["attention_head_dim"], 256);
    assert_eq!(spec.config["temb_channels"], 512);
    assert_eq!(spec.config["resnet_eps"], 1e-5);
    let specs = mid_blocks(
        &json!({"_class_name": "AutoencoderKL", "block_out_channels": [128, 512]}),
        None,
        false,
    )
    .unwrap();
    let prefixes: Vec<_> = specs.iter().map(|s| s.prefix).collect();
    assert_eq!(prefixes, ["encoder.mid_block", "decoder.mid_block"]);
    assert_eq!(specs[0].config["attention_head_dim"], 512);
    assert_eq!(specs[0].config["temb_channels"], Value::Null);
}

#[test]
fn unet_1d_configs_give_unet_mid_block_1d() {
    // harmonai/maestro-150k's unet/config.json (Dance Diffusion), abridged to the keys that matter.
    let dance = json!({"_class_name": "UNet1DModel", "block_out_channels": [32, 32, 64, 64, 128, 128, 256, 256,
        512, 512, 512, 512, 512], "down_block_types": ["DownBlock1DNoSkip", "DownBlock1D", "DownBlock1D",
        "DownBlock1D", "DownBlock1D", "DownBlock1D", "AttnDownBlock1D", "AttnDownBlock1D", "AttnDownBlock1D",
        "AttnDownBlock1D", "AttnDownBlock1D", "AttnDownBlock1D", "AttnDownBlock1D"], "extra_in_channels": 16,
        "mid_block_type": "UNetMidBlock1D", "sample_size": 65536, "time_embedding_type": "fourier"});
    let spec = one(dance);
    assert_eq!(spec.block, UNetMidBlock1D::BLOCK);
    assert_eq!(
        spec.config,
        json!({"in_channels": 512, "mid_channels": 512, "out_channels": 512})
    );
    let value = one(
        json!({"_class_name": "UNet1DModel", "mid_block_type": "ValueFunctionMidBlock1D",
        "block_out_channels": [32, 64, 128, 256], "down_block_types": ["DownResnetBlock1D", "DownResnetBlock1D",
        "DownResnetBlock1D", "DownResnetBlock1D"]}),
    );
    assert_eq!(
        value.config,
        json!({"in_channels": 256, "out_channels": 256, "embed_dim": 32})
    );
    let e = mid_blocks(
        &json!({"_class_name": "UNet1DModel", "mid_block_type": "MidBlock1D"}),
        None,
        false,
    )
    .unwrap_err();
    assert!(e.to_string().contains("MidBlock1D"), "{e}");
}

#[test]
fn vq_model_configs_condition_the_decoder_on_zq_with_spatial_norm() {
    // Kandinsky 2.2's movq/config.json (kandinsky-community/kandinsky-2-2-decoder).
    let movq = json!({"_class_name": "VQModel", "_diffusers_version": "0.18.0.dev0", "act_fn": "silu",
        "block_out_channels": [128, 256, 256, 512], "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D",
        "DownEncoderBlock2D", "AttnDownEncoderBlock2D"], "in_channels": 3, "latent_channels": 4,
        "layers_per_block": 2, "norm_num_groups": 32, "norm_type": "spatial", "num_vq_embeddings": 16384,
        "out_channels": 3, "sample_size": 32, "up_block_types": ["AttnUpDecoderBlock2D", "UpDecoderBlock2D",
        "UpDecoderBlock2D", "UpDecoderBlock2D"], "vq_embed_dim": 4});
    let specs = mid_blocks(&movq, None, false).unwrap();
    assert_eq!(specs[0].config["resnet_time_scale_shift"], "default");
    assert_eq!(specs[0].config["temb_channels"], Value::Null);
    assert_eq!(specs[1].prefix, "decoder.mid_block");
    assert_eq!(specs[1].config["resnet_time_scale_shift"], "spatial");
    assert_eq!(specs[1].config["temb_channels"], 4);
    assert_eq!(specs[1].config["in_channels"], 512);
    // norm_type "group" is AutoencoderKL's pair; anything else is refused.
    let group = mid_blocks(&json!({"_class_name": "VQModel"}), None, false).unwrap();
    assert_eq!(group[1].config["resnet_time_scale_shift"], "default");
    let e = mid_blocks(&json!({"_class_name": "VQModel", "norm_type": "ada"}), None, false).unwrap_err();
    assert!(e.to_string().contains("norm_type"), "{e}");
}

#[test]
fn unknown_keys_and_classes_are_errors() {
    let cfg = json!({"_class_name": "UNet2DModel", "mid_block_flavour": 1});
    let e = mid_blocks(&cfg, None, false).unwrap_err().to_string();
    assert!(e.contains("mid_block_flavour"), "{e}");
    assert!(mid_blocks(&cfg, None, true).is_ok());
    let e = mid_blocks(&json!({"_class_name": "Kandinsky3UNet"}), None, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("Kandinsky3UNet"), "{e}");
    let e = mid_blocks(&json!({"block_out_channels": [4]}), None, false)
        .unwrap_err()
        .to_string();
    assert!(e.contains("_class_name"), "{e}");
    let spec = mid_blocks(
        &json!({"block_out_channels": [8]}),
        Some(ModelClass::UNet2DModel),
        false,
    )
    .unwrap();
    assert_eq!(spec[0].config["in_channels"], 8);
}

#[test]
fn simple_cross_attn_configs_follow_unet_2d_condition_model() {
    // DeepFloyd IF-I-like: attention_head_dim is the head width, scale_shift resnets, the
    // T5 context projected by encoder_hid_proj to cross_attention_dim, group_norm cross norm.
    let spec = one(
        json!({"_class_name": "UNet2DConditionModel", "mid_block_type": "UNetMidBlock2DSimpleCrossAttn",
        "block_out_channels": [64, 128, 192], "attention_head_dim": 64, "cross_attention_dim": 256,
        "encoder_hid_dim": 4096, "encoder_hid_dim_type": "text_proj", "addition_embed_type": "text",
        "resnet_time_scale_shift": "scale_shift", "resnet_skip_time_act": true, "resnet_out_scale_factor": 1.414,
        "cross_attention_norm": "group_norm", "only_cross_attention": false, "norm_num_groups": 32}),
    );
    assert_eq!(spec.block, UNetMidBlock2DSimpleCrossAttn::BLOCK);
    let c = &spec.config;
    assert_eq!(
        (c["in_channels"].clone(), c["temb_channels"].clone()),
        (json!(192), json!(256))
    );
    assert_eq!(c["attention_head_dim"], 64);
    assert_eq!(c["cross_attention_dim"], 256);
    assert_eq!(c["skip_time_act"], true);
    assert_eq!(c["cross_attention_norm"], "group_norm");
    assert_eq!(c["resnet_time_scale_shift"], "scale_shift");
    assert_eq!(c["only_cross_attention"], false);
    assert!(c.get("output_scale_factor") == Some(&json!(1)) && c.get("num_attention_heads").is_none());
    let built: crate::diffusers::UNetMidBlock2DSimpleCrossAttnConfig =
        crate::config::from_json(UNetMidBlock2DSimpleCrossAttn::BLOCK, c).unwrap();
    assert_eq!(built.attention_head_dim, 64);
    // UnCLIP-like: a bool only_cross_attention carries to the mid block unless
    // mid_block_only_cross_attention says otherwise; a list does not.
    let base = json!({"_class_name": "UNet2DConditionModel", "mid_block_type": "UNetMidBlock2DSimpleCrossAttn",
        "attention_head_dim": [8, 16], "block_out_channels": [32, 64], "cross_attention_dim": [48, 64],
        "only_cross_attention": true, "cross_attention_norm": "layer_norm"});
    let spec = one(base.clone());
    assert_eq!(spec.config["only_cross_attention"], true);
    assert_eq!(spec.config["attention_head_dim"], 16);
    assert_eq!(spec.config["cross_attention_dim"], 64);
    let mut v = base.clone();
    v["mid_block_only_cross_attention"] = json!(false);
    assert_eq!(one(v).config["only_cross_attention"], false);
    let mut v = base.clone();
    v["only_cross_attention"] = json!([true, true]);
    assert_eq!(one(v).config["only_cross_attention"], false);
    let mut v = base;
    v["attention_head_dim"] = Value::Null;
    let e = mid_blocks(&v, None, false).unwrap_err().to_string();
    assert!(e.contains("attention_head_dim"), "{e}");
}

#[test]
fn controlnet_configs_give_the_whole_bottleneck_and_its_mid_block() {
    // lllyasviel/sd-controlnet-canny's config.json essentials: attention_head_dim 8 = 8 heads.
    let sd15 = json!({"_class_name": "ControlNetModel", "_diffusers_version": "0.16.0.dev0",
        "block_out_channels": [320, 640, 1280, 1280], "attention_head_dim": 8, "cross_attention_dim": 768,
        "norm_eps": 1e-5, "norm_num_groups": 32, "conditioning_embedding_out_channels": [16, 32, 96, 256],
        "controlnet_conditioning_channel_order": "rgb", "global_pool_conditions": false});
    let specs = mid_blocks(&sd15, None, false).unwrap();
    assert_eq!(specs.len(), 2);
    let (whole, mid) = (&specs[0], &specs[1]);
    assert_eq!(
        (whole.block, whole.prefix, whole.key_prefix().as_str()),
        (ControlNetMidBlock::BLOCK, "", "")
    );
    assert_eq!(
        (mid.block, mid.key_prefix().as_str()),
        (UNetMidBlock2DCrossAttn::BLOCK, "mid_block.")
    );
    assert_eq!(whole.config["mid_block"], mid.config);
    assert_eq!(whole.config["mid_block_type"], "UNetMidBlock2DCrossAttn");
    assert_eq!(whole.config["global_pool_conditions"], false);
    let m = &mid.config;
    assert_eq!(
        (m["in_channels"].clone(), m["temb_channels"].clone()),
        (json!(1280), json!(1280))
    );
    assert_eq!(m["num_attention_heads"], 8);
    assert_eq!(m["cross_attention_dim"], 768);
    assert!(m.get("dropout").is_none() && m.get("dual_cross_attention").is_none() && m.get("attention_type").is_none());
    let built: crate::diffusers::ControlNetMidBlockConfig =
        crate::config::from_json(ControlNetMidBlock::BLOCK, &whole.config).unwrap();
    assert!(!built.global_pool_conditions);
    // SDXL-like: num_attention_heads wins, per-block lists' last entries.
    let mut v = sd15.clone();
    v["attention_head_dim"] = json!([5, 10, 20]);
    v["num_attention_heads"] = json!([5, 10, 20]);
    v["block_out_channels"] = json!([320, 640, 1280]);
    v["transformer_layers_per_block"] = json!([1, 2, 10]);
    v["use_linear_projection"] = json!(true);
    v["addition_embed_type"] = json!("text_time");
    v["global_pool_conditions"] = json!(true);
    let specs = mid_blocks(&v, None, false).unwrap();
    assert_eq!(specs[1].config["num_attention_heads"], 20);
    assert_eq!(specs[1].config["transformer_layers_per_block"], 10);
    assert_eq!(specs[1].config["temb_channels"], 1280);
    assert_eq!(specs[0].config["global_pool_conditions"], true);
    // mid_block_type UNetMidBlock2D: one ResNet.
    let mut v = sd15.clone();
    v["mid_block_type"] = json!("UNetMidBlock2D");
    let specs = mid_blocks(&v, None, false).unwrap();
    assert_eq!(specs[1].block, UNetMidBlock2D::BLOCK);
    assert_eq!(specs[1].config["num_layers"], 0);
    // What ControlNetModel rejects: another mid block type, image_proj, an added embedding of
    // the IF / Kandinsky kind, and UNet2DConditionModel-only keys.
    for (key, value, needle) in [
        (
            "mid_block_type",
            json!("UNetMidBlock2DSimpleCrossAttn"),
            "UNetMidBlock2DSimpleCrossAttn",
        ),
        ("mid_block_type", Value::Null, "mid_block_type null"),
        ("addition_embed_type", json!("image"), "\"image\""),
        (
            "mid_block_only_cross_attention",
            json!(true),
            "mid_block_only_cross_attention",
        ),
    ] {
        let mut v = sd15.clone();
        v[key] = value;
        let e = mid_blocks(&v, None, false).unwrap_err().to_string();
        assert!(e.contains(needle), "{needle}: {e}");
    }
    let mut v = sd15;
    v["encoder_hid_dim"] = json!(16);
    v["encoder_hid_dim_type"] = json!("image_proj");
    let e = mid_blocks(&v, None, false).unwrap_err().to_string();
    assert!(e.contains("image_proj") && e.contains("text_image_proj"), "{e}");
}

#[test]
fn encoder_hid_and_addition_types_diffusers_rejects_are_errors() {
    let base = json!({"_class_name": "UNet2DConditionModel", "mid_block_type": "UNetMidBlock2DSimpleCrossAttn",
        "attention_head_dim": 8});
    for (key, value, needle) in [
        (
            "encoder_hid_dim_type",
            json!("image_proj"),
            "`encoder_hid_dim` has to be defined",
        ),
        ("encoder_hid_dim_type", json!("ip_image_proj"), "ip_image_proj"),
        ("addition_embed_type", json!("clip"), "clip"),
    ] {
        let mut v = base.clone();
        v[key] = value;
        if key == "encoder_hid_dim_type" && needle != "`encoder_hid_dim` has to be defined" {
            v["encoder_hid_dim"] = json!(16);
        }
        let e = mid_blocks(&v, None, false).unwrap_err().to_string();
        assert!(e.contains(needle), "{e}");
    }
    let mut v = base;
    v["encoder_hid_dim"] = json!(16);
    v["encoder_hid_dim_type"] = json!("text_image_proj");
    v["addition_embed_type"] = json!("text_image");
    assert!(mid_blocks(&v, None, false).is_ok());
}

#[test]
fn unet_3d_condition_configs_give_the_video_mid_block() {
    // shaped like ModelScope text-to-video (1.7b): attention_head_dim 64, 1280 mid channels, context 1024
    let ms = json!({"_class_name": "UNet3DConditionModel", "_diffusers_version": "0.17.0.dev0", "act_fn": "silu",
        "attention_head_dim": 64, "block_out_channels": [320, 640, 1280, 1280], "cross_attention_dim": 1024,
        "down_block_types": ["CrossAttnDownBlock3D", "CrossAttnDownBlock3D", "CrossAttnDownBlock3D", "DownBlock3D"],
        "downsample_padding": 1, "in_channels": 4, "layers_per_block": 2, "mid_block_scale_factor": 1,
        "norm_eps": 1e-05, "norm_num_groups": 32, "out_channels": 4, "sample_size": 32,
        "up_block_types": ["UpBlock3D", "CrossAttnUpBlock3D", "CrossAttnUpBlock3D", "CrossAttnUpBlock3D"]});
    let spec = one(ms.clone());
    assert_eq!(spec.block, UNetMidBlock3DCrossAttn::BLOCK);
    assert_eq!(spec.prefix, "mid_block");
    assert_eq!(
        spec.config,
        json!({"in_channels": 1280, "temb_channels": 1280, "resnet_eps": 1e-05, "resnet_act_fn": "silu",
            "output_scale_factor": 1, "cross_attention_dim": 1024, "num_attention_heads": 64,
            "resnet_groups": 32, "dual_cross_attention": false})
    );
    let cfg: crate::diffusers::UNetMidBlock3DCrossAttnConfig = crate::config::from_json("test", &spec.config).unwrap();
    assert!(cfg.use_linear_projection && cfg.num_layers == 1);
    // Defaults (an empty config) and a per-block attention_head_dim list.
    let spec = one(json!({"_class_name": "UNet3DConditionModel", "attention_head_dim": [8, 8, 16, 32]}));
    assert_eq!(spec.config["num_attention_heads"], 32);
    assert_eq!(spec.config["cross_attention_dim"], 1024);
    // num_attention_heads set: diffusers raises.
    let mut bad = ms;
    bad["num_attention_heads"] = json!(8);
    let e = mid_blocks(&bad, None, false).unwrap_err().to_string();
    assert!(e.contains("NotImplementedError"), "{e}");
}
