//! Property tests: for several blocks, any config and input shapes, valid or not (small dims,
//! zero-sized dims, heads that may or may not divide, any input rank, a weight of the wrong
//! shape now and then), either build and run or return an error: never a panic. Each case is a
//! few tiny tensors, so the whole file runs in seconds.

use candle_core::{DType, Device, Tensor};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use unet_parity::registry::{self, Inputs};
use unet_parity::weights::TrackedWeights;

/// Deterministic small values for a tensor of `shape`.
fn tensor(shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|i| ((i as f64 + seed as f64) * 0.7).sin() as f32).collect();
    Tensor::from_vec(v, shape, &Device::Cpu).unwrap()
}

/// One generated case: a block's config, its state dict by shapes, its inputs by shapes.
#[derive(Clone)]
struct Case {
    block: &'static str,
    config: Value,
    weights: Vec<(String, Vec<usize>)>,
    inputs: Vec<(String, Vec<usize>)>,
    kwargs: Value,
    /// `Some(i)`: weight `i % len` gets one extra row, to reach the shape checks.
    jitter: Option<usize>,
    /// Inputs that are masks stored as bool (u8).
    bool_masks: bool,
}

/// One line, so that a failing case reads at a glance.
impl std::fmt::Debug for Case {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} config={} kwargs={} weights={:?} inputs={:?} jitter={:?} bool_masks={}",
            self.block, self.config, self.kwargs, self.weights, self.inputs, self.jitter, self.bool_masks
        )
    }
}

/// Build and run a case through the registry, as `check` does. `Ok(true)` when it ran.
fn run(case: &Case) -> bool {
    let info = registry::find(case.block).unwrap();
    let mut weights = BTreeMap::new();
    for (i, (name, shape)) in case.weights.iter().enumerate() {
        let mut shape = shape.clone();
        if case.jitter.is_some_and(|j| j % case.weights.len() == i) && !shape.is_empty() {
            shape[0] += 1;
        }
        let t = if name.ends_with("num_batches_tracked") {
            Tensor::new(3i64, &Device::Cpu).unwrap()
        } else if name.ends_with("running_var") {
            tensor(&shape, i as u64).abs().unwrap()
        } else {
            tensor(&shape, i as u64)
        };
        weights.insert(name.clone(), t);
    }
    let tracked = TrackedWeights::new(weights);
    let block = match (info.build)(tracked.var_builder(DType::F32, &Device::Cpu), &case.config) {
        Ok(block) => block,
        Err(e) => {
            if std::env::var("PROPERTIES_DEBUG").is_ok() {
                println!("build: {e}");
            }
            return false;
        }
    };
    let tensors = case
        .inputs
        .iter()
        .enumerate()
        .map(|(i, (name, shape))| {
            let t = tensor(shape, 100 + i as u64);
            let t = if name.contains("mask") && case.bool_masks {
                t.ge(0.0).unwrap()
            } else {
                t
            };
            (name.clone(), t)
        })
        .collect();
    let inputs = Inputs {
        block: info.id,
        tensors,
        kwargs: case.kwargs.as_object().cloned().unwrap_or_default(),
    };
    match block.run(&inputs) {
        Ok(_) => true,
        Err(e) => {
            if std::env::var("PROPERTIES_DEBUG").is_ok() {
                println!("run: {e}");
            }
            false
        }
    }
}

