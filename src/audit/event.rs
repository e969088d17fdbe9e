//! Audit event types and the builder that the pipeline fills in (SPEC 9.1).
//!
//! The builder checks the event against the table of SPEC 9.1 before it is queued, so a code that the
//! table does not allow for a type is a programming error caught at the one place events are made.

use std::borrow::Cow;
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::InvalidEvent;
use crate::envelope::{write_string, write_value};
use crate::error::Code;
use crate::identity::Identity;
use crate::store::LabelsAdded;

/// The event types of SPEC 9.1, serialized as exactly these names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EventType {
    SessionCreated,
    SessionRevoked,
    ToolCallAuthorized,
    PolicyViolationBlocked,
    SignatureVerificationFailed,
    SecurityTokenExpired,
    EnvelopeRejected,
    ToolCallCompleted,
    ToolCallFailed,
    ClaimSkipped,
    ClaimBlocked,
    ClaimResolved,
    SecurityContextChanged,
    SecurityContextRejected,
    ClaimTaken,
    ClaimSettled,
    ApprovalRequested,
    ApprovalGranted,
    ApprovalDenied,
    ApprovalUsed,
    ApprovalExpired,
    AuditCheckpoint,
    /// An MCP upstream lists a tool whose definition differs from the pinned one (SPEC 18 r4).
    ToolDefinitionChanged,
    /// A person accepted a tool's new definition (SPEC 18 r4).
    ToolDefinitionAccepted,
    /// The answer guard changed or withheld an answer (SPEC 18 r4): kinds and counts, never values.
    AnswerGuarded,
    /// A call's context and its shadow version decided differently (SPEC 6.4 r4); the live one stood.
    ShadowDecisionDiffered,
}

impl EventType {
    /// The type of the event that records a call refused with `code` (SPEC 9.1's table); None for the
    /// control API's codes, which no call gets.
    pub const fn recording(code: Code) -> Option<EventType> {
        match code {
            // 5006: no event per shed call, a periodic EnvelopeRejected count (SPEC 9.1).
            Code::MalformedEnvelope
            | Code::TokenVerificationFailed
            | Code::SessionNotFound
            | Code::SessionInactive
            | Code::TimestampOutOfWindow
            | Code::EnvelopeReplayed
            | Code::AttestationScopeMismatch
            | Code::GatewayOverloaded => Some(EventType::EnvelopeRejected),
            Code::InvalidSignature | Code::SignatureVerificationFailed => {
                Some(EventType::SignatureVerificationFailed)
            }
            Code::TokenExpired => Some(EventType::SecurityTokenExpired),
            // A new approval request (4003) is recorded as ApprovalRequested instead; the pipeline says so.
            Code::ToolNotAllowed
            | Code::ToolDenied
            | Code::PathNotAllowed
            | Code::CommandNotAllowed
            | Code::DomainNotAllowed
            | Code::RateLimitExceeded
            | Code::NoMatchingCapability
            | Code::BudgetExhausted
            | Code::ToolDefinitionChanged
            | Code::FlowBlocked
            | Code::ApprovalRequired
            | Code::ApprovalDenied => Some(EventType::PolicyViolationBlocked),
            Code::ResponseTooLarge
            | Code::AnswerWithheld
            | Code::UpstreamUnavailable
            | Code::UpstreamTimeout
            | Code::UpstreamBadResponse
            | Code::NoRouteForTool
            | Code::StoreUnavailable => Some(EventType::ToolCallFailed),
            Code::ClaimPending | Code::IdempotencyKeyReused => Some(EventType::ClaimBlocked),
            Code::OperatorUnauthenticated
            | Code::OperatorForbidden
            | Code::NotFound
            | Code::Conflict
            | Code::InvalidRequest => None,
        }
    }

