//! The operator console (`console.enabled`) through the real binary: served only when enabled, with a
//! strict Content-Security-Policy, and working in a real browser (Debian's Chromium driven by
//! playwright-core from tests/console/console.test.mjs; scripts/test.sh installs both). People sign in
//! there too, with the real OpenID provider of tests/oidc (tests/console/sign_in.test.mjs).

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::oidc::{self, Provider};
use common::{code, tool_call, Gateway};
use reqwest::Method;
use serde_json::{json, Value};

const CONSOLE_ON: &str = "console: { enabled: true }\n";

fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

#[tokio::test]
async fn the_console_is_absent_unless_enabled_and_served_with_a_strict_policy() {
    let off_dir = tempfile::tempdir().unwrap();
    let (off, _tool) = Gateway::start(off_dir.path(), "").await;
    for path in ["/console/", "/console/app.js", "/console"] {
        let response = off
            .client
            .get(format!("{}{path}", off.base))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 404, "{path} with the console off");
    }

    let on_dir = tempfile::tempdir().unwrap();
    let (on, _tool) = Gateway::start(on_dir.path(), CONSOLE_ON).await;
    let client = no_redirects();
    let bare = client
        .get(format!("{}/console", on.base))
        .send()
        .await
        .unwrap();
    assert_eq!(bare.status(), 308);
    assert_eq!(bare.headers()["location"], "/console/");

    for (path, content_type) in [
        ("/console/", "text/html; charset=utf-8"),
        ("/console/app.js", "text/javascript; charset=utf-8"),
        ("/console/pages.js", "text/javascript; charset=utf-8"),
        ("/console/console.css", "text/css; charset=utf-8"),
        ("/console/schema.json", "application/json"),
    ] {
        let response = client
            .get(format!("{}{path}", on.base))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{path}");
        let headers = response.headers();
        assert_eq!(headers["content-type"], content_type, "{path}");
        let csp = headers["content-security-policy"].to_str().unwrap();
        for directive in [
            "default-src 'self'",
            "script-src 'self'",
            "style-src 'self'",
            "frame-ancestors 'none'",
        ] {
            assert!(csp.contains(directive), "{path}: {directive} not in {csp}");
        }
        assert!(!csp.contains("unsafe"), "{path}: {csp}");
        assert_eq!(headers["x-content-type-options"], "nosniff");
        assert_eq!(headers["referrer-policy"], "no-referrer");
    }

    // The page itself holds no inline script or style that the policy would have to allow.
    let html = client
        .get(format!("{}/console/", on.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(html.matches("<script").count(), 1, "{html}");
    assert!(html.contains(r#"<script type="module" src="app.js"></script>"#));
    assert!(
        !html.contains("<style") && !html.contains("style="),
        "{html}"
    );

    // The schema the editor validates against is the one the gateway's policy loader is tested against.
    let served: Value = client
        .get(format!("{}/console/schema.json", on.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let on_disk: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/policies/schema.json"))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(served, on_disk);

    let (status, body) = on
        .operator(Method::GET, "/console/secrets.txt", None, None)
        .await;
    assert_eq!((status, code(&body)), (404, 6003), "{body}");
}

/// A session on the `test` context bound to agent-1 (the sub of the harness's agent tokens).
async fn agent_session(gw: &Gateway, id: &str) -> (ed25519_dalek::SigningKey, String) {
    gw.session_with(id, json!({"agent_id": "agent-1"})).await
}

#[tokio::test(flavor = "multi_thread")]
async fn the_console_works_in_a_real_browser() {
    let dir = tempfile::tempdir().unwrap();
    // The binary users run: the release build; a signed checkpoint every 5 events, for the audit page.
    let (_tool, tool_base) = common::start_tool().await;
    let keys = std::sync::Arc::new(common::Keys::new());
    // An MCP server that cannot start, for the overview's upstream table.
    let ghost = "  ghost: { mcp: { command: \"false\" }, timeout_ms: 5000 }\n";
    let config = common::write_config(dir.path(), &keys, &tool_base, ghost, CONSOLE_ON);
    let gw = Gateway::spawn_binary(
        common::release_binary(),
        Vec::new(),
        dir.path(),
        &config,
        keys,
        |command| {
            command.env("SEALGATE_AUDIT__CHECKPOINT_EVERY", "5");
        },
    );

    // A shadow version of `test` that also denies tool.write (SPEC 6.4 r4), set before any call: of the
    // three calls the two versions decide below, one gets a different decision.
    let (status, shadow) = gw
        .admin(
            Method::PUT,
            "/v1/security-contexts/test/shadow",
            Some(json!({"deny_list": ["tool.forbidden", "tool.write"],
                        "capabilities": [{"tool_pattern": "*", "claim": "off"}]})),
        )
        .await;
    assert_eq!(status, 201, "{shadow}");
    // Real state through the API: two sessions, a completed call (a COMMITTED claim), a refusal, and a
    // context kept in the store that the console may edit.
    let (revoked_key, revoked_token) = agent_session(&gw, "console-revoke-me").await;
    let (key, token) = agent_session(&gw, "console-keep").await;
    let (status, done) = gw
        .call(
            &key,
            &token,
            tool_call(1, "tool.write", json!({"path": "/workspace/a.txt"})),
        )
        .await;
    assert_eq!(status, 200, "{done}");
    let (status, refused) = gw
        .call(&key, &token, tool_call(2, "tool.forbidden", json!({})))
        .await;
    assert_eq!((status, code(&refused)), (403, 2001));
    // A tool list starts every MCP upstream: ghost fails to start.
    let list = json!({"jsonrpc": "2.0", "id": 4, "method": "tools/list"});
    let (status, listed) = gw.call(&key, &token, list).await;
    assert_eq!(status, 200, "{listed}");
    // A call the tool never answers in time leaves its claim PENDING (SPEC 7.2), for the claims page.
    let (status, body) = gw
        .call(&key, &token, tool_call(3, "slow.op", json!({"x": 1})))
        .await;
    assert_eq!((status, code(&body)), (504, 5002), "{body}");
    let (_, pending) = gw
        .admin(Method::GET, "/v1/claims?status=PENDING", None)
        .await;
    let pending_claim = pending["items"][0]["request_id"]
        .as_str()
        .unwrap()
        .to_string();
    let (status, created) = gw
        .admin(
            Method::PUT,
            "/v1/security-contexts/console-shop",
            Some(json!({"capabilities": [{"tool_pattern": "shop.*", "claim": "off"}]})),
        )
        .await;
    assert_eq!(status, 201, "{created}");

    // Approvals (SPEC 13): two calls held for a decision, granted and denied in the browser.
    let (pay_key, pay_token, grant_me, deny_me) = {
        let (status, body) = gw
            .admin(
                Method::PUT,
                "/v1/security-contexts/console-pay",
                Some(
                    json!({"capabilities": [{"tool_pattern": "tool.*", "claim": "off",
                    "approval": {"required": true, "expires_secs": 600}}]}),
                ),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        let (pay_key, _) = gw
            .session_with(
                "console-pay",
                json!({"agent_id": "agent-1", "security_context": "console-pay"}),
            )
            .await;
        // The harness's agent token names the `test` context; this session is on console-pay.
        let pay_token = gw
            .keys
            .agent_token_from(&gw.keys.agent_claims("console-pay", "console-pay"));
        let grant_me = tool_call(10, "tool.pay", json!({"amount": 12, "to": "grant-me"}));
        let deny_me = tool_call(11, "tool.pay", json!({"amount": 99, "to": "deny-me"}));
        for payload in [&grant_me, &deny_me] {
            let (status, body) = gw.call(&pay_key, &pay_token, payload.clone()).await;
            assert_eq!((status, code(&body)), (403, 4003), "{body}");
        }
        (pay_key, pay_token, grant_me, deny_me)
    };

    let screenshots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    std::fs::create_dir_all(&screenshots).unwrap();
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/console/console.test.mjs"
    );
    let output = Command::new("node")
        .arg(script)
        .env("CONSOLE_BASE", &gw.base)
        .env("CONSOLE_TOKEN", gw.keys.operator_token("seal.admin"))
        .env(
            "CONSOLE_OTHER_TOKEN",
            gw.keys
                .operator_token("seal.session.read seal.metrics.read"),
        )
        .env("CONSOLE_REVOKE_SESSION", "console-revoke-me")
        .env("CONSOLE_KEEP_SESSION", "console-keep")
        .env("CONSOLE_CONTEXT", "console-shop")
        .env(
            "CONSOLE_CLAIM",
            done["receipt"]["request_id"].as_str().unwrap(),
        )
        .env("CONSOLE_PENDING_CLAIM", &pending_claim)
        .env("CONSOLE_SCREENSHOTS", &screenshots)
        .output()
        .expect("node runs (scripts/test.sh installs tests/console and Chromium)");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "console.test.mjs failed:\n{printed}"
    );
    assert!(printed.contains("console: all checks passed"), "{printed}");

    // What the browser did is what the gateway holds: the revoked session's next call gets 1006, the
    // context carries the edit that was saved and nothing of the refused one.
    let (status, body) = gw
        .call(
            &revoked_key,
            &revoked_token,
            tool_call(3, "tool.read", json!({"path": "/workspace/a.txt"})),
        )
        .await;
    assert_eq!((status, code(&body)), (401, 1006), "{body}");
    let (_, context) = gw
        .admin(Method::GET, "/v1/security-contexts/console-shop", None)
        .await;
    assert_eq!(context["deny_list"], json!(["shop.refund"]), "{context}");
    assert_eq!(context["capabilities"][0]["claim"], "off", "{context}");

    let (status, body) = gw.call(&pay_key, &pay_token, grant_me).await;
    assert_eq!(status, 200, "the granted call runs: {body}");
    let (status, body) = gw.call(&pay_key, &pay_token, deny_me).await;
    assert_eq!((status, code(&body)), (403, 4004), "{body}");
}

/// Two people of team payments at the test provider (each in a group of their own, whose role gives the
/// approval scopes on payments); pat's role also reads payments' sessions, contexts and audit events.
const SIGN_IN_ROLES: &str = "\n  roles:\
    \n    - { group: payments-oncall, team: payments, scopes: [seal.approval.read, seal.approval.decide, \
    seal.session.read, seal.context.read, seal.audit.read] }\
    \n    - { group: payments-leads, team: payments, scopes: [seal.approval.read, seal.approval.decide] }";
const CLIENT_SECRET: &str = "console-client-secret";

/// A context of `team` whose calls wait for `approvers` people, and a session on it; answers the
/// session's key and agent token, and the approval request of `payment`.
async fn held_call(
    gw: &Gateway,
    (team, context, session): (&str, &str, &str),
    approvers: u64,
    payment: &Value,
) -> (ed25519_dalek::SigningKey, String, String) {
    let (status, body) = gw
        .admin(
            Method::PUT,
            &format!("/v1/security-contexts/{context}"),
            Some(
                json!({"team": team, "capabilities": [{"tool_pattern": "tool.*", "claim": "off",
                "approval": {"required": true, "expires_secs": 600, "approvers": approvers}}]}),
            ),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let (key, _) = gw
        .session_with(
            session,
            json!({"agent_id": "agent-1", "security_context": context}),
        )
        .await;
    let token = gw
        .keys
        .agent_token_from(&gw.keys.agent_claims(session, context));
    let (status, body) = gw.call(&key, &token, payment.clone()).await;
    assert_eq!((status, code(&body)), (403, 4003), "{body}");
    let approval = body["error"]["details"]["approval_id"]
        .as_str()
        .unwrap()
        .to_owned();
    (key, token, approval)
}

#[tokio::test(flavor = "multi_thread")]
async fn two_people_signed_in_with_the_provider_approve_a_payment_and_see_only_their_team() {
    let dir = tempfile::tempdir().unwrap();
    // Browsers take a __Host- cookie only when it is Secure: the console's sign-in needs HTTPS. The
    // callback is on the request's own origin, so the port is chosen first for the provider to know it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let base = format!("https://127.0.0.1:{port}");
    let certificates = sealgate::tls::made::for_loopback().unwrap();
    for (file, pem) in [
        ("ca.pem", &certificates.ca),
        ("cert.pem", &certificates.certificate),
        ("key.pem", &certificates.private_key),
        ("client.secret", &format!("{CLIENT_SECRET}\n")),
    ] {
        std::fs::write(dir.path().join(file), pem).unwrap();
    }
    let provider = Provider::start(
        vec![oidc::client(
            "console",
            Some(CLIENT_SECRET),
            &[format!("{base}/console/callback")],
        )],
        vec![
            oidc::user("pat", "pat-pw", "Pat Payments", &["payments-oncall"]),
            oidc::user("quinn", "quinn-pw", "Quinn Lead", &["payments-leads"]),
        ],
        true,
    );
    let (_tool, tool_base) = common::start_tool().await;
    let keys = std::sync::Arc::new(common::Keys::new());
    let agent_keys = format!(
        "[ {{ alg: EdDSA, public_key_pem: {:?} }} ]",
        keys.agent_public
    );
    let operator_auth = format!(
        "[ {{ alg: EdDSA, public_key_pem: {:?} }} ]\
         \n  oidc: {{ issuer: {:?}, client_id: console, client_secret_file: client.secret }}{SIGN_IN_ROLES}",
        keys.operator_public, provider.issuer
    );
    let extra = format!("{CONSOLE_ON}tls: {{ cert_file: cert.pem, key_file: key.pem }}\n");
    let config = common::write_config_with_keys(
        dir.path(),
        &agent_keys,
        &operator_auth,
        &tool_base,
        "",
        &extra,
    );
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replace("\"127.0.0.1:0\"", &format!("\"127.0.0.1:{port}\"")),
    )
    .unwrap();
    let mut gw = Gateway::spawn_binary(
        common::release_binary(),
        Vec::new(),
        dir.path(),
        &config,
        keys,
        |_| {},
    );
    assert_eq!(gw.base, base);
    gw.client = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(certificates.ca.as_bytes()).unwrap()])
        .build()
        .unwrap();

    // A payment of team payments that needs two people, and a call of team ops that nobody here may see.
    let payment = tool_call(1, "tool.pay", json!({"amount": 12, "to": "two-people"}));
    let (pay_key, pay_token, approval) =
        held_call(&gw, ("payments", "console-pay", "pay"), 2, &payment).await;
    let ops_call = tool_call(2, "tool.restart", json!({"service": "ledger"}));
    let (_, _, ops_approval) =
        held_call(&gw, ("ops", "console-ops", "ops-run"), 1, &ops_call).await;

    let screenshots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("sign-in-screenshots");
    std::fs::create_dir_all(&screenshots).unwrap();
    let output = Command::new("node")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/console/sign_in.test.mjs"
        ))
        .env("SIGNIN_BASE", &gw.base)
        .env("SIGNIN_ISSUER", &provider.issuer)
        .env("SIGNIN_APPROVAL", &approval)
        .env("SIGNIN_OTHER_TEAM_APPROVAL", &ops_approval)
        .env("SIGNIN_TOKEN", gw.keys.operator_token("seal.admin"))
        .env("SIGNIN_SCREENSHOTS", &screenshots)
        .env("NODE_EXTRA_CA_CERTS", dir.path().join("ca.pem"))
        .output()
        .expect("node runs (scripts/test.sh installs tests/console and Chromium)");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        output.status.success(),
        "sign_in.test.mjs failed:\n{printed}"
    );
    assert!(printed.contains("sign-in: all checks passed"), "{printed}");

    // What the two people granted is what the gateway holds: the payment runs, once; the same call
    // again is a new request for two people.
    let (status, body) = gw.call(&pay_key, &pay_token, payment).await;
    assert_eq!(status, 200, "the granted call runs: {body}");
    // The same tool and arguments under another JSON-RPC id: the same call, in an envelope of its own.
    let again = tool_call(3, "tool.pay", json!({"amount": 12, "to": "two-people"}));
    let (status, body) = gw.call(&pay_key, &pay_token, again).await;
    assert_eq!((status, code(&body)), (403, 4003), "{body}");
    assert_ne!(body["error"]["details"]["approval_id"], json!(approval));
    // The other team's request was neither seen nor touched.
    let (status, body) = gw
        .admin(Method::GET, &format!("/v1/approvals/{ops_approval}"), None)
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (
            body["status"].as_str(),
            body["grants"].as_array().map(Vec::len)
        ),
        (Some("pending"), Some(0)),
        "{body}"
    );
}

