//! Attention over cached or given K/V, grouped-query heads read in place.

use rlx_ir::Mask;

use crate::cpu::kernels::elementwise::exp_f32;
use crate::cpu::matmul::F32Dot;
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
/// head `h` reading KV head `h / (q_heads / kv_heads)`. The heads sharing a
/// KV head are done together, so each K and V row is read once per query.
/// A query that sees no key gets zeros.
pub fn attention(
    pool: &ThreadPool,
    dot: F32Dot,
    p: Params,
    q: &Queries,
    kv: &KvRows,
    out: &mut [f32],
) {
    let n = q.pos.len();
    let (hq, hd, hdv) = (q.heads, kv.head_dim, kv.v_head_dim);
    let group = hq / kv.kv_heads;
    let rows = kv.pos.len();
    let jobs = n * kv.kv_heads;
    let parts = (pool.threads() * 4).min(jobs).max(1);
    let out_ptr = SharedMut::new(out);
    pool.for_each(parts, &|part| {
        let mut scores = vec![0f32; group * rows];
        let mut krow = vec![0f32; hd];
        let mut vrow = vec![0f32; hdv];
        let mut acc = vec![0f32; group * hdv];
        let mut visible_rows = Vec::with_capacity(rows);
        for job in split_range(jobs, parts, part) {
            let (i, g) = (job / kv.kv_heads, job % kv.kv_heads);
            let qp = q.pos[i];
            let qs = q.span.map_or(0, |s| s[i]);
            visible_rows.clear();
            visible_rows.extend(
                (0..rows)
                    .filter(|&t| kv.pos[t] >= 0 && visible(p.mask, qp, kv.pos[t], qs, kv.span[t])),
            );
            let mut max = vec![f32::NEG_INFINITY; group];
            for (vi, &t) in visible_rows.iter().enumerate() {
                let k = kv.k.row((t * kv.kv_heads + g) * hd, &mut krow);
                for j in 0..group {
                    let h = g * group + j;
                    let qv = &q.q[(i * hq + h) * hd..][..hd];
                    let mut s = dot.dot(qv, k) * p.scale;
                    if let Some(c) = p.softcap {
                        s = (s / c).tanh() * c;
                    }
                    scores[j * rows + vi] = s;
                    max[j] = max[j].max(s);
                }
            }
            acc.fill(0.0);
            let nv = visible_rows.len();
            if nv > 0 {
                let mut sum = vec![0f32; group];
                for j in 0..group {
                    let row = &mut scores[j * rows..j * rows + nv];
                    // Exponentials first (a loop that vectorises), then the sum.
                    for s in row.iter_mut() {
                        *s = exp_f32(*s - max[j]);
                    }
                    sum[j] = row.iter().sum();
                }
                for (vi, &t) in visible_rows.iter().enumerate() {
                    let v = kv.v.row((t * kv.kv_heads + g) * hdv, &mut vrow);
                    for j in 0..group {
                        let w = scores[j * rows + vi] / sum[j];
                        for (a, &x) in acc[j * hdv..(j + 1) * hdv].iter_mut().zip(v) {
                            *a += w * x;
                        }
                    }
                }
            }
            for j in 0..group {
                let h = g * group + j;
                // SAFETY: each (i, h) output row is written by exactly one job.
                let dst = unsafe { out_ptr.slice((i * hq + h) * hdv, hdv) };
                dst.copy_from_slice(&acc[j * hdv..(j + 1) * hdv]);
            }
        }
    });
}
