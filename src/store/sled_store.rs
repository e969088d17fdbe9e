//! The embedded default store on sled. Every decision is one sled compare-and-swap, so it stays atomic
//! without a process lock, and runs inline: sled's operations are in-memory until a flush.
//!
//! Durability: sled 0.34's own `flush` ends in `sync_file_range`, which neither flushes the device's write
//! cache nor the file's size, and sled writes large values ("blobs") to files of their own without any
//! sync. So [`AuditBackend::sync`] flushes sled and then fdatasyncs its log file and every blob file
//! written since the last sync: only then is a write durable in the sense of SPEC 12.

use std::collections::HashSet;
use std::ffi::OsString;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use sled::{Db, Tree};

use super::{
    Admission, Admitted, ApprovalCursor, ApprovalRecord, ApprovalStatus, AuditBackend, ChainHead,
    ClaimCursor, ClaimKind, ClaimRecord, ClaimSettlement, ClaimStatus, LiveCounts, Page,
    SessionRecord, Store, StoreError, StoreResult, StoredContext,
};

/// sled's page cache (see `open`).
const SLED_CACHE_BYTES: u64 = 8 * 1024 * 1024;

pub struct SledStore {
    sessions: Tree,
    counters: Tree,
    seen: Tree,
    seen_by_expiry: Tree,
    claims: Tree,
    claims_by_time: Tree,
    contexts: Tree,
    audit: Tree,
    /// Approval requests by id.
    approvals: Tree,
    /// (request time, id) of every approval request, for listings newest first.
    approvals_by_time: Tree,
    /// session id, NUL, call digest → the id of the call's current request.
    approval_calls: Tree,
    /// Shared with the blocking thread that runs each sync.
    durability: Arc<Durability>,
    /// PENDING claims and approval requests, counted once at open and kept by every write that changes
    /// a status, so that `/metrics` reads two numbers instead of every claim ever taken.
    pending_claims: AtomicI64,
    pending_approvals: AtomicI64,
}

/// Moves a pending tally by what a write did: +1 when a record became pending, −1 when one stopped
/// being pending. Signed, so that racing writes may land in either order (a settle's −1 before its
/// claim's +1) and still sum right.
fn tally(count: &AtomicI64, was_pending: bool, is_pending: bool) {
    count.fetch_add(
        i64::from(is_pending) - i64::from(was_pending),
        Ordering::Relaxed,
    );
}

/// A tally as a gauge reads it: a race can leave it below zero only for a moment.
fn tallied(count: &AtomicI64) -> u64 {
    u64::try_from(count.load(Ordering::Relaxed)).unwrap_or(0)
}

/// How many records in `tree` have the status `pending`; only that field is decoded.
fn count_status<S: DeserializeOwned + PartialEq>(tree: &Tree, pending: S) -> StoreResult<i64> {
    #[derive(serde::Deserialize)]
    struct State<S> {
        status: S,
    }
    let mut count = 0;
    for entry in tree.iter() {
        let state: State<S> = decode(&entry.map_err(io)?.1)?;
        if state.status == pending {
            count += 1;
        }
    }
    Ok(count)
}

/// What a sync needs: the database and the files it writes.
struct Durability {
    db: Db,
    /// sled's log file, opened once for fdatasync.
    log_file: File,
    blobs_dir: PathBuf,
    /// Blob files already synced: a sync fsyncs only the new ones.
    synced_blobs: Mutex<HashSet<OsString>>,
}

fn encode<T: Serialize>(value: &T) -> StoreResult<Vec<u8>> {
    serde_json::to_vec(value).map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> StoreResult<T> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt(e.to_string()))
}

/// Up to `limit` records that `keep` accepts, in the order given (`None`: a record that is gone), and
/// whether more follow.
fn read_page<T: DeserializeOwned>(
    records: impl Iterator<Item = StoreResult<Option<sled::IVec>>>,
    limit: usize,
    keep: &(dyn for<'r> Fn(&'r T) -> bool + Sync),
) -> StoreResult<(Vec<T>, bool)> {
    let mut page = Page::new(limit, keep);
    for bytes in records {
        let Some(bytes) = bytes? else { continue };
        if page.offer(decode(&bytes)?) {
            return Ok(page.done(true));
        }
    }
    Ok(page.done(false))
}

