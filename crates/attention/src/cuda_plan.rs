//! The launch plans of this crate's CUDA kernels: for the fused attention
//! (`kernels/fused_attention.cu`) which kernel, how many query tiles, output-column chunks and
//! key splits, how much shared memory, and the kernel's argument block ([`Args`], laid out as the
//! CUDA `struct Args`); for the fused layers (`kernels/fused_layers.cu`) the GroupNorm
//! statistics' split and the grids.
//!
//! Pure arithmetic, with no CUDA types, so that it is compiled on every build: `cuda::launch`
//! launches what it plans on a GPU, and the unit tests in `emulated` run the very same plans
//! through the kernels compiled for the CPU under `kernels/emu/` (a CUDA emulator written for
//! these kernels), where no GPU is at hand.

use candle_core::DType;

/// Threads per block of the f32 attention kernels and of the merge kernel (4 warps).
pub(crate) const THREADS: u32 = 128;
/// Output-column chunks the mma kernels are compiled for (`fattn_{f16,bf16}_dv{N}`).
const DVCS: [usize; 8] = [16, 32, 64, 96, 128, 160, 192, 256];
/// The 32-row kernels (`fattn_{f16,bf16}_dv{N}_r32_e2`, up to 128 columns): `(chunk, key tile)`,
/// as `FATTN_MMA_R32_FAMILIES` in the CUDA source compiles them (tiles of 32 where ptxas would
/// spill the two row blocks' registers with 64).
const R32_KEY_TILES: [(usize, usize); 5] = [(16, 32), (32, 64), (64, 64), (96, 32), (128, 32)];

/// `(B, H, Lq, Lk, D)` of a q, k, v the kernel takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Dims {
    pub b: usize,
    pub h: usize,
    pub lq: usize,
    pub lk: usize,
    pub d: usize,
}

/// Variants of the f16/bf16 attention kernels, built to be timed against each other on a GPU
/// (`UNET_ATTENTION_FUSED_VARIANT`, the GPU kit's `fusedcore` stage); the f32 kernels have one
/// form and ignore it. Head dims over 256 (the VAE's 512) run the wide kernel under `base`,
/// `exp2` and `r32` (8 warps on one 64-query tile, each score computed once) and column chunks
/// of 256 under the others (a thread block per chunk, each recomputing q·kᵀ).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FusedVariant {
    /// 4 warps (64 queries a thread block), the softmax's exponentials by `expf` of the scaled
    /// score less the row max (a multiply, a subtraction and `expf` a score).
    Base,
    /// The default: 4 warps, the exponentials as FlashAttention-2 takes them, one FFMA with the
    /// scale and log2 e folded in and the row max subtracted (`s·scale·log2 e − m·scale·log2 e`;
    /// with a mask, the masked logit times log2 e), then the hardware's approximate `ex2`
    /// (about 2^-22 relative error, underflow below 2^-126 to 0).
    #[default]
    Exp2,
    /// 8 warps (128 queries a thread block): each k and v tile in shared memory serves twice the
    /// queries. Where its shared memory does not fit the GPU, the 4-warp kernel runs.
    Warps8,
    /// 8 warps and the approximate `ex2`.
    Warps8Exp2,
    /// `base`, but head dims over 256 in column chunks (4 warps a chunk, q·kᵀ recomputed per
    /// chunk; two thread blocks a SM at head dim 512): the wide kernel's alternative.
    Chunked,
    /// `exp2` with 32 query rows a warp (FlashAttention-2's warp tile) for head dims up to 128:
    /// 4 warps of two 16-row blocks, 128 queries a thread block; each k and v fragment read from
    /// shared memory feeds the mmas of both row blocks (about 0.31 `ldmatrix` an mma at head dim
    /// 64 against 0.56 with 16 rows), at the cost of twice the accumulator registers. Head dims
    /// over 128 run what `exp2` runs.
    Rows32Exp2,
}

impl FusedVariant {
    /// Every variant with its name (`UNET_ATTENTION_FUSED_VARIANT`'s values), the default first.
    pub const ALL: [(&'static str, FusedVariant); 6] = [
        ("exp2", FusedVariant::Exp2),
        ("base", FusedVariant::Base),
        ("w8", FusedVariant::Warps8),
        ("w8-exp2", FusedVariant::Warps8Exp2),
        ("chunked", FusedVariant::Chunked),
        ("r32", FusedVariant::Rows32Exp2),
    ];

    /// Its name in [`FusedVariant::ALL`].
    pub fn name(self) -> &'static str {
        FusedVariant::ALL
            .iter()
            .find(|(_, v)| *v == self)
            .map_or("exp2", |(n, _)| n)
    }

