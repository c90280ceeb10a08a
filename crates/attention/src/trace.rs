//! Stage tracing: the one seam through which a block exposes its intermediate tensors.
//!
//! A block calls [`record`] at its stage points (`norm`, `q`, `k`, `v`, `probs`, `attn`, `proj`,
//! `output`); outside [`with_trace`] that is one thread-local flag test and nothing else. Inside
//! [`with_trace`], every recorded tensor is kept (a cheap handle clone: candle tensors share
//! their storage) and returned in recording order. The PyTorch exporter
//! (`scripts/parity_trace.py`) stores the same stages, laid out the same way, as
//! `parity.trace.<stage>` in a bundle; `unet-parity check --trace` compares them stage by stage.
//!
//! Stage layouts (row-major; the comparison reshapes when the element counts agree, so
//! `(B, C, H, W)` and `(B, C, H·W)` are the same stage):
//!
//! | stage | layout |
//! |---|---|
//! | `norm` | the block's input norm output, in the layout the norm ran on (`(B, C, H, W)`, `(B, C, N)`) |
//! | `spatial_norm` | diffusers `spatial_norm` output `(B, C, H, W)` |
//! | `q`, `k`, `v` | `(B, heads, tokens, head_dim)` after the head split, before any scale; `k`/`v` include memory key/values; after `qk_norm` where the block has one |
//! | `probs` | `(B, heads, q_tokens, k_tokens)` attention weights, softmax over the last axis, in the compute dtype; recorded by the attention core only when at most [`PROBS_MAX_ELEMENTS`] |
//! | `attn` | the input of the output projection (heads merged), in the block's layout |
//! | `proj` | the output of the output projection, before any residual |
//! | `output` | the block's output (the bundle's first output) |
//!
//! Composite blocks run their parts inside [`scope`] / [`scope_at`], named like the PyTorch
//! submodule, so a nested stage reads `attentions.0/q`, `transformer_blocks.0/attn1/probs`; each
//! block records its own `output`, which nested is `<scope>/output`. Composite stages: `norm1`,
//! `norm2`, `norm3` (transformer blocks, resnets), `conv1`, `conv2`, `temb` (a resnet's
//! time-embedding projection), `shortcut`, `proj_in` / `act` (feed-forward: inner projection and
//! its activation; spatial transformer: input projection), `proj_out`, and `context` (linear
//! attention's `(B, heads, d_k, d_v)` context). A stage recorded twice under one name gets `#2`, `#3`, ... appended.

use candle_core::Tensor;
use std::cell::{Cell, RefCell};

/// The attention core records `probs` only when `B·heads·Lq·Lk` is at most this.
pub const PROBS_MAX_ELEMENTS: usize = 1 << 16;

/// Which stages a trace keeps: every one, or those a filter accepts (the others are named only).
type Keep = Option<Box<dyn Fn(&str) -> bool>>;

thread_local! {
    static ACTIVE: Cell<bool> = const { Cell::new(false) };
    /// The stages in recording order; `None` for one the filter left out (its name only).
    static STAGES: RefCell<Vec<(String, Option<Tensor>)>> = const { RefCell::new(Vec::new()) };
    static PREFIX: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
    static KEEP: RefCell<Keep> = const { RefCell::new(None) };
    static RENAME: RefCell<Rename> = const { RefCell::new(None) };
}

/// A stage-name map: `Some(name)` records the stage under `name`, `None` leaves it out.
type Rename = Option<Box<dyn Fn(&str) -> Option<String>>>;

/// Run `f` with every stage name (its full path) passed through `rename`, which gives the name
/// to record it under or `None` to leave it out: a model built under another codebase's names
/// (ldm's single-file keys) records its stages under that codebase's module paths.
pub fn renaming<R>(rename: impl Fn(&str) -> Option<String> + 'static, f: impl FnOnce() -> R) -> R {
    if !enabled() {
        return f();
    }
    struct Restore(Rename);
    impl Drop for Restore {
        fn drop(&mut self) {
            RENAME.with(|r| *r.borrow_mut() = self.0.take());
        }
    }
    let _restore = Restore(RENAME.with(|r| r.replace(Some(Box::new(rename)))));
    f()
}

