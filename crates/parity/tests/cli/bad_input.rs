//! Bad input gets a one-line error naming what is wrong and exit code 2, never a panic.

use crate::common::*;
use std::path::Path;

/// Check `path` and expect exit code 2 with an error line containing every `needle`: one line
/// per bundle on stderr (no panic message, no backtrace), an ERROR row and no result rows.
fn expect_unusable(path: &Path, needles: &[&str]) {
    let (code, out, err) = cli(&["check", path.to_str().unwrap()]);
    assert_eq!(code, 2, "stdout:\n{out}\nstderr:\n{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_else(|| panic!("no error line in {err:?}"));
    for needle in needles {
        assert!(line.contains(needle), "{needle:?} not in {line:?}");
    }
    assert!(
        err.lines().all(|l| l.starts_with("error:") || l.starts_with("note:")),
        "stray stderr lines: {err:?}"
    );
    assert!(!out.contains("PASS") && !out.contains("FAIL"), "partial output: {out}");
}

/// A safetensors file from a header (JSON text) and a data section, with the correct length prefix.
fn raw_file(header: &str, data: &[u8]) -> Vec<u8> {
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    bytes
}

/// The committed bundle `rel` with its JSON header edited by `edit` (data section unchanged),
/// written to `dir/name`.
fn edit_header(rel: &str, dir: &Path, name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> std::path::PathBuf {
    let bytes = std::fs::read(weights().join(rel)).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    edit(&mut header);
    let path = dir.join(name);
    std::fs::write(&path, raw_file(&header.to_string(), &bytes[8 + n..])).unwrap();
    path
}

const VAE: &str = "diffusers/attention_vae_mid.safetensors";

#[test]
fn missing_weight_names_the_key_and_the_block() {
    let dir = scratch("missing");
    let p = RawBundle::edited(VAE, &dir, |b| {
        b.tensors.remove("to_v.bias");
    });
    expect_unusable(
        &p,
        &[
            "to_v.bias",
            "missing",
            "attention_vae_mid.safetensors",
            "diffusers.Attention",
        ],
    );
}

#[test]
fn shape_mismatch_says_expected_and_found() {
    let dir = scratch("shape");
    let p = RawBundle::edited(VAE, &dir, |b| {
        let w = b.tensors["to_q.weight"].narrow(0, 0, 16).unwrap();
        b.tensors.insert("to_q.weight".into(), w);
    });
    expect_unusable(&p, &["to_q.weight", "[16, 32]", "expected", "diffusers.Attention"]);
}

#[test]
fn unknown_block_lists_the_known_ones() {
    let dir = scratch("block");
    let p = RawBundle::edited(VAE, &dir, |b| {
        b.metadata.insert("parity.block".into(), "diffusers.Atention".into());
    });
    expect_unusable(
        &p,
        &[
            "diffusers.Atention",
            "known blocks",
            "diffusers.Attention",
            "torch.nn.MultiheadAttention",
        ],
    );
}

#[test]
fn unknown_config_key_is_named() {
    let dir = scratch("config-key");
    let p = RawBundle::edited(
        "denoising_diffusion_pytorch/attention_dim24_h3_d8_mem4.safetensors",
        &dir,
        |b| {
            b.metadata.insert(
                "parity.config".into(),
                r#"{"dim": 24, "heads": 3, "dim_head": 8, "num_mem_kv": 4, "head_dim": 8}"#.into(),
            );
        },
    );
    expect_unusable(&p, &["head_dim", "unknown field"]);
}

#[test]
fn config_of_the_wrong_json_type_is_an_error() {
    let dir = scratch("config-type");
    let p = RawBundle::edited("ldm/linear_attention_dim24_h3_d8.safetensors", &dir, |b| {
        b.metadata.insert("parity.config".into(), r#"{"dim": "24"}"#.into());
    });
    expect_unusable(&p, &["invalid config", "dim"]);
    let p = RawBundle::edited("ldm/linear_attention_dim24_h3_d8.safetensors", &dir, |b| {
        b.metadata.insert("parity.config".into(), "[24]".into());
    });
    expect_unusable(&p, &["parity.config", "JSON object"]);
}

#[test]
fn heads_not_dividing_channels_is_an_error() {
    let dir = scratch("heads");
    let p = RawBundle::edited("fastai/self_attention_multihead_ni24_h4.safetensors", &dir, |b| {
        b.metadata
            .insert("parity.config".into(), r#"{"ni": 24, "nheads": 5}"#.into());
    });
    expect_unusable(&p, &["5", "24"]);
    let p = RawBundle::edited(VAE, &dir, |b| {
        let mut cfg: serde_json::Value = serde_json::from_str(&b.metadata["parity.config"]).unwrap();
        cfg["norm_num_groups"] = 5.into();
        b.metadata.insert("parity.config".into(), cfg.to_string());
    });
    expect_unusable(&p, &["5 norm groups do not divide 32 channels"]);
}

#[test]
fn truncated_and_foreign_files_are_rejected() {
    let dir = scratch("truncated");
    let bytes = std::fs::read(weights().join(VAE)).unwrap();
    let cases: [(&str, &[u8]); 4] = [
        ("truncated.safetensors", &bytes[..bytes.len() / 2]),
        ("header-only.safetensors", &bytes[..6]),
        ("empty.safetensors", b""),
        ("text.safetensors", b"this is not a safetensors file at all"),
    ];
    for (name, content) in cases {
        let p = dir.join(name);
        std::fs::write(&p, content).unwrap();
        expect_unusable(&p, &[name, "not a valid safetensors file"]);
    }
}

#[test]
fn a_bundle_without_inputs_or_outputs_is_rejected() {
    let dir = scratch("no-io");
    let p = RawBundle::edited(VAE, &dir, |b| {
        b.tensors.retain(|k, _| !k.starts_with("parity.input."));
        b.metadata.remove("parity.inputs");
    });
    expect_unusable(&p, &["no inputs"]);
    let p = RawBundle::edited(VAE, &dir, |b| {
        b.tensors.retain(|k, _| !k.starts_with("parity.output."));
        b.metadata.remove("parity.outputs");
    });
    expect_unusable(&p, &["no outputs"]);
    let p = RawBundle::edited(VAE, &dir, |b| {
        b.tensors.remove("parity.input.hidden_states");
    });
    expect_unusable(&p, &["parity.input.hidden_states", "missing"]);
}

#[test]
fn wrong_format_version_and_missing_metadata() {
    let dir = scratch("format");
    let p = RawBundle::edited(VAE, &dir, |b| {
        b.metadata.insert("parity.format".into(), "2".into());
    });
    expect_unusable(&p, &["parity.format", "\"2\""]);
    let p = RawBundle::edited(VAE, &dir, |b| {
        b.metadata.remove("parity.block");
    });
    expect_unusable(&p, &["parity.block", "missing"]);
}

#[test]
fn unused_weights_are_an_error_unless_allowed() {
    let dir = scratch("unused");
    let p = RawBundle::edited(VAE, &dir, |b| {
        let w = b.tensors["to_q.weight"].clone();
        b.tensors.insert("to_qq.weight".into(), w);
    });
    expect_unusable(&p, &["to_qq.weight", "not used", "to_q.weight", "--allow-unused"]);
    let (code, out, _) = cli(&["check", "--allow-unused", p.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
}

#[test]
fn unknown_input_name_and_wrong_rank() {
    let dir = scratch("inputs");
    let p = RawBundle::edited("ldm/linear_attention_dim24_h3_d8.safetensors", &dir, |b| {
        let x = b.tensors.remove("parity.input.x").unwrap();
        b.tensors.insert("parity.input.hidden_states".into(), x);
        b.metadata.insert("parity.inputs".into(), r#"["hidden_states"]"#.into());
    });
    expect_unusable(&p, &["hidden_states", "expected some of: x"]);
    let p = RawBundle::edited("ldm/linear_attention_dim24_h3_d8.safetensors", &dir, |b| {
        let x = b.tensors["parity.input.x"].flatten_from(2).unwrap();
        b.tensors.insert("parity.input.x".into(), x);
    });
    expect_unusable(&p, &["x", "rank"]);
}

#[test]
fn folders_without_bundles_and_missing_paths() {
    let dir = scratch("empty-dir");
    expect_unusable(&dir, &["no parity bundles"]);
    expect_unusable(&dir.join("nope.safetensors"), &["nope.safetensors", "cannot read"]);
}

#[test]
fn bad_command_lines_exit_2() {
    let (code, _, err) = cli(&["check"]);
    assert_eq!(code, 2, "{err}");
    let (code, _, _) = cli(&["frobnicate"]);
    assert_eq!(code, 2);
    let (code, _, _) = cli(&["check", "--dtype", "f8", "weights"]);
    assert_eq!(code, 2);
}

#[test]
fn one_bad_bundle_among_good_ones_still_exits_2_and_reports_the_rest() {
    let dir = scratch("mixed");
    std::fs::copy(weights().join(VAE), dir.join("good.safetensors")).unwrap();
    std::fs::write(dir.join("bad.safetensors"), b"garbage").unwrap();
    let (code, out, err) = cli(&["check", dir.to_str().unwrap()]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        out.contains("PASS") && out.contains("ERROR") && out.contains("1 passed, 0 failed, 1 unusable"),
        "{out}"
    );
}

#[test]
fn broken_safetensors_headers_are_rejected() {
    let dir = scratch("headers");
    let good = std::fs::read(weights().join(VAE)).unwrap();
    let n = u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    let with_prefix = |len: u64| {
        let mut b = len.to_le_bytes().to_vec();
        b.extend_from_slice(&good[8..]);
        b
    };
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        // The length prefix is whole but the header stops halfway.
        (
            "truncated-header.safetensors",
            good[..8 + n / 2].to_vec(),
            "invalid header length",
        ),
        // The prefix claims more bytes than the file has.
        (
            "beyond-file.safetensors",
            with_prefix(good.len() as u64),
            "invalid header length",
        ),
        ("huge-length.safetensors", with_prefix(u64::MAX), "header too large"),
        (
            "not-json.safetensors",
            raw_file("hello, world", b""),
            "invalid JSON in header",
        ),
        (
            "not-utf8.safetensors",
            [&1u64.to_le_bytes()[..], &[0xff]].concat(),
            "invalid UTF-8",
        ),
        (
            "json-array.safetensors",
            raw_file("[1, 2, 3]", b""),
            "invalid JSON in header",
        ),
        ("header-too-small.safetensors", good[..7].to_vec(), "header too small"),
    ];
    for (name, bytes, why) in cases {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        expect_unusable(&p, &[name, "not a valid safetensors file", why]);
    }
}

#[test]
fn tensor_offsets_out_of_range_or_overlapping_are_rejected() {
    let dir = scratch("offsets");
    let two = |a: [u64; 2], b: [u64; 2], data: usize| {
        let header = format!(
            r#"{{"a":{{"dtype":"F32","shape":[2],"data_offsets":{a:?}}},"b":{{"dtype":"F32","shape":[2],"data_offsets":{b:?}}}}}"#
        );
        raw_file(&header, &vec![0u8; data])
    };
    let cases = [
        (
            "beyond-data.safetensors",
            two([0, 8], [8, 16], 12),
            "incomplete metadata",
        ),
        ("end-far-out.safetensors", two([0, 8], [8, u64::MAX], 16), "invalid"),
        (
            "overlapping.safetensors",
            two([0, 8], [4, 12], 12),
            "invalid offset for tensor",
        ),
        (
            "size-mismatch.safetensors",
            two([0, 8], [8, 20], 20),
            "invalid shape, data type, or offset",
        ),
    ];
    for (name, bytes, why) in cases {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        expect_unusable(&p, &[name, "not a valid safetensors file", why]);
    }
}

#[test]
fn shape_product_overflow_is_rejected() {
    let dir = scratch("overflow");
    let header = r#"{"a":{"dtype":"F32","shape":[4294967296,4294967296,2],"data_offsets":[0,8]}}"#;
    let p = dir.join("overflow.safetensors");
    std::fs::write(&p, raw_file(header, &[0; 8])).unwrap();
    expect_unusable(&p, &["overflow.safetensors", "overflow computing buffer size"]);
    // In a real bundle, too: a weight whose dims multiply past usize.
    let p = edit_header(VAE, &dir, "overflow-weight.safetensors", |h| {
        h["to_q.weight"]["shape"] = serde_json::json!([u64::MAX, 2]);
    });
    expect_unusable(&p, &["overflow computing buffer size"]);
}

#[test]
fn unsupported_and_wrong_dtypes_are_rejected() {
    let dir = scratch("dtypes");
    // F8 parses as safetensors but no block takes it (same bytes: 4096 f32 bytes = 4096 f8).
    let p = edit_header(VAE, &dir, "f8.safetensors", |h| {
        h["to_q.weight"]["dtype"] = "F8_E4M3".into();
        h["to_q.weight"]["shape"] = serde_json::json!([128, 32]);
    });
    expect_unusable(&p, &["to_q.weight", "F8_E4M3", "cannot read"]);
    // A dtype name safetensors does not know at all.
    let p = edit_header(VAE, &dir, "string.safetensors", |h| {
        h["to_q.weight"]["dtype"] = "STRING".into();
    });
    expect_unusable(&p, &["not a valid safetensors file", "STRING"]);
    // An integer weight where the block needs a float one.
    let p = RawBundle::edited(VAE, &dir, |b| {
        let w = b.tensors["to_q.weight"].to_dtype(candle_core::DType::I32).unwrap();
        b.tensors.insert("to_q.weight".into(), w);
    });
    expect_unusable(&p, &["to_q.weight", "i32", "floating-point"]);
    // An integer input that is not a mask.
    let p = RawBundle::edited(VAE, &dir, |b| {
        let x = b.tensors["parity.input.hidden_states"]
            .to_dtype(candle_core::DType::I64)
            .unwrap();
        b.tensors.insert("parity.input.hidden_states".into(), x);
    });
    expect_unusable(&p, &["hidden_states", "i64", "only masks"]);
}

#[test]
fn non_finite_weights_and_inputs_are_named_with_counts() {
    let dir = scratch("non-finite");
    let p = RawBundle::edited(VAE, &dir, |b| {
        let w = b.tensors["to_k.weight"].clone();
        let mut v = w.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        v[0] = f32::NAN;
        v[5] = f32::NAN;
        v[7] = f32::INFINITY;
        let w = candle_core::Tensor::from_vec(v, w.dims(), w.device()).unwrap();
        b.tensors.insert("to_k.weight".into(), w);
    });
    expect_unusable(&p, &["non-finite", "weight `to_k.weight` has 2 NaN, 1 +inf"]);
    let p = RawBundle::edited(VAE, &dir, |b| {
        let x = &b.tensors["parity.input.hidden_states"];
        let x = (x / 0.0).unwrap(); // every element ±inf (or NaN for zeros)
        b.tensors.insert("parity.input.hidden_states".into(), x);
    });
    expect_unusable(&p, &["non-finite", "input `parity.input.hidden_states` has"]);
}

#[test]
fn minus_inf_in_a_float_mask_is_accepted() {
    // An additive float mask uses -inf for "never attend": not an unusable input.
    let dir = scratch("mask-inf");
    let rel = "torch/mha_bias_kv_zero_attn_float_mask.safetensors";
    let p = RawBundle::edited(rel, &dir, |b| {
        let m = &b.tensors["parity.input.attn_mask"];
        let mut v = m.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        v[0] = f32::NEG_INFINITY;
        let m = candle_core::Tensor::from_vec(v, m.dims(), m.device()).unwrap();
        b.tensors.insert("parity.input.attn_mask".into(), m);
    });
    let (code, out, err) = cli(&["check", p.to_str().unwrap()]);
    assert!(code == 0 || code == 1, "{out}{err}");
}

#[test]
fn folders_special_files_and_unreadable_files() {
    let dir = scratch("special");
    // A folder where a file is expected.
    let sub = dir.join("folder.safetensors");
    std::fs::create_dir_all(&sub).unwrap();
    let (code, _, err) = cli(&["inspect", sub.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.starts_with("error:") && err.contains("a folder") && err.lines().count() == 1,
        "{err}"
    );
    // A FIFO must be refused, not read (reading one would block forever).
    let fifo = dir.join("pipe.safetensors");
    if std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .is_ok_and(|s| s.success())
    {
        expect_unusable(&fifo, &["pipe.safetensors", "not a regular file"]);
    } else {
        println!("note: mkfifo is not available; the FIFO case was skipped");
    }
    // chmod 000: root reads it anyway, so the case only runs where permissions are enforced.
    let locked = dir.join("locked.safetensors");
    std::fs::copy(weights().join(VAE), &locked).unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
        if std::fs::read(&locked).is_ok() {
            println!(
                "note: running with permission to read a chmod 000 file (root?); the unreadable-file case was skipped"
            );
        } else {
            expect_unusable(&locked, &["locked.safetensors", "cannot read", "ermission denied"]);
        }
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
}

#[test]
fn pytorch_pickle_checkpoints_are_named_as_such() {
    let dir = scratch("pickle");
    // `torch.save` writes a zip archive since 1.6; older ones and `pickle.dump` start with 0x80 <protocol>.
    let cases: [(&str, &[u8]); 3] = [
        ("model.pt", b"PK\x03\x04\x00\x00\x08\x08archive/data.pkl"),
        ("model.ckpt", b"\x80\x02\x8a\x0alz\xfc\x9cF\xf9 j\xa8P\x19."),
        ("state.pth", b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00}\x94."),
    ];
    for (name, bytes) in cases {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        expect_unusable(
            &p,
            &[name, "not safetensors", "torch.save", "never unpickled", "--weights"],
        );
    }
}

#[test]
fn control_characters_never_break_the_one_line_error() {
    let dir = scratch("control");
    let p = RawBundle::edited(VAE, &dir, |b| {
        b.metadata.insert("parity.block".into(), "evil\nblock\r\x1b[31m".into());
    });
    expect_unusable(&p, &["evil\\nblock\\r\\u{1b}[31m", "unknown block id"]);
    let (_, _, err) = cli(&["check", p.to_str().unwrap()]);
    assert_eq!(err.lines().count(), 1, "{err:?}");
}

#[test]
fn huge_config_integers_are_refused_before_anything_is_allocated() {
    // A depth of 2^33 once made SpatialTransformer::new allocate 128 GiB and abort.
    let dir = scratch("huge-config");
    let p = RawBundle::edited("ldm/spatial_transformer_sd1.safetensors", &dir, |b| {
        let mut cfg: serde_json::Value = serde_json::from_str(&b.metadata["parity.config"]).unwrap();
        cfg["depth"] = (1u64 << 33).into();
        b.metadata.insert("parity.config".into(), cfg.to_string());
    });
    expect_unusable(&p, &["ldm.SpatialTransformer", "`depth` is 8589934592", "not accepted"]);
    let p = RawBundle::edited(VAE, &dir, |b| {
        let mut cfg: serde_json::Value = serde_json::from_str(&b.metadata["parity.config"]).unwrap();
        cfg["heads"] = u64::MAX.into();
        b.metadata.insert("parity.config".into(), cfg.to_string());
    });
    expect_unusable(&p, &["`heads` is 18446744073709551615"]);
}

/// A safetensors header of 0x0580 bytes starts the file with `80 05`, a pickle's PROTO opcode
/// (protocol 5): it is still read as safetensors, by the bundle reader and the checkpoint reader.
#[test]
fn a_header_length_that_looks_like_a_pickle_opcode_is_safetensors() {
    let dir = scratch("pickle-lookalike");
    // The bundle without its stage traces (a short header).
    let src = RawBundle::edited("textbook/self_attention_dx6_d5_dv7.safetensors", &dir, |b| {
        b.tensors.retain(|k, _| !k.starts_with("parity.trace."));
        b.metadata.remove("parity.trace");
    });
    let bytes = std::fs::read(&src).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&bytes[8..8 + n]).unwrap().trim_end();
    // pad the JSON header with spaces (allowed by the format) to 0x0580 bytes
    const WANT: usize = 0x580;
    assert!(header.len() <= WANT, "pick a bundle with a shorter header");
    let padded = format!("{header:<WANT$}");
    let p = dir.join("lookalike.safetensors");
    std::fs::write(&p, raw_file(&padded, &bytes[8 + n..])).unwrap();
    assert_eq!(std::fs::read(&p).unwrap()[0], 0x80);
    let (code, out, err) = cli(&["check", p.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    let ck = unet_parity::checkpoint::Checkpoint::open(&p).unwrap();
    assert!(!ck.is_empty());
}

/// A bundle whose inputs and outputs have a zero-size batch: one line saying the input is
/// empty (it failed inside the block with a reshape message before).
#[test]
fn zero_batch_inputs_are_named() {
    let dir = scratch("zero-batch");
    let path = RawBundle::edited("textbook/self_attention_dx6_d5_dv7.safetensors", &dir, |b| {
        for (name, t) in b.tensors.iter_mut() {
            if ["parity.input.", "parity.output.", "parity.trace."]
                .iter()
                .any(|p| name.starts_with(p))
            {
                *t = t.narrow(0, 0, 0).unwrap();
            }
        }
    });
    expect_unusable(&path, &["input `x` has shape [0, 9, 6], no elements"]);
}

/// A header listing more tensors than any bundle holds (zero-size ones, 70,000) is refused
/// before it is parsed: a million of them took 1.3 GB and 14 s.
#[test]
fn headers_of_too_many_tensors_are_refused_unparsed() {
    let dir = scratch("many-tensors");
    let mut header = String::from("{\"__metadata__\":{\"parity.format\":\"1\"}");
    for i in 0..70_000 {
        header.push_str(&format!(
            ",\"t{i}\":{{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}"
        ));
    }
    header.push('}');
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    let path = dir.join("many.safetensors");
    std::fs::write(&path, bytes).unwrap();
    let start = std::time::Instant::now();
    expect_unusable(&path, &["the header lists 70000 tensors", "at most 65536"]);
    assert!(start.elapsed() < std::time::Duration::from_secs(5));
    let (code, _, err) = cli(&["inspect", path.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
}

// ---- Issue 32, item 7: checked before the forward, nothing ignored silently ----

/// An input tensor that `parity.inputs` does not list was silently not given to the block.
#[test]
fn an_input_tensor_not_listed_in_parity_inputs_is_named() {
    let dir = scratch("unlisted-input");
    let p = RawBundle::edited("textbook/self_attention_dx6_d5_dv7.safetensors", &dir, |b| {
        let x = b.tensors["parity.input.x"].clone();
        b.tensors.insert("parity.input.mask".into(), x);
    });
    expect_unusable(&p, &["`parity.input.mask`", "`parity.inputs`", "does not list it"]);
}

/// `--dtype` needs the float64 outputs: said before anything is built or run (a bundle whose
/// block cannot even be built gets the float64 message, not the build's).
#[test]
fn dtype_without_float64_outputs_is_refused_before_the_forward() {
    let dir = scratch("dtype-no-f64");
    let p = RawBundle::edited(VAE, &dir, |b| {
        b.tensors.retain(|k, _| !k.ends_with(".float64"));
        b.tensors.remove("to_v.bias");
    });
    let (code, out, err) = cli(&["check", p.to_str().unwrap(), "--dtype", "f64"]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("--dtype f64 needs `parity.output.out.float64`") || err.contains(".float64` to compare"),
        "{err}"
    );
    assert!(!err.contains("to_v.bias"), "{err}");
}

/// `detect` on a parity bundle says what it is and what to run, exit 2 (it said "no mid block
/// found", exit 0).
#[test]
fn detect_on_a_bundle_points_to_check() {
    let bundle = weights().join(VAE);
    let (code, out, err) = cli(&["detect", bundle.to_str().unwrap()]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("parity bundle") && err.contains("unet-parity check"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(!out.contains("no mid block"), "{out}");
}

/// A config.json whose model has no down block, and one whose model has no mid block.
#[test]
fn config_json_without_down_or_mid_blocks() {
    let dir = scratch("config-empty");
    let bundle = weights().join("mid/unet_mid_block_2d_cross_attn_sd1_ref.safetensors");
    let text = std::fs::read_to_string(weights().join("models/diffusers_sd1/config.json")).unwrap();
    let write = |name: &str, edit: &dyn Fn(&mut serde_json::Value)| {
        let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
        edit(&mut json);
        let path = dir.join(name);
        std::fs::write(&path, json.to_string()).unwrap();
        path
    };
    let empty = write("empty.json", &|j| j["down_block_types"] = serde_json::json!([]));
    let (code, _, err) = cli(&["check", bundle.to_str().unwrap(), "--config", empty.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("`down_block_types` is empty"), "{err}");
    let no_mid = write("no_mid.json", &|j| j["mid_block_type"] = serde_json::Value::Null);
    let (code, _, err) = cli(&["check", bundle.to_str().unwrap(), "--config", no_mid.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("the model has no mid block"), "{err}");
    assert!(!err.contains("is , not"), "{err}");
}

/// A reader that closed its end of standard output (`EPIPE`: Rust ignores `SIGPIPE`, so every
/// write fails with `BrokenPipe`) loses the table: exit 2, said on stderr (it was exit 0).
#[test]
fn a_closed_stdout_is_exit_2() {
    struct Closed;
    impl std::io::Write for Closed {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let folder = weights().join("textbook");
    let mut err = vec![];
    let code = unet_parity::cli::run(
        ["unet-parity", "check", folder.to_str().unwrap()],
        &mut Closed,
        &mut err,
    );
    let err = String::from_utf8_lossy(&err);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("cannot write the output") && err.lines().count() == 1,
        "{err}"
    );
}
