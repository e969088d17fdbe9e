//! The one path every tool call travels (SPEC section 3), top to bottom in one function so that the order
//! of the security checks can be read in one place: parse → token → session → signature → window and
//! replay → binding → policy → rate and budget → claim → forward → settle → reply. Every step that
//! decides writes its audit event before the response leaves.

use std::sync::Arc;
use std::time::Instant;

use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

use crate::audit::{AuditEvent, Decision as Verdict, EventType};
use crate::claim::{self, Taken};
use crate::clock;
use crate::envelope::{self, Call, Envelope, SessionKey};
use crate::error::{ApiError, Code};
use crate::gateway::Gateway;
use crate::policy::{self, Decision, Pattern, SecurityContext};
use crate::session;
use crate::store::{ClaimOutcome, ClaimRecord, SessionRecord};
use crate::token::{AgentClaims, TokenError};
use crate::upstream::UpstreamError;

/// A refusal with the audit event type that records it (SPEC 9.1's table).
struct Refusal {
    error: ApiError,
    event: EventType,
    rule: Option<policy::Rule>,
}

/// Refusals travel boxed: the happy path's `Result` stays small.
type Refused = Box<Refusal>;

impl Refusal {
    fn new(code: Code, message: impl Into<String>) -> Refused {
        let event = match code.number() {
            1001 | 1002 => EventType::SignatureVerificationFailed,
            1003 => EventType::SecurityTokenExpired,
            2000..=2006 | 2008 => EventType::PolicyViolationBlocked,
            4001 => EventType::ClaimBlocked,
            2007 | 5001..=5005 => EventType::ToolCallFailed,
            _ => EventType::EnvelopeRejected,
        };
        Box::new(Refusal {
            error: ApiError::new(code, message),
            event,
            rule: None,
        })
    }
}

/// What the audit events of one call share, filled in as the checks learn it.
#[derive(Default)]
struct CallFacts {
    /// hex(SHA-256(JCS(payload))), computed once per call.
    payload_sha256: String,
    session_id: Option<String>,
    claims: Option<Arc<AgentClaims>>,
    tool: Option<String>,
    context_version: Option<String>,
    request_id: Option<String>,
    claim: Option<&'static str>,
    action_ref: Option<String>,
    claimed_at: Option<String>,
}

