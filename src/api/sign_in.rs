//! Sign-in with the organisation's identity provider (SPEC 16): `/console/login` and `/console/callback`
//! for a browser, `/console/device` for `sealgate login`, `/console/session` and `/console/logout`; and
//! the console session as a credential of the control API (the cookie, with its CSRF token on every
//! change, or the bearer identifier that `sealgate login` keeps).

use std::sync::Arc;

use axum::extract::{FromRef, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::{AppState, ControlBody};
use crate::config::Config;
use crate::error::{ApiError, Code};
use crate::identity::console_session::{
    id_hash, looks_like_session_id, used, ConsoleSessionRecord, Started, Use, COOKIE_NAME,
};
use crate::identity::oidc::{Callback, DevicePoll, DeviceStart, SignInError, SIGN_IN_TTL_MS};
use crate::identity::{Caller, Identity, Oidc, Person, Via};
use crate::store::Store;

/// Binds a sign-in's `state` to the browser that started it, so that nobody can make a person's browser
/// finish a sign-in started elsewhere (login CSRF). `SameSite=Lax`: it must come back with the
/// provider's cross-site redirect to the callback.
const LOGIN_COOKIE: &str = "__Host-sealgate-login";
/// The header that a change made with the session cookie must carry (SPEC 16).
pub const CSRF_HEADER: &str = "x-csrf-token";

/// What sign-in works with: the provider (None when sign-in is not configured), the store that keeps
/// sign-ins and console sessions, and the configuration that says how browsers reach the gateway.
#[derive(Clone)]
pub struct SignIn {
    oidc: Option<Arc<Oidc>>,
    store: Arc<dyn Store>,
    config: Arc<Config>,
}

impl FromRef<AppState> for SignIn {
    fn from_ref(state: &AppState) -> Self {
        SignIn {
            oidc: FromRef::from_ref(state),
            store: FromRef::from_ref(state),
            config: FromRef::from_ref(state),
        }
    }
}

impl SignIn {
    /// The caller of a request that presents a console session (see [`presented_session`]); None when
    /// it presents none.
    pub async fn session_caller(
        &self,
        parts: &Parts,
        bearer: Option<&str>,
    ) -> Result<Option<Caller>, ApiError> {
        let Some(session) = presented_session(parts, self, bearer).await? else {
            return Ok(None);
        };
        // A session exists only where sign-in is configured.
        let oidc = self.oidc.as_deref().ok_or_else(|| {
            ApiError::new(Code::OperatorUnauthenticated, "sign-in is not configured")
        })?;
        session
            .caller(oidc, &parts.method, &parts.headers)
            .map(Some)
    }
}

/// A console session found for a request, and how it was presented.
pub struct Presented {
    pub id: String,
    pub record: ConsoleSessionRecord,
    pub by_cookie: bool,
}

/// The console session of a request: `Authorization: Bearer ID` (from `sealgate login`), else the
/// `__Host-sealgate` cookie. None when neither is presented; 401 (6001) when one is presented and names
/// no live session. `bearer` is the request's bearer credential when it has one.
async fn presented_session(
    parts: &Parts,
    sign_in: &SignIn,
    bearer: Option<&str>,
) -> Result<Option<Presented>, ApiError> {
    let (id, by_cookie) = match bearer {
        Some(credential) if looks_like_session_id(credential) => (credential.to_owned(), false),
        Some(_) => return Ok(None),
        None => match cookie(&parts.headers, COOKIE_NAME) {
            Some(id) => (id, true),
            None => return Ok(None),
        },
    };
    let ended = || {
        ApiError::new(
            Code::OperatorUnauthenticated,
            "the console session is unknown, ended or expired: sign in again",
        )
    };
    if sign_in.oidc.is_none() {
        return Err(ended());
    }
    let stored = sign_in
        .store
        .console_session_get(&id_hash(&id))
        .await
        .map_err(ApiError::store)?;
    let record = match stored.map(|record| used(record, crate::clock::now_millis())) {
        None | Some(Use::Ended) => return Err(ended()),
        Some(Use::Live(record)) => record,
        Some(Use::Touched(record)) => {
            sign_in
                .store
                .console_session_touch(&record)
                .await
                .map_err(ApiError::store)?;
            record
        }
    };
    Ok(Some(Presented {
        id,
        record,
        by_cookie,
    }))
}

impl Presented {
    /// The caller: the person, vouched for by the provider, with the scopes of their roles now. A change
    /// made with the cookie must carry the session's CSRF token, else 403 (6002).
    pub fn caller(
        &self,
        oidc: &Oidc,
        method: &Method,
        headers: &HeaderMap,
    ) -> Result<Caller, ApiError> {
        let reads = matches!(*method, Method::GET | Method::HEAD);
        if self.by_cookie && !reads {
            let sent = headers.get(CSRF_HEADER).map(|v| v.as_bytes());
            // Compared by their hashes, so that the time taken says nothing of how much matched.
            let digest = crate::envelope::sha256_hex;
            if sent.map(digest) != Some(digest(self.record.csrf_token.as_bytes())) {
                return Err(ApiError::new(
                    Code::OperatorForbidden,
                    "a change made with the console session cookie needs the header X-CSRF-Token \
                     with the csrf_token of GET /console/session",
                ));
            }
        }
        Ok(Caller {
            identity: Identity {
                iss: self.record.iss.clone(),
                sub: self.record.sub.clone(),
                name: self.record.name.clone(),
                via: Via::Oidc,
            },
            scopes: oidc.roles.scopes_of(&self.record.groups),
        })
    }
}

/// `GET /console/login`: starts a sign-in and sends the browser to the provider.
pub async fn login(State(sign_in): State<SignIn>, headers: HeaderMap) -> Response {
    let Some(oidc) = &sign_in.oidc else {
        return not_configured();
    };
    if !oidc.starts.take() {
        return too_many_starts();
    }
    let Some(redirect_uri) = redirect_uri(&sign_in, &headers) else {
        return page(
            StatusCode::BAD_REQUEST,
            "Sign-in failed",
            "the request has no Host header to build the callback address from; set \
             approvals.console_base_url",
        );
    };
    let now = crate::clock::now_millis();
    let begun = match oidc.begin(&redirect_uri, now).await {
        Ok(begun) => begun,
        Err(err) => return failed(&sign_in, err),
    };
    // Kept in the store, so that the callback may reach any replica.
    match sign_in
        .store
        .sign_in_insert(&begun.attempt, now - SIGN_IN_TTL_MS)
        .await
    {
        Ok(()) => {
            let mut response = (
                StatusCode::SEE_OTHER,
                [(header::LOCATION, begun.authorization_url)],
            )
                .into_response();
            let cookie = set_cookie(&sign_in, LOGIN_COOKIE, &begun.attempt.state, "Lax", 600);
            response.headers_mut().append(header::SET_COOKIE, cookie);
            no_store(response)
        }
        Err(err) => failed(&sign_in, SignInError::provider(format!("the store: {err}"))),
    }
}

/// `GET /console/callback`: finishes a sign-in. Any failure ends on a page that says what failed, with
/// no session and no session cookie.
pub async fn callback(
    State(sign_in): State<SignIn>,
    headers: HeaderMap,
    uri: axum::http::Uri,
) -> Response {
    let Some(oidc) = &sign_in.oidc else {
        return not_configured();
    };
    let callback = Callback::from_query(uri.query().unwrap_or(""));
    let browser_state = cookie(&headers, LOGIN_COOKIE);
    let now = crate::clock::now_millis();
    // Taken before anything else is checked: a state is good once, whatever follows.
    let attempt = match &callback.state {
        Some(state) => match sign_in.store.sign_in_take(state).await {
            Ok(attempt) => attempt,
            Err(err) => {
                return failed(&sign_in, SignInError::provider(format!("the store: {err}")))
            }
        },
        None => None,
    };
    let person = match oidc
        .finish(attempt, &callback, browser_state.as_deref(), now)
        .await
    {
        Ok(person) => person,
        Err(mut err) => {
            if browser_state.is_none() && !sign_in.config.browsers_use_https() {
                err.message.push_str(
                    " (this gateway is reached over plain HTTP, where browsers refuse its __Host- \
                     cookies: serve HTTPS, or set approvals.console_base_url to its https:// address)",
                );
            }
            return failed(&sign_in, err);
        }
    };
    let started = match start_session(&sign_in, oidc, &person, now).await {
        Ok(started) => started,
        Err(err) => return failed(&sign_in, SignInError::provider(err.message)),
    };
    let mut response = page(
        StatusCode::OK,
        "Signed in",
        &format!(
            "signed in as {}. Continue to the console.",
            shown_name(&person)
        ),
    );
    let headers = response.headers_mut();
    // The console loads from this same-site page, so that its SameSite=Strict cookie goes along.
    headers.insert(
        "refresh",
        HeaderValue::from_static("0; url=/console/#signed-in"),
    );
    headers.append(
        header::SET_COOKIE,
        set_cookie(
            &sign_in,
            COOKIE_NAME,
            &started.id,
            "Strict",
            oidc.sessions.max_secs(),
        ),
    );
    // The sign-in's state is used up: its cookie goes too.
    headers.append(
        header::SET_COOKIE,
        set_cookie(&sign_in, LOGIN_COOKIE, "", "Lax", 0),
    );
    response
}

/// A new console session for `person`, kept in the store (which forgets those that ended).
async fn start_session(
    sign_in: &SignIn,
    oidc: &Oidc,
    person: &Person,
    now_ms: i64,
) -> Result<Started, ApiError> {
    let started = oidc
        .sessions
        .start(person, now_ms)
        .map_err(ApiError::store)?;
    sign_in
        .store
        .console_session_insert(&started.record, now_ms)
        .await
        .map_err(ApiError::store)?;
    Ok(started)
}

fn shown_name(person: &Person) -> String {
    match &person.name {
        Some(name) => format!("{name} ({})", person.sub),
        None => person.sub.clone(),
    }
}

/// `GET /console/session`: who is signed in.
#[derive(Serialize, utoipa::ToSchema)]
pub struct SessionInfo {
    iss: String,
    sub: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    via: Via,
    /// Scopes per team (`*`: every team).
    scopes: std::collections::BTreeMap<String, Vec<String>>,
    /// The value of `X-CSRF-Token` on every change made with the session cookie.
    csrf_token: String,
    /// When the session ends at the latest (RFC 3339).
    expires_at: String,
}

/// The person signed in to the console, their scopes per team, and the session's CSRF token.
#[utoipa::path(get, path = "/console/session", tag = "sign-in",
    responses(
        (status = 200, description = "The person signed in", body = SessionInfo),
        (status = 401, description = "No console session (6001)", body = crate::api::openapi::ErrorBody)))]
