//! A graph compiled for the CPU, and its runs: one kernel per step over an
//! arena laid out by value lifetimes (see [`crate::compile`]). Weights are
//! read from the shared [`WeightStore`]; a plan owns only its arena and
//! scratch space.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::sync::Arc;

use rlx_gguf::GgmlType;
use rlx_ir::{
    AttentionSpec, Bindings, CacheSlot, DType, Graph, KvSource, Node, NodeId, NormSpec, Op,
};

use crate::backend::{step, Executable, PreparedKv};
use crate::batch::Batch;
use crate::compile::{
    bind, dump_steps, narrow_from, node_err, prepare, schedule, value_copies, CompileOptions,
    HostTensor, Loc, RunError, Schedule, StepInputs, StepOutputs, Tap,
};
use crate::cpu::features::Isa;
use crate::cpu::kernels::{attention, elementwise, moe, norm, rope, shape as shape_k};
use crate::cpu::kv::{CpuKvStorage, RowsView};
use crate::cpu::matmul::{self, MatmulOptions, MatmulScratch, WeightMatrix};
use crate::cpu::pool::ThreadPool;
use crate::cpu::CpuDevice;
use crate::kv::{KvError, KvPool, StepLayout};
use crate::weights::WeightStore;

/// Outputs at least this long run their elementwise kernel on every thread;
/// below it (decode-sized rows) a wake-up costs more than the work.
const PARALLEL_MIN: usize = 1 << 15;