    fn warps(self) -> usize {
        match self {
            FusedVariant::Warps8 | FusedVariant::Warps8Exp2 => 8,
            _ => 4,
        }
    }

    fn exp2(self) -> bool {
        matches!(
            self,
            FusedVariant::Exp2 | FusedVariant::Warps8Exp2 | FusedVariant::Rows32Exp2
        )
    }

    /// Whether head dims over 256 take the wide kernel.
    fn wide(self) -> bool {
        matches!(self, FusedVariant::Base | FusedVariant::Exp2 | FusedVariant::Rows32Exp2)
    }

    /// The key tile of the 32-row kernel for output chunks of `dvc` columns: `Some` under `r32`
    /// up to 128 columns ([`R32_KEY_TILES`]), else `None` (16 rows a warp).
    fn rows32_key_tile(self, dvc: usize) -> Option<usize> {
        R32_KEY_TILES
            .into_iter()
            .find(|&(c, _)| c == dvc && self == FusedVariant::Rows32Exp2)
            .map(|(_, bc)| bc)
    }
}

/// Shared memory of the wide kernel (`kernels/attention_wide.cuh`) at padded head dim `dp` with
/// key tiles of `bc`: q (64 × dp), a k tile (bc × dp), a v tile (bc × 512), the p tile (64 × bc)
/// in 16-bit elements, rows stored as `smem_tile` does, and 2 × 64 f32 row maxima / sums.
fn wide_smem(dp: usize, bc: usize) -> usize {
    let row = |cols: usize| if cols.is_multiple_of(64) { cols } else { cols + 8 };
    (64 * row(dp) + bc * row(dp) + bc * row(512) + 64 * row(bc)) * 2 + 2 * 64 * 4
}

/// The wide kernel's key tile at padded head dim `dp`: 64 where its shared memory fits the GPU,
/// else 32 where that fits; `None` where neither does.
fn wide_tile(dp: usize, gpu: &GpuLimits) -> Option<usize> {
    [64, 32].into_iter().find(|&bc| wide_smem(dp, bc) <= gpu.smem_optin)
}

/// What the plan needs to know of the GPU.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GpuLimits {
    /// Streaming multiprocessors.
    pub sms: usize,
    /// The most dynamic shared memory a block may opt in to, in bytes.
    pub smem_optin: usize,
}

/// Kernels, grid and workspace of one call.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub dims: Dims,
    pub dtype: DType,
    /// The attention kernel's name in the PTX.
    pub kernel: String,
    /// The merge kernel's name (run only when `splits > 1`).
    pub merge: &'static str,
    /// The head dim padded to the mma's 16 (f32: the head dim).
    pub dp: usize,
    /// Output-column chunks (grid y is batch · heads · chunks).
    pub chunks: usize,
    pub grid: (u32, u32, u32),
    /// Threads per block of the attention kernel.
    pub threads: u32,
    /// Dynamic shared memory of one block, in bytes.
    pub smem: usize,
    /// Keys a key tile (the kernels' `BC`, or 32 in f32).
    pub key_tile: usize,
    /// Thread blocks the key tiles of each query tile are split over (1: unsplit).
    pub splits: usize,
    /// Key tiles a split.
    pub tiles_per_split: usize,
}

/// The attention kernel a call runs and its tiling, as [`Plan::new`] chooses it.
struct Kernel {
    /// The head dim padded to the mma's 16 (f32: the head dim).
    dp: usize,
    /// Output-column chunks (thread blocks a query tile).
    chunks: usize,
    /// Queries a thread block.
    rows: usize,
    threads: u32,
    /// Keys a key tile.
    key_tile: usize,
    /// Dynamic shared memory of one block, in bytes.
    smem: usize,
    kernel: String,
    merge: &'static str,
}

impl Kernel {
    /// `fattn_f32_ni{N}`: N output columns a lane, 16 query rows a block (8 past head dim 128).
    fn f32(d: usize) -> Kernel {
        let ni = d.div_ceil(32).next_power_of_two();
        let rows = if ni <= 4 { 16 } else { 8 };
        Kernel {
            dp: d,
            chunks: 1,
            rows,
            threads: THREADS,
            key_tile: 32,
            smem: (rows * d + 32 * (d | 1) + 32 * d) * 4,
            kernel: format!("fattn_f32_ni{ni}"),
            merge: "fattn_merge_f32",
        }
    }

