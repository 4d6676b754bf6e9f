//! The attention tiles on AVX-512: 16 lanes, tiles sized for 32 registers.
//! `Tiles::new` hands them out for `Isa::Avx512` after lowering to
//! `Isa::detect()`.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::simd::tiles;
use crate::cpu::features::Isa;

tiles!(
    __m512,
    Isa::Avx512,
    "avx512f,avx512bw,avx512vl,avx2,fma,f16c",
    scores: (4, 8, 16),
    pv: (4, 8, 8),
);
