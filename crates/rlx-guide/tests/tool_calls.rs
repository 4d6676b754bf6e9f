//! Tool calls in Gemma 4's syntax: a committed corpus of replies as a model
//! writes them (well-formed, with thinking, parallel calls, nested
//! arguments, malformed ones) read into content, reasoning and calls, whole
//! and streamed in pieces split at every character; and calls written under
//! the grammar of each function's schema (tokens chosen at random from what
//! the mask allows, on the tiny Gemma 4 vocabulary with Gemma 4's tool
//! tokens) always parse and validate against that schema.

use std::path::PathBuf;
use std::sync::Arc;

use rlx_gemma::generate::Constraint;
use rlx_gguf::GgufFile;
use rlx_guide::gemma4::{Delta, Parser};
use rlx_guide::tools::{read_json_reply, Syntax, Tool, ToolChoice, ToolUse};
use rlx_guide::{GuideOptions, Vocabulary};
use rlx_tokenizer::Tokenizer;
use serde_json::{json, Value};

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

fn read_in(chunks: &[&str]) -> Delta {
    let mut p = Parser::new();
    let mut d = Delta::default();
    for c in chunks {
        d.extend(p.push(c));
    }
    d.extend(p.finish());
    d
}

fn delta_json(d: &Delta) -> Value {
    let calls: Vec<Value> = d
        .calls
        .iter()
        .map(|c| json!({"name": c.name, "arguments": c.arguments}))
        .collect();
    json!({"content": d.content, "reasoning": d.reasoning, "calls": calls})
}

#[test]
fn the_corpus_reads_the_same_in_any_pieces() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/gemma4_replies.json");
    let corpus: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert!(corpus.len() >= 20, "{} cases", corpus.len());
    let mut failures = Vec::new();
    for case in &corpus {
        let name = case["name"].as_str().unwrap();
        let text = case["output"].as_str().unwrap();
        let want = &case["expected"];
        let whole = delta_json(&read_in(&[text]));
        if &whole != want {
            failures.push(format!("{name}: whole\n  want {want}\n  got  {whole}"));
            continue;
        }
        // Every split into two pieces, and one character at a time.
        let bounds: Vec<usize> = (0..=text.len())
            .filter(|&i| text.is_char_boundary(i))
            .collect();
        for &i in &bounds {
            let got = delta_json(&read_in(&[&text[..i], &text[i..]]));
            if &got != want {
                failures.push(format!("{name}: split at {i}\n  want {want}\n  got  {got}"));
                break;
            }
        }
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
        let got = delta_json(&read_in(&refs));
        if &got != want {
            failures.push(format!("{name}: by character\n  want {want}\n  got  {got}"));
        }
        // Streamed content never shows part of a tag.
        let mut p = Parser::new();
        for c in &refs {
            let d = p.push(c);
            for tag in ["<|channel", "<|tool_call", "<channel|", "<tool_call|"] {
                if d.content.contains(tag) && !want["content"].as_str().unwrap().contains(tag) {
                    failures.push(format!(
                        "{name}: streamed content {:?} leaks a tag",
                        d.content
                    ));
                }
            }
        }
    }
    for f in &failures {
        eprintln!("{f}");
    }
    assert!(failures.is_empty(), "{} failures", failures.len());
    eprintln!("{} replies read alike in every split", corpus.len());
}

