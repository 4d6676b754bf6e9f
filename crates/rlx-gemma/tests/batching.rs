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
//! matmul input to 8 bits, so a difference of one ulp upstream (the GEMM
//! for 8 or more rows, the matrix-vector kernels below) can flip a rounding
//! and move a tiny model's row by 1e-2: one sequence alone, prefilled in
//! one chunk or fed token by token, differs by up to 8e-3 on the tiny Q8_0
//! files. A `q8` batch is therefore bound by the size of `q8`'s own
//! rounding on that file (the same sequence alone, `q8` against `exact`;
//! 1e-5 where it has none): measured 8e-8 – 5.5e-3 against bounds of
//! 2.2e-2 – 1.2e-1 on the Q8_0 files, and 0 – 1.4e-7 on f32 files (which
//! `q8` runs in f32).

mod common;

use std::collections::BTreeMap;

use common::{fixtures, real_model, rel_l2};
use rlx_gemma::{
    Feed, Model, ModelOptions, Precision, SeqId, Sequences, SequencesOptions, SessionOptions, Want,
};

/// How one scenario runs.
struct Script {
    /// Prompt lengths of the sequences added at the start (A, B) and later (D).
    prompt_a: usize,
    prompt_b: usize,
    prompt_d: usize,
    /// Length each sequence generates to.
    target: usize,
    /// Tokens per step.
    budget: usize,
}

/// A deterministic token for sequence `tag` at position `pos`.
fn token(vocab: usize, tag: usize, pos: usize) -> u32 {
    (((tag * 7919 + pos * 104_729 + 13) % (vocab - 3)) + 3) as u32
}

struct Tracked {
    tag: usize,
    /// Tokens still to feed (the prompt, then one generated token at a time).
    pending: Vec<u32>,
    tokens: Vec<u32>,
    logits: Vec<f32>,
    target: usize,
}

/// Runs the scenario and returns every sequence's tokens and logit rows
/// (including a sequence removed part way).
fn run_batched(model: &Model, s: &Script) -> Vec<(Vec<u32>, Vec<f32>)> {
    let vocab = model.config().n_vocab;
    let mut seqs: Sequences = model
        .sequences(SequencesOptions {
            max_seqs: 6,
            context: Some(s.target + 8),
            max_step_tokens: s.budget,
            ..Default::default()
        })
        .unwrap();
    let mut live: BTreeMap<SeqId, Tracked> = BTreeMap::new();
    let mut done = Vec::new();
    let prompt = |tag: usize, n: usize| (0..n).map(|p| token(vocab, tag, p)).collect::<Vec<_>>();
    let add = |seqs: &mut Sequences, live: &mut BTreeMap<SeqId, Tracked>, tag, n| {
        let id = seqs.add().unwrap();
        live.insert(
            id,
            Tracked {
                tag,
                pending: prompt(tag, n),
                tokens: Vec::new(),
                logits: Vec::new(),
                target: s.target,
            },
        );
        id
    };
    let a = add(&mut seqs, &mut live, 1, s.prompt_a);
    let b = add(&mut seqs, &mut live, 2, s.prompt_b);
    let (mut forked_c, mut step_no) = (None, 0);
    while !live.is_empty() {
        // The fork of A once its prompt is in, D a few steps later, B gone
        // and a fork of C after that.
        if forked_c.is_none() && live[&a].pending.len() <= 1 && !live[&a].tokens.is_empty() {
            let c = seqs.fork(a).unwrap();
            let parent = &live[&a];
            let t = Tracked {
                tag: 3,
                pending: vec![token(vocab, 3, parent.tokens.len())],
                tokens: parent.tokens.clone(),
                logits: parent.logits.clone(),
                target: s.target - 5,
            };
            live.insert(c, t);
            forked_c = Some(c);
        }
        if step_no == 3 {
            add(&mut seqs, &mut live, 4, s.prompt_d);
        }
        if let (Some(c), true) = (forked_c, step_no == 9) {
            let gone = live.remove(&b).unwrap();
            seqs.remove(b).unwrap();
            done.push((gone.tokens, gone.logits));
            let e = seqs.fork(c).unwrap();
            let parent = &live[&c];
            let t = Tracked {
                tag: 5,
                pending: vec![token(vocab, 5, parent.tokens.len())],
                tokens: parent.tokens.clone(),
                logits: parent.logits.clone(),
                target: s.target,
            };
            live.insert(e, t);
        }
        // Decode tokens first, then prompt chunks in what is left.
        let mut budget = s.budget;
        let mut plan: Vec<(SeqId, usize)> = Vec::new();
        for (&id, t) in &live {
            if t.pending.len() == 1 && budget > 0 {
                plan.push((id, 1));
                budget -= 1;
            }
        }
        for (&id, t) in &live {
            if t.pending.len() > 1 && budget > 0 {
                let n = t.pending.len().min(budget);
                plan.push((id, n));
                budget -= n;
            }
        }
        let feeds: Vec<Feed> = plan
            .iter()
            .map(|&(id, n)| Feed {
                seq: id,
                tokens: &live[&id].pending[..n],
                logits: Want::All,
            })
            .collect();
        let out = seqs.step(&feeds).unwrap();
        for (&(id, n), rows) in plan.iter().zip(out) {
            let t = live.get_mut(&id).unwrap();
            assert_eq!(rows.len(), n * vocab);
            let fed: Vec<u32> = t.pending.drain(..n).collect();
            t.tokens.extend(fed);
            t.logits.extend(rows);
            if t.pending.is_empty() && t.tokens.len() < t.target {
                t.pending.push(token(vocab, t.tag, t.tokens.len()));
            }
        }
        for id in live.keys().copied().collect::<Vec<_>>() {
            if live[&id].pending.is_empty() {
                let t = live.remove(&id).unwrap();
                seqs.remove(id).unwrap();
                done.push((t.tokens, t.logits));
            }
        }
        seqs.pool().check_invariants().unwrap();
        step_no += 1;
    }
    assert_eq!(
        seqs.pool().free_blocks(),
        seqs.pool()
            .config()
            .groups()
            .iter()
            .map(|g| g.blocks)
            .collect::<Vec<_>>(),
        "every block is back in the pool"
    );
    done
}

/// The largest relative L2, over sequences, of batched against alone.
fn worst_error(model: &Model, s: &Script) -> f64 {
    let runs = run_batched(model, s);
    assert_eq!(runs.len(), 5);
    let mut worst = 0f64;
    for (tokens, logits) in runs {
        let mut alone = model
            .session(SessionOptions {
                context: Some(tokens.len()),
                prefill_chunk: s.budget,
                ..Default::default()
            })
            .unwrap();
        let want = alone.score(&tokens).unwrap();
        assert_eq!(want.len(), logits.len());
        worst = worst.max(rel_l2(&logits, &want));
    }
    worst
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
