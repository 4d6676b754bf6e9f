//! Each non-matmul CPU kernel against a naive f64 reference on random
//! inputs, at sizes that are multiples of nothing in particular.

// Reference implementations read best as index loops over the formulas.
#![allow(clippy::needless_range_loop)]

use rlx_ir::{Mask, RopeSpec};
use rlx_runtime::cpu::features::Isa;
use rlx_runtime::cpu::kernels::{attention, elementwise, norm, rope, shape};
use rlx_runtime::cpu::kv::RowsView;
use rlx_runtime::cpu::pool::ThreadPool;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale).collect()
    }
}

fn assert_close(got: &[f32], want: &[f64], rel: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let scale = want.iter().fold(1e-30f64, |m, v| m.max(v.abs()));
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g as f64 - w).abs() <= rel * scale,
            "{what}[{i}]: got {g}, want {w} (scale {scale})"
        );
    }
}

#[test]
fn rms_norm_matches_the_formula() {
    let mut r = Rng(1);
    for d in [1usize, 7, 640, 1001] {
        let rows = 3;
        let x = r.vec(rows * d, 3.0);
        let gamma = r.vec(d, 1.5);
        let mut out = vec![0f32; x.len()];
        norm::rms_norm(Isa::detect(), &x, d, Some(&gamma), 1e-6, &mut out);
        let want: Vec<f64> = x
            .chunks(d)
            .flat_map(|row| {
                let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / d as f64;
                let inv = 1.0 / (ms + 1e-6).sqrt();
                row.iter()
                    .zip(&gamma)
                    .map(move |(&v, &g)| v as f64 * inv * g as f64)
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_close(&out, &want, 1e-6, "rms_norm");
    }
}

fn gelu64(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
}

#[test]
fn elementwise_ops_match_their_formulas() {
    let mut r = Rng(2);
    let n = 1037;
    let a = r.vec(n, 6.0);
    let b = r.vec(n, 2.0);
    let mut out = vec![0f32; n];
    elementwise::gelu(Isa::detect(), &a, &mut out);
    assert_close(
        &out,
        &a.iter().map(|&v| gelu64(v as f64)).collect::<Vec<_>>(),
        1e-6,
        "gelu",
    );
    elementwise::geglu(Isa::detect(), &a, &b, &mut out);
    let want: Vec<f64> = a
        .iter()
        .zip(&b)
        .map(|(&g, &u)| gelu64(g as f64) * u as f64)
        .collect();
    assert_close(&out, &want, 1e-6, "geglu");
    elementwise::softcap(&a, 5.0, &mut out);
    let want: Vec<f64> = a.iter().map(|&v| 5.0 * (v as f64 / 5.0).tanh()).collect();
    assert_close(&out, &want, 1e-6, "softcap");
    // Broadcast of a trailing vector.
    let v = r.vec(17, 1.0);
    let x = r.vec(17 * 5, 1.0);
    let mut out = vec![0f32; x.len()];
    elementwise::add(&x, &v, &mut out);
    let want: Vec<f64> = x
        .iter()
        .enumerate()
        .map(|(i, &a)| a as f64 + v[i % 17] as f64)
        .collect();
    assert_close(&out, &want, 1e-7, "add");
    elementwise::mul(&x, &v, &mut out);
    let want: Vec<f64> = x
        .iter()
        .enumerate()
        .map(|(i, &a)| a as f64 * v[i % 17] as f64)
        .collect();
    assert_close(&out, &want, 1e-7, "mul");
}

#[test]
fn rope_rotates_neox_pairs_and_leaves_the_rest() {
    let mut r = Rng(3);
    let (n, heads, hd) = (5usize, 3usize, 20usize);
    for (n_rot, factors) in [
        (20usize, None),
        (12, None),
        (
            20,
            Some(vec![1.0f32, 2.0, 1.0, 1e30, 3.0, 1.0, 1.0, 1.0, 1.0, 1.0]),
        ),
    ] {
        let spec = RopeSpec {
            n_rot,
            base: 10000.0,
            freq_scale: 0.125,
            has_freq_factors: factors.is_some(),
        };
        let x = r.vec(n * heads * hd, 1.0);
        let pos = [0i32, 1, 7, 100, 4095];
        let mut out = vec![0f32; x.len()];
        rope::rope(&x, heads, hd, &pos, &spec, factors.as_deref(), &mut out);
        let half = n_rot / 2;
        let mut want = vec![0f64; x.len()];
        for t in 0..n {
            for h in 0..heads {
                let base = (t * heads + h) * hd;
                for i in 0..hd {
                    want[base + i] = x[base + i] as f64;
                }
                for i in 0..half {
                    let f = factors.as_ref().map_or(1.0, |f| f[i] as f64);
                    let theta =
                        pos[t] as f64 * 0.125 * 10000f64.powf(-(2.0 * i as f64) / n_rot as f64) / f;
                    let (a, b) = (x[base + i] as f64, x[base + i + half] as f64);
                    want[base + i] = a * theta.cos() - b * theta.sin();
                    want[base + i + half] = b * theta.cos() + a * theta.sin();
                }
            }
        }
        // f32 angles at position 4095 carry ~1e-4 absolute phase error.
        assert_close(&out, &want, 2e-3, "rope");
    }
}

/// Naive attention in f64 over explicit K/V rows with positions.
#[allow(clippy::too_many_arguments)]
fn attention_ref(
    q: &[f32],
    qpos: &[i64],
    hq: usize,
    k: &[f32],
    v: &[f32],
    kpos: &[i64],
    hkv: usize,
    hd: usize,
    mask: Mask,
    scale: f32,
    cap: Option<f32>,
) -> Vec<f64> {
    let n = qpos.len();
    let mut out = vec![0f64; n * hq * hd];
    for i in 0..n {
        for h in 0..hq {
            let g = h / (hq / hkv);
            let mut scores = Vec::new();
            for (t, &kp) in kpos.iter().enumerate() {
                if kp < 0 || !attention::visible(mask, qpos[i], kp, 0, 0) {
                    continue;
                }
                let mut s: f64 = (0..hd)
                    .map(|d| q[(i * hq + h) * hd + d] as f64 * k[(t * hkv + g) * hd + d] as f64)
                    .sum::<f64>()
                    * scale as f64;
                if let Some(c) = cap {
                    s = c as f64 * (s / c as f64).tanh();
                }
                scores.push((t, s));
            }
            let max = scores.iter().fold(f64::NEG_INFINITY, |m, &(_, s)| m.max(s));
            let sum: f64 = scores.iter().map(|&(_, s)| (s - max).exp()).sum();
            for &(t, s) in &scores {
                let w = (s - max).exp() / sum;
                for d in 0..hd {
                    out[(i * hq + h) * hd + d] += w * v[(t * hkv + g) * hd + d] as f64;
                }
            }
        }
    }
    out
}

#[test]
fn attention_handles_gqa_masks_softcap_and_empty_rows() {
    let mut r = Rng(4);
    let pool = ThreadPool::new(3);
    let (hq, hkv, hd) = (6usize, 2usize, 12usize);
    for (mask, cap) in [
        (Mask::Causal, None),
        (Mask::Sliding { window: 3 }, Some(5.0)),
        (Mask::Full, None),
        (Mask::Symmetric { half_width: 2 }, None),
    ] {
        let rows = 11;
        // Rows in ring order with a gap (−1) and positions out of order.
        let kpos: Vec<i64> = vec![8, 9, 10, -1, 2, 3, 4, 5, 6, 7, 1];
        let k = r.vec(rows * hkv * hd, 1.0);
        let v = r.vec(rows * hkv * hd, 1.0);
        let qpos = vec![6i64, 7, 8, 9, 10];
        let q = r.vec(qpos.len() * hq * hd, 2.0);
        let spans = vec![0i32; rows];
        let kv = attention::KvRows {
            k: RowsView::F32(&k),
            v: RowsView::F32(&v),
            pos: &kpos,
            span: &spans,
            kv_heads: hkv,
            head_dim: hd,
            v_head_dim: hd,
        };
        let queries = attention::Queries {
            q: &q,
            pos: &qpos,
            span: None,
            heads: hq,
        };
        let mut out = vec![0f32; q.len()];
        let p = attention::Params {
            mask,
            scale: 0.3,
            softcap: cap,
            split_keys: true,
        };
        let all = attention::Segment::all(qpos.len());
        attention::attention(&pool, Isa::detect(), p, &queries, &kv, &all, &mut out);
        let want = attention_ref(&q, &qpos, hq, &k, &v, &kpos, hkv, hd, mask, 0.3, cap);
        assert_close(&out, &want, 1e-5, &format!("attention {mask:?}"));
    }
}

#[test]
fn bidirectional_spans_open_the_causal_mask_within_a_span() {
    assert!(!attention::visible(Mask::Causal, 3, 5, 0, 0));
    assert!(attention::visible(Mask::Causal, 3, 5, 7, 7));
    assert!(!attention::visible(Mask::Causal, 3, 5, 7, 8));
    assert!(attention::visible(Mask::Sliding { window: 2 }, 10, 9, 0, 0));
    assert!(!attention::visible(
        Mask::Sliding { window: 2 },
        10,
        8,
        0,
        0
    ));
}

#[test]
fn narrow_and_concat_move_the_right_elements() {
    let x: Vec<f32> = (0..2 * 5 * 3).map(|i| i as f32).collect();
    let mut out = vec![0f32; 2 * 2 * 3];
    shape::narrow(&x, &[2, 5, 3], 1, 3, 2, &mut out);
    assert_eq!(
        out,
        [9., 10., 11., 12., 13., 14., 24., 25., 26., 27., 28., 29.]
    );
    let a = [1f32, 2., 3., 4.];
    let b = [5f32, 6.];
    let mut out = vec![0f32; 6];
    shape::concat(&[(&a, &[2, 2]), (&b, &[2, 1])], 1, &mut out);
    assert_eq!(out, [1., 2., 5., 3., 4., 6.]);
}
