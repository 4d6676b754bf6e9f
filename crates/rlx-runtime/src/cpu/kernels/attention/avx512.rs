//! AVX-512 tile kernels.
//!
//! # Safety
//! Every function is `#[target_feature]`-gated and may only run on a CPU
//! with those features: `Tiles::new` hands them out for `Isa::Avx512` after
//! lowering to `Isa::detect()`. The public entry points check the slice
//! lengths once; pointers then stay inside them, and partial vectors use
//! masked loads and stores, which neither read nor fault on masked lanes.

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use half::{bf16, f16};

use super::{Tiles, KEYS};
use crate::cpu::kernels::elementwise::exp_f32;

pub(super) const TILES: Tiles = Tiles {
    scores: scores::<f32>,
    scores_f16: scores::<u16>,
    softmax,
    pv: pv::<f32>,
    pv_f16: pv::<u16>,
    widen_f16,
    widen_bf16,
};

/// K/V elements the tiles read where they lie: f32, or f16 bits widened as
/// they are loaded.
trait Elem: Copy {
    /// 16 elements from `p`.
    unsafe fn load(p: *const Self) -> __m512;
    /// The lanes of `m` from `p`, zeros elsewhere; masked lanes are not read.
    unsafe fn load_masked(m: __mmask16, p: *const Self) -> __m512;
}

impl Elem for f32 {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn load(p: *const f32) -> __m512 {
        _mm512_loadu_ps(p)
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn load_masked(m: __mmask16, p: *const f32) -> __m512 {
        _mm512_maskz_loadu_ps(m, p)
    }
}

/// f16 bits.
impl Elem for u16 {
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn load(p: *const u16) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn load_masked(m: __mmask16, p: *const u16) -> __m512 {
        _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p.cast()))
    }
}

/// Lanes `0 .. n` (n ≤ 16) set.
#[inline]
fn lanes(n: usize) -> __mmask16 {
    ((1u32 << n) - 1) as __mmask16
}

/// Scores in register tiles of `R` rows × `16 / R` keys: each dot keeps its
/// own accumulator across the head dimension, and the 16 accumulators of a
/// tile are reduced together into one vector (see [`reduce16`]). Keys are
/// f32 or f16 bits ([`Elem`]).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn scores<E: Elem>(
    q: &[f32],
    rows: usize,
    hd: usize,
    k: &[E],
    k_stride: usize,
    nk: usize,
    scale: f32,
    s: &mut [f32],
) {
    assert!((1..=KEYS).contains(&nk) && hd >= 1);
    assert!(q.len() >= rows * hd && k.len() >= (nk - 1) * k_stride + hd && s.len() >= rows * KEYS);
    match rows % 4 {
        0 => scores_tiles::<4, 4, E>(q, rows, hd, k, k_stride, nk, scale, s),
        2 => scores_tiles::<2, 8, E>(q, rows, hd, k, k_stride, nk, scale, s),
        _ => scores_tiles::<1, 16, E>(q, rows, hd, k, k_stride, nk, scale, s),
    }
}

/// # Safety
/// As for [`scores`] (whose checks it relies on), with `rows % R == 0` and
/// `R · C == 16`.
#[inline]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn scores_tiles<const R: usize, const C: usize, E: Elem>(
    q: &[f32],
    rows: usize,
    hd: usize,
    k: &[E],
    k_stride: usize,
    nk: usize,
    scale: f32,
    s: &mut [f32],
) {
    let full = hd - hd % 16;
    let tail = lanes(hd % 16);
    let scale = _mm512_set1_ps(scale);
    for j0 in (0..nk).step_by(C) {
        // Keys past the end repeat the last one; their scores land in the
        // padding columns that nothing reads.
        let mut kp = [k.as_ptr(); C];
        for (j, p) in kp.iter_mut().enumerate() {
            *p = k.as_ptr().add((j0 + j).min(nk - 1) * k_stride);
        }
        for r0 in (0..rows).step_by(R) {
            let mut qp = [q.as_ptr(); R];
            for (r, p) in qp.iter_mut().enumerate() {
                *p = q.as_ptr().add((r0 + r) * hd);
            }
            let mut acc = [[_mm512_setzero_ps(); C]; R];
            let mut kv = [_mm512_setzero_ps(); C];
            let mut d = 0;
            while d < full {
                for (v, p) in kv.iter_mut().zip(&kp) {
                    *v = E::load(p.add(d));
                }
                for (a, p) in acc.iter_mut().zip(&qp) {
                    let x = _mm512_loadu_ps(p.add(d));
                    for (a, &v) in a.iter_mut().zip(&kv) {
                        *a = _mm512_fmadd_ps(x, v, *a);
                    }
                }
                d += 16;
            }
            if d < hd {
                for (v, p) in kv.iter_mut().zip(&kp) {
                    *v = E::load_masked(tail, p.add(d));
                }
                for (a, p) in acc.iter_mut().zip(&qp) {
                    let x = _mm512_maskz_loadu_ps(tail, p.add(d));
                    for (a, &v) in a.iter_mut().zip(&kv) {
                        *a = _mm512_fmadd_ps(x, v, *a);
                    }
                }
            }
            let mut flat = [_mm512_setzero_ps(); 16];
            for (r, a) in acc.iter().enumerate() {
                flat[r * C..(r + 1) * C].copy_from_slice(a);
            }
            let mut sums = [0f32; 16];
            _mm512_storeu_ps(sums.as_mut_ptr(), _mm512_mul_ps(reduce16(&flat), scale));
            for r in 0..R {
                s[(r0 + r) * KEYS + j0..][..C].copy_from_slice(&sums[r * C..(r + 1) * C]);
            }
        }
    }
}

