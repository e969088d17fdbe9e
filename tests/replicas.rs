//! Several gateway processes on one PostgreSQL database behave as one gateway (SPEC 12), shown through
//! the real HTTP interface: one accepted envelope, one PROCEED per claim, one audit chain.

mod common;

use std::sync::Arc;

use common::{code, start_replicas, tool_call, until, Gateway};
use sealgate::store::testing::TestDatabase;
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_envelope_sent_to_both_replicas_at_once_is_accepted_once() {
    let db = TestDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();
    let (replicas, tool) = start_replicas(dir.path(), 2, &db.url).await;
    let (a, b) = (&replicas[0], &replicas[1]);
    // Registered on one replica, usable on the other at once.
    let (key, token) = a.session("exec-replay").await;
    for i in 0..100u64 {
        let envelope = sealgate::envelope::sign_envelope(
            &key,
            tool_call(i, "tool.off", json!({"n": i})),
            &token,
            sealgate::clock::now_secs(),
        );
        let ((status_a, body_a), (status_b, body_b)) =
            tokio::join!(a.post(&envelope), b.post(&envelope));
        let (accepted, refused) = match (status_a, status_b) {
            (200, _) => (body_a, (status_b, body_b)),
            (_, 200) => (body_b, (status_a, body_a)),
            _ => panic!("round {i}: neither replica accepted: {body_a} {body_b}"),
        };
        assert_eq!(accepted["payload"]["id"], i);
        assert_ne!(
            refused.0, 200,
            "round {i}: both replicas accepted one envelope"
        );
        assert_eq!(code(&refused.1), 1008, "round {i}: {}", refused.1);
    }
    assert_eq!(tool.count(), 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_claimed_call_sent_32_times_across_replicas_runs_once() {
    let db = TestDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();
    let (replicas, tool) = start_replicas(dir.path(), 2, &db.url).await;
    let (key, token) = replicas[0].session("exec-once").await;
    let replicas = Arc::new(replicas);
    let now = sealgate::clock::now_secs();
    let calls: Vec<_> = (0..32u64)
        .map(|i| {
            // Different JSON-RPC ids make different envelopes; the claim is on the tool and arguments.
            let envelope = sealgate::envelope::sign_envelope(
                &key,
                tool_call(
                    i,
                    "tool.write",
                    json!({"path": "/workspace/once.txt", "op": "once"}),
                ),
                &token,
                now,
            );
            let replicas = replicas.clone();
            tokio::spawn(async move { replicas[(i % 2) as usize].post(&envelope).await })
        })
        .collect();
    let (mut proceed, mut skip, mut pending) = (0, 0, 0);
    let mut answered = Vec::new();
    for call in calls {
        let (status, body) = call.await.unwrap();
        match (status, body["receipt"]["claim"].as_str()) {
            (200, Some("PROCEED")) => proceed += 1,
            (200, Some("SKIP")) => skip += 1,
            (409, _) => {
                assert_eq!(code(&body), 4001, "{body}");
                pending += 1;
                continue;
            }
            other => panic!("unexpected answer {other:?}: {body}"),
        }
        answered.push(body);
    }
    assert_eq!(proceed, 1);
    assert_eq!(proceed + skip + pending, 32);
    assert_eq!(
        tool.count(),
        1,
        "the tool ran exactly once across both replicas"
    );
    assert_eq!(tool.ops.lock().unwrap().get("once"), Some(&1));
    // Every answer carries the one stored result and the same receipt, whichever replica gave it.
    let first = &answered[0];
    for body in &answered {
        assert_eq!(body["payload"]["result"], first["payload"]["result"]);
        for field in ["request_id", "action_ref", "claimed_at"] {
            assert_eq!(body["receipt"][field], first["receipt"][field], "{field}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_trail_written_by_both_replicas_under_load_is_one_chain() {
    let db = TestDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();
    let (replicas, tool) = start_replicas(dir.path(), 2, &db.url).await;
    let (key, token) = replicas[1].session("exec-chain").await;
    let replicas = Arc::new(replicas);
    let key = Arc::new(key);
    let calls: Vec<_> = (0..200u64)
        .map(|i| {
            let (replicas, key, token) = (replicas.clone(), key.clone(), token.clone());
            tokio::spawn(async move {
                replicas[(i % 2) as usize]
                    .call(&key, &token, tool_call(i, "tool.off", json!({"n": i})))
                    .await
            })
        })
        .collect();
    for call in calls {
        let (status, body) = call.await.unwrap();
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(tool.count(), 200);

    let exported = replicas[0].export().await;
    let report = sealgate::audit::verify_chain(std::io::Cursor::new(exported.as_bytes()));
    let report = report.unwrap_or_else(|e| panic!("the export does not verify: {e:?}"));
    // The session, then an authorisation and a completion per call.
    assert!(report.events >= 401, "{} events", report.events);
    assert_eq!(report.first_seq, 1);
    let events: Vec<Value> = exported
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    for replica in ["r0", "r1"] {
        let written = events.iter().filter(|e| e["replica"] == replica).count();
        assert!(written >= 200, "{replica} wrote {written} events");
    }
    assert!(events.iter().all(|e| e["replica"].is_string()));
    // Whichever replica serves the export, it is the same chain.
    let again = replicas[1].export().await;
    let prefix: Vec<&str> = again.lines().take(events.len()).collect();
    assert_eq!(prefix, exported.lines().collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_on_one_replica_is_enforced_by_the_other_within_a_second() {
    let db = TestDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();
    let (replicas, _tool) = start_replicas(dir.path(), 2, &db.url).await;
    let (a, b) = (&replicas[0], &replicas[1]);
    let (key, token) = a.session("exec-revoke").await;
    // B has the session in its cache: only the change notice can make it refuse.
    let (status, body) = b
        .call(&key, &token, tool_call(1, "tool.off", json!({})))
        .await;
    assert_eq!(status, 200, "{body}");
    let revoker = a.keys.operator_token("seal.session.revoke");
    let (status, revoked) = a
        .operator(
            reqwest::Method::DELETE,
            "/v1/seal/sessions/exec-revoke",
            Some(&revoker),
            None,
        )
        .await;
    assert_eq!((status, revoked["status"].as_str()), (200, Some("revoked")));
    let revoked_at = std::time::Instant::now();
    let mut id = 2;
    loop {
        let (status, body) = b
            .call(&key, &token, tool_call(id, "tool.off", json!({})))
            .await;
        if status != 200 {
            assert_eq!(code(&body), 1006, "{body}");
            break;
        }
        assert!(
            revoked_at.elapsed() < std::time::Duration::from_secs(1),
            "replica B still accepts the revoked session after 1 s"
        );
        id += 1;
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(revoked_at.elapsed() < std::time::Duration::from_secs(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_context_put_or_deleted_on_one_replica_applies_on_the_other_within_2_s() {
    let db = TestDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();
    let (replicas, _tool) = start_replicas(dir.path(), 2, &db.url).await;
    let (a, b) = (&replicas[0], &replicas[1]);
    let spec =
        json!({"name": "api-ctx", "capabilities": [{"tool_pattern": "limited.*", "claim": "off"}]});
    let (status, body) = a
        .admin(
            reqwest::Method::PUT,
            "/v1/security-contexts/api-ctx",
            Some(spec),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    // The session needs the context where it is registered: A has it at once.
    let (key, token) = a.session_in("exec-ctx", "api-ctx").await;
    let id = std::sync::atomic::AtomicU64::new(0);
    let call_b = || async {
        let n = id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        b.call(&key, &token, tool_call(n, "limited.echo", json!({})))
            .await
    };
    until(
        std::time::Duration::from_secs(2),
        "PUT reaches B",
        || async { call_b().await.0 == 200 },
    )
    .await;

    let (status, body) = a
        .admin(
            reqwest::Method::DELETE,
            "/v1/security-contexts/api-ctx",
            None,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    until(
        std::time::Duration::from_secs(2),
        "DELETE reaches B",
        || async {
            let (status, body) = call_b().await;
            if status == 200 {
                return false;
            }
            assert!(code(&body) < 5000, "a refusal, not a failure: {body}");
            true
        },
    )
    .await;
    // And B's own listing no longer shows it.
    let (status, listing) = b
        .admin(reqwest::Method::GET, "/v1/security-contexts", None)
        .await;
    assert_eq!(status, 200);
    assert!(!listing.to_string().contains("api-ctx"), "{listing}");
}

/// Sends `count` calls of `tool` at once under one session, alternating replicas; returns each answer's
/// status and error code (0 for a 200).
async fn spread_on(
    replicas: &Arc<Vec<Gateway>>,
    key: Arc<ed25519_dalek::SigningKey>,
    token: &str,
    tool: &str,
    count: u64,
) -> Vec<(u16, u64)> {
    let calls: Vec<_> = (0..count)
        .map(|i| {
            let (replicas, key, token, tool) = (
                replicas.clone(),
                key.clone(),
                token.to_owned(),
                tool.to_owned(),
            );
            tokio::spawn(async move {
                let (status, body) = replicas[(i % 2) as usize]
                    .call(&key, &token, tool_call(i, &tool, json!({"n": i})))
                    .await;
                (status, if status == 200 { 0 } else { code(&body) })
            })
        })
        .collect();
    let mut answers = Vec::new();
    for call in calls {
        answers.push(call.await.unwrap());
    }
    answers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limits_and_budgets_count_the_calls_of_both_replicas() {
    let db = TestDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();
    let (replicas, tool) = start_replicas(dir.path(), 2, &db.url).await;
    let replicas = Arc::new(replicas);

    // A budget of 5 calls: 40 parallel calls over both replicas spend exactly 5.
    let (key, token) = replicas[0]
        .session_with("exec-budget", json!({"budget": {"max_calls": 5}}))
        .await;
    let answers = spread_on(&replicas, Arc::new(key), &token, "tool.off", 40).await;
    let admitted = answers.iter().filter(|(status, _)| *status == 200).count();
    assert_eq!(admitted, 5, "{answers:?}");
    assert!(
        answers
            .iter()
            .all(|answer| *answer == (200, 0) || *answer == (403, 2008)),
        "{answers:?}"
    );
    assert_eq!(tool.count(), 5, "the tool ran once per admitted call");

    // `limited.*` admits 2 calls per 60 s: 20 parallel calls over both replicas get 2 through.
    let (key, token) = replicas[1].session("exec-rate").await;
    let answers = spread_on(&replicas, Arc::new(key), &token, "limited.echo", 20).await;
    let admitted = answers.iter().filter(|(status, _)| *status == 200).count();
    assert_eq!(admitted, 2, "{answers:?}");
    assert!(
        answers
            .iter()
            .all(|answer| *answer == (200, 0) || *answer == (429, 2005)),
        "{answers:?}"
    );
    assert_eq!(tool.count(), 7);
}

/// `GET /readyz` of one replica: its status.
async fn ready(gw: &Gateway) -> u16 {
    let response = gw
        .client
        .get(format!("{}/readyz", gw.base))
        .send()
        .await
        .unwrap();
    response.status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_database_connections_fail_closed_with_5005_and_service_resumes_by_itself() {
    let db = TestDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();
    let (replicas, tool) = start_replicas(dir.path(), 2, &db.url).await;
    let (key, token) = replicas[0].session("exec-outage").await;
    let claimed = json!({"path": "/workspace/kept.txt", "op": "kept"});
    let (status, body) = replicas[1]
        .call(&key, &token, tool_call(1, "tool.write", claimed.clone()))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(tool.count(), 1);

    // The outage: every connection of the test database killed, and no new one admitted.
    db.admin_execute(
        "ALTER DATABASE {db} ALLOW_CONNECTIONS false; \
         SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{db}'",
    )
    .await;
    let lost_at = std::time::Instant::now();
    let mut id = 100;
    for gw in &replicas {
        for tool_name in ["tool.off", "tool.write"] {
            id += 1;
            let arguments = json!({"path": "/workspace/outage.txt", "op": format!("op{id}")});
            let (status, body) = gw
                .call(&key, &token, tool_call(id, tool_name, arguments))
                .await;
            assert_eq!((status, code(&body)), (503, 5005), "{body}");
            assert!(
                body["error"]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("postgres")),
                "the cause is kept: {body}"
            );
        }
        let gw_ready = || async { ready(gw).await == 503 };
        until(std::time::Duration::from_secs(5), "/readyz 503", gw_ready).await;
    }
    assert!(lost_at.elapsed() < std::time::Duration::from_secs(5));
    assert_eq!(tool.count(), 1, "nothing was forwarded during the outage");

    db.admin_execute("ALTER DATABASE {db} ALLOW_CONNECTIONS true")
        .await;
    let next = std::sync::atomic::AtomicU64::new(id + 1);
    for gw in &replicas {
        until(
            std::time::Duration::from_secs(5),
            "service resumes",
            || async {
                let id = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let (status, body) = gw
                    .call(&key, &token, tool_call(id, "tool.off", json!({})))
                    .await;
                assert!(status == 200 || code(&body) == 5005, "{body}");
                status == 200
            },
        )
        .await;
        assert_eq!(ready(gw).await, 200);
    }
    // What was acknowledged before the outage is kept: the claimed call is answered from its claim.
    let (status, body) = replicas[0]
        .call(&key, &token, tool_call(2, "tool.write", claimed))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["receipt"]["claim"], "SKIP", "{body}");
    assert_eq!(tool.ops.lock().unwrap().get("kept"), Some(&1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pending_claim_of_a_replica_killed_mid_call_is_resolved_on_the_other() {
    let db = TestDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();
    let (mut replicas, tool) = start_replicas(dir.path(), 2, &db.url).await;
    let (key, token) = replicas[0]
        .session_with("exec-killed", json!({"allowed_tool_patterns": ["slow.*"]}))
        .await;
    let arguments = json!({"transfer": 7});
    let envelope = sealgate::envelope::sign_envelope(
        &key,
        tool_call(1, "slow.pay", arguments.clone()),
        &token,
        sealgate::clock::now_secs(),
    );
    let (client, base) = (replicas[0].client.clone(), replicas[0].base.clone());
    let in_flight = tokio::spawn(async move {
        client
            .post(format!("{base}/v1/invoke"))
            .json(&envelope)
            .send()
            .await
    });
    // The tool has the call (and answers only after 5 s): A dies before any answer or timeout.
    until(
        std::time::Duration::from_secs(5),
        "call forwarded",
        || async { tool.count() == 1 },
    )
    .await;
    replicas[0].kill();
    assert!(
        in_flight.await.unwrap().is_err(),
        "A was killed before it answered"
    );

    let b = &replicas[1];
    let (status, listed) = b
        .admin(reqwest::Method::GET, "/v1/claims?status=PENDING", None)
        .await;
    assert_eq!(status, 200, "{listed}");
    let items = listed["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{listed}");
    assert_eq!(items[0]["action"], "slow.pay");
    let request_id = items[0]["request_id"].as_str().unwrap().to_owned();
    // Until it is resolved, a retry on B neither runs the tool again nor answers for it.
    let (status, body) = b
        .call(&key, &token, tool_call(2, "slow.pay", arguments.clone()))
        .await;
    assert_eq!((status, code(&body)), (409, 4001), "{body}");

    let result = json!({"jsonrpc": "2.0", "id": 0, "result": {"content": [{"type": "text", "text": "paid"}]}});
    let (status, resolved) = b
        .admin(
            reqwest::Method::POST,
            &format!("/v1/claims/{request_id}/resolve"),
            Some(json!({"outcome": "committed", "result": result, "evidence": "ledger"})),
        )
        .await;
    assert_eq!(status, 200, "{resolved}");
    assert_eq!(resolved["status"], "COMMITTED");
    let (status, body) = b
        .call(&key, &token, tool_call(3, "slow.pay", arguments))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["receipt"]["claim"], "SKIP", "{body}");
    assert_eq!(body["payload"]["result"]["content"][0]["text"], "paid");
    assert_eq!(tool.count(), 1, "the tool ran once");
}

/// The events of a replica's `audit.file` once it holds `seq`, and the names of rotated files beside it.
async fn audit_file(gw: &Gateway, seq: u64) -> (Vec<Value>, Vec<String>) {
    let text = gw.audit_file_through(seq).await;
    let events = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let rotated = std::fs::read_dir(&gw.dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("audit.jsonl."))
        .collect();
    (events, rotated)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_replica_audit_file_holds_the_events_it_wrote() {
    let db = TestDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();
    let (mut replicas, _tool) = start_replicas(dir.path(), 2, &db.url).await;
    let (key, token) = replicas[0].session("exec-files").await;
    // Alternate one call at a time, so that every batch of one replica follows the other's events.
    for i in 0..20u64 {
        let (status, body) = replicas[(i % 2) as usize]
            .call(&key, &token, tool_call(i, "tool.off", json!({})))
            .await;
        assert_eq!(status, 200, "{body}");
    }
    let exported = replicas[0].export().await;
    sealgate::audit::verify_chain(std::io::Cursor::new(exported.as_bytes()))
        .unwrap_or_else(|e| panic!("the export does not verify: {e:?}"));
    let chain: Vec<Value> = exported
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    for (gw, replica) in replicas.iter().zip(["r0", "r1"]) {
        let own: Vec<&Value> = chain.iter().filter(|e| e["replica"] == replica).collect();
        assert!(own.len() >= 20, "{replica} wrote {} events", own.len());
        let newest = own.last().unwrap()["seq"].as_u64().unwrap();
        let (events, rotated) = audit_file(gw, newest).await;
        assert!(rotated.is_empty(), "{replica} rotated: {rotated:?}");
        // Exactly its own events, in order, as they are in the chain.
        assert_eq!(events.iter().collect::<Vec<_>>(), own, "{replica}'s file");
    }

    // `audit verify` of such a file says what it is, and what it can and cannot show.
    let file = replicas[0].dir.join("audit.jsonl");
    let file = file.to_str().unwrap();
    let (status, output) = common::run_cli(&["audit", "verify", file]);
    assert_eq!(status, 1, "not a whole chain: {output}");
    for said in [
        "replica \"r0\"'s own log",
        "each event's hash holds",
        "GET /v1/audit/export",
        "--replica-log",
    ] {
        assert!(output.contains(said), "{said:?} not in {output}");
    }
    let (status, output) = common::run_cli(&["audit", "verify", "--replica-log", file]);
    assert_eq!(status, 0, "{output}");
    assert!(
        output.starts_with("ok: replica \"r0\"'s own log"),
        "{output}"
    );
    // What it can show, it checks: an event changed after the fact is named.
    let text = std::fs::read_to_string(file).unwrap();
    let changed = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        changed.path(),
        text.replacen("\"tool.off\"", "\"tool.other\"", 1),
    )
    .unwrap();
    let (status, output) = common::run_cli(&[
        "audit",
        "verify",
        "--replica-log",
        changed.path().to_str().unwrap(),
    ]);
    assert_eq!(status, 1, "{output}");
    assert!(output.contains("hash does not match"), "{output}");

    // Restarted, a replica does not copy the other's events into its file, and goes on appending.
    replicas[1].restart();
    let (status, body) = replicas[1]
        .call(&key, &token, tool_call(99, "tool.off", json!({})))
        .await;
    assert_eq!(status, 200, "{body}");
    let answered = body["receipt"]["event_seq"].as_u64().unwrap();
    let (events, rotated) = audit_file(&replicas[1], answered).await;
    assert!(rotated.is_empty(), "r1 rotated: {rotated:?}");
    assert!(events.iter().all(|e| e["replica"] == "r1"));
    let last_seq = |events: &[Value]| events.last().unwrap()["seq"].as_u64().unwrap();
    assert!(
        last_seq(&events) > last_seq(&chain),
        "r1 appended after its restart"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_stuck_behind_a_lock_fails_closed_within_the_statement_timeout() {
    let db = TestDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();
    let (replicas, tool) = start_replicas(dir.path(), 1, &db.url).await;
    let gw = &replicas[0];
    let (key, token) = gw.session("exec-locked").await;

    // Another client holds the replay table locked in an open transaction: every call's first write waits.
    let (locker, connection) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    locker
        .batch_execute("BEGIN; LOCK TABLE seen_signatures IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let (status, body) = gw
        .call(&key, &token, tool_call(1, "tool.off", json!({})))
        .await;
    assert_eq!((status, code(&body)), (503, 5005), "{body}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "answered after {:?}: the statement timeout bounds the wait",
        started.elapsed()
    );
    assert_eq!(tool.count(), 0, "nothing was forwarded");

    locker.batch_execute("ROLLBACK").await.unwrap();
    let (status, body) = gw
        .call(&key, &token, tool_call(2, "tool.off", json!({})))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(tool.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_on_two_replicas_at_once_make_the_two_that_approvers_2_asks() {
    let db = TestDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();
    let (replicas, tool) = start_replicas(dir.path(), 2, &db.url).await;
    let (a, b) = (&replicas[0], &replicas[1]);
    let spec = json!({"capabilities": [{"tool_pattern": "pay.*", "claim": "off",
                                         "approval": {"required": true, "approvers": 2}}]});
    let (status, body) = a
        .admin(
            reqwest::Method::PUT,
            "/v1/security-contexts/pay2",
            Some(spec),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let (key, token) = a.session_in("exec-two", "pay2").await;
    let pay = |id| tool_call(id, "pay.send", json!({"cents": 5}));
    let (status, waiting) = a.call(&key, &token, pay(1)).await;
    assert_eq!((status, code(&waiting)), (403, 4003), "{waiting}");
    let id = waiting["error"]["details"]["approval_id"].as_str().unwrap();

    let ((status_a, by_a), (status_b, by_b)) =
        tokio::join!(grant(a, id, "ann"), grant(b, id, "bob"));
    assert_eq!((status_a, status_b), (200, 200), "{by_a} {by_b}");
    let (status, record) = b
        .admin(reqwest::Method::GET, &format!("/v1/approvals/{id}"), None)
        .await;
    assert_eq!(status, 200, "{record}");
    assert_eq!(record["status"], "granted", "{record}");
    let mut grantors: Vec<_> = record["grants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["by"]["sub"].as_str().unwrap().to_owned())
        .collect();
    grantors.sort();
    assert_eq!(grantors, ["ann", "bob"]);
    let (status, ran) = a.call(&key, &token, pay(2)).await;
    assert_eq!(status, 200, "{ran}");
    assert_eq!(tool.count(), 1);
}

/// `who` grants approval `id` on `gw`.
async fn grant(gw: &Gateway, id: &str, who: &str) -> (u16, Value) {
    let token = gw.keys.operator_token_as(who, "seal.approval.decide");
    let path = format!("/v1/approvals/{id}/grant");
    gw.operator(reqwest::Method::POST, &path, Some(&token), Some(json!({})))
        .await
}