impl CallFacts {
    fn event(&self, gw: &Gateway, kind: EventType, env: &Envelope) -> AuditEvent {
        let mut event = AuditEvent::new(kind)
            .signature(&env.signature)
            .envelope_timestamp(env.timestamp)
            .payload_sha256(&self.payload_sha256);
        if let Some(claims) = &self.claims {
            event = event
                .sub(&claims.sub)
                .scp(&claims.scp)
                .jti(&claims.jti)
                .session_id(&claims.exec_id);
            if let Some(wid) = &claims.wid {
                event = event.wid(wid);
            }
        }
        if let Some(session_id) = &self.session_id {
            event = event.session_id(session_id);
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
        if gw.config.audit.include_payloads {
            event = event.payload(env.payload.clone());
        }
        event
    }
}

/// `POST /v1/invoke`: the whole path of one call. `body` has already been read within the size limit.
pub async fn invoke(gw: &Gateway, body: &[u8], client: Option<std::net::SocketAddr>) -> Response {
    let started = Instant::now();
    // Check 1: a body that is not an envelope at all gets one rate-limited event with no content.
    let env = match envelope::parse_envelope(body) {
        Ok(env) => env,
        Err(e) => {
            gw.audit.record_unreadable(client, body.len());
            return ApiError::new(Code::MalformedEnvelope, e.to_string()).into_response();
        }
    };
    // Check 6's message, built once: its payload bytes also give the audit's payload_sha256.
    let (message, payload) = env.canonical_message_with_payload();
    let mut facts = CallFacts {
        payload_sha256: envelope::sha256_hex(&message[payload]),
        ..CallFacts::default()
    };
    match run_checks(gw, &env, &message, &mut facts, started).await {
        Ok(response) => response,
        Err(refusal) => {
            let mut event = facts
                .event(gw, refusal.event, &env)
                .code(refusal.error.code.number())
                .detail(&refusal.error.message)
                .duration_ms(started.elapsed().as_millis() as u64);
            if let Some(rule) = &refusal.rule {
                event = event.rule(serde_json::to_value(rule).unwrap_or(Value::Null));
            }
            // A failure after authorisation is not a second decision: only refusals say "deny".
            if refusal.event != EventType::ToolCallFailed {
                event = event.decision(Verdict::Deny);
            }
            match gw.record(event).await {
                Ok(_) => refusal.error.into_response(),
                Err(store_error) => store_error.into_response(),
            }
        }
    }
}

/// Checks 2–9, the policy, the claim and the forward. Refusals come back as `Err` and are audited by the caller.
async fn run_checks(
    gw: &Gateway,
    env: &Envelope,
    message: &[u8],
    facts: &mut CallFacts,
    started: Instant,
) -> Result<Response, Refused> {
    let now = clock::now_secs();

    // Checks 2–4: the token decodes, verifies with a pinned key, and is current.
    let claims = gw
        .agent_tokens
        .verify(&env.security_token, now)
        .map_err(|e| match e {
            TokenError::Invalid(m) => Refusal::new(Code::TokenVerificationFailed, m),
            TokenError::Expired(m) => Refusal::new(Code::TokenExpired, m),
        })?;
    facts.claims = Some(claims.clone());

    // Check 5: a live session for the token's execution.
    let exec_id = claims.exec_id.clone();
    let session = gw
        .with_store(move |s| s.session_get(&exec_id))
        .await
        .map_err(store_refusal)?
        .ok_or_else(|| {
            Refusal::new(
                Code::SessionNotFound,
                format!("no session {:?}", claims.exec_id),
            )
        })?;
    facts.session_id = Some(session.session_id.clone());
    if session.revoked_at_ms.is_some() {
        return Err(Refusal::new(
            Code::SessionInactive,
            "the session has been revoked",
        ));
    }
    if now >= session.expires_at {
        return Err(Refusal::new(
            Code::SessionInactive,
            "the session has expired",
        ));
    }

    // Checks 6–7: the canonical message (built by the caller), and the signature under the session's key.
    let signature = envelope::decode_signature(&env.signature)
        .map_err(|e| Refusal::new(Code::InvalidSignature, e.to_string()))?;
    let key = session_key(&session)?;
    key.verify(message, &signature).map_err(|_| {
        Refusal::new(
            Code::SignatureVerificationFailed,
            "the signature does not verify under the session key",
        )
    })?;

    // Check 8: freshness, then replay. A verified signature is remembered for as long as its timestamp
    // could still fall inside the window, whatever this envelope's outcome.
    let skew = gw.config.limits.max_clock_skew_secs;
    let window_end_ms = env
        .timestamp
        .saturating_add(skew)
        .saturating_add(1)
        .saturating_mul(1000);
    let first_use = if window_end_ms > clock::now_millis() {
        let sig = signature.to_bytes();
        gw.with_store(move |s| s.remember_signature(&sig, window_end_ms))
            .await
            .map_err(store_refusal)?
    } else {
        true
    };
    if now.saturating_sub(env.timestamp).abs() > skew {
        return Err(Refusal::new(
            Code::TimestampOutOfWindow,
            format!(
                "timestamp {} is more than {skew} s from the gateway's clock",
                env.timestamp
            ),
        ));
    }
    if !first_use {
        return Err(Refusal::new(
            Code::EnvelopeReplayed,
            "this envelope's signature was seen before",
        ));
    }

    // Check 9: the token is bound to this session.
    if claims.scp != session.security_context {
        return Err(Refusal::new(
            Code::AttestationScopeMismatch,
            format!(
                "token scope {:?} is not the session's context {:?}",
                claims.scp, session.security_context
            ),
        ));
    }
    if session
        .agent_id
        .as_ref()
        .is_some_and(|agent| *agent != claims.sub)
    {
        return Err(Refusal::new(
            Code::TokenVerificationFailed,
            "token sub is not the session's agent",
        ));
    }
    if let Some(wid) = &claims.wid {
        let container_differs = env.container_id.as_ref().is_some_and(|c| c != wid);
        let workload_differs = session.workload_id.as_ref().is_some_and(|w| w != wid);
        if container_differs || workload_differs {
            return Err(Refusal::new(
                Code::TokenVerificationFailed,
                "token wid does not match the workload",
            ));
        }
    }
    let call =
        envelope::parse_call(&env.payload).map_err(|m| Refusal::new(Code::MalformedEnvelope, m))?;

    let context = gw.contexts.get(&session.security_context);
    facts.context_version = context.as_ref().map(|c| c.version.clone());
    let patterns: Vec<Pattern> = session
        .allowed_tool_patterns
        .iter()
        .filter_map(|p| Pattern::parse(p).ok())
        .collect();
    let (id, tool, arguments, idempotency_key) = match call {
        Call::ToolsList { id } => {
            return list_tools(gw, env, facts, context.as_deref(), &patterns, id, started).await;
        }
        Call::ToolsCall {
            id,
            tool,
            arguments,
            idempotency_key,
        } => (id, tool, arguments, idempotency_key),
    };
    let tool_name = tool.as_str().to_string();
    facts.tool = Some(tool_name.clone());

    // The policy (SPEC 6.3): deny list, first matching capability and its argument checks.
    let (capability_index, rule) =
        match policy::decide(context.as_deref(), &patterns, &tool_name, &arguments) {
            Decision::Allow { capability, rule } => (capability, rule),
            Decision::Deny {
                code,
                rule,
                message,
            } => {
                let mut refusal = Refusal::new(code, message);
                refusal.rule = Some(rule);
                return Err(refusal);
            }
        };
    let Some(context) = context else {
        return Err(missing_context());
    };
    let Some(capability) = context.capabilities.get(capability_index) else {
        let mut refusal = Refusal::new(Code::NoMatchingCapability, "no capability matches");
        refusal.rule = Some(rule);
        return Err(refusal);
    };

    // Rate limit, then budget: both count only calls the policy allowed.
    charge_rate_and_budget(gw, &session, &context, capability_index, capability)
        .await
        .map_err(|mut r| {
            r.rule = Some(rule.clone());
            r
        })?;

    if !gw.upstreams.has_route(&tool_name) {
        return Err(Refusal::new(
            Code::NoRouteForTool,
            format!("no upstream serves {tool_name:?}"),
        ));
    }

    // The claim: durably PENDING before one byte goes to the tool.
    let request_id = claim::request_id(
        capability.claim,
        &claims.sub,
        &claims.exec_id,
        &tool_name,
        &arguments,
        idempotency_key.as_deref(),
    );
    let pending = match request_id {
        None => {
            facts.claim = Some("NONE");
            None
        }
        Some(request_id) => {
            let record = claim::new_pending(
                &request_id,
                &tool_name,
                &claims.sub,
                Some(&session.session_id),
            );
            let taken = gw
                .with_store(move |s| claim::take(s, record))
                .await
                .map_err(store_refusal)?;
            match taken {
                Taken::Proceed(record) => {
                    note_claim(facts, &record, "PROCEED");
                    Some(record)
                }
                Taken::Pending(record) => {
                    note_claim(facts, &record, "PENDING");
                    return Err(Refusal::new(
                        Code::ClaimPending,
                        "this call is already in flight or its outcome is unknown",
                    ));
                }
                Taken::Skip(record) => {
                    note_claim(facts, &record, "SKIP");
                    return skip(gw, env, facts, &context, &record, &id).await;
                }
            }
        }
    };

    let authorized = gw
        .record(
            facts
                .event(gw, EventType::ToolCallAuthorized, env)
                .decision(Verdict::Allow)
                .rule(serde_json::to_value(&rule).unwrap_or(Value::Null)),
        )
        .await;
    if let Err(e) = authorized {
        // Nothing was sent: give the claim back so that a retry is not blocked by 4001 forever.
        if let Some(pending) = pending {
            let _ = gw.with_store(move |s| claim::release(s, &pending)).await;
        }
        return Err(store_refusal(e));
    }

    // Forward, then settle the claim by what happened (SPEC 7.2).
    let forwarded = Instant::now();
    let outcome = gw
        .upstreams
        .call(&tool_name, &id, &arguments, capability.max_response_size)
        .await;
    metrics::histogram!("sealgate_upstream_duration_seconds", "upstream" => tool.upstream().to_string())
        .record(forwarded.elapsed().as_secs_f64());
    let response = match outcome {
        Ok(response) => response,
        Err(err) => {
            let (code, message) = upstream_failure(&err);
            if let Some(pending) = pending {
                match &err {
                    UpstreamError::Unavailable(_) | UpstreamError::NoRoute => {
                        gw.with_store(move |s| claim::release(s, &pending))
                            .await
                            .map_err(store_refusal)?;
                    }
                    UpstreamError::TooLarge { limit } => {
                        let limit = *limit;
                        gw.with_store(move |s| {
                            claim::commit(s, &pending, ClaimOutcome::ResponseTooLarge { limit })
                        })
                        .await
                        .map_err(store_refusal)?;
                    }
                    // Sent, outcome unknown: the claim stays PENDING until an operator resolves it.
                    UpstreamError::Timeout(_) | UpstreamError::BadResponse(_) => {}
                }
            }
            return Err(Refusal::new(code, message));
        }
    };
    if let Some(pending) = pending {
        let answer = ClaimOutcome::Answer {
            response: response.clone(),
        };
        gw.with_store(move |s| claim::commit(s, &pending, answer))
            .await
            .map_err(store_refusal)?;
    }
    let mut completed = facts
        .event(gw, EventType::ToolCallCompleted, env)
        .decision(Verdict::Allow)
        .duration_ms(started.elapsed().as_millis() as u64);
    if gw.config.audit.include_payloads {
        completed = completed.result(response.clone());
    }
    let recorded = gw.record(completed).await.map_err(store_refusal)?;
    Ok(success(response, facts, &context, &recorded.event_id))
}

/// 2000 for a session whose context is gone (deleted since registration).
fn missing_context() -> Refused {
    let mut refusal = Refusal::new(
        Code::ToolNotAllowed,
        "the session's security context does not exist",
    );
    refusal.rule = Some(policy::Rule {
        kind: policy::RuleKind::NoMatch,
        index: None,
        pattern: None,
    });
    refusal
}

fn store_refusal(error: ApiError) -> Refused {
    Refusal::new(Code::StoreUnavailable, error.message)
}

fn session_key(session: &SessionRecord) -> Result<SessionKey, Refused> {
    use base64::Engine;
    let encoded = session
        .public_key
        .as_deref()
        .ok_or_else(|| Refusal::new(Code::SessionInactive, "the session's key has been erased"))?;
    let bytes: [u8; 32] = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| Refusal::new(Code::StoreUnavailable, "stored session key is corrupt"))?;
    SessionKey::from_bytes(&bytes).map_err(|e| Refusal::new(Code::StoreUnavailable, e))
}

