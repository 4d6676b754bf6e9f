//! Portable tile kernels: plain loops, and the model the SIMD ones follow.

use half::{bf16, f16};

use super::{Tiles, KEYS};
use crate::cpu::features::Isa;
use crate::cpu::kernels::elementwise::exp_f32;

pub(super) const TILES: Tiles = Tiles {
    isa: Isa::Scalar,
    scores: scores::<f32>,
    scores_f16: scores::<u16>,
    softmax,
    pv: pv::<f32>,
    pv_f16: pv::<u16>,
    widen_f16,
    widen_bf16,
};

/// K/V elements read where they lie: f32, or f16 bits.
trait Elem: Copy {
    fn get(self) -> f32;
}

impl Elem for f32 {
    fn get(self) -> f32 {
        self
    }
}

impl Elem for u16 {
    fn get(self) -> f32 {
        f16::from_bits(self).to_f32()
    }
}

#[allow(clippy::too_many_arguments)]
fn scores<E: Elem>(
    q: &[f32],
    rows: usize,
    hd: usize,
    k: &[E],
    k_stride: usize,
    nk: usize,
    scale: f32,
    s: &mut [f32],
) {
    for (qr, sr) in q.chunks_exact(hd).zip(s.chunks_exact_mut(KEYS)).take(rows) {
        for (j, s) in sr[..nk].iter_mut().enumerate() {
            let kr = &k[j * k_stride..][..hd];
            *s = qr.iter().zip(kr).map(|(a, b)| a * b.get()).sum::<f32>() * scale;
        }
    }
}

/// Row `r`: `m' = max(m, max_j s_j)`, `alpha = e^(m − m')` (0 while nothing
/// was seen), `p_j = e^(s_j − m')` where seen else 0, `l' = alpha·l + Σ p_j`.
/// A row that sees nothing in this block keeps its state (`alpha = 1`).
pub(super) fn softmax(
    s: &mut [f32],
    rows: usize,
    nk: usize,
    masks: &[u32],
    m: &mut [f32],
    l: &mut [f32],
    alpha: &mut [f32],
) {
    for r in 0..rows {
        let row = &mut s[r * KEYS..][..nk];
        let bits = masks[r];
        let seen = |j: usize| bits >> j & 1 != 0;
        let block_max = (0..nk)
            .filter(|&j| seen(j))
            .map(|j| row[j])
            .fold(f32::NEG_INFINITY, f32::max);
        let m_new = m[r].max(block_max);
        if m_new == f32::NEG_INFINITY {
            alpha[r] = 1.0;
            row.fill(0.0);
            continue;
        }
        alpha[r] = if m[r] == f32::NEG_INFINITY {
            0.0
        } else {
            exp_f32(m[r] - m_new)
        };
        let mut sum = 0f32;
        for (j, x) in row.iter_mut().enumerate() {
            *x = if seen(j) { exp_f32(*x - m_new) } else { 0.0 };
            sum += *x;
        }
        l[r] = l[r] * alpha[r] + sum;
        m[r] = m_new;
    }
}

#[allow(clippy::too_many_arguments)]
fn pv<E: Elem>(
    p: &[f32],
    rows: usize,
    nk: usize,
    v: &[E],
    v_stride: usize,
    hdv: usize,
    alpha: &[f32],
    o: &mut [f32],
) {
    for r in 0..rows {
        let orow = &mut o[r * hdv..][..hdv];
        for x in orow.iter_mut() {
            *x *= alpha[r];
        }
        for (j, &w) in p[r * KEYS..][..nk].iter().enumerate() {
            for (x, &y) in orow.iter_mut().zip(&v[j * v_stride..][..hdv]) {
                *x += w * y.get();
            }
        }
    }
}

fn widen_f16(src: &[u16], dst: &mut [f32]) {
    for (d, &b) in dst.iter_mut().zip(src) {
        *d = f16::from_bits(b).to_f32();
    }
}

fn widen_bf16(src: &[u16], dst: &mut [f32]) {
    for (d, &b) in dst.iter_mut().zip(src) {
        *d = bf16::from_bits(b).to_f32();
    }
}
