//! The error model behind rule (b): how far from the exact result a correct computation may land
//! at each element, estimated from PyTorch's own error against its float64 twin.
//!
//! Rounding error is proportional to the magnitudes a computation handles, so errors are measured
//! *relative to a local scale*: `m_i = max(|r_i|, M_i)`, with `M_i` the median of `|r|` over the
//! block of [`MAGNITUDE_BLOCK`] elements that holds `i` (the median, so that one huge element
//! neither raises its neighbours' scale nor hides its own error). PyTorch's relative error
//! `u_j = |t_j − r_j| / m_j` is then summarised around each element by its root mean square over
//! the [`NEIGHBOURHOOD`] places each side, `U_i`: a mean over 129 draws of the local rounding
//! error, not the largest of them, so a single large error (an outlier's own rounding, a planted
//! value in a forged twin) moves it by at most `1/√129` of itself.
//!
//! A correct port makes errors of the same kind: about as large, near the same places, but not
//! element for element. So element `i`, with our excess over rule (a)'s tolerance
//! `v_i = max(0, |o_i − r_i| − atol − rtol·|r_i|) / m_i`, meets rule (b) when
//!
//! * `v_i ≤ element · U_i` (one element may be unlucky, but not by more than that), and
//! * `W_i ≤ window · U_i`, with `W_i` the root mean square of `v` over the same
//!   neighbourhood (our errors around `i`, together, about as large as PyTorch's: a bias or a
//!   wrong scale that stays under the first test at every element fails this one).
//!
//! The factors ([`FACTORS`], and [`CONFIRMED_FACTORS`] for ill-conditioned blocks whose float64
//! output our own float64 run confirmed) are calibrated on generated bundles that were never
//! committed (`scripts/calibrate_rule.sh`; the table is in docs/cli.md).

/// How far (in elements of the flattened output, each side) the local statistics reach.
pub const NEIGHBOURHOOD: usize = 64;

/// The block of the flattened output whose median `|r|` is the local magnitude.
pub const MAGNITUDE_BLOCK: usize = 128;

/// Rule (b)'s two factors: our excess error at most `element` times PyTorch's local RMS error at
/// one element, and at most `window` times it as an RMS over the neighbourhood.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Factors {
    pub element: f64,
    pub window: f64,
}

/// The factors where PyTorch's error is within what rounding in its dtype reaches
/// ([`super::twin_bounds`]): twice the largest our honest blocks needed on the calibration half.
pub const FACTORS: Factors = Factors {
    element: 97.0,
    window: 9.4,
};

/// The factors where PyTorch's error is beyond that (an ill-conditioned block; the maths check
/// decides whether the float64 output is the block's): twice the largest our honest blocks needed
/// on the calibration half's ill-conditioned bundles.
pub const CONFIRMED_FACTORS: Factors = Factors {
    element: 270.0,
    window: 29.0,
};

/// PyTorch's local error, per element, relative to the local magnitude.
#[derive(Debug, Clone)]
pub struct ErrorModel {
    /// `m_i`: the local magnitude.
    pub scale: Vec<f64>,
    /// `U_i`: PyTorch's RMS relative error within [`NEIGHBOURHOOD`] places.
    pub torch_rms: Vec<f64>,
}

impl ErrorModel {
    /// The model of PyTorch's output `t` against its float64 twin `r` (same length). Elements
    /// where either is not finite count as exact.
    pub fn new(t: &[f64], r: &[f64]) -> Self {
        let scale = local_scale(r);
        let squares: Vec<f64> = t
            .iter()
            .zip(r)
            .zip(&scale)
            .map(|((x, y), m)| relative(x - y, *m).powi(2))
            .collect();
        let torch_rms = window_rms(&squares, NEIGHBOURHOOD);
        Self { scale, torch_rms }
    }

    /// PyTorch's relative error at one element, `u_i`.
    pub fn torch_error(&self, t: f64, r: f64, i: usize) -> f64 {
        relative(t - r, self.scale[i])
    }

