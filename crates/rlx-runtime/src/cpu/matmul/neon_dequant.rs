//! NEON dequantizers for the exact path, bit-identical to
//! `rlx_gguf::dequantize`: the reference's float operations in its order
//! (one multiply for `q · d`; multiply then add for `q · d + m` and
//! `d₁ · q − m₁`, IEEE `a − b` being `a + (−b)`; no FMA), as the AVX2 ones
//! do. The legacy blocks reuse the integer dots' unpack functions.
//!
//! # Safety
//! NEON is part of every AArch64 CPU; blocks are read through
//! bounds-checked slices and each vector load stays inside its block.

use rlx_gguf::GgmlType;
use std::arch::aarch64::*;

use super::neon::{
    code_values, nibbles, unpack_iq4_nl, unpack_q4_0, unpack_q4_1, unpack_q5_0, unpack_q5_1,
    unpack_q8_0, Unpack,
};
use super::scalar::{q3_k_scales, scale_min_k4, KVALUES_IQ4NL};
use super::table::f16_table;
use crate::cpu::arm::f16x4_to_f32;

/// The f16 at `off` of `b`.
#[inline(always)]
fn f16_at(b: &[u8], off: usize) -> f32 {
    f16_table()[usize::from(u16::from_le_bytes([b[off], b[off + 1]]))]
}

/// 16 signed codes as four vectors of f32, in order.
#[inline(always)]
unsafe fn widen(q: int8x16_t) -> [float32x4_t; 4] {
    // SAFETY: as the module's `# Safety` says: NEON is part of every AArch64 CPU, and each vector
    // load stays inside its bounds-checked block.
    unsafe {
        let (lo, hi) = (vmovl_s8(vget_low_s8(q)), vmovl_high_s8(q));
        [
            vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))),
            vcvtq_f32_s32(vmovl_high_s16(lo)),
            vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))),
            vcvtq_f32_s32(vmovl_high_s16(hi)),
        ]
    }
}

/// `out[i] = q[i] · d` for 16 codes (no `+ 0`: it would turn −0 into +0).
#[inline(always)]
unsafe fn store_mul(q: int8x16_t, d: f32, out: &mut [f32]) {
    // SAFETY: as the module's `# Safety` says: NEON is part of every AArch64 CPU, and each vector
    // load stays inside its bounds-checked block.
    unsafe {
        let out = &mut out[..16];
        for (i, v) in widen(q).into_iter().enumerate() {
            // SAFETY: lanes 4i .. 4i + 4 of 16.
            vst1q_f32(out.as_mut_ptr().add(4 * i), vmulq_n_f32(v, d));
        }
    }
}

/// `out[i] = q[i] · d + off` for 16 codes.
#[inline(always)]
unsafe fn store_mul_add(q: int8x16_t, d: f32, off: f32, out: &mut [f32]) {
    // SAFETY: as the module's `# Safety` says: NEON is part of every AArch64 CPU, and each vector
    // load stays inside its bounds-checked block.
    unsafe {
        let out = &mut out[..16];
        let off = vdupq_n_f32(off);
        for (i, v) in widen(q).into_iter().enumerate() {
            // SAFETY: lanes 4i .. 4i + 4 of 16.
            vst1q_f32(
                out.as_mut_ptr().add(4 * i),
                vaddq_f32(vmulq_n_f32(v, d), off),
            );
        }
    }
}

/// 32-element blocks of `BLOCK` bytes led by an f16 scale (and, with
/// `MIN`, an f16 minimum): `q · d` or `q · d + m`.
#[inline(always)]
unsafe fn legacy<const BLOCK: usize, const MIN: bool>(src: &[u8], dst: &mut [f32], unpack: Unpack) {
    // SAFETY: as the module's `# Safety` says: NEON is part of every AArch64 CPU, and each vector
    // load stays inside its bounds-checked block.
    unsafe {
        for (b, y) in src.chunks_exact(BLOCK).zip(dst.chunks_exact_mut(32)) {
            let d = f16_at(b, 0);
            let (lo, hi) = unpack(b);
            if MIN {
                let m = f16_at(b, 2);
                store_mul_add(lo, d, m, &mut y[..16]);
                store_mul_add(hi, d, m, &mut y[16..]);
            } else {
                store_mul(lo, d, &mut y[..16]);
                store_mul(hi, d, &mut y[16..]);
            }
        }
    }
}

