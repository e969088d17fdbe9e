//! The orchestrator's session API (SPEC section 5).

use crate::identity::{scopes, Caller};
use std::sync::Arc;

use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::{json_body, limit_param, query_params, ApiPath, ControlBody};
use crate::audit::{AuditEvent, AuditLog, EventType};
use crate::clock;
use crate::config::Config;
use crate::error::{ApiError, Code};
use crate::policy::ContextRegistry;
use crate::session::{
    self, CreateSessionRequest, SessionCache, SessionCreated, SessionStatus, SessionView,
};
use crate::store::{SessionRecord, Store};
use crate::token::TokenMinter;

/// Registers a session (SPEC 5). The same registration again answers 200 with the same body.
#[utoipa::path(post, path = "/v1/seal/sessions", operation_id = "create_session", tag = "sessions",
    request_body = CreateSessionRequest,
    security(("operator" = ["seal.session.create"])),
    responses(
        (status = 201, description = "Registered", body = SessionCreated),
        (status = 200, description = "Exactly this registration existed already", body = SessionCreated),
        (status = 409, description = "Another session holds this id, or it was revoked", body = super::openapi::ErrorBody),
    ))]
pub async fn create(
    State(config): State<Arc<Config>>,
    State(store): State<Arc<dyn Store>>,
    State(contexts): State<Arc<ContextRegistry>>,
    State(minter): State<Option<Arc<TokenMinter>>>,
    State(audit): State<AuditLog>,
    caller: Caller,
    ControlBody(body): ControlBody,
) -> Result<Response, ApiError> {
    caller.require_some(scopes::SESSION_CREATE)?;
    let request: CreateSessionRequest = json_body(&body)?;
    let now = clock::now_secs();
    let new = request
        .validate(now, config.sessions.max_lifetime_secs)
        .map_err(|m| ApiError::new(Code::InvalidRequest, m))?;
    // SPEC 5: a different registration under a taken id is 409 whatever its context names.
    let existing = store
        .session_get(&new.session_id)
        .await
        .map_err(ApiError::store)?;
    if let Some(existing) = existing {
        return repeat_or_conflict(&caller, &new, &existing);
    }
    let team = context_team(&contexts, &caller, &new.security_context)?;
    let token = match &minter {
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
    let record = new
        .clone()
        .into_record(token, &caller.identity, clock::now_millis(), &team);
    let inserted = store
        .session_insert(&record)
        .await
        .map_err(ApiError::store)?;
    if let Some(existing) = inserted {
        // Another registration of the same id won the race.
        return repeat_or_conflict(&caller, &new, &existing);
    }
    audit
        .record(
            AuditEvent::new(EventType::SessionCreated)
                .session_id(&record.session_id)
                .scp(&record.security_context)
                .team(&record.team)
                .actor(&caller.identity, Some(&record.team)),
        )
        .await?;
    Ok((
        StatusCode::CREATED,
        axum::Json(session::created_body(&record)),
    )
        .into_response())
}

/// The team of the context a session is registered on (SPEC 16). A context of a team whose contexts
/// the caller may neither read nor register sessions on is answered as an unknown one, so that one team
/// cannot learn another's context names; one it may read but not register on is 403.
fn context_team(
    contexts: &ContextRegistry,
    caller: &Caller,
    name: &str,
) -> Result<String, ApiError> {
    let unknown = || {
        ApiError::new(
            Code::InvalidRequest,
            format!("security_context {name:?} is not a known security context"),
        )
    };
    let context = contexts.get(name).ok_or_else(unknown)?;
    let team = context.team();
    caller.require_visible(team, scopes::CONTEXT_READ, scopes::SESSION_CREATE, unknown)?;
    Ok(team.to_owned())
}

fn repeat_or_conflict(
    caller: &Caller,
    new: &session::NewSession,
    existing: &crate::store::SessionRecord,
) -> Result<Response, ApiError> {
    // Another team's session (SPEC 16) is only a taken id: never its body nor its token.
    if !caller.may(&existing.team, scopes::SESSION_CREATE) {
        return Err(ApiError::new(
            Code::Conflict,
            "a different session is registered under this id",
        ));
    }
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

async fn calls_allowed(store: &dyn Store, session_id: &str) -> Result<u64, ApiError> {
    let key = session::budget_key(session_id);
    let count = store.counter_get(&key).await.map_err(ApiError::store)?;
    Ok(count.unwrap_or(0).max(0) as u64)
}

/// A page of sessions, in ascending id order.
#[derive(Serialize, utoipa::ToSchema)]
pub struct SessionPage {
    pub items: Vec<SessionView>,
    /// Pass as `cursor` for the next page; null on the last page.
    pub next_cursor: Option<String>,
}

/// The filters of `GET /v1/seal/sessions`.
#[derive(utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)] // Documents the query; the handler reads it through `query_params`.
struct SessionListQuery {
    /// Only sessions in this status.
    status: Option<SessionStatus>,
    /// Only sessions on this security context.
    context: Option<String>,
    /// Only sessions bound to this agent id (the name the claims listing uses).
    agent_id: Option<String>,
    /// The same filter under its first name; given with `agent_id`, both must match.
    agent: Option<String>,
    /// 1–1000, 100 by default.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u64>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
}

/// Lists sessions, filtered and paged; never a key or a token.
#[utoipa::path(get, path = "/v1/seal/sessions", operation_id = "list_sessions", tag = "sessions",
    params(SessionListQuery),
    security(("operator" = ["seal.session.read"])),
    responses((status = 200, description = "A page of sessions", body = SessionPage)))]
