//! NEON: 4 lanes, tiles sized for 32 registers (a score tile's 8
//! accumulators reduce into two vectors of sums). NEON has no masked loads,
//! so a partial vector (a head size that is not a multiple of 4) goes
//! through a small zeroed buffer; f16 K/V are widened as they are loaded
//! (`FCVTL`, base Armv8).
//!
//! # Safety
//! NEON is part of every AArch64 CPU. Partial vectors read and write only
//! their `n` lanes.

#![cfg(target_arch = "aarch64")]

use std::arch::aarch64::*;

use super::simd::{tiles, Lanes};
use crate::cpu::arm::f16x4_to_f32;

tiles!(float32x4_t, "neon", scores: (2, 4, 8), pv: (4, 8, 8));

impl Lanes for float32x4_t {
    const N: usize = 4;
    /// The lane count.
    type Prefix = usize;
    type Select = uint32x4_t;

    #[inline]
    unsafe fn zero() -> Self {
        // SAFETY: the `Lanes` contract (the module's `# Safety`): NEON is part of every AArch64
        // CPU, and pointers are valid for the lanes read or written.
        unsafe { vdupq_n_f32(0.0) }
    }

    #[inline]
    unsafe fn splat(x: f32) -> Self {
        // SAFETY: the `Lanes` contract (the module's `# Safety`): NEON is part of every AArch64
        // CPU, and pointers are valid for the lanes read or written.
        unsafe { vdupq_n_f32(x) }
    }

