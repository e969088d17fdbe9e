//! Claims over the API (SPEC 7.4): reconciliation of PENDING claims, and the standalone SafeAgent-style
//! endpoints (`/claim`, `/settle/{id}`, `/audit`) for services that guard their own side effects.

use crate::identity::{
    is_team_name, scopes, Caller, TeamFilter, DEFAULT_TEAM, MAX_TEAM_NAME_BYTES,
};
use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{json_body, limit_param, query_params, ApiPath, ControlBody};
use crate::audit::{AuditEvent, AuditLog, EventType};
use crate::claim::{self, ManualOutcome, SettleError, Taken};
use crate::error::{ApiError, Code};
use crate::store::{
    ClaimCursor, ClaimKind, ClaimOutcome, ClaimRecord, ClaimStatus, Resolution, Store,
};

/// A claim as the API shows it.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ClaimView {
    kind: ClaimKind,
    request_id: String,
    /// The tool name, or the standalone claim's action.
    action: String,
    agent_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    session_id: Option<String>,
    /// Its session's team, or the team a standalone claim was taken in (SPEC 16).
    team: String,
    status: ClaimStatus,
    /// RFC 3339 with milliseconds.
    claimed_at: String,
    action_ref: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    committed_at: Option<String>,
    /// The tool's JSON-RPC answer, the settled result, or a `withheld` marker.
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    resolution: Option<Resolution>,
}

fn claim_json(record: &ClaimRecord) -> ClaimView {
    ClaimView {
        kind: record.kind,
        request_id: record.request_id.clone(),
        action: record.action.clone(),
        agent_id: record.agent_id.clone(),
        session_id: record.session_id.clone(),
        team: record.team.clone(),
        status: record.status,
        claimed_at: record.claimed_at.clone(),
        action_ref: record.action_ref.clone(),
        committed_at: record.committed_at.clone(),
        result: match &record.outcome {
            Some(ClaimOutcome::Answer { response }) => Some(response.clone()),
            Some(ClaimOutcome::Settled { result }) => Some(result.clone()),
            Some(ClaimOutcome::ResponseTooLarge { limit }) => {
                Some(json!({"withheld": "response_too_large", "limit": limit}))
            }
            Some(ClaimOutcome::AnswerWithheld { kinds }) => {
                Some(json!({"withheld": "answer_guard", "kinds": kinds}))
            }
            None => None,
        },
        resolution: record.resolution.clone(),
    }
}

/// The audit event of an operator's step on a claim: who did it, to which claim, with what outcome.
fn claim_event(
    kind: EventType,
    record: &ClaimRecord,
    outcome: &str,
    caller: &Caller,
) -> AuditEvent {
    let mut event = AuditEvent::new(kind)
        .request_id(&record.request_id)
        .action(&record.action)
        .tool(&record.action)
        .sub(&record.agent_id)
        .claim(outcome)
        .action_ref(&record.action_ref)
        .team(&record.team)
        .actor(&caller.identity, Some(&record.team));
    if let Some(session_id) = &record.session_id {
        event = event.session_id(session_id);
    }
    event
}

/// Which claims a listing shows; every criterion that is set must hold.
#[derive(Default)]
struct ClaimFilter {
    kind: Option<ClaimKind>,
    status: Option<ClaimStatus>,
    agent: Option<String>,
    action: Option<String>,
    from_secs: Option<i64>,
    to_secs: Option<i64>,
}

impl ClaimFilter {
    fn matches(&self, claim: &ClaimRecord) -> bool {
        let secs = claim.claimed_at_ms.div_euclid(1000);
        self.kind.is_none_or(|k| claim.kind == k)
            && self.status.is_none_or(|s| claim.status == s)
            && self.agent.as_ref().is_none_or(|a| *a == claim.agent_id)
            && self.action.as_ref().is_none_or(|a| *a == claim.action)
            && self.from_secs.is_none_or(|f| secs >= f)
            && self.to_secs.is_none_or(|t| secs <= t)
    }
}

