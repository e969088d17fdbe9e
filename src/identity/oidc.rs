//! OpenID Connect sign-in (SPEC 16): the gateway as a relying party of the organisation's identity
//! provider. Authorization code flow with PKCE (S256), `state` and `nonce`; the device authorization
//! grant (RFC 8628) for `sealgate login`. Sign-ins in progress are kept in the store by the caller, so
//! that the callback may reach any replica, and each `state` is taken once.
//!
//! The ID token's verification is handed in as an [`IdTokenCheck`] (built by `crate::token` from the
//! provider's key set), so that JWT keys and their algorithms stay in that one room.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use url::Url;

use super::console_session::{ConsoleSessions, Person};
use super::roles::{RoleConfig, Roles};
use super::start_budget::StartBudget;
use crate::envelope::{random_secret, sha256_base64url};
use crate::outbound::{read_capped, CappedReadError};

/// A sign-in must come back within this long (SPEC 16 leaves it open; ten minutes is what providers
/// give a login page).
pub const SIGN_IN_TTL_MS: i64 = 600_000;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Discovery documents, token answers and userinfo are a few KiB.
const MAX_ANSWER_BYTES: u64 = 256 * 1024;

fn default_scopes() -> Vec<String> {
    ["openid", "profile", "email"].map(String::from).to_vec()
}
fn default_groups_claim() -> String {
    "groups".to_owned()
}
fn default_idle_secs() -> u64 {
    1800
}
fn default_max_secs() -> u64 {
    43_200
}

/// `operator_auth.oidc` (SPEC 16).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OidcConfig {
    /// Discovery at `ISSUER/.well-known/openid-configuration`; `http://` only on a loopback host.
    pub issuer: String,
    pub client_id: String,
    /// A file holding the client secret; none: a public client (PKCE alone).
    #[serde(default)]
    pub client_secret_file: Option<PathBuf>,
    /// A PEM bundle: the only authorities trusted for the provider's `https://` endpoints.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    #[serde(default = "default_scopes")]
    pub scopes: Vec<String>,
    #[serde(default = "default_groups_claim")]
    pub groups_claim: String,
    #[serde(default = "default_idle_secs")]
    pub session_idle_secs: u64,
    #[serde(default = "default_max_secs")]
    pub session_max_secs: u64,
}

/// Verifies an ID token (signature by the provider's keys, `iss`, `aud` holding the client id, `exp`,
/// `iat` within the clock skew, and `nonce` when one was sent) and returns its claims.
#[async_trait::async_trait]
pub trait IdTokenCheck: Send + Sync {
    async fn check(
        &self,
        id_token: &str,
        nonce: Option<&str>,
        now_secs: i64,
    ) -> Result<Map<String, Value>, String>;
}

/// Builds the [`IdTokenCheck`] for the key set at a discovered `jwks_uri`.
pub type MakeIdTokenCheck =
    Box<dyn Fn(&str) -> Result<Arc<dyn IdTokenCheck>, String> + Send + Sync>;

/// What discovery says of the provider (OpenID Connect Discovery 1.0, section 3).
#[derive(Debug, Clone, Deserialize)]
struct Discovery {
    issuer: String,
    authorization_endpoint: String,
    token_endpoint: String,
    jwks_uri: String,
    #[serde(default)]
    userinfo_endpoint: Option<String>,
    #[serde(default)]
    device_authorization_endpoint: Option<String>,
}

struct Provider {
    discovery: Discovery,
    id_tokens: Arc<dyn IdTokenCheck>,
}

/// A sign-in in progress (SPEC 16): what the callback needs to finish it, found by its `state`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignInAttempt {
    pub state: String,
    pub nonce: String,
    /// The PKCE code verifier (RFC 7636) whose S256 challenge went to the provider.
    pub pkce_verifier: String,
    /// The `redirect_uri` sent to the provider, which the code exchange must repeat.
    pub redirect_uri: String,
    pub created_at_ms: i64,
}

