//! What must be durable, behind one async trait shaped for a networked backend: sessions, claims, seen
//! envelope signatures, counters (rate limits, budgets), store-managed security contexts and the audit
//! chain. Every operation that decides something is atomic by contract (insert-if-absent,
//! compare-and-set), never by a process-local lock, so that several replicas can share one store.
//!
//! Listings, counts and event reads (`*_page`, `live_counts`, `events_*`) may see only what was synced;
//! lookups (`*_get`, `approval_current`, `counter_get`) and every decision see every write before them.
//!
//! Writes are not durable when they return: durability comes from [`crate::audit::AuditBackend::sync`],
//! the one barrier per phase. Every phase of a call ends in an audit event whose group commit syncs the
//! store first, so the claim, the replay record and the counters written before the event are durable
//! with it (SPEC 12: one sync per phase, shared by every concurrent call).

pub mod cli;
#[cfg(test)]
pub(crate) mod conformance;
mod import_sled;
pub mod postgres;
pub mod sqlite;
pub mod testing;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::identity::{Identity, Via, LOCAL_ISSUER};

pub use postgres::PgStore;
pub use sqlite::SqliteStore;

/// A record as the stores keep it: JSON text, which a compare-and-set compares byte for byte.
pub(crate) fn encode_record<T: Serialize>(value: &T) -> StoreResult<String> {
    serde_json::to_string(value).map_err(|e| StoreError::Corrupt(e.to_string()))
}

pub(crate) fn decode_record<T: serde::de::DeserializeOwned>(text: &str) -> StoreResult<T> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(e.to_string()))
}

/// A seq, a count or a limit as the databases' signed 64-bit integer: clamped, never wrapped.
pub(crate) fn sql_int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// `prev_hash` of the first event of a store: the head of an empty chain.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The last event of the audit chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainHead {
    pub seq: u64,
    pub hash: String,
}

impl ChainHead {
    /// Where the first event is chained from: an empty store.
    pub fn genesis() -> Self {
        ChainHead {
            seq: 0,
            hash: GENESIS_HASH.to_owned(),
        }
    }

    /// The head that a stored event makes: its `seq` and `hash`.
    pub fn of_event(event: &Value) -> StoreResult<ChainHead> {
        let seq = event.get("seq").and_then(Value::as_u64);
        let hash = event.get("hash").and_then(Value::as_str);
        match (seq, hash) {
            (Some(seq), Some(hash)) => Ok(ChainHead {
                seq,
                hash: hash.to_owned(),
            }),
            _ => Err(StoreError::Corrupt(
                "audit event without seq or hash".into(),
            )),
        }
    }
}

/// One sealed audit event as the stores take it: the writer's text and what a store keeps beside it,
/// so that no store parses or re-serialises an event it appends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    /// The event's line, stored as it is: the JCS text that was hashed, with its `hash` member (for an
    /// event holding numbers that JCS rounds, serde_json's text of what JCS reads back: the audit chain's
    /// `seal`).
    pub line: String,
    /// Its `seq` and `hash`: the head it makes.
    pub head: ChainHead,
    /// The labels it gives its session (SPEC 19), when it is a completion event that names any.
    pub labels: Option<LabelsAdded>,
}

/// A completion event's `session_id` and `labels_added` (SPEC 19), which the stores keep per session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelsAdded {
    pub session_id: String,
    pub labels: Vec<String>,
}

impl StoredEvent {
    /// An event already in JSON (one copied from an older store): its serde_json text is what is stored.
    pub fn of_value(event: &Value) -> StoreResult<StoredEvent> {
        Ok(StoredEvent {
            line: event.to_string(),
            head: ChainHead::of_event(event)?,
            labels: LabelsAdded::of_event(event),
        })
    }
}

impl LabelsAdded {
    /// The labels an event in JSON names, when it names its session too (none are kept without one).
    fn of_event(event: &Value) -> Option<LabelsAdded> {
        let labels = event.get(LABELS_ADDED).and_then(Value::as_array)?;
        Some(LabelsAdded {
            session_id: event.get("session_id").and_then(Value::as_str)?.to_owned(),
            labels: labels
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect(),
        })
    }
}

