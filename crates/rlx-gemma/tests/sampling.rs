//! Behaviour of the public sampler API: each option is honoured, the RNG
//! advances and is reproducible, and bad input gives errors, not panics.

use proptest::prelude::*;
use rlx_gemma::sampling::{Sampler, SamplerConfig, SamplingError};

fn sampler(cfg: SamplerConfig) -> Sampler {
    Sampler::new(cfg).expect("valid config")
}

fn with_temp(temperature: f32) -> SamplerConfig {
    SamplerConfig {
        temperature,
        ..SamplerConfig::default()
    }
}

fn histogram(s: &mut Sampler, logits: &[f32], n: usize) -> Vec<usize> {
    let mut h = vec![0; logits.len()];
    for _ in 0..n {
        h[s.sample(logits).unwrap() as usize] += 1;
    }
    h
}

fn softmax(logits: &[f32], t: f32) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f64> = logits
        .iter()
        .map(|&l| (f64::from(l - max) / f64::from(t)).exp())
        .collect();
    let sum: f64 = e.iter().sum();
    e.iter().map(|x| x / sum).collect()
}

/// Every frequency within 5 standard deviations (plus a little slack) of `p`.
fn assert_matches(h: &[usize], p: &[f64], n: usize) {
    for (i, (&count, &p)) in h.iter().zip(p).enumerate() {
        let f = count as f64 / n as f64;
        let sd = (p * (1.0 - p) / n as f64).sqrt();
        assert!(
            (f - p).abs() <= 5.0 * sd + 0.005,
            "token {i}: frequency {f:.4} vs probability {p:.4} (histogram {h:?})"
        );
    }
}

#[test]
fn default_is_greedy_with_everything_off() {
    let c = SamplerConfig::default();
    assert_eq!(c.temperature, 0.0);
    assert_eq!(c.top_k, 0);
    assert_eq!(c.top_p, 1.0);
    assert_eq!(c.min_p, 0.0);
    assert_eq!(c.typical_p, 1.0);
    assert_eq!(c.repeat_penalty, 1.0);
    assert_eq!(c.presence_penalty, 0.0);
    assert_eq!(c.frequency_penalty, 0.0);
    assert_eq!(c.penalty_last_n, 64);
    assert!(c.logit_bias.is_empty());
    assert_eq!(c.seed, 0);
    assert_eq!(c.validate(), Ok(()));
    assert_eq!(sampler(c.clone()).config(), &c);
}

#[test]
fn greedy_picks_argmax_with_ties_to_lowest_id() {
    let mut s = sampler(SamplerConfig::default());
    assert_eq!(s.sample(&[1.0, 5.0, 5.0, 2.0]).unwrap(), 1);
    assert_eq!(s.sample(&[-3.0, -1.0, -2.0]).unwrap(), 1);
    assert_eq!(s.sample(&[0.0, 0.0, 0.0]).unwrap(), 0);
    assert_eq!(s.sample(&[-0.0, 0.0]).unwrap(), 0);
    assert_eq!(s.sample(&[7.0]).unwrap(), 0);
    // Negative temperature is greedy too, and top-k etc. do not matter.
    let mut s = sampler(SamplerConfig {
        temperature: -1.0,
        top_k: 1,
        top_p: 0.1,
        ..SamplerConfig::default()
    });
    for _ in 0..10 {
        assert_eq!(s.sample(&[1.0, 5.0, 5.0, 2.0]).unwrap(), 1);
    }
}

#[test]
fn low_temperature_nearly_always_picks_top_token() {
    let logits = [2.0, 1.0, 0.5, 0.0];
    let n = 2000;
    let h = histogram(&mut sampler(with_temp(0.1)), &logits, n);
    // P(top) ≈ 0.99995 at t = 0.1.
    assert!(h[0] >= n - 5, "{h:?}");
}

#[test]
fn high_temperature_is_close_to_uniform() {
    let logits = [2.0, 1.0, 0.5, 0.0];
    let n = 2000;
    let h = histogram(&mut sampler(with_temp(10.0)), &logits, n);
    assert_matches(&h, &softmax(&logits, 10.0), n);
    for &c in &h {
        let f = c as f64 / n as f64;
        assert!((0.18..0.33).contains(&f), "{h:?}");
    }
}

