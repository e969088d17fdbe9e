//! Retention (SPEC 12 r3), on both stores: audit events older than `retention.audit_days` are written to
//! `archive_dir` as `audit-FIRST-LAST-HASH.jsonl`, synced, and only then removed from the store, so the
//! chain goes on unbroken across the archives and the store; settled claims and decided approval requests
//! older than `retention.claims_days` are removed. With both null (the default) nothing runs.
//!
//! It never removes what the running gateway still needs (SPEC 20 rule 1, [`StillNeeded`]), and it never
//! deletes or rewrites a finished archive: a store restored from an older backup archives beside them.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::policy::ContextRegistry;
use crate::store::{Store, StoreResult};

/// `retention:` in the configuration.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionConfig {
    /// Days an audit event stays in the store before it is archived (fractions allowed); null: for ever.
    pub audit_days: Option<f64>,
    /// Days a settled claim or decided approval request is kept; null: for ever.
    pub claims_days: Option<f64>,
    /// Where archive files go; null: `data_dir/archive`.
    pub archive_dir: Option<PathBuf>,
}

impl RetentionConfig {
    /// Each period, when set, is a positive number of days; the error names the key.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        for (key, days) in [
            ("retention.audit_days", self.audit_days),
            ("retention.claims_days", self.claims_days),
        ] {
            if days.is_some_and(|days| !(days.is_finite() && days > 0.0)) {
                return Err((key, "must be a positive number of days, or null".to_owned()));
            }
        }
        Ok(())
    }
}

/// Events read, archived and removed per archive file.
const EVENTS_PER_FILE: usize = 10_000;

const DAY_MS: f64 = 86_400_000.0;

/// What a running gateway's retention needs.
pub struct Retention {
    pub audit_ms: Option<i64>,
    pub claims_ms: Option<i64>,
    pub archive_dir: PathBuf,
    /// This replica's name: the holder of the retention lease on a shared store.
    pub replica: String,
    pub still_needed: StillNeeded,
}

/// What the running gateway still reads from the store, which retention keeps whatever its periods say
/// (SPEC 20 rule 1). Session labels (SPEC 19) need nothing here: they live in their own table, which
/// retention never touches, so a session keeps them (and the seq that brought each) after its events
/// are archived.
pub struct StillNeeded {
    /// `limits.max_clock_skew_secs`: the replay set is rebuilt from the events of the last clock window.
    pub skew_secs: i64,
    /// The contexts in force (hot reloads included): the charges of every open rate window are events.
    pub contexts: Arc<ContextRegistry>,
}

impl StillNeeded {
    /// Whether a restart at `now_ms` would read something back from `event` (`crate::recovery`).
    fn event(&self, event: &Value, now_ms: i64) -> bool {
        crate::recovery::still_needed(event, &self.contexts, self.skew_secs, now_ms)
    }
}

impl Retention {
    /// None when nothing is to be removed.
    pub fn from_config(
        config: &RetentionConfig,
        archive_dir: PathBuf,
        replica: &str,
        still_needed: StillNeeded,
    ) -> Option<Self> {
        let ms = |days: Option<f64>| days.map(|days| (days * DAY_MS) as i64);
        let retention = Retention {
            audit_ms: ms(config.audit_days),
            claims_ms: ms(config.claims_days),
            archive_dir,
            replica: replica.to_owned(),
            still_needed,
        };
        (retention.audit_ms.is_some() || retention.claims_ms.is_some()).then_some(retention)
    }

    /// How often it runs: a quarter of the shorter period, between 1 s and an hour.
    fn every(&self) -> Duration {
        let shortest = [self.audit_ms, self.claims_ms]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(0);
        Duration::from_millis(u64::try_from(shortest / 4).unwrap_or(0))
            .clamp(Duration::from_secs(1), Duration::from_secs(3600))
    }
}

/// Runs retention every [`Retention::every`] for as long as the store lives.
pub fn spawn(store: Weak<dyn Store>, retention: Retention) {
    tokio::spawn(async move {
        let every = retention.every();
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            let Some(store) = store.upgrade() else { return };
            if let Err(e) = sweep(&store, &retention, every).await {
                tracing::warn!(error = %e, "retention did not finish; it runs again at the next tick");
            }
        }
    });
}

/// One pass: archive and remove old events, then remove old settled records.
pub async fn sweep(
    store: &Arc<dyn Store>,
    retention: &Retention,
    every: Duration,
) -> Result<(), String> {
    let now = crate::clock::now_millis();
    let lease = now
        .saturating_add(2 * every.as_millis() as i64)
        .max(now + 60_000);
    if !store
        .retention_turn(&retention.replica, now, lease)
        .await
        .map_err(|e| e.to_string())?
    {
        return Ok(());
    }
    if let Some(keep_ms) = retention.audit_ms {
        let archived = archive_events(store.as_ref(), retention, now - keep_ms, now).await?;
        if archived > 0 {
            tracing::info!(events = archived, dir = %retention.archive_dir.display(), "audit events archived and removed from the store");
        }
    }
    if let Some(keep_ms) = retention.claims_ms {
        let (claims, approvals) = store
            .settled_remove_before(now - keep_ms, now)
            .await
            .map_err(|e| e.to_string())?;
        if claims + approvals > 0 {
            tracing::info!(
                claims,
                approvals,
                "settled claims and decided approvals removed"
            );
        }
    }
    Ok(())
}

