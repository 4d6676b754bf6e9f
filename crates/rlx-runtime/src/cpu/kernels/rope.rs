//! Rotary position embedding, NEOX pairing (dimension i with i + n_rot/2).

use rlx_ir::RopeSpec;

/// Rotates `x` `[n, heads, head_dim]` at `positions` into `out`; dimensions
/// at or past `n_rot` are copied unchanged.
pub fn rope(
    x: &[f32],
    heads: usize,
    head_dim: usize,
    positions: &[i32],
    spec: &RopeSpec,
    factors: Option<&[f32]>,
    out: &mut [f32],
) {
    let half = spec.n_rot / 2;
    let inv = spec.inv_freqs(factors);
    let mut cos = vec![0f32; half];
    let mut sin = vec![0f32; half];
    let tok = heads * head_dim;
    for (t, &p) in positions.iter().enumerate() {
        for i in 0..half {
            let theta = p as f32 * inv[i];
            cos[i] = theta.cos();
            sin[i] = theta.sin();
        }
        for h in 0..heads {
            let base = t * tok + h * head_dim;
            let xs = &x[base..base + head_dim];
            let os = &mut out[base..base + head_dim];
            for i in 0..half {
                let (a, b) = (xs[i], xs[i + half]);
                os[i] = a * cos[i] - b * sin[i];
                os[i + half] = b * cos[i] + a * sin[i];
            }
            os[spec.n_rot..].copy_from_slice(&xs[spec.n_rot..]);
        }
    }
}
