//! The pass rule itself: crafted (ours, PyTorch, float64) triples and tolerances go through
//! `compare::compare`, and whenever it says PASS, every element must satisfy the documented rule,
//! checked here independently and naively (docs/cli.md, "The pass rule"):
//! `ours == torch` (NaN with NaN), or `|ours − torch| ≤ atol + rtol·|torch|`, or, with a float64
//! output, rule (b) of the error model (`compare::model`), recomputed naively here: the local
//! magnitude as the median of `|f64|` over each block of 128, PyTorch's and our relative errors as
//! root mean squares over `|j − i| ≤ 64` summed directly; and no element of ours NaN or infinite
//! where PyTorch's is finite. Also: a PASS never comes with a failing element count, and the rule
//! never panics.
#![no_main]

use candle_core::{Device, Tensor};
use libfuzzer_sys::fuzz_target;
use unet_parity::compare::model::MAGNITUDE_BLOCK;
use unet_parity::compare::{compare, FACTORS, NEIGHBOURHOOD};

/// Values from bytes: a base value per element, and small or large perturbations, so that the
/// interesting cases (nearly equal, one ulp off, outliers, NaN, inf) are common.
fn value(b: &[u8]) -> f64 {
    let raw = f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64;
    match b[0] % 8 {
        0 => raw,
        1 => f64::from(b[1] as i8) / 16.0,
        2 => f64::from(b[1] as i8) * 1e4,
        _ => f64::from(b[1] as i8) / 64.0 + f64::from(b[2]) * 1e-7,
    }
}

/// Rule (b) at element `i`, naively: (our relative excess, its window RMS, PyTorch's window RMS).
fn naive_rule_b(o: &[f64], t: &[f64], r: &[f64], i: usize, rtol: f64, atol: f64) -> (f64, f64, f64) {
    let n = r.len();
    let finite = |x: f64| if x.is_finite() { x } else { 0.0 };
    let scale = |j: usize| {
        let b = j / MAGNITUDE_BLOCK * MAGNITUDE_BLOCK;
        let mut block: Vec<f64> = r[b..(b + MAGNITUDE_BLOCK).min(n)].iter().map(|x| finite(*x).abs()).collect();
        block.sort_by(f64::total_cmp);
        finite(r[j]).abs().max(block[block.len() / 2])
    };
    let rel = |d: f64, m: f64| if !d.is_finite() || d == 0.0 { 0.0 } else { d.abs() / m };
    let u = |j: usize| rel(t[j] - r[j], scale(j));
    let v = |j: usize| {
        let over = (o[j] - r[j]).abs() - atol - rtol * r[j].abs();
        if over.is_finite() && over > 0.0 { rel(over, scale(j)) } else { 0.0 }
    };
    let window: Vec<usize> = (i.saturating_sub(NEIGHBOURHOOD)..(i + NEIGHBOURHOOD + 1).min(n)).collect();
    let rms = |f: &dyn Fn(usize) -> f64| (window.iter().map(|&j| f(j).powi(2)).sum::<f64>() / window.len() as f64).sqrt();
    (v(i), rms(&v), rms(&u))
}

fn naive_allows(o: &[f64], t: &[f64], r: Option<&[f64]>, i: usize, rtol: f64, atol: f64) -> bool {
    if o[i] == t[i] || (o[i].is_nan() && t[i].is_nan()) {
        return true;
    }
    if (o[i] - t[i]).abs() <= atol + rtol * t[i].abs() {
        return true;
    }
    match r {
        Some(r) if o[i].is_finite() && r[i].is_finite() => {
            let (mine, around, torch) = naive_rule_b(o, t, r, i, rtol, atol);
            let slack = 1.0 + 1e-9;
            (mine == 0.0 || mine <= FACTORS.element * torch * slack) && (around == 0.0 || around <= FACTORS.window * torch * slack)
        }
        _ => false,
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let (head, body) = data.split_at(4);
    let with_twin = head[0] & 1 == 1;
    let rtol = f64::from(head[1]) * 1e-5;
    let atol = f64::from(head[2]) * 1e-6;
    let n = body.len() / 12;
    if n == 0 || n > 4096 {
        return;
    }
    let (mut o, mut t, mut r) = (vec![], vec![], vec![]);
    for i in 0..n {
        let c = &body[12 * i..12 * i + 12];
        let base = value(&c[0..4]);
        // PyTorch's output, its float64 twin and ours, each near the base or far from it.
        t.push(base + value(&c[4..8]) * 1e-6);
        r.push(base);
        o.push(if c[8] % 4 == 0 { value(&c[8..12]) } else { base + value(&c[8..12]) * 1e-5 });
    }
    let dims = match head[3] % 3 {
        0 => vec![n],
        1 if n % 2 == 0 => vec![2, n / 2],
        _ => vec![1, n],
    };
    let tensor = |v: &Vec<f64>| Tensor::from_vec(v.clone(), dims.as_slice(), &Device::Cpu).unwrap();
    let (ot, tt, rt) = (tensor(&o), tensor(&t), tensor(&r));
    let report = compare("out", &ot, &tt, with_twin.then_some(&rt), rtol, atol).unwrap();
    if !report.pass {
        return;
    }
    assert_eq!(report.failed_elements, 0);
    for i in 0..n {
        assert!(o[i].is_finite() || !t[i].is_finite() || o[i].is_nan() && t[i].is_nan(), "element {i}");
        assert!(
            naive_allows(&o, &t, with_twin.then_some(r.as_slice()), i, rtol, atol),
            "element {i}: ours {} torch {} f64 {} rtol {rtol} atol {atol}",
            o[i],
            t[i],
            r[i]
        );
    }
});
