//! This crate's kernel images on a device: whether a GPU can run an image (`build.rs`'s fat
//! binaries: SASS for sm_80 and sm_90 and compute_80 PTX by default; the choice is
//! [`crate::cuda_plan::image::select`]), the image loaded once per device (`cuModuleLoadData`
//! on its bytes: the driver takes the SASS of the GPU's architecture, or compiles the PTX), and
//! each kernel's function once per device with its dynamic shared memory limit raised, once, to
//! the most the GPU allows (so no launch sets an attribute another thread's launch relies on).
//!
//! Where an image cannot run (compute capability below 8.0, no entry for the GPU, or a load the
//! driver refuses), [`runs`] says `false` and prints why once per image; the callers then take
//! the chunked attention path and Candle's ops. A GPU served only by PTX runs, with a note that
//! its first call compiles the kernels.

use crate::cuda_plan::image::{describe, fatbin_entries, select, Entry, Selection};
use candle_core::cuda::cudarc::driver::{sys, CudaFunction, CudaModule};
use candle_core::cuda::cudarc::nvrtc::Ptx;
use candle_core::cuda::{CudaDevice, DeviceId, WrapErr};
use candle_core::Result;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock};

/// A kernel image built into this crate.
pub(crate) struct Image {
    /// What it holds, in words (for notes and errors).
    pub what: &'static str,
    pub bytes: &'static [u8],
}

/// `(device, image)`.
type ModuleKey = (DeviceId, &'static str);

/// Prints `msg` on stderr the first time it comes.
fn note_once(msg: String) {
    static SEEN: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    let seen = SEEN.get_or_init(Mutex::default);
    if seen.lock().unwrap_or_else(|e| e.into_inner()).insert(msg.clone()) {
        eprintln!("unet-attention: {msg}");
    }
}

/// The compute capability of `dev` as major · 10 + minor (86 for 8.6).
pub(crate) fn compute_cap(dev: &CudaDevice) -> Result<u32> {
    use sys::CUdevice_attribute as A;
    let ctx = dev.cuda_stream().context().clone();
    let major = ctx.attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR).w()?;
    let minor = ctx.attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR).w()?;
    Ok((major.max(0) * 10 + minor.clamp(0, 9)) as u32)
}

/// Which entry of `image` the GPU of `dev` runs, or why none.
pub(crate) fn selection(dev: &CudaDevice, image: &Image) -> Result<Selection> {
    let cap = compute_cap(dev)?;
    Ok(match fatbin_entries(image.bytes) {
        Ok(entries) => select(cap, &entries),
        Err(e) => Selection::Fallback(format!("the {} image is unreadable: {e}", image.what)),
    })
}

/// What `dev` runs of `image`, in words: `sm_90 machine code`, `compute_80 PTX compiled by the
/// driver`, or `fallback: <why>`.
pub(crate) fn describe_selection(dev: &CudaDevice, image: &Image) -> Result<String> {
    Ok(match selection(dev, image)? {
        Selection::Run(e @ Entry::Sass(_)) => format!("{} machine code", describe(e)),
        Selection::Run(e @ Entry::Ptx(_)) => format!("{} PTX compiled by the driver", describe(e)),
        Selection::Fallback(why) => format!("fallback: {why}"),
    })
}

/// Whether `image`'s kernels run on `dev`: an entry serves its GPU and the driver loads it.
/// `false` with a note (once) where not; never an error for an unfit GPU.
pub(crate) fn runs(dev: &CudaDevice, image: &Image) -> Result<bool> {
    match selection(dev, image)? {
        Selection::Fallback(why) => {
            note_once(format!("{}: not on this GPU ({why}); the tensor-op path runs", image.what));
            return Ok(false);
        }
        Selection::Run(Entry::Ptx(a)) => note_once(format!(
            "{}: no machine code for this GPU; the driver compiles the compute_{a} PTX at the first call (minutes for the attention kernels; build with UNET_ATTENTION_CUDA_ARCHS including this GPU's architecture)",
            image.what
        )),
        Selection::Run(Entry::Sass(_)) => {}
    }
    if let Err(e) = module(dev, image) {
        note_once(format!(
            "{}: the driver did not load it ({e}); the tensor-op path runs",
            image.what
        ));
        return Ok(false);
    }
    Ok(true)
}

/// `image` loaded on `dev`, once.
fn module(dev: &CudaDevice, image: &Image) -> Result<Arc<CudaModule>> {
    static LOADED: OnceLock<Mutex<HashMap<ModuleKey, Arc<CudaModule>>>> = OnceLock::new();
    let loaded = LOADED.get_or_init(Mutex::default);
    let mut loaded = loaded.lock().unwrap_or_else(|e| e.into_inner());
    let key = (dev.id(), image.what);
    if let Some(m) = loaded.get(&key) {
        return Ok(m.clone());
    }
    // A fresh allocation (malloc's 16-byte alignment; `include_bytes!` promises none) that the
    // driver reads as a fat binary: it picks the GPU's SASS or compiles the PTX.
    let m = dev
        .cuda_stream()
        .context()
        .load_module(Ptx::from_binary(image.bytes.to_vec()))
        .w()?;
    loaded.insert(key, m.clone());
    Ok(m)
}

/// Kernel `name` of `image` on `dev`, its dynamic shared memory limit raised to the most a
/// block may opt in to, less its static shared memory (set once per device and kernel, when it
/// is first asked for).
pub(crate) fn function(dev: &CudaDevice, image: &Image, name: &str) -> Result<CudaFunction> {
    type Key = (DeviceId, &'static str, String);
    static FUNCTIONS: OnceLock<Mutex<HashMap<Key, CudaFunction>>> = OnceLock::new();
    let functions = FUNCTIONS.get_or_init(Mutex::default);
    let mut functions = functions.lock().unwrap_or_else(|e| e.into_inner());
    let key = (dev.id(), image.what, name.to_string());
    if let Some(f) = functions.get(&key) {
        return Ok(f.clone());
    }
    let f = module(dev, image)?.load_function(name).w()?;
    use sys::CUdevice_attribute as A;
    use sys::CUfunction_attribute as F;
    let ctx = dev.cuda_stream().context().clone();
    let optin = ctx
        .attribute(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
        .w()?;
    let fixed = f.get_attribute(F::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES).w()?;
    if optin - fixed > 48 * 1024 {
        // cuFuncSetAttribute acts on the current context: make it this device's on this thread.
        ctx.bind_to_thread().w()?;
        f.set_attribute(F::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, optin - fixed)
            .w()?;
    }
    functions.insert(key, f.clone());
    Ok(f)
}
