//! Pinned tool definitions (SPEC 18, first half) through the binary: an MCP server made with the official
//! MCP Python SDK (tests/mcp-servers/changing_server.py) changes its tools while the gateway runs — a
//! changed description, an added tool, tag characters, a zero-width title, denylisted text — and says so
//! with `notifications/tools/list_changed`. The gateway withholds what is not pinned, refuses its calls with
//! 2009 before anything reaches the server, writes one event per definition, and gives the tool back once an
//! operator accepts the definition seen. On both stores, on two replicas sharing pins, and as MCP hosts
//! made with the official SDKs see it through `sealgate connect`.

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use common::{until, Gateway, Keys};
use ed25519_dalek::SigningKey;
use reqwest::Method;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const WITHIN: Duration = Duration::from_secs(30);

/// A JSON-RPC id per request: the same payload signed twice in one second would be a replay.
fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The sessions of these tests may call every tool of upstream `ch` within /workspace.
const PINS_POLICY: &str = r#"
name: pins
capabilities:
  - tool_pattern: "ch.*"
    claim: off
"#;

fn python() -> PathBuf {
    common::pinned_tool("mcp", "python", "MCP_PYTHON")
}

fn server_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mcp-servers/changing_server.py")
}

/// The changing server's phase file and call log, in `dir`.
struct Server {
    phase: PathBuf,
    calls: PathBuf,
}

impl Server {
    fn new(dir: &Path, phase: &str) -> Server {
        let server = Server {
            phase: dir.join("phase"),
            calls: dir.join("calls"),
        };
        server.set(phase);
        server
    }

    /// The signal: the server notices the new phase, serves its tools and sends list_changed.
    fn set(&self, phase: &str) {
        std::fs::write(&self.phase, phase).unwrap();
    }

    /// The tools/call requests the server received, by tool name.
    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(&self.calls)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The `upstreams:` line of upstream `ch`, with `tools` settings in YAML flow style (or none).
    fn upstream(&self, tools: &str) -> String {
        let args = json!([
            server_script(),
            self.phase.to_string_lossy(),
            self.calls.to_string_lossy()
        ]);
        let tools = if tools.is_empty() {
            String::new()
        } else {
            format!(", tools: {tools}")
        };
        format!(
            "  ch: {{ mcp: {{ command: {:?}, args: {args} }}, timeout_ms: 20000{tools} }}\n",
            python().to_string_lossy()
        )
    }
}

fn write_policy(dir: &Path) {
    std::fs::create_dir_all(dir.join("policies")).unwrap();
    std::fs::write(dir.join("policies/pins.yaml"), PINS_POLICY).unwrap();
}

async fn start(dir: &Path, server: &Server, tools: &str) -> Gateway {
    write_policy(dir);
    Gateway::start_with(dir, &server.upstream(tools), "")
        .await
        .0
}

struct Agent {
    key: SigningKey,
    token: String,
}

async fn agent(gw: &Gateway, session: &str) -> Agent {
    let (key, token) = gw.session_in(session, "pins").await;
    Agent { key, token }
}

