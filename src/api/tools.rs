//! Pinned tool definitions over the API (SPEC 18): every MCP upstream's tools with their status, and the
//! accept of a definition seen. Tools belong to no team (SPEC 16): both scopes are needed on every team,
//! as `/metrics` needs its own.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::{json_body, ApiPath, ControlBody};
use crate::error::{ApiError, Code};
use crate::gateway::Gateway;
use crate::identity::{scopes, Caller};
use crate::tools::{AcceptError, ToolStatus};

/// Every tool of every MCP upstream.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ToolList {
    items: Vec<ToolStatus>,
}

/// The definition to accept: its hash, as `GET /v1/tools` shows under `seen`.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Accept {
    definition_sha256: String,
}

/// Lists every tool of every MCP upstream (listed anew from the upstreams), with its `status`
/// (`pinned`, `changed`, `new`), whether it is withheld and why, and both definitions.
#[utoipa::path(get, path = "/v1/tools", operation_id = "list_tools", tag = "tools",
    security(("operator" = ["seal.tool.read"])),
    responses((status = 200, description = "The tools", body = ToolList)))]
pub async fn list(State(gw): State<Arc<Gateway>>, caller: Caller) -> Result<Response, ApiError> {
    caller.require_everywhere(scopes::TOOL_READ)?;
    gw.listed_tools().await;
    Ok(axum::Json(ToolList {
        items: gw.tools().statuses(),
    })
    .into_response())
}

/// Pins the definition of `tool` that its upstream lists now, which must be the one named by
/// `definition_sha256` (else 409); the tool is then listed and callable again.
#[utoipa::path(post, path = "/v1/tools/{tool}/accept", operation_id = "accept_tool", tag = "tools",
    params(("tool" = String, Path, description = "The tool as agents call it: `upstream.tool`")),
    request_body = Accept,
    security(("operator" = ["seal.tool.review"])),
    responses(
        (status = 200, description = "The tool, pinned", body = ToolStatus),
        (status = 404, description = "No MCP upstream lists this tool", body = super::openapi::ErrorBody),
        (status = 409, description = "`definition_sha256` is not the definition seen now", body = super::openapi::ErrorBody),
    ))]
pub async fn accept(
    State(gw): State<Arc<Gateway>>,
    caller: Caller,
    ApiPath(tool): ApiPath<String>,
    ControlBody(body): ControlBody,
) -> Result<Response, ApiError> {
    caller.require_everywhere(scopes::TOOL_REVIEW)?;
    let request: Accept = json_body(&body)?;
    gw.observe_upstream_of(&tool).await;
    match gw
        .tools()
        .accept(&tool, &request.definition_sha256, &caller.identity)
        .await
    {
        Ok(status) => Ok(axum::Json(status).into_response()),
        Err(AcceptError::NotFound) => Err(ApiError::new(
            Code::NotFound,
            format!("no MCP upstream lists a tool {tool:?}"),
        )),
        Err(AcceptError::NotSeen(seen)) => Err(ApiError::new(
            Code::Conflict,
            format!(
                "definition_sha256 is not the definition of {tool} seen now ({})",
                seen.as_deref().unwrap_or("none is listed")
            ),
        )
        .with_details(serde_json::json!({ "seen_sha256": seen }))),
        Err(AcceptError::Store(e)) => Err(ApiError::new(Code::StoreUnavailable, e)),
    }
}
