//! TLS on the listener (SPEC 11 r3) through the real binary, with certificates that the openssl CLI
//! makes here: HTTPS calls with `sealgate invoke` and `sealgate health`, a CA that did not sign the
//! gateway's certificate, TLS 1.1 refused, mutual TLS, and certificate files replaced while the gateway
//! runs. `serve --check` and `demo --tls` too.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{run_cli, tool_call, until, Gateway};
use serde_json::{json, Value};

/// Runs openssl in `dir` with `args` (words without spaces); panics with its output when it fails.
fn openssl(dir: &Path, args: &str) {
    let out = Command::new("openssl")
        .args(args.split_whitespace())
        .current_dir(dir)
        .output()
        .expect("openssl runs");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A new P-256 key, unencrypted.
const NEW_KEY: &str = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";

/// A CA: `NAME.pem` and `NAME.key` in `dir`.
fn make_ca(dir: &Path, name: &str) -> PathBuf {
    let (pem, key) = (format!("{name}.pem"), format!("{name}.key"));
    openssl(
        dir,
        &format!(
            "req -x509 -new {NEW_KEY} -keyout {key} -out {pem} -days 2 -subj /CN={name} \
             -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign"
        ),
    );
    dir.join(pem)
}

/// A certificate that CA `ca` signs for 127.0.0.1, for a server or a client (`purpose`: serverAuth or
/// clientAuth): `NAME.pem` and `NAME.key` in `dir`.
fn make_leaf(dir: &Path, ca: &str, name: &str, purpose: &str) -> (PathBuf, PathBuf) {
    let (pem, key, csr, ext) = (
        format!("{name}.pem"),
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.ext"),
    );
    std::fs::write(
        dir.join(&ext),
        format!(
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=critical,CA:FALSE\n\
             keyUsage=critical,digitalSignature\nextendedKeyUsage={purpose}\n"
        ),
    )
    .unwrap();
    openssl(
        dir,
        &format!("req -new {NEW_KEY} -keyout {key} -out {csr} -subj /CN={name}"),
    );
    openssl(
        dir,
        &format!(
            "x509 -req -in {csr} -CA {ca}.pem -CAkey {ca}.key -CAcreateserial -out {pem} -days 2 \
             -extfile {ext}"
        ),
    );
    (dir.join(pem), dir.join(key))
}

/// An HTTPS client that trusts `ca` only, with a client certificate when one is given.
fn client(ca: &Path, identity: Option<(&Path, &Path)>) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(ca).unwrap()).unwrap();
    let mut builder = reqwest::Client::builder()
        .tls_certs_only([ca])
        .timeout(Duration::from_secs(10));
    if let Some((cert, key)) = identity {
        let mut pem = std::fs::read(cert).unwrap();
        pem.extend(std::fs::read(key).unwrap());
        builder = builder.identity(reqwest::Identity::from_pem(&pem).unwrap());
    }
    builder.build().unwrap()
}

/// The `tls` section of a configuration.
fn tls_section(cert: &Path, key: &Path, client_ca: Option<&Path>) -> String {
    let client_ca = client_ca.map_or(String::new(), |ca| format!(", client_ca_file: {ca:?}"));
    format!("tls: {{ cert_file: {cert:?}, key_file: {key:?}{client_ca} }}\n")
}

fn path(p: &Path) -> &str {
    p.to_str().unwrap()
}

