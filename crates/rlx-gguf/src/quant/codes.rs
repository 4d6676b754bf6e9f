//! The integer block formats seen as unsigned byte codes with one affine map
//! per sub-block: `value = scale · code − offset`.
//!
//! Integer matrix kernels want every format in one shape: u8 codes they can
//! feed to unsigned×signed byte dot products, and per-sub-block f32 factors
//! applied after the integer sum. `Σ value·x = scale·Σ code·x − offset·Σ x`,
//! so a kernel needs only the activation sums besides the integer dot.

use super::iq_grids::KVALUES_IQ4NL;
use super::{check_lengths, f16_at, u32_at, QuantError};
use crate::blocks::{q3_k_scales, scale_min_k4};
use crate::GgmlType;

/// Elements per affine sub-block of `ty`, or `None` if `ty` has no exact
/// code form (floats, codebook formats).
pub fn affine_sub_block(ty: GgmlType) -> Option<usize> {
    use GgmlType::*;
    match ty {
        Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q4_K | Q5_K | IQ4_NL => Some(32),
        Q2_K | Q3_K | Q6_K => Some(16),
        _ => None,
    }
}

/// The largest code [`affine_codes`] gives for `ty` (from the bit widths,
/// whatever the block bytes), or `None` where [`affine_sub_block`] is.
/// Codes up to 127 also read as signed bytes, for signed×signed dot
/// products.
pub fn affine_max_code(ty: GgmlType) -> Option<u8> {
    use GgmlType::*;
    Some(match ty {
        Q8_0 | IQ4_NL => 255,
        Q6_K => 63,
        Q5_0 | Q5_1 | Q5_K => 31,
        Q4_0 | Q4_1 | Q4_K => 15,
        Q3_K => 7,
        Q2_K => 3,
        _ => return None,
    })
}

/// Decodes packed `src` (whole blocks of `ty`) into `codes` (one per element,
/// `codes.len()` elements) and, per sub-block of [`affine_sub_block`]
/// elements, `scale` and `offset`, so that element `e` of sub-block `s` is
/// `scale[s] · codes[e] − offset[s]`, which equals `dequantize` up to the
/// rounding of that product.
pub fn affine_codes(
    ty: GgmlType,
    src: &[u8],
    codes: &mut [u8],
    scale: &mut [f32],
    offset: &mut [f32],
) -> Result<(), QuantError> {
    let sub = affine_sub_block(ty).ok_or(QuantError::Unsupported {
        ty,
        op: "affine code decoding",
    })?;
    check_lengths(ty, codes.len(), src.len())?;
    let n_sub = codes.len() / sub;
    for len in [scale.len(), offset.len()] {
        if len != n_sub {
            return Err(QuantError::ByteLength {
                ty,
                elems: codes.len(),
                expected: n_sub,
                actual: len,
            });
        }
    }
    let (be, bb) = (ty.block_elems(), ty.block_bytes());
    let spb = be / sub;
    for (i, b) in src.chunks_exact(bb).enumerate() {
        let c = &mut codes[i * be..(i + 1) * be];
        let s = &mut scale[i * spb..(i + 1) * spb];
        let o = &mut offset[i * spb..(i + 1) * spb];
        decode_block(ty, b, c, s, o);
    }
    Ok(())
}

