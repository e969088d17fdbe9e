//! Retention (SPEC 12 r3), on both stores: audit events older than `retention.audit_days` are written to
//! `archive_dir` as `audit-FIRST-LAST.jsonl`, synced, and only then removed from the store, so the chain
//! goes on unbroken across the archives and the store; settled claims and decided approval requests older
//! than `retention.claims_days` are removed. With both null (the default) nothing runs.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

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
}

impl Retention {
    /// None when nothing is to be removed.
    pub fn from_config(
        config: &RetentionConfig,
        archive_dir: PathBuf,
        replica: &str,
    ) -> Option<Self> {
        let ms = |days: Option<f64>| days.map(|days| (days * DAY_MS) as i64);
        let retention = Retention {
            audit_ms: ms(config.audit_days),
            claims_ms: ms(config.claims_days),
            archive_dir,
            replica: replica.to_owned(),
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
        let archived =
            archive_events(store.as_ref(), &retention.archive_dir, now - keep_ms).await?;
        if archived > 0 {
            tracing::info!(events = archived, dir = %retention.archive_dir.display(), "audit events archived and removed from the store");
        }
    }
    if let Some(keep_ms) = retention.claims_ms {
        let (claims, approvals) = store
            .settled_remove_before(now - keep_ms)
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
/// store once the file is synced. The newest event always stays: it is the chain's head.
async fn archive_events(store: &dyn Store, dir: &Path, before_ms: i64) -> Result<u64, String> {
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
                seq < newest && event_ms(event).is_some_and(|at| at < before_ms)
            })
            .collect();
        let Some(last) = old
            .last()
            .and_then(|event| event.get("seq"))
            .and_then(Value::as_u64)
        else {
            break;
        };
        write_archive(dir, first, last, &old)?;
        store
            .events_remove_through(last)
            .await
            .map_err(|e| e.to_string())?;
        archived += old.len() as u64;
        metrics::counter!("sealgate_retention_removed_total", "kind" => "audit_event")
            .increment(old.len() as u64);
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

/// Writes `audit-FIRST-LAST.jsonl` whole or not at all: a temporary file, synced, renamed, and the
/// folder synced, so that the file exists with every line before any event leaves the store.
fn write_archive(dir: &Path, first: u64, last: u64, events: &[&Value]) -> Result<(), String> {
    crate::files::private_dir(dir).map_err(|e| format!("retention.archive_dir: {e}"))?;
    remove_unfinished(dir, first)?;
    let path = dir.join(format!("audit-{first}-{last}.jsonl"));
    let partial = dir.join(format!(".audit-{first}-{last}.jsonl.partial"));
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

/// A pass that wrote an archive from `first` and stopped before the store let go of its events leaves a
/// file that the next pass, which starts from `first` again, replaces: archives never overlap.
fn remove_unfinished(dir: &Path, first: u64) -> Result<(), String> {
    let prefix = format!("audit-{first}-");
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            std::fs::remove_file(entry.path())
                .map_err(|e| format!("cannot remove {}: {e}", entry.path().display()))?;
        }
    }
    Ok(())
}
