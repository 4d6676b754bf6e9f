//! Run-time detection of the instruction-set levels the CPU kernels use.
//!
//! Kernels never check CPU features themselves: callers pick an [`Isa`] (at
//! most [`Isa::detect`]) and the kernel dispatch maps it to functions.

/// Instruction-set level a kernel may use, detected once at run time.
///
/// The x86 levels are ordered and each implies the ones below it, so
/// `isa >= Isa::Avx2` is the test for "AVX2 kernels may run". [`Isa::Neon`]
/// is ARM's and sits below them: an x86 machine never detects it (asked for,
/// it runs the portable code there), an ARM machine never detects more.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Portable Rust, no explicit SIMD.
    Scalar,
    /// 64-bit ARM's Advanced SIMD (every AArch64 CPU). Kernels that also want
    /// the 8-bit dot product (`SDOT`) check [`has_neon_dotprod`] themselves.
    Neon,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX-512 F + BW + VL, on top of everything [`Isa::Avx2`] needs.
    /// Kernels that also want VNNI check [`has_avx512_vnni`] themselves.
    Avx512,
}

impl Isa {
    /// The highest level this CPU supports.
    pub fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c");
            let avx512 = std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vl");
            if avx2 && avx512 {
                Isa::Avx512
            } else if avx2 {
                Isa::Avx2
            } else {
                Isa::Scalar
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            Isa::Neon
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            Isa::Scalar
        }
    }

    /// Every level this machine can run, `Scalar` first.
    pub fn supported() -> Vec<Isa> {
        let best = Isa::detect();
        let levels = if cfg!(target_arch = "aarch64") {
            &[Isa::Scalar, Isa::Neon][..]
        } else {
            &[Isa::Scalar, Isa::Avx2, Isa::Avx512][..]
        };
        levels.iter().copied().filter(|&isa| isa <= best).collect()
    }

    /// Lower-case name, e.g. `avx2`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Neon => "neon",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// True if the CPU has the 8-bit dot product (`SDOT`, Armv8.2's dotprod:
/// every Apple M-series and Graviton 2 on) in addition to [`Isa::Neon`].
pub fn has_neon_dotprod() -> bool {
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("dotprod")
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        false
    }
}

/// True if the CPU has Armv8.6's 8-bit matrix multiply (`SMMLA`/`USMMLA`,
/// i8mm: Apple M2 on, Graviton 3 on) in addition to [`Isa::Neon`].
pub fn has_neon_i8mm() -> bool {
    #[cfg(target_arch = "aarch64")]
    {
        std::arch::is_aarch64_feature_detected!("i8mm")
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        false
    }
}

/// True if the CPU has AVX-512 VNNI (`vpdpbusd`) in addition to [`Isa::Avx512`].
pub fn has_avx512_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        Isa::detect() == Isa::Avx512 && std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn supported_levels_are_ordered_and_end_at_the_detected_one() {
        let s = Isa::supported();
        assert_eq!(s[0], Isa::Scalar);
        assert!(s.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(*s.last().unwrap(), Isa::detect());
    }
}
