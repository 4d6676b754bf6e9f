//! AVX-512 Exact kernels for one activation row: each weight block is
//! dequantized in registers and dotted straight away instead of going through
//! a tile buffer.
//!
//! Bit-identical to dequantizing the row (`rlx_gguf::dequantize`'s operations:
//! `q · d`, `d₁ · q − m₁`, `(d · sc) · q`) and then `avx512::dot_f32`: element
//! `i` is FMA'd into accumulator `(i / 16) % 4`, lane `i % 16`, in order, and
//! the accumulators are reduced the same way. A row is a whole number of
//! blocks of 32 or 256, so no partial vector occurs.
//!
//! # Safety
//! Every function needs AVX-512 F + BW + VL (with AVX2, FMA, F16C):
//! `kernels` hands them out only for `Isa::Avx512`, which `matmul` checks
//! against the CPU. The entry points check slice lengths before any raw
//! pointer read.

use std::arch::x86_64::*;

use super::avx512::hsum_ps;
use super::formats::{self as f, KQuant, Legacy};
use super::scalar::scale_min_k4;
use crate::cpu::simd::avx512::Bytes32Vl;
use crate::cpu::simd::table::f16_table;
use crate::cpu::simd::Bytes32;

/// Weight formats [`rows`] handles.
pub(super) const Q8_0: u8 = 0;
pub(super) const Q4_0: u8 = 1;
pub(super) const Q5_0: u8 = 2;
pub(super) const Q4_K: u8 = 3;
pub(super) const Q6_K: u8 = 4;

/// `(block bytes, block elements)`.
const fn layout(ty: u8) -> (usize, usize) {
    match ty {
        Q8_0 => (34, 32),
        Q4_0 => (18, 32),
        Q5_0 => (22, 32),
        Q4_K => (144, 256),
        _ => (210, 256),
    }
}

/// `acc = fma(x[0..16], w, acc)`.
///
/// # Safety
/// `x` points at 16 readable f32s.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn fma16(acc: &mut __m512, x: *const f32, w: __m512) {
    // SAFETY: this function's contract (the module's `# Safety`): the CPU has AVX-512 F + BW + VL,
    // and the entry point checked the slice lengths the pointers walk.
    unsafe {
        *acc = _mm512_fmadd_ps(_mm512_loadu_ps(x), w, *acc);
    }
}

/// 16 signed codes as f32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn i8_ps(q: __m128i) -> __m512 {
    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q))
}

/// 16 unsigned codes as f32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
fn u8_ps(q: __m128i) -> __m512 {
    _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q))
}

/// The 32 signed codes of a legacy block, through `formats.rs`.
///
/// # Safety
/// `wb` points at a whole block of format `TYPE`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn legacy_codes<const TYPE: u8>(wb: *const u8) -> __m256i {
    // SAFETY: this function's contract (the module's `# Safety`): the CPU has AVX-512 F + BW + VL
    // (so AVX2 for `Bytes32`), and the entry point checked the slice lengths the pointers walk.
    unsafe {
        let block = std::slice::from_raw_parts(wb, layout(TYPE).0);
        let none = <Bytes32Vl as Bytes32>::table(&[0; 16]);
        let codes: Bytes32Vl = match TYPE {
            Q8_0 => f::Q8_0::codes(block, none),
            Q4_0 => f::Q4_0::codes(block, none),
            _ => f::Q5_0::codes(block, none),
        };
        codes.0
    }
}

/// One legacy block (32 elements at `x`) into `acc[0]`, `acc[1]`.
///
/// # Safety
/// `wb` points at a whole block, `x` at 32 f32s.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn legacy_block<const TYPE: u8>(
    wb: *const u8,
    x: *const f32,
    table: &[f32; 65536],
    acc: &mut [__m512],
) {
    // SAFETY: this function's contract (the module's `# Safety`): the CPU has AVX-512 F + BW + VL,
    // and the entry point checked the slice lengths the pointers walk.
    unsafe {
        let d = _mm512_set1_ps(table[usize::from(wb.cast::<u16>().read_unaligned())]);
        let q = legacy_codes::<TYPE>(wb);
        let lo = _mm512_mul_ps(i8_ps(_mm256_castsi256_si128(q)), d);
        let hi = _mm512_mul_ps(i8_ps(_mm256_extracti128_si256(q, 1)), d);
        fma16(&mut acc[0], x, lo);
        fma16(&mut acc[1], x.add(16), hi);
    }
}

