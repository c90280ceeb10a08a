//! The OpenAI half-precision bundles made the way guided-diffusion runs in half precision
//! (`UNetModel.convert_to_fp16()`: conv weights and `x` in f16/bf16, the `GroupNorm32` parameters,
//! the `ResBlock`'s `emb_layers` Linear and `emb` in f32) pass against PyTorch with every tensor in
//! the dtype PyTorch held it in (bit-identical here), and a port that rounds the f32 parts to the
//! half type no longer reproduces PyTorch (and, for the norm weights, is on average further from
//! the float64 reference). Such a port still passes the pass rule (within PyTorch's half-precision
//! error); the first test's `≤ atol from PyTorch` is what catches it.

use crate::common::*;
use candle_core::DType;
use unet_parity::check::{check_file, Options, Report};

const TWINS: [&str; 4] = [
    "openai/attention_block_legacy_c32_h2_f16.safetensors",
    "openai/attention_block_legacy_c32_h2_bf16.safetensors",
    "mid/openai_middle_block_new_order_f16.safetensors",
    "mid/openai_middle_block_new_order_bf16.safetensors",
];

fn check(path: &std::path::Path) -> Report {
    check_file(path, &Options::default()).unwrap()
}

/// (max |ours − PyTorch|, max |ours − float64|, max |PyTorch − float64|) of the single output.
fn errors(r: &Report) -> (f64, f64, f64) {
    let o = &r.outputs[0];
    (o.max_abs, o.ours_vs_f64.unwrap(), o.torch_vs_f64.unwrap())
}

/// How much less accurate than PyTorch's own run (its error against float64, max or mean) our
/// faithful half-precision run may be: the noise of rounding each output to f16 / bf16 after an
/// f32 sum taken in another order than PyTorch's kernel. Issue 56 ran the f16 weights on our
/// packed GEMM (Candle's ops before), which moved the middle block's mean error from 1.000x to
/// 1.031x of PyTorch's; the assertion was 1.001x while the two summations happened to agree.
const HALF_NOISE: f64 = 1.05;

#[test]
fn convert_to_fp16_twins_store_mixed_dtypes_and_pass_against_pytorch() {
    for rel in TWINS {
        let path = weights().join(rel);
        let raw = RawBundle::read(&path);
        let half = if rel.contains("_bf16") { DType::BF16 } else { DType::F16 };
        let f32_names: Vec<&String> = raw
            .tensors
            .iter()
            // (stage traces are recordings, not what PyTorch held: its `probs` are f32 by definition)
            .filter(|(k, t)| t.dtype() == DType::F32 && !k.starts_with("parity.trace."))
            .map(|(k, _)| k)
            .collect();
        // What PyTorch held in f32: norm parameters, the emb Linear, emb; everything else is half.
        assert!(!f32_names.is_empty(), "{rel}: no f32 tensor");
        for name in &f32_names {
            assert!(
                name.contains("norm")
                    || name.contains("in_layers.0.")
                    || name.contains("out_layers.0.")
                    || name.contains("emb_layers.1.")
                    || name.as_str() == "parity.input.emb",
                "{rel}: {name} is f32"
            );
        }
        assert_eq!(raw.tensors["parity.input.x"].dtype(), half, "{rel}");
        assert_eq!(raw.tensors["parity.output.output"].dtype(), half, "{rel}");

        let r = check(&path);
        assert!(r.pass, "{rel}: {:?}", r.outputs);
        assert_eq!(r.reference, "pytorch", "{rel}");
        assert!(r.conversions.is_empty(), "{rel}: {:?}", r.conversions);
        let (vs_torch, ours, torch) = errors(&r);
        // as accurate as PyTorch itself, up to the half-precision noise of another f32 summation
        // order (rule (b) would allow twice its error): bit-identical to PyTorch on Candle's ops
        // (1.000x); 1.009x on the middle block with our packed GEMM, which since issue 56 also
        // runs f16 / bf16 weights (measured 2026-12-07)
        assert!(
            ours <= torch * HALF_NOISE,
            "{rel}: ours {ours:.3e} vs PyTorch {torch:.3e}"
        );
        // Within one rounding step of the half type at PyTorch's largest output (the largest
        // element another summation order can move by a whole step), or within the dtype's
        // tolerance: bit-identical on Candle's ops, one f16 step (3.9e-3 at |y| ≈ 4) on ours.
        let (_, atol) = unet_parity::compare::default_tolerance(half);
        let largest = raw.tensors["parity.output.output"]
            .to_dtype(DType::F64)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f64>()
            .unwrap();
        let step = largest
            * if half == DType::F16 {
                2f64.powi(-10)
            } else {
                2f64.powi(-7)
            };
        assert!(
            vs_torch <= atol.max(step),
            "{rel}: {vs_torch:.3e} from PyTorch (one step {step:.3e})"
        );
    }
}

