//! A graph compiled for a GPU: the CPU plan's schedule and arena layout in
//! one device buffer, a kernel launch (or a few) per step.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaFunction, CudaGraph, CudaSlice, LaunchConfig, PushKernelArg};
use rlx_ir::{Bindings, CacheSlot, DType, Dim, Graph, KvSource, Mask, NodeId, Op};

use super::kv::CudaKvCache;
use super::{type_code, CudaDevice, CudaError, CudaWeights};
use crate::cpu::kernels::rope::inv_freqs;
use crate::plan::{
    bind, narrow_from, node_err, prepare, schedule, CompileOptions, HostTensor, Loc, RunError,
};
use crate::weights::WeightStore;

/// A compiled graph for one GPU.
pub struct CudaPlan {
    graph_ir: Graph,
    weights: Arc<CudaWeights>,
    device: Arc<CudaDevice>,
    steps: Vec<NodeId>,
    locs: Vec<Loc>,
    arena: CudaSlice<f32>,
    /// The normalised input of a norm-folded matmul.
    norm_buf: CudaSlice<f32>,
    /// Per rope step: its inverse-frequency table.
    rope_tables: HashMap<NodeId, CudaSlice<f32>>,
    /// Device copies of the graph's inputs, sized for the maxima.
    inputs: HashMap<NodeId, InputBuf>,
    /// The cache length at the start of a run, read by the kernels that
    /// need it (so that a captured graph replays at any length).
    start: CudaSlice<i32>,
    /// The cache writes of a run at the maxima, in order: what a replayed
    /// graph writes, for the host's row positions.
    kv_writes: Vec<(CacheSlot, usize)>,
    /// Gathers whose token ids are graph inputs (checked on the host).
    gathers: Vec<NodeId>,
    /// A run at the maxima (every decode step, every full prefill chunk)
    /// captured once as a CUDA graph with the cache it used, then replayed:
    /// one launch instead of hundreds.
    graph: Option<(u64, CudaGraph)>,
    max: Bindings,
}

enum InputBuf {
    F32(CudaSlice<f32>),
    I32(CudaSlice<i32>),
}

/// The weight type code and device address of a weight node.
fn weight_of(g: &Graph, weights: &CudaWeights, id: NodeId) -> Result<(u32, u64), CudaError> {
    let n = g.node(id);
    let (Op::Weight { id: w, name }, DType::Ggml(ty)) = (&n.op, n.dtype) else {
        return Err(node_err(g, id, "expected a weight").into());
    };
    let code = type_code(ty);
    match (code, weights.ptr(*w)) {
        (Some(c), Some(p)) => Ok((c, p)),
        _ => Err(CudaError::Unsupported(format!(
            "weight {name:?} is {ty}, which the CUDA kernels do not read yet"
        ))),
    }
}

