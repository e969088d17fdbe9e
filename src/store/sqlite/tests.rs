use super::*;
use crate::store::conformance::{self, claim};
use crate::store::{AuditBackend, ClaimStatus};
use std::sync::Arc;

fn open() -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path()).unwrap();
    (dir, store)
}

#[tokio::test]
async fn claim_insert_is_insert_if_absent_and_replace_is_compare_and_set() {
    let (_dir, store) = open();
    conformance::claim_insert_is_insert_if_absent_and_replace_is_compare_and_set(&store).await;
}

#[tokio::test]
async fn the_two_claim_namespaces_never_meet_and_pages_run_newest_first() {
    let (_dir, store) = open();
    conformance::the_two_claim_namespaces_never_meet_and_pages_run_newest_first(&store).await;
}

#[tokio::test]
async fn sessions_insert_once_and_replace_by_compare_and_set() {
    let (_dir, store) = open();
    conformance::sessions_insert_once_and_replace_by_compare_and_set(&store).await;
}

#[tokio::test]
async fn session_pages_run_in_id_order_and_live_counts_count() {
    let (_dir, store) = open();
    conformance::session_pages_run_in_id_order_and_live_counts_count(&store).await;
}

#[tokio::test]
async fn signatures_are_remembered_once_and_purged_after_their_window() {
    let (_dir, store) = open();
    conformance::signatures_are_remembered_once_and_purged_after_their_window(&store).await;
}

#[tokio::test]
async fn admit_charges_rate_then_budget_then_claims_and_refusals_charge_nothing() {
    let (_dir, store) = open();
    conformance::admit_charges_rate_then_budget_then_claims_and_refusals_charge_nothing(&store)
        .await;
}

#[tokio::test]
async fn a_settlement_is_written_with_its_batch_and_only_then() {
    let (_dir, store) = open();
    conformance::a_settlement_is_written_with_its_batch_and_only_then(&store).await;
}

#[tokio::test]
async fn labels_are_written_with_their_batch_and_only_then() {
    let (_dir, store) = open();
    conformance::labels_are_written_with_their_batch_and_only_then(&store).await;
}

#[tokio::test]
async fn admit_writes_the_replay_record_first_and_keeps_it_on_refusal() {
    let (_dir, store) = open();
    conformance::admit_writes_the_replay_record_first_and_keeps_it_on_refusal(&store).await;
}

#[tokio::test]
async fn admit_without_a_rate_window_charges_the_budget_and_the_claim_together() {
    let (_dir, store) = open();
    conformance::admit_without_a_rate_window_charges_the_budget_and_the_claim_together(&store)
        .await;
}

#[tokio::test]
async fn approvals_change_by_compare_and_set_and_one_request_is_current_per_call() {
    let (_dir, store) = open();
    conformance::approvals_change_by_compare_and_set_and_one_request_is_current_per_call(&store)
        .await;
}

#[tokio::test]
async fn retention_removes_only_what_is_finished() {
    let (_dir, store) = open();
    conformance::retention_removes_only_what_is_finished(&store).await;
}

#[tokio::test]
async fn committed_state_survives_reopen_and_uncommitted_state_does_not() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = SqliteStore::open(dir.path()).unwrap();
        store
            .claim_insert(&claim(ClaimKind::Invoke, "kept", 5))
            .await
            .unwrap();
        let budget = Admission {
            budget: Some(("n".into(), 10)),
            ..Admission::default()
        };
        store.admit(&budget).await.unwrap();
        let big = StoredContext {
            name: "big".into(),
            spec: Value::String("x".repeat(300_000)),
        };
        store.context_put(Shelf::Live, &big).await.unwrap();
        store.sync().await.unwrap();
    }
    let store = SqliteStore::open(dir.path()).unwrap();
    assert!(store
        .claim_get(ClaimKind::Invoke, "kept")
        .await
        .unwrap()
        .is_some());
    assert_eq!(store.counter_get("n").await.unwrap(), Some(1));
    assert_eq!(store.context_list(Shelf::Live).await.unwrap().len(), 1);
    assert_eq!(store.live_counts(0).await.unwrap().pending_claims, 1);
}

