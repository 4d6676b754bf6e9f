//! The exact path's prefill (`m ≥ 2`) f32 dots, register-tiled, written once
//! over [`Lanes`] and compiled per instruction set by [`f32_tile!`].
//!
//! `out[i][col + r]` = row `i` of `x` (rows `k` apart, `out.len()` of them)
//! · row `r` of `w` (rows `k` apart). Each dot puts element `e` in lane
//! `e % N` of its own accumulator (FMA; a partial last vector reads zeros:
//! the activation rows are zero-padded by `exact::act_groups`, the weight
//! tail is a partial load), then [`Lanes::hsum4`]/[`Lanes::hsum`]. One
//! accumulator per output instead of the row dot's four lets a 4 × 6 tile
//! fit the registers with ~0.4 loads per FMA; the order depends on neither
//! the tile size nor the neighbours, so the thread split never shows.
//!
//! # Safety
//! [`act_group`] and the functions under it run only inlined into an entry
//! point that [`f32_tile!`] compiles for their `Lanes`' features (the
//! `cpu/simd` contract); the entry points are handed out only where the CPU
//! has them, and check the slice lengths (`act_groups`) before any raw
//! pointer read.

use std::ops::Range;

use crate::cpu::simd::Lanes;

/// Weight rows per register tile: 4 weight rows × 6 activation rows
/// (`exact::TILE_ACTS`) is 24 accumulators, plus 4 weight vectors and 1
/// activation vector — within AVX-512's and NEON's 32 registers.
const TILE_ROWS: usize = 4;
/// With `SPANS`, rows longer than this are taken `SPAN` elements per pass,
/// with `SPAN_TILES` weight tiles sharing each pass: `M` activation rows no
/// longer stay in L1 next to the weight stream. (ARM cores' L1 — 64 KiB on
/// Neoverse V1, 128 KiB on Apple's — holds 6 rows of 2,048 floats beside the
/// weights, so NEON goes without.)
const LONG_ROW: usize = 1024;
const SPAN: usize = 256;
const SPAN_TILES: usize = 4;

/// `M` activation rows at `x` (`xs` apart, zero from `k` to the next whole
/// vector) against the `n` weight rows at `w`; writes `out[i][col + r]`.
///
/// # Safety
/// `x` holds `M` such rows and `w` `n` rows of `k` floats; `out` has `M`
/// rows of at least `col + n`; the module's `# Safety`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn act_group<V: Lanes, const M: usize, const SPANS: bool>(
    x: *const f32,
    xs: usize,
    w: *const f32,
    n: usize,
    k: usize,
    out: &mut [&mut [f32]],
    col: usize,
) {
    // SAFETY: this function's contract: the pointers cover the rows and
    // lengths given, and `V`'s features are enabled.
    unsafe {
        let mut r = 0;
        if SPANS && k > LONG_ROW {
            while r + SPAN_TILES * TILE_ROWS <= n {
                let mut acc = [[[V::zero(); TILE_ROWS]; M]; SPAN_TILES];
                for c in (0..k).step_by(SPAN) {
                    for (t, a) in acc.iter_mut().enumerate() {
                        let wt = w.add((r + t * TILE_ROWS) * k);
                        tile_span(x, xs, wt, k, c..(c + SPAN).min(k), a);
                    }
                }
                for a in &acc {
                    for (o, y) in out.iter_mut().zip(reduce(a)) {
                        o[col + r..col + r + TILE_ROWS].copy_from_slice(&y);
                    }
                    r += TILE_ROWS;
                }
            }
        }
        while r + TILE_ROWS <= n {
            let mut acc = [[V::zero(); TILE_ROWS]; M];
            tile_span(x, xs, w.add(r * k), k, 0..k, &mut acc);
            for (o, y) in out.iter_mut().zip(reduce(&acc)) {
                o[col + r..col + r + TILE_ROWS].copy_from_slice(&y);
            }
            r += TILE_ROWS;
        }
        while r < n {
            let mut acc = [[V::zero(); 1]; M];
            tile_span(x, xs, w.add(r * k), k, 0..k, &mut acc);
            for (o, [y]) in out.iter_mut().zip(reduce(&acc)) {
                o[col + r] = y;
            }
            r += 1;
        }
    }
}

