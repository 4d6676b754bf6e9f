//! The block formats' codes, each written once: the legacy 32-element
//! blocks ([`Legacy`]: where the scale is and how the 32 codes unpack into
//! a [`Bytes32`]) and the K-quants' 32-element units ([`KQuant`]). The
//! dequantizers (`dequant.rs`), the AVX2 dots and the NEON dots all read
//! blocks through these, on every instruction set.
//!
//! No closure here holds a vector operation: a closure's body does not get
//! the entry point's target features, so the operations in it would be
//! calls rather than inlined instructions.
//!
//! # Safety
//! [`Legacy::codes`] and the [`KQuant`] methods call [`Bytes32`] methods: it may run only inlined
//! into an entry point compiled for their features (`cpu/simd`'s
//! `# Safety`). Blocks are read through bounds-checked slices and array
//! references.

use rlx_gguf::blocks::{e8m0_half, q3_k_scale, scale_min_k4, u32_at, KVALUES_FP4, KVALUES_IQ4NL};
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
    /// Bytes a block.
    const BYTES: usize = Self::TY.block_bytes();
    const SCALE: Scale;
    /// Unsigned codes and an f16 minimum at byte 2 (`d·q + m`), else
    /// signed codes (`d·q`).
    const MIN: bool;
    /// The code table [`Legacy::codes`] looks nibbles up in, if it does.
    const TABLE: &'static [i8; 16] = &[0; 16];
    /// What [`Legacy::unsigned`] adds to each code so that it fits an
    /// unsigned byte (0 for the formats with a minimum, whose codes are).
    const OFFSET: u8;

    /// The block's 32 codes in element order, given [`Legacy::TABLE`] as
    /// loaded by [`Bytes32::table`]. A format implements this or
    /// [`Legacy::unsigned`], whichever its bits give directly.
    #[inline(always)]
    unsafe fn codes<C: Bytes32>(b: &[u8], table: C::Table) -> C {
        // SAFETY: the module's `# Safety`.
        unsafe {
            let u = Self::unsigned::<C>(b, table);
            if Self::OFFSET == 0 {
                u
            } else {
                C::sub(u, C::splat(Self::OFFSET))
            }
        }
    }

    /// The block's scale `d` and offset `o` of its [`Legacy::unsigned`]
    /// codes, `value = d·code − o`: `o` = `OFFSET·d`, or the negated
    /// minimum for a format with one (`d·q + m`).
    #[inline(always)]
    unsafe fn factors<C: Bytes32>(b: &[u8]) -> (f32, f32) {
        // SAFETY: the module's `# Safety`.
        unsafe {
            let d = match Self::SCALE {
                Scale::F16 => C::f16(b, 0),
                Scale::E8m0 => e8m0_half(b[0]),
            };
            if Self::MIN {
                (d, -C::f16(b, 2))
            } else {
                (d, f32::from(Self::OFFSET) * d)
            }
        }
    }

    /// [`Legacy::codes`] plus [`Legacy::OFFSET`], each an unsigned byte:
    /// the operand of an unsigned × signed integer dot, whose sum the
    /// caller corrects by `OFFSET · Σx`.
    #[inline(always)]
    unsafe fn unsigned<C: Bytes32>(b: &[u8], table: C::Table) -> C {
        // SAFETY: the module's `# Safety`.
        unsafe {
            let q = Self::codes::<C>(b, table);
            if Self::OFFSET == 0 {
                q
            } else {
                C::sub(q, C::splat(Self::OFFSET.wrapping_neg()))
            }
        }
    }
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
    const OFFSET: u8 = 128;

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
    const OFFSET: u8 = 8;

    #[inline(always)]
    unsafe fn unsigned<C: Bytes32>(b: &[u8], _: C::Table) -> C {
        // SAFETY: the module's `# Safety`.
        unsafe { C::nibbles(at(b, 2)) }
    }
}

/// Nibbles as they are (the minimum is added apart).
impl Legacy for Q4_1 {
    const TY: GgmlType = GgmlType::Q4_1;
    const SCALE: Scale = Scale::F16;
    const MIN: bool = true;
    const OFFSET: u8 = 0;

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
    const OFFSET: u8 = 16;

