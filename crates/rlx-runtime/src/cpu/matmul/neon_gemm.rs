//! The register tiles of the prefill GEMM on ARM (see `gemm`): one for
//! i8mm's matrix instruction, one for the dot product where a CPU has only
//! that (Apple M1, Graviton 2, Ampere Altra).
//!
//! `USMMLA` multiplies a 2×8 matrix of u8 weight codes by the transpose of
//! a 2×8 matrix of i8 activation codes into a 2×2 block of i32 sums: 32
//! products per instruction, twice `SDOT`'s. A panel word is 8 codes of one
//! weight row, so lanes `2p` and `2p + 1` side by side are one register;
//! an activation word likewise, rows `2j` and `2j + 1` one register. A pass
//! covers half a panel (4 lane pairs) against every row pair of the tile
//! and keeps its int sums and f32 sums in registers.
//!
//! Per sub-block and output the integer sum is scaled as the VNNI tile
//! does it, `acc += scale · (d_x · Σ code·x)`, then
//! `acc −= offset · (d_x · Σ x)`, each fused, so an output has the same
//! bits as there.
//!
//! Indexed `SDOT` multiplies 4 signed codes of each of 4 weight lanes by 4
//! activation bytes taken from one lane of a register that holds 4 rows'
//! words: 16 products per instruction, one activation load per 4 rows.
//! Codes must be below 128 (every affine type but Q8_0 and IQ4_NL).
//!
//! Integer sums are exact, and both tiles scale them in the same order, so
//! an output has the same bits whichever tile (or instruction set) made it.
//!
//! # Safety
//! Each tile needs its instructions (i8mm, dotprod); `gemm` calls it only
//! when the CPU has them.

use std::arch::aarch64::*;

use super::gemm::{LANES, PANEL_FACTORS};
use crate::cpu::arm::{sdot_lane, usmmla};

/// Lane pairs per pass of the `USMMLA` tile.
const PAIRS_PER_PASS: usize = LANES / 4;
/// Codes per word: `USMMLA` takes 8 of each row.
const WORD: usize = 8;

/// `out[g·2·PAIRS + i][l]` = lane `l` of panel `g` · activation row `i` of
/// the tile, for `P` (1 or 2) panels and `2·PAIRS` laid rows.
///
/// Each panel holds `n_sb` sub-blocks, each `SBG` groups of 16 lanes × 8
/// code bytes, then 16 f32 scales and 16 f32 offsets; `codes` holds, per
/// group, `2·PAIRS` rows × 8 i8; `ds` holds, per sub-block, `2·PAIRS`
/// activation scales then as many scaled sums.
///
/// # Safety
/// The pointers cover those sizes (`out`: `P·2·PAIRS` rows); the CPU has
/// i8mm.
#[target_feature(enable = "i8mm")]
// Indexing reads as the register tile it is: [lane pair][row pair].
#[allow(clippy::needless_range_loop)]
pub(super) unsafe fn tile<const P: usize, const PAIRS: usize, const SBG: usize>(
    panels: [*const u8; P],
    n_sb: usize,
    codes: *const i8,
    ds: *const f32,
    out: *mut [f32; LANES],
) {
    // SAFETY: the caller upholds this function's contract (the module's `# Safety`): the CPU has
    // the tile's instructions, and the pointers cover the tiles read and written.
    unsafe {
        let rows = 2 * PAIRS;
        let sb_bytes = SBG * LANES * WORD + PANEL_FACTORS;
        for (g, &panel) in panels.iter().enumerate() {
            for half in 0..2 {
                let lane0 = half * 2 * PAIRS_PER_PASS;
                let mut acc = [[vdupq_n_f32(0.0); PAIRS]; PAIRS_PER_PASS];
                for sb in 0..n_sb {
                    let p = panel.add(sb * sb_bytes);
                    let a = codes.add(sb * SBG * rows * WORD);
                    let mut sum = [[vdupq_n_s32(0); PAIRS]; PAIRS_PER_PASS];
                    for q in 0..SBG {
                        let wp = p.add(q * LANES * WORD + lane0 * WORD);
                        let mut w = [vdupq_n_u8(0); PAIRS_PER_PASS];
                        for (pp, w) in w.iter_mut().enumerate() {
                            *w = vld1q_u8(wp.add(pp * 2 * WORD));
                        }
                        for j in 0..PAIRS {
                            let x = vld1q_s8(a.add((q * rows + 2 * j) * WORD));
                            for pp in 0..PAIRS_PER_PASS {
                                sum[pp][j] = usmmla(sum[pp][j], w[pp], x);
                            }
                        }
                    }
                    // A sum register is [A·a, A·b, B·a, B·b] for weight lanes
                    // A, B and activation rows a, b: factors are laid out to match.
                    let f = p.add(SBG * LANES * WORD).cast::<f32>();
                    let d = ds.add(sb * 2 * rows);
                    for pp in 0..PAIRS_PER_PASS {
                        let l = lane0 + 2 * pp;
                        let scale = vld1q_each_twice(f.add(l));
                        let offset = vld1q_each_twice(f.add(LANES + l));
                        for j in 0..PAIRS {
                            let dx = vld1q_dup_pair(d.add(2 * j));
                            let sx = vld1q_dup_pair(d.add(rows + 2 * j));
                            let t = vmulq_f32(vcvtq_f32_s32(sum[pp][j]), dx);
                            acc[pp][j] = vfmaq_f32(acc[pp][j], scale, t);
                            acc[pp][j] = vfmsq_f32(acc[pp][j], offset, sx);
                        }
                    }
                }
                for pp in 0..PAIRS_PER_PASS {
                    let l = lane0 + 2 * pp;
                    for j in 0..PAIRS {
                        let mut v = [0f32; 4];
                        vst1q_f32(v.as_mut_ptr(), acc[pp][j]);
                        let (ra, rb) = (
                            &mut *out.add(g * rows + 2 * j),
                            &mut *out.add(g * rows + 2 * j + 1),
                        );
                        ra[l] = v[0];
                        rb[l] = v[1];
                        ra[l + 1] = v[2];
                        rb[l + 1] = v[3];
                    }
                }
            }
        }
    }
}

