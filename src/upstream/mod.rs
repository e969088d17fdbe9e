//! Forwarding of tool calls to the tools that run them (SPEC section 8).
//!
//! The first segment of a tool name names an upstream from the configuration and the rest is the
//! tool's own name there (`fs.read_file` → upstream `fs`, tool `read_file`; a name without a dot is
//! both). An upstream is a plain JSON-RPC endpoint (`http`) or an MCP server (`mcp`, over
//! Streamable HTTP or stdio). Whatever the kind, a call ends in one of the outcomes the claim logic
//! needs to tell apart (SPEC 7.2): an answer (a JSON-RPC `result` or `error`, returned with the
//! caller's id), or an [`UpstreamError`] that says whether the tool can have run.

mod config;
mod health;
mod http;
mod jsonrpc;
mod mcp;
mod mcp_http_client;
mod mcp_numbers;
mod mcp_stdio;
mod stderr;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Map, Value};

pub use config::{HttpUpstreamConfig, McpUpstreamConfig, UpstreamConfig};
use health::UpstreamState;

use config::Target;
use http::HttpUpstream;
use jsonrpc::ToolAnswer;
use mcp::{McpTarget, McpUpstream};

/// The most the gateway reads of one answer, whatever the capability allows: it bounds memory when
/// no `max_response_size` is set. It matches rmcp's own default limits for a JSON body, an SSE
/// event and a stdio line, so every kind stops at the same size.
pub const HARD_MAX_RESPONSE_BYTES: u64 = 16 * 1024 * 1024;

/// How long a tool list is reused before it is fetched again (a change notification from an MCP
/// server refreshes it sooner).
const TOOLS_CACHE_TTL: Duration = Duration::from_secs(60);

/// Why a call produced no answer to hand back; each variant fixes what happens to the claim.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// No upstream is configured under the tool name's first segment (5004).
    #[error("no upstream is configured for this tool")]
    NoRoute,
    /// Nothing of the call was sent (connection refused, DNS, a tool that would not start), or the
    /// server refused it before processing it: the claim can be released (5001).
    #[error("upstream unavailable: {0}")]
    Unavailable(String),
    /// The call was sent and no complete answer came back (timeout, reset): outcome unknown (5002).
    #[error("upstream gave no complete answer: {0}")]
    Timeout(String),
    /// The upstream answered, but not with a JSON-RPC response: outcome unknown (5003).
    #[error("upstream answered with something that is not a JSON-RPC response: {0}")]
    BadResponse(String),
    /// The answer holds a number that JCS cannot write as the tool sent it, so no receipt could bind
    /// it (SPEC 20 rule 5); withheld like a bad response (5003). The message names the number's path.
    #[error("the tool's answer holds a number that a receipt cannot bind exactly: {0}")]
    InexactNumber(String),
    /// The answer was larger than the cap: the tool ran, its answer is withheld (2007).
    #[error("the upstream's answer exceeded {limit} bytes")]
    TooLarge { limit: u64 },
}

impl UpstreamError {
    /// The seal/v1 error code of SPEC section 10.
    pub fn code(&self) -> u16 {
        match self {
            UpstreamError::NoRoute => 5004,
            UpstreamError::Unavailable(_) => 5001,
            UpstreamError::Timeout(_) => 5002,
            UpstreamError::BadResponse(_) | UpstreamError::InexactNumber(_) => 5003,
            UpstreamError::TooLarge { .. } => 2007,
        }
    }

    /// What the agent (and the audit event) is told. Transport details stay in the operator's log:
    /// they can name internal addresses, and a URL's query can hold a credential (SPEC 8).
    pub fn for_agent(&self) -> String {
        match self {
            // The path names where in the answer, never the number: answers are not recorded.
            UpstreamError::NoRoute
            | UpstreamError::TooLarge { .. }
            | UpstreamError::InexactNumber(_) => self.to_string(),
            UpstreamError::Unavailable(_) => {
                "the tool's server could not be reached; nothing was sent".to_owned()
            }
            UpstreamError::Timeout(_) => "the tool gave no complete answer in time".to_owned(),
            UpstreamError::BadResponse(_) => {
                "the tool answered with something that is not a JSON-RPC response".to_owned()
            }
        }
    }
}

