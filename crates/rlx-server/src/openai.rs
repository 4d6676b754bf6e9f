//! OpenAI request bodies read from JSON, with errors that name the field.

use rlx_gemma::sampling::SamplerConfig;
use rlx_tokenizer::ChatMessage;
use serde_json::{Map, Value};

/// A request the server refuses, as OpenAI reports it: HTTP 400 with an
/// `invalid_request_error` naming the parameter.
#[derive(Debug, Clone, PartialEq)]
pub struct BadRequest {
    pub message: String,
    pub param: Option<String>,
}

impl BadRequest {
    pub fn new(message: impl Into<String>) -> BadRequest {
        BadRequest {
            message: message.into(),
            param: None,
        }
    }

    pub fn param(param: &str, message: impl Into<String>) -> BadRequest {
        BadRequest {
            message: format!("`{param}`: {}", message.into()),
            param: Some(param.to_owned()),
        }
    }
}

type Result<T> = std::result::Result<T, BadRequest>;

/// What the two completion endpoints share.
#[derive(Debug, Clone)]
pub struct Params {
    pub max_tokens: Option<usize>,
    pub sampler: SamplerConfig,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub ignore_eos: bool,
    /// Choices to generate (`n`).
    pub n: usize,
    /// Log-probabilities of the sampled tokens with this many alternatives
    /// each; `None` when not asked for.
    pub logprobs: Option<usize>,
    /// Structured output, and the field that asked for it.
    pub constraint: Option<(&'static str, rlx_guide::Spec)>,
}

/// The most choices a request may ask for.
pub const MAX_CHOICES: usize = 16;

/// Which API a body is for: `logprobs` is a flag with `top_logprobs` in
/// chat, a count in text completions.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Chat,
    Completions,
}

/// The body as a JSON object.
pub fn object(body: &[u8]) -> Result<Map<String, Value>> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(other) => Err(BadRequest::new(format!(
            "the body must be a JSON object, not {}",
            kind(&other)
        ))),
        Err(e) => Err(BadRequest::new(format!("the body is not valid JSON: {e}"))),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A present, non-null field.
fn field<'a>(body: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    body.get(key).filter(|v| !v.is_null())
}

fn number(body: &Map<String, Value>, key: &str, range: (f64, f64)) -> Result<Option<f32>> {
    let Some(v) = field(body, key) else {
        return Ok(None);
    };
    let x = v
        .as_f64()
        .ok_or_else(|| BadRequest::param(key, format!("expected a number, got {}", kind(v))))?;
    if !(range.0..=range.1).contains(&x) {
        return Err(BadRequest::param(
            key,
            format!("{x} is outside [{}, {}]", range.0, range.1),
        ));
    }
    Ok(Some(x as f32))
}

fn integer(body: &Map<String, Value>, key: &str) -> Result<Option<u64>> {
    let Some(v) = field(body, key) else {
        return Ok(None);
    };
    v.as_u64().map(Some).ok_or_else(|| {
        BadRequest::param(
            key,
            format!("expected a non-negative integer, got {}", kind(v)),
        )
    })
}

fn boolean(body: &Map<String, Value>, key: &str) -> Result<bool> {
    match field(body, key) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(BadRequest::param(
            key,
            format!("expected a boolean, got {}", kind(v)),
        )),
    }
}

