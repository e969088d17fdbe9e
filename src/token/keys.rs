//! Verification keys: loading them from configuration (inline PEM, PEM file, JWKS file, JWKS URL, shared
//! secret), pinning each to one algorithm, and choosing which keys may check a given token.

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use jsonwebtoken::DecodingKey;
use serde::{Deserialize, Serialize};

use super::jwks_url::{url_for_log, RemoteJwks, RemoteSource};
use super::key_material::{key_from_pem, keys_from_jwks, KeyMaterialError, PinnedKey, TokenAlg};
use super::{ConfigError, TokenError};

/// One configured key. Exactly one of `public_key_pem`, `public_key_pem_file`, `jwks_file`, `jwks_url`,
/// `secret` is set; `alg` is the only algorithm the key will ever be used with.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    /// `EdDSA`, `ES256`, `RS256` or `HS256` (the last only with `secret`). Required, except with
    /// `jwks_url`, whose keys are each pinned by their own JWK; there it admits only keys of that one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alg: Option<String>,
    /// Matched against a token header's `kid`. Not allowed with a JWKS (its keys carry their own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key_pem: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_key_pem_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks_file: Option<PathBuf>,
    /// A JWK Set fetched over `https://` (`http://` only on a loopback host), and refreshed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jwks_url: Option<String>,
    /// Seconds between routine fetches of `jwks_url` (default 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh_secs: Option<u64>,
    /// Seconds for which the last set fetched from `jwks_url` serves while fetches fail (default and
    /// most 3600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_secs: Option<u64>,
    /// A PEM bundle: the only certificate authorities trusted for `jwks_url`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// HS256 shared secret (its UTF-8 bytes); at least 32 bytes recommended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
}

// Hand-written so that a logged configuration never shows the shared secret, nor a URL's query.
impl fmt::Debug for KeyConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyConfig")
            .field("alg", &self.alg)
            .field("kid", &self.kid)
            .field("public_key_pem", &self.public_key_pem.as_ref().map(|_| "…"))
            .field("public_key_pem_file", &self.public_key_pem_file)
            .field("jwks_file", &self.jwks_file)
            .field("jwks_url", &self.jwks_url.as_deref().map(url_for_log))
            .field("refresh_secs", &self.refresh_secs)
            .field("grace_secs", &self.grace_secs)
            .field("ca_file", &self.ca_file)
            .field("secret", &self.secret.as_ref().map(|_| "[redacted]"))
            .finish()
    }
}

/// What one key entry of the configuration gives: keys read now, or a key set to fetch from a URL.
enum Loaded {
    Fixed(Vec<PinnedKey>),
    Remote(RemoteJwks),
}

/// Where the key that verified a token came from: the configuration (a PEM, a JWKS file, a secret), or
/// a key set fetched from a URL. Operators' identities record it as `via` (SPEC 13 r4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySource {
    Configured,
    Fetched,
}

/// All keys of one trust domain (agent tokens, or operator tokens): those read at start-up and the
/// key sets fetched from JWKS URLs.
pub(crate) struct KeySet {
    keys: Vec<PinnedKey>,
    remote: Vec<Arc<RemoteJwks>>,
    /// Bumped whenever a fetched set changes, so that what was verified with the old keys is forgotten.
    epoch: Arc<AtomicU64>,
}

/// RFC 7518 3.2: an HS256 key must be at least as long as the hash output.
const MIN_HS256_SECRET_BYTES: usize = 32;

impl KeySet {
    /// Loads `configs`; `section` (e.g. `agent_tokens`) prefixes every error so it names the entry.
    /// Key sets at URLs are only checked here; [`KeySet::start_fetching`] fetches them.
    pub(crate) fn load(
        configs: &[KeyConfig],
        base_dir: &Path,
        section: &str,
    ) -> Result<Self, ConfigError> {
        let mut set = KeySet {
            keys: Vec::new(),
            remote: Vec::new(),
            epoch: Arc::default(),
        };
        for (index, config) in configs.iter().enumerate() {
            set.add_config(config, base_dir, &format!("{section}.keys[{index}]"))?;
        }
        Ok(set)
    }

