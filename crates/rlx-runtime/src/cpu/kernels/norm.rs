//! RMS normalisation over the last axis.

use super::elementwise::widest;

widest!(
    /// `x / sqrt(mean(x²) + eps) · γ` per row of `d` values. The mean of
    /// squares accumulates in f64 (in 8 fixed lanes, see [`inv_rms`]), so the
    /// result hardly depends on the summation order.
    rms_norm(x: &[f32], d: usize, gamma: Option<&[f32]>, eps: f32, out: &mut [f32]) {
        for (row, o) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            let inv = inv_rms(row, eps);
            match gamma {
                Some(g) => {
                    for ((o, &v), &w) in o.iter_mut().zip(row).zip(g) {
                        *o = v * inv * w;
                    }
                }
                None => {
                    for (o, &v) in o.iter_mut().zip(row) {
                        *o = v * inv;
                    }
                }
            }
        }
    }
);

/// `1 / sqrt(mean(row²) + eps)` in f32. Element `i`'s square goes to f64
/// lane `i mod 8` and the lanes are added pairwise, so the loop vectorises
/// and the order is fixed.
#[inline]
pub fn inv_rms(row: &[f32], eps: f32) -> f32 {
    let mut lanes = [0f64; 8];
    let chunks = row.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l += f64::from(v) * f64::from(v);
        }
    }
    for (l, &v) in lanes.iter_mut().zip(tail) {
        *l += f64::from(v) * f64::from(v);
    }
    let ss = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6]))
        + ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
    let mean = (ss / row.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}
