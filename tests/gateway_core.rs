//! Black-box tests of the core path (SPEC sections 2–5, 8, 10) against the real binary over HTTP.

mod common;

use common::{code, tool_call, Gateway};
use reqwest::Method;
use serde_json::json;

#[tokio::test]
async fn happy_path_forwards_once_with_a_receipt_and_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, tool) = Gateway::start(dir.path(), "").await;
    let (key, token) = gw.session("exec-happy").await;
    let (status, body) = gw
        .call(
            &key,
            &token,
            tool_call(7, "tool.write", json!({"path": "/workspace/a.txt"})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["protocol"], "seal/v1");
    assert_eq!(body["status"], "success");
    assert_eq!(
        body["payload"]["id"], 7,
        "the caller's JSON-RPC id comes back"
    );
    assert_eq!(body["payload"]["result"]["content"][0]["text"], "ran write");
    let receipt = &body["receipt"];
    assert_eq!(receipt["claim"], "PROCEED");
    assert_eq!(receipt["context"], "test");
    assert_eq!(receipt["request_id"].as_str().unwrap().len(), 64);
    assert_eq!(receipt["context_version"].as_str().unwrap().len(), 64);
    assert!(receipt["claimed_at"].as_str().unwrap().ends_with('Z'));
    assert!(receipt["event_id"].is_string());
    assert_eq!(tool.count(), 1);
    // The tool saw its own name and the gateway's credential, never the agent's token.
    let seen = tool.last_request.lock().unwrap().clone().unwrap();
    assert_eq!(seen["params"]["name"], "write");
    assert_eq!(
        seen["id"], 7,
        "SPEC 8: the request goes as is, with the caller's id"
    );
    assert_eq!(
        tool.last_auth.lock().unwrap().as_deref(),
        Some("Bearer tool-secret")
    );
    assert!(!seen.to_string().contains(&token));
}

#[tokio::test]
async fn claim_off_and_tool_errors() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, tool) = Gateway::start(dir.path(), "").await;
    let (key, token) = gw.session("exec-off").await;
    let (status, body) = gw
        .call(&key, &token, tool_call(1, "tool.off", json!({})))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["receipt"]["claim"], "NONE");
    assert!(body["receipt"].get("request_id").is_none());
    // A JSON-RPC error from the tool is an answer, returned as such.
    let (status, body) = gw
        .call(&key, &token, tool_call(2, "tool.fail", json!({})))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["payload"]["error"]["code"], -32000);
    assert_eq!(tool.count(), 2);
}

#[tokio::test]
async fn rfc3339_timestamps_and_non_ascii_payloads_verify() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, tool) = Gateway::start(dir.path(), "").await;
    let (key, token) = gw.session("exec-formats").await;
    let payload = tool_call(
        3,
        "tool.note",
        json!({"ﬁle": "café", "😀": [1.5, 1e21, -0.0, 0.1], "日本": {"z": 1, "a": 2.50}}),
    );
    let now = sealgate::clock::now_secs();
    let mut envelope = sealgate::envelope::sign_envelope(&key, payload, &token, now);
    envelope["timestamp"] = json!(format!(
        "{}.583Z",
        sealgate::clock::rfc3339_secs(now).trim_end_matches('Z')
    ));
    let (status, body) = gw.post(&envelope).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["payload"]["result"]["echo"]["ﬁle"], "café");
    assert_eq!(tool.count(), 1);
}

#[tokio::test]
async fn replayed_envelope_never_reaches_the_tool_even_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (mut gw, tool) = Gateway::start(dir.path(), "").await;
    let (key, token) = gw.session("exec-replay").await;
    let envelope = sealgate::envelope::sign_envelope(
        &key,
        tool_call(1, "tool.off", json!({})),
        &token,
        sealgate::clock::now_secs(),
    );
    assert_eq!(gw.post(&envelope).await.0, 200);
    let (status, body) = gw.post(&envelope).await;
    assert_eq!((status, code(&body)), (401, 1008));
    gw.restart();
    let (status, body) = gw.post(&envelope).await;
    assert_eq!(
        (status, code(&body)),
        (401, 1008),
        "replay records survive a restart"
    );
    assert_eq!(tool.count(), 1);
}