/// A compiled graph for the CPU.
pub struct Plan {
    graph: Graph,
    store: Arc<WeightStore>,
    device: CpuDevice,
    steps: Vec<NodeId>,
    locs: Vec<Loc>,
    /// The f32 inputs (values of another plan of the step).
    values: Vec<NodeId>,
    arena: Arena,
    /// Matmul scratch, borrowed by one step at a time.
    scratch: std::cell::RefCell<MatmulScratch>,
    /// The normalised input of a norm-folded matmul, reused across steps.
    norm_buf: std::cell::RefCell<Vec<f32>>,
    opts: CompileOptions,
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
        values,
        arena_elems,
    } = schedule(&g, &opts.max, &|_| None)?;
    Ok(Plan {
        graph: g,
        store: Arc::clone(store),
        device: device.clone(),
        steps,
        locs,
        values,
        arena: Arena::new(arena_elems),
        scratch: std::cell::RefCell::new(MatmulScratch::default()),
        norm_buf: std::cell::RefCell::new(Vec::new()),
        opts: opts.clone(),
    })
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

    /// What it was compiled with.
    pub fn options(&self) -> &CompileOptions {
        &self.opts
    }

    /// Bytes this plan owns: its arena (weights are the store's).
    pub fn arena_bytes(&self) -> usize {
        self.arena.len * 4
    }

    /// Runs one step of `batch`: symbols are bound from its length, and a
    /// graph that uses the K/V pool writes each row at its sequence and
    /// position (the pool advances the sequences afterwards). Returns the
    /// graph's outputs (logits: one row per batch row that wants them).
    pub fn run(&mut self, batch: &Batch, kv: Option<&mut KvPool>) -> Result<StepOutputs, RunError> {
        Executable::run(self, batch, kv)
    }

    /// Like [`Plan::run`], calling `tap(name, shape, values)` for every named
    /// f32 value as soon as it is computed (for parity bisection).
    pub fn run_with_tap(
        &mut self,
        batch: &Batch,
        kv: Option<&mut KvPool>,
        tap: &mut Tap<'_>,
    ) -> Result<StepOutputs, RunError> {
        step(batch, kv, |kv| self.run_inner(batch, kv, &[], Some(tap)))
    }

    /// Runs every step on a prepared pool; named values go to `tap` when
    /// there is one.
    pub(crate) fn run_inner(
        &mut self,
        batch: &Batch,
        mut kv: Option<PreparedKv<'_>>,
        values: &[(String, HostTensor)],
        mut tap: Option<&mut Tap<'_>>,
    ) -> Result<StepOutputs, RunError> {
        let inputs = StepInputs::new(batch, values);
        let b = bind(&self.graph, &self.opts.max, &inputs)?;
        self.copy_in(&inputs);
        for si in 0..self.steps.len() {
            let id = self.steps[si];
            let (pool, layout) = match kv.as_mut() {
                Some(p) => (Some(&mut *p.pool), Some(p.layout)),
                None => (None, None),
            };
            self.exec(id, &b, &inputs, pool, layout)?;
            let Some(tap) = tap.as_deref_mut() else {
                continue;
            };
            let node = self.graph.node(id);
            if let (Some(name), DType::F32) = (&node.name, node.dtype) {
                let dims = node.shape.resolve(&b).expect("bound");
                if let Val::F32(v) = self.value(id, &inputs, &b) {
                    tap(name, &dims, v);
                }
            }
        }
        let mut outs = Vec::new();
        for (name, id) in self.graph.outputs() {
            let dims = self.graph.node(*id).shape.resolve(&b).expect("bound");
            let t = match self.value(*id, &inputs, &b) {
                Val::F32(v) => HostTensor::f32(v.to_vec(), &dims),
                Val::I32(v) => HostTensor::i32(v.to_vec(), &dims),
                Val::Weight(..) => {
                    return Err(node_err(&self.graph, *id, "a weight cannot be an output"))
                }
            };
            outs.push((name.clone(), t));
        }
        Ok(outs.into())
    }

    /// Copies the f32 inputs into their arena buffers.
    fn copy_in(&mut self, inputs: &StepInputs) {
        for (offset, data) in value_copies(&self.graph, &self.values, &self.locs, inputs) {
            // SAFETY: `bind` checked the value against its node's shape, so
            // it lies within the buffer the schedule planned for it; no
            // step runs while inputs are copied in.
            unsafe { self.arena.slice_mut(offset, data.len()) }.copy_from_slice(data);
        }
    }

    fn value<'a>(&'a self, id: NodeId, inputs: &'a StepInputs, b: &Bindings) -> Val<'a> {
        let n = self.graph.node(id);
        match self.locs[id.index()] {
            Loc::Input(which) => Val::I32(inputs.get(which)),
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

    /// Executes one step.
    fn exec(
        &self,
        id: NodeId,
        b: &Bindings,
        inputs: &StepInputs,
        kv: Option<&mut KvPool>,
        layout: Option<&StepLayout>,
    ) -> Result<(), RunError> {
        let g = &self.graph;
        let n = g.node(id);
        let Loc::Arena { offset, .. } = self.locs[id.index()] else {
            // Reshapes alias; effects write the cache.
            if let Op::KvWrite { slot } = n.op {
                let (pool, layout) = kv.zip(layout).ok_or(RunError::NoCache)?;
                let group = pool.group_of(slot)?;
                let rows = &layout.write_rows[group];
                let (k, v) = (
                    self.f32_of(n.inputs[0], inputs, b),
                    self.f32_of(n.inputs[1], inputs, b),
                );
                cpu_storage(pool, slot)?.write(slot.0 as usize, k, v, rows)?;
                if let Some(&s) = n.inputs.get(2) {
                    for (&row, &span) in rows.iter().zip(self.i32_of(s, inputs, b)) {
                        pool.set_span(group, row, span);
                    }
                }
            }
            return Ok(());
        };
        let out_len = n.shape.numel(b).expect("bound");
        let dims = n.shape.resolve(b).expect("bound");
        // SAFETY: `offset..offset+out_len` lies in the arena (sized for the
        // maxima; `bind` checked every symbol against them) and no value live
        // at this step overlaps it, so this is the only reference to it.
        let out: &mut [f32] = unsafe { self.arena.slice_mut(offset, out_len) };
        let run = Run {
            plan: self,
            g,
            id,
            n,
            b,
            inputs,
            dims,
            pool: self.device.pool(),
            isa: self.device.isa(),
            rows: self.device.rows(),
        };
        let (pool, isa) = (run.pool, run.isa);
        match &n.op {
            Op::Gather => run.gather(out)?,
            Op::MatMul { norm } => run.matmul(norm, out)?,
            Op::Add | Op::Mul => run.add_mul(out)?,
            Op::BatchMatMul => {
                let ad = run.dims_of(0);
                elementwise::batch_matmul(
                    run.f32v(0),
                    run.f32v(1),
                    ad[0],
                    ad[1],
                    ad[2],
                    run.dims[2],
                    out,
                );
            }
            Op::MatchRms { floor } => elementwise::match_rms(
                run.f32v(0),
                run.f32v(1),
                *run.dims.last().expect("rank"),
                *floor,
                out,
            ),
            Op::GaussianTopK { std_multiplier } => elementwise::gaussian_topk(
                run.f32v(0),
                *run.dims.last().expect("rank"),
                *std_multiplier,
                out,
            ),
            Op::Scale { factor } => elementwise::scale(run.f32v(0), *factor, out),
            Op::AddConst { value } => {
                for (o, &v) in out.iter_mut().zip(run.f32v(0)) {
                    *o = v + value;
                }
            }
            Op::Gelu => {
                let x = run.f32v(0);
                pool.for_rows(out, 1, PARALLEL_MIN, &|r0, band| {
                    elementwise::gelu(isa, &x[r0..][..band.len()], band)
                });
            }
            Op::GeGlu => {
                let (gate, up) = (run.f32v(0), run.f32v(1));
                pool.for_rows(out, 1, PARALLEL_MIN, &|r0, band| {
                    let n = band.len();
                    elementwise::geglu(isa, &gate[r0..][..n], &up[r0..][..n], band)
                });
            }
            Op::Softcap { cap } => elementwise::softcap(run.f32v(0), *cap, out),
            Op::RmsNorm(spec) => {
                let gamma = spec.has_gamma.then(|| run.vector(1));
                let gamma = gamma.as_deref();
                let (x, d) = (run.f32v(0), *run.dims.last().expect("rank"));
                pool.for_rows(out, d, PARALLEL_MIN, &|r0, band| {
                    norm::rms_norm(isa, &x[r0 * d..][..band.len()], d, gamma, spec.eps, band)
                });
            }
            Op::Rope(spec) => {
                let factors = spec.has_freq_factors.then(|| run.vector(2));
                let pos = run.i32_in(1);
                rope::rope(
                    run.f32v(0),
                    run.dims[1],
                    run.dims[2],
                    pos,
                    spec,
                    factors.as_deref(),
                    out,
                );
            }
            Op::Attention(spec) => run.attention(spec, kv.as_deref(), layout, out)?,
            Op::TakeRows => run.take_rows(out)?,
            Op::Moe { top_k } => run.moe(top_k, out)?,
            Op::Narrow {
                axis,
                start: s,
                len,
            } => {
                let xd = run.dims_of(0);
                let from = narrow_from(*s, xd[*axis], *len).map_err(|msg| run.err(msg))?;
                shape_k::narrow(run.f32v(0), &xd, *axis, from, *len, out);
            }
            Op::Concat { axis } => run.concat(axis, out)?,
            Op::Input { .. } | Op::Weight { .. } | Op::Reshape { .. } | Op::KvWrite { .. } => {
                unreachable!("not an arena step")
            }
        }
        Ok(())
    }

    fn f32_of<'a>(&'a self, id: NodeId, inputs: &'a StepInputs, b: &Bindings) -> &'a [f32] {
        match self.value(id, inputs, b) {
            Val::F32(v) => v,
            _ => unreachable!("validated f32"),
        }
    }

    fn i32_of<'a>(&'a self, id: NodeId, inputs: &'a StepInputs, b: &Bindings) -> &'a [i32] {
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
        dump_steps(&mut s, g, &self.steps, &self.locs);
        s
    }
}

/// One step being run: its node, the step's values and bindings, and what
/// every op's kernel call reads of them.
struct Run<'a> {
    plan: &'a Plan,
    g: &'a Graph,
    id: NodeId,
    n: &'a Node,
    b: &'a Bindings,
    inputs: &'a StepInputs<'a>,
    /// The node's dimensions at this step.
    dims: Vec<usize>,
    pool: &'a ThreadPool,
    isa: Isa,
    /// The decode kernels' instruction set by type.
    rows: matmul::RowChoice,
}

