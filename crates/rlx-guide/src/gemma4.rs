//! Gemma 4's own output syntax: thinking in `<|channel>NAME\n…<channel|>`,
//! tool calls as `<|tool_call>call:NAME{key:value,…}<tool_call|>` with
//! strings between `<|"|>` marks, the rest plain content.
//!
//! [`Parser`] reads it as it streams, a chunk of any size at a time (down to
//! single bytes), and never hands out part of a tag as content: text that
//! could still become a tag is held until it cannot. [`call_grammar`] writes
//! the Lark grammar of calls whose arguments follow each function's JSON
//! schema, so a constrained call always parses and validates.

use serde_json::{Map, Number, Value};

use crate::tools::{Tool, ToolCall};

pub const CHANNEL_OPEN: &str = "<|channel>";
pub const CHANNEL_CLOSE: &str = "<channel|>";
pub const CALL_OPEN: &str = "<|tool_call>";
pub const CALL_CLOSE: &str = "<tool_call|>";
pub const QUOTE: &str = "<|\"|>";

/// Tags that switch state when met in content. Closing tags met out of
/// place are markup, not text, and are dropped.
const CONTENT_TAGS: [&str; 4] = [CHANNEL_OPEN, CALL_OPEN, CHANNEL_CLOSE, CALL_CLOSE];

/// What a piece of output adds to the reply.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Delta {
    pub content: String,
    pub reasoning: String,
    pub calls: Vec<ToolCall>,
}

impl Delta {
    pub fn is_empty(&self) -> bool {
        self.content.is_empty() && self.reasoning.is_empty() && self.calls.is_empty()
    }

    /// Appends `other` (a later delta) to this one.
    pub fn extend(&mut self, other: Delta) {
        self.content.push_str(&other.content);
        self.reasoning.push_str(&other.reasoning);
        self.calls.extend(other.calls);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Content,
    /// After `<|channel>`: the channel's name, up to a newline.
    ChannelName,
    Reasoning,
    /// After `<|tool_call>`: the call, up to `<tool_call|>`.
    Call,
}

/// Splits streamed Gemma 4 output into content, reasoning and tool calls.
#[derive(Debug)]
pub struct Parser {
    state: State,
    /// Text not yet handed out: a possible tag's start, a channel name, or
    /// a call in progress.
    held: String,
}

impl Default for Parser {
    fn default() -> Self {
        Parser::new()
    }
}

impl Parser {
    pub fn new() -> Parser {
        Parser {
            state: State::Content,
            held: String::new(),
        }
    }

    /// Reads the next piece of output.
    pub fn push(&mut self, text: &str) -> Delta {
        self.held.push_str(text);
        let mut out = Delta::default();
        loop {
            match self.state {
                State::Content => match earliest(&self.held, &CONTENT_TAGS) {
                    Some((at, tag)) => {
                        out.content.push_str(&self.held[..at]);
                        self.held.drain(..at + tag.len());
                        self.state = match tag {
                            CHANNEL_OPEN => State::ChannelName,
                            CALL_OPEN => State::Call,
                            _ => State::Content,
                        };
                    }
                    None => {
                        let keep = partial_tag(&self.held, &CONTENT_TAGS);
                        let upto = self.held.len() - keep;
                        out.content.push_str(&self.held[..upto]);
                        self.held.drain(..upto);
                        return out;
                    }
                },
                State::ChannelName => {
                    let newline = self.held.find('\n');
                    let close = self.held.find(CHANNEL_CLOSE);
                    match (newline, close) {
                        (Some(n), c) if c.is_none_or(|c| n < c) => {
                            self.held.drain(..=n);
                            self.state = State::Reasoning;
                        }
                        (_, Some(c)) => {
                            // A channel with a name and nothing in it.
                            self.held.drain(..c + CHANNEL_CLOSE.len());
                            self.state = State::Content;
                        }
                        _ => return out,
                    }
                }
                State::Reasoning => match self.held.find(CHANNEL_CLOSE) {
                    Some(at) => {
                        out.reasoning.push_str(&self.held[..at]);
                        self.held.drain(..at + CHANNEL_CLOSE.len());
                        self.state = State::Content;
                    }
                    None => {
                        let keep = partial_tag(&self.held, &[CHANNEL_CLOSE]);
                        let upto = self.held.len() - keep;
                        out.reasoning.push_str(&self.held[..upto]);
                        self.held.drain(..upto);
                        return out;
                    }
                },
                State::Call => match find_unquoted(&self.held, CALL_CLOSE) {
                    Some(at) => {
                        let body: String = self.held.drain(..at).collect();
                        self.held.drain(..CALL_CLOSE.len());
                        match parse_call(&body) {
                            Some(call) => out.calls.push(call),
                            // Kept whole as content: what the model said is
                            // not lost, and no half-read call is reported.
                            None => {
                                out.content.push_str(CALL_OPEN);
                                out.content.push_str(&body);
                                out.content.push_str(CALL_CLOSE);
                            }
                        }
                        self.state = State::Content;
                    }
                    None => return out,
                },
            }
        }
    }

