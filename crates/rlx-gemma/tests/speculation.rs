//! Speculation gives the tokens plain decoding gives, drafts from prompt
//! lookup and from a draft model alike: greedy and seeded sampling (each
//! row of a verification step is computed as a one-row step computes it,
//! and each row takes the sampler's next draw, as each plain step does), on
//! every tiny model, `exact` and `q8`, and on the real 270M file, while
//! drafts are found and kept.

mod common;

use common::{fixtures, real_model, TINY_GENERATIONS};
use rlx_gemma::generate::{
    generate_constrained, DraftSource, Finish, GenerateStats, Generation, GenerationOptions,
    Speculation,
};
use rlx_gemma::model::open_file;
use rlx_gemma::sampling::{Sampler, SamplerConfig};
use rlx_gemma::{Model, ModelOptions, Precision, SessionOptions};
use rlx_tokenizer::{EncodeOptions, Tokenizer};

/// `n` tokens after `prompt`, with or without speculation.
fn generate(
    model: &Model,
    prompt: &[u32],
    n: usize,
    sampler: &SamplerConfig,
    spec: Option<Speculation>,
) -> (Vec<u32>, Finish, GenerateStats) {
    generate_in(model, prompt, n, prompt.len() + n + 16, sampler, spec)
}

/// [`generate`] in a session of `context` tokens.
fn generate_in(
    model: &Model,
    prompt: &[u32],
    n: usize,
    context: usize,
    sampler: &SamplerConfig,
    spec: Option<Speculation>,
) -> (Vec<u32>, Finish, GenerateStats) {
    let (_, got, held) = run_in(model, None, prompt, n, context, sampler, spec);
    let got = got.unwrap();
    // The session holds the prompt and every generated token but the last.
    let mut want = prompt.to_vec();
    want.extend_from_slice(&got.0[..got.0.len() - 1]);
    assert_eq!(held, want, "the session's tokens");
    got
}

/// A generation of up to `n` tokens in a session of `context` tokens,
/// drafting with `draft` where given: the tokens it produced (also where
/// it failed), its result, and the tokens the session holds after it.
fn run_in(
    model: &Model,
    draft: Option<&Model>,
    prompt: &[u32],
    n: usize,
    context: usize,
    sampler: &SamplerConfig,
    spec: Option<Speculation>,
) -> (Vec<u32>, ModelResult, Vec<u32>) {
    fn session_of(m: &Model, context: usize) -> rlx_gemma::Session<'_> {
        m.session(SessionOptions {
            context: Some(context),
            ..Default::default()
        })
        .unwrap()
    }
    let mut session = session_of(model, context);
    let mut draft = draft.map(|d| session_of(d, context));
    let opts = GenerationOptions {
        max_tokens: n,
        speculation: spec,
        ..Default::default()
    };
    let sampler = Sampler::new(sampler.clone()).unwrap();
    let mut generation = Generation::new(sampler, prompt, opts);
    let got = generate_constrained(
        &mut session,
        draft.as_mut(),
        prompt,
        &mut generation,
        None,
        None,
        &mut |_| true,
        &mut |_, _| {},
    );
    (generation.tokens().to_vec(), got, session.tokens().to_vec())
}

type ModelResult = rlx_gemma::model::Result<(Vec<u32>, Finish, GenerateStats)>;

/// A prompt that repeats itself, so that lookup finds drafts.
fn repetitive_prompt(vocab: usize) -> Vec<u32> {
    let phrase: Vec<u32> = (0..12)
        .map(|i| (7 + 13 * i) as u32 % vocab as u32)
        .collect();
    phrase
        .iter()
        .chain(&phrase)
        .chain(&phrase[..5])
        .copied()
        .collect()
}

fn samplers() -> [SamplerConfig; 2] {
    [
        SamplerConfig {
            temperature: 0.0,
            ..SamplerConfig::default()
        },
        SamplerConfig {
            temperature: 0.8,
            top_k: 40,
            seed: 11,
            ..SamplerConfig::default()
        },
    ]
}

/// Speculation with drafts of exactly `k` tokens where found (no
/// adaptation).
fn fixed(k: usize) -> Speculation {
    let mut spec = Speculation::default();
    spec.draft.min_draft = k;
    spec.draft.max_draft = k;
    spec.draft.row_cost = 0.0;
    spec
}

