//! The outside review's findings (SPEC revision 2), each through the real binary: claims that cannot be
//! forged or reused across calls, SKIPs under today's response cap, standalone claims audited in their
//! own namespace, bounded refusal events, read timeouts and admission control.

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use common::{code, keyed_call, tool_call, Gateway};
use reqwest::Method;
use serde_json::{json, Value};

#[tokio::test]
async fn the_standalone_api_can_neither_forge_nor_block_an_agents_claim() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, tool) = Gateway::start(dir.path(), "").await;
    let (key, token) = gw.session("exec-forge").await;
    let resolver = gw.keys.operator_token("seal.claim.resolve");
    // The request id the agent's keyed call will compute, claimed and settled with a made-up answer.
    let target = sealgate::claim::request_id_for_key("agent-1", "pay-1");
    let forged = json!({"request_id": target, "action": "tool.write"});
    let (status, taken) = gw
        .operator(Method::POST, "/claim", Some(&resolver), Some(forged))
        .await;
    assert_eq!((status, taken["status"].as_str()), (200, Some("PROCEED")));
    let (status, _) = gw
        .operator(
            Method::POST,
            &format!("/settle/{target}"),
            Some(&resolver),
            Some(json!({"result": {"jsonrpc": "2.0", "id": 0, "result": {"forged": true}}})),
        )
        .await;
    assert_eq!(status, 200);
    // The agent's real call runs the tool and gets the tool's answer.
    let (status, body) = gw
        .call(
            &key,
            &token,
            keyed_call(1, "tool.write", json!({"path": "/workspace/p"}), "pay-1"),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["receipt"]["claim"], "PROCEED");
    assert!(body["payload"]["result"].get("forged").is_none(), "{body}");
    assert_eq!(tool.count(), 1);
    // `/settle` cannot settle an invoke claim, and `/claim` finds none.
    let (status, _) = gw
        .operator(
            Method::POST,
            &format!(
                "/settle/{}",
                sealgate::claim::request_id_for_key("agent-1", "never-claimed")
            ),
            Some(&resolver),
            Some(json!({"result": 1})),
        )
        .await;
    assert_eq!(status, 404);
    // The claims listing tells the namespaces apart.
    let (_, page) = gw
        .admin(Method::GET, "/v1/claims?kind=standalone", None)
        .await;
    let items = page["items"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["kind"], "standalone");
    // Both standalone steps are audited with the actor; an invoke claim is resolved only via resolve,
    // with a JSON-RPC response object.
    let taken = gw.audit_events("type=ClaimTaken").await;
    let settled = gw.audit_events("type=ClaimSettled").await;
    assert_eq!((taken.len(), settled.len()), (1, 1));
    assert_eq!(taken[0]["actor"]["sub"], "test-operator");
    assert_eq!(settled[0]["request_id"], json!(target));
    // SPEC 7.4: each names the claim's action.
    for event in [&taken[0], &settled[0]] {
        assert_eq!(event["action"], "tool.write", "{event}");
    }
}

#[tokio::test]
async fn a_reused_idempotency_key_never_returns_another_calls_answer() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, tool) = Gateway::start(dir.path(), "").await;
    let (key, token) = gw.session("exec-reuse").await;
    let mut keyed = keyed_call(1, "tool.read", json!({"path": "/workspace/secret"}), "k");
    keyed["params"]["_meta"]["smuggled"] = json!({"path": "/etc/shadow"});
    let (status, first) = gw.call(&key, &token, keyed).await;
    assert_eq!(status, 200, "{first}");
    // The tool gets the key, so it can de-duplicate too, and nothing else of `_meta`, which no
    // policy check reads.
    let seen = tool.last_request.lock().unwrap().clone().unwrap();
    assert_eq!(
        seen["params"]["_meta"],
        json!({"idempotency_key": "k"}),
        "{seen}"
    );
    let (status, reused) = gw
        .call(
            &key,
            &token,
            keyed_call(2, "tool.read", json!({"path": "/workspace/other"}), "k"),
        )
        .await;
    assert_eq!((status, code(&reused)), (422, 4002), "{reused}");
    assert!(!reused.to_string().contains("secret"));
    assert_eq!(tool.count(), 1);
    let blocked = gw.audit_events("type=ClaimBlocked").await;
    assert_eq!(blocked[0]["code"], 4002);
    // The same call with the same key still SKIPs with its own answer.
    let (status, again) = gw
        .call(
            &key,
            &token,
            keyed_call(3, "tool.read", json!({"path": "/workspace/secret"}), "k"),
        )
        .await;
    assert_eq!(
        (status, again["receipt"]["claim"].as_str()),
        (200, Some("SKIP"))
    );
    assert_eq!(again["payload"]["id"], 3);
}

