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

/// `out[g·MT + i][l]` = lane `l` of panel `g` · activation row `i` of the
/// tile, for `P` (1 or 2) panels: with two, each broadcast activation word
/// feeds two `vpdpbusd`, which halves the loads per product.
///
/// Each panel holds `n_sb` sub-blocks, each `SBQ` quads of 64 code bytes then
/// 16 f32 scales and 16 f32 offsets; `codes` holds, per quad, `MT` rows × 4
/// i8; `ds` holds, per sub-block, `MT` activation scales then `MT` scaled
/// sums.
///
/// # Safety
/// The pointers cover those sizes (`out`: `P·MT` rows); the CPU has AVX-512
/// F, BW and VNNI.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
// Indexing reads as the register tile it is: [panel][activation row].
#[allow(clippy::needless_range_loop)]
pub(super) unsafe fn tile<const P: usize, const MT: usize, const SBQ: usize>(
    panels: [*const u8; P],
    n_sb: usize,
    codes: *const i8,
    ds: *const f32,
    out: *mut [f32; LANES],
) {
    // SAFETY: this function's contract (the module's `# Safety`): the CPU has AVX-512 F + BW +
    // VNNI, and the pointers cover the tiles read and written.
    unsafe {
        let sb_bytes = SBQ * 64 + PANEL_FACTORS;
        let mut acc = [[_mm512_setzero_ps(); MT]; P];
        for sb in 0..n_sb {
            let p = panels.map(|p| p.add(sb * sb_bytes));
            let a = codes.add(sb * SBQ * MT * 4);
            let mut sum = [[_mm512_setzero_si512(); MT]; P];
            for q in 0..SBQ {
                // A loop, not `map`: a closure does not inherit the target
                // features, so its load could run out of line.
                let mut w = [_mm512_setzero_si512(); P];
                for (w, p) in w.iter_mut().zip(&p) {
                    *w = _mm512_loadu_si512(p.add(q * 64).cast());
                }
                for i in 0..MT {
                    let x =
                        _mm512_set1_epi32(a.add((q * MT + i) * 4).cast::<i32>().read_unaligned());
                    for g in 0..P {
                        sum[g][i] = _mm512_dpbusd_epi32(sum[g][i], w[g], x);
                    }
                }
            }
            let d = ds.add(sb * 2 * MT);
            for g in 0..P {
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
}