#[test]
fn temperature_one_matches_softmax() {
    let logits = [2.0, 1.0, 0.5, 0.0, -1.0];
    let n = 5000;
    let h = histogram(&mut sampler(with_temp(1.0)), &logits, n);
    assert_matches(&h, &softmax(&logits, 1.0), n);
}

#[test]
fn temperature_changes_the_distribution() {
    // Same seed, same logits: only the temperature differs.
    let logits = [1.0, 0.0, 0.0, 0.0];
    let n = 2000;
    let cold = histogram(&mut sampler(with_temp(0.25)), &logits, n);
    let hot = histogram(&mut sampler(with_temp(4.0)), &logits, n);
    assert!(cold[0] > hot[0] + n / 4, "cold {cold:?} hot {hot:?}");
}

#[test]
fn successive_draws_differ() {
    let logits = [0.0f32; 10];
    let mut s = sampler(with_temp(1.0));
    let draws: Vec<u32> = (0..100).map(|_| s.sample(&logits).unwrap()).collect();
    assert!(draws.iter().any(|&d| d != draws[0]), "{draws:?}");
    let mut distinct = draws.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(distinct.len() >= 8, "{draws:?}");
}

fn sequence(seed: u64, n: usize) -> Vec<u32> {
    let logits = [0.0f32; 50];
    let mut s = sampler(SamplerConfig {
        seed,
        ..with_temp(1.0)
    });
    (0..n).map(|_| s.sample(&logits).unwrap()).collect()
}

#[test]
fn same_seed_reproduces_and_different_seeds_differ() {
    assert_eq!(sequence(42, 200), sequence(42, 200));
    assert_ne!(sequence(42, 200), sequence(43, 200));
    assert_ne!(sequence(0, 200), sequence(1, 200));
}

#[test]
fn reset_replays_the_sequence_and_clears_history() {
    let logits = [0.0f32; 50];
    let mut s = sampler(SamplerConfig {
        seed: 9,
        ..with_temp(1.0)
    });
    let first: Vec<u32> = (0..50).map(|_| s.sample(&logits).unwrap()).collect();
    s.reset();
    let again: Vec<u32> = (0..50).map(|_| s.sample(&logits).unwrap()).collect();
    assert_eq!(first, again);

    let mut s = sampler(SamplerConfig {
        repeat_penalty: 100.0,
        ..SamplerConfig::default()
    });
    s.accept(0);
    assert_eq!(s.sample(&[3.0, 2.0]).unwrap(), 1);
    s.reset();
    assert_eq!(s.sample(&[3.0, 2.0]).unwrap(), 0);
}

#[test]
fn top_k_never_leaves_the_k_best() {
    // Deterministic pseudo-random logits.
    let logits: Vec<f32> = (0..100u32)
        .map(|i| ((i.wrapping_mul(2_654_435_761) >> 7) % 1000) as f32 / 100.0)
        .collect();
    let mut order: Vec<u32> = (0..100).collect();
    order.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
    let best: Vec<u32> = order[..5].to_vec();
    let mut s = sampler(SamplerConfig {
        top_k: 5,
        ..with_temp(5.0)
    });
    let mut seen = [false; 100];
    for _ in 0..1000 {
        let t = s.sample(&logits).unwrap();
        assert!(best.contains(&t), "{t} not in {best:?}");
        seen[t as usize] = true;
    }
    assert!(
        best.iter().all(|&t| seen[t as usize]),
        "all of the top 5 appear"
    );

    let mut s = sampler(SamplerConfig {
        top_k: 1,
        ..with_temp(100.0)
    });
    for _ in 0..50 {
        assert_eq!(s.sample(&logits).unwrap(), order[0]);
    }
}

#[test]
fn top_k_on_full_gemma_vocabulary() {
    let vocab = 262_144u32;
    let logits: Vec<f32> = (0..vocab)
        .map(|i| ((i.wrapping_mul(2_654_435_761) >> 8) % 100_000) as f32 / 10_000.0)
        .collect();
    let mut sorted = logits.clone();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let kth = sorted[39];
    let mut s = sampler(SamplerConfig {
        top_k: 40,
        top_p: 0.95,
        min_p: 0.05,
        ..with_temp(0.8)
    });
    for _ in 0..20 {
        let t = s.sample(&logits).unwrap();
        assert!(logits[t as usize] >= kth);
    }
}

