//! Big files under a 4 GiB address-space limit (issue 20): safetensors files are read by their
//! header and by the tensors asked for, never whole nor mapped, and a weight of the wrong shape
//! is refused before a byte of it is read; `show` draws a bounded picture of any bundle.
//!
//! The big files are sparse (a header, then a hole): gigabytes that take no disk. Each check runs
//! in a child process under `ulimit -v` ([`crate::common::run_limited`]), so reading one of those
//! tensors whole would fail the test (before: an abort, exit 134, or "out of memory").

use crate::common::{run_limited, scratch, weights, RawBundle};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// A tensor of a file being written: name, dtype, shape, and its bytes (`None`: a hole of the
/// size the dtype and shape need).
type Entry = (String, &'static str, Vec<usize>, Option<Vec<u8>>);

fn size_of(dtype: &str) -> usize {
    match dtype {
        "F64" | "I64" => 8,
        "F32" | "I32" => 4,
        "F16" | "BF16" => 2,
        _ => 1,
    }
}

/// A safetensors file whose `None` tensors are holes (sparse), laid out in the given order.
fn sparse_safetensors(path: &Path, metadata: &HashMap<String, String>, entries: &[Entry]) {
    use std::io::Write;
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!(metadata));
    let mut offset = 0usize;
    for (name, dtype, shape, _) in entries {
        let n = shape.iter().product::<usize>() * size_of(dtype);
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}),
        );
        offset += n;
    }
    let mut text = serde_json::to_string(&header).unwrap();
    while !text.len().is_multiple_of(8) {
        text.push(' ');
    }
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(&(text.len() as u64).to_le_bytes()).unwrap();
    f.write_all(text.as_bytes()).unwrap();
    let start = 8 + text.len() as u64;
    let mut at = 0u64;
    for (_, dtype, shape, bytes) in entries {
        if let Some(bytes) = bytes {
            use std::io::{Seek, SeekFrom};
            f.seek(SeekFrom::Start(start + at)).unwrap();
            f.write_all(bytes).unwrap();
        }
        at += (shape.iter().product::<usize>() * size_of(dtype)) as u64;
    }
    f.set_len(start + at).unwrap();
}

/// The committed diffusers UNet2DModel checkpoint with `big` replaced by a 3 GB hole of shape
/// [750,000,000] (placed last).
fn unet_with_a_3gb(dir: &Path, big: &str) -> PathBuf {
    let src = weights().join("models/diffusers_unet2d/diffusion_pytorch_model.safetensors");
    let bytes = std::fs::read(&src).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let mut entries: Vec<Entry> = st
        .tensors()
        .into_iter()
        .filter(|(name, _)| name != big)
        .map(|(name, view)| {
            let dtype = match view.dtype() {
                safetensors::Dtype::F32 => "F32",
                other => panic!("{other:?}"),
            };
            (name, dtype, view.shape().to_vec(), Some(view.data().to_vec()))
        })
        .collect();
    assert!(entries.len() + 1 == st.len(), "{big} is in the checkpoint");
    entries.push((big.to_string(), "F32", vec![750_000_000], None));
    let path = dir.join(format!("{big}.safetensors"));
    sparse_safetensors(&path, &meta.metadata().clone().unwrap_or_default(), &entries);
    assert!(std::fs::metadata(&path).unwrap().len() > 3_000_000_000);
    path
}

/// A 3 GB weight of the wrong shape, asked for by exact shape (a norm) and by layout (a
/// projection, `(out, in)` or 1×1 conv): refused by its shape, not read.
#[test]
fn a_wrong_3gb_weight_is_refused_before_it_is_read() {
    let dir = scratch("limits-shape");
    let bundle = weights().join("mid/unet_mid_block_2d_unet2d_ref.safetensors");
    for (big, needle) in [
        (
            "mid_block.resnets.0.norm1.weight",
            "weight `resnets.0.norm1.weight` has the wrong shape",
        ),
        (
            "mid_block.attentions.0.to_q.weight",
            "`attentions.0.to_q.weight` has shape [750000000]",
        ),
    ] {
        let ck = unet_with_a_3gb(&dir, big);
        let args = [
            "check",
            bundle.to_str().unwrap(),
            "--weights",
            ck.to_str().unwrap(),
            "--prefix",
            "mid_block.",
        ];
        let c = run_limited(&args, &[]);
        assert_eq!(c.code, 2, "{big}: {}", c.err);
        assert!(c.err.contains(needle) && c.err.lines().count() == 1, "{big}: {}", c.err);
        assert!(c.err.contains("750000000"), "{}", c.err);
        std::fs::remove_file(ck).unwrap();
    }
}

