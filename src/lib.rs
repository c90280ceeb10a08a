//! The workspace's root package (not published): the end-to-end tests in `tests/`, the examples
//! in `examples/`, and the README's Rust snippets, compiled and run as doc tests by
//! `cargo test --workspace` from the repository root, against the committed `weights/`. A
//! snippet that stops compiling or stops matching PyTorch fails the test command.

/// README.md, whose ` ```rust ` blocks are this item's doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct Readme;

/// docs/rust-api.md, the README's examples that did not fit on the front door: its ` ```rust `
/// blocks are this item's doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/rust-api.md")]
pub struct RustApi;

/// The Markdown pages link to each other by relative path and heading anchor: every such link
/// must reach an existing file and, with an anchor, one of its headings (GitHub's slugs).
#[cfg(test)]
mod links {
    use std::path::{Path, PathBuf};

    fn pages() -> Vec<PathBuf> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut pages = vec![root.join("README.md"), root.join("BENCHMARKS.md")];
        for entry in std::fs::read_dir(root.join("docs")).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
        pages
    }

    /// GitHub's anchor for a heading: lower case, punctuation other than `-` and `_` dropped,
    /// spaces as `-`.
    fn slug(heading: &str) -> String {
        heading
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect()
    }

    fn anchors(text: &str) -> Vec<String> {
        let mut fenced = false;
        let mut out = vec![];
        for line in text.lines() {
            if line.starts_with("```") {
                fenced = !fenced;
            } else if !fenced && line.starts_with('#') {
                out.push(slug(line.trim_start_matches('#')));
            }
        }
        out
    }

    /// `(target)` of every `[label](target)` outside code fences.
    fn links(text: &str) -> Vec<String> {
        let mut fenced = false;
        let mut out = vec![];
        for line in text.lines() {
            if line.starts_with("```") {
                fenced = !fenced;
                continue;
            }
            if fenced {
                continue;
            }
            for (i, _) in line.match_indices("](") {
                let rest = &line[i + 2..];
                if let Some(end) = rest.find(')') {
                    out.push(rest[..end].to_string());
                }
            }
        }
        out
    }

    #[test]
    fn every_relative_link_reaches_its_file_and_heading() {
        let mut broken = vec![];
        for page in pages() {
            let text = std::fs::read_to_string(&page).unwrap();
            for link in links(&text) {
                if link.starts_with("http://") || link.starts_with("https://") || link.starts_with("mailto:") {
                    continue;
                }
                let (file, anchor) = link.split_once('#').unwrap_or((&link, ""));
                let target = if file.is_empty() {
                    page.clone()
                } else {
                    page.parent().unwrap().join(file)
                };
                if !target.exists() {
                    broken.push(format!("{}: {link} (no such file)", page.display()));
                } else if !anchor.is_empty() {
                    let heads = anchors(&std::fs::read_to_string(&target).unwrap());
                    if !heads.iter().any(|h| h == anchor) {
                        broken.push(format!("{}: {link} (no such heading)", page.display()));
                    }
                }
            }
        }
        assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    }
}
