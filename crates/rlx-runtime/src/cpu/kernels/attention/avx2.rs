//! AVX2 + FMA: 8 lanes, tiles sized for 16 registers.
//!
//! # Safety
//! Every method is `#[target_feature]`-gated and runs only inside the
//! `tiles!` entry points, which `Tiles::new` hands out for `Isa::Avx2` (and
//! never above what `Isa::detect()` found). Partial vectors use
//! `maskload`/`maskstore`, which neither read nor fault on masked lanes.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::simd::{tiles, Lanes};

tiles!(__m256, "avx2,fma,f16c", scores: (2, 4, 8), pv: (2, 4, 4));

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
        // SAFETY: the `Lanes` contract: this runs inside a `tiles!` entry point for AVX2 (the
        // module's `# Safety`), with pointers valid for the lanes read or written.
        unsafe { _mm256_loadu_ps(p) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn store(p: *mut f32, v: Self) {
        // SAFETY: the `Lanes` contract: this runs inside a `tiles!` entry point for AVX2 (the
        // module's `# Safety`), with pointers valid for the lanes read or written.
        unsafe { _mm256_storeu_ps(p, v) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_f16(p: *const u16) -> Self {
        // SAFETY: the `Lanes` contract: this runs inside a `tiles!` entry point for AVX2 (the
        // module's `# Safety`), with pointers valid for the lanes read or written.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_bf16(p: *const u16) -> Self {
        // SAFETY: the `Lanes` contract: this runs inside a `tiles!` entry point for AVX2 (the
        // module's `# Safety`), with pointers valid for the lanes read or written.
        unsafe {
            let h = _mm_loadu_si128(p.cast());
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
        }
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
        // SAFETY: the `Lanes` contract: this runs inside a `tiles!` entry point for AVX2 (the
        // module's `# Safety`), with pointers valid for the lanes read or written.
        unsafe { _mm256_maskload_ps(p, m) }
    }

    /// AVX2 has no 16-bit masked load: the set lanes (a prefix) are copied.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_part_f16(m: __m256i, p: *const u16) -> Self {
        // SAFETY: the `Lanes` contract: this runs inside a `tiles!` entry point for AVX2 (the
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
        // SAFETY: the `Lanes` contract: this runs inside a `tiles!` entry point for AVX2 (the
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
