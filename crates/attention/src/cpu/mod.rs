//! The bottom layer: what the CPU kernels stand on, using nothing of this crate but itself.
//!
//! * [`isa`]: the instruction set the kernels run with ([`isa::Isa`]: detected, capped by
//!   `UNET_ATTENTION_ISA`);
//! * [`caches`]: the L1d and L2 sizes they block for (`UNET_ATTENTION_CACHE` forces them);
//! * [`setting`]: the one reader of the `UNET_ATTENTION_*` environment settings;
//! * [`scratch`], [`pool`]: per-worker scratch and buffers kept between calls; [`aligned`]:
//!   buffers on 64-byte boundaries (packed operands, scratch);
//! * [`math`]: vectorisable `exp` and `erf`;
//! * [`microkernel`]: the AVX2 and AVX-512 register tiles;
//! * [`contiguous`]: a fast transposed copy, for every layer above;
//! * [`workers`]: rayon's global pool with the calling thread as a worker (public as
//!   [`crate::cpu_kernels::join_rayon_pool`]).
//!
//! Above it: the kernels ([`crate::cpu_kernels`]: GEMM, Winograd, the attention kernel), then the
//! tensor ops, the attention core and the layers (see the crate's docs, "Layers").

pub(crate) mod aligned;
pub(crate) mod caches;
pub(crate) mod isa;
pub(crate) mod math;
pub(crate) mod microkernel;
pub(crate) mod pool;
pub(crate) mod scratch;
pub(crate) mod setting;
mod tensor;
pub(crate) mod workers;

pub use tensor::contiguous;
pub(crate) use tensor::{add_half, cast, cpu_slice, map_half, Half};
