//! What a CUDA fat binary (the `nvcc --fatbin` image `build.rs` makes of each kernel file) holds,
//! and which of its entries a GPU would run: machine code (SASS, an ELF cubin) for its
//! architecture, PTX the driver compiles at load (tens of seconds for the attention kernels), or
//! nothing (then the callers take the chunked attention path and Candle's ops).
//!
//! Pure byte parsing and arithmetic, no CUDA types: the unit tests run it without a GPU, and
//! `build.rs` includes this file (`#[path]`) to check the image it has just built.
//!
//! The layout (read from nvcc's output; little-endian): a 16-byte header (magic `0xBA55ED50`,
//! `u16` version, `u16` header size, `u64` size of the entries that follow), then entries, each
//! a header (`u16` kind: 1 PTX, 2 ELF; `u16` version; `u32` header size; `u64` payload size; at
//! byte 28 a `u32` architecture, e.g. 90 for `sm_90` or `compute_90`) and its payload (possibly
//! compressed; not read here).

/// The magic number that opens a fat binary.
pub(crate) const FATBIN_MAGIC: u32 = 0xBA55_ED50;

/// One entry of a fat binary: machine code for `sm_<arch>` or PTX for `compute_<arch>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry {
    Sass(u32),
    Ptx(u32),
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The entries of the fat binary `image`, in order, or why it is not one.
pub(crate) fn fatbin_entries(image: &[u8]) -> Result<Vec<Entry>, String> {
    let bad = |what: &str| Err(format!("not a CUDA fat binary: {what}"));
    if u32_at(image, 0) != Some(FATBIN_MAGIC) {
        return bad("no magic number");
    }
    let (Some(header), Some(size)) = (u16_at(image, 6), u64_at(image, 8)) else {
        return bad("short header");
    };
    let start = header as usize;
    let end = start.saturating_add(size as usize);
    if start < 16 || end > image.len() {
        return bad("its size runs past the bytes");
    }
    let mut entries = vec![];
    let mut at = start;
    while at < end {
        let (Some(kind), Some(len), Some(payload), Some(arch)) = (
            u16_at(image, at),
            u32_at(image, at + 4),
            u64_at(image, at + 8),
            u32_at(image, at + 28),
        ) else {
            return bad("a short entry header");
        };
        entries.push(match kind {
            1 => Entry::Ptx(arch),
            2 => Entry::Sass(arch),
            other => return Err(format!("not a CUDA fat binary: entry kind {other}")),
        });
        let next = (at as u64).saturating_add(u64::from(len)).saturating_add(payload);
        if len < 32 || next > end as u64 {
            return bad("an entry runs past the end");
        }
        at = next as usize;
    }
    Ok(entries)
}

/// How a GPU of compute capability `cap` (major · 10 + minor: 80, 86, 90, 120) runs a kernel
/// image, as [`select`] decides it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Selection {
    /// The driver loads this entry: SASS as it is (fast), PTX compiled at load (slow: the
    /// attention kernels take minutes of ptxas).
    Run(Entry),
    /// The kernels cannot run there; the callers take the chunked attention path and Candle's
    /// ops. Why, in words.
    Fallback(String),
}

/// The entry of `entries` the driver would load on a GPU of compute capability `cap`, as CUDA's
/// compatibility rules have it: SASS for `sm_XY` runs on `X.Z` for every `Z ≥ Y` of the same
/// major (sm_80 on 8.6 and 8.9; sm_90 on 9.0 only), the newest such preferred; failing that, PTX
/// for `compute_XY` with `XY ≤ cap`, compiled by the driver. Nothing below 8.0: the kernels need
/// `mma.sync` on f16/bf16, `ldmatrix` and `cp.async`.
pub(crate) fn select(cap: u32, entries: &[Entry]) -> Selection {
    let show = |cap: u32| format!("{}.{}", cap / 10, cap % 10);
    if cap < 80 {
        return Selection::Fallback(format!(
            "compute capability {} is below 8.0 (the fused kernels need mma.sync, ldmatrix and cp.async)",
            show(cap)
        ));
    }
    let sass = entries
        .iter()
        .filter_map(|e| match *e {
            Entry::Sass(a) if a / 10 == cap / 10 && a <= cap => Some(a),
            _ => None,
        })
        .max();
    if let Some(a) = sass {
        return Selection::Run(Entry::Sass(a));
    }
    let ptx = entries
        .iter()
        .filter_map(|e| match *e {
            Entry::Ptx(a) if a <= cap => Some(a),
            _ => None,
        })
        .max();
    if let Some(a) = ptx {
        return Selection::Run(Entry::Ptx(a));
    }
    let built: Vec<String> = entries.iter().map(|e| describe(*e)).collect();
    Selection::Fallback(format!(
        "this build has no machine code or PTX that compute capability {} runs (built: {})",
        show(cap),
        if built.is_empty() {
            "nothing".to_string()
        } else {
            built.join(", ")
        }
    ))
}

