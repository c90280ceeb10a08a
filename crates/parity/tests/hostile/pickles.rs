//! Hostile `torch.save` archives (the pickle reader's security review): deep nesting, a memo
//! bomb, a NONE flood, a string claiming 4 GiB, zip headers that lie about sizes and a negative
//! storage offset are each one clean error line and exit code 2, within seconds and under a
//! 4 GiB address-space limit. Candle's pickle reader overflowed the stack (exit 134) or
//! allocated without bound on these.
//!
//! Each hostile file runs in a child process (this test binary again, as the CLI: see
//! [`crate::cli_child`]), so a crash or an abort fails the test instead of killing the harness. The
//! archives are written here by hand: stored entries, local headers, central directory.

use crate::common::{cli, scratch, weights};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `unet-parity ARGS` in a child process under the 4 GiB address-space limit: exit code (or
/// `-signal`), stderr, time taken ([`crate::common::run_limited`]).
fn run_child(args: &[&str]) -> (i32, String, Duration) {
    let c = crate::common::run_limited(args, &[]);
    (c.code, c.err, c.took)
}

/// `inspect FILE` in a child: exit code 2 and one error line naming the file and `needle`.
fn assert_refused(file: &Path, needle: &str) {
    let (code, err, took) = run_child(&["inspect", file.to_str().unwrap()]);
    assert_eq!(code, 2, "{file:?} ({took:?}): {err}");
    assert_eq!(err.lines().count(), 1, "{file:?}: one error line: {err}");
    let name = file.file_name().unwrap().to_str().unwrap();
    assert!(
        err.contains(name) && err.contains(needle),
        "{file:?}: expected {needle:?}: {err}"
    );
}

// ---- Writing pickles and archives ----

/// A protocol-2 pickle, opcode by opcode.
struct Pickle(Vec<u8>);

impl Pickle {
    fn new() -> Self {
        Pickle(vec![0x80, 2])
    }
    fn op(mut self, bytes: &[u8]) -> Self {
        self.0.extend_from_slice(bytes);
        self
    }
    /// BINUNICODE.
    fn str(self, s: &str) -> Self {
        self.op(b"X").op(&(s.len() as u32).to_le_bytes()).op(s.as_bytes())
    }
    /// BININT, or LONG1 of 8 bytes beyond 32 bits.
    fn int(self, i: i64) -> Self {
        match i32::try_from(i) {
            Ok(small) => self.op(b"J").op(&small.to_le_bytes()),
            Err(_) => self.op(&[0x8a, 8]).op(&i.to_le_bytes()),
        }
    }
    fn global(self, module: &str, name: &str) -> Self {
        self.op(b"c").op(format!("{module}\n{name}\n").as_bytes())
    }
    fn ints(self, values: &[i64]) -> Self {
        values.iter().fold(self.op(b"("), |p, &v| p.int(v)).op(b"t")
    }
    /// `_rebuild_tensor_v2(('storage', torch.<storage>, key, 'cpu', numel), offset, size, stride,
    /// False, OrderedDict())`, as torch.save writes it.
    fn tensor(self, storage: &str, key: &str, numel: i64, offset: i64, size: &[i64], stride: &[i64]) -> Self {
        self.global("torch._utils", "_rebuild_tensor_v2")
            .op(b"((")
            .str("storage")
            .global("torch", storage)
            .str(key)
            .str("cpu")
            .int(numel)
            .op(b"tQ")
            .int(offset)
            .ints(size)
            .ints(stride)
            .op(&[0x89])
            .global("collections", "OrderedDict")
            .op(b")R")
            .op(b"tR")
    }
    fn stop(self) -> Vec<u8> {
        self.op(b".").0
    }
}

/// CRC-32 (IEEE), bit by bit.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = (crc >> 1) ^ (0xEDB8_8320 & (crc & 1).wrapping_neg());
        }
    }
    !crc
}

