//! [`Cfg`]: typed access to a `config.json`'s keys with the class defaults, and the
//! per-block-list reads (`last_of`, ...) every model class uses.

use super::bad;
use crate::Result;
use serde_json::{json, Map, Value};

/// Typed access to config keys with the class defaults.
pub(super) struct Cfg<'a>(pub(super) &'a Map<String, Value>);

impl Cfg<'_> {
    pub(super) fn value(&self, key: &str, default: Value) -> Value {
        match self.0.get(key) {
            Some(v) => v.clone(),
            None => default,
        }
    }

    pub(super) fn usize_list(&self, key: &str, default: &[usize]) -> Result<Vec<usize>> {
        match self.0.get(key) {
            None => Ok(default.to_vec()),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| {
                    v.as_u64()
                        .map(|n| n as usize)
                        .ok_or_else(|| bad(format!("`{key}` holds {v}, not a count")))
                })
                .collect(),
            Some(v) => Err(bad(format!("`{key}` must be a list, found {v}"))),
        }
    }

    pub(super) fn last_channels(&self, default: &[usize]) -> Result<(usize, usize)> {
        let channels = self.usize_list("block_out_channels", default)?;
        match (channels.first(), channels.last()) {
            (Some(&first), Some(&last)) => Ok((first, last)),
            _ => Err(bad("`block_out_channels` is empty")),
        }
    }

    /// What the model's `__init__` checks before it builds anything, for the keys a mid block
    /// config reads or that only type-check there: the per-down-block lists (`attention_head_dim`,
    /// `num_attention_heads`, `cross_attention_dim`, `only_cross_attention`, `layers_per_block`,
    /// `transformer_layers_per_block`) hold one entry per down block, and the counts among them
    /// are whole numbers (a `layers_per_block` of `1e308` is not a model).
    pub(super) fn check_shapes(&self, default_blocks: usize) -> Result<()> {
        self.check_eps()?;
        // Every model class indexes its first down block (`block_out_channels[0]`): none is no model.
        if matches!(self.0.get("down_block_types"), Some(Value::Array(types)) if types.is_empty()) {
            return Err(bad(
                "`down_block_types` is empty; the model has at least one down block",
            ));
        }
        let blocks = match (self.0.get("down_block_types"), self.0.get("block_out_channels")) {
            (Some(Value::Array(types)), _) => Some(types.len()),
            (_, Some(Value::Array(channels))) => Some(channels.len()),
            (None, None) => Some(default_blocks),
            _ => None,
        };
        const PER_BLOCK: [&str; 6] = [
            "attention_head_dim",
            "num_attention_heads",
            "cross_attention_dim",
            "only_cross_attention",
            "layers_per_block",
            "transformer_layers_per_block",
        ];
        for key in PER_BLOCK {
            let Some(value) = self.0.get(key) else { continue };
            if let (Value::Array(items), Some(n)) = (value, blocks) {
                if items.len() != n {
                    return Err(bad(format!(
                        "`{key}` has {} entries; the model takes one per down block ({n})",
                        items.len()
                    )));
                }
            }
            if key == "only_cross_attention" {
                continue;
            }
            // Whole numbers, or lists of them (of lists, for transformer_layers_per_block);
            // null where the class default is computed.
            fn counts(v: &Value) -> bool {
                match v {
                    Value::Null => true,
                    Value::Number(n) => n.is_u64(),
                    Value::Array(items) => items.iter().all(counts),
                    _ => false,
                }
            }
            if !counts(value) {
                return Err(bad(format!(
                    "`{key}` must be a whole number or a list of them, found {value}"
                )));
            }
        }
        Ok(())
    }

    /// Every `*eps` key (`norm_eps`, `resnet_eps`, ...) a finite number > 0: diffusers takes a
    /// negative one and its blocks output NaN.
    fn check_eps(&self) -> Result<()> {
        for (key, value) in self.0.iter().filter(|(k, _)| *k == "eps" || k.ends_with("_eps")) {
            let ok = value.as_f64().is_some_and(|e| e.is_finite() && e > 0.0);
            if !ok && !value.is_null() {
                return Err(bad(format!("`{key}` must be a finite number > 0, found {value}")));
            }
        }
        Ok(())
    }

    /// An int-or-list key's last entry (`cross_attention_dim: 768` or `[..., 1280]`).
    pub(super) fn last_of(&self, key: &str, default: Value) -> Result<Value> {
        match self.value(key, default) {
            Value::Array(items) => items
                .last()
                .cloned()
                .ok_or_else(|| bad(format!("`{key}` is an empty list"))),
            v => Ok(v),
        }
    }

    pub(super) fn time_embed_dim(&self, first: usize, fourier_factor: usize) -> Result<Value> {
        match self.0.get("time_embedding_dim") {
            Some(Value::Null) | None => Ok(json!(first * fourier_factor)),
            Some(v) => Ok(v.clone()),
        }
    }
}