#[tokio::test]
async fn a_skip_is_held_to_the_response_cap_in_force_now() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, _tool) = Gateway::start(dir.path(), "").await;
    let (key, token) = gw.session("exec-cap").await;
    let call = |id| keyed_call(id, "tool.write", json!({"path": "/workspace/cap"}), "cap");
    let (status, _) = gw.call(&key, &token, call(1)).await;
    let mut next_id = 2;
    assert_eq!(status, 200);
    // Tighten the capability that allows tool.* to a cap smaller than the stored answer.
    let policy = common::TEST_POLICY.replace(
        "  - tool_pattern: \"tool.*\"\n    path_allowlist: [\"/workspace\"]",
        "  - tool_pattern: \"tool.*\"\n    path_allowlist: [\"/workspace\"]\n    max_response_size: 16",
    );
    assert_ne!(policy, common::TEST_POLICY);
    std::fs::write(dir.path().join("policies/test.yaml"), policy).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        next_id += 1;
        let (status, body) = gw.call(&key, &token, call(next_id)).await;
        if status != 200 {
            assert_eq!((status, code(&body)), (502, 2007), "{body}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the reload never applied"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A gateway whose audit trail records at most three refusals a second before check 8 (and its tool).
async fn gateway_recording_three_unauthenticated_per_second(
    dir: &std::path::Path,
) -> (std::sync::Arc<common::Tool>, Gateway) {
    let (tool, tool_base) = common::start_tool().await;
    let keys = std::sync::Arc::new(common::Keys::new());
    let config = common::write_config(dir, &keys, &tool_base, "", "");
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "audit: { file: audit.jsonl }",
        "audit: { file: audit.jsonl, unauthenticated_per_second: 3 }",
    );
    std::fs::write(&config, text).unwrap();
    (tool, Gateway::spawn(dir, &config, keys))
}

#[tokio::test]
async fn unauthenticated_refusals_are_bounded_and_rate_limited() {
    let dir = tempfile::tempdir().unwrap();
    let (_tool, gw) = gateway_recording_three_unauthenticated_per_second(dir.path()).await;
    let huge_signature = "A".repeat(40_000);
    let huge_alg = format!(
        "{}.e30.c2ln",
        base64_url(&format!("{{\"alg\":\"{}\"}}", "X".repeat(12_000)))
    );
    let started = std::time::Instant::now();
    for n in 0..10 {
        let envelope = json!({"protocol": "seal/v1", "security_token": huge_alg,
            "signature": huge_signature, "timestamp": sealgate::clock::now_secs(),
            "payload": tool_call(n, "tool.read", json!({}))});
        let (status, body) = gw.post(&envelope).await;
        assert_eq!((status, code(&body)), (401, 1004));
    }
    let seconds = started.elapsed().as_secs() as usize + 1;
    let events = gw.audit_events("type=EnvelopeRejected&code=1004").await;
    assert!(
        (3..=3 * seconds).contains(&events.len()) && events.len() < 10,
        "{} events in {seconds} s: only 3 per second and address are recorded",
        events.len()
    );
    for event in &events {
        assert!(
            event.get("signature").is_none(),
            "a signature that is not 64 bytes is not kept"
        );
        for (field, value) in event.as_object().unwrap() {
            if let Some(text) = value.as_str() {
                assert!(
                    text.chars().count() <= 256,
                    "{field} holds {} chars",
                    text.len()
                );
            }
        }
    }
    let file = gw.audit_file().await;
    assert!(!file.contains(&"X".repeat(300)));
}

fn base64_url(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text)
}

