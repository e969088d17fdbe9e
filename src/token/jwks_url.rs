//! Token keys published by an identity provider at a JWKS URL (SPEC 11 r3): fetched at start-up,
//! refreshed every `refresh_secs`, and fetched again (at most every 10 s, one fetch shared by every
//! caller) when a token names a kid that no key has. While fetches fail, the last good set serves for
//! `grace_secs` after it was fetched; then its tokens are refused. All fetching runs on a task of the
//! source's own, so that no request ever talks to the identity provider itself.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use sha2::{Digest, Sha256};
use tokio::sync::{watch, Notify};
use url::Url;

use super::key_material::{keys_from_fetched_jwks, JwkError, PinnedKey, TokenAlg};
use super::ConfigError;
use crate::outbound::{read_capped, CappedReadError};

const DEFAULT_REFRESH_SECS: u64 = 300;
pub(super) const MAX_REFRESH_SECS: u64 = 86_400;
/// SPEC 11: the last good set is used for at most one hour.
pub(super) const MAX_GRACE_SECS: u64 = 3_600;
/// A token naming an unknown kid makes a fetch at most this often (SPEC 11).
const DEMAND_FLOOR: Duration = Duration::from_secs(10);
/// After a failed fetch the next comes this much later, or after `refresh_secs` when that is sooner.
const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// Real key sets are a few KiB; the cap keeps a broken or hostile endpoint from filling memory.
const MAX_JWKS_BYTES: u64 = 1024 * 1024;

/// One set of keys as fetched.
pub(crate) struct Fetched {
    pub(crate) keys: Arc<Vec<PinnedKey>>,
    /// SHA-256 of the document: an unchanged document keeps its keys (and the verified-token cache).
    digest: [u8; 32],
    at: Instant,
}

/// A `jwks_url` key entry and the state of its fetches.
pub(crate) struct RemoteJwks {
    /// Names the entry in messages (`agent_tokens.keys[0]`).
    place: String,
    url: Url,
    pin: Option<TokenAlg>,
    refresh: Duration,
    grace: Duration,
    client: reqwest::Client,
    current: ArcSwapOption<Fetched>,
    /// Shared by every source of one key set; bumped when this one's keys change.
    epoch: Arc<AtomicU64>,
    /// Wakes the refresh task for a fetch asked by a token with an unknown kid.
    wake: Arc<Notify>,
    /// Fetches finished so far, successful or not.
    finished: watch::Sender<u64>,
    fetching: AtomicBool,
    /// When a token last asked for a fetch, and the count of finished fetches that answers it.
    last_demand: Mutex<Option<(Instant, u64)>>,
}

/// A `jwks_url` entry of the configuration, its CA file resolved against the configuration's folder.
pub(crate) struct RemoteSource<'a> {
    pub(crate) url: &'a str,
    pub(crate) refresh_secs: Option<u64>,
    pub(crate) grace_secs: Option<u64>,
    pub(crate) ca_file: Option<PathBuf>,
}

impl RemoteJwks {
    /// Checks the entry (URL, bounds, CA file) without fetching anything.
    pub(crate) fn new(
        source: RemoteSource<'_>,
        place: &str,
        pin: Option<TokenAlg>,
        epoch: Arc<AtomicU64>,
    ) -> Result<Self, ConfigError> {
        let url = parse_jwks_url(source.url)?;
        let refresh_secs = source.refresh_secs.unwrap_or(DEFAULT_REFRESH_SECS);
        let grace_secs = source.grace_secs.unwrap_or(MAX_GRACE_SECS);
        if !(1..=MAX_REFRESH_SECS).contains(&refresh_secs) {
            return Err(ConfigError::RefreshSecs(refresh_secs));
        }
        if !(1..=MAX_GRACE_SECS).contains(&grace_secs) {
            return Err(ConfigError::GraceSecs(grace_secs));
        }
        if refresh_secs >= grace_secs {
            return Err(ConfigError::RefreshNotBelowGrace {
                refresh: refresh_secs,
                grace: grace_secs,
            });
        }
        let client = build_client(&url, source.ca_file.as_deref())?;
        Ok(RemoteJwks {
            place: place.to_owned(),
            url,
            pin,
            refresh: Duration::from_secs(refresh_secs),
            grace: Duration::from_secs(grace_secs),
            client,
            current: ArcSwapOption::empty(),
            epoch,
            wake: Arc::new(Notify::new()),
            finished: watch::Sender::new(0),
            fetching: AtomicBool::new(false),
            last_demand: Mutex::new(None),
        })
    }

