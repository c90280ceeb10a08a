//! The pictures' layout: a grid of equally sized panels (rows × columns) under a title strip
//! (two title lines and one heading per column), with a colour scale bar under each column whose
//! ends are labelled with the values they stand for.
//!
//! ```text
//!   output_error.png: output `x` (2x24x5x7)          ← title, line 1
//!   |ours - PyTorch|, max over the 24 channels        ← title, line 2
//!   batch 0            batch 1                        ← one heading per column
//!   [panel]            [panel]                        ← rows of panels
//!   [scale bar]        [scale bar]                    ← the column's colour map, 0 to max
//!   0      1.23e-6     0      1.23e-6
//! ```

use super::font;
use crate::error::Result;
use std::path::Path;

/// Pixels between panels and around the grid.
pub const GAP: usize = 4;
/// One line of text: a glyph and 2 blank rows.
const LINE: usize = font::HEIGHT + 2;
/// Height of the strip above the panels (and their leading gap): a 2-pixel margin, two title lines
/// and the column headings.
pub const TITLE_STRIP: usize = 2 + 3 * LINE;
/// Height of a scale bar.
const BAR: usize = 6;
/// Height of the strip below the panels (and their trailing gap): the scale bar, its labels and a
/// margin.
pub const SCALE_STRIP: usize = BAR + 2 + font::HEIGHT + GAP;
/// The most pixels a picture may have (a safety net: `show` draws at most `MAX_ITEMS` batch items
/// and heads, each at most 512 cells a side, well under it).
pub const MAX_PIXELS: usize = 64 << 20;
/// The title widens a picture to at most this many pixels; a longer title line is cut (`..`).
const MAX_TITLE_WIDTH: usize = 640;

pub const BACKGROUND: [u8; 3] = [96, 96, 96];
const TEXT: [u8; 3] = [255, 255, 255];
const MARK: [u8; 3] = [0, 255, 255];
/// Non-finite values.
const NON_FINITE: [u8; 3] = [0, 255, 0];

/// `t ∈ [0, 1]` → black, purple, red, yellow, white.
pub fn heat(t: f64) -> [u8; 3] {
    const STOPS: [[f64; 3]; 5] = [
        [0., 0., 0.],
        [90., 20., 140.],
        [220., 40., 40.],
        [250., 210., 40.],
        [255., 255., 255.],
    ];
    let t = if t.is_nan() { 0.0 } else { t.clamp(0.0, 1.0) } * (STOPS.len() - 1) as f64;
    let i = (t.floor() as usize).min(STOPS.len() - 2);
    let f = t - i as f64;
    let mut out = [0u8; 3];
    for (k, o) in out.iter_mut().enumerate() {
        *o = (STOPS[i][k] + f * (STOPS[i + 1][k] - STOPS[i][k])).round() as u8;
    }
    out
}

/// The label of a scale's end: `0`, else three significant digits (`1.23e-6`).
pub fn scale_label(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else {
        format!("{v:.2e}")
    }
}

/// `text` cut to at most `width` pixels, ending in `..` where it was cut.
fn fit(text: &str, width: usize) -> String {
    if font::width(text) <= width {
        return text.to_string();
    }
    let n = (width + font::ADVANCE - 5) / font::ADVANCE;
    let mut s: String = text.chars().take(n.saturating_sub(2)).collect();
    s.push_str(&".."[..n.min(2)]);
    s
}

/// One column of panels: its heading and the top of its colour scale (the bottom is 0).
pub struct Column {
    pub heading: String,
    pub vmax: f64,
}

/// An RGB canvas.
struct Canvas {
    w: usize,
    h: usize,
    rgb: Vec<u8>,
}

impl Canvas {
    fn new(w: usize, h: usize) -> Self {
        Self {
            w,
            h,
            rgb: BACKGROUND.repeat(w * h),
        }
    }

    fn set(&mut self, x: usize, y: usize, colour: [u8; 3]) {
        if x < self.w && y < self.h {
            let i = (y * self.w + x) * 3;
            self.rgb[i..i + 3].copy_from_slice(&colour);
        }
    }

    fn text(&mut self, text: &str, at: (usize, usize)) {
        font::draw(text, at, |x, y| self.set(x, y, TEXT));
    }
}

