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
