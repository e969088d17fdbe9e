//! HTTP routers: the agent endpoint, the control API for orchestrators and operators, health and metrics.
//! Handlers parse and authorise at the edge and call the modules that own the rules.

mod audit;
mod claims;
mod contexts;
mod health;
mod invoke;
mod sessions;

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::Router;
use serde::de::DeserializeOwned;

use crate::error::{ApiError, Code};
use crate::gateway::Gateway;
use crate::token::OperatorClaims;

pub type State = axum::extract::State<Arc<Gateway>>;

pub fn router(gateway: Arc<Gateway>) -> Router {
    Router::new()
        .route("/v1/invoke", post(invoke::invoke))
        .route("/v1/seal/invoke", post(invoke::invoke))
        .route("/v1/seal/sessions", post(sessions::create))
        .route(
            "/v1/seal/sessions/{id}",
            get(sessions::read).delete(sessions::revoke),
        )
        .route("/v1/security-contexts", get(contexts::list))
        .route(
            "/v1/security-contexts/{name}",
            get(contexts::read)
                .put(contexts::put)
                .delete(contexts::delete),
        )
        .route(
            "/v1/security-contexts/{name}/evaluate",
            post(contexts::evaluate),
        )
        .route("/v1/claims", get(claims::list))
        .route("/v1/claims/{request_id}", get(claims::read))
        .route("/v1/claims/{request_id}/resolve", post(claims::resolve))
        .route("/claim", post(claims::standalone_claim))
        .route("/settle/{request_id}", post(claims::settle))
        .route("/audit", get(claims::standalone_audit))
        .route("/v1/audit", get(audit::query))
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics))
        .fallback(|| async { ApiError::new(Code::NotFound, "no such endpoint") })
        .with_state(gateway)
}

/// An authenticated operator (SPEC 4: operator tokens). Missing or bad credentials → 401 (6001).
pub struct Operator(pub OperatorClaims);

impl FromRequestParts<Arc<Gateway>> for Operator {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, gw: &Arc<Gateway>) -> Result<Self, ApiError> {
        let header = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .ok_or_else(|| {
                ApiError::new(
                    Code::OperatorUnauthenticated,
                    "missing Authorization: Bearer token",
                )
            })?;
        let token = header
            .to_str()
            .ok()
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                ApiError::new(
                    Code::OperatorUnauthenticated,
                    "Authorization must be a Bearer token",
                )
            })?;
        gw.operators
            .verify(token, crate::clock::now_secs())
            .map(Operator)
            .map_err(|e| {
                ApiError::new(
                    Code::OperatorUnauthenticated,
                    format!("operator token refused: {e}"),
                )
            })
    }
}

impl Operator {
    /// 403 (6002) unless the token's scope allows `scope`.
    pub fn require(&self, scope: &str) -> Result<(), ApiError> {
        if self.0.allows(scope) {
            Ok(())
        } else {
            Err(ApiError::new(
                Code::OperatorForbidden,
                format!("the operator token lacks scope {scope}"),
            ))
        }
    }

    pub fn name(&self) -> &str {
        &self.0.sub
    }
}

/// A control-API body, read within `limits.max_body_bytes` (413 with the API's error shape beyond it).
pub struct ControlBody(pub axum::body::Bytes);

impl axum::extract::FromRequest<Arc<Gateway>> for ControlBody {
    type Rejection = ApiError;

    async fn from_request(
        request: axum::extract::Request,
        gw: &Arc<Gateway>,
    ) -> Result<Self, ApiError> {
        let limit = gw.config.limits.max_body_bytes;
        axum::body::to_bytes(request.into_body(), limit)
            .await
            .map(ControlBody)
            .map_err(|_| {
                ApiError::new(
                    Code::InvalidRequest,
                    format!("the body is larger than {limit} bytes"),
                )
                .with_status(StatusCode::PAYLOAD_TOO_LARGE)
            })
    }
}

/// Reads a control-API JSON body: not JSON → 400 (6005), wrong shape → 422 (6005) naming the problem.
pub fn json_body<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice::<serde::de::IgnoredAny>(bytes).map_err(|e| {
        ApiError::new(Code::InvalidRequest, format!("the body is not JSON: {e}"))
            .with_status(StatusCode::BAD_REQUEST)
    })?;
    // JSON, but held to the same strict reading as envelopes: no repeated keys, no unsafe numbers.
    let value = crate::envelope::parse_strict_json(bytes).map_err(|e| {
        ApiError::new(
            Code::InvalidRequest,
            format!("the body is not acceptable JSON: {e}"),
        )
    })?;
    serde_json::from_value(value).map_err(|e| ApiError::new(Code::InvalidRequest, e.to_string()))
}

/// Parses query parameters, refusing unknown ones (a typo must not silently widen a query).
pub fn query_params(
    raw: Option<&str>,
    allowed: &[&str],
) -> Result<std::collections::HashMap<String, String>, ApiError> {
    let mut params = std::collections::HashMap::new();
    for (key, value) in url::form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
        if !allowed.contains(&key.as_ref()) {
            return Err(ApiError::new(
                Code::InvalidRequest,
                format!("unknown query parameter {key:?}"),
            ));
        }
        if params.insert(key.to_string(), value.into_owned()).is_some() {
            return Err(ApiError::new(
                Code::InvalidRequest,
                format!("query parameter {key:?} repeated"),
            ));
        }
    }
    Ok(params)
}

/// A `limit` query parameter within 1..=1000 (default `default`).
pub fn limit_param(
    params: &std::collections::HashMap<String, String>,
    default: usize,
) -> Result<usize, ApiError> {
    match params.get("limit") {
        None => Ok(default),
        Some(raw) => raw
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=1000).contains(n))
            .ok_or_else(|| {
                ApiError::new(
                    Code::InvalidRequest,
                    "limit must be an integer from 1 to 1000",
                )
            }),
    }
}
