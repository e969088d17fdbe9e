//! The seal/v1 envelope (SPEC section 2; checks 1, 6 and 7 of section 3): strict parsing of the request
//! body, the canonical bytes that the agent signs, signature decoding and strict Ed25519 verification,
//! and the typed reading of the JSON-RPC payload used later by check 9.
//!
//! All Ed25519 and SHA-256 work of the gateway's request path lives here (and in `token` for JWTs);
//! other modules call [`sha256_hex`] / [`jcs_sha256_hex`] instead of touching the crates themselves.

mod call;
mod jcs;
pub mod keygen;
mod keys;
#[cfg(test)]
mod tests;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use ed25519_dalek::{Signature, Signer as _, SigningKey};
use serde_json::{Map, Value};
use sha2::{Digest as _, Sha256};

use crate::strict_json;

pub use call::{
    json_kind, parse_call, Call, PayloadError, ToolName, IDEMPOTENCY_KEY_BYTES, MAX_TOOL_NAME_BYTES,
};
pub use jcs::{jcs, jcs_object};
// The audit writer writes its events' JCS bytes member by member, without building a `Value` first.
pub(crate) use jcs::{write_string, write_value};
pub use keys::{
    decode_base64_flexible, decode_signature, generate_signing_key, public_key_b64, public_key_pem,
    read_signing_key_file, signing_key_from_text, signing_key_to_pkcs8_pem, Base64Error, KeyError,
    KeygenJsonError, SessionKey,
};
// The strict reader moved to `crate::strict_json` (token and audit read JSON with it too); these names
// stay here for the callers that know it as the envelope parser.
pub use crate::strict_json::{parse_strict_json, MAX_DEPTH, MAX_SAFE_INTEGER};

/// The only protocol this gateway speaks.
pub const PROTOCOL: &str = "seal/v1";

/// Why an envelope was refused by this module; [`EnvelopeError::code`] gives the SPEC code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    /// Code 1000: the body is not a strictly parsed envelope with the required fields.
    #[error("malformed envelope: {0}")]
    Malformed(String),
    /// Code 1001: the signature is not base64 of exactly 64 bytes.
    #[error("invalid signature encoding: {0}")]
    SignatureEncoding(String),
    /// Code 1002: the signature does not verify (strictly) over the canonical message.
    #[error("signature verification failed: the signature does not match the canonical message under the session key")]
    SignatureMismatch,
}

impl EnvelopeError {
    /// The SPEC section 10 code.
    pub fn code(&self) -> u16 {
        match self {
            EnvelopeError::Malformed(_) => 1000,
            EnvelopeError::SignatureEncoding(_) => 1001,
            EnvelopeError::SignatureMismatch => 1002,
        }
    }
}

/// An envelope that passed check 1. `payload` and `security_token` are kept exactly as received; they
/// are signed as such.
#[derive(Debug, Clone, PartialEq)]
pub struct Envelope {
    pub security_token: String,
    /// The base64 text as received; decoded by [`decode_signature`] at check 7.
    pub signature: String,
    /// A JSON object (guaranteed by [`parse_envelope`]).
    pub payload: Value,
    /// Unix seconds: the JSON integer, or the RFC 3339 instant rounded down to the whole second.
    pub timestamp: i64,
    pub container_id: Option<String>,
}

impl Envelope {
    /// The signed bytes (check 6): JCS of `{"payload": P, "security_token": T, "timestamp": S}`.
    pub fn canonical_message(&self) -> Vec<u8> {
        canonical_message_for(&self.payload, &self.security_token, self.timestamp)
    }

    /// The canonical message and the byte range in it that holds JCS(payload), so the audit's
    /// `payload_sha256` is hashed from the same bytes instead of canonicalising the payload twice.
    pub fn canonical_message_with_payload(&self) -> (Vec<u8>, std::ops::Range<usize>) {
        let (message, payload_end) =
            write_canonical(&self.payload, &self.security_token, self.timestamp);
        (message, PAYLOAD_PREFIX.len()..payload_end)
    }

