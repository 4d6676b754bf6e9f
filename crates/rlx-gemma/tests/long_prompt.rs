//! A prompt longer than 2,048 tokens prefills in chunks and gives the same
//! logits as one unchunked pass over the real Gemma 3 270M file (the sliding
//! layers' rings and the full layers' caches both see chunk boundaries).

mod common;

use common::{fixtures, real_model, rel_l2};
use rlx_gemma::{Model, ModelOptions, SessionOptions};
use rlx_runtime::Precision;

#[test]
fn a_2100_token_prompt_in_chunks_matches_one_pass() {
    let manifest: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("gemma3-270m/manifest.json")).unwrap(),
    )
    .unwrap();
    let long: Vec<u32> = manifest["prompts"]["long"]["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    // BOS once, then the text's tokens repeated to 2,100.
    let mut toks = vec![2u32];
    toks.extend(long[1..].iter().cycle().take(2099));
    let model = Model::load(
        real_model(),
        ModelOptions {
            threads: 2,
            precision: Precision::Exact,
            ..ModelOptions::default()
        },
    )
    .unwrap();
    let run = |chunk: usize| {
        let mut s = model
            .session(SessionOptions {
                context: Some(toks.len()),
                prefill_chunk: chunk,
                ..Default::default()
            })
            .unwrap();
        let logits = s.feed(&toks).unwrap();
        assert_eq!(s.tokens().len(), 2100);
        logits
    };
    let chunked = run(512);
    let whole = run(2100);
    let err = rel_l2(&chunked, &whole);
    eprintln!("2,100 tokens, chunks of 512 vs one pass: relative L2 {err:.2e}");
    assert!(err < 1e-5, "relative L2 {err}");
}
