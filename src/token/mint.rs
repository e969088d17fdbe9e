//! Minting tokens: agent tokens with the gateway's own Ed25519 key (`agent_tokens.issuer_key`, SPEC
//! sections 4 and 5), the claims of both token kinds (shared by the gateway and `sealgate token`), and
//! the EdDSA signing that the CLI, the demo and tests use.

use std::fmt;
use std::path::Path;

use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{spki, EncodePrivateKey, EncodePublicKey};
use ed25519_dalek::{SigningKey, VerifyingKey};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::keys::{resolve, KeyConfig};
use super::AgentTokenConfig;
use crate::envelope::{KeyError, RandomUnavailable};
use crate::identity::{scopes, TeamScope};

/// Why no token (or no minter) was made: a claim the verifier would refuse, an unusable key, or a
/// failure of the signing itself.
#[derive(Debug, thiserror::Error)]
pub enum MintError {
    #[error("cannot mint a token with an empty `{0}`")]
    EmptyClaim(&'static str),
    #[error("cannot mint a token that expires at {exp}, not after now ({iat})")]
    NotAfterNow { iat: i64, exp: i64 },
    #[error("--ttl reaches past the end of time")]
    EndOfTime,
    #[error("an operator token needs at least one scope (one of: {})", scopes::ALL.join(" "))]
    NoScope,
    /// A `TEAM/SCOPE` whose team part is not a team name.
    #[error("{0}")]
    TeamScope(String),
    #[error("unknown scope `{0}` (known: {known})", known = scopes::ALL.join(" "))]
    UnknownScope(String),
    #[error("token claims must be a JSON object")]
    ClaimsNotAnObject,
    /// The configured `issuer_key` cannot be read as an Ed25519 private key.
    #[error("agent_tokens.issuer_key: {0}")]
    IssuerKey(KeyError),
    /// The `issuer_key` at `path` was read but cannot sign.
    #[error("agent_tokens.issuer_key {}: {source}", path.display())]
    IssuerKeyUnusable {
        path: std::path::PathBuf,
        source: Box<MintError>,
    },
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error("cannot encode the private key: {0}")]
    EncodePrivate(ed25519_dalek::pkcs8::Error),
    #[error("cannot encode the public key: {0}")]
    EncodePublic(spki::Error),
    #[error("cannot sign the token: {0}")]
    Sign(jsonwebtoken::errors::Error),
    #[error(transparent)]
    Random(#[from] RandomUnavailable),
}

// The verifiers' loading, the demo, the benchmark and the CLI still answer `String`; they keep using
// `?` on minting errors until their own errors are typed.
impl From<MintError> for String {
    fn from(error: MintError) -> Self {
        error.to_string()
    }
}

/// Signs agent tokens for sessions (EdDSA). The private key never leaves this value.
pub struct TokenMinter {
    encoding_key: EncodingKey,
    public_key_pem: String,
    kid: String,
    issuer: Option<String>,
    audience: Option<String>,
}

// Hand-written so that no key bytes reach a log line.
impl fmt::Debug for TokenMinter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenMinter")
            .field("kid", &self.kid)
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .finish_non_exhaustive()
    }
}

impl TokenMinter {
    /// `Ok(None)` when `issuer_key` is not configured; an error when it is set but unreadable or not an
    /// Ed25519 private key (any form `sealgate sign --key` reads, keygen's JSON included).
    pub fn from_config(cfg: &AgentTokenConfig, base_dir: &Path) -> Result<Option<Self>, MintError> {
        let Some(path) = &cfg.issuer_key else {
            return Ok(None);
        };
        let full = resolve(base_dir, path);
        let signing_key =
            crate::envelope::read_signing_key_file(&full).map_err(MintError::IssuerKey)?;
        let minter = Self::from_signing_key(&signing_key, cfg.issuer.clone(), cfg.audience.clone())
            .map_err(|source| MintError::IssuerKeyUnusable {
                path: full,
                source: Box::new(source),
            })?;
        Ok(Some(minter))
    }

    fn from_signing_key(
        signing_key: &SigningKey,
        issuer: Option<String>,
        audience: Option<String>,
    ) -> Result<Self, MintError> {
        let encoding_key = encoding_key(signing_key)?;
        let verifying_key = signing_key.verifying_key();
        let public_key_pem = verifying_key
            .to_public_key_pem(LineEnding::LF)
            .map_err(MintError::EncodePublic)?;
        Ok(TokenMinter {
            encoding_key,
            public_key_pem,
            kid: key_id(&verifying_key),
            issuer,
            audience,
        })
    }

