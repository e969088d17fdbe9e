//! Test helpers: fixed ES256/RS256 key pairs (tests/keys/), key entries and hand-built tokens whose
//! header can say anything (the point of the alg-confusion tests).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ed25519_dalek::pkcs8::DecodePublicKey;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey};
use serde_json::{json, Value};

use super::KeyConfig;

pub(crate) const ES256_PRIVATE: &str = include_str!("../../tests/keys/es256.private.pem");
pub(crate) const ES256_PUBLIC: &str = include_str!("../../tests/keys/es256.public.pem");
pub(crate) const RS256_PRIVATE: &str = include_str!("../../tests/keys/rs256.private.pem");
pub(crate) const RS256_PUBLIC: &str = include_str!("../../tests/keys/rs256.public.pem");
pub(crate) const P384_PUBLIC: &str = include_str!("../../tests/keys/p384.public.pem");
pub(crate) const RSA1024_PUBLIC: &str = include_str!("../../tests/keys/rsa1024.public.pem");

/// A 32-byte HS256 secret.
pub(crate) const HS256_SECRET: &str = "0123456789abcdef0123456789abcdef";

pub(crate) fn key_entry(alg: &str, public_pem: &str, kid: Option<&str>) -> KeyConfig {
    KeyConfig {
        alg: Some(alg.to_owned()),
        kid: kid.map(str::to_owned),
        public_key_pem: Some(public_pem.to_owned()),
        ..KeyConfig::default()
    }
}

pub(crate) fn ed25519_key_entry(public_pem: &str, kid: Option<&str>) -> KeyConfig {
    key_entry("EdDSA", public_pem, kid)
}

pub(crate) fn secret_entry(secret: &str, kid: Option<&str>) -> KeyConfig {
    KeyConfig {
        alg: Some("HS256".to_owned()),
        kid: kid.map(str::to_owned),
        secret: Some(secret.to_owned()),
        ..KeyConfig::default()
    }
}

/// EdDSA token without kid, through the public signing helper.
pub(crate) fn sign_ed(private_pem: &str, claims: Value) -> String {
    super::sign_eddsa_for_tests_and_cli(private_pem, &claims, None).expect("test token signs")
}

pub(crate) fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// A token with exactly this header and these claims, signed with `key` under `alg`.
pub(crate) fn sign_raw(
    header: &Value,
    claims: &Value,
    key: &EncodingKey,
    alg: Algorithm,
) -> String {
    let input = format!(
        "{}.{}",
        b64(header.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    );
    let signature =
        jsonwebtoken::crypto::sign(input.as_bytes(), key, alg).expect("test token signs");
    format!("{input}.{signature}")
}

pub(crate) fn es256_signing_key() -> EncodingKey {
    EncodingKey::from_ec_pem(ES256_PRIVATE.as_bytes()).expect("ES256 test key")
}

pub(crate) fn rs256_signing_key() -> EncodingKey {
    EncodingKey::from_rsa_pem(RS256_PRIVATE.as_bytes()).expect("RS256 test key")
}

pub(crate) fn ed25519_signing_key(private_pem: &str) -> EncodingKey {
    EncodingKey::from_ed_pem(private_pem.as_bytes()).expect("Ed25519 test key")
}

/// Complete, valid agent claims expiring at `exp`.
pub(crate) fn agent_claims(exp: i64) -> Value {
    json!({"sub": "agent-7", "scp": "agent-runtime", "exec_id": "exec-42", "wid": "c-1",
           "jti": "jti-1", "iat": 1_000, "exp": exp})
}

/// Public JWKs of an Ed25519 key and of the fixed ES256 and RS256 keys.
pub(crate) fn ed_jwk(public_pem: &str, kid: &str) -> Value {
    let key = ed25519_dalek::VerifyingKey::from_public_key_pem(public_pem).expect("Ed25519 key");
    json!({"kty": "OKP", "crv": "Ed25519", "x": b64(key.as_bytes()), "kid": kid, "alg": "EdDSA", "use": "sig"})
}

pub(crate) fn es256_jwk(kid: &str) -> Value {
    let key = DecodingKey::from_ec_pem(ES256_PUBLIC.as_bytes()).expect("EC key");
    let point = key.try_get_as_bytes().expect("point");
    let (x, y) = point.get(1..).expect("uncompressed point").split_at(32);
    json!({"kty": "EC", "crv": "P-256", "x": b64(x), "y": b64(y), "kid": kid})
}

pub(crate) fn rs256_jwk(kid: &str) -> Value {
    let key = DecodingKey::from_rsa_pem(RS256_PUBLIC.as_bytes()).expect("RSA key");
    let components = jsonwebtoken::crypto::rust_crypto::DEFAULT_PROVIDER
        .key_utils
        .rsa_pub_components_from_public_key;
    let (n, e) = components(key.try_get_as_bytes().expect("der")).expect("components");
    json!({"kty": "RSA", "n": b64(&n), "e": b64(&e), "kid": kid, "alg": "RS256"})
}
