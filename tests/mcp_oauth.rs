//! MCP hosts over the network (SPEC 17, issue 33), end to end through the release binary: the gateway
//! as a remote MCP server and OAuth 2.1 resource server, a real OpenID provider as the authorization
//! server (`oidc-provider`, tests/oidc), and three real MCP hosts doing the whole dance with their own
//! OAuth clients (tests/mcp-hosts: the official Python and TypeScript SDKs and the MCP Inspector CLI).
//! Behind the gateway is the reference filesystem MCP server (tests/mcp-servers). The refusals of
//! tokens that no honest provider issues are tests/mcp_server.rs's.

mod common;

use std::path::{Path, PathBuf};

use common::mcp::server_script;
use common::mcp_hosts::{self, call_tool, list_tools, redirect_uri, Person};
use common::oidc::{self, forge, Provider};
use common::Gateway;
use reqwest::Method;
use serde_json::{json, Value};

const LEDGER: &str = "payments ledger: 3 entries, all settled";
const HARNESS_CLIENT: &str = "harness";

const PAT: Person = Person {
    login: "pat",
    password: "pat-pw",
};
const TESS: Person = Person {
    login: "tess",
    password: "tess-pw",
};
const IVAN: Person = Person {
    login: "ivan",
    password: "ivan-pw",
};
/// In no group that a rule names, and with an email the `claim` rule does not match.
const EVE: Person = Person {
    login: "eve",
    password: "eve-pw",
};

/// A gateway with MCP authorization on, the provider that signs its people in, and the folder the
/// filesystem server serves.
struct Setup {
    gw: Gateway,
    provider: Provider,
    root: PathBuf,
    _dirs: (tempfile::TempDir, tempfile::TempDir),
}

impl Setup {
    fn mcp_url(&self) -> String {
        format!("{}/mcp", self.gw.base)
    }
}

/// payments-agent may read text files in `root` and nothing else; default-agent may only ask which
/// folders there are.
fn write_policies(dir: &Path, root: &Path) {
    std::fs::create_dir_all(dir.join("policies")).unwrap();
    std::fs::write(
        dir.join("policies/payments-agent.yaml"),
        format!(
            "name: payments-agent\ncapabilities:\n  - tool_pattern: \"fs.read_text_file\"\n    \
             path_allowlist: [{root:?}]\n"
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("policies/default-agent.yaml"),
        "name: default-agent\ncapabilities:\n  - tool_pattern: \"fs.list_allowed_directories\"\n",
    )
    .unwrap();
}

fn mcp_server_yaml(port: u16, issuer: &str) -> String {
    format!(
        r#"mcp_server:
  enabled: true
  path: "/mcp"
  resource: "http://127.0.0.1:{port}/mcp"
  authorization_servers: ["{issuer}"]
  keys: [ {{ jwks_url: "{issuer}/jwks" }} ]
  scopes_required: ["mcp:tools"]
  allowed_origins: []
  people:
    - {{ group: payments, context: payments-agent }}
    - {{ claim: email, pattern: "*@example.com", context: default-agent }}
  session: {{ expires_secs: 3600, budget: null }}
"#
    )
}

async fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let served = tempfile::tempdir().unwrap();
    // The filesystem server compares real paths, and the temp dir may sit behind a symlink.
    let root = served.path().canonicalize().unwrap();
    std::fs::write(root.join("ledger.txt"), LEDGER).unwrap();
    let eve = json!({"sub": "eve", "password": "eve-pw", "name": "Eve Elsewhere",
                     "email": "eve@elsewhere.test", "groups": ["staff"]});
    let provider = Provider::start_with(json!({
        "clients": [oidc::client(HARNESS_CLIENT, None, &[redirect_uri("harness")])],
        "users": [
            oidc::user("pat", "pat-pw", "Pat Payments", &["payments"]),
            oidc::user("tess", "tess-pw", "Tess Treasury", &["staff", "payments"]),
            oidc::user("ivan", "ivan-pw", "Ivan Invoices", &["payments"]),
            eve,
        ],
        "resource_scopes": ["mcp:tools"],
        "registration": true,
    }));
    write_policies(dir.path(), &root);
    let upstreams = format!(
        "  fs: {{ mcp: {{ command: node, args: [{script:?}, {root:?}] }}, timeout_ms: 20000 }}\n",
        script = server_script("server-filesystem"),
    );
    let issuer = provider.issuer.clone();
    let (gw, _tool) = Gateway::start_release_on_known_port(dir.path(), &upstreams, |port| {
        mcp_server_yaml(port, &issuer)
    })
    .await;
    Setup {
        gw,
        provider,
        root,
        _dirs: (dir, served),
    }
}

