//! The x86 register tiles of the prefill GEMM (see `gemm`): AVX-512 VNNI's,
//! and AVX2's with the same arithmetic.
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
//! [`tile`] needs AVX-512 F + BW + VNNI, [`tile_avx2`] AVX2 + FMA + F16C;
//! `gemm` calls each only when the CPU has them (its `shape`).

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

/// [`tile`] with AVX2's dot: `vpmaddubsw` (u8 codes below 128 × i8, pairs
/// that cannot saturate) then `vpmaddwd` by ones sum each row's 4 products
/// into its i32 lane, as `vpdpbusd` does, so every output has the bits it
/// has on VNNI. A panel's 16 rows take two ymm registers; the int sums of
/// one panel stay in registers for a sub-block and the f32 sums in `out`
/// between sub-blocks (AVX2's 16 registers would not hold both).
///
/// # Safety
/// As [`tile`], on a CPU with AVX2, FMA and F16C; every code below 128.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)]
pub(super) unsafe fn tile_avx2<const P: usize, const MT: usize, const SBQ: usize>(
    panels: [*const u8; P],
    n_sb: usize,
    codes: *const i8,
    ds: *const f32,
    out: *mut [f32; LANES],
) {
    // SAFETY: this function's contract: the CPU has AVX2 + FMA + F16C, and
    // the pointers cover the tiles read and written.
    unsafe {
        let sb_bytes = SBQ * 64 + PANEL_FACTORS;
        let ones = _mm256_set1_epi16(1);
        for r in 0..P * MT {
            *out.add(r) = [0.0; LANES];
        }
        for sb in 0..n_sb {
            let a = codes.add(sb * SBQ * MT * 4);
            let d = ds.add(sb * 2 * MT);
            for g in 0..P {
                let p = panels[g].add(sb * sb_bytes);
                let mut sum = [[_mm256_setzero_si256(); 2]; MT];
                for q in 0..SBQ {
                    let w0 = _mm256_loadu_si256(p.add(q * 64).cast());
                    let w1 = _mm256_loadu_si256(p.add(q * 64 + 32).cast());
                    for i in 0..MT {
                        let x = _mm256_set1_epi32(
                            a.add((q * MT + i) * 4).cast::<i32>().read_unaligned(),
                        );
                        let s0 = _mm256_madd_epi16(_mm256_maddubs_epi16(w0, x), ones);
                        let s1 = _mm256_madd_epi16(_mm256_maddubs_epi16(w1, x), ones);
                        sum[i][0] = _mm256_add_epi32(sum[i][0], s0);
                        sum[i][1] = _mm256_add_epi32(sum[i][1], s1);
                    }
                }
                let factors = p.add(SBQ * 64).cast::<f32>();
                for h in 0..2 {
                    let scale = _mm256_loadu_ps(factors.add(8 * h));
                    let offset = _mm256_loadu_ps(factors.add(LANES + 8 * h));
                    for i in 0..MT {
                        let o = out.add(g * MT + i).cast::<f32>().add(8 * h);
                        let t =
                            _mm256_mul_ps(_mm256_cvtepi32_ps(sum[i][h]), _mm256_set1_ps(*d.add(i)));
                        let acc = _mm256_fmadd_ps(scale, t, _mm256_loadu_ps(o));
                        let acc = _mm256_fnmadd_ps(offset, _mm256_set1_ps(*d.add(MT + i)), acc);
                        _mm256_storeu_ps(o, acc);
                    }
                }
            }
        }
    }
}