    /// The end of the output: what was held goes out. A call cut off before
    /// `<tool_call|>` counts if it is complete (the model may end the turn
    /// right after it); otherwise it is content.
    pub fn finish(&mut self) -> Delta {
        let held = std::mem::take(&mut self.held);
        let mut out = Delta::default();
        match self.state {
            State::Content => out.content = held,
            State::ChannelName | State::Reasoning => out.reasoning = held,
            State::Call => match parse_call(&held) {
                Some(call) => out.calls.push(call),
                None => out.content = format!("{CALL_OPEN}{held}"),
            },
        }
        self.state = State::Content;
        out
    }
}

/// The first of `tags` in `text`: its position and the tag.
fn earliest<'t>(text: &str, tags: &[&'t str]) -> Option<(usize, &'t str)> {
    tags.iter()
        .filter_map(|t| text.find(t).map(|i| (i, *t)))
        .min_by_key(|&(i, _)| i)
}

/// The length of the longest end of `text` that starts one of `tags`.
fn partial_tag(text: &str, tags: &[&str]) -> usize {
    let mut best = 0;
    for tag in tags {
        for len in (1..tag.len()).rev() {
            if len > best && text.ends_with(&tag[..len]) {
                best = len;
                break;
            }
        }
    }
    best
}

/// `needle` in `text` outside `<|"|>` quotes.
fn find_unquoted(text: &str, needle: &str) -> Option<usize> {
    let mut i = 0;
    let mut quoted = false;
    while i < text.len() {
        let rest = &text[i..];
        if rest.starts_with(QUOTE) {
            quoted = !quoted;
            i += QUOTE.len();
        } else if !quoted && rest.starts_with(needle) {
            return Some(i);
        } else {
            i += rest.chars().next().map_or(1, char::len_utf8);
        }
    }
    None
}

/// `call:NAME{…}` as a tool call with JSON arguments; `None` if malformed.
pub fn parse_call(body: &str) -> Option<ToolCall> {
    let rest = body.trim().strip_prefix("call:")?;
    let brace = rest.find('{')?;
    let name = rest[..brace].trim();
    let name_ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if !name_ok {
        return None;
    }
    let mut r = Reader {
        text: &rest[brace..],
        pos: 0,
    };
    let arguments = r.value(0)?;
    r.skip_ws();
    (arguments.is_object() && r.pos == r.text.len()).then(|| ToolCall {
        name: name.to_owned(),
        arguments,
    })
}

/// Nesting deeper than this is refused rather than recursed into.
const MAX_DEPTH: usize = 64;

/// Gemma 4 values: `<|"|>text<|"|>`, numbers, `true`, `false`, `null`,
/// `[…]`, and `{key:value,…}` with bare or quoted keys.
struct Reader<'a> {
    text: &'a str,
    pos: usize,
}