/// What each host does: list the tools, read the ledger, and try a file outside the allowed folder.
fn actions(root: &Path) -> Vec<Value> {
    vec![
        list_tools(),
        call_tool(
            "fs.read_text_file",
            json!({"path": root.join("ledger.txt")}),
        ),
        call_tool("fs.read_text_file", json!({"path": "/etc/hostname"})),
    ]
}

/// The host's three results: only the context's tool listed, the ledger read with a receipt, the other
/// file refused as a tool result the model can read.
fn check_results(host: &str, results: &[Value]) {
    assert_eq!(results.len(), 3, "{host}: {results:#?}");
    let tools: Vec<&str> = results[0]["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{host}: no tools in {}", results[0]))
        .iter()
        .map(|tool| tool["name"].as_str().unwrap())
        .collect();
    assert_eq!(tools, ["fs.read_text_file"], "{host}: {}", results[0]);

    let read = &results[1]["result"];
    assert_eq!(read["content"][0]["text"], LEDGER, "{host}: {}", results[1]);
    assert_ne!(read["isError"], true, "{host}: {read}");
    let receipt = &read["_meta"]["sealgate/receipt"];
    assert!(receipt.is_object(), "{host}: no receipt in {read}");

    let refused = &results[2]["result"];
    assert_eq!(refused["isError"], true, "{host}: {}", results[2]);
    assert_eq!(
        refused["_meta"]["sealgate/error"]["code"], 2002,
        "{host}: {refused}"
    );
    assert!(
        refused["content"][0]["text"]
            .as_str()
            .unwrap_or("")
            .starts_with("sealgate refused this call: 2002"),
        "{host}: {refused}"
    );
}

/// The person's session, as the operator API lists it.
async fn session_of(gw: &Gateway, issuer: &str, sub: &str) -> Value {
    let (status, page) = gw.admin(Method::GET, "/v1/seal/sessions", None).await;
    assert_eq!(status, 200, "{page}");
    let mine: Vec<&Value> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|session| session["sub"] == sub)
        .collect();
    assert_eq!(mine.len(), 1, "one session for {sub}: {page}");
    let session = mine[0].clone();
    assert_eq!(session["kind"], "mcp", "{session}");
    assert_eq!(session["iss"], issuer, "{session}");
    assert_eq!(session["security_context"], "payments-agent", "{session}");
    session
}

/// The one completed call of the session, as its audit events tell it: by OAuth, naming the token's
/// issuer, subject, client and id. Returns its `client_id` and `jti`, and all the session's events.
async fn check_call_events(
    gw: &Gateway,
    session: &Value,
    issuer: &str,
    sub: &str,
) -> (String, String, Vec<Value>) {
    let id = session["session_id"].as_str().unwrap();
    let events = gw.events(id).await;
    let completed: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "ToolCallCompleted" && e["tool"] == "fs.read_text_file")
        .collect();
    assert_eq!(completed.len(), 1, "{sub}: {events:#?}");
    let event = completed[0];
    assert_eq!(event["auth"], "oauth", "{event}");
    assert_eq!(event["iss"], issuer, "{event}");
    assert_eq!(event["sub"], sub, "{event}");
    let client_id = event["client_id"].as_str().unwrap_or("").to_owned();
    let jti = event["jti"].as_str().unwrap_or("").to_owned();
    assert!(!client_id.is_empty() && !jti.is_empty(), "{event}");
    (client_id, jti, events)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_real_mcp_hosts_sign_in_with_oauth_list_and_call_through_the_release_gateway() {
    let setup = setup().await;
    let url = setup.mcp_url();
    let actions = actions(&setup.root);
    let issuer = setup.provider.issuer.as_str();

    // The SDK hosts do the dance themselves; the harness only plays the person at the provider.
    let python = mcp_hosts::run_python(&url, PAT, &actions).await;
    assert_eq!(python.sign_ins, 1, "{python:#?}");
    check_results("the Python SDK host", &python.results);
    let typescript = mcp_hosts::run_typescript(&url, TESS, &actions).await;
    assert_eq!(typescript.sign_ins, 1, "{typescript:#?}");
    check_results("the TypeScript SDK host", &typescript.results);

    let inspector = mcp_hosts::run_inspector(&url, IVAN, &actions).await;
    assert_eq!(
        inspector.sign_ins, 1,
        "the CLI keeps its token: {inspector:#?}"
    );
    check_results("the Inspector CLI", &inspector.results);

    // Each person has a session of their own, and their call's events name them and their host, which
    // registered itself (RFC 7591): a client the provider was not started with.
    let mut clients = Vec::new();
    for sub in ["pat", "tess", "ivan"] {
        let session = session_of(&setup.gw, issuer, sub).await;
        let (client_id, _jti, events) = check_call_events(&setup.gw, &session, issuer, sub).await;
        assert_ne!(client_id, HARNESS_CLIENT);
        let refusal = events
            .iter()
            .find(|e| e["tool"] == "fs.read_text_file" && e["code"] == 2002)
            .unwrap_or_else(|| panic!("{sub}: no refusal in the trail: {events:#?}"));
        assert_eq!(refusal["auth"], "oauth", "{refusal}");
        clients.push(client_id);
    }
    let distinct: std::collections::BTreeSet<&String> = clients.iter().collect();
    assert_eq!(distinct.len(), 3, "{clients:?}");
}

