//! Elementwise ops with trailing-shape broadcast.

/// `out[i] = a[i] + b[i % b.len()]`.
pub fn add(a: &[f32], b: &[f32], out: &mut [f32]) {
    for (row_a, row_o) in a.chunks(b.len()).zip(out.chunks_mut(b.len())) {
        for ((o, &x), &y) in row_o.iter_mut().zip(row_a).zip(b) {
            *o = x + y;
        }
    }
}

/// `out[i] = a[i] · b[i % b.len()]`.
pub fn mul(a: &[f32], b: &[f32], out: &mut [f32]) {
    for (row_a, row_o) in a.chunks(b.len()).zip(out.chunks_mut(b.len())) {
        for ((o, &x), &y) in row_o.iter_mut().zip(row_a).zip(b) {
            *o = x * y;
        }
    }
}

pub fn scale(x: &[f32], factor: f32, out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = v * factor;
    }
}

/// √(2/π) as f32, the constant of the tanh GELU approximation.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, PyTorch's `gelu(approximate="tanh")`.
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    let inner = SQRT_2_OVER_PI * (x + 0.044715 * x * x * x);
    0.5 * x * (1.0 + inner.tanh())
}

pub fn gelu(x: &[f32], out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = gelu_tanh(v);
    }
}

/// `gelu(gate) · up`.
pub fn geglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = gelu_tanh(g) * u;
    }
}

/// `cap · tanh(x / cap)`.
pub fn softcap(x: &[f32], cap: f32, out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = (v / cap).tanh() * cap;
    }
}

/// `out[i] = f(a[i], b[broadcast(i)])` for NumPy-style broadcasting of `b`
/// (dims aligned from the last axis, each equal to `a`'s or 1).
pub fn broadcast_binary(
    a: &[f32],
    a_dims: &[usize],
    b: &[f32],
    b_dims: &[usize],
    out: &mut [f32],
    f: impl Fn(f32, f32) -> f32,
) {
    let ra = a_dims.len();
    let off = ra - b_dims.len();
    // Strides of b, laid over a's axes; 0 where b repeats.
    let mut strides = vec![0usize; ra];
    let mut s = 1;
    for ax in (0..b_dims.len()).rev() {
        if b_dims[ax] != 1 {
            strides[ax + off] = s;
        }
        s *= b_dims[ax];
    }
    let mut idx = vec![0usize; ra];
    for (i, o) in out.iter_mut().enumerate() {
        let bi: usize = idx.iter().zip(&strides).map(|(i, s)| i * s).sum();
        *o = f(a[i], b[bi]);
        for ax in (0..ra).rev() {
            idx[ax] += 1;
            if idx[ax] < a_dims[ax] {
                break;
            }
            idx[ax] = 0;
        }
    }
}

/// Per row of `d`: `x · rms(target) / sqrt(max(mean(x²), floor))`.
pub fn match_rms(x: &[f32], target: &[f32], d: usize, floor: f32, out: &mut [f32]) {
    for ((xr, tr), o) in x
        .chunks_exact(d)
        .zip(target.chunks_exact(d))
        .zip(out.chunks_exact_mut(d))
    {
        let ms = |r: &[f32]| {
            (r.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>() / d as f64) as f32
        };
        let want = ms(tr).sqrt();
        let have = ms(xr).max(floor).sqrt();
        for (o, &v) in o.iter_mut().zip(xr) {
            *o = v * want / have;
        }
    }
}

/// Per row of `d`: `relu(x − (mean + k · std))` with the population std.
pub fn gaussian_topk(x: &[f32], d: usize, k: f32, out: &mut [f32]) {
    for (xr, o) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let mean = (xr.iter().map(|&v| f64::from(v)).sum::<f64>() / d as f64) as f32;
        let var = xr
            .iter()
            .map(|&v| (f64::from(v) - f64::from(mean)).powi(2))
            .sum::<f64>()
            / d as f64;
        let cutoff = mean + (var.sqrt() as f32) * k;
        for (o, &v) in o.iter_mut().zip(xr) {
            *o = (v - cutoff).max(0.0);
        }
    }
}

/// `out[t] = a[t] · b[t]` for `a` `[n, p, q]`, `b` `[n, q, r]`.
pub fn batch_matmul(a: &[f32], b: &[f32], n: usize, p: usize, q: usize, r: usize, out: &mut [f32]) {
    for t in 0..n {
        let (at, bt) = (&a[t * p * q..][..p * q], &b[t * q * r..][..q * r]);
        let ot = &mut out[t * p * r..][..p * r];
        for i in 0..p {
            for j in 0..r {
                ot[i * r + j] = (0..q).map(|k| at[i * q + k] * bt[k * r + j]).sum();
            }
        }
    }
}
