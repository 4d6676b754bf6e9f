//! Ollama's API beside OpenAI's, so that Ollama's own clients and the tools
//! built on them work against `rlx serve`: `POST /api/generate` and
//! `POST /api/chat` (streamed as newline-delimited JSON unless `"stream":
//! false`), `GET /api/tags`, `POST /api/show`, `GET /api/ps`, `GET
//! /api/version`; `/api/embed` and `/api/embeddings` answer that
//! embeddings are not served. A generation request is read as the OpenAI
//! request it means ([`to_openai`]) and runs as that one does; the answer
//! is written in Ollama's shapes, errors as `{"error": "..."}`.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::StreamExt;

use crate::complete::Queued;
use crate::engine::{Event, Finish};
use crate::openai::{copy_present, object, BadRequest};
use crate::response::ApiError;
use crate::{Endpoint, Server};

/// What `/api/tags`, `/api/show` and `/api/ps` tell of the model.
#[derive(Clone, Debug, Default)]
pub(crate) struct ModelFacts {
    /// `general.architecture`.
    pub family: String,
    /// The file's bytes.
    pub size: u64,
    pub parameters: u64,
    /// llama.cpp's name of `general.file_type` (`Q4_K_M`), where known.
    pub quantization: String,
    /// Whether the model writes thinking apart (Gemma 4's channels).
    pub thinking: bool,
}

impl ModelFacts {
    /// What Ollama calls a model's details.
    fn details(&self) -> Value {
        json!({"format": "gguf", "family": self.family, "families": [self.family],
               "parameter_size": parameter_size(self.parameters),
               "quantization_level": self.quantization, "parent_model": ""})
    }
}

/// `270M`, `1.0B`, as Ollama writes a parameter count.
fn parameter_size(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.1}B", n as f64 / 1e9)
    } else {
        format!("{}M", (n + 500_000) / 1_000_000)
    }
}

/// Which generation endpoint a request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Api {
    Generate,
    Chat,
}

impl Api {
    fn path(self) -> &'static str {
        match self {
            Api::Generate => "/api/generate",
            Api::Chat => "/api/chat",
        }
    }

    /// Where a line carries the reply.
    fn key(self) -> &'static str {
        match self {
            Api::Generate => "response",
            Api::Chat => "message",
        }
    }
}

/// An OpenAI request: the endpoint it goes to and its body.
pub(crate) type OpenAiRequest = (Endpoint, Map<String, Value>);

