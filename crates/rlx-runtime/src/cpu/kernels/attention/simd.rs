//! The SIMD tile kernels, written once over a vector type: an instruction
//! set is a [`Lanes`] implementation (`cpu/simd`: its loads, lane masks,
//! fused multiply-add and lane reductions) and one [`tiles!`] invocation, which
//! compiles these bodies with its target features and register-tile shapes
//! (the elementwise kernels' `widest!` is the model). [`super::scalar`] is
//! the reference they follow.
//!
//! # Safety
//! Every function here is `unsafe` and `#[inline(always)]`: it runs only
//! inlined into a [`tiles!`] entry point compiled for the features its
//! [`Lanes`] needs, which `Tiles::new` hands out only where the CPU has
//! them. The entry points check the slice lengths once; pointers then stay
//! inside them, and partial vectors read and write only their lanes.

use super::KEYS;
use crate::cpu::simd::Lanes;

/// K/V elements the tiles read where they lie: f32, or f16 bits widened as
/// they are loaded.
pub(super) trait Elem: Copy {
    unsafe fn load<V: Lanes>(p: *const Self) -> V;
    unsafe fn load_part<V: Lanes>(m: V::Prefix, p: *const Self) -> V;
}

impl Elem for f32 {
    #[inline(always)]
    unsafe fn load<V: Lanes>(p: *const f32) -> V {
        // SAFETY: this function's contract (the module's `# Safety`): it runs inlined into a
        // `tiles!` entry point compiled for the features of `V`, whose slice checks keep every
        // pointer inside its slice.
        unsafe { V::load(p) }
    }

    #[inline(always)]
    unsafe fn load_part<V: Lanes>(m: V::Prefix, p: *const f32) -> V {
        // SAFETY: this function's contract (the module's `# Safety`): it runs inlined into a
        // `tiles!` entry point compiled for the features of `V`, whose slice checks keep every
        // pointer inside its slice.
        unsafe { V::load_part(m, p) }
    }
}

/// f16 bits.
impl Elem for u16 {
    #[inline(always)]
    unsafe fn load<V: Lanes>(p: *const u16) -> V {
        // SAFETY: this function's contract (the module's `# Safety`): it runs inlined into a
        // `tiles!` entry point compiled for the features of `V`, whose slice checks keep every
        // pointer inside its slice.
        unsafe { V::load_f16(p) }
    }

    #[inline(always)]
    unsafe fn load_part<V: Lanes>(m: V::Prefix, p: *const u16) -> V {
        // SAFETY: this function's contract (the module's `# Safety`): it runs inlined into a
        // `tiles!` entry point compiled for the features of `V`, whose slice checks keep every
        // pointer inside its slice.
        unsafe { V::load_part_f16(m, p) }
    }
}

