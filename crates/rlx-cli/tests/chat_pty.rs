//! `rlx chat` driven through a pseudo-terminal: two turns, the second runs
//! only its new tokens (the first turn stays in the KV cache).

mod common;

use common::tiny;

/// The "(K reused ...)" figure of the next turn summary.
fn reused(p: &mut rexpect::session::PtySession) -> (usize, usize) {
    p.exp_string("[prompt ").unwrap();
    let prompt: usize = p.exp_string(" tokens, ").unwrap().trim().parse().unwrap();
    let _ = p.exp_string(" run (").unwrap();
    let reused: usize = p.exp_string(" reused").unwrap().trim().parse().unwrap();
    (prompt, reused)
}

#[test]
fn the_second_turn_reuses_the_first_from_the_cache() {
    let cmd = format!(
        "{} chat -m {} -n 6 --temp 0 -t 1",
        env!("CARGO_BIN_EXE_rlx"),
        tiny().display()
    );
    let mut p = rexpect::spawn(&cmd, Some(60_000)).unwrap();
    p.exp_string("> ").unwrap();
    p.send_line("hello there").unwrap();
    let (first_prompt, first_reused) = reused(&mut p);
    assert_eq!(first_reused, 0);
    p.exp_string("> ").unwrap();
    p.send_line("and again").unwrap();
    let (second_prompt, second_reused) = reused(&mut p);
    assert!(second_prompt > first_prompt);
    assert!(
        second_reused >= first_prompt,
        "second turn reused {second_reused} tokens, the first prompt had {first_prompt}"
    );
    p.exp_string("> ").unwrap();
    p.send_line("/reset").unwrap();
    p.exp_string("(new conversation)").unwrap();
    p.send_line("/quit").unwrap();
    p.exp_eof().unwrap();
}

/// A base model (the real 270M file: no chat template, no instruction-tuned
/// marker) is named as such before the first prompt; a file with its own
/// template (the tiny one above) gets no such line.
#[test]
fn chat_says_when_the_model_is_a_base_model() {
    let cmd = format!(
        "{} chat -m {} -n 2 --temp 0 -t 1",
        env!("CARGO_BIN_EXE_rlx"),
        common::real_model().display()
    );
    let mut p = rexpect::spawn(&cmd, Some(60_000)).unwrap();
    p.exp_string("is a base model").unwrap();
    p.exp_string("rlx run --raw").unwrap();
    p.exp_string("> ").unwrap();
    p.send_line("/quit").unwrap();
    p.exp_eof().unwrap();
    let cmd = format!(
        "{} chat -m {} -n 2 --temp 0 -t 1",
        env!("CARGO_BIN_EXE_rlx"),
        tiny().display()
    );
    let mut p = rexpect::spawn(&cmd, Some(60_000)).unwrap();
    let before = p.exp_string("> ").unwrap();
    assert!(!before.contains("note:"), "{before}");
    p.send_line("/quit").unwrap();
    p.exp_eof().unwrap();
}