/// The replay record is written with the call's admission, or by the refusal that ends the call before
/// it: either way an envelope sent twice gets 1008 the second time, since check 8 comes before the
/// policy, the rate limit and the budget. An envelope outside the window keeps its 1007.
#[tokio::test]
async fn refused_envelopes_are_replay_protected_too() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, tool) = Gateway::start(dir.path(), "").await;
    let (key, token) = gw.session("exec-refused-replay").await;
    let now = sealgate::clock::now_secs();
    let sign = |id: u64, name: &str, at: i64| {
        sealgate::envelope::sign_envelope(&key, tool_call(id, name, json!({})), &token, at)
    };
    let denied = sign(1, "tool.forbidden", now);
    assert_eq!(code(&gw.post(&denied).await.1), 2001);
    assert_eq!(code(&gw.post(&denied).await.1), 1008);
    // `limited.*` admits 2 calls a minute: the third is refused by the rate limit, and remembered.
    for id in [2, 3] {
        assert_eq!(gw.post(&sign(id, "limited.any", now)).await.0, 200);
    }
    let limited = sign(4, "limited.any", now);
    assert_eq!(code(&gw.post(&limited).await.1), 2005);
    assert_eq!(code(&gw.post(&limited).await.1), 1008);
    let stale = sign(5, "tool.off", now - 31);
    for _ in 0..2 {
        assert_eq!(code(&gw.post(&stale).await.1), 1007);
    }
    assert_eq!(tool.count(), 2);
}

