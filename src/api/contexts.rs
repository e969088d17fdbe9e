//! Security contexts over the API (SPEC 6.4): read, manage store-kept contexts, and explain decisions.

use crate::identity::{scopes, Caller};
use std::sync::Arc;

use axum::extract::{FromRef, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::{json_body, ApiPath, AppState, ControlBody};
use crate::audit::{AuditEvent, AuditLog, EventType};
use crate::error::{ApiError, Code};
use crate::gateway::{apply_stored, remove_stored};
use crate::policy::{self, ContextRegistry, ContextSource, RegistryError, SecurityContext};
use crate::store::{Shelf, Store, StoredContext};

/// Every loaded context, by name.
#[derive(Serialize, utoipa::ToSchema)]
pub struct ContextList {
    /// Each context's spec (as in its file), with `version` and `source` added.
    items: Vec<Value>,
}

/// Lists every loaded security context, from files and from the API.
#[utoipa::path(get, path = "/v1/security-contexts", operation_id = "list_contexts", tag = "contexts",
    security(("operator" = ["seal.context.read"])),
    responses((status = 200, description = "The contexts", body = ContextList)))]
pub async fn list(
    State(contexts): State<Arc<ContextRegistry>>,
    caller: Caller,
) -> Result<Response, ApiError> {
    let teams = caller.require_some(scopes::CONTEXT_READ)?;
    let mut contexts = contexts.list();
    contexts.retain(|c| teams.admits(c.team()));
    contexts.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
    let items: Vec<Value> = contexts.iter().map(|c| c.api_view()).collect();
    Ok(axum::Json(ContextList { items }).into_response())
}

pub(super) fn not_found(name: &str) -> ApiError {
    ApiError::new(Code::NotFound, format!("no security context {name:?}"))
}

/// The context `name`, for doing `scope` to it: another team's context is not found (SPEC 16), like a
/// missing one.
pub(super) fn find(
    contexts: &ContextRegistry,
    caller: &Caller,
    name: &str,
    scope: &str,
) -> Result<Arc<SecurityContext>, ApiError> {
    let context = contexts.get(name).ok_or_else(|| not_found(name))?;
    caller.require_visible(context.team(), scopes::CONTEXT_READ, scope, || {
        not_found(name)
    })?;
    Ok(context)
}

/// Reads one context: its spec, `version` and `source`, and `shadow_version` when a shadow version decides
/// beside it.
#[utoipa::path(get, path = "/v1/security-contexts/{name}", operation_id = "read_context", tag = "contexts",
    params(("name" = String, Path, description = "The context name")),
    security(("operator" = ["seal.context.read"])),
    responses((status = 200, description = "The context", body = Object)))]
pub async fn read(
    State(contexts): State<Arc<ContextRegistry>>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
) -> Result<Response, ApiError> {
    caller.require_some(scopes::CONTEXT_READ)?;
    let mut view = find(&contexts, &caller, &name, scopes::CONTEXT_READ)?.api_view();
    // Whether a shadow version decides beside it (SPEC 6.4 r4), so that a reader need not ask for one.
    if let Some(shadow) = contexts.shadow(&name) {
        view["shadow_version"] = Value::from(shadow.version.clone());
    }
    Ok(axum::Json(view).into_response())
}

pub(super) fn file_backed(context: &SecurityContext) -> Option<ApiError> {
    matches!(context.source, ContextSource::File(_)).then(|| {
        ApiError::new(
            Code::Conflict,
            format!(
                "security context {:?} comes from a file and is read-only here",
                context.spec.name
            ),
        )
    })
}

/// A context as PUT takes it (and as an evaluate request's draft): an object whose `name`, when given,
/// equals the path's; checked as a policy file is. `version`, `source` and `shadow_version`, which the
/// gateway adds to what it answers, are dropped, so that a context read can be sent back as it is. Returns the spec
/// with its name and the context.
pub(super) fn parse_spec(
    name: &str,
    mut spec: Value,
) -> Result<(Value, SecurityContext), ApiError> {
    let obj = spec.as_object_mut().ok_or_else(|| {
        ApiError::new(
            Code::InvalidRequest,
            "the body must be a security context object",
        )
    })?;
    obj.remove("version");
    obj.remove("source");
    obj.remove("shadow_version");
    match obj.get("name") {
        None => {
            obj.insert("name".into(), json!(name));
        }
        Some(Value::String(given)) if *given == name => {}
        Some(_) => {
            return Err(ApiError::new(
                Code::InvalidRequest,
                format!("name: must equal the path's name {name:?}"),
            ));
        }
    }
    let context = policy::parse_context_json(&spec)?;
    Ok((spec, context))
}

