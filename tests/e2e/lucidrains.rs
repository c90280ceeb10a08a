//! lucidrains' whole `Unet` as a user loads it: from the `Trainer.save` checkpoint
//! (`weights/models/lucidrains_ddpm/model-1.pt`, read without running the pickle), online and EMA
//! weights, against the PyTorch forward (`weights/whole/lucidrains_unet_*`), and the mistakes that
//! must fail.

use std::sync::Arc;

use crate::helpers::{max_abs_diff, root};
use candle_core::{DType, Device, Tensor};
use unet_attention::models::{LucidrainsUnet, LucidrainsUnetConfig};
use unet_attention::weights::{TrackedWeights, WeightSource};
use unet_parity::checkpoint::{Checkpoint, PrefixView};
use unet_parity::port::PortCheck;

fn config() -> LucidrainsUnetConfig {
    serde_json::from_value(
        serde_json::json!({"dim": 6, "dim_mults": [1, 2], "attn_heads": [4, 2], "attn_dim_head": [4, 8]}),
    )
    .unwrap()
}

/// The Unet under `prefix` of the Trainer checkpoint (`model.` in its `model` entry,
/// `ema_model.model.` in `ema`), strict: every tensor under the prefix read.
fn load(prefix: &str, cfg: &LucidrainsUnetConfig) -> LucidrainsUnet {
    let ckpt = Arc::new(Checkpoint::open(&root("weights/models/lucidrains_ddpm/model-1.pt")).unwrap());
    let view: Arc<dyn WeightSource> = Arc::new(PrefixView::new(ckpt, prefix).unwrap());
    let tracked = TrackedWeights::from_source(view);
    let unet = LucidrainsUnet::new(tracked.var_builder(DType::F32, &Device::Cpu), cfg).unwrap();
    assert_eq!(
        tracked.unused(),
        Vec::<String>::new(),
        "weights under {prefix} the Unet did not read"
    );
    unet
}

/// Our output on the bundle's inputs with `time` shifted by `shift`, and the checker's verdict
/// (`PortCheck`, as `unet-parity check` judges) when unshifted.
fn run(unet: &LucidrainsUnet, rel: &str, shift: f64) -> (f32, bool) {
    let check = PortCheck::open(root(rel)).unwrap();
    let mut err = 0.0;
    let report = check
        .run(|inputs| {
            let time = (inputs.get("time").unwrap() + shift)?;
            let out = unet.forward(inputs.get("x").unwrap(), &time, None)?;
            let b = candle_core::safetensors::load(root(rel), &Device::Cpu)?;
            err = max_abs_diff(&out, &b["parity.output.output"]);
            Ok::<_, unet_attention::Error>(out)
        })
        .unwrap();
    (err, report.pass)
}

/// Online and EMA weights from the checkpoint pass; the time embedding one step off, and the online
/// weights on the EMA bundle, miss by far.
#[test]
fn trainer_checkpoint_loads_and_matches_pytorch() {
    let cfg = config();
    for (prefix, rel) in [
        ("model.", "weights/whole/lucidrains_unet_model.safetensors"),
        ("ema_model.model.", "weights/whole/lucidrains_unet_ema.safetensors"),
    ] {
        let unet = load(prefix, &cfg);
        let (err, pass) = run(&unet, rel, 0.0);
        eprintln!("{rel}: max |ours - PyTorch| {err:.2e}");
        assert!(pass, "{rel}");
        let (off, pass) = run(&unet, rel, 1.0);
        eprintln!("  time one step off: {off:.2e}");
        assert!(
            !pass && off > 100.0 * err.max(1e-7),
            "time one step off passed: {off:e}"
        );
    }
    let online = load("model.", &cfg);
    let (err, pass) = run(&online, "weights/whole/lucidrains_unet_ema.safetensors", 0.0);
    eprintln!("online weights on the EMA bundle: {err:.2e}");
    assert!(!pass, "the online weights passed the EMA bundle: {err:e}");
}

/// Options that change the layout are errors naming the key, not silent.
#[test]
fn wrong_configs_are_named() {
    let build = |cfg: &LucidrainsUnetConfig| {
        let ckpt = Arc::new(Checkpoint::open(&root("weights/models/lucidrains_ddpm/model-1.pt")).unwrap());
        let view: Arc<dyn WeightSource> = Arc::new(PrefixView::new(ckpt, "model.").unwrap());
        let vb = TrackedWeights::from_source(view).var_builder(DType::F32, &Device::Cpu);
        LucidrainsUnet::new(vb, cfg).unwrap_err().to_string()
    };
    let mut cfg = config();
    cfg.dim_mults = vec![1, 2, 4];
    let err = build(&cfg);
    assert!(
        err.contains("`attn_heads` has 2 entries") && err.contains("per stage (3"),
        "{err}"
    );
    // one stage more than the checkpoint holds: the first weight that does not fit is named with
    // both shapes
    let three: LucidrainsUnetConfig = serde_json::from_value(
        serde_json::json!({"dim": 6, "dim_mults": [1, 2, 2], "attn_heads": [4, 2, 2], "attn_dim_head": [4, 8, 8]}),
    )
    .unwrap();
    let err = build(&three);
    assert!(err.contains("downs.1.") && err.contains("wrong shape"), "{err}");
    let unet = load("model.", &config());
    let x = Tensor::zeros((1, 3, 7, 12), DType::F32, &Device::Cpu).unwrap();
    let t = Tensor::zeros(1, DType::F32, &Device::Cpu).unwrap();
    let err = unet.forward(&x, &t, None).unwrap_err().to_string();
    assert!(err.contains("divisible by 2"), "{err}");
    let x = Tensor::zeros((1, 3, 8, 12), DType::F32, &Device::Cpu).unwrap();
    let err = unet.forward(&x, &t, Some(&x)).unwrap_err().to_string();
    assert!(err.contains("x_self_cond"), "{err}");
}
