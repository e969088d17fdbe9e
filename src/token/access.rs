//! OAuth access tokens of MCP hosts (SPEC 17): JWTs from the organisation's authorization servers,
//! verified with `mcp_server.keys` (each key pinned to one algorithm, key sets at URLs fetched again for
//! an unknown kid), whose `iss` is one of the configured authorization servers and whose `aud` holds this
//! resource (RFC 8707): a token issued for another resource is refused, the confused-deputy case.

use std::path::Path;
use std::sync::Arc;

use serde_json::{Map, Value};

use super::claims::{check_audience, check_time, optional_seconds, required_seconds};
use super::keys::{KeyConfig, KeySet, KeySource};
use super::{ConfigError, TokenError};
use crate::clock::Round;

/// What a verified access token says of its holder.
#[derive(Debug, Clone)]
pub struct AccessClaims {
    pub iss: String,
    pub sub: String,
    /// `azp`, else `client_id` (RFC 9068), `cid` or `appid`: the host's OAuth client.
    pub client_id: Option<String>,
    pub jti: Option<String>,
    pub scopes: Vec<String>,
    /// Which kind of key verified the token: the person's identity says `via` (SPEC 16).
    pub key_source: KeySource,
    /// Every claim, for the `people` rules that read groups or another claim.
    pub claims: Map<String, Value>,
}

/// Why a bearer token was not accepted: the two answers of RFC 6750 section 3.1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessRefusal {
    /// 401 `invalid_token`: forged, expired, another issuer or resource.
    InvalidToken(String),
    /// 403 `insufficient_scope`: a good token without every required scope.
    InsufficientScope(String),
}

/// Verifies the access tokens of one resource.
pub struct AccessTokenVerifier {
    keys: KeySet,
    issuers: Vec<String>,
    resource: String,
    scopes_required: Vec<String>,
    leeway_secs: u64,
    fetching: tokio::sync::OnceCell<()>,
}

impl AccessTokenVerifier {
    pub fn new(
        keys: &[KeyConfig],
        base_dir: &Path,
        issuers: &[String],
        resource: &str,
        scopes_required: &[String],
        leeway_secs: u64,
    ) -> Result<AccessTokenVerifier, ConfigError> {
        Ok(AccessTokenVerifier {
            keys: KeySet::load(keys, base_dir, "mcp_server")?,
            issuers: issuers.to_vec(),
            resource: resource.to_owned(),
            scopes_required: scopes_required.to_vec(),
            leeway_secs,
            fetching: tokio::sync::OnceCell::new(),
        })
    }

    /// Verifies `token` at `now`, fetching the key sets at URLs first when this is the first token or
    /// it names a kid no key has.
    pub async fn verify(&self, token: &str, now: i64) -> Result<Arc<AccessClaims>, AccessRefusal> {
        self.fetching
            .get_or_init(|| self.keys.start_fetching())
            .await;
        self.keys.fetch_for_unknown_kid(token).await;
        let claims = self
            .authenticate(token, now)
            .map_err(|e| AccessRefusal::InvalidToken(e.to_string()))?;
        let missing: Vec<&str> = self
            .scopes_required
            .iter()
            .filter(|needed| !claims.scopes.contains(needed))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            return Err(AccessRefusal::InsufficientScope(format!(
                "the token lacks the scope {}",
                missing.join(" ")
            )));
        }
        Ok(Arc::new(claims))
    }

    /// Signature, issuer, audience, subject and time, in that order: a forged token that is also
    /// expired reports the forgery.
    fn authenticate(&self, token: &str, now: i64) -> Result<AccessClaims, TokenError> {
        let (claims, key_source) = self.keys.authenticate(token, None)?;
        let iss = match claims.get("iss") {
            Some(Value::String(iss)) if self.issuers.contains(iss) => iss.clone(),
            Some(Value::String(iss)) => {
                return Err(TokenError::Invalid(format!(
                    "the token's issuer `{iss}` is not one of mcp_server.authorization_servers"
                )))
            }
            _ => return Err(TokenError::Invalid("the token has no `iss`".to_owned())),
        };
        check_audience(&claims, &self.resource)?;
        let sub = text(&claims, "sub")?
            .ok_or_else(|| TokenError::Invalid("the token has no `sub`".to_owned()))?;
        let exp = required_seconds(&claims, "exp", Round::Down)?;
        let nbf = optional_seconds(&claims, "nbf", Round::Up)?;
        let client_id = client_of(&claims)?;
        let jti = text(&claims, "jti")?;
        let scopes = scopes(&claims)?;
        check_time(exp, nbf, now, self.leeway_secs)?;
        Ok(AccessClaims {
            iss,
            sub,
            client_id,
            jti,
            scopes,
            key_source,
            claims,
        })
    }
}

