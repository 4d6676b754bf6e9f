//! `rlx quantize`'s library against llama-quantize, byte for byte: the tiny
//! models' `--pure` Q8_0 files (committed beside them, written by
//! llama-quantize) and type mixes (tests/fixtures/quantize). The thread count
//! does not change a byte.

mod common;

use std::path::Path;

use common::{fixtures, TINY_GENERATIONS};
use rlx_gemma::quantize::{plan, quantize_gguf, FileType, QuantizeOptions};
use rlx_gguf::{GgmlType, GgufFile};

fn quantized(src: &Path, file_type: FileType, pure: bool, threads: usize) -> Vec<u8> {
    let file = GgufFile::open(src).unwrap();
    let mut out = Vec::new();
    let opts = QuantizeOptions {
        file_type,
        pure,
        threads,
    };
    quantize_gguf(&file, &opts, &mut out, &mut |_, _| {}).unwrap();
    out
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    if a == b {
        return None;
    }
    Some(
        a.iter()
            .zip(b)
            .position(|(x, y)| x != y)
            .unwrap_or(a.len().min(b.len())),
    )
}

#[test]
fn pure_q8_0_is_llama_quantizes_file_for_every_generation() {
    // Every generation with a committed Q8_0 file (not 3n).
    for m in TINY_GENERATIONS.into_iter().filter(|&m| m != "gemma3n") {
        let dir = fixtures().join("tiny").join(m);
        let ours = quantized(&dir.join("model-f32.gguf"), FileType::Q8_0, true, 2);
        let theirs = std::fs::read(dir.join("model-Q8_0.gguf")).unwrap();
        assert_eq!(first_difference(&ours, &theirs), None, "{m}: files differ");
    }
}

#[test]
fn type_mixes_are_llama_quantizes() {
    let tiny = fixtures().join("tiny");
    let cases = [
        ("gemma3", FileType::Q2_K),
        ("gemma3", FileType::Q3_K_M),
        ("gemma3", FileType::Q4_K_S),
        ("gemma3", FileType::Q4_K_M),
        ("gemma3", FileType::Q5_K_M),
        ("gemma3", FileType::Q6_K),
        ("gemma3", FileType::BF16),
        ("gemma4-moe", FileType::Q4_K_M),
    ];
    for (m, ft) in cases {
        let src = tiny.join(m).join("model-f32.gguf");
        let ours = quantized(&src, ft, false, 3);
        let theirs =
            std::fs::read(fixtures().join("quantize").join(format!("{m}-{ft}.gguf"))).unwrap();
        assert_eq!(
            first_difference(&ours, &theirs),
            None,
            "{m} {ft}: files differ"
        );
        // A mix, not one type: more than one quantized type chosen (Q6_K's
        // rows of 32 all fall back to Q8_0).
        let file = GgufFile::from_bytes(ours).unwrap();
        let types: std::collections::BTreeSet<GgmlType> = file
            .tensors()
            .iter()
            .map(|t| t.ty)
            .filter(|t| t.is_quantized())
            .collect();
        if !matches!(ft, FileType::BF16 | FileType::Q6_K) {
            assert!(types.len() > 1, "{m} {ft}: only {types:?}");
        }
    }
}

#[test]
fn threads_do_not_change_a_byte_and_the_plan_says_what_was_written() {
    let src = fixtures().join("tiny/gemma3/model-f32.gguf");
    let one = quantized(&src, FileType::Q4_K_M, false, 1);
    let three = quantized(&src, FileType::Q4_K_M, false, 3);
    assert!(one == three);
    let file = GgufFile::open(&src).unwrap();
    let p = plan(
        &file,
        &QuantizeOptions {
            file_type: FileType::Q4_K_M,
            pure: false,
            threads: 1,
        },
    )
    .unwrap();
    let written = GgufFile::from_bytes(one).unwrap();
    for t in &p {
        assert_eq!(written.tensor(&t.name).unwrap().ty, t.to, "{}", t.name);
    }
    // Norms and other 1-D tensors stay as they are.
    assert!(p
        .iter()
        .filter(|t| t.name.ends_with("_norm.weight"))
        .all(|t| t.to == t.from));
}
