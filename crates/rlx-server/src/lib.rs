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
use rlx_tokenizer::{ChatOptions, ChatTemplate, EncodeOptions, Tokenizer, TokenizerError};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;

use engine::{Engine, Event, Finish, Job, JobError, StartError, TokenLogprob};
use response::{logprobs_json, timings, total, usage, ApiError, Choice};

pub use engine::EngineOptions;
use openai::{BadRequest, Params, Prompt};

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
        let engine = Engine::start(model, tokenizer, engine)?;
        Ok(Server {
            engine,
            vocab,
            template,
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
        let params = openai::params(&body, api, &self.opts.sampling, seed)?;
        let tok = self.engine.tokenizer();
        let ids = match endpoint {
            Endpoint::Chat => self.chat_prompt(&body)?,
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

    fn chat_prompt(&self, body: &Map<String, Value>) -> Result<Vec<u32>, ApiError> {
        let messages = openai::messages(body)?;
        let rendered = self
            .template
            .render(
                &messages,
                &ChatOptions {
                    add_generation_prompt: true,
                    enable_thinking: None,
                },
            )
            .map_err(|e| BadRequest::new(format!("chat template: {e}")))?;
        Ok(self.engine.tokenizer().encode_chat(&rendered))
    }

    fn id(&self, endpoint: Endpoint) -> String {
        let prefix = match endpoint {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completion => "cmpl",
        };
        let n = self.requests.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:x}{n:06x}", self.created)
    }

    /// One choice's object: its text (a delta when streaming), its
    /// log-probabilities when asked for, and its finish reason.
    fn choice(
        &self,
        endpoint: Endpoint,
        index: usize,
        text: &str,
        logprobs: Option<&[TokenLogprob]>,
        finish: Option<FinishReason>,
        streaming: bool,
    ) -> Value {
        let reason = finish.map(FinishReason::as_str);
        let lp = logprobs.map_or(Value::Null, |l| logprobs_json(endpoint, l));
        match (endpoint, streaming) {
            (Endpoint::Chat, true) => {
                let delta = if finish.is_some() && text.is_empty() {
                    json!({})
                } else {
                    json!({"content": text})
                };
                json!({"index": index, "delta": delta, "logprobs": lp, "finish_reason": reason})
            }
            (Endpoint::Chat, false) => json!({"index": index,
                "message": {"role": "assistant", "content": text},
                "logprobs": lp, "finish_reason": reason}),
            (Endpoint::Completion, _) => {
                json!({"index": index, "text": text, "logprobs": lp, "finish_reason": reason})
            }
        }
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
                self.choice(endpoint, i, &c.text, c.logprobs.as_deref(), reason, false)
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
        if params.stream {
            return self.stream(endpoint, id, merged, params.n, params.include_usage);
        }
        let mut choices: Vec<Choice> = (0..params.n)
            .map(|_| Choice {
                logprobs: params.logprobs.map(|_| Vec::new()),
                ..Choice::default()
            })
            .collect();
        while let Some((i, ev)) = merged.recv().await {
            let c = &mut choices[i];
            match ev {
                Event::Text(t) => c.text.push_str(&t),
                Event::Token { text, logprob } => {
                    c.text.push_str(&text);
                    if let Some(l) = &mut c.logprobs {
                        l.push(logprob);
                    }
                }
                Event::Done(f) => c.finish = Some(f),
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
        n: usize,
        include_usage: bool,
    ) -> Response {
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
                let choice = match ev {
                    Event::Text(t) => self.choice(endpoint, i, &t, None, None, true),
                    Event::Token { text, logprob } => {
                        let lp = [logprob];
                        self.choice(endpoint, i, &text, Some(&lp), None, true)
                    }
                    Event::Done(f) => {
                        finishes[i] = Some(f);
                        let mut last = self.choice(endpoint, i, "", None, Some(f.reason), true);
                        last["timings"] = timings(&f);
                        last
                    }
                    Event::Error(e) => {
                        let e = ApiError::from(e);
                        self.log(&id, endpoint, true, e.status, Err(e.message.clone()));
                        let _ = out.send(data(e.body()));
                        return;
                    }
                };
                if out
                    .send(data(self.chunk(endpoint, &id, vec![choice])))
                    .is_err()
                {
                    return gone(&self, &id);
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