/// Logits whose softmax is exactly `probs` (up to rounding).
fn log_probs(probs: &[f64]) -> Vec<f32> {
    probs.iter().map(|p| p.ln() as f32).collect()
}

fn support(cfg: SamplerConfig, logits: &[f32], n: usize) -> Vec<u32> {
    let h = histogram(&mut sampler(cfg), logits, n);
    (0..logits.len() as u32)
        .filter(|&i| h[i as usize] > 0)
        .collect()
}

#[test]
fn top_p_keeps_smallest_set_reaching_p() {
    let logits = log_probs(&[0.5, 0.3, 0.15, 0.05]);
    let cfg = |top_p| SamplerConfig {
        top_p,
        ..with_temp(1.0)
    };
    assert_eq!(support(cfg(0.0), &logits, 500), vec![0]);
    assert_eq!(support(cfg(0.45), &logits, 500), vec![0]);
    assert_eq!(support(cfg(0.75), &logits, 1000), vec![0, 1]);
    assert_eq!(support(cfg(0.85), &logits, 2000), vec![0, 1, 2]);
    assert_eq!(support(cfg(1.0), &logits, 4000), vec![0, 1, 2, 3]);
    // The kept set is renormalised: 0.5 / 0.8 and 0.3 / 0.8.
    let n = 4000;
    let h = histogram(&mut sampler(cfg(0.75)), &logits, n);
    assert_matches(&h, &[0.625, 0.375, 0.0, 0.0], n);
}

#[test]
fn min_p_drops_tokens_below_fraction_of_max() {
    let logits = log_probs(&[0.5, 0.3, 0.15, 0.05]);
    let cfg = |min_p| SamplerConfig {
        min_p,
        ..with_temp(1.0)
    };
    assert_eq!(support(cfg(0.2), &logits, 2000), vec![0, 1, 2]);
    assert_eq!(support(cfg(0.5), &logits, 1000), vec![0, 1]);
    assert_eq!(support(cfg(1.0), &logits, 500), vec![0]);
}

#[test]
fn typical_p_keeps_tokens_closest_to_entropy() {
    // Entropy ≈ 1.280 nats; |surprisal − entropy| orders tokens 1, 2, 0, 3, so
    // the most likely token is dropped first.
    let logits = log_probs(&[0.4, 0.3, 0.2, 0.1]);
    let cfg = |typical_p| SamplerConfig {
        typical_p,
        ..with_temp(1.0)
    };
    assert_eq!(support(cfg(0.25), &logits, 500), vec![1]);
    assert_eq!(support(cfg(0.45), &logits, 1000), vec![1, 2]);
    assert_eq!(support(cfg(0.6), &logits, 2000), vec![0, 1, 2]);
}

#[test]
fn stages_run_in_llama_cpp_order() {
    // top-k before typical-p: with k = 2 only tokens 0 and 1 remain, and then
    // typical-p (entropy of the pair) keeps one of them rather than token 2.
    let logits = log_probs(&[0.4, 0.3, 0.2, 0.1]);
    let got = support(
        SamplerConfig {
            top_k: 2,
            typical_p: 0.1,
            ..with_temp(1.0)
        },
        &logits,
        500,
    );
    assert_eq!(got.len(), 1);
    assert!(got[0] < 2, "{got:?}");
    // min-p sees logits before temperature: a high temperature does not let
    // dropped tokens back in.
    let got = support(
        SamplerConfig {
            min_p: 0.5,
            ..with_temp(50.0)
        },
        &log_probs(&[0.5, 0.3, 0.15, 0.05]),
        1000,
    );
    assert_eq!(got, vec![0, 1]);
}

#[test]
fn repeat_penalty_divides_positive_and_multiplies_negative() {
    let cfg = SamplerConfig {
        repeat_penalty: 2.0,
        ..SamplerConfig::default()
    };
    // Positive: 3 / 2 = 1.5 < 2.
    let mut s = sampler(cfg.clone());
    assert_eq!(s.sample(&[3.0, 2.0]).unwrap(), 0);
    s.accept(0);
    assert_eq!(s.sample(&[3.0, 2.0]).unwrap(), 1);
    // Negative: -1 × 2 = -2 < -1.5 (dividing would give -0.5 and keep token 0).
    let mut s = sampler(cfg.clone());
    s.accept(0);
    assert_eq!(s.sample(&[-1.0, -1.5]).unwrap(), 1);
    // Applied once per token regardless of count: 3 / 2 = 1.5 > 1.4.
    let mut s = sampler(cfg);
    for _ in 0..5 {
        s.accept(0);
    }
    assert_eq!(s.sample(&[3.0, 1.4]).unwrap(), 0);
}

