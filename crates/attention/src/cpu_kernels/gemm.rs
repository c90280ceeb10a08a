//! The GEMM behind the CPU linear layers and convolutions: `C (M × N) = A (M × K) · B (K × N)`
//! in f32, one operand a weight packed once when the layer is built, the other packed per call a
//! cache block at a time, the bias, a per-(item, row) term, a residual and a divisor applied as
//! the result is written out.
//!
//! * Convolutions: `A` is the weight `(C_out, C_in·k·k)` ([`PackedRows`]), `B` the image read
//!   as its im2col matrix `(C_in·k·k, H·W)` without forming it ([`super::im2col`]: each task
//!   packs only the `KC × NC` block it is about to use), `C` the output `(C_out, H·W)` of each
//!   batch item.
//! * Linear layers: `A` is the token rows `(tokens, in)`, `B` the weight transposed
//!   `(in, out)` ([`PackedCols`]), `C` the output tokens `(tokens, out)`.
//!
//! The loops are the usual cache blocking of a GEMM. The reduction is cut into `KC`-deep blocks
//! (a `KC × NR` panel of `B` stays in L1 while the task's `A` micro-panels pass it); a task owns
//! an `MC × NC` block of `C` and walks the `K` blocks, adding each block's products into its own
//! accumulator (rows padded off large power-of-two strides), so every output is a sum of
//! `K / KC` partial sums of `KC` products each: blocked accumulation, as oneDNN's convolutions
//! and MKL's GEMMs do, with an f32 error that grows with `KC + K / KC` rather than with `K`.
//! `KC`, `MC` and `NC` come from the L1 and L2 sizes the CPU reports ([`Blocking`]).
//!
//! The register tiles: 6 × 16 with AVX2 and FMA (12 of the 16 `ymm` registers accumulate), the
//! 12 × 32 AVX-512 tile the attention kernel's score tiles use, where the CPU has AVX-512F (both
//! in [`crate::cpu::microkernel`]). Other CPUs take Candle's ops ([`Isa::with_tiles`] gives `None`).

pub(crate) use super::packed::{Held, PackedCols, PackedRows};
use crate::cpu::caches;
use crate::cpu::isa::Isa;
use crate::cpu::microkernel::{avx2, avx512, tile, ALayout};
use crate::cpu::scratch::with_scratch;
use rayon::prelude::*;

mod amx;

/// Block sizes from the cache sizes the CPU reports (Linux sysfs; 32 KiB L1d and 512 KiB L2
/// where it reports none).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Blocking {
    /// Depth of a reduction block: a `KC × NR` panel of `B` fills about a third of L1d.
    pub(crate) kc: usize,
    /// Rows of `A` per task: an `MC × KC` block of `A` fills about a quarter of L2.
    pub(crate) mc: usize,
    /// Columns of `B` per task: the task's `MC × NC` accumulator fills about a quarter of L2.
    pub(crate) nc: usize,
    /// L2 bytes.
    pub(super) l2: usize,
}

impl Blocking {
    pub(crate) fn for_isa(isa: Isa) -> Blocking {
        let (l1, l2) = caches::sizes();
        let (mr, nr) = (isa.mr(), isa.nr());
        let kc = (l1 / 3 / (4 * nr)).clamp(64, 512) / 8 * 8;
        let mc = ((l2 / 4 / (4 * kc)).clamp(4 * mr, 1024) / mr * mr).max(mr);
        let nc = ((l2 / 4 / (4 * mc)).clamp(4 * nr, 1024) / nr * nr).max(nr);
        Blocking { kc, mc, nc, l2 }
    }

    /// For a `B` packed per call from an image (convolutions): tasks take up to 1024 rows
    /// (output channels), so each image block is packed once rather than once per row block
    /// (the tile reads its `A` micro-panel at a few bytes per cycle, which L3 supplies), and
    /// fewer columns, so the accumulator still fits a quarter of L2.
    fn for_image_b(self, isa: Isa, m: usize) -> Blocking {
        let (mr, nr) = (isa.mr(), isa.nr());
        let mc = m.clamp(mr, 1024).div_ceil(mr) * mr;
        let nc = ((self.l2 / 4 / (4 * mc)).clamp(4 * nr, 1024) / nr * nr).max(nr);
        Blocking { mc, nc, ..self }
    }
}

