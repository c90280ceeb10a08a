//! `unet-parity show BUNDLE --out DIR`: pictures of where and how much our block differs from
//! PyTorch.
//!
//! * `output_error.png` (image-shaped `(B, C, H, W)` first output): one panel per batch item,
//!   `max over channels |ours − torch|` at each pixel;
//! * `output_worst_channels.png`: rows = the (up to) four channels with the largest error, columns
//!   = batch items, `|ours − torch|` of that channel;
//! * token outputs `(B, L, C)` instead: `output_error.png`, one panel per batch item, `|ours −
//!   torch|` over tokens (rows) × channels (columns), and `<stage>_tokens.png` for each `probs`
//!   stage `(B, H, Lq, Lk)`: one row per head of batch item `--batch`, the whole query × key map,
//!   PyTorch | ours | difference;
//! * `probs_query_Y_X.png` (bundles with a `probs` stage over the image's tokens): for the chosen
//!   query pixel, one row per head of batch item `--batch`: PyTorch's attention map over the key
//!   pixels, ours, and `|ours − torch|` (memory keys that are not pixels are left out). Composite
//!   blocks get one per attention over the input's pixels, named after the stage
//!   (`attentions.0__probs_query_Y_X.png`, `mid_attn__probs_query_Y_X.png`).
//!
//! Maps wider or taller than `MAX_SIDE` (512) cells are max-pooled down to it (a pooled cell shows the
//! largest value it covers), and at most `MAX_ITEMS` (16) batch items and heads are drawn (the
//! first ones; the title and the caption say how many of how many), so a picture stays a few
//! megapixels whatever the bundle holds. A picture left out is named, with why, in
//! [`Shown::left_out`] (`note:` lines in the CLI); a bundle with nothing to draw is an error, not
//! an empty folder. The pictures are written as new files renamed into place, never through a symbolic
//! link planted in the folder (`crate::files::write_new`).
//!
//! Colours: black → purple → red → yellow → white. The output panels share one scale (0 to the
//! largest error); in the attention rows PyTorch's and our maps share one scale (0 to the largest
//! weight) and the difference panel has its own. Every file's scale is printed.
//!
//! Each picture also reads alone: a strip above the panels ([`TITLE_STRIP`] pixels) names the
//! file and output (or the attention stage), what is drawn and what the rows are, and heads each
//! column (`batch 0`, `PyTorch`, `ours`, `|ours - PyTorch|`); under each column a colour scale bar
//! ([`SCALE_STRIP`] pixels) runs from 0 (left, black) to the column's largest value (right, white),
//! both printed (`figure`; text in the built-in bitmap font of `font`). The labels add these two
//! strips to a picture's height on top of the capped panels, widen a column to its heading and
//! scale labels where the panel is narrower, and widen the picture to its title up to 640 pixels.

mod figure;
mod font;

pub use figure::{SCALE_STRIP, TITLE_STRIP};

use crate::bundle::Bundle;
use crate::check::{run_bundle, Options};
use crate::error::{ParityError, Result};
use crate::trace::torch_stage;
use candle_core::{DType, Tensor};
use figure::{Column, Sheet};
use std::path::{Path, PathBuf};

/// What `show` wrote.
#[derive(Debug, Clone)]
pub struct Picture {
    pub path: PathBuf,
    /// What the picture shows, with its colour scale.
    pub caption: String,
}

/// Longest side of a drawn map, in cells.
const MAX_SIDE: usize = 512;
/// The most batch items (columns) and heads (rows) a picture draws.
pub const MAX_ITEMS: usize = 16;

/// `""`, or `; batch items 0-15 of 250000 drawn` when only the first [`MAX_ITEMS`] of `n` are.
fn drawn_note(n: usize, what: &str) -> String {
    if n > MAX_ITEMS {
        format!("; {what} 0-{} of {n} drawn", MAX_ITEMS - 1)
    } else {
        String::new()
    }
}

/// The size of a `rows × cols` map once [`pooled`].
fn pooled_dims(rows: usize, cols: usize) -> (usize, usize) {
    let (fr, fc) = (rows.div_ceil(MAX_SIDE).max(1), cols.div_ceil(MAX_SIDE).max(1));
    (rows.div_ceil(fr), cols.div_ceil(fc))
}

