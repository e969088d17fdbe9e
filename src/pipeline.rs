//! The one path every tool call travels (SPEC section 3), as a spine of named steps in SPEC order: verify
//! the token, the live session, the signature, the window and replay, the binding, decide, charge and
//! claim (with the approval step of SPEC 13 between them where a capability asks for it), forward,
//! settle. Each step lives in the module that owns its rules; this file only orders them
//! and records the audit event of every decision. It returns an [`Outcome`]; `api/` turns it into HTTP.
//!
//! State is made durable at most twice per call (SPEC 12): before the forward, when a claim was taken
//! (its `ToolCallAuthorized` event's group commit syncs the claim with it), and before the reply (the
//! final event's group commit syncs the settled claim, the replay record and the counters).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ed25519_dalek::Signature;
use serde_json::{json, Map, Value};

use crate::audit::{AuditEvent, Decision as Verdict, EventType, Recorded};
use crate::claim::admission::{self, Admitted, Ask, Replay};
use crate::claim::{self, Withheld};
use crate::clock;
use crate::envelope::{self, Call, Envelope};
use crate::error::{ApiError, Code};
use crate::evidence::Evidence;
use crate::gateway::Gateway;
use crate::otel::Phase;
use crate::policy::{self, Capability, Decision, FlowMatch, SecurityContext};
use crate::session::{LiveSession, SessionCache};
use crate::store::{ClaimKind, ClaimRecord, SeenSignature, Store};
use crate::token::{AccessClaims, AgentClaims};
use crate::upstream::{UpstreamError, Upstreams};

/// What a call came to: the answer and its receipt, or a refusal with its SPEC code and the tool called
/// (when the payload got far enough to name one).
pub enum Outcome {
    Success {
        payload: Value,
        receipt: Value,
    },
    Refused {
        error: ApiError,
        tool: Option<String>,
    },
}

/// What the caller sent, as the call's events record it: an envelope's timestamp and payload, or an MCP
/// host's request (SPEC 17), which has no envelope.
struct Sent<'a> {
    envelope_timestamp: Option<i64>,
    payload: &'a Value,
}

/// Who a call comes from, once verified: an agent's token (checks 2–9), or a person's OAuth access token
/// at the MCP endpoint (SPEC 17).
#[derive(Clone)]
enum Verified {
    Agent(Arc<AgentClaims>),
    Person(Arc<AccessClaims>),
}

impl Verified {
    /// The `sub` that claims are derived under and receipts name.
    fn sub(&self) -> &str {
        match self {
            Verified::Agent(claims) => &claims.sub,
            Verified::Person(person) => &person.sub,
        }
    }

    /// The event fields that say who called: the token's, never the token (SPEC 9.1, 17).
    fn describe(&self, mut event: AuditEvent) -> AuditEvent {
        match self {
            Verified::Agent(claims) => {
                event = event
                    .sub(&claims.sub)
                    .scp(&claims.scp)
                    .jti(&claims.jti)
                    .session_id(&claims.exec_id);
                if let Some(wid) = &claims.wid {
                    event = event.wid(wid);
                }
            }
            Verified::Person(person) => {
                event = event.auth("oauth").iss(&person.iss).sub(&person.sub);
                if let Some(client_id) = &person.client_id {
                    event = event.client_id(client_id);
                }
                if let Some(jti) = &person.jti {
                    event = event.jti(jti);
                }
            }
        }
        event
    }
}

/// A refusal, with the rule that made it when the policy decided.
struct Refusal {
    error: ApiError,
    rule: Option<policy::Rule>,
    /// The event that records it, when not the one its code's row names (a new approval request).
    event: Option<EventType>,
}

/// Refusals travel boxed: the happy path's `Result` stays small.
type Refused = Box<Refusal>;

fn refuse(code: Code, message: impl Into<String>) -> Refused {
    refused(ApiError::new(code, message))
}

/// A refusal whose code the error itself names (`crate::error` maps the typed errors to codes).
fn refused(error: ApiError) -> Refused {
    Box::new(Refusal {
        error,
        rule: None,
        event: None,
    })
}

/// A refusal of a call that its capability allowed and charged: its event names the capability's rule,
/// which is also how a restart finds the charge again (`crate::recovery`).
fn decided_by(mut refusal: Refused, rule: &policy::Rule) -> Refused {
    refusal.rule = Some(rule.clone());
    refusal
}

fn store_refusal(error: impl std::fmt::Display) -> Refused {
    refuse(Code::StoreUnavailable, error.to_string())
}

/// What the audit events of one call share, filled in as the checks learn it.
#[derive(Default)]
struct CallFacts {
    /// hex(SHA-256(JCS(payload))), computed once per call.
    payload_sha256: String,
    /// The envelope's signature text, only when it decodes to 64 bytes (SPEC 9.1 r2: bounded fields).
    signature: Option<String>,
    session_id: Option<String>,
    /// The session's team (SPEC 16), once the session is found: the team of every event of the call.
    team: Option<String>,
    caller: Option<Verified>,
    tool: Option<String>,
    /// The session's security context, when it exists (with its version: the receipt's `context`).
    context: Option<String>,
    context_version: Option<String>,
    request_id: Option<String>,
    claim: Option<&'static str>,
    action_ref: Option<String>,
    claimed_at: Option<String>,
    approval_id: Option<String>,
    /// Check 8's replay record: the call's first store write carries it (admission, in the same statement
    /// or transaction), or the refusal that ends the call first. Its `was_new` is check 8's second half.
    replay: Replay,
    /// Some of the call may have reached the tool: its refusal event is then retried (SPEC 3 r2).
    forwarded: bool,
    /// Check 8's first half: the timestamp is in the window. Every answer after both halves carries a
    /// signed receipt (SPEC 14).
    in_window: bool,
    /// The exported span of the call's current phase (`crate::otel`); inert when traces are not exported.
    phases: crate::otel::Phases,
}