    #[inline(always)]
    unsafe fn unsigned<C: Bytes32>(b: &[u8], _: C::Table) -> C {
        // SAFETY: the module's `# Safety`.
        unsafe { fifth_bit(C::nibbles(at(b, 6)), u32_at(b, 2)) }
    }
}

/// `nibbles` with 16 added where bit `e` of `bits` is set, for element `e`.
#[inline(always)]
unsafe fn fifth_bit<C: Bytes32>(nibbles: C, bits: u32) -> C {
    // SAFETY: the module's `# Safety`.
    unsafe { C::or(nibbles, C::and(C::from_bits(bits), C::splat(0x10))) }
}

/// Nibbles with a fifth bit from the mask at byte 4.
impl Legacy for Q5_1 {
    const TY: GgmlType = GgmlType::Q5_1;
    const SCALE: Scale = Scale::F16;
    const MIN: bool = true;
    const OFFSET: u8 = 0;

    #[inline(always)]
    unsafe fn codes<C: Bytes32>(b: &[u8], _: C::Table) -> C {
        // SAFETY: the module's `# Safety`.
        unsafe { fifth_bit(C::nibbles(at(b, 8)), u32_at(b, 4)) }
    }
}

/// Nibbles through the IQ4_NL code table.
impl Legacy for Iq4Nl {
    const TY: GgmlType = GgmlType::IQ4_NL;
    const SCALE: Scale = Scale::F16;
    const MIN: bool = false;
    const TABLE: &'static [i8; 16] = &KVALUES_IQ4NL;
    const OFFSET: u8 = 128;

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
    const OFFSET: u8 = 128;

    #[inline(always)]
    unsafe fn codes<C: Bytes32>(b: &[u8], table: C::Table) -> C {
        // SAFETY: the module's `# Safety`.
        unsafe { C::lookup(table, C::nibbles(at(b, 1))) }
    }
}

/// A 256-element K-quant block: eight 32-element units, unit `u` holding
/// elements `32u .. 32u + 32`, each unit's codes unsigned as stored (Q3_K's
/// are the value + 4, Q6_K's the value + 32) with the scales of its two
/// 16-element halves (Q2_K, Q3_K, Q6_K) or its own (Q4_K, Q5_K) apart.
/// Units come four at a time, as the formats pack them: the four share
/// their loads.
pub(super) trait KQuant {
    const TY: GgmlType;
    /// Bytes a block.
    const BYTES: usize = Self::TY.block_bytes();

    /// Elements a sub-block with its own scale (and offset) has: 16 or 32.
    const SUB: usize;

    /// Sub-block `s`'s scale `d` and offset `o` of the stored (unsigned)
    /// codes, `value = d·code − o`, each the reference's product.
    unsafe fn factors<C: Bytes32>(b: &[u8], s: usize) -> (f32, f32);
    /// The bits a block's units share, loaded once a block (Q3_K's and
    /// Q5_K's high bits; nothing for the others).
    unsafe fn high<C: Bytes32>(b: &[u8]) -> C;
    /// Units `4q .. 4q + 4` (`q` 0 or 1), given [`KQuant::high`].
    unsafe fn quad<C: Bytes32>(b: &[u8], high: C, q: usize) -> [C; 4];
}

pub(super) struct Q2K;
pub(super) struct Q3K;
pub(super) struct Q4K;
pub(super) struct Q5K;
pub(super) struct Q6K;

/// Four 2-bit fields of 32 bytes at `at`: bit pairs 0, 2, 4, 6.
#[inline(always)]
unsafe fn crumbs<C: Bytes32>(b: &[u8], at: usize) -> [C; 4] {
    // SAFETY: the module's `# Safety`.
    unsafe {
        let bits = C::load(self::at(b, at));
        [
            C::shr_mask(bits, 0, 3),
            C::shr_mask(bits, 2, 3),
            C::shr_mask(bits, 4, 3),
            C::shr_mask(bits, 6, 3),
        ]
    }
}

