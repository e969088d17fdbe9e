//! The MCP Streamable HTTP endpoint and the RFC 9728 metadata (SPEC 17). Every POST is checked in this
//! order, and each refusal runs nothing: the `Origin`, a token in the query, the bearer token and its
//! scopes, a `people` rule, the body (size, JSON, one message), the `Mcp-Session-Id`; then the method.
//! Each request gets one `application/json` answer: the endpoint offers no SSE stream.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{FromRef, Request};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde_json::{json, Map, Value};

use super::people::{NoSession, Parts};
use super::McpServer;
use crate::api::body::{read_body, BodyError};
use crate::error::{ApiError, Code};
use crate::gateway::Gateway;
use crate::mcp_reply::{self, Answer};
use crate::pipeline::Outcome;
use crate::token::{AccessClaims, AccessRefusal};

/// The protocol versions this endpoint speaks; a host asking another is answered with the first.
const PROTOCOL_VERSIONS: [&str; 2] = ["2025-06-18", "2025-11-25"];
const SESSION_HEADER: &str = "mcp-session-id";
const VERSION_HEADER: &str = "mcp-protocol-version";
/// JSON-RPC's codes for a message that is not JSON, not a request, or names no method we have.
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;

/// The endpoint at `mcp_server.path` and the metadata at both well-known paths; none when it is off.
/// For any router whose state lends the gateway, which the endpoint's handlers take whole: each call
/// runs the pipeline.
pub fn routes<S>(gw: &Gateway) -> Router<S>
where
    Arc<Gateway>: FromRef<S>,
    S: Clone + Send + Sync + 'static,
{
    let Some(server) = &gw.mcp_server() else {
        return Router::new();
    };
    let well_known = "/.well-known/oauth-protected-resource";
    Router::new()
        .route(well_known, get(metadata))
        .route(&format!("{well_known}{}", server.path), get(metadata))
        .route(
            &server.path,
            axum::routing::post(post).get(no_stream).delete(no_stream),
        )
}

/// RFC 9728's document: public, so any origin may read it.
async fn metadata(axum::extract::State(gw): axum::extract::State<Arc<Gateway>>) -> Response {
    let Some(server) = &gw.mcp_server() else {
        return StatusCode::NOT_FOUND.into_response();
    };
    (
        [(header::ACCESS_CONTROL_ALLOW_ORIGIN, "*")],
        axum::Json(server.metadata.clone()),
    )
        .into_response()
}

/// GET (a stream the server would push on) and DELETE (ending a session the server keeps no state for)
/// are not offered, as MCP allows.
async fn no_stream() -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        [(header::ALLOW, "POST")],
        axum::Json(rpc_error(
            Value::Null,
            INVALID_REQUEST,
            "this endpoint answers POST only: every answer comes in the POST's response",
        )),
    )
        .into_response()
}

async fn post(
    axum::extract::State(gw): axum::extract::State<Arc<Gateway>>,
    request: Request,
) -> Response {
    let Some(server) = &gw.mcp_server() else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let (parts, body) = request.into_parts();
    let admitted = match admit(server, &parts).await {
        Ok(admitted) => admitted,
        Err(refusal) => return refusal,
    };
    let message = match read_message(&gw, body).await {
        Ok(message) => message,
        Err(refusal) => return refusal,
    };
    if !message.contains_key("method") || !message.contains_key("id") {
        // A notification, or the host's answer to a request of ours (we send none): nothing to do.
        return StatusCode::ACCEPTED.into_response();
    }
    let id = message["id"].clone();
    let method = message["method"].as_str().unwrap_or_default().to_owned();
    if method == "initialize" {
        return initialize(id, &message, &admitted.person);
    }
    if let Some(refusal) = session_id_refusal(&parts.headers, &admitted.person) {
        return refusal;
    }
    let answer = match method.as_str() {
        "ping" => Ok(json!({})),
        "tools/list" | "tools/call" => run(&gw, server, admitted, &message, &method).await,
        other => Err(rpc_error_body(
            METHOD_NOT_FOUND,
            &format!("method {other:?} is not offered: this server has tools only"),
        )),
    };
    let answer = match answer {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err(error) => json!({"jsonrpc": "2.0", "id": id, "error": error}),
    };
    axum::Json(answer).into_response()
}

