//! [`Bytes32`] on AVX2 (+ FMA, F16C): one `__m256i`.
//!
//! # Safety
//! Every method is `#[target_feature]`-gated and runs only inlined into an
//! entry point compiled for "avx2,fma,f16c" (the module's `# Safety` in
//! `cpu/simd`); loads and stores go through array references of the size
//! they move.

use std::arch::x86_64::*;

use super::Bytes32;

impl Bytes32 for __m256i {
    type Table = __m128i;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load(b: &[u8; 32]) -> Self {
        // SAFETY: the array holds the 32 bytes the unaligned load reads.
        unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn nibbles(b: &[u8; 16]) -> Self {
        // SAFETY: the array holds the 16 bytes the unaligned load reads.
        let t = unsafe { _mm_loadu_si128(b.as_ptr().cast()) };
        let both = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
        _mm256_and_si256(both, _mm256_set1_epi8(0xF))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn splat(x: u8) -> Self {
        _mm256_set1_epi8(x as i8)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn from_bits(x: u32) -> Self {
        // Byte j takes byte j / 8 of `x`, then is all ones where its bit
        // j % 8 is set.
        let shuf = _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        );
        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x as i32), shuf);
        let all_but_bit = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
        _mm256_cmpeq_epi8(_mm256_or_si256(bytes, all_but_bit), _mm256_set1_epi64x(-1))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn and(a: Self, b: Self) -> Self {
        _mm256_and_si256(a, b)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn or(a: Self, b: Self) -> Self {
        _mm256_or_si256(a, b)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn andnot(a: Self, b: Self) -> Self {
        _mm256_andnot_si256(a, b)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sub(a: Self, b: Self) -> Self {
        _mm256_sub_epi8(a, b)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn shr_mask(v: Self, n: u32, mask: u8) -> Self {
        // A 16-bit shift moves the high byte's low bits into the low byte's
        // top; the mask (at most 8 − n bits) drops them.
        let shifted = _mm256_srl_epi16(v, _mm_cvtsi32_si128(n as i32));
        _mm256_and_si256(shifted, _mm256_set1_epi8((mask & (0xFF >> n)) as i8))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn shl(v: Self, n: u32) -> Self {
        let shifted = _mm256_sll_epi16(v, _mm_cvtsi32_si128(n as i32));
        _mm256_and_si256(shifted, _mm256_set1_epi8((0xFFu8 << n) as i8))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn bit_value(bits: Self, bit: u32, value: Self) -> Self {
        let mask = _mm256_set1_epi8((1u8 << bit) as i8);
        _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(bits, mask), mask), value)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn table(values: &[i8; 16]) -> __m128i {
        // SAFETY: the array holds the 16 bytes the unaligned load reads.
        unsafe { _mm_loadu_si128(values.as_ptr().cast()) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn lookup(t: __m128i, v: Self) -> Self {
        _mm256_shuffle_epi8(_mm256_set_m128i(t, t), v)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn f16(b: &[u8], off: usize) -> f32 {
        let bits = u32::from(u16::from_le_bytes([b[off], b[off + 1]]));
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn store_mul_i8(v: Self, d0: f32, d1: f32, out: &mut [f32; 32]) {
        let halves = [_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)];
        for (h, (q, d)) in halves.into_iter().zip([d0, d1]).enumerate() {
            let d = _mm256_set1_ps(d);
            let lo = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
            let hi = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)));
            // SAFETY: floats 16h .. 16h + 16 of the 32 the array holds.
            unsafe {
                let p = out.as_mut_ptr().add(16 * h);
                _mm256_storeu_ps(p, _mm256_mul_ps(lo, d));
                _mm256_storeu_ps(p.add(8), _mm256_mul_ps(hi, d));
            }
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn store_mul_add_u8(
        v: Self,
        first: (f32, f32),
        second: (f32, f32),
        out: &mut [f32; 32],
    ) {
        let halves = [_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1)];
        for (h, (q, (d, off))) in halves.into_iter().zip([first, second]).enumerate() {
            let (d, off) = (_mm256_set1_ps(d), _mm256_set1_ps(off));
            let lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q));
            let hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q, 8)));
            // SAFETY: floats 16h .. 16h + 16 of the 32 the array holds.
            unsafe {
                let p = out.as_mut_ptr().add(16 * h);
                _mm256_storeu_ps(p, _mm256_add_ps(_mm256_mul_ps(lo, d), off));
                _mm256_storeu_ps(p.add(8), _mm256_add_ps(_mm256_mul_ps(hi, d), off));
            }
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn widen_f16(src: &[u8], dst: &mut [f32]) {
        let src = &src[..2 * dst.len()];
        let s = src.chunks_exact(16);
        let tail = s.remainder();
        let mut d = dst.chunks_exact_mut(8);
        for (sc, dc) in s.zip(&mut d) {
            // SAFETY: 16 bytes in, 8 floats out, as the chunks hold.
            unsafe {
                let h = _mm_loadu_si128(sc.as_ptr().cast());
                _mm256_storeu_ps(dc.as_mut_ptr(), _mm256_cvtph_ps(h));
            }
        }
        for (o, c) in d.into_remainder().iter_mut().zip(tail.chunks_exact(2)) {
            // SAFETY: the features this method runs with.
            *o = unsafe { Self::f16(c, 0) };
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn widen_bf16(src: &[u8], dst: &mut [f32]) {
        let src = &src[..2 * dst.len()];
        let s = src.chunks_exact(16);
        let tail = s.remainder();
        let mut d = dst.chunks_exact_mut(8);
        for (sc, dc) in s.zip(&mut d) {
            // SAFETY: 16 bytes in, 8 floats out, as the chunks hold.
            unsafe {
                let v = _mm256_cvtepu16_epi32(_mm_loadu_si128(sc.as_ptr().cast()));
                let nan = _mm256_cmpgt_epi32(
                    _mm256_and_si256(v, _mm256_set1_epi32(0x7FFF)),
                    _mm256_set1_epi32(0x7F80),
                );
                let v = _mm256_or_si256(v, _mm256_and_si256(nan, _mm256_set1_epi32(0x40)));
                _mm256_storeu_ps(
                    dc.as_mut_ptr(),
                    _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)),
                );
            }
        }
        for (o, c) in d.into_remainder().iter_mut().zip(tail.chunks_exact(2)) {
            *o = half::bf16::from_le_bytes([c[0], c[1]]).to_f32();
        }
    }
}
