//! Ed25519 key and signature handling for seal/v1: session public keys in every accepted encoding,
//! envelope signatures (check 7), and the signing-side helpers that the CLI (`keygen`, `sign`) needs.
//!
//! Keys are refused unless they are canonical encodings of points of large order, so that one key has
//! exactly one byte form (sessions compare keys by bytes) and no weak key can make a forged signature
//! verify.

use std::fmt;
use std::path::{Path, PathBuf};

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;
use ed25519_dalek::pkcs8::spki;
use ed25519_dalek::pkcs8::spki::der::pem::LineEnding;
use ed25519_dalek::pkcs8::{
    DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey, KeypairBytes,
};
use ed25519_dalek::{Signature, SigningKey, VerifyingKey};
use serde_json::Value;

use super::EnvelopeError;

/// Decoding with padding optional; trailing non-zero bits stay refused (one text per byte string).
const PADDING_OPTIONAL: GeneralPurposeConfig =
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
const STANDARD_ANY_PADDING: GeneralPurpose =
    GeneralPurpose::new(&alphabet::STANDARD, PADDING_OPTIONAL);
const URL_SAFE_ANY_PADDING: GeneralPurpose =
    GeneralPurpose::new(&alphabet::URL_SAFE, PADDING_OPTIONAL);

/// Base64 of 64 bytes takes 86 characters (88 with padding); anything much longer is refused before
/// decoding so that a huge string costs nothing.
const MAX_SIGNATURE_TEXT_CHARS: usize = 128;

/// Why a text is not base64 in either accepted alphabet.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Base64Error {
    #[error("empty base64 text")]
    Empty,
    #[error("invalid base64: {0}")]
    Invalid(#[from] base64::DecodeError),
}

/// Why a public or private key, a key file or a key's encoding was refused. The messages name the
/// problem and never hold key material.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("PEM public key must be an SPKI block (-----BEGIN PUBLIC KEY-----)")]
    NotSpki,
    #[error("invalid Ed25519 SPKI PEM public key: {0}")]
    Spki(spki::Error),
    #[error("PEM private key must be a PKCS#8 block (-----BEGIN PRIVATE KEY-----)")]
    NotPkcs8,
    #[error("invalid Ed25519 PKCS#8 PEM private key: {0}")]
    Pkcs8(ed25519_dalek::pkcs8::Error),
    /// `half` is "public" or "private".
    #[error("invalid hex {half} key: {source}")]
    Hex {
        half: &'static str,
        source: hex::FromHexError,
    },
    #[error("public key is neither 64 hex digits, base64 nor an SPKI PEM: {0}")]
    PublicEncoding(Base64Error),
    #[error("private key is neither a PKCS#8 PEM, 64 hex digits, base64 nor keygen JSON: {0}")]
    PrivateEncoding(Base64Error),
    #[error("public key decodes to {0} bytes; Ed25519 public keys are 32 bytes")]
    PublicLength(usize),
    #[error(
        "private key decodes to {0} bytes; expected a 32-byte seed or 64-byte seed ‖ public key"
    )]
    PrivateLength(usize),
    #[error("public key bytes are not an Ed25519 curve point")]
    NotACurvePoint,
    #[error("public key has small order (a weak key) and is refused")]
    WeakPublicKey,
    #[error("public key is a non-canonical point encoding")]
    NonCanonicalPublicKey,
    #[error("64-byte private key: its public half does not match its seed")]
    KeypairMismatch,
    /// A `sealgate keygen` JSON key whose fields are missing, mistyped or describe different keys.
    #[error("{0}")]
    KeygenJson(KeygenJsonError),
    /// A key inside a keygen JSON field, named by the field.
    #[error("keygen JSON `{field}`: {source}")]
    KeygenField {
        field: &'static str,
        source: Box<KeyError>,
    },
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    InFile {
        path: PathBuf,
        source: Box<KeyError>,
    },
    #[error("operating system random source failed: {0}")]
    Random(getrandom::Error),
    #[error("cannot encode the private key as PKCS#8 PEM: {0}")]
    EncodePrivate(ed25519_dalek::pkcs8::Error),
    #[error("cannot encode the public key as SPKI PEM: {0}")]
    EncodePublic(spki::Error),
}

