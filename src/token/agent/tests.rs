//! Unit tests of agent-token verification: algorithms, key loading, SPEC check order, the cache.

use std::path::Path;
use std::sync::Arc;

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey};
use proptest::prelude::*;
use serde_json::{json, Value};

use super::*;
use crate::token::claims::MAX_LEEWAY_SECS;
use crate::token::test_support::*;
use crate::token::{ed25519_keypair_pem, KeyConfig};

const NOW: i64 = 1_500;

fn verifier(keys: Vec<KeyConfig>) -> AgentTokenVerifier {
    verifier_cfg(AgentTokenConfig {
        keys,
        ..AgentTokenConfig::default()
    })
}

fn verifier_cfg(cfg: AgentTokenConfig) -> AgentTokenVerifier {
    AgentTokenVerifier::new(&cfg, Path::new("/")).expect("verifier builds")
}

fn config_error(keys: Vec<KeyConfig>) -> String {
    let cfg = AgentTokenConfig {
        keys,
        ..AgentTokenConfig::default()
    };
    match AgentTokenVerifier::new(&cfg, Path::new("/")) {
        Ok(_) => panic!("configuration should have been refused"),
        Err(err) => err.to_string(),
    }
}

fn invalid_message(result: Result<Arc<AgentClaims>, TokenError>) -> String {
    match result {
        Err(TokenError::Invalid(message)) => message,
        other => panic!("expected Invalid, got {other:?}"),
    }
}

fn ed_header(kid: Option<&str>) -> Value {
    match kid {
        Some(kid) => json!({"alg": "EdDSA", "typ": "JWT", "kid": kid}),
        None => json!({"alg": "EdDSA", "typ": "JWT"}),
    }
}

// ---- each algorithm -------------------------------------------------------------------------------

#[test]
fn eddsa_token_verifies_and_yields_typed_claims() {
    let (private_pem, public_pem) = ed25519_keypair_pem().expect("keypair");
    let verifier = verifier(vec![ed25519_key_entry(&public_pem, None)]);
    let mut claims = agent_claims(2_000);
    claims["nbf"] = json!(1_000);
    let verified = verifier
        .verify(&sign_ed(&private_pem, claims), NOW)
        .expect("valid");
    assert_eq!(
        *verified,
        AgentClaims {
            sub: "agent-7".into(),
            scp: "agent-runtime".into(),
            exec_id: "exec-42".into(),
            wid: Some("c-1".into()),
            jti: "jti-1".into(),
            iat: 1_000,
            exp: 2_000,
            nbf: Some(1_000),
        }
    );
}

#[test]
fn es256_token_verifies() {
    let verifier = verifier(vec![key_entry("ES256", ES256_PUBLIC, None)]);
    let token = sign_raw(
        &json!({"alg": "ES256"}),
        &agent_claims(2_000),
        &es256_signing_key(),
        Algorithm::ES256,
    );
    assert_eq!(verifier.verify(&token, NOW).expect("valid").sub, "agent-7");
}

#[test]
fn rs256_token_verifies_with_spki_and_pkcs1_pem() {
    let token = sign_raw(
        &json!({"alg": "RS256"}),
        &agent_claims(2_000),
        &rs256_signing_key(),
        Algorithm::RS256,
    );
    let spki = verifier(vec![key_entry("RS256", RS256_PUBLIC, None)]);
    assert!(spki.verify(&token, NOW).is_ok());

    let pkcs1_pem = pkcs1_public_pem();
    let pkcs1 = verifier(vec![key_entry("RS256", &pkcs1_pem, None)]);
    assert!(pkcs1.verify(&token, NOW).is_ok());
}

/// The same RSA key as `RS256_PUBLIC`, written as an `RSA PUBLIC KEY` (PKCS#1) block.
fn pkcs1_public_pem() -> String {
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine;
    let key = DecodingKey::from_rsa_pem(RS256_PUBLIC.as_bytes()).expect("RSA key");
    let der = key.try_get_as_bytes().expect("PKCS#1 DER");
    let body = STANDARD.encode(der);
    let lines: Vec<&str> = body
        .as_bytes()
        .chunks(64)
        .map(|chunk| std::str::from_utf8(chunk).expect("ascii"))
        .collect();
    format!(
        "-----BEGIN RSA PUBLIC KEY-----\n{}\n-----END RSA PUBLIC KEY-----\n",
        lines.join("\n")
    )
}

