//! What every backend shares: compile options, the graph a backend runs
//! (validated, optimised, weights checked), the schedule and arena layout
//! by value lifetimes, and the binding of a step's inputs to symbols.

use std::collections::HashMap;
use std::fmt::Write as _;

use rlx_ir::passes::{self, FuseOptions};
use rlx_ir::{Bindings, DType, Dim, Graph, NodeId, Op, Shape, Start, WeightId};

use crate::batch::{Batch, BatchError};
use crate::kv::KvError;
use crate::memory::{plan_memory, BufferRequest};
use crate::weights::WeightStore;

/// How products are formed, on every device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Precision {
    /// f32 products of the exactly dequantized weights and the f32
    /// activations (the parity path).
    #[default]
    Exact,
    /// llama.cpp's arithmetic: on the CPU, integer products with
    /// activations quantized to the weight type's partner format (weight
    /// types without a quantized kernel run as `Exact`); on a GPU, bf16
    /// tensor-core products for steps of many tokens.
    Quantized,
}

/// How to compile.
#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// The largest value each symbol takes; the arena is sized for these.
    pub max: Bindings,
    pub fuse: FuseOptions,
    /// Run CSE, fusion and DCE before scheduling.
    pub optimize: bool,
    pub precision: Precision,
    /// Matrix products whose per-row result does not depend on the other
    /// rows of a step (see `MatmulOptions::batch_invariant`).
    pub batch_invariant: bool,
}

impl CompileOptions {
    pub fn new(max: Bindings) -> Self {
        CompileOptions {
            max,
            fuse: FuseOptions::default(),
            optimize: true,
            precision: Precision::Exact,
            batch_invariant: false,
        }
    }
}

/// A host-side tensor passed in or returned.
#[derive(Clone, Debug, PartialEq)]
pub enum HostTensor {
    F32 { data: Vec<f32>, shape: Vec<usize> },
    I32 { data: Vec<i32>, shape: Vec<usize> },
}

impl HostTensor {
    pub fn f32(data: Vec<f32>, shape: &[usize]) -> Self {
        HostTensor::F32 {
            data,
            shape: shape.to_vec(),
        }
    }

    pub fn i32(data: Vec<i32>, shape: &[usize]) -> Self {
        HostTensor::I32 {
            data,
            shape: shape.to_vec(),
        }
    }

    pub fn shape(&self) -> &[usize] {
        match self {
            HostTensor::F32 { shape, .. } | HostTensor::I32 { shape, .. } => shape,
        }
    }

    pub fn as_f32(&self) -> Option<&[f32]> {
        match self {
            HostTensor::F32 { data, .. } => Some(data),
            HostTensor::I32 { .. } => None,
        }
    }

    pub fn into_f32(self) -> Option<Vec<f32>> {
        match self {
            HostTensor::F32 { data, .. } => Some(data),
            HostTensor::I32 { .. } => None,
        }
    }
}

/// A step's outputs by name, in the graph's order of outputs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepOutputs(Vec<(String, HostTensor)>);

impl StepOutputs {
    /// The output `name`, or an error naming it.
    pub fn get(&self, name: &str) -> Result<&HostTensor, RunError> {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t)
            .ok_or_else(|| RunError::NoOutput(name.into()))
    }

    /// Moves the f32 values of output `name` out (later reads of it fail),
    /// or an error naming it when there is none or it is not f32.
    pub fn take_f32(&mut self, name: &str) -> Result<Vec<f32>, RunError> {
        let at = self
            .0
            .iter()
            .position(|(n, _)| n == name)
            .filter(|&i| self.0[i].1.as_f32().is_some())
            .ok_or_else(|| RunError::NoOutput(name.into()))?;
        Ok(self.0.remove(at).1.into_f32().expect("checked to be f32"))
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(n, _)| n.as_str())
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &HostTensor)> {
        self.0.iter().map(|(n, t)| (n.as_str(), t))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The named tensors, for code that passes them on as values of a
    /// later plan.
    pub fn into_vec(self) -> Vec<(String, HostTensor)> {
        self.0
    }
}

