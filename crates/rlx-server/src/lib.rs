//! rlx-server: an OpenAI-compatible HTTP API over one model.
//!
//! `POST /v1/chat/completions` and `POST /v1/completions` (both with
//! `stream: true` as server-sent events), `GET /v1/models`, `GET /health`,
//! `GET /metrics` (Prometheus), `POST /tokenize` and `POST /detokenize`
//! (llama-server's shapes).
//! One [`engine::Engine`] thread steps every running request together
//! (continuous batching) and keeps finished requests' K/V for a while, so a
//! prompt that starts like an earlier one (a conversation re-sent with one
//! more turn, a shared system prompt) only runs the rest. Errors are
//! OpenAI's JSON shape and name the field.

pub mod engine;
mod metrics;
pub mod openai;
mod reply;
mod response;
mod stop;

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use rlx_gemma::sampling::SamplerConfig;
use rlx_gemma::Model;
use rlx_guide::gemma4;
use rlx_guide::tools::{ReplyReader, Syntax, ToolChoice, ToolUse};
use rlx_tokenizer::{
    ChatMessage, ChatOptions, ChatTemplate, EncodeOptions, Tokenizer, TokenizerError,
};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use engine::{Engine, Event, Finish, Job, JobError, StartError, TokenLogprob};
use response::{logprobs_json, timings, total, usage, ApiError, Choice};

pub use engine::EngineOptions;
use openai::{BadRequest, Message, Params, Prompt};
use reply::Reply;

pub use engine::FinishReason;

/// How the server answers.
#[derive(Clone)]
pub struct ServerOptions {
    /// The model's name in `/v1/models` and in responses.
    pub model_name: String,
    /// Sampling for the fields a request leaves out.
    pub sampling: SamplerConfig,
    /// `max_tokens` when a request gives none (always capped by the room
    /// left in the context).
    pub max_tokens: usize,
    /// Called after every completion request, e.g. to log it.
    pub on_request: Option<RequestHook>,
    /// Requests must carry `Authorization: Bearer KEY` (all routes but
    /// `/health`).
    pub api_key: Option<String>,
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
}

impl ServerOptions {
    /// Options with the given name and defaults for the rest.
    pub fn new(model_name: impl Into<String>) -> Self {
        ServerOptions {
            model_name: model_name.into(),
            sampling: SamplerConfig::default(),
            max_tokens: 256,
            on_request: None,
            api_key: None,
            max_body_bytes: 4 << 20,
        }
    }
}

/// A callback that sees every completion request's outcome.
pub type RequestHook = Arc<dyn Fn(&RequestLog) + Send + Sync>;

/// What one completion request did.
#[derive(Clone, Debug)]
pub struct RequestLog {
    /// The response's `id`.
    pub id: String,
    pub endpoint: &'static str,
    pub stream: bool,
    /// The HTTP status sent (499: the client went away first).
    pub status: u16,
    pub outcome: Result<Finish, String>,
}

