//! Nearest-neighbour resampling with PyTorch's index map.

use candle_core::Tensor;

/// The source indices of PyTorch's `mode="nearest"` resampling of `input` samples to `output`:
/// `i` when the sizes match, `i >> 1` when doubling, else `min(floor(i · (in / out)), in − 1)`
/// with the scale and product in f32 (`nearest_idx` in ATen's `UpSample.h`).
pub fn nearest_source_indices(input: usize, output: usize) -> Vec<u32> {
    (0..output)
        .map(|i| {
            let src = if output == input {
                i
            } else if output == 2 * input {
                i >> 1
            } else {
                let scale = input as f32 / output as f32;
                ((i as f32 * scale).floor() as usize).min(input.saturating_sub(1))
            };
            src as u32
        })
        .collect()
}

/// `F.interpolate(x, size=(h, w), mode="nearest")` on `(B, C, H, W)`, with PyTorch's index map
/// ([`nearest_source_indices`]) for any ratio, integer or not, up or down.
pub fn interpolate_nearest2d(x: &Tensor, h: usize, w: usize) -> candle_core::Result<Tensor> {
    let (_, _, in_h, in_w) = x.dims4()?;
    let select = |x: &Tensor, dim: usize, input: usize, output: usize| -> candle_core::Result<Tensor> {
        if input == output {
            return Ok(x.clone());
        }
        let idx = Tensor::new(nearest_source_indices(input, output), x.device())?;
        x.contiguous()?.index_select(&idx, dim)
    };
    let x = select(x, 2, in_h, h)?;
    select(&x, 3, in_w, w)
}