pub async fn list(
    State(store): State<Arc<dyn Store>>,
    caller: Caller,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let teams = caller.require_some(scopes::SESSION_READ)?;
    let params = query_params(
        raw.as_deref(),
        &["status", "context", "agent_id", "agent", "limit", "cursor"],
    )?;
    let status = params
        .get("status")
        .map(|raw| {
            SessionStatus::parse(raw).ok_or_else(|| {
                ApiError::new(
                    Code::InvalidRequest,
                    format!("status must be active, revoked, expired or exhausted, not {raw:?}"),
                )
            })
        })
        .transpose()?;
    let limit = limit_param(&params, 100)?;
    let context = params.get("context");
    let agents = [params.get("agent_id"), params.get("agent")];
    let now = clock::now_secs();
    // What the record alone decides; `active` and `exhausted` also need the call count, read below.
    let keep = |record: &SessionRecord| {
        teams.admits(&record.team)
            && context.is_none_or(|c| *c == record.security_context)
            && agents
                .iter()
                .flatten()
                .all(|a| record.agent_id.as_ref() == Some(*a))
            && status.is_none_or(|wanted| match (session::status(record, now, 0), wanted) {
                // Neither revoked nor expired: the call count decides between active and exhausted.
                (SessionStatus::Active | SessionStatus::Exhausted, SessionStatus::Active) => true,
                (SessionStatus::Active | SessionStatus::Exhausted, SessionStatus::Exhausted) => {
                    record.max_calls.is_some()
                }
                (base, wanted) => base == wanted,
            })
    };
    // One match beyond the page tells whether another page follows: the call count can exclude
    // sessions that the store's filter kept, so the store's own "more" is not enough.
    let mut cursor = params.get("cursor").cloned();
    let mut items = Vec::new();
    loop {
        let (page, more) = store
            .session_page(cursor.as_deref(), limit + 1 - items.len(), &keep)
            .await
            .map_err(ApiError::store)?;
        for record in &page {
            let calls = calls_allowed(store.as_ref(), &record.session_id).await?;
            let view = session::describe(record, now, calls);
            if status.is_none_or(|wanted| view.status == wanted) {
                items.push(view);
            }
        }
        cursor = page.last().map(|r| r.session_id.clone());
        if !more || items.len() > limit {
            break;
        }
    }
    let next_cursor = if items.len() > limit {
        items.truncate(limit);
        items.last().map(|v| v.session_id.clone())
    } else {
        None
    };
    Ok(axum::Json(SessionPage { items, next_cursor }).into_response())
}