impl CallFacts {
    fn event(&self, gw: &Gateway, kind: EventType, sent: &Sent) -> AuditEvent {
        let mut event = AuditEvent::new(kind).payload_sha256(&self.payload_sha256);
        if let Some(timestamp) = sent.envelope_timestamp {
            event = event.envelope_timestamp(timestamp);
        }
        if let Some(caller) = &self.caller {
            event = caller.describe(event);
        }
        if let Some(signature) = &self.signature {
            event = event.signature(signature);
        }
        if let Some(session_id) = &self.session_id {
            event = event.session_id(session_id);
        }
        if let Some(team) = &self.team {
            event = event.team(team);
        }
        if let Some(tool) = &self.tool {
            event = event.tool(tool);
        }
        if let Some(version) = &self.context_version {
            event = event.context_version(version);
        }
        if let Some(request_id) = &self.request_id {
            event = event.request_id(request_id);
        }
        if let Some(claim) = self.claim {
            event = event.claim(claim);
        }
        if let Some(action_ref) = &self.action_ref {
            event = event.action_ref(action_ref);
        }
        if let Some(approval_id) = &self.approval_id {
            event = event.approval_id(approval_id);
        }
        if gw.config().audit.include_payloads {
            event = event.payload(sent.payload.clone());
        }
        event
    }

    fn passed_check_8(&self) -> bool {
        self.in_window && self.replay.was_new
    }

    /// What the receipt says of the call besides the answer (SPEC 14), for evidence to sign.
    fn statement<'a>(
        &'a self,
        code: Option<Code>,
        answer: Option<&'a Value>,
        recorded: &Recorded,
    ) -> crate::evidence::Statement<'a> {
        crate::evidence::Statement {
            decision: if code.is_some() {
                Verdict::Deny
            } else {
                Verdict::Allow
            },
            code: code.map(Code::number),
            session_id: self.session_id.as_deref(),
            sub: self.caller.as_ref().map(Verified::sub),
            tool: self.tool.as_deref().filter(|tool| *tool != LIST_TOOLS),
            payload_sha256: &self.payload_sha256,
            answer,
            event_seq: recorded.seq,
        }
    }

    /// Section 10's receipt fields that this call has (SPEC 7.3, 10).
    fn receipt_fields(&self, event_id: &str) -> Map<String, Value> {
        let known = [
            ("request_id", self.request_id.as_deref()),
            ("claim", self.claim),
            ("action_ref", self.action_ref.as_deref()),
            ("claimed_at", self.claimed_at.as_deref()),
            ("event_id", Some(event_id)),
            ("context", self.context.as_deref()),
            ("context_version", self.context_version.as_deref()),
        ];
        known
            .into_iter()
            .filter_map(|(name, value)| value.map(|value| (name.to_owned(), json!(value))))
            .collect()
    }

    /// What the call's exported span says of it: names and ids, never arguments (SPEC 9.1).
    fn traced(&self) -> crate::otel::CallAttributes<'_> {
        crate::otel::CallAttributes {
            tool: self.tool.as_deref(),
            context: self.context.as_deref(),
            claim: self.claim,
            session_id: self.session_id.as_deref(),
        }
    }

    fn note_claim(&mut self, record: &ClaimRecord, outcome: &'static str) {
        self.request_id = Some(record.request_id.clone());
        self.action_ref = Some(record.action_ref.clone());
        self.claimed_at = Some(record.claimed_at.clone());
        self.claim = Some(outcome);
    }
}

/// The name `tools/list` calls are audited under; a receipt names no tool for them (SPEC 14).
const LIST_TOOLS: &str = "tools/list";

/// `POST /v1/invoke`: the whole path of one call. `body` has already been read within the size limit.
pub async fn invoke(gw: &Gateway, body: &[u8], client: Option<std::net::SocketAddr>) -> Outcome {
    let started = Instant::now();
    // Check 1: a body that is not an envelope at all gets one rate-limited event with no content.
    let env = match envelope::parse_envelope(body) {
        Ok(env) => env,
        Err(e) => {
            gw.audit().record_unreadable(client, body.len());
            return Outcome::Refused {
                error: ApiError::new(Code::MalformedEnvelope, e.to_string()),
                tool: None,
            };
        }
    };
    // Check 6's message, built once: its payload bytes also give the audit's payload_sha256.
    let (message, payload) = env.canonical_message_with_payload();
    let mut facts = CallFacts {
        payload_sha256: envelope::sha256_hex(&message[payload]),
        signature: envelope::decode_signature(&env.signature)
            .is_ok()
            .then(|| env.signature.clone()),
        ..CallFacts::default()
    };
    let sent = Sent {
        envelope_timestamp: Some(env.timestamp),
        payload: &env.payload,
    };
    let result = run(gw, &env, &sent, &message, &mut facts, started).await;
    conclude(gw, &sent, facts, result, client, started).await
}

/// SPEC 17: a person's `tools/call` or `tools/list` from an MCP host, with the access token already
/// verified and the person's session found: the pipeline from check 9 on, as if the gateway had received
/// a verified envelope of that session. `payload` is the JSON-RPC request the host's call amounts to.
pub async fn call_as_person(
    gw: &Gateway,
    person: Arc<AccessClaims>,
    session: Arc<LiveSession>,
    payload: &Value,
) -> Outcome {
    let started = Instant::now();
    let mut facts = CallFacts {
        payload_sha256: envelope::jcs_sha256_hex(payload),
        session_id: Some(session.record.session_id.clone()),
        team: Some(session.record.team.clone()),
        caller: Some(Verified::Person(person)),
        // No envelope, so nothing to replay: every answer carries a receipt (SPEC 14, 17).
        in_window: true,
        replay: Replay {
            unwritten: None,
            was_new: true,
        },
        ..CallFacts::default()
    };
    let sent = Sent {
        envelope_timestamp: None,
        payload,
    };
    let result = match require_live(&session, clock::now_secs()) {
        Ok(()) => after_verification(gw, &sent, &mut facts, &session, started).await,
        Err(refusal) => Err(refusal),
    };
    conclude(gw, &sent, facts, result, None, started).await
}

/// The call's outcome, its refusal recorded first (and its replay record written) when it was refused.
async fn conclude(
    gw: &Gateway,
    sent: &Sent<'_>,
    mut facts: CallFacts,
    result: Result<Outcome, Refused>,
    client: Option<std::net::SocketAddr>,
    started: Instant,
) -> Outcome {
    let refusal = match result {
        Ok(outcome) => {
            crate::otel::record_call(facts.traced());
            return outcome;
        }
        Err(refusal) => refusal,
    };
    facts.phases.enter(Phase::Settle);
    let refusal = remember_before_refusing(gw, &mut facts, refusal).await;
    let error = record_refusal(gw, sent, &facts, *refusal, client, started).await;
    crate::otel::record_call(facts.traced());
    Outcome::Refused {
        error,
        tool: facts.tool,
    }
}

