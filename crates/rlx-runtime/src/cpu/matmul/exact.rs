//! Portable pieces of the Exact path: the scalar f32 dot and in-place F32 rows.

use rlx_gguf::GgmlType;

use crate::cpu::simd::Lanes;

/// Lanes of the scalar dot: element `i` adds into lane `i % 8`.
const LANES: usize = 8;

/// f32 dot over `min(x.len(), w.len())` elements: 8 lane sums (mul then add,
/// no FMA), added as a pairwise tree, then the tail in order.
pub(super) fn dot_f32(x: &[f32], w: &[f32]) -> f32 {
    let n = x.len().min(w.len());
    let (x, w) = (&x[..n], &w[..n]);
    let mut acc = [0f32; LANES];
    let xs = x.chunks_exact(LANES);
    let ws = w.chunks_exact(LANES);
    let (xt, wt) = (xs.remainder(), ws.remainder());
    for (xc, wc) in xs.zip(ws) {
        for ((a, &xv), &wv) in acc.iter_mut().zip(xc).zip(wc) {
            *a += xv * wv;
        }
    }
    let mut sum = tree_sum8(acc);
    for (&xv, &wv) in xt.iter().zip(wt) {
        sum += xv * wv;
    }
    sum
}

/// f32 dot over `min(x.len(), w.len())` elements on `V`'s `N` lanes, the
/// SIMD sets' one source: element `i` of the first `4N·⌊n/4N⌋` into
/// accumulator `(i / N) % 4`, lane `i % N` (FMA); each whole vector of the
/// rest into accumulators 0, 1, 2 in turn; the accumulators added
/// `(a0 + a1) + (a2 + a3)` and their lanes by `V::hsum`; the last `n % N`
/// products then added in order, or (`MASKED_TAIL`, where partial loads are
/// cheap) as one more partial vector into the next accumulator.
///
/// # Safety
/// Runs only inlined into an entry point compiled for `V`'s features (the
/// `cpu/simd` contract); every load stays inside the slices.
#[inline(always)]
pub(super) unsafe fn dot_f32_lanes<V: Lanes, const MASKED_TAIL: bool>(x: &[f32], w: &[f32]) -> f32 {
    let n = x.len().min(w.len());
    let (x, w) = (&x[..n], &w[..n]);
    let lanes = V::N;
    // SAFETY: the contract above; pointers are offsets below `n` of both
    // slices, whole vectors within them and partial ones masked to them.
    unsafe {
        let mut acc = [V::zero(); 4];
        let main = n / (4 * lanes) * 4 * lanes;
        let (xp, wp) = (x.as_ptr(), w.as_ptr());
        let mut i = 0;
        while i < main {
            for (j, a) in acc.iter_mut().enumerate() {
                let at = i + j * lanes;
                *a = V::fma(V::load(xp.add(at)), V::load(wp.add(at)), *a);
            }
            i += 4 * lanes;
        }
        let mut j = 0;
        while i + lanes <= n {
            acc[j] = V::fma(V::load(xp.add(i)), V::load(wp.add(i)), acc[j]);
            (i, j) = (i + lanes, j + 1);
        }
        if MASKED_TAIL && i < n {
            let m = V::prefix(n - i);
            acc[j] = V::fma(
                V::load_part(m, xp.add(i)),
                V::load_part(m, wp.add(i)),
                acc[j],
            );
            i = n;
        }
        let v = V::add(V::add(acc[0], acc[1]), V::add(acc[2], acc[3]));
        let mut sum = V::hsum(v);
        for (&xv, &wv) in x[i..].iter().zip(&w[i..]) {
            sum += xv * wv;
        }
        sum
    }
}

/// `((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))`, the order the SIMD
/// horizontal sums use.
pub(super) fn tree_sum8(a: [f32; 8]) -> f32 {
    let h = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    let q = [h[0] + h[2], h[1] + h[3]];
    q[0] + q[1]
}

/// Activation rows per register tile of the SIMD prefill f32 kernels.
pub(super) const TILE_ACTS: usize = 6;

/// The driver of the SIMD prefill f32 tiles (`dot_f32_tile`): `out.len()`
/// rows of `x` (`k` apart) are copied, [`TILE_ACTS`] at a time, `xs` floats
/// apart into a zeroed buffer — `k` rounded up to `lanes` plus 16, so rows
/// do not all share L1 sets when `k` is a multiple of 1024, and a partial
/// last vector reads zeros — and `group(rows, xs, n, out)` runs each group
/// (`n` weight rows of `w`; `out` that group's output rows). Activation
/// groups are outermost: a group stays in L1 while the weights stream from
/// L2.
pub(super) fn act_groups(
    x: &[f32],
    w: &[f32],
    k: usize,
    lanes: usize,
    out: &mut [&mut [f32]],
    col: usize,
    mut group: impl FnMut(&[f32], usize, usize, &mut [&mut [f32]]),
) {
    let m = out.len();
    let n = w.len().checked_div(k).unwrap_or(0);
    assert!(x.len() >= m * k && out.iter().all(|o| o.len() >= col + n));
    let xs = k.next_multiple_of(lanes) + 16;
    let mut buf = vec![0f32; TILE_ACTS * xs];
    for (g, out) in out.chunks_mut(TILE_ACTS).enumerate() {
        let rows = &x[g * TILE_ACTS * k..(g * TILE_ACTS + out.len()) * k];
        for (d, s) in buf.chunks_exact_mut(xs).zip(rows.chunks_exact(k)) {
            d[..k].copy_from_slice(s);
        }
        group(&buf, xs, n, out);
    }
}

/// `$tile::<M>(args…)` with `M` the rows of an activation group `$m`
/// (1..=[`TILE_ACTS`]): the SIMD prefill tiles are const-generic in it.
macro_rules! by_group_rows {
    ($m:expr, $tile:ident($($arg:expr),* $(,)?)) => {
        match $m {
            6 => $tile::<6>($($arg),*),
            5 => $tile::<5>($($arg),*),
            4 => $tile::<4>($($arg),*),
            3 => $tile::<3>($($arg),*),
            2 => $tile::<2>($($arg),*),
            _ => $tile::<1>($($arg),*),
        }
    };
}
pub(super) use by_group_rows;

/// The first `n` floats of `store` from a cache-line boundary on, `store`
/// grown as needed (zeros where new): where dequantized weight tiles go. A
/// 64-byte vector load from a row that starts mid-line touches two lines;
/// on an AMD Zen 5 aligned tiles made the exact path's pp512 10 % faster
/// (the activation groups, aligned too, ran 13 % slower, so they are not).
pub(super) fn aligned(store: &mut Vec<f32>, n: usize) -> &mut [f32] {
    const LINE: usize = 64 / std::mem::size_of::<f32>();
    store.resize(store.len().max(n + LINE), 0.0);
    let at = store.as_ptr().align_offset(64).min(LINE);
    &mut store[at..at + n]
}

/// F32 weight rows viewed in place, when the bytes are suitably aligned and the
/// target is little-endian (so the file's bytes are already native f32s).
pub(super) fn f32_in_place(ty: GgmlType, bytes: &[u8]) -> Option<&[f32]> {
    if ty != GgmlType::F32 || cfg!(target_endian = "big") {
        return None;
    }
    // SAFETY: every bit pattern is a valid f32, and `align_to` only puts
    // correctly aligned, in-bounds elements in the middle slice.
    let (head, mid, tail) = unsafe { bytes.align_to::<f32>() };
    (head.is_empty() && tail.is_empty()).then_some(mid)
}