/// Reads one session: status, context, expiry, budget, call count and labels (SPEC 19); never a key or
/// a token.
#[utoipa::path(get, path = "/v1/seal/sessions/{id}", operation_id = "read_session", tag = "sessions",
    params(("id" = String, Path, description = "The session id")),
    security(("operator" = ["seal.session.read"])),
    responses((status = 200, description = "The session", body = SessionView)))]
pub async fn read(
    State(store): State<Arc<dyn Store>>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    caller.require_some(scopes::SESSION_READ)?;
    let record = find(store.as_ref(), &caller, &id, scopes::SESSION_READ).await?;
    let calls = calls_allowed(store.as_ref(), &id).await?;
    let mut view = session::describe(&record, clock::now_secs(), calls);
    view.labels = Some(
        session::labels(store.as_ref(), &id)
            .await
            .map_err(ApiError::store)?,
    );
    Ok(axum::Json(view).into_response())
}

/// The session `id`, for doing `scope` to it: another team's session is not found (SPEC 16), like a
/// missing one.
async fn find(
    store: &dyn Store,
    caller: &Caller,
    id: &str,
    scope: &str,
) -> Result<SessionRecord, ApiError> {
    let not_found = || ApiError::new(Code::NotFound, format!("no session {id:?}"));
    let record = store
        .session_get(id)
        .await
        .map_err(ApiError::store)?
        .ok_or_else(not_found)?;
    caller.require_visible(&record.team, scopes::SESSION_READ, scope, not_found)?;
    Ok(record)
}

/// The answer to a revocation.
#[derive(Serialize, utoipa::ToSchema)]
pub struct SessionRevoked {
    pub session_id: String,
    /// Always `revoked`.
    pub status: SessionStatus,
    /// RFC 3339 with milliseconds.
    pub revoked_at: String,
}

/// Revokes a session: its key is erased and every later envelope gets 1006. Repeating it is harmless.
#[utoipa::path(delete, path = "/v1/seal/sessions/{id}", operation_id = "revoke_session", tag = "sessions",
    params(("id" = String, Path, description = "The session id")),
    security(("operator" = ["seal.session.revoke"])),
    responses((status = 200, description = "Revoked (now or before)", body = SessionRevoked)))]
pub async fn revoke(
    State(store): State<Arc<dyn Store>>,
    State(sessions): State<Arc<SessionCache>>,
    State(audit): State<AuditLog>,
    caller: Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    caller.require_some(scopes::SESSION_REVOKE)?;
    loop {
        let record = find(store.as_ref(), &caller, &id, scopes::SESSION_REVOKE).await?;
        if let Some(at) = record.revoked_at_ms {
            // Revoked elsewhere (another replica, or a racing call) perhaps before this replica heard:
            // whoever answers "revoked" enforces it from now on.
            sessions.invalidate(&id);
            return Ok(revoked_body(&id, at));
        }
        let now_ms = clock::now_millis();
        let next = session::revoked(&record, now_ms);
        if store
            .session_replace(&record, &next)
            .await
            .map_err(ApiError::store)?
        {
            // The very next call reads the revoked record (SPEC 5: refused from this moment).
            sessions.invalidate(&id);
            audit
                .record(
                    AuditEvent::new(EventType::SessionRevoked)
                        .session_id(&id)
                        .team(&record.team)
                        .actor(&caller.identity, Some(&record.team)),
                )
                .await?;
            return Ok(revoked_body(&id, now_ms));
        }
    }
}

fn revoked_body(id: &str, at_ms: i64) -> Response {
    axum::Json(SessionRevoked {
        session_id: id.to_string(),
        status: SessionStatus::Revoked,
        revoked_at: clock::rfc3339_millis(at_ms),
    })
    .into_response()
}
