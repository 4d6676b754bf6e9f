//! Times loading a tokenizer and encoding a file:
//! `cargo run --release -p rlx-tokenizer --example bench_encode MODEL.gguf TEXT_FILE [REPEATS]`

use std::time::Instant;

use rlx_tokenizer::{EncodeOptions, Tokenizer};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        return Err("usage: bench_encode MODEL.gguf TEXT_FILE [REPEATS]".into());
    }
    let t = Instant::now();
    let file = rlx_gguf::GgufFile::open(&args[1])?;
    let tok = Tokenizer::from_gguf(&file)?;
    println!(
        "loaded {} pieces in {:.1} ms",
        tok.vocab_size(),
        t.elapsed().as_secs_f64() * 1e3
    );
    let text = std::fs::read(&args[2])?;
    let repeats: usize = args.get(3).map(|s| s.parse()).transpose()?.unwrap_or(3);
    for _ in 0..repeats {
        let t = Instant::now();
        let ids = tok.encode_bytes(&text, EncodeOptions::default());
        let secs = t.elapsed().as_secs_f64();
        println!(
            "{} bytes -> {} tokens in {:.1} ms ({:.1} MB/s)",
            text.len(),
            ids.len(),
            secs * 1e3,
            text.len() as f64 / 1e6 / secs
        );
    }
    Ok(())
}
