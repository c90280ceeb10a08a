//! Mid blocks from whole checkpoints: `--weights`/`--prefix`, bundles that reference a
//! checkpoint, `--config config.json`, `detect`, and `--repo` through a Hugging Face cache folder
//! built here (no network).

mod common;
use common::{cli, scratch, weights, RawBundle};
use std::path::Path;

fn w(rel: &str) -> String {
    weights().join(rel).to_str().unwrap().to_string()
}

fn models(rel: &str) -> String {
    w(&format!("models/{rel}"))
}

fn assert_pass(args: &[&str]) -> String {
    let (code, out, err) = cli(args);
    assert_eq!(code, 0, "{args:?}\n{out}\n{err}");
    assert!(out.contains("PASS") && !out.contains("FAIL"), "{out}");
    err
}

#[test]
fn referencing_bundles_load_their_checkpoint_lazily_in_every_format() {
    // safetensors, torch .bin, lucidrains Trainer .pt (model and ema entries), SD .ckpt
    // (state_dict entry), a bare guided-diffusion state dict.
    for bundle in [
        "mid/unet_mid_block_2d_unet2d_ref.safetensors",
        "mid/unet_mid_block_2d_unet2d_bin_one_head_ref.safetensors",
        "mid/lucidrains_mid_block_model_ref.safetensors",
        "mid/lucidrains_mid_block_ema_ref.safetensors",
        "mid/openai_middle_block_sd1_spatial_transformer_ref.safetensors",
        "mid/ldm_mid_block_sd_vae_decoder_ref.safetensors",
        "mid/openai_middle_block_guided_legacy_scale_shift_ref.safetensors",
    ] {
        let err = assert_pass(&["check", &w(bundle)]);
        assert!(err.contains("weights from"), "{bundle}: {err}");
    }
}

#[test]
fn weights_and_prefix_override_the_bundle_and_pick_the_right_section() {
    // The EMA bundle passes with the EMA weights of the Trainer checkpoint ...
    let ema = w("mid/lucidrains_mid_block_ema_ref.safetensors");
    let ckpt = models("lucidrains_ddpm/model-1.pt");
    assert_pass(&["check", &ema, "--weights", &ckpt, "--prefix", "ema_model.model."]);
    // ... and the full flattened name works too, with or without its final dot.
    assert_pass(&["check", &ema, "--weights", &ckpt, "--prefix", "ema.ema_model.model."]);
    assert_pass(&["check", &ema, "--weights", &ckpt, "--prefix", "ema.ema_model.model"]);
    // The online weights differ from the EMA ones: a mismatch, exit 1.
    let (code, out, _) = cli(&["check", &ema, "--weights", &ckpt, "--prefix", "model."]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("FAIL"), "{out}");
}

#[test]
fn a_prefix_that_is_not_there_is_a_clear_error() {
    let bundle = w("mid/unet_mid_block_2d_unet2d_ref.safetensors");
    let ckpt = models("diffusers_unet2d/diffusion_pytorch_model.safetensors");
    let (code, _, err) = cli(&["check", &bundle, "--weights", &ckpt, "--prefix", "midblock."]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("no tensor under prefix `midblock.`") && err.contains("detect"),
        "{err}"
    );
    // Another block's weights: the key, expected and found shapes are named.
    let (code, _, err) = cli(&["check", &bundle, "--weights", &ckpt, "--prefix", "down_blocks.1."]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("resnets.0.norm1.weight") && err.contains("expected: [16]"),
        "{err}"
    );
}

#[test]
fn config_json_gives_the_mid_block_config() {
    for (bundle, config) in [
        (
            "mid/unet_mid_block_2d_unet2d_ref.safetensors",
            "diffusers_unet2d/config.json",
        ),
        (
            "mid/unet_mid_block_2d_unet2d_scale_shift_ref.safetensors",
            "diffusers_unet2d_scale_shift/config.json",
        ),
        (
            "mid/unet_mid_block_2d_vae_decoder_ref.safetensors",
            "diffusers_vae/config.json",
        ),
        (
            "mid/unet_mid_block_2d_movq_decoder_ref.safetensors",
            "diffusers_movq/config.json",
        ),
        ("mid/unet_mid_block_1d_ref.safetensors", "diffusers_unet1d/config.json"),
        (
            "mid/unet_mid_block_2d_movq_encoder_ref.safetensors",
            "diffusers_movq/config.json",
        ),
        (
            "mid/unet_mid_block_2d_cross_attn_sd1_ref.safetensors",
            "diffusers_sd1/config.json",
        ),
        (
            "mid/unet_mid_block_2d_cross_attn_sd2_ref.safetensors",
            "diffusers_sd2/config.json",
        ),
        (
            "mid/unet_mid_block_2d_cross_attn_sdxl_ref.safetensors",
            "diffusers_sdxl/config.json",
        ),
        (
            "mid/unet_mid_block_2d_simple_cross_attn_if_ref.safetensors",
            "diffusers_if/config.json",
        ),
        (
            "mid/unet_mid_block_2d_simple_cross_attn_kandinsky_ref.safetensors",
            "diffusers_kandinsky/config.json",
        ),
        (
            "mid/controlnet_mid_block_ref.safetensors",
            "diffusers_controlnet/config.json",
        ),
        (
            "mid/controlnet_xs_mid_block_ref.safetensors",
            "diffusers_controlnet_xs/config.json",
        ),
        (
            "mid/controlnet_xs_mid_block_no_control_ref.safetensors",
            "diffusers_controlnet_xs/config.json",
        ),
        (
            "mid/unet_mid_block_3d_cross_attn_unet3d_ref.safetensors",
            "diffusers_unet3d/config.json",
        ),
        (
            "mid/unet_mid_block_spatio_temporal_svd_mixed_ref.safetensors",
            "diffusers_svd/config.json",
        ),
        (
            "mid/mid_block_temporal_decoder_svd_ref.safetensors",
            "diffusers_svd_vae/config.json",
        ),
        (
            "mid/unet_mid_block_2d_svd_vae_encoder_ref.safetensors",
            "diffusers_svd_vae/config.json",
        ),
        (
            "mid/unet_mid_block_cross_attn_motion_ref.safetensors",
            "diffusers_unet_motion/config.json",
        ),
        (
            "mid/unet_mid_block_3d_cross_attn_i2vgen_xl_ref.safetensors",
            "diffusers_i2vgen_xl/config.json",
        ),
    ] {
        let err = assert_pass(&["check", &w(bundle), "--config", &models(config)]);
        assert!(err.contains("config from"), "{bundle}: {err}");
    }
}