fn io(err: impl std::fmt::Display) -> StoreError {
    StoreError::unavailable(err)
}

/// Sortable big-endian form of a signed instant (offset so that negatives sort first).
fn instant_bytes(ms: i64) -> [u8; 8] {
    ((ms as u64) ^ (1 << 63)).to_be_bytes()
}

/// A claim's key: its namespace, then its request id (SPEC 7.4 r2: the namespaces never meet).
fn claim_key(kind: ClaimKind, request_id: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(1 + request_id.len());
    key.push(match kind {
        ClaimKind::Invoke => b'i',
        ClaimKind::Standalone => b's',
    });
    key.extend_from_slice(request_id.as_bytes());
    key
}

/// Index key ordering claims by time, then by their claim key.
fn time_key(claimed_at_ms: i64, kind: ClaimKind, request_id: &str) -> Vec<u8> {
    let mut key = instant_bytes(claimed_at_ms).to_vec();
    key.extend_from_slice(&claim_key(kind, request_id));
    key
}

fn approval_time_key(requested_at_ms: i64, approval_id: &str) -> Vec<u8> {
    let mut key = instant_bytes(requested_at_ms).to_vec();
    key.extend_from_slice(approval_id.as_bytes());
    key
}

fn approval_call_key(session_id: &str, call_digest: &str) -> Vec<u8> {
    format!("{session_id}\0{call_digest}").into_bytes()
}

fn expiry_key(expires_at_ms: i64, signature: &[u8]) -> Vec<u8> {
    let mut key = instant_bytes(expires_at_ms).to_vec();
    key.extend_from_slice(signature);
    key
}

/// Opens a directory and fsyncs it, so that the names of files created in it are durable too.
fn sync_dir(dir: &Path) -> StoreResult<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io(format!("cannot sync {}: {e}", dir.display())))
}

impl SledStore {
    pub fn open(dir: &Path) -> StoreResult<SledStore> {
        std::fs::create_dir_all(dir)
            .map_err(|e| io(format!("cannot create {}: {e}", dir.display())))?;
        let db = sled::Config::new()
            .path(dir)
            .mode(sled::Mode::HighThroughput)
            // sled caches 1 GiB by default; the hot state (sessions) lives in the gateway's own cache, and
            // the OS page cache serves the rest, so a small cache keeps the resident set small.
            .cache_capacity(SLED_CACHE_BYTES)
            .open()
            .map_err(|e| io(format!("cannot open store at {}: {e}", dir.display())))?;
        let tree = |name: &str| db.open_tree(name).map_err(io);
        let log_path = dir.join("db");
        let log_file = File::open(&log_path)
            .map_err(|e| io(format!("cannot open {}: {e}", log_path.display())))?;
        let blobs_dir = dir.join("blobs");
        // The files sled just created must not vanish with their directory entries.
        sync_dir(dir)?;
        if blobs_dir.is_dir() {
            sync_dir(&blobs_dir)?;
        }
        let claims = tree("claims")?;
        let approvals = tree("approvals")?;
        Ok(SledStore {
            pending_claims: AtomicI64::new(count_status(&claims, ClaimStatus::Pending)?),
            pending_approvals: AtomicI64::new(count_status(&approvals, ApprovalStatus::Pending)?),
            sessions: tree("sessions")?,
            counters: tree("counters")?,
            seen: tree("seen_signatures")?,
            seen_by_expiry: tree("seen_by_expiry")?,
            claims,
            claims_by_time: tree("claims_by_time")?,
            contexts: tree("contexts")?,
            audit: tree("audit")?,
            approvals,
            approvals_by_time: tree("approvals_by_time")?,
            approval_calls: tree("approval_calls")?,
            durability: Arc::new(Durability {
                log_file,
                blobs_dir,
                synced_blobs: Mutex::new(HashSet::new()),
                db,
            }),
        })
    }

    /// Inserts `value` under `key` unless present; returns the existing bytes otherwise.
    fn insert_if_absent(
        tree: &Tree,
        key: &[u8],
        value: Vec<u8>,
    ) -> StoreResult<Option<sled::IVec>> {
        match tree
            .compare_and_swap(key, None::<&[u8]>, Some(value))
            .map_err(io)?
        {
            Ok(()) => Ok(None),
            Err(conflict) => Ok(conflict.current),
        }
    }

