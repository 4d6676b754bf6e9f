//! The blocked kernel against a direct f64 evaluation of the definition,
//! for every instruction set this CPU runs, over shapes and masks chosen to
//! hit every tile tail, block kind and split.

// The reference reads best as index loops over the formula.
#![allow(clippy::needless_range_loop)]

use half::{bf16, f16};
use rlx_gguf::GgmlType;
use rlx_ir::Mask;

use super::*;

struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32() * scale).collect()
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Storage {
    F32,
    F16,
    BF16,
    /// ggml blocks of 32 (head sizes a multiple of 32).
    Q8_0,
    Q4_0,
}

/// K or V rows in one storage type, and the f32 values they hold.
struct Stored {
    f32s: Vec<f32>,
    f16s: Vec<f16>,
    bf16s: Vec<bf16>,
    blocks: Vec<u8>,
    storage: Storage,
}

impl Stored {
    fn new(values: Vec<f32>, storage: Storage) -> Stored {
        let f16s: Vec<f16> = values.iter().map(|&x| f16::from_f32(x)).collect();
        let bf16s: Vec<bf16> = values.iter().map(|&x| bf16::from_f32(x)).collect();
        let block_type = match storage {
            Storage::Q8_0 => Some(GgmlType::Q8_0),
            Storage::Q4_0 => Some(GgmlType::Q4_0),
            _ => None,
        };
        let blocks = block_type.map_or_else(Vec::new, |ty| {
            rlx_gguf::quantize_to_vec(ty, &values).expect("whole blocks")
        });
        let f32s = match (storage, block_type) {
            (_, Some(ty)) => rlx_gguf::dequantize_to_vec(ty, &blocks).unwrap(),
            (Storage::F16, _) => f16s.iter().map(|x| x.to_f32()).collect(),
            (Storage::BF16, _) => bf16s.iter().map(|x| x.to_f32()).collect(),
            _ => values,
        };
        Stored {
            f32s,
            f16s,
            bf16s,
            blocks,
            storage,
        }
    }
    fn view(&self) -> RowsView<'_> {
        match self.storage {
            Storage::F32 => RowsView::F32(&self.f32s),
            Storage::F16 => RowsView::F16(&self.f16s),
            Storage::BF16 => RowsView::BF16(&self.bf16s),
            Storage::Q8_0 => RowsView::Blocks(GgmlType::Q8_0, &self.blocks),
            Storage::Q4_0 => RowsView::Blocks(GgmlType::Q4_0, &self.blocks),
        }
    }
}

/// One attention problem.
struct Case {
    hq: usize,
    hkv: usize,
    hd: usize,
    hdv: usize,
    q: Vec<f32>,
    qpos: Vec<i64>,
    qspan: Option<Vec<i32>>,
    k: Stored,
    v: Stored,
    kpos: Vec<i64>,
    kspan: Vec<i32>,
    p: Params,
}

impl Case {
    /// `n` queries at the last `n` of `len` consecutive positions, over a
    /// ring of `rows` rows holding the newest `min(len, rows)` of them (the
    /// rest empty), as the KV cache lays a sliding layer out.
    #[allow(clippy::too_many_arguments)]
    fn ring(
        r: &mut Rng,
        (hq, hkv, hd, hdv): (usize, usize, usize, usize),
        n: usize,
        len: usize,
        rows: usize,
        p: Params,
        storage: Storage,
    ) -> Case {
        let mut kpos = vec![-1i64; rows];
        for t in len.saturating_sub(rows)..len {
            kpos[t % rows] = t as i64;
        }
        let qpos = (len - n..len).map(|t| t as i64).collect();
        Case::new(r, (hq, hkv, hd, hdv), qpos, kpos, p, storage)
    }

    fn new(
        r: &mut Rng,
        (hq, hkv, hd, hdv): (usize, usize, usize, usize),
        qpos: Vec<i64>,
        kpos: Vec<i64>,
        p: Params,
        storage: Storage,
    ) -> Case {
        let (n, rows) = (qpos.len(), kpos.len());
        Case {
            hq,
            hkv,
            hd,
            hdv,
            q: r.vec(n * hq * hd, 2.0),
            qpos,
            qspan: None,
            k: Stored::new(r.vec(rows * hkv * hd, 1.0), storage),
            v: Stored::new(r.vec(rows * hkv * hdv, 1.0), storage),
            kspan: vec![0; rows],
            kpos,
            p,
        }
    }