// Two workers: the CLI runs blocking on one while the tool answers on the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signed_call_over_https_with_the_ca_file_and_a_foreign_ca_refused() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path();
    let ca = make_ca(pki, "ca");
    let other_ca = make_ca(pki, "other-ca");
    let (cert, key) = make_leaf(pki, "ca", "server", "serverAuth");
    let (mut gw, tool) = Gateway::start(pki, &tls_section(&cert, &key, None)).await;
    assert!(gw.base.starts_with("https://127.0.0.1:"), "{}", gw.base);
    gw.client = client(&ca, None);
    let (signing, token) = gw.session("exec-tls").await;

    // `sealgate invoke` over HTTPS, trusting the gateway's CA.
    use base64::Engine;
    let seed = base64::engine::general_purpose::STANDARD.encode(signing.to_bytes());
    let payload = tool_call(1, "tool.off", json!({})).to_string();
    let invoke = |ca_file: &Path| {
        run_cli(&[
            "invoke",
            "--url",
            &gw.base,
            "--ca-file",
            path(ca_file),
            "--key",
            &seed,
            "--token",
            &token,
            "--payload",
            &payload,
        ])
    };
    let (status, out) = invoke(&ca);
    assert_eq!(status, 0, "{out}");
    let answer: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(answer["status"], "success", "{answer}");
    assert_eq!(tool.count(), 1);

    // A CA that did not sign the gateway's certificate: refused, and the message says why.
    let (status, out) = invoke(&other_ca);
    assert_ne!(status, 0, "{out}");
    assert!(out.contains("certificate"), "{out}");
    assert_eq!(tool.count(), 1);

    // `sealgate health` and the probes, over TLS too.
    for probe in ["healthz", "readyz"] {
        let url = format!("{}/{probe}", gw.base);
        let (status, out) = run_cli(&["health", "--url", &url, "--ca-file", path(&ca)]);
        assert_eq!(status, 0, "{out}");
        let (status, out) = run_cli(&["health", "--url", &url, "--ca-file", path(&other_ca)]);
        assert_ne!(status, 0, "{out}");
    }
    // Plain HTTP on the TLS listener gets no answer.
    let plain = reqwest::get(gw.base.replace("https://", "http://") + "/healthz").await;
    assert!(plain.is_err(), "{plain:?}");
}

/// `openssl s_client` against the gateway with `version` (`-tls1_1`, `-tls1_2`, …); returns its output.
fn handshake(base: &str, ca: &Path, version: &str) -> String {
    let host = base.trim_start_matches("https://");
    // SECLEVEL=0 lets this openssl offer TLS 1.1 at all: the refusal must come from the gateway.
    let out = Command::new("openssl")
        .args([
            "s_client",
            "-connect",
            host,
            version,
            "-cipher",
            "DEFAULT:@SECLEVEL=0",
        ])
        .args(["-CAfile", path(ca), "-verify_return_error", "-brief"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("openssl runs");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test]
async fn tls_1_1_is_refused_and_1_2_and_1_3_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path();
    let ca = make_ca(pki, "ca");
    let (cert, key) = make_leaf(pki, "ca", "server", "serverAuth");
    let (gw, _tool) = Gateway::start(pki, &tls_section(&cert, &key, None)).await;
    // The gateway answers a TLS 1.1 hello with an alert ("read_bytes": received, not sent).
    let old = handshake(&gw.base, &ca, "-tls1_1");
    assert!(
        old.contains("read_bytes:sslv3 alert") && old.contains("SSL alert number"),
        "{old}"
    );
    assert!(!old.contains("Protocol version:"), "{old}");
    for (flag, version) in [("-tls1_2", "TLSv1.2"), ("-tls1_3", "TLSv1.3")] {
        let served = handshake(&gw.base, &ca, flag);
        assert!(
            served.contains(&format!("Protocol version: {version}")),
            "{served}"
        );
    }
}

#[tokio::test]
async fn mutual_tls_refuses_a_client_without_a_certificate_from_the_client_ca() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path();
    let ca = make_ca(pki, "ca");
    let client_ca = make_ca(pki, "client-ca");
    make_ca(pki, "rogue-ca");
    let (cert, key) = make_leaf(pki, "ca", "server", "serverAuth");
    let (agent_cert, agent_key) = make_leaf(pki, "client-ca", "agent", "clientAuth");
    let (rogue_cert, rogue_key) = make_leaf(pki, "rogue-ca", "rogue", "clientAuth");
    let section = tls_section(&cert, &key, Some(&client_ca));
    let (mut gw, _tool) = Gateway::start(pki, &section).await;
    gw.client = client(&ca, Some((&agent_cert, &agent_key)));
    let url = format!("{}/healthz", gw.base);
    let health = |identity: Option<(&Path, &Path)>| {
        let mut args = vec!["health", "--url", &url, "--ca-file", path(&ca)];
        if let Some((cert, key)) = identity {
            args.extend(["--client-cert", path(cert), "--client-key", path(key)]);
        }
        run_cli(&args)
    };
    let (status, out) = health(Some((&agent_cert, &agent_key)));
    assert_eq!(status, 0, "{out}");
    let (status, out) = health(None);
    assert_ne!(status, 0, "without a client certificate: {out}");
    let (status, out) = health(Some((&rogue_cert, &rogue_key)));
    assert_ne!(status, 0, "with a certificate of another CA: {out}");
    // The control API works for the client with its certificate.
    let (key, token) = gw.session("exec-mtls").await;
    let (status, body) = gw
        .call(&key, &token, tool_call(1, "tool.off", json!({})))
        .await;
    assert_eq!(status, 200, "{body}");
}

