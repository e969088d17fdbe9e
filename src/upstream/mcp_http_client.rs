//! The HTTP client under rmcp's Streamable HTTP transport.
//!
//! rmcp's own reqwest client passes a JSON-RPC error that arrives with HTTP 400 on to the caller as
//! the server's answer. The reference MCP servers answer a request that carries an unknown
//! `Mcp-Session-Id` (after a server restart) exactly that way, so a refused session would reach the
//! agent as the tool's error, and be committed as the call's outcome although the tool never ran.
//! This client does the POST itself and reports HTTP 400 and 404 to a request sent inside a session
//! as an expired session: rmcp then re-initialises once and re-sends the request, which is safe
//! because a 4xx means the server did not process it. GET (the server's event stream) and DELETE
//! are rmcp's own, but every message that comes back, in a JSON body or an SSE event of either, is
//! checked for inexact numbers before rmcp reads it (SPEC 20 rule 5, see `mcp_numbers`).

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::stream::StreamExt;
use reqwest::header::{HeaderName, HeaderValue, ACCEPT, CONTENT_TYPE, WWW_AUTHENTICATE};
use reqwest::StatusCode;
use rmcp::model::{ClientJsonRpcMessage, JsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::common::client_side_sse::BoxedSseResponse;
use rmcp::transport::streamable_http_client::{
    AuthRequiredError, StreamableHttpClient, StreamableHttpError, StreamableHttpPostResponse,
    StreamableHttpResponseLimits,
};
use sse_stream::{Sse, SseStream};

use super::mcp_numbers::{check_message, InexactNumbers};
use crate::outbound::{read_capped, CappedReadError};

type PostResult = Result<StreamableHttpPostResponse, StreamableHttpError<reqwest::Error>>;

const SESSION_ID_HEADER: &str = "mcp-session-id";

/// Custom headers that rmcp must not be asked to override (it sets them itself). The protocol
/// version header is injected by rmcp's worker through the custom headers, so it passes.
const RESERVED_CUSTOM_HEADERS: &[&str] = &["accept", SESSION_ID_HEADER, "last-event-id"];

#[derive(Clone)]
pub(crate) struct SessionAwareClient {
    http: reqwest::Client,
    numbers: Arc<dyn InexactNumbers>,
}

impl SessionAwareClient {
    pub(crate) fn new(http: reqwest::Client, numbers: Arc<dyn InexactNumbers>) -> Self {
        Self { http, numbers }
    }

    /// Reads a JSON body within `max` bytes, checking its numbers.
    async fn read_json_body(
        &self,
        response: reqwest::Response,
        max: usize,
    ) -> Result<Vec<u8>, StreamableHttpError<reqwest::Error>> {
        let body = read_capped(response, max as u64)
            .await
            .map_err(|e| match e {
                CappedReadError::TooLarge => {
                    StreamableHttpError::ResponseBodyTooLarge { max_size: max }
                }
                CappedReadError::Body(e) => StreamableHttpError::Client(e),
            })?;
        check_message(&body, self.numbers.as_ref());
        Ok(body)
    }

    /// Checks the numbers of each event's message as rmcp reads the stream.
    fn checked_sse(&self, events: BoxedSseResponse) -> BoxedSseResponse {
        let numbers = self.numbers.clone();
        events
            .inspect(move |event| {
                if let Ok(Sse {
                    data: Some(message),
                    ..
                }) = event
                {
                    check_message(message.as_bytes(), numbers.as_ref());
                }
            })
            .boxed()
    }

    async fn post(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> PostResult {
        let mut request = self
            .http
            .post(uri.as_ref())
            .header(ACCEPT, "application/json, text/event-stream");
        if let Some(token) = auth_header {
            request = request.bearer_auth(token);
        }
        for (name, value) in custom_headers {
            if RESERVED_CUSTOM_HEADERS.contains(&name.as_str()) {
                return Err(StreamableHttpError::ReservedHeaderConflict(
                    name.to_string(),
                ));
            }
            request = request.header(name, value);
        }
        let in_session = session_id.is_some();
        if let Some(session_id) = session_id {
            request = request.header(SESSION_ID_HEADER, session_id.as_ref());
        }
        let response = request.json(&message).send().await?;
        let status = response.status();
        if status == StatusCode::ACCEPTED || status == StatusCode::NO_CONTENT {
            return Ok(StreamableHttpPostResponse::Accepted);
        }
        if in_session && (status == StatusCode::NOT_FOUND || status == StatusCode::BAD_REQUEST) {
            // The server refused the request before processing it: 404 is the spec's "unknown
            // session", 400 is what servers built on the reference SDK answer after a restart.
            tracing::info!(%status, "the MCP server refused the session; re-initialising");
            return Err(StreamableHttpError::SessionExpired);
        }
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            let challenge = response
                .headers()
                .get(WWW_AUTHENTICATE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            return Err(StreamableHttpError::AuthRequired(AuthRequiredError::new(
                challenge,
            )));
        }
        let session_header = response
            .headers()
            .get(SESSION_ID_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let media_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .map(|v| v.trim().to_ascii_lowercase());
        let expects_reply = matches!(message, ClientJsonRpcMessage::Request(_));

        if status.is_redirection() {
            let why = crate::outbound::failed_status(status, response.headers());
            return Err(StreamableHttpError::UnexpectedServerResponse(why.into()));
        }
        if !status.is_success() {
            // A JSON-RPC error in a failed exchange (for example HTTP 500) is the server's answer;
            // anything else is not a JSON-RPC response.
            if media_type.as_deref() == Some("application/json") {
                let body = self
                    .read_json_body(response, limits.max_json_response_size)
                    .await?;
                if let Ok(error @ JsonRpcMessage::Error(_)) =
                    serde_json::from_slice::<ServerJsonRpcMessage>(&body)
                {
                    return Ok(StreamableHttpPostResponse::Json(error, session_header));
                }
            }
            return Err(StreamableHttpError::UnexpectedServerResponse(
                format!("HTTP {status} without a JSON-RPC error").into(),
            ));
        }
        match media_type.as_deref() {
            Some("text/event-stream") => Ok(StreamableHttpPostResponse::Sse(
                self.checked_sse(bounded_sse(response, limits.max_sse_event_size)),
                session_header,
            )),
            Some("application/json") => {
                let body = self
                    .read_json_body(response, limits.max_json_response_size)
                    .await?;
                match serde_json::from_slice::<ServerJsonRpcMessage>(&body) {
                    Ok(parsed) => Ok(StreamableHttpPostResponse::Json(parsed, session_header)),
                    // A notification needs no reply, so an unreadable body does not matter.
                    Err(_) if !expects_reply => Ok(StreamableHttpPostResponse::Accepted),
                    Err(e) => Err(StreamableHttpError::Deserialize(e)),
                }
            }
            _ if !expects_reply => Ok(StreamableHttpPostResponse::Accepted),
            _ => Err(StreamableHttpError::UnexpectedContentType(media_type)),
        }
    }
}

/// An SSE event larger than the limit ends the stream with this error instead of growing a buffer.
#[derive(Debug, thiserror::Error)]
enum SseBodyError {
    #[error("an SSE event exceeded {0} bytes")]
    EventTooLarge(usize),
    #[error(transparent)]
    Body(#[from] reqwest::Error),
}

/// Counts the bytes of the event in progress; an empty line ends an event.
struct EventSizeLimit {
    limit: usize,
    event_len: usize,
    line_len: usize,
    previous: u8,
}

impl EventSizeLimit {
    fn feed(&mut self, chunk: &[u8]) -> Result<(), SseBodyError> {
        for &byte in chunk {
            let is_break = byte == b'\n' || byte == b'\r';
            // "\r\n" is one line break, not an empty line.
            let second_half_of_crlf = byte == b'\n' && self.previous == b'\r';
            self.previous = byte;
            if second_half_of_crlf {
                continue;
            }
            if is_break {
                if self.line_len == 0 {
                    self.event_len = 0;
                }
                self.line_len = 0;
                continue;
            }
            self.line_len += 1;
            self.event_len += 1;
            if self.event_len > self.limit {
                return Err(SseBodyError::EventTooLarge(self.limit));
            }
        }
        Ok(())
    }
}

fn bounded_sse(response: reqwest::Response, max_event: usize) -> BoxedSseResponse {
    let limit = EventSizeLimit {
        limit: max_event,
        event_len: 0,
        line_len: 0,
        previous: 0,
    };
    // `scan` ends the byte stream right after the first error, so nothing is read past it.
    let bytes = response
        .bytes_stream()
        .scan((limit, false), |(limit, failed), chunk| {
            let item = if *failed {
                None
            } else {
                let checked: Result<Bytes, SseBodyError> = chunk
                    .map_err(SseBodyError::from)
                    .and_then(|bytes| limit.feed(&bytes).map(|()| bytes));
                *failed = checked.is_err();
                Some(checked)
            };
            std::future::ready(item)
        });
    SseStream::from_bytes_stream(bytes).boxed()
}

impl StreamableHttpClient for SessionAwareClient {
    type Error = reqwest::Error;

    async fn post_message(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> PostResult {
        let limits = StreamableHttpResponseLimits::default();
        self.post(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            limits,
        )
        .await
    }

    async fn post_message_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> PostResult {
        let mut limits = StreamableHttpResponseLimits::default();
        limits.max_sse_event_size = max_sse_event_size;
        self.post(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            limits,
        )
        .await
    }

    async fn post_message_with_response_limits(
        &self,
        uri: Arc<str>,
        message: ClientJsonRpcMessage,
        session_id: Option<Arc<str>>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        limits: StreamableHttpResponseLimits,
    ) -> PostResult {
        self.post(
            uri,
            message,
            session_id,
            auth_header,
            custom_headers,
            limits,
        )
        .await
    }

    async fn delete_session(
        &self,
        uri: Arc<str>,
        session_id: Arc<str>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<(), StreamableHttpError<reqwest::Error>> {
        self.http
            .delete_session(uri, session_id, auth_header, custom_headers)
            .await
    }

    async fn get_stream(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
    ) -> Result<BoxedSseResponse, StreamableHttpError<reqwest::Error>> {
        let events = self
            .http
            .get_stream(uri, session_id, last_event_id, auth_header, custom_headers)
            .await?;
        Ok(self.checked_sse(events))
    }

    async fn get_stream_with_max_sse_event_size(
        &self,
        uri: Arc<str>,
        session_id: Option<Arc<str>>,
        last_event_id: Option<String>,
        auth_header: Option<String>,
        custom_headers: HashMap<HeaderName, HeaderValue>,
        max_sse_event_size: usize,
    ) -> Result<BoxedSseResponse, StreamableHttpError<reqwest::Error>> {
        let events = self
            .http
            .get_stream_with_max_sse_event_size(
                uri,
                session_id,
                last_event_id,
                auth_header,
                custom_headers,
                max_sse_event_size,
            )
            .await?;
        Ok(self.checked_sse(events))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_limit_resets_on_empty_lines_only() {
        let mut limit = EventSizeLimit {
            limit: 10,
            event_len: 0,
            line_len: 0,
            previous: 0,
        };
        assert!(limit.feed(b"data: 1234\n\n").is_ok());
        assert!(limit.feed(b"data: 1234\r\n\r\n").is_ok());
        // Two lines without an empty line between them are one event.
        let mut limit = EventSizeLimit {
            limit: 10,
            event_len: 0,
            line_len: 0,
            previous: 0,
        };
        assert!(limit.feed(b"data: 12\r\n").is_ok());
        assert!(matches!(
            limit.feed(b"data: 34\r\n"),
            Err(SseBodyError::EventTooLarge(10))
        ));
    }
}
