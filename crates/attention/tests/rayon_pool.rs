//! `unet_attention::cpu_kernels::join_rayon_pool`, in a test binary of its own: rayon's global
//! pool is built once per process, so the call must come before anything in the process uses
//! rayon, and this file's one test is the only thing that runs here.

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
    assert!(join_rayon_pool(), "the first call builds the global pool");
    assert_eq!(
        rayon::current_thread_index(),
        Some(0),
        "this thread is one of its workers"
    );
    assert!(!join_rayon_pool(), "a second call changes nothing");

    let dev = Device::Cpu;
    let shape = (2, 3, 300, 64);
    let qkv = (
        Tensor::randn(0f32, 1.0, shape, &dev).unwrap(),
        Tensor::randn(0f32, 1.0, shape, &dev).unwrap(),
        Tensor::randn(0f32, 1.0, shape, &dev).unwrap(),
    );
    let from_worker = attention(&qkv);
    // The same call from a thread outside the pool (every loop handed to the pool's threads):
    // the same bits, since the kernels split their work the same way whoever starts them.
    let from_outside = std::thread::scope(|s| s.spawn(|| attention(&qkv)).join().unwrap());
    assert!(from_worker.iter().all(|x| x.is_finite()));
    assert!(
        from_worker == from_outside,
        "results differ between the calling thread and another"
    );
}
