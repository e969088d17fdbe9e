//! ID tokens of the OpenID provider that signs people in (SPEC 16): verified with the provider's key set
//! at its discovered `jwks_uri`, as a `jwks_url` key entry is (each key pinned to one algorithm, fetched
//! again for an unknown kid, `ca_file` honoured), so `alg: none` and an HS256 token signed with a public
//! key are refused like any other forgery.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Map, Value};

use super::claims::{check_audience, check_time, optional_seconds, required_seconds};
use super::keys::{KeyConfig, KeySet};
use super::OperatorAuthConfig;
use super::{ConfigError, TokenError};
use crate::clock::Round;
use crate::identity::oidc::MakeIdTokenCheck;
use crate::identity::{IdTokenCheck, Oidc};

/// Verifies the ID tokens of one provider for one client.
pub struct IdTokenVerifier {
    keys: KeySet,
    issuer: String,
    client_id: String,
    /// `iat` and `exp` are held to the gateway's clock skew (`limits.max_clock_skew_secs`).
    skew_secs: u64,
    fetching: tokio::sync::OnceCell<()>,
}

impl IdTokenVerifier {
    pub fn new(
        jwks_uri: &str,
        ca_file: Option<PathBuf>,
        issuer: &str,
        client_id: &str,
        skew_secs: u64,
    ) -> Result<IdTokenVerifier, ConfigError> {
        let entry = KeyConfig {
            jwks_url: Some(jwks_uri.to_owned()),
            ca_file,
            ..KeyConfig::default()
        };
        Ok(IdTokenVerifier {
            keys: KeySet::load(&[entry], std::path::Path::new("/"), "operator_auth.oidc")?,
            issuer: issuer.to_owned(),
            client_id: client_id.to_owned(),
            skew_secs,
            fetching: tokio::sync::OnceCell::new(),
        })
    }

    fn verify(
        &self,
        id_token: &str,
        nonce: Option<&str>,
        now: i64,
    ) -> Result<Map<String, Value>, TokenError> {
        let (claims, _) = self.keys.authenticate(id_token, Some(&self.issuer))?;
        check_audience(&claims, &self.client_id)?;
        check_authorized_party(&claims, &self.client_id)?;
        if let Some(expected) = nonce {
            if claims.get("nonce").and_then(Value::as_str) != Some(expected) {
                return Err(TokenError::Invalid(
                    "the ID token's nonce is not the one this sign-in sent".to_owned(),
                ));
            }
        }
        let exp = required_seconds(&claims, "exp", Round::Down)?;
        let iat = required_seconds(&claims, "iat", Round::Down)?;
        let nbf = optional_seconds(&claims, "nbf", Round::Up)?;
        // Just issued by the token endpoint: an `iat` far from now is a token kept from elsewhere.
        if now.abs_diff(iat) > self.skew_secs {
            return Err(TokenError::Expired(format!(
                "the ID token was issued at {iat}, more than {} s from now ({now})",
                self.skew_secs
            )));
        }
        check_time(exp, nbf, now, self.skew_secs)?;
        Ok(claims)
    }
}

/// The OpenID Connect relying party of `operator_auth.oidc`, its ID tokens checked by the provider's
/// key set (fetched from the `jwks_uri` that discovery names); roles without `oidc` are refused, as
/// nobody could hold them. Paths are relative to `base_dir`; `skew_secs` bounds `iat` and `exp`.
pub fn relying_party(
    auth: &OperatorAuthConfig,
    base_dir: &Path,
    skew_secs: u64,
) -> Result<Option<Oidc>, String> {
    let Some(oidc) = &auth.oidc else {
        if auth.roles.is_empty() {
            return Ok(None);
        }
        return Err(
            "operator_auth.roles: needs operator_auth.oidc (roles apply to people who sign in)"
                .to_owned(),
        );
    };
    let (issuer, client_id) = (oidc.issuer.clone(), oidc.client_id.clone());
    let ca_file = oidc.ca_file.as_ref().map(|file| base_dir.join(file));
    let make_check: MakeIdTokenCheck = Box::new(move |jwks_uri| {
        let verifier =
            IdTokenVerifier::new(jwks_uri, ca_file.clone(), &issuer, &client_id, skew_secs)?;
        Ok(Arc::new(verifier))
    });
    Oidc::new(oidc, &auth.roles, base_dir, make_check).map(Some)
}

/// OpenID Connect Core 3.1.3.7: with several audiences, `azp` (when present) must be this client.
fn check_authorized_party(claims: &Map<String, Value>, client_id: &str) -> Result<(), TokenError> {
    match claims.get("azp") {
        None => Ok(()),
        Some(Value::String(azp)) if azp == client_id => Ok(()),
        Some(_) => Err(TokenError::Invalid(format!(
            "the ID token's azp is not `{client_id}`"
        ))),
    }
}

#[async_trait::async_trait]
impl IdTokenCheck for IdTokenVerifier {
    async fn check(
        &self,
        id_token: &str,
        nonce: Option<&str>,
        now_secs: i64,
    ) -> Result<Map<String, Value>, String> {
        // The first sign-in fetches the key set and starts its refreshing.
        self.fetching
            .get_or_init(|| self.keys.start_fetching())
            .await;
        self.keys.fetch_for_unknown_kid(id_token).await;
        self.verify(id_token, nonce, now_secs)
            .map_err(|err| err.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn azp_must_be_this_client_when_present() {
        let claims = |v: Value| v.as_object().unwrap().clone();
        assert!(check_authorized_party(&claims(json!({})), "c").is_ok());
        assert!(check_authorized_party(&claims(json!({"azp": "c"})), "c").is_ok());
        assert!(check_authorized_party(&claims(json!({"azp": "d"})), "c").is_err());
    }
}
