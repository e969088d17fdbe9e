//! Human approval of risky calls (SPEC 13) through the real binary: a `pay.*` call waits at the gateway
//! with 4003 until an operator grants it, then runs exactly once; denials, expiry, scopes, the claim
//! rule, the webhook and its Standard Webhooks signatures, and two replicas sharing one PostgreSQL store.

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use common::redirect::{Redirector, SECRET};
use common::{
    assert_refused_at_start_up, code, standardwebhooks_python, start_replicas, start_tool,
    tool_call, until, write_config, Gateway, Keys,
};
use ed25519_dalek::SigningKey;
use reqwest::Method;
use sealgate::store::testing::TestDatabase;
use serde_json::{json, Value};

const DECIDE: &str = "seal.approval.read seal.approval.decide";

/// The arguments of the risky call: values that must never reach an audit event.
fn payment(cents: u64) -> Value {
    json!({"to": "acct-93-secret", "cents": cents, "memo": "memo-do-not-log"})
}

/// Signs and posts one `tools/call` (a fresh envelope each time).
async fn call(
    gw: &Gateway,
    key: &SigningKey,
    token: &str,
    tool: &str,
    args: Value,
) -> (u16, Value) {
    gw.call_tool(key, token, tool, args).await
}

/// The approval id of a 4003 answer, checked to be one.
fn requested(answer: &(u16, Value)) -> String {
    assert_eq!((answer.0, code(&answer.1)), (403, 4003), "{}", answer.1);
    let details = &answer.1["error"]["details"];
    assert!(
        details["expires_at"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{details}"
    );
    details["approval_id"].as_str().unwrap().to_string()
}

async fn approval(gw: &Gateway, id: &str) -> Value {
    let token = gw.keys.operator_token("seal.approval.read");
    let (status, body) = gw
        .operator(
            Method::GET,
            &format!("/v1/approvals/{id}"),
            Some(&token),
            None,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    body
}

async fn decide(gw: &Gateway, id: &str, verdict: &str, body: Value) -> (u16, Value) {
    let token = gw.keys.operator_token(DECIDE);
    gw.operator(
        Method::POST,
        &format!("/v1/approvals/{id}/{verdict}"),
        Some(&token),
        Some(body),
    )
    .await
}

fn of_type<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

/// Puts an API-kept context and registers a session on it; returns the agent's key and token.
async fn session_on(
    gw: &Gateway,
    context: &str,
    spec: Value,
    session: &str,
) -> (SigningKey, String) {
    let (status, body) = gw
        .admin(
            Method::PUT,
            &format!("/v1/security-contexts/{context}"),
            Some(spec),
        )
        .await;
    assert!(status == 200 || status == 201, "{body}");
    gw.session_in(session, context).await
}

#[tokio::test]
async fn a_risky_call_waits_for_a_grant_and_then_runs_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, tool) = Gateway::start(dir.path(), "").await;
    let (key, token) = gw.session("exec-pay").await;
    // Evaluate says the policy allows it, and that a person must grant it first.
    let (status, evaluated) = gw
        .admin(
            Method::POST,
            "/v1/security-contexts/test/evaluate",
            Some(json!({"tool": "pay.send", "arguments": payment(500)})),
        )
        .await;
    assert_eq!(status, 200, "{evaluated}");
    assert_eq!(evaluated["decision"], "allow");
    assert_eq!(evaluated["approval"]["required"], true, "{evaluated}");

    let first = requested(&call(&gw, &key, &token, "pay.send", payment(500)).await);
    assert_eq!(tool.count(), 0, "the tool ran before anyone approved");
    // Sent again while pending: the same request, not a second one.
    let again = requested(&call(&gw, &key, &token, "pay.send", payment(500)).await);
    assert_eq!(again, first);
    assert_eq!(tool.count(), 0);

    // The operator sees the call, arguments included.
    let record = approval(&gw, &first).await;
    assert_eq!(record["status"], "pending");
    assert_eq!(record["arguments"], payment(500));
    assert_eq!(record["tool"], "pay.send");
    assert_eq!(record["session_id"], "exec-pay");
    assert_eq!(record["sub"], "agent-1");
    assert_eq!(record["context"], "test");
    let digest = sealgate::claim::call_digest("pay.send", payment(500).as_object().unwrap());
    assert_eq!(record["call_digest"], digest);
    assert!(record.get("decided_by").is_none(), "{record}");
    let reader = gw.keys.operator_token("seal.approval.read");
    let (status, page) = gw
        .operator(
            Method::GET,
            "/v1/approvals?status=pending&session_id=exec-pay&tool=pay.send",
            Some(&reader),
            None,
        )
        .await;
    assert_eq!(status, 200, "{page}");
    let ids: Vec<&str> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["approval_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![first.as_str()]);
    let (status, body) = gw
        .operator(
            Method::GET,
            "/v1/approvals?status=open",
            Some(&reader),
            None,
        )
        .await;
    assert_eq!((status, code(&body)), (422, 6005));

    // Scopes: reading needs seal.approval.read, deciding seal.approval.decide.
    let path = format!("/v1/approvals/{first}");
    let claims_reader = gw.keys.operator_token("seal.claim.read");
    let (status, body) = gw.operator(Method::GET, &path, None, None).await;
    assert_eq!((status, code(&body)), (401, 6001));
    let (status, body) = gw
        .operator(Method::GET, &path, Some(&claims_reader), None)
        .await;
    assert_eq!((status, code(&body)), (403, 6002));
    let (status, body) = gw
        .operator(
            Method::POST,
            &format!("{path}/grant"),
            Some(&reader),
            Some(json!({})),
        )
        .await;
    assert_eq!((status, code(&body)), (403, 6002));
    assert_eq!(approval(&gw, &first).await["status"], "pending");
    let (status, body) = decide(&gw, "no-such-approval", "grant", json!({})).await;
    assert_eq!((status, code(&body)), (404, 6003));

    let (status, granted) = decide(&gw, &first, "grant", json!({"reason": "invoice 42"})).await;
    assert_eq!(status, 200, "{granted}");
    assert_eq!(granted["status"], "granted");
    assert_eq!(
        granted["decided_by"],
        json!({"iss": "urn:sealgate:local", "sub": "test-operator", "via": "key"})
    );
    assert_eq!(granted["reason"], "invoice 42");
    assert!(granted["decided_at"].as_str().is_some());
    // Deciding twice is a conflict, whichever way.
    for verdict in ["grant", "deny"] {
        let (status, body) = decide(&gw, &first, verdict, json!({"reason": "again"})).await;
        assert_eq!((status, code(&body)), (409, 6004), "{verdict}: {body}");
    }

    // The next envelope for the same call runs, once, and uses the grant up.
    let (status, ran) = call(&gw, &key, &token, "pay.send", payment(500)).await;
    assert_eq!(status, 200, "{ran}");
    assert_eq!(tool.count(), 1);
    assert_eq!(approval(&gw, &first).await["status"], "used");
    let third = requested(&call(&gw, &key, &token, "pay.send", payment(500)).await);
    assert_ne!(third, first, "a used grant must not be reused");
    assert_eq!(tool.count(), 1);
    // Other arguments are another call: a request of its own.
    let other = requested(&call(&gw, &key, &token, "pay.send", payment(501)).await);
    assert_ne!(other, third);
    assert_eq!(tool.count(), 1);

    // Every step is audited, with the request's id, and no argument value anywhere in the trail.
    let trail = gw.events("exec-pay").await;
    let asked = of_type(&trail, "ApprovalRequested");
    assert_eq!(asked.len(), 3, "{trail:?}");
    assert_eq!(asked[0]["approval_id"], first.as_str());
    assert_eq!(asked[0]["code"], 4003);
    assert_eq!(asked[0]["tool"], "pay.send");
    assert_eq!(asked[0]["sub"], "agent-1");
    let waiting = of_type(&trail, "PolicyViolationBlocked");
    assert_eq!(waiting.len(), 1);
    assert_eq!(
        (
            waiting[0]["code"].clone(),
            waiting[0]["approval_id"].clone()
        ),
        (json!(4003), json!(first))
    );
    let grants = of_type(&trail, "ApprovalGranted");
    assert_eq!(grants.len(), 1);
    assert_eq!(grants[0]["actor"]["sub"], "test-operator");
    assert_eq!(
        (grants[0]["grants"].clone(), grants[0]["approvers"].clone()),
        (json!(1), json!(1))
    );
    assert_eq!(grants[0]["approval_id"], first.as_str());
    assert_eq!(grants[0]["session_id"], "exec-pay");
    let used = of_type(&trail, "ApprovalUsed");
    assert_eq!(used.len(), 1);
    assert_eq!(used[0]["approval_id"], first.as_str());
    assert_eq!(of_type(&trail, "ToolCallCompleted").len(), 1);
    let file = gw.audit_file().await;
    for secret in ["acct-93-secret", "memo-do-not-log"] {
        assert!(
            !file.contains(secret),
            "{secret} leaked into the audit file"
        );
        assert!(!serde_json::to_string(&trail).unwrap().contains(secret));
    }
}

#[tokio::test]
async fn a_denied_call_gets_4004_with_the_reason_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, tool) = Gateway::start(dir.path(), "").await;
    let (key, token) = gw.session("exec-deny").await;
    let id = requested(&call(&gw, &key, &token, "pay.send", payment(7)).await);

    let (status, body) = decide(&gw, &id, "deny", json!({})).await;
    assert_eq!((status, code(&body)), (422, 6005), "a deny needs a reason");
    let (status, body) = decide(&gw, &id, "deny", json!({"reason": "  "})).await;
    assert_eq!((status, code(&body)), (422, 6005));
    assert_eq!(approval(&gw, &id).await["status"], "pending");
    let (status, denied) = decide(&gw, &id, "deny", json!({"reason": "unknown payee"})).await;
    assert_eq!(status, 200, "{denied}");
    assert_eq!(denied["status"], "denied");
    assert_eq!(denied["reason"], "unknown payee");

    let (status, refused) = call(&gw, &key, &token, "pay.send", payment(7)).await;
    assert_eq!((status, code(&refused)), (403, 4004), "{refused}");
    assert_eq!(refused["error"]["details"]["approval_id"], id.as_str());
    assert_eq!(refused["error"]["details"]["reason"], "unknown payee");
    assert_eq!(tool.count(), 0);
    let (status, body) = decide(&gw, &id, "grant", json!({})).await;
    assert_eq!((status, code(&body)), (409, 6004));

    let trail = gw.events("exec-deny").await;
    let denials = of_type(&trail, "ApprovalDenied");
    assert_eq!(denials.len(), 1);
    assert_eq!(denials[0]["actor"]["sub"], "test-operator");
    assert_eq!(denials[0]["detail"], "unknown payee");
    let blocked = of_type(&trail, "PolicyViolationBlocked");
    assert_eq!(blocked.len(), 1);
    assert_eq!(blocked[0]["code"], 4004);
}