/// A call refused after check 8 but before its admission writes the replay record now; an envelope seen
/// before still gets 1008, the answer check 8 would have given first (after its own 1007).
async fn remember_before_refusing(
    gw: &Gateway,
    facts: &mut CallFacts,
    refusal: Refused,
) -> Refused {
    match write_replay_record(gw, facts).await {
        Err(replay) if replay.error.code == Code::StoreUnavailable => replay,
        Err(replay) if refusal.error.code != Code::TimestampOutOfWindow => replay,
        _ => refusal,
    }
}

/// Writes check 8's replay record on its own, for a call that ends before admission: 1008 when the
/// signature was seen before.
async fn write_replay_record(gw: &Gateway, facts: &mut CallFacts) -> Result<(), Refused> {
    let Some(seen) = facts.replay.unwritten.take() else {
        return Ok(());
    };
    let first_use = gw
        .store()
        .remember_signature(&seen.signature, seen.expires_at_ms)
        .await
        .map_err(store_refusal)?;
    if first_use {
        facts.replay.was_new = true;
        Ok(())
    } else {
        Err(replayed())
    }
}

fn replayed() -> Refused {
    refuse(
        Code::EnvelopeReplayed,
        "this envelope's signature was seen before",
    )
}

/// The spine: checks 2–9, then the policy, the claim, the forward and the settlement, in SPEC order.
async fn run(
    gw: &Gateway,
    env: &Envelope,
    sent: &Sent<'_>,
    message: &[u8],
    facts: &mut CallFacts,
    started: Instant,
) -> Result<Outcome, Refused> {
    let now = clock::now_secs();
    facts.phases.enter(Phase::Verify);
    let claims = verify_token(gw, env, now).await?; // checks 2–4
    facts.caller = Some(Verified::Agent(claims.clone()));
    let session = session_of(gw.sessions(), gw.store().as_ref(), &claims).await?; // check 5
    facts.session_id = Some(session.record.session_id.clone());
    facts.team = Some(session.record.team.clone()); // a refused call's event is its team's too
    require_live(&session, now)?; // check 5: neither revoked nor expired
    let signature = verify_signature(env, message, &session)?; // checks 6–7
    check_window(gw, env, &signature, now, facts)?; // check 8 (its replay record: at admission)
    bind_token(env, &claims, &session)?; // check 9
    after_verification(gw, sent, facts, &session, started).await
}

/// Everything after the caller is verified, for envelopes and MCP hosts alike (SPEC 17: one pipeline):
/// the payload's call, the policy, rate, budget, approval and claim, the forward and the settlement.
async fn after_verification(
    gw: &Gateway,
    sent: &Sent<'_>,
    facts: &mut CallFacts,
    session: &Arc<LiveSession>,
    started: Instant,
) -> Result<Outcome, Refused> {
    let caller = facts
        .caller
        .clone()
        .ok_or_else(|| store_refusal("no verified caller"))?;
    let call = envelope::parse_call(sent.payload).map_err(|e| refused(e.into()))?;
    let (context, shadow) = gw
        .contexts()
        .get_with_shadow(&session.record.security_context);
    facts.context = context.as_ref().map(|c| c.spec.name.clone());
    facts.context_version = context.as_ref().map(|c| c.version.clone());
    let call = match call {
        Call::ToolsList { id } => {
            facts.phases.enter(Phase::Forward);
            return list_tools(gw, sent, facts, context, session, id).await;
        }
        Call::ToolsCall {
            id,
            tool,
            arguments,
            idempotency_key,
        } => ToolCall {
            id,
            tool: tool.as_str().to_owned(),
            arguments,
            idempotency_key,
        },
    };
    facts.tool = Some(call.tool.clone());
    facts.phases.enter(Phase::Decide);
    let allowed = decide(gw, context, shadow, &call.asked(session), facts, sent).await?; // SPEC 6.3, 19, 6.4
    require_route(gw.upstreams(), &call.tool)?;
    require_pinned(gw, &call.tool, &allowed.rule).await?; // SPEC 18, before anything is charged
    facts.phases.enter(Phase::Claim);
    let (pending, grant) = match admit(gw, facts, &caller, session, &allowed, &call).await? {
        Next::Forward { claim, grant } => (claim, grant),
        Next::Skip(record) => {
            facts.phases.enter(Phase::Settle);
            return skip(gw, sent, facts, &allowed, &record, &call.id).await;
        }
    };
    // Durable before the forward when claimed; a grant goes back when nothing was sent.
    if let Err(refusal) = authorize(gw, sent, facts, &allowed.rule, pending.as_ref()).await {
        if let Some(used) = &grant {
            let _ = crate::approval::restore(gw.store().as_ref(), used).await;
        }
        return Err(refusal);
    }
    facts.phases.enter(Phase::Forward);
    let answer = forward(gw.upstreams(), facts, &call, allowed.capability()).await;
    facts.phases.enter(Phase::Settle);
    if let Some(used) = &grant {
        use_grant(gw, used, &answer).await?;
    }
    let capability = allowed.capability();
    settle(
        gw,
        sent,
        facts,
        pending.as_ref(),
        answer,
        capability,
        started,
    )
    .await
}

/// A `tools/call` as its payload asks it.
struct ToolCall {
    id: Value,
    tool: String,
    arguments: Map<String, Value>,
    idempotency_key: Option<String>,
}

impl ToolCall {
    fn asked<'a>(&'a self, session: &'a LiveSession) -> Asked<'a> {
        Asked {
            session,
            tool: &self.tool,
            arguments: &self.arguments,
        }
    }
}

/// What the policy allowed: the context in force, the capability and rule that allowed the call, and the
/// flow rule that asks a person's approval first, when one does.
struct Allowed {
    context: Arc<SecurityContext>,
    index: usize,
    rule: policy::Rule,
    flow: Option<FlowMatch>,
}

impl Allowed {
    fn capability(&self) -> &Capability {
        &self.context.capabilities[self.index]
    }
}

