//! Operator tokens for the control API (SPEC section 4): JWTs whose `aud` is the operator audience and
//! whose `scope` claim lists what the caller may do. Refusals become HTTP 401 at the API layer; a
//! missing scope becomes 403 there, through [`OperatorClaims::allows`].

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::claims::{
    check_audience, check_time, optional_seconds, required_seconds, required_string,
    validate_common,
};
use super::keys::{KeyConfig, KeySet, KeySource};
use super::{ConfigError, TokenError};
use crate::clock::Round;

fn default_operator_audience() -> String {
    "sealgate-operators".to_owned()
}

/// `operator_auth` in the configuration file (SPEC section 11).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperatorAuthConfig {
    #[serde(default = "default_operator_audience")]
    pub audience: String,
    /// Checked against `iss` when set.
    #[serde(default)]
    pub issuer: Option<String>,
    #[serde(default)]
    pub keys: Vec<KeyConfig>,
    #[serde(default)]
    pub leeway_secs: u64,
    /// OpenID Connect sign-in for the console and `sealgate login` (SPEC 16).
    #[serde(default)]
    pub oidc: Option<crate::identity::OidcConfig>,
    /// A signed-in person's scopes: the union of the roles whose group they are in (SPEC 16).
    #[serde(default)]
    pub roles: Vec<crate::identity::RoleConfig>,
}

impl Default for OperatorAuthConfig {
    fn default() -> Self {
        OperatorAuthConfig {
            audience: default_operator_audience(),
            issuer: None,
            keys: Vec::new(),
            leeway_secs: 0,
            oidc: None,
            roles: Vec::new(),
        }
    }
}

/// Who the operator is and what the token lets them do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorClaims {
    pub sub: String,
    pub iss: Option<String>,
    /// The token's `name` claim, shown beside the identity.
    pub name: Option<String>,
    /// The `scope` claim split on spaces, each `SCOPE` or `TEAM/SCOPE` (SPEC 16); names this gateway does
    /// not know are kept but grant nothing.
    pub scopes: Vec<String>,
    /// Which kind of key verified the token.
    pub key_source: KeySource,
}

/// Verifies operator tokens against the `operator_auth` keys.
pub struct OperatorVerifier {
    keys: KeySet,
    audience: String,
    issuer: Option<String>,
    leeway_secs: u64,
}

impl OperatorVerifier {
    /// No keys is allowed (the default configuration); every operator request is then refused.
    pub fn new(cfg: &OperatorAuthConfig, base_dir: &Path) -> Result<Self, ConfigError> {
        validate_common("operator_auth", cfg.issuer.as_deref(), cfg.leeway_secs)?;
        if cfg.audience.is_empty() {
            return Err(ConfigError::EmptyAudience("operator_auth"));
        }
        Ok(OperatorVerifier {
            keys: KeySet::load(&cfg.keys, base_dir, "operator_auth")?,
            audience: cfg.audience.clone(),
            issuer: cfg.issuer.clone(),
            leeway_secs: cfg.leeway_secs,
        })
    }

    pub fn key_count(&self) -> usize {
        self.keys.len()
    }

    /// The keys, for the gateway to start their fetching and to ask whether they have arrived.
    pub(crate) fn key_set(&self) -> &KeySet {
        &self.keys
    }

    /// [`OperatorVerifier::verify`], after fetching the key sets at URLs again when the token names a
    /// kid that no key has (at most every 10 s).
    pub async fn verify_with_refresh(
        &self,
        bearer_token: &str,
        now: i64,
    ) -> Result<OperatorClaims, TokenError> {
        self.keys.fetch_for_unknown_kid(bearer_token).await;
        self.verify(bearer_token, now)
    }