/// Budgets are charged in memory with the table's increment queued, not awaited: concurrent calls still
/// get exactly the budget, and the table holds what was charged once committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_get_exactly_the_budget_and_the_table_keeps_the_count() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(dir.path()).unwrap());
    let admission = Admission {
        budget: Some(("b".into(), 10)),
        ..Admission::default()
    };
    let calls = (0..64).map(|_| {
        let (store, admission) = (store.clone(), admission.clone());
        tokio::spawn(async move { store.admit(&admission).await.unwrap() })
    });
    let mut charged = 0;
    for call in calls {
        if matches!(call.await.unwrap(), Admitted::Charged { .. }) {
            charged += 1;
        }
    }
    assert_eq!(charged, 10);
    assert_eq!(store.counter_get("b").await.unwrap(), Some(10));
    store.sync().await.unwrap();
    drop(store);
    let store = SqliteStore::open(dir.path()).unwrap();
    assert_eq!(store.counter_get("b").await.unwrap(), Some(10));
    assert_eq!(
        store.admit(&admission).await.unwrap(),
        Admitted::BudgetExhausted
    );
}

/// A budget charge is counted in memory and written by the writer's next request or commit; the call goes
/// on. When it cannot be written the store stops (every later operation fails until a restart) rather than
/// let the table fall behind what was admitted.
#[tokio::test]
async fn a_budget_charge_that_cannot_be_written_stops_the_store() {
    let (_dir, store) = open();
    let budget = Admission {
        budget: Some(("b".into(), 10)),
        ..Admission::default()
    };
    store.admit(&budget).await.unwrap();
    store.sync().await.unwrap();
    assert_eq!(store.counter_get("b").await.unwrap(), Some(1));
    store
        .writer
        .write(|w| w.conn.execute_batch("DROP TABLE counters").map_err(db))
        .await
        .unwrap();
    // Counted in memory: admitted without waiting for the writer.
    assert!(matches!(
        store.admit(&budget).await.unwrap(),
        Admitted::Charged { .. }
    ));
    let err = store.sync().await.unwrap_err().to_string();
    assert!(
        err.contains("budget counts kept in memory were not written"),
        "{err}"
    );
    assert!(store.admit(&budget).await.is_err());
}

/// A charge wakes nobody, yet a read through the writer and the next commit both hold it.
#[tokio::test]
async fn budget_charges_reach_the_table_with_the_next_request_and_the_next_commit() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path()).unwrap();
    let budget = Admission {
        budget: Some(("b".into(), 10)),
        ..Admission::default()
    };
    for _ in 0..3 {
        store.admit(&budget).await.unwrap();
    }
    assert_eq!(store.counter_get("b").await.unwrap(), Some(3));
    store.admit(&budget).await.unwrap();
    store.sync().await.unwrap();
    drop(store);
    let store = SqliteStore::open(dir.path()).unwrap();
    assert_eq!(store.counter_get("b").await.unwrap(), Some(4));
}

/// A durable write is answered once, after the commit that holds it: a reader (which sees only commits)
/// finds it at once, with the write answered before it. A durable write that fails answers its own error,
/// undoes only itself, and the commit still holds what came before it.
#[tokio::test]
async fn a_durable_write_is_answered_after_the_commit_that_holds_it() {
    let (_dir, store) = open();
    let committed_claims = || {
        store.read(|conn| {
            conn.query_row("SELECT count(*) FROM claims", [], |row| {
                row.get::<_, i64>(0)
            })
            .map_err(db)
        })
    };
    store
        .claim_insert(&claim(ClaimKind::Invoke, "applied", 5))
        .await
        .unwrap();
    assert_eq!(
        committed_claims().await.unwrap(),
        0,
        "a plain write is not committed yet"
    );
    let answer = store
        .writer
        .write_durably(|w| {
            w.conn
                .execute(
                    "INSERT INTO counters (key, value) VALUES (?1, 7)",
                    [&b"durable"[..]],
                )
                .map_err(db)
        })
        .await
        .unwrap();
    assert_eq!(answer, 1, "the work's own answer comes back");
    assert_eq!(committed_claims().await.unwrap(), 1);
    assert_eq!(store.counter_get("durable").await.unwrap(), Some(7));

    store
        .claim_insert(&claim(ClaimKind::Invoke, "second", 6))
        .await
        .unwrap();
    let failed = store
        .writer
        .write_durably(|w| {
            w.conn
                .execute(
                    "INSERT INTO counters (key, value) VALUES (?1, 1)",
                    [&b"undone"[..]],
                )
                .map_err(db)?;
            Err::<(), _>(StoreError::Corrupt("refused by the test".into()))
        })
        .await
        .unwrap_err();
    assert_eq!(
        failed.to_string(),
        StoreError::Corrupt("refused by the test".into()).to_string()
    );
    assert_eq!(
        committed_claims().await.unwrap(),
        2,
        "the commit still held the write before it"
    );
    assert_eq!(store.counter_get("undone").await.unwrap(), None);
}

