//! One graph over several backends: a model whose weights do not all fit
//! on one device, or whose experts stay in host memory.
//!
//! A [`Placement`] says where each node runs: row lookups (`Gather`) where
//! gathers are placed, a node that reads a weight where that weight is
//! placed, K/V writes and attention over a cache slot where the slot's rows
//! are kept, and any other node where its latest computed input is (so a
//! layer's norms, residual adds and reshapes go with its products). The
//! graph is cut into parts, maximal runs of nodes on one backend in graph
//! order; each part is compiled by its backend like any graph. A step runs
//! the parts in order on one prepared K/V pool whose rows are kept per
//! device; a value one part computes and a later part reads leaves its
//! device once, as an output, and enters the other as an f32 input.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::Arc;

use rlx_gguf::GgmlType;
use rlx_ir::{DType, Dim, Graph, KvSource, NodeId, Op, Shape};

use crate::backend::{Backend, Device, Executable, MemoryReport, PreparedKv, StepProfile};
use crate::batch::Batch;
use crate::compile::{CompileOptions, HostTensor, Precision, RunError, StepOutputs};
use crate::kv::{KvDType, KvPool, KvPoolConfig, KvStorage, SlotSet};
use crate::weights::WeightStore;

/// Which backend (an index into a [`SplitBackend`]'s list) runs what.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement {
    /// Per weight id: the backend of the nodes that read the weight (other
    /// than gathers).
    pub weights: Vec<usize>,
    /// The backend of every row lookup, whichever table it reads.
    pub gathers: usize,
    /// Per cache slot: the backend that keeps its rows and runs the writes
    /// and attention over it (a sharing slot: its source's).
    pub slots: Vec<usize>,
}

impl Placement {
    /// Everything on backend 0.
    pub fn single(weights: usize, slots: usize) -> Self {
        Placement {
            weights: vec![0; weights],
            gathers: 0,
            slots: vec![0; slots],
        }
    }

    /// The backend of every node of `g` (`None` for inputs and weights,
    /// which every part that reads them gets its own copy of).
    pub fn assign(&self, g: &Graph) -> Result<Vec<Option<usize>>, RunError> {
        let mut dev: Vec<Option<usize>> = vec![None; g.len()];
        for id in g.ids() {
            let n = g.node(id);
            let bad = |msg: String| RunError::Node {
                node: id,
                op: n.op.name(),
                msg,
            };
            let slot_dev = |slot: rlx_ir::CacheSlot| {
                self.slots.get(slot.0 as usize).copied().ok_or_else(|| {
                    bad(format!(
                        "cache slot {} is not placed ({} slots are)",
                        slot.0,
                        self.slots.len()
                    ))
                })
            };
            let weight = n.inputs.iter().find_map(|&i| match g.node(i).op {
                Op::Weight { id, .. } => Some(id),
                _ => None,
            });
            dev[id.index()] = match &n.op {
                Op::Input { .. } | Op::Weight { .. } => None,
                Op::Gather => Some(self.gathers),
                Op::KvWrite { slot } => Some(slot_dev(*slot)?),
                Op::Attention(a) if matches!(a.kv, KvSource::Cache(_)) => {
                    let KvSource::Cache(slot) = a.kv else {
                        unreachable!()
                    };
                    Some(slot_dev(slot)?)
                }
                // Frequency factors are one table for every layer.
                Op::Rope(_) => None,
                _ => match weight {
                    Some(w) => Some(self.weights.get(w.0 as usize).copied().ok_or_else(|| {
                        bad(format!(
                            "weight {} is not placed ({} weights are)",
                            w.0,
                            self.weights.len()
                        ))
                    })?),
                    None => None,
                },
            };
            if dev[id.index()].is_none() && !n.inputs.is_empty() {
                // The latest computed input's backend.
                let latest = n
                    .inputs
                    .iter()
                    .filter(|i| dev[i.index()].is_some())
                    .max_by_key(|i| i.index());
                dev[id.index()] = Some(latest.map_or(self.gathers, |i| dev[i.index()].unwrap()));
            }
        }
        Ok(dev)
    }