    /// The keys, while the last good fetch lies within the grace period.
    pub(crate) fn usable(&self) -> Option<Arc<Fetched>> {
        self.current
            .load_full()
            .filter(|set| set.at.elapsed() <= self.grace)
    }

    pub(crate) fn ever_fetched(&self) -> bool {
        self.current.load().is_some()
    }

    /// Why the keys are not usable, in words safe to show a caller (no URL: it may hold a credential).
    pub(crate) fn describe_unusable(&self) -> String {
        match self.current.load_full() {
            None => format!(
                "the key set of {} (jwks_url) has not been fetched yet",
                self.place
            ),
            Some(set) => format!(
                "the key set of {} (jwks_url) was last fetched {} s ago, past its grace period of {} s",
                self.place,
                set.at.elapsed().as_secs(),
                self.grace.as_secs()
            ),
        }
    }

    /// The first fetch, then the refresh task. A failure here is retried by that task.
    pub(crate) async fn start(self: &Arc<Self>) {
        let fetched = self.fetch().await;
        spawn_refresh(Arc::downgrade(self), self.wake.clone(), fetched);
    }

    /// Asks for a fetch because a token named an unknown kid, and waits for it. Within 10 s of the last
    /// such request no new fetch is made: a caller then shares that fetch while it runs, or does
    /// without. The wait is bounded, so a hanging identity provider holds no call for long.
    pub(crate) async fn fetch_on_demand(&self) {
        let mut finished = self.finished.subscribe();
        let answered_by = {
            let mut last = self
                .last_demand
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let done = *finished.borrow_and_update();
            match *last {
                Some((asked, target)) if asked.elapsed() < DEMAND_FLOOR => {
                    if done >= target {
                        return;
                    }
                    target
                }
                _ => {
                    // A fetch already running began before this request: the one after it answers.
                    let target = done + 1 + u64::from(self.fetching.load(Ordering::SeqCst));
                    *last = Some((Instant::now(), target));
                    self.wake.notify_one();
                    target
                }
            }
        };
        let _ = tokio::time::timeout(
            FETCH_TIMEOUT,
            finished.wait_for(|done| *done >= answered_by),
        )
        .await;
    }

    /// One fetch; returns whether it brought a good set.
    async fn fetch(&self) -> bool {
        self.fetching.store(true, Ordering::SeqCst);
        let outcome = match self.download().await {
            Ok(body) => self.apply(&body),
            Err(err) => Err(err),
        };
        self.fetching.store(false, Ordering::SeqCst);
        self.finished.send_modify(|done| *done += 1);
        match outcome {
            Ok(()) => true,
            Err(err) => {
                self.report_failure(&err);
                false
            }
        }
    }

    async fn download(&self) -> Result<Vec<u8>, FetchError> {
        let response = self
            .client
            .get(self.url.clone())
            .header(
                reqwest::header::ACCEPT,
                "application/jwk-set+json, application/json",
            )
            .send()
            .await
            .map_err(|err| FetchError::Request(describe(err)))?;
        if !response.status().is_success() {
            let status = crate::outbound::failed_status(response.status(), response.headers());
            return Err(FetchError::Status(status));
        }
        read_capped(response, MAX_JWKS_BYTES)
            .await
            .map_err(|err| match err {
                CappedReadError::TooLarge => FetchError::TooLarge,
                CappedReadError::Body(err) => FetchError::Request(describe(err)),
            })
    }

