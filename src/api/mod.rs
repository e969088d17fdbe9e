//! HTTP routers: the agent endpoint, the control API for orchestrators and operators, health and metrics.
//! Handlers parse and authorise at the edge and call the modules that own the rules.

mod approvals;
mod audit;
pub mod body;
mod claims;
mod connection;
mod console;
mod contexts;
mod health;
mod invoke;
mod keys;
pub(crate) mod metrics;
pub mod openapi;
pub mod server;
mod sessions;
mod shadows;
pub mod sign_in;
mod tools;

use std::sync::Arc;

use axum::extract::{FromRef, FromRequestParts};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::Router;
use serde::de::DeserializeOwned;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::approval::Desk;
use crate::audit::AuditLog;
use crate::config::Config;
use crate::error::{ApiError, Code};
use crate::evidence::Evidence;
use crate::gateway::Gateway;
use crate::identity::{Caller, Identity, Oidc, TeamScopes, Via, LOCAL_ISSUER};
use crate::policy::ContextRegistry;
use crate::session::SessionCache;
use crate::shadow::Tallies;
use crate::store::Store;
use crate::token::{KeySource, OperatorClaims, TokenMinter};

pub use body::{read_body, BodyError};
pub use invoke::calls_finished;

/// What the routers hold. Each handler takes the parts it uses, by type (`FromRef` below); the agent
/// and MCP endpoints, which run whole calls, the tools' listing, which asks the upstreams and screens
/// their answers against the pins, and the health checks, which look at every part, take the gateway.
#[derive(Clone)]
pub struct AppState(Arc<Gateway>);

impl FromRef<AppState> for Arc<Gateway> {
    fn from_ref(state: &AppState) -> Self {
        state.0.clone()
    }
}

/// `FromRef<AppState>` for a part: a clone of what the gateway's accessor lends (an `Arc`, or a handle).
macro_rules! part {
    ($part:ty, $accessor:ident) => {
        impl FromRef<AppState> for $part {
            fn from_ref(state: &AppState) -> Self {
                state.0.$accessor().clone()
            }
        }
    };
}

part!(Arc<Config>, config);
part!(Arc<dyn Store>, store);
part!(Arc<ContextRegistry>, contexts);
part!(Arc<Tallies>, shadows);
part!(Arc<SessionCache>, sessions);
part!(AuditLog, audit);
part!(Desk, approvals);
part!(Arc<Evidence>, evidence);
part!(Option<Arc<Oidc>>, oidc);
part!(Option<Arc<TokenMinter>>, minter);

/// Every documented route: each registered together with its `#[utoipa::path]` description.
fn documented_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(openapi::skeleton())
        .routes(routes!(invoke::invoke))
        .routes(routes!(sessions::create, sessions::list))
        .routes(routes!(sessions::read, sessions::revoke))
        .routes(routes!(contexts::list))
        .routes(routes!(contexts::read, contexts::put, contexts::delete))
        .routes(routes!(contexts::evaluate))
        .routes(routes!(shadows::read, shadows::put, shadows::delete))
        .routes(routes!(claims::list))
        .routes(routes!(claims::read))
        .routes(routes!(claims::resolve))
        .routes(routes!(claims::standalone_claim))
        .routes(routes!(claims::settle))
        .routes(routes!(claims::standalone_audit))
        .routes(routes!(approvals::list))
        .routes(routes!(approvals::read))
        .routes(routes!(approvals::grant))
        .routes(routes!(approvals::deny))
        .routes(routes!(audit::query))
        .routes(routes!(audit::export))
        .routes(routes!(audit::checkpoints))
        .routes(routes!(tools::list))
        .routes(routes!(tools::accept))
        .routes(routes!(keys::keys))
        .routes(routes!(health::healthz))
        .routes(routes!(health::readyz))
        .routes(routes!(health::metrics))
        .routes(routes!(health::openapi_json))
        .routes(routes!(sign_in::session))
        .routes(routes!(sign_in::logout))
        .routes(routes!(sign_in::device_start))
        .routes(routes!(sign_in::device_poll))
}

/// The OpenAPI document, as served at `/openapi.json`.
pub fn openapi_document() -> utoipa::openapi::OpenApi {
    openapi::finish(documented_routes().into_openapi())
}

pub fn router(gateway: Arc<Gateway>) -> Router {
    let (mut router, _) = documented_routes().split_for_parts();
    router = router.merge(sign_in::browser_routes());
    if gateway.config().console.enabled {
        router = router.merge(console::router());
    }
    router = router.merge(crate::mcp_server::endpoint::routes(&gateway));
    router
        // The SPEC's older name of the agent endpoint, kept working; documented under /v1/invoke.
        .route("/v1/seal/invoke", axum::routing::post(invoke::invoke))
        .fallback(|| async { ApiError::new(Code::NotFound, "no such endpoint") })
        .method_not_allowed_fallback(
            |method: axum::http::Method, uri: axum::http::Uri| async move {
                ApiError::new(
                    Code::InvalidRequest,
                    format!("{method} is not allowed on {}", uri.path()),
                )
                .with_status(StatusCode::METHOD_NOT_ALLOWED)
            },
        )
        .layer(axum::middleware::from_fn(crate::trace::propagate))
        .with_state(AppState(gateway))
}

