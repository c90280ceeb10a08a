//! Reading parity bundles (format "1"): one safetensors file holding a block's state dict,
//! its forward inputs (`parity.input.<name>`), PyTorch's outputs (`parity.output.<name>`, and
//! `parity.output.<name>.float64`), and `__metadata__` describing the block.

use crate::error::{ParityError, Result};
use candle_core::{DType, Device, Tensor};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub const FORMAT: &str = "1";
pub const INPUT_PREFIX: &str = "parity.input.";
pub const OUTPUT_PREFIX: &str = "parity.output.";
pub const FLOAT64_SUFFIX: &str = ".float64";

/// A tensor's description as stored in the file.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<usize>,
}

/// A parsed bundle; tensors live on the CPU in their stored dtype (bool as `U8`).
#[derive(Debug)]
pub struct Bundle {
    pub path: PathBuf,
    pub metadata: BTreeMap<String, String>,
    pub block: String,
    pub config: serde_json::Value,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub kwargs: serde_json::Map<String, serde_json::Value>,
    pub dtype: Option<String>,
    pub atol: Option<f64>,
    pub rtol: Option<f64>,
    pub infos: Vec<TensorInfo>,
    pub tensors: BTreeMap<String, Tensor>,
}

/// Map a safetensors dtype to Candle's. Bool becomes `U8` (0/1): Candle has no bool.
pub(crate) fn candle_dtype(dtype: safetensors::Dtype) -> Option<DType> {
    use safetensors::Dtype as S;
    Some(match dtype {
        S::BOOL | S::U8 => DType::U8,
        S::U32 => DType::U32,
        S::I16 => DType::I16,
        S::I32 => DType::I32,
        S::I64 => DType::I64,
        S::F16 => DType::F16,
        S::BF16 => DType::BF16,
        S::F32 => DType::F32,
        S::F64 => DType::F64,
        _ => return None,
    })
}

/// What [`read_file`] returns: metadata, the tensor table, and the tensors themselves.
pub type RawFile = (BTreeMap<String, String>, Vec<TensorInfo>, BTreeMap<String, Tensor>);

/// Read the raw metadata and tensor table of any safetensors file (used by `inspect` too).
pub fn read_file(path: &Path) -> Result<RawFile> {
    parse_file(path, &read_bytes(path)?)
}

/// The bytes of a regular file. A folder, a FIFO or a device is refused before reading, so a
/// pipe named `*.safetensors` cannot block the tool.
fn read_bytes(path: &Path) -> Result<Vec<u8>> {
    let io = |source| ParityError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(what) = not_regular(path).map_err(io)? {
        return Err(ParityError::Format {
            path: path.to_path_buf(),
            message: format!("{what}; a parity bundle is one .safetensors file"),
        });
    }
    std::fs::read(path).map_err(io)
}

/// What `path` is when it is not a regular file (`None` when it is).
fn not_regular(path: &Path) -> std::io::Result<Option<&'static str>> {
    let meta = std::fs::metadata(path)?;
    Ok(match () {
        _ if meta.is_file() => None,
        _ if meta.is_dir() => Some("a folder"),
        _ => Some("not a regular file (a FIFO, socket or device)"),
    })
}

/// `path` opened for reading once it is known to be a regular file: an `open` on a FIFO blocks
/// until a writer comes, and a device may never end.
pub(crate) fn open_regular(path: &Path) -> Result<std::fs::File> {
    let io = |source| ParityError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(what) = not_regular(path).map_err(io)? {
        return Err(io(std::io::Error::new(std::io::ErrorKind::InvalidInput, what)));
    }
    std::fs::File::open(path).map_err(io)
}

