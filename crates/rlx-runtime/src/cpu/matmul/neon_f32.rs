//! NEON f32 kernels of the exact path: the register-tiled prefill dots.
//!
//! # Safety
//! NEON is part of every AArch64 CPU; each function states what its
//! pointers must cover.

use std::arch::aarch64::*;

/// Weight rows per register tile: 4 weight rows × 6 activation rows
/// (`exact::TILE_ACTS`) is 24 of the 32 vector registers as accumulators, plus 4
/// weight vectors and 1 activation vector.
const TILE_ROWS: usize = 4;

/// Prefill (`m ≥ 2`) f32 dots: `out[i][col + r]` = row `i` of `x` (rows `k`
/// apart, `out.len()` of them) · row `r` of `w` (rows `k` apart). Each dot
/// puts element `e` in lane `e % 4` of its own accumulator (FMA; a partial
/// last vector is zero-filled), then adds the lanes pairwise — one
/// accumulator per output, so a 4 × 6 tile fits the registers with ~0.4
/// loads per FMA. The order depends on neither the tile size nor the
/// neighbours, so the thread split never shows. Unlike AVX-512's tile there
/// is no pass over long rows in spans: ARM cores' L1 (64 KiB on Neoverse
/// V1, 128 KiB on Apple's) holds 6 rows of 2,048 floats beside the weights.
pub(super) unsafe fn dot_f32_tile(
    x: &[f32],
    w: &[f32],
    k: usize,
    out: &mut [&mut [f32]],
    col: usize,
) {
    super::exact::act_groups(x, w, k, 4, out, col, |group, xs, n, out| {
        let (x, w) = (group.as_ptr(), w.as_ptr());
        // SAFETY: `group` holds `out.len()` rows `xs ≥ k` apart, zero after
        // `k`, and `w` holds `n` rows (`act_groups` checked).
        unsafe { super::exact::by_group_rows!(out.len(), act_group(x, xs, w, n, k, out, col)) }
    })
}

/// `M` activation rows at `x` (`xs` apart, zero-filled from `k` to the next
/// multiple of 4) against the `n` weight rows at `w`.
///
/// # Safety
/// `x` holds `M` such rows and `w` `n` rows of `k` floats; `out` has `M`
/// rows of at least `col + n`.
#[inline]
unsafe fn act_group<const M: usize>(
    x: *const f32,
    xs: usize,
    w: *const f32,
    n: usize,
    k: usize,
    out: &mut [&mut [f32]],
    col: usize,
) {
    // SAFETY: the caller upholds this function's contract (the module's `# Safety`): NEON is part
    // of every AArch64 CPU, and the pointers cover what the function reads and writes.
    unsafe {
        let mut r = 0;
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
/// [`dot_f32_tile`] order.
///
/// # Safety
/// As for [`act_group`], with `R` weight rows at `w`.
#[inline]
unsafe fn tile<const R: usize, const M: usize>(
    x: *const f32,
    xs: usize,
    w: *const f32,
    k: usize,
) -> [[f32; R]; M] {
    // SAFETY: the caller upholds this function's contract (the module's `# Safety`): NEON is part
    // of every AArch64 CPU, and the pointers cover what the function reads and writes.
    unsafe {
        let mut acc = [[vdupq_n_f32(0.0); R]; M];
        let mut wv = [vdupq_n_f32(0.0); R];
        let mut c = 0;
        while c + 4 <= k {
            for (r, v) in wv.iter_mut().enumerate() {
                *v = vld1q_f32(w.add(r * k + c));
            }
            for (i, a) in acc.iter_mut().enumerate() {
                let xv = vld1q_f32(x.add(i * xs + c));
                for (a, &v) in a.iter_mut().zip(&wv) {
                    *a = vfmaq_f32(*a, xv, v);
                }
            }
            c += 4;
        }
        if c < k {
            // The activation rows are zero past `k`; the weight rows are not
            // ours to read past, so their tail goes through a buffer.
            for (r, v) in wv.iter_mut().enumerate() {
                let mut buf = [0f32; 4];
                std::ptr::copy_nonoverlapping(w.add(r * k + c), buf.as_mut_ptr(), k - c);
                *v = vld1q_f32(buf.as_ptr());
            }
            for (i, a) in acc.iter_mut().enumerate() {
                let xv = vld1q_f32(x.add(i * xs + c));
                for (a, &v) in a.iter_mut().zip(&wv) {
                    *a = vfmaq_f32(*a, xv, v);
                }
            }
        }
        acc.map(|a| a.map(|v| vaddvq_f32(v)))
    }
}
