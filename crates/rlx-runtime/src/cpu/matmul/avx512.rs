//! AVX-512 kernels: the f32 dot (F + BW + VL on top of AVX2) and integer dot
//! products that also need VNNI.
//!
//! # Safety
//! Every function is `#[target_feature]`-gated and may only run on a CPU that
//! has the features: `kernels` hands them out for `Isa::Avx512` (checked
//! against `Isa::detect()` by `matmul`), the VNNI ones only when
//! `has_avx512_vnni()`. Memory is read through bounds-checked slices or masked
//! loads that stay inside them.

use std::arch::x86_64::*;

use super::avx2::{arr, f16_at, f16_product, hsum_ps as hsum_ps256, load256, nibbles};
use super::scalar::{f32_at, scale_min_k4, Q8_0_BYTES, Q8_K_BYTES};

/// f32 dot: element `i` goes to accumulator `(i / 16) % 4`, lane `i % 16`
/// (FMA; the last partial vector is a zero-filled masked load); accumulators
/// are added `(a0 + a1) + (a2 + a3)`, then lane `l` with lane `l + 8`, then
/// the 8 lanes as a pairwise tree like the AVX2 kernel.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn dot_f32(x: &[f32], w: &[f32]) -> f32 {
    let n = x.len().min(w.len());
    let (x, w) = (&x[..n], &w[..n]);
    let mut acc = [_mm512_setzero_ps(); 4];
    let xs = x.chunks_exact(64);
    let ws = w.chunks_exact(64);
    let (xr, wr) = (xs.remainder(), ws.remainder());
    for (xc, wc) in xs.zip(ws) {
        for (j, a) in acc.iter_mut().enumerate() {
            let xv = _mm512_loadu_ps(xc[16 * j..16 * j + 16].as_ptr());
            let wv = _mm512_loadu_ps(wc[16 * j..16 * j + 16].as_ptr());
            *a = _mm512_fmadd_ps(xv, wv, *a);
        }
    }
    for ((xc, wc), a) in xr.chunks(16).zip(wr.chunks(16)).zip(acc.iter_mut()) {
        // Masked lanes are neither read nor faulted on.
        let mask: __mmask16 = ((1u32 << xc.len()) - 1) as u16;
        let xv = _mm512_maskz_loadu_ps(mask, xc.as_ptr());
        let wv = _mm512_maskz_loadu_ps(mask, wc.as_ptr());
        *a = _mm512_fmadd_ps(xv, wv, *a);
    }
    let v = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
    hsum_ps(v)
}

// ---- AVX-512 VNNI integer dot products ----
//
// `vpdpbusd` (u8 × i8, four products summed into each i32 lane) replaces
// AVX2's `maddubs` + `madd`, and a 512-bit register holds two 32-element
// blocks (or one 64-element chunk of a K-quant super-block).

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn load512(b: &[u8; 64]) -> __m512i {
    _mm512_loadu_si512(b.as_ptr().cast())
}

/// Two 256-bit halves as one 512-bit register.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn join(lo: __m256i, hi: __m256i) -> __m512i {
    _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
}

/// `lo` in lanes 0..8 and `hi` in lanes 8..16.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn join_ps(lo: f32, hi: f32) -> __m512 {
    let lo = _mm512_castps256_ps512(_mm256_set1_ps(lo));
    let hi = _mm256_castps_pd(_mm256_set1_ps(hi));
    _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(lo), hi, 1))
}

/// i8 × i8 dot of 64 bytes into 16 i32 lanes: `|x| · sign(y, x)` through
/// `vpdpbusd`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_i8(x: __m512i, y: __m512i) -> __m512i {
    let neg = _mm512_movepi8_mask(x);
    let sy = _mm512_mask_sub_epi8(y, neg, _mm512_setzero_si512(), y);
    _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(x), sy)
}

/// Same, 32 bytes into 8 lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn dot_i8_256(x: __m256i, y: __m256i) -> __m256i {
    let sy = _mm256_sign_epi8(y, x);
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(x, x), sy)
}

/// Lane `l` plus lane `l + 8`, then [`hsum_ps256`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn hsum_ps(v: __m512) -> f32 {
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    hsum_ps256(_mm256_add_ps(_mm512_castps512_ps256(v), hi))
}

/// Weight formats [`q8_0_pairs`] handles.
const Q8_0: u8 = 0;
const Q4_0: u8 = 1;

/// A weight block's 32 signed codes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn codes<const TYPE: u8>(wb: &[u8]) -> __m256i {
    match TYPE {
        Q8_0 => load256(arr(&wb[2..])),
        _ => _mm256_sub_epi8(nibbles(arr(&wb[2..])), _mm256_set1_epi8(8)),
    }
}