/// `0..k` in reduction blocks of `kc`, the last one taking a remainder of up to `kc / 4`.
pub(crate) fn k_blocks(k: usize, kc: usize) -> Vec<(usize, usize)> {
    let mut out = vec![];
    let mut p0 = 0;
    while p0 < k {
        let left = k - p0;
        let len = if left <= kc + kc / 4 { left } else { kc };
        out.push((p0, len));
        p0 += len;
    }
    out
}

/// Whether products of bf16 values with a weight held as `held` run on the AMX bf16 tiles (then
/// a layer passes bf16 token rows as they are, [`RowsOf::Bf16Matrix`]).
pub(crate) fn bf16_tiles(isa: Isa, held: Held) -> bool {
    held == Held::Bf16 && isa == Isa::Avx512 && crate::cpu::microkernel::amx::available()
}

/// The `A` operand of a call.
pub(crate) enum RowsOf<'a> {
    /// A packed weight.
    Packed(&'a PackedRows),
    /// Row-major `(M, K)` activations (token rows), rows `lda` (≥ `K`) apart: `(M − 1)·lda + K`
    /// values or more; read in place by the tiles.
    Matrix(&'a [f32], usize),
    /// Row-major `(M, K)` bf16 activations (their bits), rows `lda` apart: only where the AMX
    /// tiles run ([`crate::cpu::microkernel::amx::available`]) with a weight held in bf16.
    Bf16Matrix(&'a [u16], usize),
}

/// The `B` operand of a call.
pub(crate) enum ColsOf<'a> {
    /// A packed weight, transposed.
    Packed(&'a PackedCols),
    /// The im2col matrix of `batch` images, packed by each task ([`super::im2col::Image`]).
    Image(super::im2col::Image<'a>),
}

/// The bias of the output.
#[derive(Clone, Copy)]
pub(crate) enum Bias<'a> {
    None,
    /// One value per row of `C` (output channel of a convolution).
    PerRow(&'a [f32]),
    /// One value per column of `C` (output feature of a linear layer).
    PerCol(&'a [f32]),
}

/// What the write-out adds, in PyTorch's order, each step an f32 operation: `((c + bias) +
/// item_row[item, row] + residual) / div`.
#[derive(Clone, Copy)]
pub(crate) struct Epilogue<'a> {
    pub(crate) bias: Bias<'a>,
    /// `(batch, M)`: one value per batch item and row (a time embedding added to a conv output).
    pub(crate) item_row: Option<&'a [f32]>,
    /// Laid out as the output.
    pub(crate) residual: Option<&'a [f32]>,
    pub(crate) div: Option<f32>,
    /// With a paired weight ([`PackedCols::new_paired`]): write `hidden · gelu(gate)`, `n` wide,
    /// instead of both halves (GEGLU in the write-out; nothing else may be set but the bias).
    pub(crate) geglu: bool,
    /// With [`Epilogue::geglu`]: output rows this many values apart (≥ `n`; the values between
    /// rows are left as they are) instead of `n`.
    pub(crate) out_ld: Option<usize>,
}

impl Epilogue<'_> {
    pub(crate) const NONE: Epilogue<'static> = Epilogue {
        bias: Bias::None,
        item_row: None,
        residual: None,
        div: None,
        geglu: false,
        out_ld: None,
    };
}

/// One product of a [`gemm_batch`]: `out = epilogue(A · B)`.
pub(crate) struct Product<'a> {
    pub(crate) a: RowsOf<'a>,
    pub(crate) b: ColsOf<'a>,
    pub(crate) epi: Epilogue<'a>,
    pub(crate) out: &'a mut [f32],
}

/// `out = epilogue(A · B)`: `(batch, M, N)` row-major, where `batch` is the image count of an
/// image `B` and 1 otherwise.
pub(crate) fn gemm(isa: Isa, blocking: Blocking, a: RowsOf, b: ColsOf, epi: Epilogue, out: &mut [f32]) {
    gemm_batch(isa, blocking, vec![Product { a, b, epi, out }]);
}

