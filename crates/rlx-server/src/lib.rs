//! rlx-server: an OpenAI-compatible HTTP API over one model.
//!
//! `POST /v1/chat/completions` and `POST /v1/completions` (both with
//! `stream: true` as server-sent events), `GET /v1/models`, `GET /health`,
//! `GET /metrics` (Prometheus), `POST /tokenize` and `POST /detokenize`
//! (llama-server's shapes), Ollama's API (`/api/generate`, `/api/chat`,
//! `/api/tags`, `/api/show`, `/api/ps`, `/api/version`) and Anthropic's
//! Messages API (`/v1/messages`, `/v1/messages/count_tokens`) and OpenAI's
//! Responses API (`/v1/responses`).
//! One [`engine::Engine`] thread steps every running request together
//! (continuous batching) and keeps finished requests' K/V for a while, so a
//! prompt that starts like an earlier one (a conversation re-sent with one
//! more turn, a shared system prompt) only runs the rest. Errors are
//! OpenAI's JSON shape and name the field.

mod anthropic;
mod auth;
mod complete;
pub mod engine;
mod metrics;
mod ollama;
pub mod openai;
mod prompt;
mod reply;
mod response;
mod responses;
mod routes;
mod webui;

use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::{DefaultBodyLimit, Request};
use axum::handler::Handler;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post, MethodRouter};
use axum::{Json, Router};
use rlx_gemma::sampling::SamplerConfig;
use rlx_gemma::Model;
use rlx_guide::gemma4;
use rlx_guide::tools::Syntax;
use rlx_tokenizer::{ChatTemplate, Tokenizer, TokenizerError};
use serde_json::json;

use auth::authorize;
use engine::{Engine, Finish, StartError};
use response::ApiError;
use routes::{chat, completions, detokenize, health, metrics_text, models, not_found, tokenize};

pub use engine::EngineOptions;
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
    /// `/health` and the chat page's files).
    pub api_key: Option<String>,
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// Serve the chat page at `/` (its files need no API key).
    pub webui: bool,
    /// The chat template, instead of the model file's own (or the built-in
    /// format for its vocabulary where it has none).
    pub chat_template: Option<Arc<ChatTemplate>>,
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
            webui: true,
            chat_template: None,
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
    template: Arc<ChatTemplate>,
    /// How this model calls tools: Gemma 4's syntax when its vocabulary
    /// has the tool tokens and its file a chat template to declare tools
    /// with, JSON replies otherwise.
    tool_syntax: Syntax,
    /// Replies are read for Gemma 4's thinking channels and calls.
    gemma4_replies: bool,
    opts: ServerOptions,
    /// What Ollama's API tells of the model.
    facts: ollama::ModelFacts,
    /// Recent responses' conversations, for `previous_response_id`.
    kept: responses::Kept,
    created: u64,
    requests: AtomicU64,
    metrics: metrics::Metrics,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
        Server::with_draft(model, None, engine, opts)
    }

    /// [`Server::new`] with a draft model for `engine`'s speculation
    /// ([`Engine::start_with_draft`]).
    pub fn with_draft(
        model: Model,
        draft: Option<Model>,
        engine: EngineOptions,
        opts: ServerOptions,
    ) -> Result<Server, ServerError> {
        let tokenizer = Arc::new(Tokenizer::from_gguf(model.file())?);
        let template = match &opts.chat_template {
            Some(t) => Arc::clone(t),
            None => Arc::new(ChatTemplate::from_gguf(model.file())?),
        };
        let vocab = rlx_guide::Vocabulary::new(Arc::clone(&tokenizer))?;
        let has = |piece: &str| tokenizer.id_of(piece).is_some();
        let tool_tokens = has(gemma4::CALL_OPEN) && has(gemma4::CALL_CLOSE) && has(gemma4::QUOTE);
        let tool_syntax = if tool_tokens && template.source().is_some() {
            Syntax::Gemma4
        } else {
            Syntax::Json
        };
        let gemma4_replies = tool_tokens || has(gemma4::CHANNEL_OPEN);
        let file = model.file();
        let facts = ollama::ModelFacts {
            family: file
                .get_str("general.architecture")
                .unwrap_or("gemma")
                .to_owned(),
            size: file.file_len(),
            parameters: file
                .tensors()
                .iter()
                .map(|t| t.dims.iter().product::<u64>())
                .sum(),
            quantization: file
                .get_u64("general.file_type")
                .ok()
                .and_then(|id| {
                    rlx_gemma::quantize::FileType::ALL
                        .into_iter()
                        .find(|f| u64::from(f.id()) == id)
                })
                .map_or_else(String::new, |f| f.name().to_owned()),
            thinking: has(gemma4::CHANNEL_OPEN),
        };
        let engine = Engine::start_with_draft(model, draft, tokenizer, engine)?;
        Ok(Server {
            engine,
            vocab,
            template,
            tool_syntax,
            gemma4_replies,
            opts,
            facts,
            kept: responses::Kept::default(),
            created: now(),
            requests: AtomicU64::new(0),
            metrics: metrics::Metrics::default(),
        })
    }

    /// The HTTP routes.
    pub fn router(self: Arc<Self>) -> Router {
        let limit = self.opts.max_body_bytes;
        let mut router = Router::new();
        if self.opts.webui {
            for path in webui::paths() {
                router = router.route(path, get(move || async move { webui::file(path) }));
            }
        }
        for route in api() {
            router = router.route(route.path, route.handler);
        }
        router
            .fallback(not_found)
            .layer(axum::middleware::from_fn_with_state(
                Arc::clone(&self),
                authorize,
            ))
            .layer(DefaultBodyLimit::max(limit))
            .with_state(self)
    }
}

