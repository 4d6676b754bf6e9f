//! Anthropic's Messages API beside OpenAI's, for the clients and coding
//! agents that speak it: `POST /v1/messages` (whole, or streamed as its
//! server-sent events) and `POST /v1/messages/count_tokens`. A request is
//! read as the OpenAI chat request it means ([`to_openai`]) and runs as
//! that one does; the answer is written as Anthropic's message (text,
//! `thinking` and `tool_use` content blocks, `stop_reason`, `usage`), errors
//! as `{"type": "error", "error": {"type", "message"}}`.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::Event as SseEvent;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};

use crate::complete::Queued;
use crate::engine::{Event, Finish, FinishReason};
use crate::openai::{copy_present, function_tool, object, parts_text, BadRequest};
use crate::reply::Reply;
use crate::response::ApiError;
use crate::{Endpoint, Server};

const PATH: &str = "/v1/messages";

/// A Messages request's text: a string, or its text blocks joined.
fn blocks_text(v: &Value, at: &str) -> Result<String, BadRequest> {
    parts_text(v, at, &["text"])
}

/// A Messages request read as the OpenAI chat request it means.
pub(crate) fn to_openai(body: &Map<String, Value>) -> Result<Map<String, Value>, BadRequest> {
    let mut out = Map::new();
    let mut messages = Vec::new();
    if let Some(system) = body.get("system").filter(|v| !v.is_null()) {
        let system = blocks_text(system, "system")?;
        if !system.is_empty() {
            messages.push(json!({"role": "system", "content": system}));
        }
    }
    let list = body
        .get("messages")
        .and_then(Value::as_array)
        .filter(|a| !a.is_empty())
        .ok_or_else(|| BadRequest::param("messages", "is required: a non-empty array"))?;
    for (i, m) in list.iter().enumerate() {
        let at = format!("messages[{i}]");
        let role = m.get("role").and_then(Value::as_str);
        let content = m.get("content").unwrap_or(&Value::Null);
        match (role, content) {
            (Some(role @ ("user" | "assistant")), Value::String(s)) => {
                messages.push(json!({"role": role, "content": s}));
            }
            (Some(role @ ("user" | "assistant")), Value::Array(blocks)) => {
                let (mut text, mut calls) = (String::new(), Vec::new());
                for (j, b) in blocks.iter().enumerate() {
                    let bat = format!("{at}.content[{j}]");
                    match b.get("type").and_then(Value::as_str) {
                        Some("text") => text.push_str(b["text"].as_str().unwrap_or("")),
                        // Earlier thinking is not sent back to the model.
                        Some("thinking" | "redacted_thinking") => {}
                        Some("tool_use") if role == "assistant" => calls.push(json!({
                            "id": b["id"], "type": "function",
                            "function": {"name": b["name"], "arguments": b["input"]}
                        })),
                        Some("tool_result") if role == "user" => {
                            let result = blocks_text(
                                b.get("content").unwrap_or(&Value::Null),
                                &format!("{bat}.content"),
                            )?;
                            messages.push(json!({"role": "tool", "content": result,
                                                 "tool_call_id": b["tool_use_id"]}));
                        }
                        Some("image" | "document") => {
                            return Err(BadRequest::param(
                                &format!("{bat}.type"),
                                "images and documents are not supported yet",
                            ))
                        }
                        Some(other) => {
                            return Err(BadRequest::param(
                                &format!("{bat}.type"),
                                format!("{other:?} is not a {role} content block"),
                            ))
                        }
                        None => {
                            return Err(BadRequest::param(&format!("{bat}.type"), "is required"))
                        }
                    }
                }
                if !text.is_empty() || !calls.is_empty() {
                    let mut m = json!({"role": role, "content": text});
                    if !calls.is_empty() {
                        m["tool_calls"] = Value::Array(calls);
                    }
                    messages.push(m);
                }
            }
            (Some("user" | "assistant"), _) => {
                return Err(BadRequest::param(
                    &format!("{at}.content"),
                    "expected a string or content blocks",
                ))
            }
            _ => {
                return Err(BadRequest::param(
                    &format!("{at}.role"),
                    "expected \"user\" or \"assistant\"",
                ))
            }
        }
    }
    out.insert("messages".into(), Value::Array(messages));
    match body.get("max_tokens") {
        Some(n @ Value::Number(_)) => {
            out.insert("max_tokens".into(), n.clone());
        }
        _ => return Err(BadRequest::param("max_tokens", "is required: an integer")),
    }
    copy_present(body, &mut out, &["temperature", "top_p", "top_k", "stream"]);
    if let Some(stop) = body.get("stop_sequences").filter(|v| !v.is_null()) {
        out.insert("stop".into(), stop.clone());
    }
    if let Some(tools) = body.get("tools").filter(|v| !v.is_null()) {
        let tools = tools
            .as_array()
            .ok_or_else(|| BadRequest::param("tools", "expected an array"))?
            .iter()
            .map(|t| function_tool(&t["name"], t.get("description"), t.get("input_schema")))
            .collect();
        out.insert("tools".into(), Value::Array(tools));
    }
    if let Some(choice) = body.get("tool_choice").filter(|v| !v.is_null()) {
        let kind = choice.get("type").and_then(Value::as_str);
        let mapped = match kind {
            Some("auto") => json!("auto"),
            Some("any") => json!("required"),
            Some("none") => json!("none"),
            Some("tool") => json!({"type": "function", "function": {"name": choice["name"]}}),
            _ => {
                return Err(BadRequest::param(
                    "tool_choice.type",
                    "expected auto, any, tool or none",
                ))
            }
        };
        out.insert("tool_choice".into(), mapped);
        if choice.get("disable_parallel_tool_use") == Some(&json!(true)) {
            out.insert("parallel_tool_calls".into(), json!(false));
        }
    }
    if let Some(thinking) = body.get("thinking").filter(|v| !v.is_null()) {
        let on = match thinking.get("type").and_then(Value::as_str) {
            Some("enabled") => true,
            Some("disabled") => false,
            _ => {
                return Err(BadRequest::param(
                    "thinking.type",
                    "expected enabled or disabled",
                ))
            }
        };
        out.insert(
            "chat_template_kwargs".into(),
            json!({"enable_thinking": on}),
        );
    }
    Ok(out)
}

