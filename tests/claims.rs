//! Black-box tests of claims (SPEC section 7) through the real binary: exactly-once under concurrency,
//! SKIP with the stored answer, PENDING after a timeout, reconciliation, and the standalone claim API.

mod common;

use common::{code, keyed_call, tool_call, Gateway};
use reqwest::Method;
use serde_json::{json, Value};

#[tokio::test]
async fn thirty_two_identical_calls_reach_the_tool_once() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, tool) = Gateway::start(dir.path(), "").await;
    let (key, token) = gw.session("exec-concurrent").await;
    let gw = std::sync::Arc::new(gw);
    let key = std::sync::Arc::new(key);
    let now = sealgate::clock::now_secs();
    let calls = (0..32u64).map(|i| {
        let (gw, key, token) = (gw.clone(), key.clone(), token.clone());
        // Different JSON-RPC ids make different signatures; the claim is on tool and arguments.
        let envelope = sealgate::envelope::sign_envelope(
            &key,
            tool_call(
                i,
                "tool.write",
                json!({"path": "/workspace/once.txt", "op": "once"}),
            ),
            &token,
            now,
        );
        tokio::spawn(async move { gw.post(&envelope).await })
    });
    let mut proceed = 0;
    let mut skip = 0;
    let mut pending = 0;
    let mut answers = Vec::new();
    for call in calls.collect::<Vec<_>>() {
        let (status, body) = call.await.unwrap();
        match (status, body["receipt"]["claim"].as_str()) {
            (200, Some("PROCEED")) => proceed += 1,
            (200, Some("SKIP")) => skip += 1,
            (409, _) => {
                assert_eq!(code(&body), 4001);
                pending += 1;
                continue;
            }
            other => panic!("unexpected answer {other:?}: {body}"),
        }
        answers.push(body["payload"]["result"].clone());
    }
    assert_eq!(proceed, 1);
    assert_eq!(proceed + skip + pending, 32);
    assert_eq!(tool.count(), 1, "the tool ran exactly once");
    assert!(
        answers.windows(2).all(|w| w[0] == w[1]),
        "every SKIP returns the stored answer"
    );
}

/// SPEC 7.1 r3: a capability that does not say `claim:` is `explicit`. Without an idempotency key two
/// identical writes both run (`running`, `done`, `running` must end at `running`, which `auto` silently
/// skipped); with a key, the retry is a SKIP and the tool ran once.
#[tokio::test]
async fn a_capability_without_claim_claims_only_calls_with_a_key() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, tool) = Gateway::start(dir.path(), "").await;
    let plain = json!({"capabilities": [{"tool_pattern": "tool.*"}]});
    let (status, body) = gw
        .admin(Method::PUT, "/v1/security-contexts/plain", Some(plain))
        .await;
    assert_eq!(status, 201, "{body}");
    let (key, token) = gw.session_in("exec-plain", "plain").await;

    let state = |id, text| {
        tool_call(
            id,
            "tool.write",
            json!({"path": "/workspace/state", "text": text}),
        )
    };
    for (id, text) in [(1, "running"), (2, "done"), (3, "running")] {
        let (status, body) = gw.call(&key, &token, state(id, text)).await;
        assert_eq!(
            (status, body["receipt"]["claim"].as_str()),
            (200, Some("NONE")),
            "{body}"
        );
        assert_eq!(body["payload"]["result"]["echo"]["text"], text, "{body}");
    }
    assert_eq!(tool.count(), 3, "every unkeyed write ran");

    let pay = |id| keyed_call(id, "tool.pay", json!({"amount": 5}), "pay-7");
    let (status, first) = gw.call(&key, &token, pay(4)).await;
    assert_eq!(
        (status, first["receipt"]["claim"].as_str()),
        (200, Some("PROCEED")),
        "{first}"
    );
    let (status, retry) = gw.call(&key, &token, pay(5)).await;
    assert_eq!(
        (status, retry["receipt"]["claim"].as_str()),
        (200, Some("SKIP")),
        "{retry}"
    );
    assert_eq!(
        retry["receipt"]["request_id"],
        first["receipt"]["request_id"]
    );
    assert_eq!(tool.count(), 4, "the keyed retry did not run again");
    let (_, read) = gw
        .admin(Method::GET, "/v1/security-contexts/plain", None)
        .await;
    assert_eq!(read["capabilities"][0]["claim"], "explicit", "{read}");
}

