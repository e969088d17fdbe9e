//! PostgreSQL over TLS (SPEC 11 r3, issue 23) through the real binary, against a PostgreSQL cluster of
//! the test's own: `initdb` and `pg_ctl` from the server packages on the machine, a free port, `ssl = on`
//! with a certificate the test makes (openssl), and `hostssl` lines only, so that the server demands TLS.
//! The cluster is stopped when the test ends.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{tool_call, Gateway};
use serde_json::json;

/// Runs a command to its end; panics with its output when it fails.
fn run(command: &mut Command) -> String {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{command:?} failed:\n{printed}");
    printed
}

/// A CA, and a server certificate it signs for 127.0.0.1 and localhost (but not 127.0.0.2).
struct Certificates {
    ca: PathBuf,
    other_ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
}

fn make_certificates(dir: &Path) -> Certificates {
    let path = |name: &str| dir.join(name);
    let openssl = |args: &[&str]| run(Command::new("openssl").args(args).current_dir(dir));
    // A fresh P-256 key and, with the arguments after it, a request or a self-signed certificate.
    let new_key = |keyout: &str, rest: &[&str]| {
        let mut args = vec![
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
        ];
        args.extend(["-keyout", keyout]);
        args.extend(rest);
        openssl(&args)
    };
    for ca in ["ca", "other-ca"] {
        let (crt, subject) = (format!("{ca}.crt"), format!("/CN=sealgate test {ca}"));
        new_key(
            &format!("{ca}.key"),
            &["-x509", "-out", &crt, "-days", "2", "-subj", &subject],
        );
    }
    new_key(
        "server.key",
        &["-out", "server.csr", "-subj", "/CN=127.0.0.1"],
    );
    std::fs::write(
        path("server.ext"),
        "subjectAltName = IP:127.0.0.1, DNS:localhost\nextendedKeyUsage = serverAuth\n",
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.crt",
        "-days",
        "2",
        "-extfile",
        "server.ext",
    ]);
    Certificates {
        ca: path("ca.crt"),
        other_ca: path("other-ca.crt"),
        server_cert: path("server.crt"),
        server_key: path("server.key"),
    }
}

/// The server binaries of the newest PostgreSQL installed (Debian's layout).
fn server_bin() -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("the PostgreSQL server packages (/usr/lib/postgresql/*/bin)")
        .map(|entry| entry.unwrap().path().join("bin"))
        .filter(|bin| bin.join("initdb").is_file())
        .collect();
    versions.sort();
    versions.pop().expect("initdb in /usr/lib/postgresql/*/bin")
}

/// A cluster that demands TLS, run as `postgres` when the test runs as root (the server refuses root).
struct Cluster {
    data: PathBuf,
    port: u16,
    as_root: bool,
}

impl Cluster {
    /// `program` run in the cluster's folder, as the user that owns it.
    fn command(&self, program: &Path) -> Command {
        let mut command = if self.as_root {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(program);
            command
        } else {
            Command::new(program)
        };
        command.current_dir(self.data.parent().unwrap());
        command
    }

    fn start(dir: &Path, certificates: &Certificates) -> Cluster {
        let as_root = run(Command::new("id").arg("-u")).trim() == "0";
        let cluster = Cluster {
            data: dir.join("data"),
            port: common::mcp::free_port(),
            as_root,
        };
        if as_root {
            run(Command::new("chown").args(["-R", "postgres:"]).arg(dir));
        }
        let bin = server_bin();
        run(cluster
            .command(&bin.join("initdb"))
            .args(["-A", "trust", "-U", "postgres", "-D"])
            .arg(&cluster.data));
        for (from, to) in [
            (&certificates.server_cert, "server.crt"),
            (&certificates.server_key, "server.key"),
        ] {
            std::fs::copy(from, cluster.data.join(to)).unwrap();
        }
        let conf = format!(
            "port = {}\nlisten_addresses = '127.0.0.1,127.0.0.2'\nunix_socket_directories = '{}'\n\
             ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n",
            cluster.port,
            dir.display()
        );
        append(&cluster.data.join("postgresql.conf"), &conf);
        // TLS or nothing, over TCP.
        std::fs::write(
            cluster.data.join("pg_hba.conf"),
            "local all all trust\nhostssl all all 127.0.0.0/8 trust\n",
        )
        .unwrap();
        if as_root {
            run(Command::new("chown").args(["-R", "postgres:"]).arg(dir));
        }
        run(Command::new("chmod")
            .arg("0600")
            .arg(cluster.data.join("server.key")));
        run(cluster
            .command(&bin.join("pg_ctl"))
            .args(["-w", "-t", "60", "-l"])
            .arg(dir.join("server.log"))
            .arg("-D")
            .arg(&cluster.data)
            .arg("start"));
        cluster
    }

