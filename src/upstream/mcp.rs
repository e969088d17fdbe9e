//! The `mcp` upstream kind: the gateway as an MCP client (rmcp), over Streamable HTTP or over the
//! stdio of a child process.
//!
//! One connection per upstream is shared by all concurrent calls (rmcp's peer is a cheap handle).
//! It is opened on first use; when it has died (the child exited, the transport closed) the next
//! call opens a new one, with a growing pause between failed starts. Only one start runs at a time.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use process_wrap::tokio::{CommandWrap, KillOnDrop, ProcessGroup};
use reqwest::header::HeaderMap;
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, ClientCapabilities, ClientConfig, ClientJsonRpcMessage,
    ClientRequest, Implementation, RequestId, ServerJsonRpcMessage, ServerResult,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RunningService, ServiceError};
use rmcp::transport::streamable_http_client::{
    StreamableHttpClientTransportConfig, StreamableHttpError,
};
use rmcp::transport::{StreamableHttpClientTransport, Transport};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{Map, Value};
use url::Url;

use super::config::StdioCommand;
use super::health::{Health, Start, UpstreamState};
use super::http::build_client;
use super::jsonrpc::{error_object, ToolAnswer};
use super::mcp_http_client::SessionAwareClient;
use super::mcp_numbers::InexactNumbers;
use super::mcp_stdio::ChildTransport;
use super::stderr::StderrLog;
use super::{UpstreamError, HARD_MAX_RESPONSE_BYTES};
use crate::redact;

/// Variables a stdio tool inherits from the gateway. Everything else is left out on purpose: the
/// gateway's environment holds the credentials of other upstreams (`env:` header values).
const INHERITED_ENV: &[&str] = &[
    "HOME", "LANG", "LC_ALL", "LC_CTYPE", "LOGNAME", "PATH", "SHELL", "TERM", "TMPDIR", "TZ",
    "USER",
];

const FIRST_RESTART_DELAY: Duration = Duration::from_millis(500);
const MAX_RESTART_DELAY: Duration = Duration::from_secs(30);

pub(crate) enum McpTarget {
    Stdio(StdioCommand),
    Http { url: Url, headers: HeaderMap },
}

/// The rmcp client handler: it offers the server no capabilities (no sampling, no roots) and only
/// listens for tool list changes.
#[derive(Clone)]
struct GatewayClient {
    tools_changed: Arc<AtomicBool>,
    /// Wakes the task that lists the tools again (their definitions are pinned: SPEC 18).
    relist: Arc<tokio::sync::Notify>,
}

impl ClientHandler for GatewayClient {
    fn on_tool_list_changed(
        &self,
        _context: NotificationContext<RoleClient>,
    ) -> impl std::future::Future<Output = ()> + Send + '_ {
        self.tools_changed.store(true, Ordering::Release);
        self.relist.notify_one();
        std::future::ready(())
    }

    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("sealgate", env!("CARGO_PKG_VERSION")),
        )
    }
}

/// How far a `tools/call` request got into the transport.
#[derive(Debug, Clone, PartialEq)]
enum Delivery {
    /// The transport never started sending it.
    NotStarted,
    /// Sending started (and may have finished): the tool can have received it.
    Started,
    /// Sending failed in a way that means the tool cannot have received it.
    Failed(String),
}

/// What the gateway knows of one `tools/call` request beyond what rmcp says.
struct WatchedCall {
    since: Instant,
    delivery: Delivery,
    /// The answer held a number that a receipt cannot bind exactly: the refusal naming its path.
    inexact_number: Option<String>,
}

/// What the gateway needs to know about a transport and rmcp does not say: whether the server's
/// side has closed, how far each `tools/call` request got, and whether its answer's raw text held an
/// inexact number. rmcp reports "transport closed" alike for a request still in its queue and for one
/// the tool may be running, and keeps no number text.
struct TransportWatch {
    closed: AtomicBool,
    calls: Mutex<HashMap<RequestId, WatchedCall>>,
    /// Entries older than this belong to calls that were abandoned (their caller went away).
    retention: Duration,
}