/// 5004 (SPEC 8): an allowed tool that no upstream serves.
fn require_route(upstreams: &Upstreams, tool: &str) -> Result<(), Refused> {
    if upstreams.has_route(tool) {
        return Ok(());
    }
    Err(refuse(
        Code::NoRouteForTool,
        format!("no upstream serves {tool:?}"),
    ))
}

/// SPEC 18: a tool whose definition is not the pinned one is refused before anything is sent; its event
/// names the capability that allowed the call, and nothing was charged.
async fn require_pinned(gw: &Gateway, tool: &str, rule: &policy::Rule) -> Result<(), Refused> {
    gw.check_tool(tool).await.map_err(|withheld| {
        let error = ApiError::new(Code::ToolDefinitionChanged, withheld.message())
            .with_details(withheld.details());
        decided_by(
            Box::new(Refusal {
                error,
                rule: None,
                event: None,
            }),
            rule,
        )
    })
}

/// What an admitted call does next: run, holding its claim and grant, or answer from a COMMITTED claim.
enum Next {
    Forward {
        claim: Option<ClaimRecord>,
        grant: Option<Box<crate::store::ApprovalRecord>>,
    },
    Skip(ClaimRecord),
}

/// SPEC 7, 11, 13 (`claim::admission`): the call's replay record, rate, budget, approval step and claim.
/// A claim that answers the call with a refusal (4001, 4002) is refused here; every refusal of an allowed
/// call names its capability's rule.
async fn admit(
    gw: &Gateway,
    facts: &mut CallFacts,
    caller: &Verified,
    session: &LiveSession,
    allowed: &Allowed,
    call: &ToolCall,
) -> Result<Next, Refused> {
    // Only an approval request needs the call's digest here (a claim computes its own).
    let call_digest =
        approval_rule(allowed).map(|_| claim::call_digest(&call.tool, &call.arguments));
    let ask = ask(caller, session, allowed, call, call_digest.as_deref());
    let admitted = admission::admit(gw.approvals(), ask, &mut facts.replay)
        .await
        .map_err(|refusal| not_admitted(facts, allowed, refusal))?;
    note_admission(facts, &admitted);
    match admitted {
        Admitted::Run { claim, grant } => Ok(Next::Forward { claim, grant }),
        Admitted::Skip(record) => Ok(Next::Skip(record)),
        Admitted::Pending(_) => Err(decided_by(
            refuse(
                Code::ClaimPending,
                "this call is already in flight or its outcome is unknown",
            ),
            &allowed.rule,
        )),
        Admitted::OtherCall(_) => Err(decided_by(
            refuse(
                Code::IdempotencyKeyReused,
                "this idempotency key was used for a different tool or different arguments",
            ),
            &allowed.rule,
        )),
    }
}

/// A flow rule's `approval` asks a person even where the capability asks none; one approval for both.
fn approval_rule(allowed: &Allowed) -> Option<policy::ApprovalRule> {
    let capability = allowed.capability();
    let flow = allowed.flow.as_ref();
    capability
        .approval
        .or(flow.map(|_| crate::approval::FLOW_APPROVAL))
}

/// What the call is admitted with: its capability's rate window, the session's budget, its claim, and
/// the approval step when the capability or a flow rule asks for a person.
fn ask<'a>(
    caller: &'a Verified,
    session: &'a LiveSession,
    allowed: &'a Allowed,
    call: &'a ToolCall,
    call_digest: Option<&'a str>,
) -> Ask<'a> {
    let capability = allowed.capability();
    let record = &session.record;
    Ask {
        rate: capability.rate_limit.map(|limit| {
            let cell = policy::rate::cell_key(
                &record.session_id,
                &allowed.context.spec.name,
                &capability.identity(),
            );
            (cell, crate::window::SlidingWindow::from(limit))
        }),
        // Counted without a budget too: the session's `calls.allowed` reads this cell.
        budget: (
            crate::session::budget_key(&record.session_id),
            record.max_calls.unwrap_or(u64::MAX),
        ),
        claim: new_claim(caller.sub(), session, capability, call),
        approval: approval_rule(allowed)
            .zip(call_digest)
            .map(|(rule, call_digest)| crate::approval::Call {
                session_id: &record.session_id,
                sub: caller.sub(),
                tool: &call.tool,
                arguments: &call.arguments,
                call_digest,
                context: &allowed.context.spec.name,
                context_version: &allowed.context.version,
                rule,
                registered_by: record.registered_by.as_ref(),
                team: &record.team,
                flow_rule: allowed.flow.as_ref().map(|flow| flow.index),
            }),
    }
}

/// The claim (and grant) the call's events and receipt name.
fn note_admission(facts: &mut CallFacts, admitted: &Admitted) {
    match admitted {
        Admitted::Run { claim, grant } => {
            match claim {
                Some(record) => facts.note_claim(record, "PROCEED"),
                None => facts.claim = Some("NONE"),
            }
            if let Some(used) = grant {
                facts.approval_id = Some(used.approval_id.clone());
            }
        }
        Admitted::Skip(record) => facts.note_claim(record, "SKIP"),
        Admitted::Pending(record) => facts.note_claim(record, "PENDING"),
        Admitted::OtherCall(record) => {
            facts.note_claim(record, "PENDING");
            facts.claim = None;
        }
    }
}

/// The refusal of an allowed call that admission turned away. Rate, budget and approval are the
/// capability's decisions: they carry its rule.
fn not_admitted(facts: &mut CallFacts, allowed: &Allowed, refusal: admission::Refusal) -> Refused {
    use admission::Refusal as Not;
    let rule = &allowed.rule;
    match refusal {
        Not::Replayed => replayed(),
        Not::RateLimited { retry_after_ms } => {
            let secs = u64::try_from(retry_after_ms)
                .unwrap_or(0)
                .div_ceil(1000)
                .max(1);
            let message = format!(
                "rate limit of capability {} exceeded; retry in {secs} s",
                allowed.index
            );
            let mut refusal = refuse(Code::RateLimitExceeded, message);
            refusal.error = refusal.error.with_retry_after(secs);
            decided_by(refusal, rule)
        }
        Not::BudgetExhausted => decided_by(
            refuse(
                Code::BudgetExhausted,
                "the session's call budget is used up",
            ),
            rule,
        ),
        Not::Held(hold) => held(facts, rule, *hold),
        Not::Store(error) => store_refusal(error),
    }
}