    /// The f16/bf16 mma kernel of `variant`: the wide kernel for head dims over 256 where the
    /// variant takes it and its shared memory fits, else the column-chunk kernel.
    fn half(d: usize, dtype: DType, gpu: &GpuLimits, variant: FusedVariant) -> Kernel {
        let dp = d.div_ceil(16) * 16;
        let (name, merge) = if dtype == DType::F16 {
            ("f16", "fattn_merge_f16")
        } else {
            ("bf16", "fattn_merge_bf16")
        };
        let e2 = if variant.exp2() { "_e2" } else { "" };
        if let Some(bc) = wide_tile(dp, gpu).filter(|_| d > 256 && variant.wide()) {
            let tile = if bc == 64 { "" } else { "32" };
            return Kernel {
                dp,
                chunks: 1,
                rows: 64,
                threads: 256,
                key_tile: bc,
                smem: wide_smem(dp, bc),
                kernel: format!("fattn_{name}_wide{tile}{e2}"),
                merge,
            };
        }
        let dvc = DVCS.into_iter().find(|&c| c >= dp).unwrap_or(256);
        let r32 = variant.rows32_key_tile(dvc);
        let bc = r32.unwrap_or(if dvc <= 160 { 64 } else { 32 });
        let row_blocks = if r32.is_some() { 2 } else { 1 };
        // 16 query rows a row block, `row_blocks` a warp; q and k tiles of rows of dp elements, v
        // of dvc, each stored as the kernel's `smem_tile` does: swizzled where a multiple of 64,
        // else 8 elements longer.
        let row = |cols: usize| if cols.is_multiple_of(64) { cols } else { cols + 8 };
        let smem_of = |rows: usize| (rows * row(dp) + bc * row(dp) + bc * row(dvc)) * 2;
        let warps = match variant.warps() {
            8 if smem_of(128) <= gpu.smem_optin => 8,
            _ => 4,
        };
        let w8 = if warps == 8 { "_w8" } else { "" };
        let rows32 = if row_blocks == 2 { "_r32" } else { "" };
        let rows = 16 * row_blocks * warps;
        Kernel {
            dp,
            chunks: d.div_ceil(dvc),
            rows,
            threads: 32 * warps as u32,
            key_tile: bc,
            smem: smem_of(rows),
            kernel: format!("fattn_{name}_dv{dvc}{w8}{rows32}{e2}"),
            merge,
        }
    }
}

impl Plan {
    /// The plan of one call with its keys unsplit (see [`Plan::split_keys`]); `None` where the
    /// shape does not fit the kernels (shared memory, grid or index limits). `variant`: which
    /// f16/bf16 kernel (f32 has one).
    pub(crate) fn new(s: &Dims, dtype: DType, gpu: &GpuLimits, variant: FusedVariant) -> Option<Plan> {
        let Kernel {
            dp,
            chunks,
            rows,
            threads,
            key_tile,
            smem,
            kernel,
            merge,
        } = match dtype {
            DType::F32 => Kernel::f32(s.d),
            DType::F16 | DType::BF16 => Kernel::half(s.d, dtype, gpu, variant),
            _ => return None,
        };
        let bh = s.b * s.h;
        let q_tiles = s.lq.div_ceil(rows);
        let key_tiles = s.lk.div_ceil(key_tile);
        let fits_i32 = |x: usize| x <= i32::MAX as usize;
        let ok = smem <= gpu.smem_optin
            && bh * chunks <= 65_535
            && [q_tiles, s.lq, s.lk, bh, bh * s.lq].into_iter().all(fits_i32);
        ok.then(|| Plan {
            dims: *s,
            dtype,
            kernel,
            merge,
            dp,
            chunks,
            grid: (q_tiles as u32, (bh * chunks) as u32, 1),
            threads,
            smem,
            key_tile,
            splits: 1,
            tiles_per_split: key_tiles,
        })
    }

    /// Key tiles of one (batch, head, query tile): what the splits divide.
    fn key_tiles(&self) -> usize {
        self.dims.lk.div_ceil(self.key_tile)
    }

    /// This plan with the key tiles of each query tile split over `wanted` thread blocks
    /// (clamped to 1 ..= the key tiles; each split's partial output and `(max, sum)` go to the
    /// workspace, and the merge kernel combines them); `None` past the grid's limit.
    pub(crate) fn split_keys(mut self, wanted: usize) -> Option<Plan> {
        let key_tiles = self.key_tiles();
        self.tiles_per_split = key_tiles.div_ceil(wanted.clamp(1, key_tiles));
        self.splits = key_tiles.div_ceil(self.tiles_per_split);
        self.grid.2 = self.splits as u32;
        (self.splits <= 65_535).then_some(self)
    }