/// `values` (`rows × cols`) max-pooled to at most [`MAX_SIDE`] cells a side (NaN and ±inf kept
/// visible: a pooled cell that covers one is non-finite).
fn pooled(values: &[f64], (rows, cols): (usize, usize)) -> (Vec<f64>, (usize, usize)) {
    let (fr, fc) = (rows.div_ceil(MAX_SIDE).max(1), cols.div_ceil(MAX_SIDE).max(1));
    if fr == 1 && fc == 1 {
        return (values.to_vec(), (rows, cols));
    }
    let (pr, pc) = pooled_dims(rows, cols);
    let mut out = vec![0f64; pr * pc];
    for r in 0..rows {
        for c in 0..cols {
            let (v, o) = (values[r * cols + c], &mut out[(r / fr) * pc + c / fc]);
            if !v.is_finite() || !o.is_finite() {
                *o = if v.is_finite() { *o } else { v };
            } else if v > *o {
                *o = v;
            }
        }
    }
    (out, (pr, pc))
}
fn values(t: &Tensor) -> candle_core::Result<Vec<f64>> {
    t.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()
}

/// Pixels per cell so that a `rows × cols` map is about 160 px on its long side.
fn cell(rows: usize, cols: usize) -> usize {
    (160 / rows.max(cols).max(1)).clamp(1, 32)
}

/// The heading of the difference panels.
const DIFF: &str = "|ours - PyTorch|";

/// One column per batch item, on the scale 0 to `vmax`.
fn batch_columns(b: usize, vmax: f64) -> Vec<Column> {
    (0..b)
        .map(|bi| Column {
            heading: format!("batch {bi}"),
            vmax,
        })
        .collect()
}

/// PyTorch | ours (shared scale 0 to `vmax`) | their difference (0 to `dmax`).
fn probs_columns(vmax: f64, dmax: f64) -> Vec<Column> {
    [("PyTorch", vmax), ("ours", vmax), (DIFF, dmax)]
        .into_iter()
        .map(|(heading, vmax)| Column {
            heading: heading.into(),
            vmax,
        })
        .collect()
}

/// `head 0`, or `heads 0-7`.
fn head_rows(heads: usize) -> String {
    match heads {
        1 => "head 0".into(),
        n => format!("heads 0-{}", n.saturating_sub(1)),
    }
}

/// `2×24×5×7`.
fn shape(dims: &[usize]) -> String {
    dims.iter().map(usize::to_string).collect::<Vec<_>>().join("×")
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
}

fn max_of(v: &[f64]) -> f64 {
    v.iter().copied().filter(|x| x.is_finite()).fold(0.0, f64::max)
}

/// The attention-weight stages (`probs`, or a part's `attentions.0/probs`, `mid_attn/probs`, ...
/// in a composite block) that both runs recorded, as `(B, H, Lq, Lk)`: name, PyTorch's, ours.
/// Each one left out is named in `left_out`, with why.
fn probs_stages<'a>(
    bundle: &'a Bundle,
    stages: &'a [(String, Tensor)],
    left_out: &mut Vec<String>,
) -> Result<Vec<(String, &'a Tensor, &'a Tensor)>> {
    let mut found = vec![];
    let names = crate::trace::stage_names(bundle)?;
    let probs: Vec<_> = names
        .iter()
        .filter(|s| *s == "probs" || s.ends_with("/probs"))
        .collect();
    if probs.is_empty() {
        left_out.push(format!(
            "no attention map: the bundle records no attention-weight stage (`probs`, `<part>/probs`){}",
            if names.is_empty() {
                "; it has no stages at all (export it with trace=True)"
            } else {
                " (the block has no attention, or the exporter left the weights out: a masked attention \
                 or one of more than 65,536 weights)"
            }
        ));
    }
    for stage in probs {
        let pt = torch_stage(bundle, stage).expect("listed stages exist");
        let Some(po) = stages.iter().find(|(n, _)| n == stage).map(|(_, t)| t) else {
            left_out.push(format!("no attention map of `{stage}`: our run recorded no such stage"));
            continue;
        };
        if pt.rank() != 4 {
            left_out.push(format!(
                "no attention map of `{stage}`: PyTorch's is {}, not (B, heads, Lq, Lk)",
                shape(pt.dims())
            ));
        } else if po.elem_count() != pt.elem_count() {
            left_out.push(format!(
                "no attention map of `{stage}`: ours is {}, PyTorch's {}",
                shape(po.dims()),
                shape(pt.dims())
            ));
        } else {
            found.push((stage.clone(), pt, po));
        }
    }
    Ok(found)
}

