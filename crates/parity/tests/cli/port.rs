//! `unet_parity::port`: a forward of the user's own, judged against a committed bundle by the
//! check's rule, stage by stage where it records stages.

use candle_core::{DType, Module, Tensor};
use std::path::PathBuf;
use unet_attention::diffusers::{UNetMidBlock2D, UNetMidBlock2DConfig};
use unet_parity::port::{record, PortCheck};
use unet_parity::ParityError;

fn bundle(rel: &str) -> PathBuf {
    crate::common::root().join(rel)
}

const VAE_MID: &str = "weights/own/diffusers_vae_decoder_mid_block.safetensors";

fn vae_mid(check: &PortCheck) -> UNetMidBlock2D {
    let cfg: UNetMidBlock2DConfig =
        unet_attention::config::from_json("diffusers.UNetMidBlock2D", &check.bundle().config).unwrap();
    UNetMidBlock2D::new(check.var_builder().unwrap(), &cfg).unwrap()
}

#[test]
fn a_right_port_passes_with_every_stage_matching() {
    let check = PortCheck::open(bundle(VAE_MID)).unwrap();
    let mid = vae_mid(&check);
    let report = check
        .run(|inputs| mid.forward(inputs.get("hidden_states")?, None))
        .unwrap();
    assert!(report.pass, "{report}");
    assert_eq!(report.first_divergence(), None, "{report}");
    let matched = report.trace.stages.iter().filter(|s| s.status == "match").count();
    assert_eq!(
        matched,
        report.trace.stages.len(),
        "our block records every stage:\n{report}"
    );
    let text = report.to_string();
    assert!(text.contains("PASS") && text.contains("no stage diverges"), "{text}");
}

/// A recorded stage that diverges while every output passes is shown and flagged, but not blamed:
/// the verdict is the outputs' (issue 44: `pass` and `first_divergence()` agree), its line says a
/// stage differs (issue 53).
#[test]
fn a_wrong_stage_is_shown_but_not_blamed_when_the_output_passes() {
    let check = PortCheck::open(bundle(VAE_MID)).unwrap();
    let mid = vae_mid(&check);
    let vb = check.var_builder().unwrap();
    // diffusers' VAE resnet norm: 4 groups here. Two groups is a plausible porting slip.
    let wrong_norm = candle_nn::group_norm(2, 16, 1e-6, vb.pp("resnets.0.norm1")).unwrap();
    // Our block records its own stages when it runs inside a check: run it before.
    let out = mid
        .forward(check.inputs().unwrap().get("hidden_states").unwrap(), None)
        .unwrap();
    let report = check
        .run(|inputs| {
            record("resnets.0/norm1", &wrong_norm.forward(inputs.get("hidden_states")?)?);
            // `resnets.0` stands for the bundle's `resnets.0/output`.
            record("resnets.0", &out);
            candle_core::Result::Ok(out.clone())
        })
        .unwrap();
    assert!(report.pass, "{report}");
    assert_eq!(report.first_divergence(), None, "{report}");
    let stage = |n: &str| report.trace.stages.iter().find(|s| s.stage == n).unwrap();
    assert_eq!(stage("resnets.0/norm1").status, "DIVERGES", "{report}");
    assert_eq!(stage("resnets.0/conv1").status, "not recorded");
    // The mid block's output is not the resnet's: the alias reached the resnet's stage and failed.
    assert_eq!(stage("resnets.0/output").status, "DIVERGES", "{report}");
    // ... and flagged on the verdict line, with a warning that says what to do (issue 53)
    let text = report.to_string();
    assert!(
        text.contains("(stage `resnets.0/norm1` differs: see the warning)"),
        "{text}"
    );
    assert!(
        text.contains("warning: the outputs pass, but stage `resnets.0/norm1`"),
        "{text}"
    );
    assert!(!text.contains("no stage blamed"), "{text}");
}

#[test]
fn a_wrong_output_fails_and_strict_refuses_loose_tolerances() {
    let check = PortCheck::open(bundle(VAE_MID)).unwrap();
    let mid = vae_mid(&check);
    let report = check
        .run(|inputs| (mid.forward(inputs.get("hidden_states")?, None)? + 1e-3)?.to_dtype(DType::F32))
        .unwrap();
    assert!(!report.pass, "{report}");
    assert!(report.outputs[0].failed_elements > 0);

    let loose = PortCheck::open(bundle(VAE_MID)).unwrap().atol(1.0).strict(true);
    let err = loose.run(|inputs| anyhow::Ok(inputs.get("hidden_states")?.clone()));
    let text = err.unwrap_err().to_string();
    assert!(
        text.contains("PortCheck::strict refuses") && text.contains("from PortCheck::atol"),
        "{text}"
    );
    assert!(!text.contains("--"), "a library user gave no flag: {text}");
}