/// A request that passed the checks before its body: whose token, and which context their rule names.
struct Admitted {
    person: Arc<AccessClaims>,
    context: String,
}

/// The `Origin`, a token in the query, the bearer token and its scopes, and the `people` rules.
async fn admit(
    server: &McpServer,
    parts: &axum::http::request::Parts,
) -> Result<Admitted, Response> {
    if let Some(origin) = parts.headers.get(header::ORIGIN) {
        let known = origin
            .to_str()
            .is_ok_and(|origin| server.origins.iter().any(|o| o == origin));
        if !known {
            return Err(forbidden(
                "the request's Origin is not this server's nor one of mcp_server.allowed_origins",
            ));
        }
    }
    if token_in_query(parts.uri.query()) {
        return Err(server.challenge(
            StatusCode::BAD_REQUEST,
            "error=\"invalid_request\", error_description=\"send the token in the Authorization header, never in the URL\"",
            "a token in the query string is refused: send it as Authorization: Bearer",
        ));
    }
    let Some(token) = bearer(&parts.headers) else {
        return Err(server.challenge(
            StatusCode::UNAUTHORIZED,
            "",
            "this endpoint needs Authorization: Bearer with an access token for it",
        ));
    };
    let person = match server.tokens.verify(token, crate::clock::now_secs()).await {
        Ok(person) => person,
        Err(AccessRefusal::InvalidToken(why)) => {
            let description = format!(
                "error=\"invalid_token\", error_description=\"{}\"",
                quotable(&why)
            );
            return Err(server.challenge(StatusCode::UNAUTHORIZED, &description, &why));
        }
        Err(AccessRefusal::InsufficientScope(why)) => {
            let scope = format!(
                "error=\"insufficient_scope\", scope=\"{}\"",
                server.scopes_required
            );
            return Err(server.challenge(StatusCode::FORBIDDEN, &scope, &why));
        }
    };
    let Some(context) = server.people.context_for(&person.claims) else {
        return Err(forbidden(
            "no mcp_server.people rule matches this person: ask an administrator for access",
        ));
    };
    let context = context.to_owned();
    Ok(Admitted { person, context })
}

impl McpServer {
    /// A refusal with `WWW-Authenticate: Bearer` naming the metadata (RFC 6750 3, RFC 9728 5.1).
    fn challenge(&self, status: StatusCode, params: &str, message: &str) -> Response {
        let mut value = String::from("Bearer ");
        if !params.is_empty() {
            value.push_str(params);
            value.push_str(", ");
        }
        value.push_str(&format!("resource_metadata=\"{}\"", self.metadata_url));
        let mut response = refusal(status, message);
        if let Ok(value) = HeaderValue::from_str(&value) {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, value);
        }
        response
    }
}

/// `access_token` among the query's names (RFC 6750 2.3, which MCP forbids).
fn token_in_query(query: Option<&str>) -> bool {
    query.is_some_and(|query| {
        url::form_urlencoded::parse(query.as_bytes()).any(|(name, _)| name == "access_token")
    })
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Text safe inside a quoted header parameter: no quote, backslash or control character.
fn quotable(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c == '"' || c == '\\' || !(' '..='~').contains(&c) {
                '\''
            } else {
                c
            }
        })
        .collect()
}

