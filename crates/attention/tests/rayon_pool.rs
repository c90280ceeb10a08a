//! `unet_attention::cpu_kernels::join_rayon_pool`, in a test binary of its own: rayon's global
//! pool is built once per process, so the call must come before anything in the process uses
//! rayon. Only the first test touches rayon; the second runs the first in a child process with
//! one thread.

use candle_core::{Device, Tensor};
use unet_attention::cpu_kernels::join_rayon_pool;
use unet_attention::sdpa::{sdpa_with, SdpaPath};

/// The attention core on the CPU kernel (parallel over query blocks and heads), from the
/// current thread.
fn attention(qkv: &(Tensor, Tensor, Tensor)) -> Vec<f32> {
    let (q, k, v) = qkv;
    let out = sdpa_with(SdpaPath::Flash, q, k, v, None, 0.125).unwrap();
    out.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

#[test]
fn the_calling_thread_becomes_a_worker_once_and_the_results_stay_the_same() {
    if !join_rayon_pool() {
        // Declined only for a pool of one thread (RAYON_NUM_THREADS=1, or one CPU): nothing to
        // share a loop with.
        assert_eq!(rayon::current_num_threads(), 1, "declined, with more than one thread");
        return;
    }
    assert_eq!(
        rayon::current_thread_index(),
        Some(0),
        "this thread is one of its workers"
    );
    // A pool of this thread alone would leave the outside call below waiting forever.
    assert!(rayon::current_num_threads() >= 2, "joined a pool of one thread");
    assert!(!join_rayon_pool(), "a second call changes nothing");

    let dev = Device::Cpu;
    let shape = (2, 3, 300, 64);
    let qkv = (
        Tensor::randn(0f32, 1.0, shape, &dev).unwrap(),
        Tensor::randn(0f32, 1.0, shape, &dev).unwrap(),
        Tensor::randn(0f32, 1.0, shape, &dev).unwrap(),
    );
    let from_worker = attention(&qkv);
    // The same call from a thread outside the pool (every loop handed to the pool's other
    // threads): the same bits, since the kernels split their work the same way whoever starts
    // them, and it finishes although the calling thread is busy waiting here.
    let from_outside = std::thread::scope(|s| s.spawn(|| attention(&qkv)).join().unwrap());
    assert!(from_worker.iter().all(|x| x.is_finite()));
    assert!(
        from_worker == from_outside,
        "results differ between the calling thread and another"
    );
}

/// With `RAYON_NUM_THREADS=1` the pool would be this thread alone, and work handed to it from
/// another thread would wait for it forever: the call declines, and the test above takes its
/// single-thread branch (run here in a child process of this test binary).
#[test]
fn a_single_thread_pool_is_declined() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "the_calling_thread_becomes_a_worker_once_and_the_results_stay_the_same",
        ])
        .env("RAYON_NUM_THREADS", "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("1 passed"),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Run in a child process by the test below (ignored in a plain run): a call inside a local
/// pool's worker declines without touching rayon's one-time global initialisation, so the global
/// pool still builds, and the blocks still run, afterwards.
#[test]
#[ignore = "run in a child process by a_call_inside_a_rayon_worker_leaves_the_global_pool_alone"]
fn child_join_inside_a_local_pool() {
    let local = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
    assert!(
        !local.install(join_rayon_pool),
        "joined from inside a local pool's worker"
    );
    assert!(join_rayon_pool(), "the global pool could not be built afterwards");
    let dev = Device::Cpu;
    let t = || Tensor::randn(0f32, 1.0, (1, 2, 70, 32), &dev).unwrap();
    let out = attention(&(t(), t(), t()));
    assert!(out.iter().all(|x| x.is_finite()));
}

#[test]
fn a_call_inside_a_rayon_worker_leaves_the_global_pool_alone() {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_join_inside_a_local_pool", "--ignored"])
        .env("RAYON_NUM_THREADS", "2")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("1 passed"),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