#[test]
fn hs256_token_verifies_with_a_configured_secret() {
    let verifier = verifier(vec![secret_entry(HS256_SECRET, None)]);
    let key = EncodingKey::from_secret(HS256_SECRET.as_bytes()).expect("secret");
    let token = sign_raw(
        &json!({"alg": "HS256"}),
        &agent_claims(2_000),
        &key,
        Algorithm::HS256,
    );
    assert!(verifier.verify(&token, NOW).is_ok());
    let other = EncodingKey::from_secret(b"another secret that is long enough!!").expect("secret");
    let forged = sign_raw(
        &json!({"alg": "HS256"}),
        &agent_claims(2_000),
        &other,
        Algorithm::HS256,
    );
    assert!(invalid_message(verifier.verify(&forged, NOW)).contains("does not verify"));
}

#[test]
fn hs256_is_only_for_secrets_and_secrets_only_for_hs256() {
    let err = config_error(vec![key_entry("HS256", RS256_PUBLIC, None)]);
    assert!(err.contains("HS256 needs `secret`"), "{err}");
    let mut ed_with_secret = secret_entry(HS256_SECRET, None);
    ed_with_secret.alg = Some("EdDSA".into());
    let err = config_error(vec![ed_with_secret]);
    assert!(err.contains("only allowed with alg HS256"), "{err}");
    let err = config_error(vec![secret_entry("", None)]);
    assert!(err.contains("empty"), "{err}");
    // A short secret loads (with a warning) so an existing orchestrator's secret still works.
    verifier(vec![secret_entry("short", None)]);
}

// ---- algorithm confusion --------------------------------------------------------------------------

#[test]
fn hs256_token_signed_with_the_rsa_public_pem_is_refused() {
    let verifier = verifier(vec![key_entry("RS256", RS256_PUBLIC, None)]);
    let public_as_secret = EncodingKey::from_secret(RS256_PUBLIC.as_bytes()).expect("secret");
    let token = sign_raw(
        &json!({"alg": "HS256"}),
        &agent_claims(2_000),
        &public_as_secret,
        Algorithm::HS256,
    );
    let message = invalid_message(verifier.verify(&token, NOW));
    assert!(
        message.contains("no key is configured for token algorithm HS256"),
        "{message}"
    );
}

#[test]
fn alg_none_is_refused_with_and_without_a_signature() {
    let (_, public_pem) = ed25519_keypair_pem().expect("keypair");
    let verifier = verifier(vec![ed25519_key_entry(&public_pem, None)]);
    let unsigned = format!(
        "{}.{}.",
        b64(json!({"alg": "none"}).to_string().as_bytes()),
        b64(agent_claims(2_000).to_string().as_bytes())
    );
    assert!(invalid_message(verifier.verify(&unsigned, NOW)).contains("`none` is refused"));
    let with_garbage = format!("{unsigned}AAAA");
    assert!(invalid_message(verifier.verify(&with_garbage, NOW)).contains("`none` is refused"));
    // Case variants are not names of anything either.
    let upper = format!(
        "{}.{}.",
        b64(json!({"alg": "NONE"}).to_string().as_bytes()),
        b64(agent_claims(2_000).to_string().as_bytes())
    );
    assert!(matches!(
        verifier.verify(&upper, NOW),
        Err(TokenError::Invalid(_))
    ));
}

#[test]
fn header_alg_without_a_key_of_that_alg_is_refused() {
    let (private_pem, _) = ed25519_keypair_pem().expect("keypair");
    let verifier = verifier(vec![key_entry("ES256", ES256_PUBLIC, None)]);
    let token = sign_ed(&private_pem, agent_claims(2_000));
    let message = invalid_message(verifier.verify(&token, NOW));
    assert!(
        message.contains("no key is configured for token algorithm EdDSA"),
        "{message}"
    );
    // An ES256 signature relabelled as something else does not find the ES256 key either.
    let relabelled = sign_raw(
        &json!({"alg": "ES384"}),
        &agent_claims(2_000),
        &es256_signing_key(),
        Algorithm::ES256,
    );
    assert!(invalid_message(verifier.verify(&relabelled, NOW)).contains("`ES384` is refused"));
}

#[test]
fn a_key_is_never_used_with_another_algorithm_of_its_family() {
    // RS256 key, token claims PS256 (same RSA key type, different algorithm): refused.
    let verifier = verifier(vec![key_entry("RS256", RS256_PUBLIC, None)]);
    let token = sign_raw(
        &json!({"alg": "PS256"}),
        &agent_claims(2_000),
        &rs256_signing_key(),
        Algorithm::PS256,
    );
    assert!(matches!(
        verifier.verify(&token, NOW),
        Err(TokenError::Invalid(_))
    ));
}

