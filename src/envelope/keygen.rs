//! `sealgate keygen`: a new Ed25519 key pair, printed as JSON or written to `DIR/NAME.key` (0600) and
//! `DIR/NAME.pub.pem`. The private key is PKCS#8 v1, the form OpenSSL and Python `cryptography` read.

use std::io::Write;
use std::path::{Path, PathBuf};

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde_json::json;

use super::keys::{generate_signing_key, public_key_b64, public_key_pem, signing_key_to_pkcs8_pem};

#[derive(clap::Args)]
pub struct KeygenArgs {
    /// Write NAME.key (private, mode 0600) and NAME.pub.pem into DIR instead of printing JSON.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// The file name stem used with --out.
    #[arg(long, default_value = "sealgate", requires = "out")]
    name: String,
}

/// Prints the key pair as JSON, or writes it to files and prints where (and the public key).
pub fn run(args: &KeygenArgs) -> Result<(), String> {
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
    println!(
        "{}",
        serde_json::to_string_pretty(&described).map_err(|e| e.to_string())?
    );
    Ok(())
}

/// Never overwrites: an existing key may be in use, and replacing it would lock its holder out.
fn write_pair(
    dir: &Path,
    name: &str,
    private_pem: &str,
    public_pem: &str,
) -> Result<(PathBuf, PathBuf), String> {
    if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\\', '\0']) {
        return Err(format!(
            "--name `{name}` must be a plain file name stem (no path separators)"
        ));
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let private_path = dir.join(format!("{name}.key"));
    let public_path = dir.join(format!("{name}.pub.pem"));
    for path in [&private_path, &public_path] {
        if path.exists() {
            return Err(format!(
                "{} already exists; keygen never overwrites a key (choose another --name)",
                path.display()
            ));
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

fn write_new(path: &Path, contents: &str, mode: u32) -> Result<(), String> {
    use std::os::unix::fs::OpenOptionsExt;
    // The mode applies at creation, so the private key is never readable by others, not even briefly.
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    file.write_all(contents.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}
