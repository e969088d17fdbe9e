//! What every store must do, as test bodies shared by the store implementations' unit tests: each takes
//! a fresh store, so SQLite and PostgreSQL are held to the same behaviour by the same assertions.

use serde_json::json;

use super::{
    Admission, Admitted, ApprovalCursor, ApprovalRecord, ApprovalStatus, ChainHead, ClaimCursor,
    ClaimKind, ClaimOutcome, ClaimRecord, ClaimSettlement, ClaimStatus, ConsoleSessionRecord,
    LiveCounts, RecordedIdentity, SeenSignature, SessionLabel, SessionRecord, ShadowTally, Shelf,
    SignInAttempt, Store, StoreError, StoredContext, StoredEvent, ToolPin,
};
use crate::window::SlidingWindow;

/// An event written as JSON, as the stores take it.
pub(crate) fn stored(event: serde_json::Value) -> StoredEvent {
    StoredEvent::of_value(&event).unwrap()
}

/// A PENDING claim fixed by its kind, id and claim time.
pub(crate) fn claim(kind: ClaimKind, id: &str, ms: i64) -> ClaimRecord {
    ClaimRecord {
        kind,
        request_id: id.into(),
        call_digest: None,
        action: "fs.write".into(),
        agent_id: "agent".into(),
        session_id: None,
        status: ClaimStatus::Pending,
        claimed_at: crate::clock::rfc3339_millis(ms),
        claimed_at_ms: ms,
        action_ref: "ref".into(),
        committed_at: None,
        outcome: None,
        resolution: None,
        taker: None,
        team: "default".into(),
    }
}

pub(crate) async fn claim_insert_is_insert_if_absent_and_replace_is_compare_and_set(
    store: &dyn Store,
) {
    let first = claim(ClaimKind::Invoke, "a", 1);
    assert!(store.claim_insert(&first).await.unwrap().is_none());
    assert_eq!(
        store
            .claim_insert(&claim(ClaimKind::Invoke, "a", 2))
            .await
            .unwrap(),
        Some(first.clone())
    );
    let mut committed = first.clone();
    committed.status = ClaimStatus::Committed;
    // A NUL inside a tool's answer is kept (jsonb would refuse it).
    committed.outcome = Some(ClaimOutcome::Answer {
        response: json!({"ok": "a\u{0}b", "big": 9_007_199_254_740_993u64}),
    });
    assert!(store.claim_replace(&first, Some(&committed)).await.unwrap());
    assert!(!store.claim_replace(&first, None).await.unwrap());
    assert_eq!(
        store.claim_get(ClaimKind::Invoke, "a").await.unwrap(),
        Some(committed.clone())
    );
    assert!(store.claim_replace(&committed, None).await.unwrap());
    assert_eq!(store.claim_get(ClaimKind::Invoke, "a").await.unwrap(), None);
}

pub(crate) async fn the_two_claim_namespaces_never_meet_and_pages_run_newest_first(
    store: &dyn Store,
) {
    store
        .claim_insert(&claim(ClaimKind::Standalone, "same", 1))
        .await
        .unwrap();
    assert_eq!(
        store.claim_get(ClaimKind::Invoke, "same").await.unwrap(),
        None
    );
    assert!(store
        .claim_insert(&claim(ClaimKind::Invoke, "same", 1))
        .await
        .unwrap()
        .is_none());
    for (i, id) in ["x", "y", "z"].iter().enumerate() {
        store
            .claim_insert(&claim(ClaimKind::Invoke, id, 10 + i as i64))
            .await
            .unwrap();
    }
    let ids = |page: &[ClaimRecord]| {
        page.iter()
            .map(|c| format!("{}:{}", c.kind.as_str(), c.request_id))
            .collect::<Vec<_>>()
    };
    store.sync().await.unwrap();
    let (page, more) = store.claim_page(None, 2, &|_| true).await.unwrap();
    assert_eq!(
        (ids(&page), more),
        (vec!["invoke:z".into(), "invoke:y".into()], true)
    );
    let cursor = ClaimCursor {
        claimed_at_ms: 11,
        kind: ClaimKind::Invoke,
        request_id: "y".into(),
    };
    let (page, more) = store
        .claim_page(Some(&cursor), 10, &|_| true)
        .await
        .unwrap();
    // Same instant: the standalone claim sorts after the invoke one, as in the embedded store.
    assert_eq!(
        (ids(&page), more),
        (
            vec![
                "invoke:x".into(),
                "standalone:same".into(),
                "invoke:same".into()
            ],
            false
        )
    );
    let (page, _) = store
        .claim_page(None, 10, &|c| c.kind == ClaimKind::Standalone)
        .await
        .unwrap();
    assert_eq!(ids(&page), ["standalone:same"]);
}

