//! AVX2 + FMA tile kernels: the AVX-512 ones at 8 lanes, with tiles sized
//! for 16 registers.
//!
//! # Safety
//! Every function is `#[target_feature]`-gated and may only run on a CPU
//! with those features: `Tiles::new` hands them out for `Isa::Avx2` (and
//! never above what `Isa::detect()` found). The public entry points check
//! the slice lengths once; pointers then stay inside them, and partial
//! vectors use `maskload`/`maskstore`, which neither read nor fault on
//! masked lanes.

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
    /// 8 elements from `p`.
    unsafe fn load(p: *const Self) -> __m256;
    /// The lanes of `m` (a `maskload` mask) from `p`, zeros elsewhere;
    /// masked lanes are not read.
    unsafe fn load_masked(m: __m256i, p: *const Self) -> __m256;
}

impl Elem for f32 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_masked(m: __m256i, p: *const f32) -> __m256 {
        _mm256_maskload_ps(p, m)
    }
}

/// f16 bits.
impl Elem for u16 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load(p: *const u16) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
    }

    /// AVX2 has no 16-bit masked load: the set lanes (a prefix) are copied.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_masked(m: __m256i, p: *const u16) -> __m256 {
        let n = (_mm256_movemask_ps(_mm256_castsi256_ps(m)) as u32).trailing_ones() as usize;
        if n == 8 {
            return Self::load(p);
        }
        let mut bits = [0u16; 8];
        std::ptr::copy_nonoverlapping(p, bits.as_mut_ptr(), n);
        _mm256_cvtph_ps(_mm_loadu_si128(bits.as_ptr().cast()))
    }
}

/// Lanes `0 .. n` (n ≤ 8) set, as a `maskload` mask.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lanes(n: usize) -> __m256i {
    _mm256_cmpgt_epi32(
        _mm256_set1_epi32(n as i32),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    )
}

/// Lane `i` set where bit `i` of `bits` is.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bit_lanes(bits: u32) -> __m256i {
    let b = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(bits as i32), b), b)
}

/// Scores in register tiles of `R` rows × `8 / R` keys, reduced together
/// into one vector (see [`reduce8`]). Keys are f32 or f16 bits ([`Elem`]).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
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
        0 => scores_tiles::<4, 2, E>(q, rows, hd, k, k_stride, nk, scale, s),
        2 => scores_tiles::<2, 4, E>(q, rows, hd, k, k_stride, nk, scale, s),
        _ => scores_tiles::<1, 8, E>(q, rows, hd, k, k_stride, nk, scale, s),
    }
}

/// # Safety
/// As for [`scores`] (whose checks it relies on), with `rows % R == 0` and
/// `R · C == 8`.
#[inline]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
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
    let full = hd - hd % 8;
    let tail = lanes(hd % 8);
    let scale = _mm256_set1_ps(scale);
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
            let mut acc = [[_mm256_setzero_ps(); C]; R];
            let mut kv = [_mm256_setzero_ps(); C];
            let mut d = 0;
            while d < full {
                for (v, p) in kv.iter_mut().zip(&kp) {
                    *v = E::load(p.add(d));
                }
                for (a, p) in acc.iter_mut().zip(&qp) {
                    let x = _mm256_loadu_ps(p.add(d));
                    for (a, &v) in a.iter_mut().zip(&kv) {
                        *a = _mm256_fmadd_ps(x, v, *a);
                    }
                }
                d += 8;
            }
            if d < hd {
                for (v, p) in kv.iter_mut().zip(&kp) {
                    *v = E::load_masked(tail, p.add(d));
                }
                for (a, p) in acc.iter_mut().zip(&qp) {
                    let x = _mm256_maskload_ps(p.add(d), tail);
                    for (a, &v) in a.iter_mut().zip(&kv) {
                        *a = _mm256_fmadd_ps(x, v, *a);
                    }
                }
            }
            let mut flat = [_mm256_setzero_ps(); 8];
            for (r, a) in acc.iter().enumerate() {
                flat[r * C..(r + 1) * C].copy_from_slice(a);
            }
            let mut sums = [0f32; 8];
            _mm256_storeu_ps(sums.as_mut_ptr(), _mm256_mul_ps(reduce8(&flat), scale));
            for r in 0..R {
                s[(r0 + r) * KEYS + j0..][..C].copy_from_slice(&sums[r * C..(r + 1) * C]);
            }
        }
    }
}

/// Lane `i` of the result is the sum of the lanes of `v[i]`: horizontal adds
/// of pairs, twice, then the two 128-bit halves.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn reduce8(v: &[__m256; 8]) -> __m256 {
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

/// `e^x` for 8 lanes, [`exp_f32`]'s method (with fused multiply-adds).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn exp8(x: __m256) -> __m256 {
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(-87.0)),
        _mm256_set1_ps(88.0),
    );
    let round = _mm256_set1_ps(12_582_912.0);
    let k = _mm256_sub_ps(
        _mm256_fmadd_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E), round),
        round,
    );
    let r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693_145_75), x);
    let r = _mm256_fnmadd_ps(k, _mm256_set1_ps(1.428_606_8e-6), r);
    let mut p = _mm256_set1_ps(1.0 / 5040.0);
    for c in [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(k),
        _mm256_set1_epi32(127),
    ));
    _mm256_mul_ps(p, _mm256_castsi256_ps(e))
}

