//! A reader for the `data.pkl` of a `torch.save` zip archive: the subset of Python's pickle that
//! `torch.save` writes for state dicts and training checkpoints, interpreted without running any
//! Python, and without trusting the file.
//!
//! **What is read.** Protocols 2 to 5 (`torch.save` writes 2): PROTO, FRAME, STOP; MARK, POP,
//! POP_MARK, DUP; BINPUT, LONG_BINPUT, MEMOIZE, BINGET, LONG_BINGET; NONE, NEWTRUE, NEWFALSE,
//! BININT, BININT1, BININT2, LONG1 and LONG4 (up to 64 bits), BINFLOAT; BINUNICODE,
//! SHORT_BINUNICODE, BINUNICODE8; SHORT_BINBYTES, BINBYTES, BINBYTES8 (kept as opaque values);
//! EMPTY_TUPLE, TUPLE, TUPLE1-3, EMPTY_LIST, LIST, APPEND, APPENDS, EMPTY_DICT, DICT, SETITEM,
//! SETITEMS, EMPTY_SET, ADDITEMS, FROZENSET; GLOBAL, STACK_GLOBAL, REDUCE, NEWOBJ, NEWOBJ_EX,
//! BUILD, BINPERSID. Any other opcode (text protocol 0/1 opcodes, INST/OBJ, extension codes,
//! out-of-band buffers) is an error naming it.
//!
//! **Globals are names, never code.** `collections.OrderedDict` (and `defaultdict`) called with
//! REDUCE/NEWOBJ make an empty dict; `torch._utils._rebuild_tensor_v2`, `_rebuild_parameter`,
//! `_rebuild_parameter_with_state` and `torch._tensor._rebuild_from_type_v2` calls are tensors
//! (a storage from the persistent id `('storage', torch.<X>Storage, key, location, numel)`, an
//! offset, a size and a stride); another `torch._utils._rebuild_*` function is a tensor this tool
//! cannot read. Any other global (Lightning callbacks, numpy scalars, argparse namespaces in
//! training checkpoints) is an opaque value: calls of it, and items added to it, are kept
//! opaque, so such checkpoints still open.
//!
//! **What comes out** ([`read`]): nested dicts flattened with dots (`model.mid.attn.weight`),
//! string entries, each tensor's dtype, shape, stride, storage offset and storage key (the
//! archive entry `{dir}/data/{key}`), and the top-level entries that hold tensors (sections).
//!
//! **Limits**, enforced while parsing so a hostile file fails fast with a one-line error:
//! * no recursion on anything the input controls: the parse uses an explicit stack, objects live
//!   in a flat arena indexed by `u32` (dropping it is flat), the memo holds arena indices (a
//!   BINGET never copies), and the walk that flattens dicts keeps its own work list;
//! * containers nest at most [`MAX_DEPTH`] deep (a state dict is 5 to 10 deep; 200,000 nested
//!   tuples once overflowed the thread's stack);
//! * at most [`MAX_OBJECTS`] objects, references and memo entries in all (a state dict needs ~46 per
//!   tensor; a flood of NONE opcodes once asked for 6 GiB) and [`MAX_STACK`] items or marks on
//!   the stack (`torch.save` batches 1,000 items at a time);
//! * a string or bytes length is checked against the bytes that are left before anything is
//!   allocated (a BINUNICODE claiming 4 GiB reserved it before reading);
//! * integers wider than 64 bits are refused; a negative or overflowing storage offset, size or
//!   stride is an error, not a wrapped value;
//! * the walk visits at most twice as many values as the arena holds (a memo bomb, each level a
//!   pair of references to the level below, would otherwise flatten into 2^40 names), makes names
//!   of at most [`MAX_NAME`] bytes, keeps strings of at most [`MAX_KEPT_STRING`] bytes and writes
//!   at most [`MAX_WALK_BYTES`] of names and strings in all.
//!
//! The caller bounds `data.pkl` itself (`checkpoint.rs`: at most [`MAX_PICKLE_BYTES`], read
//! through `take`, so a zip header claiming more cannot make it allocate more than is there).

use candle_core::DType;
use std::collections::{BTreeMap, BTreeSet};