    /// Per backend of `count`, the weights its nodes of `g` read.
    pub fn weights_read(
        &self,
        g: &Graph,
        count: usize,
        weights: usize,
    ) -> Result<Vec<Vec<bool>>, RunError> {
        let dev = self.assign(g)?;
        let mut read = vec![vec![false; weights]; count];
        for id in g.ids() {
            let Some(d) = dev[id.index()] else { continue };
            for &i in &g.node(id).inputs {
                if let Op::Weight { id: w, .. } = g.node(i).op {
                    if let Some(slot) = read.get_mut(d).and_then(|r| r.get_mut(w.0 as usize)) {
                        *slot = true;
                    }
                }
            }
        }
        Ok(read)
    }
}

/// Several backends over one weight store, one graph split between them.
pub struct SplitBackend {
    backends: Vec<Arc<dyn Backend>>,
    placement: Placement,
}

impl SplitBackend {
    /// `backends[0]` is the one the model is said to run on (the
    /// accelerator); every backend must hold the same store.
    pub fn new(backends: Vec<Arc<dyn Backend>>, placement: Placement) -> Result<Self, RunError> {
        let bad = |msg: String| RunError::Device {
            device: "split".into(),
            msg,
        };
        let Some(first) = backends.first() else {
            return Err(bad("no backends".into()));
        };
        if backends
            .iter()
            .any(|b| !Arc::ptr_eq(b.store(), first.store()))
        {
            return Err(bad("the backends hold different weight stores".into()));
        }
        let used = placement
            .weights
            .iter()
            .chain(&placement.slots)
            .chain([&placement.gathers]);
        if let Some(i) = used.into_iter().find(|&&i| i >= backends.len()) {
            return Err(bad(format!(
                "placed on backend {i}, but there are {}",
                backends.len()
            )));
        }
        if placement.weights.len() != first.store().len() {
            return Err(bad(format!(
                "{} weights placed, the store has {}",
                placement.weights.len(),
                first.store().len()
            )));
        }
        Ok(SplitBackend {
            backends,
            placement,
        })
    }

    pub fn backends(&self) -> &[Arc<dyn Backend>] {
        &self.backends
    }

    pub fn placement(&self) -> &Placement {
        &self.placement
    }
}

impl Backend for SplitBackend {
    fn device(&self) -> Device {
        self.backends[0].device()
    }

