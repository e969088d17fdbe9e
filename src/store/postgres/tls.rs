//! How the gateway reaches PostgreSQL (SPEC 11 r3): the store URL's `sslmode` and `sslrootcert`, read as
//! libpq reads them, over rustls with the crypto provider that reqwest already brings (aws-lc-rs), so
//! one TLS stack serves the whole binary. tokio-postgres knows only `disable`/`prefer`/`require` and no
//! `sslrootcert`; both are taken out of the URL here and become the connector below.
//!
//! | sslmode | encrypts | checks the certificate |
//! |---|---|---|
//! | `disable` | never | — |
//! | `prefer` (the default, as in libpq) | when the server offers TLS | no |
//! | `require` | always | no; with `sslrootcert`, as `verify-ca` (as libpq does) |
//! | `verify-ca` | always | signed by `sslrootcert` |
//! | `verify-full` | always | signed by `sslrootcert` and names the host |
//!
//! Where libpq would fall back on files of its own (`~/.postgresql/root.crt`), this fails closed: a
//! verifying mode needs `sslrootcert` (a PEM file, or `system` for the machine's trust store).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::config::SslMode;
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

/// `sslmode` of the store URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl Mode {
    fn parse(text: &str) -> Result<Mode, String> {
        Ok(match text {
            "disable" => Mode::Disable,
            "prefer" => Mode::Prefer,
            "require" => Mode::Require,
            "verify-ca" => Mode::VerifyCa,
            "verify-full" => Mode::VerifyFull,
            // `allow` (plain first, TLS if refused) and anything else.
            _ => {
                return Err(format!(
                "sslmode {text:?} is not one of disable, prefer, require, verify-ca, verify-full"
            ))
            }
        })
    }
}

/// Where the CA certificates that sign the server's certificate come from.
enum Roots {
    File(String),
    /// The machine's trust store (`sslrootcert=system`, as libpq 16 spells it).
    System,
}

/// The store URL made ready to connect: the rest of the URL for tokio-postgres, and the TLS connector.
pub struct PgTarget {
    pub config: tokio_postgres::Config,
    pub tls: MakeRustls,
}

/// Reads `postgres://…?sslmode=…&sslrootcert=…`. Errors never quote the URL (it may hold a password).
pub fn target(url: &str) -> Result<PgTarget, String> {
    let (rest, mode, roots) = split_tls_options(url)?;
    let mode = match (mode, &roots) {
        (Some(mode), _) => mode,
        // A CA given without a mode asks for verification; the machine's store only makes sense with the name.
        (None, Some(_)) => Mode::VerifyFull,
        (None, None) => Mode::Prefer,
    };
    let mut config =
        tokio_postgres::Config::from_str(&rest).map_err(|e| format!("store URL: {e}"))?;
    config.ssl_mode(match mode {
        Mode::Disable => SslMode::Disable,
        Mode::Prefer => SslMode::Prefer,
        Mode::Require | Mode::VerifyCa | Mode::VerifyFull => SslMode::Require,
    });
    let client = client_config(mode, roots)?;
    Ok(PgTarget {
        config,
        tls: MakeRustls {
            config: client.map(Arc::new),
        },
    })
}

/// The URL without `sslmode` and `sslrootcert`, and their values. Other parameters are kept byte for
/// byte (tokio-postgres decodes them itself).
fn split_tls_options(url: &str) -> Result<(String, Option<Mode>, Option<Roots>), String> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), None, None));
    };
    let (mut mode, mut roots, mut kept) = (None, None, Vec::new());
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let value = || {
            percent_decode(value)
                .ok_or_else(|| format!("store URL: {key} is not valid percent-encoding"))
        };
        match key {
            "sslmode" => mode = Some(Mode::parse(&value()?)?),
            "sslrootcert" => {
                let value = value()?;
                roots = Some(if value == "system" {
                    Roots::System
                } else {
                    Roots::File(value)
                });
            }
            _ => kept.push(pair),
        }
    }
    let rest = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((rest, mode, roots))
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes: Vec<u8> =
        url::form_urlencoded::parse(format!("x={}", text.replace('+', "%2B")).as_bytes())
            .next()
            .map(|(_, value)| value.into_owned().into_bytes())?;
    String::from_utf8(bytes).ok()
}

/// The rustls configuration for `mode`, or None when nothing is encrypted.
fn client_config(mode: Mode, roots: Option<Roots>) -> Result<Option<ClientConfig>, String> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let verifier: Arc<dyn ServerCertVerifier> = match (mode, roots) {
        (Mode::Disable, None) => return Ok(None),
        (Mode::Disable | Mode::Prefer, Some(_)) => {
            return Err(
                "store URL: sslrootcert needs sslmode require, verify-ca or verify-full; with \
                 disable or prefer nothing would be verified"
                    .to_owned(),
            )
        }
        (Mode::Prefer | Mode::Require, None) => Arc::new(Lenient {
            chain: None,
            provider: provider.clone(),
        }),
        (Mode::VerifyCa | Mode::VerifyFull, None) => {
            return Err(
                "store URL: a verifying sslmode needs sslrootcert (a PEM file of the CA, or \
                 `system` for this machine's trust store)"
                    .to_owned(),
            )
        }
        (Mode::VerifyFull, Some(Roots::System)) => Arc::new(
            rustls_platform_verifier::Verifier::new(provider.clone())
                .map_err(|e| format!("store URL: sslrootcert=system: {e}"))?,
        ),
        (_, Some(Roots::System)) => {
            return Err("store URL: sslrootcert=system needs sslmode=verify-full".to_owned())
        }
        (Mode::Require | Mode::VerifyCa, Some(Roots::File(file))) => Arc::new(Lenient {
            chain: Some(webpki_verifier(&file, &provider)?),
            provider: provider.clone(),
        }),
        (Mode::VerifyFull, Some(Roots::File(file))) => webpki_verifier(&file, &provider)?,
    };
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("store TLS: {e}"))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(Some(config))
}