enum Client {
    Http(HttpUpstream),
    Mcp(McpUpstream),
}

struct CachedTools {
    /// When the fetch that returned this list began.
    fetched_at: Instant,
    tools: Arc<Vec<Value>>,
}

struct Upstream {
    name: String,
    client: Client,
    latency: crate::telemetry::UpstreamLatency,
    /// Set by an MCP `notifications/tools/list_changed` (or a new session).
    tools_changed: Arc<AtomicBool>,
    tools: Mutex<Option<CachedTools>>,
    /// Its `tools:` settings (SPEC 18).
    pins: crate::tools::ToolsConfig,
    /// What the answer guard redacts from this upstream's answers (SPEC 18).
    credentials: crate::guard::Credentials,
}

/// An MCP upstream's server as the gateway last saw it (SPEC 20 r11), for `GET /readyz?verbose` and the
/// console. HTTP upstreams keep no connection and have none.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct UpstreamStatus {
    pub name: String,
    /// `not_started` (it starts on its first call or tool list), `up`, `down` or `stopped`.
    pub state: &'static str,
    /// Why it is down: `failed to start`, `exited before its first call` or `exited`. The details are in
    /// the log only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<&'static str>,
}

/// The routed tools of every upstream, and the upstreams whose tools are left out.
pub struct ToolList {
    pub tools: Vec<Value>,
    pub left_out: Vec<LeftOut>,
}

/// An upstream that could not list its tools.
pub struct LeftOut {
    pub upstream: String,
    /// The sentence that says so to whoever reads the list (no transport detail).
    pub warning: String,
}

/// All configured upstreams, keyed by name. Cheap to share behind an `Arc`; calls run concurrently.
pub struct Upstreams {
    routes: BTreeMap<String, Arc<Upstream>>,
    tool_list_changes: Arc<tokio::sync::Notify>,
}

/// Splits a tool name into the upstream name and the tool's own name there.
fn split_tool_name(tool: &str) -> (&str, &str) {
    match tool.split_once('.') {
        Some((upstream, own_name)) => (upstream, own_name),
        None => (tool, tool),
    }
}

/// The cap that is really applied: the caller's, never above the hard ceiling.
fn effective_cap(max_response_bytes: Option<u64>) -> u64 {
    max_response_bytes.map_or(HARD_MAX_RESPONSE_BYTES, |cap| {
        cap.min(HARD_MAX_RESPONSE_BYTES)
    })
}

impl Upstreams {
    /// Validates every entry (the error names the upstream); nothing is started or contacted here.
    pub fn new(cfg: &BTreeMap<String, UpstreamConfig>) -> Result<Upstreams, String> {
        let mut routes = BTreeMap::new();
        let tool_list_changes = Arc::new(tokio::sync::Notify::new());
        for (name, entry) in cfg {
            let validated = config::validate(name, entry)?;
            let credentials = crate::guard::Credentials::new(&validated.credentials)
                .map_err(|e| format!("upstream `{name}`: {e}"))?;
            let tools_changed = Arc::new(AtomicBool::new(false));
            let client = match validated.target {
                Target::Http { url } => Client::Http(
                    HttpUpstream::new(url, validated.headers, validated.timeout)
                        .map_err(|e| format!("upstream `{name}`: {e}"))?,
                ),
                Target::McpHttp { url } => Client::Mcp(McpUpstream::new(
                    name,
                    McpTarget::Http {
                        url,
                        headers: validated.headers,
                    },
                    validated.timeout,
                    tools_changed.clone(),
                    tool_list_changes.clone(),
                )),
                Target::McpStdio(command) => Client::Mcp(McpUpstream::new(
                    name,
                    McpTarget::Stdio(command),
                    validated.timeout,
                    tools_changed.clone(),
                    tool_list_changes.clone(),
                )),
            };
            let upstream = Upstream {
                name: name.clone(),
                client,
                latency: crate::telemetry::UpstreamLatency::new(name),
                tools_changed,
                tools: Mutex::new(None),
                pins: entry.tools.clone().unwrap_or_default(),
                credentials,
            };
            routes.insert(name.clone(), Arc::new(upstream));
        }
        Ok(Upstreams {
            routes,
            tool_list_changes,
        })
    }

