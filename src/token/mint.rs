//! Minting agent tokens with the gateway's own Ed25519 key (`agent_tokens.issuer_key`, SPEC sections 4
//! and 5), plus the signing helpers that the CLI, the demo and tests use.

use std::fmt;
use std::path::Path;

use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{DecodePrivateKey, EncodePrivateKey, EncodePublicKey};
use ed25519_dalek::SigningKey;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::keys::{resolve, KeyConfig};
use super::AgentTokenConfig;

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
    /// Ed25519 PKCS#8 private key.
    pub fn from_config(cfg: &AgentTokenConfig, base_dir: &Path) -> Result<Option<Self>, String> {
        let Some(path) = &cfg.issuer_key else {
            return Ok(None);
        };
        let full = resolve(base_dir, path);
        let pem = std::fs::read_to_string(&full).map_err(|err| {
            format!(
                "agent_tokens.issuer_key: cannot read {}: {err}",
                full.display()
            )
        })?;
        let signing_key = SigningKey::from_pkcs8_pem(&pem).map_err(|err| {
            format!(
                "agent_tokens.issuer_key {}: not an Ed25519 PKCS#8 private key: {err}",
                full.display()
            )
        })?;
        let minter = Self::from_signing_key(&signing_key, cfg.issuer.clone(), cfg.audience.clone())
            .map_err(|err| format!("agent_tokens.issuer_key {}: {err}", full.display()))?;
        Ok(Some(minter))
    }

    fn from_signing_key(
        signing_key: &SigningKey,
        issuer: Option<String>,
        audience: Option<String>,
    ) -> Result<Self, String> {
        let encoding_key = encoding_key(signing_key)?;
        let verifying_key = signing_key.verifying_key();
        let public_key_pem = verifying_key
            .to_public_key_pem(LineEnding::LF)
            .map_err(|err| format!("cannot encode the public key: {err}"))?;
        // A stable kid derived from the public key lets verifiers pick this key without trying others.
        let fingerprint = hex::encode(Sha256::digest(verifying_key.as_bytes()));
        let kid = format!("sealgate-{}", fingerprint.get(..16).unwrap_or(&fingerprint));
        Ok(TokenMinter {
            encoding_key,
            public_key_pem,
            kid,
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
    ) -> Result<String, String> {
        for (name, value) in [("sub", sub), ("scp", scp), ("exec_id", exec_id)] {
            if value.is_empty() {
                return Err(format!("cannot mint a token with an empty `{name}`"));
            }
        }
        if wid == Some("") {
            return Err("cannot mint a token with an empty `wid`".to_owned());
        }
        if expires_at <= now {
            return Err(format!(
                "cannot mint a token that expires at {expires_at}, not after now ({now})"
            ));
        }
        let mut claims = Map::new();
        claims.insert("sub".into(), sub.into());
        claims.insert("scp".into(), scp.into());
        claims.insert("exec_id".into(), exec_id.into());
        if let Some(wid) = wid {
            claims.insert("wid".into(), wid.into());
        }
        claims.insert("jti".into(), random_uuid()?.into());
        claims.insert("iat".into(), now.into());
        claims.insert("exp".into(), expires_at.into());
        if let Some(issuer) = &self.issuer {
            claims.insert("iss".into(), issuer.as_str().into());
        }
        if let Some(audience) = &self.audience {
            claims.insert("aud".into(), audience.as_str().into());
        }
        encode_eddsa(&claims, Some(&self.kid), &self.encoding_key)
    }

    /// The public half as a key entry (alg EdDSA, inline PEM, this minter's kid).
    /// `AgentTokenVerifier::new` already adds it when `issuer_key` is set.
    pub fn verifying_key_config(&self) -> KeyConfig {
        KeyConfig {
            alg: "EdDSA".to_owned(),
            kid: Some(self.kid.clone()),
            public_key_pem: Some(self.public_key_pem.clone()),
            public_key_pem_file: None,
            jwks_file: None,
            secret: None,
        }
    }
}

/// Signs `claims` (a JSON object) as an EdDSA JWT with `kid` in the header when given. For tests, the
/// CLI (`sealgate sign`) and the demo; the gateway itself mints through [`TokenMinter`].
pub fn sign_eddsa_for_tests_and_cli(
    private_pkcs8_pem: &str,
    claims: &Value,
    kid: Option<&str>,
) -> Result<String, String> {
    let Value::Object(claims) = claims else {
        return Err("token claims must be a JSON object".to_owned());
    };
    let signing_key = SigningKey::from_pkcs8_pem(private_pkcs8_pem)
        .map_err(|err| format!("not an Ed25519 PKCS#8 private key: {err}"))?;
    encode_eddsa(claims, kid, &encoding_key(&signing_key)?)
}

/// A fresh Ed25519 key pair from OS randomness: (private PKCS#8 PEM, public SPKI PEM).
/// Returns an error instead of panicking when the OS cannot supply randomness.
pub fn ed25519_keypair_pem() -> Result<(String, String), String> {
    let mut seed = [0u8; 32];
    getrandom::getrandom(&mut seed).map_err(|err| format!("OS randomness unavailable: {err}"))?;
    let signing_key = SigningKey::from_bytes(&seed);
    let private_pem = signing_key
        .to_pkcs8_pem(LineEnding::LF)
        .map_err(|err| format!("cannot encode the private key: {err}"))?;
    let public_pem = signing_key
        .verifying_key()
        .to_public_key_pem(LineEnding::LF)
        .map_err(|err| format!("cannot encode the public key: {err}"))?;
    Ok((private_pem.to_string(), public_pem))
}

fn encoding_key(signing_key: &SigningKey) -> Result<EncodingKey, String> {
    let der = signing_key
        .to_pkcs8_der()
        .map_err(|err| format!("cannot encode the private key: {err}"))?;
    Ok(EncodingKey::from_ed_der(der.as_bytes()))
}

fn encode_eddsa(
    claims: &Map<String, Value>,
    kid: Option<&str>,
    key: &EncodingKey,
) -> Result<String, String> {
    let mut header = Header::new(Algorithm::EdDSA);
    header.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&header, claims, key)
        .map_err(|err| format!("cannot sign the token: {err}"))
}

fn random_uuid() -> Result<String, String> {
    let mut bytes = [0u8; 16];
    getrandom::getrandom(&mut bytes).map_err(|err| format!("OS randomness unavailable: {err}"))?;
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
        assert_eq!(entry.alg, "EdDSA");
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
        let err = TokenMinter::from_config(&missing, dir.path()).expect_err("missing file");
        assert!(err.contains("cannot read"), "{err}");
        let (_, public_pem) = ed25519_keypair_pem().expect("keypair");
        std::fs::write(dir.path().join("public.pem"), public_pem).expect("write");
        let public = AgentTokenConfig {
            issuer_key: Some("public.pem".into()),
            ..AgentTokenConfig::default()
        };
        let err = TokenMinter::from_config(&public, dir.path()).expect_err("public key");
        assert!(err.contains("not an Ed25519 PKCS#8 private key"), "{err}");
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
}
