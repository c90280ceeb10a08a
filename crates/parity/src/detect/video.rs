//! `detect` for the video U-Nets' mid blocks: `UNetMidBlock3DCrossAttn`, AnimateDiff's
//! `UNetMidBlockCrossAttnMotion` (`motion_modules.<i>` beside the attentions), the model a
//! `UNetMidBlock3DCrossAttn` sits in (`I2VGenXLUNet` and `UNet3DConditionModel` share the class
//! and its keys, and differ in the keys around it), and `MotionAdapter` files (motion modules
//! only, no mid block).

use super::{count, dim, has, prefixes, time_shift, Found};
use crate::checkpoint::Checkpoint;
use serde_json::{json, Map, Value};
use unet_attention::diffusers::model_config::video::MOTION_ADAPTER;
use unet_attention::diffusers::UNetMidBlockCrossAttnMotion;

/// Whether any key starts with `prefix`.
fn under(ck: &Checkpoint, prefix: &str) -> bool {
    ck.names().any(|n| n.starts_with(prefix))
}

/// A per-layer count as the constructor takes it: one int where every layer has the same.
fn per_layer(ck: &Checkpoint, p: &str, module: &str, layers: usize) -> Value {
    let counts: Vec<usize> = (0..layers)
        .map(|i| count(ck, &format!("{p}{module}.{i}.transformer_blocks.")))
        .collect();
    match counts.first() {
        Some(&n) if counts.iter().all(|&k| k == n) => json!(n),
        _ => json!(counts),
    }
}

/// Whether the mid block at `p` is AnimateDiff's (a motion module beside its resnets).
pub(crate) fn is_motion(ck: &Checkpoint, p: &str) -> bool {
    under(ck, &format!("{p}motion_modules."))
}

/// `UNetMidBlockCrossAttnMotion` (`UNetMotionModel`): resnets, `attentions.<i>`
/// (`Transformer2DModel`) and `motion_modules.<i>` (`AnimateDiffTransformer3D` with a
/// `pos_embed.pe` table per transformer block).
pub(crate) fn motion(ck: &Checkpoint, p: &str, c: usize) -> Found {
    let t0 = format!("{p}attentions.0.transformer_blocks.0.");
    let m0 = format!("{p}motion_modules.0.transformer_blocks.0.");
    let temb_out = dim(ck, &format!("{p}resnets.0.time_emb_proj.weight"), 0);
    let layers = count(ck, &format!("{p}attentions."));
    let linear = ck
        .shape(&format!("{p}attentions.0.proj_in.weight"))
        .is_some_and(|s| s.len() == 2);
    let mut config = Map::new();
    config.insert("in_channels".into(), json!(c));
    config.insert(
        "temb_channels".into(),
        json!(dim(ck, &format!("{p}resnets.0.time_emb_proj.weight"), 1)),
    );
    config.insert("resnet_time_scale_shift".into(), json!(time_shift(temb_out, c)));
    config.insert("num_layers".into(), json!(layers));
    config.insert(
        "transformer_layers_per_block".into(),
        per_layer(ck, p, "attentions", layers),
    );
    config.insert(
        "temporal_transformer_layers_per_block".into(),
        per_layer(ck, p, "motion_modules", layers),
    );
    config.insert(
        "cross_attention_dim".into(),
        json!(dim(ck, &format!("{t0}attn2.to_k.weight"), 1)),
    );
    config.insert("use_linear_projection".into(), json!(linear));
    let mut unknown = vec![
        "num_attention_heads (the spatial transformers' head count: the config's `num_attention_heads`, last \
         entry; AnimateDiff on SD 1.5: 8)"
            .to_string(),
        "temporal_num_attention_heads (the motion modules' head count: the config's `motion_num_attention_heads`, \
         last entry; AnimateDiff: 8)"
            .to_string(),
        "resnet_groups (norm groups: the config's `norm_num_groups`, 32 in SD 1.5)".to_string(),
        "resnet_eps (the config's `norm_eps`, 1e-5 in UNetMotionModel)".to_string(),
    ];
    match ck.shape(&format!("{m0}pos_embed.pe")) {
        Some(pe) if pe.len() == 3 => {
            config.insert("temporal_max_seq_length".into(), json!(pe[1]));
        }
        _ => unknown.push(
            "temporal_max_seq_length (the config's `motion_max_seq_length`, 32; no `pos_embed.pe` in the file: the \
             constructor's sinusoid is used, as diffusers' from_pretrained keeps it)"
                .to_string(),
        ),
    }
    Found {
        prefix: p.to_string(),
        block: Some(UNetMidBlockCrossAttnMotion::BLOCK),
        variant: format!(
            "diffusers UNetMidBlockCrossAttnMotion (UNetMotionModel, AnimateDiff: Transformer2DModel + motion modules \
             over num_frames; {} projections)",
            if linear { "linear" } else { "conv" }
        ),
        config,
        unknown,
        from_config: None,
    }
}

