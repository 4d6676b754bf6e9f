//! Compiling a graph into a plan for the CPU, and running it.
//!
//! A plan is the optimised graph, a schedule, one kernel per step and an
//! arena laid out by value lifetimes for the largest shapes it will see.
//! Weights are read from the shared [`WeightStore`]; a plan owns only its
//! arena and scratch space.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;

use rlx_gguf::GgmlType;
use rlx_ir::passes::{self, FuseOptions};
use rlx_ir::{Bindings, DType, Dim, Graph, KvSource, NodeId, Op, Shape, Start, WeightId};

use crate::cpu::kernels::{attention, elementwise, moe, norm, rope, shape as shape_k};
use crate::cpu::matmul::{self, MatmulOptions, MatmulScratch, Precision, WeightMatrix};
use crate::cpu::CpuDevice;
use crate::kv::{KvCache, KvError, RowsView};
use crate::memory::{plan_memory, BufferRequest};
use crate::weights::WeightStore;

/// Outputs at least this long run their elementwise kernel on every thread;
/// below it (decode-sized rows) a wake-up costs more than the work.
const PARALLEL_MIN: usize = 1 << 15;

/// How to compile.
#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// The largest value each symbol takes; the arena is sized for these.
    pub max: Bindings,
    pub fuse: FuseOptions,
    /// Run CSE, fusion and DCE before scheduling.
    pub optimize: bool,
    pub precision: Precision,
}

