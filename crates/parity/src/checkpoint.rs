//! Whole-model checkpoints, read lazily, so a block's weights can come from where they are:
//!
//! * safetensors (`diffusion_pytorch_model.safetensors`, `model.safetensors`): memory-mapped;
//!   only the header is parsed up front and only the tensors a block asks for are touched;
//! * sharded safetensors (`*.safetensors.index.json` with its `weight_map`);
//! * PyTorch `torch.save` zip archives (`.bin`, `.pt`, `.pth`, `.ckpt`): `data.pkl` is read with
//!   Candle's pickle reader, which interprets the opcodes without running any Python, and a
//!   tensor's storage entry is read from the archive only when the block asks for it.
//!
//! Nested dictionaries are flattened with dots: a lucidrains `Trainer` checkpoint
//! `{'model': {...}, 'ema': {...}, 'version': '2.3.4', ...}` holds `model.model.mid_attn.mem_kv`
//! and `ema.ema_model.model.mid_attn.mem_kv`; an SD `.ckpt` holds
//! `state_dict.model.diffusion_model.middle_block.1.norm.weight`. Top-level entries that hold such
//! dictionaries are *sections*; a prefix is looked up inside each section first (so
//! `model.diffusion_model.middle_block.` finds the SD middle block), then as a full name.
//! String entries (lucidrains' `version`) are kept for `detect`.

use crate::error::{ParityError, Result};
use crate::weights::WeightSource;
use candle_core::pickle::{Object, Stack};
use candle_core::{DType, Device, Tensor};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How the file stores its tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Safetensors,
    ShardedSafetensors,
    TorchZip,
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Format::Safetensors => "safetensors",
            Format::ShardedSafetensors => "sharded safetensors",
            Format::TorchZip => "PyTorch zip pickle (torch.save)",
        })
    }
}

/// Where one tensor lives.
#[derive(Debug, Clone)]
enum Stored {
    Safetensors {
        file: usize,
        start: usize,
        end: usize,
        dtype: DType,
        shape: Vec<usize>,
    },
    Pickle(candle_core::pickle::TensorInfo),
    /// A tensor this tool cannot load (an unsupported dtype); an error only if a block asks for it.
    Unsupported {
        why: String,
    },
}

type Archive = zip::ZipArchive<std::io::BufReader<std::fs::File>>;

/// An opened checkpoint.
pub struct Checkpoint {
    pub path: PathBuf,
    pub format: Format,
    tensors: BTreeMap<String, Stored>,
    /// String entries of a pickle by flattened name (e.g. `version`).
    pub strings: BTreeMap<String, String>,
    /// Top-level entries holding nested tensors (`model`, `ema`, `state_dict`, ...).
    pub sections: Vec<String>,
    maps: Vec<memmap2::Mmap>,
    /// The open archive of a pickle, its central directory read once; tensors are read from it
    /// one at a time.
    archive: Option<std::sync::Mutex<Archive>>,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("path", &self.path)
            .field("format", &self.format)
            .field("tensors", &self.tensors.len())
            .field("sections", &self.sections)
            .finish()
    }
}