#[test]
fn penalties_only_look_at_the_window() {
    let mut s = sampler(SamplerConfig {
        repeat_penalty: 2.0,
        penalty_last_n: 2,
        ..SamplerConfig::default()
    });
    s.accept(0);
    assert_eq!(s.sample(&[3.0, 2.0]).unwrap(), 1);
    s.accept(5);
    assert_eq!(s.sample(&[3.0, 2.0]).unwrap(), 1);
    s.accept(6); // token 0 leaves the window
    assert_eq!(s.sample(&[3.0, 2.0]).unwrap(), 0);

    let mut s = sampler(SamplerConfig {
        repeat_penalty: 2.0,
        frequency_penalty: 10.0,
        presence_penalty: 10.0,
        penalty_last_n: 0,
        ..SamplerConfig::default()
    });
    s.accept(0);
    assert_eq!(s.sample(&[3.0, 2.0]).unwrap(), 0);
}

#[test]
fn sample_does_not_record_the_token() {
    let mut s = sampler(SamplerConfig {
        repeat_penalty: 100.0,
        ..SamplerConfig::default()
    });
    for _ in 0..5 {
        assert_eq!(s.sample(&[3.0, 2.0]).unwrap(), 0);
    }
}

#[test]
fn frequency_penalty_subtracts_count_times_value() {
    let cfg = SamplerConfig {
        frequency_penalty: 0.4,
        ..SamplerConfig::default()
    };
    let mut s = sampler(cfg);
    let logits = [3.0, 2.0, 0.0];
    s.accept(0);
    s.accept(0);
    assert_eq!(s.sample(&logits).unwrap(), 0); // 3 - 0.8 = 2.2
    s.accept(0);
    assert_eq!(s.sample(&logits).unwrap(), 1); // 3 - 1.2 = 1.8
                                               // Negative values encourage repetition.
    let mut s = sampler(SamplerConfig {
        frequency_penalty: -1.0,
        ..SamplerConfig::default()
    });
    for _ in 0..4 {
        s.accept(2);
    }
    assert_eq!(s.sample(&logits).unwrap(), 2); // 0 + 4 = 4 > 3
}

#[test]
fn presence_penalty_subtracts_once() {
    let logits = [3.0, 2.0];
    let mut s = sampler(SamplerConfig {
        presence_penalty: 0.6,
        ..SamplerConfig::default()
    });
    for _ in 0..5 {
        s.accept(0);
    }
    assert_eq!(s.sample(&logits).unwrap(), 0); // 3 - 0.6 = 2.4, whatever the count
    let mut s = sampler(SamplerConfig {
        presence_penalty: 1.5,
        ..SamplerConfig::default()
    });
    s.accept(0);
    assert_eq!(s.sample(&logits).unwrap(), 1); // 3 - 1.5 = 1.5
}

#[test]
fn logit_bias_adds_and_neg_infinity_bans() {
    let logits = [3.0, 2.0, 1.0];
    let mut s = sampler(SamplerConfig {
        logit_bias: vec![(2, 2.5)],
        ..SamplerConfig::default()
    });
    assert_eq!(s.sample(&logits).unwrap(), 2);
    let mut s = sampler(SamplerConfig {
        logit_bias: vec![(0, f32::NEG_INFINITY)],
        ..SamplerConfig::default()
    });
    assert_eq!(s.sample(&logits).unwrap(), 1);
    // Banned tokens never come out of sampling either, even when hot.
    let mut s = sampler(SamplerConfig {
        logit_bias: vec![(0, f32::NEG_INFINITY), (2, f32::NEG_INFINITY)],
        ..with_temp(10.0)
    });
    for _ in 0..500 {
        assert_eq!(s.sample(&logits).unwrap(), 1);
    }
    // Ids beyond the vocabulary are ignored.
    let mut s = sampler(SamplerConfig {
        logit_bias: vec![(1000, f32::NEG_INFINITY)],
        ..SamplerConfig::default()
    });
    assert_eq!(s.sample(&logits).unwrap(), 0);
}

