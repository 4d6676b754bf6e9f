//! Portable reference integer dot products (weight row × quantized activation row).
//!
//! Each kernel decodes one weight block to small integers, forms exact integer
//! dot products with the activation bytes per sub-block, applies the integer
//! sub-block scales, and scales in f32 once per block: block by block,
//! `sum += (d_w · d_a) · Σ` (minus the `dmin` term for the K-quants with mins,
//! plus `m_w · s_a` for Q4_1/Q5_1). The SIMD kernels form the same integers.

use rlx_gguf::blocks::{crumb, i16_at, iq4_xs_scale, nibble256, u32_at};
pub(super) use rlx_gguf::blocks::{
    e8m0_half, f16_at, f32_at, q3_k_scales, scale_min_k4, KVALUES_FP4, KVALUES_IQ4NL,
};
use rlx_gguf::GgmlType;

/// Bytes of an activation block.
pub(super) const Q8_0_BYTES: usize = GgmlType::Q8_0.block_bytes();
pub(super) const Q8_1_BYTES: usize = GgmlType::Q8_1.block_bytes();
pub(super) const Q8_K_BYTES: usize = GgmlType::Q8_K.block_bytes();

/// `Σ v[e] · a[e]` with the activation bytes read as i8.
#[inline]
fn idot(v: &[i8], a: &[u8]) -> i32 {
    v.iter()
        .zip(a)
        .map(|(&w, &q)| i32::from(w) * i32::from(q as i8))
        .sum()
}

/// The 32 nibbles of a legacy block: element `j < 16` is the low nibble of
/// `qs[j]`, element `j + 16` the high nibble.
#[inline]
fn nibbles32(qs: &[u8]) -> [u8; 32] {
    let mut v = [0u8; 32];
    for (j, &q) in qs[..16].iter().enumerate() {
        v[j] = q & 0xF;
        v[j + 16] = q >> 4;
    }
    v
}

/// The fifth bits of a Q5 block: bit `j` of `qh` belongs to element `j`.
#[inline]
fn with_high_bits(nib: [u8; 32], qh: u32) -> [u8; 32] {
    let mut v = nib;
    for (j, x) in v.iter_mut().enumerate() {
        *x |= (((qh >> j) & 1) as u8) << 4;
    }
    v
}

/// Q8_0 activation block: `(d, qs)`.
#[inline]
fn q8_0(ab: &[u8]) -> (f32, &[u8]) {
    (f16_at(ab, 0), &ab[2..34])
}

/// Q8_1 activation block: `(d, s, qs)`.
#[inline]
fn q8_1(ab: &[u8]) -> (f32, f32, &[u8]) {
    (f16_at(ab, 0), f16_at(ab, 2), &ab[4..36])
}

/// Q8_K activation block: `(d, qs, bsums)`.
#[inline]
fn q8_k(ab: &[u8]) -> (f32, &[u8], [i32; 16]) {
    let mut bsums = [0i32; 16];
    for (j, s) in bsums.iter_mut().enumerate() {
        *s = i32::from(i16_at(ab, 260 + 2 * j));
    }
    (f32_at(ab, 0), &ab[4..260], bsums)
}

pub(super) fn vec_dot_q4_0(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (wb, ab) in w
        .chunks_exact(GgmlType::Q4_0.block_bytes())
        .zip(a.chunks_exact(Q8_0_BYTES))
    {
        let (da, qa) = q8_0(ab);
        let v = nibbles32(&wb[2..18]).map(|q| q as i8 - 8);
        sum += (f16_at(wb, 0) * da) * idot(&v, qa) as f32;
    }
    sum
}

pub(super) fn vec_dot_q4_1(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (wb, ab) in w
        .chunks_exact(GgmlType::Q4_1.block_bytes())
        .zip(a.chunks_exact(Q8_1_BYTES))
    {
        let (da, sa, qa) = q8_1(ab);
        let v = nibbles32(&wb[4..20]).map(|q| q as i8);
        sum += (f16_at(wb, 0) * da) * idot(&v, qa) as f32 + f16_at(wb, 2) * sa;
    }
    sum
}

pub(super) fn vec_dot_q5_0(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (wb, ab) in w
        .chunks_exact(GgmlType::Q5_0.block_bytes())
        .zip(a.chunks_exact(Q8_0_BYTES))
    {
        let (da, qa) = q8_0(ab);
        let v = with_high_bits(nibbles32(&wb[6..22]), u32_at(wb, 2)).map(|q| q as i8 - 16);
        sum += (f16_at(wb, 0) * da) * idot(&v, qa) as f32;
    }
    sum
}