/// The standard chain-and-name verifier over the CA certificates in `file`.
fn webpki_verifier(
    file: &str,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<WebPkiServerVerifier>, String> {
    let pem = std::fs::read(file).map_err(|e| format!("sslrootcert {file}: {e}"))?;
    let mut roots = RootCertStore::empty();
    for certificate in CertificateDer::pem_slice_iter(&pem) {
        let certificate =
            certificate.map_err(|e| format!("sslrootcert {file}: not a PEM certificate: {e}"))?;
        roots
            .add(certificate)
            .map_err(|e| format!("sslrootcert {file}: {e}"))?;
    }
    if roots.is_empty() {
        return Err(format!("sslrootcert {file}: holds no certificate"));
    }
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| format!("sslrootcert {file}: {e}"))
}

/// `require` without a CA (`chain` None): the connection is encrypted and the server's handshake
/// signature checked, but whoever presents a certificate is accepted (libpq's meaning). `verify-ca`
/// (`chain` Some): the chain must lead to the CA; the name in the certificate is not compared with the host.
#[derive(Debug)]
struct Lenient {
    chain: Option<Arc<WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        // The chain is checked before the name, so a name error means the chain held.
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algorithms = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// tokio-postgres's TLS hook over tokio-rustls. Without a configuration (`disable`) it is never asked
/// to connect: the mode keeps the connection plain.
#[derive(Clone)]
pub struct MakeRustls {
    config: Option<Arc<ClientConfig>>,
}

pub struct RustlsConnect {
    config: Option<Arc<ClientConfig>>,
    host: String,
}

impl<S> MakeTlsConnect<S> for MakeRustls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type TlsConnect = RustlsConnect;
    type Error = io::Error;

    fn make_tls_connect(&mut self, host: &str) -> Result<RustlsConnect, io::Error> {
        Ok(RustlsConnect {
            config: self.config.clone(),
            host: host.to_owned(),
        })
    }
}

impl<S> TlsConnect<S> for RustlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = RustlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<RustlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let config = self.config.ok_or_else(|| {
                io::Error::other("TLS is off for this connection (sslmode=disable)")
            })?;
            let name = ServerName::try_from(self.host.clone()).map_err(|_| {
                io::Error::other(format!("{:?} is not a host name for TLS", self.host))
            })?;
            tokio_rustls::TlsConnector::from(config)
                .connect(name, stream)
                .await
                .map(RustlsStream)
                .map_err(|e| explain(e, &self.host))
        })
    }
}

/// A refused certificate, said in the store URL's terms.
fn explain(error: io::Error, host: &str) -> io::Error {
    let Some(rustls::Error::InvalidCertificate(reason)) = error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    else {
        return error;
    };
    let what = match reason {
        CertificateError::UnknownIssuer | CertificateError::BadSignature => {
            "is not signed by a CA in sslrootcert".to_owned()
        }
        CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
            format!("does not name the host {host:?} (sslmode=verify-full compares them)")
        }
        CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
            "has expired".to_owned()
        }
        _ => "is refused".to_owned(),
    };
    io::Error::other(format!("the server's certificate {what} ({reason:?})"))
}

pub struct RustlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for RustlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for RustlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for RustlsStream<S> {
    /// SCRAM's channel binding needs the certificate's own signature hash; without it the server
    /// authenticates as over any TLS connection (SCRAM-SHA-256 without -PLUS).
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_options_leave_the_url_and_other_parameters_are_kept_as_written() {
        let (rest, mode, roots) = split_tls_options(
            "postgres://u:p%40ss@h:5/db?application_name=a%20b&sslmode=verify-full&sslrootcert=%2Fca.pem",
        )
        .unwrap();
        assert_eq!(rest, "postgres://u:p%40ss@h:5/db?application_name=a%20b");
        assert_eq!(mode, Some(Mode::VerifyFull));
        assert!(matches!(roots, Some(Roots::File(f)) if f == "/ca.pem"));
        let (rest, mode, roots) = split_tls_options("postgres://h/db").unwrap();
        assert_eq!(
            (rest.as_str(), mode, roots.is_none()),
            ("postgres://h/db", None, true)
        );
    }

    #[test]
    fn modes_and_roots_that_cannot_work_together_are_refused_by_name() {
        for (url, expected) in [
            (
                "postgres://h/db?sslmode=allow",
                "sslmode \"allow\" is not one of",
            ),
            ("postgres://h/db?sslmode=verify-full", "needs sslrootcert"),
            ("postgres://h/db?sslmode=verify-ca", "needs sslrootcert"),
            (
                "postgres://h/db?sslmode=disable&sslrootcert=/x",
                "sslrootcert needs sslmode",
            ),
            (
                "postgres://h/db?sslmode=verify-ca&sslrootcert=system",
                "needs sslmode=verify-full",
            ),
            (
                "postgres://h/db?sslrootcert=/nonexistent/ca.pem",
                "sslrootcert /nonexistent/ca.pem",
            ),
        ] {
            let error = target(url)
                .err()
                .unwrap_or_else(|| panic!("{url} accepted"));
            assert!(error.contains(expected), "{url}: {error}");
        }
        for url in [
            "postgres://h/db",
            "postgres://h/db?sslmode=disable",
            "postgres://h/db?sslmode=require",
        ] {
            assert!(target(url).is_ok(), "{url}");
        }
    }
}