#[test]
fn errors_name_the_bundle_and_what_was_expected() {
    let check = PortCheck::open(bundle(VAE_MID)).unwrap();
    let err = check
        .run(|inputs| anyhow::Ok(inputs.get("encoder_hidden_states")?.clone()))
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, ParityError::Port { .. }), "{text}");
    assert!(
        text.contains(VAE_MID) && text.contains("`encoder_hidden_states`") && text.contains("hidden_states"),
        "{text}"
    );

    let two = check.run(|inputs| {
        let x = inputs.get("hidden_states")?.clone();
        anyhow::Ok(vec![x.clone(), x])
    });
    assert!(two
        .unwrap_err()
        .to_string()
        .contains("the bundle has 1 outputs (output) and the forward returned 2"));

    let failing = check.run(|_| Err::<Tensor, _>(candle_core::Error::Msg("shape mismatch in my conv".into())));
    assert!(failing
        .unwrap_err()
        .to_string()
        .contains("your port: shape mismatch in my conv"));

    let stage_twice = check.run(|inputs| {
        let x = inputs.get("hidden_states")?;
        record("resnets.0/output", x);
        record("resnets.0", x);
        anyhow::Ok(x.clone())
    });
    assert!(stage_twice.unwrap_err().to_string().contains("recorded twice"));
}

#[test]
fn another_dtype_is_held_against_float64_without_stages() {
    let check = PortCheck::open(bundle(VAE_MID)).unwrap().dtype(DType::F64);
    let mid = vae_mid(&check);
    let report = check
        .run(|inputs| mid.forward(inputs.get("hidden_states")?, None))
        .unwrap();
    assert!(report.pass, "{report}");
    assert!(report.trace.stages.is_empty());
    assert!(report
        .trace
        .note
        .as_deref()
        .unwrap_or("")
        .contains("only in the bundle's dtype"));
}

/// `model::mid_block` builds the folder's mid block in one call; it matches diffusers' run of
/// the whole model (the `weights/own` bundles captured its input and output).
#[test]
fn a_model_folder_gives_its_mid_block_in_one_call() {
    use candle_core::Device;
    use unet_attention::diffusers::MidBlock;
    use unet_parity::model;

    let sd = model::mid_block(bundle("weights/models/diffusers_sd1"), None, &Device::Cpu, DType::F32).unwrap();
    assert_eq!(
        (sd.prefix.as_str(), sd.config.block_id()),
        ("mid_block", "diffusers.UNetMidBlock2DCrossAttn")
    );
    let check = PortCheck::open(bundle("weights/own/diffusers_sd1_mid_block.safetensors")).unwrap();
    let report = check
        .run(|i| {
            let (x, temb) = (i.get("hidden_states")?, i.get("temb")?);
            sd.block.forward(x, Some(temb), Some(i.get("encoder_hidden_states")?))
        })
        .unwrap();
    assert!(report.pass && report.first_divergence().is_none(), "{report}");
    // Without its context the cross-attention block says what it needs.
    let x = check.inputs().unwrap().get("hidden_states").unwrap().clone();
    let err = sd.block.forward(&x, None, None).unwrap_err().to_string();
    assert!(
        err.contains("encoder_hidden_states") && err.contains("required"),
        "{err}"
    );

    // The VAE has two mid blocks: without a prefix, the error names both.
    let vae = bundle("weights/models/diffusers_vae");
    let err = model::mid_block(&vae, None, &Device::Cpu, DType::F32)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("`encoder.mid_block`") && err.contains("`decoder.mid_block`"),
        "{err}"
    );
    let dec = model::mid_block(
        vae.join("config.json"),
        Some("decoder.mid_block"),
        &Device::Cpu,
        DType::F32,
    )
    .unwrap();
    assert!(matches!(dec.block, MidBlock::UNetMidBlock2D(_)));
    let check = PortCheck::open(bundle("weights/own/diffusers_vae_decoder_mid_block.safetensors")).unwrap();
    let report = check
        .run(|i| dec.block.forward(i.get("hidden_states")?, None, None))
        .unwrap();
    assert!(report.pass, "{report}");
    // The typed config serializes back to the kwargs diffusers' constructor takes.
    let json = serde_json::to_value(&dec.config).unwrap();
    assert_eq!(json["in_channels"], 16);

    let err = model::mid_block(bundle("weights/models"), None, &Device::Cpu, DType::F32)
        .err()
        .unwrap();
    assert!(err.to_string().contains("config.json"), "{err}");
}

