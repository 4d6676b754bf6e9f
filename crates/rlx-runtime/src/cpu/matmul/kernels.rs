//! The one place that maps (weight type, precision, ISA) to kernel functions.
//!
//! Every SIMD function handed out here was chosen for the requested ISA, so a
//! caller that checked `isa <= Isa::detect()` may call it.

use rlx_gguf::GgmlType;

use super::super::features::Isa;
use super::act::{ActFormat, ActPanels};
use super::{exact, scalar, Precision};

/// Dot product of one packed weight row with one quantized activation row of
/// the same length. Unsafe only because SIMD kernels need their ISA.
pub(super) type VecDot = unsafe fn(w: &[u8], a: &[u8]) -> f32;

/// `out[i][col + r]` = row `r` of `w` (consecutive rows of `row_bytes`) ·
/// quantized activation row `i` of `acts` (rows of `act_row_bytes`), for
/// every row of `w` and `i < out.len()`. Unsafe only because SIMD kernels
/// need their ISA.
pub(super) type RowsDot = unsafe fn(
    w: &[u8],
    row_bytes: usize,
    acts: &[u8],
    act_row_bytes: usize,
    out: &mut [&mut [f32]],
    col: usize,
);

/// `out[i][col + r]` = row `r` of `w` (consecutive rows of `row_bytes`) ·
/// activation row `i` of `panels`, for every row of `w` and every row of
/// the panels. Unsafe only because SIMD kernels need their ISA.
pub(super) type PanelDot =
    unsafe fn(w: &[u8], row_bytes: usize, panels: &ActPanels, out: &mut [&mut [f32]], col: usize);

/// An integer dot kernel: one row per call, or many; `panel` where a kernel
/// over Q8_0 activation panels is written (used for batches of
/// [`PANEL_MIN_ROWS`] rows or more).
#[derive(Clone, Copy)]
pub(super) enum QuantDot {
    Row(VecDot),
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(dead_code)
    )]
    Rows {
        rows: RowsDot,
        panel: Option<PanelDot>,
    },
}

/// Activation rows from which the panel kernels beat the row kernels: a
/// panel holds 16 rows, so fewer waste lanes. Gemma 3 270M decode steps,
/// three alternating runs: 8 rows 398–477 tokens/s with panels against
/// 314–384 with the row kernels, 16 rows 627–734 against 341–390, 4 rows
/// 260–307 against 300–355.
pub(super) const PANEL_MIN_ROWS: usize = 8;

/// `out[r]` = row `r` of `w` (consecutive rows of `row_bytes`) · the f32 row
/// `x`, bit-identical to dequantizing the rows and using [`f32_dot`] at the
/// same ISA. Unsafe only because SIMD kernels need their ISA.
pub(super) type FusedDot = unsafe fn(w: &[u8], row_bytes: usize, x: &[f32], out: &mut [f32]);

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
            // SAFETY: `f` comes from `row_kernel` for an ISA the CPU has
            // (the caller's promise).
            Dequant::Fast(f) => unsafe { f(src, dst) },
        }
    }
}

/// How one weight's outputs are computed.
#[derive(Clone, Copy)]
pub(super) enum RowKernel {
    Quant {
        fmt: ActFormat,
        dot: QuantDot,
    },
    Exact {
        dequant: Dequant,
        /// Dequantize-and-dot in registers, for a single activation row.
        fused: Option<FusedDot>,
    },
}

impl RowKernel {
    pub fn act_format(&self) -> Option<ActFormat> {
        match self {
            RowKernel::Quant { fmt, .. } => Some(*fmt),
            RowKernel::Exact { .. } => None,
        }
    }
}

pub(super) fn row_kernel(ty: GgmlType, precision: Precision, isa: Isa, rows_isa: Isa) -> RowKernel {
    if precision == Precision::Quantized {
        if let Some((fmt, dot)) = quant_dot(ty, isa) {
            // Decode kernels at `rows_isa` where lower; panels stay at `isa`.
            let dot = match (dot, quant_dot(ty, rows_isa)) {
                (QuantDot::Rows { panel, .. }, Some((f, QuantDot::Rows { rows, .. })))
                    if rows_isa < isa && f == fmt =>
                {
                    QuantDot::Rows { rows, panel }
                }
                (_, Some((f, low))) if rows_isa < isa && f == fmt => low,
                (dot, _) => dot,
            };
            return RowKernel::Quant { fmt, dot };
        }
    }
    RowKernel::Exact {
        dequant: dequant(ty, isa),
        fused: fused_dot(ty, isa),
    }
}

