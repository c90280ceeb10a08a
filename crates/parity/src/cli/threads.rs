//! The thread count, capped by the machine. Rayon's global pool and Candle's own pool both size
//! themselves from `RAYON_NUM_THREADS` (Candle also from `CANDLE_NUM_THREADS`) when they are
//! first used: `RAYON_NUM_THREADS=999` on a 2-core machine made `check weights` take a minute
//! instead of half a second, and `=100000` under a 4 GiB address-space limit could not spawn the
//! pool at all (a panic for every bundle). Before anything runs, a value above the CPUs this
//! process may use (`std::thread::available_parallelism`: cores, affinity and cgroup quota) is
//! lowered to that count, with a note.

use std::io::Write;

/// The variables that size the pools.
const VARIABLES: [&str; 2] = ["RAYON_NUM_THREADS", "CANDLE_NUM_THREADS"];

/// Lower each of [`VARIABLES`] above the machine's parallelism to it, writing a `note:` to `err`.
/// Values that are not whole numbers are left to the libraries (which ignore them).
pub(super) fn cap(err: &mut dyn Write) {
    let Ok(cpus) = std::thread::available_parallelism().map(|n| n.get()) else {
        return;
    };
    for var in VARIABLES {
        let Some(asked) = std::env::var(var).ok().and_then(|v| v.trim().parse::<u128>().ok()) else {
            continue;
        };
        if asked > cpus as u128 {
            // Only this process's own variables change; the pools are not built yet (a library
            // user who built them already keeps them).
            std::env::set_var(var, cpus.to_string());
            let _ = writeln!(
                err,
                "note: {var}={asked} is more than the {cpus} CPUs this process may use; using {cpus} threads"
            );
        }
    }
}
