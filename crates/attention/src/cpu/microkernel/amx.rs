//! Intel AMX tiles for bf16 products, part of the bottom layer ([`crate::cpu`]): whether this
//! process may use them ([`available`]), a thread's tile configuration ([`Tiles`]) and the one
//! register tile the layer GEMM runs on them ([`Tiles::block_32x32`]: `tdpbf16ps`, 32 × 32 f32
//! outputs from bf16 operands, 32 products per output per instruction).
//!
//! AMX is used where the CPU reports AMX-TILE and AMX-BF16 (CPUID leaf 7, EDX bits 24 and 22; Intel
//! Sapphire Rapids and later), the kernel grants this process the tile state (Linux 5.16+,
//! `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`), and `UNET_ATTENTION_ISA` is `auto`
//! (`avx512` runs the same CPU's AVX-512 tiles instead, so both can be tested on one machine).
//! The instructions are written as inline assembly: Rust's AMX intrinsics are not stable.
//!
//! Arithmetic: each `tdpbf16ps` adds to an f32 output the products of 32 pairs of bf16 values,
//! each product exact in f32, the sums rounded to nearest even as they go, denormal inputs and
//! outputs taken as zero (Intel's SDM, "TDPBF16PS"): PyTorch's own bf16 CPU products (oneDNN on
//! AMX) compute the same sums.

/// Whether the AMX bf16 tiles may run in this process (detected and requested once).
pub(crate) fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        let allowed = matches!(super::super::isa::setting(), Ok(super::super::isa::Isa::Avx512))
            && super::super::isa::amx_allowed();
        allowed && detect()
    })
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn detect() -> bool {
    if !std::arch::is_x86_feature_detected!("avx512f") {
        return false;
    }
    // CPUID leaf 7 exists on every x86-64 CPU that reports AVX-512.
    let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
    if (leaf7.edx >> 22) & 1 == 0 || (leaf7.edx >> 24) & 1 == 0 {
        return false;
    }
    const ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    let ret: i64;
    // SAFETY: the `arch_prctl` system call with a request that only asks for permission to use
    // the tile state; it reads and writes no memory of ours.
    unsafe {
        std::arch::asm!(
            "syscall",
            inlateout("rax") ARCH_PRCTL => ret,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        )
    };
    ret == 0
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn detect() -> bool {
    false
}

/// Tile configuration: palette 1, all eight tiles 16 rows of 64 bytes.
#[cfg(target_arch = "x86_64")]
#[repr(C, align(64))]
struct Config([u8; 64]);

#[cfg(target_arch = "x86_64")]
const CONFIG: Config = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut t = 0;
    while t < 8 {
        c[16 + 2 * t] = 64;
        c[48 + t] = 16;
        t += 1;
    }
    Config(c)
};

/// The tiles configured on this thread (released when dropped): only made where [`available`]
/// says so, and not sent to another thread (the configuration is the thread's).
pub(crate) struct Tiles {
    _not_send: std::marker::PhantomData<*const ()>,
}

/// bf16 values per row of an `A` tile (and per pair-row of a `B` tile: one reduction step).
pub(crate) const STEP: usize = 32;

/// Columns of a `B` panel (one tile's output columns).
pub(crate) const PANEL: usize = 16;

