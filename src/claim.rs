//! Claims, the exactly-once guard of SPEC section 7: request-id derivation, the receipt's action_ref, and
//! the CLAIMABLE → PENDING → COMMITTED state machine on top of the store's atomic operations.

use serde_json::{json, Map, Value};

use crate::clock;
use crate::envelope::jcs_sha256_hex;
use crate::policy::ClaimMode;
use crate::store::{
    ClaimOutcome, ClaimRecord, ClaimStatus, Resolution, Store, StoreError, StoreResult,
};

/// hex(SHA-256(JCS({"agent", "key"}))): stable across sessions and restarts of the same agent.
pub fn request_id_for_key(agent: &str, idempotency_key: &str) -> String {
    jcs_sha256_hex(&json!({"agent": agent, "key": idempotency_key}))
}

/// hex(SHA-256(JCS({"agent", "session", "tool", "arguments"}))): catches retries inside one execution.
pub fn request_id_for_call(
    agent: &str,
    session: &str,
    tool: &str,
    arguments: &Map<String, Value>,
) -> String {
    jcs_sha256_hex(&json!({
        "agent": agent, "session": session, "tool": tool, "arguments": arguments,
    }))
}

/// The request id a call gets under the capability's claim mode, or None when it takes no claim.
pub fn request_id(
    mode: ClaimMode,
    agent: &str,
    session: &str,
    tool: &str,
    arguments: &Map<String, Value>,
    idempotency_key: Option<&str>,
) -> Option<String> {
    match (mode, idempotency_key) {
        (ClaimMode::Off, _) => None,
        (_, Some(key)) => Some(request_id_for_key(agent, key)),
        (ClaimMode::Auto, None) => Some(request_id_for_call(agent, session, tool, arguments)),
        (ClaimMode::Explicit, None) => None,
    }
}

/// SHA-256 (hex) of JCS({"agent_id", "action_type", "scope", "timestamp"}) (SPEC 7.3).
pub fn action_ref(agent_id: &str, action_type: &str, scope: &str, timestamp: &str) -> String {
    jcs_sha256_hex(&json!({
        "agent_id": agent_id, "action_type": action_type, "scope": scope, "timestamp": timestamp,
    }))
}

/// What taking a claim found.
#[derive(Debug, Clone, PartialEq)]
pub enum Taken {
    /// Newly PENDING: the caller runs the side effect and then settles it.
    Proceed(ClaimRecord),
    /// Already COMMITTED: return the stored answer, do not run anything.
    Skip(ClaimRecord),
    /// PENDING elsewhere (in flight or outcome unknown): refuse with 4001.
    Pending(ClaimRecord),
}

/// A new PENDING record with claim time, receipt fields fixed now.
pub fn new_pending(
    request_id: &str,
    action: &str,
    agent_id: &str,
    session_id: Option<&str>,
) -> ClaimRecord {
    let claimed_at_ms = clock::now_millis();
    let claimed_at = clock::rfc3339_millis(claimed_at_ms);
    ClaimRecord {
        request_id: request_id.to_string(),
        action: action.to_string(),
        agent_id: agent_id.to_string(),
        session_id: session_id.map(str::to_string),
        status: ClaimStatus::Pending,
        action_ref: action_ref(agent_id, action, request_id, &claimed_at),
        claimed_at,
        claimed_at_ms,
        committed_at: None,
        outcome: None,
        resolution: None,
    }
}

/// CLAIMABLE → PENDING, durably; or what is already there.
pub fn take(store: &dyn Store, pending: ClaimRecord) -> StoreResult<Taken> {
    Ok(match store.claim_insert(&pending)? {
        None => Taken::Proceed(pending),
        Some(existing) if existing.status == ClaimStatus::Committed => Taken::Skip(existing),
        Some(existing) => Taken::Pending(existing),
    })
}

/// PENDING → COMMITTED with the outcome, durably. If someone else settled it first (an operator's
/// resolution), their record stands and is returned.
pub fn commit(
    store: &dyn Store,
    pending: &ClaimRecord,
    outcome: ClaimOutcome,
) -> StoreResult<ClaimRecord> {
    let mut committed = pending.clone();
    committed.status = ClaimStatus::Committed;
    committed.committed_at = Some(clock::rfc3339_millis(clock::now_millis()));
    committed.outcome = Some(outcome);
    if store.claim_replace(pending, Some(&committed))? {
        return Ok(committed);
    }
    store.claim_get(&pending.request_id)?.ok_or_else(|| {
        StoreError(format!(
            "claim {} vanished while settling",
            pending.request_id
        ))
    })
}