/// Chains a batch after the head it is given and returns the chained events (see
/// [`AuditBackend::append_in_turn`]).
pub type Chainer<'a> = dyn FnMut(&ChainHead) -> Vec<StoredEvent> + Send + 'a;

/// Where audit events are kept (SPEC 9): implemented by every store. The audit writer is its only writer
/// in a process; several processes (replicas) may share one store, so `append` is a compare-and-set on the
/// chain head. Every method is async, so that a networked store never blocks the runtime.
#[async_trait::async_trait]
pub trait AuditBackend: Send + Sync + 'static {
    /// The last event written (its seq and hash), `None` when the store holds no event.
    async fn head(&self) -> StoreResult<Option<ChainHead>>;
    /// Stores chained events, given in seq order and continuing `after` (seq 0 and 64 zeros for an empty
    /// store), only if `after` is still the store's head: otherwise [`StoreError::HeadMoved`] and nothing
    /// is stored, so that another replica's events are never forked. Not necessarily durable: see `sync`.
    /// On another `Err` the writer re-reads the head before the next batch, so a store that kept part of
    /// the batch is continued from what it kept. `settlements` are written with the events (in the same
    /// transaction where the store has them), and only when the events are.
    async fn append(
        &self,
        after: &ChainHead,
        events: &[StoredEvent],
        settlements: &[ClaimSettlement],
    ) -> StoreResult<()>;
    /// Like `append`, but chained after whatever the head is when this writer's turn comes: other
    /// writers wait while the head is read, `chain` chains the batch after it, and the batch is written.
    /// For a store shared by busy replicas, whose compare-and-sets would otherwise keep losing to each
    /// other. The default suits a store with one writer.
    async fn append_in_turn(
        &self,
        chain: &mut Chainer<'_>,
        settlements: &[ClaimSettlement],
    ) -> StoreResult<()> {
        let head = self.head().await?.unwrap_or_else(ChainHead::genesis);
        let events = chain(&head);
        self.append(&head, &events, settlements).await
    }
    /// Makes everything written to the store so far durable (fsync, or nothing where every write is a
    /// commit): events, claims, sessions, replay records, counters.
    async fn sync(&self) -> StoreResult<()>;
    /// `append`, then `sync`: a batch that callers wait for. A store whose writes and commits go through
    /// one queue sends both at once, so that the batch costs one round trip to its writer, not two.
    async fn append_durably(
        &self,
        after: &ChainHead,
        events: &[StoredEvent],
        settlements: &[ClaimSettlement],
    ) -> StoreResult<()> {
        self.append(after, events, settlements).await?;
        self.sync().await
    }
    /// Up to `limit` stored events in descending seq order, below `before_seq` (from the newest when
    /// `None`). Fewer than `limit` means none are left.
    async fn events_newest_first(
        &self,
        before_seq: Option<u64>,
        limit: usize,
    ) -> StoreResult<Vec<Value>>;
    /// Up to `limit` stored events in ascending seq order from `from_seq` (the export of SPEC 9.3). Fewer
    /// than `limit` means none are left.
    async fn events_oldest_first(&self, from_seq: u64, limit: usize) -> StoreResult<Vec<Value>>;
}

/// Why the store could not do what was asked. Any of them is a 5005 at the edge (fail closed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The engine refused or could not reach its storage.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// A stored record does not decode: never acted upon.
    #[error("corrupt record: {0}")]
    Corrupt(String),
    /// `append` was given a head that is no longer the chain's last event: another replica wrote since.
    /// The writer re-reads the head and chains the batch again.
    #[error("the audit chain head moved (another replica appended)")]
    HeadMoved,
}

impl StoreError {
    pub fn unavailable(err: impl std::fmt::Display) -> Self {
        StoreError::Unavailable(err.to_string())
    }
}

pub type StoreResult<T> = Result<T, StoreError>;

/// The team of a record made before teams (SPEC 16).
fn default_team() -> String {
    crate::identity::DEFAULT_TEAM.to_owned()
}

