//! `unet-parity detect`: find the mid blocks in a checkpoint by their key names, name the family
//! and variant, read what the shapes tell (channels, time-embedding width, context width, layer
//! counts, memory key/values) and list what they cannot (heads, the qkv order, norm groups, eps).

use crate::checkpoint::Checkpoint;

mod controlnet_xs;
mod one_d;
mod svd;
mod video;
use serde::Serialize;
use serde_json::{json, Map, Value};

/// One mid block found in a checkpoint.
#[derive(Debug, Clone, Serialize)]
pub struct Found {
    /// The full prefix of the block's keys (as `--prefix` takes it).
    pub prefix: String,
    /// The block id, or `None` for a variant this crate does not implement.
    pub block: Option<&'static str>,
    /// Family and variant in words.
    pub variant: String,
    /// Config values the keys determine.
    pub config: Map<String, Value>,
    /// Config values the keys cannot tell, with what to use.
    pub unknown: Vec<String>,
    /// The block's constructor kwargs from the model's `config.json`, where one came with the
    /// checkpoint (`--repo`, or a diffusers folder): heads, groups and eps included.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub from_config: Option<Value>,
}

/// Fill in [`Found::from_config`] from a diffusers `config.json` (`UNet2DModel`,
/// `UNet2DConditionModel`, `AutoencoderKL`) for the blocks found at the prefixes it names.
/// `Err` where the file is not such a config.
pub fn apply_config(found: &mut [Found], config: &Value) -> Result<(), String> {
    let specs = unet_attention::diffusers::model_config::mid_blocks(config, None, true).map_err(|e| e.to_string())?;
    for f in found.iter_mut() {
        let spec = specs
            .iter()
            .find(|s| s.key_prefix() == f.prefix && f.block == Some(s.block));
        if let Some(spec) = spec {
            f.from_config = Some(spec.config.clone());
        }
    }
    Ok(())
}

pub(crate) fn dim(ck: &Checkpoint, name: &str, i: usize) -> Option<usize> {
    ck.shape(name).and_then(|s| s.get(i).copied())
}

pub(crate) fn has(ck: &Checkpoint, name: &str) -> bool {
    ck.shape(name).is_some()
}

/// How many `<prefix><i>.` groups exist.
pub(crate) fn count(ck: &Checkpoint, prefix: &str) -> usize {
    (0..)
        .take_while(|i| ck.names().any(|n| n.starts_with(&format!("{prefix}{i}."))))
        .count()
}

/// Every prefix `P` with a key `P + anchor`.
pub(crate) fn prefixes(ck: &Checkpoint, anchor: &str) -> Vec<String> {
    ck.names()
        .filter_map(|n| n.strip_suffix(anchor).map(str::to_string))
        .collect()
}

/// Whether the whole checkpoint is one bare diffusers mid block (`torch.save(unet.mid_block
/// .state_dict())`: `resnets.*` at the top level): at least two ResNets, none of them changing
/// the channel count (a down or up block's first one may), and no down/upsamplers.
fn bare_diffusers_mid(ck: &Checkpoint) -> bool {
    let n = count(ck, "resnets.");
    let keeps_channels = |i: usize| {
        let w = |l: &str| dim(ck, &format!("resnets.{i}.{l}.weight"), 0);
        dim(ck, &format!("resnets.{i}.conv1.weight"), 1) == w("conv2")
    };
    n >= 2
        && (0..n).all(keeps_channels)
        && !ck
            .names()
            .any(|k| k.starts_with("downsamplers.") || k.starts_with("upsamplers."))
}

/// Whether the whole checkpoint is one bare OpenAI/ldm `middle_block` (`0.*` ResBlock, `1.*`
/// attention, `2.*` ResBlock, nothing after).
fn bare_openai_middle(ck: &Checkpoint) -> bool {
    has(ck, "2.in_layers.0.weight") && count(ck, "") == 3
}