impl Reader<'_> {
    fn rest(&self) -> &str {
        &self.text[self.pos..]
    }

    fn skip_ws(&mut self) {
        let trimmed = self.rest().trim_start();
        self.pos = self.text.len() - trimmed.len();
    }

    fn eat(&mut self, s: &str) -> bool {
        self.skip_ws();
        if self.rest().starts_with(s) {
            self.pos += s.len();
            true
        } else {
            false
        }
    }

    fn quoted(&mut self) -> Option<String> {
        let end = self.rest().find(QUOTE)?;
        let s = self.rest()[..end].to_owned();
        self.pos += end + QUOTE.len();
        Some(s)
    }

    fn value(&mut self, depth: usize) -> Option<Value> {
        if depth > MAX_DEPTH {
            return None;
        }
        if self.eat(QUOTE) {
            return self.quoted().map(Value::String);
        }
        if self.eat("{") {
            let mut map = Map::new();
            if self.eat("}") {
                return Some(Value::Object(map));
            }
            loop {
                let key = if self.eat(QUOTE) {
                    self.quoted()?
                } else {
                    self.skip_ws();
                    let end = self.rest().find(':')?;
                    let key = self.rest()[..end].trim().to_owned();
                    let bare_ok = !key.is_empty()
                        && !key.contains([',', '{', '}', '[', ']'])
                        && !key.contains(QUOTE);
                    if !bare_ok {
                        return None;
                    }
                    self.pos += end;
                    key
                };
                if !self.eat(":") {
                    return None;
                }
                let v = self.value(depth + 1)?;
                map.insert(key, v);
                if self.eat("}") {
                    return Some(Value::Object(map));
                }
                if !self.eat(",") {
                    return None;
                }
            }
        }
        if self.eat("[") {
            let mut items = Vec::new();
            if self.eat("]") {
                return Some(Value::Array(items));
            }
            loop {
                items.push(self.value(depth + 1)?);
                if self.eat("]") {
                    return Some(Value::Array(items));
                }
                if !self.eat(",") {
                    return None;
                }
            }
        }
        // A bare scalar runs to the next separator.
        let end = self
            .rest()
            .find([',', '}', ']'])
            .unwrap_or(self.rest().len());
        let word = self.rest()[..end].trim();
        let v = match word {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            "null" => Value::Null,
            _ => Value::Number(serde_json::from_str::<Number>(word).ok()?),
        };
        self.pos += end;
        Some(v)
    }
}

/// The Lark grammar (llguidance's dialect) of one tool call, or of one or
/// more when `parallel`, to the given tools: each call's arguments follow
/// its function's JSON schema — keys in sorted order as the chat template
/// writes them, every required key present, strings quoted with `<|"|>`.
pub fn call_grammar(tools: &[Tool], parallel: bool) -> String {
    let mut g = Grammar::default();
    let alternatives: Vec<String> = tools
        .iter()
        .map(|t| {
            let args = g.object_or_any(&t.parameters, 0);
            format!("{} {args}", lit(&t.name))
        })
        .collect();
    let fns = g.rule(alternatives.join(" | "));
    let call = g.rule(format!(
        "{} \"call:\" {fns} {}",
        lit(CALL_OPEN),
        lit(CALL_CLOSE)
    ));
    let start = if parallel {
        format!("start: {call}+")
    } else {
        format!("start: {call}")
    };
    let mut out = vec![start];
    out.extend(g.rules);
    out.push(format!(
        "QSTR: {q} (/(?s:.*)/ & ~/(?s:.*){qre}(?s:.*)/) {q}",
        q = lit(QUOTE),
        qre = regex_escape(QUOTE)
    ));
    out.push(r"INT: /-?(0|[1-9][0-9]*)/".to_owned());
    out.push(r"NUM: /-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/".to_owned());
    out.push(r"KEY: /[A-Za-z_][A-Za-z0-9_]*/".to_owned());
    out.join("\n")
}