/// Compiles `graph` for the GPU of `weights`, which holds `store`'s weights.
pub fn compile_cuda(
    graph: &Graph,
    store: &Arc<WeightStore>,
    weights: &Arc<CudaWeights>,
    opts: &CompileOptions,
) -> Result<CudaPlan, CudaError> {
    let g = prepare(graph, store, opts)?;
    // A narrow of a value whose shape is fixed (every symbol at most 1, as in
    // decode) with nothing before its axis is a contiguous range: read in
    // place rather than copied (the q/k/v and gate/up splits of a step).
    let view = |id: NodeId| -> Option<(NodeId, usize)> {
        let n = g.node(id);
        let Op::Narrow { axis, start, len } = n.op else {
            return None;
        };
        let src = g.node(n.inputs[0]);
        let fixed = src.shape.dims().iter().all(|d| match *d {
            Dim::Fixed(_) => true,
            Dim::Sym(s) => opts.max.get(s) == Some(1),
        });
        let dims = src.shape.resolve(&opts.max)?;
        if !fixed || dims[..axis].iter().product::<usize>() != 1 {
            return None;
        }
        let from = narrow_from(start, dims[axis], len).ok()?;
        let inner: usize = dims[axis + 1..].iter().product();
        Some((n.inputs[0], from * inner))
    };
    let sched = schedule(&g, &opts.max, &view)?;
    let device = Arc::clone(weights.device());
    let s = &device.stream;
    let mut rope_tables = HashMap::new();
    let mut norm_elems = 0usize;
    let mut inputs = HashMap::new();
    for id in g.ids() {
        let n = g.node(id);
        let unsupported = |what: &str| -> CudaError {
            CudaError::Unsupported(format!(
                "node {id} ({}): {what} is not in the CUDA backend yet",
                n.op.name()
            ))
        };
        match &n.op {
            Op::Input { .. } => {
                let elems = n.shape.numel(&opts.max).unwrap_or(0).max(1);
                let buf = match n.dtype {
                    DType::I32 => InputBuf::I32(s.alloc_zeros(elems)?),
                    _ => InputBuf::F32(s.alloc_zeros(elems)?),
                };
                inputs.insert(id, buf);
            }
            Op::Gather => {
                weight_of(&g, weights, n.inputs[0])?;
            }
            Op::MatMul { norm } => {
                let first = if norm.is_some_and(|s| s.has_gamma) {
                    2
                } else {
                    1
                };
                for &w in &n.inputs[first..] {
                    weight_of(&g, weights, w)?;
                }
                if norm.is_some() {
                    norm_elems =
                        norm_elems.max(g.node(n.inputs[0]).shape.numel(&opts.max).unwrap_or(0));
                }
            }
            Op::Rope(spec) => {
                let factors = if spec.has_freq_factors {
                    let Op::Weight { id: w, .. } = g.node(n.inputs[2]).op else {
                        return Err(unsupported("computed frequency factors"));
                    };
                    let info = store.info(w);
                    Some(
                        rlx_gguf::dequantize_to_vec(info.ty, store.bytes(w))
                            .map_err(|e| CudaError::Unsupported(e.to_string()))?,
                    )
                } else {
                    None
                };
                rope_tables.insert(id, s.clone_htod(&inv_freqs(spec, factors.as_deref()))?);
            }
            Op::Attention(spec) => {
                if spec.kv == KvSource::Inputs {
                    return Err(unsupported("attention over K/V inputs"));
                }
                if spec.bidirectional_spans {
                    return Err(unsupported("bidirectional spans"));
                }
            }
            Op::KvWrite { .. } if n.inputs.len() > 2 => return Err(unsupported("span ids")),
            Op::BatchMatMul | Op::MatchRms { .. } | Op::GaussianTopK { .. } | Op::Moe { .. } => {
                return Err(unsupported("this op"))
            }
            _ => {}
        }
    }
    let kv_writes = sched
        .steps
        .iter()
        .filter_map(|&id| {
            let n = g.node(id);
            let Op::KvWrite { slot } = n.op else {
                return None;
            };
            Some((slot, g.node(n.inputs[0]).shape.resolve(&opts.max)?[0]))
        })
        .collect();
    let gathers = sched
        .steps
        .iter()
        .copied()
        .filter(|&id| {
            let n = g.node(id);
            matches!(n.op, Op::Gather) && matches!(g.node(n.inputs[1]).op, Op::Input { .. })
        })
        .collect();
    let start = s.alloc_zeros(1)?;
    Ok(CudaPlan {
        kv_writes,
        gathers,
        arena: s.alloc_zeros(sched.arena_elems.max(1))?,
        norm_buf: s.alloc_zeros(norm_elems.max(1))?,
        graph_ir: g,
        weights: Arc::clone(weights),
        device,
        steps: sched.steps,
        locs: sched.locs,
        rope_tables,
        inputs,
        start,
        graph: None,
        max: opts.max.clone(),
    })
}

/// 1-D launch over `n` elements.
fn linear(n: usize) -> LaunchConfig {
    LaunchConfig::for_num_elems(n.max(1) as u32)
}

