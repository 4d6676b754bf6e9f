//! Answers: a whole completion, or its chunks as server-sent events.

use std::convert::Infallible;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use rlx_guide::tools::{ReplyReader, Syntax};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::engine::{Event, Finish, FinishReason, Job, JobError, TokenLogprob};
use crate::openai::{BadRequest, Params};
use crate::prompt::calling;
use crate::reply::Reply;
use crate::response::{logprobs_json, timings, total, usage, ApiError, Choice};
use crate::{now, Endpoint, RequestLog, Server};

/// Server-sent events as they come from `events`, kept alive while idle.
pub(crate) fn sse(events: mpsc::UnboundedReceiver<Result<SseEvent, Infallible>>) -> Response {
    Sse::new(UnboundedReceiverStream::new(events))
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// A request of another API queued as the OpenAI request it was read as
/// ([`Server::start_translated`]).
pub(crate) struct Queued {
    pub id: String,
    pub stream: bool,
    pub events: mpsc::UnboundedReceiver<(usize, Event)>,
    /// The one choice's reply reader (chat requests).
    pub reply: Option<Reply>,
}

/// A request queued by [`Server::start`].
pub(crate) struct Started {
    pub params: Params,
    /// Each choice's events, tagged with its index.
    pub events: mpsc::UnboundedReceiver<(usize, Event)>,
    /// Each chat choice's reply reader (`None` for text completions).
    pub replies: Vec<Option<Reply>>,
}

impl Server {
    /// How a chat choice's text is read.
    fn reply(&self, params: &Params, id: &str, index: usize) -> Reply {
        let tools = calling(params);
        let reader = if self.gemma4_replies {
            ReplyReader::new(Some(Syntax::Gemma4))
        } else if tools.is_some() {
            ReplyReader::new(Some(Syntax::Json))
        } else {
            ReplyReader::new(None)
        };
        let parallel = tools.is_none_or(|t| t.parallel);
        let suffix = id.rsplit('-').next().unwrap_or(id);
        Reply::new(reader, parallel, format!("call_{suffix}_{index}_"))
    }

    pub(crate) fn id(&self, endpoint: Endpoint) -> String {
        self.id_with(match endpoint {
            Endpoint::Chat => "chatcmpl-",
            Endpoint::Completion => "cmpl-",
        })
    }

    /// A new request id after `prefix`.
    pub(crate) fn id_with(&self, prefix: &str) -> String {
        let n = self.requests.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}{:x}{n:06x}", self.created)
    }

    /// One choice's object: `body` is the text of a text completion, or a
    /// chat choice's message (its delta when streaming); log-probabilities
    /// when asked for, and the finish reason.
    fn choice(
        &self,
        endpoint: Endpoint,
        index: usize,
        body: Value,
        logprobs: Option<&[TokenLogprob]>,
        reason: Option<&str>,
        streaming: bool,
    ) -> Value {
        let lp = logprobs.map_or(Value::Null, |l| logprobs_json(endpoint, l));
        let key = match (endpoint, streaming) {
            (Endpoint::Chat, true) => "delta",
            (Endpoint::Chat, false) => "message",
            (Endpoint::Completion, _) => "text",
        };
        json!({"index": index, key: body, "logprobs": lp, "finish_reason": reason})
    }

    /// A streamed chunk holding `choices`.
    fn chunk(&self, endpoint: Endpoint, id: &str, choices: Vec<Value>) -> Value {
        let object = match endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Completion => "text_completion",
        };
        json!({"id": id, "object": object, "created": now(), "model": self.opts.model_name,
               "choices": choices})
    }

    /// The whole response of a request that did not stream.
    fn completion(&self, endpoint: Endpoint, id: &str, choices: &[Choice], f: &Finish) -> Value {
        let object = match endpoint {
            Endpoint::Chat => "chat.completion",
            Endpoint::Completion => "text_completion",
        };
        let choices: Vec<Value> = choices
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let reason = c.finish.map(|f| f.reason);
                let (body, reason) = match &c.reply {
                    Some(r) => (r.message(), reason.map(|f| r.finish_reason(f))),
                    None => (json!(c.text), reason.map(FinishReason::as_str)),
                };
                self.choice(endpoint, i, body, c.logprobs.as_deref(), reason, false)
            })
            .collect();
        json!({"id": id, "object": object, "created": now(), "model": self.opts.model_name,
               "choices": choices, "usage": usage(f), "timings": timings(f)})
    }

    /// Tells `on_request` how request `id` to `path` ended.
    pub(crate) fn log(
        &self,
        id: &str,
        path: &'static str,
        stream: bool,
        status: StatusCode,
        outcome: Result<Finish, String>,
    ) {
        if let Some(cb) = &self.opts.on_request {
            cb(&RequestLog {
                id: id.to_owned(),
                endpoint: path,
                stream,
                status: status.as_u16(),
                outcome,
            });
        }
    }

    pub(crate) async fn complete(self: Arc<Self>, endpoint: Endpoint, body: Bytes) -> Response {
        let id = self.id(endpoint);
        let Started {
            params,
            events: mut merged,
            replies,
        } = match self.start_logged(endpoint, &body, &id, endpoint.path()) {
            Ok(s) => s,
            Err(e) => return e.into_response(),
        };
        if params.stream {
            return self.stream(endpoint, id, merged, replies, params.include_usage);
        }
        let mut choices: Vec<Choice> = replies
            .into_iter()
            .map(|reply| Choice {
                logprobs: params.logprobs.map(|_| Vec::new()),
                reply,
                ..Choice::default()
            })
            .collect();
        while let Some((i, ev)) = merged.recv().await {
            let c = &mut choices[i];
            match ev {
                Event::Text(t) => c.push(&t),
                Event::Token { text, logprob } => {
                    c.push(&text);
                    if let Some(l) = &mut c.logprobs {
                        l.push(logprob);
                    }
                }
                Event::Done(f) => {
                    if let Some(r) = &mut c.reply {
                        r.finish(f.closed_at);
                    }
                    c.finish = Some(f)
                }
                Event::Error(e) => {
                    let e = ApiError::from(e);
                    self.log(
                        &id,
                        endpoint.path(),
                        false,
                        e.status,
                        Err(e.message.clone()),
                    );
                    return e.into_response();
                }
            }
        }
        let Some(f) = total(choices.iter().map(|c| c.finish)) else {
            return ApiError::from(JobError::Internal("the engine dropped the request".into()))
                .into_response();
        };
        self.log(&id, endpoint.path(), false, StatusCode::OK, Ok(f));
        Json(self.completion(endpoint, &id, &choices, &f)).into_response()
    }

    /// [`Server::start`], its error logged under `path`.
    pub(crate) fn start_logged(
        &self,
        endpoint: Endpoint,
        body: &[u8],
        id: &str,
        path: &'static str,
    ) -> Result<Started, ApiError> {
        self.start(endpoint, body, id).map_err(|(e, stream)| {
            self.log(id, path, stream, e.status, Err(e.message.clone()));
            e
        })
    }

    /// Queues `request`, the OpenAI request at `endpoint` another API's
    /// request was read as, under a new id after `prefix`; a refusal is
    /// logged under `path`.
    pub(crate) fn start_translated(
        &self,
        endpoint: Endpoint,
        request: Map<String, Value>,
        prefix: &str,
        path: &'static str,
    ) -> Result<Queued, ApiError> {
        let id = self.id_with(prefix);
        let body = Value::Object(request).to_string();
        let mut s = self.start_logged(endpoint, body.as_bytes(), &id, path)?;
        Ok(Queued {
            stream: s.params.stream,
            events: s.events,
            reply: s.replies.pop().flatten(),
            id,
        })
    }

    /// The whole text and the finish of a one-choice request that did not
    /// stream, logged under `path`; or its error (logged too).
    pub(crate) async fn collect(
        &self,
        events: &mut mpsc::UnboundedReceiver<(usize, Event)>,
        id: &str,
        path: &'static str,
    ) -> Result<(String, Finish), ApiError> {
        let mut text = String::new();
        let mut finish = None;
        while let Some((_, ev)) = events.recv().await {
            match ev {
                Event::Text(t) | Event::Token { text: t, .. } => text.push_str(&t),
                Event::Done(f) => finish = Some(f),
                Event::Error(e) => {
                    let e = ApiError::from(e);
                    self.log(id, path, false, e.status, Err(e.message.clone()));
                    return Err(e);
                }
            }
        }
        let f = total([finish]).ok_or_else(|| {
            ApiError::from(JobError::Internal("the engine dropped the request".into()))
        })?;
        self.log(id, path, false, StatusCode::OK, Ok(f));
        Ok((text, f))
    }

    /// Queues the request `body` asks for at `endpoint` (one job a choice):
    /// its parameters, the choices' events tagged with their index, and
    /// each chat choice's reply reader. An error comes with whether the
    /// request asked to stream (for the log).
    pub(crate) fn start(
        &self,
        endpoint: Endpoint,
        body: &[u8],
        id: &str,
    ) -> Result<Started, (ApiError, bool)> {
        let (prompt, params) = self.prepare(endpoint, body).map_err(|e| (e, false))?;
        let room = self.engine.context() - prompt.len();
        let max_tokens = params.max_tokens.unwrap_or(self.opts.max_tokens).min(room);
        // A guide per choice, compiled before anything is queued: a bad
        // schema or grammar is the client's error.
        let mut guides = Vec::new();
        if let Some((field, spec)) = &params.constraint {
            for _ in 0..params.n {
                match self.vocab.guide(spec, &params.guide) {
                    Ok(g) => {
                        guides.push(Box::new(g) as Box<dyn rlx_gemma::generate::Constraint + Send>)
                    }
                    Err(e) => {
                        return Err((BadRequest::param(field, e.to_string()).into(), false));
                    }
                }
            }
        }
        let mut guides = guides.into_iter();
        // One job per choice; they share the prompt's blocks in the engine.
        // Choice i samples with seed + i, so a seeded request repeats.
        let mut receivers = Vec::with_capacity(params.n);
        for i in 0..params.n {
            let (tx, rx) = mpsc::unbounded_channel();
            let mut sampler = params.sampler.clone();
            sampler.seed = sampler.seed.wrapping_add(i as u64);
            let job = Job {
                prompt: prompt.clone(),
                max_tokens,
                sampler,
                stop: params.stop.clone(),
                ignore_eos: params.ignore_eos,
                logprobs: params.logprobs,
                events: tx,
                constraint: guides.next(),
                speculative: params.speculative,
            };
            if let Err(e) = self.engine.submit(job) {
                if let JobError::Busy(_) = e {
                    self.metrics.rejected.fetch_add(1, Ordering::Relaxed);
                }
                return Err((e.into(), params.stream));
            }
            receivers.push(rx);
        }
        // The choices' events on one channel, tagged with their index.
        let (merged_tx, merged) = mpsc::unbounded_channel();
        for (i, mut rx) in receivers.into_iter().enumerate() {
            let tx = merged_tx.clone();
            tokio::spawn(async move {
                while let Some(ev) = rx.recv().await {
                    if tx.send((i, ev)).is_err() {
                        return;
                    }
                }
            });
        }
        drop(merged_tx);
        let replies: Vec<Option<Reply>> = (0..params.n)
            .map(|i| (endpoint == Endpoint::Chat).then(|| self.reply(&params, id, i)))
            .collect();
        Ok(Started {
            params,
            events: merged,
            replies,
        })
    }

    /// Server-sent events: a chunk per piece of text (per token with
    /// log-probabilities), a last chunk per choice with its finish reason,
    /// usage if asked for, then `[DONE]`. When the client goes away the
    /// forwarding task ends, and with it the generation.
    fn stream(
        self: Arc<Self>,
        endpoint: Endpoint,
        id: String,
        mut events: mpsc::UnboundedReceiver<(usize, Event)>,
        mut replies: Vec<Option<Reply>>,
        include_usage: bool,
    ) -> Response {
        let n = replies.len();
        let (out, events_out) = mpsc::unbounded_channel::<Result<SseEvent, Infallible>>();
        let data = |v: Value| Ok(SseEvent::default().data(v.to_string()));
        let gone = move |s: &Server, id: &str| {
            let status = StatusCode::from_u16(499).expect("a valid code");
            s.log(
                id,
                endpoint.path(),
                true,
                status,
                Err("the client went away".into()),
            )
        };
        tokio::spawn(async move {
            if endpoint == Endpoint::Chat {
                let first: Vec<Value> = (0..n)
                    .map(|i| {
                        json!({"index": i, "delta": {"role": "assistant", "content": ""},
                               "logprobs": null, "finish_reason": null})
                    })
                    .collect();
                if out.send(data(self.chunk(endpoint, &id, first))).is_err() {
                    return gone(&self, &id);
                }
            }
            let mut finishes: Vec<Option<Finish>> = vec![None; n];
            while let Some((i, ev)) = events.recv().await {
                let mut chunks = Vec::with_capacity(2);
                // A chat delta, or a text completion's text.
                let mut body = |text: &str| match &mut replies[i] {
                    Some(r) => Value::Object(r.push(text)),
                    None => json!(text),
                };
                match ev {
                    Event::Text(t) => {
                        let b = body(&t);
                        if b.as_object().is_none_or(|o| !o.is_empty()) {
                            chunks.push(self.choice(endpoint, i, b, None, None, true));
                        }
                    }
                    Event::Token { text, logprob } => {
                        let lp = [logprob];
                        let b = body(&text);
                        chunks.push(self.choice(endpoint, i, b, Some(&lp), None, true));
                    }
                    Event::Done(f) => {
                        finishes[i] = Some(f);
                        let (rest, reason, last_body) = match &mut replies[i] {
                            Some(r) => {
                                let rest = r.finish(f.closed_at);
                                (Some(rest), r.finish_reason(f.reason), json!({}))
                            }
                            None => (None, f.reason.as_str(), json!("")),
                        };
                        if let Some(rest) = rest.filter(|r| !r.is_empty()) {
                            let b = Value::Object(rest);
                            chunks.push(self.choice(endpoint, i, b, None, None, true));
                        }
                        let mut last =
                            self.choice(endpoint, i, last_body, None, Some(reason), true);
                        last["timings"] = timings(&f);
                        chunks.push(last);
                    }
                    Event::Error(e) => {
                        let e = ApiError::from(e);
                        self.log(&id, endpoint.path(), true, e.status, Err(e.message.clone()));
                        let _ = out.send(data(e.body()));
                        return;
                    }
                }
                for c in chunks {
                    if out.send(data(self.chunk(endpoint, &id, vec![c]))).is_err() {
                        return gone(&self, &id);
                    }
                }
            }
            let Some(f) = total(finishes) else {
                return gone(&self, &id);
            };
            if include_usage {
                let mut u = self.chunk(endpoint, &id, Vec::new());
                u["usage"] = usage(&f);
                let _ = out.send(data(u));
            }
            let _ = out.send(Ok(SseEvent::default().data("[DONE]")));
            self.log(&id, endpoint.path(), true, StatusCode::OK, Ok(f));
        });
        sse(events_out)
    }
}
