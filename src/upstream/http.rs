//! The `http` upstream kind: a plain JSON-RPC 2.0 endpoint that receives the `tools/call` request
//! as an HTTP POST and answers with the JSON-RPC response in the body.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderValue, ACCEPT};
use serde_json::{json, Map, Value};
use url::Url;

use super::jsonrpc::{parse_http_answer, ToolAnswer};
use super::UpstreamError;
use crate::outbound::{read_capped, CappedReadError};
use crate::redact;

/// Builds the HTTP client used for one upstream: no redirects (a redirect would carry the
/// credential headers to another place), no proxy from the environment (upstreams are contacted
/// directly, so their credentials never pass through a proxy the operator did not name).
pub(crate) fn build_client(timeout: Duration) -> Result<reqwest::Client, String> {
    crate::outbound::client_builder()
        .no_proxy()
        .connect_timeout(timeout)
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))
}

pub(crate) struct HttpUpstream {
    url: Url,
    headers: HeaderMap,
    timeout: Duration,
    client: reqwest::Client,
    /// JSON-RPC ids for the gateway's own requests (`tools/list`); a tool call keeps the caller's.
    next_id: AtomicU64,
}

impl HttpUpstream {
    pub(crate) fn new(url: Url, headers: HeaderMap, timeout: Duration) -> Result<Self, String> {
        Ok(Self {
            url,
            headers,
            timeout,
            client: build_client(timeout)?,
            next_id: AtomicU64::new(1),
        })
    }

    /// Calls `tool` (the tool's own name) with the caller's JSON-RPC id and idempotency key, as the
    /// agent sent them (SPEC 8: the request is POSTed as is), and returns its answer; the cap applies
    /// to the HTTP body as received. Of `params._meta` only the key goes on: it is bound to the call by
    /// its claim, while anything else there would reach the tool unchecked by the policy.
    pub(crate) async fn call(
        &self,
        tool: &str,
        caller_id: &Value,
        arguments: &Map<String, Value>,
        idempotency_key: Option<&str>,
        cap: u64,
    ) -> Result<ToolAnswer, UpstreamError> {
        let mut params = json!({"name": tool, "arguments": arguments});
        if let Some(key) = idempotency_key {
            params["_meta"] = json!({ "idempotency_key": key });
        }
        let (status_ok, body) = self
            .exchange(caller_id, "tools/call", Some(params), cap)
            .await?;
        parse_http_answer(&body, caller_id, status_ok)
    }

    /// `tools/list` on a plain JSON-RPC endpoint: many do not implement it, so anything other than
    /// a valid result with a `tools` array means "no tools" rather than a failure.
    pub(crate) async fn list_tools(&self, cap: u64) -> Result<Vec<Value>, UpstreamError> {
        let id = Value::from(self.next_id.fetch_add(1, Ordering::Relaxed));
        let (status_ok, body) = self.exchange(&id, "tools/list", None, cap).await?;
        match parse_http_answer(&body, &id, status_ok) {
            Ok(ToolAnswer::Result(Value::Object(mut result))) => match result.remove("tools") {
                Some(Value::Array(tools)) => Ok(tools),
                _ => Ok(Vec::new()),
            },
            _ => Ok(Vec::new()),
        }
    }

    /// One POST, bounded by the upstream's timeout from the first byte to the last.
    async fn exchange(
        &self,
        id: &Value,
        method: &str,
        params: Option<Value>,
        cap: u64,
    ) -> Result<(bool, Vec<u8>), UpstreamError> {
        let mut request = json!({"jsonrpc": "2.0", "id": id, "method": method});
        if let (Some(params), Value::Object(request)) = (params, &mut request) {
            request.insert("params".into(), params);
        }
        let exchange = async {
            let response = self
                .client
                .post(self.url.clone())
                .headers(self.headers.clone())
                .header(ACCEPT, HeaderValue::from_static("application/json"))
                .json(&request)
                .send()
                .await
                .map_err(classify_send_error)?;
            let status = response.status();
            // The tool may have seen the call before it pointed elsewhere: outcome unknown (5003).
            if status.is_redirection() {
                let why = crate::outbound::failed_status(status, response.headers());
                return Err(UpstreamError::BadResponse(why));
            }
            let body = read_capped(response, cap).await.map_err(|e| match e {
                CappedReadError::TooLarge => UpstreamError::TooLarge { limit: cap },
                CappedReadError::Body(e) => {
                    UpstreamError::Timeout(format!("the answer broke off: {}", redact::error(&e)))
                }
            })?;
            Ok((status.is_success(), body))
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(answer) => answer,
            Err(_) => Err(UpstreamError::Timeout(format!(
                "no complete answer within {} ms",
                self.timeout.as_millis()
            ))),
        }
    }
}

/// Sorts a failed send by whether any of the call can have reached the tool.
fn classify_send_error(e: reqwest::Error) -> UpstreamError {
    // A connect error (refused, DNS, TLS handshake) or a request that could not be built means
    // not one byte of the call left the gateway.
    if e.is_connect() || e.is_builder() {
        UpstreamError::Unavailable(format!("cannot reach the tool: {}", redact::error(&e)))
    } else {
        UpstreamError::Timeout(format!(
            "the call was sent but no answer came: {}",
            redact::error(&e)
        ))
    }
}
