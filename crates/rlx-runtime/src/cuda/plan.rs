//! A graph compiled for a GPU: the CPU plan's schedule and arena layout in
//! one device buffer, a kernel launch (or a few) per step, and one upload
//! per step of the step's inputs and K/V layout.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::Arc;

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaFunction, CudaGraph, CudaSlice, LaunchConfig, PinnedHostSlice};
use rlx_gguf::GgmlType;
use rlx_ir::{
    AttentionSpec, Bindings, DType, Dim, Graph, KvSource, Mask, NodeId, NormSpec, Op, WeightId,
};

use super::kv::{kv_code, CudaKvStorage, LayerPtrs};
use super::{type_code, CudaDevice, CudaError, CudaWeights, GemmType};
use crate::batch::Batch;
use crate::compile::Precision;
use crate::compile::{
    bind, bind_early, dump_steps, narrow_from, node_err, prepare, schedule, value_copies,
    CompileOptions, HostTensor, Loc, RunError, Schedule, StepInput, StepInputs, StepOutputs,
};
use crate::kv::{KvError, KvPool, StepLayout, BLOCK_TOKENS};
use crate::reduce::{RowDigest, RowReduce};
use crate::weights::WeightStore;

/// Where each part of a step's metadata lives in the plan's metadata
/// buffer, in i32 elements. With `R` the most rows a step has (`rows`) and
/// `I` the number of step inputs:
///
/// - `[i·R, (i+1)·R)`: step input `StepInput::ALL[i]` (tokens, positions,
///   logit rows, spans).
/// - `[I·R, (I+1)·R)`: `run_of_row`, the run (sequence) of each batch row.
/// - `[(I+1)·R, (I+2)·R)`: `run_end`, each run's length after the step (its
///   first position plus its rows).
/// - Per group `g`, from `(I+2)·R + g·(2R + 1)`: `write_rows` `[R]`, the
///   physical row each batch row's K/V go to, then `block_start` `[R + 1]`:
///   run `r`'s blocks are table entries `block_start[r] .. block_start[r + 1]`.
/// - From `table()`: `cap` entries of two i32 each, (physical block,
///   logical block), every group's runs one after another.
/// - With `spans`, from `spans()`: the bidirectional span id of each row of
///   each entry's block (`BLOCK_TOKENS` per entry), as the pool has them.
///
/// A step uploads the head and the entries it uses in one copy. The buffer
/// is reallocated (and a captured graph dropped) only when a pool with
/// another group count comes, or a step lists more blocks than `cap`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct MetaLayout {
    pub rows: usize,
    pub groups: usize,
    pub cap: usize,
    /// Whether entries carry their rows' span ids (a plan whose attention
    /// reads them).
    pub spans: bool,
}

impl MetaLayout {
    const INPUTS: usize = StepInput::ALL.len();

    pub(super) fn input(&self, input: StepInput) -> usize {
        input.index() * self.rows
    }

    pub(super) fn run_of_row(&self) -> usize {
        Self::INPUTS * self.rows
    }

    pub(super) fn run_end(&self) -> usize {
        (Self::INPUTS + 1) * self.rows
    }

    pub(super) fn write_rows(&self, g: usize) -> usize {
        (Self::INPUTS + 2) * self.rows + g * (2 * self.rows + 1)
    }

    pub(super) fn block_start(&self, g: usize) -> usize {
        self.write_rows(g) + self.rows
    }

    pub(super) fn table(&self) -> usize {
        self.write_rows(self.groups)
    }

    pub(super) fn spans(&self) -> usize {
        self.table() + 2 * self.cap
    }

    pub(super) fn len(&self) -> usize {
        self.spans()
            + if self.spans {
                BLOCK_TOKENS * self.cap
            } else {
                0
            }
    }

    /// The layout a step of `layout` needs where this one does not fit it:
    /// room for another group count (at first `blocks()`, every block of
    /// the pool once, which is what distinct sequences can list), or for
    /// more table entries (at least twice as many).
    pub(super) fn refit(
        &self,
        layout: &StepLayout,
        blocks: impl FnOnce() -> usize,
    ) -> Option<MetaLayout> {
        let groups = layout.blocks.len();
        let needed: usize = layout.blocks.iter().flatten().map(Vec::len).sum();
        let cap = if groups != self.groups {
            needed.max(blocks())
        } else if needed > self.cap {
            needed.max(2 * self.cap)
        } else {
            return None;
        };
        Some(MetaLayout {
            groups,
            cap,
            ..*self
        })
    }

    /// Writes a step's inputs and layout into `stage`: the head, then the
    /// table entries it uses, then (with `spans`) their rows' span ids from
    /// `pool`. `layout` must fit (see [`MetaLayout::refit`]).
    pub(super) fn stage(
        &self,
        inputs: &StepInputs,
        kv: Option<(&KvPool, &StepLayout)>,
        stage: &mut Vec<i32>,
    ) {
        stage.clear();
        stage.resize(self.table(), 0);
        for input in StepInput::ALL {
            // A graph input is at most its maximum (`bind`), and the batch
            // at most `rows` when the pool is used (`check_kv`); anything
            // longer is read by no kernel.
            let data = inputs.get(input);
            if data.len() <= self.rows {
                stage[self.input(input)..][..data.len()].copy_from_slice(data);
            }
        }
        let Some((pool, layout)) = kv else { return };
        assert_eq!(layout.blocks.len(), self.groups, "a layout that fits");
        for (ri, run) in layout.runs.iter().enumerate() {
            stage[self.run_end() + ri] = (run.start + run.rows.len()) as i32;
            stage[self.run_of_row() + run.rows.start..][..run.rows.len()].fill(ri as i32);
        }
        let mut entries = 0usize;
        for g in 0..self.groups {
            for (row, &phys) in layout.write_rows[g].iter().enumerate() {
                stage[self.write_rows(g) + row] = phys as i32;
            }
            for (ri, (blocks, logical)) in
                layout.blocks[g].iter().zip(&layout.logical[g]).enumerate()
            {
                stage[self.block_start(g) + ri] = entries as i32;
                for (&b, &lb) in blocks.iter().zip(logical) {
                    stage.push(b as i32);
                    stage.push(lb as i32);
                }
                entries += blocks.len();
            }
            stage[self.block_start(g) + layout.runs.len()] = entries as i32;
        }
        assert!(entries <= self.cap, "a layout that fits");
        if !self.spans {
            return;
        }
        stage.resize(self.spans(), 0);
        for g in 0..self.groups {
            let span = pool.rows(g).span;
            for blocks in &layout.blocks[g] {
                for &b in blocks {
                    let at = b as usize * BLOCK_TOKENS;
                    stage.extend_from_slice(&span[at..at + BLOCK_TOKENS]);
                }
            }
        }
    }
}

// The attention kernel's `BLOCK`.
const _: () = assert!(BLOCK_TOKENS == 32);

/// A step captured with the symbol values and the storage it ran with.
struct Captured {
    bindings: Bindings,
    /// The K/V storage its launches address (none for a plan without K/V).
    storage: Option<u64>,
    graph: CudaGraph,
}

/// Steps of at most this many rows (every decode batch up to 64
/// sequences), and steps at the plan's maxima, are captured as graphs.
const GRAPH_MAX_ROWS: usize = 64;

/// The most graphs a plan keeps: one per decode batch size up to
/// [`GRAPH_MAX_ROWS`], and a few more.
const GRAPHS_KEPT: usize = GRAPH_MAX_ROWS + 8;

/// Outputs of up to this many elements (256 MiB) come back through the
/// plan's page-locked buffer; larger ones (scoring long prompts) directly.
const PINNED_MAX_ELEMS: usize = 64 << 20;

/// Elements of weight rows dequantized at once for a cuBLAS product: a
/// layer's largest matrix at 4B (10,240 × 2,560) in two pieces, the LM head
/// in many, and 128 MiB of scratch at f32.
const GEMM_CHUNK_ELEMS: usize = 32 << 20;

/// The most activation rows the decode products (`mmv*` kernels) take; more
/// go to cuBLAS.
const MMV_ROWS: usize = 8;

/// Warps (one weight row each) per block of the decode products.
const MMV_WARPS: usize = 4;

/// The most activation rows the tensor-core products (`mmq*` kernels) take
/// in `q8` plans; between [`MMV_ROWS`] and this, each weight is read once
/// from its blocks. More go to cuBLAS on dequantized chunks.
const MMQ_ROWS: usize = 64;

/// The fewest activation rows the tensor-core products take (fewer go to
/// the decode products): measured faster at 8 rows on an H200 (4B: 1.35×);
/// below, on an H100, slower at 2 rows (10–15 %) and mixed at 4 (1B −5 %,
/// 4B +3 %).
const MMQ_MIN_ROWS: usize = 8;

/// Weight rows of one tensor-core product block (`MQ_ROWS` in kernels.cu).
const MMQ_BLOCK_ROWS: usize = 128;

/// The most shares of k one tensor-core product is cut into.
const MMQ_MAX_SHARES: usize = 16;

/// Which tensor-core kernel (index into `Kernels::mmq`) takes `m`
/// activation rows: `mmq16_`, `mmq32_` or `mmq64_`.
pub(super) fn mmq_variant(m: usize) -> usize {
    match m {
        0..=16 => 0,
        17..=32 => 1,
        _ => 2,
    }
}

/// Up to three consecutive weights of one type that one product launch
/// takes (a fused q/k/v or gate/up): their addresses (the last repeated),
/// where the second and third start among the rows, and the rows in all.
struct WeightRun {
    code: u32,
    ty: GgmlType,
    ptrs: [u64; 3],
    e0: usize,
    e1: usize,
    rows: usize,
}

impl WeightRun {
    /// Bytes of its weights, rows of `k`.
    fn bytes(&self, k: usize) -> u64 {
        (self.rows * k / self.ty.block_elems() * self.ty.block_bytes()) as u64
    }

    /// A product kernel's arguments for this run, as the decode and
    /// tensor-core products declare them: its weights, then `io` (the
    /// kernel's activation and output addresses), then `m` activation rows,
    /// its weight rows, `k`, the output's row length `ldy` and the run's
    /// first column `off`.
    fn args(&self, io: &[Arg], m: usize, k: usize, ldy: usize, off: usize) -> Vec<Arg> {
        let mut args = vec![
            Arg::Ptr(self.ptrs[0]),
            Arg::Ptr(self.ptrs[1]),
            Arg::Ptr(self.ptrs[2]),
            Arg::I32(self.e0 as i32),
            Arg::I32(self.e1 as i32),
        ];
        args.extend_from_slice(io);
        args.extend([m, self.rows, k, ldy, off].map(|v| Arg::I32(v as i32)));
        args
    }
}

/// A product's weights (`mm_weights`) as the runs its launches take, in
/// order.
fn weight_runs(weights: &[(u32, u64, usize, GgmlType)]) -> Vec<WeightRun> {
    weights
        .chunk_by(|a, b| a.0 == b.0)
        .flat_map(|run| run.chunks(3))
        .map(|seg| {
            let at = |i: usize| seg[i.min(seg.len() - 1)];
            let e0 = at(0).2;
            let e1 = if seg.len() > 1 { e0 + at(1).2 } else { e0 };
            WeightRun {
                code: seg[0].0,
                ty: seg[0].3,
                ptrs: [at(0).1, at(1).1, at(2).1],
                e0,
                e1,
                rows: seg.iter().map(|w| w.2).sum(),
            }
        })
        .collect()
}

/// How a tensor-core product of `rows` weight rows over `units` 32-element
/// units cuts k to fill a GPU of `sms` multiprocessors: `(shares, per)`,
/// `per` groups of four units a share, every share non-empty. About two
/// blocks a multiprocessor (what their registers allow), at least two
/// groups a share, at most [`MMQ_MAX_SHARES`]; a product that fills the
/// GPU alone is not cut. Fewer than `4 · sms` blocks in all either way
/// (the partial sums' buffer).
pub(super) fn mmq_shares(rows: usize, units: usize, sms: usize) -> (usize, usize) {
    let blocks = rows.div_ceil(MMQ_BLOCK_ROWS).max(1);
    let groups = units.div_ceil(4).max(1);
    let want = (2 * sms)
        .div_ceil(blocks)
        .min(groups / 2)
        .clamp(1, MMQ_MAX_SHARES);
    let per = groups.div_ceil(want);
    (groups.div_ceil(per), per)
}

/// Floats of one split's partial attention result (`ATTN_PART` in
/// kernels.cu): an output row of up to 512, its maximum and its total.
const ATTN_PART: usize = 512 + 2;

/// The most splits of one query's context.
const ATTN_MAX_SPLITS: usize = 128;

/// Blocks per multiprocessor that attention over a long context aims for.
const ATTN_BLOCKS_PER_SM: usize = 8;

