//! A kernel setting with a value the crate does not know is a one-line error naming the
//! variable, the value and the values expected, exit code 2, never a panic and never a silent
//! fallback. Each setting is read once per process, so each case runs in a child process.

use crate::common::{run_limited, weights};

#[test]
fn an_unknown_kernel_setting_is_a_clear_error() {
    let bundle = weights().join("diffusers/attention_vae_mid.safetensors");
    let cases = [
        ("UNET_ATTENTION_GEMM_TILE", "rows4", "expected auto or rows3"),
        ("UNET_ATTENTION_ISA", "sse", "expected auto, avx2 or none"),
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

/// With `RUST_BACKTRACE=1` candle attaches a backtrace to its errors; the error line carries the
/// message only (it carried the whole backtrace, escaped, about 1,500 bytes).
#[test]
fn candle_backtraces_stay_out_of_error_lines() {
    let dir = crate::common::scratch("backtrace");
    let bundle = crate::common::RawBundle::edited("diffusers/attention_vae_mid.safetensors", &dir, |b| {
        let w = b.tensors.remove("to_q.weight").unwrap();
        let wrong = w.narrow(0, 0, 3).unwrap();
        b.tensors.insert("to_q.weight".into(), wrong);
    });
    let c = run_limited(
        &["check", bundle.to_str().unwrap()],
        &[("RUST_BACKTRACE", "1")],
    );
    assert_eq!(c.code, 2, "{}{}", c.out, c.err);
    let line = c.err.lines().find(|l| l.starts_with("error:")).unwrap_or_default();
    assert!(line.contains("to_q"), "{:?}", c.err);
    assert!(
        !line.contains("\\n") && !line.contains(" 0: ") && line.len() < 400,
        "{line}"
    );
}