/// The mid blocks in `ck` (under `only` when given), in key order. Besides blocks inside whole
/// models, a bare mid-block state dict (the block's own keys at the top level) is found with
/// the empty prefix.
pub fn detect(ck: &Checkpoint, only: Option<&str>) -> Vec<Found> {
    let mut found = vec![];
    for p in prefixes(ck, "resnets.0.conv1.weight") {
        if p.ends_with("mid_block.") || (p.is_empty() && bare_diffusers_mid(ck)) {
            found.push(diffusers(ck, &p));
        }
    }
    // Stable Video Diffusion: SpatioTemporalResBlocks.
    for p in prefixes(ck, svd::ANCHOR) {
        if svd::is_mid(ck, &p) {
            found.push(svd::spatio_temporal(ck, &p));
        }
    }
    // UNet1DModel (Dance Diffusion): the cubic resampling buffers and ResConvBlocks.
    for p in prefixes(ck, "down.kernel") {
        if (p.ends_with("mid_block.") || p.is_empty()) && has(ck, &format!("{p}resnets.0.conv_1.weight")) {
            found.push(one_d::diffusers_1d(ck, &p));
        }
    }
    // UNet1DModel (the Diffuser planning models): ResidualTemporalBlock1D stacks.
    for p in prefixes(ck, "resnets.0.conv_in.conv1d.weight") {
        if p.ends_with("mid_block.") || p.is_empty() {
            found.push(one_d::diffusers_1d_temporal(ck, &p, false));
        }
    }
    for p in prefixes(ck, "res1.conv_in.conv1d.weight") {
        if p.ends_with("mid_block.") || p.is_empty() {
            found.push(one_d::diffusers_1d_temporal(ck, &p, true));
        }
    }
    // AnimateDiff MotionAdapter files: motion modules without a mid block (named, not built).
    found.extend(video::motion_adapters(ck));
    // ControlNetModel: its mid block and the `controlnet_mid_block` zero convolution beside it.
    for p in prefixes(ck, "controlnet_mid_block.weight") {
        if has(ck, &format!("{p}mid_block.resnets.0.conv1.weight")) {
            found.push(controlnet(ck, &p));
        }
    }
    // UNetControlNetXSModel's mid block, and a ControlNetXSAdapter's (named, not built).
    found.extend(controlnet_xs::find(ck));
    for p in prefixes(ck, "mid_block1.block1.proj.weight") {
        found.push(lucidrains(ck, &p));
    }
    for p in prefixes(ck, "block_1.conv1.weight") {
        if p.ends_with("mid.") || (p.is_empty() && has(ck, "block_2.conv1.weight")) {
            found.push(ldm(ck, &p));
        }
    }
    for p in prefixes(ck, "0.in_layers.0.weight") {
        if p.ends_with("middle_block.") || (p.is_empty() && bare_openai_middle(ck)) {
            found.push(openai(ck, &p));
        }
    }
    // The prefix as the user passes it: without the section a checkpoint wraps it in.
    for f in &mut found {
        if let Some(s) = ck.sections.iter().find(|s| f.prefix.starts_with(&format!("{s}."))) {
            let inner = f.prefix[s.len() + 1..].to_string();
            if ck.resolve_prefix(&inner).ok().as_deref() == Some(f.prefix.as_str()) {
                f.prefix = inner;
            }
        }
    }
    if let Some(only) = only {
        found.retain(|f| f.prefix.starts_with(only) || ck.resolve_prefix(only).is_ok_and(|p| p == f.prefix));
    }
    found.sort_by(|a, b| a.prefix.cmp(&b.prefix));
    found
}