impl From<Vec<(String, HostTensor)>> for StepOutputs {
    fn from(outs: Vec<(String, HostTensor)>) -> Self {
        StepOutputs(outs)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Ir(#[from] rlx_ir::IrError),
    #[error("input {name:?}: {msg}")]
    Input { name: String, msg: String },
    #[error("symbol {sym} = {value} exceeds the {max} this plan was compiled for")]
    TooLarge {
        sym: &'static str,
        value: usize,
        max: usize,
    },
    #[error("node {node} ({op}): {msg}")]
    Node {
        node: NodeId,
        op: &'static str,
        msg: String,
    },
    #[error(transparent)]
    Kv(#[from] KvError),
    #[error("the graph uses the KV cache but no cache was given")]
    NoCache,
    #[error("the step has no output {0:?} of the type asked for")]
    NoOutput(String),
    #[error(transparent)]
    Batch(#[from] BatchError),
    #[error("{device}: {msg}")]
    Device { device: String, msg: String },
}

/// Receives `(name, shape, values)` of each named value as it is computed.
pub type Tap<'a> = dyn FnMut(&str, &[usize], &[f32]) + 'a;

/// Where a value lives during a run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Loc {
    /// Nothing (effects).
    None,
    /// An i32 input of the step.
    Input(StepInput),
    Weight(WeightId),
    /// `[offset, offset+cap)` f32 elements of the arena.
    Arena {
        offset: usize,
        cap: usize,
    },
    /// Another node's data from element `offset` on (a reshape, or a
    /// narrow a backend reads in place).
    Alias {
        src: NodeId,
        offset: usize,
    },
}

pub(crate) fn node_err(g: &Graph, id: NodeId, msg: impl Into<String>) -> RunError {
    RunError::Node {
        node: id,
        op: g.node(id).op.name(),
        msg: msg.into(),
    }
}

/// The graph every backend runs: validated, optimised (or only pruned), its
/// weights checked against the store, i32 values only at inputs.
pub(crate) fn prepare(
    graph: &Graph,
    store: &WeightStore,
    opts: &CompileOptions,
) -> Result<Graph, RunError> {
    graph.validate()?;
    let g = if opts.optimize {
        passes::optimize(graph, &opts.fuse)?
    } else {
        passes::dce(graph)?
    };
    for id in g.ids() {
        let n = g.node(id);
        match &n.op {
            Op::Weight { id: w, name } => {
                if w.0 as usize >= store.len() {
                    return Err(node_err(
                        &g,
                        id,
                        format!("weight {name:?} is not in the store"),
                    ));
                }
                let info = store.info(*w);
                let DType::Ggml(ty) = n.dtype else {
                    unreachable!()
                };
                if info.ty != ty || Shape::fixed(&info.shape) != n.shape {
                    return Err(node_err(
                        &g,
                        id,
                        format!(
                            "weight {name:?} is {} {:?} in the store, {} {} in the graph",
                            info.ty, info.shape, ty, n.shape
                        ),
                    ));
                }
            }
            Op::Input { name } => {
                let step_input = StepInput::named(name).is_some();
                let ok = match n.dtype {
                    DType::I32 => step_input,
                    // Values and effects of another plan of the same step.
                    DType::F32 | DType::Effect => !step_input,
                    _ => false,
                };
                if !ok {
                    return Err(node_err(
                        &g,
                        id,
                        format!(
                            "input {name:?} ({}): a step supplies i32 inputs named {:?}, \
                             and f32 values or effects under other names",
                            n.dtype,
                            StepInput::ALL.map(StepInput::name)
                        ),
                    ));
                }
            }
            _ if n.dtype == DType::I32 => {
                return Err(node_err(&g, id, "i32 values can only be graph inputs"));
            }
            _ => {}
        }
    }
    Ok(g)
}

/// The order of a plan's steps and where each value lives.
pub(crate) struct Schedule {
    pub steps: Vec<NodeId>,
    pub locs: Vec<Loc>,
    /// The f32 inputs, copied into the arena before the first step.
    pub values: Vec<NodeId>,
    /// f32 elements of the arena.
    pub arena_elems: usize,
}

/// Steps in graph order and an arena laid out by value lifetimes for the
/// symbol maxima `max`. Reshapes alias their input, and so does any node
/// `view` maps to `(source, element offset)`; an alias keeps its source alive
/// for as long as it is read.
pub(crate) fn schedule(
    g: &Graph,
    max: &Bindings,
    view: &dyn Fn(NodeId) -> Option<(NodeId, usize)>,
) -> Result<Schedule, RunError> {
    let steps: Vec<NodeId> = g
        .ids()
        .filter(|&id| !g.node(id).inputs.is_empty())
        .collect();
    // Locations and the root of each alias chain.
    let mut locs = vec![Loc::None; g.len()];
    for id in g.ids() {
        let n = g.node(id);
        locs[id.index()] = match &n.op {
            // An f32 input is copied into the arena before the first step.
            Op::Input { .. } if n.dtype == DType::F32 => Loc::Arena { offset: 0, cap: 0 },
            Op::Input { .. } if n.dtype == DType::Effect => Loc::None,
            Op::Input { name } => {
                Loc::Input(StepInput::named(name).expect("prepare admits only step inputs"))
            }
            Op::Weight { id: w, .. } => Loc::Weight(*w),
            Op::Reshape { .. } => Loc::Alias {
                src: n.inputs[0],
                offset: 0,
            },
            _ if n.dtype == DType::Effect => Loc::None,
            _ => match view(id) {
                Some((src, offset)) => Loc::Alias { src, offset },
                None => Loc::Arena { offset: 0, cap: 0 },
            },
        };
    }
    let root = |mut id: NodeId| {
        while let Loc::Alias { src, .. } = locs[id.index()] {
            id = src;
        }
        id
    };
    // Lifetimes of arena values (aliases extend their root's).
    let pos: HashMap<NodeId, usize> = steps.iter().enumerate().map(|(i, &id)| (id, i)).collect();
    let mut last = vec![0usize; g.len()];
    for (i, &id) in steps.iter().enumerate() {
        for &inp in &g.node(id).inputs {
            let r = root(inp);
            last[r.index()] = last[r.index()].max(i);
        }
    }
    for (_, out) in g.outputs() {
        let r = root(*out);
        last[r.index()] = steps.len();
    }
    let mut reqs = Vec::new();
    let mut owners = Vec::new();
    let inputs = g
        .ids()
        .filter(|&id| matches!(g.node(id).op, Op::Input { .. }));
    for id in inputs.chain(steps.iter().copied()) {
        if let Loc::Arena { .. } = locs[id.index()] {
            let n = g.node(id);
            let elems = n.shape.numel(max).ok_or_else(|| {
                node_err(
                    g,
                    id,
                    format!("shape {} has a symbol without a maximum", n.shape),
                )
            })?;
            let first = pos.get(&id).copied().unwrap_or(0);
            reqs.push(BufferRequest {
                bytes: elems * 4,
                first,
                last: last[id.index()].max(first),
            });
            owners.push(id);
        }
    }
    let mem = plan_memory(&reqs, 64);
    for (req, (&id, &offset)) in reqs.iter().zip(owners.iter().zip(&mem.offsets)) {
        locs[id.index()] = Loc::Arena {
            offset: offset / 4,
            cap: req.bytes / 4,
        };
    }
    let values = g
        .ids()
        .filter(|&id| matches!(g.node(id).op, Op::Input { .. }) && g.node(id).dtype == DType::F32)
        .collect();
    Ok(Schedule {
        steps,
        locs,
        values,
        arena_elems: mem.arena_bytes / 4,
    })
}

/// Each f32 input of a step (checked against its node's shape by `bind`,
/// so within its buffer) and the arena element it is copied to.
pub(crate) fn value_copies<'a>(
    g: &'a Graph,
    values: &'a [NodeId],
    locs: &'a [Loc],
    inputs: &'a StepInputs,
) -> impl Iterator<Item = (usize, &'a [f32])> + 'a {
    values.iter().map(move |&id| {
        let (Op::Input { name }, Loc::Arena { offset, .. }) = (&g.node(id).op, locs[id.index()])
        else {
            unreachable!("values are inputs in the arena")
        };
        let data = inputs
            .value(name)
            .and_then(HostTensor::as_f32)
            .expect("bound inputs exist");
        (offset, data)
    })
}

/// Where a narrow of `len` rows starting at `start` begins on an axis of
/// `axis_len` rows, or why it does not fit.
pub(crate) fn narrow_from(start: Start, axis_len: usize, len: usize) -> Result<usize, String> {
    let from = match start {
        Start::FromStart(s) => s,
        Start::FromEnd(e) => axis_len
            .checked_sub(e)
            .ok_or_else(|| format!("axis has {axis_len} rows, {e} from the end requested"))?,
    };
    if from + len > axis_len {
        return Err(format!("rows {from}..{} past {axis_len}", from + len));
    }
    Ok(from)
}

/// The graph inputs a step supplies, by name: `tokens`, `pos` and
/// `spans` (one per batch row: token id, position, bidirectional span id)
/// and `logit_rows` (the rows whose logits are wanted), and the f32 values
/// another plan of the step computed.
pub struct StepInputs<'a> {
    pub tokens: &'a [i32],
    pub pos: &'a [i32],
    pub logit_rows: Vec<i32>,
    pub spans: &'a [i32],
    pub values: &'a [(String, HostTensor)],
}

/// An i32 input a step supplies, which a graph names by [`StepInput::name`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StepInput {
    /// Each row's token id.
    Tokens,
    /// Each row's position in its sequence.
    Pos,
    /// The rows whose logits are wanted.
    LogitRows,
    /// Each row's bidirectional span id (0: none).
    Spans,
}

impl StepInput {
    pub const ALL: [StepInput; 4] = [
        StepInput::Tokens,
        StepInput::Pos,
        StepInput::LogitRows,
        StepInput::Spans,
    ];

