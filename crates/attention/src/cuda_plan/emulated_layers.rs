//! The fused CUDA layers (`kernels/fused_layers.cu`), run on the CPU under the CUDA emulation
//! ([`super::emulator`]) with the grids and splits of `cuda_plan` and the argument order of
//! `cuda::layers_launch`, and checked element by element against each layer computed here in
//! f64 with the kernels' rounding points (the storage dtype wherever PyTorch's separate ops
//! would round): GroupNorm with and without the pre-add, split and unsplit statistics, every
//! activation; LayerNorm with and without the affine; the GEGLU/SwiGLU gates; the bias +
//! residual + rescale epilogue in both bias layouts. In f32, f16 and bf16.

use super::emulator::{decode, elem_size, encode, normals, round, runner, Arg, Request};
use super::{
    finalize_grid, group_grid, norm_rows_grid, row_grid, stats_split, APPLY_TILE, FINALIZE_THREADS, LAYER_THREADS,
};
use candle_core::DType;
use std::path::Path;

const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

fn suffix(dtype: DType) -> &'static str {
    match dtype {
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        _ => "f32",
    }
}

/// The largest error of `got` against `want`, in units of the dtype's epsilon times
/// max(1, |want|) (f32: of 1e-6); panics on a non-finite element.
fn error_in_eps(dtype: DType, got: &[f32], want: &[f64], what: &str) -> f64 {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let eps = match dtype {
        DType::F16 => 2f64.powi(-10),
        DType::BF16 => 2f64.powi(-7),
        _ => 1e-6,
    };
    let mut worst = 0f64;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(g.is_finite(), "{what}: element {i} is {g} (want {w})");
        worst = worst.max((*g as f64 - w).abs() / (eps * w.abs().max(1.0)));
    }
    worst
}

/// Errors above this many epsilons fail: the rounding points the kernels share with the f64
/// reference leave one or two units (an f32 evaluation can round the other way at a tie).
const BOUND_EPS: f64 = 3.0;

#[derive(Debug, Clone, Copy)]
struct GroupNormCase {
    dtype: DType,
    b: usize,
    c: usize,
    groups: usize,
    spatial: usize,
    add: bool,
    act: i32,
}

