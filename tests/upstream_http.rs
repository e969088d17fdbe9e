//! The `http` upstream kind against a small JSON-RPC server started in the test (axum, port 0).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use bytes::Bytes;
use sealgate::upstream::{UpstreamConfig, UpstreamError, Upstreams};
use serde_json::{json, Map, Value};

/// Answers `tools/call` with what it received (tool name, arguments, credential header) and
/// `tools/list` with one tool.
async fn echo(headers: HeaderMap, Json(request): Json<Value>) -> Json<Value> {
    let id = request["id"].clone();
    if request["method"] == "tools/list" {
        return Json(json!({"jsonrpc": "2.0", "id": id, "result": {"tools": [
            {"name": "echo", "description": "echoes", "inputSchema": {"type": "object"}}
        ]}}));
    }
    let api_key = headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("<none>");
    Json(json!({"jsonrpc": "2.0", "id": id, "result": {
        "tool": request["params"]["name"],
        "arguments": request["params"]["arguments"],
        "api_key": api_key,
    }}))
}

async fn not_json_rpc() -> &'static str {
    "hello, I am not JSON-RPC"
}

async fn tool_error(Json(request): Json<Value>) -> Response {
    let body = json!({"jsonrpc": "2.0", "id": request["id"], "error": {"code": -32001, "message": "tool failed", "data": {"why": "test"}}});
    (StatusCode::INTERNAL_SERVER_ERROR, Json(body)).into_response()
}

async fn server_error_page() -> Response {
    (StatusCode::BAD_GATEWAY, "<html>proxy error</html>").into_response()
}

/// A body that keeps coming: 64 KiB chunks, without a Content-Length, up to 64 MiB.
async fn endless() -> Response {
    let chunk = Bytes::from(vec![b' '; 64 * 1024]);
    let chunks = futures_util::stream::iter(
        (0..1024).map(move |_| Ok::<_, std::convert::Infallible>(chunk.clone())),
    );
    Response::new(Body::from_stream(chunks))
}

async fn slow(Json(request): Json<Value>) -> Json<Value> {
    tokio::time::sleep(Duration::from_secs(5)).await;
    Json(json!({"jsonrpc": "2.0", "id": request["id"], "result": {}}))
}

