//! Scalar reference dequantization of the codebook (IQ*), ternary (TQ*), FP4 (MXFP4,
//! NVFP4) and low-bit (Q1_0, Q2_0) ggml block formats.
//!
//! Each function turns one block into f32 and matches llama.cpp's `dequantize_row_*`
//! bit for bit. The float operations follow ggml's order (e.g. IQ2 forms
//! `d * (0.5 + s) * 0.25` before multiplying by the grid value), so results stay
//! identical wherever a different order could round differently.

use super::iq_grids::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
    KVALUES_FP4, KVALUES_IQ4NL,
};

use crate::blocks::{e8m0_half, f16_at, iq4_xs_scale, u16_at, u32_at};

const IQ1S_DELTA: f32 = 0.125;
const IQ1M_DELTA: f32 = 0.125;

/// Eight codebook magnitudes scaled by `dl`; bit j of `signs` negates element j.
fn put_signed8(y: &mut [f32], dl: f32, grid: [u8; 8], signs: u8) {
    for (j, (y, g)) in y.iter_mut().zip(grid).enumerate() {
        let s = if signs & (1 << j) != 0 { -1.0 } else { 1.0 };
        *y = dl * f32::from(g) * s;
    }
}

/// Two 4-byte IQ3 grid entries side by side form one group of 8.
fn iq3_pair(g1: u32, g2: u32) -> [u8; 8] {
    (u64::from(g1) | (u64::from(g2) << 32)).to_le_bytes()
}

/// 256 elements: `d` f16, then per 32 elements two u32: four grid indices and
/// (4 × 7 sign bits, 4-bit scale).
pub(crate) fn dequant_block_iq2_xxs(b: &[u8], y: &mut [f32]) {
    debug_assert_eq!(b.len(), 66);
    debug_assert_eq!(y.len(), 256);
    let d = f16_at(b, 0);
    for (q, y) in b[2..].chunks_exact(8).zip(y.chunks_exact_mut(32)) {
        let aux = u32_at(q, 4);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.25;
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let grid = IQ2XXS_GRID[usize::from(q[l])].to_le_bytes();
            let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
            put_signed8(y, db, grid, signs);
        }
    }
}

/// 256 elements: `d` f16, 32 × u16 (9-bit grid index, 7-bit sign index), 8 scale
/// bytes with one nibble per 16 elements.
pub(crate) fn dequant_block_iq2_xs(b: &[u8], y: &mut [f32]) {
    debug_assert_eq!(b.len(), 74);
    debug_assert_eq!(y.len(), 256);
    let d = f16_at(b, 0);
    let (qs, scales) = b[2..].split_at(64);
    for ((q, &sc), y) in qs.chunks_exact(8).zip(scales).zip(y.chunks_exact_mut(32)) {
        let db = [
            d * (0.5 + f32::from(sc & 0xf)) * 0.25,
            d * (0.5 + f32::from(sc >> 4)) * 0.25,
        ];
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let v = u16_at(q, 2 * l);
            let grid = IQ2XS_GRID[usize::from(v & 511)].to_le_bytes();
            let signs = KSIGNS_IQ2XS[usize::from(v >> 9)];
            put_signed8(y, db[l / 2], grid, signs);
        }
    }
}

/// 256 elements: `d` f16, 32 low index bytes, 32 sign bytes, 8 `qh` bytes (2 high
/// index bits per group of 8), 8 scale bytes.
pub(crate) fn dequant_block_iq2_s(b: &[u8], y: &mut [f32]) {
    debug_assert_eq!(b.len(), 82);
    debug_assert_eq!(y.len(), 256);
    let d = f16_at(b, 0);
    let qs = &b[2..34];
    let signs = &b[34..66];
    let qh = &b[66..74];
    let scales = &b[74..82];
    for (ib, y) in y.chunks_exact_mut(32).enumerate() {
        let sc = scales[ib];
        let db = [
            d * (0.5 + f32::from(sc & 0xf)) * 0.25,
            d * (0.5 + f32::from(sc >> 4)) * 0.25,
        ];
        let h = u32::from(qh[ib]);
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let idx = u32::from(qs[4 * ib + l]) | ((h << (8 - 2 * l)) & 0x300);
            let grid = IQ2S_GRID[idx as usize].to_le_bytes();
            put_signed8(y, db[l / 2], grid, signs[4 * ib + l]);
        }
    }
}