fn note_claim(facts: &mut CallFacts, record: &ClaimRecord, outcome: &'static str) {
    facts.request_id = Some(record.request_id.clone());
    facts.action_ref = Some(record.action_ref.clone());
    facts.claimed_at = Some(record.claimed_at.clone());
    facts.claim = Some(outcome);
}

/// Charges the capability's rate limit (GCRA in the store) and the session's call budget.
async fn charge_rate_and_budget(
    gw: &Gateway,
    session: &SessionRecord,
    context: &SecurityContext,
    capability_index: usize,
    capability: &policy::Capability,
) -> Result<(), Refused> {
    let rate = capability.rate_limit.map(|limit| {
        (
            format!(
                "rate\0{}\0{}\0{}",
                session.session_id, context.spec.name, capability_index
            ),
            policy::rate::Gcra::new(limit.calls.get(), limit.per_seconds.get()),
        )
    });
    let budget = session
        .max_calls
        .map(|max| (session::budget_key(&session.session_id), max));
    let now_ms = clock::now_millis();
    let verdict = gw
        .with_store(move |s| {
            if let Some((key, gcra)) = &rate {
                let mut retry_after_ms = 0;
                let charged = s.counter_update(key, &mut |tat| match gcra.admit(tat, now_ms) {
                    Ok(next) => Some(next),
                    Err(wait) => {
                        retry_after_ms = wait;
                        None
                    }
                })?;
                if charged.is_none() {
                    return Ok(Err((Code::RateLimitExceeded, retry_after_ms)));
                }
            }
            if let Some((key, max)) = &budget {
                let max = i64::try_from(*max).unwrap_or(i64::MAX);
                let counted = s.counter_update(key, &mut |n| {
                    let n = n.unwrap_or(0);
                    (n < max).then_some(n + 1)
                })?;
                if counted.is_none() {
                    // The budget refused the call, so the rate limit must not count it either.
                    if let Some((key, gcra)) = &rate {
                        s.counter_update(key, &mut |tat| tat.map(|t| gcra.refund(t)))?;
                    }
                    return Ok(Err((Code::BudgetExhausted, 0)));
                }
            }
            Ok(Ok(()))
        })
        .await
        .map_err(store_refusal)?;
    match verdict {
        Ok(()) => Ok(()),
        Err((Code::RateLimitExceeded, wait_ms)) => {
            let secs = (wait_ms as u64).div_ceil(1000).max(1);
            let mut refusal = Refusal::new(
                Code::RateLimitExceeded,
                format!("rate limit of capability {capability_index} exceeded; retry in {secs} s"),
            );
            refusal.error = refusal.error.with_retry_after(secs);
            Err(refusal)
        }
        Err((code, _)) => Err(Refusal::new(code, "the session's call budget is used up")),
    }
}

