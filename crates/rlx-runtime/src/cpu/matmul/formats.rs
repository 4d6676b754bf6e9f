//! The legacy 32-element block formats, each written once: where a block's
//! scale is and how its 32 codes unpack into a [`Bytes32`]. The
//! dequantizers (`dequant.rs`), the AVX2 dots and the NEON dots all read
//! blocks through these, on every instruction set.
//!
//! # Safety
//! [`Legacy::codes`] calls [`Bytes32`] methods: it may run only inlined
//! into an entry point compiled for their features (`cpu/simd`'s
//! `# Safety`). Blocks are read through bounds-checked slices and array
//! references.

use rlx_gguf::blocks::{u32_at, KVALUES_FP4, KVALUES_IQ4NL};
use rlx_gguf::GgmlType;

use crate::cpu::simd::Bytes32;

/// How a block's scale is stored.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Scale {
    /// An f16 at byte 0.
    F16,
    /// An E8M0 exponent at byte 0, as `rlx_gguf::blocks::e8m0_half` reads it.
    E8m0,
}

/// A 32-element block: its scale, an optional f16 minimum, and its codes.
pub(super) trait Legacy {
    const TY: GgmlType;
    const SCALE: Scale;
    /// Unsigned codes and an f16 minimum at byte 2 (`d·q + m`), else
    /// signed codes (`d·q`).
    const MIN: bool;
    /// The code table [`Legacy::codes`] looks nibbles up in, if it does.
    const TABLE: &'static [i8; 16] = &[0; 16];

    /// The block's 32 codes in element order, given [`Legacy::TABLE`] as
    /// loaded by [`Bytes32::table`].
    unsafe fn codes<C: Bytes32>(b: &[u8], table: C::Table) -> C;
}

/// The first `N` bytes of `s` from `at` on, as an array.
#[inline(always)]
fn at<const N: usize>(s: &[u8], at: usize) -> &[u8; N] {
    s[at..at + N]
        .try_into()
        .expect("length checked by the slice")
}

pub(super) struct Q8_0;
pub(super) struct Q4_0;
pub(super) struct Q4_1;
pub(super) struct Q5_0;
pub(super) struct Q5_1;
pub(super) struct Iq4Nl;
pub(super) struct Mxfp4;

impl Legacy for Q8_0 {
    const TY: GgmlType = GgmlType::Q8_0;
    const SCALE: Scale = Scale::F16;
    const MIN: bool = false;

    #[inline(always)]
    unsafe fn codes<C: Bytes32>(b: &[u8], _: C::Table) -> C {
        // SAFETY: the module's `# Safety`.
        unsafe { C::load(at(b, 2)) }
    }
}

/// Nibbles less 8.
impl Legacy for Q4_0 {
    const TY: GgmlType = GgmlType::Q4_0;
    const SCALE: Scale = Scale::F16;
    const MIN: bool = false;

    #[inline(always)]
    unsafe fn codes<C: Bytes32>(b: &[u8], _: C::Table) -> C {
        // SAFETY: the module's `# Safety`.
        unsafe { C::sub(C::nibbles(at(b, 2)), C::splat(8)) }
    }
}

/// Nibbles as they are (the minimum is added apart).
impl Legacy for Q4_1 {
    const TY: GgmlType = GgmlType::Q4_1;
    const SCALE: Scale = Scale::F16;
    const MIN: bool = true;

    #[inline(always)]
    unsafe fn codes<C: Bytes32>(b: &[u8], _: C::Table) -> C {
        // SAFETY: the module's `# Safety`.
        unsafe { C::nibbles(at(b, 4)) }
    }
}

/// Nibbles with a fifth bit from the mask at byte 2, less 16.
impl Legacy for Q5_0 {
    const TY: GgmlType = GgmlType::Q5_0;
    const SCALE: Scale = Scale::F16;
    const MIN: bool = false;

    #[inline(always)]
    unsafe fn codes<C: Bytes32>(b: &[u8], _: C::Table) -> C {
        // SAFETY: the module's `# Safety`.
        unsafe {
            // A clear fifth bit means q − 16 < 0: set the byte's top nibble.
            let neg = C::andnot(C::from_bits(u32_at(b, 2)), C::splat(0xF0));
            C::or(C::nibbles(at(b, 6)), neg)
        }
    }
}

/// Nibbles with a fifth bit from the mask at byte 4.
impl Legacy for Q5_1 {
    const TY: GgmlType = GgmlType::Q5_1;
    const SCALE: Scale = Scale::F16;
    const MIN: bool = true;

    #[inline(always)]
    unsafe fn codes<C: Bytes32>(b: &[u8], _: C::Table) -> C {
        // SAFETY: the module's `# Safety`.
        unsafe {
            let high = C::and(C::from_bits(u32_at(b, 4)), C::splat(0x10));
            C::or(C::nibbles(at(b, 8)), high)
        }
    }
}

/// Nibbles through the IQ4_NL code table.
impl Legacy for Iq4Nl {
    const TY: GgmlType = GgmlType::IQ4_NL;
    const SCALE: Scale = Scale::F16;
    const MIN: bool = false;
    const TABLE: &'static [i8; 16] = &KVALUES_IQ4NL;

    #[inline(always)]
    unsafe fn codes<C: Bytes32>(b: &[u8], table: C::Table) -> C {
        // SAFETY: the module's `# Safety`.
        unsafe { C::lookup(table, C::nibbles(at(b, 2))) }
    }
}

/// Nibbles through the E2M1 table (its values doubled; the scale halved).
impl Legacy for Mxfp4 {
    const TY: GgmlType = GgmlType::MXFP4;
    const SCALE: Scale = Scale::E8m0;
    const MIN: bool = false;
    const TABLE: &'static [i8; 16] = &KVALUES_FP4;

    #[inline(always)]
    unsafe fn codes<C: Bytes32>(b: &[u8], table: C::Table) -> C {
        // SAFETY: the module's `# Safety`.
        unsafe { C::lookup(table, C::nibbles(at(b, 1))) }
    }
}
