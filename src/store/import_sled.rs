//! `sealgate store import-sled DIR`: the upgrade from a release whose embedded store was sled (before SPEC
//! revision 3). Everything durable is copied into a new SQLite store — sessions, claims with their answers,
//! API-managed contexts, approval requests, budget counts and the audit chain, event for event with the
//! same hashes — and the copied chain is verified before the command says ok. Replay records and rate
//! windows are not copied: the gateway rebuilds them from the chain at start-up.
//!
//! This is the only place that still links sled, and it only reads the trees its last release wrote.

use std::path::Path;

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{
    ApprovalRecord, AuditBackend, ChainHead, ClaimRecord, SessionRecord, Shelf, SqliteStore, Store,
    StoredContext, StoredEvent,
};

/// What was copied, for the closing line.
#[derive(Debug, Default)]
struct Copied {
    sessions: usize,
    claims: usize,
    contexts: usize,
    approvals: usize,
    budgets: usize,
    events: u64,
}

/// Audit events copied per append.
const PAGE: usize = 512;

/// Imports `sled_dir` into a new embedded store in `data_dir`.
pub async fn run(data_dir: &Path, sled_dir: &Path) -> Result<String, String> {
    let target = SqliteStore::path_in(data_dir);
    if target.exists() {
        return Err(format!(
            "{} exists already: import into a data_dir that holds no store",
            target.display()
        ));
    }
    if !sled_dir.join("conf").is_file() || !sled_dir.join("db").is_file() {
        return Err(format!(
            "{} is not a sled data folder (no conf and db files)",
            sled_dir.display()
        ));
    }
    // sled has no read-only mode; the earlier release's gateway must be stopped (its lock says so).
    let sled = sled::Config::new()
        .path(sled_dir)
        .open()
        .map_err(|e| format!("cannot open the sled store {}: {e}", sled_dir.display()))?;
    let store = SqliteStore::open(data_dir).map_err(|e| e.to_string())?;
    let copied = copy(&sled, &store).await.map_err(|e| {
        format!(
            "import stopped: {e}; remove {} before trying again",
            target.display()
        )
    })?;
    let head = verify(&store, copied.events).await?;
    Ok(format!(
        "ok: imported {} sessions, {} claims, {} contexts, {} approval requests, {} budget counts and \
         {} audit events into {}; the chain verifies (seq 1..{}, last hash {})",
        copied.sessions,
        copied.claims,
        copied.contexts,
        copied.approvals,
        copied.budgets,
        copied.events,
        target.display(),
        head.seq,
        head.hash
    ))
}

async fn copy(sled: &sled::Db, store: &SqliteStore) -> Result<Copied, String> {
    let mut copied = Copied::default();
    for context in records::<StoredContext>(sled, "contexts")? {
        store
            .context_put(Shelf::Live, &context)
            .await
            .map_err(|e| e.to_string())?;
        copied.contexts += 1;
    }
    for session in records::<SessionRecord>(sled, "sessions")? {
        store
            .session_insert(&session)
            .await
            .map_err(|e| e.to_string())?;
        copied.sessions += 1;
    }
    for claim in records::<ClaimRecord>(sled, "claims")? {
        store
            .claim_insert(&claim)
            .await
            .map_err(|e| e.to_string())?;
        copied.claims += 1;
    }
    copied.approvals = copy_approvals(sled, store).await?;
    copied.budgets = copy_budgets(sled, store).await?;
    copied.events = copy_events(sled, store).await?;
    store.sync().await.map_err(|e| e.to_string())?;
    Ok(copied)
}

/// Every record of a tree, decoded.
fn records<T: DeserializeOwned>(sled: &sled::Db, tree: &str) -> Result<Vec<T>, String> {
    let tree = sled.open_tree(tree).map_err(|e| e.to_string())?;
    tree.iter()
        .map(|entry| {
            let (key, bytes) = entry.map_err(|e| e.to_string())?;
            serde_json::from_slice(&bytes).map_err(|e| {
                format!(
                    "a record of {} does not decode ({}): {e}",
                    String::from_utf8_lossy(&tree.name()),
                    String::from_utf8_lossy(&key)
                )
            })
        })
        .collect()
}

