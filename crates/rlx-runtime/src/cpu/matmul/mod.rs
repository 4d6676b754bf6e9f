//! `y = x · Wᵀ` against weights that stay in their packed GGUF block format.
//!
//! Two precisions:
//!
//! * [`Precision::Exact`]: the weights are exactly `rlx_gguf::dequantize`'s
//!   f32 values and the products and sums are f32. Each task dequantizes a tile
//!   of weight rows once into a per-thread buffer (F32 weights are read in
//!   place) and reuses it for all `m` activation rows; with `m = 1`,
//!   Q4_0/Q5_0/Q8_0/Q4_K/Q6_K skip the tile and dequantize each block in
//!   registers (AVX-512). Either way dots accumulate in fixed lanes — 8 for
//!   [`Isa::Scalar`], 4×4 for [`Isa::Neon`], 4×8 for [`Isa::Avx2`], 4×16
//!   for [`Isa::Avx512`] (with `m ≥ 2` AVX-512 uses 1×16 and NEON 1×4 per
//!   output, so 4 weight rows × 6 activation rows fit the registers),
//!   element `i` going to lane
//!   `i mod width` — then add the lanes as a pairwise tree (each dot kernel
//!   documents its exact order,
//!   tail included), so a given ISA always gives the same bits.
//! * [`Precision::Quantized`]: llama.cpp's CPU scheme. `x` is quantized once per
//!   call into each activation format the weights need (Q8_0 for Q4_0, Q5_0,
//!   Q8_0, IQ4_NL, MXFP4; Q8_1 for Q4_1, Q5_1; Q8_K for Q2_K..Q6_K, IQ4_XS),
//!   shared by every weight of that format, and every output is an integer dot
//!   product scaled in f32 (the K-quants' blocks scaled and added as the
//!   reference does on every instruction set, so their dots have its bits;
//!   scalar reference kernels for all of these, AVX2
//!   for all, AVX-512 VNNI for Q8_0, Q4_0, Q5_0 (4 weight rows × 4 activation
//!   rows per register tile), Q4_K and Q6_K, NEON (with `SDOT` where the
//!   CPU has it) for all). With enough rows (16, or 128 where panel kernels
//!   exist) on AVX-512 VNNI or ARM's i8mm, every format with an affine code
//!   form (Q4_0..Q8_0, Q2_K..Q6_K, IQ4_NL) runs as a blocked GEMM instead
//!   (see `gemm`), with Q8_0 activations for all of them. Weight types without a quantized kernel (F32, F16,
//!   BF16, the IQ1/IQ2/IQ3 codebooks, TQ*, NVFP4, Q1_0, Q2_0, Q8_1, Q8_K, the
//!   integer and F64 types) use the Exact path instead.
//!
//! Work is split by output column (weight row, counted across all weights) into
//! contiguous chunks, a few per thread; each task writes its columns of `y` for
//! all `m` rows. `kernels` is the one place that picks functions for a
//! (type, ISA) pair.

mod act;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_fused;
#[cfg(target_arch = "x86_64")]
mod choice;
mod dequant;
mod exact;
mod f32_tile;
mod formats;
mod gemm;
#[cfg(target_arch = "x86_64")]
mod int8_rows;
mod kernels;
#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "aarch64")]
mod neon_gemm;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod rows;
mod scalar;
#[cfg(target_arch = "x86_64")]
mod vnni_panel;
#[cfg(target_arch = "x86_64")]
mod x86_gemm;

use std::ops::Range;
use std::sync::Mutex;

use rlx_gguf::GgmlType;

use super::features::Isa;
use super::pool::{split_range, ThreadPool};
use act::ActFormat;
use kernels::{QuantDot, RowKernel};

/// `rows` rows of `k` elements in GGUF row-major packed blocks:
/// `data.len() == rows * k / ty.block_elems() * ty.block_bytes()`.
#[derive(Clone, Copy, Debug)]
pub struct WeightMatrix<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub k: usize,
    pub data: &'a [u8],
}

pub use crate::compile::Precision;

