//! Memory known before it is spent: an estimate of the peak memory checking a bundle takes,
//! computed from its header alone (block id, `parity.kwargs`, `parity.config`, every tensor's
//! dtype and shape), and the limit it is held to.
//!
//! **The estimate** adds what `check` holds at its peak ([`estimate`]):
//! * the tensors it loads, in their stored dtype (the stage traces only with `--trace`), plus the
//!   largest of them once more: the bytes read from the file before they become a tensor;
//! * the weights and float inputs converted to the run dtype when stored in another one;
//! * the forward's activations: [`ACTIVATIONS`] copies of the largest input or output, in the run
//!   dtype (at least 4 bytes an element: half-precision blocks compute in f32 in places); for the
//!   whole models (`UNet2DConditionModel`, `AutoencoderKL`) what their config says instead: each
//!   level's widths at its resolution, the U-Net's skips, the transformers' feed-forward, and the
//!   downsamplers' im2col (`memory/whole.rs`);
//! * for a whole model, the weights of the checkpoint the bundle references (`parity.weights`, or
//!   `--weights`), from its header: in the run dtype, plus the largest once more as it is read;
//! * a score matrix the block forms whole: `torch.MultiheadAttention` with `need_weights` (the
//!   default) forms the `(N, heads, L, S)` scores, their softmax and the head mean (3 copies);
//!   a run in f64, f16 or bf16, or `UNET_ATTENTION_SDPA=chunked`, may take the chunked reference
//!   path, whose score blocks are capped at 2^24 elements (3 copies, 8 bytes each);
//!   `UNET_ATTENTION_SDPA=reference` forms every attention's whole `(B, heads, L, L)` score matrix
//!   ([`REFERENCE_SCORES`] copies), `L` the largest input's tokens (its last two dimensions, or
//!   the longer of the two of a 3-D input), `heads` read from `parity.config`;
//! * the comparison: [`COMPARE`] float64 copies of the largest output;
//! * where the bundle has a float64 twin (and the run is not in float64): our float64 run of the
//!   maths check, made after the run in the bundle's dtype, counted as what it holds beyond that
//!   run's activations: the weights and inputs in float64, the forward's activations at 8 bytes an
//!   element, [`FLOAT64_OUTPUTS`] float64 outputs, and for a whole model its checkpoint's weights
//!   in float64;
//! * with the stage traces (`--trace`, `show`): our own recorded stages, all held at once (at
//!   least 4 bytes an element), and [`COMPARE`] + 3 float64 copies of the largest stage, compared
//!   one at a time (the float64 reference rebuilt from a delta takes three).
//!
//! The constants were calibrated by peak RSS (`examples/memory_peak.rs`) on committed bundles and
//! on bundles scaled up to hundreds of megabytes: the estimate stays above the measured peak.
//!
//! **The limit** ([`Limit::from_machine`]): the memory the system reports available
//! (`MemAvailable` in `/proc/meminfo`) and, when an address-space limit is set (`ulimit -v`,
//! `RLIMIT_AS`), what of it this process has not yet mapped; `--max-memory` sets another.

mod whole;

use crate::bundle::{Load, TensorInfo, FLOAT64_SUFFIX, INPUT_PREFIX, OUTPUT_PREFIX};
use std::collections::BTreeMap;
use unet_attention::sdpa::SdpaPath;

/// Copies of the largest input or output the forward holds at its peak (measured: up to 7 on the
/// mid blocks, whose resnets keep a normalised, an activated and a convolved copy next to the
/// residual; attention blocks 4–5).
pub const ACTIVATIONS: u64 = 10;
/// Float64 copies of the largest output the comparison holds: ours, PyTorch's, the float64 twin
/// and PyTorch's error as `f64` values, the error's neighbourhood maximum (the elementwise rule
/// of `compare`), PyTorch's output again in a run in another dtype, and two conversions in flight.
pub const COMPARE: u64 = 8;
/// Score-matrix copies the reference attention path holds at once: the scores, scaled, masked,
/// and their softmax.
pub const REFERENCE_SCORES: u64 = 4;
/// Float64 outputs of our own float64 runs held for the maths check: the plain run, the one with
/// exact embeddings and the one that keeps the published casts.
pub const FLOAT64_OUTPUTS: u64 = 3;
/// What the process holds before any bundle: code, the thread pools, the allocator's arenas.
pub const BASELINE: u64 = 64 << 20;
/// The chunked reference attention's score block (`unet_attention::sdpa`, on the CPU).
const SCORE_CHUNK: u64 = 1 << 24;