/// One JSON-RPC request or notification, read within `limits.max_body_bytes`.
async fn read_message(gw: &Gateway, body: Body) -> Result<Map<String, Value>, Response> {
    let limits = &gw.config().limits;
    let timeout = Duration::from_secs(limits.body_read_timeout_secs);
    let bytes = match read_body(body, limits.max_body_bytes, timeout).await {
        Ok(bytes) => bytes,
        Err(BodyError::TooLarge) => {
            let why = format!(
                "the body is larger than limits.max_body_bytes ({} bytes)",
                limits.max_body_bytes
            );
            return Err(refusal(StatusCode::PAYLOAD_TOO_LARGE, &why));
        }
        Err(BodyError::TimedOut) => {
            return Err(refusal(
                StatusCode::REQUEST_TIMEOUT,
                "the body did not arrive within limits.body_read_timeout_secs",
            ))
        }
    };
    let message = match crate::strict_json::parse_strict_json(&bytes) {
        Ok(message) => message,
        Err(why) => {
            let error = rpc_error(
                Value::Null,
                PARSE_ERROR,
                &format!("the body is not JSON: {why}"),
            );
            return Err((StatusCode::BAD_REQUEST, axum::Json(error)).into_response());
        }
    };
    match message {
        Value::Object(message) if valid_message(&message) => Ok(message),
        Value::Array(_) => Err(refusal(
            StatusCode::BAD_REQUEST,
            "JSON-RPC batches are not accepted: send one message per request",
        )),
        _ => Err(refusal(
            StatusCode::BAD_REQUEST,
            "the body is not a JSON-RPC 2.0 message (jsonrpc \"2.0\", a string method, an id that is a string or a number)",
        )),
    }
}

/// `jsonrpc: "2.0"`, and a string `method` or a result or error; an `id` that is a string or number.
fn valid_message(message: &Map<String, Value>) -> bool {
    let id_ok = match message.get("id") {
        None => true,
        Some(id) => id.is_string() || id.is_number(),
    };
    let kind_ok = match message.get("method") {
        Some(method) => method.is_string(),
        None => message.contains_key("result") || message.contains_key("error"),
    };
    message.get("jsonrpc") == Some(&json!("2.0")) && id_ok && kind_ok
}

/// `initialize`: the version, our tools-only capabilities, and a new `Mcp-Session-Id` bound to the person.
fn initialize(id: Value, message: &Map<String, Value>, person: &AccessClaims) -> Response {
    let asked = message
        .get("params")
        .and_then(|params| params.get("protocolVersion"))
        .and_then(Value::as_str);
    let version = PROTOCOL_VERSIONS
        .into_iter()
        .find(|known| Some(*known) == asked)
        .unwrap_or(PROTOCOL_VERSIONS[0]);
    let result = json!({
        "protocolVersion": version,
        "capabilities": {"tools": {}},
        "serverInfo": {"name": "sealgate", "version": env!("CARGO_PKG_VERSION")},
    });
    let session_id = match new_session_id(person) {
        Ok(id) => id,
        Err(why) => return refusal(StatusCode::SERVICE_UNAVAILABLE, &why),
    };
    (
        [(SESSION_HEADER, session_id)],
        axum::Json(json!({"jsonrpc": "2.0", "id": id, "result": result})),
    )
        .into_response()
}

/// 256 random bits, then a dot and 128 bits binding them to the person: no state to keep, and a replica
/// that never saw the id still knows whose it is.
fn new_session_id(person: &AccessClaims) -> Result<String, String> {
    let random = crate::envelope::random_secret()?;
    let binding = session_binding(&random, person);
    Ok(format!("{random}.{binding}"))
}

fn session_binding(random: &str, person: &AccessClaims) -> String {
    let digest = crate::envelope::jcs_sha256_hex(&json!([random, person.iss, person.sub]));
    digest[..32].to_owned()
}