/// A zip archive of stored entries, as torch.save lays it out: local file headers with the data,
/// the central directory, the end record. `lie` makes the headers of one entry claim another
/// size than the bytes it holds.
fn zip(entries: &[(&str, &[u8])], lie: Option<(&str, u32)>) -> Vec<u8> {
    let (mut out, mut central) = (Vec::new(), Vec::new());
    for (name, data) in entries {
        let size = match lie {
            Some((n, claimed)) if n == *name => claimed,
            _ => data.len() as u32,
        };
        let offset = out.len() as u32;
        // version 2.0, no flags, stored, 1980-01-01 00:00, CRC, sizes, name length, no extra.
        let mut common = Vec::new();
        for v in [20u16, 0, 0, 0, 0x21] {
            common.extend_from_slice(&v.to_le_bytes());
        }
        for v in [crc32(data), size, size] {
            common.extend_from_slice(&v.to_le_bytes());
        }
        common.extend_from_slice(&(name.len() as u16).to_le_bytes());
        common.extend_from_slice(&0u16.to_le_bytes());
        out.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
        out.extend_from_slice(&common);
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(data);
        central.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
        central.extend_from_slice(&20u16.to_le_bytes()); // made by
        central.extend_from_slice(&common);
        central.extend_from_slice(&[0; 8]); // comment length, disk, internal and external attributes
        central.extend_from_slice(&[0; 2]);
        central.extend_from_slice(&offset.to_le_bytes());
        central.extend_from_slice(name.as_bytes());
    }
    let (cd_offset, cd_size, n) = (out.len() as u32, central.len() as u32, entries.len() as u16);
    out.extend_from_slice(&central);
    out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    for v in [n, n] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for v in [cd_size, cd_offset] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&[0; 2]);
    out
}

