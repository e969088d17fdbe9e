//! Retention (SPEC 12 r3) through the real binary, on either store: audit events older than
//! `retention.audit_days` leave the store only after they are in synced `audit-FIRST-LAST-HASH.jsonl`
//! archives, the newest event stays, the archives and the store verify as one chain, and settled claims
//! older than `retention.claims_days` are removed, so that a keyed retry runs again. It never removes what
//! the running gateway still needs (SPEC 20 rule 1): a replay, a rate window and a denial outlive it and a
//! restart; a wider clock window after a restart never lets a replay through (rule 3); and a rate window
//! stays with its capability when an edit moves it (rule 4).

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use common::{archives, audit_verify, code, keyed_call, tool_call, until, Gateway};
use reqwest::Method;
use serde_json::{json, Value};

/// 0.00001 days is 864 ms, so the sweep runs every second (its floor) and anything older goes, once it
/// is out of the last clock window: 1 s of skew keeps the events of the last 3 s.
const RETENTION: &str =
    "retention: { audit_days: 0.00001, claims_days: 0.00001, archive_dir: archive }\n\
                         limits: { max_clock_skew_secs: 1 }\n";
const KEEP_MS: i64 = 864;
const CLOCK_WINDOW_MS: i64 = 3_000;

fn events_of(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

fn at_ms(event: &Value) -> i64 {
    chrono::DateTime::parse_from_rfc3339(event["at"].as_str().unwrap())
        .unwrap()
        .timestamp_millis()
}

#[tokio::test]
async fn old_events_move_to_archives_that_verify_with_the_store_and_settled_claims_go() {
    let dir = tempfile::tempdir().unwrap();
    let archive_dir = dir.path().join("archive");
    let (gw, tool) = Gateway::start(dir.path(), RETENTION).await;
    let (key, token) = gw.session("exec-retention").await;
    let write = |id| {
        keyed_call(
            id,
            "tool.write",
            json!({"path": "/workspace/report.txt"}),
            "report-1",
        )
    };
    let (status, first) = gw.call(&key, &token, write(1)).await;
    assert_eq!(first["receipt"]["claim"], "PROCEED", "{status} {first}");
    let request_id = first["receipt"]["request_id"].as_str().unwrap().to_owned();
    // An export ends the chain with a checkpoint (SPEC 20 rule 7): made now, it is the newest event.
    gw.export().await;
    let written = gw.audit_file().await;
    let chain: Vec<Value> = written
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let newest = chain.last().unwrap().clone();
    assert!(chain.len() >= 3, "{written}");

    // Nothing more happens: every event but the newest leaves the store, into the archives.
    let export = dir.path().join("export.jsonl");
    until(
        Duration::from_secs(30),
        "the store to keep only its newest event",
        || async { gw.export().await.lines().count() == 1 },
    )
    .await;
    let files = archives(&archive_dir);
    assert!(!files.is_empty(), "no archive in {}", archive_dir.display());
    let mut archived = Vec::new();
    for (first_seq, last_seq, path) in &files {
        let events = events_of(path);
        let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
        assert_eq!(
            seqs,
            (*first_seq..=*last_seq).collect::<Vec<_>>(),
            "{path:?}"
        );
        let last_hash = events.last().unwrap()["hash"].as_str().unwrap();
        assert!(
            path.to_str()
                .unwrap()
                .ends_with(&format!("-{last_hash}.jsonl")),
            "{path:?}"
        );
        let mode = std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{path:?}");
        archived.extend(events);
    }
    assert_eq!(
        archived,
        chain[..chain.len() - 1],
        "the archives hold exactly the removed events, in order and unchanged"
    );

    // The newest event stays however old it grows: watched over two sweeps after it passed the cutoff.
    until(
        Duration::from_secs(10),
        "two sweeps after the newest event passed the cutoff",
        || async {
            let kept = gw.save_export(&export).await;
            assert_eq!(
                kept,
                std::slice::from_ref(&newest),
                "the chain's head stays in the store"
            );
            sealgate::clock::now_millis() > at_ms(&newest) + CLOCK_WINDOW_MS + 2_000
        },
    )
    .await;

    // The store alone verifies from its first kept seq; the archives followed by it, from seq 1.
    let (status, out) = audit_verify(&[&export], None);
    assert_eq!(status, 0, "{out}");
    let last_seq = newest["seq"].as_u64().unwrap();
    assert!(
        out.contains(&format!("seq {last_seq}..{last_seq}")),
        "{out}"
    );
    let mut all: Vec<&Path> = files.iter().map(|(_, _, path)| path.as_path()).collect();
    all.push(&export);
    let (status, out) = audit_verify(&all, None);
    assert_eq!(status, 0, "{out}");
    assert!(out.contains(&format!("seq 1..{last_seq}")), "{out}");

    // The settled claim went too, while the gateway runs: the keyed retry runs the tool again.
    let claim = format!("/v1/claims/{request_id}");
    until(
        Duration::from_secs(10),
        "the settled claim to leave the store",
        || async { gw.admin(Method::GET, &claim, None).await.0 == 404 },
    )
    .await;
    let (status, again) = gw.call(&key, &token, write(2)).await;
    assert_eq!(again["receipt"]["claim"], "PROCEED", "{status} {again}");
    assert_eq!(tool.count(), 2);
}

/// Watches the store over two sweeps after `ms` has passed (the sweep runs every second): `kept` must
/// hold at every look.
async fn over_two_sweeps_after<F, Fut>(ms: i64, what: &str, mut kept: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    until(Duration::from_secs(30), what, || {
        let look = kept();
        async move {
            assert!(look.await, "{what}: gone");
            sealgate::clock::now_millis() > ms + 2_000
        }
    })
    .await;
}

#[tokio::test]
async fn a_replay_and_an_open_rate_window_outlive_retention_and_a_restart() {
    // Retention wants everything older than 864 ms; a 20 s clock window and `limited.*`'s window of two
    // calls in 60 s are still open when the gateway restarts.
    let dir = tempfile::tempdir().unwrap();
    let config = "retention: { audit_days: 0.00001, archive_dir: archive }\n\
                  limits: { max_clock_skew_secs: 20 }\n";
    let (mut gw, tool) = Gateway::start(dir.path(), config).await;
    let (key, token) = gw.session("exec-kept").await;
    let captured = sealgate::envelope::sign_envelope(
        &key,
        tool_call(1, "limited.one", json!({})),
        &token,
        sealgate::clock::now_secs(),
    );
    let (status, body) = gw.post(&captured).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = gw
        .call(&key, &token, tool_call(2, "limited.two", json!({})))
        .await;
    assert_eq!(status, 200, "{body}");
    // A newer event, so that the charges are not the chain's head (which stays anyway).
    let (status, body) = gw
        .call(&key, &token, tool_call(3, "tool.off", json!({})))
        .await;
    assert_eq!(status, 200, "{body}");
    let charges: Vec<Value> = gw
        .events("exec-kept")
        .await
        .into_iter()
        .filter(|event| event["type"] == "ToolCallAuthorized" && event["tool"] != "tool.off")
        .collect();
    assert_eq!(charges.len(), 2, "{charges:?}");

    over_two_sweeps_after(
        at_ms(&charges[1]) + KEEP_MS,
        "the charges and the captured call's events stay in the store",
        || async {
            let kept = gw.events("exec-kept").await;
            charges.iter().all(|charge| kept.contains(charge))
        },
    )
    .await;

    gw.restart();
    let (status, body) = gw.post(&captured).await;
    assert_eq!((status, code(&body)), (401, 1008), "the replay: {body}");
    let (status, body) = gw
        .call(&key, &token, tool_call(4, "limited.three", json!({})))
        .await;
    assert_eq!(
        (status, code(&body)),
        (429, 2005),
        "a third call in the window: {body}"
    );
    assert_eq!(tool.count(), 3);
}

#[tokio::test]
async fn a_denial_stays_in_force_for_its_whole_time_whatever_claims_days_says() {
    // `claims_days` of 864 ms against `pay.*`'s default `expires_secs` of 900.
    let dir = tempfile::tempdir().unwrap();
    let (gw, tool) = Gateway::start(dir.path(), RETENTION).await;
    let (key, token) = gw.session("exec-denied").await;
    let pay = |id| tool_call(id, "pay.send", json!({"to": "acct-1", "cents": 500}));
    let (status, body) = gw.call(&key, &token, pay(1)).await;
    assert_eq!((status, code(&body)), (403, 4003), "{body}");
    let approval = body["error"]["details"]["approval_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let path = format!("/v1/approvals/{approval}");
    let (status, denied) = gw
        .admin(
            Method::POST,
            &format!("{path}/deny"),
            Some(json!({"reason": "not this payee"})),
        )
        .await;
    assert_eq!(status, 200, "{denied}");
    let decided_ms = chrono::DateTime::parse_from_rfc3339(denied["decided_at"].as_str().unwrap())
        .unwrap()
        .timestamp_millis();

    over_two_sweeps_after(
        decided_ms + KEEP_MS,
        "the denied request stays in the store",
        || async { gw.admin(Method::GET, &path, None).await.0 == 200 },
    )
    .await;
    let (status, body) = gw.call(&key, &token, pay(2)).await;
    assert_eq!((status, code(&body)), (403, 4004), "{body}");
    assert_eq!(tool.count(), 0);
}

#[tokio::test]
async fn a_wider_clock_window_after_a_restart_refuses_what_the_replay_records_no_longer_cover() {
    // Started with 1 s of skew, a replay record lasts until its timestamp is 2 s old; then the operator
    // widens the window to 60 s and restarts.
    let dir = tempfile::tempdir().unwrap();
    let (mut gw, tool) = Gateway::start(dir.path(), "limits: { max_clock_skew_secs: 1 }\n").await;
    let (key, token) = gw.session("exec-widened").await;
    let signed_at = sealgate::clock::now_secs();
    let captured = sealgate::envelope::sign_envelope(
        &key,
        tool_call(1, "tool.off", json!({})),
        &token,
        signed_at,
    );
    let (status, body) = gw.post(&captured).await;
    assert_eq!(status, 200, "{body}");
    // The rule is about time passing: the record's window ends 2 s after the timestamp's second.
    until(
        Duration::from_secs(10),
        "the captured envelope's 1 s window to pass",
        || async { sealgate::clock::now_millis() >= (signed_at + 2) * 1000 },
    )
    .await;
    let config = std::fs::read_to_string(&gw.config_path).unwrap();
    let widened = config.replace("max_clock_skew_secs: 1", "max_clock_skew_secs: 60");
    assert_ne!(config, widened);
    std::fs::write(&gw.config_path, widened).unwrap();
    gw.restart();

    let (status, body) = gw.post(&captured).await;
    assert_eq!((status, code(&body)), (401, 1007), "the replay: {body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("replay records"),
        "{body}"
    );
    assert_eq!(tool.count(), 1);
    // A fresh envelope is in both windows.
    let (status, body) = gw
        .call(&key, &token, tool_call(2, "tool.off", json!({})))
        .await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn a_rate_window_stays_with_its_capability_when_an_edit_moves_it() {
    // `limited.*` admits two calls in 60 s; an unrelated capability inserted above it moves it down the
    // list, and the gateway restarts: neither gives the session a new window (SPEC 20 rule 4).
    let dir = tempfile::tempdir().unwrap();
    let (mut gw, tool) = Gateway::start(dir.path(), "").await;
    let (key, token) = gw.session("exec-moved").await;
    let limited = |id| tool_call(id, "limited.call", json!({"n": id}));
    for id in 1..=2 {
        let (status, body) = gw.call(&key, &token, limited(id)).await;
        assert_eq!(status, 200, "{body}");
    }
    let version = || async {
        let (status, context) = gw
            .admin(Method::GET, "/v1/security-contexts/test", None)
            .await;
        assert_eq!(status, 200, "{context}");
        context["version"].as_str().unwrap().to_owned()
    };
    let before = version().await;
    let policy = dir.path().join("policies/test.yaml");
    let original = std::fs::read_to_string(&policy).unwrap();
    let edited = original.replace(
        "  - tool_pattern: \"limited.*\"",
        "  - tool_pattern: \"report.*\"\n    claim: off\n  - tool_pattern: \"limited.*\"",
    );
    assert_ne!(original, edited);
    std::fs::write(&policy, edited).unwrap();
    until(
        Duration::from_secs(10),
        "the edited context in force",
        || async { version().await != before },
    )
    .await;

    let (status, body) = gw.call(&key, &token, limited(3)).await;
    assert_eq!((status, code(&body)), (429, 2005), "after the edit: {body}");
    gw.restart();
    let (status, body) = gw.call(&key, &token, limited(4)).await;
    assert_eq!(
        (status, code(&body)),
        (429, 2005),
        "after a restart: {body}"
    );
    assert_eq!(tool.count(), 2);
}
