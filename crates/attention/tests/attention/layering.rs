//! The crate's import graph runs one way: each top-level module of `src/` uses (`crate::<module>`
//! in code, not in comments) only modules on lower layers. The layers are the numbered list under
//! "Layers" in `src/lib.rs`'s docs, bottom first; this test reads them from there, so the order
//! is written in one place. Modules on one line are one layer and may not use each other.
//!
//! Plain Rust, no Python: `cargo test -p unet-attention --test attention layering::`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Layer of every top-level module, from the "Layers" list of `lib.rs`'s docs: lines
/// `//! N. [`a`], `b` — ...` (linked or not) give layer N to `a` and `b`.
fn layers(lib: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    let mut in_list = false;
    for line in lib.lines() {
        let Some(doc) = line.strip_prefix("//!") else { continue };
        let doc = doc.trim();
        if doc.starts_with('#') {
            in_list = doc.trim_start_matches('#').trim() == "Layers";
            continue;
        }
        if !in_list {
            continue;
        }
        let Some((num, rest)) = doc.split_once(". ") else {
            continue;
        };
        let Ok(level) = num.parse::<usize>() else { continue };
        // The module names: the `name`s in backticks (links or not) before the first " — ".
        let names = rest.split(" — ").next().unwrap_or("");
        for name in names.split('`').skip(1).step_by(2) {
            assert!(
                !name.is_empty(),
                "lib.rs layer {level}: an empty module name in {line:?}"
            );
            assert!(
                out.insert(name.to_string(), level).is_none(),
                "lib.rs: {name} is on two layers"
            );
        }
    }
    out
}

/// `text` with comments, string and char literals blanked (newlines kept, so offsets keep their
/// line numbers).
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let blank = |out: &mut Vec<u8>, c: u8| out.push(if c == b'\n' { b'\n' } else { b' ' });
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                out.push(b' ');
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    out.extend(b"  ");
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    out.extend(b"  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
        } else if b[i] == b'"' || (b[i] == b'r' && b[i..].starts_with(b"r#\"")) || b[i..].starts_with(b"r\"") {
            // A string: plain (with escapes) or raw (`r"..."`, `r#"..."#`).
            let raw = b[i] == b'r';
            let mut hashes = 0;
            if raw {
                out.push(b' ');
                i += 1;
                while b[i] == b'#' {
                    hashes += 1;
                    out.push(b' ');
                    i += 1;
                }
            }
            out.push(b' ');
            i += 1;
            while i < b.len() {
                if !raw && b[i] == b'\\' {
                    out.extend(b"  ");
                    i += 2;
                    continue;
                }
                if b[i] == b'"' && b[i + 1..].iter().take(hashes).filter(|&&c| c == b'#').count() == hashes {
                    out.extend(std::iter::repeat_n(b' ', 1 + hashes));
                    i += 1 + hashes;
                    break;
                }
                blank(&mut out, b[i]);
                i += 1;
            }
        } else if b[i] == b'\'' && i + 2 < b.len() && (b[i + 2] == b'\'' || b[i + 1] == b'\\') {
            // A char literal ('x', '\n', '\''); lifetimes ('a) are left alone.
            let end = b[i + 2..]
                .iter()
                .position(|&c| c == b'\'')
                .map_or(b.len(), |p| i + 3 + p);
            out.extend(std::iter::repeat_n(b' ', end - i));
            i = end;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).expect("only ASCII bytes were replaced")
}

/// The top-level modules a piece of code names after `crate::`: `crate::a::..`, and the
/// members of `crate::{a, b::c, ..}` groups (nested groups included), with their byte offsets.
fn uses(code: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let ident = |s: &str| -> String { s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect() };
    for (at, _) in code.match_indices("crate::") {
        // `$crate::` in macros and `xcrate::` are not this crate's paths.
        if at > 0 && {
            let c = code.as_bytes()[at - 1];
            c == b'$' || c.is_ascii_alphanumeric() || c == b'_'
        } {
            continue;
        }
        let rest = code[at + 7..].trim_start();
        if let Some(group) = rest.strip_prefix('{') {
            // The group's top-level members: split at commas outside nested braces.
            let (mut depth, mut start) = (0usize, 0usize);
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        out.push((at, ident(group[start..j].trim_start())));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.push((at, ident(group[start..j].trim_start())));
                        start = j + 1;
                    }
                    _ => {}
                }
            }
        } else {
            out.push((at, ident(rest)));
        }
    }
    out.retain(|(_, name)| !name.is_empty() && name != "self");
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file of `src/` belongs to (`None`: `lib.rs` itself).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).expect("a file under src/");
    let first = rel.components().next()?.as_os_str().to_str()?;
    match first.strip_suffix(".rs") {
        Some("lib") => None,
        Some(stem) => Some(stem.to_string()),
        None => Some(first.to_string()),
    }
}