    /// Rule (b)'s allowance at element `i` beyond rule (a)'s tolerance: `element_factor·m_i·U_i`.
    pub fn allowance(&self, i: usize, element_factor: f64) -> f64 {
        element_factor * self.scale[i] * self.torch_rms[i]
    }
}

/// `|d| / m`, 0 where `d` is not finite or zero, infinite where `m` is 0 and `d` is not.
fn relative(d: f64, m: f64) -> f64 {
    if !d.is_finite() || d == 0.0 {
        0.0
    } else {
        d.abs() / m
    }
}

/// `m_i = max(|r_i|, median |r| of i's block)` (non-finite values count as 0).
pub fn local_scale(r: &[f64]) -> Vec<f64> {
    let abs: Vec<f64> = r.iter().map(|y| if y.is_finite() { y.abs() } else { 0.0 }).collect();
    let mut scale = Vec::with_capacity(abs.len());
    for block in abs.chunks(MAGNITUDE_BLOCK) {
        let mut sorted = block.to_vec();
        let mid = sorted.len() / 2;
        let (_, median, _) = sorted.select_nth_unstable_by(mid, f64::total_cmp);
        let median = *median;
        scale.extend(block.iter().map(|a| a.max(median)));
    }
    scale
}

/// The root mean square of `sqrt(squares)` over `|j − i| ≤ w`, per element: window sums of
/// non-negative values kept as a two-stack queue, so nothing is ever subtracted (a huge value
/// leaving the window cannot cancel the small ones that stay).
pub fn window_rms(squares: &[f64], w: usize) -> Vec<f64> {
    let n = squares.len();
    let mut out = Vec::with_capacity(n);
    // The queue holds squares[lo..hi]; `front` holds suffix sums (its last entry is the sum of
    // every front element), `back` the values pushed since the last transfer.
    let mut front: Vec<f64> = vec![];
    let mut back: Vec<f64> = vec![];
    let mut back_sum = 0.0;
    let (mut lo, mut hi) = (0usize, 0usize);
    for i in 0..n {
        let (want_lo, want_hi) = (i.saturating_sub(w), (i + w + 1).min(n));
        while hi < want_hi {
            back.push(squares[hi]);
            back_sum += squares[hi];
            hi += 1;
        }
        while lo < want_lo {
            if front.is_empty() {
                let mut acc = 0.0;
                for x in back.drain(..).rev() {
                    acc += x;
                    front.push(acc);
                }
                back_sum = 0.0;
            }
            front.pop();
            lo += 1;
        }
        let sum = front.last().copied().unwrap_or(0.0) + back_sum;
        out.push((sum / (hi - lo) as f64).sqrt());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_rms_is_the_naive_rms() {
        let v: Vec<f64> = (0..300).map(|i| ((i * 37 % 101) as f64 * 0.013).powi(3)).collect();
        for w in [0, 1, 5, 64] {
            let got = window_rms(&v, w);
            for (i, g) in got.iter().enumerate() {
                let (lo, hi) = (i.saturating_sub(w), (i + w + 1).min(v.len()));
                let want = (v[lo..hi].iter().sum::<f64>() / (hi - lo) as f64).sqrt();
                assert!(
                    (g - want).abs() <= 1e-12 * want.max(1e-300),
                    "w {w} i {i}: {g} vs {want}"
                );
            }
        }
    }

    #[test]
    fn a_huge_value_leaving_the_window_does_not_cancel_the_small_ones() {
        let mut v = vec![1e-30; 400];
        v[10] = 1e30;
        let got = window_rms(&v, 4);
        assert_eq!(got[200], 1e-15);
    }

    #[test]
    fn one_huge_element_sets_its_own_scale_only() {
        let mut r: Vec<f64> = (0..256).map(|i| 1.0 + (i % 7) as f64 * 0.1).collect();
        r[40] = 1e6;
        let m = local_scale(&r);
        assert_eq!(m[40], 1e6);
        assert!(m[41] < 2.0 && m[39] < 2.0);
    }
}