pub(super) unsafe fn dequant_q8_0(src: &[u8], dst: &mut [f32]) {
    // SAFETY: as the module's `# Safety` says: NEON is part of every AArch64 CPU, and each vector
    // load stays inside its bounds-checked block.
    unsafe { legacy::<34, false>(src, dst, unpack_q8_0) }
}

pub(super) unsafe fn dequant_q4_0(src: &[u8], dst: &mut [f32]) {
    // SAFETY: as the module's `# Safety` says: NEON is part of every AArch64 CPU, and each vector
    // load stays inside its bounds-checked block.
    unsafe { legacy::<18, false>(src, dst, unpack_q4_0) }
}

pub(super) unsafe fn dequant_q5_0(src: &[u8], dst: &mut [f32]) {
    // SAFETY: as the module's `# Safety` says: NEON is part of every AArch64 CPU, and each vector
    // load stays inside its bounds-checked block.
    unsafe { legacy::<22, false>(src, dst, unpack_q5_0) }
}

pub(super) unsafe fn dequant_iq4_nl(src: &[u8], dst: &mut [f32]) {
    // SAFETY: as the module's `# Safety` says: NEON is part of every AArch64 CPU, and each vector
    // load stays inside its bounds-checked block.
    unsafe { legacy::<18, false>(src, dst, unpack_iq4_nl) }
}

pub(super) unsafe fn dequant_q4_1(src: &[u8], dst: &mut [f32]) {
    // SAFETY: as the module's `# Safety` says: NEON is part of every AArch64 CPU, and each vector
    // load stays inside its bounds-checked block.
    unsafe { legacy::<20, true>(src, dst, unpack_q4_1) }
}

pub(super) unsafe fn dequant_q5_1(src: &[u8], dst: &mut [f32]) {
    // SAFETY: as the module's `# Safety` says: NEON is part of every AArch64 CPU, and each vector
    // load stays inside its bounds-checked block.
    unsafe { legacy::<24, true>(src, dst, unpack_q5_1) }
}

pub(super) unsafe fn dequant_f16(src: &[u8], dst: &mut [f32]) {
    // SAFETY: as the module's `# Safety` says: NEON is part of every AArch64 CPU, and each vector
    // load stays inside its bounds-checked block.
    unsafe {
        let src = &src[..2 * dst.len()];
        let s = src.chunks_exact(8);
        let tail = s.remainder();
        let mut d = dst.chunks_exact_mut(4);
        for (sc, dc) in s.zip(&mut d) {
            // SAFETY: 8 bytes in, 4 floats out.
            let h = vld1_u16(sc.as_ptr().cast());
            vst1q_f32(dc.as_mut_ptr(), f16x4_to_f32(h));
        }
        for (o, c) in d.into_remainder().iter_mut().zip(tail.chunks_exact(2)) {
            *o = f16_at(c, 0);
        }
    }
}

pub(super) unsafe fn dequant_bf16(src: &[u8], dst: &mut [f32]) {
    // SAFETY: as the module's `# Safety` says: NEON is part of every AArch64 CPU, and each vector
    // load stays inside its bounds-checked block.
    unsafe {
        let src = &src[..2 * dst.len()];
        let s = src.chunks_exact(8);
        let tail = s.remainder();
        let mut d = dst.chunks_exact_mut(4);
        for (sc, dc) in s.zip(&mut d) {
            // SAFETY: 8 bytes in, 4 floats out.
            let v = vmovl_u16(vld1_u16(sc.as_ptr().cast()));
            // Like `half`, quieten NaNs by setting the top mantissa bit.
            let nan = vcgtq_u32(vandq_u32(v, vdupq_n_u32(0x7FFF)), vdupq_n_u32(0x7F80));
            let v = vorrq_u32(v, vandq_u32(nan, vdupq_n_u32(0x40)));
            vst1q_f32(dc.as_mut_ptr(), vreinterpretq_f32_u32(vshlq_n_u32::<16>(v)));
        }
        for (o, c) in d.into_remainder().iter_mut().zip(tail.chunks_exact(2)) {
            *o = half::bf16::from_le_bytes([c[0], c[1]]).to_f32();
        }
    }
}