/// Runs `gn_stats` (+ `gn_finalize` when split) and `gn_apply` as `GroupNormOp::run` launches
/// them; the error in epsilons and the statistics' splits.
fn group_norm(bin: &Path, g: GroupNormCase) -> (f64, usize) {
    let GroupNormCase {
        dtype,
        b,
        c,
        groups,
        spatial,
        ..
    } = g;
    let eps = 1e-6f32;
    let seed = (c * spatial) as u64 * 4;
    let x = normals(seed, b * c * spatial, 1.5, dtype);
    let add = g.add.then(|| normals(seed + 1, b * c, 0.5, dtype));
    let gamma = normals(seed + 2, c, 1.0, DType::F32);
    let beta = normals(seed + 3, c, 0.5, DType::F32);
    let (bg, cpg) = (b * groups, c / groups);
    let group_len = cpg * spatial;
    let (chunk, splits) = stats_split(bg, group_len);

    // A random schedule: block_sum's barriers guard `red` against fast warps.
    let mut req = Request::new(false, 0x5eed ^ spatial as u64);
    let xb = req.data(encode(dtype, &x));
    let ab = add.as_ref().map(|a| req.data(encode(dtype, a)));
    let part = req.garbage(4 * if splits > 1 { 2 * bg * splits } else { 1 });
    let stats = req.garbage(4 * 2 * bg);
    let (gb, bb) = (
        req.data(encode(DType::F32, &gamma)),
        req.data(encode(DType::F32, &beta)),
    );
    let out = req.garbage(b * c * spatial * elem_size(dtype));
    let ints = [c, groups, spatial].map(|v| Arg::I32(v as i32));
    let sfx = suffix(dtype);
    let mut stats_args = vec![
        Arg::Buf(Some(xb)),
        Arg::Buf(ab),
        Arg::Buf(Some(part)),
        Arg::Buf(Some(stats)),
    ];
    stats_args.extend(ints.clone());
    stats_args.extend([Arg::I32(chunk as i32), Arg::I32(splits as i32), Arg::F32(eps)]);
    req.launch(
        &format!("gn_stats_{sfx}"),
        group_grid(splits, bg),
        LAYER_THREADS,
        0,
        &stats_args,
    );
    if splits > 1 {
        let finalize = [bg, group_len, chunk, splits].map(|v| Arg::I32(v as i32));
        let mut args = vec![Arg::Buf(Some(part)), Arg::Buf(Some(stats))];
        args.extend(finalize);
        args.push(Arg::F32(eps));
        req.launch("gn_finalize", finalize_grid(bg), FINALIZE_THREADS, 0, &args);
    }
    let mut apply_args = vec![
        Arg::Buf(Some(xb)),
        Arg::Buf(ab),
        Arg::Buf(Some(stats)),
        Arg::Buf(Some(gb)),
        Arg::Buf(Some(bb)),
        Arg::Buf(Some(out)),
    ];
    apply_args.extend(ints);
    apply_args.extend([Arg::I32(APPLY_TILE as i32), Arg::I32(g.act)]);
    let apply_grid = group_grid(group_len.div_ceil(APPLY_TILE), bg);
    req.launch(&format!("gn_apply_{sfx}"), apply_grid, LAYER_THREADS, 0, &apply_args);
    let got = decode(dtype, &req.run(bin, &[out], &g).remove(0));

    // f64 reference: s = x (+ add) rounded; biased statistics of s; y = s·a + b rounded; act.
    let r = |v: f64| round(dtype, v as f32) as f64;
    let mut want = vec![0f64; x.len()];
    for bi in 0..b {
        for gi in 0..groups {
            let s: Vec<f64> = (0..group_len)
                .map(|e| {
                    let ch = gi * cpg + e / spatial;
                    let v = x[(bi * c + ch) * spatial + e % spatial] as f64;
                    add.as_ref().map_or(v, |a| r(v + a[bi * c + ch] as f64))
                })
                .collect();
            let mean = s.iter().sum::<f64>() / group_len as f64;
            let var = s.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / group_len as f64;
            let rstd = 1.0 / (var + eps as f64).sqrt();
            for (e, sv) in s.iter().enumerate() {
                let ch = gi * cpg + e / spatial;
                let y = r((sv - mean) * rstd * gamma[ch] as f64 + beta[ch] as f64);
                let sig = 1.0 / (1.0 + (-y).exp());
                want[(bi * c + ch) * spatial + e % spatial] = match g.act {
                    1 => r(y * sig),
                    2 => r(y * r(sig)),
                    _ => y,
                };
            }
        }
    }
    (error_in_eps(dtype, &got, &want, &format!("{g:?}")), splits)
}

#[test]
fn group_norm_kernels_match_f64() {
    let Some(bin) = runner() else { return };
    let mut saw_split = false;
    for dtype in DTYPES {
        let base = GroupNormCase {
            dtype,
            b: 2,
            c: 6,
            groups: 3,
            spatial: 35, // a group (70) shorter than a block's 256 threads
            add: false,
            act: 0,
        };
        let cases = [
            base,
            GroupNormCase {
                add: true,
                act: 1,
                ..base
            },
            GroupNormCase { act: 2, ..base },
            // One batch, 32 groups of 2 × 4087: the statistics split into 4 chunks of 2044
            // (the last shorter), the apply into 4 tiles.
            GroupNormCase {
                b: 1,
                c: 64,
                groups: 32,
                spatial: 61 * 67,
                add: true,
                act: 1,
                ..base
            },
        ];
        for g in cases {
            let (err, splits) = group_norm(bin, g);
            saw_split |= splits > 1;
            eprintln!("{g:?}: {splits} splits, error {err:.2} eps");
            assert!(err <= BOUND_EPS, "{g:?}: error {err:.2} eps > {BOUND_EPS}");
        }
    }
    assert!(saw_split, "no case split the statistics");
}

/// Launches `{kernel}_{dtype}` on the row grid of `(rows, cols)` as `cuda::layers_launch` does,
/// runs the request and returns buffer `out` decoded.
fn run_row_kernel(
    bin: &Path,
    mut req: Request,
    (kernel, dtype): (&str, DType),
    (rows, cols): (usize, usize),
    args: &[Arg],
    out: usize,
    what: &dyn std::fmt::Debug,
) -> Vec<f32> {
    let name = format!("{kernel}_{}", suffix(dtype));
    req.launch(&name, row_grid(rows, cols), LAYER_THREADS, 0, args);
    decode(dtype, &req.run(bin, &[out], what).remove(0))
}

