use std::sync::Arc;

use super::*;
use crate::store::conformance::{self, claim, stored};
use crate::store::testing::TestDatabase;
use crate::store::{AuditBackend, ChainHead, SeenSignature, StoredEvent};
use crate::window::SlidingWindow;

#[tokio::test]
async fn claim_insert_is_insert_if_absent_and_replace_is_compare_and_set() {
    let db = TestDatabase::create().await;
    conformance::claim_insert_is_insert_if_absent_and_replace_is_compare_and_set(
        &PgStore::connect(&db.url).await.unwrap(),
    )
    .await;
}

#[tokio::test]
async fn a_sign_in_is_taken_once_and_old_ones_are_forgotten() {
    let db = TestDatabase::create().await;
    conformance::a_sign_in_is_taken_once_and_old_ones_are_forgotten(
        &PgStore::connect(&db.url).await.unwrap(),
    )
    .await;
}

#[tokio::test]
async fn shadows_are_kept_apart_and_their_tallies_add_up() {
    let db = TestDatabase::create().await;
    conformance::shadows_are_kept_apart_and_their_tallies_add_up(
        &PgStore::connect(&db.url).await.unwrap(),
    )
    .await;
}

#[tokio::test]
async fn tool_pins_are_first_wins_then_replaced_and_sightings_count_once() {
    let db = TestDatabase::create().await;
    conformance::tool_pins_are_first_wins_then_replaced_and_sightings_count_once(
        &PgStore::connect(&db.url).await.unwrap(),
    )
    .await;
}

#[tokio::test]
async fn console_sessions_are_kept_touched_and_ended() {
    let db = TestDatabase::create().await;
    conformance::console_sessions_are_kept_touched_and_ended(
        &PgStore::connect(&db.url).await.unwrap(),
    )
    .await;
}

#[tokio::test]
async fn the_two_claim_namespaces_never_meet_and_pages_run_newest_first() {
    let db = TestDatabase::create().await;
    conformance::the_two_claim_namespaces_never_meet_and_pages_run_newest_first(
        &PgStore::connect(&db.url).await.unwrap(),
    )
    .await;
}

#[tokio::test]
async fn approvals_change_by_compare_and_set_and_one_request_is_current_per_call() {
    let db = TestDatabase::create().await;
    conformance::approvals_change_by_compare_and_set_and_one_request_is_current_per_call(
        &PgStore::connect(&db.url).await.unwrap(),
    )
    .await;
}

#[tokio::test]
async fn retention_removes_only_what_is_finished() {
    let db = TestDatabase::create().await;
    conformance::retention_removes_only_what_is_finished(&PgStore::connect(&db.url).await.unwrap())
        .await;
}

#[tokio::test]
async fn sessions_insert_once_and_replace_by_compare_and_set() {
    let db = TestDatabase::create().await;
    conformance::sessions_insert_once_and_replace_by_compare_and_set(
        &PgStore::connect(&db.url).await.unwrap(),
    )
    .await;
}

#[tokio::test]
async fn a_revocation_made_while_the_listener_connects_is_caught_up() {
    let db = TestDatabase::create().await;
    let store = PgStore::connect(&db.url).await.unwrap();
    let live = conformance::session("s-1", "ctx", None);
    assert!(store.session_insert(&live).await.unwrap().is_none());
    let (heard, mut notices) = tokio::sync::mpsc::unbounded_channel();
    store
        .watch_sessions(move |id| heard.send(id.to_owned()).is_ok())
        .await
        .unwrap();
    // At once: almost always before the listener's own connection is up, so no NOTIFY reaches it;
    // its first connection must read the change from the table.
    let revoked = SessionRecord {
        revoked_at_ms: Some(2),
        ..live.clone()
    };
    assert!(store.session_replace(&live, &revoked).await.unwrap());
    let heard = tokio::time::timeout(std::time::Duration::from_secs(5), notices.recv()).await;
    assert_eq!(heard.unwrap().as_deref(), Some("s-1"));
}

