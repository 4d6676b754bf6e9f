//! The graph: nodes in topological order, builder methods with shape
//! inference, and validation.

use std::collections::HashMap;
use std::fmt;

use rlx_gguf::GgmlType;

use crate::op::{AttentionSpec, CacheSlot, KvSource, NormSpec, Op, RopeSpec, Start, WeightId};
use crate::shape::{Dim, Shape};
use crate::DType;

/// Index of a node in its graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeId(pub u32);

impl NodeId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

/// One node: an op, its inputs, and its inferred result type and shape.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub op: Op,
    pub inputs: Vec<NodeId>,
    pub dtype: DType,
    pub shape: Shape,
    /// A name for debug taps and dumps (e.g. `blk.3.attn_out`).
    pub name: Option<String>,
}

/// A shape or type error, naming the node it happened at.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("node {node} ({op}{}): {msg}", name.as_ref().map(|n| format!(" {n:?}")).unwrap_or_default())]
pub struct IrError {
    pub node: NodeId,
    pub op: &'static str,
    pub name: Option<String>,
    pub msg: String,
}

pub type Result<T, E = IrError> = std::result::Result<T, E>;

/// Layout of one KV-cache slot as the graph uses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotLayout {
    pub kv_heads: usize,
    pub head_dim: usize,
    pub v_head_dim: usize,
}

/// A dataflow graph. Nodes are appended in topological order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Graph {
    nodes: Vec<Node>,
    outputs: Vec<(String, NodeId)>,
}