fn grid(x: usize, y: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (x.max(1) as u32, y.max(1) as u32, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Kernel arguments, all plain values (device addresses as u64).
enum Arg {
    Ptr(u64),
    I32(i32),
    I64(i64),
    F32(f32),
}

impl CudaPlan {
    pub fn graph(&self) -> &Graph {
        &self.graph_ir
    }

    /// Device memory this plan owns (weights are the [`CudaWeights`]').
    pub fn arena_bytes(&self) -> usize {
        (self.arena.len() + self.norm_buf.len()) * 4
    }

    fn launch(&self, f: &CudaFunction, cfg: LaunchConfig, args: &[Arg]) -> Result<(), CudaError> {
        let mut b = self.device.stream.launch_builder(f);
        for a in args {
            match a {
                Arg::Ptr(p) => b.arg(p),
                Arg::I32(v) => b.arg(v),
                Arg::I64(v) => b.arg(v),
                Arg::F32(v) => b.arg(v),
            };
        }
        // SAFETY: every caller passes the argument list its kernel declares,
        // with addresses of buffers sized (by the schedule, for the maxima
        // that `bind` checked) for the elements the launch covers.
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    /// Device address of a value (f32 or i32).
    fn addr(&self, id: NodeId) -> u64 {
        match self.locs[id.index()] {
            Loc::Arena { offset, .. } => self.device.ptr(&self.arena) + 4 * offset as u64,
            Loc::Alias { src, offset } => self.addr(src) + 4 * offset as u64,
            Loc::Input => match &self.inputs[&id] {
                InputBuf::F32(s) => self.device.ptr(s),
                InputBuf::I32(s) => self.device.ptr(s),
            },
            Loc::Weight(w) => self.weights.ptr(w).unwrap_or(0),
            Loc::None => 0,
        }
    }

    /// Runs the plan on `inputs`; a graph that writes the KV cache appends at
    /// `kv.len()` and commits afterwards. Outputs come back to the host.
    pub fn run(
        &mut self,
        inputs: &HashMap<String, HostTensor>,
        mut kv: Option<&mut CudaKvCache>,
    ) -> Result<Vec<(String, HostTensor)>, CudaError> {
        let b = bind(&self.graph_ir, &self.max, inputs)?;
        let stream = Arc::clone(&self.device.stream);
        for (&id, buf) in self.inputs.iter_mut() {
            let Op::Input { name } = &self.graph_ir.node(id).op else {
                unreachable!()
            };
            match (&inputs[name], buf) {
                (HostTensor::F32 { data, .. }, InputBuf::F32(d)) if !data.is_empty() => {
                    stream.memcpy_htod(data, &mut d.slice_mut(..data.len()))?
                }
                (HostTensor::I32 { data, .. }, InputBuf::I32(d)) if !data.is_empty() => {
                    stream.memcpy_htod(data, &mut d.slice_mut(..data.len()))?
                }
                _ => {}
            }
        }
        self.check_tokens(&b, inputs)?;
        let start = kv.as_ref().map_or(0, |c| c.len());
        stream.memcpy_htod(&[start as i32], &mut self.start)?;
        let cache_id = kv.as_ref().map(|c| c.id());
        let at_max = b == self.max;
        let replay = matches!((&self.graph, cache_id), (Some((id, _)), Some(c)) if *id == c);
        let mut wrote = None;
        if at_max && replay {
            // The graph makes the cache writes; the host keeps their positions.
            for &(slot, tokens) in &self.kv_writes {
                kv.as_deref_mut()
                    .ok_or(RunError::NoCache)?
                    .record(slot, tokens)?;
                wrote = Some(tokens);
            }
            self.graph.as_ref().expect("checked").1.launch()?;
        } else if let (true, Some(c)) = (at_max, cache_id) {
            stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
            let mut result = Ok(None);
            for i in 0..self.steps.len() {
                match self.exec(self.steps[i], &b, kv.as_deref_mut()) {
                    Ok(Some(n)) => result = Ok(Some(n)),
                    Ok(None) => {}
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            }
            // End the capture even after an error, so the stream is usable.
            let graph = stream.end_capture(CUgraphInstantiate_flags(0))?;
            wrote = result?;
            let graph = graph
                .ok_or_else(|| CudaError::Unsupported("graph capture made no graph".into()))?;
            graph.launch()?;
            self.graph = Some((c, graph));
        } else {
            for i in 0..self.steps.len() {
                if let Some(n) = self.exec(self.steps[i], &b, kv.as_deref_mut())? {
                    wrote = Some(n);
                }
            }
        }
        if let (Some(n), Some(c)) = (wrote, kv) {
            c.commit(n);
        }
        let mut outs = Vec::new();
        for (name, id) in self.graph_ir.outputs() {
            let dims = self.graph_ir.node(*id).shape.resolve(&b).expect("bound");
            let len: usize = dims.iter().product();
            let (mut root, mut skip) = (*id, 0);
            while let Loc::Alias { src, offset } = self.locs[root.index()] {
                root = src;
                skip += offset;
            }
            let Loc::Arena { offset, .. } = self.locs[root.index()] else {
                return Err(
                    node_err(&self.graph_ir, *id, "outputs must be computed values").into(),
                );
            };
            let offset = offset + skip;
            let data = stream.clone_dtoh(&self.arena.slice(offset..offset + len))?;
            outs.push((name.clone(), HostTensor::f32(data, &dims)));
        }
        Ok(outs)
    }

    /// Token ids come from the host: checked there, before any launch.
    fn check_tokens(
        &self,
        b: &Bindings,
        inputs: &HashMap<String, HostTensor>,
    ) -> Result<(), CudaError> {
        let g = &self.graph_ir;
        for &id in &self.gathers {
            let n = g.node(id);
            let vocab = g.node(n.inputs[0]).shape.resolve(b).expect("bound")[0];
            if let Op::Input { name } = &g.node(n.inputs[1]).op {
                if let HostTensor::I32 { data, .. } = &inputs[name] {
                    if let Some(&t) = data.iter().find(|&&t| t < 0 || t as usize >= vocab) {
                        return Err(node_err(
                            g,
                            id,
                            format!("token id {t} is outside the vocabulary of {vocab}"),
                        )
                        .into());
                    }
                }
            }
        }
        Ok(())
    }

    /// Launches one step; returns the token count if it wrote the KV cache.
    fn exec(
        &self,
        id: NodeId,
        b: &Bindings,
        kv: Option<&mut CudaKvCache>,
    ) -> Result<Option<usize>, CudaError> {
        let g = &self.graph_ir;
        let n = g.node(id);
        if matches!(self.locs[id.index()], Loc::Alias { .. }) {
            // Reshapes and in-place narrows: nothing to compute.
            return Ok(None);
        }
        let k = &self.device.kernels;
        let dims = n.shape.resolve(b).expect("bound");
        let numel: usize = dims.iter().product();
        let out = self.addr(id);
        let inp = |i: usize| self.addr(n.inputs[i]);
        let in_dims = |i: usize| g.node(n.inputs[i]).shape.resolve(b).expect("bound");
        match &n.op {
            Op::KvWrite { slot } => {
                let cache = kv.ok_or(RunError::NoCache)?;
                let tokens = in_dims(0)[0];
                cache.write(*slot, inp(0), inp(1), tokens, self.device.ptr(&self.start))?;
                return Ok(Some(tokens));
            }
            Op::Input { .. } | Op::Weight { .. } | Op::Reshape { .. } => {}
            Op::Gather => {
                let (code, table) = weight_of(g, &self.weights, n.inputs[0])?;
                let width = in_dims(0)[1];
                let rows = dims[0];
                self.launch(
                    &k.gather[code as usize],
                    linear(rows * width / 32),
                    &[
                        Arg::Ptr(table),
                        Arg::Ptr(inp(1)),
                        Arg::Ptr(out),
                        Arg::I32(rows as i32),
                        Arg::I32(width as i32),
                    ],
                )?;
            }
            Op::MatMul { norm } => {
                let kin = *in_dims(0).last().expect("rank");
                let m = in_dims(0).iter().product::<usize>() / kin;
                let mut x = inp(0);
                let mut first = 1;
                if let Some(spec) = norm {
                    let gamma = if spec.has_gamma {
                        first = 2;
                        inp(1)
                    } else {
                        0
                    };
                    let normed = self.device.ptr(&self.norm_buf);
                    self.launch(
                        &k.rms_norm,
                        grid(m, 1, 256),
                        &[
                            Arg::Ptr(x),
                            Arg::Ptr(gamma),
                            Arg::Ptr(normed),
                            Arg::I32(kin as i32),
                            Arg::F32(spec.eps),
                        ],
                    )?;
                    x = normed;
                }
                let total = *dims.last().expect("rank");
                let mut off = 0;
                for &w in &n.inputs[first..] {
                    let (code, ptr) = weight_of(g, &self.weights, w)?;
                    let rows = g.node(w).shape.0[0].fixed().expect("fixed");
                    let DType::Ggml(ty) = g.node(w).dtype else {
                        unreachable!("a weight")
                    };
                    // One token: rows staged in shared memory, as many warps a
                    // block as fit in 48 KiB (rows too long for one use the
                    // general kernel).
                    let words = (kin / ty.block_elems() * ty.block_bytes()).div_ceil(4);
                    let warps = (48 * 1024 / (4 * words)).min(4);
                    if m == 1 && warps > 0 {
                        self.launch(
                            &k.matvec[code as usize],
                            LaunchConfig {
                                grid_dim: (rows.div_ceil(warps) as u32, 1, 1),
                                block_dim: (32 * warps as u32, 1, 1),
                                shared_mem_bytes: (4 * words * warps) as u32,
                            },
                            &[
                                Arg::Ptr(ptr),
                                Arg::Ptr(x),
                                Arg::Ptr(out),
                                Arg::I32(rows as i32),
                                Arg::I32(kin as i32),
                                Arg::I32(off as i32),
                            ],
                        )?;
                        off += rows;
                        continue;
                    }
                    self.launch(
                        &k.matmul[code as usize],
                        grid(rows.div_ceil(4), m.div_ceil(8), 128),
                        &[
                            Arg::Ptr(ptr),
                            Arg::Ptr(x),
                            Arg::Ptr(out),
                            Arg::I32(m as i32),
                            Arg::I32(rows as i32),
                            Arg::I32(kin as i32),
                            Arg::I32(total as i32),
                            Arg::I32(off as i32),
                        ],
                    )?;
                    off += rows;
                }
            }
            Op::Add | Op::Mul => {
                // Output and `a` as [d0, d1, d2, d3]; `b` aligned from the end.
                let bd = in_dims(1);
                if dims.len() > 4 || bd.len() > dims.len() {
                    return Err(node_err(g, id, "broadcast of more than 4 dimensions").into());
                }
                let mut od = [1usize; 4];
                od[4 - dims.len()..].copy_from_slice(&dims);
                let mut bdims = [1usize; 4];
                bdims[4 - bd.len()..].copy_from_slice(&bd);
                let mut strides = [0i64; 4];
                let mut acc = 1i64;
                for a in (0..4).rev() {
                    strides[a] = if bdims[a] == 1 { 0 } else { acc };
                    acc *= bdims[a] as i64;
                }
                let op = if matches!(n.op, Op::Add) { 0 } else { 1 };
                self.launch(
                    &k.binary,
                    linear(numel),
                    &[
                        Arg::Ptr(inp(0)),
                        Arg::Ptr(inp(1)),
                        Arg::Ptr(out),
                        Arg::I64(numel as i64),
                        Arg::I32(od[1] as i32),
                        Arg::I32(od[2] as i32),
                        Arg::I32(od[3] as i32),
                        Arg::I64(strides[0]),
                        Arg::I64(strides[1]),
                        Arg::I64(strides[2]),
                        Arg::I64(strides[3]),
                        Arg::I32(op),
                    ],
                )?;
            }
            Op::Scale { .. } | Op::AddConst { .. } | Op::Gelu | Op::Softcap { .. } => {
                let (op, c) = match n.op {
                    Op::Scale { factor } => (0, factor),
                    Op::AddConst { value } => (1, value),
                    Op::Gelu => (2, 0.0),
                    Op::Softcap { cap } => (3, cap),
                    _ => unreachable!(),
                };
                self.launch(
                    &k.unary,
                    linear(numel),
                    &[
                        Arg::Ptr(inp(0)),
                        Arg::Ptr(out),
                        Arg::I64(numel as i64),
                        Arg::I32(op),
                        Arg::F32(c),
                    ],
                )?;
            }
            Op::GeGlu => self.launch(
                &k.geglu,
                linear(numel),
                &[
                    Arg::Ptr(inp(0)),
                    Arg::Ptr(inp(1)),
                    Arg::Ptr(out),
                    Arg::I64(numel as i64),
                ],
            )?,
            Op::RmsNorm(spec) => {
                let d = *dims.last().expect("rank");
                let gamma = if spec.has_gamma { inp(1) } else { 0 };
                self.launch(
                    &k.rms_norm,
                    grid(numel / d, 1, 256),
                    &[
                        Arg::Ptr(inp(0)),
                        Arg::Ptr(gamma),
                        Arg::Ptr(out),
                        Arg::I32(d as i32),
                        Arg::F32(spec.eps),
                    ],
                )?;
            }
            Op::Rope(spec) => {
                let table = self.device.ptr(&self.rope_tables[&id]);
                self.launch(
                    &k.rope,
                    linear(numel),
                    &[
                        Arg::Ptr(inp(0)),
                        Arg::Ptr(inp(1)),
                        Arg::Ptr(table),
                        Arg::Ptr(out),
                        Arg::I32(dims[0] as i32),
                        Arg::I32(dims[1] as i32),
                        Arg::I32(dims[2] as i32),
                        Arg::I32(spec.n_rot as i32),
                    ],
                )?;
            }
            Op::Attention(spec) => {
                let KvSource::Cache(slot) = spec.kv else {
                    unreachable!("rejected at compile")
                };
                let cache = kv.ok_or(RunError::NoCache)?;
                let l = cache.layer(slot)?;
                let qd = in_dims(0);
                let (nq, hq) = (qd[0], qd[1]);
                if l.head_dim > 512 || l.v_head_dim > 512 || hq % l.kv_heads != 0 {
                    return Err(node_err(g, id, "head size above 512 or heads not grouped").into());
                }
                let (mask, window) = match spec.mask {
                    Mask::Causal => (0, 0),
                    Mask::Sliding { window } => (1, window),
                    Mask::Full => (2, 0),
                    Mask::Symmetric { half_width } => (3, half_width),
                };
                self.launch(
                    &k.attention,
                    grid(nq * hq, 1, 128),
                    &[
                        Arg::Ptr(inp(0)),
                        Arg::Ptr(l.k),
                        Arg::Ptr(l.v),
                        Arg::Ptr(l.pos),
                        Arg::Ptr(self.device.ptr(&self.start)),
                        Arg::Ptr(out),
                        Arg::I32(hq as i32),
                        Arg::I32(l.kv_heads as i32),
                        Arg::I32(l.head_dim as i32),
                        Arg::I32(l.v_head_dim as i32),
                        Arg::I32(l.rows as i32),
                        Arg::F32(spec.scale),
                        Arg::F32(spec.softcap.unwrap_or(0.0)),
                        Arg::I32(mask),
                        Arg::I32(window as i32),
                    ],
                )?;
            }
            Op::Narrow {
                axis,
                start: s,
                len,
            } => {
                let xd = in_dims(0);
                let from = narrow_from(*s, xd[*axis], *len).map_err(|msg| node_err(g, id, msg))?;
                let outer: usize = xd[..*axis].iter().product();
                let inner: usize = xd[*axis + 1..].iter().product();
                self.launch(
                    &k.narrow,
                    linear(numel),
                    &[
                        Arg::Ptr(inp(0)),
                        Arg::Ptr(out),
                        Arg::I64(outer as i64),
                        Arg::I64(xd[*axis] as i64),
                        Arg::I64(from as i64),
                        Arg::I64(*len as i64),
                        Arg::I64(inner as i64),
                    ],
                )?;
            }
            Op::Concat { axis } => {
                let outer: usize = dims[..*axis].iter().product();
                let inner: usize = dims[*axis + 1..].iter().product();
                let mut off = 0;
                for i in 0..n.inputs.len() {
                    let len = in_dims(i)[*axis];
                    self.launch(
                        &k.concat_part,
                        linear(outer * len * inner),
                        &[
                            Arg::Ptr(inp(i)),
                            Arg::Ptr(out),
                            Arg::I64(outer as i64),
                            Arg::I64(len as i64),
                            Arg::I64(dims[*axis] as i64),
                            Arg::I64(off as i64),
                            Arg::I64(inner as i64),
                        ],
                    )?;
                    off += len;
                }
            }
            Op::BatchMatMul | Op::MatchRms { .. } | Op::GaussianTopK { .. } | Op::Moe { .. } => {
                unreachable!("rejected at compile")
            }
        }
        Ok(None)
    }
}
