//! Weights that remember what was read from them: a `VarBuilder` backend over a state dict
//! ([`TrackedWeights`], over any [`WeightSource`]: a bundle's tensors, a checkpoint, a model
//! folder's safetensors) that records which tensors a model or block loaded, so weights it never
//! read are named ([`unused_list`], with the closest name it did read) instead of silently
//! ignored, and that names the missing key (with the closest present one) or the expected and
//! found shapes when a load fails. It also records every floating-point weight stored in another
//! dtype than the run's, so conversions are reported rather than silent, and refuses an integer
//! tensor where the block needs a float one. The library's folder loaders and `unet-parity` share
//! this one tracker.

use candle_core::{DType, Device, Shape, Tensor};
use candle_nn::var_builder::SimpleBackend;
use candle_nn::VarBuilder;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

/// Where a block's weights come from: a bundle's own state dict, a model folder's safetensors
/// (`crate::files::shards::SafetensorsFiles`), or a checkpoint under a prefix (`unet-parity`'s
/// `PrefixView`). Tensors are loaded on demand, on the CPU, in their stored dtype.
pub trait WeightSource: Send + Sync {
    /// Every tensor name, as the block addresses them.
    fn names(&self) -> Vec<String>;
    /// The tensor `name`, `None` when absent.
    fn load(&self, name: &str) -> candle_core::Result<Option<Tensor>>;
    /// The stored dtype and shape of `name` without reading its data (`None` when absent or not
    /// known): a block's shape and dtype checks come before any byte of the tensor is read.
    fn describe(&self, name: &str) -> Option<(DType, Vec<usize>)> {
        let _ = name;
        None
    }
    /// Where the weights live, for reports (`None`: inside the bundle).
    fn location(&self) -> Option<String> {
        None
    }
}

impl WeightSource for BTreeMap<String, Tensor> {
    fn names(&self) -> Vec<String> {
        self.keys().cloned().collect()
    }

    fn load(&self, name: &str) -> candle_core::Result<Option<Tensor>> {
        Ok(self.get(name).cloned())
    }

    fn describe(&self, name: &str) -> Option<(DType, Vec<usize>)> {
        self.get(name).map(|t| (t.dtype(), t.dims().to_vec()))
    }
}

/// `name -> [NaN, +inf, -inf]` counts of the weights read that hold any.
type NonFinite = BTreeMap<String, [usize; 3]>;

/// A state dict that remembers what was read from it.
#[derive(Clone)]
pub struct TrackedWeights {
    source: Arc<dyn WeightSource>,
    names: Arc<BTreeSet<String>>,
    used: Arc<Mutex<BTreeSet<String>>>,
    /// `name -> (stored, converted to)` for tensors loaded in another dtype than the run's.
    converted: Arc<Mutex<BTreeMap<String, (DType, DType)>>>,
    /// The dtype of the run (set by [`TrackedWeights::var_builder`]).
    run_dtype: Option<DType>,
    /// `name -> [NaN, +inf, -inf]` of the float weights read, when counted
    /// ([`TrackedWeights::counting_non_finite`]).
    non_finite: Option<Arc<Mutex<NonFinite>>>,
    /// `name -> dtype` to round a weight through before converting it to the run's dtype: the
    /// dtype a run in the bundle's own dtype converted it to ([`TrackedWeights::rounded_as`]).
    through: Arc<BTreeMap<String, DType>>,
}

/// Tensors converted from one dtype to another for the run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Conversion {
    pub from: String,
    pub to: String,
    /// State-dict names (weights) and `parity.input.<name>` (inputs), sorted.
    pub tensors: Vec<String>,
}

fn dtype_name(d: DType) -> String {
    format!("{d:?}").to_lowercase()
}

/// One line for the table's note: `converted f16 -> f32: a, b, c (3 tensors)`; `None` when
/// nothing was converted. Long lists are cut after eight names.
pub fn conversion_note(conversions: &[Conversion]) -> Option<String> {
    const SHOWN: usize = 8;
    let parts: Vec<String> = conversions
        .iter()
        .map(|c| {
            let n = c.tensors.len();
            let mut names = c.tensors.iter().take(SHOWN).cloned().collect::<Vec<_>>().join(", ");
            if n > SHOWN {
                names.push_str(&format!(", ... {} more", n - SHOWN));
            }
            let plural = if n == 1 { "" } else { "s" };
            format!("converted {} -> {}: {names} ({n} tensor{plural})", c.from, c.to)
        })
        .collect();
    (!parts.is_empty()).then(|| parts.join("; "))
}

impl TrackedWeights {
    pub fn new(tensors: BTreeMap<String, Tensor>) -> Self {
        Self::from_source(Arc::new(tensors))
    }