impl Graph {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id.index()]
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn ids(&self) -> impl Iterator<Item = NodeId> {
        (0..self.nodes.len() as u32).map(NodeId)
    }

    pub fn outputs(&self) -> &[(String, NodeId)] {
        &self.outputs
    }

    /// Marks `id` as a graph output under `name`.
    pub fn output(&mut self, name: &str, id: NodeId) {
        self.outputs.push((name.to_owned(), id));
    }

    /// Gives a node a name for debug taps.
    pub fn set_name(&mut self, id: NodeId, name: impl Into<String>) {
        self.nodes[id.index()].name = Some(name.into());
    }

    /// Finds a node by name.
    pub fn find(&self, name: &str) -> Option<NodeId> {
        self.ids()
            .find(|&id| self.node(id).name.as_deref() == Some(name))
    }

    /// KV-cache slots written by this graph and their layouts.
    pub fn cache_slots(&self) -> HashMap<CacheSlot, SlotLayout> {
        let mut slots = HashMap::new();
        for n in &self.nodes {
            if let Op::KvWrite { slot } = n.op {
                slots.insert(slot, self.slot_layout_of(n));
            }
        }
        slots
    }

    /// The slot layout a `KvWrite` node writes.
    pub fn slot_layout_of(&self, write: &Node) -> SlotLayout {
        let k = &self.node(write.inputs[0]).shape;
        let v = &self.node(write.inputs[1]).shape;
        SlotLayout {
            kv_heads: k.0[1].fixed().unwrap_or(0),
            head_dim: k.0[2].fixed().unwrap_or(0),
            v_head_dim: v.0[2].fixed().unwrap_or(0),
        }
    }

    /// Appends a node after inferring its type and shape.
    pub fn push(&mut self, op: Op, inputs: Vec<NodeId>) -> Result<NodeId> {
        let id = NodeId(self.nodes.len() as u32);
        for &i in &inputs {
            if i.index() >= self.nodes.len() {
                return Err(IrError {
                    node: id,
                    op: op.name(),
                    name: None,
                    msg: format!("input {i} does not exist yet"),
                });
            }
        }
        let (dtype, shape) = self.infer(id, &op, &inputs)?;
        self.nodes.push(Node {
            op,
            inputs,
            dtype,
            shape,
            name: None,
        });
        Ok(id)
    }

    /// A node whose type and shape are given, not inferred (inputs, weights).
    fn push_leaf(&mut self, op: Op, dtype: DType, shape: Shape) -> NodeId {
        let id = NodeId(self.nodes.len() as u32);
        self.nodes.push(Node {
            op,
            inputs: vec![],
            dtype,
            shape,
            name: None,
        });
        id
    }

    // ---- builder methods -------------------------------------------------

    /// A run-time input.
    pub fn input(&mut self, name: &str, dtype: DType, shape: Shape) -> NodeId {
        let id = self.push_leaf(
            Op::Input {
                name: name.to_owned(),
            },
            dtype,
            shape,
        );
        self.set_name(id, name);
        id
    }

    /// A weight of ggml type `ty` with shape `[rows, row_len]` or `[len]`.
    pub fn weight(&mut self, id: WeightId, name: &str, ty: GgmlType, shape: Shape) -> NodeId {
        let n = self.push_leaf(
            Op::Weight {
                id,
                name: name.to_owned(),
            },
            DType::Ggml(ty),
            shape,
        );
        self.set_name(n, name);
        n
    }

    pub fn gather(&mut self, table: NodeId, ids: NodeId) -> Result<NodeId> {
        self.push(Op::Gather, vec![table, ids])
    }

    /// Rows `rows` (i32 `[m]`) of `x` `[n, …]`.
    pub fn take_rows(&mut self, x: NodeId, rows: NodeId) -> Result<NodeId> {
        self.push(Op::TakeRows, vec![x, rows])
    }

    pub fn matmul(&mut self, x: NodeId, w: NodeId) -> Result<NodeId> {
        self.push(Op::MatMul { norm: None }, vec![x, w])
    }

    pub fn add(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.push(Op::Add, vec![a, b])
    }

    pub fn mul(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.push(Op::Mul, vec![a, b])
    }

    pub fn scale(&mut self, x: NodeId, factor: f32) -> Result<NodeId> {
        self.push(Op::Scale { factor }, vec![x])
    }

    pub fn add_const(&mut self, x: NodeId, value: f32) -> Result<NodeId> {
        self.push(Op::AddConst { value }, vec![x])
    }

    pub fn rms_norm(&mut self, x: NodeId, gamma: Option<NodeId>, eps: f32) -> Result<NodeId> {
        let mut inputs = vec![x];
        inputs.extend(gamma);
        self.push(
            Op::RmsNorm(NormSpec {
                eps,
                has_gamma: gamma.is_some(),
            }),
            inputs,
        )
    }

    /// Per-token matrix product `[n, p, q] · [n, q, r]` of two activations.
    pub fn batch_matmul(&mut self, a: NodeId, b: NodeId) -> Result<NodeId> {
        self.push(Op::BatchMatMul, vec![a, b])
    }

    /// `x` rescaled per row to the RMS of `target`; see [`Op::MatchRms`].
    pub fn match_rms(&mut self, x: NodeId, target: NodeId, floor: f32) -> Result<NodeId> {
        self.push(Op::MatchRms { floor }, vec![x, target])
    }

    /// See [`Op::GaussianTopK`].
    pub fn gaussian_topk(&mut self, x: NodeId, std_multiplier: f32) -> Result<NodeId> {
        self.push(Op::GaussianTopK { std_multiplier }, vec![x])
    }

    pub fn gelu(&mut self, x: NodeId) -> Result<NodeId> {
        self.push(Op::Gelu, vec![x])
    }

    pub fn geglu(&mut self, gate: NodeId, up: NodeId) -> Result<NodeId> {
        self.push(Op::GeGlu, vec![gate, up])
    }

    pub fn softcap(&mut self, x: NodeId, cap: f32) -> Result<NodeId> {
        self.push(Op::Softcap { cap }, vec![x])
    }

    pub fn rope(
        &mut self,
        x: NodeId,
        positions: NodeId,
        spec: RopeSpec,
        freq_factors: Option<NodeId>,
    ) -> Result<NodeId> {
        let mut inputs = vec![x, positions];
        inputs.extend(freq_factors);
        let spec = RopeSpec {
            has_freq_factors: freq_factors.is_some(),
            ..spec
        };
        self.push(Op::Rope(spec), inputs)
    }

    /// Attention of `q` over K/V given as inputs.
    pub fn attention(
        &mut self,
        q: NodeId,
        k: NodeId,
        v: NodeId,
        spec: AttentionSpec,
    ) -> Result<NodeId> {
        let spec = AttentionSpec {
            kv: KvSource::Inputs,
            bidirectional_spans: false,
            ..spec
        };
        self.push(Op::Attention(spec), vec![q, k, v])
    }

    /// Attention of `q` over a cache slot, after the effect `written`
    /// (the `KvWrite` of this step on that slot). `spans` (i32 `[seq]`)
    /// opens bidirectional spans when given.
    pub fn attention_cached(
        &mut self,
        q: NodeId,
        written: NodeId,
        slot: CacheSlot,
        spec: AttentionSpec,
        spans: Option<NodeId>,
    ) -> Result<NodeId> {
        let spec = AttentionSpec {
            kv: KvSource::Cache(slot),
            bidirectional_spans: spans.is_some(),
            ..spec
        };
        let mut inputs = vec![q, written];
        inputs.extend(spans);
        self.push(Op::Attention(spec), inputs)
    }

    pub fn kv_write(&mut self, slot: CacheSlot, k: NodeId, v: NodeId) -> Result<NodeId> {
        self.push(Op::KvWrite { slot }, vec![k, v])
    }

    /// A KV write that also records each token's bidirectional span id
    /// (i32 `[n]`, 0 = none) for later span-aware attention.
    pub fn kv_write_spans(
        &mut self,
        slot: CacheSlot,
        k: NodeId,
        v: NodeId,
        spans: NodeId,
    ) -> Result<NodeId> {
        self.push(Op::KvWrite { slot }, vec![k, v, spans])
    }

    /// A mixture-of-experts GeGLU FFN; see [`Op::Moe`].
    pub fn moe(
        &mut self,
        u: NodeId,
        router_logits: NodeId,
        gate_up: NodeId,
        down: NodeId,
        expert_scale: NodeId,
        top_k: usize,
    ) -> Result<NodeId> {
        self.push(
            Op::Moe { top_k },
            vec![u, router_logits, gate_up, down, expert_scale],
        )
    }

    pub fn narrow(&mut self, x: NodeId, axis: usize, start: Start, len: usize) -> Result<NodeId> {
        self.push(Op::Narrow { axis, start, len }, vec![x])
    }

    pub fn reshape(&mut self, x: NodeId, shape: Shape) -> Result<NodeId> {
        self.push(Op::Reshape { shape }, vec![x])
    }

    pub fn concat(&mut self, xs: &[NodeId], axis: usize) -> Result<NodeId> {
        self.push(Op::Concat { axis }, xs.to_vec())
    }

    // ---- inference ---------------------------------------------------------

    /// Re-checks every node's type and shape and the topological order.
    pub fn validate(&self) -> Result<()> {
        for (i, n) in self.nodes.iter().enumerate() {
            let id = NodeId(i as u32);
            let err = |msg: String| IrError {
                node: id,
                op: n.op.name(),
                name: n.name.clone(),
                msg,
            };
            if let Some(bad) = n.inputs.iter().find(|x| x.index() >= i) {
                return Err(err(format!("input {bad} does not precede the node")));
            }
            if matches!(n.op, Op::Input { .. } | Op::Weight { .. }) {
                continue;
            }
            let (dtype, shape) = self.infer(id, &n.op, &n.inputs)?;
            if dtype != n.dtype || shape != n.shape {
                return Err(err(format!(
                    "recorded {} {} but inputs give {dtype} {shape}",
                    n.dtype, n.shape
                )));
            }
        }
        for (name, id) in &self.outputs {
            if id.index() >= self.nodes.len() {
                return Err(IrError {
                    node: *id,
                    op: "output",
                    name: Some(name.clone()),
                    msg: "output refers to a missing node".into(),
                });
            }
        }
        Ok(())
    }

    fn infer(&self, id: NodeId, op: &Op, inputs: &[NodeId]) -> Result<(DType, Shape)> {
        let err = |msg: String| IrError {
            node: id,
            op: op.name(),
            name: None,
            msg,
        };
        let node = |i: usize| -> Result<&Node> {
            inputs
                .get(i)
                .map(|&n| self.node(n))
                .ok_or_else(|| err(format!("missing input {i}")))
        };
        let f32_in = |i: usize| -> Result<&Node> {
            let n = node(i)?;
            if n.dtype != DType::F32 {
                return Err(err(format!("input {i} must be f32, is {}", n.dtype)));
            }
            Ok(n)
        };
        let arity = |n: usize| -> Result<()> {
            if inputs.len() != n {
                return Err(err(format!("takes {n} inputs, got {}", inputs.len())));
            }
            Ok(())
        };
        let f32 = DType::F32;
        match op {
            Op::Input { .. } | Op::Weight { .. } => {
                Err(err("leaf nodes are built with input()/weight()".into()))
            }
            Op::Gather => {
                arity(2)?;
                let table = weight_in(node(0)?, &err)?;
                let ids = node(1)?;
                if ids.dtype != DType::I32 || ids.shape.rank() != 1 {
                    return Err(err(format!(
                        "ids must be i32 [n], are {} {}",
                        ids.dtype, ids.shape
                    )));
                }
                if table.shape.rank() != 2 {
                    return Err(err(format!("table must be 2-D, is {}", table.shape)));
                }
                Ok((f32, Shape::new([ids.shape.0[0], table.shape.0[1]])))
            }
            Op::TakeRows => {
                arity(2)?;
                let x = f32_in(0)?;
                let rows = node(1)?;
                if rows.dtype != DType::I32 || rows.shape.rank() != 1 {
                    return Err(err(format!(
                        "rows must be i32 [m], are {} {}",
                        rows.dtype, rows.shape
                    )));
                }
                if x.shape.rank() == 0 {
                    return Err(err("x must have at least one axis".into()));
                }
                let mut dims = x.shape.0.clone();
                dims[0] = rows.shape.0[0];
                Ok((f32, Shape(dims)))
            }
            Op::MatMul { norm } => {
                let x = f32_in(0)?;
                let k = x
                    .shape
                    .last()
                    .ok_or_else(|| err("x must have at least one axis".into()))?;
                let mut first_w = 1;
                if let Some(n) = norm {
                    if n.has_gamma {
                        let g = weight_or_f32(node(1)?, &err)?;
                        if g.shape != Shape::new([k]) {
                            return Err(err(format!("norm weight {} must be [{k}]", g.shape)));
                        }
                        first_w = 2;
                    }
                }
                if inputs.len() <= first_w {
                    return Err(err("needs at least one weight".into()));
                }
                let mut total = 0usize;
                for i in first_w..inputs.len() {
                    let w = weight_in(node(i)?, &err)?;
                    let (rows, cols) = match w.shape.0[..] {
                        [Dim::Fixed(r), c] => (r, c),
                        _ => return Err(err(format!("weight {} must be [rows, K]", w.shape))),
                    };
                    if cols != k {
                        return Err(err(format!(
                            "x has {k} columns but weight {:?} rows are {cols} long",
                            w.name.as_deref().unwrap_or("?")
                        )));
                    }
                    total += rows;
                }
                let mut shape = x.shape.clone();
                *shape.0.last_mut().expect("rank ≥ 1") = Dim::Fixed(total);
                Ok((f32, shape))
            }
            Op::Add | Op::Mul => {
                arity(2)?;
                let a = f32_in(0)?;
                let b = weight_or_f32(node(1)?, &err)?;
                if !broadcasts(&b.shape, &a.shape) {
                    return Err(err(format!(
                        "cannot broadcast {} onto {}",
                        b.shape, a.shape
                    )));
                }
                Ok((f32, a.shape.clone()))
            }
            Op::BatchMatMul => {
                arity(2)?;
                let (a, b) = (f32_in(0)?, f32_in(1)?);
                match (&a.shape.0[..], &b.shape.0[..]) {
                    ([n, p, q], [m, q2, Dim::Fixed(r)]) if n == m && q == q2 => {
                        Ok((f32, Shape::new([*n, *p, Dim::Fixed(*r)])))
                    }
                    _ => Err(err(format!(
                        "expects [n, p, q] and [n, q, r], got {} and {}",
                        a.shape, b.shape
                    ))),
                }
            }
            Op::MatchRms { .. } => {
                arity(2)?;
                let (x, t) = (f32_in(0)?, f32_in(1)?);
                if x.shape != t.shape {
                    return Err(err(format!("x {} and target {} differ", x.shape, t.shape)));
                }
                Ok((f32, x.shape.clone()))
            }
            Op::GaussianTopK { .. } => {
                arity(1)?;
                Ok((f32, f32_in(0)?.shape.clone()))
            }
            Op::Scale { .. } | Op::AddConst { .. } | Op::Gelu | Op::Softcap { .. } => {
                arity(1)?;
                Ok((f32, f32_in(0)?.shape.clone()))
            }
            Op::RmsNorm(n) => {
                arity(1 + usize::from(n.has_gamma))?;
                let x = f32_in(0)?;
                if n.has_gamma {
                    let g = weight_or_f32(node(1)?, &err)?;
                    let last = x.shape.last().ok_or_else(|| err("x has no axes".into()))?;
                    if g.shape != Shape::new([last]) {
                        return Err(err(format!(
                            "norm weight {} does not match the last axis of {}",
                            g.shape, x.shape
                        )));
                    }
                }
                Ok((f32, x.shape.clone()))
            }
            Op::GeGlu => {
                arity(2)?;
                let (g, u) = (f32_in(0)?, f32_in(1)?);
                if g.shape != u.shape {
                    return Err(err(format!("gate {} and up {} differ", g.shape, u.shape)));
                }
                Ok((f32, g.shape.clone()))
            }
            Op::Rope(r) => {
                arity(2 + usize::from(r.has_freq_factors))?;
                let x = f32_in(0)?;
                let hd = match x.shape.0[..] {
                    [_, Dim::Fixed(_), Dim::Fixed(hd)] => hd,
                    _ => {
                        return Err(err(format!(
                            "x must be [n, heads, head_dim], is {}",
                            x.shape
                        )))
                    }
                };
                if r.n_rot == 0 || r.n_rot % 2 == 1 || r.n_rot > hd {
                    return Err(err(format!(
                        "n_rot {} must be even and ≤ head_dim {hd}",
                        r.n_rot
                    )));
                }
                check_positions(node(1)?, x.shape.0[0], &err)?;
                if r.has_freq_factors {
                    let f = weight_or_f32(node(2)?, &err)?;
                    if f.shape.fixed_numel() != Some(r.n_rot / 2) {
                        return Err(err(format!(
                            "freq factors {} must hold n_rot/2 = {} values",
                            f.shape,
                            r.n_rot / 2
                        )));
                    }
                }
                Ok((f32, x.shape.clone()))
            }
            Op::Attention(a) => {
                let q = f32_in(0)?;
                let (n, hq, hd) = match q.shape.0[..] {
                    [n, Dim::Fixed(h), Dim::Fixed(d)] => (n, h, d),
                    _ => {
                        return Err(err(format!(
                            "q must be [n, heads, head_dim], is {}",
                            q.shape
                        )))
                    }
                };
                let layout = match a.kv {
                    KvSource::Inputs => {
                        arity(3)?;
                        let (k, v) = (f32_in(1)?, f32_in(2)?);
                        let layout = match (&k.shape.0[..], &v.shape.0[..]) {
                            (
                                [m1, Dim::Fixed(hk), Dim::Fixed(dk)],
                                [m2, Dim::Fixed(hv), Dim::Fixed(dv)],
                            ) if m1 == m2 && hk == hv => SlotLayout {
                                kv_heads: *hk,
                                head_dim: *dk,
                                v_head_dim: *dv,
                            },
                            _ => {
                                return Err(err(format!(
                                "k {} and v {} must be [m, kv_heads, dim] with equal m and heads",
                                k.shape, v.shape
                            )))
                            }
                        };
                        layout
                    }
                    KvSource::Cache(slot) => {
                        arity(2 + usize::from(a.bidirectional_spans))?;
                        let w = node(1)?;
                        if a.bidirectional_spans {
                            check_positions(node(2)?, n, &err)?;
                        }
                        match (&w.op, w.dtype) {
                            // The write may be another slot's: a layer that
                            // shares KV reads the source layer's cache after
                            // its write.
                            (Op::KvWrite { slot: written }, _) => {
                                if *written != slot {
                                    return Err(err(format!(
                                        "reads cache {} but is ordered after a write to cache {}",
                                        slot.0, written.0
                                    )));
                                }
                                self.slot_layout_of(w)
                            }
                            // A write done by an earlier plan of the same step
                            // (a graph split over devices).
                            (Op::Input { .. }, DType::Effect) => match w.shape.0[..] {
                                [Dim::Fixed(kv_heads), Dim::Fixed(head_dim), Dim::Fixed(v_head_dim)] => {
                                    SlotLayout {
                                        kv_heads,
                                        head_dim,
                                        v_head_dim,
                                    }
                                }
                                _ => {
                                    return Err(err(format!(
                                        "an effect input must have the slot's shape [kv_heads, head_dim, v_head_dim], not {}",
                                        w.shape
                                    )))
                                }
                            },
                            _ => {
                                return Err(err(
                                    "input 1 must be a kv_write or an effect input".into(),
                                ))
                            }
                        }
                    }
                };
                if layout.head_dim != hd {
                    return Err(err(format!(
                        "q head_dim {hd} differs from the keys' {}",
                        layout.head_dim
                    )));
                }
                if layout.kv_heads == 0 || hq % layout.kv_heads != 0 {
                    return Err(err(format!(
                        "{hq} query heads are not a multiple of {} kv heads",
                        layout.kv_heads
                    )));
                }
                Ok((
                    f32,
                    Shape::new([n, Dim::Fixed(hq), Dim::Fixed(layout.v_head_dim)]),
                ))
            }
            Op::KvWrite { .. } => {
                if !(2..=3).contains(&inputs.len()) {
                    return Err(err(format!("takes 2 or 3 inputs, got {}", inputs.len())));
                }
                let (k, v) = (f32_in(0)?, f32_in(1)?);
                if inputs.len() == 3 {
                    check_positions(node(2)?, k.shape.0[0], &err)?;
                }
                match (&k.shape.0[..], &v.shape.0[..]) {
                    ([n1, Dim::Fixed(h1), Dim::Fixed(_)], [n2, Dim::Fixed(h2), Dim::Fixed(_)])
                        if n1 == n2 && h1 == h2 => {}
                    _ => {
                        return Err(err(format!(
                            "k {} and v {} must be [n, kv_heads, dim] with equal n and heads",
                            k.shape, v.shape
                        )))
                    }
                }
                Ok((DType::Effect, Shape::default()))
            }
            Op::Moe { top_k } => {
                arity(5)?;
                let (u, logits) = (f32_in(0)?, f32_in(1)?);
                let gu = weight_in(node(2)?, &err)?;
                let dn = weight_in(node(3)?, &err)?;
                let sc = weight_or_f32(node(4)?, &err)?;
                let (n, d) = match u.shape.0[..] {
                    [n, Dim::Fixed(d)] => (n, d),
                    _ => return Err(err(format!("u must be [n, d], is {}", u.shape))),
                };
                let e = match logits.shape.0[..] {
                    [m, Dim::Fixed(e)] if m == n => e,
                    _ => {
                        return Err(err(format!(
                            "router logits {} must be [n, experts]",
                            logits.shape
                        )))
                    }
                };
                let ff = match gu.shape.0[..] {
                    [Dim::Fixed(e2), Dim::Fixed(two_ff), Dim::Fixed(d2)]
                        if e2 == e && d2 == d && two_ff % 2 == 0 =>
                    {
                        two_ff / 2
                    }
                    _ => {
                        return Err(err(format!(
                            "gate_up {} must be [{e}, 2·ff, {d}]",
                            gu.shape
                        )))
                    }
                };
                if dn.shape != Shape::fixed(&[e, d, ff]) {
                    return Err(err(format!("down {} must be [{e}, {d}, {ff}]", dn.shape)));
                }
                if sc.shape.fixed_numel() != Some(e) {
                    return Err(err(format!(
                        "expert scale {} must hold {e} values",
                        sc.shape
                    )));
                }
                if *top_k == 0 || *top_k > e {
                    return Err(err(format!("top_k {top_k} must be in 1..={e}")));
                }
                Ok((f32, u.shape.clone()))
            }
            Op::Narrow { axis, start, len } => {
                arity(1)?;
                let x = node(0)?;
                let d = *x
                    .shape
                    .0
                    .get(*axis)
                    .ok_or_else(|| err(format!("axis {axis} out of range for {}", x.shape)))?;
                let off = match start {
                    Start::FromStart(s) => *s + len,
                    Start::FromEnd(e) => {
                        if len > e {
                            return Err(err(format!("len {len} runs past the end (from end {e})")));
                        }
                        *e
                    }
                };
                if let Dim::Fixed(n) = d {
                    if off > n {
                        return Err(err(format!("range needs {off} rows, axis has {n}")));
                    }
                }
                let mut shape = x.shape.clone();
                shape.0[*axis] = Dim::Fixed(*len);
                Ok((x.dtype, shape))
            }
            Op::Reshape { shape } => {
                arity(1)?;
                let x = node(0)?;
                if !same_numel(&x.shape, shape) {
                    return Err(err(format!("cannot reshape {} to {shape}", x.shape)));
                }
                Ok((x.dtype, shape.clone()))
            }
            Op::Concat { axis } => {
                if inputs.is_empty() {
                    return Err(err("needs at least one input".into()));
                }
                let first = f32_in(0)?;
                let rank = first.shape.rank();
                if *axis >= rank {
                    return Err(err(format!("axis {axis} out of range for {}", first.shape)));
                }
                let mut total = 0;
                for i in 0..inputs.len() {
                    let x = f32_in(i)?;
                    let same_rest = x.shape.rank() == rank
                        && (0..rank).all(|a| a == *axis || x.shape.0[a] == first.shape.0[a]);
                    if !same_rest {
                        return Err(err(format!(
                            "input {i} {} does not match {}",
                            x.shape, first.shape
                        )));
                    }
                    total += x.shape.0[*axis]
                        .fixed()
                        .ok_or_else(|| err("concat axis must be fixed".into()))?;
                }
                let mut shape = first.shape.clone();
                shape.0[*axis] = Dim::Fixed(total);
                Ok((f32, shape))
            }
        }
    }
}