/// An estimate of a check's peak memory, with its largest parts (for the refusal's message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Estimate {
    pub bytes: u64,
    /// `(what, bytes)`, the largest first.
    pub parts: Vec<(&'static str, u64)>,
}

/// Bytes an element of a safetensors dtype (as [`TensorInfo::dtype`] spells it) takes; unknown
/// dtypes count 8 (the reader refuses them anyway).
fn stored_size(dtype: &str) -> u64 {
    match dtype {
        "bool" | "u8" | "i8" | "f8_e4m3" | "f8_e5m2" => 1,
        "f16" | "bf16" | "i16" | "u16" => 2,
        "f32" | "i32" | "u32" => 4,
        _ => 8,
    }
}

/// Bytes of an element of the run dtype (`float32`, `f16` ...; unknown: 4).
fn run_size(run_dtype: &str) -> u64 {
    match crate::bundle::parse_dtype(run_dtype) {
        Some(d) => d.size_in_bytes() as u64,
        None => 4,
    }
}

fn elements(info: &TensorInfo) -> u64 {
    info.shape.iter().fold(1u64, |n, &d| n.saturating_mul(d as u64))
}

/// The peak memory of checking a bundle whose header holds `metadata` and `infos`, loading the
/// tensors `load` names, run in `run_dtype` (`--dtype`, else `parity.dtype`, else float32).
pub fn estimate(
    metadata: &BTreeMap<String, String>,
    infos: &[TensorInfo],
    load: Load,
    run_dtype: Option<&str>,
) -> Estimate {
    let path = unet_attention::sdpa::sdpa_path().unwrap_or(SdpaPath::Auto);
    estimate_with(metadata, infos, load, run_dtype, path)
}

/// [`estimate`] for a run whose attention takes `path` (`UNET_ATTENTION_SDPA`).
pub fn estimate_with(
    metadata: &BTreeMap<String, String>,
    infos: &[TensorInfo],
    load: Load,
    run_dtype: Option<&str>,
    path: SdpaPath,
) -> Estimate {
    let stored_dtype = metadata.get("parity.dtype").map(String::as_str);
    let run = run_size(run_dtype.or(stored_dtype).unwrap_or("float32"));
    let loaded: Vec<&TensorInfo> = infos
        .iter()
        .filter(|i| load == Load::All || !i.name.starts_with(crate::trace::TRACE_PREFIX))
        .collect();
    let bytes_of = |i: &TensorInfo| elements(i).saturating_mul(stored_size(&i.dtype));
    let tensors = loaded.iter().fold(0u64, |n, i| n.saturating_add(bytes_of(i)));
    let reading = loaded.iter().map(|i| bytes_of(i)).max().unwrap_or(0);
    // Weights (not `parity.*`) and inputs, converted when their float dtype is not the run's.
    let converted = loaded
        .iter()
        .filter(|i| !i.name.starts_with("parity.") || i.name.starts_with(INPUT_PREFIX))
        .filter(|i| i.dtype.starts_with('f') || i.dtype.starts_with("bf"))
        .filter(|i| stored_size(&i.dtype) != run)
        .fold(0u64, |n, i| n.saturating_add(elements(i).saturating_mul(run)));
    let is_output = |i: &&&TensorInfo| i.name.starts_with(OUTPUT_PREFIX) && !i.name.ends_with(FLOAT64_SUFFIX);
    let largest_input = loaded
        .iter()
        .filter(|i| i.name.starts_with(INPUT_PREFIX))
        .map(|i| elements(i))
        .max()
        .unwrap_or(0);
    let largest_output = loaded.iter().filter(is_output).map(|i| elements(i)).max().unwrap_or(0);
    let largest = largest_input.max(largest_output);
    let (activations, workspace) = whole::forward_bytes(metadata, infos, run)
        .unwrap_or((largest.saturating_mul(run.max(4)).saturating_mul(ACTIVATIONS), 0));
    let scores = scores(metadata, infos, run, largest_input, path);
    let compare = largest_output.saturating_mul(8).saturating_mul(COMPARE);
    let (our_stages, stage_compare) = stages(&loaded, run);
    let float64_run = if has_twin(&loaded) && run < 8 {
        let forward64 = whole::forward_bytes(metadata, infos, 8)
            .map(|(a, w)| a.saturating_add(w))
            .unwrap_or(largest.saturating_mul(8).saturating_mul(ACTIVATIONS));
        let held = float_elements(&loaded)
            .saturating_mul(8)
            .saturating_add(forward64)
            .saturating_add(largest_output.saturating_mul(8).saturating_mul(FLOAT64_OUTPUTS));
        held.saturating_sub(converted.saturating_add(activations).saturating_add(workspace))
    } else {
        0
    };
    let mut parts = vec![
        ("tensors", tensors),
        ("reading", reading),
        ("conversions", converted),
        ("activations", activations),
        ("convolution workspace", workspace),
        ("attention scores", scores),
        ("comparison", compare),
        ("our stages", our_stages),
        ("stage comparison", stage_compare),
        ("float64 run", float64_run),
        ("baseline", BASELINE),
    ];
    let bytes = parts.iter().fold(0u64, |n, (_, b)| n.saturating_add(*b));
    parts.sort_by_key(|(_, b)| std::cmp::Reverse(*b));
    parts.retain(|(_, b)| *b > 0);
    Estimate { bytes, parts }
}

