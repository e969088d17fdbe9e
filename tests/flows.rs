//! Session flow rules (SPEC 19) through the real binary: the lethal trifecta (a web fetch that brings
//! untrusted content, a customer file that brings private data, an email that sends things out), labels
//! gained only by completed calls and shown on the session with the events that brought them, a label
//! gained through one replica blocking on the other, and the offline and API explanations.

mod common;

use std::process::Command;
use std::sync::Arc;

use common::oidc::{forge, Provider, RsaKey, PROVIDER_KID};
use common::{code, start_tool, write_config, Gateway, Keys, Tool};
use ed25519_dalek::SigningKey;
use reqwest::Method;
use sealgate::store::testing::TestDatabase;
use serde_json::{json, Value};

/// The trifecta context of docs/flows.md, with three more labelled fetches whose calls fail.
const TRIFECTA: &str = r#"
name: trifecta
capabilities:
  - { tool_pattern: "web.fetch", domain_allowlist: ["*.example.com"], labels: [untrusted_content], claim: off }
  - { tool_pattern: "fs.read_file", path_allowlist: ["/srv/customers"], labels: [private_data], claim: auto }
  - { tool_pattern: "email.send", labels: [external_send], claim: off }
  - { tool_pattern: "down.fetch", labels: [untrusted_content] }
  - { tool_pattern: "slow.fetch", labels: [untrusted_content], claim: off }
  - { tool_pattern: "bad.fetch", labels: [untrusted_content], claim: off }
flow_rules:
  - { if_session_has: [untrusted_content, private_data], block: [external_send], action: deny }
  - { if_session_has: [untrusted_content], block: [external_send], action: approval }
"#;

/// The test configuration's upstreams, plus `web`, `fs` and `email` served by the counting tool.
fn upstreams(tool_base: &str) -> String {
    ["web", "fs", "email"]
        .iter()
        .map(|name| format!("  {name}: {{ http: {{ url: \"{tool_base}/rpc\" }} }}\n"))
        .collect()
}

fn with_trifecta(dir: &std::path::Path) {
    std::fs::write(dir.join("policies/trifecta.yaml"), TRIFECTA).unwrap();
}

async fn start(dir: &std::path::Path) -> (Gateway, Arc<Tool>) {
    start_with(dir, "").await
}

async fn start_with(dir: &std::path::Path, extra: &str) -> (Gateway, Arc<Tool>) {
    let (tool, tool_base) = start_tool().await;
    let keys = Arc::new(Keys::new());
    let config = write_config(dir, &keys, &tool_base, &upstreams(&tool_base), extra);
    with_trifecta(dir);
    (Gateway::spawn(dir, &config, keys), tool)
}

async fn call(
    gw: &Gateway,
    key: &SigningKey,
    token: &str,
    tool: &str,
    args: Value,
) -> (u16, Value) {
    gw.call_tool(key, token, tool, args).await
}

fn fetch() -> Value {
    json!({"url": "https://news.example.com/today"})
}

fn customer_file() -> Value {
    json!({"path": "/srv/customers/acme.txt"})
}

fn email() -> Value {
    json!({"to": "someone@elsewhere.test", "body": "hello"})
}

/// `GET /v1/seal/sessions/{id}`'s labels as (label, seq).
async fn labels(gw: &Gateway, session: &str) -> Vec<(String, u64)> {
    let (status, body) = gw
        .admin(Method::GET, &format!("/v1/seal/sessions/{session}"), None)
        .await;
    assert_eq!(status, 200, "{body}");
    body["labels"]
        .as_array()
        .unwrap_or_else(|| panic!("no labels in {body}"))
        .iter()
        .map(|held| {
            (
                held["label"].as_str().unwrap().to_owned(),
                held["seq"].as_u64().unwrap(),
            )
        })
        .collect()
}

fn of_type<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

