//! Rayon's global pool with the calling thread as one of its workers, part of the bottom layer
//! ([`crate::cpu`]).
//!
//! Every CPU kernel of this crate runs its parallel loops on rayon's global pool. A loop started
//! from a thread outside the pool (a program's main thread, unless told otherwise) is handed to
//! the pool's threads while the caller sleeps, and the caller is woken when they are done: two
//! thread wake-ups on the critical path of every loop, dozens of loops in one block call. Where
//! an idle CPU sleeps (a VM's idle vCPU halts, and waking it goes through the hypervisor) a
//! wake-up takes from microseconds to milliseconds, and the calls' times spread with it. With the
//! calling thread one of the pool's workers (rayon's `use_current_thread`), a loop starts on it at
//! once and it works, rather than sleeps, until the loop is done; another worker that is slow to
//! wake only takes less of the loop. That is how PyTorch's OpenMP threads run: the calling
//! thread is one of the team.
//!
//! Measured on 2 vCPUs of an AMD EPYC Zen 4 VM (BENCHMARKS.md, 2026-11-27; 3 alternating rounds):
//! the SD 1.5 mid block 105.5 ms median against 119.8, its slowest call 118 against 168; the SD
//! VAE resnet 102.2 against 106.5 (slowest 107 against 120); lucidrains 16² 19.0 against 19.8
//! (slowest 27.4 against 34.7); the other blocks within the VM's spread.

/// Builds rayon's global pool with the calling thread as one of its workers: the CPU kernels'
/// parallel loops started from this thread then run on it and the pool's other threads. Call it
/// once, at the start of `main`, before anything uses rayon (Candle's CPU ops use it too); run
/// the blocks from this thread (a call from another thread runs on the other workers only, as
/// rayon's workers do not take work handed to this thread's pool while it is busy elsewhere). The
/// threads: `RAYON_NUM_THREADS` if it is a positive whole number, else one a CPU, this thread
/// included.
///
/// Returns `false`, changing nothing, where the global pool already exists (built by an earlier
/// call, by the program, or by a first use of rayon), where this thread is already a worker of
/// some rayon pool (a call inside a local pool's `install`: rayon's one-time global init is left
/// untouched, so the global pool can still be built later), and where the pool would have a
/// single thread (this one: work handed to the pool from another thread would then wait for it):
/// the blocks then run as they would without this call. The results never depend on it; only the
/// time does.
///
/// **Caveat** (rayon's `use_current_thread`): this thread only takes the pool's work while it is
/// itself inside a rayon call. A `rayon::broadcast` (or `spawn_broadcast`) runs on every worker,
/// this thread included, so one started from *another* thread waits until this thread next
/// enters rayon; if this thread meanwhile blocks on that other thread (joins it, waits on a
/// channel it fills), the two deadlock. In a program that broadcasts from other threads, do not
/// call this, or keep this thread entering rayon while it waits.
pub fn join_rayon_pool() -> bool {
    if rayon::current_thread_index().is_some() {
        // Inside a rayon worker: `build_global` would fail here and still use up rayon's
        // one-time global initialisation, leaving every later global-pool use to panic.
        return false;
    }
    let threads = std::env::var("RAYON_NUM_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    threads >= 2
        && rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .use_current_thread()
            .build_global()
            .is_ok()
}