/// Lane `i` of the result is the sum of the lanes of `v[i]`: pairs of
/// vectors are interleaved and added (32-bit, then 64-bit, then 128-bit
/// lanes twice), 15 adds for 16 sums.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn reduce16(v: &[__m512; 16]) -> __m512 {
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

/// `[x0 + x1, x2 + x3, y0 + y1, y2 + y3]` in 128-bit lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn add_lane_pairs(x: __m512, y: __m512) -> __m512 {
    _mm512_add_ps(
        _mm512_shuffle_f32x4::<0b10_00_10_00>(x, y),
        _mm512_shuffle_f32x4::<0b11_01_11_01>(x, y),
    )
}

/// `e^x` for 16 lanes, [`exp_f32`]'s method (with fused multiply-adds).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn exp16(x: __m512) -> __m512 {
    let x = _mm512_min_ps(
        _mm512_max_ps(x, _mm512_set1_ps(-87.0)),
        _mm512_set1_ps(88.0),
    );
    let round = _mm512_set1_ps(12_582_912.0);
    let k = _mm512_sub_ps(
        _mm512_fmadd_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E), round),
        round,
    );
    let r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693_145_75), x);
    let r = _mm512_fnmadd_ps(k, _mm512_set1_ps(1.428_606_8e-6), r);
    let mut p = _mm512_set1_ps(1.0 / 5040.0);
    for c in [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let e = _mm512_slli_epi32::<23>(_mm512_add_epi32(
        _mm512_cvtps_epi32(k),
        _mm512_set1_epi32(127),
    ));
    _mm512_mul_ps(p, _mm512_castsi512_ps(e))
}

/// [`super::scalar::softmax`] with the block's two vectors of scores per row.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn softmax(
    s: &mut [f32],
    rows: usize,
    nk: usize,
    masks: &[u32],
    m: &mut [f32],
    l: &mut [f32],
    alpha: &mut [f32],
) {
    const { assert!(KEYS == 32) };
    assert!(nk <= KEYS && s.len() >= rows * KEYS);
    assert!(masks.len() >= rows && m.len() >= rows && l.len() >= rows && alpha.len() >= rows);
    let limit = if nk == KEYS {
        u32::MAX
    } else {
        (1u32 << nk) - 1
    };
    let neg_inf = _mm512_set1_ps(f32::NEG_INFINITY);
    for r in 0..rows {
        let row = s.as_mut_ptr().add(r * KEYS);
        let bits = masks[r] & limit;
        let (lo, hi) = (bits as __mmask16, (bits >> 16) as __mmask16);
        let x0 = _mm512_mask_loadu_ps(neg_inf, lo, row);
        let x1 = _mm512_mask_loadu_ps(neg_inf, hi, row.add(16));
        let m_new = m[r].max(_mm512_reduce_max_ps(_mm512_max_ps(x0, x1)));
        if m_new == f32::NEG_INFINITY {
            alpha[r] = 1.0;
            _mm512_storeu_ps(row, _mm512_setzero_ps());
            _mm512_storeu_ps(row.add(16), _mm512_setzero_ps());
            continue;
        }
        alpha[r] = if m[r] == f32::NEG_INFINITY {
            0.0
        } else {
            exp_f32(m[r] - m_new)
        };
        let mv = _mm512_set1_ps(m_new);
        let p0 = _mm512_maskz_mov_ps(lo, exp16(_mm512_sub_ps(x0, mv)));
        let p1 = _mm512_maskz_mov_ps(hi, exp16(_mm512_sub_ps(x1, mv)));
        _mm512_storeu_ps(row, p0);
        _mm512_storeu_ps(row.add(16), p1);
        l[r] = l[r] * alpha[r] + _mm512_reduce_add_ps(_mm512_add_ps(p0, p1));
        m[r] = m_new;
    }
}

