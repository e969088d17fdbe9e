//! `sealgate login --gateway URL` (SPEC 16): signs a person in from a terminal with the provider's
//! device authorization grant (RFC 8628), mediated by the gateway (whose client may be confidential),
//! and keeps the console session it answers as a bearer credential in the user's configuration folder
//! (file mode 0600), keyed by gateway URL. The other client commands read it with
//! [`stored_credential`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The file in the configuration folder.
const FILE_NAME: &str = "credentials.json";

#[derive(clap::Args)]
pub struct LoginArgs {
    /// The gateway's base URL (http:// or https://).
    #[arg(long)]
    pub gateway: String,
    #[command(flatten)]
    pub tls: crate::tls::client::ClientTls,
}

/// What `sealgate login` keeps for one gateway.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredLogin {
    /// The console session identifier, sent as `Authorization: Bearer`.
    pub credential: String,
    pub sub: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// RFC 3339: the session's absolute end (it may end sooner, when idle or logged out).
    pub expires_at: String,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Credentials {
    gateways: BTreeMap<String, StoredLogin>,
}

/// `$XDG_CONFIG_HOME/sealgate`, else `$HOME/.config/sealgate`.
pub fn config_folder() -> Option<PathBuf> {
    let non_empty = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(xdg) = non_empty("XDG_CONFIG_HOME") {
        return Some(PathBuf::from(xdg).join("sealgate"));
    }
    non_empty("HOME").map(|home| PathBuf::from(home).join(".config/sealgate"))
}

/// The credential that `sealgate login` stored for `gateway_url`, unless it is past its absolute end.
/// For `sealgate approvals` and the other client commands: send it as `Authorization: Bearer`.
pub fn stored_credential(gateway_url: &str) -> Option<String> {
    stored_in(&config_folder()?, gateway_url, crate::clock::now_secs())
}

fn stored_in(folder: &Path, gateway_url: &str, now_secs: i64) -> Option<String> {
    let login = read(&folder.join(FILE_NAME))
        .gateways
        .remove(&key(gateway_url))?;
    let expires = crate::clock::parse_rfc3339_secs(&login.expires_at)?;
    (expires > now_secs).then_some(login.credential)
}

/// Gateways are keyed by their URL without a trailing slash.
fn key(gateway_url: &str) -> String {
    gateway_url.trim_end_matches('/').to_owned()
}

fn read(path: &Path) -> Credentials {
    std::fs::read(path)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or_default()
}

/// Keeps `login` for `gateway_url` beside the others, in a file only its owner may read (written to a
/// temporary file of mode 0600 first, then renamed over the old one).
pub fn store(folder: &Path, gateway_url: &str, login: StoredLogin) -> Result<PathBuf, String> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    crate::files::private_dir(folder)?;
    let path = folder.join(FILE_NAME);
    let mut credentials = read(&path);
    credentials.gateways.insert(key(gateway_url), login);
    let text = serde_json::to_vec_pretty(&credentials).map_err(|e| e.to_string())?;
    let temporary = folder.join(format!(".{FILE_NAME}.{}", std::process::id()));
    let _ = std::fs::remove_file(&temporary);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temporary)
        .map_err(|e| format!("cannot write {}: {e}", temporary.display()))?;
    file.write_all(&text)
        .and_then(|()| file.sync_all())
        .map_err(|e| format!("cannot write {}: {e}", temporary.display()))?;
    std::fs::rename(&temporary, &path)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(path)
}

