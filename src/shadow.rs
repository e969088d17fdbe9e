//! Shadow versions of security contexts (SPEC 6.4 r4): a candidate version decides every call under its
//! context beside the version in force, whose decision alone takes effect. This room compares the two,
//! tallies every comparison, and says what a difference is; the pipeline records it.
//!
//! The tallies are counted in memory on the call's path (one short lock, no store round trip) and added
//! to the store's about once a second, so that every replica's calls count in one summary.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use serde::Serialize;
use serde_json::{json, Value};

use crate::policy::{Decision, SecurityContext, Verdict};
use crate::store::{ShadowTally, Store, StoreResult};

/// How often the counts are added to the store's.
pub const FLUSH_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Most distinct rows kept between two flushes; further differing tools are counted under `""` with
/// their decisions, so that an agent calling made-up tools cannot grow memory or the table.
const MAX_PENDING_ROWS: usize = 4096;

/// One side of a comparison, as the `ShadowDecisionDiffered` event shows it.
pub fn side(decision: &Decision, verdict: Verdict, context: Option<&SecurityContext>) -> Value {
    let mut side = match decision {
        Decision::Allow { rule, .. } => json!({"decision": verdict.short(), "rule": rule}),
        Decision::Deny { code, rule, .. } => json!({
            "decision": "deny", "code": code.number(), "name": code.name(), "rule": rule,
        }),
    };
    if let Some(context) = context {
        side["context_version"] = json!(context.version);
    }
    side
}

type Key = (String, String, String, String, String);

/// The comparisons counted since the last flush, and the store they go to.
pub struct Tallies {
    pending: Mutex<HashMap<Key, (u64, i64)>>,
    /// One flush at a time, so that a summary taken after a flush has every count made before it.
    flushing: tokio::sync::Mutex<()>,
    store: Arc<dyn Store>,
}

impl Tallies {
    pub fn new(store: Arc<dyn Store>) -> Tallies {
        Tallies {
            pending: Mutex::new(HashMap::new()),
            flushing: tokio::sync::Mutex::new(()),
            store,
        }
    }

    /// Counts one call that `shadow` decided beside the version in force. Calls decided alike are counted
    /// without their tool.
    pub fn count(
        &self,
        shadow: &SecurityContext,
        tool: &str,
        (live, shadowed): (Verdict, Verdict),
        at_ms: i64,
    ) {
        let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let differing = live != shadowed && pending.len() < MAX_PENDING_ROWS;
        let key = (
            shadow.name().to_owned(),
            shadow.version.clone(),
            if differing { tool } else { "" }.to_owned(),
            live.short(),
            shadowed.short(),
        );
        let entry = pending.entry(key).or_insert((0, at_ms));
        entry.0 += 1;
        entry.1 = entry.1.min(at_ms);
    }

    /// Adds the counts made since the last flush to the store's. Counts that could not be written are
    /// kept for the next flush.
    pub async fn flush(&self) -> StoreResult<()> {
        let _turn = self.flushing.lock().await;
        let taken =
            std::mem::take(&mut *self.pending.lock().unwrap_or_else(PoisonError::into_inner));
        if taken.is_empty() {
            return Ok(());
        }
        let rows: Vec<ShadowTally> = taken
            .iter()
            .map(
                |((context, version, tool, live, shadow), (calls, first_at_ms))| ShadowTally {
                    context: context.clone(),
                    version: version.clone(),
                    tool: tool.clone(),
                    live: live.clone(),
                    shadow: shadow.clone(),
                    calls: *calls,
                    first_at_ms: *first_at_ms,
                },
            )
            .collect();
        let written = self.store.shadow_tally_add(&rows).await;
        if written.is_err() {
            let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
            for (key, (calls, first)) in taken {
                let entry = pending.entry(key).or_insert((0, first));
                entry.0 += calls;
                entry.1 = entry.1.min(first);
            }
        }
        written
    }

