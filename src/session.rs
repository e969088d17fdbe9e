//! Sessions (SPEC section 5): the registration request and its validation, idempotent re-registration,
//! revocation with key erasure, and the status rules (active, revoked, expired, exhausted).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::clock;
use crate::envelope::SessionKey;
use crate::identity::Identity;
use crate::policy::{HeldLabel, Pattern};
use crate::store::{Person, SessionRecord, Store, StoreError, StoreResult};

/// `POST /v1/seal/sessions` as it arrives. Unknown fields are ignored (SPEC 5). Fields are read as JSON
/// values so that a wrong type is named precisely; the schema says what each must be.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct CreateSessionRequest {
    /// 1–256 bytes without control characters (also accepted as `execution_id`).
    #[serde(alias = "execution_id")]
    #[schema(value_type = String, required = true, min_length = 1, max_length = 256)]
    pub session_id: Option<Value>,
    /// The agent's Ed25519 public key: base64 (either alphabet) or hex of the 32 raw bytes, or an SPKI
    /// PEM (also accepted as `public_key_b64`).
    #[serde(alias = "public_key_b64")]
    #[schema(value_type = String, required = true)]
    pub public_key: Option<Value>,
    /// The name of a loaded security context (also accepted as `security_context_name`).
    #[serde(alias = "security_context_name")]
    #[schema(value_type = String, required = true, min_length = 1, max_length = 256)]
    pub security_context: Option<Value>,
    /// An RFC 3339 instant or Unix seconds, in the future and at most `sessions.max_lifetime_secs` ahead.
    #[schema(schema_with = instant_schema, required = true)]
    pub expires_at: Option<Value>,
    /// Binds the agent token's `sub`.
    #[schema(value_type = Option<String>, min_length = 1, max_length = 256)]
    pub agent_id: Option<Value>,
    /// Binds the agent token's `wid`.
    #[schema(value_type = Option<String>, min_length = 1, max_length = 256)]
    pub workload_id: Option<Value>,
    /// Narrows what the context allows; `["*"]` when absent.
    #[schema(value_type = Option<Vec<String>>)]
    pub allowed_tool_patterns: Option<Value>,
    #[schema(value_type = Option<Budget>)]
    pub budget: Option<Value>,
}

/// An RFC 3339 string or Unix seconds (a fraction is dropped).
fn instant_schema() -> utoipa::openapi::schema::Schema {
    use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, OneOfBuilder, SchemaFormat, Type};
    OneOfBuilder::new()
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime))),
        )
        .item(ObjectBuilder::new().schema_type(Type::Integer))
        .into()
}

/// A session's call budget.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Budget {
    /// How many calls the policy may allow over the session's life; none = unlimited.
    pub max_calls: Option<u64>,
}

/// A validated registration; the field that failed is named in the error.
#[derive(Debug, Clone, PartialEq)]
pub struct NewSession {
    pub session_id: String,
    pub key: [u8; 32],
    pub security_context: String,
    pub expires_at: i64,
    pub agent_id: Option<String>,
    pub workload_id: Option<String>,
    pub allowed_tool_patterns: Vec<String>,
    pub max_calls: Option<u64>,
}

/// Ids and names are printable, bounded strings: they end up in audit events and store keys.
fn identifier(
    field: &str,
    value: Option<&Value>,
    required: bool,
) -> Result<Option<String>, String> {
    match value {
        None | Some(Value::Null) if !required => Ok(None),
        None | Some(Value::Null) => Err(format!("{field} is required")),
        Some(Value::String(s)) if s.is_empty() => Err(format!("{field} must not be empty")),
        Some(Value::String(s)) if s.len() > 256 => Err(format!("{field} is longer than 256 bytes")),
        Some(Value::String(s)) if s.chars().any(|c| c.is_control()) => {
            Err(format!("{field} contains a control character"))
        }
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(format!("{field} must be a string")),
    }
}

