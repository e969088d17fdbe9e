//! Tests of the envelope as a whole: the signing vectors, check 1 refusals, and round trips.

use super::*;
use proptest::prelude::*;
use serde_json::json;

/// The signing vectors of the independent implementation, kept in the repository (`tests/vectors/`) so that
/// a fresh clone tests against them with nothing beside it.
fn vectors() -> Vec<Value> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vectors/envelopes.json");
    let bytes = std::fs::read(path).unwrap_or_else(|error| panic!("{path}: {error}"));
    let file: Value = serde_json::from_slice(&bytes).unwrap();
    let vectors = file["vectors"].as_array().unwrap().clone();
    assert!(vectors.len() >= 10, "expected the full vector set");
    vectors
}

fn text<'a>(vector: &'a Value, field: &str) -> &'a str {
    vector[field]
        .as_str()
        .unwrap_or_else(|| panic!("vector field {field} missing"))
}

fn seed_key(vector: &Value) -> SigningKey {
    let seed: [u8; 32] = hex::decode(text(vector, "seed_hex"))
        .unwrap()
        .try_into()
        .unwrap();
    SigningKey::from_bytes(&seed)
}

#[test]
fn valid_vectors_rebuild_the_canonical_bytes_and_verify() {
    let mut checked = 0;
    for vector in vectors().iter().filter(|v| v["expect"] == "valid") {
        let name = text(vector, "name");
        let envelope = parse_envelope(text(vector, "wire").as_bytes())
            .unwrap_or_else(|error| panic!("{name}: {error}"));
        let canonical = envelope.canonical_message();
        assert_eq!(
            String::from_utf8(canonical.clone()).unwrap(),
            text(vector, "canonical"),
            "{name}: canonical bytes"
        );
        assert_eq!(
            sha256_hex(&canonical),
            text(vector, "canonical_sha256"),
            "{name}"
        );

        let session = SessionKey::parse(text(vector, "public_key_b64")).unwrap();
        let verified = envelope
            .verify_signature(&session)
            .unwrap_or_else(|error| panic!("{name}: {error}"));
        assert_eq!(
            signature_text(&verified),
            text(vector, "signature_b64"),
            "{name}"
        );
        assert_eq!(envelope.signature, text(vector, "signature_b64"), "{name}");

        // Our signer reproduces the independent implementation's signature (Ed25519 is deterministic).
        let key = seed_key(vector);
        assert_eq!(key.verifying_key().to_bytes(), session.to_bytes(), "{name}");
        let wire = sign_envelope(
            &key,
            envelope.payload.clone(),
            &envelope.security_token,
            envelope.timestamp,
        );
        assert_eq!(wire["signature"], vector["signature_b64"], "{name}");
        checked += 1;
    }
    assert!(checked >= 7, "only {checked} valid vectors");
}

#[test]
fn invalid_signature_vectors_are_refused_with_1002() {
    let mut checked = 0;
    for vector in vectors()
        .iter()
        .filter(|v| v["expect"] == "invalid_signature")
    {
        let name = text(vector, "name");
        let envelope = parse_envelope(text(vector, "wire").as_bytes())
            .unwrap_or_else(|error| panic!("{name}: {error}"));
        assert_eq!(
            String::from_utf8(envelope.canonical_message()).unwrap(),
            text(vector, "canonical"),
            "{name}"
        );
        let session = SessionKey::parse(text(vector, "public_key_b64")).unwrap();
        let refusal = envelope.verify_signature(&session).unwrap_err();
        assert_eq!(refusal, EnvelopeError::SignatureMismatch, "{name}");
        assert_eq!(refusal.code(), 1002);
        checked += 1;
    }
    assert!(checked >= 3, "only {checked} invalid vectors");
}

#[test]
fn serde_jcs_agrees_on_every_vector() {
    // Evidence for the choice documented in jcs.rs: both serializers give the vector bytes.
    for vector in vectors() {
        let envelope = parse_envelope(text(&vector, "wire").as_bytes()).unwrap();
        let signed = json!({"payload": envelope.payload, "security_token": envelope.security_token,
                            "timestamp": envelope.timestamp});
        assert_eq!(
            serde_jcs::to_vec(&signed).unwrap(),
            text(&vector, "canonical").as_bytes()
        );
        assert_eq!(jcs(&signed), text(&vector, "canonical").as_bytes());
        assert_eq!(jcs_sha256_hex(&signed), text(&vector, "canonical_sha256"));
    }
}

