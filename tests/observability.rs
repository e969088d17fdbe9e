//! The gateway's own log and its trace ids, through the real binary: `log:` levels and formats, `RUST_LOG`,
//! colour only on a terminal, one line per refusal, and W3C `traceparent` joining a caller's trace to the
//! error body, the response, the audit events and `GET /v1/audit?trace_id=`.

mod common;

use std::path::Path;
use std::process::Command;

use common::{code, tool_call, write_config, Gateway, Keys, Stderr};
use reqwest::Method;
use serde_json::{json, Value};

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

/// Starts the binary with `extra` configuration and `env`, its standard error piped to the test (so not
/// a terminal) and none of the test's own log settings passed on.
async fn start_logged(dir: &Path, extra: &str, env: &[(&str, &str)]) -> (Gateway, Stderr) {
    Gateway::start_capturing(dir, extra, |command| {
        command
            .env_remove("SEALGATE_LOG__LEVEL")
            .env_remove("RUST_LOG")
            .env_remove("NO_COLOR")
            .envs(env.iter().copied());
    })
    .await
}

/// The trace id of an answered `traceparent`, after checking its form: version 00, our own span id.
fn answered_trace_id(traceparent: &str) -> String {
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    assert_eq!(parts[0], "00");
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    assert!(
        hex(parts[1], 32) && hex(parts[2], 16) && hex(parts[3], 2),
        "{traceparent}"
    );
    assert_ne!(parts[2], PARENT, "the gateway answers with its own span id");
    parts[1].to_owned()
}

async fn audit_by_trace(gw: &Gateway, trace_id: &str) -> Vec<Value> {
    let (status, page) = gw
        .admin(Method::GET, &format!("/v1/audit?trace_id={trace_id}"), None)
        .await;
    assert_eq!(status, 200, "{page}");
    page["items"].as_array().unwrap().clone()
}

#[tokio::test]
async fn json_log_has_one_info_line_per_refusal_without_argument_values() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, stderr) = start_logged(dir.path(), "log: { format: json }\n", &[]).await;
    let (key, token) = gw.session("exec-json-log").await;
    let marker = "marker-9f3c61d2";
    let (status, body) = gw
        .call(
            &key,
            &token,
            tool_call(1, "tool.read", json!({"path": format!("/etc/{marker}")})),
        )
        .await;
    assert_eq!((status, code(&body)), (403, 2002), "{body}");
    let trace_id = body["error"]["trace_id"].as_str().unwrap().to_owned();
    // A call that succeeds writes nothing at the default level (info).
    let (status, _) = gw
        .call(
            &key,
            &token,
            tool_call(2, "tool.read", json!({"path": "/workspace/a"})),
        )
        .await;
    assert_eq!(status, 200);

    let is_refusal = |l: &str| l.contains("call refused") && l.contains(&trace_id);
    stderr.wait_for("about the refusal", is_refusal);
    let lines = stderr.lines();
    let parsed: Vec<Value> = lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(parsed.iter().all(Value::is_object));
    let refusals: Vec<&Value> = parsed
        .iter()
        .filter(|l| l["message"] == "call refused")
        .collect();
    assert_eq!(refusals.len(), 1, "{lines:#?}");
    let line = refusals[0];
    assert_eq!(line["level"], "INFO");
    assert_eq!(line["code"], 2002);
    assert_eq!(line["name"], "POLICY_VIOLATION_PATH_NOT_ALLOWED");
    assert_eq!(line["tool"], "tool.read");
    assert_eq!(line["trace_id"], trace_id.as_str());
    assert!(parsed.iter().any(|l| l["message"] == "sealgate ready"));
    assert!(parsed.iter().all(|l| l["level"] != "DEBUG"), "{lines:#?}");
    assert!(
        lines.iter().all(|l| !l.contains(marker)),
        "an argument value reached the log: {lines:#?}"
    );
}

