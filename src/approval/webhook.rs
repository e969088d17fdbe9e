//! The approvals webhook (SPEC 13): each new request is POSTed to `approvals.webhook_url`, retried with
//! backoff, never holding up a call. With `approvals.webhook_secret` every delivery is signed as the
//! Standard Webhooks specification says, so that the receiver can tell the gateway's requests from
//! anyone else's: `webhook-id` (the same on every retry of one delivery), `webhook-timestamp` (of the
//! attempt) and `webhook-signature: v1,<base64 of HMAC-SHA256 of "id.timestamp.body">`.

use std::time::Duration;

use aws_lc_rs::hmac;
use base64::alphabet;
use base64::engine::general_purpose::STANDARD;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine;
use serde_json::json;

use crate::clock;
use crate::config::Approvals as ApprovalsConfig;
use crate::store::ApprovalRecord;

/// Attempts in all, the first included (SPEC 13: at most 5 tries), and the first pause between them.
const WEBHOOK_TRIES: u32 = 5;
const WEBHOOK_FIRST_PAUSE: Duration = Duration::from_millis(500);

/// The Standard Webhooks secret: `whsec_` and the base64 of 24 to 64 random bytes.
const SECRET_PREFIX: &str = "whsec_";
const SECRET_BYTES: std::ops::RangeInclusive<usize> = 24..=64;
/// The standard alphabet only (what receivers' libraries decode), padding optional.
const STANDARD_ANY_PADDING: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Announces new requests to `approvals.webhook_url`, when one is set.
pub struct Notifier {
    client: reqwest::Client,
    webhook_url: Option<String>,
    console_base_url: Option<String>,
    signer: Option<Signer>,
}

impl Notifier {
    /// Errors name the key and never quote the secret.
    pub fn new(config: &ApprovalsConfig) -> Result<Notifier, String> {
        let signer = config
            .webhook_secret
            .as_deref()
            .map(Signer::from_secret)
            .transpose()
            .map_err(|e| format!("approvals.webhook_secret: {e}"))?;
        if signer.is_some() && config.webhook_url.is_none() {
            return Err(
                "approvals.webhook_secret is set but approvals.webhook_url is not".to_owned(),
            );
        }
        let client = crate::outbound::client_builder()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| format!("approvals: cannot build the webhook client: {e}"))?;
        Ok(Notifier {
            client,
            webhook_url: config.webhook_url.clone(),
            console_base_url: config.console_base_url.clone(),
            signer,
        })
    }

    /// Where the console shows a request, or None without a console.
    pub fn console_url(&self, approval_id: &str) -> Option<String> {
        self.console_base_url
            .as_ref()
            // The console routes by fragment (`#/approvals`), and its page needs no server route per request.
            .map(|base| format!("{}/#/approvals/{approval_id}", base.trim_end_matches('/')))
    }

    /// POSTs the new request to the webhook on a task of its own, retrying with backoff: a slow or
    /// failing webhook never holds up or fails the call (SPEC 13).
    pub(super) fn notify(&self, record: &ApprovalRecord) {
        let Some(url) = self.webhook_url.clone() else {
            return;
        };
        let mut body = json!({
            "approval_id": record.approval_id,
            "tool": record.tool,
            "session_id": record.session_id,
            "sub": record.sub,
            "expires_at": clock::rfc3339_millis(record.expires_at_ms),
            "console_url": self.console_url(&record.approval_id),
        });
        // A request that a flow rule asked for says which (SPEC 19).
        if let Some(index) = record.flow_rule {
            body["flow_rule"] = json!(index);
        }
        let body = body.to_string();
        // One id per delivery, kept by its retries, so that a receiver can drop the duplicates.
        let delivery_id = format!("msg_{}", uuid::Uuid::new_v4().simple());
        let client = self.client.clone();
        let signer = self.signer.clone();
        let approval_id = record.approval_id.clone();
        tokio::spawn(async move {
            let send = || {
                let request = client
                    .post(&url)
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .headers(delivery_headers(&delivery_id, signer.as_ref(), &body))
                    .body(body.clone());
                async move {
                    match request.send().await {
                        Ok(response) if response.status().is_success() => Ok(()),
                        Ok(response) => Err(format!(
                            "answered {}",
                            crate::outbound::failed_status(response.status(), response.headers())
                        )),
                        // The URL as redact shows it (scheme, host, port, path): a webhook URL often
                        // holds its own credential in its userinfo or query.
                        Err(e) => Err(crate::redact::error(&e)),
                    }
                }
            };
            if deliver(&approval_id, send).await.is_err() {
                tracing::error!(%approval_id, "approval webhook given up after {WEBHOOK_TRIES} tries");
            }
        });
    }
}

/// The Standard Webhooks headers of one attempt: its time now, the delivery's id and, with a secret,
/// the signature over both and the body.
fn delivery_headers(
    delivery_id: &str,
    signer: Option<&Signer>,
    body: &str,
) -> reqwest::header::HeaderMap {
    let timestamp = clock::now_secs();
    let mut headers = reqwest::header::HeaderMap::new();
    let mut put = |name: &'static str, value: String| {
        // Base64, digits and `msg_` + hex: always a valid header value.
        if let Ok(value) = reqwest::header::HeaderValue::try_from(value) {
            headers.insert(name, value);
        }
    };
    put("webhook-id", delivery_id.to_owned());
    put("webhook-timestamp", timestamp.to_string());
    if let Some(signer) = signer {
        put(
            "webhook-signature",
            signer.signature(delivery_id, timestamp, body.as_bytes()),
        );
    }
    headers
}

