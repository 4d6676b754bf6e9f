//! The API key check in front of the routes.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::response::ApiError;
use crate::Server;

/// With an API key set, every route but `/health` and the chat page's files
/// needs `Authorization: Bearer KEY` (or `x-api-key: KEY`, as Anthropic's
/// clients send it); the key is compared in constant time.
pub(crate) async fn authorize(
    State(s): State<Arc<Server>>,
    headers: HeaderMap,
    request: Request,
    next: Next,
) -> Response {
    let Some(key) = &s.opts.api_key else {
        return next.run(request).await;
    };
    let path = request.uri().path();
    if path == "/health" || (s.opts.webui && crate::webui::is_page(path)) {
        return next.run(request).await;
    }
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))
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