pub async fn session(State(sign_in): State<SignIn>, parts: Parts) -> Result<Response, ApiError> {
    let presented = require_session(&sign_in, &parts).await?;
    let oidc = sign_in.oidc.as_deref().ok_or_else(no_session)?;
    let caller = presented.caller(oidc, &Method::GET, &parts.headers)?;
    let info = SessionInfo {
        iss: caller.identity.iss,
        sub: caller.identity.sub,
        name: caller.identity.name,
        via: Via::Oidc,
        scopes: caller.scopes.by_team(),
        csrf_token: presented.record.csrf_token.clone(),
        expires_at: crate::clock::rfc3339_millis(presented.record.expires_at_ms),
    };
    Ok(no_store(Json(info).into_response()))
}

/// Ends the console session (the cookie's, with `X-CSRF-Token`; or the bearer identifier's).
#[utoipa::path(post, path = "/console/logout", tag = "sign-in",
    responses(
        (status = 204, description = "Signed out; the cookie is cleared"),
        (status = 401, description = "No console session (6001)", body = crate::api::openapi::ErrorBody),
        (status = 403, description = "The cookie without its CSRF token (6002)", body = crate::api::openapi::ErrorBody)))]
pub async fn logout(State(sign_in): State<SignIn>, parts: Parts) -> Result<Response, ApiError> {
    let presented = require_session(&sign_in, &parts).await?;
    let oidc = sign_in.oidc.as_deref().ok_or_else(no_session)?;
    presented.caller(oidc, &parts.method, &parts.headers)?;
    sign_in
        .store
        .console_session_delete(&id_hash(&presented.id))
        .await
        .map_err(ApiError::store)?;
    let mut response = StatusCode::NO_CONTENT.into_response();
    response.headers_mut().append(
        header::SET_COOKIE,
        set_cookie(&sign_in, COOKIE_NAME, "", "Strict", 0),
    );
    Ok(response)
}