/// An Ollama request read as the OpenAI request it means: where it goes
/// (`/api/generate` with `"raw": true` is a text completion, without it a
/// chat of the system and user turns; `/api/chat` a chat), and its body.
/// `None` where there is nothing to generate (no prompt, no messages):
/// Ollama's way of asking for the model to be loaded.
pub(crate) fn to_openai(
    api: Api,
    body: &Map<String, Value>,
) -> Result<Option<OpenAiRequest>, BadRequest> {
    let mut out = Map::new();
    let stream = match body.get("stream") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(BadRequest::param("stream", "expected true or false")),
    };
    out.insert("stream".into(), json!(stream));
    if let Some(opts) = body.get("options").filter(|v| !v.is_null()) {
        let opts = opts
            .as_object()
            .ok_or_else(|| BadRequest::param("options", "expected an object"))?;
        // Ollama's options that are sampling; the others (num_ctx,
        // num_thread, num_gpu, …) size Ollama's runner and mean nothing here.
        copy_present(
            opts,
            &mut out,
            &[
                "temperature",
                "top_k",
                "top_p",
                "min_p",
                "typical_p",
                "repeat_penalty",
                "presence_penalty",
                "frequency_penalty",
                "repeat_last_n",
                "seed",
                "stop",
            ],
        );
        // -1 (no limit) and -2 (fill the context) leave the server's cap.
        match opts.get("num_predict") {
            Some(Value::Number(n)) if n.as_i64().is_some_and(|n| n >= 0) => {
                out.insert("max_tokens".into(), Value::Number(n.clone()));
            }
            Some(Value::Number(n)) if n.as_i64().is_some_and(|n| n < 0) => {}
            None | Some(Value::Null) => {}
            Some(_) => {
                return Err(BadRequest::param(
                    "options.num_predict",
                    "expected an integer",
                ))
            }
        }
    }
    match body.get("format") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(Value::String(s)) if s == "json" => {
            out.insert("response_format".into(), json!({"type": "json_object"}));
        }
        Some(schema @ Value::Object(_)) => {
            out.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": {"schema": schema}}),
            );
        }
        Some(_) => {
            return Err(BadRequest::param(
                "format",
                "expected \"json\" or a JSON schema",
            ))
        }
    }
    let think = match body.get("think") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(_) => return Err(BadRequest::param("think", "expected true or false")),
    };
    let text = |key: &str| -> Result<Option<&str>, BadRequest> {
        match body.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(BadRequest::param(key, "expected a string")),
        }
    };
    let unsupported = |key: &str, why: &str| -> Result<(), BadRequest> {
        match body.get(key) {
            None | Some(Value::Null) => Ok(()),
            Some(Value::Array(a)) if a.is_empty() => Ok(()),
            Some(_) => Err(BadRequest::param(key, why)),
        }
    };
    unsupported("images", "images are not supported yet")?;
    let endpoint = match api {
        Api::Generate => {
            unsupported("suffix", "fill-in-the-middle is not supported")?;
            if text("template")?.is_some_and(|t| !t.is_empty()) {
                return Err(BadRequest::param(
                    "template",
                    "a template of the request's own is not supported: the model's chat template applies (or \"raw\": true)",
                ));
            }
            unsupported(
                "context",
                "is not supported: send the conversation to /api/chat",
            )?;
            let Some(prompt) = text("prompt")?.filter(|p| !p.is_empty()) else {
                return Ok(None);
            };
            if body.get("raw").and_then(Value::as_bool) == Some(true) {
                out.insert("prompt".into(), json!(prompt));
                Endpoint::Completion
            } else {
                let mut messages = Vec::new();
                if let Some(system) = text("system")?.filter(|s| !s.is_empty()) {
                    messages.push(json!({"role": "system", "content": system}));
                }
                messages.push(json!({"role": "user", "content": prompt}));
                out.insert("messages".into(), Value::Array(messages));
                Endpoint::Chat
            }
        }
        Api::Chat => {
            let messages = match body.get("messages") {
                None | Some(Value::Null) => return Ok(None),
                Some(Value::Array(a)) if a.is_empty() => return Ok(None),
                Some(Value::Array(a)) => a,
                Some(_) => return Err(BadRequest::param("messages", "expected an array")),
            };
            let messages = messages
                .iter()
                .enumerate()
                .map(|(i, m)| chat_message(m, &format!("messages[{i}]")))
                .collect::<Result<Vec<_>, _>>()?;
            out.insert("messages".into(), Value::Array(messages));
            if let Some(tools) = body.get("tools").filter(|v| !v.is_null()) {
                out.insert("tools".into(), tools.clone());
            }
            Endpoint::Chat
        }
    };
    if let (Some(think), Endpoint::Chat) = (think, endpoint) {
        out.insert(
            "chat_template_kwargs".into(),
            json!({"enable_thinking": think}),
        );
    }
    Ok(Some((endpoint, out)))
}

/// An Ollama chat message as OpenAI's: a tool result's `tool_name` is its
/// `name`; images are refused; earlier thinking is not sent back.
fn chat_message(m: &Value, at: &str) -> Result<Value, BadRequest> {
    let m = m
        .as_object()
        .ok_or_else(|| BadRequest::param(at, "expected an object"))?;
    if m.get("images")
        .is_some_and(|v| !v.is_null() && v.as_array().is_none_or(|a| !a.is_empty()))
    {
        return Err(BadRequest::param(
            &format!("{at}.images"),
            "images are not supported yet",
        ));
    }
    let mut out = Map::new();
    copy_present(m, &mut out, &["role", "content", "tool_calls"]);
    if let Some(name) = m.get("tool_name") {
        out.insert("name".into(), name.clone());
    }
    Ok(Value::Object(out))
}