/// The refusal (4003 or 4004) of a call that the approval step holds back, naming its request.
fn held(facts: &mut CallFacts, rule: &policy::Rule, hold: admission::Hold) -> Refused {
    use admission::Hold;
    let (code, message, record, event) = match hold {
        Hold::Requested(record) => (
            Code::ApprovalRequired,
            "a person must approve this call first",
            record,
            Some(EventType::ApprovalRequested),
        ),
        Hold::Waiting(record) => (
            Code::ApprovalRequired,
            "this call is waiting for a person's approval",
            record,
            None,
        ),
        Hold::Denied(record) => (
            Code::ApprovalDenied,
            "a person refused this call",
            record,
            None,
        ),
    };
    facts.approval_id = Some(record.approval_id.clone());
    let mut details = json!({
        "approval_id": record.approval_id,
        "expires_at": clock::rfc3339_millis(record.expires_at_ms),
    });
    if let Some(reason) = &record.reason {
        details["reason"] = json!(reason);
    }
    Box::new(Refusal {
        error: ApiError::new(code, message).with_details(details),
        rule: Some(rule.clone()),
        event,
    })
}

/// Sends the call to its upstream. A call that never left the gateway is not `forwarded` (SPEC 3 r2).
async fn forward(
    upstreams: &Upstreams,
    facts: &mut CallFacts,
    call: &ToolCall,
    capability: &Capability,
) -> Result<Value, UpstreamError> {
    let answer = upstreams
        .call(
            &call.tool,
            &call.id,
            &call.arguments,
            call.idempotency_key.as_deref(),
            capability.max_response_size,
        )
        .await;
    facts.forwarded = !matches!(
        answer,
        Err(UpstreamError::Unavailable(_) | UpstreamError::NoRoute)
    );
    answer
}

/// After the forward: a call that reached the tool used its grant up (`ApprovalUsed`, durable with the
/// call's final event); one that never left the gateway gives it back (SPEC 13).
async fn use_grant(
    gw: &Gateway,
    used: &crate::store::ApprovalRecord,
    answer: &Result<Value, UpstreamError>,
) -> Result<(), Refused> {
    if matches!(
        answer,
        Err(UpstreamError::Unavailable(_) | UpstreamError::NoRoute)
    ) {
        return crate::approval::restore(gw.store().as_ref(), used)
            .await
            .map_err(store_refusal);
    }
    let event = crate::approval::event(EventType::ApprovalUsed, used);
    retry_after_forward(gw, || gw.audit().record_deferred(event.clone()))
        .await
        .map_err(forwarded_but_unrecorded)
}

/// Checks 2–4: the token decodes, verifies with a pinned key, and is current.
async fn verify_token(gw: &Gateway, env: &Envelope, now: i64) -> Result<Arc<AgentClaims>, Refused> {
    gw.agent_tokens()
        .verify_with_refresh(&env.security_token, now)
        .await
        .map_err(|e| refused(e.into()))
}

/// Check 5: the session of the token's execution, from memory.
async fn session_of(
    sessions: &SessionCache,
    store: &dyn Store,
    claims: &AgentClaims,
) -> Result<Arc<LiveSession>, Refused> {
    sessions
        .get(store, &claims.exec_id)
        .await
        .map_err(store_refusal)?
        .ok_or_else(|| refuse(Code::SessionNotFound, "no session for the token's exec_id"))
}

/// Check 5: the session is neither revoked nor expired.
fn require_live(session: &LiveSession, now: i64) -> Result<(), Refused> {
    if session.record.revoked_at_ms.is_some() {
        return Err(refuse(
            Code::SessionInactive,
            "the session has been revoked",
        ));
    }
    if now >= session.record.expires_at {
        return Err(refuse(Code::SessionInactive, "the session has expired"));
    }
    Ok(())
}

/// Checks 6–7: the signature decodes and verifies under the session's key (`message` is check 6's).
fn verify_signature(
    env: &Envelope,
    message: &[u8],
    session: &LiveSession,
) -> Result<Signature, Refused> {
    let signature = envelope::decode_signature(&env.signature)
        .map_err(|e| refuse(Code::InvalidSignature, e.to_string()))?;
    let key = session
        .key
        .as_ref()
        .ok_or_else(|| refuse(Code::SessionInactive, "the session's key has been erased"))?;
    key.verify(message, &signature).map_err(|_| {
        refuse(
            Code::SignatureVerificationFailed,
            "the signature does not verify under the session key",
        )
    })?;
    Ok(signature)
}

/// Check 8: freshness; the replay half is the record this notes in `facts`, which the call's first store
/// write makes (admission, or the refusal that ends the call first). A verified signature is remembered
/// for as long as its timestamp could still fall inside the window, whatever this envelope's outcome.
fn check_window(
    gw: &Gateway,
    env: &Envelope,
    signature: &Signature,
    now: i64,
    facts: &mut CallFacts,
) -> Result<(), Refused> {
    let skew = gw.config().limits.max_clock_skew_secs;
    let window_end_ms = crate::store::replay_record_expiry_ms(env.timestamp, skew);
    facts.replay.unwritten = (window_end_ms > clock::now_millis()).then(|| SeenSignature {
        signature: signature.to_bytes(),
        expires_at_ms: window_end_ms,
    });
    if now.saturating_sub(env.timestamp).abs() > skew {
        return Err(refuse(
            Code::TimestampOutOfWindow,
            format!("the timestamp is more than {skew} s from the gateway's clock"),
        ));
    }
    // Since a start with a wider window, older records may be gone: no envelope older than they cover.
    if let Some(covered) = gw.replay_cover().narrowed_secs(clock::now_millis()) {
        if now.saturating_sub(env.timestamp) > covered {
            return Err(refuse(
                Code::TimestampOutOfWindow,
                format!(
                    "the timestamp is more than {covered} s old, the window that the replay records \
                     cover until the widened max_clock_skew_secs of {skew} s has passed"
                ),
            ));
        }
    }
    facts.in_window = true;
    Ok(())
}