/// Every request after `initialize` carries its `Mcp-Session-Id` (400 without), which must be this
/// person's (404 otherwise: the host then starts a new session, as MCP says). None: it is.
fn session_id_refusal(headers: &HeaderMap, person: &AccessClaims) -> Option<Response> {
    if let Some(version) = headers.get(VERSION_HEADER) {
        let known = version
            .to_str()
            .is_ok_and(|version| PROTOCOL_VERSIONS.contains(&version));
        if !known {
            return Some(refusal(
                StatusCode::BAD_REQUEST,
                &format!(
                    "MCP-Protocol-Version must be one of {}",
                    PROTOCOL_VERSIONS.join(", ")
                ),
            ));
        }
    }
    let Some(presented) = headers.get(SESSION_HEADER) else {
        return Some(refusal(
            StatusCode::BAD_REQUEST,
            "Mcp-Session-Id is missing: send initialize first",
        ));
    };
    let bound = presented
        .to_str()
        .ok()
        .and_then(|presented| presented.split_once('.'))
        .is_some_and(|(random, binding)| {
            random.len() >= 43 && session_binding(random, person) == binding
        });
    (!bound).then(|| {
        refusal(
            StatusCode::NOT_FOUND,
            "no such MCP session for this person: send initialize again",
        )
    })
}

/// `tools/list` or `tools/call` through the pipeline, under the person's session, on a task of its own
/// holding a call slot (as `/v1/invoke`): a host that hangs up drops nothing of the call.
async fn run(
    gw: &Arc<Gateway>,
    server: &McpServer,
    admitted: Admitted,
    message: &Map<String, Value>,
    method: &str,
) -> Result<Value, Value> {
    let parts = Parts {
        store: gw.store().as_ref(),
        sessions: gw.sessions(),
        contexts: gw.contexts(),
        audit: gw.audit(),
    };
    let session = match server
        .people
        .session_of(&parts, &admitted.person, &admitted.context)
        .await
    {
        Ok(session) => session,
        Err(no_session) => return answer(method, refused_person(no_session)),
    };
    let payload = pipeline_payload(message, method);
    let Ok(slot) = gw.call_slots().clone().try_acquire_owned() else {
        let error = ApiError::new(
            Code::GatewayOverloaded,
            "more calls are in progress than limits.max_concurrent_calls",
        );
        return answer(method, Answer::Refused(error_object(&error)));
    };
    // Boxed, as `/v1/invoke`'s: each wrapper on the way into the task would copy the pipeline's future.
    let call = {
        let gw = gw.clone();
        tokio::spawn(crate::trace::carry(Box::pin(async move {
            let outcome =
                crate::pipeline::call_as_person(&gw, admitted.person, session, &payload).await;
            drop(slot);
            outcome
        })))
    };
    let outcome = match call.await {
        Ok(outcome) => outcome,
        Err(failed) => std::panic::resume_unwind(failed.into_panic()),
    };
    let reply = match outcome {
        Outcome::Success { payload, receipt } => Answer::Success { payload, receipt },
        Outcome::Refused { error, .. } => Answer::Refused(error_object(&error)),
    };
    answer(method, reply)
}

/// The host's MCP answer, as `sealgate connect` would give it (SPEC 15): a result, or a JSON-RPC error.
fn answer(method: &str, reply: Answer) -> Result<Value, Value> {
    let shaped = if method == "tools/list" {
        mcp_reply::tool_list(reply).map(|list| serde_json::to_value(list).unwrap_or_default())
    } else {
        mcp_reply::tool_result(reply).map(|result| serde_json::to_value(result).unwrap_or_default())
    };
    shaped.map_err(|error| serde_json::to_value(error).unwrap_or_default())
}

/// The JSON-RPC request the host's call amounts to, as an envelope's payload would carry it: of the
/// host's `params._meta` only `idempotency_key` (SPEC 15, 17).
fn pipeline_payload(message: &Map<String, Value>, method: &str) -> Value {
    let mut payload = json!({"jsonrpc": "2.0", "id": message["id"], "method": method});
    if method == "tools/call" {
        let params = message.get("params").cloned().unwrap_or_else(|| json!({}));
        let mut forwarded = Map::new();
        for key in ["name", "arguments"] {
            if let Some(value) = params.get(key) {
                forwarded.insert(key.to_owned(), value.clone());
            }
        }
        if let Some(key) = params
            .get("_meta")
            .and_then(|meta| meta.get("idempotency_key"))
        {
            forwarded.insert("_meta".to_owned(), json!({"idempotency_key": key}));
        }
        payload["params"] = Value::Object(forwarded);
    }
    payload
}

