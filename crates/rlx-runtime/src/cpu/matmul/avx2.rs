//! AVX2 + FMA + F16C kernels: the f32 dot and the integer dot products (the
//! dequantizers live in `dequant.rs`).
//!
//! The integer kernels follow llama.cpp's x86 ones: `maddubs` (u8 × i8 pairs
//! into i16; unsigned weights directly, signed ones through the sign trick),
//! `madd` with the sub-block scale into i32 lanes; the legacy formats then
//! take one f32 FMA per block into eight lanes, the K-quants one exact
//! horizontal integer sum per block, scaled and added as the reference does
//! (`scalar::k_block`), so they give its bits.
//!
//! # Safety
//! Every function is a safe `#[target_feature(enable = "avx2,fma,f16c")]`
//! function: the compiler makes a caller without those features promise them
//! in an `unsafe` call, and `kernels` hands them out only for `Isa::Avx2` and
//! up, which `matmul` checks against `Isa::detect()`. Memory is read and
//! written through bounds-checked slices and arrays; the only `unsafe` inside
//! are the loads and stores of whole arrays (`load128`, `load256`,
//! `store_ps`, …).

use rlx_gguf::GgmlType;
use std::arch::x86_64::*;

use super::formats::{KQuant, Legacy, Scale, Q2K, Q3K, Q6K};
use crate::cpu::simd::Bytes32;
use rlx_gguf::blocks::{iq4_xs_scale, scales_mins_k4};

use super::scalar::{
    e8m0_half, f32_at, k_block, q3_k_scales, KVALUES_IQ4NL, Q8_0_BYTES, Q8_1_BYTES, Q8_K_BYTES,
};

/// The first `N` elements of `s` as an array (panics if `s` is shorter).
#[inline(always)]
pub(super) fn arr<T, const N: usize>(s: &[T]) -> &[T; N] {
    s[..N].try_into().expect("length checked by the slice")
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn load128(b: &[u8; 16]) -> __m128i {
    // SAFETY: the array holds the 16 bytes the unaligned load reads.
    unsafe { _mm_loadu_si128(b.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn load256(b: &[u8; 32]) -> __m256i {
    // SAFETY: the array holds the 32 bytes the unaligned load reads.
    unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
}

/// The f16 at `b[off..off + 2]` as f32 (exact, like `half`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn f16_at(b: &[u8], off: usize) -> f32 {
    let bits = u32::from(u16::from_le_bytes([b[off], b[off + 1]]));
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// `f16(w[w_off..]) · f16(a[a_off..])`, the per-block scale product.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn f16_product(w: &[u8], w_off: usize, a: &[u8], a_off: usize) -> f32 {
    // Both halves in one 32-bit move: converting a lone u16 lets LLVM insert
    // it into an arbitrary register (often the loop's accumulator), which
    // chains every iteration behind the previous FMA.
    let bits = u32::from_le_bytes([w[w_off], w[w_off + 1], a[a_off], a[a_off + 1]]);
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32));
    _mm_cvtss_f32(_mm_mul_ss(v, _mm_movehdup_ps(v)))
}

/// `((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsum_ps(v: __m256) -> f32 {
    let mut r = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}

/// Pairwise i8 × i8 products summed to i16 (`|x| · sign(y, x)` through `maddubs`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn mul_add_i8(x: __m256i, y: __m256i) -> __m256i {
    _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
}

/// Eight i32 sums of four i8 × i8 products each, as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_i8_ps(x: __m256i, y: __m256i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_madd_epi16(mul_add_i8(x, y), _mm256_set1_epi16(1)))
}

/// Eight i32 sums of four u8 × i8 products each, as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_u8_ps(ux: __m256i, y: __m256i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_madd_epi16(
        _mm256_maddubs_epi16(ux, y),
        _mm256_set1_epi16(1),
    ))
}

/// A K-quant block's 16 half-unit scales (i16 lanes of `v`), each
/// duplicated into an i32 lane: scales 0–3 and 8–11, then 4–7 and 12–15.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn half_unit_scales(v: __m256i) -> [__m256i; 2] {
    [_mm256_unpacklo_epi16(v, v), _mm256_unpackhi_epi16(v, v)]
}

/// Unit `u`'s scales from [`half_unit_scales`]: scale `2u` in every i16
/// lane of the low 128 bits, `2u + 1` in the high ones (one permute where
/// broadcasting two scalars takes four instructions).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn unit_scales(s: &[__m256i; 2], u: usize) -> __m256i {
    let first = (4 * (u / 4) + 2 * (u % 2)) as i32;
    let (a, b) = (first, first + 1);
    let idx = _mm256_setr_epi32(a, a, a, a, b, b, b, b);
    _mm256_permutevar8x32_epi32(s[(u / 2) % 2], idx)
}

