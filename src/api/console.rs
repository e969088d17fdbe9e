//! The operator console (`console.enabled`): static files built into the binary, served at `/console/`.
//! The page talks only to the documented control API with a token the operator gives it, so this module
//! serves files and nothing else; its headers keep the page from running anything it did not ship.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;

use super::{ApiPath, AppState};
use crate::error::{ApiError, Code};

/// Only the console's own files run or style the page; no frame may embed it (clickjacking on the
/// grant button), and forms and `<base>` cannot point elsewhere.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; \
     frame-ancestors 'none'";

/// Every file of the console: name under `/console/`, content type, content.
const FILES: &[(&str, &str, &str)] = &[
    (
        "index.html",
        "text/html; charset=utf-8",
        include_str!("../console/index.html"),
    ),
    (
        "console.css",
        "text/css; charset=utf-8",
        include_str!("../console/console.css"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_str!("../console/app.js"),
    ),
    (
        "lib.js",
        "text/javascript; charset=utf-8",
        include_str!("../console/lib.js"),
    ),
    (
        "pages.js",
        "text/javascript; charset=utf-8",
        include_str!("../console/pages.js"),
    ),
    // The schema the context editor validates drafts against as the operator types.
    (
        "schema.json",
        "application/json",
        include_str!("../../policies/schema.json"),
    ),
];

/// The console's routes, added to the gateway's router only when `console.enabled` is true.
pub fn router() -> Router<AppState> {
    Router::new()
        .route(
            "/console",
            get(|| async { Redirect::permanent("/console/") }),
        )
        .route("/console/", get(|| async { file("index.html") }))
        .route(
            "/console/{file}",
            get(|ApiPath(name): ApiPath<String>| async move { file(&name) }),
        )
}

fn file(name: &str) -> Response {
    let Some((_, content_type, body)) = FILES.iter().find(|(file, _, _)| *file == name) else {
        return ApiError::new(Code::NotFound, format!("the console has no file {name:?}"))
            .into_response();
    };
    let mut response = (StatusCode::OK, *body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // The page's URL can carry a token in its fragment; no other origin learns even the path.
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    // A new binary's files replace the old ones at once, never mixed with cached ones.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}
