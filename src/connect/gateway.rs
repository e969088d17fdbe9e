//! The bridge's side of `/v1/invoke`: signs each payload as a fresh `seal/v1` envelope with the crate's own
//! envelope code (the gateway's canonical bytes, so the two cannot disagree), posts it, and reads the
//! answer as success, refusal, or a gateway that could not be reached.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use ed25519_dalek::SigningKey;
use serde_json::Value;
use tokio::sync::Mutex;

use super::token_file::TokenFile;
use crate::clock;
use crate::envelope;
use crate::mcp_reply::Answer;

/// How long connecting to the gateway may take, when `--timeout` allows as much.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// TLS towards an `https://` gateway (SPEC 15): a CA to trust instead of the system's, a client
/// certificate for mutual TLS.
#[derive(Default)]
pub struct Tls {
    pub ca_file: Option<PathBuf>,
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
}

/// The gateway, the session's key and token, and the envelopes signed this second.
pub struct GatewayClient {
    http: reqwest::Client,
    invoke_url: String,
    /// The URL as it may be shown: scheme, host, port and path.
    shown: String,
    key: SigningKey,
    token: TokenFile,
    /// `--timeout`: the longest one exchange with the gateway may take, connecting included.
    timeout: Duration,
    recent: Mutex<Recent>,
}

/// The signatures of the envelopes signed in `second`: an envelope is never sent twice (check 8 would
/// refuse the second with 1008).
#[derive(Default)]
struct Recent {
    second: i64,
    signatures: HashSet<String>,
}

impl GatewayClient {
    pub fn new(
        gateway: &str,
        key: SigningKey,
        token: TokenFile,
        tls: &Tls,
        timeout: Duration,
    ) -> Result<GatewayClient, String> {
        let url = url::Url::parse(gateway).map_err(|e| format!("--gateway is not a URL: {e}"))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!(
                "--gateway must be an http:// or https:// URL, not {}:",
                url.scheme()
            ));
        }
        let shown = shown_url(&url);
        let mut invoke_url = url.clone();
        invoke_url.set_query(None);
        invoke_url.set_fragment(None);
        invoke_url.set_path(&format!("{}/v1/invoke", url.path().trim_end_matches('/')));
        Ok(GatewayClient {
            http: http_client(tls, timeout)?,
            invoke_url: invoke_url.into(),
            shown,
            key,
            token,
            timeout,
            recent: Mutex::new(Recent::default()),
        })
    }

    /// The gateway's URL as logs and messages show it.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// Signs `payload` in a fresh envelope, posts it and reads the answer.
    pub async fn send(&self, payload: Value) -> Answer {
        let envelope = self.fresh_envelope(payload).await;
        let response = match self
            .http
            .post(&self.invoke_url)
            .json(&envelope)
            .send()
            .await
        {
            Ok(response) => response,
            Err(e) if e.is_timeout() && !e.is_connect() => {
                return Answer::Unreachable(self.timed_out())
            }
            Err(e) => return Answer::Unreachable(describe(&e)),
        };
        let status = response.status();
        if status.is_redirection() {
            // Never followed: the envelope and its token go to the gateway named, nowhere else.
            let why = crate::outbound::failed_status(status, response.headers());
            return Answer::Unreachable(format!("{} answered {why}", self.shown));
        }
        match response.json::<Value>().await {
            Ok(body) => read_answer(body).unwrap_or_else(|| {
                Answer::Unreachable(format!(
                    "{} answered HTTP {status} with a body that is not a seal/v1 answer",
                    self.shown
                ))
            }),
            Err(e) if e.is_timeout() => Answer::Unreachable(self.timed_out()),
            Err(_) => Answer::Unreachable(format!(
                "{} answered HTTP {status} with a body that is not JSON",
                self.shown
            )),
        }
    }

    fn timed_out(&self) -> String {
        format!(
            "{} gave no complete answer within {} s (--timeout)",
            self.shown,
            self.timeout.as_secs()
        )
    }

    /// An envelope signed now with the current token, never identical to one signed before: when the
    /// same payload was already signed this second, it waits for the next one.
    async fn fresh_envelope(&self, payload: Value) -> Value {
        let token = self.token.current().await;
        let mut recent = self.recent.lock().await;
        loop {
            let now = clock::now_secs();
            if now != recent.second {
                recent.second = now;
                recent.signatures.clear();
            }
            let signed = envelope::sign_envelope(&self.key, payload.clone(), &token, now);
            let signature = signed["signature"].as_str().unwrap_or_default().to_owned();
            if recent.signatures.insert(signature) {
                return signed;
            }
            let into_second = u64::try_from(clock::now_millis().rem_euclid(1000)).unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(1000 - into_second)).await;
        }
    }
}