    /// Adds the keys of one more config entry (also used for the gateway's own minting key).
    pub(crate) fn add_config(
        &mut self,
        config: &KeyConfig,
        base_dir: &Path,
        place: &str,
    ) -> Result<(), ConfigError> {
        let in_entry = |source| ConfigError::Entry {
            place: place.to_owned(),
            source: Box::new(source),
        };
        let loaded = load_key_config(config, base_dir, place, &self.epoch).map_err(in_entry)?;
        match loaded {
            Loaded::Fixed(keys) => self.add(keys).map_err(in_entry),
            Loaded::Remote(remote) => {
                self.remote.push(Arc::new(remote));
                Ok(())
            }
        }
    }

    fn add(&mut self, loaded: Vec<PinnedKey>) -> Result<(), ConfigError> {
        let mut seen: HashSet<&str> = self.keys.iter().filter_map(|k| k.kid.as_deref()).collect();
        for key in &loaded {
            if let Some(kid) = key.kid.as_deref() {
                // Two keys under one kid would make kid selection ambiguous.
                if !seen.insert(kid) {
                    return Err(ConfigError::DuplicateKid(kid.to_owned()));
                }
            }
        }
        self.keys.extend(loaded);
        Ok(())
    }

    /// The keys trusted now: those read at start-up and those of every fetched set still in its grace.
    pub(crate) fn len(&self) -> usize {
        let fetched: usize = self
            .remote
            .iter()
            .filter_map(|remote| remote.usable())
            .map(|set| set.keys.len())
            .sum();
        self.keys.len() + fetched
    }

    /// Fetches every key set at a URL once, then keeps each refreshed on a task of its own. A set that
    /// cannot be fetched now is retried there; its tokens are refused until it arrives. The gateway
    /// calls this once.
    pub(crate) async fn start_fetching(&self) {
        futures_util::future::join_all(self.remote.iter().map(RemoteJwks::start)).await;
    }

    /// The first key set at a URL that has never been fetched, described for `/readyz`: the gateway is
    /// not ready while there is one.
    pub(crate) fn waiting_for_keys(&self) -> Option<String> {
        self.remote
            .iter()
            .find(|remote| !remote.ever_fetched())
            .map(|remote| remote.describe_unusable())
    }

    /// The version of the trusted keys that a verified token may be cached under, or None while a key
    /// set at a URL is unusable (then nothing is cached, so nothing outlives the grace period).
    pub(crate) fn cache_epoch(&self) -> Option<u64> {
        self.remote
            .iter()
            .all(|remote| remote.usable().is_some())
            .then(|| self.epoch.load(Ordering::Acquire))
    }

    /// When `token` names a kid that no trusted key has, asks every key set at a URL to fetch again
    /// (each at most every 10 s, one fetch shared by all callers) and waits for those fetches.
    pub(crate) async fn fetch_for_unknown_kid(&self, token: &str) {
        if self.remote.is_empty() {
            return;
        }
        // A token that does not parse is refused by the verification that follows.
        let Some(kid) = super::jwt::parse(token).ok().and_then(|parsed| parsed.kid) else {
            return;
        };
        if self.has_kid(&kid) {
            return;
        }
        futures_util::future::join_all(self.remote.iter().map(|remote| remote.fetch_on_demand()))
            .await;
    }

    fn has_kid(&self, kid: &str) -> bool {
        let fixed = self.keys.iter().any(|key| key.kid() == Some(kid));
        fixed
            || self
                .remote
                .iter()
                .filter_map(|remote| remote.usable())
                .any(|set| set.keys.iter().any(|key| key.kid() == Some(kid)))
    }

    /// Checks 2 and 3 up to the issuer: the token parses, verifies with a pinned key, and names the
    /// configured issuer (when there is one). Returns its claims for the caller's own claim rules.
    pub(crate) fn authenticate(
        &self,
        token: &str,
        issuer: Option<&str>,
    ) -> Result<(serde_json::Map<String, serde_json::Value>, KeySource), TokenError> {
        let parsed = super::jwt::parse(token)?;
        let source = self.verify(
            &parsed.alg,
            parsed.kid.as_deref(),
            parsed.signing_input,
            parsed.signature_b64,
        )?;
        if let Some(issuer) = issuer {
            super::claims::check_issuer(&parsed.claims, issuer)?;
        }
        Ok((parsed.claims, source))
    }