impl TransportWatch {
    fn new(call_timeout: Duration) -> Self {
        Self {
            closed: AtomicBool::new(false),
            calls: Mutex::new(HashMap::new()),
            retention: call_timeout.saturating_mul(2) + Duration::from_secs(10),
        }
    }

    fn record(&self, id: &RequestId, delivery: Delivery) {
        if let Ok(mut calls) = self.calls.lock() {
            let retention = self.retention;
            calls.retain(|_, call| call.since.elapsed() < retention);
            let call = calls.entry(id.clone()).or_insert(WatchedCall {
                since: Instant::now(),
                delivery: Delivery::NotStarted,
                inexact_number: None,
            });
            call.delivery = delivery;
        }
    }

    /// How far the request got, and the refusal of its answer if that held an inexact number;
    /// forgets it.
    fn take(&self, id: &RequestId) -> (Delivery, Option<String>) {
        match self.calls.lock() {
            Ok(mut calls) => calls
                .remove(id)
                .map_or((Delivery::NotStarted, None), |call| {
                    (call.delivery, call.inexact_number)
                }),
            // A poisoned map cannot tell: assume the request went out (outcome unknown).
            Err(_) => (Delivery::Started, None),
        }
    }
}

impl InexactNumbers for TransportWatch {
    /// Kept for `tools/call` requests only: other answers bind no receipt of a call.
    fn found(&self, id: RequestId, at: String) {
        if let Ok(mut calls) = self.calls.lock() {
            if let Some(call) = calls.get_mut(&id) {
                call.inexact_number = Some(at);
            }
        }
    }
}

struct WatchedTransport<T> {
    inner: T,
    watch: Arc<TransportWatch>,
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for WatchedTransport<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: ClientJsonRpcMessage,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let call_id = match &item {
            ClientJsonRpcMessage::Request(request)
                if matches!(request.request, ClientRequest::CallToolRequest(_)) =>
            {
                Some(request.id.clone())
            }
            _ => None,
        };
        let watch = self.watch.clone();
        // rmcp's transports do nothing before their send future is first polled.
        let sending = self.inner.send(item);
        async move {
            let Some(id) = call_id else {
                return sending.await;
            };
            // Marked before the first byte can leave: from here on the call may reach the tool.
            watch.record(&id, Delivery::Started);
            let result = sending.await;
            if let Err(error) = &result {
                if let CallFailure::NotDelivered(reason) = classify_transport_error(error, u64::MAX)
                {
                    watch.record(&id, Delivery::Failed(reason));
                }
            }
            result
        }
    }

    async fn receive(&mut self) -> Option<ServerJsonRpcMessage> {
        let message = self.inner.receive().await;
        if message.is_none() {
            // rmcp notices the end only after draining and closing; calls must not wait.
            self.watch.closed.store(true, Ordering::Release);
        }
        message
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.watch.closed.store(true, Ordering::Release);
        self.inner.close()
    }
}

/// An initialised MCP session (and, for stdio, the child process that serves it and its stderr).
struct Connection {
    service: RunningService<RoleClient, GatewayClient>,
    watch: Arc<TransportWatch>,
    stderr: Option<Arc<StderrLog>>,
}

/// Why a server did not start, with the last lines it wrote on stderr meanwhile (stdio only).
struct StartFailure {
    reason: String,
    stderr: Option<VecDeque<String>>,
}

impl From<String> for StartFailure {
    fn from(reason: String) -> Self {
        StartFailure {
            reason,
            stderr: None,
        }
    }
}

impl Connection {
    fn is_alive(&self) -> bool {
        !self.watch.closed.load(Ordering::Acquire)
            && !self.service.is_closed()
            && !self.service.peer().is_transport_closed()
    }
}

/// Pause between failed starts: 0.5 s, doubling, at most 30 s; reset by a successful start.
#[derive(Default)]
struct RestartBackoff {
    failed_starts: u32,
    next_attempt: Option<Instant>,
}

