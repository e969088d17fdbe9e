//! Verification keys: loading them from configuration (inline PEM, PEM file, JWKS file, JWKS URL, shared
//! secret), pinning each to one algorithm, and choosing which keys may check a given token.

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ed25519_dalek::pkcs8::DecodePublicKey;
use jsonwebtoken::{Algorithm, DecodingKey};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::jwks_url::{url_for_log, RemoteJwks};
use super::TokenError;

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

/// The algorithms SPEC section 4 supports. Anything else in a config or a token header is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TokenAlg {
    EdDsa,
    Es256,
    Rs256,
    Hs256,
}

impl TokenAlg {
    /// Exact, case-sensitive names as registered in RFC 7518 / RFC 8037.
    pub(crate) fn from_name(name: &str) -> Option<Self> {
        match name {
            "EdDSA" => Some(TokenAlg::EdDsa),
            "ES256" => Some(TokenAlg::Es256),
            "RS256" => Some(TokenAlg::Rs256),
            "HS256" => Some(TokenAlg::Hs256),
            _ => None,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            TokenAlg::EdDsa => "EdDSA",
            TokenAlg::Es256 => "ES256",
            TokenAlg::Rs256 => "RS256",
            TokenAlg::Hs256 => "HS256",
        }
    }

    fn jwt_algorithm(self) -> Algorithm {
        match self {
            TokenAlg::EdDsa => Algorithm::EdDSA,
            TokenAlg::Es256 => Algorithm::ES256,
            TokenAlg::Rs256 => Algorithm::RS256,
            TokenAlg::Hs256 => Algorithm::HS256,
        }
    }
}

/// A loaded key, usable only with `alg`.
pub(crate) struct PinnedKey {
    alg: TokenAlg,
    kid: Option<String>,
    key: DecodingKey,
}

impl PinnedKey {
    pub(crate) fn kid(&self) -> Option<&str> {
        self.kid.as_deref()
    }
}

/// What one key entry of the configuration gives: keys read now, or a key set to fetch from a URL.
enum Loaded {
    Fixed(Vec<PinnedKey>),
    Remote(RemoteJwks),
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
/// RSA moduli below 2048 bits are refused (NIST SP 800-131A); 8192 is the `rsa` crate's own ceiling.
const MIN_RSA_BITS: usize = 2048;
const MAX_RSA_BITS: usize = 8192;

impl KeySet {
    /// Loads `configs`; `section` (e.g. `agent_tokens`) prefixes every error so it names the entry.
    /// Key sets at URLs are only checked here; [`KeySet::start_fetching`] fetches them.
    pub(crate) fn load(
        configs: &[KeyConfig],
        base_dir: &Path,
        section: &str,
    ) -> Result<Self, String> {
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
    ) -> Result<(), String> {
        let loaded = load_key_config(config, base_dir, place, &self.epoch)
            .map_err(|err| format!("{place}: {err}"))?;
        match loaded {
            Loaded::Fixed(keys) => self.add(keys).map_err(|err| format!("{place}: {err}")),
            Loaded::Remote(remote) => {
                self.remote.push(Arc::new(remote));
                Ok(())
            }
        }
    }