/// Check 9: the token is bound to this session and workload.
fn bind_token(env: &Envelope, claims: &AgentClaims, session: &LiveSession) -> Result<(), Refused> {
    let record = &session.record;
    if claims.scp != record.security_context {
        return Err(refuse(
            Code::AttestationScopeMismatch,
            "the token's scp is not the session's security context",
        ));
    }
    if record
        .agent_id
        .as_ref()
        .is_some_and(|agent| *agent != claims.sub)
    {
        return Err(refuse(
            Code::TokenVerificationFailed,
            "token sub is not the session's agent",
        ));
    }
    if let Some(wid) = &claims.wid {
        let container_differs = env.container_id.as_ref().is_some_and(|c| c != wid);
        let workload_differs = record.workload_id.as_ref().is_some_and(|w| w != wid);
        if container_differs || workload_differs {
            return Err(refuse(
                Code::TokenVerificationFailed,
                "token wid does not match the workload",
            ));
        }
    }
    Ok(())
}

/// The call a decision is about.
struct Asked<'a> {
    session: &'a LiveSession,
    tool: &'a str,
    arguments: &'a Map<String, Value>,
}

/// SPEC 6.3 and 19: deny list, the first matching capability, the flow rules with the session's labels
/// (read from the store only when a rule could apply to that capability), and its argument checks.
/// Returns the context in force for this call, the index of the capability that allowed it, and the
/// flow rule that asks a person's approval first, when one does. A shadow version (SPEC 6.4 r4) decides
/// the call too, and changes nothing for it.
async fn decide(
    gw: &Gateway,
    context: Option<Arc<SecurityContext>>,
    shadow: Option<Arc<SecurityContext>>,
    asked: &Asked<'_>,
    facts: &CallFacts,
    sent: &Sent<'_>,
) -> Result<Allowed, Refused> {
    let Asked {
        session,
        tool,
        arguments,
    } = *asked;
    let needs_labels = |context: Option<&SecurityContext>| {
        policy::flows::needs_labels(context, &session.patterns, tool)
    };
    let held = if needs_labels(context.as_deref()) || needs_labels(shadow.as_deref()) {
        crate::session::labels(gw.store().as_ref(), &session.record.session_id)
            .await
            .map_err(store_refusal)?
    } else {
        Vec::new()
    };
    let decision = policy::decide_in_session(
        context.as_deref(),
        &session.patterns,
        tool,
        arguments,
        &held,
    );
    if let Some(shadow) = shadow {
        let live = (&decision, context.as_deref());
        compare_with_shadow(gw, live, &shadow, asked, &held, facts, sent).await;
    }
    match decision {
        Decision::Allow {
            capability,
            rule,
            flow,
        } => match context {
            Some(context) if capability < context.capabilities.len() => Ok(Allowed {
                context,
                index: capability,
                rule,
                flow,
            }),
            _ => Err(missing_context()),
        },
        Decision::Deny {
            code,
            rule,
            message,
            flow,
        } => {
            let mut error = ApiError::new(code, message);
            if let Some(flow) = flow {
                // 2010 names the rule, the labels and the events that brought them (SPEC 19).
                error = error.with_details(json!({ "flow_rule": flow }));
            }
            Err(Box::new(Refusal {
                error,
                rule: Some(rule),
                event: None,
            }))
        }
    }
}

/// SPEC 6.4 r4: the shadow version decides the call with the same labels; the comparison is counted,
/// and a different decision is recorded (made durable by the call's own event) and counted per context.
async fn compare_with_shadow(
    gw: &Gateway,
    (live, context): (&Decision, Option<&SecurityContext>),
    shadow: &SecurityContext,
    asked: &Asked<'_>,
    held: &[policy::HeldLabel],
    facts: &CallFacts,
    sent: &Sent<'_>,
) {
    let shadowed = policy::decide_in_session(
        Some(shadow),
        &asked.session.patterns,
        asked.tool,
        asked.arguments,
        held,
    );
    let verdicts = (live.verdict(context), shadowed.verdict(Some(shadow)));
    gw.shadows()
        .count(shadow, asked.tool, verdicts, crate::clock::now_millis());
    if verdicts.0 == verdicts.1 {
        return;
    }
    metrics::counter!("sealgate_shadow_differences_total", "context" => shadow.name().to_owned())
        .increment(1);
    let event = facts
        .event(gw, EventType::ShadowDecisionDiffered, sent)
        .decisions(json!({
            "live": crate::shadow::side(live, verdicts.0, context),
            "shadow": crate::shadow::side(&shadowed, verdicts.1, Some(shadow)),
        }));
    if let Err(e) = gw.audit().record_deferred(event).await {
        tracing::warn!(error = %e, "could not record a shadow decision that differed");
    }
}

/// 2000 for a session whose context is gone (deleted since registration).
fn missing_context() -> Refused {
    Box::new(Refusal {
        error: ApiError::new(
            Code::ToolNotAllowed,
            "the session's security context does not exist",
        ),
        rule: Some(policy::Rule::without_position(policy::RuleKind::NoMatch)),
        event: None,
    })
}

/// The PENDING record this call would take, or None when its capability takes no claim (SPEC 7.1).
fn new_claim(
    sub: &str,
    session: &LiveSession,
    capability: &Capability,
    call: &ToolCall,
) -> Option<ClaimRecord> {
    let request_id = claim::request_id(
        capability.claim,
        sub,
        &session.record.session_id,
        &call.tool,
        &call.arguments,
        call.idempotency_key.as_deref(),
    )?;
    Some(claim::new_pending(
        ClaimKind::Invoke,
        &request_id,
        &call.tool,
        sub,
        Some(&session.record.session_id),
        Some(claim::call_digest(&call.tool, &call.arguments)),
        &session.record.team,
    ))
}

/// Records `ToolCallAuthorized`. With a claim, it is awaited: its group commit makes the claim durable
/// before anything is sent (SPEC 7.2). Without one it is only queued; the reply's event makes it durable.
async fn authorize(
    gw: &Gateway,
    sent: &Sent<'_>,
    facts: &CallFacts,
    rule: &policy::Rule,
    pending: Option<&ClaimRecord>,
) -> Result<(), Refused> {
    let event = facts
        .event(gw, EventType::ToolCallAuthorized, sent)
        .decision(Verdict::Allow)
        .rule(serde_json::to_value(rule).unwrap_or(Value::Null));
    let Some(pending) = pending else {
        return gw
            .audit()
            .record_deferred(event)
            .await
            .map_err(store_refusal);
    };
    if let Err(e) = gw.audit().record(event).await {
        // Nothing was sent: give the claim back so that a retry is not blocked by 4001 forever.
        let _ = claim::release(gw.store().as_ref(), pending).await;
        return Err(store_refusal(e));
    }
    Ok(())
}

