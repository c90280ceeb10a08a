//! ControlNet-XS (diffusers 0.42.1 `controlnets/controlnet_xs.py`), read like the others in
//! [`super`]:
//!
//! * `UNetControlNetXSModel` (a U-Net fused with a ControlNet-XS adapter): after its checks
//!   (`time_embedding_mix` in `[0, 1]`, below 1 only with `ctrl_learn_time_embedding`;
//!   `addition_embed_type` null or `"text_time"`), with `transformer_layers_per_block`,
//!   `cross_attention_dim`, `num_attention_heads` and `ctrl_num_attention_heads` made per-block,
//!   `ControlNetXSCrossAttnMidBlock2D(base_channels=block_out_channels[-1],
//!   ctrl_channels=ctrl_block_out_channels[-1], temb_channels=block_out_channels[0] * 4,
//!   norm_num_groups, ctrl_max_norm_num_groups, transformer_layers_per_block[-1],
//!   base_num_attention_heads=num_attention_heads[-1],
//!   ctrl_num_attention_heads=ctrl_num_attention_heads[-1], cross_attention_dim[-1],
//!   upcast_attention, use_linear_projection)` at `mid_block`;
//! * a `ControlNetXSAdapter` config (the control half alone) is refused with what to do
//!   ([`CONTROLNET_XS_ADAPTER`]): its `mid_block` (`MidBlockControlNetXSAdapter`) has no base mid
//!   block, so there is no `ControlNetXSCrossAttnMidBlock2D` in it.

use super::{bad, Cfg, MidBlockSpec};
use crate::diffusers::controlnets::controlnet_xs::ControlNetXSCrossAttnMidBlock2D;
use crate::Result;
use serde_json::{json, Value};

/// `UNetControlNetXSModel.__init__`'s keyword arguments (diffusers 0.42.1).
pub const UNET_CONTROLNET_XS_KEYS: &[&str] = &[
    "sample_size",
    "down_block_types",
    "up_block_types",
    "block_out_channels",
    "norm_num_groups",
    "cross_attention_dim",
    "transformer_layers_per_block",
    "num_attention_heads",
    "addition_embed_type",
    "addition_time_embed_dim",
    "upcast_attention",
    "use_linear_projection",
    "time_cond_proj_dim",
    "projection_class_embeddings_input_dim",
    "time_embedding_mix",
    "ctrl_conditioning_channels",
    "ctrl_conditioning_embedding_out_channels",
    "ctrl_conditioning_channel_order",
    "ctrl_learn_time_embedding",
    "ctrl_block_out_channels",
    "ctrl_num_attention_heads",
    "ctrl_max_norm_num_groups",
];

/// What `model_config` and `detect` say about a `ControlNetXSAdapter`.
pub const CONTROLNET_XS_ADAPTER: &str = "a ControlNetXSAdapter (ControlNet-XS's control half alone: its \
     `mid_block` is a MidBlockControlNetXSAdapter, `mid_block.base_to_ctrl`, `mid_block.midblock`, \
     `mid_block.ctrl_to_base`, with no base mid block) is not a whole ControlNetXSCrossAttnMidBlock2D. Load it into \
     a UNetControlNetXSModel with its base U-Net (`UNetControlNetXSModel.from_unet(unet, controlnet)`, as \
     StableDiffusionControlNetXSPipeline's users do), `save_pretrained` that, and use the saved model's config.json \
     and weights (the block at `mid_block.`)";

/// `UNetControlNetXSModel.__init__` (see the module docs).
pub(super) fn unet_controlnet_xs(c: &Cfg) -> Result<MidBlockSpec> {
    let mix = c.value("time_embedding_mix", json!(1.0));
    let mix = mix
        .as_f64()
        .ok_or_else(|| bad(format!("`time_embedding_mix` must be a number, found {mix}")))?;
    if !(0.0..=1.0).contains(&mix) {
        return Err(bad(format!(
            "`time_embedding_mix` {mix}: UNetControlNetXSModel raises \"`time_embedding_mix` needs to be between 0 and 1\""
        )));
    }
    if mix < 1.0 && c.value("ctrl_learn_time_embedding", json!(false)) != json!(true) {
        return Err(bad(format!(
            "`time_embedding_mix` {mix} without `ctrl_learn_time_embedding`: UNetControlNetXSModel raises \"To use \
             `time_embedding_mix` < 1, `ctrl_learn_time_embedding` must be `True`\""
        )));
    }
    let addition = c.value("addition_embed_type", Value::Null);
    if !(addition.is_null() || addition == json!("text_time")) {
        return Err(bad(format!(
            "`addition_embed_type` {addition}: UNetControlNetXSModel takes null or \"text_time\" (SD and SDXL only)"
        )));
    }
    let (first, last) = c.last_channels(&[320, 640, 1280, 1280])?;
    let ctrl = c.usize_list("ctrl_block_out_channels", &[4, 8, 16, 16])?;
    let ctrl_last = *ctrl.last().ok_or_else(|| bad("`ctrl_block_out_channels` is empty"))?;
    Ok(MidBlockSpec {
        block: ControlNetXSCrossAttnMidBlock2D::BLOCK,
        config: json!({
            "base_channels": last,
            "ctrl_channels": ctrl_last,
            "temb_channels": first * 4,
            "norm_num_groups": c.value("norm_num_groups", json!(32)),
            "ctrl_max_norm_num_groups": c.value("ctrl_max_norm_num_groups", json!(32)),
            "transformer_layers_per_block": c.last_of("transformer_layers_per_block", json!(1))?,
            "base_num_attention_heads": c.last_of("num_attention_heads", json!(8))?,
            "ctrl_num_attention_heads": c.last_of("ctrl_num_attention_heads", json!(4))?,
            "cross_attention_dim": c.last_of("cross_attention_dim", json!(1024))?,
            "upcast_attention": c.value("upcast_attention", json!(true)),
            "use_linear_projection": c.value("use_linear_projection", json!(true)),
        }),
        prefix: "mid_block",
    })
}