/// Whether the bundle has a float64 twin of an output: `check` then runs the block in float64 too
/// (the maths check), after the run in the bundle's dtype.
fn has_twin(loaded: &[&TensorInfo]) -> bool {
    loaded
        .iter()
        .any(|i| i.name.starts_with(OUTPUT_PREFIX) && i.name.ends_with(FLOAT64_SUFFIX))
}

/// Elements of the weights (not `parity.*`) and inputs stored in a float dtype.
fn float_elements(loaded: &[&TensorInfo]) -> u64 {
    loaded
        .iter()
        .filter(|i| !i.name.starts_with("parity.") || i.name.starts_with(INPUT_PREFIX))
        .filter(|i| i.dtype.starts_with('f') || i.dtype.starts_with("bf"))
        .fold(0u64, |n, i| n.saturating_add(elements(i)))
}

impl Estimate {
    /// The estimate with `bytes` more for `what`.
    pub fn add(mut self, what: &'static str, bytes: u64) -> Self {
        self.bytes = self.bytes.saturating_add(bytes);
        if bytes > 0 {
            self.parts.push((what, bytes));
            self.parts.sort_by_key(|(_, b)| std::cmp::Reverse(*b));
        }
        self
    }
}

/// The bytes the weights of the checkpoint at `file` under `prefix` take loaded in the run dtype
/// (`run` bytes an element, at least the stored size), plus the largest as it is read: from its
/// header (0 when it cannot be read: checking it says why).
pub fn checkpoint_bytes(file: &std::path::Path, prefix: &str, run: u64) -> u64 {
    let Ok(checkpoint) = crate::checkpoint::Checkpoint::open(file) else {
        return 0;
    };
    let prefix = checkpoint.resolve_prefix(prefix).unwrap_or_default();
    let (mut total, mut largest) = (0u64, 0u64);
    for name in checkpoint.names().filter(|n| n.starts_with(&prefix)) {
        let (Some(shape), Some(dtype)) = (checkpoint.shape(name), checkpoint.dtype(name)) else {
            continue;
        };
        let n = shape.iter().fold(1u64, |n, &d| n.saturating_mul(d as u64));
        let stored = n.saturating_mul(dtype.size_in_bytes() as u64);
        total = total.saturating_add(n.saturating_mul(run.max(dtype.size_in_bytes() as u64)));
        largest = largest.max(stored);
    }
    total.saturating_add(largest)
}

/// Our recorded stages (every loaded `parity.trace.<stage>`, at least 4 bytes an element) and the
/// float64 copies comparing the largest one takes (see the module docs); nothing without stages.
fn stages(loaded: &[&TensorInfo], run: u64) -> (u64, u64) {
    let is_stage = |i: &&&TensorInfo| {
        i.name.starts_with(crate::trace::TRACE_PREFIX)
            && !i.name.ends_with(FLOAT64_SUFFIX)
            && !i.name.ends_with(crate::trace::DELTA_SUFFIX)
    };
    let ours = loaded
        .iter()
        .filter(is_stage)
        .fold(0u64, |n, i| n.saturating_add(elements(i).saturating_mul(run.max(4))));
    let largest = loaded.iter().filter(is_stage).map(|i| elements(i)).max().unwrap_or(0);
    (ours, largest.saturating_mul(8).saturating_mul(COMPARE + 3))
}

