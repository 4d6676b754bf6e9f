//! Quantize → dequantize round trips stay within per-type error bounds, for
//! random inputs of any scale.
//!
//! Legacy formats have a per-element bound from their step size. K-quants fit
//! scales and mins by least squares, so their bound is on the block's
//! relative RMS error instead; the limits are about 1.5× the worst seen in
//! 2,000 draws of these generators (Q2_K 0.433, Q3_K 0.265, Q4_K 0.118,
//! Q5_K 0.057, Q6_K 0.042; printed by `worst_observed_k_quant_errors` with
//! `--nocapture`) and far below what a wrong layout gives (order 1). Q6_K is
//! close to Q5_K here because a 20× outlier coarsens its 8-bit sub-block
//! scales.

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use rlx_gguf::{dequantize_to_vec, quantize_to_vec, GgmlType};

/// Largest |error| allowed for element values of a block with extreme
/// magnitude `amax` (and range `range` = max − min).
fn element_bound(ty: GgmlType, amax: f32, range: f32) -> Option<f32> {
    // f16 scales carry an 11-bit mantissa: a relative error of 2^-11 on d
    // moves the largest code (up to 127 steps) by that fraction of amax.
    let f16_slack = amax * 1e-3 + range * 1e-3;
    Some(match ty {
        GgmlType::Q8_0 | GgmlType::Q8_1 => amax / 127.0 * 0.5 + f16_slack,
        GgmlType::Q8_K => amax / 127.0 * 0.5 * 1.0001,
        // Extreme maps to -8·d; the other side clamps at +7·d.
        GgmlType::Q4_0 => amax / 8.0 + f16_slack,
        GgmlType::Q5_0 => amax / 16.0 + f16_slack,
        GgmlType::Q4_1 => range / 15.0 * 0.5 + f16_slack,
        GgmlType::Q5_1 => range / 31.0 * 0.5 + f16_slack,
        _ => return None,
    })
}

/// Largest relative RMS error (‖x − x̂‖ / ‖x‖ over a super-block).
fn rms_bound(ty: GgmlType) -> f32 {
    match ty {
        GgmlType::Q6_K => 0.065,
        GgmlType::Q5_K => 0.09,
        GgmlType::Q4_K => 0.18,
        GgmlType::Q3_K => 0.40,
        GgmlType::Q2_K => 0.65,
        _ => unreachable!("only K-quants use an RMS bound"),
    }
}

const TYPES: [GgmlType; 12] = [
    GgmlType::Q8_0,
    GgmlType::Q8_1,
    GgmlType::Q8_K,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// 1–3 super-blocks of values: gaussian-ish or uniform, at a random scale,
/// sometimes with an outlier. Scales stay where the formats' f16 block scales
/// are normal numbers (values ≳ 0.1): below that the scales go subnormal and
/// lose relative precision by design of the formats (bit-exactness there is
/// covered by the reference fixtures).
fn inputs() -> impl Strategy<Value = Vec<f32>> {
    (
        1usize..=3,
        -2i32..=6,
        any::<bool>(),
        any::<u64>(),
        proptest::option::of(0usize..256),
    )
        .prop_map(|(blocks, exp, gaussian, seed, outlier)| {
            let scale = 10f32.powi(exp / 2);
            let mut s = seed | 1;
            let mut next = move || {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
            };
            let mut v: Vec<f32> = (0..blocks * 256)
                .map(|_| {
                    if gaussian {
                        (next() + next() + next()) * scale
                    } else {
                        next() * scale
                    }
                })
                .collect();
            if let Some(i) = outlier {
                v[i] *= 20.0;
            }
            v
        })
}

fn check(ty: GgmlType, x: &[f32]) -> Result<f32, TestCaseError> {
    let q = quantize_to_vec(ty, x).unwrap();
    let y = dequantize_to_vec(ty, &q).unwrap();
    prop_assert_eq!(y.len(), x.len());
    let be = ty.block_elems();
    let mut worst = 0f32;
    for (xb, yb) in x.chunks(be).zip(y.chunks(be)) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let (lo, hi) = xb
            .iter()
            .fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
        if let Some(bound) = element_bound(ty, amax, hi - lo) {
            for (i, (a, b)) in xb.iter().zip(yb).enumerate() {
                prop_assert!(
                    (a - b).abs() <= bound,
                    "{ty} element {i}: {a} -> {b}, bound {bound}"
                );
            }
            worst = worst.max(if amax > 0.0 { bound / amax } else { 0.0 });
        } else {
            let err: f32 = xb.iter().zip(yb).map(|(a, b)| (a - b).powi(2)).sum();
            let norm: f32 = xb.iter().map(|a| a * a).sum();
            let rel = (err / norm).sqrt();
            prop_assert!(rel <= rms_bound(ty), "{ty}: relative RMS error {rel}");
            worst = worst.max(rel);
        }
    }
    Ok(worst)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn round_trips_stay_within_bounds(x in inputs()) {
        for ty in TYPES {
            check(ty, &x)?;
        }
    }
}

#[test]
fn all_zero_blocks_round_trip_exactly() {
    for ty in TYPES {
        let x = vec![0f32; 512];
        let y = dequantize_to_vec(ty, &quantize_to_vec(ty, &x).unwrap()).unwrap();
        assert!(y.iter().all(|&v| v == 0.0), "{ty}");
    }
}

#[test]
fn worst_observed_k_quant_errors() {
    // Not a bound check of its own: prints the worst relative RMS error per
    // K-quant on a fixed set of inputs, which is where the limits above come from.
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    for ty in [
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
    ] {
        let mut worst = 0f32;
        for _ in 0..300 {
            let x = inputs().new_tree(&mut runner).unwrap().current();
            worst = worst.max(check(ty, &x).unwrap());
        }
        eprintln!(
            "{ty}: worst relative RMS error {worst:.4} (limit {})",
            rms_bound(ty)
        );
    }
}
