//! What must be durable, behind one trait: sessions, claims, seen envelope signatures, counters (rate
//! limits, budgets), store-managed security contexts and the audit chain. Every operation that decides
//! something is atomic by contract (insert-if-absent, compare-and-set), never by a process-local lock, so
//! that several replicas can share one store. Calls block: async callers go through `spawn_blocking`.

pub mod sled_store;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use sled_store::SledStore;

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StoreError(pub String);

impl StoreError {
    pub fn new(err: impl std::fmt::Display) -> Self {
        StoreError(err.to_string())
    }
}

pub type StoreResult<T> = Result<T, StoreError>;

/// A registered execution (SPEC section 5). Written once; afterwards only revocation changes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionRecord {
    pub session_id: String,
    /// Raw 32-byte Ed25519 key, base64; erased (None) when the session is revoked.
    pub public_key: Option<String>,
    pub security_context: String,
    /// Unix seconds.
    pub expires_at: i64,
    pub agent_id: Option<String>,
    pub workload_id: Option<String>,
    pub allowed_tool_patterns: Vec<String>,
    pub max_calls: Option<u64>,
    /// The token the gateway minted at registration, repeated on an identical re-registration; erased on revoke.
    pub security_token: Option<String>,
    pub created_at_ms: i64,
    pub revoked_at_ms: Option<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum ClaimStatus {
    Pending,
    Committed,
}

impl ClaimStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimStatus::Pending => "PENDING",
            ClaimStatus::Committed => "COMMITTED",
        }
    }
}

/// What a COMMITTED claim holds: the tool's answer, or the marker that the answer was withheld (2007).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ClaimOutcome {
    /// A JSON-RPC response object (`result` or `error`); SKIPs return it with the caller's id.
    Answer { response: Value },
    /// The answer exceeded the capability's `max_response_size`; every SKIP answers 2007 again.
    ResponseTooLarge { limit: u64 },
    /// A settled standalone claim (`POST /settle`): the result as given.
    Settled { result: Value },
}

/// Who resolved a PENDING claim by hand, and why (SPEC 7.4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Resolution {
    pub actor: String,
    pub outcome: String,
    pub evidence: Option<String>,
    pub at: String,
}

/// One claim (SPEC section 7). `claimed_at` and `action_ref` are fixed when it is taken.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClaimRecord {
    pub request_id: String,
    /// The tool name (claims taken by `/v1/invoke`) or the action given to `POST /claim`.
    pub action: String,
    pub agent_id: String,
    pub session_id: Option<String>,
    pub status: ClaimStatus,
    pub claimed_at: String,
    pub claimed_at_ms: i64,
    pub action_ref: String,
    pub committed_at: Option<String>,
    pub outcome: Option<ClaimOutcome>,
    pub resolution: Option<Resolution>,
}

/// A context managed over the API (not from a file), as its JSON spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredContext {
    pub name: String,
    pub spec: Value,
}

/// The durable state of the gateway. Implementations: [`SledStore`] (embedded default).
pub trait Store: crate::audit::AuditBackend {
    /// Cheap liveness probe for `/readyz` and fail-closed checks.
    fn ping(&self) -> StoreResult<()>;

    /// Inserts the session unless its id exists; returns the existing record otherwise (nothing written).
    fn session_insert(&self, record: &SessionRecord) -> StoreResult<Option<SessionRecord>>;
    fn session_get(&self, session_id: &str) -> StoreResult<Option<SessionRecord>>;
    /// Replaces `old` with `new` only if the stored record still equals `old`; durable when it returns true.
    fn session_replace(&self, old: &SessionRecord, new: &SessionRecord) -> StoreResult<bool>;

    /// Atomically applies `update` to the integer cell `key` (None = absent). `update` returns the new
    /// value, or None to leave the cell unchanged; it may run more than once under contention.
    /// Returns what `update` returned on the run that won.
    fn counter_update(
        &self,
        key: &str,
        update: &mut dyn FnMut(Option<i64>) -> Option<i64>,
    ) -> StoreResult<Option<i64>>;
    fn counter_get(&self, key: &str) -> StoreResult<Option<i64>>;

    /// Remembers an envelope signature until `expires_at_ms`; false when it was already remembered.
    fn remember_signature(&self, signature: &[u8], expires_at_ms: i64) -> StoreResult<bool>;
    /// Forgets signatures whose window has passed; returns how many.
    fn purge_signatures(&self, now_ms: i64) -> StoreResult<usize>;

    /// Inserts a PENDING claim unless the request id exists (then returns the existing record).
    /// Durable (flushed) before it returns `None`.
    fn claim_insert(&self, record: &ClaimRecord) -> StoreResult<Option<ClaimRecord>>;
    fn claim_get(&self, request_id: &str) -> StoreResult<Option<ClaimRecord>>;
    /// Compare-and-set: replaces `old` by `new` (None deletes, i.e. releases) only if the stored record
    /// still equals `old`. Durable before it returns true.
    fn claim_replace(&self, old: &ClaimRecord, new: Option<&ClaimRecord>) -> StoreResult<bool>;
    /// Visits claims newest first (by claim time), starting below `before` (a cursor from an earlier
    /// visit: claimed_at_ms and request id) until `visit` returns false.
    fn claim_scan_newest_first(
        &self,
        before: Option<(i64, &str)>,
        visit: &mut dyn FnMut(&ClaimRecord) -> bool,
    ) -> StoreResult<()>;

    fn context_put(&self, context: &StoredContext) -> StoreResult<()>;
    /// True when something was deleted.
    fn context_delete(&self, name: &str) -> StoreResult<bool>;
    fn context_list(&self) -> StoreResult<Vec<StoredContext>>;

    /// Makes everything written so far durable.
    fn flush(&self) -> StoreResult<()>;
}