// ---- iss / aud --------------------------------------------------------------------------------------

#[test]
fn issuer_and_audience_must_match_when_configured() {
    let (private_pem, public_pem) = ed25519_keypair_pem().expect("keypair");
    let verifier = verifier_cfg(AgentTokenConfig {
        issuer: Some("orchestrator".into()),
        audience: Some("sealgate-agents".into()),
        keys: vec![ed25519_key_entry(&public_pem, None)],
        ..AgentTokenConfig::default()
    });
    let with = |iss: Value, aud: Value| {
        let mut claims = agent_claims(2_000);
        if !iss.is_null() {
            claims["iss"] = iss;
        }
        if !aud.is_null() {
            claims["aud"] = aud;
        }
        verifier.verify(&sign_ed(&private_pem, claims), NOW)
    };
    assert!(with(json!("orchestrator"), json!("sealgate-agents")).is_ok());
    assert!(with(json!("orchestrator"), json!(["other", "sealgate-agents"])).is_ok());
    assert!(invalid_message(with(json!("intruder"), json!("sealgate-agents"))).contains("issuer"));
    assert!(invalid_message(with(Value::Null, json!("sealgate-agents"))).contains("`iss`"));
    assert!(
        invalid_message(with(json!("orchestrator"), json!("sealgate-operators")))
            .contains("audience")
    );
    assert!(invalid_message(with(json!("orchestrator"), json!(["a", "b"]))).contains("audience"));
    assert!(invalid_message(with(json!("orchestrator"), Value::Null)).contains("`aud`"));
}

#[test]
fn unconfigured_issuer_and_audience_are_not_compared() {
    let (private_pem, public_pem) = ed25519_keypair_pem().expect("keypair");
    let verifier = verifier(vec![ed25519_key_entry(&public_pem, None)]);
    let mut claims = agent_claims(2_000);
    claims["iss"] = json!("anyone");
    claims["aud"] = json!("anything");
    assert!(verifier
        .verify(&sign_ed(&private_pem, claims.clone()), NOW)
        .is_ok());
    claims["aud"] = json!(7);
    assert!(matches!(
        verifier.verify(&sign_ed(&private_pem, claims), NOW),
        Err(TokenError::Invalid(_))
    ));
}

// ---- required claims --------------------------------------------------------------------------------

#[test]
fn each_required_claim_must_be_present() {
    let (private_pem, public_pem) = ed25519_keypair_pem().expect("keypair");
    let verifier = verifier(vec![ed25519_key_entry(&public_pem, None)]);
    for name in ["sub", "scp", "exec_id", "jti", "iat", "exp"] {
        let mut claims = agent_claims(2_000);
        claims.as_object_mut().expect("object").remove(name);
        let message = invalid_message(verifier.verify(&sign_ed(&private_pem, claims), NOW));
        assert!(message.contains(&format!("`{name}`")), "{name}: {message}");
    }
    // wid is optional.
    let mut claims = agent_claims(2_000);
    claims.as_object_mut().expect("object").remove("wid");
    assert_eq!(
        verifier
            .verify(&sign_ed(&private_pem, claims), NOW)
            .expect("valid")
            .wid,
        None
    );
}

#[test]
fn required_claims_must_have_the_right_types() {
    let (private_pem, public_pem) = ed25519_keypair_pem().expect("keypair");
    let verifier = verifier(vec![ed25519_key_entry(&public_pem, None)]);
    let cases = [
        ("scp", json!(["agent-runtime"])),
        ("sub", json!(7)),
        ("exec_id", json!("")),
        ("wid", json!(null)),
        ("jti", json!({"x": 1})),
        ("iat", json!("1000")),
        ("exp", json!(1e300)),
        ("nbf", json!(true)),
    ];
    for (name, value) in cases {
        let mut claims = agent_claims(2_000);
        claims[name] = value.clone();
        let message = invalid_message(verifier.verify(&sign_ed(&private_pem, claims), NOW));
        assert!(
            message.contains(&format!("`{name}`")),
            "{name}={value}: {message}"
        );
    }
    // A fraction (RFC 7519's NumericDate allows one) is read; expiry rounds down, not-before up.
    let mut claims = agent_claims(2_000);
    claims["exp"] = json!(NOW as f64 + 1.5);
    claims["nbf"] = json!(NOW as f64 - 0.5);
    let verified = verifier
        .verify(&sign_ed(&private_pem, claims), NOW)
        .unwrap();
    assert_eq!((verified.exp, verified.nbf), (NOW + 1, Some(NOW)));
}