#[derive(Clone, Copy, Debug)]
pub struct MatmulOptions {
    pub precision: Precision,
    /// Highest instruction set the kernels may use; must not exceed
    /// [`Isa::detect`].
    pub isa: Isa,
    /// Every activation row through the row kernels, whatever `m` is, so a
    /// row's result does not depend on what else is in the call (the GEMM
    /// and panel kernels, chosen by row count, sum in another order).
    pub batch_invariant: bool,
    /// Types whose decode kernels take a lower instruction set than `isa`
    /// (measured faster on this CPU; the same bits).
    pub rows: RowChoice,
}

#[cfg(target_arch = "x86_64")]
pub use choice::RowChoice;

/// Where there is nothing to choose: every type's widest decode kernels.
#[cfg(not(target_arch = "x86_64"))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RowChoice;

#[cfg(not(target_arch = "x86_64"))]
impl RowChoice {
    pub const WIDEST: RowChoice = RowChoice;
    pub fn isa_for(&self, _ty: GgmlType, isa: Isa) -> Isa {
        isa
    }
    pub fn measure(_isa: Isa) -> RowChoice {
        RowChoice
    }
}

#[cfg(not(target_arch = "x86_64"))]
impl std::fmt::Display for RowChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("widest")
    }
}

/// Buffers reused across calls; they grow to the largest call and never shrink.
#[derive(Default)]
pub struct MatmulScratch {
    /// Quantized activations, one buffer per [`ActFormat`].
    acts: [Vec<u8>; ActFormat::COUNT],
    /// Dequantized weight tiles, one per concurrently running task.
    tiles: Mutex<Vec<Vec<f32>>>,
    /// Q8_0 activations transposed for the panel kernels.
    act_panels: act::ActPanels,
    /// Prefill GEMM: activations in tile order and per-task weight panels.
    gemm_acts: gemm::PackedActs,
    panels: Mutex<Vec<gemm::PanelScratch>>,
}

/// Why [`matmul`] refused a call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MatmulError {
    #[error("x has {actual} values, expected m * k = {m} * {k} = {expected}")]
    XLength {
        m: usize,
        k: usize,
        expected: usize,
        actual: usize,
    },
    #[error("y has {actual} values, expected m * Σrows = {m} * {cols} = {expected}")]
    YLength {
        m: usize,
        cols: usize,
        expected: usize,
        actual: usize,
    },
    #[error("weight {index} has k = {k}, but weight 0 has k = {expected}")]
    KMismatch {
        index: usize,
        k: usize,
        expected: usize,
    },
    #[error("weight {index} ({ty}): k = {k} is not a multiple of its {block}-element block")]
    PartialBlock {
        index: usize,
        ty: GgmlType,
        k: usize,
        block: usize,
    },
    #[error("weight {index} ({ty}, {rows} x {k}) has {actual} bytes, expected {expected}")]
    WeightBytes {
        index: usize,
        ty: GgmlType,
        rows: usize,
        k: usize,
        expected: usize,
        actual: usize,
    },
    #[error("weight {index}: type {ty} cannot be dequantized")]
    UnsupportedType { index: usize, ty: GgmlType },
    #[error("matmul sizes overflow usize: m = {m}, k = {k}, columns = {cols}")]
    Overflow { m: usize, k: usize, cols: usize },
    #[error("ISA {requested} requested, but this CPU supports at most {available}")]
    IsaUnsupported { requested: Isa, available: Isa },
}

/// Dequantizes whole blocks of `ty` into `dst` (`rlx_gguf::dequantize`'s
/// values, bit for bit) with the fastest kernel for the type up to `isa`
/// (lowered to what this CPU has).
pub(crate) fn dequantize_blocks(ty: GgmlType, isa: Isa, src: &[u8], dst: &mut [f32]) {
    // SAFETY: `dequant` hands out kernels of the ISA asked for, which is at
    // most what this CPU has.
    unsafe { kernels::dequant(ty, isa.min(Isa::detect())).apply(src, dst) }
}

