//! The listener's TLS (SPEC 11 r3): TLS 1.2 and 1.3 only, ALPN `http/1.1`, client certificates signed
//! by `tls.client_ca_file` when it is set, and the files read again every [`RELOAD_EVERY`]: a change
//! applies to new handshakes, while open connections keep the session they have.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::danger::ClientCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use sha2::{Digest, Sha256};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

/// How often the files are compared with what is in force: SPEC 11 r3 promises a change within 10 s.
const RELOAD_EVERY: Duration = Duration::from_secs(2);

/// Hands each new connection the TLS configuration in force when it arrives.
pub struct Acceptor {
    current: Arc<ArcSwap<ServerConfig>>,
}

impl Acceptor {
    /// The listener's TLS, or None without `tls.cert_file`; an error names the key whose file does not
    /// load. Starts the reload, which ends with the acceptor.
    pub fn from_files(files: Option<TlsFiles>) -> Result<Option<Acceptor>, String> {
        let Some(files) = files else {
            return Ok(None);
        };
        let loaded = files.read()?;
        let current = Arc::new(ArcSwap::from_pointee(loaded.server_config()?));
        spawn_reload(files, loaded.fingerprint(), Arc::downgrade(&current));
        Ok(Some(Acceptor { current }))
    }

    /// The TLS handshake of a new connection, with the configuration in force now.
    pub async fn accept(&self, stream: TcpStream) -> std::io::Result<TlsStream<TcpStream>> {
        tokio_rustls::TlsAcceptor::from(self.current.load_full())
            .accept(stream)
            .await
    }
}

/// Checks that the configured files load, as `serve` would load them (for `serve --check`).
pub fn check(files: Option<TlsFiles>) -> Result<(), String> {
    match files {
        Some(files) => files.read()?.server_config().map(drop),
        None => Ok(()),
    }
}

/// The configured files, resolved against the configuration's folder.
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

/// What the files held when read.
struct Contents {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

impl TlsFiles {
    fn read(&self) -> Result<Contents, String> {
        Ok(Contents {
            cert: read("tls.cert_file", &self.cert)?,
            key: read("tls.key_file", &self.key)?,
            client_ca: match &self.client_ca {
                Some(path) => Some(read("tls.client_ca_file", path)?),
                None => None,
            },
        })
    }
}

fn read(key: &str, path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{key}: cannot read {}: {e}", path.display()))
}

impl Contents {
    fn server_config(&self) -> Result<ServerConfig, String> {
        let chain = certificates("tls.cert_file", &self.cert)?;
        let key = PrivateKeyDer::from_pem_slice(&self.key)
            .map_err(|e| format!("tls.key_file: no usable PEM private key: {e}"))?;
        let versions = [&rustls::version::TLS13, &rustls::version::TLS12];
        let builder = ServerConfig::builder_with_provider(super::provider())
            .with_protocol_versions(&versions)
            .map_err(|e| format!("tls: {e}"))?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(pem) => builder.with_client_cert_verifier(client_verifier(pem)?),
        };
        let mut config = builder
            .with_single_cert(chain, key)
            .map_err(|e| format!("tls.cert_file and tls.key_file: {e}"))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }

    /// A digest of the three files, to notice a change without keeping the key's bytes around.
    fn fingerprint(&self) -> [u8; 32] {
        let mut digest = Sha256::new();
        for part in [Some(&self.cert), Some(&self.key), self.client_ca.as_ref()] {
            let bytes = part.map_or(&[][..], Vec::as_slice);
            digest.update((bytes.len() as u64).to_be_bytes());
            digest.update(bytes);
        }
        digest.finalize().into()
    }
}

fn certificates(key: &str, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certificates = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{key}: not PEM certificates: {e}"))?;
    if certificates.is_empty() {
        return Err(format!("{key}: holds no PEM certificate"));
    }
    Ok(certificates)
}

/// Mutual TLS: every client presents a certificate that one of these CAs signed.
fn client_verifier(pem: &[u8]) -> Result<Arc<dyn ClientCertVerifier>, String> {
    let mut roots = RootCertStore::empty();
    for certificate in certificates("tls.client_ca_file", pem)? {
        roots
            .add(certificate)
            .map_err(|e| format!("tls.client_ca_file: {e}"))?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), super::provider())
        .build()
        .map_err(|e| format!("tls.client_ca_file: {e}"))
}

/// Reads the files every [`RELOAD_EVERY`] and puts a changed set in force once it loads; a set that
/// does not load (a file half written, a key that does not fit) leaves the last good one in force.
fn spawn_reload(files: TlsFiles, mut loaded: [u8; 32], current: Weak<ArcSwap<ServerConfig>>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(RELOAD_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing: Option<String> = None;
        loop {
            tick.tick().await;
            let Some(current) = current.upgrade() else {
                return;
            };
            // Small files, read every few seconds: not worth a blocking-pool hop.
            let changed = files
                .read()
                .map(|contents| (contents.fingerprint() != loaded).then_some(contents));
            let reloaded = match changed {
                Ok(None) => {
                    failing = None;
                    continue;
                }
                Ok(Some(contents)) => contents
                    .server_config()
                    .map(|config| (config, contents.fingerprint())),
                Err(e) => Err(e),
            };
            match reloaded {
                Ok((config, fingerprint)) => {
                    current.store(Arc::new(config));
                    loaded = fingerprint;
                    failing = None;
                    tracing::info!("TLS files reloaded: new connections use them");
                }
                // Said once per distinct problem, not at every tick.
                Err(e) if failing.as_ref() != Some(&e) => {
                    tracing::error!(error = %e, "TLS files changed but do not load; the last good ones stay in force");
                    failing = Some(e);
                }
                Err(_) => {}
            }
        }
    });
}