/// One Q4_K super-block (256 elements at `x`).
///
/// # Safety
/// `wb` points at a whole block, `x` at 256 f32s.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn q4_k_block(wb: *const u8, x: *const f32, table: &[f32; 65536], acc: &mut [__m512; 4]) {
    // SAFETY: this function's contract (the module's `# Safety`): the CPU has AVX-512 F + BW + VL,
    // and the entry point checked the slice lengths the pointers walk.
    unsafe {
        let d = table[usize::from(wb.cast::<u16>().read_unaligned())];
        let dmin = table[usize::from(wb.add(2).cast::<u16>().read_unaligned())];
        let scales: &[u8; 12] = &*wb.add(4).cast();
        let mut d1 = [0f32; 8];
        let mut m1 = [0f32; 8];
        for (j, (d1, m1)) in d1.iter_mut().zip(&mut m1).enumerate() {
            let (sc, mn) = scale_min_k4(j, scales);
            *d1 = d * f32::from(sc);
            *m1 = dmin * f32::from(mn);
        }
        let value = |q: __m128i, s: usize| {
            _mm512_sub_ps(
                _mm512_mul_ps(u8_ps(q), _mm512_set1_ps(d1[s])),
                _mm512_set1_ps(m1[s]),
            )
        };
        let block = std::slice::from_raw_parts(wb, layout(Q4_K).0);
        let high = f::Q4K::high::<Bytes32Vl>(block);
        for q in 0..2 {
            // Units 4q .. 4q + 4 (through `formats.rs`): an even unit's
            // halves go to accumulators 0 and 1, an odd one's to 2 and 3.
            let [u0, u1, u2, u3] = f::Q4K::quad::<Bytes32Vl>(block, high, q);
            let units = [u0.0, u1.0, u2.0, u3.0];
            for (i, unit) in units.into_iter().enumerate() {
                let (u, a) = (4 * q + i, 2 * (i % 2));
                let x = x.add(32 * u);
                fma16(&mut acc[a], x, value(_mm256_castsi256_si128(unit), u));
                fma16(
                    &mut acc[a + 1],
                    x.add(16),
                    value(_mm256_extracti128_si256(unit, 1), u),
                );
            }
        }
    }
}

/// One Q6_K super-block (256 elements at `x`).
///
/// # Safety
/// `wb` points at a whole block, `x` at 256 f32s.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn q6_k_block(wb: *const u8, x: *const f32, table: &[f32; 65536], acc: &mut [__m512; 4]) {
    // SAFETY: this function's contract (the module's `# Safety`): the CPU has AVX-512 F + BW + VL,
    // and the entry point checked the slice lengths the pointers walk.
    unsafe {
        let d = table[usize::from(wb.add(208).cast::<u16>().read_unaligned())];
        let sc = wb.add(192).cast::<i8>();
        let block = std::slice::from_raw_parts(wb, layout(Q6_K).0);
        let none = f::Q6K::high::<Bytes32Vl>(block);
        for j in 0..2 {
            // Units 4j .. 4j + 4 through `formats.rs`, stored + 32.
            let [u0, u1, u2, u3] = f::Q6K::quad::<Bytes32Vl>(block, none, j);
            let units = [u0.0, u1.0, u2.0, u3.0];
            for (p, unit) in units.into_iter().enumerate() {
                let q = _mm256_sub_epi8(unit, _mm256_set1_epi8(32));
                // Elements 128j + 32p ..: accumulators 2(p % 2), 2(p % 2) + 1.
                let s = 8 * j + 2 * p;
                let x = x.add(128 * j + 32 * p);
                let d0 = _mm512_set1_ps(d * f32::from(*sc.add(s)));
                let d1 = _mm512_set1_ps(d * f32::from(*sc.add(s + 1)));
                let a = 2 * (p % 2);
                fma16(
                    &mut acc[a],
                    x,
                    _mm512_mul_ps(i8_ps(_mm256_castsi256_si128(q)), d0),
                );
                fma16(
                    &mut acc[a + 1],
                    x.add(16),
                    _mm512_mul_ps(i8_ps(_mm256_extracti128_si256(q, 1)), d1),
                );
            }
        }
    }
}