/// The whole score matrices of the reference attention path: `(B, heads, L, L)` for the largest
/// input of rank 3 or more (see the module docs), [`REFERENCE_SCORES`] copies.
fn reference_scores(config: &serde_json::Value, infos: &[TensorInfo], run: u64) -> u64 {
    let Some(input) = infos
        .iter()
        .filter(|i| i.name.starts_with(INPUT_PREFIX) && i.shape.len() >= 3)
        .max_by_key(|i| elements(i))
    else {
        return 0;
    };
    let d = |k: usize| input.shape[k] as u64;
    let r = input.shape.len();
    // (B, N, C) or (B, C, N): the longer is the tokens; (B, C, ..., H, W): H·W tokens, the
    // dimensions between channels and H a batch of attentions (video frames).
    let (batch, channels, tokens) = if r == 3 {
        (d(0), d(1).min(d(2)), d(1).max(d(2)))
    } else {
        let between = input.shape[2..r - 2]
            .iter()
            .fold(1u64, |n, &x| n.saturating_mul(x as u64));
        (d(0).saturating_mul(between), d(1), d(r - 2).saturating_mul(d(r - 1)))
    };
    let int = |key: &str| config.get(key).and_then(|v| v.as_u64()).filter(|&v| v > 0);
    let keys = config
        .as_object()
        .map(|o| o.keys().cloned().collect::<Vec<_>>())
        .unwrap_or_default();
    let from_heads = keys.iter().filter(|k| k.contains("heads")).filter_map(|k| int(k)).max();
    let from_dim = keys
        .iter()
        .filter(|k| k.contains("head_dim") || k.contains("dim_head"))
        .filter_map(|k| int(k))
        .map(|dim| channels / dim)
        .max();
    let heads = from_heads.max(from_dim).unwrap_or(1).clamp(1, channels.max(1));
    batch
        .saturating_mul(heads)
        .saturating_mul(tokens.saturating_mul(tokens))
        .saturating_mul(REFERENCE_SCORES * run.max(4))
}

/// The score matrices a block forms whole (see the module docs).
fn scores(
    metadata: &BTreeMap<String, String>,
    infos: &[TensorInfo],
    run: u64,
    largest_input: u64,
    path: SdpaPath,
) -> u64 {
    let block = metadata.get("parity.block").map(String::as_str).unwrap_or("");
    let json = |key: &str| -> serde_json::Value {
        metadata
            .get(key)
            .and_then(|s| serde_json::from_str(s).ok())
            .unwrap_or(serde_json::Value::Null)
    };
    let mut bytes = 0u64;
    if block == unet_attention::torch::MultiheadAttention::BLOCK {
        let kwargs = json("parity.kwargs");
        if kwargs.get("need_weights").and_then(|v| v.as_bool()).unwrap_or(true) {
            let heads = json("parity.config")
                .get("num_heads")
                .and_then(|h| h.as_u64())
                .unwrap_or(1)
                .max(1);
            // The second output is the weights, `(N, L, S)` averaged over heads, or `(N, H, L, S)`
            // (`parity.outputs`; without it, the largest output).
            let listed: Vec<String> = serde_json::from_value(json("parity.outputs")).unwrap_or_default();
            let is_weights = |i: &&TensorInfo| match listed.get(1) {
                Some(name) => i.name.strip_prefix(OUTPUT_PREFIX) == Some(name.as_str()),
                None => i.name.starts_with(OUTPUT_PREFIX) && !i.name.ends_with(FLOAT64_SUFFIX),
            };
            let weights = infos
                .iter()
                .filter(is_weights)
                .map(|i| (elements(i), i.shape.len()))
                .max()
                .unwrap_or((0, 0));
            let per_head = if weights.1 == 4 { 1 } else { heads };
            bytes = weights.0.saturating_mul(per_head).saturating_mul(3 * run.max(4));
        }
    }
    if path == SdpaPath::Reference {
        bytes = bytes.saturating_add(reference_scores(&json("parity.config"), infos, run));
    } else if run != 4 || path == SdpaPath::Chunked {
        let chunk = largest_input.saturating_mul(largest_input).min(SCORE_CHUNK);
        bytes = bytes.saturating_add(chunk.saturating_mul(3 * 8));
    }
    bytes
}