/// Team `default` is not written: a record made before teams then encodes exactly as it is stored, which
/// a compare-and-set needs (it compares the text).
fn is_default_team(team: &str) -> bool {
    team == crate::identity::DEFAULT_TEAM
}

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
    /// The team of its context when it was registered (SPEC 16); its claims, approvals and events are
    /// that team's.
    #[serde(default = "default_team", skip_serializing_if = "is_default_team")]
    pub team: String,
    /// Who registered the session (SPEC 13 r4); None for a session registered before r4. Left out when
    /// None, so that such a record still matches its stored bytes in a compare-and-set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registered_by: Option<Identity>,
    /// The person whose MCP host made this session at their first call (SPEC 17); None for a session
    /// that an orchestrator registered. Left out when None, as `registered_by`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub person: Option<Person>,
}

/// A person as an authorization server names them (SPEC 17): the access token's `iss` and `sub`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Person {
    pub iss: String,
    pub sub: String,
}

/// An identity as a record keeps it. Before r4 a record kept only the operator's `sub`; such a record
/// keeps its string, so that re-encoding it gives back the stored bytes that a compare-and-set compares.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RecordedIdentity {
    Identity(Identity),
    /// Written before r4: the `sub` of an operator token, then always verified with a configured key.
    Sub(String),
}

impl RecordedIdentity {
    /// The identity; a bare `sub` reads as a token verified with a configured key that names no issuer.
    pub fn identity(&self) -> Identity {
        match self {
            RecordedIdentity::Identity(identity) => identity.clone(),
            RecordedIdentity::Sub(sub) => Identity {
                iss: LOCAL_ISSUER.to_owned(),
                sub: sub.clone(),
                name: None,
                via: Via::Key,
            },
        }
    }
}

impl From<&Identity> for RecordedIdentity {
    fn from(identity: &Identity) -> Self {
        RecordedIdentity::Identity(identity.clone())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
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

/// What a COMMITTED claim holds: the tool's answer, or the marker that the answer was withheld (2007,
/// 2011).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ClaimOutcome {
    /// A JSON-RPC response object (`result` or `error`); SKIPs return it with the caller's id.
    Answer { response: Value },
    /// The answer exceeded the capability's `max_response_size`; every SKIP answers 2007 again.
    ResponseTooLarge { limit: u64 },
    /// A settled standalone claim (`POST /settle`): the result as given.
    Settled { result: Value },
    /// The answer guard withheld the answer (2011, SPEC 18): every SKIP answers 2011 again. The kinds
    /// found, never the values.
    AnswerWithheld { kinds: Vec<String> },
}

/// Who resolved a PENDING claim by hand, and why (SPEC 7.4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Resolution {
    pub actor: String,
    pub outcome: String,
    pub evidence: Option<String>,
    pub at: String,
}

/// Which namespace a claim lives in (SPEC 7.4 r2): a request id given to `POST /claim` never finds,
/// blocks or settles a claim taken by `/v1/invoke`, and the reverse.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ClaimKind {
    #[default]
    Invoke,
    Standalone,
}

impl ClaimKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimKind::Invoke => "invoke",
            ClaimKind::Standalone => "standalone",
        }
    }
}

/// One claim (SPEC section 7). `claimed_at` and `action_ref` are fixed when it is taken.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClaimRecord {
    #[serde(default)]
    pub kind: ClaimKind,
    pub request_id: String,
    /// What the claim is bound to (SPEC 7.1 r2, 7.4 r3): hex(SHA-256(JCS({"tool", "arguments"}))) of the
    /// call that took an invoke claim, hex(SHA-256(JCS({"action"}))) for a standalone one (None for a
    /// standalone claim taken before r3: its action is its binding).
    #[serde(default)]
    pub call_digest: Option<String>,
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
    /// The operator who took a standalone claim: only they settle it (SPEC 7.4 r3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taker: Option<RecordedIdentity>,
    /// Its session's team, or for a standalone claim the team of the service's scope (SPEC 16).
    #[serde(default = "default_team", skip_serializing_if = "is_default_team")]
    pub team: String,
}

