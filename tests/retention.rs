//! Retention (SPEC 12 r3) through the real binary, on either store: audit events older than
//! `retention.audit_days` leave the store only after they are in synced `audit-FIRST-LAST.jsonl` archives,
//! the newest event stays, the archives and the store verify as one chain, and settled claims older than
//! `retention.claims_days` are removed, so that a keyed retry runs again.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{audit_verify, keyed_call, until, Gateway};
use reqwest::Method;
use serde_json::{json, Value};

/// 0.00001 days is 864 ms, so the sweep runs every second (its floor) and anything older goes.
const RETENTION: &str =
    "retention: { audit_days: 0.00001, claims_days: 0.00001, archive_dir: archive }\n";
const KEEP_MS: i64 = 864;

/// The archive files, oldest first, with the `FIRST` and `LAST` seqs that their names give.
fn archives(dir: &Path) -> Vec<(u64, u64, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<(u64, u64, PathBuf)> = entries
        .map(|entry| entry.unwrap().path())
        .filter_map(|path| {
            let name = path.file_name()?.to_str()?.to_owned();
            let range = name.strip_prefix("audit-")?.strip_suffix(".jsonl")?;
            let (first, last) = range.split_once('-')?;
            Some((first.parse().ok()?, last.parse().ok()?, path))
        })
        .collect();
    found.sort();
    found
}

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
            sealgate::clock::now_millis() > at_ms(&newest) + KEEP_MS + 2_000
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
