//! Shape inference, validation errors, and what each pass does to a
//! transformer-shaped graph.

use rlx_gguf::GgmlType;
use rlx_ir::passes::{cse, dce, fuse, optimize, FuseOptions};
use rlx_ir::{
    AttentionSpec, CacheSlot, DType, Dim, Graph, KvSource, Mask, Op, RopeSpec, Shape, Start, Sym,
    WeightId,
};

const D: usize = 64;
const HD: usize = 16;

fn seq() -> Dim {
    Dim::Sym(Sym::SEQ)
}

/// One Gemma-like layer over a symbolic sequence, unfused.
fn layer_graph() -> Graph {
    let mut g = Graph::new();
    let mut w = 0u32;
    let mut weight = |g: &mut Graph, name: &str, ty: GgmlType, shape: &[usize]| {
        w += 1;
        g.weight(WeightId(w), name, ty, Shape::fixed(shape))
    };
    let x = g.input("x", DType::F32, Shape::new([seq(), Dim::Fixed(D)]));
    let pos = g.input("pos", DType::I32, Shape::new([seq()]));
    let norm_w = weight(&mut g, "attn_norm", GgmlType::F32, &[D]);
    let wq = weight(&mut g, "q", GgmlType::Q4_K, &[4 * HD, D]);
    let wk = weight(&mut g, "k", GgmlType::Q8_0, &[HD, D]);
    let wv = weight(&mut g, "v", GgmlType::Q6_K, &[HD, D]);
    let h = g.rms_norm(x, Some(norm_w), 1e-6).unwrap();
    let q = g.matmul(h, wq).unwrap();
    let k = g.matmul(h, wk).unwrap();
    let v = g.matmul(h, wv).unwrap();
    let q = g
        .reshape(q, Shape::new([seq(), 4.into(), HD.into()]))
        .unwrap();
    let k = g
        .reshape(k, Shape::new([seq(), 1.into(), HD.into()]))
        .unwrap();
    let v = g
        .reshape(v, Shape::new([seq(), 1.into(), HD.into()]))
        .unwrap();
    let rope = RopeSpec {
        n_rot: HD,
        base: 10000.0,
        freq_scale: 1.0,
        has_freq_factors: false,
    };
    let q = g.rope(q, pos, rope, None).unwrap();
    let k = g.rope(k, pos, rope, None).unwrap();
    let written = g.kv_write(CacheSlot(0), k, v).unwrap();
    let spec = AttentionSpec {
        mask: Mask::Sliding { window: 8 },
        scale: 0.25,
        softcap: None,
        kv: KvSource::Inputs,
        bidirectional_spans: false,
    };
    let a = g
        .attention_cached(q, written, CacheSlot(0), spec, None)
        .unwrap();
    let a = g.reshape(a, Shape::new([seq(), (4 * HD).into()])).unwrap();
    let wo = weight(&mut g, "o", GgmlType::Q5_0, &[D, 4 * HD]);
    let o = g.matmul(a, wo).unwrap();
    let x = g.add(x, o).unwrap();
    let ffn_norm = weight(&mut g, "ffn_norm", GgmlType::F32, &[D]);
    let wg = weight(&mut g, "gate", GgmlType::Q4_0, &[96, D]);
    let wu = weight(&mut g, "up", GgmlType::Q4_0, &[96, D]);
    let wd = weight(&mut g, "down", GgmlType::Q8_0, &[D, 96]);
    let h = g.rms_norm(x, Some(ffn_norm), 1e-6).unwrap();
    let gate = g.matmul(h, wg).unwrap();
    let up = g.matmul(h, wu).unwrap();
    let act = g.gelu(gate).unwrap();
    let m = g.mul(act, up).unwrap();
    let down = g.matmul(m, wd).unwrap();
    let out = g.add(x, down).unwrap();
    let last = g.narrow(out, 0, Start::FromEnd(1), 1).unwrap();
    g.set_name(last, "last");
    g.output("hidden", out);
    g.output("last", last);
    g
}

fn count(g: &Graph, pred: impl Fn(&Op) -> bool) -> usize {
    g.nodes().iter().filter(|n| pred(&n.op)).count()
}

#[test]
fn symbolic_shapes_are_inferred() {
    let g = layer_graph();
    g.validate().unwrap();
    let out = g.outputs()[0].1;
    assert_eq!(g.node(out).shape, Shape::new([seq(), Dim::Fixed(D)]));
    let last = g.find("last").unwrap();
    assert_eq!(g.node(last).shape, Shape::fixed(&[1, D]));
    assert_eq!(g.cache_slots()[&CacheSlot(0)].kv_heads, 1);
}

