//! The verified-token cache: saves the signature check for a token that was already verified. It never
//! decides on its own — expiry is re-checked on every hit, revocation is the session store's job, and a
//! change of the trusted keys (a key set fetched anew) empties it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use sha2::{Digest, Sha256};

use super::claims::check_time;
use super::AgentClaims;

/// Default bound on cached tokens; a full cache first drops expired entries, then arbitrary ones.
pub(crate) const DEFAULT_CAPACITY: usize = 10_000;

/// Keyed by SHA-256 of the exact token text, so memory per entry does not grow with token size.
pub(crate) struct VerifiedTokenCache {
    entries: Mutex<Entries>,
    capacity: usize,
}

/// The tokens verified under one version (`epoch`) of the trusted keys.
#[derive(Default)]
struct Entries {
    epoch: u64,
    tokens: HashMap<[u8; 32], Arc<AgentClaims>>,
}

impl Entries {
    /// The tokens of `epoch`, forgetting older ones; None for a verification under older keys.
    fn of_epoch(&mut self, epoch: u64) -> Option<&mut HashMap<[u8; 32], Arc<AgentClaims>>> {
        if epoch < self.epoch {
            return None;
        }
        if epoch > self.epoch {
            self.epoch = epoch;
            self.tokens.clear();
        }
        Some(&mut self.tokens)
    }
}

impl VerifiedTokenCache {
    pub(crate) fn new(capacity: usize) -> Self {
        VerifiedTokenCache {
            entries: Mutex::new(Entries::default()),
            capacity: capacity.max(1),
        }
    }

    pub(crate) fn key(token: &str) -> [u8; 32] {
        Sha256::digest(token.as_bytes()).into()
    }

    // A panic elsewhere while holding the lock cannot leave the map half-updated (every operation is a
    // single HashMap call), so a poisoned lock is safe to keep using.
    fn lock(&self) -> MutexGuard<'_, Entries> {
        self.entries
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(crate) fn get(&self, key: &[u8; 32], epoch: u64) -> Option<Arc<AgentClaims>> {
        self.lock().of_epoch(epoch)?.get(key).cloned()
    }

    pub(crate) fn remove(&self, key: &[u8; 32]) {
        self.lock().tokens.remove(key);
    }

    /// Caches a token verified with the keys of `epoch` (read before the verification began).
    pub(crate) fn insert(
        &self,
        key: [u8; 32],
        claims: Arc<AgentClaims>,
        epoch: u64,
        now: i64,
        leeway_secs: u64,
    ) {
        let mut entries = self.lock();
        let Some(tokens) = entries.of_epoch(epoch) else {
            return;
        };
        if tokens.len() >= self.capacity && !tokens.contains_key(&key) {
            tokens.retain(|_, cached| check_time(cached.exp, None, now, leeway_secs).is_ok());
            if tokens.len() >= self.capacity {
                if let Some(victim) = tokens.keys().next().copied() {
                    tokens.remove(&victim);
                }
            }
        }
        tokens.insert(key, claims);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().tokens.len()
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
        cache.insert(VerifiedTokenCache::key("old"), claims(10), 0, 0, 0);
        cache.insert(VerifiedTokenCache::key("a"), claims(1000), 0, 0, 0);
        cache.insert(VerifiedTokenCache::key("b"), claims(1000), 0, 0, 0);
        // At now=50 the "old" entry is expired, so it is the one that makes room.
        cache.insert(VerifiedTokenCache::key("c"), claims(1000), 0, 50, 0);
        assert_eq!(cache.len(), 3);
        assert!(cache.get(&VerifiedTokenCache::key("old"), 0).is_none());
        assert!(cache.get(&VerifiedTokenCache::key("c"), 0).is_some());
        // Nothing expired: an arbitrary entry is evicted, the bound still holds.
        cache.insert(VerifiedTokenCache::key("d"), claims(1000), 0, 50, 0);
        assert_eq!(cache.len(), 3);
        assert!(cache.get(&VerifiedTokenCache::key("d"), 0).is_some());
    }

    #[test]
    fn reinserting_a_cached_token_evicts_nothing() {
        let cache = VerifiedTokenCache::new(2);
        cache.insert(VerifiedTokenCache::key("a"), claims(1000), 0, 0, 0);
        cache.insert(VerifiedTokenCache::key("b"), claims(1000), 0, 0, 0);
        cache.insert(VerifiedTokenCache::key("a"), claims(1000), 0, 0, 0);
        assert!(cache.get(&VerifiedTokenCache::key("a"), 0).is_some());
        assert!(cache.get(&VerifiedTokenCache::key("b"), 0).is_some());
    }

    #[test]
    fn newer_keys_forget_every_token_and_older_ones_cache_nothing() {
        let cache = VerifiedTokenCache::new(10);
        cache.insert(VerifiedTokenCache::key("a"), claims(1000), 1, 0, 0);
        assert!(cache.get(&VerifiedTokenCache::key("a"), 1).is_some());
        // Keys changed: what the old ones verified is gone.
        assert!(cache.get(&VerifiedTokenCache::key("a"), 2).is_none());
        // A verification that began under the old keys and ends now is not kept.
        cache.insert(VerifiedTokenCache::key("b"), claims(1000), 1, 0, 0);
        assert!(cache.get(&VerifiedTokenCache::key("b"), 2).is_none());
        assert_eq!(cache.len(), 0);
    }
}