/// An error in Anthropic's shape.
fn failed(e: ApiError) -> Response {
    let kind = match e.status.as_u16() {
        400 => "invalid_request_error",
        401 => "authentication_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 => "overloaded_error",
        _ => "api_error",
    };
    (
        e.status,
        Json(json!({"type": "error", "error": {"type": kind, "message": e.message}})),
    )
        .into_response()
}

/// Anthropic's stop reason for how a reply ended.
fn stop_reason(f: &Finish, reply: &Reply) -> &'static str {
    match (f.reason, reply.finish_reason(f.reason)) {
        (_, "tool_calls") => "tool_use",
        (FinishReason::Length, _) => "max_tokens",
        _ => "end_turn",
    }
}

/// A reply's pieces as content blocks: thinking, text, then the calls.
fn content(delta: &Map<String, Value>) -> Vec<Value> {
    let mut blocks = Vec::new();
    if let Some(t) = delta
        .get("reasoning_content")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
    {
        blocks.push(json!({"type": "thinking", "thinking": t, "signature": ""}));
    }
    if let Some(t) = delta
        .get("content")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
    {
        blocks.push(json!({"type": "text", "text": t}));
    }
    for c in delta
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let f = &c["function"];
        let input = f["arguments"]
            .as_str()
            .and_then(|a| serde_json::from_str(a).ok())
            .unwrap_or_else(|| json!({}));
        blocks.push(json!({"type": "tool_use", "id": c["id"], "name": f["name"], "input": input}));
    }
    blocks
}

