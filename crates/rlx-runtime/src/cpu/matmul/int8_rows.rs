//! Kernels for the 32-element block formats (Q4_0, Q5_0, Q8_0) against Q8_0
//! activations, several weight rows per call, written once for two x86
//! integer dots: AVX-512 VNNI's `vpdpbusd` on 256-bit vectors ([`rows`]) and
//! AVX2's `vpmaddubsw` + `vpmaddwd` ([`rows_avx2`]).
//!
//! Each activation block is loaded once and dotted with 4 weight rows. The
//! weight codes are read unsigned (`q + C`: `formats.rs`'s
//! `Legacy::unsigned`, with `C` = 8, 16 or 128), so one
//! unsigned × signed dot forms `Σ (q + C)·x`; its accumulator starts at
//! `−C·Σx` (computed once per activation block), which leaves the exact
//! `Σ q·x`. AVX2's pairwise `vpmaddubsw` would saturate on Q8_0's
//! `(q + 128)·x`, so there Q8_0 stays signed: `|q| · (x with q's sign)`.
//! Per block, per row: `acc += (f32(Σ) · d_x) · d_w` in 8 lanes, reduced once
//! per row. A row's operations don't depend on which rows share its call, so
//! results don't depend on the task split.
//!
//! # Safety
//! [`rows`] needs AVX-512 F + BW + VL + VNNI (on top of AVX2, FMA, F16C):
//! `kernels` hands it out only when `has_avx512_vnni()` and the requested ISA
//! is `Isa::Avx512`; [`rows_avx2`] needs AVX2 + FMA + F16C and is handed out
//! from `Isa::Avx2` on; `matmul` checks the ISA against the CPU. The other
//! functions are `#[inline(always)]` and run only inlined into those two
//! entry points, with their features. The entry points check the slice
//! lengths before any raw-pointer read.

use std::arch::x86_64::*;

use super::avx2::hsum_ps;
use super::formats::Legacy;
use super::scalar::Q8_0_BYTES;
use crate::cpu::simd::avx512::Bytes32Vl;
use crate::cpu::simd::table::f16_table;
use crate::cpu::simd::Bytes32;

/// Bytes ahead of each row's read position to prefetch: a large LM head
/// streams from DRAM, and one core's demand misses alone reach only part of
/// the bandwidth. Prefetches past the end of `w` are harmless hints.
pub(super) const PREFETCH: usize = 8192;

/// Weight rows and activation rows in one register tile.
const ROWS: usize = 4;
const ACTS: usize = 4;

/// Whether AVX2's dot takes `F`'s codes signed: `vpmaddubsw`'s pair sums
/// saturate on `(q + 128)·x`.
#[inline(always)]
const fn signed<F: Legacy, const VNNI: bool>() -> bool {
    !VNNI && F::OFFSET == 128
}

/// The block's 32 codes plus `F::OFFSET`, as u8, or its signed codes where
/// [`signed`] says so.
///
/// # Safety
/// `wb` points at a whole block of format `F`.
#[inline(always)]
pub(super) unsafe fn codes<F: Legacy, const VNNI: bool>(wb: *const u8) -> __m256i {
    // SAFETY: this function's contract (the module's `# Safety`): it runs
    // inlined into an entry point with the features of `VNNI`'s dot, whose
    // lengths checks cover the block.
    unsafe {
        let b = std::slice::from_raw_parts(wb, F::BYTES);
        if VNNI {
            let table = <Bytes32Vl as Bytes32>::table(F::TABLE);
            F::unsigned::<Bytes32Vl>(b, table).0
        } else {
            let table = <__m256i as Bytes32>::table(F::TABLE);
            if signed::<F, VNNI>() {
                F::codes(b, table)
            } else {
                F::unsigned(b, table)
            }
        }
    }
}