/// Where an approval request stands (SPEC 13).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalStatus {
    Pending,
    Granted,
    Denied,
    Expired,
    Used,
}

impl ApprovalStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalStatus::Pending => "pending",
            ApprovalStatus::Granted => "granted",
            ApprovalStatus::Denied => "denied",
            ApprovalStatus::Expired => "expired",
            ApprovalStatus::Used => "used",
        }
    }
}

/// One approval request (SPEC 13): the call held at the gateway, and what a person decided about it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRecord {
    pub approval_id: String,
    pub status: ApprovalStatus,
    pub session_id: String,
    pub sub: String,
    pub tool: String,
    /// Kept so that the person deciding sees what the call would do; never written to audit events.
    pub arguments: serde_json::Map<String, Value>,
    /// hex(SHA-256(JCS({"tool", "arguments"}))) (SPEC 7.1): the call a grant is good for.
    pub call_digest: String,
    pub context: String,
    pub context_version: String,
    pub requested_at_ms: i64,
    /// The end of the wait for a decision, then of the decision's force.
    pub expires_at_ms: i64,
    /// The capability's `approval.expires_secs` when the request was made.
    pub expires_secs: u64,
    pub decided_at_ms: Option<i64>,
    /// Who made the decision: the last of the grants that granted it, or the person who denied it.
    pub decided_by: Option<RecordedIdentity>,
    pub reason: Option<String>,
    /// Its session's team (SPEC 16).
    #[serde(default = "default_team", skip_serializing_if = "is_default_team")]
    pub team: String,
    // r4 (SPEC 13 r4). Each is left out at its default, so that a record written before r4 still
    // matches its stored bytes in a compare-and-set.
    /// The grants so far, oldest first; the request is granted when they number `approvers`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub grants: Vec<Grant>,
    /// How many distinct people must grant, fixed when the request was made.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub approvers: u32,
    /// The session's registrant may not decide; fixed when the request was made.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub separate_from_registrant: bool,
    /// The session's registrant when the request was made, None when the session predates r4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registered_by: Option<Identity>,
    /// The flow rule (its index in `flow_rules`) that asked for this approval (SPEC 19), when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow_rule: Option<usize>,
}

/// One person's grant of an approval request (SPEC 13 r4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Grant {
    pub by: Identity,
    pub at_ms: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

/// Where an approval listing stopped: the last item shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalCursor {
    pub requested_at_ms: i64,
    pub approval_id: String,
}

// Sign-ins in progress and console sessions (SPEC 16) are the identity room's records; the store keeps them.
pub use crate::identity::console_session::ConsoleSessionRecord;
pub use crate::identity::oidc::SignInAttempt;

/// A context managed over the API (not from a file), as its JSON spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredContext {
    pub name: String,
    pub spec: Value,
}

/// The store's contexts and shadow versions, as one poll read them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StoredContexts {
    pub live: Vec<StoredContext>,
    pub shadows: Vec<StoredContext>,
}

/// Which of a context's versions a stored context is: the one in force, or its shadow (SPEC 6.4 r4),
/// each kept in a table of its own so that a shadow can never be read as a context.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shelf {
    Live,
    Shadow,
}

/// How many calls under a context one shadow version decided, for one tool and one pair of decisions
/// (SPEC 6.4 r4): `live` and `shadow` are `allow`, `approval` or a refusal code. Calls both decided alike
/// are counted under the tool `""`, so that an agent's made-up tool names add no rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShadowTally {
    pub context: String,
    pub version: String,
    pub tool: String,
    pub live: String,
    pub shadow: String,
    pub calls: u64,
    /// When the first of these calls was decided, in Unix milliseconds.
    pub first_at_ms: i64,
}

