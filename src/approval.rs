//! Human approval of risky calls (SPEC 13): the requests a capability with `approval.required` makes,
//! the state machine pending → granted | denied | expired, granted → used | expired, and the webhook that
//! announces new requests. Every change of state is one compare-and-set in the store, so replicas agree:
//! one decision per request, one execution per grant.

mod webhook;

use std::time::Duration;

use serde_json::{Map, Value};

use crate::audit::{AuditEvent, AuditLog, EventType};
use crate::clock;
use crate::store::{ApprovalRecord, ApprovalStatus, Store, StoreError, StoreResult};

pub use webhook::Notifier;

/// How often the upkeep task looks for requests and grants whose time ran out (SPEC 13: within 60 s).
pub const SWEEP_EVERY: Duration = Duration::from_secs(15);

/// What the approval steps work with: the store that holds the requests, the audit trail that records
/// each change of state, and the webhook that announces new requests.
pub struct Desk<'a> {
    pub store: &'a dyn Store,
    pub audit: &'a AuditLog,
    pub notifier: &'a Notifier,
}

/// The call that would run: who asked, for which tool, with what, under which context.
pub struct Call<'a> {
    pub session_id: &'a str,
    pub sub: &'a str,
    pub tool: &'a str,
    pub arguments: &'a Map<String, Value>,
    pub call_digest: &'a str,
    pub context: &'a str,
    pub context_version: &'a str,
    pub expires_secs: u64,
    /// The session's team (SPEC 16).
    pub team: &'a str,
}

/// What the approval step decided for a call.
pub enum Gate {
    /// A grant was there and is now marked used; give it back with [`restore`] if nothing is sent.
    Granted(ApprovalRecord),
    /// A new request was recorded (4003, `ApprovalRequested`).
    Requested(ApprovalRecord),
    /// The call's request is still waiting (4003 with the same id).
    Waiting(ApprovalRecord),
    /// A person refused the call, and the refusal is still in force (4004).
    Denied(ApprovalRecord),
}

/// The event of an approval's step: the request's id, tool, session and agent (never the arguments).
pub fn event(kind: EventType, record: &ApprovalRecord) -> AuditEvent {
    AuditEvent::new(kind)
        .approval_id(&record.approval_id)
        .tool(&record.tool)
        .session_id(&record.session_id)
        .sub(&record.sub)
        .context_version(&record.context_version)
        .team(&record.team)
}

/// Whether a pending request or an unused grant has run out of time at `now_ms`.
fn is_due(record: &ApprovalRecord, now_ms: i64) -> bool {
    matches!(
        record.status,
        ApprovalStatus::Pending | ApprovalStatus::Granted
    ) && now_ms >= record.expires_at_ms
}

/// The record as it stands now: a request or grant whose time ran out becomes `expired`, and the first
/// one to notice writes `ApprovalExpired` (SPEC 13). Another replica noticing first is fine: the record
/// it left is returned.
pub async fn refresh(desk: &Desk<'_>, record: ApprovalRecord) -> Result<ApprovalRecord, String> {
    let mut record = record;
    loop {
        if !is_due(&record, clock::now_millis()) {
            return Ok(record);
        }
        let expired = ApprovalRecord {
            status: ApprovalStatus::Expired,
            ..record.clone()
        };
        if desk
            .store
            .approval_replace(&record, &expired)
            .await
            .map_err(|e| e.to_string())?
        {
            desk.audit
                .record(event(EventType::ApprovalExpired, &expired))
                .await
                .map_err(|e| e.to_string())?;
            return Ok(expired);
        }
        record = desk
            .store
            .approval_get(&record.approval_id)
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("approval {} vanished", record.approval_id))?;
    }
}

/// Expires every request and grant whose time ran out; returns how many it expired.
pub async fn sweep(desk: &Desk<'_>) -> Result<usize, String> {
    let now = clock::now_millis();
    let mut expired = 0;
    let mut cursor = None;
    loop {
        let (due, more) = desk
            .store
            .approval_page(cursor.as_ref(), 100, &|a| is_due(a, now))
            .await
            .map_err(|e| e.to_string())?;
        cursor = due.last().map(|a| crate::store::ApprovalCursor {
            requested_at_ms: a.requested_at_ms,
            approval_id: a.approval_id.clone(),
        });
        for record in due {
            if refresh(desk, record).await?.status == ApprovalStatus::Expired {
                expired += 1;
            }
        }
        if !more {
            return Ok(expired);
        }
    }
}

/// The call's own request when it is still pending and not yet due (SPEC 13 r3): a repeat that finds it
/// is answered 4003 with its id before it is charged, so an agent waiting for a person spends nothing.
/// Anything else (no request, decided, due to expire) is left to [`gate`], after the charge.
pub async fn still_pending(
    store: &dyn Store,
    session_id: &str,
    call_digest: &str,
) -> StoreResult<Option<ApprovalRecord>> {
    let current = store.approval_current(session_id, call_digest).await?;
    Ok(current.filter(|record| {
        record.status == ApprovalStatus::Pending && !is_due(record, clock::now_millis())
    }))
}