/// `Σ codes·x` over each group of four bytes into the i32 lanes of `acc`:
/// one `vpdpbusd`, or AVX2's pairwise products (`codes` unsigned below 128
/// there, or signed: see the module's notes).
#[inline(always)]
unsafe fn dot<const VNNI: bool>(acc: __m256i, codes: __m256i, x: __m256i, signed: bool) -> __m256i {
    // SAFETY: as for [`codes`].
    unsafe {
        if VNNI {
            _mm256_dpbusd_epi32(acc, codes, x)
        } else {
            let (u, s) = if signed {
                (_mm256_sign_epi8(codes, codes), _mm256_sign_epi8(x, codes))
            } else {
                (codes, x)
            };
            let pairs = _mm256_maddubs_epi16(u, s);
            _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
        }
    }
}

/// `R` weight rows starting at `w`, `row_bytes` apart, each `nb` blocks,
/// against `M` activation rows starting at `a`, `a_row_bytes` apart:
/// `out[i][r]` = weight row `r` · activation row `i`. Codes are unpacked once
/// per weight block and reused for the `M` activation rows.
///
/// # Safety
/// `w + r·row_bytes` for `r < R` and `a + i·a_row_bytes` for `i < M` point at
/// `nb` whole blocks each.
#[inline(always)]
unsafe fn tile<F: Legacy, const R: usize, const M: usize, const VNNI: bool>(
    w: *const u8,
    row_bytes: usize,
    nb: usize,
    a: *const u8,
    a_row_bytes: usize,
    table: &[f32; 65536],
) -> [[f32; R]; M] {
    // SAFETY: this function's contract (the module's `# Safety`): the CPU has AVX-512 VNNI, and the
    // entry point checked the slice lengths the pointers walk.
    unsafe {
        let (wb_bytes, signed) = (F::BYTES, signed::<F, VNNI>());
        let cv = _mm256_set1_epi8(F::OFFSET as i8);
        let zero = _mm256_setzero_si256();
        let mut acc = [[_mm256_setzero_ps(); R]; M];
        for b in 0..nb {
            let mut q = [zero; R];
            let mut dw = [_mm256_setzero_ps(); R];
            for r in 0..R {
                let wb = w.add(r * row_bytes + b * wb_bytes);
                _mm_prefetch::<_MM_HINT_T0>(wb.wrapping_add(PREFETCH).cast());
                q[r] = codes::<F, VNNI>(wb);
                dw[r] = _mm256_set1_ps(table[usize::from(wb.cast::<u16>().read_unaligned())]);
            }
            for (i, acc) in acc.iter_mut().enumerate() {
                let ab = a.add(i * a_row_bytes + b * Q8_0_BYTES);
                let x = _mm256_loadu_si256(ab.add(2).cast());
                // Signed codes: nothing to take off.
                let start = if signed {
                    zero
                } else {
                    _mm256_sub_epi32(zero, dot::<VNNI>(zero, cv, x, false))
                };
                let dx = _mm256_set1_ps(table[usize::from(ab.cast::<u16>().read_unaligned())]);
                for r in 0..R {
                    let sum = dot::<VNNI>(start, q[r], x, signed);
                    let t = _mm256_mul_ps(_mm256_cvtepi32_ps(sum), dx);
                    acc[r] = _mm256_fmadd_ps(t, dw[r], acc[r]);
                }
            }
        }
        // Plain loops, not closures: a closure does not inherit the target
        // features, and the reductions then run out of line.
        let mut out = [[0f32; R]; M];
        for (o, a) in out.iter_mut().zip(&acc) {
            for (o, &a) in o.iter_mut().zip(a) {
                *o = hsum_ps(a);
            }
        }
        out
    }
}