fn err(path: &Path, message: impl Into<String>) -> ParityError {
    ParityError::Checkpoint {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// Nested dictionaries deeper than this are not followed (a checkpoint's state dict is at depth
/// 1 or 2; a hostile pickle must not exhaust the stack).
const MAX_DEPTH: usize = 24;

impl Checkpoint {
    /// Open `path`, reading only its header / pickle.
    pub fn open(path: &Path) -> Result<Self> {
        let io = |e: std::io::Error| ParityError::Io {
            path: path.to_path_buf(),
            source: e,
        };
        let meta = std::fs::metadata(path).map_err(io)?;
        if !meta.is_file() {
            return Err(err(path, "not a regular file"));
        }
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        if name.ends_with(".index.json") {
            return Self::open_sharded(path);
        }
        let mut magic = [0u8; 9];
        let n = std::fs::File::open(path).map_err(io)?.read(&mut magic).map_err(io)?;
        if crate::bundle::safetensors_prefix(&magic[..n], meta.len()) {
            return Self::open_safetensors(path);
        }
        match &magic[..n] {
            [b'P', b'K', 3, 4, ..] => Self::open_pickle(path),
            [0x80, ..] => Err(err(
                path,
                "a legacy (pre-1.6, non-zip) torch.save file, which this tool does not read; re-save it with \
                 torch >= 1.6 (`torch.save(torch.load(f), f2)`) or convert it to safetensors",
            )),
            _ => Self::open_safetensors(path),
        }
    }

    fn open_safetensors(path: &Path) -> Result<Self> {
        let mut ck = Self::empty(path, Format::Safetensors);
        ck.add_safetensors_file(path, None)?;
        Ok(ck)
    }

    fn empty(path: &Path, format: Format) -> Self {
        Self {
            path: path.to_path_buf(),
            format,
            tensors: BTreeMap::new(),
            strings: BTreeMap::new(),
            sections: vec![],
            maps: vec![],
            archive: None,
        }
    }

    /// Map one safetensors file and index its tensors (all of them, or only `only`).
    fn add_safetensors_file(&mut self, file: &Path, only: Option<&BTreeSet<String>>) -> Result<()> {
        let f = crate::bundle::open_regular(file)?;
        // SAFETY: the map is read-only; the file must not be truncated while the tool runs, the
        // same contract as Candle's `MmapedSafetensors`.
        let map = unsafe { memmap2::Mmap::map(&f) }.map_err(|e| ParityError::Io {
            path: file.to_path_buf(),
            source: e,
        })?;
        let (n, metadata) = safetensors::SafeTensors::read_metadata(&map).map_err(|e| ParityError::Format {
            path: file.to_path_buf(),
            message: e.to_string(),
        })?;
        let index = self.maps.len();
        let base = 8 + n;
        for (name, info) in metadata.tensors() {
            if only.is_some_and(|o| !o.contains(&name)) {
                continue;
            }
            let stored = match crate::bundle::candle_dtype(info.dtype) {
                Some(dtype) => Stored::Safetensors {
                    file: index,
                    start: base + info.data_offsets.0,
                    end: base + info.data_offsets.1,
                    dtype,
                    shape: info.shape.clone(),
                },
                None => Stored::Unsupported {
                    why: format!("dtype {:?} is not supported", info.dtype),
                },
            };
            self.tensors.insert(name, stored);
        }
        self.maps.push(map);
        Ok(())
    }

    fn open_sharded(path: &Path) -> Result<Self> {
        let text = crate::bundle::read_regular_string(path)?;
        let index: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| err(path, format!("not a JSON index: {e}")))?;
        let map = index
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| err(path, "the index has no `weight_map` object"))?;
        let mut files: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (tensor, file) in map {
            let file = file
                .as_str()
                .ok_or_else(|| err(path, format!("`weight_map.{tensor}` is not a file name")))?;
            if file.contains('/') || file.contains('\\') || file.contains("..") {
                return Err(err(path, format!("shard name {file:?} is not a plain file name")));
            }
            files.entry(file.to_string()).or_default().insert(tensor.clone());
        }
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut ck = Self::empty(path, Format::ShardedSafetensors);
        for (file, names) in &files {
            ck.add_safetensors_file(&dir.join(file), Some(names))?;
        }
        Ok(ck)
    }

    fn open_pickle(path: &Path) -> Result<Self> {
        let file = crate::bundle::open_regular(path)?;
        let mut zip = zip::ZipArchive::new(std::io::BufReader::new(file))
            .map_err(|e| err(path, format!("not a readable torch.save zip archive: {e}")))?;
        let pkl = zip
            .file_names()
            .filter_map(|f| f.ok())
            .find(|f| f.ends_with("data.pkl"))
            .map(|f| f.to_string())
            .ok_or_else(|| err(path, "the zip archive has no `data.pkl`: not a torch.save checkpoint"))?;
        let dir = PathBuf::from(pkl.strip_suffix(".pkl").unwrap_or(&pkl));
        let mut ck = Self::empty(path, Format::TorchZip);
        let mut sections = BTreeSet::new();
        {
            let mut reader = std::io::BufReader::new(
                zip.by_name(&pkl)
                    .map_err(|e| err(path, format!("cannot open `{pkl}`: {e}")))?,
            );
            // Candle's reader panics on some malformed input (a LONG1 wider than 8 bytes overflows a
            // shift in builds with overflow checks; a tensor rebuild with too few arguments indexes
            // out of bounds): those become this file's error too.
            crate::guard::catch(path, || {
                let mut stack = Stack::empty();
                stack
                    .read_loop(&mut reader)
                    .map_err(|e| err(path, format!("cannot read the pickle `{pkl}`: {e}")))?;
                let obj = stack
                    .finalize()
                    .map_err(|e| err(path, format!("cannot read the pickle `{pkl}`: {e}")))?;
                ck.walk(obj, "", &dir, 0, &mut sections);
                Ok(())
            })
            .map_err(|e| match e {
                ParityError::Internal { message, .. } => err(
                    path,
                    format!("malformed pickle `{pkl}`: Candle's pickle reader failed ({message})"),
                ),
                other => other,
            })?;
        }
        ck.archive = Some(std::sync::Mutex::new(zip));
        ck.sections = sections.into_iter().collect();
        if ck.tensors.is_empty() {
            return Err(err(path, "the pickle holds no tensors"));
        }
        Ok(ck)
    }

    /// Collect the tensors and strings of a pickled object, flattening dictionaries.
    fn walk(&mut self, obj: Object, name: &str, dir: &Path, depth: usize, sections: &mut BTreeSet<String>) {
        if depth > MAX_DEPTH {
            return;
        }
        match obj {
            Object::Dict(items) => {
                for (key, value) in items {
                    let key = match key {
                        Object::Unicode(s) => s,
                        Object::Int(i) => i.to_string(),
                        Object::Long(i) => i.to_string(),
                        _ => continue,
                    };
                    if key == "_metadata" {
                        continue;
                    }
                    let full = if name.is_empty() {
                        key.clone()
                    } else {
                        format!("{name}.{key}")
                    };
                    if depth == 0 && matches!(value, Object::Dict(_)) {
                        let before = self.tensors.len();
                        self.walk(value, &full, dir, depth + 1, sections);
                        if self.tensors.len() > before {
                            sections.insert(key);
                        }
                    } else {
                        self.walk(value, &full, dir, depth + 1, sections);
                    }
                }
            }
            Object::Unicode(s) => {
                self.strings.insert(name.to_string(), s);
            }
            other => match other.into_tensor_info(Object::Unicode(name.to_string()), dir) {
                Ok(Some(info)) => {
                    self.tensors.insert(name.to_string(), Stored::Pickle(info));
                }
                Ok(None) => {}
                Err(e) => {
                    self.tensors
                        .insert(name.to_string(), Stored::Unsupported { why: e.to_string() });
                }
            },
        }
    }

    /// Every tensor name, flattened.
    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.tensors.keys()
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// The stored shape of `name`, when the tensor is loadable.
    pub fn shape(&self, name: &str) -> Option<Vec<usize>> {
        match self.tensors.get(name)? {
            Stored::Safetensors { shape, .. } => Some(shape.clone()),
            Stored::Pickle(info) => Some(info.layout.dims().to_vec()),
            Stored::Unsupported { .. } => None,
        }
    }

    /// The stored dtype of `name`, when the tensor is loadable.
    pub fn dtype(&self, name: &str) -> Option<DType> {
        match self.tensors.get(name)? {
            Stored::Safetensors { dtype, .. } => Some(*dtype),
            Stored::Pickle(info) => Some(info.dtype),
            Stored::Unsupported { .. } => None,
        }
    }

    /// Load `name` onto the CPU in its stored dtype (`None` if absent).
    pub fn load(&self, name: &str) -> candle_core::Result<Option<Tensor>> {
        let Some(stored) = self.tensors.get(name) else {
            return Ok(None);
        };
        let fail = |m: String| candle_core::Error::Msg(format!("{}: tensor `{name}`: {m}", self.path.display()));
        match stored {
            Stored::Unsupported { why } => Err(fail(why.clone())),
            Stored::Safetensors {
                file,
                start,
                end,
                dtype,
                shape,
            } => {
                let bytes = &self.maps[*file][*start..*end];
                Tensor::from_raw_buffer(bytes, *dtype, shape, &Device::Cpu).map(Some)
            }
            Stored::Pickle(info) => {
                // A hostile shape can overflow Candle's element count: an error, not a panic.
                let loaded = crate::guard::catch(&self.path, || {
                    self.load_pickled(info).map_err(|e| ParityError::Usage(e.to_string()))
                });
                loaded.map_err(|e| fail(e.to_string())).map(Some)
            }
        }
    }

    fn load_pickled(&self, info: &candle_core::pickle::TensorInfo) -> candle_core::Result<Tensor> {
        let layout = &info.layout;
        let fortran = layout.is_fortran_contiguous() && !layout.is_contiguous();
        if !layout.is_contiguous() && !fortran {
            candle_core::bail!(
                "non-contiguous storage layout {:?} (save a .contiguous() copy)",
                layout.stride()
            )
        }
        let mut zip = self
            .archive
            .as_ref()
            .expect("pickle checkpoints keep their archive")
            .lock()
            // A panic during an earlier read (caught by the guard) leaves nothing half-done: each
            // read seeks to its own entry.
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut entry = zip.by_name(&info.path).map_err(candle_core::Error::wrap)?;
        let elem = info.dtype.size_in_bytes();
        let numel = layout.shape().elem_count();
        let start = layout.start_offset();
        let needed = numel
            .checked_mul(elem)
            .and_then(|n| n.checked_add(start))
            .ok_or_else(|| candle_core::Error::Msg("tensor size overflows".into()))?;
        if (entry.size() as u128) < needed as u128 {
            candle_core::bail!(
                "storage `{}` holds {} bytes, the tensor needs {needed}",
                info.path,
                entry.size()
            )
        }
        std::io::copy(&mut entry.by_ref().take(start as u64), &mut std::io::sink())?;
        let mut bytes = vec![0u8; numel * elem];
        entry.read_exact(&mut bytes)?;
        let dims = layout.dims();
        if fortran && dims.len() > 1 {
            let reversed: Vec<usize> = dims.iter().rev().copied().collect();
            let t = Tensor::from_raw_buffer(&bytes, info.dtype, &reversed, &Device::Cpu)?;
            let perm: Vec<usize> = (0..dims.len()).rev().collect();
            t.permute(perm)?.contiguous()
        } else {
            Tensor::from_raw_buffer(&bytes, info.dtype, dims, &Device::Cpu)
        }
    }

    /// The full prefix a user's `prefix` stands for: inside exactly one section (`model.` in a
    /// Trainer checkpoint is `model.model.`), else the prefix itself. An error when nothing is
    /// under it or when several sections have it.
    pub fn resolve_prefix(&self, prefix: &str) -> Result<String> {
        let has = |p: &str| {
            self.tensors
                .range(p.to_string()..)
                .next()
                .is_some_and(|(k, _)| k.starts_with(p))
        };
        let hits: Vec<String> = self
            .sections
            .iter()
            .map(|s| format!("{s}.{prefix}"))
            .filter(|p| has(p))
            .collect();
        match hits.len() {
            1 => return Ok(hits[0].clone()),
            0 => {}
            _ => {
                return Err(err(
                    &self.path,
                    format!(
                        "prefix `{prefix}` is found in several sections ({}); give the full prefix, e.g. `{}`",
                        hits.join(", "),
                        hits[0]
                    ),
                ))
            }
        }
        if has(prefix) {
            return Ok(prefix.to_string());
        }
        let sections = if self.sections.is_empty() {
            String::new()
        } else {
            format!("; sections: {}", self.sections.join(", "))
        };
        let sample: Vec<&String> = self.tensors.keys().take(3).collect();
        Err(err(
            &self.path,
            format!(
                "no tensor under prefix `{prefix}` ({} tensors, e.g. {}{sections}); `unet-parity detect {}` lists the \
                 mid blocks it finds",
                self.tensors.len(),
                sample.iter().map(|s| format!("`{s}`")).collect::<Vec<_>>().join(", "),
                self.path.display()
            ),
        ))
    }
}

/// The tensors of a checkpoint under one prefix, by their names relative to it.
pub struct PrefixView {
    pub checkpoint: Arc<Checkpoint>,
    /// The full prefix (after [`Checkpoint::resolve_prefix`]).
    pub prefix: String,
    names: Vec<String>,
}

impl PrefixView {
    pub fn new(checkpoint: Arc<Checkpoint>, prefix: &str) -> Result<Self> {
        let prefix = checkpoint.resolve_prefix(prefix)?;
        let names = checkpoint
            .names()
            .filter_map(|n| n.strip_prefix(&prefix).map(str::to_string))
            .collect();
        Ok(Self {
            checkpoint,
            prefix,
            names,
        })
    }
}

impl WeightSource for PrefixView {
    fn names(&self) -> Vec<String> {
        self.names.clone()
    }

    fn load(&self, name: &str) -> candle_core::Result<Option<Tensor>> {
        self.checkpoint.load(&format!("{}{name}", self.prefix))
    }

    fn location(&self) -> Option<String> {
        Some(format!("{} (prefix `{}`)", self.checkpoint.path.display(), self.prefix))
    }
}
