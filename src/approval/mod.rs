//! Human approval of risky calls (SPEC 13): the requests a capability with `approval.required` makes,
//! the state machine pending → granted | denied | expired, granted → used | expired, and the webhook that
//! announces new requests. Every change of state is one compare-and-set in the store, so replicas agree:
//! one decision per request, one execution per grant.

pub mod cli;
mod webhook;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::audit::{AuditError, AuditEvent, AuditLog, EventType};
use crate::clock;
use crate::identity::Identity;
use crate::policy::ApprovalRule;
use crate::store::{ApprovalRecord, ApprovalStatus, Grant, Store, StoreError, StoreResult};

pub use webhook::Notifier;

/// How often the upkeep task looks for requests and grants whose time ran out (SPEC 13: within 60 s).
pub const SWEEP_EVERY: Duration = Duration::from_secs(15);

/// What the approval steps work with: the store that holds the requests, the audit trail that records
/// each change of state, and the webhook that announces new requests.
#[derive(Clone)]
pub struct Desk {
    pub store: Arc<dyn Store>,
    pub audit: AuditLog,
    pub notifier: Arc<Notifier>,
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
    /// The session's team (SPEC 16).
    pub team: &'a str,
    /// What the capability asks of the people who decide, fixed into the request when it is made.
    pub rule: ApprovalRule,
    /// Who registered the session; None for a session registered before r4.
    pub registered_by: Option<&'a Identity>,
    /// The flow rule that asks for the approval (SPEC 19), named by the request.
    pub flow_rule: Option<usize>,
}

/// What a flow rule's `approval` asks when the capability asks none (SPEC 19): one person, the default
/// wait of SPEC 13. Where the capability asks one too, the call needs only that one.
pub const FLOW_APPROVAL: ApprovalRule = ApprovalRule {
    expires_secs: 900,
    approvers: 1,
    separate_from_registrant: false,
};

