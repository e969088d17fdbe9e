//! TLS, with rustls on the aws-lc-rs provider that reqwest already brings (one crypto library, not two):
//! the listener's certificates and their reload (SPEC 11 r3), the client side of the commands that
//! reach a gateway over `https://`, and the demo's own certificates.

pub mod client;
pub mod made;
mod server;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use server::{check, Acceptor, TlsFiles};

/// The `tls` section: with `cert_file` and `key_file` the listener speaks HTTPS only.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// PEM: the server's certificate, then any intermediates.
    pub cert_file: Option<PathBuf>,
    /// PEM: the certificate's private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
    /// PEM: the CAs whose certificates clients must present (mutual TLS); none: no client certificate.
    pub client_ca_file: Option<PathBuf>,
}

impl TlsConfig {
    /// The first key that is missing for the ones that are set, and why.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        let fail = |key, message: &str| Err((key, message.to_owned()));
        match (&self.cert_file, &self.key_file, &self.client_ca_file) {
            (Some(_), None, _) => fail("tls.key_file", "is required with tls.cert_file"),
            (None, Some(_), _) => fail("tls.cert_file", "is required with tls.key_file"),
            (None, None, Some(_)) => fail(
                "tls.client_ca_file",
                "needs tls.cert_file and tls.key_file: mutual TLS is TLS first",
            ),
            _ => Ok(()),
        }
    }
}

/// The one crypto provider of every TLS configuration here.
fn provider() -> std::sync::Arc<rustls::crypto::CryptoProvider> {
    std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_certificate_needs_its_key_and_mutual_tls_needs_both() {
        let set = |cert: bool, key: bool, ca: bool| TlsConfig {
            cert_file: cert.then(|| "c.pem".into()),
            key_file: key.then(|| "k.pem".into()),
            client_ca_file: ca.then(|| "ca.pem".into()),
        };
        assert!(set(false, false, false).validate().is_ok());
        assert!(set(true, true, true).validate().is_ok());
        assert_eq!(
            set(true, false, false).validate().unwrap_err().0,
            "tls.key_file"
        );
        assert_eq!(
            set(false, true, false).validate().unwrap_err().0,
            "tls.cert_file"
        );
        assert_eq!(
            set(false, false, true).validate().unwrap_err().0,
            "tls.client_ca_file"
        );
    }
}