    /// Track the tensors of any [`WeightSource`].
    pub fn from_source(source: Arc<dyn WeightSource>) -> Self {
        Self {
            names: Arc::new(source.names().into_iter().collect()),
            source,
            used: Arc::default(),
            converted: Arc::default(),
            run_dtype: None,
            non_finite: None,
            through: Arc::default(),
        }
    }

    /// These weights, each rounded first to the dtype `run` converted it to: a float64 run of a
    /// float16 bundle that references a float32 checkpoint holds the weights PyTorch's float16
    /// module held (its float64 twin started from those), not the checkpoint's.
    pub fn rounded_as(mut self, run: &TrackedWeights) -> Self {
        // every conversion the run made (a widening one is exact, so rounding through it is too)
        let converted = run.converted.lock().map(|c| c.clone()).unwrap_or_default();
        self.through = Arc::new(
            converted
                .into_iter()
                .filter(|(_, (_, to))| to.is_float())
                .map(|(name, (_, to))| (name, to))
                .collect(),
        );
        self
    }

    /// Count the NaN and infinite values of every float weight read (as stored, before any
    /// conversion): [`Self::non_finite`] names them. For weights from a file whose values nothing
    /// else checks (a checkpoint a bundle references).
    pub fn counting_non_finite(self) -> Self {
        Self {
            non_finite: Some(Arc::default()),
            ..self
        }
    }

    /// The weights read that hold NaN or infinite values, with their `[NaN, +inf, -inf]` counts
    /// (empty unless [`Self::counting_non_finite`]).
    pub fn non_finite(&self) -> Vec<(String, [usize; 3])> {
        let Some(found) = &self.non_finite else { return vec![] };
        found
            .lock()
            .map(|f| f.clone().into_iter().collect())
            .unwrap_or_default()
    }

    /// A `VarBuilder` over these weights converting floating tensors to `dtype` on `device`.
    pub fn var_builder(&self, dtype: DType, device: &Device) -> VarBuilder<'static> {
        let backend = Self {
            run_dtype: Some(dtype),
            ..self.clone()
        };
        VarBuilder::from_backend(Box::new(backend), dtype, device.clone())
    }

    /// Record that `name` (a weight or an input) was converted from `from` to `to` for the run;
    /// nothing when the dtypes are equal.
    pub fn record_conversion(&self, name: &str, from: DType, to: DType) {
        if from != to {
            if let Ok(mut converted) = self.converted.lock() {
                converted.insert(name.to_string(), (from, to));
            }
        }
    }

    /// The conversions recorded so far, grouped by `(from, to)`.
    pub fn conversions(&self) -> Vec<Conversion> {
        let converted = self.converted.lock().map(|c| c.clone()).unwrap_or_default();
        let mut groups: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
        for (name, (from, to)) in converted {
            groups.entry((dtype_name(from), dtype_name(to))).or_default().push(name);
        }
        groups
            .into_iter()
            .map(|((from, to), tensors)| Conversion { from, to, tensors })
            .collect()
    }

    /// Names no block read, sorted.
    pub fn unused(&self) -> Vec<String> {
        let used = self.used.lock().map(|u| u.clone()).unwrap_or_default();
        self.names.iter().filter(|k| !used.contains(*k)).cloned().collect()
    }

    /// Names a block read, sorted.
    pub fn read(&self) -> Vec<String> {
        let used = self.used.lock().map(|u| u.clone()).unwrap_or_default();
        self.names.iter().filter(|k| used.contains(*k)).cloned().collect()
    }

    /// Every name the source holds, sorted.
    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.names.iter()
    }

    /// Where the weights live (`None`: in the bundle).
    pub fn location(&self) -> Option<String> {
        self.source.location()
    }

    /// The error for a weight that is absent.
    fn missing(&self, name: &str) -> candle_core::Error {
        let hint = closest(name, self.names.iter())
            .map(|c| format!(" (closest present: `{c}`)"))
            .unwrap_or_default();
        candle_core::Error::Msg(format!("missing weight `{name}`{hint}"))
    }

    /// Load `name` for a block that needs `dtype` and, when `shape` is given, exactly that shape.
    /// What the source can tell without reading the data (presence, dtype, shape) is checked
    /// first, so a wrong tensor of any size is refused before a byte of it is read.
    fn fetch(&self, name: &str, shape: Option<&Shape>, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        let described = self.source.describe(name);
        if let Some((stored, dims)) = &described {
            check_dtype(name, *stored, dtype)?;
            if let Some(s) = shape.filter(|s| s.dims() != dims.as_slice()) {
                return Err(wrong_shape(name, dims, s));
            }
        }
        let t = self.source.load(name)?.ok_or_else(|| self.missing(name))?;
        if let Ok(mut used) = self.used.lock() {
            used.insert(name.to_string());
        }
        check_dtype(name, t.dtype(), dtype)?;
        if let Some(s) = shape.filter(|s| *s != t.shape()) {
            return Err(wrong_shape(name, t.dims(), s));
        }
        if let Some(found) = self.non_finite.as_ref().filter(|_| t.dtype().is_float()) {
            let counts = non_finite_counts(&t)?;
            if counts.iter().any(|&n| n > 0) {
                if let Ok(mut found) = found.lock() {
                    found.insert(name.to_string(), counts);
                }
            }
        }
        if t.dtype().is_float() && self.run_dtype.is_some_and(|run| run != t.dtype()) {
            self.record_conversion(name, t.dtype(), dtype);
        }
        let t = match self.through.get(name) {
            Some(through) if t.dtype().is_float() => t.to_dtype(*through)?,
            _ => t,
        };
        t.to_dtype(dtype)?.to_device(dev)
    }
}