/// Why a sign-in failed, in words safe to show the person (never a secret, a code or a token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignInError {
    pub message: String,
    /// The provider could not be reached or answered nonsense: not the person's fault.
    pub provider_failed: bool,
}

impl SignInError {
    fn refused(message: impl Into<String>) -> SignInError {
        SignInError {
            message: message.into(),
            provider_failed: false,
        }
    }
    pub fn provider(message: impl Into<String>) -> SignInError {
        SignInError {
            message: message.into(),
            provider_failed: true,
        }
    }
}

/// A sign-in just begun: where to send the browser, and what to keep until its callback.
pub struct Begun {
    pub authorization_url: String,
    pub attempt: SignInAttempt,
}

/// What the provider sent back to `/console/callback`.
#[derive(Debug, Default)]
pub struct Callback {
    pub state: Option<String>,
    pub code: Option<String>,
    /// RFC 9207: the issuer of the answer, when the provider says it.
    pub iss: Option<String>,
    pub error: Option<String>,
    pub error_description: Option<String>,
}

impl Callback {
    /// From the callback's query; a parameter given twice keeps its first value, others are ignored.
    pub fn from_query(query: &str) -> Callback {
        let mut callback = Callback::default();
        for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
            let slot = match key.as_ref() {
                "state" => &mut callback.state,
                "code" => &mut callback.code,
                "iss" => &mut callback.iss,
                "error" => &mut callback.error,
                "error_description" => &mut callback.error_description,
                _ => continue,
            };
            slot.get_or_insert_with(|| value.into_owned());
        }
        callback
    }
}

/// A device authorization started at the provider (RFC 8628 section 3.2), as `sealgate login` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DeviceStart {
    pub device_code: String,
    pub user_code: String,
    pub verification_uri: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verification_uri_complete: Option<String>,
    pub expires_in: u64,
    /// Seconds to wait between polls (RFC 8628 default 5).
    #[serde(default = "default_interval")]
    pub interval: u64,
}

fn default_interval() -> u64 {
    5
}

/// Where a device authorization stands.
pub enum DevicePoll {
    /// Not approved yet; `slow_down` asks for a longer interval (RFC 8628 section 3.5).
    Pending {
        slow_down: bool,
    },
    Approved(Person),
}

/// The relying party: configuration, the provider as discovered, roles and console sessions.
pub struct Oidc {
    config: OidcConfig,
    client_secret: Option<String>,
    http: reqwest::Client,
    provider: tokio::sync::OnceCell<Provider>,
    make_id_token_check: MakeIdTokenCheck,
    pub roles: Roles,
    pub sessions: ConsoleSessions,
    /// Sign-ins that may start now (`/console/login`, `/console/device`): neither needs a credential.
    pub starts: StartBudget,
}

