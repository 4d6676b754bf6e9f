//! Arbitrary bytes through the tokenizers of the tiny Gemma 3 (SentencePiece)
//! and Gemma 4 (BPE) fixtures: encoding with and without special-token
//! parsing, and decoding arbitrary ids, must never panic, and every id
//! produced must be in the vocabulary.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use rlx_gguf::GgufFile;
use rlx_tokenizer::{EncodeOptions, Tokenizer};

fn tokenizers() -> &'static [Tokenizer] {
    static T: OnceLock<Vec<Tokenizer>> = OnceLock::new();
    T.get_or_init(|| {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/tiny");
        ["gemma3", "gemma4-dense"]
            .iter()
            .map(|m| {
                let f = GgufFile::open(format!("{root}/{m}/model-f32.gguf")).unwrap();
                Tokenizer::from_gguf(&f).unwrap()
            })
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for tok in tokenizers() {
        let vocab = tok.vocab_size();
        for parse_special in [false, true] {
            let ids = tok.encode(
                &text,
                EncodeOptions {
                    add_bos: true,
                    parse_special,
                },
            );
            assert!(ids.iter().all(|&i| (i as usize) < vocab));
            let _ = tok.decode(&ids, parse_special);
        }
        // Arbitrary ids, in and out of range, as the server's detokenize
        // checks them first: only in-range ids are decoded.
        let ids: Vec<u32> = data
            .chunks(2)
            .map(|c| u32::from(c[0]) << 8 | u32::from(*c.get(1).unwrap_or(&0)))
            .filter(|&i| (i as usize) < vocab)
            .collect();
        let mut stream = tok.stream_decoder(false);
        for &i in &ids {
            let _ = stream.push(tok, i);
        }
        let _ = stream.finish();
    }
});