// ---- SPEC order: check 3 before check 4 --------------------------------------------------------------

#[test]
fn expired_and_badly_signed_is_invalid_not_expired() {
    let (_, public_pem) = ed25519_keypair_pem().expect("keypair");
    let (other_private, _) = ed25519_keypair_pem().expect("keypair");
    let verifier = verifier(vec![ed25519_key_entry(&public_pem, None)]);
    let expired_forgery = sign_ed(&other_private, agent_claims(1_000));
    assert!(invalid_message(verifier.verify(&expired_forgery, NOW)).contains("does not verify"));
}

#[test]
fn expired_with_wrong_audience_or_missing_claim_is_invalid_not_expired() {
    let (private_pem, public_pem) = ed25519_keypair_pem().expect("keypair");
    let verifier = verifier_cfg(AgentTokenConfig {
        audience: Some("sealgate-agents".into()),
        keys: vec![ed25519_key_entry(&public_pem, None)],
        ..AgentTokenConfig::default()
    });
    let mut wrong_aud = agent_claims(1_000);
    wrong_aud["aud"] = json!("elsewhere");
    assert!(
        invalid_message(verifier.verify(&sign_ed(&private_pem, wrong_aud), NOW))
            .contains("audience")
    );
    let mut no_jti = agent_claims(1_000);
    no_jti["aud"] = json!("sealgate-agents");
    no_jti.as_object_mut().expect("object").remove("jti");
    assert!(
        invalid_message(verifier.verify(&sign_ed(&private_pem, no_jti), NOW)).contains("`jti`")
    );
}

#[test]
fn well_signed_expired_token_is_expired() {
    let (private_pem, public_pem) = ed25519_keypair_pem().expect("keypair");
    let verifier = verifier(vec![ed25519_key_entry(&public_pem, None)]);
    let token = sign_ed(&private_pem, agent_claims(NOW));
    assert!(matches!(
        verifier.verify(&token, NOW),
        Err(TokenError::Expired(_))
    ));
    assert_eq!(
        verifier
            .verify(&token, NOW)
            .map(|_| ())
            .map_err(|err| crate::error::ApiError::from(err).code),
        Err(crate::error::Code::TokenExpired)
    );
    assert!(verifier.verify(&token, NOW - 1).is_ok());
}

#[test]
fn future_nbf_is_expired_and_leeway_widens_both_edges() {
    let (private_pem, public_pem) = ed25519_keypair_pem().expect("keypair");
    let mut claims = agent_claims(2_000);
    claims["nbf"] = json!(NOW + 10);
    let token = sign_ed(&private_pem, claims);
    let strict = verifier(vec![ed25519_key_entry(&public_pem, None)]);
    match strict.verify(&token, NOW) {
        Err(TokenError::Expired(message)) => {
            assert!(message.contains("not valid before"), "{message}")
        }
        other => panic!("expected Expired, got {other:?}"),
    }
    let lenient = verifier_cfg(AgentTokenConfig {
        leeway_secs: 10,
        keys: vec![ed25519_key_entry(&public_pem, None)],
        ..AgentTokenConfig::default()
    });
    assert!(lenient.verify(&token, NOW).is_ok());
    // exp 2000 with 10 s leeway: still valid at 2009, expired at 2010.
    assert!(lenient.verify(&token, 2_009).is_ok());
    assert!(matches!(
        lenient.verify(&token, 2_010),
        Err(TokenError::Expired(_))
    ));
}

#[test]
fn leeway_above_the_ceiling_is_a_config_error() {
    let cfg = AgentTokenConfig {
        leeway_secs: MAX_LEEWAY_SECS + 1,
        ..AgentTokenConfig::default()
    };
    assert!(AgentTokenVerifier::new(&cfg, Path::new("/")).is_err());
}

// ---- kid selection ---------------------------------------------------------------------------------