/// The host's OAuth client: `azp`, else `client_id` (RFC 9068), else what Okta (`cid`) and Entra ID v1
/// tokens (`appid`) call it.
fn client_of(claims: &Map<String, Value>) -> Result<Option<String>, TokenError> {
    for name in ["azp", "client_id", "cid", "appid"] {
        if let Some(client) = text(claims, name)? {
            return Ok(Some(client));
        }
    }
    Ok(None)
}

/// A claim that is a string when present.
fn text(claims: &Map<String, Value>, name: &str) -> Result<Option<String>, TokenError> {
    match claims.get(name) {
        None => Ok(None),
        Some(Value::String(value)) => Ok(Some(value.clone())),
        Some(_) => Err(TokenError::Invalid(format!(
            "token claim `{name}` is not a string"
        ))),
    }
}

fn split_scopes(list: &str) -> Vec<String> {
    list.split(' ')
        .filter(|scope| !scope.is_empty())
        .map(str::to_owned)
        .collect()
}

/// `scope` (RFC 9068: a space-separated string); without it `scp`, as Entra ID (a string) and Okta (an
/// array of strings) name it.
fn scopes(claims: &Map<String, Value>) -> Result<Vec<String>, TokenError> {
    let (name, value) = match (claims.get("scope"), claims.get("scp")) {
        (Some(value), _) => ("scope", value),
        (None, Some(value)) => ("scp", value),
        (None, None) => return Ok(Vec::new()),
    };
    match value {
        Value::String(list) => Ok(split_scopes(list)),
        Value::Array(items) if items.iter().all(Value::is_string) => Ok(items
            .iter()
            .filter_map(Value::as_str)
            .flat_map(split_scopes)
            .collect()),
        _ => Err(TokenError::Invalid(format!(
            "token claim `{name}` is neither a space-separated string nor an array of strings"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::token::test_support::{ed25519_key_entry, sign_ed};
    use serde_json::json;

    const RESOURCE: &str = "https://gw.example/mcp";

    fn verifier(public_pem: &str) -> AccessTokenVerifier {
        AccessTokenVerifier::new(
            &[ed25519_key_entry(public_pem, None)],
            Path::new("/"),
            &["https://idp.example".to_owned()],
            RESOURCE,
            &["mcp:tools".to_owned()],
            0,
        )
        .unwrap()
    }

    fn good_claims() -> Value {
        json!({"iss": "https://idp.example", "sub": "pat", "aud": [RESOURCE, "other"],
               "exp": 2_000_000_000i64, "scope": "openid mcp:tools", "azp": "host-1", "jti": "t-1"})
    }

    fn check(claims: Value) -> Result<Arc<AccessClaims>, AccessRefusal> {
        let (private_pem, public_pem) = crate::token::ed25519_keypair_pem().unwrap();
        let token = sign_ed(&private_pem, claims);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(verifier(&public_pem).verify(&token, 1_900_000_000))
    }

    fn refused_because(claims: Value) -> String {
        match check(claims) {
            Err(AccessRefusal::InvalidToken(why)) => why,
            other => panic!("expected invalid_token, got {other:?}"),
        }
    }

    #[test]
    fn a_good_token_names_its_holder_client_and_jti() {
        let verified = check(good_claims()).unwrap();
        assert_eq!(verified.sub, "pat");
        assert_eq!(verified.client_id.as_deref(), Some("host-1"));
        assert_eq!(verified.jti.as_deref(), Some("t-1"));
    }

    #[test]
    fn another_resource_issuer_or_a_past_exp_is_an_invalid_token() {
        let mut other_resource = good_claims();
        other_resource["aud"] = json!("https://other.example/mcp");
        assert!(refused_because(other_resource).contains("audience"));
        let mut other_issuer = good_claims();
        other_issuer["iss"] = json!("https://evil.example");
        assert!(refused_because(other_issuer).contains("authorization_servers"));
        let mut expired = good_claims();
        expired["exp"] = json!(1_800_000_000i64);
        assert!(refused_because(expired).contains("expired"));
    }

    #[test]
    fn a_token_without_the_scope_is_insufficient_and_scp_counts_too() {
        let mut no_scope = good_claims();
        no_scope["scope"] = json!("openid");
        assert!(matches!(
            check(no_scope),
            Err(AccessRefusal::InsufficientScope(_))
        ));
        let mut okta = good_claims();
        okta.as_object_mut().unwrap().remove("scope");
        okta["scp"] = json!(["mcp:tools"]);
        assert!(check(okta).is_ok());
        let mut client_id = good_claims();
        client_id.as_object_mut().unwrap().remove("azp");
        client_id["client_id"] = json!("host-2");
        assert_eq!(
            check(client_id).unwrap().client_id.as_deref(),
            Some("host-2")
        );
    }
}