#[tokio::test]
async fn requests_grants_and_denials_expire_and_the_sweep_notices_unaided() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, tool) = Gateway::start(dir.path(), "").await;
    let spec = json!({"capabilities": [
        {"tool_pattern": "pay.*", "claim": "off", "approval": {"required": true, "expires_secs": 3}}
    ]});
    // 3 s: short enough to wait out, long enough for the steps that must land before an expiry (a
    // grant after its request, a refusal after its denial) on a busy machine.
    let (key, token) = session_on(&gw, "quick", spec, "exec-quick").await;

    // A request nobody decides expires; reading it notices.
    let stale = requested(&call(&gw, &key, &token, "pay.send", payment(1)).await);
    until(Duration::from_secs(10), "the request expires", || async {
        approval(&gw, &stale).await["status"] == "expired"
    })
    .await;
    let (status, body) = decide(&gw, &stale, "grant", json!({})).await;
    assert_eq!((status, code(&body)), (409, 6004));
    // The call may ask again.
    let fresh = requested(&call(&gw, &key, &token, "pay.send", payment(1)).await);
    assert_ne!(fresh, stale);

    // A grant nobody uses expires too; this time nothing reads it: the periodic sweep notices.
    let (status, body) = decide(&gw, &fresh, "grant", json!({})).await;
    assert_eq!(status, 200, "{body}");
    until(
        Duration::from_secs(40),
        "the sweep expires the grant",
        || async {
            of_type(&gw.events("exec-quick").await, "ApprovalExpired")
                .iter()
                .any(|e| e["approval_id"] == fresh.as_str())
        },
    )
    .await;
    let after = requested(&call(&gw, &key, &token, "pay.send", payment(1)).await);
    assert_ne!(after, fresh);
    assert_eq!(tool.count(), 0);
    let trail = gw.events("exec-quick").await;
    let expired = of_type(&trail, "ApprovalExpired");
    assert_eq!(expired.len(), 2, "one event per expiry: {expired:?}");

    // A denial holds for expires_secs after the decision; then the call may ask again.
    let (status, body) = decide(&gw, &after, "deny", json!({"reason": "no"})).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = call(&gw, &key, &token, "pay.send", payment(1)).await;
    assert_eq!((status, code(&body)), (403, 4004), "{body}");
    until(Duration::from_secs(10), "the denial runs out", || async {
        let (status, body) = call(&gw, &key, &token, "pay.send", payment(1)).await;
        status == 403 && code(&body) == 4003
    })
    .await;
    assert_eq!(approval(&gw, &after).await["status"], "denied");
}