#[test]
fn a_changed_signed_field_breaks_the_signature() {
    let key = SigningKey::from_bytes(&[7u8; 32]);
    let session = SessionKey::from_bytes(&key.verifying_key().to_bytes()).unwrap();
    let payload = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                         "params": {"name": "fs.read", "arguments": {"path": "/w/a"}}});
    let wire = sign_envelope(&key, payload, "tok", 1_764_496_800);
    let accepted = parse_envelope(&serde_json::to_vec(&wire).unwrap()).unwrap();
    assert!(accepted.verify_signature(&session).is_ok());

    let tampered = [
        ("/payload/params/arguments/path", json!("/etc/passwd")),
        ("/security_token", json!("tok2")),
        ("/timestamp", json!(1_764_496_801)),
    ];
    for (pointer, value) in tampered {
        let mut changed = wire.clone();
        *changed.pointer_mut(pointer).unwrap() = value;
        let envelope = parse_envelope(&serde_json::to_vec(&changed).unwrap()).unwrap();
        assert_eq!(
            envelope.verify_signature(&session),
            Err(EnvelopeError::SignatureMismatch),
            "{pointer}"
        );
    }
    // Unknown top-level fields are not signed and change nothing.
    let mut extra = wire.clone();
    extra["trace"] = json!("abc");
    let envelope = parse_envelope(&serde_json::to_vec(&extra).unwrap()).unwrap();
    assert!(envelope.verify_signature(&session).is_ok());
    // Another key does not verify.
    let stranger = SessionKey::from_bytes(
        &SigningKey::from_bytes(&[8u8; 32])
            .verifying_key()
            .to_bytes(),
    )
    .unwrap();
    assert_eq!(
        accepted.verify_signature(&stranger),
        Err(EnvelopeError::SignatureMismatch)
    );
}

#[test]
fn every_spelling_of_a_signature_verifies_to_the_same_replay_key() {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let key = SigningKey::from_bytes(&[9u8; 32]);
    let session = SessionKey::from_bytes(&key.verifying_key().to_bytes()).unwrap();
    let mut wire = sign_envelope(&key, json!({"a": 1}), "tok", 10);
    let standard = wire["signature"].as_str().unwrap().to_string();
    let raw = decode_signature(&standard).unwrap().to_bytes();
    wire["signature"] = json!(URL_SAFE_NO_PAD.encode(raw));
    let respelled = parse_envelope(&serde_json::to_vec(&wire).unwrap()).unwrap();
    assert_ne!(respelled.signature, standard);
    let verified = respelled.verify_signature(&session).unwrap();
    assert_eq!(signature_text(&verified), standard);
}

#[test]
fn a_bad_signature_encoding_is_1001_before_any_verification() {
    let key = SigningKey::from_bytes(&[7u8; 32]);
    let session = SessionKey::from_bytes(&key.verifying_key().to_bytes()).unwrap();
    let mut wire = sign_envelope(&key, json!({}), "tok", 5);
    wire["signature"] = json!("AAAA");
    let envelope = parse_envelope(&serde_json::to_vec(&wire).unwrap()).unwrap();
    let error = envelope.verify_signature(&session).unwrap_err();
    assert_eq!(error.code(), 1001, "{error}");
    assert!(error.to_string().contains("3 bytes"), "{error}");
}

fn base_wire() -> Value {
    json!({"protocol": "seal/v1", "security_token": "t", "signature": "s",
           "payload": {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}, "timestamp": 1_764_496_800})
}

fn refusal(wire: &[u8]) -> String {
    match parse_envelope(wire) {
        Err(EnvelopeError::Malformed(message)) => message,
        other => panic!(
            "expected 1000 for {}, got {other:?}",
            String::from_utf8_lossy(wire)
        ),
    }
}

fn refusal_with(field: &str, value: Option<Value>) -> String {
    let mut wire = base_wire();
    let fields = wire.as_object_mut().unwrap();
    match value {
        Some(value) => fields.insert(field.to_string(), value),
        None => fields.remove(field),
    };
    refusal(&serde_json::to_vec(&wire).unwrap())
}