#[cfg(target_arch = "x86_64")]
fn fused_dot(ty: GgmlType, isa: Isa) -> Option<FusedDot> {
    use super::avx512_fused as f;
    use GgmlType as T;
    if isa < Isa::Avx512 {
        return None;
    }
    Some(match ty {
        T::Q8_0 => f::rows::<{ f::Q8_0 }>,
        T::Q4_0 => f::rows::<{ f::Q4_0 }>,
        T::Q5_0 => f::rows::<{ f::Q5_0 }>,
        T::Q4_K => f::rows::<{ f::Q4_K }>,
        T::Q6_K => f::rows::<{ f::Q6_K }>,
        _ => return None,
    })
}

#[cfg(not(target_arch = "x86_64"))]
fn fused_dot(_ty: GgmlType, _isa: Isa) -> Option<FusedDot> {
    None
}

/// The activation format and best integer dot kernel for `ty` at `isa`, or
/// `None` if `ty` has no quantized kernel.
pub(super) fn quant_dot(ty: GgmlType, isa: Isa) -> Option<(ActFormat, QuantDot)> {
    use GgmlType as T;
    let fmt = match ty {
        T::Q4_0 | T::Q5_0 | T::Q8_0 | T::IQ4_NL | T::MXFP4 => ActFormat::Q8_0,
        T::Q4_1 | T::Q5_1 => ActFormat::Q8_1,
        T::Q2_K | T::Q3_K | T::Q4_K | T::Q5_K | T::Q6_K | T::IQ4_XS => ActFormat::Q8_K,
        _ => return None,
    };
    let dot = simd_quant_dot(ty, isa).or_else(|| scalar_quant_dot(ty).map(QuantDot::Row))?;
    Some((fmt, dot))
}