#[tokio::test]
async fn slow_request_heads_and_bodies_get_408() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, _tool) = Gateway::start(
        dir.path(),
        "limits: { header_read_timeout_secs: 1, body_read_timeout_secs: 1 }\n",
    )
    .await;
    let addr = gw.base.trim_start_matches("http://").to_string();
    let exchange = |request: &'static [u8]| {
        let addr = addr.clone();
        std::thread::spawn(move || {
            let mut stream = std::net::TcpStream::connect(addr).unwrap();
            stream
                .set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            stream.write_all(request).unwrap();
            let mut answer = String::new();
            // The gateway answers and closes: read to the end.
            let _ = stream.read_to_string(&mut answer);
            answer
        })
    };
    let head = exchange(b"POST /v1/invoke HTTP/1.1\r\nHost: x\r\n")
        .join()
        .unwrap();
    assert!(head.starts_with("HTTP/1.1 408"), "{head}");
    let body = exchange(
        b"POST /v1/invoke HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{",
    )
    .join()
    .unwrap();
    assert!(body.starts_with("HTTP/1.1 408"), "{body}");
    assert!(body.contains("\"code\":1000"), "{body}");
    // Sending nothing, or a single byte, holds a connection no longer than a slow head does.
    for request in [&b""[..], b"P"] {
        let started = std::time::Instant::now();
        let answer = exchange(request).join().unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{request:?} held the connection for {:?}: {answer}",
            started.elapsed()
        );
    }
}

#[tokio::test]
async fn calls_beyond_max_concurrent_calls_are_shed_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, tool) = Gateway::start(dir.path(), "limits: { max_concurrent_calls: 1 }\n").await;
    let (key, token) = gw.session("exec-shed").await;
    // One slow call holds the only slot (the tool answers after a second).
    let held = {
        let envelope = sealgate::envelope::sign_envelope(
            &key,
            tool_call(1, "second.wait", json!({})),
            &token,
            sealgate::clock::now_secs(),
        );
        let (client, url) = (gw.client.clone(), format!("{}/v1/invoke", gw.base));
        tokio::spawn(async move { client.post(url).json(&envelope).send().await })
    };
    tool.until_held().await;
    let started = std::time::Instant::now();
    let response = gw
        .client
        .post(format!("{}/v1/invoke", gw.base))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 503);
    assert_eq!(
        response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let body: Value = response.json().await.unwrap();
    assert_eq!(code(&body), 5006);
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "shedding must not wait"
    );
    let finished = held.await.unwrap().unwrap();
    assert_eq!(finished.status(), 200);
    // The slot is free again.
    let (status, _) = gw
        .call(&key, &token, tool_call(2, "tool.off", json!({})))
        .await;
    assert_eq!(status, 200);
}

