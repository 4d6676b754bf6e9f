//! Many sequences in one step: each sequence of a mixed batch gets the
//! logits it gets when run alone.
//!
//! A small scheduler drives [`Sequences`] the way a server does: every step
//! carries one token of each generating sequence and prompt chunks of the
//! others under a token budget; sequences are added, forked (sharing their
//! parent's blocks) and removed between steps, and run past their sliding
//! windows and across block edges. Every logit row of every sequence is
//! compared with the same sequence scored alone in a fresh session.
//!
//! Bounds, relative L2 per sequence: `exact` 1e-5 (measured 0 – 1.6e-7 on
//! the tiny models and 4e-7 on the 270M file: the same kernels on the same
//! rows, only the matmul's blocking over rows differs). `q8` rounds every
//! matmul input to 8 bits, so a difference of one ulp upstream (a step's
//! rows go through the row kernels, the panel kernels or the GEMM by their
//! count, and each sums in its own order) can flip a rounding and move a
//! tiny model's row by 1e-2: one sequence alone, prefilled in one chunk or
//! fed token by token, differs by up to 8e-3 on the tiny Q8_0 files. A
//! `q8` batch is therefore bound by the size of `q8`'s own rounding on that
//! file (the same sequence alone, `q8` against `exact`; 1e-5 where it has
//! none): measured 5e-8 – 5.8e-3 against bounds of 2.2e-2 – 1.2e-1 on the
//! Q8_0 files, and 0 – 1.4e-7 on f32 files (which
//! `q8` runs in f32).

mod common;

use common::scenario::{token, worst_against_alone, Script};
use common::{fixtures, real_model, rel_l2};
use rlx_gemma::{Model, ModelOptions, Precision, SessionOptions};

/// The largest relative L2, over sequences, of batched against alone.
fn worst_error(model: &Model, s: &Script) -> f64 {
    worst_against_alone(model, model, s)
}

/// The size of `q8`'s own rounding on a file: how far a sequence scored
/// alone with `q8` is from the same sequence scored with `exact`.
fn q8_rounding(path: &std::path::Path) -> f64 {
    let score = |precision| {
        let model = load(path, precision);
        let vocab = model.config().n_vocab;
        let tokens: Vec<u32> = (0..90).map(|p| token(vocab, 1, p)).collect();
        let mut s = model
            .session(SessionOptions {
                context: Some(tokens.len()),
                ..Default::default()
            })
            .unwrap();
        s.score(&tokens).unwrap()
    };
    rel_l2(&score(Precision::Quantized), &score(Precision::Exact))
}

fn load(path: &std::path::Path, precision: Precision) -> Model {
    let opts = ModelOptions {
        threads: 2,
        precision,
        ..Default::default()
    };
    Model::load(path, opts).unwrap()
}

#[test]
fn batched_sequences_match_each_alone_on_every_tiny_model() {
    let script = Script {
        prompt_a: 45,
        prompt_b: 9,
        prompt_d: 70,
        target: 90,
        budget: 24,
    };
    let mut failures = Vec::new();
    for name in [
        "gemma",
        "gemma2",
        "gemma3",
        "gemma3n",
        "gemma4-dense",
        "gemma4-ple",
        "gemma4-moe",
    ] {
        for file in ["model-f32.gguf", "model-Q8_0.gguf"] {
            let path = fixtures().join("tiny").join(name).join(file);
            if !path.exists() {
                continue;
            }
            for precision in [Precision::Exact, Precision::Quantized] {
                let model = load(&path, precision);
                let bound = match precision {
                    Precision::Exact => 1e-5,
                    Precision::Quantized => q8_rounding(&path).max(1e-5),
                };
                let err = worst_error(&model, &script);
                println!(
                    "{name}/{file} {precision:?}: worst relative L2 {err:.2e} (bound {bound:.1e})"
                );
                if err.is_nan() || err > bound {
                    failures.push(format!(
                        "{name}/{file} {precision:?}: {err:.2e} > {bound:e}"
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn batched_sequences_match_each_alone_on_gemma3_270m() {
    // Long enough to leave the 512-token sliding window.
    let script = Script {
        prompt_a: 530,
        prompt_b: 40,
        prompt_d: 300,
        target: 560,
        budget: 256,
    };
    let model = load(&real_model(), Precision::Exact);
    let err = worst_error(&model, &script);
    println!("gemma3-270m exact: worst relative L2 {err:.2e}");
    assert!(err < 1e-5, "{err:e}");
}
