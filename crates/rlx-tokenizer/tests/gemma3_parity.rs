//! Gemma 3 270M tokenizer against llama.cpp, token for token.
//!
//! Reference: tests/fixtures/tokenizer/gemma3-270m.jsonl, from llama.cpp's own tokenizer
//! (scripts/tokenizer/reference_ids.py) on tests/fixtures/tokenizer/corpus.jsonl. Tolerance:
//! none; every mismatch is listed. `$RLX_TOKENIZER_CORPUS` and `$RLX_TOKENIZER_REFERENCE` run
//! the same check on a larger, generated corpus.

mod common;

use rlx_tokenizer::{EncodeOptions, TokenKind, TokenizerModel};

#[test]
fn corpus_matches_llama_cpp_token_for_token() {
    let (_, tok) = common::gemma3();
    let head = &common::read_jsonl(&common::fixture("gemma3-270m-pieces.jsonl"))[0];
    assert_eq!(
        common::vocab_fnv1a64(tok),
        head["vocab_fnv1a64"].as_str().unwrap(),
        "{} is not the vocabulary the references were taken on ({})",
        common::model_path().display(),
        head["model"]
    );
    let corpus = common::corpus();
    let refs = common::read_jsonl(&common::reference_path());
    assert_eq!(
        corpus.len(),
        refs.len(),
        "corpus and reference files disagree; regenerate both"
    );
    assert!(
        corpus.len() >= 300,
        "corpus has only {} strings",
        corpus.len()
    );

    let variants = [
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
        (
            "plain",
            EncodeOptions {
                add_bos: false,
                parse_special: false,
            },
        ),
    ];
    let mut mismatches = Vec::new();
    let mut checked = 0;
    for (entry, r) in corpus.iter().zip(&refs) {
        assert_eq!(entry.name, r["name"].as_str().unwrap());
        for (key, opts) in variants {
            let want = common::ids(&r[key]);
            let got = tok.encode_bytes(&entry.bytes, opts);
            checked += 1;
            if got != want {
                let at = got
                    .iter()
                    .zip(&want)
                    .position(|(a, b)| a != b)
                    .unwrap_or(got.len().min(want.len()));
                let show = |ids: &[u32]| -> Vec<String> {
                    ids.iter()
                        .skip(at.saturating_sub(2))
                        .take(8)
                        .map(|&i| format!("{i}:{:?}", tok.piece(i).unwrap_or("?")))
                        .collect()
                };
                mismatches.push(format!(
                    "{} [{key}] input {:?}: first difference at {at}\n  llama.cpp {:?}\n  rlx       {:?}",
                    entry.name,
                    String::from_utf8_lossy(&entry.bytes).chars().take(80).collect::<String>(),
                    show(&want),
                    show(&got),
                ));
            }
        }
    }
    for m in &mismatches {
        eprintln!("{m}");
    }
    eprintln!(
        "{} of {checked} encodings of {} strings match llama.cpp",
        checked - mismatches.len(),
        corpus.len()
    );
    assert!(
        mismatches.is_empty(),
        "{} encodings differ from llama.cpp",
        mismatches.len()
    );
}

#[test]
fn pieces_and_special_ids_match_llama_cpp() {
    let (_, tok) = common::gemma3();
    let rows = common::read_jsonl(&common::fixture("gemma3-270m-pieces.jsonl"));
    let head = &rows[0];
    assert_eq!(tok.model(), TokenizerModel::SentencePiece);
    assert_eq!(tok.vocab_size() as u64, head["n_tokens"].as_u64().unwrap());
    assert_eq!(tok.bos_id(), Some(head["bos"].as_u64().unwrap() as u32));
    assert_eq!(tok.eos_id(), Some(head["eos"].as_u64().unwrap() as u32));
    assert_eq!(tok.eot_id(), Some(head["eot"].as_u64().unwrap() as u32));
    assert_eq!(tok.eog_ids(), common::ids(&head["eog"]).as_slice());
    let mut bad = Vec::new();
    for r in &rows[1..] {
        let id = r["id"].as_u64().unwrap() as u32;
        for (key, special) in [("plain", false), ("special", true)] {
            let want = common::b64(r[key].as_str().unwrap());
            if tok.token_bytes(id, special) != want.as_slice() {
                bad.push(format!(
                    "{id} {:?} [{key}]: llama.cpp {want:?}, rlx {:?}",
                    tok.piece(id),
                    tok.token_bytes(id, special)
                ));
            }
        }
    }
    for b in &bad {
        eprintln!("{b}");
    }
    assert!(
        bad.is_empty(),
        "{} of {} pieces differ",
        bad.len(),
        2 * (rows.len() - 1)
    );
}

#[test]
fn known_ids_and_kinds() {
    let (_, tok) = common::gemma3();
    assert_eq!(tok.id_of("<start_of_turn>"), Some(105));
    assert_eq!(tok.id_of("<end_of_turn>"), Some(106));
    assert_eq!(tok.piece(2), Some("<bos>"));
    assert_eq!(tok.token_kind(2), Some(TokenKind::Control));
    assert_eq!(tok.token_kind(107), Some(TokenKind::UserDefined));
    assert_eq!(tok.token_kind(238), Some(TokenKind::Byte));
    assert!(tok.is_eog(1) && tok.is_eog(106) && !tok.is_eog(2));
    assert!(tok.add_bos());
    assert_eq!(tok.encode("", EncodeOptions::default()), vec![2]);
    assert_eq!(
        tok.encode(
            "",
            EncodeOptions {
                add_bos: false,
                parse_special: false
            }
        ),
        Vec::<u32>::new()
    );
}

#[test]
fn set_add_bos_switches_bos_off() {
    let path = common::model_path();
    let _ = common::gemma3(); // reports a missing model first
    let file = rlx_gguf::GgufFile::open(&path).unwrap();
    let mut tok = rlx_tokenizer::Tokenizer::from_gguf(&file).unwrap();
    tok.set_add_bos(false);
    assert_eq!(
        tok.encode("Hello world", EncodeOptions::default()),
        vec![9259, 1902]
    );
}
