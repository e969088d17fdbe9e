//! Approval requests over the API (SPEC 13): list and read them with their arguments, grant or deny
//! the pending ones. The state machine lives in `crate::approval`.

use crate::identity::Caller;
use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{json_body, limit_param, query_params, ApiPath, ControlBody};
use crate::approval::{self, DecideError, Desk};
use crate::clock::rfc3339_millis;
use crate::error::{ApiError, Code};
use crate::identity::Identity;
use crate::store::{ApprovalCursor, ApprovalRecord, ApprovalStatus, RecordedIdentity};
use crate::token::scopes;

/// Longest `reason`, in characters: it is written into the audit chain.
const MAX_REASON_CHARS: usize = 1000;

/// An approval request as the API shows it (SPEC 13's record).
#[derive(Serialize, utoipa::ToSchema)]
pub struct ApprovalView {
    approval_id: String,
    status: ApprovalStatus,
    session_id: String,
    sub: String,
    tool: String,
    /// The call's arguments, so that the person deciding sees what it would do.
    #[schema(value_type = Object)]
    arguments: Map<String, Value>,
    call_digest: String,
    context: String,
    context_version: String,
    /// Its session's team (SPEC 16).
    team: String,
    /// RFC 3339 with milliseconds, like every time here.
    requested_at: String,
    /// The end of the wait for a decision; after one, the end of its force.
    expires_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    decided_at: Option<String>,
    /// Who decided: the last grant that granted it, or the person who denied it.
    #[serde(skip_serializing_if = "Option::is_none")]
    decided_by: Option<Identity>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    /// How many distinct people must grant it (SPEC 13 r4), fixed when the request was made.
    approvers: u32,
    /// Whether the session's registrant is kept from deciding it.
    separate_from_registrant: bool,
    /// The grants so far, oldest first.
    grants: Vec<GrantView>,
    /// The flow rule (its index in the context's `flow_rules`) that asked for this approval (SPEC 19).
    #[serde(skip_serializing_if = "Option::is_none")]
    flow_rule: Option<usize>,
}

/// One person's grant.
#[derive(Serialize, utoipa::ToSchema)]
pub struct GrantView {
    by: Identity,
    /// RFC 3339 with milliseconds.
    at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

fn view(record: &ApprovalRecord) -> ApprovalView {
    ApprovalView {
        approval_id: record.approval_id.clone(),
        status: record.status,
        session_id: record.session_id.clone(),
        sub: record.sub.clone(),
        tool: record.tool.clone(),
        arguments: record.arguments.clone(),
        call_digest: record.call_digest.clone(),
        context: record.context.clone(),
        context_version: record.context_version.clone(),
        team: record.team.clone(),
        requested_at: rfc3339_millis(record.requested_at_ms),
        expires_at: rfc3339_millis(record.expires_at_ms),
        decided_at: record.decided_at_ms.map(rfc3339_millis),
        decided_by: record.decided_by.as_ref().map(RecordedIdentity::identity),
        reason: record.reason.clone(),
        approvers: record.approvers,
        separate_from_registrant: record.separate_from_registrant,
        grants: record
            .grants
            .iter()
            .map(|grant| GrantView {
                by: grant.by.clone(),
                at: rfc3339_millis(grant.at_ms),
                reason: grant.reason.clone(),
            })
            .collect(),
        flow_rule: record.flow_rule,
    }
}

/// A page of approval requests, newest first.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ApprovalPage {
    items: Vec<ApprovalView>,
    /// Pass as `cursor` for the next page; null on the last page.
    next_cursor: Option<String>,
}

/// The filters of `GET /v1/approvals`.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)] // Documents the query; the handler reads it through `query_params`.
struct ApprovalListQuery {
    status: Option<ApprovalStatus>,
    session_id: Option<String>,
    tool: Option<String>,
    /// 1–1000, 100 by default.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u64>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
}

fn status_param(raw: Option<&String>) -> Result<Option<ApprovalStatus>, ApiError> {
    let Some(raw) = raw else { return Ok(None) };
    let all = [
        ApprovalStatus::Pending,
        ApprovalStatus::Granted,
        ApprovalStatus::Denied,
        ApprovalStatus::Expired,
        ApprovalStatus::Used,
    ];
    all.into_iter()
        .find(|s| s.as_str() == raw)
        .map(Some)
        .ok_or_else(|| {
            ApiError::new(
                Code::InvalidRequest,
                format!("status must be pending, granted, denied, expired or used, not {raw:?}"),
            )
        })
}

