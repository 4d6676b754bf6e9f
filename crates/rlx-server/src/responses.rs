//! OpenAI's Responses API, which newer OpenAI clients use: `POST
//! /v1/responses`, whole or streamed as its events. A request is read as
//! the chat request it means ([`to_chat`]): `instructions` as the system
//! turn, `input` (a string, or messages, function calls and their outputs)
//! after the turns of the response named by `previous_response_id`, which
//! the server keeps for a bounded time and number ([`Kept`]); the answer is
//! a response object with `message`, `function_call` and `reasoning`
//! output items.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
use crate::response::ApiError;
use crate::{now, Endpoint, Server};

const PATH: &str = "/v1/responses";

/// Responses kept for `previous_response_id`: at most this many, each for
/// at most [`KEEP_FOR`].
const KEEP: usize = 256;
const KEEP_FOR: Duration = Duration::from_secs(3600);

/// The conversations of recent responses (their chat messages, the
/// response's own output included), oldest first.
#[derive(Default)]
pub(crate) struct Kept(Mutex<VecDeque<(String, Instant, Vec<Value>)>>);

impl Kept {
    fn get(&self, id: &str) -> Option<Vec<Value>> {
        let kept = self.0.lock().expect("not poisoned");
        kept.iter()
            .find(|(k, at, _)| k == id && at.elapsed() < KEEP_FOR)
            .map(|(_, _, m)| m.clone())
    }

    fn put(&self, id: String, messages: Vec<Value>) {
        let mut kept = self.0.lock().expect("not poisoned");
        kept.retain(|(_, at, _)| at.elapsed() < KEEP_FOR);
        while kept.len() >= KEEP {
            kept.pop_front();
        }
        kept.push_back((id, Instant::now(), messages));
    }
}

/// A content value's text: a string, or its `input_text`/`output_text`/
/// `text` parts joined.
fn text_of(v: &Value, at: &str) -> Result<String, BadRequest> {
    parts_text(v, at, &["input_text", "output_text", "text"])
}

/// A Responses request read as the chat request it means, after the kept
/// conversation `before` (the previous response's): the request body, and
/// the conversation's messages so far (to keep with this response).
pub(crate) fn to_chat(
    body: &Map<String, Value>,
    before: Vec<Value>,
) -> Result<(Map<String, Value>, Vec<Value>), BadRequest> {
    let mut messages = before;
    let mut out = Map::new();
    if let Some(i) = body.get("instructions").filter(|v| !v.is_null()) {
        let i = text_of(i, "instructions")?;
        // Instructions hold for this response only: they lead its turns.
        messages.retain(|m| m["role"] != json!("system"));
        messages.insert(0, json!({"role": "system", "content": i}));
    }
    match body.get("input") {
        Some(Value::String(s)) => messages.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                let at = format!("input[{i}]");
                match item.get("type").and_then(Value::as_str) {
                    None | Some("message") => {
                        let role = match item.get("role").and_then(Value::as_str) {
                            Some(r @ ("user" | "assistant" | "system")) => r,
                            Some("developer") => "system",
                            _ => {
                                return Err(BadRequest::param(
                                    &format!("{at}.role"),
                                    "expected user, assistant, system or developer",
                                ))
                            }
                        };
                        let content = text_of(
                            item.get("content").unwrap_or(&Value::Null),
                            &format!("{at}.content"),
                        )?;
                        messages.push(json!({"role": role, "content": content}));
                    }
                    Some("function_call") => messages.push(json!({
                        "role": "assistant", "content": "",
                        "tool_calls": [{"id": item["call_id"], "type": "function",
                                        "function": {"name": item["name"],
                                                     "arguments": item["arguments"]}}]})),
                    Some("function_call_output") => messages.push(json!({
                        "role": "tool", "tool_call_id": item["call_id"],
                        "content": text_of(item.get("output").unwrap_or(&json!("")),
                                           &format!("{at}.output"))?})),
                    // Earlier reasoning is not sent back to the model.
                    Some("reasoning") => {}
                    Some(other) => {
                        return Err(BadRequest::param(
                            &format!("{at}.type"),
                            format!("{other:?} is not supported"),
                        ))
                    }
                }
            }
        }
        _ => return Err(BadRequest::param("input", "is required: a string or items")),
    }
    out.insert("messages".into(), Value::Array(messages.clone()));
    if let Some(n) = body.get("max_output_tokens").filter(|v| !v.is_null()) {
        // Checked here, so that an error names the field as sent.
        if n.as_u64().is_none() {
            return Err(BadRequest::param(
                "max_output_tokens",
                format!("expected a non-negative integer, got {n}"),
            ));
        }
        out.insert("max_tokens".into(), n.clone());
    }
    copy_present(
        body,
        &mut out,
        &[
            "temperature",
            "top_p",
            "stream",
            "tool_choice",
            "parallel_tool_calls",
        ],
    );
    if let Some(tools) = body.get("tools").filter(|v| !v.is_null()) {
        let tools = tools
            .as_array()
            .ok_or_else(|| BadRequest::param("tools", "expected an array"))?
            .iter()
            .enumerate()
            .map(|(i, t)| match t.get("type").and_then(Value::as_str) {
                Some("function") => Ok(function_tool(
                    &t["name"],
                    t.get("description"),
                    t.get("parameters"),
                )),
                _ => Err(BadRequest::param(
                    &format!("tools[{i}].type"),
                    "only function tools are supported",
                )),
            })
            .collect::<Result<Vec<_>, _>>()?;
        out.insert("tools".into(), Value::Array(tools));
    }
    if let Some(format) = body.get("text").and_then(|t| t.get("format")) {
        match format.get("type").and_then(Value::as_str) {
            Some("text") | None => {}
            Some("json_object") => {
                out.insert("response_format".into(), json!({"type": "json_object"}));
            }
            Some("json_schema") => {
                out.insert(
                    "response_format".into(),
                    json!({"type": "json_schema", "json_schema": {"schema": format["schema"]}}),
                );
            }
            Some(other) => {
                return Err(BadRequest::param(
                    "text.format.type",
                    format!("{other:?} is not one of text, json_object, json_schema"),
                ))
            }
        }
    }
    Ok((out, messages))
}

