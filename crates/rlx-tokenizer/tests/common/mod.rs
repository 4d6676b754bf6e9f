//! Shared test helpers: the model file, the corpus and the fixtures.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use base64::Engine;
use rlx_gguf::GgufFile;
use rlx_tokenizer::Tokenizer;

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn fixture(name: &str) -> PathBuf {
    repo_root().join("tests/fixtures/tokenizer").join(name)
}

/// `$RLX_TEST_MODEL`, or the Gemma 3 270M file in the rlx model cache.
pub fn model_path() -> PathBuf {
    if let Ok(p) = std::env::var("RLX_TEST_MODEL") {
        return PathBuf::from(p);
    }
    let dir = match std::env::var("RLX_HOME") {
        Ok(h) => PathBuf::from(h),
        Err(_) => {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/rlx/models")
        }
    };
    dir.join("gemma-3-270m-q4_k_m.gguf")
}

pub fn gemma3() -> &'static (GgufFile, Tokenizer) {
    static CELL: OnceLock<(GgufFile, Tokenizer)> = OnceLock::new();
    CELL.get_or_init(|| {
        let path = model_path();
        assert!(
            path.exists(),
            "model file {} is missing: run `bash scripts/fetch-model.sh` (or set RLX_TEST_MODEL)",
            path.display()
        );
        let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let tok = Tokenizer::from_gguf(&file).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        (file, tok)
    })
}

pub fn read_jsonl(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.split('\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {e}: {l}", path.display())))
        .collect()
}

pub fn b64(s: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .expect("base64")
}

pub struct CorpusEntry {
    pub name: String,
    pub bytes: Vec<u8>,
    pub valid_utf8: bool,
}

/// The corpus file; `$RLX_TOKENIZER_CORPUS` points the tests at another one
/// (with `$RLX_TOKENIZER_REFERENCE` for its llama.cpp ids).
pub fn corpus_path() -> PathBuf {
    std::env::var("RLX_TOKENIZER_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|_| fixture("corpus.jsonl"))
}

pub fn reference_path() -> PathBuf {
    std::env::var("RLX_TOKENIZER_REFERENCE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| fixture("gemma3-270m.jsonl"))
}

pub fn corpus() -> Vec<CorpusEntry> {
    read_jsonl(&corpus_path())
        .into_iter()
        .map(|r| {
            let name = r["name"].as_str().unwrap().to_owned();
            if r["invalid_utf8"].as_bool() == Some(true) {
                CorpusEntry {
                    name,
                    bytes: b64(r["b64"].as_str().unwrap()),
                    valid_utf8: false,
                }
            } else {
                let text = r["text"].as_str().unwrap().to_owned();
                CorpusEntry {
                    name,
                    bytes: text.into_bytes(),
                    valid_utf8: true,
                }
            }
        })
        .collect()
}

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// FNV-1a over every piece and a NUL, as scripts/tokenizer/reference_ids.py writes it into the
/// pieces fixtures: tells whether a model file still has the vocabulary a reference was taken on.
pub fn vocab_fnv1a64(tok: &Tokenizer) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for id in 0..tok.vocab_size() as u32 {
        for &b in tok.piece(id).unwrap().as_bytes().iter().chain(&[0u8]) {
            h = (h ^ b as u64).wrapping_mul(0x100000001b3);
        }
    }
    format!("{h:016x}")
}
