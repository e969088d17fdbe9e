//! Signed receipts (SPEC 14): what the gateway decided about one envelope, signed so that the agent can
//! show it to anyone; and their verification against a saved response body (and its envelope).

use serde_json::{json, Map, Value};

use super::jwks::KeyRing;
use super::key::Signer;
use super::Error;
use crate::audit::Decision;
use crate::envelope;

/// What the pipeline tells evidence about an answered envelope; evidence adds when, where and the
/// signature.
#[derive(Debug, Clone, Copy)]
pub struct Statement<'a> {
    pub decision: Decision,
    /// The refusal's code.
    pub code: Option<u16>,
    pub session_id: Option<&'a str>,
    pub sub: Option<&'a str>,
    /// Absent for `tools/list`.
    pub tool: Option<&'a str>,
    /// hex(SHA-256(JCS(the envelope's payload))).
    pub payload_sha256: &'a str,
    /// The response's `payload` object (successes).
    pub answer: Option<&'a Value>,
    /// The seq of the audit event that records the outcome.
    pub event_seq: u64,
}

/// `fields` (section 10's receipt, or the refusal's) with the statement, `issued_at`, `replica_id` and
/// `sig` over JCS of all the rest.
pub fn sign(
    signer: &Signer,
    replica_id: &str,
    mut fields: Map<String, Value>,
    statement: &Statement<'_>,
) -> Value {
    fields.insert("decision".into(), json!(statement.decision.as_str()));
    let optional = [
        ("code", statement.code.map(Value::from)),
        ("session_id", statement.session_id.map(Value::from)),
        ("sub", statement.sub.map(Value::from)),
        ("tool", statement.tool.map(Value::from)),
        (
            "answer_sha256",
            statement
                .answer
                .map(|a| Value::from(envelope::jcs_sha256_hex(a))),
        ),
    ];
    for (name, value) in optional {
        if let Some(value) = value {
            fields.insert(name.into(), value);
        }
    }
    fields.insert("payload_sha256".into(), json!(statement.payload_sha256));
    fields.insert("event_seq".into(), json!(statement.event_seq));
    fields.insert(
        "issued_at".into(),
        json!(crate::clock::rfc3339_millis(crate::clock::now_millis())),
    );
    fields.insert("replica_id".into(), json!(replica_id));
    let value = signer.sign(&envelope::jcs_object(&fields));
    fields.insert(
        "sig".into(),
        json!({"alg": "EdDSA", "kid": signer.public().kid(), "value": value}),
    );
    Value::Object(fields)
}

/// What a verified receipt says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub kid: String,
    pub decision: String,
    pub event_seq: u64,
    pub issued_at: String,
    /// Whether `payload_sha256` was checked against an envelope.
    pub envelope_checked: bool,
}

