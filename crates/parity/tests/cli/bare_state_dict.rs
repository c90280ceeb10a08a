//! A bare mid-block state dict, as `torch.save(unet.mid_block.state_dict())` gives it (the block's
//! own keys at the top level): `detect` finds the block at the top level, and `check --weights`
//! takes it without `--prefix` and passes the block's bundle; and the OpenAI middle block's list
//! context. (Issue 18.)

use crate::common::*;
use candle_core::Tensor;
use std::collections::HashMap;
use unet_parity::checkpoint::Checkpoint;

/// (bundle in weights/mid, its block id, the checkpoint it references, the block's full prefix
/// there)
const CASES: [(&str, &str, &str, &str); 5] = [
    (
        "unet_mid_block_2d_unet2d_ref",
        "diffusers.UNetMidBlock2D",
        "models/diffusers_unet2d/diffusion_pytorch_model.safetensors",
        "mid_block.",
    ),
    (
        "unet_mid_block_2d_vae_decoder_ref",
        "diffusers.UNetMidBlock2D",
        "models/diffusers_vae/diffusion_pytorch_model.safetensors",
        "decoder.mid_block.",
    ),
    (
        "openai_middle_block_guided_legacy_scale_shift_ref",
        "openai.MiddleBlock",
        "models/guided_tiny/guided_tiny.pt",
        "middle_block.",
    ),
    (
        "ldm_mid_block_ddpm_vanilla_ref",
        "ldm.MidBlock",
        "models/ldm_ddpm_tiny/ldm_ddpm_tiny.pt",
        "mid.",
    ),
    (
        "lucidrains_mid_block_model_ref",
        "denoising_diffusion_pytorch.MidBlock",
        "models/lucidrains_ddpm/model-1.pt",
        "model.model.",
    ),
];

/// The block's tensors of `model` under `prefix`, with the prefix cut off, as one safetensors file.
fn bare(model: &str, prefix: &str, out: &std::path::Path) {
    let ck = Checkpoint::open(&weights().join(model)).unwrap();
    let prefix = ck.resolve_prefix(prefix).unwrap();
    let tensors: HashMap<String, Tensor> = ck
        .names()
        .filter_map(|n| n.strip_prefix(&prefix).map(|k| (k.to_string(), n.to_string())))
        .map(|(k, n)| (k, ck.load(&n).unwrap().unwrap()))
        .collect();
    assert!(!tensors.is_empty(), "{model}: nothing under {prefix}");
    candle_core::safetensors::save(&tensors, out).unwrap();
}

#[test]
fn a_bare_mid_block_state_dict_is_detected_and_checked() {
    let dir = scratch("bare-mid");
    for (bundle, block, model, prefix) in CASES {
        let file = dir.join(format!("{bundle}_bare.safetensors"));
        bare(model, prefix, &file);
        let f = file.to_str().unwrap();
        let (code, out, err) = cli(&["detect", f]);
        assert_eq!(code, 0, "{bundle}: {out}{err}");
        assert!(
            out.contains(&format!(
                "the top level (a bare mid-block state dict; no --prefix needed): {block}"
            )),
            "{bundle}: {out}"
        );
        let b = weights().join("mid").join(format!("{bundle}.safetensors"));
        let (code, out, err) = cli(&["check", b.to_str().unwrap(), "--weights", f]);
        assert_eq!(code, 0, "{bundle}: {out}{err}");
        assert!(out.contains("PASS") && out.contains("1 passed"), "{bundle}: {out}");
    }
}

/// A diffusers down block's state dict (ResNets that change the channel count, a downsampler) is
/// not taken for a mid block.
#[test]
fn a_bare_down_block_is_not_a_mid_block() {
    let dir = scratch("bare-down");
    let file = dir.join("down_block.safetensors");
    bare(
        "models/diffusers_unet2d/diffusion_pytorch_model.safetensors",
        "down_blocks.1.",
        &file,
    );
    let (code, out, err) = cli(&["detect", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("no mid block found"), "{out}");
}

/// `openai.MiddleBlock` takes SD 2.x's list context (`context.0`, ...: one per transformer block)
/// as `ldm.SpatialTransformer` does: the committed SD 1.x middle block (depth 1) with its context
/// given as a one-element list still passes against PyTorch; a middle block whose attention is an
/// `AttentionBlock` refuses one. (Issue 18.)
#[test]
fn the_openai_middle_block_takes_one_context_per_depth() {
    let dir = scratch("middle-context-list");
    let as_list = |b: &mut RawBundle| {
        let c = b.tensors.remove("parity.input.context").expect("a context input");
        b.tensors.insert("parity.input.context.0".into(), c);
        b.metadata
            .insert("parity.inputs".into(), r#"["x", "emb", "context.0"]"#.into());
    };
    let p = RawBundle::edited(
        "mid/openai_middle_block_sd1_spatial_transformer_ref.safetensors",
        &dir,
        as_list,
    );
    let model = weights().join("models/sd_v1_tiny/sd_v1_tiny.ckpt");
    let prefix = "model.diffusion_model.middle_block.";
    let (code, out, err) = cli(&[
        "check",
        p.to_str().unwrap(),
        "--weights",
        model.to_str().unwrap(),
        "--prefix",
        prefix,
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("PASS"), "{out}");

    let p = RawBundle::edited(
        "mid/openai_middle_block_guided_legacy_scale_shift_ref.safetensors",
        &dir,
        |b| {
            let x = &b.tensors["parity.input.x"];
            let context = Tensor::zeros((x.dim(0).unwrap(), 3, 8), x.dtype(), x.device()).unwrap();
            b.tensors.insert("parity.input.context.0".into(), context);
            b.metadata
                .insert("parity.inputs".into(), r#"["x", "emb", "context.0"]"#.into());
        },
    );
    let model = weights().join("models/guided_tiny/guided_tiny.pt");
    let (code, out, err) = cli(&[
        "check",
        p.to_str().unwrap(),
        "--weights",
        model.to_str().unwrap(),
        "--prefix",
        "middle_block.",
    ]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("context.0") && err.contains("AttentionBlock"), "{err}");
}
