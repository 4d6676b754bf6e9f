//! Attention over cached or given K/V, grouped-query heads read in place.
//!
//! Flash-attention style: a job is one KV head and a block of queries (all
//! the query heads that share that KV head), so each K and V row is read once
//! per block. It walks the visible keys [`KEYS`] rows at a time: a block of
//! scores `S = Q·Kᵀ` from register tiles, the mask, the online softmax
//! (running max and sum, earlier output rescaled when the max grows), then
//! `O += P·V` into a row tile that stays in L1. Key blocks that no query of
//! the block can see are skipped from their positions alone; rows may be in
//! any order (a sliding layer's cache is a ring), so the per-block position
//! ranges decide, and only blocks seen whole skip the per-key mask. With few
//! jobs and many keys (decode) a job's keys are split over the threads and
//! the parts merged at the end. An f16 cache is read in place by decode
//! (converted as it is loaded) and widened a block at a time for prefill.

mod avx2;
mod avx512;
mod neon;
mod scalar;
mod simd;
#[cfg(test)]
mod tests;

use std::ops::Range;

use half::slice::HalfFloatSliceExt;
use rlx_ir::Mask;

use crate::cpu::features::Isa;
use crate::cpu::kernels::elementwise::exp_f32;
use crate::cpu::kv::RowsView;
use crate::cpu::matmul::dequantize_blocks;
use crate::cpu::pool::ThreadPool;
use crate::cpu::SharedMut;

/// Keys and values with the token position of each row.
pub struct KvRows<'a> {
    pub k: RowsView<'a>,
    pub v: RowsView<'a>,
    /// Position of each row; −1 marks an empty row.
    pub pos: &'a [i64],
    /// Bidirectional span id of each row (0 = none).
    pub span: &'a [i32],
    pub kv_heads: usize,
    pub head_dim: usize,
    pub v_head_dim: usize,
}

/// The queries of one sequence and the key blocks ([`KEYS`] rows each) it
/// may read: a batch of several sequences is one call with a segment each.
#[derive(Clone, Debug)]
pub struct Segment<'a> {
    pub queries: Range<usize>,
    /// Indices of the sequence's key blocks; `None`: every block.
    pub blocks: Option<&'a [u32]>,
}

impl Segment<'static> {
    /// Queries `0..n` over every key block: a call with one sequence.
    pub fn all(n: usize) -> [Segment<'static>; 1] {
        [Segment {
            queries: 0..n,
            blocks: None,
        }]
    }
}

/// Queries `[n, q_heads, head_dim]` with their positions (and span ids).
pub struct Queries<'a> {
    pub q: &'a [f32],
    pub pos: &'a [i64],
    pub span: Option<&'a [i32]>,
    pub heads: usize,
}

/// Whether a query at `qp` (span `qs`) may see a key at `kp` (span `ks`).
#[inline]
pub fn visible(mask: Mask, qp: i64, kp: i64, qs: i32, ks: i32) -> bool {
    if qs != 0 && qs == ks {
        return true;
    }
    match mask {
        Mask::Causal => kp <= qp,
        Mask::Sliding { window } => kp <= qp && qp - kp < window as i64,
        Mask::Full => true,
        Mask::Symmetric { half_width } => (qp - kp).abs() <= half_width as i64,
    }
}

/// The attention parameters the kernel needs.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    pub mask: Mask,
    pub scale: f32,
    pub softcap: Option<f32>,
    /// Whether a decode job's keys may be split over the threads. The merge
    /// of the parts sums in another order than one pass, and whether a job
    /// is split depends on how many jobs the step has: without splits a
    /// row's output does not depend on the other rows of the step.
    pub split_keys: bool,
}