#[tokio::test]
async fn skip_returns_the_stored_answer_with_the_callers_id_and_same_receipt() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, tool) = Gateway::start(dir.path(), "").await;
    let (key, token) = gw.session("exec-skip").await;
    let (_, first) = gw
        .call(
            &key,
            &token,
            tool_call(1, "tool.write", json!({"path": "/workspace/a"})),
        )
        .await;
    let (status, again) = gw
        .call(
            &key,
            &token,
            tool_call(2, "tool.write", json!({"path": "/workspace/a"})),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(again["receipt"]["claim"], "SKIP");
    assert_eq!(again["payload"]["id"], 2);
    assert_eq!(again["payload"]["result"], first["payload"]["result"]);
    for field in ["request_id", "action_ref", "claimed_at"] {
        assert_eq!(
            again["receipt"][field], first["receipt"][field],
            "{field} is fixed at claim time"
        );
    }
    // The receipt's action_ref can be recomputed by anyone.
    let receipt = &first["receipt"];
    assert_eq!(
        receipt["action_ref"].as_str().unwrap(),
        sealgate::claim::action_ref(
            "agent-1",
            "tool.write",
            receipt["request_id"].as_str().unwrap(),
            receipt["claimed_at"].as_str().unwrap()
        )
    );
    // An explicit idempotency key is scoped to the agent, not the session.
    let meta = |id| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
        "params": {"name": "tool.explicit", "arguments": {"amount": 5}, "_meta": {"idempotency_key": "transfer-1"}}})
    };
    let (_, a) = gw.call(&key, &token, meta(10)).await;
    assert_eq!(a["receipt"]["claim"], "PROCEED");
    assert_eq!(
        a["receipt"]["request_id"].as_str().unwrap(),
        sealgate::claim::request_id_for_key("agent-1", "transfer-1")
    );
    let (key2, token2) = gw.session("exec-skip-2").await;
    let (_, b) = gw.call(&key2, &token2, meta(11)).await;
    assert_eq!(
        b["receipt"]["claim"], "SKIP",
        "a new worker retrying the same logical action is caught"
    );
    // claim: explicit without a key takes no claim; a bad key is malformed.
    let (_, c) = gw
        .call(&key, &token, tool_call(12, "tool.explicit", json!({})))
        .await;
    assert_eq!(c["receipt"]["claim"], "NONE");
    let bad = json!({"jsonrpc": "2.0", "id": 13, "method": "tools/call",
        "params": {"name": "tool.write", "arguments": {}, "_meta": {"idempotency_key": ""}}});
    assert_eq!(code(&gw.call(&key, &token, bad).await.1), 1000);
    assert_eq!(tool.count(), 3);
}

