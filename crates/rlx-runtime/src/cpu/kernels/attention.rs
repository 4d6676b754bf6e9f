//! Attention over cached or given K/V, grouped-query heads read in place.

use rlx_ir::Mask;

use crate::cpu::pool::{split_range, ThreadPool};
use crate::cpu::SharedMut;
use crate::kv::RowsView;

/// Keys and values with the token position of each row.
pub struct KvRows<'a> {
    pub k: RowsView<'a>,
    pub v: RowsView<'a>,
    /// Position of each row; −1 marks an empty row.
    pub pos: &'a [i64],
    /// Bidirectional span id of each row (0 = none).
    pub span: &'a [i32],
    pub kv_heads: usize,
    pub head_dim: usize,
    pub v_head_dim: usize,
}

/// Queries `[n, q_heads, head_dim]` with their positions (and span ids).
pub struct Queries<'a> {
    pub q: &'a [f32],
    pub pos: &'a [i64],
    pub span: Option<&'a [i32]>,
    pub heads: usize,
}

/// Whether a query at `qp` (span `qs`) may see a key at `kp` (span `ks`).
#[inline]
pub fn visible(mask: Mask, qp: i64, kp: i64, qs: i32, ks: i32) -> bool {
    if qs != 0 && qs == ks {
        return true;
    }
    match mask {
        Mask::Causal => kp <= qp,
        Mask::Sliding { window } => kp <= qp && qp - kp < window as i64,
        Mask::Full => true,
        Mask::Symmetric { half_width } => (qp - kp).abs() <= half_width as i64,
    }
}

/// The attention parameters the kernel needs.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    pub mask: Mask,
    pub scale: f32,
    pub softcap: Option<f32>,
}

/// `out[i, h] = Σ_t softmax_t(softcap(scale·q·k_t) + mask) · v_t` with query
/// head `h` reading KV head `h / (q_heads / kv_heads)`. A query that sees no
/// key gets zeros.
pub fn attention(pool: &ThreadPool, p: Params, q: &Queries, kv: &KvRows, out: &mut [f32]) {
    let n = q.pos.len();
    let (hq, hd, hdv) = (q.heads, kv.head_dim, kv.v_head_dim);
    let group = hq / kv.kv_heads;
    let rows = kv.pos.len();
    let jobs = n * hq;
    let parts = (pool.threads() * 4).min(jobs).max(1);
    let out_ptr = SharedMut::new(out);
    pool.for_each(parts, &|part| {
        let mut scores = vec![0f32; rows];
        let mut krow = vec![0f32; hd];
        let mut vrow = vec![0f32; hdv];
        let mut acc = vec![0f32; hdv];
        for job in split_range(jobs, parts, part) {
            let (i, h) = (job / hq, job % hq);
            let g = h / group;
            let qv = &q.q[(i * hq + h) * hd..][..hd];
            let qp = q.pos[i];
            let qs = q.span.map_or(0, |s| s[i]);
            let mut max = f32::NEG_INFINITY;
            for (t, score) in scores.iter_mut().enumerate() {
                let kp = kv.pos[t];
                if kp < 0 || !visible(p.mask, qp, kp, qs, kv.span[t]) {
                    *score = f32::NEG_INFINITY;
                    continue;
                }
                kv.k.read((t * kv.kv_heads + g) * hd, &mut krow);
                let dot: f32 = qv.iter().zip(&krow).map(|(a, b)| a * b).sum();
                let mut s = dot * p.scale;
                if let Some(c) = p.softcap {
                    s = (s / c).tanh() * c;
                }
                *score = s;
                max = max.max(s);
            }
            acc.fill(0.0);
            if max > f32::NEG_INFINITY {
                let mut sum = 0f32;
                for s in scores.iter_mut() {
                    *s = (*s - max).exp();
                    sum += *s;
                }
                for (t, &s) in scores.iter().enumerate() {
                    if s == 0.0 {
                        continue;
                    }
                    let w = s / sum;
                    kv.v.read((t * kv.kv_heads + g) * hdv, &mut vrow);
                    for (a, &v) in acc.iter_mut().zip(&vrow) {
                        *a += w * v;
                    }
                }
            }
            // SAFETY: each (i, h) job writes its own hdv-long row of `out`.
            let dst = unsafe { out_ptr.slice((i * hq + h) * hdv, hdv) };
            dst.copy_from_slice(&acc);
        }
    });
}
