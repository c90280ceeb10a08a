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
    serde_json::from_value(config.clone()).map_err(|e| Error::config(block, e.to_string()))
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
