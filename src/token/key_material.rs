//! Key material: the algorithms SPEC section 4 supports, and public keys decoded from PEM and from
//! JWKs, each pinned to one algorithm. Both the configured keys and fetched key sets use it.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use ed25519_dalek::pkcs8::DecodePublicKey;
use jsonwebtoken::{Algorithm, DecodingKey};
use serde_json::{Map, Value};

/// The algorithms SPEC section 4 supports. Anything else in a config or a token header is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenAlg {
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

    pub(super) fn jwt_algorithm(self) -> Algorithm {
        match self {
            TokenAlg::EdDsa => Algorithm::EdDSA,
            TokenAlg::Es256 => Algorithm::ES256,
            TokenAlg::Rs256 => Algorithm::RS256,
            TokenAlg::Hs256 => Algorithm::HS256,
        }
    }
}

/// Why a public key (PEM, raw bytes or RSA components) was refused. The messages name the problem and
/// never hold key bytes.
#[derive(Debug, thiserror::Error)]
pub enum KeyMaterialError {
    #[error("no PEM block found")]
    NoPemBlock,
    #[error("more than one PEM block; give exactly one public key")]
    SeveralPemBlocks,
    #[error("malformed PEM header line")]
    PemHeader,
    #[error("PEM block is `{label}`; expected a `PUBLIC KEY` (SubjectPublicKeyInfo) for {}", alg.name())]
    PemLabel { label: String, alg: TokenAlg },
    /// The text or bytes do not decode as `kind` ("an Ed25519 public key", "a P-256 point", …).
    #[error("not {kind}: {detail}")]
    NotA { kind: &'static str, detail: String },
    /// The crypto layer refused a decoded key; `kind` is "Ed25519 key" or "EC key".
    #[error("{kind} unusable: {detail}")]
    Unusable { kind: &'static str, detail: String },
    /// The verifier for the key's algorithm could not be built (see [`probe`]).
    #[error("{0}")]
    Probe(jsonwebtoken::errors::Error),
    #[error("HS256 takes `secret`, not a PEM key")]
    SecretAsPem,
    #[error("HS256 keys come from `secret` only, not from a JWKS")]
    SecretInJwks,
    #[error("Ed25519 public key is {0} bytes, not 32")]
    Ed25519Length(usize),
    #[error("Ed25519 public key has small order")]
    WeakEd25519,
    #[error("P-256 coordinates must be 32 bytes each")]
    P256Coordinates,
    #[error("RSA modulus has {0} bits; {MIN_RSA_BITS} to {MAX_RSA_BITS} are accepted")]
    RsaModulusBits(usize),
    #[error("RSA modulus is even")]
    EvenRsaModulus,
    #[error("RSA public exponent is too large")]
    RsaExponentTooLarge,
    #[error("RSA public exponent {0} is not acceptable")]
    RsaExponent(u64),
    #[error(transparent)]
    Jwk(#[from] JwkError),
}

/// Why a JWK, or a JWK Set document, was refused.
#[derive(Debug, thiserror::Error)]
pub enum JwkError {
    #[error("not valid JSON: {0}")]
    NotJson(String),
    #[error("not a JSON object")]
    NotAnObject,
    #[error("unknown member `{0}` (a JWKS holds only `keys`)")]
    UnknownSetMember(String),
    #[error("`keys` must be an array")]
    KeysNotAnArray,
    #[error("`keys` is empty")]
    NoKeys,
    #[error("not a JWK Set: no `keys` array")]
    NotAJwkSet,
    /// One entry of a set, by its index in `keys`.
    #[error("keys[{index}]: {source}")]
    Entry {
        index: usize,
        source: Box<KeyMaterialError>,
    },
    #[error("`{0}` is missing")]
    Missing(&'static str),
    #[error("`{0}` is not a string")]
    NotAString(&'static str),
    #[error("`{name}` is not unpadded base64url: {source}")]
    NotBase64Url {
        name: &'static str,
        source: base64::DecodeError,
    },
    // A symmetric key published at a URL would let anyone who reads it sign tokens.
    #[error("kty `oct`: shared secrets are never taken from a JWK Set")]
    SharedSecret,
    #[error("kty `{0}` is not supported")]
    UnsupportedKty(String),
    #[error("alg `{alg}` with kty `{kty}`: only {} is accepted for this key type", only.name())]
    AlgForKty {
        alg: String,
        kty: String,
        only: TokenAlg,
    },
    #[error("a {} key, and this entry admits {} only", alg.name(), pin.name())]
    NotThePinnedAlg { alg: TokenAlg, pin: TokenAlg },
    #[error("kty `{kty}` does not fit alg {} (expected {expected})", alg.name())]
    KtyForAlg {
        kty: String,
        alg: TokenAlg,
        expected: &'static str,
    },
    #[error("holds private key material (`{0}`); configure public keys only")]
    PrivateMember(String),
    #[error("member `{name}` is not allowed in an {} JWK", alg.name())]
    UnknownMember { name: String, alg: TokenAlg },
    #[error("the JWK says alg `{own}` but the key entry pins {}", alg.name())]
    AlgForEntry { own: String, alg: TokenAlg },
    #[error("use `{0}` is not `sig`")]
    NotForSignatures(String),
    #[error("key_ops does not include `verify`")]
    NoVerifyOp,
    #[error("kid must not be empty")]
    EmptyKid,
    #[error("crv `{found}` is not {expected}")]
    WrongCurve {
        found: String,
        expected: &'static str,
    },
    #[error("`crv` is missing (expected {0})")]
    NoCurve(&'static str),
}

fn not_a(kind: &'static str, detail: impl std::fmt::Display) -> KeyMaterialError {
    KeyMaterialError::NotA {
        kind,
        detail: detail.to_string(),
    }
}

/// A loaded key, usable only with `alg`.
pub(crate) struct PinnedKey {
    pub(super) alg: TokenAlg,
    pub(super) kid: Option<String>,
    pub(super) key: DecodingKey,
}

impl PinnedKey {
    pub(crate) fn kid(&self) -> Option<&str> {
        self.kid.as_deref()
    }
}

/// RSA moduli below 2048 bits are refused (NIST SP 800-131A); 8192 is the `rsa` crate's own ceiling.
const MIN_RSA_BITS: usize = 2048;
const MAX_RSA_BITS: usize = 8192;

/// The single PEM label of `pem`, refusing text with zero or several blocks.
fn single_pem_label(pem: &str) -> Result<&str, KeyMaterialError> {
    const BEGIN: &str = "-----BEGIN ";
    let mut blocks = pem.match_indices(BEGIN);
    let Some((start, _)) = blocks.next() else {
        return Err(KeyMaterialError::NoPemBlock);
    };
    if blocks.next().is_some() {
        return Err(KeyMaterialError::SeveralPemBlocks);
    }
    let rest = pem.get(start + BEGIN.len()..).unwrap_or_default();
    let (label, _) = rest
        .split_once("-----")
        .ok_or(KeyMaterialError::PemHeader)?;
    Ok(label)
}

/// Loads a public key PEM as a key of `alg`. Private keys and certificates are refused: configuration
/// holds public halves only.
pub(super) fn key_from_pem(alg: TokenAlg, pem: &str) -> Result<DecodingKey, KeyMaterialError> {
    let label = single_pem_label(pem)?;
    let label_ok = label == "PUBLIC KEY" || (alg == TokenAlg::Rs256 && label == "RSA PUBLIC KEY");
    if !label_ok {
        return Err(KeyMaterialError::PemLabel {
            label: label.to_owned(),
            alg,
        });
    }
    match alg {
        TokenAlg::EdDsa => {
            let key = ed25519_dalek::VerifyingKey::from_public_key_pem(pem)
                .map_err(|err| not_a("an Ed25519 public key", err))?;
            ed25519_key(key.as_bytes())
        }
        TokenAlg::Es256 => {
            let key = DecodingKey::from_ec_pem(pem.as_bytes())
                .map_err(|err| not_a("an EC public key", err))?;
            // The PEM reader accepts any EC curve; creating the ES256 verifier proves it is P-256.
            probe(&key, alg).map_err(|err| not_a("a P-256 public key", err))?;
            Ok(key)
        }
        TokenAlg::Rs256 => {
            let not_rsa = |err: jsonwebtoken::errors::Error| not_a("an RSA public key", err);
            let key = DecodingKey::from_rsa_pem(pem.as_bytes()).map_err(not_rsa)?;
            let der = key.try_get_as_bytes().map_err(not_rsa)?;
            let components = jsonwebtoken::crypto::rust_crypto::DEFAULT_PROVIDER
                .key_utils
                .rsa_pub_components_from_public_key;
            let (modulus, exponent) = components(der).map_err(not_rsa)?;
            rsa_key(&modulus, &exponent)
        }
        TokenAlg::Hs256 => Err(KeyMaterialError::SecretAsPem),
    }
}

/// An Ed25519 key from its 32 raw bytes, refusing small-order ("weak") points that many signatures
/// would verify under.
pub(super) fn ed25519_key(raw: &[u8]) -> Result<DecodingKey, KeyMaterialError> {
    let bytes: &[u8; 32] = raw
        .try_into()
        .map_err(|_| KeyMaterialError::Ed25519Length(raw.len()))?;
    let key = ed25519_dalek::VerifyingKey::from_bytes(bytes)
        .map_err(|err| not_a("a valid Ed25519 point", err))?;
    if key.is_weak() {
        return Err(KeyMaterialError::WeakEd25519);
    }
    let decoding = DecodingKey::from_ed_components(&URL_SAFE_NO_PAD.encode(bytes))
        .map_err(|err| unusable("Ed25519 key", err))?;
    probe(&decoding, TokenAlg::EdDsa)?;
    Ok(decoding)
}

/// An RSA key from big-endian modulus and exponent, checked so that every later verification can use it.
pub(super) fn rsa_key(modulus: &[u8], exponent: &[u8]) -> Result<DecodingKey, KeyMaterialError> {
    let modulus = strip_leading_zeros(modulus);
    let exponent = strip_leading_zeros(exponent);
    let bits = bit_length(modulus);
    if !(MIN_RSA_BITS..=MAX_RSA_BITS).contains(&bits) {
        return Err(KeyMaterialError::RsaModulusBits(bits));
    }
    if modulus.last().is_none_or(|byte| byte & 1 == 0) {
        return Err(KeyMaterialError::EvenRsaModulus);
    }
    // The `rsa` crate accepts public exponents 3..=2^33-1, odd; refuse at load what it would refuse later.
    if exponent.len() > 5 {
        return Err(KeyMaterialError::RsaExponentTooLarge);
    }
    let value = exponent
        .iter()
        .fold(0u64, |acc, byte| (acc << 8) | u64::from(*byte));
    if !(3..=(1u64 << 33) - 1).contains(&value) || value & 1 == 0 {
        return Err(KeyMaterialError::RsaExponent(value));
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
pub(super) fn probe(key: &DecodingKey, alg: TokenAlg) -> Result<(), KeyMaterialError> {
    jsonwebtoken::crypto::verify("", b"", key, alg.jwt_algorithm())
        .map(|_| ())
        .map_err(KeyMaterialError::Probe)
}

/// Members a public JWK may carry; anything else (private parts included) is refused.
const COMMON_JWK_MEMBERS: &[&str] = &[
    "kty", "alg", "use", "key_ops", "kid", "x5c", "x5t", "x5t#S256", "x5u",
];

/// Members that only a private or secret JWK has (RFC 7518 6.2.2, 6.3.2, 6.4).
const PRIVATE_JWK_MEMBERS: &[&str] = &["d", "p", "q", "dp", "dq", "qi", "oth", "k"];

/// Loads every key of a JWKS document, each pinned to `alg`. A key whose own `kty`/`crv`/`alg` says it
/// is for something else makes the whole file invalid (fail closed) rather than being skipped.
pub(super) fn keys_from_jwks(
    alg: TokenAlg,
    text: &str,
) -> Result<Vec<PinnedKey>, KeyMaterialError> {
    if alg == TokenAlg::Hs256 {
        return Err(KeyMaterialError::SecretInJwks);
    }
    let document: Value =
        serde_json::from_str(text).map_err(|err| JwkError::NotJson(err.to_string()))?;
    let Value::Object(document) = document else {
        return Err(JwkError::NotAnObject.into());
    };
    if let Some(unknown) = document.keys().find(|name| name.as_str() != "keys") {
        return Err(JwkError::UnknownSetMember(unknown.clone()).into());
    }
    let Some(Value::Array(entries)) = document.get("keys") else {
        return Err(JwkError::KeysNotAnArray.into());
    };
    if entries.is_empty() {
        return Err(JwkError::NoKeys.into());
    }
    entries
        .iter()
        .enumerate()
        .map(|(index, entry)| {
            jwk_to_key(alg, entry, Members::Strict).map_err(|err| entry_error(index, err))
        })
        .collect()
}

fn entry_error(index: usize, source: KeyMaterialError) -> KeyMaterialError {
    JwkError::Entry {
        index,
        source: Box::new(source),
    }
    .into()
}

fn unusable(kind: &'static str, detail: impl std::fmt::Display) -> KeyMaterialError {
    KeyMaterialError::Unusable {
        kind,
        detail: detail.to_string(),
    }
}

/// The keys of a JWK Set fetched from an identity provider, and why each other JWK was skipped. Each
/// key is pinned by its own `kty`/`crv`/`alg`; `pin`, when the entry names one, admits only that
/// algorithm. A JWK that is unknown, contradicts itself or holds private material is skipped, never
/// trusted loosely; a document that is not a JWK Set is an error (the last good set stays in use).
pub(crate) fn keys_from_fetched_jwks(
    body: &[u8],
    pin: Option<TokenAlg>,
) -> Result<(Vec<PinnedKey>, Vec<KeyMaterialError>), JwkError> {
    let document = crate::strict_json::parse_strict_json(body).map_err(JwkError::NotJson)?;
    let Some(Value::Array(entries)) = document.get("keys") else {
        return Err(JwkError::NotAJwkSet);
    };
    let mut keys = Vec::new();
    let mut skipped = Vec::new();
    for (index, entry) in entries.iter().enumerate() {
        let pinned = jwk_alg(entry)
            .map_err(KeyMaterialError::from)
            .and_then(|alg| match pin {
                Some(pin) if pin != alg => Err(JwkError::NotThePinnedAlg { alg, pin }.into()),
                _ => jwk_to_key(alg, entry, Members::IgnoreUnknown),
            });
        match pinned {
            Ok(key) => keys.push(key),
            Err(err) => skipped.push(entry_error(index, err)),
        }
    }
    Ok((keys, skipped))
}

/// The one algorithm a JWK is used with, from its key type; an `alg` member must agree with it.
fn jwk_alg(entry: &Value) -> Result<TokenAlg, JwkError> {
    let Value::Object(jwk) = entry else {
        return Err(JwkError::NotAnObject);
    };
    let kty = jwk_string(jwk, "kty")?.ok_or(JwkError::Missing("kty"))?;
    let by_type = match kty {
        "OKP" => TokenAlg::EdDsa,
        "EC" => TokenAlg::Es256,
        "RSA" => TokenAlg::Rs256,
        "oct" => return Err(JwkError::SharedSecret),
        other => return Err(JwkError::UnsupportedKty(other.to_owned())),
    };
    match jwk_string(jwk, "alg")? {
        Some(own) if own != by_type.name() => Err(JwkError::AlgForKty {
            alg: own.to_owned(),
            kty: kty.to_owned(),
            only: by_type,
        }),
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

fn jwk_to_key(
    alg: TokenAlg,
    entry: &Value,
    members: Members,
) -> Result<PinnedKey, KeyMaterialError> {
    let Value::Object(jwk) = entry else {
        return Err(JwkError::NotAnObject.into());
    };
    let (expected_kty, curve_members): (&str, &[&str]) = match alg {
        TokenAlg::EdDsa => ("OKP", &["crv", "x"]),
        TokenAlg::Es256 => ("EC", &["crv", "x", "y"]),
        TokenAlg::Rs256 => ("RSA", &["n", "e"]),
        TokenAlg::Hs256 => return Err(KeyMaterialError::SecretInJwks),
    };
    let kty = jwk_string(jwk, "kty")?.ok_or(JwkError::Missing("kty"))?;
    if kty != expected_kty {
        return Err(JwkError::KtyForAlg {
            kty: kty.to_owned(),
            alg,
            expected: expected_kty,
        }
        .into());
    }
    check_jwk_members(jwk, alg, curve_members, members)?;
    let kid = jwk_string(jwk, "kid")?;
    if kid.is_some_and(str::is_empty) {
        return Err(JwkError::EmptyKid.into());
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
                return Err(KeyMaterialError::P256Coordinates);
            }
            let key = DecodingKey::from_ec_components(
                &URL_SAFE_NO_PAD.encode(&x),
                &URL_SAFE_NO_PAD.encode(&y),
            )
            .map_err(|err| unusable("EC key", err))?;
            probe(&key, alg).map_err(|err| not_a("a P-256 point", err))?;
            key
        }
        TokenAlg::Rs256 => rsa_key(&jwk_bytes(jwk, "n")?, &jwk_bytes(jwk, "e")?)?,
        TokenAlg::Hs256 => return Err(KeyMaterialError::SecretInJwks),
    };
    Ok(PinnedKey {
        alg,
        kid: kid.map(str::to_owned),
        key,
    })
}

/// The members a JWK may carry for `alg`, and what it says about its own use.
fn check_jwk_members(
    jwk: &Map<String, Value>,
    alg: TokenAlg,
    curve_members: &[&str],
    members: Members,
) -> Result<(), JwkError> {
    for name in jwk.keys() {
        if COMMON_JWK_MEMBERS.contains(&name.as_str()) || curve_members.contains(&name.as_str()) {
            continue;
        }
        if PRIVATE_JWK_MEMBERS.contains(&name.as_str()) {
            return Err(JwkError::PrivateMember(name.clone()));
        }
        if members == Members::Strict {
            return Err(JwkError::UnknownMember {
                name: name.clone(),
                alg,
            });
        }
    }
    if let Some(own) = jwk_string(jwk, "alg")? {
        if own != alg.name() {
            return Err(JwkError::AlgForEntry {
                own: own.to_owned(),
                alg,
            });
        }
    }
    if let Some(usage) = jwk_string(jwk, "use")? {
        if usage != "sig" {
            return Err(JwkError::NotForSignatures(usage.to_owned()));
        }
    }
    if let Some(ops) = jwk.get("key_ops") {
        let allows_verify = ops
            .as_array()
            .is_some_and(|ops| ops.iter().any(|op| op.as_str() == Some("verify")));
        if !allows_verify {
            return Err(JwkError::NoVerifyOp);
        }
    }
    Ok(())
}

fn jwk_string<'a>(
    jwk: &'a Map<String, Value>,
    name: &'static str,
) -> Result<Option<&'a str>, JwkError> {
    match jwk.get(name) {
        None => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(_) => Err(JwkError::NotAString(name)),
    }
}

fn jwk_bytes(jwk: &Map<String, Value>, name: &'static str) -> Result<Vec<u8>, JwkError> {
    let text = jwk_string(jwk, name)?.ok_or(JwkError::Missing(name))?;
    URL_SAFE_NO_PAD
        .decode(text)
        .map_err(|source| JwkError::NotBase64Url { name, source })
}

fn expect_curve(jwk: &Map<String, Value>, curve: &'static str) -> Result<(), JwkError> {
    match jwk_string(jwk, "crv")? {
        Some(found) if found == curve => Ok(()),
        Some(found) => Err(JwkError::WrongCurve {
            found: found.to_owned(),
            expected: curve,
        }),
        None => Err(JwkError::NoCurve(curve)),
    }
}