/// Key rows per block: the width of a score tile and of the mask bits, and
/// the rows of a K/V pool block.
pub const KEYS: usize = 32;
const _: () = assert!(KEYS == crate::kv::BLOCK_TOKENS);
/// Query rows (queries × heads of a group) a job aims for: each K and V row
/// read serves this many rows; at head size 256 the query tile (32 KiB) still
/// stays in L1 next to the 4 key rows a score tile reads. On Gemma 3 270M
/// prefill 16 was about 10 % slower and 64 no faster.
const TARGET_ROWS: usize = 32;
/// The fewest key blocks worth a part of their own when a job's keys are
/// split (256 keys, about 20 µs at head size 256): handing a part to another
/// thread costs a few microseconds. At 8 a full 512-key sliding window of
/// Gemma 3 270M decodes in two parts: 72 → 44 µs per layer in the kernel
/// bench, where 32 left it on one thread.
const MIN_SPLIT_BLOCKS: usize = 8;

/// `(q, rows, hd, k, k_stride, nk, scale, s)`: see [`Tiles::scores`].
type ScoresFn = unsafe fn(&[f32], usize, usize, &[f32], usize, usize, f32, &mut [f32]);
/// `(s, rows, nk, masks, m, l, alpha)`: see [`Tiles::softmax`].
type SoftmaxFn = unsafe fn(&mut [f32], usize, usize, &[u32], &mut [f32], &mut [f32], &mut [f32]);
/// `(p, rows, nk, v, v_stride, hdv, alpha, o)`: see [`Tiles::pv`].
type PvFn = unsafe fn(&[f32], usize, usize, &[f32], usize, usize, &[f32], &mut [f32]);
/// [`ScoresFn`] with f16 keys.
type ScoresF16Fn = unsafe fn(&[f32], usize, usize, &[u16], usize, usize, f32, &mut [f32]);
/// [`PvFn`] with f16 values.
type PvF16Fn = unsafe fn(&[f32], usize, usize, &[u16], usize, usize, &[f32], &mut [f32]);

/// The per-instruction-set tile kernels. Rows of the query, score and
/// output tiles come in a multiple of 4 (or are 1 or 2 rows in all); score
/// rows are [`KEYS`] apart.
#[derive(Clone, Copy)]
struct Tiles {
    /// `s[r·KEYS + j] = scale · q_r · k_j` for rows `r < rows` of `q` (`hd`
    /// apart) and keys `j < nk` of `k` (`k_stride` apart); entries up to the
    /// next multiple of the tile width may be overwritten.
    scores: ScoresFn,
    /// `scores` reading f16 keys in place, widening them as they are loaded.
    scores_f16: ScoresF16Fn,
    /// Online softmax over the `nk` scores of each row where the row's mask
    /// bit is set: updates the running max `m` and sum `l`, leaves in `alpha`
    /// the factor the earlier output must be scaled by, and turns the scores
    /// into weights (0 where masked).
    softmax: SoftmaxFn,
    /// `o[r·hdv + c] = alpha[r]·o[r·hdv + c] + Σ_j p[r·KEYS + j]·v[j·v_stride + c]`.
    pv: PvFn,
    /// `pv` reading f16 values in place.
    pv_f16: PvF16Fn,
    /// f16 bits to f32.
    widen_f16: unsafe fn(&[u16], &mut [f32]),
    /// bf16 bits to f32.
    widen_bf16: unsafe fn(&[u16], &mut [f32]),
    /// The instruction set they are compiled for (block K/V rows are
    /// dequantized with its kernels).
    isa: Isa,
}

impl Tiles {
    /// The kernels for `isa`, lowered to what this CPU supports.
    fn new(isa: Isa) -> Tiles {
        match isa.min(Isa::detect()) {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => avx512::TILES,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => avx2::TILES,
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => neon::TILES,
            _ => scalar::TILES,
        }
    }
}