/// A live session fixed by its id, context and agent.
pub(crate) fn session(id: &str, context: &str, agent: Option<&str>) -> SessionRecord {
    SessionRecord {
        session_id: id.into(),
        public_key: Some("k".into()),
        security_context: context.into(),
        expires_at: 10,
        agent_id: agent.map(str::to_string),
        workload_id: None,
        allowed_tool_patterns: vec!["*".into()],
        max_calls: None,
        security_token: None,
        created_at_ms: 1,
        revoked_at_ms: None,
        team: "default".into(),
        registered_by: None,
        person: None,
    }
}

pub(crate) async fn session_pages_run_in_id_order_and_live_counts_count(store: &dyn Store) {
    // Inserted out of order; "B" sorts before "a" in byte order on both stores.
    for (id, context) in [("s2", "ctx"), ("a", "other"), ("s1", "ctx"), ("B", "ctx")] {
        store
            .session_insert(&session(id, context, Some(id)))
            .await
            .unwrap();
    }
    let ids = |page: &[SessionRecord]| {
        page.iter()
            .map(|s| s.session_id.clone())
            .collect::<Vec<_>>()
    };
    store.sync().await.unwrap();
    let (page, more) = store.session_page(None, 2, &|_| true).await.unwrap();
    assert_eq!((ids(&page), more), (vec!["B".into(), "a".into()], true));
    let (page, more) = store.session_page(Some("a"), 2, &|_| true).await.unwrap();
    assert_eq!((ids(&page), more), (vec!["s1".into(), "s2".into()], false));
    let (page, more) = store
        .session_page(None, 2, &|s| s.security_context == "ctx")
        .await
        .unwrap();
    assert_eq!((ids(&page), more), (vec!["B".into(), "s1".into()], true));
    let (page, more) = store
        .session_page(Some("s1"), 5, &|s| s.security_context == "ctx")
        .await
        .unwrap();
    assert_eq!((ids(&page), more), (vec!["s2".into()], false));

    // Live: neither revoked nor expired (expires_at 10); pending: PENDING claims only.
    let live = session("s1", "ctx", Some("s1"));
    let mut revoked = live.clone();
    revoked.revoked_at_ms = Some(2);
    assert!(store.session_replace(&live, &revoked).await.unwrap());
    let first = claim(ClaimKind::Invoke, "p", 1);
    store.claim_insert(&first).await.unwrap();
    let mut committed = claim(ClaimKind::Standalone, "c", 2);
    store.claim_insert(&committed).await.unwrap();
    let pending = committed.clone();
    committed.status = ClaimStatus::Committed;
    assert!(store
        .claim_replace(&pending, Some(&committed))
        .await
        .unwrap());
    store.sync().await.unwrap();
    assert_eq!(
        store.live_counts(9).await.unwrap(),
        LiveCounts {
            sessions: 3,
            pending_claims: 1,
            pending_approvals: 0,
        }
    );
    assert_eq!(store.live_counts(10).await.unwrap().sessions, 0);
    // A released claim is no longer pending; a lost compare-and-set changes no count.
    assert!(!store.claim_replace(&pending, None).await.unwrap());
    assert!(store.claim_replace(&first, None).await.unwrap());
    store.sync().await.unwrap();
    assert_eq!(store.live_counts(9).await.unwrap().pending_claims, 0);
}

