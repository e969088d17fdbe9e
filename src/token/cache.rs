//! The verified-token cache: saves the signature check for a token that was already verified. It never
//! decides on its own — expiry is re-checked on every hit, and revocation is the session store's job.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use sha2::{Digest, Sha256};

use super::claims::check_time;
use super::AgentClaims;

/// Default bound on cached tokens; a full cache first drops expired entries, then arbitrary ones.
pub(crate) const DEFAULT_CAPACITY: usize = 10_000;

/// Keyed by SHA-256 of the exact token text, so memory per entry does not grow with token size.
pub(crate) struct VerifiedTokenCache {
    entries: Mutex<HashMap<[u8; 32], Arc<AgentClaims>>>,
    capacity: usize,
}

impl VerifiedTokenCache {
    pub(crate) fn new(capacity: usize) -> Self {
        VerifiedTokenCache {
            entries: Mutex::new(HashMap::new()),
            capacity: capacity.max(1),
        }
    }

    pub(crate) fn key(token: &str) -> [u8; 32] {
        Sha256::digest(token.as_bytes()).into()
    }

    // A panic elsewhere while holding the lock cannot leave the map half-updated (every operation is a
    // single HashMap call), so a poisoned lock is safe to keep using.
    fn lock(&self) -> MutexGuard<'_, HashMap<[u8; 32], Arc<AgentClaims>>> {
        self.entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn get(&self, key: &[u8; 32]) -> Option<Arc<AgentClaims>> {
        self.lock().get(key).cloned()
    }

    pub(crate) fn remove(&self, key: &[u8; 32]) {
        self.lock().remove(key);
    }

    pub(crate) fn insert(
        &self,
        key: [u8; 32],
        claims: Arc<AgentClaims>,
        now: i64,
        leeway_secs: u64,
    ) {
        let mut entries = self.lock();
        if entries.len() >= self.capacity && !entries.contains_key(&key) {
            entries.retain(|_, cached| check_time(cached.exp, None, now, leeway_secs).is_ok());
            if entries.len() >= self.capacity {
                if let Some(victim) = entries.keys().next().copied() {
                    entries.remove(&victim);
                }
            }
        }
        entries.insert(key, claims);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claims(exp: i64) -> Arc<AgentClaims> {
        Arc::new(AgentClaims {
            sub: "a".into(),
            scp: "s".into(),
            exec_id: "e".into(),
            wid: None,
            jti: "j".into(),
            iat: 0,
            exp,
            nbf: None,
        })
    }

    #[test]
    fn capacity_is_a_hard_bound_and_expired_entries_go_first() {
        let cache = VerifiedTokenCache::new(3);
        cache.insert(VerifiedTokenCache::key("old"), claims(10), 0, 0);
        cache.insert(VerifiedTokenCache::key("a"), claims(1000), 0, 0);
        cache.insert(VerifiedTokenCache::key("b"), claims(1000), 0, 0);
        // At now=50 the "old" entry is expired, so it is the one that makes room.
        cache.insert(VerifiedTokenCache::key("c"), claims(1000), 50, 0);
        assert_eq!(cache.len(), 3);
        assert!(cache.get(&VerifiedTokenCache::key("old")).is_none());
        assert!(cache.get(&VerifiedTokenCache::key("c")).is_some());
        // Nothing expired: an arbitrary entry is evicted, the bound still holds.
        cache.insert(VerifiedTokenCache::key("d"), claims(1000), 50, 0);
        assert_eq!(cache.len(), 3);
        assert!(cache.get(&VerifiedTokenCache::key("d")).is_some());
    }

    #[test]
    fn reinserting_a_cached_token_evicts_nothing() {
        let cache = VerifiedTokenCache::new(2);
        cache.insert(VerifiedTokenCache::key("a"), claims(1000), 0, 0);
        cache.insert(VerifiedTokenCache::key("b"), claims(1000), 0, 0);
        cache.insert(VerifiedTokenCache::key("a"), claims(1000), 0, 0);
        assert!(cache.get(&VerifiedTokenCache::key("a")).is_some());
        assert!(cache.get(&VerifiedTokenCache::key("b")).is_some());
    }
}
