//! The library returns `Err`, never panics: every registered block, built from the smallest
//! committed bundle of its id (run in f32), is run with its inputs altered one class at a time, and the
//! attention core (`sdpa`, `eager_attention`) is called with bad arguments directly:
//!
//! * each input in an integer dtype (`u8`, `i64`, `u32`; masks, which may be boolean, `i64` and
//!   `u32` only), each float input in `f64` while the rest is `f32` (mixed dtypes): `Err`;
//! * each input with three more leading dims, the first input flattened to rank 1: `Err`;
//! * each input with one dimension narrowed to 0: `Err`;
//! * each input as a non-contiguous view of the same values: `Ok` and bit-identical;
//! * each integer of the block's config set to 2^33 in a config built in Rust (no JSON bound):
//!   the constructor returns `Err`.
//!
//! Every call runs under `catch_unwind`, so a panic is a failure naming block and case; all
//! failures are collected and reported together.

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use unet_attention::sdpa::{self, Scale};
use unet_parity::bundle::{self, Bundle};
use unet_parity::registry::{self, BlockInfo, Runnable};
use unet_parity::{prepare_bundle, Options};

/// One attention entry point, called on prepared arguments.
type AttentionCall<'a> = Box<dyn Fn() -> candle_core::Result<Tensor> + 'a>;

/// What a call gave: `Ok`, `Err` (its message), or a panic (its message).
enum Outcome {
    Ok(Vec<Tensor>),
    Err(String),
    Panic(String),
}

fn outcome<T>(f: impl FnOnce() -> unet_attention::Result<T>, ok: impl FnOnce(T) -> Vec<Tensor>) -> Outcome {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Outcome::Ok(ok(v)),
        Ok(Err(e)) => Outcome::Err(e.to_string()),
        Err(p) => Outcome::Panic(
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default(),
        ),
    }
}

/// The smallest committed f32 bundle of each block id.
fn bundles_per_block() -> BTreeMap<String, PathBuf> {
    let mut best: BTreeMap<String, (u64, PathBuf)> = BTreeMap::new();
    for path in crate::common::committed_bundles() {
        let Ok((meta, _)) = bundle::read_header(&path) else {
            continue;
        };
        let (Some(block), Some(dtype)) = (meta.get("parity.block"), meta.get("parity.dtype")) else {
            continue;
        };
        // f32 bundles first (the others run in f32 too), bundles whose weights live in another
        // file last, then the smallest.
        let size = std::fs::metadata(&path).unwrap().len()
            + if dtype == "float32" { 0 } else { 1 << 40 }
            + if meta.contains_key("parity.weights") {
                1 << 41
            } else {
                0
            };
        if best.get(block).is_none_or(|(s, _)| size < *s) {
            best.insert(block.clone(), (size, path));
        }
    }
    best.into_iter().map(|(k, (_, p))| (k, p)).collect()
}

/// Runs one block on altered inputs and records what is wrong.
struct Block {
    id: String,
    block: Box<dyn Runnable>,
    inputs: registry::Inputs,
    failures: Vec<String>,
}

impl Block {
    /// Run with input `name` replaced by `t`.
    fn run_with(&self, name: &str, t: Tensor) -> Outcome {
        let mut inputs = registry::Inputs {
            block: self.inputs.block,
            tensors: self.inputs.tensors.clone(),
            kwargs: self.inputs.kwargs.clone(),
        };
        inputs.tensors.insert(name.to_string(), t);
        outcome(|| self.block.run(&inputs), |v| v)
    }

    fn expect_err(&mut self, case: &str, name: &str, t: candle_core::Result<Tensor>) {
        let t = t.unwrap();
        match self.run_with(name, t) {
            Outcome::Err(_) => {}
            Outcome::Ok(_) if lenient(&self.id, name) => {}
            Outcome::Ok(_) => self
                .failures
                .push(format!("{} {case} `{name}`: Ok, expected Err", self.id)),
            Outcome::Panic(p) => self.failures.push(format!("{} {case} `{name}`: PANIC {p}", self.id)),
        }
    }