#[test]
fn errors_on_empty_or_all_banned_logits() {
    let mut s = sampler(with_temp(1.0));
    assert_eq!(s.sample(&[]), Err(SamplingError::EmptyLogits));
    let inf = f32::NEG_INFINITY;
    assert_eq!(s.sample(&[inf, inf]), Err(SamplingError::AllBanned));
    let mut s = sampler(SamplerConfig {
        logit_bias: vec![(0, inf), (1, inf)],
        ..SamplerConfig::default()
    });
    assert_eq!(s.sample(&[1.0, 2.0]), Err(SamplingError::AllBanned));
    // Still usable after an error.
    assert_eq!(s.sample(&[1.0, 2.0, 0.5]).unwrap(), 2);
}

#[test]
fn errors_on_nan_or_positive_infinite_logits() {
    let mut s = sampler(with_temp(1.0));
    assert!(matches!(
        s.sample(&[0.0, f32::NAN]),
        Err(SamplingError::InvalidLogit { token: 1, .. })
    ));
    assert!(matches!(
        s.sample(&[f32::INFINITY, 0.0]),
        Err(SamplingError::InvalidLogit { token: 0, .. })
    ));
}

#[test]
fn bad_config_values_are_rejected_by_name() {
    let d = SamplerConfig::default;
    let cases: Vec<(&str, SamplerConfig)> = vec![
        (
            "temperature",
            SamplerConfig {
                temperature: f32::NAN,
                ..d()
            },
        ),
        (
            "temperature",
            SamplerConfig {
                temperature: f32::INFINITY,
                ..d()
            },
        ),
        (
            "top_p",
            SamplerConfig {
                top_p: f32::NAN,
                ..d()
            },
        ),
        ("top_p", SamplerConfig { top_p: -0.1, ..d() }),
        ("top_p", SamplerConfig { top_p: 1.5, ..d() }),
        (
            "min_p",
            SamplerConfig {
                min_p: f32::NAN,
                ..d()
            },
        ),
        ("min_p", SamplerConfig { min_p: -0.5, ..d() }),
        ("min_p", SamplerConfig { min_p: 2.0, ..d() }),
        (
            "typical_p",
            SamplerConfig {
                typical_p: f32::NAN,
                ..d()
            },
        ),
        (
            "typical_p",
            SamplerConfig {
                typical_p: -1.0,
                ..d()
            },
        ),
        (
            "typical_p",
            SamplerConfig {
                typical_p: 1.01,
                ..d()
            },
        ),
        (
            "repeat_penalty",
            SamplerConfig {
                repeat_penalty: f32::NAN,
                ..d()
            },
        ),
        (
            "repeat_penalty",
            SamplerConfig {
                repeat_penalty: 0.0,
                ..d()
            },
        ),
        (
            "repeat_penalty",
            SamplerConfig {
                repeat_penalty: -1.0,
                ..d()
            },
        ),
        (
            "repeat_penalty",
            SamplerConfig {
                repeat_penalty: f32::INFINITY,
                ..d()
            },
        ),
        (
            "presence_penalty",
            SamplerConfig {
                presence_penalty: f32::NAN,
                ..d()
            },
        ),
        (
            "presence_penalty",
            SamplerConfig {
                presence_penalty: f32::NEG_INFINITY,
                ..d()
            },
        ),
        (
            "frequency_penalty",
            SamplerConfig {
                frequency_penalty: f32::NAN,
                ..d()
            },
        ),
        (
            "frequency_penalty",
            SamplerConfig {
                frequency_penalty: f32::INFINITY,
                ..d()
            },
        ),
        (
            "logit_bias",
            SamplerConfig {
                logit_bias: vec![(3, f32::NAN)],
                ..d()
            },
        ),
        (
            "logit_bias",
            SamplerConfig {
                logit_bias: vec![(3, f32::INFINITY)],
                ..d()
            },
        ),
    ];
    for (name, cfg) in cases {
        let err = cfg.validate().unwrap_err();
        match &err {
            SamplingError::InvalidOption { option, .. } => assert_eq!(*option, name),
            other => panic!("expected InvalidOption for {name}, got {other:?}"),
        }
        assert!(err.to_string().contains(name), "{err}");
        assert_eq!(Sampler::new(cfg).unwrap_err(), err);
    }
    // Edge values that are valid.
    let ok = [
        SamplerConfig {
            temperature: -2.0,
            ..d()
        },
        SamplerConfig {
            top_p: 0.0,
            min_p: 1.0,
            typical_p: 0.0,
            ..d()
        },
        SamplerConfig {
            presence_penalty: -2.0,
            frequency_penalty: -2.0,
            ..d()
        },
        SamplerConfig {
            logit_bias: vec![(0, f32::NEG_INFINITY), (1, -5.0)],
            ..d()
        },
    ];
    for cfg in ok {
        assert_eq!(cfg.validate(), Ok(()), "{cfg:?}");
    }
}