    fn kind(&self) -> &'static str {
        self.backends[0].kind()
    }

    /// The types every backend reads.
    fn kv_dtypes(&self) -> Vec<KvDType> {
        let mut types = self.backends[0].kv_dtypes();
        for b in &self.backends[1..] {
            let theirs = b.kv_dtypes();
            types.retain(|t| theirs.contains(t));
        }
        types
    }

    fn default_kv_dtype(&self, precision: Precision) -> KvDType {
        self.backends[0].default_kv_dtype(precision)
    }

    fn describe(&self) -> String {
        let parts: Vec<String> = self.backends.iter().map(|b| b.describe()).collect();
        format!("split over {}", parts.join(" + "))
    }

    fn store(&self) -> &Arc<WeightStore> {
        self.backends[0].store()
    }

    /// Whether some backend runs it; [`Backend::compile`] checks each
    /// node against the backend it is placed on.
    fn supports_op(&self, op: &Op) -> bool {
        self.backends.iter().any(|b| b.supports_op(op))
    }

    fn supports_weight(&self, ty: GgmlType) -> bool {
        self.backends.iter().any(|b| b.supports_weight(ty))
    }

    fn compile(
        &self,
        graph: &Graph,
        opts: &CompileOptions,
    ) -> Result<Box<dyn Executable>, RunError> {
        graph.validate()?;
        let dev = self.placement.assign(graph)?;
        for id in graph.ids() {
            let Some(d) = dev[id.index()] else { continue };
            let (n, b) = (graph.node(id), &self.backends[d]);
            let name = n.name.as_deref().unwrap_or("");
            let refuse = |what: String| RunError::Node {
                node: id,
                op: n.op.name(),
                msg: format!("{name:?} is placed on {}, {what}", b.device()),
            };
            if !b.supports_op(&n.op) {
                return Err(refuse("which has no kernel for it".into()));
            }
            for &i in &n.inputs {
                if let DType::Ggml(ty) = graph.node(i).dtype {
                    if !b.supports_weight(ty) {
                        return Err(refuse(format!("whose kernels do not read {ty} weights")));
                    }
                }
            }
        }
        let mut parts = Vec::new();
        for p in cut(graph, &dev)? {
            parts.push(Part {
                backend: p.backend,
                uses_kv: p.uses_kv,
                exec: self.backends[p.backend].compile(&p.graph, opts)?,
            });
        }
        Ok(Box::new(SplitPlan {
            graph: graph.clone(),
            finals: graph.outputs().iter().map(|(n, _)| n.clone()).collect(),
            devices: self.backends.iter().map(|b| b.device()).collect(),
            parts,
        }))
    }

    /// Each backend's storage is made with [`Backend::kv_pool`], which
    /// knows the slots' placement.
    fn kv_storage(
        &self,
        config: &KvPoolConfig,
        slots: &SlotSet,
    ) -> Result<Box<dyn KvStorage>, RunError> {
        let _ = (config, slots);
        Err(RunError::Device {
            device: "split".into(),
            msg: "a split keeps K/V rows on several devices: make its pool with kv_pool".into(),
        })
    }

    /// Rows of each slot on its backend, each backend's share checked
    /// against what it has available before anything is allocated.
    fn kv_pool(&self, config: KvPoolConfig) -> Result<KvPool, RunError> {
        if self.placement.slots.len() != config.layers.len() {
            return Err(RunError::Device {
                device: "split".into(),
                msg: format!(
                    "{} cache slots placed, the pool has {}",
                    self.placement.slots.len(),
                    config.layers.len()
                ),
            });
        }
        let sets: Vec<SlotSet> = (0..self.backends.len())
            .map(|b| SlotSet::Only(self.placement.slots.iter().map(|&d| d == b).collect()))
            .collect();
        for (b, set) in self.backends.iter().zip(&sets) {
            let need = config.slots_bytes(set);
            if let Some(available) = b.memory().available {
                if need > available {
                    return Err(RunError::Device {
                        device: b.device().to_string(),
                        msg: format!(
                            "its share of the K/V cache needs {} MiB, {} MiB are available",
                            need >> 20,
                            available >> 20
                        ),
                    });
                }
            }
        }
        let mut parts = Vec::with_capacity(self.backends.len());
        for (b, set) in self.backends.iter().zip(&sets) {
            parts.push(b.kv_storage(&config, set)?);
        }
        let slot_part = self.placement.slots.clone();
        Ok(KvPool::with_parts(config, parts, slot_part)?)
    }

    /// The sum of the weights each device holds; what is available is per
    /// device (each backend's own report), so none is given here.
    fn set_profiling(&self, on: bool) -> bool {
        // Every backend is told, so none is left on.
        let told: Vec<bool> = self.backends.iter().map(|b| b.set_profiling(on)).collect();
        told.contains(&true)
    }

    fn take_profile(&self) -> Vec<StepProfile> {
        self.backends
            .iter()
            .flat_map(|b| b.take_profile())
            .collect()
    }

    fn memory(&self) -> MemoryReport {
        MemoryReport {
            total: None,
            available: None,
            weights: self.backends.iter().map(|b| b.memory().weights).sum(),
        }
    }
}

/// A part of a graph before compiling.
struct Cut {
    backend: usize,
    graph: Graph,
    uses_kv: bool,
}

/// The name under which a value crosses between parts.
fn value_name(id: NodeId) -> String {
    format!("split.{}", id.0)
}