/// Archives, file by file, the events older than `before_ms`, and removes each file's events from the
/// store once the file is synced. The newest event always stays: it is the chain's head; so does every
/// event from the first one that the gateway still needs.
async fn archive_events(
    store: &dyn Store,
    retention: &Retention,
    before_ms: i64,
    now_ms: i64,
) -> Result<u64, String> {
    let dir = retention.archive_dir.as_path();
    let newest = newest_seq(store).await.map_err(|e| e.to_string())?;
    let mut archived = 0;
    while let Some(first) = store.first_seq().await.map_err(|e| e.to_string())? {
        let events = store
            .events_oldest_first(first, EVENTS_PER_FILE)
            .await
            .map_err(|e| e.to_string())?;
        let old: Vec<&Value> = events
            .iter()
            .take_while(|event| {
                let seq = event.get("seq").and_then(Value::as_u64).unwrap_or(u64::MAX);
                seq < newest
                    && event_ms(event).is_some_and(|at| at < before_ms)
                    && !retention.still_needed.event(event, now_ms)
            })
            .collect();
        let Some((last, hash)) = old.last().and_then(|event| seq_and_hash(event)) else {
            break;
        };
        // An earlier pass may have archived some of these and stopped before the store let go of them.
        let (last, count) = match finished_archive(dir, first, &old)? {
            Some(found) => found,
            None => {
                write_archive(dir, &archive_name(first, last, hash), &old)?;
                (last, old.len())
            }
        };
        store
            .events_remove_through(last)
            .await
            .map_err(|e| e.to_string())?;
        archived += count as u64;
        metrics::counter!("sealgate_retention_removed_total", "kind" => "audit_event")
            .increment(count as u64);
    }
    Ok(archived)
}

async fn newest_seq(store: &dyn Store) -> StoreResult<u64> {
    let newest = store.events_newest_first(None, 1).await?;
    Ok(newest
        .first()
        .and_then(|event| event.get("seq"))
        .and_then(Value::as_u64)
        .unwrap_or(0))
}

fn event_ms(event: &Value) -> Option<i64> {
    let at = event.get("at").and_then(Value::as_str)?;
    chrono::DateTime::parse_from_rfc3339(at)
        .ok()
        .map(|t| t.timestamp_millis())
}

fn seq_and_hash(event: &Value) -> Option<(u64, &str)> {
    Some((
        event.get("seq").and_then(Value::as_u64)?,
        event.get("hash").and_then(Value::as_str)?,
    ))
}

/// The name of the archive of the events `first..=last` whose last event's hash is `hash`: a store
/// restored from an older backup goes on with other events under the same seqs, so its archives get
/// other names and land beside the old ones.
fn archive_name(first: u64, last: u64, hash: &str) -> String {
    format!("audit-{first}-{last}-{hash}.jsonl")
}

/// A finished archive in `dir` of the first events of `old` (which start at `first`): its last seq and
/// how many events it holds. The store's event under that seq must carry the hash the name gives, so an
/// archive of another history (before a restore) is never taken for this one.
fn finished_archive(
    dir: &Path,
    first: u64,
    old: &[&Value],
) -> Result<Option<(u64, usize)>, String> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read {}: {e}", dir.display())),
    };
    let names: HashSet<String> = entries
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    Ok(old.iter().enumerate().rev().find_map(|(at, event)| {
        let (seq, hash) = seq_and_hash(event)?;
        names
            .contains(&archive_name(first, seq, hash))
            .then_some((seq, at + 1))
    }))
}

/// Writes the archive `name` whole or not at all: a temporary dot-file (which a pass that stopped half way
/// leaves for the next one to replace), synced, renamed, and the folder synced, so that the file exists
/// with every line before any event leaves the store.
fn write_archive(dir: &Path, name: &str, events: &[&Value]) -> Result<(), String> {
    crate::files::private_dir(dir).map_err(|e| format!("retention.archive_dir: {e}"))?;
    let path = dir.join(name);
    let partial = dir.join(format!(".{name}.partial"));
    let mut text = String::new();
    for event in events {
        text.push_str(&event.to_string());
        text.push('\n');
    }
    std::fs::write(&partial, text)
        .and_then(|()| std::fs::File::open(&partial)?.sync_all())
        .map_err(|e| format!("cannot write {}: {e}", partial.display()))?;
    std::fs::rename(&partial, &path).map_err(|e| {
        format!(
            "cannot rename {} to {}: {e}",
            partial.display(),
            path.display()
        )
    })?;
    crate::files::sync_folder(dir)
}
