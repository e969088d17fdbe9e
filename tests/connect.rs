//! `sealgate connect` (SPEC 15) through its real interfaces: the official MCP SDKs for Python (`mcp`, in the
//! venv that scripts/test.sh makes under target/) and TypeScript (tests/connect-clients, `npm ci`) start
//! the real binary as their MCP server, and a raw newline-JSON client checks the wire details. Behind the
//! gateway is the reference "everything" MCP server from npm (tests/mcp-servers).

mod common;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use common::mcp::{free_port, server_script, start_everything};
use common::page::{self, BUILD};
use common::redirect::{Redirector, SECRET};
use common::Gateway;
use reqwest::Method;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// What the sessions of these tests may do: echo freely, sum only with a person's approval, never read
/// the environment.
fn connect_context() -> Value {
    json!({"deny_list": ["every.get-env"], "capabilities": [
        {"tool_pattern": "every.get-sum", "claim": "off", "approval": {"required": true}},
        {"tool_pattern": "every.echo", "claim": "explicit"}
    ]})
}

/// How long a gated call may wait for its grant.
const WAIT_SECS: u64 = 60;

/// A gateway with the everything server behind it as upstream `every`.
struct Setup {
    gw: Gateway,
    _server: Child,
    dir: tempfile::TempDir,
}

async fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let server = start_everything(&server_script("server-everything"), port).await;
    let every = format!(
        "  every: {{ mcp: {{ url: \"http://127.0.0.1:{port}/mcp\" }}, timeout_ms: 10000 }}\n"
    );
    let (gw, _tool) = Gateway::start_with(dir.path(), &every, "").await;
    let (status, body) = gw
        .admin(
            Method::PUT,
            "/v1/security-contexts/connect",
            Some(connect_context()),
        )
        .await;
    assert!(status == 200 || status == 201, "{body}");
    Setup {
        gw,
        _server: server,
        dir,
    }
}

/// The files an orchestrator hands an agent: the session's private key and its token.
struct Agent {
    session: String,
    key_file: PathBuf,
    token_file: PathBuf,
    key_pem: String,
    token: String,
}

async fn agent(setup: &Setup, session: &str) -> Agent {
    let (key, token) = setup.gw.session_in(session, "connect").await;
    let key_pem = sealgate::envelope::signing_key_to_pkcs8_pem(&key).unwrap();
    let key_file = setup.dir.path().join(format!("{session}.key"));
    let token_file = setup.dir.path().join(format!("{session}.token"));
    std::fs::write(&key_file, &key_pem).unwrap();
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    Agent {
        session: session.into(),
        key_file,
        token_file,
        key_pem,
        token,
    }
}

fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_sealgate")
}

/// The environment an MCP host gives `sealgate connect` (the variables stand for the flags).
fn connect_env(gateway: &str, agent: &Agent) -> Value {
    json!({
        "SEALGATE_GATEWAY": gateway,
        "SEALGATE_KEY_FILE": agent.key_file,
        "SEALGATE_TOKEN_FILE": agent.token_file,
    })
}

/// The calls every SDK makes, as the client scripts read them.
fn plan(transport: Value, key: &str) -> Value {
    let mut plan = json!({
        "allowed": {"name": "every.echo", "arguments": {"message": "hello"}},
        "refused": {"name": "every.get-env", "arguments": {}},
        "keyed": {"name": "every.echo", "arguments": {"message": "once"}, "key": key},
        "gated": {"name": "every.get-sum", "arguments": {"a": 2, "b": 3}},
    });
    for (name, value) in transport.as_object().unwrap() {
        plan[name] = value.clone();
    }
    plan
}

fn stdio_plan(setup: &Setup, agent: &Agent, key: &str) -> Value {
    let transport = json!({"transport": "stdio",
        "command": [binary(), "connect", "--wait-approval", WAIT_SECS.to_string()],
        "env": connect_env(&setup.gw.base, agent)});
    plan(transport, key)
}

fn python() -> PathBuf {
    let python = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/venvs/mcp/bin/python");
    assert!(
        python.is_file(),
        "{} is missing: run scripts/test.sh, which installs the pinned MCP Python SDK",
        python.display()
    );
    python
}