/// `calls.allowed` of a session, as `GET /v1/seal/sessions/{id}` reports it.
async fn calls_allowed(gw: &Gateway, session: &str) -> u64 {
    let (status, body) = gw
        .admin(Method::GET, &format!("/v1/seal/sessions/{session}"), None)
        .await;
    assert_eq!(status, 200, "{body}");
    body["calls"]["allowed"].as_u64().unwrap()
}

#[tokio::test]
async fn waiting_for_a_person_is_not_charged_but_every_other_call_at_the_gate_is() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, tool) = Gateway::start(dir.path(), "").await;
    let spec = json!({"capabilities": [{"tool_pattern": "pay.*", "claim": "off",
        "approval": {"required": true}, "rate_limit": {"calls": 4, "per_seconds": 3600}}]});
    let (status, body) = gw
        .admin(Method::PUT, "/v1/security-contexts/metered", Some(spec))
        .await;
    assert!(status == 200 || status == 201, "{body}");
    let (key, _) = gw
        .session_with(
            "exec-budget",
            json!({"security_context": "metered", "budget": {"max_calls": 3}}),
        )
        .await;
    let token = gw
        .keys
        .agent_token_from(&gw.keys.agent_claims("exec-budget", "metered"));
    // The request is charged once; its repeats while it is pending (SPEC 13 r3) are not, however many.
    let id = requested(&call(&gw, &key, &token, "pay.send", payment(4)).await);
    assert_eq!(calls_allowed(&gw, "exec-budget").await, 1);
    for _ in 0..12 {
        let repeat = call(&gw, &key, &token, "pay.send", payment(4)).await;
        assert_eq!(requested(&repeat), id);
    }
    assert_eq!(calls_allowed(&gw, "exec-budget").await, 1);
    // Every repeat was still remembered for replay: check 8 holds for every call.
    let envelope = sealgate::envelope::sign_envelope(
        &key,
        tool_call(9_999, "pay.send", payment(4)),
        &token,
        sealgate::clock::now_secs(),
    );
    assert_eq!(requested(&gw.post(&envelope).await), id);
    let (status, replayed) = gw.post(&envelope).await;
    assert_eq!((status, code(&replayed)), (401, 1008), "{replayed}");
    // A new call is a new request, and is charged.
    let other = requested(&call(&gw, &key, &token, "pay.send", payment(5)).await);
    assert_ne!(other, id);
    assert_eq!(calls_allowed(&gw, "exec-budget").await, 2);
    // The granted call is charged when it runs: the third and last call of the budget.
    assert_eq!(decide(&gw, &id, "grant", json!({})).await.0, 200);
    let (status, ran) = call(&gw, &key, &token, "pay.send", payment(4)).await;
    assert_eq!(status, 200, "{ran}");
    assert_eq!(
        (tool.count(), calls_allowed(&gw, "exec-budget").await),
        (1, 3)
    );
    // A denied call is not waiting: its repeat reaches the gate, and is charged like any other.
    assert_eq!(
        decide(&gw, &other, "deny", json!({"reason": "no"})).await.0,
        200
    );
    let (status, body) = call(&gw, &key, &token, "pay.send", payment(5)).await;
    assert_eq!((status, code(&body)), (403, 2008), "{body}");
}