/// What split attention keeps between its splits: their partial results
/// (`ATTN_PART` floats a head and split) and a count per kernel block of
/// the splits that have finished (zeros between launches: the last split
/// to finish merges and resets it).
struct AttnSplits {
    part: CudaSlice<f32>,
    done: CudaSlice<i32>,
}

/// The most query heads an attention block scores against one K/V head
/// (`ATTN_MAXG` in kernels.cu).
const ATTN_MAX_GROUP: usize = 4;

/// Into how many parts attention over the pool splits each query's listed
/// blocks, for `blocks` kernel blocks (query rows × groups of heads that
/// share K/V) and `heads` (query rows × heads) on a GPU of `sms`
/// multiprocessors: enough for about [`ATTN_BLOCKS_PER_SM`] blocks per
/// multiprocessor, so one query over a long context runs on the whole GPU
/// with enough warps to hide the latency of its key loads, while `heads ×
/// splits` stays within `(ATTN_BLOCKS_PER_SM + 2) × sms` (the partial
/// results' buffer). Fixed per step shape, so captured graphs hold.
pub(super) fn attention_splits(blocks: usize, heads: usize, sms: usize) -> usize {
    if blocks >= 2 * sms {
        1
    } else {
        (ATTN_BLOCKS_PER_SM * sms)
            .div_ceil(blocks.max(1))
            .min(ATTN_MAX_SPLITS)
            .min((ATTN_BLOCKS_PER_SM + 2) * sms / heads.max(1))
            .max(1)
    }
}

/// Floats of one attention block's query heads (`ATTN_QF` in kernels.cu):
/// the group's heads times the longer of the key and value head lengths.
const ATTN_GROUP_FLOATS: usize = 1024;

/// How many query heads one attention block takes: the most, up to
/// [`ATTN_MAX_GROUP`] and [`ATTN_GROUP_FLOATS`] elements of heads of
/// `head_dim` (the longer of keys and values), that divides the heads
/// sharing a K/V head (`group`).
pub(super) fn attention_group(group: usize, head_dim: usize) -> usize {
    let most = ATTN_MAX_GROUP
        .min(ATTN_GROUP_FLOATS / head_dim.max(1))
        .max(1);
    (1..=most.min(group.max(1)))
        .rev()
        .find(|g| group.is_multiple_of(*g))
        .unwrap_or(1)
}

/// Which `q8` decode product kernel (index into `Kernels::mmv`) reads rows
/// of `units` 32-element units for one activation row or (`many`) up to
/// eight: a row in one pass of 32 lanes with the fewest units a lane, so
/// the fewest registers and no loads past the row's end (`mmvq1u2_`,
/// `mmvq1u3_`, `mmvq1_` for four, and `mmvq8u2_` …); longer rows in passes
/// of two (measured fastest for one row of 10,240 and as fast for 6,912).
pub(super) fn mmvq_variant(units: usize, many: bool) -> usize {
    let (two, three, four) = if many { (6, 7, 3) } else { (4, 5, 2) };
    match units {
        0..=64 => two,
        65..=96 => three,
        97..=128 => four,
        _ => two,
    }
}

/// Float weights: decode products read them against f32 activations.
fn is_float(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// Bytes of the 8-bit activation blocks of `rows` rows of `k`: the codes,
/// then the f16 scales (16-byte aligned).
fn act_q_bytes(rows: usize, k: usize) -> (usize, usize) {
    let codes = (rows * k).next_multiple_of(16);
    (codes, codes + rows * k / 32 * 2)
}

/// The buffers of a plan's cuBLAS products: a chunk of weight rows
/// dequantized, and the activations as bf16 (for bf16 products).
struct GemmScratch {
    ty: GemmType,
    weights: CudaSlice<u8>,
    /// Weight elements `weights` holds.
    elems: usize,
    x16: Option<CudaSlice<u16>>,
    /// The tensor-core products' partial sums of their shares of k (bf16
    /// plans): [`MMQ_ROWS`] rows of `4 · sms` blocks of [`MMQ_BLOCK_ROWS`].
    part: Option<CudaSlice<f32>>,
}

/// The sizes a plan's mixture-of-experts steps need (the largest of each;
/// a model's MoE layers all have the same): slots are a step's tokens times
/// the experts each chooses.
#[derive(Clone, Copy, Debug)]
struct MoeSizes {
    slots: usize,
    /// The most slots one expert can get: a step's tokens.
    cap: usize,
    experts: usize,
    ff: usize,
    d: usize,
}

impl MoeSizes {
    fn max(&self, o: &MoeSizes) -> MoeSizes {
        MoeSizes {
            slots: self.slots.max(o.slots),
            cap: self.cap.max(o.cap),
            experts: self.experts.max(o.experts),
            ff: self.ff.max(o.ff),
            d: self.d.max(o.d),
        }
    }

    // Offsets in 4-byte elements: per slot its expert (i32) and weight; per
    // expert its slot count and list (i32); the slots' gate/up rows
    // [slots, 2·ff], activations [slots, ff] and down rows [slots, d].
    fn sel(&self) -> usize {
        0
    }
    fn wts(&self) -> usize {
        self.slots
    }
    fn count(&self) -> usize {
        2 * self.slots
    }
    fn list(&self) -> usize {
        self.count() + self.experts
    }
    fn gate_up(&self) -> usize {
        self.list() + self.experts * self.cap
    }
    fn act(&self) -> usize {
        self.gate_up() + 2 * self.slots * self.ff
    }
    fn down(&self) -> usize {
        self.act() + self.slots * self.ff
    }
    fn elems(&self) -> usize {
        self.down() + self.slots * self.d
    }
}

struct MoeScratch {
    buf: CudaSlice<f32>,
    sizes: MoeSizes,
}

// SAFETY: a CUDA graph may be launched and destroyed from any thread as
// long as no two threads use it at once; it lives in a plan and is only
// touched through `&mut CudaPlan`.
unsafe impl Send for Captured {}

/// A compiled graph for one GPU.
pub struct CudaPlan {
    graph_ir: Graph,
    weights: Arc<CudaWeights>,
    device: Arc<CudaDevice>,
    steps: Vec<NodeId>,
    /// The f32 inputs (values of another plan of the step).
    values: Vec<NodeId>,
    locs: Vec<Loc>,
    arena: CudaSlice<f32>,
    /// The normalised input of a norm-folded matmul.
    norm_buf: CudaSlice<f32>,
    /// Per rope step: its inverse-frequency table.
    rope_tables: HashMap<NodeId, CudaSlice<f32>>,
    /// The step's inputs and K/V layout (see [`MetaLayout`]); the graph's
    /// inputs are read from it in place.
    meta: CudaSlice<i32>,
    meta_layout: MetaLayout,
    /// Host staging of `meta`, reused across steps.
    stage: Vec<i32>,
    /// Gathers whose token ids and row takes whose row indices are graph
    /// inputs (checked on the host).
    gathers: Vec<NodeId>,
    takes: Vec<NodeId>,
    /// Steps that write or read the K/V pool.
    kv_steps: Vec<NodeId>,
    /// Runs captured as CUDA graphs, per symbol values and storage (decode
    /// batches of up to [`GRAPH_MAX_ROWS`] rows, full prefill chunks), then
    /// replayed: one launch instead of hundreds. Everything that changes
    /// between steps of one shape is in `meta`, read by the kernels on the
    /// device; launch sizes depend only on the symbol values.
    captured: Vec<Captured>,
    /// Products of more than one row through cuBLAS, where it is loaded.
    gemm: Option<GemmScratch>,
    /// `q8` plans: the activations of a product of up to [`MMV_ROWS`] rows
    /// as 8-bit blocks (codes, then f16 scales); `exact` plans have none.
    act_q: Option<CudaSlice<u8>>,
    /// Partial results of attention split over the context (see
    /// [`attention_splits`]), for plans that attend over the pool.
    attn_splits: Option<AttnSplits>,
    /// Per product: the kernel before it that may write its 8-bit input
    /// blocks (see [`Prologue`]); and each node that then folds into one,
    /// with its product.
    prologues: HashMap<NodeId, Prologue>,
    folded: HashMap<NodeId, NodeId>,
    /// Per-head norms that run with the rope after them in one launch
    /// (see [`find_norm_ropes`]): norm → rope, and the ropes so covered.
    norm_ropes: HashMap<NodeId, NodeId>,
    roped: HashSet<NodeId>,
    /// Layers whose attention inputs are made ready in one launch (see
    /// [`find_head_preps`]), by the step that launches it, and every step
    /// so covered.
    head_preps: HashMap<NodeId, HeadPrep>,
    prepped: HashSet<NodeId>,
    /// Narrows read in place rows apart (see [`lay_out`]): the row stride
    /// of the value each reads.
    strided: HashMap<NodeId, usize>,
    /// The mixture-of-experts steps' scratch, if the graph has any.
    moe: Option<MoeScratch>,
    /// Page-locked host memory that outputs are copied into (a copy into
    /// pageable memory goes through the driver's own staging at a fraction
    /// of the speed: logits of a 64-sequence step are 64 MiB).
    host: Option<PinnedHostSlice<f32>>,
    /// Requests, slices' partial results and digests of
    /// [`reduce_rows`](CudaPlan::reduce_rows).
    reduce_in: Option<CudaSlice<u8>>,
    reduce_parts: Option<CudaSlice<u8>>,
    reduce_out: Option<CudaSlice<u8>>,
    /// The output the last step reduced, left in the arena.
    kept: Option<Kept>,
    max: Bindings,
}

/// Where a reduced output lies until the next step.
struct Kept {
    name: String,
    offset: usize,
    rows: usize,
    vocab: usize,
}

/// Threads of a `reduce_part`, `reduce_draw` or `reduce_merge` block (`RD_THREADS`).
const REDUCE_THREADS: u32 = 256;

/// The weight type code and device address of a weight node, or of the
/// weight a reshape views (a stack of matrices read as one).
fn weight_of(g: &Graph, weights: &CudaWeights, id: NodeId) -> Result<(u32, u64), CudaError> {
    let mut n = g.node(id);
    while let Op::Reshape { .. } = n.op {
        n = g.node(n.inputs[0]);
    }
    let (Op::Weight { id: w, name }, DType::Ggml(ty)) = (&n.op, n.dtype) else {
        return Err(node_err(g, id, "expected a weight").into());
    };
    let code = type_code(ty).ok_or_else(|| {
        CudaError::Unsupported(format!(
            "weight {name:?} is {ty}, which the CUDA kernels do not read yet"
        ))
    })?;
    Ok((code, uploaded(weights, *w, name)?))
}

/// The address of a weight on the GPU, or an error naming it where this
/// GPU does not hold it (a split keeps it on another device).
fn uploaded(weights: &CudaWeights, w: WeightId, name: &str) -> Result<u64, CudaError> {
    weights.ptr(w).ok_or_else(|| {
        CudaError::Unsupported(format!(
            "weight {name:?} is not in the memory of {}",
            weights.device().label()
        ))
    })
}

/// A kernel that, where the product after it takes the 8-bit decode path
/// (up to [`MMV_ROWS`] rows, only block-type weights), writes the
/// product's input blocks itself: one launch instead of two or four, with
/// the same values bit for bit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Prologue {
    /// `GeGlu` whose only user is the product (the f32 result is not kept).
    GeGlu,
    /// `Add` (its sum written, as the residual stream goes on) whose sum is
    /// the input of a product with a folded norm; with `norm`, one operand
    /// of the add is an `RmsNorm` used only by it, run inside it.
    AddNorm { norm: Option<NodeId> },
    /// `Attention` whose output (reshaped to rows) only the product reads,
    /// heads of whole 32-element units: the attention (or the split that
    /// merges) writes the blocks.
    Attention,
}

/// Where a value lives in the arena: the element its data starts at, and
/// the end of the buffer it lies in (a view reads into its source's).
fn arena_span(locs: &[Loc], mut id: NodeId) -> Option<(usize, usize)> {
    let mut skip = 0;
    loop {
        match locs[id.index()] {
            Loc::Alias { src, offset } => {
                id = src;
                skip += offset;
            }
            Loc::Arena { offset, cap } => return Some((offset + skip, offset + cap)),
            _ => return None,
        }
    }
}

/// Whether a kernel may write `out` while it reads `input` (both in the
/// arena): they do not overlap, or, `in_place`, they start at the same
/// element (each block reads its own head before writing it).
fn may_write(locs: &[Loc], out: NodeId, input: NodeId, in_place: bool) -> bool {
    match (arena_span(locs, input), arena_span(locs, out)) {
        (Some((a0, a1)), Some((b0, b1))) => a1 <= b0 || b1 <= a0 || (in_place && a0 == b0),
        _ => false,
    }
}

/// What the fusion passes ask of a schedule: each node's users, the graph's
/// outputs, and the steps that launch kernels (views aside), in order.
struct StepUses {
    users: Vec<Vec<NodeId>>,
    outputs: HashSet<NodeId>,
    order: Vec<NodeId>,
}