/// Weight rows `r0..r0 + R` of `w` against every activation row; writes
/// `out[i][col + r - r0]`.
///
/// # Safety
/// The rows lie inside `w`, `a` holds `out.len()` rows of `nb` blocks.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn row_group<F: Legacy, const R: usize, const VNNI: bool>(
    w: *const u8,
    row_bytes: usize,
    nb: usize,
    a: *const u8,
    a_row_bytes: usize,
    table: &[f32; 65536],
    out: &mut [&mut [f32]],
    col: usize,
) {
    // SAFETY: this function's contract (the module's `# Safety`): the CPU has AVX-512 VNNI, and the
    // entry point checked the slice lengths the pointers walk.
    unsafe {
        let done = out.len() / ACTS * ACTS;
        let mut groups = out.chunks_exact_mut(ACTS);
        for (g, o) in (&mut groups).enumerate() {
            let y = tile::<F, R, ACTS, VNNI>(
                w,
                row_bytes,
                nb,
                a.add(g * ACTS * a_row_bytes),
                a_row_bytes,
                table,
            );
            for (o, y) in o.iter_mut().zip(y) {
                o[col..col + R].copy_from_slice(&y);
            }
        }
        for (i, o) in groups.into_remainder().iter_mut().enumerate() {
            let [y] = tile::<F, R, 1, VNNI>(
                w,
                row_bytes,
                nb,
                a.add((done + i) * a_row_bytes),
                a_row_bytes,
                table,
            );
            o[col..col + R].copy_from_slice(&y);
        }
    }
}

/// `out[i][col + r]` = row `r` of `w` (rows of `row_bytes`) · Q8_0 activation
/// row `i` of `acts` (rows of `a_row_bytes`), for every row of `w` and every
/// `i < out.len()`.
#[inline(always)]
unsafe fn rows_body<F: Legacy, const VNNI: bool>(
    w: &[u8],
    row_bytes: usize,
    acts: &[u8],
    a_row_bytes: usize,
    out: &mut [&mut [f32]],
    col: usize,
) {
    // SAFETY: this function's contract (the module's `# Safety`): the CPU has AVX-512 VNNI, and the
    // entry point checked the slice lengths the pointers walk.
    unsafe {
        let nb = row_bytes / F::BYTES;
        let n = w.len() / row_bytes.max(1);
        assert!(nb * Q8_0_BYTES <= a_row_bytes && acts.len() >= out.len() * a_row_bytes);
        assert!(out.iter().all(|o| o.len() >= col + n));
        let table = f16_table();
        let (w, a) = (w.as_ptr(), acts.as_ptr());
        let mut r = 0;
        while r + ROWS <= n {
            // SAFETY: rows r..r + ROWS lie inside `w`, and `acts` holds
            // `out.len()` rows of `nb` blocks (asserted above).
            row_group::<F, ROWS, VNNI>(
                w.add(r * row_bytes),
                row_bytes,
                nb,
                a,
                a_row_bytes,
                table,
                out,
                col + r,
            );
            r += ROWS;
        }
        while r < n {
            // SAFETY: as above, for row `r`.
            row_group::<F, 1, VNNI>(
                w.add(r * row_bytes),
                row_bytes,
                nb,
                a,
                a_row_bytes,
                table,
                out,
                col + r,
            );
            r += 1;
        }
    }
}

/// [`rows_body`] with AVX-512 VNNI's dot.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn rows<F: Legacy>(
    w: &[u8],
    row_bytes: usize,
    acts: &[u8],
    a_row_bytes: usize,
    out: &mut [&mut [f32]],
    col: usize,
) {
    // SAFETY: this function's contract (the module's `# Safety`).
    unsafe { rows_body::<F, true>(w, row_bytes, acts, a_row_bytes, out, col) }
}

/// [`rows_body`] with AVX2's dot.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows_avx2<F: Legacy>(
    w: &[u8],
    row_bytes: usize,
    acts: &[u8],
    a_row_bytes: usize,
    out: &mut [&mut [f32]],
    col: usize,
) {
    // SAFETY: this function's contract (the module's `# Safety`).
    unsafe { rows_body::<F, false>(w, row_bytes, acts, a_row_bytes, out, col) }
}
