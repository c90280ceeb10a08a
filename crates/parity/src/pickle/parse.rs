//! The pickle opcodes into the arena: an explicit stack and mark stack, a memo of arena
//! indices, and the limits of the parent module checked as each object is made.

use super::{global, kind, Global, Id, Node, MAX_DEPTH, MAX_GLOBAL, MAX_OBJECTS, MAX_STACK};
use std::collections::HashMap;

/// The arena of `data`'s objects and the index of the one STOP returns.
pub(super) fn parse(data: &[u8]) -> Result<(Vec<Node>, Id), String> {
    let mut parser = Parser {
        data,
        pos: 0,
        nodes: Vec::new(),
        depth: Vec::new(),
        stack: Vec::new(),
        marks: Vec::new(),
        memo: HashMap::new(),
        spent: 0,
    };
    let root = parser.run()?;
    Ok((parser.nodes, root))
}

/// The name of an opcode this reader does not accept, for its error.
fn unsupported_name(op: u8) -> &'static str {
    match op {
        b'P' => "PERSID",
        b'i' => "INST",
        b'o' => "OBJ",
        b'S' => "STRING",
        b'T' => "BINSTRING",
        b'U' => "SHORT_BINSTRING",
        b'V' => "UNICODE",
        b'I' => "INT",
        b'L' => "LONG",
        b'F' => "FLOAT",
        b'g' => "GET",
        b'p' => "PUT",
        0x82..=0x84 => "EXT",
        0x96 => "BYTEARRAY8",
        0x97 => "NEXT_BUFFER",
        0x98 => "READONLY_BUFFER",
        _ => "not a pickle opcode",
    }
}

struct Parser<'a> {
    data: &'a [u8],
    pos: usize,
    nodes: Vec<Node>,
    /// Nesting depth of each node when it was last added to.
    depth: Vec<u8>,
    stack: Vec<Id>,
    /// Stack lengths at each open MARK.
    marks: Vec<usize>,
    memo: HashMap<u32, Id>,
    /// Objects, references and memo entries so far (see [`MAX_OBJECTS`]).
    spent: usize,
}

impl<'a> Parser<'a> {
    fn run(&mut self) -> Result<Id, String> {
        loop {
            let at = self.pos;
            let Some(&op) = self.data.get(at) else {
                return Err(format!("the pickle ends at byte {at} without a STOP opcode"));
            };
            self.pos += 1;
            match self.step(op) {
                Ok(Some(root)) => return Ok(root),
                Ok(None) => {}
                Err(e) => return Err(format!("byte {at} (opcode 0x{op:02x}): {e}")),
            }
        }
    }

    /// One opcode: the stack and memo operations and calls; values are [`Parser::value`].
    fn step(&mut self, op: u8) -> Result<Option<Id>, String> {
        match op {
            b'.' => return self.pop().map(Some),
            0x80 => {
                let v = self.bytes(1)?[0];
                if !(2..=5).contains(&v) {
                    return Err(format!("pickle protocol {v}: only protocols 2 to 5 are read"));
                }
            }
            0x95 => {
                self.bytes(8)?; // FRAME: framing only
            }
            b'(' => {
                if self.marks.len() >= MAX_STACK {
                    return Err(format!("more than {MAX_STACK} open marks"));
                }
                self.marks.push(self.stack.len());
            }
            b'0' => {
                self.pop()?;
            }
            b'1' => {
                self.pop_mark()?;
            }
            b'2' => {
                let top = self.top()?;
                self.push(top)?;
            }
            b'q' | b'r' | 0x94 => {
                let index = match op {
                    b'q' => self.bytes(1)?[0] as u32,
                    b'r' => self.u32()?,
                    _ => self.memo.len() as u32,
                };
                self.memo_put(index)?;
            }
            b'h' | b'j' => {
                let index = if op == b'h' {
                    self.bytes(1)?[0] as u32
                } else {
                    self.u32()?
                };
                self.memo_get(index)?;
            }
            b'Q' => {
                let id = self.pop()?;
                self.spend(1)?;
                self.make(Node::PersId(id), self.deeper(&[id]))?;
            }
            b'R' | 0x81 | 0x92 => {
                if op == 0x92 {
                    self.pop()?; // NEWOBJ_EX's kwargs
                }
                let args = self.pop()?;
                let func = self.pop()?;
                self.call(func, args)?;
            }
            b'c' => {
                let module = self.line()?;
                let name = self.line()?;
                self.make(Node::Global(global(module, name)), 0)?;
            }
            0x93 => {
                let name = self.pop()?;
                let module = self.pop()?;
                let g = match (&self.nodes[module as usize], &self.nodes[name as usize]) {
                    (Node::Str(m), Node::Str(n)) => global(m, n),
                    _ => return Err("STACK_GLOBAL of values that are not strings".into()),
                };
                self.make(Node::Global(g), 0)?;
            }
            _ => self.value(op)?,
        }
        Ok(None)
    }

