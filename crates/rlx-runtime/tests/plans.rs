//! Whole plans on a small transformer-shaped model with packed weights:
//! fusion is exact, one plan serves every length, incremental decode matches
//! prefill, a batch of sequences matches each alone, taps expose
//! intermediates, and plans share the weights.

use std::collections::HashMap;
use std::sync::Arc;

use rlx_gguf::{GgmlType, GgufFile, GgufWriter};
use rlx_ir::passes::FuseOptions;
use rlx_ir::{
    AttentionSpec, Bindings, CacheSlot, DType, Dim, Graph, KvSource, Mask, NodeId, RopeSpec, Shape,
    Sym,
};
use rlx_runtime::cpu::{compile, CpuDevice, CpuKvStorage, Plan};
use rlx_runtime::{
    Batch, CompileOptions, KvDType, KvError, KvLayerSpec, KvPool, KvPoolConfig, KvTypes, RunError,
    SeqId, SlotSet, WeightStore,
};

const D: usize = 256;
const HQ: usize = 4;
const HKV: usize = 2;
const HD: usize = 64;
const FF: usize = 512;
const VOCAB: usize = 96;
const LAYERS: usize = 2;
const WINDOW: usize = 4;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
}

/// A random model as a GGUF image, with a mix of weight types.
fn model_bytes() -> Vec<u8> {
    let mut r = Rng(42);
    let mut w = GgufWriter::new();
    w.add("general.architecture", "test").unwrap();
    let mut add =
        |w: &mut GgufWriter, name: &str, ty: GgmlType, rows: usize, k: usize, scale: f32| {
            let x: Vec<f32> = (0..rows * k).map(|_| r.next() * scale).collect();
            let bytes = match ty {
                GgmlType::F32 => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
                GgmlType::F16 => x
                    .iter()
                    .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
                    .collect(),
                _ => rlx_gguf::quantize_to_vec(ty, &x).unwrap(),
            };
            let dims: Vec<u64> = if rows == 1 {
                vec![k as u64]
            } else {
                vec![k as u64, rows as u64]
            };
            w.add_tensor(name, ty, &dims, bytes).unwrap();
        };
    add(&mut w, "token_embd.weight", GgmlType::Q8_0, VOCAB, D, 1.0);
    add(&mut w, "output_norm.weight", GgmlType::F32, 1, D, 1.0);
    for l in 0..LAYERS {
        let p = |s: &str| format!("blk.{l}.{s}");
        add(&mut w, &p("attn_norm.weight"), GgmlType::F32, 1, D, 1.0);
        add(&mut w, &p("attn_q.weight"), GgmlType::Q4_K, HQ * HD, D, 0.3);
        add(
            &mut w,
            &p("attn_k.weight"),
            GgmlType::Q5_0,
            HKV * HD,
            D,
            0.3,
        );
        add(
            &mut w,
            &p("attn_v.weight"),
            GgmlType::Q8_0,
            HKV * HD,
            D,
            0.3,
        );
        add(
            &mut w,
            &p("attn_output.weight"),
            GgmlType::Q6_K,
            D,
            HQ * HD,
            0.3,
        );
        add(&mut w, &p("ffn_norm.weight"), GgmlType::F16, 1, D, 1.0);
        add(&mut w, &p("ffn_gate.weight"), GgmlType::Q4_0, FF, D, 0.3);
        add(&mut w, &p("ffn_up.weight"), GgmlType::Q4_K, FF, D, 0.3);
        add(&mut w, &p("ffn_down.weight"), GgmlType::Q8_0, D, FF, 0.3);
    }
    w.to_bytes()
}

fn store() -> Arc<WeightStore> {
    let file = GgufFile::from_bytes(model_bytes()).unwrap();
    Arc::new(WeightStore::new(Arc::new(file)))
}

fn seq() -> Dim {
    Dim::Sym(Sym::SEQ)
}