pub(crate) async fn sessions_insert_once_and_replace_by_compare_and_set(store: &dyn Store) {
    let record = SessionRecord {
        session_id: "s".into(),
        public_key: Some("k".into()),
        security_context: "ctx".into(),
        expires_at: 10,
        agent_id: None,
        workload_id: None,
        allowed_tool_patterns: vec!["fs.*".into()],
        max_calls: Some(3),
        security_token: None,
        created_at_ms: 1,
        revoked_at_ms: None,
        // A team other than `default` is written, and read back (SPEC 16).
        team: "payments".into(),
        registered_by: None,
        person: None,
    };
    assert_eq!(store.session_insert(&record).await.unwrap(), None);
    let mut other = record.clone();
    other.security_context = "other".into();
    assert_eq!(
        store.session_insert(&other).await.unwrap(),
        Some(record.clone())
    );
    let mut revoked = record.clone();
    revoked.public_key = None;
    revoked.revoked_at_ms = Some(2);
    assert!(!store.session_replace(&other, &revoked).await.unwrap());
    assert!(store.session_replace(&record, &revoked).await.unwrap());
    assert_eq!(store.session_get("s").await.unwrap(), Some(revoked));
    assert_eq!(store.session_get("nobody").await.unwrap(), None);
}

pub(crate) async fn signatures_are_remembered_once_and_purged_after_their_window(
    store: &dyn Store,
) {
    assert!(store.remember_signature(&[1; 64], 1_000).await.unwrap());
    assert!(!store.remember_signature(&[1; 64], 1_000).await.unwrap());
    assert!(store.remember_signature(&[2; 64], 5_000).await.unwrap());
    assert_eq!(store.purge_signatures(2_000).await.unwrap(), 1);
    assert!(store.remember_signature(&[1; 64], 9_000).await.unwrap());
    assert!(!store.remember_signature(&[2; 64], 9_000).await.unwrap());
}

pub(crate) async fn admit_charges_rate_then_budget_then_claims_and_refusals_charge_nothing(
    store: &dyn Store,
) {
    let admission = |n: i64| Admission {
        rate: Some(("rate".into(), SlidingWindow::new(3, 60_000))),
        // The gateway's budget keys hold a NUL separator (session::budget_key).
        budget: Some((crate::session::budget_key("s1"), 2)),
        claim: Some(claim(ClaimKind::Invoke, &format!("c{n}"), n)),
        now_ms: 1_000 + n,
        ..Admission::default()
    };
    for n in 0..2 {
        assert_eq!(
            store.admit(&admission(n)).await.unwrap(),
            Admitted::Charged {
                existing_claim: None
            }
        );
    }
    assert_eq!(
        store.admit(&admission(2)).await.unwrap(),
        Admitted::BudgetExhausted
    );
    assert_eq!(
        store
            .counter_get(&crate::session::budget_key("s1"))
            .await
            .unwrap(),
        Some(2)
    );
    assert_eq!(
        store.claim_get(ClaimKind::Invoke, "c2").await.unwrap(),
        None
    );
    let rate_only = |n: i64| Admission {
        rate: Some(("rate".into(), SlidingWindow::new(3, 60_000))),
        now_ms: 1_000 + n,
        ..Admission::default()
    };
    assert!(matches!(
        store.admit(&rate_only(3)).await.unwrap(),
        Admitted::Charged { .. }
    ));
    assert!(matches!(
        store.admit(&rate_only(4)).await.unwrap(),
        Admitted::RateLimited { retry_after_ms } if retry_after_ms > 0
    ));
    // A claim that exists is returned, and the call is still charged.
    let again = Admission {
        claim: Some(claim(ClaimKind::Invoke, "c0", 99)),
        ..Admission::default()
    };
    assert_eq!(
        store.admit(&again).await.unwrap(),
        Admitted::Charged {
            existing_claim: Some(Box::new(claim(ClaimKind::Invoke, "c0", 0)))
        }
    );
}