/// Compiles the tile kernels for one instruction set: `$v` its [`Lanes`],
/// `$isa` the set, `$features` what they need, `scores` the keys per register tile for 4,
/// 2 and 1 query rows (rows × keys accumulators, a multiple of `N`),
/// `pv` the column vectors per register tile for 4, 2 and 1 rows. Defines
/// `TILES`.
macro_rules! tiles {
    (
        $v:ty,
        $isa:expr,
        $features:literal,
        scores: ($c4:literal, $c2:literal, $c1:literal),
        pv: ($n4:literal, $n2:literal, $n1:literal) $(,)?
    ) => {
        pub(super) const TILES: super::Tiles = super::Tiles {
            isa: $isa,
            scores: entry::scores::<f32>,
            scores_f16: entry::scores::<u16>,
            softmax: entry::softmax,
            pv: entry::pv::<f32>,
            pv_f16: entry::pv::<u16>,
            widen_f16: entry::widen_f16,
            widen_bf16: entry::widen_bf16,
        };

        mod entry {
            use super::super::simd::{self, Elem};
            #[allow(unused_imports)]
            use super::*;

            #[allow(clippy::too_many_arguments)]
            #[target_feature(enable = $features)]
            pub(super) unsafe fn scores<E: Elem>(
                q: &[f32],
                rows: usize,
                hd: usize,
                k: &[E],
                k_stride: usize,
                nk: usize,
                scale: f32,
                s: &mut [f32],
            ) {
                // SAFETY: this function's contract (the module's `# Safety`): it runs inlined into
                // a `tiles!` entry point compiled for the features of `V`, whose slice checks keep
                // every pointer inside its slice.
                unsafe {
                    simd::scores::<$v, E, $c4, $c2, $c1>(q, rows, hd, k, k_stride, nk, scale, s)
                }
            }

            #[target_feature(enable = $features)]
            pub(super) unsafe fn softmax(
                s: &mut [f32],
                rows: usize,
                nk: usize,
                masks: &[u32],
                m: &mut [f32],
                l: &mut [f32],
                alpha: &mut [f32],
            ) {
                // SAFETY: this function's contract (the module's `# Safety`): it runs inlined into
                // a `tiles!` entry point compiled for the features of `V`, whose slice checks keep
                // every pointer inside its slice.
                unsafe { simd::softmax::<$v>(s, rows, nk, masks, m, l, alpha) }
            }

            #[allow(clippy::too_many_arguments)]
            #[target_feature(enable = $features)]
            pub(super) unsafe fn pv<E: Elem>(
                p: &[f32],
                rows: usize,
                nk: usize,
                v: &[E],
                v_stride: usize,
                hdv: usize,
                alpha: &[f32],
                o: &mut [f32],
            ) {
                // SAFETY: this function's contract (the module's `# Safety`): it runs inlined into
                // a `tiles!` entry point compiled for the features of `V`, whose slice checks keep
                // every pointer inside its slice.
                unsafe { simd::pv::<$v, E, $n4, $n2, $n1>(p, rows, nk, v, v_stride, hdv, alpha, o) }
            }

            #[target_feature(enable = $features)]
            pub(super) unsafe fn widen_f16(src: &[u16], dst: &mut [f32]) {
                // SAFETY: this function's contract (the module's `# Safety`): it runs inlined into
                // a `tiles!` entry point compiled for the features of `V`, whose slice checks keep
                // every pointer inside its slice.
                unsafe { crate::cpu::simd::widen::<$v, false>(simd::bytes_of(src), dst) }
            }

            #[target_feature(enable = $features)]
            pub(super) unsafe fn widen_bf16(src: &[u16], dst: &mut [f32]) {
                // SAFETY: this function's contract (the module's `# Safety`): it runs inlined into
                // a `tiles!` entry point compiled for the features of `V`, whose slice checks keep
                // every pointer inside its slice.
                unsafe { crate::cpu::simd::widen::<$v, true>(simd::bytes_of(src), dst) }
            }
        }
    };
}
pub(super) use tiles;

/// Scores in register tiles of `R` rows × `C` keys: each dot keeps its own
/// accumulator across the head dimension, and a tile's accumulators are
/// reduced `N` at a time into vectors of sums (see [`Lanes::reduce`]).
/// `C4`, `C2` and `C1` are the keys per tile for 4, 2 and 1 rows.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn scores<
    V: Lanes,
    E: Elem,
    const C4: usize,
    const C2: usize,
    const C1: usize,
>(
    q: &[f32],
    rows: usize,
    hd: usize,
    k: &[E],
    k_stride: usize,
    nk: usize,
    scale: f32,
    s: &mut [f32],
) {
    // SAFETY: this function's contract (the module's `# Safety`): it runs inlined into a `tiles!`
    // entry point compiled for the features of `V`, whose slice checks keep every pointer inside
    // its slice.
    unsafe {
        assert!((1..=KEYS).contains(&nk) && hd >= 1);
        assert!(
            q.len() >= rows * hd && k.len() >= (nk - 1) * k_stride + hd && s.len() >= rows * KEYS
        );
        match rows % 4 {
            0 => scores_tiles::<V, 4, C4, E>(q, rows, hd, k, k_stride, nk, scale, s),
            2 => scores_tiles::<V, 2, C2, E>(q, rows, hd, k, k_stride, nk, scale, s),
            _ => scores_tiles::<V, 1, C1, E>(q, rows, hd, k, k_stride, nk, scale, s),
        }
    }
}

