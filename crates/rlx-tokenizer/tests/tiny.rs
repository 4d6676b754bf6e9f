//! The tiny test models' vocabularies (tests/fixtures/tiny, 384 pieces): the SentencePiece
//! path on `gemma3` and the Gemma 4 BPE path on `gemma4-dense`, against llama.cpp's ids on
//! the whole corpus (tests/fixtures/tokenizer/tiny-*.jsonl, scripts/tokenizer/reference_ids.py).
//! With so few pieces most text goes through byte fallback, which is the point. Skipped, with
//! a message, where the tiny model files are absent.

mod common;

use std::path::PathBuf;

use rlx_gguf::GgufFile;
use rlx_tokenizer::{
    ChatMessage, ChatOptions, ChatTemplate, EncodeOptions, Tokenizer, TokenizerModel,
};

fn tiny_model(name: &str) -> Option<PathBuf> {
    let p = common::repo_root()
        .join("tests/fixtures/tiny")
        .join(name)
        .join("model-f32.gguf");
    if p.exists() {
        Some(p)
    } else {
        eprintln!(
            "skipping: {} is absent (scripts/tiny/make_tiny_models.py makes it)",
            p.display()
        );
        None
    }
}

fn check(model: &str, expect: TokenizerModel) {
    let Some(path) = tiny_model(model) else {
        return;
    };
    let file = GgufFile::open(&path).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    assert_eq!(tok.model(), expect);

    let pieces = common::read_jsonl(&common::fixture(&format!("tiny-{model}-pieces.jsonl")));
    let head = &pieces[0];
    assert_eq!(
        common::vocab_fnv1a64(&tok),
        head["vocab_fnv1a64"].as_str().unwrap(),
        "{} changed since its references were taken: rerun scripts/tokenizer/reference_ids.py \
         --model {} --out tests/fixtures/tokenizer/tiny-{model}.jsonl --pieces \
         tests/fixtures/tokenizer/tiny-{model}-pieces.jsonl --variants bos_plain,bos_special",
        path.display(),
        path.display()
    );
    assert_eq!(tok.vocab_size() as u64, head["n_tokens"].as_u64().unwrap());
    assert_eq!(tok.bos_id(), Some(head["bos"].as_u64().unwrap() as u32));
    assert_eq!(tok.eos_id(), Some(head["eos"].as_u64().unwrap() as u32));
    assert_eq!(tok.eog_ids(), common::ids(&head["eog"]).as_slice());
    for r in &pieces[1..] {
        let id = r["id"].as_u64().unwrap() as u32;
        assert_eq!(
            tok.token_bytes(id, false),
            common::b64(r["plain"].as_str().unwrap()),
            "{model} piece {id}"
        );
        assert_eq!(
            tok.token_bytes(id, true),
            common::b64(r["special"].as_str().unwrap()),
            "{model} piece {id}"
        );
    }

    let corpus = common::corpus();
    let refs = common::read_jsonl(&common::fixture(&format!("tiny-{model}.jsonl")));
    assert_eq!(corpus.len(), refs.len());
    let mut mismatches = Vec::new();
    let mut checked = 0;
    for (e, r) in corpus.iter().zip(&refs) {
        assert_eq!(e.name, r["name"].as_str().unwrap());
        if r["llama_cpp_aborts"].as_bool() == Some(true) {
            // llama.cpp's BPE pre-split throws on code points above U+10FFFF; here they
            // become U+FFFD and encoding goes on.
            let ids = tok.encode_bytes(&e.bytes, EncodeOptions::default());
            assert!(!ids.is_empty(), "{}", e.name);
            continue;
        }
        for (key, opts) in [
            (
                "bos_plain",
                EncodeOptions {
                    add_bos: true,
                    parse_special: false,
                },
            ),
            (
                "bos_special",
                EncodeOptions {
                    add_bos: true,
                    parse_special: true,
                },
            ),
        ] {
            let want = common::ids(&r[key]);
            let got = tok.encode_bytes(&e.bytes, opts);
            checked += 1;
            if got != want {
                mismatches.push(format!(
                    "{model} {} [{key}]: llama.cpp {want:?}\n  rlx {got:?}",
                    e.name
                ));
            }
        }
    }
    for m in &mismatches {
        eprintln!("{m}");
    }
    eprintln!(
        "{model}: {} of {checked} encodings match llama.cpp",
        checked - mismatches.len()
    );
    assert!(
        mismatches.is_empty(),
        "{model}: {} encodings differ",
        mismatches.len()
    );

    // The tiny files carry a chat template; render it and tokenize the result.
    let chat = ChatTemplate::from_gguf(&file).unwrap();
    assert!(!chat.is_builtin());
    let text = chat
        .render(
            &[
                ChatMessage::user(" Hi "),
                ChatMessage::assistant("Hello"),
                ChatMessage::user("Bye"),
            ],
            &ChatOptions {
                add_generation_prompt: true,
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(
        text,
        "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n\
         <start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    );
    let ids = tok.encode_chat(&text);
    assert_eq!(tok.decode(&ids, true), text);
}

#[test]
fn tiny_gemma3_spm_matches_llama_cpp() {
    check("gemma3", TokenizerModel::SentencePiece);
}

#[test]
fn tiny_gemma4_bpe_matches_llama_cpp() {
    check("gemma4-dense", TokenizerModel::Gemma4Bpe);
}
