//! AVX-512 kernels (F + BW + VL on top of AVX2).
//!
//! Every function is `#[target_feature]`-gated and may only run on a CPU that
//! has the features (`kernels` hands them out for `Isa::Avx512`).

// AVX-512 intrinsics are stable since Rust 1.89; this module needs that
// toolchain even though the workspace still declares an older MSRV.
#![allow(clippy::incompatible_msrv)]

use std::arch::x86_64::*;

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
    let v8 = _mm256_add_ps(
        _mm512_castps512_ps256(v),
        _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)),
    );
    let mut r = _mm_add_ps(_mm256_extractf128_ps(v8, 1), _mm256_castps256_ps128(v8));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}