/// The portable reference kernels.
fn scalar_quant_dot(ty: GgmlType) -> Option<VecDot> {
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

/// VNNI kernels where written (they need AVX-512 VNNI on top of
/// [`Isa::Avx512`]), else the AVX2 ones (the same row kernels for the
/// formats VNNI has them for).
#[cfg(target_arch = "x86_64")]
fn simd_quant_dot(ty: GgmlType, isa: Isa) -> Option<QuantDot> {
    use super::super::features::has_avx512_vnni;
    use super::{avx2, avx512, formats as f, int8_rows as v, vnni_panel as p};
    use GgmlType as T;
    if isa >= Isa::Avx512 && has_avx512_vnni() {
        let f = match ty {
            T::Q8_0 => Some(QuantDot::Rows {
                rows: v::rows::<f::Q8_0>,
                panel: Some(p::rows::<f::Q8_0>),
            }),
            T::Q4_0 => Some(QuantDot::Rows {
                rows: v::rows::<f::Q4_0>,
                panel: Some(p::rows::<f::Q4_0>),
            }),
            T::Q5_0 => Some(QuantDot::Rows {
                rows: v::rows::<f::Q5_0>,
                panel: Some(p::rows::<f::Q5_0>),
            }),
            T::Q4_K => Some(QuantDot::Row(avx512::vec_dot_k4::<f::Q4K>)),
            T::Q5_K => Some(QuantDot::Row(avx512::vec_dot_k4::<f::Q5K>)),
            T::Q6_K => Some(QuantDot::Row(avx512::vec_dot_q6_k)),
            _ => None,
        };
        if f.is_some() {
            return f;
        }
    }
    if isa < Isa::Avx2 {
        return None;
    }
    // The row kernels of the VNNI formats, with AVX2's dot.
    let rows = |rows: RowsDot| Some(QuantDot::Rows { rows, panel: None });
    match ty {
        T::Q8_0 => return rows(v::rows_avx2::<f::Q8_0>),
        T::Q4_0 => return rows(v::rows_avx2::<f::Q4_0>),
        T::Q5_0 => return rows(v::rows_avx2::<f::Q5_0>),
        _ => {}
    }
    Some(QuantDot::Row(match ty {
        T::Q4_1 => avx2::vec_dot_legacy::<f::Q4_1>,
        T::Q5_1 => avx2::vec_dot_legacy::<f::Q5_1>,
        T::IQ4_NL => avx2::vec_dot_legacy::<f::Iq4Nl>,
        T::MXFP4 => avx2::vec_dot_legacy::<f::Mxfp4>,
        T::Q2_K => avx2::vec_dot_q2_k,
        T::Q3_K => avx2::vec_dot_q3_k,
        T::Q4_K => avx2::vec_dot_k4::<f::Q4K>,
        T::Q5_K => avx2::vec_dot_k4::<f::Q5K>,
        T::Q6_K => avx2::vec_dot_q6_k,
        T::IQ4_XS => avx2::vec_dot_iq4_xs,
        _ => return None,
    }))
}

/// NEON kernels, `SDOT` ones where the CPU has it; the Q8_0-activation
/// types as rows kernels (each weight block unpacked once for 4
/// activation rows).
#[cfg(target_arch = "aarch64")]
fn simd_quant_dot(ty: GgmlType, isa: Isa) -> Option<QuantDot> {
    use super::super::features::has_neon_dotprod;
    use super::{formats as f, neon as n};
    use GgmlType as T;
    if isa != Isa::Neon {
        return None;
    }
    let sdot = has_neon_dotprod();
    let row = |plain: VecDot, dot: VecDot| QuantDot::Row(if sdot { dot } else { plain });
    let rows = |plain: RowsDot, dot: RowsDot| QuantDot::Rows {
        rows: if sdot { dot } else { plain },
        panel: None,
    };
    Some(match ty {
        T::Q8_0 => rows(n::rows::<f::Q8_0>, n::rows_sdot::<f::Q8_0>),
        T::Q4_0 => rows(n::rows::<f::Q4_0>, n::rows_sdot::<f::Q4_0>),
        T::Q5_0 => rows(n::rows::<f::Q5_0>, n::rows_sdot::<f::Q5_0>),
        T::IQ4_NL => rows(n::rows::<f::Iq4Nl>, n::rows_sdot::<f::Iq4Nl>),
        T::MXFP4 => rows(n::rows::<f::Mxfp4>, n::rows_sdot::<f::Mxfp4>),
        T::Q4_1 => row(n::vec_dot_q4_1, n::vec_dot_q4_1_sdot),
        T::Q5_1 => row(n::vec_dot_q5_1, n::vec_dot_q5_1_sdot),
        T::Q2_K => row(n::vec_dot_q2_k, n::vec_dot_q2_k_sdot),
        T::Q3_K => row(n::vec_dot_q3_k, n::vec_dot_q3_k_sdot),
        T::Q4_K => row(n::vec_dot_q4_k, n::vec_dot_q4_k_sdot),
        T::Q5_K => row(n::vec_dot_q5_k, n::vec_dot_q5_k_sdot),
        T::Q6_K => row(n::vec_dot_q6_k, n::vec_dot_q6_k_sdot),
        T::IQ4_XS => row(n::vec_dot_iq4_xs, n::vec_dot_iq4_xs_sdot),
        _ => return None,
    })
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn simd_quant_dot(_ty: GgmlType, _isa: Isa) -> Option<QuantDot> {
    None
}

/// Prefill f32 dots: `out[i][col + r]` = row `i` of `x` · row `r` of `w`
/// (both rows `k` apart, `out.len()` activation rows), in an order that
/// depends only on `k` and the ISA. Unsafe only because SIMD kernels need
/// their ISA.
pub(super) type DotF32Tile =
    unsafe fn(x: &[f32], w: &[f32], k: usize, out: &mut [&mut [f32]], col: usize);

/// A register-tiled kernel for `m ≥ 2` where written; else callers use
/// [`f32_dot`] per output.
pub(super) fn f32_dot_tile(isa: Isa) -> Option<DotF32Tile> {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => Some(super::avx512::dot_f32_tile),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => Some(super::neon::dot_f32_tile),
        _ => None,
    }
}

pub(super) fn f32_dot(isa: Isa) -> DotF32 {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => super::avx512::dot_f32,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => super::avx2::dot_f32,
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => super::neon::dot_f32,
        _ => exact::dot_f32,
    }
}