/// Checks a saved response body: the receipt's signature under a key of `keys`, its fields' forms, that
/// it says what the body says (success and allow, or the refusal's code), `answer_sha256` against the
/// body's payload, and with `envelope`, `payload_sha256` against its payload. Every problem found is
/// named; none means all hold.
pub fn verify(
    body: &Value,
    keys: &KeyRing,
    envelope_body: Option<&Value>,
) -> Result<Verified, Vec<String>> {
    let (receipt, refusal) = match body.get("status").and_then(Value::as_str) {
        Some("success") => (body.get("receipt"), None),
        Some("error") => (
            body.pointer("/error/receipt"),
            body.pointer("/error/code").and_then(Value::as_u64),
        ),
        _ => {
            return Err(vec![
                "not a seal/v1 response body (status is neither \"success\" nor \"error\")".into(),
            ])
        }
    };
    let Some(Value::Object(receipt)) = receipt else {
        return Err(vec![
            "the response carries no receipt (an envelope refused before check 8 \
                         passed gets none)"
                .into(),
        ]);
    };
    let mut problems = Vec::new();
    let kid = check_signature(receipt, keys).unwrap_or_else(|problem| {
        problems.push(problem.to_string());
        String::new()
    });
    problems.extend(check_statement(receipt, refusal));
    if refusal.is_none() {
        let answer = body.get("payload").map(envelope::jcs_sha256_hex);
        if receipt.get("answer_sha256").and_then(Value::as_str) != answer.as_deref() {
            problems.push("answer_sha256 does not match the response's payload".into());
        }
    }
    if let Some(envelope_body) = envelope_body {
        let payload = envelope_body.get("payload").map(envelope::jcs_sha256_hex);
        if payload.is_none() {
            problems.push("the envelope file has no payload".into());
        } else if receipt.get("payload_sha256").and_then(Value::as_str) != payload.as_deref() {
            problems.push("payload_sha256 does not match the envelope's payload".into());
        }
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let text = |name: &str| {
        receipt
            .get(name)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    Ok(Verified {
        kid,
        decision: text("decision"),
        event_seq: receipt
            .get("event_seq")
            .and_then(Value::as_u64)
            .unwrap_or(0),
        issued_at: text("issued_at"),
        envelope_checked: envelope_body.is_some(),
    })
}

/// The kid whose key signed JCS(receipt without `sig`).
fn check_signature(receipt: &Map<String, Value>, keys: &KeyRing) -> Result<String, Error> {
    let sig = receipt
        .get("sig")
        .and_then(Value::as_object)
        .ok_or(Error::MissingOrNot {
            field: "sig",
            expected: "an object",
        })?;
    let text = |name: &str| sig.get(name).and_then(Value::as_str);
    if text("alg") != Some("EdDSA") {
        return Err(Error::NotValue {
            field: "sig.alg",
            rule: "is not",
            value: "EdDSA",
        });
    }
    let kid = text("kid").ok_or(Error::Missing("sig.kid"))?;
    let key = keys.get(kid).ok_or_else(|| Error::UnknownKid {
        field: "sig.kid",
        kid: kid.to_owned(),
    })?;
    let value = text("value").ok_or(Error::Missing("sig.value"))?;
    let mut signed = receipt.clone();
    signed.remove("sig");
    key.verify(&envelope::jcs_object(&signed), value)
        .map_err(|e| Error::ReceiptChanged(Box::new(e)))?;
    Ok(kid.to_owned())
}

/// The fields' forms, and that the receipt states what the body states.
fn check_statement(receipt: &Map<String, Value>, refusal: Option<u64>) -> Vec<String> {
    let text = |name: &str| receipt.get(name).and_then(Value::as_str);
    let mut problems = Vec::new();
    let expected = if refusal.is_some() { "deny" } else { "allow" };
    if text("decision") != Some(expected) {
        problems.push(format!(
            "decision is {:?}, but the response is a {}",
            receipt.get("decision").unwrap_or(&Value::Null),
            if refusal.is_some() {
                "refusal"
            } else {
                "success"
            }
        ));
    }
    if receipt.get("code").and_then(Value::as_u64) != refusal {
        problems.push("code is not the response's error code".into());
    }
    if !text("payload_sha256").is_some_and(is_hex_digest) {
        problems.push("payload_sha256 is not 64 lower-case hex digits".into());
    }
    if receipt
        .get("event_seq")
        .and_then(Value::as_u64)
        .is_none_or(|seq| seq < 1)
    {
        problems.push("event_seq is not a positive integer".into());
    }
    if !text("issued_at").is_some_and(crate::audit::is_valid_at) {
        problems.push("issued_at is not RFC 3339 UTC with milliseconds".into());
    }
    for name in ["replica_id", "session_id", "sub"] {
        if text(name).is_none() {
            problems.push(format!("{name} is missing or not a string"));
        }
    }
    problems
}

fn is_hex_digest(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evidence::jwks::jwk_set;

    fn signed(signer: &Signer, answer: &Value) -> Value {
        let statement = Statement {
            decision: Decision::Allow,
            code: None,
            session_id: Some("exec-1"),
            sub: Some("agent-1"),
            tool: Some("fs.read"),
            payload_sha256: &"a".repeat(64),
            answer: Some(answer),
            event_seq: 7,
        };
        let mut fields = Map::new();
        fields.insert("claim".into(), json!("NONE"));
        sign(signer, "r0", fields, &statement)
    }

    #[test]
    fn a_receipt_verifies_and_any_changed_field_is_named() {
        let signer = Signer::new(crate::envelope::generate_signing_key().unwrap()).unwrap();
        let keys = KeyRing::from_jwks(&jwk_set([signer.public()])).unwrap();
        let payload = json!({"jsonrpc": "2.0", "id": 1, "result": {"n": 1.0}});
        let receipt = signed(&signer, &payload);
        let body = json!({"protocol": "seal/v1", "status": "success", "payload": payload, "receipt": receipt});
        let verified = verify(&body, &keys, None).unwrap();
        assert_eq!(
            (verified.decision.as_str(), verified.event_seq),
            ("allow", 7)
        );
        assert_eq!(verified.kid, signer.public().kid());

        for field in receipt.as_object().unwrap().keys() {
            let mut changed = body.clone();
            changed["receipt"][field] = json!("changed");
            let problems = verify(&changed, &keys, None).unwrap_err();
            assert!(
                problems.iter().any(|p| p.starts_with("sig")),
                "{field}: {problems:?}"
            );
        }
        let mut other_answer = body.clone();
        other_answer["payload"]["result"]["n"] = json!(2);
        assert_eq!(
            verify(&other_answer, &keys, None).unwrap_err(),
            ["answer_sha256 does not match the response's payload"]
        );
        let envelope_body = json!({"payload": {"other": true}});
        assert_eq!(
            verify(&body, &keys, Some(&envelope_body)).unwrap_err(),
            ["payload_sha256 does not match the envelope's payload"]
        );
        let strangers = KeyRing::default();
        let unknown = verify(&body, &strangers, None).unwrap_err();
        assert!(
            unknown[0].contains("is not a key of the given JWK Set"),
            "{unknown:?}"
        );
    }
}
