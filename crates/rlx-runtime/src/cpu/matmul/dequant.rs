//! The exact path's dequantizers, one source for every instruction set:
//! each format unpacks a unit's 32 codes in a [`Bytes32`] (the legacy
//! formats through `formats.rs`, which the dots share) and applies its
//! scales there, and [`entries!`] compiles the set per instruction set.
//!
//! Bit-identical to `rlx_gguf::dequantize`: the reference's float
//! operations in its order (one multiply for `q · d`; a multiply then an
//! add for `q · d + m` and `d₁ · q − m₁`, IEEE `a − b` being `a + (−b)`; no
//! FMA), only the element order of the loads differing.
//!
//! # Safety
//! Every function here is `unsafe` and `#[inline(always)]`: it runs only
//! inlined into an [`entries!`] entry point compiled for the features of
//! its [`Bytes32`], which `kernels::dequant` hands out only where the CPU
//! has them. Blocks are read through bounds-checked slices and array
//! references.

use rlx_gguf::blocks::{e8m0_half, q3_k_scales, scale_min_k4, KVALUES_IQ4NL};
use rlx_gguf::GgmlType;

use super::formats::{Iq4Nl, Legacy, Mxfp4, Scale, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
use crate::cpu::simd::Bytes32;

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

/// `ty`'s blocks of `src` with the elements of `dst` they decode to.
#[inline(always)]
fn blocks<'a>(
    ty: GgmlType,
    src: &'a [u8],
    dst: &'a mut [f32],
) -> impl Iterator<Item = (&'a [u8], &'a mut [f32])> {
    src.chunks_exact(ty.block_bytes())
        .zip(dst.chunks_exact_mut(ty.block_elems()))
}

#[inline(always)]
pub(super) unsafe fn f16<C: Bytes32>(src: &[u8], dst: &mut [f32]) {
    // SAFETY: the module's `# Safety`.
    unsafe { C::widen_f16(src, dst) }
}

#[inline(always)]
pub(super) unsafe fn bf16<C: Bytes32>(src: &[u8], dst: &mut [f32]) {
    // SAFETY: the module's `# Safety`.
    unsafe { C::widen_bf16(src, dst) }
}