/// f32 dot ([`super::exact::dot_f32_lanes`] on 8 lanes, the tail in order).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dot_f32(x: &[f32], w: &[f32]) -> f32 {
    // SAFETY: this function has the features `__m256`'s lanes need.
    unsafe { super::exact::dot_f32_lanes::<__m256, false>(x, w) }
}

// ---- Integer dot products against Q8_0 / Q8_1 activations ----

/// A legacy block format against Q8_0 activations, or Q8_1 ones for a
/// format with a minimum (their `s = d·Σq` carries it): per block the
/// integer dot, scaled by the product of the scales into eight lanes (FMA),
/// then [`hsum_ps`] and the minimums' sum.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn vec_dot_legacy<F: Legacy>(w: &[u8], a: &[u8]) -> f32 {
    let (act, q_at) = if F::MIN {
        (Q8_1_BYTES, 4)
    } else {
        (Q8_0_BYTES, 2)
    };
    // SAFETY: this function has the features `Bytes32` for `__m256i` needs.
    let table = unsafe { <__m256i as Bytes32>::table(F::TABLE) };
    let mut acc = _mm256_setzero_ps();
    let mut mins = 0f32;
    for (wb, ab) in w.chunks_exact(F::BYTES).zip(a.chunks_exact(act)) {
        if F::MIN {
            mins += f16_product(wb, 2, ab, 2);
        }
        let d = _mm256_set1_ps(match F::SCALE {
            Scale::F16 => f16_product(wb, 0, ab, 0),
            Scale::E8m0 => e8m0_half(wb[0]) * f16_at(ab, 0),
        });
        // SAFETY: as above.
        let qx: __m256i = unsafe { F::codes(wb, table) };
        let qy = load256(arr(&ab[q_at..]));
        let p = if F::MIN {
            dot_u8_ps(qx, qy)
        } else {
            dot_i8_ps(qx, qy)
        };
        acc = _mm256_fmadd_ps(d, p, acc);
    }
    if F::MIN {
        hsum_ps(acc) + mins
    } else {
        hsum_ps(acc)
    }
}

// ---- Integer dot products against Q8_K activations ----

/// The Q8_K block's `(d, qs, bsums)`: 256 quants and 16 i16 run sums.
#[inline(always)]
fn q8_k(ab: &[u8]) -> (f32, &[u8], &[u8; 32]) {
    (f32_at(ab, 0), &ab[4..260], arr(&ab[260..]))
}

/// Σ over a K-quant block's units of `scale(u) · Σ code·q8` in 32-bit
/// lanes, each code less `bias` where a format stores it biased and the
/// bias is taken off per unit; `scale(u)` is unit `u`'s scales as i16
/// lanes (its two halves' for the formats with 16-element sub-blocks).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn k_units<F: KQuant>(
    wb: &[u8],
    q8: &[u8],
    bias: Option<__m256i>,
    scale: impl Fn(usize) -> __m256i,
) -> __m256i {
    // SAFETY: this function has the features `Bytes32` for `__m256i` needs.
    let high: __m256i = unsafe { F::high(wb) };
    let mut sumi = _mm256_setzero_si256();
    for (q, q8) in q8.chunks_exact(128).enumerate() {
        // SAFETY: as above.
        let units: [__m256i; 4] = unsafe { F::quad(wb, high, q) };
        for (i, (unit, q8)) in units.into_iter().zip(q8.chunks_exact(32)).enumerate() {
            let q8 = load256(arr(q8));
            let mut p16 = _mm256_maddubs_epi16(unit, q8);
            if let Some(bias) = bias {
                p16 = _mm256_sub_epi16(p16, _mm256_maddubs_epi16(bias, q8));
            }
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(scale(4 * q + i), p16));
        }
    }
    sumi
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn vec_dot_q2_k(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (wb, ab) in w
        .chunks_exact(GgmlType::Q2_K.block_bytes())
        .zip(a.chunks_exact(Q8_K_BYTES))
    {
        let (da, q8, bsums) = q8_k(ab);
        let sc = &wb[0..16];
        // Mins: high nibbles × the 16 run sums.
        let mins = _mm_and_si128(_mm_srli_epi16(load128(arr(sc)), 4), _mm_set1_epi8(0xF));
        let summ = hsum_epi32(_mm256_madd_epi16(
            _mm256_cvtepi8_epi16(mins),
            load256(bsums),
        ));
        let scales = half_unit_scales(_mm256_cvtepu8_epi16(_mm_and_si128(
            load128(arr(sc)),
            _mm_set1_epi8(0xF),
        )));
        let sumi = hsum_epi32(k_units::<Q2K>(wb, q8, None, |u| unit_scales(&scales, u)));
        sum += k_block(da, f16_at(wb, 80), sumi, Some((f16_at(wb, 82), summ)));
    }
    sum
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn vec_dot_q3_k(w: &[u8], a: &[u8]) -> f32 {
    let four = _mm256_set1_epi8(4);
    let mut sum = 0f32;
    for (wb, ab) in w
        .chunks_exact(GgmlType::Q3_K.block_bytes())
        .zip(a.chunks_exact(Q8_K_BYTES))
    {
        let (da, q8, _) = q8_k(ab);
        let sc = q3_k_scales(&wb[96..108]).map(|s| s as u8);
        let scales = half_unit_scales(_mm256_cvtepi8_epi16(load128(&sc)));
        // Codes are stored + 4.
        let sumi = k_units::<Q3K>(wb, q8, Some(four), |u| unit_scales(&scales, u));
        sum += k_block(da, f16_at(wb, 108), hsum_epi32(sumi), None);
    }
    sum
}

/// The sum of the eight i32 lanes of `v` (exact: integers).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// Q4_K and Q5_K: a 6-bit scale and min per unit, the mins' term
/// `Σ mn_j · bsum_j` from the activations' run sums. Scales and mins are
/// unpacked in a few word operations and applied as vectors (the integers
/// the scalar loop formed).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn vec_dot_k4<F: KQuant>(w: &[u8], a: &[u8]) -> f32 {
    let bytes = F::BYTES;
    // Each min twice: it scales two of the 16-element run sums.
    let dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    let mut sum = 0f32;
    for (wb, ab) in w.chunks_exact(bytes).zip(a.chunks_exact(Q8_K_BYTES)) {
        prefetch_ahead(wb, bytes);
        let (da, q8, bsums) = q8_k(ab);
        let (sc, mn) = scales_mins_k4(arr(&wb[4..16]));
        let mn = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(_mm_cvtsi64_si128(mn as i64), dup));
        let summ = hsum_epi32(_mm256_madd_epi16(load256(bsums), mn));
        // Scale u in both i16 halves of i32 lane u.
        let sc = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(sc as i64));
        let sc = _mm256_or_si256(sc, _mm256_slli_epi32(sc, 16));
        let sumi = k_units::<F>(wb, q8, None, |u| {
            _mm256_permutevar8x32_epi32(sc, _mm256_set1_epi32(u as i32))
        });
        sum += k_block(
            da,
            f16_at(wb, 0),
            hsum_epi32(sumi),
            Some((f16_at(wb, 2), summ)),
        );
    }
    sum
}

