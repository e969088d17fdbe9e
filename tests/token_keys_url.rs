//! Token keys from a JWKS URL (SPEC 11 r3), through the real binary against a local identity provider:
//! a new kid is accepted at once, a retired one refused once the set is fetched again, a flood of
//! unknown kids does not hammer the provider, an outage longer than the grace period fails closed and
//! heals, HTTPS trusts the configured CA file, and a set not yet fetched keeps the gateway unready.
//! Agent tokens (envelopes, 1004) and operator tokens (control API, 6001) alike.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use common::{
    assert_refused_at_start_up, code, start_tool, tool_call, until, write_config_with_keys,
    Gateway, Keys,
};
use ed25519_dalek::SigningKey;
use reqwest::Method;
use serde_json::{json, Value};

/// One signing key of the identity provider.
struct IdpKey {
    kid: String,
    private_pem: String,
    jwk: Value,
}

impl IdpKey {
    fn new(kid: &str) -> IdpKey {
        let key = sealgate::envelope::generate_signing_key().unwrap();
        let x = URL_SAFE_NO_PAD.encode(key.verifying_key().as_bytes());
        IdpKey {
            kid: kid.to_owned(),
            private_pem: sealgate::envelope::signing_key_to_pkcs8_pem(&key).unwrap(),
            jwk: json!({"kty": "OKP", "crv": "Ed25519", "x": x, "kid": kid, "alg": "EdDSA", "use": "sig"}),
        }
    }

    fn sign(&self, claims: &Value) -> String {
        sealgate::token::sign_eddsa_for_tests_and_cli(&self.private_pem, claims, Some(&self.kid))
            .unwrap()
    }

    fn agent_token(&self, session: &str) -> String {
        self.sign(&Keys::new().agent_claims(session, "test"))
    }

    fn operator_token(&self) -> String {
        let now = sealgate::clock::now_secs();
        self.sign(
            &json!({"sub": "idp-operator", "aud": "sealgate-operators", "scope": "seal.admin",
                          "iat": now, "exp": now + 600}),
        )
    }
}

/// The identity provider's JWKS endpoint: what it publishes, whether it is down, what it was asked.
#[derive(Default)]
struct Idp {
    published: Mutex<Vec<Value>>,
    down: AtomicBool,
    fetches: AtomicU64,
    failures: AtomicU64,
}

impl Idp {
    fn publish(&self, keys: &[&IdpKey]) {
        *self.published.lock().unwrap() = keys.iter().map(|k| k.jwk.clone()).collect();
    }

    fn fetches(&self) -> u64 {
        self.fetches.load(Ordering::SeqCst)
    }

    fn router(self: &Arc<Self>) -> axum::Router {
        let idp = self.clone();
        axum::Router::new().route(
            "/jwks",
            axum::routing::get(move || {
                let idp = idp.clone();
                async move {
                    idp.fetches.fetch_add(1, Ordering::SeqCst);
                    if idp.down.load(Ordering::SeqCst) {
                        idp.failures.fetch_add(1, Ordering::SeqCst);
                        return Err(axum::http::StatusCode::SERVICE_UNAVAILABLE);
                    }
                    Ok(axum::Json(
                        json!({"keys": idp.published.lock().unwrap().clone()}),
                    ))
                }
            }),
        )
    }

    /// Serves over plain HTTP on loopback; returns the JWKS URL.
    async fn serve_http(self: &Arc<Self>) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = self.router();
        tokio::spawn(async move { axum::serve(listener, app).await });
        format!("http://{addr}/jwks")
    }

    /// Serves over HTTPS with the certificate `tls` made; returns the JWKS URL.
    async fn serve_https(self: &Arc<Self>, tls: &TestCa) -> String {
        use tokio_rustls::rustls::pki_types::pem::PemObject;
        use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs = CertificateDer::pem_file_iter(&tls.server_cert)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(&tls.server_key).unwrap();
        let config = tokio_rustls::rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = self.router();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, app) = (acceptor.clone(), app.clone());
                tokio::spawn(async move {
                    // A client that refuses the certificate ends its handshake here.
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper_util::service::TowerToHyperService::new(app);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        format!("https://{addr}/jwks")
    }
}

/// A certificate authority and a server certificate for 127.0.0.1 that it signed, made with openssl.
struct TestCa {
    ca_cert: std::path::PathBuf,
    server_cert: std::path::PathBuf,
    server_key: std::path::PathBuf,
}

