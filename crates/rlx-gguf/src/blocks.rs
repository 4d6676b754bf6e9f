//! Pieces of the ggml block formats that every decoder needs: little-endian
//! field readers, the sub-block scale packings of the K-quants, the 2-bit
//! code layout of Q2_K/Q3_K and the codebooks of the non-linear 4-bit types.
//! The reference (de)quantizers here and the runtime's kernels read blocks
//! through these, so each packing is written once.

pub use crate::quant::iq_grids::{KVALUES_FP4, KVALUES_IQ4NL};

/// The f16 at `b[off..off + 2]`, as f32 (exact).
#[inline]
pub fn f16_at(b: &[u8], off: usize) -> f32 {
    half::f16::from_le_bytes([b[off], b[off + 1]]).to_f32()
}

#[inline]
pub fn f32_at(b: &[u8], off: usize) -> f32 {
    f32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

#[inline]
pub fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

#[inline]
pub fn i16_at(b: &[u8], off: usize) -> i16 {
    i16::from_le_bytes([b[off], b[off + 1]])
}

#[inline]
pub fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Half of an E8M0 scale, 2^(e − 128): MXFP4's scale, halved because
/// [`KVALUES_FP4`] holds the E2M1 values doubled.
#[inline]
pub fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        u32::from(e - 1) << 23
    };
    f32::from_bits(bits)
}

/// The 6-bit scale and min of sub-block `j` (of 8) from the 12 packed bytes
/// of Q4_K/Q5_K.
#[inline]
pub fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// All eight 6-bit scales and mins of Q4_K/Q5_K's 12 packed bytes at once,
/// one per byte of two little-endian u64 (scale `j` in byte `j`): what
/// [`scale_min_k4`] gives for each `j`, in a few word operations.
#[inline(always)]
pub fn scales_mins_k4(s: &[u8; 12]) -> (u64, u64) {
    const LOW6: u32 = 0x3f3f_3f3f;
    const LOW4: u32 = 0x0f0f_0f0f;
    const LOW2: u32 = 0x0303_0303;
    let u = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (u0, u1, u2) = (u(0), u(1), u(2));
    let scales = [u0 & LOW6, (u2 & LOW4) | (((u0 >> 6) & LOW2) << 4)];
    let mins = [u1 & LOW6, ((u2 >> 4) & LOW4) | (((u1 >> 6) & LOW2) << 4)];
    let join = |p: [u32; 2]| u64::from(p[0]) | (u64::from(p[1]) << 32);
    (join(scales), join(mins))
}

/// The 16 signed 6-bit sub-block scales of a Q3_K block (its 12 scale bytes).
#[inline]
pub fn q3_k_scales(s: &[u8]) -> [i8; 16] {
    std::array::from_fn(|j| q3_k_scale(s, j))
}

/// Sub-block `j`'s scale of [`q3_k_scales`]: the low four bits from nibble
/// `j` of the first 8 bytes, the high two from bits `2(j / 4)` of byte
/// `8 + j % 4`.
#[inline]
pub fn q3_k_scale(s: &[u8], j: usize) -> i8 {
    let low = if j < 8 { s[j] & 0xF } else { s[j - 8] >> 4 };
    let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
    ((low | (high << 4)) as i8) - 32
}

/// IQ4_XS's 6-bit scale of sub-block `j` (of 8) less 32, from block `b`:
/// the low four bits from nibble `j` of bytes 4..8, the high two from bits
/// `2j`, `2j + 1` of the u16 at 2.
#[inline]
pub fn iq4_xs_scale(b: &[u8], j: usize) -> i32 {
    let low = i32::from((b[4 + j / 2] >> (4 * (j % 2))) & 0xF);
    let high = i32::from((u16_at(b, 2) >> (2 * j)) & 3);
    (low | (high << 4)) - 32
}

/// The 4-bit part of element `e` (of 256) of Q4_K/Q5_K `qs` (128 bytes):
/// each 32-byte run holds 64 elements, low nibbles first.
#[inline]
pub fn nibble256(qs: &[u8], e: usize) -> u8 {
    let byte = qs[32 * (e / 64) + e % 32];
    if (e / 32).is_multiple_of(2) {
        byte & 0xF
    } else {
        byte >> 4
    }
}

/// The 2-bit field of element `e` (of 256) in Q2_K/Q3_K `qs` (64 bytes): two
/// halves of 128 elements, each four 2-bit shifts of 32 bytes.
#[inline]
pub fn crumb(qs: &[u8], e: usize) -> u8 {
    let (half, r) = (e / 128, e % 128);
    (qs[32 * half + r % 32] >> (2 * (r / 32))) & 3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e8m0_halves() {
        assert_eq!(e8m0_half(128), 1.0);
        assert_eq!(e8m0_half(127), 0.5);
        assert_eq!(e8m0_half(1), f32::from_bits(1 << 22)); // 2^-127, subnormal
        assert_eq!(e8m0_half(0), f32::from_bits(1 << 21)); // 2^-128
    }

    #[test]
    fn k4_scales_unpack_both_halves() {
        // Sub-blocks 0..4 in the low six bits; 4..8 from the nibbles of bytes
        // 8..12 and the top bits of bytes 0..8.
        let s = [
            0xC1, 0x02, 0x03, 0x04, 0x45, 0x06, 0x07, 0x08, 0x9A, 0, 0, 0,
        ];
        assert_eq!(scale_min_k4(0, &s), (1, 5));
        assert_eq!(scale_min_k4(4, &s), (0xA | (3 << 4), 0x9 | (1 << 4)));
    }

    #[test]
    fn packed_k4_scales_unpack_like_each_one() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..1000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let b: [u8; 12] = std::array::from_fn(|i| (state >> (i * 5 % 60)) as u8);
            let (sc, mn) = scales_mins_k4(&b);
            for j in 0..8 {
                let got = ((sc >> (8 * j)) as u8, (mn >> (8 * j)) as u8);
                assert_eq!(got, scale_min_k4(j, &b), "{b:?} {j}");
            }
        }
    }

    #[test]
    fn q3_scales_are_centred() {
        let mut s = [0u8; 12];
        s[0] = 0x0F; // scale 0: low 15, high 0 → 15 − 32
        s[8] = 0x03; // scale 0's high bits 3 → 63 − 32
        assert_eq!(q3_k_scales(&s)[0], 31);
        assert_eq!(q3_k_scales(&[0u8; 12]), [-32; 16]);
    }

    #[test]
    fn crumbs_follow_the_shift_layout() {
        let mut qs = [0u8; 64];
        qs[5] = 0b1110_0100; // elements 5, 37, 69, 101 = 0, 1, 2, 3
        assert_eq!([5, 37, 69, 101].map(|e| crumb(&qs, e)), [0, 1, 2, 3]);
        qs[32] = 3; // element 128
        assert_eq!(crumb(&qs, 128), 3);
    }
}