/// Without a rate window (PostgreSQL answers these in one statement): the budget and the claim are charged
/// together, an exhausted budget takes no claim, and an existing claim is returned with the call charged.
pub(crate) async fn admit_without_a_rate_window_charges_the_budget_and_the_claim_together(
    store: &dyn Store,
) {
    let budget_key = crate::session::budget_key("s2");
    let admission = |request_id: &str, at: i64| Admission {
        budget: Some((budget_key.clone(), 3)),
        claim: Some(claim(ClaimKind::Invoke, request_id, at)),
        now_ms: 1_000,
        ..Admission::default()
    };
    assert_eq!(
        store.admit(&admission("n1", 1)).await.unwrap(),
        Admitted::Charged {
            existing_claim: None
        }
    );
    assert_eq!(
        store.admit(&admission("n1", 2)).await.unwrap(),
        Admitted::Charged {
            existing_claim: Some(Box::new(claim(ClaimKind::Invoke, "n1", 1)))
        }
    );
    let budget_only = Admission {
        budget: Some((budget_key.clone(), 3)),
        ..Admission::default()
    };
    assert!(matches!(
        store.admit(&budget_only).await.unwrap(),
        Admitted::Charged {
            existing_claim: None
        }
    ));
    assert_eq!(
        store.admit(&admission("n2", 3)).await.unwrap(),
        Admitted::BudgetExhausted
    );
    assert_eq!(
        store.admit(&budget_only).await.unwrap(),
        Admitted::BudgetExhausted
    );
    assert_eq!(store.counter_get(&budget_key).await.unwrap(), Some(3));
    assert_eq!(
        store.claim_get(ClaimKind::Invoke, "n2").await.unwrap(),
        None
    );
    let no_budget = Admission {
        budget: Some((crate::session::budget_key("s3"), 0)),
        claim: Some(claim(ClaimKind::Invoke, "n3", 4)),
        ..Admission::default()
    };
    assert_eq!(
        store.admit(&no_budget).await.unwrap(),
        Admitted::BudgetExhausted
    );
    assert_eq!(
        store.claim_get(ClaimKind::Invoke, "n3").await.unwrap(),
        None
    );
}

/// The replay record rides in the admission (one statement or transaction on PostgreSQL, with or without a
/// rate window): a seen signature stops the call before anything is charged or claimed, and a call refused
/// for its rate or budget keeps its signature remembered.
pub(crate) async fn admit_writes_the_replay_record_first_and_keeps_it_on_refusal(
    store: &dyn Store,
) {
    let seen = |byte: u8| {
        Some(SeenSignature {
            signature: [byte; 64],
            expires_at_ms: 60_000,
        })
    };
    for (session, rate) in [
        ("s4", None),
        (
            "s5",
            Some(("rate-s5".to_owned(), SlidingWindow::new(1, 60_000))),
        ),
    ] {
        let budget_key = crate::session::budget_key(session);
        let request_id = |n: u8| format!("{session}-r{n}");
        let admission = |byte: u8, n: u8| Admission {
            signature: seen(byte),
            rate: rate.clone(),
            budget: Some((budget_key.clone(), 1)),
            claim: Some(claim(ClaimKind::Invoke, &request_id(n), 1)),
            now_ms: 1_000,
        };
        let base = if rate.is_some() { 20 } else { 10 };
        assert_eq!(
            store.admit(&admission(base, 1)).await.unwrap(),
            Admitted::Charged {
                existing_claim: None
            }
        );
        // The same signature again: refused before the budget, which would refuse it otherwise.
        assert_eq!(
            store.admit(&admission(base, 2)).await.unwrap(),
            Admitted::Replayed
        );
        assert_eq!(store.counter_get(&budget_key).await.unwrap(), Some(1));
        assert_eq!(
            store
                .claim_get(ClaimKind::Invoke, &request_id(2))
                .await
                .unwrap(),
            None
        );
        // A new signature over the limit is refused, charges nothing, and is remembered all the same.
        let refused = store.admit(&admission(base + 1, 3)).await.unwrap();
        assert!(
            matches!(
                refused,
                Admitted::BudgetExhausted | Admitted::RateLimited { .. }
            ),
            "{refused:?}"
        );
        assert_eq!(store.counter_get(&budget_key).await.unwrap(), Some(1));
        assert!(!store
            .remember_signature(&[base + 1; 64], 60_000)
            .await
            .unwrap());
    }
}

