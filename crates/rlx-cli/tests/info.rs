//! `rlx info` on the real Gemma 3 270M file and on bad input.

mod common;

use common::{json, ok, real_model, rlx};

#[test]
fn json_lists_the_236_tensors_of_gemma3_270m() {
    let out = ok(rlx().arg("info").arg(real_model()).arg("--json"));
    let v = json(&out);
    assert_eq!(v["version"], 3);
    assert_eq!(v["metadata"]["general.architecture"], "gemma3");
    assert_eq!(v["metadata"]["gemma3.block_count"], 18);
    let tokens = &v["metadata"]["tokenizer.ggml.tokens"];
    assert_eq!(tokens["type"], "string");
    assert_eq!(tokens["len"], 262144);
    assert_eq!(tokens["head"][2], "<bos>");
    let tensors = v["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), 236);
    let count = |ty: &str| tensors.iter().filter(|t| t["type"] == ty).count();
    assert_eq!(
        [
            count("F32"),
            count("Q5_0"),
            count("Q4_K"),
            count("Q8_0"),
            count("Q6_K")
        ],
        [109, 81, 27, 10, 9]
    );
    let embd = tensors
        .iter()
        .find(|t| t["name"] == "token_embd.weight")
        .unwrap();
    assert_eq!(embd["type"], "Q8_0");
    assert_eq!(embd["shape"], serde_json::json!([640, 262144]));
    assert_eq!(embd["bytes"], 178257920u64);
}

#[test]
fn text_output_has_the_tensor_table_and_totals() {
    let out = rlx().arg("info").arg(real_model()).output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("GGUF version 3"));
    assert!(text.contains("tensors:     236"));
    assert!(text.contains("(262144 items)"));
    let totals = text.split("totals by type:").nth(1).unwrap();
    let line = |ty: &str| {
        totals
            .lines()
            .find(|l| l.split_whitespace().next() == Some(ty))
            .unwrap_or_else(|| panic!("no {ty} total"))
            .split_whitespace()
            .nth(1)
            .unwrap()
            .to_owned()
    };
    assert_eq!(line("F32"), "109");
    assert_eq!(line("Q5_0"), "81");
    assert_eq!(line("Q4_K"), "27");
    assert_eq!(line("Q8_0"), "10");
    assert_eq!(line("Q6_K"), "9");
    assert_eq!(line("all"), "236");
}

#[test]
fn a_corrupt_file_is_one_readable_error_line() {
    let dir = std::env::temp_dir().join(format!("rlx-info-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("corrupt.gguf");
    let mut bytes = std::fs::read(real_model())
        .map(|b| b[..4096].to_vec())
        .unwrap();
    bytes[30] = 0xff; // inside the first key's length
    std::fs::write(&path, &bytes).unwrap();
    let out = rlx().arg("info").arg(&path).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains("corrupt.gguf"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");

    let out = rlx()
        .arg("info")
        .arg(dir.join("nope.gguf"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope.gguf"));
    std::fs::remove_dir_all(&dir).unwrap();
}