#[test]
fn kid_selects_the_key_and_a_wrong_kid_is_refused() {
    let (private_one, public_one) = ed25519_keypair_pem().expect("keypair");
    let (private_two, public_two) = ed25519_keypair_pem().expect("keypair");
    let verifier = verifier(vec![
        ed25519_key_entry(&public_one, Some("one")),
        ed25519_key_entry(&public_two, Some("two")),
    ]);
    let key_two = ed25519_signing_key(&private_two);
    let right = sign_raw(
        &ed_header(Some("two")),
        &agent_claims(2_000),
        &key_two,
        Algorithm::EdDSA,
    );
    assert!(verifier.verify(&right, NOW).is_ok());
    // Signed by key two but naming key one: only key one is tried.
    let wrong = sign_raw(
        &ed_header(Some("one")),
        &agent_claims(2_000),
        &key_two,
        Algorithm::EdDSA,
    );
    assert!(invalid_message(verifier.verify(&wrong, NOW)).contains("does not verify"));
    let unknown = sign_raw(
        &ed_header(Some("three")),
        &agent_claims(2_000),
        &key_two,
        Algorithm::EdDSA,
    );
    assert!(
        invalid_message(verifier.verify(&unknown, NOW)).contains("no EdDSA key with kid `three`")
    );
    // Without a kid every EdDSA key is tried.
    let key_one = ed25519_signing_key(&private_one);
    let no_kid = sign_raw(
        &ed_header(None),
        &agent_claims(2_000),
        &key_one,
        Algorithm::EdDSA,
    );
    assert!(verifier.verify(&no_kid, NOW).is_ok());
}

#[test]
fn keys_without_kid_stay_eligible_for_tokens_with_a_kid() {
    let (private_pem, public_pem) = ed25519_keypair_pem().expect("keypair");
    let (_, other_public) = ed25519_keypair_pem().expect("keypair");
    let verifier = verifier(vec![
        ed25519_key_entry(&other_public, Some("rotated-out")),
        ed25519_key_entry(&public_pem, None),
    ]);
    let token = sign_raw(
        &ed_header(Some("idp-kid-7")),
        &agent_claims(2_000),
        &ed25519_signing_key(&private_pem),
        Algorithm::EdDSA,
    );
    assert!(verifier.verify(&token, NOW).is_ok());
}

#[test]
fn duplicate_kids_are_a_config_error() {
    let (_, one) = ed25519_keypair_pem().expect("keypair");
    let (_, two) = ed25519_keypair_pem().expect("keypair");
    let err = config_error(vec![
        ed25519_key_entry(&one, Some("k")),
        ed25519_key_entry(&two, Some("k")),
    ]);
    assert!(
        err.contains("agent_tokens.keys[1]") && err.contains("more than one key"),
        "{err}"
    );
}

// ---- key loading ------------------------------------------------------------------------------------

#[test]
fn key_entries_need_exactly_one_source_and_a_known_alg() {
    let (_, public_pem) = ed25519_keypair_pem().expect("keypair");
    let mut two_sources = ed25519_key_entry(&public_pem, None);
    two_sources.jwks_file = Some("keys.json".into());
    assert!(config_error(vec![two_sources]).contains("exactly one"));
    let mut no_source = ed25519_key_entry(&public_pem, None);
    no_source.public_key_pem = None;
    assert!(config_error(vec![no_source]).contains("exactly one"));
    for alg in ["none", "HS512", "ES384", "PS256", "eddsa", ""] {
        let err = config_error(vec![key_entry(alg, &public_pem, None)]);
        assert!(err.contains("not supported"), "{alg}: {err}");
    }
    assert!(config_error(vec![ed25519_key_entry(&public_pem, Some(""))]).contains("kid"));
}

#[test]
fn pem_keys_must_fit_their_algorithm() {
    let (private_pem, public_pem) = ed25519_keypair_pem().expect("keypair");
    assert!(config_error(vec![key_entry("ES256", P384_PUBLIC, None)]).contains("P-256"));
    assert!(config_error(vec![key_entry("ES256", &public_pem, None)]).contains("keys[0]"));
    assert!(config_error(vec![key_entry("EdDSA", ES256_PUBLIC, None)]).contains("Ed25519"));
    assert!(config_error(vec![key_entry("RS256", ES256_PUBLIC, None)]).contains("RSA"));
    assert!(config_error(vec![key_entry("RS256", RSA1024_PUBLIC, None)]).contains("1024 bits"));
    let err = config_error(vec![key_entry("EdDSA", &private_pem, None)]);
    assert!(err.contains("`PRIVATE KEY`"), "{err}");
    assert!(config_error(vec![key_entry("RS256", RS256_PRIVATE, None)]).contains("PRIVATE KEY"));
    let two_blocks = format!("{public_pem}{public_pem}");
    assert!(config_error(vec![ed25519_key_entry(&two_blocks, None)])
        .contains("more than one PEM block"));
    assert!(config_error(vec![ed25519_key_entry("garbage", None)]).contains("no PEM block"));
}

