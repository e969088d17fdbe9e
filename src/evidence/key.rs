//! The gateway's Ed25519 signing key (SPEC 14): read from `signing.key_file`, or made at first start on
//! the embedded store as `data_dir/signing.key`; the retired public keys of `previous_public_keys`; and
//! the `kid` that names a key: the first 16 hex digits of hex(SHA-256(its 32 bytes)).

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};

use super::Error;
use crate::envelope::{self, SessionKey};

/// The file that holds the key made at first start, in `data_dir`.
pub const GENERATED_KEY_FILE: &str = "signing.key";

/// A public key that signs (or signed) receipts and checkpoints, with its kid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublicKey {
    key: VerifyingKey,
    kid: String,
}

impl PublicKey {
    /// Accepts a canonical encoding of a point of large order only (as session keys), so that one key
    /// has one kid and no weak key can make a forged signature verify.
    pub fn from_bytes(bytes: &[u8; 32]) -> Result<PublicKey, Error> {
        let key = *SessionKey::from_bytes(bytes)
            .map_err(Error::Key)?
            .verifying_key();
        Ok(PublicKey {
            kid: kid_of(bytes),
            key,
        })
    }

    pub fn kid(&self) -> &str {
        &self.kid
    }

    pub fn to_bytes(&self) -> [u8; 32] {
        self.key.to_bytes()
    }

    /// base64url of the 32 bytes, unpadded: the JWK's `x` (RFC 8037).
    pub fn x(&self) -> String {
        URL_SAFE_NO_PAD.encode(self.key.as_bytes())
    }

    /// Strict verification (non-canonical `S` and small-order `R` refused) of an unpadded base64url
    /// signature over `message`.
    pub fn verify(&self, message: &[u8], signature: &str) -> Result<(), Error> {
        let bytes: [u8; 64] = unb64url(signature)?;
        self.key
            .verify_strict(message, &Signature::from_bytes(&bytes))
            .map_err(|_| Error::BadSignature {
                kid: self.kid.clone(),
            })
    }
}

/// Exactly `N` bytes from unpadded base64url (a key's `x`, a signature).
pub fn unb64url<const N: usize>(text: &str) -> Result<[u8; N], Error> {
    let bytes = URL_SAFE_NO_PAD.decode(text).map_err(Error::NotBase64)?;
    bytes.as_slice().try_into().map_err(|_| Error::WrongLength {
        length: bytes.len(),
        expected: N,
    })
}

/// The first 16 hex digits of hex(SHA-256(public key bytes)).
pub fn kid_of(public_key: &[u8; 32]) -> String {
    let mut kid = envelope::sha256_hex(public_key);
    kid.truncate(16);
    kid
}

/// The gateway's private key; it signs, and is never shown.
pub struct Signer {
    key: SigningKey,
    public: PublicKey,
}

impl Signer {
    pub fn new(key: SigningKey) -> Result<Signer, Error> {
        let public = PublicKey::from_bytes(&key.verifying_key().to_bytes())?;
        Ok(Signer { key, public })
    }

    pub fn public(&self) -> &PublicKey {
        &self.public
    }

    /// base64url(Ed25519 signature over `message`), unpadded.
    pub fn sign(&self, message: &[u8]) -> String {
        URL_SAFE_NO_PAD.encode(self.key.sign(message).to_bytes())
    }
}

/// The key `signing.key_file` names (`key_file`, already resolved), or else the one made at first start
/// in `data_dir` (the embedded store only: `generate` is false on PostgreSQL, where replicas must be
/// given their keys).
pub fn load(key_file: Option<&Path>, data_dir: &Path, generate: bool) -> Result<SigningKey, Error> {
    match key_file {
        Some(path) => read_key_file(path).map_err(|e| e.at("signing.key_file")),
        None if generate => generated_key(data_dir),
        None => Err(Error::KeyRequired.at("signing.key_file")),
    }
}

/// A PKCS#8 PEM private key in a file that only its owner may read: a key that other users could read
/// would let them sign receipts and checkpoints in the gateway's name, so it is refused, not used.
pub fn read_key_file(path: &Path) -> Result<SigningKey, Error> {
    let meta = std::fs::metadata(path).map_err(io_error("read", path))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(Error::KeyReadableByOthers {
            path: path.to_path_buf(),
            mode,
        });
    }
    let text = std::fs::read_to_string(path).map_err(io_error("read", path))?;
    if !text.trim_start().starts_with("-----BEGIN PRIVATE KEY-----") {
        return Err(Error::NotPem {
            path: path.to_path_buf(),
            form: "a PKCS#8 PEM private key (-----BEGIN PRIVATE KEY-----)",
        });
    }
    envelope::signing_key_from_text(&text).map_err(|e| Error::Key(e).at(path.display().to_string()))
}