#[test]
fn config_json_of_another_model_fails() {
    // The SD1 config (2 heads) on the SD2 mid block (4 heads, linear projections) cannot load.
    let (code, _, err) = cli(&[
        "check",
        &w("mid/unet_mid_block_2d_cross_attn_sd2_ref.safetensors"),
        "--config",
        &models("diffusers_sd1/config.json"),
    ]);
    assert_ne!(code, 0, "{err}");
    // An unknown key is named.
    let dir = scratch("unknown-config-key");
    let text = std::fs::read_to_string(models("diffusers_unet2d/config.json")).unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    json["mid_block_flavour"] = serde_json::json!("spicy");
    let path = dir.join("config.json");
    std::fs::write(&path, json.to_string()).unwrap();
    let bundle = w("mid/unet_mid_block_2d_unet2d_ref.safetensors");
    let (code, _, err) = cli(&["check", &bundle, "--config", path.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("mid_block_flavour"), "{err}");
    assert_pass(&[
        "check",
        &bundle,
        "--config",
        path.to_str().unwrap(),
        "--allow-unknown-config",
    ]);
}

fn detect(file: &str) -> String {
    let (code, out, err) = cli(&["detect", &models(file)]);
    assert_eq!(code, 0, "{file}: {err}");
    out
}

#[test]
fn detect_names_the_variant_of_every_committed_checkpoint() {
    let cases: &[(&str, &[(&str, &str)])] = &[
        (
            "diffusers_unet2d/diffusion_pytorch_model.safetensors",
            &[("mid_block.", "diffusers.UNetMidBlock2D")],
        ),
        (
            "diffusers_unet2d_bin/diffusion_pytorch_model.bin",
            &[("mid_block.", "diffusers.UNetMidBlock2D")],
        ),
        (
            "diffusers_unet2d_scale_shift/diffusion_pytorch_model.safetensors",
            &[("mid_block.", "diffusers.UNetMidBlock2D")],
        ),
        (
            "diffusers_vae/diffusion_pytorch_model.safetensors",
            &[
                ("decoder.mid_block.", "diffusers.UNetMidBlock2D"),
                ("encoder.mid_block.", "diffusers.UNetMidBlock2D"),
            ],
        ),
        (
            "diffusers_unet1d/diffusion_pytorch_model.safetensors",
            &[("mid_block.", "diffusers.UNetMidBlock1D")],
        ),
        (
            "diffusers_unet1d_trajectory/diffusion_pytorch_model.safetensors",
            &[("mid_block.", "diffusers.MidResTemporalBlock1D")],
        ),
        (
            "diffusers_unet1d_value/diffusion_pytorch_model.safetensors",
            &[("mid_block.", "diffusers.ValueFunctionMidBlock1D")],
        ),
        (
            "diffusers_movq/diffusion_pytorch_model.safetensors",
            &[
                ("decoder.mid_block.", "diffusers.UNetMidBlock2D"),
                ("encoder.mid_block.", "diffusers.UNetMidBlock2D"),
            ],
        ),
        (
            "diffusers_sd1/diffusion_pytorch_model.safetensors",
            &[("mid_block.", "diffusers.UNetMidBlock2DCrossAttn")],
        ),
        (
            "diffusers_sd2/diffusion_pytorch_model.safetensors",
            &[("mid_block.", "diffusers.UNetMidBlock2DCrossAttn")],
        ),
        (
            "diffusers_sdxl/diffusion_pytorch_model.safetensors",
            &[("mid_block.", "diffusers.UNetMidBlock2DCrossAttn")],
        ),
        (
            "diffusers_if/diffusion_pytorch_model.safetensors",
            &[("mid_block.", "diffusers.UNetMidBlock2DSimpleCrossAttn")],
        ),
        (
            "diffusers_kandinsky/diffusion_pytorch_model.safetensors",
            &[("mid_block.", "diffusers.UNetMidBlock2DSimpleCrossAttn")],
        ),
        (
            "diffusers_controlnet/diffusion_pytorch_model.safetensors",
            &[("mid_block.", "diffusers.UNetMidBlock2DCrossAttn")],
        ),
        (
            "diffusers_controlnet_xs/diffusion_pytorch_model.safetensors",
            &[("mid_block.", "diffusers.ControlNetXSCrossAttnMidBlock2D")],
        ),
        (
            "diffusers_unet3d/diffusion_pytorch_model.safetensors",
            &[("mid_block.", "diffusers.UNetMidBlock3DCrossAttn")],
        ),
        (
            "diffusers_svd/diffusion_pytorch_model.safetensors",
            &[("mid_block.", "diffusers.UNetMidBlockSpatioTemporal")],
        ),
        (
            "diffusers_svd_vae/diffusion_pytorch_model.safetensors",
            &[
                ("decoder.mid_block.", "diffusers.MidBlockTemporalDecoder"),
                ("encoder.mid_block.", "diffusers.UNetMidBlock2D"),
            ],
        ),
        (
            "diffusers_unet_motion/diffusion_pytorch_model.safetensors",
            &[("mid_block.", "diffusers.UNetMidBlockCrossAttnMotion")],
        ),
        (
            "diffusers_i2vgen_xl/diffusion_pytorch_model.safetensors",
            &[("mid_block.", "diffusers.UNetMidBlock3DCrossAttn")],
        ),
        (
            "diffusers_vd/diffusion_pytorch_model.safetensors",
            &[("mid_block.", "diffusers.UNetMidBlock2DCrossAttn")],
        ),
        (
            "lucidrains_ddpm/model-1.pt",
            &[
                ("ema_model.model.", "denoising_diffusion_pytorch.MidBlock"),
                ("model.", "denoising_diffusion_pytorch.MidBlock"),
            ],
        ),
        (
            "sd_v1_tiny/sd_v1_tiny.ckpt",
            &[
                ("first_stage_model.decoder.mid.", "ldm.MidBlock"),
                ("first_stage_model.encoder.mid.", "ldm.MidBlock"),
                ("model.diffusion_model.middle_block.", "openai.MiddleBlock"),
            ],
        ),
        ("guided_tiny/guided_tiny.pt", &[("middle_block.", "openai.MiddleBlock")]),
        ("ldm_ddpm_tiny/ldm_ddpm_tiny.pt", &[("mid.", "ldm.MidBlock")]),
    ];
    for (file, expected) in cases {
        let out = detect(file);
        for (prefix, block) in *expected {
            assert!(out.contains(&format!("prefix `{prefix}`: {block}")), "{file}: {out}");
        }
    }
    // Variants and what the keys tell.
    assert!(detect("diffusers_sd2/diffusion_pytorch_model.safetensors").contains("\"use_linear_projection\":true"));
    assert!(detect("diffusers_sd1/diffusion_pytorch_model.safetensors").contains("\"use_linear_projection\":false"));
    assert!(detect("diffusers_sdxl/diffusion_pytorch_model.safetensors").contains("\"transformer_layers_per_block\":2"));
    assert!(detect("diffusers_unet2d_scale_shift/diffusion_pytorch_model.safetensors").contains("scale_shift"));
    let lucid = detect("lucidrains_ddpm/model-1.pt");
    assert!(
        lucid.contains("2.x") && lucid.contains("version 2.3.4") && lucid.contains("\"num_mem_kv\":4"),
        "{lucid}"
    );
    let guided = detect("guided_tiny/guided_tiny.pt");
    assert!(
        guided.contains("\"use_scale_shift_norm\":true") && guided.contains("use_new_attention_order"),
        "{guided}"
    );
    assert!(detect("ldm_ddpm_tiny/ldm_ddpm_tiny.pt").contains("attn_type vanilla"));
}

#[test]
fn detect_json_and_prefix_filter() {
    let (code, out, err) = cli(&[
        "detect",
        &models("sd_v1_tiny/sd_v1_tiny.ckpt"),
        "--prefix",
        "model.diffusion_model.",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    let found = doc["mid_blocks"].as_array().unwrap();
    assert_eq!(found.len(), 1, "{out}");
    assert_eq!(found[0]["block"], "openai.MiddleBlock");
}

/// A Hugging Face cache folder holding `models--acme--tiny-unet` at one commit, as
/// huggingface_hub lays it out (`refs/main` without a newline, snapshot files).
fn hub_cache(name: &str) -> std::path::PathBuf {
    let cache = scratch(name);
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let repo = cache.join("models--acme--tiny-unet");
    let snap = repo.join("snapshots").join(commit).join("unet");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), commit).unwrap();
    let src = weights().join("models/diffusers_unet2d");
    for f in ["config.json", "diffusion_pytorch_model.safetensors"] {
        std::fs::copy(src.join(f), snap.join(f)).unwrap();
    }
    cache
}

#[test]
fn repo_resolves_offline_from_a_hand_built_cache() {
    let cache = hub_cache("hub-offline");
    let cache = cache.to_str().unwrap();
    let bundle = w("mid/unet_mid_block_2d_unet2d_ref.safetensors");
    let base = [
        "check",
        bundle.as_str(),
        "--repo",
        "acme/tiny-unet",
        "--subfolder",
        "unet",
        "--cache-dir",
        cache,
    ];
    let err = assert_pass(&[&base[..], &["--offline"]].concat());
    assert!(
        err.contains("models--acme--tiny-unet") && err.contains("config from"),
        "{err}"
    );
    // The commit itself as the revision.
    assert_pass(
        &[
            &base[..],
            &["--offline", "--revision", "0123456789abcdef0123456789abcdef01234567"],
        ]
        .concat(),
    );
    // A revision that is not cached: offline, never the network.
    let (code, _, err) = cli(&[&base[..], &["--offline", "--revision", "v2"]].concat());
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("not in the cache") && err.contains("HF_HUB_OFFLINE"),
        "{err}"
    );
    // detect through the cache too.
    let (code, out, err) = cli(&[
        "detect",
        "--repo",
        "acme/tiny-unet",
        "--subfolder",
        "unet",
        "--cache-dir",
        cache,
        "--offline",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("prefix `mid_block.`: diffusers.UNetMidBlock2D"), "{out}");
}

#[test]
fn a_malformed_repo_id_is_a_usage_error() {
    let cache = hub_cache("hub-bad-id");
    let bundle = w("mid/unet_mid_block_2d_unet2d_ref.safetensors");
    for id in ["acme", "acme/../x", "a/b/c"] {
        let (code, _, err) = cli(&[
            "check",
            &bundle,
            "--repo",
            id,
            "--cache-dir",
            cache.to_str().unwrap(),
            "--offline",
        ]);
        assert_eq!(code, 2, "{id}: {err}");
        assert!(err.contains("org/name"), "{id}: {err}");
    }
}

#[test]
fn checking_the_weights_folder_skips_model_checkpoints_with_a_note() {
    let (code, out, err) = cli(&["check", &w("models")]);
    // weights/models holds only checkpoints: nothing to check.
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("skipped") || err.contains("no parity bundles"), "{err}");
}

fn copy_to(dir: &Path, src: &str, name: &str) -> String {
    let dst = dir.join(name);
    std::fs::copy(src, &dst).unwrap();
    dst.to_str().unwrap().to_string()
}