/// `out[i, h] = Σ_t softmax_t(softcap(scale·q·k_t) + mask) · v_t` with query
/// head `h` reading KV head `h / (q_heads / kv_heads)`. The heads sharing a
/// KV head are done together, so each K and V row is read once per block of
/// queries. A query that sees no key gets zeros. Each segment's queries
/// see only its key blocks. `isa` is lowered to what the CPU supports.
pub fn attention(
    pool: &ThreadPool,
    isa: Isa,
    p: Params,
    q: &Queries,
    kv: &KvRows,
    segments: &[Segment],
    out: &mut [f32],
) {
    let n = q.pos.len();
    if n == 0 {
        return;
    }
    let shape = Shape {
        group: q.heads / kv.kv_heads,
        hq: q.heads,
        hd: kv.head_dim,
        hdv: kv.v_head_dim,
    };
    assert!(
        q.heads.is_multiple_of(kv.kv_heads),
        "query heads must be a multiple of KV heads"
    );
    assert!(q.q.len() >= n * shape.hq * shape.hd && out.len() >= n * shape.hq * shape.hdv);
    let threads = if p.split_keys { pool.threads() } else { 1 };
    let plan = JobPlan::new(p.mask, q, kv, segments, threads);
    let tiles = Tiles::new(isa);
    let slot_len = plan.rows_pad * (2 + shape.hdv);
    let mut parts = vec![0f32; plan.partials * slot_len];
    {
        let out = SharedMut::new(out);
        let parts = SharedMut::new(&mut parts);
        pool.for_each(plan.tasks.len(), &|t| {
            let task = &plan.tasks[t];
            let queries = plan.qblocks[task.qb].clone();
            let mut job = Job::new(&shape, queries.len());
            let blocks = &plan.active[task.blocks.clone()];
            job.run(&tiles, p, q, kv, task.g, queries.clone(), blocks);
            match task.slot {
                None => {
                    let width = shape.group * shape.hdv;
                    for li in 0..queries.len() {
                        let start =
                            ((queries.start + li) * shape.hq + task.g * shape.group) * shape.hdv;
                        // SAFETY: a query's heads of one KV head belong to one
                        // job, and a job without a split is one task.
                        job.write_rows(li * shape.group, unsafe { out.slice(start, width) });
                    }
                }
                // SAFETY: every split task has a slot of its own.
                Some(slot) => job.save(
                    unsafe { parts.slice(slot * slot_len, slot_len) },
                    plan.rows_pad,
                ),
            }
        });
    }
    for merge in &plan.merges {
        let queries = plan.qblocks[merge.qb].clone();
        let slots: Vec<&[f32]> = merge
            .slots
            .clone()
            .map(|s| &parts[s * slot_len..][..slot_len])
            .collect();
        for li in 0..queries.len() {
            for j in 0..shape.group {
                let h = merge.g * shape.group + j;
                let dst =
                    &mut out[((queries.start + li) * shape.hq + h) * shape.hdv..][..shape.hdv];
                merge_row(&slots, plan.rows_pad, li * shape.group + j, dst);
            }
        }
    }
}

/// Head counts and sizes.
struct Shape {
    /// Query heads per KV head.
    group: usize,
    hq: usize,
    hd: usize,
    hdv: usize,
}

/// One task: KV head `g`, query block `qb`, a range of that block's active
/// key blocks, and where its result goes.
struct Task {
    g: usize,
    qb: usize,
    blocks: Range<usize>,
    /// Slot for the partial result when the job's keys are split.
    slot: Option<usize>,
}

/// A split job: the slots of its parts, merged after the tasks.
struct Merge {
    g: usize,
    qb: usize,
    slots: Range<usize>,
}

/// A key block a query block must visit.
#[derive(Clone, Copy)]
struct ActiveBlock {
    index: u32,
    /// Every row is non-empty and visible to every query: no per-key mask.
    whole: bool,
}

/// Position range and contents of one block of key rows.
struct KeyBlock {
    index: u32,
    min: i64,
    max: i64,
    has_empty: bool,
    has_span: bool,
}

