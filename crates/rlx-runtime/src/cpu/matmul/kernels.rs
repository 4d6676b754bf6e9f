//! The one place that maps (weight type, precision, ISA) to kernel functions.
//!
//! Every SIMD function handed out here was chosen for the requested ISA, so a
//! caller that checked `isa <= Isa::detect()` may call it.

use rlx_gguf::GgmlType;

use super::super::features::Isa;
use super::act::ActFormat;
use super::{exact, scalar, Precision};

/// Dot product of one packed weight row with one quantized activation row of
/// the same length. Unsafe only because SIMD kernels need their ISA.
pub(super) type VecDot = unsafe fn(w: &[u8], a: &[u8]) -> f32;

/// f32 dot product over `min(x.len(), w.len())` elements. Unsafe only because
/// SIMD kernels need their ISA.
pub(super) type DotF32 = unsafe fn(x: &[f32], w: &[f32]) -> f32;

/// Dequantizes `dst.len()` elements of whole rows.
pub(super) type DequantFn = unsafe fn(src: &[u8], dst: &mut [f32]);

/// Dequantizes whole rows; the result equals `rlx_gguf::dequantize` bit for bit.
#[derive(Clone, Copy)]
pub(super) enum Dequant {
    Reference(GgmlType),
    /// A SIMD version for one type.
    Fast(DequantFn),
}

impl Dequant {
    /// # Safety
    /// A `Fast` function must come from [`row_kernel`] for an ISA the CPU has.
    pub unsafe fn apply(self, src: &[u8], dst: &mut [f32]) {
        match self {
            Dequant::Reference(ty) => {
                rlx_gguf::dequantize(ty, src, dst).expect("weight shape was checked in matmul")
            }
            Dequant::Fast(f) => f(src, dst),
        }
    }
}

/// How one weight's outputs are computed.
#[derive(Clone, Copy)]
pub(super) enum RowKernel {
    Quant { fmt: ActFormat, dot: VecDot },
    Exact { dequant: Dequant },
}

impl RowKernel {
    pub fn act_format(&self) -> Option<ActFormat> {
        match self {
            RowKernel::Quant { fmt, .. } => Some(*fmt),
            RowKernel::Exact { .. } => None,
        }
    }
}

pub(super) fn row_kernel(ty: GgmlType, precision: Precision, isa: Isa) -> RowKernel {
    if precision == Precision::Quantized {
        if let Some((fmt, dot)) = quant_dot(ty, isa) {
            return RowKernel::Quant { fmt, dot };
        }
    }
    RowKernel::Exact {
        dequant: dequant(ty, isa),
    }
}

/// The activation format and best integer dot kernel for `ty` at `isa`, or
/// `None` if `ty` has no quantized kernel.
pub(super) fn quant_dot(ty: GgmlType, isa: Isa) -> Option<(ActFormat, VecDot)> {
    use GgmlType as T;
    let fmt = match ty {
        T::Q4_0 | T::Q5_0 | T::Q8_0 | T::IQ4_NL | T::MXFP4 => ActFormat::Q8_0,
        T::Q4_1 | T::Q5_1 => ActFormat::Q8_1,
        T::Q2_K | T::Q3_K | T::Q4_K | T::Q5_K | T::Q6_K | T::IQ4_XS => ActFormat::Q8_K,
        _ => return None,
    };
    #[cfg(target_arch = "x86_64")]
    {
        use super::avx2;
        if isa >= Isa::Avx2 {
            let f: VecDot = match ty {
                T::Q4_0 => avx2::vec_dot_q4_0,
                T::Q4_1 => avx2::vec_dot_q4_1,
                T::Q5_0 => avx2::vec_dot_q5_0,
                T::Q5_1 => avx2::vec_dot_q5_1,
                T::Q8_0 => avx2::vec_dot_q8_0,
                T::IQ4_NL => avx2::vec_dot_iq4_nl,
                T::MXFP4 => avx2::vec_dot_mxfp4,
                T::Q2_K => avx2::vec_dot_q2_k,
                T::Q3_K => avx2::vec_dot_q3_k,
                T::Q4_K => avx2::vec_dot_q4_k,
                T::Q5_K => avx2::vec_dot_q5_k,
                T::Q6_K => avx2::vec_dot_q6_k,
                T::IQ4_XS => avx2::vec_dot_iq4_xs,
                _ => unreachable!("every type with an activation format has an AVX2 kernel"),
            };
            return Some((fmt, f));
        }
    }
    let _ = isa;
    Some((fmt, scalar_quant_dot(ty)?))
}

/// The portable reference kernel for `ty`.
pub(super) fn scalar_quant_dot(ty: GgmlType) -> Option<VecDot> {
    use GgmlType as T;
    Some(match ty {
        T::Q4_0 => scalar::vec_dot_q4_0,
        T::Q4_1 => scalar::vec_dot_q4_1,
        T::Q5_0 => scalar::vec_dot_q5_0,
        T::Q5_1 => scalar::vec_dot_q5_1,
        T::Q8_0 => scalar::vec_dot_q8_0,
        T::IQ4_NL => scalar::vec_dot_iq4_nl,
        T::MXFP4 => scalar::vec_dot_mxfp4,
        T::Q2_K => scalar::vec_dot_q2_k,
        T::Q3_K => scalar::vec_dot_q3_k,
        T::Q4_K => scalar::vec_dot_q4_k,
        T::Q5_K => scalar::vec_dot_q5_k,
        T::Q6_K => scalar::vec_dot_q6_k,
        T::IQ4_XS => scalar::vec_dot_iq4_xs,
        _ => return None,
    })
}

pub(super) fn f32_dot(isa: Isa) -> DotF32 {
    #[cfg(target_arch = "x86_64")]
    {
        use super::{avx2, avx512};
        match isa {
            Isa::Avx512 => return avx512::dot_f32,
            Isa::Avx2 => return avx2::dot_f32,
            Isa::Scalar => {}
        }
    }
    let _ = isa;
    exact::dot_f32
}

fn dequant(ty: GgmlType, isa: Isa) -> Dequant {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 {
        use super::avx2;
        let f: Option<DequantFn> = match ty {
            GgmlType::F16 => Some(avx2::dequant_f16),
            GgmlType::BF16 => Some(avx2::dequant_bf16),
            GgmlType::Q8_0 => Some(avx2::dequant_q8_0),
            GgmlType::Q4_0 => Some(avx2::dequant_q4_0),
            GgmlType::Q4_K => Some(avx2::dequant_q4_k),
            GgmlType::Q6_K => Some(avx2::dequant_q6_k),
            _ => None,
        };
        if let Some(f) = f {
            return Dequant::Fast(f);
        }
    }
    let _ = isa;
    Dequant::Reference(ty)
}