    /// Every type, in the order of SPEC 9.1.
    pub const ALL: [EventType; 26] = [
        EventType::SessionCreated,
        EventType::SessionRevoked,
        EventType::ToolCallAuthorized,
        EventType::PolicyViolationBlocked,
        EventType::SignatureVerificationFailed,
        EventType::SecurityTokenExpired,
        EventType::EnvelopeRejected,
        EventType::ToolCallCompleted,
        EventType::ToolCallFailed,
        EventType::ClaimSkipped,
        EventType::ClaimBlocked,
        EventType::ClaimResolved,
        EventType::SecurityContextChanged,
        EventType::SecurityContextRejected,
        EventType::ClaimTaken,
        EventType::ClaimSettled,
        EventType::ApprovalRequested,
        EventType::ApprovalGranted,
        EventType::ApprovalDenied,
        EventType::ApprovalUsed,
        EventType::ApprovalExpired,
        EventType::AuditCheckpoint,
        EventType::ToolDefinitionChanged,
        EventType::ToolDefinitionAccepted,
        EventType::AnswerGuarded,
        EventType::ShadowDecisionDiffered,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            EventType::SessionCreated => "SessionCreated",
            EventType::SessionRevoked => "SessionRevoked",
            EventType::ToolCallAuthorized => "ToolCallAuthorized",
            EventType::PolicyViolationBlocked => "PolicyViolationBlocked",
            EventType::SignatureVerificationFailed => "SignatureVerificationFailed",
            EventType::SecurityTokenExpired => "SecurityTokenExpired",
            EventType::EnvelopeRejected => "EnvelopeRejected",
            EventType::ToolCallCompleted => "ToolCallCompleted",
            EventType::ToolCallFailed => "ToolCallFailed",
            EventType::ClaimSkipped => "ClaimSkipped",
            EventType::ClaimBlocked => "ClaimBlocked",
            EventType::ClaimResolved => "ClaimResolved",
            EventType::SecurityContextChanged => "SecurityContextChanged",
            EventType::SecurityContextRejected => "SecurityContextRejected",
            EventType::ClaimTaken => "ClaimTaken",
            EventType::ClaimSettled => "ClaimSettled",
            EventType::ApprovalRequested => "ApprovalRequested",
            EventType::ApprovalGranted => "ApprovalGranted",
            EventType::ApprovalDenied => "ApprovalDenied",
            EventType::ApprovalUsed => "ApprovalUsed",
            EventType::ApprovalExpired => "ApprovalExpired",
            EventType::AuditCheckpoint => "AuditCheckpoint",
            EventType::ToolDefinitionChanged => "ToolDefinitionChanged",
            EventType::ToolDefinitionAccepted => "ToolDefinitionAccepted",
            EventType::AnswerGuarded => "AnswerGuarded",
            EventType::ShadowDecisionDiffered => "ShadowDecisionDiffered",
        }
    }

    /// The decision that the type itself states, if any (a refusal type is always a `deny`).
    fn implied_decision(self) -> Option<Decision> {
        match self {
            EventType::ToolCallAuthorized | EventType::ClaimSkipped => Some(Decision::Allow),
            EventType::PolicyViolationBlocked
            | EventType::SignatureVerificationFailed
            | EventType::SecurityTokenExpired
            | EventType::EnvelopeRejected
            | EventType::ClaimBlocked
            | EventType::ApprovalRequested => Some(Decision::Deny),
            _ => None,
        }
    }

    /// Which codes an event of this type may carry (SPEC 9.1 table, kept in `error.rs`) and whether it
    /// must carry one.
    fn code_rule(self) -> CodeRule {
        match self {
            EventType::EnvelopeRejected
            | EventType::SignatureVerificationFailed
            | EventType::SecurityTokenExpired
            | EventType::PolicyViolationBlocked
            | EventType::ClaimBlocked
            | EventType::ToolCallFailed => CodeRule::Required(self),
            EventType::ToolCallAuthorized
            | EventType::ClaimSkipped
            | EventType::ToolCallCompleted => CodeRule::Forbidden,
            // Control-plane events may record a refused operator request with its 600x code.
            EventType::SessionCreated
            | EventType::SessionRevoked
            | EventType::ClaimResolved
            | EventType::SecurityContextChanged
            | EventType::SecurityContextRejected
            | EventType::ClaimTaken
            | EventType::ClaimSettled => CodeRule::Optional(&[6001, 6002, 6003, 6004, 6005]),
            // The call held for a person (SPEC 13): always 4003, filled in when not given.
            EventType::ApprovalRequested => CodeRule::Optional(&[4003]),
            EventType::ApprovalGranted
            | EventType::ApprovalDenied
            | EventType::ApprovalUsed
            | EventType::ApprovalExpired
            | EventType::AuditCheckpoint
            | EventType::ToolDefinitionChanged
            | EventType::ToolDefinitionAccepted
            | EventType::ShadowDecisionDiffered => CodeRule::Forbidden,
            // A withheld answer is recorded by the call's ToolCallFailed (2011); a rewritten one by this.
            EventType::AnswerGuarded => CodeRule::Optional(&[2011]),
        }
    }
}

