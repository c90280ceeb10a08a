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

/// Parse a block config from a JSON string.
pub fn from_str<T: DeserializeOwned>(block: &'static str, config: &str) -> Result<T> {
    let value: serde_json::Value = serde_json::from_str(config).map_err(|e| Error::config(block, e.to_string()))?;
    from_json(block, &value)
}

/// `true` for the serde default of boolean flags that PyTorch defaults to `True`.
pub(crate) fn yes() -> bool {
    true
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