    /// Every MCP upstream with its `tools:` settings (SPEC 18: their tool definitions are pinned).
    pub fn pinned(&self) -> BTreeMap<String, crate::tools::ToolsConfig> {
        self.routes
            .values()
            .filter(|upstream| matches!(upstream.client, Client::Mcp(_)))
            .map(|upstream| (upstream.name.clone(), upstream.pins.clone()))
            .collect()
    }

    /// Woken when an MCP upstream sends `notifications/tools/list_changed`: its tools are then listed
    /// again (SPEC 18), without waiting for a host to ask.
    pub fn tool_list_changes(&self) -> Arc<tokio::sync::Notify> {
        self.tool_list_changes.clone()
    }

    /// Whether the tool name's first segment names a configured upstream.
    pub fn has_route(&self, tool: &str) -> bool {
        self.routes.contains_key(split_tool_name(tool).0)
    }

    /// The credentials the gateway adds to the calls of the tool's upstream, for the answer guard.
    pub fn credentials(&self, tool: &str) -> Option<&crate::guard::Credentials> {
        self.routes
            .get(split_tool_name(tool).0)
            .map(|upstream| &upstream.credentials)
    }

    /// Forwards one `tools/call` and returns the tool's JSON-RPC response object with `caller_id`
    /// (`{"jsonrpc":"2.0","id":caller_id,"result":…}` or `"error":…`).
    ///
    /// `max_response_bytes` caps the answer: for `http` upstreams the HTTP body as received, for
    /// `mcp` upstreams the decoded result (or error) serialized as JSON. Answers are never read
    /// beyond [`HARD_MAX_RESPONSE_BYTES`].
    pub async fn call(
        &self,
        tool: &str,
        caller_id: &Value,
        arguments: &Map<String, Value>,
        idempotency_key: Option<&str>,
        max_response_bytes: Option<u64>,
    ) -> Result<Value, UpstreamError> {
        let (upstream_name, own_name) = split_tool_name(tool);
        let upstream = self
            .routes
            .get(upstream_name)
            .ok_or(UpstreamError::NoRoute)?;
        let cap = effective_cap(max_response_bytes);
        let started = std::time::Instant::now();
        let answer = match &upstream.client {
            Client::Http(client) => {
                client
                    .call(own_name, caller_id, arguments, idempotency_key, cap)
                    .await
            }
            Client::Mcp(client) => client.call(own_name, arguments, cap).await,
        };
        // Indexes telemetry::UPSTREAM_OUTCOMES.
        let outcome = match &answer {
            Ok(_) => 0,
            Err(UpstreamError::Unavailable(_) | UpstreamError::NoRoute) => 1,
            Err(UpstreamError::Timeout(_)) => 2,
            Err(UpstreamError::BadResponse(_) | UpstreamError::InexactNumber(_)) => 3,
            Err(UpstreamError::TooLarge { .. }) => 4,
        };
        upstream.latency.record(outcome, started.elapsed());
        match answer {
            Ok(answer) => Ok(without_sealgate_meta(answer).into_response(caller_id)),
            Err(e) => {
                tracing::warn!(upstream = %upstream.name, tool = %own_name, code = e.code(), error = %e, "tool call failed");
                Err(e)
            }
        }
    }

    /// The tools of every upstream, named as the gateway routes them (`<upstream>.<tool>`). An
    /// upstream that cannot list its tools is left out, with a warning that says so (SPEC 20 r11);
    /// lists are cached per upstream.
    pub async fn list_tools(&self) -> ToolList {
        Self::list_of(self.routes.values().collect()).await
    }

