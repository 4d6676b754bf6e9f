//! The shapes of responses: OpenAI's error object, a choice as it
//! arrives, usage, llama-server's timings and log-probabilities.

use axum::extract::rejection::BytesRejection;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};

use crate::engine::{Finish, JobError, TokenLogprob};
use crate::openai::BadRequest;
use crate::reply::Reply;
use crate::Endpoint;

/// An error response in OpenAI's shape.
pub(crate) struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<String>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            param: None,
        }
    }
}

impl From<BytesRejection> for ApiError {
    fn from(e: BytesRejection) -> ApiError {
        ApiError::new(e.status(), format!("the request body: {}", e.body_text()))
    }
}

impl From<BadRequest> for ApiError {
    fn from(e: BadRequest) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: e.message,
            param: e.param,
        }
    }
}

impl From<JobError> for ApiError {
    fn from(e: JobError) -> ApiError {
        let status = match e {
            JobError::Invalid(_) => StatusCode::BAD_REQUEST,
            JobError::Busy(_) => StatusCode::TOO_MANY_REQUESTS,
            JobError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError {
            status,
            message: e.to_string(),
            param: None,
        }
    }
}

impl ApiError {
    pub fn body(&self) -> Value {
        let kind = if self.status.is_client_error() {
            "invalid_request_error"
        } else {
            "server_error"
        };
        json!({"error": {"message": self.message, "type": kind, "param": self.param, "code": null}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, Json(self.body())).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        r
    }
}

/// One choice of a request that does not stream, as it arrives.
#[derive(Default)]
pub(crate) struct Choice {
    /// A text completion's text.
    pub text: String,
    /// A chat choice's reply.
    pub reply: Option<Reply>,
    /// `Some` when the request asked for log-probabilities.
    pub logprobs: Option<Vec<TokenLogprob>>,
    pub finish: Option<Finish>,
}

impl Choice {
    pub fn push(&mut self, text: &str) {
        match &mut self.reply {
            Some(r) => {
                r.push(text);
            }
            None => self.text.push_str(text),
        }
    }
}

/// The request's figures over its choices: the prompt once (as the first
/// choice saw it), the tokens of all; `None` if a choice did not finish.
pub(crate) fn total(finishes: impl IntoIterator<Item = Option<Finish>>) -> Option<Finish> {
    let mut all = finishes.into_iter();
    let mut f = all.next()??;
    for g in all {
        let g = g?;
        f.completion_tokens += g.completion_tokens;
        f.decode_secs = f.decode_secs.max(g.decode_secs);
    }
    Some(f)
}

/// Log-probabilities in the shape of `endpoint`: chat's `content` entries,
/// or the text completions' parallel arrays (`text_offset` counted from the
/// first of `tokens`).
pub(crate) fn logprobs_json(endpoint: Endpoint, tokens: &[TokenLogprob]) -> Value {
    let piece = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    match endpoint {
        Endpoint::Chat => {
            let content: Vec<Value> = tokens
                .iter()
                .map(|t| {
                    let top: Vec<Value> = t
                        .top
                        .iter()
                        .map(|(_, b, l)| json!({"token": piece(b), "logprob": l, "bytes": b}))
                        .collect();
                    json!({"token": piece(&t.bytes), "logprob": t.logprob, "bytes": t.bytes,
                           "top_logprobs": top})
                })
                .collect();
            json!({ "content": content })
        }
        Endpoint::Completion => {
            let mut offset = 0usize;
            let mut offsets = Vec::with_capacity(tokens.len());
            for t in tokens {
                offsets.push(offset);
                offset += piece(&t.bytes).len();
            }
            let top: Vec<Value> = tokens
                .iter()
                .map(|t| {
                    let m: Map<String, Value> =
                        t.top.iter().map(|(_, b, l)| (piece(b), json!(l))).collect();
                    Value::Object(m)
                })
                .collect();
            json!({"tokens": tokens.iter().map(|t| piece(&t.bytes)).collect::<Vec<_>>(),
                   "token_logprobs": tokens.iter().map(|t| t.logprob).collect::<Vec<_>>(),
                   "top_logprobs": top, "text_offset": offsets})
        }
    }
}

pub(crate) fn usage(f: &Finish) -> Value {
    json!({"prompt_tokens": f.prompt_tokens, "completion_tokens": f.completion_tokens,
           "total_tokens": f.prompt_tokens + f.completion_tokens,
           "prompt_tokens_details": {"cached_tokens": f.cached_tokens}})
}

/// llama-server's timing fields.
pub(crate) fn timings(f: &Finish) -> Value {
    let run = f.prompt_tokens - f.cached_tokens;
    let per_s = |n: usize, s: f64| if s > 0.0 { n as f64 / s } else { 0.0 };
    // The first token comes from the prefill; the rest each cost a decode step.
    let decoded = f.completion_tokens.saturating_sub(1);
    json!({"cache_n": f.cached_tokens, "prompt_n": run, "prompt_ms": f.prefill_secs * 1e3,
           "prompt_per_second": per_s(run, f.prefill_secs),
           "predicted_n": f.completion_tokens, "predicted_ms": f.decode_secs * 1e3,
           "predicted_per_second": per_s(decoded, f.decode_secs)})
}
