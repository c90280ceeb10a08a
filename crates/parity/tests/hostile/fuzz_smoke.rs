//! The fuzz targets on a stable compiler (issue 54): every target's body (`fuzz/src/`, the files
//! `cargo fuzz` runs under libFuzzer) run here over its committed corpus (`fuzz/corpus/<target>/
//! seed-*`) and a fixed number of deterministic mutations of each seed (bytes flipped, cut,
//! repeated), so that CI runs the targets, new inputs included, within a bound of time and
//! without a nightly compiler. A target that panics names the input and writes it to
//! `target/fuzz-smoke/` to be replayed with `cargo fuzz run -a <target> <file>`. (`pass_rule`
//! checks the pass rule against a naive one and is run with `cargo fuzz` only.)

#[path = "../../../../fuzz/src/bundle.rs"]
mod bundle;
#[path = "../../../../fuzz/src/checkpoint.rs"]
mod checkpoint;
#[path = "../../../../fuzz/src/config.rs"]
mod config;
#[path = "../../../../fuzz/src/folder.rs"]
mod folder;
#[path = "../../../../fuzz/src/hub.rs"]
mod hub;
#[path = "../../../../fuzz/src/pickle.rs"]
mod pickle;
#[path = "../../../../fuzz/src/walk.rs"]
mod walk;
#[path = "../../../../fuzz/src/whole.rs"]
mod whole;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::time::Duration;

/// The repository, as the targets find it.
fn repo_root() -> PathBuf {
    crate::common::root()
}

/// The committed seeds of `target`, sorted.
fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = repo_root().join("fuzz/corpus").join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("seed-")))
        .collect();
    files.sort();
    files.iter().map(|f| std::fs::read(f).unwrap()).collect()
}

/// `n` mutations of `seed`, the same on every run: a few bytes replaced, the input cut short, a
/// piece of it repeated, bytes inserted.
fn mutants(seed: &[u8], n: usize, salt: u64) -> Vec<Vec<u8>> {
    let mut state = salt.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..n)
        .map(|_| {
            let mut m = seed.to_vec();
            let len = m.len().max(1);
            match next() % 4 {
                0 => {
                    for _ in 0..1 + next() % 8 {
                        if let Some(b) = m.get_mut((next() as usize) % len) {
                            *b = next() as u8;
                        }
                    }
                }
                1 => m.truncate((next() as usize) % len),
                2 => {
                    let at = (next() as usize) % len;
                    let piece: Vec<u8> = m.iter().skip(at).take(1 + (next() as usize) % 64).copied().collect();
                    m.splice(at..at, piece);
                }
                _ => {
                    let at = (next() as usize) % len;
                    let bytes: Vec<u8> = (0..1 + next() % 16).map(|_| next() as u8).collect();
                    m.splice(at.min(m.len())..at.min(m.len()), bytes);
                }
            }
            m
        })
        .collect()
}

/// Run `target` on each seed and `per_seed` mutations of it in a thread of its own: a panic names
/// the input (and writes it for replay), a run past `limit` (a hang) fails the test.
fn smoke(name: &'static str, target: fn(&[u8]), per_seed: usize, limit: Duration) {
    let inputs: Vec<Vec<u8>> = corpus(name)
        .iter()
        .enumerate()
        .flat_map(|(i, seed)| std::iter::once(seed.clone()).chain(mutants(seed, per_seed, i as u64 + 1)))
        .collect();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for (i, input) in inputs.iter().enumerate() {
            if catch_unwind(AssertUnwindSafe(|| target(input))).is_err() {
                let dir = repo_root().join("target/fuzz-smoke");
                let _ = std::fs::create_dir_all(&dir);
                let file = dir.join(format!("{name}-{i}"));
                let _ = std::fs::write(&file, input);
                let _ = tx.send(Err(format!(
                    "{name}: input {i} panicked (written to {})",
                    file.display()
                )));
                return;
            }
        }
        let _ = tx.send(Ok(inputs.len()));
    });
    match rx.recv_timeout(limit) {
        Ok(Ok(n)) => eprintln!("fuzz smoke: {name}: {n} inputs"),
        Ok(Err(e)) => panic!("{e}"),
        Err(_) => panic!("fuzz smoke: {name} ran past {limit:?} (a hang?)"),
    }
}

/// Every target but `pass_rule`, one after another (`walk`, `hub` and `folder` build their trees
/// in one temporary folder each).
#[test]
fn every_fuzz_target_runs_over_its_corpus() {
    let minute = Duration::from_secs(60);
    smoke("folder", folder::run, 64, 3 * minute);
    smoke("whole", whole::run, 48, 3 * minute);
    smoke("bundle", bundle::run, 32, 2 * minute);
    smoke("config", config::run, 8, 3 * minute);
    smoke("checkpoint", checkpoint::run, 64, minute);
    smoke("pickle", pickle::run, 256, minute);
    smoke("walk", walk::run, 64, minute);
    smoke("hub", hub::run, 64, minute);
}
