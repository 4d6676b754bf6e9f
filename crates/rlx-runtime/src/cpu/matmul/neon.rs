//! AArch64 NEON kernels: activations quantized to Q8_0, the integer dot
//! products of every weight type the 8-bit path has (Q8_0, Q4_0, Q5_0,
//! IQ4_NL, MXFP4 with Q8_0 activations; Q4_1, Q5_1 with Q8_1; Q2_K, Q3_K,
//! Q4_K, Q5_K, Q6_K, IQ4_XS with Q8_K), and the f32 dot of the exact path.
//!
//! The integer kernels share one shape: a block's weights are unpacked to
//! two vectors of 16 signed 8-bit values (`Unpack`, one per weight type),
//! then multiplied with the activation block's and summed in 32-bit lanes
//! by `Dot` — `SDOT` where the CPU has the dot-product extension (through
//! `asm!`: Rust's intrinsic for it is not stable), widening multiplies
//! otherwise — so a new weight type is one unpack function, and each block
//! is scaled and summed in the reference's order.

use rlx_gguf::GgmlType;
use std::arch::aarch64::*;

use super::formats::{KQuant, Legacy, Q2K, Q3K, Q4K, Q4_1, Q5K, Q5_1, Q6K, Q8_0};
use super::rows::{rows_entry, IntDot};
use super::scalar::{k_block, scale_min_k4, KVALUES_IQ4NL, Q8_1_BYTES, Q8_K_BYTES};
use crate::cpu::arm::sdot;
use crate::cpu::simd::neon::U8x32;
use crate::cpu::simd::table::f16_table;
use crate::cpu::simd::Bytes32;
use rlx_gguf::blocks::{iq4_xs_scale, q3_k_scales};

super::f32_tile::f32_tile!(
    /// Prefill (`m ≥ 2`) f32 dots on 4 lanes (`f32_tile.rs`).
    dot_f32_tile,
    float32x4_t,
    false
);