pub(super) unsafe fn dequant_iq4_xs(src: &[u8], dst: &mut [f32]) {
    // SAFETY: as the module's `# Safety` says: NEON is part of every AArch64 CPU, and each vector
    // load stays inside its bounds-checked block.
    unsafe {
        for (b, y) in src
            .chunks_exact(GgmlType::IQ4_XS.block_bytes())
            .zip(dst.chunks_exact_mut(256))
        {
            let d = f16_at(b, 0);
            let scales_h = u32::from(u16::from_le_bytes([b[2], b[3]]));
            for (j, y) in y.chunks_exact_mut(32).enumerate() {
                let low = u32::from((b[4 + j / 2] >> (4 * (j % 2))) & 0xF);
                let ls = (low | (((scales_h >> (2 * j)) & 3) << 4)) as i32 - 32;
                let dl = d * ls as f32;
                let qs = &b[8 + 16 * j..][..16];
                let (lo, hi) = nibbles(qs.as_ptr());
                let (lo, hi) = code_values(&KVALUES_IQ4NL, lo, hi);
                store_mul(lo, dl, &mut y[..16]);
                store_mul(hi, dl, &mut y[16..]);
            }
        }
    }
}

/// The 32 bytes at `b`, as two vectors.
#[inline(always)]
unsafe fn load32(b: &[u8]) -> [uint8x16_t; 2] {
    // SAFETY: as the module's `# Safety` says: NEON is part of every AArch64 CPU, and each vector
    // load stays inside its bounds-checked block.
    unsafe {
        let b = &b[..32];
        // SAFETY: 32 bytes.
        [vld1q_u8(b.as_ptr()), vld1q_u8(b.as_ptr().add(16))]
    }
}

/// `(v >> shift) & mask` per byte.
#[inline(always)]
unsafe fn bits(v: [uint8x16_t; 2], shift: usize, mask: u8) -> [int8x16_t; 2] {
    // SAFETY: as the module's `# Safety` says: NEON is part of every AArch64 CPU, and each vector
    // load stays inside its bounds-checked block.
    unsafe {
        let s = vdupq_n_s8(-(shift as i8));
        let m = vdupq_n_u8(mask);
        v.map(|v| vreinterpretq_s8_u8(vandq_u8(vshlq_u8(v, s), m)))
    }
}

pub(super) unsafe fn dequant_q2_k(src: &[u8], dst: &mut [f32]) {
    // SAFETY: as the module's `# Safety` says: NEON is part of every AArch64 CPU, and each vector
    // load stays inside its bounds-checked block.
    unsafe {
        for (b, y) in src
            .chunks_exact(GgmlType::Q2_K.block_bytes())
            .zip(dst.chunks_exact_mut(256))
        {
            let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
            let sc = &b[0..16];
            let dl = |s: usize| d * f32::from(sc[s] & 0xF);
            let ml = |s: usize| dmin * f32::from(sc[s] >> 4);
            for (j, y) in y.chunks_exact_mut(128).enumerate() {
                let q2 = load32(&b[16 + 32 * j..]);
                for (p, y) in y.chunks_exact_mut(32).enumerate() {
                    let [lo, hi] = bits(q2, 2 * p, 3);
                    let s = 8 * j + 2 * p;
                    store_mul_add(lo, dl(s), -ml(s), &mut y[..16]);
                    store_mul_add(hi, dl(s + 1), -ml(s + 1), &mut y[16..]);
                }
            }
        }
    }
}

pub(super) unsafe fn dequant_q3_k(src: &[u8], dst: &mut [f32]) {
    // SAFETY: as the module's `# Safety` says: NEON is part of every AArch64 CPU, and each vector
    // load stays inside its bounds-checked block.
    unsafe {
        for (b, y) in src
            .chunks_exact(GgmlType::Q3_K.block_bytes())
            .zip(dst.chunks_exact_mut(256))
        {
            let d = f16_at(b, 108);
            let hmask = load32(&b[0..]);
            let sc = q3_k_scales(&b[96..108]).map(i32::from);
            for (j, y) in y.chunks_exact_mut(128).enumerate() {
                let q3 = load32(&b[32 + 32 * j..]);
                for (p, y) in y.chunks_exact_mut(32).enumerate() {
                    let low = bits(q3, 2 * p, 3);
                    // 4 less where the element's bit of `hmask` is clear.
                    let high = bits(hmask, 4 * j + p, 1);
                    let q = [0, 1].map(|h| {
                        let four = vshlq_n_s8::<2>(vsubq_s8(vdupq_n_s8(1), high[h]));
                        vsubq_s8(low[h], four)
                    });
                    let s = 8 * j + 2 * p;
                    store_mul(q[0], d * sc[s] as f32, &mut y[..16]);
                    store_mul(q[1], d * sc[s + 1] as f32, &mut y[16..]);
                }
            }
        }
    }
}