/// Approval requests in the order they were made, so that each call's newest request ends as its
/// current one, as it was.
async fn copy_approvals(sled: &sled::Db, store: &SqliteStore) -> Result<usize, String> {
    let mut approvals = records::<ApprovalRecord>(sled, "approvals")?;
    approvals.sort_by(|a, b| {
        (a.requested_at_ms, &a.approval_id).cmp(&(b.requested_at_ms, &b.approval_id))
    });
    let mut current: std::collections::HashMap<(String, String), String> = Default::default();
    for approval in &approvals {
        let call = (approval.session_id.clone(), approval.call_digest.clone());
        let replacing = current.get(&call).map(String::as_str);
        if !store
            .approval_insert(approval, replacing)
            .await
            .map_err(|e| e.to_string())?
        {
            return Err(format!(
                "approval {} could not be made its call's current request",
                approval.approval_id
            ));
        }
        current.insert(call, approval.approval_id.clone());
    }
    Ok(approvals.len())
}

/// The budget cells (`budget\0SESSION`: the count as 8 big-endian bytes). Rate windows are not copied:
/// they are rebuilt from the chain.
async fn copy_budgets(sled: &sled::Db, store: &SqliteStore) -> Result<usize, String> {
    let counters = sled.open_tree("counters").map_err(|e| e.to_string())?;
    let mut copied = 0;
    for entry in counters.scan_prefix(b"budget\0") {
        let (key, bytes) = entry.map_err(|e| e.to_string())?;
        let count = <[u8; 8]>::try_from(bytes.as_ref())
            .map(i64::from_be_bytes)
            .map_err(|_| "a budget count is not 8 bytes".to_owned())?;
        let key = String::from_utf8(key.to_vec()).map_err(|e| e.to_string())?;
        store
            .import_counter(&key, count)
            .await
            .map_err(|e| e.to_string())?;
        copied += 1;
    }
    Ok(copied)
}

/// The chain, in seq order, event for event.
async fn copy_events(sled: &sled::Db, store: &SqliteStore) -> Result<u64, String> {
    let audit = sled.open_tree("audit").map_err(|e| e.to_string())?;
    let mut head = ChainHead::genesis();
    let mut page = Vec::with_capacity(PAGE);
    let mut copied = 0;
    for entry in audit.iter() {
        let (_, bytes) = entry.map_err(|e| e.to_string())?;
        let event: Value = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
        page.push(StoredEvent::of_value(&event).map_err(|e| e.to_string())?);
        if page.len() == PAGE {
            head = append(store, &head, &mut page).await?;
        }
        copied += 1;
    }
    if !page.is_empty() {
        append(store, &head, &mut page).await?;
    }
    Ok(copied)
}

async fn append(
    store: &SqliteStore,
    head: &ChainHead,
    page: &mut Vec<StoredEvent>,
) -> Result<ChainHead, String> {
    let last = page
        .last()
        .map_or_else(|| head.clone(), |event| event.head.clone());
    store
        .append(head, page, &[])
        .await
        .map_err(|e| format!("audit events up to seq {}: {e}", last.seq))?;
    page.clear();
    Ok(last)
}

/// Walks the copied chain from seq 1: every event's hash and link holds, and it has them all.
async fn verify(store: &SqliteStore, expected: u64) -> Result<ChainHead, String> {
    let mut walker = crate::audit::ChainWalker::default();
    let mut from = 1;
    let mut line = 0;
    loop {
        let events = store
            .events_oldest_first(from, PAGE)
            .await
            .map_err(|e| e.to_string())?;
        for event in &events {
            line += 1;
            walker
                .push_line(Ok(event.to_string()), line)
                .map_err(|broken| format!("the imported chain does not verify: {broken}"))?;
        }
        from += events.len() as u64;
        if events.len() < PAGE {
            break;
        }
    }
    if line as u64 != expected {
        return Err(format!(
            "the imported chain holds {line} events of the {expected} copied"
        ));
    }
    if expected == 0 {
        return Ok(ChainHead::genesis());
    }
    let report = walker.finish().map_err(|broken| broken.to_string())?;
    Ok(ChainHead {
        seq: report.last_seq,
        hash: report.last_hash,
    })
}
