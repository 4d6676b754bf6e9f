//! The graph: nodes in topological order, builder methods with shape
//! inference, and validation.

use std::collections::HashMap;
use std::fmt;

use rlx_gguf::GgmlType;

use crate::infer::Infer;
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
        let cx = Infer {
            g: self,
            id,
            op,
            inputs,
        };
        cx.op_shape()
    }
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