/// # Safety
/// As for [`scores`] (whose checks it relies on), with `rows % R == 0` and
/// `R · C` a multiple of `N`, at most 16 vectors.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn scores_tiles<V: Lanes, const R: usize, const C: usize, E: Elem>(
    q: &[f32],
    rows: usize,
    hd: usize,
    k: &[E],
    k_stride: usize,
    nk: usize,
    scale: f32,
    s: &mut [f32],
) {
    // SAFETY: this function's contract (the module's `# Safety`): it runs inlined into a `tiles!`
    // entry point compiled for the features of `V`, whose slice checks keep every pointer inside
    // its slice.
    unsafe {
        const MAX_TILE: usize = 16;
        let full = hd - hd % V::N;
        let tail = V::prefix(hd % V::N);
        let scale = V::splat(scale);
        for j0 in (0..nk).step_by(C) {
            // Keys past the end repeat the last one; their scores land in the
            // padding columns that nothing reads.
            let mut kp = [k.as_ptr(); C];
            for (j, p) in kp.iter_mut().enumerate() {
                *p = k.as_ptr().add((j0 + j).min(nk - 1) * k_stride);
            }
            for r0 in (0..rows).step_by(R) {
                let mut qp = [q.as_ptr(); R];
                for (r, p) in qp.iter_mut().enumerate() {
                    *p = q.as_ptr().add((r0 + r) * hd);
                }
                let mut acc = [[V::zero(); C]; R];
                let mut kv = [V::zero(); C];
                let mut d = 0;
                while d < full {
                    for (v, p) in kv.iter_mut().zip(&kp) {
                        *v = E::load(p.add(d));
                    }
                    for (a, p) in acc.iter_mut().zip(&qp) {
                        let x = V::load(p.add(d));
                        for (a, &v) in a.iter_mut().zip(&kv) {
                            *a = V::fma(x, v, *a);
                        }
                    }
                    d += V::N;
                }
                if d < hd {
                    for (v, p) in kv.iter_mut().zip(&kp) {
                        *v = E::load_part(tail, p.add(d));
                    }
                    for (a, p) in acc.iter_mut().zip(&qp) {
                        let x = V::load_part(tail, p.add(d));
                        for (a, &v) in a.iter_mut().zip(&kv) {
                            *a = V::fma(x, v, *a);
                        }
                    }
                }
                let flat = acc.as_flattened();
                let mut sums = [0f32; MAX_TILE];
                for (g, group) in flat.chunks_exact(V::N).enumerate() {
                    V::store(
                        sums.as_mut_ptr().add(g * V::N),
                        V::mul(V::reduce(group), scale),
                    );
                }
                for r in 0..R {
                    s[(r0 + r) * KEYS + j0..][..C].copy_from_slice(&sums[r * C..(r + 1) * C]);
                }
            }
        }
    }
}

/// `e^x` per lane, [`exp_f32`]'s method (with fused multiply-adds).
///
/// [`exp_f32`]: crate::cpu::kernels::elementwise::exp_f32
#[inline(always)]
unsafe fn exp<V: Lanes>(x: V) -> V {
    // SAFETY: this function's contract (the module's `# Safety`): it runs inlined into a `tiles!`
    // entry point compiled for the features of `V`, whose slice checks keep every pointer inside
    // its slice.
    unsafe {
        let x = V::min(V::max(x, V::splat(-87.0)), V::splat(88.0));
        let round = V::splat(12_582_912.0);
        let k = V::sub(V::fma(x, V::splat(std::f32::consts::LOG2_E), round), round);
        let r = V::fnma(k, V::splat(0.693_145_75), x);
        let r = V::fnma(k, V::splat(1.428_606_8e-6), r);
        let mut p = V::splat(1.0 / 5040.0);
        for c in [
            1.0 / 720.0,
            1.0 / 120.0,
            1.0 / 24.0,
            1.0 / 6.0,
            0.5,
            1.0,
            1.0,
        ] {
            p = V::fma(p, r, V::splat(c));
        }
        V::mul(p, V::pow2(k))
    }
}

