//! AVX-512: [`Lanes`] as `__m512` (16 f32), [`Bytes32`] as [`Bytes32Vl`].
//!
//! # Safety
//! Every method is `#[target_feature]`-gated and runs only inlined into an
//! entry point compiled for its features (the module's `# Safety` in
//! `cpu/simd`), with pointers valid for the lanes read or written; partial
//! vectors use masked loads and stores, which neither read nor fault on
//! masked lanes.

use std::arch::x86_64::*;

use super::{Bytes32, Lanes};

/// [`Bytes32`] on AVX-512 (F + BW + VL): AVX2's 256-bit operations, with
/// the mask registers where they save instructions (bits to bytes).
#[derive(Clone, Copy)]
pub(crate) struct Bytes32Vl(pub(crate) __m256i);

/// Methods of [`Bytes32Vl`] that are AVX2's, compiled with AVX-512's
/// features.
macro_rules! as_avx2 {
    ($($name:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)? $body:block)*) => {$(
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
        unsafe fn $name($($arg: $ty),*) $(-> $ret)? {
            // SAFETY: the `Bytes32` contract; AVX-512's features include
            // AVX2's.
            unsafe { $body }
        }
    )*};
}

type Avx2 = __m256i;

impl Bytes32 for Bytes32Vl {
    type Table = __m128i;
    type F32 = __m512;

    as_avx2! {
        load(b: &[u8; 32]) -> Self { Self(Avx2::load(b)) }
        store(v: Self, out: &mut [u8; 32]) { Avx2::store(v.0, out) }
        nibbles(b: &[u8; 16]) -> Self { Self(Avx2::nibbles(b)) }
        splat(x: u8) -> Self { Self(Avx2::splat(x)) }
        and(a: Self, b: Self) -> Self { Self(Avx2::and(a.0, b.0)) }
        or(a: Self, b: Self) -> Self { Self(Avx2::or(a.0, b.0)) }
        sub(a: Self, b: Self) -> Self { Self(Avx2::sub(a.0, b.0)) }
        shr_mask(v: Self, n: u32, mask: u8) -> Self { Self(Avx2::shr_mask(v.0, n, mask)) }
        shl(v: Self, n: u32) -> Self { Self(Avx2::shl(v.0, n)) }
        table(values: &[i8; 16]) -> __m128i { Avx2::table(values) }
        lookup(t: __m128i, v: Self) -> Self { Self(Avx2::lookup(t, v.0)) }
        f16(b: &[u8], off: usize) -> f32 { Avx2::f16(b, off) }
        store_mul_i8(v: Self, d0: f32, d1: f32, out: &mut [f32; 32]) {
            Avx2::store_mul_i8(v.0, d0, d1, out)
        }
        store_mul_add_u8(v: Self, first: (f32, f32), second: (f32, f32), out: &mut [f32; 32]) {
            Avx2::store_mul_add_u8(v.0, first, second, out)
        }
    }

    /// One move from a mask register (`vpmovm2b`) instead of AVX2's
    /// broadcast, shuffle and compare.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn from_bits(x: u32) -> Self {
        Self(_mm256_movm_epi8(x))
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn bit_value(bits: Self, bit: u32, value: Self) -> Self {
        let set = _mm256_test_epi8_mask(bits.0, _mm256_set1_epi8((1u8 << bit) as i8));
        Self(_mm256_maskz_mov_epi8(set, value.0))
    }
}