impl CreateSessionRequest {
    /// Checks everything that does not need the store: types, key, expiry window, patterns, budget.
    pub fn validate(&self, now: i64, max_lifetime_secs: i64) -> Result<NewSession, String> {
        let session_id =
            identifier("session_id", self.session_id.as_ref(), true)?.unwrap_or_default();
        let security_context =
            identifier("security_context", self.security_context.as_ref(), true)?
                .unwrap_or_default();
        let key = match &self.public_key {
            Some(Value::String(text)) => SessionKey::parse(text)
                .map_err(|e| format!("public_key: {e}"))?
                .to_bytes(),
            Some(_) => return Err("public_key must be a string".into()),
            None => return Err("public_key is required".into()),
        };
        let expires_at = match &self.expires_at {
            Some(Value::String(text)) => clock::parse_rfc3339_secs(text)
                .ok_or_else(|| format!("expires_at {text:?} is not an RFC 3339 instant"))?,
            // A fraction is dropped: the session ends no later than asked.
            Some(Value::Number(n)) => clock::whole_seconds(n, clock::Round::Down)
                .ok_or_else(|| "expires_at is not Unix seconds within range".to_string())?,
            Some(_) => return Err("expires_at must be an RFC 3339 string or Unix seconds".into()),
            None => return Err("expires_at is required".into()),
        };
        if expires_at <= now {
            return Err("expires_at must lie in the future".into());
        }
        if expires_at > now.saturating_add(max_lifetime_secs) {
            return Err(format!(
                "expires_at lies more than sessions.max_lifetime_secs ({max_lifetime_secs} s) ahead"
            ));
        }
        let allowed_tool_patterns = match &self.allowed_tool_patterns {
            None | Some(Value::Null) => vec!["*".to_string()],
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, item)| {
                    let text = item
                        .as_str()
                        .ok_or_else(|| format!("allowed_tool_patterns[{i}] must be a string"))?;
                    Pattern::parse(text).map_err(|e| format!("allowed_tool_patterns[{i}]: {e}"))?;
                    Ok(text.to_string())
                })
                .collect::<Result<_, String>>()?,
            Some(_) => return Err("allowed_tool_patterns must be an array of patterns".into()),
        };
        let max_calls = match &self.budget {
            None | Some(Value::Null) => None,
            Some(Value::Object(budget)) => {
                if let Some(unknown) = budget.keys().find(|k| k.as_str() != "max_calls") {
                    return Err(format!("budget.{unknown} is not a budget key"));
                }
                match budget.get("max_calls") {
                    None | Some(Value::Null) => None,
                    Some(v) => Some(
                        v.as_u64()
                            .ok_or("budget.max_calls must be a non-negative integer")?,
                    ),
                }
            }
            Some(_) => return Err("budget must be an object".into()),
        };
        Ok(NewSession {
            session_id,
            key,
            security_context,
            expires_at,
            agent_id: identifier("agent_id", self.agent_id.as_ref(), false)?,
            workload_id: identifier("workload_id", self.workload_id.as_ref(), false)?,
            allowed_tool_patterns,
            max_calls,
        })
    }
}

pub fn encode_key(key: &[u8; 32]) -> String {
    base64::engine::general_purpose::STANDARD.encode(key)
}

impl NewSession {
    /// The record of this registration, in `team` (its context's, SPEC 16), registered by `registered_by`
    /// (SPEC 13 r4).
    pub fn into_record(
        self,
        security_token: Option<String>,
        registered_by: &Identity,
        now_ms: i64,
        team: &str,
    ) -> SessionRecord {
        SessionRecord {
            team: team.to_owned(),
            public_key: Some(encode_key(&self.key)),
            session_id: self.session_id,
            security_context: self.security_context,
            expires_at: self.expires_at,
            agent_id: self.agent_id,
            workload_id: self.workload_id,
            allowed_tool_patterns: self.allowed_tool_patterns,
            max_calls: self.max_calls,
            security_token,
            created_at_ms: now_ms,
            revoked_at_ms: None,
            registered_by: Some(registered_by.clone()),
            person: None,
        }
    }