    /// A token for one session: `iat` = `now`, `exp` = `expires_at`, a random (UUID v4) `jti`, and
    /// `iss`/`aud` from the configuration when set.
    pub fn mint(
        &self,
        sub: &str,
        scp: &str,
        exec_id: &str,
        wid: Option<&str>,
        expires_at: i64,
        now: i64,
    ) -> Result<String, MintError> {
        let claims = NewAgentToken {
            sub,
            scp,
            exec_id,
            wid,
            iss: self.issuer.as_deref(),
            aud: self.audience.as_deref(),
            iat: now,
            exp: expires_at,
        }
        .claims()?;
        encode_eddsa(&claims, Some(&self.kid), &self.encoding_key)
    }

    /// The public half as a key entry (alg EdDSA, inline PEM, this minter's kid).
    /// `AgentTokenVerifier::new` already adds it when `issuer_key` is set.
    pub fn verifying_key_config(&self) -> KeyConfig {
        KeyConfig {
            alg: Some("EdDSA".to_owned()),
            kid: Some(self.kid.clone()),
            public_key_pem: Some(self.public_key_pem.clone()),
            ..KeyConfig::default()
        }
    }
}

/// The claims of an agent token (SPEC section 4), as the gateway mints them at registration and
/// `sealgate token agent` mints them for an orchestrator.
#[derive(Debug, Clone, Copy)]
pub struct NewAgentToken<'a> {
    pub sub: &'a str,
    pub scp: &'a str,
    pub exec_id: &'a str,
    pub wid: Option<&'a str>,
    pub iss: Option<&'a str>,
    pub aud: Option<&'a str>,
    pub iat: i64,
    pub exp: i64,
}

impl NewAgentToken<'_> {
    /// The claim set with a fresh random (UUID v4) `jti`. Refuses empty values, which the verifier would
    /// refuse, and a token that is expired when minted.
    pub fn claims(&self) -> Result<Map<String, Value>, MintError> {
        for (name, value) in [
            ("sub", self.sub),
            ("scp", self.scp),
            ("exec_id", self.exec_id),
        ] {
            if value.is_empty() {
                return Err(MintError::EmptyClaim(name));
            }
        }
        for (name, value) in [("wid", self.wid), ("iss", self.iss), ("aud", self.aud)] {
            if value == Some("") {
                return Err(MintError::EmptyClaim(name));
            }
        }
        check_lifetime(self.iat, self.exp)?;
        let mut claims = Map::new();
        claims.insert("sub".into(), self.sub.into());
        claims.insert("scp".into(), self.scp.into());
        claims.insert("exec_id".into(), self.exec_id.into());
        if let Some(wid) = self.wid {
            claims.insert("wid".into(), wid.into());
        }
        claims.insert("jti".into(), random_uuid()?.into());
        claims.insert("iat".into(), self.iat.into());
        claims.insert("exp".into(), self.exp.into());
        if let Some(issuer) = self.iss {
            claims.insert("iss".into(), issuer.into());
        }
        if let Some(audience) = self.aud {
            claims.insert("aud".into(), audience.into());
        }
        Ok(claims)
    }
}

/// The claims of an operator token for the control API (SPEC section 4), as `sealgate token operator`
/// mints them.
#[derive(Debug, Clone, Copy)]
pub struct NewOperatorToken<'a> {
    pub sub: &'a str,
    pub aud: &'a str,
    pub iss: Option<&'a str>,
    /// Space-separated scope names; every one must be a scope the gateway knows.
    pub scope: &'a str,
    pub iat: i64,
    pub exp: i64,
}

impl NewOperatorToken<'_> {
    /// The claim set with a fresh random `jti` and `scope` rewritten with single spaces. A scope the
    /// gateway does not know would grant nothing, so it is refused here rather than found at a 403.
    pub fn claims(&self) -> Result<Map<String, Value>, MintError> {
        for (name, value) in [
            ("sub", Some(self.sub)),
            ("aud", Some(self.aud)),
            ("iss", self.iss),
        ] {
            if value == Some("") {
                return Err(MintError::EmptyClaim(name));
            }
        }
        let names: Vec<&str> = self.scope.split_whitespace().collect();
        if names.is_empty() {
            return Err(MintError::NoScope);
        }
        for name in &names {
            // `TEAM/SCOPE` binds a scope to one team (SPEC 16).
            let scope = TeamScope::parse(name).map_err(MintError::TeamScope)?.scope;
            if !scopes::ALL.contains(&scope.as_str()) {
                return Err(MintError::UnknownScope(scope));
            }
        }
        check_lifetime(self.iat, self.exp)?;
        let mut claims = Map::new();
        claims.insert("sub".into(), self.sub.into());
        claims.insert("aud".into(), self.aud.into());
        claims.insert("scope".into(), names.join(" ").into());
        claims.insert("jti".into(), random_uuid()?.into());
        claims.insert("iat".into(), self.iat.into());
        claims.insert("exp".into(), self.exp.into());
        if let Some(issuer) = self.iss {
            claims.insert("iss".into(), issuer.into());
        }
        Ok(claims)
    }
}