    /// The key splits to ask [`Plan::split_keys`] for when `places` thread blocks of this plan's
    /// kernel can be resident on the whole GPU at once (SMs × blocks a SM, from the kernel's
    /// registers and shared memory). A grid of blocks runs in waves of `places`; the last wave
    /// may leave places idle. Splitting the keys `s` ways makes `s` times the blocks, each `s`
    /// times shorter, so the share of the places kept busy over the whole run is
    /// `blocks / (places × waves)`. One split where the unsplit grid already fills 80 % of a wave
    /// (splitting then costs more in partial outputs and the merge than it gains); else the
    /// fewest splits whose busy share is within 85 % of the best one up to 64 splits, each
    /// split keeping at least 2 key tiles.
    pub(crate) fn auto_splits(&self, places: usize) -> usize {
        let places = places.max(1);
        let blocks = self.grid.0 as usize * self.grid.1 as usize;
        let most = (self.key_tiles() / 2).clamp(1, 64);
        if 5 * blocks >= 4 * places || most == 1 {
            return 1;
        }
        let busy = |s: usize| {
            let total = blocks * s;
            total as f64 / (places * total.div_ceil(places)) as f64
        };
        let best = (1..=most).map(busy).fold(0.0, f64::max);
        (1..=most).find(|&s| busy(s) >= 0.85 * best).unwrap_or(1)
    }

    /// Rows of the merge kernel's grid (one block of [`THREADS`] threads each) when the keys are
    /// split: every (batch, head, query).
    pub(crate) fn merge_rows(&self) -> usize {
        self.dims.b * self.dims.h * self.dims.lq
    }

    /// Elements of the split workspace's partial outputs and of its `(max, sum)` pairs; `None`
    /// when the keys are not split (nothing is allocated, the kernels get null pointers and
    /// never touch them).
    pub(crate) fn workspace(&self) -> Option<(usize, usize)> {
        let s = self.dims;
        let rows = s.b * s.h * s.lq;
        (self.splits > 1).then(|| (self.splits * rows * s.d, self.splits * rows * 2))
    }
}

/// The text of `UNET_ATTENTION_FUSED_SPLITS`: blank or `auto` (any case) is `None` (chosen by
/// [`Plan::auto_splits`]), a positive integer that count; anything else an error.
pub(crate) fn parse_splits(text: &str) -> Result<Option<usize>, String> {
    match text.trim() {
        "" => Ok(None),
        t if t.eq_ignore_ascii_case("auto") => Ok(None),
        t => match t.parse::<usize>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err("expected auto or a positive number of key splits".to_string()),
        },
    }
}

/// Whether the kernel may copy q, k and v with 16-byte `cp.async` (which faults on an address
/// that is not 16-byte aligned): every row start must be, so the head dim and every stride (in
/// elements of a 16-bit dtype) must be multiples of 8 and each start address a multiple of 16
/// bytes. Else the kernel copies element by element. `inputs`: each one's `(batch, head, row)`
/// strides and start address.
pub(crate) fn vector_copies(d: usize, inputs: [([i64; 3], u64); 3]) -> bool {
    d.is_multiple_of(8)
        && inputs
            .iter()
            .all(|(strides, ptr)| strides.iter().all(|x| x % 8 == 0) && ptr.is_multiple_of(16))
}

/// Threads per block of every layer kernel of `kernels/fused_layers.cu` but `gn_finalize`
/// (`GN_THREADS` in the CUDA source).
pub(crate) const LAYER_THREADS: u32 = 256;
/// Threads per block of `gn_finalize` (one thread per group).
pub(crate) const FINALIZE_THREADS: u32 = 128;
/// Elements per block of `gn_apply` (8 a thread).
pub(crate) const APPLY_TILE: usize = 2048;
/// Smallest chunk of a group one `gn_stats` block reduces when a group is split.
const MIN_CHUNK: usize = 2048;
/// `gn_stats` blocks to aim for (a few per SM of an H100) before chunks get smaller.
const TARGET_BLOCKS: usize = 1024;
/// The most blocks of the grid-stride kernels.
const MAX_BLOCKS: usize = 65_535;

/// How the GroupNorm statistics of one call are split: `(chunk, splits)` per group, for
/// `groups_total` (batch × groups) groups of `group_len` elements.
pub(crate) fn stats_split(groups_total: usize, group_len: usize) -> (usize, usize) {
    let wanted = TARGET_BLOCKS.div_ceil(groups_total.max(1));
    let splits = wanted.clamp(1, group_len.div_ceil(MIN_CHUNK).max(1));
    let chunk = group_len.div_ceil(splits);
    (chunk, group_len.div_ceil(chunk))
}

