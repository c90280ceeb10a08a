//! Launching `kernels/fused_layers.cu` through Candle's CUDA device: one `CustomOp1` per layer
//! ([`GroupNormOp`], [`LayerNormOp`], [`GatedOp`], [`EpilogueOp`]), its other tensors carried in the op (as the
//! attention kernel carries its mask). The callers in [`super::layers`] have checked devices,
//! dtypes, shapes and contiguity; the ops check again what a wrong launch would turn into an
//! out-of-bounds access (storage kinds, contiguity, lengths).

use super::module::{self, Image};
use crate::cuda_plan::{
    finalize_grid, group_grid, norm_rows_grid, row_grid, stats_split, APPLY_TILE, FINALIZE_THREADS, LAYER_THREADS,
};
use candle_core::backend::BackendStorage;
use candle_core::cuda::cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DevicePtrMut, DeviceRepr, LaunchConfig, PushKernelArg, SyncOnDrop,
};
use candle_core::cuda::{CudaDType, CudaDevice, CudaStorage, WrapErr};
use candle_core::{bail, CpuStorage, CustomOp1, DType, Layout, Result, Shape, Storage, Tensor};

include!(concat!(env!("OUT_DIR"), "/layers_image.rs"));

/// The layer kernels' fat binary (`build.rs`).
pub(crate) static LAYERS: Image = Image {
    what: "the fused layer kernels",
    bytes: LAYERS_IMAGE,
};
/// The kernel-name suffix of a storage dtype the kernels take.
pub(crate) fn suffix(dtype: DType) -> Option<&'static str> {
    match dtype {
        DType::F32 => Some("f32"),
        DType::F16 => Some("f16"),
        DType::BF16 => Some("bf16"),
        _ => None,
    }
}

/// Device address of element `offset` of a 16- or 32-bit float storage, and its use guard.
fn ptr<'a>(st: &'a CudaStorage, offset: usize, stream: &'a CudaStream) -> Result<(u64, SyncOnDrop<'a>)> {
    super::launch::storage_ptr(st, offset, stream, "fused layers")
}

/// The CUDA storage of a carried tensor (its read guard is the caller's to hold).
fn cuda_of<'a>(st: &'a Storage, what: &str) -> Result<&'a CudaStorage> {
    match st {
        Storage::Cuda(cs) => Ok(cs),
        _ => bail!("fused layers: {what} is not on the CUDA device"),
    }
}

/// A contiguous layout's start offset, or an error.
fn contiguous_start(l: &Layout, what: &str) -> Result<usize> {
    if !l.is_contiguous() {
        bail!("fused layers: {what} is not contiguous")
    }
    Ok(l.start_offset())
}

/// Kernel `name` of the layer kernels on `dev`.
fn func(dev: &CudaDevice, name: &str) -> Result<CudaFunction> {
    module::function(dev, &LAYERS, name)
}

