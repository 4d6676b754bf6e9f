//! NEON tile kernels: the AVX2 ones at 4 lanes, with tiles sized for 32
//! registers. NEON has no masked loads, so a partial vector (a head size
//! that is not a multiple of 4) goes through a small zeroed buffer; f16 K/V
//! are widened as they are loaded (`FCVTL`, base Armv8).
//!
//! # Safety
//! NEON is part of every AArch64 CPU. The public entry points check the
//! slice lengths once; pointers then stay inside them, and partial vectors
//! read and write only their `n` lanes.

#![cfg(target_arch = "aarch64")]

use std::arch::aarch64::*;
use std::arch::asm;

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
    /// 4 elements from `p`.
    unsafe fn load(p: *const Self) -> float32x4_t;
    /// `n ≤ 4` elements from `p`, zeros after; nothing past them is read.
    unsafe fn load_part(p: *const Self, n: usize) -> float32x4_t;
}

impl Elem for f32 {
    #[inline]
    unsafe fn load(p: *const f32) -> float32x4_t {
        vld1q_f32(p)
    }

    #[inline]
    unsafe fn load_part(p: *const f32, n: usize) -> float32x4_t {
        if n == 4 {
            return vld1q_f32(p);
        }
        let mut buf = [0f32; 4];
        std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), n);
        vld1q_f32(buf.as_ptr())
    }
}

/// f16 bits.
impl Elem for u16 {
    #[inline]
    unsafe fn load(p: *const u16) -> float32x4_t {
        let h = vld1_u16(p);
        let w: float32x4_t;
        // `vcvt_f32_f16` is newer than the toolchains we support.
        // SAFETY: `FCVTL Vd.4S, Vn.4H` reads and writes only registers.
        asm!(
            "fcvtl {w:v}.4s, {h:v}.4h",
            w = out(vreg) w,
            h = in(vreg) h,
            options(pure, nomem, nostack),
        );
        w
    }

    #[inline]
    unsafe fn load_part(p: *const u16, n: usize) -> float32x4_t {
        if n == 4 {
            return Self::load(p);
        }
        let mut buf = [0u16; 4];
        std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), n);
        Self::load(buf.as_ptr())
    }
}

/// Lanes `0 .. n` of `v` to `p`.
#[inline]
unsafe fn store_part(p: *mut f32, v: float32x4_t, n: usize) {
    if n == 4 {
        return vst1q_f32(p, v);
    }
    let mut buf = [0f32; 4];
    vst1q_f32(buf.as_mut_ptr(), v);
    std::ptr::copy_nonoverlapping(buf.as_ptr(), p, n);
}

/// Lane `i` all ones where bit `i` of `bits` is set.
#[inline]
unsafe fn bit_lanes(bits: u32) -> uint32x4_t {
    const B: [u32; 4] = [1, 2, 4, 8];
    vtstq_u32(vdupq_n_u32(bits), vld1q_u32(B.as_ptr()))
}

/// Scores in register tiles of `R` rows × `8 / R` keys, reduced together
/// into two vectors at the end (see [`reduce8`]). Keys are f32 or f16 bits
/// ([`Elem`]).
#[allow(clippy::too_many_arguments)]
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
    let full = hd - hd % 4;
    let scale = vdupq_n_f32(scale);
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
            let mut acc = [[vdupq_n_f32(0.0); C]; R];
            let mut kv = [vdupq_n_f32(0.0); C];
            let mut d = 0;
            while d < full {
                for (v, p) in kv.iter_mut().zip(&kp) {
                    *v = E::load(p.add(d));
                }
                for (a, p) in acc.iter_mut().zip(&qp) {
                    let x = vld1q_f32(p.add(d));
                    for (a, &v) in a.iter_mut().zip(&kv) {
                        *a = vfmaq_f32(*a, x, v);
                    }
                }
                d += 4;
            }
            if d < hd {
                let n = hd - d;
                for (v, p) in kv.iter_mut().zip(&kp) {
                    *v = E::load_part(p.add(d), n);
                }
                for (a, p) in acc.iter_mut().zip(&qp) {
                    let x = f32::load_part(p.add(d), n);
                    for (a, &v) in a.iter_mut().zip(&kv) {
                        *a = vfmaq_f32(*a, x, v);
                    }
                }
            }
            let mut flat = [vdupq_n_f32(0.0); 8];
            for (r, a) in acc.iter().enumerate() {
                flat[r * C..(r + 1) * C].copy_from_slice(a);
            }
            let mut sums = [0f32; 8];
            let [lo, hi] = reduce8(&flat);
            vst1q_f32(sums.as_mut_ptr(), vmulq_f32(lo, scale));
            vst1q_f32(sums.as_mut_ptr().add(4), vmulq_f32(hi, scale));
            for r in 0..R {
                s[(r0 + r) * KEYS + j0..][..C].copy_from_slice(&sums[r * C..(r + 1) * C]);
            }
        }
    }
}

/// Lane `i` of the first result is the sum of the lanes of `v[i]`, of the
/// second that of `v[4 + i]`: pairwise adds, twice.
#[inline]
unsafe fn reduce8(v: &[float32x4_t; 8]) -> [float32x4_t; 2] {
    let quad = |a: &[float32x4_t]| vpaddq_f32(vpaddq_f32(a[0], a[1]), vpaddq_f32(a[2], a[3]));
    [quad(&v[..4]), quad(&v[4..])]
}