enum CodeRule {
    /// A refusal: it carries one of the codes that `error.rs` records with this type.
    Required(EventType),
    Optional(&'static [u16]),
    Forbidden,
}

/// Most characters a string field of an event holds (SPEC 9.1 r2): fields are copied from input that may
/// not be authenticated yet, and must not carry unbounded text into the durable chain.
pub const MAX_FIELD_CHARS: usize = 256;

/// `value`, or its first 255 characters followed by `…` when it is longer than [`MAX_FIELD_CHARS`].
fn bounded(value: &str) -> Cow<'_, str> {
    // No more bytes than the limit is no more characters: most fields need no walk.
    if value.len() <= MAX_FIELD_CHARS {
        return Cow::Borrowed(value);
    }
    let mut chars = value.char_indices();
    match (chars.nth(MAX_FIELD_CHARS - 1), chars.next()) {
        (Some((cut_at, _)), Some(_)) => Cow::Owned(format!("{}…", &value[..cut_at])),
        _ => Cow::Borrowed(value),
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for EventType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        EventType::ALL
            .iter()
            .copied()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| format!("unknown event type {s:?}"))
    }
}

/// `allow` or `deny`, as written in events and accepted by queries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    Allow,
    Deny,
}

impl Decision {
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::Allow => "allow",
            Decision::Deny => "deny",
        }
    }
}

impl FromStr for Decision {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "allow" => Ok(Decision::Allow),
            "deny" => Ok(Decision::Deny),
            other => Err(format!(
                "decision must be \"allow\" or \"deny\", not {other:?}"
            )),
        }
    }
}

/// The kinds of rule that SPEC 9.1 names in `rule.kind`, and a flow rule's (SPEC 19).
const RULE_KINDS: [&str; 5] = [
    "deny_list",
    "capability",
    "no_match",
    "session_patterns",
    "flow_rule",
];

/// Who did an operator action: `{iss, sub, name?, via, team?}` (SPEC 16).
#[derive(Debug, Clone, PartialEq)]
struct Actor {
    identity: Identity,
    team: Option<String>,
}

impl Actor {
    /// The event's `actor` object; its strings are bounded like every other field's (they come from
    /// tokens).
    fn to_value(&self) -> Value {
        let Identity {
            iss,
            sub,
            name,
            via,
        } = &self.identity;
        let text = |value: &str| Value::from(bounded(value).into_owned());
        let mut object = Map::new();
        object.insert("iss".to_owned(), text(iss));
        object.insert("sub".to_owned(), text(sub));
        if let Some(name) = name {
            object.insert("name".to_owned(), text(name));
        }
        let via = serde_json::to_value(via).unwrap_or(Value::Null);
        object.insert("via".to_owned(), via);
        if let Some(team) = &self.team {
            object.insert("team".to_owned(), text(team));
        }
        Value::Object(object)
    }
}

