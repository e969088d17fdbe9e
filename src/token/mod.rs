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

// The verifiers and the minter live in shared server state; this fails to compile if that breaks.
const _: fn() = || {
    fn shared<T: Send + Sync>() {}
    shared::<AgentTokenVerifier>();
    shared::<OperatorVerifier>();
    shared::<TokenMinter>();
};