    /// The summary of one shadow version on every replica, with this replica's latest counts.
    pub async fn summary(&self, shadow: &SecurityContext) -> StoreResult<Summary> {
        self.flush().await?;
        let rows = self
            .store
            .shadow_tallies(shadow.name(), &shadow.version)
            .await?;
        Ok(Summary::of(&rows))
    }
}

/// What a shadow version decided since it was set (SPEC 6.4 r4).
#[derive(Debug, Serialize, PartialEq)]
pub struct Summary {
    /// Calls under the context that the shadow decided too.
    pub calls: u64,
    /// Those whose decisions differed.
    pub differed: u64,
    /// When the first of them was decided (RFC 3339), or null before any call.
    pub first_call_at: Option<String>,
    /// The differences by tool and pair of decisions, most frequent first.
    pub differences: Vec<Difference>,
}

/// How many calls of one tool got `live` from the version in force and `shadow` from the shadow.
#[derive(Debug, Serialize, PartialEq)]
pub struct Difference {
    pub tool: String,
    /// `allow`, `approval`, or the refusal code.
    pub live: String,
    pub shadow: String,
    pub calls: u64,
}

impl Summary {
    fn of(rows: &[ShadowTally]) -> Summary {
        let mut differences: Vec<Difference> = rows
            .iter()
            .filter(|row| row.live != row.shadow)
            .map(|row| Difference {
                tool: row.tool.clone(),
                live: row.live.clone(),
                shadow: row.shadow.clone(),
                calls: row.calls,
            })
            .collect();
        differences.sort_by(|a, b| b.calls.cmp(&a.calls).then_with(|| a.tool.cmp(&b.tool)));
        Summary {
            calls: rows.iter().map(|row| row.calls).sum(),
            differed: differences.iter().map(|d| d.calls).sum(),
            first_call_at: rows
                .iter()
                .map(|row| row.first_at_ms)
                .min()
                .map(crate::clock::rfc3339_millis),
            differences,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{decide, parse_context_json, Pattern};

    fn context() -> SecurityContext {
        parse_context_json(&json!({"name": "c", "capabilities": [
            {"tool_pattern": "pay.*", "approval": {"required": true}},
            {"tool_pattern": "fs.*", "path_allowlist": ["/w"]}]}))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn verdict_of(tool: &str, arguments: Value) -> String {
        let context = context();
        let any = [Pattern::parse("*").unwrap_or_else(|e| panic!("{e}"))];
        let arguments = arguments.as_object().cloned().unwrap_or_default();
        decide(Some(&context), &any, tool, &arguments)
            .verdict(Some(&context))
            .short()
    }

    #[test]
    fn a_verdict_is_allow_approval_or_the_refusal_code() {
        assert_eq!(verdict_of("fs.read", json!({"path": "/w/a"})), "allow");
        assert_eq!(verdict_of("pay.charge", json!({})), "approval");
        assert_eq!(verdict_of("fs.read", json!({"path": "/etc"})), "2002");
        assert_eq!(verdict_of("web.fetch", json!({})), "2006");
    }

    fn row(tool: &str, live: &str, shadow: &str, calls: u64, first_at_ms: i64) -> ShadowTally {
        ShadowTally {
            context: "c".into(),
            version: "v".into(),
            tool: tool.into(),
            live: live.into(),
            shadow: shadow.into(),
            calls,
            first_at_ms,
        }
    }

    #[test]
    fn a_summary_counts_every_call_and_lists_the_differences_most_frequent_first() {
        let summary = Summary::of(&[
            row("", "allow", "allow", 10, 5_000),
            row("fs.read", "allow", "2002", 2, 7_000),
            row("pay.x", "approval", "allow", 3, 6_000),
        ]);
        assert_eq!((summary.calls, summary.differed), (15, 5));
        assert_eq!(
            summary.first_call_at.as_deref(),
            Some("1970-01-01T00:00:05.000Z")
        );
        let tools: Vec<&str> = summary
            .differences
            .iter()
            .map(|d| d.tool.as_str())
            .collect();
        assert_eq!(tools, ["pay.x", "fs.read"]);
        assert_eq!(Summary::of(&[]).first_call_at, None);
    }
}
