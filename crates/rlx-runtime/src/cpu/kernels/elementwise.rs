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
