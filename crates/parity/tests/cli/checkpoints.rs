//! Mid blocks from whole checkpoints: `--weights`/`--prefix`, bundles that reference a
//! checkpoint, `--config config.json`, `detect`, and `--repo` through a Hugging Face cache folder
//! built here (no network). Every committed model is a row of one table ([`MODELS`]: what
//! `detect` finds in it, which bundles pass on it, with its config, on its weights); the tests
//! after the table are each about one option or one model's own behaviour.

use crate::common::{cli, scratch, weights, RawBundle};
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

/// One tiny whole model of `weights/models/`: what `detect` finds in it and which bundles run on
/// it. The tests below loop over [`MODELS`]; a failure names the model's folder.
struct Model {
    /// Its folder in `weights/models/`.
    folder: &'static str,
    /// The checkpoint file in the folder.
    file: &'static str,
    /// `detect` on the checkpoint (with the `config.json` beside it, where the folder has one)
    /// names each of these (key prefix, block id) ...
    blocks: &'static [(&'static str, &'static str)],
    /// ... and its answer holds each of `says` and none of `never`.
    says: &'static [&'static str],
    never: &'static [&'static str],
    /// `detect` on a copy of the checkpoint alone (no `config.json` beside it: what the keys
    /// tell): its answer holds each of `lone_says` and none of `lone_never`.
    lone_says: &'static [&'static str],
    lone_never: &'static [&'static str],
    /// `detect --json` on the checkpoint: (the block's prefix, a JSON pointer into that block's
    /// entry, the value there as JSON text).
    detected: &'static [(&'static str, &'static str, &'static str)],
    /// Bundles `weights/mid/<stem><suffix>.safetensors` that pass on the checkpoint's block at
    /// the prefix (`check --weights --prefix`): (stem, suffixes, prefix).
    on_weights: &'static [(&'static str, &'static [&'static str], &'static str)],
    /// Bundles of `weights/mid/` (stems) that pass with `--config <folder>/config.json`.
    with_config: &'static [&'static str],
    /// Bundles of `weights/mid/` (stems) whose block is not the checkpoint's at the prefix: exit 2,
    /// the error holding each needle. (stem, prefix, needles)
    refused: &'static [(&'static str, &'static str, &'static [&'static str])],
    /// A video bundle of 2 videos x 3 frames (its stem in `weights/`) that runs the model's block:
    /// a wrong `num_frames` never passes ([`wrong_num_frames_never_pass`]).
    num_frames: Option<&'static str>,
}

/// A row with nothing in it, for `..ROW`.
const ROW: Model = Model {
    folder: "",
    file: ST,
    blocks: &[],
    says: &[],
    never: &[],
    lone_says: &[],
    lone_never: &[],
    detected: &[],
    on_weights: &[],
    with_config: &[],
    refused: &[],
    num_frames: None,
};
/// A diffusers model's weights file.
const ST: &str = "diffusion_pytorch_model.safetensors";
/// A bundle and its f16 and bf16 twins.
const TWINS: &[&str] = &["", "_f16", "_bf16"];
/// A bundle alone.
const ONE: &[&str] = &[""];