/// `dir/name`: a torch.save-like archive holding `pkl` as `archive/data.pkl` and `storages` as
/// `archive/data/{key}`.
fn archive(dir: &Path, name: &str, pkl: &[u8], storages: &[(&str, &[u8])]) -> PathBuf {
    let names: Vec<String> = storages.iter().map(|(k, _)| format!("archive/data/{k}")).collect();
    let mut entries: Vec<(&str, &[u8])> = vec![("archive/data.pkl", pkl)];
    entries.extend(names.iter().zip(storages).map(|(n, (_, d))| (n.as_str(), *d)));
    let path = dir.join(name);
    std::fs::write(&path, zip(&entries, None)).unwrap();
    path
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

// ---- Hostile pickles ----

#[test]
fn two_hundred_thousand_levels_of_nesting_are_refused_not_a_stack_overflow() {
    const N: usize = 200_000;
    let dir = scratch("hostile-nesting");
    let tuples = Pickle::new().op(b"N").op(&[0x85; N]).stop();
    let marked = Pickle::new().op(&[b'('; N]).op(&[b't'; N]).stop();
    let lists = Pickle::new().op(&[b']'; N]).op(&[b'a'; N - 1]).stop();
    let dicts = Pickle::new()
        .op(b"}")
        .op(&b"K\x00}".repeat(N - 1))
        .op(&[b's'; N - 1])
        .stop();
    for (name, pkl) in [
        ("tuples.pt", tuples),
        ("marked_tuples.pt", marked),
        ("lists.pt", lists),
        ("dicts.pt", dicts),
    ] {
        let file = archive(&dir, name, &pkl, &[]);
        assert_refused(&file, "nested more than 64 deep");
    }
}

#[test]
fn a_memo_bomb_is_refused_without_copying() {
    let dir = scratch("hostile-memo");
    // Each step: a tuple of two references to the step before (2^40 objects if copied).
    let tuples = Pickle::new()
        .op(b"]q\x00")
        .op(&b"h\x00h\x00\x86q\x00".repeat(40))
        .stop();
    let file = archive(&dir, "tuple_bomb.pt", &tuples, &[]);
    assert_refused(&file, "holds no tensors");
    // The same with dicts, which the walk flattens into names: refused, not 2^40 names.
    let step = Pickle(vec![])
        .op(b"}(")
        .str("a")
        .op(b"h\x00")
        .str("b")
        .op(b"h\x00uq\x00")
        .0;
    let dicts = Pickle::new().op(b"}q\x00").op(&step.repeat(40)).stop();
    let file = archive(&dir, "dict_bomb.pt", &dicts, &[]);
    assert_refused(&file, "reference bomb");
}

#[test]
fn a_none_flood_fails_fast_in_little_memory() {
    let dir = scratch("hostile-none");
    let pkl = Pickle::new().op(&vec![b'N'; 20 << 20]).stop();
    let file = archive(&dir, "none_flood.pt", &pkl, &[]);
    let (code, err, took) = run_child(&["inspect", file.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("items on the stack") && err.lines().count() == 1, "{err}");
    assert!(took < Duration::from_secs(10), "{took:?}");
}

#[test]
fn a_string_longer_than_the_file_is_refused_before_allocating() {
    let dir = scratch("hostile-string");
    let pkl = Pickle::new().op(b"X\xff\xff\xff\xffabc").stop();
    let file = archive(&dir, "binunicode.pt", &pkl, &[]);
    assert_refused(&file, "needs 4294967295 bytes, but only 4 are left");
    let pkl = Pickle::new().op(&[0x8d]).op(&u64::MAX.to_le_bytes()).stop();
    let file = archive(&dir, "binunicode8.pt", &pkl, &[]);
    assert_refused(&file, "needs 18446744073709551615 bytes");
}

#[test]
fn zip_headers_that_claim_more_than_the_entry_holds_are_refused() {
    let dir = scratch("hostile-zip");
    let pkl = Pickle::new()
        .op(b"}")
        .str("w")
        .tensor("FloatStorage", "0", 4, 0, &[4], &[1])
        .op(b"s")
        .stop();
    assert!(pkl.len() < 200);
    // data.pkl's headers claim 0xFFFFFFF0 bytes.
    let file = dir.join("pkl_claims_4g.pt");
    let data = f32_bytes(&[1.0; 4]);
    let entries: [(&str, &[u8]); 2] = [("archive/data.pkl", &pkl), ("archive/data/0", &data)];
    std::fs::write(&file, zip(&entries, Some(("archive/data.pkl", 0xFFFF_FFF0)))).unwrap();
    assert_refused(&file, "4294967280");
    // A storage entry's headers claim 0xFFFFFFF0 bytes (it holds 120), and every mid-block weight
    // (each of its right shape, so that the block asks for it) lies in it: the archive opens, the
    // first load is refused by the entry's header before allocating.
    let real = weights().join("models/diffusers_unet2d_bin/diffusion_pytorch_model.bin");
    let real = unet_parity::checkpoint::Checkpoint::open(&real).unwrap();
    let names: Vec<&String> = real.names().filter(|n| n.starts_with("mid_block.")).collect();
    assert!(names.len() > 10);
    let numel = 0xFFFF_FFF0 / 4;
    let pkl = names
        .iter()
        .fold(Pickle::new().op(b"}("), |p, n| {
            let shape: Vec<i64> = real.shape(n).unwrap().iter().map(|&d| d as i64).collect();
            let mut stride = vec![1i64; shape.len()];
            for i in (0..shape.len().saturating_sub(1)).rev() {
                stride[i] = stride[i + 1] * shape[i + 1];
            }
            p.str(n).tensor("FloatStorage", "0", numel, 0, &shape, &stride)
        })
        .op(b"u")
        .stop();
    let data = vec![0u8; 120];
    let file = dir.join("storage_claims_4g.pt");
    let entries: [(&str, &[u8]); 2] = [("archive/data.pkl", &pkl), ("archive/data/0", &data)];
    std::fs::write(&file, zip(&entries, Some(("archive/data/0", 0xFFFF_FFF0)))).unwrap();
    let bundle = weights().join("mid/unet_mid_block_2d_unet2d_ref.safetensors");
    let (code, err, _) = run_child(&[
        "check",
        bundle.to_str().unwrap(),
        "--weights",
        file.to_str().unwrap(),
        "--prefix",
        "mid_block.",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("claims 4294967280 bytes") && err.contains("past the end") && err.lines().count() == 1,
        "{err}"
    );
}

#[test]
fn a_negative_storage_offset_is_refused_not_wrapped() {
    let dir = scratch("hostile-offset");
    let pkl = Pickle::new()
        .op(b"}")
        .str("w")
        .tensor("FloatStorage", "0", 4, -(1 << 62), &[4], &[1])
        .op(b"s")
        .stop();
    let data = f32_bytes(&[1.0; 4]);
    let file = archive(&dir, "negative_offset.pt", &pkl, &[("0", &data)]);
    assert_refused(&file, "storage offset -4611686018427387904 is negative");
    // And through `check --weights`.
    let bundle = weights().join("mid/unet_mid_block_2d_unet2d_ref.safetensors");
    let (code, err, _) = run_child(&["check", bundle.to_str().unwrap(), "--weights", file.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("is negative") && err.lines().count() == 1, "{err}");
}

#[test]
fn unknown_opcodes_and_storage_globals_are_named() {
    let dir = scratch("hostile-opcodes");
    for (name, pkl, needle) in [
        (
            "persid.pt",
            Pickle::new().op(b"P0\n").stop(),
            "unsupported opcode PERSID",
        ),
        (
            "inst.pt",
            Pickle::new().op(b"(ios\nsystem\n").stop(),
            "unsupported opcode INST",
        ),
        ("protocol.pt", vec![0x80, 1, b'N', b'.'], "protocol 1"),
        ("no_stop.pt", Pickle::new().op(b"N").0, "without a STOP"),
        (
            "wide_int.pt",
            Pickle::new().op(&[0x8a, 9]).op(&[1; 9]).stop(),
            "wider than the 64 bits",
        ),
        (
            "storage_global.pt",
            Pickle::new()
                .op(b"}")
                .str("w")
                .tensor("system", "0", 4, 0, &[4], &[1])
                .op(b"s")
                .stop(),
            "the storage type `torch.system` is not a torch.<X>Storage class",
        ),
    ] {
        let file = archive(&dir, name, &pkl, &[]);
        let (code, _, err) = cli(&["inspect", file.to_str().unwrap()]);
        assert_eq!(code, 2, "{name}: {err}");
        assert!(
            err.contains(needle) && err.contains("malformed pickle"),
            "{name}: {err}"
        );
    }
}

// ---- What the reader accepts ----

/// A crafted checkpoint in the shape of a training checkpoint: a plain, an offset and a
/// Fortran-ordered float tensor, a parameter, a bool tensor, a version string, and an unknown
/// class (a Lightning callback) that is kept opaque.
#[test]
fn a_crafted_checkpoint_loads_with_the_right_values() {
    let dir = scratch("pickle-positive");
    let pkl = Pickle::new()
        .op(b"}(")
        .str("state_dict")
        .global("collections", "OrderedDict")
        .op(b")R(")
        .str("a.weight")
        .tensor("FloatStorage", "0", 8, 0, &[2, 3], &[3, 1])
        .str("a.bias")
        .tensor("FloatStorage", "0", 8, 6, &[2], &[1])
        .str("b.weight")
        .tensor("FloatStorage", "0", 8, 0, &[2, 3], &[1, 2])
        .str("c")
        .global("torch._utils", "_rebuild_parameter")
        .op(b"(")
        .tensor("FloatStorage", "0", 8, 2, &[2], &[1])
        .op(&[0x88])
        .global("collections", "OrderedDict")
        .op(b")RtR")
        .str("mask")
        .tensor("BoolStorage", "1", 2, 0, &[2], &[1])
        .op(b"u}(")
        .str("_metadata")
        .op(b"}")
        .op(b"ub")
        .str("version")
        .str("2.3.4")
        .str("callbacks")
        .global("pytorch_lightning.callbacks", "ModelCheckpoint")
        .op(b")\x81}(")
        .str("best")
        .op(b"G")
        .op(&0.5f64.to_be_bytes())
        .op(b"ub")
        .op(b"u.")
        .0;
    let data = f32_bytes(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
    let file = archive(&dir, "crafted.ckpt", &pkl, &[("0", &data), ("1", &[1, 0])]);
    let ck = unet_parity::checkpoint::Checkpoint::open(&file).unwrap();
    assert_eq!(ck.sections, ["state_dict"]);
    assert_eq!(ck.strings.get("version").map(String::as_str), Some("2.3.4"));
    let load = |n: &str| {
        ck.load(n)
            .unwrap()
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
    };
    assert_eq!(load("state_dict.a.weight"), [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    assert_eq!(load("state_dict.a.bias"), [6.0, 7.0]);
    // Stride (1, 2): column-major, element (i, j) at 2j + i.
    assert_eq!(load("state_dict.b.weight"), [0.0, 2.0, 4.0, 1.0, 3.0, 5.0]);
    assert_eq!(load("state_dict.c"), [2.0, 3.0]);
    assert_eq!(ck.shape("state_dict.a.weight"), Some(vec![2, 3]));
    let mask = ck.load("state_dict.mask").unwrap_err().to_string();
    assert!(mask.contains("BoolStorage"), "{mask}");
    assert_eq!(ck.len(), 5);
    // The CLI lists it.
    let (code, out, err) = cli(&["inspect", file.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("sections: state_dict") && out.contains("version = \"2.3.4\""),
        "{out}"
    );
}