    pub fn name(self) -> &'static str {
        match self {
            StepInput::Tokens => "tokens",
            StepInput::Pos => "pos",
            StepInput::LogitRows => "logit_rows",
            StepInput::Spans => "spans",
        }
    }

    /// The input a graph's input node of this name stands for.
    pub fn named(name: &str) -> Option<StepInput> {
        Self::ALL.into_iter().find(|i| i.name() == name)
    }

    /// Its place in [`StepInput::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl<'a> StepInputs<'a> {
    pub fn new(batch: &'a Batch, values: &'a [(String, HostTensor)]) -> Self {
        StepInputs {
            tokens: batch.tokens(),
            pos: batch.positions(),
            logit_rows: batch.logit_rows(),
            spans: batch.spans(),
            values,
        }
    }

    /// The f32 value named `name`.
    pub fn value(&self, name: &str) -> Option<&'a HostTensor> {
        self.values.iter().find(|(n, _)| n == name).map(|(_, t)| t)
    }

    pub fn get(&self, input: StepInput) -> &[i32] {
        match input {
            StepInput::Tokens => self.tokens,
            StepInput::Pos => self.pos,
            StepInput::LogitRows => &self.logit_rows,
            StepInput::Spans => self.spans,
        }
    }
}

/// Symbol values from the inputs' lengths, each checked against the graph
/// and the compiled maxima `max`.
pub(crate) fn bind(
    graph: &Graph,
    max: &Bindings,
    inputs: &StepInputs,
) -> Result<Bindings, RunError> {
    let mut b = Bindings::new();
    for id in graph.ids() {
        let n = graph.node(id);
        let Op::Input { name } = &n.op else { continue };
        let bad = |msg: String| RunError::Input {
            name: name.clone(),
            msg,
        };
        let dims: Vec<usize> = match n.dtype {
            DType::Effect => continue,
            DType::F32 => {
                let t = inputs
                    .value(name)
                    .ok_or_else(|| bad("no value of this name was passed".into()))?;
                if t.as_f32().is_none() {
                    return Err(bad("an i32 tensor where f32 values are read".into()));
                }
                t.shape().to_vec()
            }
            _ => {
                let which = StepInput::named(name).ok_or_else(|| bad("not a step input".into()))?;
                let data = inputs.get(which);
                if n.shape.rank() != 1 {
                    return Err(bad(format!("step inputs are one axis, not {}", n.shape)));
                }
                vec![data.len()]
            }
        };
        if dims.len() != n.shape.rank() {
            return Err(bad(format!("shape {dims:?} where {} is read", n.shape)));
        }
        for (d, &g) in n.shape.dims().iter().zip(&dims) {
            match d {
                Dim::Fixed(f) if *f != g => {
                    return Err(bad(format!(
                        "shape {dims:?} where {} is read ({f} values, got {g})",
                        n.shape
                    )))
                }
                Dim::Fixed(_) => {}
                Dim::Sym(s) => match b.get(*s) {
                    Some(v) if v != g => {
                        return Err(bad(format!("{s} is {v} elsewhere, {g} here")))
                    }
                    _ => {
                        let max = max.get(*s).unwrap_or(0);
                        if g > max {
                            return Err(RunError::TooLarge {
                                sym: s.0,
                                value: g,
                                max,
                            });
                        }
                        b.set(*s, g)
                    }
                },
            }
        }
    }
    Ok(b)
}