/// The most memory a check may take, and where that number came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    pub bytes: u64,
    /// `--max-memory`, `available memory`, `address-space limit (ulimit -v)`.
    pub from: String,
}

impl Limit {
    /// The machine's limit now: the smaller of the available memory and the address space left
    /// under `RLIMIT_AS` (`None` where neither is known: other systems than Linux without a limit).
    pub fn from_machine() -> Option<Limit> {
        let available = available_memory().map(|bytes| Limit {
            bytes,
            from: "the memory available".into(),
        });
        let address = address_space_left().map(|bytes| Limit {
            bytes,
            from: "the address space left under ulimit -v".into(),
        });
        match (available, address) {
            (Some(a), Some(b)) => Some(if b.bytes < a.bytes { b } else { a }),
            (a, b) => a.or(b),
        }
    }

    /// `--max-memory BYTES`: in place of the available memory (swap, or a share of the machine),
    /// but never above the address space left under `RLIMIT_AS`, which no allocation can pass.
    pub fn given(bytes: u64) -> Limit {
        match address_space_left() {
            Some(left) if left < bytes => Limit {
                bytes: left,
                from: "the address space left under ulimit -v, below --max-memory".into(),
            },
            _ => Limit {
                bytes,
                from: "--max-memory".into(),
            },
        }
    }
}

/// `MemAvailable` of `/proc/meminfo`, in bytes.
fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    kib_field(&text, "MemAvailable:")
}

/// A `Key:   N kB` line of a `/proc` file, in bytes.
fn kib_field(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line[key.len()..].trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib.saturating_mul(1024))
}

/// `RLIMIT_AS` (soft) less what the process has mapped (`VmSize`), when a limit is set.
#[cfg(unix)]
fn address_space_left() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given and reads nothing else.
    if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut limit) } != 0 || limit.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    #[allow(clippy::unnecessary_cast)] // `rlim_t` is not u64 on every unix
    let cap = limit.rlim_cur as u64;
    let mapped = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| kib_field(&s, "VmSize:"))
        .unwrap_or(0);
    Some(cap.saturating_sub(mapped))
}

#[cfg(not(unix))]
fn address_space_left() -> Option<u64> {
    None
}

/// A `--max-memory` value: bytes, or a number with `K`, `M`, `G`, `T` (powers of 1024; `KiB`,
/// `GB` ... are read the same), e.g. `8G`, `1.5G`, `512M`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let scale: u64 = match unit
        .trim()
        .to_ascii_uppercase()
        .trim_end_matches('B')
        .trim_end_matches('I')
    {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        _ => return Err(format!("{s:?}: expected a size such as 8G, 512M or 1073741824")),
    };
    let too_large = || format!("{s:?}: more than 2^64 - 1 bytes, the most a memory limit can be");
    let too_small = || format!("{s:?}: a memory limit must be at least 1 byte");
    // A whole number exactly (2^64 - 1 is not exact as an f64).
    if let Ok(n) = number.trim().parse::<u64>() {
        return match n.checked_mul(scale) {
            None => Err(too_large()),
            Some(0) => Err(too_small()),
            Some(bytes) => Ok(bytes),
        };
    }
    let n: f64 = number
        .trim()
        .parse()
        .ok()
        .filter(|n: &f64| n.is_finite())
        .ok_or_else(|| format!("{s:?}: expected a size such as 8G, 512M or 1073741824"))?;
    let bytes = n * scale as f64;
    if bytes < 1.0 {
        return Err(too_small());
    }
    // 2^64 as an f64: every value below it converts to a u64.
    if bytes >= 18_446_744_073_709_551_616.0 {
        return Err(too_large());
    }
    Ok(bytes as u64)
}

