//! A model's safetensors weights: one file, or the shards a `*.safetensors.index.json` lists.
//! Each file's header is read and checked ([`super::safetensors`]); no tensor is read until it is
//! asked for.
//!
//! The index is a stranger's too: read up to [`super::MAX_JSON_BYTES`], its shard names must be
//! plain file names in the index's folder (no separator, no `..`, nothing absolute), and its
//! `weight_map` is honoured. Every tensor of every shard must be where the index says it is: a
//! tensor in a shard the index does not name for it, in two shards, or named in a shard that lacks
//! it, is an error naming the tensor and both files (PyTorch loads by the index; a duplicate key
//! must not silently replace the tensor the index names).

use super::safetensors::StFile;
use super::FileError;
use crate::weights::WeightSource;
use ::safetensors::tensor::TensorInfo;
use candle_core::{DType, Device, Tensor};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One tensor: the file it is in, its header entry, and its dtype (or why it cannot be loaded).
#[derive(Debug, Clone)]
struct Entry {
    file: usize,
    info: TensorInfo,
    dtype: Result<DType, String>,
}

/// The safetensors files of a model: one file, or the shards of an index (see the module docs).
pub struct SafetensorsFiles {
    /// The file or index named.
    path: PathBuf,
    files: Vec<(PathBuf, StFile<'static>)>,
    tensors: BTreeMap<String, Entry>,
}

impl std::fmt::Debug for SafetensorsFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetensorsFiles")
            .field("path", &self.path)
            .field("files", &self.files.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

/// The Candle dtype of a safetensors dtype, `None` for the ones Candle cannot hold.
pub fn candle_dtype(d: ::safetensors::Dtype) -> Option<DType> {
    use ::safetensors::Dtype as S;
    Some(match d {
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

/// A name with no directory part: not empty, `.` or `..`, no separator, NUL or drive colon.
pub fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0', ':'])
}

/// Whether `path` names a sharded index (`*.index.json`).
pub fn is_index(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|n| n.to_string_lossy().ends_with(".index.json"))
}

impl SafetensorsFiles {
    /// A safetensors file, or the shards of the index at `path` (`*.index.json`).
    pub fn open(path: &Path) -> Result<Self, FileError> {
        if is_index(path) {
            Self::open_index(path)
        } else {
            Self::open_file(path)
        }
    }

    /// One safetensors file.
    pub fn open_file(path: &Path) -> Result<Self, FileError> {
        let mut set = Self {
            path: path.to_path_buf(),
            files: vec![],
            tensors: BTreeMap::new(),
        };
        set.add(path)?;
        Ok(set)
    }

    /// The shards of the index at `index`, each tensor where the index says (module docs).
    pub fn open_index(index: &Path) -> Result<Self, FileError> {
        let map = weight_map(index)?;
        let dir = index.parent().unwrap_or(Path::new("."));
        let mut shards: Vec<&str> = map.values().map(String::as_str).collect();
        shards.sort_unstable();
        shards.dedup();
        let mut set = Self {
            path: index.to_path_buf(),
            files: vec![],
            tensors: BTreeMap::new(),
        };
        for shard in shards {
            set.add(&dir.join(shard))?;
        }
        set.check_against(index, &map)?;
        Ok(set)
    }

    /// Read the header of `file` and index its tensors; a tensor already seen in another file is
    /// an error naming both.
    fn add(&mut self, file: &Path) -> Result<(), FileError> {
        let st = StFile::open_file(file)?;
        let index = self.files.len();
        for (name, info) in st.metadata.tensors() {
            if let Some(other) = self.tensors.get(&name) {
                return Err(FileError::content(
                    file,
                    format!(
                        "tensor `{name}` is also in {}: a tensor may be in one shard only",
                        self.files[other.file].0.display()
                    ),
                ));
            }
            let dtype = candle_dtype(info.dtype).ok_or_else(|| format!("dtype {:?} is not supported", info.dtype));
            let entry = Entry {
                file: index,
                info: info.clone(),
                dtype,
            };
            self.tensors.insert(name, entry);
        }
        self.files.push((file.to_path_buf(), st));
        Ok(())
    }

    /// Every tensor in the shard the index names for it, and none elsewhere.
    fn check_against(&self, index: &Path, map: &BTreeMap<String, String>) -> Result<(), FileError> {
        let file_name = |i: usize| {
            self.files[i]
                .0
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        for (name, entry) in &self.tensors {
            match map.get(name) {
                Some(named) if *named == file_name(entry.file) => {}
                Some(named) => {
                    return Err(FileError::content(
                        index,
                        format!(
                            "`weight_map` names {named} for tensor `{name}`, but it is in {} (a tensor in another \
                             shard than its index names)",
                            file_name(entry.file)
                        ),
                    ))
                }
                None => {
                    return Err(FileError::content(
                        index,
                        format!(
                            "tensor `{name}` of shard {} is not in the `weight_map` (a shard holds only what its \
                             index lists)",
                            file_name(entry.file)
                        ),
                    ))
                }
            }
        }
        if let Some((name, shard)) = map.iter().find(|(name, _)| !self.tensors.contains_key(*name)) {
            return Err(FileError::content(
                index,
                format!("`weight_map` names {shard} for tensor `{name}`, which {shard} does not hold"),
            ));
        }
        Ok(())
    }

    /// The file or index this was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The files read (one, or the shards).
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(|(p, _)| p.as_path())
    }

    /// Every tensor name, sorted.
    pub fn names(&self) -> impl Iterator<Item = &String> {
        self.tensors.keys()
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// The stored shape of `name`.
    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.tensors.get(name).map(|e| e.info.shape.as_slice())
    }

    /// The stored dtype of `name`: `Err` with why for one Candle cannot load.
    pub fn dtype(&self, name: &str) -> Option<Result<DType, String>> {
        self.tensors.get(name).map(|e| e.dtype.clone())
    }

    /// `name` loaded onto the CPU in its stored dtype (`None` if absent). An allocation the system
    /// refuses is an error, not an abort.
    pub fn load(&self, name: &str) -> candle_core::Result<Option<Tensor>> {
        let Some(e) = self.tensors.get(name) else {
            return Ok(None);
        };
        let (path, st) = &self.files[e.file];
        let fail = |m: String| candle_core::Error::Msg(format!("{}: tensor `{name}`: {m}", path.display()));
        let dtype = e.dtype.clone().map_err(fail)?;
        let shape = e.info.shape.as_slice();
        // The float types read straight into the tensor's own buffer (one pass over the bytes).
        #[cfg(target_endian = "little")]
        {
            let io = |err: std::io::Error| fail(err.to_string());
            let t = match dtype {
                DType::F32 => Some(Tensor::from_vec(
                    st.read_as::<f32>(&e.info).map_err(io)?,
                    shape,
                    &Device::Cpu,
                )?),
                DType::F64 => Some(Tensor::from_vec(
                    st.read_as::<f64>(&e.info).map_err(io)?,
                    shape,
                    &Device::Cpu,
                )?),
                DType::F16 => Some(Tensor::from_vec(
                    st.read_as::<half::f16>(&e.info).map_err(io)?,
                    shape,
                    &Device::Cpu,
                )?),
                DType::BF16 => Some(Tensor::from_vec(
                    st.read_as::<half::bf16>(&e.info).map_err(io)?,
                    shape,
                    &Device::Cpu,
                )?),
                _ => None,
            };
            if t.is_some() {
                return Ok(t);
            }
        }
        let bytes = st.read(&e.info).map_err(|err| fail(err.to_string()))?;
        Tensor::from_raw_buffer(&bytes, dtype, shape, &Device::Cpu).map(Some)
    }
}

impl WeightSource for SafetensorsFiles {
    fn names(&self) -> Vec<String> {
        self.tensors.keys().cloned().collect()
    }

    fn load(&self, name: &str) -> candle_core::Result<Option<Tensor>> {
        SafetensorsFiles::load(self, name)
    }

    fn describe(&self, name: &str) -> Option<(DType, Vec<usize>)> {
        let e = self.tensors.get(name)?;
        Some((e.dtype.clone().ok()?, e.info.shape.clone()))
    }

    fn location(&self) -> Option<String> {
        Some(self.path.display().to_string())
    }
}

/// The `weight_map` of the index at `index`: tensor name → shard file name, each a plain file
/// name.
pub fn weight_map(index: &Path) -> Result<BTreeMap<String, String>, FileError> {
    let json = super::read_json(index)?;
    let bad = |m: String| FileError::content(index, m);
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad("the index has no `weight_map` object".into()))?;
    if map.is_empty() {
        return Err(bad("the index's `weight_map` is empty".into()));
    }
    map.iter()
        .map(|(tensor, file)| match file.as_str().filter(|f| is_plain_file_name(f)) {
            Some(f) => Ok((tensor.clone(), f.to_string())),
            None => Err(bad(format!(
                "weight_map[{tensor:?}] = {file}: expected a file name in the folder (a shard name may not leave it)"
            ))),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A folder with shards `a` and `b` holding the named tensors, and an index mapping `map`:
    /// the folder (removed when dropped) and the index's path.
    fn folder(name: &str, a: &[&str], b: &[&str], map: &[(&str, &str)]) -> (tempfile::TempDir, PathBuf) {
        let scratch = tempfile::Builder::new()
            .prefix(&format!("unet-attention-shards-{name}-"))
            .tempdir()
            .unwrap();
        let dir = scratch.path();
        for (file, names) in [("a.safetensors", a), ("b.safetensors", b)] {
            let t: HashMap<String, Tensor> = names
                .iter()
                .map(|n| (n.to_string(), Tensor::zeros(2, DType::F32, &Device::Cpu).unwrap()))
                .collect();
            candle_core::safetensors::save(&t, dir.join(file)).unwrap();
        }
        let map: serde_json::Map<String, serde_json::Value> =
            map.iter().map(|(k, v)| (k.to_string(), (*v).into())).collect();
        let index = dir.join("model.safetensors.index.json");
        std::fs::write(&index, serde_json::json!({ "weight_map": map }).to_string()).unwrap();
        (scratch, index)
    }

    fn error((_dir, index): &(tempfile::TempDir, PathBuf)) -> String {
        SafetensorsFiles::open(index).unwrap_err().to_string()
    }

    #[test]
    fn the_index_decides_where_each_tensor_is() {
        let (a, b) = ("a.safetensors", "b.safetensors");
        let (_dir, ok) = folder("ok", &["x"], &["y"], &[("x", a), ("y", b)]);
        let set = SafetensorsFiles::open(&ok).unwrap();
        assert_eq!(set.names().collect::<Vec<_>>(), ["x", "y"]);
        assert_eq!(set.load("y").unwrap().unwrap().dims(), [2]);
        // In two shards; in another shard than the index names; named in a shard without it.
        let e = error(&folder("two", &["x", "y"], &["y"], &[("x", a), ("y", b)]));
        assert!(e.contains("`y`") && e.contains(a) && e.contains(b), "{e}");
        let e = error(&folder("moved", &["x", "y"], &["z"], &[("x", a), ("y", b), ("z", b)]));
        assert!(
            e.contains("names b.safetensors for tensor `y`, but it is in a.safetensors"),
            "{e}"
        );
        let e = error(&folder("absent", &["x"], &["z"], &[("x", a), ("y", b), ("z", b)]));
        assert!(e.contains("`y`, which b.safetensors does not hold"), "{e}");
        let e = error(&folder("unlisted", &["x", "w"], &["y"], &[("x", a), ("y", b)]));
        assert!(
            e.contains("`w` of shard a.safetensors is not in the `weight_map`"),
            "{e}"
        );
        // Shard names stay in the folder.
        for bad in ["../a.safetensors", "/etc/passwd", "..", "", "c:x", "sub/a.safetensors"] {
            let e = error(&folder("leave", &["x"], &[], &[("x", bad)]));
            assert!(e.contains("expected a file name in the folder"), "{bad}: {e}");
        }
    }
}
