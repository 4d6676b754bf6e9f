//! The attention tiles on AVX2 + FMA: 8 lanes, tiles sized for 16
//! registers. `Tiles::new` hands them out for `Isa::Avx2` (and never above
//! what `Isa::detect()` found).

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::simd::tiles;
use crate::cpu::features::Isa;

tiles!(
    __m256,
    Isa::Avx2, "avx2,fma,f16c", scores: (2, 4, 8), pv: (2, 4, 4));