/// One layer, the same function for prefill and decode (shapes differ only
/// through the `seq` symbol).
fn layer(
    g: &mut Graph,
    s: &WeightStore,
    l: usize,
    x: NodeId,
    pos: NodeId,
    spans: Option<NodeId>,
) -> NodeId {
    let w = |g: &mut Graph, name: &str| s.node(g, &format!("blk.{l}.{name}")).unwrap();
    let attn_norm = w(g, "attn_norm.weight");
    let (wq, wk, wv, wo) = (
        w(g, "attn_q.weight"),
        w(g, "attn_k.weight"),
        w(g, "attn_v.weight"),
        w(g, "attn_output.weight"),
    );
    let h = g.rms_norm(x, Some(attn_norm), 1e-6).unwrap();
    let q = g.matmul(h, wq).unwrap();
    let k = g.matmul(h, wk).unwrap();
    let v = g.matmul(h, wv).unwrap();
    let q = g
        .reshape(q, Shape::new([seq(), HQ.into(), HD.into()]))
        .unwrap();
    let k = g
        .reshape(k, Shape::new([seq(), HKV.into(), HD.into()]))
        .unwrap();
    let v = g
        .reshape(v, Shape::new([seq(), HKV.into(), HD.into()]))
        .unwrap();
    let rope = RopeSpec {
        n_rot: HD,
        base: 10000.0,
        freq_scale: 1.0,
        has_freq_factors: false,
    };
    let q = g.rope(q, pos, rope, None).unwrap();
    let k = g.rope(k, pos, rope, None).unwrap();
    let slot = CacheSlot(l as u32);
    let written = match spans {
        Some(sp) => g.kv_write_spans(slot, k, v, sp).unwrap(),
        None => g.kv_write(slot, k, v).unwrap(),
    };
    let mask = if l.is_multiple_of(2) {
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
    let a = g.attention_cached(q, written, slot, spec, spans).unwrap();
    let a = g.reshape(a, Shape::new([seq(), (HQ * HD).into()])).unwrap();
    g.set_name(a, format!("blk.{l}.attn_out"));
    let o = g.matmul(a, wo).unwrap();
    let x = g.add(x, o).unwrap();
    let ffn_norm = w(g, "ffn_norm.weight");
    let (wg, wu, wd) = (
        w(g, "ffn_gate.weight"),
        w(g, "ffn_up.weight"),
        w(g, "ffn_down.weight"),
    );
    let h = g.rms_norm(x, Some(ffn_norm), 1e-6).unwrap();
    let gate = g.matmul(h, wg).unwrap();
    let up = g.matmul(h, wu).unwrap();
    let act = g.gelu(gate).unwrap();
    let m = g.mul(act, up).unwrap();
    let down = g.matmul(m, wd).unwrap();
    let out = g.add(x, down).unwrap();
    g.set_name(out, format!("blk.{l}.out"));
    out
}

fn model_graph(s: &WeightStore) -> Graph {
    model_graph_with(s, false)
}

/// The model; with `spans`, its attention reads each row's span id (the
/// `spans` step input) and opens spans bidirectionally.
fn model_graph_with(s: &WeightStore, spans: bool) -> Graph {
    let mut g = Graph::new();
    let tokens = g.input("tokens", DType::I32, Shape::new([seq()]));
    let pos = g.input("pos", DType::I32, Shape::new([seq()]));
    let spans = spans.then(|| g.input("spans", DType::I32, Shape::new([seq()])));
    let embd = s.node(&mut g, "token_embd.weight").unwrap();
    let x = g.gather(embd, tokens).unwrap();
    let mut x = g.scale(x, (D as f32).sqrt()).unwrap();
    for l in 0..LAYERS {
        x = layer(&mut g, s, l, x, pos, spans);
    }
    let norm = s.node(&mut g, "output_norm.weight").unwrap();
    let h = g.rms_norm(x, Some(norm), 1e-6).unwrap();
    let logits = g.matmul(h, embd).unwrap();
    let logits = g.softcap(logits, 30.0).unwrap();
    g.output("logits", logits);
    g
}

/// A pool for `seqs` sequences and one sequence in it.
fn pool(max_chunk: usize, seqs: usize) -> KvPool {
    let layer = |l: usize| KvLayerSpec {
        kv_heads: HKV,
        head_dim: HD,
        v_head_dim: HD,
        window: l.is_multiple_of(2).then_some(WINDOW),
        shares: None,
    };
    let config = KvPoolConfig {
        layers: (0..LAYERS).map(layer).collect(),
        types: KvTypes::both(KvDType::F32),
        tokens: 64 * seqs,
        max_seqs: seqs,
        max_chunk,
    };
    let storage = CpuKvStorage::new(&config, &SlotSet::All).unwrap();
    KvPool::new(config, Box::new(storage)).unwrap()
}

/// A pool holding one empty sequence.
fn cache(max_chunk: usize) -> (KvPool, SeqId) {
    let mut p = pool(max_chunk, 1);
    let s = p.add_sequence();
    (p, s)
}

fn plan(s: &Arc<WeightStore>, max_seq: usize, fuse: FuseOptions, threads: usize) -> Plan {
    let mut opts = CompileOptions::new(Bindings::new().with(Sym::SEQ, max_seq));
    opts.fuse = fuse;
    compile(&model_graph(s), s, &CpuDevice::new(threads), &opts).unwrap()
}

fn tokens(n: usize, start: usize) -> Vec<i32> {
    (start..start + n)
        .map(|i| ((i * 37 + 11) % VOCAB) as i32)
        .collect()
}

fn step(p: &mut Plan, (kv, seq): &mut (KvPool, SeqId), toks: &[i32]) -> Vec<f32> {
    let start = kv.len(*seq).unwrap();
    let mut b = Batch::new();
    for (i, &t) in toks.iter().enumerate() {
        b.push(*seq, start + i, t as u32, true);
    }
    p.run(&b, Some(kv)).unwrap().take_f32("logits").unwrap()
}

fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den).sqrt()
}

