//! What the embedded store keeps only in memory — replay records (SPEC 3 check 8) and rate windows (SPEC
//! 6.3) — is rebuilt at start-up from the last window of the audit chain (issue 20). The chain holds it
//! already: every event after check 7 carries the envelope's `signature` and `envelope_timestamp`, and the
//! event of every call that a capability charged carries that capability's `rule`.

use serde_json::Value;

use crate::policy::model::identity as capability_identity;
use crate::policy::rate;
use crate::policy::ContextRegistry;
use crate::store::{Recovered, SeenSignature, Store, StoreResult};
use crate::window::SlidingWindow;

/// Events read per round trip while walking back through the chain.
const PAGE: usize = 512;

/// What was taken back, for the start-up log line.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Restored {
    pub events_read: usize,
    pub signatures: usize,
    pub rate_admissions: usize,
}

/// Walks the chain back from its head over the last replay window and the longest rate window of the
/// loaded contexts, and hands the store what those events say. Nothing happens for a store that keeps
/// both durably.
pub async fn restore(
    store: &dyn Store,
    contexts: &ContextRegistry,
    skew_secs: i64,
    now_ms: i64,
) -> StoreResult<Restored> {
    if !store.restores_from_chain() {
        return Ok(Restored::default());
    }
    let since_ms = now_ms.saturating_sub(horizon_ms(contexts, skew_secs));
    let mut recovered = Recovered::default();
    let mut events_read = 0;
    let mut before = None;
    'walk: loop {
        let page = store.events_newest_first(before, PAGE).await?;
        let last_page = page.len() < PAGE;
        for event in &page {
            before = event.get("seq").and_then(Value::as_u64);
            let Some(at_ms) = event_time_ms(event) else {
                continue;
            };
            if at_ms < since_ms {
                break 'walk;
            }
            events_read += 1;
            if let Some(seen) = replay_record(event, skew_secs, now_ms) {
                recovered.signatures.push(seen);
            }
            if let Some(admission) = rate_admission(event, contexts, at_ms) {
                recovered.rate_admissions.push(admission);
            }
        }
        if last_page || before.is_none() {
            break;
        }
    }
    recovered.rate_admissions.reverse();
    let restored = Restored {
        events_read,
        signatures: recovered.signatures.len(),
        rate_admissions: recovered.rate_admissions.len(),
    };
    store.restore(recovered);
    Ok(restored)
}

/// Whether [`restore`] would take something from `event` at `now_ms`: it lies in the last replay window,
/// or it is a charge of a rate window still open. Retention keeps such events (SPEC 20 rule 1).
pub fn still_needed(
    event: &Value,
    contexts: &ContextRegistry,
    skew_secs: i64,
    now_ms: i64,
) -> bool {
    let Some(at_ms) = event_time_ms(event) else {
        return false;
    };
    at_ms >= now_ms.saturating_sub(replay_horizon_ms(skew_secs))
        || rate_admission(event, contexts, at_ms)
            .is_some_and(|(_, window, _)| window.holds(at_ms, now_ms))
}

fn horizon_ms(contexts: &ContextRegistry, skew_secs: i64) -> i64 {
    replay_horizon_ms(skew_secs).max(longest_rate_window_ms(contexts))
}

/// An envelope accepted at `at` carries a timestamp no older than `at - skew`, so its replay record
/// lasts until at most `at + 2 skew`.
fn replay_horizon_ms(skew_secs: i64) -> i64 {
    skew_secs
        .saturating_mul(2)
        .saturating_add(1)
        .saturating_mul(1000)
}

fn longest_rate_window_ms(contexts: &ContextRegistry) -> i64 {
    contexts
        .list()
        .iter()
        .flat_map(|context| context.capabilities.iter())
        .filter_map(|capability| capability.rate_limit)
        .map(|limit| i64::from(limit.per_seconds.get()) * 1000)
        .max()
        .unwrap_or(0)
}

fn event_time_ms(event: &Value) -> Option<i64> {
    let at = event.get("at").and_then(Value::as_str)?;
    chrono::DateTime::parse_from_rfc3339(at)
        .ok()
        .map(|t| t.timestamp_millis())
}

fn code(event: &Value) -> Option<u64> {
    event.get("code").and_then(Value::as_u64)
}

/// The replay record of an event whose envelope passed check 7 (no code, or a refusal from check 8 on),
/// while its window lasts.
fn replay_record(event: &Value, skew_secs: i64, now_ms: i64) -> Option<SeenSignature> {
    if code(event).is_some_and(|code| code < 1007) {
        return None;
    }
    let text = event.get("signature").and_then(Value::as_str)?;
    let signature = crate::envelope::decode_signature(text).ok()?.to_bytes();
    let timestamp = event.get("envelope_timestamp").and_then(Value::as_i64)?;
    let expires_at_ms = crate::store::replay_record_expiry_ms(timestamp, skew_secs);
    (expires_at_ms > now_ms).then_some(SeenSignature {
        signature,
        expires_at_ms,
    })
}

/// The rate charge an event records: a call that a capability allowed and charged, which the pipeline
/// answers with exactly one of these events (a call refused before its charge — 2002–2005, 2008 — or a
/// repeat that waits for its pending approval is not charged).
fn rate_admission(
    event: &Value,
    contexts: &ContextRegistry,
    at_ms: i64,
) -> Option<(String, SlidingWindow, i64)> {
    let rule = event.get("rule")?;
    if rule.get("kind").and_then(Value::as_str) != Some("capability") {
        return None;
    }
    // A forwarded call's ToolCallFailed follows its ToolCallAuthorized and carries no rule; one with a
    // rule is a SKIP whose stored answer was withheld (2007).
    let charged = match event.get("type").and_then(Value::as_str)? {
        "ToolCallAuthorized" | "ClaimSkipped" | "ClaimBlocked" | "ApprovalRequested"
        | "ToolCallFailed" => true,
        "PolicyViolationBlocked" => code(event) == Some(4004),
        _ => false,
    };
    if !charged {
        return None;
    }
    // The capability by what names it, not by its place: the file may have been edited since.
    let identity = capability_identity(
        rule.get("id").and_then(Value::as_str),
        rule.get("pattern").and_then(Value::as_str)?,
    );
    let session = event.get("session_id").and_then(Value::as_str)?;
    let context_name = event.get("scp").and_then(Value::as_str)?;
    let context = contexts.get(context_name)?;
    let limit = context
        .capabilities
        .iter()
        .find(|capability| capability.identity() == identity)?
        .rate_limit?;
    Some((
        rate::cell_key(session, context_name, &identity),
        SlidingWindow::from(limit),
        at_ms,
    ))
}
