//! The embedded default store on sled. Every decision is one sled compare-and-swap, so it stays atomic
//! without a process lock. Durability: operations documented as durable call `flush` (an fsync of sled's
//! log) before they return; the others (seen signatures, counters) become durable with the next flush,
//! which the audit event of the same request performs before its response leaves the gateway.

use std::path::Path;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use sled::{Db, Tree};

use super::{ClaimRecord, SessionRecord, Store, StoreError, StoreResult, StoredContext};
use crate::audit::{AuditBackend, ChainHead};

pub struct SledStore {
    db: Db,
    sessions: Tree,
    counters: Tree,
    seen: Tree,
    seen_by_expiry: Tree,
    claims: Tree,
    claims_by_time: Tree,
    contexts: Tree,
    audit: Tree,
}

fn encode<T: Serialize>(value: &T) -> StoreResult<Vec<u8>> {
    serde_json::to_vec(value).map_err(StoreError::new)
}

fn decode<T: DeserializeOwned>(bytes: &[u8]) -> StoreResult<T> {
    serde_json::from_slice(bytes).map_err(|e| StoreError(format!("corrupt record: {e}")))
}

/// Index key ordering claims by time: big-endian millis (offset to sort negatives), then the id.
fn time_key(claimed_at_ms: i64, request_id: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(8 + request_id.len());
    key.extend_from_slice(&((claimed_at_ms as u64) ^ (1 << 63)).to_be_bytes());
    key.extend_from_slice(request_id.as_bytes());
    key
}

fn expiry_key(expires_at_ms: i64, signature: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(8 + signature.len());
    key.extend_from_slice(&((expires_at_ms as u64) ^ (1 << 63)).to_be_bytes());
    key.extend_from_slice(signature);
    key
}