/// A claim's settlement rides in an audit batch (the call's final event): written with the batch, not
/// when the batch is refused for a moved head, and a compare-and-set that leaves a claim changed
/// meanwhile as it is.
pub(crate) async fn a_settlement_is_written_with_its_batch_and_only_then(store: &dyn Store) {
    let genesis = ChainHead::genesis();
    let event = |seq: u64| stored(json!({"seq": seq, "hash": format!("h{seq}")}));
    let pending = claim(ClaimKind::Invoke, "settled", 1);
    assert_eq!(store.claim_insert(&pending).await.unwrap(), None);
    let mut committed = pending.clone();
    committed.status = ClaimStatus::Committed;
    committed.outcome = Some(ClaimOutcome::Answer {
        response: json!({"jsonrpc": "2.0", "id": 1, "result": {}}),
    });
    let settlement = ClaimSettlement {
        pending: pending.clone(),
        settled: committed.clone(),
    };
    store.append(&genesis, &[event(1)], &[]).await.unwrap();
    // Chained after a head that is no longer the store's: nothing is written, the claim included.
    assert_eq!(
        store
            .append(&genesis, &[event(1)], std::slice::from_ref(&settlement))
            .await,
        Err(StoreError::HeadMoved)
    );
    assert_eq!(settled_now(store).await, pending);
    let head = store.head().await.unwrap().unwrap();
    store
        .append(&head, &[event(2)], std::slice::from_ref(&settlement))
        .await
        .unwrap();
    assert_eq!(settled_now(store).await, committed);
    // The same settlement again finds the claim changed, and leaves it as it is.
    let mut other = committed.clone();
    other.outcome = None;
    let stale = ClaimSettlement {
        pending,
        settled: other,
    };
    let head = store.head().await.unwrap().unwrap();
    store.append(&head, &[event(3)], &[stale]).await.unwrap();
    assert_eq!(settled_now(store).await, committed);
    assert_eq!(store.head().await.unwrap().unwrap().seq, 3);
}

/// SPEC 19: the labels a completion event names are the session's with the batch that holds the event,
/// never without it; a label held keeps the seq that first brought it; other sessions hold none.
pub(crate) async fn labels_are_written_with_their_batch_and_only_then(store: &dyn Store) {
    let genesis = ChainHead::genesis();
    let event = |seq: u64, session: &str, labels: &[&str]| {
        stored(
            json!({"seq": seq, "hash": format!("h{seq}"), "session_id": session, "labels_added": labels}),
        )
    };
    let plain = stored(json!({"seq": 1, "hash": "h1", "session_id": "s"}));
    store.append(&genesis, &[plain], &[]).await.unwrap();
    assert_eq!(store.session_labels("s").await.unwrap(), []);
    // Chained after a head that is no longer the store's: no label either.
    assert_eq!(
        store
            .append(&genesis, &[event(1, "s", &["untrusted"])], &[])
            .await,
        Err(StoreError::HeadMoved)
    );
    assert_eq!(store.session_labels("s").await.unwrap(), []);
    let head = store.head().await.unwrap().unwrap();
    let batch = [
        event(2, "s", &["untrusted", "mail"]),
        event(3, "other", &["private"]),
        event(4, "s", &["untrusted", "private"]),
    ];
    store.append(&head, &batch, &[]).await.unwrap();
    let held = |label: &str, seq: u64| SessionLabel {
        label: label.into(),
        seq,
    };
    assert_eq!(
        store.session_labels("s").await.unwrap(),
        [held("mail", 2), held("untrusted", 2), held("private", 4)]
    );
    assert_eq!(
        store.session_labels("other").await.unwrap(),
        [held("private", 3)]
    );
    assert_eq!(store.session_labels("nobody").await.unwrap(), []);
}

async fn settled_now(store: &dyn Store) -> ClaimRecord {
    store
        .claim_get(ClaimKind::Invoke, "settled")
        .await
        .unwrap()
        .unwrap()
}

/// A pending approval request of session `s` for call `digest`, made at `ms`.
fn approval(id: &str, digest: &str, ms: i64) -> ApprovalRecord {
    ApprovalRecord {
        approval_id: id.into(),
        status: ApprovalStatus::Pending,
        session_id: "s".into(),
        sub: "agent".into(),
        tool: "pay.send".into(),
        // A NUL and a number beyond 2^53 survive the store unchanged.
        arguments: json!({"to": "a\u{0}b", "cents": 9_007_199_254_740_993u64})
            .as_object()
            .cloned()
            .unwrap_or_default(),
        call_digest: digest.into(),
        context: "c".into(),
        context_version: "v".into(),
        requested_at_ms: ms,
        expires_at_ms: ms + 900_000,
        expires_secs: 900,
        decided_at_ms: None,
        decided_by: None,
        reason: None,
        team: "ops".into(),
        grants: Vec::new(),
        approvers: 1,
        separate_from_registrant: false,
        registered_by: None,
        flow_rule: None,
    }
}

