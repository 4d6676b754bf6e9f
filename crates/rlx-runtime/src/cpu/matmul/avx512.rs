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

use super::avx2::{arr, f16_at, hsum_ps as hsum_ps256, load256};
use super::scalar::{f32_at, scale_min_k4, Q8_K_BYTES};

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

/// [`dot_f32`] of `M` activation rows against one weight row at once, each
/// output bit-identical to its own [`dot_f32`] call: the weight vector is
/// loaded once for the `M` rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn dot_f32_rows<const M: usize>(xs: [&[f32]; M], w: &[f32]) -> [f32; M] {
    let n = xs.iter().fold(w.len(), |n, x| n.min(x.len()));
    let w = &w[..n];
    let xs = xs.map(|x| &x[..n]);
    let mut acc = [[_mm512_setzero_ps(); 4]; M];
    let full = n / 64 * 64;
    for c in (0..full).step_by(64) {
        for j in 0..4 {
            let wv = _mm512_loadu_ps(w[c + 16 * j..c + 16 * j + 16].as_ptr());
            for (a, x) in acc.iter_mut().zip(&xs) {
                let xv = _mm512_loadu_ps(x[c + 16 * j..c + 16 * j + 16].as_ptr());
                a[j] = _mm512_fmadd_ps(xv, wv, a[j]);
            }
        }
    }
    for (j, c) in (full..n).step_by(16).enumerate() {
        let len = (n - c).min(16);
        // Masked lanes are neither read nor faulted on.
        let mask: __mmask16 = ((1u32 << len) - 1) as u16;
        let wv = _mm512_maskz_loadu_ps(mask, w[c..].as_ptr());
        for (a, x) in acc.iter_mut().zip(&xs) {
            let xv = _mm512_maskz_loadu_ps(mask, x[c..].as_ptr());
            a[j] = _mm512_fmadd_ps(xv, wv, a[j]);
        }
    }
    acc.map(|a| {
        hsum_ps(_mm512_add_ps(
            _mm512_add_ps(a[0], a[1]),
            _mm512_add_ps(a[2], a[3]),
        ))
    })
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

/// Lane `l` plus lane `l + 8`, then [`hsum_ps256`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn hsum_ps(v: __m512) -> f32 {
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    hsum_ps256(_mm256_add_ps(_mm512_castps512_ps256(v), hi))
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

#[cfg(test)]
mod tests {
    use super::super::super::features::Isa;

    #[test]
    fn dot_f32_rows_matches_dot_f32_bit_for_bit() {
        if Isa::detect() < Isa::Avx512 {
            return;
        }
        let mut s = 7u64;
        let mut next = move || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        };
        for n in [1, 15, 16, 33, 64, 100, 640] {
            let w: Vec<f32> = (0..n).map(|_| next()).collect();
            let xs: Vec<Vec<f32>> = (0..4).map(|_| (0..n).map(|_| next()).collect()).collect();
            // SAFETY: checked above that the CPU has AVX-512.
            let got = unsafe { super::dot_f32_rows::<4>(std::array::from_fn(|i| &xs[i][..]), &w) };
            for (x, g) in xs.iter().zip(got) {
                // SAFETY: as above.
                let want = unsafe { super::dot_f32(x, &w) };
                assert_eq!(g.to_bits(), want.to_bits(), "n={n}");
            }
        }
    }
}