/// Why a person has no session, as the pipeline would refuse a call.
fn refused_person(no_session: NoSession) -> Answer {
    let error = match no_session {
        NoSession::Revoked { until_ms } => ApiError::new(
            Code::SessionInactive,
            format!(
                "this person's session was revoked; a new one may start at {}",
                crate::clock::rfc3339_millis(until_ms)
            ),
        ),
        NoSession::NoContext(context) => ApiError::new(
            Code::ToolNotAllowed,
            format!("the people rule names the security context {context:?}, which does not exist"),
        ),
        NoSession::Store(why) => ApiError::new(Code::StoreUnavailable, why),
    };
    Answer::Refused(error_object(&error))
}

/// The SPEC error object (`code`, `name`, `message`, …) as the envelope endpoint's body carries it.
fn error_object(error: &ApiError) -> Value {
    error.body()["error"].clone()
}

fn rpc_error_body(code: i64, message: &str) -> Value {
    json!({"code": code, "message": message})
}

fn rpc_error(id: Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": rpc_error_body(code, message)})
}

/// An HTTP-level refusal: the status, and a JSON-RPC error that says why. The log line says why too:
/// the reasons name claims and keys, never a token.
fn refusal(status: StatusCode, message: &str) -> Response {
    tracing::info!(
        status = status.as_u16(),
        reason = message,
        "MCP request refused"
    );
    (
        status,
        axum::Json(rpc_error(Value::Null, INVALID_REQUEST, message)),
    )
        .into_response()
}

fn forbidden(message: &str) -> Response {
    refusal(StatusCode::FORBIDDEN, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn person(sub: &str) -> AccessClaims {
        AccessClaims {
            iss: "https://idp.example".into(),
            sub: sub.into(),
            client_id: None,
            jti: None,
            scopes: vec![],
            key_source: crate::token::KeySource::Fetched,
            claims: Map::new(),
        }
    }

    fn with_session(id: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(SESSION_HEADER, HeaderValue::from_str(id).unwrap());
        headers
    }

    #[test]
    fn a_session_id_is_bound_to_its_person() {
        let id = new_session_id(&person("pat")).unwrap();
        assert_eq!(id.len(), 43 + 1 + 32);
        assert!(session_id_refusal(&with_session(&id), &person("pat")).is_none());
        let other = session_id_refusal(&with_session(&id), &person("eve")).unwrap();
        assert_eq!(other.status(), StatusCode::NOT_FOUND);
        let missing = session_id_refusal(&HeaderMap::new(), &person("pat")).unwrap();
        assert_eq!(missing.status(), StatusCode::BAD_REQUEST);
        assert_ne!(new_session_id(&person("pat")).unwrap(), id, "random part");
        let forged = format!("{}.{}", "a".repeat(43), "0".repeat(32));
        assert!(session_id_refusal(&with_session(&forged), &person("pat")).is_some());
    }

    #[test]
    fn only_idempotency_key_of_the_hosts_meta_reaches_the_pipeline() {
        let message = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
            "name": "fs.read", "arguments": {"path": "/a"},
            "_meta": {"progressToken": 1, "idempotency_key": "k-1"}}});
        let payload = pipeline_payload(message.as_object().unwrap(), "tools/call");
        assert_eq!(
            payload,
            json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {
                "name": "fs.read", "arguments": {"path": "/a"}, "_meta": {"idempotency_key": "k-1"}}})
        );
    }

    #[test]
    fn a_token_in_the_query_is_found_and_quoted_text_is_made_safe() {
        assert!(token_in_query(Some("a=1&access_token=x")));
        assert!(!token_in_query(Some("token=x")));
        assert!(!token_in_query(None));
        assert_eq!(quotable("kid \"k\"\n"), "kid 'k''");
    }
}