/// One route of the API: what the router serves and what [`routes`] lists.
struct Route {
    method: &'static str,
    path: &'static str,
    handler: MethodRouter<Arc<Server>>,
}

fn at_get<H: Handler<T, Arc<Server>>, T: 'static>(path: &'static str, handler: H) -> Route {
    Route {
        method: "GET",
        path,
        handler: get(handler),
    }
}

fn at_post<H: Handler<T, Arc<Server>>, T: 'static>(path: &'static str, handler: H) -> Route {
    Route {
        method: "POST",
        path,
        handler: post(handler),
    }
}

/// The API's routes, in the order docs/SERVER.md gives them.
fn api() -> Vec<Route> {
    vec![
        at_post("/v1/chat/completions", chat),
        at_post("/v1/completions", completions),
        at_get("/v1/models", models),
        at_post("/v1/responses", responses::create),
        at_post("/v1/messages", anthropic::messages),
        at_post("/v1/messages/count_tokens", anthropic::count_tokens),
        at_post("/api/generate", ollama::generate),
        at_post("/api/chat", ollama::chat),
        at_get("/api/tags", ollama::tags),
        at_post("/api/show", ollama::show),
        at_get("/api/ps", ollama::ps),
        at_get("/api/version", ollama::version),
        at_post("/api/embed", ollama::embed),
        at_post("/api/embeddings", ollama::embed),
        at_post("/tokenize", tokenize),
        at_post("/detokenize", detokenize),
        at_get("/health", health),
        at_get("/metrics", metrics_text),
    ]
}

/// Every `(method, path)` the server answers: the API's routes, then the
/// chat page's files (served unless turned off). The router is built from
/// the same table, so this list is what it serves.
pub fn routes() -> Vec<(&'static str, &'static str)> {
    api()
        .into_iter()
        .map(|r| (r.method, r.path))
        .chain(webui::paths().map(|p| ("GET", p)))
        .collect()
}

/// Serves on `listener` at once: until `load` yields the server, `/health`
/// answers 503 `{"status": "loading"}`, the chat page (with `webui`) its
/// files, and every other route 503 in OpenAI's error shape; then the
/// server's routes. A load that fails ends
/// serving with its error; otherwise serving ends when `shutdown` completes.
pub async fn serve_loading(
    listener: tokio::net::TcpListener,
    webui: bool,
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
            // The chat page loads at once and waits for the model.
            let page = webui && webui::is_page(request.uri().path());
            match (ready.get(), page) {
                (Some(router), _) => match router.clone().oneshot(request).await {
                    Ok(r) => r,
                    Err(never) => match never {},
                },
                (None, true) => webui::file(request.uri().path()),
                (None, false) if request.uri().path() == "/health" => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    Json(json!({"status": "loading"})),
                )
                    .into_response(),
                (None, false) => {
                    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the model is loading")
                        .into_response()
                }
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