/// Sampling, limits, stop strings and streaming, over the server's defaults.
/// `seed` is used when the request gives none.
pub fn params(
    body: &Map<String, Value>,
    api: Api,
    defaults: &SamplerConfig,
    seed: u64,
) -> Result<Params> {
    let mut s = defaults.clone();
    if let Some(t) = number(body, "temperature", (0.0, 2.0))? {
        s.temperature = t;
    }
    if let Some(p) = number(body, "top_p", (0.0, 1.0))? {
        s.top_p = p;
    }
    if let Some(k) = integer(body, "top_k")? {
        s.top_k = k as usize;
    }
    if let Some(p) = number(body, "min_p", (0.0, 1.0))? {
        s.min_p = p;
    }
    if let Some(p) = number(body, "typical_p", (0.0, 1.0))? {
        s.typical_p = p;
    }
    if let Some(p) = number(body, "presence_penalty", (-2.0, 2.0))? {
        s.presence_penalty = p;
    }
    if let Some(p) = number(body, "frequency_penalty", (-2.0, 2.0))? {
        s.frequency_penalty = p;
    }
    if let Some(p) = number(body, "repeat_penalty", (0.0, f64::MAX))? {
        s.repeat_penalty = p;
    }
    if let Some(n) = integer(body, "repeat_last_n")? {
        s.penalty_last_n = n as usize;
    }
    s.seed = integer(body, "seed")?.unwrap_or(seed);
    if let Some(v) = field(body, "logit_bias") {
        let map = v.as_object().ok_or_else(|| {
            BadRequest::param(
                "logit_bias",
                format!("expected an object of token id to bias, got {}", kind(v)),
            )
        })?;
        s.logit_bias = map
            .iter()
            .map(|(id, bias)| {
                let token: u32 = id.parse().map_err(|_| {
                    BadRequest::param("logit_bias", format!("key {id:?} is not a token id"))
                })?;
                let b = bias.as_f64().filter(|b| (-100.0..=100.0).contains(b));
                let b = b.ok_or_else(|| {
                    BadRequest::param(
                        "logit_bias",
                        format!("the bias of {id} must be a number in [-100, 100]"),
                    )
                })?;
                // -100 bans the token, as OpenAI documents.
                Ok((
                    token,
                    if b <= -100.0 {
                        f32::NEG_INFINITY
                    } else {
                        b as f32
                    },
                ))
            })
            .collect::<Result<_>>()?;
    }
    let n = integer(body, "n")?.unwrap_or(1) as usize;
    if !(1..=MAX_CHOICES).contains(&n) {
        return Err(BadRequest::param(
            "n",
            format!("{n} choices; between 1 and {MAX_CHOICES} per request"),
        ));
    }
    let logprobs = match api {
        Api::Chat => {
            let top = integer(body, "top_logprobs")?;
            if top.is_some_and(|k| k > 20) {
                return Err(BadRequest::param("top_logprobs", "at most 20"));
            }
            match (boolean(body, "logprobs")?, top) {
                (true, k) => Some(k.unwrap_or(0) as usize),
                (false, Some(_)) => {
                    return Err(BadRequest::param("top_logprobs", "needs `logprobs: true`"))
                }
                (false, None) => None,
            }
        }
        Api::Completions => match integer(body, "logprobs")? {
            Some(k) if k > 5 => return Err(BadRequest::param("logprobs", "at most 5")),
            k => k.map(|k| k as usize),
        },
    };
    let max_tokens = match integer(body, "max_completion_tokens")? {
        Some(n) => Some(n),
        None => integer(body, "max_tokens")?,
    };
    let stop = match field(body, "stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| BadRequest::param("stop", "expected strings"))
            })
            .collect::<Result<_>>()?,
        Some(v) => {
            return Err(BadRequest::param(
                "stop",
                format!("expected a string or an array of strings, got {}", kind(v)),
            ))
        }
    };
    let stream = boolean(body, "stream")?;
    let include_usage = match field(body, "stream_options") {
        None => false,
        Some(Value::Object(o)) => boolean(o, "include_usage")?,
        Some(v) => {
            return Err(BadRequest::param(
                "stream_options",
                format!("expected an object, got {}", kind(v)),
            ))
        }
    };
    let constraint = constraint(body)?;
    for unsupported in ["tools", "functions"] {
        if field(body, unsupported).is_some() {
            return Err(BadRequest::param(
                unsupported,
                "not supported by this server",
            ));
        }
    }
    Ok(Params {
        max_tokens: max_tokens.map(|n| n as usize),
        sampler: s,
        stop,
        stream,
        include_usage,
        ignore_eos: boolean(body, "ignore_eos")?,
        n,
        logprobs,
        constraint,
    })
}