/// The symbols of a step bound from its batch before it runs, or `None`
/// for a graph that also reads values of another plan (bound when they
/// come).
pub(crate) fn bind_early(
    graph: &Graph,
    max: &Bindings,
    batch: &Batch,
) -> Result<Option<Bindings>, RunError> {
    let reads_values = graph.ids().any(|id| {
        let n = graph.node(id);
        matches!(n.op, Op::Input { .. }) && n.dtype != DType::I32
    });
    if reads_values {
        return Ok(None);
    }
    bind(graph, max, &StepInputs::new(batch, &[])).map(Some)
}

/// A plan's steps as text: each step's op, inputs, shape and where its
/// value lives (arena range or view), what each fused node stands for,
/// then the outputs.
pub(crate) fn dump_steps(s: &mut String, g: &Graph, steps: &[NodeId], locs: &[Loc]) {
    for &id in steps {
        let n = g.node(id);
        let args: Vec<String> = n.inputs.iter().map(|i| i.to_string()).collect();
        let _ = write!(s, "{id} = {}({}) : {}", n.op, args.join(", "), n.shape);
        match locs[id.index()] {
            Loc::Arena { offset, cap } => {
                let _ = write!(s, "  @[{}..{})", offset * 4, (offset + cap) * 4);
            }
            Loc::Alias { src, offset } => {
                let _ = write!(s, "  = view of {src} from {offset}");
            }
            _ => {}
        }
        if let Op::MatMul { norm } = &n.op {
            let first = if norm.is_some_and(|nm| nm.has_gamma) {
                2
            } else {
                1
            };
            let ws: Vec<String> = n.inputs[first..]
                .iter()
                .map(|&w| {
                    let wn = g.node(w);
                    format!("{}:{}", wn.name.as_deref().unwrap_or("?"), wn.dtype)
                })
                .collect();
            let fused = if norm.is_some() { "rms_norm + " } else { "" };
            let _ = write!(
                s,
                "  [fused: {fused}matmul × {}: {}]",
                ws.len(),
                ws.join(", ")
            );
        }
        if let Op::GeGlu = n.op {
            let _ = write!(s, "  [fused: gelu + mul]");
        }
        if let Some(name) = &n.name {
            let _ = write!(s, "  # {name}");
        }
        s.push('\n');
    }
    for (name, id) in g.outputs() {
        let _ = writeln!(s, "output {name:?} = {id}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_outputs_are_read_by_name() {
        let mut outs = StepOutputs::from(vec![
            (
                "logits".to_string(),
                HostTensor::f32(vec![1.0, 2.0], &[1, 2]),
            ),
            ("ids".to_string(), HostTensor::i32(vec![3], &[1])),
        ]);
        assert_eq!((outs.len(), outs.is_empty()), (2, false));
        assert_eq!(outs.names().collect::<Vec<_>>(), ["logits", "ids"]);
        assert_eq!(outs.get("ids").unwrap().shape(), &[1]);
        let missing = |e: RunError, name: &str| matches!(e, RunError::NoOutput(n) if n == name);
        assert!(missing(outs.get("x").unwrap_err(), "x"));
        // An i32 output is not taken as f32, and stays.
        assert!(missing(outs.take_f32("ids").unwrap_err(), "ids"));
        assert_eq!(outs.take_f32("logits").unwrap(), [1.0, 2.0]);
        assert!(missing(outs.take_f32("logits").unwrap_err(), "logits"));
        let rest: Vec<(&str, &HostTensor)> = outs.iter().collect();
        assert_eq!(rest, [("ids", &HostTensor::i32(vec![3], &[1]))]);
        assert_eq!(outs.into_vec().len(), 1);
    }
}