    fn replace(tree: &Tree, key: &[u8], old: Vec<u8>, new: Option<Vec<u8>>) -> StoreResult<bool> {
        Ok(tree
            .compare_and_swap(key, Some(old), new)
            .map_err(io)?
            .is_ok())
    }

    /// Atomically applies `update` to the byte cell `key` (None = absent); `update` returns the new
    /// value, or None to leave the cell unchanged, and may run more than once under contention.
    fn cell_update<T>(
        &self,
        key: &[u8],
        update: &mut CellUpdate<'_, T>,
    ) -> StoreResult<Result<Vec<u8>, T>> {
        loop {
            let current = self.counters.get(key).map_err(io)?;
            let next = match update(current.as_deref()) {
                Ok(next) => next,
                Err(refused) => return Ok(Err(refused)),
            };
            let swapped = self
                .counters
                .compare_and_swap(key, current, Some(next.clone()))
                .map_err(io)?;
            if swapped.is_ok() {
                return Ok(Ok(next));
            }
        }
    }
}

impl Durability {
    /// sled's flush, then fdatasync of its log and of every new blob file (see the module comment).
    fn sync(&self) -> StoreResult<()> {
        self.db.flush().map_err(io)?;
        self.log_file.sync_data().map_err(io)?;
        self.sync_new_blobs()
    }

    /// fsyncs every blob file sled wrote since the last sync, and their directory.
    fn sync_new_blobs(&self) -> StoreResult<()> {
        let entries = match std::fs::read_dir(&self.blobs_dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io(e)),
        };
        let mut synced = self
            .synced_blobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut present = HashSet::new();
        let mut new_files = false;
        for entry in entries {
            let entry = entry.map_err(io)?;
            let name = entry.file_name();
            if !synced.contains(&name) {
                match File::open(entry.path()) {
                    Ok(file) => file.sync_data().map_err(io)?,
                    // sled removed an obsolete blob meanwhile: nothing left to make durable.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(io(e)),
                }
                new_files = true;
            }
            present.insert(name);
        }
        *synced = present;
        drop(synced);
        if new_files {
            sync_dir(&self.blobs_dir)?;
        }
        Ok(())
    }
}

/// Computes a cell's next value from its current one (None = absent), or refuses with `T`.
type CellUpdate<'a, T> = dyn FnMut(Option<&[u8]>) -> Result<Vec<u8>, T> + 'a;

pub(super) fn budget_bytes(count: i64) -> Vec<u8> {
    count.to_be_bytes().to_vec()
}

pub(super) fn budget_count(bytes: Option<&[u8]>) -> StoreResult<i64> {
    match bytes {
        None => Ok(0),
        Some(raw) => raw
            .try_into()
            .map(i64::from_be_bytes)
            .map_err(|_| StoreError::Corrupt("budget counter is not 8 bytes".into())),
    }
}

#[async_trait::async_trait]
impl Store for SledStore {
    async fn ping(&self) -> StoreResult<()> {
        self.sessions.get(b"\0ping").map(|_| ()).map_err(io)
    }

    async fn session_insert(&self, record: &SessionRecord) -> StoreResult<Option<SessionRecord>> {
        let key = record.session_id.as_bytes();
        match Self::insert_if_absent(&self.sessions, key, encode(record)?)? {
            None => Ok(None),
            Some(existing) => Ok(Some(decode(&existing)?)),
        }
    }

    async fn session_get(&self, session_id: &str) -> StoreResult<Option<SessionRecord>> {
        self.sessions
            .get(session_id.as_bytes())
            .map_err(io)?
            .map(|bytes| decode(&bytes))
            .transpose()
    }

    async fn session_replace(&self, old: &SessionRecord, new: &SessionRecord) -> StoreResult<bool> {
        Self::replace(
            &self.sessions,
            old.session_id.as_bytes(),
            encode(old)?,
            Some(encode(new)?),
        )
    }

