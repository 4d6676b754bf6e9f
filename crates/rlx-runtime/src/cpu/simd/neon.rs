//! NEON: [`Lanes`] as `float32x4_t`, [`Bytes32`] as two `uint8x16_t`.
//! NEON has no masked loads, so a partial f32 vector (a head size that is
//! not a multiple of 4) goes through a small zeroed buffer; f16 values are
//! widened as they are loaded (`FCVTL`, base Armv8).
//!
//! # Safety
//! NEON is part of every AArch64 CPU. Partial vectors read and write only
//! their `n` lanes; byte loads and stores go through array references of
//! the size they move.

use std::arch::aarch64::*;

use super::table::f16_table;
use super::{Bytes32, Lanes};
use crate::cpu::arm::f16x4_to_f32;

/// Bytes 0..16 and 16..32.
#[derive(Clone, Copy)]
pub(crate) struct U8x32(uint8x16_t, uint8x16_t);

impl U8x32 {
    /// Bytes 0..16 and 16..32 as signed vectors.
    #[inline(always)]
    pub(crate) unsafe fn signed(self) -> (int8x16_t, int8x16_t) {
        // SAFETY: register operations only.
        unsafe { (vreinterpretq_s8_u8(self.0), vreinterpretq_s8_u8(self.1)) }
    }

    #[inline(always)]
    unsafe fn map(self, f: impl Fn(uint8x16_t) -> uint8x16_t) -> U8x32 {
        U8x32(f(self.0), f(self.1))
    }

    #[inline(always)]
    unsafe fn zip(a: U8x32, b: U8x32, f: impl Fn(uint8x16_t, uint8x16_t) -> uint8x16_t) -> U8x32 {
        U8x32(f(a.0, b.0), f(a.1, b.1))
    }
}

/// 16 signed bytes as four vectors of f32, in order.
#[inline(always)]
unsafe fn widen_i8(q: uint8x16_t) -> [float32x4_t; 4] {
    // SAFETY: register operations only (NEON, the module's `# Safety`).
    unsafe {
        let q = vreinterpretq_s8_u8(q);
        let (lo, hi) = (vmovl_s8(vget_low_s8(q)), vmovl_high_s8(q));
        [
            vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))),
            vcvtq_f32_s32(vmovl_high_s16(lo)),
            vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))),
            vcvtq_f32_s32(vmovl_high_s16(hi)),
        ]
    }
}

/// 16 unsigned bytes as four vectors of f32, in order.
#[inline(always)]
unsafe fn widen_u8(q: uint8x16_t) -> [float32x4_t; 4] {
    // SAFETY: register operations only (NEON, the module's `# Safety`).
    unsafe {
        let (lo, hi) = (vmovl_u8(vget_low_u8(q)), vmovl_high_u8(q));
        [
            vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo))),
            vcvtq_f32_u32(vmovl_high_u16(lo)),
            vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi))),
            vcvtq_f32_u32(vmovl_high_u16(hi)),
        ]
    }
}

impl Bytes32 for U8x32 {
    type Table = int8x16_t;
    type F32 = float32x4_t;

    #[inline(always)]
    unsafe fn load(b: &[u8; 32]) -> Self {
        // SAFETY: the array holds the 32 bytes the two loads read.
        unsafe { U8x32(vld1q_u8(b.as_ptr()), vld1q_u8(b.as_ptr().add(16))) }
    }

    #[inline(always)]
    unsafe fn store(v: Self, out: &mut [u8; 32]) {
        // SAFETY: the array holds the 32 bytes the two stores write.
        unsafe {
            vst1q_u8(out.as_mut_ptr(), v.0);
            vst1q_u8(out.as_mut_ptr().add(16), v.1);
        }
    }

    #[inline(always)]
    unsafe fn nibbles(b: &[u8; 16]) -> Self {
        // SAFETY: the array holds the 16 bytes the load reads.
        unsafe {
            let q = vld1q_u8(b.as_ptr());
            U8x32(vandq_u8(q, vdupq_n_u8(0x0F)), vshrq_n_u8::<4>(q))
        }
    }

    #[inline(always)]
    unsafe fn splat(x: u8) -> Self {
        // SAFETY: register operations only.
        unsafe { U8x32(vdupq_n_u8(x), vdupq_n_u8(x)) }
    }