/// `O = alpha·O + P·V` in register tiles of `R` rows × `NV` vectors of
/// columns, walking the block's keys with the tile held in registers; values
/// are f32 or f16 bits ([`Elem`]).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn pv<E: Elem>(
    p: &[f32],
    rows: usize,
    nk: usize,
    v: &[E],
    v_stride: usize,
    hdv: usize,
    alpha: &[f32],
    o: &mut [f32],
) {
    assert!((1..=KEYS).contains(&nk) && hdv >= 1);
    assert!(p.len() >= rows * KEYS && alpha.len() >= rows && o.len() >= rows * hdv);
    assert!(v.len() >= (nk - 1) * v_stride + hdv);
    match rows % 4 {
        0 => pv_rows::<4, 4, E>(p, rows, nk, v, v_stride, hdv, alpha, o),
        2 => pv_rows::<2, 8, E>(p, rows, nk, v, v_stride, hdv, alpha, o),
        _ => pv_rows::<1, 8, E>(p, rows, nk, v, v_stride, hdv, alpha, o),
    }
}

/// # Safety
/// As for [`pv`] (whose checks it relies on), with `rows % R == 0`.
#[inline]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn pv_rows<const R: usize, const NV: usize, E: Elem>(
    p: &[f32],
    rows: usize,
    nk: usize,
    v: &[E],
    v_stride: usize,
    hdv: usize,
    alpha: &[f32],
    o: &mut [f32],
) {
    let mut c = 0;
    // Columns in chunks of `NV` whole vectors, then one vector at a time.
    while c + 16 * NV <= hdv {
        pv_tile::<R, NV, E>(p, rows, nk, v, v_stride, hdv, alpha, o, c, !0);
        c += 16 * NV;
    }
    while c < hdv {
        pv_tile::<R, 1, E>(
            p,
            rows,
            nk,
            v,
            v_stride,
            hdv,
            alpha,
            o,
            c,
            lanes((hdv - c).min(16)),
        );
        c += 16;
    }
}

/// Columns `c .. c + 16·NV` (the last vector limited to `last`) of every
/// row group.
///
/// # Safety
/// As for [`pv_rows`], with those columns inside `hdv`.
#[inline]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn pv_tile<const R: usize, const NV: usize, E: Elem>(
    p: &[f32],
    rows: usize,
    nk: usize,
    v: &[E],
    v_stride: usize,
    hdv: usize,
    alpha: &[f32],
    o: &mut [f32],
    c: usize,
    last: __mmask16,
) {
    let mut mask = [!0 as __mmask16; NV];
    mask[NV - 1] = last;
    let v = v.as_ptr().add(c);
    for r0 in (0..rows).step_by(R) {
        let mut acc = [[_mm512_setzero_ps(); NV]; R];
        for (r, a) in acc.iter_mut().enumerate() {
            let row = o.as_ptr().add((r0 + r) * hdv + c);
            let scale = _mm512_set1_ps(alpha[r0 + r]);
            for (i, a) in a.iter_mut().enumerate() {
                *a = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask[i], row.add(16 * i)), scale);
            }
        }
        let pr = p.as_ptr().add(r0 * KEYS);
        let mut vv = [_mm512_setzero_ps(); NV];
        for j in 0..nk {
            let vr = v.add(j * v_stride);
            for (i, x) in vv.iter_mut().enumerate() {
                *x = E::load_masked(mask[i], vr.add(16 * i));
            }
            for (r, a) in acc.iter_mut().enumerate() {
                let w = _mm512_set1_ps(*pr.add(r * KEYS + j));
                for (a, &x) in a.iter_mut().zip(&vv) {
                    *a = _mm512_fmadd_ps(w, x, *a);
                }
            }
        }
        for (r, a) in acc.iter().enumerate() {
            let row = o.as_mut_ptr().add((r0 + r) * hdv + c);
            for (i, &a) in a.iter().enumerate() {
                _mm512_mask_storeu_ps(row.add(16 * i), mask[i], a);
            }
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn widen_f16(src: &[u16], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i + 16 <= n {
        let h = _mm256_loadu_si256(src.as_ptr().add(i).cast());
        _mm512_storeu_ps(dst.as_mut_ptr().add(i), _mm512_cvtph_ps(h));
        i += 16;
    }
    for (d, &b) in dst[i..n].iter_mut().zip(&src[i..n]) {
        *d = f16::from_bits(b).to_f32();
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn widen_bf16(src: &[u16], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i + 16 <= n {
        let h = _mm256_loadu_si256(src.as_ptr().add(i).cast());
        let w = _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(h));
        _mm512_storeu_ps(dst.as_mut_ptr().add(i), _mm512_castsi512_ps(w));
        i += 16;
    }
    for (d, &b) in dst[i..n].iter_mut().zip(&src[i..n]) {
        *d = bf16::from_bits(b).to_f32();
    }
}