/// What `show` wrote, and what it left out and why (`note:` lines in the CLI).
#[derive(Debug, Clone, Default)]
pub struct Shown {
    pub pictures: Vec<Picture>,
    /// One line per picture not drawn: `no attention map: the bundle records no ...`.
    pub left_out: Vec<String>,
}

/// Write the pictures of `bundle` into `out`; `query` is the `(y, x)` query pixel of the
/// attention map (default: the image centre), `batch` the batch item it is drawn for. The block
/// is built and run as `check` does with `opts` (weights from a checkpoint, a model config),
/// with its stages traced.
pub fn show(bundle: &Bundle, out: &Path, query: Option<(usize, usize)>, batch: usize, opts: Options) -> Result<Shown> {
    crate::files::create_dir(out)?;
    let opts = Options { trace: true, ..opts };
    let run = run_bundle(bundle, &opts)?;
    draw(bundle, &run.ours, &run.stages, out, (query, batch))
}

/// The pictures of our outputs `ours` (in the bundle's order) and recorded `stages` against
/// `bundle`'s: what [`show`] draws for our block and [`crate::port::PortCheck::show`] for a port.
pub(crate) fn draw(
    bundle: &Bundle,
    ours: &[Tensor],
    stages: &[(String, Tensor)],
    out: &Path,
    (query, batch): (Option<(usize, usize)>, usize),
) -> Result<Shown> {
    crate::files::create_dir(out)?;
    let path = bundle.path.as_path();
    let err = |e: candle_core::Error| ParityError::bundle(path, e.to_string());
    let mut shown = Shown::default();
    let name = bundle.outputs.first().cloned().unwrap_or_default();
    let (Some(torch), Some(ours)) = (bundle.output(&name), ours.first()) else {
        return Ok(shown);
    };
    let (pictures, left_out) = (&mut shown.pictures, &mut shown.left_out);
    let same = torch.dims() == ours.dims();
    if !same {
        left_out.push(format!(
            "no error map of output `{name}`: ours is {}, PyTorch's {}",
            shape(ours.dims()),
            shape(torch.dims())
        ));
    } else if torch.rank() == 4 {
        pictures.extend(image_output_pictures(path, &name, torch, ours, out)?);
    } else if torch.rank() != 3 {
        left_out.push(format!(
            "no error map of output `{name}`: {} is neither an image (B, C, H, W) nor tokens (B, L, C)",
            shape(torch.dims())
        ));
    }
    let probs = probs_stages(bundle, stages, left_out)?;
    let tokens = torch.rank() == 3 && same;
    if tokens {
        pictures.push(token_output_picture(path, &name, torch, ours, out)?);
        for (stage, pt, po) in &probs {
            let b = pt.dim(0).map_err(err)?;
            if batch >= b {
                return Err(ParityError::bundle(
                    path,
                    format!("--batch {batch} outside the {b} items"),
                ));
            }
            let po = po.reshape(pt.dims()).map_err(err)?;
            pictures.push(token_probs_picture(path, stage, pt, &po, batch, out)?);
        }
    }
    // Also for token outputs of an image input; their stages were drawn whole, so none is noted.
    query_pictures(bundle, &probs, out, (query, batch), tokens, &mut shown)?;
    if shown.pictures.is_empty() {
        return Err(ParityError::bundle(
            path,
            format!(
                "nothing to picture: output `{name}` has shape {:?} (show draws (B, C, H, W) images and (B, L, C) \
                 tokens) and no attention-weight stage fits: {}",
                torch.dims(),
                shown.left_out.join("; ")
            ),
        ));
    }
    Ok(shown)
}