/// `ln_*` as `LayerNormOp::run` launches it: `nn.LayerNorm` over rows of `n` (inputs with a mean
/// of 3 a row, so that the centring matters), with f32 γ and β or without the affine.
fn layer_norm(bin: &Path, dtype: DType, rows: usize, n: usize, affine: bool) -> f64 {
    let x: Vec<f32> = normals((rows * 7 + n) as u64, rows * n, 1.5, dtype)
        .iter()
        .map(|v| round(dtype, v + 3.0))
        .collect();
    let gamma = normals(11, n, 1.0, DType::F32);
    let beta = normals(12, n, 0.5, DType::F32);
    let eps = 1e-5f32;
    let mut req = Request::new(false, (rows + n) as u64);
    let xb = req.data(encode(dtype, &x));
    let (gb, bb) = if affine {
        (
            Some(req.data(encode(DType::F32, &gamma))),
            Some(req.data(encode(DType::F32, &beta))),
        )
    } else {
        (None, None)
    };
    let out = req.garbage(rows * n * elem_size(dtype));
    let args = [
        Arg::Buf(Some(xb)),
        Arg::Buf(gb),
        Arg::Buf(bb),
        Arg::Buf(Some(out)),
        Arg::I64(rows as i64),
        Arg::I32(n as i32),
        Arg::F32(eps),
    ];
    let what = format!("ln {dtype:?} ({rows}, {n}) affine {affine}");
    req.launch(
        &format!("ln_{}", suffix(dtype)),
        norm_rows_grid(rows),
        LAYER_THREADS,
        0,
        &args,
    );
    let got = decode(dtype, &req.run(bin, &[out], &what).remove(0));
    let mut want = Vec::with_capacity(rows * n);
    for row in x.chunks(n) {
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
        let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64;
        let rstd = 1.0 / (var + eps as f64).sqrt();
        for (j, &v) in row.iter().enumerate() {
            let y = (v as f64 - mean) * rstd;
            let y = if affine {
                y * gamma[j] as f64 + beta[j] as f64
            } else {
                y
            };
            want.push(round(dtype, y as f32) as f64);
        }
    }
    error_in_eps(dtype, &got, &want, &what)
}

#[test]
fn layer_norm_kernels_match_f64() {
    let Some(bin) = runner() else { return };
    for dtype in DTYPES {
        // SD's and SDXL's widths, a row shorter than the block, an odd width with partial
        // thread strides.
        for (rows, n, affine) in [(6, 320, true), (3, 1280, true), (5, 77, false), (4, 1031, true)] {
            let err = layer_norm(bin, dtype, rows, n, affine);
            assert!(
                err <= BOUND_EPS,
                "ln {dtype:?} ({rows}, {n}) affine {affine}: error {err:.2} eps"
            );
        }
    }
}

/// `gated_*` as `GatedOp::run` launches it: `hidden · act(gate)` of `[hidden | gate]` rows.
fn gated(bin: &Path, dtype: DType, rows: usize, n: usize, act: i32) -> f64 {
    let h = normals((rows * n) as u64, rows * 2 * n, 2.0, dtype);
    let mut req = Request::new(false, 0);
    let hb = req.data(encode(dtype, &h));
    let out = req.garbage(rows * n * elem_size(dtype));
    let args = [
        Arg::Buf(Some(hb)),
        Arg::Buf(Some(out)),
        Arg::I64(rows as i64),
        Arg::I32(n as i32),
        Arg::I32(act),
    ];
    let what = format!("gated {dtype:?} ({rows}, 2 × {n}) act {act}");
    let got = run_row_kernel(bin, req, ("gated", dtype), (rows, n), &args, out, &what);
    let r = |v: f64| round(dtype, v as f32) as f64;
    let want: Vec<f64> = (0..rows * n)
        .map(|i| {
            let (row, j) = (i / n, i % n);
            let (hidden, g) = (h[row * 2 * n + j] as f64, h[row * 2 * n + n + j] as f64);
            let a = if act == 0 {
                g * 0.5 * (1.0 + libm::erf(g / 2f64.sqrt()))
            } else {
                g / (1.0 + (-g).exp())
            };
            r(hidden * r(a))
        })
        .collect();
    error_in_eps(dtype, &got, &want, &what)
}