    fn add(&mut self, loaded: Vec<PinnedKey>) -> Result<(), String> {
        let mut seen: HashSet<&str> = self.keys.iter().filter_map(|k| k.kid.as_deref()).collect();
        for key in &loaded {
            if let Some(kid) = key.kid.as_deref() {
                // Two keys under one kid would make kid selection ambiguous.
                if !seen.insert(kid) {
                    return Err(format!("kid `{kid}` is used by more than one key"));
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
    ) -> Result<serde_json::Map<String, serde_json::Value>, TokenError> {
        let parsed = super::jwt::parse(token)?;
        self.verify(
            &parsed.alg,
            parsed.kid.as_deref(),
            parsed.signing_input,
            parsed.signature_b64,
        )?;
        if let Some(issuer) = issuer {
            super::claims::check_issuer(&parsed.claims, issuer)?;
        }
        Ok(parsed.claims)
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
    ) -> Result<(), TokenError> {
        let alg = TokenAlg::from_name(header_alg).ok_or_else(|| {
            TokenError::Invalid(format!(
                "token algorithm `{header_alg}` is refused (accepted: EdDSA, ES256, RS256, HS256 where configured)"
            ))
        })?;
        let fetched: Vec<_> = self.remote.iter().filter_map(|r| r.usable()).collect();
        let same_alg: Vec<&PinnedKey> = self
            .keys
            .iter()
            .chain(fetched.iter().flat_map(|set| set.keys.iter()))
            .filter(|key| key.alg == alg)
            .collect();
        if same_alg.is_empty() {
            return Err(TokenError::Invalid(format!(
                "no key is configured for token algorithm {}{}",
                alg.name(),
                self.unusable_note()
            )));
        }
        let mut tried = 0usize;
        for key in same_alg.into_iter().filter(|key| match (kid, key.kid()) {
            (Some(wanted), Some(have)) => wanted == have,
            _ => true,
        }) {
            tried += 1;
            // An Err here means the key could not be used, which cannot happen for keys probed at load;
            // treat it as "does not verify" and keep trying the others.
            if let Ok(true) = jsonwebtoken::crypto::verify(
                signature_b64,
                signing_input.as_bytes(),
                &key.key,
                alg.jwt_algorithm(),
            ) {
                return Ok(());
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

fn read_text(base_dir: &Path, path: &Path, field: &str) -> Result<String, String> {
    let full = resolve(base_dir, path);
    std::fs::read_to_string(&full)
        .map_err(|err| format!("{field}: cannot read {}: {err}", full.display()))
}

fn load_key_config(
    config: &KeyConfig,
    base_dir: &Path,
    place: &str,
    epoch: &Arc<AtomicU64>,
) -> Result<Loaded, String> {
    let alg = match config.alg.as_deref() {
        None => None,
        Some(name) => Some(TokenAlg::from_name(name).ok_or_else(|| {
            format!("alg `{name}` is not supported (use EdDSA, ES256, RS256 or HS256)")
        })?),
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
        return Err(format!(
            "exactly one of public_key_pem, public_key_pem_file, jwks_file, jwks_url, secret must be set ({source_count} are)"
        ));
    }
    if let Some(kid) = &config.kid {
        if kid.is_empty() {
            return Err("kid must not be empty".to_owned());
        }
    }
    if config.jwks_url.is_some() {
        if alg == Some(TokenAlg::Hs256) {
            return Err("HS256 keys come from `secret` only, not from a JWKS".to_owned());
        }
        if config.kid.is_some() {
            return Err("kid cannot be set with jwks_url; the JWKs carry their own kid".to_owned());
        }
        return RemoteJwks::new(config, base_dir, place, alg, epoch.clone()).map(Loaded::Remote);
    }
    if config.refresh_secs.is_some() || config.grace_secs.is_some() || config.ca_file.is_some() {
        return Err(
            "refresh_secs, grace_secs and ca_file apply only to a jwks_url entry".to_owned(),
        );
    }
    let alg = alg.ok_or("alg is required (EdDSA, ES256, RS256 or HS256)")?;
    load_fixed_key(config, alg, base_dir).map(Loaded::Fixed)
}

/// A key entry read now: a secret, a PEM, or a JWKS file.
fn load_fixed_key(
    config: &KeyConfig,
    alg: TokenAlg,
    base_dir: &Path,
) -> Result<Vec<PinnedKey>, String> {
    // HS256 only with a secret, a secret only with HS256: a public key must never double as an HMAC key.
    if (alg == TokenAlg::Hs256) != config.secret.is_some() {
        return Err(if alg == TokenAlg::Hs256 {
            "alg HS256 needs `secret` (and only `secret`)".to_owned()
        } else {
            format!(
                "`secret` is only allowed with alg HS256, not {}",
                alg.name()
            )
        });
    }

    if let Some(secret) = &config.secret {
        if secret.is_empty() {
            return Err("HS256 secret is empty".to_owned());
        }
        // RFC 7518 asks for 32 bytes; a shorter secret is weak but may be what an orchestrator
        // already uses, so it loads with a warning instead of stopping the gateway.
        if secret.len() < MIN_HS256_SECRET_BYTES {
            tracing::warn!(
                bytes = secret.len(),
                "HS256 secret shorter than {MIN_HS256_SECRET_BYTES} bytes: use a longer one"
            );
        }
        let key = DecodingKey::from_secret(secret.as_bytes())
            .map_err(|err| format!("HS256 secret is unusable: {err}"))?;
        return Ok(vec![PinnedKey {
            alg,
            kid: config.kid.clone(),
            key,
        }]);
    }
    if let Some(pem) = &config.public_key_pem {
        let key = key_from_pem(alg, pem).map_err(|err| format!("public_key_pem: {err}"))?;
        return Ok(vec![PinnedKey {
            alg,
            kid: config.kid.clone(),
            key,
        }]);
    }
    if let Some(path) = &config.public_key_pem_file {
        let pem = read_text(base_dir, path, "public_key_pem_file")?;
        let key = key_from_pem(alg, &pem).map_err(|err| {
            format!(
                "public_key_pem_file {}: {err}",
                resolve(base_dir, path).display()
            )
        })?;
        return Ok(vec![PinnedKey {
            alg,
            kid: config.kid.clone(),
            key,
        }]);
    }
    if let Some(path) = &config.jwks_file {
        if config.kid.is_some() {
            return Err(
                "kid cannot be set with jwks_file; the JWKs carry their own kid".to_owned(),
            );
        }
        let text = read_text(base_dir, path, "jwks_file")?;
        return keys_from_jwks(alg, &text)
            .map_err(|err| format!("jwks_file {}: {err}", resolve(base_dir, path).display()));
    }
    Err("no key source is set".to_owned())
}

/// The single PEM label of `pem`, refusing text with zero or several blocks.
fn single_pem_label(pem: &str) -> Result<&str, String> {
    const BEGIN: &str = "-----BEGIN ";
    let mut blocks = pem.match_indices(BEGIN);
    let Some((start, _)) = blocks.next() else {
        return Err("no PEM block found".to_owned());
    };
    if blocks.next().is_some() {
        return Err("more than one PEM block; give exactly one public key".to_owned());
    }
    let rest = pem.get(start + BEGIN.len()..).unwrap_or_default();
    let (label, _) = rest
        .split_once("-----")
        .ok_or_else(|| "malformed PEM header line".to_owned())?;
    Ok(label)
}

/// Loads a public key PEM as a key of `alg`. Private keys and certificates are refused: configuration
/// holds public halves only.
fn key_from_pem(alg: TokenAlg, pem: &str) -> Result<DecodingKey, String> {
    let label = single_pem_label(pem)?;
    let label_ok = label == "PUBLIC KEY" || (alg == TokenAlg::Rs256 && label == "RSA PUBLIC KEY");
    if !label_ok {
        return Err(format!(
            "PEM block is `{label}`; expected a `PUBLIC KEY` (SubjectPublicKeyInfo) for {}",
            alg.name()
        ));
    }
    match alg {
        TokenAlg::EdDsa => {
            let key = ed25519_dalek::VerifyingKey::from_public_key_pem(pem)
                .map_err(|err| format!("not an Ed25519 public key: {err}"))?;
            ed25519_key(key.as_bytes())
        }
        TokenAlg::Es256 => {
            let key = DecodingKey::from_ec_pem(pem.as_bytes())
                .map_err(|err| format!("not an EC public key: {err}"))?;
            // The PEM reader accepts any EC curve; creating the ES256 verifier proves it is P-256.
            probe(&key, alg).map_err(|err| format!("not a P-256 public key: {err}"))?;
            Ok(key)
        }
        TokenAlg::Rs256 => {
            let key = DecodingKey::from_rsa_pem(pem.as_bytes())
                .map_err(|err| format!("not an RSA public key: {err}"))?;
            let der = key
                .try_get_as_bytes()
                .map_err(|err| format!("not an RSA public key: {err}"))?;
            let components = jsonwebtoken::crypto::rust_crypto::DEFAULT_PROVIDER
                .key_utils
                .rsa_pub_components_from_public_key;
            let (modulus, exponent) =
                components(der).map_err(|err| format!("not an RSA public key: {err}"))?;
            rsa_key(&modulus, &exponent)
        }
        TokenAlg::Hs256 => Err("HS256 takes `secret`, not a PEM key".to_owned()),
    }
}

/// An Ed25519 key from its 32 raw bytes, refusing small-order ("weak") points that many signatures
/// would verify under.
fn ed25519_key(raw: &[u8]) -> Result<DecodingKey, String> {
    let bytes: &[u8; 32] = raw
        .try_into()
        .map_err(|_| format!("Ed25519 public key is {} bytes, not 32", raw.len()))?;
    let key = ed25519_dalek::VerifyingKey::from_bytes(bytes)
        .map_err(|err| format!("not a valid Ed25519 point: {err}"))?;
    if key.is_weak() {
        return Err("Ed25519 public key has small order".to_owned());
    }
    let decoding = DecodingKey::from_ed_components(&URL_SAFE_NO_PAD.encode(bytes))
        .map_err(|err| format!("Ed25519 key unusable: {err}"))?;
    probe(&decoding, TokenAlg::EdDsa)?;
    Ok(decoding)
}

/// An RSA key from big-endian modulus and exponent, checked so that every later verification can use it.
fn rsa_key(modulus: &[u8], exponent: &[u8]) -> Result<DecodingKey, String> {
    let modulus = strip_leading_zeros(modulus);
    let exponent = strip_leading_zeros(exponent);
    let bits = bit_length(modulus);
    if !(MIN_RSA_BITS..=MAX_RSA_BITS).contains(&bits) {
        return Err(format!(
            "RSA modulus has {bits} bits; {MIN_RSA_BITS} to {MAX_RSA_BITS} are accepted"
        ));
    }
    if modulus.last().is_none_or(|byte| byte & 1 == 0) {
        return Err("RSA modulus is even".to_owned());
    }
    // The `rsa` crate accepts public exponents 3..=2^33-1, odd; refuse at load what it would refuse later.
    if exponent.len() > 5 {
        return Err("RSA public exponent is too large".to_owned());
    }
    let value = exponent
        .iter()
        .fold(0u64, |acc, byte| (acc << 8) | u64::from(*byte));
    if !(3..=(1u64 << 33) - 1).contains(&value) || value & 1 == 0 {
        return Err(format!("RSA public exponent {value} is not acceptable"));
    }
    Ok(DecodingKey::from_rsa_raw_components(modulus, exponent))
}

fn strip_leading_zeros(bytes: &[u8]) -> &[u8] {
    let first = bytes
        .iter()
        .position(|byte| *byte != 0)
        .unwrap_or(bytes.len());
    bytes.get(first..).unwrap_or_default()
}

fn bit_length(big_endian: &[u8]) -> usize {
    match big_endian.first() {
        None => 0,
        Some(top) => (big_endian.len() - 1) * 8 + (8 - top.leading_zeros() as usize),
    }
}

/// Builds the verifier for `alg` once, so a key that the crypto layer cannot use is a config error now
/// rather than a silent "signature does not verify" later.
fn probe(key: &DecodingKey, alg: TokenAlg) -> Result<(), String> {
    jsonwebtoken::crypto::verify("", b"", key, alg.jwt_algorithm())
        .map(|_| ())
        .map_err(|err| err.to_string())
}

/// Members a public JWK may carry; anything else (private parts included) is refused.
const COMMON_JWK_MEMBERS: &[&str] = &[
    "kty", "alg", "use", "key_ops", "kid", "x5c", "x5t", "x5t#S256", "x5u",
];

/// Members that only a private or secret JWK has (RFC 7518 6.2.2, 6.3.2, 6.4).
const PRIVATE_JWK_MEMBERS: &[&str] = &["d", "p", "q", "dp", "dq", "qi", "oth", "k"];

/// Loads every key of a JWKS document, each pinned to `alg`. A key whose own `kty`/`crv`/`alg` says it
/// is for something else makes the whole file invalid (fail closed) rather than being skipped.
fn keys_from_jwks(alg: TokenAlg, text: &str) -> Result<Vec<PinnedKey>, String> {
    if alg == TokenAlg::Hs256 {
        return Err("HS256 keys come from `secret` only, not from a JWKS".to_owned());
    }
    let document: Value =
        serde_json::from_str(text).map_err(|err| format!("not valid JSON: {err}"))?;
    let Value::Object(document) = document else {
        return Err("not a JSON object".to_owned());
    };
    if let Some(unknown) = document.keys().find(|name| name.as_str() != "keys") {
        return Err(format!(
            "unknown member `{unknown}` (a JWKS holds only `keys`)"
        ));
    }
    let Some(Value::Array(entries)) = document.get("keys") else {
        return Err("`keys` must be an array".to_owned());
    };
    if entries.is_empty() {
        return Err("`keys` is empty".to_owned());
    }
    entries
        .iter()
        .enumerate()
        .map(|(index, entry)| {
            jwk_to_key(alg, entry, Members::Strict).map_err(|err| format!("keys[{index}]: {err}"))
        })
        .collect()
}

/// The keys of a JWK Set fetched from an identity provider, and why each other JWK was skipped. Each
/// key is pinned by its own `kty`/`crv`/`alg`; `pin`, when the entry names one, admits only that
/// algorithm. A JWK that is unknown, contradicts itself or holds private material is skipped, never
/// trusted loosely; a document that is not a JWK Set is an error (the last good set stays in use).
pub(crate) fn keys_from_fetched_jwks(
    body: &[u8],
    pin: Option<TokenAlg>,
) -> Result<(Vec<PinnedKey>, Vec<String>), String> {
    let document = crate::strict_json::parse_strict_json(body)
        .map_err(|err| format!("not valid JSON: {err}"))?;
    let Some(Value::Array(entries)) = document.get("keys") else {
        return Err("not a JWK Set: no `keys` array".to_owned());
    };
    let mut keys = Vec::new();
    let mut skipped = Vec::new();
    for (index, entry) in entries.iter().enumerate() {
        let pinned = jwk_alg(entry).and_then(|alg| match pin {
            Some(pin) if pin != alg => Err(format!(
                "a {} key, and this entry admits {} only",
                alg.name(),
                pin.name()
            )),
            _ => jwk_to_key(alg, entry, Members::IgnoreUnknown),
        });
        match pinned {
            Ok(key) => keys.push(key),
            Err(err) => skipped.push(format!("keys[{index}]: {err}")),
        }
    }
    Ok((keys, skipped))
}

/// The one algorithm a JWK is used with, from its key type; an `alg` member must agree with it.
fn jwk_alg(entry: &Value) -> Result<TokenAlg, String> {
    let Value::Object(jwk) = entry else {
        return Err("not a JSON object".to_owned());
    };
    let kty = jwk_string(jwk, "kty")?.ok_or("`kty` is missing")?;
    let by_type = match kty {
        "OKP" => TokenAlg::EdDsa,
        "EC" => TokenAlg::Es256,
        "RSA" => TokenAlg::Rs256,
        // A symmetric key published at a URL would let anyone who reads it sign tokens.
        "oct" => return Err("kty `oct`: shared secrets are never taken from a JWK Set".to_owned()),
        other => return Err(format!("kty `{other}` is not supported")),
    };
    match jwk_string(jwk, "alg")? {
        Some(own) if own != by_type.name() => Err(format!(
            "alg `{own}` with kty `{kty}`: only {} is accepted for this key type",
            by_type.name()
        )),
        _ => Ok(by_type),
    }
}

/// Which JWK members besides the key's own are allowed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Members {
    /// A file the operator wrote: any unknown member is a mistake worth refusing.
    Strict,
    /// A set an identity provider publishes: providers add members of their own (`issuer`, …).
    IgnoreUnknown,
}

fn jwk_to_key(alg: TokenAlg, entry: &Value, members: Members) -> Result<PinnedKey, String> {
    let Value::Object(jwk) = entry else {
        return Err("not a JSON object".to_owned());
    };
    let (expected_kty, curve_members): (&str, &[&str]) = match alg {
        TokenAlg::EdDsa => ("OKP", &["crv", "x"]),
        TokenAlg::Es256 => ("EC", &["crv", "x", "y"]),
        TokenAlg::Rs256 => ("RSA", &["n", "e"]),
        TokenAlg::Hs256 => return Err("HS256 is not loaded from a JWKS".to_owned()),
    };
    let kty = jwk_string(jwk, "kty")?.ok_or("`kty` is missing")?;
    if kty != expected_kty {
        return Err(format!(
            "kty `{kty}` does not fit alg {} (expected {expected_kty})",
            alg.name()
        ));
    }
    for name in jwk.keys() {
        if COMMON_JWK_MEMBERS.contains(&name.as_str()) || curve_members.contains(&name.as_str()) {
            continue;
        }
        if PRIVATE_JWK_MEMBERS.contains(&name.as_str()) {
            return Err(format!(
                "holds private key material (`{name}`); configure public keys only"
            ));
        }
        if members == Members::Strict {
            return Err(format!(
                "member `{name}` is not allowed in an {} JWK",
                alg.name()
            ));
        }
    }
    if let Some(own_alg) = jwk_string(jwk, "alg")? {
        if own_alg != alg.name() {
            return Err(format!(
                "the JWK says alg `{own_alg}` but the key entry pins {}",
                alg.name()
            ));
        }
    }
    if let Some(usage) = jwk_string(jwk, "use")? {
        if usage != "sig" {
            return Err(format!("use `{usage}` is not `sig`"));
        }
    }
    if let Some(ops) = jwk.get("key_ops") {
        let allows_verify = ops
            .as_array()
            .is_some_and(|ops| ops.iter().any(|op| op.as_str() == Some("verify")));
        if !allows_verify {
            return Err("key_ops does not include `verify`".to_owned());
        }
    }
    let kid = jwk_string(jwk, "kid")?;
    if kid.is_some_and(str::is_empty) {
        return Err("kid must not be empty".to_owned());
    }
    let key = match alg {
        TokenAlg::EdDsa => {
            expect_curve(jwk, "Ed25519")?;
            ed25519_key(&jwk_bytes(jwk, "x")?)?
        }
        TokenAlg::Es256 => {
            expect_curve(jwk, "P-256")?;
            let x = jwk_bytes(jwk, "x")?;
            let y = jwk_bytes(jwk, "y")?;
            if x.len() != 32 || y.len() != 32 {
                return Err("P-256 coordinates must be 32 bytes each".to_owned());
            }
            let key = DecodingKey::from_ec_components(
                &URL_SAFE_NO_PAD.encode(&x),
                &URL_SAFE_NO_PAD.encode(&y),
            )
            .map_err(|err| format!("EC key unusable: {err}"))?;
            probe(&key, alg).map_err(|err| format!("not a P-256 point: {err}"))?;
            key
        }
        TokenAlg::Rs256 => rsa_key(&jwk_bytes(jwk, "n")?, &jwk_bytes(jwk, "e")?)?,
        TokenAlg::Hs256 => return Err("HS256 is not loaded from a JWKS".to_owned()),
    };
    Ok(PinnedKey {
        alg,
        kid: kid.map(str::to_owned),
        key,
    })
}

fn jwk_string<'a>(jwk: &'a Map<String, Value>, name: &str) -> Result<Option<&'a str>, String> {
    match jwk.get(name) {
        None => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(_) => Err(format!("`{name}` is not a string")),
    }
}

fn jwk_bytes(jwk: &Map<String, Value>, name: &str) -> Result<Vec<u8>, String> {
    let text = jwk_string(jwk, name)?.ok_or_else(|| format!("`{name}` is missing"))?;
    URL_SAFE_NO_PAD
        .decode(text)
        .map_err(|err| format!("`{name}` is not unpadded base64url: {err}"))
}

fn expect_curve(jwk: &Map<String, Value>, curve: &str) -> Result<(), String> {
    match jwk_string(jwk, "crv")? {
        Some(found) if found == curve => Ok(()),
        Some(found) => Err(format!("crv `{found}` is not {curve}")),
        None => Err(format!("`crv` is missing (expected {curve})")),
    }
}