/// The attention weights of one query pixel, for every `probs` stage over the pixels of the
/// bundle's first input (`probs`, or a part's `attentions.0/probs`, `mid_attn/probs`, ... in a
/// composite block). A stage left out is noted in `shown`, unless `drawn` (as tokens) already.
fn query_pictures(
    bundle: &Bundle,
    probs: &[(String, &Tensor, &Tensor)],
    out: &Path,
    (query, batch): (Option<(usize, usize)>, usize),
    drawn: bool,
    shown: &mut Shown,
) -> Result<()> {
    let path = bundle.path.as_path();
    let err = |e: candle_core::Error| ParityError::bundle(path, e.to_string());
    let image = bundle.inputs.first().and_then(|n| bundle.input(n));
    let Some(img) = image.filter(|t| t.rank() == 4) else {
        for (stage, ..) in probs.iter().filter(|_| !drawn) {
            shown.left_out.push(format!(
                "no attention map of `{stage}`: the first input is not an image (B, C, H, W), so it has no query pixel"
            ));
        }
        return Ok(());
    };
    let (_, _, h, w) = img.dims4().map_err(err)?;
    for (stage, pt, po) in probs {
        let (b, _, lq, lk) = pt.dims4().map_err(err)?;
        if lq != h * w || lk < h * w {
            if drawn {
                continue;
            }
            shown.left_out.push(format!(
                "no attention map of `{stage}`: its {lq} queries × {lk} keys are not over the input's {h}×{w} pixels"
            ));
            continue;
        }
        let (qy, qx) = query.unwrap_or((h / 2, w / 2));
        if qy >= h || qx >= w || batch >= b {
            return Err(ParityError::bundle(
                path,
                format!("--query {qy},{qx} / --batch {batch} outside the {h}×{w} image of {b} items"),
            ));
        }
        let po = po.reshape(pt.dims()).map_err(err)?;
        let picture = probs_picture(path, stage, (pt, &po), (h, w), (qy, qx), batch, out)?;
        shown.pictures.push(picture);
    }
    Ok(())
}

/// The (up to) four channels of `diff` (`B × C × HW`) with the largest values: (channel, max).
fn worst_channels(diff: &[f64], (b, c, hw): (usize, usize, usize)) -> Vec<(usize, f64)> {
    let mut worst: Vec<(usize, f64)> = (0..c)
        .map(|ci| {
            let m = (0..b)
                .flat_map(|bi| diff[(bi * c + ci) * hw..(bi * c + ci + 1) * hw].iter().copied())
                .fold(0.0, f64::max);
            (ci, m)
        })
        .collect();
    worst.sort_by(|x, y| y.1.total_cmp(&x.1));
    worst.truncate(4);
    worst
}

/// `output_error.png` and `output_worst_channels.png` of an image-shaped output `(B, C, H, W)`.
fn image_output_pictures(path: &Path, name: &str, torch: &Tensor, ours: &Tensor, out: &Path) -> Result<Vec<Picture>> {
    let err = |e: candle_core::Error| ParityError::bundle(path, e.to_string());
    let mut pictures = vec![];
    let (b, c, h, w) = torch.dims4().map_err(err)?;
    let diff: Vec<f64> = values(ours)
        .map_err(err)?
        .iter()
        .zip(values(torch).map_err(err)?)
        .map(|(a, t)| (a - t).abs())
        .collect();
    let at = |bi: usize, ci: usize, p: usize| diff[(bi * c + ci) * h * w + p];
    let vmax = max_of(&diff);
    // Drawn at most MAX_SIDE cells a side.
    let (ph, pw) = pooled_dims(h, w);
    let s = cell(ph, pw);
    let pool = if (ph, pw) != (h, w) { " (max-pooled)" } else { "" };
    let (drawn, note) = (b.min(MAX_ITEMS), drawn_note(b, "batch items"));
    let sheet_err = |m: String| ParityError::bundle(path, m);
    // per batch item: max over channels
    let file = out.join("output_error.png");
    let mut sheet = Sheet::new(
        [
            &format!("{}: output `{name}` ({})", file_name(&file), shape(torch.dims())),
            &format!("{DIFF}, max over the {c} channels{pool}{note}"),
        ],
        &batch_columns(drawn, vmax),
        1,
        (pw * s, ph * s),
    )
    .map_err(sheet_err)?;
    for bi in 0..drawn {
        let map: Vec<f64> = (0..h * w)
            .map(|p| (0..c).map(|ci| at(bi, ci, p)).fold(0.0, f64::max))
            .collect();
        let (map, _) = pooled(&map, (h, w));
        sheet.map((0, bi), &map, (ph, pw), s, vmax);
    }
    sheet.write(&file)?;
    pictures.push(Picture {
        path: file,
        caption: format!(
            "output `{name}`: max over {c} channels of |ours − torch| at each of the {h}×{w} pixels, one panel per \
             batch item (left to right, {b}{note}); scale 0 (black) to {vmax:.3e} (white)"
        ),
    });
    let worst = worst_channels(&diff, (b, c, h * w));
    let file = out.join("output_worst_channels.png");
    let channels: Vec<String> = worst.iter().map(|(ci, _)| ci.to_string()).collect();
    let mut sheet = Sheet::new(
        [
            &format!("{}: output `{name}`", file_name(&file)),
            &format!("{DIFF}{pool}; rows: channels {}{note}", channels.join(", ")),
        ],
        &batch_columns(drawn, vmax),
        worst.len(),
        (pw * s, ph * s),
    )
    .map_err(sheet_err)?;
    for (row, (ci, _)) in worst.iter().enumerate() {
        for bi in 0..drawn {
            let map: Vec<f64> = (0..h * w).map(|p| at(bi, *ci, p)).collect();
            let (map, _) = pooled(&map, (h, w));
            sheet.map((row, bi), &map, (ph, pw), s, vmax);
        }
    }
    sheet.write(&file)?;
    let list: Vec<String> = worst.iter().map(|(ci, m)| format!("{ci} ({m:.3e})")).collect();
    pictures.push(Picture {
        path: file,
        caption: format!(
            "output `{name}`: |ours − torch| of the worst channels, one row each: {}; columns = batch items{note}; \
             scale 0 to {vmax:.3e}",
            list.join(", ")
        ),
    });
    Ok(pictures)
}