/// PENDING → CLAIMABLE: nothing of the call reached the tool. False when it was no longer that PENDING record.
pub fn release(store: &dyn Store, pending: &ClaimRecord) -> StoreResult<bool> {
    store.claim_replace(pending, None)
}

/// Why a manual resolution or settlement was refused.
#[derive(Debug, PartialEq)]
pub enum SettleError {
    NotFound,
    NotPending(Box<ClaimRecord>),
    Store(String),
}

impl From<StoreError> for SettleError {
    fn from(err: StoreError) -> Self {
        SettleError::Store(err.0)
    }
}

/// How an operator resolves a PENDING claim (SPEC 7.4).
pub enum ManualOutcome {
    Committed(Value),
    Released,
}

/// Resolves a PENDING claim by hand; only PENDING claims can be resolved.
/// Returns the new record (None once released) and the record it replaced.
pub fn resolve(
    store: &dyn Store,
    request_id: &str,
    outcome: ManualOutcome,
    actor: &str,
    evidence: Option<String>,
) -> Result<(Option<ClaimRecord>, ClaimRecord), SettleError> {
    let current = store.claim_get(request_id)?.ok_or(SettleError::NotFound)?;
    if current.status != ClaimStatus::Pending {
        return Err(SettleError::NotPending(Box::new(current)));
    }
    let now = clock::rfc3339_millis(clock::now_millis());
    let (label, next) = match outcome {
        ManualOutcome::Released => ("released", None),
        ManualOutcome::Committed(response) => {
            let mut next = current.clone();
            next.status = ClaimStatus::Committed;
            next.committed_at = Some(now.clone());
            next.outcome = Some(ClaimOutcome::Answer { response });
            ("committed", Some(next))
        }
    };
    let next = next.map(|mut record: ClaimRecord| {
        record.resolution = Some(Resolution {
            actor: actor.to_string(),
            outcome: label.to_string(),
            evidence: evidence.clone(),
            at: now.clone(),
        });
        record
    });
    if store.claim_replace(&current, next.as_ref())? {
        Ok((next, current))
    } else {
        // Settled by the call itself in the meantime: report what stands now.
        match store.claim_get(request_id)? {
            Some(record) => Err(SettleError::NotPending(Box::new(record))),
            None => Err(SettleError::NotFound),
        }
    }
}

