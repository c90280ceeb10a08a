//! The verdict means what it says both ways (issue 44): the wrong-PASS classes a hostile review
//! found, each now a FAIL or a refused bundle while the honest bundles they were made from pass;
//! the stage table judged by the verdict's own rule.

use crate::common::{cli, scratch, weights, RawBundle};
use candle_core::{DType, Tensor};
use std::path::Path;
use unet_parity::trace::TraceReport;
use unet_parity::{check_file, Options};

const OUT: &str = "parity.output.output";
const TWIN: &str = "parity.output.output.float64";

fn check(p: &Path, extra: &[&str]) -> (i32, String, String) {
    let mut args = vec!["check"];
    args.extend_from_slice(extra);
    args.push(p.to_str().unwrap());
    cli(&args)
}

fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

fn like(v: Vec<f64>, t: &Tensor) -> Tensor {
    Tensor::from_vec(v, t.dims(), t.device())
        .unwrap()
        .to_dtype(t.dtype())
        .unwrap()
}

/// The bundle with PyTorch's output moved by `shift(i, value)` (so our honest output is wrong by
/// that much against it) and the float64 twin forged by `twin(i, moved value, our value)`.
fn forged(
    rel: &str,
    dir: &Path,
    shift: impl Fn(usize, f64) -> f64,
    twin: impl Fn(usize, f64, f64) -> f64,
) -> std::path::PathBuf {
    RawBundle::edited(rel, dir, |b| {
        let out = b.tensors[OUT].clone();
        let ours = f64s(&out);
        let moved: Vec<f64> = ours.iter().enumerate().map(|(i, x)| shift(i, *x)).collect();
        let moved = like(moved, &out);
        let rounded = f64s(&moved);
        let forged: Vec<f64> = rounded
            .iter()
            .zip(&ours)
            .enumerate()
            .map(|(i, (t, o))| twin(i, *t, *o))
            .collect();
        b.tensors.insert(TWIN.into(), like(forged, &b.tensors[TWIN]));
        b.tensors.insert(OUT.into(), moved);
    })
}

/// A port off by 0.3 at every element but one huge one, with a twin forged at the old bound
/// (whose floor was the output's RMS, 15,600 with one 1e6 element): refused or failed.
#[test]
fn one_huge_element_licenses_no_error_elsewhere() {
    let dir = scratch("verdict-huge");
    let rel = "diffusers/attention_vae_mid.safetensors";
    let p = forged(
        rel,
        &dir,
        |i, x| if i == 0 { 1e6 } else { x + 0.3 },
        |i, t, o| if i == 0 { t } else { o + 0.3 - 0.12 },
    );
    let (code, out, err) = check(&p, &[]);
    assert_ne!(code, 0, "{out}{err}");
    let (code, out, err) = check(&weights().join(rel), &[]);
    assert_eq!(code, 0, "{out}{err}");
}

/// The earlier bound on a twin: 64 (f32) or 16 (f16, bf16) epsilons of the larger of the largest
/// `|r|` within 64 places and the output's RMS.
fn old_bound(r: &[f64], epsilons: f64) -> Vec<f64> {
    let n = r.len();
    let rms = (r.iter().map(|x| x * x).sum::<f64>() / n as f64).sqrt();
    (0..n)
        .map(|i| {
            let local = r[i.saturating_sub(64)..(i + 65).min(n)]
                .iter()
                .fold(0.0f64, |m, x| m.max(x.abs()));
            epsilons * local.max(rms)
        })
        .collect()
}