impl std::fmt::Display for RequestLog {
    /// One `key=value` line: id, endpoint, status, tokens, timings.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "id={} endpoint={} stream={} status={}",
            self.id, self.endpoint, self.stream, self.status
        )?;
        match &self.outcome {
            Ok(r) => write!(
                f,
                " prompt_tokens={} cached_tokens={} completion_tokens={} prefill_ms={:.1} decode_ms={:.1} finish={}",
                r.prompt_tokens,
                r.cached_tokens,
                r.completion_tokens,
                r.prefill_secs * 1e3,
                r.decode_secs * 1e3,
                r.reason.as_str()
            ),
            Err(e) => write!(f, " error={e:?}"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Start(#[from] StartError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Guide(#[from] rlx_guide::GuideError),
}

/// The model, its tokenizer and chat template, and the engine running it.
pub struct Server {
    engine: Engine,
    /// The vocabulary compiled for structured output, built at start.
    vocab: rlx_guide::Vocabulary,
    template: ChatTemplate,
    /// How this model calls tools: Gemma 4's syntax when its vocabulary
    /// has the tool tokens and its file a chat template to declare tools
    /// with, JSON replies otherwise.
    tool_syntax: Syntax,
    /// Replies are read for Gemma 4's thinking channels and calls.
    gemma4_replies: bool,
    opts: ServerOptions,
    created: u64,
    requests: AtomicU64,
    metrics: metrics::Metrics,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endpoint {
    Chat,
    Completion,
}

impl Endpoint {
    fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completion => "/v1/completions",
        }
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Server {
    /// Starts the engine on `model`, sized by `engine`.
    pub fn new(
        model: Model,
        engine: EngineOptions,
        opts: ServerOptions,
    ) -> Result<Server, ServerError> {
        let tokenizer = Arc::new(Tokenizer::from_gguf(model.file())?);
        let template = ChatTemplate::from_gguf(model.file())?;
        let vocab = rlx_guide::Vocabulary::new(Arc::clone(&tokenizer))?;
        let has = |piece: &str| tokenizer.id_of(piece).is_some();
        let tool_tokens = has(gemma4::CALL_OPEN) && has(gemma4::CALL_CLOSE) && has(gemma4::QUOTE);
        let tool_syntax = if tool_tokens && template.source().is_some() {
            Syntax::Gemma4
        } else {
            Syntax::Json
        };
        let gemma4_replies = tool_tokens || has(gemma4::CHANNEL_OPEN);
        let engine = Engine::start(model, tokenizer, engine)?;
        Ok(Server {
            engine,
            vocab,
            template,
            tool_syntax,
            gemma4_replies,
            opts,
            created: now(),
            requests: AtomicU64::new(0),
            metrics: metrics::Metrics::default(),
        })
    }

    /// The HTTP routes.
    pub fn router(self: Arc<Self>) -> Router {
        let limit = self.opts.max_body_bytes;
        Router::new()
            .route("/health", get(health))
            .route("/metrics", get(metrics_text))
            .route("/v1/models", get(models))
            .route("/v1/chat/completions", post(chat))
            .route("/v1/completions", post(completions))
            .route("/tokenize", post(tokenize))
            .route("/detokenize", post(detokenize))
            .fallback(not_found)
            .layer(axum::middleware::from_fn_with_state(
                Arc::clone(&self),
                authorize,
            ))
            .layer(DefaultBodyLimit::max(limit))
            .with_state(self)
    }

    /// Prompt tokens and parameters of a request body.
    fn prepare(&self, endpoint: Endpoint, body: &[u8]) -> Result<(Vec<u32>, Params), ApiError> {
        let body = openai::object(body)?;
        let n = self.requests.fetch_add(1, Ordering::Relaxed);
        // Without a seed, each request samples differently.
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(n, |d| d.as_nanos() as u64 ^ n);
        let api = match endpoint {
            Endpoint::Chat => openai::Api::Chat,
            Endpoint::Completion => openai::Api::Completions,
        };
        let mut params = openai::params(&body, api, &self.opts.sampling, seed)?;
        if let Some(spec) = calling(&params).and_then(|t| t.spec(self.tool_syntax)) {
            params.constraint = Some(("tools", spec));
        }
        let tok = self.engine.tokenizer();
        let ids = match endpoint {
            Endpoint::Chat => self.chat_prompt(&body, &params)?,
            Endpoint::Completion => match openai::prompt(&body)? {
                Prompt::Text(t) => tok.encode(&t, EncodeOptions::default()),
                Prompt::Tokens(t) => t,
            },
        };
        if ids.is_empty() {
            return Err(BadRequest::new("the prompt is empty").into());
        }
        let context = self.engine.context();
        if ids.len() >= context {
            return Err(BadRequest::new(format!(
                "the prompt has {} tokens; a request holds at most {context} (start the server with a larger -c or a smaller --parallel)",
                ids.len(),
            ))
            .into());
        }
        if let Some(n) = params.max_tokens.filter(|&n| ids.len() + n > context) {
            return Err(BadRequest::param(
                "max_tokens",
                format!(
                    "the prompt ({} tokens) and max_tokens ({n}) exceed the {context} tokens a request holds (start the server with a larger -c or a smaller --parallel)",
                    ids.len(),
                ),
            )
            .into());
        }
        Ok((ids, params))
    }

    /// The conversation rendered by the chat template: with Gemma 4's
    /// syntax, messages, calls and tools as the template takes them; for
    /// JSON replies, the tools described in the system text, earlier calls
    /// as the JSON the model wrote and results as user turns.
    fn chat_prompt(
        &self,
        body: &Map<String, Value>,
        params: &Params,
    ) -> Result<Vec<u32>, ApiError> {
        let messages = openai::messages(body)?;
        let opts = ChatOptions {
            add_generation_prompt: true,
            enable_thinking: params.enable_thinking,
        };
        let tools = calling(params);
        let rendered = match self.tool_syntax {
            Syntax::Gemma4 => {
                let list: Vec<Value> = messages.iter().map(template_message).collect();
                let tools = tools.map(|t| {
                    let decls: Vec<Value> = t
                        .tools
                        .iter()
                        .map(|t| {
                            json!({"type": "function", "function": {"name": t.name,
                                "description": t.description, "parameters": t.parameters}})
                        })
                        .collect();
                    Value::Array(decls).to_string()
                });
                self.template
                    .render_json(&Value::Array(list).to_string(), tools.as_deref(), &opts)
            }
            Syntax::Json => {
                let plain = json_conversation(&messages, tools.and_then(ToolUse::instructions));
                self.template.render(&plain, &opts)
            }
        }
        .map_err(|e| BadRequest::new(format!("chat template: {e}")))?;
        Ok(self.engine.tokenizer().encode_chat(&rendered))
    }

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

    fn id(&self, endpoint: Endpoint) -> String {
        let prefix = match endpoint {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completion => "cmpl",
        };
        let n = self.requests.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:x}{n:06x}", self.created)
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

    fn log(
        &self,
        id: &str,
        endpoint: Endpoint,
        stream: bool,
        status: StatusCode,
        outcome: Result<Finish, String>,
    ) {
        if let Some(cb) = &self.opts.on_request {
            cb(&RequestLog {
                id: id.to_owned(),
                endpoint: endpoint.path(),
                stream,
                status: status.as_u16(),
                outcome,
            });
        }
    }

    async fn complete(self: Arc<Self>, endpoint: Endpoint, body: Bytes) -> Response {
        let id = self.id(endpoint);
        let (prompt, params) = match self.prepare(endpoint, &body) {
            Ok(p) => p,
            Err(e) => {
                self.log(&id, endpoint, false, e.status, Err(e.message.clone()));
                return e.into_response();
            }
        };
        let room = self.engine.context() - prompt.len();
        let max_tokens = params.max_tokens.unwrap_or(self.opts.max_tokens).min(room);
        // A guide per choice, compiled before anything is queued: a bad
        // schema or grammar is the client's error.
        let mut guides = Vec::new();
        if let Some((field, spec)) = &params.constraint {
            for _ in 0..params.n {
                match self.vocab.guide(spec) {
                    Ok(g) => {
                        guides.push(Box::new(g) as Box<dyn rlx_gemma::generate::Constraint + Send>)
                    }
                    Err(e) => {
                        let e = ApiError::from(BadRequest::param(field, e.to_string()));
                        self.log(&id, endpoint, false, e.status, Err(e.message.clone()));
                        return e.into_response();
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
            };
            if let Err(e) = self.engine.submit(job) {
                if let JobError::Busy(_) = e {
                    self.metrics.rejected.fetch_add(1, Ordering::Relaxed);
                }
                let e = ApiError::from(e);
                self.log(
                    &id,
                    endpoint,
                    params.stream,
                    e.status,
                    Err(e.message.clone()),
                );
                return e.into_response();
            }
            receivers.push(rx);
        }
        // The choices' events on one channel, tagged with their index.
        let (merged_tx, mut merged) = mpsc::unbounded_channel();
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
            .map(|i| (endpoint == Endpoint::Chat).then(|| self.reply(&params, &id, i)))
            .collect();
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
                        r.finish();
                    }
                    c.finish = Some(f)
                }
                Event::Error(e) => {
                    let e = ApiError::from(e);
                    self.log(&id, endpoint, false, e.status, Err(e.message.clone()));
                    return e.into_response();
                }
            }
        }
        let Some(f) = total(choices.iter().map(|c| c.finish)) else {
            return ApiError::from(JobError::Internal("the engine dropped the request".into()))
                .into_response();
        };
        self.log(&id, endpoint, false, StatusCode::OK, Ok(f));
        Json(self.completion(endpoint, &id, &choices, &f)).into_response()
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
        let (out, sse) = mpsc::unbounded_channel::<Result<SseEvent, Infallible>>();
        let data = |v: Value| Ok(SseEvent::default().data(v.to_string()));
        let gone = move |s: &Server, id: &str| {
            let status = StatusCode::from_u16(499).expect("a valid code");
            s.log(
                id,
                endpoint,
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
                                let rest = r.finish();
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
                        self.log(&id, endpoint, true, e.status, Err(e.message.clone()));
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
            self.log(&id, endpoint, true, StatusCode::OK, Ok(f));
        });
        Sse::new(UnboundedReceiverStream::new(sse))
            .keep_alive(KeepAlive::default())
            .into_response()
    }
}

/// The request's tools when the model may call them.
fn calling(params: &Params) -> Option<&ToolUse> {
    params
        .tools
        .as_ref()
        .filter(|t| t.choice != ToolChoice::None)
}

/// A message as chat templates take it (OpenAI's shape, arguments as
/// objects).
fn template_message(m: &Message) -> Value {
    let mut v = json!({"role": m.role, "content": m.content});
    if !m.tool_calls.is_empty() {
        let calls: Vec<Value> = m
            .tool_calls
            .iter()
            .map(|(id, c)| {
                json!({"id": id, "type": "function",
                       "function": {"name": c.name, "arguments": c.arguments}})
            })
            .collect();
        v["tool_calls"] = Value::Array(calls);
    }
    if let Some(id) = &m.tool_call_id {
        v["tool_call_id"] = json!(id);
    }
    if let Some(name) = &m.name {
        v["name"] = json!(name);
    }
    v
}

/// The conversation for a model that calls tools in JSON: `instructions`
/// added to the system text, an assistant's calls written as its JSON
/// reply, tool results as user turns (joined with a neighbouring user turn,
/// since Gemma's templates want turns to alternate).
fn json_conversation(messages: &[Message], instructions: Option<String>) -> Vec<ChatMessage> {
    let mut out: Vec<(ChatMessage, bool)> = Vec::with_capacity(messages.len() + 1);
    for (i, m) in messages.iter().enumerate() {
        let (role, text, from_tool) = match m.role {
            "tool" => {
                // The function's name from the call this answers.
                let name = messages[..i]
                    .iter()
                    .rev()
                    .flat_map(|p| p.tool_calls.iter())
                    .find(|(id, _)| Some(id) == m.tool_call_id.as_ref())
                    .map(|(_, c)| c.name.clone())
                    .or_else(|| m.name.clone())
                    .unwrap_or_else(|| "the function".to_owned());
                ("user", format!("{name} returned: {}", m.content), true)
            }
            "assistant" if !m.tool_calls.is_empty() => {
                let calls: Vec<_> = m.tool_calls.iter().map(|(_, c)| c.clone()).collect();
                let reply = rlx_guide::tools::json_reply(&calls);
                let text = if m.content.is_empty() {
                    reply
                } else {
                    format!("{}\n{reply}", m.content)
                };
                ("assistant", text, true)
            }
            role => (role, m.content.clone(), false),
        };
        match out.last_mut() {
            Some((prev, prev_tool)) if prev.role == role && (from_tool || *prev_tool) => {
                prev.content.push_str("\n\n");
                prev.content.push_str(&text);
                *prev_tool = true;
            }
            _ => out.push((ChatMessage::new(role, text), from_tool)),
        }
    }
    if let Some(text) = instructions {
        match out.iter_mut().find(|(m, _)| m.role == "system") {
            Some((m, _)) => {
                m.content.push_str("\n\n");
                m.content.push_str(&text);
            }
            None => out.insert(0, (ChatMessage::system(text), false)),
        }
    }
    out.into_iter().map(|(m, _)| m).collect()
}

async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

async fn models(State(s): State<Arc<Server>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [{
        "id": s.opts.model_name, "object": "model", "created": s.created, "owned_by": "rlx",
        "meta": {"n_ctx": s.engine.context(), "n_vocab": s.engine.tokenizer().vocab_size()}
    }]}))
}