/// Activation rows of the `SDOT` tile: one register holds a word of each.
const SDOT_ROWS: usize = 4;
/// Weight lanes per pass of the `SDOT` tile: two registers.
const SDOT_LANES: usize = 8;

/// The `SDOT` version of [`tile`], for 4 laid activation rows: each
/// sub-block holds `SBQ` quads of 16 lanes × 4 code bytes, then the
/// factors; `codes` holds, per quad, 4 rows × 4 i8.
///
/// # Safety
/// As for [`tile`]; the CPU has dotprod and every code is below 128.
#[target_feature(enable = "dotprod")]
// Indexing reads as the register tile it is: [lane vector][activation row].
#[allow(clippy::needless_range_loop)]
pub(super) unsafe fn tile_sdot<const P: usize, const SBQ: usize>(
    panels: [*const u8; P],
    n_sb: usize,
    codes: *const i8,
    ds: *const f32,
    out: *mut [f32; LANES],
) {
    // SAFETY: the caller upholds this function's contract (the module's `# Safety`): the CPU has
    // the tile's instructions, and the pointers cover the tiles read and written.
    unsafe {
        const R: usize = SDOT_ROWS;
        const V: usize = SDOT_LANES / 4;
        let sb_bytes = SBQ * LANES * 4 + PANEL_FACTORS;
        for (g, &panel) in panels.iter().enumerate() {
            for half in 0..LANES / SDOT_LANES {
                let lane0 = half * SDOT_LANES;
                let mut acc = [[vdupq_n_f32(0.0); R]; V];
                for sb in 0..n_sb {
                    let p = panel.add(sb * sb_bytes);
                    let a = codes.add(sb * SBQ * R * 4);
                    let mut sum = [[vdupq_n_s32(0); R]; V];
                    for q in 0..SBQ {
                        let x = vld1q_s8(a.add(q * R * 4));
                        for v in 0..V {
                            let w = vld1q_s8(p.add(q * LANES * 4 + (lane0 + 4 * v) * 4).cast());
                            sum[v][0] = sdot_lane::<0>(sum[v][0], w, x);
                            sum[v][1] = sdot_lane::<1>(sum[v][1], w, x);
                            sum[v][2] = sdot_lane::<2>(sum[v][2], w, x);
                            sum[v][3] = sdot_lane::<3>(sum[v][3], w, x);
                        }
                    }
                    let f = p.add(SBQ * LANES * 4).cast::<f32>();
                    let d = ds.add(sb * 2 * R);
                    for v in 0..V {
                        let scale = vld1q_f32(f.add(lane0 + 4 * v));
                        let offset = vld1q_f32(f.add(LANES + lane0 + 4 * v));
                        for i in 0..R {
                            let t = vmulq_n_f32(vcvtq_f32_s32(sum[v][i]), *d.add(i));
                            acc[v][i] = vfmaq_f32(acc[v][i], scale, t);
                            acc[v][i] = vfmsq_f32(acc[v][i], offset, vdupq_n_f32(*d.add(R + i)));
                        }
                    }
                }
                for v in 0..V {
                    for i in 0..R {
                        let row = &mut *out.add(g * R + i);
                        vst1q_f32(row.as_mut_ptr().add(lane0 + 4 * v), acc[v][i]);
                    }
                }
            }
        }
    }
}

/// `[p[0], p[1], p[0], p[1]]`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn vld1q_dup_pair(p: *const f32) -> float32x4_t {
    // SAFETY: the caller upholds this function's contract (the module's `# Safety`): the CPU has
    // the tile's instructions, and the pointers cover the tiles read and written.
    unsafe {
        let v = vld1_f32(p);
        vcombine_f32(v, v)
    }
}

/// `[p[0], p[0], p[1], p[1]]`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn vld1q_each_twice(p: *const f32) -> float32x4_t {
    // SAFETY: the caller upholds this function's contract (the module's `# Safety`): the CPU has
    // the tile's instructions, and the pointers cover the tiles read and written.
    unsafe {
        let v = vld1_f32(p);
        vcombine_f32(vzip1_f32(v, v), vzip2_f32(v, v))
    }
}
