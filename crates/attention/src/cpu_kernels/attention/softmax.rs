//! The online softmax of a task's query rows ([`Softmax`]): running max and sum, scores into
//! weights with the scale and the additive mask ([`Mask`], read as stored), and the final
//! normalising factor.

use candle_core::{CpuStorage, Layout, Result, Storage, WithDType};

use super::{simd, Dims, Empty, Inputs, ScoreScale};

/// An additive float mask as stored, read through the strides of its broadcast
/// `(batch, head, query, key)` view (0 where broadcast), so it is never materialised.
#[derive(Clone, Copy)]
pub(super) struct Mask<'a> {
    data: &'a CpuStorage,
    offset: usize,
    stride: [usize; 4],
}

/// `dst.len()` values of `src` from `start` on, `stride` apart, in f32.
fn load<T: WithDType>(src: &[T], start: usize, stride: usize, dst: &mut [f32]) {
    if stride == 1 {
        let n = dst.len();
        for (d, s) in dst.iter_mut().zip(&src[start..start + n]) {
            *d = s.to_f64() as f32;
        }
    } else {
        for (j, d) in dst.iter_mut().enumerate() {
            *d = src[start + j * stride].to_f64() as f32;
        }
    }
}

impl<'a> Mask<'a> {
    /// The mask stored in `storage` (a CPU tensor's) through `layout`, its broadcast
    /// `(batch, head, query, key)` view.
    pub(super) fn view(storage: &'a Storage, layout: &Layout) -> Result<Self> {
        let Storage::Cpu(data) = storage else {
            candle_core::bail!("sdpa cpu kernel: the mask is not on the CPU")
        };
        let st = layout.stride();
        Ok(Mask {
            data,
            offset: layout.start_offset(),
            stride: [st[0], st[1], st[2], st[3]],
        })
    }

    /// The mask of row `(b, h, i)` for keys `k0..k0 + dst.len()`, in f32, into `dst`.
    fn row(&self, b: usize, h: usize, i: usize, k0: usize, dst: &mut [f32]) {
        let s = self.stride;
        let start = self.offset + b * s[0] + h * s[1] + i * s[2] + k0 * s[3];
        match self.data {
            CpuStorage::F32(x) if s[3] == 1 => dst.copy_from_slice(&x[start..start + dst.len()]),
            CpuStorage::F32(x) => load(x, start, s[3], dst),
            CpuStorage::F16(x) => load(x, start, s[3], dst),
            CpuStorage::BF16(x) => load(x, start, s[3], dst),
            CpuStorage::F64(x) => load(x, start, s[3], dst),
            // `supports` admits float masks only.
            _ => dst.fill(f32::NAN),
        }
    }
}

/// The online softmax of one task's query rows: their running max and sum, and how score rows
/// become weights.
pub(super) struct Softmax<'a> {
    inp: &'a Inputs<'a>,
    pub(super) ops: simd::Ops,
    /// The factor the exp pass applies ([`simd::deferred_scale`]).
    pre: f32,
    /// Batch and head of the task.
    b: usize,
    h: usize,
    max: Vec<f32>,
    sum: Vec<f32>,
}

impl<'a> Softmax<'a> {
    pub(super) fn new(inp: &'a Inputs<'a>, dims: &Dims, bh: usize, rows: usize) -> Self {
        Softmax {
            inp,
            ops: simd::ops(),
            pre: simd::deferred_scale(inp.scale, inp.mask.is_some()),
            b: bh / dims.heads,
            h: bh % dims.heads,
            max: vec![f32::NEG_INFINITY; rows],
            sum: vec![0f32; rows],
        }
    }

    /// Scores `s` of task row `r` (query `i`) against keys `k0..k0 + s.len()` become their
    /// weights; returns the factor the row's earlier output is to be multiplied by (`α`, 1 on
    /// the first key block). `mask_row` is scratch of at least `s.len()`.
    pub(super) fn update(&mut self, r: usize, i: usize, k0: usize, s: &mut [f32], mask_row: &mut [f32]) -> f32 {
        self.update_with_max(r, i, k0, s, mask_row, None)
    }

    /// Whether the scores need no pass of their own before the exp pass (no mask, a positive
    /// `Mul` scale that the exp pass applies): their row max is then all [`update_with_max`]
    /// needs, and a tile product can find it as it stores the scores.
    ///
    /// [`update_with_max`]: Softmax::update_with_max
    pub(super) fn max_is_enough(&self) -> bool {
        self.inp.mask.is_none() && matches!(self.inp.scale, ScoreScale::Mul(c) if c > 0.0 && c.is_finite())
    }

    /// [`update`](Softmax::update), given the row max of the raw scores `s` where
    /// [`max_is_enough`](Softmax::max_is_enough) (the same bits as finding it here).
    pub(super) fn update_with_max(
        &mut self,
        r: usize,
        i: usize,
        k0: usize,
        s: &mut [f32],
        mask_row: &mut [f32],
        raw_max: Option<f32>,
    ) -> f32 {
        let inp = self.inp;
        let m = match (&inp.mask, raw_max) {
            (None, Some(m)) if self.max_is_enough() => m * self.pre,
            (Some(mask), _) => {
                let mr = &mut mask_row[..s.len()];
                mask.row(self.b, self.h, i, k0, mr);
                (self.ops.scale_mask_max)(s, Some(mr), inp.scale)
            }
            (None, _) => (self.ops.scale_mask_max)(s, None, inp.scale),
        };
        let m_old = self.max[r];
        let m_new = if m > m_old { m } else { m_old };
        // A finite stand-in for a max of -inf: exp(-inf - MIN) = 0, exp(MIN - MIN) = 1.
        let m_safe = m_new.clamp(f32::MIN, f32::MAX);
        let p_sum = (self.ops.exp_sum)(s, self.pre, m_safe, inp.round);
        self.max[r] = m_new;
        if k0 == 0 {
            self.sum[r] = p_sum;
            1.0
        } else {
            let alpha = (m_old.clamp(f32::MIN, f32::MAX) - m_safe).exp();
            self.sum[r] = p_sum + self.sum[r] * alpha;
            alpha
        }
    }

    /// What the accumulated `Σ p·v` of task row `r` is multiplied by: `1 / sum`; for a row
    /// whose keys are all masked (sum 0, accumulator 0) 1 as torch's kernel (the row is 0), or
    /// NaN as softmax gives.
    pub(super) fn factor(&self, r: usize) -> f32 {
        match (self.sum[r] == 0.0, self.inp.empty) {
            (false, _) => 1.0 / self.sum[r],
            (true, Empty::Zero) => 1.0,
            (true, Empty::Nan) => f32::NAN,
        }
    }
}