    fn run(&self, pool: &ThreadPool, isa: Isa) -> Vec<f32> {
        let kv = KvRows {
            k: self.k.view(),
            v: self.v.view(),
            pos: &self.kpos,
            span: &self.kspan,
            kv_heads: self.hkv,
            head_dim: self.hd,
            v_head_dim: self.hdv,
        };
        let queries = Queries {
            q: &self.q,
            pos: &self.qpos,
            span: self.qspan.as_deref(),
            heads: self.hq,
        };
        let mut out = vec![f32::NAN; self.qpos.len() * self.hq * self.hdv];
        attention(
            pool,
            isa,
            self.p,
            &queries,
            &kv,
            &Segment::all(self.qpos.len()),
            &mut out,
        );
        out
    }

    /// The definition in f64 over the stored (widened) K/V.
    fn reference(&self) -> Vec<f64> {
        let (hq, hkv, hd, hdv) = (self.hq, self.hkv, self.hd, self.hdv);
        let (k, v) = (&self.k.f32s, &self.v.f32s);
        let n = self.qpos.len();
        let mut out = vec![0f64; n * hq * hdv];
        for i in 0..n {
            let qs = self.qspan.as_ref().map_or(0, |s| s[i]);
            for h in 0..hq {
                let g = h / (hq / hkv);
                let mut scores = Vec::new();
                for (t, &kp) in self.kpos.iter().enumerate() {
                    if kp < 0 || !visible(self.p.mask, self.qpos[i], kp, qs, self.kspan[t]) {
                        continue;
                    }
                    let mut s: f64 = (0..hd)
                        .map(|d| {
                            self.q[(i * hq + h) * hd + d] as f64 * k[(t * hkv + g) * hd + d] as f64
                        })
                        .sum::<f64>()
                        * self.p.scale as f64;
                    if let Some(c) = self.p.softcap {
                        s = c as f64 * (s / c as f64).tanh();
                    }
                    scores.push((t, s));
                }
                let max = scores.iter().fold(f64::NEG_INFINITY, |m, &(_, s)| m.max(s));
                let sum: f64 = scores.iter().map(|&(_, s)| (s - max).exp()).sum();
                for &(t, s) in &scores {
                    let w = (s - max).exp() / sum;
                    for d in 0..hdv {
                        out[(i * hq + h) * hdv + d] += w * v[(t * hkv + g) * hdv + d] as f64;
                    }
                }
            }
        }
        out
    }

    /// Every instruction set and thread count against the reference.
    fn check(&self, what: &str) {
        let want = self.reference();
        for threads in [1, 3] {
            let pool = ThreadPool::new(threads);
            for isa in Isa::supported() {
                let got = self.run(&pool, isa);
                let v_max = self.v.f32s.iter().fold(0f32, |m, v| m.max(v.abs()));
                assert_close(
                    &got,
                    &want,
                    v_max as f64,
                    &format!("{what}, {isa}, {threads} threads"),
                );
            }
        }
    }
}

/// Every output within 1e-6 of `v_max`, the largest |v|: an output is a
/// convex combination of V rows, so its f32 rounding is relative to them (a
/// mean of thousands of random rows is itself small).
fn assert_close(got: &[f32], want: &[f64], v_max: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w).abs() / v_max;
        assert!(
            err < 1e-6,
            "{what}: element {i}: got {g}, want {w} (rel {err:.2e})"
        );
    }
}

const MASKS: [Mask; 5] = [
    Mask::Causal,
    Mask::Sliding { window: 40 },
    Mask::Sliding { window: 3 },
    Mask::Full,
    Mask::Symmetric { half_width: 21 },
];

fn params(mask: Mask, hd: usize, softcap: Option<f32>) -> Params {
    Params {
        mask,
        scale: 1.0 / (hd as f32).sqrt(),
        softcap,
        split_keys: true,
    }
}