fn check_lifetime(iat: i64, exp: i64) -> Result<(), MintError> {
    if exp <= iat {
        return Err(MintError::NotAfterNow { iat, exp });
    }
    Ok(())
}

/// Signs `claims` as an EdDSA JWT with `kid` in the header when given.
pub fn sign_eddsa(
    key: &SigningKey,
    claims: &Map<String, Value>,
    kid: Option<&str>,
) -> Result<String, MintError> {
    encode_eddsa(claims, kid, &encoding_key(key)?)
}

/// A stable kid derived from the public key, so verifiers can pick a key without trying the others.
pub fn key_id(key: &VerifyingKey) -> String {
    let fingerprint = hex::encode(Sha256::digest(key.as_bytes()));
    format!("sealgate-{}", fingerprint.get(..16).unwrap_or(&fingerprint))
}

/// Signs `claims` (a JSON object) as an EdDSA JWT with `kid` in the header when given. For tests, the
/// demo and the benchmark; the gateway itself mints through [`TokenMinter`].
pub fn sign_eddsa_for_tests_and_cli(
    private_key: &str,
    claims: &Value,
    kid: Option<&str>,
) -> Result<String, MintError> {
    let Value::Object(claims) = claims else {
        return Err(MintError::ClaimsNotAnObject);
    };
    let signing_key = crate::envelope::signing_key_from_text(private_key)?;
    sign_eddsa(&signing_key, claims, kid)
}

/// A fresh Ed25519 key pair from OS randomness: (private PKCS#8 v1 PEM, public SPKI PEM).
/// Returns an error instead of panicking when the OS cannot supply randomness.
pub fn ed25519_keypair_pem() -> Result<(String, String), KeyError> {
    let signing_key = crate::envelope::generate_signing_key()?;
    Ok((
        crate::envelope::signing_key_to_pkcs8_pem(&signing_key)?,
        crate::envelope::public_key_pem(&signing_key.verifying_key())?,
    ))
}

fn encoding_key(signing_key: &SigningKey) -> Result<EncodingKey, MintError> {
    let der = signing_key
        .to_pkcs8_der()
        .map_err(MintError::EncodePrivate)?;
    Ok(EncodingKey::from_ed_der(der.as_bytes()))
}

fn encode_eddsa(
    claims: &Map<String, Value>,
    kid: Option<&str>,
    key: &EncodingKey,
) -> Result<String, MintError> {
    let mut header = Header::new(Algorithm::EdDSA);
    header.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&header, claims, key).map_err(MintError::Sign)
}