/// One JSON-RPC message to the MCP endpoint: the status, the `Mcp-Session-Id` header and the body.
struct Answer {
    status: u16,
    session: Option<String>,
    body: Value,
}

async fn post(url: &str, token: &str, session: Option<&str>, message: Value) -> Answer {
    let mut request = reqwest::Client::new()
        .post(url)
        .bearer_auth(token)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-06-18")
        .json(&message);
    if let Some(session) = session {
        request = request.header("mcp-session-id", session);
    }
    let response = request.send().await.unwrap();
    let session = response
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_owned());
    let status = response.status().as_u16();
    let body = response.json().await.unwrap_or(Value::Null);
    Answer {
        status,
        session,
        body,
    }
}

fn initialize() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "sealgate-test", "version": "1"}}})
}

/// With tokens the provider really issued (the harness's own dance, a pre-registered client): a call is
/// audited under the token's `jti` and client and never with the token, and a person that no people rule
/// names is refused at once and gets no session. (Forged tokens are tests/mcp_server.rs's.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_providers_token_is_audited_by_its_jti_never_itself_and_a_person_no_rule_names_is_refused(
) {
    let setup = setup().await;
    let url = setup.mcp_url();
    let issuer = setup.provider.issuer.as_str();

    let pat = mcp_hosts::authorize(&url, HARNESS_CLIENT, &redirect_uri("harness"), PAT).await;
    assert_eq!(
        pat.challenge,
        format!(
            "Bearer resource_metadata=\"{}/.well-known/oauth-protected-resource/mcp\"",
            setup.gw.base
        )
    );
    assert_eq!(
        pat.resource_metadata,
        json!({"resource": url, "authorization_servers": [issuer],
               "scopes_supported": ["mcp:tools"], "bearer_methods_supported": ["header"]})
    );
    let token = pat.access_token;
    let claims = forge::claims(&token);
    assert_eq!(
        (&claims["aud"], &claims["scope"], &claims["client_id"]),
        (&json!(url), &json!("mcp:tools"), &json!(HARNESS_CLIENT)),
        "RFC 8707: a token for this resource only: {claims}"
    );

    let opened = post(&url, &token, None, initialize()).await;
    assert_eq!(opened.status, 200, "{}", opened.body);
    let session = opened.session.expect("an Mcp-Session-Id");
    let read = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "fs.read_text_file", "arguments": {"path": setup.root.join("ledger.txt")}}});
    let answer = post(&url, &token, Some(&session), read).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(
        answer.body["result"]["content"][0]["text"], LEDGER,
        "{}",
        answer.body
    );
    let listed = session_of(&setup.gw, issuer, "pat").await;
    let (client_id, jti, _) = check_call_events(&setup.gw, &listed, issuer, "pat").await;
    assert_eq!(
        (client_id.as_str(), jti.as_str()),
        (HARNESS_CLIENT, claims["jti"].as_str().unwrap())
    );
    let trail = setup.gw.export().await;
    assert!(trail.contains(&jti));
    assert!(
        !trail.contains(token.split('.').nth(2).unwrap()),
        "the token's signature is in the trail"
    );

    // Eve signs in for real, but no people rule names her: 403 saying so, and no session.
    let eve = mcp_hosts::authorize(&url, HARNESS_CLIENT, &redirect_uri("harness"), EVE).await;
    assert_eq!(
        forge::claims(&eve.access_token)["email"],
        "eve@elsewhere.test"
    );
    let refused = post(&url, &eve.access_token, None, initialize()).await;
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert!(
        refused.body.to_string().contains("people rule"),
        "{}",
        refused.body
    );
    assert!(refused.session.is_none());
    let (status, page) = setup.gw.admin(Method::GET, "/v1/seal/sessions", None).await;
    assert_eq!(status, 200);
    let subs: Vec<&Value> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["sub"])
        .collect();
    assert_eq!(subs, [&json!("pat")], "{page}");
}
