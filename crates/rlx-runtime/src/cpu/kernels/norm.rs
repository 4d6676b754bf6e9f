//! RMS normalisation over the last axis.

/// `x / sqrt(mean(x²) + eps) · γ` per row of `d` values. The mean of squares
/// accumulates in f64 so the result does not depend on the summation order.
pub fn rms_norm(x: &[f32], d: usize, gamma: Option<&[f32]>, eps: f32, out: &mut [f32]) {
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

/// `1 / sqrt(mean(row²) + eps)` in f32.
#[inline]
pub fn inv_rms(row: &[f32], eps: f32) -> f32 {
    let ss: f64 = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    let mean = (ss / row.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}