pub(crate) async fn approvals_change_by_compare_and_set_and_one_request_is_current_per_call(
    store: &dyn Store,
) {
    let first = approval("a1", "d", 10);
    assert!(store.approval_insert(&first, None).await.unwrap());
    // A second first request for the same call loses, and leaves nothing behind.
    assert!(!store
        .approval_insert(&approval("a2", "d", 11), None)
        .await
        .unwrap());
    assert_eq!(store.approval_get("a2").await.unwrap(), None);
    assert_eq!(
        store.approval_current("s", "d").await.unwrap(),
        Some(first.clone())
    );
    assert_eq!(store.approval_current("s", "other").await.unwrap(), None);

    let mut granted = first.clone();
    granted.status = ApprovalStatus::Granted;
    granted.decided_by = Some(RecordedIdentity::Sub("op".into()));
    assert!(store.approval_replace(&first, &granted).await.unwrap());
    // Deciding from a stale read fails: one decision, one use.
    let mut denied = first.clone();
    denied.status = ApprovalStatus::Denied;
    assert!(!store.approval_replace(&first, &denied).await.unwrap());
    let mut used = granted.clone();
    used.status = ApprovalStatus::Used;
    assert!(store.approval_replace(&granted, &used).await.unwrap());
    assert!(!store.approval_replace(&granted, &used).await.unwrap());
    assert_eq!(store.approval_get("a1").await.unwrap(), Some(used.clone()));

    // A new request replaces the current one only if it is still the one the caller saw.
    let second = approval("a3", "d", 20);
    assert!(!store.approval_insert(&second, Some("stale")).await.unwrap());
    assert!(store.approval_insert(&second, Some("a1")).await.unwrap());
    assert_eq!(
        store.approval_current("s", "d").await.unwrap(),
        Some(second)
    );
    assert!(store
        .approval_insert(&approval("a4", "e", 15), None)
        .await
        .unwrap());

    store.sync().await.unwrap();
    let (page, more) = store.approval_page(None, 2, &|_| true).await.unwrap();
    let ids: Vec<&str> = page.iter().map(|a| a.approval_id.as_str()).collect();
    assert_eq!((ids, more), (vec!["a3", "a4"], true));
    let cursor = ApprovalCursor {
        requested_at_ms: 15,
        approval_id: "a4".into(),
    };
    let (rest, more) = store
        .approval_page(Some(&cursor), 2, &|_| true)
        .await
        .unwrap();
    assert_eq!(rest, vec![used]);
    assert!(!more);
    let (pending, _) = store
        .approval_page(None, 10, &|a| a.status == ApprovalStatus::Pending)
        .await
        .unwrap();
    assert_eq!(pending.len(), 2);
    assert_eq!(store.live_counts(0).await.unwrap().pending_approvals, 2);
}