/// Drafts of 1 to 16 tokens: up to 6 on the default kernels (a step of 7
/// rows takes the one-row products), longer ones with `batch_invariant`
/// (the one-row products at every row count). The tiny Gemma 3's sliding
/// window is 8 and its K/V blocks 32 tokens, so verification steps cross
/// both.
#[test]
fn every_draft_length_gives_plain_decodings_tokens() {
    let path = fixtures().join("tiny/gemma3/model-Q8_0.gguf");
    for precision in [Precision::Exact, Precision::Quantized] {
        for batch_invariant in [false, true] {
            let opts = ModelOptions {
                threads: 2,
                precision,
                batch_invariant,
                ..Default::default()
            };
            let model = Model::load(&path, opts).unwrap();
            let prompt = repetitive_prompt(model.config().n_vocab);
            let lengths: &[usize] = if batch_invariant {
                &[7, 10, 16]
            } else {
                &[1, 2, 3, 6]
            };
            for sampler in samplers() {
                let plain = generate(&model, &prompt, 48, &sampler, None);
                for &k in lengths {
                    let spec = generate(&model, &prompt, 48, &sampler, Some(fixed(k)));
                    let at = format!(
                        "{precision:?} invariant {batch_invariant} t={} k={k}",
                        sampler.temperature
                    );
                    assert_eq!(plain.0, spec.0, "{at}");
                    assert!(spec.2.drafted > 0, "{at}: {:?}", spec.2);
                }
            }
        }
    }
}

/// A generation asked for more tokens than its context holds produces
/// plain decoding's tokens up to the same "context full" error (drafts are
/// cut to the room the context has left).
#[test]
fn drafts_fit_the_context() {
    let path = fixtures().join("tiny/gemma3/model-f32.gguf");
    let model = Model::load(&path, ModelOptions::default()).unwrap();
    let prompt = repetitive_prompt(model.config().n_vocab);
    let context = prompt.len() + 20;
    let run = |spec| {
        let (tokens, got, _) = run_in(&model, None, &prompt, 40, context, &samplers()[0], spec);
        let err = got.expect_err("more tokens than the context holds");
        (tokens, err.to_string())
    };
    let plain = run(None);
    let spec = run(Some(fixed(6)));
    assert_eq!(plain, spec);
    assert!(plain.1.contains("context"), "{}", plain.1);
}

#[test]
fn speculation_gives_plain_decodings_tokens_on_every_tiny_model() {
    let (mut drafted, mut accepted) = (0, 0);
    for name in TINY_GENERATIONS {
        for file in ["model-f32.gguf", "model-Q8_0.gguf"] {
            let path = fixtures().join("tiny").join(name).join(file);
            if !path.exists() {
                continue;
            }
            for precision in [Precision::Exact, Precision::Quantized] {
                let opts = ModelOptions {
                    threads: 2,
                    precision,
                    ..Default::default()
                };
                let model = Model::load(&path, opts).unwrap();
                let prompt = repetitive_prompt(model.config().n_vocab);
                for sampler in samplers() {
                    let plain = generate(&model, &prompt, 40, &sampler, None);
                    let spec =
                        generate(&model, &prompt, 40, &sampler, Some(Speculation::default()));
                    let at = format!("{name}/{file} {precision:?} t={}", sampler.temperature);
                    assert_eq!(plain.0, spec.0, "{at}: tokens");
                    assert_eq!(plain.1, spec.1, "{at}: finish");
                    assert!(spec.2.accepted <= spec.2.drafted, "{at}");
                    drafted += spec.2.drafted;
                    accepted += spec.2.accepted;
                }
            }
        }
    }
    println!("tiny models: {accepted} of {drafted} drafted tokens kept");
    assert!(drafted > 0 && accepted > 0, "{accepted} of {drafted}");
}