/// Structured output from OpenAI's `response_format` (`text`,
/// `json_object`, `json_schema`) or llama-server's `json_schema` (a schema)
/// and `grammar` (here a Lark grammar in llguidance's dialect); at most one.
fn constraint(body: &Map<String, Value>) -> Result<Option<(&'static str, rlx_guide::Spec)>> {
    use rlx_guide::Spec;
    let mut found: Vec<(&'static str, Spec)> = Vec::new();
    match field(body, "response_format") {
        None => {}
        Some(Value::Object(o)) => match o.get("type").and_then(Value::as_str) {
            Some("text") => {}
            Some("json_object") => found.push(("response_format", Spec::JsonObject)),
            Some("json_schema") => {
                let schema = o
                    .get("json_schema")
                    .and_then(|j| j.get("schema"))
                    .filter(|s| s.is_object() || s.is_boolean())
                    .ok_or_else(|| {
                        BadRequest::param(
                            "response_format",
                            "`json_schema.schema` must be a JSON schema object",
                        )
                    })?;
                found.push(("response_format", Spec::JsonSchema(schema.clone())));
            }
            other => {
                return Err(BadRequest::param(
                    "response_format",
                    format!(
                        "type {}; expected \"text\", \"json_object\" or \"json_schema\"",
                        other.map_or("missing".into(), |t| format!("{t:?}"))
                    ),
                ))
            }
        },
        Some(v) => {
            return Err(BadRequest::param(
                "response_format",
                format!("expected an object, got {}", kind(v)),
            ))
        }
    }
    match field(body, "json_schema") {
        None => {}
        Some(v @ Value::Object(_)) => found.push(("json_schema", Spec::JsonSchema(v.clone()))),
        Some(v) => {
            return Err(BadRequest::param(
                "json_schema",
                format!("expected a JSON schema object, got {}", kind(v)),
            ))
        }
    }
    match field(body, "grammar") {
        None => {}
        Some(Value::String(g)) => found.push(("grammar", Spec::Lark(g.clone()))),
        Some(v) => {
            return Err(BadRequest::param(
                "grammar",
                format!("expected a string, got {}", kind(v)),
            ))
        }
    }
    if found.len() > 1 {
        return Err(BadRequest::param(
            found[1].0,
            format!(
                "give one of response_format, json_schema and grammar, not {} too",
                found[0].0
            ),
        ));
    }
    Ok(found.pop())
}

/// `messages` as role and text; text parts of a content array are joined.
pub fn messages(body: &Map<String, Value>) -> Result<Vec<ChatMessage>> {
    let list = match field(body, "messages") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => return Err(BadRequest::param("messages", "must not be empty")),
        Some(v) => {
            return Err(BadRequest::param(
                "messages",
                format!("expected an array, got {}", kind(v)),
            ))
        }
        None => return Err(BadRequest::param("messages", "is required")),
    };
    list.iter()
        .enumerate()
        .map(|(i, m)| {
            let at = format!("messages[{i}]");
            let m = m
                .as_object()
                .ok_or_else(|| BadRequest::param(&at, "expected an object"))?;
            let role = match m.get("role").and_then(Value::as_str) {
                Some("developer") | Some("system") => "system",
                Some("user") => "user",
                Some("assistant") => "assistant",
                Some(other) => {
                    return Err(BadRequest::param(
                        &format!("{at}.role"),
                        format!("unknown role {other:?} (system, developer, user or assistant)"),
                    ))
                }
                None => return Err(BadRequest::param(&format!("{at}.role"), "is required")),
            };
            let content = match m.get("content") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(Value::Array(parts)) => {
                    let mut text = String::new();
                    for (j, part) in parts.iter().enumerate() {
                        let where_ = format!("{at}.content[{j}]");
                        match part.get("type").and_then(Value::as_str) {
                            Some("text") => {
                                text.push_str(part.get("text").and_then(Value::as_str).ok_or_else(
                                    || BadRequest::param(&where_, "a text part needs `text`"),
                                )?)
                            }
                            Some(t) => {
                                return Err(BadRequest::param(
                                    &where_,
                                    format!("content parts of type {t:?} are not supported"),
                                ))
                            }
                            None => return Err(BadRequest::param(&where_, "needs a `type`")),
                        }
                    }
                    text
                }
                Some(v) => {
                    return Err(BadRequest::param(
                        &format!("{at}.content"),
                        format!("expected a string or an array of parts, got {}", kind(v)),
                    ))
                }
            };
            Ok(ChatMessage::new(role, content))
        })
        .collect()
}

/// A completion prompt: a string, a one-string array, or token ids.
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

pub fn prompt(body: &Map<String, Value>) -> Result<Prompt> {
    let bad = |what: String| BadRequest::param("prompt", what);
    match field(body, "prompt") {
        Some(Value::String(s)) => Ok(Prompt::Text(s.clone())),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            Ok(Prompt::Text(a[0].as_str().unwrap_or_default().to_owned()))
        }
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_u64) => {
            Ok(Prompt::Tokens(token_ids(a, "prompt")?))
        }
        Some(Value::Array(_)) => Err(bad(
            "expected one string or an array of token ids (one prompt per request)".into(),
        )),
        Some(v) => Err(bad(format!("expected a string, got {}", kind(v)))),
        None => Err(bad("is required".into())),
    }
}

