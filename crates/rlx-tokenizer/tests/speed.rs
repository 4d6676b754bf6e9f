//! Encoding speed on ~1 MB inputs. Prints times only; no assertion on them, since the
//! machine is shared. Run with `--release -- --nocapture` to see release-build numbers.

mod common;

use std::time::Instant;

use rlx_tokenizer::EncodeOptions;

fn megabyte_of(parts: &[&str]) -> String {
    let mut s = String::new();
    while s.len() < 1 << 20 {
        for p in parts {
            s.push_str(p);
            s.push('\n');
        }
    }
    s
}

#[test]
fn encode_one_megabyte() {
    let (_, tok) = common::gemma3();
    let corpus = common::corpus();
    let texts: Vec<String> = corpus
        .iter()
        .filter(|e| e.valid_utf8)
        .map(|e| String::from_utf8(e.bytes.clone()).unwrap())
        .collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let inputs = [
        ("corpus mix", megabyte_of(&refs)),
        ("spaces only", " ".repeat(1 << 20)),
        (
            "CJK, no spaces",
            "机器学习是人工智能的一个分支".repeat((1 << 20) / 42),
        ),
        ("one long word", "abcdefghij".repeat(1 << 17)),
    ];
    for (what, text) in &inputs {
        for parse_special in [false, true] {
            let opts = EncodeOptions {
                add_bos: true,
                parse_special,
            };
            let t = Instant::now();
            let ids = tok.encode(text, opts);
            let secs = t.elapsed().as_secs_f64();
            eprintln!(
                "{what:>15}, parse_special {parse_special:>5}: {:.2} MB -> {} tokens in {:.1} ms ({:.1} MB/s)",
                text.len() as f64 / 1e6,
                ids.len(),
                secs * 1e3,
                text.len() as f64 / 1e6 / secs
            );
            assert_eq!(
                tok.decode(&ids, parse_special).len(),
                text.len() + if parse_special { 5 } else { 0 }
            );
        }
    }
}