pub(super) fn vec_dot_q5_1(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (wb, ab) in w
        .chunks_exact(GgmlType::Q5_1.block_bytes())
        .zip(a.chunks_exact(Q8_1_BYTES))
    {
        let (da, sa, qa) = q8_1(ab);
        let v = with_high_bits(nibbles32(&wb[8..24]), u32_at(wb, 4)).map(|q| q as i8);
        sum += (f16_at(wb, 0) * da) * idot(&v, qa) as f32 + f16_at(wb, 2) * sa;
    }
    sum
}

pub(super) fn vec_dot_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (wb, ab) in w
        .chunks_exact(GgmlType::Q8_0.block_bytes())
        .zip(a.chunks_exact(Q8_0_BYTES))
    {
        let (da, qa) = q8_0(ab);
        let sumi: i32 = wb[2..34]
            .iter()
            .zip(qa)
            .map(|(&x, &y)| i32::from(x as i8) * i32::from(y as i8))
            .sum();
        sum += (f16_at(wb, 0) * da) * sumi as f32;
    }
    sum
}

pub(super) fn vec_dot_iq4_nl(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (wb, ab) in w
        .chunks_exact(GgmlType::IQ4_NL.block_bytes())
        .zip(a.chunks_exact(Q8_0_BYTES))
    {
        let (da, qa) = q8_0(ab);
        let v = nibbles32(&wb[2..18]).map(|q| KVALUES_IQ4NL[usize::from(q)]);
        sum += (f16_at(wb, 0) * da) * idot(&v, qa) as f32;
    }
    sum
}

pub(super) fn vec_dot_mxfp4(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (wb, ab) in w
        .chunks_exact(GgmlType::MXFP4.block_bytes())
        .zip(a.chunks_exact(Q8_0_BYTES))
    {
        let (da, qa) = q8_0(ab);
        let v = nibbles32(&wb[1..17]).map(|q| KVALUES_FP4[usize::from(q)]);
        sum += (e8m0_half(wb[0]) * da) * idot(&v, qa) as f32;
    }
    sum
}

/// `Σ_j scales[j] · Σ_{e in sub-block j} v[e]·a[e]` with sub-blocks of `len`.
#[inline]
fn scaled_idot(v: &[i8; 256], a: &[u8], scales: &[i32], len: usize) -> i32 {
    v.chunks_exact(len)
        .zip(a.chunks_exact(len))
        .zip(scales)
        .map(|((v, a), &s)| s * idot(v, a))
        .sum()
}

pub(super) fn vec_dot_q2_k(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (wb, ab) in w
        .chunks_exact(GgmlType::Q2_K.block_bytes())
        .zip(a.chunks_exact(Q8_K_BYTES))
    {
        let (da, qa, bsums) = q8_k(ab);
        let sc = &wb[0..16];
        let qs = &wb[16..80];
        let v: [i8; 256] = std::array::from_fn(|e| crumb(qs, e) as i8);
        let scales: [i32; 16] = std::array::from_fn(|j| i32::from(sc[j] & 0xF));
        let sumi = scaled_idot(&v, qa, &scales, 16);
        let summ: i32 = sc
            .iter()
            .zip(bsums)
            .map(|(&s, b)| i32::from(s >> 4) * b)
            .sum();
        sum += k_block(da, f16_at(wb, 80), sumi, Some((f16_at(wb, 82), summ)));
    }
    sum
}

pub(super) fn vec_dot_q3_k(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (wb, ab) in w
        .chunks_exact(GgmlType::Q3_K.block_bytes())
        .zip(a.chunks_exact(Q8_K_BYTES))
    {
        let (da, qa, _) = q8_k(ab);
        let hmask = &wb[0..32];
        let qs = &wb[32..96];
        let v: [i8; 256] = std::array::from_fn(|e| {
            let high_set = (hmask[e % 32] >> (e / 32)) & 1 != 0;
            crumb(qs, e) as i8 - if high_set { 0 } else { 4 }
        });
        let sumi = scaled_idot(&v, qa, &q3_k_scales(&wb[96..108]).map(i32::from), 16);
        sum += k_block(da, f16_at(wb, 108), sumi, None);
    }
    sum
}