impl Oidc {
    /// Checks `operator_auth.oidc` and `operator_auth.roles`, naming the key that is wrong. Nothing is
    /// fetched yet: discovery happens at the first sign-in, so that a provider down at start-up only
    /// delays sign-ins.
    pub fn new(
        config: &OidcConfig,
        roles: &[RoleConfig],
        base_dir: &Path,
        make_id_token_check: MakeIdTokenCheck,
    ) -> Result<Oidc, String> {
        let place = "operator_auth.oidc";
        let issuer = provider_url(&config.issuer).map_err(|e| format!("{place}.issuer: {e}"))?;
        if config.client_id.is_empty() {
            return Err(format!("{place}.client_id: must not be empty"));
        }
        if !config.scopes.iter().any(|scope| scope == "openid") {
            return Err(format!("{place}.scopes: must hold \"openid\""));
        }
        if config.groups_claim.is_empty() {
            return Err(format!("{place}.groups_claim: must not be empty"));
        }
        if config.session_idle_secs == 0 || config.session_max_secs == 0 {
            return Err(format!(
                "{place}.session_idle_secs and session_max_secs: must be at least 1"
            ));
        }
        let client_secret = match &config.client_secret_file {
            None => None,
            Some(file) => Some(
                read_secret(&base_dir.join(file))
                    .map_err(|e| format!("{place}.client_secret_file: {e}"))?,
            ),
        };
        let mut http = crate::outbound::client_builder()
            .no_proxy()
            // Sign-ins are rare: a connection kept idle would meet the provider's own idle timeout
            // (Node's is 5 s, a device poll's interval) and fail the next request.
            .pool_max_idle_per_host(0)
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT);
        if let Some(ca_file) = &config.ca_file {
            if issuer.scheme() != "https" {
                return Err(format!(
                    "{place}.ca_file: applies only to an https:// issuer"
                ));
            }
            let certificates = crate::outbound::read_ca_file(&base_dir.join(ca_file))
                .map_err(|e| format!("{place}.{e}"))?;
            http = http.tls_certs_only(certificates);
        }
        Ok(Oidc {
            config: config.clone(),
            client_secret,
            http: http
                .build()
                .map_err(|e| format!("{place}: cannot build the HTTP client: {e}"))?,
            provider: tokio::sync::OnceCell::new(),
            make_id_token_check,
            roles: Roles::new(roles)?,
            sessions: ConsoleSessions::new(config.session_idle_secs, config.session_max_secs),
            starts: StartBudget::default(),
        })
    }

    pub fn config(&self) -> &OidcConfig {
        &self.config
    }

    /// The provider as discovered; fetched at the first need, and again after a failure.
    async fn provider(&self) -> Result<&Provider, SignInError> {
        self.provider.get_or_try_init(|| self.discover()).await
    }

    async fn discover(&self) -> Result<Provider, SignInError> {
        let url = format!(
            "{}/.well-known/openid-configuration",
            self.config.issuer.trim_end_matches('/')
        );
        let document = self.fetch_json(self.http.get(&url), "discovery").await?;
        let discovery: Discovery = serde_json::from_value(document).map_err(|e| {
            SignInError::provider(format!("the provider's discovery document: {e}"))
        })?;
        // OpenID Connect Discovery 4.3: the document must name the issuer it was fetched for.
        if discovery.issuer != self.config.issuer {
            return Err(SignInError::provider(format!(
                "the provider's discovery document names issuer {:?}, not {:?}",
                discovery.issuer, self.config.issuer
            )));
        }
        let endpoints = [
            Some(&discovery.authorization_endpoint),
            Some(&discovery.token_endpoint),
            Some(&discovery.jwks_uri),
            discovery.userinfo_endpoint.as_ref(),
            discovery.device_authorization_endpoint.as_ref(),
        ];
        for endpoint in endpoints.into_iter().flatten() {
            provider_url(endpoint).map_err(|e| {
                SignInError::provider(format!("the provider's discovery document: {e}"))
            })?;
        }
        let id_tokens = (self.make_id_token_check)(&discovery.jwks_uri)
            .map_err(|e| SignInError::provider(format!("the provider's key set: {e}")))?;
        Ok(Provider {
            discovery,
            id_tokens,
        })
    }

    /// Starts a sign-in: a new `state`, `nonce` and PKCE verifier, for the caller to keep in the store
    /// (so that the callback may reach any replica), and where to send the browser.
    pub async fn begin(&self, redirect_uri: &str, now_ms: i64) -> Result<Begun, SignInError> {
        let provider = self.provider().await?;
        let secret = || random_secret().map_err(SignInError::provider);
        let attempt = SignInAttempt {
            state: secret()?,
            nonce: secret()?,
            pkce_verifier: secret()?,
            redirect_uri: redirect_uri.to_owned(),
            created_at_ms: now_ms,
        };
        let mut url = Url::parse(&provider.discovery.authorization_endpoint)
            .map_err(|e| SignInError::provider(e.to_string()))?;
        url.query_pairs_mut()
            .append_pair("response_type", "code")
            .append_pair("client_id", &self.config.client_id)
            .append_pair("redirect_uri", redirect_uri)
            .append_pair("scope", &self.config.scopes.join(" "))
            .append_pair("state", &attempt.state)
            .append_pair("nonce", &attempt.nonce)
            .append_pair(
                "code_challenge",
                &sha256_base64url(attempt.pkce_verifier.as_bytes()),
            )
            .append_pair("code_challenge_method", "S256");
        Ok(Begun {
            authorization_url: url.into(),
            attempt,
        })
    }

    /// Finishes a sign-in at the callback: `attempt` is what the store held under the callback's
    /// `state` (taken, so that a state is good once), which must be the state this browser started
    /// (`browser_state`, from its cookie); then the code is exchanged and the ID token verified.
    pub async fn finish(
        &self,
        attempt: Option<SignInAttempt>,
        callback: &Callback,
        browser_state: Option<&str>,
        now_ms: i64,
    ) -> Result<Person, SignInError> {
        let state = callback.state.as_deref().ok_or_else(|| {
            SignInError::refused("the answer from the identity provider has no state")
        })?;
        // RFC 9207: an answer that names another issuer comes from a provider mixed up with ours.
        if callback
            .iss
            .as_ref()
            .is_some_and(|iss| *iss != self.config.issuer)
        {
            return Err(SignInError::refused(
                "the answer names another issuer than operator_auth.oidc.issuer",
            ));
        }
        if let Some(error) = &callback.error {
            return Err(SignInError::refused(format!(
                "the identity provider refused the sign-in: {error}{}",
                callback
                    .error_description
                    .as_deref()
                    .map(|d| format!(" ({d})"))
                    .unwrap_or_default()
            )));
        }
        let attempt = attempt.ok_or_else(|| {
            SignInError::refused(
                "the state is unknown or was used already: start the sign-in again",
            )
        })?;
        if browser_state != Some(state) {
            return Err(SignInError::refused(
                "this browser did not start that sign-in (its sign-in cookie is missing or differs)",
            ));
        }
        if now_ms - attempt.created_at_ms > SIGN_IN_TTL_MS {
            return Err(SignInError::refused(
                "the sign-in took longer than 10 minutes: start it again",
            ));
        }
        let code = callback.code.as_deref().ok_or_else(|| {
            SignInError::refused("the answer from the identity provider has no code")
        })?;
        let form = [
            ("grant_type", "authorization_code"),
            ("code", code),
            ("redirect_uri", &attempt.redirect_uri),
            ("code_verifier", &attempt.pkce_verifier),
        ];
        let tokens = self.token_request(&form).await?;
        self.person(&tokens, Some(&attempt.nonce), now_ms).await
    }

    /// Starts a device authorization at the provider with the gateway's client (RFC 8628 section 3.1).
    pub async fn device_start(&self) -> Result<DeviceStart, SignInError> {
        let provider = self.provider().await?;
        let endpoint = provider
            .discovery
            .device_authorization_endpoint
            .as_deref()
            .ok_or_else(|| {
                SignInError::refused(
                    "the identity provider offers no device authorization (no \
                     device_authorization_endpoint in its discovery document)",
                )
            })?;
        let scope = self.config.scopes.join(" ");
        let request = self.authenticated(self.http.post(endpoint), &[("scope", &scope)]);
        let answer = self.fetch_json(request, "device authorization").await?;
        serde_json::from_value(answer).map_err(|e| {
            SignInError::provider(format!("the provider's device authorization answer: {e}"))
        })
    }

    /// Asks the provider whether the person approved the device authorization (RFC 8628 section 3.4).
    pub async fn device_poll(
        &self,
        device_code: &str,
        now_ms: i64,
    ) -> Result<DevicePoll, SignInError> {
        let form = [
            ("grant_type", "urn:ietf:params:oauth:grant-type:device_code"),
            ("device_code", device_code),
        ];
        match self.token_request(&form).await {
            Ok(tokens) => Ok(DevicePoll::Approved(
                self.person(&tokens, None, now_ms).await?,
            )),
            Err(TokenRequestError::Oauth(code, _)) if code == "authorization_pending" => {
                Ok(DevicePoll::Pending { slow_down: false })
            }
            Err(TokenRequestError::Oauth(code, _)) if code == "slow_down" => {
                Ok(DevicePoll::Pending { slow_down: true })
            }
            Err(other) => Err(other.into()),
        }
    }

    /// The person of a token answer: the ID token verified, then their groups.
    async fn person(
        &self,
        tokens: &Map<String, Value>,
        nonce: Option<&str>,
        now_ms: i64,
    ) -> Result<Person, SignInError> {
        let provider = self.provider().await?;
        let id_token = tokens
            .get("id_token")
            .and_then(Value::as_str)
            .ok_or_else(|| SignInError::refused("the provider's token answer holds no id_token"))?;
        let claims = provider
            .id_tokens
            .check(id_token, nonce, now_ms.div_euclid(1000))
            .await
            .map_err(|e| SignInError::refused(format!("the ID token is refused: {e}")))?;
        let sub = text_claim(&claims, "sub")
            .ok_or_else(|| SignInError::refused("the ID token has no sub"))?;
        let groups = match claims.get(&self.config.groups_claim) {
            Some(value) => groups_of(value, &self.config.groups_claim)?,
            None => self.userinfo_groups(provider, tokens, &sub).await?,
        };
        let name = ["name", "email", "preferred_username"]
            .iter()
            .find_map(|claim| text_claim(&claims, claim));
        Ok(Person {
            iss: self.config.issuer.clone(),
            sub,
            name,
            groups,
        })
    }

    /// The groups from the userinfo endpoint, when the ID token does not carry them; none when the
    /// provider has no such endpoint or does not say.
    async fn userinfo_groups(
        &self,
        provider: &Provider,
        tokens: &Map<String, Value>,
        sub: &str,
    ) -> Result<Vec<String>, SignInError> {
        let (Some(endpoint), Some(access_token)) = (
            provider.discovery.userinfo_endpoint.as_deref(),
            tokens.get("access_token").and_then(Value::as_str),
        ) else {
            return Ok(Vec::new());
        };
        let info = self
            .fetch_json(
                self.http.get(endpoint).bearer_auth(access_token),
                "userinfo",
            )
            .await?;
        // OpenID Connect Core 5.3.2: an answer about someone else must not be used.
        if info.get("sub").and_then(Value::as_str) != Some(sub) {
            return Err(SignInError::refused(
                "the userinfo answer is about another subject than the ID token",
            ));
        }
        match info.get(&self.config.groups_claim) {
            Some(value) => groups_of(value, &self.config.groups_claim),
            None => Ok(Vec::new()),
        }
    }

    /// A request to the token endpoint with the client's authentication.
    async fn token_request(
        &self,
        form: &[(&str, &str)],
    ) -> Result<Map<String, Value>, TokenRequestError> {
        let provider = self.provider().await.map_err(TokenRequestError::Other)?;
        let request = self.authenticated(self.http.post(&provider.discovery.token_endpoint), form);
        let response = request
            .send()
            .await
            .map_err(|e| TokenRequestError::Other(unreachable("token endpoint", e)))?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = read_answer(response, "token endpoint")
            .await
            .map_err(TokenRequestError::Other)?;
        let json: Option<Map<String, Value>> = serde_json::from_slice(&body).ok();
        if status.is_success() {
            return json.ok_or_else(|| {
                TokenRequestError::Other(SignInError::provider(
                    "the token endpoint answered something that is not a JSON object",
                ))
            });
        }
        match json.as_ref().and_then(|j| text_claim(j, "error")) {
            Some(code) => {
                let description = json
                    .as_ref()
                    .and_then(|j| text_claim(j, "error_description"));
                Err(TokenRequestError::Oauth(code, description))
            }
            None => Err(TokenRequestError::Other(SignInError::provider(format!(
                "the token endpoint answered {}",
                crate::outbound::failed_status(status, &headers)
            )))),
        }
    }

    /// A form POST with the client's authentication: HTTP Basic with the secret (RFC 6749 2.3.1), or
    /// `client_id` alone for a public client.
    fn authenticated(
        &self,
        request: reqwest::RequestBuilder,
        form: &[(&str, &str)],
    ) -> reqwest::RequestBuilder {
        let mut fields: Vec<(&str, &str)> = form.to_vec();
        let request = match &self.client_secret {
            Some(secret) => request.basic_auth(
                form_encode(&self.config.client_id),
                Some(form_encode(secret)),
            ),
            None => {
                fields.push(("client_id", &self.config.client_id));
                request
            }
        };
        let body: String = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(fields)
            .finish();
        request
            .header(
                reqwest::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .header(reqwest::header::ACCEPT, "application/json")
            .body(body)
    }

    /// A GET or POST whose answer must be a JSON object.
    async fn fetch_json(
        &self,
        request: reqwest::RequestBuilder,
        what: &str,
    ) -> Result<Value, SignInError> {
        let response = request
            .header(reqwest::header::ACCEPT, "application/json")
            .send()
            .await
            .map_err(|e| unreachable(what, e))?;
        if !response.status().is_success() {
            return Err(SignInError::provider(format!(
                "the provider's {what} answered {}",
                crate::outbound::failed_status(response.status(), response.headers())
            )));
        }
        let body = read_answer(response, what).await?;
        match serde_json::from_slice::<Value>(&body) {
            Ok(value @ Value::Object(_)) => Ok(value),
            _ => Err(SignInError::provider(format!(
                "the provider's {what} answered something that is not a JSON object"
            ))),
        }
    }
}

