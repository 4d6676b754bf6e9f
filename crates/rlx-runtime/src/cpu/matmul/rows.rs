//! The rows kernels of the 32-element block formats against Q8_0
//! activations (`kernels::RowsDot`), written once over [`IntDot`]: an
//! instruction set's integer dot of one weight block with one activation
//! block and how it adds the scaled result to a running sum. x86 has two
//! (AVX-512 VNNI's `vpdpbusd` and AVX2's pair sums: `int8_rows.rs`), ARM
//! two (`SDOT` and widening multiplies: `neon.rs`); [`rows_entry!`] makes
//! each one's entry point with its target features.
//!
//! A tile of `R` weight rows × `ACTS` activation rows unpacks each weight
//! block once for all its activation rows. Every output is its own
//! running sum, added to in block order by the same operations whatever
//! the tile, so results don't depend on the tile shape or on which rows
//! share a call (the task split).
//!
//! # Safety
//! [`IntDot`]'s methods and the functions here may run only inlined into an
//! entry point made by [`rows_entry!`] for the implementation's features,
//! which `kernels` hands out only where the CPU has them. The entry points
//! check the slice lengths before any raw-pointer read.

use super::formats::{Legacy, Scale, Q8_0};
use super::scalar::Q8_0_BYTES;
use crate::cpu::simd::table::{e8m0_table, f16_table};

/// Activation rows in one register tile.
const ACTS: usize = 4;

/// One instruction set's integer dot of a weight block with a Q8_0
/// activation block, and the sum it scales the dots into.
pub(super) trait IntDot {
    /// A weight block's 32 codes, ready for [`IntDot::add`].
    type Codes: Copy;
    /// An activation block's 32 values, ready for [`IntDot::add`].
    type Act: Copy;
    /// A block scale, ready for [`IntDot::add`].
    type Scale: Copy;
    /// One output's running sum.
    type Acc: Copy;

    /// A weight block's codes (`b` holds the block).
    unsafe fn codes<F: Legacy>(b: &[u8]) -> Self::Codes;
    /// A Q8_0 activation block's values (`b` holds the block), prepared
    /// for weights of format `F`.
    unsafe fn act<F: Legacy>(b: &[u8]) -> Self::Act;
    unsafe fn scale(d: f32) -> Self::Scale;
    unsafe fn zero() -> Self::Acc;
    /// `acc` plus the block's `Σ q·x` scaled by `dw` and `dx`.
    unsafe fn add<F: Legacy>(
        acc: Self::Acc,
        w: Self::Codes,
        x: Self::Act,
        dw: Self::Scale,
        dx: Self::Scale,
    ) -> Self::Acc;
    unsafe fn finish(acc: Self::Acc) -> f32;
    /// A hint that `p` will be read soon (harmless past the data's end).
    #[inline(always)]
    unsafe fn prefetch(_p: *const u8) {}
}

/// The little-endian u16 at the start of `b`: one 16-bit load.
#[inline(always)]
fn u16_at(b: &[u8]) -> u16 {
    u16::from_le_bytes(*b.first_chunk().expect("a block holds its scale"))
}

/// The scale tables, looked up once a call.
#[derive(Clone, Copy)]
struct Tables {
    f16: &'static [f32; 65536],
    e8m0: &'static [f32; 256],
}

impl Tables {
    /// A block scale stored as `F` stores its weight blocks' scales.
    #[inline(always)]
    fn scale<F: Legacy>(self, b: &[u8]) -> f32 {
        match F::SCALE {
            Scale::F16 => self.f16[usize::from(u16_at(b))],
            Scale::E8m0 => self.e8m0[usize::from(b[0])],
        }
    }
}

/// The weight block at `wb`: its codes and its scale.
///
/// # Safety
/// `wb` points at a whole block of format `F`; the module's `# Safety`.
#[inline(always)]
unsafe fn weight_block<F: Legacy, D: IntDot>(wb: *const u8, t: Tables) -> (D::Codes, D::Scale) {
    // SAFETY: this function's contract.
    unsafe {
        D::prefetch(wb);
        let wb = std::slice::from_raw_parts(wb, F::BYTES);
        (D::codes::<F>(wb), D::scale(t.scale::<F>(wb)))
    }
}

/// `R` weight rows starting at `w`, `row_bytes` apart, each `nb` blocks,
/// against `M` activation rows starting at `a`, `a_row_bytes` apart:
/// `out[i][r]` = weight row `r` · activation row `i`.
///
/// # Safety
/// `w + r·row_bytes` for `r < R` and `a + i·a_row_bytes` for `i < M` point at
/// `nb` whole blocks each; the module's `# Safety`.
#[inline(always)]
unsafe fn tile<F: Legacy, D: IntDot, const R: usize, const M: usize>(
    w: *const u8,
    row_bytes: usize,
    nb: usize,
    a: *const u8,
    a_row_bytes: usize,
    t: Tables,
) -> [[f32; R]; M] {
    // SAFETY: this function's contract: every block read lies in the rows
    // the entry point checked.
    unsafe {
        let mut acc = [[D::zero(); R]; M];
        for b in 0..nb {
            let block = |r: usize| w.add(r * row_bytes + b * F::BYTES);
            let mut q = [weight_block::<F, D>(block(0), t); R];
            for (r, q) in q.iter_mut().enumerate().skip(1) {
                *q = weight_block::<F, D>(block(r), t);
            }
            for (i, acc) in acc.iter_mut().enumerate() {
                let ab =
                    std::slice::from_raw_parts(a.add(i * a_row_bytes + b * Q8_0_BYTES), Q8_0_BYTES);
                let x = D::act::<F>(ab);
                let dx = D::scale(t.scale::<Q8_0>(ab));
                for r in 0..R {
                    acc[r] = D::add::<F>(acc[r], q[r].0, x, q[r].1, dx);
                }
            }
        }
        // Plain loops, not closures: a closure does not inherit the target
        // features, and the reductions then run out of line.
        let mut out = [[0f32; R]; M];
        for (o, a) in out.iter_mut().zip(&acc) {
            for (o, &a) in o.iter_mut().zip(a) {
                *o = D::finish(a);
            }
        }
        out
    }
}