/// One audit event before it is chained. Build it with [`AuditEvent::new`] and the setters; fields left
/// unset are omitted from the JSON. The chain fields (`event_id`, `seq`, `at`, `prev_hash`, `hash`) are
/// added by the writer and cannot be set here.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditEvent {
    event_type: EventType,
    session_id: Option<String>,
    sub: Option<String>,
    scp: Option<String>,
    wid: Option<String>,
    jti: Option<String>,
    auth: Option<String>,
    iss: Option<String>,
    client_id: Option<String>,
    tool: Option<String>,
    signature: Option<String>,
    envelope_timestamp: Option<i64>,
    payload_sha256: Option<String>,
    decision: Option<Decision>,
    code: Option<u16>,
    rule: Option<Value>,
    context_version: Option<String>,
    request_id: Option<String>,
    claim: Option<String>,
    action_ref: Option<String>,
    action: Option<String>,
    approval_id: Option<String>,
    duration_ms: Option<u64>,
    actor: Option<Actor>,
    /// The team of the session, claim, approval or context the event is about (SPEC 16).
    team: Option<String>,
    grants: Option<u64>,
    approvers: Option<u64>,
    /// The labels a completed call gave its session (SPEC 19).
    labels_added: Option<Vec<String>>,
    detail: Option<String>,
    trace_id: Option<String>,
    client_addr: Option<String>,
    bytes: Option<u64>,
    suppressed: Option<u64>,
    payload: Option<Value>,
    result: Option<Value>,
    checkpoint: Option<Value>,
    /// A shadow comparison's two decisions (SPEC 6.4 r4).
    decisions: Option<Value>,
}

pub use crate::store::LABELS_ADDED;

macro_rules! string_setters {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        $(
            $(#[$doc])*
            pub fn $name(mut self, value: impl Into<String>) -> Self {
                self.$name = Some(value.into());
                self
            }
        )*
    };
}

impl AuditEvent {
    pub fn new(event_type: EventType) -> Self {
        AuditEvent {
            event_type,
            session_id: None,
            sub: None,
            scp: None,
            wid: None,
            jti: None,
            auth: None,
            iss: None,
            client_id: None,
            tool: None,
            signature: None,
            envelope_timestamp: None,
            payload_sha256: None,
            decision: None,
            code: None,
            rule: None,
            context_version: None,
            request_id: None,
            claim: None,
            action_ref: None,
            action: None,
            approval_id: None,
            duration_ms: None,
            actor: None,
            team: None,
            grants: None,
            approvers: None,
            labels_added: None,
            detail: None,
            trace_id: None,
            client_addr: None,
            bytes: None,
            suppressed: None,
            payload: None,
            result: None,
            checkpoint: None,
            decisions: None,
        }
    }

    pub fn event_type(&self) -> EventType {
        self.event_type
    }

    string_setters!(
        /// The session (`exec_id`) the event is about.
        session_id,
        /// The token's `scp` (security context name).
        scp,
        /// The token's `wid` (workload id).
        wid,
        /// The token's `jti`.
        jti,
        /// How a call's caller proved itself when not by a signed envelope: `oauth` (SPEC 17).
        auth,
        /// The access token's `iss` (SPEC 17).
        iss,
        /// The access token's `azp` or `client_id`: the MCP host's OAuth client (SPEC 17).
        client_id,
        /// The tool name as called.
        tool,
        /// The envelope's signature, as received.
        signature,
        /// Hex SHA-256 of the JCS payload (checked to be 64 lower-case hex digits when recorded).
        payload_sha256,
        /// The version (hash) of the security context that decided.
        context_version,
        /// The claim's request id.
        request_id,
        /// The claim outcome: `PROCEED`, `SKIP`, `PENDING`, `NONE`, or a resolution outcome.
        claim,
        /// The receipt's action_ref.
        action_ref,
        /// A claim's action (SPEC 7.4): the one given to `/claim`, or the tool of an invoke claim.
        action,
        /// The approval request the event is about (SPEC 13).
        approval_id,
        /// The team of the object the event is about (SPEC 16): who may read the event.
        team,
        /// Free text saying why (for example why a context was refused, or an operator's evidence).
        detail,
        /// The trace id of the response that the event describes, to join the two.
        trace_id,
    );

    /// Joins the event to the request it was made for (the trace id of its error body and of its
    /// `traceparent`), unless a trace id was set.
    pub(crate) fn in_current_trace(mut self) -> Self {
        if self.trace_id.is_none() {
            self.trace_id = crate::trace::current_trace_id();
        }
        self
    }

    /// The token's `sub` (agent id). Named after the JWT claim, not `std::ops::Sub`.
    #[allow(clippy::should_implement_trait)]
    pub fn sub(mut self, value: impl Into<String>) -> Self {
        self.sub = Some(value.into());
        self
    }

