//! Parity on the real Gemma 3 270M Q4_K_M file against two references
//! (`scripts/parity/make_gemma3_270m_refs.py`):
//! - transformers loading the same GGUF: the exact float32 math of this
//!   quantized model. Our exact path must match it to rounding.
//! - llama.cpp on the same file, which rounds activations to 8 bits in its
//!   dot products. We must be at least as close to the exact reference as
//!   llama.cpp is, on every measure it records.

mod common;

use common::{argmax, fixtures, read_npy, real_model, rel_l2};
use rlx_gemma::generate::generate;
use rlx_gemma::sampling::{Sampler, SamplerConfig};
use rlx_gemma::{Model, ModelOptions, SessionOptions};
use rlx_runtime::Precision;
use serde_json::Value;

/// Relative L2 to the exact reference on the sampled ids. Measured here:
/// about 1e-6 (float32 rounding of a different summation order); 1e-4 is
/// the budget the issue sets for f32 parity.
const EXACT_REL_L2: f64 = 1e-4;

fn manifest() -> Value {
    let p = fixtures().join("gemma3-270m/manifest.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn model(precision: Precision) -> Model {
    Model::load(
        real_model(),
        ModelOptions {
            threads: 2,
            precision,
            ..ModelOptions::default()
        },
    )
    .unwrap()
}

fn tokens(entry: &Value) -> Vec<u32> {
    entry["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

struct Figures {
    rel_l2_sample: f64,
    top1: f64,
}

/// Scores one prompt and compares with the stored exact reference.
fn compare(model: &Model, name: &str, entry: &Value) -> Figures {
    let dir = fixtures().join("gemma3-270m");
    let sample: Vec<usize> = read_npy(&dir.join("sample_ids.npy"))
        .i32s()
        .into_iter()
        .map(|i| i as usize)
        .collect();
    let hf_sample = read_npy(&dir.join(format!("{name}.hf_sample.npy"))).f32s();
    let hf_top = read_npy(&dir.join(format!("{name}.hf_top_ids.npy")));
    let top_k = hf_top.shape[1];
    let hf_top = hf_top.i32s();
    let toks = tokens(entry);
    let vocab = model.config().n_vocab;
    let mut s = model
        .session(SessionOptions {
            context: Some(toks.len()),
            prefill_chunk: 256,
            ..Default::default()
        })
        .unwrap();
    let logits = s.score(&toks).unwrap();
    let ours: Vec<f32> = logits
        .chunks(vocab)
        .flat_map(|row| sample.iter().map(|&i| row[i]).collect::<Vec<_>>())
        .collect();
    let agree = logits
        .chunks(vocab)
        .enumerate()
        .filter(|(p, row)| argmax(row) as i32 == hf_top[p * top_k])
        .count();
    Figures {
        rel_l2_sample: rel_l2(&ours, &hf_sample),
        top1: agree as f64 / toks.len() as f64,
    }
}

#[test]
fn exact_path_matches_transformers_and_beats_llama_cpp() {
    let m = manifest();
    let exact = model(Precision::Exact);
    let q8 = model(Precision::Quantized);
    for (name, entry) in m["prompts"].as_object().unwrap() {
        let llama = &entry["llama_vs_hf"];
        let llama_l2 = llama["rel_l2_sample"].as_f64().unwrap();
        let llama_top1 = llama["top1_agreement"].as_f64().unwrap();
        let f = compare(&exact, name, entry);
        let g = compare(&q8, name, entry);
        eprintln!(
            "{name}: exact rel L2 {:.2e} top-1 {:.4} | q8 rel L2 {:.2e} top-1 {:.4} | llama.cpp rel L2 {:.2e} top-1 {:.4}",
            f.rel_l2_sample, f.top1, g.rel_l2_sample, g.top1, llama_l2, llama_top1
        );
        assert!(
            f.rel_l2_sample < EXACT_REL_L2,
            "{name}: {}",
            f.rel_l2_sample
        );
        assert!(f.rel_l2_sample <= llama_l2);
        assert!(
            f.top1 >= llama_top1,
            "{name}: top-1 {} < llama.cpp {llama_top1}",
            f.top1
        );
        // The 8-bit path is in llama.cpp's league, not better by design.
        assert!(
            g.rel_l2_sample < 4.0 * llama_l2,
            "{name}: q8 {}",
            g.rel_l2_sample
        );
    }
}

#[test]
fn greedy_continuations_follow_the_exact_reference() {
    let m = manifest();
    let exact = model(Precision::Exact);
    for (name, entry) in m["prompts"].as_object().unwrap() {
        let Some(hf) = entry["hf_greedy"].as_array() else {
            continue;
        };
        let hf: Vec<u32> = hf.iter().map(|t| t.as_u64().unwrap() as u32).collect();
        let llama = &entry["llama_vs_hf"];
        let clear = llama["greedy_clear_steps"].as_u64().unwrap() as usize;
        let llama_agree = llama["greedy_agree"].as_u64().unwrap() as usize;
        let prompt = tokens(entry);
        let mut s = exact
            .session(SessionOptions {
                context: Some(prompt.len() + hf.len()),
                ..Default::default()
            })
            .unwrap();
        let sampler = Sampler::new(SamplerConfig::default()).unwrap();
        let (ours, _, _) = generate(&mut s, &prompt, hf.len(), sampler, &[]).unwrap();
        let agree = ours.iter().zip(&hf).take_while(|(a, b)| a == b).count();
        eprintln!(
            "{name}: greedy agrees for {agree} steps (llama.cpp {llama_agree}; reference margin ≥ 0.05 for the first {clear})"
        );
        assert!(
            agree >= clear.min(hf.len()),
            "{name}: diverged at {agree} before {clear}"
        );
        assert!(agree >= llama_agree.min(clear), "{name}");
    }
}

#[test]
fn incremental_decode_matches_a_single_prefill() {
    let m = manifest();
    let entry = &m["prompts"]["prose"];
    let toks = tokens(entry);
    let exact = model(Precision::Exact);
    let vocab = exact.config().n_vocab;
    let opts = SessionOptions {
        context: Some(toks.len()),
        prefill_chunk: 16,
        ..Default::default()
    };
    let mut whole = exact.session(opts.clone()).unwrap();
    let all = whole.score(&toks).unwrap();
    let mut inc = exact.session(opts).unwrap();
    let split = toks.len() - 6;
    inc.feed(&toks[..split]).unwrap();
    for (i, &t) in toks[split..].iter().enumerate() {
        let logits = inc.feed(&[t]).unwrap();
        let want = &all[(split + i) * vocab..(split + i + 1) * vocab];
        let err = rel_l2(&logits, want);
        assert!(err < 1e-5, "step {i}: relative L2 {err}");
    }
}