#[test]
fn the_demo_prints_a_console_link_whose_token_reads_and_cannot_change() {
    let tmp = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_sealgate"))
        .args(["demo", "--serve"])
        .env("TMPDIR", tmp.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut link = None;
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(url) = line.strip_prefix("console: ") {
            link = Some(url.trim().to_string());
        }
        if line.starts_with("the gateway keeps serving the console") {
            break;
        }
    }
    let link = link.expect("the demo prints a console: line");
    let (page, token) = link
        .split_once("#token=")
        .expect("the token is in the fragment");
    assert!(
        page.starts_with("http://127.0.0.1:") && page.ends_with("/console/"),
        "{link}"
    );

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let outcome = runtime.block_on(async {
        let client = reqwest::Client::new();
        let base = page.trim_end_matches("/console/");
        let status = |method: Method, path: &str| {
            let request = client
                .request(method, format!("{base}{path}"))
                .bearer_auth(token);
            async move { request.send().await.unwrap().status().as_u16() }
        };
        (
            client.get(page).send().await.unwrap().status().as_u16(),
            status(Method::GET, "/v1/seal/sessions").await,
            status(Method::GET, "/v1/audit").await,
            status(Method::DELETE, "/v1/seal/sessions/exec-demo-1").await,
            status(Method::DELETE, "/v1/security-contexts/demo").await,
        )
    });
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        outcome,
        (200, 200, 200, 403, 403),
        "console page, session list, audit, revoke, context delete"
    );
}

