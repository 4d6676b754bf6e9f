//! Chat prompts: the file's Jinja template (`tokenizer.chat_template`)
//! rendered with minijinja set up like Hugging Face's `apply_chat_template`
//! (trim_blocks, lstrip_blocks, Python string and dict methods,
//! `raise_exception`), or a built-in Gemma turn format when the file has no
//! template.

use minijinja::value::Kwargs;
use minijinja::{Environment, Error, ErrorKind, Value};
use rlx_gguf::GgufFile;

use crate::TokenizerError;

const TEMPLATE_KEY: &str = "tokenizer.chat_template";

/// One chat turn. Roles are `system`, `user` and `assistant` (Gemma's
/// `model`); templates may accept others, such as `tool`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }

    pub fn system(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("system", content)
    }

    pub fn user(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("user", content)
    }

    pub fn assistant(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("assistant", content)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChatOptions {
    /// End with the opening of the model's turn.
    pub add_generation_prompt: bool,
    /// Passed as `enable_thinking` (Gemma 4 templates); left undefined when None.
    pub enable_thinking: Option<bool>,
}

enum Format {
    Jinja {
        env: Box<Environment<'static>>,
        name: String,
        source: String,
    },
    /// llama.cpp's built-in `gemma` format (Gemma 1 to 3n).
    Gemma,
    /// The plain-conversation subset of the Gemma 4 template.
    Gemma4,
}

/// A chat format, ready to render conversations into prompt text.
pub struct ChatTemplate {
    format: Format,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.format {
            Format::Jinja { name, .. } => name.as_str(),
            Format::Gemma => "built-in gemma",
            Format::Gemma4 => "built-in gemma4",
        };
        f.debug_struct("ChatTemplate")
            .field("format", &kind)
            .field("bos_token", &self.bos_token)
            .finish_non_exhaustive()
    }
}

/// The built-in Gemma format written as a template; rendering it gives the
/// same text as [`ChatTemplate::gemma`]. Tests hold the two together.
pub const GEMMA_TEMPLATE: &str = "{{ bos_token }}\
{% set ns = namespace(system='') %}\
{% for message in messages %}\
{% if message['role'] == 'system' %}\
{% set ns.system = ns.system + message['content'] | trim %}\
{% else %}\
{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}\
{{ '<start_of_turn>' + role + '\\n' }}\
{% if ns.system and role != 'model' %}{{ ns.system + '\\n\\n' }}{% set ns.system = '' %}{% endif %}\
{{ message['content'] | trim }}{{ '<end_of_turn>\\n' }}\
{% endif %}\
{% endfor %}\
{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}";

/// What a file says about how its model was tuned, for what chat can do
/// with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tuning {
    /// It carries a chat template (instruction-tuned files do).
    Chat,
    /// No template, but its name, fine-tune or tags say instruction-tuned
    /// (`it`, `instruct`, `chat`): the built-in Gemma template stands in.
    InstructWithoutTemplate,
    /// No template and no such marker: a base model, which continues text
    /// rather than following instructions.
    Base,
}

impl Tuning {
    /// Read from the file's metadata.
    pub fn of(file: &GgufFile) -> Tuning {
        if file.get(TEMPLATE_KEY).is_some() {
            return Tuning::Chat;
        }
        let mut words = Vec::new();
        for key in ["general.finetune", "general.name", "general.basename"] {
            if let Some(v) = file.get(key).and_then(|v| v.as_str()) {
                words.push(v.to_owned());
            }
        }
        if let Some(tags) = file
            .get("general.tags")
            .and_then(|v| v.as_array())
            .and_then(|a| a.as_strings())
        {
            words.extend(tags.iter().cloned());
        }
        let marked = words.iter().any(|w| {
            w.to_ascii_lowercase()
                .split(|c: char| !c.is_ascii_alphanumeric())
                .any(|part| matches!(part, "it" | "instruct" | "instruction" | "chat"))
        });
        if marked {
            Tuning::InstructWithoutTemplate
        } else {
            Tuning::Base
        }
    }
}

/// The built-in formats by name, as `--chat-template NAME` takes them.
pub const BUILTIN_TEMPLATES: [&str; 2] = ["gemma", "gemma4"];

