//! Prefill matmul for the integer block formats: a blocked matrix-matrix
//! product for [`Precision::Quantized`] calls with many activation rows, on
//! AVX-512 VNNI (`vpdpbusd`, see `x86_gemm`), AVX2 (the same tile with
//! `vpmaddubsw`, for codes below 128) and on ARM's i8mm (`USMMLA`, see
//! `neon_gemm`) or dot product.
//!
//! * Activations are quantized once to Q8_0 (the same blocks the row kernels
//!   use) and laid out per tile of [`MT`] rows: for every word of
//!   consecutive elements (4 or 8, see [`Shape`]) the rows' bytes side by
//!   side, and per sub-block
//!   each row's scale `d` and `d·Σq`.
//! * Each task walks 16-row groups of weight rows. A group is decoded once
//!   per call into a panel (u8 codes, and per sub-block a scale and an offset
//!   per row, `kernels::affine`: the block formats' own decoders) that stays
//!   in cache while every
//!   activation tile passes over it. The packed GGUF weights are not copied
//!   anywhere else.
//!
//! Both instruction sets multiply unsigned codes by signed activation bytes
//! into exact 32-bit sums, and scale them with the same fused operations, so
//! an output has the same bits on either.
//!
//! Each output's arithmetic (sub-blocks in order, see `x86_gemm`) depends
//! only on its weight row and activation row, so results don't depend on the
//! thread count, the tile an activation row falls in, or the other weights of
//! a fused call.
//!
//! [`Precision::Quantized`]: super::Precision::Quantized

use std::sync::Mutex;

use rlx_gguf::quant::{affine_max_code, affine_sub_block};

use super::super::features::{has_avx512_vnni, has_neon_dotprod, has_neon_i8mm, Isa};
use super::super::pool::{split_range, ThreadPool};
use super::kernels::{affine, AffineFn, QuantDot, RowKernel};
use super::{MatmulOptions, Precision, Segment, SharedOutput};

/// Weight rows per panel: one per lane of a zmm register.
pub(super) const LANES: usize = 16;
/// Bytes of a panel sub-block after its codes: 16 f32 scales, 16 f32 offsets.
pub(super) const PANEL_FACTORS: usize = 2 * LANES * 4;
/// Activation rows per register tile. AVX-512: two panels × 6 rows of int
/// and f32 sums fill 24 of the 32 zmm registers. ARM: half a panel × 4 rows
/// of int and f32 sums fill 16 of the 32 vector registers.
const MT: usize = if cfg!(target_arch = "aarch64") { 4 } else { 6 };

/// How a tile's instruction takes its operands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Shape {
    /// Consecutive codes of one row kept together in the panels and the
    /// activation tiles: what the instruction takes of a row.
    pub word: usize,
    /// A tile's activation rows are laid out in a multiple of this (zero
    /// rows after the last): the rows one instruction takes together.
    pub pad: usize,
    /// The largest weight code the instruction reads as it is.
    pub max_code: u8,
}

/// `vpdpbusd`: a row's 4 u8 codes against 4 i8 broadcast to every lane.
pub(super) const VNNI: Shape = Shape {
    word: 4,
    pad: 1,
    max_code: 255,
};
/// `USMMLA`: 2 rows × 8 u8 codes against 2 rows × 8 i8.
pub(super) const MMLA: Shape = Shape {
    word: 8,
    pad: 2,
    max_code: 255,
};
/// AVX2's `vpmaddubsw` + `vpmaddwd`: as [`VNNI`], for codes that cannot
/// saturate the pairwise i16 sums (below 128: not Q8_0, IQ4_NL).
pub(super) const AVX2: Shape = Shape {
    word: 4,
    pad: 1,
    max_code: 127,
};
/// Indexed `SDOT`: a row's 4 codes against 4 i8, four activation rows'
/// words in one register. Signed × signed, so codes above 127 (Q8_0,
/// IQ4_NL) cannot take it.
pub(super) const SDOT: Shape = Shape {
    word: 4,
    pad: 4,
    max_code: 127,
};