#[tokio::test]
async fn a_lost_transaction_stops_the_store_and_nothing_it_held_is_reported_durable() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path()).unwrap();
    store
        .claim_insert(&claim(ClaimKind::Invoke, "durable", 5))
        .await
        .unwrap();
    store.sync().await.unwrap();
    // From now on the file cannot grow: a large write fails with SQLITE_FULL, which rolls back the
    // whole open transaction, small writes already answered included.
    store
        .writer
        .write(|w| {
            let pages: i64 = w
                .conn
                .query_row("PRAGMA page_count", [], |row| row.get(0))
                .map_err(db)?;
            w.conn
                .execute_batch(&format!("PRAGMA max_page_count = {pages}"))
                .map_err(db)
        })
        .await
        .unwrap();
    store
        .claim_insert(&claim(ClaimKind::Invoke, "answered", 6))
        .await
        .unwrap();
    let big = StoredContext {
        name: "big".into(),
        spec: Value::String("x".repeat(1_000_000)),
    };
    assert!(store.context_put(Shelf::Live, &big).await.is_err());
    // The answered claim was lost with the transaction: no commit may now report it durable.
    assert!(store.sync().await.is_err());
    assert!(store.ping().await.is_err());
    assert!(store
        .claim_insert(&claim(ClaimKind::Invoke, "later", 7))
        .await
        .is_err());
    drop(store);
    let store = SqliteStore::open(dir.path()).unwrap();
    let found = |id: &'static str| {
        let store = &store;
        async move {
            store
                .claim_get(ClaimKind::Invoke, id)
                .await
                .unwrap()
                .is_some()
        }
    };
    assert!(found("durable").await);
    assert!(!found("answered").await);
}

#[tokio::test]
async fn the_writer_starts_the_log_over_once_it_passes_its_limit() {
    let dir = tempfile::tempdir().unwrap();
    let limit = 64 * 1024;
    let store = SqliteStore::open_with_wal_limit(dir.path(), limit).unwrap();
    let wal = dir.path().join("sealgate.db-wal");
    let (mut largest, mut last, mut restarts) = (0, 0, 0);
    for n in 0..1_000 {
        let record = claim(ClaimKind::Invoke, &format!("request-{n}"), n);
        assert_eq!(store.claim_insert(&record).await.unwrap(), None);
        store.sync().await.unwrap();
        let now = std::fs::metadata(&wal).unwrap().len();
        restarts += u32::from(now < last);
        (largest, last) = (largest.max(now), now);
    }
    // A thousand commits of a page or more each would leave over 4 MiB in a log never started over. A
    // restart that meets the checkpointer's pass is tried again at the next commit, so on a loaded
    // machine the log may pass the limit by a few commits' pages before it starts over.
    assert!(restarts > 0, "the WAL was never started over");
    assert!(largest < 16 * limit, "the WAL reached {largest} bytes");
    assert_eq!(
        store
            .claim_get(ClaimKind::Invoke, "request-999")
            .await
            .unwrap()
            .map(|c| c.claimed_at_ms),
        Some(999)
    );
}