/// Several independent products as one parallel call: their tasks are pooled, so the threads
/// meet once, not once per product (the 16 small products of a Winograd convolution).
pub(crate) fn gemm_batch(isa: Isa, blocking: Blocking, products: Vec<Product>) {
    // Each product's share of the tasks a call wants (at least two per thread in all).
    let share = (2 * rayon::current_num_threads()).div_ceil(products.len().max(1));
    let calls: Vec<Call> = products
        .into_iter()
        .filter_map(|p| Call::new(isa, blocking, p, share))
        .collect();
    // `first[i]`: the index of call i's first task.
    let mut first = Vec::with_capacity(calls.len() + 1);
    let mut total = 0;
    for c in &calls {
        first.push(total);
        total += c.grid.tasks();
    }
    (0..total).into_par_iter().for_each(|t| {
        let i = first.partition_point(|&f| f <= t) - 1;
        let call = &calls[i];
        call.job
            .run(call.grid.task(t - first[i], call.job.m, call.job.n), call.out);
    });
}

/// One product prepared: its shared state, its tasks and its output.
struct Call<'a> {
    job: Job<'a>,
    grid: Grid,
    out: OutPtr,
}

impl<'a> Call<'a> {
    /// `None` for an empty product.
    fn new(isa: Isa, blocking: Blocking, p: Product<'a>, share: usize) -> Option<Call<'a>> {
        let Product { a, b, epi, out } = p;
        let (m, k_a) = match &a {
            RowsOf::Packed(p) => (p.rows, p.k),
            RowsOf::Matrix(x, lda) => {
                let k = b_depth(&b);
                assert!(*lda >= k, "activation rows closer than their length");
                (x.len().div_ceil((*lda).max(1)), k)
            }
            RowsOf::Bf16Matrix(x, lda) => {
                let k = b_depth(&b);
                assert!(*lda >= k, "activation rows closer than their length");
                (x.len().div_ceil((*lda).max(1)), k)
            }
        };
        let (n, batch) = match &b {
            ColsOf::Packed(p) => (p.cols, 1),
            ColsOf::Image(img) => (img.h * img.w, img.batch),
        };
        let pairs = match &b {
            ColsOf::Packed(p) => p.pairs,
            ColsOf::Image(_) => None,
        };
        // Output columns: a paired weight's `2·n`, or `n` with GEGLU.
        let n_out = match pairs {
            Some(half) if epi.geglu => half,
            Some(half) => 2 * half,
            None => n,
        };
        let k = b_depth(&b);
        assert_eq!(k_a, k, "GEMM operands disagree on the reduction length");
        match epi.out_ld {
            Some(ld) => assert!(epi.geglu && ld >= n_out && out.len() == m * ld),
            None => assert_eq!(out.len(), batch * m * n_out),
        }
        assert!(pairs.is_some() || !epi.geglu, "GEGLU needs a paired weight");
        let only_bias = epi.item_row.is_none() && epi.residual.is_none() && epi.div.is_none();
        assert!(pairs.is_none() || (only_bias && !matches!(epi.bias, Bias::PerRow(_))));
        assert!(epi.residual.is_none_or(|r| r.len() == out.len()));
        assert!(epi.item_row.is_none_or(|t| t.len() == batch * m));
        if m == 0 || n == 0 || batch == 0 {
            return None;
        }
        // Reduction blocks: those of the packed operand (fixed when it was packed); two packed
        // operands must agree.
        let blocks = match (&a, &b) {
            (RowsOf::Packed(p), ColsOf::Packed(q)) => {
                assert_eq!(
                    p.blocks, q.blocks,
                    "packed GEMM operands disagree on the reduction blocks"
                );
                p.blocks.clone()
            }
            (RowsOf::Packed(p), _) => p.blocks.clone(),
            (_, ColsOf::Packed(p)) => p.blocks.clone(),
            _ => k_blocks(k, blocking.kc),
        };
        let blocking = match &b {
            ColsOf::Image(_) => blocking.for_image_b(isa, m),
            ColsOf::Packed(_) => blocking,
        };
        let bf16_tiles = amx::applies(isa, &a, &b);
        assert!(
            bf16_tiles || !matches!(a, RowsOf::Bf16Matrix(..)),
            "bf16 activations need the AMX tiles and a weight held in bf16"
        );
        // A paired weight's tasks take whole pairs of panels; AMX tasks whole 32-row tiles.
        let step = if pairs.is_some() { 2 * isa.nr() } else { isa.nr() };
        let mr = if bf16_tiles { amx::ROWS } else { isa.mr() };
        let grid = Grid::new((mr, isa.nr()), blocking, batch, m, (n, step), share);
        let out = OutPtr {
            ptr: out.as_mut_ptr(),
            len: out.len(),
        };
        let job = Job {
            isa,
            a,
            b,
            blocks,
            epi,
            m,
            n,
            pairs,
            bf16_tiles,
        };
        Some(Call { job, grid, out })
    }
}

fn b_depth(b: &ColsOf) -> usize {
    match b {
        ColsOf::Packed(p) => p.k,
        ColsOf::Image(img) => img.channels * img.ksize * img.ksize,
    }
}

/// The output of a call, shared by its tasks; each task takes only the rows of its own block
/// ([`OutPtr::row`]), so no two tasks hold a reference to the same element.
#[derive(Clone, Copy)]
struct OutPtr {
    ptr: *mut f32,
    len: usize,
}
// SAFETY: the pointer is only turned into slices of disjoint task blocks (see `OutPtr::row`).
unsafe impl Send for OutPtr {}
// SAFETY: as for `Send`: tasks sharing an `OutPtr` write disjoint blocks through it.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// `len` values from `start`, for the one task whose block they lie in.
    ///
    /// # Safety
    /// No other live reference may overlap `start .. start + len`: a task asks only for the
    /// runs of its own `(item, rows, columns)` block, and tasks' blocks are disjoint.
    #[allow(clippy::mut_from_ref)]
    unsafe fn row(&self, start: usize, len: usize) -> &mut [f32] {
        assert!(start + len <= self.len);
        // SAFETY: in bounds (asserted); exclusive by the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(start), len) }
    }
}