    /// `bearer_token` is the token itself (the API layer strips `Bearer `). Same order as agent tokens:
    /// shape, signature, `iss`/`aud`/`sub`/`exp`/`scope`, then time.
    pub fn verify(&self, bearer_token: &str, now: i64) -> Result<OperatorClaims, TokenError> {
        let (claims, key_source) = &self
            .keys
            .authenticate(bearer_token, self.issuer.as_deref())?;
        // The audience is what keeps an agent token (signed by the same key, perhaps) out of the control API.
        check_audience(claims, &self.audience)?;
        let sub = required_string(claims, "sub")?;
        let exp = required_seconds(claims, "exp", Round::Down)?;
        let nbf = optional_seconds(claims, "nbf", Round::Up)?;
        let scopes = match claims.get("scope") {
            None => Vec::new(),
            Some(Value::String(list)) => list
                .split(' ')
                .filter(|name| !name.is_empty())
                .map(str::to_owned)
                .collect(),
            Some(_) => {
                return Err(TokenError::Invalid(
                    "token claim `scope` is not a space-separated string".to_owned(),
                ))
            }
        };
        let iss = optional_text(claims, "iss")?;
        let name = optional_text(claims, "name")?;
        check_time(exp, nbf, now, self.leeway_secs)?;
        Ok(OperatorClaims {
            sub,
            iss,
            name,
            scopes,
            key_source: *key_source,
        })
    }
}

