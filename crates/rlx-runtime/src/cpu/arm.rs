//! AArch64 instructions the kernels share whose Rust intrinsics are not
//! usable at our minimum Rust version.

use std::arch::aarch64::*;
use std::arch::asm;

/// Four f16 values (as bits) to f32: `FCVTL`, base Armv8.
#[inline(always)]
pub(crate) unsafe fn f16x4_to_f32(h: uint16x4_t) -> float32x4_t {
    let w: float32x4_t;
    // SAFETY: `FCVTL Vd.4S, Vn.4H` reads and writes only registers.
    unsafe {
        asm!(
        "fcvtl {w:v}.4s, {h:v}.4h",
        w = out(vreg) w,
        h = in(vreg) h,
        options(pure, nomem, nostack),
        )
    };
    w
}

/// `acc += Σ a·b` over each lane's 4 signed bytes: `SDOT` (dotprod).
///
/// # Safety
/// The CPU has dotprod.
#[inline]
#[target_feature(enable = "dotprod")]
pub(crate) unsafe fn sdot(mut acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    // SAFETY: `SDOT Vd.4S, Vn.16B, Vm.16B` reads and writes only registers.
    unsafe {
        asm!(
        "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
        acc = inout(vreg) acc,
        a = in(vreg) a,
        b = in(vreg) b,
        options(pure, nomem, nostack),
        )
    };
    acc
}

/// `acc += Σ w·x` per lane over 4 bytes, `x` being lane `LANE`'s 4 bytes of
/// `x` in every lane: indexed `SDOT` (dotprod).
///
/// # Safety
/// The CPU has dotprod.
#[inline]
#[target_feature(enable = "dotprod")]
pub(crate) unsafe fn sdot_lane<const LANE: usize>(
    mut acc: int32x4_t,
    w: int8x16_t,
    x: int8x16_t,
) -> int32x4_t {
    // SAFETY: `SDOT Vd.4S, Vn.16B, Vm.4B[i]` reads and writes only
    // registers.
    unsafe {
        asm!(
        "sdot {acc:v}.4s, {w:v}.16b, {x:v}.4b[{lane}]",
        acc = inout(vreg) acc,
        w = in(vreg) w,
        x = in(vreg) x,
        lane = const LANE,
        options(pure, nomem, nostack),
        )
    };
    acc
}

/// `acc += w · xᵀ` for `w` (2 rows × 8 u8) and `x` (2 rows × 8 i8), a 2×2
/// block of sums: `USMMLA` (i8mm).
///
/// # Safety
/// The CPU has i8mm.
#[inline]
#[target_feature(enable = "i8mm")]
pub(crate) unsafe fn usmmla(mut acc: int32x4_t, w: uint8x16_t, x: int8x16_t) -> int32x4_t {
    // SAFETY: `USMMLA Vd.4S, Vn.16B, Vm.16B` reads and writes only
    // registers.
    unsafe {
        asm!(
        "usmmla {acc:v}.4s, {w:v}.16b, {x:v}.16b",
        acc = inout(vreg) acc,
        w = in(vreg) w,
        x = in(vreg) x,
        options(pure, nomem, nostack),
        )
    };
    acc
}
