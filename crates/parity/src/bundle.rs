//! Reading parity bundles (format "1"): one safetensors file holding a block's state dict,
//! its forward inputs (`parity.input.<name>`), PyTorch's outputs (`parity.output.<name>`, and
//! `parity.output.<name>.float64`), and `__metadata__` describing the block.

use crate::error::{ParityError, Result};
use crate::st_file::{Source, StFile};
use candle_core::{DType, Device, Tensor};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use unet_attention::weights::non_finite_counts as non_finite;

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
pub(crate) use unet_attention::files::shards::candle_dtype;

/// What [`read_file`] returns: metadata, the tensor table, and the tensors themselves.
pub type RawFile = (BTreeMap<String, String>, Vec<TensorInfo>, BTreeMap<String, Tensor>);

/// Which tensors of a file to load: the table always lists them all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Load {
    /// Every tensor.
    All,
    /// Every tensor but the stage traces (`parity.trace.*`), which only `--trace` and `show` read:
    /// they are most of a bundle's bytes.
    NoStages,
}

/// Read the raw metadata and tensor table of any safetensors file, and its tensors. Neither
/// mapped nor read whole: the header, then each tensor's bytes ([`crate::st_file`]).
pub fn read_file(path: &Path) -> Result<RawFile> {
    read_file_with(path, Load::All)
}

/// [`read_file`], loading the tensors `load` names; the others are not read from the disk.
pub fn read_file_with(path: &Path, load: Load) -> Result<RawFile> {
    load_tensors(path, &open_bundle(path)?, load)
}

/// The metadata and the tensor table of a safetensors file: only its header is read (`inspect`).
pub fn read_header(path: &Path) -> Result<(BTreeMap<String, String>, Vec<TensorInfo>)> {
    Ok(table(&open_bundle(path)?))
}

/// A bundle file opened: a folder, a FIFO or a device is refused before it is opened, so a pipe
/// named `*.safetensors` cannot block the tool.
fn open_bundle(path: &Path) -> Result<StFile<'static>> {
    let io = |source| ParityError::Io {
        path: path.to_path_buf(),
        source,
    };
    if let Some(what) = crate::files::kind_if_not_regular(path).map_err(io)? {
        return Err(ParityError::Format {
            path: path.to_path_buf(),
            message: format!("{what}; a parity bundle is one .safetensors file"),
        });
    }
    open_source(path, Source::file(crate::files::open_regular(path)?))
}

/// Whether `bytes` (a file's first bytes) start like a safetensors file: an 8-byte little-endian
/// header length that fits the file, then the JSON header's `{`. (A header length such as 0x0580
/// starts with the bytes `80 05`, which alone would read as a pickle's PROTO opcode.)
pub(crate) fn safetensors_prefix(bytes: &[u8], file_len: u64) -> bool {
    match bytes {
        [l0, l1, l2, l3, l4, l5, l6, l7, b'{', ..] => {
            let n = u64::from_le_bytes([*l0, *l1, *l2, *l3, *l4, *l5, *l6, *l7]);
            n > 0 && n.saturating_add(8) <= file_len
        }
        _ => false,
    }
}

/// Why a file starting with `bytes` is a PyTorch checkpoint rather than safetensors, if it looks
/// like one.
fn pickle_checkpoint(bytes: &[u8], file_len: u64) -> Option<&'static str> {
    if safetensors_prefix(bytes, file_len) {
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

/// Tensors a bundle may list: the largest committed one lists a few hundred; a header of a
/// million zero-size tensors (80 MB) took 1.3 GB and 14 s to parse before it was refused.
pub const MAX_TENSORS: usize = 1 << 16;

/// How many tensors a safetensors header lists, counted in its bytes before any parsing (each
/// entry has one `"data_offsets"` key; a string holding that text can only raise the count).
fn header_entries(header: &[u8]) -> usize {
    let key = b"\"data_offsets\"";
    header.windows(key.len()).filter(|w| w == key).count()
}

/// Parse the bytes of a safetensors file; `path` only labels the errors.
pub fn parse_file(path: &Path, bytes: &[u8]) -> Result<RawFile> {
    parse_file_with(path, bytes, Load::All)
}

/// [`parse_file`], loading the tensors `load` names (see [`Load`]).
pub fn parse_file_with(path: &Path, bytes: &[u8], load: Load) -> Result<RawFile> {
    load_tensors(path, &open_source(path, Source::Bytes(bytes))?, load)
}

/// The header of `source` read and checked: not a pickle, not too many tensors, valid safetensors.
fn open_source<'a>(path: &Path, source: Source<'a>) -> Result<StFile<'a>> {
    let format_err = |message: String| ParityError::Format {
        path: path.to_path_buf(),
        message,
    };
    let io = |source| ParityError::Io {
        path: path.to_path_buf(),
        source,
    };
    let len = source.size().map_err(io)?;
    let mut first = [0u8; 9];
    let first = &mut first[..len.min(9) as usize];
    source.read_at(0, first).map_err(io)?;
    if let Some(what) = pickle_checkpoint(first, len) {
        return Err(format_err(format!(
            "this is {what}, not safetensors: a bundle is never unpickled. Use the checkpoint as weights \
             (`check BUNDLE --weights FILE --prefix P`, `detect FILE`), or write a parity bundle with \
             scripts/parity_bundle.py `export_bundle`"
        )));
    }
    let vet = |header: &[u8]| {
        let entries = header_entries(header);
        if entries > MAX_TENSORS {
            return Err(format!(
                "the header lists {entries} tensors; a parity bundle holds at most {MAX_TENSORS} \
                 (parsing them all would take gigabytes)"
            ));
        }
        Ok(())
    };
    StFile::open(source, vet).map_err(|e| e.at(path).into())
}