impl Server {
    async fn messages(self: Arc<Self>, body: Bytes) -> Response {
        let request = match object(&body).and_then(|b| to_openai(&b)) {
            Ok(r) => r,
            Err(e) => return failed(ApiError::from(e)),
        };
        let Queued {
            id,
            stream,
            mut events,
            reply,
        } = match self.start_translated(Endpoint::Chat, request, "msg-", PATH) {
            Ok(q) => q,
            Err(e) => return failed(e),
        };
        let mut reply = reply.expect("a chat reply");
        let model = self.opts.model_name.clone();
        if stream {
            let (out, sse) = tokio::sync::mpsc::unbounded_channel::<Result<SseEvent, Infallible>>();
            let server = Arc::clone(&self);
            tokio::spawn(async move {
                let send = |kind: &str, v: Value| {
                    out.send(Ok(SseEvent::default().event(kind).data(v.to_string())))
                        .is_ok()
                };
                let start = json!({"type": "message_start", "message": {
                    "id": id, "type": "message", "role": "assistant", "model": model,
                    "content": [], "stop_reason": null, "stop_sequence": null,
                    "usage": {"input_tokens": 0, "output_tokens": 0}}});
                if !send("message_start", start) {
                    return;
                }
                // The open block: its index and kind ("text" or "thinking").
                let mut open: Option<(usize, &'static str)> = None;
                let mut next = 0;
                while let Some((_, ev)) = events.recv().await {
                    let (delta, finish) = match ev {
                        Event::Text(t) | Event::Token { text: t, .. } => (reply.push(&t), None),
                        Event::Done(f) => (reply.finish(f.closed_at), Some(f)),
                        Event::Error(e) => {
                            let e = ApiError::from(e);
                            server.log(&id, PATH, true, e.status, Err(e.message.clone()));
                            let _ = send(
                                "error",
                                json!({"type": "error",
                                       "error": {"type": "api_error", "message": e.message}}),
                            );
                            return;
                        }
                    };
                    for block in content(&delta) {
                        let kind = block["type"].as_str().unwrap_or("text");
                        let streamable = matches!(kind, "text" | "thinking");
                        if open.is_some_and(|(_, k)| k != kind || !streamable) {
                            let (i, _) = open.take().expect("open");
                            send(
                                "content_block_stop",
                                json!({"type": "content_block_stop", "index": i}),
                            );
                        }
                        if streamable {
                            let kind: &'static str =
                                if kind == "text" { "text" } else { "thinking" };
                            if open.is_none() {
                                let empty = if kind == "text" {
                                    json!({"type": "text", "text": ""})
                                } else {
                                    json!({"type": "thinking", "thinking": ""})
                                };
                                send(
                                    "content_block_start",
                                    json!({"type": "content_block_start",
                                    "index": next, "content_block": empty}),
                                );
                                open = Some((next, kind));
                                next += 1;
                            }
                            let d = if kind == "text" {
                                json!({"type": "text_delta", "text": block["text"]})
                            } else {
                                json!({"type": "thinking_delta", "thinking": block["thinking"]})
                            };
                            send(
                                "content_block_delta",
                                json!({"type": "content_block_delta",
                                "index": open.expect("open").0, "delta": d}),
                            );
                        } else {
                            // A whole call: its block, its input as one delta.
                            let mut start = block.clone();
                            start["input"] = json!({});
                            send(
                                "content_block_start",
                                json!({"type": "content_block_start",
                                "index": next, "content_block": start}),
                            );
                            send(
                                "content_block_delta",
                                json!({"type": "content_block_delta",
                                "index": next, "delta": {"type": "input_json_delta",
                                "partial_json": block["input"].to_string()}}),
                            );
                            send(
                                "content_block_stop",
                                json!({"type": "content_block_stop", "index": next}),
                            );
                            next += 1;
                        }
                    }
                    if let Some(f) = finish {
                        if let Some((i, _)) = open.take() {
                            send(
                                "content_block_stop",
                                json!({"type": "content_block_stop", "index": i}),
                            );
                        }
                        send(
                            "message_delta",
                            json!({"type": "message_delta",
                            "delta": {"stop_reason": stop_reason(&f, &reply), "stop_sequence": null},
                            "usage": {"input_tokens": f.prompt_tokens,
                                      "output_tokens": f.completion_tokens}}),
                        );
                        send("message_stop", json!({"type": "message_stop"}));
                        server.log(&id, PATH, true, StatusCode::OK, Ok(f));
                        return;
                    }
                }
            });
            return crate::complete::sse(sse);
        }
        let (text, f) = match self.collect(&mut events, &id, PATH).await {
            Ok(r) => r,
            Err(e) => return failed(e),
        };
        let delta = match reply.whole(&text, f.closed_at) {
            Value::Object(m) => m,
            _ => Map::new(),
        };
        Json(
            json!({"id": id, "type": "message", "role": "assistant", "model": model,
                    "content": content(&delta), "stop_reason": stop_reason(&f, &reply),
                    "stop_sequence": null,
                    "usage": {"input_tokens": f.prompt_tokens,
                              "output_tokens": f.completion_tokens}}),
        )
        .into_response()
    }
}

pub(crate) async fn messages(
    State(s): State<Arc<Server>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match body {
        Ok(body) => s.messages(body).await,
        Err(e) => failed(ApiError::from(e)),
    }
}

/// `POST /v1/messages/count_tokens`: the prompt tokens the request would
/// take, tools and template included.
pub(crate) async fn count_tokens(
    State(s): State<Arc<Server>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(e) => return failed(ApiError::from(e)),
    };
    let mut request = match object(&body) {
        Ok(b) => b,
        Err(e) => return failed(e.into()),
    };
    // Counting needs no budget.
    request.entry("max_tokens").or_insert_with(|| json!(1));
    let request = match to_openai(&request) {
        Ok(r) => r,
        Err(e) => return failed(e.into()),
    };
    match s.prepare(
        Endpoint::Chat,
        Value::Object(request).to_string().as_bytes(),
    ) {
        Ok((prompt, _)) => Json(json!({"input_tokens": prompt.len()})).into_response(),
        Err(e) => failed(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_read_as_the_openai_chats_they_mean() {
        let body = json!({
            "model": "m", "max_tokens": 64, "system": [{"type": "text", "text": "Be brief."}],
            "stop_sequences": ["END"], "temperature": 0.5, "stream": true,
            "tools": [{"name": "add", "description": "Adds",
                       "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "messages": [
                {"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "x"},
                    {"type": "text", "text": "Let me add."},
                    {"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 2}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1",
                     "content": [{"type": "text", "text": "4"}]}]}
            ]
        });
        let got = Value::Object(to_openai(body.as_object().unwrap()).unwrap());
        assert_eq!(
            got,
            json!({
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "What is 2+2?"},
                    {"role": "assistant", "content": "Let me add.", "tool_calls": [
                        {"id": "t1", "type": "function",
                         "function": {"name": "add", "arguments": {"a": 2}}}]},
                    {"role": "tool", "content": "4", "tool_call_id": "t1"}
                ],
                "max_tokens": 64, "temperature": 0.5, "stream": true, "stop": ["END"],
                "tools": [{"type": "function", "function": {"name": "add",
                           "description": "Adds", "parameters": {"type": "object"}}}],
                "tool_choice": "required", "parallel_tool_calls": false,
                "chat_template_kwargs": {"enable_thinking": true}
            })
        );
        for (bad, field) in [
            (
                json!({"messages": [{"role": "user", "content": "x"}]}),
                "max_tokens",
            ),
            (json!({"max_tokens": 5, "messages": []}), "messages"),
            (
                json!({"max_tokens": 5, "messages": [{"role": "user", "content": [
                    {"type": "image", "source": {}}]}]}),
                "messages[0].content[0].type",
            ),
            (
                json!({"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]}),
                "messages[0].role",
            ),
        ] {
            let e = to_openai(bad.as_object().unwrap()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(field), "{}", e.message);
        }
    }
}
