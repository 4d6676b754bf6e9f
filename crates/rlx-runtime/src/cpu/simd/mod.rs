//! Vector types shared by the CPU kernels: an instruction set is an
//! implementation of these traits, and a kernel written once over them is
//! compiled per set by a macro that wraps it in `#[target_feature]` entry
//! points (`tiles!` for the attention tiles, `entries!` for the
//! dequantizers). [`Lanes`] is an f32 vector; [`Bytes32`] holds the 32
//! one-byte codes of a weight block's 32-element unit: what the block
//! formats unpack to before their scales apply.
//!
//! # Safety
//! Every method is `unsafe` for the features its implementation needs: it
//! may run only inlined into an entry point compiled for them, which is
//! handed out only where the CPU has them. Pointer arguments must be valid
//! for the lanes read or written; byte methods take array references, so
//! they read and write only what they are given.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
#[cfg(target_arch = "aarch64")]
pub(crate) mod neon;
pub(crate) mod table;

/// 32 bytes of codes (element `i` of a unit in byte `i`) and the integer
/// operations the block formats unpack with, then the conversions that
/// apply a unit's scales.
pub(crate) trait Bytes32: Copy {
    /// A 16-entry byte table for [`Bytes32::lookup`].
    type Table: Copy;
    /// The f32 vector of the same instruction set.
    type F32: Lanes;

    unsafe fn load(b: &[u8; 32]) -> Self;
    unsafe fn store(v: Self, out: &mut [u8; 32]);
    /// The low nibbles of `b` in bytes 0..16, the high ones in 16..32: the
    /// element order of the legacy 4-bit blocks.
    unsafe fn nibbles(b: &[u8; 16]) -> Self;
    unsafe fn splat(x: u8) -> Self;
    /// 0xFF in byte `j` where bit `j` of `x` is set, 0 elsewhere.
    unsafe fn from_bits(x: u32) -> Self;
    unsafe fn and(a: Self, b: Self) -> Self;
    unsafe fn or(a: Self, b: Self) -> Self;
    /// Bytewise wrapping `a − b`.
    unsafe fn sub(a: Self, b: Self) -> Self;
    /// `(v >> n) & mask` in every byte (`n < 8`).
    unsafe fn shr_mask(v: Self, n: u32, mask: u8) -> Self;
    /// `v << n` in every byte, for bytes below `1 << (8 − n)` (`n < 8`):
    /// bits shifted out of a byte may enter the next one.
    unsafe fn shl(v: Self, n: u32) -> Self;
    /// `value` in every byte whose bit `bit` is set in `bits`, 0 elsewhere.
    unsafe fn bit_value(bits: Self, bit: u32, value: Self) -> Self;
    unsafe fn table(values: &[i8; 16]) -> Self::Table;
    /// Every byte (0..16) replaced by its entry of `t`.
    unsafe fn lookup(t: Self::Table, v: Self) -> Self;
    /// The f16 at `b[off..off + 2]`, as f32 (exact).
    unsafe fn f16(b: &[u8], off: usize) -> f32;
    /// `out[i] = v[i] · d` with `v[i]` signed and `d` = `d0` for the first
    /// 16 bytes, `d1` for the rest: one multiply a value.
    unsafe fn store_mul_i8(v: Self, d0: f32, d1: f32, out: &mut [f32; 32]);
    /// `out[i] = v[i] · d + off` with `v[i]` unsigned and `(d, off)` =
    /// `first` for the first 16 bytes, `second` for the rest: a multiply,
    /// then an add (never fused).
    unsafe fn store_mul_add_u8(v: Self, first: (f32, f32), second: (f32, f32), out: &mut [f32; 32]);
}

/// One instruction set's f32 vector and the operations the f32 kernels
/// (the attention tiles) use.
/// Every method is `unsafe` for the features its implementation needs.
pub(crate) trait Lanes: Copy {
    /// f32 lanes per vector.
    const N: usize;
    /// The first `n` lanes of a vector, for partial loads and stores.
    type Prefix: Copy;
    /// Any set of lanes, for the key mask.
    type Select: Copy;