fn status_param(raw: Option<&String>) -> Result<Option<ClaimStatus>, ApiError> {
    match raw.map(String::as_str) {
        None => Ok(None),
        Some("PENDING") => Ok(Some(ClaimStatus::Pending)),
        Some("COMMITTED") => Ok(Some(ClaimStatus::Committed)),
        Some(other) => Err(ApiError::new(
            Code::InvalidRequest,
            format!("status must be PENDING or COMMITTED, not {other:?}"),
        )),
    }
}

fn kind_param(raw: Option<&String>) -> Result<Option<ClaimKind>, ApiError> {
    match raw.map(String::as_str) {
        None => Ok(None),
        Some("invoke") => Ok(Some(ClaimKind::Invoke)),
        Some("standalone") => Ok(Some(ClaimKind::Standalone)),
        Some(_) => Err(ApiError::new(
            Code::InvalidRequest,
            "kind must be invoke or standalone",
        )),
    }
}

/// Cursor of the claim listing: "<claimed_at_ms>.<kind>.<request_id>" of the last item shown.
fn format_cursor(claim: &ClaimRecord) -> String {
    format!(
        "{}.{}.{}",
        claim.claimed_at_ms,
        claim.kind.as_str(),
        claim.request_id
    )
}

fn parse_cursor(raw: Option<&String>) -> Result<Option<ClaimCursor>, ApiError> {
    raw.map(|c| {
        let mut parts = c.splitn(3, '.');
        let cursor = (|| {
            let claimed_at_ms = parts.next()?.parse::<i64>().ok()?;
            let kind = kind_param(Some(&parts.next()?.to_string())).ok()??;
            let request_id = parts.next()?.to_string();
            Some(ClaimCursor {
                claimed_at_ms,
                kind,
                request_id,
            })
        })();
        cursor.ok_or_else(|| {
            ApiError::new(Code::InvalidRequest, "cursor is not one this API gave out")
        })
    })
    .transpose()
}

/// A page of claims, newest first.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ClaimPage {
    items: Vec<ClaimView>,
    /// Pass as `cursor` for the next page; null on the last page.
    next_cursor: Option<String>,
}

/// The filters of `GET /v1/claims`.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)] // Documents the query; the handler reads it through `query_params`.
struct ClaimListQuery {
    kind: Option<ClaimKind>,
    status: Option<ClaimStatus>,
    agent_id: Option<String>,
    tool: Option<String>,
    /// 1–1000, 100 by default.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u64>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
}

/// Lists claims, newest first (SPEC 7.4).
#[utoipa::path(get, path = "/v1/claims", operation_id = "list_claims", tag = "claims",
    params(ClaimListQuery),
    security(("operator" = ["seal.claim.read"])),
    responses((status = 200, description = "A page of claims", body = ClaimPage)))]
pub async fn list(
    State(store): State<Arc<dyn Store>>,
    caller: Caller,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let teams = caller.require_some(scopes::CLAIM_READ)?;
    let params = query_params(
        raw.as_deref(),
        &["kind", "status", "agent_id", "tool", "limit", "cursor"],
    )?;
    let filter = ClaimFilter {
        kind: kind_param(params.get("kind"))?,
        status: status_param(params.get("status"))?,
        agent: params.get("agent_id").cloned(),
        action: params.get("tool").cloned(),
        ..ClaimFilter::default()
    };
    let limit = limit_param(&params, 100)?;
    let cursor = parse_cursor(params.get("cursor"))?;
    let (items, more) = store
        .claim_page(cursor.as_ref(), limit, &|c| {
            teams.admits(&c.team) && filter.matches(c)
        })
        .await
        .map_err(ApiError::store)?;
    let next_cursor = if more {
        items.last().map(format_cursor)
    } else {
        None
    };
    Ok(axum::Json(ClaimPage {
        items: items.iter().map(claim_json).collect(),
        next_cursor,
    })
    .into_response())
}

fn not_found(request_id: &str) -> ApiError {
    ApiError::new(Code::NotFound, format!("no claim {request_id:?}"))
}