    fn dtypes(&mut self, name: &str, t: &Tensor) {
        let integers: &[DType] = if name.contains("mask") {
            &[DType::I64, DType::U32]
        } else {
            &[DType::U8, DType::I64, DType::U32]
        };
        for &dtype in integers {
            self.expect_err(&format!("dtype {dtype:?}"), name, t.to_dtype(dtype));
        }
        if t.dtype().is_float() {
            self.expect_err("mixed dtype F64", name, t.to_dtype(DType::F64));
        }
    }

    fn shapes(&mut self, name: &str, t: &Tensor, first: bool) {
        self.expect_err(
            "rank +3",
            name,
            t.unsqueeze(0).and_then(|t| t.unsqueeze(0)?.unsqueeze(0)),
        );
        if first && t.rank() > 1 {
            self.expect_err("rank 1", name, t.flatten_all());
        }
        for d in 0..t.rank() {
            self.expect_err(&format!("dim {d} = 0"), name, t.narrow(d, 0, 0));
        }
    }

    /// A non-contiguous view of the same values gives the same bits.
    fn strided(&mut self, name: &str, t: &Tensor, baseline: &[Tensor]) {
        if t.rank() < 2 {
            return;
        }
        // The first half of `[t | t]` along the last dim: the same values, rows strided.
        let last = t.rank() - 1;
        let view = Tensor::cat(&[t, t], last)
            .unwrap()
            .narrow(last, 0, t.dim(last).unwrap())
            .unwrap();
        if view.is_contiguous() {
            return;
        }
        match self.run_with(name, view) {
            Outcome::Ok(out) => {
                let same = out.len() == baseline.len() && out.iter().zip(baseline).all(|(a, b)| bits(a) == bits(b));
                if !same {
                    self.failures
                        .push(format!("{} strided `{name}`: results differ", self.id));
                }
            }
            Outcome::Err(e) => self.failures.push(format!("{} strided `{name}`: Err {e}", self.id)),
            Outcome::Panic(p) => self.failures.push(format!("{} strided `{name}`: PANIC {p}", self.id)),
        }
    }
}

fn bits(t: &Tensor) -> Vec<u64> {
    t.flatten_all()
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .to_vec1::<f64>()
        .unwrap()
        .into_iter()
        .map(f64::to_bits)
        .collect()
}

/// Run every bundle in f32.
fn f32_run() -> Options {
    Options {
        dtype: Some(DType::F32),
        ..Options::default()
    }
}

/// Inputs whose dtype and shape the block may legitimately accept in other forms: masks and
/// `image_only_indicator` (bool, integer or float, broadcast; PyTorch's rules differ per class), an argument the PyTorch
/// forward ignores (`UNetMidBlock1D`'s `temb`), and the timesteps of lucidrains' and the Annotated Diffusion
/// post's `Unet` (their samplers pass integers; the embedding is float32 whatever their dtype). For these, any `Ok` or `Err` will do; a panic still fails.
fn lenient(block: &str, name: &str) -> bool {
    name.contains("mask")
        || name.contains("indicator")
        || (block == "diffusers.UNetMidBlock1D" && name == "temb")
        || (matches!(block, "denoising_diffusion_pytorch.Unet" | "annotated_diffusion.Unet") && name == "time")
}