/// The GEMM's tile shape at `isa` on this CPU, if it runs there: the
/// matrix instruction where the CPU has it (AVX-512 VNNI; ARM's i8mm, else
/// its dot product).
pub(super) fn shape(isa: Isa) -> Option<Shape> {
    if cfg!(target_arch = "x86_64") && isa >= Isa::Avx512 && has_avx512_vnni() {
        Some(VNNI)
    } else if cfg!(target_arch = "x86_64") && isa >= Isa::Avx2 {
        Some(AVX2)
    } else if cfg!(target_arch = "aarch64") && isa == Isa::Neon && has_neon_i8mm() {
        Some(MMLA)
    } else if cfg!(target_arch = "aarch64") && isa == Isa::Neon && has_neon_dotprod() {
        Some(SDOT)
    } else {
        None
    }
}

impl Shape {
    /// Rows a tile of `mt` activation rows is laid out with.
    fn laid_rows(self, mt: usize) -> usize {
        mt.next_multiple_of(self.pad)
    }
}
/// Rows from which a weight with only row kernels (the K-quants; on ARM
/// every type) goes through the GEMM: decoding its panels costs about a
/// dozen rows of row-kernel work. `matmul_bench` on AVX-512, 2 threads,
/// GFLOP/s of Q4_K 640×1024 and Q6_K 640×2048: 16 rows 199 and 175 through
/// the GEMM against 156 and 168, 32 rows 358 and 329 against 143 and 164.
/// ARM takes the same threshold untimed (no ARM machine here): `USMMLA`
/// does twice the products of `SDOT` per instruction, so the GEMM's lead
/// there should be no smaller.
pub(super) const MIN_ROWS: usize = 16;
/// Rows from which a weight that has panel kernels (Q4_0, Q5_0, Q8_0) goes
/// through the GEMM: at 64 rows the panels ran at 526–661 GFLOP/s against
/// 228–412, at 128 the two were even (498–745 against 462–620).
pub(super) const MIN_ROWS_PANELS: usize = 128;

/// Whether [`run`] handles a weight at `m` activation rows.
pub(super) fn applies(opts: &MatmulOptions, s: &Segment, m: usize) -> bool {
    let panels = matches!(
        s.kernel,
        RowKernel::Quant {
            dot: QuantDot::Rows { panel: Some(_), .. },
            ..
        }
    );
    m >= if panels { MIN_ROWS_PANELS } else { MIN_ROWS }
        && opts.precision == Precision::Quantized
        && affine(s.w.ty, opts.isa).is_some()
        && shape(opts.isa)
            .is_some_and(|sh| affine_max_code(s.w.ty).is_some_and(|c| c <= sh.max_code))
}

/// Activations in tile order; see the module docs.
#[derive(Default)]
pub(super) struct PackedActs {
    /// The tile shape they are laid out for.
    shape: Shape,
    codes: Vec<i8>,
    /// Per sub-block scales and scaled sums, for 16- and 32-element sub-blocks.
    ds: [Vec<f32>; 2],
}

/// Per-task buffers for one panel.
#[derive(Default)]
pub(super) struct PanelScratch {
    codes: Vec<u8>,
    scale: Vec<f32>,
    offset: Vec<f32>,
    panel: Vec<u8>,
}

/// Index into [`PackedActs::ds`] for a sub-block size.
fn ds_index(sub: usize) -> usize {
    usize::from(sub == 32)
}