/// A token endpoint's refusal (RFC 6749 5.2: `error` and its description), or another failure.
enum TokenRequestError {
    Oauth(String, Option<String>),
    Other(SignInError),
}

impl From<TokenRequestError> for SignInError {
    fn from(err: TokenRequestError) -> SignInError {
        match err {
            // invalid_grant: a code used already, expired, or not issued for this redirect and verifier.
            TokenRequestError::Oauth(code, description) => SignInError::refused(format!(
                "the identity provider refused the code: {code}{}",
                description.map(|d| format!(" ({d})")).unwrap_or_default()
            )),
            TokenRequestError::Other(err) => err,
        }
    }
}

/// The callback address for a console at `console_base_url` (`https://gw.example/console`, as the
/// approvals' links use it; a base without the `/console` path is taken as the gateway's own).
pub fn callback_on(console_base_url: &str) -> String {
    let base = console_base_url.trim_end_matches('/');
    match base.strip_suffix("/console") {
        Some(gateway) => format!("{gateway}/console/callback"),
        None => format!("{base}/console/callback"),
    }
}

/// An issuer or endpoint URL: `https://`, or `http://` on a loopback host only, where nobody else can
/// answer.
fn provider_url(raw: &str) -> Result<Url, String> {
    let url = Url::parse(raw).map_err(|e| format!("{raw:?} is not a URL: {e}"))?;
    crate::outbound::https_or_loopback(&url)
        .map_err(|why| format!("{}: {why}", crate::redact::url(raw)))?;
    Ok(url)
}