async fn require_session(sign_in: &SignIn, parts: &Parts) -> Result<Presented, ApiError> {
    let bearer = super::bearer_credential(parts)?;
    presented_session(parts, sign_in, bearer)
        .await?
        .ok_or_else(no_session)
}

fn no_session() -> ApiError {
    ApiError::new(
        Code::OperatorUnauthenticated,
        "no console session: sign in at /console/login or with sealgate login",
    )
}

/// Starts a device authorization (RFC 8628) at the provider with the gateway's client, for `sealgate
/// login`: the person opens `verification_uri` and enters `user_code`.
#[utoipa::path(post, path = "/console/device", tag = "sign-in",
    responses(
        (status = 200, description = "A device authorization started", body = DeviceStart),
        (status = 404, description = "Sign-in is not configured (6003)", body = crate::api::openapi::ErrorBody),
        (status = 502, description = "The identity provider failed or offers no device flow (5001)", body = crate::api::openapi::ErrorBody),
        (status = 503, description = "Too many sign-ins are starting at once (5006)", body = crate::api::openapi::ErrorBody)))]
pub async fn device_start(State(sign_in): State<SignIn>) -> Result<Json<DeviceStart>, ApiError> {
    let oidc = configured(&sign_in)?;
    if !oidc.starts.take() {
        return Err(ApiError::new(
            Code::GatewayOverloaded,
            "too many sign-ins are starting at once: try again in a few seconds",
        ));
    }
    oidc.device_start().await.map(Json).map_err(provider_error)
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DevicePollRequest {
    /// The `device_code` of `POST /console/device`.
    device_code: String,
}

/// What a poll of a device authorization answers.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum DevicePollAnswer {
    /// Not approved yet: ask again after `interval` seconds.
    Pending { interval: u64 },
    /// Approved: `credential` is a console session identifier, sent as `Authorization: Bearer` on the
    /// control API; it ends like any console session.
    SignedIn {
        credential: String,
        iss: String,
        sub: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        expires_at: String,
    },
}