/// The low then the high nibbles of 32 bytes at `at`, and of the 32 after.
#[inline(always)]
unsafe fn nibble_pairs<C: Bytes32>(b: &[u8], at: usize) -> [C; 4] {
    // SAFETY: the module's `# Safety`.
    unsafe {
        let (c0, c1) = (C::load(self::at(b, at)), C::load(self::at(b, at + 32)));
        [
            C::shr_mask(c0, 0, 0xF),
            C::shr_mask(c0, 4, 0xF),
            C::shr_mask(c1, 0, 0xF),
            C::shr_mask(c1, 4, 0xF),
        ]
    }
}

/// `low[i]` with `value` where bit `first + i` of `high`'s byte is set.
#[inline(always)]
unsafe fn with_bits<C: Bytes32>(low: [C; 4], high: C, first: usize, value: C) -> [C; 4] {
    // SAFETY: the module's `# Safety`.
    unsafe {
        let bit = |i: usize| (first + i) as u32;
        [
            C::or(low[0], C::bit_value(high, bit(0), value)),
            C::or(low[1], C::bit_value(high, bit(1), value)),
            C::or(low[2], C::bit_value(high, bit(2), value)),
            C::or(low[3], C::bit_value(high, bit(3), value)),
        ]
    }
}

/// Two bits a value: 64 bytes from 16, each 32 holding a quad.
impl KQuant for Q2K {
    const TY: GgmlType = GgmlType::Q2_K;
    const SUB: usize = 16;

    /// 4-bit scales and minimums in the 16 bytes at 0.
    #[inline(always)]
    unsafe fn factors<C: Bytes32>(b: &[u8], s: usize) -> (f32, f32) {
        // SAFETY: the module's `# Safety`.
        let (d, dmin) = unsafe { (C::f16(b, 80), C::f16(b, 82)) };
        (d * f32::from(b[s] & 0xF), dmin * f32::from(b[s] >> 4))
    }

    #[inline(always)]
    unsafe fn high<C: Bytes32>(_: &[u8]) -> C {
        // SAFETY: the module's `# Safety`.
        unsafe { C::splat(0) }
    }

    #[inline(always)]
    unsafe fn quad<C: Bytes32>(b: &[u8], _: C, q: usize) -> [C; 4] {
        // SAFETY: the module's `# Safety`.
        unsafe { crumbs(b, 16 + 32 * q) }
    }
}

/// Q2_K's layout from 32, with a third bit (4) per value from the 32 bytes
/// at 0: bit `u` of byte `e` for element `e` of unit `u`.
impl KQuant for Q3K {
    const TY: GgmlType = GgmlType::Q3_K;
    const SUB: usize = 16;

    /// 6-bit signed scales in the 12 bytes at 96; codes are the value + 4.
    #[inline(always)]
    unsafe fn factors<C: Bytes32>(b: &[u8], s: usize) -> (f32, f32) {
        // SAFETY: the module's `# Safety`.
        let d = unsafe { C::f16(b, 108) } * f32::from(q3_k_scale(&b[96..108], s));
        (d, 4.0 * d)
    }

    #[inline(always)]
    unsafe fn high<C: Bytes32>(b: &[u8]) -> C {
        // SAFETY: the module's `# Safety`.
        unsafe { C::load(at(b, 0)) }
    }

    #[inline(always)]
    unsafe fn quad<C: Bytes32>(b: &[u8], high: C, q: usize) -> [C; 4] {
        // SAFETY: the module's `# Safety`.
        unsafe { with_bits(crumbs::<C>(b, 32 + 32 * q), high, 4 * q, C::splat(4)) }
    }
}

/// Q4_K's and Q5_K's unit `u`: `d·sc` and `dmin·mn` with the 6-bit scale
/// and minimum of the 12 bytes at 4.
#[inline(always)]
unsafe fn k4_factors<C: Bytes32>(b: &[u8], u: usize) -> (f32, f32) {
    let (sc, mn) = scale_min_k4(u, &b[4..16]);
    // SAFETY: the module's `# Safety`.
    let (d, dmin) = unsafe { (C::f16(b, 0), C::f16(b, 2)) };
    (d * f32::from(sc), dmin * f32::from(mn))
}