/// After the forward: settle the claim by what happened (SPEC 7.2) and record the outcome, both made
/// durable by the final event before the reply leaves.
async fn settle(
    gw: &Gateway,
    sent: &Sent<'_>,
    facts: &CallFacts,
    pending: Option<&ClaimRecord>,
    answer: Result<Value, UpstreamError>,
    capability: &Capability,
    started: Instant,
) -> Result<Outcome, Refused> {
    let mut response = match (answer, pending) {
        (Ok(response), _) => response,
        (Err(err), None) => return Err(upstream_refusal(&err)),
        (Err(err), Some(pending)) => {
            retry_after_forward(gw, || {
                claim::settle_failed(gw.store().as_ref(), pending, &err)
            })
            .await
            .map_err(forwarded_but_unrecorded)?;
            return Err(upstream_refusal(&err));
        }
    };
    // SPEC 18: what is stored for a SKIP, recorded with payloads and bound by the receipt is the
    // guarded answer.
    let guard = gw.answer_guard().rules(capability.answer_guard.as_ref());
    guard_answer(gw, sent, facts, pending, &mut response, guard).await?;
    let mut completed = facts
        .event(gw, EventType::ToolCallCompleted, sent)
        .decision(Verdict::Allow)
        .duration_ms(started.elapsed().as_millis() as u64);
    if gw.config().audit.include_payloads {
        completed = completed.result(response.clone());
    }
    // The session gains the capability's labels (SPEC 19) with this event: the store keeps them from the
    // event's batch, in the same commit, so they hold on every replica before the answer leaves.
    if !capability.labels.is_empty() {
        completed = completed.labels_added(&capability.labels);
    }
    // The claim's COMMITTED record rides in the same batch as the event: one durable commit for both.
    let settlement = pending.map(|pending| claim::answered(pending, &response));
    let recorded = retry_after_forward(gw, || {
        gw.audit()
            .record_with_settlement(completed.clone(), settlement.clone())
    })
    .await
    .map_err(forwarded_but_unrecorded)?;
    Ok(success(gw.evidence(), response, facts, &recorded))
}

/// The answer guard (SPEC 18) on an answer that came back. A rewritten answer gets an `AnswerGuarded`
/// event that rides in the batch of the call's final event; a withheld one settles the claim (the tool
/// ran) with that event, and is refused with 2011.
async fn guard_answer(
    gw: &Gateway,
    sent: &Sent<'_>,
    facts: &CallFacts,
    pending: Option<&ClaimRecord>,
    response: &mut Value,
    guard: crate::guard::Rules<'_>,
) -> Result<(), Refused> {
    let tool = facts.tool.as_deref().unwrap_or_default();
    let report = crate::guard::answer(response, gw.upstreams().credentials(tool), guard);
    if report.is_clean() {
        return Ok(());
    }
    report.count_metrics();
    let event = facts
        .event(gw, EventType::AnswerGuarded, sent)
        .detail(report.detail());
    if !report.withheld() {
        return gw
            .audit()
            .record_deferred(event)
            .await
            .map_err(forwarded_but_unrecorded);
    }
    let event = event.code(Code::AnswerWithheld.number());
    let settlement = pending.map(|pending| claim::withheld(pending, report.kinds()));
    retry_after_forward(gw, || {
        gw.audit()
            .record_with_settlement(event.clone(), settlement.clone())
    })
    .await
    .map_err(forwarded_but_unrecorded)?;
    Err(answer_withheld(report.kinds()))
}

/// 2011: the tool ran, and its answer held what the answer guard refuses (kinds only, never values).
fn answer_withheld(kinds: Vec<String>) -> Refused {
    let mut refusal = refuse(
        Code::AnswerWithheld,
        format!(
            "the tool's answer was withheld by the answer guard: it holds {}",
            kinds.join(", ")
        ),
    );
    refusal.error = refusal.error.with_details(json!({ "kinds": kinds }));
    refusal
}