/// Each node's users, by node index.
fn users_of(g: &Graph) -> Vec<Vec<NodeId>> {
    let mut users = vec![Vec::new(); g.len()];
    for id in g.ids() {
        for &i in &g.node(id).inputs {
            users[i.index()].push(id);
        }
    }
    users
}

/// The nodes the graph gives out.
fn outputs_of(g: &Graph) -> HashSet<NodeId> {
    g.outputs().iter().map(|(_, id)| *id).collect()
}

impl StepUses {
    fn new(g: &Graph, steps: &[NodeId], locs: &[Loc]) -> StepUses {
        StepUses {
            users: users_of(g),
            outputs: outputs_of(g),
            order: steps
                .iter()
                .copied()
                .filter(|id| !matches!(locs[id.index()], Loc::Alias { .. }))
                .collect(),
        }
    }

    /// `id` runs right before `next`.
    fn before(&self, id: NodeId, next: NodeId) -> bool {
        self.order.windows(2).any(|w| w[0] == id && w[1] == next)
    }

    /// `user` is all that reads `id`, and the caller does not.
    fn only_user(&self, id: NodeId, user: NodeId) -> bool {
        self.users[id.index()] == [user] && !self.outputs.contains(&id)
    }
}

/// The products whose input blocks a [`Prologue`] writes, and the nodes
/// folded into each. A producer must come right before its product in
/// `steps` (views aside), so that nothing reuses the 8-bit scratch or the
/// memory of a value the folded kernel still reads in between.
pub(super) fn find_prologues(
    g: &Graph,
    steps: &[NodeId],
    locs: &[Loc],
) -> (HashMap<NodeId, Prologue>, HashMap<NodeId, NodeId>) {
    let uses = StepUses::new(g, steps, locs);
    let before = |id, next| uses.before(id, next);
    let only_user = |id, user| uses.only_user(id, user);
    let (mut prologues, mut folded) = (HashMap::new(), HashMap::new());
    for &mm in &uses.order {
        let Op::MatMul { norm } = &g.node(mm).op else {
            continue;
        };
        let p = g.node(mm).inputs[0];
        match (&g.node(p).op, norm) {
            (Op::GeGlu, None) if only_user(p, mm) && before(p, mm) => {
                prologues.insert(mm, Prologue::GeGlu);
                folded.insert(p, mm);
            }
            (Op::Reshape { .. }, None) if only_user(p, mm) => {
                let a = g.node(p).inputs[0];
                let whole = g.node(a).shape.dims().last().and_then(|d| d.fixed());
                if matches!(g.node(a).op, Op::Attention(_))
                    && whole.is_some_and(|d| d.is_multiple_of(32))
                    && only_user(a, p)
                    && before(a, mm)
                {
                    prologues.insert(mm, Prologue::Attention);
                    folded.insert(a, mm);
                }
            }
            (Op::Add, Some(_)) if before(p, mm) => {
                let add = g.node(p);
                let same = add.inputs.iter().all(|&i| g.node(i).shape == add.shape);
                if !same {
                    continue;
                }
                let norm = add.inputs.iter().copied().find(|&r| {
                    matches!(g.node(r).op, Op::RmsNorm(_)) && only_user(r, p) && before(r, p)
                });
                prologues.insert(mm, Prologue::AddNorm { norm });
                folded.insert(p, mm);
                if let Some(r) = norm {
                    folded.insert(r, mm);
                }
            }
            _ => {}
        }
    }
    (prologues, folded)
}

/// Heads longer than this are not normed and rotated in one launch (the
/// fused kernel keeps a head in shared memory).
const NORM_ROPE_MAX_HEAD: usize = 512;

/// Per-head `RmsNorm`s (q and k norms) whose only user is a `Rope` right
/// after them in `steps`, which one kernel runs together (`rms_norm_rope`),
/// writing the rope's output: norm → rope. The norm's output is never
/// written. Only where that is safe for memory: the rope's output either
/// does not overlap the norm's input or starts where it does (a kernel
/// block reads its head before writing it, and touches no other).
pub(super) fn find_norm_ropes(
    g: &Graph,
    steps: &[NodeId],
    locs: &[Loc],
    max: &Bindings,
) -> HashMap<NodeId, NodeId> {
    let uses = StepUses::new(g, steps, locs);
    let mut found = HashMap::new();
    for w in uses.order.windows(2) {
        let (norm, rope) = (w[0], w[1]);
        let (Op::RmsNorm(_), Op::Rope(_)) = (&g.node(norm).op, &g.node(rope).op) else {
            continue;
        };
        let Some(dims) = g.node(rope).shape.resolve(max) else {
            continue;
        };
        let fits = g.node(rope).inputs[0] == norm
            && uses.only_user(norm, rope)
            && dims.len() == 3
            && dims[2] <= NORM_ROPE_MAX_HEAD;
        let x = g.node(norm).inputs[0];
        if fits && may_write(locs, rope, x, true) {
            found.insert(norm, rope);
        }
    }
    found
}

/// A layer's attention inputs made ready in one launch (`head_prep`): the q
/// heads normed (where `q_norm`) and rotated, the k heads normed and
/// rotated, the v heads normed (where `v_norm`), and the K/V write. Only the
/// q rope's output is written to the arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct HeadPrep {
    pub q_norm: Option<NodeId>,
    pub q_rope: NodeId,
    pub k_norm: Option<NodeId>,
    pub k_rope: NodeId,
    pub v_norm: Option<NodeId>,
    pub write: NodeId,
}

impl HeadPrep {
    fn steps(&self) -> impl Iterator<Item = NodeId> {
        [
            self.q_norm,
            Some(self.q_rope),
            self.k_norm,
            Some(self.k_rope),
            self.v_norm,
            Some(self.write),
        ]
        .into_iter()
        .flatten()
    }
}

/// The layers whose q/k norms and ropes, v norm and K/V write run as one
/// [`HeadPrep`], keyed by the first of those steps (where it launches).
/// Only where they are consecutive launches in `steps` (so that nothing in
/// between reads or reuses their memory), every folded value has its
/// step as only user, heads are whole K/V units (a multiple of 32, at most
/// 512) of one size for q, k and v, the ropes' positions are a step input
/// (the kernel reads them before waiting for the kernel before), and the q
/// output overlaps neither the k nor the v input (nor the q input, unless
/// it starts where it does: a block reads its head before writing it).
pub(super) fn find_head_preps(
    g: &Graph,
    steps: &[NodeId],
    locs: &[Loc],
    max: &Bindings,
) -> HashMap<NodeId, HeadPrep> {
    let uses = StepUses::new(g, steps, locs);
    let at: HashMap<NodeId, usize> = uses
        .order
        .iter()
        .enumerate()
        .map(|(i, &id)| (id, i))
        .collect();
    // A rope and the per-head norm before it, if the rope is all that reads it.
    let roped = |rope: NodeId| -> Option<(Option<NodeId>, NodeId)> {
        if !matches!(g.node(rope).op, Op::Rope(_)) {
            return None;
        }
        let x = g.node(rope).inputs[0];
        let norm = matches!(g.node(x).op, Op::RmsNorm(_)) && uses.only_user(x, rope);
        Some((
            norm.then_some(x),
            if norm { g.node(x).inputs[0] } else { x },
        ))
    };
    let heads = |id: NodeId| -> Option<(usize, usize)> {
        match g.node(id).shape.resolve(max)?.as_slice() {
            &[_, h, d] => Some((h, d)),
            _ => None,
        }
    };
    let mut found = HashMap::new();
    for &write in &uses.order {
        if !matches!(g.node(write).op, Op::KvWrite { .. }) {
            continue;
        }
        let (k_rope, v) = (g.node(write).inputs[0], g.node(write).inputs[1]);
        let Some((k_norm, k_in)) = roped(k_rope) else {
            continue;
        };
        let v_norm =
            (matches!(g.node(v).op, Op::RmsNorm(_)) && uses.only_user(v, write)).then_some(v);
        let v_in = v_norm.map_or(v, |n| g.node(n).inputs[0]);
        if !uses.only_user(k_rope, write) {
            continue;
        }
        // The q rope of the attention that reads this write right after it.
        for &a in &uses.users[write.index()] {
            let Op::Attention(_) = g.node(a).op else {
                continue;
            };
            let q_rope = g.node(a).inputs[0];
            let Some((q_norm, q_in)) = roped(q_rope) else {
                continue;
            };
            let prep = HeadPrep {
                q_norm,
                q_rope,
                k_norm,
                k_rope,
                v_norm,
                write,
            };
            let mut pos: Vec<usize> = match prep.steps().map(|id| at.get(&id).copied()).collect() {
                Some(p) => p,
                None => continue,
            };
            pos.sort_unstable();
            let consecutive = pos.windows(2).all(|w| w[1] == w[0] + 1);
            let sizes = (heads(q_rope), heads(k_rope), heads(v));
            let whole = match sizes {
                (Some((_, dq)), Some((_, dk)), Some((_, dv))) => {
                    dq == dk && dk == dv && dq % 32 == 0 && dq <= NORM_ROPE_MAX_HEAD
                }
                _ => false,
            };
            let stepped =
                |rope: NodeId| matches!(locs[g.node(rope).inputs[1].index()], Loc::Input(_));
            let safe = may_write(locs, q_rope, k_in, false)
                && may_write(locs, q_rope, v_in, false)
                && may_write(locs, q_rope, q_in, true)
                && stepped(q_rope)
                && stepped(k_rope);
            if consecutive && whole && safe {
                found.insert(uses.order[pos[0]], prep);
                break;
            }
        }
    }
    found
}

/// A narrow of a value whose shape is fixed (every symbol at most 1, as in
/// decode) with nothing before its axis is a contiguous range: read in
/// place rather than copied (the q/k/v and gate/up splits of a step). Its
/// source and the element it starts at.
pub(super) fn narrow_view(g: &Graph, max: &Bindings, id: NodeId) -> Option<(NodeId, usize)> {
    let n = g.node(id);
    let Op::Narrow { axis, start, len } = n.op else {
        return None;
    };
    let src = g.node(n.inputs[0]);
    let fixed = src.shape.dims().iter().all(|d| match *d {
        Dim::Fixed(_) => true,
        Dim::Sym(s) => max.get(s) == Some(1),
    });
    let dims = src.shape.resolve(max)?;
    if !fixed || dims[..axis].iter().product::<usize>() != 1 {
        return None;
    }
    let from = narrow_from(start, dims[axis], len).ok()?;
    let inner: usize = dims[axis + 1..].iter().product();
    Some((n.inputs[0], from * inner))
}

/// A narrow of the last axis of a `[rows, width]` value whose rows vary
/// (a batched step's q/k/v or gate/up split of one product) that every
/// reader could take in place, rows `width` apart: `GeGlu`, or the norms,
/// ropes and K/V writes a [`HeadPrep`] runs. Its source, first column and
/// `width`.
fn strided_narrow(
    g: &Graph,
    max: &Bindings,
    users: &[Vec<NodeId>],
    outputs: &HashSet<NodeId>,
    id: NodeId,
) -> Option<(NodeId, usize, usize)> {
    let n = g.node(id);
    let Op::Narrow { axis, start, len } = n.op else {
        return None;
    };
    let dims = g.node(n.inputs[0]).shape.resolve(max)?;
    let &[_, width] = dims.as_slice() else {
        return None;
    };
    if axis != 1 || outputs.contains(&id) {
        return None;
    }
    let readable = readers(g, users, outputs, id).iter().all(|&r| {
        !outputs.contains(&r)
            && matches!(
                g.node(r).op,
                Op::GeGlu | Op::RmsNorm(_) | Op::Rope(_) | Op::KvWrite { .. }
            )
    });
    let from = narrow_from(start, width, len).ok()?;
    readable.then_some((n.inputs[0], from, width))
}

/// The steps that read `id`, looking through reshapes (which are views)
/// unless the graph gives one out (then it is a reader itself).
fn readers(g: &Graph, users: &[Vec<NodeId>], outputs: &HashSet<NodeId>, id: NodeId) -> Vec<NodeId> {
    let mut found = Vec::new();
    for &u in &users[id.index()] {
        if matches!(g.node(u).op, Op::Reshape { .. }) && !outputs.contains(&u) {
            found.extend(readers(g, users, outputs, u));
        } else {
            found.push(u);
        }
    }
    found
}

/// A plan's steps laid out in the arena, the head preparations found in
/// them, and the narrows read in place with their source's row stride.
pub(super) struct Layout {
    pub sched: Schedule,
    pub head_preps: HashMap<NodeId, HeadPrep>,
    /// Strided narrow → the row stride (elements) of the value it reads.
    pub strided: HashMap<NodeId, usize>,
}