/// Adds elements `span` (a start on a whole vector; a partial last vector
/// only where it ends at `k`) of each of the `M × R` dots into `acc`, in
/// element order.
///
/// # Safety
/// As for [`act_group`], with `R` weight rows at `w` and `span.end <= k`.
#[inline(always)]
unsafe fn tile_span<V: Lanes, const R: usize, const M: usize>(
    x: *const f32,
    xs: usize,
    w: *const f32,
    k: usize,
    span: Range<usize>,
    acc: &mut [[V; R]; M],
) {
    // SAFETY: as for `act_group`; the partial weight load reads only the
    // lanes below `k`.
    unsafe {
        let mut wv = [V::zero(); R];
        let mut c = span.start;
        while c + V::N <= span.end {
            for (r, v) in wv.iter_mut().enumerate() {
                *v = V::load(w.add(r * k + c));
            }
            fma_rows(x, xs, c, &wv, acc);
            c += V::N;
        }
        if c < span.end {
            let part = V::prefix(span.end - c);
            for (r, v) in wv.iter_mut().enumerate() {
                *v = V::load_part(part, w.add(r * k + c));
            }
            fma_rows(x, xs, c, &wv, acc);
        }
    }
}

/// `acc[i][r] += x_i[c..c + N] · wv[r]` for every activation row `i`.
///
/// # Safety
/// As for [`tile_span`]; the activation rows hold a whole vector at `c`.
#[inline(always)]
unsafe fn fma_rows<V: Lanes, const R: usize, const M: usize>(
    x: *const f32,
    xs: usize,
    c: usize,
    wv: &[V; R],
    acc: &mut [[V; R]; M],
) {
    // SAFETY: this function's contract.
    unsafe {
        for (i, a) in acc.iter_mut().enumerate() {
            let xv = V::load(x.add(i * xs + c));
            for (a, &v) in a.iter_mut().zip(wv) {
                *a = V::fma(xv, v, *a);
            }
        }
    }
}

/// Each accumulator's lane sum, four at a time where a tile is four wide.
#[inline(always)]
unsafe fn reduce<V: Lanes, const R: usize, const M: usize>(acc: &[[V; R]; M]) -> [[f32; R]; M] {
    let mut out = [[0f32; R]; M];
    // SAFETY: `V`'s features are enabled (the module's `# Safety`).
    unsafe {
        for (o, a) in out.iter_mut().zip(acc) {
            if R == 4 {
                o.copy_from_slice(&V::hsum4([a[0], a[1], a[2], a[3]]));
            } else {
                for (o, &v) in o.iter_mut().zip(a) {
                    *o = V::hsum(v);
                }
            }
        }
    }
    out
}

/// `pub(super) fn $name(x, w, k, out, col)`: [`act_group`] over `$lanes`
/// for every group of `exact::act_groups`, compiled with `$attr` (the
/// lanes' features), long rows in spans where `$spans`.
macro_rules! f32_tile {
    ($(#[$attr:meta])* $name:ident, $lanes:ty, $spans:expr) => {
        $(#[$attr])*
        pub(super) fn $name(x: &[f32], w: &[f32], k: usize, out: &mut [&mut [f32]], col: usize) {
            // Each row count's tile is a function of its own: inlined into
            // the closure that picks one, the six tiles shared its registers
            // and the exact path's prompts ran 20 % slower (Zen 5).
            $(#[$attr])*
            #[inline(never)]
            #[allow(clippy::too_many_arguments)]
            unsafe fn group<const M: usize>(
                x: *const f32,
                xs: usize,
                w: *const f32,
                n: usize,
                k: usize,
                out: &mut [&mut [f32]],
                col: usize,
            ) {
                // SAFETY: this entry point's features are `$lanes`', and
                // the caller passes what `act_group` needs.
                unsafe {
                    super::f32_tile::act_group::<$lanes, M, { $spans }>(x, xs, w, n, k, out, col)
                }
            }
            let lanes = <$lanes as $crate::cpu::simd::Lanes>::N;
            super::exact::act_groups(x, w, k, lanes, out, col, |g, xs, n, out| {
                let (x, w) = (g.as_ptr(), w.as_ptr());
                // SAFETY: `g` holds `out.len()` rows `xs ≥ k` apart, zero
                // after `k`, and `w` holds `n` rows (`act_groups` checked);
                // the CPU has this entry point's features.
                unsafe { super::exact::by_group_rows!(out.len(), group(x, xs, w, n, k, out, col)) }
            })
        }
    };
}
pub(super) use f32_tile;