/// Whole-output bias errors that forged twins at 85–97 % of the earlier bound let pass: PyTorch's
/// output moved by 90 % of that bound (our honest output is then that far off, a bias), the twin
/// left on our output. Never a PASS now, in every dtype: beyond the twin bounds, the twin is not
/// our float64 run's output (a FAIL), or PyTorch's output is implausible next to ours
/// (inconclusive).
#[test]
fn forged_twins_license_no_bias() {
    let dir = scratch("verdict-forged-bias");
    for (rel, eps) in [
        ("textbook/self_attention_dx6_d5_dv7.safetensors", 64.0 * 2f64.powi(-23)),
        (
            "textbook/self_attention_dx6_d5_dv7_f16.safetensors",
            16.0 * 2f64.powi(-10),
        ),
        (
            "textbook/self_attention_dx6_d5_dv7_bf16.safetensors",
            16.0 * 2f64.powi(-7),
        ),
        ("diffusers/attention_vae_mid.safetensors", 64.0 * 2f64.powi(-23)),
    ] {
        let (code, out, err) = check(&weights().join(rel), &[]);
        assert_eq!(code, 0, "honest {rel}: {out}{err}");
        let b = RawBundle::read(&weights().join(rel));
        let bound = old_bound(&f64s(&b.tensors[TWIN]), eps);
        let p = forged(rel, &dir, |i, x| x + 0.9 * bound[i], |_, _, o| o);
        let (code, out, err) = check(&p, &[]);
        assert!(
            code == 1 || code == 3,
            "{rel} with a bias of 90 % of the old bound: {out}{err}"
        );
        let said = format!("{out}{err}");
        assert!(
            said.contains("float64 run differs") || said.contains("cannot show"),
            "{said}"
        );
    }
}

/// The honest outlier bundles (one huge input element at (0, 5, 3, 7)) with the output
/// projection's bias off on the outlier's own channel: PyTorch's large error at the outlier
/// licenses nothing at the channel's ordinary pixels.
#[test]
fn a_bias_on_the_outliers_channel_fails() {
    let dir = scratch("verdict-outlier-channel");
    for (rel, delta) in [
        ("outlier/vae_attention_outlier_1e6.safetensors", 0.05),
        ("outlier/vae_attention_outlier_1e4.safetensors", 4e-4),
        ("outlier/vae_attention_outlier_1e4_f16.safetensors", 1.0),
        ("outlier/vae_attention_outlier_1e4_bf16.safetensors", 1.0),
    ] {
        let p = RawBundle::edited(rel, &dir, |b| {
            let bias = &b.tensors["to_out.0.bias"];
            let mut v = f64s(bias);
            v[5] += delta;
            let moved = like(v, bias);
            b.tensors.insert("to_out.0.bias".into(), moved);
        });
        let (code, out, err) = check(&p, &[]);
        assert_eq!(code, 1, "{rel}, channel 5 off by {delta}: {out}{err}");
    }
}