impl<'a> Run<'a> {
    fn val(&self, i: usize) -> Val<'a> {
        self.plan.value(self.n.inputs[i], self.inputs, self.b)
    }

    fn f32v(&self, i: usize) -> &'a [f32] {
        match self.val(i) {
            Val::F32(v) => v,
            _ => unreachable!("validated f32"),
        }
    }

    fn i32_in(&self, i: usize) -> &'a [i32] {
        self.plan.i32_of(self.n.inputs[i], self.inputs, self.b)
    }

    /// A vector input (a norm's weight, an addend) as f32, dequantized
    /// where it is a weight.
    fn vector(&self, i: usize) -> Cow<'a, [f32]> {
        match self.val(i) {
            Val::F32(v) => Cow::Borrowed(v),
            Val::Weight(ty, bytes) => {
                Cow::Owned(rlx_gguf::dequantize_to_vec(ty, bytes).expect("validated weight"))
            }
            Val::I32(_) => unreachable!("validated"),
        }
    }

    /// Input `i`'s dimensions at this step.
    fn dims_of(&self, i: usize) -> Vec<usize> {
        self.g
            .node(self.n.inputs[i])
            .shape
            .resolve(self.b)
            .expect("bound")
    }

    fn err(&self, msg: impl Into<String>) -> RunError {
        node_err(self.g, self.id, msg)
    }

    /// Rows of a weight table, dequantized, by token id.
    fn gather(&self, out: &mut [f32]) -> Result<(), RunError> {
        let Val::Weight(ty, table) = self.val(0) else {
            unreachable!()
        };
        let ids = self.plan.i32_of(self.n.inputs[1], self.inputs, self.b);
        let info = self.g.node(self.n.inputs[0]);
        let (vocab, width) = (
            info.shape.0[0].fixed().expect("fixed"),
            info.shape.0[1].fixed().expect("fixed"),
        );
        let row_bytes = width / ty.block_elems() * ty.block_bytes();
        for (t, &tok) in ids.iter().enumerate() {
            if tok < 0 || tok as usize >= vocab {
                return Err(self.err(format!(
                    "token id {tok} is outside the vocabulary of {vocab}"
                )));
            }
            let row = &table[tok as usize * row_bytes..][..row_bytes];
            rlx_gguf::dequantize(ty, row, &mut out[t * width..(t + 1) * width])
                .expect("validated table");
        }
        Ok(())
    }

    /// Products with one or more weights, after an optional RMS norm of the input.
    fn matmul(&self, norm: &Option<NormSpec>, out: &mut [f32]) -> Result<(), RunError> {
        let (pool, isa) = (self.pool, self.isa);
        let x = self.f32v(0);
        let k_in = self
            .g
            .node(self.n.inputs[0])
            .shape
            .last()
            .and_then(|d| d.resolve(self.b))
            .expect("bound");
        let m = x.len() / k_in;
        let mut normed = self.plan.norm_buf.borrow_mut();
        let mut first_w = 1;
        let x = match norm {
            Some(spec) => {
                let gamma = if spec.has_gamma {
                    first_w = 2;
                    Some(self.vector(1))
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
        let ws: Vec<WeightMatrix> = self.n.inputs[first_w..]
            .iter()
            .map(|&w| {
                let Val::Weight(ty, data) = self.plan.value(w, self.inputs, self.b) else {
                    unreachable!()
                };
                WeightMatrix {
                    ty,
                    rows: self.g.node(w).shape.0[0].fixed().expect("fixed"),
                    k: k_in,
                    data,
                }
            })
            .collect();
        let opts = MatmulOptions {
            precision: self.plan.opts.precision,
            isa,
            batch_invariant: self.plan.opts.batch_invariant,
            rows: self.rows,
        };
        let mut scratch = self.plan.scratch.borrow_mut();
        matmul::matmul(pool, &opts, x, m, &ws, out, &mut scratch)
            .map_err(|e| self.err(e.to_string()))?;
        Ok(())
    }

    /// `a + b` or `a × b`, `b` broadcast (a whole-row suffix of `a`'s shape in bands).
    fn add_mul(&self, out: &mut [f32]) -> Result<(), RunError> {
        let pool = self.pool;
        let b_vals = self.vector(1);
        let b_dims = self
            .g
            .node(self.n.inputs[1])
            .shape
            .resolve(self.b)
            .expect("bound");
        let suffix = b_vals.len() == 1 || self.dims.ends_with(&b_dims);
        let a = self.f32v(0);
        let period = b_vals.len();
        match (&self.n.op, suffix) {
            (Op::Add, true) => pool.for_rows(out, period, PARALLEL_MIN, &|r0, band| {
                elementwise::add(&a[r0 * period..][..band.len()], &b_vals, band)
            }),
            (Op::Mul, true) => pool.for_rows(out, period, PARALLEL_MIN, &|r0, band| {
                elementwise::mul(&a[r0 * period..][..band.len()], &b_vals, band)
            }),
            (Op::Add, false) => elementwise::broadcast_binary(
                self.f32v(0),
                &self.dims,
                &b_vals,
                &b_dims,
                out,
                |x, y| x + y,
            ),
            _ => elementwise::broadcast_binary(
                self.f32v(0),
                &self.dims,
                &b_vals,
                &b_dims,
                out,
                |x, y| x * y,
            ),
        }
        Ok(())
    }

    /// Attention of the queries over K/V inputs or the pool's blocks of each sequence.
    fn attention(
        &self,
        spec: &AttentionSpec,
        kv: Option<&KvPool>,
        layout: Option<&StepLayout>,
        out: &mut [f32],
    ) -> Result<(), RunError> {
        let (pool, isa) = (self.pool, self.isa);
        let q = self.f32v(0);
        let n_q = self.dims[0];
        let params = attention::Params {
            mask: spec.mask,
            scale: spec.scale,
            softcap: spec.softcap,
            split_keys: !self.plan.opts.batch_invariant,
        };
        // Key rows with their positions: the K/V self.inputs at 0..m (the
        // queries being the last n of them), or the pool's blocks of
        // each sequence.
        let (kpos, kspan, qpos_inputs): (Vec<i64>, Vec<i32>, Vec<i64>);
        let (rows, qpos, qspan, segments) = match spec.kv {
            KvSource::Inputs => {
                let kd = self
                    .g
                    .node(self.n.inputs[1])
                    .shape
                    .resolve(self.b)
                    .expect("bound");
                let vd = self
                    .g
                    .node(self.n.inputs[2])
                    .shape
                    .resolve(self.b)
                    .expect("bound");
                let m = kd[0];
                kpos = (0..m as i64).collect::<Vec<i64>>();
                kspan = vec![0i32; m];
                let rows = attention::KvRows {
                    k: RowsView::F32(self.f32v(1)),
                    v: RowsView::F32(self.f32v(2)),
                    pos: &kpos,
                    span: &kspan,
                    kv_heads: kd[1],
                    head_dim: kd[2],
                    v_head_dim: vd[2],
                };
                qpos_inputs = (0..n_q).map(|i| (m + i) as i64 - n_q as i64).collect();
                let all = vec![attention::Segment {
                    queries: 0..n_q,
                    blocks: None,
                }];
                (rows, &qpos_inputs, None, all)
            }
            KvSource::Cache(slot) => {
                let kvp = kv.ok_or(RunError::NoCache)?;
                let layout = layout.ok_or(RunError::NoCache)?;
                let (owner, layer) = kvp.owner(slot)?;
                let group = kvp.group_of(slot)?;
                let (k, v) = kvp
                    .storage_of(owner)?
                    .as_any()
                    .downcast_ref::<CpuKvStorage>()
                    .and_then(|s| s.view(owner.0 as usize))
                    .ok_or_else(not_cpu)?;
                let g_rows = kvp.rows(group);
                let rows = attention::KvRows {
                    k,
                    v,
                    pos: g_rows.pos,
                    span: g_rows.span,
                    kv_heads: layer.kv_heads,
                    head_dim: layer.head_dim,
                    v_head_dim: layer.v_head_dim,
                };
                qpos_inputs = self.inputs.pos.iter().map(|&p| p as i64).collect();
                let qspan = spec
                    .bidirectional_spans
                    .then(|| self.plan.i32_of(self.n.inputs[2], self.inputs, self.b));
                let segments = layout
                    .runs
                    .iter()
                    .zip(&layout.blocks[group])
                    .map(|(run, blocks)| attention::Segment {
                        queries: run.rows.clone(),
                        blocks: Some(blocks),
                    })
                    .collect();
                (rows, &qpos_inputs, qspan, segments)
            }
        };
        let queries = attention::Queries {
            q,
            pos: qpos,
            span: qspan,
            heads: self.dims[1],
        };
        attention::attention(pool, isa, params, &queries, &rows, &segments, out);
        Ok(())
    }

    /// Rows of a value by row number.
    fn take_rows(&self, out: &mut [f32]) -> Result<(), RunError> {
        let x = self.f32v(0);
        let width: usize = self.dims[1..].iter().product();
        let n_x = x.len() / width.max(1);
        for (r, &src) in self
            .plan
            .i32_of(self.n.inputs[1], self.inputs, self.b)
            .iter()
            .enumerate()
        {
            if src < 0 || src as usize >= n_x {
                return Err(self.err(format!("row {src} of {n_x}")));
            }
            out[r * width..][..width].copy_from_slice(&x[src as usize * width..][..width]);
        }
        Ok(())
    }

    /// A mixture-of-experts block.
    fn moe(&self, top_k: &usize, out: &mut [f32]) -> Result<(), RunError> {
        let (pool, isa) = (self.pool, self.isa);
        let stack = |i: usize| -> moe::ExpertStack<'_> {
            let Val::Weight(ty, data) = self.val(i) else {
                unreachable!()
            };
            let dims: Vec<usize> = self
                .g
                .node(self.n.inputs[i])
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
            precision: self.plan.opts.precision,
            isa,
            batch_invariant: self.plan.opts.batch_invariant,
            rows: self.rows,
        };
        let mut scratch = self.plan.scratch.borrow_mut();
        moe::moe(
            pool,
            &opts,
            &mut scratch,
            self.f32v(0),
            self.f32v(1),
            *top_k,
            stack(2),
            stack(3),
            &self.vector(4),
            out,
        )
        .map_err(|e| self.err(e.to_string()))?;
        Ok(())
    }

    /// Values joined along one axis.
    fn concat(&self, axis: &usize, out: &mut [f32]) -> Result<(), RunError> {
        let parts: Vec<(Vec<usize>, &[f32])> = (0..self.n.inputs.len())
            .map(|i| {
                (
                    self.g
                        .node(self.n.inputs[i])
                        .shape
                        .resolve(self.b)
                        .expect("bound"),
                    self.f32v(i),
                )
            })
            .collect();
        let refs: Vec<(&[f32], &[usize])> = parts.iter().map(|(d, v)| (*v, &d[..])).collect();
        shape_k::concat(&refs, *axis, out);
        Ok(())
    }
}

fn not_cpu() -> RunError {
    RunError::Kv(KvError::Storage(
        "the K/V pool is not in host memory (it belongs to another device)".into(),
    ))
}

/// The storage of `slot`, which a CPU plan can only use in host memory.
fn cpu_storage(pool: &mut KvPool, slot: CacheSlot) -> Result<&mut CpuKvStorage, RunError> {
    pool.storage_of_mut(slot)?
        .as_any_mut()
        .downcast_mut::<CpuKvStorage>()
        .ok_or_else(not_cpu)
}