// Loops run over whole runs of a block (no per-element index arithmetic) so
// they vectorise: kernels call this for every weight of a prefill matmul.
fn decode_block(ty: GgmlType, b: &[u8], c: &mut [u8], s: &mut [f32], o: &mut [f32]) {
    use GgmlType::*;
    match ty {
        Q8_0 => {
            let d = f16_at(b, 0);
            for (c, &q) in c.iter_mut().zip(&b[2..34]) {
                *c = q ^ 0x80;
            }
            (s[0], o[0]) = (d, 128.0 * d);
        }
        Q4_0 | Q4_1 | IQ4_NL => {
            let qs = if ty == Q4_1 { &b[4..20] } else { &b[2..18] };
            nibbles(qs, c);
            let d = f16_at(b, 0);
            (s[0], o[0]) = match ty {
                Q4_0 => (d, 8.0 * d),
                Q4_1 => (d, -f16_at(b, 2)),
                _ => {
                    for c in c.iter_mut() {
                        *c = (KVALUES_IQ4NL[usize::from(*c)] as u8) ^ 0x80;
                    }
                    (d, 128.0 * d)
                }
            };
        }
        Q5_0 | Q5_1 => {
            let (qh_at, qs_at) = if ty == Q5_0 { (2, 6) } else { (4, 8) };
            nibbles(&b[qs_at..qs_at + 16], c);
            let qh = u32_at(b, qh_at);
            for (e, c) in c.iter_mut().enumerate() {
                *c |= (((qh >> e) & 1) as u8) << 4;
            }
            let d = f16_at(b, 0);
            (s[0], o[0]) = if ty == Q5_0 {
                (d, 16.0 * d)
            } else {
                (d, -f16_at(b, 2))
            };
        }
        Q4_K | Q5_K => {
            let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
            let scales = &b[4..16];
            let qs = if ty == Q4_K { &b[16..144] } else { &b[48..176] };
            // Sub-blocks 2p and 2p+1 are the low and high nibbles of qs[32p..].
            for (p, pair) in c.chunks_exact_mut(64).enumerate() {
                let (lo, hi) = pair.split_at_mut(32);
                for ((lo, hi), &q) in lo.iter_mut().zip(hi).zip(&qs[32 * p..32 * p + 32]) {
                    (*lo, *hi) = (q & 0xF, q >> 4);
                }
            }
            if ty == Q5_K {
                let qh = &b[16..48];
                for (j, sub) in c.chunks_exact_mut(32).enumerate() {
                    for (c, &h) in sub.iter_mut().zip(qh) {
                        *c |= ((h >> j) & 1) << 4;
                    }
                }
            }
            for j in 0..8 {
                let (sc, mn) = scale_min_k4(j, scales);
                (s[j], o[j]) = (d * sc as f32, dmin * mn as f32);
            }
        }
        Q6_K => {
            let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
            let d = f16_at(b, 208);
            // Each half of 128: four runs of 32 from ql's nibbles and qh's crumbs.
            for (half, out) in c.chunks_exact_mut(128).enumerate() {
                let ql = &ql[64 * half..64 * half + 64];
                let qh = &qh[32 * half..32 * half + 32];
                for (quad, run) in out.chunks_exact_mut(32).enumerate() {
                    let bytes = &ql[32 * (quad % 2)..32 * (quad % 2) + 32];
                    let shift = if quad < 2 { 0 } else { 4 };
                    for ((c, &lq), &h) in run.iter_mut().zip(bytes).zip(qh) {
                        *c = ((lq >> shift) & 0xF) | (((h >> (2 * quad)) & 3) << 4);
                    }
                }
            }
            for j in 0..16 {
                let sc = d * (scales[j] as i8) as f32;
                (s[j], o[j]) = (sc, 32.0 * sc);
            }
        }
        Q2_K | Q3_K => {
            let qs = if ty == Q2_K { &b[16..80] } else { &b[32..96] };
            for (half, out) in c.chunks_exact_mut(128).enumerate() {
                let qs = &qs[32 * half..32 * half + 32];
                for (shift, run) in out.chunks_exact_mut(32).enumerate() {
                    for (c, &q) in run.iter_mut().zip(qs) {
                        *c = (q >> (2 * shift)) & 3;
                    }
                }
            }
            if ty == Q2_K {
                let (d, dmin) = (f16_at(b, 80), f16_at(b, 82));
                for (j, &sc) in b[0..16].iter().enumerate() {
                    (s[j], o[j]) = (d * (sc & 0xF) as f32, dmin * (sc >> 4) as f32);
                }
            } else {
                // value = low − 4 when the element's hmask bit is clear, low
                // when set: code = low + 4·bit, offset 4.
                let hmask = &b[0..32];
                for (j, run) in c.chunks_exact_mut(32).enumerate() {
                    for (c, &h) in run.iter_mut().zip(hmask) {
                        *c += 4 * ((h >> j) & 1);
                    }
                }
                let scales = q3_k_scales(&b[96..108]);
                let d = f16_at(b, 108);
                for j in 0..16 {
                    let sc = d * scales[j] as f32;
                    (s[j], o[j]) = (sc, 4.0 * sc);
                }
            }
        }
        _ => unreachable!("affine_sub_block admits only the types above"),
    }
}