/// # Safety
/// `out.len() == x.len() / 32 * 34`; `x.len()` a multiple of 32.
pub(super) unsafe fn q8_0(x: &[f32], out: &mut [u8]) {
    // SAFETY: the caller upholds this function's `# Safety` contract (NEON is part of every AArch64
    // CPU), so every load and store stays inside the slices it names.
    unsafe {
        for (xb, b) in x
            .chunks_exact(32)
            .zip(out.chunks_exact_mut(GgmlType::Q8_0.block_bytes()))
        {
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
}

/// 32 signed weights of one block as two vectors.
pub(super) type Unpack = unsafe fn(block: &[u8]) -> (int8x16_t, int8x16_t);

/// A legacy block's 32 codes (`formats.rs`) as signed vectors of elements
/// 0..16 and 16..32; Q8_0 activation blocks read the same way.
#[inline(always)]
pub(super) unsafe fn unpack<F: Legacy>(b: &[u8]) -> (int8x16_t, int8x16_t) {
    // SAFETY: the caller upholds this function's `# Safety` contract (NEON is part of every AArch64
    // CPU); the block is read through its slice.
    unsafe { F::codes::<U8x32>(b, U8x32::table(F::TABLE)).signed() }
}

/// Σ a·b over 16 signed bytes, added to `acc`'s 32-bit lanes.
type Dot = unsafe fn(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t;

/// Baseline NEON: widening multiplies, pairwise-added into 32-bit lanes.
#[inline(always)]
unsafe fn widening(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    // SAFETY: the caller upholds this function's `# Safety` contract (NEON is part of every AArch64
    // CPU), so every load and store stays inside the slices it names.
    unsafe {
        let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
        let hi = vmull_high_s8(a, b);
        vpadalq_s16(vpadalq_s16(acc, lo), hi)
    }
}

/// NEON's integer dot: `SDOT` where `SDOT`, else [`widening`]; each block's
/// `Σ q·x` reduced to one integer and added as the reference adds it,
/// `acc + (d_w·d_x)·Σ`.
pub(super) struct NeonDot<const SDOT: bool>;

impl<const SDOT: bool> IntDot for NeonDot<SDOT> {
    type Codes = (int8x16_t, int8x16_t);
    type Act = (int8x16_t, int8x16_t);
    type Scale = f32;
    type Acc = f32;

    #[inline(always)]
    unsafe fn codes<F: Legacy>(b: &[u8]) -> Self::Codes {
        // SAFETY: the trait's contract; `b` holds the block.
        unsafe { unpack::<F>(b) }
    }

    #[inline(always)]
    unsafe fn act<F: Legacy>(b: &[u8]) -> Self::Act {
        // SAFETY: the trait's contract; `b` holds a Q8_0 block.
        unsafe { unpack::<Q8_0>(b) }
    }

    #[inline(always)]
    unsafe fn scale(d: f32) -> f32 {
        d
    }

    #[inline(always)]
    unsafe fn zero() -> f32 {
        0.0
    }

    #[inline(always)]
    unsafe fn add<F: Legacy>(
        acc: f32,
        (w0, w1): Self::Codes,
        (a0, a1): Self::Act,
        dw: f32,
        dx: f32,
    ) -> f32 {
        // SAFETY: the trait's contract: `sdot` runs only in the entry
        // point compiled with dotprod.
        unsafe {
            let dot: Dot = if SDOT { sdot } else { widening };
            let sumi = vaddvq_s32(dot(dot(vdupq_n_s32(0), w0, a0), w1, a1));
            acc + (dw * dx) * sumi as f32
        }
    }

    #[inline(always)]
    unsafe fn finish(acc: f32) -> f32 {
        acc
    }
}

rows_entry!(
    /// The rows kernel with baseline NEON's dot.
    rows,
    NeonDot<false>,
    1,
    "neon"
);
rows_entry!(
    /// The rows kernel with `SDOT`.
    rows_sdot,
    NeonDot<true>,
    1,
    "neon,dotprod"
);

/// A block dot, as the rows kernels' but against Q8_1 activations, whose `s = d·Σq` carries the
/// weight block's minimum (its second f16).
#[inline(always)]
unsafe fn vec_dot_1<const BLOCK: usize>(w: &[u8], a: &[u8], unpack: Unpack, dot: Dot) -> f32 {
    // SAFETY: the caller upholds this function's `# Safety` contract (NEON is part of every AArch64
    // CPU), so every load and store stays inside the slices it names.
    unsafe {
        let f16 = f16_table();
        let half = |b: &[u8], at: usize| f16[usize::from(u16::from_le_bytes([b[at], b[at + 1]]))];
        let mut sum = 0f32;
        for (wb, ab) in w.chunks_exact(BLOCK).zip(a.chunks_exact(Q8_1_BYTES)) {
            let (w0, w1) = unpack(wb);
            // SAFETY: a 36-byte Q8_1 block: 32 values from offset 4.
            let p = ab.as_ptr().add(4) as *const i8;
            let (a0, a1) = (vld1q_s8(p), vld1q_s8(p.add(16)));
            let sumi = vaddvq_s32(dot(dot(vdupq_n_s32(0), w0, a0), w1, a1));
            sum += (half(wb, 0) * half(ab, 0)) * sumi as f32 + half(wb, 2) * half(ab, 2);
        }
        sum
    }
}

/// Defines `name` (baseline NEON) and `name_dot` (`SDOT`) from a block
/// driver, its block size and its per-type part (an unpack function for
/// the Q8_0-activation formats, a block kernel for the K-quants).
macro_rules! dots {
    ($name:ident, $name_dot:ident, $driver:ident::<$block:literal>, $part:expr) => {
        /// # Safety
        /// Whole blocks of the weight type and of its activation format.
        pub(super) unsafe fn $name(w: &[u8], a: &[u8]) -> f32 {
            // SAFETY: the caller upholds this function's `# Safety` contract (NEON is part of every
            // AArch64 CPU), so every load and store stays inside the slices it names.
            unsafe { $driver::<{ $block }>(w, a, $part, widening) }
        }

        /// # Safety
        /// As above, on a CPU with the dot-product extension.
        #[target_feature(enable = "dotprod")]
        pub(super) unsafe fn $name_dot(w: &[u8], a: &[u8]) -> f32 {
            // SAFETY: the caller upholds this function's `# Safety` contract (NEON is part of every
            // AArch64 CPU), so every load and store stays inside the slices it names.
            unsafe { $driver::<{ $block }>(w, a, $part, sdot) }
        }
    };
}

dots!(
    vec_dot_q4_1,
    vec_dot_q4_1_sdot,
    vec_dot_1::<20>,
    unpack::<Q4_1>
);
dots!(
    vec_dot_q5_1,
    vec_dot_q5_1_sdot,
    vec_dot_1::<24>,
    unpack::<Q5_1>
);

/// Σ over the 16 lanes of `v·a`.
#[inline(always)]
unsafe fn dot16(dot: Dot, v: int8x16_t, a: int8x16_t) -> i32 {
    // SAFETY: the caller upholds this function's `# Safety` contract (NEON is part of every AArch64
    // CPU), so every load and store stays inside the slices it names.
    unsafe { vaddvq_s32(dot(vdupq_n_s32(0), v, a)) }
}

/// One 256-element K-quant block against its Q8_K activation block.
type KBlock = unsafe fn(wb: &[u8], ab: &[u8], dot: Dot) -> f32;

/// Σ over blocks, in the reference's order.
#[inline(always)]
unsafe fn vec_dot_k<const BLOCK: usize>(w: &[u8], a: &[u8], block: KBlock, dot: Dot) -> f32 {
    // SAFETY: the caller upholds this function's `# Safety` contract (NEON is part of every AArch64
    // CPU), so every load and store stays inside the slices it names.
    unsafe {
        let mut sum = 0f32;
        for (wb, ab) in w.chunks_exact(BLOCK).zip(a.chunks_exact(Q8_K_BYTES)) {
            sum += block(wb, ab, dot);
        }
        sum
    }
}

/// Σ over a K-quant block's eight sub-blocks of 32 of `scale_j · Σ v·a`,
/// the weights of sub-blocks `2p` and `2p + 1` given by `pair(p)` as four
/// vectors (the 64 elements in order).
#[inline(always)]
unsafe fn sub32_sum(
    ab: &[u8],
    dot: Dot,
    scale: impl Fn(usize) -> i32,
    pair: impl Fn(usize) -> [int8x16_t; 4],
) -> i32 {
    // SAFETY: the caller upholds this function's `# Safety` contract (NEON is part of every AArch64
    // CPU), so every load and store stays inside the slices it names.
    unsafe {
        let mut sumi = 0i32;
        for p in 0..4 {
            let v = pair(p);
            // SAFETY: a 292-byte Q8_K block holds 256 values from offset 4.
            let a = ab.as_ptr().add(4 + 64 * p) as *const i8;
            let a: [int8x16_t; 4] = std::array::from_fn(|i| vld1q_s8(a.add(16 * i)));
            let low = dot16(dot, v[0], a[0]) + dot16(dot, v[1], a[1]);
            let high = dot16(dot, v[2], a[2]) + dot16(dot, v[3], a[3]);
            sumi += scale(2 * p) * low + scale(2 * p + 1) * high;
        }
        sumi
    }
}

/// A K-quant block's eight units (`formats.rs`), as 16 signed vectors of
/// 16 codes in element order.
#[inline(always)]
unsafe fn k_units<F: KQuant>(wb: &[u8]) -> [int8x16_t; 16] {
    // SAFETY: the caller upholds this function's `# Safety` contract (NEON is part of every AArch64
    // CPU); the block is read through its slice.
    unsafe {
        let high = F::high::<U8x32>(wb);
        let [a, b] = [0, 1].map(|q| F::quad::<U8x32>(wb, high, q));
        let units = [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]];
        std::array::from_fn(|i| {
            let (lo, hi) = units[i / 2].signed();
            if i % 2 == 0 {
                lo
            } else {
                hi
            }
        })
    }
}

/// Q4_K and Q5_K: eight sub-blocks of 32 with 6-bit scales and mins.
#[inline(always)]
unsafe fn k4_block<F: KQuant>(wb: &[u8], ab: &[u8], dot: Dot) -> f32 {
    // SAFETY: the caller upholds this function's `# Safety` contract (NEON is part of every AArch64
    // CPU), so every load and store stays inside the slices it names.
    unsafe {
        let da = f32::from_le_bytes([ab[0], ab[1], ab[2], ab[3]]);
        let f16 = f16_table();
        let d = f16[usize::from(u16::from_le_bytes([wb[0], wb[1]]))];
        let dmin = f16[usize::from(u16::from_le_bytes([wb[2], wb[3]]))];
        let scales = &wb[4..16];
        let v = k_units::<F>(wb);
        let pair = |p: usize| [v[4 * p], v[4 * p + 1], v[4 * p + 2], v[4 * p + 3]];
        let sumi = sub32_sum(ab, dot, |j| i32::from(scale_min_k4(j, scales).0), pair);
        let bsum = |i: usize| i32::from(i16::from_le_bytes([ab[260 + 2 * i], ab[261 + 2 * i]]));
        let summ: i32 = (0..8)
            .map(|j| i32::from(scale_min_k4(j, scales).1) * (bsum(2 * j) + bsum(2 * j + 1)))
            .sum();
        k_block(da, d, sumi, Some((dmin, summ)))
    }
}

#[inline(always)]
unsafe fn q4_k_block(wb: &[u8], ab: &[u8], dot: Dot) -> f32 {
    // SAFETY: the caller upholds this function's `# Safety` contract (NEON is part of every AArch64
    // CPU), so every load and store stays inside the slices it names.
    unsafe { k4_block::<Q4K>(wb, ab, dot) }
}

#[inline(always)]
unsafe fn q5_k_block(wb: &[u8], ab: &[u8], dot: Dot) -> f32 {
    // SAFETY: the caller upholds this function's `# Safety` contract (NEON is part of every AArch64
    // CPU), so every load and store stays inside the slices it names.
    unsafe { k4_block::<Q5K>(wb, ab, dot) }
}

/// IQ4_XS: eight sub-blocks of 32 code-table values with 6-bit scales less
/// 32; each sub-block's 16 bytes hold its first half in low nibbles.
#[inline(always)]
unsafe fn iq4_xs_block(wb: &[u8], ab: &[u8], dot: Dot) -> f32 {
    // SAFETY: the caller upholds this function's `# Safety` contract (NEON is part of every AArch64
    // CPU), so every load and store stays inside the slices it names.
    unsafe {
        let da = f32::from_le_bytes([ab[0], ab[1], ab[2], ab[3]]);
        let d = f16_table()[usize::from(u16::from_le_bytes([wb[0], wb[1]]))];
        let scale = |j: usize| iq4_xs_scale(wb, j);
        let table = U8x32::table(&KVALUES_IQ4NL);
        // Sub-block j's codes as IQ4_NL's: low nibbles, then high, through
        // the codebook.
        let sub = |j: usize| {
            let qs: &[u8; 16] = wb[8 + 16 * j..][..16].try_into().expect("16 bytes");
            U8x32::lookup(table, U8x32::nibbles(qs)).signed()
        };
        let pair = |p: usize| {
            let ((a, b), (c, e)) = (sub(2 * p), sub(2 * p + 1));
            [a, b, c, e]
        };
        k_block(da, d, sub32_sum(ab, dot, scale, pair), None)
    }
}

/// Q6_K: sixteen sub-blocks of 16 with 8-bit scales; codes stored + 32.
#[inline(always)]
unsafe fn q6_k_block(wb: &[u8], ab: &[u8], dot: Dot) -> f32 {
    // SAFETY: the caller upholds this function's `# Safety` contract (NEON is part of every AArch64
    // CPU), so every load and store stays inside the slices it names.
    unsafe {
        let da = f32::from_le_bytes([ab[0], ab[1], ab[2], ab[3]]);
        let d = f16_table()[usize::from(u16::from_le_bytes([wb[208], wb[209]]))];
        let v = k_units::<Q6K>(wb);
        let mut sumi = 0i32;
        for (j, v) in v.into_iter().enumerate() {
            let v = vsubq_s8(v, vdupq_n_s8(32));
            // SAFETY: elements 16j .. 16j + 16 of the 256 from 4.
            let a = vld1q_s8(ab.as_ptr().add(4 + 16 * j) as *const i8);
            sumi += i32::from(wb[192 + j] as i8) * dot16(dot, v, a);
        }
        k_block(da, d, sumi, None)
    }
}

/// Sixteen signed bytes as four vectors of 32-bit lanes, in order.
#[inline(always)]
unsafe fn widen(s: int8x16_t) -> [int32x4_t; 4] {
    // SAFETY: the caller upholds this function's `# Safety` contract (NEON is part of every AArch64
    // CPU), so every load and store stays inside the slices it names.
    unsafe {
        let (lo, hi) = (vmovl_s8(vget_low_s8(s)), vmovl_high_s8(s));
        [
            vmovl_s16(vget_low_s16(lo)),
            vmovl_high_s16(lo),
            vmovl_s16(vget_low_s16(hi)),
            vmovl_high_s16(hi),
        ]
    }
}

/// Σ over a K-quant block's sixteen sub-blocks of 16 of `scale_j · Σ v·a`,
/// sub-block `j`'s weights given by `sub(j)` and its scale by lane `j % 4`
/// of `scales[j / 4]`. Four sub-blocks' lanes are added pairwise into one
/// vector, so they take one multiply by their scales where a horizontal
/// sum each would take four.
#[inline(always)]
unsafe fn sub16_sum(
    ab: &[u8],
    dot: Dot,
    scales: [int32x4_t; 4],
    sub: impl Fn(usize) -> int8x16_t,
) -> i32 {
    // SAFETY: the caller upholds this function's `# Safety` contract (NEON is part of every AArch64
    // CPU), so every load and store stays inside the slices it names.
    unsafe {
        let zero = vdupq_n_s32(0);
        let mut acc = zero;
        for (g, scale) in scales.into_iter().enumerate() {
            let d: [int32x4_t; 4] = std::array::from_fn(|i| {
                let j = 4 * g + i;
                // SAFETY: a 292-byte Q8_K block holds 256 values from offset 4.
                let a = vld1q_s8(ab.as_ptr().add(4 + 16 * j) as *const i8);
                dot(zero, sub(j), a)
            });
            let sums = vpaddq_s32(vpaddq_s32(d[0], d[1]), vpaddq_s32(d[2], d[3]));
            acc = vmlaq_s32(acc, sums, scale);
        }
        vaddvq_s32(acc)
    }
}

/// Q2_K: sixteen sub-blocks of 16 with 4-bit scales (low nibbles) and mins
/// (high nibbles) in the 16 bytes at 0; 2-bit values from 16.
#[inline(always)]
unsafe fn q2_k_block(wb: &[u8], ab: &[u8], dot: Dot) -> f32 {
    // SAFETY: the caller upholds this function's `# Safety` contract (NEON is part of every AArch64
    // CPU), so every load and store stays inside the slices it names.
    unsafe {
        let da = f32::from_le_bytes([ab[0], ab[1], ab[2], ab[3]]);
        let f16 = f16_table();
        let d = f16[usize::from(u16::from_le_bytes([wb[80], wb[81]]))];
        let dmin = f16[usize::from(u16::from_le_bytes([wb[82], wb[83]]))];
        // SAFETY: an 84-byte block: 16 scale bytes from 0, 64 of values from 16.
        let sc = vld1q_u8(wb.as_ptr());
        let scales = widen(vreinterpretq_s8_u8(vandq_u8(sc, vdupq_n_u8(0x0f))));
        let v = k_units::<Q2K>(wb);
        let sumi = sub16_sum(ab, dot, scales, |j| v[j]);
        // Σ min_j · bsum_j, with the activations' 16 i16 run sums at 260.
        let mins = vshrq_n_u8::<4>(sc);
        let (m0, m1) = (
            vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mins))),
            vreinterpretq_s16_u16(vmovl_high_u8(mins)),
        );
        // SAFETY: a 292-byte Q8_K block: 32 bytes from 260.
        let b0 = vreinterpretq_s16_u8(vld1q_u8(ab.as_ptr().add(260)));
        let b1 = vreinterpretq_s16_u8(vld1q_u8(ab.as_ptr().add(276)));
        let prod = vmull_s16(vget_low_s16(m0), vget_low_s16(b0));
        let prod = vmlal_high_s16(prod, m0, b0);
        let prod = vmlal_s16(prod, vget_low_s16(m1), vget_low_s16(b1));
        let summ = vaddvq_s32(vmlal_high_s16(prod, m1, b1));
        k_block(da, d, sumi, Some((dmin, summ)))
    }
}

