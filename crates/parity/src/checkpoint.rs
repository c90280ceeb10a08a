//! Whole-model checkpoints, read lazily, so a block's weights can come from where they are:
//!
//! * safetensors (`diffusion_pytorch_model.safetensors`, `model.safetensors`): neither mapped
//!   nor read whole ([`crate::st_file`]); only the header is read up front, and only the tensors a
//!   block asks for are read, each after its dtype and shape passed the block's checks;
//! * sharded safetensors (`*.safetensors.index.json` with its `weight_map`, honoured: a tensor in
//!   another shard than the index names, or in two, is an error naming both); both safetensors
//!   forms are read by `unet_attention::files::shards`, the reader the library's model loaders use;
//! * PyTorch `torch.save` zip archives (`.bin`, `.pt`, `.pth`, `.ckpt`): `data.pkl` (at most
//!   [`pickle::MAX_PICKLE_BYTES`], read through `take`) is read by [`crate::pickle`], which
//!   interprets the opcodes without running any Python and bounds depth, object count and
//!   string lengths while parsing; a tensor's storage entry is read from the archive only when the
//!   block asks for it, after its zip header's sizes are checked against the archive's length and
//!   against what the tensor needs.
//!
//! Nested dictionaries are flattened with dots: a lucidrains `Trainer` checkpoint
//! `{'model': {...}, 'ema': {...}, 'version': '2.3.4', ...}` holds `model.model.mid_attn.mem_kv`
//! and `ema.ema_model.model.mid_attn.mem_kv`; an SD `.ckpt` holds
//! `state_dict.model.diffusion_model.middle_block.1.norm.weight`. Top-level entries that hold such
//! dictionaries are *sections*; a prefix is looked up inside each section first (so
//! `model.diffusion_model.middle_block.` finds the SD middle block), then as a full name.
//! String entries (lucidrains' `version`) are kept for `detect`.

use crate::error::{ParityError, Result};
use crate::pickle::{self, TensorRecord};
use crate::weights::WeightSource;
use candle_core::{DType, Device, Layout, Shape, Tensor};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use unet_attention::files::shards::SafetensorsFiles;

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
    /// In the safetensors file or shards (`Checkpoint::st`), in a dtype Candle loads.
    Safetensors,
    Pickle(PickledTensor),
    /// A tensor this tool cannot load (an unsupported dtype); an error only if a block asks for it.
    Unsupported {
        why: String,
    },
}

/// A tensor of a `torch.save` archive: its record and its storage entry's path in the archive.
#[derive(Debug, Clone)]
struct PickledTensor {
    record: TensorRecord,
    path: String,
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
    /// The safetensors file or a sharded checkpoint's shards, their headers read.
    st: Option<SafetensorsFiles>,
    /// The open archive of a pickle, its central directory read once; tensors are read from it
    /// one at a time.
    archive: Option<std::sync::Mutex<Archive>>,
    /// The archive's length in bytes: no entry's data may claim to reach past it.
    archive_len: u64,
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

/// A file name a `torch.save` checkpoint goes by (`.bin`, `.pt`, `.pth`, `.ckpt`).
fn is_pickle_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    [".bin", ".pt", ".pth", ".ckpt"].iter().any(|ext| lower.ends_with(ext))
}