/// A pinned tool definition (SPEC 18): the definition of an MCP upstream's tool that calls are allowed
/// against. Its upstream and `tool` (the upstream's own name) are its key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolPin {
    pub upstream: String,
    pub tool: String,
    /// hex(SHA-256(JCS(definition))).
    pub definition_sha256: String,
    pub definition: Value,
    pub pinned_at_ms: i64,
    /// Who accepted it; None when it was pinned on first use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted_by: Option<RecordedIdentity>,
}

/// One admitted call's writes before it may be forwarded (SPEC 3 check 8's replay record, SPEC 6.3 rate and
/// budget, then 7 claim), done by one store call so that a networked store can do them in one transaction.
#[derive(Debug, Clone, Default)]
pub struct Admission {
    /// The envelope's signature to remember first; when it was seen before, nothing else happens.
    pub signature: Option<SeenSignature>,
    /// The capability's rate window: (cell key, the window rule).
    pub rate: Option<(String, crate::window::SlidingWindow)>,
    /// The session's call count and budget: (cell key, max calls; `u64::MAX` when unlimited).
    pub budget: Option<(String, u64)>,
    /// A PENDING claim to insert unless its request id exists.
    pub claim: Option<ClaimRecord>,
    pub now_ms: i64,
}

/// A claim's settlement that rides in the audit batch of the call's final event, so that both are made
/// durable by one commit (SPEC 7.2: COMMITTED before the reply). A compare-and-set from `pending`: a claim
/// changed meanwhile (an operator's resolution) is left as it is, as [`Store::claim_replace`] would.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimSettlement {
    pub pending: ClaimRecord,
    pub settled: ClaimRecord,
}

/// A label a session holds (SPEC 19) and the seq of the completion event that brought it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionLabel {
    pub label: String,
    pub seq: u64,
}

/// The key of a completion event's labels (SPEC 19), which the stores read to keep the session's labels.
pub const LABELS_ADDED: &str = "labels_added";

/// The labels that a chained batch gives sessions (SPEC 19): (session id, label, seq) for each label a
/// completion event names. The stores write them with the batch, in its transaction, so that a session's
/// labels are durable with the event that brought them and never without it.
pub(crate) fn labels_of_batch(events: &[StoredEvent]) -> Vec<(String, String, u64)> {
    let mut rows = Vec::new();
    for event in events {
        let Some(added) = &event.labels else { continue };
        for label in &added.labels {
            rows.push((added.session_id.clone(), label.clone(), event.head.seq));
        }
    }
    rows
}

/// When the replay record of an envelope signed at `timestamp` may be forgotten: once no clock within the
/// window could accept that timestamp any more.
pub fn replay_record_expiry_ms(timestamp: i64, skew_secs: i64) -> i64 {
    timestamp
        .saturating_add(skew_secs)
        .saturating_add(1)
        .saturating_mul(1000)
}

/// A replay record (SPEC 3 check 8): kept until the envelope's clock window has passed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenSignature {
    pub signature: [u8; 64],
    pub expires_at_ms: i64,
}

/// What [`Store::admit`] did. Nothing is charged or claimed unless it says so.
#[derive(Debug, Clone, PartialEq)]
pub enum Admitted {
    /// The signature was seen before: nothing charged or claimed (SPEC 3 check 8, 1008).
    Replayed,
    /// Over the rate limit: nothing charged; retry after this many ms.
    RateLimited { retry_after_ms: i64 },
    /// The budget is used up: nothing charged (the rate charge was given back).
    BudgetExhausted,
    /// Charged; the claim was inserted (`None` existing) or found (`Some`), or no claim was asked.
    Charged {
        existing_claim: Option<Box<ClaimRecord>>,
    },
}

/// The durable state of the gateway. Implementations: [`SqliteStore`] (embedded default) and [`PgStore`]
/// (shared by replicas). Every method
/// is a cheap in-memory operation or one round trip; none blocks the async runtime.
#[async_trait::async_trait]
pub trait Store: AuditBackend {
    /// Cheap liveness probe for `/readyz` and fail-closed checks.
    async fn ping(&self) -> StoreResult<()>;