/// An API-managed context for the r2 policy rules, and a session on it.
async fn r2_context(gw: &Gateway, session: &str) -> (ed25519_dalek::SigningKey, String) {
    let spec = json!({"capabilities": [
        {"tool_pattern": "limited.*", "rate_limit": {"calls": 2, "per_seconds": 4}, "claim": "off"},
        {"tool_pattern": "tool.cmd", "command_allowlist": ["git"],
         "subcommand_allowlist": {"git": ["status", "diff"]}, "path_allowlist": ["/workspace"], "claim": "off"},
        {"tool_pattern": "tool.fetch", "domain_allowlist": ["example.com"], "claim": "off"},
    ]});
    let (status, body) = gw
        .admin(Method::PUT, "/v1/security-contexts/r2", Some(spec))
        .await;
    assert_eq!(status, 201, "{body}");
    let key = sealgate::envelope::generate_signing_key().unwrap();
    let (status, body) = gw
        .admin(
            Method::POST,
            "/v1/seal/sessions",
            Some(json!({"session_id": session, "public_key": sealgate::envelope::public_key_b64(&key.verifying_key()),
                        "security_context": "r2", "expires_at": sealgate::clock::now_secs() + 600})),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let claims = gw.keys.agent_claims(session, "r2");
    (key, gw.keys.agent_token_from(&claims))
}

#[tokio::test]
async fn a_rate_limit_never_admits_more_than_calls_in_any_window() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, _tool) = Gateway::start(dir.path(), "").await;
    let (key, token) = r2_context(&gw, "exec-rate").await;
    for id in 0..2 {
        let (status, body) = gw
            .call(&key, &token, tool_call(id, "limited.echo", json!({})))
            .await;
        assert_eq!(status, 200, "{body}");
    }
    // Past half the window a GCRA would admit a third call; a sliding window must not. (The margin
    // left, 1.8 s, is for the two calls above on a busy machine.)
    tokio::time::sleep(Duration::from_millis(2200)).await;
    let (status, body) = gw
        .call(&key, &token, tool_call(3, "limited.echo", json!({})))
        .await;
    assert_eq!((status, code(&body)), (429, 2005), "{body}");
}

#[tokio::test]
async fn commands_and_urls_are_refused_by_the_r2_rules_without_quoting_them() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, tool) = Gateway::start(dir.path(), "").await;
    let (key, token) = r2_context(&gw, "exec-cmd").await;
    let cases = [
        (
            json!({"command": "git status #; rm -rf /"}),
            "tool.cmd",
            2003,
        ),
        (
            json!({"command": "git -c core.pager=sh status"}),
            "tool.cmd",
            2003,
        ),
        (
            json!({"command": "git", "args": ["status", "$(id)"]}),
            "tool.cmd",
            2003,
        ),
        (
            json!({"command": "git diff --output=/etc/SECRETFILE"}),
            "tool.cmd",
            2002,
        ),
        (
            json!({"url": "https://user:SECRETPASS@evil.test/?api_key=SECRETKEY"}),
            "tool.fetch",
            2004,
        ),
    ];
    for (id, (arguments, tool_name, expected)) in cases.into_iter().enumerate() {
        let (status, body) = gw
            .call(
                &key,
                &token,
                tool_call(id as u64, tool_name, arguments.clone()),
            )
            .await;
        assert_eq!(
            (status, code(&body)),
            (403, expected),
            "{arguments}: {body}"
        );
    }
    assert_eq!(tool.count(), 0);
    // Allowed forms still pass.
    let (status, body) = gw
        .call(
            &key,
            &token,
            tool_call(9, "tool.cmd", json!({"command": "git diff --stat"})),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // No event, in the store or in the file, quotes a refused value.
    let events = gw.audit_events("type=PolicyViolationBlocked").await;
    assert_eq!(events.len(), 5);
    let file = gw.audit_file().await;
    for text in [serde_json::to_string(&events).unwrap(), file] {
        for secret in ["SECRET", "rm -rf", "core.pager", "$(id)"] {
            assert!(!text.contains(secret), "an event quotes {secret:?}");
        }
    }
}

#[tokio::test]
async fn the_export_streams_the_chain_that_audit_verify_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, _tool) = Gateway::start(dir.path(), "").await;
    let (key, token) = gw.session("exec-export").await;
    for id in 0..5 {
        gw.call(&key, &token, tool_call(id, "tool.off", json!({})))
            .await;
    }
    let export = |query: &'static str| {
        let request = gw
            .client
            .get(format!("{}/v1/audit/export{query}", gw.base))
            .bearer_auth(gw.keys.operator_token("seal.audit.read"));
        async move {
            let response = request.send().await.unwrap();
            (response.status().as_u16(), response.text().await.unwrap())
        }
    };
    let (status, whole) = export("").await;
    assert_eq!(status, 200);
    let report = sealgate::audit::verify_chain(std::io::Cursor::new(whole.as_bytes())).unwrap();
    assert_eq!(
        (report.first_seq, report.events),
        (1, whole.lines().count() as u64)
    );
    assert!(
        report.events >= 11,
        "a session and five calls of two events each"
    );
    assert_eq!(
        whole,
        gw.audit_file_through(report.events).await,
        "the export is the chain the file holds"
    );
    let (_, tail) = export("?from_seq=3").await;
    assert_eq!(tail.lines().count() as u64, report.events - 2);
    let first: Value = serde_json::from_str(tail.lines().next().unwrap()).unwrap();
    assert_eq!(first["seq"], 3);
    let (status, _) = export("?from_seq=x").await;
    assert_eq!(status, 422);
}