/// The HMAC key of `approvals.webhook_secret`.
#[derive(Clone)]
struct Signer {
    key: hmac::Key,
}

impl Signer {
    fn from_secret(secret: &str) -> Result<Signer, &'static str> {
        let encoded = secret
            .strip_prefix(SECRET_PREFIX)
            .ok_or("must start with `whsec_` (a Standard Webhooks secret)")?;
        let key = STANDARD_ANY_PADDING
            .decode(encoded)
            .map_err(|_| "the part after `whsec_` is not base64")?;
        if !SECRET_BYTES.contains(&key.len()) {
            return Err("must encode 24 to 64 random bytes");
        }
        Ok(Signer {
            key: hmac::Key::new(hmac::HMAC_SHA256, &key),
        })
    }

    /// `v1,` and the base64 of HMAC-SHA256 over `id.timestamp.body`.
    fn signature(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let mut context = hmac::Context::with_key(&self.key);
        context.update(format!("{id}.{timestamp}.").as_bytes());
        context.update(body);
        format!("v1,{}", STANDARD.encode(context.sign().as_ref()))
    }
}

/// Sends until one attempt succeeds or [`WEBHOOK_TRIES`] attempts have failed, pausing twice as long
/// after each failure; returns how many attempts were made.
async fn deliver<F, Fut>(approval_id: &str, mut send: F) -> Result<u32, u32>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let mut pause = WEBHOOK_FIRST_PAUSE;
    for attempt in 1..=WEBHOOK_TRIES {
        let Err(failure) = send().await else {
            return Ok(attempt);
        };
        tracing::warn!(%approval_id, attempt, error = %failure, "approval webhook failed");
        if attempt < WEBHOOK_TRIES {
            tokio::time::sleep(pause).await;
            pause *= 2;
        }
    }
    Err(WEBHOOK_TRIES)
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    /// Sends that fail their first `failures` attempts, counting every attempt.
    fn failing(
        failures: u32,
        attempts: &Cell<u32>,
    ) -> impl FnMut() -> std::future::Ready<Result<(), String>> + '_ {
        move || {
            attempts.set(attempts.get() + 1);
            std::future::ready(if attempts.get() > failures {
                Ok(())
            } else {
                Err("answered 500".to_owned())
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_webhook_is_tried_five_times_with_growing_pauses_then_given_up() {
        let attempts = Cell::new(0);
        let started = tokio::time::Instant::now();
        assert_eq!(deliver("a1", failing(u32::MAX, &attempts)).await, Err(5));
        assert_eq!(attempts.get(), 5);
        // 0.5 + 1 + 2 + 4 s between the five attempts, and no pause after the last.
        assert_eq!(started.elapsed(), Duration::from_millis(7_500));
    }

    #[tokio::test(start_paused = true)]
    async fn a_delivery_stops_at_the_first_success() {
        let attempts = Cell::new(0);
        assert_eq!(deliver("a1", failing(2, &attempts)).await, Ok(3));
        assert_eq!(attempts.get(), 3);
    }

    #[test]
    fn signatures_match_the_standard_webhooks_example() {
        // The worked example of the Standard Webhooks specification's reference libraries.
        let signer = Signer::from_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").expect("secret");
        assert_eq!(
            signer.signature(
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1_614_265_330,
                br#"{"test": 2432232314}"#
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    fn refusal(secret: Option<&str>, url: Option<&str>) -> String {
        let config = ApprovalsConfig {
            webhook_url: url.map(str::to_owned),
            webhook_secret: secret.map(str::to_owned),
            ..ApprovalsConfig::default()
        };
        match Notifier::new(&config) {
            Ok(_) => panic!("accepted"),
            Err(e) => e,
        }
    }

    #[test]
    fn a_malformed_secret_is_refused_without_being_quoted() {
        let url = Some("https://hooks.example/a");
        let cases = [
            (
                "TopSecretTopSecretTopSecretTopSecret",
                "must start with `whsec_`",
            ),
            ("whsec_TopSecret!!", "is not base64"),
            ("whsec_TopSecret-_TopSecret-_TopSecret", "is not base64"),
            ("whsec_VG9wU2VjcmV0", "24 to 64 random bytes"),
        ];
        for (secret, expected) in cases {
            let message = refusal(Some(secret), url);
            assert!(
                message.starts_with("approvals.webhook_secret: "),
                "{message}"
            );
            assert!(message.contains(expected), "{message}");
            assert!(
                !message.contains("TopSecret") && !message.contains("VG9w"),
                "{message}"
            );
        }
        let long = format!("whsec_{}", STANDARD.encode([7u8; 65]));
        assert!(refusal(Some(&long), url).contains("24 to 64"));
        let unpadded = format!("whsec_{}", STANDARD.encode([7u8; 32]).trim_end_matches('='));
        let config = ApprovalsConfig {
            webhook_url: url.map(str::to_owned),
            webhook_secret: Some(unpadded),
            ..ApprovalsConfig::default()
        };
        assert!(Notifier::new(&config).is_ok());
        let secret = format!("whsec_{}", STANDARD.encode([7u8; 32]));
        assert_eq!(
            refusal(Some(&secret), None),
            "approvals.webhook_secret is set but approvals.webhook_url is not"
        );
    }
}