#[cfg(test)]
mod tests {
    use super::super::mid_blocks;
    use crate::diffusers::ControlNetXSCrossAttnMidBlock2DConfig;
    use serde_json::{json, Value};

    fn err(config: Value) -> String {
        mid_blocks(&config, None, false).unwrap_err().to_string()
    }

    #[test]
    fn unet_controlnet_xs_configs_give_the_mid_block() {
        // UNetControlNetXSModel's defaults (SD 2.1 with the 'UmerDebugger/controlnet-xs' adapter sizes)
        let s = mid_blocks(&json!({"_class_name": "UNetControlNetXSModel"}), None, false).unwrap();
        assert_eq!(
            (s.len(), s[0].block, s[0].prefix),
            (1, "diffusers.ControlNetXSCrossAttnMidBlock2D", "mid_block")
        );
        assert_eq!(
            s[0].config,
            json!({"base_channels": 1280, "ctrl_channels": 16, "temb_channels": 1280, "norm_num_groups": 32,
                "ctrl_max_norm_num_groups": 32, "transformer_layers_per_block": 1, "base_num_attention_heads": 8,
                "ctrl_num_attention_heads": 4, "cross_attention_dim": 1024, "upcast_attention": true,
                "use_linear_projection": true})
        );
        let cfg: ControlNetXSCrossAttnMidBlock2DConfig = crate::config::from_json("test", &s[0].config).unwrap();
        assert_eq!(cfg.ctrl_groups().unwrap(), 16);
        // SDXL-like: per-block lists take their last entry
        let s = mid_blocks(
            &json!({"_class_name": "UNetControlNetXSModel", "block_out_channels": [320, 640, 1280],
                "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
                "transformer_layers_per_block": [0, 2, 10], "num_attention_heads": [5, 10, 20],
                "ctrl_num_attention_heads": [1, 2, 3], "ctrl_block_out_channels": [16, 32, 64],
                "cross_attention_dim": 2048, "addition_embed_type": "text_time", "upcast_attention": false}),
            None,
            false,
        )
        .unwrap();
        let c = &s[0].config;
        assert_eq!(
            (&c["base_channels"], &c["ctrl_channels"], &c["temb_channels"]),
            (&json!(1280), &json!(64), &json!(1280))
        );
        assert_eq!(
            (
                &c["transformer_layers_per_block"],
                &c["base_num_attention_heads"],
                &c["ctrl_num_attention_heads"]
            ),
            (&json!(10), &json!(20), &json!(3))
        );
        assert_eq!(
            (&c["cross_attention_dim"], &c["upcast_attention"]),
            (&json!(2048), &json!(false))
        );
    }

    #[test]
    fn unet_controlnet_xs_errors_and_the_adapter_are_named() {
        let xs = |extra: Value| {
            let mut c = json!({"_class_name": "UNetControlNetXSModel"});
            for (k, v) in extra.as_object().unwrap() {
                c[k] = v.clone();
            }
            c
        };
        let e = err(xs(json!({"time_embedding_mix": 1.5})));
        assert!(e.contains("between 0 and 1"), "{e}");
        let e = err(xs(json!({"time_embedding_mix": 0.5})));
        assert!(e.contains("ctrl_learn_time_embedding"), "{e}");
        assert!(mid_blocks(
            &xs(json!({"time_embedding_mix": 0.5, "ctrl_learn_time_embedding": true})),
            None,
            false
        )
        .is_ok());
        let e = err(xs(json!({"addition_embed_type": "text"})));
        assert!(e.contains("addition_embed_type"), "{e}");
        let e = err(xs(json!({"ctrl_block_out_channels": []})));
        assert!(e.contains("ctrl_block_out_channels"), "{e}");
        let e = err(xs(json!({"global_pool_conditions": false})));
        assert!(e.contains("global_pool_conditions"), "{e}");
        let e = err(json!({"_class_name": "ControlNetXSAdapter", "block_out_channels": [4, 8, 16, 16]}));
        assert!(e.contains("UNetControlNetXSModel.from_unet(unet, controlnet)"), "{e}");
    }
}