/// The grid of `gn_stats` (`splits` blocks per group) and of `gn_apply` (one block per
/// [`APPLY_TILE`] elements of a group): `(blocks per group, groups_total, 1)`.
pub(crate) fn group_grid(blocks_per_group: usize, groups_total: usize) -> (u32, u32, u32) {
    (blocks_per_group as u32, groups_total as u32, 1)
}

/// The grid of `gn_finalize` ([`FINALIZE_THREADS`] groups a block).
pub(crate) fn finalize_grid(groups_total: usize) -> (u32, u32, u32) {
    (groups_total.div_ceil(FINALIZE_THREADS as usize) as u32, 1, 1)
}

/// The grid of `ln_*`: one [`LAYER_THREADS`]-thread block a row (grid-strided past 65,535 rows).
pub(crate) fn norm_rows_grid(rows: usize) -> (u32, u32, u32) {
    (rows.clamp(1, MAX_BLOCKS) as u32, 1, 1)
}

/// A grid of [`LAYER_THREADS`]-thread blocks over `(rows, cols)` (`gated`, `epilogue`):
/// columns over x and the threads, rows over y (both grid-strided past 65,535 blocks).
pub(crate) fn row_grid(rows: usize, cols: usize) -> (u32, u32, u32) {
    (
        cols.div_ceil(LAYER_THREADS as usize).clamp(1, MAX_BLOCKS) as u32,
        rows.clamp(1, MAX_BLOCKS) as u32,
        1,
    )
}

/// The CUDA `struct Args` of `kernels/fused_attention.cu`, field for field (7 pointers, 10
/// ints, 13 long longs, 1 float; 208 bytes with the tail padding).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Args {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub mask: u64,
    pub out: u64,
    pub ws_o: u64,
    pub ws_ml: u64,
    pub heads: i32,
    pub bhs: i32,
    pub lq: i32,
    pub lk: i32,
    pub d: i32,
    pub dp: i32,
    pub chunks: i32,
    pub splits: i32,
    pub tiles_per_split: i32,
    pub vec: i32,
    pub q_s: [i64; 3],
    pub k_s: [i64; 3],
    pub v_s: [i64; 3],
    pub m_s: [i64; 4],
    pub scale: f32,
}

impl Args {
    /// The sizes of `plan` and the scale; the pointers, strides and `vec` are the launch's to fill.
    pub(crate) fn sizes(plan: &Plan, scale: f32) -> Args {
        let s = plan.dims;
        Args {
            heads: s.h as i32,
            bhs: (s.b * s.h) as i32,
            lq: s.lq as i32,
            lk: s.lk as i32,
            d: s.d as i32,
            dp: plan.dp as i32,
            chunks: plan.chunks as i32,
            splits: plan.splits as i32,
            tiles_per_split: plan.tiles_per_split as i32,
            scale,
            ..Args::default()
        }
    }

    /// The bytes of this block as the kernel receives them (little-endian, `#[repr(C)]` order).
    #[cfg(test)]
    pub(crate) fn to_bytes(self) -> Vec<u8> {
        let mut b = Vec::with_capacity(std::mem::size_of::<Args>());
        for p in [self.q, self.k, self.v, self.mask, self.out, self.ws_o, self.ws_ml] {
            b.extend(p.to_le_bytes());
        }
        let ints = [
            self.heads,
            self.bhs,
            self.lq,
            self.lk,
            self.d,
            self.dp,
            self.chunks,
            self.splits,
            self.tiles_per_split,
            self.vec,
        ];
        for x in ints {
            b.extend(x.to_le_bytes());
        }
        // 7 · 8 + 10 · 4 = 96: the long longs start 8-aligned without padding.
        for x in self.q_s.iter().chain(&self.k_s).chain(&self.v_s).chain(&self.m_s) {
            b.extend(x.to_le_bytes());
        }
        b.extend(self.scale.to_le_bytes());
        b.resize(std::mem::size_of::<Args>(), 0); // the struct's tail padding
        b
    }
}

#[path = "cuda_plan/image.rs"]
pub(crate) mod image;

#[cfg(test)]
#[path = "cuda_plan/emulated.rs"]
mod emulated;
#[cfg(test)]
#[path = "cuda_plan/emulated_layers.rs"]
mod emulated_layers;
#[cfg(test)]
#[path = "cuda_plan/emulator.rs"]
mod emulator;