    /// Takes a fetched document: the same one renews the current keys' time, another replaces them.
    fn apply(&self, body: &[u8]) -> Result<(), FetchError> {
        let digest: [u8; 32] = Sha256::digest(body).into();
        let at = Instant::now();
        if let Some(current) = self.current.load_full().filter(|c| c.digest == digest) {
            self.current.store(Some(Arc::new(Fetched {
                keys: current.keys.clone(),
                digest,
                at,
            })));
            return Ok(());
        }
        let (keys, skipped) = keys_from_fetched_jwks(body, self.pin)?;
        for reason in &skipped {
            tracing::warn!(entry = %self.place, url = %url_for_log(self.url.as_str()), %reason, "JWK skipped");
        }
        let kids: Vec<&str> = keys.iter().filter_map(PinnedKey::kid).collect();
        tracing::info!(entry = %self.place, url = %url_for_log(self.url.as_str()), keys = keys.len(), ?kids, "token keys fetched");
        self.current.store(Some(Arc::new(Fetched {
            keys: Arc::new(keys),
            digest,
            at,
        })));
        self.epoch.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    fn report_failure(&self, err: &FetchError) {
        let url = url_for_log(self.url.as_str());
        if self.usable().is_some() {
            tracing::warn!(entry = %self.place, %url, error = %err, "could not fetch token keys; the last good set stays in use");
        } else {
            tracing::error!(entry = %self.place, %url, error = %err, state = %self.describe_unusable(), "could not fetch token keys; tokens signed by them are refused");
        }
    }

    /// How long the refresh task sleeps after a fetch.
    fn pause_after(&self, fetched: bool) -> Duration {
        if fetched {
            self.refresh
        } else {
            self.refresh.min(RETRY_AFTER_FAILURE)
        }
    }
}

/// Why a fetch brought no usable key set (the last good one, if any, stays in use).
#[derive(Debug, thiserror::Error)]
enum FetchError {
    /// The request or the body failed, with its causes (see [`describe`]).
    #[error("{0}")]
    Request(String),
    #[error("answered {0}")]
    Status(String),
    #[error("the answer is over {MAX_JWKS_BYTES} bytes")]
    TooLarge,
    #[error(transparent)]
    Document(#[from] JwkError),
}

/// Fetches on schedule and on demand for as long as the source lives.
fn spawn_refresh(source: Weak<RemoteJwks>, wake: Arc<Notify>, mut fetched: bool) {
    tokio::spawn(async move {
        loop {
            let Some(pause) = source.upgrade().map(|s| s.pause_after(fetched)) else {
                return;
            };
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                () = wake.notified() => {}
            }
            let Some(source) = source.upgrade() else {
                return;
            };
            fetched = source.fetch().await;
        }
    });
}

/// A failed request with its causes (a refused connection, an untrusted certificate), without the URL:
/// its query may hold a credential.
fn describe(err: reqwest::Error) -> String {
    let err = err.without_url();
    let mut text = err.to_string();
    let mut cause = std::error::Error::source(&err);
    while let Some(inner) = cause {
        text.push_str(&format!(": {inner}"));
        cause = inner.source();
    }
    text
}

/// `https://`, or `http://` on a loopback host, where nobody else can answer. Errors never quote the
/// URL: its query may hold a credential.
fn parse_jwks_url(raw: &str) -> Result<Url, ConfigError> {
    let url = Url::parse(raw).map_err(ConfigError::NotAUrl)?;
    if url.host().is_none() {
        return Err(ConfigError::NoHost);
    }
    crate::outbound::https_or_loopback(&url).map_err(ConfigError::UrlRefused)?;
    Ok(url)
}

/// No redirects and no proxy from the environment: the keys come from the URL configured, directly.
/// With a CA file, only its certificates are trusted.
fn build_client(url: &Url, ca_file: Option<&Path>) -> Result<reqwest::Client, ConfigError> {
    let mut builder = crate::outbound::client_builder()
        .no_proxy()
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(FETCH_TIMEOUT);
    if let Some(ca_file) = ca_file {
        if url.scheme() != "https" {
            return Err(ConfigError::CaFileWithoutHttps);
        }
        let certificates = crate::outbound::read_ca_file(ca_file).map_err(ConfigError::CaFile)?;
        builder = builder.tls_certs_only(certificates);
    }
    builder.build().map_err(ConfigError::Client)
}

/// A URL as logs may show it: scheme, host, port and path; never userinfo nor query (SPEC 9.1 r3).
pub(crate) fn url_for_log(raw: &str) -> String {
    match Url::parse(raw) {
        Ok(url) => {
            let port = url.port().map(|p| format!(":{p}")).unwrap_or_default();
            format!(
                "{}://{}{port}{}",
                url.scheme(),
                url.host_str().unwrap_or_default(),
                url.path()
            )
        }
        Err(_) => "(not a valid URL)".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::token::keys::{KeyConfig, KeySet};
    use crate::token::test_support::{ed_jwk, es256_jwk, rs256_jwk, ES256_PUBLIC};

    fn url_entry(url: &str) -> KeyConfig {
        KeyConfig {
            jwks_url: Some(url.to_owned()),
            ..KeyConfig::default()
        }
    }

    fn load_error(entry: KeyConfig) -> String {
        match KeySet::load(&[entry], Path::new("/"), "agent_tokens") {
            Ok(_) => panic!("the entry should have been refused"),
            Err(err) => err.to_string(),
        }
    }

    #[test]
    fn https_anywhere_and_http_only_on_loopback() {
        for url in [
            "https://idp.example/.well-known/jwks.json",
            "http://127.0.0.1:8080/jwks",
            "http://127.7.0.1/jwks",
            "http://[::1]:9/jwks",
            "http://localhost/jwks",
        ] {
            assert!(
                KeySet::load(&[url_entry(url)], Path::new("/"), "agent_tokens").is_ok(),
                "{url}"
            );
        }
        let refused = load_error(url_entry("http://idp.example/jwks?token=TopSecret"));
        assert_eq!(
            refused,
            "agent_tokens.keys[0]: jwks_url: http:// is accepted only for a loopback host \
             (127.0.0.1, [::1], localhost); use https://"
        );
        assert!(load_error(url_entry("http://10.0.0.1/jwks")).contains("loopback"));
        assert!(load_error(url_entry("ftp://idp.example/jwks")).contains("\"ftp\""));
        let not_a_url = load_error(url_entry("idp.example/TopSecret"));
        assert!(
            not_a_url.contains("not a valid URL") && !not_a_url.contains("TopSecret"),
            "{not_a_url}"
        );
    }

    #[test]
    fn refresh_and_grace_are_bounded_and_belong_to_jwks_url() {
        let with = |refresh: Option<u64>, grace: Option<u64>| KeyConfig {
            refresh_secs: refresh,
            grace_secs: grace,
            ..url_entry("https://idp.example/jwks")
        };
        assert!(load_error(with(Some(0), None)).contains("refresh_secs is 0"));
        assert!(load_error(with(Some(86_401), None)).contains("refresh_secs is 86401"));
        assert!(load_error(with(None, Some(3_601))).contains("grace_secs is 3601"));
        assert!(load_error(with(None, Some(0))).contains("grace_secs is 0"));
        assert!(load_error(with(Some(60), Some(60))).contains("must be less than grace_secs"));
        // The default refresh (300 s) must fit under a grace the entry shortens.
        assert!(load_error(with(None, Some(100))).contains("refresh_secs (300)"));
        assert!(KeySet::load(&[with(Some(1), Some(3))], Path::new("/"), "a").is_ok());

        let pem_with_refresh = KeyConfig {
            alg: Some("ES256".into()),
            public_key_pem: Some(ES256_PUBLIC.into()),
            refresh_secs: Some(60),
            ..KeyConfig::default()
        };
        assert!(load_error(pem_with_refresh).contains("apply only to a jwks_url entry"));
        let with_kid = KeyConfig {
            kid: Some("k".into()),
            ..url_entry("https://idp.example/jwks")
        };
        assert!(load_error(with_kid).contains("kid cannot be set with jwks_url"));
        let hs256 = KeyConfig {
            alg: Some("HS256".into()),
            ..url_entry("https://idp.example/jwks")
        };
        assert!(load_error(hs256).contains("HS256 keys come from `secret` only"));
        let two_sources = KeyConfig {
            public_key_pem: Some(ES256_PUBLIC.into()),
            ..url_entry("https://idp.example/jwks")
        };
        assert!(load_error(two_sources).contains("(2 are)"));
        let no_alg = KeyConfig {
            public_key_pem: Some(ES256_PUBLIC.into()),
            ..KeyConfig::default()
        };
        assert!(load_error(no_alg).contains("alg is required"));
    }

    #[test]
    fn a_ca_file_must_hold_certificates_and_needs_https() {
        let dir = tempfile::tempdir().expect("tempdir");
        let with_ca = |url: &str, file: &str| KeyConfig {
            ca_file: Some(dir.path().join(file)),
            ..url_entry(url)
        };
        assert!(
            load_error(with_ca("https://idp.example/jwks", "missing.pem"))
                .contains("ca_file: cannot read")
        );
        std::fs::write(dir.path().join("empty.pem"), "no certificate here\n").expect("write");
        assert!(load_error(with_ca("https://idp.example/jwks", "empty.pem"))
            .contains("holds no certificate"));
        assert!(load_error(with_ca("http://127.0.0.1:1/jwks", "empty.pem"))
            .contains("ca_file applies only to an https:// jwks_url"));
    }

    fn fetched(keys: Vec<Value>, pin: Option<TokenAlg>) -> (Vec<Option<String>>, Vec<String>) {
        let body = json!({ "keys": keys }).to_string();
        let (keys, skipped) = keys_from_fetched_jwks(body.as_bytes(), pin).expect("a JWK Set");
        let kids = keys.iter().map(|k| k.kid().map(str::to_owned)).collect();
        (kids, skipped.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn each_fetched_jwk_is_pinned_by_its_own_type_and_odd_ones_are_skipped() {
        let (_, public_pem) = crate::token::ed25519_keypair_pem().expect("keypair");
        let mut issuer_member = rs256_jwk("rsa");
        issuer_member["issuer"] = json!("https://login.example/tenant");
        let mut no_alg = es256_jwk("ec");
        no_alg.as_object_mut().expect("object").remove("alg");
        let mut okp_says_rs256 = ed_jwk(&public_pem, "liar");
        okp_says_rs256["alg"] = json!("RS256");
        let mut ps256 = rs256_jwk("ps");
        ps256["alg"] = json!("PS256");
        let mut private = ed_jwk(&public_pem, "private");
        private["d"] = json!("AAAA");
        let mut encryption = ed_jwk(&public_pem, "enc");
        encryption["use"] = json!("enc");
        let (kids, skipped) = fetched(
            vec![
                ed_jwk(&public_pem, "ed"),
                issuer_member,
                no_alg,
                okp_says_rs256,
                ps256,
                json!({"kty": "oct", "k": "c2VjcmV0", "kid": "hmac"}),
                json!({"kty": "PQ", "kid": "future"}),
                private,
                encryption,
                json!("not a key"),
            ],
            None,
        );
        assert_eq!(
            kids,
            [Some("ed".into()), Some("rsa".into()), Some("ec".into())]
        );
        let expected = [
            "keys[3]: alg `RS256` with kty `OKP`: only EdDSA is accepted",
            "keys[4]: alg `PS256` with kty `RSA`: only RS256 is accepted",
            "keys[5]: kty `oct`: shared secrets are never taken from a JWK Set",
            "keys[6]: kty `PQ` is not supported",
            "keys[7]: holds private key material (`d`)",
            "keys[8]: use `enc` is not `sig`",
            "keys[9]: not a JSON object",
        ];
        assert_eq!(skipped.len(), expected.len(), "{skipped:?}");
        for (reason, start) in skipped.iter().zip(expected) {
            assert!(
                reason.starts_with(start),
                "{reason} should start with {start}"
            );
        }
    }

    #[test]
    fn an_entry_with_alg_admits_only_that_algorithm() {
        let (kids, skipped) = fetched(
            vec![es256_jwk("ec"), rs256_jwk("rsa")],
            Some(TokenAlg::Rs256),
        );
        assert_eq!(kids, [Some("rsa".into())]);
        assert_eq!(
            skipped,
            ["keys[0]: a ES256 key, and this entry admits RS256 only"]
        );
    }

    #[test]
    fn a_document_that_is_not_a_jwk_set_is_an_error() {
        for (body, expected) in [
            ("<html>", "not valid JSON"),
            (r#"{"keys": {}}"#, "no `keys` array"),
            (r#"{"keys": [], "keys": []}"#, "duplicate key"),
            ("[]", "no `keys` array"),
        ] {
            match keys_from_fetched_jwks(body.as_bytes(), None) {
                Err(err) => assert!(err.to_string().contains(expected), "{body}: {err}"),
                Ok(_) => panic!("{body} accepted"),
            }
        }
        let (kids, skipped) = fetched(Vec::new(), None);
        assert!(kids.is_empty() && skipped.is_empty());
    }

    #[test]
    fn logged_urls_lose_their_userinfo_and_query() {
        assert_eq!(
            url_for_log("https://user:pw@idp.example:8443/keys?sig=TopSecret#x"),
            "https://idp.example:8443/keys"
        );
        assert_eq!(url_for_log("::"), "(not a valid URL)");
    }

    #[test]
    fn an_unfetched_set_is_described_without_its_url_and_blocks_caching() {
        let set = KeySet::load(
            &[url_entry("https://idp.example/jwks?token=TopSecret")],
            Path::new("/"),
            "operator_auth",
        )
        .expect("loads");
        let waiting = set.waiting_for_keys().expect("not fetched yet");
        assert_eq!(
            waiting,
            "the key set of operator_auth.keys[0] (jwks_url) has not been fetched yet"
        );
        assert_eq!(set.cache_epoch(), None);
        assert_eq!(set.len(), 0);
        let shown = format!(
            "{:?}",
            url_entry("https://idp.example/jwks?token=TopSecret")
        );
        assert!(!shown.contains("TopSecret"), "{shown}");
    }
}