/// Whether a trace is being recorded on this thread.
#[inline]
pub fn enabled() -> bool {
    ACTIVE.with(|a| a.get())
}

/// Record `tensor` as stage `name` (no-op unless inside [`with_trace`]).
#[inline]
pub fn record(name: &str, tensor: &Tensor) {
    if enabled() {
        record_slow(name, || Ok(tensor.clone()));
    }
}

/// Record the tensor `make` computes, computing it only while tracing (for stages that cost
/// something to form, e.g. the attention weights). Errors in `make` are ignored: a stage that
/// cannot be formed is simply absent.
#[inline]
pub fn record_with(name: &str, make: impl FnOnce() -> candle_core::Result<Tensor>) {
    if enabled() {
        record_slow(name, make);
    }
}

/// Record the stages `q`, `k`, `v`, each `(B, heads, tokens, head_dim)`.
#[inline]
pub fn record_qkv(q: &Tensor, k: &Tensor, v: &Tensor) {
    if enabled() {
        for (name, t) in [("q", q), ("k", k), ("v", v)] {
            record_slow(name, || Ok(t.clone()));
        }
    }
}

/// Record channels-first heads `(B, heads, head_dim, tokens)` as the stages `q`, `k`, `v` in
/// the token layout (transposed only while tracing).
#[inline]
pub fn record_qkv_channels(q: &Tensor, k: &Tensor, v: &Tensor) {
    if enabled() {
        for (name, t) in [("q", q), ("k", k), ("v", v)] {
            record_slow(name, || t.t());
        }
    }
}

/// Record the stage `name` under the current scope, numbered after the ones of its name before
/// (kept or not); its tensor is made only when the filter keeps it.
#[cold]
fn record_slow(name: &str, make: impl FnOnce() -> candle_core::Result<Tensor>) {
    let mut full = PREFIX.with(|p| p.borrow().iter().map(|s| format!("{s}/")).collect::<String>());
    full.push_str(name);
    if let Some(renamed) = RENAME.with(|r| r.borrow().as_ref().map(|rename| rename(&full))) {
        match renamed {
            Some(new) => full = new,
            None => return,
        }
    }
    let n = STAGES.with(|s| {
        s.borrow()
            .iter()
            .filter(|(k, _)| k == &full || k.strip_prefix(full.as_str()).is_some_and(|r| r.starts_with('#')))
            .count()
    });
    if n > 0 {
        full = format!("{full}#{}", n + 1);
    }
    let kept = KEEP.with(|k| k.borrow().as_ref().is_none_or(|keep| keep(&full)));
    // A stage that cannot be formed is simply absent.
    let tensor = if kept { make().ok() } else { None };
    if kept && tensor.is_none() {
        return;
    }
    STAGES.with(|s| s.borrow_mut().push((full, tensor)));
}

/// Run `f` with stage names prefixed by `name/` (only while tracing).
pub fn scope<R>(name: &str, f: impl FnOnce() -> R) -> R {
    if !enabled() {
        return f();
    }
    PREFIX.with(|p| p.borrow_mut().push(name.to_string()));
    struct Pop;
    impl Drop for Pop {
        fn drop(&mut self) {
            PREFIX.with(|p| {
                p.borrow_mut().pop();
            });
        }
    }
    let _pop = Pop;
    f()
}

/// [`scope`] under `name.index` (`resnets.0`, `transformer_blocks.1`), the name formatted only
/// while tracing.
pub fn scope_at<R>(name: &str, index: usize, f: impl FnOnce() -> R) -> R {
    if !enabled() {
        return f();
    }
    scope(&format!("{name}.{index}"), f)
}