fn weight_in<'a>(n: &'a Node, err: &dyn Fn(String) -> IrError) -> Result<&'a Node> {
    match n.dtype {
        DType::Ggml(_) => Ok(n),
        d => Err(err(format!("expected a weight, got {d}"))),
    }
}

/// Vectors such as norm weights may be weights of a float type or f32 values.
fn weight_or_f32<'a>(n: &'a Node, err: &dyn Fn(String) -> IrError) -> Result<&'a Node> {
    match n.dtype {
        DType::F32 | DType::Ggml(GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) => Ok(n),
        d => Err(err(format!("expected f32/f16/bf16 values, got {d}"))),
    }
}

fn check_positions(p: &Node, n: Dim, err: &dyn Fn(String) -> IrError) -> Result<()> {
    if p.dtype != DType::I32 || p.shape != Shape::new([n]) {
        return Err(err(format!(
            "positions must be i32 [{n}], are {} {}",
            p.dtype, p.shape
        )));
    }
    Ok(())
}

/// Whether `b` broadcasts onto `a` NumPy-style: aligned from the last axis,
/// each of `b`'s dimensions equals `a`'s or is 1.
pub fn broadcasts(b: &Shape, a: &Shape) -> bool {
    let (ra, rb) = (a.rank(), b.rank());
    rb <= ra
        && b.0
            .iter()
            .zip(&a.0[ra - rb..])
            .all(|(db, da)| db == da || *db == Dim::Fixed(1))
}

fn same_numel(a: &Shape, b: &Shape) -> bool {
    let fixed = |s: &Shape| -> usize { s.0.iter().filter_map(|d| d.fixed()).product() };
    let mut sa: Vec<_> = a.syms().collect();
    let mut sb: Vec<_> = b.syms().collect();
    sa.sort();
    sb.sort();
    fixed(a) == fixed(b) && sa == sb
}