/// How `(batch, M, N)` is cut into tasks.
struct Grid {
    batch: usize,
    mc: usize,
    nc: usize,
    m_tasks: usize,
    n_tasks: usize,
}

/// One task's block of `C`: batch item, first row, rows, first column, columns.
#[derive(Clone, Copy)]
struct Task {
    item: usize,
    m0: usize,
    rows: usize,
    n0: usize,
    cols: usize,
}

impl Grid {
    /// Blocks of at most `MC × NC`, made smaller (down to 4 tiles a side) until there are at
    /// least `want` tasks, and balanced (equal sizes up to a tile).
    /// Column blocks are whole multiples of `step` (the panel width, or two for a paired weight).
    fn new(
        (mr, _): (usize, usize),
        blocking: Blocking,
        batch: usize,
        m: usize,
        (n, step): (usize, usize),
        want: usize,
    ) -> Grid {
        let nr = step;
        let (mut mc, mut nc) = (
            blocking.mc.min(m.div_ceil(mr) * mr),
            blocking.nc.min(n.div_ceil(nr) * nr),
        );
        let count = |mc: usize, nc: usize| batch * m.div_ceil(mc) * n.div_ceil(nc);
        while count(mc, nc) < want {
            if nc >= mc / 2 && nc > 4 * nr {
                nc = (nc / 2).div_ceil(nr) * nr;
            } else if mc > 4 * mr {
                mc = (mc / 2).div_ceil(mr) * mr;
            } else {
                break;
            }
        }
        let (m_tasks, n_tasks) = (m.div_ceil(mc), n.div_ceil(nc));
        let mc = m.div_ceil(m_tasks).div_ceil(mr) * mr;
        let nc = n.div_ceil(n_tasks).div_ceil(nr) * nr;
        Grid {
            batch,
            mc,
            nc,
            m_tasks: m.div_ceil(mc),
            n_tasks: n.div_ceil(nc),
        }
    }

    fn tasks(&self) -> usize {
        self.batch * self.m_tasks * self.n_tasks
    }

    fn task(&self, t: usize, m: usize, n: usize) -> Task {
        let (item, rest) = (t / (self.m_tasks * self.n_tasks), t % (self.m_tasks * self.n_tasks));
        let (mi, ni) = (rest / self.n_tasks, rest % self.n_tasks);
        let (m0, n0) = (mi * self.mc, ni * self.nc);
        Task {
            item,
            m0,
            rows: self.mc.min(m - m0),
            n0,
            cols: self.nc.min(n - n0),
        }
    }
}