/// Horizontal max and sum of 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hmax(v: __m256) -> f32 {
    let r = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let r = _mm_max_ps(r, _mm_movehl_ps(r, r));
    _mm_cvtss_f32(_mm_max_ss(r, _mm_movehdup_ps(r)))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum(v: __m256) -> f32 {
    let r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)))
}

/// [`super::scalar::softmax`] with the block's four vectors of scores per row.
#[target_feature(enable = "avx2,fma,f16c")]
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
    let neg_inf = _mm256_set1_ps(f32::NEG_INFINITY);
    for r in 0..rows {
        let row = s.as_mut_ptr().add(r * KEYS);
        let bits = masks[r] & limit;
        let mut seen = [_mm256_setzero_si256(); 4];
        let mut x = [neg_inf; 4];
        let mut max = neg_inf;
        for i in 0..4 {
            seen[i] = bit_lanes(bits >> (8 * i));
            let loaded = _mm256_maskload_ps(row.add(8 * i), seen[i]);
            x[i] = _mm256_blendv_ps(neg_inf, loaded, _mm256_castsi256_ps(seen[i]));
            max = _mm256_max_ps(max, x[i]);
        }
        let m_new = m[r].max(hmax(max));
        if m_new == f32::NEG_INFINITY {
            alpha[r] = 1.0;
            for i in 0..4 {
                _mm256_storeu_ps(row.add(8 * i), _mm256_setzero_ps());
            }
            continue;
        }
        alpha[r] = if m[r] == f32::NEG_INFINITY {
            0.0
        } else {
            exp_f32(m[r] - m_new)
        };
        let mv = _mm256_set1_ps(m_new);
        let mut sum = _mm256_setzero_ps();
        for i in 0..4 {
            let e = exp8(_mm256_sub_ps(x[i], mv));
            let p = _mm256_and_ps(e, _mm256_castsi256_ps(seen[i]));
            _mm256_storeu_ps(row.add(8 * i), p);
            sum = _mm256_add_ps(sum, p);
        }
        l[r] = l[r] * alpha[r] + hsum(sum);
        m[r] = m_new;
    }
}

/// `O = alpha·O + P·V` in register tiles of `R` rows × `NV` vectors of
/// columns, walking the block's keys with the tile held in registers; values
/// are f32 or f16 bits ([`Elem`]).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
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
        0 => pv_rows::<4, 2, E>(p, rows, nk, v, v_stride, hdv, alpha, o),
        2 => pv_rows::<2, 4, E>(p, rows, nk, v, v_stride, hdv, alpha, o),
        _ => pv_rows::<1, 4, E>(p, rows, nk, v, v_stride, hdv, alpha, o),
    }
}

/// # Safety
/// As for [`pv`] (whose checks it relies on), with `rows % R == 0`.
#[inline]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
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
    while c + 8 * NV <= hdv {
        pv_tile::<R, NV, E>(p, rows, nk, v, v_stride, hdv, alpha, o, c, lanes(8));
        c += 8 * NV;
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
            lanes((hdv - c).min(8)),
        );
        c += 8;
    }
}

/// Columns `c .. c + 8·NV` (the last vector limited to `last`) of every row
/// group.
///
/// # Safety
/// As for [`pv_rows`], with those columns inside `hdv`.
#[inline]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
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
    last: __m256i,
) {
    let mut mask = [lanes(8); NV];
    mask[NV - 1] = last;
    let v = v.as_ptr().add(c);
    for r0 in (0..rows).step_by(R) {
        let mut acc = [[_mm256_setzero_ps(); NV]; R];
        for (r, a) in acc.iter_mut().enumerate() {
            let row = o.as_ptr().add((r0 + r) * hdv + c);
            let scale = _mm256_set1_ps(alpha[r0 + r]);
            for (i, a) in a.iter_mut().enumerate() {
                *a = _mm256_mul_ps(_mm256_maskload_ps(row.add(8 * i), mask[i]), scale);
            }
        }
        let pr = p.as_ptr().add(r0 * KEYS);
        let mut vv = [_mm256_setzero_ps(); NV];
        for j in 0..nk {
            let vr = v.add(j * v_stride);
            for (i, x) in vv.iter_mut().enumerate() {
                *x = E::load_masked(mask[i], vr.add(8 * i));
            }
            for (r, a) in acc.iter_mut().enumerate() {
                let w = _mm256_broadcast_ss(&*pr.add(r * KEYS + j));
                for (a, &x) in a.iter_mut().zip(&vv) {
                    *a = _mm256_fmadd_ps(w, x, *a);
                }
            }
        }
        for (r, a) in acc.iter().enumerate() {
            let row = o.as_mut_ptr().add((r0 + r) * hdv + c);
            for (i, &a) in a.iter().enumerate() {
                _mm256_maskstore_ps(row.add(8 * i), mask[i], a);
            }
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn widen_f16(src: &[u16], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i + 8 <= n {
        let h = _mm_loadu_si128(src.as_ptr().add(i).cast());
        _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        i += 8;
    }
    for (d, &b) in dst[i..n].iter_mut().zip(&src[i..n]) {
        *d = f16::from_bits(b).to_f32();
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn widen_bf16(src: &[u16], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i + 8 <= n {
        let h = _mm_loadu_si128(src.as_ptr().add(i).cast());
        let w = _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h));
        _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_castsi256_ps(w));
        i += 8;
    }
    for (d, &b) in dst[i..n].iter_mut().zip(&src[i..n]) {
        *d = bf16::from_bits(b).to_f32();
    }
}