/// `<stage>_query_Y_X.png` (`/` in the stage name written `__`): the attention map of query pixel
/// (Y, X) of batch item `batch`, one row per head: PyTorch | ours | difference.
fn probs_picture(
    path: &Path,
    stage: &str,
    (pt, po): (&Tensor, &Tensor),
    (h, w): (usize, usize),
    (qy, qx): (usize, usize),
    batch: usize,
    out: &Path,
) -> Result<Picture> {
    let e = |e: candle_core::Error| ParityError::bundle(path, e.to_string());
    let (_, all_heads, _, lk) = pt.dims4().map_err(e)?;
    let (heads, note) = (all_heads.min(MAX_ITEMS), drawn_note(all_heads, "heads"));
    let n = qy * w + qx;
    let mem = lk - h * w;
    let row = |t: &Tensor, hd: usize| -> Result<Vec<f64>> {
        let r = t
            .get(batch)
            .and_then(|t| t.get(hd))
            .and_then(|t| t.get(n))
            .and_then(|t| t.narrow(0, mem, h * w))
            .map_err(e)?;
        values(&r).map_err(e)
    };
    let s = cell(h, w);
    let mut vmax = 0.0f64;
    let mut dmax = 0.0f64;
    let mut rows = vec![];
    for hd in 0..heads {
        let (a, o) = (row(pt, hd)?, row(po, hd)?);
        let d: Vec<f64> = a.iter().zip(&o).map(|(x, y)| (x - y).abs()).collect();
        vmax = vmax.max(max_of(&a)).max(max_of(&o));
        dmax = dmax.max(max_of(&d));
        rows.push((a, o, d));
    }
    let file = out.join(format!("{}_query_{qy}_{qx}.png", stage.replace('/', "__")));
    let mem_label = if mem > 0 {
        format!("; {mem} memory keys not drawn")
    } else {
        String::new()
    };
    let mut sheet = Sheet::new(
        [
            &format!("`{stage}`: attention weights, batch item {batch}"),
            &format!(
                "query pixel (y {qy}, x {qx}) in cyan; rows: {}{mem_label}{note}",
                head_rows(heads)
            ),
        ],
        &probs_columns(vmax, dmax),
        heads,
        (w * s, h * s),
    )
    .map_err(|m| ParityError::bundle(path, m))?;
    for (hd, (a, o, d)) in rows.iter().enumerate() {
        sheet.map((hd, 0), a, (h, w), s, vmax);
        sheet.map((hd, 1), o, (h, w), s, vmax);
        sheet.map((hd, 2), d, (h, w), s, dmax);
        for p in 0..3 {
            sheet.mark((hd, p), (qy, qx), s);
        }
    }
    sheet.write(&file)?;
    let mem_note = if mem > 0 {
        format!("; the {mem} memory keys are not drawn")
    } else {
        String::new()
    };
    Ok(Picture {
        path: file,
        caption: format!(
            "`{stage}`: attention weights of query pixel (y {qy}, x {qx}) (cyan) over the {h}×{w} key pixels, batch \
             item {batch}, one row per head ({all_heads}{note}): PyTorch | ours (shared scale 0 to {vmax:.3e}) | |ours − torch| \
             (scale 0 to {dmax:.3e}){mem_note}"
        ),
    })
}

