//! Agent tokens (`security_token` of an envelope): configuration, claims and the verifier that runs
//! checks 2, 3 and 4 of SPEC section 3, with the verified-token cache in front of the crypto.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::cache::{VerifiedTokenCache, DEFAULT_CAPACITY};
use super::claims::{
    check_audience, check_audience_shape, check_time, optional_seconds, optional_string,
    required_seconds, required_string, validate_common,
};
use super::jwt::MAX_TOKEN_BYTES;
use super::keys::{KeyConfig, KeySet};
use super::mint::TokenMinter;
use super::{ConfigError, TokenError};
use crate::clock::Round;

/// `agent_tokens` in the configuration file (SPEC section 11).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentTokenConfig {
    /// Checked against `iss` when set.
    #[serde(default)]
    pub issuer: Option<String>,
    /// Checked against `aud` (a string, or an array containing it) when set.
    #[serde(default)]
    pub audience: Option<String>,
    #[serde(default)]
    pub leeway_secs: u64,
    #[serde(default)]
    pub keys: Vec<KeyConfig>,
    /// Ed25519 private key (PKCS#8 PEM file): when set the gateway mints agent tokens and trusts them.
    #[serde(default)]
    pub issuer_key: Option<PathBuf>,
}

/// The claims of a verified agent token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AgentClaims {
    /// The agent id.
    pub sub: String,
    /// The security context name.
    pub scp: String,
    /// The session id.
    pub exec_id: String,
    /// The workload id, when the token names one.
    pub wid: Option<String>,
    pub jti: String,
    pub iat: i64,
    pub exp: i64,
    pub nbf: Option<i64>,
}

/// Verifies agent tokens against the configured keys. Build a new one when the configuration changes
/// (the cache belongs to one key set).
pub struct AgentTokenVerifier {
    keys: KeySet,
    issuer: Option<String>,
    audience: Option<String>,
    leeway_secs: u64,
    cache: VerifiedTokenCache,
}

impl AgentTokenVerifier {
    /// Loads every key (files relative to `base_dir`). When `issuer_key` is set, the public half of the
    /// gateway's own minting key is trusted too, so what the gateway mints always verifies; callers need
    /// not add `TokenMinter::verifying_key_config()` themselves. No keys at all is allowed (the default
    /// configuration) and then every token is refused.
    pub fn new(cfg: &AgentTokenConfig, base_dir: &Path) -> Result<Self, ConfigError> {
        validate_common("agent_tokens", cfg.issuer.as_deref(), cfg.leeway_secs)?;
        if cfg.audience.as_deref() == Some("") {
            return Err(ConfigError::EmptyAudience("agent_tokens"));
        }
        let mut keys = KeySet::load(&cfg.keys, base_dir, "agent_tokens")?;
        if let Some(minter) = TokenMinter::from_config(cfg, base_dir)? {
            let own_key = minter.verifying_key_config();
            if !cfg.keys.contains(&own_key) {
                keys.add_config(&own_key, base_dir, "agent_tokens.issuer_key")?;
            }
        }
        Ok(AgentTokenVerifier {
            keys,
            issuer: cfg.issuer.clone(),
            audience: cfg.audience.clone(),
            leeway_secs: cfg.leeway_secs,
            cache: VerifiedTokenCache::new(DEFAULT_CAPACITY),
        })
    }

    /// How many keys are trusted (0 means every token is refused; worth a start-up warning).
    pub fn key_count(&self) -> usize {
        self.keys.len()
    }

    /// The keys, for the gateway to start their fetching and to ask whether they have arrived.
    pub(crate) fn key_set(&self) -> &KeySet {
        &self.keys
    }

    /// [`AgentTokenVerifier::verify`], after fetching the key sets at URLs again when the token names a
    /// kid that no key has (at most every 10 s): what a call uses, so that a key the identity provider
    /// has just published is accepted at once.
    pub async fn verify_with_refresh(
        &self,
        token: &str,
        now: i64,
    ) -> Result<Arc<AgentClaims>, TokenError> {
        self.keys.fetch_for_unknown_kid(token).await;
        self.verify(token, now)
    }

    /// Checks 2, 3 and 4, in that order, with the keys at hand; `now` is Unix seconds. Returns the
    /// shared claims of a cached verification when there is one (still re-checking expiry).
    pub fn verify(&self, token: &str, now: i64) -> Result<Arc<AgentClaims>, TokenError> {
        // Read before verifying, so that keys replaced meanwhile do not adopt this verification.
        let epoch = self.keys.cache_epoch();
        // Oversized tokens are refused by the parser below; hashing them first would be wasted work.
        let cache_key = epoch
            .filter(|_| token.len() <= MAX_TOKEN_BYTES)
            .map(|epoch| (VerifiedTokenCache::key(token), epoch));
        if let Some(cached) = cache_key.and_then(|(key, epoch)| self.cache.get(&key, epoch)) {
            return match check_time(cached.exp, cached.nbf, now, self.leeway_secs) {
                Ok(()) => Ok(cached),
                Err(err) => {
                    // Past exp the entry can never be useful again; a future nbf one still might.
                    if let (Some((key, _)), true) = (
                        cache_key,
                        check_time(cached.exp, None, now, self.leeway_secs).is_err(),
                    ) {
                        self.cache.remove(&key);
                    }
                    Err(err)
                }
            };
        }
        let claims = self.verify_signature_and_claims(token)?;
        check_time(claims.exp, claims.nbf, now, self.leeway_secs)?;
        let claims = Arc::new(claims);
        if let Some((key, epoch)) = cache_key {
            self.cache
                .insert(key, Arc::clone(&claims), epoch, now, self.leeway_secs);
        }
        Ok(claims)
    }

    /// Checks 2 and 3: everything except time.
    fn verify_signature_and_claims(&self, token: &str) -> Result<AgentClaims, TokenError> {
        let (claims, _) = &self.keys.authenticate(token, self.issuer.as_deref())?;
        match &self.audience {
            Some(audience) => check_audience(claims, audience)?,
            None => check_audience_shape(claims)?,
        }
        Ok(AgentClaims {
            sub: required_string(claims, "sub")?,
            scp: required_string(claims, "scp")?,
            exec_id: required_string(claims, "exec_id")?,
            wid: optional_string(claims, "wid")?,
            jti: required_string(claims, "jti")?,
            iat: required_seconds(claims, "iat", Round::Down)?,
            exp: required_seconds(claims, "exp", Round::Down)?,
            nbf: optional_seconds(claims, "nbf", Round::Up)?,
        })
    }

    #[cfg(test)]
    pub(crate) fn cached_tokens(&self) -> usize {
        self.cache.len()
    }
}

#[cfg(test)]
mod tests;