    #[inline(always)]
    unsafe fn from_bits(x: u32) -> Self {
        // SAFETY: register operations only.
        unsafe {
            // Byte j of each half tests bit j % 8 of byte j / 8 of its 16 bits.
            let weights: [u8; 16] = std::array::from_fn(|j| 1 << (j % 8));
            let w = vld1q_u8(weights.as_ptr());
            let half = |bits: u32| -> uint8x16_t {
                let lo = vdup_n_u8(bits as u8);
                let hi = vdup_n_u8((bits >> 8) as u8);
                vtstq_u8(vcombine_u8(lo, hi), w)
            };
            U8x32(half(x & 0xFFFF), half(x >> 16))
        }
    }

    #[inline(always)]
    unsafe fn and(a: Self, b: Self) -> Self {
        // SAFETY: register operations only.
        unsafe { U8x32::zip(a, b, |a, b| vandq_u8(a, b)) }
    }

    #[inline(always)]
    unsafe fn or(a: Self, b: Self) -> Self {
        // SAFETY: register operations only.
        unsafe { U8x32::zip(a, b, |a, b| vorrq_u8(a, b)) }
    }

    #[inline(always)]
    unsafe fn sub(a: Self, b: Self) -> Self {
        // SAFETY: register operations only.
        unsafe { U8x32::zip(a, b, |a, b| vsubq_u8(a, b)) }
    }

    #[inline(always)]
    unsafe fn shr_mask(v: Self, n: u32, mask: u8) -> Self {
        // SAFETY: register operations only.
        unsafe {
            let (s, m) = (vdupq_n_s8(-(n as i8)), vdupq_n_u8(mask));
            v.map(|v| vandq_u8(vshlq_u8(v, s), m))
        }
    }

    #[inline(always)]
    unsafe fn shl(v: Self, n: u32) -> Self {
        // SAFETY: register operations only.
        unsafe {
            let s = vdupq_n_s8(n as i8);
            v.map(|v| vshlq_u8(v, s))
        }
    }

    #[inline(always)]
    unsafe fn bit_value(bits: Self, bit: u32, value: Self) -> Self {
        // SAFETY: register operations only.
        unsafe {
            let m = vdupq_n_u8(1 << bit);
            let set = bits.map(|b| vtstq_u8(b, m));
            U8x32::zip(set, value, |s, v| vandq_u8(s, v))
        }
    }

    #[inline(always)]
    unsafe fn table(values: &[i8; 16]) -> int8x16_t {
        // SAFETY: the array holds the 16 bytes the load reads.
        unsafe { vld1q_s8(values.as_ptr()) }
    }

    #[inline(always)]
    unsafe fn lookup(t: int8x16_t, v: Self) -> Self {
        // SAFETY: register operations only.
        unsafe { v.map(|i| vreinterpretq_u8_s8(vqtbl1q_s8(t, i))) }
    }

    #[inline(always)]
    unsafe fn f16(b: &[u8], off: usize) -> f32 {
        f16_table()[usize::from(u16::from_le_bytes([b[off], b[off + 1]]))]
    }

    #[inline(always)]
    unsafe fn store_mul_i8(v: Self, d0: f32, d1: f32, out: &mut [f32; 32]) {
        // SAFETY: floats 16h + 4i .. 16h + 4i + 4 of the 32 the array holds.
        unsafe {
            for (h, (q, d)) in [(v.0, d0), (v.1, d1)].into_iter().enumerate() {
                for (i, x) in widen_i8(q).into_iter().enumerate() {
                    vst1q_f32(out.as_mut_ptr().add(16 * h + 4 * i), vmulq_n_f32(x, d));
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn store_mul_add_u8(
        v: Self,
        first: (f32, f32),
        second: (f32, f32),
        out: &mut [f32; 32],
    ) {
        // SAFETY: floats 16h + 4i .. 16h + 4i + 4 of the 32 the array holds.
        unsafe {
            for (h, (q, (d, off))) in [(v.0, first), (v.1, second)].into_iter().enumerate() {
                let off = vdupq_n_f32(off);
                for (i, x) in widen_u8(q).into_iter().enumerate() {
                    let y = vaddq_f32(vmulq_n_f32(x, d), off);
                    vst1q_f32(out.as_mut_ptr().add(16 * h + 4 * i), y);
                }
            }
        }
    }
}

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
        unsafe {
            let v = vmovl_u16(vld1_u16(p));
            // NaNs made quiet (their top mantissa bit set), as `half` widens them.
            let nan = vcgtq_u32(vandq_u32(v, vdupq_n_u32(0x7FFF)), vdupq_n_u32(0x7F80));
            let v = vorrq_u32(v, vandq_u32(nan, vdupq_n_u32(0x40)));
            vreinterpretq_f32_u32(vshlq_n_u32::<16>(v))
        }
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
