//! The gateway's own log and its trace ids, through the real binary: `log:` levels and formats, `RUST_LOG`,
//! colour only on a terminal, one line per refusal, and W3C `traceparent` joining a caller's trace to the
//! error body, the response, the audit events and `GET /v1/audit?trace_id=`.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use common::{code, ready_url, start_tool, tool_call, write_config, Gateway, Keys, Lines};
use reqwest::Method;
use serde_json::{json, Value};

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

/// Starts the binary with `extra` configuration and `env`, its standard error piped to the test (so not
/// a terminal) and none of the test's own log settings passed on.
async fn start_logged(dir: &Path, extra: &str, env: &[(&str, &str)]) -> (Gateway, Lines) {
    start_logged_with(dir, |_| String::new(), extra, env).await
}

/// Like [`start_logged`], with upstreams added: `upstreams` gets the test tool's base URL.
async fn start_logged_with(
    dir: &Path,
    upstreams: impl FnOnce(&str) -> String,
    extra: &str,
    env: &[(&str, &str)],
) -> (Gateway, Lines) {
    Gateway::start_capturing(dir, upstreams, extra, |command| {
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
        &[("RUST_LOG", "debug")],
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

#[test]
fn the_log_variable_of_earlier_versions_stops_start_up_and_says_what_replaced_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &Keys::new(), "http://127.0.0.1:9", "", "");
    let (status, output) = common::run_cli_with_env(
        &["serve", "--config", config.to_str().unwrap()],
        &[("SEALGATE_LOG", "info")],
    );
    assert_eq!(status, 1, "{output}");
    assert!(
        output.contains(
            "SEALGATE_LOG is no longer read; set log.level (SEALGATE_LOG__LEVEL) or RUST_LOG"
        ),
        "{output}"
    );
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

/// A credential planted everywhere one can hide: upstream URL queries and headers, the webhook URL's
/// userinfo and query, the store URL's password, and argument values.
const MARK: &str = "Sekr3tMark";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_log_line_holds_a_credential_whatever_fails_even_at_trace() {
    let dir = tempfile::tempdir().unwrap();
    let everything_port = common::mcp::free_port();
    let _everything = common::mcp::start_everything(
        &common::mcp::server_script("server-everything"),
        everything_port,
    )
    .await;
    let upstreams = |tool: &str| {
        let tls = tool.replacen("http://", "https://", 1);
        format!(
            "  refused: {{ http: {{ url: \"http://127.0.0.1:1/rpc?api_key={MARK}\" }}, timeout_ms: 1000 }}\n  \
             late: {{ http: {{ url: \"{tool}/slow?api_key={MARK}\" }}, timeout_ms: 300 }}\n  \
             garbled: {{ http: {{ url: \"{tool}/bad?api_key={MARK}\" }}, headers: {{ X-Api-Key: \"{MARK}\" }} }}\n  \
             tls: {{ http: {{ url: \"{tls}/rpc?api_key={MARK}\" }}, timeout_ms: 2000 }}\n  \
             nowhere: {{ http: {{ url: \"http://sealgate-test.invalid/rpc?api_key={MARK}\" }}, timeout_ms: 2000 }}\n  \
             everything: {{ mcp: {{ url: \"http://127.0.0.1:{everything_port}/mcp?api_key={MARK}\" }}, headers: {{ Authorization: \"Bearer {MARK}\" }} }}\n"
        )
    };
    let webhook = format!(
        "approvals: {{ webhook_url: \"http://hook:{MARK}@127.0.0.1:1/hook?token={MARK}\" }}\n"
    );
    let (gw, stderr) =
        start_logged_with(dir.path(), upstreams, &webhook, &[("RUST_LOG", "trace")]).await;
    let (key, token) = gw.session_in("exec-secrets", "other").await;
    let arguments = json!({"secret": MARK, "path": format!("/workspace/{MARK}")});
    for (id, tool, expected) in [
        (1, "refused.op", 5001),
        (2, "late.op", 5002),
        (3, "garbled.op", 5003),
        (4, "tls.op", 5001),
    ] {
        let (status, body) = gw
            .call(&key, &token, tool_call(id, tool, arguments.clone()))
            .await;
        assert_eq!(code(&body), expected, "{tool}: {status} {body}");
    }
    // DNS: refused by the resolver (5001), or slower than the upstream's timeout (5002).
    let (_, body) = gw
        .call(&key, &token, tool_call(5, "nowhere.op", arguments.clone()))
        .await;
    assert!([5001, 5002].contains(&code(&body)), "{body}");
    // Through rmcp, which logs whole JSON-RPC messages at trace: an argument value and its echo.
    let (status, body) = gw
        .call(
            &key,
            &token,
            tool_call(6, "everything.echo", json!({"message": MARK})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // Refused by the policy, and held for an approval whose webhook cannot be reached.
    let (test_key, test_token) = gw.session("exec-secrets-test").await;
    for (id, tool, expected) in [
        (7, "tool.read", 2002),
        (8, "tool.forbidden", 2001),
        (9, "pay.send", 4003),
    ] {
        let payload = tool_call(
            id,
            tool,
            json!({"path": format!("/etc/{MARK}"), "to": MARK}),
        );
        let (_, body) = gw.call(&test_key, &test_token, payload).await;
        assert_eq!(code(&body), expected, "{tool}: {body}");
    }

    for upstream in ["refused", "late", "garbled", "tls", "nowhere"] {
        stderr.wait_for(&format!("about {upstream}'s failure"), |l| {
            l.contains("tool call failed") && l.contains(&format!("upstream={upstream}"))
        });
    }
    // The URL is there for the operator: scheme, host, port and path.
    stderr.wait_for("naming the refused URL", |l| {
        l.contains("tool call failed") && l.contains("http://127.0.0.1:1/rpc")
    });
    stderr.wait_for("about the webhook", |l| {
        l.contains("approval webhook failed") && l.contains("http://127.0.0.1:1/hook")
    });
    let operator_token = gw.keys.operator_token("seal.admin");
    gw.admin(Method::GET, "/v1/audit?limit=5", None).await;
    let lines = stderr.lines();
    assert!(
        lines.len() > 100,
        "a trace-level log: {} lines",
        lines.len()
    );
    for secret in [
        MARK,
        token.as_str(),
        test_token.as_str(),
        operator_token.as_str(),
    ] {
        let found: Vec<&String> = lines.iter().filter(|l| l.contains(secret)).collect();
        assert!(found.is_empty(), "{secret} reached the log: {found:#?}");
    }

    // The store's password, when the database cannot be reached, at every level.
    let store_dir = tempfile::tempdir().unwrap();
    let store =
        format!("store: \"postgres://postgres:{MARK}@127.0.0.1:1/sealgate?sslmode=disable\"\n");
    let config = write_config(
        store_dir.path(),
        &Keys::new(),
        "http://127.0.0.1:9",
        "",
        &store,
    );
    for args in [
        vec!["serve", "--config"],
        vec!["serve", "--check", "--config"],
    ] {
        let mut args = args;
        args.push(config.to_str().unwrap());
        let env = [("RUST_LOG", "trace"), ("TEST_TOOL_CREDENTIAL", "x")];
        let output = common::run_refused(&args, &env);
        assert!(output.contains("store: "), "{output}");
        assert!(!output.contains(MARK), "{args:?}: {output}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_json_mode_every_line_on_stdout_and_stderr_is_one_json_object() {
    let dir = tempfile::tempdir().unwrap();
    let (_tool, tool_base) = start_tool().await;
    let keys = Arc::new(Keys::new());
    let config = write_config(dir.path(), &keys, &tool_base, "", "log: { format: json }\n");
    let launch = |listen: &str| {
        Command::new(env!("CARGO_BIN_EXE_sealgate"))
            .args(["serve", "--config"])
            .arg(&config)
            .env("TEST_TOOL_CREDENTIAL", "Bearer tool-secret")
            .env("RUST_LOG", "debug")
            .env("SEALGATE_LISTEN", listen)
            // Audit events on stdout too, beside the ready line.
            .env("SEALGATE_AUDIT__STDOUT", "true")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut child = launch("127.0.0.1:0");
    let stdout = Lines::capture(child.stdout.take().unwrap());
    let stderr = Lines::capture(child.stderr.take().unwrap());
    let ready = stdout.wait_for("the ready line", |l| ready_url(l).is_some());
    let base = ready_url(&ready).unwrap();
    assert!(base.starts_with("http://127.0.0.1:"), "{ready}");
    let gw = Gateway {
        child,
        stderr: Some(stderr.clone()),
        binary: env!("CARGO_BIN_EXE_sealgate").into(),
        wrapper: Vec::new(),
        base,
        dir: dir.path().to_path_buf(),
        config_path: config.clone(),
        keys,
        client: reqwest::Client::new(),
    };
    let (key, token) = gw.session("exec-json-lines").await;
    for (id, tool, expected) in [
        (1, "tool.off", 200),
        (2, "tool.forbidden", 403),
        (3, "down.op", 502),
    ] {
        let (status, body) = gw.call(&key, &token, tool_call(id, tool, json!({}))).await;
        assert_eq!(status, expected, "{tool}: {body}");
    }
    stderr.wait_for("about the unreachable tool", |l| {
        l.contains("tool call failed")
    });
    // A clean stop writes its lines too.
    let stopped = Command::new("kill")
        .args(["-TERM", &gw.child.id().to_string()])
        .status()
        .unwrap();
    assert!(stopped.success());
    stderr.wait_for("about the stop", |l| l.contains("sealgate stopped"));

    // A fatal error after the configuration is read: the port is taken.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut failed = launch(&taken.local_addr().unwrap().to_string());
    let failed_stdout = Lines::capture(failed.stdout.take().unwrap());
    let failed_stderr = Lines::capture(failed.stderr.take().unwrap());
    assert!(!failed.wait().unwrap().success());
    let fatal = failed_stderr.wait_for("the fatal error", |l| l.contains("cannot listen"));

    let streams = [
        ("stdout", stdout.lines()),
        ("stderr", stderr.lines()),
        ("stdout of the failed start", failed_stdout.lines()),
        ("stderr of the failed start", failed_stderr.lines()),
    ];
    for (name, lines) in &streams {
        for line in lines {
            let parsed: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{name}: not JSON ({e}): {line}"));
            assert!(parsed.is_object(), "{name}: {line}");
        }
    }
    let parsed = |line: &str| serde_json::from_str::<Value>(line).unwrap();
    assert_eq!(parsed(&ready)["message"], "sealgate ready");
    assert_eq!(parsed(&fatal)["level"], "ERROR", "{fatal}");
    // The audit events on stdout and DEBUG lines on stderr were among them.
    assert!(stdout
        .lines()
        .iter()
        .any(|l| parsed(l)["type"] == "ToolCallCompleted"));
    assert!(stderr.lines().iter().any(|l| parsed(l)["level"] == "DEBUG"));
}

/// A stdio MCP server on the pinned MCP Python SDK: `echo` writes its argument on stderr, as tools that log
/// what they are asked do; `leave` exits without answering. It says hello on stderr as it starts.
const ECHO_SERVER: &str = r#"
import os
import sys

from mcp.server import MCPServer

print("echo server starting", file=sys.stderr, flush=True)
server = MCPServer("echo")


@server.tool()
def echo(text: str) -> str:
    print(f"echo got {text}", file=sys.stderr, flush=True)
    return text


@server.tool()
def leave() -> str:
    os._exit(3)


server.run()
"#;

/// A server that fails at import, with a traceback on stderr.
const BROKEN_SERVER: &str = "import sealgate_missing_dependency\n";

/// SPEC 20 r11: a stdio server's stderr reaches the log only from before its first call (unless
/// `log_stderr`), a server that fails to start or exits is logged at error with that tail and shown in
/// `/readyz?verbose` and `sealgate_upstream_up`, and a `tools/list` that leaves its tools out says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_servers_stderr_is_logged_only_before_its_first_call_and_a_failed_one_is_shown() {
    let dir = tempfile::tempdir().unwrap();
    let python = common::pinned_tool("mcp", "python", "MCP_PYTHON");
    let echo = dir.path().join("echo_server.py");
    std::fs::write(&echo, ECHO_SERVER).unwrap();
    let broken = dir.path().join("broken_server.py");
    std::fs::write(&broken, BROKEN_SERVER).unwrap();
    let upstreams = |_: &str| {
        format!(
            "  py: {{ mcp: {{ command: {python:?}, args: [{echo:?}] }}, timeout_ms: 20000 }}\n  \
             loud: {{ mcp: {{ command: {python:?}, args: [{echo:?}], log_stderr: true }}, timeout_ms: 20000 }}\n  \
             broken: {{ mcp: {{ command: {python:?}, args: [{broken:?}] }}, timeout_ms: 20000 }}\n"
        )
    };
    let (gw, stderr) = start_logged_with(dir.path(), upstreams, "", &[("RUST_LOG", "trace")]).await;
    let spec = json!({"capabilities": [
        {"tool_pattern": "py.*", "claim": "off"},
        {"tool_pattern": "loud.*", "claim": "off"},
        {"tool_pattern": "broken.*", "claim": "off"},
    ]});
    let (status, body) = gw
        .admin(Method::PUT, "/v1/security-contexts/stdio", Some(spec))
        .await;
    assert!(status == 200 || status == 201, "{body}");
    let (key, token) = gw.session_in("exec-stdio", "stdio").await;
    let verbose = || async {
        let response = gw
            .client
            .get(format!("{}/readyz?verbose", gw.base))
            .send()
            .await;
        let body: Value = response.unwrap().json().await.unwrap();
        body["upstreams"].clone()
    };
    let before: Vec<Value> = verbose().await.as_array().unwrap().clone();
    assert!(
        before.iter().all(|u| u["state"] == "not_started"),
        "{before:?}"
    );

    // The list lacks the broken server's tools and says so.
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
    let (status, body) = gw.call(&key, &token, list).await;
    assert_eq!(status, 200, "{body}");
    let result = &body["payload"]["result"];
    let names: Vec<&str> = result["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|tool| tool["name"].as_str())
        .collect();
    assert!(
        names.contains(&"py.echo") && names.contains(&"loud.echo"),
        "{names:?}"
    );
    assert!(
        !names.iter().any(|name| name.starts_with("broken.")),
        "{names:?}"
    );
    let warnings = result["_meta"]["sealgate/warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].as_str().unwrap().contains("`broken`"),
        "{warnings:?}"
    );
    // The failed start at error, with its traceback; the list's gap at warn.
    stderr.wait_for("about the failed start, with its traceback", |l| {
        l.contains("ERROR")
            && l.contains("cannot start the MCP upstream")
            && l.contains("broken")
            && l.contains("sealgate_missing_dependency")
    });
    stderr.wait_for("about the tools left out", |l| {
        l.contains("WARN") && l.contains("left out of tools/list") && l.contains("broken")
    });
    // What a server wrote while starting, at warn.
    stderr.wait_for("about py's start", |l| {
        l.contains("WARN") && l.contains("while starting") && l.contains("echo server starting")
    });

    // After its first call, what py writes (its argument) is dropped; loud logs every line.
    let quiet = "quiet-7f3a9c";
    let loud = "loud-2b8e41";
    for (id, tool, text) in [(2, "py.echo", quiet), (3, "loud.echo", loud)] {
        let (status, body) = gw
            .call(&key, &token, tool_call(id, tool, json!({"text": text})))
            .await;
        assert_eq!(status, 200, "{tool}: {body}");
    }
    stderr.wait_for("loud's stderr line", |l| {
        l.contains("WARN") && l.contains(&format!("tool stderr: echo got {loud}"))
    });
    // py exits: at error, after the line that quoted its argument (read and dropped before the end).
    gw.call(&key, &token, tool_call(4, "py.leave", json!({})))
        .await;
    stderr.wait_for("about py's exit", |l| {
        l.contains("ERROR") && l.contains("the MCP server exited") && l.contains("upstream=py")
    });
    let logged: Vec<String> = stderr.lines();
    let leaked: Vec<&String> = logged.iter().filter(|l| l.contains(quiet)).collect();
    assert!(
        leaked.is_empty(),
        "an argument value reached the log: {leaked:#?}"
    );

    let states: Vec<(String, String, String)> = verbose()
        .await
        .as_array()
        .unwrap()
        .iter()
        .map(|u| {
            let text = |key: &str| u[key].as_str().unwrap_or_default().to_owned();
            (text("name"), text("state"), text("error"))
        })
        .collect();
    let expected = [
        ("broken", "down", "failed to start"),
        ("loud", "up", ""),
        ("py", "down", "exited"),
    ];
    let expected: Vec<(String, String, String)> = expected
        .iter()
        .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
        .collect();
    assert_eq!(states, expected);
    let metrics = gw.metrics().await;
    for (upstream, up) in [("broken", 0), ("loud", 1), ("py", 0)] {
        let sample = format!("sealgate_upstream_up{{upstream=\"{upstream}\"}} {up}");
        assert!(
            metrics.lines().any(|l| l == sample),
            "{sample} in {metrics}"
        );
    }
}

/// A stdio MCP server written by hand: it answers `initialize` and `tools/list`, says goodbye on stderr and
/// exits, before any call.
const BRIEF_SERVER: &str = r#"
import json
import sys

for line in sys.stdin:
    message = json.loads(line)
    method = message.get("method")
    if method == "initialize":
        result = {"protocolVersion": message["params"]["protocolVersion"],
                  "capabilities": {"tools": {}}, "serverInfo": {"name": "brief", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": []}
    else:
        continue
    print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}), flush=True)
    if method == "tools/list":
        print("brief server: leaving before any call", file=sys.stderr, flush=True)
        sys.exit(0)
"#;

/// SPEC 20 r11: a server that exits before its first call is logged at error with what it wrote, and
/// `/readyz?verbose` says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stdio_server_that_exits_before_its_first_call_is_logged_with_its_last_lines() {
    let dir = tempfile::tempdir().unwrap();
    let python = common::pinned_tool("mcp", "python", "MCP_PYTHON");
    let brief = dir.path().join("brief_server.py");
    std::fs::write(&brief, BRIEF_SERVER).unwrap();
    let upstreams = |_: &str| {
        format!(
            "  brief: {{ mcp: {{ command: {python:?}, args: [{brief:?}] }}, timeout_ms: 20000 }}\n"
        )
    };
    let (gw, stderr) = start_logged_with(dir.path(), upstreams, "", &[]).await;
    let list = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
    let (key, token) = gw.session("exec-brief").await;
    let (status, body) = gw.call(&key, &token, list).await;
    assert_eq!(status, 200, "{body}");
    stderr.wait_for("about the exit, with the last line", |l| {
        l.contains("ERROR")
            && l.contains("the MCP server exited before its first call")
            && l.contains("upstream=brief")
            && l.contains("leaving before any call")
    });
    let response = gw
        .client
        .get(format!("{}/readyz?verbose", gw.base))
        .send()
        .await
        .unwrap();
    let ready: Value = response.json().await.unwrap();
    assert_eq!(
        ready["upstreams"],
        json!([{"name": "brief", "state": "down", "error": "exited before its first call"}]),
        "{ready}"
    );
}
