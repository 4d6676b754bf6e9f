//! The exact path's dequantizers and the GEMM's affine codes, one source
//! for every instruction set: each format unpacks a unit's 32 codes in a
//! [`Bytes32`] (through `formats.rs`, which the dots share) and applies its
//! scales there (`formats.rs`'s `factors`), or stores the codes and the
//! factors as they are; [`entries!`] compiles the set per instruction set.
//!
//! Bit-identical to `rlx_gguf::dequantize`: the reference's float
//! operations in its order (one multiply for `q · d`; a multiply then an
//! add for `q · d + m` and `d₁ · q − m₁`, IEEE `a − b` being `a + (−b)`; no
//! FMA), only the element order of the loads differing.
//!
//! No closure here holds a vector operation: a closure's body does not get
//! the entry point's target features, so the operations in it would be
//! calls rather than inlined instructions.
//!
//! # Safety
//! Every function here is `unsafe` and `#[inline(always)]`: it runs only
//! inlined into an [`entries!`] entry point compiled for the features of
//! its [`Bytes32`], which `kernels::dequant` hands out only where the CPU
//! has them. Blocks are read through bounds-checked slices and array
//! references.

use rlx_gguf::blocks::{iq4_xs_scale, KVALUES_IQ4NL};
use rlx_gguf::GgmlType;

use super::formats::{
    Iq4Nl, KQuant, Legacy, Mxfp4, Q2K, Q3K, Q4K, Q4_0, Q4_1, Q5K, Q5_0, Q5_1, Q6K, Q8_0,
};
use crate::cpu::simd::{self, Bytes32};

/// The first `N` elements of `s` as an array (panics if `s` is shorter).
#[inline(always)]
fn arr<T, const N: usize>(s: &[T]) -> &[T; N] {
    s[..N].try_into().expect("length checked by the slice")
}

/// The first `N` elements of `s` as a mutable array (panics if shorter).
#[inline(always)]
fn arr_mut<T, const N: usize>(s: &mut [T]) -> &mut [T; N] {
    (&mut s[..N])
        .try_into()
        .expect("length checked by the slice")
}

/// The blocks of `src` (`bytes` each) with the `elems` elements of `dst`
/// each decodes to.
#[inline(always)]
fn blocks<'a, T>(
    bytes: usize,
    elems: usize,
    src: &'a [u8],
    dst: &'a mut [T],
) -> impl Iterator<Item = (&'a [u8], &'a mut [T])> {
    src.chunks_exact(bytes).zip(dst.chunks_exact_mut(elems))
}

#[inline(always)]
pub(super) unsafe fn f16<C: Bytes32>(src: &[u8], dst: &mut [f32]) {
    // SAFETY: the module's `# Safety`.
    unsafe { simd::widen::<C::F32, false>(src, dst) }
}

#[inline(always)]
pub(super) unsafe fn bf16<C: Bytes32>(src: &[u8], dst: &mut [f32]) {
    // SAFETY: the module's `# Safety`.
    unsafe { simd::widen::<C::F32, true>(src, dst) }
}

/// A legacy block: `d·q`, or `d·q + m` for a format with a minimum.
#[inline(always)]
pub(super) unsafe fn legacy<C: Bytes32, F: Legacy>(src: &[u8], dst: &mut [f32]) {
    // SAFETY: the module's `# Safety`.
    unsafe {
        let table = C::table(F::TABLE);
        for (b, y) in blocks(F::BYTES, 32, src, dst) {
            let (d, o) = F::factors::<C>(b);
            let q = F::codes::<C>(b, table);
            if F::MIN {
                C::store_mul_add_u8(q, (d, -o), (d, -o), arr_mut(y));
            } else {
                C::store_mul_i8(q, d, d, arr_mut(y));
            }
        }
    }
}

#[inline(always)]
pub(super) unsafe fn iq4_xs<C: Bytes32>(src: &[u8], dst: &mut [f32]) {
    // SAFETY: the module's `# Safety`.
    unsafe {
        let values = C::table(&KVALUES_IQ4NL);
        for (b, y) in blocks(GgmlType::IQ4_XS.block_bytes(), 256, src, dst) {
            let d = C::f16(b, 0);
            for (j, (qs, y)) in b[8..136]
                .chunks_exact(16)
                .zip(y.chunks_exact_mut(32))
                .enumerate()
            {
                let dl = d * iq4_xs_scale(b, j) as f32;
                let q = C::lookup(values, C::nibbles(arr(qs)));
                C::store_mul_i8(q, dl, dl, arr_mut(y));
            }
        }
    }
}

