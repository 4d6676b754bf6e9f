//! Plain scalar types and the 32-element "legacy" block formats.
//!
//! All 32-element formats put element `e < 16` in the low nibble of byte `e`
//! and element `e >= 16` in the high nibble of byte `e - 16`.

use super::{f16_at, i16_at, u32_at};

pub(crate) fn dequant_f32(b: &[u8], y: &mut [f32]) {
    for (v, c) in y.iter_mut().zip(b.chunks_exact(4)) {
        *v = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
}

pub(crate) fn dequant_f16(b: &[u8], y: &mut [f32]) {
    for (v, c) in y.iter_mut().zip(b.chunks_exact(2)) {
        *v = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
    }
}

pub(crate) fn dequant_bf16(b: &[u8], y: &mut [f32]) {
    for (v, c) in y.iter_mut().zip(b.chunks_exact(2)) {
        *v = half::bf16::from_le_bytes([c[0], c[1]]).to_f32();
    }
}

pub(crate) fn dequant_f64(b: &[u8], y: &mut [f32]) {
    for (v, c) in y.iter_mut().zip(b.chunks_exact(8)) {
        *v = f64::from_le_bytes(c.try_into().expect("chunk of 8")) as f32;
    }
}

pub(crate) fn dequant_i8(b: &[u8], y: &mut [f32]) {
    for (v, &c) in y.iter_mut().zip(b) {
        *v = c as i8 as f32;
    }
}

pub(crate) fn dequant_i16(b: &[u8], y: &mut [f32]) {
    for (i, v) in y.iter_mut().enumerate() {
        *v = i16_at(b, 2 * i) as f32;
    }
}

pub(crate) fn dequant_i32(b: &[u8], y: &mut [f32]) {
    for (v, c) in y.iter_mut().zip(b.chunks_exact(4)) {
        *v = i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32;
    }
}

pub(crate) fn dequant_i64(b: &[u8], y: &mut [f32]) {
    for (v, c) in y.iter_mut().zip(b.chunks_exact(8)) {
        *v = i64::from_le_bytes(c.try_into().expect("chunk of 8")) as f32;
    }
}

/// The 4-bit value of element `e` of a 32-element block whose nibbles start at `qs`.
#[inline]
fn nibble32(qs: &[u8], e: usize) -> u8 {
    if e < 16 {
        qs[e] & 0xF
    } else {
        qs[e - 16] >> 4
    }
}

pub(crate) fn dequant_q4_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for (e, v) in y.iter_mut().enumerate() {
        *v = (nibble32(qs, e) as i32 - 8) as f32 * d;
    }
}

pub(crate) fn dequant_q4_1(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qs = &b[4..20];
    for (e, v) in y.iter_mut().enumerate() {
        *v = nibble32(qs, e) as f32 * d + m;
    }
}

pub(crate) fn dequant_q5_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let qh = u32_at(b, 2);
    let qs = &b[6..22];
    for (e, v) in y.iter_mut().enumerate() {
        let q = nibble32(qs, e) as u32 | (((qh >> e) & 1) << 4);
        *v = (q as i32 - 16) as f32 * d;
    }
}

pub(crate) fn dequant_q5_1(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qh = u32_at(b, 4);
    let qs = &b[8..24];
    for (e, v) in y.iter_mut().enumerate() {
        let q = nibble32(qs, e) as u32 | (((qh >> e) & 1) << 4);
        *v = q as f32 * d + m;
    }
}

pub(crate) fn dequant_q8_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (v, &q) in y.iter_mut().zip(&b[2..34]) {
        *v = q as i8 as f32 * d;
    }
}

/// Q8_1 carries a precomputed sum in bytes 2..4; dequantization ignores it.
pub(crate) fn dequant_q8_1(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (v, &q) in y.iter_mut().zip(&b[4..36]) {
        *v = q as i8 as f32 * d;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16_bytes(x: f32) -> [u8; 2] {
        half::f16::from_f32(x).to_le_bytes()
    }

    #[test]
    fn q4_0_splits_nibbles_into_halves() {
        let mut b = [0u8; 18];
        b[..2].copy_from_slice(&f16_bytes(0.5));
        b[2] = 0x9A; // element 0 = 0xA, element 16 = 0x9
        let mut y = [0f32; 32];
        dequant_q4_0(&b, &mut y);
        assert_eq!(y[0], (10 - 8) as f32 * 0.5);
        assert_eq!(y[16], (9 - 8) as f32 * 0.5);
        assert_eq!(y[1], -4.0);
    }

    #[test]
    fn q5_0_high_bit_comes_from_qh_bit_e() {
        let mut b = [0u8; 22];
        b[..2].copy_from_slice(&f16_bytes(1.0));
        b[2..6].copy_from_slice(&(1u32 << 17).to_le_bytes());
        let mut y = [0f32; 32];
        dequant_q5_0(&b, &mut y);
        assert_eq!(y[17], 0.0); // 16 - 16
        assert_eq!(y[16], -16.0);
    }

    #[test]
    fn q8_1_ignores_the_sum_field() {
        let mut b = [0u8; 36];
        b[..2].copy_from_slice(&f16_bytes(2.0));
        b[2..4].copy_from_slice(&f16_bytes(123.0));
        b[4] = (-3i8) as u8;
        b[35] = 7;
        let mut y = [0f32; 32];
        dequant_q8_1(&b, &mut y);
        assert_eq!(y[0], -6.0);
        assert_eq!(y[31], 14.0);
        assert_eq!(y[1], 0.0);
    }
}