/// The 32 codes of a legacy block: element `e < 16` is the low nibble of
/// byte `e`, element `e ≥ 16` the high nibble of byte `e − 16`.
#[inline]
fn nibbles(qs: &[u8], c: &mut [u8]) {
    let (lo, hi) = c.split_at_mut(16);
    for ((lo, hi), &q) in lo.iter_mut().zip(hi).zip(qs) {
        (*lo, *hi) = (q & 0xF, q >> 4);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Random but well-formed blocks: quantize random floats, then perturb the
    /// scale bytes of K-quants so every scale/min field is exercised.
    fn random_rows(ty: GgmlType, blocks: usize, seed: u64) -> Vec<u8> {
        let mut state = seed | 1;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let n = blocks * ty.block_elems();
        let xs: Vec<f32> = (0..n)
            .map(|_| ((next() % 20001) as f32 / 10000.0 - 1.0) * 3.0)
            .collect();
        if crate::quant::can_quantize(ty) {
            crate::quantize_to_vec(ty, &xs).unwrap()
        } else {
            // IQ4_NL: any bytes with a finite f16 scale are valid.
            let mut b: Vec<u8> = (0..blocks * ty.block_bytes())
                .map(|_| next() as u8)
                .collect();
            for blk in b.chunks_exact_mut(ty.block_bytes()) {
                blk[..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
            }
            b
        }
    }

    #[test]
    fn codes_reproduce_dequantize_for_every_affine_type() {
        use GgmlType::*;
        for ty in [
            Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL,
        ] {
            let blocks = 3;
            let src = random_rows(ty, blocks, 0x9e37_79b9 ^ ty as u64);
            let n = blocks * ty.block_elems();
            let sub = affine_sub_block(ty).unwrap();
            let mut codes = vec![0u8; n];
            let mut scale = vec![0f32; n / sub];
            let mut offset = vec![0f32; n / sub];
            affine_codes(ty, &src, &mut codes, &mut scale, &mut offset).unwrap();
            let max = affine_max_code(ty).unwrap();
            assert!(codes.iter().all(|&c| c <= max), "{ty}: a code above {max}");
            // Any block bytes at all stay within the bound too.
            let raw: Vec<u8> = (0..src.len()).map(|i| (i * 151 + 7) as u8).collect();
            affine_codes(ty, &raw, &mut codes, &mut scale, &mut offset).unwrap();
            assert!(codes.iter().all(|&c| c <= max), "{ty}: a code above {max}");
            affine_codes(ty, &src, &mut codes, &mut scale, &mut offset).unwrap();
            let want = crate::dequantize_to_vec(ty, &src).unwrap();
            for e in 0..n {
                let s = e / sub;
                let got = scale[s] * codes[e] as f32 - offset[s];
                let tol = 1e-6 * (scale[s].abs() * 255.0 + offset[s].abs()).max(1e-30);
                assert!(
                    (got - want[e]).abs() <= tol,
                    "{ty} element {e}: {got} vs {}",
                    want[e]
                );
            }
        }
    }

    #[test]
    fn non_affine_types_and_bad_lengths_are_refused() {
        let mut c = [0u8; 32];
        let (mut s, mut o) = ([0f32; 1], [0f32; 1]);
        assert!(matches!(
            affine_codes(GgmlType::F16, &[0; 64], &mut c, &mut s, &mut o),
            Err(QuantError::Unsupported { .. })
        ));
        assert!(matches!(
            affine_codes(GgmlType::Q8_0, &[0; 33], &mut c, &mut s, &mut o),
            Err(QuantError::ByteLength { .. })
        ));
        let mut s2 = [0f32; 2];
        assert!(affine_codes(GgmlType::Q8_0, &[0; 34], &mut c, &mut s2, &mut o).is_err());
    }
}