/// A legacy block: `d·q`, or `d·q + m` for a format with a minimum.
#[inline(always)]
pub(super) unsafe fn legacy<C: Bytes32, F: Legacy>(src: &[u8], dst: &mut [f32]) {
    // SAFETY: the module's `# Safety`.
    unsafe {
        let table = C::table(F::TABLE);
        for (b, y) in blocks(F::TY, src, dst) {
            let d = match F::SCALE {
                Scale::F16 => C::f16(b, 0),
                Scale::E8m0 => e8m0_half(b[0]),
            };
            let q = F::codes::<C>(b, table);
            if F::MIN {
                let dm = (d, C::f16(b, 2));
                C::store_mul_add_u8(q, dm, dm, arr_mut(y));
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
        for (b, y) in blocks(GgmlType::IQ4_XS, src, dst) {
            let d = C::f16(b, 0);
            let scales_h = u32::from(u16::from_le_bytes([b[2], b[3]]));
            for (j, (qs, y)) in b[8..136]
                .chunks_exact(16)
                .zip(y.chunks_exact_mut(32))
                .enumerate()
            {
                let low = u32::from((b[4 + j / 2] >> (4 * (j % 2))) & 0xF);
                let ls = (low | (((scales_h >> (2 * j)) & 3) << 4)) as i32 - 32;
                let dl = d * ls as f32;
                let q = C::lookup(values, C::nibbles(arr(qs)));
                C::store_mul_i8(q, dl, dl, arr_mut(y));
            }
        }
    }
}

#[inline(always)]
pub(super) unsafe fn q2_k<C: Bytes32>(src: &[u8], dst: &mut [f32]) {
    // SAFETY: the module's `# Safety`.
    unsafe {
        for (b, y) in blocks(GgmlType::Q2_K, src, dst) {
            let (d, dmin) = (C::f16(b, 80), C::f16(b, 82));
            let sc = &b[0..16];
            let dm = |s: usize| (d * f32::from(sc[s] & 0xF), -(dmin * f32::from(sc[s] >> 4)));
            for (j, (q2, y)) in b[16..80]
                .chunks_exact(32)
                .zip(y.chunks_exact_mut(128))
                .enumerate()
            {
                let bits = C::load(arr(q2));
                for (p, y) in y.chunks_exact_mut(32).enumerate() {
                    let q = C::shr_mask(bits, 2 * p as u32, 3);
                    let s = 8 * j + 2 * p;
                    C::store_mul_add_u8(q, dm(s), dm(s + 1), arr_mut(y));
                }
            }
        }
    }
}

#[inline(always)]
pub(super) unsafe fn q3_k<C: Bytes32>(src: &[u8], dst: &mut [f32]) {
    // SAFETY: the module's `# Safety`.
    unsafe {
        let four = C::splat(4);
        for (b, y) in blocks(GgmlType::Q3_K, src, dst) {
            let d = C::f16(b, 108);
            let hbits = C::load(arr(&b[0..]));
            let sc = q3_k_scales(&b[96..108]).map(i32::from);
            for (j, (q3, y)) in b[32..96]
                .chunks_exact(32)
                .zip(y.chunks_exact_mut(128))
                .enumerate()
            {
                let bits = C::load(arr(q3));
                for (p, y) in y.chunks_exact_mut(32).enumerate() {
                    let low = C::shr_mask(bits, 2 * p as u32, 3);
                    // 4 less where the element's bit of `hbits` is clear.
                    let bit = (4 * j + p) as u32;
                    let q = C::sub(low, C::sub(four, C::bit_value(hbits, bit, four)));
                    let s = 8 * j + 2 * p;
                    C::store_mul_i8(q, d * sc[s] as f32, d * sc[s + 1] as f32, arr_mut(y));
                }
            }
        }
    }
}

/// Q4_K (`FIVE_BITS = false`) and Q5_K: `d·sc_j · q − dmin·mn_j` per
/// 32-element sub-block.
#[inline(always)]
unsafe fn k4<C: Bytes32, const FIVE_BITS: bool>(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    // SAFETY: the module's `# Safety`.
    unsafe {
        let sixteen = C::splat(16);
        for (b, y) in blocks(ty, src, dst) {
            let (d, dmin) = (C::f16(b, 0), C::f16(b, 2));
            let (hbits, qs) = if FIVE_BITS {
                (C::load(arr(&b[16..])), &b[48..176])
            } else {
                (C::splat(0), &b[16..144])
            };
            for (j, (q, y)) in qs.chunks_exact(32).zip(y.chunks_exact_mut(64)).enumerate() {
                let bits = C::load(arr(q));
                for (h, y) in y.chunks_exact_mut(32).enumerate() {
                    let sub = 2 * j + h;
                    let mut q = C::shr_mask(bits, 4 * h as u32, 0xF);
                    if FIVE_BITS {
                        q = C::or(q, C::bit_value(hbits, sub as u32, sixteen));
                    }
                    let (sc, mn) = scale_min_k4(sub, &b[4..16]);
                    let dm = (d * f32::from(sc), -(dmin * f32::from(mn)));
                    C::store_mul_add_u8(q, dm, dm, arr_mut(y));
                }
            }
        }
    }
}

#[inline(always)]
pub(super) unsafe fn q4_k<C: Bytes32>(src: &[u8], dst: &mut [f32]) {
    // SAFETY: the module's `# Safety`.
    unsafe { k4::<C, false>(GgmlType::Q4_K, src, dst) }
}

#[inline(always)]
pub(super) unsafe fn q5_k<C: Bytes32>(src: &[u8], dst: &mut [f32]) {
    // SAFETY: the module's `# Safety`.
    unsafe { k4::<C, true>(GgmlType::Q5_K, src, dst) }
}

#[inline(always)]
pub(super) unsafe fn q6_k<C: Bytes32>(src: &[u8], dst: &mut [f32]) {
    // SAFETY: the module's `# Safety`.
    unsafe {
        let thirty_two = C::splat(32);
        for (b, y) in blocks(GgmlType::Q6_K, src, dst) {
            let d = C::f16(b, 208);
            let sc = &b[192..208];
            for (j, ((ql, qh), y)) in b[0..128]
                .chunks_exact(64)
                .zip(b[128..192].chunks_exact(32))
                .zip(y.chunks_exact_mut(128))
                .enumerate()
            {
                let (l0, l1) = (C::load(arr(ql)), C::load(arr(&ql[32..])));
                let h = C::load(arr(qh));
                let lows = [
                    C::shr_mask(l0, 0, 0xF),
                    C::shr_mask(l1, 0, 0xF),
                    C::shr_mask(l0, 4, 0xF),
                    C::shr_mask(l1, 4, 0xF),
                ];
                for (p, (low, y)) in lows.into_iter().zip(y.chunks_exact_mut(32)).enumerate() {
                    let high = C::shl(C::shr_mask(h, 2 * p as u32, 3), 4);
                    let q = C::sub(C::or(low, high), thirty_two);
                    // Reference order: (d · scale) · q.
                    let s = 8 * j + 2 * p;
                    let (d0, d1) = (d * f32::from(sc[s] as i8), d * f32::from(sc[s + 1] as i8));
                    C::store_mul_i8(q, d0, d1, arr_mut(y));
                }
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