impl Lanes for __m512 {
    const N: usize = 16;
    type Prefix = __mmask16;
    type Select = __mmask16;

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn zero() -> Self {
        _mm512_setzero_ps()
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn splat(x: f32) -> Self {
        _mm512_set1_ps(x)
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn load(p: *const f32) -> Self {
        // SAFETY: the `Lanes` contract: this runs inside an entry point compiled for AVX-512 (the
        // module's `# Safety`), with pointers valid for the lanes read or written.
        unsafe { _mm512_loadu_ps(p) }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn store(p: *mut f32, v: Self) {
        // SAFETY: the `Lanes` contract: this runs inside an entry point compiled for AVX-512 (the
        // module's `# Safety`), with pointers valid for the lanes read or written.
        unsafe { _mm512_storeu_ps(p, v) }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn load_f16(p: *const u16) -> Self {
        // SAFETY: the `Lanes` contract: this runs inside an entry point compiled for AVX-512 (the
        // module's `# Safety`), with pointers valid for the lanes read or written.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn load_bf16(p: *const u16) -> Self {
        // SAFETY: the `Lanes` contract: this runs inside an entry point compiled for AVX-512 (the
        // module's `# Safety`), with pointers valid for the lanes read or written.
        let v = unsafe { _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast())) };
        // NaNs made quiet (their top mantissa bit set), as `half` widens them.
        let nan = _mm512_cmpgt_epu32_mask(
            _mm512_and_si512(v, _mm512_set1_epi32(0x7FFF)),
            _mm512_set1_epi32(0x7F80),
        );
        let v = _mm512_mask_or_epi32(v, nan, v, _mm512_set1_epi32(0x40));
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(v))
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn prefix(n: usize) -> __mmask16 {
        ((1u32 << n) - 1) as __mmask16
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn load_part(m: __mmask16, p: *const f32) -> Self {
        // SAFETY: the `Lanes` contract: this runs inside an entry point compiled for AVX-512 (the
        // module's `# Safety`), with pointers valid for the lanes read or written.
        unsafe { _mm512_maskz_loadu_ps(m, p) }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn load_part_f16(m: __mmask16, p: *const u16) -> Self {
        // SAFETY: the `Lanes` contract: this runs inside an entry point compiled for AVX-512 (the
        // module's `# Safety`), with pointers valid for the lanes read or written.
        unsafe { _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p.cast())) }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn store_part(m: __mmask16, p: *mut f32, v: Self) {
        // SAFETY: the `Lanes` contract: this runs inside an entry point compiled for AVX-512 (the
        // module's `# Safety`), with pointers valid for the lanes read or written.
        unsafe { _mm512_mask_storeu_ps(p, m, v) }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn select(bits: u32) -> __mmask16 {
        bits as __mmask16
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn blend(m: __mmask16, v: Self, other: Self) -> Self {
        _mm512_mask_blend_ps(m, other, v)
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        _mm512_fmadd_ps(a, b, c)
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn fnma(a: Self, b: Self, c: Self) -> Self {
        _mm512_fnmadd_ps(a, b, c)
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn add(a: Self, b: Self) -> Self {
        _mm512_add_ps(a, b)
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn sub(a: Self, b: Self) -> Self {
        _mm512_sub_ps(a, b)
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn mul(a: Self, b: Self) -> Self {
        _mm512_mul_ps(a, b)
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn max(a: Self, b: Self) -> Self {
        _mm512_max_ps(a, b)
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn min(a: Self, b: Self) -> Self {
        _mm512_min_ps(a, b)
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn pow2(k: Self) -> Self {
        let e = _mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127));
        _mm512_castsi512_ps(_mm512_slli_epi32::<23>(e))
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn hsum(v: Self) -> f32 {
        _mm512_reduce_add_ps(v)
    }

    /// Four [`Lanes::hsum`]s side by side in one register: lane `l` + lane
    /// `l + 8`, then `l + 4`, `l + 2`, `l + 1`, as the single sum adds.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn hsum4(v: [Self; 4]) -> [f32; 4] {
        // [p0..8, q0..8] + [p8..16, q8..16]: lane l + lane l + 8.
        let pq = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(v[0], v[1]),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(v[0], v[1]),
        );
        let rs = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b01_00_01_00>(v[2], v[3]),
            _mm512_shuffle_f32x4::<0b11_10_11_10>(v[2], v[3]),
        );
        // Per 128-bit lane, one output's 4 lanes: h_j = s_j + s_{j + 4}.
        let h = _mm512_add_ps(
            _mm512_shuffle_f32x4::<0b10_00_10_00>(pq, rs),
            _mm512_shuffle_f32x4::<0b11_01_11_01>(pq, rs),
        );
        // (h0 + h2, h1 + h3), then their sum in lane 0 of each 128-bit lane.
        let q = _mm512_add_ps(h, _mm512_permute_ps::<0b11_10_11_10>(h));
        let t = _mm512_add_ps(q, _mm512_movehdup_ps(q));
        let idx = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
        let mut out = [0f32; 4];
        // SAFETY: the array holds the 4 floats the store writes.
        unsafe {
            _mm_storeu_ps(
                out.as_mut_ptr(),
                _mm512_castps512_ps128(_mm512_permutexvar_ps(idx, t)),
            )
        };
        out
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn hmax(v: Self) -> f32 {
        _mm512_reduce_max_ps(v)
    }

    /// Pairs of vectors are interleaved and added (32-bit, then 64-bit,
    /// then 128-bit lanes twice), 15 adds for 16 sums.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn reduce(v: &[Self]) -> Self {
        // SAFETY: the `Lanes` contract: this runs inside an entry point compiled for AVX-512 (the
        // module's `# Safety`), with pointers valid for the lanes read or written.
        unsafe {
            let v: &[Self; 16] = v.try_into().expect("16 vectors");
            // Per 128-bit lane: [x0 + x2, y0 + y2, x1 + x3, y1 + y3].
            let mut a = [_mm512_setzero_ps(); 8];
            for (i, a) in a.iter_mut().enumerate() {
                let (x, y) = (v[2 * i], v[2 * i + 1]);
                *a = _mm512_add_ps(_mm512_unpacklo_ps(x, y), _mm512_unpackhi_ps(x, y));
            }
            // Per 128-bit lane: that lane's sums of v[4i .. 4i + 4].
            let mut b = [_mm512_setzero_ps(); 4];
            for (i, b) in b.iter_mut().enumerate() {
                let (x, y) = (_mm512_castps_pd(a[2 * i]), _mm512_castps_pd(a[2 * i + 1]));
                *b = _mm512_add_ps(
                    _mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                    _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)),
                );
            }
            // 128-bit lanes 0 + 1 and 2 + 3 of two vectors, twice.
            let c0 = add_lane_pairs(b[0], b[1]);
            let c1 = add_lane_pairs(b[2], b[3]);
            add_lane_pairs(c0, c1)
        }
    }
}

/// `[x0 + x1, x2 + x3, y0 + y1, y2 + y3]` in 128-bit lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn add_lane_pairs(x: __m512, y: __m512) -> __m512 {
    _mm512_add_ps(
        _mm512_shuffle_f32x4::<0b10_00_10_00>(x, y),
        _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y),
    )
}