    /// The tools of one upstream, as [`Upstreams::list_tools`] gives them; empty when none has that name.
    pub async fn list_tools_of(&self, upstream: &str) -> ToolList {
        Self::list_of(self.routes.get(upstream).into_iter().collect()).await
    }

    async fn list_of(routes: Vec<&Arc<Upstream>>) -> ToolList {
        let lists =
            futures_util::future::join_all(routes.iter().map(|upstream| upstream.tools())).await;
        let mut list = ToolList {
            tools: Vec::new(),
            left_out: Vec::new(),
        };
        for (upstream, tools) in routes.into_iter().zip(lists) {
            match tools {
                Ok(tools) => list.tools.extend(tools.iter().cloned()),
                Err(e) => list.left_out.push(LeftOut {
                    upstream: upstream.name.clone(),
                    warning: format!(
                        "the tools of upstream `{}` are left out: {}",
                        upstream.name,
                        e.for_agent()
                    ),
                }),
            }
        }
        list
    }

    /// The state of each MCP upstream's server, by name.
    pub fn statuses(&self) -> Vec<UpstreamStatus> {
        self.routes
            .values()
            .filter_map(|upstream| match &upstream.client {
                Client::Mcp(client) => Some((upstream.name.clone(), client.state())),
                Client::Http(_) => None,
            })
            .map(|(name, state)| UpstreamStatus {
                name,
                state: state.name(),
                error: match state {
                    UpstreamState::Down { error } => Some(error),
                    _ => None,
                },
            })
            .collect()
    }

    /// Ends the MCP sessions and the stdio children. Calls made afterwards are refused (5001).
    pub async fn shutdown(&self) {
        let closing = self
            .routes
            .values()
            .filter_map(|upstream| match &upstream.client {
                Client::Mcp(client) => Some(client.shutdown()),
                Client::Http(_) => None,
            });
        futures_util::future::join_all(closing).await;
    }
}

impl Upstream {
    /// The cached list while it is fresh, else a new one.
    async fn tools(&self) -> Result<Arc<Vec<Value>>, UpstreamError> {
        let changed = self.tools_changed.swap(false, Ordering::AcqRel);
        if !changed {
            if let Ok(cache) = self.tools.lock() {
                if let Some(cached) = cache.as_ref() {
                    if cached.fetched_at.elapsed() < TOOLS_CACHE_TTL {
                        return Ok(cached.tools.clone());
                    }
                }
            }
        }
        let started = Instant::now();
        let fetched = match &self.client {
            Client::Http(client) => client.list_tools(HARD_MAX_RESPONSE_BYTES).await,
            Client::Mcp(client) => client.list_tools().await,
        };
        match fetched {
            Ok(tools) => {
                let tools = Arc::new(self.route_names(tools));
                if let Ok(mut cache) = self.tools.lock() {
                    // A slower fetch begun earlier must not replace the list of one begun after it.
                    if cache
                        .as_ref()
                        .is_none_or(|cached| cached.fetched_at <= started)
                    {
                        *cache = Some(CachedTools {
                            fetched_at: started,
                            tools: tools.clone(),
                        });
                    }
                }
                Ok(tools)
            }
            Err(e) => {
                // Fetch again next time rather than serving a list from before the failure.
                self.tools_changed.store(changed, Ordering::Release);
                tracing::warn!(upstream = %self.name, error = %e, "cannot list the upstream's tools; they are left out of tools/list");
                Err(e)
            }
        }
    }

    /// Renames each tool to its routed name; entries without a usable name are left out, since no
    /// call could reach them.
    fn route_names(&self, tools: Vec<Value>) -> Vec<Value> {
        tools
            .into_iter()
            .filter_map(|tool| {
                let Value::Object(mut tool) = tool else {
                    return None;
                };
                let own_name = tool.get("name").and_then(Value::as_str)?;
                let routed = format!("{}.{}", self.name, own_name);
                if !is_routable_tool_name(&routed) {
                    tracing::warn!(upstream = %self.name, tool = %own_name, "tool name cannot be routed; left out of the list");
                    return None;
                }
                tool.insert("name".into(), Value::String(routed));
                Some(Value::Object(tool))
            })
            .collect()
    }
}