// ---- Issue 45: a library that returns Err ----

/// A `Bundle` whose public fields contradict its tensors: an input or output name it lacks, no
/// outputs and no dtype. `run` and `inputs` return an error naming the file, never a panic.
#[test]
fn a_bundle_whose_fields_contradict_each_other_is_an_error() {
    use unet_parity::bundle::Bundle;
    let read = || Bundle::read(&bundle(VAE_MID)).unwrap();
    let forward = |i: &unet_parity::port::PortInputs| anyhow::Ok(i.get("hidden_states")?.clone());
    let mut ghost_input = read();
    ghost_input.inputs.push("ghost".into());
    let mut ghost_output = read();
    ghost_output.outputs = vec!["phantom".into()];
    let mut nothing = read();
    nothing.outputs.clear();
    nothing.dtype = None;
    for (b, needle) in [
        (ghost_input, "`ghost`"),
        (ghost_output, "`phantom`"),
        (nothing, "no outputs"),
    ] {
        let check = PortCheck::from_bundle(b);
        let text = check.run(forward).unwrap_err().to_string();
        assert!(text.contains(VAE_MID) && text.contains(needle), "{text}");
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(check.inputs().is_err());
    }
}

/// Tolerances that are NaN, negative or infinite are refused by name; a looser one is reported as
/// `PortCheck::atol`, the call the user made.
#[test]
fn port_tolerances_are_validated_and_named_as_set() {
    let forward = |i: &unet_parity::port::PortInputs| anyhow::Ok(i.get("hidden_states")?.clone());
    for bad in [f64::NAN, -1.0, f64::INFINITY, f64::NEG_INFINITY] {
        for (check, name) in [
            (PortCheck::open(bundle(VAE_MID)).unwrap().atol(bad), "PortCheck::atol"),
            (PortCheck::open(bundle(VAE_MID)).unwrap().rtol(bad), "PortCheck::rtol"),
        ] {
            let text = check.run(forward).unwrap_err().to_string();
            assert!(
                text.contains(name) && text.contains("finite number ≥ 0"),
                "{bad}: {text}"
            );
        }
    }
    let check = PortCheck::open(bundle(VAE_MID)).unwrap().atol(1.0);
    let mid = vae_mid(&check);
    let report = check.run(|i| mid.forward(i.get("hidden_states")?, None)).unwrap();
    let text = report.to_string();
    assert!(
        text.contains("from PortCheck::atol") && !text.contains("--atol"),
        "{text}"
    );
}

/// An input the bundle lacks: `<file>: your port:` once, not twice.
#[test]
fn a_missing_input_names_the_file_once() {
    let check = PortCheck::open(bundle(VAE_MID)).unwrap();
    let text = check
        .run(|i| candle_core::Result::Ok(i.get("no_such_input")?.clone()))
        .unwrap_err()
        .to_string();
    assert_eq!(text.matches("your port:").count(), 1, "{text}");
    assert_eq!(text.matches(VAE_MID).count(), 1, "{text}");
    assert!(text.contains("`no_such_input`"), "{text}");
}

/// The right values in the wrong shape fail, and the stage table does not call the output a match.
#[test]
fn the_right_values_in_the_wrong_shape_do_not_match() {
    let check = PortCheck::open(bundle(VAE_MID)).unwrap();
    let mid = vae_mid(&check);
    let report = check
        .run(|i| mid.forward(i.get("hidden_states")?, None)?.flatten_all())
        .unwrap();
    assert!(!report.pass, "{report}");
    let output = report.trace.stages.iter().find(|s| s.stage == "output").unwrap();
    assert_eq!(output.status, "DIVERGES", "{report}");
}