/// A diffusers mid block at `p` (`resnets.0.conv1` present): the video and motion blocks, the
/// cross-attention ones (simple, dual, transformer) or a plain `UNetMidBlock2D`.
fn diffusers(ck: &Checkpoint, p: &str) -> Found {
    let c = dim(ck, &format!("{p}resnets.0.conv1.weight"), 1).unwrap_or(0);
    if video::is_motion(ck, p) {
        return video::motion(ck, p, c);
    }
    if ck.names().any(|n| n.starts_with(&format!("{p}temp_convs."))) {
        return video::diffusers_3d(ck, p, c);
    }
    // MoVQ's ResnetBlockCondNorm2D: SpatialNorms whose 1x1 convs read the zq channels.
    let zq = dim(ck, &format!("{p}resnets.0.norm1.conv_y.weight"), 1);
    let temb = zq.or(dim(ck, &format!("{p}resnets.0.time_emb_proj.weight"), 1));
    let temb_out = dim(ck, &format!("{p}resnets.0.time_emb_proj.weight"), 0);
    let shift = if zq.is_some() {
        "spatial"
    } else if temb_out == Some(2 * c) {
        "scale_shift"
    } else {
        "default"
    };
    let layers = count(ck, &format!("{p}attentions."));
    let mut config = Map::new();
    config.insert("in_channels".into(), json!(c));
    config.insert("temb_channels".into(), json!(temb));
    config.insert("resnet_time_scale_shift".into(), json!(shift));
    let unknown = vec![
        "resnet_groups (norm groups: 32 in SD / most configs)".to_string(),
        "resnet_eps (the U-Nets' norm_eps, 1e-5 in SD and UNet2DModel; the VAE's 1e-6 ... pass the model's config.json)"
            .to_string(),
    ];
    if has(ck, &format!("{p}attentions.0.add_k_proj.weight")) {
        config.insert("num_layers".into(), json!(layers));
        return diffusers_simple_cross(ck, p, config, unknown);
    }
    if has(
        ck,
        &format!("{p}attentions.0.transformers.0.transformer_blocks.0.attn1.to_q.weight"),
    ) {
        config.insert("num_layers".into(), json!(layers));
        return diffusers_dual_cross(ck, p, config, unknown);
    }
    if has(ck, &format!("{p}attentions.0.transformer_blocks.0.attn1.to_q.weight")) {
        config.insert("num_layers".into(), json!(layers));
        diffusers_cross(ck, p, config, unknown)
    } else {
        diffusers_2d(ck, p, shift == "spatial", config, unknown)
    }
}

/// `UNetMidBlock2DCrossAttn` (`UNet2DConditionModel`): `Transformer2DModel` attentions.
fn diffusers_cross(ck: &Checkpoint, p: &str, mut config: Map<String, Value>, mut unknown: Vec<String>) -> Found {
    let t0 = format!("{p}attentions.0.transformer_blocks.0.");
    let inner = dim(ck, &format!("{t0}attn1.to_q.weight"), 0).unwrap_or(0);
    config.insert(
        "transformer_layers_per_block".into(),
        json!(count(ck, &format!("{p}attentions.0.transformer_blocks."))),
    );
    config.insert(
        "cross_attention_dim".into(),
        json!(dim(ck, &format!("{t0}attn2.to_k.weight"), 1)),
    );
    let linear = ck
        .shape(&format!("{p}attentions.0.proj_in.weight"))
        .is_some_and(|s| s.len() == 2);
    config.insert("use_linear_projection".into(), json!(linear));
    unknown.insert(
        0,
        format!(
            "num_attention_heads (the config's `num_attention_heads`, or `attention_head_dim` in SD configs; \
             SD 1.x: 8 heads{})",
            if inner.is_multiple_of(64) {
                format!(", SD 2.x / XL: {} heads of 64", inner / 64)
            } else {
                String::new()
            }
        ),
    );
    Found {
        prefix: p.to_string(),
        block: Some(unet_attention::diffusers::UNetMidBlock2DCrossAttn::BLOCK),
        variant: format!(
            "diffusers UNetMidBlock2DCrossAttn (UNet2DConditionModel; {} projections)",
            if linear {
                "linear (SD 2.x / XL)"
            } else {
                "conv (SD 1.x)"
            }
        ),
        config,
        unknown,
        from_config: None,
    }
}

