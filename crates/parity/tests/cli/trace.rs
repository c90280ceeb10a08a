//! `check --trace`: deliberately broken ports diverge at the stage where they are broken, and
//! the trace names it. Each variant is a committed bundle edited so that our block computes
//! something else than PyTorch did (the bundle's PyTorch stages stay as exported).

use crate::common::{
    cli, panel_columns, probs_panels_agree, probs_panels_max_diff, read_png, scratch, weights, RawBundle, BACKGROUND,
};
use candle_core::{DType, Tensor};
use std::path::Path;
use unet_parity::show::{SCALE_STRIP, TITLE_STRIP};
use unet_parity::trace::TraceReport;
use unet_parity::{check_file, Options};

fn trace_of(path: &Path) -> (bool, TraceReport) {
    let opts = Options {
        trace: true,
        ..Options::default()
    };
    let report = check_file(path, &opts).unwrap();
    (report.pass, report.trace.expect("--trace gives a trace report"))
}

fn edit_config(b: &mut RawBundle, edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) {
    let mut cfg: serde_json::Value = serde_json::from_str(&b.metadata["parity.config"]).unwrap();
    edit(cfg.as_object_mut().unwrap());
    b.metadata.insert("parity.config".into(), cfg.to_string());
}

fn statuses(t: &TraceReport) -> Vec<(String, String)> {
    t.stages.iter().map(|s| (s.stage.clone(), s.status.clone())).collect()
}

const VAE_MID: &str = "diffusers/attention_vae_mid.safetensors";

#[test]
fn committed_traced_bundles_have_no_divergence() {
    for rel in [
        VAE_MID,
        "denoising_diffusion_pytorch/attention_dim24_h3_d8_mem4.safetensors",
        "ldm/attn_block_c32.safetensors",
        "openai/attention_block_legacy_c32_h2.safetensors",
    ] {
        let (pass, t) = trace_of(&weights().join(rel));
        assert!(pass, "{rel}");
        let names: Vec<&str> = t.stages.iter().map(|s| s.stage.as_str()).collect();
        assert_eq!(
            names,
            ["norm", "q", "k", "v", "probs", "attn", "proj", "output"],
            "{rel}"
        );
        assert!(
            t.stages.iter().all(|s| s.status == "match"),
            "{rel}: {:?}",
            statuses(&t)
        );
        assert_eq!(t.first_divergence, None, "{rel}");
    }
}