impl ChatTemplate {
    /// The file's `tokenizer.chat_template`, or a built-in Gemma format when
    /// it has none: the Gemma 4 one if the vocabulary has `<|turn>`,
    /// otherwise the Gemma 1 to 3 one. `bos_token` and `eos_token` are the
    /// vocabulary's pieces.
    pub fn from_gguf(file: &GgufFile) -> Result<ChatTemplate, TokenizerError> {
        let pieces = vocabulary(file);
        let template = match file.get(TEMPLATE_KEY) {
            Some(v) => {
                let source = v.as_str().ok_or_else(|| TokenizerError::BadMetadata {
                    key: TEMPLATE_KEY.to_owned(),
                    reason: format!("expected a string, found {}", v.type_description()),
                })?;
                ChatTemplate::from_jinja_named(TEMPLATE_KEY, source, "", "")?
            }
            None if pieces.is_some_and(|p| p.iter().any(|t| t == "<|turn>")) => {
                ChatTemplate::gemma4()
            }
            None => ChatTemplate::gemma(),
        };
        Ok(template.with_special_tokens_of(file))
    }

    /// A built-in format by its name in [`BUILTIN_TEMPLATES`].
    pub fn builtin(name: &str) -> Option<ChatTemplate> {
        match name {
            "gemma" => Some(ChatTemplate::gemma()),
            "gemma4" => Some(ChatTemplate::gemma4()),
            _ => None,
        }
    }

    /// This template with `bos_token` and `eos_token` set to the pieces of
    /// the file's BOS and EOS ids (`<bos>` and `<eos>` where it has none).
    pub fn with_special_tokens_of(mut self, file: &GgufFile) -> ChatTemplate {
        let pieces = vocabulary(file);
        let piece_at = |key: &str, fallback: &str| -> String {
            file.get(key)
                .and_then(|v| v.as_u64())
                .and_then(|id| pieces?.get(id as usize))
                .cloned()
                .unwrap_or_else(|| fallback.to_owned())
        };
        self.bos_token = piece_at("tokenizer.ggml.bos_token_id", "<bos>");
        self.eos_token = piece_at("tokenizer.ggml.eos_token_id", "<eos>");
        self
    }