/// The activation format [`Precision::Quantized`] pairs with weights of type
/// `ty` (`Q8_0`, `Q8_1` or `Q8_K`), or `None` if `ty` has no quantized kernel
/// and runs on the Exact path.
pub fn activation_type(ty: GgmlType) -> Option<GgmlType> {
    kernels::quant_dot(ty, Isa::Scalar).map(|(fmt, _)| fmt.ty())
}

/// Whether [`Precision::Quantized`] calls with many activation rows run as
/// the blocked GEMM at `isa` on this CPU (it needs AVX2, or ARM's dot
/// product).
pub fn has_prefill_gemm(isa: Isa) -> bool {
    gemm::shape(isa).is_some()
}

/// `y[m, Σ rowsᵢ]` (row-major) `= x[m, k] · [W₁; W₂; …]ᵀ`: column block `i` of
/// `y` is `x · Wᵢᵀ`. Every weight has the same `k`; `x.len() == m * k` and
/// `y.len() == m * Σ rowsᵢ`.
///
/// With [`Precision::Quantized`], `x` is quantized once per activation format
/// and shared by every weight of that format (a fused Q5_0 + Q8_0 call
/// quantizes to Q8_0 once); weights with no quantized kernel use the Exact
/// path. Each output depends only on its weight row, `x` and the options, not
/// on the thread count or the other weights in the call.
///
/// Fails, without touching `y`, on inconsistent sizes or if `opts.isa`
/// exceeds [`Isa::detect`].
pub fn matmul(
    pool: &ThreadPool,
    opts: &MatmulOptions,
    x: &[f32],
    m: usize,
    weights: &[WeightMatrix],
    y: &mut [f32],
    scratch: &mut MatmulScratch,
) -> Result<(), MatmulError> {
    let available = Isa::detect();
    if opts.isa > available {
        return Err(MatmulError::IsaUnsupported {
            requested: opts.isa,
            available,
        });
    }
    let (k, n_cols) = check_shapes(x, m, weights, y)?;
    if m == 0 || n_cols == 0 {
        return Ok(());
    }

    // Each weight goes through the GEMM or the row/panel kernels by its
    // type and the row count.
    let (gemm_segments, segments): (Vec<Segment>, Vec<Segment>) = plan(opts, weights)
        .into_iter()
        .partition(|s| !opts.batch_invariant && gemm::applies(opts, s, m));
    if !gemm_segments.is_empty() {
        let q8 = &mut scratch.acts[ActFormat::Q8_0.index()];
        act::quantize_rows(pool, opts.isa, ActFormat::Q8_0, x, m, k, q8);
        let shape = gemm::shape(opts.isa).expect("applies() found a shape");
        gemm::pack_acts(pool, q8, m, k, shape, &mut scratch.gemm_acts);
        gemm::run(
            pool,
            opts.isa,
            m,
            k,
            n_cols,
            &gemm_segments,
            &scratch.gemm_acts,
            y,
            &scratch.panels,
        );
    }
    if segments.is_empty() {
        return Ok(());
    }
    for fmt in ActFormat::ALL {
        if segments.iter().any(|s| s.kernel.act_format() == Some(fmt)) {
            act::quantize_rows(pool, opts.isa, fmt, x, m, k, &mut scratch.acts[fmt.index()]);
        }
    }

    let panels = !opts.batch_invariant
        && m >= kernels::PANEL_MIN_ROWS
        && segments.iter().any(|s| {
            matches!(
                s.kernel,
                RowKernel::Quant {
                    dot: QuantDot::Rows { panel: Some(_), .. },
                    ..
                }
            )
        });
    if panels {
        let fmt = ActFormat::Q8_0;
        let acts = &scratch.acts[fmt.index()];
        act::pack_panels(acts, m, fmt.row_bytes(k), k / 32, &mut scratch.act_panels);
    }
    let n_tasks = task_count(pool, n_cols);
    let bounds = (0..=n_tasks)
        .map(|t| split_range(n_cols, n_tasks, t).start)
        .collect();
    let out = SharedOutput::with_bounds(y, m, n_cols, bounds);
    let job = Job {
        x,
        k,
        acts: &scratch.acts,
        panels: panels.then_some(&scratch.act_panels),
        segments: &segments,
        dot_f32: kernels::f32_dot(opts.isa),
        dot_f32_tile: kernels::f32_dot_tile(opts.isa),
        tiles: &scratch.tiles,
    };
    pool.for_each(n_tasks, &|t| {
        let (cols, mut rows) = out.claim(t);
        job.run(cols, &mut rows);
    });
    Ok(())
}

