//! The Annotated Diffusion post's whole `Unet` from its state dict (the bundles'
//! `weights/whole/annotated_unet_*`, seeded weights under the post's module names) against the
//! PyTorch forward, and the mistakes that must fail: the time embedding a step off, a swapped pair
//! of weights (the middle attention's q and k), a key under another name, and weight
//! standardization as lucidrains computes it rather than as the post does.

use std::collections::BTreeMap;

use crate::helpers::{bundle, max_abs_diff, root};
use candle_core::{DType, Device, Tensor};
use unet_attention::annotated_diffusion::WeightStandardizedConv2d;
use unet_attention::models::{AnnotatedUnet, AnnotatedUnetConfig};
use unet_attention::weights::TrackedWeights;
use unet_parity::port::PortCheck;

const FASHION: &str = "weights/whole/annotated_unet_fashion.safetensors";
const SELFCOND: &str = "weights/whole/annotated_unet_selfcond.safetensors";

/// The bundle's state dict (every tensor not under `parity.`), edited by `edit`.
fn state_dict(rel: &str, edit: impl FnOnce(&mut BTreeMap<String, Tensor>)) -> BTreeMap<String, Tensor> {
    let mut w: BTreeMap<String, Tensor> = bundle(rel)
        .into_iter()
        .filter(|(k, _)| !k.starts_with("parity."))
        .collect();
    edit(&mut w);
    w
}

/// The bundle's config, as the exporter wrote it.
fn config(rel: &str) -> AnnotatedUnetConfig {
    let (metadata, _, _) = unet_parity::bundle::read_file(&root(rel)).unwrap();
    serde_json::from_str(&metadata["parity.config"]).unwrap()
}

/// The Unet from `weights`, strict: every tensor read.
fn build(weights: BTreeMap<String, Tensor>, cfg: &AnnotatedUnetConfig) -> unet_attention::Result<AnnotatedUnet> {
    let tracked = TrackedWeights::new(weights);
    let unet = AnnotatedUnet::new(tracked.var_builder(DType::F32, &Device::Cpu), cfg)?;
    assert_eq!(tracked.unused(), Vec::<String>::new(), "weights the Unet did not read");
    Ok(unet)
}

/// Our output on the bundle's inputs with `time` shifted by `shift`, and the checker's verdict
/// (`PortCheck`, as `unet-parity check` judges it).
fn run(unet: &AnnotatedUnet, rel: &str, shift: f64) -> (f32, bool) {
    let check = PortCheck::open(root(rel)).unwrap();
    let torch = bundle(rel).remove("parity.output.output").unwrap();
    let mut err = 0.0;
    let report = check
        .run(|inputs| {
            let time = (inputs.get("time").unwrap() + shift)?;
            let out = unet.forward(inputs.get("x").unwrap(), &time, inputs.get("x_self_cond").ok())?;
            err = max_abs_diff(&out, &torch);
            Ok::<_, unet_attention::Error>(out)
        })
        .unwrap();
    (err, report.pass)
}

#[test]
fn state_dicts_load_and_match_pytorch() {
    for rel in [FASHION, SELFCOND] {
        let cfg = config(rel);
        let unet = build(state_dict(rel, |_| {}), &cfg).unwrap();
        let (err, pass) = run(&unet, rel, 0.0);
        eprintln!("{rel}: max |ours - PyTorch| {err:.2e}");
        assert!(pass, "{rel}: {err:e}");
        let (off, pass) = run(&unet, rel, 1.0);
        eprintln!("  time one step off: {off:.2e}");
        assert!(!pass && off > 100.0 * err.max(1e-7), "time one step off: {off:e}");
        // q and k of the middle attention swapped (to_qkv's first two thirds)
        let swapped = state_dict(rel, |w| {
            let key = "mid_attn.fn.fn.to_qkv.weight";
            let third = w[key].dim(0).unwrap() / 3;
            let [q, k, v] = [0, 1, 2].map(|i| w[key].narrow(0, i * third, third).unwrap());
            w.insert(key.into(), Tensor::cat(&[&k, &q, &v], 0).unwrap());
        });
        let (qk, pass) = run(&build(swapped, &cfg).unwrap(), rel, 0.0);
        eprintln!("  q and k swapped: {qk:.2e}");
        assert!(!pass && qk > 100.0 * err.max(1e-7), "q/k swapped: {qk:e}");
    }
}

