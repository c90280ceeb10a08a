//! Flattening the arena into names, tensors and strings, without recursing.

use super::{kind, Contents, Global, Id, Node, TensorRecord};
use super::{MAX_KEPT_STRING, MAX_NAME, MAX_RANK, MAX_WALK_BYTES, MAX_WALK_DEPTH};
use candle_core::DType;

/// `nodes` flattened from `root` (see the parent module's docs for the limits).
pub(super) fn flatten(nodes: &[Node], root: Id) -> Result<Contents, String> {
    Walker {
        nodes,
        out: Contents::default(),
        visits: 0,
        bytes: 0,
    }
    .run(root)
}

/// Flattens dicts into names without recursing (see the module docs for its limits).
struct Walker<'p> {
    nodes: &'p [Node],
    out: Contents,
    visits: usize,
    bytes: usize,
}

impl Walker<'_> {
    fn run(mut self, root: Id) -> Result<Contents, String> {
        let nodes = self.nodes;
        let Node::Dict(items) = &nodes[root as usize] else {
            self.subtree(root, String::new(), 0)?;
            return Ok(self.out);
        };
        for pair in items.chunks(2) {
            let Some(key) = self.key(pair[0]) else { continue };
            if key == "_metadata" {
                continue;
            }
            let before = self.out.tensors.len();
            self.subtree(pair[1], key.clone(), 1)?;
            if matches!(nodes[pair[1] as usize], Node::Dict(_)) && self.out.tensors.len() > before {
                self.out.sections.insert(key);
            }
        }
        Ok(self.out)
    }

    /// Depth-first over the dicts under `start`, in insertion order.
    fn subtree(&mut self, start: Id, name: String, depth: usize) -> Result<(), String> {
        let nodes = self.nodes;
        let most = 2 * nodes.len() + 1024;
        let mut todo = vec![(start, name, depth)];
        while let Some((id, name, depth)) = todo.pop() {
            self.visits += 1;
            if self.visits > most {
                return Err(format!(
                    "its dicts reach shared entries more than {most} times (a reference bomb?)"
                ));
            }
            if depth > MAX_WALK_DEPTH {
                continue;
            }
            match &nodes[id as usize] {
                Node::Dict(items) => {
                    for pair in items.chunks(2).rev() {
                        let Some(key) = self.key(pair[0]) else { continue };
                        if key == "_metadata" {
                            continue;
                        }
                        let full = if name.is_empty() { key } else { format!("{name}.{key}") };
                        if full.len() > MAX_NAME {
                            return Err(format!("a flattened name longer than {MAX_NAME} bytes"));
                        }
                        self.count(full.len() + 32)?;
                        todo.push((pair[1], full, depth + 1));
                    }
                }
                Node::Str(s) if s.len() <= MAX_KEPT_STRING => {
                    self.count(s.len())?;
                    self.out.strings.insert(name, s.to_string());
                }
                _ => {
                    if let Some(t) = tensor(nodes, id).map_err(|e| format!("tensor `{name}`: {e}"))? {
                        self.count(t.as_ref().map_or(0, |r| r.key.len()))?;
                        self.out.tensors.insert(name, t);
                    }
                }
            }
        }
        Ok(())
    }

    fn key(&self, id: Id) -> Option<String> {
        match &self.nodes[id as usize] {
            Node::Str(s) => Some(s.to_string()),
            Node::Int(i) => Some(i.to_string()),
            _ => None,
        }
    }

    fn count(&mut self, n: usize) -> Result<(), String> {
        self.bytes += n;
        if self.bytes > MAX_WALK_BYTES {
            return Err(format!("more than {MAX_WALK_BYTES} bytes of names and strings"));
        }
        Ok(())
    }
}

/// A tensor found: its record, or why this tool cannot load it.
type Found = Option<Result<TensorRecord, String>>;

