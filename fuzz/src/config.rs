//! Arbitrary text as `parity.config` for every registry block, with the weights and inputs of
//! a committed bundle of that block (`weights/`, all small): config deserialization, block
//! construction, the forward and the comparison. The first byte picks the block, the second
//! the bundle; the rest is the config text. Errors are fine; a panic or an abort is a bug.
use std::path::PathBuf;
use std::sync::LazyLock;
use unet_parity::bundle::{self, Bundle, RawFile};
use unet_parity::check::{check_bundle, Options};

/// A registry block's id and its committed bundles.
type Bundles = (&'static str, Vec<(PathBuf, RawFile)>);

/// `(block id, committed bundles of it)` for every registry block, in registry order.
static BUNDLES: LazyLock<Vec<Bundles>> = LazyLock::new(|| {
    let weights = super::repo_root().join("weights");
    let files = bundle::collect(&[weights]).expect("the committed bundles");
    let parsed: Vec<(String, PathBuf, RawFile)> = files
        .into_iter()
        .filter_map(|p| {
            let raw = bundle::read_file(&p).ok()?;
            let block = raw.0.get("parity.block")?.clone();
            Some((block, p, raw))
        })
        .collect();
    unet_parity::registry::all()
        .iter()
        .map(|info| {
            let mine = parsed
                .iter()
                .filter(|(b, _, _)| b == info.id)
                .map(|(_, p, raw)| (p.clone(), raw.clone()))
                .collect();
            (info.id, mine)
        })
        .collect()
});

/// One input (see the module docs).
pub fn run(data: &[u8]) {
    let [block, which, config @ ..] = data else {
        return;
    };
    let (_, bundles) = &BUNDLES[*block as usize % BUNDLES.len()];
    if bundles.is_empty() {
        return;
    }
    let (path, raw) = &bundles[*which as usize % bundles.len()];
    let Ok(config) = std::str::from_utf8(config) else {
        return;
    };
    let (mut metadata, infos, tensors) = raw.clone();
    metadata.insert("parity.config".into(), config.to_string());
    if let Ok(bundle) = Bundle::from_raw(path, (metadata, infos, tensors)) {
        // Unused weights allowed, so that a config naming fewer layers still reaches the forward.
        let opts = Options {
            allow_unused: true,
            ..Options::default()
        };
        let _ = check_bundle(&bundle, &opts);
    }
}