/// Mean |ours − float64| and mean |PyTorch − float64| over the output's elements: our block run
/// (as `check` runs it: every input as stored, weights in the bundle's dtype unless the block
/// loads them in its compute dtype) on the bundle at `path`.
fn mean_errors(path: &std::path::Path) -> (f64, f64) {
    use unet_parity::bundle::Bundle;
    use unet_parity::registry::{find, Inputs};
    use unet_parity::weights::TrackedWeights;
    let bundle = Bundle::read(path).unwrap();
    let info = find(&bundle.block).unwrap();
    let vb = TrackedWeights::new(bundle.weights()).var_builder(bundle.run_dtype().unwrap(), &candle_core::Device::Cpu);
    let block = (info.build)(vb, &bundle.config).unwrap();
    let tensors = bundle
        .inputs
        .iter()
        .map(|n| (n.clone(), bundle.input(n).unwrap().clone()))
        .collect();
    let inputs = Inputs {
        block: info.id,
        tensors,
        kwargs: bundle.kwargs.clone(),
    };
    let ours = block.run(&inputs).unwrap().remove(0);
    let f64_out = bundle.output_f64(&bundle.outputs[0]).unwrap();
    let torch = bundle.output(&bundle.outputs[0]).unwrap();
    let mean = |t: &candle_core::Tensor| -> f64 {
        (t.to_dtype(DType::F64).unwrap() - f64_out)
            .unwrap()
            .abs()
            .unwrap()
            .mean_all()
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
    };
    (mean(&ours), mean(torch))
}

#[test]
fn rounding_the_norm_weights_or_emb_to_half_departs_from_pytorch() {
    let is_norm = |k: &str| k.contains("norm.") || k.contains("in_layers.0.") || k.contains("out_layers.0.");
    let is_emb = |k: &str| k == "parity.input.emb" || k.contains("emb_layers.1.");
    for rel in TWINS {
        let (faithful_mean, torch_mean) = mean_errors(&weights().join(rel));
        let mut tags = vec!["norm"];
        if rel.starts_with("mid/") {
            tags.push("emb");
        }
        for tag in tags {
            let dir = scratch(&format!("half-openai-{tag}-{}", rel.replace('/', "-")));
            let half = if rel.contains("_bf16") { DType::BF16 } else { DType::F16 };
            let round = |k: &str| if tag == "norm" { is_norm(k) } else { is_emb(k) };
            // The bundle with those f32 tensors stored (and so used) in the half type: what a
            // port that ran the whole block in f16/bf16 would compute.
            let path = RawBundle::edited(rel, &dir, |b| {
                let names: Vec<String> = b
                    .tensors
                    .iter()
                    .filter(|(k, t)| t.dtype() == DType::F32 && round(k))
                    .map(|(k, _)| k.clone())
                    .collect();
                assert!(!names.is_empty(), "{rel}: nothing to round for {tag}");
                for k in names {
                    let t = b.tensors[&k].to_dtype(half).unwrap();
                    b.tensors.insert(k, t);
                }
            });
            let (vs_torch, _, _) = errors(&check(&path));
            let (rounded_mean, _) = mean_errors(&path);
            eprintln!(
                "{rel}, {tag} rounded: max {vs_torch:.3e} from PyTorch; mean |out - float64| {rounded_mean:.3e} \
                 (faithful {faithful_mean:.3e}, PyTorch {torch_mean:.3e})"
            );
            // No longer PyTorch's numbers (the faithful run is within the dtype's tolerance of
            // them, bit-identical on Candle's ops) ...
            let (_, atol) = unet_parity::compare::default_tolerance(half);
            assert!(
                vs_torch > atol,
                "{rel} with {tag} rounded: only {vs_torch:.3e} from PyTorch"
            );
            // ... and, for the norm weights, on average further from the float64 reference than
            // PyTorch (measured: 12% and 6% in f16, 1% and 9% in bf16; the maximum is dominated
            // by the rounding of the largest outputs and does not show it). Rounding `emb` and the
            // emb Linear perturbs `emb_out` by less than the half-precision noise of the block: its
            // mean error is not reliably worse (measured 3% lower in f16, 2% higher in bf16), so
            // only its departure from PyTorch is asserted.
            if tag == "norm" {
                assert!(
                    rounded_mean > torch_mean,
                    "{rel} with {tag} rounded: mean error vs float64 {rounded_mean:.3e}, PyTorch's {torch_mean:.3e}"
                );
            }
        }
        // Measured 2026-12-07: 1.000x on the attention blocks in every lane; the middle block
        // 1.000x on Candle's ops, 1.031x on our packed GEMM (another f32 summation order, each
        // output rounded to f16).
        assert!(
            faithful_mean <= torch_mean * HALF_NOISE,
            "{rel}: faithful mean error {faithful_mean:.3e}, PyTorch's {torch_mean:.3e}"
        );
    }
}