impl Tiles {
    /// Configure this thread's tiles; `None` where [`available`] is false.
    pub(crate) fn configure() -> Option<Tiles> {
        if !available() {
            return None;
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `available` checked that the CPU has AMX and the kernel granted the tile state;
        // `ldtilecfg` reads the 64-byte configuration.
        unsafe {
            std::arch::asm!("ldtilecfg [{cfg}]", cfg = in(reg) CONFIG.0.as_ptr(), options(nostack, readonly));
        }
        Some(Tiles {
            _not_send: std::marker::PhantomData,
        })
    }

    /// `C (32 × 32) (+)= A (32 × 32·steps) · B (32·steps × 32)` in f32 from bf16 bits:
    /// * `a`: 32 rows of `32·steps` values, `lda` apart (`a[r·lda + p]`);
    /// * `b`: two panels of 16 columns, the second `b_panel` values after the first, each
    ///   `16·steps` rows of 16 pairs (`b[(p / 2)·32 + 2·j + p % 2]` is `B[p, j]`);
    /// * `c`: rows `ldc` apart; overwritten with the product, or the product added to it with
    ///   `accumulate`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn block_32x32(
        &self,
        (a, lda): (&[u16], usize),
        (b, b_panel): (&[u16], usize),
        steps: usize,
        (c, ldc): (&mut [f32], usize),
        accumulate: bool,
    ) {
        assert!(steps > 0 && lda >= STEP * steps && b_panel >= PANEL * STEP * steps && ldc >= 32);
        assert!(a.len() >= 31 * lda + STEP * steps, "A rows out of bounds");
        assert!(b.len() >= b_panel + PANEL * STEP * steps, "B panels out of bounds");
        assert!(c.len() >= 31 * ldc + 32, "C rows out of bounds");
        #[cfg(target_arch = "x86_64")]
        // SAFETY: the tiles are configured on this thread (`self`); every tile load reads 16 rows
        // of 64 bytes within the slices (bounds asserted above: A rows `r·lda + 32·s .. + 32`,
        // B rows `(16·s + i)·32 .. + 32` of each panel) and every store writes 16 rows of 64
        // bytes within `c` (rows `r·ldc .. + 32`).
        unsafe {
            std::arch::asm!(
                "test {acc:e}, {acc:e}",
                "jz 3f",
                "tileloadd tmm0, [{c0} + {sc}*1]",
                "tileloadd tmm1, [{c0} + {sc}*1 + 64]",
                "tileloadd tmm2, [{c1} + {sc}*1]",
                "tileloadd tmm3, [{c1} + {sc}*1 + 64]",
                "jmp 2f",
                "3:",
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                "2:",
                "tileloadd tmm4, [{a0} + {sa}*1]",
                "tileloadd tmm6, [{b0} + {sb}*1]",
                "tileloadd tmm5, [{a1} + {sa}*1]",
                "tileloadd tmm7, [{b1} + {sb}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                "add {a0}, 64",
                "add {a1}, 64",
                "add {b0}, 1024",
                "add {b1}, 1024",
                "dec {n}",
                "jnz 2b",
                "tilestored [{c0} + {sc}*1], tmm0",
                "tilestored [{c0} + {sc}*1 + 64], tmm1",
                "tilestored [{c1} + {sc}*1], tmm2",
                "tilestored [{c1} + {sc}*1 + 64], tmm3",
                acc = in(reg) accumulate as u32,
                c0 = in(reg) c.as_mut_ptr(),
                c1 = in(reg) c.as_mut_ptr().add(16 * ldc),
                sc = in(reg) 4 * ldc,
                a0 = inout(reg) a.as_ptr() => _,
                a1 = inout(reg) a.as_ptr().add(16 * lda) => _,
                sa = in(reg) 2 * lda,
                b0 = inout(reg) b.as_ptr() => _,
                b1 = inout(reg) b.as_ptr().add(b_panel) => _,
                sb = in(reg) 64usize,
                n = inout(reg) steps => _,
                options(nostack),
            );
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (accumulate, c);
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: returns the configured tiles to their initial state (no memory access).
        unsafe {
            std::arch::asm!("tilerelease", options(nostack, nomem));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `x` rounded to the nearest bf16 (ties to even), as its bits.
    fn bf16_bits(x: f32) -> u16 {
        half::bf16::from_f32(x).to_bits()
    }

    /// The tile against f64 sums of the same bf16 values, with `accumulate` and without, on
    /// strides wider than the tile.
    #[test]
    fn block_matches_f64_sums() {
        let Some(tiles) = Tiles::configure() else {
            return;
        };
        let (steps, lda, ldc) = (3usize, 3 * STEP + 8, 40usize);
        let k = STEP * steps;
        let val = |i: usize| bf16_bits(((i * 7919 % 613) as f32 - 306.0) / 97.0);
        let a: Vec<u16> = (0..32 * lda).map(val).collect();
        let b_panel = PANEL * k + 64;
        let b: Vec<u16> = (0..2 * b_panel).map(|i| val(i + 5)).collect();
        let f = |bits: u16| f32::from_bits((bits as u32) << 16) as f64;
        let b_at = |p: usize, j: usize| b[(j / PANEL) * b_panel + (p / 2) * 32 + 2 * (j % PANEL) + p % 2];
        for accumulate in [false, true] {
            let mut c = vec![0.5f32; 32 * ldc];
            tiles.block_32x32((&a, lda), (&b, b_panel), steps, (&mut c, ldc), accumulate);
            for r in 0..32 {
                for j in 0..32 {
                    let want: f64 = (0..k).map(|p| f(a[r * lda + p]) * f(b_at(p, j))).sum::<f64>()
                        + if accumulate { 0.5 } else { 0.0 };
                    let got = c[r * ldc + j] as f64;
                    assert!(
                        (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                        "({r}, {j}): {got} vs {want}"
                    );
                }
                assert!(
                    c[r * ldc + 32..(r + 1) * ldc].iter().all(|&v| v == 0.5),
                    "wrote past the tile"
                );
            }
        }
    }
}