    /// An identical re-registration: same key bytes, context, agent, workload, patterns, budget, expiry.
    pub fn same_as(&self, record: &SessionRecord) -> bool {
        record.revoked_at_ms.is_none()
            && record.public_key.as_deref() == Some(encode_key(&self.key).as_str())
            && record.security_context == self.security_context
            && record.expires_at == self.expires_at
            && record.agent_id == self.agent_id
            && record.workload_id == self.workload_id
            && record.allowed_tool_patterns == self.allowed_tool_patterns
            && record.max_calls == self.max_calls
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SessionStatus {
    Active,
    Revoked,
    Expired,
    Exhausted,
}

impl SessionStatus {
    pub const ALL: [SessionStatus; 4] = [
        SessionStatus::Active,
        SessionStatus::Revoked,
        SessionStatus::Expired,
        SessionStatus::Exhausted,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SessionStatus::Active => "active",
            SessionStatus::Revoked => "revoked",
            SessionStatus::Expired => "expired",
            SessionStatus::Exhausted => "exhausted",
        }
    }

    pub fn parse(text: &str) -> Option<SessionStatus> {
        SessionStatus::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

/// Revoked and expired sessions refuse envelopes (1006); an exhausted one is still active for check 5.
pub fn status(record: &SessionRecord, now: i64, calls_allowed: u64) -> SessionStatus {
    if record.revoked_at_ms.is_some() {
        SessionStatus::Revoked
    } else if now >= record.expires_at {
        SessionStatus::Expired
    } else if record.max_calls.is_some_and(|max| calls_allowed >= max) {
        SessionStatus::Exhausted
    } else {
        SessionStatus::Active
    }
}

/// The counter key of a session's call budget.
pub fn budget_key(session_id: &str) -> String {
    format!("budget\0{session_id}")
}

/// The 201/200 body of a registration.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SessionCreated {
    pub session_id: String,
    /// Always `active`.
    pub status: SessionStatus,
    pub security_context: String,
    /// The team of its context (SPEC 16).
    pub team: String,
    /// RFC 3339.
    pub expires_at: String,
    /// Present when the gateway mints agent tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub security_token: Option<String>,
}

pub fn created_body(record: &SessionRecord) -> SessionCreated {
    SessionCreated {
        session_id: record.session_id.clone(),
        status: SessionStatus::Active,
        security_context: record.security_context.clone(),
        team: record.team.clone(),
        expires_at: clock::rfc3339_secs(record.expires_at),
        security_token: record.security_token.clone(),
    }
}

/// A session as `GET /v1/seal/sessions[/{id}]` shows it: never a key or a token.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SessionView {
    pub session_id: String,
    pub status: SessionStatus,
    pub security_context: String,
    /// The team it belongs to: its context's when it was registered (SPEC 16).
    pub team: String,
    /// RFC 3339.
    pub expires_at: String,
    pub agent_id: Option<String>,
    pub workload_id: Option<String>,
    pub allowed_tool_patterns: Vec<String>,
    pub budget: Budget,
    pub calls: Calls,
    /// RFC 3339 with milliseconds.
    pub created_at: String,
    /// RFC 3339 with milliseconds; null unless revoked.
    pub revoked_at: Option<String>,
    /// Who registered the session (SPEC 13 r4); absent for a session registered before r4.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub registered_by: Option<Identity>,
    /// `agent` for a session an orchestrator registered, `mcp` for a person's (SPEC 17).
    pub kind: SessionKind,
    /// The person of an `mcp` session, as their authorization server names them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iss: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sub: Option<String>,
    /// The labels the session holds (SPEC 19), each with the `seq` of the completion event that brought
    /// it; shown when one session is read, not in listings.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    pub labels: Option<Vec<HeldLabel>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SessionKind {
    Agent,
    Mcp,
}

/// What the session has used.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Calls {
    /// Calls the policy allowed (SKIPs included), with or without a budget.
    pub allowed: u64,
}