/// A tool's result without the `_meta` keys that are sealgate's (SPEC 20 rule 10): a tool never makes
/// a call that ran look like a refusal, nor carries a receipt of its own choosing.
fn without_sealgate_meta(mut answer: ToolAnswer) -> ToolAnswer {
    if let ToolAnswer::Result(result) = &mut answer {
        crate::tool_meta::remove_sealgate_keys(result);
    }
    answer
}

/// SPEC section 2: `^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`, at most 128 bytes.
fn is_routable_tool_name(name: &str) -> bool {
    name.len() <= 128
        && name.split('.').all(|segment| {
            !segment.is_empty()
                && segment
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tool_names_split_at_the_first_dot() {
        assert_eq!(split_tool_name("fs.read_file"), ("fs", "read_file"));
        assert_eq!(split_tool_name("fs.dir.list"), ("fs", "dir.list"));
        assert_eq!(split_tool_name("echo"), ("echo", "echo"));
    }

    #[test]
    fn routes_follow_the_first_segment() {
        let cfg: BTreeMap<String, UpstreamConfig> = serde_json::from_value(json!({
            "fs": {"mcp": {"command": "node", "args": ["x.js"]}},
            "echo": {"http": {"url": "http://127.0.0.1:1/rpc"}}
        }))
        .unwrap();
        let upstreams = Upstreams::new(&cfg).unwrap();
        assert!(upstreams.has_route("fs.read_file"));
        assert!(upstreams.has_route("echo"));
        assert!(upstreams.has_route("echo.anything"));
        assert!(!upstreams.has_route("fsx.read_file"));
        assert!(!upstreams.has_route("web.fetch"));
    }

    #[test]
    fn construction_error_names_the_upstream() {
        let cfg: BTreeMap<String, UpstreamConfig> =
            serde_json::from_value(json!({"broken": {"mcp": {}}})).unwrap();
        let err = Upstreams::new(&cfg).err().unwrap();
        assert!(err.contains("`broken`"), "{err}");
    }

    #[test]
    fn caps_never_exceed_the_ceiling() {
        assert_eq!(effective_cap(None), HARD_MAX_RESPONSE_BYTES);
        assert_eq!(effective_cap(Some(10)), 10);
        assert_eq!(effective_cap(Some(u64::MAX)), HARD_MAX_RESPONSE_BYTES);
    }

    #[test]
    fn routable_names_follow_the_spec_pattern() {
        assert!(is_routable_tool_name("fs.read_file"));
        assert!(!is_routable_tool_name("fs.read file"));
        assert!(!is_routable_tool_name("fs..x"));
        assert!(!is_routable_tool_name(&format!("fs.{}", "a".repeat(130))));
    }

    /// The gateway shares one `Upstreams` between request handlers on a multi-threaded runtime.
    #[test]
    fn upstreams_and_their_futures_can_cross_threads() {
        fn is_send_sync<T: Send + Sync>(_: &T) {}
        fn is_send<T: Send>(_: &T) {}
        let upstreams = Upstreams::new(&BTreeMap::new()).unwrap();
        is_send_sync(&upstreams);
        let arguments = Map::new();
        let call = upstreams.call("x.y", &Value::Null, &arguments, None, None);
        is_send(&call);
        let list = upstreams.list_tools();
        is_send(&list);
        let shutdown = upstreams.shutdown();
        is_send(&shutdown);
    }

    #[tokio::test]
    async fn unknown_tool_has_no_route() {
        let upstreams = Upstreams::new(&BTreeMap::new()).unwrap();
        let err = upstreams
            .call("nowhere.tool", &json!(1), &Map::new(), None, None)
            .await
            .unwrap_err();
        assert!(matches!(err, UpstreamError::NoRoute));
        assert_eq!(err.code(), 5004);
        assert!(upstreams.list_tools().await.tools.is_empty());
    }
}