#[cfg(test)]
mod tests {
    use super::*;

    const H100: GpuLimits = GpuLimits {
        sms: 132,
        smem_optin: 227 * 1024,
    };

    fn dims(b: usize, h: usize, lq: usize, lk: usize, d: usize) -> Dims {
        Dims { b, h, lq, lk, d }
    }

    /// The plan with the automatic split for `per_sm` blocks a SM of an H100.
    fn auto(dims: &Dims, dtype: DType, variant: FusedVariant, per_sm: usize) -> Plan {
        let p = Plan::new(dims, dtype, &H100, variant).unwrap();
        let splits = p.auto_splits(H100.sms * per_sm);
        p.split_keys(splits).unwrap()
    }

    #[test]
    fn args_bytes_follow_the_struct_layout() {
        assert_eq!(std::mem::size_of::<Args>(), 208);
        let mut a = Args {
            q: 1,
            scale: 2.5,
            vec: 7,
            ..Args::default()
        };
        a.m_s[3] = -3;
        let b = a.to_bytes();
        assert_eq!(b.len(), 208);
        assert_eq!(b[0], 1);
        assert_eq!(i32::from_le_bytes(b[92..96].try_into().unwrap()), 7);
        assert_eq!(i64::from_le_bytes(b[192..200].try_into().unwrap()), -3);
        assert_eq!(f32::from_le_bytes(b[200..204].try_into().unwrap()), 2.5);
    }

    #[test]
    fn vae_head_dim_512_takes_the_wide_kernel_or_two_column_chunks() {
        let vae = dims(1, 1, 4096, 4096, 512);
        // The wide kernel: one 8-warp block a query tile, key tiles of 64, 200.5 KiB (one
        // block a SM).
        let p = auto(&vae, DType::F16, FusedVariant::Base, 1);
        assert_eq!(
            (p.kernel.as_str(), p.dp, p.chunks, p.threads, p.key_tile),
            ("fattn_f16_wide", 512, 1, 256, 64)
        );
        assert_eq!(p.smem, (64 * 512 + 64 * 512 + 64 * 512 + 64 * 64) * 2 + 512);
        assert!(p.smem <= H100.smem_optin, "{p:?}");
        // 64 query tiles on 132 places: 2 splits of the 64 key tiles (128 blocks, one wave
        // 97 % full).
        assert_eq!((p.grid, p.splits, p.tiles_per_split), ((64, 1, 2), 2, 32));
        // An A100's 163 KiB: key tiles of 32, 133.5 KiB.
        let a100 = GpuLimits {
            sms: 108,
            smem_optin: 163 * 1024,
        };
        let p = Plan::new(&vae, DType::BF16, &a100, FusedVariant::Exp2).unwrap();
        assert_eq!((p.kernel.as_str(), p.key_tile), ("fattn_bf16_wide32_e2", 32));
        assert_eq!(p.smem, (64 * 512 + 32 * 512 + 32 * 512 + 64 * 40) * 2 + 512);
        // `chunked`: two column chunks of 256, each block recomputing q·kᵀ; two blocks a SM
        // (the swizzled tiles' 112 KiB; 242 registers): 264 places.
        let p = auto(&vae, DType::F16, FusedVariant::Chunked, 2);
        assert_eq!((p.kernel.as_str(), p.dp, p.chunks), ("fattn_f16_dv256", 512, 2));
        // 64 query tiles × 2 chunks = 128 blocks, under half of 264 places: the 128 key tiles
        // are split in 2 (256 blocks, one wave 97 % full; 3 would take 1.45 waves).
        assert_eq!(p.grid, (64, 2, 2));
        assert_eq!((p.splits, p.tiles_per_split), (2, 64));
        // Swizzled rows (no padding): two blocks fit an H100 SM's 228 KiB (1 KiB reserved each).
        assert_eq!(p.smem, (64 * 512 + 32 * 512 + 32 * 256) * 2);
        assert!(2 * (p.smem + 1024) <= 228 * 1024, "{p:?}");
        // Head dims up to 256 are the same kernel under `base` and `chunked`.
        let d256 = dims(1, 1, 4096, 4096, 256);
        let base = Plan::new(&d256, DType::BF16, &H100, FusedVariant::Base).unwrap();
        let chunked = Plan::new(&d256, DType::BF16, &H100, FusedVariant::Chunked).unwrap();
        assert_eq!(
            (base.kernel.as_str(), chunked.kernel.as_str()),
            ("fattn_bf16_dv256", "fattn_bf16_dv256")
        );
    }

