"""Verifies sealgate's signed receipts and audit checkpoints with code that sealgate did not write:
Python `cryptography` for Ed25519 and the `rfc8785` package for JCS, keys taken from the JWK Set alone.

Usage: independent_verify.py JWKS EXPORT OUT_DIR RESPONSE ENVELOPE [RESPONSE ENVELOPE ...]

Raises on the first thing that does not hold. Writes, for openssl, each signed message (*.msg), its raw
signature (*.sig) and the name of its key (*.kid), and each key as an SPKI PEM file (KID.pem). Prints one
JSON line: {"receipts": N, "checkpoints": M}.
"""

import base64
import hashlib
import json
import pathlib
import sys

import rfc8785
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey


def unb64url(text):
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def sha256_jcs(value):
    return hashlib.sha256(rfc8785.dumps(value)).hexdigest()


def read_keys(path):
    keys = {}
    for jwk in json.loads(pathlib.Path(path).read_text())["keys"]:
        assert (jwk["kty"], jwk["crv"], jwk["alg"], jwk["use"]) == ("OKP", "Ed25519", "EdDSA", "sig"), jwk
        raw = unb64url(jwk["x"])
        assert hashlib.sha256(raw).hexdigest()[:16] == jwk["kid"], jwk
        keys[jwk["kid"]] = Ed25519PublicKey.from_public_bytes(raw)
    return keys


def check(keys, out, name, message, kid, signature):
    keys[kid].verify(unb64url(signature), message)  # raises InvalidSignature
    (out / f"{name}.msg").write_bytes(message)
    (out / f"{name}.sig").write_bytes(unb64url(signature))
    (out / f"{name}.kid").write_text(kid)


def main(jwks, export, out_dir, *files):
    keys = read_keys(jwks)
    out = pathlib.Path(out_dir)
    for kid, key in keys.items():
        pem = key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        (out / f"{kid}.pem").write_bytes(pem)
    receipts = 0
    for index in range(0, len(files), 2):
        body = json.loads(pathlib.Path(files[index]).read_text())
        envelope = json.loads(pathlib.Path(files[index + 1]).read_text())
        success = body["status"] == "success"
        receipt = dict(body["receipt"] if success else body["error"]["receipt"])
        sig = receipt.pop("sig")
        assert sig["alg"] == "EdDSA", sig
        check(keys, out, f"receipt-{receipts}", rfc8785.dumps(receipt), sig["kid"], sig["value"])
        assert receipt["payload_sha256"] == sha256_jcs(envelope["payload"]), receipt
        if success:
            assert receipt["decision"] == "allow" and receipt["answer_sha256"] == sha256_jcs(body["payload"])
        else:
            assert receipt["decision"] == "deny" and receipt["code"] == body["error"]["code"]
        receipts += 1
    events = [json.loads(line) for line in pathlib.Path(export).read_text().splitlines()]
    checkpoints = 0
    for index, event in enumerate(events):
        unhashed = {k: v for k, v in event.items() if k != "hash"}
        assert hashlib.sha256(rfc8785.dumps(unhashed)).hexdigest() == event["hash"], event["seq"]
        if index:
            assert event["prev_hash"] == events[index - 1]["hash"], event["seq"]
        if event["type"] != "AuditCheckpoint":
            continue
        signed = event["checkpoint"]
        before = events[index - 1]
        assert (signed["seq"], signed["hash"]) == (before["seq"], before["hash"]), event["seq"]
        message = rfc8785.dumps({"chain": "sealgate-audit/v1", "seq": signed["seq"], "hash": signed["hash"]})
        check(keys, out, f"checkpoint-{checkpoints}", message, signed["kid"], signed["sig"])
        checkpoints += 1
    print(json.dumps({"receipts": receipts, "checkpoints": checkpoints}))


if __name__ == "__main__":
    main(*sys.argv[1:])