mod parse;
mod walk;

/// The largest `data.pkl` read (a state dict of 100,000 tensors needs about 15 MiB).
pub const MAX_PICKLE_BYTES: u64 = 256 << 20;
/// The deepest nesting of containers, calls and persistent ids.
pub const MAX_DEPTH: u8 = 64;
/// Objects, references between them and memo entries (about 46 per tensor in torch.save state
/// dicts: room for ~180,000 tensors; the arena stays under ~300 MiB).
pub const MAX_OBJECTS: usize = 1 << 23;
/// Items on the stack, and open marks.
pub const MAX_STACK: usize = 1 << 20;
/// The longest flattened name.
pub const MAX_NAME: usize = 4096;
/// String entries longer than this are not kept (a `version` is a few bytes).
pub const MAX_KEPT_STRING: usize = 64 << 10;
/// Bytes of names and strings the walk may produce.
pub const MAX_WALK_BYTES: usize = 256 << 20;
/// Dicts nested deeper than this are not flattened (as before this reader).
const MAX_WALK_DEPTH: usize = 24;
/// The longest GLOBAL module or name.
const MAX_GLOBAL: usize = 256;
/// The most dimensions a tensor may have.
const MAX_RANK: usize = 64;

/// One tensor of the pickle.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorRecord {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub stride: Vec<usize>,
    /// In elements, as torch stores it.
    pub offset: usize,
    /// The storage's key: the archive entry `{dir}/data/{key}`.
    pub key: String,
}

/// What a `data.pkl` holds, flattened.
#[derive(Debug, Default)]
pub struct Contents {
    /// Tensors by flattened name; `Err` for one this tool cannot load (its storage type).
    pub tensors: BTreeMap<String, Result<TensorRecord, String>>,
    /// String entries by flattened name.
    pub strings: BTreeMap<String, String>,
    /// Top-level entries holding dicts with tensors.
    pub sections: BTreeSet<String>,
}

/// Parse `data` and flatten it. The error is one line, without the file name.
pub fn read(data: &[u8]) -> Result<Contents, String> {
    if data.len() as u64 > MAX_PICKLE_BYTES {
        return Err(format!(
            "{} bytes, more than the {MAX_PICKLE_BYTES} this reader accepts",
            data.len()
        ));
    }
    let (nodes, root) = parse::parse(data)?;
    walk::flatten(&nodes, root)
}

type Id = u32;

#[derive(Debug)]
enum Node {
    /// None, a bool, a float, bytes: nothing this reader needs to know.
    Opaque,
    Int(i64),
    Str(Box<str>),
    Global(Global),
    Tuple(Vec<Id>),
    /// A list, set or frozenset.
    List(Vec<Id>),
    /// Keys and values interleaved, in insertion order.
    Dict(Vec<Id>),
    /// REDUCE, NEWOBJ or NEWOBJ_EX: `func(*args)`, never run.
    Call {
        func: Id,
        args: Id,
    },
    PersId(Id),
}

#[derive(Debug)]
enum Global {
    /// `collections.OrderedDict`, `collections.defaultdict`: calling it makes an empty dict.
    DictType,
    RebuildTensorV2,
    /// `_rebuild_parameter(data, ...)`, `_rebuild_parameter_with_state(data, ...)`.
    RebuildParameter,
    /// `_rebuild_from_type_v2(func, new_type, args, state)`.
    RebuildFromTypeV2,
    /// `torch.<X>Storage`: the class name.
    Storage(Box<str>),
    /// Another `torch._utils._rebuild_*` function: a tensor this reader does not read.
    OtherRebuild(Box<str>),
    /// Anything else, by its full name: an opaque value.
    Other(Box<str>),
}

fn global(module: &str, name: &str) -> Global {
    match (module, name) {
        ("collections", "OrderedDict" | "defaultdict") => Global::DictType,
        ("torch._utils", "_rebuild_tensor_v2") => Global::RebuildTensorV2,
        ("torch._utils", "_rebuild_parameter" | "_rebuild_parameter_with_state") => Global::RebuildParameter,
        ("torch._tensor", "_rebuild_from_type_v2") => Global::RebuildFromTypeV2,
        ("torch", s) if s.ends_with("Storage") => Global::Storage(s.into()),
        ("torch._utils", s) if s.starts_with("_rebuild") => Global::OtherRebuild(format!("{module}.{name}").into()),
        _ => Global::Other(format!("{module}.{name}").into()),
    }
}