impl SledStore {
    pub fn open(dir: &Path) -> StoreResult<SledStore> {
        std::fs::create_dir_all(dir)
            .map_err(|e| StoreError(format!("cannot create {}: {e}", dir.display())))?;
        let db = sled::Config::new()
            .path(dir)
            .mode(sled::Mode::HighThroughput)
            .open()
            .map_err(|e| StoreError(format!("cannot open store at {}: {e}", dir.display())))?;
        let tree = |name: &str| db.open_tree(name).map_err(StoreError::new);
        Ok(SledStore {
            sessions: tree("sessions")?,
            counters: tree("counters")?,
            seen: tree("seen_signatures")?,
            seen_by_expiry: tree("seen_by_expiry")?,
            claims: tree("claims")?,
            claims_by_time: tree("claims_by_time")?,
            contexts: tree("contexts")?,
            audit: tree("audit")?,
            db,
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
            .map_err(StoreError::new)?
        {
            Ok(()) => Ok(None),
            Err(conflict) => Ok(conflict.current),
        }
    }

    fn replace(tree: &Tree, key: &[u8], old: Vec<u8>, new: Option<Vec<u8>>) -> StoreResult<bool> {
        Ok(tree
            .compare_and_swap(key, Some(old), new)
            .map_err(StoreError::new)?
            .is_ok())
    }
}

impl Store for SledStore {
    fn ping(&self) -> StoreResult<()> {
        self.sessions
            .get(b"\0ping")
            .map(|_| ())
            .map_err(StoreError::new)
    }

    fn session_insert(&self, record: &SessionRecord) -> StoreResult<Option<SessionRecord>> {
        let key = record.session_id.as_bytes();
        match Self::insert_if_absent(&self.sessions, key, encode(record)?)? {
            None => {
                self.flush()?;
                Ok(None)
            }
            Some(existing) => Ok(Some(decode(&existing)?)),
        }
    }

    fn session_get(&self, session_id: &str) -> StoreResult<Option<SessionRecord>> {
        self.sessions
            .get(session_id.as_bytes())
            .map_err(StoreError::new)?
            .map(|bytes| decode(&bytes))
            .transpose()
    }

    fn session_replace(&self, old: &SessionRecord, new: &SessionRecord) -> StoreResult<bool> {
        let swapped = Self::replace(
            &self.sessions,
            old.session_id.as_bytes(),
            encode(old)?,
            Some(encode(new)?),
        )?;
        if swapped {
            self.flush()?;
        }
        Ok(swapped)
    }

    fn counter_update(
        &self,
        key: &str,
        update: &mut dyn FnMut(Option<i64>) -> Option<i64>,
    ) -> StoreResult<Option<i64>> {
        loop {
            let current = self.counter_get(key)?;
            let Some(next) = update(current) else {
                return Ok(None);
            };
            let old = current.map(|v| v.to_be_bytes().to_vec());
            let swapped = self
                .counters
                .compare_and_swap(key.as_bytes(), old, Some(next.to_be_bytes().to_vec()))
                .map_err(StoreError::new)?;
            if swapped.is_ok() {
                return Ok(Some(next));
            }
        }
    }

    fn counter_get(&self, key: &str) -> StoreResult<Option<i64>> {
        let Some(bytes) = self.counters.get(key.as_bytes()).map_err(StoreError::new)? else {
            return Ok(None);
        };
        let raw: [u8; 8] = bytes
            .as_ref()
            .try_into()
            .map_err(|_| StoreError(format!("corrupt counter {key}")))?;
        Ok(Some(i64::from_be_bytes(raw)))
    }

    fn remember_signature(&self, signature: &[u8], expires_at_ms: i64) -> StoreResult<bool> {
        let inserted =
            Self::insert_if_absent(&self.seen, signature, expires_at_ms.to_be_bytes().to_vec())?
                .is_none();
        if inserted {
            self.seen_by_expiry
                .insert(expiry_key(expires_at_ms, signature), &[])
                .map_err(StoreError::new)?;
        }
        Ok(inserted)
    }

    fn purge_signatures(&self, now_ms: i64) -> StoreResult<usize> {
        let end = expiry_key(now_ms, &[]);
        let mut purged = 0;
        for entry in self.seen_by_expiry.range(..end) {
            let (key, _) = entry.map_err(StoreError::new)?;
            if let Some(signature) = key.get(8..) {
                self.seen.remove(signature).map_err(StoreError::new)?;
            }
            self.seen_by_expiry.remove(&key).map_err(StoreError::new)?;
            purged += 1;
        }
        Ok(purged)
    }

    fn claim_insert(&self, record: &ClaimRecord) -> StoreResult<Option<ClaimRecord>> {
        let key = record.request_id.as_bytes();
        match Self::insert_if_absent(&self.claims, key, encode(record)?)? {
            None => {
                self.claims_by_time
                    .insert(time_key(record.claimed_at_ms, &record.request_id), &[])
                    .map_err(StoreError::new)?;
                self.flush()?;
                Ok(None)
            }
            Some(existing) => Ok(Some(decode(&existing)?)),
        }
    }

    fn claim_get(&self, request_id: &str) -> StoreResult<Option<ClaimRecord>> {
        self.claims
            .get(request_id.as_bytes())
            .map_err(StoreError::new)?
            .map(|bytes| decode(&bytes))
            .transpose()
    }

    fn claim_replace(&self, old: &ClaimRecord, new: Option<&ClaimRecord>) -> StoreResult<bool> {
        let new_bytes = new.map(encode).transpose()?;
        let swapped = Self::replace(
            &self.claims,
            old.request_id.as_bytes(),
            encode(old)?,
            new_bytes,
        )?;
        if swapped {
            if new.is_none() {
                self.claims_by_time
                    .remove(time_key(old.claimed_at_ms, &old.request_id))
                    .map_err(StoreError::new)?;
            }
            self.flush()?;
        }
        Ok(swapped)
    }

    fn claim_scan_newest_first(
        &self,
        before: Option<(i64, &str)>,
        visit: &mut dyn FnMut(&ClaimRecord) -> bool,
    ) -> StoreResult<()> {
        let range = match before {
            Some((ms, id)) => self.claims_by_time.range(..time_key(ms, id)),
            None => self.claims_by_time.range::<&[u8], _>(..),
        };
        for entry in range.rev() {
            let (key, _) = entry.map_err(StoreError::new)?;
            let Some(id) = key.get(8..) else { continue };
            // A released claim may still be indexed for a moment; skip what is gone.
            let Some(bytes) = self.claims.get(id).map_err(StoreError::new)? else {
                continue;
            };
            if !visit(&decode(&bytes)?) {
                break;
            }
        }
        Ok(())
    }

    fn context_put(&self, context: &StoredContext) -> StoreResult<()> {
        self.contexts
            .insert(context.name.as_bytes(), encode(context)?)
            .map_err(StoreError::new)?;
        self.flush()
    }

    fn context_delete(&self, name: &str) -> StoreResult<bool> {
        let removed = self
            .contexts
            .remove(name.as_bytes())
            .map_err(StoreError::new)?
            .is_some();
        self.flush()?;
        Ok(removed)
    }

    fn context_list(&self) -> StoreResult<Vec<StoredContext>> {
        self.contexts
            .iter()
            .map(|entry| {
                let (_, bytes) = entry.map_err(StoreError::new)?;
                decode(&bytes)
            })
            .collect()
    }

    fn flush(&self) -> StoreResult<()> {
        self.db.flush().map(|_| ()).map_err(StoreError::new)
    }
}

impl AuditBackend for SledStore {
    fn head(&self) -> Result<Option<ChainHead>, String> {
        let Some((_, bytes)) = self.audit.last().map_err(|e| e.to_string())? else {
            return Ok(None);
        };
        let event: Value = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
        let seq = event["seq"].as_u64().ok_or("audit event without seq")?;
        let hash = event["hash"].as_str().ok_or("audit event without hash")?;
        Ok(Some(ChainHead {
            seq,
            hash: hash.to_string(),
        }))
    }

    fn append(&self, events: &[Value]) -> Result<(), String> {
        let mut batch = sled::Batch::default();
        for event in events {
            let seq = event["seq"].as_u64().ok_or("audit event without seq")?;
            let bytes = serde_json::to_vec(event).map_err(|e| e.to_string())?;
            batch.insert(&seq.to_be_bytes(), bytes);
        }
        self.audit.apply_batch(batch).map_err(|e| e.to_string())?;
        self.db.flush().map(|_| ()).map_err(|e| e.to_string())
    }

    fn scan_newest_first(
        &self,
        before_seq: Option<u64>,
        f: &mut dyn FnMut(&Value) -> bool,
    ) -> Result<(), String> {
        let range = match before_seq {
            Some(seq) => self.audit.range(..seq.to_be_bytes()),
            None => self.audit.range::<&[u8], _>(..),
        };
        for entry in range.rev() {
            let (_, bytes) = entry.map_err(|e| e.to_string())?;
            let event: Value = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
            if !f(&event) {
                break;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{ClaimOutcome, ClaimStatus};

    fn claim(id: &str, ms: i64) -> ClaimRecord {
        ClaimRecord {
            request_id: id.into(),
            action: "fs.write".into(),
            agent_id: "agent".into(),
            session_id: None,
            status: ClaimStatus::Pending,
            claimed_at: crate::clock::rfc3339_millis(ms),
            claimed_at_ms: ms,
            action_ref: "ref".into(),
            committed_at: None,
            outcome: None,
            resolution: None,
        }
    }

    #[test]
    fn claim_insert_is_insert_if_absent_and_replace_is_compare_and_set() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path()).unwrap();
        let first = claim("a", 1);
        assert!(store.claim_insert(&first).unwrap().is_none());
        assert_eq!(
            store.claim_insert(&claim("a", 2)).unwrap(),
            Some(first.clone())
        );

        let mut committed = first.clone();
        committed.status = ClaimStatus::Committed;
        committed.outcome = Some(ClaimOutcome::Answer {
            response: serde_json::json!({"ok": 1}),
        });
        assert!(store.claim_replace(&first, Some(&committed)).unwrap());
        // A second writer holding the stale PENDING record loses.
        assert!(!store.claim_replace(&first, None).unwrap());
        assert_eq!(store.claim_get("a").unwrap(), Some(committed));
    }

    #[test]
    fn claims_scan_newest_first_with_cursor_and_release_removes() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path()).unwrap();
        for (i, id) in ["x", "y", "z"].iter().enumerate() {
            store.claim_insert(&claim(id, 10 + i as i64)).unwrap();
        }
        let mut seen = vec![];
        store
            .claim_scan_newest_first(None, &mut |c| {
                seen.push(c.request_id.clone());
                true
            })
            .unwrap();
        assert_eq!(seen, ["z", "y", "x"]);
        let mut after = vec![];
        store
            .claim_scan_newest_first(Some((11, "y")), &mut |c| {
                after.push(c.request_id.clone());
                true
            })
            .unwrap();
        assert_eq!(after, ["x"]);
        assert!(store.claim_replace(&claim("x", 10), None).unwrap());
        assert_eq!(store.claim_get("x").unwrap(), None);
    }

    #[test]
    fn signatures_are_remembered_once_and_purged_after_their_window() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path()).unwrap();
        assert!(store.remember_signature(&[1; 64], 1_000).unwrap());
        assert!(!store.remember_signature(&[1; 64], 1_000).unwrap());
        assert!(store.remember_signature(&[2; 64], 5_000).unwrap());
        assert_eq!(store.purge_signatures(2_000).unwrap(), 1);
        assert!(store.remember_signature(&[1; 64], 9_000).unwrap());
        assert!(!store.remember_signature(&[2; 64], 9_000).unwrap());
    }

    #[test]
    fn state_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = SledStore::open(dir.path()).unwrap();
            store.claim_insert(&claim("kept", 5)).unwrap();
            store.remember_signature(&[7; 64], i64::MAX).unwrap();
            store
                .counter_update("n", &mut |v| Some(v.unwrap_or(0) + 1))
                .unwrap();
            store.flush().unwrap();
        }
        let store = SledStore::open(dir.path()).unwrap();
        assert!(store.claim_get("kept").unwrap().is_some());
        assert!(!store.remember_signature(&[7; 64], i64::MAX).unwrap());
        assert_eq!(store.counter_get("n").unwrap(), Some(1));
    }

    #[test]
    fn counter_update_can_refuse() {
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path()).unwrap();
        let bump_below_two = &mut |v: Option<i64>| {
            let n = v.unwrap_or(0);
            (n < 2).then_some(n + 1)
        };
        assert_eq!(store.counter_update("b", bump_below_two).unwrap(), Some(1));
        assert_eq!(store.counter_update("b", bump_below_two).unwrap(), Some(2));
        assert_eq!(store.counter_update("b", bump_below_two).unwrap(), None);
        assert_eq!(store.counter_get("b").unwrap(), Some(2));
    }
}