/// The claim `request_id` of `kind`, for doing `scope` to it: another team's claim is not found (SPEC
/// 16), like a missing one.
async fn find(
    store: &dyn Store,
    caller: &Caller,
    kind: ClaimKind,
    request_id: &str,
    scope: &str,
) -> Result<ClaimRecord, ApiError> {
    let record = store
        .claim_get(kind, request_id)
        .await
        .map_err(ApiError::store)?
        .ok_or_else(|| not_found(request_id))?;
    caller.require_visible(&record.team, scopes::CLAIM_READ, scope, || {
        not_found(request_id)
    })?;
    Ok(record)
}

/// Reads one claim taken by `/v1/invoke`.
#[utoipa::path(get, path = "/v1/claims/{request_id}", operation_id = "read_claim", tag = "claims",
    params(("request_id" = String, Path, description = "The claim's request id")),
    security(("operator" = ["seal.claim.read"])),
    responses((status = 200, description = "The claim", body = ClaimView)))]
pub async fn read(
    State(store): State<Arc<dyn Store>>,
    caller: Caller,
    ApiPath(request_id): ApiPath<String>,
) -> Result<Response, ApiError> {
    caller.require_some(scopes::CLAIM_READ)?;
    let record = find(
        store.as_ref(),
        &caller,
        ClaimKind::Invoke,
        &request_id,
        scopes::CLAIM_READ,
    )
    .await?;
    Ok(axum::Json(claim_json(&record)).into_response())
}

/// How an operator settles a PENDING claim.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResolveRequest {
    /// `committed` (with `result`) or `released` (without).
    #[schema(pattern = "^(committed|released)$")]
    outcome: String,
    /// A JSON-RPC response object: exactly one of `result` or `error`.
    #[schema(value_type = Option<Object>)]
    result: Option<Value>,
    /// Why: recorded in the audit event.
    evidence: Option<String>,
}

/// What a resolution left: the committed claim, or the marker of a released one.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum Resolved {
    Committed(Box<ClaimView>),
    Released {
        request_id: String,
        /// Always `RELEASED`.
        status: &'static str,
    },
}

/// A stored answer must be a JSON-RPC response object: `result` or `error`, not both.
fn check_jsonrpc_response(result: &Value) -> Result<Value, ApiError> {
    let obj = result.as_object().ok_or_else(|| {
        ApiError::new(
            Code::InvalidRequest,
            "result must be a JSON-RPC response object",
        )
    })?;
    if obj.contains_key("result") == obj.contains_key("error") {
        return Err(ApiError::new(
            Code::InvalidRequest,
            "result must hold exactly one of `result` or `error`",
        ));
    }
    let mut response = obj.clone();
    response.insert("jsonrpc".into(), json!("2.0"));
    response.entry("id").or_insert(Value::Null);
    Ok(Value::Object(response))
}

fn settle_error(err: SettleError, request_id: &str) -> ApiError {
    match err {
        SettleError::NotFound => not_found(request_id),
        SettleError::NotPending(record) => ApiError::new(
            Code::Conflict,
            format!(
                "claim {request_id:?} is {}, only a PENDING claim can be resolved",
                record.status.as_str()
            ),
        ),
        SettleError::NotTaker => ApiError::new(
            Code::OperatorForbidden,
            format!("claim {request_id:?} was taken by another operator; only they settle it"),
        ),
        SettleError::Store(e) => ApiError::store(e),
    }
}

/// Settles a PENDING claim by hand (SPEC 7.4): committed with the tool's answer, or released.
#[utoipa::path(post, path = "/v1/claims/{request_id}/resolve", operation_id = "resolve_claim", tag = "claims",
    params(("request_id" = String, Path, description = "The claim's request id")),
    request_body = ResolveRequest,
    security(("operator" = ["seal.claim.resolve"])),
    responses(
        (status = 200, description = "Resolved", body = Resolved),
        (status = 409, description = "The claim is not PENDING", body = super::openapi::ErrorBody),
    ))]