#[test]
fn broken_pickles_are_named_not_unpickled_blindly() {
    let dir = scratch("broken-pickles");
    let bundle = w("mid/unet_mid_block_2d_unet2d_ref.safetensors");
    let good = models("diffusers_unet2d_bin/diffusion_pytorch_model.bin");
    let bytes = std::fs::read(&good).unwrap();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("truncated.bin", bytes[..bytes.len() / 2].to_vec(), "zip"),
        ("empty.bin", vec![], "safetensors"),
        ("legacy.pt", vec![0x80, 0x02, 0x8a, 0x0a, 0x6c, 0xfc], "legacy"),
        ("garbage.ckpt", b"PK\x03\x04 this is not really a zip".to_vec(), "zip"),
    ];
    for (name, content, needle) in cases {
        let path = dir.join(name);
        std::fs::write(&path, content).unwrap();
        let (code, _, err) = cli(&[
            "check",
            &bundle,
            "--weights",
            path.to_str().unwrap(),
            "--prefix",
            "mid_block.",
        ]);
        assert_eq!(code, 2, "{name}: {err}");
        assert!(
            err.contains(name) && err.to_lowercase().contains(needle),
            "{name}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{name}: one error line: {err}");
        let (code, _, err) = cli(&["detect", path.to_str().unwrap()]);
        assert_eq!(code, 2, "{name}: {err}");
    }
    // A zip that is not a torch.save archive.
    let copy = copy_to(&dir, &models("diffusers_unet2d/config.json"), "config.json");
    let (code, _, err) = cli(&["detect", &copy]);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn inspect_lists_a_pickle_checkpoint() {
    let (code, out, err) = cli(&["inspect", &models("lucidrains_ddpm/model-1.pt")]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("sections: ema, model") && out.contains("version = \"2.3.4\""),
        "{out}"
    );
    assert!(
        out.contains("model.model.mid_attn.mem_kv") && out.contains("[2, 2, 4, 8]"),
        "{out}"
    );
}