    #[test]
    fn key_splits_fill_the_resident_places_in_whole_waves() {
        let vae = dims(1, 1, 4096, 4096, 512);
        // Column chunks on one block a SM: 128 blocks fill 97 % of 132 places, no split.
        assert_eq!(auto(&vae, DType::F16, FusedVariant::Chunked, 1).splits, 1);
        // The VAE at 128²: 256 query tiles, more than a wave of 132 (wide) or 264 (chunks).
        let vae128 = dims(1, 1, 16384, 16384, 512);
        assert_eq!(auto(&vae128, DType::F16, FusedVariant::Base, 1).splits, 1);
        assert_eq!(auto(&vae128, DType::F16, FusedVariant::Chunked, 2).splits, 1);
        // SDXL's self-attention (20 heads × 16 query tiles = 320 blocks) on 4 blocks a SM (528
        // places, 61 % of a wave): 3 splits, 960 blocks, 1.82 waves.
        let sdxl = auto(&dims(1, 20, 1024, 1024, 64), DType::F16, FusedVariant::Base, 4);
        assert_eq!((sdxl.splits, sdxl.tiles_per_split, sdxl.grid), (3, 6, (16, 20, 3)));
        // Cross-attention on 77 keys (2 tiles) is never split: each split keeps 2 tiles.
        assert_eq!(
            auto(&dims(1, 20, 1024, 77, 64), DType::F16, FusedVariant::Base, 4).splits,
            1
        );
        // One query tile, one head, long keys: up to 64 splits.
        let one = auto(&dims(1, 1, 16, 65536, 64), DType::F32, FusedVariant::Base, 4);
        assert!(
            (50..=64).contains(&one.splits) && one.splits * one.tiles_per_split >= 2048,
            "{one:?}"
        );
        // A forced count is clamped to the key tiles, and every tile is covered once.
        let p = Plan::new(&dims(2, 3, 100, 130, 40), DType::F16, &H100, FusedVariant::Base).unwrap();
        assert_eq!(p.key_tile, 64);
        let forced = p.clone().split_keys(50).unwrap();
        assert_eq!((forced.splits, forced.tiles_per_split, forced.grid.2), (3, 1, 3));
        let two = p.split_keys(2).unwrap();
        assert_eq!((two.splits, two.tiles_per_split), (2, 2));
    }

    #[test]
    fn only_split_keys_take_a_workspace() {
        let p = Plan::new(&dims(2, 3, 100, 130, 40), DType::F16, &H100, FusedVariant::Exp2).unwrap();
        assert_eq!(p.clone().split_keys(1).unwrap().workspace(), None);
        let rows = 2 * 3 * 100;
        assert_eq!(
            p.split_keys(2).unwrap().workspace(),
            Some((2 * rows * 40, 2 * rows * 2))
        );
    }

    #[test]
    fn the_splits_setting_reads_auto_or_a_positive_count() {
        for auto in ["", " ", "auto", " AUTO "] {
            assert_eq!(parse_splits(auto), Ok(None), "{auto:?}");
        }
        assert_eq!(parse_splits("3"), Ok(Some(3)));
        assert_eq!(parse_splits(" 64 "), Ok(Some(64)));
        for bad in ["0", "-1", "2.5", "two", "auto3"] {
            assert!(parse_splits(bad).unwrap_err().contains("positive number"), "{bad:?}");
        }
    }

    #[test]
    fn shared_memory_beyond_the_gpu_declines() {
        let dims = dims(1, 1, 10, 10, 512);
        let small = GpuLimits {
            sms: 10,
            smem_optin: 48 * 1024,
        };
        assert!(Plan::new(&dims, DType::F16, &small, FusedVariant::Base).is_none());
        assert!(Plan::new(&dims, DType::F16, &H100, FusedVariant::Base).is_some());
        assert!(Plan::new(&dims, DType::F64, &H100, FusedVariant::Base).is_none());
    }