#[test]
fn pem_files_are_read_relative_to_base_dir() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("keys")).expect("mkdir");
    std::fs::write(dir.path().join("keys/agents.pub.pem"), ES256_PUBLIC).expect("write");
    let entry = KeyConfig {
        alg: Some("ES256".into()),
        public_key_pem_file: Some("keys/agents.pub.pem".into()),
        ..KeyConfig::default()
    };
    let cfg = AgentTokenConfig {
        keys: vec![entry.clone()],
        ..AgentTokenConfig::default()
    };
    let verifier = AgentTokenVerifier::new(&cfg, dir.path()).expect("loads");
    let token = sign_raw(
        &json!({"alg": "ES256"}),
        &agent_claims(2_000),
        &es256_signing_key(),
        Algorithm::ES256,
    );
    assert!(verifier.verify(&token, NOW).is_ok());
    let err = match AgentTokenVerifier::new(&cfg, Path::new("/nonexistent")) {
        Ok(_) => panic!("missing file accepted"),
        Err(err) => err.to_string(),
    };
    assert!(err.contains("/nonexistent/keys/agents.pub.pem"), "{err}");
}

#[test]
fn config_structs_refuse_unknown_fields_and_redact_secrets() {
    let parsed: AgentTokenConfig = serde_json::from_value(json!({
        "issuer": "orchestrator", "keys": [{"alg": "HS256", "secret": HS256_SECRET}]
    }))
    .expect("parses");
    assert_eq!(parsed.leeway_secs, 0);
    assert!(serde_json::from_value::<AgentTokenConfig>(json!({"isuer": "x"})).is_err());
    assert!(serde_json::from_value::<KeyConfig>(json!({"alg": "EdDSA", "pem": "x"})).is_err());
    let shown = format!("{parsed:?}");
    assert!(
        !shown.contains(HS256_SECRET) && shown.contains("redacted"),
        "{shown}"
    );
}

#[test]
fn no_keys_is_allowed_and_refuses_every_token() {
    let verifier = verifier(Vec::new());
    assert_eq!(verifier.key_count(), 0);
    let (private_pem, _) = ed25519_keypair_pem().expect("keypair");
    assert!(matches!(
        verifier.verify(&sign_ed(&private_pem, agent_claims(2_000)), NOW),
        Err(TokenError::Invalid(_))
    ));
}

// ---- JWKS ---------------------------------------------------------------------------------------------

fn jwks_entry(alg: &str, path: &Path) -> KeyConfig {
    KeyConfig {
        alg: Some(alg.into()),
        jwks_file: Some(path.to_path_buf()),
        ..KeyConfig::default()
    }
}

fn write_jwks(dir: &Path, name: &str, keys: Vec<Value>) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, json!({ "keys": keys }).to_string()).expect("write jwks");
    path
}

#[test]
fn jwks_files_load_okp_ec_and_rsa_keys_with_their_kids() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (private_one, public_one) = ed25519_keypair_pem().expect("keypair");
    let (private_two, public_two) = ed25519_keypair_pem().expect("keypair");
    let ed_path = write_jwks(
        dir.path(),
        "ed.json",
        vec![ed_jwk(&public_one, "ed-1"), ed_jwk(&public_two, "ed-2")],
    );
    let ec_path = write_jwks(dir.path(), "ec.json", vec![es256_jwk("ec-1")]);
    let rsa_path = write_jwks(dir.path(), "rsa.json", vec![rs256_jwk("rsa-1")]);
    let verifier = verifier(vec![
        jwks_entry("EdDSA", &ed_path),
        jwks_entry("ES256", &ec_path),
        jwks_entry("RS256", &rsa_path),
    ]);
    assert_eq!(verifier.key_count(), 4);

    let ed_two = sign_raw(
        &ed_header(Some("ed-2")),
        &agent_claims(2_000),
        &ed25519_signing_key(&private_two),
        Algorithm::EdDSA,
    );
    assert!(verifier.verify(&ed_two, NOW).is_ok());
    let mislabelled = sign_raw(
        &ed_header(Some("ed-1")),
        &agent_claims(2_000),
        &ed25519_signing_key(&private_two),
        Algorithm::EdDSA,
    );
    assert!(matches!(
        verifier.verify(&mislabelled, NOW),
        Err(TokenError::Invalid(_))
    ));
    let ed_one_no_kid = sign_ed(&private_one, agent_claims(2_000));
    assert!(verifier.verify(&ed_one_no_kid, NOW).is_ok());

    let ec = sign_raw(
        &json!({"alg": "ES256", "kid": "ec-1"}),
        &agent_claims(2_000),
        &es256_signing_key(),
        Algorithm::ES256,
    );
    assert!(verifier.verify(&ec, NOW).is_ok());
    let rsa = sign_raw(
        &json!({"alg": "RS256", "kid": "rsa-1"}),
        &agent_claims(2_000),
        &rs256_signing_key(),
        Algorithm::RS256,
    );
    assert!(verifier.verify(&rsa, NOW).is_ok());
    // The EC key's kid under the wrong algorithm finds nothing.
    let confused = sign_raw(
        &json!({"alg": "EdDSA", "kid": "ec-1"}),
        &agent_claims(2_000),
        &ed25519_signing_key(&private_one),
        Algorithm::EdDSA,
    );
    assert!(
        invalid_message(verifier.verify(&confused, NOW)).contains("no EdDSA key with kid `ec-1`")
    );
}