/// The tensor `id` is, if it is a call of a tensor rebuild function: `Ok(None)` if it is not a
/// tensor, `Ok(Some(Err))` for one this tool cannot load, `Err` for a malformed one.
fn tensor(nodes: &[Node], id: Id) -> Result<Found, String> {
    let Node::Call { mut func, mut args } = nodes[id as usize] else {
        return Ok(None);
    };
    // Parameters and tensor subclasses wrap the plain rebuild call; a few levels at most.
    for _ in 0..4 {
        let Node::Global(g) = &nodes[func as usize] else {
            return Ok(None);
        };
        match g {
            Global::RebuildTensorV2 => return rebuild_v2(nodes, args).map(Some),
            Global::RebuildParameter => {
                let data = *tuple(nodes, args, "the parameter's arguments")?
                    .first()
                    .ok_or("a parameter without data")?;
                let Node::Call { func: f, args: a } = nodes[data as usize] else {
                    return Err("a parameter whose data is not a tensor".into());
                };
                (func, args) = (f, a);
            }
            Global::RebuildFromTypeV2 => {
                let a = tuple(nodes, args, "the arguments of _rebuild_from_type_v2")?;
                if a.len() < 3 {
                    return Err("_rebuild_from_type_v2 with fewer than 3 arguments".into());
                }
                (func, args) = (a[0], a[2]);
            }
            Global::OtherRebuild(name) => {
                return Ok(Some(Err(format!(
                    "a tensor rebuilt by `{name}`, which this tool does not read"
                ))))
            }
            _ => return Ok(None),
        }
    }
    Err("tensor rebuild calls nested too deep".into())
}

/// `_rebuild_tensor_v2(storage, storage_offset, size, stride, ...)`.
fn rebuild_v2(nodes: &[Node], args: Id) -> Result<Result<TensorRecord, String>, String> {
    let a = tuple(nodes, args, "the arguments of _rebuild_tensor_v2")?;
    if a.len() < 4 {
        return Err(format!(
            "_rebuild_tensor_v2 with {} arguments, expected at least 4",
            a.len()
        ));
    }
    let Node::PersId(pid) = nodes[a[0] as usize] else {
        return Err("the storage is not a persistent id".into());
    };
    let s = tuple(nodes, pid, "the storage's persistent id")?;
    if s.len() != 5 || !matches!(&nodes[s[0] as usize], Node::Str(tag) if &**tag == "storage") {
        return Err("the storage's persistent id is not ('storage', type, key, location, numel)".into());
    }
    let class = match &nodes[s[1] as usize] {
        Node::Global(Global::Storage(class)) => class,
        Node::Global(Global::Other(name) | Global::OtherRebuild(name)) => {
            return Err(format!("the storage type `{name}` is not a torch.<X>Storage class"))
        }
        other => {
            return Err(format!(
                "the storage type is {}, not a torch.<X>Storage class",
                kind(other)
            ))
        }
    };
    let Node::Str(key) = &nodes[s[2] as usize] else {
        return Err("the storage key is not a string".into());
    };
    let offset = index(nodes, a[1], "the storage offset")?;
    let shape = indices(nodes, a[2], "the size")?;
    let stride = indices(nodes, a[3], "the stride")?;
    if shape.len() != stride.len() || shape.len() > MAX_RANK {
        return Err(format!(
            "size {shape:?} and stride {stride:?} (at most {MAX_RANK} dimensions)"
        ));
    }
    let dtype = match &**class {
        "FloatStorage" => DType::F32,
        "DoubleStorage" => DType::F64,
        "HalfStorage" => DType::F16,
        "BFloat16Storage" => DType::BF16,
        "ByteStorage" => DType::U8,
        "LongStorage" => DType::I64,
        other => return Ok(Err(format!("unsupported storage type {other}"))),
    };
    let elem = dtype.size_in_bytes();
    let numel = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    let bytes = numel.and_then(|n| n.checked_add(offset)?.checked_mul(elem));
    if bytes.is_none_or(|b| b > isize::MAX as usize) {
        return Err(format!("size {shape:?} at offset {offset} overflows"));
    }
    Ok(Ok(TensorRecord {
        dtype,
        shape,
        stride,
        offset,
        key: key.to_string(),
    }))
}

fn tuple<'n>(nodes: &'n [Node], id: Id, what: &str) -> Result<&'n [Id], String> {
    match &nodes[id as usize] {
        Node::Tuple(items) => Ok(items),
        other => Err(format!("{what}: expected a tuple, found {}", kind(other))),
    }
}

/// A non-negative integer that fits in `usize`.
fn index(nodes: &[Node], id: Id, what: &str) -> Result<usize, String> {
    match nodes[id as usize] {
        Node::Int(i) if i < 0 => Err(format!("{what} {i} is negative")),
        Node::Int(i) => usize::try_from(i).map_err(|_| format!("{what} {i} is too large")),
        ref other => Err(format!("{what}: expected an integer, found {}", kind(other))),
    }
}

fn indices(nodes: &[Node], id: Id, what: &str) -> Result<Vec<usize>, String> {
    tuple(nodes, id, what)?.iter().map(|&i| index(nodes, i, what)).collect()
}