#[tokio::test]
async fn a_policy_tightened_after_the_grant_still_refuses_and_an_unrelated_edit_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, tool) = Gateway::start(dir.path(), "").await;
    let capability =
        json!({"tool_pattern": "pay.*", "claim": "off", "approval": {"required": true}});
    let loose = json!({"capabilities": [capability]});
    let (key, token) = session_on(&gw, "tight", loose.clone(), "exec-tight").await;
    let id = requested(&call(&gw, &key, &token, "pay.send", payment(3)).await);
    assert_eq!(decide(&gw, &id, "grant", json!({})).await.0, 200);

    let put = |spec: Value| {
        let gw = &gw;
        async move {
            let (status, body) = gw
                .admin(Method::PUT, "/v1/security-contexts/tight", Some(spec))
                .await;
            assert_eq!(status, 200, "{body}");
        }
    };
    put(json!({"deny_list": ["pay.refund"], "capabilities": [capability]})).await;
    put(json!({"deny_list": ["pay.send"], "capabilities": [capability]})).await;
    let (status, refused) = call(&gw, &key, &token, "pay.send", payment(3)).await;
    assert_eq!((status, code(&refused)), (403, 2001), "{refused}");
    assert_eq!(tool.count(), 0);
    assert_eq!(approval(&gw, &id).await["status"], "granted");
    // Loosened again: the grant, untouched by the refusal and the unrelated edit, is still good once.
    put(loose).await;
    let (status, ran) = call(&gw, &key, &token, "pay.send", payment(3)).await;
    assert_eq!(status, 200, "{ran}");
    assert_eq!(tool.count(), 1);
}