/// Lays out `g`'s steps for the symbol maxima `max`. One-row narrows are
/// views ([`narrow_view`]); a batched step's q/k/v and gate/up splits are
/// read in place with a row stride where every reader takes one (`GeGlu`
/// and the [`HeadPrep`]s): laid out with those, then again without any
/// whose readers did not all end up in a head preparation, until they do.
pub(super) fn lay_out(g: &Graph, max: &Bindings) -> Result<Layout, RunError> {
    let (users, outputs) = (users_of(g), outputs_of(g));
    let mut strided: HashMap<NodeId, (NodeId, usize, usize)> = g
        .ids()
        .filter(|&id| narrow_view(g, max, id).is_none())
        .filter_map(|id| Some((id, strided_narrow(g, max, &users, &outputs, id)?)))
        .collect();
    loop {
        let view = |id: NodeId| {
            narrow_view(g, max, id).or_else(|| strided.get(&id).map(|&(src, from, _)| (src, from)))
        };
        let sched = schedule(g, max, &view)?;
        let head_preps = find_head_preps(g, &sched.steps, &sched.locs, max);
        let prepped: HashSet<NodeId> = head_preps.values().flat_map(|p| p.steps()).collect();
        let before = strided.len();
        strided.retain(|&id, _| {
            readers(g, &users, &outputs, id)
                .iter()
                .all(|r| matches!(g.node(*r).op, Op::GeGlu) || prepped.contains(r))
        });
        if strided.len() == before {
            return Ok(Layout {
                sched,
                head_preps,
                strided: strided.into_iter().map(|(id, (_, _, w))| (id, w)).collect(),
            });
        }
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
    for id in g.ids() {
        if let (Op::Weight { id: w, name }, DType::Ggml(ty)) = (&g.node(id).op, g.node(id).dtype) {
            if type_code(ty).is_some() || g.node(id).shape.rank() == 1 {
                uploaded(weights, *w, name)?;
            }
        }
    }
    let Layout {
        sched,
        head_preps,
        strided,
    } = lay_out(&g, &opts.max)?;
    let (prologues, folded) = find_prologues(&g, &sched.steps, &sched.locs);
    let prepped: HashSet<NodeId> = head_preps.values().flat_map(|p| p.steps()).collect();
    let mut norm_ropes = find_norm_ropes(&g, &sched.steps, &sched.locs, &opts.max);
    norm_ropes.retain(|norm, _| !prepped.contains(norm));
    let device = Arc::clone(weights.device());
    let s = &device.stream;
    let mut rope_tables = HashMap::new();
    let mut norm_elems = 0usize;
    // The largest weight matrix and matmul input, for cuBLAS scratch.
    let (mut weight_elems, mut x_elems, mut max_k) = (0usize, 0usize, 0usize);
    // The longest row a product of whole 32-element units has.
    let mut mmv_k = 0usize;
    // The most rows a step has: every input, K/V write and attention fits.
    let mut rows = 1usize;
    let mut moe: Option<MoeSizes> = None;
    // Whether an attention reads span ids (the metadata then carries them).
    let mut spans = false;
    let rows_at_max = |id: NodeId| -> usize {
        g.node(id)
            .shape
            .resolve(&opts.max)
            .and_then(|d| d.first().copied())
            .unwrap_or(0)
    };
    for id in g.ids() {
        let n = g.node(id);
        let unsupported = |what: &str| -> CudaError {
            CudaError::Unsupported(format!(
                "node {id} ({}): {what} is not in the CUDA backend yet",
                n.op.name()
            ))
        };
        match &n.op {
            Op::Input { .. } if n.dtype == rlx_ir::DType::I32 => {
                rows = rows.max(n.shape.numel(&opts.max).unwrap_or(0))
            }
            Op::Input { .. } => {}
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
                    let elems = g.node(w).shape.numel(&opts.max).unwrap_or(0);
                    weight_elems = weight_elems.max(elems);
                }
                let x = g.node(n.inputs[0]).shape.numel(&opts.max).unwrap_or(0);
                let k = g.node(n.inputs[0]).shape.0.last().and_then(|d| d.fixed());
                let k = k.unwrap_or(0);
                if k % 32 == 0 {
                    mmv_k = mmv_k.max(k);
                }
                if k > 0 && x > k {
                    x_elems = x_elems.max(x);
                    max_k = max_k.max(k);
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
                rope_tables.insert(id, s.clone_htod(&spec.inv_freqs(factors.as_deref()))?);
            }
            Op::Attention(spec) => {
                spans |= spec.bidirectional_spans;
                if spec.kv == KvSource::Inputs {
                    // Heads and head sizes: fixed, grouped, at most 512.
                    let heads = |i: usize| -> Option<(usize, usize)> {
                        match g.node(n.inputs[i]).shape.dims() {
                            [_, h, d] => Some((h.fixed()?, d.fixed()?)),
                            _ => None,
                        }
                    };
                    let ok = match (heads(0), heads(1), heads(2)) {
                        (Some((hq, hd)), Some((hkv, kd)), Some((vh, hdv))) => {
                            hkv > 0
                                && hq % hkv == 0
                                && vh == hkv
                                && kd == hd
                                && hd <= 512
                                && hdv <= 512
                        }
                        _ => false,
                    };
                    if !ok {
                        return Err(node_err(
                            &g,
                            id,
                            "attention over inputs needs q [n, H, d], k [m, Hkv, d], v [m, Hkv, dv] \
                             with H a multiple of Hkv and d, dv at most 512",
                        )
                        .into());
                    }
                }
                rows = rows.max(rows_at_max(n.inputs[0]));
            }
            // Span ids go to the pool on the host (`record_spans`).
            Op::KvWrite { .. } => rows = rows.max(rows_at_max(n.inputs[0])),
            Op::Moe { top_k } => {
                weight_of(&g, weights, n.inputs[2])?;
                weight_of(&g, weights, n.inputs[3])?;
                let gu: Vec<usize> = g
                    .node(n.inputs[2])
                    .shape
                    .0
                    .iter()
                    .map(|d| d.fixed().expect("weights are fixed"))
                    .collect();
                let need = MoeSizes {
                    slots: rows_at_max(n.inputs[0]) * top_k,
                    cap: rows_at_max(n.inputs[0]),
                    experts: gu[0],
                    ff: gu[1] / 2,
                    d: gu[2],
                };
                moe = Some(moe.map_or(need, |m: MoeSizes| m.max(&need)));
            }
            _ => {}
        }
    }
    let steps_where = |f: &dyn Fn(&Op) -> bool| -> Vec<NodeId> {
        sched
            .steps
            .iter()
            .copied()
            .filter(|&id| f(&g.node(id).op))
            .collect()
    };
    let gathers = steps_where(&|op| matches!(op, Op::Gather));
    let takes = steps_where(&|op| matches!(op, Op::TakeRows));
    let kv_steps = steps_where(&|op| {
        matches!(op, Op::KvWrite { .. })
            || matches!(op, Op::Attention(a) if matches!(a.kv, KvSource::Cache(_)))
    });
    // Until a pool comes: the inputs and run sections only.
    let meta_layout = MetaLayout {
        rows,
        groups: 0,
        cap: 0,
        spans,
    };
    // A plan that multiplies more than one row at once keeps cuBLAS
    // scratch: bf16 tensor-core products for `q8`, f32 for `exact`.
    let gemm = if device.has_blas() && x_elems > 0 {
        let ty = match opts.precision {
            Precision::Exact => GemmType::F32,
            Precision::Quantized => GemmType::BF16,
        };
        let elems = weight_elems.min(GEMM_CHUNK_ELEMS.max(max_k));
        Some(GemmScratch {
            ty,
            weights: s.alloc_zeros(elems * ty.bytes())?,
            elems,
            x16: match ty {
                GemmType::BF16 => Some(s.alloc_zeros(x_elems)?),
                GemmType::F32 => None,
            },
            part: match ty {
                GemmType::BF16 => Some(s.alloc_zeros(MMQ_ROWS * 4 * device.sms * MMQ_BLOCK_ROWS)?),
                GemmType::F32 => None,
            },
        })
    } else {
        None
    };
    let paged_attention = g
        .ids()
        .any(|id| matches!(&g.node(id).op, Op::Attention(a) if matches!(a.kv, KvSource::Cache(_))));
    let attn_splits = match paged_attention {
        true => Some(AttnSplits {
            part: s.alloc_zeros((ATTN_BLOCKS_PER_SM + 2) * device.sms * ATTN_PART)?,
            // Split attention runs under 2 × sms blocks.
            done: s.alloc_zeros(2 * device.sms)?,
        }),
        false => None,
    };
    let act_q = match opts.precision {
        Precision::Quantized if mmv_k > 0 => Some(s.alloc_zeros(act_q_bytes(MMV_ROWS, mmv_k).1)?),
        _ => None,
    };
    let moe = match moe {
        Some(sizes) => Some(MoeScratch {
            buf: s.alloc_zeros(sizes.elems().max(1))?,
            sizes,
        }),
        None => None,
    };
    Ok(CudaPlan {
        moe,
        gathers,
        takes,
        kv_steps,
        arena: s.alloc_zeros(sched.arena_elems.max(1))?,
        norm_buf: s.alloc_zeros(norm_elems.max(1))?,
        meta: s.alloc_zeros(meta_layout.len())?,
        meta_layout,
        stage: Vec::new(),
        graph_ir: g,
        weights: Arc::clone(weights),
        device,
        steps: sched.steps,
        locs: sched.locs,
        values: sched.values,
        rope_tables,
        captured: Vec::new(),
        gemm,
        act_q,
        attn_splits,
        prologues,
        folded,
        roped: norm_ropes.values().copied().collect(),
        norm_ropes,
        head_preps,
        prepped,
        strided,
        host: None,
        reduce_in: None,
        reduce_parts: None,
        reduce_out: None,
        kept: None,
        max: opts.max.clone(),
    })
}

mod ops;

/// One step of a plan being launched: its node, bindings, dimensions and
/// output address, and its inputs' addresses and dimensions. Each op's
/// launch is a method of it (`plan/ops.rs`).
struct Cx<'a> {
    plan: &'a CudaPlan,
    g: &'a Graph,
    n: &'a rlx_ir::Node,
    id: NodeId,
    b: &'a Bindings,
    dims: &'a [usize],
    out: u64,
    /// What a prologue writes in place of the output, if any.
    folded: Option<Operand>,
}

/// What a node folded into a product's prologue (see [`find_prologues`])
/// writes for that product: 8-bit blocks (codes, scales) for the decode
/// kernels, or the bf16 operand of a many-row product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Operand {
    Q8 { qs: u64, qd: u64 },
    Bf16(u64),
}

impl Operand {
    /// The kernel of a producer's pair that writes this operand.
    fn pick<'a>(self, q8: &'a CudaFunction, bf16: &'a CudaFunction) -> &'a CudaFunction {
        match self {
            Operand::Q8 { .. } => q8,
            Operand::Bf16(_) => bf16,
        }
    }

    /// Where it goes, as the producer kernels take it: codes and scales,
    /// or the bf16 rows.
    fn args(self) -> Vec<Arg> {
        match self {
            Operand::Q8 { qs, qd } => vec![Arg::Ptr(qs), Arg::Ptr(qd)],
            Operand::Bf16(p) => vec![Arg::Ptr(p)],
        }
    }
}

impl Cx<'_> {
    fn inp(&self, i: usize) -> u64 {
        self.plan.addr(self.n.inputs[i])
    }

    fn in_dims(&self, i: usize) -> Vec<usize> {
        self.g
            .node(self.n.inputs[i])
            .shape
            .resolve(self.b)
            .expect("bound")
    }
}