#[tokio::test]
async fn timeout_keeps_the_claim_pending_until_an_operator_resolves_it() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, tool) = Gateway::start(dir.path(), "").await;
    let (key, token) = gw
        .session_with(
            "exec-timeout",
            json!({"allowed_tool_patterns": ["slow.*", "down.*"]}),
        )
        .await;
    let (status, body) = gw
        .call(&key, &token, tool_call(1, "slow.op", json!({"x": 1})))
        .await;
    assert_eq!((status, code(&body)), (504, 5002));
    let (status, body) = gw
        .call(&key, &token, tool_call(2, "slow.op", json!({"x": 1})))
        .await;
    assert_eq!(
        (status, code(&body)),
        (409, 4001),
        "sent and unanswered: still PENDING"
    );
    assert_eq!(tool.count(), 1);

    let (status, listed) = gw
        .admin(Method::GET, "/v1/claims?status=PENDING", None)
        .await;
    assert_eq!(status, 200);
    let items = listed["items"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    let request_id = items[0]["request_id"].as_str().unwrap().to_string();
    assert_eq!(items[0]["action"], "slow.op");

    // Only resolve scope may resolve; the resolution is committed and later calls SKIP with it.
    let reader = gw.keys.operator_token("seal.claim.read");
    let path = format!("/v1/claims/{request_id}/resolve");
    let result = json!({"jsonrpc": "2.0", "id": 0, "result": {"content": [{"type": "text", "text": "done by hand"}]}});
    let (status, _) = gw
        .operator(
            Method::POST,
            &path,
            Some(&reader),
            Some(json!({"outcome": "committed", "result": result})),
        )
        .await;
    assert_eq!(status, 403);
    let (status, bad) = gw
        .admin(Method::POST, &path, Some(json!({"outcome": "maybe"})))
        .await;
    assert_eq!((status, code(&bad)), (422, 6005));
    let (status, resolved) = gw
        .admin(
            Method::POST,
            &path,
            Some(json!({"outcome": "committed", "result": result, "evidence": "checked"})),
        )
        .await;
    assert_eq!(status, 200, "{resolved}");
    assert_eq!(resolved["status"], "COMMITTED");
    let (status, _) = gw
        .admin(Method::POST, &path, Some(json!({"outcome": "released"})))
        .await;
    assert_eq!(status, 409, "only a PENDING claim can be resolved");
    let (status, body) = gw
        .call(&key, &token, tool_call(3, "slow.op", json!({"x": 1})))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["receipt"]["claim"], "SKIP");
    assert_eq!(body["payload"]["id"], 3);
    assert_eq!(
        body["payload"]["result"]["content"][0]["text"],
        "done by hand"
    );

    // Unreachable before sending: the claim is released, so the retry is a new PROCEED attempt.
    assert_eq!(
        code(
            &gw.call(&key, &token, tool_call(4, "down.op", json!({})))
                .await
                .1
        ),
        5001
    );
    assert_eq!(
        code(
            &gw.call(&key, &token, tool_call(5, "down.op", json!({})))
                .await
                .1
        ),
        5001
    );
    let (_, listed) = gw
        .admin(Method::GET, "/v1/claims?status=PENDING", None)
        .await;
    assert_eq!(listed["items"].as_array().unwrap().len(), 0);
    let (status, one) = gw
        .admin(Method::GET, &format!("/v1/claims/{request_id}"), None)
        .await;
    assert_eq!((status, one["status"].as_str()), (200, Some("COMMITTED")));
    assert_eq!(
        gw.admin(Method::GET, "/v1/claims/unknown", None).await.0,
        404
    );
}

#[tokio::test]
async fn oversized_answer_is_withheld_and_committed_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, tool) = Gateway::start(dir.path(), "").await;
    let (key, token) = gw.session("exec-big").await;
    let (status, body) = gw
        .call(&key, &token, tool_call(1, "big.read", json!({})))
        .await;
    assert_eq!((status, code(&body)), (502, 2007));
    assert!(
        !body.to_string().contains("xxxx"),
        "the withheld answer never reaches the agent"
    );
    let (status, body) = gw
        .call(&key, &token, tool_call(2, "big.read", json!({})))
        .await;
    assert_eq!(
        (status, code(&body)),
        (502, 2007),
        "every SKIP answers 2007 again"
    );
    assert_eq!(tool.count(), 1);
}