#[test]
fn json_replies_read_as_calls_or_content() {
    let d = read_json_reply(
        r#"{"tool_calls": [{"name": "f", "arguments": {"x": 1}}]}"#,
        None,
    );
    assert_eq!(d.calls.len(), 1);
    assert_eq!(d.calls[0].arguments, json!({"x": 1}));
    assert_eq!(read_json_reply(r#"{"response": "hi"}"#, None).content, "hi");
    assert_eq!(
        read_json_reply(r#"{"tool_calls": [{"na"#, None).content,
        r#"{"tool_calls": [{"na"#
    );
    // A repeated call is dropped.
    let twice = r#"{"tool_calls": [{"name": "f", "arguments": {"x": 1}}, {"name": "g", "arguments": {}}, {"name": "f", "arguments": {"x": 1}}]}"#;
    let names: Vec<String> = read_json_reply(twice, None)
        .calls
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(names, ["f", "g"]);
    // Of a reply closed for the budget, only the calls finished before.
    let closed = r#"{"tool_calls": [{"name": "f", "arguments": {"x": 1}}, {"name": "g", "arguments": {"y": ""}}]}"#;
    let at = closed.find(r#""y": "#).unwrap();
    let d = read_json_reply(closed, Some(at));
    assert_eq!(d.calls.len(), 1);
    assert_eq!(d.calls[0].name, "f");
    // Closed inside the first call: no call, the text as content.
    let at = closed.find(r#""x""#).unwrap();
    let d = read_json_reply(closed, Some(at));
    assert!(d.calls.is_empty());
    assert_eq!(d.content, closed);
}

fn tools() -> Vec<Tool> {
    let t = |name: &str, parameters: Value| Tool {
        name: name.to_owned(),
        description: format!("The {name} function."),
        parameters,
    };
    vec![
        t(
            "get_weather",
            json!({"type": "object", "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer"}},
                "required": ["city"]}),
        ),
        t(
            "book",
            json!({"type": "object", "properties": {
                "guests": {"type": "array", "items": {"type": "object", "properties": {
                    "name": {"type": "string"}, "age": {"type": "integer"},
                    "vip": {"type": "boolean"}}, "required": ["name"]},
                    "minItems": 1, "maxItems": 3},
                "price": {"type": "number", "minimum": 0, "exclusiveMaximum": 100},
                "count": {"type": "integer", "minimum": -5, "maximum": 250},
                "note": {"type": ["string", "null"]},
                "when": {"type": "object", "properties": {
                    "day": {"type": "string", "enum": ["mon", "tue"]},
                    "hour": {"type": "integer"}}, "required": ["day", "hour"]}},
                "required": ["guests", "when"]}),
        ),
        t("ping", json!({"type": "object", "properties": {}})),
        t(
            "choose",
            json!({"type": "object", "properties": {
                "pick": {"anyOf": [{"type": "integer"}, {"type": "string", "enum": ["none"]}]},
                "tags": {"type": "array", "items": {"type": "string"}},
                "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
                "short": {"type": "string", "minLength": 2, "maxLength": 4},
                "fixed": {"const": "v1"}},
                "required": ["pick", "fixed", "code", "short"]}),
        ),
    ]
}

/// A small deterministic generator (xorshift) for token choices.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Text written under `guide`, each token drawn at random among those the
/// mask allows (forced runs taken whole).
fn write_under(guide: &mut dyn Constraint, tok: &Tokenizer, rng: &mut Rng) -> String {
    let mut ids = Vec::new();
    for _ in 0..3000 {
        if guide.is_complete() {
            break;
        }
        let forced = guide.forced();
        if !forced.is_empty() {
            for t in forced {
                guide.accept(t).unwrap();
                ids.push(t);
            }
            continue;
        }
        let mut logits = vec![0.0f32; tok.vocab_size()];
        guide.mask(&mut logits).unwrap();
        let allowed: Vec<u32> = (0..logits.len() as u32)
            .filter(|&i| logits[i as usize].is_finite())
            .collect();
        // Where the output may end, it ends half the time.
        if allowed.iter().any(|&i| tok.is_eog(i)) && rng.next().is_multiple_of(2) {
            break;
        }
        let allowed: Vec<u32> = allowed.into_iter().filter(|&i| !tok.is_eog(i)).collect();
        // Half the time a token that closes or separates something, so that
        // strings and arrays end before the budget does.
        let closing: Vec<u32> = allowed
            .iter()
            .copied()
            .filter(|&i| {
                let b = tok.token_bytes(i, false);
                b.iter().any(|c| b"\"}],>".contains(c))
            })
            .collect();
        let pool = if !closing.is_empty() && rng.next().is_multiple_of(2) {
            &closing
        } else {
            &allowed
        };
        let t = pool[(rng.next() % pool.len() as u64) as usize];
        guide.accept(t).unwrap();
        ids.push(t);
    }
    let text = tok.decode(&ids, false);
    let mut logits = vec![0.0f32; tok.vocab_size()];
    let may_end = guide.is_complete()
        || (guide.mask(&mut logits).is_ok()
            && tok
                .eog_ids()
                .iter()
                .any(|&e| logits[e as usize].is_finite()));
    assert!(may_end, "not complete: {text:?}");
    text
}

fn validate(schema: &Value, v: &Value) -> Result<(), String> {
    let validator = jsonschema::validator_for(schema).map_err(|e| e.to_string())?;
    let errors: Vec<String> = validator.iter_errors(v).map(|e| e.to_string()).collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

#[test]
fn required_calls_written_under_the_grammar_parse_and_validate() {
    let file = GgufFile::open(fixtures().join("tiny/gemma4-tools/model-f32.gguf")).unwrap();
    let tok = Arc::new(Tokenizer::from_gguf(&file).unwrap());
    let vocab = Vocabulary::new(Arc::clone(&tok)).unwrap();
    let tools = tools();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut written = 0;
    for (choice, parallel) in [
        (ToolChoice::Required, true),
        (ToolChoice::Required, false),
        (ToolChoice::Named("book".into()), false),
        (ToolChoice::Named("choose".into()), true),
    ] {
        let usage = ToolUse {
            tools: tools.clone(),
            choice: choice.clone(),
            parallel,
        };
        let spec = usage
            .spec(Syntax::Gemma4)
            .expect("a required call is constrained");
        for i in 0..25 {
            let mut guide = vocab.guide(&spec, &GuideOptions::default()).unwrap();
            let text = write_under(&mut guide, &tok, &mut rng);
            if i == 0 {
                eprintln!("{choice:?}, parallel {parallel}: {text:?}");
            }
            let d = read_in(&[&text]);
            assert!(
                d.content.is_empty() && d.reasoning.is_empty(),
                "{text:?}: {d:?}"
            );
            assert!(!d.calls.is_empty(), "{text:?}");
            if !parallel {
                assert_eq!(d.calls.len(), 1, "{text:?}");
            }
            for c in &d.calls {
                if let ToolChoice::Named(n) = &choice {
                    assert_eq!(&c.name, n);
                }
                let tool = tools.iter().find(|t| t.name == c.name).unwrap();
                validate(&tool.parameters, &c.arguments)
                    .unwrap_or_else(|e| panic!("{text:?}: {} does not validate: {e}", c.arguments));
            }
            written += 1;
        }
    }
    eprintln!("{written} constrained replies parse and validate");
}

#[test]
fn json_replies_written_under_the_schema_parse_and_validate() {
    let file = GgufFile::open(fixtures().join("tiny/gemma3/model-f32.gguf")).unwrap();
    let tok = Arc::new(Tokenizer::from_gguf(&file).unwrap());
    let vocab = Vocabulary::new(Arc::clone(&tok)).unwrap();
    let tools = tools();
    let mut rng = Rng(7);
    for choice in [ToolChoice::Auto, ToolChoice::Required] {
        let usage = ToolUse {
            tools: tools.clone(),
            choice,
            parallel: true,
        };
        let spec = usage.spec(Syntax::Json).unwrap();
        for _ in 0..10 {
            let mut guide = vocab.guide(&spec, &GuideOptions::default()).unwrap();
            let text = write_under(&mut guide, &tok, &mut rng);
            let d = read_json_reply(&text, guide.closed_at());
            assert!(
                !d.calls.is_empty()
                    || serde_json::from_str::<Value>(&text)
                        .is_ok_and(|v| v["response"].is_string()),
                "{text:?}"
            );
            for c in &d.calls {
                let tool = tools.iter().find(|t| t.name == c.name).unwrap();
                validate(&tool.parameters, &c.arguments)
                    .unwrap_or_else(|e| panic!("{text:?}: {e}"));
            }
        }
    }
}
