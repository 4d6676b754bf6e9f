//! Chat rendering against Python jinja2 (set up as transformers' apply_chat_template),
//! from tests/fixtures/tokenizer/chat.jsonl (scripts/tokenizer/make_chat_fixtures.py).
//! Exact string equality: any difference changes the prompt's tokens.

mod common;

use rlx_tokenizer::{ChatOptions, ChatTemplate, TokenizerError, GEMMA_TEMPLATE};

fn template_source(file: &str) -> String {
    let path = common::fixture("templates").join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn builtin_template_constant_matches_fixture_file() {
    assert_eq!(GEMMA_TEMPLATE, template_source("gemma-builtin.jinja"));
}

#[test]
fn chat_matches_jinja2() {
    let cases = common::read_jsonl(&common::fixture("chat.jsonl"));
    assert!(cases.len() >= 40, "only {} chat cases", cases.len());
    let mut failures = Vec::new();
    for c in &cases {
        let name = c["name"].as_str().unwrap();
        let source = template_source(c["template"].as_str().unwrap());
        let bos = c["bos_token"].as_str().unwrap();
        let eos = c["eos_token"].as_str().unwrap();
        let opts = ChatOptions {
            add_generation_prompt: c["add_generation_prompt"].as_bool().unwrap(),
            enable_thinking: c["enable_thinking"].as_bool(),
        };
        let messages = c["messages_json"].as_str().unwrap();
        let tools = c["tools_json"].as_str();
        let template = ChatTemplate::from_jinja(&source, bos, eos)
            .unwrap_or_else(|e| panic!("{name}: template does not compile: {e}"));
        let got = template.render_json(messages, tools, &opts);

        if let Some(expected) = c["expected"].as_str() {
            match got {
                Ok(text) if text == expected => {}
                Ok(text) => failures.push(format!(
                    "{name}: minijinja differs\n  expected {expected:?}\n  got      {text:?}"
                )),
                Err(e) => failures.push(format!("{name}: render failed: {e}")),
            }
            let builtin = match c["builtin"].as_str() {
                Some("gemma") => Some(ChatTemplate::gemma()),
                Some("gemma4") => Some(ChatTemplate::gemma4()),
                _ => None,
            };
            if let Some(b) = builtin {
                match b.render_json(messages, None, &opts) {
                    Ok(text) if text == expected => {}
                    Ok(text) => failures.push(format!(
                        "{name}: built-in format differs\n  expected {expected:?}\n  got      {text:?}"
                    )),
                    Err(e) => failures.push(format!("{name}: built-in render failed: {e}")),
                }
            }
        } else {
            let want = c["error"].as_str().unwrap();
            match got {
                Err(TokenizerError::Template {
                    message,
                    line,
                    source_line,
                    ..
                }) => {
                    match (line, &source_line) {
                        (Some(l), Some(_)) if message.contains(want) => {
                            eprintln!("{name}: line {l}: {message}")
                        }
                        _ => failures.push(format!(
                            "{name}: error {message:?} (line {line:?}: {source_line:?}) should contain {want:?} and a line"
                        )),
                    }
                }
                Err(e) => failures.push(format!("{name}: unexpected error kind: {e}")),
                Ok(text) => failures.push(format!(
                    "{name}: rendered {text:?}, expected error {want:?}"
                )),
            }
        }
    }
    for f in &failures {
        eprintln!("{f}");
    }
    assert!(
        failures.is_empty(),
        "{} of {} chat cases failed",
        failures.len(),
        cases.len()
    );
    eprintln!("{} chat cases match jinja2", cases.len());
}

#[test]
fn the_270m_file_has_no_template_and_gets_the_builtin_format() {
    let (file, tok) = common::gemma3();
    let t = ChatTemplate::from_gguf(file).unwrap();
    assert!(t.is_builtin(), "{t:?}");
    let text = t
        .render(
            &[rlx_tokenizer::ChatMessage::user("Hi")],
            &ChatOptions {
                add_generation_prompt: true,
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(
        text,
        "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    );
    // One BOS, turn markers as single tokens.
    let ids = tok.encode_chat(&text);
    assert_eq!(ids.iter().filter(|&&i| Some(i) == tok.bos_id()).count(), 1);
    assert_eq!(ids[0], tok.bos_id().unwrap());
    assert_eq!(ids[1], tok.id_of("<start_of_turn>").unwrap());
    assert_eq!(tok.decode(&ids, true), text);
}