/// Every use of a module on the same or a higher layer, as `file:line: message`. Names that are
/// items of `lib.rs` itself (`crate::Error`, `crate::Result`: the re-exports of `error`) count as
/// the module they come from, given in `aliases`.
fn violations(src: &Path, levels: &BTreeMap<String, usize>, aliases: &[(&str, &str)]) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let mut out = Vec::new();
    for file in files {
        let Some(module) = module_of(src, &file) else { continue };
        let shown = file
            .strip_prefix(src.parent().unwrap_or(src))
            .unwrap_or(&file)
            .display()
            .to_string();
        let Some(&own) = levels.get(&module) else {
            out.push(format!("{shown}: module `{module}` is on no layer of lib.rs's docs"));
            continue;
        };
        let text = std::fs::read_to_string(&file).expect("a readable source file");
        let code = code_only(&text);
        for (at, used) in uses(&code) {
            let used = aliases.iter().find(|a| a.0 == used).map_or(used.as_str(), |a| a.1);
            if used == module {
                continue;
            }
            let line = code[..at].matches('\n').count() + 1;
            match levels.get(used) {
                Some(&level) if level < own => {}
                Some(&level) => out.push(format!(
                    "{shown}:{line}: `{module}` (layer {own}) uses `crate::{used}` (layer {level}): \
                     a module may use only modules on lower layers"
                )),
                None => out.push(format!(
                    "{shown}:{line}: `crate::{used}` is no module on a layer of lib.rs's docs"
                )),
            }
        }
    }
    out
}

const ALIASES: [(&str, &str); 3] = [("Error", "error"), ("FileError", "error"), ("Result", "error")];

#[test]
fn every_module_uses_only_lower_layers() {
    let src = src();
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("src/lib.rs");
    let levels = layers(&lib);
    assert!(
        levels.len() > 5,
        "no \"Layers\" list found in lib.rs's docs: {levels:?}"
    );
    // Every module that lib.rs declares is on a layer.
    for line in code_only(&lib).lines() {
        let line = line.trim();
        if let Some(rest) = line
            .strip_prefix("pub mod ")
            .or_else(|| line.strip_prefix("mod "))
            .or_else(|| line.strip_prefix("pub(crate) mod "))
        {
            let name = rest.trim_end_matches(';').trim();
            assert!(
                levels.contains_key(name),
                "lib.rs declares `{name}`, which is on no layer of its docs"
            );
        }
    }
    let found = violations(&src, &levels, &ALIASES);
    assert!(found.is_empty(), "the layering is broken:\n{}", found.join("\n"));
}

#[test]
fn the_scanner_finds_paths_and_groups_but_not_comments() {
    let code = code_only(
        "use crate::sdpa::x; // crate::layers\n/* crate::diffusers */ let s = \"crate::ldm\";\n\
         use crate::{config, Error, trace::{a, b}};\nmacro_rules! m { () => { $crate::x } }\n",
    );
    let found: Vec<String> = uses(&code).into_iter().map(|u| u.1).collect();
    assert_eq!(found, ["sdpa", "config", "Error", "trace"]);
}

#[test]
fn a_circle_is_caught() {
    // Two modules that use each other: whatever their order, one of them uses a higher one.
    let scratch = tempfile::Builder::new()
        .prefix("unet-attention-layering-")
        .tempdir()
        .unwrap();
    let dir = scratch.path();
    std::fs::create_dir_all(dir.join("low")).unwrap();
    std::fs::write(dir.join("low/mod.rs"), "use crate::high::f;\n").unwrap();
    std::fs::write(dir.join("high.rs"), "use crate::low::g;\n").unwrap();
    let levels = BTreeMap::from([("low".to_string(), 1), ("high".to_string(), 2)]);
    let found = violations(dir, &levels, &[]);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("low/mod.rs:1: `low` (layer 1) uses `crate::high` (layer 2)"),
        "{found:?}"
    );
}