/// Now as Ollama writes times (RFC 3339, UTC).
fn now_rfc3339() -> String {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let secs = d.as_secs();
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        d.subsec_millis()
    )
}

/// An error in Ollama's shape.
fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(json!({"error": message.into()}))).into_response()
}

/// An engine or request error in Ollama's shape.
fn failed(e: ApiError) -> Response {
    error(e.status, e.message)
}

/// The statistics Ollama's last message carries (durations in ns).
fn stats(f: &Finish) -> Map<String, Value> {
    let ns = |s: f64| (s * 1e9) as u64;
    let mut m = Map::new();
    m.insert("done_reason".into(), json!(f.reason.as_str()));
    m.insert(
        "total_duration".into(),
        json!(ns(f.prefill_secs + f.decode_secs)),
    );
    m.insert("load_duration".into(), json!(0));
    m.insert("prompt_eval_count".into(), json!(f.prompt_tokens));
    m.insert("prompt_eval_duration".into(), json!(ns(f.prefill_secs)));
    m.insert("eval_count".into(), json!(f.completion_tokens));
    m.insert("eval_duration".into(), json!(ns(f.decode_secs)));
    m
}

/// A reply's delta (or whole message) in Ollama's shape: `content`,
/// `thinking`, and `tool_calls` whose arguments are objects.
fn message(delta: &Map<String, Value>) -> Value {
    let mut m = json!({"role": "assistant", "content": ""});
    if let Some(c) = delta.get("content").and_then(Value::as_str) {
        m["content"] = json!(c);
    }
    if let Some(t) = delta.get("reasoning_content").and_then(Value::as_str) {
        m["thinking"] = json!(t);
    }
    if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
        let calls: Vec<Value> = calls
            .iter()
            .map(|c| {
                let f = &c["function"];
                let args = f["arguments"]
                    .as_str()
                    .and_then(|a| serde_json::from_str(a).ok())
                    .unwrap_or_else(|| f["arguments"].clone());
                json!({"function": {"name": f["name"], "arguments": args}})
            })
            .collect();
        m["tool_calls"] = Value::Array(calls);
    }
    m
}

/// One line of an answer: a piece of the reply (`delta`: content, thinking
/// and calls as the chat reply reader gives them), the last with the counts.
fn line(api: Api, model: &str, delta: &Map<String, Value>, f: Option<&Finish>) -> Value {
    let mut v = json!({"model": model, "created_at": now_rfc3339(), "done": f.is_some()});
    match api {
        Api::Chat => v[api.key()] = message(delta),
        // The text, with any thinking apart, as Ollama's generate gives it.
        Api::Generate => {
            v[api.key()] = delta
                .get("content")
                .filter(|c| c.is_string())
                .cloned()
                .unwrap_or(json!(""));
            if let Some(t) = delta.get("reasoning_content").filter(|t| t.is_string()) {
                v["thinking"] = t.clone();
            }
        }
    }
    if let (Some(f), Value::Object(o)) = (f, &mut v) {
        o.extend(stats(f));
    }
    v
}

/// A text completion's text as a reply's piece.
fn text_delta(text: &str) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("content".into(), json!(text));
    m
}

