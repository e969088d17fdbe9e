//! The orchestrator's session API (SPEC section 5).

use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::{json_body, ControlBody, Operator, State};
use crate::audit::{AuditEvent, EventType};
use crate::clock;
use crate::error::{ApiError, Code};
use crate::session::{self, CreateSessionRequest};

pub async fn create(
    axum::extract::State(gw): State,
    operator: Operator,
    ControlBody(body): ControlBody,
) -> Result<Response, ApiError> {
    operator.require("seal.session.create")?;
    let request: CreateSessionRequest = json_body(&body)?;
    let now = clock::now_secs();
    let new = request
        .validate(now, gw.config.sessions.max_lifetime_secs)
        .map_err(|m| ApiError::new(Code::InvalidRequest, m))?;
    if gw.contexts.get(&new.security_context).is_none() {
        return Err(ApiError::new(
            Code::InvalidRequest,
            format!(
                "security_context {:?} is not a known security context",
                new.security_context
            ),
        ));
    }
    let existing = gw
        .store
        .session_get(&new.session_id)
        .await
        .map_err(ApiError::store)?;
    if let Some(existing) = existing {
        return repeat_or_conflict(&new, &existing);
    }
    let token = match &gw.minter {
        Some(minter) => Some(
            minter
                .mint(
                    new.agent_id.as_deref().unwrap_or(&new.session_id),
                    &new.security_context,
                    &new.session_id,
                    new.workload_id.as_deref(),
                    new.expires_at,
                    now,
                )
                .map_err(|e| {
                    ApiError::new(Code::StoreUnavailable, format!("cannot mint a token: {e}"))
                })?,
        ),
        None => None,
    };
    let record = new.clone().into_record(token, clock::now_millis());
    let inserted = gw
        .store
        .session_insert(&record)
        .await
        .map_err(ApiError::store)?;
    if let Some(existing) = inserted {
        // Another registration of the same id won the race.
        return repeat_or_conflict(&new, &existing);
    }
    gw.record(
        AuditEvent::new(EventType::SessionCreated)
            .session_id(&record.session_id)
            .scp(&record.security_context)
            .actor(operator.name()),
    )
    .await?;
    Ok((
        StatusCode::CREATED,
        axum::Json(session::created_body(&record)),
    )
        .into_response())
}

fn repeat_or_conflict(
    new: &session::NewSession,
    existing: &crate::store::SessionRecord,
) -> Result<Response, ApiError> {
    if existing.revoked_at_ms.is_some() {
        return Err(ApiError::new(
            Code::Conflict,
            "this session id was revoked and is never reused",
        ));
    }
    if new.same_as(existing) {
        return Ok((StatusCode::OK, axum::Json(session::created_body(existing))).into_response());
    }
    Err(ApiError::new(
        Code::Conflict,
        "a different session is registered under this id",
    ))
}

async fn calls_allowed(gw: &crate::gateway::Gateway, session_id: &str) -> Result<u64, ApiError> {
    let key = session::budget_key(session_id);
    let count = gw.store.counter_get(&key).await.map_err(ApiError::store)?;
    Ok(count.unwrap_or(0).max(0) as u64)
}

pub async fn read(
    axum::extract::State(gw): State,
    operator: Operator,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    operator.require("seal.session.read")?;
    let record = gw
        .store
        .session_get(&id)
        .await
        .map_err(ApiError::store)?
        .ok_or_else(|| ApiError::new(Code::NotFound, format!("no session {id:?}")))?;
    let calls = calls_allowed(&gw, &id).await?;
    Ok(axum::Json(session::describe(&record, clock::now_secs(), calls)).into_response())
}

pub async fn revoke(
    axum::extract::State(gw): State,
    operator: Operator,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    operator.require("seal.session.revoke")?;
    loop {
        let record = gw
            .store
            .session_get(&id)
            .await
            .map_err(ApiError::store)?
            .ok_or_else(|| ApiError::new(Code::NotFound, format!("no session {id:?}")))?;
        if let Some(at) = record.revoked_at_ms {
            return Ok(revoked_body(&id, at));
        }
        let now_ms = clock::now_millis();
        let next = session::revoked(&record, now_ms);
        if gw
            .store
            .session_replace(&record, &next)
            .await
            .map_err(ApiError::store)?
        {
            // The very next call reads the revoked record (SPEC 5: refused from this moment).
            gw.sessions.invalidate(&id);
            gw.record(
                AuditEvent::new(EventType::SessionRevoked)
                    .session_id(&id)
                    .actor(operator.name()),
            )
            .await?;
            return Ok(revoked_body(&id, now_ms));
        }
    }
}

fn revoked_body(id: &str, at_ms: i64) -> Response {
    axum::Json(
        json!({"session_id": id, "status": "revoked", "revoked_at": clock::rfc3339_millis(at_ms)}),
    )
    .into_response()
}
