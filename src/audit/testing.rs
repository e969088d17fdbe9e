//! Test support: an in-memory backend with failure switches and a JSON-lines file backend that really
//! syncs, for tests and benches. Not meant for production (the file backend scans by reading the file).

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::Value;

use super::chain::{seal, Link};
use super::{AuditBackend, AuditEvent, ChainHead};
use crate::store::{decode_record, ClaimSettlement, StoreError, StoreResult, StoredEvent};

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `event` as the audit writer chains it right after `head`, for tests of what reads the chain.
pub fn chained_after(
    event: AuditEvent,
    head: &ChainHead,
) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
    let event = event.into_unsealed(false)?;
    let link = Link {
        seq: head.seq + 1,
        prev_hash: &head.hash,
        at: "2026-11-30T10:00:00.000Z",
        replica: None,
    };
    let (_, stored, _) = seal(&event, &link)?;
    Ok(serde_json::from_str(&stored.line)?)
}

/// Keeps events in memory; counts `append` calls and can be told to fail; `sync` costs a set delay.
#[derive(Default)]
pub struct MemoryBackend {
    events: Mutex<Vec<Value>>,
    append_calls: AtomicUsize,
    fail_appends: AtomicUsize,
    keep_on_failure: AtomicUsize,
    fail_heads: AtomicUsize,
    sync_delay: Mutex<Duration>,
    /// The claim settlements that rode in with stored events (this backend holds no claims).
    settlements: Mutex<Vec<ClaimSettlement>>,
}

impl MemoryBackend {
    pub fn new() -> Self {
        Self::default()
    }

    /// Every `sync` sleeps this long, as an fsync would.
    pub fn with_sync_delay(delay: Duration) -> Self {
        let backend = Self::default();
        *lock(&backend.sync_delay) = delay;
        backend
    }

    /// The next `count` appends fail; each still stores the first `keep` events of its batch, as a store
    /// that fails half-way would.
    pub fn fail_next_appends(&self, count: usize, keep: usize) {
        self.keep_on_failure.store(keep, Ordering::SeqCst);
        self.fail_appends.store(count, Ordering::SeqCst);
    }

    /// The next `count` reads of the head fail.
    pub fn fail_next_heads(&self, count: usize) {
        self.fail_heads.store(count, Ordering::SeqCst);
    }

    pub fn append_calls(&self) -> usize {
        self.append_calls.load(Ordering::SeqCst)
    }

    /// A copy of every stored event, oldest first.
    pub fn events(&self) -> Vec<Value> {
        lock(&self.events).clone()
    }

    /// A copy of every claim settlement stored with an appended batch, oldest first.
    pub fn settlements(&self) -> Vec<ClaimSettlement> {
        lock(&self.settlements).clone()
    }

    /// Replaces the stored events (to simulate tampering with the store).
    pub fn replace_events(&self, events: Vec<Value>) {
        *lock(&self.events) = events;
    }

    fn take_one(counter: &AtomicUsize) -> bool {
        counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }
}

/// Up to `limit` events (in stored order) whose seq is at least `from_seq`, oldest first.
fn page_from(events: &[Value], from_seq: u64, limit: usize) -> Vec<Value> {
    events
        .iter()
        .filter(|event| event.get("seq").and_then(Value::as_u64).unwrap_or(0) >= from_seq)
        .take(limit)
        .cloned()
        .collect()
}

/// Up to `limit` events whose seq is below `before_seq`, newest first.
fn page_before(events: &[Value], before_seq: Option<u64>, limit: usize) -> Vec<Value> {
    events
        .iter()
        .rev()
        .filter(|event| {
            let seq = event.get("seq").and_then(Value::as_u64).unwrap_or(0);
            before_seq.is_none_or(|before| seq < before)
        })
        .take(limit)
        .cloned()
        .collect()
}

/// Whether `after` is the head of `events` (the append precondition of [`AuditBackend::append`]).
fn is_head(events: Option<&Value>, after: &ChainHead) -> StoreResult<bool> {
    match events {
        None => Ok(after.seq == 0),
        Some(last) => Ok(ChainHead::of_event(last)? == *after),
    }
}

#[async_trait::async_trait]
impl AuditBackend for MemoryBackend {
    async fn events_oldest_first(&self, from_seq: u64, limit: usize) -> StoreResult<Vec<Value>> {
        Ok(page_from(&lock(&self.events), from_seq, limit))
    }

    async fn head(&self) -> StoreResult<Option<ChainHead>> {
        if Self::take_one(&self.fail_heads) {
            return Err(StoreError::unavailable(
                "memory backend: head failed on purpose",
            ));
        }
        lock(&self.events)
            .last()
            .map(ChainHead::of_event)
            .transpose()
    }