/// For each unit of `$f`'s blocks of `$src`: `$body` with the block `$b`,
/// `$s` (`$scales` of the block, evaluated once a block), the unit's index
/// `$u` and codes `$q`, and the 32 elements `$y` it decodes to. A macro,
/// not a function taking closures: a closure's body would not get the
/// entry point's features (the module's `# Safety`).
macro_rules! for_units {
    (
        $f:ty, $c:ty, $src:expr, $dst:expr,
        |$b:ident, $s:ident = $scales:expr, $u:ident, $q:ident, $y:ident| $body:block
    ) => {
        for ($b, y) in blocks(<$f>::BYTES, 256, $src, $dst) {
            let $s = $scales;
            let high = <$f>::high::<$c>($b);
            for (quad, y) in y.chunks_exact_mut(128).enumerate() {
                let units = <$f>::quad::<$c>($b, high, quad);
                for (i, ($q, y)) in units.into_iter().zip(y.chunks_exact_mut(32)).enumerate() {
                    let ($u, $y) = (4 * quad + i, arr_mut(y));
                    $body
                }
            }
        }
    };
}

/// Q2_K: `d·sc · q − dmin·mn` per 16-element half-unit (4-bit scales and
/// mins in the 16 bytes at 0).
#[inline(always)]
pub(super) unsafe fn q2_k<C: Bytes32>(src: &[u8], dst: &mut [f32]) {
    // SAFETY: the module's `# Safety`.
    unsafe {
        for_units!(Q2K, C, src, dst, |b, _s = (), u, q, y| {
            let ((d0, o0), (d1, o1)) = (Q2K::factors::<C>(b, 2 * u), Q2K::factors::<C>(b, 2 * u + 1));
            C::store_mul_add_u8(q, (d0, -o0), (d1, -o1), y);
        })
    }
}

/// Q3_K: `d·sc · (q − 4)` per 16-element half-unit (6-bit signed scales).
#[inline(always)]
pub(super) unsafe fn q3_k<C: Bytes32>(src: &[u8], dst: &mut [f32]) {
    // SAFETY: the module's `# Safety`.
    unsafe {
        let four = C::splat(4);
        for_units!(Q3K, C, src, dst, |b, _s = (), u, q, y| {
            let (d0, d1) = (Q3K::factors::<C>(b, 2 * u).0, Q3K::factors::<C>(b, 2 * u + 1).0);
            C::store_mul_i8(C::sub(q, four), d0, d1, y);
        })
    }
}

/// Q4_K and Q5_K: `d·sc_u · q − dmin·mn_u` per unit.
#[inline(always)]
unsafe fn k4<C: Bytes32, F: KQuant>(src: &[u8], dst: &mut [f32]) {
    // SAFETY: the module's `# Safety`.
    unsafe {
        for_units!(F, C, src, dst, |b, _s = (), u, q, y| {
            let (d, o) = F::factors::<C>(b, u);
            C::store_mul_add_u8(q, (d, -o), (d, -o), y);
        })
    }
}

#[inline(always)]
pub(super) unsafe fn q4_k<C: Bytes32>(src: &[u8], dst: &mut [f32]) {
    // SAFETY: the module's `# Safety`.
    unsafe { k4::<C, Q4K>(src, dst) }
}

#[inline(always)]
pub(super) unsafe fn q5_k<C: Bytes32>(src: &[u8], dst: &mut [f32]) {
    // SAFETY: the module's `# Safety`.
    unsafe { k4::<C, Q5K>(src, dst) }
}

/// Q6_K: `(d·sc) · (q − 32)` per 16-element half-unit (8-bit signed
/// scales at 192), in the reference's order.
#[inline(always)]
pub(super) unsafe fn q6_k<C: Bytes32>(src: &[u8], dst: &mut [f32]) {
    // SAFETY: the module's `# Safety`.
    unsafe {
        let thirty_two = C::splat(32);
        for_units!(Q6K, C, src, dst, |b, _s = (), u, q, y| {
            let (d0, d1) = (Q6K::factors::<C>(b, 2 * u).0, Q6K::factors::<C>(b, 2 * u + 1).0);
            C::store_mul_i8(C::sub(q, thirty_two), d0, d1, y);
        })
    }
}