/// Checks every length and returns `(k, Σ rows)`.
fn check_shapes(
    x: &[f32],
    m: usize,
    weights: &[WeightMatrix],
    y: &[f32],
) -> Result<(usize, usize), MatmulError> {
    let k = weights.first().map_or(0, |w| w.k);
    let mut cols = 0usize;
    for (index, w) in weights.iter().enumerate() {
        let ty = w.ty;
        if w.k != k {
            return Err(MatmulError::KMismatch {
                index,
                k: w.k,
                expected: k,
            });
        }
        if !rlx_gguf::quant::can_dequantize(ty) {
            return Err(MatmulError::UnsupportedType { index, ty });
        }
        let block = ty.block_elems();
        if !k.is_multiple_of(block) {
            return Err(MatmulError::PartialBlock {
                index,
                ty,
                k,
                block,
            });
        }
        let expected = (k / block)
            .checked_mul(ty.block_bytes())
            .and_then(|b| b.checked_mul(w.rows))
            .ok_or(MatmulError::Overflow { m, k, cols })?;
        if w.data.len() != expected {
            return Err(MatmulError::WeightBytes {
                index,
                ty,
                rows: w.rows,
                k,
                expected,
                actual: w.data.len(),
            });
        }
        cols = cols
            .checked_add(w.rows)
            .ok_or(MatmulError::Overflow { m, k, cols })?;
    }
    let overflow = MatmulError::Overflow { m, k, cols };
    if !weights.is_empty() {
        let expected = m.checked_mul(k).ok_or(overflow.clone())?;
        if x.len() != expected {
            return Err(MatmulError::XLength {
                m,
                k,
                expected,
                actual: x.len(),
            });
        }
    }
    let expected = m.checked_mul(cols).ok_or(overflow)?;
    if y.len() != expected {
        return Err(MatmulError::YLength {
            m,
            cols,
            expected,
            actual: y.len(),
        });
    }
    Ok((k, cols))
}

/// One weight and the columns of `y` it fills.
struct Segment<'a> {
    w: WeightMatrix<'a>,
    /// First column of `y` for row 0 of this weight.
    col0: usize,
    row_bytes: usize,
    kernel: RowKernel,
}

fn plan<'a>(opts: &MatmulOptions, weights: &[WeightMatrix<'a>]) -> Vec<Segment<'a>> {
    let mut col0 = 0;
    weights
        .iter()
        .map(|&w| {
            let s = Segment {
                w,
                col0,
                row_bytes: w.k / w.ty.block_elems() * w.ty.block_bytes(),
                kernel: kernels::row_kernel(
                    w.ty,
                    opts.precision,
                    opts.isa,
                    opts.rows.isa_for(w.ty, opts.isa),
                ),
            };
            col0 += w.rows;
            s
        })
        .collect()
}

/// A few chunks per thread so a slow thread doesn't hold up the rest.
fn task_count(pool: &ThreadPool, n_cols: usize) -> usize {
    match pool.threads() {
        1 => 1,
        t => (4 * t).min(n_cols),
    }
}

/// Bytes of packed weight rows a tile holds, so the tile stays in L2 while all
/// `m` activation rows pass over it.
const QUANT_TILE_BYTES: usize = 32 << 10;
/// Bytes of dequantized f32 rows per Exact tile.
const EXACT_TILE_BYTES: usize = 512 << 10;