#[tokio::test]
async fn session_pages_run_in_id_order_and_live_counts_count() {
    let db = TestDatabase::create().await;
    conformance::session_pages_run_in_id_order_and_live_counts_count(
        &PgStore::connect(&db.url).await.unwrap(),
    )
    .await;
}

#[tokio::test]
async fn signatures_are_remembered_once_and_purged_after_their_window() {
    let db = TestDatabase::create().await;
    conformance::signatures_are_remembered_once_and_purged_after_their_window(
        &PgStore::connect(&db.url).await.unwrap(),
    )
    .await;
}

#[tokio::test]
async fn admit_charges_rate_then_budget_then_claims_and_refusals_charge_nothing() {
    let db = TestDatabase::create().await;
    conformance::admit_charges_rate_then_budget_then_claims_and_refusals_charge_nothing(
        &PgStore::connect(&db.url).await.unwrap(),
    )
    .await;
}

#[tokio::test]
async fn a_settlement_is_written_with_its_batch_and_only_then() {
    let db = TestDatabase::create().await;
    conformance::a_settlement_is_written_with_its_batch_and_only_then(
        &PgStore::connect(&db.url).await.unwrap(),
    )
    .await;
}

#[tokio::test]
async fn labels_are_written_with_their_batch_and_only_then() {
    let db = TestDatabase::create().await;
    conformance::labels_are_written_with_their_batch_and_only_then(
        &PgStore::connect(&db.url).await.unwrap(),
    )
    .await;
}

#[tokio::test]
async fn admit_writes_the_replay_record_first_and_keeps_it_on_refusal() {
    let db = TestDatabase::create().await;
    conformance::admit_writes_the_replay_record_first_and_keeps_it_on_refusal(
        &PgStore::connect(&db.url).await.unwrap(),
    )
    .await;
}

#[tokio::test]
async fn admit_without_a_rate_window_charges_the_budget_and_the_claim_together() {
    let db = TestDatabase::create().await;
    conformance::admit_without_a_rate_window_charges_the_budget_and_the_claim_together(
        &PgStore::connect(&db.url).await.unwrap(),
    )
    .await;
}

/// One event chained after `head`, named by its seq (`h1`, `h2`, …).
fn next_event(head: &ChainHead) -> Vec<StoredEvent> {
    let seq = head.seq + 1;
    vec![stored(
        serde_json::json!({"seq": seq, "hash": format!("h{seq}"), "prev": head.hash}),
    )]
}