/// Legacy blocks as the GEMM's panels take them: each element's unsigned
/// code ([`Legacy::unsigned`]) in `codes`, and each block's scale and
/// offset (`value = scale·code − offset`).
#[inline(always)]
pub(super) unsafe fn affine_legacy<C: Bytes32, F: Legacy>(
    src: &[u8],
    codes: &mut [u8],
    scale: &mut [f32],
    offset: &mut [f32],
) {
    // SAFETY: the module's `# Safety`.
    unsafe {
        let table = C::table(F::TABLE);
        let factors = scale.iter_mut().zip(offset.iter_mut());
        for ((b, c), (s, o)) in blocks(F::BYTES, 32, src, codes).zip(factors) {
            C::store(F::unsigned::<C>(b, table), arr_mut(c));
            (*s, *o) = F::factors::<C>(b);
        }
    }
}

/// K-quant blocks as [`affine_legacy`] gives legacy ones: codes as stored,
/// and each sub-block's ([`KQuant::SUB`]) scale and offset.
#[inline(always)]
pub(super) unsafe fn affine_k<C: Bytes32, F: KQuant>(
    src: &[u8],
    codes: &mut [u8],
    scale: &mut [f32],
    offset: &mut [f32],
) {
    // SAFETY: the module's `# Safety`.
    unsafe {
        for_units!(F, C, src, codes, |_b, _s = (), _u, q, y| {
            C::store(q, y);
        });
        let per = 256 / F::SUB;
        for (i, b) in src.chunks_exact(F::BYTES).enumerate() {
            for j in 0..per {
                (scale[i * per + j], offset[i * per + j]) = F::factors::<C>(b, j);
            }
        }
    }
}

/// One instruction set's entry points, `dequant_<type>(src, dst)`: the
/// functions above for its [`Bytes32`], compiled with its features.
macro_rules! entries {
    ($features:tt $c:ty) => {
        entries!(@each $features $c;
            f16 [] dequant_f16, bf16 [] dequant_bf16, legacy [Q8_0] dequant_q8_0,
            legacy [Q4_0] dequant_q4_0, legacy [Q4_1] dequant_q4_1,
            legacy [Q5_0] dequant_q5_0, legacy [Q5_1] dequant_q5_1,
            legacy [Iq4Nl] dequant_iq4_nl, legacy [Mxfp4] dequant_mxfp4,
            iq4_xs [] dequant_iq4_xs, q2_k [] dequant_q2_k, q3_k [] dequant_q3_k,
            q4_k [] dequant_q4_k, q5_k [] dequant_q5_k, q6_k [] dequant_q6_k);
        entries!(@affine_each $features $c;
            affine_legacy [Q8_0] affine_q8_0, affine_legacy [Q4_0] affine_q4_0,
            affine_legacy [Q4_1] affine_q4_1, affine_legacy [Q5_0] affine_q5_0,
            affine_legacy [Q5_1] affine_q5_1, affine_legacy [Iq4Nl] affine_iq4_nl,
            affine_k [Q2K] affine_q2_k, affine_k [Q3K] affine_q3_k, affine_k [Q4K] affine_q4_k,
            affine_k [Q5K] affine_q5_k, affine_k [Q6K] affine_q6_k);
    };
    (@affine_each $features:tt $c:ty; $($f:ident [$fmt:ident] $entry:ident),*) => {
        $(entries!(@affine_one $features $c; $f [$fmt] $entry);)*
    };
    (@affine_one [$(#[$features:meta])*] $c:ty; $f:ident [$fmt:ident] $entry:ident) => {
        $(#[$features])*
        pub(in super::super) unsafe fn $entry(
            src: &[u8],
            codes: &mut [u8],
            scale: &mut [f32],
            offset: &mut [f32],
        ) {
            // SAFETY: this entry point is compiled for the features of its
            // `Bytes32` (the module's `# Safety`).
            unsafe { super::$f::<$c, super::$fmt>(src, codes, scale, offset) }
        }
    };
    (@each $features:tt $c:ty; $($f:ident [$($fmt:ident)?] $entry:ident),*) => {
        $(entries!(@one $features $c; $f [$($fmt)?] $entry);)*
    };
    (@one [$(#[$features:meta])*] $c:ty; $f:ident [$($fmt:ident)?] $entry:ident) => {
        $(#[$features])*
        pub(in super::super) unsafe fn $entry(src: &[u8], dst: &mut [f32]) {
            // SAFETY: this entry point is compiled for the features of its
            // `Bytes32` (the module's `# Safety`).
            unsafe { super::$f::<$c $(, super::$fmt)?>(src, dst) }
        }
    };
}

#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    use std::arch::x86_64::__m256i;
    entries!([#[target_feature(enable = "avx2,fma,f16c")]] __m256i);
}

#[cfg(target_arch = "aarch64")]
pub(super) mod neon {
    use crate::cpu::simd::neon::U8x32;
    entries!([] U8x32);
}
