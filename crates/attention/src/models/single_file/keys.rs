//! Where each diffusers weight lives in an original-layout checkpoint: the key map of diffusers
//! 0.42.1's `convert_ldm_unet_checkpoint` / `convert_ldm_vae_checkpoint`, run backwards (from the
//! name our model asks for to the ldm key), so that a key the model never asks for stays unread
//! and is named by the strict load.

use super::ldm_config::{LdmUNetConfig, LdmVaeConfig};

/// An ldm key and whether its tensor is a 1×1 convolution standing for a linear layer (the VAE's
/// attention: `q`, `k`, `v`, `proj_out` are `(C, C, 1, 1)` in ldm, `(C, C)` in diffusers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LdmKey {
    pub name: String,
    pub conv_as_linear: bool,
}

fn key(name: String) -> Option<LdmKey> {
    Some(LdmKey {
        name,
        conv_as_linear: false,
    })
}

/// `first.rest` split at the first dot, `first` parsed as an index.
fn index(path: &str) -> Option<(usize, &str)> {
    let (first, rest) = path.split_once('.')?;
    Some((first.parse().ok()?, rest))
}

/// A diffusers `ResnetBlock2D` parameter's name inside an ldm `ResBlock`.
fn unet_resnet(rest: &str) -> Option<String> {
    let (layer, param) = rest.split_once('.')?;
    let ldm = match layer {
        "norm1" => "in_layers.0",
        "conv1" => "in_layers.2",
        "norm2" => "out_layers.0",
        "conv2" => "out_layers.3",
        "time_emb_proj" => "emb_layers.1",
        "conv_shortcut" => "skip_connection",
        _ => return None,
    };
    Some(format!("{ldm}.{param}"))
}

