//! The HTTP handlers.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use rlx_tokenizer::EncodeOptions;
use serde_json::{json, Value};

use crate::openai::{self, BadRequest};
use crate::response::ApiError;
use crate::{Endpoint, Server};

pub(crate) async fn health() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

pub(crate) async fn models(State(s): State<Arc<Server>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [{
        "id": s.opts.model_name, "object": "model", "created": s.created, "owned_by": "rlx",
        "meta": {"n_ctx": s.engine.context(), "n_vocab": s.engine.tokenizer().vocab_size()}
    }]}))
}

pub(crate) async fn chat(
    State(s): State<Arc<Server>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match body {
        Ok(body) => s.complete(Endpoint::Chat, body).await,
        Err(e) => ApiError::from(e).into_response(),
    }
}

pub(crate) async fn completions(
    State(s): State<Arc<Server>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match body {
        Ok(body) => s.complete(Endpoint::Completion, body).await,
        Err(e) => ApiError::from(e).into_response(),
    }
}

pub(crate) async fn metrics_text(State(s): State<Arc<Server>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.metrics.render(s.engine.load()),
    )
        .into_response()
}

pub(crate) async fn tokenize(
    State(s): State<Arc<Server>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
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

pub(crate) async fn detokenize(
    State(s): State<Arc<Server>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
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

pub(crate) async fn not_found(method: Method, uri: Uri) -> Response {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: format!("no route for {method} {}", uri.path()),
        param: None,
    }
    .into_response()
}