/// A claim that is a string when present.
fn optional_text(
    claims: &serde_json::Map<String, Value>,
    name: &str,
) -> Result<Option<String>, TokenError> {
    match claims.get(name) {
        None => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(_) => Err(TokenError::Invalid(format!(
            "token claim `{name}` is not a string"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::token::test_support::{ed25519_key_entry, sign_ed};
    use crate::token::{AgentTokenConfig, AgentTokenVerifier};
    use serde_json::json;

    fn verifier_with(public_pem: &str) -> OperatorVerifier {
        let cfg = OperatorAuthConfig {
            keys: vec![ed25519_key_entry(public_pem, None)],
            ..OperatorAuthConfig::default()
        };
        OperatorVerifier::new(&cfg, Path::new("/")).expect("operator verifier")
    }

    #[test]
    fn default_audience_is_sealgate_operators() {
        assert_eq!(OperatorAuthConfig::default().audience, "sealgate-operators");
        let parsed: OperatorAuthConfig = serde_json::from_value(json!({})).expect("defaults");
        assert_eq!(parsed, OperatorAuthConfig::default());
        assert!(serde_json::from_value::<OperatorAuthConfig>(json!({"audiense": "x"})).is_err());
    }

    #[test]
    fn scopes_are_split_on_spaces_and_admin_allows_everything() {
        let (private_pem, public_pem) = crate::token::ed25519_keypair_pem().expect("keypair");
        let verifier = verifier_with(&public_pem);
        let token = sign_ed(
            &private_pem,
            json!({"sub": "ops", "aud": "sealgate-operators", "exp": 200,
                   "scope": "seal.session.read  seal.audit.read other.scope"}),
        );
        let claims = verifier.verify(&token, 100).expect("valid");
        assert_eq!(claims.sub, "ops");
        assert_eq!(
            claims.scopes,
            ["seal.session.read", "seal.audit.read", "other.scope"]
        );
        assert_eq!(claims.key_source, KeySource::Configured);

        let admin = sign_ed(
            &private_pem,
            json!({"sub": "root", "aud": ["x", "sealgate-operators"], "exp": 200, "scope": "seal.admin"}),
        );
        let claims = verifier.verify(&admin, 100).expect("valid");
        assert_eq!(claims.scopes, ["seal.admin"]);
    }

    #[test]
    fn missing_scope_is_a_valid_token_that_allows_nothing() {
        let (private_pem, public_pem) = crate::token::ed25519_keypair_pem().expect("keypair");
        let token = sign_ed(
            &private_pem,
            json!({"sub": "ops", "aud": "sealgate-operators", "exp": 200}),
        );
        let claims = verifier_with(&public_pem)
            .verify(&token, 100)
            .expect("valid");
        assert!(claims.scopes.is_empty());
    }

    #[test]
    fn operator_claims_are_required_and_typed() {
        let (private_pem, public_pem) = crate::token::ed25519_keypair_pem().expect("keypair");
        let verifier = verifier_with(&public_pem);
        let cases = [
            (json!({"aud": "sealgate-operators", "exp": 200}), "`sub`"),
            (json!({"sub": "o", "aud": "sealgate-operators"}), "`exp`"),
            (json!({"sub": "o", "exp": 200}), "`aud`"),
            (
                json!({"sub": "o", "aud": "sealgate-agents", "exp": 200}),
                "audience",
            ),
            (
                json!({"sub": "o", "aud": "sealgate-operators", "exp": 200, "scope": ["seal.admin"]}),
                "`scope`",
            ),
            (
                json!({"sub": "o", "aud": "sealgate-operators", "exp": 200, "name": 7}),
                "`name`",
            ),
        ];
        for (claims, expected) in cases {
            match verifier.verify(&sign_ed(&private_pem, claims.clone()), 100) {
                Err(TokenError::Invalid(message)) => {
                    assert!(message.contains(expected), "{claims}: {message}")
                }
                other => panic!("{claims}: expected Invalid, got {other:?}"),
            }
        }
    }

    #[test]
    fn operator_tokens_expire_and_honour_nbf() {
        let (private_pem, public_pem) = crate::token::ed25519_keypair_pem().expect("keypair");
        let verifier = verifier_with(&public_pem);
        let token = sign_ed(
            &private_pem,
            json!({"sub": "o", "aud": "sealgate-operators", "exp": 200, "nbf": 150}),
        );
        assert!(matches!(
            verifier.verify(&token, 200),
            Err(TokenError::Expired(_))
        ));
        assert!(matches!(
            verifier.verify(&token, 149),
            Err(TokenError::Expired(_))
        ));
        assert!(verifier.verify(&token, 150).is_ok());
    }

    #[test]
    fn agent_token_is_never_an_operator_token_even_with_a_shared_key() {
        let (private_pem, public_pem) = crate::token::ed25519_keypair_pem().expect("keypair");
        let operators = verifier_with(&public_pem);
        let agents = AgentTokenVerifier::new(
            &AgentTokenConfig {
                audience: Some("sealgate-agents".into()),
                keys: vec![ed25519_key_entry(&public_pem, None)],
                ..AgentTokenConfig::default()
            },
            Path::new("/"),
        )
        .expect("agent verifier");
        let agent_token = sign_ed(
            &private_pem,
            json!({"sub": "agent-7", "scp": "rt", "exec_id": "e", "jti": "j", "iat": 1, "exp": 200,
                   "aud": "sealgate-agents", "scope": "seal.admin"}),
        );
        assert!(agents.verify(&agent_token, 100).is_ok());
        assert!(matches!(
            operators.verify(&agent_token, 100),
            Err(TokenError::Invalid(_))
        ));
        // And without any aud the operator verifier refuses it too.
        let no_aud = sign_ed(
            &private_pem,
            json!({"sub": "agent-7", "scp": "rt", "exec_id": "e", "jti": "j", "iat": 1, "exp": 200, "scope": "seal.admin"}),
        );
        assert!(matches!(
            operators.verify(&no_aud, 100),
            Err(TokenError::Invalid(_))
        ));
    }

    #[test]
    fn operator_issuer_is_checked_when_configured() {
        let (private_pem, public_pem) = crate::token::ed25519_keypair_pem().expect("keypair");
        let cfg = OperatorAuthConfig {
            issuer: Some("idp".into()),
            keys: vec![ed25519_key_entry(&public_pem, None)],
            ..OperatorAuthConfig::default()
        };
        let verifier = OperatorVerifier::new(&cfg, Path::new("/")).expect("verifier");
        let base = json!({"sub": "o", "aud": "sealgate-operators", "exp": 200});
        let mut good = base.clone();
        good["iss"] = json!("idp");
        let mut bad = base.clone();
        bad["iss"] = json!("evil");
        assert!(verifier.verify(&sign_ed(&private_pem, good), 100).is_ok());
        assert!(matches!(
            verifier.verify(&sign_ed(&private_pem, bad), 100),
            Err(TokenError::Invalid(_))
        ));
        assert!(matches!(
            verifier.verify(&sign_ed(&private_pem, base), 100),
            Err(TokenError::Invalid(_))
        ));
    }

    #[test]
    fn no_keys_refuses_everything_and_empty_audience_is_a_config_error() {
        let verifier =
            OperatorVerifier::new(&OperatorAuthConfig::default(), Path::new("/")).expect("empty");
        assert_eq!(verifier.key_count(), 0);
        let (private_pem, _) = crate::token::ed25519_keypair_pem().expect("keypair");
        let token = sign_ed(
            &private_pem,
            json!({"sub": "o", "aud": "sealgate-operators", "exp": 200}),
        );
        assert!(matches!(
            verifier.verify(&token, 100),
            Err(TokenError::Invalid(_))
        ));
        let cfg = OperatorAuthConfig {
            audience: String::new(),
            ..OperatorAuthConfig::default()
        };
        assert!(OperatorVerifier::new(&cfg, Path::new("/")).is_err());
    }
}