#[tokio::test]
async fn standalone_claim_settle_claim_skips_with_the_result() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, _tool) = Gateway::start(dir.path(), "").await;
    let reader = gw.keys.operator_token("seal.claim.read");
    let body = json!({"request_id": "req-001", "action": "erc20_transfer"});
    assert_eq!(
        gw.operator(Method::POST, "/claim", Some(&reader), Some(body.clone()))
            .await
            .0,
        403
    );
    let (status, first) = gw.admin(Method::POST, "/claim", Some(body.clone())).await;
    assert_eq!((status, first["status"].as_str()), (200, Some("PROCEED")));
    let (_, again) = gw.admin(Method::POST, "/claim", Some(body.clone())).await;
    assert_eq!(again["status"], "PENDING");
    let (status, settled) = gw
        .admin(
            Method::POST,
            "/settle/req-001",
            Some(json!({"result": {"tx": "0xabc"}})),
        )
        .await;
    assert_eq!(
        (status, settled["status"].as_str()),
        (200, Some("committed"))
    );
    let (_, twice) = gw
        .admin(
            Method::POST,
            "/settle/req-001",
            Some(json!({"result": {"tx": "0xdef"}})),
        )
        .await;
    assert_eq!(twice["status"], "already_committed");
    assert_eq!(
        gw.admin(Method::POST, "/settle/unknown", Some(json!({"result": 1})))
            .await
            .0,
        404
    );
    let (_, skip) = gw.admin(Method::POST, "/claim", Some(body)).await;
    assert_eq!(skip["status"], "SKIP");
    assert_eq!(
        skip["existing"],
        json!({"tx": "0xabc"}),
        "SafeAgent returns existing as the outcome"
    );

    let (status, page) = gw
        .admin(Method::GET, "/audit?action=erc20_transfer&limit=10", None)
        .await;
    assert_eq!(status, 200);
    assert_eq!(page["total"], 1);
    assert_eq!(page["items"][0]["request_id"], "req-001");
    assert_eq!(page["items"][0]["status"], "COMMITTED");
    assert_eq!(page["items"][0]["agent_id"], "test-operator");
    for bad in ["limit=0", "limit=1001", "limit=x", "bogus=1"] {
        let (status, _) = gw.admin(Method::GET, &format!("/audit?{bad}"), None).await;
        assert_eq!(status, 422, "{bad}");
    }
}

#[tokio::test]
async fn a_standalone_claim_is_bound_to_its_action_and_settled_only_by_its_taker() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, _tool) = Gateway::start(dir.path(), "").await;
    let service_a = gw.keys.operator_token_as("service-a", "seal.claim.resolve");
    let service_b = gw.keys.operator_token_as("service-b", "seal.claim.resolve");
    let post = |token: &str, path: &str, body: Value| {
        let token = token.to_owned();
        let path = path.to_owned();
        let gw = &gw;
        async move {
            gw.operator(Method::POST, &path, Some(&token), Some(body))
                .await
        }
    };
    let transfer = json!({"request_id": "req-bind", "action": "transfer"});
    let (status, taken) = post(&service_a, "/claim", transfer.clone()).await;
    assert_eq!((status, taken["status"].as_str()), (200, Some("PROCEED")));

    // Another service cannot settle A's claim with a forged result.
    let (status, forged) = post(
        &service_b,
        "/settle/req-bind",
        json!({"result": {"forged": true}}),
    )
    .await;
    assert_eq!((status, code(&forged)), (403, 6002), "{forged}");

    // A's own settle commits; a claim for another action under the same id never sees that result.
    let (status, settled) = post(
        &service_a,
        "/settle/req-bind",
        json!({"result": {"tx": "0xa"}}),
    )
    .await;
    assert_eq!(
        (status, settled["status"].as_str()),
        (200, Some("committed"))
    );
    let (status, other) = post(
        &service_a,
        "/claim",
        json!({"request_id": "req-bind", "action": "refund"}),
    )
    .await;
    assert_eq!((status, code(&other)), (422, 4002), "{other}");
    assert!(!other.to_string().contains("0xa"), "{other}");
    let (_, skip) = post(&service_a, "/claim", transfer).await;
    assert_eq!(
        (skip["status"].as_str(), &skip["existing"]),
        (Some("SKIP"), &json!({"tx": "0xa"}))
    );

    // An operator holding seal.admin may settle another's claim.
    let (_, second) = post(
        &service_a,
        "/claim",
        json!({"request_id": "req-admin", "action": "transfer"}),
    )
    .await;
    assert_eq!(second["status"], "PROCEED");
    let (status, by_admin) = gw
        .admin(
            Method::POST,
            "/settle/req-admin",
            Some(json!({"result": 1})),
        )
        .await;
    assert_eq!(
        (status, by_admin["status"].as_str()),
        (200, Some("committed"))
    );
}
