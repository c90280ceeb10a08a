//! Safetensors files read neither whole nor mapped: the header is read and checked exactly as
//! `safetensors::SafeTensors::read_metadata` checks it (the same errors), and each tensor's bytes
//! are read on their own, only when asked for, after its dtype and shape are known. A 5 GB file
//! is listed by reading its header, and a block's weights cost what they hold, whatever else the
//! file holds (and however little address space the process has: a map would take the file's
//! whole size of it).

use super::FileError;
use ::safetensors::tensor::{Metadata, TensorInfo};
use ::safetensors::SafeTensorError;
use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::Mutex;

/// Where the bytes are.
pub enum Source<'a> {
    Bytes(&'a [u8]),
    /// A regular file (see [`super::open_regular`]), read at offsets.
    File(Mutex<std::fs::File>),
}

impl Source<'_> {
    pub fn file(file: std::fs::File) -> Self {
        Source::File(Mutex::new(file))
    }

    /// The source's length in bytes.
    pub fn size(&self) -> std::io::Result<u64> {
        match self {
            Source::Bytes(b) => Ok(b.len() as u64),
            Source::File(f) => lock(f).metadata().map(|m| m.len()),
        }
    }

    /// `buf.len()` bytes at `offset` (an error when the source ends before).
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        match self {
            Source::Bytes(b) => {
                let bytes = usize::try_from(offset)
                    .ok()
                    .and_then(|start| b.get(start..start.checked_add(buf.len())?))
                    .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
                buf.copy_from_slice(bytes);
                Ok(())
            }
            Source::File(f) => {
                let mut f = lock(f);
                f.seek(SeekFrom::Start(offset))?;
                f.read_exact(buf)
            }
        }
    }
}

/// A poisoned lock only means an earlier read panicked; each read seeks to its own offset.
fn lock(f: &Mutex<std::fs::File>) -> std::sync::MutexGuard<'_, std::fs::File> {
    f.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Why a safetensors file cannot be read.
#[derive(Debug)]
pub enum ReadError {
    Io(std::io::Error),
    /// Not a valid safetensors file: the `safetensors` crate's message.
    Format(String),
}

impl ReadError {
    /// This error as the [`FileError`] of the file at `path`.
    pub fn at(self, path: &Path) -> FileError {
        match self {
            ReadError::Io(source) => FileError::io(path, source),
            ReadError::Format(message) => FileError::Safetensors {
                path: path.to_path_buf(),
                message,
            },
        }
    }
}

impl From<SafeTensorError> for ReadError {
    fn from(e: SafeTensorError) -> Self {
        ReadError::Format(e.to_string())
    }
}

/// The header as JSON, as the `safetensors` crate reads it.
#[derive(serde::Deserialize)]
struct HeaderJson {
    #[serde(rename = "__metadata__")]
    metadata: Option<HashMap<String, String>>,
    #[serde(flatten)]
    tensors: HashMap<String, TensorInfo>,
}

/// An opened safetensors file: its checked header.
pub struct StFile<'a> {
    source: Source<'a>,
    /// Where the data section starts (8 + the header's length).
    data_start: u64,
    pub metadata: Metadata,
}

/// safetensors' own limit on a header.
pub const MAX_HEADER: u64 = 100_000_000;

impl<'a> StFile<'a> {
    /// Read and check the header of `source`; `vet` sees the header's bytes first (before they
    /// are parsed) and may refuse them.
    pub fn open(source: Source<'a>, vet: impl FnOnce(&[u8]) -> Result<(), String>) -> Result<Self, ReadError> {
        let len = source.size().map_err(ReadError::Io)?;
        if len < 8 {
            return Err(SafeTensorError::HeaderTooSmall.into());
        }
        let mut prefix = [0u8; 8];
        source.read_at(0, &mut prefix).map_err(ReadError::Io)?;
        let n = u64::from_le_bytes(prefix);
        if n > MAX_HEADER {
            return Err(SafeTensorError::HeaderTooLarge.into());
        }
        if 8 + n > len {
            return Err(SafeTensorError::InvalidHeaderLength.into());
        }
        let mut header = vec![0u8; n as usize];
        source.read_at(8, &mut header).map_err(ReadError::Io)?;
        vet(&header).map_err(ReadError::Format)?;
        let text = std::str::from_utf8(&header).map_err(SafeTensorError::InvalidHeader)?;
        let json: HeaderJson = serde_json::from_str(text).map_err(SafeTensorError::InvalidHeaderDeserialization)?;
        let mut tensors: Vec<(String, TensorInfo)> = json.tensors.into_iter().collect();
        tensors.sort_by_key(|(_, t)| t.data_offsets);
        let end = tensors.last().map_or(0, |(_, t)| t.data_offsets.1) as u64;
        let metadata = Metadata::new(json.metadata, tensors)?;
        if end.checked_add(8 + n) != Some(len) {
            return Err(SafeTensorError::MetadataIncompleteBuffer.into());
        }
        Ok(Self {
            source,
            data_start: 8 + n,
            metadata,
        })
    }