async fn start_server() -> String {
    let app = Router::new()
        .route("/rpc", post(echo))
        .route("/garbage", post(not_json_rpc))
        .route("/tool-error", post(tool_error))
        .route("/bad-gateway", post(server_error_page))
        .route("/endless", post(endless))
        .route("/slow", post(slow));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

fn upstreams(entries: Value) -> Upstreams {
    let cfg: BTreeMap<String, UpstreamConfig> = serde_json::from_value(entries).unwrap();
    Upstreams::new(&cfg).unwrap()
}

fn args(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

#[tokio::test]
async fn answer_comes_back_with_the_callers_id_and_credentials_are_sent() {
    let base = start_server().await;
    // The config loader resolves `env:NAME` before this module sees the value.
    let upstreams = upstreams(json!({
        "echo": {"http": {"url": format!("{base}/rpc")}, "timeout_ms": 5000,
                  "headers": {"X-Api-Key": "secret-from-env"}}
    }));
    let caller_id = json!("agent-call-42");
    let response = upstreams
        .call(
            "echo.say",
            &caller_id,
            &args(json!({"text": "hi"})),
            None,
            None,
        )
        .await
        .unwrap();
    assert_eq!(
        response,
        json!({"jsonrpc": "2.0", "id": "agent-call-42", "result": {
            "tool": "say", "arguments": {"text": "hi"}, "api_key": "secret-from-env"
        }})
    );
    // A name without a dot is both the upstream and the tool.
    let response = upstreams
        .call("echo", &json!(7), &Map::new(), None, Some(10_000))
        .await
        .unwrap();
    assert_eq!(response["id"], json!(7));
    assert_eq!(response["result"]["tool"], json!("echo"));
    assert_eq!(response["result"]["arguments"], json!({}));
}

#[tokio::test]
async fn tools_list_is_routed_and_cached() {
    let base = start_server().await;
    let upstreams = upstreams(json!({
        "plain": {"http": {"url": format!("{base}/rpc")}},
        "garbled": {"http": {"url": format!("{base}/garbage")}},
    }));
    let listed = upstreams.list_tools().await;
    let tools = listed.tools;
    let names: Vec<&str> = tools.iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names, vec!["plain.echo"]);
    assert_eq!(tools[0]["description"], json!("echoes"));
    // A plain JSON-RPC endpoint need not list tools: one that answers something else has none, and is
    // not an upstream that failed.
    assert!(listed.left_out.is_empty());
    assert_eq!(upstreams.list_tools().await.tools, tools);
}

#[tokio::test]
async fn an_answer_that_is_not_json_rpc_is_a_bad_response() {
    let base = start_server().await;
    let upstreams = upstreams(json!({
        "garbled": {"http": {"url": format!("{base}/garbage")}},
        "proxy": {"http": {"url": format!("{base}/bad-gateway")}},
    }));
    let err = upstreams
        .call("garbled.x", &json!(1), &Map::new(), None, None)
        .await
        .unwrap_err();
    assert!(matches!(err, UpstreamError::BadResponse(_)), "{err:?}");
    assert_eq!(err.code(), 5003);
    let err = upstreams
        .call("proxy.x", &json!(1), &Map::new(), None, None)
        .await
        .unwrap_err();
    assert!(matches!(err, UpstreamError::BadResponse(_)), "{err:?}");
}

#[tokio::test]
async fn a_json_rpc_error_is_an_answer_even_with_an_error_status() {
    let base = start_server().await;
    let upstreams = upstreams(json!({"failing": {"http": {"url": format!("{base}/tool-error")}}}));
    let response = upstreams
        .call("failing.x", &json!({"n": 1}), &Map::new(), None, None)
        .await
        .unwrap();
    assert_eq!(
        response,
        json!({"jsonrpc": "2.0", "id": {"n": 1}, "error": {"code": -32001, "message": "tool failed", "data": {"why": "test"}}})
    );
}

#[tokio::test]
async fn a_streaming_answer_over_the_cap_is_too_large() {
    let base = start_server().await;
    let upstreams = upstreams(
        json!({"big": {"http": {"url": format!("{base}/endless")}, "timeout_ms": 10000}}),
    );
    let started = Instant::now();
    let err = upstreams
        .call("big.x", &json!(1), &Map::new(), None, Some(100_000))
        .await
        .unwrap_err();
    assert!(
        matches!(err, UpstreamError::TooLarge { limit: 100_000 }),
        "{err:?}"
    );
    assert_eq!(err.code(), 2007);
    // It stopped reading at the cap instead of draining 64 MiB.
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn a_slow_answer_times_out() {
    let base = start_server().await;
    let upstreams =
        upstreams(json!({"slow": {"http": {"url": format!("{base}/slow")}, "timeout_ms": 300}}));
    let started = Instant::now();
    let err = upstreams
        .call("slow.x", &json!(1), &Map::new(), None, None)
        .await
        .unwrap_err();
    assert!(matches!(err, UpstreamError::Timeout(_)), "{err:?}");
    assert_eq!(err.code(), 5002);
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[tokio::test]
async fn a_closed_port_is_unavailable() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let upstreams = upstreams(
        json!({"gone": {"http": {"url": format!("http://127.0.0.1:{port}/rpc")}, "timeout_ms": 2000}}),
    );
    let err = upstreams
        .call("gone.x", &json!(1), &Map::new(), None, None)
        .await
        .unwrap_err();
    assert!(matches!(err, UpstreamError::Unavailable(_)), "{err:?}");
    assert_eq!(err.code(), 5001);
    // A failing upstream is left out of the tool list instead of failing it, with a warning.
    let listed = upstreams.list_tools().await;
    assert!(listed.tools.is_empty());
    assert_eq!(listed.left_out.len(), 1);
}
