//! Shadow versions of security contexts over the API (SPEC 6.4 r4): set one, remove it, and read it with
//! the summary of what it decided beside the version in force.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::contexts::{file_backed, find, parse_spec, ContextWrites};
use super::{json_body, ApiPath, ControlBody};
use crate::error::{ApiError, Code};
use crate::gateway::{SHADOW_REMOVED, SHADOW_SET};
use crate::identity::{scopes, Caller};
use crate::policy::{ContextRegistry, SecurityContext};
use crate::shadow::Tallies;
use crate::store::Shelf;

fn no_shadow(name: &str) -> ApiError {
    ApiError::new(
        Code::NotFound,
        format!("security context {name:?} has no shadow version"),
    )
}

/// The shadow of `name`, for doing `scope` to it: the shadow of another team's context is not found.
fn find_shadow(
    contexts: &ContextRegistry,
    caller: &Caller,
    name: &str,
    scope: &str,
) -> Result<Arc<SecurityContext>, ApiError> {
    let shadow = contexts.shadow(name).ok_or_else(|| no_shadow(name))?;
    caller.require_visible(shadow.team(), scopes::CONTEXT_READ, scope, || {
        no_shadow(name)
    })?;
    Ok(shadow)
}

/// The shadow as the API shows it: its spec, `version` and `source`, the version in force beside it,
/// and the summary of the calls it decided.
async fn shadow_view(
    contexts: &ContextRegistry,
    tallies: &Tallies,
    shadow: &SecurityContext,
) -> Result<Value, ApiError> {
    let summary = tallies.summary(shadow).await.map_err(ApiError::store)?;
    let mut view = shadow.api_view();
    view["live_version"] = json!(contexts.get(shadow.name()).map(|c| c.version.clone()));
    view["summary"] = json!(summary);
    Ok(view)
}

/// Reads a context's shadow version, with what it decided since it was set: calls, how many decisions
/// differed, and the differences by tool and pair of decisions.
#[utoipa::path(get, path = "/v1/security-contexts/{name}/shadow", operation_id = "read_shadow", tag = "contexts",
    params(("name" = String, Path, description = "The context name")),
    security(("operator" = ["seal.context.read"])),
    responses(
        (status = 200, description = "The shadow version, `live_version`, and its `summary`", body = Object),
        (status = 404, description = "The context has no shadow version", body = super::openapi::ErrorBody),
    ))]
pub async fn read(
    State(contexts): State<Arc<ContextRegistry>>,
    State(tallies): State<Arc<Tallies>>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
) -> Result<Response, ApiError> {
    caller.require_some(scopes::CONTEXT_READ)?;
    let shadow = find_shadow(&contexts, &caller, &name, scopes::CONTEXT_READ)?;
    Ok(axum::Json(shadow_view(&contexts, &tallies, &shadow).await?).into_response())
}

/// Sets or replaces a context's shadow version, kept in the store. The context must exist; a shadow file
/// of that name is read-only here (409). Checked like a context: an invalid one changes nothing (422).
#[utoipa::path(put, path = "/v1/security-contexts/{name}/shadow", operation_id = "put_shadow", tag = "contexts",
    params(("name" = String, Path, description = "The context name")),
    request_body(content = Object, description = "The candidate version, as PUT /v1/security-contexts/{name} takes a context"),
    security(("operator" = ["seal.context.write"])),
    responses(
        (status = 201, description = "Set", body = Object),
        (status = 200, description = "Replaced; its summary starts over", body = Object),
        (status = 409, description = "The shadow comes from a file", body = super::openapi::ErrorBody),
    ))]
pub async fn put(
    State(writes): State<ContextWrites>,
    State(tallies): State<Arc<Tallies>>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    ControlBody(body): ControlBody,
) -> Result<Response, ApiError> {
    caller.require_some(scopes::CONTEXT_WRITE)?;
    let (spec, shadow) = parse_spec(&name, json_body(&body)?)?;
    let _turn = writes.contexts.store_change_turn().await;
    // The context's team and the shadow's: promoting the shadow would give the context to the latter.
    find(&writes.contexts, &caller, &name, scopes::CONTEXT_WRITE)?;
    caller.require(shadow.team(), scopes::CONTEXT_WRITE)?;
    let existed = match writes.contexts.shadow(&name) {
        Some(current) => {
            if let Some(conflict) = file_backed(&current) {
                return Err(conflict);
            }
            true
        }
        None => false,
    };
    writes
        .save_recorded(&caller, Shelf::Shadow, spec, shadow, Some(SHADOW_SET))
        .await?;
    let status = if existed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    let shadow = find_shadow(&writes.contexts, &caller, &name, scopes::CONTEXT_WRITE)?;
    let view = shadow_view(&writes.contexts, &tallies, &shadow).await?;
    Ok((status, axum::Json(view)).into_response())
}

/// Removes a context's shadow version (a shadow file is read-only here: 409). The version in force is
/// untouched.
#[utoipa::path(delete, path = "/v1/security-contexts/{name}/shadow", operation_id = "delete_shadow", tag = "contexts",
    params(("name" = String, Path, description = "The context name")),
    security(("operator" = ["seal.context.write"])),
    responses(
        (status = 200, description = "Removed", body = Object),
        (status = 404, description = "The context has no shadow version", body = super::openapi::ErrorBody),
        (status = 409, description = "The shadow comes from a file", body = super::openapi::ErrorBody),
    ))]
pub async fn delete(
    State(writes): State<ContextWrites>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
) -> Result<Response, ApiError> {
    caller.require_some(scopes::CONTEXT_WRITE)?;
    let _turn = writes.contexts.store_change_turn().await;
    let current = find_shadow(&writes.contexts, &caller, &name, scopes::CONTEXT_WRITE)?;
    writes
        .remove_recorded(&caller, Shelf::Shadow, &current, SHADOW_REMOVED)
        .await?;
    Ok(axum::Json(json!({"name": name, "status": "deleted"})).into_response())
}
