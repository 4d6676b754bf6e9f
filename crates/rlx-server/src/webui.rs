//! The chat page at `/`: three files built into the binary (no CDN, nothing
//! fetched at run time), talking to the server's own OpenAI routes.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

/// `(path, content type, body)` of each file of the page.
const FILES: [(&str, &str, &str); 3] = [
    (
        "/",
        "text/html; charset=utf-8",
        include_str!("../web/index.html"),
    ),
    (
        "/app.js",
        "text/javascript; charset=utf-8",
        include_str!("../web/app.js"),
    ),
    (
        "/style.css",
        "text/css; charset=utf-8",
        include_str!("../web/style.css"),
    ),
];

/// The paths the page is served at.
pub(crate) fn paths() -> impl Iterator<Item = &'static str> {
    FILES.iter().map(|f| f.0)
}

/// Whether `path` is one of the page's files.
pub(crate) fn is_page(path: &str) -> bool {
    paths().any(|p| p == path)
}

/// The page's file at `path` (404 for another path). Browsers load these
/// without an API key (they cannot send one), and revalidate them, so a new
/// binary's page is never stale.
pub(crate) fn file(path: &str) -> Response {
    let Some((_, kind, body)) = FILES.iter().find(|f| f.0 == path) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, *kind),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        *body,
    )
        .into_response()
}
