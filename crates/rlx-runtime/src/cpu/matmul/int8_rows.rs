//! x86's two integer dots of the 32-element block formats (Q4_0, Q5_0,
//! Q8_0) against Q8_0 activations, as [`IntDot`]s for the rows kernels
//! (`rows.rs`): AVX-512 VNNI's `vpdpbusd` on 256-bit vectors ([`rows`]) and
//! AVX2's `vpmaddubsw` + `vpmaddwd` ([`rows_avx2`]), 4 weight rows a tile.
//!
//! The weight codes are read unsigned (`q + C`: `formats.rs`'s
//! `Legacy::unsigned`, with `C` = 8, 16 or 128), so one
//! unsigned × signed dot forms `Σ (q + C)·x`; its accumulator starts at
//! `−C·Σx` (computed once per activation block), which leaves the exact
//! `Σ q·x`. AVX2's pairwise `vpmaddubsw` would saturate on Q8_0's
//! `(q + 128)·x`, so there Q8_0 stays signed: `|q| · (x with q's sign)`.
//! Per block, per output: `acc += (f32(Σ) · d_x) · d_w` in 8 lanes, reduced
//! once per output.
//!
//! # Safety
//! [`rows`] needs AVX-512 F + BW + VL + VNNI (on top of AVX2, FMA, F16C):
//! `kernels` hands it out only when `has_avx512_vnni()` and the requested ISA
//! is `Isa::Avx512`; [`rows_avx2`] needs AVX2 + FMA + F16C and is handed out
//! from `Isa::Avx2` on; `matmul` checks the ISA against the CPU. The other
//! functions are `#[inline(always)]` and run only inlined into those two
//! entry points, with their features. The entry points check the slice
//! lengths before any raw-pointer read.

use std::arch::x86_64::*;

use super::avx2::hsum_ps;
use super::formats::Legacy;
use super::rows::{rows_entry, IntDot};
use crate::cpu::simd::avx512::Bytes32Vl;
use crate::cpu::simd::Bytes32;

/// Bytes ahead of each row's read position to prefetch: a large LM head
/// streams from DRAM, and one core's demand misses alone reach only part of
/// the bandwidth. Prefetches past the end of `w` are harmless hints.
pub(super) const PREFETCH: usize = 8192;

/// Whether AVX2's dot takes `F`'s codes signed: `vpmaddubsw`'s pair sums
/// saturate on `(q + 128)·x`.
#[inline(always)]
const fn signed<F: Legacy, const VNNI: bool>() -> bool {
    !VNNI && F::OFFSET == 128
}

/// The block's 32 codes plus `F::OFFSET`, as u8, or its signed codes where
/// [`signed`] says so.
///
/// # Safety
/// `wb` points at a whole block of format `F`.
#[inline(always)]
pub(super) unsafe fn codes<F: Legacy, const VNNI: bool>(wb: *const u8) -> __m256i {
    // SAFETY: this function's contract (the module's `# Safety`): it runs
    // inlined into an entry point with the features of `VNNI`'s dot, whose
    // lengths checks cover the block.
    unsafe {
        let b = std::slice::from_raw_parts(wb, F::BYTES);
        if VNNI {
            let table = <Bytes32Vl as Bytes32>::table(F::TABLE);
            F::unsigned::<Bytes32Vl>(b, table).0
        } else {
            let table = <__m256i as Bytes32>::table(F::TABLE);
            if signed::<F, VNNI>() {
                F::codes(b, table)
            } else {
                F::unsigned(b, table)
            }
        }
    }
}

/// `Σ codes·x` over each group of four bytes into the i32 lanes of `acc`:
/// one `vpdpbusd`, or AVX2's pairwise products (`codes` unsigned below 128
/// there, or signed: see the module's notes).
#[inline(always)]
unsafe fn dot<const VNNI: bool>(acc: __m256i, codes: __m256i, x: __m256i, signed: bool) -> __m256i {
    // SAFETY: as for [`codes`].
    unsafe {
        if VNNI {
            _mm256_dpbusd_epi32(acc, codes, x)
        } else {
            let (u, s) = if signed {
                (_mm256_sign_epi8(codes, codes), _mm256_sign_epi8(x, codes))
            } else {
                (codes, x)
            };
            let pairs = _mm256_maddubs_epi16(u, s);
            _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
        }
    }
}

/// x86's integer dot: AVX-512 VNNI's where `VNNI`, else AVX2's.
pub(super) struct X86Dot<const VNNI: bool>;

impl<const VNNI: bool> IntDot for X86Dot<VNNI> {
    type Codes = __m256i;
    /// The activations and the accumulator's start: `−OFFSET·Σx` where the
    /// codes are unsigned (see the module's notes), else 0.
    type Act = (__m256i, __m256i);
    type Scale = __m256;
    type Acc = __m256;

    #[inline(always)]
    unsafe fn codes<F: Legacy>(b: &[u8]) -> __m256i {
        // SAFETY: the trait's contract; `b` holds the block.
        unsafe { codes::<F, VNNI>(b.as_ptr()) }
    }

    #[inline(always)]
    unsafe fn act<F: Legacy>(b: &[u8]) -> (__m256i, __m256i) {
        // SAFETY: the trait's contract; a Q8_0 block's 32 values from byte 2.
        unsafe {
            let zero = _mm256_setzero_si256();
            let x = _mm256_loadu_si256(b[2..34].as_ptr().cast());
            // Signed codes: nothing to take off.
            if signed::<F, VNNI>() {
                (x, zero)
            } else {
                let c = _mm256_set1_epi8(F::OFFSET as i8);
                (x, _mm256_sub_epi32(zero, dot::<VNNI>(zero, c, x, false)))
            }
        }
    }

    #[inline(always)]
    unsafe fn scale(d: f32) -> __m256 {
        // SAFETY: the trait's contract.
        unsafe { _mm256_set1_ps(d) }
    }

    #[inline(always)]
    unsafe fn zero() -> __m256 {
        // SAFETY: the trait's contract.
        unsafe { _mm256_setzero_ps() }
    }

    #[inline(always)]
    unsafe fn add<F: Legacy>(
        acc: __m256,
        w: __m256i,
        (x, start): (__m256i, __m256i),
        dw: __m256,
        dx: __m256,
    ) -> __m256 {
        // SAFETY: the trait's contract.
        unsafe {
            let sum = dot::<VNNI>(start, w, x, signed::<F, VNNI>());
            _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(sum), dx), dw, acc)
        }
    }

    #[inline(always)]
    unsafe fn finish(acc: __m256) -> f32 {
        // SAFETY: the trait's contract.
        unsafe { hsum_ps(acc) }
    }

    #[inline(always)]
    unsafe fn prefetch(p: *const u8) {
        // SAFETY: a prefetch is a hint; it reads nothing.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH).cast()) }
    }
}

rows_entry!(
    /// The rows kernel with AVX-512 VNNI's dot.
    rows,
    X86Dot<true>,
    4,
    "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c"
);
rows_entry!(
    /// The rows kernel with AVX2's dot.
    rows_avx2,
    X86Dot<false>,
    4,
    "avx2,fma,f16c"
);