#[tokio::test]
async fn every_envelope_fault_gets_its_own_code() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, tool) = Gateway::start(dir.path(), "").await;
    let (key, token) = gw.session("exec-faults").await;
    let now = sealgate::clock::now_secs();
    let good = || {
        sealgate::envelope::sign_envelope(&key, tool_call(1, "tool.off", json!({})), &token, now)
    };

    // 1001: a signature that is not 64 bytes of base64.
    let mut env = good();
    env["signature"] = json!("AAAA");
    assert_eq!(code(&gw.post(&env).await.1), 1001);
    // 1002: signed by another key; and a payload changed after signing.
    let other = sealgate::envelope::generate_signing_key().unwrap();
    let env =
        sealgate::envelope::sign_envelope(&other, tool_call(2, "tool.off", json!({})), &token, now);
    assert_eq!(code(&gw.post(&env).await.1), 1002);
    let mut env = good();
    env["payload"]["id"] = json!(99);
    assert_eq!(code(&gw.post(&env).await.1), 1002);
    // 1007: outside the 30-second window, either way.
    for skew in [-31, 31] {
        let env = sealgate::envelope::sign_envelope(
            &key,
            tool_call(3, "tool.off", json!({})),
            &token,
            now + skew,
        );
        let (status, body) = gw.post(&env).await;
        assert_eq!((status, code(&body)), (401, 1007));
    }
    // 1003: an expired token; 1004: a token signed by a stranger, one with the wrong audience, alg none.
    let mut claims = gw.keys.agent_claims("exec-faults", "test");
    claims["exp"] = json!(now - 1);
    let expired = gw.keys.agent_token_from(&claims);
    let env =
        sealgate::envelope::sign_envelope(&key, tool_call(4, "tool.off", json!({})), &expired, now);
    assert_eq!(code(&gw.post(&env).await.1), 1003);
    // Times with a fraction (RFC 7519 allows them, `time.time()` writes them) are read, not refused:
    // this call passes the token checks and meets the deny list.
    let mut claims = gw.keys.agent_claims("exec-faults", "test");
    claims["iat"] = json!(now as f64 + 0.25);
    claims["exp"] = json!(now as f64 + 600.5);
    let fractional = gw.keys.agent_token_from(&claims);
    let env = sealgate::envelope::sign_envelope(
        &key,
        tool_call(40, "tool.forbidden", json!({})),
        &fractional,
        now,
    );
    assert_eq!(code(&gw.post(&env).await.1), 2001);
    let (stranger, _) = sealgate::token::ed25519_keypair_pem().unwrap();
    let forged = sealgate::token::sign_eddsa_for_tests_and_cli(
        &stranger,
        &gw.keys.agent_claims("exec-faults", "test"),
        None,
    )
    .unwrap();
    let env =
        sealgate::envelope::sign_envelope(&key, tool_call(5, "tool.off", json!({})), &forged, now);
    assert_eq!(code(&gw.post(&env).await.1), 1004);
    let mut claims = gw.keys.agent_claims("exec-faults", "test");
    claims["aud"] = json!("someone-else");
    let env = sealgate::envelope::sign_envelope(
        &key,
        tool_call(6, "tool.off", json!({})),
        &gw.keys.agent_token_from(&claims),
        now,
    );
    assert_eq!(code(&gw.post(&env).await.1), 1004);
    let none = format!(
        "{}.{}.",
        b64(br#"{"alg":"none"}"#),
        b64(gw
            .keys
            .agent_claims("exec-faults", "test")
            .to_string()
            .as_bytes())
    );
    let env =
        sealgate::envelope::sign_envelope(&key, tool_call(7, "tool.off", json!({})), &none, now);
    assert_eq!(code(&gw.post(&env).await.1), 1004);
    // 1005: no such session; 3001: the token names another context.
    let env = sealgate::envelope::sign_envelope(
        &key,
        tool_call(8, "tool.off", json!({})),
        &gw.keys.agent_token("exec-unknown"),
        now,
    );
    assert_eq!(code(&gw.post(&env).await.1), 1005);
    let other_scope = gw
        .keys
        .agent_token_from(&gw.keys.agent_claims("exec-faults", "other"));
    let env = sealgate::envelope::sign_envelope(
        &key,
        tool_call(9, "tool.off", json!({})),
        &other_scope,
        now,
    );
    let (status, body) = gw.post(&env).await;
    assert_eq!((status, code(&body)), (401, 3001));
    // 1000 at check 9: a payload that is not a tools/call with a valid name.
    let env =
        sealgate::envelope::sign_envelope(&key, tool_call(10, "tool..bad", json!({})), &token, now);
    assert_eq!(code(&gw.post(&env).await.1), 1000);
    let env = sealgate::envelope::sign_envelope(
        &key,
        json!({"jsonrpc": "2.0", "id": 11, "method": "resources/read"}),
        &token,
        now,
    );
    assert_eq!(code(&gw.post(&env).await.1), 1000);
    let env = sealgate::envelope::sign_envelope(
        &key,
        tool_call(12, &"a".repeat(129), json!({})),
        &token,
        now,
    );
    assert_eq!(code(&gw.post(&env).await.1), 1000);
    assert_eq!(tool.count(), 0, "no refused envelope reached the tool");
}

#[tokio::test]
async fn session_binding_checks_agent_and_workload() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, _tool) = Gateway::start(dir.path(), "").await;
    let (key, _) = gw
        .session_with(
            "exec-bound",
            json!({"agent_id": "agent-1", "workload_id": "c-1"}),
        )
        .await;
    let now = sealgate::clock::now_secs();
    let mut claims = gw.keys.agent_claims("exec-bound", "test");
    claims["wid"] = json!("c-1");
    let token = gw.keys.agent_token_from(&claims);
    let mut env =
        sealgate::envelope::sign_envelope(&key, tool_call(1, "tool.off", json!({})), &token, now);
    env["container_id"] = json!("c-1");
    assert_eq!(gw.post(&env).await.0, 200);
    let mut env =
        sealgate::envelope::sign_envelope(&key, tool_call(2, "tool.off", json!({})), &token, now);
    env["container_id"] = json!("c-2");
    assert_eq!(code(&gw.post(&env).await.1), 1004);
    claims["sub"] = json!("agent-2");
    let env = sealgate::envelope::sign_envelope(
        &key,
        tool_call(3, "tool.off", json!({})),
        &gw.keys.agent_token_from(&claims),
        now,
    );
    assert_eq!(code(&gw.post(&env).await.1), 1004);
}