/// Run `f` recording every stage; returns its result and the stages in recording order.
/// Nested calls are not supported: an inner `with_trace` takes the stages recorded so far with it.
pub fn with_trace<R>(f: impl FnOnce() -> R) -> (R, Vec<(String, Tensor)>) {
    let (result, stages, _) = trace_with(None, f);
    (result, stages)
}

/// [`with_trace`] keeping only the stages `keep` accepts (by their full name, `attentions.0/q`,
/// `norm#2`): the others' tensors are never held (nor made, for the ones [`record_with`] forms),
/// so a trace costs the memory of the stages compared, not of every stage the block records.
/// Returns the result, the stages kept, and the names of those left out, in recording order.
pub fn with_trace_keeping<R>(
    keep: impl Fn(&str) -> bool + 'static,
    f: impl FnOnce() -> R,
) -> (R, Vec<(String, Tensor)>, Vec<String>) {
    trace_with(Some(Box::new(keep)), f)
}

fn trace_with<R>(keep: Keep, f: impl FnOnce() -> R) -> (R, Vec<(String, Tensor)>, Vec<String>) {
    struct Reset(bool, Keep);
    impl Drop for Reset {
        fn drop(&mut self) {
            ACTIVE.with(|a| a.set(self.0));
            KEEP.with(|k| *k.borrow_mut() = self.1.take());
        }
    }
    let before = ACTIVE.with(|a| a.replace(true));
    let keep_before = KEEP.with(|k| k.replace(keep));
    let saved = STAGES.with(|s| std::mem::take(&mut *s.borrow_mut()));
    let result = {
        let _reset = Reset(before, keep_before);
        f()
    };
    let stages = STAGES.with(|s| std::mem::replace(&mut *s.borrow_mut(), saved));
    let mut kept = vec![];
    let mut left_out = vec![];
    for (name, tensor) in stages {
        match tensor {
            Some(t) => kept.push((name, t)),
            None => left_out.push(name),
        }
    }
    (result, kept, left_out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn records_only_inside_with_trace() {
        let t = Tensor::zeros(3, candle_core::DType::F32, &Device::Cpu).unwrap();
        record("q", &t);
        let ((), stages) = with_trace(|| {
            record("q", &t);
            scope("attn1", || record("k", &t));
            record("q", &t);
            record_with("probs", || Ok(t.clone()));
        });
        let names: Vec<&str> = stages.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["q", "attn1/k", "q#2", "probs"]);
        assert!(!enabled());
        record("v", &t);
        let ((), again) = with_trace(|| ());
        assert!(again.is_empty());
    }

    /// Renamed stages are recorded under their new names (numbered by them), the others left out.
    #[test]
    fn renaming_records_under_the_new_names() {
        let t = Tensor::zeros(3, candle_core::DType::F32, &Device::Cpu).unwrap();
        let ((), stages) = with_trace(|| {
            renaming(
                |n| n.strip_prefix("a/").map(|r| format!("b/{r}")),
                || {
                    scope("a", || record("q", &t));
                    record("k", &t);
                    scope("a", || record("q", &t));
                },
            );
            record("k", &t);
        });
        let names: Vec<&str> = stages.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["b/q", "b/q#2", "k"]);
    }

    /// A filtered trace holds only the stages kept, numbers them as an unfiltered one would, never
    /// forms the others, and names them.
    #[test]
    fn a_filtered_trace_keeps_only_what_it_is_asked_for() {
        let t = Tensor::zeros(3, candle_core::DType::F32, &Device::Cpu).unwrap();
        let ((), kept, left_out) = with_trace_keeping(
            |name| name == "q#2" || name == "attn1/k",
            || {
                record("q", &t);
                scope("attn1", || record("k", &t));
                record("q", &t);
                record_with("probs", || panic!("a stage left out is never formed"));
            },
        );
        let names: Vec<&str> = kept.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["attn1/k", "q#2"]);
        assert_eq!(left_out, ["q", "probs"]);
        // The filter ends with the trace.
        let ((), all) = with_trace(|| record("q", &t));
        assert_eq!(all.len(), 1);
    }
}