fn read_secret(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let secret = text.trim();
    if secret.is_empty() {
        return Err(format!("{} is empty", path.display()));
    }
    Ok(secret.to_owned())
}

/// RFC 6749 2.3.1: the client id and secret are form-encoded before they go into HTTP Basic.
fn form_encode(text: &str) -> String {
    url::form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

fn text_claim(claims: &Map<String, Value>, name: &str) -> Option<String> {
    claims
        .get(name)
        .and_then(Value::as_str)
        .filter(|text| !text.is_empty())
        .map(str::to_owned)
}

/// A groups claim: an array of strings (a lone string is one group).
fn groups_of(value: &Value, claim: &str) -> Result<Vec<String>, SignInError> {
    match value {
        Value::String(group) => Ok(vec![group.clone()]),
        Value::Array(items) => items
            .iter()
            .map(|item| item.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                SignInError::refused(format!(
                    "the {claim} claim holds something that is not a string"
                ))
            }),
        _ => Err(SignInError::refused(format!(
            "the {claim} claim is not a list of group names"
        ))),
    }
}

fn unreachable(what: &str, err: reqwest::Error) -> SignInError {
    SignInError::provider(format!(
        "the provider's {what} could not be reached: {}",
        crate::redact::url(&crate::tls::client::failure(&err.without_url()))
    ))
}