/// An array of token ids, each a u32.
fn token_ids(a: &[Value], param: &str) -> Result<Vec<u32>> {
    a.iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_u64()
                .and_then(|t| u32::try_from(t).ok())
                .ok_or_else(|| {
                    BadRequest::param(param, format!("item {i} ({v}) is not a token id"))
                })
        })
        .collect()
}

/// `POST /tokenize` (llama-server's shape).
pub struct Tokenize {
    pub content: String,
    /// Add BOS as the vocabulary asks (default false).
    pub add_special: bool,
    /// Parse special-token text such as `<start_of_turn>` (default true).
    pub parse_special: bool,
    /// Return `{id, piece}` objects instead of bare ids.
    pub with_pieces: bool,
}

pub fn tokenize(body: &Map<String, Value>) -> Result<Tokenize> {
    let content = match field(body, "content") {
        Some(Value::String(s)) => s.clone(),
        Some(v) => {
            return Err(BadRequest::param(
                "content",
                format!("expected a string, got {}", kind(v)),
            ))
        }
        None => return Err(BadRequest::param("content", "is required")),
    };
    Ok(Tokenize {
        content,
        add_special: boolean(body, "add_special")?,
        parse_special: field(body, "parse_special").is_none() || boolean(body, "parse_special")?,
        with_pieces: boolean(body, "with_pieces")?,
    })
}

/// `POST /detokenize`: the `tokens` to turn into text.
pub fn detokenize(body: &Map<String, Value>) -> Result<Vec<u32>> {
    match field(body, "tokens") {
        Some(Value::Array(a)) => token_ids(a, "tokens"),
        Some(v) => Err(BadRequest::param(
            "tokens",
            format!("expected an array of token ids, got {}", kind(v)),
        )),
        None => Err(BadRequest::param("tokens", "is required")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn fields_override_the_defaults() {
        let body = obj(
            json!({"temperature": 0, "top_k": 5, "stop": "END", "max_tokens": 7,
                              "stream": true, "stream_options": {"include_usage": true},
                              "logit_bias": {"42": -100, "7": 2.5}}),
        );
        let p = params(&body, Api::Chat, &SamplerConfig::default(), 9).unwrap();
        assert_eq!(p.sampler.temperature, 0.0);
        assert_eq!(p.sampler.top_k, 5);
        assert_eq!(p.sampler.seed, 9);
        assert_eq!(p.stop, ["END"]);
        assert_eq!(p.max_tokens, Some(7));
        assert!(p.stream && p.include_usage);
        assert!(p.sampler.logit_bias.contains(&(42, f32::NEG_INFINITY)));
        assert!(p.sampler.logit_bias.contains(&(7, 2.5)));
    }

    #[test]
    fn bad_fields_name_themselves() {
        let d = SamplerConfig::default();
        let chat = |v: Value| params(&obj(v), Api::Chat, &d, 0);
        let e = chat(json!({"temperature": "hot"})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("temperature"));
        let e = chat(json!({"top_p": 3})).unwrap_err();
        assert!(e.message.contains("outside"), "{}", e.message);
        let e = chat(json!({"n": 0})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("n"));
        let e = chat(json!({"n": 17})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("n"));
        assert_eq!(chat(json!({"n": 3})).unwrap().n, 3);
        let e = chat(json!({"top_logprobs": 2})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("top_logprobs"));
        let p = chat(json!({"logprobs": true, "top_logprobs": 2})).unwrap();
        assert_eq!(p.logprobs, Some(2));
        let e = chat(json!({"logprobs": 2})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("logprobs"));
        let text = |v: Value| params(&obj(v), Api::Completions, &d, 0);
        assert_eq!(text(json!({"logprobs": 3})).unwrap().logprobs, Some(3));
        assert_eq!(text(json!({})).unwrap().logprobs, None);
        let e = text(json!({"logprobs": 6})).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("logprobs"));
        let e = messages(&obj(
            json!({"messages": [{"role": "robot", "content": "x"}]}),
        ))
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].role"));
        let e = messages(&obj(json!({"messages": [{"role": "user",
            "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})))
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages[0].content[0]"));
        assert!(object(b"{not json")
            .unwrap_err()
            .message
            .contains("not valid JSON"));
    }

    #[test]
    fn content_parts_and_roles() {
        let m = messages(&obj(json!({"messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}
        ]})))
        .unwrap();
        assert_eq!(m[0].role, "system");
        assert_eq!(m[1].content, "Hi there");
    }
}