    async fn append(
        &self,
        after: &ChainHead,
        events: &[StoredEvent],
        settlements: &[ClaimSettlement],
    ) -> StoreResult<()> {
        self.append_calls.fetch_add(1, Ordering::SeqCst);
        // Kept as read back, so that tests can look into (and tamper with) what was stored.
        let events = events
            .iter()
            .map(|event| decode_record(&event.line))
            .collect::<StoreResult<Vec<Value>>>()?;
        let mut stored = lock(&self.events);
        if !is_head(stored.last(), after)? {
            return Err(StoreError::HeadMoved);
        }
        if Self::take_one(&self.fail_appends) {
            let keep = self
                .keep_on_failure
                .load(Ordering::SeqCst)
                .min(events.len());
            stored.extend(events.into_iter().take(keep));
            return Err(StoreError::unavailable(
                "memory backend: append failed on purpose",
            ));
        }
        stored.extend(events);
        lock(&self.settlements).extend(settlements.iter().cloned());
        Ok(())
    }

    async fn sync(&self) -> StoreResult<()> {
        let delay = *lock(&self.sync_delay);
        if !delay.is_zero() {
            // A sleep off the runtime's threads, as an fsync on a blocking thread would be.
            tokio::time::sleep(delay).await;
        }
        Ok(())
    }

    async fn events_newest_first(
        &self,
        before_seq: Option<u64>,
        limit: usize,
    ) -> StoreResult<Vec<Value>> {
        Ok(page_before(&lock(&self.events), before_seq, limit))
    }
}

/// Appends events as JSON lines to a file and fdatasyncs it on every `sync`: a store whose durability
/// cost is real, to measure group commit against.
pub struct JsonlFileBackend {
    path: PathBuf,
    file: Mutex<File>,
    head: Mutex<Option<ChainHead>>,
    append_calls: AtomicUsize,
}

impl JsonlFileBackend {
    /// Opens (or creates) the file; the head is its last line.
    pub fn open(path: &Path) -> StoreResult<Self> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .read(true)
            .open(path)
            .map_err(|e| StoreError::unavailable(format!("{}: {e}", path.display())))?;
        let backend = JsonlFileBackend {
            path: path.to_owned(),
            file: Mutex::new(file),
            head: Mutex::new(None),
            append_calls: AtomicUsize::new(0),
        };
        let mut head = None;
        for event in backend.read_all()? {
            head = Some(ChainHead::of_event(&event)?);
        }
        *lock(&backend.head) = head;
        Ok(backend)
    }

    pub fn append_calls(&self) -> usize {
        self.append_calls.load(Ordering::SeqCst)
    }

    fn read_all(&self) -> StoreResult<Vec<Value>> {
        let file = File::open(&self.path)
            .map_err(|e| StoreError::unavailable(format!("{}: {e}", self.path.display())))?;
        BufReader::new(file)
            .lines()
            .map(|line| {
                let line = line.map_err(StoreError::unavailable)?;
                serde_json::from_str(&line).map_err(|e| StoreError::Corrupt(e.to_string()))
            })
            .collect()
    }
}

#[async_trait::async_trait]
impl AuditBackend for JsonlFileBackend {
    async fn events_oldest_first(&self, from_seq: u64, limit: usize) -> StoreResult<Vec<Value>> {
        Ok(page_from(&self.read_all()?, from_seq, limit))
    }

    async fn head(&self) -> StoreResult<Option<ChainHead>> {
        Ok(lock(&self.head).clone())
    }

    async fn append(
        &self,
        after: &ChainHead,
        events: &[StoredEvent],
        settlements: &[ClaimSettlement],
    ) -> StoreResult<()> {
        // A file of events only: a settlement would be lost here, so refuse it.
        if !settlements.is_empty() {
            return Err(StoreError::unavailable(
                "the JSON-lines test backend holds no claims",
            ));
        }
        self.append_calls.fetch_add(1, Ordering::SeqCst);
        let Some(last) = events.last() else {
            return Ok(());
        };
        let new_head = last.head.clone();
        let mut head = lock(&self.head);
        let unmoved = match head.as_ref() {
            None => after.seq == 0,
            Some(current) => current == after,
        };
        if !unmoved {
            return Err(StoreError::HeadMoved);
        }
        let mut buffer = Vec::new();
        for event in events {
            buffer.extend_from_slice(event.line.as_bytes());
            buffer.push(b'\n');
        }
        lock(&self.file)
            .write_all(&buffer)
            .map_err(StoreError::unavailable)?;
        *head = Some(new_head);
        Ok(())
    }

    async fn sync(&self) -> StoreResult<()> {
        let file = lock(&self.file)
            .try_clone()
            .map_err(StoreError::unavailable)?;
        tokio::task::spawn_blocking(move || file.sync_data())
            .await
            .map_err(StoreError::unavailable)?
            .map_err(StoreError::unavailable)
    }

    async fn events_newest_first(
        &self,
        before_seq: Option<u64>,
        limit: usize,
    ) -> StoreResult<Vec<Value>> {
        Ok(page_before(&self.read_all()?, before_seq, limit))
    }
}
