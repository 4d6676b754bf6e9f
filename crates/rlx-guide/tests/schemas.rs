//! JSON schemas on the real Gemma 3 270M file: for each of the committed
//! schemas, 10 outputs sampled at temperature 1 under the schema all parse
//! and validate (checked with the `jsonschema` crate); the same prompts
//! without the constraint rarely give valid JSON (the rate is printed).
//! Needs `RLX_TEST_MODEL` (scripts/test.sh sets it).

use std::sync::Arc;

use rlx_gemma::generate::{generate_constrained, Constraint};
use rlx_gemma::sampling::{Sampler, SamplerConfig};
use rlx_gemma::{Model, ModelOptions, Precision, SessionOptions};
use rlx_guide::{Spec, Vocabulary};
use rlx_tokenizer::{EncodeOptions, Tokenizer};
use serde_json::Value;

const SAMPLES: u64 = 10;
const MAX_TOKENS: usize = 160;

fn model() -> Model {
    let path = std::env::var("RLX_TEST_MODEL")
        .expect("RLX_TEST_MODEL names the Gemma 3 270M file (scripts/test.sh sets it)");
    Model::load(
        path,
        ModelOptions {
            precision: Precision::Quantized,
            ..ModelOptions::default()
        },
    )
    .unwrap()
}

/// Text generated for `prompt`, within `constraint` if given.
fn sample(
    model: &Model,
    tok: &Tokenizer,
    prompt: &[u32],
    seed: u64,
    constraint: Option<&mut dyn Constraint>,
) -> String {
    let mut session = model
        .session(SessionOptions {
            context: Some(prompt.len() + MAX_TOKENS + 1),
            ..Default::default()
        })
        .unwrap();
    let mut sampler = Sampler::new(SamplerConfig {
        temperature: 1.0,
        seed,
        ..SamplerConfig::default()
    })
    .unwrap();
    let (out, _, _) = generate_constrained(
        &mut session,
        prompt,
        MAX_TOKENS,
        &mut sampler,
        tok.eog_ids(),
        constraint,
        &mut |_| true,
        &mut |_, _| {},
    )
    .unwrap();
    let out: Vec<u32> = out.into_iter().filter(|t| !tok.is_eog(*t)).collect();
    tok.decode(&out, false)
}

#[test]
fn every_sampled_output_matches_its_schema() {
    let model = model();
    let tok = Arc::new(Tokenizer::from_gguf(model.file()).unwrap());
    let vocab = Vocabulary::new(Arc::clone(&tok)).unwrap();
    let schemas: Vec<Value> = serde_json::from_str(include_str!("data/schemas.json")).unwrap();
    assert!(schemas.len() >= 30);
    let (mut valid, mut valid_free, mut total) = (0, 0, 0);
    let (mut mask_secs, mut masks) = (0.0, 0);
    let mut failures = Vec::new();
    for entry in &schemas {
        let name = entry["name"].as_str().unwrap();
        let schema = &entry["schema"];
        let validator = jsonschema::validator_for(schema).unwrap();
        let text = format!("A JSON value ({name}) with this schema: {schema}\nJSON:");
        let prompt = tok.encode(&text, EncodeOptions::default());
        for seed in 0..SAMPLES {
            total += 1;
            let mut guide = vocab.guide(&Spec::JsonSchema(schema.clone())).unwrap();
            let out = sample(&model, &tok, &prompt, seed, Some(&mut guide));
            let (s, n) = guide.mask_seconds();
            mask_secs += s;
            masks += n;
            match serde_json::from_str::<Value>(&out) {
                Ok(v) if validator.is_valid(&v) => valid += 1,
                Ok(v) => failures.push(format!("{name} seed {seed}: {v} does not validate")),
                Err(e) => failures.push(format!("{name} seed {seed}: {out:?}: {e}")),
            }
            // Unconstrained, only the rate matters (one sample per schema).
            if seed == 0 {
                let free = sample(&model, &tok, &prompt, seed, None);
                let free = free.trim();
                if serde_json::from_str::<Value>(free).is_ok_and(|v| validator.is_valid(&v)) {
                    valid_free += 1;
                }
            }
        }
    }
    println!(
        "{valid} of {total} constrained outputs valid; unconstrained {valid_free} of {}; \
         mask {:.3} ms per token over {masks} tokens",
        schemas.len(),
        1e3 * mask_secs / masks.max(1) as f64
    );
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn bad_schemas_and_expressions_are_errors_that_say_why() {
    let model = model();
    let tok = Arc::new(Tokenizer::from_gguf(model.file()).unwrap());
    let vocab = Vocabulary::new(tok).unwrap();
    for (spec, says) in [
        (Spec::Regex("(unclosed".into()), "regular expression"),
        (
            Spec::JsonSchema(serde_json::json!({"type": "no-such-type"})),
            "JSON schema",
        ),
        (Spec::Lark("start: undefined_rule".into()), "grammar"),
    ] {
        let e = vocab.guide(&spec).err().expect("refused").to_string();
        assert!(e.contains(says), "{e}");
    }
}