/// Q3_K: sixteen sub-blocks of 16 with signed 6-bit scales (12 bytes at
/// 96); 2-bit values from 32, less 4 where the element's bit in the 32-byte
/// `hmask` at 0 is clear.
#[inline(always)]
unsafe fn q3_k_block(wb: &[u8], ab: &[u8], dot: Dot) -> f32 {
    // SAFETY: the caller upholds this function's `# Safety` contract (NEON is part of every AArch64
    // CPU), so every load and store stays inside the slices it names.
    unsafe {
        let da = f32::from_le_bytes([ab[0], ab[1], ab[2], ab[3]]);
        let d = f16_table()[usize::from(u16::from_le_bytes([wb[108], wb[109]]))];
        let scales = q3_k_scales(&wb[96..108]);
        // SAFETY: 16 scales.
        let scales = vld1q_s8(scales.as_ptr());
        // Codes stored + 4.
        let v = k_units::<Q3K>(wb).map(|v| vsubq_s8(v, vdupq_n_s8(4)));
        let sumi = sub16_sum(ab, dot, widen(scales), |j| v[j]);
        k_block(da, d, sumi, None)
    }
}

dots!(vec_dot_q2_k, vec_dot_q2_k_sdot, vec_dot_k::<84>, q2_k_block);
dots!(
    vec_dot_q3_k,
    vec_dot_q3_k_sdot,
    vec_dot_k::<110>,
    q3_k_block
);
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
dots!(
    vec_dot_q5_k,
    vec_dot_q5_k_sdot,
    vec_dot_k::<176>,
    q5_k_block
);
dots!(
    vec_dot_iq4_xs,
    vec_dot_iq4_xs_sdot,
    vec_dot_k::<136>,
    iq4_xs_block
);