/// `bytes` for a person: `3.2 GiB`, `512 MiB`, `100 KiB`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// The estimate of checking the bundle at `path` (see the module docs), from its header and the
/// header of the checkpoint its weights come from (`weights`: `--weights` and `--prefix`, else the
/// bundle's `parity.weights`); `None` for a file that is not a bundle (no `parity.format`, or no
/// readable header: reading it says what is wrong).
pub fn estimate_file(
    path: &std::path::Path,
    load: Load,
    run_dtype: Option<&str>,
    weights: Option<(&std::path::Path, &str)>,
) -> Option<Estimate> {
    let (metadata, infos) = crate::bundle::read_header(path).ok()?;
    if !metadata.contains_key("parity.format") {
        return None;
    }
    // A whole model reads every weight of its checkpoint; a block under a prefix only its own,
    // whose shapes are checked before they are read (a wrong 3 GB one is refused by its shape).
    let referenced = crate::check::referenced_checkpoint(path, &metadata);
    let from = weights.map(|(f, p)| (f.to_path_buf(), p.to_string())).or(referenced);
    let from = from.filter(|_| whole::is_whole_model(&metadata));
    let run = run_size(
        run_dtype
            .or(metadata.get("parity.dtype").map(String::as_str))
            .unwrap_or("float32"),
    );
    let loaded: Vec<&TensorInfo> = infos.iter().collect();
    let float64 = has_twin(&loaded) && run < 8;
    let (checkpoint, checkpoint64) = from.map_or((0, 0), |(file, prefix)| {
        let in64 = if float64 {
            checkpoint_bytes(&file, &prefix, 8)
        } else {
            0
        };
        (checkpoint_bytes(&file, &prefix, run), in64)
    });
    Some(
        estimate(&metadata, &infos, load, run_dtype)
            .add("checkpoint weights", checkpoint)
            .add("checkpoint weights in float64", checkpoint64),
    )
}

