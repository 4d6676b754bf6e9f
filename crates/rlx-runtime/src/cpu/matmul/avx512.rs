//! AVX-512 kernels: the f32 dot (F + BW + VL on top of AVX2) and integer dot
//! products that also need VNNI.
//!
//! # Safety
//! Every function is `#[target_feature]`-gated and may only run on a CPU that
//! has the features: `kernels` hands them out for `Isa::Avx512` (checked
//! against `Isa::detect()` by `matmul`), the VNNI ones only when
//! `has_avx512_vnni()`. Memory is read through bounds-checked slices or masked
//! loads that stay inside them.

use rlx_gguf::GgmlType;
use std::arch::x86_64::*;

use super::avx2::{
    arr, f16_at, hsum_epi32, hsum_ps as hsum_ps256, load128, load256, prefetch_ahead,
};
use super::formats::{KQuant, Q6K};
use super::scalar::{f32_at, k_block, Q8_K_BYTES};
use crate::cpu::simd::avx512::Bytes32Vl;
use rlx_gguf::blocks::scales_mins_k4;

/// f32 dot ([`super::exact::dot_f32_lanes`] on 16 lanes, the last partial
/// vector a zero-filled masked load, which neither reads nor faults on the
/// masked lanes).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn dot_f32(x: &[f32], w: &[f32]) -> f32 {
    // SAFETY: this function's contract (the module's `# Safety`): the CPU has AVX-512 F + BW + VL.
    unsafe { super::exact::dot_f32_lanes::<__m512, true>(x, w) }
}

super::f32_tile::f32_tile!(
    /// Prefill (`m ≥ 2`) f32 dots on 16 lanes (`f32_tile.rs`), long rows
    /// in spans.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    dot_f32_tile,
    __m512,
    true
);

// ---- AVX-512 VNNI integer dot products ----
//
// `vpdpbusd` (u8 × i8, four products summed into each i32 lane) replaces
// AVX2's `maddubs` + `madd`, and a 512-bit register holds two 32-element
// blocks (or one 64-element chunk of a K-quant super-block).

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn load512(b: &[u8; 64]) -> __m512i {
    // SAFETY: the array holds the 64 bytes the unaligned load reads.
    unsafe { _mm512_loadu_si512(b.as_ptr().cast()) }
}

/// Lane `l` plus lane `l + 8`, then [`hsum_ps256`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) fn hsum_ps(v: __m512) -> f32 {
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    hsum_ps256(_mm256_add_ps(_mm512_castps512_ps256(v), hi))
}

/// Word indices for `vpermw`: word `w` of chunk `c` takes scale
/// `c·per_chunk + w / (32 / per_chunk)`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn scale_index(c: usize, per_chunk: usize) -> __m512i {
    let idx: [i16; 32] = std::array::from_fn(|w| (c * per_chunk + w / (32 / per_chunk)) as i16);
    // SAFETY: the array holds the 64 bytes the unaligned load reads.
    unsafe { _mm512_loadu_si512(idx.as_ptr().cast()) }
}

/// `Σ scale · Σ code·q8` over a K-quant block's units, in i32 lanes: the
/// units of [`KQuant::quad`] two to a vector (a 64-element chunk), `maddubs`
/// pair sums (codes below 64: ≤ 2·63·128, no saturation), and `vpdpwssd`
/// multiplies them by the chunk's scales — word `w` of chunk `c` takes
/// `scales` word `idx[c]`'s — and accumulates.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
fn k_sums<F: KQuant>(wb: &[u8], q8: &[u8], scales: __m512i, idx: &[__m512i; 4]) -> __m512i {
    // SAFETY: this function has the features `Bytes32Vl` needs.
    let high: Bytes32Vl = unsafe { F::high(wb) };
    let mut sumi = _mm512_setzero_si512();
    for (q, q8) in q8.chunks_exact(128).enumerate() {
        // SAFETY: as above.
        let [u0, u1, u2, u3] = unsafe { F::quad::<Bytes32Vl>(wb, high, q) };
        let units = [u0.0, u1.0, u2.0, u3.0];
        for (p, q8) in q8.chunks_exact(64).enumerate() {
            let codes =
                _mm512_inserti64x4(_mm512_castsi256_si512(units[2 * p]), units[2 * p + 1], 1);
            let pairs = _mm512_maddubs_epi16(codes, load512(arr(q8)));
            let s = _mm512_permutexvar_epi16(idx[2 * q + p], scales);
            sumi = _mm512_dpwssd_epi32(sumi, pairs, s);
        }
    }
    sumi
}