/// 32-element blocks (`WB` bytes, f16 scale first) against Q8_0, two blocks
/// per 512-bit step and a 256-bit step for an odd last block.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q8_0_pairs<const TYPE: u8, const WB: usize>(w: &[u8], a: &[u8]) -> f32 {
    let mut acc = _mm512_setzero_ps();
    let ws = w.chunks_exact(2 * WB);
    let as_ = a.chunks_exact(2 * Q8_0_BYTES);
    let (wr, ar) = (ws.remainder(), as_.remainder());
    for (wp, ap) in ws.zip(as_) {
        let (w1, a1) = (&wp[WB..], &ap[Q8_0_BYTES..]);
        let qx = join(codes::<TYPE>(wp), codes::<TYPE>(w1));
        let qy = join(load256(arr(&ap[2..])), load256(arr(&a1[2..])));
        let d = join_ps(f16_product(wp, 0, ap, 0), f16_product(w1, 0, a1, 0));
        acc = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(dot_i8(qx, qy)), acc);
    }
    let mut sum = hsum_ps(acc);
    if wr.len() >= WB && ar.len() >= Q8_0_BYTES {
        let p = dot_i8_256(codes::<TYPE>(wr), load256(arr(&ar[2..])));
        sum += f16_product(wr, 0, ar, 0) * hsum_ps256(_mm256_cvtepi32_ps(p));
    }
    sum
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn vec_dot_q8_0(w: &[u8], a: &[u8]) -> f32 {
    q8_0_pairs::<Q8_0, 34>(w, a)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn vec_dot_q4_0(w: &[u8], a: &[u8]) -> f32 {
    q8_0_pairs::<Q4_0, 18>(w, a)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn vec_dot_q4_k(w: &[u8], a: &[u8]) -> f32 {
    let m4 = _mm512_set1_epi8(0xF);
    // Low nibbles in the low half (sub-block 2j), high nibbles in the high half.
    let shifts = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    let mut acc = _mm512_setzero_ps();
    let mut mins = 0f32;
    for (wb, ab) in w.chunks_exact(144).zip(a.chunks_exact(Q8_K_BYTES)) {
        let da = f32_at(ab, 0);
        let q8 = &ab[4..260];
        let mut sc = [0i32; 8];
        let mut summ = 0i32;
        for (j, s) in sc.iter_mut().enumerate() {
            let (scale, min) = scale_min_k4(j, &wb[4..16]);
            *s = i32::from(scale);
            let b = |i: usize| i32::from(i16::from_le_bytes([ab[260 + 2 * i], ab[261 + 2 * i]]));
            summ += i32::from(min) * (b(2 * j) + b(2 * j + 1));
        }
        mins += (da * f16_at(wb, 2)) * summ as f32;
        let mut sumi = _mm512_setzero_si512();
        for (j, (q4, q8)) in wb[16..144]
            .chunks_exact(32)
            .zip(q8.chunks_exact(64))
            .enumerate()
        {
            let bits = _mm512_broadcast_i64x4(load256(arr(q4)));
            let q = _mm512_and_si512(_mm512_srlv_epi16(bits, shifts), m4);
            let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, load512(arr(q8)));
            let scales = _mm512_inserti64x4(
                _mm512_set1_epi32(sc[2 * j]),
                _mm256_set1_epi32(sc[2 * j + 1]),
                1,
            );
            sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(dot, scales));
        }
        let d = da * f16_at(wb, 0);
        acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc) - mins
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn vec_dot_q6_k(w: &[u8], a: &[u8]) -> f32 {
    let m4 = _mm512_set1_epi8(0xF);
    let m2 = _mm512_set1_epi8(3);
    let mut acc = _mm256_setzero_ps();
    for (wb, ab) in w.chunks_exact(210).zip(a.chunks_exact(Q8_K_BYTES)) {
        let da = f32_at(ab, 0);
        let q8 = &ab[4..260];
        let sc = &wb[192..208];
        // Codes are stored + 32: take 32 · Σ sc_s · bsum_s off at the end.
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(sc.as_ptr().cast()));
        let bsums = load256(arr(&ab[260..]));
        let offset = _mm256_slli_epi32(_mm256_madd_epi16(bsums, sc16), 5);
        let mut sumi = _mm512_setzero_si512();
        for (j, ((ql, qh), q8)) in wb[0..128]
            .chunks_exact(64)
            .zip(wb[128..192].chunks_exact(32))
            .zip(q8.chunks_exact(128))
            .enumerate()
        {
            // Quarters 0, 1 (low nibbles of ql[0..64]) then 2, 3 (high nibbles),
            // each with two bits of qh on top.
            let l = load512(arr(ql));
            let h = _mm512_broadcast_i64x4(load256(arr(qh)));
            let h01 = _mm512_srlv_epi16(
                h,
                _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1),
            );
            let h23 = _mm512_srlv_epi16(
                h,
                _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1),
            );
            let halves = [
                (_mm512_and_si512(l, m4), h01),
                (_mm512_and_si512(_mm512_srli_epi16(l, 4), m4), h23),
            ];
            for (p, ((low, hb), q8)) in halves.into_iter().zip(q8.chunks_exact(64)).enumerate() {
                let high = _mm512_slli_epi16(_mm512_and_si512(hb, m2), 4);
                let q = _mm512_or_si512(low, high);
                let dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, load512(arr(q8)));
                // Lanes 4k..4k+4 cover 16 elements: sub-block 8j + 4p + k.
                let s = &sc[8 * j + 4 * p..8 * j + 4 * p + 4];
                let scales = _mm512_set_epi32(
                    i32::from(s[3] as i8),
                    i32::from(s[3] as i8),
                    i32::from(s[3] as i8),
                    i32::from(s[3] as i8),
                    i32::from(s[2] as i8),
                    i32::from(s[2] as i8),
                    i32::from(s[2] as i8),
                    i32::from(s[2] as i8),
                    i32::from(s[1] as i8),
                    i32::from(s[1] as i8),
                    i32::from(s[1] as i8),
                    i32::from(s[1] as i8),
                    i32::from(s[0] as i8),
                    i32::from(s[0] as i8),
                    i32::from(s[0] as i8),
                    i32::from(s[0] as i8),
                );
                sumi = _mm512_add_epi32(sumi, _mm512_mullo_epi32(dot, scales));
            }
        }
        let sumi = _mm256_sub_epi32(
            _mm256_add_epi32(
                _mm512_castsi512_si256(sumi),
                _mm512_extracti64x4_epi64(sumi, 1),
            ),
            offset,
        );
        let d = da * f16_at(wb, 208);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps256(acc)
}
