//! Scalar reference quantizers, one block at a time.
//!
//! Each function reproduces ggml's `quantize_row_<type>_ref` byte for byte.
//! That means doing the arithmetic in f32 in the same order as the C code,
//! and copying what C's casts do, including out-of-range values. The float
//! to integer casts are modelled on x86-64, where an unrepresentable value
//! becomes `i32::MIN` before it is narrowed.

use half::f16;

use crate::blocks::{q3_k_scales, scale_min_k4};

/// Super-block size of the K-quants.
const QK_K: usize = 256;

/// Below this, a group counts as all zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// Round to nearest, ties to even, by adding 1.5 * 2^23 and reading the
/// mantissa. Done with bits rather than `round_ties_even` so that inputs
/// outside the trick's range give the same garbage as C.
#[inline]
fn nearest_int(fval: f32) -> i32 {
    let val = fval + 12_582_912.0;
    (val.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// C's `(int)f` on x86-64: truncation, with NaN and out-of-range values
/// giving `i32::MIN`. Narrower C casts then keep the low bits.
#[inline]
fn trunc_i32(f: f32) -> i32 {
    if (-2_147_483_648.0..2_147_483_648.0).contains(&f) {
        f as i32
    } else {
        i32::MIN
    }
}

/// C's `MAX(a, b)` macro: `a > b ? a : b`.
#[inline]
fn c_max(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

#[inline]
fn put_f16(b: &mut [u8], off: usize, v: f32) {
    b[off..off + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
}

#[inline]
fn get_f16(b: &[u8], off: usize) -> f32 {
    f16::from_le_bytes([b[off], b[off + 1]]).to_f32()
}

/// Largest-magnitude element, keeping its sign; the first one wins ties.
/// ggml writes this loop both as `amax < |v|` and `|v| > amax`: the same.
#[inline]
fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    (amax, max)
}

#[inline]
fn min_max(x: &[f32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

#[inline]
fn inverse_or_zero(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// Q8_0: f16 `d`, 32 × i8.
pub(crate) fn quant_block_q8_0(x: &[f32], b: &mut [u8]) {
    debug_assert_eq!(x.len(), 32);
    debug_assert_eq!(b.len(), 34);
    let amax = x.iter().fold(0.0f32, |a, &v| c_max(a, v.abs()));
    let d = amax / 127.0;
    let id = inverse_or_zero(d);
    put_f16(b, 0, d);
    for (q, &v) in b[2..34].iter_mut().zip(x) {
        *q = trunc_i32((v * id).round()) as u8;
    }
}

/// Q8_1: f16 `d`, f16 `s = d * sum(q)`, 32 × i8.
pub(crate) fn quant_block_q8_1(x: &[f32], b: &mut [u8]) {
    debug_assert_eq!(x.len(), 32);
    debug_assert_eq!(b.len(), 36);
    let amax = x.iter().fold(0.0f32, |a, &v| c_max(a, v.abs()));
    let d = amax / 127.0;
    let id = inverse_or_zero(d);
    put_f16(b, 0, d);
    let mut sum = 0i32;
    for (q, &v) in b[4..36].iter_mut().zip(x) {
        let qi = trunc_i32((v * id).round()) as i8;
        *q = qi as u8;
        sum += i32::from(qi);
    }
    put_f16(b, 2, sum as f32 * d);
}

/// Q4_0: f16 `d`, 16 bytes of nibbles (element `j` low, `j + 16` high).
pub(crate) fn quant_block_q4_0(x: &[f32], b: &mut [u8]) {
    debug_assert_eq!(x.len(), 32);
    debug_assert_eq!(b.len(), 18);
    let (_, max) = signed_absmax(x);
    let d = max / -8.0;
    let id = inverse_or_zero(d);
    put_f16(b, 0, d);
    // `MIN(15, (int8_t)(v + 8.5f))`, compared as int, stored as u8.
    let q = |v: f32| (trunc_i32(v * id + 8.5) as i8 as i32).min(15) as u8;
    for j in 0..16 {
        b[2 + j] = q(x[j]) | (q(x[16 + j]) << 4);
    }
}

/// Q4_1: f16 `d`, f16 `m`, 16 bytes of nibbles.
pub(crate) fn quant_block_q4_1(x: &[f32], b: &mut [u8]) {
    debug_assert_eq!(x.len(), 32);
    debug_assert_eq!(b.len(), 20);
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = inverse_or_zero(d);
    put_f16(b, 0, d);
    put_f16(b, 2, min);
    let q = |v: f32| (trunc_i32((v - min) * id + 0.5) as i8 as i32).min(15) as u8;
    for j in 0..16 {
        b[4 + j] = q(x[j]) | (q(x[16 + j]) << 4);
    }
}

/// Packs 32 five-bit values into `qh` (bit `j` = high bit of element `j`)
/// and `qs` nibbles.
fn pack_q5(qv: &[u8; 32], qh: &mut [u8], qs: &mut [u8]) {
    let mut h = 0u32;
    for j in 0..16 {
        let (a, c) = (qv[j], qv[16 + j]);
        qs[j] = (a & 0x0f) | ((c & 0x0f) << 4);
        h |= u32::from((a & 0x10) >> 4) << j;
        h |= u32::from((c & 0x10) >> 4) << (j + 16);
    }
    qh.copy_from_slice(&h.to_le_bytes());
}

/// Q5_0: f16 `d`, u32 `qh`, 16 bytes of nibbles.
pub(crate) fn quant_block_q5_0(x: &[f32], b: &mut [u8]) {
    debug_assert_eq!(x.len(), 32);
    debug_assert_eq!(b.len(), 22);
    let (_, max) = signed_absmax(x);
    let d = max / -16.0;
    let id = inverse_or_zero(d);
    put_f16(b, 0, d);
    let mut qv = [0u8; 32];
    for (q, &v) in qv.iter_mut().zip(x) {
        *q = (trunc_i32(v * id + 16.5) as i8 as i32).min(31) as u8;
    }
    let (qh, qs) = b[2..].split_at_mut(4);
    pack_q5(&qv, qh, qs);
}

/// Q5_1: f16 `d`, f16 `m`, u32 `qh`, 16 bytes of nibbles.
pub(crate) fn quant_block_q5_1(x: &[f32], b: &mut [u8]) {
    debug_assert_eq!(x.len(), 32);
    debug_assert_eq!(b.len(), 24);
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = inverse_or_zero(d);
    put_f16(b, 0, d);
    put_f16(b, 2, min);
    let mut qv = [0u8; 32];
    for (q, &v) in qv.iter_mut().zip(x) {
        // No clamp here in ggml: a plain `(uint8_t)` cast.
        *q = trunc_i32((v - min) * id + 0.5) as u8;
    }
    let (qh, qs) = b[4..].split_at_mut(4);
    pack_q5(&qv, qh, qs);
}

/// Q8_K: f32 `d`, 256 × i8, 16 × i16 sums of each run of 16.
pub(crate) fn quant_block_q8_k(x: &[f32], b: &mut [u8]) {
    debug_assert_eq!(x.len(), QK_K);
    debug_assert_eq!(b.len(), 292);
    let (amax, max) = signed_absmax(x);
    if amax == 0.0 {
        // ggml leaves `bsums` untouched here; zero is what they would be.
        b.fill(0);
        return;
    }
    let iscale = -127.0 / max;
    let mut qs = [0i8; QK_K];
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = nearest_int(iscale * v).min(127) as i8;
    }
    b[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    for (o, &q) in b[4..4 + QK_K].iter_mut().zip(&qs) {
        *o = q as u8;
    }
    for (j, run) in qs.chunks_exact(16).enumerate() {
        let sum: i32 = run.iter().map(|&q| i32::from(q)).sum();
        let off = 4 + QK_K + 2 * j;
        b[off..off + 2].copy_from_slice(&(sum as i16).to_le_bytes());
    }
}

/// Symmetric quantization of a group to `[-nmax, nmax)`, with an optional
/// search over 18 nearby scales. `rmse_type` picks the error weights as in
/// ggml (0: no search, 1: x², 2: 1, 3: |x|, else √|x|; negative: stop after
/// the first fit). Stores `l + nmax` in `l_out` and returns the scale.
fn make_qx_quants(
    nmax: i32,
    x: &[f32],
    l_out: &mut [i8],
    rmse_type: i32,
    qw: Option<&[f32]>,
) -> f32 {
    let n = x.len();
    let (amax, max) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let nmaxf = nmax as f32;
    let mut iscale = -nmaxf / max;
    let clamp = |l: i32| l.clamp(-nmax, nmax - 1);
    if rmse_type == 0 {
        for (o, &v) in l_out.iter_mut().zip(x) {
            *o = (nmax + clamp(nearest_int(iscale * v))) as i8;
        }
        return 1.0 / iscale;
    }
    let return_early = rmse_type < 0;
    let rmse_type = rmse_type.abs();
    let weight = |i: usize| -> f32 {
        let xi = x[i];
        match qw {
            Some(w) => w[i],
            None => match rmse_type {
                1 => xi * xi,
                2 => 1.0,
                3 => xi.abs(),
                _ => xi.abs().sqrt(),
            },
        }
    };
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..n {
        let l = clamp(nearest_int(iscale * x[i]));
        l_out[i] = (l + nmax) as i8;
        let w = weight(i);
        let lf = l as f32;
        sumlx += w * x[i] * lf;
        suml2 += w * lf * lf;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    if return_early {
        return if suml2 > 0.0 {
            0.5 * (scale + 1.0 / iscale)
        } else {
            1.0 / iscale
        };
    }
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmaxf + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for (i, &xi) in x.iter().enumerate() {
            let lf = clamp(nearest_int(iscale * xi)) as f32;
            let w = weight(i);
            sumlx += w * xi * lf;
            suml2 += w * lf * lf;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (o, &v) in l_out.iter_mut().zip(x) {
                *o = (nmax + clamp(nearest_int(iscale * v))) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Symmetric 3-bit style quantization with coordinate-descent refinement
/// (weights x²). Stores `l + nmax` (or zeros for an all-zero group).
fn make_q3_quants(nmax: i32, x: &[f32], l_out: &mut [i8], do_rmse: bool) -> f32 {
    let n = x.len();
    let (amax, max) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let clamp = |l: i32| l.clamp(-nmax, nmax - 1);
    if do_rmse {
        let mut sumlx = 0.0f32;
        let mut suml2 = 0.0f32;
        for i in 0..n {
            let l = clamp(nearest_int(iscale * x[i]));
            l_out[i] = l as i8;
            let w = x[i] * x[i];
            let lf = l as f32;
            sumlx += w * x[i] * lf;
            suml2 += w * lf * lf;
        }
        for _ in 0..5 {
            let mut n_changed = 0;
            for i in 0..n {
                let w = x[i] * x[i];
                let li = f32::from(l_out[i]);
                let mut slx = sumlx - w * x[i] * li;
                if slx > 0.0 {
                    let mut sl2 = suml2 - w * li * li;
                    let new_l = clamp(nearest_int(x[i] * sl2 / slx));
                    if new_l != i32::from(l_out[i]) {
                        let nf = new_l as f32;
                        slx += w * x[i] * nf;
                        sl2 += w * nf * nf;
                        if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                            l_out[i] = new_l as i8;
                            sumlx = slx;
                            suml2 = sl2;
                            n_changed += 1;
                        }
                    }
                }
            }
            if n_changed == 0 {
                break;
            }
        }
        for o in l_out[..n].iter_mut() {
            *o = (i32::from(*o) + nmax) as i8;
        }
        return if suml2 > 0.0 { sumlx / suml2 } else { 0.0 };
    }
    for (o, &v) in l_out.iter_mut().zip(x) {
        *o = (clamp(nearest_int(iscale * v)) + nmax) as i8;
    }
    1.0 / iscale
}

/// Asymmetric quantization of a group to `[0, nmax]` with a weighted
/// least-squares search over `nstep + 1` candidate scales. Returns
/// `(scale, the_min)` where `x ≈ scale * l - the_min`.
#[allow(clippy::too_many_arguments)]
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out[..n].fill(0);
        return (0.0, -min);
    }
    let nmaxf = nmax as f32;
    let err = |d: f32| if use_mad { d.abs() } else { d * d };
    let mut iscale = nmaxf / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l_out[i] = l as u8;
        let diff = scale * l as f32 + min - x[i];
        best_error += weights[i] * err(diff);
    }
    if nstep < 1 {
        return (scale, -min);
    }
    let mut laux = [0u8; 32];
    let laux = &mut laux[..n];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmaxf) / (max - min);
        let mut sum_l = 0.0f32;
        let mut sum_l2 = 0.0f32;
        let mut sum_xl = 0.0f32;
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = l as u8;
            let w = weights[i];
            let lf = l as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let big_d = sum_w * sum_l2 - sum_l * sum_l;
        if big_d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / big_d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / big_d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * f32::from(laux[i]) + this_min - x[i];
                cur_error += weights[i] * err(diff);
            }
            if cur_error < best_error {
                l_out[..n].copy_from_slice(laux);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// The part shared by Q4_K and Q5_K: fits eight 32-element sub-blocks,
/// writes `d`, `dmin` and the 12 scale bytes into `head` (16 bytes), and
/// returns the final quants in `[0, nmax]`.
fn quant_k_scale_min(x: &[f32], head: &mut [u8], nmax: i32, rmin: f32, nstep: i32) -> [u8; QK_K] {
    let mut l = [0u8; QK_K];
    let mut scales = [0.0f32; 8];
    let mut mins = [0.0f32; 8];
    let mut weights = [0.0f32; 32];
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let (s, m) = make_qkx2_quants(
            nmax,
            xs,
            &weights,
            &mut l[32 * j..32 * j + 32],
            rmin,
            0.1,
            nstep,
            false,
        );
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }

    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let sc = &mut head[4..16];
    sc.fill(0);
    for j in 0..8 {
        // `uint8_t` truncation first, then the clamp, as in ggml.
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (ls & 0xf) | ((lm & 0xf) << 4);
            sc[j - 4] |= (ls >> 4) << 6;
            sc[j] |= (lm >> 4) << 6;
        }
    }
    put_f16(head, 0, max_scale / 63.0);
    put_f16(head, 2, max_min / 63.0);

    let d_all = get_f16(head, 0);
    let dmin_all = get_f16(head, 2);
    for j in 0..8 {
        let (s, m) = scale_min_k4(j, &head[4..16]);
        let d = d_all * f32::from(s);
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * f32::from(m);
        for ii in 0..32 {
            let q = nearest_int((x[32 * j + ii] + dm) / d).clamp(0, nmax);
            l[32 * j + ii] = q as u8;
        }
    }
    l
}

/// Q4_K: f16 `d`, f16 `dmin`, 12 scale bytes, 128 bytes of nibbles.
pub(crate) fn quant_block_q4_k(x: &[f32], b: &mut [u8]) {
    debug_assert_eq!(x.len(), QK_K);
    debug_assert_eq!(b.len(), 144);
    let l = quant_k_scale_min(x, &mut b[..16], 15, -1.0, 20);
    let qs = &mut b[16..144];
    for (j, chunk) in l.chunks_exact(64).enumerate() {
        for i in 0..32 {
            qs[32 * j + i] = chunk[i] | (chunk[i + 32] << 4);
        }
    }
}

/// Q5_K: f16 `d`, f16 `dmin`, 12 scale bytes, 32 bytes `qh`, 128 bytes `qs`.
pub(crate) fn quant_block_q5_k(x: &[f32], b: &mut [u8]) {
    debug_assert_eq!(x.len(), QK_K);
    debug_assert_eq!(b.len(), 176);
    let l = quant_k_scale_min(x, &mut b[..16], 31, -0.5, 15);
    let (qh, ql) = b[16..176].split_at_mut(32);
    qh.fill(0);
    let (mut m1, mut m2) = (1u8, 2u8);
    for (n, chunk) in l.chunks_exact(64).enumerate() {
        for j in 0..32 {
            let mut l1 = chunk[j];
            if l1 > 15 {
                l1 -= 16;
                qh[j] |= m1;
            }
            let mut l2 = chunk[j + 32];
            if l2 > 15 {
                l2 -= 16;
                qh[j] |= m2;
            }
            ql[32 * n + j] = l1 | (l2 << 4);
        }
        m1 <<= 2;
        m2 <<= 2;
    }
}

/// Q6_K: 128 bytes `ql`, 64 bytes `qh`, 16 × i8 scales, f16 `d`.
pub(crate) fn quant_block_q6_k(x: &[f32], b: &mut [u8]) {
    debug_assert_eq!(x.len(), QK_K);
    debug_assert_eq!(b.len(), 210);
    let mut l = [0i8; QK_K];
    let mut scales = [0.0f32; 16];
    let mut max_scale = 0.0f32;
    let mut max_abs_scale = 0.0f32;
    let groups = x.chunks_exact(16).zip(l.chunks_exact_mut(16));
    for ((xs, ls), out) in groups.zip(scales.iter_mut()) {
        let scale = make_qx_quants(32, xs, ls, 1, None);
        *out = scale;
        if scale.abs() > max_abs_scale {
            max_abs_scale = scale.abs();
            max_scale = scale;
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        b.fill(0);
        return;
    }

    let iscale = -128.0 / max_scale;
    put_f16(b, 208, 1.0 / iscale);
    for ib in 0..16 {
        b[192 + ib] = nearest_int(iscale * scales[ib]).min(127) as i8 as u8;
    }
    let d_all = get_f16(b, 208);
    for j in 0..16 {
        let d = d_all * f32::from(b[192 + j] as i8);
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let q = nearest_int(x[16 * j + ii] / d).clamp(-32, 31);
            l[16 * j + ii] = (q + 32) as i8;
        }
    }

    let (ql, qh) = b[..192].split_at_mut(128);
    for (h, chunk) in l.chunks_exact(128).enumerate() {
        let ql = &mut ql[64 * h..64 * h + 64];
        let qh = &mut qh[32 * h..32 * h + 32];
        for i in 0..32 {
            let v = |k: usize| chunk[i + 32 * k] as u8;
            ql[i] = (v(0) & 0xf) | ((v(2) & 0xf) << 4);
            ql[i + 32] = (v(1) & 0xf) | ((v(3) & 0xf) << 4);
            qh[i] = (v(0) >> 4) | ((v(1) >> 4) << 2) | ((v(2) >> 4) << 4) | ((v(3) >> 4) << 6);
        }
    }
}

/// Packs 2-bit values: byte `i` of each 32-byte run holds elements
/// `i`, `i + 32`, `i + 64`, `i + 96` of a 128-element half.
fn pack_2bit(l: &[u8; QK_K], qs: &mut [u8]) {
    for (h, chunk) in l.chunks_exact(128).enumerate() {
        for i in 0..32 {
            qs[32 * h + i] =
                chunk[i] | (chunk[i + 32] << 2) | (chunk[i + 64] << 4) | (chunk[i + 96] << 6);
        }
    }
}

/// Q2_K: 16 scale bytes (low nibble scale, high nibble min), 64 bytes of
/// 2-bit quants, f16 `d`, f16 `dmin`.
pub(crate) fn quant_block_q2_k(x: &[f32], b: &mut [u8]) {
    debug_assert_eq!(x.len(), QK_K);
    debug_assert_eq!(b.len(), 84);
    const Q4SCALE: f32 = 15.0;
    let mut l = [0u8; QK_K];
    let mut scales = [0.0f32; 16];
    let mut mins = [0.0f32; 16];
    let mut weights = [0.0f32; 16];
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for j in 0..16 {
        let xs = &x[16 * j..16 * j + 16];
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = v.abs();
        }
        let (s, m) = make_qkx2_quants(
            3,
            xs,
            &weights,
            &mut l[16 * j..16 * j + 16],
            -0.5,
            0.1,
            15,
            true,
        );
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }

    let sc = &mut b[..16];
    if max_scale > 0.0 {
        let iscale = Q4SCALE / max_scale;
        for (o, &s) in sc.iter_mut().zip(&scales) {
            *o = nearest_int(iscale * s) as u8;
        }
        put_f16(b, 80, max_scale / Q4SCALE);
    } else {
        sc.fill(0);
        put_f16(b, 80, 0.0);
    }
    if max_min > 0.0 {
        let iscale = Q4SCALE / max_min;
        for (o, &m) in b[..16].iter_mut().zip(&mins) {
            *o |= (nearest_int(iscale * m) << 4) as u8;
        }
        put_f16(b, 82, max_min / Q4SCALE);
    } else {
        put_f16(b, 82, 0.0);
    }

    let d_all = get_f16(b, 80);
    let dmin_all = get_f16(b, 82);
    for j in 0..16 {
        let d = d_all * f32::from(b[j] & 0xf);
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * f32::from(b[j] >> 4);
        for ii in 0..16 {
            let q = nearest_int((x[16 * j + ii] + dm) / d).clamp(0, 3);
            l[16 * j + ii] = q as u8;
        }
    }
    pack_2bit(&l, &mut b[16..80]);
}

/// Q3_K: 32 bytes `hmask`, 64 bytes of low 2 bits, 12 bytes of 6-bit
/// signed scales, f16 `d`.
pub(crate) fn quant_block_q3_k(x: &[f32], b: &mut [u8]) {
    debug_assert_eq!(x.len(), QK_K);
    debug_assert_eq!(b.len(), 110);
    let mut l = [0i8; QK_K];
    let mut scales = [0.0f32; 16];
    let mut max_scale = 0.0f32;
    let mut amax = 0.0f32;
    let groups = x.chunks_exact(16).zip(l.chunks_exact_mut(16));
    for ((xs, ls), out) in groups.zip(scales.iter_mut()) {
        let s = make_q3_quants(4, xs, ls, true);
        *out = s;
        if s.abs() > amax {
            amax = s.abs();
            max_scale = s;
        }
    }

    let sc = &mut b[96..108];
    sc.fill(0);
    if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        for j in 0..16 {
            // `int8_t` truncation, clamp, then the 6-bit offset form.
            let q = i32::from(nearest_int(iscale * scales[j]) as i8).clamp(-32, 31) + 32;
            let q = q as u8;
            if j < 8 {
                sc[j] = q & 0xf;
            } else {
                sc[j - 8] |= (q & 0xf) << 4;
            }
            sc[j % 4 + 8] |= (q >> 4) << (2 * (j / 4));
        }
        put_f16(b, 108, 1.0 / iscale);
    } else {
        put_f16(b, 108, 0.0);
    }

    let d_all = get_f16(b, 108);
    let scales = q3_k_scales(&b[96..108]);
    for (j, &s) in scales.iter().enumerate() {
        let d = d_all * f32::from(s);
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let q = nearest_int(x[16 * j + ii] / d).clamp(-4, 3);
            l[16 * j + ii] = (q + 4) as i8;
        }
    }

    let mut lu = [0u8; QK_K];
    let hmask = &mut b[..32];
    hmask.fill(0);
    for (j, (o, &v)) in lu.iter_mut().zip(&l).enumerate() {
        let mut v = v as u8;
        if v > 3 {
            hmask[j % 32] |= 1 << (j / 32);
            v -= 4;
        }
        *o = v;
    }
    pack_2bit(&lu, &mut b[32..96]);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16_at(b: &[u8], off: usize) -> f32 {
        get_f16(b, off)
    }

    #[test]
    fn nearest_int_ties_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(-0.5), 0);
        assert_eq!(nearest_int(-1.5), -2);
        assert_eq!(nearest_int(-2.6), -3);
        assert_eq!(nearest_int(127.0), 127);
    }

    #[test]
    fn q8_0_exact_integers() {
        let mut x = [0.0f32; 32];
        for (i, v) in x.iter_mut().enumerate() {
            *v = i as f32 * 4.0 - 64.0;
        }
        x[5] = 127.0;
        let mut b = [0xAAu8; 34];
        quant_block_q8_0(&x, &mut b);
        assert_eq!(f16_at(&b, 0), 1.0);
        for (i, &v) in x.iter().enumerate() {
            assert_eq!(b[2 + i] as i8 as f32, v, "element {i}");
        }
    }

    #[test]
    fn q8_0_rounds_half_away_from_zero() {
        let mut x = [0.0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -2.5;
        let mut b = [0u8; 34];
        quant_block_q8_0(&x, &mut b);
        assert_eq!(b[3] as i8, 3);
        assert_eq!(b[4] as i8, -3);
    }

    #[test]
    fn q8_1_sum_field() {
        let mut x = [0.0f32; 32];
        x[0] = 127.0;
        x[20] = -27.0;
        let mut b = [0u8; 36];
        quant_block_q8_1(&x, &mut b);
        assert_eq!(f16_at(&b, 0), 1.0);
        assert_eq!(f16_at(&b, 2), 100.0);
        assert_eq!(b[4 + 20] as i8, -27);
    }

    #[test]
    fn all_zero_gives_all_zero() {
        let x = [0.0f32; QK_K];
        type Quant = fn(&[f32], &mut [u8]);
        let cases: [(Quant, usize, usize); 12] = [
            (quant_block_q8_0, 32, 34),
            (quant_block_q8_1, 32, 36),
            (quant_block_q4_0, 32, 18),
            (quant_block_q4_1, 32, 20),
            (quant_block_q5_0, 32, 22),
            (quant_block_q5_1, 32, 24),
            (quant_block_q8_k, 256, 292),
            (quant_block_q4_k, 256, 144),
            (quant_block_q5_k, 256, 176),
            (quant_block_q6_k, 256, 210),
            (quant_block_q2_k, 256, 84),
            (quant_block_q3_k, 256, 110),
        ];
        for (k, (f, n, size)) in cases.into_iter().enumerate() {
            let mut b = vec![0x5Au8; size];
            f(&x[..n], &mut b);
            match k {
                // `0 / -8` is -0.0; the zero point sits at 8 (Q4_0) or 16 (Q5_0).
                2 => {
                    assert_eq!(&b[..2], &[0x00, 0x80], "q4_0 d");
                    assert!(b[2..].iter().all(|&v| v == 0x88), "q4_0");
                }
                4 => {
                    assert_eq!(&b[..2], &[0x00, 0x80], "q5_0 d");
                    assert_eq!(&b[2..6], &[0xff; 4], "q5_0 qh");
                    assert!(b[6..].iter().all(|&v| v == 0), "q5_0 qs");
                }
                _ => assert!(b.iter().all(|&v| v == 0), "case {k}: {b:?}"),
            }
        }
    }

    #[test]
    fn q4_0_extreme_is_nibble_zero() {
        let mut x = [0.0f32; 32];
        for (i, v) in x.iter_mut().enumerate() {
            *v = (i as f32 - 10.0) * 0.1;
        }
        x[17] = -4.0;
        let mut b = [0u8; 18];
        quant_block_q4_0(&x, &mut b);
        assert_eq!(f16_at(&b, 0), 0.5);
        assert_eq!(b[2 + 1] >> 4, 0);
        // Element 21 is 1.1: 1.1 * 2 + 8.5 = 10.7, truncated.
        assert_eq!(b[2 + 5] >> 4, 10);
    }

    #[test]
    fn q4_1_endpoints() {
        let mut x = [0.0f32; 32];
        for (i, v) in x.iter_mut().enumerate() {
            *v = i as f32 * 0.5;
        }
        let mut b = [0u8; 20];
        quant_block_q4_1(&x, &mut b);
        assert_eq!(f16_at(&b, 2), 0.0);
        assert_eq!(b[4] & 0xf, 0);
        assert_eq!(b[4 + 15] >> 4, 15);
    }

    #[test]
    fn q8_k_sums_and_scale() {
        let mut x = [0.0f32; QK_K];
        for (i, v) in x.iter_mut().enumerate() {
            *v = (i % 16) as f32 - 7.0;
        }
        x[3] = -127.0;
        let mut b = [0u8; 292];
        quant_block_q8_k(&x, &mut b);
        let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        assert_eq!(d, 1.0);
        let bsum0 = i16::from_le_bytes([b[260], b[261]]);
        let want: i32 = (0..16).map(|i| i - 7).sum::<i32>() - (3 - 7) - 127;
        assert_eq!(i32::from(bsum0), want);
        let bsum1 = i16::from_le_bytes([b[262], b[263]]);
        assert_eq!(bsum1, 8);
    }

    /// Dequantizes Q6_K element `e`, as ggml does.
    fn dq_q6_k(b: &[u8], e: usize) -> f32 {
        let d = f16_at(b, 208);
        let (h, r) = (e / 128, e % 128);
        let (k, i) = (r / 32, r % 32);
        let lo = b[64 * h + i + 32 * (k & 1)] >> (4 * (k >> 1)) & 0xf;
        let hi = (b[128 + 32 * h + i] >> (2 * k)) & 3;
        let q = i32::from(lo | (hi << 4)) - 32;
        d * f32::from(b[192 + e / 16] as i8) * q as f32
    }

    #[test]
    fn k_quants_round_trip_is_close() {
        let mut x = [0.0f32; QK_K];
        for (i, v) in x.iter_mut().enumerate() {
            *v = ((i * 37 % 101) as f32 - 50.0) / 50.0;
        }
        let mut b = [0u8; 210];
        quant_block_q6_k(&x, &mut b);
        for (e, &v) in x.iter().enumerate() {
            assert!((dq_q6_k(&b, e) - v).abs() < 0.03, "q6_k element {e}");
        }
        let mut b = [0u8; 144];
        quant_block_q4_k(&x, &mut b);
        let d = f16_at(&b, 0);
        let dmin = f16_at(&b, 2);
        for (e, &v) in x.iter().enumerate() {
            let (s, m) = scale_min_k4(e / 32, &b[4..16]);
            let (c, r) = (e / 64, e % 64);
            let q = (b[16 + 32 * c + r % 32] >> (4 * (r / 32))) & 0xf;
            let y = d * f32::from(s) * f32::from(q) - dmin * f32::from(m);
            assert!((y - v).abs() < 0.12, "q4_k element {e}: {y} vs {v}");
        }
    }
}
