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

/// `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, PyTorch's
/// `gelu(approximate="tanh")`, computed as the equal `x / (1 + e^(−2u))`:
/// accurate in relative terms where `1 + tanh` nearly cancels, and built
/// from arithmetic only so loops over it vectorise.
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    let inner = SQRT_2_OVER_PI * (x + 0.044715 * x * x * x);
    x / (1.0 + exp_f32(-2.0 * inner))
}

/// `e^x` to about 1 ulp over the f32 range (inputs clamped to where the
/// result is a normal number), without a libm call: `2^k · p(r)` with
/// `x = k·ln 2 + r`, `|r| ≤ ln 2 / 2`, and a degree-7 Taylor polynomial.
/// Integer work is done on float bits (no saturating casts) so loops over it
/// vectorise.
#[inline]
pub fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Adding 1.5·2^23 rounds to an integer held in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let kf = x * LOG2E + ROUND;
    let k = kf - ROUND;
    let r = (x - k * LN2_HI) - k * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0
                    + r * (1.0 / 24.0
                        + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    let ki = kf.to_bits().wrapping_sub(ROUND.to_bits());
    let scale = f32::from_bits(ki.wrapping_add(127) << 23);
    p * scale
}

/// Defines `pub fn name(isa, args…)` that runs a loop body compiled for
/// `isa` (lowered to what this CPU has), so plain Rust loops vectorise at
/// that width (on ARM, NEON is the baseline the body is compiled for). The result is the same at every width: the loops have no
/// reductions and Rust does not contract `a·b + c`.
macro_rules! widest {
    ($(#[$m:meta])* $name:ident($($arg:ident: $ty:ty),*) $body:block) => {
        $(#[$m])*
        pub fn $name(isa: crate::cpu::features::Isa, $($arg: $ty),*) {
            #[inline(always)]
            fn body($($arg: $ty),*) $body
            #[cfg(target_arch = "x86_64")]
            {
                use crate::cpu::features::Isa;
                #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
                unsafe fn avx512($($arg: $ty),*) {
                    body($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) {
                    body($($arg),*)
                }
                match isa.min(Isa::detect()) {
                    // SAFETY: lowered to what `detect` says the CPU has.
                    Isa::Avx512 => return unsafe { avx512($($arg),*) },
                    // SAFETY: as above.
                    Isa::Avx2 => return unsafe { avx2($($arg),*) },
                    Isa::Scalar | Isa::Neon => {}
                }
            }
            #[cfg(not(target_arch = "x86_64"))]
            let _ = isa;
            body($($arg),*)
        }
    };
}
pub(crate) use widest;

widest!(
    /// [`gelu_tanh`] of every element.
    gelu(x: &[f32], out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = gelu_tanh(v);
    }
});

widest!(
    /// `gelu(gate) · up`.
    geglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = gelu_tanh(g) * u;
    }
});

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_f32_is_within_two_ulp_of_libm_over_the_range() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let want = (x as f64).exp();
            let got = exp_f32(x) as f64;
            worst = worst.max(((got - want) / want).abs());
            x += 0.0137;
        }
        // f32 epsilon is 1.19e-7; two ulp is the budget.
        assert!(worst < 2.4e-7, "worst relative error {worst}");
    }

    #[test]
    fn gelu_matches_the_tanh_formula_in_f64() {
        for i in -2000..2000 {
            let x = i as f32 * 0.005;
            let xd = x as f64;
            let want = 0.5
                * xd
                * (1.0
                    + ((2.0 / std::f64::consts::PI).sqrt() * (xd + 0.044715 * xd.powi(3))).tanh());
            let got = gelu_tanh(x) as f64;
            // The f32 rounding of the cubic inner term is amplified where the
            // result is a small tail value; 2e-6 relative covers it.
            assert!(
                (got - want).abs() <= 2e-6 * want.abs() + 1e-12,
                "x={x}: {got} vs {want}"
            );
        }
    }
}