#[test]
fn jwks_keys_that_disagree_with_the_pinned_alg_fail_closed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, public_pem) = ed25519_keypair_pem().expect("keypair");
    let mut wrong_crv = es256_jwk("a");
    wrong_crv["crv"] = json!("P-384");
    let mut wrong_alg = ed_jwk(&public_pem, "a");
    wrong_alg["alg"] = json!("ES256");
    let mut private = ed_jwk(&public_pem, "a");
    private["d"] = json!(b64(&[1u8; 32]));
    let mut enc = ed_jwk(&public_pem, "a");
    enc["use"] = json!("enc");
    let mut short_x = ed_jwk(&public_pem, "a");
    short_x["x"] = json!(b64(&[9u8; 10]));
    let mut unknown_member = es256_jwk("a");
    unknown_member["extra"] = json!(1);
    let mut bad_point = es256_jwk("a");
    bad_point["y"] = json!(b64(&[0u8; 32]));
    let cases = [
        (
            "EdDSA",
            vec![ed_jwk(&public_pem, "ok"), es256_jwk("ec")],
            "kty `EC`",
        ),
        ("ES256", vec![wrong_crv], "crv `P-384`"),
        ("EdDSA", vec![wrong_alg], "alg `ES256`"),
        ("EdDSA", vec![private], "private key material"),
        ("EdDSA", vec![enc], "use `enc`"),
        ("EdDSA", vec![short_x], "10 bytes"),
        ("ES256", vec![unknown_member], "`extra`"),
        ("ES256", vec![bad_point], "P-256"),
        ("RS256", vec![es256_jwk("a")], "kty `EC`"),
        ("HS256", vec![json!({"kty": "oct", "k": "AAAA"})], "HS256"),
        ("EdDSA", vec![], "empty"),
    ];
    for (index, (alg, keys, expected)) in cases.into_iter().enumerate() {
        let path = write_jwks(dir.path(), &format!("case{index}.json"), keys);
        let mut entry = jwks_entry(alg, &path);
        if alg == "HS256" {
            // Not even reachable as a JWKS: HS256 insists on `secret`.
            entry.secret = None;
        }
        let err = config_error(vec![entry]);
        assert!(err.contains(expected), "case {index}: {err}");
    }
    let not_jwks = dir.path().join("not.json");
    std::fs::write(&not_jwks, r#"{"keys": [], "more": 1}"#).expect("write");
    assert!(config_error(vec![jwks_entry("EdDSA", &not_jwks)]).contains("`more`"));
    let mut with_kid = jwks_entry("EdDSA", &not_jwks);
    with_kid.kid = Some("k".into());
    assert!(config_error(vec![with_kid]).contains("kid cannot be set"));
}

// ---- cache --------------------------------------------------------------------------------------------

#[test]
fn cache_hit_returns_the_same_claims_and_expiry_is_rechecked() {
    let (private_pem, public_pem) = ed25519_keypair_pem().expect("keypair");
    let verifier = verifier(vec![ed25519_key_entry(&public_pem, None)]);
    let token = sign_ed(&private_pem, agent_claims(2_000));
    let first = verifier.verify(&token, NOW).expect("valid");
    assert_eq!(verifier.cached_tokens(), 1);
    let second = verifier.verify(&token, NOW + 1).expect("cached");
    assert!(Arc::ptr_eq(&first, &second));
    match verifier.verify(&token, 2_000) {
        Err(TokenError::Expired(message)) => {
            assert!(message.contains("expired at 2000"), "{message}")
        }
        other => panic!("expected Expired from the cached entry, got {other:?}"),
    }
    assert_eq!(verifier.cached_tokens(), 0);
}

