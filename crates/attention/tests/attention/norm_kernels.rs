//! Our GroupNorm and LayerNorm against PyTorch 2.15's CPU kernels, bit for bit, on the inputs
//! `scripts/export_norm_kernels.py` fed them (`tests/data/norm_kernels.safetensors`: offset and
//! outlier channels, both GroupNorm kernels, contiguous and channels_last, maps on both sides of
//! the channels_last kernel's 1024-position switch, f32, f16 and bf16, LayerNorm on near-constant,
//! offset and long rows). The layers run as the blocks run them:
//! `GroupNorm::forward_as(x, format)` and `LayerNorm::forward`.
//!
//! `UNET_ATTENTION_NORM_CASES=FILE` runs another file of the script's (`--random N`): the
//! bit-identity measurement of `docs/half-precision.md`.

use candle_core::{DType, Device, Tensor};
use candle_nn::{Module, VarBuilder};
use std::collections::HashMap;
use std::path::PathBuf;
use unet_attention::cpu_kernels::MemoryFormat;
use unet_attention::layers::{group_norm, LayerNorm};

#[derive(serde::Deserialize)]
struct Case {
    name: String,
    op: String,
    dtype: String,
    groups: usize,
    eps: f64,
    format: String,
}

fn bits(t: &Tensor) -> Vec<u32> {
    let t = t.to_dtype(DType::F32).unwrap().flatten_all().unwrap();
    t.to_vec1::<f32>().unwrap().iter().map(|v| v.to_bits()).collect()
}

/// Our output of one case, run through the layer.
fn ours(case: &Case, t: &HashMap<String, Tensor>) -> Tensor {
    let get = |k: &str| t.get(&format!("{}.{k}", case.name)).cloned();
    let x = get("x").expect("x");
    let dtype = x.dtype();
    let mut params = HashMap::new();
    if let (Some(w), Some(b)) = (get("weight"), get("bias")) {
        params.insert("n.weight".to_string(), w);
        params.insert("n.bias".to_string(), b);
    }
    let affine = !params.is_empty();
    let vb = VarBuilder::from_tensors(params, dtype, &Device::Cpu);
    if case.op == "group_norm" {
        let format = match case.format.as_str() {
            "channels_last" => MemoryFormat::ChannelsLast,
            _ => MemoryFormat::Contiguous,
        };
        let norm = group_norm(vb.pp("n"), "test", case.groups, x.dim(1).unwrap(), case.eps).unwrap();
        norm.forward_as(&x, format).unwrap()
    } else {
        let dim = *x.dims().last().unwrap();
        LayerNorm::load(vb.pp("n"), dim, case.eps, affine)
            .unwrap()
            .forward(&x)
            .unwrap()
    }
}

/// The metadata's `cases` (the safetensors header: its length, then its JSON).
fn cases(path: &std::path::Path) -> Vec<Case> {
    let bytes = std::fs::read(path).unwrap();
    let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + len]).unwrap();
    serde_json::from_str(header["__metadata__"]["cases"].as_str().expect("the cases")).unwrap()
}

#[test]
fn norms_match_pytorch_bit_for_bit() {
    let path = std::env::var_os("UNET_ATTENTION_NORM_CASES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/norm_kernels.safetensors"));
    let tensors = candle_core::safetensors::load(&path, &Device::Cpu).unwrap();
    let cases = cases(&path);
    let (mut same, mut total, mut failed) = (0usize, 0usize, vec![]);
    let mut by_kind: HashMap<String, (usize, usize)> = HashMap::new();
    for case in &cases {
        let got = bits(&ours(case, &tensors));
        let want = bits(&tensors[&format!("{}.y", case.name)]);
        assert_eq!(got.len(), want.len(), "{}", case.name);
        let equal = got.iter().zip(&want).filter(|(a, b)| a == b).count();
        same += equal;
        total += want.len();
        let kind = by_kind
            .entry(format!("{} {} {}", case.op, case.format, case.dtype))
            .or_default();
        kind.0 += usize::from(equal == want.len());
        kind.1 += 1;
        if equal != want.len() {
            failed.push(format!(
                "{}: {} of {} elements differ",
                case.name,
                want.len() - equal,
                want.len()
            ));
        }
    }
    let mut kinds: Vec<_> = by_kind.into_iter().collect();
    kinds.sort();
    for (kind, (ok, n)) in kinds {
        println!("{kind}: {ok} of {n} cases bit for bit");
    }
    println!("{same} of {total} elements bit for bit; {} cases differ", failed.len());
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
