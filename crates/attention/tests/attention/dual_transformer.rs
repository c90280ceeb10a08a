//! Versatile Diffusion's dual mid block as a user builds it: from a `config.json` with
//! `dual_cross_attention: true`, with the pipeline's attributes set on the built block, and from
//! two separate U-Nets' parts (`into_dual`, as the pipeline's `_convert_to_dual_attention` pairs
//! them). Held against PyTorch's outputs in the committed bundles of `weights/models/diffusers_vd`.

use crate::common::{max_diff, weights};
use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use std::collections::HashMap;
use unet_attention::diffusers::{
    model_config, DualMix, Transformer2DModel, Transformer2DModelConfig, UNetMidBlock2DCrossAttn,
    UNetMidBlock2DCrossAttnConfig,
};

fn checkpoint() -> VarBuilder<'static> {
    let file = weights("models/diffusers_vd/diffusion_pytorch_model.safetensors");
    // SAFETY: the committed file is not modified while mapped.
    unsafe { VarBuilder::from_mmaped_safetensors(&[file], DType::F32, &Device::Cpu).unwrap() }
}

fn bundle(name: &str) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(weights(&format!("mid/{name}.safetensors")), &Device::Cpu).unwrap()
}

fn run(block: &UNetMidBlock2DCrossAttn, r: &HashMap<String, Tensor>) -> Tensor {
    let input = |k: &str| &r[&format!("parity.input.{k}")];
    block
        .forward(
            input("hidden_states"),
            Some(input("temb")),
            Some(input("encoder_hidden_states")),
            None,
            None,
        )
        .unwrap()
}

/// The mid block's config from the model's `config.json`.
fn mid_config() -> UNetMidBlock2DCrossAttnConfig {
    let text = std::fs::read_to_string(weights("models/diffusers_vd/config.json")).unwrap();
    let specs = model_config::mid_blocks(&serde_json::from_str(&text).unwrap(), None, false).unwrap();
    assert_eq!(specs[0].block, UNetMidBlock2DCrossAttn::BLOCK);
    serde_json::from_value(specs[0].config.clone()).unwrap()
}

#[test]
fn config_json_builds_the_dual_block_and_set_transformer_params_changes_it() {
    let cfg = mid_config();
    assert!(cfg.dual_cross_attention);
    let mut block = UNetMidBlock2DCrossAttn::new(checkpoint().pp("mid_block"), &cfg).unwrap();
    assert!(block.is_dual());
    let r = bundle("unet_mid_block_2d_cross_attn_dual_ref");
    let torch = &r["parity.output.output"];
    assert!(max_diff(&run(&block, &r), torch) < 1e-5);
    // The attributes the non-default bundle was captured with, set as the pipeline sets them.
    let mix = DualMix {
        mix_ratio: 0.3,
        condition_lengths: [5, 9],
        transformer_index_for_condition: [0, 1],
    };
    block.set_transformer_params(mix).unwrap();
    let m = bundle("unet_mid_block_2d_cross_attn_dual_mix");
    assert!(max_diff(&run(&block, &m), &m["parity.output.output"]) < 1e-5);
    // An index past the two transformers is refused.
    let bad = DualMix {
        transformer_index_for_condition: [0, 2],
        ..mix
    };
    assert!(block.set_transformer_params(bad).is_err());
}

/// The image U-Net's mid block (not dual: its transformer at `attentions.0`) and the text U-Net's
/// mid-block transformer, paired: the same block as the dual checkpoint's.
#[test]
fn into_dual_pairs_an_image_and_a_text_transformer_as_the_pipeline_does() {
    let mut cfg = mid_config();
    cfg.dual_cross_attention = false;
    // The image U-Net's keys: `attentions.0.*` are the dual checkpoint's `transformers.0`.
    let image_vb = checkpoint()
        .rename_f(|name: &str| name.replacen("mid_block.attentions.0.", "mid_block.attentions.0.transformers.0.", 1));
    let image = UNetMidBlock2DCrossAttn::new(image_vb.pp("mid_block"), &cfg).unwrap();
    // DualTransformer2DModel(...) in UNetMidBlock2DCrossAttn: norm_num_groups=resnet_groups,
    // one layer, the same as the image block's transformer here.
    let t: Transformer2DModelConfig = serde_json::from_value(serde_json::json!({
        "num_attention_heads": 2, "attention_head_dim": 8, "in_channels": 16,
        "cross_attention_dim": 8, "norm_num_groups": 4,
    }))
    .unwrap();
    let text = Transformer2DModel::new(checkpoint().pp("mid_block.attentions.0.transformers.1"), &t).unwrap();
    assert!(image.clone().into_dual(vec![], DualMix::default()).is_err());
    let dual = image.into_dual(vec![text], DualMix::default()).unwrap();
    let r = bundle("unet_mid_block_2d_cross_attn_dual_ref");
    let direct = UNetMidBlock2DCrossAttn::new(checkpoint().pp("mid_block"), &mid_config()).unwrap();
    assert_eq!(max_diff(&run(&dual, &r), &run(&direct, &r)), 0.0);
}
