//! Sessions on a tiny Gemma 3 model: prefix reuse, rewind, context and
//! memory limits, and config errors that name the key.

mod common;

use common::{fixtures, rel_l2};
use rlx_gemma::{ConfigError, GemmaConfig, Model, ModelError, ModelOptions, SessionOptions};
use rlx_gguf::{GgufFile, GgufWriter};

fn model() -> Model {
    Model::load(
        fixtures().join("tiny/gemma3/model-f32.gguf"),
        ModelOptions {
            threads: 1,
            ..Default::default()
        },
    )
    .unwrap()
}

fn toks(n: usize, salt: u32) -> Vec<u32> {
    std::iter::once(2)
        .chain((1..n as u32).map(|i| (i * 37 + salt) % 300 + 5))
        .collect()
}

#[test]
fn a_continued_conversation_runs_only_the_new_tokens() {
    let m = model();
    let opts = SessionOptions {
        context: Some(64),
        prefill_chunk: 8,
        ..Default::default()
    };
    let first = toks(20, 1);
    let mut second = first.clone();
    second.extend(toks(9, 7).into_iter().skip(1));
    let mut s = m.session(opts.clone()).unwrap();
    s.feed_prompt(&first).unwrap();
    assert_eq!(s.computed_tokens(), 20);
    let reused = s.feed_prompt(&second).unwrap();
    assert_eq!(s.computed_tokens(), 28, "only the 8 new tokens run");
    let mut fresh = m.session(opts).unwrap();
    let want = fresh.feed_prompt(&second).unwrap();
    assert!(rel_l2(&reused, &want) < 1e-6);
}

#[test]
fn rewinding_inside_and_past_the_window_gives_the_same_logits() {
    let m = model();
    let all = toks(40, 3);
    let opts = SessionOptions {
        context: Some(64),
        prefill_chunk: 4,
        ..Default::default()
    };
    let mut whole = m.session(opts.clone()).unwrap();
    let want = whole.feed(&all[..30]).unwrap();
    // Rewind by 2 (the window still holds what position 28 needs) and by 20
    // (it does not: the session re-runs the kept prefix).
    for back in [2usize, 20] {
        let mut s = m.session(opts.clone()).unwrap();
        s.feed(&all).unwrap();
        s.rewind(30 - back).unwrap();
        assert_eq!(s.tokens().len(), 30 - back);
        let got = s.feed(&all[30 - back..30]).unwrap();
        let err = rel_l2(&got, &want);
        assert!(err < 1e-6, "rewind by {back}: {err}");
    }
}

#[test]
fn limits_are_errors_not_truncation() {
    let m = model();
    let mut s = m
        .session(SessionOptions {
            context: Some(16),
            ..Default::default()
        })
        .unwrap();
    let e = s.feed(&toks(17, 1)).unwrap_err();
    assert!(
        matches!(
            e,
            ModelError::ContextFull {
                tokens: 17,
                context: 16
            }
        ),
        "{e}"
    );
    assert!(s.tokens().is_empty());
    let e = s.feed(&[100_000]).unwrap_err();
    assert!(e.to_string().contains("100000"), "{e}");
    let Err(e) = m.session(SessionOptions {
        context: Some(1 << 20),
        memory_limit_bytes: Some(1 << 20),
        ..Default::default()
    }) else {
        panic!("a 1 MiB limit cannot hold a 1M-token cache")
    };
    assert!(matches!(e, ModelError::OutOfMemory { .. }), "{e}");
}

#[test]
fn config_errors_name_the_key() {
    let base = GgufFile::open(fixtures().join("tiny/gemma3/model-f32.gguf")).unwrap();
    let rewrite = |skip: &str, extra: Option<(&str, rlx_gguf::Value)>| {
        let mut w = GgufWriter::new();
        for (k, v) in base.metadata() {
            if k != skip {
                w.add(k, v.clone()).unwrap();
            }
        }
        if let Some((k, v)) = extra {
            w.add(k, v).unwrap();
        }
        for t in base.tensors() {
            w.add_tensor(&t.name, t.ty, &t.dims, base.tensor_data(t).to_vec())
                .unwrap();
        }
        GgufFile::from_bytes(w.to_bytes()).unwrap()
    };
    let e = GemmaConfig::from_gguf(&rewrite("gemma3.block_count", None)).unwrap_err();
    assert_eq!(
        e,
        ConfigError::Missing {
            key: "gemma3.block_count".into()
        }
    );
    let e = GemmaConfig::from_gguf(&rewrite(
        "gemma3.attention.head_count_kv",
        Some(("gemma3.attention.head_count_kv", 3u32.into())),
    ))
    .unwrap_err();
    assert!(
        e.to_string().contains("gemma3.attention.head_count_kv"),
        "{e}"
    );
    let e = GemmaConfig::from_gguf(&rewrite(
        "general.architecture",
        Some(("general.architecture", "llama".into())),
    ))
    .unwrap_err();
    assert!(e.to_string().contains("llama"), "{e}");
}