    #[test]
    fn variants_name_their_kernels_and_fall_back_to_four_warps() {
        let dims = dims(1, 1, 4096, 4096, 512);
        let plan = |gpu: &GpuLimits, v| Plan::new(&dims, DType::BF16, gpu, v).unwrap();
        for (name, v) in FusedVariant::ALL {
            assert_eq!(v.name(), name);
        }
        assert_eq!(FusedVariant::ALL[0].1, FusedVariant::default());
        let p = plan(&H100, FusedVariant::Warps8Exp2);
        assert_eq!(
            (p.kernel.as_str(), p.threads, p.grid.0),
            ("fattn_bf16_dv256_w8_e2", 256, 32)
        );
        let p = plan(&H100, FusedVariant::Exp2);
        assert_eq!(
            (p.kernel.as_str(), p.threads, p.grid.0),
            ("fattn_bf16_wide_e2", 256, 64)
        );
        let p = plan(&H100, FusedVariant::Chunked);
        assert_eq!((p.kernel.as_str(), p.threads, p.grid.0), ("fattn_bf16_dv256", 128, 64));
        // An A100's 163 KiB cannot hold the 8-warp tiles of head dim 512: 4 warps run.
        let a100 = GpuLimits {
            sms: 108,
            smem_optin: 163 * 1024,
        };
        let p = plan(&a100, FusedVariant::Warps8);
        assert_eq!((p.kernel.as_str(), p.threads), ("fattn_bf16_dv256", 128));
        let f32_plan = Plan::new(&dims, DType::F32, &H100, FusedVariant::Warps8).unwrap();
        assert_eq!((f32_plan.kernel.as_str(), f32_plan.threads), ("fattn_f32_ni16", 128));
    }

    #[test]
    fn r32_holds_32_rows_a_warp_up_to_head_dim_128_and_runs_exp2_above() {
        let plan =
            |d: usize, dtype| Plan::new(&dims(2, 3, 1000, 300, d), dtype, &H100, FusedVariant::Rows32Exp2).unwrap();
        assert_eq!(FusedVariant::Rows32Exp2.name(), "r32");
        assert_ne!(FusedVariant::default(), FusedVariant::Rows32Exp2);
        // (head dim, kernel, key tile, smem): 128 query rows of dp, a key tile of dp and of the
        // chunk, rows of a multiple of 64 elements swizzled, others 8 longer.
        for (d, kernel, bc, smem) in [
            (13, "fattn_f16_dv16_r32_e2", 32, (128 * 24 + 32 * 24 + 32 * 24) * 2),
            (32, "fattn_f16_dv32_r32_e2", 64, (128 * 40 + 64 * 40 + 64 * 40) * 2),
            (40, "fattn_f16_dv64_r32_e2", 64, (128 * 56 + 64 * 56 + 64 * 64) * 2),
            (64, "fattn_f16_dv64_r32_e2", 64, (128 * 64 + 64 * 64 + 64 * 64) * 2),
            (80, "fattn_f16_dv96_r32_e2", 32, (128 * 88 + 32 * 88 + 32 * 104) * 2),
            (128, "fattn_f16_dv128_r32_e2", 32, (128 * 128 + 32 * 128 + 32 * 128) * 2),
        ] {
            let p = plan(d, DType::F16);
            assert_eq!(
                (p.kernel.as_str(), p.threads, p.key_tile, p.chunks, p.smem),
                (kernel, 128, bc, 1, smem),
                "d {d}"
            );
            // 1000 queries in tiles of 128.
            assert_eq!(p.grid, (8, 6, 1), "d {d}");
        }
        assert_eq!(plan(64, DType::BF16).kernel, "fattn_bf16_dv64_r32_e2");
        // Over 128: what `exp2` runs (4 warps of 16 rows; the wide kernel over 256).
        for d in [129, 160, 256, 320, 512] {
            let exp2 = Plan::new(&dims(2, 3, 1000, 300, d), DType::BF16, &H100, FusedVariant::Exp2).unwrap();
            let p = plan(d, DType::BF16);
            assert_eq!(
                (p.kernel.as_str(), p.threads, p.grid, p.smem, p.key_tile),
                (exp2.kernel.as_str(), exp2.threads, exp2.grid, exp2.smem, exp2.key_tile),
                "d {d}"
            );
        }
        assert_eq!(plan(160, DType::F16).kernel, "fattn_f16_dv160_e2");
        assert_eq!(plan(512, DType::F16).kernel, "fattn_f16_wide_e2");
        // f32 has one kernel.
        assert_eq!(plan(64, DType::F32).kernel, "fattn_f32_ni2");
    }

    #[test]
    fn vector_copies_need_aligned_rows() {
        let ok = ([8 * 100, 8 * 10, 64], 4096u64);
        assert!(vector_copies(64, [ok, ok, ok]));
        assert!(!vector_copies(60, [ok, ok, ok]));
        assert!(!vector_copies(64, [ok, ([8, 8, 12], 0), ok]));
        assert!(!vector_copies(64, [ok, ok, ([8, 8, 8], 8)]));
    }
}