/// A candle error carrying its backtrace (as candle's `bt()` makes one under `RUST_BACKTRACE=1`)
/// comes back as one line with the message only (it carried the whole backtrace, escaped).
#[test]
fn a_candle_backtrace_stays_out_of_the_error_line() {
    let check = PortCheck::open(bundle(VAE_MID)).unwrap();
    let text = check
        .run(|_| {
            Err::<Tensor, _>(candle_core::Error::WithBacktrace {
                inner: Box::new(candle_core::Error::Msg("shape mismatch in my conv".into())),
                backtrace: Box::new(std::backtrace::Backtrace::force_capture()),
            })
        })
        .unwrap_err()
        .to_string();
    assert!(text.ends_with("your port: shape mismatch in my conv"), "{text}");
    assert!(!text.contains("\\n") && text.lines().count() == 1, "{text}");
}

/// The VAE decoder's mid block with module-path stages (`scripts/export_own.py --trace modules`),
/// whose attention module also records its core: `attentions.0/q`, `k`, `v`, `probs`, `attn`.
const VAE_MID_MODULES: &str = "weights/own/modules/diffusers_vae_decoder_mid_block.safetensors";

/// How a hand-written port of diffusers' VAE attention (`Attention` with `AttnProcessor2_0`) may
/// go wrong.
#[derive(Clone, Copy, PartialEq)]
enum Slip {
    None,
    /// The scores scaled by 1/d instead of 1/sqrt(d).
    Scale,
    /// Two heads of 8 channels where the model has one head of 16.
    HeadSplit,
}

/// A user's port of the VAE mid block: our resnets, a hand-written attention recording its
/// module-path stages and, with `core`, the attention core's stages in docs/tracing.md's layouts.
fn vae_port(
    vb: &candle_nn::VarBuilder,
    x: &Tensor,
    slip: Slip,
    core: bool,
    misspelled: bool,
) -> anyhow::Result<Tensor> {
    use unet_attention::diffusers::{ResnetBlock2D, ResnetBlock2DConfig};
    let cfg = ResnetBlock2DConfig {
        temb_channels: None,
        groups: 4,
        eps: 1e-6,
        ..ResnetBlock2DConfig::new(16)
    };
    let resnet = |i: usize| ResnetBlock2D::new(vb.pp(format!("resnets.{i}")), &cfg);
    let (first, last) = (resnet(0)?, resnet(1)?);
    let h = unet_parity::port::scope("resnets.0", || first.forward(x, None))?;
    record("resnets.0", &h);

    let (b, c, hh, ww) = h.dims4()?;
    let n = hh * ww;
    let heads = if slip == Slip::HeadSplit { 2 } else { 1 };
    let d = c / heads;
    let va = vb.pp("attentions.0");
    let at = |s: &str| format!("attentions.0/{s}");
    let normed = candle_nn::group_norm(4, c, 1e-6, va.pp("group_norm"))?.forward(&h.reshape((b, c, n))?)?;
    record(&at("group_norm"), &normed);
    let tokens = normed.transpose(1, 2)?.contiguous()?;
    let project = |name: &str| -> candle_core::Result<Tensor> {
        let t = candle_nn::linear(c, c, va.pp(name))?.forward(&tokens)?;
        record(&at(name), &t);
        t.reshape((b, n, heads, d))?.transpose(1, 2)?.contiguous()
    };
    let (q, k, v) = (project("to_q")?, project("to_k")?, project("to_v")?);
    let scale = if slip == Slip::Scale {
        1.0 / d as f64
    } else {
        1.0 / (d as f64).sqrt()
    };
    let probs = candle_nn::ops::softmax_last_dim(&(q.matmul(&k.t()?)? * scale)?)?;
    let attn = probs.matmul(&v)?.transpose(1, 2)?.reshape((b, n, c))?;
    if core {
        record(&at("q"), &q);
        record(&at("k"), &k);
        record(&at("v"), &v);
        record(&at(if misspelled { "prob" } else { "probs" }), &probs);
        record(&at("attn"), &attn);
    }
    let out = candle_nn::linear(c, c, va.pp("to_out.0"))?.forward(&attn)?;
    record(&at("to_out.0"), &out);
    let y = (out.transpose(1, 2)?.reshape((b, c, hh, ww))? + &h)?;
    record("attentions.0", &y);
    Ok(unet_parity::port::scope("resnets.1", || last.forward(&y, None))?)
}

fn vae_port_report(slip: Slip, core: bool, misspelled: bool) -> unet_parity::port::PortReport {
    let check = PortCheck::open(bundle(VAE_MID_MODULES)).unwrap();
    let vb = check.var_builder().unwrap();
    check
        .run(|inputs| vae_port(&vb, inputs.get("hidden_states")?, slip, core, misspelled))
        .unwrap()
}

