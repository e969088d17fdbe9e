//! Claims, the exactly-once guard of SPEC section 7: request-id derivation, the call binding
//! (`call_digest`), the receipt's action_ref, the CLAIMABLE → PENDING → COMMITTED state machine on top of
//! the store's atomic operations, and what each upstream outcome does to a claim.

pub mod admission;

use serde_json::{json, Map, Value};

use crate::clock;
use crate::envelope::jcs_sha256_hex;
use crate::identity::Identity;
use crate::policy::ClaimMode;
use crate::store::{
    ClaimKind, ClaimOutcome, ClaimRecord, ClaimSettlement, ClaimStatus, Resolution, Store,
    StoreError, StoreResult,
};
use crate::upstream::UpstreamError;

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

/// hex(SHA-256(JCS({"tool", "arguments"}))): what a claim is bound to (SPEC 7.1 r2).
pub fn call_digest(tool: &str, arguments: &Map<String, Value>) -> String {
    jcs_sha256_hex(&json!({"tool": tool, "arguments": arguments}))
}

/// What a standalone claim is bound to (SPEC 7.4 r3): hex(SHA-256(JCS({"action": action}))).
pub fn standalone_digest(action: &str) -> String {
    jcs_sha256_hex(&json!({ "action": action }))
}

/// The digest a claim is bound to; a standalone claim taken before r3 kept none, and is bound to its
/// action.
fn bound_digest(record: &ClaimRecord) -> Option<String> {
    match (&record.call_digest, record.kind) {
        (None, ClaimKind::Standalone) => Some(standalone_digest(&record.action)),
        (digest, _) => digest.clone(),
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
    /// Taken by a different call (the same idempotency key, other tool or arguments): refuse with 4002
    /// and leave it as it is.
    OtherCall(ClaimRecord),
}

/// A new PENDING record with claim time and receipt fields fixed now.
pub fn new_pending(
    kind: ClaimKind,
    request_id: &str,
    action: &str,
    agent_id: &str,
    session_id: Option<&str>,
    call_digest: Option<String>,
    team: &str,
) -> ClaimRecord {
    let claimed_at_ms = clock::now_millis();
    let claimed_at = clock::rfc3339_millis(claimed_at_ms);
    ClaimRecord {
        kind,
        request_id: request_id.to_string(),
        call_digest,
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
        taker: None,
        team: team.to_owned(),
    }
}

/// What an insert-if-absent of `pending` means, given the record it found (None: it was inserted).
pub fn classify(pending: ClaimRecord, existing: Option<ClaimRecord>) -> Taken {
    match existing {
        None => Taken::Proceed(pending),
        // Bound to the call (SPEC 7.1 r2, 7.4 r3) and to its team (SPEC 16): a SKIP never returns the
        // answer of a different call, nor of another team's.
        Some(existing)
            if bound_digest(&existing) != bound_digest(&pending)
                || existing.team != pending.team =>
        {
            Taken::OtherCall(existing)
        }
        Some(existing) if existing.status == ClaimStatus::Committed => Taken::Skip(existing),
        Some(existing) => Taken::Pending(existing),
    }
}

/// CLAIMABLE → PENDING; or what is already there. Durable with the caller's next audit event.
pub async fn take(store: &dyn Store, pending: ClaimRecord) -> StoreResult<Taken> {
    let existing = store.claim_insert(&pending).await?;
    Ok(classify(pending, existing))
}

/// PENDING → COMMITTED with the outcome. If someone else settled it first (an operator's resolution),
/// their record stands and is returned.
pub async fn commit(
    store: &dyn Store,
    pending: &ClaimRecord,
    outcome: ClaimOutcome,
) -> StoreResult<ClaimRecord> {
    let committed = committed(pending, outcome);
    if store.claim_replace(pending, Some(&committed)).await? {
        return Ok(committed);
    }
    store
        .claim_get(pending.kind, &pending.request_id)
        .await?
        .ok_or_else(|| {
            StoreError::Corrupt(format!(
                "claim {} vanished while settling",
                pending.request_id
            ))
        })
}

fn committed(pending: &ClaimRecord, outcome: ClaimOutcome) -> ClaimRecord {
    let mut committed = pending.clone();
    committed.status = ClaimStatus::Committed;
    committed.committed_at = Some(clock::rfc3339_millis(clock::now_millis()));
    committed.outcome = Some(outcome);
    committed
}

/// PENDING → COMMITTED with the tool's answer, as a settlement that rides in the call's final audit batch
/// (one commit for both); an operator's resolution that came first stands, as with [`commit`].
pub fn answered(pending: &ClaimRecord, response: &Value) -> ClaimSettlement {
    ClaimSettlement {
        pending: pending.clone(),
        settled: committed(
            pending,
            ClaimOutcome::Answer {
                response: response.clone(),
            },
        ),
    }
}

/// PENDING → COMMITTED without an answer: the tool ran, and the answer guard withheld what it sent
/// (SPEC 18); every SKIP refuses with 2011 again. Rides in the batch of the call's `AnswerGuarded` event.
pub fn withheld(pending: &ClaimRecord, kinds: Vec<String>) -> ClaimSettlement {
    ClaimSettlement {
        pending: pending.clone(),
        settled: committed(pending, ClaimOutcome::AnswerWithheld { kinds }),
    }
}

/// PENDING → CLAIMABLE: nothing of the call reached the tool. False when it was no longer that PENDING record.
pub async fn release(store: &dyn Store, pending: &ClaimRecord) -> StoreResult<bool> {
    store.claim_replace(pending, None).await
}

/// What a forward that brought no answer does to the call's PENDING claim (SPEC 7.2). Any answer, a
/// JSON-RPC error or an isError result included, is the tool's outcome: see [`answered`].
pub async fn settle_failed(
    store: &dyn Store,
    pending: &ClaimRecord,
    error: &UpstreamError,
) -> StoreResult<()> {
    match error {
        // Nothing reached the tool: a retry may run it.
        UpstreamError::Unavailable(_) | UpstreamError::NoRoute => {
            release(store, pending).await.map(drop)
        }
        // The tool ran; its answer is withheld now and on every SKIP.
        UpstreamError::TooLarge { limit } => {
            let withheld = ClaimOutcome::ResponseTooLarge { limit: *limit };
            commit(store, pending, withheld).await.map(drop)
        }
        // Sent, outcome unknown: the claim stays PENDING until an operator resolves it.
        UpstreamError::Timeout(_)
        | UpstreamError::BadResponse(_)
        | UpstreamError::InexactNumber(_) => Ok(()),
    }
}

/// Why a COMMITTED invoke claim gives no answer on SKIP.
#[derive(Debug, Clone, PartialEq)]
pub enum Withheld {
    /// The tool's answer was larger than the limit in force when it ran.
    WasTooLarge { limit: u64 },
    /// The stored answer is larger than the capability's current `max_response_size` (SPEC 7.2 r2).
    TooLargeNow { limit: u64 },
    /// The answer guard withheld the answer when the tool ran (SPEC 18): the kinds it found.
    Guarded { kinds: Vec<String> },
    /// The record holds no answer (never written by this gateway).
    Missing,
}

/// The answer a SKIP returns: the stored JSON-RPC response with the caller's id, held to the current
/// response cap.
pub fn skip_answer(
    record: &ClaimRecord,
    id: &Value,
    max_response_size: Option<u64>,
) -> Result<Value, Withheld> {
    let response = match &record.outcome {
        Some(ClaimOutcome::Answer { response }) => response,
        Some(ClaimOutcome::ResponseTooLarge { limit }) => {
            return Err(Withheld::WasTooLarge { limit: *limit })
        }
        Some(ClaimOutcome::AnswerWithheld { kinds }) => {
            return Err(Withheld::Guarded {
                kinds: kinds.clone(),
            })
        }
        Some(ClaimOutcome::Settled { .. }) | None => return Err(Withheld::Missing),
    };
    if let Some(limit) = max_response_size {
        let size = serde_json::to_vec(response).map_or(u64::MAX, |b| b.len() as u64);
        if size > limit {
            return Err(Withheld::TooLargeNow { limit });
        }
    }
    let mut answer = response.clone();
    if let Some(obj) = answer.as_object_mut() {
        obj.insert("id".into(), id.clone());
        obj.entry("jsonrpc").or_insert_with(|| json!("2.0"));
    }
    Ok(answer)
}

/// Why a manual resolution or settlement was refused.
#[derive(Debug, PartialEq)]
pub enum SettleError {
    NotFound,
    NotPending(Box<ClaimRecord>),
    /// Another operator took the standalone claim (SPEC 7.4 r3).
    NotTaker,
    Store(StoreError),
}

impl From<StoreError> for SettleError {
    fn from(err: StoreError) -> Self {
        SettleError::Store(err)
    }
}

/// How an operator resolves a PENDING invoke claim (SPEC 7.4).
pub enum ManualOutcome {
    /// A JSON-RPC response object that later SKIPs return.
    Committed(Value),
    Released,
}

/// Resolves a PENDING invoke claim by hand; only PENDING claims can be resolved.
/// Returns the new record (None once released) and the record it replaced.
pub async fn resolve(
    store: &dyn Store,
    request_id: &str,
    outcome: ManualOutcome,
    actor: &str,
    evidence: Option<String>,
) -> Result<(Option<ClaimRecord>, ClaimRecord), SettleError> {
    let current = store
        .claim_get(ClaimKind::Invoke, request_id)
        .await?
        .ok_or(SettleError::NotFound)?;
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
    if store.claim_replace(&current, next.as_ref()).await? {
        Ok((next, current))
    } else {
        // Settled by the call itself in the meantime: report what stands now.
        match store.claim_get(ClaimKind::Invoke, request_id).await? {
            Some(record) => Err(SettleError::NotPending(Box::new(record))),
            None => Err(SettleError::NotFound),
        }
    }
}

/// `POST /settle/{id}`: commits a standalone claim with its result, for the operator `settler` who took
/// it (or one holding `seal.admin`). Ok(None) when it was already committed (the first result stands);
/// otherwise the committed record.
pub async fn settle(
    store: &dyn Store,
    request_id: &str,
    result: Value,
    settler: &Settler<'_>,
) -> Result<Option<ClaimRecord>, SettleError> {
    let current = store
        .claim_get(ClaimKind::Standalone, request_id)
        .await?
        .ok_or(SettleError::NotFound)?;
    let taken_by_settler = current
        .taker
        .as_ref()
        .is_some_and(|taker| taker.identity().same_person(settler.identity));
    if !settler.admin && !taken_by_settler {
        return Err(SettleError::NotTaker);
    }
    if current.status == ClaimStatus::Committed {
        return Ok(None);
    }
    let mut committed = current.clone();
    committed.status = ClaimStatus::Committed;
    committed.committed_at = Some(clock::rfc3339_millis(clock::now_millis()));
    committed.outcome = Some(ClaimOutcome::Settled { result });
    if store.claim_replace(&current, Some(&committed)).await? {
        return Ok(Some(committed));
    }
    match store.claim_get(ClaimKind::Standalone, request_id).await? {
        Some(record) if record.status == ClaimStatus::Committed => Ok(None),
        Some(record) => Err(SettleError::NotPending(Box::new(record))),
        None => Err(SettleError::NotFound),
    }
}

/// Who settles a standalone claim: the operator's identity, and whether their token holds `seal.admin`.
pub struct Settler<'a> {
    pub identity: &'a Identity,
    pub admin: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::SqliteStore;

    fn store() -> (tempfile::TempDir, SqliteStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path()).unwrap();
        (dir, store)
    }

    fn invoke(id: &str, digest: &str) -> ClaimRecord {
        new_pending(
            ClaimKind::Invoke,
            id,
            "t",
            "a",
            Some("s"),
            Some(digest.into()),
            "default",
        )
    }

    fn standalone(id: &str) -> ClaimRecord {
        let mut record = new_pending(
            ClaimKind::Standalone,
            id,
            "transfer",
            "a",
            None,
            Some(standalone_digest("transfer")),
            "default",
        );
        // As a claim taken before r4 recorded its taker: the `sub` alone.
        record.taker = Some(crate::store::RecordedIdentity::Sub("op".into()));
        record
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

    /// What the audit writer does with a settlement that rides in its batch.
    async fn apply(store: &SqliteStore, settlement: ClaimSettlement) {
        assert!(store
            .claim_replace(&settlement.pending, Some(&settlement.settled))
            .await
            .unwrap());
    }

    #[tokio::test]
    async fn proceed_then_pending_then_skip_after_commit() {
        let (_dir, store) = store();
        let Taken::Proceed(pending) = take(&store, invoke("r", "d")).await.unwrap() else {
            panic!("first take must proceed")
        };
        assert!(
            matches!(take(&store, invoke("r", "d")).await.unwrap(), Taken::Pending(p) if p == pending)
        );
        let answer = json!({"jsonrpc": "2.0", "id": 1, "result": {"ok": true}});
        apply(&store, answered(&pending, &answer)).await;
        let Taken::Skip(skip) = take(&store, invoke("r", "d")).await.unwrap() else {
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

    #[tokio::test]
    async fn a_claim_is_bound_to_its_call() {
        let (_dir, store) = store();
        take(&store, invoke("r", "read /secret")).await.unwrap();
        let Taken::OtherCall(existing) =
            take(&store, invoke("r", "read /workspace")).await.unwrap()
        else {
            panic!("another call with the same request id must be refused")
        };
        assert_eq!(existing.call_digest.as_deref(), Some("read /secret"));
        assert_eq!(
            call_digest("t", &Map::new()),
            jcs_sha256_hex(&json!({"arguments": {}, "tool": "t"}))
        );
    }

    #[tokio::test]
    async fn a_claim_is_bound_to_its_team() {
        let (_dir, store) = store();
        take(&store, standalone("r")).await.unwrap();
        let mut ops = standalone("r");
        ops.team = "ops".into();
        assert!(matches!(
            take(&store, ops).await.unwrap(),
            Taken::OtherCall(_)
        ));
    }

    #[test]
    fn skip_answers_carry_the_callers_id_under_the_current_cap() {
        let mut record = invoke("r", "d");
        record.status = ClaimStatus::Committed;
        record.outcome = Some(ClaimOutcome::Answer {
            response: json!({"jsonrpc": "2.0", "id": 1, "result": {"text": "x".repeat(100)}}),
        });
        let answer = skip_answer(&record, &json!("mine"), Some(1000)).unwrap();
        assert_eq!(answer["id"], "mine");
        assert_eq!(
            skip_answer(&record, &json!(1), Some(50)),
            Err(Withheld::TooLargeNow { limit: 50 })
        );
        record.outcome = Some(ClaimOutcome::ResponseTooLarge { limit: 9 });
        assert_eq!(
            skip_answer(&record, &json!(1), None),
            Err(Withheld::WasTooLarge { limit: 9 })
        );
    }

    #[tokio::test]
    async fn upstream_outcomes_settle_the_claim_by_spec_7_2() {
        let (_dir, store) = store();
        let cases: [(Result<Value, UpstreamError>, Option<ClaimStatus>); 5] = [
            (
                Ok(json!({"jsonrpc": "2.0", "id": 1, "error": {"code": 1, "message": "no"}})),
                Some(ClaimStatus::Committed),
            ),
            (Err(UpstreamError::Unavailable("refused".into())), None),
            (
                Err(UpstreamError::TooLarge { limit: 5 }),
                Some(ClaimStatus::Committed),
            ),
            (
                Err(UpstreamError::Timeout("slow".into())),
                Some(ClaimStatus::Pending),
            ),
            (
                Err(UpstreamError::BadResponse("junk".into())),
                Some(ClaimStatus::Pending),
            ),
        ];
        for (i, (outcome, expected)) in cases.into_iter().enumerate() {
            let id = format!("c{i}");
            let Taken::Proceed(pending) = take(&store, invoke(&id, "d")).await.unwrap() else {
                panic!()
            };
            match &outcome {
                Ok(answer) => apply(&store, answered(&pending, answer)).await,
                Err(error) => settle_failed(&store, &pending, error).await.unwrap(),
            }
            let now = store.claim_get(ClaimKind::Invoke, &id).await.unwrap();
            assert_eq!(now.map(|c| c.status), expected, "case {i}");
        }
    }

    #[tokio::test]
    async fn release_reopens_and_a_released_claim_cannot_be_committed() {
        let (_dir, store) = store();
        let Taken::Proceed(pending) = take(&store, invoke("r", "d")).await.unwrap() else {
            panic!()
        };
        assert!(release(&store, &pending).await.unwrap());
        assert!(!release(&store, &pending).await.unwrap());
        assert!(commit(
            &store,
            &pending,
            ClaimOutcome::ResponseTooLarge { limit: 1 }
        )
        .await
        .is_err());
        assert!(matches!(
            take(&store, invoke("r", "d")).await.unwrap(),
            Taken::Proceed(_)
        ));
    }

    #[tokio::test]
    async fn operator_resolution_only_for_pending_invoke_claims() {
        let (_dir, store) = store();
        assert_eq!(
            resolve(&store, "missing", ManualOutcome::Released, "op", None)
                .await
                .unwrap_err(),
            SettleError::NotFound
        );
        take(&store, standalone("r")).await.unwrap();
        assert_eq!(
            resolve(&store, "r", ManualOutcome::Released, "op", None)
                .await
                .unwrap_err(),
            SettleError::NotFound,
            "a standalone claim is not resolved as an invoke claim"
        );
        take(&store, invoke("r", "d")).await.unwrap();
        let answer = json!({"jsonrpc": "2.0", "id": 0, "result": {"done": 1}});
        let (next, _) = resolve(
            &store,
            "r",
            ManualOutcome::Committed(answer),
            "op",
            Some("checked the ledger".into()),
        )
        .await
        .unwrap();
        let next = next.unwrap();
        assert_eq!(next.status, ClaimStatus::Committed);
        assert_eq!(next.resolution.as_ref().unwrap().actor, "op");
        assert!(matches!(
            resolve(&store, "r", ManualOutcome::Released, "op", None).await,
            Err(SettleError::NotPending(_))
        ));
        take(&store, invoke("q", "d")).await.unwrap();
        let (gone, _) = resolve(&store, "q", ManualOutcome::Released, "op", None)
            .await
            .unwrap();
        assert!(gone.is_none());
        assert_eq!(store.claim_get(ClaimKind::Invoke, "q").await.unwrap(), None);
    }

    fn operator(iss: &str, sub: &str) -> Identity {
        Identity {
            iss: iss.into(),
            sub: sub.into(),
            name: None,
            via: crate::identity::Via::Key,
        }
    }

    #[tokio::test]
    async fn settle_commits_standalone_claims_once() {
        let (_dir, store) = store();
        let op = operator(crate::identity::LOCAL_ISSUER, "op");
        let taker = Settler {
            identity: &op,
            admin: false,
        };
        assert_eq!(
            settle(&store, "none", json!(1), &taker).await.unwrap_err(),
            SettleError::NotFound
        );
        take(&store, invoke("s", "d")).await.unwrap();
        assert_eq!(
            settle(&store, "s", json!(1), &taker).await.unwrap_err(),
            SettleError::NotFound,
            "an invoke claim is never settled through /settle"
        );
        take(&store, standalone("s")).await.unwrap();
        // Another person, and the same `sub` from another issuer, are not the taker.
        for (iss, sub) in [
            (crate::identity::LOCAL_ISSUER, "other"),
            ("https://idp", "op"),
        ] {
            let someone = operator(iss, sub);
            let stranger = Settler {
                identity: &someone,
                admin: false,
            };
            assert_eq!(
                settle(&store, "s", json!({"forged": true}), &stranger)
                    .await
                    .unwrap_err(),
                SettleError::NotTaker
            );
        }
        assert!(settle(&store, "s", json!({"tx": 1}), &taker)
            .await
            .unwrap()
            .is_some());
        let root = operator(crate::identity::LOCAL_ISSUER, "root");
        let admin = Settler {
            identity: &root,
            admin: true,
        };
        assert!(settle(&store, "s", json!({"tx": 2}), &admin)
            .await
            .unwrap()
            .is_none());
        let record = store
            .claim_get(ClaimKind::Standalone, "s")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            record.outcome,
            Some(ClaimOutcome::Settled {
                result: json!({"tx": 1})
            })
        );
    }
}