/// Q4_K/Q5_K super-block: `(d·d_a)·Σ sc_j·dot_j − (dmin·d_a)·Σ mn_j·bsum_j`.
#[inline]
fn k4_block_sum(v: &[i8; 256], wb: &[u8], da: f32, qa: &[u8], bsums: &[i32; 16]) -> f32 {
    let scales_bytes = &wb[4..16];
    let mut scales = [0i32; 8];
    let mut summ = 0i32;
    for (j, s) in scales.iter_mut().enumerate() {
        let (sc, mn) = scale_min_k4(j, scales_bytes);
        *s = i32::from(sc);
        summ += i32::from(mn) * (bsums[2 * j] + bsums[2 * j + 1]);
    }
    let sumi = scaled_idot(v, qa, &scales, 32);
    k_block(da, f16_at(wb, 0), sumi, Some((f16_at(wb, 2), summ)))
}

/// A K-quant block's term of a dot product from its exact integer sums:
/// `(d_a·d)·Σ scale·q·a`, less `(d_a·d_min)·Σ min·bsum` where the format
/// has mins. Every instruction set's K-quant dot adds its blocks' terms
/// through this, in block order, so each gives the reference's bits.
#[inline(always)]
pub(super) fn k_block(da: f32, d: f32, sumi: i32, min: Option<(f32, i32)>) -> f32 {
    let scaled = (da * d) * sumi as f32;
    match min {
        Some((dmin, summ)) => scaled - (da * dmin) * summ as f32,
        None => scaled,
    }
}

pub(super) fn vec_dot_q4_k(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (wb, ab) in w
        .chunks_exact(GgmlType::Q4_K.block_bytes())
        .zip(a.chunks_exact(Q8_K_BYTES))
    {
        let (da, qa, bsums) = q8_k(ab);
        let qs = &wb[16..144];
        let v: [i8; 256] = std::array::from_fn(|e| nibble256(qs, e) as i8);
        sum += k4_block_sum(&v, wb, da, qa, &bsums);
    }
    sum
}

pub(super) fn vec_dot_q5_k(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (wb, ab) in w
        .chunks_exact(GgmlType::Q5_K.block_bytes())
        .zip(a.chunks_exact(Q8_K_BYTES))
    {
        let (da, qa, bsums) = q8_k(ab);
        let qh = &wb[16..48];
        let qs = &wb[48..176];
        let v: [i8; 256] = std::array::from_fn(|e| {
            let high = (qh[e % 32] >> (e / 32)) & 1;
            (nibble256(qs, e) + 16 * high) as i8
        });
        sum += k4_block_sum(&v, wb, da, qa, &bsums);
    }
    sum
}

pub(super) fn vec_dot_q6_k(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (wb, ab) in w
        .chunks_exact(GgmlType::Q6_K.block_bytes())
        .zip(a.chunks_exact(Q8_K_BYTES))
    {
        let (da, qa, _) = q8_k(ab);
        let ql = &wb[0..128];
        let qh = &wb[128..192];
        let v: [i8; 256] = std::array::from_fn(|e| {
            let (half, r) = (e / 128, e % 128);
            let (quad, l) = (r / 32, r % 32);
            let byte = ql[64 * half + 32 * (quad % 2) + l];
            let low = if quad < 2 { byte & 0xF } else { byte >> 4 };
            let high = (qh[32 * half + l] >> (2 * quad)) & 3;
            (low | (high << 4)) as i8 - 32
        });
        let scales: [i32; 16] = std::array::from_fn(|j| i32::from(wb[192 + j] as i8));
        sum += k_block(da, f16_at(wb, 208), scaled_idot(&v, qa, &scales, 16), None);
    }
    sum
}

pub(super) fn vec_dot_iq4_xs(w: &[u8], a: &[u8]) -> f32 {
    let mut sum = 0f32;
    for (wb, ab) in w
        .chunks_exact(GgmlType::IQ4_XS.block_bytes())
        .zip(a.chunks_exact(Q8_K_BYTES))
    {
        let (da, qa, _) = q8_k(ab);
        let qs = &wb[8..136];
        let mut v = [0i8; 256];
        for (sub, q) in v.chunks_exact_mut(32).zip(qs.chunks_exact(16)) {
            for (j, &b) in q.iter().enumerate() {
                sub[j] = KVALUES_IQ4NL[usize::from(b & 0xF)];
                sub[j + 16] = KVALUES_IQ4NL[usize::from(b >> 4)];
            }
        }
        let scales: [i32; 8] = std::array::from_fn(|j| iq4_xs_scale(wb, j));
        sum += k_block(da, f16_at(wb, 0), scaled_idot(&v, qa, &scales, 32), None);
    }
    sum
}
