//! The client side of `https://` for the commands that reach a gateway (`health`, `invoke`, the demo):
//! which CAs to trust, and the client certificate for a gateway that asks for one (mutual TLS).

use std::path::{Path, PathBuf};

/// The TLS flags of a command that calls a gateway.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ClientTls {
    /// PEM file of the CA certificates to trust for an https:// gateway, instead of the system's.
    #[arg(long, value_name = "PEM")]
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate, for a gateway that requires one (mutual TLS); needs --client-key.
    #[arg(long, value_name = "PEM", requires = "client_key")]
    pub client_cert: Option<PathBuf>,
    /// PEM private key of --client-cert.
    #[arg(long, value_name = "PEM", requires = "client_cert")]
    pub client_key: Option<PathBuf>,
}

impl ClientTls {
    /// `builder` with these flags applied: TLS 1.2 at least, the given CAs only, the client identity.
    pub fn apply(&self, builder: reqwest::ClientBuilder) -> Result<reqwest::ClientBuilder, String> {
        let mut builder = builder.tls_version_min(reqwest::tls::Version::TLS_1_2);
        if let Some(path) = &self.ca_file {
            let pem = read("--ca-file", path)?;
            let certificates = reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| format!("--ca-file {}: not PEM certificates: {e}", path.display()))?;
            if certificates.is_empty() {
                return Err(format!(
                    "--ca-file {}: holds no PEM certificate",
                    path.display()
                ));
            }
            builder = builder.tls_certs_only(certificates);
        }
        if let (Some(cert), Some(key)) = (&self.client_cert, &self.client_key) {
            let mut pem = read("--client-cert", cert)?;
            pem.push(b'\n');
            pem.extend(read("--client-key", key)?);
            let identity = reqwest::Identity::from_pem(&pem)
                .map_err(|e| format!("--client-cert and --client-key: {e}"))?;
            builder = builder.identity(identity);
        }
        Ok(builder)
    }

    /// A client with these flags applied to `builder`. Without `--ca-file` the system's CAs are trusted.
    pub fn client(&self, builder: reqwest::ClientBuilder) -> Result<reqwest::Client, String> {
        self.apply(builder)?
            .build()
            .map_err(|e| format!("cannot build an HTTP client: {e}"))
    }
}

fn read(flag: &str, path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{flag} {}: {e}", path.display()))
}

/// Why a request failed, causes included: reqwest's own text ("error sending request") leaves out
/// what matters here, such as a certificate that no trusted CA signed.
pub fn failure(error: &reqwest::Error) -> String {
    let error: &(dyn std::error::Error + 'static) = error;
    std::iter::successors(Some(error), |e| e.source())
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}