/// `e^x` for 4 lanes, [`exp_f32`]'s method (with fused multiply-adds).
#[inline]
unsafe fn exp4(x: float32x4_t) -> float32x4_t {
    let x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(-87.0)), vdupq_n_f32(88.0));
    let round = vdupq_n_f32(12_582_912.0);
    let k = vsubq_f32(
        vfmaq_f32(round, x, vdupq_n_f32(std::f32::consts::LOG2_E)),
        round,
    );
    let r = vfmsq_f32(x, k, vdupq_n_f32(0.693_145_75));
    let r = vfmsq_f32(r, k, vdupq_n_f32(1.428_606_8e-6));
    let mut p = vdupq_n_f32(1.0 / 5040.0);
    for c in [
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ] {
        p = vfmaq_f32(vdupq_n_f32(c), p, r);
    }
    let e = vshlq_n_s32::<23>(vaddq_s32(vcvtnq_s32_f32(k), vdupq_n_s32(127)));
    vmulq_f32(p, vreinterpretq_f32_s32(e))
}

/// [`super::scalar::softmax`] with the block's eight vectors of scores per
/// row.
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
    let neg_inf = vdupq_n_f32(f32::NEG_INFINITY);
    for r in 0..rows {
        let row = s.as_mut_ptr().add(r * KEYS);
        let bits = masks[r] & limit;
        let mut seen = [vdupq_n_u32(0); 8];
        let mut x = [neg_inf; 8];
        let mut max = neg_inf;
        for i in 0..8 {
            seen[i] = bit_lanes(bits >> (4 * i));
            // Unseen lanes past `nk` hold stale scores: only selected.
            x[i] = vbslq_f32(seen[i], vld1q_f32(row.add(4 * i)), neg_inf);
            max = vmaxq_f32(max, x[i]);
        }
        let m_new = m[r].max(vmaxvq_f32(max));
        if m_new == f32::NEG_INFINITY {
            alpha[r] = 1.0;
            for i in 0..8 {
                vst1q_f32(row.add(4 * i), vdupq_n_f32(0.0));
            }
            continue;
        }
        alpha[r] = if m[r] == f32::NEG_INFINITY {
            0.0
        } else {
            exp_f32(m[r] - m_new)
        };
        let mv = vdupq_n_f32(m_new);
        let mut sum = vdupq_n_f32(0.0);
        for i in 0..8 {
            let e = exp4(vsubq_f32(x[i], mv));
            let p = vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(e), seen[i]));
            vst1q_f32(row.add(4 * i), p);
            sum = vaddq_f32(sum, p);
        }
        l[r] = l[r] * alpha[r] + vaddvq_f32(sum);
        m[r] = m_new;
    }
}

/// `O = alpha·O + P·V` in register tiles of `R` rows × `NV` vectors of
/// columns, walking the block's keys with the tile held in registers; values
/// are f32 or f16 bits ([`Elem`]).
#[allow(clippy::too_many_arguments)]
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
    while c + 4 * NV <= hdv {
        pv_tile::<R, NV, E>(p, rows, nk, v, v_stride, hdv, alpha, o, c, 4);
        c += 4 * NV;
    }
    while c < hdv {
        let n = (hdv - c).min(4);
        pv_tile::<R, 1, E>(p, rows, nk, v, v_stride, hdv, alpha, o, c, n);
        c += 4;
    }
}

/// Columns `c .. c + 4·NV` (the last vector limited to `last` lanes) of
/// every row group.
///
/// # Safety
/// As for [`pv_rows`], with those columns inside `hdv`.
#[inline]
#[allow(clippy::too_many_arguments)]
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
    last: usize,
) {
    let mut width = [4; NV];
    width[NV - 1] = last;
    let v = v.as_ptr().add(c);
    for r0 in (0..rows).step_by(R) {
        let mut acc = [[vdupq_n_f32(0.0); NV]; R];
        for (r, a) in acc.iter_mut().enumerate() {
            let row = o.as_ptr().add((r0 + r) * hdv + c);
            for (i, a) in a.iter_mut().enumerate() {
                *a = vmulq_n_f32(f32::load_part(row.add(4 * i), width[i]), alpha[r0 + r]);
            }
        }
        let pr = p.as_ptr().add(r0 * KEYS);
        let mut vv = [vdupq_n_f32(0.0); NV];
        for j in 0..nk {
            let vr = v.add(j * v_stride);
            for (i, x) in vv.iter_mut().enumerate() {
                *x = E::load_part(vr.add(4 * i), width[i]);
            }
            for (r, a) in acc.iter_mut().enumerate() {
                let w = vdupq_n_f32(*pr.add(r * KEYS + j));
                for (a, &x) in a.iter_mut().zip(&vv) {
                    *a = vfmaq_f32(*a, w, x);
                }
            }
        }
        for (r, a) in acc.iter().enumerate() {
            let row = o.as_mut_ptr().add((r0 + r) * hdv + c);
            for (i, &a) in a.iter().enumerate() {
                store_part(row.add(4 * i), a, width[i]);
            }
        }
    }
}

unsafe fn widen_f16(src: &[u16], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i + 4 <= n {
        vst1q_f32(dst.as_mut_ptr().add(i), u16::load(src.as_ptr().add(i)));
        i += 4;
    }
    for (d, &b) in dst[i..n].iter_mut().zip(&src[i..n]) {
        *d = f16::from_bits(b).to_f32();
    }
}

unsafe fn widen_bf16(src: &[u16], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    let mut i = 0;
    while i + 4 <= n {
        let w = vshll_n_u16::<16>(vld1_u16(src.as_ptr().add(i)));
        vst1q_f32(dst.as_mut_ptr().add(i), vreinterpretq_f32_u32(w));
        i += 4;
    }
    for (d, &b) in dst[i..n].iter_mut().zip(&src[i..n]) {
        *d = bf16::from_bits(b).to_f32();
    }
}