/// A key under another name is refused naming it; a config that does not fit the weights names
/// the weight; inputs that do not fit are errors naming the input.
#[test]
fn wrong_keys_configs_and_inputs_are_named() {
    let cfg = config(FASHION);
    let renamed = state_dict(FASHION, |w| {
        let t = w.remove("mid_attn.fn.norm.weight").unwrap();
        w.insert("mid_attn.norm.weight".into(), t);
    });
    let err = build(renamed, &cfg).unwrap_err().to_string();
    assert!(err.contains("mid_attn.fn.norm.weight"), "{err}");
    let mut wide = cfg.clone();
    wide.dim_mults = vec![1, 2, 8];
    let err = build(state_dict(FASHION, |_| {}), &wide).unwrap_err().to_string();
    assert!(err.contains("downs.2.3.weight") && err.contains("wrong shape"), "{err}");
    let mut init = cfg.clone();
    init.init_dim = Some(8);
    let err = build(state_dict(FASHION, |_| {}), &init).unwrap_err().to_string();
    assert!(err.contains("init_dim"), "{err}");
    let unet = build(state_dict(FASHION, |_| {}), &cfg).unwrap();
    let t = Tensor::zeros(1, DType::F32, &Device::Cpu).unwrap();
    let x = Tensor::zeros((1, 1, 6, 8), DType::F32, &Device::Cpu).unwrap();
    let err = unet.forward(&x, &t, None).unwrap_err().to_string();
    assert!(err.contains("divisible by 4"), "{err}");
    let x = Tensor::zeros((1, 1, 8, 8), DType::F32, &Device::Cpu).unwrap();
    let err = unet.forward(&x, &t, Some(&x)).unwrap_err().to_string();
    assert!(err.contains("x_self_cond"), "{err}");
}

/// Without `x_self_cond` a self-conditioned Unet takes zeros, as `default(x_self_cond, zeros_like)`.
#[test]
fn self_condition_defaults_to_zeros() {
    let unet = build(state_dict(SELFCOND, |_| {}), &config(SELFCOND)).unwrap();
    let b = bundle(SELFCOND);
    let (x, t) = (&b["parity.input.x"], &b["parity.input.time"]);
    let none = unet.forward(x, t, None).unwrap();
    let zeros = unet.forward(x, t, Some(&x.zeros_like().unwrap())).unwrap();
    assert_eq!(max_abs_diff(&none, &zeros), 0.0);
}

/// The post's weight standardization divides by the rsqrt (multiplies the centred weight by
/// `sqrt(var + eps)`), with eps 1e-5 for float32 inputs and 1e-3 for half; the bundles pass with
/// it, and the same weights standardized as lucidrains does (times the rsqrt) differ by orders of
/// magnitude more than rounding.
#[test]
fn weight_standardization_is_the_posts() {
    let w = bundle(FASHION);
    let weight = w["mid_block1.block1.proj.weight"].clone();
    let tensors = BTreeMap::from([
        ("weight".to_string(), weight.clone()),
        ("bias".to_string(), w["mid_block1.block1.proj.bias"].clone()),
    ]);
    let vb = TrackedWeights::new(tensors).var_builder(DType::F32, &Device::Cpu);
    let (o, i) = (weight.dim(0).unwrap(), weight.dim(1).unwrap());
    let conv = WeightStandardizedConv2d::load(vb, i, o).unwrap();
    assert_eq!(WeightStandardizedConv2d::eps(DType::F32), 1e-5);
    assert_eq!(WeightStandardizedConv2d::eps(DType::BF16), 1e-3);
    let post = conv.standardized_weight(1e-5).unwrap();
    // the same in plain f64 arithmetic, row by row
    let rows: Vec<Vec<f32>> = weight.reshape((o, ())).unwrap().to_vec2().unwrap();
    let ours: Vec<Vec<f32>> = post.reshape((o, ())).unwrap().to_vec2().unwrap();
    for (row, got) in rows.iter().zip(&ours) {
        let n = row.len() as f64;
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / n;
        let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
        for (&v, &g) in row.iter().zip(got) {
            let post = (v as f64 - mean) * (var + 1e-5).sqrt();
            let lucidrains = (v as f64 - mean) / (var + 1e-5).sqrt();
            assert!((g as f64 - post).abs() <= 1e-6 * post.abs().max(1e-3), "{g} vs {post}");
            assert!(
                (post - lucidrains).abs() > 1e-3 * lucidrains.abs(),
                "{post} vs {lucidrains}"
            );
        }
    }
}

/// `time` `(1,)` with a batch of two gives each sample what `(2,)` with the timestep repeated
/// gives, as PyTorch broadcasts it (lucidrains' `Unet` shares the input check).
#[test]
fn one_timestep_broadcasts_over_the_batch() {
    let unet = build(state_dict(SELFCOND, |_| {}), &config(SELFCOND)).unwrap();
    let b = bundle(SELFCOND);
    let x = &b["parity.input.x"];
    let one = Tensor::new(&[250f32], &Device::Cpu).unwrap();
    let two = Tensor::new(&[250f32, 250.0], &Device::Cpu).unwrap();
    let a = unet.forward(x, &one, None).unwrap();
    let c = unet.forward(x, &two, None).unwrap();
    assert_eq!(max_abs_diff(&a, &c), 0.0);
    let three = Tensor::new(&[1f32, 2.0, 3.0], &Device::Cpu).unwrap();
    let err = unet.forward(x, &three, None).unwrap_err().to_string();
    assert!(err.contains("`time`") && err.contains("(2,) or (1,)"), "{err}");
}