/// Two pools on one database stand for two replicas.
async fn two_replicas(db: &TestDatabase) -> [Arc<PgStore>; 2] {
    [
        Arc::new(PgStore::connect(&db.url).await.unwrap()),
        Arc::new(PgStore::connect(&db.url).await.unwrap()),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_stores_on_one_database_admit_as_one() {
    // The counters and claims of two replicas are one.
    let db = TestDatabase::create().await;
    let stores = two_replicas(&db).await;
    let mut tasks = Vec::new();
    for n in 0..40 {
        let store = Arc::clone(&stores[n % 2]);
        tasks.push(tokio::spawn(async move {
            let admission = Admission {
                rate: Some(("rate".into(), SlidingWindow::new(30, 60_000))),
                budget: Some(("budget".into(), 20)),
                claim: Some(claim(ClaimKind::Invoke, "one", n as i64)),
                now_ms: 5_000,
                ..Admission::default()
            };
            store.admit(&admission).await.unwrap()
        }));
    }
    let mut charged_new = 0;
    let mut charged_existing = 0;
    let mut exhausted = 0;
    for task in tasks {
        match task.await.unwrap() {
            Admitted::Charged {
                existing_claim: None,
            } => charged_new += 1,
            Admitted::Charged {
                existing_claim: Some(_),
            } => charged_existing += 1,
            Admitted::BudgetExhausted => exhausted += 1,
            other => panic!("no signature and a rate above the budget: {other:?}"),
        }
    }
    assert_eq!((charged_new, charged_existing, exhausted), (1, 19, 20));
    assert_eq!(stores[1].counter_get("budget").await.unwrap(), Some(20));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admissions_batched_across_calls_and_replicas_admit_as_one_at_a_time_would() {
    // No rate window: every admission goes through the batches of `sealgate_admit`. Each envelope is
    // sent to both replicas; pairs of envelopes share a request id; one budget of 40 over 60 envelopes.
    let db = TestDatabase::create().await;
    let stores = two_replicas(&db).await;
    let mut tasks = Vec::new();
    for n in 0..120usize {
        let store = Arc::clone(&stores[n % 2]);
        let request_id = format!("call-{}", n / 4);
        tasks.push(tokio::spawn(async move {
            let admission = Admission {
                signature: Some(SeenSignature {
                    signature: [u8::try_from(n / 2).unwrap(); 64],
                    expires_at_ms: 60_000,
                }),
                budget: Some(("budget".into(), 40)),
                claim: Some(claim(ClaimKind::Invoke, &request_id, 5_000)),
                now_ms: 5_000,
                ..Admission::default()
            };
            (request_id, store.admit(&admission).await.unwrap())
        }));
    }
    let (mut replayed, mut exhausted, mut new_claims) = (0, 0, 0);
    let mut charged_ids = std::collections::BTreeSet::new();
    for task in tasks {
        match task.await.unwrap() {
            (_, Admitted::Replayed) => replayed += 1,
            (_, Admitted::BudgetExhausted) => exhausted += 1,
            (id, Admitted::Charged { existing_claim }) => {
                new_claims += usize::from(existing_claim.is_none());
                if let Some(existing) = existing_claim {
                    assert_eq!(existing.request_id, id);
                }
                charged_ids.insert(id);
            }
            (_, other) => panic!("no rate window: {other:?}"),
        }
    }
    assert_eq!((replayed, exhausted), (60, 20));
    assert_eq!(stores[0].counter_get("budget").await.unwrap(), Some(40));
    // Each request id that was charged is claimed exactly once; the other charged calls found it.
    assert_eq!(new_claims, charged_ids.len());
    for id in &charged_ids {
        assert!(stores[1]
            .claim_get(ClaimKind::Invoke, id)
            .await
            .unwrap()
            .is_some());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_are_compare_and_set_on_the_head_across_pools() {
    let db = TestDatabase::create().await;
    let a = PgStore::connect(&db.url).await.unwrap();
    let b = PgStore::connect(&db.url).await.unwrap();
    assert_eq!(a.head().await.unwrap(), None);
    let genesis = ChainHead::genesis();
    let event = |seq: u64, hash: &str| serde_json::json!({"seq": seq, "hash": hash});
    let appended = [event(1, "h1"), event(2, "h2")].map(stored);
    a.append(&genesis, &appended, &[]).await.unwrap();
    // The other replica still believes the store is empty: refused, nothing stored.
    assert_eq!(
        b.append(&genesis, &[stored(event(1, "other"))], &[]).await,
        Err(StoreError::HeadMoved)
    );
    let head = b.head().await.unwrap().unwrap();
    assert_eq!((head.seq, head.hash.as_str()), (2, "h2"));
    b.append(&head, &[stored(event(3, "h3"))], &[])
        .await
        .unwrap();
    let newest = a.events_newest_first(None, 2).await.unwrap();
    assert_eq!(newest, [event(3, "h3"), event(2, "h2")]);
    let oldest = a.events_oldest_first(2, 10).await.unwrap();
    assert_eq!(oldest, [event(2, "h2"), event(3, "h3")]);
    assert_eq!(
        a.events_newest_first(Some(2), 10).await.unwrap(),
        [event(1, "h1")]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_taking_turns_chain_after_each_other() {
    let db = TestDatabase::create().await;
    let stores = two_replicas(&db).await;
    // 40 turns from two pools at once: each is chained after the head it finds under the lock, so
    // none is refused and the chain has no gap and no fork.
    let mut tasks = Vec::new();
    for n in 0..40 {
        let store = Arc::clone(&stores[n % 2]);
        tasks.push(tokio::spawn(async move {
            store.append_in_turn(&mut next_event, &[]).await
        }));
    }
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    let events = stores[0].events_oldest_first(1, 100).await.unwrap();
    assert_eq!(events.len(), 40);
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event["seq"], i + 1);
        let prev = if i == 0 {
            crate::store::GENESIS_HASH.to_owned()
        } else {
            format!("h{i}")
        };
        assert_eq!(event["prev"], prev, "event {}", i + 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_that_fails_holding_the_head_leaves_it_to_the_next_writer() {
    let db = TestDatabase::create().await;
    let stores = two_replicas(&db).await;
    // Chained after the lock was taken, then refused by the write (one seq twice): the transaction must
    // not go back to the pool still open and holding the head, or the other replica would wait for it.
    let mut twice = |head: &ChainHead| [next_event(head), next_event(head)].concat();
    assert!(matches!(
        stores[0].append_in_turn(&mut twice, &[]).await,
        Err(StoreError::Unavailable(_))
    ));
    for store in [&stores[1], &stores[0]] {
        store.append_in_turn(&mut next_event, &[]).await.unwrap();
    }
    let events = stores[0].events_oldest_first(1, 10).await.unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(events[1]["prev"], "h1");
}

#[tokio::test]
async fn signing_keys_are_kept_once_per_kid_for_every_replica() {
    let db = TestDatabase::create().await;
    let (a, b) = (
        PgStore::connect(&db.url).await.unwrap(),
        PgStore::connect(&db.url).await.unwrap(),
    );
    let key = |kid: &str, byte: u8, replica: &str| SigningKeyRecord {
        kid: kid.into(),
        public_key: [byte; 32],
        replica_id: replica.into(),
    };
    a.signing_key_publish(&key("aaaa", 1, "r0")).await.unwrap();
    b.signing_key_publish(&key("bbbb", 2, "r1")).await.unwrap();
    // A restart publishes again; the first record stays.
    b.signing_key_publish(&key("aaaa", 1, "r1")).await.unwrap();
    let kept = a.signing_keys().await.unwrap();
    assert_eq!(kept, [key("aaaa", 1, "r0"), key("bbbb", 2, "r1")]);
}

#[tokio::test]
async fn migrations_run_once_and_a_newer_schema_is_refused() {
    let db = TestDatabase::create().await;
    let store = PgStore::connect(&db.url).await.unwrap();
    store
        .context_put(
            Shelf::Live,
            &StoredContext {
                name: "kept".into(),
                spec: serde_json::json!({"name": "kept"}),
            },
        )
        .await
        .unwrap();
    drop(store);
    // A restart finds the schema current and keeps the data.
    let store = PgStore::connect(&db.url).await.unwrap();
    assert_eq!(store.context_list(Shelf::Live).await.unwrap().len(), 1);
    store
        .conn()
        .await
        .unwrap()
        .execute_prepared("INSERT INTO schema_version (version) VALUES (99)", &[])
        .await
        .unwrap();
    let refused = PgStore::connect(&db.url).await.err();
    assert!(
        matches!(&refused, Some(StoreError::Unavailable(m)) if m.contains("version 99")),
        "{refused:?}"
    );
}

#[tokio::test]
async fn an_unreachable_database_is_an_error_not_a_hang() {
    // Port 1 refuses at once; the pool reports it as Unavailable (5005 at the edge).
    let refused = PgStore::connect("postgres://postgres@127.0.0.1:1/none")
        .await
        .err();
    assert!(
        matches!(refused, Some(StoreError::Unavailable(_))),
        "{refused:?}"
    );
}
