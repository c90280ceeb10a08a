//! The vector instruction set the CPU kernels run with ([`Isa`]), part of the bottom layer
//! ([`crate::cpu`]): what the CPU reports, capped by the environment variable
//! `UNET_ATTENTION_ISA` (read once), so that the kernels of a smaller CPU can be run and tested
//! on a larger one:
//!
//! * `auto` (or unset): AVX-512F where the CPU has it, else AVX2 + FMA, else none; and the AMX
//!   bf16 tiles for bf16 products where the CPU has them ([`crate::cpu::microkernel::amx`]);
//! * `avx512`: as on a CPU with AVX-512 but without AMX;
//! * `avx2`: as on a CPU without AVX-512 (the 6 × 16 AVX2 tiles, the AVX2 row kernels);
//! * `none`: as on a CPU without either (the `gemm` crate for the attention core, Candle's ops
//!   for the layers, the portable row kernels).
//!
//! Any other value is an error from every call that reads the setting ([`setting`]), never
//! silently ignored.

/// An instruction set the kernels are written for, from none up (ordered: a CPU with one has
/// those below it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Isa {
    /// No vector kernels of this crate: the portable row kernels, `gemm` calls, Candle's ops.
    None,
    /// AVX2 + FMA: the `6 × 16` register tile.
    Avx2,
    /// AVX-512F (with AVX2 and FMA): the `12 × 32` register tile.
    Avx512,
}

impl Isa {
    /// The widest set this CPU runs within the setting, detected once (off x86-64:
    /// [`Isa::None`]; an unreadable setting: [`Isa::None`], the error coming from [`setting`]).
    pub(crate) fn detect() -> Isa {
        static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *ISA.get_or_init(|| {
            let cap = setting().unwrap_or(Isa::None);
            #[cfg(target_arch = "x86_64")]
            {
                let avx2_fma =
                    std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma");
                if cap == Isa::Avx512 && avx2_fma && std::arch::is_x86_feature_detected!("avx512f") {
                    return Isa::Avx512;
                }
                if cap >= Isa::Avx2 && avx2_fma {
                    return Isa::Avx2;
                }
            }
            let _ = cap;
            Isa::None
        })
    }

    /// [`Isa::detect`] where it has register tiles (not [`Isa::None`]).
    pub(crate) fn with_tiles() -> Option<Isa> {
        Some(Isa::detect()).filter(|&isa| isa != Isa::None)
    }

    /// Its name, as `UNET_ATTENTION_ISA` spells it (`"none"`, `"avx2"`, `"avx512"`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Isa::None => "none",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }
}

/// The most `UNET_ATTENTION_ISA` allows (`auto`: [`Isa::Avx512`], the widest), or the error an
/// unparsable value gives.
pub(crate) fn setting() -> Result<Isa, String> {
    cap().map(|(isa, _)| isa)
}

/// Whether `UNET_ATTENTION_ISA` allows the AMX tiles (`auto` only; false for an unparsable value).
pub(crate) fn amx_allowed() -> bool {
    cap().is_ok_and(|(_, amx)| amx)
}

/// The setting: the widest vector set and whether AMX may run.
fn cap() -> Result<(Isa, bool), String> {
    static CAP: std::sync::OnceLock<Result<(Isa, bool), String>> = std::sync::OnceLock::new();
    CAP.get_or_init(|| {
        super::setting::choice(
            "UNET_ATTENTION_ISA",
            &[
                ("auto", (Isa::Avx512, true)),
                ("avx512", (Isa::Avx512, false)),
                ("avx2", (Isa::Avx2, false)),
                ("none", (Isa::None, false)),
            ],
        )
    })
    .clone()
}

/// Whether the CPU has fused multiply-adds, which PyTorch's vectorised CPU kernels then use
/// (the compiler contracts their `a * b + c`). What the CPU reports, whatever
/// `UNET_ATTENTION_ISA` says: it is PyTorch's rounding that is matched, not ours chosen.
pub(crate) fn fma_reported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("fma") && std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(target_arch = "aarch64")]
    {
        true
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        false
    }
}