/// An error in OpenAI's shape, as the other endpoints give it.
fn failed(e: ApiError) -> Response {
    e.into_response()
}

/// The output items of a whole reply (the chat message the reply reader
/// made), and its turn to keep for the next response.
fn output(id: &str, message: &Value) -> (Vec<Value>, Value) {
    let mut items = Vec::new();
    if let Some(r) = message
        .get("reasoning_content")
        .and_then(Value::as_str)
        .filter(|r| !r.is_empty())
    {
        items.push(json!({"type": "reasoning", "id": format!("rs_{id}"),
                          "summary": [], "content": [{"type": "reasoning_text", "text": r}]}));
    }
    let text = message["content"].as_str().unwrap_or("");
    if !text.is_empty() || message.get("tool_calls").is_none() {
        items.push(
            json!({"type": "message", "id": format!("msg_{id}"), "role": "assistant",
                          "status": "completed",
                          "content": [{"type": "output_text", "text": text,
                                       "annotations": []}]}),
        );
    }
    for c in message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        items.push(
            json!({"type": "function_call", "id": format!("fc_{}", c["id"].as_str().unwrap_or("")),
                          "call_id": c["id"], "name": c["function"]["name"],
                          "arguments": c["function"]["arguments"], "status": "completed"}),
        );
    }
    let mut turn = json!({"role": "assistant", "content": text});
    if let Some(calls) = message.get("tool_calls") {
        turn["tool_calls"] = calls.clone();
    }
    (items, turn)
}

/// The response object.
fn response(id: &str, model: &str, created: u64, items: Vec<Value>, f: Option<&Finish>) -> Value {
    let status = match f.map(|f| f.reason) {
        None => "in_progress",
        Some(FinishReason::Length) => "incomplete",
        Some(FinishReason::Stop) => "completed",
    };
    let mut v = json!({"id": id, "object": "response", "created_at": created,
                       "status": status, "model": model, "output": items,
                       "error": null, "incomplete_details": null});
    if let Some(f) = f {
        v["usage"] = json!({"input_tokens": f.prompt_tokens,
                            "input_tokens_details": {"cached_tokens": f.cached_tokens},
                            "output_tokens": f.completion_tokens,
                            "output_tokens_details": {"reasoning_tokens": 0},
                            "total_tokens": f.prompt_tokens + f.completion_tokens});
        if f.reason == FinishReason::Length {
            v["incomplete_details"] = json!({"reason": "max_output_tokens"});
        }
    }
    v
}

