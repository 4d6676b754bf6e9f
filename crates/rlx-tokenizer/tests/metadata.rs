//! Special-token ids the vocabulary does not have are refused by key.

use rlx_gguf::{GgufFile, GgufWriter};
use rlx_tokenizer::{Tokenizer, TokenizerError};

fn file(key: &str, id: u32) -> GgufFile {
    let mut w = GgufWriter::new();
    w.add("general.architecture", "gemma3").unwrap();
    w.add("tokenizer.ggml.model", "llama").unwrap();
    let pieces: Vec<String> = ["<unk>", "<eos>", "<bos>", "a", "b"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    w.add("tokenizer.ggml.tokens", pieces).unwrap();
    w.add("tokenizer.ggml.scores", vec![0f32; 5]).unwrap();
    w.add("tokenizer.ggml.token_type", vec![3i32, 3, 3, 1, 1])
        .unwrap();
    w.add(key, id).unwrap();
    GgufFile::from_bytes(w.to_bytes()).unwrap()
}

#[test]
fn special_ids_outside_the_vocabulary_name_their_key() {
    for key in [
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.eot_token_id",
        "tokenizer.ggml.padding_token_id",
    ] {
        match Tokenizer::from_gguf(&file(key, 4_000_000)) {
            Err(TokenizerError::BadMetadata { key: k, reason }) => {
                assert_eq!(k, key);
                assert!(
                    reason.contains("4000000") && reason.contains("5 tokens"),
                    "{reason}"
                );
            }
            other => panic!("{key}: {:?}", other.map(|_| ())),
        }
        assert!(
            Tokenizer::from_gguf(&file(key, 2)).is_ok(),
            "{key} in range"
        );
    }
}