/// `POST /settle/{id}`: commits a standalone claim with its result. Ok(true) when it was already
/// committed (the first result stands).
pub fn settle(store: &dyn Store, request_id: &str, result: Value) -> Result<bool, SettleError> {
    let current = store.claim_get(request_id)?.ok_or(SettleError::NotFound)?;
    if current.status == ClaimStatus::Committed {
        return Ok(true);
    }
    let mut committed = current.clone();
    committed.status = ClaimStatus::Committed;
    committed.committed_at = Some(clock::rfc3339_millis(clock::now_millis()));
    committed.outcome = Some(ClaimOutcome::Settled { result });
    if store.claim_replace(&current, Some(&committed))? {
        return Ok(false);
    }
    match store.claim_get(request_id)? {
        Some(record) if record.status == ClaimStatus::Committed => Ok(true),
        Some(record) => Err(SettleError::NotPending(Box::new(record))),
        None => Err(SettleError::NotFound),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SledStore;

    fn store() -> (tempfile::TempDir, SledStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path()).unwrap();
        (dir, store)
    }

    #[test]
    fn action_ref_matches_the_public_safeagent_vector() {
        assert_eq!(
            action_ref(
                "safeagent-prod",
                "erc20_transfer",
                "req-001",
                "2026-06-28T10:00:00.000Z"
            ),
            "bd9d4d341695bba61c5c04f7fc3c16869dfe1fc33e09f21728ae6b19e522e99b"
        );
    }

    #[test]
    fn request_ids_follow_the_claim_mode() {
        let args = Map::new();
        let auto = request_id(ClaimMode::Auto, "a", "s", "t", &args, None).unwrap();
        assert_eq!(auto, request_id_for_call("a", "s", "t", &args));
        assert_ne!(
            auto,
            request_id_for_call("a", "s2", "t", &args),
            "auto ids are per session"
        );
        let keyed = request_id(ClaimMode::Auto, "a", "s", "t", &args, Some("k")).unwrap();
        assert_eq!(
            keyed,
            request_id(ClaimMode::Explicit, "a", "other", "u", &args, Some("k")).unwrap()
        );
        assert_ne!(
            keyed,
            request_id_for_key("b", "k"),
            "explicit keys are scoped to the agent"
        );
        assert_eq!(
            request_id(ClaimMode::Explicit, "a", "s", "t", &args, None),
            None
        );
        assert_eq!(
            request_id(ClaimMode::Off, "a", "s", "t", &args, Some("k")),
            None
        );
        assert_eq!(auto.len(), 64);
    }

    #[test]
    fn proceed_then_pending_then_skip_after_commit() {
        let (_dir, store) = store();
        let Taken::Proceed(pending) = take(&store, new_pending("r", "t", "a", Some("s"))).unwrap()
        else {
            panic!("first take must proceed")
        };
        assert!(
            matches!(take(&store, new_pending("r", "t", "a", Some("s"))).unwrap(), Taken::Pending(p) if p == pending)
        );
        let answer = json!({"jsonrpc": "2.0", "id": 1, "result": {"ok": true}});
        let committed = commit(
            &store,
            &pending,
            ClaimOutcome::Answer {
                response: answer.clone(),
            },
        )
        .unwrap();
        assert_eq!(committed.status, ClaimStatus::Committed);
        let Taken::Skip(skip) = take(&store, new_pending("r", "t", "a", Some("s"))).unwrap() else {
            panic!("committed claim must skip")
        };
        assert_eq!(
            skip.outcome,
            Some(ClaimOutcome::Answer { response: answer })
        );
        assert_eq!(
            skip.action_ref, pending.action_ref,
            "receipt fields are fixed at claim time"
        );
        assert_eq!(skip.claimed_at, pending.claimed_at);
    }

    #[test]
    fn release_reopens_and_a_released_claim_cannot_be_committed() {
        let (_dir, store) = store();
        let Taken::Proceed(pending) = take(&store, new_pending("r", "t", "a", None)).unwrap()
        else {
            panic!()
        };
        assert!(release(&store, &pending).unwrap());
        assert!(!release(&store, &pending).unwrap());
        assert!(commit(
            &store,
            &pending,
            ClaimOutcome::ResponseTooLarge { limit: 1 }
        )
        .is_err());
        assert!(matches!(
            take(&store, new_pending("r", "t", "a", None)).unwrap(),
            Taken::Proceed(_)
        ));
    }

    #[test]
    fn operator_resolution_only_for_pending_claims() {
        let (_dir, store) = store();
        assert_eq!(
            resolve(&store, "missing", ManualOutcome::Released, "op", None).unwrap_err(),
            SettleError::NotFound
        );
        take(&store, new_pending("r", "t", "a", None)).unwrap();
        let answer = json!({"jsonrpc": "2.0", "id": 0, "result": {"done": 1}});
        let (next, _) = resolve(
            &store,
            "r",
            ManualOutcome::Committed(answer),
            "op",
            Some("checked the ledger".into()),
        )
        .unwrap();
        let next = next.unwrap();
        assert_eq!(next.status, ClaimStatus::Committed);
        assert_eq!(next.resolution.as_ref().unwrap().actor, "op");
        assert!(matches!(
            resolve(&store, "r", ManualOutcome::Released, "op", None),
            Err(SettleError::NotPending(_))
        ));
        take(&store, new_pending("q", "t", "a", None)).unwrap();
        let (gone, _) = resolve(&store, "q", ManualOutcome::Released, "op", None).unwrap();
        assert!(gone.is_none());
        assert_eq!(store.claim_get("q").unwrap(), None);
    }

    #[test]
    fn settle_commits_once() {
        let (_dir, store) = store();
        assert_eq!(
            settle(&store, "none", json!(1)).unwrap_err(),
            SettleError::NotFound
        );
        take(&store, new_pending("s", "transfer", "a", None)).unwrap();
        assert!(!settle(&store, "s", json!({"tx": 1})).unwrap());
        assert!(settle(&store, "s", json!({"tx": 2})).unwrap());
        let record = store.claim_get("s").unwrap().unwrap();
        assert_eq!(
            record.outcome,
            Some(ClaimOutcome::Settled {
                result: json!({"tx": 1})
            })
        );
    }
}