#[test]
fn gated_kernels_match_f64() {
    let Some(bin) = runner() else { return };
    for dtype in DTYPES {
        for (rows, n, act) in [(37, 300, 0), (5, 7, 1), (3, 640, 1)] {
            let err = gated(bin, dtype, rows, n, act);
            assert!(
                err <= BOUND_EPS,
                "gated {dtype:?} ({rows}, {n}) act {act}: error {err:.2} eps"
            );
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct EpilogueCase {
    dtype: DType,
    rows: usize,
    cols: usize,
    /// `Some(true)`: a bias along the rows (channel layout, `rows % bias_len`); `Some(false)`:
    /// along the columns.
    bias_on_rows: Option<bool>,
    bias_len: usize,
    residual: bool,
    div: Option<f32>,
}

/// `epilogue_*` as `EpilogueOp::run` launches it: `((h + bias) + residual) / div`.
fn epilogue(bin: &Path, e: EpilogueCase) -> f64 {
    let EpilogueCase { dtype, rows, cols, .. } = e;
    let seed = (rows * cols) as u64 * 3;
    let h = normals(seed, rows * cols, 1.5, dtype);
    let bias = e.bias_on_rows.map(|_| normals(seed + 1, e.bias_len, 0.5, dtype));
    let residual = e.residual.then(|| normals(seed + 2, rows * cols, 1.5, dtype));
    let mut req = Request::new(false, 0);
    let hb = req.data(encode(dtype, &h));
    let bb = bias.as_ref().map(|x| req.data(encode(dtype, x)));
    let rb = residual.as_ref().map(|x| req.data(encode(dtype, x)));
    let out = req.garbage(rows * cols * elem_size(dtype));
    let args = [
        Arg::Buf(Some(hb)),
        Arg::Buf(bb),
        Arg::Buf(rb),
        Arg::Buf(Some(out)),
        Arg::I64(rows as i64),
        Arg::I32(cols as i32),
        Arg::I32(bias.as_ref().map_or(1, |b| b.len()) as i32),
        Arg::I32(i32::from(e.bias_on_rows == Some(true))),
        Arg::F32(e.div.unwrap_or(1.0)),
        Arg::I32(i32::from(e.div.is_some())),
    ];
    let got = run_row_kernel(bin, req, ("epilogue", dtype), (rows, cols), &args, out, &e);
    let r = |v: f64| round(dtype, v as f32) as f64;
    let want: Vec<f64> = (0..rows * cols)
        .map(|i| {
            let (row, col) = (i / cols, i % cols);
            let mut v = h[i] as f64;
            if let Some(b) = &bias {
                let at = if e.bias_on_rows == Some(true) {
                    row % b.len()
                } else {
                    col
                };
                v = r(v + b[at] as f64);
            }
            if let Some(res) = &residual {
                v = r(v + res[i] as f64);
            }
            r(e.div.map_or(v, |d| v / d as f64))
        })
        .collect();
    error_in_eps(dtype, &got, &want, &format!("{e:?}"))
}

#[test]
fn epilogue_kernels_match_f64() {
    let Some(bin) = runner() else { return };
    for dtype in DTYPES {
        let tokens = EpilogueCase {
            dtype,
            rows: 20,
            cols: 300,
            bias_on_rows: Some(false),
            bias_len: 300,
            residual: true,
            div: Some(1.5),
        };
        let channels = EpilogueCase {
            rows: 2 * 6,
            cols: 70,
            bias_on_rows: Some(true),
            bias_len: 6,
            residual: false,
            div: None,
            ..tokens
        };
        let residual_only = EpilogueCase {
            bias_on_rows: None,
            div: None,
            ..tokens
        };
        for e in [tokens, channels, residual_only] {
            let err = epilogue(bin, e);
            assert!(err <= BOUND_EPS, "{e:?}: error {err:.2} eps");
        }
    }
}