/// Runs `sealgate login`: exit 0 once signed in and stored.
pub async fn run(args: &LoginArgs) -> Result<ExitCode, String> {
    let base = key(&args.gateway);
    let url = url::Url::parse(&base).map_err(|e| format!("--gateway {base:?}: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "--gateway {base:?}: must be an http:// or https:// URL"
        ));
    }
    let folder = config_folder()
        .ok_or("neither XDG_CONFIG_HOME nor HOME is set: nowhere to keep the credential")?;
    let client = args.tls.client(
        crate::outbound::client_builder()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(30)),
    )?;
    let start = post(&client, &format!("{base}/console/device"), None).await?;
    let text = |name: &str| start.get(name).and_then(Value::as_str).map(str::to_owned);
    let (Some(device_code), Some(user_code), Some(verification_uri)) = (
        text("device_code"),
        text("user_code"),
        text("verification_uri"),
    ) else {
        return Err(format!(
            "the gateway's device authorization answer is incomplete: {start}"
        ));
    };
    eprintln!("To sign in, open {verification_uri} and enter the code {user_code}");
    if let Some(complete) = text("verification_uri_complete") {
        eprintln!("(or open {complete})");
    }
    let expires_in = start
        .get("expires_in")
        .and_then(Value::as_u64)
        .unwrap_or(600);
    let deadline = std::time::Instant::now() + Duration::from_secs(expires_in);
    let mut interval = start
        .get("interval")
        .and_then(Value::as_u64)
        .unwrap_or(5)
        .max(1);
    let body = serde_json::json!({ "device_code": device_code });
    loop {
        if std::time::Instant::now() > deadline {
            return Err(format!(
                "the code {user_code} was not approved within {expires_in} s: run sealgate login again"
            ));
        }
        // RFC 8628 3.5: the device waits `interval` seconds between polls.
        tokio::time::sleep(Duration::from_secs(interval)).await;
        let answer = post(
            &client,
            &format!("{base}/console/device/token"),
            Some(&body),
        )
        .await?;
        match answer.get("status").and_then(Value::as_str) {
            Some("pending") => {
                interval = answer
                    .get("interval")
                    .and_then(Value::as_u64)
                    .unwrap_or(interval)
                    .max(1);
            }
            Some("signed_in") => {
                let login: StoredLogin = serde_json::from_value(answer.clone())
                    .map_err(|e| format!("the gateway's sign-in answer: {e}"))?;
                let who = login.name.clone().unwrap_or_else(|| login.sub.clone());
                let path = store(&folder, &base, login)?;
                eprintln!(
                    "Signed in to {base} as {who}; the credential is in {}",
                    path.display()
                );
                return Ok(ExitCode::SUCCESS);
            }
            _ => return Err(format!("the gateway answered {answer}")),
        }
    }
}

/// POSTs JSON (or nothing) and answers the JSON object; a refusal is an error naming the gateway's
/// message.
async fn post(client: &reqwest::Client, url: &str, body: Option<&Value>) -> Result<Value, String> {
    let mut request = client.post(url);
    if let Some(body) = body {
        request = request.json(body);
    }
    let response = request
        .send()
        .await
        .map_err(|e| format!("{url}: {}", crate::tls::client::failure(&e)))?;
    let status = response.status();
    let headers = response.headers().clone();
    let answer: Value = response.json().await.unwrap_or(Value::Null);
    if status.is_success() {
        return Ok(answer);
    }
    match answer.pointer("/error/message").and_then(Value::as_str) {
        Some(message) => Err(format!("{url}: {message}")),
        None => Err(format!(
            "{url}: {}",
            crate::outbound::failed_status(status, &headers)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn login(credential: &str, expires_at: &str) -> StoredLogin {
        StoredLogin {
            credential: credential.into(),
            sub: "ann".into(),
            name: None,
            expires_at: expires_at.into(),
        }
    }

    #[test]
    fn credentials_are_kept_per_gateway_in_a_private_file() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("sealgate");
        let path = store(
            &folder,
            "https://a.example/",
            login("A", "2999-01-01T00:00:00Z"),
        )
        .unwrap();
        store(
            &folder,
            "https://b.example",
            login("B", "2999-01-01T00:00:00Z"),
        )
        .unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let kept = read(&path);
        assert_eq!(kept.gateways["https://a.example"].credential, "A");
        assert_eq!(kept.gateways["https://b.example"].credential, "B");
        assert_eq!(
            stored_in(&folder, "https://a.example", 0).as_deref(),
            Some("A")
        );
        assert_eq!(
            stored_in(&folder, "https://b.example/", 0).as_deref(),
            Some("B")
        );
        assert_eq!(stored_in(&folder, "https://c.example", 0), None);
        store(
            &folder,
            "https://a.example",
            login("A2", "2000-01-01T00:00:00Z"),
        )
        .unwrap();
        assert_eq!(
            stored_in(&folder, "https://a.example", 1_000_000_000),
            None,
            "past its end"
        );
    }
}