    /// Inserts the session unless its id exists; returns the existing record otherwise (nothing written).
    async fn session_insert(&self, record: &SessionRecord) -> StoreResult<Option<SessionRecord>>;
    async fn session_get(&self, session_id: &str) -> StoreResult<Option<SessionRecord>>;
    /// Replaces `old` with `new` only if the stored record still equals `old`.
    async fn session_replace(&self, old: &SessionRecord, new: &SessionRecord) -> StoreResult<bool>;
    /// Up to `limit` sessions in ascending id order (byte order) that pass `keep`, starting after the id
    /// `after` (a cursor from an earlier page); the flag says whether more follow.
    async fn session_page(
        &self,
        after: Option<&str>,
        limit: usize,
        keep: &(dyn for<'r> Fn(&'r SessionRecord) -> bool + Sync),
    ) -> StoreResult<(Vec<SessionRecord>, bool)>;

    /// The labels the session holds (SPEC 19), each with the seq of the event that first brought it, in
    /// seq order. Sees every batch committed before it, on every replica: never a cache.
    async fn session_labels(&self, session_id: &str) -> StoreResult<Vec<SessionLabel>>;

    /// The integer cell `key` (a budget's count), None when absent.
    async fn counter_get(&self, key: &str) -> StoreResult<Option<i64>>;

    /// Remembers an envelope signature until `expires_at_ms`; false when it was already remembered.
    async fn remember_signature(&self, signature: &[u8], expires_at_ms: i64) -> StoreResult<bool>;
    /// Forgets signatures whose window has passed; returns how many.
    async fn purge_signatures(&self, now_ms: i64) -> StoreResult<usize>;

    /// Remembers the signature (a seen one stops everything: [`Admitted::Replayed`]), then charges the rate
    /// window, then the budget, then inserts the claim unless its id exists, atomically per cell: a
    /// refusal leaves every cell as it was, and the signature stays remembered.
    async fn admit(&self, admission: &Admission) -> StoreResult<Admitted>;

    /// Inserts a PENDING claim unless the request id exists in its namespace (then returns the existing
    /// record).
    async fn claim_insert(&self, record: &ClaimRecord) -> StoreResult<Option<ClaimRecord>>;
    async fn claim_get(
        &self,
        kind: ClaimKind,
        request_id: &str,
    ) -> StoreResult<Option<ClaimRecord>>;
    /// Compare-and-set: replaces `old` by `new` (None deletes, i.e. releases) only if the stored record
    /// still equals `old`.
    async fn claim_replace(
        &self,
        old: &ClaimRecord,
        new: Option<&ClaimRecord>,
    ) -> StoreResult<bool>;
    /// Up to `limit` claims newest first (by claim time) that pass `keep`, starting below `before` (a
    /// cursor from an earlier page: claimed_at_ms, kind and request id); the flag says whether more follow.
    async fn claim_page(
        &self,
        before: Option<&ClaimCursor>,
        limit: usize,
        keep: &(dyn for<'r> Fn(&'r ClaimRecord) -> bool + Sync),
    ) -> StoreResult<(Vec<ClaimRecord>, bool)>;

    /// What `/metrics` shows of the shared state: sessions neither revoked nor expired at `now_secs`, and
    /// PENDING claims. One count per scrape, not per call.
    async fn live_counts(&self, now_secs: i64) -> StoreResult<LiveCounts>;

    /// Stores `record` as the current request of its call (session and call digest), only if the
    /// current one is still `replacing` (an approval id; None when the call has none). False when another
    /// request got there first: then nothing is stored.
    async fn approval_insert(
        &self,
        record: &ApprovalRecord,
        replacing: Option<&str>,
    ) -> StoreResult<bool>;
    /// The current (newest) request of a call.
    async fn approval_current(
        &self,
        session_id: &str,
        call_digest: &str,
    ) -> StoreResult<Option<ApprovalRecord>>;
    async fn approval_get(&self, approval_id: &str) -> StoreResult<Option<ApprovalRecord>>;
    /// Compare-and-set: replaces `old` by `new` only if the stored record still equals `old`.
    async fn approval_replace(
        &self,
        old: &ApprovalRecord,
        new: &ApprovalRecord,
    ) -> StoreResult<bool>;
    /// Up to `limit` requests newest first (by request time, then id) that pass `keep`, starting below
    /// `before`; the flag says whether more follow.
    async fn approval_page(
        &self,
        before: Option<&ApprovalCursor>,
        limit: usize,
        keep: &(dyn for<'r> Fn(&'r ApprovalRecord) -> bool + Sync),
    ) -> StoreResult<(Vec<ApprovalRecord>, bool)>;

    /// Puts a context, or a shadow version; putting a shadow starts its tallies over.
    async fn context_put(&self, shelf: Shelf, context: &StoredContext) -> StoreResult<()>;
    /// True when something was deleted; deleting a shadow drops its tallies.
    async fn context_delete(&self, shelf: Shelf, name: &str) -> StoreResult<bool>;
    async fn context_list(&self, shelf: Shelf) -> StoreResult<Vec<StoredContext>>;
    /// Adds these counts to the stored tallies (SPEC 6.4 r4), keeping each row's earliest `first_at_ms`.
    async fn shadow_tally_add(&self, counts: &[ShadowTally]) -> StoreResult<()>;
    /// The tallies of one shadow version of a context.
    async fn shadow_tallies(&self, context: &str, version: &str) -> StoreResult<Vec<ShadowTally>>;

    /// SPEC 18: pins `pin` unless its tool has a pin, and returns the tool's pin as stored (on replicas,
    /// another's first sighting may have won).
    async fn tool_pin_first(&self, pin: &ToolPin) -> StoreResult<ToolPin>;
    /// Pins `pin` over whatever its tool had (an accepted definition).
    async fn tool_pin_put(&self, pin: &ToolPin) -> StoreResult<()>;
    /// Every pin, by upstream and tool.
    async fn tool_pins(&self) -> StoreResult<Vec<ToolPin>>;
    /// Remembers that a withheld definition (`sha256`) of the tool was seen: true the first time on any
    /// replica, so that one event is written per definition.
    async fn tool_sighting_first(
        &self,
        upstream: &str,
        tool: &str,
        sha256: &str,
        seen_at_ms: i64,
    ) -> StoreResult<bool>;

    /// Keeps a sign-in in progress under its `state`, and forgets those made before `forget_before_ms`.
    async fn sign_in_insert(
        &self,
        attempt: &SignInAttempt,
        forget_before_ms: i64,
    ) -> StoreResult<()>;
    /// Takes (removes and returns) the sign-in of `state`, atomically: a `state` is good once.
    async fn sign_in_take(&self, state: &str) -> StoreResult<Option<SignInAttempt>>;
    /// Keeps a new console session, and forgets those that ended before `now_ms`.
    async fn console_session_insert(
        &self,
        record: &ConsoleSessionRecord,
        now_ms: i64,
    ) -> StoreResult<()>;
    async fn console_session_get(&self, id_hash: &str)
        -> StoreResult<Option<ConsoleSessionRecord>>;
    /// Replaces the record of a session still kept (a later `last_used_ms`); nothing if it was ended.
    async fn console_session_touch(&self, record: &ConsoleSessionRecord) -> StoreResult<()>;
    /// Ends a session; true when there was one.
    async fn console_session_delete(&self, id_hash: &str) -> StoreResult<bool>;

    /// The seq of the oldest event the store still holds (retention removes archived ones), None when
    /// it holds none.
    async fn first_seq(&self) -> StoreResult<Option<u64>>;
    /// Removes (durably) the events with seq ≤ `through`, which the caller archived and synced first
    /// (SPEC 12 r3 retention); returns how many.
    async fn events_remove_through(&self, through: u64) -> StoreResult<u64>;
    /// Removes (durably) the claims that are no longer PENDING and the approval requests decided for
    /// good (denied, expired, used: a grant not yet used stays), taken or made before `before_ms` (SPEC
    /// 12 r3 retention); a request stays while its decision is in force at `now_ms`, until its
    /// `expires_at_ms`, and an expired one `expires_secs` longer (SPEC 20 rule 1). Returns how many of each.
    async fn settled_remove_before(&self, before_ms: i64, now_ms: i64) -> StoreResult<(u64, u64)>;

    /// Whether `holder` may run retention until `until_ms`: one replica at a time on a shared store (a
    /// lease that the holder renews); a store that one process owns always grants it.
    async fn retention_turn(
        &self,
        _holder: &str,
        _now_ms: i64,
        _until_ms: i64,
    ) -> StoreResult<bool> {
        Ok(true)
    }

    /// The clock window that the replay records cover, as the last start recorded it (SPEC 20 rule 3);
    /// None for a store that has recorded none.
    async fn replay_cover(&self) -> StoreResult<Option<crate::replay::ReplayCover>>;
    /// Records (durably) the window that the replay records cover from now on.
    async fn set_replay_cover(&self, cover: &crate::replay::ReplayCover) -> StoreResult<()>;

    /// Whether this store keeps replay records and rate windows in memory, to be rebuilt from the
    /// chain's recent events at start-up with [`Store::restore`] (the embedded store); a store that keeps
    /// them durably (PostgreSQL, shared by replicas) says false.
    fn restores_from_chain(&self) -> bool {
        false
    }

    /// Takes back what the chain says about the last window: signatures that passed check 7 and
    /// admissions charged to rate windows (in time order).
    fn restore(&self, _recovered: Recovered) {}

    /// Notes a key that a replica signs with (SPEC 14), unless its kid is noted already: a hint that
    /// lets a replica warn about a replica whose key its configuration does not name. Never published
    /// nor trusted (SPEC 20 rule 6). A store that one process owns (the embedded one) keeps nothing.
    async fn signing_key_publish(&self, _key: &SigningKeyRecord) -> StoreResult<()> {
        Ok(())
    }
    /// Every key noted by [`Store::signing_key_publish`], oldest first: hints, not keys to trust.
    async fn signing_keys(&self) -> StoreResult<Vec<SigningKeyRecord>> {
        Ok(Vec::new())
    }
}