fn kind(node: &Node) -> &'static str {
    match node {
        Node::Tuple(_) => "a tuple",
        Node::List(_) => "a list",
        Node::Dict(_) => "a dict",
        Node::Str(_) => "a string",
        Node::Int(_) => "an integer",
        Node::PersId(_) => "a persistent id",
        Node::Call { .. } => "a call",
        Node::Global(_) => "a global",
        Node::Opaque => "a value of another type",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(c: &Contents) -> Vec<(&str, &str)> {
        c.strings.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
    }

    /// `pickle.dumps({...}, protocol=4)` of CPython 3: FRAME, MEMOIZE, SHORT_BINUNICODE,
    /// STACK_GLOBAL, SHORT_BINBYTES, EMPTY_SET/ADDITEMS, BINFLOAT, LONG1, NONE.
    #[test]
    fn protocol_4_opcodes_as_python_writes_them() {
        let data = b"\x80\x04\x95\x90\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x07version\x94\x8c\x031.0\x94\x8c\x01n\
            \x94J\xff\xff\xff\xff\x8c\x03big\x94\x8a\x06\x00\x00\x00\x00\x00\x01\x8c\x01f\x94G?\xe0\x00\x00\x00\x00\
            \x00\x00\x8c\x02sd\x94\x8c\x0bcollections\x94\x8c\x0bOrderedDict\x94\x93\x94)R\x94(\x8c\x01a\x94\x8c\x01x\
            \x94\x8c\x01b\x94C\x02\x00\x01\x94uK\x07\x8c\x05seven\x94\x8c\x01s\x94\x8f\x94(K\x01K\x02\x90\x8c\x04none\
            \x94Nu.";
        let c = read(data).unwrap();
        assert_eq!(strings(&c), [("7", "seven"), ("sd.a", "x"), ("version", "1.0")]);
        assert!(c.tensors.is_empty() && c.sections.is_empty());
    }

    /// Integer keys from BININT and LONG1 (two's complement, sign-extended).
    #[test]
    fn integers_decode_with_their_sign() {
        let data = b"\x80\x02}q\x00(\x8a\x06\x00\x00\x00\x00\x00\xffX\x03\x00\x00\x00negq\x01\x8a\x06\x00\x00\x00\x00\
            \x00\x01X\x03\x00\x00\x00bigq\x02J\xff\xff\xff\xffX\x02\x00\x00\x00m1q\x03K\xffX\x01\x00\x00\x00bq\x04u.";
        let c = read(data).unwrap();
        assert_eq!(
            strings(&c),
            [
                ("-1", "m1"),
                ("-1099511627776", "neg"),
                ("1099511627776", "big"),
                ("255", "b")
            ]
        );
    }

    /// A storage offset of -2^62 (LONG1) is an error naming it, not a wrapped 0.
    #[test]
    fn a_negative_offset_is_an_error() {
        let head = b"\x80\x02}X\x01\x00\x00\x00wctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storage\
            ctorch\nFloatStorage\nX\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x04tQ";
        let tail = b"(K\x03t(K\x01t\x89)tRs.";
        let offset: Vec<u8> = [0x8a, 8].into_iter().chain((-(1i64 << 62)).to_le_bytes()).collect();
        let e = read(&[&head[..], &offset, tail].concat()).unwrap_err();
        assert!(
            e.contains("tensor `w`: the storage offset -4611686018427387904 is negative"),
            "{e}"
        );
        // The same record at offset 1 reads.
        let c = read(&[&head[..], b"K\x01", tail].concat()).unwrap();
        let t = c.tensors["w"].as_ref().unwrap();
        assert_eq!(
            (t.dtype, &t.shape[..], &t.stride[..], t.offset, &*t.key),
            (DType::F32, &[3][..], &[1][..], 1, "0")
        );
    }
}