#[tokio::test]
async fn policy_and_upstream_codes() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, tool) = Gateway::start(dir.path(), "").await;
    let (key, token) = gw.session_with("exec-policy", json!({"allowed_tool_patterns": ["tool.*", "secrets.*", "nothing.*", "slow.*", "bad.*", "down.*", "noroute.*", "big.*"]})).await;
    let cases = [
        ("other.tool", 2000, 403),
        ("secrets.read", 2001, 403),
        ("tool.forbidden", 2001, 403),
        ("nothing.here", 2006, 403),
        ("noroute.x", 5004, 502),
        ("down.x", 5001, 502),
        ("bad.x", 5003, 502),
        ("slow.x", 5002, 504),
        ("big.x", 2007, 502),
    ];
    for (i, (tool_name, expected, http)) in cases.iter().enumerate() {
        let (status, body) = gw
            .call(&key, &token, tool_call(i as u64, tool_name, json!({})))
            .await;
        assert_eq!(
            (code(&body), status),
            (*expected as u64, *http),
            "{tool_name}: {body}"
        );
        let name = sealgate::error::Code::from_number(*expected)
            .unwrap()
            .name();
        assert_eq!(body["error"]["name"], name);
    }
    let (_, body) = gw
        .call(
            &key,
            &token,
            tool_call(20, "tool.read", json!({"path": "/etc/passwd"})),
        )
        .await;
    assert_eq!(code(&body), 2002);
    // bad, slow and big reached the tool; nothing refused by policy did.
    assert_eq!(tool.count(), 3);
}