async fn read_answer(response: reqwest::Response, what: &str) -> Result<Vec<u8>, SignInError> {
    read_capped(response, MAX_ANSWER_BYTES)
        .await
        .map_err(|err| match err {
            CappedReadError::TooLarge => SignInError::provider(format!(
                "the provider's {what} answer is over {MAX_ANSWER_BYTES} bytes"
            )),
            CappedReadError::Body(e) => unreachable(what, e),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(issuer: &str) -> OidcConfig {
        serde_json::from_value(serde_json::json!({"issuer": issuer, "client_id": "console"}))
            .unwrap()
    }

    fn no_check() -> MakeIdTokenCheck {
        Box::new(|_| Err("not in this test".into()))
    }

    #[test]
    fn the_defaults_are_the_specs_and_unknown_fields_are_refused() {
        let cfg = config("https://idp.example.com");
        assert_eq!(cfg.scopes, ["openid", "profile", "email"]);
        assert_eq!(cfg.groups_claim, "groups");
        assert_eq!(
            (cfg.session_idle_secs, cfg.session_max_secs),
            (1800, 43_200)
        );
        assert!(serde_json::from_value::<OidcConfig>(
            serde_json::json!({"issuer": "https://i", "client_id": "c", "client_secret": "s"})
        )
        .is_err());
    }

    #[test]
    fn an_http_issuer_is_accepted_on_loopback_only() {
        for good in [
            "https://idp.example.com",
            "http://127.0.0.1:8080",
            "http://localhost:1",
        ] {
            assert!(
                Oidc::new(&config(good), &[], Path::new("/"), no_check()).is_ok(),
                "{good}"
            );
        }
        for bad in [
            "http://idp.example.com",
            "http://10.0.0.1",
            "ftp://idp",
            "not a url",
        ] {
            let err = Oidc::new(&config(bad), &[], Path::new("/"), no_check())
                .err()
                .unwrap();
            assert!(
                err.starts_with("operator_auth.oidc.issuer: "),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn a_missing_secret_file_or_an_openid_less_scope_list_is_refused_by_key() {
        let mut cfg = config("https://idp.example.com");
        cfg.client_secret_file = Some("/nonexistent/secret".into());
        let err = Oidc::new(&cfg, &[], Path::new("/"), no_check())
            .err()
            .unwrap();
        assert!(
            err.starts_with("operator_auth.oidc.client_secret_file: "),
            "{err}"
        );
        let mut cfg = config("https://idp.example.com");
        cfg.scopes = vec!["profile".into()];
        let err = Oidc::new(&cfg, &[], Path::new("/"), no_check())
            .err()
            .unwrap();
        assert!(err.starts_with("operator_auth.oidc.scopes: "), "{err}");
    }

    #[test]
    fn the_callback_is_beside_the_console_whether_or_not_the_base_names_it() {
        for base in [
            "https://gw.example/console",
            "https://gw.example/console/",
            "https://gw.example",
            "https://gw.example/",
        ] {
            assert_eq!(
                callback_on(base),
                "https://gw.example/console/callback",
                "{base}"
            );
        }
        assert_eq!(
            callback_on("https://corp.example/sealgate/console"),
            "https://corp.example/sealgate/console/callback"
        );
    }

    #[test]
    fn groups_are_a_list_of_strings() {
        assert_eq!(
            groups_of(&serde_json::json!(["a", "b"]), "groups").unwrap(),
            ["a", "b"]
        );
        assert_eq!(groups_of(&serde_json::json!("a"), "groups").unwrap(), ["a"]);
        assert!(groups_of(&serde_json::json!([1]), "groups").is_err());
        assert!(groups_of(&serde_json::json!({"a": 1}), "groups").is_err());
    }
}