pub async fn resolve(
    State(store): State<Arc<dyn Store>>,
    State(audit): State<AuditLog>,
    caller: Caller,
    ApiPath(request_id): ApiPath<String>,
    ControlBody(body): ControlBody,
) -> Result<Response, ApiError> {
    caller.require_some(scopes::CLAIM_RESOLVE)?;
    // A claim keeps its team for life: checked once, before the resolution.
    find(
        store.as_ref(),
        &caller,
        ClaimKind::Invoke,
        &request_id,
        scopes::CLAIM_RESOLVE,
    )
    .await?;
    let request: ResolveRequest = json_body(&body)?;
    let outcome = match (request.outcome.as_str(), request.result) {
        ("committed", Some(result)) => ManualOutcome::Committed(check_jsonrpc_response(&result)?),
        ("committed", None) => {
            return Err(ApiError::new(
                Code::InvalidRequest,
                "result is required to commit",
            ))
        }
        ("released", None) => ManualOutcome::Released,
        ("released", Some(_)) => {
            return Err(ApiError::new(
                Code::InvalidRequest,
                "result is not taken when releasing",
            ))
        }
        (other, _) => {
            return Err(ApiError::new(
                Code::InvalidRequest,
                format!("outcome must be committed or released, not {other:?}"),
            ))
        }
    };
    let label = match outcome {
        ManualOutcome::Committed(_) => "committed",
        ManualOutcome::Released => "released",
    };
    let actor = caller.sub().to_string();
    let resolved = claim::resolve(
        store.as_ref(),
        &request_id,
        outcome,
        &actor,
        request.evidence.clone(),
    )
    .await
    .map_err(|e| settle_error(e, &request_id))?;
    let (next, previous) = resolved;
    let mut event = claim_event(EventType::ClaimResolved, &previous, label, &caller);
    if let Some(evidence) = &request.evidence {
        event = event.detail(evidence);
    }
    audit.record(event).await?;
    let body = match next {
        Some(record) => Resolved::Committed(Box::new(claim_json(&record))),
        None => Resolved::Released {
            request_id,
            status: "RELEASED",
        },
    };
    Ok(axum::Json(body).into_response())
}

/// A standalone claim on an action a service guards itself.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StandaloneClaim {
    /// 1–256 bytes without control characters.
    #[schema(min_length = 1, max_length = 256)]
    request_id: String,
    #[schema(min_length = 1, max_length = 256)]
    action: String,
    /// The operator's name when absent.
    #[schema(min_length = 1, max_length = 256)]
    agent_id: Option<String>,
    /// The team the claim belongs to (SPEC 16); needed only when the token holds `seal.claim.resolve`
    /// bound to several teams. It must be one of them.
    team: Option<String>,
}

/// What taking a standalone claim found.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ClaimTaken {
    /// `PROCEED` (do the action, then settle), `SKIP` (done before: `existing` is its result) or
    /// `PENDING` (in flight or unknown).
    status: &'static str,
    request_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    existing: Option<Value>,
}

fn bounded(field: &str, value: &str) -> Result<(), ApiError> {
    if value.is_empty() || value.len() > 256 || value.chars().any(char::is_control) {
        return Err(ApiError::new(
            Code::InvalidRequest,
            format!("{field} must be 1–256 bytes without control characters"),
        ));
    }
    Ok(())
}

