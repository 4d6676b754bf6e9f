//! OpenAI request bodies read from JSON, with errors that name the field.

use rlx_gemma::sampling::SamplerConfig;
use rlx_guide::tools::{Tool, ToolCall, ToolChoice, ToolUse};
use serde_json::{json, Map, Value};

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
    /// How the constraint treats the budget and JSON values
    /// (`close_within_budget`, `json_limits`).
    pub guide: rlx_guide::GuideOptions,
    /// Functions the model may call (chat only).
    pub tools: Option<ToolUse>,
    /// `chat_template_kwargs.enable_thinking` (chat only).
    pub enable_thinking: Option<bool>,
    /// rlx's `speculative` (default true): `false` decodes this request one
    /// token a step where the server drafts (`rlx serve --spec`).
    pub speculative: bool,
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
    let guide = guide_options(body)?;
    if field(body, "functions").is_some() {
        return Err(BadRequest::param(
            "functions",
            "the deprecated functions API is not supported; use `tools`",
        ));
    }
    let (tools, enable_thinking) = match api {
        Api::Chat => (tool_use(body)?, thinking(body)?),
        Api::Completions => {
            for chat_only in ["tools", "tool_choice", "chat_template_kwargs"] {
                if field(body, chat_only).is_some() {
                    return Err(BadRequest::param(chat_only, "only for chat completions"));
                }
            }
            (None, None)
        }
    };
    if let (Some((f, _)), Some(t)) = (&constraint, &tools) {
        if t.choice != ToolChoice::None {
            return Err(BadRequest::param(
                f,
                "structured output and tool calls together are not supported; give `tool_choice: \"none\"` or leave one out",
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
        guide,
        tools,
        enable_thinking,
        speculative: field(body, "speculative").is_none() || boolean(body, "speculative")?,
    })
}

/// rlx's own fields: `close_within_budget` (default true: a constrained
/// output about to run out of tokens is closed by its shortest valid
/// continuation) and `json_limits` (`false`, or an object overriding the
/// soft limits' `digits`, `string_chars` and `array_items`).
fn guide_options(body: &Map<String, Value>) -> Result<rlx_guide::GuideOptions> {
    const LIMITS: &str = "digits, string_chars or array_items";
    let mut opts = rlx_guide::GuideOptions {
        close: field(body, "close_within_budget").is_none()
            || boolean(body, "close_within_budget")?,
        ..rlx_guide::GuideOptions::default()
    };
    match field(body, "json_limits") {
        None | Some(Value::Bool(true)) => {}
        Some(Value::Bool(false)) => opts.limits = None,
        Some(Value::Object(o)) => {
            let mut l = rlx_guide::ValueLimits::default();
            for (key, value) in o {
                let slot = match key.as_str() {
                    "digits" => &mut l.digits,
                    "string_chars" => &mut l.string_chars,
                    "array_items" => &mut l.array_items,
                    other => {
                        let msg = format!("unknown limit `{other}`; expected {LIMITS}");
                        return Err(BadRequest::param("json_limits", msg));
                    }
                };
                *slot = value.as_u64().filter(|&n| n > 0).ok_or_else(|| {
                    BadRequest::param(
                        "json_limits",
                        format!("`{key}` must be a positive integer, got {value}"),
                    )
                })? as usize;
            }
            opts.limits = Some(l);
        }
        Some(v) => {
            return Err(BadRequest::param(
                "json_limits",
                format!("expected false or an object, got {}", kind(v)),
            ))
        }
    }
    Ok(opts)
}

/// `tools`, `tool_choice` and `parallel_tool_calls`; `None` without tools.
fn tool_use(body: &Map<String, Value>) -> Result<Option<ToolUse>> {
    let list = match field(body, "tools") {
        None => None,
        Some(Value::Array(a)) if a.is_empty() => None,
        Some(Value::Array(a)) => Some(a),
        Some(v) => {
            return Err(BadRequest::param(
                "tools",
                format!("expected an array of tools, got {}", kind(v)),
            ))
        }
    };
    let parallel =
        field(body, "parallel_tool_calls").is_none() || boolean(body, "parallel_tool_calls")?;
    let Some(list) = list else {
        return match field(body, "tool_choice") {
            None => Ok(None),
            Some(Value::String(s)) if s == "none" => Ok(None),
            Some(_) => Err(BadRequest::param("tool_choice", "needs `tools`")),
        };
    };
    let mut tools: Vec<Tool> = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let at = format!("tools[{i}]");
        let o = t
            .as_object()
            .ok_or_else(|| BadRequest::param(&at, "expected an object"))?;
        match o.get("type").and_then(Value::as_str) {
            Some("function") => {}
            other => {
                return Err(BadRequest::param(
                    &format!("{at}.type"),
                    format!("{other:?}; only \"function\" tools are supported"),
                ))
            }
        }
        let f = o
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| BadRequest::param(&format!("{at}.function"), "is required"))?;
        let name = f.get("name").and_then(Value::as_str).unwrap_or_default();
        let name_ok = (1..=64).contains(&name.len())
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !name_ok {
            return Err(BadRequest::param(
                &format!("{at}.function.name"),
                format!("{name:?}: 1 to 64 letters, digits, underscores, dashes or dots"),
            ));
        }
        if tools.iter().any(|t| t.name == name) {
            return Err(BadRequest::param(
                &format!("{at}.function.name"),
                format!("{name:?} is declared twice"),
            ));
        }
        let description = match f.get("description") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(d)) => d.clone(),
            Some(v) => {
                return Err(BadRequest::param(
                    &format!("{at}.function.description"),
                    format!("expected a string, got {}", kind(v)),
                ))
            }
        };
        let parameters = match f.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(v) => {
                return Err(BadRequest::param(
                    &format!("{at}.function.parameters"),
                    format!("expected a JSON schema object, got {}", kind(v)),
                ))
            }
        };
        tools.push(Tool {
            name: name.to_owned(),
            description,
            parameters,
        });
    }
    let choice = match field(body, "tool_choice") {
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(BadRequest::param(
                    "tool_choice",
                    format!("{other:?}; expected \"none\", \"auto\", \"required\" or a function"),
                ))
            }
        },
        Some(Value::Object(o)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    BadRequest::param(
                        "tool_choice",
                        "a named choice is {\"type\": \"function\", \"function\": {\"name\": …}}",
                    )
                })?;
            if !tools.iter().any(|t| t.name == name) {
                return Err(BadRequest::param(
                    "tool_choice",
                    format!("function {name:?} is not among `tools`"),
                ));
            }
            ToolChoice::Named(name.to_owned())
        }
        Some(v) => {
            return Err(BadRequest::param(
                "tool_choice",
                format!("expected a string or an object, got {}", kind(v)),
            ))
        }
    };
    Ok(Some(ToolUse {
        tools,
        choice,
        parallel,
    }))
}

