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
use std::ops::Range;

use super::avx2::{arr, f16_at, hsum_ps as hsum_ps256, load128, load256, prefetch_ahead};
use super::formats::{KQuant, Q6K};
use super::scalar::{f32_at, Q8_K_BYTES};
use rlx_gguf::blocks::scales_mins_k4;

/// f32 dot ([`super::exact::dot_f32_lanes`] on 16 lanes, the last partial
/// vector a zero-filled masked load, which neither reads nor faults on the
/// masked lanes).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn dot_f32(x: &[f32], w: &[f32]) -> f32 {
    // SAFETY: this function's contract (the module's `# Safety`): the CPU has AVX-512 F + BW + VL.
    unsafe { super::exact::dot_f32_lanes::<__m512, true>(x, w) }
}

/// Weight rows per prefill register tile: 4 weight rows × 6 activation rows
/// (`exact::TILE_ACTS`) is 24 zmm accumulators, plus 4 weight vectors and 1
/// activation vector.
const TILE_ROWS: usize = 4;
/// Rows longer than this are taken `SPAN` elements per pass, with
/// `SPAN_TILES` weight tiles sharing each pass.
const LONG_ROW: usize = 1024;
const SPAN: usize = 256;
const SPAN_TILES: usize = 4;

/// Prefill (`m ≥ 2`) f32 dots: `out[i][col + r]` = row `i` of `x` (rows `k`
/// apart, `out.len()` of them) · row `r` of `w` (rows `k` apart). Each dot puts
/// element `e` in lane `e % 16` of its own accumulator (FMA, the last partial
/// vector a zero-filled masked load), then [`hsum_ps`] — one accumulator per
/// output instead of [`dot_f32`]'s four, so a 4 × 6 tile fits the registers
/// and needs ~0.4 loads per FMA. The order depends on neither the tile size
/// nor the neighbours, so the thread split never shows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) fn dot_f32_tile(x: &[f32], w: &[f32], k: usize, out: &mut [&mut [f32]], col: usize) {
    super::exact::act_groups(x, w, k, 16, out, col, |group, xs, n, out| {
        let (x, w) = (group.as_ptr(), w.as_ptr());
        // SAFETY: `group` holds `out.len()` rows `xs` apart and `w` holds
        // `n` rows (`act_groups` checked); this function's caller has
        // AVX-512.
        unsafe { super::exact::by_group_rows!(out.len(), act_group(x, xs, w, n, k, out, col)) }
    })
}

/// One row pair of [`dot_f32_tile`]'s layout, for tests.
#[cfg(test)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) fn dot_f32_prefill(x: &[f32], w: &[f32]) -> f32 {
    let k = x.len().min(w.len());
    // SAFETY: one row of `k` elements each of `x` and `w`, which hold them.
    unsafe { tile::<1, 1>(x.as_ptr(), k, w.as_ptr(), k)[0][0] }
}

/// `M` activation rows at `x` (`xs` apart) against the `n` weight rows at
/// `w`.
///
/// # Safety
/// `x` holds `M` rows and `w` `n` rows of `k` floats; `out` has `M` rows of
/// at least `col + n`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn act_group<const M: usize>(
    x: *const f32,
    xs: usize,
    w: *const f32,
    n: usize,
    k: usize,
    out: &mut [&mut [f32]],
    col: usize,
) {
    // SAFETY: this function's contract (the module's `# Safety`): the CPU has AVX-512 F + BW + VL,
    // and the pointers cover the rows and lengths given.
    unsafe {
        let mut r = 0;
        if k > LONG_ROW {
            // Long rows: `M` rows of `x` no longer stay in L1 next to the weight
            // stream, so take `SPAN` elements at a time for 4 weight tiles.
            while r + SPAN_TILES * TILE_ROWS <= n {
                let mut acc = [[[_mm512_setzero_ps(); TILE_ROWS]; M]; SPAN_TILES];
                for c in (0..k).step_by(SPAN) {
                    for (t, a) in acc.iter_mut().enumerate() {
                        let wt = w.add((r + t * TILE_ROWS) * k);
                        tile_span(x, xs, wt, k, c..(c + SPAN).min(k), a);
                    }
                }
                for a in &acc {
                    for (o, y) in out.iter_mut().zip(reduce(a)) {
                        o[col + r..col + r + TILE_ROWS].copy_from_slice(&y);
                    }
                    r += TILE_ROWS;
                }
            }
        }
        while r + TILE_ROWS <= n {
            let y = tile::<TILE_ROWS, M>(x, xs, w.add(r * k), k);
            for (o, y) in out.iter_mut().zip(y) {
                o[col + r..col + r + TILE_ROWS].copy_from_slice(&y);
            }
            r += TILE_ROWS;
        }
        while r < n {
            let y = tile::<1, M>(x, xs, w.add(r * k), k);
            for (o, [y]) in out.iter_mut().zip(y) {
                o[col + r] = y;
            }
            r += 1;
        }
    }
}

/// `out[i][r]` = activation row `i` · weight row `r`, in the
/// [`dot_f32_tile`] layout.
///
/// # Safety
/// `x` holds `M` rows (`xs` apart) and `w` `R` rows of `k` floats.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn tile<const R: usize, const M: usize>(
    x: *const f32,
    xs: usize,
    w: *const f32,
    k: usize,
) -> [[f32; R]; M] {
    // SAFETY: this function's contract (the module's `# Safety`): the CPU has AVX-512 F + BW + VL,
    // and the pointers cover the rows and lengths given.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); R]; M];
        tile_span(x, xs, w, k, 0..k, &mut acc);
        reduce(&acc)
    }
}