/// Retention takes claims that are settled and approvals decided for good (denied, expired, used) from
/// before the cutoff, once their decision's force is over (SPEC 20 rule 1: `expires_secs` after the
/// decision, or after the expiry); a PENDING claim, a pending request and an unused grant stay, whatever
/// their age.
pub(crate) async fn retention_removes_only_what_is_finished(store: &dyn Store) {
    let mut finished = Vec::new();
    for (id, status) in [
        ("pending", ApprovalStatus::Pending),
        ("granted", ApprovalStatus::Granted),
        ("denied", ApprovalStatus::Denied),
        ("used", ApprovalStatus::Used),
        ("expired", ApprovalStatus::Expired),
    ] {
        let mut record = approval(id, id, 10);
        assert!(store.approval_insert(&record, None).await.unwrap());
        if status != ApprovalStatus::Pending {
            let before = record.clone();
            record.status = status;
            assert!(store.approval_replace(&before, &record).await.unwrap());
        }
        finished.push(record);
    }
    assert!(store
        .approval_insert(&approval("young", "y", 1_000), None)
        .await
        .unwrap());
    store.sync().await.unwrap();
    // The denial and the use are in force until 900 010, the expiry a further 900 s.
    for (now_ms, removed_now, gone) in [
        (900_009, 0, &[][..]),
        (900_010, 2, &["denied", "used"][..]),
        (1_800_009, 0, &["denied", "used"][..]),
        (1_800_010, 1, &["denied", "used", "expired"][..]),
    ] {
        let (_, approvals) = store.settled_remove_before(500, now_ms).await.unwrap();
        assert_eq!(approvals, removed_now, "at {now_ms}");
        for record in &finished {
            let id = record.approval_id.as_str();
            let kept = store.approval_get(id).await.unwrap().is_some();
            assert_eq!(kept, !gone.contains(&id), "{id} at {now_ms}");
        }
    }
    assert!(store.approval_get("young").await.unwrap().is_some());
}

fn sign_in(state: &str, created_at_ms: i64) -> SignInAttempt {
    SignInAttempt {
        state: state.into(),
        nonce: format!("nonce-{state}"),
        pkce_verifier: "verifier".into(),
        redirect_uri: "https://gw/console/callback".into(),
        created_at_ms,
    }
}

/// A `state` is taken once; attempts made before the horizon are forgotten when another is kept.
pub(crate) async fn a_sign_in_is_taken_once_and_old_ones_are_forgotten(store: &dyn Store) {
    store
        .sign_in_insert(&sign_in("old", 1_000), 0)
        .await
        .unwrap();
    store
        .sign_in_insert(&sign_in("new", 9_000), 5_000)
        .await
        .unwrap();
    assert_eq!(store.sign_in_take("old").await.unwrap(), None);
    assert_eq!(
        store.sign_in_take("new").await.unwrap(),
        Some(sign_in("new", 9_000))
    );
    assert_eq!(store.sign_in_take("new").await.unwrap(), None);
}

/// Console sessions are found by their hash, touched in place, ended once, and those that ended are
/// forgotten when another starts.
pub(crate) async fn console_sessions_are_kept_touched_and_ended(store: &dyn Store) {
    let session = |id_hash: &str, last_used_ms: i64| ConsoleSessionRecord {
        id_hash: id_hash.into(),
        iss: "https://idp".into(),
        sub: "ann".into(),
        name: Some("Ann".into()),
        groups: vec!["security".into()],
        csrf_token: "csrf".into(),
        created_at_ms: 1_000,
        last_used_ms,
        expires_at_ms: 100_000,
        idle_ms: 10_000,
    };
    store
        .console_session_insert(&session("a", 1_000), 1_000)
        .await
        .unwrap();
    store
        .console_session_insert(&session("b", 1_000), 1_000)
        .await
        .unwrap();
    let touched = session("a", 50_000);
    store.console_session_touch(&touched).await.unwrap();
    assert_eq!(store.console_session_get("a").await.unwrap(), Some(touched));
    // "b" ended at 11 000 (idle): starting "c" later forgets it; "a", used at 50 000, stays.
    store
        .console_session_insert(&session("c", 55_000), 55_000)
        .await
        .unwrap();
    assert_eq!(store.console_session_get("b").await.unwrap(), None);
    assert!(store.console_session_delete("a").await.unwrap());
    assert!(!store.console_session_delete("a").await.unwrap());
    assert_eq!(store.console_session_get("a").await.unwrap(), None);
    // Touching an ended session does not bring it back.
    store
        .console_session_touch(&session("a", 60_000))
        .await
        .unwrap();
    assert_eq!(store.console_session_get("a").await.unwrap(), None);
}

fn tool_pin(tool: &str, sha: &str, ms: i64) -> ToolPin {
    ToolPin {
        upstream: "fs".into(),
        tool: tool.into(),
        definition_sha256: sha.into(),
        definition: json!({"name": tool, "description": sha, "inputSchema": {"type": "object"}}),
        pinned_at_ms: ms,
        accepted_by: None,
    }
}