/// Q4_K (`FIVE_BITS = false`) and Q5_K: `d·sc_j · q − dmin·mn_j` per
/// 32-element sub-block.
#[inline(always)]
unsafe fn dequant_k4<const FIVE_BITS: bool>(b: &[u8], y: &mut [f32]) {
    // SAFETY: as the module's `# Safety` says: NEON is part of every AArch64 CPU, and each vector
    // load stays inside its bounds-checked block.
    unsafe {
        let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
        let qs = if FIVE_BITS { &b[48..176] } else { &b[16..144] };
        for (j, y) in y.chunks_exact_mut(64).enumerate() {
            let q = load32(&qs[32 * j..]);
            for (h, y) in y.chunks_exact_mut(32).enumerate() {
                let sub = 2 * j + h;
                let mut codes = bits(q, 4 * h, 0xF);
                if FIVE_BITS {
                    let high = bits(load32(&b[16..]), sub, 1);
                    for (c, hb) in codes.iter_mut().zip(high) {
                        *c = vorrq_s8(*c, vshlq_n_s8::<4>(hb));
                    }
                }
                let (sc, mn) = scale_min_k4(sub, &b[4..16]);
                let (d1, m1) = (d * f32::from(sc), dmin * f32::from(mn));
                store_mul_add(codes[0], d1, -m1, &mut y[..16]);
                store_mul_add(codes[1], d1, -m1, &mut y[16..]);
            }
        }
    }
}

pub(super) unsafe fn dequant_q4_k(src: &[u8], dst: &mut [f32]) {
    // SAFETY: as the module's `# Safety` says: NEON is part of every AArch64 CPU, and each vector
    // load stays inside its bounds-checked block.
    unsafe {
        for (b, y) in src
            .chunks_exact(GgmlType::Q4_K.block_bytes())
            .zip(dst.chunks_exact_mut(256))
        {
            dequant_k4::<false>(b, y);
        }
    }
}

pub(super) unsafe fn dequant_q5_k(src: &[u8], dst: &mut [f32]) {
    // SAFETY: as the module's `# Safety` says: NEON is part of every AArch64 CPU, and each vector
    // load stays inside its bounds-checked block.
    unsafe {
        for (b, y) in src
            .chunks_exact(GgmlType::Q5_K.block_bytes())
            .zip(dst.chunks_exact_mut(256))
        {
            dequant_k4::<true>(b, y);
        }
    }
}

pub(super) unsafe fn dequant_q6_k(src: &[u8], dst: &mut [f32]) {
    // SAFETY: as the module's `# Safety` says: NEON is part of every AArch64 CPU, and each vector
    // load stays inside its bounds-checked block.
    unsafe {
        for (b, y) in src
            .chunks_exact(GgmlType::Q6_K.block_bytes())
            .zip(dst.chunks_exact_mut(256))
        {
            let d = f16_at(b, 208);
            let sc = &b[192..208];
            for (j, y) in y.chunks_exact_mut(128).enumerate() {
                let ql = &b[64 * j..];
                let (l0, l1) = (load32(ql), load32(&ql[32..]));
                let qh = load32(&b[128 + 32 * j..]);
                let lows = [
                    bits(l0, 0, 0xF),
                    bits(l1, 0, 0xF),
                    bits(l0, 4, 0xF),
                    bits(l1, 4, 0xF),
                ];
                for (p, (low, y)) in lows.into_iter().zip(y.chunks_exact_mut(32)).enumerate() {
                    let high = bits(qh, 2 * p, 3);
                    let q = [0, 1].map(|h| {
                        let v = vorrq_s8(low[h], vshlq_n_s8::<4>(high[h]));
                        vsubq_s8(v, vdupq_n_s8(32))
                    });
                    // Reference order: (d · scale) · q.
                    let s = 8 * j + 2 * p;
                    store_mul(q[0], d * f32::from(sc[s] as i8), &mut y[..16]);
                    store_mul(q[1], d * f32::from(sc[s + 1] as i8), &mut y[16..]);
                }
            }
        }
    }
}