/// Why an approval step could not be taken; the caller answers 5005 (SPEC 10) with its text.
#[derive(Debug, thiserror::Error)]
pub enum ApprovalError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Audit(#[from] AuditError),
    /// The record was there a moment ago and is gone: the store lost it.
    #[error("approval {0} vanished")]
    Vanished(String),
    /// Other calls kept replacing the call's request between its reads (another replica's, or the
    /// agent's own repeats).
    #[error("the call's approval kept changing under concurrent calls; try again")]
    KeptChanging,
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
pub async fn refresh(desk: &Desk, record: ApprovalRecord) -> Result<ApprovalRecord, ApprovalError> {
    let mut record = record;
    loop {
        if !is_due(&record, clock::now_millis()) {
            return Ok(record);
        }
        let expired = ApprovalRecord {
            status: ApprovalStatus::Expired,
            ..record.clone()
        };
        if desk.store.approval_replace(&record, &expired).await? {
            desk.audit
                .record(event(EventType::ApprovalExpired, &expired))
                .await?;
            return Ok(expired);
        }
        record = desk
            .store
            .approval_get(&record.approval_id)
            .await?
            .ok_or_else(|| ApprovalError::Vanished(record.approval_id.clone()))?;
    }
}

/// Expires every request and grant whose time ran out; returns how many it expired.
pub async fn sweep(desk: &Desk) -> Result<usize, ApprovalError> {
    let now = clock::now_millis();
    let mut expired = 0;
    let mut cursor = None;
    loop {
        let (due, more) = desk
            .store
            .approval_page(cursor.as_ref(), 100, &|a| is_due(a, now))
            .await?;
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
pub async fn gate(desk: &Desk, call: &Call<'_>) -> Result<Gate, ApprovalError> {
    for _ in 0..4 {
        let current = desk
            .store
            .approval_current(call.session_id, call.call_digest)
            .await?;
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
                if taken? {
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
                if desk.store.approval_insert(&record, replacing).await? {
                    desk.notifier.notify(&record);
                    return Ok(Gate::Requested(record));
                }
            }
        }
    }
    Err(ApprovalError::KeptChanging)
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
        expires_at_ms: now_ms.saturating_add(secs_to_ms(call.rule.expires_secs)),
        expires_secs: call.rule.expires_secs,
        decided_at_ms: None,
        decided_by: None,
        reason: None,
        team: call.team.to_owned(),
        grants: Vec::new(),
        approvers: call.rule.approvers,
        separate_from_registrant: call.rule.separate_from_registrant,
        registered_by: call.registered_by.cloned(),
        flow_rule: call.flow_rule,
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
    /// This person's grant is already among the request's grants.
    AlreadyGranted,
    /// Separation of duties: the decider registered the session (or, for a session registered before
    /// r4, who did cannot be known): the message says which.
    Registrant(String),
    Store(ApprovalError),
}

impl<E: Into<ApprovalError>> From<E> for DecideError {
    fn from(e: E) -> Self {
        DecideError::Store(e.into())
    }
}

/// A person's decision on a request.
pub struct Decision<'a> {
    pub grant: bool,
    pub by: &'a Identity,
    pub reason: Option<String>,
}

/// Grants or denies a pending request (SPEC 13, 13 r4), recording the person, the reason and the
/// event. A grant before the last one needed leaves the request pending with the grant recorded; the
/// last one, or any deny, decides it, and the decision stays in force for `expires_secs` from now. Two
/// people granting at once both count: the one whose compare-and-set lost reads the record again.
pub async fn decide(
    desk: &Desk,
    approval_id: &str,
    decision: &Decision<'_>,
) -> Result<ApprovalRecord, DecideError> {
    loop {
        let record = desk
            .store
            .approval_get(approval_id)
            .await?
            .ok_or(DecideError::NotFound)?;
        let record = refresh(desk, record).await?;
        let next = after(&record, decision, clock::now_millis())?;
        // Lost to another decision, grant or expiry made meanwhile: read again.
        if !desk.store.approval_replace(&record, &next).await? {
            continue;
        }
        desk.audit.record(decision_event(&next, decision)).await?;
        return Ok(next);
    }
}

/// The record once `decision` is made at `now`, or why it cannot be: the registrant is asked first, so
/// that they learn why whatever the request's state.
fn after(
    record: &ApprovalRecord,
    decision: &Decision<'_>,
    now: i64,
) -> Result<ApprovalRecord, DecideError> {
    may_decide(record, decision.by)?;
    if record.status != ApprovalStatus::Pending {
        return Err(DecideError::NotPending(Box::new(record.clone())));
    }
    if !decision.grant {
        return Ok(denied(record, decision, now));
    }
    if record.grants.iter().any(|g| g.by.same_person(decision.by)) {
        return Err(DecideError::AlreadyGranted);
    }
    Ok(with_grant(record, decision, now))
}

/// Separation of duties (SPEC 13 r4): the session's registrant may not decide its calls' approvals.
/// A session registered before r4 has no recorded registrant, so nobody can be shown not to be it:
/// closed, like every check that cannot be made.
fn may_decide(record: &ApprovalRecord, by: &Identity) -> Result<(), DecideError> {
    if !record.separate_from_registrant {
        return Ok(());
    }
    match &record.registered_by {
        Some(registrant) if registrant.same_person(by) => Err(DecideError::Registrant(format!(
            "{} registered session {:?}, and this approval asks for someone other than the \
             session's registrant (separate_from_registrant)",
            by.sub, record.session_id
        ))),
        Some(_) => Ok(()),
        None => Err(DecideError::Registrant(format!(
            "session {:?} was registered before sealgate recorded who registers sessions, so \
             nobody can be shown not to be its registrant (separate_from_registrant); register \
             a new session for the call",
            record.session_id
        ))),
    }
}

/// The record with one more grant: granted once it holds `approvers` of them.
fn with_grant(record: &ApprovalRecord, decision: &Decision<'_>, now: i64) -> ApprovalRecord {
    let mut next = record.clone();
    next.grants.push(Grant {
        by: decision.by.clone(),
        at_ms: now,
        reason: decision.reason.clone(),
    });
    if next.grants.len() >= usize::try_from(record.approvers).unwrap_or(usize::MAX) {
        next.status = ApprovalStatus::Granted;
        decided(&mut next, decision, now);
    }
    next
}

fn denied(record: &ApprovalRecord, decision: &Decision<'_>, now: i64) -> ApprovalRecord {
    let mut next = record.clone();
    next.status = ApprovalStatus::Denied;
    decided(&mut next, decision, now);
    next
}

/// Marks the decision: who, when, why, and the start of its force.
fn decided(record: &mut ApprovalRecord, decision: &Decision<'_>, now: i64) {
    record.decided_at_ms = Some(now);
    record.decided_by = Some(decision.by.into());
    record.reason = decision.reason.clone();
    record.expires_at_ms = now.saturating_add(secs_to_ms(record.expires_secs));
}

/// `ApprovalGranted` for every grant (with how many it holds and needs) or `ApprovalDenied`, with the
/// person as `actor` and the reason as `detail`.
fn decision_event(record: &ApprovalRecord, decision: &Decision<'_>) -> AuditEvent {
    let mut recorded = if decision.grant {
        event(EventType::ApprovalGranted, record).grants(record.grants.len(), record.approvers)
    } else {
        event(EventType::ApprovalDenied, record)
    };
    recorded = recorded.actor(decision.by, Some(&record.team));
    if let Some(reason) = &decision.reason {
        recorded = recorded.detail(reason);
    }
    recorded
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{Via, LOCAL_ISSUER};
    use crate::store::RecordedIdentity;

    fn person(sub: &str) -> Identity {
        Identity {
            iss: LOCAL_ISSUER.into(),
            sub: sub.into(),
            name: None,
            via: Via::Key,
        }
    }

    /// An approval request exactly as a gateway before r4 wrote it.
    const BEFORE_R4: &str = r#"{"approval_id":"a1","status":"granted","session_id":"s","sub":"agent","tool":"pay.send","arguments":{"cents":5},"call_digest":"d","context":"c","context_version":"v","requested_at_ms":1,"expires_at_ms":900001,"expires_secs":900,"decided_at_ms":2,"decided_by":"bob","reason":null}"#;

    #[test]
    fn a_record_written_before_r4_reads_and_encodes_back_to_its_stored_bytes() {
        let record: ApprovalRecord = crate::store::decode_record(BEFORE_R4).unwrap();
        assert_eq!(
            record.decided_by.as_ref().map(RecordedIdentity::identity),
            Some(person("bob"))
        );
        assert_eq!(
            (record.approvers, record.separate_from_registrant),
            (1, false)
        );
        assert!(record.grants.is_empty());
        // The stores' compare-and-set compares these bytes: a use or an expiry of it must still match.
        assert_eq!(crate::store::encode_record(&record).unwrap(), BEFORE_R4);
    }

    fn pending(approvers: u32, registrant: Option<Identity>) -> ApprovalRecord {
        let mut record: ApprovalRecord = crate::store::decode_record(BEFORE_R4).unwrap();
        record.status = ApprovalStatus::Pending;
        record.decided_at_ms = None;
        record.decided_by = None;
        record.approvers = approvers;
        record.separate_from_registrant = true;
        record.registered_by = registrant;
        record
    }

    fn grant(by: &Identity) -> Decision<'_> {
        Decision {
            grant: true,
            by,
            reason: None,
        }
    }

    #[test]
    fn the_last_grant_needed_grants_and_starts_the_decisions_force() {
        let (ann, bob) = (person("ann"), person("bob"));
        let once = after(&pending(2, Some(person("carol"))), &grant(&ann), 10)
            .ok()
            .unwrap();
        assert_eq!(once.status, ApprovalStatus::Pending);
        assert_eq!(
            (once.decided_by.clone(), once.expires_at_ms),
            (None, 900001)
        );
        // Whatever other name or proof ann comes with, she is still ann.
        let ann_again = Identity {
            name: Some("Ann".into()),
            via: Via::Oidc,
            ..ann.clone()
        };
        assert!(matches!(
            after(&once, &grant(&ann_again), 15),
            Err(DecideError::AlreadyGranted)
        ));
        let twice = after(&once, &grant(&bob), 20).ok().unwrap();
        assert_eq!(twice.status, ApprovalStatus::Granted);
        assert_eq!(twice.decided_by, Some(RecordedIdentity::Identity(bob)));
        assert_eq!(twice.expires_at_ms, 20 + 900_000);
        let by: Vec<_> = twice.grants.iter().map(|g| g.by.sub.as_str()).collect();
        assert_eq!(by, ["ann", "bob"]);
    }

    #[test]
    fn the_registrant_or_an_unknown_one_keeps_a_separated_request_from_being_decided() {
        let (ann, bob) = (person("ann"), person("bob"));
        let record = pending(2, Some(ann.clone()));
        assert!(matches!(
            may_decide(&record, &ann),
            Err(DecideError::Registrant(why)) if why.contains("registered session")
        ));
        assert!(may_decide(&record, &bob).is_ok());
        // The same `sub` from another issuer is another person.
        let elsewhere = Identity {
            iss: "https://idp".into(),
            ..ann.clone()
        };
        assert!(may_decide(&record, &elsewhere).is_ok());
        assert!(matches!(
            may_decide(&pending(2, None), &bob),
            Err(DecideError::Registrant(why)) if why.contains("before sealgate recorded")
        ));
        let trusting = ApprovalRecord {
            separate_from_registrant: false,
            ..pending(2, Some(ann.clone()))
        };
        assert!(may_decide(&trusting, &ann).is_ok());
    }
}
