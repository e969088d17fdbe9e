//! Claims over the API (SPEC 7.4): reconciliation of PENDING claims, and the standalone SafeAgent-style
//! endpoints (`/claim`, `/settle/{id}`, `/audit`) for services that guard their own side effects.

use axum::extract::{Path, RawQuery};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{json_body, limit_param, query_params, ControlBody, Operator, State};
use crate::audit::{AuditEvent, EventType};
use crate::claim::{self, ManualOutcome, SettleError, Taken};
use crate::error::{ApiError, Code};
use crate::store::{ClaimCursor, ClaimKind, ClaimOutcome, ClaimRecord, ClaimStatus};

/// A claim as the API shows it.
fn claim_json(record: &ClaimRecord) -> Value {
    let mut view = Map::new();
    view.insert("kind".into(), json!(record.kind.as_str()));
    view.insert("request_id".into(), json!(record.request_id));
    view.insert("action".into(), json!(record.action));
    view.insert("agent_id".into(), json!(record.agent_id));
    if let Some(session_id) = &record.session_id {
        view.insert("session_id".into(), json!(session_id));
    }
    view.insert("status".into(), json!(record.status.as_str()));
    view.insert("claimed_at".into(), json!(record.claimed_at));
    view.insert("action_ref".into(), json!(record.action_ref));
    if let Some(at) = &record.committed_at {
        view.insert("committed_at".into(), json!(at));
    }
    match &record.outcome {
        Some(ClaimOutcome::Answer { response }) => {
            view.insert("result".into(), response.clone());
        }
        Some(ClaimOutcome::Settled { result }) => {
            view.insert("result".into(), result.clone());
        }
        Some(ClaimOutcome::ResponseTooLarge { limit }) => {
            view.insert(
                "result".into(),
                json!({"withheld": "response_too_large", "limit": limit}),
            );
        }
        None => {}
    }
    if let Some(resolution) = &record.resolution {
        view.insert(
            "resolution".into(),
            serde_json::to_value(resolution).unwrap_or(Value::Null),
        );
    }
    Value::Object(view)
}