/// The `A` rows of a task and reduction block.
struct ARows<'a> {
    values: &'a [f32],
    /// Rows `lda` apart, or micro-panels of `mr × kc` values interleaved.
    layout: ALayout,
    kc: usize,
    /// A micro-panel held in a copy instead: (index, values, row stride).
    tail: Option<(usize, &'a [f32], usize)>,
}

impl ARows<'_> {
    /// All micro-panels as `(first values, layout, distance between micro-panels)`, where none is
    /// held in a copy.
    fn column(&self, mr: usize) -> Option<(&[f32], ALayout, usize)> {
        let step = match self.layout {
            ALayout::Rows(lda) => mr * lda,
            ALayout::Interleaved => mr * self.kc,
        };
        self.tail.is_none().then_some((self.values, self.layout, step))
    }

    /// Micro-panel `mp` of `mr` rows: its first value and layout.
    fn panel(&self, mp: usize, mr: usize) -> (&[f32], ALayout) {
        match (self.tail, self.layout) {
            (Some((i, values, lda)), _) if i == mp => (values, ALayout::Rows(lda)),
            (_, ALayout::Rows(lda)) => (&self.values[mp * mr * lda..], self.layout),
            (_, ALayout::Interleaved) => (&self.values[mp * mr * self.kc..], self.layout),
        }
    }
}

/// The shared state of one call.
struct Job<'a> {
    isa: Isa,
    a: RowsOf<'a>,
    b: ColsOf<'a>,
    blocks: Vec<(usize, usize)>,
    epi: Epilogue<'a>,
    m: usize,
    n: usize,
    /// A paired weight's hidden width (see [`Job::write_pairs`]).
    pairs: Option<usize>,
    /// The products run on the AMX bf16 tiles ([`amx`]).
    bf16_tiles: bool,
}