/// `inspect` on a 5 GB file lists its header (it used to read the whole file).
#[test]
fn inspect_reads_only_the_header_of_a_5gb_file() {
    let dir = scratch("limits-inspect");
    let path = dir.join("big.safetensors");
    let meta = HashMap::from([("note".to_string(), "five gigabytes".to_string())]);
    sparse_safetensors(&path, &meta, &[("x".into(), "F32", vec![1_250_000_000], None)]);
    let c = run_limited(&["inspect", path.to_str().unwrap()], &[]);
    assert_eq!(c.code, 0, "{}", c.err);
    assert!(
        c.out.contains("five gigabytes") && c.out.contains("[1250000000]"),
        "{}",
        c.out
    );
}

/// A bundle whose stage trace holds 3 GB: `check` (without `--trace`) never reads it.
#[test]
fn check_leaves_a_3gb_stage_trace_on_the_disk() {
    let dir = scratch("limits-trace");
    let raw = RawBundle::read(&weights().join("textbook/self_attention_dx6_d5_dv7.safetensors"));
    // The float32 stages' float64 deltas (bfloat16) are left out: the bundle's traces are
    // optional to `check`, and this test is about one huge stage.
    let mut entries: Vec<Entry> = raw
        .tensors
        .iter()
        .filter(|(_, t)| t.dtype() != candle_core::DType::BF16)
        .map(|(name, t)| {
            let (dtype, bytes) = match t.dtype() {
                candle_core::DType::F32 => (
                    "F32",
                    t.flatten_all()
                        .unwrap()
                        .to_vec1::<f32>()
                        .unwrap()
                        .iter()
                        .flat_map(|v| v.to_le_bytes())
                        .collect(),
                ),
                candle_core::DType::F64 => (
                    "F64",
                    t.flatten_all()
                        .unwrap()
                        .to_vec1::<f64>()
                        .unwrap()
                        .iter()
                        .flat_map(|v| v.to_le_bytes())
                        .collect::<Vec<u8>>(),
                ),
                other => panic!("{other:?}"),
            };
            (name.clone(), dtype, t.dims().to_vec(), Some(bytes))
        })
        .collect();
    entries.push(("parity.trace.huge".into(), "F32", vec![750_000_000], None));
    let path = dir.join("big_trace.safetensors");
    sparse_safetensors(&path, &raw.metadata, &entries);
    let c = run_limited(&["check", path.to_str().unwrap()], &[]);
    assert_eq!(c.code, 0, "{}{}", c.out, c.err);
    assert!(c.out.contains("1 passed, 0 failed"), "{}", c.out);
}