    async fn session_page(
        &self,
        after: Option<&str>,
        limit: usize,
        keep: &(dyn for<'r> Fn(&'r SessionRecord) -> bool + Sync),
    ) -> StoreResult<(Vec<SessionRecord>, bool)> {
        use std::ops::Bound;
        let start = match after {
            Some(id) => Bound::Excluded(id.as_bytes()),
            None => Bound::Unbounded,
        };
        let records = self
            .sessions
            .range::<&[u8], _>((start, Bound::Unbounded))
            .map(|entry| entry.map_err(io).map(|(_, bytes)| Some(bytes)));
        read_page(records, limit, keep)
    }

    async fn live_counts(&self, now_secs: i64) -> StoreResult<LiveCounts> {
        // Only the fields the counts need are decoded.
        #[derive(serde::Deserialize)]
        struct SessionState {
            expires_at: i64,
            revoked_at_ms: Option<i64>,
        }
        let mut counts = LiveCounts {
            pending_claims: tallied(&self.pending_claims),
            pending_approvals: tallied(&self.pending_approvals),
            ..LiveCounts::default()
        };
        for entry in self.sessions.iter() {
            let state: SessionState = decode(&entry.map_err(io)?.1)?;
            if state.revoked_at_ms.is_none() && now_secs < state.expires_at {
                counts.sessions += 1;
            }
        }
        Ok(counts)
    }

    async fn counter_get(&self, key: &str) -> StoreResult<Option<i64>> {
        match self.counters.get(key.as_bytes()).map_err(io)? {
            None => Ok(None),
            Some(bytes) => budget_count(Some(&bytes)).map(Some),
        }
    }

    async fn remember_signature(&self, signature: &[u8], expires_at_ms: i64) -> StoreResult<bool> {
        let inserted =
            Self::insert_if_absent(&self.seen, signature, expires_at_ms.to_be_bytes().to_vec())?
                .is_none();
        if inserted {
            self.seen_by_expiry
                .insert(expiry_key(expires_at_ms, signature), &[])
                .map_err(io)?;
        }
        Ok(inserted)
    }

    async fn purge_signatures(&self, now_ms: i64) -> StoreResult<usize> {
        let end = expiry_key(now_ms, &[]);
        let mut purged = 0;
        for entry in self.seen_by_expiry.range(..end) {
            let (key, _) = entry.map_err(io)?;
            if let Some(signature) = key.get(8..) {
                self.seen.remove(signature).map_err(io)?;
            }
            self.seen_by_expiry.remove(&key).map_err(io)?;
            purged += 1;
        }
        Ok(purged)
    }

    async fn admit(&self, admission: &Admission) -> StoreResult<Admitted> {
        if let Some(seen) = &admission.signature {
            if !self
                .remember_signature(&seen.signature, seen.expires_at_ms)
                .await?
            {
                return Ok(Admitted::Replayed);
            }
        }
        let now_ms = admission.now_ms;
        if let Some((key, window)) = &admission.rate {
            let charged =
                self.cell_update(key.as_bytes(), &mut |state| window.admit(state, now_ms))?;
            if let Err(retry_after_ms) = charged {
                return Ok(Admitted::RateLimited { retry_after_ms });
            }
        }
        if let Some((key, max)) = &admission.budget {
            let max = i64::try_from(*max).unwrap_or(i64::MAX);
            let mut corrupt = None;
            let counted =
                self.cell_update(key.as_bytes(), &mut |cell| match budget_count(cell) {
                    Ok(n) if n < max => Ok(budget_bytes(n + 1)),
                    Ok(_) => Err(()),
                    Err(e) => {
                        corrupt = Some(e);
                        Err(())
                    }
                })?;
            if let Some(e) = corrupt {
                return Err(e);
            }
            if counted.is_err() {
                // The budget refused the call, so the rate window must not count it either.
                if let Some((key, window)) = &admission.rate {
                    self.cell_update::<()>(key.as_bytes(), &mut |state| {
                        Ok(window.refund(state.unwrap_or_default(), now_ms))
                    })?
                    .ok();
                }
                return Ok(Admitted::BudgetExhausted);
            }
        }
        let existing_claim = match &admission.claim {
            Some(claim) => self.claim_insert(claim).await?,
            None => None,
        };
        Ok(Admitted::Charged {
            existing_claim: existing_claim.map(Box::new),
        })
    }

    async fn claim_insert(&self, record: &ClaimRecord) -> StoreResult<Option<ClaimRecord>> {
        let key = claim_key(record.kind, &record.request_id);
        match Self::insert_if_absent(&self.claims, &key, encode(record)?)? {
            None => {
                self.claims_by_time
                    .insert(
                        time_key(record.claimed_at_ms, record.kind, &record.request_id),
                        &[],
                    )
                    .map_err(io)?;
                let pending = record.status == ClaimStatus::Pending;
                tally(&self.pending_claims, false, pending);
                Ok(None)
            }
            Some(existing) => Ok(Some(decode(&existing)?)),
        }
    }

    async fn claim_get(
        &self,
        kind: ClaimKind,
        request_id: &str,
    ) -> StoreResult<Option<ClaimRecord>> {
        self.claims
            .get(claim_key(kind, request_id))
            .map_err(io)?
            .map(|bytes| decode(&bytes))
            .transpose()
    }

    async fn claim_replace(
        &self,
        old: &ClaimRecord,
        new: Option<&ClaimRecord>,
    ) -> StoreResult<bool> {
        let new_bytes = new.map(encode).transpose()?;
        let swapped = Self::replace(
            &self.claims,
            &claim_key(old.kind, &old.request_id),
            encode(old)?,
            new_bytes,
        )?;
        if !swapped {
            return Ok(false);
        }
        let pending =
            |claim: Option<&ClaimRecord>| claim.is_some_and(|c| c.status == ClaimStatus::Pending);
        tally(&self.pending_claims, pending(Some(old)), pending(new));
        if new.is_none() {
            self.claims_by_time
                .remove(time_key(old.claimed_at_ms, old.kind, &old.request_id))
                .map_err(io)?;
        }
        Ok(true)
    }

    async fn claim_page(
        &self,
        before: Option<&ClaimCursor>,
        limit: usize,
        keep: &(dyn for<'r> Fn(&'r ClaimRecord) -> bool + Sync),
    ) -> StoreResult<(Vec<ClaimRecord>, bool)> {
        let range = match before {
            Some(c) => self
                .claims_by_time
                .range(..time_key(c.claimed_at_ms, c.kind, &c.request_id)),
            None => self.claims_by_time.range::<&[u8], _>(..),
        };
        let records = range.rev().map(|entry| {
            let (key, _) = entry.map_err(io)?;
            // A released claim may still be indexed for a moment; what is gone is skipped.
            match key.get(8..) {
                Some(claim_key) => self.claims.get(claim_key).map_err(io),
                None => Ok(None),
            }
        });
        read_page(records, limit, keep)
    }

    async fn approval_insert(
        &self,
        record: &ApprovalRecord,
        replacing: Option<&str>,
    ) -> StoreResult<bool> {
        // The record first, then the swap that makes it current: a crash in between leaves a request
        // that no call finds, never a call pointing at nothing.
        let id = record.approval_id.as_bytes();
        let time_key = approval_time_key(record.requested_at_ms, &record.approval_id);
        self.approvals.insert(id, encode(record)?).map_err(io)?;
        self.approvals_by_time.insert(&time_key, id).map_err(io)?;
        let swapped = self
            .approval_calls
            .compare_and_swap(
                approval_call_key(&record.session_id, &record.call_digest),
                replacing.map(str::as_bytes),
                Some(id),
            )
            .map_err(io)?
            .is_ok();
        if !swapped {
            self.approvals_by_time.remove(&time_key).map_err(io)?;
            self.approvals.remove(id).map_err(io)?;
            return Ok(false);
        }
        let pending = record.status == ApprovalStatus::Pending;
        tally(&self.pending_approvals, false, pending);
        Ok(true)
    }

    async fn approval_current(
        &self,
        session_id: &str,
        call_digest: &str,
    ) -> StoreResult<Option<ApprovalRecord>> {
        let Some(id) = self
            .approval_calls
            .get(approval_call_key(session_id, call_digest))
            .map_err(io)?
        else {
            return Ok(None);
        };
        self.approvals
            .get(id)
            .map_err(io)?
            .map(|bytes| decode(&bytes))
            .transpose()
    }

    async fn approval_get(&self, approval_id: &str) -> StoreResult<Option<ApprovalRecord>> {
        self.approvals
            .get(approval_id.as_bytes())
            .map_err(io)?
            .map(|bytes| decode(&bytes))
            .transpose()
    }

    async fn approval_replace(
        &self,
        old: &ApprovalRecord,
        new: &ApprovalRecord,
    ) -> StoreResult<bool> {
        let swapped = Self::replace(
            &self.approvals,
            old.approval_id.as_bytes(),
            encode(old)?,
            Some(encode(new)?),
        )?;
        if swapped {
            tally(
                &self.pending_approvals,
                old.status == ApprovalStatus::Pending,
                new.status == ApprovalStatus::Pending,
            );
        }
        Ok(swapped)
    }

    async fn approval_page(
        &self,
        before: Option<&ApprovalCursor>,
        limit: usize,
        keep: &(dyn for<'r> Fn(&'r ApprovalRecord) -> bool + Sync),
    ) -> StoreResult<(Vec<ApprovalRecord>, bool)> {
        let range = match before {
            Some(c) => self
                .approvals_by_time
                .range(..approval_time_key(c.requested_at_ms, &c.approval_id)),
            None => self.approvals_by_time.range::<&[u8], _>(..),
        };
        let records = range.rev().map(|entry| {
            let (_, id) = entry.map_err(io)?;
            // A request that lost its race may still be indexed for a moment; what is gone is skipped.
            self.approvals.get(id).map_err(io)
        });
        read_page(records, limit, keep)
    }

    async fn context_put(&self, context: &StoredContext) -> StoreResult<()> {
        self.contexts
            .insert(context.name.as_bytes(), encode(context)?)
            .map_err(io)?;
        Ok(())
    }

    async fn context_delete(&self, name: &str) -> StoreResult<bool> {
        Ok(self.contexts.remove(name.as_bytes()).map_err(io)?.is_some())
    }

    async fn context_list(&self) -> StoreResult<Vec<StoredContext>> {
        self.contexts
            .iter()
            .map(|entry| {
                let (_, bytes) = entry.map_err(io)?;
                decode(&bytes)
            })
            .collect()
    }
}