/// What the chain's recent events say that an in-memory store must know again after a restart.
#[derive(Debug, Default)]
pub struct Recovered {
    pub signatures: Vec<SeenSignature>,
    /// (rate cell key, its window, the admission's time in ms), oldest first.
    pub rate_admissions: Vec<(String, crate::window::SlidingWindow, i64)>,
}

/// A public key that a replica says it signs receipts and checkpoints with (SPEC 14): a hint only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SigningKeyRecord {
    /// The first 16 hex digits of hex(SHA-256(public_key)).
    pub kid: String,
    pub public_key: [u8; 32],
    /// The replica that published it first.
    pub replica_id: String,
}

/// One page of a listing, filled in listing order: up to `limit` records that `keep` accepts.
pub(crate) struct Page<'k, T> {
    items: Vec<T>,
    limit: usize,
    keep: &'k (dyn for<'r> Fn(&'r T) -> bool + Sync),
}

impl<'k, T> Page<'k, T> {
    pub(crate) fn new(limit: usize, keep: &'k (dyn for<'r> Fn(&'r T) -> bool + Sync)) -> Self {
        Page {
            items: Vec::new(),
            limit,
            keep,
        }
    }

    /// Offers the next record; true when the page is full and this kept record shows more follow.
    pub(crate) fn offer(&mut self, record: T) -> bool {
        if !(self.keep)(&record) {
            return false;
        }
        if self.items.len() == self.limit {
            return true;
        }
        self.items.push(record);
        false
    }

    /// The records and whether more follow.
    pub(crate) fn done(self, more: bool) -> (Vec<T>, bool) {
        (self.items, more)
    }
}

/// The gauges of [`Store::live_counts`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LiveCounts {
    pub sessions: u64,
    pub pending_claims: u64,
    /// Approval requests waiting for a decision (one past its expiry counts until the sweep marks it).
    pub pending_approvals: u64,
}

/// Where a claim listing stopped: the last item shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimCursor {
    pub claimed_at_ms: i64,
    pub kind: ClaimKind,
    pub request_id: String,
}
