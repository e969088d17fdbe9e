//! The MCP server that hosts talk to (SPEC 15), on the official Rust SDK: `initialize` and `ping` are
//! answered here, `tools/list` and `tools/call` are signed and sent to the gateway, everything else is
//! "method not found" (no resources, prompts or completions).

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, Implementation, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ProtocolVersion, ServerCapabilities,
    ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{json, Map, Value};

use super::gateway::GatewayClient;
use crate::mcp_reply::{self as reply, Answer};

/// The name hosts see in `serverInfo`.
pub const SERVER_NAME: &str = "sealgate-connect";

/// How often a call held for approval is sent again, and the host told how long it has waited.
const RESEND_EVERY: Duration = Duration::from_secs(2);

/// The bridge: one per process, shared by every host connection.
#[derive(Clone)]
pub struct Bridge {
    gateway: Arc<GatewayClient>,
    /// `--wait-approval`: how long a call held for a person's approval is kept waiting.
    wait_approval: Option<Duration>,
}

impl Bridge {
    pub fn new(gateway: GatewayClient, wait_approval: Option<Duration>) -> Bridge {
        Bridge {
            gateway: Arc::new(gateway),
            wait_approval,
        }
    }

    /// Sends the call; with `--wait-approval`, a 4003 is sent again every 2 s in a fresh envelope
    /// (not charged again: SPEC 13 r3) until another answer comes, the wait is over, or the host
    /// cancels the call. The host hears how long it has waited when it gave a progress token.
    async fn send_waiting(&self, payload: Value, context: &RequestContext<RoleServer>) -> Answer {
        let started = Instant::now();
        loop {
            let answer = self.gateway.send(payload.clone()).await;
            let (Some(wait), Some(approval_id)) = (self.wait_approval, awaiting_approval(&answer))
            else {
                return answer;
            };
            let Some(left) = wait.checked_sub(started.elapsed()).filter(|d| !d.is_zero()) else {
                return answer;
            };
            tokio::select! {
                () = tokio::time::sleep(RESEND_EVERY.min(left)) => {}
                () = context.ct.cancelled() => return answer,
            }
            notify_waiting(context, started.elapsed(), wait, &approval_id).await;
        }
    }
}

/// The approval id of a 4003 answer.
fn awaiting_approval(answer: &Answer) -> Option<String> {
    match answer {
        Answer::Refused(error) if error["code"] == 4003 => {
            Some(error["details"]["approval_id"].as_str()?.to_owned())
        }
        _ => None,
    }
}

/// `notifications/progress` for a host that asked for it: seconds waited out of `--wait-approval`.
async fn notify_waiting(
    context: &RequestContext<RoleServer>,
    waited: Duration,
    wait: Duration,
    approval_id: &str,
) {
    let Some(token) = context.meta.get_progress_token() else {
        return;
    };
    let progress = ProgressNotificationParam::new(token, waited.as_millis() as f64 / 1000.0)
        .with_total(wait.as_secs_f64())
        .with_message(format!(
            "waiting for a person to approve this call (approval_id {approval_id})"
        ));
    // A host that went away is not an error of the call: the wait goes on until it ends.
    let _ = context.peer.notify_progress(progress).await;
}

/// The JSON-RPC payload of a `tools/call` envelope: the host's id, tool and arguments, and of the
/// host's `_meta` only `idempotency_key` (progress tokens and the like mean nothing to the gateway).
fn tools_call_payload(
    request: &CallToolRequestParams,
    context: &RequestContext<RoleServer>,
) -> Value {
    let mut params = Map::new();
    params.insert("name".into(), json!(request.name));
    if let Some(arguments) = &request.arguments {
        params.insert("arguments".into(), Value::Object(arguments.clone()));
    }
    let key = context
        .meta
        .get("idempotency_key")
        .or_else(|| request.meta.as_ref()?.get("idempotency_key"));
    if let Some(key) = key {
        params.insert("_meta".into(), json!({ "idempotency_key": key }));
    }
    json!({"jsonrpc": "2.0", "id": context.id, "method": "tools/call", "params": params})
}

impl ServerHandler for Bridge {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(SERVER_NAME, env!("CARGO_PKG_VERSION")))
            .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE)
    }

    /// The versions with an `initialize` handshake (SPEC 15 speaks of `initialize`): a host that
    /// offers only a later one is told so, and SDKs that probe first fall back to `initialize`.
    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Cow::Borrowed(ProtocolVersion::known_up_to(
            &ProtocolVersion::LATEST_WITH_INITIALIZE,
        ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        let payload = json!({"jsonrpc": "2.0", "id": context.id, "method": "tools/list"});
        reply::tool_list(self.gateway.send(payload).await)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let payload = tools_call_payload(&request, &context);
        let answer = self.send_waiting(payload, &context).await;
        reply::tool_result(answer).map(CallToolResponse::from)
    }
}