/// How a `sealgate keygen` JSON key file is inconsistent; it is refused rather than half-used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeygenJsonError {
    #[error("private key starts with `{{` but is not a JSON object like `sealgate keygen` prints")]
    NotAnObject,
    #[error("keygen JSON: `{0}` is not a string")]
    NotAString(&'static str),
    #[error("keygen JSON has neither `private_key` nor `private_key_pem`")]
    NoPrivateKey,
    #[error("keygen JSON: `private_key` and `private_key_pem` are different keys")]
    DifferentPrivateKeys,
    #[error("keygen JSON: `{0}` is not the public half of the private key")]
    NotThePublicHalf(&'static str),
}

impl From<KeygenJsonError> for KeyError {
    fn from(error: KeygenJsonError) -> Self {
        KeyError::KeygenJson(error)
    }
}

// The evidence signer, the console sign-in and the CLI still answer `String`; they keep using `?` on
// key errors until their own errors are typed.
impl From<KeyError> for String {
    fn from(error: KeyError) -> Self {
        error.to_string()
    }
}

/// Decodes base64 in the standard or the URL-safe alphabet, padding optional (SPEC section 2).
/// A text that mixes the two alphabets is refused.
pub fn decode_base64_flexible(text: &str) -> Result<Vec<u8>, Base64Error> {
    if text.is_empty() {
        return Err(Base64Error::Empty);
    }
    let engine = if text.contains(['-', '_']) {
        &URL_SAFE_ANY_PADDING
    } else {
        &STANDARD_ANY_PADDING
    };
    Ok(engine.decode(text)?)
}

/// Decodes the envelope's `signature` field (check 7, code 1001 on failure).
pub fn decode_signature(text: &str) -> Result<Signature, EnvelopeError> {
    if text.len() > MAX_SIGNATURE_TEXT_CHARS {
        return Err(EnvelopeError::SignatureEncoding(format!(
            "signature is {} characters long; a 64-byte signature in base64 takes at most 88",
            text.len()
        )));
    }
    let bytes = decode_base64_flexible(text)
        .map_err(|error| EnvelopeError::SignatureEncoding(format!("signature: {error}")))?;
    let array: [u8; 64] = bytes.as_slice().try_into().map_err(|_| {
        EnvelopeError::SignatureEncoding(format!(
            "signature decodes to {} bytes; Ed25519 signatures are 64 bytes",
            bytes.len()
        ))
    })?;
    Ok(Signature::from_bytes(&array))
}

/// A session's Ed25519 public key: a canonical encoding of a point of large order.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SessionKey(VerifyingKey);

impl fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SessionKey({})", self.to_base64())
    }
}

impl SessionKey {
    /// Reads a public key given as standard or URL-safe base64 of the raw 32 bytes (padding optional),
    /// as 64 hex digits, or as an SPKI PEM block (`-----BEGIN PUBLIC KEY-----`). Surrounding white
    /// space is ignored.
    pub fn parse(text: &str) -> Result<SessionKey, KeyError> {
        let text = text.trim();
        if text.starts_with("-----BEGIN") {
            if !text.starts_with("-----BEGIN PUBLIC KEY-----") {
                return Err(KeyError::NotSpki);
            }
            let key = VerifyingKey::from_public_key_pem(text).map_err(KeyError::Spki)?;
            return SessionKey::from_bytes(key.as_bytes());
        }
        let bytes = if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
            hex::decode(text).map_err(|source| KeyError::Hex {
                half: "public",
                source,
            })?
        } else {
            decode_base64_flexible(text).map_err(KeyError::PublicEncoding)?
        };
        let array: [u8; 32] = bytes
            .as_slice()
            .try_into()
            .map_err(|_| KeyError::PublicLength(bytes.len()))?;
        SessionKey::from_bytes(&array)
    }

    /// Accepts the raw 32-byte encoding when it is a canonical point of large order.
    pub fn from_bytes(bytes: &[u8; 32]) -> Result<SessionKey, KeyError> {
        let key = VerifyingKey::from_bytes(bytes).map_err(|_| KeyError::NotACurvePoint)?;
        if key.is_weak() {
            return Err(KeyError::WeakPublicKey);
        }
        // Decompression tolerates a few non-canonical encodings; requiring the canonical one keeps
        // "same key" equal to "same bytes".
        if key.to_edwards().compress().to_bytes() != *bytes {
            return Err(KeyError::NonCanonicalPublicKey);
        }
        Ok(SessionKey(key))
    }

    pub fn to_bytes(&self) -> [u8; 32] {
        self.0.to_bytes()
    }

    /// Standard base64 with padding, the form SPEC section 5 shows.
    pub fn to_base64(&self) -> String {
        STANDARD.encode(self.0.as_bytes())
    }

    pub fn verifying_key(&self) -> &VerifyingKey {
        &self.0
    }

    /// Strict Ed25519 verification (check 7): refuses non-canonical `S`, small-order `R`, any mismatch.
    pub fn verify(&self, message: &[u8], signature: &Signature) -> Result<(), EnvelopeError> {
        self.0
            .verify_strict(message, signature)
            .map_err(|_| EnvelopeError::SignatureMismatch)
    }
}