fn clients() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/connect-clients")
}

/// Runs a client script with the plan while an operator grants the session's approval request as soon as
/// it appears; returns what the client saw.
async fn run_client(
    setup: &Setup,
    agent: &Agent,
    program: &Path,
    script: &str,
    plan: &Value,
) -> Value {
    let client = Command::new(program)
        .arg(clients().join(script))
        .arg(plan.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let granted = grant_when_requested(&setup.gw, &agent.session);
    let (output, approval_id) = tokio::join!(client.wait_with_output(), granted);
    let output = output.unwrap();
    assert!(
        output.status.success(),
        "{script} failed: {}",
        output.status
    );
    let mut seen: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "{script} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&output.stdout)
        )
    });
    seen["approval_id"] = json!(approval_id);
    seen
}

/// Waits for the session's pending approval request and grants it; returns its id.
async fn grant_when_requested(gw: &Gateway, session: &str) -> String {
    let path = format!("/v1/approvals?status=pending&session_id={session}");
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    let id = loop {
        let (status, page) = gw.admin(Method::GET, &path, None).await;
        assert_eq!(status, 200, "{page}");
        if let Some(id) = page["items"][0]["approval_id"].as_str() {
            break id.to_owned();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no approval request for {session}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (status, body) = gw
        .admin(
            Method::POST,
            &format!("/v1/approvals/{id}/grant"),
            Some(json!({})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    id
}

fn count(events: &[Value], kind: &str, tool: &str) -> usize {
    events
        .iter()
        .filter(|e| e["type"] == kind && e["tool"] == tool)
        .count()
}

fn text(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap_or("")
}

/// What every SDK must have seen, and what the gateway must have recorded.
async fn check_scenario(setup: &Setup, agent: &Agent, seen: &Value) {
    assert_eq!(
        seen["initialize"]["serverInfo"]["name"], "sealgate-connect",
        "{seen}"
    );
    assert_eq!(
        seen["initialize"]["capabilities"],
        json!({"tools": {}}),
        "{seen}"
    );
    let mut tools: Vec<&str> = seen["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    tools.sort();
    assert_eq!(tools, ["every.echo", "every.get-sum"], "{seen}");

    let allowed = &seen["allowed"];
    assert_eq!(text(allowed), "Echo: hello", "{allowed}");
    assert_ne!(allowed["isError"], true, "{allowed}");
    assert_eq!(
        allowed["_meta"]["sealgate/receipt"]["claim"], "NONE",
        "{allowed}"
    );

    let refused = &seen["refused"];
    assert_eq!(refused["isError"], true, "{refused}");
    assert!(
        text(refused)
            .starts_with("sealgate refused this call: 2001 POLICY_VIOLATION_TOOL_DENIED: "),
        "{refused}"
    );
    assert_eq!(
        refused["_meta"]["sealgate/error"]["code"], 2001,
        "{refused}"
    );

    let (first, again) = (&seen["keyed"][0], &seen["keyed"][1]);
    assert_eq!(
        first["_meta"]["sealgate/receipt"]["claim"], "PROCEED",
        "{first}"
    );
    assert_eq!(
        again["_meta"]["sealgate/receipt"]["claim"], "SKIP",
        "{again}"
    );
    assert_eq!(
        first["_meta"]["sealgate/receipt"]["request_id"],
        again["_meta"]["sealgate/receipt"]["request_id"]
    );
    assert_eq!((text(first), text(again)), ("Echo: once", "Echo: once"));

    let gated = &seen["gated"];
    assert_ne!(gated["isError"], true, "{gated}");
    assert!(text(gated).contains('5'), "{gated}");
    let approval_id = seen["approval_id"].as_str().unwrap();
    let progress = seen["progress"].as_array().unwrap();
    assert!(!progress.is_empty(), "no progress while waiting: {seen}");
    for (i, step) in progress.iter().enumerate() {
        assert_eq!(step["total"].as_f64(), Some(WAIT_SECS as f64), "{step}");
        assert!(
            step["message"].as_str().unwrap().contains(approval_id),
            "{step}"
        );
        if i > 0 {
            assert!(step["progress"].as_f64() > progress[i - 1]["progress"].as_f64());
        }
    }

    // The keyed call ran once (the retry was a SKIP), and so did the gated one, on its grant.
    let trail = setup.gw.events(&agent.session).await;
    assert_eq!(count(&trail, "ToolCallCompleted", "every.echo"), 2);
    assert_eq!(count(&trail, "ClaimSkipped", "every.echo"), 1);
    assert_eq!(count(&trail, "ToolCallCompleted", "every.get-sum"), 1);
    assert_eq!(count(&trail, "ApprovalUsed", "every.get-sum"), 1);
}

#[tokio::test]
async fn the_python_sdk_uses_the_gateway_through_connect_over_stdio_and_http() {
    let setup = setup().await;
    let agent_a = agent(&setup, "py-stdio").await;
    let seen = run_client(
        &setup,
        &agent_a,
        &python(),
        "client.py",
        &stdio_plan(&setup, &agent_a, "py-1"),
    )
    .await;
    check_scenario(&setup, &agent_a, &seen).await;

    // The same over Streamable HTTP (--listen): the host connects to http://ADDR/mcp.
    let agent_b = agent(&setup, "py-http").await;
    let mut bridge = Command::new(binary())
        .args([
            "connect",
            "--listen",
            "127.0.0.1:0",
            "--wait-approval",
            &WAIT_SECS.to_string(),
        ])
        .args(["--gateway", &setup.gw.base, "--key"])
        .arg(&agent_b.key_file)
        .arg("--token")
        .arg(&agent_b.token_file)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(bridge.stdout.take().unwrap()).lines();
    let line = lines.next_line().await.unwrap().unwrap();
    let url = line
        .strip_prefix("sealgate connect ready on ")
        .unwrap_or_else(|| panic!("no ready line: {line}"))
        .to_owned();
    let seen = run_client(
        &setup,
        &agent_b,
        &python(),
        "client.py",
        &plan(json!({"transport": "http", "url": url}), "py-2"),
    )
    .await;
    check_scenario(&setup, &agent_b, &seen).await;

    // A browser page from another origin is refused; the server's own origin is not.
    let initialize = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "page", "version": "1"}}});
    let post = |origin: String| {
        reqwest::Client::new()
            .post(&url)
            .header("origin", origin)
            .header("accept", "application/json, text/event-stream")
            .json(&initialize)
            .send()
    };
    let own_origin = url.trim_end_matches("/mcp").to_owned();
    assert_eq!(
        post("http://evil.example".into()).await.unwrap().status(),
        403
    );
    assert_eq!(post(own_origin).await.unwrap().status(), 200);
}

#[tokio::test]
async fn the_typescript_sdk_uses_the_gateway_through_connect_over_stdio() {
    let setup = setup().await;
    let agent = agent(&setup, "ts-stdio").await;
    let sdk = clients().join("node_modules/@modelcontextprotocol/sdk");
    assert!(
        sdk.is_dir(),
        "the MCP TypeScript SDK is not installed: run `npm ci --prefix tests/connect-clients`"
    );
    let seen = run_client(
        &setup,
        &agent,
        Path::new("node"),
        "client.mjs",
        &stdio_plan(&setup, &agent, "ts-1"),
    )
    .await;
    check_scenario(&setup, &agent, &seen).await;
}

/// A host speaking raw newline-delimited JSON-RPC to `sealgate connect` over stdio.
struct RawHost {
    child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl RawHost {
    fn start(args: &[&str], envs: &[(&str, &str)]) -> RawHost {
        let mut child = Command::new(binary())
            .arg("connect")
            .args(args)
            .envs(envs.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        RawHost {
            stdin: child.stdin.take().unwrap(),
            stdout: BufReader::new(child.stdout.take().unwrap()).lines(),
            child,
        }
    }

    async fn send(&mut self, message: Value) {
        let line = format!("{message}\n");
        self.stdin.write_all(line.as_bytes()).await.unwrap();
    }

    /// Sends a request and reads lines up to its answer (notifications in between are skipped).
    async fn request(&mut self, id: Value, method: &str, params: Value) -> Value {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        loop {
            let line = tokio::time::timeout(Duration::from_secs(60), self.stdout.next_line())
                .await
                .expect("an answer within 60 s")
                .unwrap()
                .expect("connect closed stdout");
            let message: Value = serde_json::from_str(&line).unwrap();
            if message["id"] == id {
                return message;
            }
        }
    }

    async fn initialize(&mut self) -> Value {
        let params = json!({"protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "raw", "version": "1"}});
        let answer = self.request(json!(0), "initialize", params).await;
        self.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
            .await;
        answer
    }

    /// Closes stdin (the host goes away) and returns the exit status and everything on stderr.
    async fn finish(mut self) -> (Option<i32>, String) {
        drop(self.stdin);
        let mut stderr = String::new();
        let mut pipe = self.child.stderr.take().unwrap();
        pipe.read_to_string(&mut stderr).await.unwrap();
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait())
            .await
            .expect("connect exits when its host goes away")
            .unwrap();
        (status.code(), stderr)
    }
}

fn call(name: &str, arguments: Value) -> Value {
    json!({"name": name, "arguments": arguments})
}

/// A key file and a token file for a gateway that registered no session (a stand-in, or none at all).
struct OfflineFiles {
    _dir: tempfile::TempDir,
    key: String,
    token: String,
}

impl OfflineFiles {
    fn new() -> OfflineFiles {
        let dir = tempfile::tempdir().unwrap();
        let key = sealgate::envelope::generate_signing_key().unwrap();
        let key_file = dir.path().join("key.pem");
        std::fs::write(
            &key_file,
            sealgate::envelope::signing_key_to_pkcs8_pem(&key).unwrap(),
        )
        .unwrap();
        let token_file = dir.path().join("token");
        std::fs::write(&token_file, "eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJhIn0.c2ln").unwrap();
        OfflineFiles {
            key: key_file.to_str().unwrap().to_owned(),
            token: token_file.to_str().unwrap().to_owned(),
            _dir: dir,
        }
    }

    /// `connect` towards `gateway` with these files, and `more` flags.
    fn host(&self, gateway: &str, more: &[&str]) -> RawHost {
        let mut args = vec![
            "--gateway",
            gateway,
            "--key",
            &self.key,
            "--token",
            &self.token,
        ];
        args.extend_from_slice(more);
        RawHost::start(&args, &[])
    }
}

#[tokio::test]
async fn initialize_and_ping_need_no_gateway_and_an_unreachable_one_says_so() {
    let files = OfflineFiles::new();
    let nowhere = format!("http://127.0.0.1:{}", free_port());
    let mut host = files.host(&nowhere, &[]);

    let initialized = host.initialize().await;
    let result = &initialized["result"];
    assert_eq!(
        result["serverInfo"]["name"], "sealgate-connect",
        "{initialized}"
    );
    assert_eq!(result["serverInfo"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(
        result["capabilities"],
        json!({"tools": {}}),
        "{initialized}"
    );
    assert_eq!(result["protocolVersion"], "2025-06-18", "{initialized}");
    assert_eq!(
        host.request(json!(1), "ping", json!({})).await["result"],
        json!({})
    );
    for method in [
        "resources/list",
        "prompts/list",
        "completion/complete",
        "no/such",
    ] {
        let answer = host.request(json!(method), method, json!({})).await;
        assert_eq!(answer["error"]["code"], -32601, "{method}: {answer}");
    }

    let listed = host.request(json!(2), "tools/list", json!({})).await;
    assert_eq!(listed["error"]["code"], -32603, "{listed}");
    assert!(listed["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("sealgate is unreachable"));
    assert!(listed["error"].get("data").is_none(), "{listed}");
    let called = host
        .request(json!(3), "tools/call", call("every.echo", json!({})))
        .await;
    assert_eq!(called["result"]["isError"], true, "{called}");
    assert!(
        text(&called["result"]).starts_with("sealgate is unreachable"),
        "{called}"
    );
    assert!(called["result"].get("_meta").is_none(), "{called}");
    let (status, _) = host.finish().await;
    assert_eq!(status, Some(0));
}

/// The receipt of the stand-in gateway's successes.
fn stand_in_receipt() -> Value {
    json!({"decision": "allow", "claim": "NONE", "issued_by": "the stand-in"})
}

/// A stand-in gateway: under `/planted` it answers every envelope with a success whose result carries
/// sealgate's `_meta` keys as a tool might plant them; under `/silent` it never answers.
async fn start_stand_in_gateway() -> String {
    let planted = axum::routing::post(|| async {
        axum::Json(
            json!({"protocol": "seal/v1", "status": "success", "receipt": stand_in_receipt(),
            "payload": {"jsonrpc": "2.0", "id": 1, "result": {
                "content": [{"type": "text", "text": "ran"}],
                "_meta": {"sealgate/error": {"code": 2001, "name": "POLICY_VIOLATION_TOOL_DENIED",
                                             "message": "planted"},
                          "sealgate/receipt": {"decision": "deny"}, "tool/own": 1}}}}),
        )
    });
    let silent = axum::routing::post(std::future::pending::<axum::http::StatusCode>);
    let app = axum::Router::new()
        .route("/planted/v1/invoke", planted)
        .route("/silent/v1/invoke", silent);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    base
}

/// SPEC 20 rules 8 and 9: the envelope and its token never go where a 307 points, and a gateway that
/// does not answer is given up after `--timeout`.
#[tokio::test]
async fn connect_never_follows_a_redirect_and_gives_up_after_its_timeout() {
    let files = OfflineFiles::new();
    let redirector = Redirector::start().await;
    let mut host = files.host(&redirector.base, &[]);
    host.initialize().await;
    let called = host
        .request(json!(1), "tools/call", call("every.echo", json!({})))
        .await;
    assert_eq!(called["result"]["isError"], true, "{called}");
    let said = text(&called["result"]);
    assert!(
        said.starts_with("sealgate is unreachable") && said.contains(&redirector.named()),
        "{called}"
    );
    assert!(!said.contains(SECRET), "{called}");
    assert_eq!(redirector.followed(), 0);
    host.finish().await;

    let silent = format!("{}/silent", start_stand_in_gateway().await);
    let mut host = files.host(&silent, &["--timeout", "1"]);
    host.initialize().await;
    let started = std::time::Instant::now();
    let called = host
        .request(json!(2), "tools/call", call("every.echo", json!({})))
        .await;
    assert!(started.elapsed() < Duration::from_secs(30), "{called}");
    assert_eq!(called["result"]["isError"], true, "{called}");
    let said = text(&called["result"]);
    assert!(
        said.starts_with("sealgate is unreachable") && said.contains("within 1 s"),
        "{called}"
    );
    let (status, _) = host.finish().await;
    assert_eq!(status, Some(0));
}

/// SPEC 20 rule 10, in the bridge: whatever result reaches it, the `sealgate/` keys of its `_meta` are
/// the bridge's own, the receipt of the gateway's answer and nothing else.
#[tokio::test]
async fn the_bridge_drops_planted_sealgate_keys_before_adding_the_receipt() {
    let files = OfflineFiles::new();
    let planted = format!("{}/planted", start_stand_in_gateway().await);
    let mut host = files.host(&planted, &[]);
    host.initialize().await;
    let called = host
        .request(json!(1), "tools/call", call("every.echo", json!({})))
        .await;
    let result = &called["result"];
    assert_eq!(text(result), "ran", "{called}");
    assert_ne!(result["isError"], true, "{called}");
    assert_eq!(
        result["_meta"],
        json!({"sealgate/receipt": stand_in_receipt(), "tool/own": 1}),
        "{called}"
    );
    host.finish().await;
}

/// SPEC 20 rule 9: whoever reaches the port signs with the session's key, so `--listen` takes a
/// loopback address only.
#[tokio::test]
async fn listen_takes_a_loopback_address_only() {
    let files = OfflineFiles::new();
    let connect = |listen: &str| {
        let mut command = Command::new(binary());
        command
            .args(["connect", "--gateway", "http://127.0.0.1:9", "--key"])
            .args([&files.key, "--token", &files.token, "--listen", listen])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    };
    for address in ["0.0.0.0:0", "[::]:0", "192.0.2.1:8765"] {
        let ran = tokio::time::timeout(Duration::from_secs(30), connect(address).output())
            .await
            .unwrap_or_else(|_| panic!("connect --listen {address} did not stop"))
            .unwrap();
        let stderr = String::from_utf8_lossy(&ran.stderr);
        assert_eq!(ran.status.code(), Some(2), "{address}: {stderr}");
        assert!(
            stderr.contains("is not a loopback address") && stderr.contains("section 17"),
            "{address}: {stderr}"
        );
    }

    let mut listening = connect("localhost:0").spawn().unwrap();
    let mut stdout = BufReader::new(listening.stdout.take().unwrap()).lines();
    let ready = tokio::time::timeout(Duration::from_secs(30), stdout.next_line())
        .await
        .expect("a ready line within 30 s")
        .unwrap()
        .expect("connect --listen localhost:0 printed nothing");
    assert!(
        ready.starts_with("sealgate connect ready on http://127.0.0.1:"),
        "{ready}"
    );
}

#[tokio::test]
async fn a_missing_or_empty_token_file_stops_connect_with_exit_2_and_help_names_every_flag() {
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("key.pem");
    let key = sealgate::envelope::generate_signing_key().unwrap();
    std::fs::write(
        &key_file,
        sealgate::envelope::signing_key_to_pkcs8_pem(&key).unwrap(),
    )
    .unwrap();
    let token_file = dir.path().join("token");
    let args = |token: &Path| {
        vec![
            "connect".to_string(),
            "--gateway".into(),
            "http://127.0.0.1:9".into(),
            "--key".into(),
            key_file.display().to_string(),
            "--token".into(),
            token.display().to_string(),
        ]
    };
    let run = |args: Vec<String>| {
        std::process::Command::new(binary())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let missing = run(args(&token_file));
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("token file"));
    std::fs::write(&token_file, "  \n").unwrap();
    let empty = run(args(&token_file));
    assert_eq!(empty.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&empty.stderr).contains("does not hold a token"));

    let help = run(vec!["connect".into(), "--help".into()]);
    let help = String::from_utf8_lossy(&help.stdout);
    for word in [
        "--gateway",
        "--key",
        "--token",
        "--wait-approval",
        "--timeout",
        "--listen",
        "--ca-file",
        "--client-cert",
        "--client-key",
        "SEALGATE_GATEWAY",
        "SEALGATE_KEY_FILE",
        "SEALGATE_TOKEN_FILE",
    ] {
        assert!(
            help.contains(word),
            "--help does not mention {word}:\n{help}"
        );
    }
}

#[tokio::test]
async fn calls_go_on_across_token_rotation_repeat_without_1008_and_log_no_secret() {
    let setup = setup().await;
    let agent = agent(&setup, "raw").await;
    // Markers in the token (a claim), the arguments, and the key's own text: none may reach stderr.
    let mut claims = setup.gw.keys.agent_claims("raw", "connect");
    claims["jti"] = json!("jti-marker-7f3a");
    let marked_token = setup.gw.keys.agent_token_from(&claims);
    std::fs::write(&agent.token_file, &marked_token).unwrap();
    let gateway = setup.gw.base.clone();
    let (key_arg, token_arg) = (
        agent.key_file.to_str().unwrap(),
        agent.token_file.to_str().unwrap(),
    );
    let mut host = RawHost::start(
        &[
            "--gateway",
            &gateway,
            "--key",
            key_arg,
            "--token",
            token_arg,
        ],
        &[("RUST_LOG", "trace")],
    );
    host.initialize().await;

    // The same id and arguments again and again: each envelope is fresh (never a 1008).
    let marked = call("every.echo", json!({"message": "arg-marker-51c9"}));
    for _ in 0..6 {
        let answer = host.request(json!(7), "tools/call", marked.clone()).await;
        assert_eq!(text(&answer["result"]), "Echo: arg-marker-51c9", "{answer}");
    }

    // A rewrite that holds no token is ignored; a new token is used from the next call on.
    std::fs::write(&agent.token_file, "not a token\n").unwrap();
    let answer = host.request(json!(8), "tools/call", marked.clone()).await;
    assert_ne!(answer["result"]["isError"], true, "{answer}");
    let mut renewed = setup.gw.keys.agent_claims("raw", "connect");
    renewed["jti"] = json!("renewed-jti");
    let next = dir_write(&agent.token_file, &setup.gw.keys.agent_token_from(&renewed));
    let answer = host.request(json!(9), "tools/call", marked.clone()).await;
    assert_ne!(answer["result"]["isError"], true, "{answer}");
    let trail = setup.gw.events("raw").await;
    let jtis: Vec<&str> = trail
        .iter()
        .filter(|e| e["type"] == "ToolCallCompleted")
        .filter_map(|e| e["jti"].as_str())
        .collect();
    assert_eq!(jtis.len(), 8, "{jtis:?}");
    assert!(
        jtis[..7].iter().all(|jti| *jti == "jti-marker-7f3a"),
        "{jtis:?}"
    );
    assert_eq!(jtis[7], "renewed-jti", "{next}");

    // A refused tools/list is a JSON-RPC error carrying the gateway's error object.
    let (status, body) = setup
        .gw
        .admin(Method::DELETE, "/v1/seal/sessions/raw", None)
        .await;
    assert_eq!(status, 200, "{body}");
    let listed = host.request(json!(10), "tools/list", json!({})).await;
    assert_eq!(listed["error"]["code"], -32603, "{listed}");
    assert_eq!(
        listed["error"]["data"]["sealgate/error"]["code"], 1006,
        "{listed}"
    );
    assert!(listed["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("sealgate refused this call: 1006 SESSION_INACTIVE: "));

    let (status, stderr) = host.finish().await;
    assert_eq!(status, Some(0), "{stderr}");
    let key_body: String = agent
        .key_pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    for secret in [
        "jti-marker-7f3a",
        "arg-marker-51c9",
        marked_token.as_str(),
        agent.token.as_str(),
        key_body.as_str(),
    ] {
        assert!(
            !stderr.contains(secret),
            "stderr holds a secret ({secret}):\n{stderr}"
        );
    }
    // The log did run at trace level: an empty stderr would prove nothing.
    assert!(stderr.contains("token file"), "{stderr}");
}

/// Replaces a file as orchestrators do (write a new one, rename it over the old); returns the text.
fn dir_write(path: &Path, text: &str) -> String {
    let next = path.with_extension("next");
    std::fs::write(&next, text).unwrap();
    std::fs::rename(&next, path).unwrap();
    text.to_owned()
}

/// Runs openssl in `dir`, failing the test with its output when it fails.
fn openssl(dir: &Path, args: &[&str]) {
    let out = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl runs (scripts/test.sh installs it)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A test CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the CA.
fn certificates(dir: &Path) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    openssl(
        dir,
        &[
            &["req", "-x509"][..],
            &ec,
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "1",
                "-subj",
                "/CN=test-ca",
            ],
        ]
        .concat(),
    );
    for (name, usage) in [
        (
            "server",
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        ),
        ("client", "extendedKeyUsage=clientAuth\n"),
    ] {
        std::fs::write(dir.join(format!("{name}.ext")), usage).unwrap();
        let (key, csr, pem, ext) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
            format!("{name}.ext"),
        );
        openssl(
            dir,
            &[
                &["req"][..],
                &ec,
                &[
                    "-keyout",
                    &key,
                    "-out",
                    &csr,
                    "-subj",
                    &format!("/CN={name}"),
                ],
            ]
            .concat(),
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &pem,
                "-days",
                "1",
                "-extfile",
                &ext,
            ],
        );
    }
}

/// A TLS front for the gateway that asks every client for a certificate signed by the test CA (mutual
/// TLS), then relays the bytes to the gateway's plain port. Returns its https base URL.
async fn tls_front(dir: &Path, gateway: &str) -> String {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use tokio_rustls::rustls;
    let read = |name: &str| std::fs::read(dir.join(name)).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(&read("ca.pem")).unwrap())
        .unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider.clone())
            .build()
            .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            vec![CertificateDer::from_pem_slice(&read("server.pem")).unwrap()],
            PrivateKeyDer::from_pem_slice(&read("server.key")).unwrap(),
        )
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let front = listener.local_addr().unwrap();
    let backend = gateway.trim_start_matches("http://").to_owned();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let (acceptor, backend) = (acceptor.clone(), backend.clone());
            tokio::spawn(async move {
                // A client without a certificate fails here, as it would at a gateway with client_ca_file.
                let Ok(mut tls) = acceptor.accept(socket).await else {
                    return;
                };
                let mut plain = tokio::net::TcpStream::connect(&backend).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    format!("https://{front}")
}

#[tokio::test]
async fn an_https_gateway_is_reached_with_the_ca_file_and_the_client_certificate() {
    let setup = setup().await;
    let agent = agent(&setup, "tls").await;
    certificates(setup.dir.path());
    let https = tls_front(setup.dir.path(), &setup.gw.base).await;
    let file = |name: &str| setup.dir.path().join(name).display().to_string();
    let (key, token) = (
        agent.key_file.display().to_string(),
        agent.token_file.display().to_string(),
    );
    let base = [
        "--gateway",
        https.as_str(),
        "--key",
        key.as_str(),
        "--token",
        token.as_str(),
    ];
    let (ca, cert, client_key) = (file("ca.pem"), file("client.pem"), file("client.key"));
    let with = |extra: &[&str]| {
        [&base[..], extra]
            .concat()
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
    };

    let full = with(&[
        "--ca-file",
        &ca,
        "--client-cert",
        &cert,
        "--client-key",
        &client_key,
    ]);
    let without_certificate = with(&["--ca-file", &ca]);
    let without_ca = with(&["--client-cert", &cert, "--client-key", &client_key]);
    for (args, reached) in [
        (full, true),
        (without_certificate, false),
        (without_ca, false),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut host = RawHost::start(&args, &[]);
        host.initialize().await;
        let answer = host
            .request(
                json!(1),
                "tools/call",
                call("every.echo", json!({"message": "tls"})),
            )
            .await;
        if reached {
            assert_eq!(text(&answer["result"]), "Echo: tls", "{answer}");
        } else {
            assert!(
                text(&answer["result"]).starts_with("sealgate is unreachable"),
                "{args:?}: {answer}"
            );
        }
        host.finish().await;
    }
}

/// docs/connect.md, followed word for word (tests/common/page.rs): a gateway of its own, a session with a key
/// file and a token file, a host of a few lines on the MCP Python SDK calling through `connect` over stdio,
/// and `--listen` served on loopback and refused on every interface.
#[test]
fn the_connect_page_runs_word_for_word() {
    const PAGE: &str = include_str!("../docs/connect.md");
    // The gateway and `connect --listen`.
    const PAGE_PORTS: [&str; 2] = ["8089", "8765"];
    let blocks = page::fenced_blocks(PAGE);
    let venv = page::venv_setup("mcp", "mcp==2.3.0");
    let venv: Vec<&str> = venv.iter().map(String::as_str).collect();
    let shown = ["text", "json", "sh example", "python", "typescript"];
    page::check_blocks(&blocks, &[&BUILD, &venv], &shown);
    for port in PAGE_PORTS {
        assert!(PAGE.contains(port), "the page no longer uses port {port}");
    }
    let ports = page::free_ports(&PAGE_PORTS);
    let (script, last) = page::page_script("connect page", &blocks, &ports);
    let dir = tempfile::tempdir().unwrap();
    let path = page::user_path(&python());
    let (status, printed) = page::run_page(dir.path(), &script, &path, Duration::from_secs(120));
    assert!(
        status.success() && printed.contains(&last),
        "the page failed ({status}) after the last `connect page: block N ran`:\n{printed}"
    );

    let said = |expected: &str| printed.lines().any(|line| line.starts_with(expected));
    assert!(said("/workspace/notes.txt -> ok"), "{printed}");
    assert!(
        said("/etc/passwd -> sealgate refused this call: 2002 POLICY_VIOLATION_PATH_NOT_ALLOWED"),
        "{printed}"
    );
    let listening = format!(
        "sealgate connect ready on http://127.0.0.1:{}/mcp",
        ports["8765"]
    );
    assert!(said(&listening), "{printed}");
    assert!(
        printed.contains("0.0.0.0 is not a loopback address"),
        "{printed}"
    );
    assert!(said("exit status 2"), "{printed}");
}