    /// Checks 6 and 7 in one step: rebuilds the canonical message, decodes the signature (1001) and
    /// verifies it strictly under `key` (1002). Returns the verified signature: key replay detection
    /// (check 8) on its bytes or [`signature_text`], never on the received text, which has several
    /// spellings (two alphabets, optional padding) for the same 64 bytes.
    pub fn verify_signature(&self, key: &SessionKey) -> Result<Signature, EnvelopeError> {
        let signature = decode_signature(&self.signature)?;
        key.verify(&self.canonical_message(), &signature)?;
        Ok(signature)
    }
}

/// The one text form of a signature: standard base64 with padding (replay key, audit field).
pub fn signature_text(signature: &Signature) -> String {
    STANDARD.encode(signature.to_bytes())
}

const PAYLOAD_PREFIX: &[u8] = b"{\"payload\":";
const TOKEN_PREFIX: &[u8] = b",\"security_token\":";
const TIMESTAMP_PREFIX: &[u8] = b",\"timestamp\":";

/// The canonical message for the given parts, written straight into one buffer (no copy of the
/// payload). The three keys are already in JCS order.
pub fn canonical_message_for(payload: &Value, security_token: &str, timestamp: i64) -> Vec<u8> {
    write_canonical(payload, security_token, timestamp).0
}

/// Writes the canonical message and returns it with the offset where JCS(payload) ends.
fn write_canonical(payload: &Value, security_token: &str, timestamp: i64) -> (Vec<u8>, usize) {
    let mut out = Vec::with_capacity(256 + security_token.len());
    out.extend_from_slice(PAYLOAD_PREFIX);
    jcs::write_value(&mut out, payload);
    let payload_end = out.len();
    out.extend_from_slice(TOKEN_PREFIX);
    jcs::write_string(&mut out, security_token);
    out.extend_from_slice(TIMESTAMP_PREFIX);
    jcs::write_i64(&mut out, timestamp);
    out.push(b'}');
    (out, payload_end)
}

/// Check 1 (all but the byte-size limit, which the HTTP layer enforces before reading the body).
///
/// Requires: a strictly parsed JSON object; `protocol` exactly `"seal/v1"`; `security_token` and
/// `signature` strings; `payload` an object; `timestamp` an integer literal or an RFC 3339 string;
/// `container_id`, when present, a string (an explicit `null` is refused). Other top-level fields are
/// ignored.
pub fn parse_envelope(bytes: &[u8]) -> Result<Envelope, EnvelopeError> {
    let value = parse_strict_json(bytes).map_err(EnvelopeError::Malformed)?;
    let Value::Object(mut fields) = value else {
        return Err(malformed(format!(
            "the envelope must be a JSON object, found {}",
            call::json_kind(&value)
        )));
    };
    match fields.get("protocol") {
        Some(Value::String(protocol)) if protocol == PROTOCOL => {}
        Some(Value::String(protocol)) => {
            return Err(malformed(format!(
                "unsupported protocol {}; expected \"{PROTOCOL}\"",
                strict_json::quote_excerpt(protocol)
            )))
        }
        other => return Err(wrong_field("protocol", "the string \"seal/v1\"", other)),
    }
    let security_token = take_string(&mut fields, "security_token")?;
    let signature = take_string(&mut fields, "signature")?;
    let payload = match fields.remove("payload") {
        Some(payload @ Value::Object(_)) => payload,
        other => return Err(wrong_field("payload", "an object", other.as_ref())),
    };
    let timestamp = read_timestamp(fields.get("timestamp"))?;
    let container_id = match fields.remove("container_id") {
        None => None,
        Some(Value::String(container_id)) => Some(container_id),
        Some(other) => {
            return Err(malformed(format!(
                "field \"container_id\" must be a string when present, found {}",
                call::json_kind(&other)
            )))
        }
    };
    Ok(Envelope {
        security_token,
        signature,
        payload,
        timestamp,
        container_id,
    })
}

fn malformed(message: String) -> EnvelopeError {
    EnvelopeError::Malformed(message)
}

