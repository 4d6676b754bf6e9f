//! Portable pieces of the Exact path: the scalar f32 dot and in-place F32 rows.

use rlx_gguf::GgmlType;

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

/// `((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))`, the order the SIMD
/// horizontal sums use.
pub(super) fn tree_sum8(a: [f32; 8]) -> f32 {
    let h = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    let q = [h[0] + h[2], h[1] + h[3]];
    q[0] + q[1]
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
