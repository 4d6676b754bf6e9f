//! `--chat-template FILE|NAME` on `run`, `chat` and `serve`: a file's
//! template replaces the model's own (or the guessed one), and a value that
//! is neither a file nor a built-in name is an error naming the built-in
//! ones.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;

use common::{json, ok, real_model, rlx, tiny, with_stdin};

/// The text every prompt becomes under [`fixed_template`].
const FIXED: &str = "The capital of France is";

/// A template that ignores the conversation and writes BOS (the model's
/// own piece) and [`FIXED`], so its prompt is `FIXED`'s tokens exactly.
fn fixed_template(name: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("rlx-template-{}-{name}", std::process::id()));
    std::fs::write(&path, format!("{{{{ bos_token }}}}{FIXED}")).unwrap();
    path
}

/// How many tokens `rlx tokenize` makes of [`FIXED`] (BOS included).
fn fixed_tokens(model: &Path) -> usize {
    let out = ok(rlx()
        .args(["tokenize", "--ids", "--text", FIXED, "-m"])
        .arg(model));
    String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .split(',')
        .count()
}

/// `rlx run --json` greedy on `model` with `extra` flags.
fn run_json(model: &Path, extra: &[&str]) -> (serde_json::Value, String) {
    let out = ok(rlx()
        .args(["run", "-n", "4", "--temp", "0", "-t", "1", "--json", "-m"])
        .arg(model)
        .args(extra));
    (json(&out), String::from_utf8(out.stderr).unwrap())
}

#[test]
fn run_renders_the_prompt_with_the_given_template_file() {
    // The tiny model carries its own template, the real one none (a base
    // model, which `run` otherwise gives raw text).
    for model in [tiny(), real_model()] {
        let template = fixed_template("run");
        let t = template.to_str().unwrap();
        let (with, _) = run_json(&model, &["--chat-template", t, "Write a poem."]);
        let (raw, _) = run_json(&model, &["--raw", FIXED]);
        let (own, _) = run_json(&model, &["Write a poem."]);
        assert_eq!(with["prompt_tokens"], fixed_tokens(&model), "{with}");
        assert_ne!(own["prompt_tokens"], with["prompt_tokens"], "{own}");
        // The same prompt tokens, so the same greedy continuation.
        assert_eq!(with["tokens"], raw["tokens"], "{with} against {raw}");
        let _ = std::fs::remove_file(template);
    }
}

#[test]
fn a_builtin_name_applies_that_format_and_no_guess_is_noted() {
    let model = real_model();
    let (raw, _) = run_json(&model, &["Hello"]);
    let (gemma, notes) = run_json(&model, &["--chat-template", "gemma", "Hello"]);
    // `<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n`
    // against `<bos>Hello`.
    assert!(
        gemma["prompt_tokens"].as_u64() > raw["prompt_tokens"].as_u64(),
        "{gemma} against {raw}"
    );
    assert!(notes.contains("is a base model"), "{notes}");
    assert!(!notes.contains("guessed"), "{notes}");
}

/// `rlx chat` with `stdin` piped in: its stderr.
fn chat(model: &Path, extra: &[&str], stdin: &str) -> String {
    let out = with_stdin(
        rlx()
            .args(["chat", "-n", "2", "--temp", "0", "-t", "1", "-m"])
            .arg(model)
            .args(extra),
        stdin.as_bytes(),
    );
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(out.status.success(), "{err}");
    err
}

#[test]
fn chat_takes_the_template_and_says_when_one_was_guessed() {
    let model = real_model();
    let guessed = chat(&model, &[], "Hello\n");
    assert!(
        guessed.contains("`gemma` template, guessed") && guessed.contains("--chat-template"),
        "{guessed}"
    );
    let template = fixed_template("chat");
    let given = chat(
        &model,
        &["--chat-template", template.to_str().unwrap()],
        "Hello\n",
    );
    let want = format!("[prompt {} tokens", fixed_tokens(&model));
    assert!(given.contains(&want), "{want:?} not in {given}");
    assert!(!given.contains("guessed"), "{given}");
    let _ = std::fs::remove_file(template);
}

#[test]
fn an_unknown_template_is_an_error_naming_the_builtin_ones() {
    let model = tiny();
    for sub in ["run", "chat", "serve"] {
        let mut cmd = rlx();
        cmd.args([sub, "--chat-template", "chatml", "-m"])
            .arg(&model);
        if sub == "run" {
            cmd.arg("Hello");
        }
        if sub == "serve" {
            cmd.args(["--port", "0"]);
        }
        let out = cmd.stdin(Stdio::null()).output().unwrap();
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(out.status.code(), Some(1), "rlx {sub}: {err}");
        assert!(
            err.contains("--chat-template chatml") && err.contains("gemma, gemma4"),
            "rlx {sub}: {err}"
        );
    }
    // With --raw there is no template to choose.
    let out = rlx()
        .args(["run", "--raw", "--chat-template", "gemma", "-m"])
        .arg(&model)
        .arg("Hello")
        .output()
        .unwrap();
    assert!(!out.status.success());
}