/// SIMD dequantizers (AVX2, also used at [`Isa::Avx512`]; NEON) where
/// written, else the reference.
pub(super) fn dequant(ty: GgmlType, isa: Isa) -> Dequant {
    simd_dequant(ty, isa).map_or(Dequant::Reference(ty), Dequant::Fast)
}

/// `$m`'s dequantizer for `$ty`: every SIMD set writes the same list.
macro_rules! dequantizers {
    ($m:ident, $ty:expr) => {{
        use GgmlType as T;
        Some(match $ty {
            T::F16 => $m::dequant_f16,
            T::BF16 => $m::dequant_bf16,
            T::Q8_0 => $m::dequant_q8_0,
            T::Q4_0 => $m::dequant_q4_0,
            T::Q4_1 => $m::dequant_q4_1,
            T::Q5_0 => $m::dequant_q5_0,
            T::Q5_1 => $m::dequant_q5_1,
            T::IQ4_NL => $m::dequant_iq4_nl,
            T::MXFP4 => $m::dequant_mxfp4,
            T::IQ4_XS => $m::dequant_iq4_xs,
            T::Q2_K => $m::dequant_q2_k,
            T::Q3_K => $m::dequant_q3_k,
            T::Q4_K => $m::dequant_q4_k,
            T::Q5_K => $m::dequant_q5_k,
            T::Q6_K => $m::dequant_q6_k,
            _ => return None,
        })
    }};
}

#[cfg(target_arch = "x86_64")]
fn simd_dequant(ty: GgmlType, isa: Isa) -> Option<DequantFn> {
    use super::dequant::avx2 as d;
    if isa < Isa::Avx2 {
        return None;
    }
    dequantizers!(d, ty)
}