/// [`super::scalar::softmax`] with a row's [`KEYS`] scores in vectors.
#[inline(always)]
pub(super) unsafe fn softmax<V: Lanes>(
    s: &mut [f32],
    rows: usize,
    nk: usize,
    masks: &[u32],
    m: &mut [f32],
    l: &mut [f32],
    alpha: &mut [f32],
) {
    // SAFETY: this function's contract (the module's `# Safety`): it runs inlined into a `tiles!`
    // entry point compiled for the features of `V`, whose slice checks keep every pointer inside
    // its slice.
    unsafe {
        /// Vectors per row at the narrowest (4 lanes).
        const MAX_VECS: usize = KEYS / 4;
        assert!(nk <= KEYS && s.len() >= rows * KEYS && KEYS.is_multiple_of(V::N));
        assert!(masks.len() >= rows && m.len() >= rows && l.len() >= rows && alpha.len() >= rows);
        let vecs = KEYS / V::N;
        let limit = if nk == KEYS {
            u32::MAX
        } else {
            (1u32 << nk) - 1
        };
        let neg_inf = V::splat(f32::NEG_INFINITY);
        for r in 0..rows {
            let row = s.as_mut_ptr().add(r * KEYS);
            let bits = masks[r] & limit;
            let mut seen = [V::select(0); MAX_VECS];
            let mut x = [neg_inf; MAX_VECS];
            let mut max = neg_inf;
            for i in 0..vecs {
                seen[i] = V::select(bits >> (V::N * i));
                // Lanes not seen may hold anything (stale or past `nk`).
                x[i] = V::blend(seen[i], V::load(row.add(V::N * i)), neg_inf);
                max = V::max(max, x[i]);
            }
            let m_new = m[r].max(V::hmax(max));
            if m_new == f32::NEG_INFINITY {
                alpha[r] = 1.0;
                for i in 0..vecs {
                    V::store(row.add(V::N * i), V::zero());
                }
                continue;
            }
            alpha[r] = if m[r] == f32::NEG_INFINITY {
                0.0
            } else {
                crate::cpu::kernels::elementwise::exp_f32(m[r] - m_new)
            };
            let mv = V::splat(m_new);
            let mut sum = V::zero();
            for i in 0..vecs {
                let p = V::blend(seen[i], exp(V::sub(x[i], mv)), V::zero());
                V::store(row.add(V::N * i), p);
                sum = V::add(sum, p);
            }
            l[r] = l[r] * alpha[r] + V::hsum(sum);
            m[r] = m_new;
        }
    }
}

/// `O = alpha·O + P·V` in register tiles of `R` rows × `NV` vectors of
/// columns, walking the block's keys with the tile held in registers.
/// `N4`, `N2` and `N1` are the vectors per tile for 4, 2 and 1 rows.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn pv<V: Lanes, E: Elem, const N4: usize, const N2: usize, const N1: usize>(
    p: &[f32],
    rows: usize,
    nk: usize,
    v: &[E],
    v_stride: usize,
    hdv: usize,
    alpha: &[f32],
    o: &mut [f32],
) {
    // SAFETY: this function's contract (the module's `# Safety`): it runs inlined into a `tiles!`
    // entry point compiled for the features of `V`, whose slice checks keep every pointer inside
    // its slice.
    unsafe {
        assert!((1..=KEYS).contains(&nk) && hdv >= 1);
        assert!(p.len() >= rows * KEYS && alpha.len() >= rows && o.len() >= rows * hdv);
        assert!(v.len() >= (nk - 1) * v_stride + hdv);
        match rows % 4 {
            0 => pv_rows::<V, 4, N4, E>(p, rows, nk, v, v_stride, hdv, alpha, o),
            2 => pv_rows::<V, 2, N2, E>(p, rows, nk, v, v_stride, hdv, alpha, o),
            _ => pv_rows::<V, 1, N1, E>(p, rows, nk, v, v_stride, hdv, alpha, o),
        }
    }
}