#[tokio::test]
async fn junk_bodies_get_1000_and_never_a_5xx() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, _tool) = Gateway::start(dir.path(), "limits: { max_body_bytes: 4096 }").await;
    let deep = format!("{}{}", "[".repeat(70), "]".repeat(70));
    let bodies: Vec<Vec<u8>> = vec![
        b"".to_vec(),
        b"not json".to_vec(),
        b"\xff\xfe".to_vec(),
        b"[]".to_vec(),
        b"null".to_vec(),
        br#"{"protocol":"seal/v1","protocol":"seal/v1"}"#.to_vec(),
        br#"{"protocol":"seal/v2","security_token":"a","signature":"b","payload":{},"timestamp":1}"#.to_vec(),
        br#"{"protocol":"seal/v1","security_token":"a","signature":"b","payload":{},"timestamp":9007199254740992}"#.to_vec(),
        br#"{"protocol":"seal/v1","security_token":"a","signature":"b","payload":{"x":1e400},"timestamp":1}"#.to_vec(),
        br#"{"protocol":"seal/v1","security_token":"a","signature":"b","payload":{"x":"\ud800"},"timestamp":1}"#.to_vec(),
        br#"{"protocol":"seal/v1","security_token":"a","signature":"b","payload":[],"timestamp":1}"#.to_vec(),
        br#"{"protocol":"seal/v1","security_token":"a","signature":"b","payload":{},"timestamp":1.5}"#.to_vec(),
        format!(r#"{{"protocol":"seal/v1","security_token":"a","signature":"b","payload":{{"d":{deep}}},"timestamp":1}}"#).into_bytes(),
    ];
    for body in bodies {
        let (status, answer) = gw.post_raw(body.clone()).await;
        assert_eq!(
            (status, code(&answer)),
            (400, 1000),
            "{:?}",
            String::from_utf8_lossy(&body)
        );
    }
    let (status, answer) = gw.post_raw(vec![b' '; 5000]).await;
    assert_eq!((status, code(&answer)), (413, 1000));
    // A well-formed envelope with a garbage token is a 1004, not a crash.
    let env = json!({"protocol": "seal/v1", "security_token": "x.y.z", "signature": "AA", "payload": {}, "timestamp": 1});
    assert_eq!(code(&gw.post(&env).await.1), 1004);
    assert_eq!(
        gw.client
            .get(format!("{}/healthz", gw.base))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

#[tokio::test]
async fn sessions_api_with_its_auth() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, _tool) = Gateway::start(dir.path(), "").await;
    let key = sealgate::envelope::generate_signing_key().unwrap();
    let public = sealgate::envelope::public_key_b64(&key.verifying_key());
    let expires = sealgate::clock::now_secs() + 600;
    let body = json!({"session_id": "exec-api", "public_key": public, "security_context": "test",
                      "expires_at": expires, "budget": {"max_calls": 5}});

    // 401 without a token, with a bad one, with an agent token; 403 without the scope.
    let (status, answer) = gw.register(None, body.clone()).await;
    assert_eq!((status, code(&answer)), (401, 6001));
    let (status, _) = gw.register(Some("nonsense"), body.clone()).await;
    assert_eq!(status, 401);
    let agent = gw.keys.agent_token("exec-api");
    let (status, _) = gw.register(Some(&agent), body.clone()).await;
    assert_eq!(status, 401);
    let reader = gw.keys.operator_token("seal.session.read");
    let (status, answer) = gw.register(Some(&reader), body.clone()).await;
    assert_eq!((status, code(&answer)), (403, 6002));

    let creator = gw
        .keys
        .operator_token("seal.session.create seal.session.read");
    let (status, created) = gw.register(Some(&creator), body.clone()).await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["status"], "active");
    assert_eq!(created["security_context"], "test");
    // The same registration again, with the key in hex and an unknown field: 200, same body.
    let mut again = body.clone();
    again["public_key"] = json!(hex::encode(key.verifying_key().to_bytes()));
    again["note"] = json!("ignored");
    let (status, repeated) = gw.register(Some(&creator), again).await;
    assert_eq!((status, &repeated), (200, &created));
    // Another key or context for the same id: 409.
    let mut hijack = body.clone();
    hijack["public_key"] = json!(sealgate::envelope::public_key_b64(
        &sealgate::envelope::generate_signing_key()
            .unwrap()
            .verifying_key()
    ));
    let (status, answer) = gw.register(Some(&creator), hijack).await;
    assert_eq!((status, code(&answer)), (409, 6004));
    let mut other = body.clone();
    other["security_context"] = json!("other");
    assert_eq!(gw.register(Some(&creator), other).await.0, 409);
    // A context that does not exist: still the taken id's 409, not the unknown context's 422.
    let mut unknown = body.clone();
    unknown["security_context"] = json!("nope");
    let (status, answer) = gw.register(Some(&creator), unknown).await;
    assert_eq!((status, code(&answer)), (409, 6004), "{answer}");
    // Validation: 422 for an unknown context, a bad key, a past or too distant expiry; 400 for non-JSON.
    for (field, value) in [
        ("security_context", json!("nope")),
        ("public_key", json!("abc")),
        ("expires_at", json!(1)),
        ("expires_at", json!(expires + 200_000)),
    ] {
        let mut bad = body.clone();
        bad["session_id"] = json!("exec-invalid");
        bad[field] = value;
        let (status, answer) = gw.register(Some(&creator), bad).await;
        assert_eq!((status, code(&answer)), (422, 6005), "{field}: {answer}");
    }
    // SPEC 6.2 r4: `*` anywhere is a pattern, any other glob syntax is a 422 that names it.
    for pattern in ["fs.rea?", "fs.**", "fs.[ab]"] {
        let mut bad = body.clone();
        bad["session_id"] = json!("exec-invalid");
        bad["allowed_tool_patterns"] = json!(["fs.read*", pattern]);
        let (status, answer) = gw.register(Some(&creator), bad).await;
        assert_eq!((status, code(&answer)), (422, 6005), "{pattern}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("allowed_tool_patterns[1]") && message.contains(pattern),
            "{answer}"
        );
    }
    let raw = gw
        .client
        .post(format!("{}/v1/seal/sessions", gw.base))
        .bearer_auth(&creator)
        .body("{oops")
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 400);

    // GET shows status and counts, never key material.
    let (status, read) = gw
        .operator(
            Method::GET,
            "/v1/seal/sessions/exec-api",
            Some(&creator),
            None,
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(read["status"], "active");
    assert_eq!(read["calls"]["allowed"], 0);
    assert!(!read.to_string().contains(&public));
    assert_eq!(
        gw.operator(Method::GET, "/v1/seal/sessions/none", Some(&creator), None)
            .await
            .0,
        404
    );

    // DELETE needs its scope, revokes, erases the key; the id is never reused.
    assert_eq!(
        gw.operator(
            Method::DELETE,
            "/v1/seal/sessions/exec-api",
            Some(&creator),
            None
        )
        .await
        .0,
        403
    );
    let revoker = gw.keys.operator_token("seal.session.revoke");
    let (status, revoked) = gw
        .operator(
            Method::DELETE,
            "/v1/seal/sessions/exec-api",
            Some(&revoker),
            None,
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(revoked["status"], "revoked");
    assert!(revoked["revoked_at"].is_string());
    assert_eq!(
        gw.operator(
            Method::DELETE,
            "/v1/seal/sessions/none",
            Some(&revoker),
            None
        )
        .await
        .0,
        404
    );
    let (_, read) = gw
        .operator(
            Method::GET,
            "/v1/seal/sessions/exec-api",
            Some(&creator),
            None,
        )
        .await;
    assert_eq!(read["status"], "revoked");
    assert_eq!(gw.register(Some(&creator), body).await.0, 409);
}

#[tokio::test]
async fn revoked_session_refuses_envelopes_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, tool) = Gateway::start(dir.path(), "").await;
    let (key, token) = gw.session("exec-revoke").await;
    assert_eq!(
        gw.call(&key, &token, tool_call(1, "tool.off", json!({})))
            .await
            .0,
        200
    );
    assert_eq!(
        gw.admin(Method::DELETE, "/v1/seal/sessions/exec-revoke", None)
            .await
            .0,
        200
    );
    let (status, body) = gw
        .call(&key, &token, tool_call(2, "tool.off", json!({})))
        .await;
    assert_eq!(
        (status, code(&body)),
        (401, 1006),
        "the cached token must not outlive revocation"
    );
    assert_eq!(tool.count(), 1);
}

