//! A `VarBuilder` backend over a bundle's state dict that records which tensors a block
//! loaded, so unused weights are reported instead of silently ignored, and that names the
//! missing key or the expected and found shapes when a load fails.

use candle_core::{DType, Device, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::VarBuilder;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

/// A state dict that remembers what was read from it.
#[derive(Clone)]
pub struct TrackedWeights {
    tensors: Arc<BTreeMap<String, Tensor>>,
    used: Arc<Mutex<BTreeSet<String>>>,
}

impl TrackedWeights {
    pub fn new(tensors: BTreeMap<String, Tensor>) -> Self {
        Self {
            tensors: Arc::new(tensors),
            used: Arc::default(),
        }
    }

    /// A `VarBuilder` over these weights converting floating tensors to `dtype` on `device`.
    pub fn var_builder(&self, dtype: DType, device: &Device) -> VarBuilder<'static> {
        VarBuilder::from_backend(Box::new(self.clone()), dtype, device.clone())
    }

    /// Names no block read, sorted.
    pub fn unused(&self) -> Vec<String> {
        let used = self.used.lock().map(|u| u.clone()).unwrap_or_default();
        self.tensors.keys().filter(|k| !used.contains(*k)).cloned().collect()
    }

    fn fetch(&self, name: &str, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        let t = self.tensors.get(name).ok_or_else(|| {
            let hint = closest(name, self.tensors.keys())
                .map(|c| format!(" (closest present: `{c}`)"))
                .unwrap_or_default();
            candle_core::Error::Msg(format!("missing weight `{name}`{hint}"))
        })?;
        if let Ok(mut used) = self.used.lock() {
            used.insert(name.to_string());
        }
        // Integer buffers (BatchNorm's num_batches_tracked) keep their dtype unless asked.
        let t = if t.dtype().is_float() || !dtype.is_float() {
            t.to_dtype(dtype)?
        } else {
            t.clone()
        };
        t.to_device(dev)
    }
}

impl SimpleBackend for TrackedWeights {
    fn get(&self, s: Shape, name: &str, _: candle_nn::Init, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        let t = self.fetch(name, dtype, dev)?;
        if t.shape() != &s {
            return Err(candle_core::Error::Msg(format!(
                "weight `{name}` has shape {:?}, expected {:?}",
                t.dims(),
                s.dims()
            )));
        }
        Ok(t)
    }

    fn get_unchecked(&self, name: &str, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        self.fetch(name, dtype, dev)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }
}

/// The candidate with the smallest edit distance to `name`, if reasonably close.
pub fn closest<'a>(name: &str, candidates: impl Iterator<Item = &'a String>) -> Option<&'a String> {
    candidates
        .map(|c| (edit_distance(name, c), c))
        .filter(|(d, c)| *d <= name.len().max(c.len()) / 2)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            cur.push((prev[j] + usize::from(ca != *cb)).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}