/// `UNetMidBlock2D` (`UNet2DModel`, `AutoencoderKL`, `VQModel`): plain attentions or none;
/// `spatial`: MoVQ's spatial norms.
fn diffusers_2d(
    ck: &Checkpoint,
    p: &str,
    spatial: bool,
    mut config: Map<String, Value>,
    mut unknown: Vec<String>,
) -> Found {
    let c = dim(ck, &format!("{p}resnets.0.conv1.weight"), 1).unwrap_or(0);
    let layers = count(ck, &format!("{p}attentions."));
    let legacy = has(ck, &format!("{p}attentions.0.query.weight"));
    config.insert("num_layers".into(), json!(layers.max(1)));
    config.insert("add_attention".into(), json!(layers > 0));
    if layers > 0 {
        unknown.insert(
            0,
            format!("attention_head_dim (not in the keys; VAE: {c} = one head, UNet2DModel config default 8)"),
        );
    }
    let mut variant = "diffusers UNetMidBlock2D (UNet2DModel / AutoencoderKL / VQModel)".to_string();
    if legacy {
        variant.push_str("; legacy attention keys query/key/value/proj_attn (diffusers <= 0.16 files)");
    }
    if spatial {
        variant.push_str("; spatial norms on the quantized latent (VQModel norm_type=\"spatial\", MoVQ decoder)");
    }
    Found {
        prefix: p.to_string(),
        block: Some(unet_attention::diffusers::UNetMidBlock2D::BLOCK),
        variant,
        config,
        unknown,
        from_config: None,
    }
}

/// `UNetMidBlock2DCrossAttn(dual_cross_attention=True)` (Versatile Diffusion's image U-Net):
/// `DualTransformer2DModel` attentions, two `Transformer2DModel`s each (`transformers.0/1`).
fn diffusers_dual_cross(ck: &Checkpoint, p: &str, mut config: Map<String, Value>, mut unknown: Vec<String>) -> Found {
    let t = format!("{p}attentions.0.transformers.0.");
    let b0 = format!("{t}transformer_blocks.0.");
    let inner = dim(ck, &format!("{b0}attn1.to_q.weight"), 0).unwrap_or(0);
    config.insert("dual_cross_attention".into(), json!(true));
    config.insert(
        "cross_attention_dim".into(),
        json!(dim(ck, &format!("{b0}attn2.to_k.weight"), 1)),
    );
    // DualTransformer2DModel is always built with one layer, conv projections, no upcast; a
    // checkpoint with more layers or linear projections is not what diffusers builds.
    let blocks = count(ck, &format!("{t}transformer_blocks."));
    let linear = ck.shape(&format!("{t}proj_in.weight")).is_some_and(|s| s.len() == 2);
    let mut variant = "diffusers UNetMidBlock2DCrossAttn with dual_cross_attention (Versatile Diffusion image U-Net; \
                       DualTransformer2DModel attentions: transformers.0 image, transformers.1 text)"
        .to_string();
    if blocks != 1 || linear {
        variant.push_str(&format!(
            "; {blocks} transformer blocks{}: diffusers' constructor builds 1 with conv projections, so these \
             weights will not load (a converted pipeline's in-memory U-Net, not a from_pretrained one)",
            if linear { ", linear projections" } else { "" }
        ));
    }
    unknown.insert(
        0,
        format!(
            "num_attention_heads (the config's `attention_head_dim` in SD-style configs, Versatile Diffusion's 8; \
             the heads share {inner} channels)"
        ),
    );
    unknown.push(
        "mix_ratio / condition_lengths / transformer_index_for_condition (pipeline attributes, not in the keys or \
         config.json: 0.5, [77, 257], [1, 0] unless the pipeline sets them; optional keys of the block config)"
            .to_string(),
    );
    Found {
        prefix: p.to_string(),
        block: Some(unet_attention::diffusers::UNetMidBlock2DCrossAttn::BLOCK),
        variant,
        config,
        unknown,
        from_config: None,
    }
}

/// A `ResnetBlock2D`'s `time_embedding_norm` from its `time_emb_proj` output width.
pub(crate) fn time_shift(temb_out: Option<usize>, channels: usize) -> &'static str {
    if temb_out == Some(2 * channels) {
        "scale_shift"
    } else {
        "default"
    }
}

