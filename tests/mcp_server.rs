//! SPEC 17 through the binary, on the test store (both stores in scripts/test.sh): the MCP endpoint as an
//! OAuth resource server, its refusals (each answered with the right status and challenge, each running
//! nothing), people's sessions, and a person's calls through the one pipeline. Tokens are signed with the
//! key of the real provider (tests/oidc, which publishes it at its JWKS URL), or forged beside it; the
//! whole OAuth dance with real hosts is tests/mcp_oauth.rs.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::oidc::{forge, Provider, RsaKey, PROVIDER_KID};
use common::{until, Gateway, Tool};
use reqwest::header::HeaderMap;
use serde_json::{json, Value};

/// `mcp_server.resource`: the endpoint's canonical URI. Requests here come from reqwest, which does not
/// compare it with the address it sends to (hosts do: tests/mcp_oauth.rs).
const RESOURCE: &str = "http://127.0.0.1/mcp";

struct Setup {
    gw: Gateway,
    tool: std::sync::Arc<Tool>,
    provider: Provider,
    key: RsaKey,
    _dir: tempfile::TempDir,
}

/// The provider (signing with a key the test holds), and a gateway whose endpoint trusts it. Pat is in
/// `payments` (context `test`); anyone at example.com gets `other`; nobody else has a rule.
async fn setup(session: &str) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let key = RsaKey::generate(dir.path());
    let provider = Provider::start_with(json!({"signing_key_pem": key.private_pem}));
    let (gw, tool) = Gateway::start(dir.path(), &endpoint_config(&provider, session)).await;
    Setup {
        gw,
        tool,
        provider,
        key,
        _dir: dir,
    }
}

/// The `mcp_server` section that trusts `provider`, with `session` as its `session:` value.
fn endpoint_config(provider: &Provider, session: &str) -> String {
    format!(
        "mcp_server:\n  enabled: true\n  resource: {RESOURCE:?}\n  authorization_servers: [{:?}]\
         \n  keys: [ {{ jwks_url: {:?} }} ]\
         \n  allowed_origins: [\"https://host.example\"]\
         \n  people:\
         \n    - {{ group: payments, context: test }}\
         \n    - {{ claim: email, pattern: \"*@example.com\", context: other }}\
         \n  session: {session}\n\
         limits: {{ max_body_bytes: 16384 }}\n",
        provider.issuer,
        provider.jwks_url()
    )
}

static JTI: AtomicU64 = AtomicU64::new(0);

impl Setup {
    /// The claims of an access token the provider would issue to `sub` for this resource.
    fn claims(&self, sub: &str, groups: &[&str], email: &str) -> Value {
        let now = sealgate::clock::now_secs();
        json!({"iss": self.provider.issuer, "sub": sub, "aud": RESOURCE, "iat": now, "exp": now + 300,
               "scope": "openid mcp:tools", "azp": "host-a", "groups": groups, "email": email,
               "jti": format!("jti-{}", JTI.fetch_add(1, Ordering::SeqCst))})
    }

    fn token(&self, claims: &Value) -> String {
        forge::rs256(&self.key, PROVIDER_KID, claims)
    }

    fn pat(&self) -> String {
        self.token(&self.claims("pat", &["payments"], "pat@corp.example"))
    }

    fn url(&self) -> String {
        format!("{}/mcp", self.gw.base)
    }

    /// One POST to the endpoint: the status, the headers and the JSON body.
    async fn post(
        &self,
        token: Option<&str>,
        session_id: Option<&str>,
        body: &Value,
    ) -> (u16, HeaderMap, Value) {
        let mut request = self.gw.client.post(self.url()).json(body);
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(id) = session_id {
            request = request.header("mcp-session-id", id);
        }
        answer(request).await
    }