/// A `seal/v1` answer body, or None when the body is something else.
fn read_answer(mut body: Value) -> Option<Answer> {
    if body["protocol"] != envelope::PROTOCOL {
        return None;
    }
    match body["status"].as_str()? {
        "success" if body["payload"].is_object() => Some(Answer::Success {
            payload: body["payload"].take(),
            receipt: body["receipt"].take(),
        }),
        "error" if body["error"]["code"].is_u64() => Some(Answer::Refused(body["error"].take())),
        _ => None,
    }
}

/// Scheme, host, port and path: never userinfo or a query (SPEC 9.1 r3 for every URL in a log).
fn shown_url(url: &url::Url) -> String {
    let host = url.host_str().unwrap_or("");
    match url.port() {
        Some(port) => format!("{}://{host}:{port}{}", url.scheme(), url.path()),
        None => format!("{}://{host}{}", url.scheme(), url.path()),
    }
}

/// A transport error and its causes, without the URL.
fn describe(error: &reqwest::Error) -> String {
    let mut text = String::from("cannot reach the gateway");
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The HTTP client: rustls, trusting only `--ca-file` when one is given, presenting the client
/// certificate when one is given; no redirects (SPEC 20 rule 8), and no exchange longer than `timeout`.
fn http_client(tls: &Tls, timeout: Duration) -> Result<reqwest::Client, String> {
    let read = |path: &PathBuf, what: &str| {
        std::fs::read(path).map_err(|e| format!("{what} {}: {e}", path.display()))
    };
    let mut builder = crate::outbound::client_builder()
        .connect_timeout(CONNECT_TIMEOUT.min(timeout))
        .timeout(timeout);
    if let Some(path) = &tls.ca_file {
        let certificates = reqwest::Certificate::from_pem_bundle(&read(path, "--ca-file")?)
            .map_err(|e| {
                format!(
                    "--ca-file {}: not a PEM certificate bundle: {e}",
                    path.display()
                )
            })?;
        if certificates.is_empty() {
            return Err(format!(
                "--ca-file {}: holds no certificate",
                path.display()
            ));
        }
        builder = builder.tls_certs_only(certificates);
    }
    match (&tls.client_cert, &tls.client_key) {
        (Some(cert), Some(key)) => {
            let mut pem = read(cert, "--client-cert")?;
            pem.push(b'\n');
            pem.extend(read(key, "--client-key")?);
            // The error names no key bytes: reqwest reports only what kind of PEM it could not use.
            let identity = reqwest::Identity::from_pem(&pem).map_err(|_| {
                "--client-cert/--client-key: not a PEM certificate and its private key".to_string()
            })?;
            builder = builder.identity(identity);
        }
        (None, None) => {}
        _ => return Err("--client-cert and --client-key go together".into()),
    }
    builder
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_seal_answers_and_nothing_else() {
        let success = json!({"protocol": "seal/v1", "status": "success",
            "payload": {"jsonrpc": "2.0", "id": 1, "result": {}}, "receipt": {"claim": "NONE"}});
        assert_eq!(
            read_answer(success),
            Some(Answer::Success {
                payload: json!({"jsonrpc": "2.0", "id": 1, "result": {}}),
                receipt: json!({"claim": "NONE"})
            })
        );
        let refused = json!({"protocol": "seal/v1", "status": "error",
            "error": {"code": 2001, "name": "POLICY_VIOLATION_TOOL_DENIED", "message": "denied"}});
        assert_eq!(
            read_answer(refused.clone()),
            Some(Answer::Refused(refused["error"].clone()))
        );
        for other in [
            json!({"error": "Not Found"}),
            json!({"protocol": "seal/v2", "status": "success", "payload": {}}),
            json!({"protocol": "seal/v1", "status": "success"}),
            json!({"protocol": "seal/v1", "status": "error", "error": {"code": "x"}}),
            json!([]),
        ] {
            assert_eq!(read_answer(other.clone()), None, "{other}");
        }
    }

    #[test]
    fn a_shown_url_has_no_userinfo_and_no_query() {
        let url = url::Url::parse("https://user:secret@gw.example:8443/base?token=t#f").unwrap();
        assert_eq!(shown_url(&url), "https://gw.example:8443/base");
    }
}