#[tokio::test]
async fn rust_log_replaces_the_configured_level_and_text_has_no_colour_in_a_pipe() {
    let dir = tempfile::tempdir().unwrap();
    // The file asks for warnings only; RUST_LOG wins as a whole.
    let (gw, stderr) = start_logged(
        dir.path(),
        "log: { level: warn }\n",
        &[("RUST_LOG", "debug"), ("SEALGATE_LOG", "info")],
    )
    .await;
    let (key, token) = gw.session("exec-text-log").await;
    let (status, _) = gw
        .call(
            &key,
            &token,
            tool_call(1, "tool.read", json!({"path": "/workspace/a"})),
        )
        .await;
    assert_eq!(status, 200);
    let (_, body) = gw
        .call(&key, &token, tool_call(2, "tool.forbidden", json!({})))
        .await;
    let trace_id = body["error"]["trace_id"].as_str().unwrap().to_owned();

    stderr.wait_for("at debug", |l| {
        l.contains("DEBUG") && l.contains("call answered")
    });
    let refusal = stderr.wait_for("about the refusal", |l| l.contains("call refused"));
    assert!(refusal.contains(" INFO "), "{refusal}");
    assert!(refusal.contains("code=2001"), "{refusal}");
    assert!(refusal.contains("tool=\"tool.forbidden\""), "{refusal}");
    assert!(
        refusal.contains(&format!("trace_id=\"{trace_id}\"")),
        "{refusal}"
    );
    // The variable of earlier versions is named, not silently ignored.
    stderr.wait_for("about SEALGATE_LOG", |l| {
        l.contains("SEALGATE_LOG is no longer read")
    });
    let lines = stderr.lines();
    assert!(
        lines.iter().all(|l| !l.contains('\u{1b}')),
        "colour codes in redirected stderr: {lines:#?}"
    );
}