/// Weight rows `r0..r0 + R` of `w` against every activation row, `ACTS`
/// at a time, then one by one; writes `out[i][col + r - r0]`.
///
/// # Safety
/// The rows lie inside `w`, `a` holds `out.len()` rows of `nb` blocks; the
/// module's `# Safety`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn row_group<F: Legacy, D: IntDot, const R: usize>(
    w: *const u8,
    row_bytes: usize,
    nb: usize,
    a: *const u8,
    a_row_bytes: usize,
    t: Tables,
    out: &mut [&mut [f32]],
    col: usize,
) {
    // SAFETY: this function's contract.
    unsafe {
        let done = out.len() / ACTS * ACTS;
        let mut groups = out.chunks_exact_mut(ACTS);
        for (g, o) in (&mut groups).enumerate() {
            let a = a.add(g * ACTS * a_row_bytes);
            let y = tile::<F, D, R, ACTS>(w, row_bytes, nb, a, a_row_bytes, t);
            for (o, y) in o.iter_mut().zip(y) {
                o[col..col + R].copy_from_slice(&y);
            }
        }
        for (i, o) in groups.into_remainder().iter_mut().enumerate() {
            let a = a.add((done + i) * a_row_bytes);
            let [y] = tile::<F, D, R, 1>(w, row_bytes, nb, a, a_row_bytes, t);
            o[col..col + R].copy_from_slice(&y);
        }
    }
}

/// `out[i][col + r]` = row `r` of `w` (rows of `row_bytes`) · Q8_0 activation
/// row `i` of `acts` (rows of `a_row_bytes`), for every row of `w` and every
/// `i < out.len()`: weight rows `R` at a time, then one by one.
///
/// # Safety
/// The module's `# Safety`: runs inlined into an entry point with `D`'s
/// features.
#[inline(always)]
pub(super) unsafe fn rows<F: Legacy, D: IntDot, const R: usize>(
    w: &[u8],
    row_bytes: usize,
    acts: &[u8],
    a_row_bytes: usize,
    out: &mut [&mut [f32]],
    col: usize,
) {
    let nb = row_bytes / F::BYTES;
    let n = w.len() / row_bytes.max(1);
    assert!(nb * Q8_0_BYTES <= a_row_bytes && acts.len() >= out.len() * a_row_bytes);
    assert!(out.iter().all(|o| o.len() >= col + n));
    let (w, a) = (w.as_ptr(), acts.as_ptr());
    let t = Tables {
        f16: f16_table(),
        e8m0: e8m0_table(),
    };
    let mut r = 0;
    // SAFETY: rows r..r + R (then r) lie inside `w`, and `acts` holds
    // `out.len()` rows of `nb` blocks (asserted above); the features are
    // the caller's promise.
    unsafe {
        while r + R <= n {
            let wr = w.add(r * row_bytes);
            row_group::<F, D, R>(wr, row_bytes, nb, a, a_row_bytes, t, out, col + r);
            r += R;
        }
        while r < n {
            let wr = w.add(r * row_bytes);
            row_group::<F, D, 1>(wr, row_bytes, nb, a, a_row_bytes, t, out, col + r);
            r += 1;
        }
    }
}

/// Defines `pub(super) unsafe fn $name<F: Legacy>` (a `kernels::RowsDot`):
/// [`rows`] over `$dot`, `$rows` weight rows a tile, compiled with
/// `$features`.
macro_rules! rows_entry {
    ($(#[$doc:meta])* $name:ident, $dot:ty, $rows:literal, $features:literal) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// The CPU has the features named; `w` whole rows of `row_bytes`,
        /// `acts` `out.len()` rows of `act_row_bytes` (Q8_0 blocks), `out`
        /// rows of at least `col` plus the weight rows.
        #[target_feature(enable = $features)]
        pub(super) unsafe fn $name<F: super::formats::Legacy>(
            w: &[u8],
            row_bytes: usize,
            acts: &[u8],
            act_row_bytes: usize,
            out: &mut [&mut [f32]],
            col: usize,
        ) {
            // SAFETY: this function's `# Safety`: the features `$dot`
            // needs are enabled here.
            unsafe {
                super::rows::rows::<F, $dot, $rows>(w, row_bytes, acts, act_row_bytes, out, col)
            }
        }
    };
}
pub(super) use rows_entry;