/// The block structure of one call: query blocks, the key blocks each must
/// visit, and the tasks in the order they should start (longest first, so
/// the pool's dynamic claiming balances causal masks).
struct JobPlan {
    /// Query rows of each query block (within one segment).
    qblocks: Vec<Range<usize>>,
    /// Query rows of a full block, padded for the tiles.
    rows_pad: usize,
    /// Active key blocks of every query block, one block after the other.
    active: Vec<ActiveBlock>,
    tasks: Vec<Task>,
    merges: Vec<Merge>,
    partials: usize,
}

impl JobPlan {
    fn new(mask: Mask, q: &Queries, kv: &KvRows, segments: &[Segment], threads: usize) -> JobPlan {
        let group = q.heads / kv.kv_heads;
        let longest = segments.iter().map(|s| s.queries.len()).max().unwrap_or(1);
        let queries_per_block = (TARGET_ROWS / group).clamp(1, longest.max(1));
        let mut qblocks = Vec::new();
        let mut active = Vec::new();
        let mut ranges = Vec::new();
        for seg in segments {
            let key_blocks = key_blocks(kv.pos, kv.span, seg.blocks);
            let mut i0 = seg.queries.start;
            while i0 < seg.queries.end {
                let i = i0..(i0 + queries_per_block).min(seg.queries.end);
                i0 = i.end;
                let pos = &q.pos[i.clone()];
                let qrange = (
                    pos.iter().copied().min().unwrap_or(0),
                    pos.iter().copied().max().unwrap_or(0),
                );
                let q_span = q.span.is_some_and(|s| s[i.clone()].iter().any(|&s| s != 0));
                let start = active.len();
                for kb in &key_blocks {
                    let (none, all) = cover(mask, qrange, (kb.min, kb.max));
                    // A shared span can open keys the mask hides.
                    if none && !(q_span && kb.has_span) {
                        continue;
                    }
                    active.push(ActiveBlock {
                        index: kb.index,
                        whole: all && !kb.has_empty,
                    });
                }
                ranges.push(start..active.len());
                qblocks.push(i);
            }
        }
        let n_qb = qblocks.len();
        // Few jobs (decode): split each job's keys so every thread has work.
        let jobs = kv.kv_heads * n_qb;
        let wanted = if threads > 1 && jobs < 2 * threads {
            (2 * threads).div_ceil(jobs)
        } else {
            1
        };
        let (mut tasks, mut merges, mut partials) = (Vec::new(), Vec::new(), 0);
        for (qb, range) in ranges.into_iter().enumerate() {
            let splits = wanted.min(range.len() / MIN_SPLIT_BLOCKS).max(1);
            for g in 0..kv.kv_heads {
                if splits == 1 {
                    tasks.push(Task {
                        g,
                        qb,
                        blocks: range.clone(),
                        slot: None,
                    });
                    continue;
                }
                let (first, len) = (partials, range.len());
                for s in 0..splits {
                    tasks.push(Task {
                        g,
                        qb,
                        blocks: range.start + s * len / splits
                            ..range.start + (s + 1) * len / splits,
                        slot: Some(partials),
                    });
                    partials += 1;
                }
                merges.push(Merge {
                    g,
                    qb,
                    slots: first..partials,
                });
            }
        }
        tasks.sort_by_key(|t| std::cmp::Reverse(t.blocks.len()));
        JobPlan {
            qblocks,
            rows_pad: padded_rows(queries_per_block * group),
            active,
            tasks,
            merges,
            partials,
        }
    }
}

/// The blocks of [`KEYS`] rows (all, or those listed) that hold at least
/// one non-empty row.
fn key_blocks(pos: &[i64], span: &[i32], listed: Option<&[u32]>) -> Vec<KeyBlock> {
    let rows = pos.len();
    let summary = |b: usize| {
        let t = b * KEYS..((b + 1) * KEYS).min(rows);
        let mut kb = KeyBlock {
            index: b as u32,
            min: i64::MAX,
            max: i64::MIN,
            has_empty: false,
            has_span: false,
        };
        for (&p, &s) in pos[t.clone()].iter().zip(&span[t]) {
            if p < 0 {
                kb.has_empty = true;
                continue;
            }
            kb.min = kb.min.min(p);
            kb.max = kb.max.max(p);
            kb.has_span |= s != 0;
        }
        (kb.min <= kb.max).then_some(kb)
    };
    match listed {
        Some(list) => list.iter().filter_map(|&b| summary(b as usize)).collect(),
        None => (0..rows.div_ceil(KEYS)).filter_map(summary).collect(),
    }
}