/// A launch of `grid` blocks of `threads` threads, no dynamic shared memory.
fn config(grid_dim: (u32, u32, u32), threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim,
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A fresh output or workspace of `n` elements of `T` (every element is written by a kernel
/// before any is read).
fn alloc_out<T: DeviceRepr>(dev: &CudaDevice, n: usize) -> Result<CudaSlice<T>> {
    // SAFETY: the launching kernel writes all `n` elements before anything reads them.
    unsafe { dev.alloc::<T>(n.max(1)) }
}

/// `nn.GroupNorm` (+ pre-add, + swish) over `(B, C, spatial)`; see `gn_stats`/`gn_apply`.
pub(crate) struct GroupNormOp {
    /// `(B, C)` in the input dtype, contiguous.
    pub add: Option<Tensor>,
    /// `(C,)` f32, contiguous.
    pub gamma: Tensor,
    pub beta: Tensor,
    pub groups: usize,
    pub eps: f32,
    /// 0 none, 1 `F.silu`, 2 `y * sigmoid(y)`.
    pub act: i32,
}

/// `gn_finalize`: the chunks' `(mean, M2)` at `part` combined into `(mean, rstd)` at `stats`.
fn finalize_stats(
    dev: &CudaDevice,
    (part, stats): (u64, u64),
    (groups_total, group_len, chunk, splits): (usize, usize, usize, usize),
    eps: f32,
) -> Result<()> {
    let ints = [groups_total, group_len, chunk, splits].map(|v| v as i32);
    let f = func(dev, "gn_finalize")?;
    let stream = dev.cuda_stream();
    let mut l = stream.launch_builder(&f);
    l.arg(&part).arg(&stats);
    l.arg(&ints[0]).arg(&ints[1]).arg(&ints[2]).arg(&ints[3]).arg(&eps);
    let cfg = config(finalize_grid(groups_total), FINALIZE_THREADS);
    // SAFETY: `part` holds 2·splits floats and `stats` 2 floats per group; one thread per group.
    unsafe { l.launch(cfg) }.w()?;
    Ok(())
}

impl GroupNormOp {
    /// The carried operands' sizes against x's `(B, C, ...)` (a mismatch would read out of bounds).
    fn check_sizes(&self, dims: &[usize], b: usize, c: usize) -> Result<()> {
        let sizes_ok = self.groups > 0
            && c.is_multiple_of(self.groups)
            && self.gamma.elem_count() == c
            && self.beta.elem_count() == c
            && self.add.as_ref().is_none_or(|a| a.elem_count() == b * c);
        if !sizes_ok {
            bail!(
                "fused GroupNorm: operand sizes do not match x {dims:?} in {} groups",
                self.groups
            )
        }
        Ok(())
    }

    fn run<T: CudaDType + DeviceRepr>(&self, x: &CudaStorage, xl: &Layout) -> Result<CudaStorage> {
        let dev = &x.device;
        let stream = dev.cuda_stream();
        let dims = xl.dims();
        let [b, c, ..] = *dims else {
            bail!("fused GroupNorm: expected (B, C, ...), found {dims:?}")
        };
        let spatial: usize = dims[2..].iter().product();
        let bg = b * self.groups;
        let group_len = c / self.groups * spatial;
        self.check_sizes(dims, b, c)?;
        let (chunk, splits) = stats_split(bg, group_len);
        let sfx = suffix(x.dtype()).unwrap_or("f32");
        let mut out = alloc_out::<T>(dev, b * c * spatial)?;
        // Both written in full before they are read: stats by `gn_stats` (one split) or
        // `gn_finalize`, the chunks' partials by `gn_stats`.
        let mut stats = alloc_out::<f32>(dev, 2 * bg)?;
        let mut part = alloc_out::<f32>(dev, if splits > 1 { 2 * bg * splits } else { 1 })?;
        let (xp, _gx) = ptr(x, contiguous_start(xl, "x")?, &stream)?;
        let carried = [Some(&self.gamma), Some(&self.beta), self.add.as_ref()];
        let stores: Vec<_> = carried.iter().map(|t| t.map(|t| t.storage_and_layout())).collect();
        let mut ptrs = [0u64; 3];
        let mut guards = vec![];
        for (i, s) in stores.iter().enumerate() {
            if let Some((st, l)) = s {
                let (p, g) = ptr(
                    cuda_of(st, "a GroupNorm operand")?,
                    contiguous_start(l, "a GroupNorm operand")?,
                    &stream,
                )?;
                ptrs[i] = p;
                guards.push(g);
            }
        }
        let [gp, bp, ap] = ptrs;
        let (sp, _gs) = stats.device_ptr_mut(&stream);
        let (pp, _gp) = part.device_ptr_mut(&stream);
        let (op, _go) = out.device_ptr_mut(&stream);
        let ints = [c as i32, self.groups as i32, spatial as i32];
        let (chunk_i, splits_i) = (chunk as i32, splits as i32);
        let f = func(dev, &format!("gn_stats_{sfx}"))?;
        let mut l = stream.launch_builder(&f);
        l.arg(&xp).arg(&ap).arg(&pp).arg(&sp);
        l.arg(&ints[0])
            .arg(&ints[1])
            .arg(&ints[2])
            .arg(&chunk_i)
            .arg(&splits_i)
            .arg(&self.eps);
        let grid = |x: usize| config(group_grid(x, bg), LAYER_THREADS);
        // SAFETY: arguments in the kernel's order and types; x is (B, C, spatial) contiguous,
        // add (B, C), γ/β (C) f32, the workspace 2·B·G·splits and stats 2·B·G floats.
        unsafe { l.launch(grid(splits)) }.w()?;
        if splits > 1 {
            finalize_stats(dev, (pp, sp), (bg, group_len, chunk, splits), self.eps)?;
        }
        let tile_i = APPLY_TILE as i32;
        let f = func(dev, &format!("gn_apply_{sfx}"))?;
        let mut l = stream.launch_builder(&f);
        l.arg(&xp).arg(&ap).arg(&sp).arg(&gp).arg(&bp).arg(&op);
        l.arg(&ints[0]).arg(&ints[1]).arg(&ints[2]).arg(&tile_i).arg(&self.act);
        // SAFETY: as above; the output holds B·C·spatial elements.
        unsafe { l.launch(grid(group_len.div_ceil(APPLY_TILE))) }.w()?;
        drop((_gx, guards, _gs, _gp, _go));
        Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
    }
}

/// `nn.LayerNorm` over the last dim; see `layer_norm`.
pub(crate) struct LayerNormOp {
    /// `(γ, β)`, each `(n,)` f32, contiguous; `None` without the affine.
    pub affine: Option<(Tensor, Tensor)>,
    pub eps: f32,
}

impl LayerNormOp {
    fn run<T: CudaDType + DeviceRepr>(&self, x: &CudaStorage, xl: &Layout) -> Result<CudaStorage> {
        let dev = &x.device;
        let stream = dev.cuda_stream();
        let n = xl.dims().last().copied().unwrap_or(0);
        let total = xl.shape().elem_count();
        let affine_ok = self
            .affine
            .as_ref()
            .is_none_or(|(g, b)| g.elem_count() == n && b.elem_count() == n);
        if n == 0 || !affine_ok {
            bail!("fused LayerNorm: operand sizes do not match x {:?}", xl.dims())
        }
        let rows = total / n;
        let mut out = alloc_out::<T>(dev, total)?;
        let (xp, _gx) = ptr(x, contiguous_start(xl, "x")?, &stream)?;
        let stores = self
            .affine
            .as_ref()
            .map(|(g, b)| [g, b].map(|t| t.storage_and_layout()));
        let mut ptrs = [0u64; 2];
        let mut guards = vec![];
        for (i, (st, l)) in stores.iter().flatten().enumerate() {
            let what = "a LayerNorm weight";
            let (p, g) = ptr(cuda_of(st, what)?, contiguous_start(l, what)?, &stream)?;
            ptrs[i] = p;
            guards.push(g);
        }
        let (op, _go) = out.device_ptr_mut(&stream);
        let (rows_i, n_i) = (rows as i64, n as i32);
        let sfx = suffix(x.dtype()).unwrap_or("f32");
        let f = func(dev, &format!("ln_{sfx}"))?;
        let mut l = stream.launch_builder(&f);
        l.arg(&xp).arg(&ptrs[0]).arg(&ptrs[1]).arg(&op);
        l.arg(&rows_i).arg(&n_i).arg(&self.eps);
        // SAFETY: x and the output hold rows·n elements, γ and β n floats (or are null).
        unsafe { l.launch(config(norm_rows_grid(rows), LAYER_THREADS)) }.w()?;
        drop((_gx, guards, _go));
        Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
    }
}

/// `hidden · act(gate)` of a `[hidden | gate]` last dim; see `gated`.
pub(crate) struct GatedOp {
    /// 0 erf GELU, 1 SiLU.
    pub act: i32,
}

impl GatedOp {
    fn run<T: CudaDType + DeviceRepr>(&self, h: &CudaStorage, hl: &Layout) -> Result<(CudaStorage, Shape)> {
        let dev = &h.device;
        let stream = dev.cuda_stream();
        let mut dims = hl.dims().to_vec();
        let n2 = dims.last().copied().unwrap_or(0);
        if n2 == 0 || !n2.is_multiple_of(2) {
            bail!("fused gate: expected an even, non-zero last dim, found {dims:?}")
        }
        let n = n2 / 2;
        let rows = hl.shape().elem_count() / (2 * n).max(1);
        *dims.last_mut().expect("rank ≥ 1") = n;
        let mut out = alloc_out::<T>(dev, rows * n)?;
        let (hp, _gh) = ptr(h, contiguous_start(hl, "the projection output")?, &stream)?;
        let (op, _go) = out.device_ptr_mut(&stream);
        let (rows_i, n_i) = (rows as i64, n as i32);
        let sfx = suffix(h.dtype()).unwrap_or("f32");
        let f = func(dev, &format!("gated_{sfx}"))?;
        let mut l = stream.launch_builder(&f);
        l.arg(&hp).arg(&op).arg(&rows_i).arg(&n_i).arg(&self.act);
        // SAFETY: h holds rows·2n elements, the output rows·n.
        unsafe { l.launch(config(row_grid(rows, n), LAYER_THREADS)) }.w()?;
        drop((_gh, _go));
        Ok((CudaStorage::wrap_cuda_slice(out, dev.clone()), Shape::from(dims)))
    }
}

/// `((h + bias) + residual) / div`; see `epilogue`.
pub(crate) struct EpilogueOp {
    /// `(bias_len,)` in h's dtype, contiguous.
    pub bias: Option<Tensor>,
    /// h as `(rows, cols)`: `cols` divides its element count.
    pub cols: usize,
    /// The bias runs along the rows (index `row % bias_len`: channel layout), else along the
    /// columns (token layout).
    pub bias_on_rows: bool,
    /// h's shape and dtype, contiguous.
    pub residual: Option<Tensor>,
    pub div: Option<f32>,
}

impl EpilogueOp {
    fn run<T: CudaDType + DeviceRepr>(&self, h: &CudaStorage, hl: &Layout) -> Result<CudaStorage> {
        let dev = &h.device;
        let stream = dev.cuda_stream();
        let total = hl.shape().elem_count();
        let cols = self.cols.max(1);
        let bias_ok = self
            .bias
            .as_ref()
            .is_none_or(|b| self.bias_on_rows || b.elem_count() == cols);
        let residual_ok = self.residual.as_ref().is_none_or(|r| r.elem_count() == total);
        if !total.is_multiple_of(cols) || !bias_ok || !residual_ok {
            bail!("fused epilogue: operand sizes do not match h {:?}", hl.dims())
        }
        let mut out = alloc_out::<T>(dev, total)?;
        let (hp, _gh) = ptr(h, contiguous_start(hl, "h")?, &stream)?;
        let stores = [self.bias.as_ref(), self.residual.as_ref()].map(|t| t.map(|t| t.storage_and_layout()));
        let mut ptrs = [0u64; 2];
        let mut guards = vec![];
        for (i, s) in stores.iter().enumerate() {
            if let Some((st, l)) = s {
                let (p, g) = ptr(
                    cuda_of(st, "an epilogue operand")?,
                    contiguous_start(l, "an epilogue operand")?,
                    &stream,
                )?;
                ptrs[i] = p;
                guards.push(g);
            }
        }
        let bias_len = self.bias.as_ref().map_or(1, |b| b.elem_count()) as i32;
        let (op, _go) = out.device_ptr_mut(&stream);
        let rows = total / cols;
        let (rows_i, cols_i, on_rows) = (rows as i64, cols as i32, i32::from(self.bias_on_rows));
        let (div, has_div) = (self.div.unwrap_or(1.0), i32::from(self.div.is_some()));
        let sfx = suffix(h.dtype()).unwrap_or("f32");
        let f = func(dev, &format!("epilogue_{sfx}"))?;
        let mut l = stream.launch_builder(&f);
        l.arg(&hp).arg(&ptrs[0]).arg(&ptrs[1]).arg(&op);
        l.arg(&rows_i)
            .arg(&cols_i)
            .arg(&bias_len)
            .arg(&on_rows)
            .arg(&div)
            .arg(&has_div);
        // SAFETY: h, the residual and the output hold rows·cols elements; the bias `bias_len`
        // (cols along the columns).
        unsafe { l.launch(config(row_grid(rows, cols), LAYER_THREADS)) }.w()?;
        drop((_gh, guards, _go));
        Ok(CudaStorage::wrap_cuda_slice(out, dev.clone()))
    }
}

/// The `CustomOp1` boilerplate of a layer op: CUDA only, dispatched on the storage dtype.
macro_rules! cuda_only_op {
    ($op:ty, $name:literal, |$s:ident, $st:ident, $l:ident, $t:ident| $body:expr) => {
        impl CustomOp1 for $op {
            fn name(&self) -> &'static str {
                $name
            }

            fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> Result<(CpuStorage, Shape)> {
                bail!(concat!($name, " runs on CUDA only"))
            }

            fn cuda_fwd(&self, $st: &CudaStorage, $l: &Layout) -> Result<(CudaStorage, Shape)> {
                let $s = self;
                match $st.dtype() {
                    DType::F16 => {
                        type $t = half::f16;
                        $body
                    }
                    DType::BF16 => {
                        type $t = half::bf16;
                        $body
                    }
                    DType::F32 => {
                        type $t = f32;
                        $body
                    }
                    other => bail!("{}: unsupported dtype {other:?}", $name),
                }
            }
        }
    };
}

cuda_only_op!(GroupNormOp, "unet-fused-group-norm", |s, st, l, T| Ok((
    s.run::<T>(st, l)?,
    l.shape().clone()
)));
cuda_only_op!(LayerNormOp, "unet-fused-layer-norm", |s, st, l, T| Ok((
    s.run::<T>(st, l)?,
    l.shape().clone()
)));
cuda_only_op!(GatedOp, "unet-fused-gated", |s, st, l, T| s.run::<T>(st, l));
cuda_only_op!(EpilogueOp, "unet-fused-epilogue", |s, st, l, T| Ok((
    s.run::<T>(st, l)?,
    l.shape().clone()
)));

/// Whether the device can run the layer kernels (see [`module::runs`]; a note says why not, once).
pub(crate) fn usable(dev: &CudaDevice) -> Result<bool> {
    module::runs(dev, &LAYERS)
}