fn upstream_failure(err: &UpstreamError) -> (Code, String) {
    let code = match err {
        UpstreamError::NoRoute => Code::NoRouteForTool,
        UpstreamError::Unavailable(_) => Code::UpstreamUnavailable,
        UpstreamError::Timeout(_) => Code::UpstreamTimeout,
        UpstreamError::BadResponse(_) => Code::UpstreamBadResponse,
        UpstreamError::TooLarge { .. } => Code::ResponseTooLarge,
    };
    (code, err.to_string())
}

/// A COMMITTED claim: the stored answer with this caller's id, or 2007 again for a withheld answer.
async fn skip(
    gw: &Gateway,
    env: &Envelope,
    facts: &CallFacts,
    context: &SecurityContext,
    record: &ClaimRecord,
    id: &Value,
) -> Result<Response, Refused> {
    let response = match &record.outcome {
        Some(ClaimOutcome::Answer { response }) => with_id(response.clone(), id),
        Some(ClaimOutcome::Settled { result }) => with_id(result.clone(), id),
        Some(ClaimOutcome::ResponseTooLarge { limit }) => {
            return Err(Refusal::new(
                Code::ResponseTooLarge,
                format!("the tool's answer was larger than {limit} bytes and was withheld"),
            ));
        }
        None => {
            return Err(Refusal::new(
                Code::StoreUnavailable,
                "committed claim without an outcome",
            ));
        }
    };
    let recorded = gw
        .record(
            facts
                .event(gw, EventType::ClaimSkipped, env)
                .decision(Verdict::Allow),
        )
        .await
        .map_err(store_refusal)?;
    Ok(success(response, facts, context, &recorded.event_id))
}