/// `data_dir/signing.key`, made when missing: written to a temporary file (0600), synced, then linked
/// into place so that a key that exists is never replaced and a crash leaves no half-written key.
fn generated_key(data_dir: &Path) -> Result<SigningKey, Error> {
    let path = data_dir.join(GENERATED_KEY_FILE);
    if path.exists() {
        return read_key_file(&path).map_err(|e| e.at("signing key"));
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(data_dir)
        .map_err(io_error("create", data_dir))?;
    let key = envelope::generate_signing_key().map_err(Error::Key)?;
    let pem = envelope::signing_key_to_pkcs8_pem(&key).map_err(Error::Key)?;
    let temporary = data_dir.join(format!(
        "{GENERATED_KEY_FILE}.{}.tmp",
        uuid::Uuid::new_v4().simple()
    ));
    let written = write_synced(&temporary, &pem)
        .and_then(|()| std::fs::hard_link(&temporary, &path).map_err(io_error("create", &path)));
    let _ = std::fs::remove_file(&temporary);
    written?;
    crate::files::sync_folder(data_dir).map_err(Error::Sync)?;
    tracing::info!(file = %path.display(), kid = %kid_of(&key.verifying_key().to_bytes()),
        "made the gateway's signing key");
    Ok(key)
}

fn write_synced(path: &PathBuf, text: &str) -> Result<(), Error> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io_error("create", path))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(io_error("write", path))
}

/// What became of an I/O error while doing `action` to `path`.
pub fn io_error<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> Error + 'a {
    move |error| Error::Io {
        action,
        path: path.to_path_buf(),
        error,
    }
}

/// A retired key of `signing.previous_public_keys`: an SPKI PEM public key.
pub fn read_public_pem(path: &Path) -> Result<PublicKey, Error> {
    let text = std::fs::read_to_string(path).map_err(io_error("read", path))?;
    if !text.trim_start().starts_with("-----BEGIN PUBLIC KEY-----") {
        return Err(Error::NotPem {
            path: path.to_path_buf(),
            form: "an SPKI PEM public key (-----BEGIN PUBLIC KEY-----); keep only the public \
                   half of a retired key",
        });
    }
    let key = SessionKey::parse(&text).map_err(|e| Error::Key(e).at(path.display().to_string()))?;
    PublicKey::from_bytes(&key.to_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kid_is_the_first_16_hex_digits_of_the_keys_sha256() {
        // RFC 8032 test 1 public key.
        let bytes: [u8; 32] =
            hex::decode("d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")
                .unwrap()
                .try_into()
                .unwrap();
        let full = envelope::sha256_hex(&bytes);
        assert_eq!(kid_of(&bytes), full[..16]);
        assert_eq!(PublicKey::from_bytes(&bytes).unwrap().kid(), &full[..16]);
    }

    #[test]
    fn a_generated_key_is_kept_private_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let first = load(None, &data, true).unwrap();
        let file = data.join(GENERATED_KEY_FILE);
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let again = load(None, &data, true).unwrap();
        assert_eq!(first.to_bytes(), again.to_bytes());
        // No temporary file is left beside it.
        assert_eq!(std::fs::read_dir(&data).unwrap().count(), 1);
    }

    #[test]
    fn key_files_others_can_read_or_of_another_form_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k.pem");
        let key = envelope::generate_signing_key().unwrap();
        std::fs::write(&path, envelope::signing_key_to_pkcs8_pem(&key).unwrap()).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let refused = load(Some(&path), dir.path(), true)
            .err()
            .unwrap()
            .to_string();
        assert!(
            refused.contains("mode 0640") && refused.contains("chmod 600"),
            "{refused}"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400)).unwrap();
        assert_eq!(
            load(Some(&path), dir.path(), true).unwrap().to_bytes(),
            key.to_bytes()
        );
        let hex_key = dir.path().join("hex.key");
        std::fs::write(&hex_key, hex::encode(key.to_bytes())).unwrap();
        std::fs::set_permissions(&hex_key, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(read_key_file(&hex_key)
            .err()
            .unwrap()
            .to_string()
            .contains("PKCS#8"));
        let required = load(None, dir.path(), false).err().unwrap().to_string();
        assert!(
            required.starts_with("signing.key_file: required"),
            "{required}"
        );
    }

    #[test]
    fn signatures_verify_strictly_and_name_the_key() {
        let signer = Signer::new(envelope::generate_signing_key().unwrap()).unwrap();
        let signature = signer.sign(b"message");
        assert!(!signature.contains('='), "unpadded: {signature}");
        assert!(signer.public().verify(b"message", &signature).is_ok());
        let other = signer
            .public()
            .verify(b"massage", &signature)
            .unwrap_err()
            .to_string();
        assert!(other.contains(signer.public().kid()), "{other}");
        assert!(signer.public().verify(b"message", "AAAA").is_err());
    }
}