/// The text of a regular file ([`open_regular`]).
pub(crate) fn read_regular_string(path: &Path) -> Result<String> {
    use std::io::Read;
    let mut text = String::new();
    open_regular(path)?
        .read_to_string(&mut text)
        .map_err(|source| ParityError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(text)
}

/// Whether `bytes` starts like a safetensors file: an 8-byte little-endian header length that
/// fits the file, then the JSON header's `{`. (A header length such as 0x0580 starts with the
/// bytes `80 05`, which alone would read as a pickle's PROTO opcode.)
pub(crate) fn safetensors_prefix(bytes: &[u8], file_len: u64) -> bool {
    match bytes {
        [l0, l1, l2, l3, l4, l5, l6, l7, b'{', ..] => {
            let n = u64::from_le_bytes([*l0, *l1, *l2, *l3, *l4, *l5, *l6, *l7]);
            n > 0 && n.saturating_add(8) <= file_len
        }
        _ => false,
    }
}

/// Why `bytes` is a PyTorch checkpoint rather than safetensors, if it looks like one.
fn pickle_checkpoint(bytes: &[u8]) -> Option<&'static str> {
    if safetensors_prefix(bytes, bytes.len() as u64) {
        return None;
    }
    match bytes {
        // `torch.save` since 1.6 writes a zip archive holding `data.pkl`.
        [b'P', b'K', 3, 4, ..] => Some("a zip archive (a `torch.save` checkpoint)"),
        // The legacy `torch.save` format and plain `pickle.dump`: protocol 2 to 5.
        [0x80, 2..=5, ..] => Some("a Python pickle (a `torch.save` checkpoint)"),
        _ => None,
    }
}

/// Parse the bytes of a safetensors file; `path` only labels the errors.
/// Tensors a bundle may list: the largest committed one lists a few hundred; a header of a
/// million zero-size tensors (80 MB) took 1.3 GB and 14 s to parse before it was refused.
pub const MAX_TENSORS: usize = 1 << 16;

/// How many tensors a safetensors header lists, counted in its bytes before any parsing (each
/// entry has one `"data_offsets"` key; a string holding that text can only raise the count).
fn header_entries(bytes: &[u8]) -> usize {
    let Some(len) = bytes
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    else {
        return 0;
    };
    let header = &bytes[8..bytes
        .len()
        .min(8usize.saturating_add(len.min(usize::MAX as u64) as usize))];
    let key = b"\"data_offsets\"";
    header.windows(key.len()).filter(|w| w == key).count()
}

pub fn parse_file(path: &Path, bytes: &[u8]) -> Result<RawFile> {
    let format_err = |message: String| ParityError::Format {
        path: path.to_path_buf(),
        message,
    };
    if let Some(what) = pickle_checkpoint(bytes) {
        return Err(format_err(format!(
            "this is {what}, not safetensors: a bundle is never unpickled. Use the checkpoint as weights \
             (`check BUNDLE --weights FILE --prefix P`, `detect FILE`), or write a parity bundle with \
             scripts/parity_bundle.py `export_bundle`"
        )));
    }
    let entries = header_entries(bytes);
    if entries > MAX_TENSORS {
        return Err(format_err(format!(
            "the header lists {entries} tensors; a parity bundle holds at most {MAX_TENSORS} \
             (parsing them all would take gigabytes)"
        )));
    }
    let st = safetensors::SafeTensors::deserialize(bytes).map_err(|e| format_err(e.to_string()))?;
    let (_, header) = safetensors::SafeTensors::read_metadata(bytes).map_err(|e| format_err(e.to_string()))?;
    let metadata: BTreeMap<String, String> = header.metadata().clone().unwrap_or_default().into_iter().collect();
    let mut infos = vec![];
    let mut tensors = BTreeMap::new();
    let mut names: Vec<String> = st.names().into_iter().map(String::from).collect();
    names.sort();
    for name in names {
        let view = st
            .tensor(&name)
            .map_err(|e| format_err(format!("tensor `{name}`: {e}")))?;
        let shape = view.shape().to_vec();
        infos.push(TensorInfo {
            name: name.clone(),
            dtype: format!("{:?}", view.dtype()).to_lowercase(),
            shape: shape.clone(),
        });
        let dtype = candle_dtype(view.dtype()).ok_or_else(|| {
            format_err(format!(
                "tensor `{name}` has dtype {:?}, which this tool cannot read \
                 (it reads bool, u8, u32, i16, i32, i64, f16, bf16, f32, f64)",
                view.dtype()
            ))
        })?;
        let t = Tensor::from_raw_buffer(view.data(), dtype, &shape, &Device::Cpu)
            .map_err(|e| format_err(format!("tensor `{name}`: {e}")))?;
        tensors.insert(name, t);
    }
    Ok((metadata, infos, tensors))
}