/// The metadata and the sorted tensor table of an opened file.
fn table(st: &StFile) -> (BTreeMap<String, String>, Vec<TensorInfo>) {
    let metadata = st.metadata.metadata().clone().unwrap_or_default().into_iter().collect();
    let mut infos: Vec<TensorInfo> = st
        .metadata
        .tensors()
        .into_iter()
        .map(|(name, info)| TensorInfo {
            name,
            dtype: format!("{:?}", info.dtype).to_lowercase(),
            shape: info.shape.clone(),
        })
        .collect();
    infos.sort_by(|a, b| a.name.cmp(&b.name));
    (metadata, infos)
}

/// The table of `st` and the tensors `load` names, each read on its own.
fn load_tensors(path: &Path, st: &StFile, load: Load) -> Result<RawFile> {
    let format_err = |message: String| ParityError::Format {
        path: path.to_path_buf(),
        message,
    };
    let (metadata, infos) = table(st);
    let mut tensors = BTreeMap::new();
    for info in &infos {
        let name = &info.name;
        let stored = st.metadata.info(name).expect("listed by the header");
        let dtype = candle_dtype(stored.dtype).ok_or_else(|| {
            format_err(format!(
                "tensor `{name}` has dtype {:?}, which this tool cannot read \
                 (it reads bool, u8, u32, i16, i32, i64, f16, bf16, f32, f64)",
                stored.dtype
            ))
        })?;
        if load == Load::NoStages && name.starts_with(crate::trace::TRACE_PREFIX) {
            continue;
        }
        let bytes = st.read(stored).map_err(|source| ParityError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let t = Tensor::from_raw_buffer(&bytes, dtype, &info.shape, &Device::Cpu)
            .map_err(|e| format_err(format!("tensor `{name}`: {e}")))?;
        tensors.insert(name.clone(), t);
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

/// `parity.block`, after checking that `parity.format` is the one this tool reads.
/// A file without any `parity.*` (a model checkpoint) is told what to do instead.
fn block_of(path: &Path, metadata: &BTreeMap<String, String>, infos: &[TensorInfo]) -> Result<String> {
    let require = |key: &str| {
        metadata.get(key).cloned().ok_or_else(|| {
            let names: Vec<&str> = infos.iter().map(|i| i.name.as_str()).collect();
            let next = crate::next_step::not_a_bundle(path, metadata, &names).unwrap_or_default();
            ParityError::bundle(path, format!("metadata `{key}` is missing{next}"))
        })
    };
    let format = require("parity.format")?;
    if format != FORMAT {
        return Err(ParityError::bundle(
            path,
            format!("`parity.format` is {format:?}; this tool reads format {FORMAT:?}"),
        ));
    }
    require("parity.block")
}

/// `parity.config`: a JSON object (`{}` when absent).
fn config_of(path: &Path, metadata: &BTreeMap<String, String>) -> Result<serde_json::Value> {
    let config: serde_json::Value =
        json_field(path, metadata, "parity.config", "a JSON object")?.unwrap_or_else(|| serde_json::json!({}));
    if !config.is_object() {
        return Err(ParityError::bundle(
            path,
            format!("metadata `parity.config` must be a JSON object, found {config}"),
        ));
    }
    Ok(config)
}

/// `parity.atol` and `parity.rtol`, each a finite number ≥ 0 when present.
fn tolerances(path: &Path, metadata: &BTreeMap<String, String>) -> Result<(Option<f64>, Option<f64>)> {
    let float = |key: &str| -> Result<Option<f64>> {
        metadata
            .get(key)
            .map(|s| {
                s.trim()
                    .parse::<f64>()
                    .map_err(|_| ParityError::bundle(path, format!("metadata `{key}` must be a number, found {s:?}")))
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
    Ok((atol, rtol))
}

/// A bundle has inputs and outputs, and a tensor for each one it names.
fn check_listed(path: &Path, listed: &BTreeSet<&str>, inputs: &[String], outputs: &[String]) -> Result<()> {
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
    for (names, prefix, key) in [
        (inputs, INPUT_PREFIX, "parity.inputs"),
        (outputs, OUTPUT_PREFIX, "parity.outputs"),
    ] {
        if let Some(name) = names.iter().find(|n| !listed.contains(format!("{prefix}{n}").as_str())) {
            return Err(ParityError::bundle(
                path,
                format!("`{key}` names `{name}` but tensor `{prefix}{name}` is missing"),
            ));
        }
    }
    Ok(())
}

impl Bundle {
    /// Read and validate a bundle (mapped: only the tensors' bytes are read).
    pub fn read(path: &Path) -> Result<Self> {
        Self::read_with(path, Load::All)
    }

    /// [`Bundle::read`], loading the tensors `load` names: `check` without `--trace` leaves the
    /// stage traces on the disk.
    pub fn read_with(path: &Path, load: Load) -> Result<Self> {
        let st = open_bundle(path)?;
        // A model checkpoint is told so from its header, before any of its tensors is read.
        let (metadata, infos) = table(&st);
        block_of(path, &metadata, &infos)?;
        Self::from_raw(path, load_tensors(path, &st, load)?)
    }

    /// Parse and validate a bundle held in memory; `path` only labels it (in errors and reports).
    pub fn from_bytes(path: &Path, bytes: &[u8]) -> Result<Self> {
        Self::from_raw(path, parse_file(path, bytes)?)
    }

    /// Validate a parsed file as a bundle.
    pub fn from_raw(path: &Path, (metadata, infos, tensors): RawFile) -> Result<Self> {
        let block = block_of(path, &metadata, &infos)?;
        let config = config_of(path, &metadata)?;
        let listed: BTreeSet<&str> = infos.iter().map(|i| i.name.as_str()).collect();
        let inputs: Vec<String> = json_field(path, &metadata, "parity.inputs", "a JSON array of strings")?
            .unwrap_or_else(|| names_with_prefix(&listed, INPUT_PREFIX, false));
        let outputs: Vec<String> = json_field(path, &metadata, "parity.outputs", "a JSON array of strings")?
            .unwrap_or_else(|| names_with_prefix(&listed, OUTPUT_PREFIX, true));
        let kwargs: serde_json::Map<String, serde_json::Value> =
            json_field(path, &metadata, "parity.kwargs", "a JSON object")?.unwrap_or_default();
        let (atol, rtol) = tolerances(path, &metadata)?;
        check_listed(path, &listed, &inputs, &outputs)?;
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
            None => self.inferred_dtype(),
        }
    }

    /// Without `parity.dtype`: the dtype of the first output, if a weight or input was stored in
    /// it too. Half-precision outputs of a bundle whose every float weight and input is float32
    /// are refused: rounding an f32 run's output to f16/bf16 would otherwise have it judged at a
    /// half dtype's tolerances.
    fn inferred_dtype(&self) -> Result<DType> {
        let Some(dtype) = self.outputs.first().and_then(|o| self.output(o)).map(|t| t.dtype()) else {
            return Ok(DType::F32);
        };
        if !matches!(dtype, DType::F16 | DType::BF16) {
            return Ok(dtype);
        }
        let stored_in_it = self
            .tensors
            .iter()
            .filter(|(name, _)| !name.starts_with(OUTPUT_PREFIX) && !name.starts_with(crate::trace::TRACE_PREFIX))
            .any(|(_, t)| t.dtype() == dtype);
        if stored_in_it {
            return Ok(dtype);
        }
        Err(ParityError::bundle(
            &self.path,
            format!(
                "the bundle has no `parity.dtype` and its outputs are {} while no weight or input is: a float32 run's \
                 output rounded to {} would be judged at {}'s tolerances; set `parity.dtype` to the dtype PyTorch ran in",
                dtype.as_str(),
                dtype.as_str(),
                dtype.as_str()
            ),
        ))
    }

    /// Check again what [`Bundle::from_raw`] checked, on the public fields as they are now (a
    /// `Bundle` built or edited by hand): inputs and outputs listed, a loaded tensor for each,
    /// tolerances finite and ≥ 0, `dtype` one this tool runs in.
    pub fn validate(&self) -> Result<()> {
        let loaded: BTreeSet<&str> = self.tensors.keys().map(String::as_str).collect();
        check_listed(&self.path, &loaded, &self.inputs, &self.outputs)?;
        for (key, tol) in [("parity.atol", self.atol), ("parity.rtol", self.rtol)] {
            if let Some(t) = tol.filter(|t| crate::compare::check_tolerance(*t).is_err()) {
                return Err(ParityError::bundle(
                    &self.path,
                    format!("`{key}` must be a finite number ≥ 0, found {t}"),
                ));
            }
        }
        self.run_dtype().map(|_| ())
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
            let mask = input.is_some_and(|n| n.contains("mask"));
            let [nan, pos, neg] =
                non_finite(t).map_err(|e| ParityError::bundle(&self.path, format!("tensor `{name}`: {e}")))?;
            let counts = [(nan, "NaN"), (pos, "+inf"), (if mask { 0 } else { neg }, "-inf")];
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

fn names_with_prefix(names: &BTreeSet<&str>, prefix: &str, skip_f64: bool) -> Vec<String> {
    names
        .iter()
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

/// All bundles under `paths` (files as given, folders searched recursively, symbolic links to
/// folders not followed: [`crate::files::collect`]).
pub fn collect(paths: &[PathBuf]) -> Result<Vec<PathBuf>> {
    crate::files::collect(paths).map(|found| found.bundles)
}