/// `UNetMidBlock2DSimpleCrossAttn` (IF, Kandinsky, UnCLIP): attentions with added key/value
/// projections (`add_k_proj`) and no transformer.
fn diffusers_simple_cross(ck: &Checkpoint, p: &str, mut config: Map<String, Value>, mut unknown: Vec<String>) -> Found {
    let a0 = format!("{p}attentions.0.");
    config.insert(
        "cross_attention_dim".into(),
        json!(dim(ck, &format!("{a0}add_k_proj.weight"), 1)),
    );
    let only_cross = !has(ck, &format!("{a0}to_k.weight"));
    config.insert("only_cross_attention".into(), json!(only_cross));
    let cross_norm = has(ck, &format!("{a0}norm_cross.weight"));
    if !cross_norm {
        config.insert("cross_attention_norm".into(), Value::Null);
    }
    unknown.insert(
        0,
        "attention_head_dim (the per-head width: IF 64; the config's `attention_head_dim`, last entry)".to_string(),
    );
    if cross_norm {
        unknown.push(
            "cross_attention_norm (norm_cross is there: \"layer_norm\" or \"group_norm\", the keys cannot tell)"
                .to_string(),
        );
    }
    unknown.push("skip_time_act (the config's `resnet_skip_time_act`; IF: true)".to_string());
    Found {
        prefix: p.to_string(),
        block: Some(unet_attention::diffusers::UNetMidBlock2DSimpleCrossAttn::BLOCK),
        variant: format!(
            "diffusers UNetMidBlock2DSimpleCrossAttn (UNet2DConditionModel of IF / Kandinsky / UnCLIP; added key/value \
             attention{})",
            if only_cross { ", only_cross_attention" } else { "" }
        ),
        config,
        unknown,
        from_config: None,
    }
}

/// `ControlNetModel`'s bottleneck (`diffusers.ControlNetMidBlock`, at the model's top level):
/// the mid block [`diffusers`] reads at `mid_block.`, plus the 1×1 `controlnet_mid_block`.
fn controlnet(ck: &Checkpoint, p: &str) -> Found {
    use unet_attention::diffusers::{ControlNetMidBlock, UNetMidBlock2D, UNetMidBlock2DCrossAttn};
    let mid = diffusers(ck, &format!("{p}mid_block."));
    let kind = match mid.block {
        Some(b) if b == UNetMidBlock2DCrossAttn::BLOCK => Some("UNetMidBlock2DCrossAttn"),
        Some(b) if b == UNetMidBlock2D::BLOCK => Some("UNetMidBlock2D"),
        _ => None,
    };
    let conv = ck.shape(&format!("{p}controlnet_mid_block.weight")).unwrap_or_default();
    let mut config = Map::new();
    config.insert("mid_block_type".into(), json!(kind));
    config.insert("mid_block".into(), Value::Object(mid.config));
    let mut unknown = mid.unknown;
    unknown.push(
        "global_pool_conditions (the config's; true only for pooled ControlNets such as SD 1.5 shuffle)".to_string(),
    );
    Found {
        prefix: p.to_string(),
        block: kind.map(|_| ControlNetMidBlock::BLOCK),
        variant: format!(
            "diffusers ControlNetModel bottleneck: mid_block ({}) + controlnet_mid_block (1x1 conv {conv:?}); outputs \
             mid_block_res_sample and the mid block's sample",
            mid.variant
                .trim_start_matches("diffusers ")
                .split(" (")
                .next()
                .unwrap_or_default()
        ),
        config,
        unknown,
        from_config: None,
    }
}

fn lucidrains(ck: &Checkpoint, p: &str) -> Found {
    let dim_ = dim(ck, &format!("{p}mid_block1.block1.proj.weight"), 0).unwrap_or(0);
    let mem = ck.shape(&format!("{p}mid_attn.mem_kv"));
    let rms_blocks = has(ck, &format!("{p}mid_block1.block1.norm.g"));
    let version = ck
        .strings
        .iter()
        .find(|(k, _)| k.as_str() == "version" || k.ends_with(".version"))
        .map(|(_, v)| v.clone());
    let mut config = Map::new();
    config.insert("dim".into(), json!(dim_));
    config.insert(
        "time_emb_dim".into(),
        json!(dim(ck, &format!("{p}mid_block1.mlp.1.weight"), 1)),
    );
    let mut unknown = vec![];
    let (block, era) = match (&mem, rms_blocks) {
        (Some(m), true) if m.len() == 4 => {
            config.insert("heads".into(), json!(m[1]));
            config.insert("dim_head".into(), json!(m[3]));
            config.insert("num_mem_kv".into(), json!(m[2]));
            unknown.push("flash (Unet flash_attn; the same math, other rounding in half precision)".into());
            (
                Some(unet_attention::ddpm::MidBlock::BLOCK),
                "2.x (RMSNorm ResNet blocks, memory key/values)",
            )
        }
        (Some(_), false) => (None, "1.9 – 1.11 (GroupNorm ResNet blocks), not implemented"),
        (None, _) if has(ck, &format!("{p}mid_attn.norm.g")) => (None, "1.8.x, not implemented"),
        _ => (None, "before 1.8 (Residual/PreNorm wrappers), not implemented"),
    };
    let version = version.map(|v| format!("; checkpoint version {v}")).unwrap_or_default();
    Found {
        prefix: p.to_string(),
        block,
        variant: format!("lucidrains denoising-diffusion-pytorch Unet bottleneck, {era}{version}"),
        config,
        unknown,
        from_config: None,
    }
}

