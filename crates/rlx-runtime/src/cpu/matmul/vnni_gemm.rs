//! The AVX-512 VNNI register tile of the prefill GEMM (see `gemm`).
//!
//! One zmm lane per weight row: a panel quad holds 16 rows × 4 consecutive
//! codes, and one `vpdpbusd` against 4 activation bytes broadcast to every
//! lane adds 64 products. `MT` activation rows share each loaded quad, so a
//! tile does `MT` integer dots per weight load and keeps 16 × `MT` f32 sums in
//! registers. Per sub-block and row the integer sum is scaled once:
//! `acc += scale · (d_x · Σ code·x) − offset · (d_x · Σ x)`, in sub-block
//! order, so each output's arithmetic is independent of the tiling.
//!
//! # Safety
//! Needs AVX-512 F + BW + VNNI; `gemm` calls it only when the CPU has them.

use std::arch::x86_64::*;

use super::gemm::{LANES, PANEL_FACTORS};

/// `out[i][l]` = panel lane `l` · activation row `i` of the tile.
///
/// `panel` holds `n_sb` sub-blocks, each `SBQ` quads of 64 code bytes then
/// 16 f32 scales and 16 f32 offsets; `codes` holds, per quad, `MT` rows × 4
/// i8; `ds` holds, per sub-block, `MT` activation scales then `MT` scaled
/// sums.
///
/// # Safety
/// The pointers cover those sizes (`out`: `MT` rows); the CPU has AVX-512 F, BW and VNNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
pub(super) unsafe fn tile<const MT: usize, const SBQ: usize>(
    panel: *const u8,
    n_sb: usize,
    codes: *const i8,
    ds: *const f32,
    out: *mut [f32; LANES],
) {
    let sb_bytes = SBQ * 64 + PANEL_FACTORS;
    let mut acc = [_mm512_setzero_ps(); MT];
    for sb in 0..n_sb {
        let p = panel.add(sb * sb_bytes);
        let a = codes.add(sb * SBQ * MT * 4);
        let mut sum = [_mm512_setzero_si512(); MT];
        for q in 0..SBQ {
            let w = _mm512_loadu_si512(p.add(q * 64).cast());
            for (i, s) in sum.iter_mut().enumerate() {
                let x = _mm512_set1_epi32(a.add((q * MT + i) * 4).cast::<i32>().read_unaligned());
                *s = _mm512_dpbusd_epi32(*s, w, x);
            }
        }
        let scale = _mm512_loadu_ps(p.add(SBQ * 64).cast());
        let offset = _mm512_loadu_ps(p.add(SBQ * 64 + 64).cast());
        let d = ds.add(sb * 2 * MT);
        for (i, (acc, s)) in acc.iter_mut().zip(sum).enumerate() {
            let t = _mm512_mul_ps(_mm512_cvtepi32_ps(s), _mm512_set1_ps(*d.add(i)));
            *acc = _mm512_fmadd_ps(scale, t, *acc);
            *acc = _mm512_fnmadd_ps(offset, _mm512_set1_ps(*d.add(MT + i)), *acc);
        }
    }
    for (i, a) in acc.into_iter().enumerate() {
        _mm512_storeu_ps(out.add(i).cast(), a);
    }
}

/// [`tile`] for two panels (32 weight rows) at once: each broadcast
/// activation word feeds two `vpdpbusd`, which halves the loads per product.
/// `out` gets the first panel's `MT` rows, then the second's.
///
/// # Safety
/// As for [`tile`], for both panels; `out` has room for `2·MT` rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
// Indexing reads as the register tile it is: [panel][activation row].
#[allow(clippy::needless_range_loop)]
pub(super) unsafe fn tile2<const MT: usize, const SBQ: usize>(
    panels: [*const u8; 2],
    n_sb: usize,
    codes: *const i8,
    ds: *const f32,
    out: *mut [f32; LANES],
) {
    let sb_bytes = SBQ * 64 + PANEL_FACTORS;
    let mut acc = [[_mm512_setzero_ps(); MT]; 2];
    for sb in 0..n_sb {
        let p = panels.map(|p| p.add(sb * sb_bytes));
        let a = codes.add(sb * SBQ * MT * 4);
        let mut sum = [[_mm512_setzero_si512(); MT]; 2];
        for q in 0..SBQ {
            let w = p.map(|p| _mm512_loadu_si512(p.add(q * 64).cast()));
            for i in 0..MT {
                let x = _mm512_set1_epi32(a.add((q * MT + i) * 4).cast::<i32>().read_unaligned());
                for g in 0..2 {
                    sum[g][i] = _mm512_dpbusd_epi32(sum[g][i], w[g], x);
                }
            }
        }
        let d = ds.add(sb * 2 * MT);
        for g in 0..2 {
            let scale = _mm512_loadu_ps(p[g].add(SBQ * 64).cast());
            let offset = _mm512_loadu_ps(p[g].add(SBQ * 64 + 64).cast());
            for i in 0..MT {
                let t = _mm512_mul_ps(_mm512_cvtepi32_ps(sum[g][i]), _mm512_set1_ps(*d.add(i)));
                acc[g][i] = _mm512_fmadd_ps(scale, t, acc[g][i]);
                acc[g][i] = _mm512_fnmadd_ps(offset, _mm512_set1_ps(*d.add(MT + i)), acc[g][i]);
            }
        }
    }
    for (g, acc) in acc.into_iter().enumerate() {
        for (i, a) in acc.into_iter().enumerate() {
            _mm512_storeu_ps(out.add(g * MT + i).cast(), a);
        }
    }
}