/// A webhook receiver that keeps the bodies it is sent.
async fn start_webhook() -> (Arc<std::sync::Mutex<Vec<Value>>>, String) {
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let kept = seen.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
            let kept = kept.clone();
            async move {
                kept.lock().unwrap().push(body);
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (seen, format!("http://{addr}/hook"))
}

#[tokio::test]
async fn the_lethal_trifecta_is_refused_and_one_leg_of_it_waits_for_a_person() {
    let dir = tempfile::tempdir().unwrap();
    let (hooked, hook_url) = start_webhook().await;
    let (gw, tool) = start_with(
        dir.path(),
        &format!("approvals: {{ webhook_url: {hook_url:?} }}\n"),
    )
    .await;
    let (key, token) = gw.session_in("trifecta-1", "trifecta").await;
    assert_eq!(labels(&gw, "trifecta-1").await, []);

    // An email first: nothing held, nothing blocks it.
    let (status, body) = call(&gw, &key, &token, "email.send", email()).await;
    assert_eq!(status, 200, "{body}");
    // The customer file: private data alone does not block an email.
    let (status, body) = call(&gw, &key, &token, "fs.read_file", customer_file()).await;
    assert_eq!(status, 200, "{body}");
    let private_seq = body["receipt"]["event_seq"].as_u64().unwrap();
    let held = labels(&gw, "trifecta-1").await;
    // The email that ran brought its own label first (no rule reads it as held).
    let send_seq = held[0].1;
    assert_eq!(
        held,
        [
            ("external_send".to_owned(), send_seq),
            ("private_data".to_owned(), private_seq)
        ]
    );
    let (status, body) = call(&gw, &key, &token, "email.send", email()).await;
    assert_eq!(status, 200, "{body}");
    // The web page: now the session holds both.
    let (status, body) = call(&gw, &key, &token, "web.fetch", fetch()).await;
    assert_eq!(status, 200, "{body}");
    let untrusted_seq = body["receipt"]["event_seq"].as_u64().unwrap();
    assert_eq!(
        labels(&gw, "trifecta-1").await,
        [
            ("external_send".to_owned(), send_seq),
            ("private_data".to_owned(), private_seq),
            ("untrusted_content".to_owned(), untrusted_seq)
        ]
    );

    let ran = tool.count();
    let (status, body) = call(&gw, &key, &token, "email.send", email()).await;
    assert_eq!((status, code(&body)), (403, 2010), "{body}");
    assert_eq!(tool.count(), ran, "a blocked email reached the tool");
    let flow = &body["error"]["details"]["flow_rule"];
    assert_eq!(flow["index"], 0, "{body}");
    assert_eq!(flow["action"], "deny");
    assert_eq!(flow["blocks"], json!(["external_send"]));
    assert_eq!(
        flow["labels"],
        json!([{"label": "untrusted_content", "seq": untrusted_seq},
               {"label": "private_data", "seq": private_seq}])
    );
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("flow rule 0")),
        "{body}"
    );
    // A refusal after check 8 carries its receipt, and its event names the rule.
    assert!(body["error"]["receipt"]["event_seq"].is_u64(), "{body}");
    let events = gw.events("trifecta-1").await;
    let blocked = of_type(&events, "PolicyViolationBlocked");
    assert_eq!(blocked.len(), 1, "{events:#?}");
    assert_eq!(blocked[0]["code"], 2010);
    assert_eq!(
        blocked[0]["rule"],
        json!({"kind": "flow_rule", "index": 0, "pattern": null})
    );
    // Each completion names the labels it brought, and the store kept each with that event's seq.
    let completed = of_type(&events, "ToolCallCompleted");
    let named: Vec<(Value, Value)> = completed
        .iter()
        .map(|e| (e["seq"].clone(), e["labels_added"].clone()))
        .collect();
    assert!(
        named.contains(&(json!(private_seq), json!(["private_data"]))),
        "{named:?}"
    );
    assert!(
        named.contains(&(json!(untrusted_seq), json!(["untrusted_content"]))),
        "{named:?}"
    );
    // The emails that ran named theirs too, though no rule reads external_send as held.
    assert_eq!(
        completed
            .iter()
            .filter(|e| e["labels_added"] == json!(["external_send"]))
            .count(),
        2
    );

    // Another session with untrusted content only: the email waits for a person, and the request
    // names the rule that asked for it (the capability itself asks none).
    let (key, token) = gw.session_in("trifecta-2", "trifecta").await;
    let (status, body) = call(&gw, &key, &token, "web.fetch", fetch()).await;
    assert_eq!(status, 200, "{body}");
    let ran = tool.count();
    let (status, body) = call(&gw, &key, &token, "email.send", email()).await;
    assert_eq!((status, code(&body)), (403, 4003), "{body}");
    assert_eq!(tool.count(), ran);
    let approval_id = body["error"]["details"]["approval_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, request) = gw
        .admin(Method::GET, &format!("/v1/approvals/{approval_id}"), None)
        .await;
    assert_eq!(status, 200, "{request}");
    assert_eq!(request["flow_rule"], 1, "{request}");
    assert_eq!(request["approvers"], 1);
    // The webhook that announces the request names the rule too.
    common::until(
        std::time::Duration::from_secs(10),
        "the webhook delivery",
        || async { !hooked.lock().unwrap().is_empty() },
    )
    .await;
    let delivered = hooked.lock().unwrap()[0].clone();
    assert_eq!(
        (&delivered["approval_id"], &delivered["flow_rule"]),
        (&json!(approval_id), &json!(1)),
        "{delivered}"
    );
    let (status, granted) = gw
        .admin(
            Method::POST,
            &format!("/v1/approvals/{approval_id}/grant"),
            Some(json!({"reason": "newsletter"})),
        )
        .await;
    assert_eq!(status, 200, "{granted}");
    let (status, body) = call(&gw, &key, &token, "email.send", email()).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(tool.count(), ran + 1);
}