/// Rows of a tile: a multiple of 4 from 3 rows on, else 1 or 2.
fn padded_rows(rows: usize) -> usize {
    if rows >= 3 {
        rows.next_multiple_of(4)
    } else {
        rows
    }
}

/// Whether queries at positions `q` (inclusive range) see none of the keys at
/// positions `k`, and whether they see all of them, by the mask alone.
fn cover(mask: Mask, (qmin, qmax): (i64, i64), (kmin, kmax): (i64, i64)) -> (bool, bool) {
    match mask {
        Mask::Causal => (kmin > qmax, kmax <= qmin),
        Mask::Sliding { window } => {
            let w = window as i64;
            (
                kmin > qmax || qmin - kmax >= w,
                kmax <= qmin && qmax - kmin < w,
            )
        }
        Mask::Full => (false, true),
        Mask::Symmetric { half_width } => {
            let hw = half_width as i64;
            (
                qmin - kmax > hw || kmin - qmax > hw,
                (qmax - kmin).abs().max((qmin - kmax).abs()) <= hw,
            )
        }
    }
}

/// The tiles and running softmax state of one task.
struct Job {
    group: usize,
    hd: usize,
    hdv: usize,
    /// Query rows: queries × heads of the group.
    rows: usize,
    /// `rows` rounded up for the tiles; the extra rows stay zero.
    rows_pad: usize,
    /// Query rows copied (and padded) when they are not adjacent in the input.
    q: Vec<f32>,
    o: Vec<f32>,
    s: Vec<f32>,
    m: Vec<f32>,
    l: Vec<f32>,
    alpha: Vec<f32>,
    masks: Vec<u32>,
    /// Key and value rows of one block widened from f16/bf16.
    k_tile: Vec<f32>,
    v_tile: Vec<f32>,
}

impl Job {
    fn new(shape: &Shape, queries: usize) -> Job {
        let rows = queries * shape.group;
        let rows_pad = padded_rows(rows);
        Job {
            group: shape.group,
            hd: shape.hd,
            hdv: shape.hdv,
            rows,
            rows_pad,
            q: Vec::new(),
            o: vec![0.0; rows_pad * shape.hdv],
            s: vec![0.0; rows_pad * KEYS],
            m: vec![f32::NEG_INFINITY; rows_pad],
            l: vec![0.0; rows_pad],
            alpha: vec![0.0; rows_pad],
            masks: vec![0; rows_pad],
            k_tile: Vec::new(),
            v_tile: Vec::new(),
        }
    }

