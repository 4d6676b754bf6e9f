//! AVX2 dequantizers, bit-identical to `rlx_gguf::dequantize`.
//!
//! Each one forms the reference's float operations in the reference's order
//! (one multiply for `q · d`; multiply then add for `q · d + m` and
//! `d₁ · q − m₁`; no FMA), so only the element order of the loads differs.
//!
//! # Safety
//! As in `avx2`: every function is a safe `#[target_feature]` function that
//! needs AVX2 + FMA + F16C, and memory goes through bounds-checked slices
//! and `avx2`'s array loads and stores.

use rlx_gguf::GgmlType;
use std::arch::x86_64::*;

use super::avx2::{
    arr, arr_mut, bit_value, bytes_from_bits, f16_at, load128, load256, lookup_nibbles, nibbles,
    srl16, store_ps, table,
};
use super::scalar::{q3_k_scales, scale_min_k4, KVALUES_IQ4NL};

/// `out[i] = q[i] · d` for the 16 signed codes in `q`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn store_i8x16(q: __m128i, d: f32, out: &mut [f32]) {
    let out = &mut out[..16];
    let d = _mm256_set1_ps(d);
    let lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
    let hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)));
    store_ps(arr_mut(out), _mm256_mul_ps(lo, d));
    store_ps(arr_mut(&mut out[8..]), _mm256_mul_ps(hi, d));
}