    /// Opcodes that push a value or add items to a container.
    fn value(&mut self, op: u8) -> Result<(), String> {
        let node = match op {
            b'N' | 0x88 | 0x89 => Node::Opaque,
            b'K' => Node::Int(self.bytes(1)?[0] as i64),
            b'M' => Node::Int(u16::from_le_bytes(self.array()?) as i64),
            b'J' => Node::Int(i32::from_le_bytes(self.array()?) as i64),
            0x8a => {
                let n = self.bytes(1)?[0] as u64;
                Node::Int(self.long(n)?)
            }
            0x8b => {
                let n = self.u32()? as u64;
                Node::Int(self.long(n)?)
            }
            b'G' => {
                self.bytes(8)?; // BINFLOAT
                Node::Opaque
            }
            0x8c | b'X' | 0x8d => {
                let n = match op {
                    0x8c => self.bytes(1)?[0] as u64,
                    b'X' => self.u32()? as u64,
                    _ => u64::from_le_bytes(self.array()?),
                };
                Node::Str(String::from_utf8_lossy(self.bytes(n)?).into())
            }
            b'C' | b'B' | 0x8e => {
                let n = match op {
                    b'C' => self.bytes(1)?[0] as u64,
                    b'B' => self.u32()? as u64,
                    _ => u64::from_le_bytes(self.array()?),
                };
                self.bytes(n)?;
                Node::Opaque
            }
            b')' => Node::Tuple(vec![]),
            b']' | 0x8f => Node::List(vec![]),
            b'}' => Node::Dict(vec![]),
            _ => return self.container(op),
        };
        let depth = matches!(node, Node::Tuple(_) | Node::List(_) | Node::Dict(_)) as u8;
        self.make(node, depth)
    }

    /// Opcodes that build containers from stack items or add items to one.
    fn container(&mut self, op: u8) -> Result<(), String> {
        match op {
            b't' | b'l' | 0x91 | b'd' => {
                let items = self.pop_mark()?;
                if op == b'd' && items.len() % 2 == 1 {
                    return Err("DICT of an odd number of items".into());
                }
                let depth = self.deeper(&items);
                self.spend(items.len())?;
                let node = match op {
                    b't' => Node::Tuple(items),
                    b'd' => Node::Dict(items),
                    _ => Node::List(items),
                };
                self.make(node, depth)
            }
            0x85..=0x87 => {
                let n = (op - 0x84) as usize;
                let fence = self.marks.last().copied().unwrap_or(0);
                if self.stack.len() < fence + n {
                    return Err("stack underflow".into());
                }
                let items = self.stack.split_off(self.stack.len() - n);
                let depth = self.deeper(&items);
                self.spend(n)?;
                self.make(Node::Tuple(items), depth)
            }
            b's' => {
                let value = self.pop()?;
                let key = self.pop()?;
                self.add(vec![key, value], true)
            }
            b'u' => {
                let items = self.pop_mark()?;
                if items.len() % 2 == 1 {
                    return Err("SETITEMS of an odd number of items".into());
                }
                self.add(items, true)
            }
            b'a' => {
                let value = self.pop()?;
                self.add(vec![value], false)
            }
            b'e' | 0x90 => {
                let items = self.pop_mark()?;
                self.add(items, false)
            }
            b'b' => {
                let state = self.pop()?;
                let target = self.top()?;
                // A dict's state (an OrderedDict's `_metadata`) joins its items; any other state is
                // dropped (the object stays what it was).
                match (&self.nodes[target as usize], &self.nodes[state as usize]) {
                    (Node::Dict(_), Node::Dict(items)) => self.add(items.clone(), true),
                    _ => Ok(()),
                }
            }
            _ => Err(format!("unsupported opcode {}", unsupported_name(op))),
        }
    }

    /// Add `items` to the dict (`dict`) or list on top of the stack; an opaque object drops them.
    fn add(&mut self, items: Vec<Id>, dict: bool) -> Result<(), String> {
        let target = self.top()?;
        let depth = self.deeper(&items);
        self.spend(items.len())?;
        match (&mut self.nodes[target as usize], dict) {
            (Node::Dict(v), true) | (Node::List(v), false) => v.extend(items),
            (Node::Call { .. } | Node::Global(_), _) => return Ok(()),
            (other, _) => {
                let what = if dict { "set items of" } else { "append to" };
                return Err(format!("cannot {what} {}", kind(other)));
            }
        }
        let d = &mut self.depth[target as usize];
        *d = (*d).max(depth);
        self.check_depth(depth)
    }