fn json_field<T: serde::de::DeserializeOwned>(
    path: &Path,
    meta: &BTreeMap<String, String>,
    key: &str,
    what: &str,
) -> Result<Option<T>> {
    match meta.get(key) {
        None => Ok(None),
        Some(s) => serde_json::from_str(s)
            .map(Some)
            .map_err(|e| ParityError::bundle(path, format!("metadata `{key}` must be {what}: {e} (found {s:?})"))),
    }
}

impl Bundle {
    /// Read and validate a bundle.
    pub fn read(path: &Path) -> Result<Self> {
        Self::from_raw(path, read_file(path)?)
    }

    /// Parse and validate a bundle held in memory; `path` only labels it (in errors and reports).
    pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Self> {
        Self::from_raw(path, parse_file(path, bytes)?)
    }

    /// Validate a parsed file as a bundle.
    pub fn from_raw(path: &Path, (metadata, infos, tensors): RawFile) -> Result<Self> {
        let require = |key: &str| {
            metadata
                .get(key)
                .cloned()
                .ok_or_else(|| ParityError::bundle(path, format!("metadata `{key}` is missing")))
        };
        let format = require("parity.format")?;
        if format != FORMAT {
            return Err(ParityError::bundle(
                path,
                format!("`parity.format` is {format:?}; this tool reads format {FORMAT:?}"),
            ));
        }
        let block = require("parity.block")?;
        let config: serde_json::Value =
            json_field(path, &metadata, "parity.config", "a JSON object")?.unwrap_or_else(|| serde_json::json!({}));
        if !config.is_object() {
            return Err(ParityError::bundle(
                path,
                format!("metadata `parity.config` must be a JSON object, found {config}"),
            ));
        }
        let inputs: Vec<String> = json_field(path, &metadata, "parity.inputs", "a JSON array of strings")?
            .unwrap_or_else(|| names_with_prefix(&tensors, INPUT_PREFIX, false));
        let outputs: Vec<String> = json_field(path, &metadata, "parity.outputs", "a JSON array of strings")?
            .unwrap_or_else(|| names_with_prefix(&tensors, OUTPUT_PREFIX, true));
        let kwargs: serde_json::Map<String, serde_json::Value> =
            json_field(path, &metadata, "parity.kwargs", "a JSON object")?.unwrap_or_default();
        let float = |key: &str| -> Result<Option<f64>> {
            metadata
                .get(key)
                .map(|s| {
                    s.trim().parse::<f64>().map_err(|_| {
                        ParityError::bundle(path, format!("metadata `{key}` must be a number, found {s:?}"))
                    })
                })
                .transpose()
        };
        let (atol, rtol) = (float("parity.atol")?, float("parity.rtol")?);
        for (key, tol) in [("parity.atol", atol), ("parity.rtol", rtol)] {
            if let Some(t) = tol.filter(|t| crate::compare::check_tolerance(*t).is_err()) {
                return Err(ParityError::bundle(
                    path,
                    format!("metadata `{key}` must be a finite number ≥ 0, found {t}"),
                ));
            }
        }
        if inputs.is_empty() {
            return Err(ParityError::bundle(
                path,
                "no inputs (`parity.input.*` tensors / `parity.inputs`)",
            ));
        }
        if outputs.is_empty() {
            return Err(ParityError::bundle(
                path,
                "no outputs (`parity.output.*` tensors / `parity.outputs`)",
            ));
        }
        for name in &inputs {
            if !tensors.contains_key(&format!("{INPUT_PREFIX}{name}")) {
                return Err(ParityError::bundle(
                    path,
                    format!("`parity.inputs` names `{name}` but tensor `{INPUT_PREFIX}{name}` is missing"),
                ));
            }
        }
        for name in &outputs {
            if !tensors.contains_key(&format!("{OUTPUT_PREFIX}{name}")) {
                return Err(ParityError::bundle(
                    path,
                    format!("`parity.outputs` names `{name}` but tensor `{OUTPUT_PREFIX}{name}` is missing"),
                ));
            }
        }
        let dtype = metadata.get("parity.dtype").cloned();
        Ok(Self {
            path: path.to_path_buf(),
            metadata,
            block,
            config,
            inputs,
            outputs,
            kwargs,
            dtype,
            atol,
            rtol,
            infos,
            tensors,
        })
    }