/// Everything a task reads.
struct Job<'a> {
    x: &'a [f32],
    k: usize,
    acts: &'a [Vec<u8>; ActFormat::COUNT],
    /// The Q8_0 activations as panels, when the batch is large enough.
    panels: Option<&'a act::ActPanels>,
    segments: &'a [Segment<'a>],
    dot_f32: kernels::DotF32,
    dot_f32_tile: Option<kernels::DotF32Tile>,
    tiles: &'a Mutex<Vec<Vec<f32>>>,
}

impl Job<'_> {
    /// Fills columns `cols` of `y`; `rows[i]` is `y[i, cols]`.
    fn run(&self, cols: Range<usize>, rows: &mut [&mut [f32]]) {
        for s in self.segments {
            let start = cols.start.max(s.col0);
            let end = cols.end.min(s.col0 + s.w.rows);
            if start >= end {
                continue;
            }
            let local = start - s.col0..end - s.col0;
            let out0 = start - cols.start;
            match s.kernel {
                RowKernel::Quant { fmt, dot } => self.run_quant(s, fmt, dot, local, out0, rows),
                RowKernel::Exact {
                    fused: Some(fused), ..
                } if rows.len() == 1 => {
                    let w = &s.w.data[local.start * s.row_bytes..local.end * s.row_bytes];
                    let y = &mut rows[0][out0..out0 + local.len()];
                    // SAFETY: `kernels::row_kernel` picked this for `opts.isa`,
                    // which `matmul` checked.
                    unsafe { fused(w, s.row_bytes, self.x, y) };
                }
                RowKernel::Exact { dequant, .. } => self.run_exact(s, dequant, local, out0, rows),
            }
        }
    }

    fn run_quant(
        &self,
        s: &Segment,
        fmt: ActFormat,
        dot: QuantDot,
        local: Range<usize>,
        out0: usize,
        rows: &mut [&mut [f32]],
    ) {
        let act = &self.acts[fmt.index()];
        let act_row_bytes = fmt.row_bytes(self.k);
        let tile = (QUANT_TILE_BYTES / s.row_bytes.max(1)).max(1);
        for r0 in local.clone().step_by(tile) {
            let r1 = (r0 + tile).min(local.end);
            let o = out0 + r0 - local.start..out0 + r1 - local.start;
            match dot {
                QuantDot::Row(dot) => {
                    for (i, out) in rows.iter_mut().enumerate() {
                        let a = &act[i * act_row_bytes..(i + 1) * act_row_bytes];
                        for (r, y) in (r0..r1).zip(&mut out[o.clone()]) {
                            let w = &s.w.data[r * s.row_bytes..(r + 1) * s.row_bytes];
                            // SAFETY: `kernels::row_kernel` hands out a SIMD kernel
                            // only for `opts.isa`, and `matmul` checked
                            // `opts.isa <= Isa::detect()`.
                            *y = unsafe { dot(w, a) };
                        }
                    }
                }
                QuantDot::Rows { rows: dot, panel } => {
                    let w = &s.w.data[r0 * s.row_bytes..r1 * s.row_bytes];
                    match (panel, self.panels) {
                        // SAFETY: as above.
                        (Some(panel), Some(p)) => unsafe {
                            panel(w, s.row_bytes, p, rows, o.start)
                        },
                        // SAFETY: as above.
                        _ => unsafe { dot(w, s.row_bytes, act, act_row_bytes, rows, o.start) },
                    }
                }
            }
        }
    }

    fn run_exact(
        &self,
        s: &Segment,
        dequant: kernels::Dequant,
        local: Range<usize>,
        out0: usize,
        rows: &mut [&mut [f32]],
    ) {
        let k = self.k;
        let tile = (EXACT_TILE_BYTES / (4 * k).max(1)).max(1);
        let mut buf = self.take_tile();
        for r0 in local.clone().step_by(tile) {
            let r1 = (r0 + tile).min(local.end);
            let packed = &s.w.data[r0 * s.row_bytes..r1 * s.row_bytes];
            let wt: &[f32] = match exact::f32_in_place(s.w.ty, packed) {
                Some(w) => w,
                None => {
                    let dst = exact::aligned(&mut buf, (r1 - r0) * k);
                    // SAFETY: as for the quantized kernels, the dequantizer was
                    // picked for `opts.isa`, which `matmul` checked.
                    unsafe { dequant.apply(packed, dst) };
                    dst
                }
            };
            let o = out0 + r0 - local.start;
            match self.dot_f32_tile {
                // Register tiles for prefill; decode keeps `dot_f32`'s order.
                Some(tile) if rows.len() >= 2 && k > 0 => {
                    // SAFETY: `kernels::f32_dot_tile` picked this for
                    // `opts.isa`, which `matmul` checked.
                    unsafe { tile(&self.x[..rows.len() * k], wt, k, rows, o) };
                }
                _ => {
                    for (i, out) in rows.iter_mut().enumerate() {
                        let xi = &self.x[i * k..(i + 1) * k];
                        for r in 0..r1 - r0 {
                            let w = &wt[r * k..(r + 1) * k];
                            // SAFETY: `kernels::f32_dot` picked this for
                            // `opts.isa`, which `matmul` checked.
                            out[o + r] = unsafe { (self.dot_f32)(xi, w) };
                        }
                    }
                }
            }
        }
        self.tiles.lock().expect("tile pool").push(buf);
    }

    fn take_tile(&self) -> Vec<f32> {
        self.tiles
            .lock()
            .expect("tile pool")
            .pop()
            .unwrap_or_default()
    }
}