impl RestartBackoff {
    fn record_failure(&mut self) {
        self.failed_starts = self.failed_starts.saturating_add(1);
        self.next_attempt = Some(Instant::now() + Self::delay_after(self.failed_starts));
    }

    fn delay_after(failed_starts: u32) -> Duration {
        let doublings = failed_starts.saturating_sub(1).min(16);
        FIRST_RESTART_DELAY
            .saturating_mul(1u32 << doublings)
            .min(MAX_RESTART_DELAY)
    }
}

/// How a call failed, sorted by whether the tool can have seen it.
enum CallFailure {
    /// Nothing of the call reached the tool: safe to try again on a new connection.
    NotDelivered(String),
    /// The call may have reached the tool, or the tool answered: final.
    Final(UpstreamError),
}

pub(crate) struct McpUpstream {
    name: Arc<str>,
    target: McpTarget,
    timeout: Duration,
    tools_changed: Arc<AtomicBool>,
    relist: Arc<tokio::sync::Notify>,
    /// The live connection; only read and swapped, never held across an await.
    current: Mutex<Option<Arc<Connection>>>,
    /// Serialises starts, and remembers how long to wait after a failed one.
    start_guard: tokio::sync::Mutex<RestartBackoff>,
    shut_down: AtomicBool,
    sessions_started: AtomicU64,
    health: Arc<Health>,
}

impl McpUpstream {
    pub(crate) fn new(
        name: &str,
        target: McpTarget,
        timeout: Duration,
        tools_changed: Arc<AtomicBool>,
        relist: Arc<tokio::sync::Notify>,
    ) -> Self {
        Self {
            name: Arc::from(name),
            target,
            timeout,
            tools_changed,
            relist,
            current: Mutex::new(None),
            start_guard: tokio::sync::Mutex::new(RestartBackoff::default()),
            shut_down: AtomicBool::new(false),
            sessions_started: AtomicU64::new(0),
            health: Arc::new(Health::new(name)),
        }
    }

    /// Whether its server runs, as far as the gateway has seen.
    pub(crate) fn state(&self) -> UpstreamState {
        self.health.state()
    }

    /// Calls `tool` (its own name on the server). The cap applies to the decoded result (or error)
    /// serialized as JSON: rmcp reads the HTTP body or stdio line, so its raw bytes are not at hand.
    pub(crate) async fn call(
        &self,
        tool: &str,
        arguments: &Map<String, Value>,
        cap: u64,
    ) -> Result<ToolAnswer, UpstreamError> {
        let connection = self.connection().await?;
        match self.call_on(&connection, tool, arguments, cap).await {
            Ok(answer) => Ok(answer),
            Err(CallFailure::Final(e)) => Err(e),
            Err(CallFailure::NotDelivered(reason)) => {
                // Nothing reached the tool, so one more try on a new connection cannot run it
                // twice. This covers a child that exited since the last call, and a server that
                // lost the session; when the server is down the new start fails fast.
                tracing::info!(upstream = %self.name, %reason, "call not delivered; reconnecting once");
                self.discard(&connection);
                let connection = self.connection().await?;
                match self.call_on(&connection, tool, arguments, cap).await {
                    Ok(answer) => Ok(answer),
                    Err(CallFailure::Final(e)) => Err(e),
                    Err(CallFailure::NotDelivered(reason)) => {
                        self.discard(&connection);
                        Err(UpstreamError::Unavailable(reason))
                    }
                }
            }
        }
    }

    /// Forgets `connection` if it is still the current one; dropping it ends the session.
    fn discard(&self, connection: &Arc<Connection>) {
        let stale = self
            .current
            .lock()
            .ok()
            .and_then(|mut current| match current.as_ref() {
                Some(live) if Arc::ptr_eq(live, connection) => current.take(),
                _ => None,
            });
        drop(stale);
    }

