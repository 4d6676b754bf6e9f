//! Mixture-of-experts GeGLU FFN: route each token to its top-k experts, then
//! run each expert once over all the tokens routed to it.

use rlx_gguf::GgmlType;

use crate::cpu::kernels::elementwise::gelu_tanh;
use crate::cpu::matmul::{self, MatmulError, MatmulOptions, MatmulScratch, WeightMatrix};
use crate::cpu::pool::ThreadPool;

/// A stack of `experts` matrices of `rows × k` in one weight.
#[derive(Clone, Copy)]
pub struct ExpertStack<'a> {
    pub ty: GgmlType,
    pub data: &'a [u8],
    pub experts: usize,
    pub rows: usize,
    pub k: usize,
}

impl<'a> ExpertStack<'a> {
    fn expert(&self, e: usize) -> WeightMatrix<'a> {
        let row_bytes = self.k / self.ty.block_elems() * self.ty.block_bytes();
        let slab = self.rows * row_bytes;
        WeightMatrix {
            ty: self.ty,
            rows: self.rows,
            k: self.k,
            data: &self.data[e * slab..(e + 1) * slab],
        }
    }
}

/// The chosen experts of one token and their weights:
/// `softmax(logits)` over all experts, the `top_k` largest (ties to the
/// lower index), renormalised over the chosen, times `expert_scale`.
pub fn route(logits: &[f32], top_k: usize, expert_scale: &[f32]) -> Vec<(usize, f32)> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exp: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
    let sum: f32 = exp.iter().sum();
    let probs: Vec<f32> = exp.iter().map(|&e| e / sum).collect();
    let mut order: Vec<usize> = (0..probs.len()).collect();
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
    order.truncate(top_k);
    let chosen: f32 = order.iter().map(|&e| probs[e]).sum();
    order
        .into_iter()
        .map(|e| (e, probs[e] / chosen * expert_scale[e]))
        .collect()
}

/// `out[t] = Σ_{e ∈ S(t)} w_e · down_e(gelu(gate_e·u_t) ⊙ up_e·u_t)`.
#[allow(clippy::too_many_arguments)]
pub fn moe(
    pool: &ThreadPool,
    opts: &MatmulOptions,
    scratch: &mut MatmulScratch,
    u: &[f32],
    logits: &[f32],
    top_k: usize,
    gate_up: ExpertStack,
    down: ExpertStack,
    expert_scale: &[f32],
    out: &mut [f32],
) -> Result<(), MatmulError> {
    let (d, ff, experts) = (gate_up.k, gate_up.rows / 2, gate_up.experts);
    let n = u.len() / d;
    // Tokens (and weights) routed to each expert.
    let mut routed: Vec<Vec<(usize, f32)>> = vec![Vec::new(); experts];
    for t in 0..n {
        for (e, w) in route(&logits[t * experts..(t + 1) * experts], top_k, expert_scale) {
            routed[e].push((t, w));
        }
    }
    out.fill(0.0);
    for (e, tokens) in routed.iter().enumerate() {
        if tokens.is_empty() {
            continue;
        }
        let m = tokens.len();
        let mut x = Vec::with_capacity(m * d);
        for &(t, _) in tokens {
            x.extend_from_slice(&u[t * d..(t + 1) * d]);
        }
        let mut gu = vec![0f32; m * 2 * ff];
        matmul::matmul(pool, opts, &x, m, &[gate_up.expert(e)], &mut gu, scratch)?;
        let mut act = vec![0f32; m * ff];
        for (row, a) in gu.chunks_exact(2 * ff).zip(act.chunks_exact_mut(ff)) {
            let (gate, up) = row.split_at(ff);
            for ((o, &g), &v) in a.iter_mut().zip(gate).zip(up) {
                *o = gelu_tanh(g) * v;
            }
        }
        let mut y = vec![0f32; m * d];
        matmul::matmul(pool, opts, &act, m, &[down.expert(e)], &mut y, scratch)?;
        for (&(t, w), row) in tokens.iter().zip(y.chunks_exact(d)) {
            for (o, &v) in out[t * d..(t + 1) * d].iter_mut().zip(row) {
                *o += w * v;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_renormalises_over_the_chosen_and_applies_the_scale() {
        let r = route(&[0.0, 2.0, 1.0, 2.0], 2, &[1.0, 1.0, 1.0, 0.5]);
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), [1, 3]);
        assert!((r[0].1 - 0.5).abs() < 1e-6);
        assert!((r[1].1 - 0.25).abs() < 1e-6);
    }
}