impl TestCa {
    fn make(dir: &Path) -> TestCa {
        let openssl = |args: &[&str]| {
            let output = std::process::Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .output()
                .expect("openssl runs (scripts/test.sh installs it)");
            assert!(
                output.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        };
        let p256 = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
        ];
        openssl(
            &[
                &[
                    "req",
                    "-x509",
                    "-days",
                    "2",
                    "-subj",
                    "/CN=sealgate test CA",
                ][..],
                &p256,
                &["-keyout", "ca.key", "-out", "ca.pem"],
            ]
            .concat(),
        );
        openssl(
            &[
                &["req", "-subj", "/CN=127.0.0.1"][..],
                &p256,
                &["-keyout", "server.key", "-out", "server.csr"],
            ]
            .concat(),
        );
        std::fs::write(
            dir.join("server.ext"),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "server.ext",
            "-out",
            "server.pem",
        ]);
        TestCa {
            ca_cert: dir.join("ca.pem"),
            server_cert: dir.join("server.pem"),
            server_key: dir.join("server.key"),
        }
    }
}

/// A gateway whose agent keys are the YAML `keys:` list given, and whose operator keys are too, or
/// else the harness's own operator key (for `Gateway::session` and `Gateway::admin`).
async fn gateway(dir: &Path, agent_keys: &str, operator_keys: Option<&str>) -> Gateway {
    let (_tool, tool_base) = start_tool().await;
    let keys = Arc::new(Keys::new());
    let own_operator_keys = format!(
        "[ {{ alg: EdDSA, public_key_pem: {:?} }} ]",
        keys.operator_public
    );
    let operator_keys = operator_keys.unwrap_or(&own_operator_keys);
    let config = write_config_with_keys(dir, agent_keys, operator_keys, &tool_base, "", "");
    Gateway::spawn(dir, &config, keys)
}

