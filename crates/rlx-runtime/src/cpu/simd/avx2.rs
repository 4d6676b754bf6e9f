//! AVX2 (+ FMA, F16C): [`Lanes`] as `__m256` (8 f32), [`Bytes32`] as one
//! `__m256i`.
//!
//! # Safety
//! Every method is `#[target_feature]`-gated and runs only inlined into an
//! entry point compiled for "avx2,fma,f16c" (the module's `# Safety` in
//! `cpu/simd`), with pointers valid for the lanes read or written; partial
//! vectors use `maskload`/`maskstore`, which neither read nor fault on
//! masked lanes, and byte loads and stores go through array references of
//! the size they move.

use std::arch::x86_64::*;

use super::{Bytes32, Lanes};

impl Bytes32 for __m256i {
    type Table = __m128i;
    type F32 = __m256;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load(b: &[u8; 32]) -> Self {
        // SAFETY: the array holds the 32 bytes the unaligned load reads.
        unsafe { _mm256_loadu_si256(b.as_ptr().cast()) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn store(v: Self, out: &mut [u8; 32]) {
        // SAFETY: the array holds the 32 bytes the unaligned store writes.
        unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), v) }
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
        // A 16-bit shift: the low byte's top bits would enter the high
        // byte, which the contract rules out.
        _mm256_sll_epi16(v, _mm_cvtsi32_si128(n as i32))
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
}

impl Lanes for __m256 {
    const N: usize = 8;
    /// A `maskload` mask.
    type Prefix = __m256i;
    type Select = __m256i;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn zero() -> Self {
        _mm256_setzero_ps()
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn splat(x: f32) -> Self {
        _mm256_set1_ps(x)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: the `Lanes` contract: this runs inside an entry point compiled for AVX2 (the
        // module's `# Safety`), with pointers valid for the lanes read or written.
        unsafe { _mm256_loadu_ps(p) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn store(p: *mut f32, v: Self) {
        // SAFETY: the `Lanes` contract: this runs inside an entry point compiled for AVX2 (the
        // module's `# Safety`), with pointers valid for the lanes read or written.
        unsafe { _mm256_storeu_ps(p, v) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_f16(p: *const u16) -> Self {
        // SAFETY: the `Lanes` contract: this runs inside an entry point compiled for AVX2 (the
        // module's `# Safety`), with pointers valid for the lanes read or written.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_bf16(p: *const u16) -> Self {
        // SAFETY: the `Lanes` contract: this runs inside an entry point compiled for AVX2 (the
        // module's `# Safety`), with pointers valid for the lanes read or written.
        let v = unsafe { _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast())) };
        // NaNs made quiet (their top mantissa bit set), as `half` widens them.
        let nan = _mm256_cmpgt_epi32(
            _mm256_and_si256(v, _mm256_set1_epi32(0x7FFF)),
            _mm256_set1_epi32(0x7F80),
        );
        let v = _mm256_or_si256(v, _mm256_and_si256(nan, _mm256_set1_epi32(0x40)));
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prefix(n: usize) -> __m256i {
        _mm256_cmpgt_epi32(
            _mm256_set1_epi32(n as i32),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        )
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_part(m: __m256i, p: *const f32) -> Self {
        // SAFETY: the `Lanes` contract: this runs inside an entry point compiled for AVX2 (the
        // module's `# Safety`), with pointers valid for the lanes read or written.
        unsafe { _mm256_maskload_ps(p, m) }
    }

    /// AVX2 has no 16-bit masked load: the set lanes (a prefix) are copied.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_part_f16(m: __m256i, p: *const u16) -> Self {
        // SAFETY: the `Lanes` contract: this runs inside an entry point compiled for AVX2 (the
        // module's `# Safety`), with pointers valid for the lanes read or written.
        unsafe {
            let n = (_mm256_movemask_ps(_mm256_castsi256_ps(m)) as u32).trailing_ones() as usize;
            if n == 8 {
                return Self::load_f16(p);
            }
            let mut bits = [0u16; 8];
            std::ptr::copy_nonoverlapping(p, bits.as_mut_ptr(), n);
            Self::load_f16(bits.as_ptr())
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn store_part(m: __m256i, p: *mut f32, v: Self) {
        // SAFETY: the `Lanes` contract: this runs inside an entry point compiled for AVX2 (the
        // module's `# Safety`), with pointers valid for the lanes read or written.
        unsafe { _mm256_maskstore_ps(p, m, v) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn select(bits: u32) -> __m256i {
        let b = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
        _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(bits as i32), b), b)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn blend(m: __m256i, v: Self, other: Self) -> Self {
        _mm256_blendv_ps(other, v, _mm256_castsi256_ps(m))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        _mm256_fmadd_ps(a, b, c)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn fnma(a: Self, b: Self, c: Self) -> Self {
        _mm256_fnmadd_ps(a, b, c)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn add(a: Self, b: Self) -> Self {
        _mm256_add_ps(a, b)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sub(a: Self, b: Self) -> Self {
        _mm256_sub_ps(a, b)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn mul(a: Self, b: Self) -> Self {
        _mm256_mul_ps(a, b)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn max(a: Self, b: Self) -> Self {
        _mm256_max_ps(a, b)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn min(a: Self, b: Self) -> Self {
        _mm256_min_ps(a, b)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pow2(k: Self) -> Self {
        let e = _mm256_add_epi32(_mm256_cvtps_epi32(k), _mm256_set1_epi32(127));
        _mm256_castsi256_ps(_mm256_slli_epi32::<23>(e))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn hsum(v: Self) -> f32 {
        let r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
        _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn hmax(v: Self) -> f32 {
        let r = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let r = _mm_max_ps(r, _mm_movehl_ps(r, r));
        _mm_cvtss_f32(_mm_max_ss(r, _mm_movehdup_ps(r)))
    }

    /// Horizontal adds of pairs, twice, then the two 128-bit halves.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn reduce(v: &[Self]) -> Self {
        let v: &[Self; 8] = v.try_into().expect("8 vectors");
        let h01 = _mm256_hadd_ps(v[0], v[1]);
        let h23 = _mm256_hadd_ps(v[2], v[3]);
        let h45 = _mm256_hadd_ps(v[4], v[5]);
        let h67 = _mm256_hadd_ps(v[6], v[7]);
        // Per 128-bit half: that half's sums of v[0..4] and of v[4..8].
        let lo = _mm256_hadd_ps(h01, h23);
        let hi = _mm256_hadd_ps(h45, h67);
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(lo, hi),
            _mm256_permute2f128_ps::<0x31>(lo, hi),
        )
    }
}