pub fn describe(record: &SessionRecord, now: i64, calls_allowed: u64) -> SessionView {
    SessionView {
        session_id: record.session_id.clone(),
        status: status(record, now, calls_allowed),
        security_context: record.security_context.clone(),
        team: record.team.clone(),
        expires_at: clock::rfc3339_secs(record.expires_at),
        agent_id: record.agent_id.clone(),
        workload_id: record.workload_id.clone(),
        allowed_tool_patterns: record.allowed_tool_patterns.clone(),
        budget: Budget {
            max_calls: record.max_calls,
        },
        calls: Calls {
            allowed: calls_allowed,
        },
        created_at: clock::rfc3339_millis(record.created_at_ms),
        revoked_at: record.revoked_at_ms.map(clock::rfc3339_millis),
        registered_by: record.registered_by.clone(),
        kind: if record.person.is_some() {
            SessionKind::Mcp
        } else {
            SessionKind::Agent
        },
        iss: record.person.as_ref().map(|person| person.iss.clone()),
        sub: record.person.as_ref().map(|person| person.sub.clone()),
        labels: None,
    }
}

/// The session a person's MCP host gets at their first call (SPEC 17): no key (calls come with a bearer
/// token, not a signature), the context of the first matching `people` rule, in that context's team. The
/// person registered it, so separation of duties keeps them from approving their own calls (SPEC 13 r4).
pub fn for_person(
    person: Identity,
    session_id: String,
    context: PersonContext<'_>,
) -> SessionRecord {
    SessionRecord {
        session_id,
        public_key: None,
        security_context: context.name.to_owned(),
        expires_at: context.now_ms / 1000 + context.expires_secs,
        agent_id: None,
        workload_id: None,
        allowed_tool_patterns: vec!["*".to_owned()],
        max_calls: context.budget,
        security_token: None,
        created_at_ms: context.now_ms,
        revoked_at_ms: None,
        team: context.team.to_owned(),
        person: Some(Person {
            iss: person.iss.clone(),
            sub: person.sub.clone(),
        }),
        registered_by: Some(person),
    }
}

/// What a person's session is made under: the context, its team, and `mcp_server.session`.
pub struct PersonContext<'a> {
    pub name: &'a str,
    pub team: &'a str,
    pub expires_secs: i64,
    pub budget: Option<u64>,
    pub now_ms: i64,
}

/// The revoked form of a record: key and token erased.
pub fn revoked(record: &SessionRecord, now_ms: i64) -> SessionRecord {
    SessionRecord {
        public_key: None,
        security_token: None,
        revoked_at_ms: Some(now_ms),
        ..record.clone()
    }
}

/// A session as every call needs it: the record with its key and patterns decoded once, when it is read
/// from the store, never on every call.
#[derive(Debug)]
pub struct LiveSession {
    pub record: SessionRecord,
    /// None once revoked (the key is erased).
    pub key: Option<SessionKey>,
    pub patterns: Vec<Pattern>,
}

impl LiveSession {
    fn decode(record: SessionRecord) -> StoreResult<LiveSession> {
        let key = match &record.public_key {
            None => None,
            Some(encoded) => {
                let bytes: [u8; 32] = base64::engine::general_purpose::STANDARD
                    .decode(encoded)
                    .ok()
                    .and_then(|b| b.try_into().ok())
                    .ok_or_else(|| StoreError::Corrupt("stored session key".into()))?;
                Some(
                    SessionKey::from_bytes(&bytes)
                        .map_err(|e| StoreError::Corrupt(e.to_string()))?,
                )
            }
        };
        let patterns = record
            .allowed_tool_patterns
            .iter()
            .map(|p| Pattern::parse(p))
            .collect::<Result<_, _>>()
            .map_err(|e| StoreError::Corrupt(format!("stored session pattern: {e}")))?;
        Ok(LiveSession {
            record,
            key,
            patterns,
        })
    }
}

/// The labels a session holds (SPEC 19), each with the seq of the event that brought it, read from the
/// store on every call that a flow rule could apply to. Never cached: labels only grow, so a stale copy
/// would let a call through on one replica that another replica's completed call should have blocked;
/// the read is skipped instead for every call that no rule could concern (`policy::flows::needs_labels`).
pub async fn labels(store: &dyn Store, session_id: &str) -> StoreResult<Vec<HeldLabel>> {
    Ok(store
        .session_labels(session_id)
        .await?
        .into_iter()
        .map(|held| HeldLabel {
            label: held.label,
            seq: Some(held.seq),
        })
        .collect())
}