    #[inline]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: the `Lanes` contract (the module's `# Safety`): NEON is part of every AArch64
        // CPU, and pointers are valid for the lanes read or written.
        unsafe { vld1q_f32(p) }
    }

    #[inline]
    unsafe fn store(p: *mut f32, v: Self) {
        // SAFETY: the `Lanes` contract (the module's `# Safety`): NEON is part of every AArch64
        // CPU, and pointers are valid for the lanes read or written.
        unsafe { vst1q_f32(p, v) }
    }

    #[inline]
    unsafe fn load_f16(p: *const u16) -> Self {
        // SAFETY: the `Lanes` contract (the module's `# Safety`): NEON is part of every AArch64
        // CPU, and pointers are valid for the lanes read or written.
        unsafe { f16x4_to_f32(vld1_u16(p)) }
    }

    #[inline]
    unsafe fn load_bf16(p: *const u16) -> Self {
        // SAFETY: the `Lanes` contract (the module's `# Safety`): NEON is part of every AArch64
        // CPU, and pointers are valid for the lanes read or written.
        unsafe { vreinterpretq_f32_u32(vshll_n_u16::<16>(vld1_u16(p))) }
    }

    #[inline]
    unsafe fn prefix(n: usize) -> usize {
        n
    }

    #[inline]
    unsafe fn load_part(n: usize, p: *const f32) -> Self {
        // SAFETY: the `Lanes` contract (the module's `# Safety`): NEON is part of every AArch64
        // CPU, and pointers are valid for the lanes read or written.
        unsafe {
            if n == 4 {
                return vld1q_f32(p);
            }
            let mut buf = [0f32; 4];
            std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), n);
            vld1q_f32(buf.as_ptr())
        }
    }

    #[inline]
    unsafe fn load_part_f16(n: usize, p: *const u16) -> Self {
        // SAFETY: the `Lanes` contract (the module's `# Safety`): NEON is part of every AArch64
        // CPU, and pointers are valid for the lanes read or written.
        unsafe {
            if n == 4 {
                return Self::load_f16(p);
            }
            let mut buf = [0u16; 4];
            std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), n);
            Self::load_f16(buf.as_ptr())
        }
    }

    #[inline]
    unsafe fn store_part(n: usize, p: *mut f32, v: Self) {
        // SAFETY: the `Lanes` contract (the module's `# Safety`): NEON is part of every AArch64
        // CPU, and pointers are valid for the lanes read or written.
        unsafe {
            if n == 4 {
                return vst1q_f32(p, v);
            }
            let mut buf = [0f32; 4];
            vst1q_f32(buf.as_mut_ptr(), v);
            std::ptr::copy_nonoverlapping(buf.as_ptr(), p, n);
        }
    }

    #[inline]
    unsafe fn select(bits: u32) -> uint32x4_t {
        // SAFETY: the `Lanes` contract (the module's `# Safety`): NEON is part of every AArch64
        // CPU, and pointers are valid for the lanes read or written.
        unsafe {
            const B: [u32; 4] = [1, 2, 4, 8];
            vtstq_u32(vdupq_n_u32(bits), vld1q_u32(B.as_ptr()))
        }
    }

    #[inline]
    unsafe fn blend(m: uint32x4_t, v: Self, other: Self) -> Self {
        // SAFETY: the `Lanes` contract (the module's `# Safety`): NEON is part of every AArch64
        // CPU, and pointers are valid for the lanes read or written.
        unsafe { vbslq_f32(m, v, other) }
    }

    #[inline]
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        // SAFETY: the `Lanes` contract (the module's `# Safety`): NEON is part of every AArch64
        // CPU, and pointers are valid for the lanes read or written.
        unsafe { vfmaq_f32(c, a, b) }
    }

    #[inline]
    unsafe fn fnma(a: Self, b: Self, c: Self) -> Self {
        // SAFETY: the `Lanes` contract (the module's `# Safety`): NEON is part of every AArch64
        // CPU, and pointers are valid for the lanes read or written.
        unsafe { vfmsq_f32(c, a, b) }
    }

    #[inline]
    unsafe fn add(a: Self, b: Self) -> Self {
        // SAFETY: the `Lanes` contract (the module's `# Safety`): NEON is part of every AArch64
        // CPU, and pointers are valid for the lanes read or written.
        unsafe { vaddq_f32(a, b) }
    }

    #[inline]
    unsafe fn sub(a: Self, b: Self) -> Self {
        // SAFETY: the `Lanes` contract (the module's `# Safety`): NEON is part of every AArch64
        // CPU, and pointers are valid for the lanes read or written.
        unsafe { vsubq_f32(a, b) }
    }

    #[inline]
    unsafe fn mul(a: Self, b: Self) -> Self {
        // SAFETY: the `Lanes` contract (the module's `# Safety`): NEON is part of every AArch64
        // CPU, and pointers are valid for the lanes read or written.
        unsafe { vmulq_f32(a, b) }
    }

    #[inline]
    unsafe fn max(a: Self, b: Self) -> Self {
        // SAFETY: the `Lanes` contract (the module's `# Safety`): NEON is part of every AArch64
        // CPU, and pointers are valid for the lanes read or written.
        unsafe { vmaxq_f32(a, b) }
    }

    #[inline]
    unsafe fn min(a: Self, b: Self) -> Self {
        // SAFETY: the `Lanes` contract (the module's `# Safety`): NEON is part of every AArch64
        // CPU, and pointers are valid for the lanes read or written.
        unsafe { vminq_f32(a, b) }
    }

    #[inline]
    unsafe fn pow2(k: Self) -> Self {
        // SAFETY: the `Lanes` contract (the module's `# Safety`): NEON is part of every AArch64
        // CPU, and pointers are valid for the lanes read or written.
        unsafe {
            let e = vaddq_s32(vcvtnq_s32_f32(k), vdupq_n_s32(127));
            vreinterpretq_f32_s32(vshlq_n_s32::<23>(e))
        }
    }

    #[inline]
    unsafe fn hsum(v: Self) -> f32 {
        // SAFETY: the `Lanes` contract (the module's `# Safety`): NEON is part of every AArch64
        // CPU, and pointers are valid for the lanes read or written.
        unsafe { vaddvq_f32(v) }
    }

    #[inline]
    unsafe fn hmax(v: Self) -> f32 {
        // SAFETY: the `Lanes` contract (the module's `# Safety`): NEON is part of every AArch64
        // CPU, and pointers are valid for the lanes read or written.
        unsafe { vmaxvq_f32(v) }
    }

    /// Pairwise adds, twice.
    #[inline]
    unsafe fn reduce(v: &[Self]) -> Self {
        // SAFETY: the `Lanes` contract (the module's `# Safety`): NEON is part of every AArch64
        // CPU, and pointers are valid for the lanes read or written.
        unsafe {
            let v: &[Self; 4] = v.try_into().expect("4 vectors");
            vpaddq_f32(vpaddq_f32(v[0], v[1]), vpaddq_f32(v[2], v[3]))
        }
    }
}
