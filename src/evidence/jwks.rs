//! Keys as JSON Web Keys (RFC 7517, RFC 8037): the set `GET /v1/keys` answers, and the reading of such a
//! set by the verifiers, from a file or from a gateway's `/v1/keys`.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};

use super::key::{io_error, unb64url, PublicKey};
use super::Error;

/// One key as a JWK.
pub fn jwk(key: &PublicKey) -> Value {
    json!({"kty": "OKP", "crv": "Ed25519", "x": key.x(), "kid": key.kid(), "alg": "EdDSA", "use": "sig"})
}

/// A JWK Set of `keys`, the first of each kid kept.
pub fn jwk_set<'a>(keys: impl IntoIterator<Item = &'a PublicKey>) -> Value {
    let mut seen = std::collections::HashSet::new();
    let keys: Vec<Value> = keys
        .into_iter()
        .filter(|key| seen.insert(key.kid().to_owned()))
        .map(jwk)
        .collect();
    json!({ "keys": keys })
}

/// The keys a verifier trusts, by kid.
#[derive(Debug, Default)]
pub struct KeyRing {
    keys: BTreeMap<String, PublicKey>,
}

impl KeyRing {
    pub fn get(&self, kid: &str) -> Option<&PublicKey> {
        self.keys.get(kid)
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Reads a JWK Set of Ed25519 keys. Anything else in it is refused rather than skipped, and so is a
    /// key whose `kid` is not the kid of its `x`: a verifier must not trust a set it cannot read whole.
    pub fn from_jwks(set: &Value) -> Result<KeyRing, Error> {
        let keys = set
            .get("keys")
            .and_then(Value::as_array)
            .ok_or(Error::NoKeys)?;
        let mut ring = KeyRing::default();
        for (index, entry) in keys.iter().enumerate() {
            let key = read_jwk(entry).map_err(|e| e.at(format!("keys[{index}]")))?;
            ring.keys.insert(key.kid().to_owned(), key);
        }
        Ok(ring)
    }

    /// The set in a file, or at an `http://` or `https://` URL (a gateway's `/v1/keys`).
    pub async fn load(source: &str) -> Result<KeyRing, Error> {
        let text = if source.starts_with("https://") || source.starts_with("http://") {
            fetch(source).await?
        } else {
            std::fs::read_to_string(source)
                .map_err(io_error("read", std::path::Path::new(source)))?
        };
        let set = crate::strict_json::parse_strict_json(text.as_bytes())
            .map_err(|e| Error::NotJwkSet(e).at(source))?;
        KeyRing::from_jwks(&set).map_err(|e| e.at(source))
    }
}

fn read_jwk(entry: &Value) -> Result<PublicKey, Error> {
    let text = |name: &str| entry.get(name).and_then(Value::as_str);
    if text("kty") != Some("OKP") || text("crv") != Some("Ed25519") {
        return Err(Error::NotEd25519);
    }
    for (field, value) in [("alg", "EdDSA"), ("use", "sig")] {
        if text(field).is_some_and(|given| given != value) {
            return Err(Error::NotValue {
                field,
                rule: "must be",
                value,
            });
        }
    }
    let x = text("x").ok_or(Error::Missing("x"))?;
    let bytes: [u8; 32] = unb64url(x).map_err(|e| e.of("x"))?;
    let key = PublicKey::from_bytes(&bytes).map_err(|e| e.at("x"))?;
    match text("kid") {
        Some(kid) if kid == key.kid() => Ok(key),
        Some(kid) => Err(Error::WrongKid {
            kid: kid.to_owned(),
            actual: key.kid().to_owned(),
        }),
        None => Err(Error::Missing("kid")),
    }
}

/// A gateway's `/v1/keys`, from the URL given and nowhere else: a redirect is refused, not followed
/// (SPEC 20 rule 8), and plain `http://` is refused unless the host is this machine, where nobody
/// between could swap the keys that the verdict rests on.
async fn fetch(source: &str) -> Result<String, Error> {
    let url = reqwest::Url::parse(source).map_err(|error| Error::NotUrl {
        url: source.to_owned(),
        error,
    })?;
    crate::outbound::https_or_loopback(&url).map_err(|why| Error::Insecure(why).at(source))?;
    let fetch_error = |action| {
        move |error| Error::Fetch {
            action,
            url: source.to_owned(),
            error,
        }
    };
    let response = crate::outbound::client_builder()
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(Error::Client)?
        .get(url)
        .send()
        .await
        .map_err(fetch_error("fetch"))?;
    if !response.status().is_success() {
        return Err(Error::Answered {
            url: source.to_owned(),
            status: crate::outbound::failed_status(response.status(), response.headers()),
        });
    }
    response.text().await.map_err(fetch_error("read"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::evidence::key::Signer;

    fn public() -> PublicKey {
        let signer = Signer::new(crate::envelope::generate_signing_key().unwrap()).unwrap();
        signer.public().clone()
    }

    #[test]
    fn a_set_reads_back_and_duplicates_are_listed_once() {
        let (a, b) = (public(), public());
        let set = jwk_set([&a, &b, &a]);
        assert_eq!(set["keys"].as_array().unwrap().len(), 2);
        assert_eq!(set["keys"][0]["kty"], "OKP");
        assert_eq!(set["keys"][0]["use"], "sig");
        let ring = KeyRing::from_jwks(&set).unwrap();
        assert_eq!(ring.get(a.kid()), Some(&a));
        assert_eq!(ring.get(b.kid()), Some(&b));
    }

    #[test]
    fn a_key_that_is_not_what_it_claims_is_refused() {
        let (a, b) = (public(), public());
        let mut wrong_kid = jwk(&a);
        wrong_kid["kid"] = json!(b.kid());
        let mut rsa = jwk(&a);
        rsa["kty"] = json!("RSA");
        let mut short = jwk(&a);
        short["x"] = json!("AAAA");
        for (entry, expected) in [
            (wrong_kid, "is not the kid of its key"),
            (rsa, "not an Ed25519 key"),
            (short, "not 32"),
        ] {
            let refused = KeyRing::from_jwks(&json!({ "keys": [entry] }))
                .unwrap_err()
                .to_string();
            assert!(
                refused.starts_with("keys[0]: ") && refused.contains(expected),
                "{refused}"
            );
        }
    }
}
