//! Check 2 of SPEC section 3: split a compact JWS into its parts and decode header and claims strictly,
//! before any key is looked at.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde_json::{Map, Value};

use super::TokenError;
use crate::strict_json::parse_strict_json;

/// Longest token accepted. Real tokens are a few hundred bytes (an RS256 one with an 8192-bit key stays
/// under 2 KiB); the bound keeps hashing and decoding cheap for hostile input.
pub(crate) const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// A token that passed check 2: well-formed, but nothing about it is trusted yet.
#[derive(Debug)]
pub(crate) struct UnverifiedJwt<'a> {
    /// The header's `alg`, exactly as written (mapping it to a key algorithm is check 3's job).
    pub(crate) alg: String,
    pub(crate) kid: Option<String>,
    /// `base64url(header) "." base64url(claims)`: the bytes the signature covers.
    pub(crate) signing_input: &'a str,
    /// The third part, already known to be canonical base64url.
    pub(crate) signature_b64: &'a str,
    pub(crate) claims: Map<String, Value>,
}

/// Check 2: three canonical base64url parts (no padding, no other alphabet), a JSON object header with a
/// string `alg`, a JSON object of claims, both read by the strict reader of envelope bodies.
pub(crate) fn parse(token: &str) -> Result<UnverifiedJwt<'_>, TokenError> {
    if token.is_empty() {
        return Err(invalid("token is empty"));
    }
    if token.len() > MAX_TOKEN_BYTES {
        return Err(invalid(format!(
            "token is {} bytes long; at most {MAX_TOKEN_BYTES} are accepted",
            token.len()
        )));
    }
    let parts: Vec<&str> = token.split('.').collect();
    let [header_b64, claims_b64, signature_b64] = parts.as_slice() else {
        return Err(invalid(format!(
            "token has {} dot-separated parts; a JWS in compact form has 3",
            parts.len()
        )));
    };
    let header_bytes = decode_part(header_b64, "header")?;
    let claims_bytes = decode_part(claims_b64, "claims")?;
    // Decoded only to prove it is canonical base64url; the crypto layer decodes it again.
    decode_part(signature_b64, "signature")?;

    let mut header = parse_object(&header_bytes, "header")?;
    let claims = parse_object(&claims_bytes, "claims")?;

    let alg = match header.remove("alg") {
        Some(Value::String(alg)) => alg,
        Some(_) => return Err(invalid("token header `alg` is not a string")),
        None => return Err(invalid("token header has no `alg`")),
    };
    let kid = match header.remove("kid") {
        None => None,
        Some(Value::String(kid)) => Some(kid),
        Some(_) => return Err(invalid("token header `kid` is not a string")),
    };
    // RFC 7515 4.1.11: a recipient that does not understand a critical extension must refuse the token;
    // this gateway understands none.
    if header.contains_key("crit") {
        return Err(invalid(
            "token header has `crit`; no critical extensions are supported",
        ));
    }

    let signing_input_len = header_b64.len() + 1 + claims_b64.len();
    let signing_input = token
        .get(..signing_input_len)
        .ok_or_else(|| invalid("token signing input could not be delimited"))?;
    Ok(UnverifiedJwt {
        alg,
        kid,
        signing_input,
        signature_b64,
        claims,
    })
}

fn decode_part(part: &str, name: &str) -> Result<Vec<u8>, TokenError> {
    URL_SAFE_NO_PAD.decode(part).map_err(|err| {
        invalid(format!(
            "token {name} is not unpadded base64url (RFC 7515): {err}"
        ))
    })
}

/// Reads a header or claims part with the one strict reader that envelope bodies go through, under the
/// same rules (duplicate keys, depth, safe integers, surrogates), so a token cannot mean one thing here
/// and another to any other reader of the gateway.
fn parse_object(bytes: &[u8], name: &str) -> Result<Map<String, Value>, TokenError> {
    match parse_strict_json(bytes) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(invalid(format!("token {name} is not a JSON object"))),
        Err(err) => Err(invalid(format!("token {name} is not valid JSON: {err}"))),
    }
}