    fn call(&mut self, func: Id, args: Id) -> Result<(), String> {
        if matches!(self.nodes[func as usize], Node::Global(Global::DictType)) {
            return self.make(Node::Dict(vec![]), 1);
        }
        self.spend(2)?;
        self.make(Node::Call { func, args }, self.deeper(&[func, args]))
    }

    /// The depth of a container of `items`.
    fn deeper(&self, items: &[Id]) -> u8 {
        let inner = items.iter().map(|&i| self.depth[i as usize]).max().unwrap_or(0);
        inner.saturating_add(1)
    }

    fn check_depth(&self, depth: u8) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err(format!("objects nested more than {MAX_DEPTH} deep"));
        }
        Ok(())
    }

    fn spend(&mut self, n: usize) -> Result<(), String> {
        self.spent += n;
        if self.spent > MAX_OBJECTS {
            return Err(format!("more than {MAX_OBJECTS} objects and references"));
        }
        Ok(())
    }

    /// A new node, pushed on the stack.
    fn make(&mut self, node: Node, depth: u8) -> Result<(), String> {
        self.check_depth(depth)?;
        self.spend(1)?;
        let id = self.nodes.len() as Id;
        self.nodes.push(node);
        self.depth.push(depth);
        self.push(id)
    }

    fn push(&mut self, id: Id) -> Result<(), String> {
        if self.stack.len() >= MAX_STACK {
            return Err(format!("more than {MAX_STACK} items on the stack"));
        }
        self.stack.push(id);
        Ok(())
    }

    /// The top of the stack, which must lie above the last mark.
    fn top(&self) -> Result<Id, String> {
        let fence = self.marks.last().copied().unwrap_or(0);
        match self.stack.last() {
            Some(&id) if self.stack.len() > fence => Ok(id),
            _ => Err("stack underflow".into()),
        }
    }

    fn pop(&mut self) -> Result<Id, String> {
        let id = self.top()?;
        self.stack.pop();
        Ok(id)
    }

    /// The items above the last mark, and the mark.
    fn pop_mark(&mut self) -> Result<Vec<Id>, String> {
        let mark = self.marks.pop().ok_or("no MARK to pop to")?;
        Ok(self.stack.split_off(mark))
    }

    fn memo_put(&mut self, index: u32) -> Result<(), String> {
        let id = self.top()?;
        if self.memo.insert(index, id).is_none() {
            self.spend(1)?;
        }
        Ok(())
    }

    fn memo_get(&mut self, index: u32) -> Result<(), String> {
        let id = *self
            .memo
            .get(&index)
            .ok_or_else(|| format!("memo entry {index} is not set"))?;
        self.push(id)
    }

    /// The next `n` bytes, checked against what is left before anything is allocated.
    fn bytes(&mut self, n: u64) -> Result<&'a [u8], String> {
        let left = self.data.len() - self.pos;
        if n > left as u64 {
            return Err(format!("needs {n} bytes, but only {left} are left"));
        }
        let out = &self.data[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], String> {
        Ok(self.bytes(N as u64)?.try_into().expect("N bytes"))
    }

    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    /// LONG1/LONG4: `n` bytes of little-endian two's complement.
    fn long(&mut self, n: u64) -> Result<i64, String> {
        if n > 8 {
            return Err(format!(
                "an integer of {n} bytes, wider than the 64 bits this reader accepts"
            ));
        }
        let b = self.bytes(n)?;
        let fill = if b.last().is_some_and(|&x| x & 0x80 != 0) {
            0xff
        } else {
            0
        };
        let mut le = [fill; 8];
        le[..b.len()].copy_from_slice(b);
        Ok(i64::from_le_bytes(le))
    }

    /// A GLOBAL argument: ASCII text up to a newline, at most [`MAX_GLOBAL`] bytes.
    fn line(&mut self) -> Result<&'a str, String> {
        let rest = &self.data[self.pos..];
        let window = &rest[..rest.len().min(MAX_GLOBAL + 1)];
        let n = window
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| format!("GLOBAL name unterminated or longer than {MAX_GLOBAL} bytes"))?;
        let text = std::str::from_utf8(&rest[..n]).map_err(|_| "GLOBAL name is not UTF-8".to_string())?;
        self.pos += n + 1;
        Ok(text.strip_suffix('\r').unwrap_or(text))
    }
}