#[test]
fn envelope_fields_must_be_present_with_the_right_types() {
    for field in [
        "protocol",
        "security_token",
        "signature",
        "payload",
        "timestamp",
    ] {
        let message = refusal_with(field, None);
        assert_eq!(message, format!("required field \"{field}\" is missing"));
    }
    assert!(refusal_with("protocol", Some(json!("seal/v2")))
        .contains("unsupported protocol \"seal/v2\""));
    assert!(refusal_with("protocol", Some(json!("SEAL/V1"))).contains("unsupported protocol"));
    assert!(refusal_with("protocol", Some(json!(1))).contains("found a number"));
    assert!(refusal_with("security_token", Some(json!(null)))
        .contains("\"security_token\" must be a string, found null"));
    assert!(refusal_with("signature", Some(json!(["x"]))).contains("found an array"));
    assert!(refusal_with("payload", Some(json!("{}")))
        .contains("\"payload\" must be an object, found a string"));
    assert!(refusal_with("payload", Some(json!([]))).contains("found an array"));
    assert!(refusal_with("timestamp", Some(json!(true))).contains("found a boolean"));
    assert!(refusal_with("container_id", Some(json!(null)))
        .contains("\"container_id\" must be a string when present, found null"));
    assert!(refusal_with("container_id", Some(json!(5))).contains("found a number"));
    assert!(refusal(b"[]").contains("must be a JSON object, found an array"));
    assert!(refusal(b"\"seal/v1\"").contains("found a string"));
}

#[test]
fn the_timestamp_is_an_integer_literal_or_rfc3339() {
    let replace_timestamp = |raw: &str| {
        format!(
            r#"{{"protocol":"seal/v1","security_token":"t","signature":"s","payload":{{}},"timestamp":{raw}}}"#
        )
    };
    for float in ["1764496800.0", "1.7644968e9", "1764496800.5", "1e3"] {
        let message = refusal(replace_timestamp(float).as_bytes());
        assert!(
            message.contains("written as an integer"),
            "{float}: {message}"
        );
    }
    assert!(refusal(replace_timestamp("9007199254740992").as_bytes()).contains("outside ±(2^53−1)"));
    for bad in [
        "\"yesterday\"",
        "\"2025-12-01\"",
        "\"2025-12-01T09:20:00\"",
        "\"2025-13-01T09:20:00Z\"",
        "\"2025-12-01T09:20:00+25:00\"",
        "\"1764496800\"",
        "\"\"",
    ] {
        let message = refusal(replace_timestamp(bad).as_bytes());
        assert!(
            message.contains("not an RFC 3339 date-time"),
            "{bad}: {message}"
        );
    }
    let read = |raw: &str| {
        parse_envelope(replace_timestamp(raw).as_bytes())
            .unwrap()
            .timestamp
    };
    assert_eq!(read("1764496800"), 1_764_496_800);
    assert_eq!(read("-5"), -5);
    assert_eq!(read("\"2025-12-01T09:20:00.000Z\""), 1_764_580_800);
    assert_eq!(read("\"2025-12-01T09:20:00.999999Z\""), 1_764_580_800);
    assert_eq!(read("\"2025-12-01T10:20:00.5+01:00\""), 1_764_580_800);
    assert_eq!(read("\"2026-02-17T14:32:01.583Z\""), 1_771_338_721);
    // Before 1970 "rounded down" means towards the past, not towards zero.
    assert_eq!(read("\"1969-12-31T23:59:59.500Z\""), -1);
    assert_eq!(read("\"1970-01-01T00:00:00Z\""), 0);
}