/// Cuts `g` into maximal runs of computed nodes on one backend, each a
/// graph of its own: inputs and weights copied where read, values from
/// earlier parts as f32 inputs, K/V writes of earlier parts as effect
/// inputs, and as outputs the values later parts read and `g`'s outputs.
fn cut(g: &Graph, dev: &[Option<usize>]) -> Result<Vec<Cut>, RunError> {
    // The part of each computed node.
    let mut part_of: Vec<Option<usize>> = vec![None; g.len()];
    let mut runs: Vec<(usize, Vec<NodeId>)> = Vec::new();
    for id in g.ids() {
        let Some(d) = dev[id.index()] else { continue };
        if runs.last().is_none_or(|(b, _)| *b != d) {
            runs.push((d, Vec::new()));
        }
        runs.last_mut().expect("pushed").1.push(id);
        part_of[id.index()] = Some(runs.len() - 1);
    }
    // Values read by a later part.
    let mut crosses = vec![false; g.len()];
    for id in g.ids() {
        let Some(p) = part_of[id.index()] else {
            continue;
        };
        for &i in &g.node(id).inputs {
            if part_of[i.index()].is_some_and(|q| q != p) {
                crosses[i.index()] = true;
            }
        }
    }
    let outputs: HashMap<NodeId, Vec<&str>> =
        g.outputs()
            .iter()
            .fold(HashMap::new(), |mut m, (name, id)| {
                m.entry(*id).or_default().push(name.as_str());
                m
            });
    let mut cuts = Vec::with_capacity(runs.len());
    for (pi, (backend, members)) in runs.into_iter().enumerate() {
        let mut sub = Graph::new();
        let mut map: HashMap<NodeId, NodeId> = HashMap::new();
        let mut uses_kv = false;
        for &id in &members {
            let n = g.node(id);
            let mut inputs = Vec::with_capacity(n.inputs.len());
            for &i in &n.inputs {
                if let Some(&m) = map.get(&i) {
                    inputs.push(m);
                    continue;
                }
                let src = g.node(i);
                let m = match (&src.op, part_of[i.index()]) {
                    (Op::Input { name }, _) => sub.input(name, src.dtype, src.shape.clone()),
                    (Op::Weight { id: w, name }, _) => {
                        let DType::Ggml(ty) = src.dtype else {
                            unreachable!("weights have ggml types")
                        };
                        sub.weight(*w, name, ty, src.shape.clone())
                    }
                    (_, Some(q)) if q != pi && src.dtype == DType::Effect => {
                        let l = g.slot_layout_of(src);
                        let shape = Shape::new([
                            Dim::Fixed(l.kv_heads),
                            Dim::Fixed(l.head_dim),
                            Dim::Fixed(l.v_head_dim),
                        ]);
                        sub.input(&value_name(i), DType::Effect, shape)
                    }
                    (_, Some(q)) if q != pi => {
                        sub.input(&value_name(i), src.dtype, src.shape.clone())
                    }
                    _ => unreachable!("inputs come before their readers"),
                };
                map.insert(i, m);
                inputs.push(m);
            }
            let m = sub.push(n.op.clone(), inputs)?;
            if let Some(name) = &n.name {
                sub.set_name(m, name.clone());
            }
            uses_kv |= matches!(n.op, Op::KvWrite { .. })
                || matches!(&n.op, Op::Attention(a) if matches!(a.kv, KvSource::Cache(_)));
            map.insert(id, m);
            if crosses[id.index()] && n.dtype != DType::Effect {
                sub.output(&value_name(id), m);
            }
            for name in outputs.get(&id).into_iter().flatten() {
                sub.output(name, m);
            }
        }
        cuts.push(Cut {
            backend,
            graph: sub,
            uses_kv,
        });
    }
    Ok(cuts)
}

/// A compiled part.
struct Part {
    backend: usize,
    uses_kv: bool,
    exec: Box<dyn Executable>,
}

/// A graph split over backends, compiled.
struct SplitPlan {
    graph: Graph,
    /// The names of the graph's outputs (the rest of the parts' outputs
    /// are values for later parts).
    finals: HashSet<String>,
    devices: Vec<Device>,
    parts: Vec<Part>,
}

impl Executable for SplitPlan {
    fn execute(
        &mut self,
        batch: &Batch,
        mut kv: Option<PreparedKv<'_>>,
        values: &[(String, HostTensor)],
    ) -> Result<StepOutputs, RunError> {
        let mut vals: Vec<(String, HostTensor)> = values.to_vec();
        let mut outs = Vec::new();
        for part in &mut self.parts {
            let pk = match kv.as_mut() {
                Some(k) if part.uses_kv => Some(PreparedKv {
                    pool: &mut *k.pool,
                    layout: k.layout,
                }),
                _ => None,
            };
            let res = part.exec.execute(batch, pk, &vals)?;
            for (name, t) in res.into_vec() {
                if self.finals.contains(&name) {
                    outs.push((name, t));
                } else {
                    vals.push((name, t));
                }
            }
        }
        // In the graph's order of outputs.
        let order: Vec<&str> = self
            .graph
            .outputs()
            .iter()
            .map(|(n, _)| n.as_str())
            .collect();
        outs.sort_by_key(|(n, _)| order.iter().position(|o| o == n));
        Ok(outs.into())
    }

    fn graph(&self) -> &Graph {
        &self.graph
    }

    fn arena_bytes(&self) -> usize {
        self.parts.iter().map(|p| p.exec.arena_bytes()).sum()
    }

    fn dump(&self) -> String {
        let mut s = String::new();
        for (i, p) in self.parts.iter().enumerate() {
            let _ = writeln!(s, "part {i} on {}:", self.devices[p.backend]);
            s.push_str(&p.exec.dump());
        }
        s
    }
}