/// Adds elements `span` (16-aligned start; a partial last vector only when
/// it ends at `k`) of each dot into `acc`, in element order.
///
/// # Safety
/// As for [`tile`], and `span.end <= k`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn tile_span<const R: usize, const M: usize>(
    x: *const f32,
    xs: usize,
    w: *const f32,
    k: usize,
    span: Range<usize>,
    acc: &mut [[__m512; R]; M],
) {
    // SAFETY: this function's contract (the module's `# Safety`): the CPU has AVX-512 F + BW + VL,
    // and the pointers cover the rows and lengths given.
    unsafe {
        let mut wv = [_mm512_setzero_ps(); R];
        let mut c = span.start;
        while c + 16 <= span.end {
            for (r, v) in wv.iter_mut().enumerate() {
                *v = _mm512_loadu_ps(w.add(r * k + c));
            }
            for (i, a) in acc.iter_mut().enumerate() {
                let xv = _mm512_loadu_ps(x.add(i * xs + c));
                for (a, &v) in a.iter_mut().zip(&wv) {
                    *a = _mm512_fmadd_ps(xv, v, *a);
                }
            }
            c += 16;
        }
        if c < span.end {
            // Masked lanes are neither read nor faulted on.
            let mask: __mmask16 = ((1u32 << (span.end - c)) - 1) as u16;
            for (r, v) in wv.iter_mut().enumerate() {
                *v = _mm512_maskz_loadu_ps(mask, w.add(r * k + c));
            }
            for (i, a) in acc.iter_mut().enumerate() {
                let xv = _mm512_maskz_loadu_ps(mask, x.add(i * xs + c));
                for (a, &v) in a.iter_mut().zip(&wv) {
                    *a = _mm512_fmadd_ps(xv, v, *a);
                }
            }
        }
    }
}

/// Each accumulator's [`hsum_ps`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn reduce<const R: usize, const M: usize>(acc: &[[__m512; R]; M]) -> [[f32; R]; M] {
    let mut out = [[0f32; R]; M];
    for (o, a) in out.iter_mut().zip(acc) {
        if R == 4 {
            // SAFETY: with R = 4 the row holds the 4 floats the store writes.
            unsafe { _mm_storeu_ps(o.as_mut_ptr(), hsum_ps_x4([a[0], a[1], a[2], a[3]])) };
        } else {
            for (o, &v) in o.iter_mut().zip(a) {
                *o = hsum_ps(v);
            }
        }
    }
    out
}

/// [`hsum_ps`] of four vectors at once, the same adds in the same order
/// (lane `l` + lane `l + 8`, then the 8 lanes as a tree), with the four
/// reductions side by side in one register.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn hsum_ps_x4(v: [__m512; 4]) -> __m128 {
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
    _mm512_castps512_ps128(_mm512_permutexvar_ps(idx, t))
}

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
    // SAFETY: this function has the features `Bytes32` for `__m256i` needs.
    let high: __m256i = unsafe { F::high(wb) };
    let mut sumi = _mm512_setzero_si512();
    for (q, q8) in q8.chunks_exact(128).enumerate() {
        // SAFETY: as above.
        let units: [__m256i; 4] = unsafe { F::quad(wb, high, q) };
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
    let mut acc = _mm512_setzero_ps();
    let mut acc_min = _mm256_setzero_ps();
    for (wb, ab) in w.chunks_exact(bytes).zip(a.chunks_exact(Q8_K_BYTES)) {
        prefetch_ahead(wb, bytes);
        let da = f32_at(ab, 0);
        let (sc, mn) = scales_mins_k4(arr(&wb[4..16]));
        let mins = _mm256_cvtepu8_epi16(_mm_shuffle_epi8(_mm_cvtsi64_si128(mn as i64), dup));
        let bsums = load256(arr(&ab[260..292]));
        let min_sums = _mm256_cvtepi32_ps(_mm256_madd_epi16(bsums, mins));
        acc_min = _mm256_fmadd_ps(_mm256_set1_ps(da * f16_at(wb, 2)), min_sums, acc_min);
        let scales = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)));
        let sumi = k_sums::<F>(wb, &ab[4..260], scales, &idx);
        let d = da * f16_at(wb, 0);
        acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc) - hsum_ps256(acc_min)
}

/// Q6_K · Q8_K: [`k_sums`] of the codes `q + 32` with the 16-element
/// sub-blocks' scales; `32 · Σ scale · bsum` is taken off per super-block.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) fn vec_dot_q6_k(w: &[u8], a: &[u8]) -> f32 {
    let idx: [__m512i; 4] = std::array::from_fn(|c| scale_index(c, 4));
    let mut acc = _mm256_setzero_ps();
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
        let d = da * f16_at(wb, 208);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps256(acc)
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
                        // SAFETY: as above.
                        let single = unsafe { super::dot_f32_prefill(xi, wr) };
                        let got = yi[2 + r];
                        assert_eq!(got.to_bits(), want.to_bits(), "k={k} m={m} n={n}");
                        assert_eq!(single.to_bits(), want.to_bits(), "k={k}");
                    }
                }
            }
        }
    }
}