#[test]
fn speculation_gives_plain_decodings_tokens_on_gemma3_270m() {
    let path = real_model();
    let opts = ModelOptions {
        threads: 2,
        ..Default::default()
    };
    let model = Model::load(&path, opts).unwrap();
    let tok = Tokenizer::from_gguf(&open_file(&path).unwrap()).unwrap();
    let text =
        "The list: apples, pears, plums, apples, pears, plums, apples, pears, plums, apples,";
    let opts = EncodeOptions {
        add_bos: true,
        parse_special: false,
    };
    let prompt = tok.encode(text, opts);
    for sampler in samplers() {
        let plain = generate(&model, &prompt, 48, &sampler, None);
        let spec = generate(&model, &prompt, 48, &sampler, Some(Speculation::default()));
        assert_eq!(plain.0, spec.0, "t={}", sampler.temperature);
        println!(
            "t={}: {} of {} drafted tokens kept in {} verification steps, {} tokens",
            sampler.temperature,
            spec.2.accepted,
            spec.2.drafted,
            spec.2.verify_steps,
            spec.0.len()
        );
        if sampler.temperature == 0.0 {
            assert!(spec.2.accepted > 0, "{:?}", spec.2);
        }
    }
}

/// Drafts of `k` tokens from a draft model.
fn from_model(k: usize) -> Speculation {
    Speculation {
        source: DraftSource::Model,
        ..fixed(k)
    }
}

/// A draft model gives plain decoding's tokens: the same tiny model in
/// f32 drafting for its Q8_0 file (most drafts kept, some not), and tiny
/// models of other generations with the same vocabulary (most refused),
/// draft lengths 1–6, greedy and seeded, `exact` and `q8`; the target's
/// session holds the prompt and the output, the drafts it refused gone.
#[test]
fn a_draft_model_gives_plain_decodings_tokens() {
    let tiny = |name: &str, file: &str| fixtures().join("tiny").join(name).join(file);
    let (mut drafted, mut accepted) = (0, 0);
    for precision in [Precision::Exact, Precision::Quantized] {
        let opts = ModelOptions {
            threads: 2,
            precision,
            ..Default::default()
        };
        let model = Model::load(tiny("gemma3", "model-Q8_0.gguf"), opts.clone()).unwrap();
        let prompt: Vec<u32> = (0..9).map(|i| (5 + 31 * i) % 384).collect();
        for (draft_name, draft_file) in [("gemma3", "model-f32.gguf"), ("gemma2", "model-f32.gguf")]
        {
            let draft = Model::load(tiny(draft_name, draft_file), opts.clone()).unwrap();
            for sampler in samplers() {
                let n = 40;
                let context = prompt.len() + n + 16;
                let (_, plain, _) = run_in(&model, None, &prompt, n, context, &sampler, None);
                let plain = plain.unwrap();
                for k in [1, 3, 6] {
                    let at = format!("{precision:?} {draft_name} t={} k={k}", sampler.temperature);
                    let (_, got, held) = run_in(
                        &model,
                        Some(&draft),
                        &prompt,
                        n,
                        context,
                        &sampler,
                        Some(from_model(k)),
                    );
                    let got = got.unwrap();
                    assert_eq!(plain.0, got.0, "{at}");
                    let mut want = prompt.clone();
                    want.extend_from_slice(&got.0[..got.0.len() - 1]);
                    assert_eq!(held, want, "{at}: the session's tokens");
                    assert!(got.2.drafted > 0, "{at}: {:?}", got.2);
                    if draft_name == "gemma3" {
                        drafted += got.2.drafted;
                        accepted += got.2.accepted;
                    }
                }
            }
        }
    }
    // The same model's f32 weights draft what its Q8_0 weights mostly pick.
    assert!(accepted * 2 > drafted, "{accepted} of {drafted} kept");
}

/// A draft model of another vocabulary is refused by name, and so is
/// drafting from a model without its session.
#[test]
fn a_draft_model_of_another_vocabulary_is_refused() {
    let tiny = |name: &str| fixtures().join("tiny").join(name).join("model-f32.gguf");
    let model = Model::load(tiny("gemma3"), ModelOptions::default()).unwrap();
    let other = Model::load(tiny("gemma4-tools"), ModelOptions::default()).unwrap();
    assert_ne!(model.config().n_vocab, other.config().n_vocab);
    let prompt = [2, 10, 11, 12];
    let sampler = &samplers()[0];
    let (_, got, _) = run_in(
        &model,
        Some(&other),
        &prompt,
        8,
        32,
        sampler,
        Some(from_model(3)),
    );
    let err = got.expect_err("another vocabulary").to_string();
    assert!(err.contains("vocabulary"), "{err}");
    let (_, got, _) = run_in(&model, None, &prompt, 8, 32, sampler, Some(from_model(3)));
    let err = got.expect_err("no draft session").to_string();
    assert!(err.contains("draft model"), "{err}");
}