/// A float32 bundle without `parity.dtype` whose output was rounded to bfloat16 is not taken
/// for a bfloat16 bundle (whose tolerances would pass a 5e-3 error).
#[test]
fn a_rounded_output_without_a_dtype_is_refused() {
    let dir = scratch("verdict-dtype");
    let p = RawBundle::edited("textbook/self_attention_dx6_d5_dv7.safetensors", &dir, |b| {
        b.metadata.remove("parity.dtype");
        let out = &b.tensors[OUT];
        let moved = (out + 5e-3).unwrap().to_dtype(DType::BF16).unwrap();
        b.tensors.insert(OUT.into(), moved);
    });
    let (code, out, err) = check(&p, &[]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(err.contains("parity.dtype"), "{err}");
}

fn trace_of(path: &Path, strict: bool) -> (bool, TraceReport) {
    let opts = Options {
        trace: true,
        strict,
        ..Options::default()
    };
    let report = check_file(path, &opts).unwrap();
    (report.pass, report.trace.expect("--trace gives a trace report"))
}

/// Stage twins forged to 1e30 are ignored (with a note), and a wrong head layout is still found
/// at `q`, not sent to `output`.
#[test]
fn forged_stage_twins_are_ignored_and_q_is_named() {
    let dir = scratch("verdict-forged-deltas");
    let p = RawBundle::edited("openai/attention_block_legacy_c32_h2.safetensors", &dir, |b| {
        let mut cfg: serde_json::Value = serde_json::from_str(&b.metadata["parity.config"]).unwrap();
        cfg["use_new_attention_order"] = true.into();
        b.metadata.insert("parity.config".into(), cfg.to_string());
        for (k, t) in b.tensors.iter_mut() {
            if k.ends_with(".float64_delta") {
                *t = (t.ones_like().unwrap() * 1e30).unwrap();
            }
        }
    });
    let (pass, t) = trace_of(&p, false);
    assert!(!pass);
    assert_eq!(t.first_divergence.as_deref(), Some("q"), "{t}");
    assert!(t.stages[1].twin_note.as_deref().unwrap().contains("ignored"), "{t}");
}

/// NaN stage twins: the correct port still passes, and no stage is blamed.
#[test]
fn nan_stage_twins_blame_no_stage_of_a_passing_port() {
    let dir = scratch("verdict-nan-twins");
    let rel = "diffusers/attention_vae_mid_f16.safetensors";
    let p = RawBundle::edited(rel, &dir, |b| {
        for (k, t) in b.tensors.iter_mut() {
            if k.starts_with("parity.trace.") && k.ends_with(".float64") {
                *t = (t.zeros_like().unwrap() * f64::NAN).unwrap();
            }
        }
    });
    let (pass, t) = trace_of(&p, false);
    assert!(pass, "{t}");
    assert_eq!(t.first_divergence, None, "{t}");
    assert!(t.stages.iter().all(|s| s.status != "DIVERGES"), "{t}");
    assert!(t.to_string().contains("ignored"), "{t}");
}

/// `--strict` judges the stages too: a half-precision block that needs rule (b) fails under it,
/// and the trace names where, instead of "no stage diverges".
#[test]
fn strict_judges_the_stages_as_it_judges_the_outputs() {
    let p = weights().join("mid/unet_mid_block_2d_cross_attn_sd1_f16.safetensors");
    let (pass, t) = trace_of(&p, false);
    assert!(pass && t.first_divergence.is_none(), "{t}");
    let (pass, t) = trace_of(&p, true);
    assert!(!pass);
    assert!(t.first_divergence.is_some(), "{t}");
    assert!(!t.to_string().contains("no stage diverges"), "{t}");
}

/// Every committed half-precision bundle with stages: PASS and no first divergence agree.
#[test]
fn pass_and_first_divergence_agree_on_committed_half_bundles() {
    for path in crate::common::committed_bundles() {
        let name = path.to_string_lossy().to_string();
        if !(name.ends_with("_f16.safetensors") || name.ends_with("_bf16.safetensors")) || !name.contains("/mid/") {
            continue;
        }
        let (pass, t) = trace_of(&path, false);
        assert_eq!(pass, t.first_divergence.is_none(), "{name}: {t}");
    }
}

/// A sample of the generated calibration bundles (docs/calibration/sample; the full set is never
/// committed): the honest ones pass, and every planted float32 bug among them (a port computing
/// with that bug, `<id>.bugs.safetensors`) fails under the rule, judged as `check` judges it.
#[test]
fn the_calibration_sample_passes_and_its_float32_bugs_fail() {
    use unet_parity::compare::{check_reference, compare_with_factors, TwinProblem, CONFIRMED_FACTORS, FACTORS};
    let dir = crate::common::root().join("docs/calibration/sample");
    let (code, out, err) = cli(&["check", dir.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("9 passed, 0 failed"), "{out}");
    let mut failed = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let Some(id) = name.strip_suffix(".bugs.safetensors") else {
            continue;
        };
        let bundle = unet_parity::Bundle::read(&dir.join(format!("{id}.safetensors"))).unwrap();
        if bundle.run_dtype().unwrap() != DType::F32 {
            continue;
        }
        let bugs = candle_core::safetensors::load(&path, &candle_core::Device::Cpu).unwrap();
        for (key, wrong) in bugs {
            let output = key.split_once('/').unwrap().1;
            let (t, r) = (bundle.output(output).unwrap(), bundle.output_f64(output).unwrap());
            let factors = match check_reference(t, r, DType::F32).unwrap() {
                Ok(()) => FACTORS,
                Err(TwinProblem::BeyondRounding(_)) => CONFIRMED_FACTORS,
                Err(e) => panic!("{id}: {e}"),
            };
            let (rtol, atol) = unet_parity::compare::default_tolerance(DType::F32);
            let report = compare_with_factors(output, &wrong, t, Some(r), (rtol, atol), factors).unwrap();
            assert!(!report.pass, "{id} {key}: {report:?}");
            failed += 1;
        }
    }
    assert!(failed >= 3, "{failed} float32 bugs in the sample");
}

// --- Issue 53: a PASS is a statement about PyTorch's output -------------------------------------

/// PyTorch's output replaced (its float64 twin kept): zeros, negated, × 1.05, + 1e-3, plus noise
/// of half its RMS, each rounded to the bundle's dtype.
fn forgeries(t: &Tensor) -> Vec<(&'static str, Tensor)> {
    let v = f64s(t);
    let rms = (v.iter().map(|x| x * x).sum::<f64>() / v.len() as f64).sqrt();
    // a fixed pseudo-random sign and size per element
    let noise = |i: usize| ((i as f64 * 12.9898).sin() * 43758.5453).fract() * 1.7;
    type Forge = Box<dyn Fn(usize, f64) -> f64>;
    let kinds: [(&'static str, Forge); 5] = [
        ("zeros", Box::new(|_, _| 0.0)),
        ("negated", Box::new(|_, x| -x)),
        ("x1.05", Box::new(|_, x| x * 1.05)),
        ("+1e-3", Box::new(|_, x| x + 1e-3)),
        ("noise", Box::new(move |i, x| x + 0.5 * rms * noise(i))),
    ];
    kinds
        .into_iter()
        .map(|(k, f)| (k, like(v.iter().enumerate().map(|(i, x)| f(i, *x)).collect(), t)))
        .collect()
}

/// A committed bundle copied into `dir` with its output replaced; a bundle that references a
/// checkpoint (`parity.weights`, relative) gets the checkpoint copied beside it at the same
/// relative place.
fn with_output(rel: &str, dir: &Path, name: &str, output: &Tensor, twin: bool) -> std::path::PathBuf {
    let src = weights().join(rel);
    let mut b = RawBundle::read(&src);
    let sub = dir.join(name).join(Path::new(rel).parent().unwrap());
    std::fs::create_dir_all(&sub).unwrap();
    if let Some(ckpt) = b.metadata.get("parity.weights").cloned() {
        let from = src.parent().unwrap().join(&ckpt);
        let to = sub.join(&ckpt);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(&from, &to).unwrap();
    }
    b.tensors.insert(OUT.into(), output.clone());
    if !twin {
        b.tensors.remove(TWIN);
    }
    let path = sub.join(Path::new(rel).file_name().unwrap());
    b.write(&path);
    path
}

/// Every forged PyTorch output, in float32, float16 and bfloat16, of a block and of the whole VAE
/// and U-Net, is not a PASS, with and without `--trace` (with the twin it is inconclusive or a
/// FAIL; the same output without a twin is a FAIL), while the honest bundle passes. One exception,
/// measured and documented (docs/cli.md, "What PASS means"): `+1e-3` on the bfloat16 VAE
/// attention is an eighth of a bfloat16 ulp there and rounds back to PyTorch's own output in 65 %
/// of the elements; what is left (one ulp up at the rest) is within what honest bfloat16 runs show
/// on average (3.8 times ours against a bound of 5.7).
#[test]
fn a_forged_pytorch_output_is_never_a_pass() {
    let dir = scratch("verdict-forged-output");
    let bundles = [
        ("diffusers/attention_vae_mid.safetensors", true),
        ("diffusers/attention_vae_mid_f16.safetensors", false),
        ("diffusers/attention_vae_mid_bf16.safetensors", false),
        ("whole/vae.safetensors", true),
        ("whole/vae_f16.safetensors", false),
        ("whole/sd1_unet_f16.safetensors", false),
    ];
    for (rel, traced) in bundles {
        let (code, out, err) = check(&weights().join(rel), &[]);
        assert_eq!(code, 0, "honest {rel}: {out}{err}");
        let t = RawBundle::read(&weights().join(rel)).tensors[OUT].clone();
        for (kind, forged) in forgeries(&t) {
            if rel.ends_with("_bf16.safetensors") && kind == "+1e-3" {
                continue;
            }
            let name = format!("{}-{kind}", rel.replace('/', "-"));
            let p = with_output(rel, &dir, &name, &forged, true);
            let modes: &[&[&str]] = if traced { &[&[], &["--trace"]] } else { &[&[]] };
            for extra in modes {
                let (code, out, err) = check(&p, extra);
                assert!(
                    code == 1 || code == 3,
                    "{rel} {kind} {extra:?}: exit {code}\n{out}{err}"
                );
                assert!(!out.contains("1 passed"), "{rel} {kind}: {out}");
            }
            let p = with_output(rel, &dir, &format!("{name}-no-twin"), &forged, false);
            let (code, out, err) = check(&p, &[]);
            assert_eq!(code, 1, "{rel} {kind} without its twin: {out}{err}");
        }
    }
}

/// The scaled forgery's verdict is inconclusive (exit 3), says why and what to check, and the JSON
/// says `inconclusive`.
#[test]
fn an_implausible_pytorch_output_is_inconclusive() {
    let dir = scratch("verdict-inconclusive");
    let rel = "diffusers/attention_vae_mid.safetensors";
    let t = RawBundle::read(&weights().join(rel)).tensors[OUT].clone();
    let scaled = like(f64s(&t).iter().map(|x| x * 1.05).collect(), &t);
    let p = with_output(rel, &dir, "scaled", &scaled, true);
    let (code, out, err) = check(&p, &[]);
    assert_eq!(code, 3, "{out}{err}");
    assert!(out.contains("INCONCLUSIVE"), "{out}");
    assert!(out.contains("0 passed, 0 failed, 1 inconclusive"), "{out}");
    assert!(out.contains("--dtype f64"), "{out}");
    let (code, out, _) = check(&p, &["--json"]);
    assert_eq!(code, 3);
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["inconclusive"], 1);
    assert_eq!(doc["bundles"][0]["outcome"], "inconclusive");
    assert_eq!(doc["bundles"][0]["outputs"][0]["verdict"], "inconclusive");
}

fn verdict_data(name: &str) -> std::path::PathBuf {
    crate::common::root()
        .join("crates/parity/tests/data/verdict")
        .join(name)
}

/// PyTorch's float32 run with a wrong eps (a float32-only bug: a fused kernel, a dtype-dependent
/// eps), its float64 twin right: ours reproduces the twin, not the output, and is not a PASS; the
/// same wrong module with its own twin fails (scripts/export_verdict.py made both).
#[test]
fn a_float32_only_bug_in_pytorchs_run_is_not_a_pass() {
    let (code, out, err) = check(&verdict_data("vae_mid_eps_f32_only.safetensors"), &[]);
    assert!(code == 1 || code == 3, "{out}{err}");
    let (code, out, err) = check(&verdict_data("vae_mid_eps_wrong_module.safetensors"), &[]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("float64 run differs"), "{out}");
}

/// A port whose resnets compute with eps 1e-6 where the SD 2.x mid block uses 1e-5 (the bundle's
/// config edited, so that our block is that port): the float64 run shows it (a FAIL), and in
/// float16, where rounding hides it from rule (a) and (b), too.
#[test]
fn a_wrong_eps_in_a_mid_blocks_resnets_fails() {
    let dir = scratch("verdict-resnet-eps");
    for rel in [
        "mid/unet_mid_block_2d_cross_attn_sd2_ref.safetensors",
        "mid/unet_mid_block_2d_cross_attn_sd1_f16.safetensors",
        "mid/unet_mid_block_2d_cross_attn_sd1_bf16.safetensors",
    ] {
        if !weights().join(rel).exists() {
            continue;
        }
        let src = weights().join(rel);
        let mut b = RawBundle::read(&src);
        let mut config: serde_json::Value = serde_json::from_str(&b.metadata["parity.config"]).unwrap();
        let eps = config["resnet_eps"].as_f64().unwrap_or(1e-5);
        config["resnet_eps"] = (eps / 10.0).into();
        b.metadata.insert("parity.config".into(), config.to_string());
        let sub = dir.join(Path::new(rel).file_stem().unwrap());
        std::fs::create_dir_all(&sub).unwrap();
        if let Some(ckpt) = b.metadata.get("parity.weights").cloned() {
            let to = sub.join(&ckpt);
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(src.parent().unwrap().join(&ckpt), &to).unwrap();
        }
        let p = sub.join(Path::new(rel).file_name().unwrap());
        b.write(&p);
        let (code, out, err) = check(&p, &[]);
        assert_eq!(code, 1, "{rel}: {out}{err}");
        assert!(out.contains("float64 run differs"), "{rel}: {out}");
    }
}