/// `bytes` as hex pairs (`4a 55 4e 4b`), or `none` (an empty file).
fn hex_bytes(bytes: &[u8]) -> String {
    if bytes.is_empty() {
        return "none (the file is empty)".into();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ")
}

fn err(path: &Path, message: impl Into<String>) -> ParityError {
    ParityError::Checkpoint {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

impl Checkpoint {
    /// Open `path`, reading only its header / pickle.
    pub fn open(path: &Path) -> Result<Self> {
        let io = |e: std::io::Error| ParityError::Io {
            path: path.to_path_buf(),
            source: e,
        };
        let mut file = crate::files::open_regular(path)?;
        let len = file.metadata().map_err(io)?.len();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default();
        if name.ends_with(".index.json") {
            return Self::open_sharded(path);
        }
        let mut magic = [0u8; 9];
        let n = file.read(&mut magic).map_err(io)?;
        if crate::bundle::safetensors_prefix(&magic[..n], len) {
            return Self::open_safetensors(path);
        }
        match &magic[..n] {
            [b'P', b'K', 3, 4, ..] => Self::open_pickle(path),
            [0x80, ..] => Err(err(
                path,
                "a legacy (pre-1.6, non-zip) torch.save file, which this tool does not read; re-save it with \
                 torch >= 1.6 (`torch.save(torch.load(f), f2)`) or convert it to safetensors",
            )),
            first if is_pickle_name(&name) => Err(err(
                path,
                format!(
                    "neither a zip archive (a torch.save checkpoint starts with `PK\\x03\\x04`) nor a pickle \
                     (`\\x80`) nor safetensors: its first bytes are {}",
                    hex_bytes(first)
                ),
            )),
            _ => Self::open_safetensors(path),
        }
    }

    fn open_safetensors(path: &Path) -> Result<Self> {
        Self::from_safetensors(path, Format::Safetensors, SafetensorsFiles::open_file(path)?)
    }

    fn open_sharded(path: &Path) -> Result<Self> {
        Self::from_safetensors(path, Format::ShardedSafetensors, SafetensorsFiles::open_index(path)?)
    }

    fn from_safetensors(path: &Path, format: Format, st: SafetensorsFiles) -> Result<Self> {
        let mut ck = Self::empty(path, format);
        for name in st.names() {
            let stored = match st.dtype(name) {
                Some(Err(why)) => Stored::Unsupported { why },
                _ => Stored::Safetensors,
            };
            ck.tensors.insert(name.clone(), stored);
        }
        ck.st = Some(st);
        Ok(ck)
    }

    fn empty(path: &Path, format: Format) -> Self {
        Self {
            path: path.to_path_buf(),
            format,
            tensors: BTreeMap::new(),
            strings: BTreeMap::new(),
            sections: vec![],
            st: None,
            archive: None,
            archive_len: 0,
        }
    }

    fn open_pickle(path: &Path) -> Result<Self> {
        let file = crate::files::open_regular(path)?;
        let archive_len = file
            .metadata()
            .map_err(|e| ParityError::Io {
                path: path.to_path_buf(),
                source: e,
            })?
            .len();
        let mut zip = zip::ZipArchive::new(std::io::BufReader::new(file))
            .map_err(|e| err(path, format!("not a readable torch.save zip archive: {e}")))?;
        let pkl = zip
            .file_names()
            .filter_map(|f| f.ok())
            .find(|f| f.ends_with("data.pkl"))
            .map(|f| f.to_string())
            .ok_or_else(|| err(path, "the zip archive has no `data.pkl`: not a torch.save checkpoint"))?;
        let bytes = {
            let mut entry = zip
                .by_name(&pkl)
                .map_err(|e| err(path, format!("cannot open `{pkl}`: {e}")))?;
            read_entry(&mut entry, archive_len, pickle::MAX_PICKLE_BYTES)
                .map_err(|m| err(path, format!("cannot read `{pkl}`: {m}")))?
        };
        // No input is known to panic the reader; the guard keeps a bug in it to this file's error.
        let contents = crate::guard::catch(path, || {
            pickle::read(&bytes).map_err(|m| err(path, format!("malformed pickle `{pkl}`: {m}")))
        })?;
        drop(bytes);
        // `archive/data.pkl` keeps its storages in `archive/data/{key}`.
        let stem = pkl.strip_suffix(".pkl").unwrap_or(&pkl);
        let mut ck = Self::empty(path, Format::TorchZip);
        for (name, found) in contents.tensors {
            let stored = match found {
                Ok(record) => Stored::Pickle(PickledTensor {
                    path: format!("{stem}/{}", record.key),
                    record,
                }),
                Err(why) => Stored::Unsupported { why },
            };
            ck.tensors.insert(name, stored);
        }
        ck.strings = contents.strings;
        ck.sections = contents.sections.into_iter().collect();
        ck.archive = Some(std::sync::Mutex::new(zip));
        ck.archive_len = archive_len;
        if ck.tensors.is_empty() {
            return Err(err(path, "the pickle holds no tensors"));
        }
        Ok(ck)
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
            Stored::Safetensors => self.st.as_ref()?.shape(name).map(<[usize]>::to_vec),
            Stored::Pickle(t) => Some(t.record.shape.clone()),
            Stored::Unsupported { .. } => None,
        }
    }

    /// The stored dtype of `name`, when the tensor is loadable.
    pub fn dtype(&self, name: &str) -> Option<DType> {
        match self.tensors.get(name)? {
            Stored::Safetensors => self.st.as_ref()?.dtype(name)?.ok(),
            Stored::Pickle(t) => Some(t.record.dtype),
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
            Stored::Safetensors => match &self.st {
                Some(st) => st.load(name),
                None => Err(fail("no safetensors file open".into())),
            },
            Stored::Pickle(info) => {
                // A hostile shape can overflow Candle's element count: an error, not a panic.
                let loaded = crate::guard::catch(&self.path, || {
                    self.load_pickled(info).map_err(|e| ParityError::Usage(e.to_string()))
                });
                loaded.map_err(|e| fail(e.to_string())).map(Some)
            }
        }
    }

    fn load_pickled(&self, t: &PickledTensor) -> candle_core::Result<Tensor> {
        let r = &t.record;
        let layout = Layout::new(Shape::from(r.shape.clone()), r.stride.clone(), 0);
        let fortran = layout.is_fortran_contiguous() && !layout.is_contiguous();
        if !layout.is_contiguous() && !fortran {
            candle_core::bail!(
                "non-contiguous storage layout {:?} (save a .contiguous() copy)",
                layout.stride()
            )
        }
        // The pickle reader checked that `(elements + offset) * element size` fits.
        let elem = r.dtype.size_in_bytes();
        let size = layout.shape().elem_count() * elem;
        let start = r.offset * elem;
        let needed = size + start;
        let mut zip = self
            .archive
            .as_ref()
            .expect("pickle checkpoints keep their archive")
            .lock()
            // A panic during an earlier read (caught by the guard) leaves nothing half-done: each
            // read seeks to its own entry.
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut entry = zip.by_name(&t.path).map_err(candle_core::Error::wrap)?;
        check_entry(&entry, self.archive_len)
            .map_err(|m| candle_core::Error::Msg(format!("storage `{}`: {m}", t.path)))?;
        if entry.size() < needed as u64 {
            candle_core::bail!(
                "storage `{}` holds {} bytes, the tensor needs {needed}",
                t.path,
                entry.size()
            )
        }
        std::io::copy(&mut entry.by_ref().take(start as u64), &mut std::io::sink())?;
        // `size` is at most the entry's size, whose bytes `check_entry` found in the file.
        let mut bytes = vec![0u8; size];
        entry.read_exact(&mut bytes)?;
        let dims = layout.dims();
        if fortran && dims.len() > 1 {
            let reversed: Vec<usize> = dims.iter().rev().copied().collect();
            let t = Tensor::from_raw_buffer(&bytes, r.dtype, &reversed, &Device::Cpu)?;
            let perm: Vec<usize> = (0..dims.len()).rev().collect();
            t.permute(perm)?.contiguous()
        } else {
            Tensor::from_raw_buffer(&bytes, r.dtype, dims, &Device::Cpu)
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

/// An archive entry's header claims, checked against the archive before any of its bytes are
/// read: its data lies inside the file, and (stored, the only method this build reads) its two
/// sizes agree. A header that lies about its size cannot then make a read allocate more than the
/// file holds.
fn check_entry<R: Read + ?Sized>(
    entry: &zip::read::ZipFile<'_, R>,
    archive_len: u64,
) -> std::result::Result<(), String> {
    let claimed = entry.compressed_size();
    let start = entry.data_start().unwrap_or(0);
    if start.checked_add(claimed).is_none_or(|end| end > archive_len) {
        return Err(format!(
            "its header claims {claimed} bytes at offset {start}, past the end of the {archive_len}-byte archive"
        ));
    }
    if entry.compression() == zip::CompressionMethod::Stored && entry.size() != claimed {
        return Err(format!(
            "a stored entry whose header claims {} bytes uncompressed and {claimed} stored",
            entry.size()
        ));
    }
    Ok(())
}

/// A whole archive entry of at most `limit` bytes, its header checked first ([`check_entry`]) and
/// the read bounded by `take`.
fn read_entry<R: Read + ?Sized>(
    entry: &mut zip::read::ZipFile<'_, R>,
    archive_len: u64,
    limit: u64,
) -> std::result::Result<Vec<u8>, String> {
    check_entry(entry, archive_len)?;
    let size = entry.size();
    if size > limit {
        return Err(format!(
            "its header claims {size} bytes, more than the {limit} this tool reads"
        ));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    entry
        .by_ref()
        .take(size)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 != size {
        return Err(format!("it holds {} bytes, its header claims {size}", bytes.len()));
    }
    Ok(bytes)
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

    fn describe(&self, name: &str) -> Option<(DType, Vec<usize>)> {
        let full = format!("{}{name}", self.prefix);
        Some((self.checkpoint.dtype(&full)?, self.checkpoint.shape(&full)?))
    }

    fn location(&self) -> Option<String> {
        Some(format!("{} (prefix `{}`)", self.checkpoint.path.display(), self.prefix))
    }
}

/// A single-file checkpoint in the original `ldm` layout, opened for
/// `unet_attention::models::{UNet2DConditionModel, AutoencoderKL}::from_single_file_weights`:
/// safetensors or a `torch.save` pickle (`.ckpt`, `.pt`, `.pth`, `.bin`, read without running
/// it), its tensors under their full names (`model.diffusion_model.…`, `first_stage_model.…`). The
/// original training code saves `{"state_dict": …, "global_step": …}`: the section holding
/// `model.diffusion_model.` or `first_stage_model.` is taken as the file.
pub fn open_single_file(path: &Path) -> Result<Arc<dyn WeightSource>> {
    let checkpoint = Arc::new(Checkpoint::open(path)?);
    let section = ["model.diffusion_model.", "first_stage_model."]
        .iter()
        .find_map(|p| {
            let full = checkpoint.resolve_prefix(p).ok()?;
            full.strip_suffix(p).map(str::to_string)
        })
        .ok_or_else(|| {
            err(
                path,
                "no tensor under `model.diffusion_model.` or `first_stage_model.`: not an ldm-layout single file",
            )
        })?;
    Ok(Arc::new(PrefixView::new(checkpoint, &section)?))
}