    /// `initialize` as `token`'s holder: the `Mcp-Session-Id` it gets.
    async fn initialize(&self, token: &str) -> String {
        let body = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"}}});
        let (status, headers, answer) = self.post(Some(token), None, &body).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["result"]["protocolVersion"], "2025-06-18");
        assert_eq!(answer["result"]["capabilities"], json!({"tools": {}}));
        headers["mcp-session-id"].to_str().unwrap().to_owned()
    }

    /// `tool.echo` at `path` in the session `id`, with `meta` as the call's `_meta`.
    async fn echo(&self, token: &str, id: &str, path: &str, meta: Value) -> Value {
        self.call(token, id, "tool.echo", json!({"path": path}), meta)
            .await
    }

    /// Every session, as an administrator lists them.
    async fn sessions(&self, query: &str) -> Vec<Value> {
        let (status, page) = self
            .gw
            .admin(
                reqwest::Method::GET,
                &format!("/v1/seal/sessions{query}"),
                None,
            )
            .await;
        assert_eq!(status, 200, "{page}");
        page["items"].as_array().unwrap().clone()
    }

    /// A `tools/call` in the session `id`: its JSON-RPC answer.
    async fn call(
        &self,
        token: &str,
        id: &str,
        tool: &str,
        arguments: Value,
        meta: Value,
    ) -> Value {
        let body = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                          "params": {"name": tool, "arguments": arguments, "_meta": meta}});
        let (status, _, answer) = self.post(Some(token), Some(id), &body).await;
        assert_eq!(status, 200, "{answer}");
        answer
    }
}

async fn answer(request: reqwest::RequestBuilder) -> (u16, HeaderMap, Value) {
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    (
        status,
        headers,
        response.json().await.unwrap_or(Value::Null),
    )
}

fn challenge(headers: &HeaderMap) -> String {
    headers
        .get("www-authenticate")
        .map(|value| value.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

fn a_call() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
           "params": {"name": "tool.echo", "arguments": {"path": "/workspace/a"}}})
}

#[tokio::test]
async fn a_host_finds_the_authorization_server_from_the_challenge_and_the_metadata() {
    let s = setup("{ expires_secs: 3600 }").await;
    let metadata_url = "http://127.0.0.1/.well-known/oauth-protected-resource/mcp";
    let (status, headers, body) = s.post(None, None, &a_call()).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(
        challenge(&headers),
        format!("Bearer resource_metadata=\"{metadata_url}\"")
    );
    for path in [
        "/.well-known/oauth-protected-resource",
        "/.well-known/oauth-protected-resource/mcp",
    ] {
        let (status, _, document) = answer(s.gw.client.get(format!("{}{path}", s.gw.base))).await;
        assert_eq!(status, 200);
        assert_eq!(
            document,
            json!({"resource": RESOURCE, "authorization_servers": [s.provider.issuer],
                   "scopes_supported": ["mcp:tools"], "bearer_methods_supported": ["header"]})
        );
    }
    // A token in the query string, even a good one, is refused before it is read.
    let in_query =
        s.gw.client
            .post(format!("{}?access_token={}", s.url(), s.pat()))
            .json(&a_call());
    let (status, headers, _) = answer(in_query).await;
    assert_eq!(status, 400);
    assert!(challenge(&headers).starts_with("Bearer error=\"invalid_request\""));
    // A page of another origin in someone's browser may not call with their token.
    let foreign =
        s.gw.client
            .post(s.url())
            .bearer_auth(s.pat())
            .header("origin", "https://evil.example")
            .json(&a_call());
    assert_eq!(answer(foreign).await.0, 403);
    for origin in ["http://127.0.0.1", "https://host.example"] {
        let known =
            s.gw.client
                .post(s.url())
                .bearer_auth(s.pat())
                .header("origin", origin)
                .json(&json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {}}));
        assert_eq!(answer(known).await.0, 200, "{origin}");
    }
    let (status, headers, _) = answer(s.gw.client.get(s.url()).bearer_auth(s.pat())).await;
    assert_eq!((status, headers["allow"].to_str().unwrap()), (405, "POST"));
    assert_eq!(s.tool.count(), 0);
}