    /// The server's tools (all pages), as JSON objects with their own names.
    pub(crate) async fn list_tools(&self) -> Result<Vec<Value>, UpstreamError> {
        let connection = self.connection().await?;
        let peer = connection.service.peer().clone();
        let tools = tokio::time::timeout(self.timeout, peer.list_all_tools())
            .await
            .map_err(|_| UpstreamError::Timeout("tools/list did not finish in time".into()))?
            .map_err(|e| {
                UpstreamError::BadResponse(format!("tools/list failed: {}", redact::error(&e)))
            })?;
        tools
            .into_iter()
            .map(|tool| {
                serde_json::to_value(tool)
                    .map_err(|e| UpstreamError::BadResponse(format!("unreadable tool: {e}")))
            })
            .collect()
    }

    /// Closes the session; for stdio this ends the child (stdin closed, then SIGTERM, then SIGKILL
    /// to its process group).
    pub(crate) async fn shutdown(&self) {
        self.shut_down.store(true, Ordering::Release);
        self.health.stopped();
        // Wait for a start in progress, so that it cannot leave a child behind.
        let _start = self.start_guard.lock().await;
        let taken = self.current.lock().map(|mut c| c.take()).unwrap_or(None);
        if let Some(connection) = taken {
            match Arc::try_unwrap(connection) {
                Ok(mut connection) => {
                    let _ = connection
                        .service
                        .close_with_timeout(Duration::from_secs(10))
                        .await;
                }
                // A call still holds it; dropping our handle cancels the session when it finishes,
                // and the child is killed when its transport is dropped.
                Err(shared) => drop(shared),
            }
        }
    }

    fn live_connection(&self) -> Option<Arc<Connection>> {
        let guard = self.current.lock().ok()?;
        guard.as_ref().filter(|c| c.is_alive()).cloned()
    }

    async fn connection(&self) -> Result<Arc<Connection>, UpstreamError> {
        if let Some(connection) = self.live_connection() {
            return Ok(connection);
        }
        let mut backoff = self.start_guard.lock().await;
        // Another call may have started it while this one waited.
        if let Some(connection) = self.live_connection() {
            return Ok(connection);
        }
        if self.shut_down.load(Ordering::Acquire) {
            return Err(UpstreamError::Unavailable(
                "the gateway is shutting down".into(),
            ));
        }
        if let Some(next_attempt) = backoff.next_attempt {
            let now = Instant::now();
            if now < next_attempt {
                return Err(UpstreamError::Unavailable(format!(
                    "{} failed start(s); next attempt in {} ms",
                    backoff.failed_starts,
                    (next_attempt - now).as_millis()
                )));
            }
        }
        let start = self.health.starting();
        match self.start(start).await {
            Ok(connection) => {
                *backoff = RestartBackoff::default();
                let connection = Arc::new(connection);
                if let Ok(mut current) = self.current.lock() {
                    *current = Some(connection.clone());
                }
                // A restarted server may serve another tool list (the first session needs no
                // flag: nothing is cached before it).
                if self.sessions_started.fetch_add(1, Ordering::AcqRel) > 0 {
                    self.tools_changed.store(true, Ordering::Release);
                }
                tracing::info!(upstream = %self.name, "MCP session initialised");
                self.health.up(start);
                if let Some(stderr) = &connection.stderr {
                    stderr.started();
                }
                Ok(connection)
            }
            Err(StartFailure { reason, stderr }) => {
                backoff.record_failure();
                self.health.down(start, "failed to start");
                tracing::error!(upstream = %self.name, %reason, stderr = stderr.filter(|lines| !lines.is_empty()).map(|lines| format!("{lines:?}")), "cannot start the MCP upstream");
                Err(UpstreamError::Unavailable(reason))
            }
        }
    }