/// One row of `nb` blocks at `w` against `x`.
///
/// # Safety
/// `w` points at `nb` whole blocks, `x` at `nb · block elements` f32s.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn row<const TYPE: u8>(w: *const u8, nb: usize, x: *const f32, table: &[f32; 65536]) -> f32 {
    // SAFETY: this function's contract (the module's `# Safety`): the CPU has AVX-512 F + BW + VL,
    // and the entry point checked the slice lengths the pointers walk.
    unsafe {
        let (wbytes, elems) = layout(TYPE);
        let mut acc = [_mm512_setzero_ps(); 4];
        match TYPE {
            Q4_K | Q6_K => {
                for b in 0..nb {
                    let (wb, xb) = (w.add(b * wbytes), x.add(b * elems));
                    if TYPE == Q4_K {
                        q4_k_block(wb, xb, table, &mut acc);
                    } else {
                        q6_k_block(wb, xb, table, &mut acc);
                    }
                }
            }
            _ => {
                // Even blocks fill accumulators 0, 1; odd ones 2, 3.
                let (even, odd) = acc.split_at_mut(2);
                for b in 0..nb / 2 {
                    let (wb, xb) = (w.add(2 * b * wbytes), x.add(64 * b));
                    legacy_block::<TYPE>(wb, xb, table, even);
                    legacy_block::<TYPE>(wb.add(wbytes), xb.add(32), table, odd);
                }
                if nb % 2 == 1 {
                    let b = nb - 1;
                    legacy_block::<TYPE>(w.add(b * wbytes), x.add(32 * b), table, even);
                }
            }
        }
        let v = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
        hsum_ps(v)
    }
}

/// `out[r]` = row `r` of `w` (rows of `row_bytes`) · `x`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(super) unsafe fn rows<const TYPE: u8>(w: &[u8], row_bytes: usize, x: &[f32], out: &mut [f32]) {
    // SAFETY: this function's contract (the module's `# Safety`): the CPU has AVX-512 F + BW + VL,
    // and the entry point checked the slice lengths the pointers walk.
    unsafe {
        let (wbytes, elems) = layout(TYPE);
        let nb = row_bytes / wbytes;
        assert!(w.len() >= out.len() * row_bytes && x.len() >= nb * elems);
        let table = f16_table();
        for (r, o) in out.iter_mut().enumerate() {
            // SAFETY: row `r` lies inside `w` and `x` holds the row's elements
            // (asserted above).
            *o = row::<TYPE>(w.as_ptr().add(r * row_bytes), nb, x.as_ptr(), table);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::features::Isa;
    use super::super::kernels::{row_kernel, RowKernel};
    use super::super::Precision;
    use rlx_gguf::GgmlType;

    #[test]
    fn fused_rows_match_dequantize_then_dot_bit_for_bit() {
        if Isa::detect() < Isa::Avx512 {
            return;
        }
        let mut s = 0x1234_5678_9abc_def0u64;
        let mut next = move || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        };
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q5_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
        ] {
            for blocks in [1, 2, 3, 5] {
                let (rows, k) = (6, blocks * ty.block_elems());
                let w: Vec<f32> = (0..rows * k).map(|_| next()).collect();
                let x: Vec<f32> = (0..k).map(|_| next()).collect();
                let data = rlx_gguf::quantize_to_vec(ty, &w).unwrap();
                let deq = rlx_gguf::dequantize_to_vec(ty, &data).unwrap();
                let RowKernel::Exact {
                    fused: Some(fused), ..
                } = row_kernel(ty, Precision::Exact, Isa::Avx512, Isa::Avx512)
                else {
                    panic!("{ty} has no fused kernel");
                };
                let row_bytes = data.len() / rows;
                let mut got = vec![f32::NAN; rows];
                // SAFETY: checked above that the CPU has AVX-512.
                unsafe { fused(&data, row_bytes, &x, &mut got) };
                for (r, g) in got.iter().enumerate() {
                    // SAFETY: as above.
                    let want =
                        unsafe { super::super::avx512::dot_f32(&x, &deq[r * k..(r + 1) * k]) };
                    assert_eq!(
                        g.to_bits(),
                        want.to_bits(),
                        "{ty} k={k} row {r}: {g} vs {want}"
                    );
                }
            }
        }
    }
}
