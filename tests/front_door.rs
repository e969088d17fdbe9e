//! The HTTP front door through the real binary (SPEC 3 r3, 11 r3): a call whose client hangs up still runs
//! to its end, and clients that trickle bodies or never read their answers cannot stop the agent path.

mod common;

use std::io::Write;
use std::time::Duration;

use common::{code, until, Gateway};
use reqwest::Method;
use serde_json::{json, Value};

/// `host:port` of a gateway's base URL.
fn address(gw: &Gateway) -> String {
    gw.base.trim_start_matches("http://").to_string()
}

/// The raw HTTP/1.1 request of a signed call, as a client would write it on its own socket.
fn invoke_request(envelope: &Value) -> Vec<u8> {
    let body = serde_json::to_vec(envelope).unwrap();
    let mut request = format!(
        "POST /v1/invoke HTTP/1.1\r\nHost: gateway\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend(body);
    request
}

/// Every audit event of a session.
async fn session_events(gw: &Gateway, session: &str) -> Vec<Value> {
    let (status, page) = gw
        .admin(
            Method::GET,
            &format!("/v1/audit?session_id={session}&limit=1000"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{page}");
    page["items"].as_array().unwrap().clone()
}

fn has_event(events: &[Value], kind: &str) -> bool {
    events.iter().any(|e| e["type"] == kind)
}

#[tokio::test]
async fn a_client_that_hangs_up_does_not_cancel_its_approved_claimed_call() {
    let dir = tempfile::tempdir().unwrap();
    let (gw, tool) = Gateway::start(dir.path(), "").await;
    let spec = json!({"capabilities": [
        {"tool_pattern": "second.*", "claim": "explicit", "approval": {"required": true}},
    ]});
    let (status, body) = gw
        .admin(Method::PUT, "/v1/security-contexts/hangup", Some(spec))
        .await;
    assert!(status == 200 || status == 201, "{body}");
    let (key, token) = gw.session_in("exec-hangup", "hangup").await;
    let keyed = |id: u64| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"name": "second.pay", "arguments": {"cents": 5},
                          "_meta": {"idempotency_key": "pay-once"}}})
    };
    let (status, asked) = gw.call(&key, &token, keyed(1)).await;
    assert_eq!((status, code(&asked)), (403, 4003), "{asked}");
    let approval = asked["error"]["details"]["approval_id"].as_str().unwrap();
    let (status, granted) = gw
        .admin(
            Method::POST,
            &format!("/v1/approvals/{approval}/grant"),
            Some(json!({"reason": "ok"})),
        )
        .await;
    assert_eq!(status, 200, "{granted}");

    // The granted call is sent on a socket of its own, which closes while the tool holds the call.
    let envelope =
        sealgate::envelope::sign_envelope(&key, keyed(2), &token, sealgate::clock::now_secs());
    let mut client = std::net::TcpStream::connect(address(&gw)).unwrap();
    client.write_all(&invoke_request(&envelope)).unwrap();
    tool.until_held().await;
    drop(client);

    until(
        Duration::from_secs(10),
        "the abandoned call's ToolCallCompleted and ApprovalUsed",
        || async {
            let events = session_events(&gw, "exec-hangup").await;
            has_event(&events, "ToolCallCompleted") && has_event(&events, "ApprovalUsed")
        },
    )
    .await;
    // Its claim was settled: a keyed retry gets the stored answer and the tool does not run again.
    let (status, again) = gw.call(&key, &token, keyed(3)).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["receipt"]["claim"], "SKIP", "{again}");
    assert_eq!(tool.held.load(std::sync::atomic::Ordering::SeqCst), 1);
}
