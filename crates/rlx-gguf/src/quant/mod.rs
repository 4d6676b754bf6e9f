//! Scalar reference (de)quantization for every ggml block format.
//!
//! These routines are the truth that every SIMD and GPU kernel is tested
//! against, so they are written for obviousness, one block at a time, with
//! float operations in the same order as ggml's reference code (which makes
//! them bit-identical to it, not just close).

mod codes;
mod iq;
pub(crate) mod iq_grids;
mod kquants;
mod legacy;
mod quantize;

pub(crate) use crate::blocks::{f16_at, f32_at, i16_at, u32_at};
use crate::GgmlType;

pub use codes::{affine_max_code, affine_sub_block};

/// Why a (de)quantization call was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    #[error("{ty}: {elems} elements is not a whole number of {block}-element blocks")]
    PartialBlock {
        ty: GgmlType,
        elems: usize,
        block: usize,
    },
    #[error("{ty}: {elems} elements need {expected} bytes, got {actual}")]
    ByteLength {
        ty: GgmlType,
        elems: usize,
        expected: usize,
        actual: usize,
    },
    #[error("{ty}: no reference {op} for this type")]
    Unsupported { ty: GgmlType, op: &'static str },
}

type DequantBlock = fn(&[u8], &mut [f32]);
type QuantBlock = fn(&[f32], &mut [u8]);

fn dequant_block_fn(ty: GgmlType) -> Option<DequantBlock> {
    use GgmlType::*;
    Some(match ty {
        F32 => legacy::dequant_f32,
        F16 => legacy::dequant_f16,
        BF16 => legacy::dequant_bf16,
        F64 => legacy::dequant_f64,
        I8 => legacy::dequant_i8,
        I16 => legacy::dequant_i16,
        I32 => legacy::dequant_i32,
        I64 => legacy::dequant_i64,
        Q4_0 => legacy::dequant_q4_0,
        Q4_1 => legacy::dequant_q4_1,
        Q5_0 => legacy::dequant_q5_0,
        Q5_1 => legacy::dequant_q5_1,
        Q8_0 => legacy::dequant_q8_0,
        Q8_1 => legacy::dequant_q8_1,
        Q2_K => kquants::dequant_q2_k,
        Q3_K => kquants::dequant_q3_k,
        Q4_K => kquants::dequant_q4_k,
        Q5_K => kquants::dequant_q5_k,
        Q6_K => kquants::dequant_q6_k,
        Q8_K => kquants::dequant_q8_k,
        IQ2_XXS => iq::dequant_block_iq2_xxs,
        IQ2_XS => iq::dequant_block_iq2_xs,
        IQ2_S => iq::dequant_block_iq2_s,
        IQ3_XXS => iq::dequant_block_iq3_xxs,
        IQ3_S => iq::dequant_block_iq3_s,
        IQ1_S => iq::dequant_block_iq1_s,
        IQ1_M => iq::dequant_block_iq1_m,
        IQ4_NL => iq::dequant_block_iq4_nl,
        IQ4_XS => iq::dequant_block_iq4_xs,
        TQ1_0 => iq::dequant_block_tq1_0,
        TQ2_0 => iq::dequant_block_tq2_0,
        MXFP4 => iq::dequant_block_mxfp4,
        NVFP4 => iq::dequant_block_nvfp4,
        Q1_0 => iq::dequant_block_q1_0,
        Q2_0 => iq::dequant_block_q2_0,
    })
}

fn quant_block_fn(ty: GgmlType) -> Option<QuantBlock> {
    use GgmlType::*;
    Some(match ty {
        Q8_0 => quantize::quant_block_q8_0,
        Q8_1 => quantize::quant_block_q8_1,
        Q4_0 => quantize::quant_block_q4_0,
        Q4_1 => quantize::quant_block_q4_1,
        Q5_0 => quantize::quant_block_q5_0,
        Q5_1 => quantize::quant_block_q5_1,
        Q8_K => quantize::quant_block_q8_k,
        Q2_K => quantize::quant_block_q2_k,
        Q3_K => quantize::quant_block_q3_k,
        Q4_K => quantize::quant_block_q4_k,
        Q5_K => quantize::quant_block_q5_k,
        Q6_K => quantize::quant_block_q6_k,
        _ => return None,
    })
}

/// True if [`dequantize`] supports `ty`.
pub fn can_dequantize(ty: GgmlType) -> bool {
    dequant_block_fn(ty).is_some()
}

/// True if [`quantize`] supports `ty`.
pub fn can_quantize(ty: GgmlType) -> bool {
    quant_block_fn(ty).is_some()
}

fn check_lengths(ty: GgmlType, elems: usize, bytes: usize) -> Result<usize, QuantError> {
    let block = ty.block_elems();
    if !elems.is_multiple_of(block) {
        return Err(QuantError::PartialBlock { ty, elems, block });
    }
    let expected = elems / block * ty.block_bytes();
    if bytes != expected {
        return Err(QuantError::ByteLength {
            ty,
            elems,
            expected,
            actual: bytes,
        });
    }
    Ok(elems / block)
}

/// Dequantizes packed `src` of type `ty` into `dst` (one row, or a whole
/// contiguous tensor). `dst.len()` gives the element count; `src` must hold
/// exactly that many elements.
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    let f = dequant_block_fn(ty).ok_or(QuantError::Unsupported {
        ty,
        op: "dequantization",
    })?;
    check_lengths(ty, dst.len(), src.len())?;
    for (b, y) in src
        .chunks_exact(ty.block_bytes())
        .zip(dst.chunks_exact_mut(ty.block_elems()))
    {
        f(b, y);
    }
    Ok(())
}

/// Dequantizes `src` into a new vector of `src.len() / block_bytes * block_elems` values.
pub fn dequantize_to_vec(ty: GgmlType, src: &[u8]) -> Result<Vec<f32>, QuantError> {
    let n = src.len() / ty.block_bytes() * ty.block_elems();
    let mut out = vec![0f32; n];
    dequantize(ty, src, &mut out)?;
    Ok(out)
}

/// Quantizes `src` into `dst` with ggml's reference (non-imatrix) quantizer
/// for `ty`.
pub fn quantize(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    let f = quant_block_fn(ty).ok_or(QuantError::Unsupported {
        ty,
        op: "quantization",
    })?;
    check_lengths(ty, src.len(), dst.len())?;
    for (x, b) in src
        .chunks_exact(ty.block_elems())
        .zip(dst.chunks_exact_mut(ty.block_bytes()))
    {
        f(x, b);
    }
    Ok(())
}

/// Quantizes `src` into a new byte vector.
pub fn quantize_to_vec(ty: GgmlType, src: &[f32]) -> Result<Vec<u8>, QuantError> {
    let block = ty.block_elems();
    if !src.len().is_multiple_of(block) {
        return Err(QuantError::PartialBlock {
            ty,
            elems: src.len(),
            block,
        });
    }
    let mut out = vec![0u8; src.len() / block * ty.block_bytes()];
    quantize(ty, src, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_errors_name_the_type_and_sizes() {
        let mut out = [0f32; 32];
        let err = dequantize(GgmlType::Q4_0, &[0u8; 17], &mut out).unwrap_err();
        assert_eq!(
            err,
            QuantError::ByteLength {
                ty: GgmlType::Q4_0,
                elems: 32,
                expected: 18,
                actual: 17
            }
        );
        let mut out = [0f32; 33];
        assert!(matches!(
            dequantize(GgmlType::Q4_0, &[0u8; 18], &mut out),
            Err(QuantError::PartialBlock { .. })
        ));
    }
}