    fn url(&self, host: &str, query: &str) -> String {
        format!("postgres://postgres@{host}:{}/postgres?{query}", self.port)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self
            .command(&server_bin().join("pg_ctl"))
            .args(["-m", "immediate", "-D"])
            .arg(&self.data)
            .arg("stop")
            .output();
    }
}

fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    file.write_all(text.as_bytes()).unwrap();
}

/// `serve --check` with `store`; when the check fails, `serve` itself must fail too, and both outputs
/// are returned.
fn check(dir: &Path, store: &str) -> (i32, String) {
    let config = dir.join(format!("check-{}.yaml", uuid::Uuid::new_v4().simple()));
    let policies = dir.join("policies");
    let signing = common::signing_key_file(dir);
    let yaml = format!(
        "listen: \"127.0.0.1:0\"\nstore: {store:?}\npolicies_dir: {policies:?}\n\
         signing: {{ key_file: {signing:?} }}\n"
    );
    std::fs::write(&config, yaml).unwrap();
    let config = config.to_str().unwrap();
    let (status, output) = common::run_cli(&["serve", "--check", "--config", config]);
    if status == 0 {
        return (status, output);
    }
    let start_up = common::run_refused(&["serve", "--config", config], &[]);
    (status, format!("--check: {output}\nserve: {start_up}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_speaks_tls_as_sslmode_says_and_refuses_what_it_cannot_trust() {
    let dir = tempfile::tempdir().unwrap();
    let certificates = make_certificates(dir.path());
    // A folder of its own, which the server's user can reach.
    let cluster_dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(cluster_dir.path(), &certificates);
    std::fs::create_dir(dir.path().join("policies")).unwrap();
    let ca = certificates.ca.to_str().unwrap();
    let other_ca = certificates.other_ca.to_str().unwrap();

    // verify-full: the chain leads to the CA and the certificate names the host.
    let verified = cluster.url(
        "127.0.0.1",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    );
    let (status, output) = check(dir.path(), &verified);
    assert_eq!(status, 0, "{output}");
    let gateway_dir = dir.path().join("gateway");
    let (gw, tool) = Gateway::start(&gateway_dir, &format!("store: {verified:?}\n")).await;
    let (key, token) = gw.session("exec-over-tls").await;
    let (status, body) = gw
        .call(&key, &token, tool_call(1, "tool.off", json!({})))
        .await;
    assert_eq!((status, tool.count()), (200, 1), "{body}");
    // The server saw the gateway's connections encrypted.
    let encrypted = run(Command::new("psql")
        .arg(cluster.url("127.0.0.1", "sslmode=require"))
        .args([
            "-Atc",
            "SELECT bool_and(s.ssl) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
                       WHERE a.application_name = 'sealgate'",
        ]));
    assert_eq!(encrypted.trim(), "t", "{encrypted}");
    drop(gw);

    // The same server under a CA that did not sign its certificate.
    let wrong_ca = cluster.url(
        "127.0.0.1",
        &format!("sslmode=verify-full&sslrootcert={other_ca}"),
    );
    let (status, output) = check(dir.path(), &wrong_ca);
    assert_eq!(status, 1, "{output}");
    assert!(
        output.contains("the server's certificate is not signed by a CA in sslrootcert"),
        "{output}"
    );

    // A host the certificate does not name: verify-full refuses, verify-ca (chain only) connects.
    let other_host =
        |mode: &str| cluster.url("127.0.0.2", &format!("sslmode={mode}&sslrootcert={ca}"));
    let (status, output) = check(dir.path(), &other_host("verify-full"));
    assert_eq!(status, 1, "{output}");
    assert!(
        output.contains("does not name the host \"127.0.0.2\""),
        "{output}"
    );
    let (status, output) = check(dir.path(), &other_host("verify-ca"));
    assert_eq!(status, 0, "{output}");

    // require without a CA encrypts without verifying (as libpq does): this server accepts it.
    let (status, output) = check(dir.path(), &cluster.url("127.0.0.1", "sslmode=require"));
    assert_eq!(status, 0, "{output}");

    // disable against a server that demands TLS: refused, and the refusal says why.
    let (status, output) = check(dir.path(), &cluster.url("127.0.0.1", "sslmode=disable"));
    assert_eq!(status, 1, "{output}");
    assert!(
        output.contains("no pg_hba.conf entry") && output.contains("no encryption"),
        "{output}"
    );

    // A mode the gateway does not know, and a verifying mode without a CA, stop before connecting.
    for (query, said) in [
        ("sslmode=allow", "sslmode \"allow\" is not one of"),
        ("sslmode=verify-full", "needs sslrootcert"),
    ] {
        let (status, output) = check(dir.path(), &cluster.url("127.0.0.1", query));
        assert_eq!(status, 1, "{output}");
        assert!(output.contains(said), "{query}: {output}");
    }
}
