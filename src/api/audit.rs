//! `GET /v1/audit` (SPEC 9.3): the trail, newest first, with filters and a cursor.

use crate::identity::{scopes, Caller};
use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};

use crate::audit::{AuditLog, AuditQuery};
use crate::error::{ApiError, Code};

/// A page of audit events, newest first (what `crate::audit::AuditPage` serialises to).
#[derive(utoipa::ToSchema)]
#[allow(dead_code)] // Documents the answer; the handler serialises `AuditPage`.
struct AuditPageDoc {
    /// Events as recorded (SPEC 9.1).
    items: Vec<serde_json::Map<String, serde_json::Value>>,
    /// Pass as `cursor` for the next page; null when no older events are left.
    next_cursor: Option<String>,
}

/// The filters of `GET /v1/audit` (SPEC 9.3); every one given must hold.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)] // Documents the query; `AuditQuery::from_pairs` reads it.
struct AuditParams {
    /// An event type, e.g. `ToolCallCompleted`.
    r#type: Option<String>,
    session_id: Option<String>,
    /// The agent (token `sub`).
    sub: Option<String>,
    tool: Option<String>,
    /// `allow` or `deny`.
    decision: Option<String>,
    /// A SPEC error code, e.g. 2002.
    code: Option<u16>,
    /// RFC 3339 or Unix seconds.
    from: Option<String>,
    /// RFC 3339 or Unix seconds.
    to: Option<String>,
    /// 1–1000, 100 by default.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u64>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
}

/// Queries the audit trail, newest first.
#[utoipa::path(get, path = "/v1/audit", operation_id = "query_audit", tag = "audit",
    params(AuditParams),
    security(("operator" = ["seal.audit.read"])),
    responses((status = 200, description = "A page of events", body = AuditPageDoc)))]
pub async fn query(
    State(audit): State<AuditLog>,
    caller: Caller,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let teams = caller.require_some(scopes::AUDIT_READ)?;
    // The audit query itself refuses unknown, repeated and empty parameters.
    let pairs: Vec<(String, String)> =
        url::form_urlencoded::parse(raw.unwrap_or_default().as_bytes())
            .into_owned()
            .collect();
    let mut query = AuditQuery::from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))?;
    query.teams = teams;
    let page = audit.query(&query).await?;
    Ok(axum::Json(page).into_response())
}

/// `GET /v1/audit/export?from_seq=` (SPEC 9.3 r2): the chain as JSON lines, oldest first, streamed,
/// ending with an `AuditCheckpoint` over the last event before it (SPEC 20 rule 7). The chain is one for
/// every team, and an export with events left out would no longer verify, so it needs the read scope on
/// every team (SPEC 16); a team-bound auditor queries `GET /v1/audit`, which holds their teams' events.
#[utoipa::path(get, path = "/v1/audit/export", operation_id = "export_audit", tag = "audit",
    params(("from_seq" = Option<u64>, Query, description = "The first seq to send; 1 by default")),
    security(("operator" = ["seal.audit.read"])),
    responses((status = 200, description = "One event per line, in chain order", content_type = "application/x-ndjson", body = String)))]
pub async fn export(
    State(audit): State<AuditLog>,
    caller: Caller,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    caller.require_everywhere(scopes::AUDIT_READ)?;
    let params = super::query_params(raw.as_deref(), &["from_seq"])?;
    let from_seq = from_seq_param(&params)?;
    // Ends with a checkpoint signed now, so that the export verifies at any moment (SPEC 20 rule 7).
    let through_seq = audit.sign_head().await;
    let export = audit.export(from_seq, through_seq);
    let lines = futures_util::stream::unfold(export, |mut rx| async move {
        rx.recv().await.map(|line| (line, rx))
    });
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/x-ndjson")],
        axum::body::Body::from_stream(lines),
    )
        .into_response())
}

/// `GET /v1/audit/checkpoints?from_seq=&limit=&cursor=` (SPEC 14): the signed checkpoints of the chain,
/// newest first, down to `from_seq`. Like the export, they belong to the whole chain: the read scope on
/// every team.
#[utoipa::path(get, path = "/v1/audit/checkpoints", operation_id = "audit_checkpoints", tag = "audit",
    params(
        ("from_seq" = Option<u64>, Query, description = "List checkpoints at or after this seq; 1 by default"),
        ("limit" = Option<u64>, Query, description = "1–1000, 100 by default"),
        ("cursor" = Option<String>, Query, description = "`next_cursor` of the previous page"),
    ),
    security(("operator" = ["seal.audit.read"])),
    responses((status = 200, description = "A page of AuditCheckpoint events", body = AuditPageDoc)))]
pub async fn checkpoints(
    State(audit): State<AuditLog>,
    caller: Caller,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    caller.require_everywhere(scopes::AUDIT_READ)?;
    let params = super::query_params(raw.as_deref(), &["from_seq", "limit", "cursor"])?;
    let query = AuditQuery {
        r#type: Some(crate::audit::EventType::AuditCheckpoint),
        min_seq: Some(from_seq_param(&params)?),
        limit: super::limit_param(&params, crate::audit::DEFAULT_LIMIT)?,
        cursor: params.get("cursor").cloned(),
        ..AuditQuery::default()
    };
    query.validate()?;
    let page = audit.query(&query).await?;
    Ok(axum::Json(page).into_response())
}

/// The `from_seq` query parameter of the export and the checkpoint listing; 1 when absent.
fn from_seq_param(params: &std::collections::HashMap<String, String>) -> Result<u64, ApiError> {
    params.get("from_seq").map_or(Ok(1), |raw| {
        raw.parse::<u64>().map_err(|_| {
            ApiError::new(
                Code::InvalidRequest,
                "from_seq must be a non-negative integer",
            )
        })
    })
}
