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
fn candle_dtype(dtype: safetensors::Dtype) -> Option<DType> {
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
    let bytes = std::fs::read(path).map_err(|source| ParityError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let format_err = |message: String| ParityError::Format {
        path: path.to_path_buf(),
        message,
    };
    let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| format_err(format!("{e:?}")))?;
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).map_err(|e| format_err(format!("{e:?}")))?;
    let metadata: BTreeMap<String, String> = header.metadata().clone().unwrap_or_default().into_iter().collect();
    let mut infos = vec![];
    let mut tensors = BTreeMap::new();
    let mut names: Vec<String> = st.names().into_iter().map(String::from).collect();
    names.sort();
    for name in names {
        let view = st
            .tensor(&name)
            .map_err(|e| format_err(format!("tensor `{name}`: {e:?}")))?;
        let shape = view.shape().to_vec();
        infos.push(TensorInfo {
            name: name.clone(),
            dtype: format!("{:?}", view.dtype()).to_lowercase(),
            shape: shape.clone(),
        });
        let dtype = candle_dtype(view.dtype()).ok_or_else(|| {
            format_err(format!(
                "tensor `{name}` has dtype {:?}, which this tool cannot read",
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
        let (metadata, infos, tensors) = read_file(path)?;
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
    let mut out = vec![];
    for path in paths {
        let meta = std::fs::metadata(path).map_err(|source| ParityError::Io {
            path: path.clone(),
            source,
        })?;
        if meta.is_dir() {
            let before = out.len();
            walk(path, &mut out)?;
            if out.len() == before {
                return Err(ParityError::NoBundles { path: path.clone() });
            }
        } else {
            out.push(path.clone());
        }
    }
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let io = |source| ParityError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io)?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()
        .map_err(io)?;
    entries.sort();
    for p in entries {
        if p.is_dir() {
            walk(&p, out)?;
        } else if p.extension().is_some_and(|e| e == "safetensors") {
            out.push(p);
        }
    }
    Ok(())
}