/// Q4_K and Q5_K · Q8_K: [`k_sums`] with each unit's 6-bit scale, and the
/// mins' term `Σ mn_j · bsum_j` from the activations' run sums.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) fn vec_dot_k4<F: KQuant>(w: &[u8], a: &[u8]) -> f32 {
    let bytes = F::BYTES;
    let idx: [__m512i; 4] = std::array::from_fn(|c| scale_index(c, 2));
    // Each min twice: it scales two of the 16-element run sums.
    let dup = _mm_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    let mut sum = 0f32;
    for (wb, ab) in w.chunks_exact(bytes).zip(a.chunks_exact(Q8_K_BYTES)) {
        prefetch_ahead(wb, bytes);
        let da = f32_at(ab, 0);
        let (sc, mn) = scales_mins_k4(arr(&wb[4..16]));
        let mins = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(_mm_cvtsi64_si128(mn as i64), dup));
        let bsums = load256(arr(&ab[260..292]));
        let summ = hsum_epi32(_mm256_madd_epi16(bsums, mins));
        let scales = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)));
        let sumi = _mm512_reduce_add_epi32(k_sums::<F>(wb, &ab[4..260], scales, &idx));
        sum += k_block(da, f16_at(wb, 0), sumi, Some((f16_at(wb, 2), summ)));
    }
    sum
}

/// Q6_K · Q8_K: [`k_sums`] of the codes `q + 32` with the 16-element
/// sub-blocks' scales; `32 · Σ scale · bsum` is taken off per super-block.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) fn vec_dot_q6_k(w: &[u8], a: &[u8]) -> f32 {
    let idx: [__m512i; 4] = std::array::from_fn(|c| scale_index(c, 4));
    let mut sum = 0f32;
    for (wb, ab) in w
        .chunks_exact(GgmlType::Q6_K.block_bytes())
        .zip(a.chunks_exact(Q8_K_BYTES))
    {
        prefetch_ahead(wb, GgmlType::Q6_K.block_bytes());
        let da = f32_at(ab, 0);
        let sc16 = _mm256_cvtepi8_epi16(load128(arr(&wb[192..208])));
        let offset = _mm256_slli_epi32(_mm256_madd_epi16(load256(arr(&ab[260..292])), sc16), 5);
        let sumi = k_sums::<Q6K>(wb, &ab[4..260], _mm512_castsi256_si512(sc16), &idx);
        let sumi = _mm256_sub_epi32(
            _mm256_add_epi32(
                _mm512_castsi512_si256(sumi),
                _mm512_extracti64x4_epi64(sumi, 1),
            ),
            offset,
        );
        sum += k_block(da, f16_at(wb, 208), hsum_epi32(sumi), None);
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::super::super::features::Isa;

    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// The prefill layout in scalar code: 16 FMA lanes, then lane `l` plus
    /// lane `l + 8` and the 8 lanes as `exact::tree_sum8`.
    fn prefill_model(x: &[f32], w: &[f32]) -> f32 {
        let mut lanes = [0f32; 16];
        for (e, (&xv, &wv)) in x.iter().zip(w).enumerate() {
            lanes[e % 16] = xv.mul_add(wv, lanes[e % 16]);
        }
        super::super::exact::tree_sum8(std::array::from_fn(|l| lanes[l] + lanes[l + 8]))
    }

    #[test]
    fn dot_f32_tile_matches_its_scalar_model_for_every_tile_shape() {
        if Isa::detect() < Isa::Avx512 {
            return;
        }
        for k in [1, 15, 16, 33, 64, 100, 640, 1100] {
            for (m, n) in [
                (1, 1),
                (2, 3),
                (6, 4),
                (7, 9),
                (13, 5),
                (12, 8),
                (7, 19),
                (2, 16),
            ] {
                let x = values(m * k, 7 + k as u64);
                let w = values(n * k, 9 + m as u64);
                let mut y = vec![vec![f32::NAN; n + 2]; m];
                let mut out: Vec<&mut [f32]> = y.iter_mut().map(|r| &mut r[..]).collect();
                // SAFETY: checked above that the CPU has AVX-512.
                unsafe { super::dot_f32_tile(&x, &w, k, &mut out, 2) };
                for (i, yi) in y.iter().enumerate() {
                    for r in 0..n {
                        let (xi, wr) = (&x[i * k..(i + 1) * k], &w[r * k..(r + 1) * k]);
                        let want = prefill_model(xi, wr);
                        let mut one = [f32::NAN];
                        // SAFETY: as above.
                        unsafe { super::dot_f32_tile(xi, wr, k, &mut [&mut one[..]], 0) };
                        let single = one[0];
                        let got = yi[2 + r];
                        assert_eq!(got.to_bits(), want.to_bits(), "k={k} m={m} n={n}");
                        assert_eq!(single.to_bits(), want.to_bits(), "k={k}");
                    }
                }
            }
        }
    }
}