/// SPEC 18 in the browser: an MCP server (the official Python SDK's, tests/mcp-servers/changing_server.py)
/// hides an instruction in tag characters after its tools were pinned; the Tools page shows the definition
/// seen beside the pinned one, and its Accept button pins it.
#[tokio::test(flavor = "multi_thread")]
async fn the_tools_page_shows_a_changed_definition_beside_the_pinned_one_and_accepts_it() {
    let dir = tempfile::tempdir().unwrap();
    let (_tool, tool_base) = common::start_tool().await;
    let keys = std::sync::Arc::new(common::Keys::new());
    let phase = dir.path().join("phase");
    std::fs::write(&phase, "base").unwrap();
    let python = common::pinned_tool("mcp", "python", "MCP_PYTHON");
    let server = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/mcp-servers/changing_server.py"
    );
    let args = json!([server, phase, dir.path().join("calls")]);
    let changing =
        format!("  ch: {{ mcp: {{ command: {python:?}, args: {args} }}, timeout_ms: 20000 }}\n");
    let config = common::write_config(dir.path(), &keys, &tool_base, &changing, CONSOLE_ON);
    let gw = Gateway::spawn_binary(
        common::release_binary(),
        Vec::new(),
        dir.path(),
        &config,
        keys,
        |_| {},
    );
    let status_of = |tools: &Value, name: &str| {
        tools["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|tool| tool["tool"] == name)
            .map(|tool| tool["status"].clone())
    };
    // Listed once as they are (first_use pins them), then changed by the server.
    let (status, tools) = gw.admin(Method::GET, "/v1/tools", None).await;
    assert_eq!(status, 200, "{tools}");
    assert_eq!(
        status_of(&tools, "ch.read"),
        Some(json!("pinned")),
        "{tools}"
    );
    std::fs::write(&phase, "tag_characters").unwrap();
    common::until(
        std::time::Duration::from_secs(30),
        "ch.read is seen changed",
        || async {
            let (_, tools) = gw.admin(Method::GET, "/v1/tools", None).await;
            status_of(&tools, "ch.read") == Some(json!("changed"))
        },
    )
    .await;

    let screenshots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    std::fs::create_dir_all(&screenshots).unwrap();
    let output = Command::new("node")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/console/tools.test.mjs"
        ))
        .env("CONSOLE_BASE", &gw.base)
        .env("CONSOLE_TOKEN", gw.keys.operator_token("seal.admin"))
        .env("CONSOLE_SCREENSHOTS", &screenshots)
        .output()
        .expect("node runs (scripts/test.sh installs tests/console and Chromium)");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "tools.test.mjs failed:\n{printed}");
    assert!(
        printed.contains("console tools: all checks passed"),
        "{printed}"
    );
    let accepted = gw.audit_events("type=ToolDefinitionAccepted").await;
    assert_eq!(accepted.len(), 1, "{accepted:#?}");
    assert_eq!(accepted[0]["tool"], "ch.read");
}