#[test]
fn fused_and_unfused_plans_agree() {
    let s = store();
    let toks = tokens(9, 0);
    let mut fused = plan(&s, 16, FuseOptions::default(), 2);
    let mut plain = plan(&s, 16, FuseOptions::none(), 2);
    assert!(fused.graph().len() < plain.graph().len());
    let a = step(&mut fused, &mut cache(16), &toks);
    let b = step(&mut plain, &mut cache(16), &toks);
    assert_eq!(a.len(), 9 * VOCAB);
    let err = rel_l2(&a, &b);
    assert!(err < 1e-6, "fused vs unfused relative L2 {err}");
}

#[test]
fn one_plan_serves_every_length_like_per_length_plans() {
    let s = store();
    let mut shared = plan(&s, 16, FuseOptions::default(), 2);
    for n in [1usize, 5, 11, 16] {
        let toks = tokens(n, 3);
        let a = step(&mut shared, &mut cache(16), &toks);
        let mut own = plan(&s, n, FuseOptions::default(), 2);
        let b = step(&mut own, &mut cache(16), &toks);
        assert_eq!(a, b, "seq {n}");
        assert!(own.arena_bytes() <= shared.arena_bytes());
    }
}

#[test]
fn incremental_decode_matches_one_prefill_across_the_window() {
    let s = store();
    let toks = tokens(12, 0);
    let mut p = plan(&s, 12, FuseOptions::default(), 3);
    let full = step(&mut p, &mut cache(12), &toks);
    // Prefill 5 in one chunk, then 2, then single tokens (ring of 4+3−1 rows).
    let mut kv = cache(3);
    let mut p3 = plan(&s, 3, FuseOptions::default(), 1);
    let mut got = Vec::new();
    for chunk in [
        &toks[0..3],
        &toks[3..5],
        &toks[5..6],
        &toks[6..9],
        &toks[9..10],
        &toks[10..12],
    ] {
        got.extend(step(&mut p3, &mut kv, chunk));
    }
    assert_eq!(kv.0.len(kv.1).unwrap(), 12);
    let err = rel_l2(&got, &full);
    assert!(err < 1e-5, "chunked vs single prefill relative L2 {err}");
}