/// A Lark string literal.
fn lit(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

fn regex_escape(s: &str) -> String {
    s.chars()
        .map(|c| {
            if "\\.+*?()|[]{}^$#&-~/".contains(c) {
                format!("\\{c}")
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Rules written so far, named `r0`, `r1`, …
#[derive(Default)]
struct Grammar {
    rules: Vec<String>,
    any: Option<String>,
}

impl Grammar {
    fn rule(&mut self, body: String) -> String {
        let name = format!("r{}", self.rules.len());
        self.rules.push(format!("{name}: {body}"));
        name
    }

    /// Any Gemma 4 value.
    fn any(&mut self) -> String {
        if let Some(a) = &self.any {
            return a.clone();
        }
        let name = format!("r{}", self.rules.len());
        self.any = Some(name.clone());
        self.rules.push(String::new());
        let body = format!(
            "QSTR | NUM | \"true\" | \"false\" | \"null\" | \"[\" ({name} (\",\" {name})*)? \"]\" | \"{{\" (KEY \":\" {name} (\",\" KEY \":\" {name})*)? \"}}\""
        );
        let at = self.rules.len() - 1;
        self.rules[at] = format!("{name}: {body}");
        name
    }

    /// A function's arguments: an object with the schema's properties
    /// (none if it lists none), or any object if it says nothing of them.
    fn object_or_any(&mut self, schema: &Value, depth: usize) -> String {
        if schema.get("properties").is_some_and(Value::is_object) {
            self.object(schema, depth)
        } else {
            let any = self.any();
            self.rule(format!(
                "\"{{\" (KEY \":\" {any} (\",\" KEY \":\" {any})*)? \"}}\""
            ))
        }
    }

    /// An object with the schema's properties (sorted; only those), the
    /// required ones always there.
    fn object(&mut self, schema: &Value, depth: usize) -> String {
        let Some(props) = schema.get("properties").and_then(Value::as_object) else {
            return self.object_or_any(schema, depth);
        };
        let required: Vec<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut keys: Vec<&String> = props.keys().collect();
        keys.sort();
        let members: Vec<(String, bool)> = keys
            .iter()
            .map(|k| {
                let v = self.value(&props[k.as_str()], depth + 1);
                (
                    format!("{} \":\" {v}", lit(k)),
                    required.contains(&k.as_str()),
                )
            })
            .collect();
        // Members from i on, when none (`first`) or some (`later`) came
        // before: a comma only between two that are there. `None` is
        // nothing left.
        let mut first: Option<String> = None;
        let mut later: Option<String> = None;
        for (m, req) in members.iter().rev() {
            let l = later.as_deref().unwrap_or("");
            let (f, lt) = if *req {
                (format!("{m} {l}"), format!("\",\" {m} {l}"))
            } else {
                let f = match &first {
                    Some(rest) => format!("{m} {l} | {rest}"),
                    None => format!("({m} {l})?"),
                };
                (f, format!("(\",\" {m})? {l}"))
            };
            first = Some(self.rule(f));
            later = Some(self.rule(lt));
        }
        let first = first.unwrap_or_default();
        self.rule(format!("\"{{\" {first} \"}}\""))
    }

    /// A value under `schema`.
    fn value(&mut self, schema: &Value, depth: usize) -> String {
        if depth > MAX_DEPTH {
            return self.any();
        }
        if let Some(c) = schema.get("const") {
            return self.rule(literal_value(c));
        }
        if let Some(e) = schema.get("enum").and_then(Value::as_array) {
            if !e.is_empty() {
                let alts: Vec<String> = e.iter().map(literal_value).collect();
                return self.rule(alts.join(" | "));
            }
        }
        for key in ["anyOf", "oneOf"] {
            if let Some(options) = schema.get(key).and_then(Value::as_array) {
                if !options.is_empty() {
                    let alts: Vec<String> =
                        options.iter().map(|o| self.value(o, depth + 1)).collect();
                    return self.rule(alts.join(" | "));
                }
            }
        }
        let nullable = schema.get("nullable") == Some(&Value::Bool(true));
        let types: Vec<&str> = match schema.get("type") {
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        if types.is_empty() {
            return if schema.get("properties").is_some() {
                self.object(schema, depth)
            } else {
                self.any()
            };
        }
        let mut alts: Vec<String> = types
            .iter()
            .map(|t| match *t {
                "string" => self.string(schema),
                "integer" | "number" => self.number(schema, t),
                "boolean" => "\"true\" | \"false\"".to_owned(),
                "null" => "\"null\"".to_owned(),
                "array" => self.array(schema, depth),
                "object" => self.object(schema, depth),
                _ => self.any(),
            })
            .collect();
        if nullable && !types.contains(&"null") {
            alts.push("\"null\"".to_owned());
        }
        self.rule(alts.join(" | "))
    }

    /// A quoted string: any text without the quote mark, held to the
    /// schema's `pattern` (matched whole, as llguidance does for JSON) and
    /// length bounds when it has them.
    fn string(&mut self, schema: &Value) -> String {
        let pattern = schema.get("pattern").and_then(Value::as_str);
        let min = schema.get("minLength").and_then(Value::as_u64);
        let max = schema.get("maxLength").and_then(Value::as_u64);
        if pattern.is_none() && min.is_none() && max.is_none() {
            return "QSTR".to_owned();
        }
        let mut parts = vec![format!("~/(?s:.*){}(?s:.*)/", regex_escape(QUOTE))];
        if let Some(p) = pattern {
            let p = p.strip_prefix('^').unwrap_or(p);
            let p = p.strip_suffix('$').unwrap_or(p);
            parts.push(format!("/{}/", p.replace('/', "\\/")));
        }
        if min.is_some() || max.is_some() {
            let max = max.map_or(String::new(), |m| m.to_string());
            parts.push(format!("/(?s:.{{{},{max}}})/", min.unwrap_or(0)));
        }
        let name = format!("S{}", self.rules.len());
        self.rules.push(format!(
            "{name}: {q} ({}) {q}",
            parts.join(" & "),
            q = lit(QUOTE)
        ));
        name
    }

    /// A number, within the schema's bounds if it has any: numbers are
    /// written alike in JSON and in Gemma 4's syntax, so llguidance's JSON
    /// compiler writes the expression for the range.
    fn number(&mut self, schema: &Value, ty: &str) -> String {
        let mut bounded = serde_json::Map::new();
        for key in [
            "minimum",
            "maximum",
            "exclusiveMinimum",
            "exclusiveMaximum",
            "multipleOf",
        ] {
            if let Some(v) = schema.get(key).filter(|v| v.is_number()) {
                bounded.insert(key.to_owned(), v.clone());
            }
        }
        if bounded.is_empty() {
            return if ty == "integer" { "INT" } else { "NUM" }.to_owned();
        }
        bounded.insert("type".to_owned(), Value::String(ty.to_owned()));
        bounded.insert(
            "x-guidance".to_owned(),
            serde_json::json!({"whitespace_flexible": false}),
        );
        self.rule(format!("%json {}", Value::Object(bounded)))
    }

    fn array(&mut self, schema: &Value, depth: usize) -> String {
        let item = match schema.get("items") {
            Some(items) if items.is_object() => self.value(items, depth + 1),
            _ => self.any(),
        };
        let min = schema.get("minItems").and_then(Value::as_u64).unwrap_or(0);
        let max = schema.get("maxItems").and_then(Value::as_u64);
        let more = |from: u64| match max {
            Some(m) if m > from => format!("(\",\" {item}){{{},{}}}", 0, m - from),
            Some(_) => String::new(),
            None => format!("(\",\" {item})*"),
        };
        let body = if max == Some(0) {
            "\"[\" \"]\"".to_owned()
        } else if min == 0 {
            format!("\"[\" ({item} {})? \"]\"", more(1))
        } else {
            let required = (1..min)
                .map(|_| format!("\",\" {item}"))
                .collect::<Vec<_>>();
            format!("\"[\" {item} {} {} \"]\"", required.join(" "), more(min))
        };
        self.rule(body)
    }
}

/// A fixed value written as the chat template writes arguments.
fn literal_value(v: &Value) -> String {
    lit(&format_value(v))
}

/// A JSON value in Gemma 4's syntax (bare keys, sorted, `<|"|>` strings).
pub fn format_value(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{QUOTE}{s}{QUOTE}"),
        Value::Array(items) => {
            let parts: Vec<String> = items.iter().map(format_value).collect();
            format!("[{}]", parts.join(","))
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let parts: Vec<String> = keys
                .iter()
                .map(|k| format!("{k}:{}", format_value(&map[k.as_str()])))
                .collect();
            format!("{{{}}}", parts.join(","))
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read_all(chunks: &[&str]) -> Delta {
        let mut p = Parser::new();
        let mut d = Delta::default();
        for c in chunks {
            d.extend(p.push(c));
        }
        d.extend(p.finish());
        d
    }

    #[test]
    fn a_call_with_thinking() {
        let d = read_all(&[
            "<|channel>thought\nThe user wants weather.<channel|>",
            "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,days:3}<tool_call|>",
        ]);
        assert_eq!(d.reasoning, "The user wants weather.");
        assert_eq!(d.content, "");
        assert_eq!(d.calls.len(), 1);
        assert_eq!(d.calls[0].name, "get_weather");
        assert_eq!(d.calls[0].arguments, json!({"city": "Paris", "days": 3}));
    }

    #[test]
    fn format_and_parse_agree() {
        let v = json!({"b": [1, 2.5, {"x": "a,b}"}], "a": {"n": null, "t": true}, "s": "q:\"{"});
        let call = parse_call(&format!("call:f{}", format_value(&v))).unwrap();
        assert_eq!(call.arguments, v);
    }
}
