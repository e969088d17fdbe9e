//! Liveness, readiness and Prometheus metrics.

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::State;
use crate::error::{ApiError, Code};

pub async fn healthz() -> impl IntoResponse {
    axum::Json(json!({"status": "ok"}))
}

/// Ready when the store answers and at least one security context is loaded: with none, no session
/// can be registered and every call is refused, so traffic should not be sent here yet.
pub async fn readyz(axum::extract::State(gw): State) -> Response {
    if let Err(e) = gw.store.ping().await {
        return ApiError::store(format!("not ready: the store does not answer: {e}"))
            .into_response();
    }
    let contexts = gw.contexts.list().len();
    if contexts == 0 {
        // 6003: the missing thing is a context; the status says the gateway, not the route, is unready.
        return ApiError::new(
            Code::NotFound,
            "not ready: no security context is loaded; add a policy file to policies_dir or PUT \
             /v1/security-contexts/{name}",
        )
        .with_status(StatusCode::SERVICE_UNAVAILABLE)
        .into_response();
    }
    (
        StatusCode::OK,
        axum::Json(json!({"status": "ready", "contexts": contexts})),
    )
        .into_response()
}

pub async fn metrics(axum::extract::State(gw): State) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        gw.metrics.render(),
    )
}