/// The audit event of an operator's step on a claim: who did it, to which claim, with what outcome.
fn claim_event(
    kind: EventType,
    record: &ClaimRecord,
    outcome: &str,
    operator: &Operator,
) -> AuditEvent {
    let mut event = AuditEvent::new(kind)
        .request_id(&record.request_id)
        .tool(&record.action)
        .sub(&record.agent_id)
        .claim(outcome)
        .action_ref(&record.action_ref)
        .actor(operator.name());
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

pub async fn list(
    axum::extract::State(gw): State,
    operator: Operator,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    operator.require("seal.claim.read")?;
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
    let (items, more) = gw
        .store
        .claim_page(cursor.as_ref(), limit, &|c| filter.matches(c))
        .await
        .map_err(ApiError::store)?;
    let next_cursor = if more {
        items.last().map(format_cursor)
    } else {
        None
    };
    Ok(axum::Json(json!({"items": items.iter().map(claim_json).collect::<Vec<_>>(), "next_cursor": next_cursor})).into_response())
}

async fn get_claim(
    gw: &crate::gateway::Gateway,
    request_id: &str,
) -> Result<ClaimRecord, ApiError> {
    gw.store
        .claim_get(ClaimKind::Invoke, request_id)
        .await
        .map_err(ApiError::store)?
        .ok_or_else(|| ApiError::new(Code::NotFound, format!("no claim {request_id:?}")))
}

pub async fn read(
    axum::extract::State(gw): State,
    operator: Operator,
    Path(request_id): Path<String>,
) -> Result<Response, ApiError> {
    operator.require("seal.claim.read")?;
    Ok(axum::Json(claim_json(&get_claim(&gw, &request_id).await?)).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveRequest {
    outcome: String,
    result: Option<Value>,
    evidence: Option<String>,
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
        SettleError::NotFound => ApiError::new(Code::NotFound, format!("no claim {request_id:?}")),
        SettleError::NotPending(record) => ApiError::new(
            Code::Conflict,
            format!(
                "claim {request_id:?} is {}, only a PENDING claim can be resolved",
                record.status.as_str()
            ),
        ),
        SettleError::Store(e) => ApiError::store(e),
    }
}

pub async fn resolve(
    axum::extract::State(gw): State,
    operator: Operator,
    Path(request_id): Path<String>,
    ControlBody(body): ControlBody,
) -> Result<Response, ApiError> {
    operator.require("seal.claim.resolve")?;
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
    let actor = operator.name().to_string();
    let resolved = claim::resolve(
        gw.store.as_ref(),
        &request_id,
        outcome,
        &actor,
        request.evidence.clone(),
    )
    .await
    .map_err(|e| settle_error(e, &request_id))?;
    let (next, previous) = resolved;
    let mut event = claim_event(EventType::ClaimResolved, &previous, label, &operator);
    if let Some(evidence) = &request.evidence {
        event = event.detail(evidence);
    }
    gw.record(event).await?;
    let body = match next {
        Some(record) => claim_json(&record),
        None => json!({"request_id": request_id, "status": "RELEASED"}),
    };
    Ok(axum::Json(body).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StandaloneClaim {
    request_id: String,
    action: String,
    agent_id: Option<String>,
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

pub async fn standalone_claim(
    axum::extract::State(gw): State,
    operator: Operator,
    ControlBody(body): ControlBody,
) -> Result<Response, ApiError> {
    operator.require("seal.claim.resolve")?;
    let request: StandaloneClaim = json_body(&body)?;
    bounded("request_id", &request.request_id)?;
    bounded("action", &request.action)?;
    let agent = request
        .agent_id
        .unwrap_or_else(|| operator.name().to_string());
    bounded("agent_id", &agent)?;
    let record = claim::new_pending(
        ClaimKind::Standalone,
        &request.request_id,
        &request.action,
        &agent,
        None,
        None,
    );
    let taken = claim::take(gw.store.as_ref(), record)
        .await
        .map_err(ApiError::store)?;
    let (status, existing) = match &taken {
        Taken::Proceed(record) => {
            gw.record(claim_event(
                EventType::ClaimTaken,
                record,
                "PROCEED",
                &operator,
            ))
            .await?;
            ("PROCEED", None)
        }
        // SafeAgent's clients return `existing` as the action's outcome: exactly what was settled.
        Taken::Skip(record) => match &record.outcome {
            Some(ClaimOutcome::Settled { result }) => ("SKIP", Some(result.clone())),
            _ => ("SKIP", None),
        },
        Taken::Pending(_) | Taken::OtherCall(_) => ("PENDING", None),
    };
    let mut body = json!({"status": status, "request_id": request.request_id});
    if let (Some(existing), Some(obj)) = (existing, body.as_object_mut()) {
        obj.insert("existing".into(), existing);
    }
    Ok(axum::Json(body).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SettleRequest {
    result: Value,
}

pub async fn settle(
    axum::extract::State(gw): State,
    operator: Operator,
    Path(request_id): Path<String>,
    ControlBody(body): ControlBody,
) -> Result<Response, ApiError> {
    operator.require("seal.claim.resolve")?;
    let request: SettleRequest = json_body(&body)?;
    let settled = claim::settle(gw.store.as_ref(), &request_id, request.result)
        .await
        .map_err(|e| settle_error(e, &request_id))?;
    let status = match settled {
        Some(record) => {
            gw.record(claim_event(
                EventType::ClaimSettled,
                &record,
                "COMMITTED",
                &operator,
            ))
            .await?;
            "committed"
        }
        // The first result stands; nothing changed, so nothing is recorded.
        None => "already_committed",
    };
    Ok(axum::Json(json!({"status": status, "request_id": request_id})).into_response())
}

/// `GET /audit`: claim records, newest first, with offset paging and a total.
pub async fn standalone_audit(
    axum::extract::State(gw): State,
    operator: Operator,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    operator.require("seal.claim.resolve")?;
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
    let (matching, _) = gw
        .store
        .claim_page(None, usize::MAX, &|c| filter.matches(c))
        .await
        .map_err(ApiError::store)?;
    let total = matching.len();
    let items: Vec<Value> = matching
        .iter()
        .skip(offset)
        .take(limit)
        .map(claim_json)
        .collect();
    Ok(
        axum::Json(json!({"items": items, "total": total, "limit": limit, "offset": offset}))
            .into_response(),
    )
}