/// `output_error.png` for a token output `(B, L, C)`: one panel per batch item, `|ours − torch|`
/// over tokens (rows) × channels (columns), on one scale.
fn token_output_picture(path: &Path, name: &str, torch: &Tensor, ours: &Tensor, out: &Path) -> Result<Picture> {
    let e = |e: candle_core::Error| ParityError::bundle(path, e.to_string());
    let (b, l, c) = torch.dims3().map_err(e)?;
    let (a, o) = (values(torch).map_err(e)?, values(ours).map_err(e)?);
    let diff: Vec<f64> = a.iter().zip(&o).map(|(x, y)| (x - y).abs()).collect();
    let vmax = max_of(&diff);
    let (drawn, note) = (b.min(MAX_ITEMS), drawn_note(b, "batch items"));
    let panels: Vec<_> = diff
        .chunks_exact(l * c)
        .take(drawn)
        .map(|d| pooled(d, (l, c)))
        .collect();
    let (rows, cols) = panels.first().map_or((0, 0), |p| p.1);
    let s = cell(rows, cols);
    let pool = if (rows, cols) != (l, c) { " (max-pooled)" } else { "" };
    let file = out.join("output_error.png");
    let mut sheet = Sheet::new(
        [
            &format!("{}: output `{name}` ({})", file_name(&file), shape(torch.dims())),
            &format!("{DIFF}{pool}; rows: tokens, columns: channels{note}"),
        ],
        &batch_columns(drawn, vmax),
        1,
        (cols * s, rows * s),
    )
    .map_err(|m| ParityError::bundle(path, m))?;
    for (bi, (map, _)) in panels.iter().enumerate() {
        sheet.map((0, bi), map, (rows, cols), s, vmax);
    }
    sheet.write(&file)?;
    Ok(Picture {
        path: file,
        caption: format!(
            "output `{name}`: |ours − torch| over the {l} tokens (rows) × {c} channels (columns){pool}, one panel per \
             batch item (left to right, {b}{note}); scale 0 (black) to {vmax:.3e} (white)"
        ),
    })
}

/// `<stage>_tokens.png` (`/` written `__`): the attention weights `(Lq, Lk)` of batch item `batch`,
/// one row per head: PyTorch | ours | difference.
fn token_probs_picture(
    path: &Path,
    stage: &str,
    pt: &Tensor,
    po: &Tensor,
    batch: usize,
    out: &Path,
) -> Result<Picture> {
    let e = |e: candle_core::Error| ParityError::bundle(path, e.to_string());
    let (_, all_heads, lq, lk) = pt.dims4().map_err(e)?;
    let (heads, note) = (all_heads.min(MAX_ITEMS), drawn_note(all_heads, "heads"));
    let (mut vmax, mut dmax, mut rows) = (0.0f64, 0.0f64, vec![]);
    for hd in 0..heads {
        let map = |t: &Tensor| t.get(batch).and_then(|t| t.get(hd)).and_then(|t| values(&t));
        let (a, o) = (map(pt).map_err(e)?, map(po).map_err(e)?);
        let d: Vec<f64> = a.iter().zip(&o).map(|(x, y)| (x - y).abs()).collect();
        vmax = vmax.max(max_of(&a)).max(max_of(&o));
        dmax = dmax.max(max_of(&d));
        rows.push([pooled(&a, (lq, lk)), pooled(&o, (lq, lk)), pooled(&d, (lq, lk))]);
    }
    let (r, c) = rows.first().map_or((0, 0), |p| p[0].1);
    let s = cell(r, c);
    let pool = if (r, c) != (lq, lk) { " (max-pooled)" } else { "" };
    let file = out.join(format!("{}_tokens.png", stage.replace('/', "__")));
    let mut sheet = Sheet::new(
        [
            &format!("`{stage}`: attention weights, batch item {batch}"),
            &format!("rows: {}; queries down, keys across{pool}{note}", head_rows(heads)),
        ],
        &probs_columns(vmax, dmax),
        heads,
        (c * s, r * s),
    )
    .map_err(|m| ParityError::bundle(path, m))?;
    for (hd, maps) in rows.iter().enumerate() {
        for (p, (map, _)) in maps.iter().enumerate() {
            sheet.map((hd, p), map, (r, c), s, if p == 2 { dmax } else { vmax });
        }
    }
    sheet.write(&file)?;
    Ok(Picture {
        path: file,
        caption: format!(
            "`{stage}`: attention weights of the {lq} queries (rows) over the {lk} keys (columns){pool}, batch item \
             {batch}, one row per head ({all_heads}{note}): PyTorch | ours (shared scale 0 to {vmax:.3e}) | |ours − torch| \
             (scale 0 to {dmax:.3e})"
        ),
    })
}