    /// A Jinja template; syntax errors are reported here, with their line.
    pub fn from_jinja(
        source: &str,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<ChatTemplate, TokenizerError> {
        ChatTemplate::from_jinja_named("chat template", source, bos_token, eos_token)
    }

    /// [`ChatTemplate::from_jinja`], its errors naming where the template
    /// came from (a file's path, a metadata key).
    pub fn from_jinja_named(
        name: &str,
        source: &str,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<ChatTemplate, TokenizerError> {
        let mut env = Box::new(hf_environment());
        env.add_template_owned(name.to_owned(), source.to_owned())
            .map_err(|e| template_error(name, source, &e))?;
        Ok(ChatTemplate {
            format: Format::Jinja {
                env,
                name: name.to_owned(),
                source: source.to_owned(),
            },
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
        })
    }

    /// Gemma 1 to 3n: `<start_of_turn>user\n…<end_of_turn>\n`, the system
    /// text and a blank line at the start of the first user turn, contents
    /// trimmed, `assistant` written as `model`.
    pub fn gemma() -> ChatTemplate {
        ChatTemplate {
            format: Format::Gemma,
            bos_token: "<bos>".to_owned(),
            eos_token: "<eos>".to_owned(),
        }
    }

    /// Gemma 4 without tools or images: a real system turn, `<|turn>role\n…<turn|>\n`,
    /// earlier thought channels stripped from model turns, and an empty
    /// thought channel after the generation prompt unless thinking is on.
    pub fn gemma4() -> ChatTemplate {
        ChatTemplate {
            format: Format::Gemma4,
            bos_token: "<bos>".to_owned(),
            eos_token: "<eos>".to_owned(),
        }
    }

    /// Where the template came from: a built-in format's name (`gemma`,
    /// `gemma4`), or the name a Jinja template was given (a metadata key or
    /// a file's path).
    pub fn name(&self) -> &str {
        match &self.format {
            Format::Jinja { name, .. } => name,
            Format::Gemma => "gemma",
            Format::Gemma4 => "gemma4",
        }
    }

    /// The Jinja source, when this is not a built-in format.
    pub fn source(&self) -> Option<&str> {
        match &self.format {
            Format::Jinja { source, .. } => Some(source),
            _ => None,
        }
    }

    pub fn is_builtin(&self) -> bool {
        !matches!(self.format, Format::Jinja { .. })
    }

    pub fn render(
        &self,
        messages: &[ChatMessage],
        opts: &ChatOptions,
    ) -> Result<String, TokenizerError> {
        match &self.format {
            Format::Gemma => Ok(self.render_gemma(messages, opts)),
            Format::Gemma4 => Ok(self.render_gemma4(messages, opts)),
            Format::Jinja { env, name, source } => {
                let list: Vec<Value> = messages
                    .iter()
                    .map(|m| {
                        Value::from_iter([
                            ("role", Value::from(m.role.as_str())),
                            ("content", Value::from(m.content.as_str())),
                        ])
                    })
                    .collect();
                self.render_jinja(env, name, source, Value::from(list), None, opts)
            }
        }
    }

    /// Renders messages given as a JSON array, as an OpenAI-style request
    /// carries them (content parts, `tool_calls`, `tool` turns), with an
    /// optional JSON array of tool declarations. Key order is kept, as
    /// Python's dicts keep it. Built-in formats read only `role` and the
    /// text of `content`.
    pub fn render_json(
        &self,
        messages_json: &str,
        tools_json: Option<&str>,
        opts: &ChatOptions,
    ) -> Result<String, TokenizerError> {
        let parse = |what: &str, text: &str| -> Result<Value, TokenizerError> {
            serde_json::from_str::<Value>(text).map_err(|e| TokenizerError::BadMetadata {
                key: what.to_owned(),
                reason: format!("invalid JSON: {e}"),
            })
        };
        let messages = parse("chat messages", messages_json)?;
        if let Format::Jinja { env, name, source } = &self.format {
            let tools = tools_json.map(|t| parse("chat tools", t)).transpose()?;
            return self.render_jinja(env, name, source, messages, tools, opts);
        }
        let mut plain = Vec::new();
        let Ok(iter) = messages.try_iter() else {
            return Err(TokenizerError::BadMetadata {
                key: "chat messages".to_owned(),
                reason: "expected a JSON array of messages".to_owned(),
            });
        };
        for m in iter {
            let role = m
                .get_attr("role")
                .ok()
                .and_then(|r| r.as_str().map(str::to_owned))
                .unwrap_or_default();
            plain.push(ChatMessage::new(role, content_text(&m)));
        }
        self.render(&plain, opts)
    }

    fn render_jinja(
        &self,
        env: &Environment<'static>,
        name: &str,
        source: &str,
        messages: Value,
        tools: Option<Value>,
        opts: &ChatOptions,
    ) -> Result<String, TokenizerError> {
        let mut ctx: Vec<(&str, Value)> = vec![
            ("messages", messages),
            (
                "add_generation_prompt",
                Value::from(opts.add_generation_prompt),
            ),
            ("bos_token", Value::from(self.bos_token.as_str())),
            ("eos_token", Value::from(self.eos_token.as_str())),
            // Defined but none when absent, as transformers passes them.
            ("tools", tools.unwrap_or(Value::from(()))),
            ("documents", Value::from(())),
        ];
        if let Some(on) = opts.enable_thinking {
            ctx.push(("enable_thinking", Value::from(on)));
        }
        let template = env
            .get_template(name)
            .map_err(|e| template_error(name, source, &e))?;
        template
            .render(Value::from_iter(ctx))
            .map_err(|e| template_error(name, source, &e))
    }

    fn render_gemma(&self, messages: &[ChatMessage], opts: &ChatOptions) -> String {
        let mut out = self.bos_token.clone();
        let mut system = String::new();
        for m in messages {
            if m.role == "system" {
                system.push_str(py_strip(&m.content));
                continue;
            }
            let role = if m.role == "assistant" {
                "model"
            } else {
                &m.role
            };
            out.push_str("<start_of_turn>");
            out.push_str(role);
            out.push('\n');
            if !system.is_empty() && role != "model" {
                out.push_str(&system);
                out.push_str("\n\n");
                system.clear();
            }
            out.push_str(py_strip(&m.content));
            out.push_str("<end_of_turn>\n");
        }
        if opts.add_generation_prompt {
            out.push_str("<start_of_turn>model\n");
        }
        out
    }

    fn render_gemma4(&self, messages: &[ChatMessage], opts: &ChatOptions) -> String {
        let thinking = opts.enable_thinking == Some(true);
        let mut out = self.bos_token.clone();
        let mut rest = messages;
        let first_is_system = messages
            .first()
            .is_some_and(|m| m.role == "system" || m.role == "developer");
        if thinking || first_is_system {
            out.push_str("<|turn>system\n");
            if thinking {
                out.push_str("<|think|>\n");
            }
            if first_is_system {
                out.push_str(py_strip(&messages[0].content));
                rest = &messages[1..];
            }
            out.push_str("<turn|>\n");
        }
        let mut prev_role: Option<&str> = None;
        for m in rest.iter().filter(|m| m.role != "tool") {
            let role = if m.role == "assistant" {
                "model"
            } else {
                &m.role
            };
            // Consecutive assistant messages continue one model turn.
            if !(role == "model" && prev_role == Some("assistant")) {
                out.push_str("<|turn>");
                out.push_str(role);
                out.push('\n');
            }
            if role == "model" {
                out.push_str(&strip_thinking(&m.content));
            } else {
                out.push_str(py_strip(&m.content));
            }
            out.push_str("<turn|>\n");
            prev_role = Some(&m.role);
        }
        if opts.add_generation_prompt {
            out.push_str("<|turn>model\n");
            if !thinking {
                out.push_str("<|channel>thought\n<channel|>");
            }
        }
        out
    }
}

/// The file's vocabulary pieces, by id.
fn vocabulary(file: &GgufFile) -> Option<&[String]> {
    file.get("tokenizer.ggml.tokens")
        .and_then(|v| v.as_array())
        .and_then(|a| a.as_strings())
}

/// The text of a JSON message's `content`: a string, or its text parts joined.
fn content_text(message: &Value) -> String {
    let Ok(content) = message.get_attr("content") else {
        return String::new();
    };
    if let Some(s) = content.as_str() {
        return s.to_owned();
    }
    let mut text = String::new();
    if let Ok(parts) = content.try_iter() {
        for part in parts {
            let is_text = part
                .get_attr("type")
                .ok()
                .is_some_and(|t| t.as_str() == Some("text"));
            if is_text {
                if let Some(s) = part.get_attr("text").ok().as_ref().and_then(Value::as_str) {
                    text.push_str(s);
                }
            }
        }
    }
    text
}

/// The Gemma 4 template's `strip_thinking` macro: drop everything from each
/// `<|channel>` to the next `<channel|>`, then trim.
fn strip_thinking(text: &str) -> String {
    let mut result = String::new();
    for part in text.split("<channel|>") {
        match part.find("<|channel>") {
            Some(i) => result.push_str(&part[..i]),
            None => result.push_str(part),
        }
    }
    py_strip(&result).to_owned()
}

/// Python's `str.strip()`: its whitespace is Rust's plus U+001C..U+001F.
fn py_strip(s: &str) -> &str {
    s.trim_matches(|c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c))
}

/// Template instructions one rendering may run: far more than any chat
/// template needs for a long conversation, so that a template that loops
/// (nearly) forever stops with an error instead of hanging.
const TEMPLATE_FUEL: u64 = 50_000_000;

/// An environment that renders like transformers' `apply_chat_template`.
/// Deep recursion is stopped by minijinja's own depth limit.
fn hf_environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_fuel(Some(TEMPLATE_FUEL));
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
        Err(Error::new(ErrorKind::InvalidOperation, msg))
    });
    env.add_filter("trim", trim_filter);
    env.add_filter("tojson", tojson_filter);
    env
}

