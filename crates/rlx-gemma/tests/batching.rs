//! Many sequences in one step: each sequence of a mixed batch gets the
//! logits it gets when run alone.
//!
//! A small scheduler drives [`Sequences`] the way a server does: every step
//! carries one token of each generating sequence and prompt chunks of the
//! others under a token budget; sequences are added, forked (sharing their
//! parent's blocks) and removed between steps, and run past their sliding
//! windows and across block edges. Every logit row of every sequence is
//! compared with the same sequence scored alone in a fresh session. A
//! property test does the same for random interleavings of add, fork, step,
//! rewind and remove (it fails, for one, when a fork's write is not copied
//! off a shared block).
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
//! `q8` runs in f32). With `batch_invariant` the difference is exactly 0.

mod common;

use common::scenario::{token, worst_against_alone, Script};
use common::{fixtures, real_model, rel_l2, TINY_GENERATIONS};
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
    load_with(path, precision, false)
}

fn load_with(path: &std::path::Path, precision: Precision, batch_invariant: bool) -> Model {
    let opts = ModelOptions {
        threads: 2,
        precision,
        batch_invariant,
        ..Default::default()
    };
    Model::load(path, opts).unwrap()
}

#[test]
fn batched_sequences_match_each_alone_on_every_tiny_model() {
    let script = Script::TINY;
    let mut failures = Vec::new();
    for name in TINY_GENERATIONS {
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
    let script = Script::LONG;
    let model = load(&real_model(), Precision::Exact);
    let err = worst_error(&model, &script);
    println!("gemma3-270m exact: worst relative L2 {err:.2e}");
    assert!(err < 1e-5, "{err:e}");
}

mod interleavings {
    //! Random interleavings of add, fork, step (any mix of prompt chunks and
    //! single tokens), rewind and remove on a tiny Gemma 3 (sliding window 8,
    //! so windows slide within a few blocks): every sequence's logits equal
    //! the same tokens scored alone, and after every operation the pool's
    //! bookkeeping holds (no block leaked, none shared that should not be).

    use proptest::prelude::*;
    use rlx_gemma::{Feed, Model, SeqId, Sequences, SequencesOptions, SessionOptions, Want};

    use super::common::{fixtures, rel_l2};
    use super::load;
    use rlx_gemma::Precision;

    #[derive(Clone, Debug)]
    enum Op {
        Add,
        Fork(usize),
        /// (sequence pick, tokens) for a few sequences at once.
        Step(Vec<(usize, usize)>),
        Rewind(usize, usize),
        Remove(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            2 => Just(Op::Add),
            1 => (0..6usize).prop_map(Op::Fork),
            6 => proptest::collection::vec((0..6usize, 1..20usize), 1..4).prop_map(Op::Step),
            1 => (0..6usize, 0..60usize).prop_map(|(s, l)| Op::Rewind(s, l)),
            1 => (0..6usize).prop_map(Op::Remove),
        ]
    }

    /// A sequence's tokens and the logits each of them got.
    struct Track {
        id: SeqId,
        tokens: Vec<u32>,
        logits: Vec<f32>,
    }

    fn check_alone(model: &Model, t: &Track) -> f64 {
        if t.tokens.is_empty() {
            return 0.0;
        }
        let mut s = model
            .session(SessionOptions {
                context: Some(t.tokens.len()),
                prefill_chunk: 64,
                ..Default::default()
            })
            .unwrap();
        rel_l2(&t.logits, &s.score(&t.tokens).unwrap())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        #[test]
        fn any_interleaving_matches_each_sequence_alone(ops in proptest::collection::vec(op(), 1..30)) {
            let model = load(&fixtures().join("tiny/gemma3/model-f32.gguf"), Precision::Exact);
            let vocab = model.config().n_vocab as u32;
            let mut seqs: Sequences = model
                .sequences(SequencesOptions {
                    max_seqs: 6,
                    context: Some(160),
                    max_step_tokens: 48,
                    ..Default::default()
                })
                .unwrap();
            let mut live: Vec<Track> = Vec::new();
            let mut salt = 1u32;
            for op in ops {
                match op {
                    Op::Add if live.len() < 6 => live.push(Track {
                        id: seqs.add().unwrap(),
                        tokens: Vec::new(),
                        logits: Vec::new(),
                    }),
                    Op::Fork(i) if !live.is_empty() && live.len() < 6 => {
                        let src = &live[i % live.len()];
                        let t = Track {
                            id: seqs.fork(src.id).unwrap(),
                            tokens: src.tokens.clone(),
                            logits: src.logits.clone(),
                        };
                        live.push(t);
                    }
                    Op::Step(parts) if !live.is_empty() => {
                        let mut picked: Vec<(usize, Vec<u32>)> = Vec::new();
                        let mut budget = 48;
                        for (i, n) in parts {
                            let i = i % live.len();
                            let room = 160 - live[i].tokens.len();
                            let n = n.min(budget).min(room);
                            if n == 0 || picked.iter().any(|p| p.0 == i) {
                                continue;
                            }
                            budget -= n;
                            let toks = (0..n as u32)
                                .map(|_| {
                                    salt = salt.wrapping_mul(747_796_405).wrapping_add(2_891_336_453);
                                    (salt >> 8) % (vocab - 3) + 3
                                })
                                .collect();
                            picked.push((i, toks));
                        }
                        if picked.is_empty() {
                            continue;
                        }
                        let feeds: Vec<Feed> = picked
                            .iter()
                            .map(|(i, toks)| Feed {
                                seq: live[*i].id,
                                tokens: toks,
                                logits: Want::All,
                            })
                            .collect();
                        let out = seqs.step(&feeds).unwrap();
                        for (k, (i, toks)) in picked.iter().enumerate() {
                            live[*i].tokens.extend_from_slice(toks);
                            live[*i].logits.extend_from_slice(out.get(k));
                        }
                    }
                    Op::Rewind(i, len) if !live.is_empty() => {
                        let n = live.len();
                        let t = &mut live[i % n];
                        let len = len.min(t.tokens.len());
                        seqs.rewind(t.id, len).unwrap();
                        t.tokens.truncate(len);
                        t.logits.truncate(len * vocab as usize);
                        prop_assert_eq!(seqs.tokens(t.id).unwrap(), &t.tokens[..]);
                    }
                    Op::Remove(i) if !live.is_empty() => {
                        let t = live.remove(i % live.len());
                        let err = check_alone(&model, &t);
                        prop_assert!(err < 1e-5, "removed sequence: {:e}", err);
                        seqs.remove(t.id).unwrap();
                    }
                    _ => {}
                }
                if let Err(e) = seqs.pool().check_invariants() {
                    prop_assert!(false, "{}", e);
                }
            }
            for t in &live {
                let err = check_alone(&model, t);
                prop_assert!(err < 1e-5, "sequence of {} tokens: {:e}", t.tokens.len(), err);
            }
            for t in live {
                seqs.remove(t.id).unwrap();
            }
            let total: Vec<usize> = seqs.pool().config().groups().iter().map(|g| g.blocks).collect();
            prop_assert_eq!(seqs.pool().free_blocks(), total);
        }
    }
}

fn load_invariant(path: &std::path::Path) -> Model {
    load_with(path, Precision::Quantized, true)
}

#[test]
fn batch_invariant_q8_gives_each_sequence_the_logits_it_gets_alone() {
    // With `batch_invariant`, `q8` products take the row kernels at every
    // batch size, so a sequence's logits are those it gets alone, bit for
    // bit: the same seed samples the same text whatever else runs.
    let script = Script::TINY;
    let mut failures = Vec::new();
    for (name, file) in [
        ("gemma3", "model-Q8_0.gguf"),
        ("gemma3", "model-f32.gguf"),
        ("gemma3-q", "model-Q4_K_M.gguf"),
        ("gemma3-q", "model-Q4_0.gguf"),
        ("gemma2", "model-Q8_0.gguf"),
        ("gemma4-moe", "model-Q8_0.gguf"),
    ] {
        let model = load_invariant(&fixtures().join("tiny").join(name).join(file));
        let err = worst_error(&model, &script);
        println!("{name}/{file} q8, batch-invariant: worst relative L2 {err:.2e}");
        if err != 0.0 {
            failures.push(format!("{name}/{file}: {err:.2e}"));
        }
    }
    let model = load_invariant(&real_model());
    let err = worst_error(&model, &Script::LONG);
    println!("gemma3-270m q8, batch-invariant: worst relative L2 {err:.2e}");
    if err != 0.0 {
        failures.push(format!("gemma3-270m: {err:.2e}"));
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn a_prefix_taken_from_the_cache_gives_the_logits_of_computing_it() {
    // A sequence computes 100 tokens and leaves them to the prefix cache;
    // a later one starting with the same 96 (three blocks, far past the
    // 8-token sliding windows) takes them over and runs only its own tail.
    // Its logits equal the whole prompt computed afresh, on every
    // generation (Gemma 3n and 4 share K/V between layers), with every
    // cache type whose blocks fit the model's heads (a block type rounds
    // each row by itself, so the cached blocks are what computing gives).
    use rlx_gemma::{Feed, KvDType, KvTypes, SequencesOptions, Want};
    let runs = TINY_GENERATIONS
        .into_iter()
        .filter(|&n| n != "gemma4-moe")
        .flat_map(|n| KvDType::ALL.map(|t| (n, t)));
    for (name, kv) in runs {
        let path = fixtures().join("tiny").join(name).join("model-f32.gguf");
        let model = load(&path, Precision::Exact);
        if model
            .config()
            .layers
            .iter()
            .any(|l| l.head_dim % kv.block_elems() != 0)
        {
            continue;
        }
        let kv_types = Some(KvTypes::both(kv));
        let vocab = model.config().n_vocab;
        let first: Vec<u32> = (0..100).map(|p| token(vocab, 3, p)).collect();
        let mut second = first[..96].to_vec();
        second.extend((0..7).map(|p| token(vocab, 4, p)));
        let mut seqs = model
            .sequences(SequencesOptions {
                max_seqs: 2,
                context: Some(128),
                max_step_tokens: 64,
                kv_types,
                ..Default::default()
            })
            .unwrap();
        let a = seqs.add().unwrap();
        for chunk in first.chunks(50) {
            let feed = Feed {
                seq: a,
                tokens: chunk,
                logits: Want::None,
            };
            seqs.step(&[feed]).unwrap();
        }
        seqs.publish(a).unwrap();
        seqs.remove(a).unwrap();
        let (b, n) = seqs.add_cached(&second[..second.len() - 1]).unwrap();
        assert_eq!(n, 96, "{name} {kv}");
        let out = seqs
            .step(&[Feed {
                seq: b,
                tokens: &second[n..],
                logits: Want::All,
            }])
            .unwrap();
        let got = out.get(0).to_vec();
        let mut fresh = model
            .session(SessionOptions {
                context: Some(128),
                kv_types,
                ..Default::default()
            })
            .unwrap();
        let all = fresh.score(&second).unwrap();
        let want = &all[n * vocab..];
        let err = rel_l2(&got, want);
        println!("{name}, {kv} K/V: cached prefix against computed, relative L2 {err:.2e}");
        assert!(err < 1e-5, "{name} {kv}: {err:e}");
        seqs.pool().check_invariants().unwrap();
    }
}