#[tokio::test]
async fn tokens_that_fail_a_check_get_the_right_challenge_and_run_nothing() {
    let s = setup("{ expires_secs: 3600 }").await;
    let good = s.claims("pat", &["payments"], "pat@corp.example");
    let with = |change: &dyn Fn(&mut Value)| {
        let mut claims = good.clone();
        change(&mut claims);
        claims
    };
    let invalid = [
        (
            "another resource (RFC 8707's confused deputy)",
            s.token(&with(&|c| c["aud"] = json!("https://other.example/mcp"))),
        ),
        (
            "another issuer",
            s.token(&with(&|c| c["iss"] = json!("https://evil.example"))),
        ),
        (
            "expired",
            s.token(&with(&|c| {
                c["exp"] = json!(sealgate::clock::now_secs() - 600)
            })),
        ),
        ("alg none", forge::unsigned(PROVIDER_KID, &good)),
        (
            "HS256 keyed with the provider's public key",
            forge::hs256_with_public_key(&s.key.public_pem, PROVIDER_KID, &good),
        ),
        (
            "a kid never published",
            forge::rs256(&s.key, "never-published", &good),
        ),
    ];
    for (why, token) in invalid {
        let (status, headers, body) = s.post(Some(&token), None, &a_call()).await;
        assert_eq!(status, 401, "{why}: {body}");
        let challenge = challenge(&headers);
        assert!(
            challenge.starts_with("Bearer error=\"invalid_token\", error_description=\""),
            "{why}: {challenge}"
        );
        assert!(challenge.ends_with(
            "resource_metadata=\"http://127.0.0.1/.well-known/oauth-protected-resource/mcp\""
        ));
    }
    let no_scope = s.token(&with(&|c| c["scope"] = json!("openid")));
    let (status, headers, _) = s.post(Some(&no_scope), None, &a_call()).await;
    assert_eq!(status, 403);
    assert!(
        challenge(&headers).starts_with("Bearer error=\"insufficient_scope\", scope=\"mcp:tools\"")
    );
    // A person whom no `people` rule names is told so.
    let eve = s.token(&s.claims("eve", &["staff"], "eve@elsewhere.org"));
    let (status, _, body) = s.post(Some(&eve), None, &a_call()).await;
    assert_eq!(status, 403);
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("no mcp_server.people rule matches"));
    assert_eq!(s.tool.count(), 0, "nothing ran");
    let sessions = s.sessions("").await;
    assert_eq!(sessions, Vec::<Value>::new(), "nobody got a session");
}