#[test]
fn shape_errors_name_the_node_and_the_problem() {
    let mut g = Graph::new();
    let x = g.input("x", DType::F32, Shape::new([seq(), Dim::Fixed(10)]));
    let w = g.weight(
        WeightId(0),
        "blk.0.attn_q.weight",
        GgmlType::Q8_0,
        Shape::fixed(&[32, 64]),
    );
    let e = g.matmul(x, w).unwrap_err();
    assert_eq!(e.node.0, 2);
    let msg = e.to_string();
    assert!(
        msg.contains("matmul") && msg.contains("blk.0.attn_q.weight"),
        "{msg}"
    );
    assert!(msg.contains("10"), "{msg}");

    let e = g.reshape(x, Shape::fixed(&[3, 4])).unwrap_err();
    assert!(e.to_string().contains("cannot reshape"), "{e}");
    let ids = g.input("ids", DType::F32, Shape::new([seq()]));
    let e = g.gather(w, ids).unwrap_err();
    assert!(e.to_string().contains("i32"), "{e}");
    let q = g.input("q", DType::F32, Shape::new([seq(), 3.into(), 8.into()]));
    let k = g.input("k", DType::F32, Shape::new([seq(), 2.into(), 8.into()]));
    let spec = AttentionSpec {
        mask: Mask::Causal,
        scale: 1.0,
        softcap: None,
        kv: KvSource::Inputs,
        bidirectional_spans: false,
    };
    let e = g.attention(q, k, k, spec).unwrap_err();
    assert!(e.to_string().contains("not a multiple"), "{e}");
}

#[test]
fn dce_drops_unused_nodes_but_keeps_effects() {
    let mut g = layer_graph();
    let x = g
        .nodes()
        .iter()
        .position(|n| n.name.as_deref() == Some("x"))
        .unwrap();
    let unused = g.scale(rlx_ir::NodeId(x as u32), 2.0).unwrap();
    let before = g.len();
    let g2 = dce(&g).unwrap();
    assert!(g2.len() < before);
    assert!(!g2.nodes().iter().any(|n| n.op == g.node(unused).op));
    assert_eq!(count(&g2, |op| matches!(op, Op::KvWrite { .. })), 1);
}

#[test]
fn cse_merges_identical_pure_nodes() {
    let mut g = Graph::new();
    let x = g.input("x", DType::F32, Shape::new([seq(), Dim::Fixed(4)]));
    let a = g.scale(x, 2.0).unwrap();
    let b = g.scale(x, 2.0).unwrap();
    let c = g.scale(x, 3.0).unwrap();
    let s = g.add(a, b).unwrap();
    let s = g.add(s, c).unwrap();
    g.output("y", s);
    let g2 = cse(&g).unwrap();
    assert_eq!(count(&g2, |op| matches!(op, Op::Scale { .. })), 2);
}

#[test]
fn fusion_groups_qkv_and_gate_up_folds_norms_and_forms_geglu() {
    let g = layer_graph();
    let f = optimize(&g, &FuseOptions::default()).unwrap();
    // q/k/v → one matmul with the norm folded in; gate/up → one with the norm;
    // o and down stay plain.
    let fused: Vec<_> = f
        .nodes()
        .iter()
        .filter(|n| matches!(n.op, Op::MatMul { norm: Some(_) }))
        .collect();
    assert_eq!(fused.len(), 2);
    // Inputs: x, γ, then the weights (of three different packed types).
    assert_eq!(fused[0].inputs.len(), 2 + 3);
    assert_eq!(fused[0].shape, Shape::new([seq(), Dim::Fixed(6 * HD)]));
    assert_eq!(fused[1].inputs.len(), 2 + 2);
    assert_eq!(count(&f, |op| matches!(op, Op::MatMul { norm: None })), 2);
    assert_eq!(count(&f, |op| matches!(op, Op::RmsNorm(_))), 0);
    assert_eq!(count(&f, |op| matches!(op, Op::GeGlu)), 1);
    assert_eq!(count(&f, |op| matches!(op, Op::Gelu)), 0);
    assert_eq!(count(&f, |op| matches!(op, Op::Narrow { .. })), 5 + 1);
    // The same outputs exist with the same shapes.
    for ((n1, a), (n2, b)) in g.outputs().iter().zip(f.outputs()) {
        assert_eq!(n1, n2);
        assert_eq!(g.node(*a).shape, f.node(*b).shape);
    }
    // Each fusion can be switched off alone.
    let only_geglu = fuse(
        &g,
        &FuseOptions {
            group_matmuls: false,
            fold_norms: false,
            geglu: true,
        },
    )
    .unwrap();
    assert_eq!(count(&only_geglu, |op| matches!(op, Op::MatMul { .. })), 7);
    let none = fuse(&g, &FuseOptions::none()).unwrap();
    assert_eq!(none.len(), dce(&g).unwrap().len());
}

#[test]
fn a_norm_with_a_non_matmul_user_is_not_folded() {
    let mut g = Graph::new();
    let x = g.input("x", DType::F32, Shape::new([seq(), Dim::Fixed(32)]));
    let w = g.weight(WeightId(0), "w", GgmlType::Q8_0, Shape::fixed(&[32, 32]));
    let h = g.rms_norm(x, None, 1e-6).unwrap();
    let y = g.matmul(h, w).unwrap();
    let z = g.add(y, h).unwrap();
    g.output("z", z);
    let f = optimize(&g, &FuseOptions::default()).unwrap();
    assert_eq!(count(&f, |op| matches!(op, Op::RmsNorm(_))), 1);
    assert_eq!(count(&f, |op| matches!(op, Op::MatMul { norm: None })), 1);
}

#[test]
fn the_dump_lists_ops_shapes_and_names() {
    let f = optimize(&layer_graph(), &FuseOptions::default()).unwrap();
    let text = f.to_string();
    assert!(text.contains("norm_matmul"), "{text}");
    assert!(text.contains("[seq, 96]"), "{text}");
    assert!(text.contains("weight #2 \"q\""), "{text}");
    assert!(text.contains("attention Sliding { window: 8 }"), "{text}");
    assert!(text.contains("output \"last\""), "{text}");
}
