//! K/V cache types on the CPU: every type against the f32 cache on tiny
//! models of each generation (exact path), keys and values of different
//! types, the memory each type takes, and a clear refusal where head sizes
//! do not fit a block type.

mod common;

use common::{fixtures, rel_l2};
use rlx_gemma::{KvDType, KvTypes, Model, ModelOptions, Precision, SessionOptions};

fn load(rel: &str) -> Model {
    let path = fixtures().join("tiny").join(rel);
    Model::load(
        &path,
        ModelOptions {
            threads: 2,
            precision: Precision::Exact,
            ..ModelOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn score(model: &Model, types: KvTypes, tokens: &[u32], chunk: usize) -> Vec<f32> {
    let mut s = model
        .session(SessionOptions {
            context: Some(tokens.len()),
            prefill_chunk: chunk,
            kv_types: Some(types),
            ..SessionOptions::default()
        })
        .unwrap();
    s.score(tokens).unwrap()
}

#[test]
fn every_cache_type_stays_near_the_f32_cache_in_order_of_its_bits() {
    // What rounding K/V to each type costs: relative L2 of all positions'
    // logits against the f32 cache (40 tokens, chunks of 16, so blocks are
    // written, read back and copied). Measured on these fixtures: f16
    // 3e-4 – 5.7e-3, bf16 2.4e-3 – 3.9e-2, q8_0 8e-3 – 0.12, q4_0 0.13 –
    // 0.41, K q8_0 / V q4_0 0.1 – 0.34 (Gemma 3n's sparsity cut-off the
    // most sensitive; random tiny models amplify, BENCHMARKS.md has the
    // real model's perplexity). The bounds are about twice the worst, and
    // every model must order the types by their bits: a type written or
    // read as another, or keys and values swapped, breaks the order.
    let types = [
        (KvTypes::both(KvDType::F16), 1.2e-2),
        (KvTypes::both(KvDType::BF16), 8e-2),
        (KvTypes::both(KvDType::Q8_0), 0.25),
        (
            KvTypes {
                k: KvDType::Q8_0,
                v: KvDType::Q4_0,
            },
            0.7,
        ),
        (KvTypes::both(KvDType::Q4_0), 0.8),
    ];
    for m in [
        "gemma3/model-f32.gguf",
        "gemma3-q/model-Q8_0.gguf",
        "gemma3n/model-f32.gguf",
        "gemma4-ple/model-f32.gguf",
        "gemma4-moe/model-f32.gguf",
    ] {
        let model = load(m);
        let vocab = model.config().n_vocab;
        let tokens: Vec<u32> = (0..40).map(|i| ((i * 7919 + 2) % vocab) as u32).collect();
        let base = score(&model, KvTypes::both(KvDType::F32), &tokens, 16);
        let mut last = 0.0;
        for (t, bound) in types {
            let e = rel_l2(&score(&model, t, &tokens, 16), &base);
            eprintln!("{m}: {t} K/V against f32, rel L2 {e:.2e}");
            assert!(e < bound, "{m}: {t}: {e:.2e} ≥ {bound:e}");
            assert!(
                e > last,
                "{m}: {t} ({e:.2e}) is no further off than the type before"
            );
            last = e;
        }
    }
}

#[test]
fn block_caches_give_the_same_logits_in_any_chunking() {
    // The exact path does not depend on how a prompt is split into steps,
    // and a block type rounds each row by itself: whole-prompt and
    // 7-token-chunk scoring must agree to f32 rounding, whatever the type
    // (blocks written across chunk edges, copied and read back).
    for m in ["gemma3/model-f32.gguf", "gemma4-ple/model-f32.gguf"] {
        let model = load(m);
        let vocab = model.config().n_vocab;
        let tokens: Vec<u32> = (0..40).map(|i| ((i * 7919 + 2) % vocab) as u32).collect();
        for t in [KvDType::Q8_0, KvDType::Q4_0] {
            let whole = score(&model, KvTypes::both(t), &tokens, 64);
            let chunked = score(&model, KvTypes::both(t), &tokens, 7);
            let e = rel_l2(&chunked, &whole);
            assert!(e < 1e-6, "{m}: {t}: chunked against whole, rel L2 {e:.2e}");
        }
    }
}

#[test]
fn block_types_take_their_share_of_the_memory() {
    // Per element: f32 4 bytes, f16 2, Q8_0 34/32, Q4_0 18/32.
    let model = load("gemma3-q/model-Q8_0.gguf");
    let bytes = |types| model.kv_config(4096, 16, 512, types).memory_bytes();
    let f32 = bytes(KvTypes::both(KvDType::F32));
    for (t, num, den) in [
        (KvDType::F16, 2, 4),
        (KvDType::Q8_0, 34, 128),
        (KvDType::Q4_0, 18, 128),
    ] {
        assert_eq!(bytes(KvTypes::both(t)) * den, f32 * num, "{t}");
    }
    let mixed = bytes(KvTypes {
        k: KvDType::Q8_0,
        v: KvDType::Q4_0,
    });
    // K and V have the same width here, so each takes half of f32's bytes.
    assert_eq!(mixed * 256, f32 * (34 + 18));
}

#[test]
fn a_block_type_with_heads_of_another_size_is_refused_by_layer() {
    // gemma4-odd's heads have 20 and 40 elements: no whole 32-element block.
    let model = load("gemma4-odd/hf");
    let err = model
        .session(SessionOptions {
            context: Some(16),
            kv_types: Some(KvTypes::both(KvDType::Q8_0)),
            ..SessionOptions::default()
        })
        .err()
        .expect("q8_0 needs heads of whole blocks");
    let msg = err.to_string();
    assert!(
        msg.contains("q8_0") && msg.contains("layer 0") && msg.contains("20"),
        "{msg}"
    );
}