#[test]
fn a_bad_log_setting_stops_start_up_with_its_error() {
    let dir = tempfile::tempdir().unwrap();
    let keys = Keys::new();
    let serve = |extra: &str, rust_log: &str| {
        let config = write_config(dir.path(), &keys, "http://127.0.0.1:9", "", extra);
        let out = Command::new(env!("CARGO_BIN_EXE_sealgate"))
            .args(["serve", "--config"])
            .arg(&config)
            .env("RUST_LOG", rust_log)
            .env("TEST_TOOL_CREDENTIAL", "x")
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let stderr = serve("", "sealgate=loud");
    assert!(
        stderr.contains("RUST_LOG \"sealgate=loud\" is not a log filter"),
        "{stderr}"
    );
    // The configuration is read before the log starts; its errors still reach the operator.
    let stderr = serve("log: { level: loud }\n", "");
    assert!(stderr.contains("loud"), "{stderr}");
}

#[tokio::test]
async fn a_callers_traceparent_joins_the_answer_the_audit_events_and_the_query() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, _tool) = Gateway::start(dir.path(), "").await;
    let (key, token) = gw.session("exec-traced").await;
    let incoming = format!("00-{TRACE}-{PARENT}-01");

    // A refusal: the error body and the answered traceparent name the caller's trace, flags kept.
    let (status, body, answered) = gw
        .call_traced(
            &key,
            &token,
            tool_call(1, "tool.read", json!({"path": "/etc/passwd"})),
            &[&incoming],
        )
        .await;
    assert_eq!((status, code(&body)), (403, 2002), "{body}");
    assert_eq!(body["error"]["trace_id"], TRACE);
    assert_eq!(answered_trace_id(&answered), TRACE);
    assert!(answered.ends_with("-01"), "{answered}");
    let refused = audit_by_trace(&gw, TRACE).await;
    assert_eq!(refused.len(), 1, "{refused:#?}");
    assert_eq!(refused[0]["type"], "PolicyViolationBlocked");

    // A success carries the trace in its header, and every event of the call records it.
    let second = "0af7651916cd43dd8448eb211c80319c";
    let (status, body, answered) = gw
        .call_traced(
            &key,
            &token,
            tool_call(2, "tool.read", json!({"path": "/workspace/a"})),
            &[&format!("00-{second}-{PARENT}-00")],
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(answered_trace_id(&answered), second);
    let events = audit_by_trace(&gw, second).await;
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["ToolCallCompleted", "ToolCallAuthorized"]);
    assert!(events.iter().all(|e| e["trace_id"] == second));
    assert_eq!(events[0]["event_id"], body["receipt"]["event_id"]);

    // The filter returns exactly the events that carry the id: the whole trail agrees.
    let (_, all) = gw.admin(Method::GET, "/v1/audit?limit=1000", None).await;
    let all = all["items"].as_array().unwrap();
    for trace_id in [TRACE, second] {
        let carrying: Vec<&Value> = all.iter().filter(|e| e["trace_id"] == trace_id).collect();
        let queried = audit_by_trace(&gw, trace_id).await;
        assert_eq!(carrying, queried.iter().collect::<Vec<_>>());
    }
    // Control-API events carry their request's trace too (the session registration above had its own).
    assert!(all
        .iter()
        .any(|e| e["type"] == "SessionCreated"
            && e["trace_id"].as_str().is_some_and(|t| t.len() == 32)));

    let (status, refused) = gw
        .admin(
            Method::GET,
            "/v1/audit?trace_id=4BF92F3577B34DA6A3CE929D0E0E4736",
            None,
        )
        .await;
    assert_eq!((status, code(&refused)), (422, 6005), "{refused}");

    // The trace id is part of the hashed event: the file verifies, and changing one id breaks it.
    gw.audit_file().await;
    let file = dir.path().join("audit.jsonl");
    let (status, report) = common::run_cli(&["audit", "verify", file.to_str().unwrap()]);
    assert_eq!(status, 0, "{report}");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains(second));
    let edited = dir.path().join("edited.jsonl");
    std::fs::write(&edited, text.replace(second, &"1".repeat(32))).unwrap();
    let (status, report) = common::run_cli(&["audit", "verify", edited.to_str().unwrap()]);
    assert_eq!(status, 1, "{report}");
}

#[tokio::test]
async fn an_invalid_or_repeated_traceparent_is_ignored_for_a_fresh_trace() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, _tool) = Gateway::start(dir.path(), "").await;
    let (key, token) = gw.session("exec-untraced").await;
    let valid = format!("00-{TRACE}-{PARENT}-01");
    let cases: [Vec<String>; 4] = [
        vec![format!("00-{}-{PARENT}-01", TRACE.to_uppercase())],
        vec![format!("00-{}-{PARENT}-01", "0".repeat(32))],
        vec![format!("00-{TRACE}-{}-01", "0".repeat(16))],
        vec![valid.clone(), valid],
    ];
    let mut seen = Vec::new();
    for (n, headers) in cases.iter().enumerate() {
        let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
        let (status, body, answered) = gw
            .call_traced(
                &key,
                &token,
                tool_call(n as u64, "tool.forbidden", json!({})),
                &headers,
            )
            .await;
        assert_eq!((status, code(&body)), (403, 2001), "{body}");
        let fresh = answered_trace_id(&answered);
        assert_ne!(fresh, TRACE, "{headers:?} was honoured");
        assert_ne!(fresh, "0".repeat(32));
        assert!(
            answered.ends_with("-00"),
            "a trace that starts here is not sampled: {answered}"
        );
        assert_eq!(body["error"]["trace_id"], fresh.as_str());
        let events = audit_by_trace(&gw, &fresh).await;
        assert_eq!(events.len(), 1, "{events:#?}");
        assert_eq!(events[0]["code"], 2001);
        seen.push(fresh);
    }
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 4, "every call gets a trace of its own");
    assert!(audit_by_trace(&gw, TRACE).await.is_empty());
}