#[test]
fn strict_parsing_applies_to_the_whole_envelope() {
    let duplicate = br#"{"protocol":"seal/v1","security_token":"t","signature":"s","timestamp":1,
        "payload":{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/list"}}"#;
    let message = refusal(duplicate);
    assert!(
        message.starts_with("duplicate key \"id\" at $.payload"),
        "{message}"
    );
    let error = parse_envelope(duplicate).unwrap_err();
    assert_eq!(error.code(), 1000);
    assert!(error
        .to_string()
        .starts_with("malformed envelope: duplicate key"));

    let top_duplicate = br#"{"protocol":"seal/v1","protocol":"seal/v1","security_token":"t","signature":"s","timestamp":1,"payload":{}}"#;
    assert!(refusal(top_duplicate).starts_with("duplicate key \"protocol\" at $ "));
    assert!(refusal(b"").contains("empty body"));
    assert!(refusal(b"{\"protocol\":\"seal/v1\"} trailing").contains("trailing"));
    assert!(refusal(b"\xff\xfe").contains("UTF-8"));
}

#[test]
fn container_id_and_unknown_fields() {
    let mut wire = base_wire();
    wire["container_id"] = json!("c-1");
    wire["extra"] = json!({"anything": [1, 2]});
    let envelope = parse_envelope(&serde_json::to_vec(&wire).unwrap()).unwrap();
    assert_eq!(envelope.container_id.as_deref(), Some("c-1"));
    assert_eq!(envelope.payload, base_wire()["payload"]);
    assert_eq!(
        parse_envelope(&serde_json::to_vec(&base_wire()).unwrap())
            .unwrap()
            .container_id,
        None
    );
}

#[test]
fn canonical_message_matches_jcs_of_the_signed_object() {
    let envelope = Envelope {
        security_token: "tok\u{2028}\"".into(),
        signature: String::new(),
        payload: json!({"b": 1.0, "a": [1e21, -0.0, "é\n"]}),
        timestamp: -12,
        container_id: None,
    };
    let expected = jcs(&json!({"timestamp": -12, "security_token": "tok\u{2028}\"",
                                "payload": envelope.payload}));
    assert_eq!(envelope.canonical_message(), expected);
    assert_eq!(
        String::from_utf8(expected).unwrap(),
        "{\"payload\":{\"a\":[1e+21,0,\"é\\n\"],\"b\":1},\"security_token\":\"tok\u{2028}\\\"\",\"timestamp\":-12}"
    );
}

#[test]
fn sha256_helpers() {
    assert_eq!(
        sha256_hex(b""),
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
    assert_eq!(
        jcs_sha256_hex(&json!({"b": 1, "a": 2})),
        sha256_hex(br#"{"a":2,"b":1}"#)
    );
}

/// Random JSON values inside the strict limits (safe integers, finite doubles, shallow nesting).
fn strict_value() -> impl Strategy<Value = Value> {
    let safe = MAX_SAFE_INTEGER as i64;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (-safe..=safe).prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("JCS prints these as unsafe integer literals", |f| {
                super::jcs::tests::strict_reparsable(*f)
            })
            .prop_filter_map("finite doubles only", serde_json::Number::from_f64)
            .prop_map(Value::Number),
        "\\PC{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(5, 48, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map("\\PC{0,6}", inner, 0..5)
                .prop_map(|entries| Value::Object(entries.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn signed_envelopes_round_trip(
        arguments in prop::collection::btree_map("[a-z]{1,5}", strict_value(), 0..4),
        token in "\\PC{0,40}",
        timestamp in -(1i64 << 40)..(1i64 << 40),
        seed in any::<[u8; 32]>(),
    ) {
        let key = SigningKey::from_bytes(&seed);
        let session = SessionKey::from_bytes(&key.verifying_key().to_bytes()).unwrap();
        let payload = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "t.x", "arguments": Value::Object(arguments.into_iter().collect())}});
        let wire = sign_envelope(&key, payload.clone(), &token, timestamp);
        let envelope = parse_envelope(&serde_json::to_vec_pretty(&wire).unwrap()).unwrap();
        prop_assert_eq!(&envelope.payload, &payload);
        prop_assert_eq!(envelope.timestamp, timestamp);
        let verified = envelope.verify_signature(&session);
        prop_assert_eq!(verified.map(|s| signature_text(&s)), Ok(wire["signature"].as_str().unwrap_or_default().to_string()));
    }

    #[test]
    fn jcs_output_reparses_strictly_to_the_same_canonical_form(value in strict_value()) {
        let bytes = jcs(&value);
        let reparsed = parse_strict_json(&bytes).unwrap();
        prop_assert_eq!(jcs(&reparsed), bytes);
    }

    #[test]
    fn parse_envelope_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse_envelope(&bytes);
    }
}

#[test]
fn the_payload_range_of_the_canonical_message_is_the_payload_jcs() {
    let envelope = parse_envelope(
        br#"{"protocol":"seal/v1","security_token":"t\"ok","signature":"x","timestamp":12,
             "payload":{"b":[1.0,"\u00e9"],"a":{"z":1,"y":2}}}"#,
    )
    .unwrap();
    let (message, payload) = envelope.canonical_message_with_payload();
    assert_eq!(message, envelope.canonical_message());
    assert_eq!(&message[payload.clone()], jcs(&envelope.payload).as_slice());
    assert_eq!(
        sha256_hex(&message[payload]),
        jcs_sha256_hex(&envelope.payload)
    );
}