/// Lays out Q8_0 activation rows (`m` rows of `k`) in tile order for
/// `shape`.
pub(super) fn pack_acts(
    pool: &ThreadPool,
    q8: &[u8],
    m: usize,
    k: usize,
    shape: Shape,
    out: &mut PackedActs,
) {
    const Q8_0: usize = 34;
    let word = shape.word;
    out.shape = shape;
    let row_bytes = k / 32 * Q8_0;
    let tiles = m.div_ceil(MT);
    // Whole tiles, so a last tile's partner row has room.
    out.codes.resize(tiles * MT * k, 0);
    for (sub, ds) in [16usize, 32].into_iter().zip(out.ds.iter_mut()) {
        ds.resize(2 * tiles * MT * (k / sub), 0.0);
    }
    // Tile t owns rows t·MT.. of every buffer; hand out disjoint bands.
    let mut codes: Vec<Mutex<&mut [i8]>> = Vec::with_capacity(tiles);
    let mut ds16: Vec<Mutex<&mut [f32]>> = Vec::with_capacity(tiles);
    let mut ds32: Vec<Mutex<&mut [f32]>> = Vec::with_capacity(tiles);
    let [d16, d32] = &mut out.ds;
    for ((c, a), b) in out
        .codes
        .chunks_mut(MT * k)
        .zip(d16.chunks_mut(MT * 2 * (k / 16)))
        .zip(d32.chunks_mut(MT * 2 * (k / 32)))
    {
        codes.push(Mutex::new(c));
        ds16.push(Mutex::new(a));
        ds32.push(Mutex::new(b));
    }
    pool.for_each(tiles, &|t| {
        let mt = MT.min(m - t * MT);
        let lr = shape.laid_rows(mt);
        let mut codes = codes[t].lock().expect("tile lock");
        let mut d16 = ds16[t].lock().expect("tile lock");
        let mut d32 = ds32[t].lock().expect("tile lock");
        // A partner row (past `mt`) is blocks of zeros with scale 0.
        let zeros = [0u8; Q8_0];
        for i in 0..lr {
            let row = (i < mt).then(|| &q8[(t * MT + i) * row_bytes..][..row_bytes]);
            for b in 0..k / 32 {
                let blk = row.map_or(&zeros[..], |r| &r[b * Q8_0..(b + 1) * Q8_0]);
                let d = half::f16::from_le_bytes([blk[0], blk[1]]).to_f32();
                let q = &blk[2..];
                for (w, bytes) in q.chunks_exact(word).enumerate() {
                    let dst = ((b * (32 / word) + w) * lr + i) * word;
                    for (c, &v) in codes[dst..dst + word].iter_mut().zip(bytes) {
                        *c = v as i8;
                    }
                }
                let sum = |r: &[u8]| r.iter().fold(0i32, |a, &v| a + i32::from(v as i8)) as f32;
                let (s0, s1) = (sum(&q[..16]), sum(&q[16..]));
                d32[(2 * b) * lr + i] = d;
                d32[(2 * b + 1) * lr + i] = d * (s0 + s1);
                for (h, s) in [s0, s1].into_iter().enumerate() {
                    let sb = 2 * b + h;
                    d16[(2 * sb) * lr + i] = d;
                    d16[(2 * sb + 1) * lr + i] = d * s;
                }
            }
        }
    });
}

