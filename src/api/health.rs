//! Liveness, readiness, Prometheus metrics and the OpenAPI document.

use crate::identity::Caller;
use std::sync::{Arc, LazyLock};

use axum::extract::{FromRequestParts, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::AppState;
use crate::error::{ApiError, Code};
use crate::gateway::Gateway;

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
    /// `ready`.
    status: &'static str,
    /// Security contexts loaded (at least one).
    contexts: usize,
    /// With `?verbose`: each MCP upstream's server as last seen. One that is down does not make the
    /// gateway unready: the calls to its tools get 5001, the others are served.
    #[serde(skip_serializing_if = "Option::is_none")]
    upstreams: Option<Vec<crate::upstream::UpstreamStatus>>,
}

/// `?verbose`, `?verbose=1` or `?verbose=true`.
fn wants_verbose(query: Option<&str>) -> bool {
    query.unwrap_or_default().split('&').any(|pair| {
        matches!(
            pair.split_once('=').unwrap_or((pair, "")),
            ("verbose", "" | "1" | "true")
        )
    })
}

/// Ready when the store answers, every key set at a JWKS URL has been fetched once, and at least one
/// security context is loaded: with none, no session can be registered and every call is refused, so
/// traffic should not be sent here yet.
#[utoipa::path(get, path = "/readyz", tag = "operations",
    params(("verbose" = Option<bool>, Query, description = "Add each MCP upstream's state: not_started, up, down (with why: failed to start, exited) or stopped")),
    responses(
        (status = 200, description = "Ready", body = Readiness),
        (status = 503, description = "Not ready: the store does not answer (5005), a key set at a JWKS URL has not been fetched yet (6001), or no security context is loaded (6003)", body = super::openapi::ErrorBody),
    ))]
pub async fn readyz(
    State(gw): State<Arc<Gateway>>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> Response {
    if let Err(e) = gw.store().ping().await {
        return ApiError::store(format!("not ready: the store does not answer: {e}"))
            .into_response();
    }
    let waiting = (gw.agent_tokens().key_set().waiting_for_keys())
        .or_else(|| gw.operators().key_set().waiting_for_keys());
    if let Some(waiting) = waiting {
        // 6001: until the keys arrive, no operator or agent token signed by them can be verified.
        return ApiError::new(
            Code::OperatorUnauthenticated,
            format!("not ready: {waiting}"),
        )
        .with_status(StatusCode::SERVICE_UNAVAILABLE)
        .into_response();
    }
    let contexts = gw.contexts().list().len();
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
        axum::Json(Readiness {
            status: "ready",
            contexts,
            upstreams: wants_verbose(query.as_deref()).then(|| gw.upstreams().statuses()),
        }),
    )
        .into_response()
}

/// Prometheus metrics in the text exposition format (docs/metrics.md lists them). With
/// `metrics.listen` set they are served there, without a token, and this route answers 404.
#[utoipa::path(get, path = "/metrics", tag = "operations",
    security(("operator" = ["seal.metrics.read"])),
    responses(
        (status = 200, description = "Prometheus text format 0.0.4", content_type = "text/plain", body = String),
        (status = 404, description = "Served on metrics.listen instead", body = super::openapi::ErrorBody),
    ))]
pub async fn metrics(
    State(state): State<AppState>,
    request: axum::extract::Request,
) -> Result<Response, ApiError> {
    if state.0.config().metrics.listen.is_some() {
        return Err(ApiError::new(Code::NotFound, "no such endpoint"));
    }
    // Asked only now: with `metrics.listen` set, the route is not found, whoever asks.
    let (mut parts, _) = request.into_parts();
    let caller = Caller::from_request_parts(&mut parts, &state).await?;
    caller.require_everywhere(crate::token::scopes::METRICS_READ)?;
    Ok(super::metrics::scrape(&state.0).await)
}

/// Built once: the document is the same for every gateway of this binary.
static DOCUMENT: LazyLock<utoipa::openapi::OpenApi> = LazyLock::new(super::openapi_document);

/// This document: the OpenAPI 3.1 description of every endpoint.
#[utoipa::path(get, path = "/openapi.json", operation_id = "openapi", tag = "operations",
    responses((status = 200, description = "OpenAPI 3.1", body = Object)))]
pub async fn openapi_json() -> impl IntoResponse {
    axum::Json(&*DOCUMENT)
}

#[cfg(test)]
mod tests {
    use super::wants_verbose;

    #[test]
    fn verbose_is_asked_by_the_bare_key_or_a_true_value() {
        for query in ["verbose", "verbose=1", "verbose=true", "x=1&verbose"] {
            assert!(wants_verbose(Some(query)), "{query}");
        }
        for query in ["", "verbose=0", "verbose=false", "verbosely", "x=verbose"] {
            assert!(!wants_verbose(Some(query)), "{query}");
        }
        assert!(!wants_verbose(None));
    }
}
