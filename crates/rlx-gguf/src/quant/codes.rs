//! The integer block formats seen as unsigned byte codes with one affine map
//! per sub-block: `value = scale · code − offset`.
//!
//! Integer matrix kernels want every format in one shape: u8 codes they can
//! feed to unsigned×signed byte dot products, and per-sub-block f32 factors
//! applied after the integer sum. `Σ value·x = scale·Σ code·x − offset·Σ x`,
//! so a kernel needs only the activation sums besides the integer dot. The
//! facts of that view live here; the runtime's format decoders produce it.

use crate::GgmlType;

/// Elements per affine sub-block of `ty`, or `None` if `ty` has no exact
/// code form (floats, codebook formats).
pub fn affine_sub_block(ty: GgmlType) -> Option<usize> {
    use GgmlType::*;
    match ty {
        Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q4_K | Q5_K | IQ4_NL => Some(32),
        Q2_K | Q3_K | Q6_K => Some(16),
        _ => None,
    }
}

/// The largest affine code of `ty` (from the bit widths,
/// whatever the block bytes), or `None` where [`affine_sub_block`] is.
/// Codes up to 127 also read as signed bytes, for signed×signed dot
/// products.
pub fn affine_max_code(ty: GgmlType) -> Option<u8> {
    use GgmlType::*;
    Some(match ty {
        Q8_0 | IQ4_NL => 255,
        Q6_K => 63,
        Q5_0 | Q5_1 | Q5_K => 31,
        Q4_0 | Q4_1 | Q4_K => 15,
        Q3_K => 7,
        Q2_K => 3,
        _ => return None,
    })
}