/// Asks whether the person approved the device authorization; once they have, verifies the ID token
/// and answers a new console session's identifier.
#[utoipa::path(post, path = "/console/device/token", tag = "sign-in",
    request_body = DevicePollRequest,
    responses(
        (status = 200, description = "Pending, or signed in", body = DevicePollAnswer),
        (status = 401, description = "Refused: denied, expired, or a bad ID token (6001)", body = crate::api::openapi::ErrorBody),
        (status = 404, description = "Sign-in is not configured (6003)", body = crate::api::openapi::ErrorBody),
        (status = 422, description = "Not a poll request (6005)", body = crate::api::openapi::ErrorBody)))]
pub async fn device_poll(
    State(sign_in): State<SignIn>,
    ControlBody(body): ControlBody,
) -> Result<Response, ApiError> {
    let oidc = configured(&sign_in)?;
    let request: DevicePollRequest = super::json_body(&body)?;
    let now = crate::clock::now_millis();
    let answer = match oidc.device_poll(&request.device_code, now).await {
        Ok(DevicePoll::Pending { slow_down }) => DevicePollAnswer::Pending {
            interval: if slow_down { 10 } else { 5 },
        },
        Ok(DevicePoll::Approved(person)) => {
            let started = start_session(&sign_in, oidc, &person, now).await?;
            DevicePollAnswer::SignedIn {
                credential: started.id,
                iss: person.iss,
                sub: person.sub,
                name: person.name,
                expires_at: crate::clock::rfc3339_millis(started.record.expires_at_ms),
            }
        }
        Err(err) => return Err(provider_error(err)),
    };
    Ok(no_store(Json(answer).into_response()))
}