#[tokio::test]
async fn health_readiness_metrics_and_unknown_routes() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, _tool) = Gateway::start(dir.path(), "").await;
    for path in ["/healthz", "/readyz"] {
        assert_eq!(
            gw.client
                .get(format!("{}{path}", gw.base))
                .send()
                .await
                .unwrap()
                .status(),
            200
        );
    }
    let (key, token) = gw.session("exec-metrics").await;
    gw.call(&key, &token, tool_call(1, "tool.off", json!({})))
        .await;
    let metrics = gw.metrics().await;
    assert!(metrics.contains("sealgate_"), "{metrics}");
    let (status, body) = gw.operator(Method::GET, "/v1/nothing", None, None).await;
    assert_eq!((status, code(&body)), (404, 6003));
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_keygen_sign_and_invoke_against_the_real_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, tool) = Gateway::start(dir.path(), "").await;
    let cli = |args: Vec<String>| {
        tokio::task::spawn_blocking(move || {
            common::run_cli(&args.iter().map(String::as_str).collect::<Vec<_>>())
        })
    };
    let (status, out) = cli(vec!["keygen".into()]).await.unwrap();
    assert_eq!(status, 0, "{out}");
    let keys: serde_json::Value = serde_json::from_str(&out).unwrap();
    let (status, _) = gw
        .admin(
            Method::POST,
            "/v1/seal/sessions",
            Some(json!({"session_id": "exec-cli", "public_key": keys["public_key"],
                        "security_context": "test", "expires_at": sealgate::clock::now_secs() + 600})),
        )
        .await;
    assert_eq!(status, 201);
    let token = gw.keys.agent_token("exec-cli");
    let payload = tool_call(1, "tool.off", json!({"from": "cli"})).to_string();

    let sign = |key: &str, payload: &str| {
        let args = [
            "sign",
            "--key",
            key,
            "--token",
            &token,
            "--payload",
            payload,
        ];
        cli(args.iter().map(|a| a.to_string()).collect())
    };
    // `sign` prints an envelope the gateway accepts, with the PEM form of the key too.
    let (status, out) = sign(keys["private_key_pem"].as_str().unwrap(), &payload)
        .await
        .unwrap();
    assert_eq!(status, 0, "{out}");
    let envelope: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let (status, body) = gw.post(&envelope).await;
    assert_eq!(status, 200, "{body}");
    // A payload the gateway would refuse for a duplicate key is refused here too, not signed.
    let duplicate = r#"{"jsonrpc": "2.0", "id": 1, "id": 2}"#;
    let (status, out) = sign(keys["private_key"].as_str().unwrap(), duplicate)
        .await
        .unwrap();
    assert_ne!(status, 0, "{out}");
    assert!(out.contains("duplicate key"), "{out}");

    // `invoke` signs and posts; a second identical payload is a new envelope (new timestamp or not,
    // it is refused only if the signature repeats), so use another id.
    let payload = tool_call(2, "tool.off", json!({"from": "cli"})).to_string();
    let (status, out) = cli(vec![
        "invoke".into(),
        "--url".into(),
        gw.base.clone(),
        "--key".into(),
        keys["private_key"].as_str().unwrap().into(),
        "--token".into(),
        token,
        "--payload".into(),
        payload,
    ])
    .await
    .unwrap();
    assert_eq!(status, 0, "{out}");
    let answer: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(answer["status"], "success");
    assert_eq!(tool.count(), 2);
}