/// Creates or replaces a context kept in the store (file-backed ones are read-only here: 409).
#[utoipa::path(put, path = "/v1/security-contexts/{name}", operation_id = "put_context", tag = "contexts",
    params(("name" = String, Path, description = "The context name")),
    request_body(content = Object, description = "A security context, as in a policy file, in JSON"),
    security(("operator" = ["seal.context.write"])),
    responses(
        (status = 201, description = "Created", body = Object),
        (status = 200, description = "Replaced", body = Object),
        (status = 409, description = "The context comes from a file", body = super::openapi::ErrorBody),
    ))]
pub async fn put(
    State(writes): State<ContextWrites>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    ControlBody(body): ControlBody,
) -> Result<Response, ApiError> {
    caller.require_some(scopes::CONTEXT_WRITE)?;
    let spec: Value = json_body(&body)?;
    let (spec, context) = parse_spec(&name, spec)?;
    let _turn = writes.contexts.store_change_turn().await;
    // SPEC 16: the write scope on the context's team before the write, and on its team after it.
    let existed = match writes.contexts.get(&name) {
        Some(current) => {
            caller.require_visible(
                current.team(),
                scopes::CONTEXT_READ,
                scopes::CONTEXT_WRITE,
                || not_found(&name),
            )?;
            if let Some(conflict) = file_backed(&current) {
                return Err(conflict);
            }
            true
        }
        None => false,
    };
    caller.require(context.team(), scopes::CONTEXT_WRITE)?;
    writes
        .save_recorded(&caller, Shelf::Live, spec, context, None)
        .await?;
    let status = if existed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((
        status,
        axum::Json(find(&writes.contexts, &caller, &name, scopes::CONTEXT_WRITE)?.api_view()),
    )
        .into_response())
}

/// What a change to the contexts kept in the store works with: the store first, then this replica's
/// registry, and the audit trail that records the change. Each change takes the registry's
/// [`ContextRegistry::store_change_turn`] first.
#[derive(Clone)]
pub(super) struct ContextWrites {
    store: Arc<dyn Store>,
    pub(super) contexts: Arc<ContextRegistry>,
    pub(super) audit: AuditLog,
}

impl FromRef<AppState> for ContextWrites {
    fn from_ref(state: &AppState) -> Self {
        ContextWrites {
            store: FromRef::from_ref(state),
            contexts: FromRef::from_ref(state),
            audit: FromRef::from_ref(state),
        }
    }
}

impl ContextWrites {
    /// Saves `context` on `shelf` as `spec` for `caller` and records the change, with `detail` when
    /// given.
    pub(super) async fn save_recorded(
        &self,
        caller: &Caller,
        shelf: Shelf,
        spec: Value,
        context: SecurityContext,
        detail: Option<&str>,
    ) -> Result<(), ApiError> {
        let team = context.team();
        let mut event = AuditEvent::new(EventType::SecurityContextChanged)
            .scp(context.name())
            .context_version(&context.version)
            .team(team)
            .actor(&caller.identity, Some(team));
        if let Some(detail) = detail {
            event = event.detail(detail);
        }
        self.save(shelf, spec, context).await?;
        self.audit.record(event).await?;
        Ok(())
    }

    /// Saves a context kept in the store, or a shadow version, as `spec`: in the store first, so that a
    /// failure there changes nothing, then in this replica's registry.
    async fn save(
        &self,
        shelf: Shelf,
        spec: Value,
        context: SecurityContext,
    ) -> Result<(), ApiError> {
        let stored = StoredContext {
            name: context.name().to_owned(),
            spec,
        };
        self.store
            .context_put(shelf, &stored)
            .await
            .map_err(ApiError::store)?;
        let contexts = self.contexts.clone();
        tokio::task::spawn_blocking(move || apply_stored(&contexts, shelf, context))
            .await
            .map_err(ApiError::store)?
            .map_err(|e| ApiError::new(Code::Conflict, e.to_string()))?;
        Ok(())
    }

    /// Removes a context kept in the store, or a shadow version: from the store, then from this
    /// replica's registry.
    async fn remove(&self, shelf: Shelf, name: &str) -> Result<(), ApiError> {
        self.store
            .context_delete(shelf, name)
            .await
            .map_err(ApiError::store)?;
        let (contexts, key) = (self.contexts.clone(), name.to_owned());
        match tokio::task::spawn_blocking(move || remove_stored(&contexts, shelf, &key))
            .await
            .map_err(ApiError::store)?
        {
            // Gone already is gone.
            Ok(_) | Err(RegistryError::NotFound(_)) => Ok(()),
            Err(conflict) => Err(ApiError::new(Code::Conflict, conflict.to_string())),
        }
    }

