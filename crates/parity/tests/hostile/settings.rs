//! A kernel setting with a value the crate does not know is a one-line error naming the
//! variable, the value and the values expected, exit code 2, never a panic and never a silent
//! fallback. Each setting is read once per process, so each case runs in a child process.

use crate::common::{run_limited, weights};

#[test]
fn an_unknown_kernel_setting_is_a_clear_error() {
    let bundle = weights().join("diffusers/attention_vae_mid.safetensors");
    let cases = [
        ("UNET_ATTENTION_GEMM_TILE", "rows4", "expected auto or rows3"),
        ("UNET_ATTENTION_ISA", "sse", "expected auto, avx512, avx2 or none"),
        (
            "UNET_ATTENTION_LAYERS",
            "fast",
            "expected auto, direct, winograd or candle",
        ),
    ];
    for (name, value, expected) in cases {
        let c = run_limited(
            &["check", bundle.to_str().unwrap()],
            &[(name, value), ("RUST_BACKTRACE", "0")],
        );
        assert_eq!(c.code, 2, "{name}={value}: {}", c.err);
        let line = c.err.lines().find(|l| l.starts_with("error:")).unwrap_or_default();
        assert!(
            line.contains(&format!("{name}=\"{value}\": {expected}")),
            "{name}: {:?}",
            c.err
        );
        assert!(
            !c.err.contains("panicked") && !c.out.contains("PASS"),
            "{name}: {}\n{}",
            c.out,
            c.err
        );
    }
}
