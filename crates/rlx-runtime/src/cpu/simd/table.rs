//! f16 → f32 by table lookup: a scalar load the kernels can broadcast straight
//! from memory, where F16C would cost vector shuffles per block scale.

use std::sync::OnceLock;

/// `table[bits] == f16::from_bits(bits).to_f32()`, exactly.
pub(crate) fn f16_table() -> &'static [f32; 65536] {
    static TABLE: OnceLock<Box<[f32; 65536]>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let v: Vec<f32> = (0..=u16::MAX)
            .map(|b| half::f16::from_bits(b).to_f32())
            .collect();
        v.into_boxed_slice().try_into().expect("65536 entries")
    })
}

/// `table[e] == rlx_gguf::blocks::e8m0_half(e)`: MXFP4's block scale in one
/// load where the function takes several instructions.
pub(crate) fn e8m0_table() -> &'static [f32; 256] {
    static TABLE: OnceLock<[f32; 256]> = OnceLock::new();
    TABLE.get_or_init(|| std::array::from_fn(|e| rlx_gguf::blocks::e8m0_half(e as u8)))
}