impl CompileOptions {
    pub fn new(max: Bindings) -> Self {
        CompileOptions {
            max,
            fuse: FuseOptions::default(),
            optimize: true,
            precision: Precision::Exact,
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
    #[error(transparent)]
    Matmul(#[from] matmul::MatmulError),
    #[error("the graph uses the KV cache but no cache was given")]
    NoCache,
}

/// Receives `(name, shape, values)` of each named value as it is computed.
pub type Tap<'a> = dyn FnMut(&str, &[usize], &[f32]) + 'a;

/// Where a value lives during a run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Loc {
    /// Nothing (effects).
    None,
    Input,
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

/// A compiled graph for one device.
pub struct Plan {
    graph: Graph,
    store: Arc<WeightStore>,
    device: CpuDevice,
    steps: Vec<NodeId>,
    locs: Vec<Loc>,
    arena: Arena,
    /// Matmul scratch, borrowed by one step at a time.
    scratch: std::cell::RefCell<MatmulScratch>,
    /// The normalised input of a norm-folded matmul, reused across steps.
    norm_buf: std::cell::RefCell<Vec<f32>>,
    opts: CompileOptions,
}

pub(crate) fn node_err(g: &Graph, id: NodeId, msg: impl Into<String>) -> RunError {
    RunError::Node {
        node: id,
        op: g.node(id).op.name(),
        msg: msg.into(),
    }
}

/// Compiles `graph` for `device`, reading weights from `store`.
pub fn compile(
    graph: &Graph,
    store: &Arc<WeightStore>,
    device: &CpuDevice,
    opts: &CompileOptions,
) -> Result<Plan, RunError> {
    let g = prepare(graph, store, opts)?;
    let Schedule {
        steps,
        locs,
        arena_elems,
    } = schedule(&g, &opts.max, &|_| None)?;
    Ok(Plan {
        graph: g,
        store: Arc::clone(store),
        device: device.clone(),
        steps,
        locs,
        arena: Arena::new(arena_elems),
        scratch: std::cell::RefCell::new(MatmulScratch::default()),
        norm_buf: std::cell::RefCell::new(Vec::new()),
        opts: opts.clone(),
    })
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
            Op::Input { .. } => {}
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
            Op::Input { .. } => Loc::Input,
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
    for &id in &steps {
        if let Loc::Arena { .. } = locs[id.index()] {
            let n = g.node(id);
            let elems = n.shape.numel(max).ok_or_else(|| {
                node_err(
                    g,
                    id,
                    format!("shape {} has a symbol without a maximum", n.shape),
                )
            })?;
            let first = pos[&id];
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
    Ok(Schedule {
        steps,
        locs,
        arena_elems: mem.arena_bytes / 4,
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

/// Symbol values from the inputs' shapes, each checked against the graph and
/// the compiled maxima `max`.
pub(crate) fn bind(
    graph: &Graph,
    max: &Bindings,
    inputs: &HashMap<String, HostTensor>,
) -> Result<Bindings, RunError> {
    let mut b = Bindings::new();
    for id in graph.ids() {
        let n = graph.node(id);
        let Op::Input { name } = &n.op else { continue };
        let bad = |msg: String| RunError::Input {
            name: name.clone(),
            msg,
        };
        let t = inputs.get(name).ok_or_else(|| bad("missing".into()))?;
        let ok_type = matches!(
            (t, n.dtype),
            (HostTensor::F32 { .. }, DType::F32) | (HostTensor::I32 { .. }, DType::I32)
        );
        if !ok_type {
            return Err(bad(format!("expected {}", n.dtype)));
        }
        let given = t.shape();
        if given.len() != n.shape.rank() {
            return Err(bad(format!("expected shape {}, got {given:?}", n.shape)));
        }
        for (d, &g) in n.shape.dims().iter().zip(given) {
            match *d {
                Dim::Fixed(f) if f != g => {
                    return Err(bad(format!("expected shape {}, got {given:?}", n.shape)))
                }
                Dim::Fixed(_) => {}
                Dim::Sym(s) => match b.get(s) {
                    Some(v) if v != g => {
                        return Err(bad(format!("{s} is {v} elsewhere, {g} here")))
                    }
                    _ => {
                        let max = max.get(s).unwrap_or(0);
                        if g > max {
                            return Err(RunError::TooLarge {
                                sym: s.0,
                                value: g,
                                max,
                            });
                        }
                        b.set(s, g)
                    }
                },
            }
        }
        let len = match t {
            HostTensor::F32 { data, .. } => data.len(),
            HostTensor::I32 { data, .. } => data.len(),
        };
        if len != given.iter().product::<usize>() {
            return Err(bad(format!("{len} values for shape {given:?}")));
        }
    }
    Ok(b)
}

/// The activation buffer. Accessed only through raw-pointer slices of
/// disjoint ranges (the memory plan's guarantee), never as a whole.
struct Arena {
    ptr: std::ptr::NonNull<f32>,
    len: usize,
}

// SAFETY: the arena is plain memory owned by its plan; runs take `&mut Plan`.
unsafe impl Send for Arena {}

impl Arena {
    fn new(len: usize) -> Self {
        let boxed: Box<[f32]> = vec![0f32; len].into_boxed_slice();
        let ptr = std::ptr::NonNull::new(Box::into_raw(boxed) as *mut f32).expect("non-null");
        Arena { ptr, len }
    }

    /// # Safety
    /// No mutable slice overlapping this range may be live.
    unsafe fn slice(&self, offset: usize, len: usize) -> &[f32] {
        assert!(offset + len <= self.len);
        // SAFETY: in bounds; aliasing is the caller's contract.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(offset), len) }
    }

    /// # Safety
    /// No other slice overlapping this range may be live.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice_mut(&self, offset: usize, len: usize) -> &mut [f32] {
        assert!(offset + len <= self.len);
        // SAFETY: in bounds; aliasing is the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(offset), len) }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        let slice = std::ptr::slice_from_raw_parts_mut(self.ptr.as_ptr(), self.len);
        // SAFETY: `ptr`/`len` came from `Box::into_raw` of a boxed slice in `new`.
        drop(unsafe { Box::from_raw(slice) });
    }
}

/// A borrowed value during a run.
enum Val<'a> {
    F32(&'a [f32]),
    I32(&'a [i32]),
    Weight(GgmlType, &'a [u8]),
}

impl Plan {
    /// The optimised graph this plan runs.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    pub fn store(&self) -> &Arc<WeightStore> {
        &self.store
    }

    /// Bytes this plan owns: its arena (weights are the store's).
    pub fn arena_bytes(&self) -> usize {
        self.arena.len * 4
    }

    /// Runs the plan. Symbols are bound from the inputs' shapes. A graph that
    /// writes the KV cache appends at `kv.len()` and commits afterwards.
    pub fn run(
        &mut self,
        inputs: &HashMap<String, HostTensor>,
        kv: Option<&mut KvCache>,
    ) -> Result<Vec<(String, HostTensor)>, RunError> {
        self.run_inner(inputs, kv, None)
    }

    /// Like [`Plan::run`], calling `tap(name, shape, values)` for every named
    /// f32 value as soon as it is computed (for parity bisection).
    pub fn run_with_tap(
        &mut self,
        inputs: &HashMap<String, HostTensor>,
        kv: Option<&mut KvCache>,
        tap: &mut Tap<'_>,
    ) -> Result<Vec<(String, HostTensor)>, RunError> {
        self.run_inner(inputs, kv, Some(tap))
    }

    /// Runs every step; named values go to `tap` when there is one.
    fn run_inner(
        &mut self,
        inputs: &HashMap<String, HostTensor>,
        mut kv: Option<&mut KvCache>,
        mut tap: Option<&mut Tap<'_>>,
    ) -> Result<Vec<(String, HostTensor)>, RunError> {
        let b = self.bind(inputs)?;
        let mut wrote: Option<usize> = None;
        let start = kv.as_ref().map_or(0, |c| c.len());
        for si in 0..self.steps.len() {
            let id = self.steps[si];
            if let Some(n) = self.exec(id, &b, inputs, kv.as_deref_mut(), start)? {
                wrote = Some(n);
            }
            let Some(tap) = tap.as_deref_mut() else {
                continue;
            };
            let node = self.graph.node(id);
            if let (Some(name), DType::F32) = (&node.name, node.dtype) {
                let dims = node.shape.resolve(&b).expect("bound");
                if let Val::F32(v) = self.value(id, inputs, &b) {
                    tap(name, &dims, v);
                }
            }
        }
        if let (Some(n), Some(c)) = (wrote, kv) {
            c.commit(n);
        }
        let mut outs = Vec::new();
        for (name, id) in self.graph.outputs() {
            let dims = self.graph.node(*id).shape.resolve(&b).expect("bound");
            let t = match self.value(*id, inputs, &b) {
                Val::F32(v) => HostTensor::f32(v.to_vec(), &dims),
                Val::I32(v) => HostTensor::i32(v.to_vec(), &dims),
                Val::Weight(..) => {
                    return Err(node_err(&self.graph, *id, "a weight cannot be an output"))
                }
            };
            outs.push((name.clone(), t));
        }
        Ok(outs)
    }

    fn bind(&self, inputs: &HashMap<String, HostTensor>) -> Result<Bindings, RunError> {
        bind(&self.graph, &self.opts.max, inputs)
    }

    fn value<'a>(
        &'a self,
        id: NodeId,
        inputs: &'a HashMap<String, HostTensor>,
        b: &Bindings,
    ) -> Val<'a> {
        let n = self.graph.node(id);
        match self.locs[id.index()] {
            Loc::Input => {
                let Op::Input { name } = &n.op else {
                    unreachable!()
                };
                match &inputs[name] {
                    HostTensor::F32 { data, .. } => Val::F32(data),
                    HostTensor::I32 { data, .. } => Val::I32(data),
                }
            }
            Loc::Weight(w) => {
                let DType::Ggml(ty) = n.dtype else {
                    unreachable!()
                };
                Val::Weight(ty, self.store.bytes(w))
            }
            Loc::Arena { offset, cap } => {
                let len = n.shape.numel(b).expect("bound");
                assert!(len <= cap, "value larger than its planned buffer");
                // SAFETY: in bounds of the arena; the step being executed writes
                // only its own buffer, which the memory plan keeps disjoint from
                // every value live at that step (all values read here).
                Val::F32(unsafe { self.arena.slice(offset, len) })
            }
            Loc::Alias { src, offset } => match self.value(src, inputs, b) {
                Val::F32(v) => {
                    let len = n.shape.numel(b).expect("bound");
                    Val::F32(&v[offset..offset + len])
                }
                other => other,
            },
            Loc::None => Val::F32(&[]),
        }
    }

    /// Executes one step; returns the token count if it wrote the KV cache.
    fn exec(
        &self,
        id: NodeId,
        b: &Bindings,
        inputs: &HashMap<String, HostTensor>,
        kv: Option<&mut KvCache>,
        start: usize,
    ) -> Result<Option<usize>, RunError> {
        let g = &self.graph;
        let n = g.node(id);
        let Loc::Arena { offset, .. } = self.locs[id.index()] else {
            // Reshapes alias; effects write the cache.
            if let Op::KvWrite { slot } = n.op {
                let cache = kv.ok_or(RunError::NoCache)?;
                let tokens = g.node(n.inputs[0]).shape.0[0].resolve(b).expect("bound");
                let (k, v) = (
                    self.f32_of(n.inputs[0], inputs, b),
                    self.f32_of(n.inputs[1], inputs, b),
                );
                let spans = n.inputs.get(2).map(|&s| self.i32_of(s, inputs, b));
                cache.write(slot, k, v, tokens, spans)?;
                return Ok(Some(tokens));
            }
            return Ok(None);
        };
        let out_len = n.shape.numel(b).expect("bound");
        let dims = n.shape.resolve(b).expect("bound");
        // SAFETY: `offset..offset+out_len` lies in the arena (sized for the
        // maxima; `bind` checked every symbol against them) and no value live
        // at this step overlaps it, so this is the only reference to it.
        let out: &mut [f32] = unsafe { self.arena.slice_mut(offset, out_len) };
        let val = |i: usize| -> Val<'_> { self.value(n.inputs[i], inputs, b) };
        let f32v = |i: usize| -> &[f32] {
            match val(i) {
                Val::F32(v) => v,
                _ => unreachable!("validated f32"),
            }
        };
        let vector = |i: usize| -> Cow<'_, [f32]> {
            match val(i) {
                Val::F32(v) => Cow::Borrowed(v),
                Val::Weight(ty, bytes) => {
                    Cow::Owned(rlx_gguf::dequantize_to_vec(ty, bytes).expect("validated weight"))
                }
                Val::I32(_) => unreachable!("validated"),
            }
        };
        let pool = self.device.pool();
        let isa = self.device.isa();
        match &n.op {
            Op::Gather => {
                let Val::Weight(ty, table) = val(0) else {
                    unreachable!()
                };
                let ids = self.i32_of(n.inputs[1], inputs, b);
                let info = g.node(n.inputs[0]);
                let (vocab, width) = (
                    info.shape.0[0].fixed().expect("fixed"),
                    info.shape.0[1].fixed().expect("fixed"),
                );
                let row_bytes = width / ty.block_elems() * ty.block_bytes();
                for (t, &tok) in ids.iter().enumerate() {
                    if tok < 0 || tok as usize >= vocab {
                        return Err(node_err(
                            g,
                            id,
                            format!("token id {tok} is outside the vocabulary of {vocab}"),
                        ));
                    }
                    let row = &table[tok as usize * row_bytes..][..row_bytes];
                    rlx_gguf::dequantize(ty, row, &mut out[t * width..(t + 1) * width])
                        .expect("validated table");
                }
            }
            Op::MatMul { norm } => {
                let x = f32v(0);
                let k_in = g
                    .node(n.inputs[0])
                    .shape
                    .last()
                    .and_then(|d| d.resolve(b))
                    .expect("bound");
                let m = x.len() / k_in;
                let mut normed = self.norm_buf.borrow_mut();
                let mut first_w = 1;
                let x = match norm {
                    Some(spec) => {
                        let gamma = if spec.has_gamma {
                            first_w = 2;
                            Some(vector(1))
                        } else {
                            None
                        };
                        normed.resize(x.len(), 0.0);
                        let gamma = gamma.as_deref();
                        pool.for_rows(&mut normed, k_in, PARALLEL_MIN, &|r0, band| {
                            norm::rms_norm(
                                isa,
                                &x[r0 * k_in..][..band.len()],
                                k_in,
                                gamma,
                                spec.eps,
                                band,
                            )
                        });
                        &normed[..]
                    }
                    None => x,
                };
                let ws: Vec<WeightMatrix> = n.inputs[first_w..]
                    .iter()
                    .map(|&w| {
                        let Val::Weight(ty, data) = self.value(w, inputs, b) else {
                            unreachable!()
                        };
                        WeightMatrix {
                            ty,
                            rows: g.node(w).shape.0[0].fixed().expect("fixed"),
                            k: k_in,
                            data,
                        }
                    })
                    .collect();
                let opts = MatmulOptions {
                    precision: self.opts.precision,
                    isa,
                };
                let mut scratch = self.scratch.borrow_mut();
                matmul::matmul(pool, &opts, x, m, &ws, out, &mut scratch)?;
            }
            Op::Add | Op::Mul => {
                let b_vals = vector(1);
                let b_dims = g.node(n.inputs[1]).shape.resolve(b).expect("bound");
                let suffix = b_vals.len() == 1 || dims.ends_with(&b_dims);
                let a = f32v(0);
                let period = b_vals.len();
                match (&n.op, suffix) {
                    (Op::Add, true) => pool.for_rows(out, period, PARALLEL_MIN, &|r0, band| {
                        elementwise::add(&a[r0 * period..][..band.len()], &b_vals, band)
                    }),
                    (Op::Mul, true) => pool.for_rows(out, period, PARALLEL_MIN, &|r0, band| {
                        elementwise::mul(&a[r0 * period..][..band.len()], &b_vals, band)
                    }),
                    (Op::Add, false) => elementwise::broadcast_binary(
                        f32v(0),
                        &dims,
                        &b_vals,
                        &b_dims,
                        out,
                        |x, y| x + y,
                    ),
                    _ => elementwise::broadcast_binary(
                        f32v(0),
                        &dims,
                        &b_vals,
                        &b_dims,
                        out,
                        |x, y| x * y,
                    ),
                }
            }
            Op::BatchMatMul => {
                let ad = g.node(n.inputs[0]).shape.resolve(b).expect("bound");
                elementwise::batch_matmul(f32v(0), f32v(1), ad[0], ad[1], ad[2], dims[2], out);
            }
            Op::MatchRms { floor } => {
                elementwise::match_rms(f32v(0), f32v(1), *dims.last().expect("rank"), *floor, out)
            }
            Op::GaussianTopK { std_multiplier } => elementwise::gaussian_topk(
                f32v(0),
                *dims.last().expect("rank"),
                *std_multiplier,
                out,
            ),
            Op::Scale { factor } => elementwise::scale(f32v(0), *factor, out),
            Op::AddConst { value } => {
                for (o, &v) in out.iter_mut().zip(f32v(0)) {
                    *o = v + value;
                }
            }
            Op::Gelu => {
                let x = f32v(0);
                pool.for_rows(out, 1, PARALLEL_MIN, &|r0, band| {
                    elementwise::gelu(isa, &x[r0..][..band.len()], band)
                });
            }
            Op::GeGlu => {
                let (gate, up) = (f32v(0), f32v(1));
                pool.for_rows(out, 1, PARALLEL_MIN, &|r0, band| {
                    let n = band.len();
                    elementwise::geglu(isa, &gate[r0..][..n], &up[r0..][..n], band)
                });
            }
            Op::Softcap { cap } => elementwise::softcap(f32v(0), *cap, out),
            Op::RmsNorm(spec) => {
                let gamma = spec.has_gamma.then(|| vector(1));
                let gamma = gamma.as_deref();
                let (x, d) = (f32v(0), *dims.last().expect("rank"));
                pool.for_rows(out, d, PARALLEL_MIN, &|r0, band| {
                    norm::rms_norm(isa, &x[r0 * d..][..band.len()], d, gamma, spec.eps, band)
                });
            }
            Op::Rope(spec) => {
                let factors = spec.has_freq_factors.then(|| vector(2));
                let pos = self.i32_of(n.inputs[1], inputs, b);
                rope::rope(
                    f32v(0),
                    dims[1],
                    dims[2],
                    pos,
                    spec,
                    factors.as_deref(),
                    out,
                );
            }
            Op::Attention(spec) => {
                let q = f32v(0);
                let n_q = dims[0];
                let params = attention::Params {
                    mask: spec.mask,
                    scale: spec.scale,
                    softcap: spec.softcap,
                };
                // Key rows with their positions: the K/V inputs at 0..m (the
                // queries being the last n of them), or the cache slot.
                let (kpos, kspan, view);
                let (rows, qpos, qspan) = match spec.kv {
                    KvSource::Inputs => {
                        let kd = g.node(n.inputs[1]).shape.resolve(b).expect("bound");
                        let vd = g.node(n.inputs[2]).shape.resolve(b).expect("bound");
                        let m = kd[0];
                        kpos = (0..m as i64).collect::<Vec<i64>>();
                        kspan = vec![0i32; m];
                        let rows = attention::KvRows {
                            k: RowsView::F32(f32v(1)),
                            v: RowsView::F32(f32v(2)),
                            pos: &kpos,
                            span: &kspan,
                            kv_heads: kd[1],
                            head_dim: kd[2],
                            v_head_dim: vd[2],
                        };
                        let qpos: Vec<i64> =
                            (0..n_q).map(|i| (m + i) as i64 - n_q as i64).collect();
                        (rows, qpos, None)
                    }
                    KvSource::Cache(slot) => {
                        view = kv.ok_or(RunError::NoCache)?.view(slot)?;
                        let rows = attention::KvRows {
                            k: view.k,
                            v: view.v,
                            pos: view.pos,
                            span: view.span,
                            kv_heads: view.spec.kv_heads,
                            head_dim: view.spec.head_dim,
                            v_head_dim: view.spec.v_head_dim,
                        };
                        let qpos: Vec<i64> = (0..n_q).map(|i| (start + i) as i64).collect();
                        let qspan = spec
                            .bidirectional_spans
                            .then(|| self.i32_of(n.inputs[2], inputs, b));
                        (rows, qpos, qspan)
                    }
                };
                let queries = attention::Queries {
                    q,
                    pos: &qpos,
                    span: qspan,
                    heads: dims[1],
                };
                attention::attention(pool, isa, params, &queries, &rows, out);
            }
            Op::Moe { top_k } => {
                let stack = |i: usize| -> moe::ExpertStack<'_> {
                    let Val::Weight(ty, data) = val(i) else {
                        unreachable!()
                    };
                    let dims: Vec<usize> = g
                        .node(n.inputs[i])
                        .shape
                        .0
                        .iter()
                        .map(|d| d.fixed().expect("fixed"))
                        .collect();
                    moe::ExpertStack {
                        ty,
                        data,
                        experts: dims[0],
                        rows: dims[1],
                        k: dims[2],
                    }
                };
                let opts = MatmulOptions {
                    precision: self.opts.precision,
                    isa,
                };
                let mut scratch = self.scratch.borrow_mut();
                moe::moe(
                    pool,
                    &opts,
                    &mut scratch,
                    f32v(0),
                    f32v(1),
                    *top_k,
                    stack(2),
                    stack(3),
                    &vector(4),
                    out,
                )?;
            }
            Op::Narrow {
                axis,
                start: s,
                len,
            } => {
                let xd = g.node(n.inputs[0]).shape.resolve(b).expect("bound");
                let from = narrow_from(*s, xd[*axis], *len).map_err(|msg| node_err(g, id, msg))?;
                shape_k::narrow(f32v(0), &xd, *axis, from, *len, out);
            }
            Op::Concat { axis } => {
                let parts: Vec<(Vec<usize>, &[f32])> = (0..n.inputs.len())
                    .map(|i| {
                        (
                            g.node(n.inputs[i]).shape.resolve(b).expect("bound"),
                            f32v(i),
                        )
                    })
                    .collect();
                let refs: Vec<(&[f32], &[usize])> =
                    parts.iter().map(|(d, v)| (*v, &d[..])).collect();
                shape_k::concat(&refs, *axis, out);
            }
            Op::Input { .. } | Op::Weight { .. } | Op::Reshape { .. } | Op::KvWrite { .. } => {
                unreachable!("not an arena step")
            }
        }
        Ok(None)
    }

    fn f32_of<'a>(
        &'a self,
        id: NodeId,
        inputs: &'a HashMap<String, HostTensor>,
        b: &Bindings,
    ) -> &'a [f32] {
        match self.value(id, inputs, b) {
            Val::F32(v) => v,
            _ => unreachable!("validated f32"),
        }
    }

    fn i32_of<'a>(
        &'a self,
        id: NodeId,
        inputs: &'a HashMap<String, HostTensor>,
        b: &Bindings,
    ) -> &'a [i32] {
        match self.value(id, inputs, b) {
            Val::I32(v) => v,
            _ => unreachable!("validated i32"),
        }
    }

    /// A readable listing: each step's op, shape, kernel and arena range, and
    /// what each fused node stands for.
    pub fn dump(&self) -> String {
        let g = &self.graph;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "plan: {} steps, arena {} bytes, {} threads, isa {:?}, matmul {:?}",
            self.steps.len(),
            self.arena_bytes(),
            self.device.threads(),
            self.device.isa(),
            self.opts.precision
        );
        for &id in &self.steps {
            let n = g.node(id);
            let args: Vec<String> = n.inputs.iter().map(|i| i.to_string()).collect();
            let _ = write!(s, "{id} = {}({}) : {}", n.op, args.join(", "), n.shape);
            match self.locs[id.index()] {
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
        s
    }
}