impl SledStore {
    fn chain_head(&self) -> StoreResult<Option<ChainHead>> {
        let Some((_, bytes)) = self.audit.last().map_err(io)? else {
            return Ok(None);
        };
        let event: Value = decode(&bytes)?;
        let seq = event["seq"]
            .as_u64()
            .ok_or_else(|| StoreError::Corrupt("audit event without seq".into()))?;
        let hash = event["hash"]
            .as_str()
            .ok_or_else(|| StoreError::Corrupt("audit event without hash".into()))?;
        Ok(Some(ChainHead {
            seq,
            hash: hash.to_string(),
        }))
    }
}

#[async_trait::async_trait]
impl AuditBackend for SledStore {
    async fn head(&self) -> StoreResult<Option<ChainHead>> {
        self.chain_head()
    }

    async fn append(
        &self,
        after: &ChainHead,
        events: &[Value],
        settlements: &[ClaimSettlement],
    ) -> StoreResult<()> {
        // One process owns a sled store, and its single audit writer is the only caller, so checking the
        // head and then applying the batch cannot interleave with another append.
        let current = self.chain_head()?;
        let unmoved = match &current {
            None => after.seq == 0,
            Some(head) => head == after,
        };
        if !unmoved {
            return Err(StoreError::HeadMoved);
        }
        // Written before the events, so the batch's sync covers both.
        for settlement in settlements {
            self.claim_replace(&settlement.pending, Some(&settlement.settled))
                .await?;
        }
        let mut batch = sled::Batch::default();
        for event in events {
            let seq = event["seq"]
                .as_u64()
                .ok_or_else(|| StoreError::Corrupt("audit event without seq".into()))?;
            batch.insert(&seq.to_be_bytes(), encode(event)?);
        }
        self.audit.apply_batch(batch).map_err(io)
    }

