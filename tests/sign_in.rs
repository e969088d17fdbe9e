//! Sign-in with the organisation's identity provider (SPEC 16), through the real binary and a real
//! OpenID provider (`oidc-provider`, tests/oidc): the console session cookie, its CSRF token, logout,
//! roles from groups, a session shared by replicas, and every refusal — each of which leaves no session
//! and no cookie behind. ID tokens that no honest provider issues (wrong `aud`, `alg: none`, …) come
//! from a small fake provider in this file. The same sign-in in a real browser, with two people
//! approving one payment, is in tests/console.rs (against the release build, like the console's other
//! browser tests).

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::Json;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use common::oidc::{client, user, Browser, Provider};
use common::{start_tool, write_config_with_keys, Gateway, Keys};
use reqwest::Method;
use serde_json::{json, Value};

/// The gateway's public address as the provider knows it (`approvals.console_base_url`): the test
/// browser takes a redirect there to the gateway's real port.
const PUBLIC_BASE: &str = "http://gateway.test";
const COOKIE: &str = "__Host-sealgate";
const CLIENT_SECRET: &str = "console-client-secret";

fn callback_uri() -> String {
    format!("{PUBLIC_BASE}/console/callback")
}

/// The people of the provider: ann (security: admin everywhere), pat (payments on-call), bob (in no role).
fn people() -> Vec<Value> {
    vec![
        user("ann", "ann-pw", "Ann Admin", &["security", "staff"]),
        user("pat", "pat-pw", "Pat Payments", &["payments-oncall"]),
        user("bob", "bob-pw", "Bob Nobody", &["staff"]),
    ]
}

/// `operator_auth` beyond its keys: the provider at `issuer` and the roles.
fn sign_in_yaml(issuer: &str, client_id: &str, secret_file: bool) -> String {
    let secret = if secret_file {
        ", client_secret_file: client.secret"
    } else {
        ""
    };
    format!(
        "\n  oidc: {{ issuer: {issuer:?}, client_id: {client_id}{secret}, session_idle_secs: 600 }}\
         \n  roles:\
         \n    - {{ group: security, team: \"*\", scopes: [seal.admin] }}\
         \n    - {{ group: payments-oncall, team: payments, scopes: [seal.approval.read, seal.approval.decide] }}"
    )
}

/// The configuration of a gateway (on `extra`'s store, or the test store) that signs people in with the
/// provider at `issuer`; `approvals.console_base_url` is [`PUBLIC_BASE`].
async fn config_for(
    dir: &std::path::Path,
    issuer: &str,
    client_id: &str,
    secret: bool,
    extra: &str,
) -> (std::path::PathBuf, Arc<Keys>) {
    let (_tool, tool_base) = start_tool().await;
    let keys = Arc::new(Keys::new());
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("client.secret"), format!("{CLIENT_SECRET}\n")).unwrap();
    let agent_keys = format!(
        "[ {{ alg: EdDSA, public_key_pem: {:?} }} ]",
        keys.agent_public
    );
    let operator_keys = format!(
        "[ {{ alg: EdDSA, public_key_pem: {:?} }} ]{}",
        keys.operator_public,
        sign_in_yaml(issuer, client_id, secret)
    );
    let config = write_config_with_keys(dir, &agent_keys, &operator_keys, &tool_base, "", extra);
    (config, keys)
}

/// A gateway whose callback the provider knows at [`PUBLIC_BASE`].
async fn gateway_for(
    dir: &std::path::Path,
    issuer: &str,
    client_id: &str,
    secret: bool,
    extra: &str,
) -> Gateway {
    let extra = format!("approvals: {{ console_base_url: \"{PUBLIC_BASE}/console\" }}\n{extra}");
    let (config, keys) = config_for(dir, issuer, client_id, secret, &extra).await;
    Gateway::spawn(dir, &config, keys)
}

/// The real provider with the gateway's confidential client, and a gateway using it.
async fn setup(dir: &std::path::Path) -> (Provider, Gateway) {
    let provider = Provider::start(
        vec![client("console", Some(CLIENT_SECRET), &[callback_uri()])],
        people(),
        true,
    );
    let gateway = gateway_for(dir, &provider.issuer, "console", true, "").await;
    (provider, gateway)
}

/// Drives the sign-in from `/console/login` through the provider's pages to the callback's address,
/// which is returned (on the gateway's real port) without being requested.
async fn until_callback(
    browser: &mut Browser,
    gw: &Gateway,
    login: &str,
    password: &str,
) -> String {
    let callback = browser
        .sign_in_until(
            &format!("{}/console/login", gw.base),
            login,
            password,
            PUBLIC_BASE,
        )
        .await;
    callback.replacen(PUBLIC_BASE, &gw.base, 1)
}

/// Signs `login` in and answers the console session cookie.
async fn signed_in(browser: &mut Browser, gw: &Gateway, login: &str, password: &str) -> String {
    let callback = until_callback(browser, gw, login, password).await;
    let page = browser.get(&callback).await;
    assert_eq!(page.status, 200, "{}", page.body);
    browser
        .cookies(&gw.base)
        .get(COOKIE)
        .cloned()
        .expect("the session cookie")
}