/// `sm_90` or `compute_80`.
pub(crate) fn describe(e: Entry) -> String {
    match e {
        Entry::Sass(a) => format!("sm_{a}"),
        Entry::Ptx(a) => format!("compute_{a}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fat binary of `entries` with payloads of a few bytes each, laid out as nvcc lays one out.
    fn fatbin(entries: &[Entry]) -> Vec<u8> {
        let mut body = vec![];
        for (i, e) in entries.iter().enumerate() {
            let (kind, arch, header) = match *e {
                Entry::Ptx(a) => (1u16, a, 80u32),
                Entry::Sass(a) => (2u16, a, 64u32),
            };
            let payload = vec![0xA5u8; 3 + i];
            let mut h = vec![0u8; header as usize];
            h[0..2].copy_from_slice(&kind.to_le_bytes());
            h[2..4].copy_from_slice(&0x0101u16.to_le_bytes());
            h[4..8].copy_from_slice(&header.to_le_bytes());
            h[8..16].copy_from_slice(&(payload.len() as u64).to_le_bytes());
            h[28..32].copy_from_slice(&arch.to_le_bytes());
            body.extend(h);
            body.extend(payload);
        }
        let mut out = vec![];
        out.extend(FATBIN_MAGIC.to_le_bytes());
        out.extend(1u16.to_le_bytes());
        out.extend(16u16.to_le_bytes());
        out.extend((body.len() as u64).to_le_bytes());
        out.extend(body);
        out
    }

    const DEFAULT_BUILD: [Entry; 3] = [Entry::Ptx(80), Entry::Sass(80), Entry::Sass(90)];

    #[test]
    fn parses_what_it_lays_out_and_rejects_the_rest() {
        let image = fatbin(&DEFAULT_BUILD);
        assert_eq!(fatbin_entries(&image).unwrap(), DEFAULT_BUILD);
        assert!(fatbin_entries(b"// PTX text\n.version 8.0").is_err());
        assert!(fatbin_entries(&image[..image.len() - 1]).is_err(), "truncated");
        let mut bad_kind = image.clone();
        bad_kind[16] = 7;
        assert!(fatbin_entries(&bad_kind).is_err());
        assert_eq!(fatbin_entries(&fatbin(&[])).unwrap(), []);
    }

    /// Every GPU generation against the default build (sm_80 and sm_90 SASS, compute_80 PTX),
    /// an sm_90-only build and an sm_80-only one without PTX.
    #[test]
    fn selection_follows_cudas_compatibility_rules() {
        use Selection::{Fallback, Run};
        let table: [(u32, &[Entry], Option<Entry>); 13] = [
            (70, &DEFAULT_BUILD, None),
            (75, &DEFAULT_BUILD, None),
            (80, &DEFAULT_BUILD, Some(Entry::Sass(80))),
            (86, &DEFAULT_BUILD, Some(Entry::Sass(80))),
            (89, &DEFAULT_BUILD, Some(Entry::Sass(80))),
            (90, &DEFAULT_BUILD, Some(Entry::Sass(90))),
            (100, &DEFAULT_BUILD, Some(Entry::Ptx(80))),
            (120, &DEFAULT_BUILD, Some(Entry::Ptx(80))),
            (80, &[Entry::Sass(90)], None),
            (86, &[Entry::Sass(90)], None),
            (90, &[Entry::Sass(90)], Some(Entry::Sass(90))),
            (90, &[Entry::Sass(80)], None),
            (
                86,
                &[Entry::Sass(80), Entry::Sass(86), Entry::Ptx(80)],
                Some(Entry::Sass(86)),
            ),
        ];
        for (cap, built, want) in table {
            match (select(cap, built), want) {
                (Run(got), Some(want)) => assert_eq!(got, want, "cap {cap}, built {built:?}"),
                (Fallback(why), None) => assert!(!why.is_empty()),
                (got, want) => panic!("cap {cap}, built {built:?}: {got:?}, want {want:?}"),
            }
        }
        let Fallback(why) = select(75, &DEFAULT_BUILD) else {
            unreachable!()
        };
        assert!(why.contains("7.5 is below 8.0"), "{why}");
        let Fallback(why) = select(80, &[Entry::Sass(90)]) else {
            unreachable!()
        };
        assert!(why.contains("8.0") && why.contains("sm_90"), "{why}");
    }
}
