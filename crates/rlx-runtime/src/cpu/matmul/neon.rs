//! AArch64 NEON kernels: activations quantized to Q8_0, integer dot
//! products of Q8_0, Q4_0 and Q5_0 weight blocks with them and of Q4_K and
//! Q6_K blocks with Q8_K activations, and the f32 dot of the exact path.
//!
//! The integer kernels share one shape: a block's weights are unpacked to
//! two vectors of 16 signed 8-bit values (`Unpack`, one per weight type),
//! then multiplied with the activation block's and summed in 32-bit lanes
//! by `Dot` — `SDOT` where the CPU has the dot-product extension (through
//! `asm!`: Rust's intrinsic for it is not stable), widening multiplies
//! otherwise — so a new weight type is one unpack function, and each block
//! is scaled and summed in the reference's order.

use std::arch::aarch64::*;
use std::arch::asm;

use super::scalar::{scale_min_k4, Q8_0_BYTES, Q8_K_BYTES};
use super::table::f16_table;

/// # Safety
/// `out.len() == x.len() / 32 * 34`; `x.len()` a multiple of 32.
pub(super) unsafe fn q8_0(x: &[f32], out: &mut [u8]) {
    for (xb, b) in x.chunks_exact(32).zip(out.chunks_exact_mut(34)) {
        // SAFETY: eight 4-lane loads of a 32-element block.
        let v: [float32x4_t; 8] = std::array::from_fn(|i| vld1q_f32(xb.as_ptr().add(4 * i)));
        let mut m = vabsq_f32(v[0]);
        for r in &v[1..] {
            m = vmaxq_f32(m, vabsq_f32(*r));
        }
        let (d, id) = super::act::scale(vmaxvq_f32(m));
        b[..2].copy_from_slice(&d.to_le_bytes());
        let idv = vdupq_n_f32(id);
        for (i, pair) in v.chunks_exact(2).enumerate() {
            // Rounding to nearest, ties away from zero: C's `roundf`, as
            // the reference quantizer rounds.
            let lo = vcvtaq_s32_f32(vmulq_f32(pair[0], idv));
            let hi = vcvtaq_s32_f32(vmulq_f32(pair[1], idv));
            let q16 = vcombine_s16(vmovn_s32(lo), vmovn_s32(hi));
            let q8 = vmovn_s16(q16);
            // SAFETY: 8 bytes at 2 + 8i, inside the 34-byte block.
            vst1_s8(b.as_mut_ptr().add(2 + 8 * i) as *mut i8, q8);
        }
    }
}

/// 32 signed weights of one block as two vectors.
type Unpack = unsafe fn(block: &[u8]) -> (int8x16_t, int8x16_t);

/// Q8_0: the bytes after the scale.
#[inline(always)]
unsafe fn unpack_q8_0(b: &[u8]) -> (int8x16_t, int8x16_t) {
    // SAFETY: a 34-byte block; 32 bytes from offset 2.
    let p = b.as_ptr().add(2) as *const i8;
    (vld1q_s8(p), vld1q_s8(p.add(16)))
}

/// Q4_0: low nibbles are elements 0..16, high nibbles 16..32, minus 8.
#[inline(always)]
unsafe fn unpack_q4_0(b: &[u8]) -> (int8x16_t, int8x16_t) {
    // SAFETY: an 18-byte block; 16 bytes from offset 2.
    let q = vld1q_u8(b.as_ptr().add(2));
    let lo = vandq_u8(q, vdupq_n_u8(0x0f));
    let hi = vshrq_n_u8::<4>(q);
    let eight = vdupq_n_s8(8);
    (
        vsubq_s8(vreinterpretq_s8_u8(lo), eight),
        vsubq_s8(vreinterpretq_s8_u8(hi), eight),
    )
}

/// Q5_0: Q4_0's nibbles with a fifth bit from the 32-bit mask at offset 2,
/// minus 16.
#[inline(always)]
unsafe fn unpack_q5_0(b: &[u8]) -> (int8x16_t, int8x16_t) {
    let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
    // SAFETY: a 22-byte block; 16 bytes from offset 6.
    let q = vld1q_u8(b.as_ptr().add(6));
    let lo = vandq_u8(q, vdupq_n_u8(0x0f));
    let hi = vshrq_n_u8::<4>(q);
    let bits = |shift: u32| -> uint8x16_t {
        let v: [u8; 16] = std::array::from_fn(|j| (((qh >> (shift + j as u32)) & 1) << 4) as u8);
        // SAFETY: a 16-byte array.
        vld1q_u8(v.as_ptr())
    };
    let sixteen = vdupq_n_s8(16);
    (
        vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo, bits(0))), sixteen),
        vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(hi, bits(16))), sixteen),
    )
}