/// `y = x · Wᵀ` for every segment, from activations packed by [`pack_acts`];
/// `y` has `n_cols` columns, of which the segments' are written.
#[allow(clippy::too_many_arguments)]
pub(super) fn run(
    pool: &ThreadPool,
    isa: Isa,
    m: usize,
    k: usize,
    n_cols: usize,
    segments: &[Segment],
    acts: &PackedActs,
    y: &mut [f32],
    scratch: &Mutex<Vec<PanelScratch>>,
) {
    // Every 16-row group of every segment, in column order.
    let groups: Vec<(usize, usize)> = segments
        .iter()
        .enumerate()
        .flat_map(|(si, s)| (0..s.w.rows.div_ceil(LANES)).map(move |g| (si, g * LANES)))
        .collect();
    let n_tasks = (4 * pool.threads()).min(groups.len());
    let bounds: Vec<usize> = (0..=n_tasks)
        .map(|t| {
            let first = split_range(groups.len(), n_tasks, t.min(n_tasks - 1));
            match t {
                0 => 0,
                t if t == n_tasks => n_cols,
                _ => {
                    let (si, r0) = groups[first.start];
                    segments[si].col0 + r0
                }
            }
        })
        .collect();
    let out = SharedOutput::with_bounds(y, m, n_cols, bounds);
    let decoders: Vec<AffineFn> = segments
        .iter()
        .map(|s| affine(s.w.ty, isa).expect("applies() checked the type"))
        .collect();
    pool.for_each(n_tasks, &|t| {
        let (cols, mut rows) = out.claim(t);
        let mut bufs = {
            let mut pool = scratch.lock().expect("panel pool");
            [
                pool.pop().unwrap_or_default(),
                pool.pop().unwrap_or_default(),
            ]
        };
        let mine = &groups[split_range(groups.len(), n_tasks, t)];
        let sub_of = |&(si, _): &(usize, usize)| {
            affine_sub_block(segments[si].w.ty).expect("applies() checked the type")
        };
        let mut i = 0;
        while i < mine.len() {
            // Two panels at a time where they share a sub-block size.
            let n = if i + 1 < mine.len() && sub_of(&mine[i]) == sub_of(&mine[i + 1]) {
                2
            } else {
                1
            };
            let sub = sub_of(&mine[i]);
            let mut places = [(0, 0); 2];
            for (j, &(si, r0)) in mine[i..i + n].iter().enumerate() {
                let s = &segments[si];
                let lanes = LANES.min(s.w.rows - r0);
                let word = acts.shape.word;
                pack_panel(s, decoders[si], r0, lanes, k, sub, word, &mut bufs[j]);
                places[j] = (s.col0 + r0 - cols.start, lanes);
            }
            let panels: Vec<&[u8]> = bufs[..n].iter().map(|b| &b.panel[..]).collect();
            multiply_panels(&panels, k, sub, m, acts, &mut rows, &places[..n]);
            i += n;
        }
        scratch.lock().expect("panel pool").extend(bufs);
    });
}

/// Decodes weight rows `r0..r0 + lanes` of `s` with `decode` (its type's
/// [`affine`]) into `buf.panel`; lanes past `lanes` get zero codes and
/// factors.
#[allow(clippy::too_many_arguments)]
fn pack_panel(
    s: &Segment,
    decode: AffineFn,
    r0: usize,
    lanes: usize,
    k: usize,
    sub: usize,
    word: usize,
    buf: &mut PanelScratch,
) {
    let n_sb = k / sub;
    buf.codes.resize(LANES * k, 0);
    buf.scale.resize(LANES * n_sb, 0.0);
    buf.offset.resize(LANES * n_sb, 0.0);
    for l in 0..LANES {
        let (c, sc, of) = (
            &mut buf.codes[l * k..(l + 1) * k],
            &mut buf.scale[l * n_sb..(l + 1) * n_sb],
            &mut buf.offset[l * n_sb..(l + 1) * n_sb],
        );
        if l < lanes {
            let r = r0 + l;
            let w = &s.w.data[r * s.row_bytes..(r + 1) * s.row_bytes];
            // SAFETY: `affine` handed out `decode` for this CPU's features;
            // the row is whole blocks (matmul checked the weight's shape)
            // and `c`, `sc`, `of` hold its elements and sub-blocks.
            unsafe { decode(w, c, sc, of) };
        } else {
            c.fill(0);
            sc.fill(0.0);
            of.fill(0.0);
        }
    }
    let sb_bytes = sub * LANES + PANEL_FACTORS;
    buf.panel.resize(n_sb * sb_bytes, 0);
    for sb in 0..n_sb {
        let p = &mut buf.panel[sb * sb_bytes..(sb + 1) * sb_bytes];
        let (codes, factors) = p.split_at_mut(sub * LANES);
        // A 16 × (sub/word) transpose of words.
        for (q, dst) in codes.chunks_exact_mut(LANES * word).enumerate() {
            for (l, d) in dst.chunks_exact_mut(word).enumerate() {
                let src = l * k + sb * sub + q * word;
                d.copy_from_slice(&buf.codes[src..src + word]);
            }
        }
        for l in 0..LANES {
            factors[l * 4..][..4].copy_from_slice(&buf.scale[l * n_sb + sb].to_le_bytes());
            factors[64 + l * 4..][..4].copy_from_slice(&buf.offset[l * n_sb + sb].to_le_bytes());
        }
    }
}

