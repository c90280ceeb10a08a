//! The Rust constructors (`new`, `Default`) of the configs the blocks build for each other give
//! what deserializing the PyTorch constructor's required arguments gives: the serde defaults
//! and the Rust defaults cannot drift apart.

use super::attention::AttentionConfig;
use super::feed_forward::FeedForwardConfig;
use super::resnet::ResnetBlock2DConfig;
use super::transformers::dual_transformer::{DualMix, DualTransformer2DModelConfig};
use super::transformers::temporal::TransformerTemporalModelConfig;
use super::transformers::transformer::{BasicTransformerBlockConfig, Transformer2DModelConfig};
use super::transformers::transformer_spatio_temporal::TransformerSpatioTemporalModelConfig;
use super::unets::mid_block::{ResnetKwargs, TransformerKwargs, UNetMidBlock2DConfig, UNetMidBlock2DCrossAttnConfig};
use super::unets::mid_block_3d::UNetMidBlock3DCrossAttnConfig;
use super::unets::mid_block_motion::UNetMidBlockCrossAttnMotionConfig;
use super::unets::mid_block_simple_cross::UNetMidBlock2DSimpleCrossAttnConfig;
use super::unets::mid_block_spatio_temporal::UNetMidBlockSpatioTemporalConfig;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

/// `built` equals the config `required` deserializes to, compared as the kwargs they write.
fn same<T: DeserializeOwned + Serialize>(required: Value, built: T) {
    let parsed: T = crate::config::from_json("test", &required).unwrap();
    let (parsed, built) = (
        serde_json::to_value(parsed).unwrap(),
        serde_json::to_value(built).unwrap(),
    );
    assert_eq!(parsed, built, "{required}");
}

#[test]
fn new_matches_serde_defaults() {
    same(json!({"query_dim": 40}), AttentionConfig::new(40));
    same(json!({"in_channels": 40}), ResnetBlock2DConfig::new(40));
    same(json!({"dim": 40}), FeedForwardConfig::new(40));
    same(
        json!({"dim": 40, "num_attention_heads": 2, "attention_head_dim": 20}),
        BasicTransformerBlockConfig::new(40, 2, 20),
    );
    same(json!({}), Transformer2DModelConfig::default());
    same(json!({}), DualTransformer2DModelConfig::default());
    same(json!({}), DualMix::default());
    same(json!({}), TransformerTemporalModelConfig::default());
    same(json!({}), TransformerSpatioTemporalModelConfig::default());
    let required = json!({"in_channels": 64, "temb_channels": 32});
    same(required.clone(), UNetMidBlock2DConfig::new(64, Some(32)));
    same(required.clone(), UNetMidBlock2DCrossAttnConfig::new(64, Some(32)));
    same(required.clone(), UNetMidBlock2DSimpleCrossAttnConfig::new(64, Some(32)));
    same(required.clone(), UNetMidBlock3DCrossAttnConfig::new(64, Some(32)));
    same(required.clone(), UNetMidBlockCrossAttnMotionConfig::new(64, Some(32)));
    same(required.clone(), UNetMidBlockSpatioTemporalConfig::new(64, Some(32)));
    same(
        json!({"in_channels": 64, "temb_channels": null}),
        UNetMidBlock2DConfig::new(64, None),
    );
}

/// The shared sub-configs' `Default`s are the defaults of the flat fields they stand for.
#[test]
fn shared_kwargs_defaults() {
    let cross = UNetMidBlock2DCrossAttnConfig::new(64, Some(32));
    assert_eq!(cross.resnet_kwargs(), ResnetKwargs::default());
    assert_eq!(cross.transformer_kwargs(), TransformerKwargs::default());
    assert_eq!(
        UNetMidBlock3DCrossAttnConfig::new(8, None).resnet_kwargs(),
        ResnetKwargs::default()
    );
}

/// The flat kwargs are written back as read (shared fields included), unknown keys are refused
/// naming the key, and the string choices keep their names.
#[test]
fn kwargs_stay_flat_and_strict() {
    let kwargs = json!({"in_channels": 64, "temb_channels": 32, "resnet_eps": 1e-5, "resnet_groups": 16,
        "resnet_time_scale_shift": "scale_shift", "num_attention_heads": 8, "attention_type": "default"});
    let cfg: UNetMidBlock2DCrossAttnConfig = crate::config::from_json("test", &kwargs).unwrap();
    let back = serde_json::to_value(&cfg).unwrap();
    for (k, v) in kwargs.as_object().unwrap() {
        assert_eq!(&back[k], v, "{k}");
    }
    let mut bad = kwargs.clone();
    bad["resnet_bogus"] = json!(1);
    let e = crate::config::from_json::<UNetMidBlock2DCrossAttnConfig>("test", &bad).unwrap_err();
    assert!(e.to_string().contains("resnet_bogus"), "{e}");
    bad = kwargs.clone();
    bad["resnet_time_scale_shift"] = json!("film");
    let e = crate::config::from_json::<UNetMidBlockCrossAttnMotionConfig>("test", &bad).unwrap_err();
    assert!(
        e.to_string().contains("unknown resnet_time_scale_shift \"film\""),
        "{e}"
    );
    bad = kwargs;
    bad["attention_type"] = json!("gated-text-image");
    let cfg: UNetMidBlock2DCrossAttnConfig = crate::config::from_json("test", &bad).unwrap();
    assert_eq!(serde_json::to_value(cfg).unwrap()["attention_type"], "gated-text-image");
}