    /// Who did an operator action (SPEC 16): their verified identity, and the team of the object
    /// acted on when it has one.
    pub fn actor(mut self, who: &Identity, team: Option<&str>) -> Self {
        self.actor = Some(Actor {
            identity: who.clone(),
            team: team.map(str::to_owned),
        });
        self
    }

    /// A grant of an approval request (SPEC 13 r4): how many grants it holds now, and how many it
    /// needs; fewer leave it pending.
    pub fn grants(mut self, granted: usize, needed: u32) -> Self {
        self.grants = Some(u64::try_from(granted).unwrap_or(u64::MAX));
        self.approvers = Some(u64::from(needed));
        self
    }

    /// The labels that a completed call gives its session (SPEC 19): the store keeps them, with this
    /// event's seq, in the same commit as the event.
    pub fn labels_added(mut self, labels: &[String]) -> Self {
        self.labels_added = Some(labels.to_vec());
        self
    }

    /// The envelope's timestamp as Unix seconds.
    pub fn envelope_timestamp(mut self, unix_secs: i64) -> Self {
        self.envelope_timestamp = Some(unix_secs);
        self
    }

    /// The decision; refusal types (and `ToolCallAuthorized`/`ClaimSkipped`) fill it in themselves.
    pub fn decision(mut self, decision: Decision) -> Self {
        self.decision = Some(decision);
        self
    }

    /// The SPEC section 10 code; checked against the SPEC 9.1 table when recorded.
    pub fn code(mut self, code: u16) -> Self {
        self.code = Some(code);
        self
    }

    /// The rule that decided: `{"kind": "deny_list"|"capability"|"no_match"|"session_patterns"|"flow_rule", "index", "pattern"}`,
    /// and a capability's `"id"` when it has one.
    pub fn rule(mut self, rule: Value) -> Self {
        self.rule = Some(rule);
        self
    }

    /// Convenience for [`AuditEvent::rule`] from its parts.
    pub fn rule_parts(self, kind: &str, index: Option<usize>, pattern: Option<&str>) -> Self {
        let mut rule = Map::new();
        rule.insert("kind".to_owned(), Value::from(kind));
        if let Some(index) = index {
            rule.insert("index".to_owned(), Value::from(index));
        }
        if let Some(pattern) = pattern {
            rule.insert("pattern".to_owned(), Value::from(pattern));
        }
        self.rule(Value::Object(rule))
    }

    pub fn duration_ms(mut self, millis: u64) -> Self {
        self.duration_ms = Some(millis);
        self
    }

    pub fn client_addr(mut self, addr: SocketAddr) -> Self {
        self.client_addr = Some(addr.to_string());
        self
    }

    /// The size of a body that could not be read as an envelope.
    pub fn bytes(mut self, bytes: u64) -> Self {
        self.bytes = Some(bytes);
        self
    }

    /// How many unreadable bodies were refused without their own event (rate-limit summary).
    pub(crate) fn suppressed(mut self, count: u64) -> Self {
        self.suppressed = Some(count);
        self
    }

    /// The JSON-RPC payload; dropped unless `audit.include_payloads` is true.
    pub fn payload(mut self, payload: Value) -> Self {
        self.payload = Some(payload);
        self
    }

    /// The tool's answer; dropped unless `audit.include_payloads` is true.
    pub fn result(mut self, result: Value) -> Self {
        self.result = Some(result);
        self
    }

    /// The signed head of an `AuditCheckpoint` (SPEC 14): `{"seq", "hash", "kid", "sig"}`.
    pub(crate) fn checkpoint(mut self, signed_head: Value) -> Self {
        self.checkpoint = Some(signed_head);
        self
    }

    /// The two decisions of a shadow comparison (SPEC 6.4 r4): `{"live": …, "shadow": …}`, each with its
    /// decision, code, rule and context version.
    pub fn decisions(mut self, decisions: Value) -> Self {
        self.decisions = Some(decisions);
        self
    }