/// Issue 47: a port with a wrong attention scale or head split, checked against a default
/// module-path export, is sent to the attention core's stage with the right hint; one that records
/// only the modules' outputs is told the core is as likely as the projection it stops at.
#[test]
fn attention_core_slips_are_placed_at_the_core() {
    let right = vae_port_report(Slip::None, true, false);
    assert!(right.pass, "{right}");
    let core = ["q", "k", "v", "probs", "attn"].map(|s| format!("attentions.0/{s}"));
    for s in right.trace.stages.iter().filter(|s| core.contains(&s.stage)) {
        assert_eq!(s.status, "match", "{right}");
    }

    let scale = vae_port_report(Slip::Scale, true, false);
    assert!(!scale.pass, "{scale}");
    assert_eq!(scale.first_divergence(), Some("attentions.0/probs"), "{scale}");
    assert!(scale.trace.hint.as_deref().unwrap().contains("scale"), "{scale}");

    let split = vae_port_report(Slip::HeadSplit, true, false);
    assert!(!split.pass, "{split}");
    assert_eq!(split.first_divergence(), Some("attentions.0/q"), "{split}");
    assert!(split.trace.hint.as_deref().unwrap().contains("head split"), "{split}");

    let blind = vae_port_report(Slip::Scale, false, false);
    assert_eq!(blind.first_divergence(), Some("attentions.0/to_out.0"), "{blind}");
    let hint = blind.trace.hint.as_deref().unwrap();
    assert!(
        hint.contains("output projection")
            && hint.contains("the attention core")
            && hint.contains("`attentions.0/probs`"),
        "{hint}"
    );
    // With the core recorded, the projection's own hint stands alone.
    assert!(!scale.trace.hint.as_deref().unwrap().contains("output projection"));
}

/// Issue 47: a misspelled `record` name is listed with the closest stage the bundle holds, not
/// silently `not recorded`.
#[test]
fn a_misspelled_stage_name_is_listed_with_the_closest_bundle_stage() {
    let report = vae_port_report(Slip::None, true, true);
    assert!(report.pass, "{report}");
    let text = report.to_string();
    assert!(
        text.contains("recorded but not in the bundle")
            && text.contains("`attentions.0/prob` (closest: `attentions.0/probs`)"),
        "{text}"
    );
}

/// Issue 57: an opaque port (it records nothing but returns its output) that fails is told to
/// record module outputs under the bundle's stage names, not given the causes of a block's
/// `output` stage (residual, output_scale_factor) it may not even have.
#[test]
fn an_opaque_failing_port_is_told_what_to_record() {
    let check = PortCheck::open(bundle(VAE_MID_MODULES)).unwrap();
    let mid = vae_mid(&check);
    // Run outside the check, so that nothing is recorded (our block records its stages inside one).
    let out = mid
        .forward(check.inputs().unwrap().get("hidden_states").unwrap(), None)
        .unwrap();
    let report = check.run(|_| (&out + 1e-2)?.to_dtype(DType::F32)).unwrap();
    assert!(!report.pass, "{report}");
    assert_eq!(report.first_divergence(), Some("output"), "{report}");
    let hint = report.trace.hint.as_deref().unwrap();
    assert!(
        hint.contains("recorded none of the bundle's stages")
            && hint.contains("`resnets.0/norm1`")
            && hint.contains("unet-parity inspect"),
        "{hint}"
    );
    assert!(!hint.contains("output_scale_factor"), "{hint}");
    // Every stage before the output is listed as unrecorded, in one line.
    let text = report.to_string();
    let line = text
        .lines()
        .find(|l| l.contains("not recorded before `output`"))
        .expect("the unrecorded line");
    assert!(line.contains("`resnets.0/norm1`") && line.contains("more"), "{line}");
}

/// Issue 57: a port that records some stages gets the ones it skipped before the first divergence.
#[test]
fn the_stages_skipped_before_the_first_divergence_are_named() {
    let report = vae_port_report(Slip::Scale, false, false);
    assert_eq!(report.first_divergence(), Some("attentions.0/to_out.0"), "{report}");
    let before = &report.trace.unrecorded_before;
    assert!(before.iter().any(|s| s == "attentions.0/q"), "{before:?}");
    assert!(!before.iter().any(|s| s == "attentions.0/to_q"), "recorded: {before:?}");
    assert!(report
        .to_string()
        .contains("not recorded before `attentions.0/to_out.0`"));
}