/// OpenAI's legacy kernel splits heads before q/k/v (per-head `[q_h|k_h|v_h]`); running the
/// legacy weights with the new order (`[Q|K|V]`, then heads) is a wrong head layout.
#[test]
fn wrong_head_layout_diverges_at_q() {
    let dir = scratch("trace-heads");
    let path = RawBundle::edited("openai/attention_block_legacy_c32_h2.safetensors", &dir, |b| {
        edit_config(b, |c| {
            c.insert("use_new_attention_order".into(), true.into());
        })
    });
    let (pass, t) = trace_of(&path);
    assert!(!pass);
    assert_eq!(statuses(&t)[0], ("norm".into(), "match".into()));
    assert_eq!(t.first_divergence.as_deref(), Some("q"), "{:?}", statuses(&t));
    assert!(t.hint.as_deref().unwrap().contains("head layout"));

    // The same through the CLI table.
    let (code, out, _) = cli(&["check", "--trace", path.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("first divergence: `q`"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.trim_start().starts_with("norm") && l.ends_with("match")),
        "{out}"
    );
}

/// The q projection rows permuted from `(h d)` to `(d h)` order: a loader that reads the heads
/// the wrong way round. q diverges; k and v do not.
#[test]
fn permuted_q_rows_diverge_at_q_only() {
    let dir = scratch("trace-rows");
    let path = RawBundle::edited("diffusers/attention_unet2d_mid.safetensors", &dir, |b| {
        let cfg: serde_json::Value = serde_json::from_str(&b.metadata["parity.config"]).unwrap();
        let heads = cfg["heads"].as_u64().unwrap() as usize;
        let w = &b.tensors["to_q.weight"];
        let (rows, cols) = w.dims2().unwrap();
        let d = rows / heads;
        let permuted = w
            .reshape((heads, d, cols))
            .and_then(|t| t.transpose(0, 1))
            .and_then(|t| t.reshape((rows, cols)))
            .unwrap();
        let bias = b.tensors["to_q.bias"]
            .reshape((heads, d))
            .and_then(|t| t.t())
            .and_then(|t| t.flatten_all())
            .unwrap();
        b.tensors.insert("to_q.weight".into(), permuted.contiguous().unwrap());
        b.tensors.insert("to_q.bias".into(), bias.contiguous().unwrap());
    });
    let (pass, t) = trace_of(&path);
    assert!(!pass);
    let s = statuses(&t);
    assert_eq!(t.first_divergence.as_deref(), Some("q"), "{s:?}");
    let status = |n: &str| s.iter().find(|(k, _)| k == n).unwrap().1.clone();
    assert_eq!((status("k"), status("v")), ("match".into(), "match".into()));
}

/// `scale_qk: false`: no `1/sqrt(d)` on the scores. q, k, v match; the attention weights do not.
#[test]
fn missing_scale_diverges_at_probs() {
    let dir = scratch("trace-scale");
    let path = RawBundle::edited(VAE_MID, &dir, |b| {
        edit_config(b, |c| {
            c.insert("scale_qk".into(), false.into());
        })
    });
    let (pass, t) = trace_of(&path);
    assert!(!pass);
    assert_eq!(t.first_divergence.as_deref(), Some("probs"), "{:?}", statuses(&t));
    assert!(t.hint.as_deref().unwrap().contains("scale"));
}

/// The GroupNorm eps 1e-6 of the VAE mid block read as 1e-2: the very first stage diverges.
#[test]
fn wrong_eps_diverges_at_norm() {
    let dir = scratch("trace-eps");
    let path = RawBundle::edited(VAE_MID, &dir, |b| {
        edit_config(b, |c| {
            assert_eq!(c["eps"], serde_json::json!(1e-6));
            c.insert("eps".into(), serde_json::json!(1e-2));
        })
    });
    let (pass, t) = trace_of(&path);
    assert!(!pass);
    assert_eq!(t.first_divergence.as_deref(), Some("norm"), "{:?}", statuses(&t));
    assert!(t.hint.as_deref().unwrap().contains("eps"));
}

/// `residual_connection: false`: everything up to the output projection matches.
#[test]
fn missing_residual_diverges_at_output() {
    let dir = scratch("trace-residual");
    let path = RawBundle::edited(VAE_MID, &dir, |b| {
        edit_config(b, |c| {
            c.insert("residual_connection".into(), false.into());
        })
    });
    let (pass, t) = trace_of(&path);
    assert!(!pass);
    let s = statuses(&t);
    assert!(s[..s.len() - 1].iter().all(|(_, st)| st == "match"), "{s:?}");
    assert_eq!(t.first_divergence.as_deref(), Some("output"), "{s:?}");
    assert!(t.hint.as_deref().unwrap().contains("residual"));
}

/// A bundle without traces says so; a stage tensor listed but missing is a bundle error.
#[test]
fn bundles_without_traces_and_broken_trace_metadata() {
    let dir = scratch("trace-missing");
    let untraced = RawBundle::edited("torch/mha_bias_kv_zero_attn_float_mask.safetensors", &dir, |b| {
        b.metadata.remove("parity.trace");
        b.tensors.retain(|k, _| !k.starts_with("parity.trace."));
    });
    let (pass, t) = trace_of(&untraced);
    assert!(pass);
    assert!(t.stages.is_empty() && t.note.is_some());

    let path = RawBundle::edited(VAE_MID, &dir, |b| {
        b.tensors.remove("parity.trace.q");
    });
    let err = check_file(
        &path,
        &Options {
            trace: true,
            ..Options::default()
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("parity.trace.q"), "{err}");
    // Not tracing: the stage tensors are not looked at.
    assert!(check_file(&path, &Options::default()).unwrap().pass);
}

#[test]
fn tracing_is_off_outside_with_trace() {
    assert!(!unet_attention::trace::enabled());
    let t = Tensor::zeros(2, candle_core::DType::F32, &candle_core::Device::Cpu).unwrap();
    let (_, stages) = unet_attention::trace::with_trace(|| unet_attention::trace::record("x", &t));
    assert_eq!(stages.len(), 1);
    assert!(!unet_attention::trace::enabled());
}

/// A picture reads alone: the title strip above the panels is drawn on (title lines, a heading
/// over each panel column), and under each column a scale bar runs through the colour map from
/// black (0) to white (the column's largest value), with its two ends labelled.
fn assert_labelled(path: &Path, columns: usize) {
    let (w, h, px) = read_png(path);
    let at = |x: usize, y: usize| -> [u8; 3] { px[(y * w + x) * 3..(y * w + x) * 3 + 3].try_into().unwrap() };
    let drawn = |xs: std::ops::Range<usize>, ys: std::ops::Range<usize>| {
        ys.flat_map(|y| xs.clone().map(move |x| (x, y)))
            .filter(|&(x, y)| at(x, y) != BACKGROUND)
            .count()
    };
    let name = path.display();
    assert!(drawn(0..w, 0..20) > 50, "{name}: two title lines");
    let (starts, panel) = panel_columns(w, &px);
    assert_eq!(starts.len(), columns, "{name}");
    let bar = h - SCALE_STRIP;
    for &x0 in &starts {
        assert!(
            drawn(x0..x0 + panel, 20..TITLE_STRIP) > 10,
            "{name}: column heading at x {x0}"
        );
        // the bar: as wide as the panel, the same in each of its rows, black to white, and brighter
        // from left to right (the map's channel sum never decreases)
        let row: Vec<[u8; 3]> = (x0..x0 + panel).map(|x| at(x, bar)).collect();
        assert_eq!(row[0], [0, 0, 0], "{name}: the bar starts at the map's 0 (black)");
        assert_eq!(row[panel - 1], [255, 255, 255], "{name}: and ends at its max (white)");
        let sum = |c: &[u8; 3]| c.iter().map(|&v| u32::from(v)).sum::<u32>();
        assert!(row.windows(2).all(|p| sum(&p[0]) <= sum(&p[1]) + 2), "{name}");
        assert!(row.iter().any(|c| c[2] > 100 && c[1] < 40), "{name}: through purple");
        for y in bar..bar + 6 {
            assert!((x0..x0 + panel).all(|x| at(x, y) == row[x - x0]), "{name}: bar row {y}");
        }
        assert_eq!(
            at(x0, bar - 1),
            BACKGROUND,
            "{name}: a gap between the panels and the bar"
        );
        // the labels under it: `0` at the left end, the largest value at the right end
        assert!(drawn(x0..x0 + 5, bar + 8..bar + 16) > 5, "{name}: `0` under the bar");
        assert!(
            drawn(x0 + panel - 12..x0 + panel, bar + 8..bar + 16) > 5,
            "{name}: max under the bar"
        );
    }
}

/// `show BUNDLE --out DIR --query Y,X`, which must succeed; its standard output.
fn show_query(bundle: &Path, dir: &Path, query: &str) -> String {
    let (code, out, err) = cli(&[
        "show",
        bundle.to_str().unwrap(),
        "--out",
        dir.to_str().unwrap(),
        "--query",
        query,
    ]);
    assert_eq!(code, 0, "{out}{err}");
    out
}

#[test]
fn show_writes_error_maps_and_attention_pictures() {
    let dir = scratch("show-ok");
    let bundle = weights().join("denoising_diffusion_pytorch/attention_dim24_h3_d8_mem4.safetensors");
    let out = show_query(&bundle, &dir, "2,3");
    // x (2, 24, 5, 7): cells of 160/7 = 22 px, two panels with 4-px gaps, under the title strip and
    // over the scale bars.
    let labels = TITLE_STRIP + SCALE_STRIP;
    let (w, h, _) = read_png(&dir.join("output_error.png"));
    assert_eq!((w, h), (2 * (7 * 22 + 4) + 4, 5 * 22 + 8 + labels));
    let (w, h, _) = read_png(&dir.join("output_worst_channels.png"));
    assert_eq!((w, h), (2 * (7 * 22 + 4) + 4, 4 * (5 * 22 + 4) + 4 + labels));
    let probs = dir.join("probs_query_2_3.png");
    let (w, h, px) = read_png(&probs);
    assert_eq!(
        (w, h),
        (3 * (7 * 22 + 4) + 4, 3 * (5 * 22 + 4) + 4 + labels),
        "three heads, three panels"
    );
    assert_labelled(&dir.join("output_error.png"), 2);
    assert_labelled(&dir.join("output_worst_channels.png"), 2);
    assert_labelled(&probs, 3);
    assert!(
        probs_panels_agree(&probs),
        "a correct port draws the same map as PyTorch"
    );
    // the query pixel is outlined in cyan in the first panel: (x 3, y 2) at 22 px per cell
    let at = |x: usize, y: usize| &px[(y * w + x) * 3..(y * w + x) * 3 + 3];
    assert_eq!(at(4 + 3 * 22, TITLE_STRIP + 4 + 2 * 22), &[0, 255, 255]);
    assert!(out.contains("the 4 memory keys are not drawn"), "{out}");

    let (code, _, err) = cli(&[
        "show",
        bundle.to_str().unwrap(),
        "--out",
        dir.to_str().unwrap(),
        "--query",
        "5,0",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("--query 5,0"), "{err}");
}

#[test]
fn show_draws_different_maps_for_a_wrong_head_layout() {
    let dir = scratch("show-broken");
    let path = RawBundle::edited("openai/attention_block_legacy_c32_h2.safetensors", &dir, |b| {
        edit_config(b, |c| {
            c.insert("use_new_attention_order".into(), true.into());
        })
    });
    let pics = dir.join("pics");
    let (code, out, err) = cli(&["show", path.to_str().unwrap(), "--out", pics.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    // not a level or two of rounding: the maps are different pictures
    let diff = probs_panels_max_diff(&pics.join("probs_query_2_1.png"));
    assert!(diff > 32, "{diff} levels");
    // the correct bundle draws equal panels at the same query
    let ok = dir.join("ok");
    let committed = weights().join("openai/attention_block_legacy_c32_h2.safetensors");
    let (code, ..) = cli(&["show", committed.to_str().unwrap(), "--out", ok.to_str().unwrap()]);
    assert_eq!(code, 0);
    assert!(probs_panels_agree(&ok.join("probs_query_2_1.png")));
}

/// Every committed bundle carries stage traces (every block id, every dtype), and every stage
/// matches; every bundle carries the float64 copy's stages, the reference its stages are judged by
/// (half-precision bundles as `.float64`, float32 bundles as `.float64_delta`).
#[test]
fn every_committed_bundle_matches_stage_by_stage() {
    let mut traced = std::collections::BTreeMap::<String, usize>::new();
    let mut with_f64 = 0;
    let mut total = 0;
    for path in crate::common::committed_bundles() {
        total += 1;
        let b = unet_parity::bundle::Bundle::read(&path).unwrap();
        assert!(b.metadata.contains_key("parity.trace"), "{}: no traces", path.display());
        let half = matches!(
            b.metadata.get("parity.dtype").map(String::as_str),
            Some("float16" | "bfloat16")
        );
        let names = unet_parity::trace::stage_names(&b).unwrap();
        let suffix = if half { ".float64" } else { ".float64_delta" };
        let refs = names
            .iter()
            .filter(|n| b.tensors.contains_key(&format!("parity.trace.{n}{suffix}")))
            .count();
        // every stage but `output` (the bundle's output, with its own .float64) has one
        assert_eq!(refs, names.len() - 1, "{}", path.display());
        with_f64 += usize::from(half);
        let (pass, t) = trace_of(&path);
        assert!(pass, "{}", path.display());
        assert_eq!(t.first_divergence, None, "{}: {:?}", path.display(), statuses(&t));
        // Module-path bundles (weights/own/modules, for `unet_parity::port`) name every submodule's
        // output; our blocks record the named stages, so the ones named alike are compared.
        let modules = b.metadata.get("parity.trace_mode").map(String::as_str) == Some("modules");
        let compared = |s: &&unet_parity::trace::StageReport| !modules || s.status != "not recorded";
        assert!(
            t.stages.iter().filter(compared).all(|s| s.status == "match"),
            "{}: {:?}",
            path.display(),
            statuses(&t)
        );
        assert!(
            t.stages.iter().filter(|s| s.status == "match").count() > 1,
            "{}",
            path.display()
        );
        *traced.entry(b.block.clone()).or_default() += 1;
    }
    // Every registered block id has traced bundles.
    assert_eq!(traced.len(), unet_parity::registry::all().len(), "{:?}", traced.keys());
    assert!(with_f64 >= 56, "{with_f64} half-precision bundles");
    assert_eq!(traced.values().sum::<usize>(), total);
}

/// A stage is judged against PyTorch's own error, as an output is, not by a fixed absolute
/// number: PyTorch's stored `norm` moved by 3e-5 at some elements (three times the f32 `atol`, as a
/// CPU whose kernels sum in another order and round worse could leave it), its float64 twin unchanged,
/// still matches, because ours is closer to float64 than PyTorch is. Moving the float64 twin
/// with it (the reference agreeing with PyTorch, ours 3e-5 off) is a divergence, and a delta of
/// the wrong shape is a clear error.
#[test]
fn a_stage_is_judged_against_pytorchs_own_error() {
    let dir = scratch("stage-rule");
    let moved = |twin_too: bool, name: &str| {
        RawBundle::edited(VAE_MID, &dir.join(name), |b| {
            let stage = b.tensors["parity.trace.norm"].clone();
            let delta = b.tensors["parity.trace.norm.float64_delta"]
                .to_dtype(DType::F64)
                .unwrap();
            // +3e-5 / -3e-5 alternately at every 32nd element of magnitude at least 1 (sparse
            // and large enough for PyTorch's float32 rounding to reach it: a stage twin further
            // from PyTorch's stage than that is ignored).
            let values = stage
                .flatten_all()
                .unwrap()
                .to_dtype(DType::F64)
                .unwrap()
                .to_vec1::<f64>()
                .unwrap();
            let step: Vec<f64> = values
                .iter()
                .enumerate()
                .map(|(i, x)| match (i % 32, x.abs() >= 1.0) {
                    (0, true) => 3e-5 * if i % 64 == 0 { 1.0 } else { -1.0 },
                    _ => 0.0,
                })
                .collect();
            let step = Tensor::from_vec(step, stage.dims(), stage.device()).unwrap();
            let moved = (stage.to_dtype(DType::F64).unwrap() + &step).unwrap();
            let f64_stage = (stage.to_dtype(DType::F64).unwrap() + delta).unwrap();
            let twin = if twin_too {
                (&f64_stage + &step).unwrap()
            } else {
                f64_stage
            };
            let moved32 = moved.to_dtype(DType::F32).unwrap();
            // the delta in f32 (any float dtype reads): exact enough for a 3e-5 step
            let delta = (twin - moved32.to_dtype(DType::F64).unwrap()).unwrap();
            b.tensors.insert("parity.trace.norm".into(), moved32);
            b.tensors.insert(
                "parity.trace.norm.float64_delta".into(),
                delta.to_dtype(DType::F32).unwrap(),
            );
        })
    };
    for (sub, twin_too, want) in [("loose", false, "match"), ("wrong", true, "DIVERGES")] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
        let (pass, t) = trace_of(&moved(twin_too, sub));
        assert!(pass, "{sub}: the output is untouched");
        let norm = t.stages.iter().find(|s| s.stage == "norm").unwrap();
        assert_eq!(norm.status, want, "{sub}: {:?}", norm.compare);
        let c = norm.compare.as_ref().unwrap();
        assert!(
            c.max_abs > 2.9e-5,
            "{sub}: ours is 3e-5 from PyTorch's moved stage: {c:?}"
        );
        assert!(c.torch_vs_f64.is_some(), "{sub}: judged against the float64 twin");
    }
    std::fs::create_dir_all(dir.join("shape")).unwrap();
    let bad = RawBundle::edited(VAE_MID, &dir.join("shape"), |b| {
        let d = b.tensors["parity.trace.norm.float64_delta"].flatten_all().unwrap();
        b.tensors.insert("parity.trace.norm.float64_delta".into(), d);
    });
    let opts = Options {
        trace: true,
        ..Options::default()
    };
    let err = check_file(&bad, &opts).unwrap_err().to_string();
    assert!(
        err.contains("parity.trace.norm.float64_delta") && err.contains("shape"),
        "{err}"
    );
}

/// Composite blocks nest their parts' stages under the PyTorch submodule names.
#[test]
fn composite_blocks_nest_their_parts_stages() {
    for (rel, want) in [
        (
            "mid/unet_mid_block_2d_cross_attn_sd1_f16.safetensors",
            &[
                "resnets.0/norm1",
                "attentions.0/transformer_blocks.0/attn1/probs",
                "attentions.0/transformer_blocks.0/ff/act",
                "resnets.1/output",
            ][..],
        ),
        (
            "mid/lucidrains_mid_block_model.safetensors",
            &[
                "mid_block1/temb",
                "mid_block1/conv1",
                "mid_attn/q",
                "mid_block2/shortcut",
            ][..],
        ),
    ] {
        let (_, t) = trace_of(&weights().join(rel));
        let names: Vec<&str> = t.stages.iter().map(|s| s.stage.as_str()).collect();
        for w in want {
            assert!(names.contains(w), "{rel}: no stage {w} in {names:?}");
        }
    }
}

/// A composite block gets one attention picture per attention over its input's pixels, named
/// after the nested stage; for a correct port PyTorch's and our panels are the same picture.
#[test]
fn show_draws_the_attention_of_a_composite_block() {
    for (rel, file) in [
        (
            "mid/lucidrains_mid_block_model.safetensors",
            "mid_attn__probs_query_1_2.png",
        ),
        (
            "mid/unet_mid_block_2d_cross_attn_sd1.safetensors",
            "attentions.0__transformer_blocks.0__attn1__probs_query_1_2.png",
        ),
    ] {
        let dir = scratch(&format!("show-{}", rel.replace('/', "-")));
        let out = show_query(&weights().join(rel), &dir, "1,2");
        assert!(out.contains(file), "{out}");
        assert!(probs_panels_agree(&dir.join(file)), "{rel}");
    }
}

/// Token-input bundles get pictures too (they used to write nothing and exit 0), and `show` does
/// not write through a link planted in its output folder.
#[test]
fn show_draws_token_outputs_and_refuses_planted_links() {
    let dir = scratch("show-tokens");
    let bundle = weights().join("diffusers/attention_cross.safetensors");
    let (code, out, err) = cli(&["show", bundle.to_str().unwrap(), "--out", dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    // output (2, 11, 40): cells of 160/40 = 4 px; probs (2, 5, 11, 7): cells of 160/11 = 14 px.
    let labels = TITLE_STRIP + SCALE_STRIP;
    let (w, h, _) = read_png(&dir.join("output_error.png"));
    assert_eq!((w, h), (2 * (40 * 4 + 4) + 4, 11 * 4 + 8 + labels));
    let (w, h, _) = read_png(&dir.join("probs_tokens.png"));
    assert_eq!((w, h), (3 * (7 * 14 + 4) + 4, 5 * (11 * 14 + 4) + 4 + labels));
    assert!(probs_panels_agree(&dir.join("probs_tokens.png")));
    assert_labelled(&dir.join("output_error.png"), 2);
    assert_labelled(&dir.join("probs_tokens.png"), 3);
    assert!(out.contains("11 queries (rows) over the 7 keys"), "{out}");

    #[cfg(unix)]
    {
        let planted = scratch("show-planted");
        let victim = planted.join("victim.txt");
        std::fs::write(&victim, "keep me").unwrap();
        std::os::unix::fs::symlink(&victim, planted.join("output_error.png")).unwrap();
        let (code, _, err) = cli(&["show", bundle.to_str().unwrap(), "--out", planted.to_str().unwrap()]);
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("symbolic link"), "{err}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
    }
}

/// `show` takes the block's weights from a checkpoint as `check` does (`--weights`, `--prefix`):
/// the SD VAE decoder's mid block drawn from the committed diffusers checkpoint, and a prefix the
/// checkpoint does not have is a one-line error.
#[test]
fn show_takes_weights_from_a_checkpoint() {
    let dir = scratch("show-weights");
    let bundle = weights().join("mid/unet_mid_block_2d_vae_decoder_ref.safetensors");
    let model = weights().join("models/diffusers_vae/diffusion_pytorch_model.safetensors");
    let pics = dir.join("pics");
    let args = |prefix: &'static str| {
        vec![
            "show".to_string(),
            bundle.to_str().unwrap().into(),
            "--out".into(),
            pics.to_str().unwrap().into(),
            "--weights".into(),
            model.to_str().unwrap().into(),
            "--prefix".into(),
            prefix.into(),
        ]
    };
    let run = |a: Vec<String>| cli(&a.iter().map(String::as_str).collect::<Vec<_>>());
    let (code, out, err) = run(args("decoder.mid_block"));
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("wrote") && pics.join("output_error.png").is_file(),
        "{out}"
    );
    let (code, out, err) = run(args("decoder.no_such_block"));
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("no tensor under prefix `decoder.no_such_block.`"), "{err}");
}

/// The documented `attn` stage (the weighted sum, heads merged) gets its own hint; diffusers'
/// `attn1`/`attn2` modules and `attentions.N` the whole block's.
#[test]
fn the_attn_stage_has_its_own_hint() {
    use unet_parity::trace::hint;
    for stage in ["attn", "mid_attn/attn", "attn#2"] {
        assert!(
            hint(stage).starts_with("the weighted sum and head merge"),
            "{stage}: {}",
            hint(stage)
        );
    }
    for stage in ["attentions.0/transformer_blocks.0/attn1", "attn2", "attentions.0"] {
        assert!(
            hint(stage).starts_with("an attention block as a whole"),
            "{stage}: {}",
            hint(stage)
        );
    }
}

/// Issue 47: our own block on a bundle of module-path stages shows the stages named alike (the
/// attention core, the resnets' norms and convolutions) and counts the rest in one line that says
/// why, instead of a `not recorded` row for each of PyTorch's submodules.
#[test]
fn our_block_on_a_module_path_bundle_shows_the_stages_named_alike() {
    let path = crate::common::root().join("weights/own/modules/diffusers_vae_decoder_mid_block.safetensors");
    let (code, out, err) = crate::common::cli(&["check", "--trace", path.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(!out.contains("not recorded"), "{out}");
    assert!(
        out.contains("attentions.0/probs") && out.contains("resnets.1/conv2"),
        "{out}"
    );
    assert!(
        out.contains("stages not shown: they are PyTorch submodules' outputs named by module path"),
        "{out}"
    );
}