    /// Check 3's signature part. Only keys pinned to the header's algorithm are candidates; among them a
    /// header `kid` narrows the choice to keys with that kid (keys configured without a kid stay eligible).
    /// Keys of a fetched set past its grace period are not candidates.
    pub(crate) fn verify(
        &self,
        header_alg: &str,
        kid: Option<&str>,
        signing_input: &str,
        signature_b64: &str,
    ) -> Result<KeySource, TokenError> {
        let alg = TokenAlg::from_name(header_alg).ok_or_else(|| {
            TokenError::Invalid(format!(
                "token algorithm `{header_alg}` is refused (accepted: EdDSA, ES256, RS256, HS256 where configured)"
            ))
        })?;
        let fetched: Vec<_> = self.remote.iter().filter_map(|r| r.usable()).collect();
        let same_alg: Vec<(&PinnedKey, KeySource)> = self
            .keys
            .iter()
            .map(|key| (key, KeySource::Configured))
            .chain(
                fetched
                    .iter()
                    .flat_map(|set| set.keys.iter().map(|key| (key, KeySource::Fetched))),
            )
            .filter(|(key, _)| key.alg == alg)
            .collect();
        if same_alg.is_empty() {
            return Err(TokenError::Invalid(format!(
                "no key is configured for token algorithm {}{}",
                alg.name(),
                self.unusable_note()
            )));
        }
        let mut tried = 0usize;
        for (key, source) in same_alg
            .into_iter()
            .filter(|(key, _)| match (kid, key.kid()) {
                (Some(wanted), Some(have)) => wanted == have,
                _ => true,
            })
        {
            tried += 1;
            // An Err here means the key could not be used, which cannot happen for keys probed at load;
            // treat it as "does not verify" and keep trying the others.
            if let Ok(true) = jsonwebtoken::crypto::verify(
                signature_b64,
                signing_input.as_bytes(),
                &key.key,
                alg.jwt_algorithm(),
            ) {
                return Ok(source);
            }
        }
        if tried == 0 {
            return Err(TokenError::Invalid(format!(
                "no {} key with kid `{}` is configured{}",
                alg.name(),
                kid.unwrap_or_default(),
                self.unusable_note()
            )));
        }
        Err(TokenError::Invalid(format!(
            "token signature does not verify with any configured {} key{}",
            alg.name(),
            self.unusable_note()
        )))
    }

    /// Why some fetched keys were not candidates, for the refusal's message ("" when all are usable).
    fn unusable_note(&self) -> String {
        self.remote
            .iter()
            .filter(|remote| remote.usable().is_none())
            .map(|remote| format!("; {}", remote.describe_unusable()))
            .collect()
    }
}

/// Relative paths in the configuration are read against the configuration's base directory.
pub(crate) fn resolve(base_dir: &Path, path: &Path) -> PathBuf {
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        base_dir.join(path)
    }
}

fn read_text(base_dir: &Path, path: &Path, field: &'static str) -> Result<String, ConfigError> {
    let full = resolve(base_dir, path);
    std::fs::read_to_string(&full).map_err(|source| ConfigError::Read {
        field,
        path: full,
        source,
    })
}