    /// Checks the event against SPEC 9.1, fills in what its type implies, and serialises it for the
    /// writer to chain.
    pub(crate) fn into_unsealed(
        mut self,
        include_payloads: bool,
    ) -> Result<Unsealed, InvalidEvent> {
        self.fill_implied();
        self.check()?;
        let facts = Facts {
            event_type: self.event_type,
            decision: self.decision,
            code: self.code,
            claim: self.claim_outcome(),
        };
        let labels = self.labels_for_store();
        Ok(self.members(include_payloads).finish(facts, labels))
    }

    /// The labels this event gives its session, with the session id as its member writes it (bounded):
    /// the store keeps them beside the event (SPEC 19).
    fn labels_for_store(&self) -> Option<LabelsAdded> {
        Some(LabelsAdded {
            session_id: bounded(self.session_id.as_deref()?).into_owned(),
            labels: self.labels_added.clone()?,
        })
    }

    /// The outcome that `sealgate_claims_total` counts for this event, if any.
    fn claim_outcome(&self) -> Option<&'static str> {
        match (self.event_type, self.claim.as_deref()) {
            (EventType::ToolCallAuthorized, Some("PROCEED")) => Some("PROCEED"),
            (EventType::ClaimSkipped, _) => Some("SKIP"),
            (EventType::ClaimBlocked, _) => Some("PENDING"),
            _ => None,
        }
    }

    /// The event's fields as JCS members, in JCS order (the keys' byte order: they are all ASCII).
    fn members(&self, include_payloads: bool) -> Members {
        let mut m = Members::new();
        m.text("action", self.action.as_deref());
        m.text("action_ref", self.action_ref.as_deref());
        m.value("actor", self.actor.as_ref().map(Actor::to_value).as_ref());
        m.text("approval_id", self.approval_id.as_deref());
        m.number("approvers", self.approvers);
        m.text("auth", self.auth.as_deref());
        m.number("bytes", self.bytes);
        m.value("checkpoint", self.checkpoint.as_ref());
        m.text("claim", self.claim.as_deref());
        m.text("client_addr", self.client_addr.as_deref());
        m.text("client_id", self.client_id.as_deref());
        m.number("code", self.code);
        m.text("context_version", self.context_version.as_deref());
        m.text("decision", self.decision.map(Decision::as_str));
        m.value("decisions", self.decisions.as_ref());
        m.text("detail", self.detail.as_deref());
        m.number("duration_ms", self.duration_ms);
        m.number("envelope_timestamp", self.envelope_timestamp);
        m.number("grants", self.grants);
        m.text("iss", self.iss.as_deref());
        m.text("jti", self.jti.as_deref());
        m.labels(LABELS_ADDED, self.labels_added.as_deref());
        // Payloads and tool answers may hold secrets; SPEC 9.1 keeps them out unless asked for.
        if include_payloads {
            m.value("payload", self.payload.as_ref());
        }
        m.text("payload_sha256", self.payload_sha256.as_deref());
        m.text("request_id", self.request_id.as_deref());
        if include_payloads {
            m.value("result", self.result.as_ref());
        }
        m.value("rule", self.rule.as_ref());
        m.text("scp", self.scp.as_deref());
        m.text("session_id", self.session_id.as_deref());
        m.text("signature", self.signature.as_deref());
        m.text("sub", self.sub.as_deref());
        m.number("suppressed", self.suppressed);
        m.text("team", self.team.as_deref());
        m.text("tool", self.tool.as_deref());
        m.text("trace_id", self.trace_id.as_deref());
        m.text("type", Some(self.event_type.as_str()));
        m.text("wid", self.wid.as_deref());
        m
    }

    fn fill_implied(&mut self) {
        if self.decision.is_none() {
            self.decision = self.event_type.implied_decision();
        }
        match self.event_type {
            EventType::SecurityTokenExpired if self.code.is_none() => self.code = Some(1003),
            EventType::ClaimBlocked => {
                self.code.get_or_insert(4001);
                self.claim.get_or_insert_with(|| "PENDING".to_owned());
            }
            EventType::ClaimSkipped => {
                self.claim.get_or_insert_with(|| "SKIP".to_owned());
            }
            EventType::ApprovalRequested => {
                self.code.get_or_insert(4003);
            }
            _ => {}
        }
    }

    /// The first rule of SPEC 9.1 that the event breaks, if any.
    fn check(&self) -> Result<(), InvalidEvent> {
        self.check_code()?;
        let event_type = self.event_type;
        let implied = event_type.implied_decision();
        let excluded = match event_type {
            EventType::ToolCallFailed => Some(Decision::Allow),
            EventType::ToolCallCompleted => Some(Decision::Deny),
            _ => None,
        };
        if let Some(decision) = self.decision {
            if implied.is_some_and(|implied| implied != decision) || excluded == Some(decision) {
                return Err(InvalidEvent::Decision {
                    event_type,
                    decision,
                });
            }
        }
        let claim_must_be: Option<&[&str]> = match event_type {
            EventType::ToolCallAuthorized => Some(&["PROCEED", "NONE"]),
            EventType::ClaimSkipped => Some(&["SKIP"]),
            EventType::ClaimBlocked => Some(&["PENDING"]),
            _ => None,
        };
        if let (Some(allowed), Some(claim)) = (claim_must_be, self.claim.as_deref()) {
            if !allowed.contains(&claim) {
                let claim = claim.to_owned();
                return Err(InvalidEvent::Claim { event_type, claim });
            }
        }
        if (event_type == EventType::AuditCheckpoint) != self.checkpoint.is_some() {
            return Err(InvalidEvent::Checkpoint);
        }
        if event_type == EventType::PolicyViolationBlocked && self.rule.is_none() {
            return Err(InvalidEvent::RuleMissing);
        }
        if let Some(rule) = &self.rule {
            check_rule(rule).map_err(InvalidEvent::Rule)?;
        }
        match &self.payload_sha256 {
            Some(digest) if !is_sha256_hex(digest) => Err(InvalidEvent::PayloadDigest),
            _ => Ok(()),
        }
    }

    /// The code that the event's type requires, allows or forbids (SPEC 9.1).
    fn check_code(&self) -> Result<(), InvalidEvent> {
        let event_type = self.event_type;
        let not_reported = |code| InvalidEvent::CodeNotReported { event_type, code };
        match (event_type.code_rule(), self.code) {
            (CodeRule::Required(_), None) => Err(InvalidEvent::CodeMissing(event_type)),
            (CodeRule::Required(recorded_as), Some(code))
                if Code::from_number(code).and_then(EventType::recording) != Some(recorded_as) =>
            {
                Err(not_reported(code))
            }
            (CodeRule::Optional(allowed), Some(code)) if !allowed.contains(&code) => {
                Err(not_reported(code))
            }
            (CodeRule::Forbidden, Some(code)) => {
                Err(InvalidEvent::CodeForbidden { event_type, code })
            }
            _ => Ok(()),
        }
    }
}

