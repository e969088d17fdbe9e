//! Liveness, readiness, Prometheus metrics and the OpenAPI document.

use std::sync::LazyLock;

use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use serde::Serialize;

use super::State;

#[derive(Serialize, utoipa::ToSchema)]
pub struct Health {
    /// `ok`
    status: &'static str,
}

/// Liveness: the process answers.
#[utoipa::path(get, path = "/healthz", tag = "operations",
    responses((status = 200, description = "Alive", body = Health)))]
pub async fn healthz() -> impl IntoResponse {
    axum::Json(Health { status: "ok" })
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct Readiness {
    /// `ready` or `unavailable`.
    status: &'static str,
    /// Security contexts loaded (when ready).
    #[serde(skip_serializing_if = "Option::is_none")]
    contexts: Option<usize>,
    /// Why not ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

/// Ready when the store answers and the policies are loaded.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    responses(
        (status = 200, description = "Ready", body = Readiness),
        (status = 503, description = "Not ready, with the reason", body = Readiness),
    ))]
pub async fn readyz(axum::extract::State(gw): State) -> impl IntoResponse {
    match gw.store.ping().await {
        Ok(()) => (
            StatusCode::OK,
            axum::Json(Readiness {
                status: "ready",
                contexts: Some(gw.contexts.list().len()),
                reason: None,
            }),
        ),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(Readiness {
                status: "unavailable",
                contexts: None,
                reason: Some(e.to_string()),
            }),
        ),
    }
}

/// Prometheus metrics in the text exposition format (README lists them).
#[utoipa::path(get, path = "/metrics", tag = "operations",
    responses((status = 200, description = "Prometheus text format 0.0.4", content_type = "text/plain", body = String)))]
pub async fn metrics(axum::extract::State(gw): State) -> impl IntoResponse {
    crate::telemetry::observe_gateway(&gw).await;
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        gw.metrics.render(),
    )
}

/// Built once: the document is the same for every gateway of this binary.
static DOCUMENT: LazyLock<utoipa::openapi::OpenApi> = LazyLock::new(super::openapi_document);

/// This document: the OpenAPI 3.1 description of every endpoint.
#[utoipa::path(get, path = "/openapi.json", operation_id = "openapi", tag = "operations",
    responses((status = 200, description = "OpenAPI 3.1", body = Object)))]
pub async fn openapi_json() -> impl IntoResponse {
    axum::Json(&*DOCUMENT)
}