#[tokio::test]
async fn mutated_envelopes_never_get_a_5xx() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, _tool) = Gateway::start(dir.path(), "").await;
    let (key, token) = gw.session("exec-mutations").await;
    let valid = serde_json::to_vec(&sealgate::envelope::sign_envelope(
        &key,
        tool_call(
            1,
            "tool.write",
            json!({"path": "/workspace/x", "n": [1, 2.5, "é"]}),
        ),
        &token,
        sealgate::clock::now_secs(),
    ))
    .unwrap();
    // A small deterministic generator: flips, truncations and insertions of JSON-significant bytes.
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |bound: usize| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 33) as usize) % bound.max(1)
    };
    let specials = b"{}[]\",:\\0123456789eE+-.tfn \xff\x00";
    for round in 0..300 {
        let mut body = valid.clone();
        for _ in 0..=next(4) {
            let at = next(body.len());
            match next(3) {
                0 => body[at] = specials[next(specials.len())],
                1 => body.truncate(at),
                _ => body.insert(at, specials[next(specials.len())]),
            }
        }
        let (status, answer) = gw.post_raw(body.clone()).await;
        assert!(
            status < 500,
            "round {round}: HTTP {status} for {:?}: {answer}",
            String::from_utf8_lossy(&body)
        );
        if status != 200 {
            assert!(answer["error"]["code"].is_u64(), "round {round}: {answer}");
        }
    }
    assert_eq!(
        gw.client
            .get(format!("{}/healthz", gw.base))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_calls_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let (mut gw, tool) = Gateway::start(dir.path(), "").await;
    let (key, token) = gw.session("exec-drain").await;
    let envelope = sealgate::envelope::sign_envelope(
        &key,
        tool_call(1, "second.op", json!({})),
        &token,
        sealgate::clock::now_secs(),
    );
    let (client, url) = (gw.client.clone(), format!("{}/v1/invoke", gw.base));
    let in_flight = tokio::spawn(async move {
        let response = client.post(url).json(&envelope).send().await.unwrap();
        (
            response.status().as_u16(),
            response.json::<serde_json::Value>().await.unwrap(),
        )
    });
    tool.until_held().await;
    let pid = gw.child.id().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let (status, body) = in_flight.await.unwrap();
    assert_eq!(status, 200, "the call in flight completes: {body}");
    assert_eq!(body["payload"]["result"]["content"][0]["text"], "late");
    let exit = tokio::task::spawn_blocking(move || gw.child.wait().unwrap())
        .await
        .unwrap();
    assert!(exit.success(), "a clean stop after SIGTERM: {exit:?}");
}