/// `chat_template_kwargs`: only `enable_thinking` is read.
fn thinking(body: &Map<String, Value>) -> Result<Option<bool>> {
    match field(body, "chat_template_kwargs") {
        None => Ok(None),
        Some(Value::Object(o)) => {
            for key in o.keys() {
                if key != "enable_thinking" {
                    return Err(BadRequest::param(
                        "chat_template_kwargs",
                        format!("{key:?}: only `enable_thinking` is supported"),
                    ));
                }
            }
            match o.get("enable_thinking") {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Bool(b)) => Ok(Some(*b)),
                Some(v) => Err(BadRequest::param(
                    "chat_template_kwargs",
                    format!("`enable_thinking` must be a boolean, got {}", kind(v)),
                )),
            }
        }
        Some(v) => Err(BadRequest::param(
            "chat_template_kwargs",
            format!("expected an object, got {}", kind(v)),
        )),
    }
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

/// One chat message: role, text, and the tool calls or tool result it
/// carries.
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    /// `system` (also for `developer`), `user`, `assistant` or `tool`.
    pub role: &'static str,
    /// The text; parts of a content array joined.
    pub content: String,
    /// An assistant's calls, with their ids.
    pub tool_calls: Vec<(String, ToolCall)>,
    /// A tool result's call id.
    pub tool_call_id: Option<String>,
    /// A tool result's function name, when the client gives it.
    pub name: Option<String>,
}

