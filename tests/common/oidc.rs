//! A real OpenID provider for the tests: `tests/oidc/server.mjs` (the certified `oidc-provider` package
//! pinned by tests/oidc/package-lock.json; `npm ci --prefix tests/oidc`), started on a free loopback
//! port, and a [`Browser`] that signs a person in by driving the provider's HTML forms, so that Rust
//! tests need no browser. The provider can also be the authorization server of MCP hosts (RFC 8707
//! resource indicators, RFC 7591 registration, a signing key the test holds: [`Provider::start_with`]),
//! and [`forge`] makes the tokens that no honest provider issues.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

/// The provider process; killed when dropped.
pub struct Provider {
    pub issuer: String,
    child: Child,
}

impl Drop for Provider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A user of the provider: `sub` is also the login name.
pub fn user(sub: &str, password: &str, name: &str, groups: &[&str]) -> Value {
    json!({"sub": sub, "password": password, "name": name, "email": format!("{sub}@example.com"),
           "groups": groups})
}

/// A client: public when `secret` is None.
pub fn client(client_id: &str, secret: Option<&str>, redirect_uris: &[String]) -> Value {
    let mut client = json!({"client_id": client_id, "redirect_uris": redirect_uris});
    if let Some(secret) = secret {
        client["client_secret"] = json!(secret);
    }
    client
}

impl Provider {
    /// Starts the provider with `clients` and `users`; `groups_in_id_token: false` leaves the groups to
    /// the userinfo endpoint.
    pub fn start(clients: Vec<Value>, users: Vec<Value>, groups_in_id_token: bool) -> Provider {
        Provider::start_with(json!({"clients": clients, "users": users,
                                    "groups_in_id_token": groups_in_id_token}))
    }

    /// Starts the provider with the whole OIDC_SETUP object that tests/oidc/server.mjs reads (its
    /// `resource_scopes`, `registration` and `signing_key_pem` among the rest).
    pub fn start_with(setup: Value) -> Provider {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/oidc");
        assert!(
            dir.join("node_modules/oidc-provider").exists(),
            "the test OpenID provider is not installed: run `npm ci --prefix tests/oidc`"
        );
        let mut child = Command::new("node")
            .arg(dir.join("server.mjs"))
            .env("OIDC_SETUP", setup.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("node runs tests/oidc/server.mjs");
        let mut line = String::new();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        stdout.read_line(&mut line).unwrap();
        // The provider writes notices to stdout later on (its device pages): a closed pipe would end it.
        std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
        let issuer = line.trim().to_owned();
        assert!(
            issuer.starts_with("http://127.0.0.1:"),
            "provider said {line:?}"
        );
        Provider { issuer, child }
    }

    /// The provider's JWK Set URL.
    pub fn jwks_url(&self) -> String {
        format!("{}/jwks", self.issuer)
    }
}

/// The `kid` under which the provider publishes its signing key (tests/oidc/server.mjs).
pub const PROVIDER_KID: &str = "test-key-1";

/// An RSA key pair made by openssl, for the provider to sign with (`signing_key_pem`) and for a test to
/// forge tokens that the provider's published key verifies.
pub struct RsaKey {
    /// PKCS#8 PEM.
    pub private_pem: String,
    /// SPKI PEM.
    pub public_pem: String,
}

impl RsaKey {
    pub fn generate(dir: &std::path::Path) -> RsaKey {
        let private = dir.join("provider.key");
        let public = dir.join("provider.pub.pem");
        let run = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .output()
                .expect("openssl runs");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let (private_arg, public_arg) = (private.to_str().unwrap(), public.to_str().unwrap());
        run(&[
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
            private_arg,
        ]);
        run(&["pkey", "-in", private_arg, "-pubout", "-out", public_arg]);
        RsaKey {
            private_pem: std::fs::read_to_string(private).unwrap(),
            public_pem: std::fs::read_to_string(public).unwrap(),
        }
    }
}

/// Tokens signed (or not) by the test itself, for the refusals: with the provider's own key and any
/// claims, HS256 keyed with the provider's public key (the old algorithm confusion), `alg: none`.
pub mod forge {
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine as _;
    use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
    use serde_json::Value;