    /// Walks `blocks` of keys for KV head `g` and the queries `queries`.
    /// Tile row `li·group + j` is query `queries.start + li`, head
    /// `g·group + j`.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &mut self,
        tiles: &Tiles,
        p: Params,
        q: &Queries,
        kv: &KvRows,
        g: usize,
        queries: Range<usize>,
        blocks: &[ActiveBlock],
    ) {
        let (group, hd, hdv, rows_pad) = (self.group, self.hd, self.hdv, self.rows_pad);
        // The heads of a query are adjacent, so with one KV head the block's
        // rows are one run of the input.
        let width = group * hd;
        let q_tile: &[f32] = if group == q.heads && self.rows == rows_pad {
            &q.q[queries.start * width..queries.end * width]
        } else {
            self.q = vec![0.0; rows_pad * hd];
            for (li, dst) in self
                .q
                .chunks_exact_mut(width)
                .take(queries.len())
                .enumerate()
            {
                let start = ((queries.start + li) * q.heads + g * group) * hd;
                dst.copy_from_slice(&q.q[start..start + width]);
            }
            &self.q
        };
        let qpos = &q.pos[queries.clone()];
        let qspan = q.span.map(|s| &s[queries]);
        let n_rows = kv.pos.len();
        // With one row tile (decode) each K and V element is used once, so
        // f16 rows are read where they lie and widened as they are loaded;
        // with more, widening a block once into a tile is cheaper.
        let in_place = rows_pad <= 4;
        for b in blocks {
            let mut t0 = b.index as usize * KEYS;
            let mut nk = KEYS.min(n_rows - t0);
            if b.whole {
                let all = if nk == KEYS {
                    u32::MAX
                } else {
                    (1u32 << nk) - 1
                };
                self.masks[..self.rows].fill(all);
            } else {
                let mut seen_by_any = 0u32;
                for (li, masks) in self.masks[..self.rows].chunks_exact_mut(group).enumerate() {
                    let qs = qspan.map_or(0, |s| s[li]);
                    let bits = (0..nk).fold(0u32, |bits, j| {
                        let kp = kv.pos[t0 + j];
                        let seen = kp >= 0 && visible(p.mask, qpos[li], kp, qs, kv.span[t0 + j]);
                        bits | (seen as u32) << j
                    });
                    masks.fill(bits);
                    seen_by_any |= bits;
                }
                if seen_by_any == 0 {
                    continue;
                }
                // Only the keys from the first to the last that any query sees
                // (the diagonal block of a causal mask is half masked).
                let first = seen_by_any.trailing_zeros();
                nk = (32 - seen_by_any.leading_zeros() - first) as usize;
                t0 += first as usize;
                for bits in &mut self.masks[..self.rows] {
                    *bits >>= first;
                }
            }
            let k = block_rows(
                kv.k,
                tiles,
                t0,
                nk,
                g,
                hd,
                kv.kv_heads,
                in_place,
                &mut self.k_tile,
            );
            // SAFETY: `Tiles::new` only hands out kernels this CPU supports.
            unsafe {
                match k {
                    Block::F32(k, stride) => {
                        (tiles.scores)(q_tile, rows_pad, hd, k, stride, nk, p.scale, &mut self.s)
                    }
                    Block::F16(k, stride) => (tiles.scores_f16)(
                        q_tile,
                        rows_pad,
                        hd,
                        k,
                        stride,
                        nk,
                        p.scale,
                        &mut self.s,
                    ),
                }
            };
            if let Some(c) = p.softcap {
                for row in self.s[..self.rows * KEYS].chunks_exact_mut(KEYS) {
                    for s in &mut row[..nk] {
                        *s = (*s / c).tanh() * c;
                    }
                }
            }
            // SAFETY: as above.
            unsafe {
                (tiles.softmax)(
                    &mut self.s,
                    rows_pad,
                    nk,
                    &self.masks,
                    &mut self.m,
                    &mut self.l,
                    &mut self.alpha,
                )
            };
            let v = block_rows(
                kv.v,
                tiles,
                t0,
                nk,
                g,
                hdv,
                kv.kv_heads,
                in_place,
                &mut self.v_tile,
            );
            let (s, alpha, o) = (&self.s, &self.alpha, &mut self.o);
            // SAFETY: as above.
            unsafe {
                match v {
                    Block::F32(v, stride) => (tiles.pv)(s, rows_pad, nk, v, stride, hdv, alpha, o),
                    Block::F16(v, stride) => {
                        (tiles.pv_f16)(s, rows_pad, nk, v, stride, hdv, alpha, o)
                    }
                }
            };
        }
    }

    /// Rows `first ..` divided by their sums into `out` (as many rows as it
    /// holds); rows that saw nothing are zeros.
    fn write_rows(&self, first: usize, out: &mut [f32]) {
        let rows = self.o[first * self.hdv..]
            .chunks_exact(self.hdv)
            .zip(&self.l[first..]);
        for (dst, (o, &l)) in out.chunks_exact_mut(self.hdv).zip(rows) {
            let inv = if l > 0.0 { 1.0 / l } else { 0.0 };
            for (d, &x) in dst.iter_mut().zip(o) {
                *d = x * inv;
            }
        }
    }

    /// Running maxima, sums and unnormalised rows into `slot`: `slot_rows`
    /// maxima, then as many sums, then the rows, for [`merge_row`].
    fn save(&self, slot: &mut [f32], slot_rows: usize) {
        let (m, rest) = slot.split_at_mut(slot_rows);
        let (l, o) = rest.split_at_mut(slot_rows);
        m[..self.rows_pad].copy_from_slice(&self.m);
        l[..self.rows_pad].copy_from_slice(&self.l);
        o[..self.o.len()].copy_from_slice(&self.o);
    }
}