#[tokio::test]
async fn a_call_that_never_left_keeps_its_grant_and_the_claim_comes_first() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, tool) = Gateway::start(dir.path(), "").await;
    let spec = json!({"capabilities": [
        {"tool_pattern": "down.*", "claim": "off", "approval": {"required": true}},
        {"tool_pattern": "pay.*", "claim": "auto", "approval": {"required": true}}
    ]});
    let (key, token) = session_on(&gw, "claimed", spec, "exec-claimed").await;

    // 5001: nothing was sent, so the grant stays usable.
    let id = requested(&call(&gw, &key, &token, "down.send", json!({"n": 1})).await);
    assert_eq!(decide(&gw, &id, "grant", json!({})).await.0, 200);
    for _ in 0..2 {
        let (status, body) = call(&gw, &key, &token, "down.send", json!({"n": 1})).await;
        assert_eq!((status, code(&body)), (502, 5001), "{body}");
        assert_eq!(approval(&gw, &id).await["status"], "granted");
    }

    // With a claim: once run, the same call is a SKIP (SPEC 7), asking for no new approval.
    let id = requested(&call(&gw, &key, &token, "pay.send", payment(9)).await);
    assert_eq!(decide(&gw, &id, "grant", json!({})).await.0, 200);
    let (status, ran) = call(&gw, &key, &token, "pay.send", payment(9)).await;
    assert_eq!(status, 200, "{ran}");
    assert_eq!(ran["receipt"]["claim"], "PROCEED");
    let (status, skipped) = call(&gw, &key, &token, "pay.send", payment(9)).await;
    assert_eq!(status, 200, "{skipped}");
    assert_eq!(skipped["receipt"]["claim"], "SKIP");
    assert_eq!(skipped["payload"]["result"], ran["payload"]["result"]);
    assert_eq!(tool.count(), 1);
    let trail = gw.events("exec-claimed").await;
    assert_eq!(of_type(&trail, "ApprovalRequested").len(), 2);
}

/// One request that reached the webhook, as received: its headers and its raw body.
#[derive(Clone)]
struct Delivery {
    headers: Vec<(String, String)>,
    body: String,
}

impl Delivery {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap()
    }

    fn header(&self, name: &str) -> &str {
        let found = self.headers.iter().find(|(n, _)| n == name);
        found.map_or("", |(_, value)| value.as_str())
    }
}