fn wrong_field(name: &str, expected: &str, found: Option<&Value>) -> EnvelopeError {
    match found {
        None => malformed(format!("required field \"{name}\" is missing")),
        Some(value) => malformed(format!(
            "field \"{name}\" must be {expected}, found {}",
            call::json_kind(value)
        )),
    }
}

fn take_string(fields: &mut Map<String, Value>, name: &str) -> Result<String, EnvelopeError> {
    match fields.remove(name) {
        Some(Value::String(text)) => Ok(text),
        other => Err(wrong_field(name, "a string", other.as_ref())),
    }
}

/// Reads `timestamp`: an integer literal (the strict parser keeps those as i64/u64 numbers; a number
/// written with a fraction or exponent is an f64 and refused), or an RFC 3339 string.
fn read_timestamp(value: Option<&Value>) -> Result<i64, EnvelopeError> {
    match value {
        Some(Value::Number(number)) => number
            .as_i64()
            .ok_or_else(|| {
                malformed(format!(
                    "field \"timestamp\" must be a whole number of Unix seconds written as an integer, found {number}"
                ))
            }),
        Some(Value::String(text)) => rfc3339_to_unix_seconds(text),
        other => Err(wrong_field(
            "timestamp",
            "an integer of Unix seconds or an RFC 3339 string",
            other,
        )),
    }
}

/// Unix seconds of an RFC 3339 instant, rounded down (towards the past, also before 1970), as the
/// seal/v1 SDKs sign it.
pub fn rfc3339_to_unix_seconds(text: &str) -> Result<i64, EnvelopeError> {
    chrono::DateTime::parse_from_rfc3339(text)
        // `timestamp()` is the floor: chrono keeps the sub-second part as a non-negative offset.
        .map(|instant| instant.timestamp())
        .map_err(|error| {
            malformed(format!(
                "field \"timestamp\" is not an RFC 3339 date-time ({error}): {}",
                strict_json::quote_excerpt(text)
            ))
        })
}

/// Lower-case hex of SHA-256 over `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// base64url (no padding) of SHA-256 over `bytes`: a PKCE S256 challenge (RFC 7636).
pub fn sha256_base64url(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(bytes))
}

/// 256 random bits from the operating system, base64url without padding: console session ids, CSRF
/// tokens, sign-in `state`s, nonces and PKCE verifiers (43 characters, as RFC 7636 allows).
pub fn random_secret() -> Result<String, RandomUnavailable> {
    let mut bytes = [0u8; 32];
    getrandom::getrandom(&mut bytes).map_err(RandomUnavailable)?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
}

/// The operating system gave no random bytes for a [`random_secret`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("OS randomness unavailable: {0}")]
pub struct RandomUnavailable(pub(crate) getrandom::Error);

// The console sign-in and the MCP endpoint still answer `String`; they keep using `?` on this until
// their own errors are typed.
impl From<RandomUnavailable> for String {
    fn from(error: RandomUnavailable) -> Self {
        error.to_string()
    }
}

/// Lower-case hex of SHA-256 over the JCS bytes of `value` (request ids, action refs, audit hashes).
pub fn jcs_sha256_hex(value: &Value) -> String {
    sha256_hex(&jcs(value))
}

/// Builds a wire envelope `{protocol, security_token, signature, payload, timestamp}` signed with `key`
/// (standard base64 signature; for the CLI `sign` command, the demo and tests).
pub fn sign_envelope(
    key: &SigningKey,
    payload: Value,
    security_token: &str,
    timestamp: i64,
) -> Value {
    let signature = key.sign(&canonical_message_for(&payload, security_token, timestamp));
    let mut wire = Map::new();
    wire.insert("protocol".into(), Value::from(PROTOCOL));
    wire.insert("security_token".into(), Value::from(security_token));
    wire.insert("signature".into(), Value::from(signature_text(&signature)));
    wire.insert("payload".into(), payload);
    wire.insert("timestamp".into(), Value::from(timestamp));
    Value::Object(wire)
}