/// The team of a standalone claim (SPEC 16): the one the body names, which the caller must hold
/// `seal.claim.resolve` for; else the one team that scope is bound to; else `default` when it is
/// unbound. A scope bound to several teams must name one: the gateway never picks for the caller.
fn standalone_team(caller: &Caller, named: Option<String>) -> Result<String, ApiError> {
    if let Some(team) = named {
        if !is_team_name(&team) {
            return Err(ApiError::new(
                Code::InvalidRequest,
                format!(
                    "team: {team:?} is not a team name (1 to {MAX_TEAM_NAME_BYTES} letters, digits, \
                     '-', '_')"
                ),
            ));
        }
        caller.require(&team, scopes::CLAIM_RESOLVE)?;
        return Ok(team);
    }
    match caller.teams_with(scopes::CLAIM_RESOLVE) {
        TeamFilter::Every => Ok(DEFAULT_TEAM.to_owned()),
        TeamFilter::Only(teams) => match teams.iter().collect::<Vec<_>>().as_slice() {
            [one] => Ok((*one).clone()),
            several => Err(ApiError::new(
                Code::InvalidRequest,
                format!(
                    "team is required: the token holds {} for teams {}; name one",
                    scopes::CLAIM_RESOLVE,
                    several
                        .iter()
                        .map(|t| t.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )),
        },
    }
}

/// Takes a standalone claim (SafeAgent-style): PROCEED, SKIP with the settled result, or PENDING.
#[utoipa::path(post, path = "/claim", operation_id = "take_standalone_claim", tag = "claims",
    request_body = StandaloneClaim,
    security(("operator" = ["seal.claim.resolve"])),
    responses((status = 200, description = "What the claim found", body = ClaimTaken)))]
pub async fn standalone_claim(
    State(store): State<Arc<dyn Store>>,
    State(audit): State<AuditLog>,
    caller: Caller,
    ControlBody(body): ControlBody,
) -> Result<Response, ApiError> {
    caller.require_some(scopes::CLAIM_RESOLVE)?;
    let request: StandaloneClaim = json_body(&body)?;
    bounded("request_id", &request.request_id)?;
    bounded("action", &request.action)?;
    let agent = request.agent_id.unwrap_or_else(|| caller.sub().to_string());
    bounded("agent_id", &agent)?;
    let team = standalone_team(&caller, request.team)?;
    let mut record = claim::new_pending(
        ClaimKind::Standalone,
        &request.request_id,
        &request.action,
        &agent,
        None,
        Some(claim::standalone_digest(&request.action)),
        &team,
    );
    record.taker = Some((&caller.identity).into());
    let taken = claim::take(store.as_ref(), record)
        .await
        .map_err(ApiError::store)?;
    let (status, existing) = match &taken {
        Taken::Proceed(record) => {
            audit
                .record(claim_event(
                    EventType::ClaimTaken,
                    record,
                    "PROCEED",
                    &caller,
                ))
                .await?;
            ("PROCEED", None)
        }
        // SafeAgent's clients return `existing` as the action's outcome: exactly what was settled.
        Taken::Skip(record) => match &record.outcome {
            Some(ClaimOutcome::Settled { result }) => ("SKIP", Some(result.clone())),
            _ => ("SKIP", None),
        },
        Taken::Pending(_) => ("PENDING", None),
        // Bound to its action (SPEC 7.4 r3) and team (SPEC 16): the other claim is never shown.
        Taken::OtherCall(_) => {
            return Err(ApiError::new(
                Code::IdempotencyKeyReused,
                format!(
                    "request id {:?} is taken by a claim for another action or team",
                    request.request_id
                ),
            ))
        }
    };
    Ok(axum::Json(ClaimTaken {
        status,
        request_id: request.request_id,
        existing,
    })
    .into_response())
}

/// The result of a standalone action.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SettleRequest {
    /// Kept as given; later SKIPs return it as `existing`.
    result: Value,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct Settled {
    /// `committed`, or `already_committed` (the first result stands).
    status: &'static str,
    request_id: String,
}

/// Settles a standalone claim with the action's result.
#[utoipa::path(post, path = "/settle/{request_id}", operation_id = "settle_standalone_claim", tag = "claims",
    params(("request_id" = String, Path, description = "The claim's request id")),
    request_body = SettleRequest,
    security(("operator" = ["seal.claim.resolve"])),
    responses(
        (status = 200, description = "Settled", body = Settled),
        (status = 409, description = "The claim changed meanwhile and is not PENDING", body = super::openapi::ErrorBody),
    ))]
