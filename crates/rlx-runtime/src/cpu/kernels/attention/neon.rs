//! The attention tiles on NEON: 4 lanes, tiles sized for 32 registers (a
//! score tile's 8 accumulators reduce into two vectors of sums).

#![cfg(target_arch = "aarch64")]

use std::arch::aarch64::*;

use super::simd::tiles;
use crate::cpu::features::Isa;

tiles!(
    float32x4_t,
    Isa::Neon, "neon", scores: (2, 4, 8), pv: (4, 8, 8));