/// Every input class over every block.
#[test]
fn every_block_returns_err_on_bad_inputs() {
    let bundles = bundles_per_block();
    let mut failures = vec![];
    for info in registry::all() {
        let Some(path) = bundles.get(info.id) else {
            failures.push(format!("{}: no committed bundle", info.id));
            continue;
        };
        let bundle = Bundle::read(path).unwrap();
        let prepared = prepare_bundle(&bundle, &f32_run()).unwrap();
        let mut block = Block {
            id: info.id.to_string(),
            block: prepared.block,
            inputs: prepared.inputs,
            failures: vec![],
        };
        let baseline = match outcome(|| block.block.run(&block.inputs), |v| v) {
            Outcome::Ok(v) => v,
            _ => panic!("{}: the committed bundle {} does not run", info.id, path.display()),
        };
        let names: Vec<(String, Tensor)> = block.inputs.tensors.clone().into_iter().collect();
        for (i, (name, t)) in names.iter().enumerate() {
            block.dtypes(name, t);
            block.shapes(name, t, i == 0);
            block.strided(name, t, &baseline);
        }
        failures.append(&mut block.failures);
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The block built with one integer of its config at 2^33, the config read by serde alone (as a
/// config built in Rust reaches the constructor): `Err`, never `Ok`, never a panic. A key whose
/// field is a float (`output_scale_factor: 1` in a bundle) takes 0.5 too, and is no size: skipped.
fn huge_config(info: &BlockInfo, bundle: &Bundle) -> Vec<String> {
    let mut failures = vec![];
    let Some(object) = bundle.config.as_object() else {
        return vec![format!("{}: config is not an object", bundle.block)];
    };
    let vb = || VarBuilder::from_tensors(bundle.weights().into_iter().collect(), DType::F32, &Device::Cpu);
    let with = |key: &str, value: serde_json::Value| {
        let mut cfg = bundle.config.clone();
        cfg[key] = value;
        cfg
    };
    for key in object.keys().filter(|k| object[*k].is_u64()) {
        let half = with(key, serde_json::json!(0.5));
        if catch_unwind(AssertUnwindSafe(|| (info.build_unbounded)(vb(), &half))).is_ok_and(|r| r.is_ok()) {
            continue;
        }
        let huge = with(key, serde_json::json!(1u64 << 33));
        match outcome(|| (info.build_unbounded)(vb(), &huge), |_| vec![]) {
            Outcome::Err(_) => {}
            Outcome::Ok(_) => failures.push(format!("{} config `{key}` = 2^33: Ok, expected Err", bundle.block)),
            Outcome::Panic(p) => failures.push(format!("{} config `{key}` = 2^33: PANIC {p}", bundle.block)),
        }
    }
    failures
}

/// Configs built in Rust get the JSON bound too: every registered block, through
/// `BlockInfo::build_unbounded`, on a committed bundle of it.
#[test]
fn configs_built_in_rust_with_huge_integers_are_errors() {
    let bundles = bundles_per_block();
    let mut failures = vec![];
    for info in registry::all() {
        let Some(path) = bundles.get(info.id) else {
            failures.push(format!("{}: no committed bundle to take a config from", info.id));
            continue;
        };
        failures.extend(huge_config(&info, &Bundle::read(path).unwrap()));
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// A fastai block built from integer weights: `Err`, not a panic in the first forward.
#[test]
fn integer_weights_are_errors() {
    let bundles = bundles_per_block();
    let mut failures = vec![];
    for info in registry::all() {
        let Some(path) = bundles.get(info.id) else { continue };
        let bundle = Bundle::read(path).unwrap();
        let weights = bundle
            .weights()
            .into_iter()
            .map(|(k, v)| (k, v.to_dtype(DType::U8).unwrap()))
            .collect();
        let vb = VarBuilder::from_tensors(weights, DType::U8, &Device::Cpu);
        let built = outcome(|| (info.build)(vb, &bundle.config), |_| vec![]);
        let prepared = prepare_bundle(&bundle, &f32_run()).unwrap();
        let result = match built {
            Outcome::Panic(p) => Outcome::Panic(p),
            Outcome::Err(e) => Outcome::Err(e),
            Outcome::Ok(_) => {
                let weights = bundle
                    .weights()
                    .into_iter()
                    .map(|(k, v)| (k, v.to_dtype(DType::U8).unwrap()))
                    .collect();
                let vb = VarBuilder::from_tensors(weights, DType::U8, &Device::Cpu);
                let block = (info.build)(vb, &bundle.config).unwrap();
                outcome(|| block.run(&prepared.inputs), |v| v)
            }
        };
        match result {
            Outcome::Err(_) => {}
            Outcome::Ok(_) => failures.push(format!("{} u8 weights: Ok, expected Err", info.id)),
            Outcome::Panic(p) => failures.push(format!("{} u8 weights: PANIC {p}", info.id)),
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// `sdpa` and `eager_attention` on bad arguments.
#[test]
fn attention_core_returns_err() {
    let dev = Device::Cpu;
    let q = Tensor::randn(0f32, 1., (1, 2, 3, 4), &dev).unwrap();
    let k = Tensor::randn(0f32, 1., (1, 2, 5, 4), &dev).unwrap();
    let v = Tensor::randn(0f32, 1., (1, 2, 5, 4), &dev).unwrap();
    let mask = Tensor::zeros((1, 1, 3, 5), DType::F32, &dev).unwrap();
    let zero_keys = k.narrow(2, 0, 0).unwrap();
    let zero_values = v.narrow(2, 0, 0).unwrap();
    let cases: Vec<(&str, [Tensor; 3], Option<Tensor>)> = vec![
        ("u8 q", [q.to_dtype(DType::U8).unwrap(), k.clone(), v.clone()], None),
        ("i64 k", [q.clone(), k.to_dtype(DType::I64).unwrap(), v.clone()], None),
        ("u32 v", [q.clone(), k.clone(), v.to_dtype(DType::U32).unwrap()], None),
        (
            "all u8",
            [
                q.to_dtype(DType::U8).unwrap(),
                k.to_dtype(DType::U8).unwrap(),
                v.to_dtype(DType::U8).unwrap(),
            ],
            None,
        ),
        ("zero keys", [q.clone(), zero_keys, zero_values], None),
        ("zero queries", [q.narrow(2, 0, 0).unwrap(), k.clone(), v.clone()], None),
        (
            "mixed f64 k",
            [q.clone(), k.to_dtype(DType::F64).unwrap(), v.clone()],
            None,
        ),
        (
            "mixed f16 v",
            [q.clone(), k.clone(), v.to_dtype(DType::F16).unwrap()],
            None,
        ),
        (
            "u8 mask",
            [q.clone(), k.clone(), v.clone()],
            Some(mask.to_dtype(DType::U8).unwrap()),
        ),
        (
            "i64 mask",
            [q.clone(), k.clone(), v.clone()],
            Some(mask.to_dtype(DType::I64).unwrap()),
        ),
        ("rank 1 q", [q.flatten_all().unwrap(), k.clone(), v.clone()], None),
        (
            "head dims differ",
            [q.clone(), k.narrow(3, 0, 3).unwrap(), v.clone()],
            None,
        ),
        (
            "key and value lengths differ",
            [q.clone(), k.clone(), v.narrow(2, 0, 4).unwrap()],
            None,
        ),
    ];
    let mut failures = vec![];
    for (case, [q, k, v], mask) in &cases {
        for path in [None, Some(sdpa::SdpaPath::Reference), Some(sdpa::SdpaPath::Chunked)] {
            let calls: [(&str, AttentionCall); 2] = [
                (
                    "sdpa",
                    Box::new(|| match path {
                        None => sdpa::sdpa(q, k, v, mask.as_ref(), 0.5),
                        Some(p) => sdpa::sdpa_with(p, q, k, v, mask.as_ref(), 0.5),
                    }),
                ),
                (
                    "eager_attention",
                    Box::new(|| match path {
                        None => sdpa::eager_attention(q, k, v, mask.as_ref(), Scale::Mul(0.5)),
                        Some(p) => sdpa::eager_attention_with(p, q, k, v, mask.as_ref(), Scale::Mul(0.5)),
                    }),
                ),
            ];
            for (name, call) in calls {
                match outcome(|| call().map_err(unet_attention::Error::from), |t| vec![t]) {
                    Outcome::Err(_) => {}
                    Outcome::Ok(_) => failures.push(format!("{name} ({path:?}) {case}: Ok, expected Err")),
                    Outcome::Panic(p) => failures.push(format!("{name} ({path:?}) {case}: PANIC {p}")),
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