/// 1-D launch over `n` elements, in blocks of 256 threads (so a kernel may
/// use up to 255 registers a thread; 1024-thread blocks allow only 64).
pub(super) fn linear(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.max(1).div_ceil(256) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One block per row of `d` for the norm kernels: about four elements a
/// thread (they hold up to eight each in registers), whole warps.
pub(super) fn norm_rows(rows: usize, d: usize) -> LaunchConfig {
    let threads = d.div_ceil(4).next_multiple_of(32).clamp(32, 1024);
    grid(rows, 1, threads as u32)
}

fn grid(x: usize, y: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (x.max(1) as u32, y.max(1) as u32, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Kernel arguments, all plain values (device addresses as u64).
#[derive(Clone, Copy)]
enum Arg {
    Ptr(u64),
    I32(i32),
    I64(i64),
    F32(f32),
}

/// What the steps of a run read of the pool.
struct KvCtx<'a> {
    pool: &'a KvPool,
    storage: &'a CudaKvStorage,
}

impl KvCtx<'_> {
    /// The group a slot reads and the buffers of the slot it reads.
    fn layer(&self, slot: rlx_ir::CacheSlot) -> Result<(usize, LayerPtrs), CudaError> {
        let group = self.pool.group_of(slot)?;
        let (owner, _) = self.pool.owner(slot)?;
        let l = self
            .storage
            .layer(owner.0 as usize)
            .ok_or_else(|| KvError::Layout {
                slot: slot.0,
                what: "the pool's storage has no rows for this layer".into(),
            })?;
        Ok((group, l))
    }
}

impl CudaPlan {
    pub fn graph(&self) -> &Graph {
        &self.graph_ir
    }

    /// Device memory this plan owns: activations, scratch and step metadata
    /// (weights are the [`CudaWeights`]').
    pub fn arena_bytes(&self) -> usize {
        let gemm = self.gemm.as_ref().map_or(0, |g| {
            g.weights.len() + 2 * g.x16.as_ref().map_or(0, |x| x.len())
        });
        let act_q = self.act_q.as_ref().map_or(0, |a| a.len());
        let splits = self
            .attn_splits
            .as_ref()
            .map_or(0, |a| a.part.len() + a.done.len());
        (self.arena.len() + self.norm_buf.len() + self.meta.len() + splits) * 4 + gemm + act_q
    }

    /// A product's weights: type code, device address, rows and type.
    fn mm_weights(&self, mm: NodeId) -> Result<Vec<(u32, u64, usize, GgmlType)>, CudaError> {
        let g = &self.graph_ir;
        let n = g.node(mm);
        let Op::MatMul { norm } = &n.op else {
            unreachable!("a product")
        };
        let first = if norm.is_some_and(|s| s.has_gamma) {
            2
        } else {
            1
        };
        n.inputs[first..]
            .iter()
            .map(|&w| {
                let (code, ptr) = weight_of(g, &self.weights, w)?;
                let rows = g.node(w).shape.0[0].fixed().expect("fixed");
                let DType::Ggml(ty) = g.node(w).dtype else {
                    unreachable!("a weight")
                };
                Ok((code, ptr, rows, ty))
            })
            .collect()
    }

    /// What product `mm` reads as its input this step if a [`Prologue`]
    /// writes it: 8-bit blocks where the step takes the 8-bit decode path
    /// (few rows, block-type weights only, `q8`), the bf16 operand where it
    /// takes the tensor cores or cuBLAS over bf16 (many rows of whole
    /// units). The producer and the product both ask, so they agree.
    fn prologue_operand(&self, mm: NodeId, b: &Bindings) -> Result<Option<Operand>, CudaError> {
        if !self.prologues.contains_key(&mm) {
            return Ok(None);
        }
        let xd = self
            .graph_ir
            .node(self.graph_ir.node(mm).inputs[0])
            .shape
            .resolve(b)
            .expect("bound");
        let kin = *xd.last().expect("rank");
        let m = xd.iter().product::<usize>() / kin.max(1);
        let w = self.mm_weights(mm)?;
        let mmq = self.takes_mmq(m, kin, &w);
        if let Some(buf) = self.act_q.as_ref() {
            let ok = m <= MMV_ROWS
                && !mmq
                && kin.is_multiple_of(32)
                && w.iter().all(|w| !is_float(w.3) && w.1 % 16 == 0);
            if ok {
                let base = self.device.ptr(buf);
                return Ok(Some(Operand::Q8 {
                    qs: base,
                    qd: base + act_q_bytes(m, kin).0 as u64,
                }));
            }
        }
        Ok(match &self.gemm {
            Some(GemmScratch { x16: Some(x16), .. })
                if m > 1 && (m > MMV_ROWS || mmq) && kin.is_multiple_of(32) =>
            {
                Some(Operand::Bf16(self.device.ptr(x16)))
            }
            _ => None,
        })
    }

    /// What a folded node (see [`find_prologues`]) writes for its product
    /// this step, if the product takes it.
    fn folded_operand(&self, id: NodeId, b: &Bindings) -> Result<Option<Operand>, CudaError> {
        match self.folded.get(&id) {
            Some(&mm) => self.prologue_operand(mm, b),
            None => Ok(None),
        }
    }

    /// Launches `f` on the plan's stream. Where the GPU has programmatic
    /// dependent launch, each launch may start while the one before it
    /// finishes (every kernel waits for its predecessor before touching
    /// memory: `pdl_begin` in kernels.cu), which hides most of the gap
    /// between two small kernels of a decode step.
    fn launch(&self, f: &CudaFunction, cfg: LaunchConfig, args: &[Arg]) -> Result<(), CudaError> {
        self.launch_reading(f, cfg, args, 0)
    }

    /// [`CudaPlan::launch`] of a kernel that reads `weight_bytes` of
    /// weights (for profiles).
    fn launch_reading(
        &self,
        f: &CudaFunction,
        cfg: LaunchConfig,
        args: &[Arg],
        weight_bytes: u64,
    ) -> Result<(), CudaError> {
        use cudarc::driver::sys;
        let mut params: Vec<*mut std::ffi::c_void> = args
            .iter()
            .map(|a| match a {
                Arg::Ptr(p) => p as *const u64 as *mut _,
                Arg::I32(v) => v as *const i32 as *mut _,
                Arg::I64(v) => v as *const i64 as *mut _,
                Arg::F32(v) => v as *const f32 as *mut _,
            })
            .collect();
        let mut attr = sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value: sys::CUlaunchAttributeValue {
                programmaticStreamSerializationAllowed: 1,
            },
        };
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.device.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: u32::from(self.device.pdl),
        };
        self.device.ctx.bind_to_thread()?;
        // SAFETY: every caller passes the argument list its kernel declares,
        // with addresses of buffers sized (by the schedule, for the maxima
        // that `bind` checked, or by the pool for K/V rows) for the elements
        // the launch covers; indices read from the metadata buffer were
        // checked on the host or come from the pool's layout. `params`
        // points into `args`, and `attr` is live, for the whole call (the
        // driver copies both before returning).
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                f.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
            .result()?
        };
        if self.device.profiling() {
            self.device.profile_launch(Some(f), "", weight_bytes)?;
        }
        Ok(())
    }

    /// Device address of element `offset` of the metadata buffer.
    fn meta_addr(&self, offset: usize) -> u64 {
        self.device.ptr(&self.meta) + 4 * offset as u64
    }

    /// Device address of a value (f32, or an i32 input).
    /// The row stride (elements) at which `id` is read where it is a
    /// strided narrow or a view of one; None where its rows are contiguous.
    pub(super) fn row_stride(&self, mut id: NodeId) -> Option<usize> {
        loop {
            if let Some(&w) = self.strided.get(&id) {
                return Some(w);
            }
            match self.locs[id.index()] {
                Loc::Alias { src, .. } => id = src,
                _ => return None,
            }
        }
    }

    fn addr(&self, id: NodeId) -> u64 {
        match self.locs[id.index()] {
            Loc::Arena { offset, .. } => self.device.ptr(&self.arena) + 4 * offset as u64,
            Loc::Alias { src, offset } => self.addr(src) + 4 * offset as u64,
            Loc::Input(which) => self.meta_addr(self.meta_layout.input(which)),
            Loc::Weight(w) => self.weights.ptr(w).unwrap_or(0),
            Loc::None => 0,
        }
    }

    /// Runs one step of `batch`: symbols are bound from its length, and a
    /// graph that uses the K/V pool writes each row at its sequence and
    /// position (the pool advances the sequences afterwards). Outputs come
    /// back to the host.
    pub fn run(&mut self, batch: &Batch, kv: Option<&mut KvPool>) -> Result<StepOutputs, RunError> {
        crate::backend::Executable::run(self, batch, kv)
    }

    /// What can fail before the pool changes: the inputs' lengths against
    /// the plan, token ids and rows, the pool's layers against the K/V
    /// steps. A part of a split graph, whose values come from earlier
    /// parts, is checked when it runs.
    pub(super) fn check_step(&self, batch: &Batch, pool: Option<&KvPool>) -> Result<(), CudaError> {
        let Some(b) = bind_early(&self.graph_ir, &self.max, batch)? else {
            return Ok(());
        };
        self.check_indices(&b, &StepInputs::new(batch, &[]))?;
        if let (Some(pool), false) = (pool, self.kv_steps.is_empty()) {
            self.check_kv(&b, pool, self.storage(pool)?, batch.len())?;
        }
        Ok(())
    }

    /// The span ids of the rows this step's K/V writes go to, recorded in
    /// the pool (on the host, where the attention of every plan finds them
    /// through the step's metadata), as the CPU's writes record them.
    pub(super) fn record_spans(
        &self,
        batch: &Batch,
        pool: &mut KvPool,
        layout: &StepLayout,
    ) -> Result<(), CudaError> {
        let g = &self.graph_ir;
        let inputs = StepInputs::new(batch, &[]);
        for &id in &self.kv_steps {
            let n = g.node(id);
            let (Op::KvWrite { slot }, Some(&s)) = (&n.op, n.inputs.get(2)) else {
                continue;
            };
            let Loc::Input(which) = self.locs[s.index()] else {
                unreachable!("i32 values are inputs")
            };
            let group = pool.group_of(*slot)?;
            for (&row, &span) in layout.write_rows[group].iter().zip(inputs.get(which)) {
                pool.set_span(group, row, span);
            }
        }
        Ok(())
    }

    /// Runs one step on a prepared pool (read only: K/V rows are written
    /// in the device storage the pool owns).
    pub(super) fn run_inner(
        &mut self,
        batch: &Batch,
        kv: Option<(&KvPool, &StepLayout)>,
        values: &[(String, HostTensor)],
        reduce: Option<(&str, &[RowReduce])>,
    ) -> Result<(StepOutputs, Option<Vec<RowDigest>>), CudaError> {
        self.kept = None;
        let inputs = StepInputs::new(batch, values);
        let b = bind(&self.graph_ir, &self.max, &inputs)?;
        self.check_indices(&b, &inputs)?;
        // Only a plan with K/V steps reads the pool (a part of a split
        // graph may have none, and no storage on this device).
        let kv = kv.filter(|_| !self.kv_steps.is_empty());
        if !self.kv_steps.is_empty() && kv.is_none() {
            return Err(RunError::NoCache.into());
        }
        let mut storage_id = None;
        if let Some((pool, layout)) = kv {
            let storage = self.storage(pool)?;
            storage_id = Some(storage.id());
            self.check_kv(&b, pool, storage, batch.len())?;
            self.fit_meta(layout, pool)?;
        }
        self.upload(&inputs, kv)?;
        self.copy_in(&inputs)?;
        let stream = Arc::clone(&self.device.stream);
        {
            let ctx = match kv {
                Some((pool, _)) => Some(KvCtx {
                    pool,
                    storage: self.storage(pool)?,
                }),
                None => None,
            };
            let profiling = self.device.profiling();
            let capture = !profiling && (b == self.max || batch.len() <= GRAPH_MAX_ROWS);
            let found = self
                .captured
                .iter()
                .position(|c| c.storage == storage_id && c.bindings == b)
                .filter(|_| !profiling);
            if profiling {
                self.device.profile_begin(batch.len())?;
            }
            if let Some(i) = found {
                self.captured[i].graph.launch()?;
            } else if capture {
                let sid = storage_id;
                // Graphs of another storage are stale (it was replaced).
                self.captured.retain(|c| c.storage == sid);
                if self.captured.len() >= GRAPHS_KEPT {
                    self.captured.remove(0);
                }
                stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
                let result = self
                    .steps
                    .iter()
                    .try_for_each(|&id| self.exec(id, &b, ctx.as_ref()));
                // End the capture even after an error, so the stream is
                // usable; the launch's error is the one to report.
                let graph = stream.end_capture(CUgraphInstantiate_flags(0));
                result?;
                let graph = graph?
                    .ok_or_else(|| CudaError::Unsupported("graph capture made no graph".into()))?;
                graph.launch()?;
                self.captured.push(Captured {
                    bindings: b.clone(),
                    storage: sid,
                    graph,
                });
            } else {
                for &id in &self.steps {
                    self.exec(id, &b, ctx.as_ref())?;
                }
            }
            if profiling {
                self.device.profile_queued();
            }
        }
        let mut outs = Vec::new();
        let mut digests = None;
        for (name, id) in &self.graph_ir.outputs().to_vec() {
            let dims = self.graph_ir.node(*id).shape.resolve(&b).expect("bound");
            let len: usize = dims.iter().product();
            let Some((offset, _)) = arena_span(&self.locs, *id) else {
                return Err(
                    node_err(&self.graph_ir, *id, "outputs must be computed values").into(),
                );
            };
            if let Some((_, rows)) = reduce.filter(|(n, _)| n == name) {
                digests = Some(self.reduce_rows(name, offset, &dims, rows)?);
                continue;
            }
            let src = self.arena.slice(offset..offset + len);
            let data = if len == 0 {
                Vec::new()
            } else if len <= PINNED_MAX_ELEMS {
                if self.host.as_ref().is_none_or(|h| h.len() < len) {
                    self.host = None;
                    // SAFETY: the memory is read only after a copy into
                    // it has completed (below). Not write-combined: the
                    // host reads it.
                    self.host = Some(unsafe { self.device.ctx.alloc_pinned_with_flags(len, 0) }?);
                }
                let host = self.host.as_mut().expect("sized above");
                // Into the first `len` elements only: the copy moves as
                // many bytes as its destination holds, and the buffer may
                // be larger than this output (from an earlier step).
                stream.memcpy_dtoh(&src, &mut host.as_mut_slice()?[..len])?;
                stream.synchronize()?;
                host.as_slice()?[..len].to_vec()
            } else {
                stream.clone_dtoh(&src)?
            };
            outs.push((name.clone(), HostTensor::f32(data, &dims)));
        }
        if let (Some((name, _)), None) = (reduce, &digests) {
            return Err(RunError::NoOutput(name.into()).into());
        }
        if self.device.profiling() {
            self.device.profile_end()?;
        }
        Ok((outs.into(), digests))
    }

    /// Reduces the rows of output `name` (`dims` = rows × vocab, at arena
    /// element `offset`) on the device as `rows` asks, and keeps it there
    /// for [`CudaPlan::fetch_kept_row`] until the next step.
    fn reduce_rows(
        &mut self,
        name: &str,
        offset: usize,
        dims: &[usize],
        rows: &[RowReduce],
    ) -> Result<Vec<RowDigest>, CudaError> {
        let [n, vocab] = dims else {
            return Err(CudaError::Unsupported(format!(
                "output {name:?} is {dims:?}; only [rows, vocab] reduces"
            )));
        };
        if rows.len() != *n {
            return Err(CudaError::Unsupported(format!(
                "output {name:?} has {n} rows, {} reductions asked for",
                rows.len()
            )));
        }
        if let Some(e) = rows.iter().find_map(|r| r.check().err()) {
            return Err(CudaError::Unsupported(format!("reducing {name:?}: {e}")));
        }
        self.kept = Some(Kept {
            name: name.to_string(),
            offset,
            rows: *n,
            vocab: *vocab,
        });
        self.launch_reduce(offset, *vocab, rows)
    }

    /// Row `row` of the output the last step reduced and kept, reduced
    /// again as `req` asks.
    pub(super) fn reduce_kept_row(
        &mut self,
        name: &str,
        row: usize,
        req: &RowReduce,
    ) -> Result<RowDigest, CudaError> {
        let (at, vocab) = self.kept_row(name, row)?;
        req.check()
            .map_err(|e| CudaError::Unsupported(format!("reducing {name:?}[{row}]: {e}")))?;
        let mut digests = self.launch_reduce(at, vocab, std::slice::from_ref(req))?;
        Ok(digests.pop().expect("one row reduced"))
    }

    /// The digests of `rows.len()` rows of `vocab` logits from arena
    /// element `offset` on, reduced as `rows` asks.
    fn launch_reduce(
        &mut self,
        offset: usize,
        vocab: usize,
        rows: &[RowReduce],
    ) -> Result<Vec<RowDigest>, CudaError> {
        let n = rows.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        let (bytes, adj_at) = super::reduce::encode(rows);
        let out_len = n * super::reduce::OUT_BYTES;
        let splits = super::reduce::splits(n, vocab, self.device.sms);
        let parts_len = n * splits * super::reduce::PART_BYTES;
        let stream = Arc::clone(&self.device.stream);
        let fits =
            |s: &Option<CudaSlice<u8>>, len: usize| s.as_ref().is_some_and(|s| s.len() >= len);
        for (buf, len) in [
            (&mut self.reduce_in, bytes.len()),
            (&mut self.reduce_out, out_len),
            (&mut self.reduce_parts, parts_len),
        ] {
            if !fits(buf, len) {
                *buf = Some(stream.alloc_zeros(len.next_power_of_two())?);
            }
        }
        let input = self.reduce_in.as_mut().expect("sized above");
        stream.memcpy_htod(&bytes, &mut input.slice_mut(..bytes.len()))?;
        let ptr = |b: &Option<CudaSlice<u8>>| self.device.ptr(b.as_ref().expect("sized above"));
        let (inp, outp, parts) = (
            ptr(&self.reduce_in),
            ptr(&self.reduce_out),
            ptr(&self.reduce_parts),
        );
        let logits = self.device.ptr(&self.arena) + 4 * offset as u64;
        let k = &self.device.kernels;
        let sliced = LaunchConfig {
            grid_dim: (n as u32, splits as u32, 1),
            block_dim: (REDUCE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let args = [
            Arg::Ptr(logits),
            Arg::I64(vocab as i64),
            Arg::Ptr(inp),
            Arg::Ptr(inp + adj_at as u64),
            Arg::Ptr(parts),
            Arg::I32(splits as i32),
        ];
        self.launch(&k.reduce_part, sliced, &args)?;
        if rows.iter().any(|r| r.draw.is_some()) {
            self.launch(&k.reduce_draw, sliced, &args)?;
        }
        let merge = LaunchConfig {
            grid_dim: (n as u32, 1, 1),
            ..sliced
        };
        let args = [
            Arg::Ptr(logits),
            Arg::I64(vocab as i64),
            Arg::Ptr(parts),
            Arg::I32(splits as i32),
            Arg::Ptr(inp),
            Arg::Ptr(outp),
        ];
        self.launch(&k.reduce_merge, merge, &args)?;
        let out = stream.clone_dtoh(
            &self
                .reduce_out
                .as_ref()
                .expect("sized above")
                .slice(..out_len),
        )?;
        Ok(super::reduce::decode(&out, n))
    }

    /// Where row `row` of the output the last step reduced and kept starts
    /// in the arena, and its length.
    fn kept_row(&self, name: &str, row: usize) -> Result<(usize, usize), CudaError> {
        let Some(k) = self
            .kept
            .as_ref()
            .filter(|k| k.name == name && row < k.rows)
        else {
            return Err(RunError::NoOutput(format!("{name}[{row}]")).into());
        };
        Ok((k.offset + row * k.vocab, k.vocab))
    }

    /// Row `row` of the output the last step reduced and kept.
    pub(super) fn fetch_kept_row(&self, name: &str, row: usize) -> Result<Vec<f32>, CudaError> {
        let (at, vocab) = self.kept_row(name, row)?;
        Ok(self
            .device
            .stream
            .clone_dtoh(&self.arena.slice(at..at + vocab))?)
    }

    /// Logit `token` of row `row` of the output the last step kept.
    pub(super) fn fetch_kept_logit(
        &self,
        name: &str,
        row: usize,
        token: u32,
    ) -> Result<f32, CudaError> {
        let (at, vocab) = self.kept_row(name, row)?;
        let t = token as usize;
        if t >= vocab {
            return Err(RunError::NoOutput(format!("{name}[{row}][{token}]")).into());
        }
        let one = self
            .device
            .stream
            .clone_dtoh(&self.arena.slice(at + t..at + t + 1))?;
        Ok(one[0])
    }

    /// The label of this plan's GPU, for errors.
    pub(super) fn cuda_label(&self) -> String {
        self.device.label()
    }

    /// The pool's storage on this plan's GPU.
    fn storage<'a>(&self, pool: &'a KvPool) -> Result<&'a CudaKvStorage, CudaError> {
        pool.parts()
            .filter_map(|p| p.as_any().downcast_ref::<CudaKvStorage>())
            .find(|s| Arc::ptr_eq(s.device(), &self.device))
            .ok_or_else(|| {
                KvError::Storage(format!(
                    "the K/V pool is not in the memory of {} (it belongs to another device)",
                    self.device.label()
                ))
                .into()
            })
    }

    /// Token ids and row indices come from the host: checked there, before
    /// any launch.
    fn check_indices(&self, b: &Bindings, inputs: &StepInputs) -> Result<(), CudaError> {
        let g = &self.graph_ir;
        let input_of = |id: NodeId| -> Option<&[i32]> {
            match self.locs[id.index()] {
                Loc::Input(which) => Some(inputs.get(which)),
                _ => None,
            }
        };
        for &id in &self.gathers {
            let n = g.node(id);
            let vocab = g.node(n.inputs[0]).shape.resolve(b).expect("bound")[0];
            let ids = input_of(n.inputs[1]).unwrap_or_default();
            if let Some(&t) = ids.iter().find(|&&t| t < 0 || t as usize >= vocab) {
                return Err(node_err(
                    g,
                    id,
                    format!("token id {t} is outside the vocabulary of {vocab}"),
                )
                .into());
            }
        }
        for &id in &self.takes {
            let n = g.node(id);
            let n_x = g.node(n.inputs[0]).shape.resolve(b).expect("bound")[0];
            let rows = input_of(n.inputs[1]).unwrap_or_default();
            if let Some(&r) = rows.iter().find(|&&r| r < 0 || r as usize >= n_x) {
                return Err(node_err(g, id, format!("row {r} of {n_x}")).into());
            }
        }
        Ok(())
    }

    /// Checks every K/V step against the pool: slots that exist, writes to
    /// owning layers only, one K/V row per batch row, head sizes the kernels
    /// take.
    fn check_kv(
        &self,
        b: &Bindings,
        pool: &KvPool,
        storage: &CudaKvStorage,
        n_rows: usize,
    ) -> Result<(), CudaError> {
        let g = &self.graph_ir;
        if n_rows > self.meta_layout.rows {
            return Err(RunError::TooLarge {
                sym: "batch rows",
                value: n_rows,
                max: self.meta_layout.rows,
            }
            .into());
        }
        let ctx = KvCtx { pool, storage };
        for &id in &self.kv_steps {
            let n = g.node(id);
            let in_dims = |i: usize| g.node(n.inputs[i]).shape.resolve(b).expect("bound");
            match &n.op {
                Op::KvWrite { slot } => {
                    let (owner, _) = pool.owner(*slot)?;
                    if owner != *slot {
                        return Err(KvError::Layout {
                            slot: slot.0,
                            what: "layer shares another layer's K/V and cannot be written".into(),
                        }
                        .into());
                    }
                    let (_, l) = ctx.layer(*slot)?;
                    let (k, v): (usize, usize) =
                        (in_dims(0).iter().product(), in_dims(1).iter().product());
                    if k != n_rows * l.k_width || v != n_rows * l.v_width {
                        return Err(KvError::Layout {
                            slot: slot.0,
                            what: format!(
                                "expected k {n_rows}×{} and v {n_rows}×{} values, got {k} and {v}",
                                l.k_width, l.v_width
                            ),
                        }
                        .into());
                    }
                }
                Op::Attention(attn) => {
                    let KvSource::Cache(slot) = attn.kv else {
                        unreachable!("rejected at compile")
                    };
                    ctx.layer(slot)?;
                    let (_, spec) = pool.owner(slot)?;
                    let qd = in_dims(0);
                    let out = n.shape.resolve(b).expect("bound");
                    let ok = qd.len() == 3
                        && out.len() == 3
                        && qd[0] == n_rows
                        && qd[2] == spec.head_dim
                        && out[2] == spec.v_head_dim
                        && spec.kv_heads > 0
                        && qd[1] % spec.kv_heads == 0
                        && spec.head_dim <= 512
                        && spec.v_head_dim <= 512;
                    if !ok {
                        return Err(node_err(
                            g,
                            id,
                            format!(
                                "queries {qd:?} and output {out:?} for {n_rows} rows do not fit \
                                 the slot's {} K/V heads of {} and {} (heads must be grouped, \
                                 head sizes at most 512)",
                                spec.kv_heads, spec.head_dim, spec.v_head_dim
                            ),
                        )
                        .into());
                    }
                }
                _ => unreachable!("K/V steps"),
            }
        }
        Ok(())
    }

    /// Makes the metadata buffer fit `layout`'s groups and blocks. A new
    /// buffer has new addresses: the captured graphs go with the old one.
    fn fit_meta(&mut self, layout: &StepLayout, pool: &KvPool) -> Result<(), CudaError> {
        let blocks = || pool.config().groups().iter().map(|g| g.blocks).sum();
        if let Some(new) = self.meta_layout.refit(layout, blocks) {
            self.captured.clear();
            self.meta = self.device.stream.alloc_zeros(new.len())?;
            self.meta_layout = new;
        }
        Ok(())
    }

    /// Uploads the step's inputs and layout in one copy.
    fn upload(
        &mut self,
        inputs: &StepInputs,
        kv: Option<(&KvPool, &StepLayout)>,
    ) -> Result<(), CudaError> {
        self.meta_layout.stage(inputs, kv, &mut self.stage);
        let len = self.stage.len();
        self.device
            .stream
            .memcpy_htod(&self.stage[..], &mut self.meta.slice_mut(..len))?;
        Ok(())
    }

    /// Copies the f32 inputs into their arena buffers.
    fn copy_in(&mut self, inputs: &StepInputs) -> Result<(), CudaError> {
        for (offset, data) in value_copies(&self.graph_ir, &self.values, &self.locs, inputs) {
            self.device
                .stream
                .memcpy_htod(data, &mut self.arena.slice_mut(offset..offset + data.len()))?;
        }
        Ok(())
    }

    /// Launches one step.
    fn exec(&self, id: NodeId, b: &Bindings, kv: Option<&KvCtx>) -> Result<(), CudaError> {
        let g = &self.graph_ir;
        let n = g.node(id);
        if matches!(self.locs[id.index()], Loc::Alias { .. }) {
            // Reshapes and in-place narrows: nothing to compute.
            return Ok(());
        }
        if let Some(prep) = self.head_preps.get(&id) {
            return self.head_prep(prep, b, kv);
        }
        if self.prepped.contains(&id) {
            return Ok(());
        }
        let dims = n.shape.resolve(b).expect("bound");
        let out = self.addr(id);
        // Where this node is folded into a product's prologue this step: the
        // 8-bit blocks it writes instead of its own output.
        let folded = self.folded_operand(id, b)?;
        let cx = Cx {
            plan: self,
            g,
            n,
            id,
            b,
            dims: &dims,
            out,
            folded,
        };
        match &n.op {
            Op::KvWrite { slot } => cx.kv_write(slot, kv)?,
            Op::Input { .. } | Op::Weight { .. } | Op::Reshape { .. } => {}
            Op::Gather => cx.gather()?,
            Op::MatMul { norm } => self.matmul(&cx, norm)?,
            Op::Add if folded.is_some() => cx.add_norm()?,
            Op::Add | Op::Mul => cx.binary()?,
            Op::Scale { .. } | Op::AddConst { .. } | Op::Gelu | Op::Softcap { .. } => cx.unary()?,
            Op::GeGlu => cx.geglu()?,
            // Folded into the add after it (a prologue of the product after that).
            Op::RmsNorm(_) if folded.is_some() => {}
            // Run by the norm before it.
            Op::Rope(_) if self.roped.contains(&id) => {}
            Op::RmsNorm(spec) if self.norm_ropes.contains_key(&id) => cx.rms_norm_rope(spec)?,
            Op::RmsNorm(spec) => cx.rms_norm(spec)?,
            Op::Rope(spec) => cx.rope(spec)?,
            Op::Attention(spec) => self.attention(&cx, spec, kv)?,
            Op::TakeRows => cx.take_rows()?,
            Op::Narrow {
                axis,
                start: s,
                len,
            } => cx.narrow(*axis, *s, *len)?,
            Op::Concat { axis } => cx.concat(*axis)?,
            Op::MatchRms { floor } => cx.match_rms(*floor)?,
            Op::GaussianTopK { std_multiplier } => cx.gaussian_topk(*std_multiplier)?,
            Op::BatchMatMul => cx.batch_matmul()?,
            Op::Moe { top_k } => self.moe(n, *top_k, &dims, out)?,
        }
        Ok(())
    }

    /// A product with one or more weights (after an optional norm): the
    /// 8-bit decode kernels for a few rows, cuBLAS for many.
    fn matmul(&self, cx: &Cx, norm: &Option<NormSpec>) -> Result<(), CudaError> {
        let k = &self.device.kernels;
        let kin = *cx.in_dims(0).last().expect("rank");
        let m = cx.in_dims(0).iter().product::<usize>() / kin;
        let total = *cx.dims.last().expect("rank");
        let weights_of = self.mm_weights(cx.id)?;
        // Up to MMV_ROWS rows (decode): each weight read once for all
        // of them, straight into registers. `q8` plans quantize the
        // activations once for every weight of the node: in the
        // kernel before it where that has been folded in (a
        // `Prologue`), in the norm kernel where the node has a norm
        // and no float weights (those read the f32 activations),
        // else on their own.
        let pre = self.prologue_operand(cx.id, cx.b)?;
        let (pre_q8, pre16) = match pre {
            Some(Operand::Q8 { qs, qd }) => (Some((qs, qd)), None),
            Some(Operand::Bf16(p)) => (None, Some(p)),
            None => (None, None),
        };
        let small = pre_q8.is_some()
            || (pre16.is_none()
                && m <= MMV_ROWS
                && !self.takes_mmq(m, kin, &weights_of)
                && kin.is_multiple_of(32)
                && cx.inp(0).is_multiple_of(16)
                && weights_of.iter().all(|w| w.1 % 16 == 0));
        let q8 = pre_q8.or_else(|| {
            self.act_q
                .as_ref()
                .filter(|_| small && weights_of.iter().any(|w| !is_float(w.3)))
                .map(|buf| {
                    let base = self.device.ptr(buf);
                    (base, base + act_q_bytes(m, kin).0 as u64)
                })
        });
        let fused = pre.is_none()
            && q8.is_some()
            && norm.is_some()
            && weights_of.iter().all(|w| !is_float(w.3));
        // Many rows of whole units over bf16 operands (the tensor cores or
        // cuBLAS): the activations are read as bf16 only, so a norm writes
        // them so.
        let gemm = self.gemm.as_ref().filter(|_| m > 1);
        let x16 = match gemm {
            Some(GemmScratch { x16: Some(b), .. }) if !small && kin.is_multiple_of(32) => {
                Some(self.device.ptr(b))
            }
            _ => None,
        };
        let mut x = cx.inp(0);
        let mut normed16 = false;
        if let Some(spec) = norm.filter(|_| pre.is_none()) {
            let gamma = if spec.has_gamma { cx.inp(1) } else { 0 };
            let (kernel, y, yd) = match (q8, x16) {
                (Some((xq, xd)), _) if fused => (&k.rms_norm_q8, xq, xd),
                (_, Some(y16)) => (&k.rms_norm_bf16, y16, 0),
                _ => (&k.rms_norm, self.device.ptr(&self.norm_buf), 0),
            };
            let mut args = vec![Arg::Ptr(x), Arg::Ptr(gamma), Arg::Ptr(y)];
            if fused {
                args.push(Arg::Ptr(yd));
            }
            args.extend([Arg::I32(kin as i32), Arg::F32(spec.eps)]);
            self.launch(kernel, norm_rows(m, kin), &args)?;
            normed16 = !fused && x16.is_some();
            if !fused && !normed16 {
                x = y;
            }
        }
        if small {
            let (xq, xd) = q8.unwrap_or((0, 0));
            if q8.is_some() && !fused && pre.is_none() {
                self.launch(
                    &k.quantize_q8,
                    linear(m * kin),
                    &[
                        Arg::Ptr(x),
                        Arg::Ptr(xq),
                        Arg::Ptr(xd),
                        Arg::I64((m * kin / 32) as i64),
                    ],
                )?;
            }
            let variant = match q8 {
                Some(_) => mmvq_variant(kin / 32, m > 1),
                None => usize::from(m > 1),
            };
            // Runs of up to three weights of one type, one launch each.
            let mut off = 0;
            for r in weight_runs(&weights_of) {
                self.launch_reading(
                    &k.mmv[r.code as usize][variant],
                    grid(r.rows.div_ceil(MMV_WARPS), 1, 32 * MMV_WARPS as u32),
                    &r.args(
                        &[Arg::Ptr(x), Arg::Ptr(xq), Arg::Ptr(xd), Arg::Ptr(cx.out)],
                        m,
                        kin,
                        total,
                        off,
                    ),
                    r.bytes(kin),
                )?;
                off += r.rows;
            }
            return Ok(());
        }
        // Many rows: the activations once as bf16 for bf16 products, then
        // up to MMQ_ROWS rows on the tensor cores straight from the
        // weights' blocks, more through cuBLAS on weight rows dequantized
        // a chunk at a time.
        let mut gx = x;
        if let Some(GemmScratch { x16: Some(x16), .. }) = gemm {
            gx = self.device.ptr(x16);
            if !normed16 && pre16.is_none() {
                self.launch(
                    &k.to_bf16,
                    linear(m * kin),
                    &[Arg::Ptr(x), Arg::Ptr(gx), Arg::I64((m * kin) as i64)],
                )?;
            }
        }
        if let Some(part) = gemm
            .and_then(|gs| gs.part.as_ref())
            .filter(|_| self.takes_mmq(m, kin, &weights_of))
        {
            return self.mmq(cx, &weights_of, gx, self.device.ptr(part), m, kin, total);
        }
        let mut off = 0;
        for &(code, ptr, rows, ty) in &weights_of {
            // f32 weights go to an f32 product as they are; others
            // are dequantized a chunk of whole 32-element units at
            // a time.
            let direct = ty == GgmlType::F32 && gemm.is_some_and(|gs| gs.ty == GemmType::F32);
            if let Some(gs) = gemm.filter(|_| direct || kin.is_multiple_of(32)) {
                let row_bytes = kin / ty.block_elems() * ty.block_bytes();
                if direct {
                    self.device.gemm(
                        gs.ty,
                        ptr,
                        gx,
                        cx.out + 4 * off as u64,
                        m,
                        rows,
                        kin,
                        total,
                    )?;
                    off += rows;
                    continue;
                }
                let chunk = (gs.elems / kin).max(1);
                let scratch = self.device.ptr(&gs.weights);
                for r0 in (0..rows).step_by(chunk) {
                    let nr = chunk.min(rows - r0);
                    self.launch_reading(
                        &k.dequant[code as usize],
                        linear(nr * kin / 32),
                        &[
                            Arg::Ptr(ptr + (r0 * row_bytes) as u64),
                            Arg::Ptr(scratch),
                            Arg::I64(nr as i64),
                            Arg::I32(kin as i32),
                            Arg::I32((gs.ty == GemmType::BF16) as i32),
                        ],
                        (nr * row_bytes) as u64,
                    )?;
                    self.device.gemm(
                        gs.ty,
                        scratch,
                        gx,
                        cx.out + 4 * (off + r0) as u64,
                        m,
                        nr,
                        kin,
                        total,
                    )?;
                }
                off += rows;
                continue;
            }
            // Without cuBLAS, and for float rows of other lengths:
            // the weights read once per 8 tokens, one warp per row.
            self.launch(
                &k.matmul[code as usize],
                grid(rows.div_ceil(4), m.div_ceil(8), 128),
                &[
                    Arg::Ptr(ptr),
                    Arg::Ptr(x),
                    Arg::Ptr(cx.out),
                    Arg::I32(m as i32),
                    Arg::I32(rows as i32),
                    Arg::I32(kin as i32),
                    Arg::I32(total as i32),
                    Arg::I32(off as i32),
                ],
            )?;
            off += rows;
        }
        Ok(())
    }

    /// Whether a product of `m` rows of `kin` over `weights` runs on the
    /// tensor cores (`q8` plans with cuBLAS scratch on compute capability
    /// 8.0 on, [`MMQ_MIN_ROWS`] to [`MMQ_ROWS`] rows, whole units, 16-byte
    /// aligned weights).
    fn takes_mmq(&self, m: usize, kin: usize, weights: &[(u32, u64, usize, GgmlType)]) -> bool {
        self.device.mma
            && self.gemm.as_ref().is_some_and(|gs| gs.part.is_some())
            && (MMQ_MIN_ROWS..=MMQ_ROWS).contains(&m)
            && kin.is_multiple_of(32)
            && weights.iter().all(|w| w.1 % 16 == 0)
    }

    /// A product of `m` (up to [`MMQ_ROWS`]) bf16 activation rows at `x`
    /// on the tensor cores: runs of up to three weights of one type a
    /// launch, k cut into shares where the weights alone would leave the
    /// GPU idle (partial sums in `part`, added in order by `mmq_sum`).
    #[allow(clippy::too_many_arguments)]
    fn mmq(
        &self,
        cx: &Cx,
        weights_of: &[(u32, u64, usize, GgmlType)],
        x: u64,
        part: u64,
        m: usize,
        kin: usize,
        total: usize,
    ) -> Result<(), CudaError> {
        let k = &self.device.kernels;
        let variant = mmq_variant(m);
        let mut off = 0;
        for r in weight_runs(weights_of) {
            let (shares, per) = mmq_shares(r.rows, kin / 32, self.device.sms);
            self.launch_reading(
                &k.mmq[r.code as usize][variant],
                grid(r.rows.div_ceil(MMQ_BLOCK_ROWS), shares, 128),
                &[
                    r.args(
                        &[Arg::Ptr(x), Arg::Ptr(cx.out), Arg::Ptr(part)],
                        m,
                        kin,
                        total,
                        off,
                    ),
                    vec![Arg::I32(per as i32)],
                ]
                .concat(),
                r.bytes(kin),
            )?;
            if shares > 1 {
                self.launch(
                    &k.mmq_sum,
                    linear(m * r.rows),
                    &[
                        Arg::Ptr(part),
                        Arg::Ptr(cx.out),
                        Arg::I32(m as i32),
                        Arg::I32(r.rows as i32),
                        Arg::I32(shares as i32),
                        Arg::I32(total as i32),
                        Arg::I32(off as i32),
                    ],
                )?;
            }
            off += r.rows;
        }
        Ok(())
    }

    /// Attention over K/V inputs or the pool, split over the context when
    /// the step has too few queries to fill the GPU.
    fn attention(
        &self,
        cx: &Cx,
        spec: &AttentionSpec,
        kv: Option<&KvCtx>,
    ) -> Result<(), CudaError> {
        let k = &self.device.kernels;
        let ml = self.meta_layout;
        let qd = cx.in_dims(0);
        let (nq, hq) = (qd[0], qd[1]);
        let (hkv, head_dim) = match spec.kv {
            KvSource::Inputs => (cx.in_dims(1)[1], cx.in_dims(1)[2].max(cx.in_dims(2)[2])),
            KvSource::Cache(slot) => {
                let kv = kv.ok_or(RunError::NoCache)?;
                let l = kv.pool.owner(slot)?.1;
                (l.kv_heads, l.head_dim.max(l.v_head_dim))
            }
        };
        let gq = attention_group(hq / hkv.max(1), head_dim);
        let blocks = nq * hq / gq;
        // The product after it may take its output as 8-bit blocks.
        let (xq, xd, x16) = match cx.folded {
            Some(Operand::Q8 { qs, qd }) => (qs, qd, 0),
            Some(Operand::Bf16(p)) => (0, 0, p),
            None => (0, 0, 0),
        };
        // Over the pool, a few queries split their context.
        let (splits, part, done) = match (&spec.kv, &self.attn_splits) {
            (KvSource::Cache(_), Some(a)) => (
                attention_splits(blocks, nq * hq, self.device.sms),
                self.device.ptr(&a.part),
                self.device.ptr(&a.done),
            ),
            _ => (1, 0, 0),
        };
        let (mask, window) = match spec.mask {
            Mask::Causal => (0, 0),
            Mask::Sliding { window } => (1, window),
            Mask::Full => (2, 0),
            Mask::Symmetric { half_width } => (3, half_width),
        };
        let tail = [
            Arg::F32(spec.scale),
            Arg::F32(spec.softcap.unwrap_or(0.0)),
            Arg::I32(mask),
            Arg::I32(window.min(i32::MAX as usize) as i32),
        ];
        // The kernel and its arguments before the shared tail.
        let (f, args) = match spec.kv {
            KvSource::Inputs => {
                let (kd, vd) = (cx.in_dims(1), cx.in_dims(2));
                let args = vec![
                    Arg::Ptr(cx.inp(0)),
                    Arg::Ptr(cx.inp(1)),
                    Arg::Ptr(cx.inp(2)),
                    Arg::I32(kd[0] as i32),
                    Arg::I32(nq as i32),
                    Arg::Ptr(cx.out),
                    Arg::Ptr(xq),
                    Arg::Ptr(xd),
                    Arg::Ptr(x16),
                    Arg::I32(hq as i32),
                    Arg::I32(kd[1] as i32),
                    Arg::I32(kd[2] as i32),
                    Arg::I32(vd[2] as i32),
                    Arg::I32(gq as i32),
                ];
                (&k.attention_inputs, args)
            }
            KvSource::Cache(slot) => {
                let kv = kv.ok_or(RunError::NoCache)?;
                let (group, l) = kv.layer(slot)?;
                let (_, lspec) = kv.pool.owner(slot)?;
                let args = vec![
                    Arg::Ptr(cx.inp(0)),
                    Arg::Ptr(l.k),
                    Arg::Ptr(l.v),
                    Arg::Ptr(self.meta_addr(ml.input(StepInput::Pos))),
                    Arg::Ptr(self.meta_addr(ml.run_of_row())),
                    Arg::Ptr(self.meta_addr(ml.run_end())),
                    Arg::Ptr(self.meta_addr(ml.block_start(group))),
                    Arg::Ptr(self.meta_addr(ml.table())),
                    // Span ids of the queries and of the listed
                    // blocks' rows, where the attention reads them.
                    Arg::Ptr(if spec.bidirectional_spans {
                        cx.inp(2)
                    } else {
                        0
                    }),
                    Arg::Ptr(if spec.bidirectional_spans {
                        self.meta_addr(ml.spans())
                    } else {
                        0
                    }),
                    Arg::Ptr(cx.out),
                    Arg::Ptr(xq),
                    Arg::Ptr(xd),
                    Arg::Ptr(x16),
                    Arg::Ptr(part),
                    Arg::Ptr(done),
                    Arg::I32(hq as i32),
                    Arg::I32(lspec.kv_heads as i32),
                    Arg::I32(lspec.head_dim as i32),
                    Arg::I32(lspec.v_head_dim as i32),
                    Arg::I32(gq as i32),
                ];
                let f = &k.attention[super::attention_index(l.types.k, l.types.v)];
                (f, args)
            }
        };
        let args: Vec<Arg> = args.into_iter().chain(tail).collect();
        self.launch(f, grid(blocks, splits, 128), &args)?;
        Ok(())
    }

    /// The launch of a [`HeadPrep`].
    fn head_prep(&self, p: &HeadPrep, b: &Bindings, kv: Option<&KvCtx>) -> Result<(), CudaError> {
        let g = &self.graph_ir;
        let kv = kv.ok_or(RunError::NoCache)?;
        let Op::KvWrite { slot } = g.node(p.write).op else {
            unreachable!("found as a K/V write")
        };
        let (group, l) = kv.layer(slot)?;
        let qd = g.node(p.q_rope).shape.resolve(b).expect("bound");
        let kd = g.node(p.k_rope).shape.resolve(b).expect("bound");
        let (rows, hq, hd, hkv) = (qd[0], qd[1], qd[2], kd[1]);
        if l.k_width != hkv * hd || l.v_width != hkv * hd {
            return Err(node_err(
                g,
                p.write,
                format!(
                    "K/V rows of {} and {} elements for {hkv} heads of {hd}",
                    l.k_width, l.v_width
                ),
            )
            .into());
        }
        // x, gamma, whether normed, eps of a part whose input is `x` unless
        // `norm` is there.
        let part = |norm: Option<NodeId>, x: NodeId| -> [Arg; 4] {
            match norm {
                Some(n) => {
                    let Op::RmsNorm(spec) = &g.node(n).op else {
                        unreachable!("found as a norm")
                    };
                    let inputs = &g.node(n).inputs;
                    let gamma = if spec.has_gamma {
                        self.addr(inputs[1])
                    } else {
                        0
                    };
                    [
                        Arg::Ptr(self.addr(inputs[0])),
                        Arg::Ptr(gamma),
                        Arg::I32(1),
                        Arg::F32(spec.eps),
                    ]
                }
                None => [
                    Arg::Ptr(self.addr(x)),
                    Arg::Ptr(0),
                    Arg::I32(0),
                    Arg::F32(0.0),
                ],
            }
        };
        let rope = |r: NodeId| -> [Arg; 3] {
            let Op::Rope(spec) = &g.node(r).op else {
                unreachable!("found as a rope")
            };
            [
                Arg::Ptr(self.addr(g.node(r).inputs[1])),
                Arg::Ptr(self.device.ptr(&self.rope_tables[&r])),
                Arg::I32(spec.n_rot as i32),
            ]
        };
        let mut args = Vec::with_capacity(28);
        args.extend(part(p.q_norm, g.node(p.q_rope).inputs[0]));
        args.extend(rope(p.q_rope));
        args.push(Arg::Ptr(self.addr(p.q_rope)));
        args.extend(part(p.k_norm, g.node(p.k_rope).inputs[0]));
        args.extend(rope(p.k_rope));
        args.extend(part(p.v_norm, g.node(p.write).inputs[1]));
        // Each part's row stride: a batched step reads its rows in place
        // in the product's output, rows of q, k and v apart.
        let stride = |norm: Option<NodeId>, x: NodeId, heads: usize| {
            let x = norm.map_or(x, |n| g.node(n).inputs[0]);
            Arg::I32(self.row_stride(x).unwrap_or(heads * hd) as i32)
        };
        args.extend([
            Arg::Ptr(l.k),
            Arg::Ptr(l.v),
            Arg::Ptr(self.meta_addr(self.meta_layout.write_rows(group))),
            Arg::I32(kv_code(l.types.k) as i32),
            Arg::I32(kv_code(l.types.v) as i32),
            Arg::I32(hq as i32),
            Arg::I32(hkv as i32),
            Arg::I32(hd as i32),
            stride(p.q_norm, g.node(p.q_rope).inputs[0], hq),
            stride(p.k_norm, g.node(p.k_rope).inputs[0], hkv),
            stride(p.v_norm, g.node(p.write).inputs[1], hkv),
        ]);
        self.launch(
            &self.device.kernels.head_prep,
            norm_rows(rows * (hq + 2 * hkv), hd),
            &args,
        )
    }

    /// A mixture-of-experts step: route on the device, list each expert's
    /// slots, then the chosen experts' products over their slots only.
    fn moe(
        &self,
        n: &rlx_ir::Node,
        top_k: usize,
        dims: &[usize],
        out: u64,
    ) -> Result<(), CudaError> {
        let g = &self.graph_ir;
        let k = &self.device.kernels;
        let m = self.moe.as_ref().expect("sized at compile");
        let at = |offset: usize| self.device.ptr(&m.buf) + 4 * offset as u64;
        let z = m.sizes;
        let fixed = |i: usize| -> Vec<usize> {
            g.node(n.inputs[i])
                .shape
                .0
                .iter()
                .map(|d| d.fixed().expect("weights are fixed"))
                .collect()
        };
        let gu = fixed(2);
        let (experts, ff, d) = (gu[0], gu[1] / 2, gu[2]);
        let tokens = dims[0];
        let slots = tokens * top_k;
        let (gu_code, gu_ptr) = weight_of(g, &self.weights, n.inputs[2])?;
        let (down_code, down_ptr) = weight_of(g, &self.weights, n.inputs[3])?;
        let inp = |i: usize| self.addr(n.inputs[i]);
        self.launch(
            &k.moe_route,
            linear(tokens),
            &[
                Arg::Ptr(inp(1)),
                Arg::Ptr(inp(4)),
                Arg::Ptr(at(z.sel())),
                Arg::Ptr(at(z.wts())),
                Arg::I32(tokens as i32),
                Arg::I32(experts as i32),
                Arg::I32(top_k as i32),
            ],
        )?;
        self.launch(
            &k.moe_lists,
            linear(experts),
            &[
                Arg::Ptr(at(z.sel())),
                Arg::I32(slots as i32),
                Arg::I32(experts as i32),
                Arg::I32(z.cap as i32),
                Arg::Ptr(at(z.list())),
                Arg::Ptr(at(z.count())),
            ],
        )?;
        // Each chosen expert's `rows` rows (of k) against the activation
        // row `slot / x_div` of each of its slots.
        let expert_rows = |w: u64, code: u32, x: u64, y: u64, rows: usize, kin: usize, x_div| {
            self.launch(
                &k.moe_rows[code as usize],
                grid(rows.div_ceil(4), experts, 128),
                &[
                    Arg::Ptr(w),
                    Arg::Ptr(x),
                    Arg::Ptr(y),
                    Arg::Ptr(at(z.list())),
                    Arg::Ptr(at(z.count())),
                    Arg::I32(z.cap as i32),
                    Arg::I32(rows as i32),
                    Arg::I32(kin as i32),
                    Arg::I32(x_div as i32),
                ],
            )
        };
        expert_rows(gu_ptr, gu_code, inp(0), at(z.gate_up()), 2 * ff, d, top_k)?;
        self.launch(
            &k.moe_geglu,
            linear(slots * ff),
            &[
                Arg::Ptr(at(z.gate_up())),
                Arg::Ptr(at(z.act())),
                Arg::I64(slots as i64),
                Arg::I32(ff as i32),
            ],
        )?;
        expert_rows(down_ptr, down_code, at(z.act()), at(z.down()), d, ff, 1)?;
        self.launch(
            &k.moe_combine,
            linear(tokens * d),
            &[
                Arg::Ptr(at(z.down())),
                Arg::Ptr(at(z.sel())),
                Arg::Ptr(at(z.wts())),
                Arg::Ptr(out),
                Arg::I32(tokens as i32),
                Arg::I32(d as i32),
                Arg::I32(top_k as i32),
            ],
        )?;
        Ok(())
    }

    /// A readable listing: each step's op, shape and device buffer range.
    pub fn dump(&self) -> String {
        let g = &self.graph_ir;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "plan: {} steps on {} ({}), arena {} bytes, step metadata {} bytes (up to {} rows), {} captured graphs{}",
            self.steps.len(),
            self.device.label(),
            self.device.name(),
            self.arena.len() * 4,
            self.meta.len() * 4,
            self.meta_layout.rows,
            self.captured.len(),
            match &self.gemm {
                Some(g) => format!(
                    ", cuBLAS {:?} products (scratch {} weight elements)",
                    g.ty, g.elems
                ),
                None => String::new(),
            }
        );
        dump_steps(&mut s, g, &self.steps, &self.locs);
        s
    }
}