fn random_uuid() -> Result<String, RandomUnavailable> {
    let mut bytes = [0u8; 16];
    getrandom::getrandom(&mut bytes).map_err(RandomUnavailable)?;
    Ok(uuid::Builder::from_random_bytes(bytes)
        .into_uuid()
        .hyphenated()
        .to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::token::{AgentTokenVerifier, TokenError};
    use serde_json::json;

    fn minter_in(
        dir: &Path,
        issuer: Option<&str>,
        audience: Option<&str>,
    ) -> (AgentTokenConfig, TokenMinter) {
        let (private_pem, _) = ed25519_keypair_pem().expect("keypair");
        std::fs::write(dir.join("issuer.pem"), private_pem).expect("write key");
        let cfg = AgentTokenConfig {
            issuer: issuer.map(str::to_owned),
            audience: audience.map(str::to_owned),
            issuer_key: Some("issuer.pem".into()),
            ..AgentTokenConfig::default()
        };
        let minter = TokenMinter::from_config(&cfg, dir)
            .expect("loads")
            .expect("configured");
        (cfg, minter)
    }

    #[test]
    fn no_issuer_key_means_no_minter() {
        let dir = tempfile::tempdir().expect("tempdir");
        let minted = TokenMinter::from_config(&AgentTokenConfig::default(), dir.path());
        assert!(matches!(minted, Ok(None)));
    }

    #[test]
    fn minted_tokens_round_trip_through_the_verifier() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (cfg, minter) = minter_in(dir.path(), Some("orchestrator"), Some("sealgate-agents"));
        // The verifier trusts the minting key by itself: cfg.keys is empty.
        let verifier = AgentTokenVerifier::new(&cfg, dir.path()).expect("verifier");
        assert_eq!(verifier.key_count(), 1);
        let token = minter
            .mint(
                "agent-7",
                "agent-runtime",
                "exec-42",
                Some("c-1"),
                2_000,
                1_000,
            )
            .expect("mints");
        let claims = verifier.verify(&token, 1_500).expect("verifies");
        assert_eq!(claims.sub, "agent-7");
        assert_eq!(claims.scp, "agent-runtime");
        assert_eq!(claims.exec_id, "exec-42");
        assert_eq!(claims.wid.as_deref(), Some("c-1"));
        assert_eq!((claims.iat, claims.exp, claims.nbf), (1_000, 2_000, None));
        assert!(uuid::Uuid::parse_str(&claims.jti).is_ok_and(|id| id.get_version_num() == 4));
        assert!(matches!(
            verifier.verify(&token, 2_000),
            Err(TokenError::Expired(_))
        ));
    }

    #[test]
    fn minted_tokens_carry_iss_aud_and_a_kid_and_fresh_jtis() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, minter) = minter_in(dir.path(), Some("orchestrator"), Some("sealgate-agents"));
        let first = minter
            .mint("a", "s", "e", None, 2_000, 1_000)
            .expect("mints");
        let second = minter
            .mint("a", "s", "e", None, 2_000, 1_000)
            .expect("mints");
        let parsed = crate::token::jwt::parse(&first).expect("parses");
        assert_eq!(parsed.alg, "EdDSA");
        assert_eq!(
            parsed.kid.as_deref(),
            minter.verifying_key_config().kid.as_deref()
        );
        assert_eq!(parsed.claims.get("iss"), Some(&json!("orchestrator")));
        assert_eq!(parsed.claims.get("aud"), Some(&json!("sealgate-agents")));
        assert!(!parsed.claims.contains_key("wid"));
        let other = crate::token::jwt::parse(&second).expect("parses");
        assert_ne!(parsed.claims.get("jti"), other.claims.get("jti"));
    }

    #[test]
    fn verifying_key_config_is_an_eddsa_inline_pem_entry() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, minter) = minter_in(dir.path(), None, None);
        let entry = minter.verifying_key_config();
        assert_eq!(entry.alg.as_deref(), Some("EdDSA"));
        assert!(entry
            .public_key_pem
            .as_deref()
            .is_some_and(|pem| pem.starts_with("-----BEGIN PUBLIC KEY-----")));
        assert!(
            entry.public_key_pem_file.is_none()
                && entry.jwks_file.is_none()
                && entry.secret.is_none()
        );
        // Adding it explicitly as well is harmless: the identical entry is not loaded twice.
        let cfg = AgentTokenConfig {
            keys: vec![entry],
            issuer_key: Some("issuer.pem".into()),
            ..AgentTokenConfig::default()
        };
        let verifier = AgentTokenVerifier::new(&cfg, dir.path()).expect("verifier");
        assert_eq!(verifier.key_count(), 1);
    }

    #[test]
    fn minting_refuses_empty_claims_and_dead_on_arrival_tokens() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, minter) = minter_in(dir.path(), None, None);
        assert!(minter.mint("", "s", "e", None, 2, 1).is_err());
        assert!(minter.mint("a", "", "e", None, 2, 1).is_err());
        assert!(minter.mint("a", "s", "", None, 2, 1).is_err());
        assert!(minter.mint("a", "s", "e", Some(""), 2, 1).is_err());
        assert!(minter.mint("a", "s", "e", None, 1, 1).is_err());
    }

    #[test]
    fn bad_issuer_keys_are_config_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = AgentTokenConfig {
            issuer_key: Some("nope.pem".into()),
            ..AgentTokenConfig::default()
        };
        let err = TokenMinter::from_config(&missing, dir.path())
            .expect_err("missing file")
            .to_string();
        assert!(err.contains("cannot read"), "{err}");
        let (_, public_pem) = ed25519_keypair_pem().expect("keypair");
        std::fs::write(dir.path().join("public.pem"), public_pem).expect("write");
        let public = AgentTokenConfig {
            issuer_key: Some("public.pem".into()),
            ..AgentTokenConfig::default()
        };
        let err = TokenMinter::from_config(&public, dir.path())
            .expect_err("public key")
            .to_string();
        assert!(err.contains("must be a PKCS#8 block"), "{err}");
        let rsa = AgentTokenConfig {
            issuer_key: Some(
                Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/keys/rs256.private.pem"),
            ),
            ..AgentTokenConfig::default()
        };
        assert!(TokenMinter::from_config(&rsa, dir.path()).is_err());
    }

    #[test]
    fn signing_helper_needs_an_object_and_an_ed25519_key() {
        let (private_pem, _) = ed25519_keypair_pem().expect("keypair");
        assert!(sign_eddsa_for_tests_and_cli(&private_pem, &json!([1]), None).is_err());
        assert!(sign_eddsa_for_tests_and_cli("not a pem", &json!({}), None).is_err());
        let token =
            sign_eddsa_for_tests_and_cli(&private_pem, &json!({"x": 1}), Some("k")).expect("signs");
        let parsed = crate::token::jwt::parse(&token).expect("parses");
        assert_eq!(
            (parsed.alg.as_str(), parsed.kid.as_deref()),
            ("EdDSA", Some("k"))
        );
    }

    #[test]
    fn debug_output_shows_no_key_material() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (_, minter) = minter_in(dir.path(), None, None);
        let shown = format!("{minter:?}");
        assert!(shown.contains("sealgate-") && !shown.contains("BEGIN"));
    }
    fn operator_token(scope: &str) -> NewOperatorToken<'_> {
        NewOperatorToken {
            sub: "ops",
            aud: "sealgate-operators",
            iss: Some("idp"),
            scope,
            iat: 1_000,
            exp: 2_000,
        }
    }

    #[test]
    fn operator_tokens_round_trip_through_the_operator_verifier() {
        let key = crate::envelope::generate_signing_key().expect("key");
        let public_pem = crate::envelope::public_key_pem(&key.verifying_key()).expect("pem");
        let cfg = crate::token::OperatorAuthConfig {
            issuer: Some("idp".into()),
            keys: vec![crate::token::test_support::ed25519_key_entry(
                &public_pem,
                None,
            )],
            ..Default::default()
        };
        let verifier = crate::token::OperatorVerifier::new(&cfg, Path::new("/")).expect("verifier");
        let claims = operator_token("  seal.session.create\tseal.audit.read ")
            .claims()
            .expect("claims");
        assert_eq!(
            claims["scope"],
            json!("seal.session.create seal.audit.read")
        );
        let token = sign_eddsa(&key, &claims, None).expect("signs");
        let verified = verifier.verify(&token, 1_500).expect("verifies");
        assert_eq!(verified.sub, "ops");
        assert_eq!(
            verified.scopes,
            [scopes::SESSION_CREATE, scopes::AUDIT_READ]
        );
        assert!(verifier.verify(&token, 2_000).is_err());
    }

    #[test]
    fn operator_tokens_refuse_unknown_or_missing_scopes_and_empty_claims() {
        let err = operator_token("seal.session.create seal.sesion.read")
            .claims()
            .expect_err("misspelt")
            .to_string();
        assert!(err.contains("unknown scope `seal.sesion.read`"), "{err}");
        assert!(operator_token("payments/seal.approval.decide")
            .claims()
            .is_ok());
        let err = operator_token("payments/seal.aproval.decide")
            .claims()
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown scope `seal.aproval.decide`"), "{err}");
        let err = operator_token("pay.ments/seal.admin")
            .claims()
            .unwrap_err()
            .to_string();
        assert!(err.contains("not a team name"), "{err}");
        assert!(operator_token("  ")
            .claims()
            .expect_err("none")
            .to_string()
            .contains("at least one scope"));
        let mut empty_sub = operator_token("seal.admin");
        empty_sub.sub = "";
        assert!(matches!(
            empty_sub.claims(),
            Err(MintError::EmptyClaim("sub"))
        ));
        let mut dead = operator_token("seal.admin");
        dead.exp = dead.iat;
        assert!(matches!(dead.claims(), Err(MintError::NotAfterNow { .. })));
    }

    #[test]
    fn key_ids_are_stable_per_key() {
        let key = crate::envelope::generate_signing_key().expect("key");
        let other = crate::envelope::generate_signing_key().expect("key");
        assert_eq!(key_id(&key.verifying_key()), key_id(&key.verifying_key()));
        assert_ne!(key_id(&key.verifying_key()), key_id(&other.verifying_key()));
        assert_eq!(key_id(&key.verifying_key()).len(), "sealgate-".len() + 16);
    }
}