/// Events and claims are stored packed (smaller than their text); rows an earlier build wrote as plain text
/// are read, compared-and-set and chained after as before.
#[tokio::test]
async fn events_and_claims_are_packed_and_plain_rows_of_an_earlier_build_still_serve() {
    let (_dir, store) = open();
    let pending = claim(ClaimKind::Invoke, "packed", 1);
    store.claim_insert(&pending).await.unwrap();
    let event =
        serde_json::json!({"seq": 1, "hash": "h1", "tool": "fs.read", "pad": "x".repeat(500)});
    store
        .append(
            &ChainHead::genesis(),
            &[conformance::stored(event.clone())],
            &[],
        )
        .await
        .unwrap();
    let earlier = claim(ClaimKind::Invoke, "plain", 2);
    let earlier_event = serde_json::json!({"seq": 2, "hash": "h2", "tool": "fs.write"});
    let (text_claim, text_event) = (encode_record(&earlier).unwrap(), earlier_event.to_string());
    let stored = store
        .writer
        .write(move |w| {
            w.conn
                .execute(
                    "INSERT INTO claims (kind, request_id, claimed_at_ms, pending, record) \
                     VALUES ('invoke', 'plain', 2, 1, ?1)",
                    params![text_claim],
                )
                .map_err(db)?;
            w.conn
                .execute(
                    "INSERT INTO audit_events (seq, event) VALUES (2, ?1)",
                    params![text_event],
                )
                .map_err(db)?;
            w.head = ChainHead {
                seq: 2,
                hash: "h2".into(),
            };
            w.conn
                .query_row(
                    "SELECT typeof(event), length(event) FROM audit_events WHERE seq = 1",
                    [],
                    |row| Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?)),
                )
                .map_err(db)
        })
        .await
        .unwrap();
    assert_eq!(stored.0, "blob");
    assert!(stored.1 < 300, "a 560-byte event took {} bytes", stored.1);
    store.sync().await.unwrap();
    assert_eq!(
        store.events_oldest_first(1, 10).await.unwrap(),
        vec![event, earlier_event]
    );
    assert_eq!(
        store.claim_get(ClaimKind::Invoke, "packed").await.unwrap(),
        Some(pending)
    );
    // The plain row is compared by its text and replaced by a packed one.
    let mut settled = earlier.clone();
    settled.status = ClaimStatus::Committed;
    let mut stale = earlier.clone();
    stale.action = "fs.other".into();
    assert!(!store.claim_replace(&stale, Some(&settled)).await.unwrap());
    assert!(store.claim_replace(&earlier, Some(&settled)).await.unwrap());
    assert_eq!(
        store.claim_get(ClaimKind::Invoke, "plain").await.unwrap(),
        Some(settled)
    );
}

/// What the durability page tells operators: a packed row, taken out with the `sqlite3` shell, is read by
/// the `zstd` tool with the dictionary from the source tree.
#[tokio::test]
async fn a_packed_event_is_read_by_the_sqlite3_and_zstd_tools() {
    let (dir, store) = open();
    let event = serde_json::json!({"seq": 1, "hash": "h1", "type": "ToolCallCompleted"});
    store
        .append(
            &ChainHead::genesis(),
            &[conformance::stored(event.clone())],
            &[],
        )
        .await
        .unwrap();
    store.sync().await.unwrap();
    let frame = dir.path().join("event.zst");
    let query = format!(
        "SELECT writefile('{}', event) FROM audit_events WHERE seq = 1",
        frame.display()
    );
    let run = |program: &str, args: &[&str]| {
        let out = std::process::Command::new(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{program} (scripts/test.sh installs it): {e}"));
        assert!(out.status.success(), "{program}: {out:?}");
        out.stdout
    };
    let db = SqliteStore::path_in(dir.path());
    run("sqlite3", &[db.to_str().unwrap(), &query]);
    let dictionary = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src/store/sqlite/records.zdict"
    );
    let text = run(
        "zstd",
        &["-q", "-d", "-D", dictionary, "-c", frame.to_str().unwrap()],
    );
    assert_eq!(serde_json::from_slice::<Value>(&text).unwrap(), event);
}

#[tokio::test]
async fn a_sign_in_is_taken_once_and_old_ones_are_forgotten() {
    let (_dir, store) = open();
    conformance::a_sign_in_is_taken_once_and_old_ones_are_forgotten(&store).await;
}

#[tokio::test]
async fn console_sessions_are_kept_touched_and_ended() {
    let (_dir, store) = open();
    conformance::console_sessions_are_kept_touched_and_ended(&store).await;
}

#[tokio::test]
async fn tool_pins_are_first_wins_then_replaced_and_sightings_count_once() {
    let (_dir, store) = open();
    conformance::tool_pins_are_first_wins_then_replaced_and_sightings_count_once(&store).await;
}

#[tokio::test]
async fn shadows_are_kept_apart_and_their_tallies_add_up() {
    let (_dir, store) = open();
    conformance::shadows_are_kept_apart_and_their_tallies_add_up(&store).await;
}
