//! Signed audit checkpoints (SPEC 14): the `AuditCheckpoint` event that signs the chain's head, made for
//! the audit writer, and its check by the verifiers.

use serde_json::{json, Value};

use super::jwks::KeyRing;
use super::key::Signer;
use super::Error;
use crate::audit::{AuditEvent, ChainHead, CheckpointSigner, EventType};

/// What a checkpoint's signature is over, besides the head: the chain it belongs to.
pub const CHAIN: &str = "sealgate-audit/v1";

/// JCS({"chain": "sealgate-audit/v1", "seq": N, "hash": H}): the bytes a checkpoint signs.
pub fn signed_bytes(seq: u64, hash: &str) -> Vec<u8> {
    crate::envelope::jcs(&json!({"chain": CHAIN, "seq": seq, "hash": hash}))
}

impl CheckpointSigner for Signer {
    fn checkpoint(&self, head: &ChainHead) -> AuditEvent {
        let sig = self.sign(&signed_bytes(head.seq, &head.hash));
        AuditEvent::new(EventType::AuditCheckpoint).checkpoint(
            json!({"seq": head.seq, "hash": head.hash, "kid": self.public().kid(), "sig": sig}),
        )
    }
}

/// Checks an `AuditCheckpoint` event whose chain fields are already verified: it covers the event just
/// before it (its `seq` and `hash` are that event's, which the event's own `prev_hash` gives), under a
/// key of `keys`. Returns the kid.
pub fn check(event: &Value, keys: &KeyRing) -> Result<String, Error> {
    let checkpoint =
        event
            .get("checkpoint")
            .and_then(Value::as_object)
            .ok_or(Error::MissingOrNot {
                field: "checkpoint",
                expected: "an object",
            })?;
    let seq = checkpoint
        .get("seq")
        .and_then(Value::as_u64)
        .ok_or(Error::MissingOrNot {
            field: "checkpoint.seq",
            expected: "an integer",
        })?;
    let text = |name: &str| checkpoint.get(name).and_then(Value::as_str);
    let hash = text("hash").ok_or(Error::Missing("checkpoint.hash"))?;
    let own_seq = event.get("seq").and_then(Value::as_u64).unwrap_or(0);
    if Some(seq) != own_seq.checked_sub(1) {
        return Err(Error::SeqNotBefore {
            seq,
            before: own_seq.saturating_sub(1),
        });
    }
    if event.get("prev_hash").and_then(Value::as_str) != Some(hash) {
        return Err(Error::HashNotBefore { seq });
    }
    let kid = text("kid").ok_or(Error::Missing("checkpoint.kid"))?;
    let key = keys.get(kid).ok_or_else(|| Error::UnknownKid {
        field: "checkpoint.kid",
        kid: kid.to_owned(),
    })?;
    let sig = text("sig").ok_or(Error::Missing("checkpoint.sig"))?;
    key.verify(&signed_bytes(seq, hash), sig)
        .map_err(|e| e.of("checkpoint.sig"))?;
    Ok(kid.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evidence::jwks::jwk_set;

    #[test]
    fn a_checkpoint_event_signs_the_head_it_follows() {
        let signer = Signer::new(crate::envelope::generate_signing_key().unwrap()).unwrap();
        let keys = KeyRing::from_jwks(&jwk_set([signer.public()])).unwrap();
        let head = ChainHead {
            seq: 41,
            hash: "ab".repeat(32),
        };
        // As the chain places it: right after the head.
        let checkpoint = signer.checkpoint(&head);
        let event = crate::audit::testing::chained_after(checkpoint, &head).unwrap();
        assert_eq!(event["type"], "AuditCheckpoint");
        assert_eq!(event["checkpoint"]["seq"], 41);
        assert_eq!(check(&event, &keys).unwrap(), signer.public().kid());
        let refusal = |event: &Value, keys: &KeyRing| check(event, keys).unwrap_err().to_string();

        let mut moved = event.clone();
        moved["seq"] = json!(43);
        assert!(refusal(&moved, &keys).starts_with("checkpoint.seq 41"));
        let mut rehashed = event.clone();
        rehashed["prev_hash"] = json!("cd".repeat(32));
        assert!(refusal(&rehashed, &keys).starts_with("checkpoint.hash"));
        let mut forged = event.clone();
        forged["checkpoint"]["hash"] = json!("cd".repeat(32));
        forged["prev_hash"] = json!("cd".repeat(32));
        assert!(refusal(&forged, &keys).starts_with("checkpoint.sig"));
        assert!(refusal(&event, &KeyRing::default()).contains("is not a key of the given JWK Set"));
    }
}
