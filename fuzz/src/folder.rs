//! A diffusers model folder built from the input (a `config.json`, a sharded index and its shards,
//! from the committed tiny U-Net or VAE), loaded by the library (`UNet2DConditionModel::load`,
//! `AutoencoderKL::load`) and by `unet-parity` (`model::mid_blocks_of`, `Checkpoint::open` of the
//! weights): errors are expected; a panic, an abort or a hang (a FIFO opened blocking:
//! libFuzzer's `-timeout`) is a bug. A load that succeeds must have read every tensor where the
//! index says it is: a tensor in two shards, or in another shard than the index names, never
//! loads.
//!
//! The input: byte 0 picks the model (bit 0: the U-Net or the VAE) and the layout (bit 1: sharded;
//! bit 2: `config.json` a FIFO; bit 3: the first shard a FIFO; bit 4: one tensor in two shards;
//! bit 5: one tensor moved to another shard than the index names); byte 1 spreads the tensors over
//! 1 to 4 shards; byte 2 picks the tensor of bits 4 and 5. The rest, split at `0xff`: the
//! `config.json` text (the committed one when empty), the index text (the true one when empty),
//! and bytes that replace the first shard when not empty.

use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use unet_attention::models::{AutoencoderKL, UNet2DConditionModel};

const MODELS: [&str; 2] = ["diffusers_sd1", "diffusers_vae"];

/// The committed model's tensors, read once.
fn tensors(model: usize) -> &'static [(String, Tensor)] {
    static CACHE: std::sync::OnceLock<[Vec<(String, Tensor)>; 2]> = std::sync::OnceLock::new();
    &CACHE.get_or_init(|| {
        MODELS.map(|m| {
            let file = super::repo_root()
                .join("weights/models")
                .join(m)
                .join("diffusion_pytorch_model.safetensors");
            let mut all: Vec<(String, Tensor)> = candle_core::safetensors::load(file, &Device::Cpu)
                .unwrap_or_default()
                .into_iter()
                .collect();
            all.sort_by(|a, b| a.0.cmp(&b.0));
            all
        })
    })[model]
}

fn mkfifo(path: &Path) {
    if let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) {
        // SAFETY: a valid C string; mkfifo only creates a node.
        unsafe { libc::mkfifo(c.as_ptr(), 0o644) };
    }
}

/// The folder's files as the input says (see the module docs); whether a tensor was put in two
/// shards or in another shard than the index names (then no load may succeed).
fn build(dir: &Path, data: &[u8]) -> bool {
    let [flags, spread, pick, rest @ ..] = data else {
        return false;
    };
    let model = usize::from(flags & 1);
    let fields: Vec<&[u8]> = rest.split(|&b| b == 0xff).collect();
    let field = |i: usize| fields.get(i).copied().unwrap_or(&[]);
    let config = super::repo_root()
        .join("weights/models")
        .join(MODELS[model])
        .join("config.json");
    if flags & 4 != 0 {
        mkfifo(&dir.join("config.json"));
    } else if field(0).is_empty() {
        let _ = std::fs::copy(config, dir.join("config.json"));
    } else {
        let _ = std::fs::write(dir.join("config.json"), field(0));
    }
    let all = tensors(model);
    if all.is_empty() {
        return false;
    }
    let shards = if flags & 2 != 0 { 1 + usize::from(spread % 4) } else { 1 };
    let name = |i: usize| {
        if flags & 2 != 0 {
            format!("part-{i}.safetensors")
        } else {
            "diffusion_pytorch_model.safetensors".to_string()
        }
    };
    let mut files: Vec<HashMap<String, Tensor>> = vec![HashMap::new(); shards];
    let mut map = serde_json::Map::new();
    let picked = usize::from(*pick) % all.len();
    let mut broken = false;
    for (i, (key, t)) in all.iter().enumerate() {
        let shard = (i * 7 + usize::from(*spread)) % shards;
        map.insert(key.clone(), name(shard).into());
        let moved = i == picked && flags & 32 != 0 && shards > 1;
        files[if moved { (shard + 1) % shards } else { shard }].insert(key.clone(), t.clone());
        if i == picked && flags & 16 != 0 && shards > 1 {
            files[(shard + 1) % shards].insert(key.clone(), t.clone());
            broken = true;
        }
        broken |= moved;
    }
    for (i, f) in files.iter().enumerate() {
        let path = dir.join(name(i));
        if i == 0 && flags & 8 != 0 {
            mkfifo(&path);
        } else if i == 0 && !field(2).is_empty() {
            let _ = std::fs::write(&path, field(2));
        } else {
            let _ = candle_core::safetensors::save(f, &path);
        }
    }
    if flags & 2 != 0 {
        let index = dir.join("diffusion_pytorch_model.safetensors.index.json");
        let text = if field(1).is_empty() {
            serde_json::json!({"metadata": {}, "weight_map": map})
                .to_string()
                .into_bytes()
        } else {
            field(1).to_vec()
        };
        let _ = std::fs::write(index, text);
        broken &= field(1).is_empty();
    }
    broken
}

/// One input (see the module docs).
pub fn run(data: &[u8]) {
    let dir: PathBuf = std::env::temp_dir().join(format!("unet-parity-fuzz-folder-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    if std::fs::create_dir_all(&dir).is_err() {
        return;
    }
    let broken = build(&dir, data);
    let loaded = match data.first().map(|f| f & 1) {
        Some(0) => UNet2DConditionModel::load(&dir, DType::F32, &Device::Cpu).is_ok(),
        _ => AutoencoderKL::load(&dir, DType::F32, &Device::Cpu).is_ok(),
    };
    assert!(
        !(broken && loaded),
        "a folder whose shards disagree with their index loaded"
    );
    let _ = unet_parity::model::mid_blocks_of(&dir, &Device::Cpu, DType::F32);
    if let Some(weights) = unet_attention::files::folder::weight_file(&dir) {
        if let Ok(ck) = unet_parity::checkpoint::Checkpoint::open(&weights) {
            assert!(!broken, "a checkpoint whose shards disagree with their index opened");
            let names: Vec<String> = ck.names().take(8).cloned().collect();
            for n in &names {
                let _ = ck.load(n);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