#[test]
fn extreme_but_valid_values_do_not_break_sampling() {
    let logits = [f32::MAX, -f32::MAX, 0.0, 1.0];
    let mut s = sampler(SamplerConfig {
        temperature: 1e-30,
        frequency_penalty: -f32::MAX,
        presence_penalty: f32::MAX,
        repeat_penalty: 1e-30,
        logit_bias: vec![(1, f32::MAX), (2, f32::MAX)],
        ..SamplerConfig::default()
    });
    s.accept(3);
    s.accept(3);
    for _ in 0..10 {
        assert!(s.sample(&logits).unwrap() < 4);
    }
}

fn logit_strategy() -> impl Strategy<Value = f32> {
    prop_oneof![
        8 => -30.0f32..30.0,
        1 => Just(f32::NEG_INFINITY),
        1 => Just(0.0f32),
    ]
}

fn config_strategy() -> impl Strategy<Value = SamplerConfig> {
    (
        (
            -1.0f32..5.0,
            0usize..20,
            0.0f32..=1.0,
            0.0f32..=1.0,
            0.0f32..=1.0,
        ),
        (0.1f32..3.0, -2.0f32..2.0, -2.0f32..2.0, 0usize..10),
        prop::collection::vec(
            (0u32..80, prop_oneof![Just(f32::NEG_INFINITY), -5.0f32..5.0]),
            0..10,
        ),
        any::<u64>(),
    )
        .prop_map(
            |((t, k, p, mp, tp), (rp, pp, fp, n), bias, seed)| SamplerConfig {
                temperature: t,
                top_k: k,
                top_p: p,
                min_p: mp,
                typical_p: tp,
                repeat_penalty: rp,
                presence_penalty: pp,
                frequency_penalty: fp,
                penalty_last_n: n,
                logit_bias: bias,
                seed,
            },
        )
}

proptest! {
    #[test]
    fn sampled_token_is_valid_and_never_banned(
        logits in prop::collection::vec(logit_strategy(), 1..64),
        cfg in config_strategy(),
        history in prop::collection::vec(0u32..80, 0..20),
    ) {
        let banned: Vec<bool> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| {
                l == f32::NEG_INFINITY
                    || cfg
                        .logit_bias
                        .iter()
                        .any(|&(t, b)| t as usize == i && b == f32::NEG_INFINITY)
            })
            .collect();
        let mut s = Sampler::new(cfg).unwrap();
        for &t in &history {
            s.accept(t);
        }
        for _ in 0..3 {
            match s.sample(&logits) {
                Ok(t) => {
                    prop_assert!((t as usize) < logits.len());
                    prop_assert!(!banned[t as usize], "banned token {} sampled", t);
                }
                Err(e) => {
                    prop_assert_eq!(e, SamplingError::AllBanned);
                    prop_assert!(banned.iter().all(|&b| b));
                }
            }
        }
    }

    #[test]
    fn top_k_result_is_among_k_best(
        logits in prop::collection::vec(-10.0f32..10.0, 1..200),
        k in 1usize..20,
        seed in any::<u64>(),
    ) {
        let mut s = Sampler::new(SamplerConfig { top_k: k, seed, ..with_temp(2.0) }).unwrap();
        let t = s.sample(&logits).unwrap();
        let better = logits.iter().filter(|&&l| l > logits[t as usize]).count();
        prop_assert!(better < k);
    }
}