    /// Runs MCP's initialisation within the upstream's timeout.
    async fn initialise<T, E, A>(
        &self,
        handler: GatewayClient,
        transport: T,
    ) -> Result<RunningService<RoleClient, GatewayClient>, String>
    where
        T: rmcp::transport::IntoTransport<RoleClient, E, A>,
        E: std::error::Error + Send + Sync + 'static,
    {
        match tokio::time::timeout(self.timeout, handler.serve(transport)).await {
            Ok(served) => served.map_err(|e| redact::error(&e)),
            Err(_) => Err(format!(
                "initialisation did not finish within {} ms",
                self.timeout.as_millis()
            )),
        }
    }

    /// Starts the server (stdio) or opens a session with it (HTTP), and initialises MCP.
    async fn start(&self, start: Start) -> Result<Connection, StartFailure> {
        let handler = GatewayClient {
            tools_changed: self.tools_changed.clone(),
            relist: self.relist.clone(),
        };
        let watch = Arc::new(TransportWatch::new(self.timeout));
        match &self.target {
            McpTarget::Stdio(command) => self.start_stdio(command, start, handler, watch).await,
            McpTarget::Http { url, headers } => {
                let http = build_client(self.timeout)?;
                let custom_headers: HashMap<_, _> = headers
                    .iter()
                    .map(|(name, value)| (name.clone(), value.clone()))
                    .collect();
                let max = usize::try_from(HARD_MAX_RESPONSE_BYTES).unwrap_or(usize::MAX);
                let config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                    .custom_headers(custom_headers)
                    .reinit_on_expired_session(true)
                    .max_json_response_size(max)
                    .max_sse_event_size(max)
                    .control_request_timeout(self.timeout.min(Duration::from_secs(5)))
                    .session_recovery_timeout(self.timeout);
                let transport = WatchedTransport {
                    inner: StreamableHttpClientTransport::with_client(
                        SessionAwareClient::new(http, watch.clone()),
                        config,
                    ),
                    watch: watch.clone(),
                };
                let service = self.initialise(handler, transport).await.map_err(|e| {
                    format!(
                        "MCP initialisation at {} failed: {e}",
                        redact::url(url.as_str())
                    )
                })?;
                Ok(Connection {
                    service,
                    watch,
                    stderr: None,
                })
            }
        }
    }

    async fn start_stdio(
        &self,
        command: &StdioCommand,
        start: Start,
        handler: GatewayClient,
        watch: Arc<TransportWatch>,
    ) -> Result<Connection, StartFailure> {
        let mut process = tokio::process::Command::new(&command.command);
        process.args(&command.args).env_clear();
        for key in INHERITED_ENV {
            if let Some(value) = std::env::var_os(key) {
                process.env(key, value);
            }
        }
        process.envs(&command.env);
        if let Some(cwd) = &command.cwd {
            process.current_dir(cwd);
        }
        crate::files::with_operator_umask(&mut process);
        let mut wrapped = CommandWrap::from(process);
        // Its own process group, so that a wrapper (npx, sh) dies with the server it runs.
        wrapped.wrap(ProcessGroup::leader()).wrap(KillOnDrop);
        let (transport, stderr) = ChildTransport::spawn(wrapped, watch.clone())
            .map_err(|e| format!("cannot start `{}`: {e}", command.command))?;
        let health = (self.health.clone(), start);
        let stderr = Some(StderrLog::read(
            self.name.clone(),
            command.log_stderr,
            health,
            stderr,
        ));
        let transport = WatchedTransport {
            inner: transport,
            watch: watch.clone(),
        };
        match self.initialise(handler, transport).await {
            Ok(service) => Ok(Connection {
                service,
                watch,
                stderr,
            }),
            Err(e) => Err(StartFailure {
                reason: format!("MCP initialisation over stdio failed: {e}"),
                stderr: match &stderr {
                    Some(log) => Some(log.failed_start_tail().await),
                    None => None,
                },
            }),
        }
    }