/// A path parameter; one that does not decode (not UTF-8) is refused with the SPEC error body.
pub struct ApiPath<T>(pub T);

impl<T, S> FromRequestParts<S> for ApiPath<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(value)| ApiPath(value))
            .map_err(|e| ApiError::new(Code::InvalidRequest, format!("path: {}", e.body_text())))
    }
}

/// An authenticated caller of the control API: an operator token (SPEC 4), or a console session (SPEC
/// 16) as the `__Host-sealgate` cookie (a change then needs its `X-CSRF-Token`) or as the bearer
/// identifier of `sealgate login`. Missing or bad credentials → 401 (6001).
impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let bearer = bearer_credential(parts)?;
        let sign_in = sign_in::SignIn::from_ref(state);
        if let Some(caller) = sign_in.session_caller(parts, bearer).await? {
            return Ok(caller);
        }
        let token = bearer.ok_or_else(|| {
            ApiError::new(
                Code::OperatorUnauthenticated,
                "missing Authorization: Bearer token",
            )
        })?;
        state
            .0
            .operators()
            .verify_with_refresh(token, crate::clock::now_secs())
            .await
            .map(caller_of_token)
            .map_err(|e| {
                ApiError::new(
                    Code::OperatorUnauthenticated,
                    format!("operator token refused: {e}"),
                )
            })
    }
}

/// A caller presenting an operator token (SPEC 4); a token without `iss` is a [`LOCAL_ISSUER`] identity.
fn caller_of_token(claims: OperatorClaims) -> Caller {
    let via = match claims.key_source {
        KeySource::Configured => Via::Key,
        KeySource::Fetched => Via::Jwks,
    };
    Caller {
        scopes: TeamScopes::from_claim(claims.scopes.iter().map(String::as_str)),
        identity: Identity {
            iss: claims.iss.unwrap_or_else(|| LOCAL_ISSUER.to_owned()),
            sub: claims.sub,
            name: claims.name,
            via,
        },
    }
}

/// The credential of `Authorization: Bearer …`; None without the header.
fn bearer_credential(parts: &Parts) -> Result<Option<&str>, ApiError> {
    let Some(header) = parts.headers.get(axum::http::header::AUTHORIZATION) else {
        return Ok(None);
    };
    header
        .to_str()
        .ok()
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(Some)
        .ok_or_else(|| {
            ApiError::new(
                Code::OperatorUnauthenticated,
                "Authorization must be a Bearer token",
            )
        })
}

impl ApiError {
    /// 408 with the error body, and the connection closed (SPEC 11 r2).
    pub fn request_timeout(self) -> axum::response::Response {
        use axum::response::IntoResponse;
        let mut response = self
            .with_status(StatusCode::REQUEST_TIMEOUT)
            .into_response();
        response.headers_mut().insert(
            axum::http::header::CONNECTION,
            axum::http::HeaderValue::from_static("close"),
        );
        response
    }
}

/// A control-API body, read within `limits.max_body_bytes` (413 with the API's error shape beyond it)
/// and `limits.body_read_timeout_secs` (408).
pub struct ControlBody(pub axum::body::Bytes);

impl axum::extract::FromRequest<AppState> for ControlBody {
    type Rejection = axum::response::Response;

    async fn from_request(
        request: axum::extract::Request,
        AppState(gw): &AppState,
    ) -> Result<Self, axum::response::Response> {
        use axum::response::IntoResponse;
        let limits = &gw.config().limits;
        let timeout = std::time::Duration::from_secs(limits.body_read_timeout_secs);
        match read_body(request.into_body(), limits.max_body_bytes, timeout).await {
            Ok(bytes) => Ok(ControlBody(bytes)),
            Err(BodyError::TooLarge) => Err(ApiError::new(
                Code::InvalidRequest,
                format!("the body is larger than {} bytes", limits.max_body_bytes),
            )
            .with_status(StatusCode::PAYLOAD_TOO_LARGE)
            .into_response()),
            Err(BodyError::TimedOut) => Err(ApiError::new(
                Code::InvalidRequest,
                "the body did not arrive within limits.body_read_timeout_secs",
            )
            .request_timeout()),
        }
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
        // Every value is an id, a name, a number or a cursor, none of which holds a control character;
        // refused here, a NUL never reaches a store that cannot hold it (PostgreSQL text).
        if value.chars().any(char::is_control) {
            return Err(ApiError::new(
                Code::InvalidRequest,
                format!("query parameter {key:?} contains a control character"),
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
