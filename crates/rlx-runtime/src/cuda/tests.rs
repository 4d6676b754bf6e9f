//! The kernels compile (needs libnvrtc only), and the CUDA backend matches
//! the CPU's on a small transformer with packed weights (needs a GPU):
//! `LD_LIBRARY_PATH=<dir of libnvrtc.so> cargo test -p rlx-runtime
//! --features cuda --lib -- --ignored cuda::tests`.

use std::sync::Arc;

use rlx_gguf::{GgmlType, GgufFile, GgufWriter};
use rlx_ir::{
    AttentionSpec, Bindings, CacheSlot, DType, Dim, Graph, KvSource, Mask, NodeId, RopeSpec, Shape,
    Sym,
};

use super::plan::MetaLayout;
use crate::backend::{open, Backend, BackendOptions, Device, Executable};
use crate::batch::{Batch, SeqId};
use crate::compile::CompileOptions;
use crate::compile::{StepInput, StepInputs};
use crate::kv::{KvDType, KvLayerSpec, KvPool, KvPoolConfig, KvTypes, BLOCK_TOKENS};
use crate::weights::WeightStore;

const D: usize = 256;
const HQ: usize = 4;
const HKV: usize = 2;
const HD: usize = 64;
const FF: usize = 512;
const VOCAB: usize = 96;
/// Layer 0 slides over this many tokens (and drops blocks), layer 1 sees
/// everything, layer 2 reads layer 1's K/V.
const WINDOW: usize = 40;
const LAYERS: usize = 3;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

fn store() -> Arc<WeightStore> {
    let mut r = Rng(7);
    let mut w = GgufWriter::new();
    w.add("general.architecture", "test").unwrap();
    let mut add = |w: &mut GgufWriter, name: &str, ty: GgmlType, rows: usize, k: usize| {
        let x: Vec<f32> = (0..rows * k).map(|_| r.next() * 0.3).collect();
        let bytes = match ty {
            GgmlType::F32 => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
            _ => rlx_gguf::quantize_to_vec(ty, &x).unwrap(),
        };
        let dims: Vec<u64> = if rows == 1 {
            vec![k as u64]
        } else {
            vec![k as u64, rows as u64]
        };
        w.add_tensor(name, ty, &dims, bytes).unwrap();
    };
    add(&mut w, "token_embd.weight", GgmlType::Q8_0, VOCAB, D);
    add(&mut w, "output_norm.weight", GgmlType::F32, 1, D);
    for l in 0..LAYERS {
        let p = |s: &str| format!("blk.{l}.{s}");
        add(&mut w, &p("attn_norm.weight"), GgmlType::F32, 1, D);
        add(&mut w, &p("attn_q.weight"), GgmlType::Q4_K, HQ * HD, D);
        add(&mut w, &p("attn_k.weight"), GgmlType::Q5_0, HKV * HD, D);
        add(&mut w, &p("attn_v.weight"), GgmlType::Q8_0, HKV * HD, D);
        add(&mut w, &p("attn_output.weight"), GgmlType::Q6_K, D, HQ * HD);
        add(&mut w, &p("ffn_gate.weight"), GgmlType::Q4_0, FF, D);
        add(&mut w, &p("ffn_up.weight"), GgmlType::Q4_K, FF, D);
        add(&mut w, &p("ffn_down.weight"), GgmlType::Q8_0, D, FF);
        add(&mut w, &p("attn_q_norm.weight"), GgmlType::F32, 1, HD);
        add(&mut w, &p("attn_k_norm.weight"), GgmlType::F32, 1, HD);
    }
    let file = GgufFile::from_bytes(w.to_bytes()).unwrap();
    Arc::new(WeightStore::new(Arc::new(file)))
}

/// GPU 0, its kernels kept between test processes (each would otherwise
/// compile kernels.cu, a minute or more).
fn gpu_device() -> Arc<super::CudaDevice> {
    super::CudaDevice::with_kernel_cache(0, Some(&test_kernel_cache())).unwrap()
}

fn test_kernel_cache() -> std::path::PathBuf {
    std::env::temp_dir().join("rlx-test-kernels")
}

/// Options that open GPU 0 with [`test_kernel_cache`].
fn gpu_options(threads: usize) -> BackendOptions {
    BackendOptions {
        kernel_cache: Some(test_kernel_cache()),
        ..BackendOptions::threads(threads)
    }
}

fn seq() -> Dim {
    Dim::Sym(Sym::SEQ)
}

/// Tokens and positions in, logits of the `logit_rows` rows out.
fn model_graph(s: &WeightStore) -> Graph {
    let mut g = Graph::new();
    let tokens = g.input("tokens", DType::I32, Shape::new([seq()]));
    let pos = g.input("pos", DType::I32, Shape::new([seq()]));
    let rows = g.input("logit_rows", DType::I32, Shape::new([Dim::Sym(Sym::ROWS)]));
    let embd = s.node(&mut g, "token_embd.weight").unwrap();
    let x = g.gather(embd, tokens).unwrap();
    let mut x = g.scale(x, (D as f32).sqrt()).unwrap();
    let rope = RopeSpec {
        n_rot: HD,
        base: 10000.0,
        freq_scale: 1.0,
        has_freq_factors: false,
    };
    let mut writes = Vec::new();
    for l in 0..LAYERS {
        let w = |g: &mut Graph, name: &str| s.node(g, &format!("blk.{l}.{name}")).unwrap();
        let norm = w(&mut g, "attn_norm.weight");
        let h = g.rms_norm(x, Some(norm), 1e-6).unwrap();
        let wq = w(&mut g, "attn_q.weight");
        let q = g.matmul(h, wq).unwrap();
        let q = g
            .reshape(q, Shape::new([seq(), HQ.into(), HD.into()]))
            .unwrap();
        // Per-head norms before the rope (q everywhere, k in layer 0 only,
        // so that a rope of an unnormed head stays too).
        let qn = w(&mut g, "attn_q_norm.weight");
        let q = g.rms_norm(q, Some(qn), 1e-6).unwrap();
        let q = g.rope(q, pos, rope, None).unwrap();
        // Layer 2 reads layer 1's K/V after layer 1's write.
        let (slot, written) = if l == 2 {
            (CacheSlot(1), writes[1])
        } else {
            let (wk, wv) = (w(&mut g, "attn_k.weight"), w(&mut g, "attn_v.weight"));
            let k = g.matmul(h, wk).unwrap();
            let v = g.matmul(h, wv).unwrap();
            let k = g
                .reshape(k, Shape::new([seq(), HKV.into(), HD.into()]))
                .unwrap();
            let v = g
                .reshape(v, Shape::new([seq(), HKV.into(), HD.into()]))
                .unwrap();
            let k = if l == 0 {
                let kn = w(&mut g, "attn_k_norm.weight");
                g.rms_norm(k, Some(kn), 1e-6).unwrap()
            } else {
                k
            };
            let k = g.rope(k, pos, rope, None).unwrap();
            let slot = CacheSlot(l as u32);
            (slot, g.kv_write(slot, k, v).unwrap())
        };
        writes.push(written);
        let mask = if l == 0 {
            Mask::Sliding { window: WINDOW }
        } else {
            Mask::Causal
        };
        let spec = AttentionSpec {
            mask,
            scale: 1.0 / (HD as f32).sqrt(),
            softcap: Some(50.0),
            kv: KvSource::Inputs,
            bidirectional_spans: false,
        };
        let a = g.attention_cached(q, written, slot, spec, None).unwrap();
        let a = g.reshape(a, Shape::new([seq(), (HQ * HD).into()])).unwrap();
        let wo = w(&mut g, "attn_output.weight");
        let o = g.matmul(a, wo).unwrap();
        x = g.add(x, o).unwrap();
        let (wg, wu, wd) = (
            w(&mut g, "ffn_gate.weight"),
            w(&mut g, "ffn_up.weight"),
            w(&mut g, "ffn_down.weight"),
        );
        let gate = g.matmul(x, wg).unwrap();
        let up = g.matmul(x, wu).unwrap();
        let act = g.geglu(gate, up).unwrap();
        let down = g.matmul(act, wd).unwrap();
        x = g.add(x, down).unwrap();
    }
    let x: NodeId = g.take_rows(x, rows).unwrap();
    let norm = s.node(&mut g, "output_norm.weight").unwrap();
    let h = g.rms_norm(x, Some(norm), 1e-6).unwrap();
    let logits = g.matmul(h, embd).unwrap();
    g.output("logits", logits);
    g
}

fn pool(backend: &dyn Backend) -> KvPool {
    pool_of(backend, KvDType::F32)
}

fn pool_of(backend: &dyn Backend, dtype: KvDType) -> KvPool {
    let spec = |window, shares| KvLayerSpec {
        kv_heads: HKV,
        head_dim: HD,
        v_head_dim: HD,
        window,
        shares,
    };
    backend
        .kv_pool(KvPoolConfig {
            layers: vec![
                spec(Some(WINDOW), None),
                spec(None, None),
                spec(None, Some(CacheSlot(1))),
            ],
            types: KvTypes::both(dtype),
            tokens: 4 * 160,
            max_seqs: 4,
            max_chunk: 48,
        })
        .unwrap()
}

fn token(seq: SeqId, pos: usize) -> u32 {
    ((pos * 37 + seq.0 as usize * 11 + 5) % VOCAB) as u32
}

/// Adds `n` tokens of `seq` at its length; `all` asks for every row's
/// logits, otherwise the last row's.
fn push(b: &mut Batch, kv: &KvPool, seq: SeqId, n: usize, all: bool) {
    let start = kv.len(seq).unwrap();
    let toks: Vec<u32> = (start..start + n).map(|p| token(seq, p)).collect();
    b.push_run(seq, start, &toks, |i| all || i == n - 1);
}

/// The steps of a scenario on one pool: mixed prefill chunks that cross
/// blocks, a fork (copy on write), decode steps of three sequences in
/// changing order, a sliding window that drops blocks, a truncation inside
/// a shared block and a freed sequence. `step` runs each batch.
fn drive(kv: &mut KvPool, step: &mut dyn FnMut(&mut KvPool, &Batch)) {
    let (a, b) = (kv.add_sequence(), kv.add_sequence());
    let mut batch = Batch::new();
    push(&mut batch, kv, a, 40, false);
    push(&mut batch, kv, b, 7, true);
    step(kv, &batch);
    let mut batch = Batch::new();
    push(&mut batch, kv, b, 5, true);
    push(&mut batch, kv, a, 30, false);
    step(kv, &batch);
    let c = kv.fork(a).unwrap();
    for i in 0..40 {
        let mut batch = Batch::new();
        let order = if i % 2 == 0 { [a, b, c] } else { [c, a, b] };
        for seq in order {
            push(&mut batch, kv, seq, 1, true);
        }
        step(kv, &batch);
    }
    // B rewinds inside a block it shares with a fork: the fork keeps the
    // rows past B's new length, which B must not see.
    let d = kv.fork(b).unwrap();
    let len = kv.len(b).unwrap();
    kv.truncate(b, len - 3).unwrap();
    kv.free(c).unwrap();
    for _ in 0..3 {
        let mut batch = Batch::new();
        push(&mut batch, kv, d, 1, true);
        push(&mut batch, kv, b, 1, true);
        step(kv, &batch);
    }
    let mut batch = Batch::new();
    push(&mut batch, kv, a, 33, true);
    push(&mut batch, kv, b, 2, false);
    push(&mut batch, kv, d, 1, true);
    step(kv, &batch);
}