#[test]
fn head_dims_groups_and_masks_match_the_definition() {
    let mut r = Rng(7);
    for (hd, hdv) in [(1, 1), (7, 9), (64, 64), (256, 256)] {
        for (hq, hkv) in [(2, 2), (4, 2), (4, 1)] {
            for mask in MASKS {
                let p = params(mask, hd, None);
                let case = Case::ring(&mut r, (hq, hkv, hd, hdv), 37, 77, 77, p, Storage::F32);
                case.check(&format!("hd {hd}/{hdv}, heads {hq}/{hkv}, {mask:?}"));
            }
        }
    }
}

#[test]
fn softcap_and_half_precision_rows_match_the_definition() {
    let mut r = Rng(11);
    for storage in [Storage::F32, Storage::F16, Storage::BF16] {
        for (hd, cap) in [(7, Some(2.0)), (64, None), (256, Some(50.0))] {
            for mask in [Mask::Causal, Mask::Sliding { window: 40 }] {
                let p = params(mask, hd, cap);
                let case = Case::ring(&mut r, (4, 1, hd, hd), 5, 70, 70, p, storage);
                case.check(&format!("{storage:?}, hd {hd}, cap {cap:?}, {mask:?}"));
            }
        }
    }
}

#[test]
fn block_quantized_rows_match_the_definition() {
    // Keys and values stored as ggml's Q8_0 / Q4_0 blocks, dequantized per
    // block as the tiles read them; the definition runs on the same
    // dequantized values.
    let mut r = Rng(29);
    for storage in [Storage::Q8_0, Storage::Q4_0] {
        for hd in [32, 64, 256] {
            for (n, len, rows) in [(1, 70, 70), (5, 70, 70), (1, 2500, 3000)] {
                let p = params(Mask::Sliding { window: 2100 }, hd, None);
                let case = Case::ring(&mut r, (4, 2, hd, hd), n, len, rows, p, storage);
                case.check(&format!("{storage:?}, hd {hd}, n {n}, len {len}"));
            }
        }
    }
}

#[test]
fn rings_with_empty_rows_and_decode_match_the_definition() {
    let mut r = Rng(13);
    // (queries, positions so far, ring rows): empty rows at the end, a ring
    // that wrapped mid-block, single-query decode at several depths.
    for (n, len, rows) in [
        (9, 50, 97),
        (11, 150, 61),
        (1, 1, 40),
        (1, 200, 83),
        (3, 33, 33),
    ] {
        for mask in MASKS {
            for (hq, hkv) in [(1, 1), (2, 1), (4, 1), (8, 2)] {
                let p = params(mask, 16, None);
                let case = Case::ring(&mut r, (hq, hkv, 16, 16), n, len, rows, p, Storage::F32);
                case.check(&format!(
                    "n {n}, len {len}, rows {rows}, heads {hq}/{hkv}, {mask:?}"
                ));
            }
        }
    }
}

#[test]
fn long_decode_splits_keys_and_merges_the_parts() {
    let mut r = Rng(17);
    for storage in [Storage::F32, Storage::F16, Storage::BF16] {
        // Parts of at least 8 blocks of 32 keys: 2 to 6 parts at 3 threads.
        for (n, len, rows) in [(1, 2500, 3000), (2, 3300, 3100)] {
            for mask in [Mask::Causal, Mask::Sliding { window: 2100 }, Mask::Full] {
                let p = params(mask, 8, None);
                let case = Case::ring(&mut r, (4, 1, 8, 8), n, len, rows, p, storage);
                case.check(&format!("{storage:?}, n {n}, len {len}, {mask:?}"));
            }
        }
    }
}

#[test]
fn decode_reads_half_precision_rows_in_place() {
    let mut r = Rng(23);
    // One query: a single row tile, so f16 rows are read where they lie
    // (head sizes with and without a partial vector; up to 4 rows a tile).
    for storage in [Storage::F16, Storage::BF16] {
        for hd in [7, 16, 24, 64, 256] {
            for (hq, hkv) in [(1, 1), (2, 1), (4, 1), (3, 1), (8, 2)] {
                for (len, rows) in [(1, 40), (300, 300), (700, 512)] {
                    let p = params(Mask::Sliding { window: 512 }, hd, None);
                    let case = Case::ring(&mut r, (hq, hkv, hd, hd), 1, len, rows, p, storage);
                    case.check(&format!(
                        "{storage:?}, hd {hd}, heads {hq}/{hkv}, len {len}"
                    ));
                }
            }
        }
    }
}