/// 256 elements: `d` f16, 64 grid index bytes, then per 32 elements one u32 of
/// (4 × 7 sign bits, 4-bit scale).
pub(crate) fn dequant_block_iq3_xxs(b: &[u8], y: &mut [f32]) {
    debug_assert_eq!(b.len(), 98);
    debug_assert_eq!(y.len(), 256);
    let d = f16_at(b, 0);
    let (qs, scales_and_signs) = b[2..].split_at(64);
    for ((q, ss), y) in qs
        .chunks_exact(8)
        .zip(scales_and_signs.chunks_exact(4))
        .zip(y.chunks_exact_mut(32))
    {
        let aux = u32_at(ss, 0);
        let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
            let grid = iq3_pair(
                IQ3XXS_GRID[usize::from(q[2 * l])],
                IQ3XXS_GRID[usize::from(q[2 * l + 1])],
            );
            put_signed8(y, db, grid, signs);
        }
    }
}

/// 256 elements: `d` f16, 64 low index bytes, 8 `qh` bytes (the 9th index bit),
/// 32 sign bytes, 4 scale bytes with one nibble per 32 elements.
pub(crate) fn dequant_block_iq3_s(b: &[u8], y: &mut [f32]) {
    debug_assert_eq!(b.len(), 110);
    debug_assert_eq!(y.len(), 256);
    let d = f16_at(b, 0);
    let qs = &b[2..66];
    let qh = &b[66..74];
    let signs = &b[74..106];
    let scales = &b[106..110];
    for (ib, y) in y.chunks_exact_mut(32).enumerate() {
        let nib = (scales[ib / 2] >> (4 * (ib % 2))) & 0xf;
        let db = d * (1 + 2 * i32::from(nib)) as f32;
        let q = &qs[8 * ib..8 * ib + 8];
        let h = u32::from(qh[ib]);
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let i1 = u32::from(q[2 * l]) | ((h << (8 - 2 * l)) & 256);
            let i2 = u32::from(q[2 * l + 1]) | ((h << (7 - 2 * l)) & 256);
            let grid = iq3_pair(IQ3S_GRID[i1 as usize], IQ3S_GRID[i2 as usize]);
            put_signed8(y, db, grid, signs[4 * ib + l]);
        }
    }
}

/// Eight signed ternary codebook entries, shifted by `delta` and scaled by `dl`.
fn put_iq1(y: &mut [f32], dl: f32, idx: usize, delta: f32) {
    for (y, g) in y.iter_mut().zip(IQ1S_GRID[idx].to_le_bytes()) {
        *y = dl * (f32::from(g as i8) + delta);
    }
}

/// 256 elements: `d` f16, 32 low index bytes, then per 32 elements a u16 of
/// (4 × 3 high index bits, 3-bit scale, delta sign).
pub(crate) fn dequant_block_iq1_s(b: &[u8], y: &mut [f32]) {
    debug_assert_eq!(b.len(), 50);
    debug_assert_eq!(y.len(), 256);
    let d = f16_at(b, 0);
    let qs = &b[2..34];
    for (ib, y) in y.chunks_exact_mut(32).enumerate() {
        let qh = u16_at(b, 34 + 2 * ib);
        let dl = d * f32::from(2 * ((qh >> 12) & 7) + 1);
        let delta = if qh & 0x8000 != 0 {
            -IQ1S_DELTA
        } else {
            IQ1S_DELTA
        };
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let idx = usize::from(qs[4 * ib + l]) | (usize::from((qh >> (3 * l)) & 7) << 8);
            put_iq1(y, dl, idx, delta);
        }
    }
}