/// The answer returned to the agent carries the caller's JSON-RPC id.
fn with_id(mut response: Value, id: &Value) -> Value {
    if let Some(obj) = response.as_object_mut() {
        obj.insert("id".into(), id.clone());
        obj.entry("jsonrpc").or_insert_with(|| json!("2.0"));
    }
    response
}

fn success(
    payload: Value,
    facts: &CallFacts,
    context: &SecurityContext,
    event_id: &str,
) -> Response {
    let mut receipt = Map::new();
    if let Some(request_id) = &facts.request_id {
        receipt.insert("request_id".into(), json!(request_id));
    }
    receipt.insert("claim".into(), json!(facts.claim.unwrap_or("NONE")));
    if let Some(action_ref) = &facts.action_ref {
        receipt.insert("action_ref".into(), json!(action_ref));
    }
    if let Some(claimed_at) = &facts.claimed_at {
        receipt.insert("claimed_at".into(), json!(claimed_at));
    }
    receipt.insert("event_id".into(), json!(event_id));
    receipt.insert("context".into(), json!(context.spec.name));
    receipt.insert("context_version".into(), json!(context.version));
    axum::Json(json!({
        "protocol": "seal/v1",
        "status": "success",
        "payload": payload,
        "receipt": receipt,
    }))
    .into_response()
}

/// `tools/list`: the routed tools this session could ever be allowed to call. No claim; audited like a call.
async fn list_tools(
    gw: &Gateway,
    env: &Envelope,
    facts: &mut CallFacts,
    context: Option<&SecurityContext>,
    patterns: &[Pattern],
    id: Value,
    started: Instant,
) -> Result<Response, Refused> {
    facts.tool = Some("tools/list".into());
    facts.claim = Some("NONE");
    let Some(context) = context else {
        return Err(missing_context());
    };
    gw.record(
        facts
            .event(gw, EventType::ToolCallAuthorized, env)
            .decision(Verdict::Allow),
    )
    .await
    .map_err(store_refusal)?;
    let tools: Vec<Value> = gw
        .upstreams
        .list_tools()
        .await
        .into_iter()
        .filter(|tool| {
            tool.get("name")
                .and_then(Value::as_str)
                .is_some_and(|name| policy::could_allow(Some(context), patterns, name))
        })
        .collect();
    let response = json!({"jsonrpc": "2.0", "id": id, "result": {"tools": tools}});
    let recorded = gw
        .record(
            facts
                .event(gw, EventType::ToolCallCompleted, env)
                .decision(Verdict::Allow)
                .duration_ms(started.elapsed().as_millis() as u64),
        )
        .await
        .map_err(store_refusal)?;
    Ok(success(response, facts, context, &recorded.event_id))
}