    use super::RsaKey;

    /// RS256 with `key`, under `kid`.
    pub fn rs256(key: &RsaKey, kid: &str, claims: &Value) -> String {
        let mut header = Header::new(Algorithm::RS256);
        header.kid = Some(kid.to_owned());
        let key = EncodingKey::from_rsa_pem(key.private_pem.as_bytes()).unwrap();
        encode(&header, claims, &key).unwrap()
    }

    /// HS256 whose secret is the bytes of `public_pem`, under `kid`: a verifier that let the token
    /// choose its algorithm would check it with the RSA key's PEM as an HMAC secret.
    pub fn hs256_with_public_key(public_pem: &str, kid: &str, claims: &Value) -> String {
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some(kid.to_owned());
        let key = EncodingKey::from_secret(public_pem.as_bytes()).unwrap();
        encode(&header, claims, &key).unwrap()
    }

    /// `alg: none`, no signature (jsonwebtoken rightly refuses to make one).
    pub fn unsigned(kid: &str, claims: &Value) -> String {
        let header = serde_json::json!({"alg": "none", "typ": "JWT", "kid": kid});
        format!(
            "{}.{}.",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        )
    }

    /// The claims of a JWT, read without checking anything.
    pub fn claims(token: &str) -> Value {
        let payload = token.split('.').nth(1).expect("a JWT has three parts");
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap()
    }
}

/// An answer as the browser saw it.
pub struct Page {
    pub url: String,
    pub status: u16,
    pub location: Option<String>,
    pub body: String,
}

/// A browser without JavaScript: a cookie jar per origin (paths and expiry dates are not honoured, only
/// deletion), redirects followed by hand so that a test can stop before one.
pub struct Browser {
    client: reqwest::Client,
    jar: BTreeMap<String, BTreeMap<String, String>>,
}

impl Default for Browser {
    fn default() -> Self {
        Browser::new()
    }
}

impl Browser {
    pub fn new() -> Browser {
        Browser {
            client: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .timeout(Duration::from_secs(20))
                .build()
                .unwrap(),
            jar: BTreeMap::new(),
        }
    }

    /// The cookies the browser holds for `url`'s origin.
    pub fn cookies(&self, url: &str) -> BTreeMap<String, String> {
        self.jar.get(&origin(url)).cloned().unwrap_or_default()
    }

    pub fn set_cookie(&mut self, url: &str, name: &str, value: &str) {
        self.jar
            .entry(origin(url))
            .or_default()
            .insert(name.to_owned(), value.to_owned());
    }

    pub fn forget_cookie(&mut self, url: &str, name: &str) {
        if let Some(cookies) = self.jar.get_mut(&origin(url)) {
            cookies.remove(name);
        }
    }

    pub async fn get(&mut self, url: &str) -> Page {
        let request = self.client.get(url);
        self.send(url, request).await
    }

    pub async fn post_form(&mut self, url: &str, form: &[(String, String)]) -> Page {
        let body = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(form)
            .finish();
        let request = self
            .client
            .post(url)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body);
        self.send(url, request).await
    }

    async fn send(&mut self, url: &str, request: reqwest::RequestBuilder) -> Page {
        let cookies = self.cookies(url);
        let request = if cookies.is_empty() {
            request
        } else {
            let line: Vec<String> = cookies.iter().map(|(k, v)| format!("{k}={v}")).collect();
            request.header("cookie", line.join("; "))
        };
        let response = request.send().await.unwrap();
        for set in response.headers().get_all("set-cookie") {
            self.keep(url, set.to_str().unwrap());
        }
        let status = response.status().as_u16();
        let location = response
            .headers()
            .get("location")
            .map(|l| resolve(url, l.to_str().unwrap()));
        Page {
            url: url.to_owned(),
            status,
            location,
            body: response.text().await.unwrap_or_default(),
        }
    }