fn invalid(message: impl Into<String>) -> TokenError {
    TokenError::Invalid(message.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::strict_json::MAX_DEPTH;

    fn b64(bytes: &[u8]) -> String {
        URL_SAFE_NO_PAD.encode(bytes)
    }

    fn token_of(header: &str, claims: &str, signature: &[u8]) -> String {
        format!(
            "{}.{}.{}",
            b64(header.as_bytes()),
            b64(claims.as_bytes()),
            b64(signature)
        )
    }

    fn message(result: Result<UnverifiedJwt<'_>, TokenError>) -> String {
        match result {
            Err(TokenError::Invalid(message)) => message,
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn well_formed_token_is_split_and_decoded() {
        let token = token_of(r#"{"alg":"EdDSA","kid":"k1"}"#, r#"{"sub":"a"}"#, b"sig");
        let parsed = parse(&token).expect("parses");
        assert_eq!(parsed.alg, "EdDSA");
        assert_eq!(parsed.kid.as_deref(), Some("k1"));
        assert_eq!(parsed.claims.get("sub"), Some(&Value::from("a")));
        let (input, _) = token.rsplit_once('.').expect("has dots");
        assert_eq!(parsed.signing_input, input);
        assert_eq!(parsed.signature_b64, b64(b"sig"));
    }

    #[test]
    fn wrong_part_counts_are_refused() {
        assert!(message(parse("")).contains("empty"));
        assert!(message(parse("abc")).contains("has 1"));
        assert!(message(parse("abc.def")).contains("has 2"));
        let good = token_of(r#"{"alg":"EdDSA"}"#, "{}", b"s");
        assert!(message(parse(&format!("{good}.x"))).contains("has 4"));
    }

    #[test]
    fn padding_and_standard_alphabet_are_refused() {
        let header = b64(br#"{"alg":"EdDSA"}"#);
        let claims = b64(b"{}");
        // "{}" is 2 bytes, so its padded form ends in one '='.
        let padded = format!("{header}.{claims}=.AA");
        assert!(message(parse(&padded)).contains("claims is not unpadded base64url"));
        // 0xfb 0xff encodes to "-_8" in base64url and "+/8" in the standard alphabet.
        let standard = format!("{header}.{claims}.+/8");
        assert!(message(parse(&standard)).contains("signature is not unpadded base64url"));
        // Non-canonical trailing bits ("AB" decodes like "AA" in lenient decoders).
        let trailing = format!("{header}.{claims}.AB");
        assert!(message(parse(&trailing)).contains("signature"));
    }

    #[test]
    fn header_must_be_a_json_object_with_a_string_alg() {
        let not_json = format!("{}.{}.", b64(b"not json"), b64(b"{}"));
        assert!(message(parse(&not_json)).contains("header is not valid JSON"));
        assert!(message(parse(&token_of("[1]", "{}", b""))).contains("header is not a JSON object"));
        assert!(message(parse(&token_of("{}", "{}", b""))).contains("no `alg`"));
        assert!(message(parse(&token_of(r#"{"alg":1}"#, "{}", b""))).contains("not a string"));
        assert!(message(parse(&token_of(r#"{"alg":"EdDSA","kid":5}"#, "{}", b""))).contains("kid"));
        let crit = r#"{"alg":"EdDSA","crit":["exp"]}"#;
        assert!(message(parse(&token_of(crit, "{}", b""))).contains("crit"));
    }

    #[test]
    fn claims_must_be_a_json_object() {
        let array = token_of(r#"{"alg":"EdDSA"}"#, "[]", b"");
        assert!(message(parse(&array)).contains("claims is not a JSON object"));
        let text = token_of(r#"{"alg":"EdDSA"}"#, "\"x\"", b"");
        assert!(message(parse(&text)).contains("claims is not a JSON object"));
    }

    #[test]
    fn repeated_member_names_are_refused_at_any_depth() {
        let header = r#"{"alg":"none","alg":"EdDSA"}"#;
        assert!(message(parse(&token_of(header, "{}", b""))).contains("duplicate key \"alg\""));
        let claims = r#"{"sub":"a","x":{"k":1,"k":2}}"#;
        let refusal = message(parse(&token_of(r#"{"alg":"EdDSA"}"#, claims, b"")));
        assert!(refusal.contains("duplicate key \"k\" at $.x"), "{refusal}");
    }

    /// Documents that SPEC 2 refuses in an envelope body, each as a member of an otherwise valid object.
    const REFUSED_MEMBERS: &[&str] = &[
        r#""alg":"EdDSA","alg":"EdDSA""#,
        r#""a":{"b":1,"\u0062":2}"#,
        r#""n":9007199254740992"#,
        r#""n":-9007199254740992"#,
        r#""n":1e400"#,
        r#""s":"\ud800""#,
        r#""s":"\udc00\ud800""#,
        "\"s\":\"\u{1}\"",
        r#""n":01"#,
        r#""n":NaN"#,
    ];

    fn with_alg(members: &str) -> String {
        format!(r#"{{"alg":"EdDSA",{members}}}"#)
    }

    #[test]
    fn header_and_claims_refuse_exactly_what_an_envelope_body_refuses() {
        let deep = format!("\"d\":{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        let mut refused: Vec<String> = REFUSED_MEMBERS.iter().map(|m| m.to_string()).collect();
        refused.push(deep);
        for members in &refused {
            let document = format!("{{{members}}}");
            let Err(strict) = crate::strict_json::parse_strict_json(document.as_bytes()) else {
                panic!("the envelope reader accepts {document}")
            };
            let in_header = message(parse(&token_of(&with_alg(members), "{}", b"")));
            assert!(
                in_header.starts_with("token header is not valid JSON: "),
                "{in_header}"
            );
            let in_claims = message(parse(&token_of(r#"{"alg":"EdDSA"}"#, &document, b"")));
            assert_eq!(
                in_claims,
                format!("token claims is not valid JSON: {strict}")
            );
        }
        // Just inside every limit, both parts are accepted.
        let shallow = format!("{}{}", "[".repeat(MAX_DEPTH - 1), "]".repeat(MAX_DEPTH - 1));
        let claims = format!(
            r#"{{"n":9007199254740991,"m":-9007199254740991,"f":1e300,"s":"\ud83d\ude00","d":{shallow}}}"#
        );
        let token = token_of(&with_alg(r#""kid":"k""#), &claims, b"");
        let parsed = parse(&token).expect("accepted");
        assert_eq!(parsed.claims.get("s"), Some(&Value::from("😀")));
    }

    proptest::proptest! {
        #[test]
        fn a_part_is_accepted_exactly_when_the_envelope_reader_reads_an_object(
            text in r#"[\[\]{}",:0-9eE.+\-\\ua-f tnrl]{0,64}"#,
        ) {
            let strict = crate::strict_json::parse_strict_json(text.as_bytes());
            let ours = parse_object(text.as_bytes(), "claims");
            proptest::prop_assert_eq!(ours.ok(), strict.ok().and_then(|v| match v {
                Value::Object(map) => Some(map),
                _ => None,
            }));
        }
    }

    #[test]
    fn oversized_tokens_are_refused_before_decoding() {
        let huge = "a".repeat(MAX_TOKEN_BYTES + 1);
        assert!(message(parse(&huge)).contains("bytes long"));
    }
}