/// Replaces `target` by `source` in one rename, as a deployment tool would.
fn replace(source: &Path, target: &Path) {
    let staged = target.with_extension("staged");
    std::fs::copy(source, &staged).unwrap();
    std::fs::rename(staged, target).unwrap();
}

#[tokio::test]
async fn replaced_certificate_files_serve_new_connections_and_keep_open_ones() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path();
    let ca = make_ca(pki, "ca");
    let next_ca = make_ca(pki, "next-ca");
    let (first_cert, first_key) = make_leaf(pki, "ca", "first", "serverAuth");
    let (next_cert, next_key) = make_leaf(pki, "next-ca", "next", "serverAuth");
    let (cert, key) = (pki.join("server.pem"), pki.join("server.key"));
    replace(&first_cert, &cert);
    replace(&first_key, &key);
    let (gw, _tool) = Gateway::start(pki, &tls_section(&cert, &key, None)).await;
    let url = format!("{}/healthz", gw.base);
    // A client that trusts the first CA only, with a kept-alive connection.
    let kept = client(&ca, None);
    assert_eq!(kept.get(&url).send().await.unwrap().status(), 200);

    replace(&next_key, &key);
    replace(&next_cert, &cert);
    let fresh = client(&next_ca, None);
    until(
        Duration::from_secs(10),
        "a new handshake with the new certificate",
        || async { fresh.get(&url).send().await.is_ok() },
    )
    .await;
    // The open connection goes on (a new one would meet a certificate its client does not trust)...
    assert_eq!(kept.get(&url).send().await.unwrap().status(), 200);
    // ...while a new connection that trusts only the first CA is refused.
    assert!(client(&ca, None).get(&url).send().await.is_err());
}

#[test]
fn serve_check_names_the_tls_file_that_does_not_load() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path();
    make_ca(pki, "ca");
    let (cert, _) = make_leaf(pki, "ca", "server", "serverAuth");
    let (_, other_key) = make_leaf(pki, "ca", "other", "serverAuth");
    let check = |tls: &str| {
        let config = pki.join("check.yaml");
        std::fs::write(&config, tls).unwrap();
        run_cli(&["serve", "--check", "--config", path(&config)])
    };
    let (status, out) = check(&tls_section(&cert, &pki.join("missing.key"), None));
    assert_ne!(status, 0);
    assert!(out.contains("tls.key_file: cannot read"), "{out}");
    let (status, out) = check(&tls_section(&cert, &other_key, None));
    assert_ne!(status, 0);
    assert!(out.contains("tls.cert_file and tls.key_file"), "{out}");
    let (status, out) = check(&format!("tls: {{ cert_file: {cert:?} }}\n"));
    assert_ne!(status, 0);
    assert!(
        out.contains("tls.key_file: is required with tls.cert_file"),
        "{out}"
    );
}

#[test]
fn the_demo_tours_over_https_with_a_certificate_of_its_own() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sealgate"))
        .args(["demo", "--tls"])
        .env("TMPDIR", tmp.path())
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        printed.contains("a real gateway on https://127.0.0.1:"),
        "{printed}"
    );
    assert!(printed.contains("curl --cacert"), "{printed}");
    assert!(printed.contains("claim PROCEED"), "{printed}");
}