    /// Removes `current` from `shelf` for `caller` (a file's version is read-only here: 409) and
    /// records the change with `detail`.
    pub(super) async fn remove_recorded(
        &self,
        caller: &Caller,
        shelf: Shelf,
        current: &SecurityContext,
        detail: &str,
    ) -> Result<(), ApiError> {
        if let Some(conflict) = file_backed(current) {
            return Err(conflict);
        }
        self.remove(shelf, current.name()).await?;
        self.audit
            .record(
                AuditEvent::new(EventType::SecurityContextChanged)
                    .scp(current.name())
                    .detail(detail)
                    .team(current.team())
                    .actor(&caller.identity, Some(current.team())),
            )
            .await?;
        Ok(())
    }
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct ContextDeleted {
    name: String,
    /// Always `deleted`.
    status: &'static str,
}

/// Deletes a context kept in the store (file-backed ones are read-only here: 409).
#[utoipa::path(delete, path = "/v1/security-contexts/{name}", operation_id = "delete_context", tag = "contexts",
    params(("name" = String, Path, description = "The context name")),
    security(("operator" = ["seal.context.write"])),
    responses(
        (status = 200, description = "Deleted", body = ContextDeleted),
        (status = 409, description = "The context comes from a file", body = super::openapi::ErrorBody),
    ))]
pub async fn delete(
    State(writes): State<ContextWrites>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
) -> Result<Response, ApiError> {
    caller.require_some(scopes::CONTEXT_WRITE)?;
    let _turn = writes.contexts.store_change_turn().await;
    let current = find(&writes.contexts, &caller, &name, scopes::CONTEXT_WRITE)?;
    writes
        .remove_recorded(&caller, Shelf::Live, &current, "removed")
        .await?;
    Ok(axum::Json(ContextDeleted {
        name,
        status: "deleted",
    })
    .into_response())
}

/// A call to explain.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EvaluateRequest {
    /// The tool name, e.g. `fs.read_file`.
    tool: String,
    /// The call's arguments.
    #[serde(default)]
    arguments: Map<String, Value>,
    /// A draft of this context, as PUT takes it, to evaluate instead of the saved one: the dry run of an
    /// edit. Nothing is saved, and the context need not exist yet.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    draft: Option<Value>,
    /// Labels the session is assumed to hold (SPEC 19), to explain what the flow rules decide.
    #[serde(default)]
    session_labels: Vec<String>,
}

/// Explains what the context would decide for a call, and why; calls nothing.
#[utoipa::path(post, path = "/v1/security-contexts/{name}/evaluate", operation_id = "evaluate_context", tag = "contexts",
    params(("name" = String, Path, description = "The context name")),
    request_body = EvaluateRequest,
    security(("operator" = ["seal.context.read"])),
    responses((status = 200, description = "The decision (`allow` or the code) and the rule that made it", body = Object)))]
pub async fn evaluate(
    State(contexts): State<Arc<ContextRegistry>>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    ControlBody(body): ControlBody,
) -> Result<Response, ApiError> {
    caller.require_some(scopes::CONTEXT_READ)?;
    let request: EvaluateRequest = json_body(&body)?;
    let context = match request.draft {
        // The caller's own draft: the stored context (perhaps another team's) is never looked at.
        Some(draft) => {
            let draft = parse_spec(&name, draft)
                .map(|(_, context)| context)
                .map_err(|mut e| {
                    e.message = format!("draft: {}", e.message);
                    e
                })?;
            caller.require(draft.team(), scopes::CONTEXT_READ)?;
            Arc::new(draft)
        }
        None => find(&contexts, &caller, &name, scopes::CONTEXT_READ)?,
    };
    crate::envelope::ToolName::parse(&request.tool)
        .map_err(|e| ApiError::new(Code::InvalidRequest, format!("tool: {e}")))?;
    // Refused as the gateway refuses such a call's payload (1000), before any policy is asked.
    crate::strict_json::refuse_case_folded_names(&request.arguments)
        .map_err(|e| ApiError::new(Code::InvalidRequest, format!("arguments: {e}")))?;
    let mut held = Vec::with_capacity(request.session_labels.len());
    for (index, label) in request.session_labels.iter().enumerate() {
        if !policy::model::is_label(label) {
            return Err(ApiError::new(
                Code::InvalidRequest,
                format!("session_labels[{index}]: invalid label: letters, digits, '_' or '-'"),
            ));
        }
        held.push(policy::HeldLabel::assumed(label));
    }
    Ok(axum::Json(policy::explain::explain(
        &context,
        &request.tool,
        &request.arguments,
        &held,
    ))
    .into_response())
}