/// The chain fields, in JCS order: the writer adds them when it seals an event (`chain::seal`).
pub(crate) const CHAIN_KEYS: [&str; 6] = ["at", "event_id", "hash", "prev_hash", "replica", "seq"];

/// An event checked against SPEC 9.1 and serialised once, as the members of its JCS object: sealing
/// it only adds the chain fields between them and hashes the bytes (SPEC 9.2).
#[derive(Debug, Clone)]
pub(crate) struct Unsealed {
    /// The members in JCS order, each followed by a comma.
    pub(crate) members: Vec<u8>,
    /// Where each of [`CHAIN_KEYS`] belongs among the members: byte offsets into `members`.
    pub(crate) gaps: [usize; CHAIN_KEYS.len()],
    /// Whether serde_json writes the event's values as JCS does (see `chain::seal`).
    pub(crate) plain: bool,
    pub(crate) facts: Facts,
    /// What the store keeps of its `session_id` and `labels_added`, which it does not read from the text.
    pub(crate) labels: Option<LabelsAdded>,
}

/// What the metrics count of an event once it is durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Facts {
    pub(crate) event_type: EventType,
    pub(crate) decision: Option<Decision>,
    pub(crate) code: Option<u16>,
    /// The outcome `sealgate_claims_total` counts, if any.
    pub(crate) claim: Option<&'static str>,
}

