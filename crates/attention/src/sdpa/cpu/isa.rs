//! The vector instructions the CPU kernels use: what the CPU reports, capped by the environment
//! variable `UNET_ATTENTION_ISA` (read once), so that the kernels of a smaller CPU can be run
//! and tested on a larger one:
//!
//! * `auto` (or unset): AVX-512F where the CPU has it, else AVX2 + FMA, else none;
//! * `avx2`: as on a CPU without AVX-512 (the 6 × 16 AVX2 tiles, the AVX2 row kernels);
//! * `none`: as on a CPU without either (the `gemm` crate for the attention core, Candle's ops
//!   for the layers, the portable row kernels).
//!
//! Any other value is an error from every call that reads the setting ([`cap`]), never silently
//! ignored.

/// The most the kernels may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Cap {
    None,
    Avx2,
    Auto,
}

/// The setting, or the error an unparsable value gives.
pub(crate) fn cap() -> Result<Cap, String> {
    static CAP: std::sync::OnceLock<Result<Cap, String>> = std::sync::OnceLock::new();
    CAP.get_or_init(|| {
        crate::setting::choice(
            "UNET_ATTENTION_ISA",
            &[("auto", Cap::Auto), ("avx2", Cap::Avx2), ("none", Cap::None)],
        )
    })
    .clone()
}

/// AVX-512F reported and allowed.
pub(crate) fn avx512() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            cap() == Ok(Cap::Auto)
                && std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}

/// AVX2 and FMA reported and allowed.
pub(crate) fn avx2_fma() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            cap().is_ok_and(|c| c >= Cap::Avx2)
                && std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}