fn ldm(ck: &Checkpoint, p: &str) -> Found {
    let c = dim(ck, &format!("{p}block_1.conv1.weight"), 1).unwrap_or(0);
    let temb = dim(ck, &format!("{p}block_1.temb_proj.weight"), 1).unwrap_or(0);
    let attn = if has(ck, &format!("{p}attn_1.q.weight")) {
        "vanilla"
    } else if has(ck, &format!("{p}attn_1.to_qkv.weight")) {
        "linear"
    } else {
        "none"
    };
    let mut config = Map::new();
    config.insert("in_channels".into(), json!(c));
    config.insert("temb_channels".into(), json!(temb));
    config.insert("attn_type".into(), json!(attn));
    let what = if temb == 0 { "first-stage VAE" } else { "DDPM Model" };
    Found {
        prefix: p.to_string(),
        block: Some(unet_attention::ldm::mid_block::MidBlock::BLOCK),
        variant: format!("ldm {what} mid block (attn_type {attn})"),
        config,
        unknown: vec![],
        from_config: None,
    }
}

fn openai(ck: &Checkpoint, p: &str) -> Found {
    let c = dim(ck, &format!("{p}0.in_layers.0.weight"), 0).unwrap_or(0);
    let emb = dim(ck, &format!("{p}0.emb_layers.1.weight"), 1).unwrap_or(0);
    let emb_out = dim(ck, &format!("{p}0.emb_layers.1.weight"), 0).unwrap_or(0);
    let mut config = Map::new();
    config.insert("channels".into(), json!(c));
    config.insert("emb_channels".into(), json!(emb));
    config.insert("use_scale_shift_norm".into(), json!(emb_out == 2 * c));
    let mut unknown = vec![];
    let variant = if has(ck, &format!("{p}1.qkv.weight")) {
        config.insert("use_spatial_transformer".into(), json!(false));
        unknown.push("num_heads / num_head_channels (guided-diffusion default 4 heads; 64 channels per head in its released models)".into());
        unknown.push("use_new_attention_order (guided-diffusion and SD: false = legacy order)".into());
        "openai middle_block: ResBlock → AttentionBlock → ResBlock"
    } else {
        let linear = ck.shape(&format!("{p}1.proj_in.weight")).is_some_and(|s| s.len() == 2);
        config.insert("use_spatial_transformer".into(), json!(true));
        config.insert("use_linear_in_transformer".into(), json!(linear));
        config.insert(
            "transformer_depth".into(),
            json!(count(ck, &format!("{p}1.transformer_blocks."))),
        );
        config.insert(
            "context_dim".into(),
            json!(dim(ck, &format!("{p}1.transformer_blocks.0.attn2.to_k.weight"), 1)),
        );
        unknown.push(
            "num_heads / num_head_channels (the model yaml's; SD 1.x: num_heads 8, SD 2.x: num_head_channels 64)"
                .into(),
        );
        if linear {
            "ldm middle_block: ResBlock → SpatialTransformer (linear projections, SD 2.x) → ResBlock"
        } else {
            "ldm middle_block: ResBlock → SpatialTransformer (conv projections, SD 1.x) → ResBlock"
        }
    };
    Found {
        prefix: p.to_string(),
        block: Some(unet_attention::openai::MiddleBlock::BLOCK),
        variant: variant.to_string(),
        config,
        unknown,
        from_config: None,
    }
}
