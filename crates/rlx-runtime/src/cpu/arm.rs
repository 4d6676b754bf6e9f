//! AArch64 instructions the kernels share whose Rust intrinsics are not
//! usable at our minimum Rust version.

use std::arch::aarch64::*;
use std::arch::asm;

/// Four f16 values (as bits) to f32: `FCVTL`, base Armv8.
#[inline(always)]
pub(crate) unsafe fn f16x4_to_f32(h: uint16x4_t) -> float32x4_t {
    let w: float32x4_t;
    // SAFETY: `FCVTL Vd.4S, Vn.4H` reads and writes only registers.
    asm!(
        "fcvtl {w:v}.4s, {h:v}.4h",
        w = out(vreg) w,
        h = in(vreg) h,
        options(pure, nomem, nostack),
    );
    w
}