#[test]
fn rows_in_any_order_with_spans_match_the_definition() {
    let mut r = Rng(19);
    for mask in MASKS {
        for with_spans in [false, true] {
            let rows = 130;
            let mut kpos: Vec<i64> = (0..rows as i64).collect();
            for t in (1..rows).rev() {
                kpos.swap(t, r.below(t + 1));
            }
            for t in 0..rows {
                if r.below(7) == 0 {
                    kpos[t] = -1;
                }
            }
            let qpos: Vec<i64> = (0..13).map(|_| r.below(rows) as i64).collect();
            let p = params(mask, 5, Some(3.0));
            let mut case = Case::new(&mut r, (4, 2, 5, 5), qpos, kpos, p, Storage::F16);
            if with_spans {
                case.kspan = (0..rows).map(|_| [0, 0, 1, 2][r.below(4)]).collect();
                case.qspan = Some((0..13).map(|_| [0, 1, 2][r.below(3)]).collect());
            }
            case.check(&format!("shuffled rows, spans {with_spans}, {mask:?}"));
        }
    }
}

#[test]
fn a_query_that_sees_no_key_gets_zeros() {
    let mut r = Rng(23);
    // Keys all after the queries (causal), or all empty.
    for kpos in [vec![50i64; 40], vec![-1i64; 40]] {
        let p = params(Mask::Causal, 8, None);
        let case = Case::new(&mut r, (4, 1, 8, 8), vec![3, 4, 5], kpos, p, Storage::F32);
        for isa in Isa::supported() {
            let out = case.run(&ThreadPool::new(2), isa);
            assert!(out.iter().all(|&x| x == 0.0), "{isa}");
        }
    }
}

#[test]
fn block_cover_agrees_with_every_pair() {
    let mut r = Rng(29);
    let masks = [
        Mask::Causal,
        Mask::Sliding { window: 1 },
        Mask::Sliding { window: 5 },
        Mask::Full,
        Mask::Symmetric { half_width: 0 },
        Mask::Symmetric { half_width: 4 },
    ];
    for _ in 0..2000 {
        let (qmin, kmin) = (r.below(30) as i64, r.below(30) as i64);
        let (qmax, kmax) = (qmin + r.below(8) as i64, kmin + r.below(8) as i64);
        for mask in masks {
            let (none, all) = cover(mask, (qmin, qmax), (kmin, kmax));
            let pairs = || (qmin..=qmax).flat_map(|qp| (kmin..=kmax).map(move |kp| (qp, kp)));
            let seen = |(qp, kp)| visible(mask, qp, kp, 0, 0);
            assert_eq!(
                none,
                !pairs().any(seen),
                "{mask:?} q {qmin}..={qmax} k {kmin}..={kmax}"
            );
            assert_eq!(
                all,
                pairs().all(seen),
                "{mask:?} q {qmin}..={qmax} k {kmin}..={kmax}"
            );
        }
    }
}

/// Every instruction set's K/V widening gives `half`'s bits for every f16
/// and bf16 value, NaNs (made quiet) included, at every length's tail.
#[test]
fn widening_gives_halfs_bits_for_every_value() {
    let all: Vec<u16> = (0..=u16::MAX).collect();
    for isa in Isa::supported() {
        let tiles = Tiles::new(isa);
        for len in [all.len(), all.len() - 3] {
            let src = &all[..len];
            let (mut f16, mut bf16) = (vec![0f32; len], vec![0f32; len]);
            // SAFETY: `Tiles::new` hands out kernels for this CPU only.
            unsafe {
                (tiles.widen_f16)(src, &mut f16);
                (tiles.widen_bf16)(src, &mut bf16);
            }
            for (i, &b) in src.iter().enumerate() {
                let (want16, wantb) = (
                    half::f16::from_bits(b).to_f32().to_bits(),
                    half::bf16::from_bits(b).to_f32().to_bits(),
                );
                assert_eq!(f16[i].to_bits(), want16, "{isa} f16 {b:#06x}");
                assert_eq!(bf16[i].to_bits(), wantb, "{isa} bf16 {b:#06x}");
            }
        }
    }
}