/// The scenario's logits on `backend`: batches of up to 3 rows on a decode
/// plan of 3 rows (full ones replay its captured graph), the others on a
/// prefill plan.
fn scenario(backend: &dyn Backend, dtype: KvDType) -> Vec<Vec<f32>> {
    let g = model_graph(backend.store());
    let compile = |rows: usize| -> Box<dyn Executable> {
        let max = Bindings::new().with(Sym::SEQ, rows).with(Sym::ROWS, rows);
        backend.compile(&g, &CompileOptions::new(max)).unwrap()
    };
    let (mut prefill, mut decode) = (compile(64), compile(3));
    let mut out = Vec::new();
    drive(&mut pool_of(backend, dtype), &mut |kv, b| {
        let p = if b.len() <= 3 {
            &mut decode
        } else {
            &mut prefill
        };
        let o = p.run(b, Some(kv)).unwrap();
        let logits = o.get("logits").unwrap();
        assert_eq!(logits.shape(), &[b.logit_rows().len(), VOCAB]);
        out.push(logits.as_f32().unwrap().to_vec());
        kv.check_invariants().unwrap();
    });
    out
}

/// The keys a query row of the attention kernel reads from the staged
/// metadata, as (storage row, position) pairs, read as the kernel does.
fn kernel_keys(ml: &MetaLayout, stage: &[i32], g: usize, qi: usize) -> Vec<(usize, i64)> {
    let r = stage[ml.run_of_row() + qi] as usize;
    let end = stage[ml.run_end() + r] as i64;
    let (e0, e1) = (
        stage[ml.block_start(g) + r] as usize,
        stage[ml.block_start(g) + r + 1] as usize,
    );
    let mut keys = Vec::new();
    for e in e0..e1 {
        let (phys, lb) = (stage[ml.table() + 2 * e], stage[ml.table() + 2 * e + 1]);
        for i in 0..BLOCK_TOKENS {
            let kp = lb as i64 * BLOCK_TOKENS as i64 + i as i64;
            if kp < end {
                keys.push((phys as usize * BLOCK_TOKENS + i, kp));
            }
        }
    }
    keys
}

/// What the device kernels read of a step (staged as a plan uploads it,
/// positions derived from logical blocks) is what the CPU reads of the pool
/// (its rows' recorded positions), at every step of the scenario.
#[test]
fn staged_metadata_gives_the_pools_keys_and_rows() {
    let s = store();
    let cpu = open(Device::Cpu, &s, &BackendOptions::threads(1)).unwrap();
    let mut ml = MetaLayout {
        rows: 64,
        groups: 0,
        cap: 0,
        spans: true,
    };
    let mut stage = Vec::new();
    let mut steps = 0;
    drive(&mut pool(&*cpu), &mut |kv, b| {
        let layout = kv.prepare(b).unwrap();
        if let Some(new) = ml.refit(&layout, || {
            kv.config().groups().iter().map(|g| g.blocks).sum()
        }) {
            assert!(new.cap >= ml.cap);
            ml = new;
        }
        assert!(ml.refit(&layout, || 0).is_none());
        // Span ids as a K/V write records them: some rows in a span.
        for g in 0..ml.groups {
            for (i, &row) in layout.write_rows[g].iter().enumerate() {
                kv.set_span(g, row, ((steps + i) % 3) as i32);
            }
        }
        let inputs = StepInputs::new(b, &[]);
        ml.stage(&inputs, Some((&*kv, &layout)), &mut stage);
        assert!(stage.len() <= ml.len());
        let pos_at = ml.input(StepInput::Pos);
        assert_eq!(&stage[pos_at..][..b.len()], b.positions());
        for g in 0..ml.groups {
            let rows = kv.rows(g);
            assert_eq!(
                &stage[ml.write_rows(g)..][..b.len()],
                layout.write_rows[g]
                    .iter()
                    .map(|&r| r as i32)
                    .collect::<Vec<_>>()
            );
            for (ri, run) in layout.runs.iter().enumerate() {
                let mut want: Vec<(usize, i64)> = layout.blocks[g][ri]
                    .iter()
                    .flat_map(|&blk| {
                        (0..BLOCK_TOKENS).map(move |i| blk as usize * BLOCK_TOKENS + i)
                    })
                    .filter(|&row| rows.pos[row] >= 0)
                    .map(|row| (row, rows.pos[row]))
                    .collect();
                want.sort();
                for qi in run.rows.clone() {
                    let mut got = kernel_keys(&ml, &stage, g, qi);
                    got.sort();
                    assert_eq!(got, want, "step {steps}, group {g}, row {qi}");
                }
                // Each listed block's rows carry the pool's span ids.
                let first = stage[ml.block_start(g) + ri] as usize;
                for (j, &blk) in layout.blocks[g][ri].iter().enumerate() {
                    let at = blk as usize * BLOCK_TOKENS;
                    assert_eq!(
                        &stage[ml.spans() + (first + j) * BLOCK_TOKENS..][..BLOCK_TOKENS],
                        &rows.span[at..at + BLOCK_TOKENS],
                        "step {steps}, group {g}, run {ri}"
                    );
                }
            }
        }
        kv.commit(&layout);
        steps += 1;
    });
    assert_eq!(steps, 46);
}

#[test]
fn decode_products_take_their_blocks_from_the_kernel_before() {
    // Post-norm, residual add, pre-norm folded into gate/up, GeGLU, down:
    // the add (with the post-norm inside it) writes gate/up's 8-bit blocks
    // and GeGLU writes down's. Needs no GPU: the plan's analysis alone.
    use super::plan::{find_prologues, Prologue};
    let s = store();
    let build = |keep_norm: bool| {
        let mut g = Graph::new();
        let x = g.input("x", DType::F32, Shape::new([seq(), D.into()]));
        let w = |g: &mut Graph, name: &str| s.node(g, &format!("blk.0.{name}.weight")).unwrap();
        let wo = w(&mut g, "attn_output");
        let o = g.matmul(x, wo).unwrap();
        let pn = w(&mut g, "attn_norm");
        let n = g.rms_norm(o, Some(pn), 1e-6).unwrap();
        let sum = g.add(x, n).unwrap();
        let fnorm = s.node(&mut g, "output_norm.weight").unwrap();
        let h = g.rms_norm(sum, Some(fnorm), 1e-6).unwrap();
        let (wg, wu, wd) = (
            w(&mut g, "ffn_gate"),
            w(&mut g, "ffn_up"),
            w(&mut g, "ffn_down"),
        );
        let gate = g.matmul(h, wg).unwrap();
        let up = g.matmul(h, wu).unwrap();
        let act = g.geglu(gate, up).unwrap();
        let down = g.matmul(act, wd).unwrap();
        let y = g.add(sum, down).unwrap();
        g.output("y", y);
        if keep_norm {
            // A value the caller reads is computed, not folded away.
            g.output("n", n);
        }
        g
    };
    for keep_norm in [false, true] {
        let max = Bindings::new().with(Sym::SEQ, 1).with(Sym::ROWS, 1);
        let g = super::super::compile::prepare(
            &build(keep_norm),
            &s,
            &CompileOptions::new(max.clone()),
        )
        .unwrap();
        let sched = super::super::compile::schedule(&g, &max, &|_| None).unwrap();
        let (prologues, folded) = find_prologues(&g, &sched.steps, &sched.locs);
        let kinds: Vec<Prologue> = {
            let mut v: Vec<_> = prologues.values().copied().collect();
            v.sort_by_key(|p| matches!(p, Prologue::GeGlu));
            v
        };
        let norm_folded = matches!(kinds.first(), Some(Prologue::AddNorm { norm: Some(_) }));
        assert_eq!(kinds.len(), 2, "{keep_norm}: {kinds:?}");
        assert_eq!(kinds[1], Prologue::GeGlu);
        assert_eq!(norm_folded, !keep_norm, "{kinds:?}");
        // The add and GeGLU fold, and the norm unless it is an output.
        assert_eq!(folded.len(), if keep_norm { 2 } else { 3 });
    }
}

/// Each q/k norm runs with the rope after it in one launch, at decode and
/// at prompt sizes; a rope with no norm before it runs alone. Needs no GPU.
#[test]
fn head_norms_run_with_their_rope() {
    use super::plan::find_norm_ropes;
    let s = store();
    for rows in [1, 64] {
        let max = Bindings::new().with(Sym::SEQ, rows).with(Sym::ROWS, rows);
        let g =
            super::super::compile::prepare(&model_graph(&s), &s, &CompileOptions::new(max.clone()))
                .unwrap();
        let sched = super::super::compile::schedule(&g, &max, &|_| None).unwrap();
        let pairs = find_norm_ropes(&g, &sched.steps, &sched.locs, &max);
        let ropes = g
            .ids()
            .filter(|&id| matches!(g.node(id).op, rlx_ir::Op::Rope(_)))
            .count();
        // q in every layer, k in layer 0; layer 1's k rope has no norm.
        assert_eq!(ropes, LAYERS + 2, "{rows} rows");
        assert_eq!(pairs.len(), LAYERS + 1, "{rows} rows: {pairs:?}");
        for (&norm, &rope) in &pairs {
            assert!(matches!(g.node(norm).op, rlx_ir::Op::RmsNorm(_)));
            assert_eq!(g.node(rope).inputs[0], norm);
        }
    }
}

/// `rms_norm_rope` gives bit for bit what `rms_norm` then `rope` give, for
/// whole and partial rotation and heads up to 512, also in place.
#[test]
#[ignore = "needs a CUDA GPU"]
fn head_norm_and_rope_in_one_launch_match_the_two_kernels() {
    let dev = gpu_device();
    let s = &dev.stream;
    let mut r = Rng(11);
    let (n, heads) = (3usize, 4usize);
    let eps = u64::from(1e-6f32.to_bits());
    for (hd, n_rot) in [(64usize, 64usize), (256, 256), (512, 128)] {
        let x: Vec<f32> = (0..n * heads * hd).map(|_| r.next() * 3.0).collect();
        let gamma: Vec<f32> = (0..hd).map(|_| 1.0 + r.next()).collect();
        let pos: Vec<i32> = (0..n as i32).map(|t| 7 + 1000 * t).collect();
        let spec = RopeSpec {
            n_rot,
            base: 10000.0,
            freq_scale: 1.0,
            has_freq_factors: false,
        };
        let inv = s.clone_htod(&spec.inv_freqs(None)).unwrap();
        let (xg, gg, pg) = (
            s.clone_htod(&x).unwrap(),
            s.clone_htod(&gamma).unwrap(),
            s.clone_htod(&pos).unwrap(),
        );
        let rows_cfg = super::plan::norm_rows(n * heads, hd);
        let normed = s.alloc_zeros::<f32>(x.len()).unwrap();
        launch_raw(
            s,
            &dev.kernels.rms_norm,
            rows_cfg,
            &[dev.ptr(&xg), dev.ptr(&gg), dev.ptr(&normed), hd as u64, eps],
        );
        let two = s.alloc_zeros::<f32>(x.len()).unwrap();
        launch_raw(
            s,
            &dev.kernels.rope,
            super::plan::linear(x.len()),
            &[
                dev.ptr(&normed),
                dev.ptr(&pg),
                dev.ptr(&inv),
                dev.ptr(&two),
                n as u64,
                heads as u64,
                hd as u64,
                n_rot as u64,
            ],
        );
        let want = s.clone_dtoh(&two).unwrap();
        let one = s.alloc_zeros::<f32>(x.len()).unwrap();
        let inplace = s.clone_htod(&x).unwrap();
        for out in [&one, &inplace] {
            let src = if std::ptr::eq(out, &inplace) {
                &inplace
            } else {
                &xg
            };
            launch_raw(
                s,
                &dev.kernels.rms_norm_rope,
                rows_cfg,
                &[
                    dev.ptr(src),
                    dev.ptr(&gg),
                    dev.ptr(out),
                    hd as u64,
                    eps,
                    dev.ptr(&pg),
                    dev.ptr(&inv),
                    heads as u64,
                    n_rot as u64,
                ],
            );
            let got = s.clone_dtoh(out).unwrap();
            let same = got
                .iter()
                .map(|v| v.to_bits())
                .eq(want.iter().map(|v| v.to_bits()));
            assert!(
                same,
                "hd {hd} n_rot {n_rot}: rms_norm_rope differs (in place: {})",
                std::ptr::eq(out, &inplace)
            );
        }
    }
}

fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den).sqrt()
}

/// The CPU and GPU 0 backends over the same weights.
fn cpu_and_gpu(s: &Arc<WeightStore>) -> (Arc<dyn Backend>, Arc<dyn Backend>) {
    let cpu = open(Device::Cpu, s, &BackendOptions::threads(2)).unwrap();
    (cpu, open(Device::Cuda(0), s, &gpu_options(2)).unwrap())
}

#[test]
#[ignore = "needs a GPU"]
fn paged_batches_match_the_cpu() {
    let s = store();
    let (cpu, gpu) = cpu_and_gpu(&s);
    // Rounding to a smaller type can turn a last-bit difference into one
    // unit of that type now and then (see rlx-gemma's tests/cuda.rs).
    for (dtype, bound) in [
        (KvDType::F32, 1e-4),
        (KvDType::F16, 1e-3),
        (KvDType::BF16, 5e-3),
        (KvDType::Q8_0, 2e-2),
        (KvDType::Q4_0, 5e-2),
    ] {
        let want = scenario(&*cpu, dtype);
        let got = scenario(&*gpu, dtype);
        assert_eq!(want.len(), got.len());
        let mut worst = 0f64;
        for (i, (w, g)) in want.iter().zip(&got).enumerate() {
            assert_eq!(w.len(), g.len(), "step {i}");
            let err = rel_l2(g, w);
            assert!(
                err < bound,
                "{dtype} K/V, step {i}: CUDA vs CPU relative L2 {err}"
            );
            worst = worst.max(err);
        }
        println!("{dtype} K/V: worst relative L2 {worst:.2e}");
    }
}

#[test]
#[ignore = "needs a GPU"]
fn a_pool_of_another_device_is_an_error() {
    let s = store();
    let opts = BackendOptions::threads(1);
    let cpu = open(Device::Cpu, &s, &opts).unwrap();
    let gpu = open(Device::Cuda(0), &s, &gpu_options(1)).unwrap();
    let max = Bindings::new().with(Sym::SEQ, 4).with(Sym::ROWS, 4);
    let mut plan = gpu
        .compile(&model_graph(s.as_ref()), &CompileOptions::new(max))
        .unwrap();
    let mut kv = pool(&*cpu);
    let seq = kv.add_sequence();
    let mut b = Batch::new();
    push(&mut b, &kv, seq, 2, true);
    let e = plan.run(&b, Some(&mut kv)).unwrap_err();
    assert!(e.to_string().contains("another device"), "{e}");
    // Nothing changed: the sequence still starts at 0.
    assert_eq!(kv.len(seq).unwrap(), 0);
    let e = plan.run(&b, None).unwrap_err();
    assert!(e.to_string().contains("no cache"), "{e}");
}

#[test]
#[ignore = "needs libnvrtc"]
fn kernels_compile_with_nvrtc() {
    let cache = std::env::temp_dir().join(format!("rlx-nvrtc-cache-{}", std::process::id()));
    for (major, minor) in [(7, 5), (8, 0), (9, 0)] {
        // Through a kernel cache: compiled the first time and kept whole,
        // read back (not compiled) the second.
        let ptx = match super::compile_kernels_cached(major, minor, Some(&cache)) {
            Ok(ptx) => ptx.to_src(),
            Err(e) => panic!("sm_{major}{minor}: {e}"),
        };
        let arch = format!("compute_{major}{minor}");
        let kept = std::fs::read_dir(&cache)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| {
                std::fs::read_to_string(p)
                    .unwrap()
                    .lines()
                    .next()
                    .unwrap()
                    .ends_with(&arch)
            })
            .unwrap();
        let text = std::fs::read_to_string(&kept).unwrap();
        let (key, body) = text.split_once('\n').unwrap();
        assert_eq!(body, ptx, "sm_{major}{minor}: the kept PTX");
        std::fs::write(&kept, format!("{key}\nmarker")).unwrap();
        let again = super::compile_kernels_cached(major, minor, Some(&cache)).unwrap();
        assert_eq!(again.to_src(), "marker", "sm_{major}{minor}: not read back");
        if major == 9 {
            // Machine code for the device's own architecture: an ELF image,
            // kept beside the PTX under its own key and read back.
            let bin = super::compile_kernels_cubin(major, minor).unwrap();
            assert!(bin.starts_with(b"\x7fELF"), "sm_90: not a cubin");
            let via_cache =
                super::cached_bytes(&cache, &super::kernels_key("sm_90"), "cubin", || {
                    Ok::<_, super::CudaError>(bin.clone())
                })
                .unwrap();
            assert!(via_cache.starts_with(b"\x7fELF"));
            let kept = super::cached_bytes::<super::CudaError>(
                &cache,
                &super::kernels_key("sm_90"),
                "cubin",
                || panic!("sm_90: the machine code was not kept"),
            )
            .unwrap();
            assert_eq!(kept, via_cache);
        }
        // Plans on sm_90 launch every kernel as a programmatic dependent of
        // the one before: a kernel that touched memory without waiting for
        // its predecessor would read values not yet written.
        // Tensor-core products need 8.0; below, their kernels are empty.
        for op in ["mma.sync", "cp.async"] {
            assert_eq!(ptx.contains(op), major >= 8, "sm_{major}{minor}: {op}");
        }
        let entries: Vec<&str> = ptx.split(".entry ").skip(1).collect();
        assert!(
            entries.len() > 100,
            "sm_{major}{minor}: {} entries",
            entries.len()
        );
        for e in entries {
            let name = e.split('(').next().unwrap_or(e).trim();
            let waits = e.contains("griddepcontrol.wait");
            assert_eq!(
                waits,
                major >= 9,
                "sm_{major}{minor}: {name} waits: {waits}"
            );
        }
    }
    std::fs::remove_dir_all(&cache).unwrap();
}

/// Launches kernel `f` with `args` as u64 values, which the kernels read as
/// pointers or (little-endian) integers and floats.
fn launch_raw(
    s: &Arc<cudarc::driver::CudaStream>,
    f: &cudarc::driver::CudaFunction,
    cfg: cudarc::driver::LaunchConfig,
    args: &[u64],
) {
    use cudarc::driver::PushKernelArg;
    let mut b = s.launch_builder(f);
    for a in args {
        b.arg(a);
    }
    // SAFETY: every caller passes its kernel's arguments in order, pointers
    // to buffers it allocated of the sizes the kernel reads and writes.
    unsafe { b.launch(cfg) }.unwrap();
}