const MODELS: &[Model] = &[
    // The DDPM trained on scikit-learn's digits (scripts/digits_ddpm.py): trained weights.
    Model {
        folder: "digits_ddpm",
        blocks: &[("mid_block.", "diffusers.UNetMidBlock2D")],
        ..ROW
    },
    Model {
        folder: "diffusers_unet2d",
        blocks: &[("mid_block.", "diffusers.UNetMidBlock2D")],
        with_config: &["unet_mid_block_2d_unet2d_ref"],
        // Another block's weights: the key, expected and found shapes are named.
        refused: &[(
            "unet_mid_block_2d_unet2d_ref",
            "down_blocks.1.",
            &["resnets.0.norm1.weight", "expected: [16]"],
        )],
        ..ROW
    },
    Model {
        folder: "diffusers_unet2d_bin",
        file: "diffusion_pytorch_model.bin",
        blocks: &[("mid_block.", "diffusers.UNetMidBlock2D")],
        ..ROW
    },
    Model {
        folder: "diffusers_unet2d_scale_shift",
        blocks: &[("mid_block.", "diffusers.UNetMidBlock2D")],
        says: &["scale_shift"],
        with_config: &["unet_mid_block_2d_unet2d_scale_shift_ref"],
        ..ROW
    },
    Model {
        folder: "diffusers_vae",
        blocks: &[
            ("decoder.mid_block.", "diffusers.UNetMidBlock2D"),
            ("encoder.mid_block.", "diffusers.UNetMidBlock2D"),
        ],
        with_config: &["unet_mid_block_2d_vae_decoder_ref"],
        ..ROW
    },
    // Dance Diffusion's `UNet1DModel`; the standalone two-head bundle's weights under the
    // one-head config are an error naming a key, not a pass.
    Model {
        folder: "diffusers_unet1d",
        blocks: &[("mid_block.", "diffusers.UNetMidBlock1D")],
        says: &["\"in_channels\":32,\"mid_channels\":32,\"out_channels\":32"],
        on_weights: &[("unet_mid_block_1d", TWINS, "mid_block.")],
        with_config: &["unet_mid_block_1d_ref"],
        refused: &[("unet_mid_block_1d_two_heads_conv_skip", "mid_block.", &[])],
        ..ROW
    },
    // The Diffuser planning models' `UNet1DModel`s: each model's weights under the other's
    // bundle are an error.
    Model {
        folder: "diffusers_unet1d_trajectory",
        blocks: &[("mid_block.", "diffusers.MidResTemporalBlock1D")],
        on_weights: &[("mid_res_temporal_block_1d", TWINS, "mid_block.")],
        refused: &[("value_function_mid_block_1d", "mid_block.", &[])],
        ..ROW
    },
    Model {
        folder: "diffusers_unet1d_value",
        blocks: &[("mid_block.", "diffusers.ValueFunctionMidBlock1D")],
        on_weights: &[("value_function_mid_block_1d", TWINS, "mid_block.")],
        ..ROW
    },
    // Kandinsky's MoVQ (`VQModel(norm_type="spatial")`): the decoder's spatially normalised mid
    // block and its zq channels; its bundles include zq at another resolution.
    Model {
        folder: "diffusers_movq",
        blocks: &[
            ("decoder.mid_block.", "diffusers.UNetMidBlock2D"),
            ("encoder.mid_block.", "diffusers.UNetMidBlock2D"),
        ],
        detected: &[
            ("decoder.mid_block.", "/block", "\"diffusers.UNetMidBlock2D\""),
            ("decoder.mid_block.", "/from_config/resnet_time_scale_shift", "\"spatial\""),
            ("decoder.mid_block.", "/from_config/temb_channels", "4"),
        ],
        on_weights: &[(
            "unet_mid_block_2d_movq_decoder",
            &["", "_f16", "_bf16", "_zq_resized"],
            "decoder.mid_block.",
        )],
        with_config: &[
            "unet_mid_block_2d_movq_decoder_ref",
            "unet_mid_block_2d_movq_encoder_ref",
        ],
        ..ROW
    },
    // `detect` fills in what the keys cannot tell (heads, groups, eps) from the model's own
    // `config.json` where one sits beside the checkpoint (as `--repo` has one); a lone
    // checkpoint lists what the keys cannot tell. The dual mid block's bundle does not fit these
    // weights: the missing key is named.
    Model {
        folder: "diffusers_sd1",
        blocks: &[("mid_block.", "diffusers.UNetMidBlock2DCrossAttn")],
        says: &[
            "\"use_linear_projection\":false",
            "config: ",
            "from config.json",
            "\"num_attention_heads\":2",
            "\"resnet_groups\":4",
        ],
        never: &["not in the keys"],
        lone_says: &["not in the keys"],
        lone_never: &["from config.json"],
        detected: &[("mid_block.", "/from_config/num_attention_heads", "2")],
        with_config: &["unet_mid_block_2d_cross_attn_sd1_ref"],
        refused: &[("unet_mid_block_2d_cross_attn_dual_ref", "mid_block.", &["transformers.0"])],
        ..ROW
    },
    Model {
        folder: "diffusers_sd2",
        blocks: &[("mid_block.", "diffusers.UNetMidBlock2DCrossAttn")],
        says: &["\"use_linear_projection\":true"],
        with_config: &["unet_mid_block_2d_cross_attn_sd2_ref"],
        ..ROW
    },
    Model {
        folder: "diffusers_sdxl",
        blocks: &[("mid_block.", "diffusers.UNetMidBlock2DCrossAttn")],
        says: &["\"transformer_layers_per_block\":2"],
        with_config: &["unet_mid_block_2d_cross_attn_sdxl_ref"],
        ..ROW
    },
    // Widths divisible by 32, for candle-transformers' whole models (weights/whole/sd1_g32_unet,
    // sd1_g16_unet; examples/candle_transformers.rs).
    Model {
        folder: "diffusers_sd1_g32",
        blocks: &[("mid_block.", "diffusers.UNetMidBlock2DCrossAttn")],
        says: &["\"resnet_groups\":32", "\"in_channels\":64"],
        ..ROW
    },
    Model {
        folder: "diffusers_vae_g32",
        blocks: &[
            ("decoder.mid_block.", "diffusers.UNetMidBlock2D"),
            ("encoder.mid_block.", "diffusers.UNetMidBlock2D"),
        ],
        says: &["\"resnet_groups\":32"],
        ..ROW
    },
    // The IF- and Kandinsky-like `UNet2DConditionModel`s (`mid_block_type
    // "UNetMidBlock2DSimpleCrossAttn"`): the keys tell the added key/value attention; the IF
    // weights under the Kandinsky bundle's config (layer_norm cross norm over 16 channels; IF's
    // is a GroupNorm over 32) are an error naming the key and its shapes.
    Model {
        folder: "diffusers_if",
        blocks: &[("mid_block.", "diffusers.UNetMidBlock2DSimpleCrossAttn")],
        lone_says: &[
            "prefix `mid_block.`: diffusers.UNetMidBlock2DSimpleCrossAttn",
            "UNetMidBlock2DSimpleCrossAttn (UNet2DConditionModel of IF / Kandinsky / UnCLIP",
            "\"only_cross_attention\":false",
            "\"in_channels\":16",
            "not in the keys: attention_head_dim",
        ],
        detected: &[
            ("mid_block.", "/from_config/attention_head_dim", "4"),
            ("mid_block.", "/from_config/skip_time_act", "true"),
            ("mid_block.", "/from_config/only_cross_attention", "false"),
        ],
        on_weights: &[("unet_mid_block_2d_simple_cross_attn_if", TWINS, "mid_block.")],
        with_config: &["unet_mid_block_2d_simple_cross_attn_if_ref"],
        refused: &[(
            "unet_mid_block_2d_simple_cross_attn_kandinsky",
            "mid_block.",
            &["attentions.0.norm_cross.weight", "expected: [16]"],
        )],
        ..ROW
    },
    Model {
        folder: "diffusers_kandinsky",
        blocks: &[("mid_block.", "diffusers.UNetMidBlock2DSimpleCrossAttn")],
        lone_says: &[
            "prefix `mid_block.`: diffusers.UNetMidBlock2DSimpleCrossAttn",
            "UNetMidBlock2DSimpleCrossAttn (UNet2DConditionModel of IF / Kandinsky / UnCLIP",
            "\"only_cross_attention\":true",
            "\"in_channels\":16",
            "not in the keys: attention_head_dim",
        ],
        detected: &[
            ("mid_block.", "/from_config/attention_head_dim", "4"),
            ("mid_block.", "/from_config/skip_time_act", "true"),
            ("mid_block.", "/from_config/only_cross_attention", "true"),
        ],
        on_weights: &[("unet_mid_block_2d_simple_cross_attn_kandinsky", TWINS, "mid_block.")],
        with_config: &["unet_mid_block_2d_simple_cross_attn_kandinsky_ref"],
        ..ROW
    },
    // The tiny `ControlNetModel`: the whole bottleneck at the top level (its bundles take
    // `--prefix ""`) and its mid block at `mid_block.`.
    Model {
        folder: "diffusers_controlnet",
        blocks: &[("mid_block.", "diffusers.UNetMidBlock2DCrossAttn")],
        lone_says: &[
            "the top level (ControlNetModel: mid_block.* and controlnet_mid_block.*; no --prefix needed): diffusers.ControlNetMidBlock",
            "ControlNetModel bottleneck: mid_block (UNetMidBlock2DCrossAttn",
            "controlnet_mid_block (1x1 conv [16, 16, 1, 1])",
            "\"mid_block_type\":\"UNetMidBlock2DCrossAttn\"",
            "\"transformer_layers_per_block\":2",
            "not in the keys: global_pool_conditions",
            "prefix `mid_block.`: diffusers.UNetMidBlock2DCrossAttn",
        ],
        detected: &[
            ("", "/from_config/global_pool_conditions", "false"),
            ("", "/from_config/mid_block/num_attention_heads", "2"),
            ("", "/from_config/mid_block/output_scale_factor", "1.25"),
        ],
        on_weights: &[("controlnet_mid_block", TWINS, "")],
        with_config: &["controlnet_mid_block_ref"],
        ..ROW
    },
    // The tiny SDXL ControlNet (`from_unet` of diffusers_sdxl; scripts/export_controlnet.py): the
    // bottleneck at the top level, its SDXL mid block (two transformer layers, linear projections).
    Model {
        folder: "diffusers_controlnet_sdxl",
        blocks: &[("mid_block.", "diffusers.UNetMidBlock2DCrossAttn")],
        lone_says: &[
            "the top level (ControlNetModel: mid_block.* and controlnet_mid_block.*; no --prefix needed): diffusers.ControlNetMidBlock",
            "controlnet_mid_block (1x1 conv [16, 16, 1, 1])",
            "\"transformer_layers_per_block\":2",
            "\"use_linear_projection\":true",
            "prefix `mid_block.`: diffusers.UNetMidBlock2DCrossAttn",
        ],
        detected: &[("", "/from_config/mid_block/num_attention_heads", "2")],
        ..ROW
    },
    // The tiny `UNetControlNetXSModel`: its `ControlNetXSCrossAttnMidBlock2D` at `mid_block.`.
    Model {
        folder: "diffusers_controlnet_xs",
        blocks: &[("mid_block.", "diffusers.ControlNetXSCrossAttnMidBlock2D")],
        lone_says: &[
            "prefix `mid_block.`: diffusers.ControlNetXSCrossAttnMidBlock2D",
            "\"base_channels\":8",
            "\"ctrl_channels\":4",
            "\"transformer_layers_per_block\":2",
            "not in the keys: base_num_attention_heads",
        ],
        detected: &[
            ("mid_block.", "/from_config/ctrl_max_norm_num_groups", "3"),
            ("mid_block.", "/from_config/ctrl_num_attention_heads", "2"),
        ],
        on_weights: &[("controlnet_xs_mid_block", TWINS, "mid_block.")],
        with_config: &[
            "controlnet_xs_mid_block_ref",
            "controlnet_xs_mid_block_no_control_ref",
        ],
        ..ROW
    },
    // The tiny `UNet3DConditionModel`: batch 2 of 3 frames; told from an `I2VGenXLUNet` by the
    // keys around the mid block.
    Model {
        folder: "diffusers_unet3d",
        blocks: &[("mid_block.", "diffusers.UNetMidBlock3DCrossAttn")],
        says: &["UNet3DConditionModel video U-Net"],
        never: &["I2VGenXLUNet"],
        lone_says: &[
            "prefix `mid_block.`: diffusers.UNetMidBlock3DCrossAttn",
            "\"in_channels\":16",
            "\"temb_channels\":32",
            "\"cross_attention_dim\":8",
            "\"use_linear_projection\":true",
            "not in the keys: num_attention_heads",
        ],
        lone_never: &["not supported"],
        detected: &[
            ("mid_block.", "/from_config/num_attention_heads", "4"),
            ("mid_block.", "/from_config/resnet_groups", "4"),
            ("mid_block.", "/from_config/resnet_eps", "1e-5"),
        ],
        on_weights: &[("unet_mid_block_3d_cross_attn_unet3d", TWINS, "mid_block.")],
        with_config: &["unet_mid_block_3d_cross_attn_unet3d_ref"],
        num_frames: Some("mid/unet_mid_block_3d_cross_attn_unet3d"),
        ..ROW
    },
    // Stable Video Diffusion's tiny U-Net, saved in float16 as SVD's fp16 variants are: the f16
    // bundle references the checkpoint, the bf16 one has its own weights.
    Model {
        folder: "diffusers_svd",
        blocks: &[("mid_block.", "diffusers.UNetMidBlockSpatioTemporal")],
        lone_says: &[
            "prefix `mid_block.`: diffusers.UNetMidBlockSpatioTemporal",
            "\"in_channels\":32",
            "\"temb_channels\":128",
            "\"cross_attention_dim\":8",
            "\"transformer_layers_per_block\":1",
            "not in the keys: num_attention_heads",
        ],
        lone_never: &["not supported"],
        detected: &[("mid_block.", "/from_config/num_attention_heads", "2")],
        on_weights: &[("unet_mid_block_spatio_temporal_svd_mixed_ref", TWINS, "mid_block.")],
        with_config: &["unet_mid_block_spatio_temporal_svd_mixed_ref"],
        ..ROW
    },
    // Stable Video Diffusion's tiny VAE (float16): the decoder's `MidBlockTemporalDecoder`, the
    // encoder's plain `UNetMidBlock2D`.
    Model {
        folder: "diffusers_svd_vae",
        blocks: &[
            ("decoder.mid_block.", "diffusers.MidBlockTemporalDecoder"),
            ("encoder.mid_block.", "diffusers.UNetMidBlock2D"),
        ],
        lone_says: &[
            "prefix `decoder.mid_block.`: diffusers.MidBlockTemporalDecoder",
            "\"num_layers\":2",
            "\"out_channels\":32",
            "not in the keys: attention_head_dim",
            "prefix `encoder.mid_block.`: diffusers.UNetMidBlock2D",
        ],
        lone_never: &["not supported"],
        on_weights: &[("mid_block_temporal_decoder_svd_ref", TWINS, "decoder.mid_block.")],
        with_config: &[
            "mid_block_temporal_decoder_svd_ref",
            "unet_mid_block_2d_svd_vae_encoder_ref",
        ],
        ..ROW
    },
    // The tiny `UNetMotionModel` (AnimateDiff): the keys tell the sinusoidal table's length;
    // batch 2 of 3 frames.
    Model {
        folder: "diffusers_unet_motion",
        blocks: &[("mid_block.", "diffusers.UNetMidBlockCrossAttnMotion")],
        lone_says: &[
            "prefix `mid_block.`: diffusers.UNetMidBlockCrossAttnMotion",
            "\"in_channels\":8",
            "\"temb_channels\":32",
            "\"cross_attention_dim\":8",
            "\"temporal_max_seq_length\":6",
            "not in the keys: num_attention_heads",
            "not in the keys: temporal_num_attention_heads",
        ],
        lone_never: &["not supported"],
        detected: &[
            ("mid_block.", "/from_config/num_attention_heads", "2"),
            ("mid_block.", "/from_config/temporal_num_attention_heads", "2"),
            ("mid_block.", "/from_config/temporal_max_seq_length", "6"),
            ("mid_block.", "/from_config/resnet_groups", "4"),
        ],
        on_weights: &[("unet_mid_block_cross_attn_motion", TWINS, "mid_block.")],
        with_config: &["unet_mid_block_cross_attn_motion_ref"],
        num_frames: Some("mid/unet_mid_block_cross_attn_motion"),
        ..ROW
    },
    // The tiny `I2VGenXLUNet`: told from a `UNet3DConditionModel` by the keys around the mid
    // block (its fixed eps then comes from the keys).
    Model {
        folder: "diffusers_i2vgen_xl",
        blocks: &[("mid_block.", "diffusers.UNetMidBlock3DCrossAttn")],
        lone_says: &[
            "prefix `mid_block.`: diffusers.UNetMidBlock3DCrossAttn",
            "I2VGenXLUNet image-to-video",
            "\"resnet_eps\":0.00001",
        ],
        lone_never: &["not in the keys: resnet_eps"],
        on_weights: &[("unet_mid_block_3d_cross_attn_i2vgen_xl", ONE, "mid_block.")],
        with_config: &["unet_mid_block_3d_cross_attn_i2vgen_xl_ref"],
        num_frames: Some("mid/unet_mid_block_3d_cross_attn_i2vgen_xl"),
        ..ROW
    },
    // The tiny `UNet2DConditionModel(dual_cross_attention=True)` (Versatile Diffusion's image
    // U-Net once converted): the dual mid block from the keys alone; its bundles (f32 / f16 /
    // bf16, pipeline-set attributes, the `DualTransformer2DModel` alone) pass on the checkpoint.
    Model {
        folder: "diffusers_vd",
        blocks: &[("mid_block.", "diffusers.UNetMidBlock2DCrossAttn")],
        lone_says: &[
            "prefix `mid_block.`: diffusers.UNetMidBlock2DCrossAttn",
            "dual_cross_attention (Versatile Diffusion",
            "\"dual_cross_attention\":true",
            "\"cross_attention_dim\":8",
            "mix_ratio",
        ],
        lone_never: &["not supported"],
        detected: &[
            ("mid_block.", "/from_config/dual_cross_attention", "true"),
            ("mid_block.", "/from_config/num_attention_heads", "2"),
        ],
        on_weights: &[
            (
                "unet_mid_block_2d_cross_attn_dual",
                &["", "_f16", "_bf16", "_mix"],
                "mid_block.",
            ),
            ("dual_transformer_2d_vd_mix_ref", ONE, "mid_block.attentions.0."),
        ],
        with_config: &["unet_mid_block_2d_cross_attn_dual_ref"],
        ..ROW
    },
    Model {
        folder: "lucidrains_ddpm",
        file: "model-1.pt",
        blocks: &[
            ("ema_model.model.", "denoising_diffusion_pytorch.MidBlock"),
            ("model.", "denoising_diffusion_pytorch.MidBlock"),
        ],
        says: &["2.x", "version 2.3.4", "\"num_mem_kv\":4"],
        ..ROW
    },
    Model {
        folder: "sd_v1_tiny",
        file: "sd_v1_tiny.ckpt",
        blocks: &[
            ("first_stage_model.decoder.mid.", "ldm.MidBlock"),
            ("first_stage_model.encoder.mid.", "ldm.MidBlock"),
            ("model.diffusion_model.middle_block.", "openai.MiddleBlock"),
        ],
        ..ROW
    },
    Model {
        folder: "guided_tiny",
        file: "guided_tiny.pt",
        blocks: &[("middle_block.", "openai.MiddleBlock")],
        says: &["\"use_scale_shift_norm\":true", "use_new_attention_order"],
        ..ROW
    },
    Model {
        folder: "ldm_ddpm_tiny",
        file: "ldm_ddpm_tiny.pt",
        blocks: &[("mid.", "ldm.MidBlock")],
        says: &["attn_type vanilla"],
        ..ROW
    },
];