    /// The regular file at `path`, its header read and checked; errors name the file.
    pub fn open_file(path: &Path) -> Result<StFile<'static>, FileError> {
        let source = Source::file(super::open_regular(path)?);
        StFile::open(source, |_| Ok(())).map_err(|e| e.at(path))
    }

    /// The values of one tensor of this file's header as `T` (its stored type, `size_of::<T>()`
    /// bytes each, little-endian), read straight into their own buffer (no byte copy to convert
    /// afterwards). An allocation the system refuses is an `OutOfMemory` error, not an abort.
    #[cfg(target_endian = "little")]
    pub fn read_as<T: bytemuck_free::Plain>(&self, info: &TensorInfo) -> std::io::Result<Vec<T>> {
        let (start, end) = info.data_offsets;
        let size = std::mem::size_of::<T>();
        if (end - start) % size != 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{} bytes are not whole values of {size} bytes", end - start),
            ));
        }
        let n = (end - start) / size;
        let mut values: Vec<T> = Vec::new();
        values.try_reserve_exact(n).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::OutOfMemory,
                format!("cannot allocate {} bytes for a tensor", end - start),
            )
        })?;
        values.resize(n, T::default());
        // SAFETY: `T` is a plain number type (`Plain`: every bit pattern is a value, no padding),
        // so its `n` values are `n · size` initialised bytes that any bytes may overwrite.
        let bytes = unsafe { std::slice::from_raw_parts_mut(values.as_mut_ptr().cast::<u8>(), n * size) };
        self.source.read_at(self.data_start + start as u64, bytes)?;
        Ok(values)
    }

    /// The bytes of one tensor of this file's header. An allocation the system refuses is an
    /// `OutOfMemory` error, not an abort.
    pub fn read(&self, info: &TensorInfo) -> std::io::Result<Vec<u8>> {
        let (start, end) = info.data_offsets;
        let mut bytes = Vec::new();
        bytes.try_reserve_exact(end - start).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::OutOfMemory,
                format!("cannot allocate {} bytes for a tensor", end - start),
            )
        })?;
        bytes.resize(end - start, 0);
        self.source.read_at(self.data_start + start as u64, &mut bytes)?;
        Ok(bytes)
    }
}

/// Number types whose every bit pattern is a value (no padding, no invalid patterns): what a
/// tensor's bytes may be read into directly.
pub mod bytemuck_free {
    /// # Safety
    /// Every bit pattern of `size_of::<Self>()` bytes must be a valid value, with no padding.
    pub unsafe trait Plain: Copy + Default {}
    // SAFETY: IEEE floats and their half-precision kin: every bit pattern is a value.
    unsafe impl Plain for f32 {}
    // SAFETY: as above.
    unsafe impl Plain for f64 {}
    // SAFETY: as above.
    unsafe impl Plain for half::f16 {}
    // SAFETY: as above.
    unsafe impl Plain for half::bf16 {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The same verdict as `SafeTensors::read_metadata` on every prefix and mutation of a small
    /// file.
    #[test]
    fn agrees_with_the_safetensors_crate() {
        let header = r#"{"__metadata__":{"k":"v"},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},"a":{"dtype":"U8","shape":[2,4],"data_offsets":[0,8]}}"#;
        let mut good = (header.len() as u64).to_le_bytes().to_vec();
        good.extend_from_slice(header.as_bytes());
        good.extend_from_slice(&[7u8; 16]);
        let mut cases: Vec<Vec<u8>> = (0..good.len()).map(|n| good[..n].to_vec()).collect();
        cases.push(good.clone());
        cases.push([&good[..], &[0]].concat());
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x5a;
            cases.push(bad);
        }
        for bytes in cases {
            let ours = StFile::open(Source::Bytes(&bytes), |_| Ok(()));
            let theirs = safetensors::SafeTensors::read_metadata(&bytes);
            match (&ours, &theirs) {
                (Ok(a), Ok((_, b))) => {
                    let (ta, tb) = (a.metadata.tensors(), b.tensors());
                    let names = |t: &HashMap<String, &TensorInfo>| {
                        let mut n: Vec<String> = t.keys().cloned().collect();
                        n.sort();
                        n
                    };
                    assert_eq!(names(&ta), names(&tb));
                    assert_eq!(a.metadata.metadata(), b.metadata());
                    let data = &bytes[a.data_start as usize..];
                    for (name, info) in tb {
                        let want = &data[info.data_offsets.0..info.data_offsets.1];
                        assert_eq!(a.read(info).unwrap(), want, "{name}");
                    }
                }
                (Err(ReadError::Format(a)), Err(b)) => assert_eq!(a, &b.to_string()),
                _ => panic!("{bytes:?}: ours {:?}, theirs {theirs:?}", ours.as_ref().err()),
            }
        }
    }
}