/// Cursor of the listing: "<requested_at_ms>.<approval_id>" of the last item shown.
fn parse_cursor(raw: Option<&String>) -> Result<Option<ApprovalCursor>, ApiError> {
    raw.map(|c| {
        c.split_once('.')
            .and_then(|(ms, id)| {
                Some(ApprovalCursor {
                    requested_at_ms: ms.parse().ok()?,
                    approval_id: id.to_owned(),
                })
            })
            .ok_or_else(|| {
                ApiError::new(Code::InvalidRequest, "cursor is not one this API gave out")
            })
    })
    .transpose()
}

/// Lists approval requests, newest first, arguments included (SPEC 13). Requests and grants whose time
/// ran out are expired first, so that the listing shows them as they stand.
#[utoipa::path(get, path = "/v1/approvals", operation_id = "list_approvals", tag = "approvals",
    params(ApprovalListQuery),
    security(("operator" = ["seal.approval.read"])),
    responses((status = 200, description = "A page of approval requests", body = ApprovalPage)))]
pub async fn list(
    State(desk): State<Desk>,
    caller: Caller,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let teams = caller.require_some(scopes::APPROVAL_READ)?;
    let params = query_params(
        raw.as_deref(),
        &["status", "session_id", "tool", "limit", "cursor"],
    )?;
    let status = status_param(params.get("status"))?;
    let session_id = params.get("session_id");
    let tool = params.get("tool");
    let limit = limit_param(&params, 100)?;
    let cursor = parse_cursor(params.get("cursor"))?;
    approval::sweep(&desk).await.map_err(ApiError::store)?;
    let keep = |a: &ApprovalRecord| {
        teams.admits(&a.team)
            && status.is_none_or(|s| a.status == s)
            && session_id.is_none_or(|id| *id == a.session_id)
            && tool.is_none_or(|t| *t == a.tool)
    };
    let (items, more) = desk
        .store
        .approval_page(cursor.as_ref(), limit, &keep)
        .await
        .map_err(ApiError::store)?;
    let next_cursor = if more {
        items
            .last()
            .map(|a| format!("{}.{}", a.requested_at_ms, a.approval_id))
    } else {
        None
    };
    Ok(axum::Json(ApprovalPage {
        items: items.iter().map(view).collect(),
        next_cursor,
    })
    .into_response())
}

/// Reads one approval request, arguments included.
#[utoipa::path(get, path = "/v1/approvals/{approval_id}", operation_id = "read_approval", tag = "approvals",
    params(("approval_id" = String, Path, description = "The request's id")),
    security(("operator" = ["seal.approval.read"])),
    responses(
        (status = 200, description = "The request", body = ApprovalView),
        (status = 404, description = "No such request", body = super::openapi::ErrorBody),
    ))]
pub async fn read(
    State(desk): State<Desk>,
    caller: Caller,
    ApiPath(approval_id): ApiPath<String>,
) -> Result<Response, ApiError> {
    caller.require_some(scopes::APPROVAL_READ)?;
    let record = find(&desk, &caller, &approval_id, scopes::APPROVAL_READ).await?;
    let record = approval::refresh(&desk, record)
        .await
        .map_err(ApiError::store)?;
    Ok(axum::Json(view(&record)).into_response())
}

fn not_found(approval_id: &str) -> ApiError {
    ApiError::new(
        Code::NotFound,
        format!("no approval request {approval_id:?}"),
    )
}

/// The request `approval_id`, for doing `scope` to it: another team's request is not found (SPEC 16),
/// like a missing one.
async fn find(
    desk: &Desk,
    caller: &Caller,
    approval_id: &str,
    scope: &str,
) -> Result<ApprovalRecord, ApiError> {
    let record = desk
        .store
        .approval_get(approval_id)
        .await
        .map_err(ApiError::store)?
        .ok_or_else(|| not_found(approval_id))?;
    caller.require_visible(&record.team, scopes::APPROVAL_READ, scope, || {
        not_found(approval_id)
    })?;
    Ok(record)
}