    /// The block's own tensors (everything not under `parity.`), by state-dict name.
    pub fn weights(&self) -> BTreeMap<String, Tensor> {
        self.tensors
            .iter()
            .filter(|(k, _)| !k.starts_with("parity."))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    pub fn input(&self, name: &str) -> Option<&Tensor> {
        self.tensors.get(&format!("{INPUT_PREFIX}{name}"))
    }

    pub fn output(&self, name: &str) -> Option<&Tensor> {
        self.tensors.get(&format!("{OUTPUT_PREFIX}{name}"))
    }

    pub fn output_f64(&self, name: &str) -> Option<&Tensor> {
        self.tensors.get(&format!("{OUTPUT_PREFIX}{name}{FLOAT64_SUFFIX}"))
    }

    /// The dtype PyTorch ran in: `parity.dtype`, else the dtype of the first output.
    pub fn run_dtype(&self) -> Result<DType> {
        match self.dtype.as_deref() {
            Some(s) => parse_dtype(s).ok_or_else(|| {
                ParityError::bundle(
                    &self.path,
                    format!("`parity.dtype` {s:?} is not one of float32, float16, bfloat16, float64"),
                )
            }),
            None => Ok(self.output(&self.outputs[0]).map(|t| t.dtype()).unwrap_or(DType::F32)),
        }
    }
}

impl Bundle {
    /// Refuse weights, inputs and PyTorch's outputs (and their float64 twins) that hold NaN or
    /// ±inf: outputs on such inputs check nothing, and an output that is NaN or inf somewhere
    /// (an overflow in PyTorch's own run, a fully masked row) cannot vouch for ours there, so a
    /// comparison with it is never a PASS. Mask inputs may hold −inf, the "never attend" of an
    /// additive float mask. Also refuse integer inputs other than masks (bool masks are stored as
    /// u8).
    pub fn check_values(&self) -> Result<()> {
        let mut bad = vec![];
        for (name, t) in &self.tensors {
            let input = name.strip_prefix(INPUT_PREFIX);
            if let Some(input) = input.filter(|n| !n.contains("mask") && !t.dtype().is_float()) {
                return Err(ParityError::bundle(
                    &self.path,
                    format!(
                        "input `{input}` has dtype {}; only masks may be integer or bool, other inputs are floating-point",
                        format!("{:?}", t.dtype()).to_lowercase()
                    ),
                ));
            }
            if let Some(input) = input.filter(|_| t.elem_count() == 0) {
                return Err(ParityError::bundle(
                    &self.path,
                    format!(
                        "input `{input}` has shape {:?}, no elements: an empty input leaves nothing to compare",
                        t.dims()
                    ),
                ));
            }
            let output = name.strip_prefix(OUTPUT_PREFIX);
            if !t.dtype().is_float() || (name.starts_with("parity.") && input.is_none() && output.is_none()) {
                continue;
            }
            let values = t
                .to_dtype(DType::F64)
                .and_then(|t| t.flatten_all())
                .and_then(|t| t.to_vec1::<f64>())
                .map_err(|e| ParityError::bundle(&self.path, format!("tensor `{name}`: {e}")))?;
            let count = |f: fn(&f64) -> bool| values.iter().filter(|v| f(v)).count();
            let mask = input.is_some_and(|n| n.contains("mask"));
            let counts = [
                (count(|v| v.is_nan()), "NaN"),
                (count(|v| *v == f64::INFINITY), "+inf"),
                (if mask { 0 } else { count(|v| *v == f64::NEG_INFINITY) }, "-inf"),
            ];
            let found: Vec<String> = counts
                .iter()
                .filter(|(n, _)| *n > 0)
                .map(|(n, what)| format!("{n} {what}"))
                .collect();
            if !found.is_empty() {
                let kind = match (input, output) {
                    (Some(_), _) => "input",
                    (_, Some(_)) => "PyTorch's output",
                    _ => "weight",
                };
                bad.push(format!("{kind} `{name}` has {}", found.join(", ")));
            }
        }
        if bad.is_empty() {
            return Ok(());
        }
        Err(ParityError::Invalid {
            path: self.path.clone(),
            message: format!(
                "non-finite values: {} (a comparison with them proves nothing: export where PyTorch's run is \
                 finite; only mask inputs may hold -inf)",
                bad.join("; ")
            ),
        })
    }
}

fn names_with_prefix(tensors: &BTreeMap<String, Tensor>, prefix: &str, skip_f64: bool) -> Vec<String> {
    tensors
        .keys()
        .filter_map(|k| k.strip_prefix(prefix))
        .filter(|k| !(skip_f64 && k.ends_with(FLOAT64_SUFFIX)))
        .map(String::from)
        .collect()
}

/// Parse a dtype name as PyTorch or this CLI writes it.
pub fn parse_dtype(s: &str) -> Option<DType> {
    Some(match s.trim().trim_start_matches("torch.") {
        "float32" | "f32" | "float" => DType::F32,
        "float16" | "f16" | "half" => DType::F16,
        "bfloat16" | "bf16" => DType::BF16,
        "float64" | "f64" | "double" => DType::F64,
        _ => return None,
    })
}

/// All bundles under `paths` (files as given, folders searched recursively), sorted.
pub fn collect(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    collect_with_skipped(paths).map(|(files, _)| files)
}

/// [`collect`], also returning the safetensors files found in folders that are not bundles (whole
/// checkpoints such as `diffusion_pytorch_model.safetensors`: no `parity.*` metadata or tensors).
/// Files named explicitly are always kept.
pub fn collect_with_skipped(paths: &[PathBuf]) -> Result<(Vec<PathBuf>, Vec<PathBuf>)> {
    let mut out = vec![];
    let mut skipped = vec![];
    for path in paths {
        let meta = std::fs::metadata(path).map_err(|source| ParityError::Io {
            path: path.clone(),
            source,
        })?;
        if meta.is_dir() {
            let before = out.len();
            walk(path, &mut out, &mut skipped)?;
            if out.len() == before {
                return Err(ParityError::NoBundles { path: path.clone() });
            }
        } else {
            out.push(path.clone());
        }
    }
    Ok((out, skipped))
}

/// Whether a safetensors file is plainly not a bundle: its header parses and names nothing
/// `parity.*`. Unreadable headers count as bundles, so their errors are reported.
fn is_plain_checkpoint(path: &Path) -> bool {
    use std::io::Read;
    let Ok(mut f) = std::fs::File::open(path) else {
        return false;
    };
    let mut len = [0u8; 8];
    if f.read_exact(&mut len).is_err() {
        return false;
    }
    let n = u64::from_le_bytes(len);
    if n > 100_000_000 {
        return false;
    }
    let mut header = vec![0u8; n as usize];
    if f.read_exact(&mut header).is_err() {
        return false;
    }
    match serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&header) {
        Ok(h) => {
            let meta_has = h
                .get("__metadata__")
                .and_then(|m| m.as_object())
                .is_some_and(|m| m.keys().any(|k| k.starts_with("parity.")));
            !meta_has && !h.keys().any(|k| k.starts_with("parity."))
        }
        Err(_) => false,
    }
}