/// Once a call has reached the tool its outcome must not be dropped by a passing store fault: the write
/// is retried for `limits.store_retry_secs` (SPEC 3 r2).
async fn retry_after_forward<T, E, F, Fut>(gw: &Gateway, mut write: F) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
    E: std::fmt::Display,
{
    let deadline = Instant::now() + Duration::from_secs(gw.config().limits.store_retry_secs);
    let mut pause = Duration::from_millis(10);
    loop {
        match write().await {
            Ok(value) => return Ok(value),
            Err(e) if Instant::now() + pause >= deadline => return Err(e),
            Err(e) => {
                tracing::warn!(error = %e, "store write after a forward failed; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// 5005 for a call that reached the tool but whose outcome could not be made durable: the answer is
/// withheld and the claim stays PENDING for an operator.
fn forwarded_but_unrecorded(error: impl std::fmt::Display) -> Refused {
    let mut refusal = store_refusal(error);
    refusal.error = refusal.error.with_details(json!({"forwarded": true}));
    refusal
}

fn upstream_refusal(err: &UpstreamError) -> Refused {
    let code = match err {
        UpstreamError::NoRoute => Code::NoRouteForTool,
        UpstreamError::Unavailable(_) => Code::UpstreamUnavailable,
        UpstreamError::Timeout(_) => Code::UpstreamTimeout,
        UpstreamError::BadResponse(_) | UpstreamError::InexactNumber(_) => {
            Code::UpstreamBadResponse
        }
        UpstreamError::TooLarge { .. } => Code::ResponseTooLarge,
    };
    refuse(code, err.for_agent())
}

/// A COMMITTED claim: the stored answer with this caller's id, held to today's response cap.
async fn skip(
    gw: &Gateway,
    sent: &Sent<'_>,
    facts: &CallFacts,
    allowed: &Allowed,
    record: &ClaimRecord,
    id: &Value,
) -> Result<Outcome, Refused> {
    let rule = &allowed.rule;
    let cap = allowed.capability().max_response_size;
    let response = claim::skip_answer(record, id, cap).map_err(|withheld| match withheld {
        Withheld::WasTooLarge { limit } => decided_by(
            refuse(
                Code::ResponseTooLarge,
                format!("the tool's answer was larger than {limit} bytes and was withheld"),
            ),
            rule,
        ),
        Withheld::TooLargeNow { limit } => decided_by(
            refuse(
                Code::ResponseTooLarge,
                format!("the stored answer is larger than this capability's max_response_size ({limit} bytes)"),
            ),
            rule,
        ),
        Withheld::Guarded { kinds } => decided_by(answer_withheld(kinds), rule),
        Withheld::Missing => store_refusal("store holds a committed claim without an answer"),
    })?;
    let recorded = gw
        .audit()
        .record(
            facts
                .event(gw, EventType::ClaimSkipped, sent)
                .decision(Verdict::Allow)
                .rule(serde_json::to_value(rule).unwrap_or(Value::Null)),
        )
        .await
        .map_err(store_refusal)?;
    Ok(success(gw.evidence(), response, facts, &recorded))
}

/// The answer with its signed receipt: section 10's fields and SPEC 14's, `event_seq` the seq of the
/// event that records it.
fn success(evidence: &Evidence, payload: Value, facts: &CallFacts, recorded: &Recorded) -> Outcome {
    let fields = facts.receipt_fields(&recorded.event_id);
    let receipt = evidence.receipt(fields, &facts.statement(None, Some(&payload), recorded));
    Outcome::Success { payload, receipt }
}

/// A refusal after check 8 carries a signed receipt of the event that records it (SPEC 14); one before
/// carries none.
fn with_receipt(
    evidence: &Evidence,
    facts: &CallFacts,
    error: ApiError,
    recorded: &Recorded,
) -> ApiError {
    if !facts.passed_check_8() {
        return error;
    }
    let fields = facts.receipt_fields(&recorded.event_id);
    let receipt = evidence.receipt(fields, &facts.statement(Some(error.code), None, recorded));
    error.with_receipt(receipt)
}

/// Records the refusal's event (SPEC 9.1's table, kept in `error.rs`) durably before it is answered, and
/// returns the refusal to answer (5005 when the event could not be made durable).
async fn record_refusal(
    gw: &Gateway,
    sent: &Sent<'_>,
    facts: &CallFacts,
    refusal: Refusal,
    client: Option<std::net::SocketAddr>,
    started: Instant,
) -> ApiError {
    let code = refusal.error.code;
    let Some(kind) = refusal.event.or(EventType::recording(code)) else {
        return refusal.error;
    };
    // Anyone holding a captured envelope or token can cause a refusal before check 8 passes (1000–1008),
    // so those are recorded at a bounded rate per address (SPEC 9.1 r3); a refusal owed a receipt, after
    // check 8, is never left without its event.
    if !facts.passed_check_8() && !gw.audit().admit_unauthenticated(client) {
        metrics::counter!("sealgate_decisions_total", "decision" => "deny", "code" => code.number().to_string())
            .increment(1);
        return refusal.error;
    }
    let mut event = facts
        .event(gw, kind, sent)
        .code(code.number())
        .detail(&refusal.error.message)
        .duration_ms(started.elapsed().as_millis() as u64);
    if let Some(rule) = &refusal.rule {
        event = event.rule(serde_json::to_value(rule).unwrap_or(Value::Null));
    }
    // A failure after authorisation is not a second decision: only refusals say "deny".
    if kind != EventType::ToolCallFailed {
        event = event.decision(Verdict::Deny);
    }
    if !facts.forwarded {
        return match gw.audit().record(event).await {
            Ok(recorded) => with_receipt(gw.evidence(), facts, refusal.error, &recorded),
            Err(e) => ApiError::store(e),
        };
    }
    if code == Code::StoreUnavailable {
        // The store was already retried for `store_retry_secs` after the forward: one more try, and
        // the answer stays the 5005 that says the call was forwarded.
        return match gw.audit().record(event).await {
            Ok(recorded) => with_receipt(gw.evidence(), facts, refusal.error, &recorded),
            Err(_) => refusal.error,
        };
    }
    match retry_after_forward(gw, || gw.audit().record(event.clone())).await {
        Ok(recorded) => with_receipt(gw.evidence(), facts, refusal.error, &recorded),
        Err(e) => forwarded_but_unrecorded(e).error,
    }
}

/// `tools/list`: the routed tools this session could ever be allowed to call. No claim; audited like a call.
async fn list_tools(
    gw: &Gateway,
    sent: &Sent<'_>,
    facts: &mut CallFacts,
    context: Option<Arc<SecurityContext>>,
    session: &LiveSession,
    id: Value,
) -> Result<Outcome, Refused> {
    facts.tool = Some(LIST_TOOLS.into());
    facts.claim = Some("NONE");
    let Some(context) = context else {
        return Err(missing_context());
    };
    write_replay_record(gw, facts).await?;
    gw.audit()
        .record_deferred(
            facts
                .event(gw, EventType::ToolCallAuthorized, sent)
                .decision(Verdict::Allow),
        )
        .await
        .map_err(store_refusal)?;
    let started = Instant::now();
    let listed = gw.listed_tools().await; // SPEC 18: withheld tools left out
    let tools: Vec<Value> = listed
        .tools
        .into_iter()
        .filter(|tool| {
            tool.get("name")
                .and_then(Value::as_str)
                .is_some_and(|name| policy::could_allow(Some(&context), &session.patterns, name))
        })
        .collect();
    // The list is not whole: whoever reads it is told, not only the log (SPEC 20 r11), of the upstreams
    // whose tools it could ever call.
    let warnings: Vec<String> = listed
        .left_out
        .into_iter()
        .filter(|left_out| {
            policy::could_allow_within(Some(&context), &session.patterns, &left_out.upstream)
        })
        .map(|left_out| left_out.warning)
        .collect();
    let mut result = json!({"tools": tools});
    if !warnings.is_empty() {
        result["_meta"] = json!({ crate::tool_meta::WARNINGS_KEY: warnings });
    }
    let response = json!({"jsonrpc": "2.0", "id": id, "result": result});
    let recorded = gw
        .audit()
        .record(
            facts
                .event(gw, EventType::ToolCallCompleted, sent)
                .decision(Verdict::Allow)
                .duration_ms(started.elapsed().as_millis() as u64),
        )
        .await
        .map_err(store_refusal)?;
    Ok(success(gw.evidence(), response, facts, &recorded))
}