pub async fn settle(
    State(store): State<Arc<dyn Store>>,
    State(audit): State<AuditLog>,
    caller: Caller,
    ApiPath(request_id): ApiPath<String>,
    ControlBody(body): ControlBody,
) -> Result<Response, ApiError> {
    caller.require_some(scopes::CLAIM_RESOLVE)?;
    find(
        store.as_ref(),
        &caller,
        ClaimKind::Standalone,
        &request_id,
        scopes::CLAIM_RESOLVE,
    )
    .await?;
    let request: SettleRequest = json_body(&body)?;
    let settler = claim::Settler {
        identity: &caller.identity,
        admin: caller.is_admin(),
    };
    let settled = claim::settle(store.as_ref(), &request_id, request.result, &settler)
        .await
        .map_err(|e| settle_error(e, &request_id))?;
    let status = match settled {
        Some(record) => {
            audit
                .record(claim_event(
                    EventType::ClaimSettled,
                    &record,
                    "COMMITTED",
                    &caller,
                ))
                .await?;
            "committed"
        }
        // The first result stands; nothing changed, so nothing is recorded.
        None => "already_committed",
    };
    Ok(axum::Json(Settled { status, request_id }).into_response())
}

/// A page of `GET /audit`.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ClaimAuditPage {
    items: Vec<ClaimView>,
    /// How many claims match.
    total: usize,
    limit: usize,
    offset: usize,
}

/// The filters of `GET /audit`.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)] // Documents the query; the handler reads it through `query_params`.
struct ClaimAuditQuery {
    agent_id: Option<String>,
    action: Option<String>,
    /// `pending` or `committed`, any case.
    status: Option<String>,
    /// Unix seconds.
    from_ts: Option<i64>,
    /// Unix seconds.
    to_ts: Option<i64>,
    /// 1–1000, 100 by default.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u64>,
    #[param(minimum = 0)]
    offset: Option<u64>,
}

/// `GET /audit`: claim records, newest first, with offset paging and a total.
#[utoipa::path(get, path = "/audit", operation_id = "list_standalone_claims", tag = "claims",
    params(ClaimAuditQuery),
    security(("operator" = ["seal.claim.resolve"])),
    responses((status = 200, description = "Matching claims", body = ClaimAuditPage)))]
pub async fn standalone_audit(
    State(store): State<Arc<dyn Store>>,
    caller: Caller,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let teams = caller.require_some(scopes::CLAIM_RESOLVE)?;
    let params = query_params(
        raw.as_deref(),
        &[
            "agent_id", "action", "status", "from_ts", "to_ts", "limit", "offset",
        ],
    )?;
    let limit = limit_param(&params, 100)?;
    let number = |name: &str| -> Result<Option<i64>, ApiError> {
        params
            .get(name)
            .map(|v| {
                v.parse::<i64>().map_err(|_| {
                    ApiError::new(Code::InvalidRequest, format!("{name} must be an integer"))
                })
            })
            .transpose()
    };
    let offset = number("offset")?.unwrap_or(0);
    if offset < 0 {
        return Err(ApiError::new(
            Code::InvalidRequest,
            "offset must not be negative",
        ));
    }
    let (from, to) = (number("from_ts")?, number("to_ts")?);
    let status = match params.get("status").map(|s| s.to_ascii_uppercase()) {
        None => None,
        Some(s) => status_param(Some(&s))?,
    };
    let filter = ClaimFilter {
        kind: None,
        status,
        agent: params.get("agent_id").cloned(),
        action: params.get("action").cloned(),
        from_secs: from,
        to_secs: to,
    };
    let offset = offset as usize;
    let (matching, _) = store
        .claim_page(None, usize::MAX, &|c| {
            teams.admits(&c.team) && filter.matches(c)
        })
        .await
        .map_err(ApiError::store)?;
    let total = matching.len();
    let items = matching
        .iter()
        .skip(offset)
        .take(limit)
        .map(claim_json)
        .collect();
    Ok(axum::Json(ClaimAuditPage {
        items,
        total,
        limit,
        offset,
    })
    .into_response())
}