/// A fresh signing key from the operating system's random source.
pub fn generate_signing_key() -> Result<SigningKey, KeyError> {
    let mut seed = [0u8; 32];
    getrandom::getrandom(&mut seed).map_err(KeyError::Random)?;
    Ok(SigningKey::from_bytes(&seed))
}

/// Reads a private key given as PKCS#8 PEM (`-----BEGIN PRIVATE KEY-----`, v1 or v2), as 64 hex digits of
/// the 32-byte seed, as base64 (either alphabet, padding optional) of the seed or of seed ‖ public key
/// (the 64-byte libsodium form, whose public half must match), or as the JSON that `sealgate keygen`
/// prints (every key field in it must describe the same key).
pub fn signing_key_from_text(text: &str) -> Result<SigningKey, KeyError> {
    let text = text.trim();
    if text.starts_with('{') {
        return signing_key_from_keygen_json(text);
    }
    signing_key_from_plain_text(text)
}

/// [`signing_key_from_text`] of the file at `path`; errors name the file.
pub fn read_signing_key_file(path: &Path) -> Result<SigningKey, KeyError> {
    let text = std::fs::read_to_string(path).map_err(|source| KeyError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    signing_key_from_text(&text).map_err(|source| KeyError::InFile {
        path: path.to_path_buf(),
        source: Box::new(source),
    })
}

fn signing_key_from_plain_text(text: &str) -> Result<SigningKey, KeyError> {
    if text.starts_with("-----BEGIN") {
        if !text.starts_with("-----BEGIN PRIVATE KEY-----") {
            return Err(KeyError::NotPkcs8);
        }
        return SigningKey::from_pkcs8_pem(text).map_err(KeyError::Pkcs8);
    }
    let bytes = if text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit()) {
        hex::decode(text).map_err(|source| KeyError::Hex {
            half: "private",
            source,
        })?
    } else {
        decode_base64_flexible(text).map_err(KeyError::PrivateEncoding)?
    };
    if let Ok(seed) = <[u8; 32]>::try_from(bytes.as_slice()) {
        return Ok(SigningKey::from_bytes(&seed));
    }
    if let Ok(keypair) = <[u8; 64]>::try_from(bytes.as_slice()) {
        return SigningKey::from_keypair_bytes(&keypair).map_err(|_| KeyError::KeypairMismatch);
    }
    Err(KeyError::PrivateLength(bytes.len()))
}

/// `sealgate keygen`'s JSON: `private_key` and/or `private_key_pem`, optionally the public halves. A key
/// file whose fields disagree was edited or mixed up, so it is refused rather than half-used.
fn signing_key_from_keygen_json(text: &str) -> Result<SigningKey, KeyError> {
    let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(text) else {
        return Err(KeygenJsonError::NotAnObject.into());
    };
    let field_text = |name: &'static str| -> Result<Option<&str>, KeygenJsonError> {
        match fields.get(name) {
            None => Ok(None),
            Some(Value::String(text)) => Ok(Some(text)),
            Some(_) => Err(KeygenJsonError::NotAString(name)),
        }
    };
    let in_field = |field: &'static str| {
        move |source| KeyError::KeygenField {
            field,
            source: Box::new(source),
        }
    };
    let mut key: Option<SigningKey> = None;
    for name in ["private_key", "private_key_pem"] {
        let Some(text) = field_text(name)? else {
            continue;
        };
        let parsed = signing_key_from_plain_text(text.trim()).map_err(in_field(name))?;
        if key
            .as_ref()
            .is_some_and(|k| k.to_bytes() != parsed.to_bytes())
        {
            return Err(KeygenJsonError::DifferentPrivateKeys.into());
        }
        key = Some(parsed);
    }
    let key = key.ok_or(KeygenJsonError::NoPrivateKey)?;
    for name in ["public_key", "public_key_pem"] {
        if let Some(text) = field_text(name)? {
            let public = SessionKey::parse(text).map_err(in_field(name))?;
            if public.to_bytes() != key.verifying_key().to_bytes() {
                return Err(KeygenJsonError::NotThePublicHalf(name).into());
            }
        }
    }
    Ok(key)
}