/// # Safety
/// As for [`pv`] (whose checks it relies on), with `rows % R == 0`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn pv_rows<V: Lanes, const R: usize, const NV: usize, E: Elem>(
    p: &[f32],
    rows: usize,
    nk: usize,
    v: &[E],
    v_stride: usize,
    hdv: usize,
    alpha: &[f32],
    o: &mut [f32],
) {
    // SAFETY: this function's contract (the module's `# Safety`): it runs inlined into a `tiles!`
    // entry point compiled for the features of `V`, whose slice checks keep every pointer inside
    // its slice.
    unsafe {
        let full = V::prefix(V::N);
        let mut c = 0;
        // Columns in chunks of `NV` whole vectors, then one vector at a time.
        while c + V::N * NV <= hdv {
            pv_tile::<V, R, NV, E>(p, rows, nk, v, v_stride, hdv, alpha, o, c, full);
            c += V::N * NV;
        }
        while c < hdv {
            let last = V::prefix((hdv - c).min(V::N));
            pv_tile::<V, R, 1, E>(p, rows, nk, v, v_stride, hdv, alpha, o, c, last);
            c += V::N;
        }
    }
}

/// Columns `c .. c + N·NV` (the last vector limited to `last`) of every
/// row group.
///
/// # Safety
/// As for [`pv_rows`], with those columns inside `hdv`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn pv_tile<V: Lanes, const R: usize, const NV: usize, E: Elem>(
    p: &[f32],
    rows: usize,
    nk: usize,
    v: &[E],
    v_stride: usize,
    hdv: usize,
    alpha: &[f32],
    o: &mut [f32],
    c: usize,
    last: V::Prefix,
) {
    // SAFETY: this function's contract (the module's `# Safety`): it runs inlined into a `tiles!`
    // entry point compiled for the features of `V`, whose slice checks keep every pointer inside
    // its slice.
    unsafe {
        let mut mask = [V::prefix(V::N); NV];
        mask[NV - 1] = last;
        let v = v.as_ptr().add(c);
        for r0 in (0..rows).step_by(R) {
            let mut acc = [[V::zero(); NV]; R];
            for (r, a) in acc.iter_mut().enumerate() {
                let row = o.as_ptr().add((r0 + r) * hdv + c);
                let scale = V::splat(alpha[r0 + r]);
                for (i, a) in a.iter_mut().enumerate() {
                    *a = V::mul(V::load_part(mask[i], row.add(V::N * i)), scale);
                }
            }
            let pr = p.as_ptr().add(r0 * KEYS);
            let mut vv = [V::zero(); NV];
            for j in 0..nk {
                let vr = v.add(j * v_stride);
                for (i, x) in vv.iter_mut().enumerate() {
                    *x = E::load_part(mask[i], vr.add(V::N * i));
                }
                for (r, a) in acc.iter_mut().enumerate() {
                    let w = V::splat(*pr.add(r * KEYS + j));
                    for (a, &x) in a.iter_mut().zip(&vv) {
                        *a = V::fma(w, x, *a);
                    }
                }
            }
            for (r, a) in acc.iter().enumerate() {
                let row = o.as_mut_ptr().add((r0 + r) * hdv + c);
                for (i, &a) in a.iter().enumerate() {
                    V::store_part(mask[i], row.add(V::N * i), a);
                }
            }
        }
    }
}

/// `src`'s bytes: the f16/bf16 bits of K/V rows as the shared widening
/// reads them (little-endian, as every target rlx builds for is).
pub(super) fn bytes_of(src: &[u16]) -> &[u8] {
    // SAFETY: any u16 is two initialized bytes, and u8 needs no alignment;
    // the view borrows `src` for its lifetime.
    unsafe { std::slice::from_raw_parts(src.as_ptr().cast::<u8>(), 2 * src.len()) }
}