/// Nibbles: 128 bytes from 16, each 32 the low then the high nibbles of
/// two units.
impl KQuant for Q4K {
    const TY: GgmlType = GgmlType::Q4_K;
    const SUB: usize = 32;

    #[inline(always)]
    unsafe fn factors<C: Bytes32>(b: &[u8], s: usize) -> (f32, f32) {
        // SAFETY: the module's `# Safety`.
        unsafe { k4_factors::<C>(b, s) }
    }

    #[inline(always)]
    unsafe fn high<C: Bytes32>(_: &[u8]) -> C {
        // SAFETY: the module's `# Safety`.
        unsafe { C::splat(0) }
    }

    #[inline(always)]
    unsafe fn quad<C: Bytes32>(b: &[u8], _: C, q: usize) -> [C; 4] {
        // SAFETY: the module's `# Safety`.
        unsafe { nibble_pairs(b, 16 + 64 * q) }
    }
}

/// Q4_K's nibbles from 48, with a fifth bit (16) per value from the 32
/// bytes at 16: bit `u` of byte `e` for element `e` of unit `u`.
impl KQuant for Q5K {
    const TY: GgmlType = GgmlType::Q5_K;
    const SUB: usize = 32;

    #[inline(always)]
    unsafe fn factors<C: Bytes32>(b: &[u8], s: usize) -> (f32, f32) {
        // SAFETY: the module's `# Safety`.
        unsafe { k4_factors::<C>(b, s) }
    }

    #[inline(always)]
    unsafe fn high<C: Bytes32>(b: &[u8]) -> C {
        // SAFETY: the module's `# Safety`.
        unsafe { C::load(at(b, 16)) }
    }

    #[inline(always)]
    unsafe fn quad<C: Bytes32>(b: &[u8], high: C, q: usize) -> [C; 4] {
        // SAFETY: the module's `# Safety`.
        unsafe { with_bits(nibble_pairs::<C>(b, 48 + 64 * q), high, 4 * q, C::splat(16)) }
    }
}

/// Four low bits from the 128 bytes at 0 (per 128-element half: the low
/// nibbles of bytes 0..32 and 32..64, then their high nibbles) and two high
/// bits from the 64 bytes at 128 (per half, bit pairs 0, 2, 4, 6 of 32
/// bytes).
impl KQuant for Q6K {
    const TY: GgmlType = GgmlType::Q6_K;
    const SUB: usize = 16;

    /// 8-bit signed scales at 192; codes are the value + 32.
    #[inline(always)]
    unsafe fn factors<C: Bytes32>(b: &[u8], s: usize) -> (f32, f32) {
        // SAFETY: the module's `# Safety`.
        let d = unsafe { C::f16(b, 208) } * f32::from(b[192 + s] as i8);
        (d, 32.0 * d)
    }

    #[inline(always)]
    unsafe fn high<C: Bytes32>(_: &[u8]) -> C {
        // SAFETY: the module's `# Safety`.
        unsafe { C::splat(0) }
    }

    #[inline(always)]
    unsafe fn quad<C: Bytes32>(b: &[u8], _: C, q: usize) -> [C; 4] {
        // SAFETY: the module's `# Safety`.
        unsafe {
            let (l0, l1) = (C::load(at(b, 64 * q)), C::load(at(b, 64 * q + 32)));
            let lows = [
                C::shr_mask(l0, 0, 0xF),
                C::shr_mask(l1, 0, 0xF),
                C::shr_mask(l0, 4, 0xF),
                C::shr_mask(l1, 4, 0xF),
            ];
            let [h0, h1, h2, h3] = crumbs::<C>(b, 128 + 32 * q);
            [
                C::or(lows[0], C::shl(h0, 4)),
                C::or(lows[1], C::shl(h1, 4)),
                C::or(lows[2], C::shl(h2, 4)),
                C::or(lows[3], C::shl(h3, 4)),
            ]
        }
    }
}