/// Prefetches the `bytes`-byte block this far ahead of `b`: weight rows
/// stream from DRAM, and one core's demand misses alone reach only part of
/// the bandwidth. Addresses past the end of the weights are harmless hints.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn prefetch_ahead(b: &[u8], bytes: usize) {
    const AHEAD: usize = 8192;
    for line in (0..bytes).step_by(64) {
        _mm_prefetch::<_MM_HINT_T0>(b.as_ptr().wrapping_add(AHEAD + line).cast());
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn vec_dot_q6_k(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (wb, ab) in w
        .chunks_exact(GgmlType::Q6_K.block_bytes())
        .zip(a.chunks_exact(Q8_K_BYTES))
    {
        prefetch_ahead(wb, GgmlType::Q6_K.block_bytes());
        let (da, q8, bsums) = q8_k(ab);
        let sc: &[u8; 16] = arr(&wb[192..]);
        // Codes are stored + 32: take 32 · Σ sc_s · bsum_s off at the end.
        let sc16 = _mm256_cvtepi8_epi16(load128(sc));
        let offset = _mm256_slli_epi32(_mm256_madd_epi16(load256(bsums), sc16), 5);
        let scales = half_unit_scales(sc16);
        let sumi = k_units::<Q6K>(wb, q8, None, |u| unit_scales(&scales, u));
        let sumi = _mm256_sub_epi32(sumi, offset);
        sum += k_block(da, f16_at(wb, 208), hsum_epi32(sumi), None);
    }
    sum
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn vec_dot_iq4_xs(w: &[u8], a: &[u8]) -> f32 {
    // SAFETY: this function has the features the method needs.
    let values = unsafe { <__m256i as Bytes32>::table(&KVALUES_IQ4NL) };
    let mut sum = 0f32;
    for (wb, ab) in w
        .chunks_exact(GgmlType::IQ4_XS.block_bytes())
        .zip(a.chunks_exact(Q8_K_BYTES))
    {
        let (da, q8, _) = q8_k(ab);
        let mut sumi = _mm256_setzero_si256();
        for (j, (qs, q8)) in wb[8..136]
            .chunks_exact(16)
            .zip(q8.chunks_exact(32))
            .enumerate()
        {
            // The sub-block's codes as IQ4_NL's: low nibbles, then high,
            // through the codebook.
            // SAFETY: this function has the features the methods need.
            let qx = unsafe {
                <__m256i as Bytes32>::lookup(values, <__m256i as Bytes32>::nibbles(arr(qs)))
            };
            let p16 = mul_add_i8(qx, load256(arr(q8)));
            let ls = iq4_xs_scale(wb, j) as i16;
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p16, _mm256_set1_epi16(ls)));
        }
        sum += k_block(da, f16_at(wb, 0), hsum_epi32(sumi), None);
    }
    sum
}