/// A decision's body: why. Required to deny, optional to grant.
#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Decision {
    /// 1–1000 characters; recorded on the request and in the audit event.
    #[schema(min_length = 1, max_length = 1000)]
    reason: Option<String>,
}

/// Grants a pending request: once `approvers` distinct people granted it, the same call from the same
/// session may run once.
#[utoipa::path(post, path = "/v1/approvals/{approval_id}/grant", operation_id = "grant_approval", tag = "approvals",
    params(("approval_id" = String, Path, description = "The request's id")),
    request_body(content = Decision, description = "Optional; an empty body is no reason"),
    security(("operator" = ["seal.approval.decide"])),
    responses(
        (status = 200, description = "The request with this grant: granted once it holds `approvers` grants, else still pending", body = ApprovalView),
        (status = 403, description = "The session's registrant may not decide (separate_from_registrant)", body = super::openapi::ErrorBody),
        (status = 404, description = "No such request", body = super::openapi::ErrorBody),
        (status = 409, description = "The request is not pending, or this person granted it already", body = super::openapi::ErrorBody),
    ))]
pub async fn grant(
    State(desk): State<Desk>,
    caller: Caller,
    ApiPath(approval_id): ApiPath<String>,
    ControlBody(body): ControlBody,
) -> Result<Response, ApiError> {
    decide(&desk, &caller, &approval_id, &body, true).await
}

/// Denies a pending request: the call gets 4004 until `expires_secs` after the decision.
#[utoipa::path(post, path = "/v1/approvals/{approval_id}/deny", operation_id = "deny_approval", tag = "approvals",
    params(("approval_id" = String, Path, description = "The request's id")),
    request_body = Decision,
    security(("operator" = ["seal.approval.decide"])),
    responses(
        (status = 200, description = "The denied request", body = ApprovalView),
        (status = 403, description = "The session's registrant may not decide (separate_from_registrant)", body = super::openapi::ErrorBody),
        (status = 404, description = "No such request", body = super::openapi::ErrorBody),
        (status = 409, description = "The request is not pending", body = super::openapi::ErrorBody),
    ))]
pub async fn deny(
    State(desk): State<Desk>,
    caller: Caller,
    ApiPath(approval_id): ApiPath<String>,
    ControlBody(body): ControlBody,
) -> Result<Response, ApiError> {
    decide(&desk, &caller, &approval_id, &body, false).await
}

async fn decide(
    desk: &Desk,
    caller: &Caller,
    approval_id: &str,
    body: &[u8],
    grant: bool,
) -> Result<Response, ApiError> {
    caller.require_some(scopes::APPROVAL_DECIDE)?;
    // A request keeps its team for life: checked once, before the decision.
    find(desk, caller, approval_id, scopes::APPROVAL_DECIDE).await?;
    let decision: Decision = if body.is_empty() && grant {
        Decision::default()
    } else {
        json_body(body)?
    };
    match &decision.reason {
        None if !grant => {
            return Err(ApiError::new(
                Code::InvalidRequest,
                "reason is required to deny",
            ))
        }
        Some(reason) if reason.trim().is_empty() || reason.chars().count() > MAX_REASON_CHARS => {
            return Err(ApiError::new(
                Code::InvalidRequest,
                format!("reason must be 1 to {MAX_REASON_CHARS} characters, not blank"),
            ))
        }
        _ => {}
    }
    let decision = approval::Decision {
        grant,
        by: &caller.identity,
        reason: decision.reason,
    };
    let decided = approval::decide(desk, approval_id, &decision)
        .await
        .map_err(|e| decide_error(e, approval_id))?;
    Ok(axum::Json(view(&decided)).into_response())
}

fn decide_error(error: DecideError, approval_id: &str) -> ApiError {
    match error {
        DecideError::NotFound => not_found(approval_id),
        DecideError::NotPending(record) => ApiError::new(
            Code::Conflict,
            format!(
                "approval request {approval_id:?} is {}; only a pending request can be decided",
                record.status.as_str()
            ),
        ),
        DecideError::AlreadyGranted => ApiError::new(
            Code::Conflict,
            format!(
                "you already granted approval request {approval_id:?}; it needs grants from \
                 distinct people"
            ),
        ),
        DecideError::Registrant(why) => ApiError::new(Code::OperatorForbidden, why),
        DecideError::Store(e) => ApiError::store(e),
    }
}
