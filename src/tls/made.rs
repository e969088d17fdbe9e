//! Certificates made on the spot for `sealgate demo --tls`: a CA of its own and a server certificate for
//! the loopback names that it signs, so that a client trusts the gateway by the CA file alone.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// PEM texts: the CA that clients trust, and the server's certificate and private key.
pub struct LoopbackCertificates {
    pub ca: String,
    pub certificate: String,
    pub private_key: String,
}

/// A new CA, and a certificate that it signs for `localhost`, `127.0.0.1` and `::1`.
pub fn for_loopback() -> Result<LoopbackCertificates, String> {
    let made = |e: rcgen::Error| format!("cannot make the demo's TLS certificates: {e}");
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(made)?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca.distinguished_name
        .push(DnType::CommonName, "sealgate demo CA");
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().map_err(made)?).map_err(made)?;
    let names = ["localhost", "127.0.0.1", "::1"].map(String::from).to_vec();
    let mut server = CertificateParams::new(names).map_err(made)?;
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    server
        .distinguished_name
        .push(DnType::CommonName, "sealgate demo");
    let key = KeyPair::generate().map_err(made)?;
    let certificate = server.signed_by(&key, &ca).map_err(made)?;
    Ok(LoopbackCertificates {
        ca: ca.pem(),
        certificate: certificate.pem(),
        private_key: key.serialize_pem(),
    })
}
