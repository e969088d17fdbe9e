//! JWTs: agent tokens (SPEC section 4, checks 2–4 of section 3), operator tokens for the control API, and
//! the gateway's own minting of agent tokens (SPEC section 5).
//!
//! Every configured key is pinned to one algorithm; a token's header only chooses among keys that were
//! configured for the algorithm it names, never the algorithm a key is used with. Checks run in SPEC order
//! (shape → signature and claims → time), so a token that is both forged and expired reports the forgery.
//! All key bytes and JWT crypto stay inside this module.

mod access;
mod agent;
mod cache;
mod claims;
pub mod cli;
mod id_token;
mod jwks_url;
mod jwt;
mod key_material;
mod keys;
mod mint;
mod operator;
#[cfg(test)]
mod test_support;

use std::path::PathBuf;

use claims::MAX_LEEWAY_SECS;
use jwks_url::{MAX_GRACE_SECS, MAX_REFRESH_SECS};
use key_material::{KeyMaterialError, TokenAlg};

pub use crate::identity::scopes;
pub use access::{AccessClaims, AccessRefusal, AccessTokenVerifier};
pub use agent::{AgentClaims, AgentTokenConfig, AgentTokenVerifier};
pub use id_token::{relying_party, IdTokenVerifier};
pub use keys::{KeyConfig, KeySource};
pub use mint::{
    ed25519_keypair_pem, key_id, sign_eddsa, sign_eddsa_for_tests_and_cli, MintError,
    NewAgentToken, NewOperatorToken, TokenMinter,
};
pub use operator::{OperatorAuthConfig, OperatorClaims, OperatorVerifier};

/// Why a token was refused. The message is precise and safe to show to the caller (it never holds key
/// material); the variant decides the SPEC code (`crate::error` maps it; operator refusals are HTTP
/// 401 / 6001 instead).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Checks 2 and 3: the token is malformed, badly signed, or lacks a required claim (code 1004).
    #[error("{0}")]
    Invalid(String),
    /// Check 4: the token is past `exp` + leeway, or its `nbf` lies in the future (code 1003).
    #[error("{0}")]
    Expired(String),
}

/// Why a token section of the configuration (its keys, issuer, audience, leeway) cannot be used. The
/// message names the entry (`agent_tokens.keys[0]: …`) and never holds a secret.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// One key entry, named by its place in the configuration.
    #[error("{place}: {source}")]
    Entry {
        place: String,
        source: Box<ConfigError>,
    },
    #[error("alg `{0}` is not supported (use EdDSA, ES256, RS256 or HS256)")]
    UnsupportedAlg(String),
    #[error("alg is required (EdDSA, ES256, RS256 or HS256)")]
    NoAlg,
    #[error("exactly one of public_key_pem, public_key_pem_file, jwks_file, jwks_url, secret must be set ({0} are)")]
    SourceCount(usize),
    #[error("no key source is set")]
    NoSource,
    #[error("kid must not be empty")]
    EmptyKid,
    #[error("kid `{0}` is used by more than one key")]
    DuplicateKid(String),
    /// `jwks_url` or `jwks_file`, whose JWKs carry their own kid.
    #[error("kid cannot be set with {0}; the JWKs carry their own kid")]
    KidWithJwks(&'static str),
    #[error("refresh_secs, grace_secs and ca_file apply only to a jwks_url entry")]
    UrlOptionsWithoutUrl,
    #[error("alg HS256 needs `secret` (and only `secret`)")]
    NoSecret,
    #[error("`secret` is only allowed with alg HS256, not {}", .0.name())]
    SecretWithAlg(TokenAlg),
    #[error("HS256 secret is empty")]
    EmptySecret,
    #[error("HS256 secret is unusable: {0}")]
    UnusableSecret(jsonwebtoken::errors::Error),
    /// `field` is the configuration field that names the file.
    #[error("{field}: cannot read {}: {source}", path.display())]
    Read {
        field: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("public_key_pem: {0}")]
    Pem(KeyMaterialError),
    /// `field` is `public_key_pem_file` or `jwks_file`.
    #[error("{field} {}: {source}", path.display())]
    KeyFile {
        field: &'static str,
        path: PathBuf,
        source: KeyMaterialError,
    },
    #[error(transparent)]
    KeyMaterial(#[from] KeyMaterialError),
    #[error("jwks_url is not a valid URL: {0}")]
    NotAUrl(url::ParseError),
    #[error("jwks_url has no host")]
    NoHost,
    /// Not `https://`, nor `http://` on a loopback host.
    #[error("jwks_url: {0}")]
    UrlRefused(String),
    #[error("refresh_secs is {0}; 1 to {MAX_REFRESH_SECS} are accepted")]
    RefreshSecs(u64),
    #[error("grace_secs is {0}; 1 to {MAX_GRACE_SECS} are accepted")]
    GraceSecs(u64),
    #[error("refresh_secs ({refresh}) must be less than grace_secs ({grace}), or the keys would expire between two routine fetches")]
    RefreshNotBelowGrace { refresh: u64, grace: u64 },
    #[error("ca_file applies only to an https:// jwks_url")]
    CaFileWithoutHttps,
    /// The CA file of a `jwks_url` cannot be read or holds no certificate.
    #[error("{0}")]
    CaFile(String),
    #[error("cannot build the JWKS client: {0}")]
    Client(reqwest::Error),
    /// `section` is `agent_tokens` or `operator_auth`.
    #[error("{0}.issuer must not be empty")]
    EmptyIssuer(&'static str),
    #[error("{0}.audience must not be empty")]
    EmptyAudience(&'static str),
    #[error("{section}.leeway_secs is {secs}; at most {MAX_LEEWAY_SECS} is allowed")]
    Leeway { section: &'static str, secs: u64 },
    #[error(transparent)]
    IssuerKey(#[from] MintError),
}

// The gateway's start-up, `sealgate config check`, the MCP server and the sign-in still answer
// `String`; they keep using `?` on configuration errors until their own errors are typed.
impl From<ConfigError> for String {
    fn from(error: ConfigError) -> Self {
        error.to_string()
    }
}

// The verifiers and the minter live in shared server state; this fails to compile if that breaks.
const _: fn() = || {
    fn shared<T: Send + Sync>() {}
    shared::<AgentTokenVerifier>();
    shared::<OperatorVerifier>();
    shared::<TokenMinter>();
};