impl Server {
    async fn responses(self: Arc<Self>, body: Bytes) -> Response {
        let body = match object(&body) {
            Ok(b) => b,
            Err(e) => return failed(e.into()),
        };
        let before = match body.get("previous_response_id").filter(|v| !v.is_null()) {
            None => Vec::new(),
            Some(Value::String(prev)) => match self.kept.get(prev) {
                Some(m) => m,
                None => {
                    return failed(ApiError::new(
                        StatusCode::NOT_FOUND,
                        format!("`previous_response_id`: no response {prev:?} is kept (responses are kept for an hour, the latest {KEEP})"),
                    ))
                }
            },
            Some(_) => {
                return failed(BadRequest::param("previous_response_id", "expected a string").into())
            }
        };
        let (request, mut conversation) = match to_chat(&body, before) {
            Ok(r) => r,
            Err(e) => return failed(e.into()),
        };
        let store = body.get("store") != Some(&json!(false));
        let Queued {
            id,
            stream,
            mut events,
            reply,
        } = match self.start_translated(Endpoint::Chat, request, "resp_", PATH) {
            Ok(q) => q,
            Err(e) => return failed(e),
        };
        let mut reply = reply.expect("a chat reply");
        let (model, created) = (self.opts.model_name.clone(), now());
        if stream {
            let (out, sse) = tokio::sync::mpsc::unbounded_channel::<Result<SseEvent, Infallible>>();
            let server = Arc::clone(&self);
            tokio::spawn(async move {
                let mut seq = 0u64;
                let mut send = |kind: &str, mut v: Value| {
                    v["type"] = json!(kind);
                    v["sequence_number"] = json!(seq);
                    seq += 1;
                    out.send(Ok(SseEvent::default().event(kind).data(v.to_string())))
                        .is_ok()
                };
                let start = response(&id, &model, created, Vec::new(), None);
                if !send("response.created", json!({"response": start})) {
                    return;
                }
                // The message item is opened at the first text.
                let msg_id = format!("msg_{id}");
                let mut opened = false;
                let mut text = String::new();
                while let Some((_, ev)) = events.recv().await {
                    let (delta, finish) = match ev {
                        Event::Text(t) | Event::Token { text: t, .. } => (reply.push(&t), None),
                        Event::Done(f) => (reply.finish(f.closed_at), Some(f)),
                        Event::Error(e) => {
                            let e = ApiError::from(e);
                            server.log(&id, PATH, true, e.status, Err(e.message.clone()));
                            send(
                                "error",
                                json!({"code": "server_error", "message": e.message}),
                            );
                            return;
                        }
                    };
                    if let Some(t) = delta.get("content").and_then(Value::as_str) {
                        if !opened {
                            opened = true;
                            send(
                                "response.output_item.added",
                                json!({"output_index": 0,
                                "item": {"type": "message", "id": msg_id, "role": "assistant",
                                         "status": "in_progress", "content": []}}),
                            );
                            send(
                                "response.content_part.added",
                                json!({"item_id": msg_id,
                                "output_index": 0, "content_index": 0,
                                "part": {"type": "output_text", "text": "", "annotations": []}}),
                            );
                        }
                        text.push_str(t);
                        send(
                            "response.output_text.delta",
                            json!({"item_id": msg_id,
                            "output_index": 0, "content_index": 0, "delta": t}),
                        );
                    }
                    if let Some(f) = finish {
                        if opened {
                            send(
                                "response.output_text.done",
                                json!({"item_id": msg_id,
                                "output_index": 0, "content_index": 0, "text": text}),
                            );
                        }
                        let (items, turn) = output(&id, &reply.message());
                        for (i, item) in items.iter().enumerate() {
                            send(
                                "response.output_item.done",
                                json!({"output_index": i, "item": item}),
                            );
                        }
                        if store {
                            conversation.push(turn);
                            server.kept.put(id.clone(), conversation);
                        }
                        let done = response(&id, &model, created, items, Some(&f));
                        let kind = if f.reason == FinishReason::Length {
                            "response.incomplete"
                        } else {
                            "response.completed"
                        };
                        send(kind, json!({"response": done}));
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
        let (items, turn) = output(&id, &reply.whole(&text, f.closed_at));
        if store {
            conversation.push(turn);
            self.kept.put(id.clone(), conversation);
        }
        Json(response(&id, &model, created, items, Some(&f))).into_response()
    }
}

pub(crate) async fn create(
    State(s): State<Arc<Server>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match body {
        Ok(body) => s.responses(body).await,
        Err(e) => failed(ApiError::from(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_read_as_the_chats_they_mean() {
        let before = vec![
            json!({"role": "system", "content": "Old."}),
            json!({"role": "user", "content": "Hi"}),
            json!({"role": "assistant", "content": "Hello"}),
        ];
        let body = json!({"model": "m", "instructions": "Be brief.", "max_output_tokens": 9,
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "Add"}]},
                      {"type": "function_call", "call_id": "c1", "name": "add",
                       "arguments": "{\"a\":1}"},
                      {"type": "function_call_output", "call_id": "c1", "output": "2"}],
            "tools": [{"type": "function", "name": "add", "parameters": {"type": "object"}}],
            "text": {"format": {"type": "json_object"}}});
        let (req, conversation) = to_chat(body.as_object().unwrap(), before).unwrap();
        let messages = json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello"},
            {"role": "user", "content": "Add"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1",
                "type": "function", "function": {"name": "add", "arguments": "{\"a\":1}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "2"}
        ]);
        assert_eq!(req["messages"], messages);
        assert_eq!(Value::Array(conversation), messages);
        assert_eq!(req["max_tokens"], json!(9));
        assert_eq!(req["response_format"], json!({"type": "json_object"}));
        assert_eq!(req["tools"][0]["function"]["name"], json!("add"));
        let e = to_chat(json!({"model": "m"}).as_object().unwrap(), Vec::new()).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("input"));
        let e = to_chat(
            json!({"input": "x", "tools": [{"type": "web_search"}]})
                .as_object()
                .unwrap(),
            Vec::new(),
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools[0].type"));
    }

    #[test]
    fn kept_responses_are_bounded() {
        let kept = Kept::default();
        for i in 0..KEEP + 3 {
            kept.put(format!("r{i}"), vec![json!(i)]);
        }
        assert!(kept.get("r0").is_none());
        assert_eq!(
            kept.get(&format!("r{}", KEEP + 2)),
            Some(vec![json!(KEEP + 2)])
        );
    }
}