/// A control API request with the session cookie (and `X-CSRF-Token` when given).
async fn with_cookie(
    gw: &Gateway,
    method: Method,
    path: &str,
    cookie: &str,
    csrf: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = gw
        .client
        .request(method, format!("{}{path}", gw.base))
        .header("cookie", format!("{COOKIE}={cookie}"));
    if let Some(csrf) = csrf {
        request = request.header("x-csrf-token", csrf);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

fn registration(id: &str) -> Value {
    let key = sealgate::envelope::generate_signing_key().unwrap();
    json!({"session_id": id, "public_key": sealgate::envelope::public_key_b64(&key.verifying_key()),
           "security_context": "test", "expires_at": sealgate::clock::now_secs() + 600})
}

/// The sessions registered on the gateway, as an admin lists them.
async fn registered(gw: &Gateway) -> Vec<String> {
    let (status, page) = gw.admin(Method::GET, "/v1/seal/sessions", None).await;
    assert_eq!(status, 200, "{page}");
    page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session_id"].as_str().unwrap().to_owned())
        .collect()
}

/// The value of `name` in the query of `url`.
fn query_param(url: &str, name: &str) -> String {
    url::Url::parse(url)
        .unwrap()
        .query_pairs()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("{url} has no {name}"))
        .1
        .into_owned()
}

/// How many console sessions the gateway's store holds (read from the store itself).
async fn console_sessions_stored(gw: &Gateway) -> i64 {
    rows_stored(gw, "console_sessions").await
}

/// How many rows a table of the gateway's store holds (read from the store itself).
async fn rows_stored(gw: &Gateway, table: &str) -> i64 {
    let count = format!("SELECT count(*) FROM {table}");
    let config = std::fs::read_to_string(&gw.config_path).unwrap();
    let store = config
        .lines()
        .find_map(|line| line.strip_prefix("store: "))
        .map(|url| url.trim().trim_matches('"').to_owned());
    match store {
        Some(url) => {
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(connection);
            let row = client.query_one(&count, &[]).await.unwrap();
            row.get(0)
        }
        None => {
            let db = gw.dir.join("data/sealgate.db");
            let conn = rusqlite::Connection::open_with_flags(
                &db,
                rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
            )
            .unwrap();
            conn.query_row(&count, [], |row| row.get(0)).unwrap()
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_signs_in_uses_the_api_with_the_cookie_and_its_csrf_token_and_signs_out() {
    let dir = tempfile::tempdir().unwrap();
    let (provider, gw) = setup(dir.path()).await;
    let mut browser = Browser::new();

    // The login redirect: code flow with PKCE S256, state and nonce, to the configured callback.
    let login = browser.get(&format!("{}/console/login", gw.base)).await;
    assert_eq!(login.status, 303);
    let location = url::Url::parse(login.location.as_deref().unwrap()).unwrap();
    assert!(
        location.as_str().starts_with(&provider.issuer),
        "{location}"
    );
    let query: std::collections::HashMap<_, _> = location.query_pairs().into_owned().collect();
    assert_eq!(query["response_type"], "code");
    assert_eq!(query["client_id"], "console");
    assert_eq!(query["redirect_uri"], callback_uri());
    assert_eq!(query["code_challenge_method"], "S256");
    assert_eq!(query["scope"], "openid profile email");
    for param in ["state", "nonce", "code_challenge"] {
        assert!(
            query[param].len() >= 43,
            "{param} is short: {}",
            query[param]
        );
    }

    let callback = until_callback(&mut browser, &gw, "ann", "ann-pw").await;
    let page = browser.get(&callback).await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("Ann Admin"), "{}", page.body);
    assert!(
        !browser
            .cookies(&gw.base)
            .contains_key("__Host-sealgate-login"),
        "used up"
    );
    let session_cookie = browser.cookies(&gw.base)[COOKIE].clone();
    assert_eq!(session_cookie.len(), 43, "256 random bits, base64url");

    // The cookie's attributes: HttpOnly, SameSite=Strict, Path=/, no Domain; not Secure on plain http.
    let mut second = Browser::new();
    let callback = until_callback(&mut second, &gw, "ann", "ann-pw").await;
    let raw = reqwest::Client::new()
        .get(&callback)
        .header(
            "cookie",
            format!(
                "__Host-sealgate-login={}",
                second.cookies(&gw.base)["__Host-sealgate-login"]
            ),
        )
        .send()
        .await
        .unwrap();
    let set: Vec<String> = raw
        .headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect();
    let session = set
        .iter()
        .find(|c| c.starts_with("__Host-sealgate="))
        .expect("a session cookie");
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(session.contains(attribute), "{session}");
    }
    assert!(
        !session.contains("Domain") && !session.contains("Secure"),
        "{session}"
    );

    // Who is signed in.
    let (status, me) = with_cookie(
        &gw,
        Method::GET,
        "/console/session",
        &session_cookie,
        None,
        None,
    )
    .await;
    assert_eq!(status, 200, "{me}");
    assert_eq!(me["iss"], provider.issuer);
    assert_eq!(me["sub"], "ann");
    assert_eq!(me["name"], "Ann Admin");
    assert_eq!(me["via"], "oidc");
    assert_eq!(me["scopes"], json!({"*": ["seal.admin"]}));
    let csrf = me["csrf_token"].as_str().unwrap().to_owned();
    assert_ne!(csrf, session_cookie);

    // Reads need the cookie alone; a change needs the CSRF token, and without it changes nothing.
    let (status, _) = with_cookie(
        &gw,
        Method::GET,
        "/v1/seal/sessions",
        &session_cookie,
        None,
        None,
    )
    .await;
    assert_eq!(status, 200);
    for csrf_sent in [None, Some("not-the-token"), Some("")] {
        let (status, body) = with_cookie(
            &gw,
            Method::POST,
            "/v1/seal/sessions",
            &session_cookie,
            csrf_sent,
            Some(registration("by-csrf-less")),
        )
        .await;
        assert_eq!(
            (status, common::code(&body)),
            (403, 6002),
            "{csrf_sent:?}: {body}"
        );
        assert!(body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("X-CSRF-Token"));
    }
    assert!(registered(&gw).await.is_empty());
    let (status, body) = with_cookie(
        &gw,
        Method::POST,
        "/v1/seal/sessions",
        &session_cookie,
        Some(&csrf),
        Some(registration("by-ann")),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(registered(&gw).await, ["by-ann"]);

    // Logout needs the CSRF token too; then the cookie is worth nothing.
    let (status, _) = with_cookie(
        &gw,
        Method::POST,
        "/console/logout",
        &session_cookie,
        None,
        None,
    )
    .await;
    assert_eq!(status, 403);
    let stored = console_sessions_stored(&gw).await;
    let response = gw
        .client
        .post(format!("{}/console/logout", gw.base))
        .header("cookie", format!("{COOKIE}={session_cookie}"))
        .header("x-csrf-token", &csrf)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 204);
    let cleared = response.headers()["set-cookie"].to_str().unwrap();
    assert!(
        cleared.starts_with("__Host-sealgate=;") && cleared.contains("Max-Age=0"),
        "{cleared}"
    );
    assert_eq!(console_sessions_stored(&gw).await, stored - 1);
    for path in ["/console/session", "/v1/seal/sessions"] {
        let (status, body) = with_cookie(&gw, Method::GET, path, &session_cookie, None, None).await;
        assert_eq!((status, common::code(&body)), (401, 6001), "{path}: {body}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_in_no_role_signs_in_and_may_do_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (_provider, gw) = setup(dir.path()).await;
    let mut browser = Browser::new();
    let cookie = signed_in(&mut browser, &gw, "bob", "bob-pw").await;
    let (status, me) = with_cookie(&gw, Method::GET, "/console/session", &cookie, None, None).await;
    assert_eq!(status, 200);
    assert_eq!(
        (me["sub"].as_str(), &me["scopes"]),
        (Some("bob"), &json!({}))
    );
    for path in [
        "/v1/seal/sessions",
        "/v1/approvals",
        "/v1/audit",
        "/v1/claims",
        "/v1/security-contexts",
    ] {
        let (status, body) = with_cookie(&gw, Method::GET, path, &cookie, None, None).await;
        assert_eq!((status, common::code(&body)), (403, 6002), "{path}: {body}");
    }
    let csrf = me["csrf_token"].as_str().unwrap();
    let (status, _) = with_cookie(
        &gw,
        Method::POST,
        "/v1/seal/sessions",
        &cookie,
        Some(csrf),
        Some(registration("by-bob")),
    )
    .await;
    assert_eq!(status, 403);
    assert!(registered(&gw).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_public_client_gets_the_groups_from_userinfo_and_a_role_bound_to_a_team() {
    let dir = tempfile::tempdir().unwrap();
    let provider = Provider::start(
        vec![client("console-public", None, &[callback_uri()])],
        people(),
        false,
    );
    let gw = gateway_for(dir.path(), &provider.issuer, "console-public", false, "").await;
    let mut browser = Browser::new();
    let cookie = signed_in(&mut browser, &gw, "pat", "pat-pw").await;
    let (status, me) = with_cookie(&gw, Method::GET, "/console/session", &cookie, None, None).await;
    assert_eq!(status, 200, "{me}");
    assert_eq!(
        me["scopes"],
        json!({"payments": ["seal.approval.decide", "seal.approval.read"]})
    );
    // Approvals of team payments only: the default team's listing is not theirs.
    let (status, _) = with_cookie(&gw, Method::GET, "/v1/seal/sessions", &cookie, None, None).await;
    assert_eq!(status, 403);
}

/// A callback that fails says why on its page, and leaves no session and no session cookie.
async fn refused(browser: &mut Browser, gw: &Gateway, callback: &str, expected: &str) {
    let before = console_sessions_stored(gw).await;
    browser.forget_cookie(&gw.base, COOKIE);
    let page = browser.get(callback).await;
    assert_eq!(page.status, 400, "{callback}: {}", page.body);
    assert!(
        page.body.contains("Sign-in failed") && page.body.contains(expected),
        "{callback}: {}",
        page.body
    );
    assert!(
        !browser.cookies(&gw.base).contains_key(COOKIE),
        "{callback}: a session cookie was set"
    );
    assert_eq!(
        console_sessions_stored(gw).await,
        before,
        "{callback}: a session was stored"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_missing_or_reused_state_a_replayed_code_or_the_providers_error_signs_nobody_in() {
    let dir = tempfile::tempdir().unwrap();
    let (provider, gw) = setup(dir.path()).await;
    let mut browser = Browser::new();
    let callback = until_callback(&mut browser, &gw, "ann", "ann-pw").await;
    let url = url::Url::parse(&callback).unwrap();
    let params: std::collections::HashMap<_, _> = url.query_pairs().into_owned().collect();
    let code = params["code"].clone();
    let base = format!("{}/console/callback", gw.base);

    refused(
        &mut browser,
        &gw,
        &format!("{base}?code={code}"),
        "no state",
    )
    .await;
    refused(
        &mut browser,
        &gw,
        &format!("{base}?code={code}&state=made-up"),
        "unknown or was used already",
    )
    .await;
    // The right state from another browser (without this sign-in's cookie): refused, and used up.
    let mut other = Browser::new();
    refused(
        &mut other,
        &gw,
        &callback,
        "this browser did not start that sign-in (its sign-in cookie is missing or differs) (this gateway is reached over plain HTTP",
    )
    .await;
    refused(&mut browser, &gw, &callback, "unknown or was used already").await;

    // A fresh sign-in finishes, and its callback cannot be used twice.
    let callback = until_callback(&mut browser, &gw, "ann", "ann-pw").await;
    let page = browser.get(&callback).await;
    assert_eq!(page.status, 200, "{}", page.body);
    let used_code = query_param(&callback, "code");
    refused(&mut browser, &gw, &callback, "unknown or was used already").await;

    // A code already exchanged, brought back with a new sign-in's state: the provider refuses it.
    let fresh = until_callback(&mut browser, &gw, "ann", "ann-pw").await;
    let fresh_state = query_param(&fresh, "state");
    refused(
        &mut browser,
        &gw,
        &format!(
            "{base}?code={used_code}&state={fresh_state}&iss={}",
            provider.issuer
        ),
        "refused the code",
    )
    .await;

    // The provider's error answer, with a live state: shown, and the state is used up.
    let login = browser.get(&format!("{}/console/login", gw.base)).await;
    let state = query_param(login.location.as_deref().unwrap(), "state");
    let denied =
        format!("{base}?error=access_denied&error_description=End-User+aborted&state={state}");
    refused(
        &mut browser,
        &gw,
        &denied,
        "refused the sign-in: access_denied (End-User aborted)",
    )
    .await;
    refused(
        &mut browser,
        &gw,
        &format!("{base}?code={code}&state={state}"),
        "unknown or was used already",
    )
    .await;

    // An answer that names another issuer (RFC 9207 mix-up).
    let login = browser.get(&format!("{}/console/login", gw.base)).await;
    let state = query_param(login.location.as_deref().unwrap(), "state");
    refused(
        &mut browser,
        &gw,
        &format!("{base}?code={code}&state={state}&iss=https://evil.example"),
        "another issuer",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_or_tampered_cookie_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (_provider, gw) = setup(dir.path()).await;
    let mut browser = Browser::new();
    let cookie = signed_in(&mut browser, &gw, "ann", "ann-pw").await;
    let mut tampered = cookie.clone().into_bytes();
    tampered[10] = if tampered[10] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(tampered).unwrap();
    let forged = URL_SAFE_NO_PAD.encode([7u8; 32]);
    for bad in [tampered.as_str(), forged.as_str(), "short", &cookie[..42]] {
        for path in ["/console/session", "/v1/seal/sessions"] {
            let (status, body) = with_cookie(&gw, Method::GET, path, bad, None, None).await;
            assert_eq!(
                (status, common::code(&body)),
                (401, 6001),
                "{bad} {path}: {body}"
            );
        }
    }
    let (status, _) = with_cookie(&gw, Method::GET, "/console/session", &cookie, None, None).await;
    assert_eq!(status, 200, "the real cookie still works");
}

// ---- ID tokens that no honest provider issues, from a fake one ----

/// A fake provider: discovery, a key set, and a token endpoint that answers the ID token the test set.
struct Fake {
    issuer: String,
    id_token: Arc<Mutex<String>>,
    key: IdpKey,
}

/// The fake provider's Ed25519 key, published under its kid.
struct IdpKey {
    private_pem: String,
    public_pem: String,
    jwk: Value,
}

impl IdpKey {
    fn new(kid: &str) -> IdpKey {
        let key = sealgate::envelope::generate_signing_key().unwrap();
        let x = URL_SAFE_NO_PAD.encode(key.verifying_key().as_bytes());
        IdpKey {
            private_pem: sealgate::envelope::signing_key_to_pkcs8_pem(&key).unwrap(),
            public_pem: sealgate::envelope::public_key_pem(&key.verifying_key()).unwrap(),
            jwk: json!({"kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid, "alg": "EdDSA", "use": "sig"}),
        }
    }

    fn sign(&self, claims: &Value, kid: &str) -> String {
        sealgate::token::sign_eddsa_for_tests_and_cli(&self.private_pem, claims, Some(kid)).unwrap()
    }
}

impl Fake {
    async fn start() -> Fake {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let issuer = format!("http://{}", listener.local_addr().unwrap());
        let key = IdpKey::new("k1");
        let id_token = Arc::new(Mutex::new(String::new()));
        let discovery = json!({
            "issuer": issuer, "authorization_endpoint": format!("{issuer}/auth"),
            "token_endpoint": format!("{issuer}/token"), "jwks_uri": format!("{issuer}/jwks"),
        });
        let jwks = json!({"keys": [key.jwk.clone()]});
        let app = axum::Router::new()
            .route(
                "/.well-known/openid-configuration",
                axum::routing::get(move || async move { Json(discovery) }),
            )
            .route(
                "/jwks",
                axum::routing::get(move || async move { Json(jwks) }),
            )
            .route(
                "/token",
                axum::routing::post(|State(token): State<Arc<Mutex<String>>>| async move {
                    let id_token = token.lock().unwrap().clone();
                    Json(
                        json!({"access_token": "at", "token_type": "Bearer", "id_token": id_token}),
                    )
                }),
            )
            .with_state(id_token.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Fake {
            issuer,
            id_token,
            key,
        }
    }

    /// Honest claims for a sign-in that sent `nonce`.
    fn claims(&self, nonce: &str) -> Value {
        let now = sealgate::clock::now_secs();
        json!({"iss": self.issuer, "sub": "eve", "aud": "console", "nonce": nonce, "iat": now,
               "exp": now + 300, "name": "Eve", "groups": ["security"]})
    }
}

/// An unsigned token (`alg: none`), and one signed with HS256 using `secret`.
fn unsigned(claims: &Value) -> String {
    let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT","kid":"k1"}"#);
    format!("{header}.{}.", URL_SAFE_NO_PAD.encode(claims.to_string()))
}

fn hs256(claims: &Value, secret: &[u8]) -> String {
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    header.kid = Some("k1".into());
    jsonwebtoken::encode(
        &header,
        claims,
        &jsonwebtoken::EncodingKey::from_secret(secret).unwrap(),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn id_tokens_with_a_wrong_aud_iss_nonce_time_algorithm_or_key_sign_nobody_in() {
    let dir = tempfile::tempdir().unwrap();
    let fake = Fake::start().await;
    let gw = gateway_for(dir.path(), &fake.issuer, "console", false, "").await;
    let other_key = IdpKey::new("k2");
    let now = sealgate::clock::now_secs();
    let with = |nonce: &str, change: &dyn Fn(&mut Value)| {
        let mut claims = fake.claims(nonce);
        change(&mut claims);
        claims
    };
    type Craft<'a> = Box<dyn Fn(&str) -> String + 'a>;
    let cases: Vec<(&str, Craft, &str)> = vec![
        (
            "wrong aud",
            Box::new(|n| {
                fake.key
                    .sign(&with(n, &|c| c["aud"] = json!("another-client")), "k1")
            }),
            "audience",
        ),
        (
            "wrong iss",
            Box::new(|n| {
                fake.key.sign(
                    &with(n, &|c| c["iss"] = json!("https://evil.example")),
                    "k1",
                )
            }),
            "issuer",
        ),
        (
            "wrong nonce",
            Box::new(|n| {
                fake.key
                    .sign(&with(n, &|c| c["nonce"] = json!(format!("{n}x"))), "k1")
            }),
            "nonce",
        ),
        (
            "no nonce",
            Box::new(|n| {
                fake.key.sign(
                    &with(n, &|c| {
                        c.as_object_mut().unwrap().remove("nonce");
                    }),
                    "k1",
                )
            }),
            "nonce",
        ),
        (
            "expired",
            Box::new(|n| {
                fake.key.sign(
                    &with(n, &|c| {
                        c["iat"] = json!(now - 25);
                        c["exp"] = json!(now - 31);
                    }),
                    "k1",
                )
            }),
            "expired",
        ),
        (
            "issued long ago",
            Box::new(|n| {
                fake.key.sign(
                    &with(n, &|c| {
                        c["iat"] = json!(now - 3600);
                        c["exp"] = json!(now + 3600);
                    }),
                    "k1",
                )
            }),
            "issued at",
        ),
        ("alg none", Box::new(|n| unsigned(&fake.claims(n))), "none"),
        (
            "HS256 with the public key",
            Box::new(|n| hs256(&fake.claims(n), fake.key.public_pem.as_bytes())),
            "HS256",
        ),
        (
            "HS256 with the JWK",
            Box::new(|n| hs256(&fake.claims(n), fake.key.jwk.to_string().as_bytes())),
            "HS256",
        ),
        (
            "kid never published",
            Box::new(|n| other_key.sign(&fake.claims(n), "k2")),
            "k2",
        ),
        (
            "a published kid, another key",
            Box::new(|n| other_key.sign(&fake.claims(n), "k1")),
            "signature",
        ),
    ];
    for (what, craft, expected) in &cases {
        let mut browser = Browser::new();
        let login = browser.get(&format!("{}/console/login", gw.base)).await;
        assert_eq!(login.status, 303, "{what}: {}", login.body);
        let location = url::Url::parse(login.location.as_deref().unwrap()).unwrap();
        let query: std::collections::HashMap<_, _> = location.query_pairs().into_owned().collect();
        *fake.id_token.lock().unwrap() = craft(&query["nonce"]);
        let callback = format!(
            "{}/console/callback?code=any&state={}",
            gw.base, query["state"]
        );
        let before = console_sessions_stored(&gw).await;
        let page = browser.get(&callback).await;
        assert_eq!(page.status, 400, "{what}: {}", page.body);
        assert!(
            page.body.contains("the ID token is refused") && page.body.contains(expected),
            "{what}: {}",
            page.body
        );
        assert!(
            !browser.cookies(&gw.base).contains_key(COOKIE),
            "{what}: a cookie was set"
        );
        assert_eq!(
            console_sessions_stored(&gw).await,
            before,
            "{what}: a session was stored"
        );
    }
    // The same harness with an honest token signs Eve in: the refusals above are the tokens' own.
    let mut browser = Browser::new();
    let login = browser.get(&format!("{}/console/login", gw.base)).await;
    let location = url::Url::parse(login.location.as_deref().unwrap()).unwrap();
    let query: std::collections::HashMap<_, _> = location.query_pairs().into_owned().collect();
    *fake.id_token.lock().unwrap() = fake.key.sign(&fake.claims(&query["nonce"]), "k1");
    let page = browser
        .get(&format!(
            "{}/console/callback?code=any&state={}",
            gw.base, query["state"]
        ))
        .await;
    assert_eq!(page.status, 200, "{}", page.body);
    let cookie = browser.cookies(&gw.base)[COOKIE].clone();
    let (status, me) = with_cookie(&gw, Method::GET, "/console/session", &cookie, None, None).await;
    assert_eq!((status, me["sub"].as_str()), (200, Some("eve")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_console_session_made_on_one_replica_works_on_the_other_and_ends_on_both() {
    let db = sealgate::store::testing::TestDatabase::create().await;
    let dir = tempfile::tempdir().unwrap();
    let provider = Provider::start(
        vec![client("console", Some(CLIENT_SECRET), &[callback_uri()])],
        people(),
        true,
    );
    let mut replicas = Vec::new();
    for i in 0..2 {
        let signing = common::replica_signing(dir.path(), 2, i);
        let extra = format!("store: {:?}\nreplica_id: r{i}\n{signing}", db.url);
        replicas.push(
            gateway_for(
                &dir.path().join(format!("r{i}")),
                &provider.issuer,
                "console",
                true,
                &extra,
            )
            .await,
        );
    }
    let (a, b) = (&replicas[0], &replicas[1]);
    // The sign-in starts on one replica and its callback reaches the other.
    let mut browser = Browser::new();
    let callback = until_callback(&mut browser, a, "ann", "ann-pw").await;
    let login_cookie = browser.cookies(&a.base)["__Host-sealgate-login"].clone();
    browser.set_cookie(&b.base, "__Host-sealgate-login", &login_cookie);
    let page = browser.get(&callback.replacen(&a.base, &b.base, 1)).await;
    assert_eq!(page.status, 200, "{}", page.body);
    let cookie = browser.cookies(&b.base)[COOKIE].clone();
    for gw in [a, b] {
        let (status, me) =
            with_cookie(gw, Method::GET, "/console/session", &cookie, None, None).await;
        assert_eq!(
            (status, me["sub"].as_str()),
            (200, Some("ann")),
            "{}",
            gw.base
        );
    }
    let (_, me) = with_cookie(a, Method::GET, "/console/session", &cookie, None, None).await;
    let (status, _) = with_cookie(
        a,
        Method::POST,
        "/v1/seal/sessions",
        &cookie,
        me["csrf_token"].as_str(),
        Some(registration("on-a")),
    )
    .await;
    assert_eq!(status, 201);
    let (status, _) = with_cookie(
        b,
        Method::POST,
        "/console/logout",
        &cookie,
        me["csrf_token"].as_str(),
        None,
    )
    .await;
    assert_eq!(status, 204);
    for gw in [a, b] {
        let (status, _) =
            with_cookie(gw, Method::GET, "/v1/seal/sessions", &cookie, None, None).await;
        assert_eq!(status, 401, "{}", gw.base);
    }
}

#[test]
fn a_bad_sign_in_configuration_stops_start_up_naming_the_key() {
    let keys = Keys::new();
    let operator = format!(
        "[ {{ alg: EdDSA, public_key_pem: {:?} }} ]",
        keys.operator_public
    );
    let agent = format!(
        "[ {{ alg: EdDSA, public_key_pem: {:?} }} ]",
        keys.agent_public
    );
    let oidc = "\n  oidc: { issuer: \"https://idp.example.com\", client_id: console }";
    let role = |team: &str, scope: &str| {
        format!("\n  roles: [ {{ group: ops, team: {team:?}, scopes: [{scope}] }} ]")
    };
    let cases = [
        (
            "\n  oidc: { issuer: \"http://idp.example.com\", client_id: console }".to_owned(),
            "operator_auth.oidc.issuer",
        ),
        (
            format!("{oidc}{}", role("pay ments", "seal.admin")),
            "operator_auth.roles[0].team",
        ),
        (
            format!("{oidc}{}", role("payments", "seal.approvals.read")),
            "operator_auth.roles[0].scopes",
        ),
        (
            "\n  oidc: { issuer: \"https://idp.example.com\", client_id: console, client_secret: hunter2-secret }"
                .to_owned(),
            "client_secret",
        ),
        (role("*", "seal.admin"), "operator_auth.roles: needs operator_auth.oidc"),
    ];
    for (yaml, expected) in cases {
        let dir = tempfile::tempdir().unwrap();
        let operator_keys = format!("{operator}{yaml}");
        let config = write_config_with_keys(
            dir.path(),
            &agent,
            &operator_keys,
            "http://127.0.0.1:1",
            "",
            "",
        );
        common::assert_refused_at_start_up(&config, expected, "hunter2-secret");
    }
    // Valid, but a browser could not keep the session cookie: said before anyone tries.
    let dir = tempfile::tempdir().unwrap();
    let config = write_config_with_keys(
        dir.path(),
        &agent,
        &format!("{operator}{oidc}"),
        "http://127.0.0.1:1",
        "",
        "",
    );
    let (_, output) = common::run_cli_with_env(
        &["serve", "--check", "--config", config.to_str().unwrap()],
        &[("TEST_TOOL_CREDENTIAL", "Bearer tool-secret")],
    );
    assert!(
        output.contains("browsers refuse the console's __Host-sealgate cookie without Secure"),
        "{output}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealgate_login_signs_in_with_the_device_flow_and_keeps_a_private_bearer_credential() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let (provider, gw) = setup(dir.path()).await;
    let config_home = dir.path().join("config-home");
    let mut login = std::process::Command::new(env!("CARGO_BIN_EXE_sealgate"))
        .args(["login", "--gateway", &format!("{}/", gw.base)])
        .env("XDG_CONFIG_HOME", &config_home)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = common::Lines::capture(login.stderr.take().unwrap());
    let shown = stderr.wait_for("the verification address", |l| l.starts_with("(or open "));
    let verification = shown.trim_start_matches("(or open ").trim_end_matches(')');
    assert!(verification.starts_with(&provider.issuer), "{shown}");
    assert!(
        stderr.lines()[0].contains("enter the code"),
        "{:?}",
        stderr.lines()
    );

    // The person approves at the provider, in a browser.
    let mut browser = Browser::new();
    let done = browser.approve_device(verification, "ann", "ann-pw").await;
    assert_eq!(done.status, 200, "{}", done.body);
    assert!(done.body.contains("Sign-in Success"), "{}", done.body);
    common::until(Duration::from_secs(30), "sealgate login ends", || {
        let exited = login.try_wait().unwrap();
        async move { exited.is_some() }
    })
    .await;
    assert!(login.wait().unwrap().success(), "{:?}", stderr.lines());

    // The credential, keyed by the gateway's URL, in a file only its owner may read.
    let file = config_home.join("sealgate/credentials.json");
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let kept: Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    let credential = kept["gateways"][&gw.base]["credential"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(kept["gateways"][&gw.base]["sub"], "ann");

    // A bearer: the person's identity and scopes, and no CSRF token needed (no browser sends it).
    let bearer = |method: Method, path: &str| {
        gw.client
            .request(method, format!("{}{path}", gw.base))
            .bearer_auth(&credential)
    };
    let me: Value = bearer(Method::GET, "/console/session")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (me["sub"].as_str(), me["via"].as_str()),
        (Some("ann"), Some("oidc"))
    );
    let created = bearer(Method::POST, "/v1/seal/sessions")
        .json(&registration("by-login"))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);

    // `sealgate approvals` with no token of its own uses the stored credential for that gateway.
    let approvals = |gateway: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_sealgate"))
            .args(["approvals", "list", "--json", "--gateway", gateway])
            .env("XDG_CONFIG_HOME", &config_home)
            .env_remove("SEALGATE_OPERATOR_TOKEN")
            .output()
            .unwrap()
    };
    let listed = approvals(&gw.base);
    assert!(listed.status.success(), "{listed:?}");
    let page: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert!(page["items"].is_array(), "{page}");
    let elsewhere = approvals("http://127.0.0.1:9");
    assert_eq!(elsewhere.status.code(), Some(2), "{elsewhere:?}");
    assert!(
        String::from_utf8_lossy(&elsewhere.stderr).contains("sealgate login --gateway"),
        "{elsewhere:?}"
    );

    assert_eq!(
        bearer(Method::POST, "/console/logout")
            .send()
            .await
            .unwrap()
            .status(),
        204
    );
    let after = bearer(Method::GET, "/v1/seal/sessions")
        .send()
        .await
        .unwrap();
    assert_eq!(after.status(), 401);

    // A device code the provider never issued signs nobody in.
    let (status, body) = gw
        .operator(
            Method::POST,
            "/console/device/token",
            None,
            Some(json!({"device_code": "made-up"})),
        )
        .await;
    assert_eq!((status, common::code(&body)), (401, 6001), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provider_that_is_down_or_redirects_fails_the_sign_in_on_a_page_that_names_it() {
    let redirector = common::redirect::Redirector::start().await;
    for (issuer, expected) in [
        (
            "http://127.0.0.1:1".to_owned(),
            "could not be reached".to_owned(),
        ),
        (redirector.base.clone(), redirector.named()),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let gw = gateway_for(dir.path(), &issuer, "console", true, "").await;
        let mut browser = Browser::new();
        let page = browser.get(&format!("{}/console/login", gw.base)).await;
        assert_eq!(page.status, 502, "{issuer}: {}", page.body);
        assert!(
            page.body.contains("discovery") && page.body.contains(&expected),
            "{}",
            page.body
        );
        assert!(
            !page.body.contains(common::redirect::SECRET),
            "{}",
            page.body
        );
        assert!(!browser
            .cookies(&gw.base)
            .contains_key("__Host-sealgate-login"));
    }
    assert!(redirector.redirected() >= 1);
    assert_eq!(redirector.followed(), 0, "a redirect was followed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_console_session_ends_when_idle_and_at_its_absolute_end_even_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let provider = Provider::start(
        vec![client("console", Some(CLIENT_SECRET), &[callback_uri()])],
        people(),
        true,
    );
    let extra = format!("approvals: {{ console_base_url: \"{PUBLIC_BASE}/console\" }}\n");
    let (config, keys) = config_for(dir.path(), &provider.issuer, "console", true, &extra).await;
    // Idle after 2 s without use; over 4 s after sign-in, used or not.
    let text = std::fs::read_to_string(&config).unwrap();
    let text = text.replace(
        "session_idle_secs: 600",
        "session_idle_secs: 2, session_max_secs: 4",
    );
    std::fs::write(&config, text).unwrap();
    let gw = Gateway::spawn(dir.path(), &config, keys);

    // Left alone, a session ends when idle.
    let idle = signed_in(&mut Browser::new(), &gw, "ann", "ann-pw").await;
    let started = std::time::Instant::now();
    common::until(Duration::from_secs(10), "the idle session ends", || {
        let gw = &gw;
        let idle = idle.clone();
        async move {
            with_cookie(gw, Method::GET, "/console/session", &idle, None, None)
                .await
                .0
                == 401
        }
    })
    .await;
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "ended early: {:?}",
        started.elapsed()
    );

    // Used all the time, a session lives past its idle allowance, and ends at its absolute end.
    let used = signed_in(&mut Browser::new(), &gw, "ann", "ann-pw").await;
    let started = std::time::Instant::now();
    common::until(Duration::from_secs(10), "the used session ends", || {
        let gw = &gw;
        let used = used.clone();
        async move {
            with_cookie(gw, Method::GET, "/v1/seal/sessions", &used, None, None)
                .await
                .0
                == 401
        }
    })
    .await;
    let lived = started.elapsed();
    assert!(
        lived >= Duration::from_millis(3000),
        "a used session ended as idle after {lived:?}"
    );
}

/// Starting a sign-in needs no credential and writes to the store: a flood of starts is cut off after a
/// burst (503 with Retry-After, nothing written), so that it cannot become a flood of syncs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_sign_in_starts_is_cut_off_after_a_burst_and_writes_nothing_more() {
    let dir = tempfile::tempdir().unwrap();
    let (_provider, gw) = setup(dir.path()).await;
    let mut browser = Browser::new();
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    let mut busy = None;
    for _ in 0..100 {
        let started = browser.get(&format!("{}/console/login", gw.base)).await;
        *statuses.entry(started.status).or_default() += 1;
        if started.status == 503 {
            busy = Some(started);
        }
    }
    let busy = busy.unwrap_or_else(|| panic!("no start was refused: {statuses:?}"));
    assert!(busy.body.contains("too many sign-ins"), "{}", busy.body);
    assert!(busy.location.is_none());
    let started = statuses[&303];
    assert!((60..100).contains(&started), "{statuses:?}");
    assert_eq!(rows_stored(&gw, "sign_in_attempts").await, started as i64);

    let (status, body) = gw
        .operator(Method::POST, "/console/device", None, None)
        .await;
    assert_eq!((status, common::code(&body)), (503, 5006), "{body}");
}