/// SPEC 18: the first pin of a tool wins (replicas racing at first sight agree on it), an accepted one
/// replaces it, and a withheld definition is reported once.
pub(crate) async fn tool_pins_are_first_wins_then_replaced_and_sightings_count_once(
    store: &dyn Store,
) {
    assert!(store.tool_pins().await.unwrap().is_empty());
    let first = tool_pin("read", "aa", 1);
    assert_eq!(store.tool_pin_first(&first).await.unwrap(), first);
    // A second first sighting (another replica) gets the pin that won.
    assert_eq!(
        store
            .tool_pin_first(&tool_pin("read", "bb", 2))
            .await
            .unwrap(),
        first
    );
    let other = tool_pin("write", "cc", 3);
    store.tool_pin_first(&other).await.unwrap();
    let mut accepted = tool_pin("read", "bb", 4);
    accepted.accepted_by = Some(RecordedIdentity::Sub("alice".into()));
    store.tool_pin_put(&accepted).await.unwrap();
    assert_eq!(store.tool_pins().await.unwrap(), vec![accepted, other]);

    assert!(store
        .tool_sighting_first("fs", "read", "bb", 5)
        .await
        .unwrap());
    assert!(!store
        .tool_sighting_first("fs", "read", "bb", 6)
        .await
        .unwrap());
    assert!(store
        .tool_sighting_first("fs", "read", "cc", 7)
        .await
        .unwrap());
    assert!(store
        .tool_sighting_first("web", "read", "bb", 8)
        .await
        .unwrap());
}

fn tally(version: &str, tool: &str, shadow: &str, calls: u64, first_at_ms: i64) -> ShadowTally {
    ShadowTally {
        context: "ci".into(),
        version: version.into(),
        tool: tool.into(),
        live: "allow".into(),
        shadow: shadow.into(),
        calls,
        first_at_ms,
    }
}

/// SPEC 6.4 r4: a shadow is kept apart from the context of its name, its tallies add up per version and
/// keep their first time, and setting it again or removing it starts the count over.
pub(crate) async fn shadows_are_kept_apart_and_their_tallies_add_up(store: &dyn Store) {
    let spec = |tools: &str| StoredContext {
        name: "ci".into(),
        spec: json!({"name": "ci", "capabilities": [{"tool_pattern": tools}]}),
    };
    store.context_put(Shelf::Live, &spec("fs.*")).await.unwrap();
    store
        .context_put(Shelf::Shadow, &spec("fs.read*"))
        .await
        .unwrap();
    assert_eq!(
        store.context_list(Shelf::Live).await.unwrap(),
        [spec("fs.*")]
    );
    assert_eq!(
        store.context_list(Shelf::Shadow).await.unwrap(),
        [spec("fs.read*")]
    );

    store
        .shadow_tally_add(&[
            tally("v1", "", "allow", 3, 20),
            tally("v1", "fs.write", "2006", 1, 30),
        ])
        .await
        .unwrap();
    store
        .shadow_tally_add(&[
            tally("v1", "", "allow", 2, 10),
            tally("v2", "", "allow", 7, 40),
        ])
        .await
        .unwrap();
    assert_eq!(
        store.shadow_tallies("ci", "v1").await.unwrap(),
        [
            tally("v1", "", "allow", 5, 10),
            tally("v1", "fs.write", "2006", 1, 30)
        ]
    );
    assert_eq!(store.shadow_tallies("other", "v1").await.unwrap(), []);

    store
        .context_put(Shelf::Shadow, &spec("fs.*"))
        .await
        .unwrap();
    assert_eq!(store.shadow_tallies("ci", "v1").await.unwrap(), []);
    store
        .shadow_tally_add(&[tally("v1", "", "allow", 1, 50)])
        .await
        .unwrap();
    assert!(store.context_delete(Shelf::Shadow, "ci").await.unwrap());
    assert!(!store.context_delete(Shelf::Shadow, "ci").await.unwrap());
    assert_eq!(store.shadow_tallies("ci", "v1").await.unwrap(), []);
    assert_eq!(store.context_list(Shelf::Shadow).await.unwrap(), []);
    assert_eq!(
        store.context_list(Shelf::Live).await.unwrap(),
        [spec("fs.*")]
    );
}