    unsafe fn zero() -> Self;
    unsafe fn splat(x: f32) -> Self;
    unsafe fn load(p: *const f32) -> Self;
    unsafe fn store(p: *mut f32, v: Self);
    /// N f16 values, widened.
    unsafe fn load_f16(p: *const u16) -> Self;
    /// N bf16 values, widened, NaNs made quiet as `half` does.
    unsafe fn load_bf16(p: *const u16) -> Self;
    /// Lanes `0 .. n` (`n ≤ N`).
    unsafe fn prefix(n: usize) -> Self::Prefix;
    /// The lanes of `m` from `p`, zeros elsewhere; other lanes are not read.
    unsafe fn load_part(m: Self::Prefix, p: *const f32) -> Self;
    /// As [`Lanes::load_part`] for f16 values.
    unsafe fn load_part_f16(m: Self::Prefix, p: *const u16) -> Self;
    /// The lanes of `m` to `p`; other lanes are not written.
    unsafe fn store_part(m: Self::Prefix, p: *mut f32, v: Self);
    /// Lane `i` where bit `i` of `bits` is set.
    unsafe fn select(bits: u32) -> Self::Select;
    /// `v` in the lanes of `m`, `other` elsewhere.
    unsafe fn blend(m: Self::Select, v: Self, other: Self) -> Self;
    /// `a·b + c`, fused.
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self;
    /// `c − a·b`, fused.
    unsafe fn fnma(a: Self, b: Self, c: Self) -> Self;
    unsafe fn add(a: Self, b: Self) -> Self;
    unsafe fn sub(a: Self, b: Self) -> Self;
    unsafe fn mul(a: Self, b: Self) -> Self;
    unsafe fn max(a: Self, b: Self) -> Self;
    unsafe fn min(a: Self, b: Self) -> Self;
    /// `2^k` for integer-valued `k` in the normal exponent range.
    unsafe fn pow2(k: Self) -> Self;
    /// Sum of the lanes.
    unsafe fn hsum(v: Self) -> f32;
    /// [`Lanes::hsum`] of four vectors (the same adds in the same order).
    #[inline(always)]
    unsafe fn hsum4(v: [Self; 4]) -> [f32; 4] {
        let mut out = [0f32; 4];
        for (o, v) in out.iter_mut().zip(v) {
            // SAFETY: the trait's contract.
            *o = unsafe { Self::hsum(v) };
        }
        out
    }
    /// Maximum of the lanes.
    unsafe fn hmax(v: Self) -> f32;
    /// Lane `i` of the result is the sum of the lanes of `v[i]`, for `N`
    /// vectors.
    unsafe fn reduce(v: &[Self]) -> Self;
}

/// `dst.len()` f16 (or, `BF16`, bf16) values from the little-endian bytes
/// of `src`, widened as `half` widens them: `V::N` at a time, the rest one
/// by one.
///
/// # Safety
/// Runs only inlined into an entry point compiled for `V`'s features (the
/// module's `# Safety`).
#[inline(always)]
pub(crate) unsafe fn widen<V: Lanes, const BF16: bool>(src: &[u8], dst: &mut [f32]) {
    let n = (src.len() / 2).min(dst.len());
    let mut i = 0;
    while i + V::N <= n {
        // SAFETY: elements i .. i + N lie in both slices (n bounds them);
        // the loads take unaligned addresses.
        unsafe {
            let p = src.as_ptr().add(2 * i).cast::<u16>();
            let v = if BF16 {
                V::load_bf16(p)
            } else {
                V::load_f16(p)
            };
            V::store(dst.as_mut_ptr().add(i), v);
        }
        i += V::N;
    }
    for (d, b) in dst[i..n].iter_mut().zip(src[2 * i..2 * n].chunks_exact(2)) {
        let bits = u16::from_le_bytes([b[0], b[1]]);
        *d = if BF16 {
            half::bf16::from_bits(bits).to_f32()
        } else {
            half::f16::from_bits(bits).to_f32()
        };
    }
}