#[test]
fn refused_tokens_are_not_cached() {
    let (private_pem, public_pem) = ed25519_keypair_pem().expect("keypair");
    let verifier = verifier(vec![ed25519_key_entry(&public_pem, None)]);
    let mut claims = agent_claims(2_000);
    claims["nbf"] = json!(1_800);
    let token = sign_ed(&private_pem, claims);
    assert!(matches!(
        verifier.verify(&token, NOW),
        Err(TokenError::Expired(_))
    ));
    assert_eq!(verifier.cached_tokens(), 0);
    let (other_private, _) = ed25519_keypair_pem().expect("keypair");
    assert!(verifier
        .verify(&sign_ed(&other_private, agent_claims(2_000)), NOW)
        .is_err());
    assert_eq!(verifier.cached_tokens(), 0);
    // Once nbf has passed the same token verifies (and is cached); an earlier clock still sees nbf.
    assert!(verifier.verify(&token, 1_800).is_ok());
    assert!(matches!(
        verifier.verify(&token, 1_700),
        Err(TokenError::Expired(_))
    ));
}

// ---- garbage -------------------------------------------------------------------------------------------

#[test]
fn garbage_of_every_shape_is_invalid() {
    let (private_pem, public_pem) = ed25519_keypair_pem().expect("keypair");
    let verifier = verifier(vec![ed25519_key_entry(&public_pem, None)]);
    let good = sign_ed(&private_pem, agent_claims(2_000));
    let parts: Vec<&str> = good.split('.').collect();
    let shapes = vec![
        String::new(),
        ".".into(),
        "..".into(),
        "...".into(),
        "a.b".into(),
        format!("{}.{}", parts[0], parts[1]),
        format!("{good}.{}", parts[2]),
        "!!!.@@@.###".into(),
        format!("{}.{}.{}", b64(b"not json"), parts[1], parts[2]),
        format!("{}.{}.{}", parts[0], b64(b"[1,2]"), parts[2]),
        format!("{}.{}.{}", parts[0], parts[1], b64(&[0u8; 64])),
        format!("{}.{}.{}", parts[0], parts[1], ""),
        format!("{}=.{}.{}", parts[0], parts[1], parts[2]),
        good.replace('-', "+").replace('_', "/") + "+",
        format!(" {good}"),
        format!("{good}\n"),
        "é.é.é".into(),
    ];
    for shape in shapes {
        assert!(
            matches!(verifier.verify(&shape, NOW), Err(TokenError::Invalid(_))),
            "{shape:?} was not refused as Invalid"
        );
    }
    // The untouched token still verifies, so the cases above failed for their own reasons.
    assert!(verifier.verify(&good, NOW).is_ok());
}

fn shared_verifier() -> &'static (AgentTokenVerifier, String) {
    static SHARED: std::sync::OnceLock<(AgentTokenVerifier, String)> = std::sync::OnceLock::new();
    SHARED.get_or_init(|| {
        let (private_pem, public_pem) = ed25519_keypair_pem().expect("keypair");
        (
            verifier(vec![ed25519_key_entry(&public_pem, None)]),
            sign_ed(&private_pem, agent_claims(2_000)),
        )
    })
}

proptest! {
    #[test]
    fn random_strings_are_invalid_and_never_panic(token in "\\PC{0,200}") {
        let (verifier, _) = shared_verifier();
        prop_assert!(matches!(verifier.verify(&token, NOW), Err(TokenError::Invalid(_))));
    }

    #[test]
    fn random_three_part_tokens_are_invalid(
        header in proptest::collection::vec(any::<u8>(), 0..64),
        claims in proptest::collection::vec(any::<u8>(), 0..64),
        signature in proptest::collection::vec(any::<u8>(), 0..80),
    ) {
        let (verifier, _) = shared_verifier();
        let token = format!("{}.{}.{}", b64(&header), b64(&claims), b64(&signature));
        prop_assert!(matches!(verifier.verify(&token, NOW), Err(TokenError::Invalid(_))));
    }

    #[test]
    fn any_single_character_change_to_a_valid_token_is_refused(index in 0usize..400, replacement in "[A-Za-z0-9_.=+/-]") {
        let (verifier, good) = shared_verifier();
        let index = index % good.len();
        let original = good.get(index..index + 1).unwrap_or_default();
        prop_assume!(original != replacement);
        let mut mutated = good.clone();
        mutated.replace_range(index..index + 1, &replacement);
        prop_assert!(verifier.verify(&mutated, NOW).is_err());
    }
}