#[test]
fn taps_expose_named_intermediates() {
    let s = store();
    let toks = tokens(6, 0);
    let mut seen: HashMap<String, Vec<f32>> = HashMap::new();
    let mut p = plan(&s, 8, FuseOptions::none(), 2);
    let (mut kv, seq) = cache(8);
    let mut batch = Batch::new();
    batch.push_run(
        seq,
        0,
        &toks.iter().map(|&t| t as u32).collect::<Vec<_>>(),
        |_| true,
    );
    p.run_with_tap(&batch, Some(&mut kv), &mut |name, dims, v| {
        if name.starts_with("blk.") {
            assert_eq!(dims.iter().product::<usize>(), v.len());
            seen.insert(name.to_owned(), v.to_vec());
        }
    })
    .unwrap();
    assert_eq!(seen["blk.0.attn_out"].len(), 6 * HQ * HD);
    assert_eq!(seen["blk.1.out"].len(), 6 * D);
    // The fused plan taps the same values.
    let mut fused = plan(&s, 8, FuseOptions::default(), 2);
    let mut again = Vec::new();
    let (mut kv, _) = cache(8);
    fused
        .run_with_tap(&batch, Some(&mut kv), &mut |name, _, v| {
            if name == "blk.1.out" {
                again = v.to_vec();
            }
        })
        .unwrap();
    assert!(rel_l2(&again, &seen["blk.1.out"]) < 1e-6);
}

#[test]
fn compiling_more_plans_adds_no_weight_memory() {
    let s = store();
    let weights = s.mapped_bytes();
    let plans: Vec<Plan> = (1..=20)
        .map(|n| plan(&s, n, FuseOptions::default(), 1))
        .collect();
    assert_eq!(s.owned_bytes(), 0);
    // Every plan reads the store's bytes in place.
    assert_eq!(Arc::strong_count(&s), 21);
    let id = s.id("blk.0.attn_q.weight").unwrap();
    for p in &plans {
        assert!(std::ptr::eq(p.store().bytes(id), s.bytes(id)));
    }
    // A plan's own memory is its arena, far below the weights it uses even
    // at its largest length.
    let largest = plans.iter().map(Plan::arena_bytes).max().unwrap();
    assert!(
        largest < weights / 2,
        "arena {largest} vs weights {weights}"
    );
}

#[test]
fn the_plan_dump_shows_kernels_buffers_and_fused_groups() {
    let s = store();
    let p = plan(&s, 8, FuseOptions::default(), 2);
    let d = p.dump();
    assert!(d.contains("arena"), "{d}");
    assert!(d.contains("[fused: rms_norm + matmul × 3: blk.0.attn_q.weight:Q4_K, blk.0.attn_k.weight:Q5_0, blk.0.attn_v.weight:Q8_0]"), "{d}");
    assert!(d.contains("[fused: gelu + mul]"), "{d}");
    assert!(d.contains("@["), "{d}");
}

#[test]
fn a_batch_of_sequences_matches_each_alone() {
    let s = store();
    let mut p = plan(&s, 24, FuseOptions::default(), 2);
    // Three sequences of different lengths, each a prompt then one token.
    let prompts = [tokens(9, 0), tokens(3, 5), tokens(6, 20)];
    let mut alone = Vec::new();
    for toks in &prompts {
        let mut kv = cache(24);
        let mut rows = step(&mut p, &mut kv, &toks[..toks.len() - 1]);
        rows.extend(step(&mut p, &mut kv, &toks[toks.len() - 1..]));
        alone.push(rows);
    }
    let mut kv = pool(24, 3);
    let ids: Vec<SeqId> = (0..3).map(|_| kv.add_sequence()).collect();
    let mut got = vec![Vec::new(); 3];
    // Step 1: every prompt but its last token, in one batch.
    let mut b = Batch::new();
    for (s, toks) in ids.iter().zip(&prompts) {
        let n = toks.len() - 1;
        let t: Vec<u32> = toks[..n].iter().map(|&t| t as u32).collect();
        b.push_run(*s, 0, &t, |_| true);
    }
    let out = p.run(&b, Some(&mut kv)).unwrap();
    let logits = out.get("logits").unwrap().as_f32().unwrap();
    let mut row = 0;
    for (i, toks) in prompts.iter().enumerate() {
        let n = (toks.len() - 1) * VOCAB;
        got[i].extend_from_slice(&logits[row..row + n]);
        row += n;
    }
    // Step 2: the last tokens, decoded together.
    let mut b = Batch::new();
    for (s, toks) in ids.iter().zip(&prompts) {
        b.push(*s, toks.len() - 1, *toks.last().unwrap() as u32, true);
    }
    let out = p.run(&b, Some(&mut kv)).unwrap();
    let logits = out.get("logits").unwrap().as_f32().unwrap();
    for (i, row) in logits.chunks(VOCAB).enumerate() {
        got[i].extend_from_slice(row);
    }
    for i in 0..3 {
        let err = rel_l2(&got[i], &alone[i]);
        assert!(err < 1e-6, "sequence {i}: batch vs alone relative L2 {err}");
    }
    kv.check_invariants().unwrap();
}