/// The tool names `tools/list` gives the agent.
async fn listed(gw: &Gateway, agent: &Agent) -> Vec<String> {
    let (status, body) = gw
        .call(
            &agent.key,
            &agent.token,
            json!({"jsonrpc": "2.0", "id": next_id(), "method": "tools/list"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let mut names: Vec<String> = body["payload"]["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["name"].as_str().unwrap().to_owned())
        .collect();
    names.sort();
    names
}

async fn call(gw: &Gateway, agent: &Agent, tool: &str) -> (u16, Value) {
    gw.call(
        &agent.key,
        &agent.token,
        json!({"jsonrpc": "2.0", "id": next_id(), "method": "tools/call",
               "params": {"name": tool, "arguments": {"path": "/workspace/a"}}}),
    )
    .await
}

/// Waits until the agent's tools/list is `expected`.
async fn until_listed(gw: &Gateway, agent: &Agent, expected: &[&str]) {
    until(WITHIN, &format!("tools/list is {expected:?}"), || async {
        listed(gw, agent).await == expected
    })
    .await;
}

/// `GET /v1/tools`, as an admin: the tool `name`'s entry.
async fn tool_status(gw: &Gateway, name: &str) -> Value {
    let (status, body) = gw.admin(Method::GET, "/v1/tools", None).await;
    assert_eq!(status, 200, "{body}");
    body["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|item| item["tool"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("{name} is not in {body}"))
}

async fn accept(gw: &Gateway, name: &str, sha256: &Value) -> (u16, Value) {
    gw.admin(
        Method::POST,
        &format!("/v1/tools/{name}/accept"),
        Some(json!({ "definition_sha256": sha256 })),
    )
    .await
}

async fn events(gw: &Gateway, kind: &str) -> Vec<Value> {
    gw.audit_events(&format!("type={kind}&limit=1000")).await
}

/// Refused with 2009 before anything is sent: the details name the tool, both hashes and the reason.
fn assert_withheld(status: u16, body: &Value, tool: &str, reason: &str) -> Value {
    assert_eq!(status, 403, "{body}");
    let error = &body["error"];
    assert_eq!(error["code"], 2009, "{body}");
    assert_eq!(error["details"]["tool"], tool, "{body}");
    assert_eq!(error["details"]["reason"], reason, "{body}");
    assert!(error["details"]["seen_sha256"].is_string(), "{body}");
    error["details"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_description_is_withheld_until_its_hash_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::new(dir.path(), "base");
    let gw = start(dir.path(), &server, "").await;
    let agent = agent(&gw, "rug").await;

    // first_use: both tools are pinned as first seen, and callable.
    assert_eq!(listed(&gw, &agent).await, ["ch.read", "ch.write"]);
    let read = tool_status(&gw, "ch.read").await;
    assert_eq!(read["status"], "pinned", "{read}");
    assert_eq!(read["withheld"], false, "{read}");
    let pinned_sha = read["pinned"]["definition_sha256"].clone();
    assert_eq!(read["seen"]["definition_sha256"], pinned_sha);
    assert_eq!(
        read["pinned"]["definition"],
        json!({"name": "read", "description": "Reads a file.",
               "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}}})
    );
    let (status, body) = call(&gw, &agent, "ch.read").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(server.calls(), ["read"]);

    // The rug pull: the server changes read's description and says so.
    server.set("changed_description");
    until_listed(&gw, &agent, &["ch.write"]).await;
    let (status, body) = call(&gw, &agent, "ch.read").await;
    let details = assert_withheld(status, &body, "ch.read", "changed");
    assert_eq!(details["pinned_sha256"], pinned_sha);
    assert_eq!(
        server.calls(),
        ["read"],
        "the withheld call reached the tool"
    );
    // The other tool is untouched.
    let (status, body) = call(&gw, &agent, "ch.write").await;
    assert_eq!(status, 200, "{body}");

    let read = tool_status(&gw, "ch.read").await;
    assert_eq!(read["status"], "changed", "{read}");
    assert_eq!(read["reason"], "changed", "{read}");
    assert_eq!(read["pinned"]["definition_sha256"], pinned_sha);
    assert_eq!(read["seen"]["definition_sha256"], details["seen_sha256"]);
    assert!(read["seen"]["definition"]["description"]
        .as_str()
        .unwrap()
        .contains("id_rsa"));

    // However often it is listed, one event for the new definition.
    listed(&gw, &agent).await;
    listed(&gw, &agent).await;
    let changed = events(&gw, "ToolDefinitionChanged").await;
    assert_eq!(changed.len(), 1, "{changed:#?}");
    assert_eq!(changed[0]["tool"], "ch.read");
    let detail = changed[0]["detail"].as_str().unwrap();
    assert!(detail.contains("reason=changed"), "{detail}");
    assert!(
        detail.contains(details["seen_sha256"].as_str().unwrap()),
        "{detail}"
    );
    assert_eq!(
        events(&gw, "PolicyViolationBlocked")
            .await
            .iter()
            .filter(|e| e["code"] == 2009)
            .count(),
        1
    );

    // Accepting needs the hash seen: the pinned one (or any other) is refused with 409.
    let (status, body) = accept(&gw, "ch.read", &pinned_sha).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], 6004, "{body}");
    let (status, body) = accept(&gw, "ch.nothing", &pinned_sha).await;
    assert_eq!(status, 404, "{body}");
    // Tools belong to no team: a scope bound to one team does not reach them.
    let bound = gw.keys.operator_token("payments/seal.tool.read");
    let (status, body) = gw
        .operator(Method::GET, "/v1/tools", Some(&bound), None)
        .await;
    assert_eq!(status, 403, "{body}");
    let token = gw.keys.operator_token("seal.tool.read");
    let (status, body) = gw
        .operator(Method::GET, "/v1/tools", Some(&token), None)
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = gw
        .operator(
            Method::POST,
            "/v1/tools/ch.read/accept",
            Some(&token),
            Some(json!({"definition_sha256": details["seen_sha256"]})),
        )
        .await;
    assert_eq!(status, 403, "seal.tool.read cannot accept: {body}");

    let (status, body) = accept(&gw, "ch.read", &details["seen_sha256"]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "pinned", "{body}");
    assert_eq!(body["pinned"]["definition_sha256"], details["seen_sha256"]);
    assert!(body["pinned"]["accepted_by"]["sub"].is_string(), "{body}");
    assert_eq!(listed(&gw, &agent).await, ["ch.read", "ch.write"]);
    let (status, body) = call(&gw, &agent, "ch.read").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(server.calls(), ["read", "write", "read"]);
    let accepted = events(&gw, "ToolDefinitionAccepted").await;
    assert_eq!(accepted.len(), 1, "{accepted:#?}");
    assert_eq!(accepted[0]["tool"], "ch.read");
    assert!(accepted[0]["actor"]["sub"].is_string(), "{accepted:#?}");

    // A tool added under first_use is pinned as first seen; read's old description is a change again.
    server.set("added_tool");
    until_listed(&gw, &agent, &["ch.delete", "ch.write"]).await;
    assert_eq!(tool_status(&gw, "ch.delete").await["status"], "pinned");
    assert_eq!(events(&gw, "ToolDefinitionChanged").await.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reviewed_upstreams_withhold_every_new_tool_until_it_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::new(dir.path(), "base");
    let gw = start(dir.path(), &server, "{ pin: reviewed }").await;
    let agent = agent(&gw, "reviewed").await;

    // Nothing was reviewed yet: nothing is listed, and a call is refused before it is sent, even one to
    // a tool the gateway never saw listed.
    assert!(listed(&gw, &agent).await.is_empty());
    let (status, body) = call(&gw, &agent, "ch.read").await;
    let details = assert_withheld(status, &body, "ch.read", "new");
    assert_eq!(details["pinned_sha256"], Value::Null);
    let (status, body) = call(&gw, &agent, "ch.unlisted").await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["details"]["seen_sha256"], Value::Null);
    assert!(server.calls().is_empty());
    let read = tool_status(&gw, "ch.read").await;
    assert_eq!(
        (&read["status"], &read["reason"]),
        (&json!("new"), &json!("new"))
    );
    assert!(read.get("pinned").is_none(), "{read}");

    let (status, body) = accept(&gw, "ch.read", &details["seen_sha256"]).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(listed(&gw, &agent).await, ["ch.read"]);
    let (status, body) = call(&gw, &agent, "ch.read").await;
    assert_eq!(status, 200, "{body}");

    // An added tool waits for its review too.
    server.set("added_tool");
    until(WITHIN, "delete is seen", || async {
        let (_, body) = gw.admin(Method::GET, "/v1/tools", None).await;
        body["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|item| item["tool"] == "ch.delete")
    })
    .await;
    assert_eq!(listed(&gw, &agent).await, ["ch.read"]);
    let delete = tool_status(&gw, "ch.delete").await;
    assert_eq!(delete["status"], "new", "{delete}");
    // One event per definition: read, write and delete, each seen once.
    assert_eq!(events(&gw, "ToolDefinitionChanged").await.len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hidden_characters_and_denylisted_text_withhold_a_tool() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::new(dir.path(), "base");
    let denylist = r#"{ description_denylist: ["(?i)ignore (all |previous )+instructions"] }"#;
    let gw = start(dir.path(), &server, denylist).await;
    let agent = agent(&gw, "hidden").await;
    assert_eq!(listed(&gw, &agent).await, ["ch.read", "ch.write"]);

    // Tag characters in a description.
    server.set("tag_characters");
    until_listed(&gw, &agent, &["ch.write"]).await;
    let (status, body) = call(&gw, &agent, "ch.read").await;
    assert_withheld(status, &body, "ch.read", "hidden_characters");

    // A zero-width joiner in a title; read's description is the pinned one again.
    server.set("zero_width_title");
    until_listed(&gw, &agent, &["ch.read"]).await;
    let (status, body) = call(&gw, &agent, "ch.write").await;
    assert_withheld(status, &body, "ch.write", "hidden_characters");
    assert_eq!(
        tool_status(&gw, "ch.write").await["reason"],
        "hidden_characters"
    );

    // Text an operator's pattern names.
    server.set("denylisted");
    until_listed(&gw, &agent, &["ch.write"]).await;
    let (status, body) = call(&gw, &agent, "ch.read").await;
    let details = assert_withheld(status, &body, "ch.read", "denylisted_text");
    assert!(server.calls().is_empty(), "{:?}", server.calls());

    // An operator can still accept what they have read.
    let (status, body) = accept(&gw, "ch.read", &details["seen_sha256"]).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = call(&gw, &agent, "ch.read").await;
    assert_eq!(status, 200, "{body}");
    let reasons: Vec<String> = events(&gw, "ToolDefinitionChanged")
        .await
        .iter()
        .map(|e| {
            e["detail"]
                .as_str()
                .unwrap()
                .split(' ')
                .next()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(
        reasons,
        [
            "reason=denylisted_text",
            "reason=hidden_characters",
            "reason=hidden_characters"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_first_seen_with_tag_characters_is_not_pinned() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::new(dir.path(), "tag_characters");
    let gw = start(dir.path(), &server, "").await;
    let agent = agent(&gw, "first-hidden").await;
    assert_eq!(listed(&gw, &agent).await, ["ch.write"]);
    let read = tool_status(&gw, "ch.read").await;
    assert_eq!(
        (&read["status"], &read["reason"]),
        (&json!("new"), &json!("hidden_characters"))
    );
}

#[test]
fn a_pattern_the_regex_engine_refuses_stops_serve_check_naming_its_key() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::new(dir.path(), "base");
    let keys = Keys::new();
    write_policy(dir.path());
    let config = common::write_config(
        dir.path(),
        &keys,
        "http://127.0.0.1:1",
        &server.upstream(r#"{ description_denylist: ["(a)\\1"] }"#),
        "",
    );
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_sealgate"))
        .args(["serve", "--check", "--config"])
        .env("TEST_TOOL_CREDENTIAL", "Bearer test")
        .arg(&config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains("upstreams.ch.tools.description_denylist[0]"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_postgres_share_pins_and_write_one_event_per_definition() {
    let db = sealgate::store::testing::TestDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();
    let server = Server::new(dir.path(), "base");
    let (_tool, tool_base) = common::start_tool().await;
    let keys = Arc::new(Keys::new());
    let replicas: Vec<Gateway> = (0..2)
        .map(|i| {
            let folder = dir.path().join(format!("r{i}"));
            write_policy(&folder);
            let signing = common::replica_signing(dir.path(), 2, i);
            let extra = format!("store: {:?}\nreplica_id: r{i}\n{signing}", db.url);
            let config =
                common::write_config(&folder, &keys, &tool_base, &server.upstream(""), &extra);
            Gateway::spawn(&folder, &config, keys.clone())
        })
        .collect();
    let (a, b) = (&replicas[0], &replicas[1]);
    let agent = agent(a, "replicated").await;
    assert_eq!(listed(a, &agent).await, ["ch.read", "ch.write"]);
    assert_eq!(listed(b, &agent).await, ["ch.read", "ch.write"]);
    // Both saw the same first definitions: one pin each, whichever replica wrote it.
    assert_eq!(
        tool_status(a, "ch.read").await["pinned"],
        tool_status(b, "ch.read").await["pinned"]
    );

    server.set("changed_description");
    until_listed(a, &agent, &["ch.write"]).await;
    until_listed(b, &agent, &["ch.write"]).await;
    let (status, body) = call(b, &agent, "ch.read").await;
    let details = assert_withheld(status, &body, "ch.read", "changed");
    // Each replica saw the change on its own connection; the shared trail holds one event.
    let changed = events(a, "ToolDefinitionChanged").await;
    assert_eq!(changed.len(), 1, "{changed:#?}");

    // Accepted through one replica, the tool comes back on the other.
    let (status, body) = accept(a, "ch.read", &details["seen_sha256"]).await;
    assert_eq!(status, 200, "{body}");
    until(WITHIN, "replica b calls ch.read again", || async {
        call(b, &agent, "ch.read").await.0 == 200
    })
    .await;
    assert_eq!(listed(b, &agent).await, ["ch.read", "ch.write"]);
    assert_eq!(server.calls(), ["read"]);
}

/// An MCP host made with an official SDK, driven a command at a time (tests/connect-clients/pins_host.*).
struct Host {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
}

impl Host {
    async fn start(program: &Path, script: &str, plan: &Value) -> Host {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/connect-clients")
            .join(script);
        let mut child = tokio::process::Command::new(program)
            .arg(script)
            .arg(plan.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Host {
            child,
            stdin,
            lines,
        }
    }

    async fn ask(&mut self, command: &str) -> Value {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .unwrap();
        let line = tokio::time::timeout(WITHIN, self.lines.next_line())
            .await
            .expect("the host answers")
            .unwrap()
            .expect("the host is still running");
        serde_json::from_str(&line).unwrap()
    }

    async fn list(&mut self) -> Vec<String> {
        let mut names: Vec<String> = serde_json::from_value(self.ask("list").await).unwrap();
        names.sort();
        names
    }

    async fn quit(mut self, script: &str) {
        self.stdin.write_all(b"quit\n").await.unwrap();
        drop(self.stdin);
        let status = tokio::time::timeout(WITHIN, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("{script} did not exit"))
            .unwrap();
        assert!(status.success(), "{script}: {status}");
    }
}

/// Hosts on the official Python and TypeScript SDKs see a changed tool vanish from their list, get a
/// refusal that says why when they call it anyway, and see it come back once accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hosts_through_connect_see_a_changed_tool_vanish_and_return() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::new(dir.path(), "base");
    let gw = start(dir.path(), &server, "").await;
    let node = PathBuf::from("node");
    let hosts: [(&Path, &str, &str); 2] = [
        (&python(), "pins_host.py", "changed_description"),
        (&node, "pins_host.mjs", "base"),
    ];
    for (i, (program, script, phase)) in hosts.into_iter().enumerate() {
        let (key, token) = gw.session_in(&format!("host-{i}"), "pins").await;
        let key_file = dir.path().join(format!("host-{i}.key"));
        let token_file = dir.path().join(format!("host-{i}.token"));
        std::fs::write(
            &key_file,
            sealgate::envelope::signing_key_to_pkcs8_pem(&key).unwrap(),
        )
        .unwrap();
        std::fs::write(&token_file, format!("{token}\n")).unwrap();
        let plan = json!({
            "command": [env!("CARGO_BIN_EXE_sealgate"), "connect"],
            "env": {"SEALGATE_GATEWAY": gw.base, "SEALGATE_KEY_FILE": key_file,
                    "SEALGATE_TOKEN_FILE": token_file, "PATH": std::env::var("PATH").unwrap()},
        });
        let mut host = Host::start(program, script, &plan).await;
        assert_eq!(host.list().await, ["ch.read", "ch.write"], "{script}");

        // The first host changes read away from its pin; the second changes it back.
        server.set(phase);
        let deadline = std::time::Instant::now() + WITHIN;
        while host.list().await != ["ch.write"] {
            assert!(
                std::time::Instant::now() < deadline,
                "{script}: ch.read still listed"
            );
        }
        let refused = host.ask("call ch.read").await;
        assert_eq!(refused["isError"], true, "{script}: {refused}");
        assert_eq!(
            refused["_meta"]["sealgate/error"]["code"], 2009,
            "{script}: {refused}"
        );

        let seen = tool_status(&gw, "ch.read").await["seen"]["definition_sha256"].clone();
        let (status, body) = accept(&gw, "ch.read", &seen).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(host.list().await, ["ch.read", "ch.write"], "{script}");
        let answer = host.ask("call ch.read").await;
        assert_eq!(
            answer["content"][0]["text"], "ok:read",
            "{script}: {answer}"
        );
        host.quit(script).await;
    }
}