/// Writes an object's members in JCS order, and notes where the chain fields go.
struct Members {
    out: Vec<u8>,
    gaps: [usize; CHAIN_KEYS.len()],
    /// How many of [`CHAIN_KEYS`] have their place.
    placed: usize,
    plain: bool,
}

impl Members {
    fn new() -> Self {
        Members {
            out: Vec::with_capacity(768),
            gaps: [0; CHAIN_KEYS.len()],
            placed: 0,
            plain: true,
        }
    }

    /// Starts the member `key`, which sorts after every member written before it.
    fn key(&mut self, key: &str) {
        while CHAIN_KEYS
            .get(self.placed)
            .is_some_and(|chain| *chain < key)
        {
            self.gaps[self.placed] = self.out.len();
            self.placed += 1;
        }
        write_string(&mut self.out, key);
        self.out.push(b':');
    }

    /// A string field, bounded (SPEC 9.1 r2).
    fn text(&mut self, key: &str, value: Option<&str>) {
        if let Some(value) = value {
            self.key(key);
            write_string(&mut self.out, &bounded(value));
            self.out.push(b',');
        }
    }

    fn number(&mut self, key: &str, value: Option<impl Into<Value>>) {
        self.value(key, value.map(Into::into).as_ref());
    }

    fn value(&mut self, key: &str, value: Option<&Value>) {
        if let Some(value) = value {
            self.plain &= plain_in_jcs(value);
            self.key(key);
            write_value(&mut self.out, value);
            self.out.push(b',');
        }
    }

    /// Labels are the context's own names, not input: written whole, as before r4's bound.
    fn labels(&mut self, key: &str, labels: Option<&[String]>) {
        if let Some(labels) = labels {
            self.key(key);
            self.out.push(b'[');
            for (index, label) in labels.iter().enumerate() {
                if index > 0 {
                    self.out.push(b',');
                }
                write_string(&mut self.out, label);
            }
            self.out.extend_from_slice(b"],");
        }
    }

    /// Places the chain fields that sort after every member.
    fn finish(mut self, facts: Facts, labels: Option<LabelsAdded>) -> Unsealed {
        let end = self.out.len();
        for gap in &mut self.gaps[self.placed..] {
            *gap = end;
        }
        Unsealed {
            members: self.out,
            gaps: self.gaps,
            plain: self.plain,
            facts,
            labels,
        }
    }
}

/// Whether serde_json writes `value` exactly as JCS does: every number an integer that JCS writes
/// exactly, and every key ASCII (JCS orders keys by UTF-16 code units, serde_json by bytes).
fn plain_in_jcs(value: &Value) -> bool {
    match value {
        Value::Array(items) => items.iter().all(plain_in_jcs),
        Value::Object(map) => map
            .iter()
            .all(|(key, value)| key.is_ascii() && plain_in_jcs(value)),
        other => crate::strict_json::exact_in_jcs(other),
    }
}

/// `rule`'s shape; the message is [`InvalidEvent::Rule`]'s, naming the field.
fn check_rule(rule: &Value) -> Result<(), String> {
    let Some(object) = rule.as_object() else {
        return Err("rule must be an object".to_owned());
    };
    for key in object.keys() {
        if !matches!(key.as_str(), "kind" | "index" | "pattern" | "id") {
            return Err(format!("rule has an unknown field {key:?}"));
        }
    }
    match object.get("kind").and_then(Value::as_str) {
        Some(kind) if RULE_KINDS.contains(&kind) => {}
        Some(kind) => return Err(format!("rule.kind {kind:?} is not one of {RULE_KINDS:?}")),
        None => return Err("rule.kind is missing or not a string".to_owned()),
    }
    match object.get("index") {
        None | Some(Value::Null) => {}
        Some(index) if index.as_u64().is_some() => {}
        Some(_) => return Err("rule.index must be a non-negative integer".to_owned()),
    }
    for key in ["pattern", "id"] {
        match object.get(key) {
            None | Some(Value::Null) | Some(Value::String(_)) => {}
            Some(_) => return Err(format!("rule.{key} must be a string")),
        }
    }
    Ok(())
}

/// 64 lower-case hex digits: the form of every digest in an event.
pub(crate) fn is_sha256_hex(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}