    async fn call_on(
        &self,
        connection: &Connection,
        tool: &str,
        arguments: &Map<String, Value>,
        cap: u64,
    ) -> Result<ToolAnswer, CallFailure> {
        if let Some(stderr) = &connection.stderr {
            stderr.calling();
        }
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments.clone());
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        // The peer is a handle onto the shared session: no lock is held while the call runs.
        let peer = connection.service.peer().clone();
        let handle = peer
            .send_request_with_option(request, PeerRequestOptions::with_timeout(self.timeout))
            .await
            .map_err(|e| {
                CallFailure::NotDelivered(format!("the session closed: {}", redact::error(&e)))
            })?;
        let request_id = handle.id.clone();
        // On timeout rmcp sends notifications/cancelled for the request and forgets it, so a late
        // answer is dropped on purpose rather than lost unnoticed.
        let outcome = handle.await_response().await;
        let (delivery, inexact_number) = connection.watch.take(&request_id);
        if let Some(at) = inexact_number {
            // The answer's raw text holds a number that a receipt cannot bind as sent (SPEC 20
            // rule 5), whatever rmcp made of it.
            return Err(CallFailure::Final(UpstreamError::InexactNumber(at)));
        }
        let answer = match outcome {
            Ok(ServerResult::CallToolResult(result)) => serde_json::to_value(result)
                .map(ToolAnswer::Result)
                .map_err(|e| CallFailure::Final(UpstreamError::BadResponse(e.to_string())))?,
            Ok(ServerResult::EmptyResult(_)) => ToolAnswer::Result(Value::Object(Map::new())),
            Ok(ServerResult::CustomResult(custom)) => ToolAnswer::Result(custom.0),
            Ok(_) => {
                // A task or an input request: the tool has not finished, and the gateway cannot
                // carry the follow-up rounds, so the outcome is unknown.
                return Err(CallFailure::Final(UpstreamError::BadResponse(
                    "the tool answered with something other than a tool result".into(),
                )));
            }
            Err(ServiceError::McpError(error)) => ToolAnswer::Error(error_object(
                i64::from(error.code.0),
                &error.message,
                error.data,
            )),
            Err(error) => return Err(self.classify(error, delivery, cap)),
        };
        if answer.payload_len() as u64 > cap {
            return Err(CallFailure::Final(UpstreamError::TooLarge { limit: cap }));
        }
        Ok(answer)
    }

    fn classify(&self, error: ServiceError, delivery: Delivery, cap: u64) -> CallFailure {
        match (error, delivery) {
            // The session ended while the request still waited in rmcp's queue, or its sending
            // failed before the tool could read it (rmcp may drop that error when it closes).
            (
                ServiceError::TransportClosed | ServiceError::Cancelled { .. },
                Delivery::NotStarted,
            ) => CallFailure::NotDelivered("the session ended before the call was sent".into()),
            (
                ServiceError::TransportClosed | ServiceError::Cancelled { .. },
                Delivery::Failed(reason),
            ) => CallFailure::NotDelivered(reason),
            (error, _) => self.classify_error(error, cap),
        }
    }

    fn classify_error(&self, error: ServiceError, cap: u64) -> CallFailure {
        let final_failure = CallFailure::Final;
        match error {
            ServiceError::Timeout { timeout } => {
                tracing::warn!(upstream = %self.name, "tools/call timed out; cancellation sent");
                final_failure(UpstreamError::Timeout(format!(
                    "no answer within {} ms",
                    timeout.as_millis()
                )))
            }
            ServiceError::TransportSend(send_error) => {
                classify_transport_error(send_error.error.as_ref(), cap)
            }
            ServiceError::UnexpectedResponse => final_failure(UpstreamError::BadResponse(
                "the answer is not a tools/call result".into(),
            )),
            // TransportClosed, Cancelled and anything newer: the request may have been delivered.
            other => final_failure(UpstreamError::Timeout(format!(
                "the session ended before the answer came: {}",
                redact::error(&other)
            ))),
        }
    }
}