/// The approval step of one call (SPEC 13): use the call's grant, or say why the call must wait.
/// A lost race with another replica is read again, a few times, before it is a store error.
pub async fn gate(desk: &Desk<'_>, call: &Call<'_>) -> Result<Gate, String> {
    for _ in 0..4 {
        let current = desk
            .store
            .approval_current(call.session_id, call.call_digest)
            .await
            .map_err(|e| e.to_string())?;
        let current = match current {
            Some(record) => Some(refresh(desk, record).await?),
            None => None,
        };
        let now = clock::now_millis();
        match current {
            Some(grant) if grant.status == ApprovalStatus::Granted => {
                let used = ApprovalRecord {
                    status: ApprovalStatus::Used,
                    ..grant.clone()
                };
                let taken = desk.store.approval_replace(&grant, &used).await;
                if taken.map_err(|e| e.to_string())? {
                    return Ok(Gate::Granted(used));
                }
            }
            Some(waiting) if waiting.status == ApprovalStatus::Pending => {
                return Ok(Gate::Waiting(waiting));
            }
            Some(denied)
                if denied.status == ApprovalStatus::Denied && now < denied.expires_at_ms =>
            {
                return Ok(Gate::Denied(denied));
            }
            previous => {
                let record = new_request(call, now);
                let replacing = previous.as_ref().map(|p| p.approval_id.as_str());
                if desk
                    .store
                    .approval_insert(&record, replacing)
                    .await
                    .map_err(|e| e.to_string())?
                {
                    desk.notifier.notify(&record);
                    return Ok(Gate::Requested(record));
                }
            }
        }
    }
    Err("the call's approval kept changing under concurrent calls; try again".into())
}

fn new_request(call: &Call<'_>, now_ms: i64) -> ApprovalRecord {
    ApprovalRecord {
        approval_id: uuid::Uuid::new_v4().to_string(),
        status: ApprovalStatus::Pending,
        session_id: call.session_id.to_owned(),
        sub: call.sub.to_owned(),
        tool: call.tool.to_owned(),
        arguments: call.arguments.clone(),
        call_digest: call.call_digest.to_owned(),
        context: call.context.to_owned(),
        context_version: call.context_version.to_owned(),
        requested_at_ms: now_ms,
        expires_at_ms: now_ms.saturating_add(secs_to_ms(call.expires_secs)),
        expires_secs: call.expires_secs,
        decided_at_ms: None,
        decided_by: None,
        reason: None,
        team: call.team.to_owned(),
    }
}

fn secs_to_ms(secs: u64) -> i64 {
    i64::try_from(secs.saturating_mul(1000)).unwrap_or(i64::MAX)
}

/// Gives a grant back when the call never left the gateway (SPEC 13: a 5001 leaves the grant usable).
pub async fn restore(store: &dyn Store, used: &ApprovalRecord) -> StoreResult<()> {
    let granted = ApprovalRecord {
        status: ApprovalStatus::Granted,
        ..used.clone()
    };
    store.approval_replace(used, &granted).await.map(|_| ())
}

/// Why a decision could not be made.
pub enum DecideError {
    NotFound,
    /// Not pending (decided, used or expired): the record as it stands.
    NotPending(Box<ApprovalRecord>),
    Store(String),
}

impl From<StoreError> for DecideError {
    fn from(e: StoreError) -> Self {
        DecideError::Store(e.to_string())
    }
}

/// Grants or denies a pending request, recording the operator, the reason and the event. The decision
/// stays in force for `expires_secs` from now.
pub async fn decide(
    desk: &Desk<'_>,
    approval_id: &str,
    grant: bool,
    actor: &str,
    reason: Option<String>,
) -> Result<ApprovalRecord, DecideError> {
    loop {
        let record = desk
            .store
            .approval_get(approval_id)
            .await?
            .ok_or(DecideError::NotFound)?;
        let record = refresh(desk, record).await.map_err(DecideError::Store)?;
        if record.status != ApprovalStatus::Pending {
            return Err(DecideError::NotPending(Box::new(record)));
        }
        let now = clock::now_millis();
        let decided = ApprovalRecord {
            status: if grant {
                ApprovalStatus::Granted
            } else {
                ApprovalStatus::Denied
            },
            decided_at_ms: Some(now),
            decided_by: Some(actor.to_owned()),
            reason: reason.clone(),
            expires_at_ms: now.saturating_add(secs_to_ms(record.expires_secs)),
            ..record.clone()
        };
        // Lost to another decision (or an expiry) made meanwhile: read again, which answers 409.
        if !desk.store.approval_replace(&record, &decided).await? {
            continue;
        }
        let kind = if grant {
            EventType::ApprovalGranted
        } else {
            EventType::ApprovalDenied
        };
        let mut recorded = event(kind, &decided).actor(actor);
        if let Some(reason) = &reason {
            recorded = recorded.detail(reason);
        }
        desk.audit
            .record(recorded)
            .await
            .map_err(|e| DecideError::Store(e.to_string()))?;
        return Ok(decided);
    }
}
