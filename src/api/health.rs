//! Liveness, readiness and Prometheus metrics.

use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use serde_json::json;

use super::State;

pub async fn healthz() -> impl IntoResponse {
    axum::Json(json!({"status": "ok"}))
}

/// Ready when the store answers and the policies are loaded.
pub async fn readyz(axum::extract::State(gw): State) -> impl IntoResponse {
    match gw.store.ping().await {
        Ok(()) => (
            StatusCode::OK,
            axum::Json(json!({"status": "ready", "contexts": gw.contexts.list().len()})),
        ),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "unavailable", "reason": e.to_string()})),
        ),
    }
}

pub async fn metrics(axum::extract::State(gw): State) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        gw.metrics.render(),
    )
}
