//! The OpenAPI 3.1 document served at `GET /openapi.json`. Paths come from the `#[utoipa::path]`
//! attributes of the very handlers the router registers (utoipa-axum), and schemas from the types they
//! read and answer, so the document and the routes cannot drift apart. What every operation shares (the
//! operator bearer scheme and the SPEC error answers) is added here once.

use serde::Deserialize;
use serde_json::Value;
use utoipa::openapi::path::Operation;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi, Ref, ResponseBuilder};

/// The error answer of SPEC section 10, for every refusal of every endpoint.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)] // Describes `ApiError::body()`; a unit test holds the two together.
pub struct ErrorBody {
    /// Always `seal/v1`.
    protocol: String,
    /// Always `error`.
    status: String,
    error: ErrorDetail,
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct ErrorDetail {
    /// The SPEC code, e.g. 6003.
    code: u16,
    /// The code's name, e.g. `NOT_FOUND`.
    name: String,
    /// What was wrong, naming the field or parameter.
    message: String,
    /// RFC 3339 with milliseconds.
    timestamp: String,
    trace_id: String,
    #[serde(default)]
    details: Option<Value>,
    /// The signed receipt of a refused call that passed check 8 (SPEC 14).
    #[serde(default)]
    receipt: Option<Value>,
}

#[derive(utoipa::OpenApi)]
#[openapi(
    info(
        title = "sealgate",
        description = "The control API of sealgate (orchestrators and operators), its agent endpoint, \
                       health and metrics. Errors always carry the seal/v1 error body.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    components(schemas(ErrorBody)),
    tags(
        (name = "sessions", description = "Registering, listing, reading and revoking sessions"),
        (name = "contexts", description = "Security contexts: read, manage, evaluate"),
        (name = "claims", description = "Claims: list, read, resolve; the standalone claim API"),
        (name = "approvals", description = "Approval requests of risky calls: list, read, grant, deny"),
        (name = "audit", description = "The audit trail"),
        (name = "tools", description = "The MCP upstreams' tool definitions: pinned, changed, accepted (SPEC 18)"),
        (name = "agents", description = "The agents' signed calls"),
        (name = "operations", description = "Health, readiness, metrics, this document"),
        (name = "sign-in", description = "Console sessions of people signed in with the identity provider (SPEC 16)"),
    )
)]
struct ApiDoc;

/// The document's skeleton: info, tags and the error schema; the router adds the paths.
pub fn skeleton() -> OpenApi {
    <ApiDoc as utoipa::OpenApi>::openapi()
}

/// Adds what every operation shares: the operator token scheme, and the error answers each kind of
/// operation can give (a request body can be unreadable, a path can name nothing, ...).
pub fn finish(mut doc: OpenApi) -> OpenApi {
    let components = doc.components.get_or_insert_with(Default::default);
    components.add_security_scheme(
        "operator",
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .bearer_format("JWT")
                .description(Some(
                    "An operator token: a JWT verified with operator_auth.keys, whose space-separated \
                     `scope` claim must hold the scope each operation names",
                ))
                .build(),
        ),
    );
    components.responses.insert(
        "Error".into(),
        ResponseBuilder::new()
            .description("The seal/v1 error body")
            .content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("ErrorBody")))
                    .build(),
            )
            .build()
            .into(),
    );
    for (path, item) in doc.paths.paths.iter_mut() {
        let has_path_params = path.contains('{');
        for operation in [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
        ]
        .into_iter()
        .flatten()
        {
            add_errors(operation, has_path_params);
        }
    }
    doc
}

fn add_errors(operation: &mut Operation, has_path_params: bool) {
    let mut codes: Vec<&str> = Vec::new();
    if operation.security.is_some() {
        // Bad or missing token, missing scope, invalid query or body, store unavailable.
        codes.extend(["401", "403", "422", "503"]);
    }
    if has_path_params {
        codes.push("404");
    }
    if operation.request_body.is_some() {
        // Not JSON, larger than limits.max_body_bytes, not arrived within the body timeout.
        codes.extend(["400", "408", "413"]);
    }
    for code in codes {
        operation
            .responses
            .responses
            .entry(code.to_string())
            .or_insert_with(|| Ref::new("#/components/responses/Error").into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{ApiError, Code};

    #[test]
    fn the_error_schema_describes_the_error_body() {
        for error in [
            ApiError::new(Code::NotFound, "no such endpoint"),
            ApiError::new(Code::StoreUnavailable, "down")
                .with_details(serde_json::json!({"forwarded": true})),
        ] {
            let parsed: Result<ErrorBody, _> = serde_json::from_value(error.body());
            assert!(parsed.is_ok(), "{}", error.body());
        }
    }

    #[test]
    fn the_document_is_openapi_3_1_and_every_control_operation_is_secured() {
        let doc = serde_json::to_value(super::super::documented_routes().into_openapi()).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        let paths = doc["paths"].as_object().unwrap();
        for path in [
            "/v1/seal/sessions",
            "/v1/seal/sessions/{id}",
            "/v1/security-contexts/{name}/evaluate",
            "/v1/claims/{request_id}/resolve",
            "/v1/approvals",
            "/v1/approvals/{approval_id}/grant",
            "/settle/{request_id}",
            "/v1/audit",
            "/v1/audit/checkpoints",
            "/v1/invoke",
            "/v1/keys",
            "/metrics",
        ] {
            assert!(paths.contains_key(path), "{path} is missing");
        }
        let mut operation_ids = std::collections::HashSet::new();
        for (path, item) in paths {
            for (method, operation) in item.as_object().unwrap() {
                let id = operation["operationId"].as_str().unwrap();
                assert!(operation_ids.insert(id), "operationId {id} repeated");
                // The agents' endpoint, and the public keys anyone verifies with (SPEC 14), take no
                // operator token.
                let public = path.ends_with("invoke") || path == "/v1/keys";
                let control = path.starts_with("/v1/") && !public
                    || ["/claim", "/audit", "/metrics"].contains(&path.as_str())
                    || path.starts_with("/settle/");
                assert_eq!(
                    operation.get("security").is_some(),
                    control,
                    "{method} {path}"
                );
            }
        }
    }
}
