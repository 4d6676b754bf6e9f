//! AVX-512 VNNI kernels for a batch of activation rows (a decode step of
//! many sequences) against the 32-element block formats (Q4_0, Q5_0, Q8_0),
//! with the weights read where they lie.
//!
//! The activations are transposed once per matmul into panels of 16 rows:
//! for each block and each group of 4 elements, one 64-byte line holds those
//! 4 bytes of all 16 rows. A weight block's 32 codes (made unsigned, `q + C`)
//! are then broadcast 4 bytes at a time, and one `vpdpbusd` forms 4 products
//! for each of the 16 rows: 8 instructions cover a block for 16 rows, and
//! the block's scaling (`Σ·d_x·d_w`, after `−C·Σx` from the panel's block
//! sums) is one conversion and one FMA for all 16. The row kernels of
//! `int8_rows` instead scale every (weight row, activation row) pair per
//! block, and the GEMM must first decode the weights into panels.
//!
//! # Safety
//! Every function needs AVX-512 F + BW + VL + VNNI (on top of AVX2, FMA,
//! F16C): `kernels` hands them out only when `has_avx512_vnni()` and the
//! requested ISA is `Isa::Avx512`, which `matmul` checks against the CPU. The
//! entry points check the slice lengths before any raw-pointer read.

use std::arch::x86_64::*;

use super::act::{ActPanels, LANES, QUADS};
use super::formats::Legacy;
use super::int8_rows::{codes, PREFETCH};
use crate::cpu::simd::table::f16_table;

/// Weight rows per register tile.
const ROWS: usize = 4;

/// `R` weight rows starting at `w` (`row_bytes` apart, `nb` blocks each)
/// against one panel (its codes, scales and sums at `codes`, `scales`,
/// `sums`): lane `l` of result `r` is weight row `r` · activation row `l`.
///
/// # Safety
/// `w + r·row_bytes` for `r < R` points at `nb` whole blocks; the panel
/// pointers at `nb` blocks of it.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile<F: Legacy, const R: usize>(
    w: *const u8,
    row_bytes: usize,
    nb: usize,
    codes_at: *const i8,
    scales: *const f32,
    sums: *const i32,
    table: &[f32; 65536],
) -> [__m512; R] {
    // SAFETY: this function's contract (the module's `# Safety`): the CPU has AVX-512 VNNI, and the
    // entry point checked the slice lengths the pointers walk.
    unsafe {
        let wb_bytes = F::BYTES;
        // `vpdpbusd` reads the codes plus C as unsigned bytes: Σ (q + C)·x =
        // Σ q·x + C·Σx, so each block's sum starts at −C·Σx.
        let neg_c = _mm512_set1_epi32(-i32::from(F::OFFSET));
        let mut acc = [_mm512_setzero_ps(); R];
        let mut wq = [[0u8; 32]; R];
        for b in 0..nb {
            let line = codes_at.add(b * QUADS * LANES * 4);
            let mut x = [_mm512_setzero_si512(); QUADS];
            for (q, x) in x.iter_mut().enumerate() {
                *x = _mm512_loadu_si512(line.add(q * LANES * 4).cast());
            }
            let dx = _mm512_loadu_ps(scales.add(b * LANES));
            let start = _mm512_mullo_epi32(_mm512_loadu_si512(sums.add(b * LANES).cast()), neg_c);
            for r in 0..R {
                let wb = w.add(r * row_bytes + b * wb_bytes);
                _mm_prefetch::<_MM_HINT_T0>(wb.wrapping_add(PREFETCH).cast());
                _mm256_storeu_si256(wq[r].as_mut_ptr().cast(), codes::<F, true>(wb));
                let dw = table[usize::from(wb.cast::<u16>().read_unaligned())];
                let mut sum = start;
                for (q, &x) in x.iter().enumerate() {
                    let four = wq[r].as_ptr().add(4 * q).cast::<i32>().read_unaligned();
                    sum = _mm512_dpbusd_epi32(sum, _mm512_set1_epi32(four), x);
                }
                let d = _mm512_mul_ps(dx, _mm512_set1_ps(dw));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), d, acc[r]);
            }
        }
        acc
    }
}

/// Weight rows `r0 .. r0 + R` against every panel; writes
/// `out[i][col + r]` for every activation row `i`.
///
/// # Safety
/// As [`tile`], for every panel of `p`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn row_group<F: Legacy, const R: usize>(
    w: *const u8,
    row_bytes: usize,
    p: &ActPanels,
    table: &[f32; 65536],
    out: &mut [&mut [f32]],
    col: usize,
) {
    // SAFETY: this function's contract (the module's `# Safety`): the CPU has AVX-512 VNNI, and the
    // entry point checked the slice lengths the pointers walk.
    unsafe {
        let nb = p.blocks;
        let mut lanes = [[0f32; LANES]; R];
        for panel in 0..p.rows.div_ceil(LANES) {
            let first = panel * nb;
            let acc = tile::<F, R>(
                w,
                row_bytes,
                nb,
                p.codes.as_ptr().add(first * QUADS * LANES * 4),
                p.scales.as_ptr().add(first * LANES),
                p.sums.as_ptr().add(first * LANES),
                table,
            );
            for (dst, v) in lanes.iter_mut().zip(acc) {
                _mm512_storeu_ps(dst.as_mut_ptr(), v);
            }
            let rows = panel * LANES..(panel * LANES + LANES).min(p.rows);
            for (lane, i) in rows.enumerate() {
                for (r, l) in lanes.iter().enumerate() {
                    out[i][col + r] = l[lane];
                }
            }
        }
    }
}

/// `out[i][col + r]` = row `r` of `w` (rows of `row_bytes`) · activation
/// row `i` of the panels, for every row of `w` and every `i < p.rows()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn rows<F: Legacy>(
    w: &[u8],
    row_bytes: usize,
    p: &ActPanels,
    out: &mut [&mut [f32]],
    col: usize,
) {
    // SAFETY: this function's contract (the module's `# Safety`): the CPU has AVX-512 VNNI, and the
    // entry point checked the slice lengths the pointers walk.
    unsafe {
        let nb = row_bytes / F::BYTES;
        let n = w.len() / row_bytes.max(1);
        let panels = p.rows.div_ceil(LANES);
        assert!(nb == p.blocks && out.len() >= p.rows);
        assert!(p.codes.len() >= panels * nb * QUADS * LANES * 4);
        assert!(p.scales.len() >= panels * nb * LANES && p.sums.len() >= panels * nb * LANES);
        assert!(out.iter().all(|o| o.len() >= col + n));
        let table = f16_table();
        let w = w.as_ptr();
        let mut r = 0;
        while r + ROWS <= n {
            // SAFETY: rows r..r + ROWS lie inside `w`; the panels hold `nb`
            // blocks of every panel (asserted above).
            row_group::<F, ROWS>(w.add(r * row_bytes), row_bytes, p, table, out, col + r);
            r += ROWS;
        }
        while r < n {
            // SAFETY: as above, for row `r`.
            row_group::<F, 1>(w.add(r * row_bytes), row_bytes, p, table, out, col + r);
            r += 1;
        }
    }
}