/// Refuse the bundle at `path`, as [`crate::ParityError::Invalid`], when checking it would take
/// more than `limit` by [`estimate_file`]. Files that are not bundles pass: reading them says what
/// is wrong, from the header.
pub fn check_bundle_fits(
    path: &std::path::Path,
    load: Load,
    run_dtype: Option<&str>,
    weights: Option<(&std::path::Path, &str)>,
    limit: &Limit,
) -> crate::error::Result<()> {
    let Some(estimate) = estimate_file(path, load, run_dtype, weights) else {
        return Ok(());
    };
    if estimate.bytes <= limit.bytes {
        return Ok(());
    }
    let parts: Vec<String> = estimate
        .parts
        .iter()
        .take(3)
        .map(|(what, b)| format!("{what} {}", human(*b)))
        .collect();
    Err(crate::error::ParityError::Invalid {
        path: path.to_path_buf(),
        message: format!(
            "checking it would take about {} of memory ({}), more than the limit of {} ({}); {}",
            human(estimate.bytes),
            parts.join(", "),
            human(limit.bytes),
            limit.from,
            if limit.from.contains("ulimit") {
                "raise `ulimit -v` to check it"
            } else {
                "raise it with --max-memory if the machine has the memory"
            }
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, dtype: &str, shape: &[usize]) -> TensorInfo {
        TensorInfo {
            name: name.into(),
            dtype: dtype.into(),
            shape: shape.to_vec(),
        }
    }

    #[test]
    fn sizes_parse_and_print() {
        assert_eq!(parse_size("8G"), Ok(8 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("1.5g"), Ok(3 << 29));
        assert_eq!(parse_size("4096"), Ok(4096));
        for bad in [
            "",
            "G",
            "-1G",
            "0",
            "1e400",
            "NaN",
            "8Q",
            "inf",
            "0.5",
            "18446744073709551616",
            "17179869184G",
        ] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(parse_size("16777215T"), Ok(16_777_215 << 40));
        assert!(parse_size("18446744073709551616")
            .unwrap_err()
            .contains("more than 2^64"));
        assert!(parse_size("0").unwrap_err().contains("at least 1 byte"));
        assert_eq!(human(3 << 29), "1.5 GiB");
        assert_eq!(human(100), "100 B");
    }

    #[test]
    fn mha_with_weights_counts_the_whole_score_matrix() {
        let l = 16_384;
        let meta: BTreeMap<String, String> = [
            ("parity.block", unet_attention::torch::MultiheadAttention::BLOCK),
            ("parity.dtype", "float32"),
            ("parity.config", r#"{"embed_dim": 8, "num_heads": 2}"#),
            ("parity.outputs", r#"["attn_output", "attn_output_weights"]"#),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let infos = vec![
            info("parity.input.query", "f32", &[l, 1, 8]),
            info("parity.output.attn_output", "f32", &[l, 1, 8]),
            info("parity.output.attn_output_weights", "f32", &[1, l, l]),
        ];
        let e = estimate(&meta, &infos, Load::NoStages, None);
        let scores = e.parts.iter().find(|(w, _)| *w == "attention scores").unwrap().1;
        assert_eq!(scores, (l * l * 2 * 3 * 4) as u64);
        assert!(e.bytes > 8 << 30, "{e:?}");
        // Without the weights, no score matrix.
        let mut meta = meta;
        meta.insert("parity.kwargs".into(), r#"{"need_weights": false}"#.into());
        let infos = &infos[..2];
        let e = estimate(&meta, infos, Load::NoStages, None);
        assert!(e.parts.iter().all(|(w, _)| *w != "attention scores"), "{e:?}");
        assert!(e.bytes < 100 << 20, "{e:?}");
    }

    #[test]
    fn the_reference_path_counts_the_whole_score_matrix() {
        let meta: BTreeMap<String, String> = [
            ("parity.block", "diffusers.Attention"),
            ("parity.config", r#"{"query_dim": 32, "heads": 1, "dim_head": 32}"#),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let infos = vec![
            info("parity.input.hidden_states", "f32", &[1, 32, 181, 181]),
            info("parity.output.output", "f32", &[1, 32, 181, 181]),
        ];
        let auto = estimate_with(&meta, &infos, Load::NoStages, None, SdpaPath::Auto);
        let reference = estimate_with(&meta, &infos, Load::NoStages, None, SdpaPath::Reference);
        let tokens = 181u64 * 181;
        let scores = reference
            .parts
            .iter()
            .find(|(w, _)| *w == "attention scores")
            .unwrap()
            .1;
        assert_eq!(scores, tokens * tokens * REFERENCE_SCORES * 4);
        assert!(
            auto.bytes < 1 << 30 && reference.bytes > 12 << 30,
            "{auto:?} {reference:?}"
        );
        // The chunked path: one capped block of scores.
        let chunked = estimate_with(&meta, &infos, Load::NoStages, None, SdpaPath::Chunked);
        assert!(chunked.bytes - auto.bytes == SCORE_CHUNK * 24, "{chunked:?}");
        // Heads from the config (`heads`, or channels / `dim_head`), at most the channels.
        let heads = |config: &str| {
            let config: serde_json::Value = serde_json::from_str(config).unwrap();
            reference_scores(&config, &infos, 4) / (tokens * tokens * REFERENCE_SCORES * 4)
        };
        assert_eq!(heads(r#"{"heads": 8}"#), 8);
        assert_eq!(heads(r#"{"dim_head": 8}"#), 4);
        assert_eq!(heads(r#"{"num_attention_heads": 1000}"#), 32);
        assert_eq!(heads("{}"), 1);
    }

    #[test]
    fn trace_counts_our_stages_and_their_float64_copies() {
        let meta = BTreeMap::new();
        let infos = vec![
            info("parity.input.x", "f32", &[1, 4]),
            info("parity.output.out", "f32", &[1, 4]),
            info("parity.trace.ff", "bf16", &[1, 1_200_000, 160]),
            info("parity.trace.ff.float64_delta", "bf16", &[1, 1_200_000, 160]),
        ];
        let e = estimate_with(&meta, &infos, Load::All, None, SdpaPath::Auto);
        let part = |name: &str| e.parts.iter().find(|(w, _)| *w == name).unwrap().1;
        let n = 1_200_000u64 * 160;
        assert_eq!(part("our stages"), n * 4);
        assert_eq!(part("stage comparison"), n * 8 * (COMPARE + 3));
        assert!(e.bytes > 4 << 30, "{e:?}");
        let plain = estimate_with(&meta, &infos, Load::NoStages, None, SdpaPath::Auto);
        assert!(plain.parts.iter().all(|(w, _)| !w.contains("stage")), "{plain:?}");
    }

    #[test]
    fn stage_traces_count_only_when_loaded() {
        let meta = BTreeMap::new();
        let infos = vec![
            info("parity.input.x", "f32", &[1, 4]),
            info("parity.output.out", "f32", &[1, 4]),
            info("parity.trace.q", "f32", &[1 << 28]),
        ];
        let without = estimate(&meta, &infos, Load::NoStages, None).bytes;
        let with = estimate(&meta, &infos, Load::All, None).bytes;
        assert!(without < BASELINE + 4096 && with > 2 << 30, "{without} {with}");
    }
}