/// Folders are entered once each, by their canonical path: a symlink back up the tree (`self ->
/// .`, or `a -> .` and `b -> .`) neither loops nor finds a bundle twice. Only regular files are
/// opened to tell bundles from checkpoints; anything else named `*.safetensors` (a FIFO, a device)
/// is kept, so that reading it reports it, and is never opened here (an `open` on a FIFO blocks).
fn walk(dir: &Path, out: &mut Vec<PathBuf>, skipped: &mut Vec<PathBuf>) -> Result<()> {
    walk_once(dir, out, skipped, &mut std::collections::HashSet::new())
}

fn walk_once(
    dir: &Path,
    out: &mut Vec<PathBuf>,
    skipped: &mut Vec<PathBuf>,
    visited: &mut std::collections::HashSet<PathBuf>,
) -> Result<()> {
    let io = |source| ParityError::Io {
        path: dir.to_path_buf(),
        source,
    };
    if !visited.insert(std::fs::canonicalize(dir).map_err(io)?) {
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io)?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()
        .map_err(io)?;
    entries.sort();
    for p in entries {
        // Follows symlinks; a dangling one is neither and is left out.
        let Ok(meta) = std::fs::metadata(&p) else {
            continue;
        };
        if meta.is_dir() {
            walk_once(&p, out, skipped, visited)?;
        } else if p.extension().is_some_and(|e| e == "safetensors") {
            if meta.is_file() && is_plain_checkpoint(&p) {
                skipped.push(p);
            } else {
                out.push(p);
            }
        }
    }
    Ok(())
}