async fn chat(State(s): State<Arc<Server>>, body: Result<Bytes, BytesRejection>) -> Response {
    match body {
        Ok(body) => s.complete(Endpoint::Chat, body).await,
        Err(e) => ApiError::from(e).into_response(),
    }
}

async fn completions(
    State(s): State<Arc<Server>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match body {
        Ok(body) => s.complete(Endpoint::Completion, body).await,
        Err(e) => ApiError::from(e).into_response(),
    }
}

async fn metrics_text(State(s): State<Arc<Server>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.metrics.render(s.engine.load()),
    )
        .into_response()
}

async fn tokenize(State(s): State<Arc<Server>>, body: Result<Bytes, BytesRejection>) -> Response {
    let run = || -> Result<Value, ApiError> {
        let req = openai::tokenize(&openai::object(&body?)?)?;
        let tok = s.engine.tokenizer();
        let ids = tok.encode(
            &req.content,
            EncodeOptions {
                add_bos: req.add_special,
                parse_special: req.parse_special,
            },
        );
        Ok(if req.with_pieces {
            let pieces: Vec<Value> = ids
                .iter()
                .map(|&id| json!({"id": id, "piece": tok.decode(&[id], true)}))
                .collect();
            json!({ "tokens": pieces })
        } else {
            json!({ "tokens": ids })
        })
    };
    match run() {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn detokenize(State(s): State<Arc<Server>>, body: Result<Bytes, BytesRejection>) -> Response {
    let run = || -> Result<Value, ApiError> {
        let ids = openai::detokenize(&openai::object(&body?)?)?;
        let tok = s.engine.tokenizer();
        let vocab = tok.vocab_size();
        if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
            return Err(BadRequest::param(
                "tokens",
                format!("token id {bad} is outside the vocabulary of {vocab}"),
            )
            .into());
        }
        Ok(json!({ "content": tok.decode(&ids, false) }))
    };
    match run() {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// With an API key set, every route but `/health` needs
/// `Authorization: Bearer KEY`; the key is compared in constant time.
async fn authorize(
    State(s): State<Arc<Server>>,
    headers: HeaderMap,
    request: Request,
    next: Next,
) -> Response {
    let Some(key) = &s.opts.api_key else {
        return next.run(request).await;
    };
    if request.uri().path() == "/health" {
        return next.run(request).await;
    }
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if constant_time_eq(given.as_bytes(), key.as_bytes()) {
        return next.run(request).await;
    }
    let mut e =
        ApiError::new(StatusCode::UNAUTHORIZED, "invalid or missing API key").into_response();
    e.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    e
}

/// Whether `a == b`, in a time that depends only on their lengths.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y));
    a.len() == b.len() && diff == 0
}
async fn not_found(method: Method, uri: Uri) -> Response {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: format!("no route for {method} {}", uri.path()),
        param: None,
    }
    .into_response()
}

/// Serves on `listener` at once: until `load` yields the server, `/health`
/// answers 503 `{"status": "loading"}` and every other route 503 in
/// OpenAI's error shape; then the server's routes. A load that fails ends
/// serving with its error; otherwise serving ends when `shutdown` completes.
pub async fn serve_loading(
    listener: tokio::net::TcpListener,
    load: impl Future<Output = Result<Arc<Server>, String>> + Send + 'static,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use tower::ServiceExt;
    let ready: Arc<OnceLock<Router>> = Arc::new(OnceLock::new());
    let (failed_tx, failed_rx) = tokio::sync::oneshot::channel::<String>();
    let slot = Arc::clone(&ready);
    tokio::spawn(async move {
        match load.await {
            Ok(server) => {
                let _ = slot.set(server.router());
            }
            Err(e) => {
                let _ = failed_tx.send(e);
            }
        }
    });
    let app = Router::new().fallback(move |request: Request| {
        let ready = Arc::clone(&ready);
        async move {
            match ready.get() {
                Some(router) => match router.clone().oneshot(request).await {
                    Ok(r) => r,
                    Err(never) => match never {},
                },
                None if request.uri().path() == "/health" => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    Json(json!({"status": "loading"})),
                )
                    .into_response(),
                None => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the model is loading")
                    .into_response(),
            }
        }
    });
    let failure = Arc::new(std::sync::Mutex::new(None::<String>));
    let failed = Arc::clone(&failure);
    let stop = async move {
        // The sender is dropped once the load succeeds: then only
        // `shutdown` ends serving.
        let load_failed = async {
            match failed_rx.await {
                Ok(e) => e,
                Err(_) => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = shutdown => {}
            e = load_failed => {
                *failed.lock().expect("not poisoned") = Some(e);
            }
        }
    };
    axum::serve(listener, app)
        .with_graceful_shutdown(stop)
        .await?;
    let failure = failure.lock().expect("not poisoned").take();
    match failure {
        Some(e) => Err(std::io::Error::other(e)),
        None => Ok(()),
    }
}

/// Serves `server` on `listener` until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    server: Arc<Server>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, server.router())
        .with_graceful_shutdown(shutdown)
        .await
}