#[tokio::test]
async fn a_persons_calls_run_through_the_pipeline_under_their_own_session() {
    let s = setup("{ expires_secs: 3600, budget: 10 }").await;
    let token = s.pat();
    let id = s.initialize(&token).await;
    let (status, _, listed) = s
        .post(
            Some(&token),
            Some(&id),
            &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
        )
        .await;
    assert_eq!(status, 200, "{listed}");
    assert!(listed["result"]["tools"].is_array(), "{listed}");
    // The list asked every upstream (all routes of the counting tool): count from here.
    let listed_calls = s.tool.count();
    // Allowed: it ran once, with the gateway's credential, never the host's token.
    let ran = s
        .echo(
            &token,
            &id,
            "/workspace/a",
            json!({"idempotency_key": "k-1"}),
        )
        .await;
    let result = &ran["result"];
    assert_ne!(result["isError"], true, "{ran}");
    assert_eq!(result["_meta"]["sealgate/receipt"]["claim"], "PROCEED");
    assert_eq!(s.tool.count(), listed_calls + 1);
    let credential = s.tool.last_auth.lock().unwrap().clone().unwrap_or_default();
    assert!(
        !credential.contains(&token),
        "the host's token reached the tool"
    );
    // The same key again: answered from the claim, not run again.
    let again = s
        .echo(
            &token,
            &id,
            "/workspace/a",
            json!({"idempotency_key": "k-1"}),
        )
        .await;
    assert_eq!(
        again["result"]["_meta"]["sealgate/receipt"]["claim"],
        "SKIP"
    );
    assert_eq!(s.tool.count(), listed_calls + 1);
    // Refused by the policy: a tool result the model can read, with the error object.
    let refused = s.echo(&token, &id, "/etc/passwd", json!({})).await;
    assert_eq!(refused["result"]["isError"], true);
    assert_eq!(refused["result"]["_meta"]["sealgate/error"]["code"], 2002);
    // A call that needs a person's approval: 4003 at once.
    let held = s.call(&token, &id, "pay.send", json!({}), json!({})).await;
    assert_eq!(held["result"]["_meta"]["sealgate/error"]["code"], 4003);
    assert_eq!(s.tool.count(), listed_calls + 1);

    let sessions = s.sessions("").await;
    let items = sessions;
    assert_eq!(items.len(), 1, "one session for the person: {items:?}");
    assert_eq!(items[0]["kind"], "mcp");
    assert_eq!(items[0]["iss"], json!(s.provider.issuer));
    assert_eq!(items[0]["sub"], "pat");
    // The person registered it: separation of duties keeps them from approving their own calls.
    assert_eq!(items[0]["registered_by"]["sub"], "pat");
    assert_eq!(items[0]["registered_by"]["via"], "jwks");
    assert_eq!(items[0]["security_context"], "test");
    assert_eq!(items[0]["budget"]["max_calls"], 10);
    let session_id = items[0]["session_id"].as_str().unwrap();
    let events =
        s.gw.audit_events(&format!("session_id={session_id}&type=ToolCallCompleted"))
            .await;
    assert!(!events.is_empty());
    for event in events {
        assert_eq!(event["auth"], "oauth", "{event}");
        assert_eq!(event["iss"], json!(s.provider.issuer));
        assert_eq!(event["sub"], "pat");
        assert_eq!(event["client_id"], "host-a");
        assert!(event["jti"].as_str().unwrap().starts_with("jti-"));
        let text = event.to_string();
        assert!(!text.contains(&token), "the token is never recorded");
    }
    // A second connection of the same person shares the session.
    let other_connection = s.initialize(&s.pat()).await;
    s.echo(&s.pat(), &other_connection, "/workspace/b", json!({}))
        .await;
    let sessions = s.sessions("").await;
    assert_eq!(sessions.len(), 1);
}

#[tokio::test]
async fn another_persons_session_id_and_bad_bodies_are_refused_before_anything_runs() {
    let s = setup("{ expires_secs: 3600 }").await;
    let pat = s.pat();
    let pats_id = s.initialize(&pat).await;
    let ann = s.token(&s.claims("ann", &["payments"], "ann@corp.example"));
    let (status, _, _) = s.post(Some(&ann), Some(&pats_id), &a_call()).await;
    assert_eq!(status, 404, "another person's Mcp-Session-Id");
    let (status, _, _) = s.post(Some(&pat), None, &a_call()).await;
    assert_eq!(status, 400, "no Mcp-Session-Id after initialize");
    let (status, _, body) = s
        .post(Some(&pat), Some(&pats_id), &json!([a_call(), a_call()]))
        .await;
    assert_eq!(status, 400);
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("batches"));
    let raw = |bytes: Vec<u8>| {
        s.gw.client
            .post(s.url())
            .bearer_auth(&pat)
            .header("mcp-session-id", &pats_id)
            .header("content-type", "application/json")
            .body(bytes)
    };
    let (status, _, body) = answer(raw(b"{\"jsonrpc\": \"2.0\", \"id\": 1, ".to_vec())).await;
    assert_eq!(
        (status, body["error"]["code"].as_i64()),
        (400, Some(-32700))
    );
    let mut big = serde_json::to_vec(&a_call()).unwrap();
    big.truncate(big.len() - 1);
    big.extend(format!(",\"pad\":\"{}\"}}", "x".repeat(20_000)).into_bytes());
    assert_eq!(answer(raw(big)).await.0, 413);
    let (status, _, _) = answer(raw(
        b"{\"jsonrpc\": \"1.0\", \"id\": 1, \"method\": \"tools/call\"}".to_vec(),
    ))
    .await;
    assert_eq!(status, 400, "not JSON-RPC 2.0");
    assert_eq!(s.tool.count(), 0, "nothing ran");
}