/// f32 dot ([`super::exact::dot_f32_lanes`] on 4 lanes, the tail in order).
///
/// # Safety
/// None beyond NEON, which every AArch64 CPU has.
pub(super) unsafe fn dot_f32(x: &[f32], w: &[f32]) -> f32 {
    // SAFETY: NEON is part of every AArch64 CPU.
    unsafe { super::exact::dot_f32_lanes::<float32x4_t, false>(x, w) }
}

#[cfg(test)]
mod tests {
    use super::super::formats::{Iq4Nl, Mxfp4, Q4_0, Q5_0};
    use super::super::kernels::{RowsDot, VecDot};
    use super::super::scalar::{self, Q8_0_BYTES};
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

    /// MXFP4 blocks with exponents near the bias (products stay finite), and
    /// the two that make subnormal scales.
    fn mxfp4_blocks(n: usize, seed: u64) -> Vec<u8> {
        let mut w = bytes(17 * n, seed);
        for (i, blk) in w
            .chunks_exact_mut(GgmlType::MXFP4.block_bytes())
            .enumerate()
        {
            blk[0] = if i % 8 == 3 {
                (i / 8 % 2) as u8
            } else {
                118 + (i % 20) as u8
            };
        }
        w
    }

    #[test]
    fn every_dot_equals_the_scalar_reference_bit_for_bit() {
        struct Case {
            name: &'static str,
            weights: fn(usize, u64) -> Vec<u8>,
            acts: fn(usize, u64) -> Vec<u8>,
            plain: Kern,
            dot: Kern,
            reference: VecDot,
        }
        let q8_0_acts = |n, seed| weight_blocks(Q8_0_BYTES, &[0], n, seed);
        let q8_1_acts = |n, seed| weight_blocks(Q8_1_BYTES, &[0, 2], n, seed);
        let cases = [
            Case {
                name: "q8_0",
                weights: |n, seed| weight_blocks(34, &[0], n, seed),
                acts: q8_0_acts,
                plain: Kern::Rows(rows::<Q8_0>),
                dot: Kern::Rows(rows_sdot::<Q8_0>),
                reference: scalar::vec_dot_q8_0,
            },
            Case {
                name: "q4_0",
                weights: |n, seed| weight_blocks(18, &[0], n, seed),
                acts: q8_0_acts,
                plain: Kern::Rows(rows::<Q4_0>),
                dot: Kern::Rows(rows_sdot::<Q4_0>),
                reference: scalar::vec_dot_q4_0,
            },
            Case {
                name: "q5_0",
                weights: |n, seed| weight_blocks(22, &[0], n, seed),
                acts: q8_0_acts,
                plain: Kern::Rows(rows::<Q5_0>),
                dot: Kern::Rows(rows_sdot::<Q5_0>),
                reference: scalar::vec_dot_q5_0,
            },
            Case {
                name: "iq4_nl",
                weights: |n, seed| weight_blocks(18, &[0], n, seed),
                acts: q8_0_acts,
                plain: Kern::Rows(rows::<Iq4Nl>),
                dot: Kern::Rows(rows_sdot::<Iq4Nl>),
                reference: scalar::vec_dot_iq4_nl,
            },
            Case {
                name: "q4_1",
                weights: |n, seed| weight_blocks(20, &[0, 2], n, seed),
                acts: q8_1_acts,
                plain: Kern::Row(vec_dot_q4_1),
                dot: Kern::Row(vec_dot_q4_1_sdot),
                reference: scalar::vec_dot_q4_1,
            },
            Case {
                name: "q5_1",
                weights: |n, seed| weight_blocks(24, &[0, 2], n, seed),
                acts: q8_1_acts,
                plain: Kern::Row(vec_dot_q5_1),
                dot: Kern::Row(vec_dot_q5_1_sdot),
                reference: scalar::vec_dot_q5_1,
            },
            Case {
                name: "q5_k",
                weights: |n, seed| weight_blocks(176, &[0, 2], n, seed),
                acts: q8_k_blocks,
                plain: Kern::Row(vec_dot_q5_k),
                dot: Kern::Row(vec_dot_q5_k_sdot),
                reference: scalar::vec_dot_q5_k,
            },
            Case {
                name: "iq4_xs",
                weights: |n, seed| weight_blocks(136, &[0], n, seed),
                acts: q8_k_blocks,
                plain: Kern::Row(vec_dot_iq4_xs),
                dot: Kern::Row(vec_dot_iq4_xs_sdot),
                reference: scalar::vec_dot_iq4_xs,
            },
            Case {
                name: "q4_k",
                weights: |n, seed| weight_blocks(144, &[0, 2], n, seed),
                acts: q8_k_blocks,
                plain: Kern::Row(vec_dot_q4_k),
                dot: Kern::Row(vec_dot_q4_k_sdot),
                reference: scalar::vec_dot_q4_k,
            },
            Case {
                name: "q6_k",
                weights: |n, seed| weight_blocks(210, &[208], n, seed),
                acts: q8_k_blocks,
                plain: Kern::Row(vec_dot_q6_k),
                dot: Kern::Row(vec_dot_q6_k_sdot),
                reference: scalar::vec_dot_q6_k,
            },
            Case {
                name: "mxfp4",
                weights: mxfp4_blocks,
                acts: q8_0_acts,
                plain: Kern::Rows(rows::<Mxfp4>),
                dot: Kern::Rows(rows_sdot::<Mxfp4>),
                reference: scalar::vec_dot_mxfp4,
            },
            Case {
                name: "q2_k",
                weights: |n, seed| weight_blocks(84, &[80, 82], n, seed),
                acts: q8_k_blocks,
                plain: Kern::Row(vec_dot_q2_k),
                dot: Kern::Row(vec_dot_q2_k_sdot),
                reference: scalar::vec_dot_q2_k,
            },
            Case {
                name: "q3_k",
                weights: |n, seed| weight_blocks(110, &[108], n, seed),
                acts: q8_k_blocks,
                plain: Kern::Row(vec_dot_q3_k),
                dot: Kern::Row(vec_dot_q3_k_sdot),
                reference: scalar::vec_dot_q3_k,
            },
        ];
        // 3 weight rows against 1, 5 and 9 activation rows: the rows
        // kernels' groups of 4 and their remainders.
        const ROWS: usize = 3;
        for c in cases {
            for n in [1, 2, 7, 33] {
                for m in [1, 5, 9] {
                    let w = (c.weights)(ROWS * n, 3 * n as u64);
                    let a = (c.acts)(m * n, 5 * n as u64);
                    let (wb, ab) = (w.len() / ROWS, a.len() / m);
                    let want: Vec<f32> = (0..m * ROWS)
                        .map(|o| {
                            let (i, r) = (o / ROWS, o % ROWS);
                            // SAFETY: the scalar reference has no requirement.
                            unsafe { (c.reference)(&w[r * wb..][..wb], &a[i * ab..][..ab]) }
                        })
                        .collect();
                    let mut kernels = vec![("plain", c.plain)];
                    if has_neon_dotprod() {
                        kernels.push(("sdot", c.dot));
                    }
                    for (variant, k) in kernels {
                        // SAFETY: whole blocks; NEON is baseline, and the
                        // `SDOT` variants run only where the CPU has it.
                        let got = unsafe { k.run(&w, ROWS, &a, m) };
                        for (o, (g, w)) in got.iter().zip(&want).enumerate() {
                            assert_eq!(
                                g.to_bits(),
                                w.to_bits(),
                                "{} {variant} × {n} blocks, {m} rows, output {o}: {g} vs {w}",
                                c.name
                            );
                        }
                    }
                }
            }
        }
    }

    /// A kernel under test: one row at a time, or many.
    #[derive(Clone, Copy)]
    enum Kern {
        Row(VecDot),
        Rows(RowsDot),
    }

    impl Kern {
        /// `out[i · rows + r]` = weight row `r` · activation row `i`.
        ///
        /// # Safety
        /// Whole blocks; the CPU has what the kernel needs.
        unsafe fn run(self, w: &[u8], rows: usize, a: &[u8], m: usize) -> Vec<f32> {
            // SAFETY: the caller upholds this function's `# Safety` contract (NEON is part of every
            // AArch64 CPU), so every load and store stays inside the slices it names.
            unsafe {
                let (wb, ab) = (w.len() / rows, a.len() / m);
                let mut out = vec![f32::NAN; m * rows];
                match self {
                    Kern::Row(f) => {
                        for (o, y) in out.iter_mut().enumerate() {
                            let (i, r) = (o / rows, o % rows);
                            *y = f(&w[r * wb..][..wb], &a[i * ab..][..ab]);
                        }
                    }
                    Kern::Rows(f) => {
                        let mut refs: Vec<&mut [f32]> = out.chunks_mut(rows).collect();
                        f(w, wb, a, ab, &mut refs, 0);
                    }
                }
                out
            }
        }
    }
}