/// The model a `UNetMidBlock3DCrossAttn` at `p` belongs to, told by the keys beside it: and,
/// for `I2VGenXLUNet`, its fixed `resnet_eps`.
pub(crate) fn unet_3d_model(ck: &Checkpoint, p: &str) -> (String, Option<f64>) {
    let root = p.strip_suffix("mid_block.").unwrap_or(p);
    let i2vgen = [
        "image_latents_proj_in.",
        "image_latents_context_embedding.",
        "fps_embedding.",
    ]
    .iter()
    .any(|m| under(ck, &format!("{root}{m}")));
    let what = "temporal convolutions and attentions over num_frames";
    if !p.is_empty() && i2vgen {
        (
            format!("diffusers UNetMidBlock3DCrossAttn (I2VGenXLUNet image-to-video U-Net: {what})"),
            Some(1e-5),
        )
    } else if !p.is_empty() && under(ck, &format!("{root}transformer_in.")) {
        (
            format!(
                "diffusers UNetMidBlock3DCrossAttn (UNet3DConditionModel video U-Net, ModelScope / Zeroscope: {what})"
            ),
            None,
        )
    } else {
        (
            format!(
                "diffusers UNetMidBlock3DCrossAttn (UNet3DConditionModel or I2VGenXLUNet: the same class and keys, and \
                 the model's other keys are not here to tell them apart; {what})"
            ),
            None,
        )
    }
}

/// `MotionAdapter` files: `motion_modules.<i>` at a `mid_block.` (or the top level) with no
/// resnets beside them, named with what to do instead.
pub(crate) fn motion_adapters(ck: &Checkpoint) -> Vec<Found> {
    prefixes(ck, "motion_modules.0.proj_in.weight")
        .into_iter()
        .filter(|p| (p.ends_with("mid_block.") || p.is_empty()) && !has(ck, &format!("{p}resnets.0.conv1.weight")))
        .map(|p| {
            let mut config = Map::new();
            config.insert(
                "in_channels".into(),
                json!(dim(ck, &format!("{p}motion_modules.0.proj_in.weight"), 1)),
            );
            config.insert("layers".into(), json!(count(ck, &format!("{p}motion_modules."))));
            Found {
                prefix: p,
                block: None,
                variant: format!(
                    "diffusers MotionAdapter motion modules (AnimateDiff), not supported as they are: {MOTION_ADAPTER}"
                ),
                config,
                unknown: vec![],
                from_config: None,
            }
        })
        .collect()
}

/// `UNetMidBlock3DCrossAttn` (`UNet3DConditionModel`, `I2VGenXLUNet`): `temp_convs.<i>`
/// (`TemporalConvLayer`) beside the resnets and `temp_attentions.<i>` beside the attentions.
pub(super) fn diffusers_3d(ck: &Checkpoint, p: &str, c: usize) -> Found {
    let t0 = format!("{p}attentions.0.transformer_blocks.0.");
    let temb_out = dim(ck, &format!("{p}resnets.0.time_emb_proj.weight"), 0);
    let mut config = Map::new();
    config.insert("in_channels".into(), json!(c));
    config.insert(
        "temb_channels".into(),
        json!(dim(ck, &format!("{p}resnets.0.time_emb_proj.weight"), 1)),
    );
    config.insert("num_layers".into(), json!(count(ck, &format!("{p}attentions."))));
    config.insert("resnet_time_scale_shift".into(), json!(time_shift(temb_out, c)));
    config.insert(
        "cross_attention_dim".into(),
        json!(dim(ck, &format!("{t0}attn2.to_k.weight"), 1)),
    );
    let linear = ck
        .shape(&format!("{p}attentions.0.proj_in.weight"))
        .is_none_or(|s| s.len() == 2);
    config.insert("use_linear_projection".into(), json!(linear));
    let mut unknown = vec![
        "num_attention_heads (the per-head width here: the config's `attention_head_dim`, last entry; ModelScope / \
         Zeroscope: 64)"
            .to_string(),
        "resnet_groups (norm groups: the config's `norm_num_groups`, 32 in ModelScope)".to_string(),
    ];
    let (variant, eps) = unet_3d_model(ck, p);
    match eps {
        Some(eps) => {
            config.insert("resnet_eps".into(), json!(eps));
        }
        None => unknown.push("resnet_eps (UNet3DConditionModel: its norm_eps, 1e-5; I2VGenXLUNet: 1e-5)".to_string()),
    }
    Found {
        prefix: p.to_string(),
        block: Some(unet_attention::diffusers::UNetMidBlock3DCrossAttn::BLOCK),
        variant,
        config,
        unknown,
        from_config: None,
    }
}