type TileFn<const P: usize> =
    unsafe fn([*const u8; P], usize, *const i8, *const f32, *mut [f32; LANES]);

/// The tile kernels for `mt` activation rows and `sub`-element sub-blocks:
/// one panel, two panels.
#[cfg(target_arch = "x86_64")]
fn tile_fns(mt: usize, sub: usize, shape: Shape) -> (TileFn<1>, TileFn<2>) {
    use super::x86_gemm::{tile, tile_avx2};
    macro_rules! pick {
        ($tile:ident: $($n:literal)*) => {
            match (mt, sub) {
                $(
                    ($n, 16) => ($tile::<1, $n, 4> as TileFn<1>, $tile::<2, $n, 4> as TileFn<2>),
                    ($n, _) => ($tile::<1, $n, 8> as TileFn<1>, $tile::<2, $n, 8> as TileFn<2>),
                )*
                _ => unreachable!("tiles hold 1..=MT rows"),
            }
        };
    }
    if shape == AVX2 {
        pick!(tile_avx2: 1 2 3 4 5 6)
    } else {
        pick!(tile: 1 2 3 4 5 6)
    }
}

/// As above, for `USMMLA` (row pairs) or `SDOT` (four rows).
#[cfg(target_arch = "aarch64")]
fn tile_fns(mt: usize, sub: usize, shape: Shape) -> (TileFn<1>, TileFn<2>) {
    use super::neon_gemm::{tile, tile_sdot};
    if shape == SDOT {
        return match sub {
            16 => (tile_sdot::<1, 4>, tile_sdot::<2, 4>),
            _ => (tile_sdot::<1, 8>, tile_sdot::<2, 8>),
        };
    }
    macro_rules! pick {
        ($($pairs:literal)*) => {
            match (shape.laid_rows(mt) / 2, sub) {
                $(
                    ($pairs, 16) => (tile::<1, $pairs, 2> as TileFn<1>, tile::<2, $pairs, 2> as TileFn<2>),
                    ($pairs, _) => (tile::<1, $pairs, 4> as TileFn<1>, tile::<2, $pairs, 4> as TileFn<2>),
                )*
                _ => unreachable!("tiles hold 1..=MT rows"),
            }
        };
    }
    pick!(1 2)
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn tile_fns(_mt: usize, _sub: usize, _shape: Shape) -> (TileFn<1>, TileFn<2>) {
    unreachable!("shape() is None here")
}

/// Every activation tile against one or two panels; panel `j` writes
/// `rows[i][col..col + lanes]` for `(col, lanes) = places[j]`.
fn multiply_panels(
    panels: &[&[u8]],
    k: usize,
    sub: usize,
    m: usize,
    acts: &PackedActs,
    rows: &mut [&mut [f32]],
    places: &[(usize, usize)],
) {
    let n_sb = k / sub;
    let ds = &acts.ds[ds_index(sub)];
    assert!(panels.len() == places.len() && (1..=2).contains(&panels.len()));
    for p in panels {
        assert!(p.len() >= n_sb * (sub * LANES + PANEL_FACTORS));
    }
    let mut out = [[0f32; LANES]; 2 * MT];
    for t in 0..m.div_ceil(MT) {
        let mt = MT.min(m - t * MT);
        let lr = acts.shape.laid_rows(mt);
        let codes = &acts.codes[t * MT * k..][..lr * k];
        let d = &ds[t * MT * 2 * n_sb..][..lr * 2 * n_sb];
        let (one, two) = tile_fns(mt, sub, acts.shape);
        // SAFETY: `applies` checked the instructions (`shape`); each
        // panel holds `n_sb` sub-blocks (asserted), `codes` and `d` hold the
        // tile's `lr` laid rows of `k` codes and `2·n_sb` factors, `out` has
        // room for `2·lr` rows.
        unsafe {
            match panels {
                [p] => one(
                    [p.as_ptr()],
                    n_sb,
                    codes.as_ptr(),
                    d.as_ptr(),
                    out.as_mut_ptr(),
                ),
                [p, q] => two(
                    [p.as_ptr(), q.as_ptr()],
                    n_sb,
                    codes.as_ptr(),
                    d.as_ptr(),
                    out.as_mut_ptr(),
                ),
                _ => unreachable!("asserted above"),
            }
        };
        for (j, &(col, lanes)) in places.iter().enumerate() {
            for (i, o) in out[j * lr..][..mt].iter().enumerate() {
                let dst = &mut rows[t * MT + i][col..col + lanes];
                if let Ok(full) = <&mut [f32; LANES]>::try_from(&mut *dst) {
                    *full = *o;
                } else {
                    dst.copy_from_slice(&o[..lanes]);
                }
            }
        }
    }
}

#[cfg(all(test, target_arch = "aarch64"))]
mod tests {
    use super::super::act::{quantize_rows, ActFormat};
    use super::super::{plan, WeightMatrix};
    use super::*;
    use rlx_gguf::GgmlType;

    /// Deterministic values in [-1, 1).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s % 2000) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    /// The `SDOT` tile gives the `USMMLA` tile's bits for every type it
    /// takes, at tile-edge row counts and weight rows that leave a partial
    /// panel (both instructions are on `qemu -cpu max`; a CPU with only
    /// one of them runs that one).
    #[test]
    fn sdot_and_usmmla_tiles_give_the_same_bits() {
        use GgmlType as T;
        if !(has_neon_i8mm() && has_neon_dotprod()) {
            return;
        }
        let pool = ThreadPool::new(2);
        let opts = MatmulOptions {
            precision: Precision::Quantized,
            isa: Isa::Neon,
            batch_invariant: false,
            rows: super::super::RowChoice::WIDEST,
        };
        for ty in [
            T::Q4_0,
            T::Q4_1,
            T::Q5_0,
            T::Q5_1,
            T::Q2_K,
            T::Q3_K,
            T::Q4_K,
            T::Q5_K,
            T::Q6_K,
        ] {
            assert!(affine_max_code(ty).unwrap() <= SDOT.max_code, "{ty}");
            for (m, rows) in [(16, 37), (19, 16), (23, 5)] {
                let k = 512;
                let w = rlx_gguf::quantize_to_vec(ty, &values(rows * k, ty as u64)).unwrap();
                let weights = [WeightMatrix {
                    ty,
                    rows,
                    k,
                    data: &w,
                }];
                let segments = plan(&opts, &weights);
                let x = values(m * k, 99);
                let mut q8 = Vec::new();
                quantize_rows(&pool, Isa::Neon, ActFormat::Q8_0, &x, m, k, &mut q8);
                let [a, b] = [MMLA, SDOT].map(|shape| {
                    let mut acts = PackedActs::default();
                    pack_acts(&pool, &q8, m, k, shape, &mut acts);
                    let mut y = vec![f32::NAN; m * rows];
                    run(
                        &pool,
                        Isa::Neon,
                        m,
                        k,
                        rows,
                        &segments,
                        &acts,
                        &mut y,
                        &Mutex::default(),
                    );
                    y
                });
                assert!(a.iter().all(|v| v.is_finite()), "{ty} m={m}");
                assert!(
                    a.iter().zip(&b).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{ty} m={m} rows={rows}: SDOT and USMMLA differ"
                );
            }
        }
    }
}