impl Server {
    /// `/api/generate` and `/api/chat`.
    async fn ollama(self: Arc<Self>, api: Api, body: Bytes) -> Response {
        let model = self.opts.model_name.clone();
        let request = match object(&body).and_then(|b| to_openai(api, &b)) {
            Ok(r) => r,
            Err(e) => return failed(ApiError::from(e)),
        };
        let Some((endpoint, request)) = request else {
            // Nothing to generate: the model is loaded.
            let mut done = line(api, &model, &Map::new(), None);
            done["done"] = json!(true);
            done["done_reason"] = json!("load");
            return Json(done).into_response();
        };
        let prefix = match endpoint {
            Endpoint::Chat => "chatcmpl-",
            Endpoint::Completion => "cmpl-",
        };
        let Queued {
            id,
            stream,
            mut events,
            mut reply,
        } = match self.start_translated(endpoint, request, prefix, api.path()) {
            Ok(q) => q,
            Err(e) => return failed(e),
        };
        if stream {
            let (out, lines) = tokio::sync::mpsc::unbounded_channel::<Value>();
            let server = Arc::clone(&self);
            tokio::spawn(async move {
                while let Some((_, ev)) = events.recv().await {
                    let v = match ev {
                        Event::Text(t) | Event::Token { text: t, .. } => {
                            let delta = match reply.as_mut() {
                                Some(r) => r.push(&t),
                                None => text_delta(&t),
                            };
                            line(api, &model, &delta, None)
                        }
                        Event::Done(f) => {
                            server.log(&id, api.path(), true, StatusCode::OK, Ok(f));
                            let delta = match reply.as_mut() {
                                Some(r) => r.finish(f.closed_at),
                                None => Map::new(),
                            };
                            line(api, &model, &delta, Some(&f))
                        }
                        Event::Error(e) => {
                            let e = ApiError::from(e);
                            server.log(&id, api.path(), true, e.status, Err(e.message.clone()));
                            json!({"error": e.message})
                        }
                    };
                    if out.send(v).is_err() {
                        return;
                    }
                }
            });
            let body = UnboundedReceiverStream::new(lines)
                .map(|v| Ok::<_, std::convert::Infallible>(format!("{v}\n")));
            return (
                [(header::CONTENT_TYPE, "application/x-ndjson")],
                Body::from_stream(body),
            )
                .into_response();
        }
        let (text, f) = match self.collect(&mut events, &id, api.path()).await {
            Ok(r) => r,
            Err(e) => return failed(e),
        };
        let delta = match reply.as_mut() {
            Some(r) => match r.whole(&text, f.closed_at) {
                Value::Object(m) => m,
                _ => Map::new(),
            },
            None => text_delta(&text),
        };
        Json(line(api, &model, &delta, Some(&f))).into_response()
    }

    /// The model as `/api/tags` and `/api/ps` list it.
    fn ollama_model(&self) -> Value {
        let f = &self.facts;
        json!({"name": self.opts.model_name, "model": self.opts.model_name,
               "modified_at": now_rfc3339(), "size": f.size, "digest": "",
               "details": f.details()})
    }
}

pub(crate) async fn generate(
    State(s): State<Arc<Server>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match body {
        Ok(body) => s.ollama(Api::Generate, body).await,
        Err(e) => failed(ApiError::from(e)),
    }
}

pub(crate) async fn chat(
    State(s): State<Arc<Server>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match body {
        Ok(body) => s.ollama(Api::Chat, body).await,
        Err(e) => failed(ApiError::from(e)),
    }
}

pub(crate) async fn tags(State(s): State<Arc<Server>>) -> Json<Value> {
    Json(json!({"models": [s.ollama_model()]}))
}

pub(crate) async fn ps(State(s): State<Arc<Server>>) -> Json<Value> {
    let mut m = s.ollama_model();
    m["expires_at"] = json!("2999-01-01T00:00:00Z");
    m["size_vram"] = json!(0);
    m["context_length"] = json!(s.engine.context());
    Json(json!({"models": [m]}))
}

pub(crate) async fn show(
    State(s): State<Arc<Server>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    if let Err(e) = body {
        return failed(ApiError::from(e));
    }
    let f = &s.facts;
    let mut capabilities = vec!["completion", "tools"];
    if f.thinking {
        capabilities.push("thinking");
    }
    let info = json!({
        "general.architecture": f.family,
        "general.parameter_count": f.parameters,
        format!("{}.context_length", f.family): s.engine.context(),
    });
    Json(json!({
        "modelfile": "", "parameters": "",
        "template": s.template.source().unwrap_or(""),
        "details": f.details(), "model_info": info, "capabilities": capabilities,
        "modified_at": now_rfc3339(),
    }))
    .into_response()
}