/// A transport's send error, sorted by whether the call can have reached the tool.
fn classify_transport_error(
    error: &(dyn std::error::Error + Send + Sync + 'static),
    cap: u64,
) -> CallFailure {
    if let Some(io) = error.downcast_ref::<std::io::Error>() {
        // Writing to the child's stdin failed: the child closed it (or exited), so it cannot have
        // read the whole request line.
        return CallFailure::NotDelivered(format!("cannot write to the tool's stdin: {io}"));
    }
    let Some(http) = error.downcast_ref::<StreamableHttpError<reqwest::Error>>() else {
        return CallFailure::Final(UpstreamError::Timeout(format!(
            "transport failure: {}",
            redact::error(error)
        )));
    };
    match http {
        StreamableHttpError::Client(e) if e.is_connect() || e.is_builder() => {
            CallFailure::NotDelivered(format!("cannot reach the MCP server: {}", redact::error(e)))
        }
        StreamableHttpError::SessionExpired
        | StreamableHttpError::ReinitializationFailed(_)
        | StreamableHttpError::ReservedHeaderConflict(_)
        | StreamableHttpError::AuthRequired(_)
        | StreamableHttpError::InsufficientScope(_) => CallFailure::NotDelivered(format!(
            "the MCP server refused the request: {}",
            redact::error(http)
        )),
        StreamableHttpError::ResponseBodyTooLarge { max_size } => {
            CallFailure::Final(UpstreamError::TooLarge {
                limit: cap.min(*max_size as u64),
            })
        }
        StreamableHttpError::HttpStatus(_)
        | StreamableHttpError::UnexpectedServerResponse(_)
        | StreamableHttpError::UnexpectedContentType(_)
        | StreamableHttpError::Deserialize(_)
        | StreamableHttpError::Sse(_) => {
            CallFailure::Final(UpstreamError::BadResponse(redact::error(http)))
        }
        // Timeouts, resets, broken streams, an unfinished recovery: the request may have run.
        other => CallFailure::Final(UpstreamError::Timeout(redact::error(other))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restart_delay_doubles_up_to_thirty_seconds() {
        let delays: Vec<Duration> = (1..=10).map(RestartBackoff::delay_after).collect();
        assert_eq!(delays[0], Duration::from_millis(500));
        assert_eq!(delays[1], Duration::from_secs(1));
        assert_eq!(delays[2], Duration::from_secs(2));
        assert_eq!(delays[6], Duration::from_secs(30));
        assert_eq!(delays[9], Duration::from_secs(30));
        assert_eq!(
            RestartBackoff::delay_after(u32::MAX),
            Duration::from_secs(30)
        );
        let mut backoff = RestartBackoff::default();
        backoff.record_failure();
        assert_eq!(backoff.failed_starts, 1);
        assert!(backoff.next_attempt.is_some_and(|at| at > Instant::now()));
    }

    #[test]
    fn transport_errors_are_sorted_by_delivery() {
        let io = std::io::Error::new(std::io::ErrorKind::BrokenPipe, "gone");
        assert!(matches!(
            classify_transport_error(&io, 10),
            CallFailure::NotDelivered(_)
        ));
        let expired: StreamableHttpError<reqwest::Error> = StreamableHttpError::SessionExpired;
        assert!(matches!(
            classify_transport_error(&expired, 10),
            CallFailure::NotDelivered(_)
        ));
        let big: StreamableHttpError<reqwest::Error> =
            StreamableHttpError::ResponseBodyTooLarge { max_size: 100 };
        assert!(matches!(
            classify_transport_error(&big, 10),
            CallFailure::Final(UpstreamError::TooLarge { limit: 10 })
        ));
        let ended: StreamableHttpError<reqwest::Error> = StreamableHttpError::UnexpectedEndOfStream;
        assert!(matches!(
            classify_transport_error(&ended, 10),
            CallFailure::Final(UpstreamError::Timeout(_))
        ));
        let garbled: StreamableHttpError<reqwest::Error> =
            StreamableHttpError::UnexpectedContentType(Some("text/html".into()));
        assert!(matches!(
            classify_transport_error(&garbled, 10),
            CallFailure::Final(UpstreamError::BadResponse(_))
        ));
    }
}
