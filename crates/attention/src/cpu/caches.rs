//! The cache sizes the CPU kernels block for, part of the bottom layer ([`crate::cpu`]): what
//! Linux reports for CPU 0, or, for tests, the
//! sizes `UNET_ATTENTION_CACHE` names (read once), so that the blockings of another CPU (and the
//! summation orders they give) can be run and tested on this one:
//!
//! * unset or empty: the sizes the CPU reports (32 KiB L1d and 512 KiB L2 where it reports none);
//! * `l1d=48K,l2=2M`: those sizes (either key may be left out: the reported size then); a size is
//!   bytes, or a number with `K` / `M` (KiB / MiB).
//!
//! Sizes are clamped to 16 KiB – 256 KiB (L1d) and 128 KiB – 4 MiB (L2) either way. Any other
//! value is an error from every call that reads the setting ([`setting`], checked where the
//! kernels' other settings are), never silently ignored.

/// Bytes of L1d and L2.
type Sizes = (usize, usize);

/// L1d and L2 bytes the kernels block for: the `UNET_ATTENTION_CACHE` sizes where it is set (and
/// valid), else CPU 0's, as Linux reports them.
pub(crate) fn sizes() -> Sizes {
    static SIZES: std::sync::OnceLock<Sizes> = std::sync::OnceLock::new();
    *SIZES.get_or_init(|| {
        let (l1, l2) = match setting() {
            Ok((l1, l2)) => (
                l1.unwrap_or_else(|| reported("1", "Data")),
                l2.unwrap_or_else(|| reported("2", "Unified")),
            ),
            Err(_) => (reported("1", "Data"), reported("2", "Unified")),
        };
        (l1.clamp(16 << 10, 256 << 10), l2.clamp(128 << 10, 4 << 20))
    })
}

/// Forced `(L1d, L2)` sizes in bytes (`None`: the reported one).
type Forced = (Option<usize>, Option<usize>);

/// The sizes `UNET_ATTENTION_CACHE` forces, or why it cannot be read (a non-UTF-8 value is an
/// error, as for the other settings).
pub(crate) fn setting() -> Result<Forced, String> {
    static SETTING: std::sync::OnceLock<Result<Forced, String>> = std::sync::OnceLock::new();
    SETTING
        .get_or_init(|| {
            Ok(super::setting::parsed("UNET_ATTENTION_CACHE", "e.g. l1d=48K,l2=2M", parse)?.unwrap_or_default())
        })
        .clone()
}

/// `l1d=48K,l2=2M` (keys optional, in any order; empty: nothing forced).
fn parse(s: &str) -> Result<Forced, String> {
    let (mut l1, mut l2) = (None, None);
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((key, value)) = part.split_once('=') else {
            return Err(format!("expected l1d=SIZE,l2=SIZE, found {part:?}"));
        };
        let slot = match key.trim().to_ascii_lowercase().as_str() {
            "l1d" => &mut l1,
            "l2" => &mut l2,
            other => return Err(format!("unknown cache {other:?}: expected l1d or l2")),
        };
        if slot.is_some() {
            return Err(format!("{key} given twice"));
        }
        *slot = Some(size(value.trim())?);
    }
    Ok((l1, l2))
}

/// `48K`, `2M`, `4096`: bytes (at least 1, at most 1 GiB).
fn size(s: &str) -> Result<usize, String> {
    let upper = s.to_ascii_uppercase();
    let (num, mult) = if let Some(n) = upper.strip_suffix('K') {
        (n, 1 << 10)
    } else if let Some(n) = upper.strip_suffix('M') {
        (n, 1 << 20)
    } else {
        (upper.as_str(), 1)
    };
    match num.parse::<usize>() {
        Ok(n) if n > 0 && n.checked_mul(mult).is_some_and(|b| b <= 1 << 30) => Ok(n * mult),
        _ => Err(format!(
            "size {s:?}: expected bytes, or a number with K or M, between 1 and 1G"
        )),
    }
}

/// The size in bytes of CPU 0's level-`level` cache of type `kind` (or unified), as Linux reports
/// it; 32 KiB (L1d) and 512 KiB (L2) where it reports none.
fn reported(level: &str, kind: &str) -> usize {
    let found = (0..8).find_map(|i| {
        let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{i}");
        let get = |f: &str| std::fs::read_to_string(format!("{dir}/{f}")).ok();
        let (l, t, s) = (get("level")?, get("type")?, get("size")?);
        if l.trim() != level || !(t.trim() == kind || t.trim() == "Unified") {
            return None;
        }
        size(s.trim()).ok()
    });
    found.unwrap_or(if level == "1" { 32 << 10 } else { 512 << 10 })
}

#[cfg(test)]
mod tests {
    use super::{parse, size};

    #[test]
    fn cache_setting_parses_sizes_and_refuses_the_rest() {
        assert_eq!(parse("l1d=48K,l2=2M"), Ok((Some(48 << 10), Some(2 << 20))));
        assert_eq!(parse(" L2=256k , l1d=32768 "), Ok((Some(32 << 10), Some(256 << 10))));
        assert_eq!(parse("l2=1M"), Ok((None, Some(1 << 20))));
        assert_eq!(parse(""), Ok((None, None)));
        for bad in [
            "l3=8M",
            "l1d",
            "l1d=",
            "l1d=0",
            "l1d=48Q",
            "l1d=-1",
            "l1d=2048M",
            "l1d=1K,l1d=2K",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert_eq!(size("2M"), Ok(2 << 20));
    }
}