/// A webhook that fails its first `failures` deliveries with 500, recording every request it is sent.
async fn start_webhook(failures: u64) -> (Arc<Mutex<Vec<Delivery>>>, String) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let recorded = seen.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: axum::http::HeaderMap, body: String| {
            let recorded = recorded.clone();
            async move {
                let headers = headers
                    .iter()
                    .map(|(name, value)| {
                        (name.to_string(), value.to_str().unwrap_or("").to_string())
                    })
                    .collect();
                let mut seen = recorded.lock().unwrap();
                seen.push(Delivery { headers, body });
                if seen.len() as u64 <= failures {
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR
                } else {
                    axum::http::StatusCode::OK
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (seen, format!("http://{addr}/hook"))
}

#[tokio::test]
async fn new_requests_are_announced_to_the_webhook_which_is_retried() {
    let (seen, url) = start_webhook(2).await;
    let dir = tempfile::tempdir().unwrap();
    let extra = format!(
        "approvals: {{ webhook_url: {url:?}, console_base_url: \"https://console.example/\" }}\n"
    );
    let (gw, _tool) = Gateway::start(dir.path(), &extra).await;
    let (key, token) = gw.session("exec-hook").await;
    let id = requested(&call(&gw, &key, &token, "pay.send", payment(2)).await);
    until(
        Duration::from_secs(10),
        "two failures, then a delivery",
        || async { seen.lock().unwrap().len() == 3 },
    )
    .await;
    // The repeated call made no new request, so nothing more is announced.
    assert_eq!(
        requested(&call(&gw, &key, &token, "pay.send", payment(2)).await),
        id
    );
    let deliveries = seen.lock().unwrap().clone();
    let expires_at = approval(&gw, &id).await["expires_at"].clone();
    for delivery in &deliveries {
        assert_eq!(delivery.header("content-type"), "application/json");
        assert_eq!(
            delivery.json(),
            json!({"approval_id": id, "tool": "pay.send", "session_id": "exec-hook",
                    "sub": "agent-1", "expires_at": expires_at,
                    "console_url": format!("https://console.example/#/approvals/{id}")})
        );
    }

    // An unreachable webhook never holds up or fails the call.
    let dir = tempfile::tempdir().unwrap();
    let (gw, _tool) = Gateway::start(
        dir.path(),
        "approvals: { webhook_url: \"http://127.0.0.1:1/hook\" }\n",
    )
    .await;
    let (key, token) = gw.session("exec-nohook").await;
    requested(&call(&gw, &key, &token, "pay.send", payment(2)).await);
}

/// A webhook that answers 307 is a failed delivery, retried and logged with the status and where it
/// pointed; the redirect is never followed, so the request never reaches the place it names (SPEC 20
/// rule 8: an SSRF pivot otherwise).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_that_redirects_is_a_failed_delivery_and_never_followed() {
    let redirector = Redirector::start().await;
    let dir = tempfile::tempdir().unwrap();
    let extra = format!(
        "approvals: {{ webhook_url: \"{}/hook\" }}\n",
        redirector.base
    );
    let (gw, stderr) =
        Gateway::start_capturing(dir.path(), |_| String::new(), &extra, |_| {}).await;
    let (key, token) = gw.session("exec-moved-hook").await;
    requested(&call(&gw, &key, &token, "pay.send", payment(2)).await);
    until(
        Duration::from_secs(10),
        "the delivery retried after the redirect",
        || async { redirector.redirected() >= 2 },
    )
    .await;
    let failed = stderr.wait_for("of the failed delivery", |line| {
        line.contains("approval webhook failed") && line.contains(&redirector.named())
    });
    assert_eq!(redirector.followed(), 0, "{failed}");
    assert!(
        !stderr.lines().iter().any(|line| line.contains(SECRET)),
        "{:#?}",
        stderr.lines()
    );
}

/// A fresh Standard Webhooks secret: `whsec_` and the base64 of 32 random bytes.
fn webhook_secret() -> String {
    let mut bytes = [0u8; 32];
    getrandom::getrandom(&mut bytes).unwrap();
    format!("whsec_{}", STANDARD.encode(bytes))
}

/// What the standardwebhooks library says of `delivery` under `secret`: whether it verifies, and its
/// verdict line.
fn verify_with_standardwebhooks(dir: &Path, secret: &str, delivery: &Delivery) -> (bool, String) {
    let file = dir.join(format!("delivery-{}.json", uuid::Uuid::new_v4()));
    let headers: serde_json::Map<String, Value> = delivery
        .headers
        .iter()
        .map(|(name, value)| (name.clone(), json!(value)))
        .collect();
    let saved = json!({"headers": headers, "body": delivery.body});
    std::fs::write(&file, saved.to_string()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/webhooks/verify_signature.py");
    let output = std::process::Command::new(standardwebhooks_python())
        .arg(script)
        .arg(&file)
        .env("WEBHOOK_SECRET", secret)
        .output()
        .unwrap();
    let verdict = String::from_utf8_lossy(&output.stdout).trim().to_string();
    assert!(
        verdict.starts_with("verified ") || verdict.starts_with("refused: "),
        "the script failed: {verdict}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), verdict)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_deliveries_verify_with_the_standard_webhooks_library() {
    let (seen, url) = start_webhook(1).await;
    let secret = webhook_secret();
    let dir = tempfile::tempdir().unwrap();
    let (_tool, tool_base) = start_tool().await;
    let keys = Arc::new(Keys::new());
    let extra = format!(
        "approvals: {{ webhook_url: {url:?}, webhook_secret: \"env:TEST_WEBHOOK_SECRET\" }}\n"
    );
    let config = write_config(dir.path(), &keys, &tool_base, "", &extra);
    let gw = Gateway::spawn_with(Vec::new(), dir.path(), &config, keys, |command| {
        command.env("TEST_WEBHOOK_SECRET", &secret);
    });
    let (key, token) = gw.session("exec-signed").await;
    let id = requested(&call(&gw, &key, &token, "pay.send", payment(5)).await);
    until(
        Duration::from_secs(10),
        "a failure, then a delivery",
        || async { seen.lock().unwrap().len() == 2 },
    )
    .await;
    let deliveries = seen.lock().unwrap().clone();

    // One delivery, tried twice: the same id on both tries, each try signed and verified.
    let delivery_id = deliveries[0].header("webhook-id");
    assert!(delivery_id.starts_with("msg_"), "{delivery_id}");
    assert_eq!(deliveries[1].header("webhook-id"), delivery_id);
    for delivery in &deliveries {
        assert!(delivery.header("webhook-signature").starts_with("v1,"));
        let (verified, verdict) = verify_with_standardwebhooks(dir.path(), &secret, delivery);
        assert!(verified, "{verdict}");
        assert_eq!(verdict, format!("verified {id}"));
    }

    // A body changed on the way, or another secret, fails the receiver's check.
    let mut tampered = deliveries[1].clone();
    tampered.body = tampered.body.replace("pay.send", "pay.sent");
    assert_ne!(tampered.body, deliveries[1].body);
    let (verified, verdict) = verify_with_standardwebhooks(dir.path(), &secret, &tampered);
    assert!(!verified, "{verdict}");
    assert_eq!(verdict, "refused: No matching signature found");
    let (verified, verdict) =
        verify_with_standardwebhooks(dir.path(), &webhook_secret(), &deliveries[1]);
    assert!(!verified, "{verdict}");
}

#[test]
fn a_malformed_webhook_secret_stops_start_up_without_being_quoted() {
    let dir = tempfile::tempdir().unwrap();
    let keys = Keys::new();
    let extra = "approvals: { webhook_url: \"http://127.0.0.1:9/hook\", webhook_secret: \"whsec_VG9wU2VjcmV0\" }\n";
    let config = write_config(dir.path(), &keys, "http://127.0.0.1:9", "", extra);
    assert_refused_at_start_up(
        &config,
        "approvals.webhook_secret: must encode 24 to 64 random bytes",
        "VG9wU2VjcmV0",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_requests_and_a_grant_runs_once() {
    let db = TestDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();
    let (replicas, tool) = start_replicas(dir.path(), 2, &db.url).await;
    let (a, b) = (&replicas[0], &replicas[1]);
    let (key, token) = a.session("exec-shared").await;

    let id = requested(&call(a, &key, &token, "pay.send", payment(11)).await);
    assert_eq!(
        requested(&call(b, &key, &token, "pay.send", payment(11)).await),
        id
    );
    let (status, body) = decide(b, &id, "grant", json!({})).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = decide(a, &id, "grant", json!({})).await;
    assert_eq!((status, code(&body)), (409, 6004));

    // The same call on both replicas at once: one runs, the other must ask again.
    let (on_a, on_b) = tokio::join!(
        call(a, &key, &token, "pay.send", payment(11)),
        call(b, &key, &token, "pay.send", payment(11))
    );
    let answers = [on_a, on_b];
    assert_eq!(
        answers.iter().filter(|(status, _)| *status == 200).count(),
        1,
        "{answers:?}"
    );
    let refused = answers.iter().find(|(status, _)| *status != 200).unwrap();
    assert_ne!(requested(refused), id);
    assert_eq!(tool.count(), 1);
    assert_eq!(approval(a, &id).await["status"], "used");
}