/// Σ a·b over 16 signed bytes, added to `acc`'s 32-bit lanes.
type Dot = unsafe fn(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t;

/// # Safety
/// The CPU has the dot-product extension.
#[inline]
#[target_feature(enable = "dotprod")]
unsafe fn sdot(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    // SAFETY: `SDOT Vd.4S, Vn.16B, Vm.16B` reads and writes only registers.
    asm!(
        "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
        acc = inout(vreg) acc,
        a = in(vreg) a,
        b = in(vreg) b,
        options(pure, nomem, nostack),
    );
    acc
}

/// Baseline NEON: widening multiplies, pairwise-added into 32-bit lanes.
#[inline(always)]
unsafe fn widening(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    let hi = vmull_high_s8(a, b);
    vpadalq_s16(vpadalq_s16(acc, lo), hi)
}

/// Σ over blocks of `d_w·d_a·Σ w·a`, the reference's order of operations.
#[inline(always)]
unsafe fn vec_dot<const BLOCK: usize>(w: &[u8], a: &[u8], unpack: Unpack, dot: Dot) -> f32 {
    let f16 = f16_table();
    let mut sum = 0f32;
    for (wb, ab) in w.chunks_exact(BLOCK).zip(a.chunks_exact(Q8_0_BYTES)) {
        let (w0, w1) = unpack(wb);
        let (a0, a1) = unpack_q8_0(ab);
        let acc = dot(dot(vdupq_n_s32(0), w0, a0), w1, a1);
        let sumi = vaddvq_s32(acc);
        let dw = f16[usize::from(u16::from_le_bytes([wb[0], wb[1]]))];
        let da = f16[usize::from(u16::from_le_bytes([ab[0], ab[1]]))];
        sum += (dw * da) * sumi as f32;
    }
    sum
}

/// Defines `name` (baseline NEON) and `name_dot` (`SDOT`) from a block
/// driver, its block size and its per-type part (an unpack function for
/// the Q8_0-activation formats, a block kernel for the K-quants).
macro_rules! dots {
    ($name:ident, $name_dot:ident, $driver:ident::<$block:literal>, $part:ident) => {
        /// # Safety
        /// Whole blocks of the weight type and of its activation format.
        pub(super) unsafe fn $name(w: &[u8], a: &[u8]) -> f32 {
            $driver::<{ $block }>(w, a, $part, widening)
        }

        /// # Safety
        /// As above, on a CPU with the dot-product extension.
        #[target_feature(enable = "dotprod")]
        pub(super) unsafe fn $name_dot(w: &[u8], a: &[u8]) -> f32 {
            $driver::<{ $block }>(w, a, $part, sdot)
        }
    };
}

dots!(vec_dot_q8_0, vec_dot_q8_0_sdot, vec_dot::<34>, unpack_q8_0);
dots!(vec_dot_q4_0, vec_dot_q4_0_sdot, vec_dot::<18>, unpack_q4_0);
dots!(vec_dot_q5_0, vec_dot_q5_0_sdot, vec_dot::<22>, unpack_q5_0);

/// Σ over the 16 lanes of `v·a`.
#[inline(always)]
unsafe fn dot16(dot: Dot, v: int8x16_t, a: int8x16_t) -> i32 {
    vaddvq_s32(dot(vdupq_n_s32(0), v, a))
}

/// One 256-element K-quant block against its Q8_K activation block.
type KBlock = unsafe fn(wb: &[u8], ab: &[u8], dot: Dot) -> f32;

/// Σ over blocks, in the reference's order.
#[inline(always)]
unsafe fn vec_dot_k<const BLOCK: usize>(w: &[u8], a: &[u8], block: KBlock, dot: Dot) -> f32 {
    let mut sum = 0f32;
    for (wb, ab) in w.chunks_exact(BLOCK).zip(a.chunks_exact(Q8_K_BYTES)) {
        sum += block(wb, ab, dot);
    }
    sum
}

/// Q4_K: eight sub-blocks of 32 with 6-bit scales and mins; the nibbles of
/// 32 bytes are two sub-blocks (low, then high).
#[inline(always)]
unsafe fn q4_k_block(wb: &[u8], ab: &[u8], dot: Dot) -> f32 {
    let da = f32::from_le_bytes([ab[0], ab[1], ab[2], ab[3]]);
    let f16 = f16_table();
    let d = f16[usize::from(u16::from_le_bytes([wb[0], wb[1]]))];
    let dmin = f16[usize::from(u16::from_le_bytes([wb[2], wb[3]]))];
    let scales = &wb[4..16];
    let mask = vdupq_n_u8(0x0f);
    let (mut sumi, mut summ) = (0i32, 0i32);
    for p in 0..4 {
        // SAFETY: a 144-byte block holds 128 bytes of nibbles from 16; a
        // 292-byte Q8_K block 256 values from 4.
        let q = wb.as_ptr().add(16 + 32 * p);
        let (q0, q1) = (vld1q_u8(q), vld1q_u8(q.add(16)));
        let a = ab.as_ptr().add(4 + 64 * p) as *const i8;
        let a: [int8x16_t; 4] = std::array::from_fn(|i| vld1q_s8(a.add(16 * i)));
        let lo = |x| vreinterpretq_s8_u8(vandq_u8(x, mask));
        let hi = |x| vreinterpretq_s8_u8(vshrq_n_u8::<4>(x));
        let low = dot16(dot, lo(q0), a[0]) + dot16(dot, lo(q1), a[1]);
        let high = dot16(dot, hi(q0), a[2]) + dot16(dot, hi(q1), a[3]);
        for (j, part) in [(2 * p, low), (2 * p + 1, high)] {
            let (sc, mn) = scale_min_k4(j, scales);
            sumi += i32::from(sc) * part;
            let bsum = |i: usize| i32::from(i16::from_le_bytes([ab[260 + 2 * i], ab[261 + 2 * i]]));
            summ += i32::from(mn) * (bsum(2 * j) + bsum(2 * j + 1));
        }
    }
    (da * d) * sumi as f32 - (da * dmin) * summ as f32
}

/// Q6_K: sixteen sub-blocks of 16 with 8-bit scales; four bits from `ql`,
/// two from `qh`, minus 32.
#[inline(always)]
unsafe fn q6_k_block(wb: &[u8], ab: &[u8], dot: Dot) -> f32 {
    let da = f32::from_le_bytes([ab[0], ab[1], ab[2], ab[3]]);
    let d = f16_table()[usize::from(u16::from_le_bytes([wb[208], wb[209]]))];
    let mask = vdupq_n_u8(0x0f);
    let three = vdupq_n_u8(3);
    let mut sumi = 0i32;
    for h in 0..2 {
        // SAFETY: a 210-byte block: `ql` 128 bytes from 0, `qh` 64 from 128.
        let ql = wb.as_ptr().add(64 * h);
        let qh = wb.as_ptr().add(128 + 32 * h);
        let lo: [uint8x16_t; 4] = std::array::from_fn(|i| vld1q_u8(ql.add(16 * i)));
        let hb: [uint8x16_t; 2] = std::array::from_fn(|i| vld1q_u8(qh.add(16 * i)));
        for quad in 0..4 {
            for k in 0..2 {
                let byte = lo[2 * (quad % 2) + k];
                let low = if quad < 2 {
                    vandq_u8(byte, mask)
                } else {
                    vshrq_n_u8::<4>(byte)
                };
                let shift = vdupq_n_s8(-2 * quad as i8);
                let high = vandq_u8(vshlq_u8(hb[k], shift), three);
                let v = vsubq_s8(
                    vreinterpretq_s8_u8(vorrq_u8(low, vshlq_n_u8::<4>(high))),
                    vdupq_n_s8(32),
                );
                // SAFETY: element 128h + 32·quad + 16k of the 256 from 4.
                let a = vld1q_s8(ab.as_ptr().add(4 + 128 * h + 32 * quad + 16 * k) as *const i8);
                let j = 8 * h + 2 * quad + k;
                sumi += i32::from(wb[192 + j] as i8) * dot16(dot, v, a);
            }
        }
    }
    (da * d) * sumi as f32
}

dots!(
    vec_dot_q4_k,
    vec_dot_q4_k_sdot,
    vec_dot_k::<144>,
    q4_k_block
);
dots!(
    vec_dot_q6_k,
    vec_dot_q6_k_sdot,
    vec_dot_k::<210>,
    q6_k_block
);

/// f32 dot product over `min(x.len(), w.len())` elements: four fused
/// multiply-add accumulators, then the tail.
///
/// # Safety
/// None beyond NEON, which every AArch64 CPU has.
pub(super) unsafe fn dot_f32(x: &[f32], w: &[f32]) -> f32 {
    let n = x.len().min(w.len());
    let mut acc = [vdupq_n_f32(0.0); 4];
    let mut i = 0;
    while i + 16 <= n {
        for (j, a) in acc.iter_mut().enumerate() {
            // SAFETY: i + 4j + 4 <= n for both slices.
            *a = vfmaq_f32(
                *a,
                vld1q_f32(x.as_ptr().add(i + 4 * j)),
                vld1q_f32(w.as_ptr().add(i + 4 * j)),
            );
        }
        i += 16;
    }
    let v = vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3]));
    let mut sum = vaddvq_f32(v);
    for j in i..n {
        sum += x[j] * w[j];
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::super::kernels::VecDot;
    use super::super::scalar;
    use super::*;
    use crate::cpu::features::has_neon_dotprod;

    /// Random bytes from a seed (xorshift).
    fn bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                s as u8
            })
            .collect()
    }

    #[test]
    fn activations_quantize_as_the_reference_does() {
        for n in [1, 3, 17] {
            let raw = bytes(n * 32 * 4, n as u64);
            let x: Vec<f32> = raw
                .chunks_exact(4)
                .map(|c| (i32::from_le_bytes(c.try_into().unwrap()) as f32) * 1e-9)
                .collect();
            let mut ours = vec![0u8; n * 34];
            // SAFETY: lengths as required; NEON is baseline.
            unsafe { q8_0(&x, &mut ours) };
            let reference = rlx_gguf::quantize_to_vec(rlx_gguf::GgmlType::Q8_0, &x).unwrap();
            assert_eq!(ours, reference, "{n} blocks");
        }
    }

    /// Q8_K activation blocks: a finite f32 scale, any values and sums.
    fn q8_k_blocks(n: usize, seed: u64) -> Vec<u8> {
        let mut b = bytes(Q8_K_BYTES * n, seed);
        for (i, blk) in b.chunks_exact_mut(Q8_K_BYTES).enumerate() {
            blk[..4].copy_from_slice(&(0.003 * (1 + i % 5) as f32).to_le_bytes());
        }
        b
    }

    /// Weight blocks with finite f16 scales at `scales` (byte offsets).
    fn weight_blocks(block: usize, scales: &[usize], n: usize, seed: u64) -> Vec<u8> {
        let mut w = bytes(block * n, seed);
        for (i, blk) in w.chunks_exact_mut(block).enumerate() {
            for (k, &at) in scales.iter().enumerate() {
                let d = half::f16::from_f32(0.01 * (1 + (i + k) % 7) as f32);
                blk[at..at + 2].copy_from_slice(&d.to_le_bytes());
            }
        }
        w
    }

    #[test]
    fn every_dot_equals_the_scalar_reference_bit_for_bit() {
        struct Case {
            name: &'static str,
            block: usize,
            scales: &'static [usize],
            acts: fn(usize, u64) -> Vec<u8>,
            plain: VecDot,
            dot: VecDot,
            reference: VecDot,
        }
        let q8_0_acts = |n, seed| weight_blocks(Q8_0_BYTES, &[0], n, seed);
        let cases = [
            Case {
                name: "q8_0",
                block: 34,
                scales: &[0],
                acts: q8_0_acts,
                plain: vec_dot_q8_0,
                dot: vec_dot_q8_0_sdot,
                reference: scalar::vec_dot_q8_0,
            },
            Case {
                name: "q4_0",
                block: 18,
                scales: &[0],
                acts: q8_0_acts,
                plain: vec_dot_q4_0,
                dot: vec_dot_q4_0_sdot,
                reference: scalar::vec_dot_q4_0,
            },
            Case {
                name: "q5_0",
                block: 22,
                scales: &[0],
                acts: q8_0_acts,
                plain: vec_dot_q5_0,
                dot: vec_dot_q5_0_sdot,
                reference: scalar::vec_dot_q5_0,
            },
            Case {
                name: "q4_k",
                block: 144,
                scales: &[0, 2],
                acts: q8_k_blocks,
                plain: vec_dot_q4_k,
                dot: vec_dot_q4_k_sdot,
                reference: scalar::vec_dot_q4_k,
            },
            Case {
                name: "q6_k",
                block: 210,
                scales: &[208],
                acts: q8_k_blocks,
                plain: vec_dot_q6_k,
                dot: vec_dot_q6_k_sdot,
                reference: scalar::vec_dot_q6_k,
            },
        ];
        for c in cases {
            for n in [1, 2, 7, 33] {
                let w = weight_blocks(c.block, c.scales, n, 3 * n as u64);
                let a = (c.acts)(n, 5 * n as u64);
                // SAFETY: the scalar reference has no requirement.
                let want = unsafe { (c.reference)(&w, &a) };
                // SAFETY: whole blocks; NEON is baseline.
                let got = unsafe { (c.plain)(&w, &a) };
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{} × {n}: {got} vs {want}",
                    c.name
                );
                if has_neon_dotprod() {
                    // SAFETY: as above, and the CPU has SDOT.
                    let got = unsafe { (c.dot)(&w, &a) };
                    assert_eq!(got.to_bits(), want.to_bits(), "{} sdot × {n}", c.name);
                }
            }
        }
    }
}