/// The NaN, +inf and −inf counts of a float tensor, read a million elements at a time in f32 or
/// f64 (never a float64 copy of the whole tensor).
pub fn non_finite_counts(t: &Tensor) -> candle_core::Result<[usize; 3]> {
    const CHUNK: usize = 1 << 20;
    let flat = t.flatten_all()?;
    let n = flat.elem_count();
    let mut counts = [0usize; 3];
    let mut count = |v: f64| {
        if v.is_nan() {
            counts[0] += 1;
        } else if v == f64::INFINITY {
            counts[1] += 1;
        } else if v == f64::NEG_INFINITY {
            counts[2] += 1;
        }
    };
    for start in (0..n).step_by(CHUNK) {
        let chunk = flat.narrow(0, start, CHUNK.min(n - start))?;
        if chunk.dtype() == DType::F64 {
            chunk
                .to_vec1::<f64>()?
                .into_iter()
                .filter(|v| !v.is_finite())
                .for_each(&mut count);
        } else {
            let values = chunk.to_dtype(DType::F32)?.to_vec1::<f32>()?;
            values
                .into_iter()
                .filter(|v| !v.is_finite())
                .for_each(|v| count(v as f64));
        }
    }
    Ok(counts)
}

/// Integer buffers (BatchNorm's num_batches_tracked) are read as integers; an integer or bool
/// tensor where the block needs a float one is an error, not a silent cast.
fn check_dtype(name: &str, stored: DType, needed: DType) -> candle_core::Result<()> {
    if needed.is_float() && !stored.is_float() {
        return Err(candle_core::Error::Msg(format!(
            "weight `{name}` has dtype {}, the block needs a floating-point tensor",
            dtype_name(stored)
        )));
    }
    Ok(())
}

/// Candle's typed shape error (a block that accepts several layouts tries each by it); it reads
/// "weight `name` has the wrong shape, expected: [..], got: [..]".
fn wrong_shape(name: &str, found: &[usize], expected: &Shape) -> candle_core::Error {
    candle_core::Error::UnexpectedShape {
        msg: format!("weight `{name}` has the wrong shape"),
        expected: expected.clone(),
        got: Shape::from(found.to_vec()),
    }
}

impl SimpleBackend for TrackedWeights {
    fn get(&self, s: Shape, name: &str, _: candle_nn::Init, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        self.fetch(name, Some(&s), dtype, dev)
    }

    fn get_unchecked(&self, name: &str, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        self.fetch(name, None, dtype, dev)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.names.contains(name)
    }
}

/// `unused`, each with the closest name of `read` when one is close (`` `a` (closest used: `b`) ``),
/// comma-separated; at most `shown` of them, then `and N more`.
pub fn unused_list(unused: &[String], read: &[String], shown: usize) -> String {
    let mut parts: Vec<String> = unused
        .iter()
        .take(shown)
        .map(|u| match closest(u, read.iter()) {
            Some(c) => format!("`{u}` (closest used: `{c}`)"),
            None => format!("`{u}`"),
        })
        .collect();
    if unused.len() > shown {
        parts.push(format!("and {} more", unused.len() - shown));
    }
    parts.join(", ")
}

/// Names longer than this get no closest-name hint (an edit distance costs the product of the
/// lengths, and a stranger's header may hold names of megabytes).
const HINT_MAX_LEN: usize = 256;

/// The candidate with the smallest edit distance to `name`, if reasonably close (within half the
/// longer length; names longer than 256 bytes are not compared).
pub fn closest<'a>(name: &str, candidates: impl Iterator<Item = &'a String>) -> Option<&'a String> {
    if name.len() > HINT_MAX_LEN {
        return None;
    }
    candidates
        .filter(|c| c.len() <= HINT_MAX_LEN && c.len().abs_diff(name.len()) <= name.len().max(c.len()) / 2)
        .map(|c| (edit_distance(name, c), c))
        .filter(|(d, c)| *d <= name.len().max(c.len()) / 2)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