#[tokio::test]
async fn labels_come_only_from_calls_that_completed() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, tool) = start(dir.path()).await;
    let (key, token) = gw.session_in("partial", "trifecta").await;
    // Refused by the capability's own check, never forwarded, timed out, answered with nonsense.
    let refused = call(
        &gw,
        &key,
        &token,
        "web.fetch",
        json!({"url": "https://evil.test/"}),
    )
    .await;
    assert_eq!(code(&refused.1), 2004, "{}", refused.1);
    let down = call(&gw, &key, &token, "down.fetch", fetch()).await;
    assert_eq!(code(&down.1), 5001, "{}", down.1);
    let slow = call(&gw, &key, &token, "slow.fetch", fetch()).await;
    assert_eq!(code(&slow.1), 5002, "{}", slow.1);
    let bad = call(&gw, &key, &token, "bad.fetch", fetch()).await;
    assert_eq!(code(&bad.1), 5003, "{}", bad.1);
    assert_eq!(labels(&gw, "partial").await, []);
    // So nothing holds the email back, not even for approval.
    let (status, body) = call(&gw, &key, &token, "email.send", email()).await;
    assert_eq!(status, 200, "{body}");

    // A SKIP answers from the claim: it adds nothing, and the label keeps its first event's seq.
    let (status, first) = call(&gw, &key, &token, "fs.read_file", customer_file()).await;
    assert_eq!(
        (status, first["receipt"]["claim"].as_str()),
        (200, Some("PROCEED")),
        "{first}"
    );
    let ran = tool.count();
    let (status, again) = call(&gw, &key, &token, "fs.read_file", customer_file()).await;
    assert_eq!(
        (status, again["receipt"]["claim"].as_str()),
        (200, Some("SKIP")),
        "{again}"
    );
    assert_eq!(tool.count(), ran);
    let first_seq = first["receipt"]["event_seq"].as_u64().unwrap();
    let held = labels(&gw, "partial").await;
    assert_eq!(held.len(), 2, "{held:?}");
    assert_eq!(held[0].0, "external_send");
    assert_eq!(held[1], ("private_data".to_owned(), first_seq));
    let events = gw.events("partial").await;
    let skipped = of_type(&events, "ClaimSkipped");
    assert_eq!(skipped.len(), 1);
    assert!(skipped[0].get("labels_added").is_none(), "{}", skipped[0]);
    for failed in of_type(&events, "ToolCallFailed") {
        assert!(failed.get("labels_added").is_none(), "{failed}");
    }

    // A label the session holds again brings no second row: the first seq stays.
    let (status, _) = call(
        &gw,
        &key,
        &token,
        "fs.read_file",
        json!({"path": "/srv/customers/b.txt"}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(labels(&gw, "partial").await, held);
    // And labels outlive a restart: they are the store's, not the process's.
    let mut gw = gw;
    gw.restart();
    assert_eq!(labels(&gw, "partial").await, held);
}

#[tokio::test]
async fn labels_outlive_retention_and_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let retention =
        "retention: { audit_days: 0.00001, claims_days: 0.00001, archive_dir: archive }\n\
                     limits: { max_clock_skew_secs: 1 }\n";
    let (mut gw, _tool) = start_with(dir.path(), retention).await;
    let (key, token) = gw.session_in("kept", "trifecta").await;
    let (_, fetched) = call(&gw, &key, &token, "web.fetch", fetch()).await;
    let (_, read) = call(&gw, &key, &token, "fs.read_file", customer_file()).await;
    let newest = read["receipt"]["event_seq"].as_u64().unwrap();
    let held = labels(&gw, "kept").await;
    assert_eq!(
        held,
        [
            (
                "untrusted_content".to_owned(),
                fetched["receipt"]["event_seq"].as_u64().unwrap()
            ),
            ("private_data".to_owned(), newest)
        ]
    );
    // Retention archives every event that brought them and removes it from the store (SPEC 20 rule 1)...
    common::until(
        std::time::Duration::from_secs(30),
        "the store to drop the events that brought the labels",
        || async {
            let export = gw.export().await;
            let first: Value = serde_json::from_str(export.lines().next().unwrap_or("{}")).unwrap();
            first["seq"].as_u64().is_some_and(|seq| seq > newest)
        },
    )
    .await;
    // ...and the session keeps them, with their seqs, across a restart too.
    assert_eq!(labels(&gw, "kept").await, held);
    gw.restart();
    assert_eq!(labels(&gw, "kept").await, held);
    let (status, body) = call(&gw, &key, &token, "email.send", email()).await;
    assert_eq!((status, code(&body)), (403, 2010), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_label_gained_through_one_replica_blocks_on_the_other() {
    let db = TestDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();
    let (tool, tool_base) = start_tool().await;
    let keys = Arc::new(Keys::new());
    let replicas: Vec<Gateway> = (0..2)
        .map(|i| {
            let folder = dir.path().join(format!("r{i}"));
            let signing = common::replica_signing(dir.path(), 2, i);
            let extra = format!("store: {:?}\nreplica_id: r{i}\n{signing}", db.url);
            let config = write_config(&folder, &keys, &tool_base, &upstreams(&tool_base), &extra);
            with_trifecta(&folder);
            Gateway::spawn(&folder, &config, keys.clone())
        })
        .collect();
    let (a, b) = (&replicas[0], &replicas[1]);
    let (key, token) = a.session_in("replicated", "trifecta").await;
    // Warm b's session cache first: the labels must still not come from a copy of b's own.
    let (status, body) = call(b, &key, &token, "email.send", email()).await;
    assert_eq!(status, 200, "{body}");
    for (gw, tool_name, args) in [
        (a, "web.fetch", fetch()),
        (b, "fs.read_file", customer_file()),
    ] {
        let (status, body) = call(gw, &key, &token, tool_name, args).await;
        assert_eq!(status, 200, "{body}");
    }
    // At once, with no wait: the labels were durable on the shared store before each answer left.
    let ran = tool.count();
    for gw in [a, b] {
        let (status, body) = call(gw, &key, &token, "email.send", email()).await;
        assert_eq!((status, code(&body)), (403, 2010), "{body}");
    }
    assert_eq!(tool.count(), ran);
    assert_eq!(labels(a, "replicated").await, labels(b, "replicated").await);
    assert_eq!(labels(b, "replicated").await.len(), 3);
}

/// SPEC 17: a person's MCP host calls through the same pipeline, so their session gains and meets labels
/// in the same way.
#[tokio::test]
async fn a_persons_session_from_an_mcp_host_meets_the_same_rules() {
    const RESOURCE: &str = "http://127.0.0.1/mcp";
    let dir = tempfile::tempdir().unwrap();
    let key = RsaKey::generate(dir.path());
    let provider = Provider::start_with(json!({"signing_key_pem": key.private_pem}));
    let extra = format!(
        "mcp_server:\n  enabled: true\n  resource: {RESOURCE:?}\n  authorization_servers: [{:?}]\
         \n  keys: [ {{ jwks_url: {:?} }} ]\
         \n  people:\
         \n    - {{ group: support, context: trifecta }}\n",
        provider.issuer,
        provider.jwks_url()
    );
    let (gw, tool) = start_with(dir.path(), &extra).await;
    let now = sealgate::clock::now_secs();
    let token = forge::rs256(
        &key,
        PROVIDER_KID,
        &json!({"iss": provider.issuer, "sub": "sam", "aud": RESOURCE, "iat": now, "exp": now + 300,
                "scope": "openid mcp:tools", "azp": "host-a", "groups": ["support"], "jti": "jti-sam"}),
    );
    let post = |id: Option<String>, body: Value| {
        let mut request = gw
            .client
            .post(format!("{}/mcp", gw.base))
            .bearer_auth(&token)
            .json(&body);
        if let Some(id) = id {
            request = request.header("mcp-session-id", id);
        }
        request.send()
    };
    let initialized = post(
        None,
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"}}}),
    )
    .await
    .unwrap();
    assert_eq!(initialized.status(), 200);
    let mcp_session = initialized.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let mut session_id = String::new();
    for (n, (name, args)) in [("web.fetch", fetch()), ("fs.read_file", customer_file())]
        .into_iter()
        .enumerate()
    {
        let answer: Value = post(
            Some(mcp_session.clone()),
            json!({"jsonrpc": "2.0", "id": n + 1, "method": "tools/call",
                   "params": {"name": name, "arguments": args}}),
        )
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
        assert_ne!(answer["result"]["isError"], true, "{answer}");
        session_id = answer["result"]["_meta"]["sealgate/receipt"]["session_id"]
            .as_str()
            .unwrap()
            .to_owned();
    }
    let ran = tool.count();
    let refused: Value = post(
        Some(mcp_session),
        json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
               "params": {"name": "email.send", "arguments": email()}}),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert_eq!(refused["result"]["isError"], true, "{refused}");
    assert_eq!(refused["result"]["_meta"]["sealgate/error"]["code"], 2010);
    assert_eq!(tool.count(), ran);
    let held: Vec<String> = labels(&gw, &session_id)
        .await
        .into_iter()
        .map(|(label, _)| label)
        .collect();
    assert_eq!(held, ["untrusted_content", "private_data"]);
}

#[tokio::test]
async fn evaluate_explain_and_check_speak_of_flow_rules() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, _tool) = start(dir.path()).await;
    let evaluate = |labels: Value| {
        gw.admin(
            Method::POST,
            "/v1/security-contexts/trifecta/evaluate",
            Some(json!({"tool": "email.send", "arguments": {}, "session_labels": labels})),
        )
    };
    let (status, none) = evaluate(json!([])).await;
    assert_eq!(status, 200, "{none}");
    assert_eq!(none["decision"], "allow");
    assert_eq!(none["labels_added"], json!(["external_send"]));
    assert!(none.get("approval").is_none(), "{none}");
    let (_, one) = evaluate(json!(["untrusted_content"])).await;
    assert_eq!(one["decision"], "allow", "{one}");
    assert_eq!(one["approval"]["required"], true);
    assert_eq!(one["flow_rule"]["index"], 1);
    let (_, both) = evaluate(json!(["private_data", "untrusted_content"])).await;
    assert_eq!(
        (both["decision"].as_str(), both["code"].as_u64()),
        (Some("deny"), Some(2010)),
        "{both}"
    );
    assert_eq!(both["rule"]["kind"], "flow_rule");
    assert_eq!(
        both["flow_rule"]["labels"],
        json!([{"label": "untrusted_content"}, {"label": "private_data"}])
    );
    let (status, bad) = evaluate(json!(["not a label"])).await;
    assert_eq!((status, code(&bad)), (422, 6005), "{bad}");

    let policies = dir.path().join("policies");
    let sealgate = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_sealgate"))
            .args(args)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let policies_arg = policies.to_str().unwrap();
    let explain = |labels: &[&str]| {
        let mut args = vec!["policy", "explain", "--policies", policies_arg];
        args.extend(["--context", "trifecta", "--tool", "email.send"]);
        args.extend(labels);
        let out = Command::new(env!("CARGO_BIN_EXE_sealgate"))
            .args(&args)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (out.status.code(), text)
    };
    // SPEC 6.4 r4: 1 refused, 0 allowed, 3 allowed after a person's approval (the flow rule's).
    let (status, out) = explain(&["--session-labels", "untrusted_content,private_data"]);
    assert!(
        out.starts_with("deny  code: 2010 FLOW_BLOCKED  rule: flow_rule #0"),
        "{out}"
    );
    assert_eq!(status, Some(1), "{out}");
    let (status, out) = explain(&[]);
    assert!(out.starts_with("allow  rule:"), "{out}");
    assert_eq!(status, Some(0), "{out}");
    let (status, out) = explain(&["--session-labels", "untrusted_content"]);
    assert!(out.starts_with("allow, approval required  rule:"), "{out}");
    assert_eq!(status, Some(3), "{out}");

    // `policy check` warns of a rule that names a label no capability gives, and still passes.
    std::fs::write(
        policies.join("typo.yaml"),
        "name: typo\ncapabilities:\n  - { tool_pattern: \"web.fetch\", labels: [untrusted] }\n\
         flow_rules:\n  - { if_session_has: [untrusted_content], block: [external_send], action: deny }\n",
    )
    .unwrap();
    let (ok, out, err) = sealgate(&["policy", "check", policies_arg]);
    assert!(ok, "{err}");
    assert!(
        out.contains("warning  typo: flow_rules[0].if_session_has: no capability gives the label \"untrusted_content\""),
        "{out}"
    );
    assert!(!out.contains("warning  trifecta"), "{out}");
    // A bad label stops the check with the file, the line and the field.
    std::fs::write(
        policies.join("typo.yaml"),
        "name: typo\ncapabilities:\n  - tool_pattern: web.fetch\n    labels: [\"untrusted content\"]\n",
    )
    .unwrap();
    let (ok, _, err) = sealgate(&["policy", "check", policies_arg]);
    assert!(!ok);
    assert!(
        err.contains("typo.yaml:4: capabilities[0].labels[0]: invalid label"),
        "{err}"
    );
}