fn load_key_config(
    config: &KeyConfig,
    base_dir: &Path,
    place: &str,
    epoch: &Arc<AtomicU64>,
) -> Result<Loaded, ConfigError> {
    let alg = match config.alg.as_deref() {
        None => None,
        Some(name) => Some(
            TokenAlg::from_name(name)
                .ok_or_else(|| ConfigError::UnsupportedAlg(name.to_owned()))?,
        ),
    };
    let sources = [
        config.public_key_pem.is_some(),
        config.public_key_pem_file.is_some(),
        config.jwks_file.is_some(),
        config.jwks_url.is_some(),
        config.secret.is_some(),
    ];
    let source_count = sources.iter().filter(|set| **set).count();
    if source_count != 1 {
        return Err(ConfigError::SourceCount(source_count));
    }
    if config.kid.as_deref() == Some("") {
        return Err(ConfigError::EmptyKid);
    }
    if config.jwks_url.is_some() {
        if alg == Some(TokenAlg::Hs256) {
            return Err(KeyMaterialError::SecretInJwks.into());
        }
        if config.kid.is_some() {
            return Err(ConfigError::KidWithJwks("jwks_url"));
        }
        let source = RemoteSource {
            url: config.jwks_url.as_deref().unwrap_or_default(),
            refresh_secs: config.refresh_secs,
            grace_secs: config.grace_secs,
            ca_file: config.ca_file.as_ref().map(|file| resolve(base_dir, file)),
        };
        return RemoteJwks::new(source, place, alg, epoch.clone()).map(Loaded::Remote);
    }
    if config.refresh_secs.is_some() || config.grace_secs.is_some() || config.ca_file.is_some() {
        return Err(ConfigError::UrlOptionsWithoutUrl);
    }
    let alg = alg.ok_or(ConfigError::NoAlg)?;
    load_fixed_key(config, alg, base_dir).map(Loaded::Fixed)
}

/// A key entry read now: a secret, a PEM, or a JWKS file.
fn load_fixed_key(
    config: &KeyConfig,
    alg: TokenAlg,
    base_dir: &Path,
) -> Result<Vec<PinnedKey>, ConfigError> {
    // HS256 only with a secret, a secret only with HS256: a public key must never double as an HMAC key.
    if (alg == TokenAlg::Hs256) != config.secret.is_some() {
        return Err(if alg == TokenAlg::Hs256 {
            ConfigError::NoSecret
        } else {
            ConfigError::SecretWithAlg(alg)
        });
    }

    if let Some(secret) = &config.secret {
        if secret.is_empty() {
            return Err(ConfigError::EmptySecret);
        }
        // RFC 7518 asks for 32 bytes; a shorter secret is weak but may be what an orchestrator
        // already uses, so it loads with a warning instead of stopping the gateway.
        if secret.len() < MIN_HS256_SECRET_BYTES {
            tracing::warn!(
                bytes = secret.len(),
                "HS256 secret shorter than {MIN_HS256_SECRET_BYTES} bytes: use a longer one"
            );
        }
        let key =
            DecodingKey::from_secret(secret.as_bytes()).map_err(ConfigError::UnusableSecret)?;
        return Ok(vec![PinnedKey {
            alg,
            kid: config.kid.clone(),
            key,
        }]);
    }
    if let Some(pem) = &config.public_key_pem {
        let key = key_from_pem(alg, pem).map_err(ConfigError::Pem)?;
        return Ok(vec![PinnedKey {
            alg,
            kid: config.kid.clone(),
            key,
        }]);
    }
    if let Some(path) = &config.public_key_pem_file {
        let pem = read_text(base_dir, path, "public_key_pem_file")?;
        let key =
            key_from_pem(alg, &pem).map_err(in_file("public_key_pem_file", base_dir, path))?;
        return Ok(vec![PinnedKey {
            alg,
            kid: config.kid.clone(),
            key,
        }]);
    }
    if let Some(path) = &config.jwks_file {
        if config.kid.is_some() {
            return Err(ConfigError::KidWithJwks("jwks_file"));
        }
        let text = read_text(base_dir, path, "jwks_file")?;
        return keys_from_jwks(alg, &text).map_err(in_file("jwks_file", base_dir, path));
    }
    Err(ConfigError::NoSource)
}

/// Names the key file, as found from `base_dir`, in an error about its contents.
fn in_file<'a>(
    field: &'static str,
    base_dir: &'a Path,
    path: &'a Path,
) -> impl FnOnce(KeyMaterialError) -> ConfigError + 'a {
    move |source| ConfigError::KeyFile {
        field,
        path: resolve(base_dir, path),
        source,
    }
}