/// The number of single-character insertions, deletions and substitutions from `a` to `b`.
pub fn edit_distance(a: &str, b: &str) -> usize {
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

/// A `VarBuilder` that passes every read on to another one (any backend: a caller's mapped
/// safetensors, a `HashMap`) and records the names read, relative to that one's prefix: what a
/// constructor that takes a caller's `VarBuilder` needs to name the weights it did not read,
/// where the backend cannot list its names ([`unread_near`]).
#[derive(Clone)]
pub struct Recording<'a> {
    inner: VarBuilder<'a>,
    read: Arc<Mutex<BTreeSet<String>>>,
}

impl<'a> Recording<'a> {
    /// A recording view of `inner` (at its prefix), and the `VarBuilder` to build with.
    pub fn new(inner: VarBuilder<'a>) -> (Self, VarBuilder<'a>) {
        let rec = Self {
            inner: inner.clone(),
            read: Arc::default(),
        };
        let vb = VarBuilder::from_backend(Box::new(rec.clone()), inner.dtype(), inner.device().clone());
        (rec, vb)
    }

    /// The names read so far, relative to the inner `VarBuilder`'s prefix.
    pub fn read(&self) -> BTreeSet<String> {
        self.read.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// Whether the inner `VarBuilder` holds `name` (relative to its prefix).
    pub fn contains(&self, name: &str) -> bool {
        self.inner.contains_tensor(name)
    }

    /// The inner `VarBuilder`'s prefix (`""` at the root).
    pub fn prefix(&self) -> String {
        self.inner.prefix()
    }

    fn mark(&self, name: &str) {
        if let Ok(mut read) = self.read.lock() {
            read.insert(name.to_string());
        }
    }
}

impl SimpleBackend for Recording<'_> {
    fn get(
        &self,
        s: Shape,
        name: &str,
        init: candle_nn::Init,
        dtype: DType,
        dev: &Device,
    ) -> candle_core::Result<Tensor> {
        let t = self.inner.get_with_hints_dtype(s, name, init, dtype)?;
        self.mark(name);
        t.to_device(dev)
    }

    fn get_unchecked(&self, name: &str, dtype: DType, dev: &Device) -> candle_core::Result<Tensor> {
        let t = self.inner.get_unchecked_dtype(name, dtype)?;
        self.mark(name);
        t.to_device(dev)
    }

    fn contains_tensor(&self, name: &str) -> bool {
        self.inner.contains_tensor(name)
    }
}

/// The most names [`unread_near`] asks a backend about, and the most it returns.
const PROBES: usize = 1 << 14;
const FOUND: usize = 256;

/// Weights `rec`'s `VarBuilder` holds that were not read, found by asking it about the names near
/// the ones read (a backend cannot list its names): each read name with one of its indices one
/// higher (`transformer_blocks.0.norm1.weight` → `transformer_blocks.1.norm1.weight`, so a deeper
/// transformer, another resnet, attention or block), again from each one found, and `extra`
/// (the optional modules a model's config switches off). A backend that claims every name (Candle's
/// `VarBuilder::zeros`) cannot be asked and gives nothing. Sorted; at most 256.
pub fn unread_near(rec: &Recording, extra: &[String]) -> Vec<String> {
    if rec.contains("\u{0}unet-attention: no weight has this name") {
        return vec![];
    }
    let read = rec.read();
    let mut asked: BTreeSet<String> = BTreeSet::new();
    let mut found: BTreeSet<String> = BTreeSet::new();
    let mut queue: Vec<String> = read
        .iter()
        .flat_map(|n| next_indices(n))
        .chain(extra.iter().cloned())
        .collect();
    while let Some(name) = queue.pop() {
        if asked.len() >= PROBES || found.len() >= FOUND {
            break;
        }
        if read.contains(&name) || !asked.insert(name.clone()) {
            continue;
        }
        if rec.contains(&name) {
            queue.extend(next_indices(&name));
            found.insert(name);
        }
    }
    found.into_iter().collect()
}

/// `name` with each of its numeric components one higher, one at a time.
fn next_indices(name: &str) -> Vec<String> {
    let parts: Vec<&str> = name.split('.').collect();
    parts
        .iter()
        .enumerate()
        .filter_map(|(i, p)| {
            let n: usize = p.parse().ok().filter(|_| p.len() < 8)?;
            let mut next: Vec<String> = parts.iter().map(|s| s.to_string()).collect();
            next[i] = (n + 1).to_string();
            Some(next.join("."))
        })
        .collect()
}