fn configured(sign_in: &SignIn) -> Result<&Oidc, ApiError> {
    sign_in.oidc.as_deref().ok_or_else(|| {
        ApiError::new(
            Code::NotFound,
            "sign-in is not configured on this gateway (operator_auth.oidc)",
        )
    })
}

fn provider_error(err: SignInError) -> ApiError {
    if err.provider_failed {
        ApiError::new(Code::UpstreamUnavailable, err.message)
    } else {
        ApiError::new(Code::OperatorUnauthenticated, err.message)
    }
}

/// The callback address: on `approvals.console_base_url` when set, else on the request's own origin.
fn redirect_uri(sign_in: &SignIn, headers: &HeaderMap) -> Option<String> {
    if let Some(base) = &sign_in.config.approvals.console_base_url {
        return Some(crate::identity::oidc::callback_on(base));
    }
    let host = headers.get(header::HOST)?.to_str().ok()?;
    let scheme = if sign_in.config.tls.cert_file.is_some() {
        "https"
    } else {
        "http"
    };
    Some(format!("{scheme}://{host}/console/callback"))
}

/// A cookie of the gateway: `HttpOnly`, `Path=/`, no `Domain`; `Secure` when browsers reach the gateway
/// over HTTPS (see [`crate::config::Config::browsers_use_https`]).
fn set_cookie(
    sign_in: &SignIn,
    name: &str,
    value: &str,
    same_site: &str,
    max_age: i64,
) -> HeaderValue {
    let secure = if sign_in.config.browsers_use_https() {
        "; Secure"
    } else {
        ""
    };
    let text = format!(
        "{name}={value}; HttpOnly; SameSite={same_site}; Path=/; Max-Age={max_age}{secure}"
    );
    // Names and values are ours (base64url), so the header is always valid.
    HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// The value of cookie `name` in the request's `Cookie` headers.
fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|line| line.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.to_owned())
        .filter(|value| !value.is_empty())
}

fn failed(sign_in: &SignIn, err: SignInError) -> Response {
    let status = if err.provider_failed {
        StatusCode::BAD_GATEWAY
    } else {
        StatusCode::BAD_REQUEST
    };
    let mut response = page(status, "Sign-in failed", &err.message);
    response.headers_mut().append(
        header::SET_COOKIE,
        set_cookie(sign_in, LOGIN_COOKIE, "", "Lax", 0),
    );
    response
}

/// 503 with `Retry-After`: the budget of sign-in starts is spent for now.
fn too_many_starts() -> Response {
    let mut response = page(
        StatusCode::SERVICE_UNAVAILABLE,
        "Sign-in is busy",
        "too many sign-ins are starting at once: try again in a few seconds",
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("2"));
    response
}

fn not_configured() -> Response {
    page(
        StatusCode::NOT_FOUND,
        "Sign-in is not configured",
        "this gateway has no operator_auth.oidc: paste an operator token in the console instead",
    )
}

/// A small HTML page that says what happened; nothing on it runs.
fn page(status: StatusCode, title: &str, message: &str) -> Response {
    let body = format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title></head>\
         <body><h1>{title}</h1><p id=\"message\">{}</p><p><a href=\"/console/\">The console</a> · \
         <a href=\"/console/login\">Sign in again</a></p></body></html>",
        html_escape(message)
    );
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; frame-ancestors 'none'"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    no_store(response)
}

fn no_store(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn html_escape(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '&' => "&amp;".to_owned(),
            '<' => "&lt;".to_owned(),
            '>' => "&gt;".to_owned(),
            '"' => "&quot;".to_owned(),
            '\'' => "&#39;".to_owned(),
            c => c.to_string(),
        })
        .collect()
}

/// The sign-in routes that are not in the OpenAPI document (browser redirects and HTML pages).
pub fn browser_routes() -> axum::Router<AppState> {
    axum::Router::new()
        .route("/console/login", axum::routing::get(login))
        .route("/console/callback", axum::routing::get(callback))
}