#[test]
fn run_errors_name_the_problem() {
    let s = store();
    let mut p = plan(&s, 4, FuseOptions::default(), 1);
    let (mut kv, seq) = cache(8);
    let mut run = |toks: Vec<u32>, start: usize| {
        let mut b = Batch::new();
        b.push_run(seq, start, &toks, |_| true);
        p.run(&b, Some(&mut kv))
    };
    let e = run(vec![1; 5], 0).unwrap_err();
    assert!(
        matches!(
            e,
            RunError::TooLarge {
                value: 5,
                max: 4,
                ..
            }
        ),
        "{e}"
    );
    let e = run(vec![1, 2], 3).unwrap_err();
    assert!(
        matches!(e, RunError::Kv(KvError::Position { len: 0, pos: 3, .. })),
        "{e}"
    );
    let e = run(vec![1, VOCAB as u32 + 3], 0).unwrap_err();
    assert!(
        e.to_string().contains(&format!("token id {}", VOCAB + 3)),
        "{e}"
    );
    let mut b = Batch::new();
    b.push(SeqId(7), 0, 1, true);
    let e = p.run(&b, Some(&mut kv)).unwrap_err();
    assert!(e.to_string().contains("sequence 7"), "{e}");
    let e = p.run(&Batch::new(), Some(&mut kv)).unwrap_err();
    assert!(e.to_string().contains("empty"), "{e}");
    // A step refused for its length takes nothing from the pool.
    let free = kv.free_blocks();
    let mut b = Batch::new();
    b.push_run(seq, 0, &[1; 5], |_| true);
    assert!(p.run(&b, Some(&mut kv)).is_err());
    assert_eq!((kv.free_blocks(), kv.len(seq).unwrap()), (free, 0));
}

#[test]
fn a_span_sees_itself_both_ways_and_nothing_else_changes() {
    // Rows 3..=8 in one span: the rows before it compute exactly what they
    // compute without spans; the span's rows see its later keys (their
    // logits change), which the step's `spans` input says.
    let s = store();
    let mut opts = CompileOptions::new(Bindings::new().with(Sym::SEQ, 16));
    opts.optimize = true;
    let mut plan = compile(&model_graph_with(&s, true), &s, &CpuDevice::new(2), &opts).unwrap();
    let toks = tokens(12, 0);
    let run = |plan: &mut Plan, span: &dyn Fn(usize) -> i32| {
        let (mut kv, seq) = cache(16);
        let mut b = Batch::new();
        for (i, &t) in toks.iter().enumerate() {
            b.push_in_span(seq, i, t as u32, true, span(i));
        }
        plan.run(&b, Some(&mut kv))
            .unwrap()
            .take_f32("logits")
            .unwrap()
    };
    let plain = run(&mut plan, &|_| 0);
    let spanned = run(&mut plan, &|i| if (3..=8).contains(&i) { 5 } else { 0 });
    let row = |v: &[f32], r: usize| v[r * VOCAB..(r + 1) * VOCAB].to_vec();
    for r in 0..3 {
        assert_eq!(row(&plain, r), row(&spanned, r), "row {r} before the span");
    }
    for r in 3..8 {
        assert_ne!(row(&plain, r), row(&spanned, r), "row {r} in the span");
    }
    // Without spans the graph's rows are the plain model's.
    let mut unspanned = plan_of(&s);
    let (mut kv, seq) = cache(16);
    let mut b = Batch::new();
    for (i, &t) in toks.iter().enumerate() {
        b.push(seq, i, t as u32, true);
    }
    let base = unspanned
        .run(&b, Some(&mut kv))
        .unwrap()
        .take_f32("logits")
        .unwrap();
    assert_eq!(base, plain);
}

fn plan_of(s: &Arc<WeightStore>) -> Plan {
    let opts = CompileOptions::new(Bindings::new().with(Sym::SEQ, 16));
    compile(&model_graph(s), s, &CpuDevice::new(2), &opts).unwrap()
}