/// Registers `session` on the `test` context with `operator_token`; returns the agent's key.
async fn register(gw: &Gateway, operator_token: &str, session: &str) -> SigningKey {
    let key = sealgate::envelope::generate_signing_key().unwrap();
    let (status, body) = gw
        .register(
            Some(operator_token),
            json!({"session_id": session, "public_key": sealgate::envelope::public_key_b64(&key.verifying_key()),
                   "security_context": "test", "expires_at": sealgate::clock::now_secs() + 600}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    key
}

/// Sends a call with a fresh JSON-RPC id (so no two envelopes repeat); returns status and body.
async fn call(gw: &Gateway, key: &SigningKey, token: &str) -> (u16, Value) {
    static NEXT_ID: AtomicU64 = AtomicU64::new(1);
    let id = NEXT_ID.fetch_add(1, Ordering::SeqCst);
    gw.call(key, token, tool_call(id, "tool.echo", json!({})))
        .await
}

async fn operator_get(gw: &Gateway, token: &str, session: &str) -> (u16, Value) {
    gw.operator(
        Method::GET,
        &format!("/v1/seal/sessions/{session}"),
        Some(token),
        None,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_kid_is_accepted_at_once_and_a_retired_one_refused_on_both_paths() {
    let idp = Arc::new(Idp::default());
    let (a, b) = (IdpKey::new("a"), IdpKey::new("b"));
    idp.publish(&[&a]);
    let url = idp.serve_http().await;
    // No routine refresh within the test: every fetch after start-up is one that a kid asked for.
    let keys = format!("[ {{ jwks_url: {url:?}, refresh_secs: 3000 }} ]");
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(dir.path(), &keys, Some(&keys)).await;
    assert_eq!(
        idp.fetches(),
        2,
        "agent and operator sets, once each, before ready"
    );

    let session_key = register(&gw, &a.operator_token(), "exec-rotate").await;
    let (status, body) = call(&gw, &session_key, &a.agent_token("exec-rotate")).await;
    assert_eq!(status, 200, "{body}");

    // The provider rotates: `b` replaces `a`. The first token naming `b` fetches the set and passes.
    idp.publish(&[&b]);
    let (status, body) = call(&gw, &session_key, &b.agent_token("exec-rotate")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(idp.fetches(), 3);
    // That fetch retired `a`: a token that passed before (and was cached) is refused now.
    let (status, body) = call(&gw, &session_key, &a.agent_token("exec-rotate")).await;
    assert_eq!((status, code(&body)), (401, 1004), "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("kid `a`"), "{message}");

    // The operator set is fetched on its own: `b` passes at once, `a` is refused.
    let (status, body) = operator_get(&gw, &b.operator_token(), "exec-rotate").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(idp.fetches(), 4);
    let (status, body) = operator_get(&gw, &a.operator_token(), "exec-rotate").await;
    assert_eq!((status, code(&body)), (401, 6001), "{body}");

    // A flood of unknown kids: each refused, and at most one fetch per 10 s reaches the provider.
    let before = idp.fetches();
    let started = Instant::now();
    let tokens: Vec<String> = (0..20)
        .map(|i| IdpKey::new(&format!("stranger-{i}")).agent_token("exec-rotate"))
        .collect();
    let answers =
        futures_util::future::join_all(tokens.iter().map(|t| call(&gw, &session_key, t))).await;
    for (status, body) in answers {
        assert_eq!((status, code(&body)), (401, 1004), "{body}");
    }
    let allowed = 1 + started.elapsed().as_secs() / 10;
    let made = idp.fetches() - before;
    assert!(
        made <= allowed,
        "{made} fetches for a flood of unknown kids"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_longer_than_the_grace_period_refuses_tokens_until_the_provider_returns() {
    let idp = Arc::new(Idp::default());
    let a = IdpKey::new("a");
    idp.publish(&[&a]);
    let url = idp.serve_http().await;
    let keys = format!("[ {{ jwks_url: {url:?}, refresh_secs: 1, grace_secs: 5 }} ]");
    let dir = tempfile::tempdir().unwrap();
    let gw = gateway(dir.path(), &keys, Some(&keys)).await;
    let session_key = register(&gw, &a.operator_token(), "exec-outage").await;
    let token = a.agent_token("exec-outage");
    assert_eq!(call(&gw, &session_key, &token).await.0, 200);

    idp.down.store(true, Ordering::SeqCst);
    until(Duration::from_secs(10), "a failed fetch", || async {
        idp.failures.load(Ordering::SeqCst) > 0
    })
    .await;
    // Within the grace period the last good set still serves.
    let (status, body) = call(&gw, &session_key, &token).await;
    assert_eq!(status, 200, "{body}");

    let refused = Mutex::new(Value::Null);
    until(
        Duration::from_secs(20),
        "the agent token refused",
        || async {
            let (status, body) = call(&gw, &session_key, &token).await;
            let done = status == 401;
            *refused.lock().unwrap() = body;
            done
        },
    )
    .await;
    let body = refused.into_inner().unwrap();
    assert_eq!(code(&body), 1004, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("agent_tokens.keys[0] (jwks_url) was last fetched")
            && message.contains("past its grace period of 5 s"),
        "{message}"
    );
    until(
        Duration::from_secs(20),
        "the operator token refused",
        || async {
            let (status, body) = operator_get(&gw, &a.operator_token(), "exec-outage").await;
            status == 401 && code(&body) == 6001
        },
    )
    .await;
    // Readiness stays: every replica is in the same state, and the refusals say why.
    assert_eq!(gw.operator(Method::GET, "/readyz", None, None).await.0, 200);

    idp.down.store(false, Ordering::SeqCst);
    until(
        Duration::from_secs(20),
        "the agent token accepted again",
        || async { call(&gw, &session_key, &token).await.0 == 200 },
    )
    .await;
    let (status, body) = operator_get(&gw, &a.operator_token(), "exec-outage").await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_whose_set_is_not_fetched_yet_starts_unready_and_refuses_its_tokens() {
    let idp = Arc::new(Idp::default());
    let a = IdpKey::new("a");
    idp.publish(&[&a]);
    idp.down.store(true, Ordering::SeqCst);
    let url = idp.serve_http().await;
    let dir = tempfile::tempdir().unwrap();
    let agent_keys = format!("[ {{ jwks_url: {url:?}, refresh_secs: 1, grace_secs: 60 }} ]");
    let gw = gateway(dir.path(), &agent_keys, None).await;
    let (status, body) = gw.operator(Method::GET, "/readyz", None, None).await;
    assert_eq!((status, code(&body)), (503, 6001), "{body}");
    assert_eq!(
        body["error"]["message"],
        "not ready: the key set of agent_tokens.keys[0] (jwks_url) has not been fetched yet"
    );
    let session_key = gw.session("exec-early").await.0;
    let (status, body) = call(&gw, &session_key, &a.agent_token("exec-early")).await;
    assert_eq!((status, code(&body)), (401, 1004), "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("has not been fetched yet"),
        "{body}"
    );

    idp.down.store(false, Ordering::SeqCst);
    until(
        Duration::from_secs(20),
        "ready once the set arrives",
        || async { gw.operator(Method::GET, "/readyz", None, None).await.0 == 200 },
    )
    .await;
    let (status, body) = call(&gw, &session_key, &a.agent_token("exec-early")).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_https_only_the_ca_file_is_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let tls = TestCa::make(dir.path());
    let idp = Arc::new(Idp::default());
    let a = IdpKey::new("a");
    idp.publish(&[&a]);
    let url = idp.serve_https(&tls).await;

    let trusted = dir.path().join("trusted");
    let agent_keys = format!("[ {{ jwks_url: {url:?}, ca_file: {:?} }} ]", tls.ca_cert);
    let gw = gateway(&trusted, &agent_keys, None).await;
    assert_eq!(gw.operator(Method::GET, "/readyz", None, None).await.0, 200);
    let session_key = gw.session("exec-tls").await.0;
    let (status, body) = call(&gw, &session_key, &a.agent_token("exec-tls")).await;
    assert_eq!(status, 200, "{body}");

    // Without the CA file the provider's certificate is not trusted: nothing is fetched.
    let fetches = idp.fetches();
    let untrusted = dir.path().join("untrusted");
    let agent_keys = format!("[ {{ jwks_url: {url:?} }} ]");
    let gw = gateway(&untrusted, &agent_keys, None).await;
    let (status, body) = gw.operator(Method::GET, "/readyz", None, None).await;
    assert_eq!(status, 503, "{body}");
    let session_key = gw.session("exec-untrusted").await.0;
    let (status, body) = call(&gw, &session_key, &a.agent_token("exec-untrusted")).await;
    assert_eq!((status, code(&body)), (401, 1004), "{body}");
    assert_eq!(
        idp.fetches(),
        fetches,
        "no request passed the TLS handshake"
    );
}

#[test]
fn a_plain_http_url_off_loopback_stops_start_up_without_being_quoted() {
    let dir = tempfile::tempdir().unwrap();
    let agent_keys = "[ { jwks_url: \"http://idp.example/jwks?key=TopSecret\" } ]";
    let config = write_config_with_keys(
        dir.path(),
        agent_keys,
        agent_keys,
        "http://127.0.0.1:9",
        "",
        "",
    );
    assert_refused_at_start_up(
        &config,
        "agent_tokens.keys[0]: jwks_url: http:// is accepted only for a loopback host",
        "TopSecret",
    );
}

/// SPEC 13 r4: a record says how the gateway knew each person, so that a grant vouched for by the
/// organisation's key set reads differently from one by a token that a configured key verified.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_by_a_token_from_a_key_set_url_is_recorded_via_jwks() {
    let idp = Arc::new(Idp::default());
    let a = IdpKey::new("a");
    idp.publish(&[&a]);
    let jwks = format!(
        "{{ jwks_url: {:?}, refresh_secs: 3000 }}",
        idp.serve_http().await
    );
    let dir = tempfile::tempdir().unwrap();
    let (_tool, tool_base) = start_tool().await;
    let keys = Arc::new(Keys::new());
    // Operators are verified with the harness's key file and with the provider's key set.
    let operator_keys = format!(
        "[ {{ alg: EdDSA, public_key_pem: {:?} }}, {jwks} ]",
        keys.operator_public
    );
    let config = write_config_with_keys(
        dir.path(),
        &format!("[ {jwks} ]"),
        &operator_keys,
        &tool_base,
        "",
        "",
    );
    let gw = Gateway::spawn(dir.path(), &config, keys);
    let spec = json!({"capabilities": [{"tool_pattern": "pay.*", "claim": "off",
                                         "approval": {"required": true, "approvers": 2}}]});
    let (status, body) = gw
        .admin(Method::PUT, "/v1/security-contexts/pay2", Some(spec))
        .await;
    assert_eq!(status, 201, "{body}");
    let session = sealgate::envelope::generate_signing_key().unwrap();
    let (status, body) = gw
        .admin(
            Method::POST,
            "/v1/seal/sessions",
            Some(json!({"session_id": "exec-via",
                "public_key": sealgate::envelope::public_key_b64(&session.verifying_key()),
                "security_context": "pay2", "expires_at": sealgate::clock::now_secs() + 600})),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let agent = a.sign(&Keys::new().agent_claims("exec-via", "pay2"));
    let (status, body) = gw
        .call(
            &session,
            &agent,
            tool_call(1, "pay.send", json!({"cents": 1})),
        )
        .await;
    assert_eq!((status, code(&body)), (403, 4003), "{body}");
    let id = body["error"]["details"]["approval_id"].as_str().unwrap();

    let grant = format!("/v1/approvals/{id}/grant");
    let (status, once) = gw
        .operator(
            Method::POST,
            &grant,
            Some(&a.operator_token()),
            Some(json!({})),
        )
        .await;
    assert_eq!(status, 200, "{once}");
    let ann = gw.keys.operator_token_as("ann", "seal.approval.decide");
    let (status, granted) = gw
        .operator(Method::POST, &grant, Some(&ann), Some(json!({})))
        .await;
    assert_eq!(status, 200, "{granted}");
    assert_eq!(granted["status"], "granted");
    let by = &granted["grants"][0]["by"];
    assert_eq!(
        (by["sub"].as_str(), by["via"].as_str()),
        (Some("idp-operator"), Some("jwks"))
    );
    let decided = &granted["decided_by"];
    assert_eq!(
        (decided["sub"].as_str(), decided["via"].as_str()),
        (Some("ann"), Some("key"))
    );
    let events = gw.audit_events("type=ApprovalGranted").await;
    let actors: Vec<_> = events.iter().map(|e| e["actor"]["via"].clone()).collect();
    assert_eq!(actors, [json!("key"), json!("jwks")], "newest first");
}