    fn keep(&mut self, url: &str, set_cookie: &str) {
        let mut parts = set_cookie.split(';');
        let Some((name, value)) = parts.next().and_then(|p| p.trim().split_once('=')) else {
            return;
        };
        let deleted = value.is_empty()
            || parts.any(|attribute| {
                let attribute = attribute.trim().to_ascii_lowercase();
                attribute == "max-age=0" || attribute.contains("1970")
            });
        let cookies = self.jar.entry(origin(url)).or_default();
        if deleted {
            cookies.remove(name);
        } else {
            cookies.insert(name.to_owned(), value.to_owned());
        }
    }

    /// Follows redirects from `url` and answers the provider's login and consent forms as `login` with
    /// `password`, until a redirect points at an address that starts with `stop_at`: that address is
    /// returned, not requested. Panics on a page it does not know.
    pub async fn sign_in_until(
        &mut self,
        url: &str,
        login: &str,
        password: &str,
        stop_at: &str,
    ) -> String {
        let mut page = self.get(url).await;
        for _ in 0..20 {
            if let Some(location) = page.location.clone() {
                if location.starts_with(stop_at) {
                    return location;
                }
                page = self.get(&location).await;
                continue;
            }
            page = self.answer_form(&page, login, password).await;
        }
        panic!(
            "the sign-in did not reach {stop_at}; last page {}",
            page.url
        );
    }

    /// Approves a device authorization at the provider's `verification_uri_complete`, signing in as
    /// `login`; answers the provider's last page.
    pub async fn approve_device(
        &mut self,
        verification_uri: &str,
        login: &str,
        password: &str,
    ) -> Page {
        let mut page = self.get(verification_uri).await;
        for _ in 0..20 {
            if let Some(location) = page.location.clone() {
                page = self.get(&location).await;
                continue;
            }
            if !page.body.contains("<form") {
                return page;
            }
            page = self.answer_form(&page, login, password).await;
        }
        panic!("the device approval did not end; last page {}", page.url);
    }

    async fn answer_form(&mut self, page: &Page, login: &str, password: &str) -> Page {
        assert_eq!(page.status, 200, "{}: {}", page.url, page.body);
        let (id, action, mut fields) = first_form(&page.body)
            .unwrap_or_else(|| panic!("{}: no form on the page: {}", page.url, page.body));
        match id.as_str() {
            "login" => {
                fields.push(("login".into(), login.into()));
                fields.push(("password".into(), password.into()));
            }
            // The consent and device confirmation forms, and the provider's self-submitting form_post
            // page (which a browser's script would send at once).
            "consent" | "op.deviceConfirmForm" | "" => {}
            other => panic!("{}: a form {other:?} this browser does not know", page.url),
        }
        let target = resolve(&page.url, &action);
        self.post_form(&target, &fields).await
    }
}

/// A form's id, its action, and its hidden inputs.
type Form = (String, String, Vec<(String, String)>);

/// The first form of a page.
fn first_form(html: &str) -> Option<Form> {
    let start = html.find("<form")?;
    let end = html[start..]
        .find("</form>")
        .map_or(html.len(), |i| start + i);
    let form = &html[start..end];
    let tag = &form[..form.find('>')?];
    let id = attribute(tag, "id").unwrap_or_default();
    let action = attribute(tag, "action")?;
    let hidden = form
        .split("<input")
        .skip(1)
        .filter(|input| attribute(input, "type").as_deref() == Some("hidden"))
        .filter_map(|input| Some((attribute(input, "name")?, attribute(input, "value")?)))
        .collect();
    Some((id, action, hidden))
}

fn attribute(tag: &str, name: &str) -> Option<String> {
    let marker = format!(" {name}=\"");
    let start = tag.find(&marker)? + marker.len();
    let end = tag[start..].find('"')? + start;
    Some(tag[start..end].replace("&amp;", "&"))
}

fn origin(url: &str) -> String {
    let parsed = url::Url::parse(url).unwrap();
    parsed.origin().ascii_serialization()
}

fn resolve(base: &str, location: &str) -> String {
    url::Url::parse(base)
        .unwrap()
        .join(location)
        .unwrap()
        .to_string()
}
