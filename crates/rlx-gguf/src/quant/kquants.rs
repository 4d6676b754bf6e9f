//! Dequantization of the 256-element K-quant super-blocks.
//!
//! Float operations follow ggml's `dequantize_row_*` order so results are
//! bit-identical, not merely close.

use super::{f16_at, f32_at};
use crate::blocks::{crumb, nibble256, q3_k_scales, scale_min_k4};

pub(crate) fn dequant_q2_k(b: &[u8], y: &mut [f32]) {
    let scales = &b[0..16];
    let qs = &b[16..80];
    let d = f16_at(b, 80);
    let dmin = f16_at(b, 82);
    for (e, v) in y.iter_mut().enumerate() {
        let sc = scales[e / 16];
        let dl = d * (sc & 0xF) as f32;
        let ml = dmin * (sc >> 4) as f32;
        *v = dl * crumb(qs, e) as f32 - ml;
    }
}

pub(crate) fn dequant_q3_k(b: &[u8], y: &mut [f32]) {
    let hmask = &b[0..32];
    let qs = &b[32..96];
    let scales = q3_k_scales(&b[96..108]);
    let d = f16_at(b, 108);
    for (e, v) in y.iter_mut().enumerate() {
        let dl = d * scales[e / 16] as f32;
        let high_set = (hmask[e % 32] >> (e / 32)) & 1 != 0;
        let q = crumb(qs, e) as i8 - if high_set { 0 } else { 4 };
        *v = dl * q as f32;
    }
}

pub(crate) fn dequant_q4_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qs = &b[16..144];
    for (j, sub) in y.chunks_exact_mut(32).enumerate() {
        let (sc, mn) = scale_min_k4(j, scales);
        let d1 = d * sc as f32;
        let m1 = dmin * mn as f32;
        for (i, v) in sub.iter_mut().enumerate() {
            *v = d1 * nibble256(qs, 32 * j + i) as f32 - m1;
        }
    }
}

pub(crate) fn dequant_q5_k(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    let qs = &b[48..176];
    for (j, sub) in y.chunks_exact_mut(32).enumerate() {
        let (sc, mn) = scale_min_k4(j, scales);
        let d1 = d * sc as f32;
        let m1 = dmin * mn as f32;
        for (i, v) in sub.iter_mut().enumerate() {
            let e = 32 * j + i;
            let high = (qh[e % 32] >> (e / 32)) & 1;
            *v = d1 * (nibble256(qs, e) + 16 * high) as f32 - m1;
        }
    }
}

pub(crate) fn dequant_q6_k(b: &[u8], y: &mut [f32]) {
    let ql = &b[0..128];
    let qh = &b[128..192];
    let scales = &b[192..208];
    let d = f16_at(b, 208);
    for (e, v) in y.iter_mut().enumerate() {
        let (half, r) = (e / 128, e % 128);
        let (quad, l) = (r / 32, r % 32);
        let byte = ql[64 * half + 32 * (quad % 2) + l];
        let low = if quad < 2 { byte & 0xF } else { byte >> 4 };
        let high = (qh[32 * half + l] >> (2 * quad)) & 3;
        let q = (low | (high << 4)) as i8 - 32;
        *v = d * (scales[e / 16] as i8) as f32 * q as f32;
    }
}

pub(crate) fn dequant_q8_k(b: &[u8], y: &mut [f32]) {
    let d = f32_at(b, 0);
    for (v, &q) in y.iter_mut().zip(&b[4..260]) {
        *v = d * q as i8 as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_min_unpacking_uses_the_spare_top_bits() {
        let mut s = [0u8; 12];
        s[0] = 0b11_000101; // scale0 = 5, high bits of scale4 = 3
        s[4] = 0b01_000111; // min0 = 7, high bits of min4 = 1
        s[8] = 0x2A; // scale4 low = 0xA, min4 low = 0x2
        assert_eq!(scale_min_k4(0, &s), (5, 7));
        assert_eq!(scale_min_k4(4, &s), (0xA | (3 << 4), 0x2 | (1 << 4)));
    }

    #[test]
    fn q6_k_zero_codes_give_minus_32_times_scale() {
        let mut b = [0u8; 210];
        b[192..208].fill(2);
        b[208..210].copy_from_slice(&half::f16::from_f32(0.25).to_le_bytes());
        let mut y = [0f32; 256];
        dequant_q6_k(&b, &mut y);
        assert!(y.iter().all(|&v| v == 0.25 * 2.0 * -32.0));
    }
}