    async fn sync(&self) -> StoreResult<()> {
        let durability = Arc::clone(&self.durability);
        tokio::task::spawn_blocking(move || durability.sync())
            .await
            .map_err(|e| io(format!("store sync thread failed: {e}")))?
    }

    async fn events_newest_first(
        &self,
        before_seq: Option<u64>,
        limit: usize,
    ) -> StoreResult<Vec<Value>> {
        let range = match before_seq {
            Some(seq) => self.audit.range(..seq.to_be_bytes()),
            None => self.audit.range::<&[u8], _>(..),
        };
        range
            .rev()
            .take(limit)
            .map(|entry| decode(&entry.map_err(io)?.1))
            .collect()
    }

    async fn events_oldest_first(&self, from_seq: u64, limit: usize) -> StoreResult<Vec<Value>> {
        self.audit
            .range(from_seq.to_be_bytes()..)
            .take(limit)
            .map(|entry| decode(&entry.map_err(io)?.1))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::conformance::{self, claim};

    fn open() -> (tempfile::TempDir, SledStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path()).unwrap();
        (dir, store)
    }

    #[tokio::test]
    async fn claim_insert_is_insert_if_absent_and_replace_is_compare_and_set() {
        let (_dir, store) = open();
        conformance::claim_insert_is_insert_if_absent_and_replace_is_compare_and_set(&store).await;
    }