/// `out[i] = q[i] · d + off` for the 16 unsigned codes in `q`. `d₁·q − m₁` is
/// this with `off = −m₁` (IEEE `a − b` is `a + (−b)` exactly).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn store_u8x16(q: __m128i, d: f32, off: f32, out: &mut [f32]) {
    let out = &mut out[..16];
    let (d, off) = (_mm256_set1_ps(d), _mm256_set1_ps(off));
    let lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q));
    let hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q, 8)));
    store_ps(arr_mut(out), _mm256_add_ps(_mm256_mul_ps(lo, d), off));
    store_ps(
        arr_mut(&mut out[8..]),
        _mm256_add_ps(_mm256_mul_ps(hi, d), off),
    );
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn lo128(v: __m256i) -> __m128i {
    _mm256_castsi256_si128(v)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hi128(v: __m256i) -> __m128i {
    _mm256_extracti128_si256(v, 1)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dequant_f16(src: &[u8], dst: &mut [f32]) {
    let src = &src[..2 * dst.len()];
    let s = src.chunks_exact(16);
    let tail = s.remainder();
    let mut d = dst.chunks_exact_mut(8);
    for (sc, dc) in s.zip(&mut d) {
        store_ps(arr_mut(dc), _mm256_cvtph_ps(load128(arr(sc))));
    }
    for (o, c) in d.into_remainder().iter_mut().zip(tail.chunks_exact(2)) {
        *o = f16_at(c, 0);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dequant_bf16(src: &[u8], dst: &mut [f32]) {
    let src = &src[..2 * dst.len()];
    let s = src.chunks_exact(16);
    let tail = s.remainder();
    let mut d = dst.chunks_exact_mut(8);
    for (sc, dc) in s.zip(&mut d) {
        let v = _mm256_cvtepu16_epi32(load128(arr(sc)));
        // Like `half`, quieten NaNs by setting the top mantissa bit.
        let nan = _mm256_cmpgt_epi32(
            _mm256_and_si256(v, _mm256_set1_epi32(0x7FFF)),
            _mm256_set1_epi32(0x7F80),
        );
        let v = _mm256_or_si256(v, _mm256_and_si256(nan, _mm256_set1_epi32(0x40)));
        store_ps(arr_mut(dc), _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    }
    for (o, c) in d.into_remainder().iter_mut().zip(tail.chunks_exact(2)) {
        *o = half::bf16::from_le_bytes([c[0], c[1]]).to_f32();
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dequant_q8_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src
        .chunks_exact(GgmlType::Q8_0.block_bytes())
        .zip(dst.chunks_exact_mut(32))
    {
        let d = f16_at(b, 0);
        let q = load256(arr(&b[2..]));
        store_i8x16(lo128(q), d, &mut y[..16]);
        store_i8x16(hi128(q), d, &mut y[16..]);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dequant_q4_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src
        .chunks_exact(GgmlType::Q4_0.block_bytes())
        .zip(dst.chunks_exact_mut(32))
    {
        let d = f16_at(b, 0);
        let q = _mm256_sub_epi8(nibbles(arr(&b[2..])), _mm256_set1_epi8(8));
        store_i8x16(lo128(q), d, &mut y[..16]);
        store_i8x16(hi128(q), d, &mut y[16..]);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dequant_q4_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src
        .chunks_exact(GgmlType::Q4_1.block_bytes())
        .zip(dst.chunks_exact_mut(32))
    {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        let q = nibbles(arr(&b[4..]));
        store_u8x16(lo128(q), d, m, &mut y[..16]);
        store_u8x16(hi128(q), d, m, &mut y[16..]);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dequant_q5_0(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src
        .chunks_exact(GgmlType::Q5_0.block_bytes())
        .zip(dst.chunks_exact_mut(32))
    {
        let d = f16_at(b, 0);
        let qh = u32::from_le_bytes(*arr(&b[2..]));
        // A clear fifth bit means q − 16 < 0: set the byte's top nibble.
        let neg = _mm256_andnot_si256(bytes_from_bits(qh), _mm256_set1_epi8(0xF0u8 as i8));
        let q = _mm256_or_si256(nibbles(arr(&b[6..])), neg);
        store_i8x16(lo128(q), d, &mut y[..16]);
        store_i8x16(hi128(q), d, &mut y[16..]);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dequant_q5_1(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src
        .chunks_exact(GgmlType::Q5_1.block_bytes())
        .zip(dst.chunks_exact_mut(32))
    {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        let qh = u32::from_le_bytes(*arr(&b[4..]));
        let high = _mm256_and_si256(bytes_from_bits(qh), _mm256_set1_epi8(0x10));
        let q = _mm256_or_si256(nibbles(arr(&b[8..])), high);
        store_u8x16(lo128(q), d, m, &mut y[..16]);
        store_u8x16(hi128(q), d, m, &mut y[16..]);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dequant_iq4_nl(src: &[u8], dst: &mut [f32]) {
    let values = table(&KVALUES_IQ4NL);
    for (b, y) in src
        .chunks_exact(GgmlType::IQ4_NL.block_bytes())
        .zip(dst.chunks_exact_mut(32))
    {
        let d = f16_at(b, 0);
        let q = lookup_nibbles(arr(&b[2..]), values);
        store_i8x16(lo128(q), d, &mut y[..16]);
        store_i8x16(hi128(q), d, &mut y[16..]);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dequant_iq4_xs(src: &[u8], dst: &mut [f32]) {
    let values = table(&KVALUES_IQ4NL);
    for (b, y) in src
        .chunks_exact(GgmlType::IQ4_XS.block_bytes())
        .zip(dst.chunks_exact_mut(256))
    {
        let d = f16_at(b, 0);
        let scales_h = u32::from(u16::from_le_bytes([b[2], b[3]]));
        for (j, (qs, y)) in b[8..136]
            .chunks_exact(16)
            .zip(y.chunks_exact_mut(32))
            .enumerate()
        {
            let low = u32::from((b[4 + j / 2] >> (4 * (j % 2))) & 0xF);
            let ls = (low | (((scales_h >> (2 * j)) & 3) << 4)) as i32 - 32;
            let dl = d * ls as f32;
            let q = lookup_nibbles(arr(qs), values);
            store_i8x16(lo128(q), dl, &mut y[..16]);
            store_i8x16(hi128(q), dl, &mut y[16..]);
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dequant_q2_k(src: &[u8], dst: &mut [f32]) {
    let m3 = _mm256_set1_epi8(3);
    for (b, y) in src
        .chunks_exact(GgmlType::Q2_K.block_bytes())
        .zip(dst.chunks_exact_mut(256))
    {
        let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
        let sc = &b[0..16];
        for (j, (q2, y)) in b[16..80]
            .chunks_exact(32)
            .zip(y.chunks_exact_mut(128))
            .enumerate()
        {
            let bits = load256(arr(q2));
            for (p, y) in y.chunks_exact_mut(32).enumerate() {
                let q = _mm256_and_si256(srl16(bits, 2 * p as i32), m3);
                let s = 8 * j + 2 * p;
                let dl = |s: usize| d * f32::from(sc[s] & 0xF);
                let ml = |s: usize| dmin * f32::from(sc[s] >> 4);
                store_u8x16(lo128(q), dl(s), -ml(s), &mut y[..16]);
                store_u8x16(hi128(q), dl(s + 1), -ml(s + 1), &mut y[16..]);
            }
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dequant_q3_k(src: &[u8], dst: &mut [f32]) {
    let m3 = _mm256_set1_epi8(3);
    let four = _mm256_set1_epi8(4);
    for (b, y) in src
        .chunks_exact(GgmlType::Q3_K.block_bytes())
        .zip(dst.chunks_exact_mut(256))
    {
        let d = f16_at(b, 108);
        let hbits = load256(arr(&b[0..]));
        let sc = q3_k_scales(&b[96..108]).map(i32::from);
        for (j, (q3, y)) in b[32..96]
            .chunks_exact(32)
            .zip(y.chunks_exact_mut(128))
            .enumerate()
        {
            let bits = load256(arr(q3));
            for (p, y) in y.chunks_exact_mut(32).enumerate() {
                let low = _mm256_and_si256(srl16(bits, 2 * p as i32), m3);
                let sub = _mm256_sub_epi8(four, bit_value(hbits, 4 * j + p, four));
                let q = _mm256_sub_epi8(low, sub);
                let s = 8 * j + 2 * p;
                store_i8x16(lo128(q), d * sc[s] as f32, &mut y[..16]);
                store_i8x16(hi128(q), d * sc[s + 1] as f32, &mut y[16..]);
            }
        }
    }
}

/// Q4_K (`FIVE_BITS = false`) and Q5_K: `d·sc_j · q − dmin·mn_j` per
/// 32-element sub-block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dequant_k4<const FIVE_BITS: bool>(b: &[u8], y: &mut [f32]) {
    let m4 = _mm256_set1_epi8(0xF);
    let sixteen = _mm256_set1_epi8(16);
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (hbits, qs) = if FIVE_BITS {
        (load256(arr(&b[16..])), &b[48..176])
    } else {
        (_mm256_setzero_si256(), &b[16..144])
    };
    for (j, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
        let bits = load256(arr(q));
        let mut halves = [
            _mm256_and_si256(bits, m4),
            _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4),
        ];
        for (h, (q, y)) in halves.iter_mut().zip(y.chunks_exact_mut(32)).enumerate() {
            let sub = 2 * j + h;
            if FIVE_BITS {
                *q = _mm256_or_si256(*q, bit_value(hbits, sub, sixteen));
            }
            let (sc, mn) = scale_min_k4(sub, &b[4..16]);
            let (d1, m1) = (d * f32::from(sc), dmin * f32::from(mn));
            store_u8x16(lo128(*q), d1, -m1, &mut y[..16]);
            store_u8x16(hi128(*q), d1, -m1, &mut y[16..]);
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dequant_q4_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src
        .chunks_exact(GgmlType::Q4_K.block_bytes())
        .zip(dst.chunks_exact_mut(256))
    {
        dequant_k4::<false>(b, y);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dequant_q5_k(src: &[u8], dst: &mut [f32]) {
    for (b, y) in src
        .chunks_exact(GgmlType::Q5_K.block_bytes())
        .zip(dst.chunks_exact_mut(256))
    {
        dequant_k4::<true>(b, y);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn dequant_q6_k(src: &[u8], dst: &mut [f32]) {
    let m4 = _mm256_set1_epi8(0xF);
    let m2 = _mm256_set1_epi8(3);
    for (b, y) in src
        .chunks_exact(GgmlType::Q6_K.block_bytes())
        .zip(dst.chunks_exact_mut(256))
    {
        let d = f16_at(b, 208);
        let sc = &b[192..208];
        for (j, ((ql, qh), y)) in b[0..128]
            .chunks_exact(64)
            .zip(b[128..192].chunks_exact(32))
            .zip(y.chunks_exact_mut(128))
            .enumerate()
        {
            let l0 = load256(arr(ql));
            let l1 = load256(arr(&ql[32..]));
            let h = load256(arr(qh));
            let lows = [
                _mm256_and_si256(l0, m4),
                _mm256_and_si256(l1, m4),
                _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
            ];
            for (p, (low, y)) in lows.into_iter().zip(y.chunks_exact_mut(32)).enumerate() {
                let high = _mm256_slli_epi16(_mm256_and_si256(srl16(h, 2 * p as i32), m2), 4);
                let q = _mm256_sub_epi8(_mm256_or_si256(low, high), _mm256_set1_epi8(32));
                // Reference order: (d · scale) · q.
                let s = 8 * j + 2 * p;
                store_i8x16(lo128(q), d * f32::from(sc[s] as i8), &mut y[..16]);
                store_i8x16(hi128(q), d * f32::from(sc[s + 1] as i8), &mut y[16..]);
            }
        }
    }
}
