//! `sealgate keygen`: a new Ed25519 key pair, printed as JSON or written to `DIR/NAME.key` (0600) and
//! `DIR/NAME.pub.pem`. The private key is PKCS#8 v1, the form OpenSSL and Python `cryptography` read.

use std::io::Write;
use std::path::{Path, PathBuf};

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde_json::json;

use super::keys::{
    generate_signing_key, public_key_b64, public_key_pem, signing_key_to_pkcs8_pem, KeyError,
};

#[derive(clap::Args)]
pub struct KeygenArgs {
    /// Write NAME.key (private, mode 0600) and NAME.pub.pem into DIR instead of printing JSON.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// The file name stem used with --out.
    #[arg(long, default_value = "sealgate", requires = "out")]
    name: String,
}

/// Why `sealgate keygen` made no key pair.
#[derive(Debug, thiserror::Error)]
pub enum KeygenError {
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error("--name `{0}` must be a plain file name stem (no path separators)")]
    BadName(String),
    #[error("{} already exists; keygen never overwrites a key (choose another --name)", .0.display())]
    Exists(PathBuf),
    #[error("cannot create {}: {source}", path.display())]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

/// Prints the key pair as JSON, or writes it to files and prints where (and the public key).
pub fn run(args: &KeygenArgs) -> Result<(), KeygenError> {
    let key = generate_signing_key()?;
    let public = key.verifying_key();
    let private_pem = signing_key_to_pkcs8_pem(&key)?;
    let public_pem = public_key_pem(&public)?;
    let described = match &args.out {
        None => json!({
            "private_key": STANDARD.encode(key.to_bytes()),
            "private_key_pem": private_pem,
            "public_key": public_key_b64(&public),
            "public_key_pem": public_pem,
        }),
        Some(dir) => {
            let (private_path, public_path) =
                write_pair(dir, &args.name, &private_pem, &public_pem)?;
            json!({
                "private_key_file": private_path,
                "public_key_file": public_path,
                "public_key": public_key_b64(&public),
            })
        }
    };
    println!("{}", serde_json::to_string_pretty(&described)?);
    Ok(())
}

/// Never overwrites: an existing key may be in use, and replacing it would lock its holder out.
fn write_pair(
    dir: &Path,
    name: &str,
    private_pem: &str,
    public_pem: &str,
) -> Result<(PathBuf, PathBuf), KeygenError> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\\', '\0']) {
        return Err(KeygenError::BadName(name.to_string()));
    }
    std::fs::create_dir_all(dir).map_err(|source| KeygenError::Create {
        path: dir.to_path_buf(),
        source,
    })?;
    let private_path = dir.join(format!("{name}.key"));
    let public_path = dir.join(format!("{name}.pub.pem"));
    for path in [&private_path, &public_path] {
        if path.exists() {
            return Err(KeygenError::Exists(path.clone()));
        }
    }
    write_new(&private_path, private_pem, 0o600)?;
    if let Err(error) = write_new(&public_path, public_pem, 0o644) {
        // Half a key pair is no use and a stray private key is a liability.
        let _ = std::fs::remove_file(&private_path);
        return Err(error);
    }
    Ok((private_path, public_path))
}

fn write_new(path: &Path, contents: &str, mode: u32) -> Result<(), KeygenError> {
    use std::os::unix::fs::OpenOptionsExt;
    // The mode applies at creation, so the private key is never readable by others, not even briefly.
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|source| KeygenError::Create {
            path: path.to_path_buf(),
            source,
        })?;
    file.write_all(contents.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|source| KeygenError::Write {
            path: path.to_path_buf(),
            source,
        })
}