#[test]
fn a_pickle_that_trips_candles_reader_is_a_clean_error() {
    // Found by fuzz/checkpoint: a LONG1 opcode of 9 bytes overflows a shift in Candle 0.11.1's
    // pickle reader (a panic where overflow checks are on, as in this test build).
    let file = common::root().join("tests/data/long1_overflow.pt");
    let (code, _, err) = cli(&["detect", file.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("malformed pickle") && err.contains("long1_overflow.pt"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// `detect` fills in what the keys cannot tell (heads, groups, eps) from the model's own
/// `config.json` where one sits beside the checkpoint (as `--repo` has one).
#[test]
fn detect_reads_the_config_beside_the_checkpoint() {
    let file = models("diffusers_sd1/diffusion_pytorch_model.safetensors");
    let (code, out, err) = cli(&["detect", &file]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("config: ") && out.contains("from config.json"), "{out}");
    assert!(
        out.contains("\"num_attention_heads\":2") && out.contains("\"resnet_groups\":4"),
        "{out}"
    );
    assert!(!out.contains("not in the keys"), "{out}");
    let (doc, out) = detect_json(&file);
    assert_eq!(doc["mid_blocks"][0]["from_config"]["num_attention_heads"], 2, "{out}");
    // A lone checkpoint (no config.json beside it) lists what the keys cannot tell.
    let dir = scratch("detect-lone");
    let lone = copy_to(
        &dir,
        &models("diffusers_sd1/diffusion_pytorch_model.safetensors"),
        "m.safetensors",
    );
    let (code, out, _) = cli(&["detect", &lone]);
    assert_eq!(code, 0);
    assert!(
        out.contains("not in the keys") && !out.contains("from config.json"),
        "{out}"
    );
}

/// Dance Diffusion's `UNet1DModel`: `detect` names `UNetMidBlock1D` with its channels, and
/// `check --weights --prefix` runs the self-contained bundles (f32, f16, bf16) on the whole
/// checkpoint's mid block; the standalone two-head bundle's weights under the one-head config
/// are an error naming a key, not a pass.
#[test]
fn unet_1d_mid_block_detects_and_checks_from_the_whole_checkpoint() {
    let ckpt = models("diffusers_unet1d/diffusion_pytorch_model.safetensors");
    let (code, out, err) = cli(&["detect", &ckpt]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("prefix `mid_block.`: diffusers.UNetMidBlock1D")
            && out.contains("\"in_channels\":32,\"mid_channels\":32,\"out_channels\":32"),
        "{out}"
    );
    for suffix in ["", "_f16", "_bf16"] {
        let b = w(&format!("mid/unet_mid_block_1d{suffix}.safetensors"));
        let err = assert_pass(&["check", &b, "--weights", &ckpt, "--prefix", "mid_block."]);
        assert!(err.contains("weights from"), "{suffix}: {err}");
    }
    let (code, out, err) = cli(&[
        "check",
        &w("mid/unet_mid_block_1d_two_heads_conv_skip.safetensors"),
        "--weights",
        &ckpt,
        "--prefix",
        "mid_block.",
    ]);
    assert_eq!(code, 2, "{out}\n{err}");
}

/// The Diffuser planning models' `UNet1DModel`s: the trajectory U-Net's `MidResTemporalBlock1D`
/// and the value function's `ValueFunctionMidBlock1D` pass their f32, f16 and bf16 bundles on the
/// whole checkpoints' mid blocks; each model's weights under the other's bundle are an error.
#[test]
fn diffuser_1d_mid_blocks_check_from_the_whole_checkpoints() {
    for (model, stem) in [
        ("diffusers_unet1d_trajectory", "mid_res_temporal_block_1d"),
        ("diffusers_unet1d_value", "value_function_mid_block_1d"),
    ] {
        let ckpt = models(&format!("{model}/diffusion_pytorch_model.safetensors"));
        for suffix in ["", "_f16", "_bf16"] {
            let b = w(&format!("mid/{stem}{suffix}.safetensors"));
            let err = assert_pass(&["check", &b, "--weights", &ckpt, "--prefix", "mid_block."]);
            assert!(err.contains("weights from"), "{stem}{suffix}: {err}");
        }
    }
    let (code, out, err) = cli(&[
        "check",
        &w("mid/value_function_mid_block_1d.safetensors"),
        "--weights",
        &models("diffusers_unet1d_trajectory/diffusion_pytorch_model.safetensors"),
        "--prefix",
        "mid_block.",
    ]);
    assert_eq!(code, 2, "{out}\n{err}");
}

/// Kandinsky's MoVQ (`VQModel(norm_type="spatial")`): `detect` names the decoder's spatially
/// normalised mid block and its zq channels, `check --weights --prefix` runs the self-contained
/// bundles (f32, f16, bf16, zq at another resolution) on the whole checkpoint's decoder, and the
/// same bundle read as a plain `UNetMidBlock2D` is not a pass.
#[test]
fn movq_decoder_mid_block_conditions_on_the_quantized_latent() {
    let ckpt = models("diffusers_movq/diffusion_pytorch_model.safetensors");
    let (doc, out) = detect_json(&ckpt);
    let dec = doc["mid_blocks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["prefix"] == "decoder.mid_block.")
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(dec["block"], "diffusers.UNetMidBlock2D", "{out}");
    assert!(
        dec["variant"]
            .as_str()
            .unwrap()
            .contains("VQModel norm_type=\"spatial\""),
        "{out}"
    );
    assert_eq!(dec["from_config"]["resnet_time_scale_shift"], "spatial", "{out}");
    assert_eq!(dec["from_config"]["temb_channels"], 4, "{out}");
    for suffix in ["", "_f16", "_bf16", "_zq_resized"] {
        let b = w(&format!("mid/unet_mid_block_2d_movq_decoder{suffix}.safetensors"));
        let err = assert_pass(&["check", &b, "--weights", &ckpt, "--prefix", "decoder.mid_block."]);
        assert!(err.contains("weights from"), "{suffix}: {err}");
    }
    // The spatial norms dropped (the group-norm form of the same block): not a pass.
    let dir = scratch("movq-as-group-norm");
    let edited = RawBundle::edited("mid/unet_mid_block_2d_movq_decoder.safetensors", &dir, |b| {
        let mut cfg: serde_json::Value = serde_json::from_str(&b.metadata["parity.config"]).unwrap();
        cfg["resnet_time_scale_shift"] = "default".into();
        cfg["temb_channels"] = serde_json::Value::Null;
        b.metadata.insert("parity.config".into(), cfg.to_string());
    });
    let (code, out, err) = cli(&["check", edited.to_str().unwrap()]);
    assert_ne!(code, 0, "{out}\n{err}");
}

/// The IF- and Kandinsky-like `UNet2DConditionModel`s (`mid_block_type
/// "UNetMidBlock2DSimpleCrossAttn"`): `detect` names the block and reads the added key/value
/// attention from the keys, `check --weights --prefix` runs the self-contained bundles on the
/// whole checkpoint's mid block, and the other model's weights or config do not fit.
#[test]
fn simple_cross_attn_models_detect_and_check_from_the_whole_checkpoint() {
    for (model, bundle, only_cross) in [
        ("diffusers_if", "unet_mid_block_2d_simple_cross_attn_if", false),
        (
            "diffusers_kandinsky",
            "unet_mid_block_2d_simple_cross_attn_kandinsky",
            true,
        ),
    ] {
        let ckpt = models(&format!("{model}/diffusion_pytorch_model.safetensors"));
        let lone_dir = scratch(&format!("detect-lone-{model}"));
        let lone = copy_to(&lone_dir, &ckpt, "m.safetensors");
        let (code, out, err) = cli(&["detect", &lone]);
        assert_eq!(code, 0, "{err}");
        assert!(
            out.contains("prefix `mid_block.`: diffusers.UNetMidBlock2DSimpleCrossAttn")
                && out.contains("UNetMidBlock2DSimpleCrossAttn (UNet2DConditionModel of IF / Kandinsky / UnCLIP")
                && out.contains(&format!("\"only_cross_attention\":{only_cross}"))
                && out.contains("\"in_channels\":16")
                && out.contains("not in the keys: attention_head_dim"),
            "{model}: {out}"
        );
        // Beside its config.json, detect gives the full kwargs.
        let (doc, out) = detect_json(&ckpt);
        let kwargs = &doc["mid_blocks"][0]["from_config"];
        assert_eq!(kwargs["attention_head_dim"], 4, "{out}");
        assert_eq!(kwargs["skip_time_act"], true, "{out}");
        assert_eq!(kwargs["only_cross_attention"], only_cross, "{out}");
        for suffix in ["", "_f16", "_bf16"] {
            let b = w(&format!("mid/{bundle}{suffix}.safetensors"));
            let err = assert_pass(&["check", &b, "--weights", &ckpt, "--prefix", "mid_block."]);
            assert!(err.contains("weights from"), "{bundle}{suffix}: {err}");
        }
    }
    // The IF weights under the Kandinsky bundle's config (layer_norm cross norm over 16
    // channels; IF's is a GroupNorm over 32): the key and its shapes are named.
    let (code, _, err) = cli(&[
        "check",
        &w("mid/unet_mid_block_2d_simple_cross_attn_kandinsky.safetensors"),
        "--weights",
        &models("diffusers_if/diffusion_pytorch_model.safetensors"),
        "--prefix",
        "mid_block.",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("attentions.0.norm_cross.weight") && err.contains("expected: [16]"),
        "{err}"
    );
    // The Kandinsky config on the IF bundle: a different block config, an error, not a pass.
    let (code, out, err) = cli(&[
        "check",
        &w("mid/unet_mid_block_2d_simple_cross_attn_if_ref.safetensors"),
        "--config",
        &models("diffusers_kandinsky/config.json"),
    ]);
    assert_ne!(code, 0, "{out}\n{err}");
}

/// The options the bundles exercise change the output: a port that ignores `skip_time_act`
/// fails, and a dropped `cross_attention_norm` leaves `norm_cross` unread (an error, not a
/// pass). (The two added-KV processors differ only in rounding: swapped, each half-precision
/// bundle still passes under the pass rule, so they are not told apart here.)
#[test]
fn simple_cross_attn_options_are_not_silently_ignored() {
    let dir = scratch("simple-cross-options");
    let edit = |rel: &str, sub: &str, key: &str, value: serde_json::Value| {
        let d = dir.join(sub);
        std::fs::create_dir_all(&d).unwrap();
        RawBundle::edited(rel, &d, |b| {
            let mut cfg: serde_json::Value = serde_json::from_str(&b.metadata["parity.config"]).unwrap();
            cfg[key] = value;
            b.metadata.insert("parity.config".into(), cfg.to_string());
        })
    };
    let skip = edit(
        "mid/unet_mid_block_2d_simple_cross_attn_if.safetensors",
        "skip",
        "skip_time_act",
        serde_json::json!(false),
    );
    let (code, out, _) = cli(&["check", skip.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    let no_norm = edit(
        "mid/unet_mid_block_2d_simple_cross_attn_kandinsky.safetensors",
        "no-norm",
        "cross_attention_norm",
        serde_json::Value::Null,
    );
    let (code, out, err) = cli(&["check", no_norm.to_str().unwrap()]);
    assert_ne!(code, 0, "{out}");
    assert!(format!("{out}{err}").contains("norm_cross"), "{out}\n{err}");
}

/// `UNetMidBlock2DSimpleCrossAttn.forward`'s mask rule: `attention_mask` when given (UnCLIP passes
/// its cross-attention mask that way), else `encoder_attention_mask`. The IF bundle's encoder mask
/// passed as `attention_mask` gives the same output; an all-zero `attention_mask` beside it wins,
/// so the output is the unmasked one, not PyTorch's.
#[test]
fn simple_cross_attn_attention_mask_wins_over_encoder_attention_mask() {
    let rel = "mid/unet_mid_block_2d_simple_cross_attn_if_encoder_mask_bias.safetensors";
    let key = |name: &str| format!("parity.input.{name}");
    let renamed_dir = scratch("simple-cross-mask-renamed");
    let renamed = RawBundle::edited(rel, &renamed_dir, |b| {
        let m = b.tensors.remove(&key("encoder_attention_mask")).unwrap();
        b.tensors.insert(key("attention_mask"), m);
        b.metadata.insert(
            "parity.inputs".into(),
            r#"["hidden_states", "temb", "encoder_hidden_states", "attention_mask"]"#.into(),
        );
    });
    assert_pass(&["check", renamed.to_str().unwrap()]);
    let both_dir = scratch("simple-cross-mask-both");
    let both = RawBundle::edited(rel, &both_dir, |b| {
        let zeros = b.tensors[&key("encoder_attention_mask")].zeros_like().unwrap();
        b.tensors.insert(key("attention_mask"), zeros);
        b.metadata.insert(
            "parity.inputs".into(),
            r#"["hidden_states", "temb", "encoder_hidden_states", "attention_mask", "encoder_attention_mask"]"#.into(),
        );
    });
    let (code, out, err) = cli(&["check", both.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}\n{err}");
}

/// The tiny `ControlNetModel` (`weights/models/diffusers_controlnet`): `detect` names the whole
/// bottleneck at the top level and its mid block at `mid_block.`, `check --weights` runs the
/// `diffusers.ControlNetMidBlock` bundles on the checkpoint (no `--prefix`, or `--prefix ""`),
/// and a config that is not this model's fails.
#[test]
fn controlnet_detects_and_checks_from_the_whole_checkpoint() {
    let ckpt = models("diffusers_controlnet/diffusion_pytorch_model.safetensors");
    let lone_dir = scratch("detect-lone-controlnet");
    let lone = copy_to(&lone_dir, &ckpt, "m.safetensors");
    let (code, out, err) = cli(&["detect", &lone]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("the top level (ControlNetModel: mid_block.* and controlnet_mid_block.*; no --prefix needed): diffusers.ControlNetMidBlock")
            && out.contains("ControlNetModel bottleneck: mid_block (UNetMidBlock2DCrossAttn")
            && out.contains("controlnet_mid_block (1x1 conv [16, 16, 1, 1])")
            && out.contains("\"mid_block_type\":\"UNetMidBlock2DCrossAttn\"")
            && out.contains("\"transformer_layers_per_block\":2")
            && out.contains("not in the keys: global_pool_conditions")
            && out.contains("prefix `mid_block.`: diffusers.UNetMidBlock2DCrossAttn"),
        "{out}"
    );
    // Beside its config.json, detect gives the full kwargs of both.
    let (doc, out) = detect_json(&ckpt);
    let (whole, mid) = (&doc["mid_blocks"][0], &doc["mid_blocks"][1]);
    assert_eq!(
        (whole["prefix"].as_str(), mid["prefix"].as_str()),
        (Some(""), Some("mid_block.")),
        "{out}"
    );
    assert_eq!(whole["from_config"]["global_pool_conditions"], false, "{out}");
    assert_eq!(whole["from_config"]["mid_block"]["num_attention_heads"], 2, "{out}");
    assert_eq!(whole["from_config"]["mid_block"]["output_scale_factor"], 1.25, "{out}");
    assert_eq!(mid["from_config"], whole["from_config"]["mid_block"], "{out}");
    for suffix in ["", "_f16", "_bf16"] {
        let b = w(&format!("mid/controlnet_mid_block{suffix}.safetensors"));
        let err = assert_pass(&["check", &b, "--weights", &ckpt, "--prefix", ""]);
        assert!(err.contains("weights from"), "{suffix}: {err}");
        assert_pass(&["check", &b, "--weights", &ckpt]);
    }
    // Wrong configs: one head at the mid instead of two, the mid block's scale factor left at 1,
    // the residual pooled, one transformer layer instead of two; each an error or a FAIL, never a
    // pass. (`use_linear_projection` is not among them: a 1x1 conv before the reshape and a linear
    // after it are the same function of the same weights, and the loader takes either layout.)
    let bundle = w("mid/controlnet_mid_block_ref.safetensors");
    assert_wrong_configs_fail(
        "controlnet-wrong-config",
        &bundle,
        &models("diffusers_controlnet/config.json"),
        [
            ("attention_head_dim", serde_json::json!([1, 1])),
            ("mid_block_scale_factor", serde_json::json!(1)),
            ("global_pool_conditions", serde_json::json!(true)),
            ("transformer_layers_per_block", serde_json::json!([1, 1])),
        ],
    );
    // Another model's config has no ControlNet bottleneck.
    let (code, _, err) = cli(&["check", &bundle, "--config", &models("diffusers_sd1/config.json")]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not diffusers.ControlNetMidBlock"), "{err}");
}

/// The zero convolution, `conditioning_scale` and the pooling are not silently ignored: the
/// bundles with a changed scale or pooling flag fail, and a checkpoint without
/// `controlnet_mid_block` is an error naming the key.
#[test]
fn controlnet_scale_pool_and_zero_conv_are_not_silently_ignored() {
    let dir = scratch("controlnet-options");
    let edit = |rel: &str, sub: &str, f: &dyn Fn(&mut RawBundle)| {
        let d = dir.join(sub);
        std::fs::create_dir_all(&d).unwrap();
        RawBundle::edited(rel, &d, |b| f(b))
    };
    let scale = edit("mid/controlnet_mid_block.safetensors", "scale", &|b| {
        b.metadata
            .insert("parity.kwargs".into(), r#"{"conditioning_scale": 1.0}"#.into());
    });
    let (code, out, _) = cli(&["check", scale.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    let bad_scale = edit("mid/controlnet_mid_block.safetensors", "bad-scale", &|b| {
        b.metadata
            .insert("parity.kwargs".into(), r#"{"conditioning_scale": "high"}"#.into());
    });
    let (code, _, err) = cli(&["check", bad_scale.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("conditioning_scale") && err.contains("expected a number"),
        "{err}"
    );
    let no_pool = edit("mid/controlnet_mid_block_global_pool.safetensors", "no-pool", &|b| {
        let mut cfg: serde_json::Value = serde_json::from_str(&b.metadata["parity.config"]).unwrap();
        cfg["global_pool_conditions"] = serde_json::json!(false);
        b.metadata.insert("parity.config".into(), cfg.to_string());
    });
    let (code, out, err) = cli(&["check", no_pool.to_str().unwrap()]);
    assert_ne!(code, 0, "{out}\n{err}");
    // The UNetMidBlock2D variant passes; without its zero conv weight it is an error naming it.
    assert_pass(&["check", &w("mid/controlnet_mid_block_unet_mid_block_2d.safetensors")]);
    let no_conv = edit(
        "mid/controlnet_mid_block_unet_mid_block_2d.safetensors",
        "no-conv",
        &|b| {
            b.tensors.retain(|k, _| !k.contains("controlnet_mid_block.weight"));
        },
    );
    let (code, _, err) = cli(&["check", no_conv.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("controlnet_mid_block.weight"), "{err}");
}

/// A motion module beside a mid block's resnets is AnimateDiff's mid block: `detect` names it
/// instead of taking it for a `UNetMidBlock2DCrossAttn`.
#[test]
fn motion_modules_are_not_taken_for_a_cross_attention_mid_block() {
    let dir = scratch("detect-motion-key");
    let sd1 = weights().join("models/diffusers_sd1/diffusion_pytorch_model.safetensors");
    let mut b = RawBundle::read(&sd1);
    let zeros = candle_core::Tensor::zeros(4, candle_core::DType::F32, &candle_core::Device::Cpu).unwrap();
    b.tensors
        .insert("mid_block.motion_modules.0.proj_in.weight".into(), zeros);
    let path = dir.join("sd1_motion.safetensors");
    b.write(&path);
    let (_, out, err) = cli(&["detect", path.to_str().unwrap()]);
    assert!(
        out.contains("diffusers.UNetMidBlockCrossAttnMotion") && !out.contains("diffusers.UNetMidBlock2DCrossAttn"),
        "{out}\n{err}"
    );
}

/// The tiny `UNet2DConditionModel(dual_cross_attention=True)` (`weights/models/diffusers_vd`,
/// Versatile Diffusion's image U-Net once converted): `detect` names the dual mid block from the
/// keys alone and gives the full kwargs beside `config.json`; the f32 / f16 / bf16 bundles, the
/// one with pipeline-set attributes and the `DualTransformer2DModel` alone pass on the whole
/// checkpoint; the config from `config.json` builds it.
#[test]
fn dual_cross_attention_model_detects_and_checks_from_the_whole_checkpoint() {
    let ckpt = models("diffusers_vd/diffusion_pytorch_model.safetensors");
    let lone_dir = scratch("detect-lone-vd");
    let lone = copy_to(&lone_dir, &ckpt, "m.safetensors");
    let (code, out, err) = cli(&["detect", &lone]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("prefix `mid_block.`: diffusers.UNetMidBlock2DCrossAttn")
            && out.contains("dual_cross_attention (Versatile Diffusion")
            && out.contains("\"dual_cross_attention\":true")
            && out.contains("\"cross_attention_dim\":8")
            && out.contains("mix_ratio")
            && !out.contains("not supported"),
        "{out}"
    );
    let (doc, out) = detect_json(&ckpt);
    let kwargs = &doc["mid_blocks"][0]["from_config"];
    assert_eq!(kwargs["dual_cross_attention"], true, "{out}");
    assert_eq!(kwargs["num_attention_heads"], 2, "{out}");
    for bundle in [
        "unet_mid_block_2d_cross_attn_dual",
        "unet_mid_block_2d_cross_attn_dual_f16",
        "unet_mid_block_2d_cross_attn_dual_bf16",
        "unet_mid_block_2d_cross_attn_dual_mix",
    ] {
        let b = w(&format!("mid/{bundle}.safetensors"));
        let err = assert_pass(&["check", &b, "--weights", &ckpt, "--prefix", "mid_block."]);
        assert!(err.contains("weights from"), "{bundle}: {err}");
    }
    assert_pass(&[
        "check",
        &w("mid/dual_transformer_2d_vd_mix_ref.safetensors"),
        "--weights",
        &ckpt,
        "--prefix",
        "mid_block.attentions.0.",
    ]);
    assert_pass(&[
        "check",
        &w("mid/unet_mid_block_2d_cross_attn_dual_ref.safetensors"),
        "--config",
        &models("diffusers_vd/config.json"),
    ]);
    // The SD 1.x-like weights are not a dual mid block: the missing key is named.
    let (code, _, err) = cli(&[
        "check",
        &w("mid/unet_mid_block_2d_cross_attn_dual_ref.safetensors"),
        "--weights",
        &models("diffusers_sd1/diffusion_pytorch_model.safetensors"),
        "--prefix",
        "mid_block.",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("transformers.0"), "{err}");
}

/// The pipeline attributes change the output: a port that ignores `mix_ratio` or
/// `transformer_index_for_condition` (the key dropped from the config: diffusers' default used)
/// fails; an `encoder_attention_mask` (which `DualTransformer2DModel.forward` does not take) and
/// the attributes without `dual_cross_attention` are errors.
#[test]
fn dual_cross_attention_attributes_are_not_silently_ignored() {
    let dir = scratch("dual-cross-attributes");
    let edit = |sub: &str, f: &dyn Fn(&mut serde_json::Value)| {
        let d = dir.join(sub);
        std::fs::create_dir_all(&d).unwrap();
        RawBundle::edited("mid/unet_mid_block_2d_cross_attn_dual_mix.safetensors", &d, |b| {
            let mut cfg: serde_json::Value = serde_json::from_str(&b.metadata["parity.config"]).unwrap();
            f(&mut cfg);
            b.metadata.insert("parity.config".into(), cfg.to_string());
        })
    };
    for key in ["mix_ratio", "transformer_index_for_condition"] {
        let dropped = edit(key, &|cfg| {
            cfg.as_object_mut().unwrap().remove(key);
        });
        let (code, out, err) = cli(&["check", dropped.to_str().unwrap()]);
        assert_eq!(code, 1, "{key}: {out}\n{err}");
        assert!(out.contains("FAIL"), "{key}: {out}");
    }
    let single = edit("single", &|cfg| cfg["dual_cross_attention"] = serde_json::json!(false));
    let (code, _, err) = cli(&["check", single.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("mix_ratio") && err.contains("dual_cross_attention"),
        "{err}"
    );
    let bad_index = edit("bad-index", &|cfg| {
        cfg["transformer_index_for_condition"] = serde_json::json!([0, 2])
    });
    let (code, _, err) = cli(&["check", bad_index.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("transformer_index_for_condition"), "{err}");
    let mask_dir = scratch("dual-cross-mask");
    let masked = RawBundle::edited(
        "mid/unet_mid_block_2d_cross_attn_dual_mix.safetensors",
        &mask_dir,
        |b| {
            let ones = candle_core::Tensor::ones((2, 12), candle_core::DType::F32, &candle_core::Device::Cpu).unwrap();
            b.tensors.insert("parity.input.encoder_attention_mask".into(), ones);
            b.metadata.insert(
                "parity.inputs".into(),
                r#"["hidden_states", "temb", "encoder_hidden_states", "encoder_attention_mask"]"#.into(),
            );
        },
    );
    let (code, _, err) = cli(&["check", masked.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("encoder_attention_mask"), "{err}");
}

/// The tiny `UNet3DConditionModel` (`weights/models/diffusers_unet3d`): `detect` names its
/// `UNetMidBlock3DCrossAttn` and reads what the keys tell, `check --weights --prefix` runs the
/// self-contained bundles (f32, f16, bf16; batch 2 of 3 frames) on the whole checkpoint's mid block,
/// and `num_frames` counts: a wrong one that divides the batch is a FAIL, one that does not (or
/// that is not a whole number ≥ 1) an error naming it, never a pass.
#[test]
fn video_unet_mid_block_detects_and_checks_from_the_whole_checkpoint() {
    let ckpt = models("diffusers_unet3d/diffusion_pytorch_model.safetensors");
    let lone_dir = scratch("detect-lone-unet3d");
    let lone = copy_to(&lone_dir, &ckpt, "m.safetensors");
    let (code, out, err) = cli(&["detect", &lone]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("prefix `mid_block.`: diffusers.UNetMidBlock3DCrossAttn")
            && out.contains("\"in_channels\":16")
            && out.contains("\"temb_channels\":32")
            && out.contains("\"cross_attention_dim\":8")
            && out.contains("\"use_linear_projection\":true")
            && out.contains("not in the keys: num_attention_heads")
            && !out.contains("not supported"),
        "{out}"
    );
    let (doc, out) = detect_json(&ckpt);
    let kwargs = &doc["mid_blocks"][0]["from_config"];
    assert_eq!(kwargs["num_attention_heads"], 4, "{out}");
    assert_eq!(kwargs["resnet_groups"], 4, "{out}");
    assert_eq!(kwargs["resnet_eps"], 1e-5, "{out}");
    let stem = "mid/unet_mid_block_3d_cross_attn_unet3d";
    for suffix in ["", "_f16", "_bf16"] {
        let b = w(&format!("{stem}{suffix}.safetensors"));
        let err = assert_pass(&["check", &b, "--weights", &ckpt, "--prefix", "mid_block."]);
        assert!(err.contains("weights from"), "{suffix}: {err}");
    }
    let dir = scratch("unet3d-num-frames");
    wrong_num_frames_never_pass(stem, &dir);
    // The forward takes attention_mask and, as diffusers' does, uses it nowhere (the exporter
    // asserts PyTorch's output is the maskless one bit for bit): still a pass.
    let masked = RawBundle::edited(&format!("{stem}.safetensors"), &dir, |b| {
        let hs = &b.tensors["parity.input.hidden_states"];
        let mask = candle_core::Tensor::full(-10000f32, (hs.dim(0).unwrap(), 1, 5), hs.device()).unwrap();
        b.tensors.insert("parity.input.attention_mask".into(), mask);
        b.metadata.insert(
            "parity.inputs".into(),
            r#"["hidden_states", "temb", "encoder_hidden_states", "attention_mask"]"#.into(),
        );
    });
    assert_pass(&["check", masked.to_str().unwrap()]);
}

/// The tiny `UNetMotionModel` (`weights/models/diffusers_unet_motion`, AnimateDiff): `detect`
/// names its `UNetMidBlockCrossAttnMotion` and reads what the keys tell (the sinusoidal table's
/// length included), `check --weights --prefix` runs the self-contained bundles (f32, f16, bf16;
/// batch 2 of 3 frames) on the whole checkpoint's mid block, and `num_frames` counts: a wrong
/// one that divides the batch is a FAIL, one that does not an error naming it, never a pass.
#[test]
fn motion_unet_mid_block_detects_and_checks_from_the_whole_checkpoint() {
    let ckpt = models("diffusers_unet_motion/diffusion_pytorch_model.safetensors");
    let lone_dir = scratch("detect-lone-motion");
    let out = detect_without_config(&lone_dir, &ckpt);
    assert!(
        out.contains("prefix `mid_block.`: diffusers.UNetMidBlockCrossAttnMotion")
            && out.contains("\"in_channels\":8")
            && out.contains("\"temb_channels\":32")
            && out.contains("\"cross_attention_dim\":8")
            && out.contains("\"temporal_max_seq_length\":6")
            && out.contains("not in the keys: num_attention_heads")
            && out.contains("not in the keys: temporal_num_attention_heads")
            && !out.contains("not supported"),
        "{out}"
    );
    let (doc, out) = detect_json(&ckpt);
    let kwargs = &doc["mid_blocks"][0]["from_config"];
    assert_eq!(kwargs["num_attention_heads"], 2, "{out}");
    assert_eq!(kwargs["temporal_num_attention_heads"], 2, "{out}");
    assert_eq!(kwargs["temporal_max_seq_length"], 6, "{out}");
    assert_eq!(kwargs["resnet_groups"], 4, "{out}");
    let stem = "mid/unet_mid_block_cross_attn_motion";
    for suffix in ["", "_f16", "_bf16"] {
        let b = w(&format!("{stem}{suffix}.safetensors"));
        let err = assert_pass(&["check", &b, "--weights", &ckpt, "--prefix", "mid_block."]);
        assert!(err.contains("weights from"), "{suffix}: {err}");
    }
    wrong_num_frames_never_pass(stem, &scratch("motion-num-frames"));
}

/// The motion modules' `pos_embed.pe` is a persistent buffer: the bundle's (random, as saved)
/// table is what PyTorch used, so a bundle without it runs on the constructor's sinusoid and
/// FAILs (it is used, not recomputed); a table of another length is an error naming the key and
/// both shapes.
#[test]
fn motion_pe_buffer_is_read_from_the_checkpoint() {
    let key = "motion_modules.0.transformer_blocks.0.pos_embed.pe";
    let stem = "mid/unet_mid_block_cross_attn_motion.safetensors";
    let dir = scratch("motion-pe-missing");
    let missing = RawBundle::edited(stem, &dir, |b| {
        assert!(b.tensors.remove(key).is_some());
    });
    let (code, out, err) = cli(&["check", missing.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(out.contains("FAIL") && !out.contains("PASS"), "{out}");
    let dir = scratch("motion-pe-short");
    let short = RawBundle::edited(stem, &dir, |b| {
        let pe = b.tensors[key].narrow(1, 0, 4).unwrap();
        b.tensors.insert(key.into(), pe);
    });
    let (code, out, err) = cli(&["check", short.to_str().unwrap()]);
    assert_eq!(code, 2, "{out}\n{err}");
    assert!(
        err.contains(key) && err.contains("[1, 4, 8]") && err.contains("(1, 6, 8)"),
        "{err}"
    );
}

/// A `MotionAdapter`'s file (the motion modules alone, here cut from the tiny `UNetMotionModel`:
/// the same 108 keys as `MotionAdapter(block_out_channels=(8,), motion_layers_per_block=1, ...)
/// .save_pretrained` writes in diffusers 0.42.1): `detect` says it is not a whole mid block and
/// what to do, and names no block.
#[test]
fn motion_adapter_files_are_named_with_what_to_do() {
    let ckpt = weights().join("models/diffusers_unet_motion/diffusion_pytorch_model.safetensors");
    let mut b = RawBundle::read(&ckpt);
    b.tensors.retain(|k, _| k.contains(".motion_modules."));
    assert!(b.tensors.keys().any(|k| k.starts_with("mid_block.motion_modules.0.")));
    let dir = scratch("detect-motion-adapter");
    let path = dir.join("diffusion_pytorch_model.safetensors");
    b.write(&path);
    let (code, out, err) = cli(&["detect", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("prefix `mid_block.`: (not implemented)")
            && out.contains("MotionAdapter")
            && out.contains("not a whole mid block")
            && out.contains("from_unet2d")
            && !out.contains("diffusers.UNetMidBlockCrossAttnMotion\n"),
        "{out}"
    );
}

/// The tiny `I2VGenXLUNet` (`weights/models/diffusers_i2vgen_xl`): `detect` tells it from a
/// `UNet3DConditionModel` by the keys around the mid block (its fixed eps then comes from the
/// keys), a bare mid block cannot be told and says so, and the bundle passes on the whole
/// checkpoint and fails with a wrong `num_frames`.
#[test]
fn i2vgen_xl_mid_block_detects_and_checks_from_the_whole_checkpoint() {
    let ckpt = models("diffusers_i2vgen_xl/diffusion_pytorch_model.safetensors");
    let lone_dir = scratch("detect-lone-i2vgen");
    let out = detect_without_config(&lone_dir, &ckpt);
    assert!(
        out.contains("prefix `mid_block.`: diffusers.UNetMidBlock3DCrossAttn")
            && out.contains("I2VGenXLUNet image-to-video")
            && out.contains("\"resnet_eps\":0.00001")
            && !out.contains("not in the keys: resnet_eps"),
        "{out}"
    );
    let (_, out, _) = cli(&[
        "detect",
        &models("diffusers_unet3d/diffusion_pytorch_model.safetensors"),
    ]);
    assert!(
        out.contains("UNet3DConditionModel video U-Net") && !out.contains("I2VGenXLUNet"),
        "{out}"
    );
    // The mid block's own keys alone: the same class and keys in both models.
    let mut bare = RawBundle::read(Path::new(&ckpt));
    bare.tensors.retain(|k, _| k.starts_with("mid_block."));
    let bare_path = lone_dir.join("mid_only.safetensors");
    bare.write(&bare_path);
    let (_, out, _) = cli(&["detect", bare_path.to_str().unwrap()]);
    assert!(
        out.contains("UNet3DConditionModel or I2VGenXLUNet") && out.contains("not in the keys: resnet_eps"),
        "{out}"
    );
    let stem = "mid/unet_mid_block_3d_cross_attn_i2vgen_xl";
    let err = assert_pass(&[
        "check",
        &w(&format!("{stem}.safetensors")),
        "--weights",
        &ckpt,
        "--prefix",
        "mid_block.",
    ]);
    assert!(err.contains("weights from"), "{err}");
    wrong_num_frames_never_pass(stem, &scratch("i2vgen-num-frames"));
}

/// The video bundle `weights/<stem>.safetensors` of 2 videos x 3 frames with another
/// `num_frames`: 1 (the forward's default), 2 and 6 divide the batch of 6 but mix the wrong
/// frames, or none (a FAIL, exit 1); 4 does not divide it, 0 and 2.5 are not counts (an error
/// naming it, exit 2).
fn wrong_num_frames_never_pass(stem: &str, dir: &Path) {
    let with_frames = |name: &str, frames: serde_json::Value| {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).unwrap();
        RawBundle::edited(&format!("{stem}.safetensors"), &d, |b| {
            let kwargs = match frames {
                serde_json::Value::Null => "{}".to_string(),
                f => serde_json::json!({ "num_frames": f }).to_string(),
            };
            b.metadata.insert("parity.kwargs".into(), kwargs);
        })
    };
    for (name, frames) in [
        ("default", serde_json::Value::Null),
        ("two", serde_json::json!(2)),
        ("six", serde_json::json!(6)),
    ] {
        let path = with_frames(name, frames);
        let (code, out, err) = cli(&["check", path.to_str().unwrap()]);
        assert_eq!(code, 1, "{stem} {name}: {out}\n{err}");
        assert!(out.contains("FAIL") && !out.contains("PASS"), "{stem} {name}: {out}");
    }
    for (name, frames, needle) in [
        ("four", serde_json::json!(4), "does not divide"),
        ("zero", serde_json::json!(0), "num_frames"),
        ("fraction", serde_json::json!(2.5), "num_frames"),
    ] {
        let path = with_frames(name, frames);
        let (code, out, err) = cli(&["check", path.to_str().unwrap()]);
        assert_eq!(code, 2, "{stem} {name}: {out}\n{err}");
        assert!(err.contains(needle) && !out.contains("PASS"), "{stem} {name}: {err}");
    }
}

/// `detect`'s answer on a copy of `ckpt` in `dir` (without the `config.json` beside the
/// original): what the keys alone tell.
/// `detect --json` on `ckpt`: the parsed document and the text.
fn detect_json(ckpt: &str) -> (serde_json::Value, String) {
    let (code, out, err) = cli(&["detect", ckpt, "--json"]);
    assert_eq!(code, 0, "{err}");
    (serde_json::from_str(&out).unwrap(), out)
}

fn detect_without_config(dir: &Path, ckpt: &str) -> String {
    let lone = copy_to(dir, ckpt, "m.safetensors");
    let (code, out, err) = cli(&["detect", &lone]);
    assert_eq!(code, 0, "{err}");
    out
}

/// The bundle `<stem>` and its f16 / bf16 twins pass on the block at `prefix` of `ckpt`.
fn assert_twins_pass_on(stem: &str, ckpt: &str, prefix: &str) {
    for suffix in ["", "_f16", "_bf16"] {
        let b = w(&format!("{stem}{suffix}.safetensors"));
        let err = assert_pass(&["check", &b, "--weights", ckpt, "--prefix", prefix]);
        assert!(err.contains("weights from"), "{suffix}: {err}");
    }
}

/// `image_only_indicator` as a bundle input: `(batch, num_frames)` values, or its absence.
fn with_indicator(b: &mut RawBundle, values: Option<(&[f32], (usize, usize))>) {
    let key = "parity.input.image_only_indicator";
    let mut names: Vec<String> = serde_json::from_str(&b.metadata["parity.inputs"]).unwrap();
    match values {
        Some((v, shape)) => {
            let t = candle_core::Tensor::from_slice(v, shape, &candle_core::Device::Cpu).unwrap();
            b.tensors.insert(key.into(), t);
        }
        None => {
            b.tensors.remove(key);
            names.retain(|n| n != "image_only_indicator");
        }
    }
    b.metadata
        .insert("parity.inputs".into(), serde_json::to_string(&names).unwrap());
}

/// Stable Video Diffusion's tiny U-Net (`weights/models/diffusers_svd`, saved in float16 as SVD's
/// fp16 variants are): `detect` names its `UNetMidBlockSpatioTemporal` and reads what the keys
/// tell, the f16 bundle (which references the checkpoint) and the bf16 one (own weights) pass on
/// the whole checkpoint's mid block, and `image_only_indicator` counts: its values (frame 1 is an
/// image in the bundle: the learned_with_images mixers take it from the spatial path) and its
/// shape (the frame count) change the output, so a wrong one FAILs, a missing or ill-shaped one
/// is an error naming it.
#[test]
fn svd_unet_mid_block_detects_and_checks_from_the_whole_checkpoint() {
    let ckpt = models("diffusers_svd/diffusion_pytorch_model.safetensors");
    let out = detect_without_config(&scratch("detect-lone-svd"), &ckpt);
    assert!(
        out.contains("prefix `mid_block.`: diffusers.UNetMidBlockSpatioTemporal")
            && out.contains("\"in_channels\":32")
            && out.contains("\"temb_channels\":128")
            && out.contains("\"cross_attention_dim\":8")
            && out.contains("\"transformer_layers_per_block\":1")
            && out.contains("not in the keys: num_attention_heads")
            && !out.contains("not supported"),
        "{out}"
    );
    let (doc, out) = detect_json(&ckpt);
    assert_eq!(doc["mid_blocks"][0]["from_config"]["num_attention_heads"], 2, "{out}");
    let stem = "mid/unet_mid_block_spatio_temporal_svd_mixed_ref";
    assert_twins_pass_on(stem, &ckpt, "mid_block.");
    let dir = scratch("svd-indicator");
    let edited = |name: &str, values: Option<(&[f32], (usize, usize))>| {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).unwrap();
        let path = RawBundle::edited(&format!("{stem}.safetensors"), &d, |b| with_indicator(b, values));
        let path = path.to_str().unwrap().to_string();
        cli(&["check", &path, "--weights", &ckpt, "--prefix", "mid_block."])
    };
    // the bundle's [[0, 1]] is the pass; no image ([[0, 0]], what the U-Net passes), both images,
    // and 2 videos of 1 frame (the same two values) are FAILs
    for (name, values) in [
        ("video", (&[0f32, 0.][..], (1, 2))),
        ("images", (&[1f32, 1.][..], (1, 2))),
        ("one_frame", (&[0f32, 1.][..], (2, 1))),
    ] {
        let (code, out, err) = edited(name, Some(values));
        assert_eq!(code, 1, "{name}: {out}\n{err}");
        assert!(out.contains("FAIL") && !out.contains("PASS"), "{name}: {out}");
    }
    // 3 frames do not divide the batch of 2; and diffusers reads the frame count from it
    for (name, values) in [("three", Some((&[0f32, 0., 0.][..], (1, 3)))), ("none", None)] {
        let (code, out, err) = edited(name, values);
        assert_eq!(code, 2, "{name}: {out}\n{err}");
        assert!(
            err.contains("image_only_indicator") && !out.contains("PASS"),
            "{name}: {err}"
        );
    }
}

/// Stable Video Diffusion's tiny VAE (`weights/models/diffusers_svd_vae`, float16): `detect` names
/// the decoder's `MidBlockTemporalDecoder` and the encoder's plain `UNetMidBlock2D`; the decoder's
/// bundles pass on the whole checkpoint; its `learned` mixers do not read `image_only_indicator`'s
/// values (ones still pass), but its shape is the frame count (2 videos of 1 frame FAIL).
#[test]
fn svd_vae_mid_blocks_detect_and_check_from_the_whole_checkpoint() {
    let ckpt = models("diffusers_svd_vae/diffusion_pytorch_model.safetensors");
    let out = detect_without_config(&scratch("detect-lone-svd-vae"), &ckpt);
    assert!(
        out.contains("prefix `decoder.mid_block.`: diffusers.MidBlockTemporalDecoder")
            && out.contains("\"num_layers\":2")
            && out.contains("\"out_channels\":32")
            && out.contains("not in the keys: attention_head_dim")
            && out.contains("prefix `encoder.mid_block.`: diffusers.UNetMidBlock2D")
            && !out.contains("not supported"),
        "{out}"
    );
    let stem = "mid/mid_block_temporal_decoder_svd_ref";
    assert_twins_pass_on(stem, &ckpt, "decoder.mid_block.");
    assert_pass(&[
        "check",
        &w("mid/mid_block_temporal_decoder_svd_3_frames_ref.safetensors"),
    ]);
    let dir = scratch("svd-vae-indicator");
    for (name, values, code_want) in [
        ("ones", (&[1f32, 1.][..], (1, 2)), 0),
        ("one_frame", (&[0f32, 0.][..], (2, 1)), 1),
    ] {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).unwrap();
        let path = RawBundle::edited(&format!("{stem}.safetensors"), &d, |b| with_indicator(b, Some(values)));
        let (code, out, err) = cli(&[
            "check",
            path.to_str().unwrap(),
            "--weights",
            &ckpt,
            "--prefix",
            "decoder.mid_block.",
        ]);
        assert_eq!(code, code_want, "{name}: {out}\n{err}");
        assert_eq!(out.contains("PASS"), code_want == 0, "{name}: {out}");
    }
}

/// A half-precision bundle run on a wider checkpoint (`--weights` of a float32 model) rounds
/// every parameter to the bundle's dtype first, GroupNorm's included, as PyTorch's
/// `module.to(dtype)` does: the output is the one the bundle's own (rounded) weights give. (The
/// GroupNorm parameters were once held at the checkpoint's float32 values: 9.4e-2 off in bf16.)
#[test]
fn half_bundles_on_a_wider_checkpoint_round_every_parameter() {
    let max_abs = |args: &[&str]| {
        let (code, out, err) = cli(args);
        assert_eq!(code, 0, "{err}");
        let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
        doc["bundles"][0]["outputs"][0]["max_abs"].as_f64().unwrap()
    };
    for stem in [
        "mid/unet_mid_block_3d_cross_attn_unet3d_bf16",
        "mid/unet_mid_block_3d_cross_attn_unet3d_f16",
    ] {
        let b = w(&format!("{stem}.safetensors"));
        let own = max_abs(&["check", &b, "--json"]);
        let ckpt = models("diffusers_unet3d/diffusion_pytorch_model.safetensors");
        let wider = max_abs(&["check", &b, "--weights", &ckpt, "--prefix", "mid_block.", "--json"]);
        assert_eq!(own, wider, "{stem}");
    }
}
/// The tiny `UNetControlNetXSModel` (`weights/models/diffusers_controlnet_xs`): `detect` names its
/// `ControlNetXSCrossAttnMidBlock2D` at `mid_block.`, the bundles pass on the whole checkpoint
/// (`--weights --prefix`, and `--config` from its `config.json`), and wrong configs fail.
#[test]
fn controlnet_xs_mid_block_detects_and_checks_from_the_whole_checkpoint() {
    let ckpt = models("diffusers_controlnet_xs/diffusion_pytorch_model.safetensors");
    let out = detect_without_config(&scratch("detect-lone-controlnet-xs"), &ckpt);
    assert!(
        out.contains("prefix `mid_block.`: diffusers.ControlNetXSCrossAttnMidBlock2D")
            && out.contains("\"base_channels\":8")
            && out.contains("\"ctrl_channels\":4")
            && out.contains("\"transformer_layers_per_block\":2")
            && out.contains("not in the keys: base_num_attention_heads"),
        "{out}"
    );
    let (doc, out) = detect_json(&ckpt);
    let found = &doc["mid_blocks"][0];
    assert_eq!(found["from_config"]["ctrl_max_norm_num_groups"], 3, "{out}");
    assert_eq!(found["from_config"]["ctrl_num_attention_heads"], 2, "{out}");
    assert_twins_pass_on("mid/controlnet_xs_mid_block", &ckpt, "mid_block.");
    let config = models("diffusers_controlnet_xs/config.json");
    for b in [
        "mid/controlnet_xs_mid_block_ref",
        "mid/controlnet_xs_mid_block_no_control_ref",
    ] {
        assert_pass(&["check", &w(&format!("{b}.safetensors")), "--config", &config]);
    }
    // Wrong configs: 4 groups in ctrl_midblock instead of find_largest_factor(gcd(4, 12), 3) = 2,
    // one base head instead of two, one ctrl head instead of two, no upcast (the same here: the
    // softmax runs in f32 either way; not in the list), one transformer layer; each fails.
    assert_wrong_configs_fail(
        "controlnet-xs-wrong-config",
        &w("mid/controlnet_xs_mid_block_ref.safetensors"),
        &config,
        [
            ("ctrl_max_norm_num_groups", serde_json::json!(4)),
            ("num_attention_heads", serde_json::json!([1, 1])),
            ("ctrl_num_attention_heads", serde_json::json!([1, 1])),
            ("transformer_layers_per_block", serde_json::json!([1, 1])),
        ],
    );
}

/// `check bundle --config <config with key = value>` for each edit: an error or a FAIL, never a
/// pass.
fn assert_wrong_configs_fail<const N: usize>(
    scratch_name: &str,
    bundle: &str,
    config: &str,
    edits: [(&str, serde_json::Value); N],
) {
    let dir = scratch(scratch_name);
    let text = std::fs::read_to_string(config).unwrap();
    for (i, (key, value)) in edits.into_iter().enumerate() {
        let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
        json[key] = value;
        let path = dir.join(format!("config{i}.json"));
        std::fs::write(&path, json.to_string()).unwrap();
        let (code, out, err) = cli(&["check", bundle, "--config", path.to_str().unwrap()]);
        assert_ne!(code, 0, "{key}: {out}\n{err}");
        assert!(!out.contains("PASS"), "{key}: {out}");
    }
}

/// `conditioning_scale` and `apply_control` are not silently ignored: the bundle with either
/// changed fails, a non-boolean `apply_control` is an error naming it, and a control stream of
/// the wrong width is an error naming the input and both shapes.
#[test]
fn controlnet_xs_scale_and_apply_control_are_not_silently_ignored() {
    let dir = scratch("controlnet-xs-options");
    let edit = |sub: &str, f: &dyn Fn(&mut RawBundle)| {
        let d = dir.join(sub);
        std::fs::create_dir_all(&d).unwrap();
        RawBundle::edited("mid/controlnet_xs_mid_block.safetensors", &d, |b| f(b))
    };
    let kwargs = |text: &'static str| {
        move |b: &mut RawBundle| {
            b.metadata.insert("parity.kwargs".into(), text.into());
        }
    };
    for (sub, text) in [
        ("scale", r#"{"conditioning_scale": 1.0, "apply_control": true}"#),
        ("no-scale", r#"{"apply_control": true}"#),
        ("no-control", r#"{"conditioning_scale": 0.6, "apply_control": false}"#),
    ] {
        let path = edit(sub, &kwargs(text));
        let (code, out, err) = cli(&["check", path.to_str().unwrap()]);
        assert_eq!(code, 1, "{sub}: {out}\n{err}");
        assert!(out.contains("FAIL"), "{sub}: {out}");
    }
    let path = edit(
        "bad-flag",
        &kwargs(r#"{"conditioning_scale": 0.6, "apply_control": "yes"}"#),
    );
    let (code, _, err) = cli(&["check", path.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("apply_control") && err.contains("expected a boolean"),
        "{err}"
    );
    let path = edit("wide-ctrl", &|b| {
        let base = b.tensors["parity.input.hidden_states_base"].clone();
        b.tensors.insert("parity.input.hidden_states_ctrl".into(), base);
    });
    let (code, _, err) = cli(&["check", path.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("hidden_states_ctrl") && err.contains("[2, 4, 2, 3]") && err.contains("[2, 8, 2, 3]"),
        "{err}"
    );
}

/// A `ControlNetXSAdapter`'s mid block (`mid_block.base_to_ctrl`, `mid_block.midblock`,
/// `mid_block.ctrl_to_base`; here cut from the tiny `UNetControlNetXSModel`, whose
/// `ctrl_midblock` is the adapter's `midblock`, as `from_unet` copies it): `detect` names no
/// block and says what to do.
#[test]
fn controlnet_xs_adapter_files_are_named_with_what_to_do() {
    let ckpt = weights().join("models/diffusers_controlnet_xs/diffusion_pytorch_model.safetensors");
    let mut b = RawBundle::read(&ckpt);
    b.tensors
        .retain(|k, _| k.starts_with("mid_block.") && !k.starts_with("mid_block.base_midblock."));
    b.tensors = std::mem::take(&mut b.tensors)
        .into_iter()
        .map(|(k, v)| (k.replace("mid_block.ctrl_midblock.", "mid_block.midblock."), v))
        .collect();
    let dir = scratch("detect-controlnet-xs-adapter");
    let path = dir.join("diffusion_pytorch_model.safetensors");
    b.write(&path);
    let (code, out, err) = cli(&["detect", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("prefix `mid_block.`: (not implemented)")
            && out.contains("ControlNetXSAdapter")
            && out.contains("UNetControlNetXSModel.from_unet(unet, controlnet)")
            && !out.contains("diffusers.ControlNetXSCrossAttnMidBlock2D\n"),
        "{out}"
    );
}

/// `detect` on a diffusers model folder reads its weights and its `config.json`, as on the file.
#[test]
fn detect_takes_a_model_folder() {
    let folder = detect("diffusers_sd1");
    let file = detect("diffusers_sd1/diffusion_pytorch_model.safetensors");
    assert_eq!(folder, file);
    assert!(folder.contains("from config.json"), "{folder}");
    let (code, _, err) = cli(&["detect", &models("")]);
    assert_eq!(code, 2);
    assert!(err.contains("diffusion_pytorch_model.safetensors"), "{err}");
}