pub(crate) async fn version() -> Json<Value> {
    Json(json!({"version": env!("CARGO_PKG_VERSION")}))
}

pub(crate) async fn embed() -> Response {
    error(
        StatusCode::NOT_IMPLEMENTED,
        "embeddings are not served: these are generative models, with no pooled embedding to return",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(api: Api, v: Value) -> Result<Option<(Endpoint, Value)>, BadRequest> {
        let body = v.as_object().unwrap().clone();
        to_openai(api, &body).map(|r| r.map(|(e, m)| (e, Value::Object(m))))
    }

    #[test]
    fn requests_read_as_the_openai_requests_they_mean() {
        let (e, v) = read(
            Api::Generate,
            json!({"model": "m", "prompt": "Hi", "system": "Be brief", "stream": false,
                   "options": {"temperature": 0.2, "num_predict": 7, "num_ctx": 4096,
                               "stop": ["\n"]},
                   "format": "json", "think": false, "keep_alive": "5m"}),
        )
        .unwrap()
        .unwrap();
        assert!(e == Endpoint::Chat);
        assert_eq!(
            v,
            json!({"stream": false, "temperature": 0.2, "max_tokens": 7, "stop": ["\n"],
                   "response_format": {"type": "json_object"},
                   "messages": [{"role": "system", "content": "Be brief"},
                                {"role": "user", "content": "Hi"}],
                   "chat_template_kwargs": {"enable_thinking": false}})
        );
        let (e, v) = read(
            Api::Generate,
            json!({"prompt": "Once", "raw": true, "options": {"num_predict": -1}}),
        )
        .unwrap()
        .unwrap();
        assert!(e == Endpoint::Completion);
        assert_eq!(v, json!({"stream": true, "prompt": "Once"}));
        let schema = json!({"type": "object"});
        let (_, v) = read(
            Api::Chat,
            json!({"messages": [{"role": "user", "content": "x"},
                                {"role": "tool", "content": "4", "tool_name": "add"}],
                   "format": schema, "tools": []}),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            v["response_format"],
            json!({"type": "json_schema", "json_schema": {"schema": {"type": "object"}}})
        );
        assert_eq!(v["messages"][1]["name"], json!("add"));
        // Nothing to generate: a load.
        assert!(read(Api::Chat, json!({"model": "m"})).unwrap().is_none());
        assert!(read(Api::Generate, json!({"prompt": ""}))
            .unwrap()
            .is_none());
        // What cannot be served is refused by name.
        for (api, bad, field) in [
            (
                Api::Generate,
                json!({"prompt": "x", "images": ["AAAA"]}),
                "images",
            ),
            (
                Api::Generate,
                json!({"prompt": "x", "context": [1, 2]}),
                "context",
            ),
            (Api::Generate, json!({"prompt": "x", "format": 3}), "format"),
            (
                Api::Generate,
                json!({"prompt": "x", "template": "{{ .Prompt }}"}),
                "template",
            ),
            (
                Api::Chat,
                json!({"messages": [{"role": "user", "content": "x", "images": ["A"]}]}),
                "messages[0].images",
            ),
        ] {
            let e = read(api, bad).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(field), "{}", e.message);
        }
    }

    #[test]
    fn times_and_sizes_are_written_as_ollama_writes_them() {
        let t = now_rfc3339();
        assert_eq!(t.len(), 24, "{t}");
        assert!(
            t.starts_with("20") && t.ends_with('Z') && &t[10..11] == "T",
            "{t}"
        );
        assert_eq!(parameter_size(268_098_176), "268M");
        assert_eq!(parameter_size(3_880_000_000), "3.9B");
    }
}