/// `y` shared by tasks that each write a disjoint band of columns.
struct SharedOutput<'a> {
    ptr: *mut f32,
    m: usize,
    /// Task `t` owns columns `bounds[t]..bounds[t + 1]`.
    bounds: Vec<usize>,
    claimed: Vec<std::sync::atomic::AtomicBool>,
    _y: std::marker::PhantomData<&'a mut [f32]>,
}

// SAFETY: the only access to `ptr` is through `claim`, which hands each task a
// disjoint set of slices (see there).
unsafe impl Sync for SharedOutput<'_> {}

impl<'a> SharedOutput<'a> {
    /// `bounds` must rise from 0 to `n_cols`; panics otherwise.
    fn with_bounds(y: &'a mut [f32], m: usize, n_cols: usize, bounds: Vec<usize>) -> Self {
        assert_eq!(y.len(), m * n_cols);
        assert!(bounds.first() == Some(&0) && bounds.last() == Some(&n_cols));
        assert!(bounds.windows(2).all(|w| w[0] <= w[1]));
        SharedOutput {
            ptr: y.as_mut_ptr(),
            m,
            claimed: (1..bounds.len()).map(|_| Default::default()).collect(),
            bounds,
            _y: std::marker::PhantomData,
        }
    }

    /// Task `t`'s columns and the row slices `y[i, cols]` for every row `i`.
    /// Panics if `t` is claimed twice.
    // Handing out `&mut` from `&self` is the point: the claim-once check and
    // the partition below keep the slices disjoint.
    #[allow(clippy::mut_from_ref)]
    fn claim(&self, t: usize) -> (Range<usize>, Vec<&mut [f32]>) {
        let already = self.claimed[t].swap(true, std::sync::atomic::Ordering::Relaxed);
        assert!(!already, "matmul task {t} claimed twice");
        let cols = self.bounds[t]..self.bounds[t + 1];
        let n_cols = *self.bounds.last().expect("bounds are non-empty");
        let rows = (0..self.m)
            .map(|i| {
                // SAFETY: `bounds` rises monotonically (checked in
                // `with_bounds`), so tasks' column ranges are disjoint, and
                // each task index is claimed at most once (checked above), so
                // no two live slices overlap; each lies inside row `i` of `y`,
                // which is `m * n_cols` long, and `y` stays mutably borrowed
                // for `'a`.
                unsafe {
                    std::slice::from_raw_parts_mut(
                        self.ptr.add(i * n_cols + cols.start),
                        cols.len(),
                    )
                }
            })
            .collect();
        (cols, rows)
    }
}