/// 256 elements: 32 low index bytes, 16 `qh` bytes (per group of 8: 3 high index
/// bits and a delta sign), 8 scale bytes read as 4 × u16 holding 3-bit scales, with
/// the f16 super-scale spread over their top nibbles.
pub(crate) fn dequant_block_iq1_m(b: &[u8], y: &mut [f32]) {
    debug_assert_eq!(b.len(), 56);
    debug_assert_eq!(y.len(), 256);
    let qs = &b[..32];
    let qh = &b[32..48];
    let sc = [u16_at(b, 48), u16_at(b, 50), u16_at(b, 52), u16_at(b, 54)];
    let d_bits =
        (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
    let d = half::f16::from_bits(d_bits).to_f32();
    for (ib, y) in y.chunks_exact_mut(32).enumerate() {
        let s = sc[ib / 2] >> (6 * (ib % 2));
        let dl1 = d * f32::from(2 * (s & 7) + 1);
        let dl2 = d * f32::from(2 * ((s >> 3) & 7) + 1);
        let q = &qs[4 * ib..4 * ib + 4];
        let h = [u16::from(qh[2 * ib]), u16::from(qh[2 * ib + 1])];
        let idx = [
            u16::from(q[0]) | ((h[0] << 8) & 0x700),
            u16::from(q[1]) | ((h[0] << 4) & 0x700),
            u16::from(q[2]) | ((h[1] << 8) & 0x700),
            u16::from(q[3]) | ((h[1] << 4) & 0x700),
        ];
        let delta = |hb: u16, mask: u16| {
            if hb & mask != 0 {
                -IQ1M_DELTA
            } else {
                IQ1M_DELTA
            }
        };
        let deltas = [
            delta(h[0], 0x08),
            delta(h[0], 0x80),
            delta(h[1], 0x08),
            delta(h[1], 0x80),
        ];
        for (l, y) in y.chunks_exact_mut(8).enumerate() {
            let dl = if l < 2 { dl1 } else { dl2 };
            put_iq1(y, dl, usize::from(idx[l]), deltas[l]);
        }
    }
}

/// 32 elements: `d` f16, 16 nibble bytes (low nibbles = first half) indexing the
/// non-linear table.
pub(crate) fn dequant_block_iq4_nl(b: &[u8], y: &mut [f32]) {
    debug_assert_eq!(b.len(), 18);
    debug_assert_eq!(y.len(), 32);
    let d = f16_at(b, 0);
    let (lo, hi) = y.split_at_mut(16);
    for ((&q, lo), hi) in b[2..].iter().zip(lo).zip(hi) {
        *lo = d * f32::from(KVALUES_IQ4NL[usize::from(q & 0xf)]);
        *hi = d * f32::from(KVALUES_IQ4NL[usize::from(q >> 4)]);
    }
}

/// 256 elements: `d` f16, `scales_h` u16 (2 high bits per 32), 4 `scales_l` bytes
/// (a nibble per 32), then 8 × 16 nibble bytes laid out as IQ4_NL.
pub(crate) fn dequant_block_iq4_xs(b: &[u8], y: &mut [f32]) {
    debug_assert_eq!(b.len(), 136);
    debug_assert_eq!(y.len(), 256);
    let d = f16_at(b, 0);
    for (ib, (q, y)) in b[8..]
        .chunks_exact(16)
        .zip(y.chunks_exact_mut(32))
        .enumerate()
    {
        let dl = d * iq4_xs_scale(b, ib) as f32;
        let (lo, hi) = y.split_at_mut(16);
        for ((&q, lo), hi) in q.iter().zip(lo).zip(hi) {
            *lo = dl * f32::from(KVALUES_IQ4NL[usize::from(q & 0xf)]);
            *hi = dl * f32::from(KVALUES_IQ4NL[usize::from(q >> 4)]);
        }
    }
}

/// Base-3 digits packed as `ceil(v * 256 / 3^5)`: chunk n of `y` gets digit n of every
/// byte, read by multiplying by 3^n (mod 256) and taking the top trit.
fn tq1_unpack(y: &mut [f32], qs: &[u8], d: f32) {
    const POW3: [u8; 5] = [1, 3, 9, 27, 81];
    for (y, p) in y.chunks_exact_mut(qs.len()).zip(POW3) {
        for (y, &q) in y.iter_mut().zip(qs) {
            let q = q.wrapping_mul(p);
            let xi = ((u16::from(q) * 3) >> 8) as i16;
            *y = f32::from(xi - 1) * d;
        }
    }
}

/// 256 elements: 48 bytes of 5 trits, 4 bytes of 4 trits, `d` f16 at the end.
pub(crate) fn dequant_block_tq1_0(b: &[u8], y: &mut [f32]) {
    debug_assert_eq!(b.len(), 54);
    debug_assert_eq!(y.len(), 256);
    let d = f16_at(b, 52);
    let (y0, rest) = y.split_at_mut(160);
    let (y1, y2) = rest.split_at_mut(80);
    tq1_unpack(y0, &b[..32], d);
    tq1_unpack(y1, &b[32..48], d);
    tq1_unpack(y2, &b[48..52], d);
}

/// 256 elements: 64 bytes of 2-bit codes (value = code − 1), `d` f16 at the end. Each
/// byte holds elements m, m+32, m+64, m+96 of its 128-element half.
pub(crate) fn dequant_block_tq2_0(b: &[u8], y: &mut [f32]) {
    debug_assert_eq!(b.len(), 66);
    debug_assert_eq!(y.len(), 256);
    let d = f16_at(b, 64);
    for (qs, y) in b[..64].chunks_exact(32).zip(y.chunks_exact_mut(128)) {
        for (l, y) in y.chunks_exact_mut(32).enumerate() {
            for (y, &q) in y.iter_mut().zip(qs) {
                let q = ((q >> (2 * l)) & 3) as i8;
                *y = f32::from(q - 1) * d;
            }
        }
    }
}

/// Half of a UE4M3 scale (bias 7, no sign; bit 7 is ignored), matching the doubled
/// FP4 table. 0x7F is the NaN code and reads as 0, as in ggml.
fn ue4m3_to_f32_half(x: u8) -> f32 {
    if x == 0 || x == 0x7f {
        return 0.0;
    }
    let exp = i32::from((x >> 3) & 0xf);
    let man = f32::from(x & 7);
    // Every step below is exact, so this equals ggml's ldexpf form.
    let raw = if exp == 0 {
        man * exp2i(-9)
    } else {
        (1.0 + man / 8.0) * exp2i(exp - 7)
    };
    raw * 0.5
}

/// 2^k for k in the normal f32 exponent range.
fn exp2i(k: i32) -> f32 {
    debug_assert!((-126..=127).contains(&k));
    f32::from_bits(((k + 127) as u32) << 23)
}

/// 32 elements: E8M0 exponent byte, 16 nibble bytes of E2M1 (low nibbles = first half).
pub(crate) fn dequant_block_mxfp4(b: &[u8], y: &mut [f32]) {
    debug_assert_eq!(b.len(), 17);
    debug_assert_eq!(y.len(), 32);
    let d = e8m0_half(b[0]);
    let (lo, hi) = y.split_at_mut(16);
    for ((&q, lo), hi) in b[1..].iter().zip(lo).zip(hi) {
        *lo = f32::from(KVALUES_FP4[usize::from(q & 0xf)]) * d;
        *hi = f32::from(KVALUES_FP4[usize::from(q >> 4)]) * d;
    }
}

/// 64 elements: 4 UE4M3 scale bytes, then 4 × 8 nibble bytes of E2M1; each 16-element
/// sub-block splits low/high nibbles like MXFP4.
pub(crate) fn dequant_block_nvfp4(b: &[u8], y: &mut [f32]) {
    debug_assert_eq!(b.len(), 36);
    debug_assert_eq!(y.len(), 64);
    let (scales, qs) = b.split_at(4);
    for ((&s, q), y) in scales
        .iter()
        .zip(qs.chunks_exact(8))
        .zip(y.chunks_exact_mut(16))
    {
        let d = ue4m3_to_f32_half(s);
        let (lo, hi) = y.split_at_mut(8);
        for ((&q, lo), hi) in q.iter().zip(lo).zip(hi) {
            *lo = f32::from(KVALUES_FP4[usize::from(q & 0xf)]) * d;
            *hi = f32::from(KVALUES_FP4[usize::from(q >> 4)]) * d;
        }
    }
}

/// 128 elements: `d` f16, then one bit per element (LSB first): set = +d, clear = −d.
pub(crate) fn dequant_block_q1_0(b: &[u8], y: &mut [f32]) {
    debug_assert_eq!(b.len(), 18);
    debug_assert_eq!(y.len(), 128);
    let d = f16_at(b, 0);
    for (&q, y) in b[2..].iter().zip(y.chunks_exact_mut(8)) {
        for (j, y) in y.iter_mut().enumerate() {
            *y = if (q >> j) & 1 != 0 { d } else { -d };
        }
    }
}

/// 64 elements: `d` f16, then 2 bits per element (LSB first), value = (code − 1)·d.
pub(crate) fn dequant_block_q2_0(b: &[u8], y: &mut [f32]) {
    debug_assert_eq!(b.len(), 18);
    debug_assert_eq!(y.len(), 64);
    let d = f16_at(b, 0);
    for (&q, y) in b[2..].iter().zip(y.chunks_exact_mut(4)) {
        for (j, y) in y.iter_mut().enumerate() {
            let code = i32::from((q >> (2 * j)) & 3);
            *y = (code - 1) as f32 * d;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16_bytes(x: f32) -> [u8; 2] {
        half::f16::from_f32(x).to_le_bytes()
    }

    #[test]
    fn iq4_nl_mid_nibble_is_one() {
        let mut b = [0x88u8; 18];
        b[..2].copy_from_slice(&f16_bytes(1.0));
        let mut y = [0.0; 32];
        dequant_block_iq4_nl(&b, &mut y);
        assert!(y.iter().all(|&v| v == 1.0));
    }

    #[test]
    fn iq4_nl_low_nibbles_first_half() {
        let mut b = [0u8; 18];
        b[..2].copy_from_slice(&f16_bytes(0.5));
        b[2] = 0xf0; // element 0 -> kvalues[0], element 16 -> kvalues[15]
        let mut y = [0.0; 32];
        dequant_block_iq4_nl(&b, &mut y);
        assert_eq!(y[0], -63.5);
        assert_eq!(y[16], 56.5);
        assert_eq!(y[1], -63.5);
    }

    #[test]
    fn iq4_xs_scale_bits() {
        let mut b = [0x88u8; 136];
        b[..2].copy_from_slice(&f16_bytes(1.0));
        // ls = 33 everywhere: low nibble 1, high bits 2.
        b[2..4].copy_from_slice(&0xaaaau16.to_le_bytes());
        b[4..8].fill(0x11);
        // Sub-block 3 gets ls = 0: dl = -32.
        b[5] = 0x01;
        b[2] = 0x2a;
        let mut y = [0.0; 256];
        dequant_block_iq4_xs(&b, &mut y);
        assert!(y[..96].iter().all(|&v| v == 1.0));
        assert!(y[96..128].iter().all(|&v| v == -32.0));
        assert!(y[128..].iter().all(|&v| v == 1.0));
    }

    #[test]
    fn mxfp4_value_table() {
        let mut b = [0u8; 17];
        b[0] = 127; // 2^0, halved to match the doubled table
        for (j, q) in b[1..].iter_mut().enumerate() {
            *q = (j as u8) | ((15 - j as u8) << 4);
        }
        let mut y = [0.0; 32];
        dequant_block_mxfp4(&b, &mut y);
        let e2m1 = [
            0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
        ];
        for j in 0..16 {
            assert_eq!(y[j], e2m1[j]);
            assert_eq!(y[16 + j], e2m1[15 - j]);
        }
        // The "negative zero" code gives +0.0: ggml's table stores it as integer 0.
        assert!(y[8].is_sign_positive());
    }

    #[test]
    fn ue4m3_half_scale() {
        assert_eq!(ue4m3_to_f32_half(0x38), 0.5); // exp 7, man 0: 1.0
        assert_eq!(ue4m3_to_f32_half(0x3c), 0.75); // 1.5
        assert_eq!(ue4m3_to_f32_half(0x01), 2f32.powi(-10)); // smallest subnormal
        assert_eq!(ue4m3_to_f32_half(0x7e), 224.0); // 448, the largest finite
        assert_eq!(ue4m3_to_f32_half(0x7f), 0.0);
        assert_eq!(ue4m3_to_f32_half(0xb8), 0.5); // sign bit ignored
    }

    #[test]
    fn nvfp4_sub_block_scales() {
        let mut b = [0x22u8; 36]; // every code = 2 -> 1.0 before scaling
        b[..4].copy_from_slice(&[0x38, 0x40, 0x00, 0x30]); // 1, 2, 0, 0.5
        let mut y = [0.0; 64];
        dequant_block_nvfp4(&b, &mut y);
        for (s, want) in [1.0f32, 2.0, 0.0, 0.5].into_iter().enumerate() {
            assert!(y[16 * s..16 * s + 16].iter().all(|&v| v == want));
        }
    }

    #[test]
    fn tq2_0_levels() {
        let mut b = [0u8; 66];
        // Codes 0,1,2,3 in the four bit pairs -> -1, 0, 1, 2.
        b[..64].fill(0b11_10_01_00);
        b[64..].copy_from_slice(&f16_bytes(2.0));
        let mut y = [0.0; 256];
        dequant_block_tq2_0(&b, &mut y);
        for (i, &v) in y.iter().enumerate() {
            let level = ((i % 128) / 32) as f32 - 1.0;
            assert_eq!(v, level * 2.0, "element {i}");
        }
    }

    #[test]
    fn tq1_0_trits() {
        // 5 trits t0..t4 (t0 most significant) pack as ceil(n * 256 / 243) with
        // n = sum t_k 3^(4-k).
        let pack = |t: [u8; 5]| -> u8 {
            let n = t.iter().fold(0u32, |a, &v| a * 3 + u32::from(v));
            ((n * 256).div_ceil(243)) as u8
        };
        let mut b = [0u8; 54];
        b[..48].fill(pack([0, 1, 2, 1, 0]));
        // qh bytes only use their first 4 trits; the 5th is 0.
        b[48..52].fill(pack([2, 2, 0, 1, 0]));
        b[52..].copy_from_slice(&f16_bytes(1.0));
        let mut y = [0.0; 256];
        dequant_block_tq1_0(&b, &mut y);
        let first = [-1.0, 0.0, 1.0, 0.0, -1.0];
        for n in 0..5 {
            assert!(y[32 * n..32 * n + 32].iter().all(|&v| v == first[n]));
            assert!(y[160 + 16 * n..176 + 16 * n].iter().all(|&v| v == first[n]));
        }
        let tail = [1.0, 1.0, -1.0, 0.0];
        for n in 0..4 {
            assert!(y[240 + 4 * n..244 + 4 * n].iter().all(|&v| v == tail[n]));
        }
    }

    #[test]
    fn q1_0_bits() {
        let mut b = [0u8; 18];
        b[..2].copy_from_slice(&f16_bytes(0.25));
        b[2] = 0b0000_0101;
        let mut y = [0.0; 128];
        dequant_block_q1_0(&b, &mut y);
        assert_eq!(&y[..4], &[0.25, -0.25, 0.25, -0.25]);
        assert!(y[8..].iter().all(|&v| v == -0.25));
    }

    #[test]
    fn q2_0_levels() {
        let mut b = [0u8; 18];
        b[..2].copy_from_slice(&f16_bytes(3.0));
        b[2] = 0b11_10_01_00;
        let mut y = [0.0; 64];
        dequant_block_q2_0(&b, &mut y);
        assert_eq!(&y[..4], &[-3.0, 0.0, 3.0, 6.0]);
        assert!(y[4..].iter().all(|&v| v == -3.0));
    }

    #[test]
    fn iq2_xxs_first_grid_entry() {
        // Index 0 is all 0x08 magnitudes; scale nibble 1 gives db = d * 1.5 / 4.
        let mut b = [0u8; 66];
        b[..2].copy_from_slice(&f16_bytes(1.0));
        for g in b[2..].chunks_exact_mut(8) {
            // Group 0 sign index 1 -> ksigns 129: negate elements 0 and 7.
            g[4..].copy_from_slice(&(1u32 << 28 | 1).to_le_bytes());
        }
        let mut y = [0.0; 256];
        dequant_block_iq2_xxs(&b, &mut y);
        let m = 0.375 * 8.0;
        assert_eq!(y[0], -m);
        assert_eq!(&y[1..7], &[m; 6]);
        assert_eq!(y[7], -m);
        assert!(y[8..32].iter().all(|&v| v == m));
    }

    #[test]
    fn iq1_s_delta_and_scale() {
        // Grid index 0 is all -1; scale 1 -> dl = 3d; delta sign set -> -0.125.
        let mut b = [0u8; 50];
        b[..2].copy_from_slice(&f16_bytes(1.0));
        b[34..36].copy_from_slice(&0x9000u16.to_le_bytes());
        let mut y = [0.0; 256];
        dequant_block_iq1_s(&b, &mut y);
        assert!(y[..32].iter().all(|&v| v == 3.0 * -1.125));
        assert!(y[32..].iter().all(|&v| v == -0.875));
    }

    #[test]
    fn iq1_m_scale_from_nibbles() {
        // f16 1.0 = 0x3c00: nibbles 0, 0, c, 3 go to the tops of sc[0..4].
        let mut b = [0u8; 56];
        let sc: [u16; 4] = [0x0000, 0x0000, 0xc000, 0x3000];
        for (k, s) in sc.iter().enumerate() {
            b[48 + 2 * k..50 + 2 * k].copy_from_slice(&s.to_le_bytes());
        }
        let mut y = [0.0; 256];
        dequant_block_iq1_m(&b, &mut y);
        assert!(y.iter().all(|&v| v == -0.875));
    }
}