    #[tokio::test]
    async fn the_two_claim_namespaces_never_meet_and_pages_run_newest_first() {
        let (_dir, store) = open();
        conformance::the_two_claim_namespaces_never_meet_and_pages_run_newest_first(&store).await;
    }

    #[tokio::test]
    async fn sessions_insert_once_and_replace_by_compare_and_set() {
        let (_dir, store) = open();
        conformance::sessions_insert_once_and_replace_by_compare_and_set(&store).await;
    }

    #[tokio::test]
    async fn session_pages_run_in_id_order_and_live_counts_count() {
        let (_dir, store) = open();
        conformance::session_pages_run_in_id_order_and_live_counts_count(&store).await;
    }

    #[tokio::test]
    async fn signatures_are_remembered_once_and_purged_after_their_window() {
        let (_dir, store) = open();
        conformance::signatures_are_remembered_once_and_purged_after_their_window(&store).await;
    }

    #[tokio::test]
    async fn admit_charges_rate_then_budget_then_claims_and_refusals_charge_nothing() {
        let (_dir, store) = open();
        conformance::admit_charges_rate_then_budget_then_claims_and_refusals_charge_nothing(&store)
            .await;
    }

    #[tokio::test]
    async fn a_settlement_is_written_with_its_batch_and_only_then() {
        let (_dir, store) = open();
        conformance::a_settlement_is_written_with_its_batch_and_only_then(&store).await;
    }

    #[tokio::test]
    async fn admit_writes_the_replay_record_first_and_keeps_it_on_refusal() {
        let (_dir, store) = open();
        conformance::admit_writes_the_replay_record_first_and_keeps_it_on_refusal(&store).await;
    }

    #[tokio::test]
    async fn admit_without_a_rate_window_charges_the_budget_and_the_claim_together() {
        let (_dir, store) = open();
        conformance::admit_without_a_rate_window_charges_the_budget_and_the_claim_together(&store)
            .await;
    }

    #[tokio::test]
    async fn approvals_change_by_compare_and_set_and_one_request_is_current_per_call() {
        let (_dir, store) = open();
        conformance::approvals_change_by_compare_and_set_and_one_request_is_current_per_call(
            &store,
        )
        .await;
    }

    #[tokio::test]
    async fn state_survives_reopen_after_a_sync() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = SledStore::open(dir.path()).unwrap();
            store
                .claim_insert(&claim(ClaimKind::Invoke, "kept", 5))
                .await
                .unwrap();
            store.remember_signature(&[7; 64], i64::MAX).await.unwrap();
            let budget = Admission {
                budget: Some(("n".into(), 10)),
                ..Admission::default()
            };
            store.admit(&budget).await.unwrap();
            // A value larger than sled's blob threshold lands in a file of its own, synced too.
            let big = StoredContext {
                name: "big".into(),
                spec: Value::String("x".repeat(300_000)),
            };
            store.context_put(&big).await.unwrap();
            store.sync().await.unwrap();
        }
        let store = SledStore::open(dir.path()).unwrap();
        assert!(store
            .claim_get(ClaimKind::Invoke, "kept")
            .await
            .unwrap()
            .is_some());
        assert!(!store.remember_signature(&[7; 64], i64::MAX).await.unwrap());
        assert_eq!(store.counter_get("n").await.unwrap(), Some(1));
        assert_eq!(store.context_list().await.unwrap().len(), 1);
        // The pending tally is counted again at open.
        assert_eq!(store.live_counts(0).await.unwrap().pending_claims, 1);
    }
}