/// `show` on 250,000 batch items of 1×1 pixels draws the first 16 and says so (it used to
/// allocate a picture 250,000 panels wide, 5 GB).
#[test]
fn show_draws_a_bounded_picture_of_250k_batch_items() {
    let dir = scratch("limits-show");
    let b = 250_000usize;
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let meta = HashMap::from([
        ("parity.format".to_string(), "1".to_string()),
        ("parity.block".into(), "annotated_diffusion.Attention".into()),
        (
            "parity.config".into(),
            r#"{"dim": 1, "heads": 1, "dim_head": 1}"#.into(),
        ),
        ("parity.dtype".into(), "float32".into()),
    ]);
    let entries: Vec<Entry> = vec![
        (
            "to_qkv.weight".into(),
            "F32",
            vec![3, 1, 1, 1],
            Some(f32s(&[0.5, 0.25, 1.0])),
        ),
        ("to_out.weight".into(), "F32", vec![1, 1, 1, 1], Some(f32s(&[1.0]))),
        ("to_out.bias".into(), "F32", vec![1], Some(f32s(&[0.0]))),
        (
            "parity.input.x".into(),
            "F32",
            vec![b, 1, 1, 1],
            Some(f32s(&vec![1.0; b])),
        ),
        (
            "parity.output.out".into(),
            "F32",
            vec![b, 1, 1, 1],
            Some(f32s(&vec![1.0; b])),
        ),
    ];
    let path = dir.join("many.safetensors");
    sparse_safetensors(&path, &meta, &entries);
    let out = dir.join("pictures");
    let c = run_limited(&["show", path.to_str().unwrap(), "--out", out.to_str().unwrap()], &[]);
    assert_eq!(c.code, 0, "{}", c.err);
    assert!(c.out.contains("batch items 0-15 of 250000 drawn"), "{}", c.out);
    let (w, h, _) = crate::common::read_png(&out.join("output_error.png"));
    assert!(w < 2000 && h < 2000, "{w}×{h}");
}

// ---- Issue 32, item 4: memory known before it is spent ----

