//! Tests of the audit log: chaining, group commit, failure handling, sinks, verification and queries.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::chain::parse_strict;
use super::testing::{JsonlFileBackend, MemoryBackend};
use super::writer::{metric_updates, Tally};
use super::*;
use crate::store::{StoreResult, StoredEvent};

fn authorized(n: usize) -> AuditEvent {
    AuditEvent::new(EventType::ToolCallAuthorized)
        .session_id(format!("exec-{}", n % 3))
        .sub(format!("agent-{}", n % 2))
        .scp("agent-runtime")
        .tool(if n.is_multiple_of(2) {
            "fs.read"
        } else {
            "web.fetch"
        })
        .signature(format!("sig-{n}"))
        .envelope_timestamp(1_771_338_721 + n as i64)
        .claim("NONE")
}

/// The event as the writer chains it, less its chain fields.
trait Unchained {
    fn object(self) -> Result<serde_json::Map<String, Value>, InvalidEvent>;
}

impl Unchained for AuditEvent {
    fn object(self) -> Result<serde_json::Map<String, Value>, InvalidEvent> {
        let event = self.into_unsealed(false)?;
        let link = chain::Link {
            seq: 1,
            prev_hash: GENESIS_HASH,
            at: "2026-11-30T10:00:00.000Z",
            replica: None,
        };
        let (_, stored, _) = chain::seal(&event, &link)?;
        let Ok(Value::Object(mut object)) = serde_json::from_str(&stored.line) else {
            panic!("a sealed event is not an object: {}", stored.line);
        };
        for key in event::CHAIN_KEYS {
            object.remove(key);
        }
        Ok(object)
    }
}

async fn memory_log(backend: &Arc<MemoryBackend>, cfg: &AuditConfig) -> AuditLog {
    let backend: Arc<dyn AuditBackend> = backend.clone();
    match AuditLog::start(backend, cfg).await {
        Ok(log) => log,
        Err(e) => panic!("audit log did not start: {e}"),
    }
}

fn file_cfg(path: &Path) -> AuditConfig {
    AuditConfig {
        file: Some(path.to_owned()),
        ..AuditConfig::default()
    }
}

async fn record_ok(log: &AuditLog, event: AuditEvent) -> Recorded {
    match log.record(event).await {
        Ok(recorded) => recorded,
        Err(e) => panic!("record failed: {e}"),
    }
}

fn seqs(events: &[Value]) -> Vec<u64> {
    events
        .iter()
        .map(|e| e.get("seq").and_then(Value::as_u64).unwrap_or(0))
        .collect()
}

fn text<'a>(event: &'a Value, key: &str) -> &'a str {
    event.get(key).and_then(Value::as_str).unwrap_or("")
}