#[tokio::test]
async fn a_revoked_person_is_refused_until_their_session_would_have_ended() {
    let s = setup("{ expires_secs: 2 }").await;
    let token = s.pat();
    let id = s.initialize(&token).await;
    s.echo(&token, &id, "/workspace/a", json!({})).await;
    let sessions = s.sessions("").await;
    let first = sessions[0]["session_id"].as_str().unwrap().to_owned();
    let (status, _) =
        s.gw.admin(
            reqwest::Method::DELETE,
            &format!("/v1/seal/sessions/{first}"),
            None,
        )
        .await;
    assert_eq!(status, 200);
    let refused = s.echo(&token, &id, "/workspace/a", json!({})).await;
    assert_eq!(refused["result"]["_meta"]["sealgate/error"]["code"], 1006);
    assert_eq!(s.tool.count(), 1);
    // After `expires_secs` from the revocation the next call starts a new session.
    until(
        Duration::from_secs(10),
        "a new session after the revocation",
        || async {
            let answer = s.echo(&s.pat(), &id, "/workspace/a", json!({})).await;
            answer["result"]["isError"] != true
        },
    )
    .await;
    let sessions = s.sessions("?status=active").await;
    let current = sessions[0]["session_id"].as_str().unwrap();
    assert_ne!(current, first);
    assert_eq!(s.tool.count(), 2);
}

#[tokio::test]
async fn a_mistake_in_mcp_server_stops_serve_and_serve_check_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let keys = common::Keys::new();
    let mistakes = [
        (
            "resource: \"http://127.0.0.1/other\"",
            "mcp_server.resource: \"http://127.0.0.1/other\" must end in mcp_server.path",
        ),
        (
            "resource: \"http://gateway.example/mcp\"",
            "mcp_server.resource: \"http://gateway.example/mcp\": http:// is accepted only for a loopback host",
        ),
        (
            "resource: \"http://127.0.0.1/mcp\", people: [ { claim: email, context: test } ]",
            "mcp_server.people[0]: give either `group`, or `claim` with `pattern`",
        ),
    ];
    for (keys_yaml, expected) in mistakes {
        let extra = format!(
            "mcp_server: {{ enabled: true, {keys_yaml}, authorization_servers: [\"http://127.0.0.1:9\"], \
             keys: [ {{ jwks_url: \"http://127.0.0.1:9/jwks\" }} ] }}\n"
        );
        let config = common::write_config(dir.path(), &keys, "http://127.0.0.1:9", "", &extra);
        common::assert_refused_at_start_up(&config, expected, "tool-secret");
    }
}

#[tokio::test]
async fn the_log_says_why_a_request_was_refused_and_never_holds_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let key = RsaKey::generate(dir.path());
    let provider = Provider::start_with(json!({"signing_key_pem": key.private_pem}));
    let config = endpoint_config(&provider, "{ expires_secs: 3600 }");
    // The test gateways log at `warn`; refusals are logged at `info`, the default.
    let (gw, log) = Gateway::start_capturing(
        dir.path(),
        |_| String::new(),
        &config,
        |command| {
            command.env_remove("SEALGATE_LOG__LEVEL");
        },
    )
    .await;
    let now = sealgate::clock::now_secs();
    let claims = json!({"iss": provider.issuer, "sub": "pat", "aud": "https://other.example/mcp",
                        "iat": now, "exp": now + 300, "scope": "mcp:tools"});
    let token = forge::rs256(&key, PROVIDER_KID, &claims);
    let refused = gw
        .client
        .post(format!("{}/mcp", gw.base))
        .bearer_auth(&token)
        .json(&a_call());
    assert_eq!(answer(refused).await.0, 401);
    let line = log.wait_for("the refusal's log line", |line| {
        line.contains("MCP request refused")
    });
    assert!(line.contains("401") && line.contains("audience"), "{line}");
    let signature = token.rsplit('.').next().unwrap();
    assert!(log.lines().iter().all(|line| !line.contains(signature)));
}