/// Jinja's `trim(value, chars=None)` with Python's whitespace.
fn trim_filter(value: &str, chars: Option<&str>) -> String {
    match chars {
        None => py_strip(value).to_owned(),
        Some(chars) => value.trim_matches(|c| chars.contains(c)).to_owned(),
    }
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=…)`.
/// minijinja's own escapes `<` and `>` for HTML, which would change prompts.
fn tojson_filter(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(value, indent, sort_keys.unwrap_or(false), 0, &mut out)?;
    Ok(Value::from_safe_string(out))
}

fn write_json(
    v: &Value,
    indent: Option<usize>,
    sort_keys: bool,
    depth: usize,
    out: &mut String,
) -> Result<(), Error> {
    use minijinja::value::ValueKind;
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            let text = v.to_string();
            // Python writes floats with a fraction: 1.0, not 1.
            if v.as_i64().is_none() && !text.contains(['.', 'e', 'E', 'n', 'i']) {
                out.push_str(&text);
                out.push_str(".0");
            } else {
                out.push_str(&text);
            }
        }
        ValueKind::String => {
            let s = v.as_str().unwrap_or_default();
            out.push_str(&serde_json::to_string(s).map_err(json_err)?);
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_json(item, indent, sort_keys, depth + 1, out)?;
            }
            if !items.is_empty() {
                newline(out, depth);
            }
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if sort_keys {
                keys.sort();
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                let k = key.to_string();
                out.push_str(&serde_json::to_string(&k).map_err(json_err)?);
                out.push_str(": ");
                write_json(&v.get_item(key)?, indent, sort_keys, depth + 1, out)?;
            }
            if !keys.is_empty() {
                newline(out, depth);
            }
            out.push('}');
        }
        _ => {
            out.push_str(&serde_json::to_string(&v.to_string()).map_err(json_err)?);
        }
    }
    Ok(())
}

fn json_err(e: serde_json::Error) -> Error {
    Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}"))
}

/// A minijinja error with the template line it points at and its causes.
fn template_error(name: &str, source: &str, e: &Error) -> TokenizerError {
    let mut message = match e.detail() {
        Some(d) => format!("{}: {d}", e.kind()),
        None => e.kind().to_string(),
    };
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        message.push_str(&format!("; caused by: {c}"));
        cause = c.source();
    }
    let line = e.line();
    let source_line = line.and_then(|l| source.lines().nth(l.checked_sub(1)?).map(str::to_owned));
    TokenizerError::Template {
        name: name.to_owned(),
        line,
        source_line,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use rlx_gguf::Value as GValue;

    fn file_with(metadata: &[(&str, GValue)]) -> GgufFile {
        let metadata = metadata
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect();
        GgufFile::from_parts(None, metadata, Vec::new()).unwrap()
    }

    #[test]
    fn a_file_says_whether_its_model_follows_instructions() {
        let name = |n: &str| ("general.name", GValue::String(n.into()));
        let template = (TEMPLATE_KEY, GValue::String("{{ messages }}".into()));
        for (metadata, want) in [
            (vec![name("Gemma 3 270m")], Tuning::Base),
            (vec![name("Gemma 3 270m"), template.clone()], Tuning::Chat),
            (
                vec![name("Gemma 3 270m It")],
                Tuning::InstructWithoutTemplate,
            ),
            (
                vec![name("gemma-3-1b-it-qat")],
                Tuning::InstructWithoutTemplate,
            ),
            (
                vec![("general.finetune", GValue::String("instruct".into()))],
                Tuning::InstructWithoutTemplate,
            ),
            (
                vec![(
                    "general.tags",
                    GValue::Array(rlx_gguf::Array::String(vec!["chat".into()])),
                )],
                Tuning::InstructWithoutTemplate,
            ),
            // A word that merely contains "it" is no marker.
            (vec![name("Gemma Italian Edit")], Tuning::Base),
            (Vec::new(), Tuning::Base),
        ] {
            assert_eq!(Tuning::of(&file_with(&metadata)), want, "{metadata:?}");
        }
    }

    #[test]
    fn builtin_formats_are_found_by_the_names_they_give() {
        for name in BUILTIN_TEMPLATES {
            let t = ChatTemplate::builtin(name).unwrap();
            assert_eq!(t.name(), name);
            assert!(t.is_builtin());
        }
        assert!(ChatTemplate::builtin("chatml").is_none());
        // A file without a template gets the Gemma 1-3 format, with its
        // vocabulary's BOS piece.
        let tokens = rlx_gguf::Array::String(vec!["<pad>".into(), "<eos>".into(), "<s>".into()]);
        let file = file_with(&[
            ("tokenizer.ggml.tokens", GValue::Array(tokens)),
            ("tokenizer.ggml.bos_token_id", GValue::U32(2)),
        ]);
        let t = ChatTemplate::from_gguf(&file).unwrap();
        assert_eq!(t.name(), "gemma");
        let opts = ChatOptions::default();
        let text = t.render(&[ChatMessage::user("hi")], &opts).unwrap();
        assert!(text.starts_with("<s><start_of_turn>user"), "{text}");
        let jinja = ChatTemplate::from_jinja_named("x.jinja", "[{{ bos_token }}]", "", "")
            .unwrap()
            .with_special_tokens_of(&file);
        assert_eq!(jinja.name(), "x.jinja");
        assert_eq!(jinja.render(&[], &opts).unwrap(), "[<s>]");
    }

    fn conv() -> Vec<ChatMessage> {
        vec![
            ChatMessage::system("  Be brief.  "),
            ChatMessage::user("Hi there \n"),
            ChatMessage::assistant("Hello!"),
            ChatMessage::user("What is 2+2?"),
        ]
    }

    #[test]
    fn builtin_gemma_matches_llama_cpp_format() {
        let got = ChatTemplate::gemma()
            .render(
                &conv(),
                &ChatOptions {
                    add_generation_prompt: true,
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!(
            got,
            "<bos><start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n\
             <start_of_turn>model\nHello!<end_of_turn>\n\
             <start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n"
        );
    }

    #[test]
    fn builtin_gemma_equals_its_template() {
        let jinja = ChatTemplate::from_jinja(GEMMA_TEMPLATE, "<bos>", "<eos>").unwrap();
        for add in [false, true] {
            let opts = ChatOptions {
                add_generation_prompt: add,
                ..Default::default()
            };
            assert_eq!(
                jinja.render(&conv(), &opts).unwrap(),
                ChatTemplate::gemma().render(&conv(), &opts).unwrap()
            );
        }
    }

    #[test]
    fn render_error_names_the_line() {
        let src = "{{ bos_token }}\n{% for m in messages %}\n{{ raise_exception('no system role') }}\n{% endfor %}";
        let t = ChatTemplate::from_jinja(src, "<bos>", "<eos>").unwrap();
        let err = t.render(&conv(), &ChatOptions::default()).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("line 3"), "{text}");
        assert!(text.contains("no system role"), "{text}");
        assert!(text.contains("raise_exception"), "{text}");
    }

    #[test]
    fn endless_loops_and_deep_recursion_stop_with_an_error() {
        let start = std::time::Instant::now();
        for src in [
            "{% for i in range(1000000000) %}x{% endfor %}",
            "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
            "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        ] {
            let t = ChatTemplate::from_jinja(src, "<bos>", "<eos>").unwrap();
            let err = t.render(&conv(), &ChatOptions::default());
            assert!(err.is_err(), "{src} rendered");
        }
        assert!(
            start.elapsed().as_secs() < 60,
            "stopping took {:?}",
            start.elapsed()
        );
    }

    #[test]
    fn syntax_error_names_the_line() {
        let err = ChatTemplate::from_jinja("ok\n{% if %}", "<bos>", "<eos>").unwrap_err();
        let text = err.to_string();
        assert!(text.contains("line 2"), "{text}");
    }

    #[test]
    fn tojson_is_python_like() {
        let t = ChatTemplate::from_jinja(
            "{{ {'a': [1, 2.5, 3.0], 'b': '<é>', 'c': none, 'd': true} | tojson }}",
            "",
            "",
        )
        .unwrap();
        assert_eq!(
            t.render(&[], &ChatOptions::default()).unwrap(),
            r#"{"a": [1, 2.5, 3.0], "b": "<é>", "c": null, "d": true}"#
        );
    }

    #[test]
    fn strip_thinking_drops_channels() {
        assert_eq!(
            strip_thinking("<|channel>thought\nhmm<channel|> The answer is 4. "),
            "The answer is 4."
        );
    }
}