fn read_lines(path: &Path) -> Vec<String> {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn verify_lines(lines: &[String]) -> Result<VerifyReport, ChainBreak> {
    let mut joined = lines.join("\n");
    joined.push('\n');
    verify_chain(Cursor::new(joined))
}

#[test]
fn event_type_names_are_the_spec_strings() {
    let names = [
        "SessionCreated",
        "SessionRevoked",
        "ToolCallAuthorized",
        "PolicyViolationBlocked",
        "SignatureVerificationFailed",
        "SecurityTokenExpired",
        "EnvelopeRejected",
        "ToolCallCompleted",
        "ToolCallFailed",
        "ClaimSkipped",
        "ClaimBlocked",
        "ClaimResolved",
        "SecurityContextChanged",
        "SecurityContextRejected",
        "ClaimTaken",
        "ClaimSettled",
        "ApprovalRequested",
        "ApprovalGranted",
        "ApprovalDenied",
        "ApprovalUsed",
        "ApprovalExpired",
        "AuditCheckpoint",
        "ToolDefinitionChanged",
        "ToolDefinitionAccepted",
        "AnswerGuarded",
        "ShadowDecisionDiffered",
    ];
    assert_eq!(EventType::ALL.len(), names.len());
    for (event_type, name) in EventType::ALL.iter().zip(names) {
        assert_eq!(serde_json::to_value(event_type).ok(), Some(json!(name)));
        assert_eq!(name.parse::<EventType>(), Ok(*event_type));
    }
    assert!("toolcallauthorized".parse::<EventType>().is_err());
}

#[test]
fn serde_jcs_sorts_keys_by_utf16_code_units() {
    // U+E000 sorts before U+1F600 in UTF-8 but after it in UTF-16 (a surrogate pair starting 0xD83D).
    let object = json!({"\u{e000}": 1, "\u{1f600}": 2, "b": 1.0, "a": 1e21});
    let canonical = serde_jcs::to_string(&object).unwrap_or_default();
    assert_eq!(
        canonical,
        "{\"a\":1e+21,\"b\":1,\"\u{1f600}\":2,\"\u{e000}\":1}"
    );
}

#[test]
fn builder_omits_absent_fields_and_applies_spec_table() {
    let object = authorized(1).object().unwrap_or_default();
    assert_eq!(object.get("decision"), Some(&json!("allow")));
    assert!(object.values().all(|v| !v.is_null()));
    assert!(!object.contains_key("code"));
    assert!(!object.contains_key("rule"));

    let blocked = AuditEvent::new(EventType::ClaimBlocked)
        .object()
        .unwrap_or_default();
    assert_eq!(blocked.get("code"), Some(&json!(4001)));
    assert_eq!(blocked.get("claim"), Some(&json!("PENDING")));
    assert_eq!(blocked.get("decision"), Some(&json!("deny")));

    let invalid = [
        AuditEvent::new(EventType::PolicyViolationBlocked).rule_parts(
            "capability",
            Some(0),
            Some("fs.*"),
        ),
        AuditEvent::new(EventType::PolicyViolationBlocked)
            .code(1002)
            .rule_parts("no_match", None, None),
        AuditEvent::new(EventType::PolicyViolationBlocked).code(2002),
        AuditEvent::new(EventType::PolicyViolationBlocked)
            .code(2002)
            .rule(json!({"kind": "capability", "index": 0, "extra": 1})),
        AuditEvent::new(EventType::PolicyViolationBlocked)
            .code(2002)
            .rule(json!({"kind": "guess"})),
        AuditEvent::new(EventType::ToolCallAuthorized).code(2002),
        AuditEvent::new(EventType::EnvelopeRejected),
        AuditEvent::new(EventType::EnvelopeRejected)
            .code(1000)
            .decision(Decision::Allow),
        AuditEvent::new(EventType::SignatureVerificationFailed).code(1003),
        AuditEvent::new(EventType::ToolCallFailed).code(2005),
        AuditEvent::new(EventType::ClaimSkipped).claim("PROCEED"),
        AuditEvent::new(EventType::ToolCallCompleted).payload_sha256("ABC"),
        AuditEvent::new(EventType::SessionCreated).code(1000),
    ];
    for event in invalid {
        assert!(event.clone().object().is_err(), "accepted {event:?}");
    }
    let policy = AuditEvent::new(EventType::PolicyViolationBlocked)
        .code(2004)
        .rule_parts("capability", Some(1), Some("web.fetch"))
        .object()
        .unwrap_or_default();
    assert_eq!(
        policy.get("rule"),
        Some(&json!({"kind": "capability", "index": 1, "pattern": "web.fetch"}))
    );
}

#[test]
fn invalid_events_say_which_rule_they_break() {
    let message = |event: AuditEvent| event.object().err().map(|e| e.to_string());
    let blocked = || AuditEvent::new(EventType::PolicyViolationBlocked);
    for (event, expected) in [
        (
            blocked(),
            "PolicyViolationBlocked must carry the code of the refusal",
        ),
        (
            blocked().code(1002),
            "code 1002 is not one that PolicyViolationBlocked reports (SPEC 9.1)",
        ),
        (
            blocked().code(2002),
            "PolicyViolationBlocked must carry the rule that decided",
        ),
        (
            blocked().code(2002).rule(json!({"kind": "x", "extra": 1})),
            r#"rule has an unknown field "extra""#,
        ),
        (
            AuditEvent::new(EventType::SessionCreated).code(2002),
            "code 2002 is not one that SessionCreated reports (SPEC 9.1)",
        ),
        (
            AuditEvent::new(EventType::ToolCallCompleted).code(2002),
            "ToolCallCompleted reports no refusal, yet code 2002 was given",
        ),
        (
            AuditEvent::new(EventType::EnvelopeRejected)
                .code(1000)
                .decision(Decision::Allow),
            r#"EnvelopeRejected cannot have decision "allow""#,
        ),
        (
            AuditEvent::new(EventType::ToolCallCompleted).decision(Decision::Deny),
            r#"ToolCallCompleted cannot have decision "deny""#,
        ),
        (
            AuditEvent::new(EventType::ClaimSkipped).claim("PROCEED"),
            r#"ClaimSkipped cannot have claim "PROCEED""#,
        ),
        (
            AuditEvent::new(EventType::SessionCreated).checkpoint(json!({})),
            "checkpoint is carried by AuditCheckpoint events, and only by them",
        ),
        (
            AuditEvent::new(EventType::ToolCallCompleted).payload_sha256("ABC"),
            "payload_sha256 must be 64 lower-case hex digits",
        ),
    ] {
        assert_eq!(message(event).as_deref(), Some(expected));
    }
}

/// Seals `event` as the writer does, and checks that its line is the JCS of the event that the store
/// takes, in serde_json's text too (what the store, the export and the file hold), and that it verifies.
fn sealed_line_is_canonical(event: AuditEvent, include_payloads: bool) -> Value {
    let event = event.into_unsealed(include_payloads).unwrap();
    let prev_hash = "ab".repeat(32);
    let link = chain::Link {
        seq: 7,
        prev_hash: &prev_hash,
        at: "2026-11-30T10:00:00.000Z",
        replica: Some("replica-\"1\""),
    };
    let (sealed, for_store, recorded) = chain::seal(&event, &link).unwrap();
    let stored: Value = serde_json::from_str(&sealed.line).unwrap();
    let text = stored.to_string();
    assert_eq!(sealed.line, text);
    // The store takes what it took from the event read back before it took lines: its text, head and
    // labels.
    assert_eq!(StoredEvent::of_value(&stored), Ok(for_store));
    // serde_json writes doubles, and orders keys beyond ASCII, its own way: only then is the text
    // not the event's JCS (as it was before the writer wrote JCS itself).
    if event.plain {
        assert_eq!(crate::envelope::jcs(&stored), text.as_bytes());
    }
    let report = verify_chain(Cursor::new(format!("{text}\n"))).unwrap();
    assert_eq!(
        (report.last_seq, report.last_hash),
        (7, recorded.hash.clone())
    );
    assert_eq!(stored["hash"], json!(recorded.hash));
    assert_eq!(stored["prev_hash"], json!(prev_hash));
    assert_eq!(stored["replica"], json!("replica-\"1\""));
    stored
}

#[test]
fn at_has_its_layout_from_1970_to_9999() {
    for millis in [0, 1, 999, 1_764_496_800_120, 253_402_300_799_999] {
        let Some(instant) = chrono::DateTime::from_timestamp_millis(millis) else {
            panic!("{millis} is no instant")
        };
        let at = format_at(instant);
        assert_eq!(at, instant.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string());
        assert!(chain::is_valid_at(&at), "{at}");
    }
}

#[test]
fn a_sealed_event_is_its_canonical_line_with_every_field() {
    let who = crate::identity::Identity {
        iss: "https://idp.example".into(),
        sub: "ann".into(),
        name: Some("Ann".into()),
        via: crate::identity::Via::Oidc,
    };
    let failed = AuditEvent::new(EventType::ToolCallFailed)
        .code(5001)
        .decision(Decision::Deny)
        .session_id("exec-1")
        .sub("agent-7")
        .scp("agent-runtime")
        .wid("w")
        .jti("j")
        .auth("oauth")
        .iss("https://idp.example")
        .client_id("host")
        .tool("fs.read_file")
        .signature("sig")
        .envelope_timestamp(-5)
        .payload_sha256("0".repeat(64))
        .rule(json!({"kind": "capability", "index": 3, "pattern": null, "id": "c"}))
        .context_version("v1")
        .request_id("r")
        .claim("PROCEED")
        .action_ref("a")
        .action("fs.read_file")
        .approval_id("ap")
        .duration_ms(12)
        .actor(&who, Some("payments"))
        .team("payments")
        .grants(1, 2)
        .labels_added(&["pii".to_owned(), "\u{e9}".to_owned()])
        .detail("quote \" backslash \\ tab \t nul \u{0} del \u{7f} \u{2028} \u{1f600}")
        .trace_id("0af7651916cd43dd8448eb211c80319c")
        .client_addr("127.0.0.1:9".parse().unwrap())
        .bytes(10)
        .suppressed(3)
        .payload(json!({"b": [1, "x"], "a": {"\u{e000}": 1, "\u{1f600}": 2}}))
        .result(json!({"ok": true, "n": null}))
        .decisions(json!({"live": {"decision": "deny"}, "shadow": {"decision": "allow"}}));
    let stored = sealed_line_is_canonical(failed, true);
    let keys = stored.as_object().map(|o| o.len());
    assert_eq!(keys, Some(42), "{stored}");
    let checkpoint = AuditEvent::new(EventType::AuditCheckpoint)
        .checkpoint(json!({"seq": 6, "hash": "ab".repeat(32), "kid": "k", "sig": "s"}));
    sealed_line_is_canonical(checkpoint, false);
}

#[test]
fn a_sealed_event_keeps_bounded_strings_and_numbers_as_jcs_reads_them() {
    let long = AuditEvent::new(EventType::SessionCreated).detail("é".repeat(300));
    let stored = sealed_line_is_canonical(long, false);
    let detail = stored["detail"].as_str().unwrap_or_default();
    assert_eq!(detail.chars().count(), 256);
    assert!(detail.ends_with('…'));
    // The labels are kept under the session id as the event holds it: bounded too.
    let labelled = AuditEvent::new(EventType::ToolCallCompleted)
        .session_id("s".repeat(300))
        .labels_added(&["pii".to_owned()]);
    let stored = sealed_line_is_canonical(labelled, false);
    assert!(stored["session_id"]
        .as_str()
        .is_some_and(|id| id.ends_with('…')));
    // JCS writes these numbers as doubles: the store gets them as they read back.
    let inexact = AuditEvent::new(EventType::ToolCallCompleted)
        .duration_ms(u64::MAX)
        .result(json!({"x": 1.5, "big": 9_007_199_254_740_993_u64}));
    let stored = sealed_line_is_canonical(inexact, true);
    assert_eq!(stored["duration_ms"], json!(18_446_744_073_709_552_000.0));
    assert_eq!(stored["result"]["big"], json!(9_007_199_254_740_992_u64));
}

#[tokio::test]
async fn events_are_chained_and_seq_continues_after_restart() {
    let backend = Arc::new(MemoryBackend::new());
    let log = memory_log(&backend, &AuditConfig::default()).await;
    for n in 0..5 {
        let recorded = record_ok(&log, authorized(n)).await;
        assert_eq!(recorded.seq, n as u64 + 1);
    }
    log.shutdown().await;
    assert_eq!(log.record(authorized(9)).await, Err(AuditError::Closed));

    let restarted = memory_log(&backend, &AuditConfig::default()).await;
    for n in 5..10 {
        let recorded = record_ok(&restarted, authorized(n)).await;
        assert_eq!(recorded.seq, n as u64 + 1);
    }
    let events = backend.events();
    assert_eq!(seqs(&events), (1..=10).collect::<Vec<u64>>());
    assert_eq!(text(&events[0], "prev_hash"), GENESIS_HASH);
    for pair in events.windows(2) {
        assert_eq!(text(&pair[1], "prev_hash"), text(&pair[0], "hash"));
    }
    for event in &events {
        let id = uuid::Uuid::parse_str(text(event, "event_id")).ok();
        assert_eq!(id.map(|id| id.get_version_num()), Some(4));
        assert!(
            chain::is_valid_at(text(event, "at")),
            "bad at {}",
            text(event, "at")
        );
        assert!(text(event, "at").ends_with('Z'));
        // hash = hex(SHA-256(JCS(event without hash)))
        let mut unhashed = event.clone();
        if let Some(object) = unhashed.as_object_mut() {
            object.remove("hash");
        }
        let canonical = serde_jcs::to_vec(&unhashed).unwrap_or_default();
        assert_eq!(text(event, "hash"), hex::encode(Sha256::digest(&canonical)));
    }
    let report = restarted.verify_store().await;
    assert_eq!(report.as_ref().map(|r| r.events), Ok(10));
    assert_eq!(
        report.map(|r| r.last_hash),
        Ok(text(&events[9], "hash").to_owned())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_records_share_appends() {
    // Each sync costs 5 ms, like an fsync: 200 callers must not pay for 200 of them.
    let backend = Arc::new(MemoryBackend::with_sync_delay(Duration::from_millis(5)));
    let log = memory_log(&backend, &AuditConfig::default()).await;
    let mut tasks = Vec::new();
    for n in 0..200 {
        let log = log.clone();
        tasks.push(tokio::spawn(async move { log.record(authorized(n)).await }));
    }
    let mut recorded_seqs = HashSet::new();
    for task in tasks {
        let recorded = task.await.ok().and_then(Result::ok);
        assert!(recorded.is_some(), "a record failed");
        recorded_seqs.extend(recorded.map(|r| r.seq));
    }
    assert_eq!(recorded_seqs, (1..=200).collect::<HashSet<u64>>());
    let appends = backend.append_calls();
    assert!(appends <= 20, "{appends} appends for 200 concurrent events");
    assert_eq!(log.verify_store().await.map(|r| r.events), Ok(200));
}

/// An event nobody waits for is held, not written, and leads the next batch: a call's two events are one
/// append. Its `at` is when the writer took it, not when that batch was written.
#[tokio::test]
async fn a_deferred_event_leads_the_next_batch_with_the_time_it_was_taken() {
    let backend = Arc::new(MemoryBackend::new());
    let log = memory_log(&backend, &AuditConfig::default()).await;
    let appends = backend.append_calls();
    log.record_deferred(authorized(1)).await.unwrap();
    // A gap the events' millisecond times can show; the writer takes the first event meanwhile.
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert!(backend.events().is_empty(), "held, not written");
    let recorded = record_ok(&log, authorized(2)).await;
    assert_eq!(recorded.seq, 2);
    assert_eq!(backend.append_calls(), appends + 1, "one append for both");
    let events = backend.events();
    assert_eq!(seqs(&events), [1, 2]);
    let at = |event: &Value| chrono::DateTime::parse_from_rfc3339(text(event, "at")).unwrap();
    let gap = at(&events[1]) - at(&events[0]);
    assert!(gap >= chrono::Duration::milliseconds(4), "{gap}");
}

/// A held event is written by the deadline of unsynced ones when no batch follows, and at shutdown.
#[tokio::test(start_paused = true)]
async fn a_held_event_is_written_by_its_deadline_or_at_shutdown() {
    let backend = Arc::new(MemoryBackend::new());
    let log = memory_log(&backend, &AuditConfig::default()).await;
    log.record_deferred(authorized(1)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(seqs(&backend.events()), [1]);
    log.record_deferred(authorized(2)).await.unwrap();
    log.shutdown().await;
    assert_eq!(seqs(&backend.events()), [1, 2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_append_fails_every_waiter_and_the_chain_does_not_fork() {
    let backend = Arc::new(MemoryBackend::with_sync_delay(Duration::from_millis(2)));
    let log = memory_log(&backend, &AuditConfig::default()).await;
    for n in 0..3 {
        record_ok(&log, authorized(n)).await;
    }
    backend.fail_next_appends(usize::MAX, 0);
    let mut tasks = Vec::new();
    for n in 0..50 {
        let log = log.clone();
        tasks.push(tokio::spawn(async move { log.record(authorized(n)).await }));
    }
    for task in tasks {
        let result = task.await.ok();
        assert!(
            matches!(result, Some(Err(AuditError::Store(_)))),
            "a waiter did not get the store error: {result:?}"
        );
    }
    assert_eq!(backend.events().len(), 3);

    // A store that kept 2 events of a failed batch: the next batch continues after them.
    backend.fail_next_appends(1, 2);
    let batch = futures_join(&log, 10..15).await;
    assert!(batch.iter().any(Result::is_err));
    // The head cannot be read either: that batch fails too, and then the log recovers.
    backend.fail_next_appends(1, 0);
    assert!(log.record(authorized(20)).await.is_err());
    backend.fail_next_heads(1);
    assert!(matches!(
        log.record(authorized(21)).await,
        Err(AuditError::Store(_))
    ));

    let after = record_ok(&log, authorized(22)).await;
    let events = backend.events();
    let stored = seqs(&events);
    assert_eq!(stored, (1..=stored.len() as u64).collect::<Vec<u64>>());
    assert_eq!(after.seq, stored.len() as u64);
    assert_eq!(
        log.verify_store().await.map(|r| r.events),
        Ok(stored.len() as u64)
    );
    // Stored = the first 3, what the failed batch kept (1 or 2, by how the batch formed), the callers
    // told "ok", and the last one.
    let ok_count = batch.iter().filter(|r| r.is_ok()).count();
    let kept = stored.len() - 3 - ok_count - 1;
    assert!((1..=2).contains(&kept), "kept {kept}");
}

async fn futures_join(
    log: &AuditLog,
    range: std::ops::Range<usize>,
) -> Vec<Result<Recorded, AuditError>> {
    let mut tasks = Vec::new();
    for n in range {
        let log = log.clone();
        tasks.push(tokio::spawn(async move { log.record(authorized(n)).await }));
    }
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap_or(Err(AuditError::Closed)));
    }
    results
}

#[tokio::test]
async fn payloads_are_dropped_unless_included() {
    const MARKER: &str = "MARKER-7f3a-secret";
    for include_payloads in [false, true] {
        let dir = tempfile::tempdir().ok();
        let Some(dir) = dir else { panic!("no tempdir") };
        let path = dir.path().join("audit.jsonl");
        let cfg = AuditConfig {
            include_payloads,
            ..file_cfg(&path)
        };
        let backend = Arc::new(MemoryBackend::new());
        let log = memory_log(&backend, &cfg).await;
        let event = AuditEvent::new(EventType::ToolCallCompleted)
            .tool("fs.read")
            .payload(json!({"jsonrpc": "2.0", "params": {"arguments": {"path": MARKER}}}))
            .result(json!({"content": [{"type": "text", "text": MARKER}]}));
        record_ok(&log, event).await;
        // The file is a copy written after the commit: shutdown waits for it.
        log.shutdown().await;
        let stored = serde_json::to_string(&backend.events()).unwrap_or_default();
        let file = fs::read_to_string(&path).unwrap_or_default();
        assert_eq!(stored.contains(MARKER), include_payloads);
        assert_eq!(file.contains(MARKER), include_payloads);
        assert!(file.contains("fs.read"));
    }
}

/// Writes `count` events through a log with a file sink and returns the file's lines.
async fn chained_file(dir: &Path, count: usize) -> (PathBuf, Vec<String>) {
    let path = dir.join("audit.jsonl");
    let backend = Arc::new(MemoryBackend::new());
    let log = memory_log(&backend, &file_cfg(&path)).await;
    for n in 0..count {
        record_ok(&log, authorized(n).duration_ms(n as u64)).await;
    }
    log.shutdown().await;
    let lines = read_lines(&path);
    assert_eq!(lines.len(), count);
    (path, lines)
}

fn id_of(line: &str) -> Option<String> {
    parse_strict(line)
        .ok()
        .and_then(|v| v.get("event_id").and_then(Value::as_str).map(str::to_owned))
}

#[tokio::test]
async fn verify_chain_names_the_first_broken_event() {
    let Some(dir) = tempfile::tempdir().ok() else {
        panic!("no tempdir")
    };
    let (path, lines) = chained_file(dir.path(), 10).await;

    let Ok(file) = fs::File::open(&path) else {
        panic!("open {}", path.display())
    };
    let intact = verify_chain(std::io::BufReader::new(file));
    let Ok(report) = intact else {
        panic!("intact file refused: {intact:?}")
    };
    assert_eq!(
        (report.events, report.first_seq, report.last_seq),
        (10, 1, 10)
    );
    assert_eq!(report.first_prev_hash, GENESIS_HASH);

    // Edited: line 5's tool changed.
    let mut edited = lines.clone();
    edited[4] = edited[4].replace("fs.read", "fs.write");
    assert_ne!(edited[4], lines[4]);
    let broken = verify_lines(&edited).err();
    assert_eq!(broken.as_ref().map(|b| (b.line, b.seq)), Some((5, Some(5))));
    assert_eq!(
        broken.as_ref().and_then(|b| b.event_id.clone()),
        id_of(&lines[4])
    );
    assert!(broken.is_some_and(|b| b.reason.contains("hash")));

    // Deleted: line 5 removed; event 6 is the first that no longer links.
    let mut deleted = lines.clone();
    deleted.remove(4);
    let broken = verify_lines(&deleted).err();
    assert_eq!(broken.as_ref().map(|b| (b.line, b.seq)), Some((5, Some(6))));
    assert_eq!(broken.and_then(|b| b.event_id), id_of(&lines[5]));

    // Inserted: a copy of line 3 after it.
    let mut duplicated = lines.clone();
    duplicated.insert(3, lines[2].clone());
    let broken = verify_lines(&duplicated).err();
    assert_eq!(broken.as_ref().map(|b| (b.line, b.seq)), Some((4, Some(3))));
    assert_eq!(broken.and_then(|b| b.event_id), id_of(&lines[2]));

    // Inserted: a well-formed forged event linked to line 3; the genuine event 4 then breaks.
    let mut forged = parse_strict(&lines[3]).unwrap_or_default();
    let prev = parse_strict(&lines[2]).unwrap_or_default();
    if let Some(object) = forged.as_object_mut() {
        object.insert(
            "event_id".to_owned(),
            json!(uuid::Uuid::new_v4().to_string()),
        );
        object.insert("tool".to_owned(), json!("secrets.read"));
        object.insert("prev_hash".to_owned(), json!(text(&prev, "hash")));
        object.remove("hash");
        let canonical = serde_jcs::to_vec(&*object).unwrap_or_default();
        object.insert(
            "hash".to_owned(),
            json!(hex::encode(Sha256::digest(&canonical))),
        );
    }
    let mut inserted = lines.clone();
    inserted.insert(3, forged.to_string());
    let broken = verify_lines(&inserted).err();
    assert_eq!(broken.as_ref().map(|b| (b.line, b.seq)), Some((5, Some(4))));
    assert_eq!(broken.and_then(|b| b.event_id), id_of(&lines[3]));

    // Swapped: lines 4 and 5 exchanged.
    let mut swapped = lines.clone();
    swapped.swap(3, 4);
    let broken = verify_lines(&swapped).err();
    assert_eq!(broken.as_ref().map(|b| (b.line, b.seq)), Some((4, Some(5))));
    assert_eq!(broken.and_then(|b| b.event_id), id_of(&lines[4]));

    // A rotated tail verifies on its own and reports where it links.
    let tail = lines[3..].to_vec();
    let report = verify_lines(&tail);
    let prev_hash = text(&parse_strict(&lines[2]).unwrap_or_default(), "hash").to_owned();
    assert_eq!(
        report.as_ref().map(|r| (r.events, r.first_seq, r.last_seq)),
        Ok((7, 4, 10))
    );
    assert_eq!(report.map(|r| r.first_prev_hash), Ok(prev_hash));

    // A repeated key, a non-canonical number, trailing text, an empty file.
    let mut repeated = lines.clone();
    repeated[1] = repeated[1].replacen('{', "{\"seq\":99,", 1);
    assert_eq!(verify_lines(&repeated).err().map(|b| b.line), Some(2));
    let mut noncanonical = lines.clone();
    noncanonical[2] = noncanonical[2].replace("\"duration_ms\":2", "\"duration_ms\":2.0");
    assert_ne!(noncanonical[2], lines[2]);
    let broken = verify_lines(&noncanonical).err();
    assert_eq!(broken.as_ref().map(|b| (b.line, b.seq)), Some((3, Some(3))));
    assert!(broken.is_some_and(|b| b.reason.contains("canonical")));
    let mut trailing = lines.clone();
    trailing[0].push_str(" {}");
    assert_eq!(verify_lines(&trailing).err().map(|b| b.line), Some(1));
    assert_eq!(verify_chain(Cursor::new("")).err().map(|b| b.line), Some(0));
    // A file that starts mid-chain yet claims to be the genesis.
    let mut fake_genesis = parse_strict(&lines[4]).unwrap_or_default();
    if let Some(object) = fake_genesis.as_object_mut() {
        object.insert("prev_hash".to_owned(), json!(GENESIS_HASH));
        object.remove("hash");
        let canonical = serde_jcs::to_vec(&*object).unwrap_or_default();
        object.insert(
            "hash".to_owned(),
            json!(hex::encode(Sha256::digest(&canonical))),
        );
    }
    assert_eq!(
        verify_lines(&[fake_genesis.to_string()])
            .err()
            .map(|b| b.line),
        Some(1)
    );
}

#[tokio::test]
async fn verify_store_detects_edits_and_gaps() {
    let backend = Arc::new(MemoryBackend::new());
    let log = memory_log(&backend, &AuditConfig::default()).await;
    for n in 0..6 {
        record_ok(&log, authorized(n)).await;
    }
    let events = backend.events();
    let mut edited = events.clone();
    edited[2]["tool"] = json!("secrets.read");
    backend.replace_events(edited);
    let broken = log.verify_store().await.err();
    assert_eq!(broken.as_ref().map(|b| b.seq), Some(Some(3)));
    assert_eq!(
        broken.and_then(|b| b.event_id),
        Some(text(&events[2], "event_id").to_owned())
    );

    let mut gap = events.clone();
    gap.remove(1);
    backend.replace_events(gap);
    let broken = log.verify_store().await.err();
    assert_eq!(broken.as_ref().map(|b| b.seq), Some(Some(1)));
    assert!(broken.is_some_and(|b| b.reason.contains("seq 2")));
}

#[tokio::test]
async fn rotated_files_each_verify_and_join_up() {
    let Some(dir) = tempfile::tempdir().ok() else {
        panic!("no tempdir")
    };
    let path = dir.path().join("audit.jsonl");
    let cfg = AuditConfig {
        rotate_bytes: Some(1500),
        ..file_cfg(&path)
    };
    let backend = Arc::new(MemoryBackend::new());
    let log = memory_log(&backend, &cfg).await;
    for n in 0..25 {
        record_ok(&log, authorized(n)).await;
    }
    log.shutdown().await;

    let mut rotated: Vec<(u64, PathBuf)> = Vec::new();
    for entry in fs::read_dir(dir.path()).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(range) = name.strip_prefix("audit.jsonl.") {
            let first = range.split('-').next().and_then(|s| s.parse().ok());
            assert!(first.is_some(), "unexpected rotated name {name}");
            rotated.push((first.unwrap_or(0), entry.path()));
        }
    }
    rotated.sort();
    assert!(
        rotated.len() >= 2,
        "expected several rotations, got {}",
        rotated.len()
    );
    let mut files: Vec<PathBuf> = rotated.into_iter().map(|(_, p)| p).collect();
    if path.exists() {
        files.push(path.clone());
    }
    let mut previous_last: Option<(u64, String)> = None;
    let mut total = 0;
    let mut all_lines = Vec::new();
    for file in &files {
        let lines = read_lines(file);
        let report = verify_lines(&lines);
        let Ok(report) = report else {
            panic!("{} does not verify: {report:?}", file.display())
        };
        match &previous_last {
            None => assert_eq!(report.first_prev_hash, GENESIS_HASH),
            Some((seq, hash)) => {
                assert_eq!(report.first_seq, seq + 1);
                assert_eq!(&report.first_prev_hash, hash);
            }
        }
        let name = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name != "audit.jsonl" {
            assert_eq!(
                name,
                format!("audit.jsonl.{}-{}", report.first_seq, report.last_seq)
            );
        }
        previous_last = Some((report.last_seq, report.last_hash.clone()));
        total += report.events;
        all_lines.extend(lines);
    }
    assert_eq!(total, 25);
    assert_eq!(verify_lines(&all_lines).map(|r| r.events), Ok(25));
}

/// A memory store and, in a temporary folder, `audit.jsonl` holding the same four events.
async fn four_events_in_a_file() -> (tempfile::TempDir, Arc<MemoryBackend>) {
    let Some(dir) = tempfile::tempdir().ok() else {
        panic!("no tempdir")
    };
    let backend = Arc::new(MemoryBackend::new());
    let first = memory_log(&backend, &file_cfg(&dir.path().join("audit.jsonl"))).await;
    for n in 0..4 {
        record_ok(&first, authorized(n)).await;
    }
    first.shutdown().await;
    (dir, backend)
}

#[tokio::test]
async fn the_file_catches_up_with_the_store_and_never_forks_the_chain() {
    let (dir, backend) = four_events_in_a_file().await;
    let path = dir.path().join("audit.jsonl");
    let second = memory_log(&backend, &file_cfg(&path)).await;
    for n in 4..8 {
        record_ok(&second, authorized(n)).await;
    }
    second.shutdown().await;
    assert_eq!(verify_lines(&read_lines(&path)).map(|r| r.events), Ok(8));

    // Events reach the store but not the file (a crash between the two syncs, or the sink was off):
    // the store is the truth, and the next start extends the file from it.
    let without_file = memory_log(&backend, &AuditConfig::default()).await;
    for n in 8..10 {
        record_ok(&without_file, authorized(n)).await;
    }
    without_file.shutdown().await;
    let third = memory_log(&backend, &file_cfg(&path)).await;
    record_ok(&third, authorized(10)).await;
    third.shutdown().await;
    let lines = read_lines(&path);
    assert_eq!(
        verify_lines(&lines).map(|r| (r.first_seq, r.last_seq)),
        Ok((1, 11))
    );
    let stored: Vec<String> = backend.events().iter().map(Value::to_string).collect();
    assert_eq!(lines, stored, "the file holds exactly the store's chain");

    // A file ahead of the store means the store lost events: starting would reuse their numbers.
    backend.replace_events(backend.events()[..9].to_vec());
    let dyn_backend: Arc<dyn AuditBackend> = backend.clone();
    let refused = AuditLog::start(dyn_backend, &file_cfg(&path)).await;
    let message = refused.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(message.contains("ends at seq 11"), "{message}");
    assert_eq!(read_lines(&path).len(), 11, "the file is left as it was");
    // A store that holds nothing (a lost or replaced data folder) would restart the chain at seq 1.
    backend.replace_events(Vec::new());
    let dyn_backend: Arc<dyn AuditBackend> = backend.clone();
    let refused = AuditLog::start(dyn_backend, &file_cfg(&path)).await;
    let message = refused.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        message.contains("ends at seq 11") && message.contains("seq 0"),
        "{message}"
    );
}

#[tokio::test]
async fn rotated_files_count_when_the_live_file_is_empty() {
    let (dir, backend) = four_events_in_a_file().await;
    let path = dir.path().join("audit.jsonl");
    // As a rotation leaves it: the chain's end is in the rotated file's name, the live file is empty.
    std::fs::rename(&path, dir.path().join("audit.jsonl.1-4")).unwrap();
    std::fs::write(&path, "").unwrap();

    // Events the store took while the file was off are caught up into the live file, from seq 5.
    let without_file = memory_log(&backend, &AuditConfig::default()).await;
    for n in 4..6 {
        record_ok(&without_file, authorized(n)).await;
    }
    without_file.shutdown().await;
    let caught_up = memory_log(&backend, &file_cfg(&path)).await;
    caught_up.shutdown().await;
    assert_eq!(
        verify_lines(&read_lines(&path)).map(|r| (r.first_seq, r.last_seq)),
        Ok((5, 6))
    );

    // A store behind the rotated file is refused even with the live file empty.
    std::fs::write(&path, "").unwrap();
    backend.replace_events(backend.events()[..3].to_vec());
    let dyn_backend: Arc<dyn AuditBackend> = backend.clone();
    let refused = AuditLog::start(dyn_backend, &file_cfg(&path)).await;
    let message = refused.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(message.contains("ends at seq 4"), "{message}");
}

/// A file-backed store whose `sync` waits for a gate, and notes what the file sink held at that moment.
struct GatedBackend {
    inner: JsonlFileBackend,
    sink_path: PathBuf,
    gate: tokio::sync::watch::Receiver<bool>,
    sink_lines_at_sync: Mutex<Vec<usize>>,
}

#[async_trait::async_trait]
impl AuditBackend for GatedBackend {
    async fn head(&self) -> StoreResult<Option<ChainHead>> {
        self.inner.head().await
    }

    async fn append(
        &self,
        after: &ChainHead,
        events: &[StoredEvent],
        settlements: &[ClaimSettlement],
    ) -> StoreResult<()> {
        self.inner.append(after, events, settlements).await
    }

    async fn sync(&self) -> StoreResult<()> {
        let mut gate = self.gate.clone();
        if gate.wait_for(|open| *open).await.is_err() {
            return Err(crate::store::StoreError::unavailable("gate dropped"));
        }
        if let Ok(mut seen) = self.sink_lines_at_sync.lock() {
            seen.push(read_lines(&self.sink_path).len());
        }
        self.inner.sync().await
    }

    async fn events_newest_first(
        &self,
        before_seq: Option<u64>,
        limit: usize,
    ) -> StoreResult<Vec<Value>> {
        self.inner.events_newest_first(before_seq, limit).await
    }

    async fn events_oldest_first(&self, from_seq: u64, limit: usize) -> StoreResult<Vec<Value>> {
        self.inner.events_oldest_first(from_seq, limit).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_returns_only_after_the_store_is_durable_and_the_file_copy_follows() {
    let Some(dir) = tempfile::tempdir().ok() else {
        panic!("no tempdir")
    };
    let store_path = dir.path().join("store.jsonl");
    let sink_path = dir.path().join("audit.jsonl");
    let Ok(inner) = JsonlFileBackend::open(&store_path) else {
        panic!("open store")
    };
    let (gate, gate_rx) = tokio::sync::watch::channel(false);
    let backend = Arc::new(GatedBackend {
        inner,
        sink_path: sink_path.clone(),
        gate: gate_rx,
        sink_lines_at_sync: Mutex::new(Vec::new()),
    });
    let dyn_backend: Arc<dyn AuditBackend> = backend.clone();
    let Ok(log) = AuditLog::start(dyn_backend, &file_cfg(&sink_path)).await else {
        panic!("start")
    };

    let pending = tokio::spawn({
        let log = log.clone();
        async move { log.record(authorized(1)).await }
    });
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(
        !pending.is_finished(),
        "record returned before the store was durable"
    );
    assert!(read_lines(&sink_path).is_empty());

    gate.send_replace(true);
    let recorded = pending.await.ok().and_then(Result::ok);
    assert_eq!(recorded.as_ref().map(|r| r.seq), Some(1));
    // The store reopened from disk holds it, the file holds it, and the file got it after the store.
    let reopened = match JsonlFileBackend::open(&store_path) {
        Ok(b) => b.head().await.ok().flatten(),
        Err(_) => None,
    };
    assert_eq!(
        reopened.map(|h| h.hash),
        recorded.as_ref().map(|r| r.hash.clone())
    );
    // The file is a copy written after the commit, off the caller's path; shutdown drains it.
    log.shutdown().await;
    let sink_lines = read_lines(&sink_path);
    assert_eq!(sink_lines.len(), 1);
    assert_eq!(id_of(&sink_lines[0]), recorded.map(|r| r.event_id));
    assert_eq!(
        backend.sink_lines_at_sync.lock().map(|v| v.clone()).ok(),
        Some(vec![0])
    );
}

#[tokio::test]
async fn large_integers_are_stored_as_hashed() {
    let Some(dir) = tempfile::tempdir().ok() else {
        panic!("no tempdir")
    };
    let path = dir.path().join("audit.jsonl");
    let cfg = AuditConfig {
        include_payloads: true,
        ..file_cfg(&path)
    };
    let backend = Arc::new(MemoryBackend::new());
    let log = memory_log(&backend, &cfg).await;
    let result: Value = serde_json::from_str(r#"{"big": 9007199254740993, "neg": -0.0, "f": 1.5}"#)
        .unwrap_or_default();
    record_ok(
        &log,
        AuditEvent::new(EventType::ToolCallCompleted).result(result),
    )
    .await;
    log.shutdown().await;
    assert_eq!(log.verify_store().await.map(|r| r.events), Ok(1));
    let lines = read_lines(&path);
    assert_eq!(verify_lines(&lines).map(|r| r.events), Ok(1));
    // The rounding slack of JCS cannot hide an edit: ...993 and ...992 hash alike, yet only one is canonical.
    let stored = lines.concat();
    assert!(stored.contains("9007199254740992"));
    let edited = vec![stored.replace("9007199254740992", "9007199254740993")];
    assert!(verify_lines(&edited).is_err());
}

fn query_fixture() -> Vec<AuditEvent> {
    let mut events = Vec::new();
    for n in 0..30 {
        let event = match n % 5 {
            0 => authorized(n),
            1 => AuditEvent::new(EventType::PolicyViolationBlocked)
                .session_id(format!("exec-{}", n % 3))
                .sub("agent-1")
                .tool("fs.delete")
                .code(2001)
                .rule_parts("deny_list", Some(0), Some("fs.delete")),
            2 => AuditEvent::new(EventType::PolicyViolationBlocked)
                .session_id(format!("exec-{}", n % 3))
                .sub("agent-0")
                .tool("web.fetch")
                .code(2004)
                .rule_parts("capability", Some(1), Some("web.fetch")),
            3 => AuditEvent::new(EventType::ToolCallFailed)
                .session_id("exec-9")
                .tool("fs.read")
                .code(5002)
                .trace_id(format!("{:032x}", n % 2)),
            _ => AuditEvent::new(EventType::SessionCreated)
                .session_id(format!("exec-{}", n % 3))
                .actor(&orchestrator(), None),
        };
        events.push(event);
    }
    events
}

fn orchestrator() -> crate::identity::Identity {
    crate::identity::Identity {
        iss: crate::identity::LOCAL_ISSUER.into(),
        sub: "orchestrator".into(),
        name: None,
        via: crate::identity::Via::Key,
    }
}

#[test]
fn the_actor_is_an_identity_with_its_team_and_bounded_strings() {
    let ann = crate::identity::Identity {
        iss: "https://idp.example".into(),
        sub: "ann".into(),
        name: Some("A".repeat(300)),
        via: crate::identity::Via::Oidc,
    };
    let object = AuditEvent::new(EventType::SessionRevoked)
        .actor(&ann, Some("payments"))
        .object()
        .unwrap();
    let actor = &object["actor"];
    assert_eq!(actor["iss"], "https://idp.example");
    assert_eq!(actor["sub"], "ann");
    assert_eq!(actor["via"], "oidc");
    assert_eq!(actor["team"], "payments");
    assert_eq!(actor["name"].as_str().unwrap().chars().count(), 256);
    let object = AuditEvent::new(EventType::SessionRevoked)
        .actor(&orchestrator(), None)
        .object()
        .unwrap();
    assert_eq!(
        object["actor"],
        json!({"iss": crate::identity::LOCAL_ISSUER, "sub": "orchestrator", "via": "key"})
    );
}

async fn run_query(log: &AuditLog, params: &[(&str, &str)]) -> Vec<Value> {
    let Ok(query) = AuditQuery::from_pairs(params.iter().copied()) else {
        panic!("query {params:?} refused")
    };
    match log.query(&query).await {
        Ok(page) => page.items,
        Err(e) => panic!("query failed: {e}"),
    }
}

#[tokio::test]
async fn a_team_bound_query_holds_its_teams_events_and_no_team_less_ones() {
    use crate::identity::TeamFilter;
    let backend = Arc::new(MemoryBackend::new());
    let log = memory_log(&backend, &AuditConfig::default()).await;
    for team in [Some("ops"), Some("payments"), None, Some("ops")] {
        let mut event = AuditEvent::new(EventType::SessionRevoked).session_id("s");
        if let Some(team) = team {
            event = event.team(team);
        }
        record_ok(&log, event).await;
    }
    let seen = |teams: TeamFilter| {
        let log = log.clone();
        async move {
            let page = log
                .query(&AuditQuery {
                    teams,
                    ..AuditQuery::default()
                })
                .await;
            let Ok(page) = page else {
                panic!("query failed")
            };
            seqs(&page.items)
        }
    };
    let ops = TeamFilter::Only(["ops".to_owned()].into());
    assert_eq!(seen(ops).await, [4, 1]);
    let none = TeamFilter::Only(Default::default());
    assert!(seen(none).await.is_empty());
    assert_eq!(seen(TeamFilter::Every).await, [4, 3, 2, 1]);
}

#[tokio::test]
async fn query_filters_newest_first_and_pages_without_gaps() {
    let backend = Arc::new(MemoryBackend::new());
    let log = memory_log(&backend, &AuditConfig::default()).await;
    for (n, event) in query_fixture().into_iter().enumerate() {
        if n == 15 || n == 16 {
            // Give event 16 a millisecond of its own so that from/to have a clean boundary.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        record_ok(&log, event).await;
    }
    let all = backend.events();

    let expect = |filter: &dyn Fn(&Value) -> bool| -> Vec<u64> {
        let mut s: Vec<u64> = seqs(
            &all.iter()
                .filter(|e| filter(e))
                .cloned()
                .collect::<Vec<_>>(),
        );
        s.reverse();
        s
    };
    type Case<'a> = (Vec<(&'a str, &'a str)>, Vec<u64>);
    let cases: Vec<Case> = vec![
        (
            vec![("type", "PolicyViolationBlocked")],
            expect(&|e| text(e, "type") == "PolicyViolationBlocked"),
        ),
        (
            vec![("session_id", "exec-1")],
            expect(&|e| text(e, "session_id") == "exec-1"),
        ),
        (
            vec![("sub", "agent-0")],
            expect(&|e| text(e, "sub") == "agent-0"),
        ),
        (
            vec![("tool", "fs.read")],
            expect(&|e| text(e, "tool") == "fs.read"),
        ),
        (
            vec![("decision", "deny")],
            expect(&|e| text(e, "decision") == "deny"),
        ),
        (
            vec![("decision", "allow")],
            expect(&|e| text(e, "decision") == "allow"),
        ),
        (
            vec![("trace_id", "00000000000000000000000000000001")],
            expect(&|e| text(e, "trace_id") == "00000000000000000000000000000001"),
        ),
        (
            vec![("code", "2004")],
            expect(&|e| e.get("code") == Some(&json!(2004))),
        ),
        (
            vec![
                ("type", "PolicyViolationBlocked"),
                ("sub", "agent-1"),
                ("session_id", "exec-0"),
            ],
            expect(&|e| {
                text(e, "type") == "PolicyViolationBlocked"
                    && text(e, "sub") == "agent-1"
                    && text(e, "session_id") == "exec-0"
            }),
        ),
    ];
    for (params, expected) in cases {
        assert!(
            !expected.is_empty() && expected.len() < 30,
            "weak case {params:?}"
        );
        assert_eq!(
            seqs(&run_query(&log, &params).await),
            expected,
            "query {params:?}"
        );
    }

    let boundary = text(&all[15], "at").to_owned();
    let from = run_query(&log, &[("from", &boundary)]).await;
    assert_eq!(seqs(&from), expect(&|e| text(e, "at") >= boundary.as_str()));
    assert_eq!(from.len(), 15);
    let to = run_query(&log, &[("to", &boundary)]).await;
    assert_eq!(seqs(&to), expect(&|e| text(e, "at") <= boundary.as_str()));
    assert_eq!(to.len(), 16);
    let old_secs = (chrono::Utc::now().timestamp() - 3600).to_string();
    assert_eq!(run_query(&log, &[("to", &old_secs)]).await.len(), 0);
    assert_eq!(
        run_query(&log, &[("from", &old_secs), ("limit", "1000")])
            .await
            .len(),
        30
    );

    // Pages of 7 walk the whole store once, newest first.
    let mut cursor: Option<String> = None;
    let mut walked = Vec::new();
    let mut pages = 0;
    loop {
        let mut query = AuditQuery {
            limit: 7,
            ..AuditQuery::default()
        };
        query.cursor = cursor.clone();
        let Ok(page) = log.query(&query).await else {
            panic!("page failed")
        };
        pages += 1;
        walked.extend(seqs(&page.items));
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
        assert!(pages < 10, "pagination does not end");
    }
    assert_eq!(walked, (1..=30).rev().collect::<Vec<u64>>());
    assert_eq!(pages, 5);
    // Filtered pages too.
    let Ok(first) = log
        .query(&AuditQuery {
            limit: 2,
            decision: Some(Decision::Deny),
            ..AuditQuery::default()
        })
        .await
    else {
        panic!("page failed")
    };
    let Ok(second) = log
        .query(&AuditQuery {
            limit: 100,
            decision: Some(Decision::Deny),
            cursor: first.next_cursor.clone(),
            ..AuditQuery::default()
        })
        .await
    else {
        panic!("page failed")
    };
    let mut joined = seqs(&first.items);
    joined.extend(seqs(&second.items));
    assert_eq!(joined, expect(&|e| text(e, "decision") == "deny"));
    assert_eq!(second.next_cursor, None);
}

#[test]
fn query_parameters_are_validated() {
    let parse = |pairs: &[(&str, &str)]| AuditQuery::from_pairs(pairs.iter().copied());
    assert_eq!(parse(&[]).map(|q| q.limit), Ok(DEFAULT_LIMIT));
    for bad in [
        vec![("limit", "0")],
        vec![("limit", "1001")],
        vec![("limit", "ten")],
        vec![("type", "ToolCallAllowed")],
        vec![("decision", "maybe")],
        vec![("code", "70000")],
        vec![("from", "yesterday")],
        vec![
            ("from", "2026-01-02T00:00:00Z"),
            ("to", "2026-01-01T00:00:00Z"),
        ],
        vec![("cursor", "abc")],
        vec![("cursor", "0")],
        vec![("cursor", "+5")],
        vec![("colour", "blue")],
        vec![("tool", "")],
        vec![("tool", "a"), ("tool", "b")],
        vec![("to", "999999999999999")],
        vec![("trace_id", "4BF92F3577B34DA6A3CE929D0E0E4736")],
        vec![("trace_id", "4bf92f3577b34da6a3ce929d0e0e473")],
    ] {
        assert!(parse(&bad).is_err(), "accepted {bad:?}");
    }
    let Ok(query) = parse(&[
        ("from", "1767225600"),
        ("to", "2026-01-01T01:00:00.500+01:00"),
        ("limit", "1000"),
        ("code", "2004"),
        ("cursor", "17"),
        ("trace_id", "4bf92f3577b34da6a3ce929d0e0e4736"),
    ]) else {
        panic!("valid query refused")
    };
    assert_eq!(query.from.map(|t| t.timestamp()), Some(1_767_225_600));
    assert_eq!(
        query.to.map(|t| t.timestamp_millis()),
        Some(1_767_225_600_500)
    );
    assert_eq!(
        (query.limit, query.code, query.cursor.as_deref()),
        (1000, Some(2004), Some("17"))
    );
    assert_eq!(
        query.trace_id.as_deref(),
        Some("4bf92f3577b34da6a3ce929d0e0e4736")
    );
    let map: HashMap<String, String> = [("sub".to_owned(), "agent-7".to_owned())].into();
    assert_eq!(
        AuditQuery::from_params(&map).map(|q| q.sub),
        Ok(Some("agent-7".to_owned()))
    );
}

#[test]
fn query_errors_keep_the_messages_clients_read() {
    let message = |pairs: &[(&str, &str)]| {
        AuditQuery::from_pairs(pairs.iter().copied())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    for (pairs, expected) in [
        (
            vec![("colour", "blue")],
            r#"unknown query parameter "colour""#,
        ),
        (
            vec![("tool", "a"), ("tool", "b")],
            r#"query parameter "tool" is given more than once"#,
        ),
        (vec![("tool", "")], r#"query parameter "tool" is empty"#),
        (vec![("type", "X")], r#"unknown event type "X""#),
        (
            vec![("decision", "maybe")],
            r#"decision must be "allow" or "deny", not "maybe""#,
        ),
        (vec![("code", "x")], r#"code "x" is not a code number"#),
        (
            vec![("trace_id", "ab")],
            r#"trace_id "ab" is not 32 lower-case hex digits"#,
        ),
        (
            vec![("to", "999999999999999")],
            r#"to "999999999999999" is out of range"#,
        ),
        (
            vec![("from", "yesterday")],
            r#"from "yesterday" is neither Unix seconds nor an RFC 3339 timestamp"#,
        ),
        (
            vec![("limit", "ten")],
            r#"limit "ten" is not a number from 1 to 1000"#,
        ),
        (vec![("limit", "0")], "limit must be from 1 to 1000, not 0"),
        (vec![("from", "2"), ("to", "1")], "from lies after to"),
        (
            vec![("cursor", "+5")],
            r#"cursor "+5" is not one this API gave out"#,
        ),
    ] {
        assert_eq!(message(&pairs), expected);
    }
}

#[tokio::test]
async fn unreadable_bodies_are_rate_limited_and_counted() {
    let backend = Arc::new(MemoryBackend::new());
    let dyn_backend: Arc<dyn AuditBackend> = backend.clone();
    let options = WriterOptions {
        suppressed_report_interval: Duration::from_secs(3600),
        ..WriterOptions::default()
    };
    let Ok(log) = AuditLog::start_with(dyn_backend, &AuditConfig::default(), options).await else {
        panic!("start")
    };
    let addr: std::net::SocketAddr = ([192, 0, 2, 7], 40000).into();
    for n in 0..100 {
        log.record_unreadable(Some(addr), 10 + n);
    }
    log.shutdown().await;
    let events = backend.events();
    let individual: Vec<&Value> = events.iter().filter(|e| e.get("bytes").is_some()).collect();
    let suppressed: u64 = events
        .iter()
        .filter_map(|e| e.get("suppressed").and_then(Value::as_u64))
        .sum();
    assert!(
        (10..=20).contains(&individual.len()),
        "{} individual events",
        individual.len()
    );
    assert_eq!(individual.len() as u64 + suppressed, 100);
    for event in &individual {
        assert_eq!(text(event, "type"), "EnvelopeRejected");
        assert_eq!(event.get("code"), Some(&json!(1000)));
        assert_eq!(text(event, "client_addr"), "192.0.2.7:40000");
        let mut keys: Vec<&str> = event
            .as_object()
            .map(|o| o.keys().map(String::as_str).collect())
            .unwrap_or_default();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "at",
                "bytes",
                "client_addr",
                "code",
                "decision",
                "event_id",
                "hash",
                "prev_hash",
                "seq",
                "type"
            ]
        );
    }
    assert_eq!(
        log.verify_store().await.map(|r| r.events),
        Ok(events.len() as u64)
    );
}

#[tokio::test]
async fn suppressed_count_is_reported_periodically() {
    let backend = Arc::new(MemoryBackend::new());
    let dyn_backend: Arc<dyn AuditBackend> = backend.clone();
    let options = WriterOptions {
        unreadable_per_second: Some(2),
        suppressed_report_interval: Duration::from_millis(50),
        ..WriterOptions::default()
    };
    let Ok(log) = AuditLog::start_with(dyn_backend, &AuditConfig::default(), options).await else {
        panic!("start")
    };
    for _ in 0..30 {
        log.record_unreadable(None, 5);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let events = backend.events();
    let suppressed: u64 = events
        .iter()
        .filter_map(|e| e.get("suppressed").and_then(Value::as_u64))
        .sum();
    let individual = events.iter().filter(|e| e.get("bytes").is_some()).count() as u64;
    assert_eq!(individual, 2);
    assert_eq!(suppressed, 28);
}

fn tally(event: AuditEvent, count_decision: bool) -> Tally {
    match event.into_unsealed(false) {
        Ok(event) => Tally {
            facts: event.facts,
            count_decision,
        },
        Err(e) => panic!("invalid event: {e}"),
    }
}

#[test]
fn metric_labels_follow_the_event() {
    let authorized = AuditEvent::new(EventType::ToolCallAuthorized).claim("PROCEED");
    let updates = metric_updates(&tally(authorized, true));
    assert_eq!(updates.decision, Some(("allow", "none".to_owned())));
    assert_eq!(updates.claim, Some("PROCEED"));
    let updates = metric_updates(&tally(AuditEvent::new(EventType::ClaimBlocked), true));
    assert_eq!(updates.decision, Some(("deny", "4001".to_owned())));
    assert_eq!(updates.claim, Some("PENDING"));
    let skipped = tally(AuditEvent::new(EventType::ClaimSkipped), true);
    assert_eq!(metric_updates(&skipped).claim, Some("SKIP"));
    let completed = AuditEvent::new(EventType::ToolCallCompleted)
        .decision(Decision::Allow)
        .claim("PROCEED");
    assert_eq!(metric_updates(&tally(completed, true)).decision, None);
    let none = AuditEvent::new(EventType::ToolCallAuthorized).claim("NONE");
    assert_eq!(metric_updates(&tally(none, true)).claim, None);
    let unreadable = AuditEvent::new(EventType::EnvelopeRejected).code(1000);
    let updates = metric_updates(&tally(unreadable, false));
    assert_eq!(
        (updates.event_type, updates.decision),
        ("EnvelopeRejected", None)
    );
}

mod recorder {
    //! A minimal global metrics recorder that keeps counter totals for assertions.
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex, OnceLock};

    use metrics::{
        Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit,
    };

    #[derive(Default)]
    pub struct Totals(Mutex<HashMap<String, Arc<AtomicU64>>>);

    struct Handle(Arc<AtomicU64>);

    impl metrics::CounterFn for Handle {
        fn increment(&self, value: u64) {
            self.0.fetch_add(value, Ordering::SeqCst);
        }
        fn absolute(&self, value: u64) {
            self.0.store(value, Ordering::SeqCst);
        }
    }

    fn describe(key: &Key) -> String {
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        format!("{}{{{}}}", key.name(), labels.join(","))
    }

    impl Recorder for &'static Totals {
        fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
        fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
            let mut totals = self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let cell = totals.entry(describe(key)).or_default();
            Counter::from_arc(Arc::new(Handle(Arc::clone(cell))))
        }
        fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
            Gauge::noop()
        }
        fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
            Histogram::noop()
        }
    }

    pub fn totals() -> &'static Totals {
        static TOTALS: OnceLock<&'static Totals> = OnceLock::new();
        TOTALS.get_or_init(|| {
            let totals: &'static Totals = Box::leak(Box::default());
            let _ = metrics::set_global_recorder(totals);
            totals
        })
    }

    impl Totals {
        pub fn get(&self, name: &str) -> u64 {
            let totals = self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            totals.get(name).map_or(0, |c| c.load(Ordering::SeqCst))
        }
    }
}

#[tokio::test]
async fn recorded_events_increment_the_counters() {
    let totals = recorder::totals();
    let decisions = "sealgate_decisions_total{code=2003,decision=deny}";
    let events = "sealgate_audit_events_total{type=SecurityContextRejected}";
    let skips = "sealgate_claims_total{outcome=SKIP}";
    let (d0, e0, s0) = (totals.get(decisions), totals.get(events), totals.get(skips));
    let backend = Arc::new(MemoryBackend::new());
    let log = memory_log(&backend, &AuditConfig::default()).await;
    for _ in 0..3 {
        let blocked = AuditEvent::new(EventType::PolicyViolationBlocked)
            .code(2003)
            .rule_parts("capability", Some(2), Some("cmd.run"));
        record_ok(&log, blocked).await;
    }
    record_ok(
        &log,
        AuditEvent::new(EventType::SecurityContextRejected).detail("bad file"),
    )
    .await;
    record_ok(
        &log,
        AuditEvent::new(EventType::SecurityContextRejected).detail("bad file"),
    )
    .await;
    record_ok(
        &log,
        AuditEvent::new(EventType::ClaimSkipped).request_id("r1"),
    )
    .await;
    // A refused event counts nothing.
    assert!(log
        .record(AuditEvent::new(EventType::PolicyViolationBlocked).code(2003))
        .await
        .is_err());
    assert!(totals.get(decisions) >= d0 + 3);
    assert!(totals.get(events) >= e0 + 2);
    assert!(totals.get(skips) > s0);
}

#[tokio::test]
async fn start_refuses_bad_configuration() {
    let backend: Arc<dyn AuditBackend> = Arc::new(MemoryBackend::new());
    let Some(dir) = tempfile::tempdir().ok() else {
        panic!("no tempdir")
    };
    assert!(matches!(
        AuditLog::start(Arc::clone(&backend), &file_cfg(dir.path())).await,
        Err(StartError::File(FileError::NotAFile(_)))
    ));
    let rotate_without_file = AuditConfig {
        rotate_bytes: Some(100),
        ..AuditConfig::default()
    };
    assert!(matches!(
        AuditLog::start(Arc::clone(&backend), &rotate_without_file).await,
        Err(StartError::Settings(_))
    ));
    let zero_rotation = AuditConfig {
        rotate_bytes: Some(0),
        ..file_cfg(&dir.path().join("a.jsonl"))
    };
    assert!(matches!(
        AuditLog::start(Arc::clone(&backend), &zero_rotation).await,
        Err(StartError::Settings(_))
    ));
    let failing = Arc::new(MemoryBackend::new());
    failing.fail_next_heads(1);
    let failing: Arc<dyn AuditBackend> = failing;
    let refused = AuditLog::start(failing, &AuditConfig::default()).await;
    assert!(matches!(refused, Err(StartError::Store(_))));
    // The store's error names itself once: no "store unavailable: store unavailable".
    let message = refused.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        message.starts_with("cannot read the audit chain from the store: store unavailable: "),
        "{message}"
    );
    let parsed: Result<AuditConfig, _> =
        serde_json::from_value(json!({"file": null, "stdout": false, "colour": 1}));
    assert!(parsed.is_err());
}

#[test]
fn start_needs_a_runtime() {
    use futures_util::FutureExt;
    let backend: Arc<dyn AuditBackend> = Arc::new(MemoryBackend::new());
    // Polled once outside any runtime: it refuses at once instead of spawning nowhere.
    let started = AuditLog::start(backend, &AuditConfig::default()).now_or_never();
    assert!(matches!(started, Some(Err(StartError::NoRuntime))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writers_on_one_store_keep_one_chain_and_name_their_replica() {
    // Two logs on one store stand for two replicas: each append is a compare-and-set on the head, so a
    // writer that lost the race chains its batch again after the other's events.
    let backend = Arc::new(MemoryBackend::with_sync_delay(Duration::from_millis(1)));
    let mut logs = Vec::new();
    for replica in ["a", "b"] {
        let dyn_backend: Arc<dyn AuditBackend> = backend.clone();
        let options = WriterOptions {
            replica: Some(replica.to_owned()),
            ..WriterOptions::default()
        };
        match AuditLog::start_with(dyn_backend, &AuditConfig::default(), options).await {
            Ok(log) => logs.push(log),
            Err(e) => panic!("start: {e}"),
        }
    }
    let mut tasks = Vec::new();
    for n in 0..200 {
        let log = logs[n % 2].clone();
        tasks.push(tokio::spawn(async move { log.record(authorized(n)).await }));
    }
    let mut receipts = Vec::new();
    for task in tasks {
        match task.await {
            Ok(Ok(recorded)) => receipts.push(recorded),
            other => panic!("record failed: {other:?}"),
        }
    }
    assert_eq!(logs[0].verify_store().await.map(|r| r.events), Ok(200));
    let events = backend.events();
    for receipt in &receipts {
        let stored = &events[(receipt.seq - 1) as usize];
        assert_eq!(
            text(stored, "hash"),
            receipt.hash,
            "a receipt names another event"
        );
    }
    let by = |r: &str| events.iter().filter(|e| text(e, "replica") == r).count();
    assert_eq!((by("a"), by("b")), (100, 100));
}

#[tokio::test]
async fn a_settlement_is_stored_with_its_event_and_only_with_it() {
    let backend = Arc::new(MemoryBackend::new());
    let log = memory_log(&backend, &AuditConfig::default()).await;
    let pending = crate::store::conformance::claim(crate::store::ClaimKind::Invoke, "r", 1);
    let settlement = crate::claim::answered(&pending, &json!({"jsonrpc": "2.0", "id": 1}));
    // A batch the store refuses takes its settlement with it; the caller's retry brings it again.
    backend.fail_next_appends(1, 0);
    assert!(log
        .record_with_settlement(authorized(1), Some(settlement.clone()))
        .await
        .is_err());
    assert_eq!(backend.settlements(), []);
    let recorded = log
        .record_with_settlement(authorized(1), Some(settlement.clone()))
        .await
        .unwrap();
    assert_eq!(backend.settlements(), [settlement]);
    assert_eq!(backend.events().len(), 1);
    assert_eq!(recorded.seq, 1);
}

/// Signs nothing: marks the head it is asked to cover, as the gateway's signer would sign it.
struct MarkingSigner;

impl CheckpointSigner for MarkingSigner {
    fn checkpoint(&self, head: &ChainHead) -> AuditEvent {
        AuditEvent::new(EventType::AuditCheckpoint)
            .checkpoint(json!({"seq": head.seq, "hash": head.hash, "kid": "test", "sig": "-"}))
    }
}

async fn checkpointed_log(backend: &Arc<MemoryBackend>, every: u64) -> AuditLog {
    let options = WriterOptions {
        checkpoints: Some(CheckpointOptions {
            every,
            interval: Duration::from_secs(60),
            signer: Arc::new(MarkingSigner),
        }),
        ..WriterOptions::default()
    };
    let backend: Arc<dyn AuditBackend> = backend.clone();
    match AuditLog::start_with(backend, &AuditConfig::default(), options).await {
        Ok(log) => log,
        Err(e) => panic!("audit log did not start: {e}"),
    }
}

/// The seqs of the checkpoints, each checked to cover the event just before it.
fn checkpoint_seqs(events: &[Value]) -> Vec<u64> {
    let mut found = Vec::new();
    for (index, event) in events.iter().enumerate() {
        if text(event, "type") != "AuditCheckpoint" {
            continue;
        }
        let before = &events[index - 1];
        assert_eq!(event["checkpoint"]["seq"], before["seq"], "{event}");
        assert_eq!(event["checkpoint"]["hash"], before["hash"], "{event}");
        found.push(event["seq"].as_u64().unwrap_or(0));
    }
    found
}

#[tokio::test]
async fn a_checkpoint_follows_every_multiple_of_checkpoint_every_and_answers_nobody() {
    let backend = Arc::new(MemoryBackend::new());
    let log = checkpointed_log(&backend, 3).await;
    let mut answered = Vec::new();
    for n in 0..7 {
        answered.push(record_ok(&log, authorized(n)).await.seq);
    }
    // 1 2 3 [4] 5 6 [7] 8 9 [10]: the callers get the seqs of their own events.
    assert_eq!(answered, [1, 2, 3, 5, 6, 8, 9]);
    let events = backend.events();
    assert_eq!(checkpoint_seqs(&events), [4, 7, 10]);
    assert_eq!(seqs(&events), (1..=10).collect::<Vec<u64>>());
    let lines: Vec<String> = events.iter().map(Value::to_string).collect();
    assert!(verify_lines(&lines).is_ok());
}

#[tokio::test]
async fn a_clean_shutdown_signs_the_tail_once() {
    let backend = Arc::new(MemoryBackend::new());
    let log = checkpointed_log(&backend, 1000).await;
    record_ok(&log, authorized(1)).await;
    record_ok(&log, authorized(2)).await;
    // Held, not written: shutdown writes it before the checkpoint that covers it.
    log.record_deferred(authorized(3)).await.unwrap();
    log.shutdown().await;
    assert_eq!(checkpoint_seqs(&backend.events()), [4]);
    // A second writer on the same chain finds its head signed, and adds nothing at its shutdown.
    let again = checkpointed_log(&backend, 1000).await;
    again.shutdown().await;
    assert_eq!(seqs(&backend.events()), [1, 2, 3, 4]);
}

/// An export's checkpoint (SPEC 20 rule 7) covers the events held when it was asked, even when a checkpoint
/// already ends the stored chain.
#[tokio::test]
async fn signing_the_head_writes_held_events_first() {
    let backend = Arc::new(MemoryBackend::new());
    let log = checkpointed_log(&backend, 1000).await;
    record_ok(&log, authorized(1)).await;
    assert_eq!(log.sign_head().await, Some(2));
    log.record_deferred(authorized(2)).await.unwrap();
    assert_eq!(log.sign_head().await, Some(4));
    assert_eq!(seqs(&backend.events()), [1, 2, 3, 4]);
    assert_eq!(checkpoint_seqs(&backend.events()), [2, 4]);
}

#[tokio::test(start_paused = true)]
async fn the_interval_signs_a_tail_and_leaves_a_signed_head_alone() {
    let backend = Arc::new(MemoryBackend::new());
    let log = checkpointed_log(&backend, 1000).await;
    record_ok(&log, authorized(1)).await;
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert_eq!(checkpoint_seqs(&backend.events()), [2]);
    // Nothing new since: the next interval adds nothing.
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert_eq!(seqs(&backend.events()), [1, 2]);
    record_ok(&log, authorized(2)).await;
    tokio::time::sleep(Duration::from_secs(61)).await;
    assert_eq!(checkpoint_seqs(&backend.events()), [2, 4]);
}

#[test]
fn every_call_refusal_names_its_audit_event() {
    use crate::error::Code;
    assert_eq!(
        EventType::recording(Code::EnvelopeReplayed),
        Some(EventType::EnvelopeRejected)
    );
    assert_eq!(
        EventType::recording(Code::IdempotencyKeyReused),
        Some(EventType::ClaimBlocked)
    );
    assert_eq!(
        EventType::recording(Code::ResponseTooLarge),
        Some(EventType::ToolCallFailed)
    );
    for &code in Code::ALL {
        let control_api = (6000..7000).contains(&code.number());
        assert_eq!(
            EventType::recording(code).is_none(),
            control_api,
            "{code:?}"
        );
    }
}