/// The ldm key of the U-Net weight diffusers calls `name` (names relative to the U-Net:
/// `conv_in.weight`, `down_blocks.0.attentions.1.proj_in.bias`, ...).
pub fn unet(name: &str, cfg: &LdmUNetConfig) -> Option<LdmKey> {
    let per_level = cfg.num_res_blocks + 1;
    let (head, rest) = name.split_once('.')?;
    match head {
        "time_embedding" => {
            let (layer, param) = rest.split_once('.')?;
            let i = match layer {
                "linear_1" => 0,
                "linear_2" => 2,
                _ => return None,
            };
            key(format!("time_embed.{i}.{param}"))
        }
        // SDXL's added conditions: diffusers' `add_embedding` is sgm's `label_emb.0` (Linear, SiLU, Linear)
        "add_embedding" => {
            let (layer, param) = rest.split_once('.')?;
            let i = match layer {
                "linear_1" => 0,
                "linear_2" => 2,
                _ => return None,
            };
            key(format!("label_emb.0.{i}.{param}"))
        }
        "conv_in" => key(format!("input_blocks.0.0.{rest}")),
        "conv_norm_out" => key(format!("out.0.{rest}")),
        "conv_out" => key(format!("out.2.{rest}")),
        "down_blocks" => {
            let (b, rest) = index(rest)?;
            let (part, rest) = rest.split_once('.')?;
            match part {
                "resnets" | "attentions" => {
                    let (j, rest) = index(rest)?;
                    let block = 1 + b * per_level + j;
                    match part {
                        "resnets" => key(format!("input_blocks.{block}.0.{}", unet_resnet(rest)?)),
                        _ => key(format!("input_blocks.{block}.1.{rest}")),
                    }
                }
                "downsamplers" => {
                    let conv = rest.strip_prefix("0.conv.")?;
                    key(format!("input_blocks.{}.0.op.{conv}", (b + 1) * per_level))
                }
                _ => None,
            }
        }
        "mid_block" => {
            let (part, rest) = rest.split_once('.')?;
            let (i, rest) = index(rest)?;
            match (part, i) {
                ("resnets", 0 | 1) => key(format!("middle_block.{}.{}", 2 * i, unet_resnet(rest)?)),
                ("attentions", 0) => key(format!("middle_block.1.{rest}")),
                _ => None,
            }
        }
        "up_blocks" => {
            let (b, rest) = index(rest)?;
            let (part, rest) = rest.split_once('.')?;
            match part {
                "resnets" | "attentions" => {
                    let (j, rest) = index(rest)?;
                    let block = b * per_level + j;
                    match part {
                        "resnets" => key(format!("output_blocks.{block}.0.{}", unet_resnet(rest)?)),
                        _ => key(format!("output_blocks.{block}.1.{rest}")),
                    }
                }
                "upsamplers" => {
                    let conv = rest.strip_prefix("0.conv.")?;
                    // up block b is level (levels - 1 - b); its upsampler follows the attention when
                    // the level has one
                    let level = cfg.channel_mult.len().checked_sub(1 + b)?;
                    let slot = if cfg.has_attention(level) { 2 } else { 1 };
                    key(format!(
                        "output_blocks.{}.{slot}.conv.{conv}",
                        b * per_level + cfg.num_res_blocks
                    ))
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// A diffusers VAE resnet parameter's name inside an ldm `ResnetBlock` (only the shortcut differs).
fn vae_resnet(rest: &str) -> String {
    match rest.strip_prefix("conv_shortcut.") {
        Some(param) => format!("nin_shortcut.{param}"),
        None => rest.to_string(),
    }
}

/// The mid block of the encoder or decoder (`block_1`, `attn_1`, `block_2`).
fn vae_mid(rest: &str) -> Option<LdmKey> {
    let (part, rest) = rest.split_once('.')?;
    let (i, rest) = index(rest)?;
    match (part, i) {
        ("resnets", 0 | 1) => key(format!("mid.block_{}.{}", i + 1, vae_resnet(rest))),
        ("attentions", 0) => {
            let (layer, param) = rest.rsplit_once('.')?;
            let (ldm, conv_as_linear) = match layer {
                "group_norm" => ("norm", false),
                "to_q" => ("q", true),
                "to_k" => ("k", true),
                "to_v" => ("v", true),
                "to_out.0" => ("proj_out", true),
                _ => return None,
            };
            Some(LdmKey {
                name: format!("mid.attn_1.{ldm}.{param}"),
                conv_as_linear: conv_as_linear && param == "weight",
            })
        }
        _ => None,
    }
}

/// The ldm key of the VAE weight diffusers calls `name` (relative to the VAE: `encoder.conv_in.weight`,
/// `decoder.up_blocks.0.resnets.2.norm1.bias`, `quant_conv.weight`, ...).
pub fn vae(name: &str, cfg: &LdmVaeConfig) -> Option<LdmKey> {
    let levels = cfg.ddconfig.ch_mult.len();
    let (coder, rest) = name.split_once('.')?;
    if matches!(coder, "quant_conv" | "post_quant_conv") {
        return key(name.to_string());
    }
    if !matches!(coder, "encoder" | "decoder") {
        return None;
    }
    let (part, rest) = rest.split_once('.')?;
    let inner = match part {
        "conv_in" | "conv_out" => key(format!("{part}.{rest}")),
        "conv_norm_out" => key(format!("norm_out.{rest}")),
        "mid_block" => vae_mid(rest),
        "down_blocks" | "up_blocks" => {
            let (b, rest) = index(rest)?;
            let (level, kind, sampler) = match part {
                "down_blocks" => (b, "down", "downsample"),
                _ => (levels.checked_sub(1 + b)?, "up", "upsample"),
            };
            let (what, rest) = rest.split_once('.')?;
            match what {
                "resnets" => {
                    let (j, rest) = index(rest)?;
                    key(format!("{kind}.{level}.block.{j}.{}", vae_resnet(rest)))
                }
                "downsamplers" | "upsamplers" => key(format!("{kind}.{level}.{sampler}.{}", rest.strip_prefix("0.")?)),
                _ => None,
            }
        }
        _ => None,
    }?;
    Some(LdmKey {
        name: format!("{coder}.{}", inner.name),
        ..inner
    })
}

/// A module path (`down_blocks.0.resnets.1`) as a stage name (`down_blocks.0/resnets.1`): the
/// export scripts' rule, a numeric part joining the level before it.
fn stage_name(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for (i, part) in path.split('.').enumerate() {
        if i > 0 {
            out.push(if part.bytes().all(|b| b.is_ascii_digit()) {
                '.'
            } else {
                '/'
            });
        }
        out.push_str(part);
    }
    out
}

/// The ldm stage name of the diffusers stage `stage` (`down_blocks.0/resnets.1/norm2`), found
/// through the key map: the module path with a parameter name appended (`.weight`, or that of a
/// child for a module without parameters of its own), mapped, and the parameter stripped again.
/// `None` for a stage ldm has no module for (activations, `time_proj`, whole down / up blocks):
/// it is left out of the trace.
fn stage_via(
    stage: &str,
    wholes: &[(&str, &str)],
    children: &[(&str, &str)],
    map: impl Fn(&str) -> Option<LdmKey>,
) -> Option<String> {
    let path = stage.replace('/', ".");
    if let Some((_, ldm)) = wholes.iter().find(|(d, _)| *d == path) {
        return Some(ldm.to_string());
    }
    children.iter().find_map(|(child, ldm_child)| {
        let key = map(&format!("{path}{child}"))?;
        if key.conv_as_linear {
            // the VAE's linear projections are 1×1 convolutions in ldm: other output layouts
            return None;
        }
        key.name.strip_suffix(ldm_child).map(stage_name)
    })
}

/// `stage_via` for the U-Net: the ldm stage name of a diffusers stage, `None` for one ldm has no module for.
pub fn unet_stage(stage: &str, cfg: &LdmUNetConfig) -> Option<String> {
    let wholes = [("time_embedding", "time_embed"), ("mid_block", "middle_block")];
    let children = [
        (".weight", ".weight"),
        (".norm1.weight", ".in_layers.0.weight"),
        (".conv.weight", ".op.weight"),
        (".conv.weight", ".conv.weight"),
    ];
    stage_via(stage, &wholes, &children, |n| unet(n, cfg))
}

/// `stage_via` for the VAE (its attention's inner stages are left out: ldm computes them as
/// 1×1 convolutions over channels, diffusers as linear layers over tokens).
pub fn vae_stage(stage: &str, cfg: &LdmVaeConfig) -> Option<String> {
    let wholes = [
        ("encoder.mid_block", "encoder.mid"),
        ("decoder.mid_block", "decoder.mid"),
    ];
    let children = [
        (".weight", ".weight"),
        (".norm1.weight", ".norm1.weight"),
        (".group_norm.weight", ".norm.weight"),
        (".conv.weight", ".conv.weight"),
    ];
    stage_via(stage, &wholes, &children, |n| vae(n, cfg))
}
