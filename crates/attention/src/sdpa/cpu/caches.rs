//! The cache sizes the CPU kernels block for.

/// L1d and L2 bytes of CPU 0, as Linux reports them (32 KiB and 512 KiB where it reports none).
pub(crate) fn sizes() -> (usize, usize) {
    static SIZES: std::sync::OnceLock<(usize, usize)> = std::sync::OnceLock::new();
    *SIZES.get_or_init(|| {
        let read = |level: &str, kind: &str| -> Option<usize> {
            (0..8).find_map(|i| {
                let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{i}");
                let get = |f: &str| std::fs::read_to_string(format!("{dir}/{f}")).ok();
                let (l, t, s) = (get("level")?, get("type")?, get("size")?);
                if l.trim() != level || !(t.trim() == kind || t.trim() == "Unified") {
                    return None;
                }
                let s = s.trim();
                let (num, mult) = match s.strip_suffix('K') {
                    Some(n) => (n, 1024),
                    None => match s.strip_suffix('M') {
                        Some(n) => (n, 1 << 20),
                        None => (s, 1),
                    },
                };
                num.parse::<usize>().ok().map(|n| n * mult)
            })
        };
        let l1 = read("1", "Data").unwrap_or(32 << 10).clamp(16 << 10, 256 << 10);
        let l2 = read("2", "Unified").unwrap_or(512 << 10).clamp(128 << 10, 4 << 20);
        (l1, l2)
    })
}