/// Random blocks of `ty` for `rows × k` elements: every code bit random, the
/// scales random but finite and modest (a NaN or infinite scale decodes the
/// same nowhere), float types random finite values.
fn random_rows(ty: GgmlType, rows: usize, k: usize, r: &mut Rng) -> Vec<u8> {
    let n = rows * k;
    let mut byte = || (r.next().to_bits() >> 7) as u8;
    match ty {
        GgmlType::F32 => (0..n)
            .flat_map(|_| (byte() as f32 - 128.0).to_le_bytes())
            .collect(),
        GgmlType::F16 => (0..n)
            .flat_map(|_| half::f16::from_f32(byte() as f32 / 64.0 - 2.0).to_le_bytes())
            .collect(),
        GgmlType::BF16 => (0..n)
            .flat_map(|_| half::bf16::from_f32(byte() as f32 / 64.0 - 2.0).to_le_bytes())
            .collect(),
        _ => {
            let bytes = ty.block_bytes();
            let mut out: Vec<u8> = (0..n / ty.block_elems() * bytes).map(|_| byte()).collect();
            // Byte offsets of each block's f16 scales.
            let halves: &[usize] = match ty {
                GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
                GgmlType::Q6_K => &[208],
                GgmlType::Q2_K => &[80, 82],
                GgmlType::Q3_K => &[108],
                GgmlType::MXFP4 => &[],
                _ => &[0],
            };
            for block in out.chunks_exact_mut(bytes) {
                for &at in halves {
                    let v = (block[at] as f32 / 255.0 + 0.1) * 0.01;
                    block[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
                }
                if ty == GgmlType::MXFP4 {
                    // E8M0 exponents around 2^-8.
                    block[0] = 112 + block[0] % 16;
                }
            }
            out
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn every_type_decodes_as_the_reference() {
    // Each type's decoder on the GPU, as the gather, dequantization and
    // fallback product kernels read it, against rlx_gguf::dequantize on
    // random blocks. The product reads it through one-hot activations, so
    // each output is one weight.
    use cudarc::driver::LaunchConfig;
    let dev = gpu_device();
    let s = &dev.stream;
    let (rows, k) = (3usize, 512usize);
    let mut r = Rng(11);
    let launch = |f: &cudarc::driver::CudaFunction, cfg: LaunchConfig, args: &[u64]| {
        launch_raw(s, f, cfg, args)
    };
    let mut failures = Vec::new();
    for (code, &(ty, name)) in super::TYPES.iter().enumerate() {
        let bytes = random_rows(ty, rows, k, &mut r);
        let want = rlx_gguf::dequantize_to_vec(ty, &bytes).unwrap();
        let w = s.clone_htod(&bytes).unwrap();
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let mut check = |what: &str, got: &[f32], want: &[f32]| {
            let worst = got
                .iter()
                .zip(want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            // f32 rounding of the same formula (or a fused multiply-add).
            if worst > 1e-6 * scale {
                failures.push(format!("{name} {what}: off by {worst:e} (scale {scale:e})"));
            }
        };
        let k32 = |v: usize| v as u64;
        // dequant: rows → [rows, k] f32.
        let out = s.alloc_zeros::<f32>(rows * k).unwrap();
        launch(
            &dev.kernels.dequant[code],
            super::plan::linear(rows * k / 32),
            &[dev.ptr(&w), dev.ptr(&out), k32(rows), k32(k), 0],
        );
        check("dequant", &s.clone_dtoh(&out).unwrap(), &want);
        // gather of rows 2, 0, 1.
        let ids = s.clone_htod(&[2i32, 0, 1]).unwrap();
        let out = s.alloc_zeros::<f32>(rows * k).unwrap();
        launch(
            &dev.kernels.gather[code],
            super::plan::linear(rows * k / 32),
            &[dev.ptr(&w), dev.ptr(&ids), dev.ptr(&out), k32(rows), k32(k)],
        );
        let mut permuted = want[2 * k..].to_vec();
        permuted.extend_from_slice(&want[..2 * k]);
        check("gather", &s.clone_dtoh(&out).unwrap(), &permuted);
        // matmul against the k one-hot rows: y [k, rows] = wᵀ.
        let mut x = vec![0f32; k * k];
        for t in 0..k {
            x[t * k + t] = 1.0;
        }
        let x = s.clone_htod(&x).unwrap();
        let y = s.alloc_zeros::<f32>(k * rows).unwrap();
        launch(
            &dev.kernels.matmul[code],
            LaunchConfig {
                grid_dim: (rows.div_ceil(4) as u32, k.div_ceil(8) as u32, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            },
            &[
                dev.ptr(&w),
                dev.ptr(&x),
                dev.ptr(&y),
                k32(k),
                k32(rows),
                k32(k),
                k32(rows),
                0,
            ],
        );
        let y = s.clone_dtoh(&y).unwrap();
        let transposed: Vec<f32> = (0..rows * k).map(|i| y[(i % k) * rows + i / k]).collect();
        check("matmul", &transposed, &want);
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
#[ignore = "needs a GPU"]
fn decode_products_match_the_reference() {
    // The 8-bit activation blocks against ggml's reference quantizer (bit
    // for bit), the kernels that write them for a product (a norm, GeGLU, a
    // residual add between norms) against the kernels they replace (bit for
    // bit), then each type's products of 1, 3 and 8 activation rows,
    // both kernels of each (one row, up to eight) and both modes, against
    // f64 sums over the reference's dequantized weights: `exact` with the
    // f32 activations, `q8` with the activations its blocks decode to.
    use cudarc::driver::LaunchConfig;
    let dev = gpu_device();
    let s = &dev.stream;
    let (rows, k) = (7usize, 768usize);
    let mut r = Rng(5);
    let launch = |f: &cudarc::driver::CudaFunction, cfg: LaunchConfig, args: &[u64]| {
        launch_raw(s, f, cfg, args)
    };
    let mut failures = Vec::new();
    for m in [1usize, 3, 8] {
        let x: Vec<f32> = (0..m * k).map(|_| r.next() * 3.0).collect();
        // Blocks: the GPU's codes and scales against rlx_gguf's Q8_0 bytes.
        let reference = rlx_gguf::quantize_to_vec(GgmlType::Q8_0, &x).unwrap();
        let xg = s.clone_htod(&x).unwrap();
        let codes = s.alloc_zeros::<i8>(m * k).unwrap();
        let scales = s.alloc_zeros::<u16>(m * k / 32).unwrap();
        launch(
            &dev.kernels.quantize_q8,
            super::plan::linear(m * k),
            &[
                dev.ptr(&xg),
                dev.ptr(&codes),
                dev.ptr(&scales),
                (m * k / 32) as u64,
            ],
        );
        let (codes_h, scales_h) = (
            s.clone_dtoh(&codes).unwrap(),
            s.clone_dtoh(&scales).unwrap(),
        );
        let mut xq = vec![0f32; m * k];
        for (b, block) in reference.chunks_exact(34).enumerate() {
            let d = u16::from_le_bytes([block[0], block[1]]);
            let same =
                scales_h[b] == d && (0..32).all(|i| codes_h[32 * b + i] == block[2 + i] as i8);
            if !same {
                failures.push(format!("m {m}: activation block {b} differs from ggml's"));
            }
            for i in 0..32 {
                xq[32 * b + i] = half::f16::from_bits(d).to_f32() * (block[2 + i] as i8) as f32;
            }
        }
        // The norm that writes blocks: what the norm writes, quantized.
        let gamma = s
            .clone_htod(&(0..k).map(|_| r.next()).collect::<Vec<f32>>())
            .unwrap();
        let normed = s.alloc_zeros::<f32>(m * k).unwrap();
        let rows_cfg = LaunchConfig {
            grid_dim: (m as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let eps = 1e-6f32.to_bits() as u64;
        let kk = k as u64;
        launch(
            &dev.kernels.rms_norm,
            rows_cfg,
            &[dev.ptr(&xg), dev.ptr(&gamma), dev.ptr(&normed), kk, eps],
        );
        let (nq, nd) = (
            s.alloc_zeros::<i8>(m * k).unwrap(),
            s.alloc_zeros::<u16>(m * k / 32).unwrap(),
        );
        launch(
            &dev.kernels.quantize_q8,
            super::plan::linear(m * k),
            &[
                dev.ptr(&normed),
                dev.ptr(&nq),
                dev.ptr(&nd),
                (m * k / 32) as u64,
            ],
        );
        // The norm that writes a many-row product's bf16 operand: what the
        // norm writes, rounded by to_bf16.
        let (n16, f16b) = (
            s.alloc_zeros::<u16>(m * k).unwrap(),
            s.alloc_zeros::<u16>(m * k).unwrap(),
        );
        launch(
            &dev.kernels.to_bf16,
            super::plan::linear(m * k),
            &[dev.ptr(&normed), dev.ptr(&n16), (m * k) as u64],
        );
        launch(
            &dev.kernels.rms_norm_bf16,
            rows_cfg,
            &[dev.ptr(&xg), dev.ptr(&gamma), dev.ptr(&f16b), kk, eps],
        );
        if s.clone_dtoh(&n16).unwrap() != s.clone_dtoh(&f16b).unwrap() {
            failures.push(format!(
                "m {m}: rms_norm_bf16 differs from rms_norm then to_bf16"
            ));
        }
        let (fq, fd) = (
            s.alloc_zeros::<i8>(m * k).unwrap(),
            s.alloc_zeros::<u16>(m * k / 32).unwrap(),
        );
        launch(
            &dev.kernels.rms_norm_q8,
            rows_cfg,
            &[
                dev.ptr(&xg),
                dev.ptr(&gamma),
                dev.ptr(&fq),
                dev.ptr(&fd),
                kk,
                eps,
            ],
        );
        if s.clone_dtoh(&nq).unwrap() != s.clone_dtoh(&fq).unwrap()
            || s.clone_dtoh(&nd).unwrap() != s.clone_dtoh(&fd).unwrap()
        {
            failures.push(format!(
                "m {m}: rms_norm_q8 differs from rms_norm then quantize_q8"
            ));
        }
        // The folded prologues against the kernels they replace, bit for
        // bit: GeGLU writing blocks, and a residual add between two norms.
        let up = s
            .clone_htod(&(0..m * k).map(|_| r.next()).collect::<Vec<f32>>())
            .unwrap();
        let gl = s.alloc_zeros::<f32>(m * k).unwrap();
        let (n64, k64) = ((m * k) as u64, k as u64);
        let lin = super::plan::linear(m * k);
        launch(
            &dev.kernels.geglu,
            lin,
            &[dev.ptr(&xg), dev.ptr(&up), dev.ptr(&gl), n64, k64, k64, k64],
        );
        launch(
            &dev.kernels.quantize_q8,
            lin,
            &[dev.ptr(&gl), dev.ptr(&nq), dev.ptr(&nd), n64 / 32],
        );
        launch(
            &dev.kernels.geglu_q8,
            lin,
            &[
                dev.ptr(&xg),
                dev.ptr(&up),
                dev.ptr(&fq),
                dev.ptr(&fd),
                n64,
                k64,
                k64,
                k64,
            ],
        );
        if s.clone_dtoh(&nq).unwrap() != s.clone_dtoh(&fq).unwrap()
            || s.clone_dtoh(&nd).unwrap() != s.clone_dtoh(&fd).unwrap()
        {
            failures.push(format!(
                "m {m}: geglu_q8 differs from geglu then quantize_q8"
            ));
        }
        // GeGLU writing a many-row product's bf16 operand.
        launch(
            &dev.kernels.to_bf16,
            lin,
            &[dev.ptr(&gl), dev.ptr(&n16), n64],
        );
        launch(
            &dev.kernels.geglu_bf16,
            lin,
            &[
                dev.ptr(&xg),
                dev.ptr(&up),
                dev.ptr(&f16b),
                n64,
                k64,
                k64,
                k64,
            ],
        );
        if s.clone_dtoh(&n16).unwrap() != s.clone_dtoh(&f16b).unwrap() {
            failures.push(format!("m {m}: geglu_bf16 differs from geglu then to_bf16"));
        }
        let rows_cfg = super::plan::norm_rows(m, k);
        let gamma2 = s
            .clone_htod(&(0..k).map(|_| r.next()).collect::<Vec<f32>>())
            .unwrap();
        for norm1 in [true, false] {
            // Unfused: n = rms_norm(up, gamma) (or up), s = x + n on the
            // host (one f32 addition, as the add kernel), rms_norm_q8(s).
            let n = if norm1 {
                launch(
                    &dev.kernels.rms_norm,
                    rows_cfg,
                    &[dev.ptr(&up), dev.ptr(&gamma), dev.ptr(&normed), kk, eps],
                );
                s.clone_dtoh(&normed).unwrap()
            } else {
                s.clone_dtoh(&up).unwrap()
            };
            let sum: Vec<f32> = x.iter().zip(&n).map(|(a, b)| a + b).collect();
            let sg = s.clone_htod(&sum).unwrap();
            launch(
                &dev.kernels.rms_norm_q8,
                rows_cfg,
                &[
                    dev.ptr(&sg),
                    dev.ptr(&gamma2),
                    dev.ptr(&nq),
                    dev.ptr(&nd),
                    kk,
                    eps,
                ],
            );
            // The fused kernel writing the sum to `sum` and the second norm
            // to `operand` (8-bit blocks or bf16).
            let add_norm = |f: &cudarc::driver::CudaFunction, sum: u64, operand: &[u64]| {
                let head = [
                    dev.ptr(&xg),
                    dev.ptr(&up),
                    dev.ptr(&gamma),
                    eps,
                    u64::from(norm1),
                    sum,
                    dev.ptr(&gamma2),
                    eps,
                ];
                launch(f, rows_cfg, &[&head[..], operand, &[kk]].concat());
            };
            let fs = s.alloc_zeros::<f32>(m * k).unwrap();
            add_norm(
                &dev.kernels.add_norm_q8,
                dev.ptr(&fs),
                &[dev.ptr(&fq), dev.ptr(&fd)],
            );
            let same_sum = s
                .clone_dtoh(&fs)
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .eq(sum.iter().map(|v| v.to_bits()));
            if !same_sum
                || s.clone_dtoh(&nq).unwrap() != s.clone_dtoh(&fq).unwrap()
                || s.clone_dtoh(&nd).unwrap() != s.clone_dtoh(&fd).unwrap()
            {
                failures.push(format!(
                    "m {m} norm1 {norm1}: add_norm_q8 differs from norm, add, norm"
                ));
            }
            // The same writing a many-row product's bf16 operand.
            launch(
                &dev.kernels.rms_norm_bf16,
                rows_cfg,
                &[dev.ptr(&sg), dev.ptr(&gamma2), dev.ptr(&n16), kk, eps],
            );
            let fs16 = s.alloc_zeros::<f32>(m * k).unwrap();
            add_norm(
                &dev.kernels.add_norm_bf16,
                dev.ptr(&fs16),
                &[dev.ptr(&f16b)],
            );
            if s.clone_dtoh(&fs16).unwrap() != s.clone_dtoh(&fs).unwrap()
                || s.clone_dtoh(&n16).unwrap() != s.clone_dtoh(&f16b).unwrap()
            {
                failures.push(format!(
                    "m {m} norm1 {norm1}: add_norm_bf16 differs from norm, add, norm"
                ));
            }
        }
        for (code, &(ty, name)) in super::TYPES.iter().enumerate() {
            let bytes = random_rows(ty, rows, k, &mut r);
            let wf = rlx_gguf::dequantize_to_vec(ty, &bytes).unwrap();
            let w = s.clone_htod(&bytes).unwrap();
            let float = matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
            for (variant, kernel) in dev.kernels.mmv[code].iter().enumerate() {
                // mmv1_, mmvq1_, mmvq1u2_, mmvq1u3_ take one activation row.
                let one_row = matches!(variant, 0 | 2 | 4 | 5);
                if one_row && m > 1 {
                    continue;
                }
                let q8 = variant >= 2 && !float;
                let xs = if q8 { &xq } else { &x };
                // Into columns 2 .. 2 + rows of rows + 3, as a fused
                // product's later weights write; the rows as three weights
                // of 2, 3 and 2 rows, as a fused q/k/v launch reads them.
                let ldy = rows + 3;
                let y = s.alloc_zeros::<f32>(m * ldy).unwrap();
                let row_bytes = (bytes.len() / rows) as u64;
                launch(
                    kernel,
                    LaunchConfig {
                        grid_dim: (rows.div_ceil(4) as u32, 1, 1),
                        block_dim: (128, 1, 1),
                        shared_mem_bytes: 0,
                    },
                    &[
                        dev.ptr(&w),
                        dev.ptr(&w) + 2 * row_bytes,
                        dev.ptr(&w) + 5 * row_bytes,
                        2,
                        5,
                        dev.ptr(&xg),
                        dev.ptr(&codes),
                        dev.ptr(&scales),
                        dev.ptr(&y),
                        m as u64,
                        rows as u64,
                        k as u64,
                        ldy as u64,
                        2,
                    ],
                );
                let y = s.clone_dtoh(&y).unwrap();
                for t in 0..m {
                    for row in 0..rows {
                        let (mut want, mut mag) = (0f64, 0f64);
                        for i in 0..k {
                            let p = wf[row * k + i] as f64 * xs[t * k + i] as f64;
                            want += p;
                            mag += p.abs();
                        }
                        let got = y[t * ldy + 2 + row] as f64;
                        if (got - want).abs() > 2e-6 * mag.max(1e-30) {
                            failures.push(format!(
                                "{name} variant {variant} m {m} row {t}.{row}: {got} against {want} (Σ|wx| {mag:e})"
                            ));
                        }
                    }
                    let untouched = [0, 1, ldy - 1].iter().all(|&c| y[t * ldy + c] == 0.0);
                    if !untouched {
                        failures.push(format!(
                            "{name} variant {variant}: wrote outside its columns"
                        ));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// One query's attention in f64: `q` [hq, hd] against keys and values
/// [m, hkv, hd] at positions 0 .. m (all visible), query heads grouped on
/// K/V heads in order.
fn reference_attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    hq: usize,
    hkv: usize,
    hd: usize,
) -> Vec<f32> {
    let m = k.len() / (hkv * hd);
    let scale = 1.0 / (hd as f64).sqrt();
    let mut out = Vec::new();
    for h in 0..hq {
        let g = h / (hq / hkv);
        let row = |x: &[f32], i: usize| x[(i * hkv + g) * hd..][..hd].to_vec();
        let s: Vec<f64> = (0..m)
            .map(|i| {
                let kr = row(k, i);
                (0..hd)
                    .map(|c| q[h * hd + c] as f64 * kr[c] as f64)
                    .sum::<f64>()
                    * scale
            })
            .collect();
        let big = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = s.iter().map(|x| (x - big).exp()).collect();
        let total: f64 = w.iter().sum();
        for c in 0..hd {
            let o: f64 = (0..m)
                .map(|i| w[i] * v[(i * hkv + g) * hd + c] as f64)
                .sum();
            out.push((o / total) as f32);
        }
    }
    out
}

/// Decode attention over a long context split into 1, 7 and 128 parts (and
/// as many as the context has blocks, where fewer) matches the reference:
/// the splits' partial results are merged by the last split to finish, the
/// count of finished splits is back at zero for the next launch (each
/// launch runs twice), and with 8-bit or bf16 output the blocks are what
/// quantize_q8 and to_bf16 make of the f32 output. The pool's blocks are listed out of
/// physical order, the last one part full.
#[test]
#[ignore = "needs a GPU"]
fn split_attention_matches_the_reference() {
    use cudarc::driver::LaunchConfig;
    let dev = gpu_device();
    let s = &dev.stream;
    let mut r = Rng(3);
    // Keys and values of 32 and 16 bits, heads of 128, 256 and 512 (two
    // pieces a lane), one to four query heads a block.
    for (ty, hq, hkv, hd, m) in [
        (KvDType::F32, 4usize, 1usize, 256usize, 1270usize),
        (KvDType::F32, 8, 4, 256, 70),
        (KvDType::F32, 4, 2, 256, 20),
        (KvDType::F16, 4, 1, 256, 1270),
        (KvDType::F16, 8, 2, 512, 100),
        (KvDType::BF16, 8, 2, 128, 300),
        (KvDType::F32, 4, 1, 512, 45),
    ] {
        let f = &dev.kernels.attention[super::attention_index(ty, ty)];
        let listed = m.div_ceil(BLOCK_TOKENS);
        let phys: Vec<usize> = (0..listed).map(|e| (e * 7 + 3) % listed).collect();
        // As the pool holds them.
        let round = |x: f32| match ty {
            KvDType::F16 => half::f16::from_f32(x).to_f32(),
            KvDType::BF16 => half::bf16::from_f32(x).to_f32(),
            _ => x,
        };
        let k: Vec<f32> = (0..m * hkv * hd).map(|_| round(r.next())).collect();
        let v: Vec<f32> = (0..m * hkv * hd).map(|_| round(r.next())).collect();
        let q: Vec<f32> = (0..hq * hd).map(|_| r.next() * 4.0).collect();
        // The pool: logical block e in physical block phys[e].
        let mut kc = vec![0f32; listed * BLOCK_TOKENS * hkv * hd];
        let mut vc = kc.clone();
        for i in 0..m {
            let row = (phys[i / BLOCK_TOKENS] * BLOCK_TOKENS + i % BLOCK_TOKENS) * hkv * hd;
            kc[row..][..hkv * hd].copy_from_slice(&k[i * hkv * hd..][..hkv * hd]);
            vc[row..][..hkv * hd].copy_from_slice(&v[i * hkv * hd..][..hkv * hd]);
        }
        let bits = |x: &[f32]| -> Vec<u16> {
            match ty {
                KvDType::F16 => x
                    .iter()
                    .map(|&y| half::f16::from_f32(y).to_bits())
                    .collect(),
                _ => x
                    .iter()
                    .map(|&y| half::bf16::from_f32(y).to_bits())
                    .collect(),
            }
        };
        let table: Vec<i32> = (0..listed)
            .flat_map(|e| [phys[e] as i32, e as i32])
            .collect();
        let want = reference_attention(&q, &k, &v, hq, hkv, hd);
        let up_i = |x: &[i32]| s.clone_htod(x).unwrap();
        let (qpos, run_of_row, run_end) = (up_i(&[m as i32 - 1]), up_i(&[0]), up_i(&[m as i32]));
        let (block_start, table) = (up_i(&[0, listed as i32]), up_i(&table));
        let qg = s.clone_htod(&q).unwrap();
        // Keep the f32 or 16-bit buffers alive for the launches.
        let (k32, v32, k16, v16);
        let (kp, vp) = if ty == KvDType::F32 {
            (k32, v32) = (s.clone_htod(&kc).unwrap(), s.clone_htod(&vc).unwrap());
            (dev.ptr(&k32), dev.ptr(&v32))
        } else {
            k16 = s.clone_htod(&bits(&kc)).unwrap();
            v16 = s.clone_htod(&bits(&vc)).unwrap();
            (dev.ptr(&k16), dev.ptr(&v16))
        };
        let gq = super::plan::attention_group(hq / hkv, hd);
        let blocks = hq / gq;
        for splits in [1usize, 7, 128] {
            let part = s.alloc_zeros::<f32>(hq * splits * 514).unwrap();
            let done = s.alloc_zeros::<i32>(blocks).unwrap();
            let out = s.alloc_zeros::<f32>(hq * hd).unwrap();
            let (qs, qd) = (
                s.alloc_zeros::<i8>(hq * hd).unwrap(),
                s.alloc_zeros::<u16>(hq * hd / 32).unwrap(),
            );
            let cfg = LaunchConfig {
                grid_dim: (blocks as u32, splits as u32, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            let args = |out: u64, qs: u64, qd: u64, ob: u64| {
                let scale = (1.0 / (hd as f32).sqrt()).to_bits() as u64;
                [
                    dev.ptr(&qg),
                    kp,
                    vp,
                    dev.ptr(&qpos),
                    dev.ptr(&run_of_row),
                    dev.ptr(&run_end),
                    dev.ptr(&block_start),
                    dev.ptr(&table),
                    0,
                    0,
                    out,
                    qs,
                    qd,
                    ob,
                    dev.ptr(&part),
                    dev.ptr(&done),
                    hq as u64,
                    hkv as u64,
                    hd as u64,
                    hd as u64,
                    gq as u64,
                    scale,
                    0,
                    0,
                    0,
                ]
            };
            for round in 0..2 {
                launch_raw(s, f, cfg, &args(dev.ptr(&out), 0, 0, 0));
                let got = s.clone_dtoh(&out).unwrap();
                let worst = got
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                assert!(
                    worst < 1e-5,
                    "{ty:?}, {hq}/{hkv} heads of {hd}, {m} keys, {splits} splits, launch {round}: worst difference {worst:e}"
                );
                assert_eq!(
                    s.clone_dtoh(&done).unwrap(),
                    vec![0; blocks],
                    "{splits} splits: counts reset"
                );
            }
            launch_raw(s, f, cfg, &args(0, dev.ptr(&qs), dev.ptr(&qd), 0));
            let (q2, d2) = (
                s.alloc_zeros::<i8>(hq * hd).unwrap(),
                s.alloc_zeros::<u16>(hq * hd / 32).unwrap(),
            );
            let n = hq * hd;
            let qargs = [dev.ptr(&out), dev.ptr(&q2), dev.ptr(&d2), (n / 32) as u64];
            launch_raw(s, &dev.kernels.quantize_q8, super::plan::linear(n), &qargs);
            assert_eq!(s.clone_dtoh(&qs).unwrap(), s.clone_dtoh(&q2).unwrap());
            assert_eq!(s.clone_dtoh(&qd).unwrap(), s.clone_dtoh(&d2).unwrap());
            // And as a many-row product's bf16 operand.
            let (o16, w16) = (
                s.alloc_zeros::<u16>(n).unwrap(),
                s.alloc_zeros::<u16>(n).unwrap(),
            );
            launch_raw(s, f, cfg, &args(0, 0, 0, dev.ptr(&o16)));
            let bargs = [dev.ptr(&out), dev.ptr(&w16), n as u64];
            launch_raw(s, &dev.kernels.to_bf16, super::plan::linear(n), &bargs);
            assert_eq!(s.clone_dtoh(&o16).unwrap(), s.clone_dtoh(&w16).unwrap());
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn a_weight_type_without_kernels_is_refused_by_name() {
    let ty = GgmlType::IQ2_XXS;
    let mut w = GgufWriter::new();
    w.add("general.architecture", "test").unwrap();
    let bytes = vec![0u8; 2 * ty.block_bytes()];
    w.add_tensor("table.weight", ty, &[ty.block_elems() as u64, 2], bytes)
        .unwrap();
    let file = GgufFile::from_bytes(w.to_bytes()).unwrap();
    let s = Arc::new(WeightStore::new(Arc::new(file)));
    let gpu = open(Device::Cuda(0), &s, &gpu_options(1)).unwrap();
    assert!(!gpu.supports_weight(ty));
    let mut g = Graph::new();
    let tokens = g.input("tokens", DType::I32, Shape::new([seq()]));
    let table = s.node(&mut g, "table.weight").unwrap();
    let x = g.gather(table, tokens).unwrap();
    g.output("x", x);
    let max = Bindings::new().with(Sym::SEQ, 4);
    let e = gpu
        .compile(&g, &CompileOptions::new(max))
        .err()
        .expect("no kernel reads IQ2_XXS");
    let msg = e.to_string();
    assert!(
        msg.contains("IQ2_XXS") && msg.contains("table.weight"),
        "{msg}"
    );
}

#[test]
#[ignore = "needs a GPU"]
fn kv_rows_are_stored_as_the_cpu_stores_them() {
    // The kv_write kernel's bytes for every cache type against the CPU
    // storage's (rlx_gguf's conversions and quantizers), rows scattered.
    use cudarc::driver::PushKernelArg;
    let dev = gpu_device();
    let s = &dev.stream;
    let (n, kd, vd, rows) = (5usize, 128usize, 64usize, 8usize);
    let mut r = Rng(5);
    let k: Vec<f32> = (0..n * kd).map(|_| r.next() * 3.0).collect();
    let v: Vec<f32> = (0..n * vd).map(|_| r.next() * 0.5).collect();
    let dest = [3i32, 0, 7, 1, 2];
    for t in KvDType::ALL {
        let (kb, vb) = (t.row_bytes(kd), t.row_bytes(vd));
        let mut want_k = vec![0u8; rows * kb];
        let mut want_v = vec![0u8; rows * vb];
        let mut cpu = crate::cpu::kv::Rows::new(t, rows * kd);
        let mut cpu_v = crate::cpu::kv::Rows::new(t, rows * vd);
        for (i, &row) in dest.iter().enumerate() {
            cpu.write(row as usize * kd, &k[i * kd..][..kd]);
            cpu_v.write(row as usize * vd, &v[i * vd..][..vd]);
        }
        cpu.bytes_into(&mut want_k);
        cpu_v.bytes_into(&mut want_v);
        let (kx, vx) = (s.clone_htod(&k).unwrap(), s.clone_htod(&v).unwrap());
        let kc = s.alloc_zeros::<u8>(rows * kb).unwrap();
        let vc = s.alloc_zeros::<u8>(rows * vb).unwrap();
        let rows_d = s.clone_htod(&dest).unwrap();
        let code = super::kv::kv_code(t) as i32;
        let mut b = s.launch_builder(&dev.kernels.kv_write);
        let ptrs = [
            dev.ptr(&kx),
            dev.ptr(&vx),
            dev.ptr(&kc),
            dev.ptr(&vc),
            dev.ptr(&rows_d),
        ];
        for p in &ptrs {
            b.arg(p);
        }
        let ints = [n as i32, kd as i32, vd as i32, code, code];
        for i in &ints {
            b.arg(i);
        }
        // SAFETY: the kernel's arguments, with buffers of the sizes it
        // writes and reads (n rows in, `rows` rows out).
        unsafe { b.launch(super::plan::linear(n * (kd / 32 + vd / 32))) }.unwrap();
        let (got_k, got_v) = (s.clone_dtoh(&kc).unwrap(), s.clone_dtoh(&vc).unwrap());
        let first_diff = |a: &[u8], b: &[u8]| a.iter().zip(b).position(|(x, y)| x != y);
        for (what, got, want) in [("keys", &got_k, &want_k), ("values", &got_v, &want_v)] {
            if let Some(i) = first_diff(got, want) {
                let at = i.saturating_sub(4);
                panic!(
                    "{t} {what}: byte {i} differs; GPU {:?}, CPU {:?} from byte {at}",
                    &got[at..(at + 40).min(got.len())],
                    &want[at..(at + 40).min(want.len())]
                );
            }
        }
    }
}

/// Queries (4 heads of 64), keys and values (2 heads of 64 each) read
/// from the embeddings of `tokens`: attention inputs with real values.
fn embedding_qkv(g: &mut Graph, s: &WeightStore, tokens: NodeId) -> (NodeId, NodeId, NodeId) {
    let embd = s.node(g, "token_embd.weight").unwrap();
    let x = g.gather(embd, tokens).unwrap();
    let heads = |g: &mut Graph, t: NodeId, n: usize| {
        g.reshape(t, Shape::new([seq(), n.into(), HD.into()]))
            .unwrap()
    };
    let q = heads(g, x, 4);
    let k = g.narrow(x, 1, rlx_ir::Start::FromStart(0), 2 * HD).unwrap();
    let v = g
        .narrow(x, 1, rlx_ir::Start::FromStart(2 * HD), 2 * HD)
        .unwrap();
    let (k, v) = (heads(g, k, 2), heads(g, v, 2));
    (q, k, v)
}

#[test]
#[ignore = "needs a GPU"]
fn attention_over_inputs_matches_the_cpu() {
    // K/V from the step's own activations (an encoder's attention): the
    // embeddings of n tokens as queries (4 heads of 64), keys and values
    // (2 heads of 64 each), every mask, 1 to 70 rows (partial blocks).
    let s = store();
    let (cpu, gpu) = cpu_and_gpu(&s);
    for mask in [
        Mask::Causal,
        Mask::Sliding { window: 5 },
        Mask::Full,
        Mask::Symmetric { half_width: 3 },
    ] {
        let mut g = Graph::new();
        let tokens = g.input("tokens", DType::I32, Shape::new([seq()]));
        let (q, k, v) = embedding_qkv(&mut g, &s, tokens);
        let spec = AttentionSpec {
            mask,
            scale: 0.125,
            softcap: Some(30.0),
            kv: KvSource::Inputs,
            bidirectional_spans: false,
        };
        let a = g.attention(q, k, v, spec).unwrap();
        g.output("a", a);
        for n in [1usize, 5, 33, 70] {
            let max = Bindings::new().with(Sym::SEQ, n);
            let mut outs = Vec::new();
            for b in [&cpu, &gpu] {
                let mut plan = b.compile(&g, &CompileOptions::new(max.clone())).unwrap();
                let mut batch = Batch::new();
                for i in 0..n {
                    batch.push(SeqId(0), i, ((i * 37 + 5) % VOCAB) as u32, true);
                }
                let mut o = plan.run(&batch, None).unwrap();
                outs.push(o.take_f32("a").unwrap());
            }
            let err = rel_l2(&outs[1], &outs[0]);
            assert!(
                err < 1e-5,
                "{mask:?}, {n} rows: CUDA vs CPU relative L2 {err}"
            );
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn span_attention_matches_the_cpu() {
    // Queries and keys of the same non-zero span see each other whatever
    // the mask (an image's tokens): two sequences in one batch, spans that
    // start mid-block and cross block edges, then decode steps after and
    // inside a span, causal and sliding masks, f32 and f16 caches.
    let s = store();
    let (cpu, gpu) = cpu_and_gpu(&s);
    for (mask, window) in [(Mask::Causal, None), (Mask::Sliding { window: 6 }, Some(6))] {
        let mut g = Graph::new();
        let tokens = g.input("tokens", DType::I32, Shape::new([seq()]));
        let spans = g.input("spans", DType::I32, Shape::new([seq()]));
        let (q, k, v) = embedding_qkv(&mut g, &s, tokens);
        let w = g.kv_write_spans(CacheSlot(0), k, v, spans).unwrap();
        let spec = AttentionSpec {
            mask,
            scale: 0.125,
            softcap: None,
            kv: KvSource::Cache(CacheSlot(0)),
            bidirectional_spans: true,
        };
        let a = g
            .attention_cached(q, w, CacheSlot(0), spec, Some(spans))
            .unwrap();
        g.output("a", a);
        for ty in [KvDType::F32, KvDType::F16] {
            let config = KvPoolConfig {
                layers: vec![KvLayerSpec {
                    kv_heads: 2,
                    head_dim: HD,
                    v_head_dim: HD,
                    window,
                    shares: None,
                }],
                types: KvTypes::both(ty),
                tokens: 256,
                max_seqs: 2,
                max_chunk: 48,
            };
            // (sequence, first position, rows, span of each row)
            let span_of = |p: usize| match p {
                3..=37 => 7,
                60..=70 => 9,
                _ => 0,
            };
            let steps: Vec<Vec<(u32, usize, usize)>> = vec![
                vec![(0, 0, 40), (1, 0, 8)],
                vec![(0, 40, 1), (1, 8, 1)],
                vec![(0, 41, 19)],
                vec![(0, 60, 5), (1, 9, 1)],
                vec![(0, 65, 1)],
                vec![(0, 66, 6)],
                vec![(0, 72, 1)],
            ];
            let max = Bindings::new().with(Sym::SEQ, 48);
            let mut outs: Vec<Vec<Vec<f32>>> = Vec::new();
            for b in [&cpu, &gpu] {
                let mut plan = b.compile(&g, &CompileOptions::new(max.clone())).unwrap();
                let mut pool = b.kv_pool(config.clone()).unwrap();
                let ids = [pool.add_sequence(), pool.add_sequence()];
                let mut per_step = Vec::new();
                for step in &steps {
                    let mut batch = Batch::new();
                    for &(sq, start, n) in step {
                        for p in start..start + n {
                            // Sequence 1's span is another id at the same positions.
                            let span = span_of(p) * (1 + sq as i32);
                            let t = ((p * 37 + 5 + sq as usize) % VOCAB) as u32;
                            batch.push_in_span(ids[sq as usize], p, t, true, span);
                        }
                    }
                    let mut o = plan.run(&batch, Some(&mut pool)).unwrap();
                    per_step.push(o.take_f32("a").unwrap());
                }
                outs.push(per_step);
            }
            for (i, (c, gp)) in outs[0].iter().zip(&outs[1]).enumerate() {
                let err = rel_l2(gp, c);
                assert!(
                    err < 1e-3,
                    "{mask:?} {ty:?} step {i}: CUDA vs CPU relative L2 {err}"
                );
            }
        }
    }
}

/// Attention blocks take the query heads that share a K/V head together
/// (up to four), and the splits of a long context fill the GPU without
/// overrunning the buffer of partial results. Needs no GPU.
#[test]
fn attention_blocks_group_heads_and_fit_their_splits() {
    use super::plan::{attention_group, attention_splits};
    for (group, head_dim, want) in [
        (1, 256, 1),
        (2, 256, 2),
        (3, 256, 3),
        (4, 256, 4),
        (5, 256, 1),
        (6, 256, 3),
        (8, 256, 4),
        (16, 256, 4),
        (16, 128, 4),
        // Heads of 512 take at most two a block.
        (8, 512, 2),
        (3, 512, 1),
        (1, 512, 1),
    ] {
        assert_eq!(
            attention_group(group, head_dim),
            want,
            "{group} heads of {head_dim} a K/V head"
        );
    }
    let sms = 132;
    for (rows, hq, hkv) in [
        (1, 8, 4),
        (1, 4, 1),
        (1, 16, 8),
        (8, 8, 4),
        (64, 8, 4),
        (1, 32, 16),
    ] {
        let gq = attention_group(hq / hkv, 256);
        let blocks = rows * hq / gq;
        let splits = attention_splits(blocks, rows * hq, sms);
        assert!((1..=128).contains(&splits), "{rows}×{hq}: {splits}");
        assert!(
            rows * hq * splits <= 10 * sms,
            "{rows}×{hq}: {splits} splits"
        );
        if blocks * 8 <= sms {
            // One sequence: the GPU is filled, up to the most splits a
            // query's context takes.
            assert!(
                blocks * splits >= (4 * sms).min(blocks * 128),
                "{rows}×{hq}: {splits}"
            );
        }
    }
}

/// A batched step reads the q/k/v and gate/up splits of its products in
/// place, rows apart, as one row's step does: no split is copied, each
/// layer that writes K/V makes its attention inputs ready in one launch,
/// and every split read so is read by a head preparation or a GeGLU with
/// the product's row width as stride. Needs no GPU.
#[test]
fn batched_steps_read_their_splits_in_place() {
    let s = store();
    let max = Bindings::new().with(Sym::SEQ, 8).with(Sym::ROWS, 8);
    let g = super::super::compile::prepare(&model_graph(&s), &s, &CompileOptions::new(max.clone()))
        .unwrap();
    let layout = super::plan::lay_out(&g, &max).unwrap();
    assert_eq!(layout.head_preps.len(), LAYERS - 1);
    let launched_narrows = layout
        .sched
        .steps
        .iter()
        .filter(|id| matches!(g.node(**id).op, rlx_ir::Op::Narrow { .. }))
        .filter(|id| {
            !matches!(
                layout.sched.locs[id.index()],
                crate::compile::Loc::Alias { .. }
            )
        })
        .count();
    assert_eq!(launched_narrows, 0);
    // q, k and v where a layer writes K/V, gate and up in every layer.
    assert!(
        layout.strided.len() >= 2 * LAYERS + 3 * (LAYERS - 1),
        "{:?}",
        layout.strided
    );
    for (&id, &stride) in &layout.strided {
        let src = g.node(id).inputs[0];
        let width = g.node(src).shape.resolve(&max).unwrap()[1];
        assert_eq!(stride, width);
        assert!(width > g.node(id).shape.resolve(&max).unwrap()[1]);
    }
}

/// A decode step's q/k norms and ropes and the K/V write after them run as
/// one launch in each layer that writes K/V (a layer reading another's K/V
/// keeps its own q norm and rope), and each attention writes its product's
/// 8-bit blocks. Needs no GPU.
#[test]
fn attention_inputs_are_made_ready_in_one_launch() {
    let s = store();
    let max = Bindings::new().with(Sym::SEQ, 1).with(Sym::ROWS, 1);
    let g = super::super::compile::prepare(&model_graph(&s), &s, &CompileOptions::new(max.clone()))
        .unwrap();
    // Decode reads the q/k/v splits of the product in place, as the plan does.
    let super::plan::Layout {
        sched,
        head_preps: preps,
        ..
    } = super::plan::lay_out(&g, &max).unwrap();
    assert_eq!(preps.len(), LAYERS - 1, "{preps:?}");
    let mut k_normed: Vec<bool> = preps.values().map(|p| p.k_norm.is_some()).collect();
    k_normed.sort();
    // Layer 0 norms its keys, layer 1 only rotates them.
    assert_eq!(k_normed, [false, true]);
    // And every layer's attention writes the output projection's 8-bit
    // input blocks.
    let (prologues, _) = super::plan::find_prologues(&g, &sched.steps, &sched.locs);
    let attention = prologues
        .values()
        .filter(|p| **p == super::plan::Prologue::Attention)
        .count();
    assert_eq!(attention, LAYERS, "{prologues:?}");
    for p in preps.values() {
        assert!(p.q_norm.is_some() && p.v_norm.is_none(), "{p:?}");
        assert!(matches!(g.node(p.write).op, rlx_ir::Op::KvWrite { .. }));
        assert_eq!(g.node(p.write).inputs[0], p.k_rope);
    }
}

/// Compiled kernels are made once per key and read back after; another key
/// (another source or architecture) makes its own; a cache directory that
/// cannot be written only costs the work. Needs no GPU.
#[test]
fn compiled_kernels_are_kept_by_key() {
    let dir = std::env::temp_dir().join(format!("rlx-kernel-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut made = 0;
    // Machine code is bytes, not text: a NUL, a newline and a byte that is
    // not UTF-8 come back as written.
    let body = |key: &str| [key.as_bytes(), b"\0\n\xff second line"].concat();
    let mut get = |key: &str| {
        super::cached_bytes::<()>(&dir, key, "bin", || {
            made += 1;
            Ok(body(key))
        })
        .unwrap()
    };
    assert_eq!(get("a"), body("a"));
    assert_eq!(get("a"), body("a"));
    assert_eq!(get("b"), body("b"));
    assert_eq!(get("a"), body("a"));
    assert_eq!(made, 2);
    // A file under the key's name whose first line is another key is not
    // taken (made again, and replaced).
    let file = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| std::fs::read(p).unwrap().starts_with(b"a\n"))
        .unwrap();
    std::fs::write(&file, "not a\nstale").unwrap();
    let mut again = 0;
    let data = super::cached_bytes::<()>(&dir, "a", "bin", || {
        again += 1;
        Ok(b"fresh".to_vec())
    })
    .unwrap();
    assert_eq!((data.as_slice(), again), (&b"fresh"[..], 1));
    // A cache where a directory cannot be made: the bytes, every time.
    let blocked = dir.join("a-file");
    std::fs::write(&blocked, "").unwrap();
    let mut n = 0;
    for _ in 0..2 {
        let t = super::cached_bytes::<()>(&blocked.join("sub"), "k", "bin", || {
            n += 1;
            Ok(b"t".to_vec())
        });
        assert_eq!(t.unwrap(), b"t");
    }
    assert_eq!(n, 2);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Digests of `rows` (each `vocab` long) by `reduce_part`, `reduce_draw`
/// and `reduce_merge`, as a plan launches them.
fn reduce_on_gpu(
    dev: &super::CudaDevice,
    logits: &[f32],
    vocab: usize,
    reqs: &[crate::reduce::RowReduce],
) -> Vec<crate::reduce::RowDigest> {
    use super::reduce::{encode, splits, OUT_BYTES, PART_BYTES};
    let s = &dev.stream;
    let n = reqs.len();
    let (bytes, adj_at) = encode(reqs);
    let splits = splits(n, vocab, dev.sms);
    let x = s.clone_htod(logits).unwrap();
    let b = s.clone_htod(&bytes).unwrap();
    let parts = s.alloc_zeros::<u8>(n * splits * PART_BYTES).unwrap();
    let out = s.alloc_zeros::<u8>(n * OUT_BYTES).unwrap();
    let sliced = cudarc::driver::LaunchConfig {
        grid_dim: (n as u32, splits as u32, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let args = [
        dev.ptr(&x),
        vocab as u64,
        dev.ptr(&b),
        dev.ptr(&b) + adj_at as u64,
        dev.ptr(&parts),
        splits as u64,
    ];
    launch_raw(s, &dev.kernels.reduce_part, sliced, &args);
    launch_raw(s, &dev.kernels.reduce_draw, sliced, &args);
    let merge = cudarc::driver::LaunchConfig {
        grid_dim: (n as u32, 1, 1),
        ..sliced
    };
    let args = [
        dev.ptr(&x),
        vocab as u64,
        dev.ptr(&parts),
        splits as u64,
        dev.ptr(&b),
        dev.ptr(&out),
    ];
    launch_raw(s, &dev.kernels.reduce_merge, merge, &args);
    super::reduce::decode(&s.clone_dtoh(&out).unwrap(), n)
}

/// Every token's logit as `r` adjusts it (its mask, then its changes).
fn adjusted_row(row: &[f32], r: &crate::reduce::RowReduce) -> Vec<f64> {
    (0..row.len())
        .map(|i| {
            if r.allowed
                .as_ref()
                .is_some_and(|a| !crate::reduce::is_allowed(a, i))
            {
                return f64::NEG_INFINITY;
            }
            let changes: Vec<_> = r
                .adjust
                .iter()
                .filter(|a| a.token as usize == i)
                .copied()
                .collect();
            crate::reduce::adjusted(row[i], &changes, &r.penalties)
        })
        .collect()
}

/// The weights a draw of `r` gives the tokens of `row` (the reference's
/// arithmetic), in token order.
fn draw_weights(row: &[f32], r: &crate::reduce::RowReduce) -> Vec<f64> {
    let d = r.draw.unwrap();
    let v = adjusted_row(row, r);
    let max = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    v.iter()
        .map(|&x| {
            if x == f64::NEG_INFINITY || x < max + d.ln_min_p {
                0.0
            } else {
                ((x - max) / d.temperature).exp()
            }
        })
        .collect()
}

#[test]
#[ignore = "needs a GPU"]
fn logit_rows_reduce_as_the_reference() {
    use crate::reduce::{reduce_row, Adjust, Draw, Penalties, RowReduce};
    let dev = gpu_device();
    let mut r = Rng(11);
    for vocab in [262_144usize, 1000, 33, 5] {
        let rows = 9;
        let mut logits = vec![0f32; rows * vocab];
        let mut reqs = Vec::new();
        for (i, row) in logits.chunks_exact_mut(vocab).enumerate() {
            for x in row.iter_mut() {
                *x = r.next() * 8.0;
            }
            match i {
                // Ties everywhere: values on a coarse grid, or all equal.
                1 => row.iter_mut().for_each(|x| *x = (*x * 2.0).round() / 2.0),
                2 => row.fill(0.0),
                // Mostly banned by the model itself.
                3 => row.iter_mut().skip(3).for_each(|x| *x = f32::NEG_INFINITY),
                // Invalid values: the first is reported.
                4 => {
                    row[vocab / 2] = f32::NAN;
                    row[vocab - 1] = f32::INFINITY;
                }
                _ => {}
            }
            let mut adjust: Vec<Adjust> = (0..(i * 7) % 40)
                .map(|k| Adjust {
                    token: ((k * 7919 + i * 104_729) % vocab) as u32,
                    bias: match k % 5 {
                        0 => f64::NEG_INFINITY,
                        1 => 0.0,
                        _ => f64::from(r.next()) * 3.0,
                    },
                    count: (k % 3) as u32,
                })
                .collect();
            adjust.sort_by_key(|a| a.token);
            // A constraint's mask on two rows: random words, the second
            // covering only half of the vocabulary.
            let allowed = (i == 6 || i == 7).then(|| {
                let words = vocab.div_ceil(32) / if i == 7 { 2 } else { 1 };
                (0..words.max(1))
                    .map(|_| r.next().to_bits() ^ r.next().to_bits().rotate_left(16))
                    .collect::<Vec<u32>>()
            });
            reqs.push(RowReduce {
                allowed,
                adjust,
                penalties: Penalties {
                    repeat: 1.3,
                    frequency: 0.25,
                    presence: 0.5,
                },
                top: [1, 40, 64, 7, 64, 2, 64, 33, 64][i],
                draw: (i % 2 == 0 || i == 5).then(|| Draw {
                    temperature: [0.7, 1.0, 0.05][i % 3],
                    ln_min_p: if i == 6 {
                        0.05f64.ln()
                    } else {
                        f64::NEG_INFINITY
                    },
                    u: f64::from(r.next().abs()).min(0.999),
                }),
            });
        }
        let got = reduce_on_gpu(&dev, &logits, vocab, &reqs);
        for (i, (g, req)) in got.iter().zip(&reqs).enumerate() {
            let row = &logits[i * vocab..(i + 1) * vocab];
            let want = reduce_row(row, req);
            let at = format!("vocab {vocab}, row {i}");
            assert_eq!(g.invalid.map(|v| v.0), want.invalid.map(|v| v.0), "{at}");
            if want.invalid.is_some() {
                continue;
            }
            assert_eq!(g.top, want.top, "{at}");
            assert_eq!(g.live, want.live, "{at}");
            let rel = (g.sum_exp - want.sum_exp).abs() / want.sum_exp.max(1e-300);
            assert!(
                rel < 1e-5,
                "{at}: Σ exp {} against {}",
                g.sum_exp,
                want.sum_exp
            );
            match (req.draw, want.live) {
                (None, _) | (_, 0) => assert_eq!(g.drawn, None, "{at}"),
                (Some(d), _) => {
                    // The reference's race, unless its two best keys are
                    // closer than the GPU's logf may differ by.
                    let keys = race_keys(row, req, &d);
                    let close = keys.len() > 1 && keys[1].1 - keys[0].1 < 1e-4;
                    if !close {
                        assert_eq!(g.drawn, Some(keys[0].0), "{at}: the race's winner");
                    }
                }
            }
        }
    }
}

/// The race keys of a row's live tokens above the floor, least first.
fn race_keys(
    row: &[f32],
    r: &crate::reduce::RowReduce,
    d: &crate::reduce::Draw,
) -> Vec<(u32, f32)> {
    let v: Vec<(u32, f64)> = adjusted_row(row, r)
        .into_iter()
        .enumerate()
        .map(|(i, x)| (i as u32, x))
        .filter(|&(_, x)| x != f64::NEG_INFINITY)
        .collect();
    let max = v.iter().map(|t| t.1).fold(f64::NEG_INFINITY, f64::max);
    let mut keys: Vec<(u32, f32)> = v
        .iter()
        .filter_map(|&(t, x)| crate::reduce::race([(t, x)], max, d))
        .collect();
    keys.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
    keys
}

/// Seeded draws on the GPU follow the sampler's distribution: 20,000 rows of
/// one small vocabulary, counted against the probabilities the CPU
/// sampler's arithmetic gives (chi-square at p = 0.001).
#[test]
#[ignore = "needs a GPU"]
fn gpu_draws_follow_the_samplers_distribution() {
    use crate::reduce::{Draw, RowReduce};
    let dev = gpu_device();
    let vocab = 16;
    let row: Vec<f32> = (0..vocab)
        .map(|i| ((i * 37) % 11) as f32 * 0.3 - 1.0)
        .collect();
    let mut r = Rng(5);
    for (temperature, min_p) in [(0.7f64, 0.0f64), (1.0, 0.2)] {
        let n = 20_000;
        let reqs: Vec<RowReduce> = (0..n)
            .map(|_| RowReduce {
                draw: Some(Draw {
                    temperature,
                    ln_min_p: if min_p > 0.0 {
                        min_p.ln()
                    } else {
                        f64::NEG_INFINITY
                    },
                    u: (f64::from(r.next()) * 0.5 + 0.5).clamp(0.0, 0.999_999),
                }),
                ..RowReduce::top(1)
            })
            .collect();
        // Uniform u: Rng::next is uniform in [-1, 1).
        let logits: Vec<f32> = (0..n).flat_map(|_| row.iter().copied()).collect();
        let got = reduce_on_gpu(&dev, &logits, vocab, &reqs);
        let mut counts = vec![0usize; vocab];
        for g in &got {
            counts[g.drawn.unwrap() as usize] += 1;
        }
        let w = draw_weights(&row, &reqs[0]);
        let total: f64 = w.iter().sum();
        let mut chi2 = 0.0;
        let mut cells = 0;
        for (c, w) in counts.iter().zip(&w) {
            if *w == 0.0 {
                assert_eq!(*c, 0, "a token below min_p was drawn");
                continue;
            }
            let e = n as f64 * w / total;
            chi2 += (*c as f64 - e).powi(2) / e;
            cells += 1;
        }
        // The 0.999 quantile of chi-square with cells − 1 degrees of freedom
        // (Wilson–Hilferty).
        let k = (cells - 1) as f64;
        let z = 3.09;
        let limit = k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3);
        assert!(
            chi2 < limit,
            "T {temperature}, min_p {min_p}: chi-square {chi2:.1} over {cells} tokens (limit {limit:.1}); counts {counts:?}"
        );
    }
}

/// A step whose logits are reduced on the GPU leaves them there: each row
/// fetched afterwards is the CPU's, its digest (and a second one, and single
/// logits read later) the reference's of it.
#[test]
#[ignore = "needs a GPU"]
fn reduced_steps_keep_their_rows_on_the_gpu() {
    use crate::reduce::{reduce_row, LogitRows, RowReduce};
    let s = store();
    let (cpu, gpu) = cpu_and_gpu(&s);
    let want = scenario(&*cpu, KvDType::F16);
    let g = model_graph(gpu.store());
    let compile = |rows: usize| -> Box<dyn Executable> {
        let max = Bindings::new().with(Sym::SEQ, rows).with(Sym::ROWS, rows);
        gpu.compile(&g, &CompileOptions::new(max)).unwrap()
    };
    let (mut prefill, mut decode) = (compile(64), compile(3));
    let mut got = Vec::new();
    drive(&mut pool_of(&*gpu, KvDType::F16), &mut |kv, b| {
        let p = if b.len() <= 3 {
            &mut decode
        } else {
            &mut prefill
        };
        let reqs: Vec<RowReduce> = (0..b.logit_rows().len())
            .map(|i| RowReduce::top(1 + (i * 13) % 64))
            .collect();
        let (outs, rows) = p.run_reduced(b, Some(kv), "logits", &reqs).unwrap();
        assert!(outs.get("logits").is_err(), "reduced rows came back whole");
        let LogitRows::Reduced(digests) = rows else {
            panic!("the GPU returned whole rows")
        };
        let mut step = Vec::new();
        for (i, (d, req)) in digests.iter().zip(&reqs).enumerate() {
            let row = p.fetch_row("logits", i).unwrap();
            let r = reduce_row(&row, req);
            assert_eq!(
                (&d.top, d.live, d.drawn),
                (&r.top, r.live, r.drawn),
                "row {i}"
            );
            assert!((d.sum_exp - r.sum_exp).abs() < 1e-5 * r.sum_exp, "row {i}");
            // A second digest of the kept row, and single logits.
            let again = RowReduce::top(20);
            let d2 = p.reduce_kept("logits", i, &again).unwrap();
            let r2 = reduce_row(&row, &again);
            assert_eq!((&d2.top, d2.live), (&r2.top, r2.live), "row {i} again");
            for t in [0, row.len() / 3, row.len() - 1] {
                let l = p.fetch_logit("logits", i, t as u32).unwrap();
                assert_eq!(l.to_bits(), row[t].to_bits(), "row {i}, logit {t}");
            }
            assert!(p.fetch_logit("logits", i, row.len() as u32).is_err());
            step.extend(row);
        }
        assert!(p.fetch_row("logits", reqs.len()).is_err());
        assert!(p
            .reduce_kept("logits", reqs.len(), &RowReduce::top(1))
            .is_err());
        got.push(step);
    });
    assert_eq!(want.len(), got.len());
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        let err = rel_l2(g, w);
        assert!(err < 1e-3, "step {i}: CUDA vs CPU relative L2 {err}");
    }
}

#[test]
fn tensor_core_products_cut_k_to_fill_the_gpu() {
    use super::plan::mmq_shares;
    let sms = 132;
    // 4B shapes (rows, units): o, fused q/k/v, gate/up, down, the LM head;
    // 1B's; a tiny product; one of fewer than eight units.
    for (rows, units) in [
        (2560, 64),
        (4096, 80),
        (20480, 80),
        (2560, 320),
        (262_144, 80),
        (1152, 216),
        (1536, 36),
        (64, 8),
        (100, 3),
    ] {
        let (shares, per) = mmq_shares(rows, units, sms);
        let groups = units.div_ceil(4);
        let blocks = rows.div_ceil(128);
        let at = format!("{rows} rows of {units} units: {shares} shares of {per}");
        assert!((1..=16).contains(&shares), "{at}");
        // Every group in a share, no share empty.
        assert!(
            shares * per >= groups && (shares - 1) * per < groups,
            "{at}"
        );
        // The partial sums fit their buffer (4 · sms blocks of 128 rows).
        assert!(shares == 1 || blocks * shares < 4 * sms, "{at}");
        if blocks >= 2 * sms {
            assert_eq!(shares, 1, "{at}: fills the GPU alone");
        } else if groups >= 4 {
            // Cut until about two blocks a multiprocessor, or the cap.
            assert!(shares > 1, "{at}");
            assert!(per >= 2, "{at}");
            assert!(
                blocks * shares >= sms || shares * 2 > groups / 2 || shares == 16,
                "{at}"
            );
        }
    }
    // The 4B's down projection: 20 row blocks, 80 groups of four units.
    assert_eq!(mmq_shares(2560, 320, sms), (14, 6));
}

/// The tensor-core products of 9–64 rows against bf16-rounded operands
/// summed in f64: every weight type, each of the three kernels, rows not a
/// multiple of 8 or of 128, k not a multiple of 128, one to three weights
/// in a launch, and k cut into shares.
#[test]
#[ignore = "needs a GPU"]
fn tensor_core_products_match_bf16_operands() {
    use super::plan::mmq_shares;
    use cudarc::driver::LaunchConfig;
    let dev = gpu_device();
    let s = &dev.stream;
    let mut r = Rng(17);
    let bf = |v: f32| half::bf16::from_f32(v).to_f32();
    let mut failures = Vec::new();
    for (code, &(ty, name)) in super::TYPES.iter().enumerate() {
        for (m, parts, k) in [
            (5usize, &[64usize][..], 256usize),
            (16, &[64, 100, 36][..], 544),
            (33, &[130][..], 512),
            (64, &[200, 100][..], 1024),
        ] {
            // Rows of whole blocks (544 is 768 for the 256-element types).
            let k = k.next_multiple_of(ty.block_elems());
            let n: usize = parts.iter().sum();
            let x: Vec<f32> = (0..m * k).map(|_| r.next() * 2.0).collect();
            let x16: Vec<u16> = x
                .iter()
                .map(|&v| half::bf16::from_f32(v).to_bits())
                .collect();
            let mut wf = Vec::new();
            let mut ws = Vec::new();
            for &rows in parts {
                let bytes = random_rows(ty, rows, k, &mut r);
                wf.extend(rlx_gguf::dequantize_to_vec(ty, &bytes).unwrap());
                ws.push(s.clone_htod(&bytes).unwrap());
            }
            let (ldy, y_off) = (n + 3, 2usize);
            let xg = s.clone_htod(&x16).unwrap();
            let y = s.alloc_zeros::<f32>(m * ldy).unwrap();
            let (shares, per) = mmq_shares(n, k / 32, dev.sms);
            let part = s.alloc_zeros::<f32>(shares * m * n).unwrap();
            let e0 = parts[0];
            let e1 = e0 + parts.get(1).copied().unwrap_or(0);
            let w = |i: usize| dev.ptr(&ws[i.min(ws.len() - 1)]);
            let cfg = LaunchConfig {
                grid_dim: (n.div_ceil(128) as u32, shares as u32, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            let variant = super::plan::mmq_variant(m);
            let args = [
                w(0),
                w(1),
                w(2),
                e0 as u64,
                e1 as u64,
                dev.ptr(&xg),
                dev.ptr(&y),
                dev.ptr(&part),
                m as u64,
                n as u64,
                k as u64,
                ldy as u64,
                y_off as u64,
                per as u64,
            ];
            launch_raw(s, &dev.kernels.mmq[code][variant], cfg, &args);
            if shares > 1 {
                let args = [
                    dev.ptr(&part),
                    dev.ptr(&y),
                    m as u64,
                    n as u64,
                    shares as u64,
                    ldy as u64,
                    y_off as u64,
                ];
                launch_raw(s, &dev.kernels.mmq_sum, super::plan::linear(m * n), &args);
            }
            let got = s.clone_dtoh(&y).unwrap();
            let mut worst = 0f64;
            for t in 0..m {
                for o in 0..n {
                    let (mut sum, mut mag) = (0f64, 0f64);
                    for i in 0..k {
                        let p = f64::from(bf(wf[o * k + i])) * f64::from(bf(x[t * k + i]));
                        sum += p;
                        mag += p.abs();
                    }
                    let g = f64::from(got[t * ldy + y_off + o]);
                    worst = worst.max((g - sum).abs() / mag.max(1e-30));
                }
            }
            // f32 sums of k products, and a weight now and then a bf16 step
            // apart where its f32 value rounds differently from the
            // reference's: ~1e-5; an element out of order is ~1e-1.
            if worst.is_nan() || worst >= 2e-4 {
                failures.push(format!(
                    "{name} m {m} rows {parts:?} k {k} shares {shares}: {worst:e}"
                ));
            }
            // Nothing written outside the product's columns.
            let outside = (0..m).any(|t| {
                (0..ldy)
                    .filter(|c| *c < y_off || *c >= y_off + n)
                    .any(|c| got[t * ldy + c] != 0.0)
            });
            if outside {
                failures.push(format!("{name} m {m}: wrote outside its columns"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Profiling times every launch of a step and changes nothing it computes:
/// the scenario's logits are bit for bit those of graph replays, each
/// decode step reads every matrix of the graph once in its products, and
/// every launch has its kernel's name.
#[test]
#[ignore = "needs a GPU"]
fn profiled_steps_compute_the_same_and_name_every_kernel() {
    let s = store();
    let gpu = open(Device::Cuda(0), &s, &gpu_options(2)).unwrap();
    let want = scenario(&*gpu, KvDType::F16);
    assert!(gpu.set_profiling(true));
    gpu.take_profile();
    let got = scenario(&*gpu, KvDType::F16);
    gpu.set_profiling(false);
    let profile = gpu.take_profile();
    assert!(want == got, "profiled steps computed other logits");
    let g = model_graph(&s);
    let matrices: u64 = g
        .ids()
        .filter(|&id| matches!(g.node(id).op, rlx_ir::Op::MatMul { .. }))
        .map(|id| {
            let w = g.node(id).inputs[1];
            let rlx_ir::Op::Weight { id: w, .. } = g.node(w).op else {
                panic!("products of weights")
            };
            s.bytes(w).len() as u64
        })
        .sum();
    // The scenario's decode steps of three rows (see `drive`).
    let decode = profile.iter().find(|p| p.rows == 3).expect("3-row steps");
    assert_eq!(decode.steps, 40, "{profile:?}");
    let read: u64 = decode.kernels.iter().map(|k| k.weight_bytes).sum();
    assert_eq!(read, 40 * matrices, "{decode:?}");
    for p in &profile {
        for k in &p.kernels {
            assert!(!k.name.is_empty() && k.seconds > 0.0, "{k:?}");
        }
    }
    assert!(decode.kernels.iter().any(|k| k.name.starts_with("mmv")));
    assert!(decode
        .kernels
        .iter()
        .any(|k| k.name.starts_with("attention")));
}