/// The private key as a PKCS#8 v1 PEM document, the form `openssl genpkey -algorithm ed25519` writes. The
/// v2 form (public key embedded) is refused by OpenSSL 3.0's `openssl pkey` and by Python `cryptography`.
pub fn signing_key_to_pkcs8_pem(key: &SigningKey) -> Result<String, KeyError> {
    let seed_only = KeypairBytes {
        secret_key: key.to_bytes(),
        public_key: None,
    };
    seed_only
        .to_pkcs8_pem(LineEnding::LF)
        .map(|pem| pem.as_str().to_owned())
        .map_err(KeyError::EncodePrivate)
}

/// The public key as standard base64 of its 32 raw bytes (what `POST /v1/seal/sessions` takes).
pub fn public_key_b64(key: &VerifyingKey) -> String {
    STANDARD.encode(key.as_bytes())
}

/// The public key as an SPKI PEM document.
pub fn public_key_pem(key: &VerifyingKey) -> Result<String, KeyError> {
    key.to_public_key_pem(LineEnding::LF)
        .map_err(KeyError::EncodePublic)
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    use ed25519_dalek::Signer as _;

    /// RFC 8032 test 1 key pair.
    const SEED_HEX: &str = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
    const PUBLIC_HEX: &str = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";

    fn public_bytes() -> [u8; 32] {
        hex::decode(PUBLIC_HEX).unwrap().try_into().unwrap()
    }

    #[test]
    fn session_key_parses_every_accepted_encoding_to_the_same_bytes() {
        let bytes = public_bytes();
        let verifying = VerifyingKey::from_bytes(&bytes).unwrap();
        let encodings = [
            STANDARD.encode(bytes),
            STANDARD_NO_PAD.encode(bytes),
            URL_SAFE.encode(bytes),
            URL_SAFE_NO_PAD.encode(bytes),
            PUBLIC_HEX.to_string(),
            PUBLIC_HEX.to_uppercase(),
            public_key_pem(&verifying).unwrap(),
            format!("  {}\n", STANDARD.encode(bytes)),
        ];
        for text in &encodings {
            let key = SessionKey::parse(text).unwrap_or_else(|error| panic!("{text}: {error}"));
            assert_eq!(key.to_bytes(), bytes, "{text}");
        }
        assert_eq!(
            SessionKey::parse(&encodings[0]).unwrap().to_base64(),
            encodings[0]
        );
    }

    #[test]
    fn session_key_refuses_small_order_and_malformed_keys() {
        let all_zero = [0u8; 32];
        let mut identity = [0u8; 32];
        identity[0] = 1;
        let mut minus_one = [0xffu8; 32]; // y = p − 1 = −1: the point of order 2
        minus_one[0] = 0xec;
        minus_one[31] = 0x7f;
        for weak in [all_zero, identity, minus_one] {
            let error = SessionKey::from_bytes(&weak).unwrap_err();
            assert!(matches!(error, KeyError::WeakPublicKey), "{error}");
            assert!(error.to_string().contains("small order"), "{error}");
            assert!(SessionKey::parse(&STANDARD.encode(weak)).is_err());
            assert!(SessionKey::parse(&hex::encode(weak)).is_err());
        }
        // y = p + 1 is a non-canonical way to write the identity (refused either way).
        let mut non_canonical = [0xffu8; 32];
        non_canonical[0] = 0xee;
        non_canonical[31] = 0x7f;
        assert!(SessionKey::from_bytes(&non_canonical).is_err());

        assert!(SessionKey::parse("")
            .unwrap_err()
            .to_string()
            .contains("empty"));
        assert!(SessionKey::parse(&STANDARD.encode([7u8; 31]))
            .unwrap_err()
            .to_string()
            .contains("31 bytes"));
        assert!(SessionKey::parse("not a key!").is_err());
        assert!(
            SessionKey::parse("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----")
                .unwrap_err()
                .to_string()
                .contains("SPKI")
        );
        assert!(
            SessionKey::parse("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----")
                .is_err()
        );
    }

    #[test]
    fn signatures_decode_from_every_base64_form() {
        let key = SigningKey::from_bytes(&hex::decode(SEED_HEX).unwrap().try_into().unwrap());
        let signature = key.sign(b"message");
        let raw = signature.to_bytes();
        for text in [
            STANDARD.encode(raw),
            STANDARD_NO_PAD.encode(raw),
            URL_SAFE.encode(raw),
            URL_SAFE_NO_PAD.encode(raw),
        ] {
            assert_eq!(decode_signature(&text).unwrap(), signature, "{text}");
        }
    }

    #[test]
    fn signatures_of_the_wrong_length_or_alphabet_are_encoding_errors() {
        let expect_encoding_error = |text: &str, fragment: &str| match decode_signature(text) {
            Err(EnvelopeError::SignatureEncoding(message)) => {
                assert!(message.contains(fragment), "{text}: {message}")
            }
            other => panic!("{text}: {other:?}"),
        };
        expect_encoding_error(&STANDARD.encode([1u8; 63]), "63 bytes");
        expect_encoding_error(&STANDARD.encode([1u8; 65]), "65 bytes");
        expect_encoding_error("", "empty");
        expect_encoding_error("not base64 at all!", "invalid base64");
        expect_encoding_error(&"A".repeat(10_000), "characters long");
        // '+' from the standard alphabet mixed with '_' from the URL-safe one.
        let mixed = format!("+_{}", &STANDARD_NO_PAD.encode([0u8; 64])[2..]);
        expect_encoding_error(&mixed, "invalid base64");
        assert_eq!(decode_signature("x").unwrap_err().code(), 1001);
    }

    #[test]
    fn verification_is_strict() {
        let key = SigningKey::from_bytes(&hex::decode(SEED_HEX).unwrap().try_into().unwrap());
        let session = SessionKey::from_bytes(&key.verifying_key().to_bytes()).unwrap();
        let signature = key.sign(b"hello");
        assert_eq!(session.verify(b"hello", &signature), Ok(()));
        assert_eq!(
            session.verify(b"hellp", &signature),
            Err(EnvelopeError::SignatureMismatch)
        );
        // S + L (the group order) is the same scalar but a non-canonical encoding: refused.
        let mut malleated = signature.to_bytes();
        let order: [u8; 32] =
            hex::decode("edd3f55c1a631258d69cf7a2def9de1400000000000000000000000000000010")
                .unwrap()
                .try_into()
                .unwrap();
        let mut carry = 0u16;
        for (byte, add) in malleated[32..].iter_mut().zip(order) {
            let sum = u16::from(*byte) + u16::from(add) + carry;
            *byte = sum as u8;
            carry = sum >> 8;
        }
        assert_eq!(
            session.verify(b"hello", &Signature::from_bytes(&malleated)),
            Err(EnvelopeError::SignatureMismatch)
        );
    }

    #[test]
    fn signing_keys_round_trip_through_their_text_forms() {
        let key = generate_signing_key().unwrap();
        let pem = signing_key_to_pkcs8_pem(&key).unwrap();
        assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----"));
        let seed = key.to_bytes();
        for text in [
            pem,
            hex::encode(seed),
            STANDARD.encode(seed),
            URL_SAFE_NO_PAD.encode(seed),
            STANDARD.encode(key.to_keypair_bytes()),
        ] {
            assert_eq!(
                signing_key_from_text(&text).unwrap().to_bytes(),
                seed,
                "{text}"
            );
        }
        let mut mismatched = key.to_keypair_bytes();
        mismatched[40] ^= 1;
        assert!(signing_key_from_text(&STANDARD.encode(mismatched)).is_err());
        assert!(signing_key_from_text(&STANDARD.encode([0u8; 33])).is_err());
        assert_ne!(generate_signing_key().unwrap().to_bytes(), seed);
        assert_eq!(
            SessionKey::parse(&public_key_b64(&key.verifying_key()))
                .unwrap()
                .verifying_key(),
            &key.verifying_key()
        );
    }
    /// RFC 8410 section 10.3's private key: PKCS#8 v1, byte for byte what OpenSSL writes for it.
    const RFC8410_PEM: &str = "-----BEGIN PRIVATE KEY-----\n\
        MC4CAQAwBQYDK2VwBCIEINTuctv5E1hK1bbY8fdp+K06/nwoy/HU++CXqI9EdVhC\n\
        -----END PRIVATE KEY-----\n";

    #[test]
    fn private_keys_are_written_as_pkcs8_v1_like_openssl() {
        let seed: [u8; 32] =
            hex::decode("d4ee72dbf913584ad5b6d8f1f769f8ad3afe7c28cbf1d4fbe097a88f44755842")
                .unwrap()
                .try_into()
                .unwrap();
        let key = SigningKey::from_bytes(&seed);
        assert_eq!(signing_key_to_pkcs8_pem(&key).unwrap(), RFC8410_PEM);
        assert_eq!(signing_key_from_text(RFC8410_PEM).unwrap().to_bytes(), seed);
        // The v2 form written by earlier versions still reads.
        let v2 = key.to_pkcs8_pem(LineEnding::LF).unwrap();
        assert_ne!(v2.as_str(), RFC8410_PEM);
        assert_eq!(signing_key_from_text(&v2).unwrap().to_bytes(), seed);
    }

    fn keygen_json(key: &SigningKey) -> serde_json::Map<String, Value> {
        let public = key.verifying_key();
        let Value::Object(fields) = serde_json::json!({
            "private_key": STANDARD.encode(key.to_bytes()),
            "private_key_pem": signing_key_to_pkcs8_pem(key).unwrap(),
            "public_key": public_key_b64(&public),
            "public_key_pem": public_key_pem(&public).unwrap(),
        }) else {
            unreachable!("a JSON object literal")
        };
        fields
    }

    #[test]
    fn keygen_json_is_read_when_its_fields_agree() {
        let key = generate_signing_key().unwrap();
        let other = generate_signing_key().unwrap();
        let fields = keygen_json(&key);
        let text = Value::Object(fields.clone()).to_string();
        assert_eq!(
            signing_key_from_text(&text).unwrap().to_bytes(),
            key.to_bytes()
        );
        for only in ["private_key", "private_key_pem"] {
            let one: serde_json::Map<_, _> = fields
                .iter()
                .filter(|(k, _)| *k == only)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let read = signing_key_from_text(&Value::Object(one).to_string()).unwrap();
            assert_eq!(read.to_bytes(), key.to_bytes(), "{only}");
        }
        let other_fields = keygen_json(&other);
        let mixed = |name: &str| {
            let mut fields = fields.clone();
            fields.insert(name.to_string(), other_fields[name].clone());
            signing_key_from_text(&Value::Object(fields).to_string())
                .unwrap_err()
                .to_string()
        };
        assert!(mixed("private_key_pem").contains("different keys"));
        assert!(mixed("public_key").contains("`public_key` is not the public half"));
        assert!(mixed("public_key_pem").contains("`public_key_pem` is not the public half"));
        for (bad, expected) in [
            ("{}", "neither `private_key` nor `private_key_pem`"),
            ("{\"private_key\": 7}", "`private_key` is not a string"),
            (
                "{\"private_key\": \"AAAA\"}",
                "keygen JSON `private_key`: private key decodes to 3 bytes",
            ),
            ("{not json", "not a JSON object"),
        ] {
            let error = signing_key_from_text(bad).unwrap_err().to_string();
            assert!(error.contains(expected), "{bad}: {error}");
        }
    }

    #[test]
    fn key_files_are_read_and_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.key");
        std::fs::write(&path, RFC8410_PEM).unwrap();
        assert!(read_signing_key_file(&path).is_ok());
        std::fs::write(&path, "garbage!").unwrap();
        let error = read_signing_key_file(&path).unwrap_err().to_string();
        assert!(
            error.starts_with(&format!("{}: ", path.display())),
            "{error}"
        );
        let missing = dir.path().join("missing.key");
        let error = read_signing_key_file(&missing).unwrap_err().to_string();
        assert!(
            error.contains("cannot read") && error.contains("missing.key"),
            "{error}"
        );
    }
}
