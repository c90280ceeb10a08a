//! Block configs deserialize from the PyTorch constructor's keyword arguments.
//!
//! Every config struct uses `#[serde(deny_unknown_fields)]`, so a key the constructor does not
//! have is an error that names it, and Python's `None` is JSON `null`.

use crate::{Error, Result};
use serde::de::DeserializeOwned;

/// Parse a block config from a JSON object of constructor keyword arguments.
pub fn from_json<T: DeserializeOwned>(block: &'static str, config: &serde_json::Value) -> Result<T> {
    if !config.is_object() {
        return Err(Error::config(
            block,
            format!("expected a JSON object of constructor kwargs, found {config}"),
        ));
    }
    check_integers(block, config, "")?;
    serde_json::from_value(config.clone()).map_err(|e| Error::config(block, e.to_string()))
}

/// The largest magnitude an integer in a config may have. Channels, heads and layer counts of
/// real models are far below it; refusing larger values up front keeps size arithmetic such as
/// `3 * heads * dim_head` far from overflow, and a `depth` of 2^40 from allocating.
pub const MAX_CONFIG_INT: u64 = 1 << 20;

pub(crate) fn check_integers(block: &'static str, value: &serde_json::Value, key: &str) -> Result<()> {
    match value {
        serde_json::Value::Number(n) => {
            let magnitude = n.as_u64().or_else(|| n.as_i64().map(|i| i.unsigned_abs()));
            if magnitude.is_some_and(|m| m > MAX_CONFIG_INT) {
                return Err(Error::config(
                    block,
                    format!("`{key}` is {n}; integers beyond ±{MAX_CONFIG_INT} (2^20) are not accepted"),
                ));
            }
            Ok(())
        }
        serde_json::Value::Array(items) => items
            .iter()
            .enumerate()
            .try_for_each(|(i, v)| check_integers(block, v, &format!("{key}[{i}]"))),
        serde_json::Value::Object(map) => map.iter().try_for_each(|(k, v)| {
            let key = if key.is_empty() {
                k.clone()
            } else {
                format!("{key}.{k}")
            };
            check_integers(block, v, &key)
        }),
        _ => Ok(()),
    }
}

/// The constructor kwargs of a diffusers `config.json` object: keys starting with `_`
/// (`_class_name`, `_diffusers_version`, `_name_or_path`) are metadata and dropped; a
/// `_class_name` other than `class` is an error naming both.
pub fn class_kwargs(block: &'static str, config: &serde_json::Value, class: &str) -> Result<serde_json::Value> {
    let obj = config
        .as_object()
        .ok_or_else(|| Error::config(block, "config.json: expected a JSON object"))?;
    match obj.get("_class_name").and_then(serde_json::Value::as_str) {
        None => {}
        Some(found) if found == class => {}
        Some(other) => {
            return Err(Error::config(
                block,
                format!("config.json describes a `{other}`, expected `{class}`"),
            ))
        }
    }
    let kwargs = obj
        .iter()
        .filter(|(k, _)| !k.starts_with('_'))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Ok(serde_json::Value::Object(kwargs))
}

/// Parse a block config from a JSON string.
pub fn from_str<T: DeserializeOwned>(block: &'static str, config: &str) -> Result<T> {
    let value: serde_json::Value = serde_json::from_str(config).map_err(|e| Error::config(block, e.to_string()))?;
    from_json(block, &value)
}

/// The serde defaults of every config in the crate: the PyTorch constructors' default values,
/// written once. A config's `#[serde(default = "...")]` and its Rust constructor (`new`,
/// `Default`) both call these, so the two cannot disagree (each config has a test that
/// deserializing its required arguments gives what its constructor gives).
///
/// Integers take their value as a const parameter (`usize::<32>`, `some::<32>`), so one
/// function serves every integer default. Defaults of a block family's own enums are their
/// `Default` impls (`#[serde(default)]`), except `resnet_act_fn`'s `swish`: `Activation` lives
/// on the `layers` layer above this one, so its one default function is
/// `crate::diffusers::resnet::swish`.
pub(crate) mod defaults {
    /// An integer default (`usize::<32>` is PyTorch's `=32`).
    pub(crate) fn usize<const N: usize>() -> usize {
        N
    }
    /// An integer default of an `Optional[int]` argument (`some::<32>`: `=32`, not `None`).
    pub(crate) fn some<const N: usize>() -> Option<usize> {
        Some(N)
    }
    /// `-1` (openai's `num_head_channels=-1`, `num_heads_upsample=-1`).
    pub(crate) fn minus_one() -> i64 {
        -1
    }
    /// `True`, the default of the boolean flags that PyTorch defaults to `True`.
    pub(crate) fn yes() -> bool {
        true
    }
    /// `Optional[bool]` defaulting to `True`.
    pub(crate) fn some_yes() -> Option<bool> {
        Some(true)
    }
    /// `1.0` (`output_scale_factor`, `rescale_output_factor`).
    pub(crate) fn one_f() -> f64 {
        1.0
    }
    /// `0.5` (`DualTransformer2DModel.mix_ratio`).
    pub(crate) fn half() -> f64 {
        0.5
    }
    /// `4.0` (`FeedForward(mult=4)`).
    pub(crate) fn four_f() -> f64 {
        4.0
    }
    /// `1e-5`: PyTorch's `GroupNorm` / `LayerNorm` eps, diffusers' `Attention.eps`, `norm_eps`.
    pub(crate) fn eps_1e5() -> f64 {
        1e-5
    }
    /// `1e-6`: diffusers' resnet and mid-block `resnet_eps`.
    pub(crate) fn eps_1e6() -> f64 {
        1e-6
    }
    /// A pair of integers (`DualTransformer2DModel`'s `condition_lengths=[77, 257]`,
    /// `transformer_index_for_condition=[1, 0]`).
    pub(crate) fn pair<const A: usize, const B: usize>() -> [usize; 2] {
        [A, B]
    }
    /// `"layer_norm"` (`norm_type` of diffusers' transformers).
    pub(crate) fn layer_norm() -> String {
        "layer_norm".into()
    }
    /// `"UNetMidBlock2DCrossAttn"` (`ControlNetModel.mid_block_type`).
    pub(crate) fn cross_attn_mid_block() -> String {
        "UNetMidBlock2DCrossAttn".into()
    }
}

/// Check that `heads` divides `channels`, as every multi-head block requires.
pub(crate) fn check_divides(block: &'static str, channels: usize, heads: usize) -> Result<usize> {
    if heads == 0 || !channels.is_multiple_of(heads) {
        return Err(Error::config(
            block,
            format!("{heads} heads do not divide {channels} channels"),
        ));
    }
    Ok(channels / heads)
}