/// Run `cases` random cases of `strategy`; a panic anywhere fails with the shrunk case. Also
/// insist that some cases ran (the generator is not all errors).
fn never_panics(strategy: impl Strategy<Value = Case>, cases: u32) {
    // PROPERTIES_CASES=N runs N cases per block instead (a longer hunt).
    let cases = std::env::var("PROPERTIES_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(cases);
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let ran = std::cell::Cell::new(0usize);
    let result = runner.run(&strategy, |case| {
        if run(&case) {
            ran.set(ran.get() + 1);
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    println!("{} of {cases} cases ran, the others returned errors", ran.get());
    assert!(ran.get() > 0, "no generated case ran; the generator only makes errors");
}

/// A small dim: 1 to 4, now and then 0.
fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![9 => 1usize..=4, 1 => Just(0usize)]
}

/// An input shape, mostly of rank `rank` with `channels` at `axis`; else any rank 1..=5 and
/// any small (possibly zero) dims.
fn shape(channels: usize, axis: usize, rank: usize) -> impl Strategy<Value = Vec<usize>> {
    (
        prop_oneof![3 => Just(rank), 1 => 1usize..=5],
        prop::collection::vec(dim(), 5),
        prop::bool::weighted(0.85),
    )
        .prop_map(move |(rank, mut dims, right)| {
            dims.truncate(rank);
            let axis = axis.min(rank - 1);
            if right {
                dims[axis] = channels;
            }
            dims
        })
}

/// `(heads, channels)`: mostly heads that divide the channels, sometimes not, sometimes 0.
fn heads_and_channels() -> impl Strategy<Value = (usize, usize)> {
    prop_oneof![
        4 => (1usize..=4, 1usize..=4).prop_map(|(h, d)| (h, h * d)),
        1 => (0usize..=4, 1usize..=12),
    ]
}

fn jitter() -> impl Strategy<Value = Option<usize>> {
    prop::option::weighted(0.15, 0usize..16)
}

#[test]
fn ddpm_attention_never_panics() {
    let s = (
        1usize..=12,
        prop_oneof![4 => 1usize..=4, 1 => Just(0)],
        prop_oneof![4 => 1usize..=6, 1 => Just(0)],
        0usize..=3,
    )
        .prop_flat_map(|(dim, heads, dim_head, mem)| {
            let hidden = heads * dim_head;
            (shape(dim, 1, 4), jitter()).prop_map(move |(x, jitter)| Case {
                block: "denoising_diffusion_pytorch.Attention",
                config: json!({"dim": dim, "heads": heads, "dim_head": dim_head, "num_mem_kv": mem}),
                weights: vec![
                    ("norm.g".into(), vec![1, dim, 1, 1]),
                    ("to_qkv.weight".into(), vec![3 * hidden, dim, 1, 1]),
                    ("to_out.weight".into(), vec![dim, hidden, 1, 1]),
                    ("to_out.bias".into(), vec![dim]),
                    ("mem_kv".into(), vec![2, heads, mem, dim_head]),
                ],
                inputs: vec![("x".into(), x)],
                kwargs: json!({}),
                jitter,
                bool_masks: false,
            })
        });
    never_panics(s, 1000);
}

#[test]
fn diffusers_attention_never_panics() {
    let cfg = (
        (1usize..=3, 1usize..=4),
        prop_oneof![4 => 1usize..=3, 1 => Just(0)],
        1usize..=6,
        any::<bool>(),
        prop::option::of(1usize..=8),
        any::<bool>(),
        any::<bool>(),
        prop::sample::select(vec!["AttnProcessor2_0", "AttnProcessor"]),
    );
    let s = cfg.prop_flat_map(
        |((g, per_group), heads, dim_head, norm, cross, bias, residual, processor)| {
            let q = g * per_group;
            let groups = norm.then_some(g);
            let inner = heads * dim_head;
            let kv = cross.unwrap_or(q);
            (
                prop_oneof![shape(q, 2, 3), shape(q, 1, 4)],
                prop::option::of(shape(kv, 2, 3)),
                prop::option::of(prop::collection::vec(0usize..=5, 1..=4)),
                any::<bool>(),
                jitter(),
            )
                .prop_map(move |(hidden, encoder, mask, bool_masks, jitter)| {
                    let mut weights = vec![
                        ("to_q.weight".into(), vec![inner, q]),
                        ("to_k.weight".into(), vec![inner, kv]),
                        ("to_v.weight".into(), vec![inner, kv]),
                        ("to_out.0.weight".into(), vec![q, inner]),
                        ("to_out.0.bias".into(), vec![q]),
                    ];
                    if bias {
                        for k in ["to_q.bias", "to_k.bias", "to_v.bias"] {
                            weights.push((k.into(), vec![inner]));
                        }
                    }
                    if groups.is_some() {
                        weights.push(("group_norm.weight".into(), vec![q]));
                        weights.push(("group_norm.bias".into(), vec![q]));
                    }
                    let mut inputs = vec![("hidden_states".into(), hidden)];
                    inputs.extend(encoder.map(|e| ("encoder_hidden_states".into(), e)));
                    inputs.extend(mask.map(|m| ("attention_mask".into(), m)));
                    Case {
                        block: "diffusers.Attention",
                        config: json!({"query_dim": q, "heads": heads, "dim_head": dim_head, "norm_num_groups": groups,
                        "cross_attention_dim": cross, "bias": bias, "residual_connection": residual,
                        "processor": processor}),
                        weights,
                        inputs,
                        kwargs: json!({}),
                        jitter,
                        bool_masks,
                    }
                })
        },
    );
    never_panics(s, 1000);
}

#[test]
fn torch_multihead_attention_never_panics() {
    let cfg = (
        heads_and_channels(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        prop::option::of(1usize..=6),
    );
    let s = cfg.prop_flat_map(|((heads, e), bias, bias_kv, zero_attn, batch_first, kdim)| {
        (
            shape(e, 2, 3),
            prop::option::of(shape(kdim.unwrap_or(e), 2, 3)),
            prop::option::of(prop::collection::vec(0usize..=5, 1..=3)),
            prop::option::of(prop::collection::vec(0usize..=5, 1..=4)),
            (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()),
            jitter(),
        )
            .prop_map(
                move |(query, key, padding, attn_mask, (need_weights, average, causal, bool_masks), jitter)| {
                    let mut weights = vec![("out_proj.weight".into(), vec![e, e])];
                    match kdim {
                        None => weights.push(("in_proj_weight".into(), vec![3 * e, e])),
                        Some(k) => {
                            weights.push(("q_proj_weight".into(), vec![e, e]));
                            weights.push(("k_proj_weight".into(), vec![e, k]));
                            weights.push(("v_proj_weight".into(), vec![e, k]));
                        }
                    }
                    if bias {
                        weights.push(("in_proj_bias".into(), vec![3 * e]));
                        weights.push(("out_proj.bias".into(), vec![e]));
                    }
                    if bias_kv {
                        weights.push(("bias_k".into(), vec![1, 1, e]));
                        weights.push(("bias_v".into(), vec![1, 1, e]));
                    }
                    let mut inputs = vec![("query".into(), query)];
                    if let Some(key) = key {
                        inputs.push(("key".into(), key.clone()));
                        inputs.push(("value".into(), key));
                    }
                    inputs.extend(padding.map(|m| ("key_padding_mask".into(), m)));
                    inputs.extend(attn_mask.map(|m| ("attn_mask".into(), m)));
                    Case {
                        block: "torch.nn.MultiheadAttention",
                        config: json!({"embed_dim": e, "num_heads": heads, "bias": bias, "add_bias_kv": bias_kv,
                            "add_zero_attn": zero_attn, "batch_first": batch_first, "kdim": kdim, "vdim": kdim}),
                        weights,
                        inputs,
                        kwargs: json!({"need_weights": need_weights, "average_attn_weights": average, "is_causal": causal}),
                        jitter,
                        bool_masks,
                    }
                },
            )
    });
    never_panics(s, 1500);
}

#[test]
fn fastai_multihead_never_panics() {
    let s = heads_and_channels().prop_flat_map(|(nheads, ni)| {
        (shape(ni, 1, 4), jitter()).prop_map(move |(inp, jitter)| Case {
            block: "fastai.SelfAttentionMultiHead",
            config: json!({"ni": ni, "nheads": nheads}),
            weights: vec![
                ("norm.weight".into(), vec![ni]),
                ("norm.bias".into(), vec![ni]),
                ("norm.running_mean".into(), vec![ni]),
                ("norm.running_var".into(), vec![ni]),
                ("norm.num_batches_tracked".into(), vec![]),
                ("qkv.weight".into(), vec![3 * ni, ni]),
                ("qkv.bias".into(), vec![3 * ni]),
                ("proj.weight".into(), vec![ni, ni]),
                ("proj.bias".into(), vec![ni]),
            ],
            inputs: vec![("inp".into(), inp)],
            kwargs: json!({}),
            jitter,
            bool_masks: false,
        })
    });
    never_panics(s, 1000);
}

#[test]
fn openai_attention_block_never_panics() {
    // GroupNorm32 needs channels divisible by 32: mostly 32 or 64, sometimes anything.
    let cfg = (
        prop_oneof![4 => Just(32usize), 2 => Just(64), 1 => 1usize..=12],
        prop_oneof![3 => (0u32..=3).prop_map(|p| 1i64 << p), 1 => 0i64..=5],
        prop_oneof![3 => Just(-1i64), 1 => prop::sample::select(vec![8i64, 16, 32]), 1 => 0i64..=20],
        any::<bool>(),
    );
    let s = cfg.prop_flat_map(|(c, heads, head_channels, new_order)| {
        (shape(c, 1, 4), jitter()).prop_map(move |(x, jitter)| Case {
            block: "openai.AttentionBlock",
            config: json!({"channels": c, "num_heads": heads, "num_head_channels": head_channels,
                "use_new_attention_order": new_order}),
            weights: vec![
                ("norm.weight".into(), vec![c]),
                ("norm.bias".into(), vec![c]),
                ("qkv.weight".into(), vec![3 * c, c, 1]),
                ("qkv.bias".into(), vec![3 * c]),
                ("proj_out.weight".into(), vec![c, c, 1]),
                ("proj_out.bias".into(), vec![c]),
            ],
            inputs: vec![("x".into(), x)],
            kwargs: json!({}),
            jitter,
            bool_masks: false,
        })
    });
    never_panics(s, 1000);
}
