//! Layers shared by the blocks: projections that load `nn.Linear` or 1×1 conv weights
//! (`projection.rs`), convolutions (`conv.rs`), the norms the PyTorch blocks use (GroupNorm,
//! LayerNorm, lucidrains' RMSNorm, BatchNorm2d in eval mode, ...: `norm.rs`), activations and
//! scale-shift conditioning (`activation.rs`), nearest-neighbour resampling (`resample.rs`).

mod activation;
mod conv;
mod norm;
mod projection;
mod resample;

pub use activation::{scale_shift, Activation};
pub use conv::Conv2d;
pub(crate) use conv::{cuda_conv_layer, Copies};
pub use norm::{
    group_norm, l2_normalize_last_dim, BatchNorm2d, GroupNorm, LastDimRmsNorm, LayerNorm, RmsNorm, SpatialNorm,
};
pub(crate) use projection::unexpected_shape;
pub use projection::{FusedQkvConv, Projection};
pub use resample::{interpolate_nearest2d, nearest_source_indices};