/// `torch.nn.MultiheadAttention` with `need_weights` at L = S = `l` tokens, batch first, one head
/// of width 8: a 1 GB bundle at 16,384 tokens (its weights output), every tensor a hole.
fn mha_with_weights(dir: &Path, l: usize) -> PathBuf {
    let meta = HashMap::from([
        ("parity.format".to_string(), "1".to_string()),
        ("parity.block".into(), "torch.nn.MultiheadAttention".into()),
        (
            "parity.config".into(),
            r#"{"embed_dim": 8, "num_heads": 1, "batch_first": true}"#.into(),
        ),
        ("parity.dtype".into(), "float32".into()),
        ("parity.inputs".into(), r#"["query"]"#.into()),
        ("parity.outputs".into(), r#"["attn_output", "attn_weights"]"#.into()),
        ("parity.kwargs".into(), r#"{"need_weights": true}"#.into()),
    ]);
    let entries: Vec<Entry> = vec![
        ("in_proj_weight".into(), "F32", vec![24, 8], None),
        ("in_proj_bias".into(), "F32", vec![24], None),
        ("out_proj.weight".into(), "F32", vec![8, 8], None),
        ("out_proj.bias".into(), "F32", vec![8], None),
        ("parity.input.query".into(), "F32", vec![1, l, 8], None),
        ("parity.output.attn_output".into(), "F32", vec![1, l, 8], None),
        ("parity.output.attn_weights".into(), "F32", vec![1, l, l], None),
    ];
    let path = dir.join(format!("mha_{l}.safetensors"));
    sparse_safetensors(&path, &meta, &entries);
    path
}

/// The one refusal line of a bundle too big for the memory.
pub(crate) fn assert_refused(c: &crate::common::Child, file: &str, limit_from: &str) {
    assert_eq!(c.code, 2, "{}{}", c.out, c.err);
    let errors: Vec<&str> = c.err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{}", c.err);
    let e = errors[0];
    assert!(
        e.contains(file) && e.contains("of memory") && e.contains("more than the limit") && e.contains(limit_from),
        "{e}"
    );
    assert!(!c.err.contains("memory allocation"), "{}", c.err);
    assert!(c.took.as_secs() < 10, "{:?}", c.took);
}

/// MHA with `need_weights` at 16,384 tokens needs the whole (1, 1, L, S) score matrix three times
/// over: refused under 4 GiB from its header, in one line (it aborted: "memory allocation of
/// 2147483648 bytes failed", exit 134), also with `--max-memory 8G` (the address space left still
/// bounds it) and under a lower `--max-memory`.
#[test]
fn mha_with_weights_at_16k_tokens_is_refused_before_it_runs() {
    let dir = scratch("limits-mha");
    let path = mha_with_weights(&dir, 16_384);
    let file = path.to_str().unwrap();
    assert_refused(&run_limited(&["check", file], &[]), "mha_16384", "ulimit -v");
    assert_refused(
        &run_limited(&["check", file, "--max-memory", "8G"], &[]),
        "mha_16384",
        "ulimit -v",
    );
    assert_refused(
        &run_limited(&["check", file, "--max-memory", "1G"], &[]),
        "mha_16384",
        "--max-memory",
    );
    let pictures = dir.join("pictures");
    let c = run_limited(&["show", file, "--out", pictures.to_str().unwrap()], &[]);
    assert_refused(&c, "mha_16384", "ulimit -v");
}

/// A 940 MB textbook bundle (`x` of 2 × 7,300,000 × 8, its output and float64 twin): refused
/// under 4 GiB (it aborted).
#[test]
fn a_940mb_textbook_bundle_is_refused_under_4gib() {
    let dir = scratch("limits-textbook");
    let n = 7_300_000;
    let meta = HashMap::from([
        ("parity.format".to_string(), "1".to_string()),
        ("parity.block".into(), "textbook.SelfAttention".into()),
        ("parity.config".into(), r#"{"Dx": 8, "D": 8, "Dv": 8}"#.into()),
        ("parity.dtype".into(), "float32".into()),
    ]);
    let mut entries: Vec<Entry> = vec![];
    for p in ["q", "k", "v"] {
        entries.push((format!("{p}.weight"), "F32", vec![8, 8], None));
        entries.push((format!("{p}.bias"), "F32", vec![8], None));
    }
    entries.push(("parity.input.x".into(), "F32", vec![2, n, 8], None));
    entries.push(("parity.output.output".into(), "F32", vec![2, n, 8], None));
    entries.push(("parity.output.output.float64".into(), "F64", vec![2, n, 8], None));
    let path = dir.join("textbook_940mb.safetensors");
    sparse_safetensors(&path, &meta, &entries);
    assert!(std::fs::metadata(&path).unwrap().len() > 900_000_000);
    assert_refused(
        &run_limited(&["check", path.to_str().unwrap()], &[]),
        "textbook_940mb",
        "ulimit -v",
    );
}

/// Small bundles pass under the default limit; `--max-memory` below their estimate refuses them.
#[test]
fn max_memory_sets_the_limit() {
    let textbook = weights().join("textbook/self_attention_dx6_d5_dv7.safetensors");
    let file = textbook.to_str().unwrap();
    let c = run_limited(&["check", file], &[]);
    assert_eq!(c.code, 0, "{}{}", c.out, c.err);
    assert_refused(
        &run_limited(&["check", file, "--max-memory", "1M"], &[]),
        "self_attention",
        "--max-memory",
    );
    let c = run_limited(&["check", file, "--max-memory", "lots"], &[]);
    assert_eq!(c.code, 2, "{}", c.err);
    assert!(c.err.contains("expected a size"), "{}", c.err);
    // The largest limit there is (2^64 - 1 bytes) is a limit; one byte more says why it is not.
    let c = run_limited(&["check", file, "--max-memory", "18446744073709551615"], &[]);
    assert_eq!(c.code, 0, "{}{}", c.out, c.err);
    let c = run_limited(&["check", file, "--max-memory", "18446744073709551616"], &[]);
    assert_eq!(c.code, 2, "{}", c.err);
    assert!(c.err.contains("more than 2^64 - 1 bytes"), "{}", c.err);
}

// ---- Issue 32, item 6: the thread count capped by the machine ----

/// `RAYON_NUM_THREADS=100000` under 4 GiB: the pools could not be built (a rayon panic reported
/// as an internal error for every bundle); capped to the CPUs, with a note.
#[test]
fn a_huge_thread_count_is_capped_by_the_machine() {
    let folder = weights().join("textbook");
    for var in ["RAYON_NUM_THREADS", "CANDLE_NUM_THREADS"] {
        let c = run_limited(&["check", folder.to_str().unwrap()], &[(var, "100000")]);
        assert_eq!(c.code, 0, "{var}: {}{}", c.out, c.err);
        assert!(c.out.contains("8 passed, 0 failed"), "{}", c.out);
        assert!(
            c.err.contains(&format!("note: {var}=100000 is more than the")),
            "{}",
            c.err
        );
        assert!(!c.err.contains("internal error"), "{}", c.err);
    }
}

// ---- Issue 45, item 1: the estimate knows --trace, show and the reference attention ----

/// The tensors of `raw` that `keep` keeps, as entries of a sparse file (f32 and f64 only).
fn entries_of(raw: &RawBundle, keep: impl Fn(&str, &candle_core::Tensor) -> bool) -> Vec<Entry> {
    raw.tensors
        .iter()
        .filter(|(name, t)| keep(name, t))
        .map(|(name, t)| {
            let t64 = t.to_dtype(candle_core::DType::F64).unwrap();
            let values = t64.flatten_all().unwrap().to_vec1::<f64>().unwrap();
            let (dtype, bytes): (&'static str, Vec<u8>) = match t.dtype() {
                candle_core::DType::F32 => ("F32", values.iter().flat_map(|v| (*v as f32).to_le_bytes()).collect()),
                candle_core::DType::F64 => ("F64", values.iter().flat_map(|v| v.to_le_bytes()).collect()),
                other => panic!("{other:?}"),
            };
            (name.clone(), dtype, t.dims().to_vec(), Some(bytes))
        })
        .collect()
}

/// The textbook bundle with its stage `q` a bfloat16 hole of (1, 1,200,000, 160) (384 MB; the
/// issue's GEGLU stages): `check --trace` and `show` compare it in float64 copies (and hold our
/// own stage), so both are refused from the header under 4 GiB, in one line, where they aborted
/// ("memory allocation of 1536000000 bytes failed"); a plain `check` leaves the stages on the disk
/// and passes.
#[test]
fn trace_and_show_count_the_stage_copies() {
    let dir = scratch("limits-stage-copies");
    let raw = RawBundle::read(&weights().join("textbook/self_attention_dx6_d5_dv7.safetensors"));
    let mut entries = entries_of(&raw, |name, t| {
        t.dtype() != candle_core::DType::BF16 && name != "parity.trace.q"
    });
    entries.push(("parity.trace.q".into(), "BF16", vec![1, 1_200_000, 160], None));
    let path = dir.join("big_stage.safetensors");
    sparse_safetensors(&path, &raw.metadata, &entries);
    let file = path.to_str().unwrap();
    let c = run_limited(&["check", file], &[]);
    assert_eq!(c.code, 0, "{}{}", c.out, c.err);
    let c = run_limited(&["check", file, "--trace"], &[]);
    assert_refused(&c, "big_stage", "ulimit -v");
    assert!(c.err.contains("stage comparison"), "{}", c.err);
    let pictures = dir.join("pictures");
    let c = run_limited(&["show", file, "--out", pictures.to_str().unwrap()], &[]);
    assert_refused(&c, "big_stage", "ulimit -v");
}

/// The VAE attention bundle at 181 × 181 = 32,761 tokens (4 MB of input): the default path never
/// forms the score matrix, `UNET_ATTENTION_SDPA=reference` forms all 4.3 GB of it, so the estimate
/// refuses that run from the header (it aborted in 0.2 s).
#[test]
fn the_reference_attention_path_counts_its_score_matrix() {
    let dir = scratch("limits-reference");
    let raw = RawBundle::read(&weights().join("diffusers/attention_vae_mid.safetensors"));
    let c = raw.tensors["parity.input.hidden_states"].dims()[1];
    let mut entries = entries_of(&raw, |name, _| !name.starts_with("parity."));
    for name in ["parity.input.hidden_states", "parity.output.output"] {
        entries.push((name.into(), "F32", vec![1, c, 181, 181], None));
    }
    let mut meta = raw.metadata.clone();
    meta.remove("parity.trace");
    let path = dir.join("vae_32761_tokens.safetensors");
    sparse_safetensors(&path, &meta, &entries);
    let c = run_limited(
        &["check", path.to_str().unwrap()],
        &[("UNET_ATTENTION_SDPA", "reference")],
    );
    assert_refused(&c, "vae_32761_tokens", "ulimit -v");
    assert!(c.err.contains("attention scores"), "{}", c.err);
}