#[tokio::test]
async fn upstream_failures_name_no_upstream_address_or_credential() {
    let dir = tempfile::tempdir().unwrap();
    // Nothing listens on port 1; the query holds a credential, as some APIs take one.
    let upstream = "  leaky: { http: { url: \"http://127.0.0.1:1/rpc?api_key=SECRET-IN-URL\" } }";
    let (gw, _tool) = Gateway::start_with(dir.path(), upstream, "").await;
    let (key, token) = gw.session_in("exec-leak", "other").await;
    let (status, body) = gw
        .call(&key, &token, tool_call(1, "leaky.read", json!({})))
        .await;
    assert_eq!((status, code(&body)), (502, 5001), "{body}");
    let failed = gw.audit_events("type=ToolCallFailed").await;
    assert_eq!(failed.len(), 1);
    for text in [body.to_string(), failed[0].to_string()] {
        assert!(!text.contains("SECRET-IN-URL"), "{text}");
        assert!(!text.contains("127.0.0.1:1"), "{text}");
    }
}

#[tokio::test]
async fn replayed_envelopes_and_revoked_tokens_cannot_flood_the_audit_trail() {
    let dir = tempfile::tempdir().unwrap();
    let (_tool, gw) = gateway_recording_three_unauthenticated_per_second(dir.path()).await;
    let (key, token) = gw.session("exec-flood").await;
    const SENT: usize = 40;
    let started = std::time::Instant::now();
    // A captured envelope, sent again and again: 1008 each time.
    let captured = sealgate::envelope::sign_envelope(
        &key,
        tool_call(1, "tool.off", json!({})),
        &token,
        sealgate::clock::now_secs(),
    );
    assert_eq!(gw.post(&captured).await.0, 200);
    for _ in 0..SENT {
        assert_eq!(code(&gw.post(&captured).await.1), 1008);
    }
    // A captured token after its session was revoked: 1006 each time.
    let (status, _) = gw
        .admin(Method::DELETE, "/v1/seal/sessions/exec-flood", None)
        .await;
    assert_eq!(status, 200);
    for id in 0..SENT as u64 {
        let (_, body) = gw
            .call(&key, &token, tool_call(id + 2, "tool.off", json!({})))
            .await;
        assert_eq!(code(&body), 1006);
    }
    let seconds = started.elapsed().as_secs() as usize + 1;
    // Both kinds share the address's budget of 3 events a second.
    let mut recorded = 0;
    for refused in [1008, 1006] {
        recorded += gw
            .audit_events(&format!("type=EnvelopeRejected&code={refused}&limit=1000"))
            .await
            .len();
    }
    assert!(
        (1..=3 * seconds).contains(&recorded),
        "{recorded} events of {} refusals in {seconds} s",
        2 * SENT
    );
    // The rest are counted, and the count is recorded within the report interval (10 s).
    common::until(Duration::from_secs(15), "the suppressed count", || async {
        let summaries = gw
            .audit_events("type=EnvelopeRejected&code=1000&limit=1000")
            .await;
        let suppressed: u64 = summaries
            .iter()
            .filter_map(|event| event["suppressed"].as_u64())
            .sum();
        suppressed >= (2 * SENT).saturating_sub(6 * seconds) as u64
    })
    .await;
}