impl Model {
    /// The checkpoint's path.
    fn checkpoint(&self) -> String {
        models(&format!("{}/{}", self.folder, self.file))
    }
}

#[test]
fn every_committed_model_has_a_row() {
    let mut folders: Vec<String> = std::fs::read_dir(weights().join("models"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    folders.sort();
    let mut rows: Vec<&str> = MODELS.iter().map(|m| m.folder).collect();
    rows.sort();
    assert_eq!(folders, rows, "weights/models and the MODELS table");
}

#[test]
fn detect_names_the_blocks_of_every_committed_model() {
    for m in MODELS {
        let (code, out, err) = cli(&["detect", &m.checkpoint()]);
        assert_eq!(code, 0, "{}: {err}", m.folder);
        for (prefix, block) in m.blocks {
            let line = format!("prefix `{prefix}`: {block}");
            assert!(out.contains(&line), "{}: no {line:?} in\n{out}", m.folder);
        }
        for needle in m.says {
            assert!(out.contains(needle), "{}: no {needle:?} in\n{out}", m.folder);
        }
        for needle in m.never {
            assert!(!out.contains(needle), "{}: {needle:?} in\n{out}", m.folder);
        }
    }
}

#[test]
fn detect_on_a_lone_checkpoint_says_what_the_keys_tell() {
    for m in MODELS
        .iter()
        .filter(|m| !m.lone_says.is_empty() || !m.lone_never.is_empty())
    {
        let out = detect_without_config(&scratch(&format!("detect-lone-{}", m.folder)), &m.checkpoint());
        for needle in m.lone_says {
            assert!(out.contains(needle), "{}: no {needle:?} in\n{out}", m.folder);
        }
        for needle in m.lone_never {
            assert!(!out.contains(needle), "{}: {needle:?} in\n{out}", m.folder);
        }
    }
}

#[test]
fn detect_json_gives_the_kwargs_from_config_json() {
    for m in MODELS.iter().filter(|m| !m.detected.is_empty()) {
        let (doc, out) = detect_json(&m.checkpoint());
        for (prefix, pointer, want) in m.detected {
            let block = doc["mid_blocks"]
                .as_array()
                .unwrap()
                .iter()
                .find(|b| b["prefix"] == *prefix)
                .unwrap_or_else(|| panic!("{}: no block at {prefix:?} in\n{out}", m.folder));
            let want: serde_json::Value = serde_json::from_str(want).unwrap();
            assert_eq!(
                block.pointer(pointer),
                Some(&want),
                "{}: {prefix:?} {pointer}\n{out}",
                m.folder
            );
        }
    }
}

#[test]
fn bundles_pass_on_the_whole_checkpoints() {
    for m in MODELS {
        for (stem, suffixes, prefix) in m.on_weights {
            for suffix in *suffixes {
                let b = w(&format!("mid/{stem}{suffix}.safetensors"));
                let err = assert_pass(&["check", &b, "--weights", &m.checkpoint(), "--prefix", prefix]);
                assert!(err.contains("weights from"), "{}: {stem}{suffix}: {err}", m.folder);
            }
        }
    }
}

#[test]
fn config_json_gives_the_mid_block_config() {
    for m in MODELS {
        for stem in m.with_config {
            let b = w(&format!("mid/{stem}.safetensors"));
            let config = models(&format!("{}/config.json", m.folder));
            let err = assert_pass(&["check", &b, "--config", &config]);
            assert!(err.contains("config from"), "{}: {stem}: {err}", m.folder);
        }
    }
}

#[test]
fn another_blocks_weights_are_an_error_not_a_fail() {
    for m in MODELS {
        for (stem, prefix, needles) in m.refused {
            let b = w(&format!("mid/{stem}.safetensors"));
            let (code, out, err) = cli(&["check", &b, "--weights", &m.checkpoint(), "--prefix", prefix]);
            assert_eq!(code, 2, "{}: {stem} at {prefix:?}: {out}\n{err}", m.folder);
            for needle in *needles {
                assert!(err.contains(needle), "{}: {stem}: no {needle:?} in {err}", m.folder);
            }
        }
    }
}

#[test]
fn video_mid_blocks_count_num_frames() {
    for m in MODELS {
        if let Some(stem) = m.num_frames {
            wrong_num_frames_never_pass(stem, &scratch(&format!("num-frames-{}", m.folder)));
        }
    }
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
    // The Kandinsky config on the IF bundle: a different block config, an error, not a pass.
    let (code, out, err) = cli(&[
        "check",
        &w("mid/unet_mid_block_2d_simple_cross_attn_if_ref.safetensors"),
        "--config",
        &models("diffusers_kandinsky/config.json"),
    ]);
    assert_ne!(code, 0, "{out}\n{err}");
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

/// `norm_eps` that is not a finite number > 0 in a model's `config.json`: exit 2 naming the key
/// (it was accepted, and the block output NaN that the check blamed on the port).
#[test]
fn a_norm_eps_that_is_not_positive_is_refused() {
    let dir = scratch("bad-norm-eps");
    let text = std::fs::read_to_string(models("diffusers_unet2d/config.json")).unwrap();
    let bundle = w("mid/unet_mid_block_2d_unet2d_ref.safetensors");
    for bad in [serde_json::json!(-1), serde_json::json!(0.0), serde_json::json!("1e-5")] {
        let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
        json["norm_eps"] = bad.clone();
        let path = dir.join("config.json");
        std::fs::write(&path, json.to_string()).unwrap();
        let (code, out, err) = cli(&["check", &bundle, "--config", path.to_str().unwrap()]);
        assert_eq!(code, 2, "{bad}: {out}{err}");
        assert!(err.contains("`norm_eps` must be a finite number > 0"), "{bad}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    // Through the library: a model folder whose config has norm_eps -1 is an Err.
    let folder = dir.join("model");
    std::fs::create_dir_all(&folder).unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    json["norm_eps"] = serde_json::json!(-1);
    std::fs::write(folder.join("config.json"), json.to_string()).unwrap();
    std::fs::copy(
        models("diffusers_unet2d/diffusion_pytorch_model.safetensors"),
        folder.join("diffusion_pytorch_model.safetensors"),
    )
    .unwrap();
    let e = unet_parity::model::mid_block(&folder, None, &candle_core::Device::Cpu, candle_core::DType::F32);
    assert!(e.err().unwrap().to_string().contains("norm_eps"));
}

fn detect(file: &str) -> String {
    let (code, out, err) = cli(&["detect", &models(file)]);
    assert_eq!(code, 0, "{file}: {err}");
    out
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
fn hub_cache(name: &str) -> crate::common::Scratch {
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
    let scratch = hub_cache("hub-offline");
    let cache = scratch.to_str().unwrap();
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
        // Neither zip nor pickle: said so (it was "not a valid safetensors file: header too large").
        ("junk.bin", b"JUNKJUNKJUNKJUNK".to_vec(), "neither a zip archive"),
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
    let file = crate::common::root().join("tests/data/long1_overflow.pt");
    let (code, _, err) = cli(&["detect", file.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("malformed pickle") && err.contains("long1_overflow.pt"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// Kandinsky's MoVQ decoder (the table has its blocks and bundles): `detect` names the spatially
/// normalised variant, and the same bundle read as a plain `UNetMidBlock2D` is not a pass.
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
    assert!(
        dec["variant"]
            .as_str()
            .unwrap()
            .contains("VQModel norm_type=\"spatial\""),
        "{out}"
    );
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

/// The tiny `ControlNetModel` (the table has what `detect` says and its bundles at `--prefix ""`):
/// `detect --json` gives the whole bottleneck first, then its mid block with the same kwargs; the
/// bundles need no `--prefix` at all; and a config that is not this model's fails.
#[test]
fn controlnet_checks_without_a_prefix_and_wrong_configs_fail() {
    let ckpt = models("diffusers_controlnet/diffusion_pytorch_model.safetensors");
    let (doc, out) = detect_json(&ckpt);
    let (whole, mid) = (&doc["mid_blocks"][0], &doc["mid_blocks"][1]);
    assert_eq!(
        (whole["prefix"].as_str(), mid["prefix"].as_str()),
        (Some(""), Some("mid_block.")),
        "{out}"
    );
    assert_eq!(mid["from_config"], whole["from_config"]["mid_block"], "{out}");
    for suffix in ["", "_f16", "_bf16"] {
        let b = w(&format!("mid/controlnet_mid_block{suffix}.safetensors"));
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

/// The tiny `UNet3DConditionModel`'s mid block takes `attention_mask` and, as diffusers' does,
/// uses it nowhere (the exporter asserts PyTorch's output is the maskless one bit for bit): still
/// a pass.
#[test]
fn video_unet_mid_block_takes_and_ignores_an_attention_mask() {
    let dir = scratch("unet3d-mask");
    let masked = RawBundle::edited("mid/unet_mid_block_3d_cross_attn_unet3d.safetensors", &dir, |b| {
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

/// A mid block's own keys alone cannot tell an `I2VGenXLUNet` from a `UNet3DConditionModel` (the
/// same class and keys in both; the table has the whole models told apart): `detect` says so.
#[test]
fn a_bare_video_mid_block_says_it_cannot_tell_the_model() {
    let ckpt = models("diffusers_i2vgen_xl/diffusion_pytorch_model.safetensors");
    let mut bare = RawBundle::read(Path::new(&ckpt));
    bare.tensors.retain(|k, _| k.starts_with("mid_block."));
    let dir = scratch("i2vgen-mid-only");
    let bare_path = dir.join("mid_only.safetensors");
    bare.write(&bare_path);
    let (_, out, _) = cli(&["detect", bare_path.to_str().unwrap()]);
    assert!(
        out.contains("UNet3DConditionModel or I2VGenXLUNet") && out.contains("not in the keys: resnet_eps"),
        "{out}"
    );
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

/// `detect --json` on `ckpt`: the parsed document and the text.
fn detect_json(ckpt: &str) -> (serde_json::Value, String) {
    let (code, out, err) = cli(&["detect", ckpt, "--json"]);
    assert_eq!(code, 0, "{err}");
    (serde_json::from_str(&out).unwrap(), out)
}

/// `detect`'s answer on a copy of `ckpt` in `dir` (without the `config.json` beside the
/// original): what the keys alone tell.
fn detect_without_config(dir: &Path, ckpt: &str) -> String {
    let lone = copy_to(dir, ckpt, "m.safetensors");
    let (code, out, err) = cli(&["detect", &lone]);
    assert_eq!(code, 0, "{err}");
    out
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

/// Stable Video Diffusion's tiny U-Net (the table has its blocks and bundles):
/// `image_only_indicator` counts: its values (frame 1 is an image in the bundle: the
/// learned_with_images mixers take it from the spatial path) and its shape (the frame count)
/// change the output, so a wrong one FAILs, a missing or ill-shaped one is an error naming it.
#[test]
fn svd_unet_mid_block_reads_image_only_indicator() {
    let ckpt = models("diffusers_svd/diffusion_pytorch_model.safetensors");
    let stem = "mid/unet_mid_block_spatio_temporal_svd_mixed_ref";
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

/// Stable Video Diffusion's tiny VAE decoder (the table has its blocks and bundles): its `learned`
/// mixers do not read `image_only_indicator`'s values (ones still pass), but its shape is the frame
/// count (2 videos of 1 frame FAIL); a bundle of 3 frames passes.
#[test]
fn svd_vae_decoder_reads_the_indicator_shape_not_its_values() {
    let ckpt = models("diffusers_svd_vae/diffusion_pytorch_model.safetensors");
    let stem = "mid/mid_block_temporal_decoder_svd_ref";
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

/// The tiny `UNetControlNetXSModel` (the table has its block and bundles): wrong configs fail.
#[test]
fn controlnet_xs_wrong_configs_fail() {
    let config = models("diffusers_controlnet_xs/config.json");
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
