//! Arbitrary conversations through the chat templates rlx ships and reads
//! (the built-in Gemma one and the committed Jinja templates), and arbitrary
//! Jinja sources over a fixed conversation: rendering returns text or an
//! error, never panics or hangs (templates run on fuel).
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use rlx_tokenizer::{ChatMessage, ChatOptions, ChatTemplate};

fn templates() -> &'static [ChatTemplate] {
    static T: OnceLock<Vec<ChatTemplate>> = OnceLock::new();
    T.get_or_init(|| {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/tokenizer/templates"
        );
        let mut t = vec![ChatTemplate::gemma()];
        for e in std::fs::read_dir(dir).unwrap() {
            let src = std::fs::read_to_string(e.unwrap().path()).unwrap();
            if let Ok(j) = ChatTemplate::from_jinja(&src, "<bos>", "<eos>") {
                t.push(j);
            }
        }
        t
    })
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    // Messages: lines of "role:content".
    let messages: Vec<ChatMessage> = text
        .lines()
        .map(|l| {
            let (role, content) = l.split_once(':').unwrap_or(("user", l));
            ChatMessage {
                role: role.to_owned(),
                content: content.to_owned(),
            }
        })
        .collect();
    for t in templates() {
        for add_generation_prompt in [false, true] {
            let opts = ChatOptions {
                add_generation_prompt,
                enable_thinking: None,
            };
            let _ = t.render(&messages, &opts);
        }
    }
    // The bytes as a template of their own.
    if let Ok(t) = ChatTemplate::from_jinja(&text, "<bos>", "<eos>") {
        let conv = [ChatMessage {
            role: "user".into(),
            content: "hi".into(),
        }];
        let _ = t.render(&conv, &ChatOptions::default());
    }
});