/// Most sessions kept decoded in memory; past it the cache starts afresh (a miss only costs a read).
const SESSION_CACHE_CAPACITY: usize = 100_000;

/// The sessions that calls read, from memory. A record changes only by revocation, and revocation
/// through this gateway invalidates the entry before it answers, so the very next call reads the revoked
/// record. A generation counter keeps a read that raced with a revocation from caching the stale record.
#[derive(Default)]
pub struct SessionCache {
    entries: RwLock<HashMap<String, Arc<LiveSession>>>,
    generation: AtomicU64,
}

impl SessionCache {
    pub async fn get(
        &self,
        store: &dyn Store,
        session_id: &str,
    ) -> StoreResult<Option<Arc<LiveSession>>> {
        if let Some(hit) = self
            .entries
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(session_id)
        {
            return Ok(Some(hit.clone()));
        }
        let generation = self.generation.load(Ordering::Acquire);
        let Some(record) = store.session_get(session_id).await? else {
            return Ok(None);
        };
        let live = Arc::new(LiveSession::decode(record)?);
        let mut entries = self.entries.write().unwrap_or_else(PoisonError::into_inner);
        if self.generation.load(Ordering::Acquire) == generation {
            if entries.len() >= SESSION_CACHE_CAPACITY {
                entries.clear();
            }
            entries.insert(session_id.to_string(), live.clone());
        }
        Ok(Some(live))
    }