impl Job<'_> {
    /// One task: every reduction block into the task's accumulator, then the write-out.
    fn run(&self, t: Task, out: OutPtr) {
        if self.bf16_tiles {
            return self.run_amx(t, out);
        }
        let (mr, nr) = (self.isa.mr(), self.isa.nr());
        let (rows_p, panels) = (t.rows.div_ceil(mr) * mr, t.cols.div_ceil(nr));
        // Accumulator rows padded off multiples of 1 KiB (a column of tiles in few L1 sets).
        let ldc = panels * nr + if (panels * nr) % 256 == 0 { 16 } else { 0 };
        let kc_max = self.blocks.iter().map(|b| b.1).max().unwrap_or(0);
        // Whole cache lines, so that the image panels after it start on one as the scratch does.
        // (A packed weight held in half precision is widened into these buffers a block at a
        // time.)
        let a_len = match self.a {
            RowsOf::Matrix(..) | RowsOf::Bf16Matrix(..) => (mr * kc_max).next_multiple_of(16),
            RowsOf::Packed(p) if p.held() != Held::F32 => (rows_p * kc_max).next_multiple_of(16),
            RowsOf::Packed(_) => 0,
        };
        // A weight held in half precision against token rows on AVX-512: its panels read as they
        // are by the half-precision tile (widened as loaded, the same bits), no widened copy.
        let half_b = match (self.isa, &self.a, &self.b) {
            (Isa::Avx512, RowsOf::Matrix(..), ColsOf::Packed(p)) => p.half_bits(),
            _ => None,
        };
        let b_len = match self.b {
            ColsOf::Image(_) => panels * nr * kc_max,
            ColsOf::Packed(p) if p.held() != Held::F32 && half_b.is_none() => panels * nr * kc_max,
            ColsOf::Packed(_) => 0,
        };
        let need = rows_p * ldc + a_len + b_len;
        with_scratch(need, |scratch| {
            let (acc, rest) = scratch.split_at_mut(rows_p * ldc);
            let (a_buf, b_buf) = rest.split_at_mut(a_len);
            for (bi, &(p0, kcb)) in self.blocks.iter().enumerate() {
                if let (Some((bits, held)), ColsOf::Packed(p)) = (half_b, &self.b) {
                    let start = p.panels * nr * p0 + (t.n0 / nr) * kcb * nr;
                    let a_rows = self.a_rows(t, p0, kcb, a_buf);
                    for jp in 0..panels {
                        let b_pan = (&bits[start + jp * kcb * nr..][..kcb * nr], held == Held::Bf16);
                        for mp in 0..t.rows.div_ceil(mr) {
                            let rows = mr.min(t.rows - mp * mr);
                            let (a_pan, ALayout::Rows(lda)) = a_rows.panel(mp, mr) else {
                                unreachable!("token rows are read as rows")
                            };
                            let c = &mut acc[mp * mr * ldc + jp * nr..];
                            avx512::gemm_tile_half_b(rows, (a_pan, lda), b_pan, kcb, c, ldc, bi > 0);
                        }
                    }
                    continue;
                }
                let b_blk = self.b_block(t, p0, kcb, b_buf);
                if let (ColsOf::Image(img), Some(&(p1, kc1))) = (&self.b, self.blocks.get(bi + 1)) {
                    img.prefetch(t.item, p1, kc1, t.n0, t.cols);
                }
                let a_rows = self.a_rows(t, p0, kcb, a_buf);
                let column = a_rows.column(mr).filter(|_| self.isa == Isa::Avx2);
                for jp in 0..panels {
                    let b_pan = &b_blk[jp * kcb * nr..][..kcb * nr];
                    if let Some(a_col) = column {
                        avx2::tile_column(t.rows, a_col, kcb, b_pan, (&mut acc[jp * nr..], ldc), bi > 0);
                        continue;
                    }
                    for mp in 0..t.rows.div_ceil(mr) {
                        let rows = mr.min(t.rows - mp * mr);
                        let a_pan = a_rows.panel(mp, mr);
                        let c = &mut acc[mp * mr * ldc + jp * nr..];
                        tile(self.isa, rows, a_pan, kcb, b_pan, c, ldc, bi > 0);
                    }
                }
            }
            match self.pairs {
                Some(half) => self.write_pairs(t, acc, ldc, half, out),
                None => self.write_out(t, acc, ldc, out),
            }
        });
    }

    /// The task's rows of `A` over `[p0, p0 + kcb)`: a packed weight's (interleaved or `kcb`
    /// apart), or the activation rows read in place (`lda` apart; token rows are few and reused
    /// across many column panels, so the short row streams cost little: packing them per task
    /// measured 12 % slower, `docs/bench/notes.md`), except a short last
    /// micro-panel that the tile would read past (whole 4-row groups on AVX-512), copied
    /// zero-padded into `buf`.
    fn a_rows<'s>(&'s self, t: Task, p0: usize, kcb: usize, buf: &'s mut [f32]) -> ARows<'s> {
        let mr = self.isa.mr();
        match self.a {
            RowsOf::Packed(p) => ARows {
                values: {
                    let start = p.rows_p * p0 + t.m0 * kcb;
                    let len = (t.rows.div_ceil(mr) * mr * kcb).min(p.rows_p * (p0 + kcb) - start);
                    p.values(start, len, buf)
                },
                layout: match p.il {
                    1 => ALayout::Rows(kcb),
                    il => {
                        assert_eq!(il, mr, "micro-panels interleaved for another tile");
                        ALayout::Interleaved
                    }
                },
                kc: kcb,
                tail: None,
            },
            RowsOf::Bf16Matrix(..) => unreachable!("bf16 activations run on the AMX tiles"),
            RowsOf::Matrix(x, k) => {
                let last = t.rows.div_ceil(mr) - 1;
                let short = t.rows - last * mr;
                let copy = self.isa == Isa::Avx512 && !short.is_multiple_of(4);
                if copy {
                    for (r, dst) in buf[..mr * kcb].chunks_exact_mut(kcb).enumerate() {
                        let row = t.m0 + last * mr + r;
                        match x.get(row * k + p0..row * k + p0 + kcb).filter(|_| r < short) {
                            Some(src) => dst.copy_from_slice(src),
                            None => dst.fill(0.0),
                        }
                    }
                }
                ARows {
                    values: &x[t.m0 * k + p0..],
                    layout: ALayout::Rows(k),
                    kc: kcb,
                    tail: copy.then_some((last, &buf[..mr * kcb], kcb)),
                }
            }
        }
    }

    /// The task's panels of `B` over `[p0, p0 + kcb)`.
    fn b_block<'s>(&'s self, t: Task, p0: usize, kcb: usize, buf: &'s mut [f32]) -> &'s [f32] {
        let nr = self.isa.nr();
        match self.b {
            ColsOf::Packed(p) => {
                let start = p.panels * nr * p0 + (t.n0 / nr) * kcb * nr;
                p.values(start, t.cols.div_ceil(nr) * nr * kcb, buf)
            }
            ColsOf::Image(img) => {
                let len = t.cols.div_ceil(nr) * nr * kcb;
                img.pack(t.item, p0, kcb, t.n0, t.cols, nr, &mut buf[..len]);
                &buf[..len]
            }
        }
    }

    /// The write-out of a paired weight (hidden width `half`): per pair of panels, `h = acc + bias`
    /// and `g = acc + bias` (the same f32 steps as [`Job::write_out`]), then `h · gelu(g)` into
    /// output columns `j·NR ..` of `(M, half)` with [`Epilogue::geglu`], else `h` and `g` into
    /// their own columns of `(M, 2·half)`.
    fn write_pairs(&self, t: Task, acc: &[f32], ldc: usize, half: usize, out: OutPtr) {
        let nr = self.isa.nr();
        let geglu = self.epi.geglu;
        let width = if geglu { half } else { 2 * half };
        let ld = self.epi.out_ld.unwrap_or(width);
        let bias = match self.epi.bias {
            Bias::PerCol(b) => Some(b),
            _ => None,
        };
        let (mut h, mut g) = ([0f32; 32], [0f32; 32]);
        for r in 0..t.rows {
            let start = (t.m0 + r) * ld;
            for q in 0..t.cols / (2 * nr) {
                // Packed column `pc` starts the pair whose hidden columns begin at `pc / 2`.
                let pc = t.n0 + 2 * q * nr;
                let c0 = pc / 2;
                if c0 >= half {
                    break;
                }
                let w = nr.min(half - c0);
                let src = &acc[r * ldc + 2 * q * nr..][..2 * nr];
                for j in 0..w {
                    let (bh, bg) = bias.map_or((0.0, 0.0), |b| (b[pc + j], b[pc + nr + j]));
                    (h[j], g[j]) = if bias.is_some() {
                        (src[j] + bh, src[nr + j] + bg)
                    } else {
                        (src[j], src[nr + j])
                    };
                }
                // These runs lie in this task's columns of the output (pairs map to disjoint
                // output columns), which no other task touches.
                if geglu {
                    // SAFETY: this task's columns (above).
                    let row = unsafe { out.row(start + c0, w) };
                    super::geglu_row(row, &h[..w], &g[..w]);
                } else {
                    // SAFETY: this task's columns (above).
                    unsafe { out.row(start + c0, w) }.copy_from_slice(&h[..w]);
                    // SAFETY: this task's columns (above).
                    unsafe { out.row(start + half + c0, w) }.copy_from_slice(&g[..w]);
                }
            }
        }
    }

    /// `out[item, m0.., n0..] = epilogue(acc)`.
    fn write_out(&self, t: Task, acc: &[f32], ldc: usize, out: OutPtr) {
        let (m, n, epi) = (self.m, self.n, self.epi);
        for r in 0..t.rows {
            let row = t.m0 + r;
            let start = (t.item * m + row) * n + t.n0;
            // SAFETY: this row run lies in this task's block, which no other task touches.
            let dst = unsafe { out.row(start, t.cols) };
            let src = &acc[r * ldc..][..t.cols];
            match epi.bias {
                Bias::None => dst.copy_from_slice(src),
                Bias::PerRow(b) => dst.iter_mut().zip(src).for_each(|(d, &s)| *d = s + b[row]),
                Bias::PerCol(b) => {
                    let b = &b[t.n0..t.n0 + t.cols];
                    dst.iter_mut().zip(src).zip(b).for_each(|((d, &s), &b)| *d = s + b);
                }
            }
            // Each step a pass over the row (in L1), so that every loop vectorises.
            if let Some(add) = epi.item_row.map(|v| v[t.item * m + row]) {
                dst.iter_mut().for_each(|d| *d += add);
            }
            if let Some(res) = epi.residual {
                dst.iter_mut()
                    .zip(&res[start..start + t.cols])
                    .for_each(|(d, &r)| *d += r);
            }
            if let Some(q) = epi.div {
                dst.iter_mut().for_each(|d| *d /= q);
            }
        }
    }
}
