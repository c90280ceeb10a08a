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

/// A recorded stage that diverges while every output passes is shown, but not blamed: the verdict
/// is the outputs' (issue 44: `pass` and `first_divergence()` agree).
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
    assert!(report
        .to_string()
        .contains("no stage blamed: the outputs pass, though `resnets.0/norm1`"));
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
    assert!(err.unwrap_err().to_string().contains("--strict refuses"));
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