#[cfg(target_arch = "aarch64")]
fn simd_dequant(ty: GgmlType, isa: Isa) -> Option<DequantFn> {
    use super::dequant::neon as d;
    if isa != Isa::Neon {
        return None;
    }
    dequantizers!(d, ty)
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn simd_dequant(_ty: GgmlType, _isa: Isa) -> Option<DequantFn> {
    None
}

/// Decodes whole blocks of a weight row into u8 codes and per-sub-block
/// scales and offsets (`value = scale·code − offset`), as the GEMM's
/// panels take them.
pub(super) type AffineFn =
    unsafe fn(src: &[u8], codes: &mut [u8], scale: &mut [f32], offset: &mut [f32]);

/// The affine-code decoder of `ty` at `isa` (AVX2, also used at
/// [`Isa::Avx512`]; NEON), for the types with an affine form
/// (`rlx_gguf::quant::affine_sub_block`).
pub(super) fn affine(ty: GgmlType, isa: Isa) -> Option<AffineFn> {
    #[cfg(target_arch = "x86_64")]
    use super::dequant::avx2 as d;
    #[cfg(target_arch = "aarch64")]
    use super::dequant::neon as d;
    use GgmlType as T;
    let supported = if cfg!(target_arch = "x86_64") {
        isa >= Isa::Avx2
    } else {
        cfg!(target_arch = "aarch64") && isa == Isa::Neon
    };
    if !supported {
        return None;
    }
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    {
        Some(match ty {
            T::Q8_0 => d::affine_q8_0,
            T::Q4_0 => d::affine_q4_0,
            T::Q4_1 => d::affine_q4_1,
            T::Q5_0 => d::affine_q5_0,
            T::Q5_1 => d::affine_q5_1,
            T::IQ4_NL => d::affine_iq4_nl,
            T::Q2_K => d::affine_q2_k,
            T::Q3_K => d::affine_q3_k,
            T::Q4_K => d::affine_q4_k,
            T::Q5_K => d::affine_q5_k,
            T::Q6_K => d::affine_q6_k,
            _ => return None,
        })
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        let _ = ty;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::features::Isa;
    use super::{dequant, Dequant};
    use rlx_gguf::GgmlType;

    /// Random blocks with every scale field a small finite f16.
    fn blocks(ty: GgmlType, n: usize, seed: u64) -> Vec<u8> {
        let mut s = seed;
        let mut bytes: Vec<u8> = (0..n * ty.block_bytes())
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (s >> 56) as u8
            })
            .collect();
        let f16_fields: &[usize] = match ty {
            GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
            GgmlType::Q2_K => &[80, 82],
            GgmlType::Q3_K => &[108],
            GgmlType::Q6_K => &[208],
            GgmlType::F16 | GgmlType::BF16 => &[],
            _ => &[0],
        };
        for (i, b) in bytes.chunks_exact_mut(ty.block_bytes()).enumerate() {
            for &off in f16_fields {
                let v = half::f16::from_f32(0.01 + 0.001 * (i % 7) as f32);
                b[off..off + 2].copy_from_slice(&v.to_le_bytes());
            }
        }
        bytes
    }

    /// Every type the SIMD dequantizers decode.
    const TYPES: [GgmlType; 15] = [
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::IQ4_NL,
        GgmlType::MXFP4,
        GgmlType::IQ4_XS,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ];

    /// Every SIMD dequantizer this CPU can run (AVX2; NEON), for every type
    /// it has one for.
    #[test]
    fn fast_dequantizers_match_the_reference_bit_for_bit() {
        let mut tested = 0;
        for isa in Isa::supported() {
            for ty in TYPES {
                // 13 blocks: odd, and for F16/BF16 not a multiple of 8 elements.
                let n = 13;
                let src = blocks(ty, n, ty.id().into());
                let mut want = vec![0f32; n * ty.block_elems()];
                rlx_gguf::dequantize(ty, &src, &mut want).unwrap();
                let Dequant::Fast(f) = dequant(ty, isa) else {
                    assert!(isa == Isa::Scalar, "{ty} has no {isa} dequantizer");
                    continue;
                };
                let mut got = vec![f32::NAN; want.len()];
                // SAFETY: `Isa::supported` lists only what the CPU has.
                unsafe { f(&src, &mut got) };
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        g.to_bits(),
                        w.to_bits(),
                        "{ty} {isa} element {i}: {g} vs {w}"
                    );
                }
                tested += 1;
            }
        }
        // Where the CPU has SIMD, every listed type was run through it.
        assert!(Isa::supported().len() == 1 || tested >= 15);
    }

    /// The GEMM's affine decoders (every type with an affine form, every
    /// SIMD set this CPU runs): codes within the type's bound for any block
    /// bytes, and `scale·code − offset` the reference's value up to the
    /// rounding of that product.
    #[test]
    fn affine_codes_give_the_reference_values() {
        use rlx_gguf::quant::{affine_max_code, affine_sub_block};
        let mut tested = 0;
        for isa in Isa::supported() {
            for ty in TYPES.into_iter().filter(|&t| affine_sub_block(t).is_some()) {
                let Some(decode) = super::affine(ty, isa) else {
                    assert!(isa == Isa::Scalar, "{ty} has no {isa} affine decoder");
                    continue;
                };
                let n = 5;
                let elems = n * ty.block_elems();
                let sub = affine_sub_block(ty).unwrap();
                let max = affine_max_code(ty).unwrap();
                let (mut codes, mut scale, mut offset) = (
                    vec![0u8; elems],
                    vec![0f32; elems / sub],
                    vec![0f32; elems / sub],
                );
                // Any bytes at all: codes stay within the bound.
                let raw: Vec<u8> = (0..n * ty.block_bytes())
                    .map(|i| (i * 151 + 7) as u8)
                    .collect();
                // SAFETY: `Isa::supported` lists only what the CPU has; the
                // buffers hold the blocks' elements and sub-blocks.
                unsafe { decode(&raw, &mut codes, &mut scale, &mut offset) };
                assert!(
                    codes.iter().all(|&c| c <= max),
                    "{ty} {isa}: a code above {max}"
                );
                let src = blocks(ty, n, ty.id().into());
                // SAFETY: as above.
                unsafe { decode(&src, &mut codes, &mut scale, &mut offset) };
                let want = rlx_gguf::dequantize_to_vec(ty, &src).unwrap();
                for (e, w) in want.iter().enumerate() {
                    let s = e / sub;
                    let got = scale[s] * f32::from(codes[e]) - offset[s];
                    let tol = 1e-6 * (scale[s].abs() * 255.0 + offset[s].abs()).max(1e-30);
                    assert!(
                        (got - w).abs() <= tol,
                        "{ty} {isa} element {e}: {got} vs {w}"
                    );
                }
                tested += 1;
            }
        }
        assert!(Isa::supported().len() == 1 || tested >= 11);
    }
}