    /// Forgets a session whose record changed (revocation).
    pub fn invalidate(&self, session_id: &str) {
        let mut entries = self.entries.write().unwrap_or_else(PoisonError::into_inner);
        entries.remove(session_id);
        self.generation.fetch_add(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const KEY: &str = "11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=";

    fn request(body: Value) -> CreateSessionRequest {
        serde_json::from_value(body).unwrap()
    }

    fn registrant() -> Identity {
        Identity {
            iss: crate::identity::LOCAL_ISSUER.into(),
            sub: "orchestrator".into(),
            name: None,
            via: crate::identity::Via::Key,
        }
    }

    fn valid() -> Value {
        json!({"session_id": "exec-1", "public_key": KEY, "security_context": "demo",
               "expires_at": 2_000_000_000i64, "unknown_field": true})
    }

    #[test]
    fn validates_a_registration_and_applies_defaults() {
        let s = request(valid()).validate(1_999_999_000, 86_400).unwrap();
        assert_eq!(s.allowed_tool_patterns, ["*"]);
        assert_eq!(s.max_calls, None);
        let aliased = request(json!({"execution_id": "exec-1", "public_key_b64": KEY,
            "security_context_name": "demo", "expires_at": "2033-05-18T03:33:20Z"}));
        assert_eq!(aliased.validate(1_999_999_000, 86_400).unwrap(), s);
        // Unix seconds with a fraction, as `time.time() + 3600` writes them: the fraction is dropped.
        let mut fractional = valid();
        fractional["expires_at"] = json!(2_000_000_000.75);
        assert_eq!(
            request(fractional).validate(1_999_999_000, 86_400).unwrap(),
            s
        );
    }

    #[test]
    fn names_the_field_that_is_wrong() {
        let cases = [
            ("session_id", json!(5)),
            ("public_key", json!("not a key")),
            ("expires_at", json!(1_000)),
            ("expires_at", json!(2_100_000_000i64)),
            ("expires_at", json!("tomorrow")),
            ("expires_at", json!(1e300)),
            ("allowed_tool_patterns", json!(["fs.**"])),
            ("budget", json!({"max_calls": -1})),
            ("budget", json!({"max_cals": 1})),
            ("agent_id", json!("")),
        ];
        for (field, value) in cases {
            let mut body = valid();
            body[field] = value.clone();
            let err = request(body).validate(1_999_999_000, 86_400).unwrap_err();
            assert!(err.contains(field), "{field}={value}: {err}");
        }
    }

    #[tokio::test]
    async fn the_cache_serves_decoded_sessions_and_forgets_revoked_ones() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::SqliteStore::open(dir.path()).unwrap();
        let record = request(valid())
            .validate(1_999_999_000, 86_400)
            .unwrap()
            .into_record(None, &registrant(), 0, "default");
        store.session_insert(&record).await.unwrap();
        let cache = SessionCache::default();
        assert!(cache.get(&store, "missing").await.unwrap().is_none());
        let live = cache.get(&store, "exec-1").await.unwrap().unwrap();
        assert_eq!(live.key.as_ref().unwrap().to_base64(), KEY);
        assert!(live.patterns[0].matches("any.tool"));
        let gone = revoked(&record, 5);
        assert!(store.session_replace(&record, &gone).await.unwrap());
        // Still the cached record until this gateway's revocation invalidates it.
        assert!(cache
            .get(&store, "exec-1")
            .await
            .unwrap()
            .unwrap()
            .key
            .is_some());
        cache.invalidate("exec-1");
        let now = cache.get(&store, "exec-1").await.unwrap().unwrap();
        assert!(now.key.is_none());
        assert_eq!(now.record.revoked_at_ms, Some(5));
    }

    #[test]
    fn a_record_made_before_teams_reads_as_team_default_and_encodes_as_stored() {
        let record = |team: &str| {
            request(valid())
                .validate(1_999_999_000, 86_400)
                .unwrap()
                .into_record(None, &registrant(), 0, team)
        };
        // A compare-and-set compares the stored text: an old record must encode as it was stored.
        let old_text = crate::store::encode_record(&record("default")).unwrap();
        assert!(!old_text.contains("\"team\""), "{old_text}");
        let old: SessionRecord = crate::store::decode_record(&old_text).unwrap();
        assert_eq!(old.team, "default");
        let text = crate::store::encode_record(&record("payments")).unwrap();
        let read: SessionRecord = crate::store::decode_record(&text).unwrap();
        assert_eq!(read, record("payments"));
    }

    #[test]
    fn a_session_registered_before_r4_encodes_back_to_its_stored_bytes() {
        // The stores' compare-and-set (a revocation) compares these bytes.
        let before_r4 = r#"{"session_id":"s","public_key":"k","security_context":"c","expires_at":10,"agent_id":null,"workload_id":null,"allowed_tool_patterns":["*"],"max_calls":null,"security_token":null,"created_at_ms":1,"revoked_at_ms":null}"#;
        let record: SessionRecord = crate::store::decode_record(before_r4).unwrap();
        assert_eq!(record.registered_by, None);
        assert_eq!(crate::store::encode_record(&record).unwrap(), before_r4);
        let view = serde_json::to_value(describe(&record, 0, 0)).unwrap();
        assert!(view.get("registered_by").is_none(), "{view}");
        let registered = request(valid())
            .validate(1_999_999_000, 86_400)
            .unwrap()
            .into_record(None, &registrant(), 0, "default");
        let view = serde_json::to_value(describe(&registered, 0, 0)).unwrap();
        assert_eq!(
            view["registered_by"],
            json!({"iss": crate::identity::LOCAL_ISSUER, "sub": "orchestrator", "via": "key"})
        );
    }

    #[test]
    fn status_rules() {
        let mut record = request(valid())
            .validate(1_999_999_000, 86_400)
            .unwrap()
            .into_record(None, &registrant(), 0, "default");
        assert_eq!(status(&record, 1_999_999_000, 0), SessionStatus::Active);
        assert_eq!(status(&record, 2_000_000_000, 0), SessionStatus::Expired);
        record.max_calls = Some(2);
        assert_eq!(status(&record, 1_999_999_000, 2), SessionStatus::Exhausted);
        let gone = revoked(&record, 5);
        assert_eq!(status(&gone, 1_999_999_000, 0), SessionStatus::Revoked);
        assert_eq!(gone.public_key, None);
        let described = serde_json::to_string(&describe(&gone, 1_999_999_000, 0)).unwrap();
        assert!(!described.contains(KEY));
    }
}