/// A picture being drawn: the labelled grid of [the module docs](self).
pub struct Sheet {
    canvas: Canvas,
    /// Panel size in pixels (w, h).
    panel: (usize, usize),
    /// From one column's left edge to the next's.
    pitch: usize,
}

impl Sheet {
    /// A sheet of `rows` rows of `panel`-sized (w, h pixels) panels under `title`, one column per
    /// entry of `columns`, with the title, headings and scale bars drawn. A column is at least as
    /// wide as its heading and scale labels.
    /// An error when the picture would have more than [`MAX_PIXELS`] pixels.
    pub fn new(
        title: [&str; 2],
        columns: &[Column],
        rows: usize,
        panel: (usize, usize),
    ) -> std::result::Result<Self, String> {
        let (pw, ph) = panel;
        let scale_width = |c: &Column| font::width("0") + font::ADVANCE + font::width(&scale_label(c.vmax));
        let slot = columns
            .iter()
            .flat_map(|c| [font::width(&c.heading), scale_width(c)])
            .fold(pw, usize::max);
        let pitch = slot + GAP;
        let title_width = title.iter().map(|t| font::width(t)).max().unwrap_or(0) + 2 * GAP;
        let w = (columns.len() * pitch + GAP).max(title_width.min(MAX_TITLE_WIDTH));
        let h = rows
            .checked_mul(ph + GAP)
            .map(|panels| TITLE_STRIP + panels + GAP + SCALE_STRIP)
            .filter(|h| h.checked_mul(w).is_some_and(|px| px <= MAX_PIXELS))
            .ok_or_else(|| {
                format!(
                    "the picture would be {w} pixels wide and {rows} rows of {ph} pixels high, more than {MAX_PIXELS} \
                     pixels"
                )
            })?;
        let mut canvas = Canvas::new(w, h);
        for (i, line) in title.iter().enumerate() {
            canvas.text(&fit(line, w - 2 * GAP), (GAP, 2 + i * LINE));
        }
        for (j, column) in columns.iter().enumerate() {
            let x = GAP + j * pitch;
            canvas.text(&fit(&column.heading, slot), (x, 2 + 2 * LINE));
            // the bar: the colour map from 0 (left) to 1 (right), as wide as the panel
            let y = h - SCALE_STRIP;
            for dx in 0..pw {
                let colour = heat(if pw > 1 { dx as f64 / (pw - 1) as f64 } else { 0.0 });
                for dy in 0..BAR {
                    canvas.set(x + dx, y + dy, colour);
                }
            }
            let top = scale_label(column.vmax);
            canvas.text("0", (x, y + BAR + 2));
            let right = x + pw.max(scale_width(column));
            canvas.text(&top, (right - font::width(&top), y + BAR + 2));
        }
        Ok(Self { canvas, panel, pitch })
    }

    /// The top left pixel of the panel at (`row`, `column`).
    fn origin(&self, row: usize, column: usize) -> (usize, usize) {
        (
            GAP + column * self.pitch,
            TITLE_STRIP + GAP + row * (self.panel.1 + GAP),
        )
    }

    /// Draw `values` (`rows × cols` cells, row-major) into the panel at `at` (row, column), each
    /// value a `scale`-pixel square coloured on `[0, vmax]`.
    pub fn map(&mut self, at: (usize, usize), values: &[f64], (rows, cols): (usize, usize), scale: usize, vmax: f64) {
        let (x0, y0) = self.origin(at.0, at.1);
        for r in 0..rows {
            for c in 0..cols {
                let v = values[r * cols + c];
                let t = if vmax > 0.0 && v.is_finite() { v / vmax } else { 0.0 };
                let colour = if v.is_finite() { heat(t) } else { NON_FINITE };
                for dy in 0..scale {
                    for dx in 0..scale {
                        self.canvas.set(x0 + c * scale + dx, y0 + r * scale + dy, colour);
                    }
                }
            }
        }
    }