/// `messages`, checked: roles, text, assistants' `tool_calls` (arguments a
/// JSON object, or a string holding one) and tool results.
pub fn messages(body: &Map<String, Value>) -> Result<Vec<Message>> {
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
                Some("tool") => "tool",
                Some(other) => {
                    return Err(BadRequest::param(
                        &format!("{at}.role"),
                        format!(
                            "unknown role {other:?} (system, developer, user, assistant or tool)"
                        ),
                    ))
                }
                None => return Err(BadRequest::param(&format!("{at}.role"), "is required")),
            };
            let content = content_text(m.get("content"), &at)?;
            let tool_calls = match (role, field(m, "tool_calls")) {
                (_, None) => Vec::new(),
                ("assistant", Some(Value::Array(calls))) => calls
                    .iter()
                    .enumerate()
                    .map(|(j, c)| tool_call(c, &format!("{at}.tool_calls[{j}]")))
                    .collect::<Result<_>>()?,
                ("assistant", Some(v)) => {
                    return Err(BadRequest::param(
                        &format!("{at}.tool_calls"),
                        format!("expected an array, got {}", kind(v)),
                    ))
                }
                (_, Some(_)) => {
                    return Err(BadRequest::param(
                        &format!("{at}.tool_calls"),
                        "only assistant messages carry tool calls",
                    ))
                }
            };
            let text_field = |key: &str| -> Result<Option<String>> {
                match field(m, key) {
                    None => Ok(None),
                    Some(Value::String(s)) => Ok(Some(s.clone())),
                    Some(v) => Err(BadRequest::param(
                        &format!("{at}.{key}"),
                        format!("expected a string, got {}", kind(v)),
                    )),
                }
            };
            Ok(Message {
                role,
                content,
                tool_calls,
                tool_call_id: text_field("tool_call_id")?,
                name: text_field("name")?,
            })
        })
        .collect()
}

/// Copies the fields of `keys` that `from` has (and are not null) to `to`,
/// under the same names: another API's fields that OpenAI's request reads
/// as they are.
pub(crate) fn copy_present(from: &Map<String, Value>, to: &mut Map<String, Value>, keys: &[&str]) {
    for &key in keys {
        if let Some(v) = from.get(key).filter(|v| !v.is_null()) {
            to.insert(key.into(), v.clone());
        }
    }
}

/// A function tool in OpenAI's chat shape (`parameters` an object schema
/// where none is given).
pub(crate) fn function_tool(
    name: &Value,
    description: Option<&Value>,
    parameters: Option<&Value>,
) -> Value {
    json!({"type": "function", "function": {
        "name": name, "description": description.unwrap_or(&json!("")),
        "parameters": parameters.unwrap_or(&json!({"type": "object"}))}})
}

/// A content value's text: a string (or null: none), or the `text` of its
/// parts whose `type` is one of `kinds`, joined; another kind of part is
/// refused by name.
pub(crate) fn parts_text(v: &Value, at: &str, kinds: &[&str]) -> Result<String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(parts) => {
            let mut text = String::new();
            for (i, p) in parts.iter().enumerate() {
                match p.get("type").and_then(Value::as_str) {
                    Some(k) if kinds.contains(&k) => {
                        text.push_str(p["text"].as_str().unwrap_or(""))
                    }
                    Some(other) => {
                        return Err(BadRequest::param(
                            &format!("{at}[{i}].type"),
                            format!("{other:?} is not supported here ({})", kinds.join(", ")),
                        ))
                    }
                    None => {
                        return Err(BadRequest::param(&format!("{at}[{i}].type"), "is required"))
                    }
                }
            }
            Ok(text)
        }
        _ => Err(BadRequest::param(at, "expected a string or content parts")),
    }
}

/// A message's `content`: a string, null, or text parts.
fn content_text(content: Option<&Value>, at: &str) -> Result<String> {
    match content {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Null) | None => Ok(String::new()),
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
            Ok(text)
        }
        Some(v) => Err(BadRequest::param(
            &format!("{at}.content"),
            format!("expected a string or an array of parts, got {}", kind(v)),
        )),
    }
}

/// One entry of an assistant's `tool_calls`: its id and the call.
fn tool_call(c: &Value, at: &str) -> Result<(String, ToolCall)> {
    let f = c
        .get("function")
        .and_then(Value::as_object)
        .ok_or_else(|| BadRequest::param(&format!("{at}.function"), "is required"))?;
    let name = f
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| BadRequest::param(&format!("{at}.function.name"), "is required"))?;
    let bad_args = || {
        BadRequest::param(
            &format!("{at}.function.arguments"),
            "expected a JSON object, or a string holding one",
        )
    };
    let arguments = match f.get("arguments") {
        None | Some(Value::Null) => json!({}),
        Some(Value::String(s)) if s.trim().is_empty() => json!({}),
        Some(Value::String(s)) => serde_json::from_str::<Value>(s)
            .ok()
            .filter(Value::is_object)
            .ok_or_else(bad_args)?,
        Some(o @ Value::Object(_)) => o.clone(),
        Some(_) => return Err(bad_args()),
    };
    let id = c
        .get("id")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    Ok((
        id,
        ToolCall {
            name: name.to_owned(),
            arguments,
        },
    ))
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
