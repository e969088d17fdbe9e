//! `GET /v1/keys` (SPEC 14): the gateway's public keys as a JWK Set, without authentication, so that
//! anyone holding a receipt or an export can verify it.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};

use crate::evidence::Evidence;

/// The JWK Set (RFC 7517, RFC 8037) of the keys that sign receipts and audit checkpoints.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)] // Documents the answer built by `Evidence::key_set`.
struct KeySet {
    /// `{"kty": "OKP", "crv": "Ed25519", "x", "kid", "alg": "EdDSA", "use": "sig"}` each: this replica's
    /// key, the retired ones (`signing.previous_public_keys`) and the other replicas'
    /// (`signing.replica_public_keys`): only keys the configuration names, never one from the store.
    keys: Vec<serde_json::Map<String, serde_json::Value>>,
}

/// The public keys that verify receipts and audit checkpoints.
#[utoipa::path(get, path = "/v1/keys", operation_id = "signing_keys", tag = "operations",
    responses((status = 200, description = "A JWK Set", body = KeySet)))]
pub async fn keys(State(evidence): State<Arc<Evidence>>) -> Response {
    axum::Json(evidence.key_set()).into_response()
}