/// Key or value rows of one block as a tile kernel reads them: the data and
/// the distance between rows.
enum Block<'a> {
    F32(&'a [f32], usize),
    F16(&'a [u16], usize),
}

/// Rows `t0 .. t0 + nk` of KV head `g`: in place (`heads·dim` apart) for f32
/// storage, and for f16 when `in_place`; otherwise widened or dequantized
/// into `tile` (`dim` apart).
#[allow(clippy::too_many_arguments)]
fn block_rows<'a>(
    view: RowsView<'a>,
    tiles: &Tiles,
    t0: usize,
    nk: usize,
    g: usize,
    dim: usize,
    heads: usize,
    in_place: bool,
    tile: &'a mut Vec<f32>,
) -> Block<'a> {
    let stride = heads * dim;
    let start = (t0 * heads + g) * dim;
    let span = (nk - 1) * stride + dim;
    let (bits, widen): (&[u16], _) = match view {
        RowsView::F32(v) => return Block::F32(&v[start..start + span], stride),
        RowsView::F16(v) if in_place => {
            return Block::F16(&v.reinterpret_cast()[start..start + span], stride)
        }
        RowsView::F16(v) => (v.reinterpret_cast(), tiles.widen_f16),
        RowsView::BF16(v) => (v.reinterpret_cast(), tiles.widen_bf16),
        RowsView::Blocks(ty, v) => {
            // Each head's row is whole blocks (the pool's config checks).
            let bytes = |e: usize| e / ty.block_elems() * ty.block_bytes();
            tile.resize(nk * dim, 0.0);
            for (j, dst) in tile.chunks_exact_mut(dim).enumerate() {
                let at = start + j * stride;
                dequantize_blocks(ty, tiles.isa, &v[bytes(at)..bytes(at + dim)], dst);
            }
            return Block::F32(&tile[..], dim);
        }
    };
    tile.resize(nk * dim, 0.0);
    for (j, dst) in tile.chunks_exact_mut(dim).enumerate() {
        // SAFETY: `Tiles::new` only hands out kernels this CPU supports.
        unsafe { widen(&bits[start + j * stride..][..dim], dst) };
    }
    Block::F32(&tile[..], dim)
}

/// Row `r` of a split job from its parts' slots (laid out by [`Job::save`]):
/// `Σ_s e^(m_s − m)·O_s / Σ_s e^(m_s − m)·l_s` with `m` the largest `m_s`.
fn merge_row(slots: &[&[f32]], slot_rows: usize, r: usize, dst: &mut [f32]) {
    let m = slots.iter().map(|s| s[r]).fold(f32::NEG_INFINITY, f32::max);
    dst.fill(0.0);
    if m == f32::NEG_INFINITY {
        return;
    }
    let hdv = dst.len();
    let mut l = 0f32;
    for slot in slots.iter().filter(|s| s[r] > f32::NEG_INFINITY) {
        let w = exp_f32(slot[r] - m);
        l += w * slot[slot_rows + r];
        for (d, &x) in dst.iter_mut().zip(&slot[2 * slot_rows + r * hdv..][..hdv]) {
            *d += w * x;
        }
    }
    let inv = 1.0 / l;
    for d in dst {
        *d *= inv;
    }
}