    /// Outline cell (`cy`, `cx`) of `scale` pixels in the panel at `at` (the chosen query pixel) in
    /// cyan.
    pub fn mark(&mut self, at: (usize, usize), (cy, cx): (usize, usize), scale: usize) {
        let (x0, y0) = self.origin(at.0, at.1);
        let (x0, y0) = (x0 + cx * scale, y0 + cy * scale);
        for d in 0..scale {
            for (x, y) in [
                (x0 + d, y0),
                (x0 + d, y0 + scale - 1),
                (x0, y0 + d),
                (x0 + scale - 1, y0 + d),
            ] {
                self.canvas.set(x, y, MARK);
            }
        }
    }

    /// Write the picture as a PNG file, never through a link planted at `path`
    /// ([`crate::files::write_new`]); a failure is a write error.
    pub fn write(&self, path: &Path) -> Result<()> {
        let (w, h) = (self.canvas.w as u32, self.canvas.h as u32);
        crate::files::write_new(path, |file| {
            let mut enc = png::Encoder::new(std::io::BufWriter::new(file), w, h);
            enc.set_color(png::ColorType::Rgb);
            enc.set_depth(png::BitDepth::Eight);
            let mut writer = enc.write_header().map_err(png_io)?;
            writer.write_image_data(&self.canvas.rgb).map_err(png_io)?;
            writer.finish().map_err(png_io)
        })
    }
}

/// The PNG encoder's error as the I/O error it almost always is (a full disk).
fn png_io(e: png::EncodingError) -> std::io::Error {
    match e {
        png::EncodingError::IoError(e) => e,
        other => std::io::Error::other(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pixel(s: &Sheet, x: usize, y: usize) -> [u8; 3] {
        let i = (y * s.canvas.w + x) * 3;
        s.canvas.rgb[i..i + 3].try_into().unwrap()
    }

    #[test]
    fn every_label_character_has_a_glyph() {
        // the fixed words of the pictures' labels and every character a number or shape prints
        let words = "output_error.png output_worst_channels.png probs_query_2_3.png probs_tokens.png \
                     `x` (2x24x5x7) |ours - PyTorch| ours PyTorch max over the channels, batch item rows: \
                     heads 0-11; head tokens columns queries x keys (max-pooled) query pixel (y 2, x 3) in \
                     cyan memory keys not drawn attentions.0__transformer_blocks.0__attn1__probs";
        let numbers: String = [0.0, 1.0, -2.5e-7, 3.25e12, 1e-300, f64::NAN, f64::INFINITY]
            .iter()
            .map(|&v| scale_label(v) + &format!("{v:?} {v}"))
            .collect();
        for c in words.chars().chain(numbers.chars()) {
            assert!(font::glyph(c).is_some(), "no glyph for {c:?}");
        }
    }

    #[test]
    fn labels_and_scale_bars_are_drawn() {
        let columns = [
            Column {
                heading: "PyTorch".into(),
                vmax: 0.5,
            },
            Column {
                heading: "|ours - PyTorch|".into(),
                vmax: 0.0,
            },
        ];
        // narrow panels: columns widen to their labels
        let s = Sheet::new(["a.png", "what"], &columns, 2, (8, 8)).unwrap();
        assert_eq!(s.pitch, font::width("|ours - PyTorch|") + GAP);
        assert_eq!(s.canvas.h, TITLE_STRIP + 2 * 12 + GAP + SCALE_STRIP);
        let y = s.canvas.h - SCALE_STRIP;
        for j in 0..2 {
            let x = GAP + j * s.pitch;
            assert_eq!(pixel(&s, x, y), [0, 0, 0]);
            assert_eq!(pixel(&s, x + 7, y + BAR - 1), [255, 255, 255]);
            assert_eq!(pixel(&s, x + 8, y), BACKGROUND);
        }
        let lit = (0..s.canvas.w).filter(|&x| pixel(&s, x, 2 + 3) != BACKGROUND).count();
        assert!(lit > 0, "title line drawn");
        // a title longer than the widest picture is cut
        let long = "x".repeat(200);
        let s = Sheet::new([&long, ""], &columns, 1, (8, 8)).unwrap();
        assert_eq!(s.canvas.w, MAX_TITLE_WIDTH);
        assert!(fit(&long, 100).ends_with("..") && font::width(&fit(&long, 100)) <= 100);
        assert_eq!(fit("abc", 100), "abc");
    }
}
