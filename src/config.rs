//! The configuration of SPEC section 11: YAML with a default for every key, `env:NAME` values read from
//! the environment, and `SEALGATE_<SECTION>__<KEY>` overrides. Relative paths are resolved against the
//! folder of the configuration file (the working directory when there is none).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use crate::audit::AuditConfig;
use crate::logging::LogConfig;
use crate::policy::model::{FieldPath, FieldSegment};
use crate::policy::PolicyError;
use crate::token::{AgentTokenConfig, OperatorAuthConfig};
use crate::upstream::UpstreamConfig;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub listen: String,
    pub data_dir: PathBuf,
    pub store: String,
    /// Names this process in every audit event it writes (SPEC 12 `replica`); default the host name.
    pub replica_id: String,
    /// None: the default `./policies`, made when missing (SPEC 11: `sealgate serve` alone starts).
    pub policies_dir: Option<PathBuf>,
    pub limits: Limits,
    pub sessions: Sessions,
    pub agent_tokens: AgentTokenConfig,
    pub operator_auth: OperatorAuthConfig,
    pub upstreams: BTreeMap<String, UpstreamConfig>,
    pub audit: AuditConfig,
    pub log: LogConfig,
    pub console: ConsoleConfig,
    pub approvals: Approvals,
    /// The gateway's signing key for receipts and audit checkpoints (SPEC 14).
    pub signing: crate::evidence::SigningConfig,
    pub tls: crate::tls::TlsConfig,
    /// OpenTelemetry traces over OTLP (SPEC 11 r3).
    pub telemetry: crate::otel::TelemetryConfig,
    pub metrics: crate::telemetry::MetricsConfig,
    /// Archiving old audit events and removing old settled records (SPEC 12 r3).
    pub retention: crate::retention::RetentionConfig,
    /// MCP hosts over the network with OAuth (SPEC 17).
    pub mcp_server: crate::mcp_server::config::McpServerConfig,
    /// What a tool's answer may not carry back (SPEC 18); a capability's `answer_guard` wins.
    pub answer_guard: crate::guard::AnswerGuardConfig,
    /// Where relative paths start; not a configuration key.
    #[serde(skip)]
    pub base_dir: PathBuf,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    pub max_body_bytes: usize,
    pub max_clock_skew_secs: i64,
    /// A request whose head has not fully arrived within this many seconds gets 408 (SPEC 11 r2).
    pub header_read_timeout_secs: u64,
    /// Likewise for the body, counted from the end of the head.
    pub body_read_timeout_secs: u64,
    /// `/v1/invoke` calls in progress beyond which a new one gets 5006 at once (SPEC 11 r2).
    pub max_concurrent_calls: usize,
    /// How long a call that reached the tool retries writing its outcome before it answers 5005 (SPEC 3 r2).
    pub store_retry_secs: u64,
    /// Open connections beyond which a new one is closed at once (SPEC 11 r3).
    pub max_connections: usize,
    /// A response the client does not take for this long closes its connection (SPEC 11 r3).
    pub write_timeout_secs: u64,
    /// A keep-alive connection with no request for this long is closed (SPEC 11 r3).
    pub idle_timeout_secs: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Sessions {
    pub max_lifetime_secs: i64,
}

/// The operator web console at `/console/` (off by default: a deployment opts in to serving a UI).
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConsoleConfig {
    pub enabled: bool,
}

/// Where new approval requests are announced (SPEC 13).
#[derive(Clone, Default, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct Approvals {
    /// Each new request is POSTed here as JSON.
    pub webhook_url: Option<String>,
    /// `whsec_` + base64: the deliveries are then signed as Standard Webhooks (SPEC 11 r3).
    pub webhook_secret: Option<String>,
    /// The console's address (`https://HOST/console`): the webhook's `console_url` is
    /// `<this>/#/approvals/<approval_id>`.
    pub console_base_url: Option<String>,
}

// Hand-written so that a logged configuration never shows the webhook secret.
impl std::fmt::Debug for Approvals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Approvals")
            .field("webhook_url", &self.webhook_url)
            .field(
                "webhook_secret",
                &self.webhook_secret.as_ref().map(|_| "[redacted]"),
            )
            .field("console_base_url", &self.console_base_url)
            .finish()
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 1024 * 1024,
            max_clock_skew_secs: 30,
            header_read_timeout_secs: 10,
            body_read_timeout_secs: 10,
            max_concurrent_calls: 1024,
            store_retry_secs: 10,
            max_connections: 4096,
            write_timeout_secs: 10,
            idle_timeout_secs: 60,
        }
    }
}

impl Default for Sessions {
    fn default() -> Self {
        Sessions {
            max_lifetime_secs: 86_400,
        }
    }
}

impl Config {
    /// What the MCP endpoint (SPEC 17) reads of the rest of the configuration.
    pub fn mcp_server_surroundings(&self) -> crate::mcp_server::config::Surroundings<'_> {
        crate::mcp_server::config::Surroundings {
            base_dir: &self.base_dir,
            groups_claim: self
                .operator_auth
                .oidc
                .as_ref()
                .map_or("groups", |oidc| oidc.groups_claim.as_str()),
            skew_secs: self.limits.max_clock_skew_secs.unsigned_abs(),
            max_lifetime_secs: self.sessions.max_lifetime_secs,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:8089".into(),
            data_dir: "./data".into(),
            store: "embedded".into(),
            replica_id: host_name(),
            policies_dir: None,
            limits: Limits::default(),
            sessions: Sessions::default(),
            agent_tokens: AgentTokenConfig::default(),
            operator_auth: OperatorAuthConfig::default(),
            upstreams: BTreeMap::new(),
            audit: AuditConfig::default(),
            log: LogConfig::default(),
            console: ConsoleConfig::default(),
            approvals: Approvals::default(),
            signing: crate::evidence::SigningConfig::default(),
            tls: crate::tls::TlsConfig::default(),
            telemetry: crate::otel::TelemetryConfig::default(),
            metrics: crate::telemetry::MetricsConfig::default(),
            retention: crate::retention::RetentionConfig::default(),
            mcp_server: crate::mcp_server::config::McpServerConfig::default(),
            answer_guard: crate::guard::AnswerGuardConfig::default(),
            base_dir: PathBuf::from("."),
        }
    }
}

/// How a `SEALGATE_*` variable's text becomes the key's value.
#[derive(Clone, Copy)]
enum EnvValue {
    /// Taken as written: `SEALGATE_REPLICA_ID=1` is the name "1", not a number.
    Text,
    /// Read as JSON (numbers, booleans, lists, mappings); a scalar that is not JSON is taken as text,
    /// for the typed reading to refuse by name.
    Json,
}

/// The policy folder when `policies_dir` is not set, relative to the configuration's folder.
const DEFAULT_POLICIES_DIR: &str = "./policies";

/// Every key that a `SEALGATE_*` variable may set (SPEC 11), as paths, with how its value is read.
const OVERRIDABLE: &[(&str, EnvValue)] = &[
    ("listen", EnvValue::Text),
    ("data_dir", EnvValue::Text),
    ("store", EnvValue::Text),
    ("replica_id", EnvValue::Text),
    ("policies_dir", EnvValue::Text),
    ("limits.max_body_bytes", EnvValue::Json),
    ("limits.max_clock_skew_secs", EnvValue::Json),
    ("limits.header_read_timeout_secs", EnvValue::Json),
    ("limits.body_read_timeout_secs", EnvValue::Json),
    ("limits.max_concurrent_calls", EnvValue::Json),
    ("limits.store_retry_secs", EnvValue::Json),
    ("limits.max_connections", EnvValue::Json),
    ("limits.write_timeout_secs", EnvValue::Json),
    ("limits.idle_timeout_secs", EnvValue::Json),
    ("sessions.max_lifetime_secs", EnvValue::Json),
    ("agent_tokens.issuer", EnvValue::Text),
    ("agent_tokens.audience", EnvValue::Text),
    ("agent_tokens.leeway_secs", EnvValue::Json),
    ("agent_tokens.keys", EnvValue::Json),
    ("agent_tokens.issuer_key", EnvValue::Text),
    ("operator_auth.audience", EnvValue::Text),
    ("operator_auth.issuer", EnvValue::Text),
    ("operator_auth.keys", EnvValue::Json),
    ("operator_auth.leeway_secs", EnvValue::Json),
    ("operator_auth.oidc", EnvValue::Json),
    ("operator_auth.roles", EnvValue::Json),
    ("upstreams", EnvValue::Json),
    ("audit.file", EnvValue::Text),
    ("audit.stdout", EnvValue::Json),
    ("audit.include_payloads", EnvValue::Json),
    ("audit.rotate_bytes", EnvValue::Json),
    ("audit.unauthenticated_per_second", EnvValue::Json),
    ("audit.checkpoint_every", EnvValue::Json),
    ("audit.checkpoint_secs", EnvValue::Json),
    ("signing.key_file", EnvValue::Text),
    ("signing.previous_public_keys", EnvValue::Json),
    ("signing.replica_public_keys", EnvValue::Json),
    ("log.level", EnvValue::Text),
    ("log.format", EnvValue::Text),
    ("console.enabled", EnvValue::Json),
    ("approvals.webhook_url", EnvValue::Text),
    ("approvals.webhook_secret", EnvValue::Text),
    ("approvals.console_base_url", EnvValue::Text),
    ("tls.cert_file", EnvValue::Text),
    ("tls.key_file", EnvValue::Text),
    ("tls.client_ca_file", EnvValue::Text),
    ("telemetry.otlp_endpoint", EnvValue::Text),
    ("telemetry.sample_ratio", EnvValue::Json),
    ("metrics.listen", EnvValue::Text),
    ("retention.audit_days", EnvValue::Json),
    ("retention.claims_days", EnvValue::Json),
    ("retention.archive_dir", EnvValue::Text),
];

/// `SEALGATE_*` variables that are not configuration (SPEC 11 r3; docs/operations.md lists them too):
/// read by other commands, or by the tests, and left alone by `serve`. Any other `SEALGATE_*`
/// variable that names no key stops start-up, as an unknown YAML key does. An entry ending in `_`
/// is a prefix.
pub const NOT_CONFIGURATION: &[&str] = &[
    // `sealgate connect` (SPEC 15).
    "SEALGATE_GATEWAY",
    "SEALGATE_KEY_FILE",
    "SEALGATE_TOKEN_FILE",
    // The test suite: its store and server (tests/common), and the policy schema's rewrite.
    "SEALGATE_TEST_",
    "SEALGATE_BLESS_SCHEMA",
];

fn is_not_configuration(name: &str) -> bool {
    NOT_CONFIGURATION
        .iter()
        .any(|listed| match listed.strip_suffix('_') {
            Some(_) => name.starts_with(listed),
            None => name == *listed,
        })
}

/// How a `SEALGATE_*` variable says "null" for an optional key, as YAML does: `null` (any case), `~`,
/// or nothing at all. `SEALGATE_AUDIT__FILE=null` turns the audit file off; it never names a file.
fn is_null_text(raw: &str) -> bool {
    let raw = raw.trim();
    raw.is_empty() || raw == "~" || raw.eq_ignore_ascii_case("null")
}

impl Config {
    /// Reads the file (or the defaults when `path` is None), then the environment.
    pub fn load(path: Option<&Path>) -> Result<Config, String> {
        let env: Vec<(String, String)> = std::env::vars().collect();
        let Some(path) = path else {
            return Config::parse("", Path::new("."), &env, None)
                .map_err(|e| format!("config (defaults): {e}"));
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read config {}: {e}", path.display()))?;
        let base_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        // Errors name the file themselves (with the line where one is known).
        Config::parse(&text, &base_dir, &env, Some(path)).map_err(|e| format!("config {e}"))
    }

    /// Parses YAML text with the given environment (kept explicit so tests need not touch the process env).
    pub fn from_yaml(
        text: &str,
        base_dir: &Path,
        env: &[(String, String)],
    ) -> Result<Config, String> {
        Config::parse(text, base_dir, env, None)
    }

    /// Like `from_yaml`; errors name `file` and the line of the key when the text came from one.
    fn parse(
        text: &str,
        base_dir: &Path,
        env: &[(String, String)],
        file: Option<&Path>,
    ) -> Result<Config, String> {
        let mut origins = Origins {
            text,
            file,
            from_env: Vec::new(),
        };
        let mut tree: Value = if text.trim().is_empty() {
            Value::Object(Default::default())
        } else {
            serde_saphyr::from_str(text).map_err(|e| origins.error(FieldPath::root(), e))?
        };
        if tree.is_null() {
            tree = Value::Object(Default::default());
        }
        if !tree.is_object() {
            return Err(origins.error(FieldPath::root(), "the configuration must be a mapping"));
        }
        origins.from_env = apply_overrides(&mut tree, env)?;
        resolve_env_values(&mut tree, env, FieldPath::root(), &mut origins.from_env)
            .map_err(|(path, message)| origins.error(path, message))?;
        let mut config: Config = loop {
            // Configurations are small: a clone per attempt costs nothing worth saving.
            let error = match serde_path_to_error::deserialize(tree.clone()) {
                Ok(config) => break config,
                Err(error) => error,
            };
            let path = crate::policy::load::field_path_from(error.path());
            let from_env_value = origins
                .from_env
                .iter()
                .any(|(set, origin)| *set == path && matches!(origin, EnvOrigin::Value(_)));
            if !(from_env_value && read_as_json(&mut tree, &path)) {
                return Err(origins.error(path, error.inner()));
            }
        };
        config.base_dir = if base_dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            base_dir.to_path_buf()
        };
        config
            .validate()
            .map_err(|(key, message)| origins.error(key_path(key), message))?;
        // Compiled here to refuse a pattern at load, naming its key; the gateway compiles it again.
        if let Err(refused) = crate::guard::Guard::new(&config.answer_guard) {
            let key = FieldPath::root()
                .key("answer_guard")
                .key("secret_patterns")
                .key(&refused.name);
            return Err(origins.error(key, refused.reason));
        }
        let base = config.base_dir.clone();
        for (name, upstream) in config.upstreams.iter_mut() {
            upstream.resolve_paths(&base).map_err(|message| {
                origins.error(FieldPath::root().key("upstreams").key(name), message)
            })?;
        }
        Ok(config)
    }

    /// The first rule broken, with the key that breaks it.
    fn validate(&self) -> Result<(), (&'static str, String)> {
        let fail = |key, message: &str| Err((key, message.to_owned()));
        if self.limits.max_body_bytes == 0 {
            return fail("limits.max_body_bytes", "must be at least 1");
        }
        match (self.audit.rotate_bytes, &self.audit.file) {
            (Some(0), _) => return fail("audit.rotate_bytes", "must be at least 1"),
            (Some(_), None) => return fail("audit.rotate_bytes", "is set but audit.file is not"),
            _ => {}
        }
        if self.audit.checkpoint_every == 0 {
            return fail("audit.checkpoint_every", "must be at least 1");
        }
        if self.audit.checkpoint_secs == 0 {
            return fail("audit.checkpoint_secs", "must be at least 1");
        }
        if self.limits.max_clock_skew_secs < 0 {
            return fail("limits.max_clock_skew_secs", "must not be negative");
        }
        if self.limits.header_read_timeout_secs == 0 {
            return fail("limits.header_read_timeout_secs", "must be at least 1");
        }
        if self.limits.body_read_timeout_secs == 0 {
            return fail("limits.body_read_timeout_secs", "must be at least 1");
        }
        if self.limits.max_concurrent_calls == 0 {
            return fail("limits.max_concurrent_calls", "must be at least 1");
        }
        let front = [
            ("limits.max_connections", self.limits.max_connections as u64),
            ("limits.write_timeout_secs", self.limits.write_timeout_secs),
            ("limits.idle_timeout_secs", self.limits.idle_timeout_secs),
        ];
        if let Some((key, _)) = front.into_iter().find(|(_, value)| *value == 0) {
            return fail(key, "must be at least 1");
        }
        self.tls.validate()?;
        self.retention.validate()?;
        self.telemetry.validate()?;
        if self.sessions.max_lifetime_secs <= 0 {
            return fail("sessions.max_lifetime_secs", "must be positive");
        }
        if self.replica_id.is_empty() || self.replica_id.chars().count() > 256 {
            return fail("replica_id", "must be 1 to 256 characters");
        }
        let urls = [
            ("approvals.webhook_url", &self.approvals.webhook_url),
            (
                "approvals.console_base_url",
                &self.approvals.console_base_url,
            ),
        ];
        for (key, url) in urls {
            if let Some(url) = url {
                let scheme = url::Url::parse(url).map(|u| u.scheme().to_owned());
                if !matches!(scheme.as_deref(), Ok("http" | "https")) {
                    // Not the value: a webhook URL is often itself the credential.
                    return Err((key, "must be an http:// or https:// URL".to_owned()));
                }
            }
        }
        if self.store != "embedded"
            && !self.store.starts_with("postgres://")
            && !self.store.starts_with("postgresql://")
        {
            return Err((
                "store",
                // Not the value: a URL may hold a password.
                "must be \"embedded\" or a postgres:// URL".to_owned(),
            ));
        }
        Ok(())
    }

    /// Whether browsers reach the gateway over HTTPS: its listener speaks TLS (SPEC 16), or its public
    /// address (`approvals.console_base_url`, say a TLS-terminating ingress) is https://. Browsers take
    /// a `__Host-` cookie only when it is `Secure`, so only then can the console sign people in.
    pub fn browsers_use_https(&self) -> bool {
        self.tls.cert_file.is_some()
            || self
                .approvals
                .console_base_url
                .as_deref()
                .is_some_and(|url| url.starts_with("https://"))
    }

    /// A path from the configuration, resolved against the configuration file's folder.
    pub fn resolve(&self, path: &Path) -> PathBuf {
        if path.is_absolute() || self.base_dir == Path::new(".") {
            path.to_path_buf()
        } else {
            self.base_dir.join(path)
        }
    }

    /// `serve`: reads the configuration, starts the log it asks for, then reads it once more so that
    /// what loading reports (an ignored variable, say) is written to that log, in its format. Loading
    /// has no side effects, so the second read differs from the first only in where its warnings go.
    pub fn load_and_start_log(path: Option<&Path>) -> Result<Config, String> {
        let first = tracing::subscriber::with_default(
            tracing::subscriber::NoSubscriber::default(),
            || Config::load(path),
        )?;
        crate::logging::start_for_serve(&first.log)?;
        Config::load(path)
    }

    /// The listener's certificate, key and client CA files, resolved; None without both
    /// `tls.cert_file` and `tls.key_file`.
    pub fn tls_files(&self) -> Option<crate::tls::TlsFiles> {
        let tls = &self.tls;
        let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) else {
            return None;
        };
        Some(crate::tls::TlsFiles {
            cert: self.resolve(cert),
            key: self.resolve(key),
            client_ca: tls.client_ca_file.as_ref().map(|f| self.resolve(f)),
        })
    }

    /// `signing:` with its paths resolved, and what signing needs to know of the store and replica.
    pub fn signing_setup(&self) -> crate::evidence::SigningSetup {
        crate::evidence::SigningSetup {
            key_file: self.signing.key_file.as_deref().map(|f| self.resolve(f)),
            previous_public_keys: (self.signing.previous_public_keys.iter())
                .map(|f| self.resolve(f))
                .collect(),
            replica_public_keys: (self.signing.replica_public_keys.iter())
                .map(|f| self.resolve(f))
                .collect(),
            data_dir: self.resolve(&self.data_dir),
            shared_store: self.store != "embedded",
            replica_id: self.replica_id.clone(),
        }
    }

    /// Where retention writes archive files: `retention.archive_dir`, else `data_dir/archive`, resolved.
    pub fn archive_path(&self) -> PathBuf {
        match &self.retention.archive_dir {
            Some(dir) => self.resolve(dir),
            None => self.resolve(&self.data_dir).join("archive"),
        }
    }

    /// The policy folder's path: `policies_dir`, else `./policies`, resolved.
    pub fn policies_path(&self) -> PathBuf {
        self.resolve(
            self.policies_dir
                .as_deref()
                .unwrap_or(Path::new(DEFAULT_POLICIES_DIR)),
        )
    }

    /// The policy folder. A configured one must exist: a misspelt `policies_dir` would otherwise pass
    /// for an empty folder. The default one cannot be misspelt, and is made when missing.
    pub fn policies_folder(&self) -> Result<PathBuf, String> {
        let dir = self.policies_path();
        if self.policies_dir.is_none() {
            std::fs::create_dir_all(&dir)
                .map_err(|e| format!("policies_dir: cannot create {}: {e}", dir.display()))?;
        }
        match std::fs::metadata(&dir) {
            Ok(meta) if meta.is_dir() => Ok(dir),
            Ok(_) => Err(format!("policies_dir: {} is not a folder", dir.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(format!(
                "policies_dir: {} does not exist; create it (an empty folder is allowed) or correct the path",
                dir.display()
            )),
            Err(e) => Err(format!("policies_dir: {}: {e}", dir.display())),
        }
    }
}

/// The kernel's host name (Linux), else `$HOSTNAME`, else "sealgate": the default `replica_id`, which
/// differs between the containers or machines that replicas usually run on.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "sealgate".to_owned())
}

/// Where the text of a configuration came from, to say where an error is: the file and line of a key,
/// or the environment variable that set it.
struct Origins<'a> {
    text: &'a str,
    file: Option<&'a Path>,
    /// Keys set by `SEALGATE_*` overrides or `env:NAME` values, with the variable named in errors.
    from_env: Vec<(FieldPath, EnvOrigin)>,
}

enum EnvOrigin {
    Override(String),
    Value(String),
}

impl Origins<'_> {
    /// The message of an error at `path`, in the form of policy errors (`FILE:LINE: key: message`).
    fn error(&self, path: FieldPath, message: impl std::fmt::Display) -> String {
        let origin = self
            .from_env
            .iter()
            .filter(|(set, _)| path.0.starts_with(&set.0))
            .map(|(_, origin)| origin)
            .next_back();
        let mut positioned = PolicyError {
            file: self.file.map(Path::to_path_buf),
            line: None,
            field: (!path.is_root()).then(|| path.to_string()),
            message: message.to_string(),
        };
        match origin {
            // The file's line would point at a value the variable replaced.
            Some(EnvOrigin::Override(variable)) => {
                positioned.file = None;
                format!("environment variable {variable}: {positioned}")
            }
            Some(EnvOrigin::Value(variable)) => {
                positioned.line = self.line_of(&path);
                positioned.message = format!(
                    "{} (the value of environment variable {variable}, named by \"env:{variable}\")",
                    positioned.message
                );
                positioned.to_string()
            }
            None => {
                positioned.line = self.line_of(&path);
                positioned.to_string()
            }
        }
    }

    fn line_of(&self, path: &FieldPath) -> Option<usize> {
        self.file?;
        crate::policy::load::locate_line(self.text, path)
    }
}

/// `limits.max_body_bytes` as a field path.
fn key_path(dotted: &str) -> FieldPath {
    dotted.split('.').fold(FieldPath::root(), FieldPath::key)
}

/// `SEALGATE_LIMITS__MAX_CLOCK_SKEW_SECS=5` sets `limits.max_clock_skew_secs`; values are read as JSON
/// when they parse (numbers, booleans, lists), else as strings, and [`is_null_text`] is null for every
/// key. A name that is no key, and not listed in [`NOT_CONFIGURATION`], is an error that names the
/// variable (never its value). Returns the keys set, each with its variable.
fn apply_overrides(
    tree: &mut Value,
    env: &[(String, String)],
) -> Result<Vec<(FieldPath, EnvOrigin)>, String> {
    let mut set = Vec::new();
    for (name, raw) in env {
        let Some(rest) = name.strip_prefix("SEALGATE_") else {
            continue;
        };
        if is_not_configuration(name) {
            continue;
        }
        // The log filter of earlier versions; say what replaced it rather than "no configuration key".
        if name == "SEALGATE_LOG" {
            return Err(
                "environment variable SEALGATE_LOG is no longer read; set log.level \
                 (SEALGATE_LOG__LEVEL) or RUST_LOG, and unset SEALGATE_LOG"
                    .to_owned(),
            );
        }
        let dotted = rest
            .split("__")
            .map(str::to_ascii_lowercase)
            .collect::<Vec<_>>()
            .join(".");
        let kind = OVERRIDABLE
            .iter()
            .find(|(key, _)| *key == dotted)
            .map(|&(_, kind)| kind)
            // `SEALGATE_UPSTREAMS__ECHO`: one upstream, as JSON.
            .or_else(|| names_one_upstream(&dotted).then_some(EnvValue::Json));
        let Some(kind) = kind else {
            return Err(format!(
                "environment variable {name} names no configuration key (a misspelt key?); \
                 unset it, or see docs/operations.md for the variables that are not configuration"
            ));
        };
        let value = match kind {
            _ if is_null_text(raw) => Value::Null,
            EnvValue::Text => Value::String(raw.clone()),
            EnvValue::Json => match serde_json::from_str(raw) {
                Ok(value) => value,
                // A broken list or mapping may hold a secret (a key's `secret`): name the position,
                // never the text.
                Err(e) if raw.trim_start().starts_with(['[', '{']) => {
                    return Err(format!(
                        "environment variable {name}: {dotted}: not valid JSON: {e}"
                    ));
                }
                // A scalar such as "1MB": the typed reading names what was expected.
                Err(_) => Value::String(raw.clone()),
            },
        };
        let (parents, last) = match dotted.rsplit_once('.') {
            Some((parents, last)) => (parents.split('.').collect(), last),
            None => (Vec::new(), dotted.as_str()),
        };
        let not_a_mapping = || {
            format!(
                "environment variable {name}: cannot set {dotted}: a key above it is not a mapping"
            )
        };
        let mut node = &mut *tree;
        for segment in parents {
            let Value::Object(obj) = node else {
                return Err(not_a_mapping());
            };
            node = obj
                .entry(segment)
                .or_insert_with(|| Value::Object(Default::default()));
        }
        let Value::Object(obj) = node else {
            return Err(not_a_mapping());
        };
        obj.insert(last.to_owned(), value);
        set.push((key_path(&dotted), EnvOrigin::Override(name.clone())));
    }
    Ok(set)
}

/// An `env:NAME` value is text; where its key takes a number, a boolean or a list, the text is read as
/// JSON instead. Returns whether the value at `path` changed (so a second attempt can differ).
fn read_as_json(tree: &mut Value, path: &FieldPath) -> bool {
    let mut node = tree;
    for segment in &path.0 {
        let next = match (segment, node) {
            (FieldSegment::Key(key), Value::Object(map)) => map.get_mut(key),
            (FieldSegment::Index(index), Value::Array(items)) => items.get_mut(*index),
            _ => None,
        };
        let Some(next) = next else { return false };
        node = next;
    }
    let Value::String(text) = node else {
        return false;
    };
    match serde_json::from_str::<Value>(text) {
        Ok(parsed) if !parsed.is_string() => {
            *node = parsed;
            true
        }
        _ => false,
    }
}

/// `upstreams.NAME`: one upstream's whole entry.
fn names_one_upstream(dotted: &str) -> bool {
    dotted
        .strip_prefix("upstreams.")
        .is_some_and(|name| !name.is_empty() && !name.contains('.'))
}

/// Replaces every string `env:NAME` by the variable's value; a missing variable is an error (fail closed).
/// Records where each value was put, for errors about it.
fn resolve_env_values(
    value: &mut Value,
    env: &[(String, String)],
    path: FieldPath,
    set: &mut Vec<(FieldPath, EnvOrigin)>,
) -> Result<(), (FieldPath, String)> {
    match value {
        Value::String(s) => {
            if let Some(name) = s.strip_prefix("env:") {
                let Some((_, found)) = env.iter().find(|(k, _)| k == name) else {
                    let message =
                        format!("environment variable {name} (named by \"env:{name}\") is not set");
                    return Err((path, message));
                };
                set.push((path, EnvOrigin::Value(name.to_owned())));
                *s = found.clone();
            }
            Ok(())
        }
        Value::Array(items) => items
            .iter_mut()
            .enumerate()
            .try_for_each(|(i, v)| resolve_env_values(v, env, path.clone().index(i), set)),
        Value::Object(map) => map
            .iter_mut()
            .try_for_each(|(k, v)| resolve_env_values(v, env, path.clone().key(k), set)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logging::{LogFormat, LogLevel};

    #[test]
    fn the_section_has_defaults_and_refuses_unknown_values() {
        let config = Config::from_yaml("", Path::new(""), &[]).unwrap();
        assert_eq!(config.log, LogConfig::default());
        let config = Config::from_yaml(
            "log: { level: debug }",
            Path::new(""),
            &[("SEALGATE_LOG__FORMAT".into(), "json".into())],
        )
        .unwrap();
        assert_eq!(config.log.level, LogLevel::Debug);
        assert_eq!(config.log.format, LogFormat::Json);
        let error = Config::from_yaml("log: { level: loud }", Path::new(""), &[]).unwrap_err();
        assert!(error.contains("loud"), "{error}");
        let error = Config::from_yaml("log: { format: xml }", Path::new(""), &[]).unwrap_err();
        assert!(error.contains("xml"), "{error}");
    }

    #[test]
    fn every_key_of_limits_audit_log_console_and_approvals_can_be_set_from_the_environment() {
        // A key added to a section must be added to OVERRIDABLE too (SPEC 11: every key).
        let limits = [
            "max_body_bytes",
            "max_clock_skew_secs",
            "header_read_timeout_secs",
            "body_read_timeout_secs",
            "max_concurrent_calls",
            "store_retry_secs",
            "max_connections",
            "write_timeout_secs",
            "idle_timeout_secs",
        ];
        let section_keys = |name: &str, section: Value| {
            let keys = section.as_object().unwrap().keys();
            keys.map(|k| format!("{name}.{k}")).collect::<Vec<_>>()
        };
        let keys = limits
            .iter()
            .map(|k| format!("limits.{k}"))
            .chain(section_keys(
                "audit",
                serde_json::to_value(AuditConfig::default()).unwrap(),
            ))
            .chain(section_keys(
                "log",
                serde_json::to_value(LogConfig::default()).unwrap(),
            ))
            .chain(section_keys(
                "console",
                serde_json::to_value(ConsoleConfig::default()).unwrap(),
            ))
            .chain(section_keys(
                "approvals",
                serde_json::to_value(Approvals::default()).unwrap(),
            ))
            .chain(section_keys(
                "tls",
                serde_json::to_value(crate::tls::TlsConfig::default()).unwrap(),
            ))
            .chain(section_keys(
                "telemetry",
                serde_json::to_value(crate::otel::TelemetryConfig::default()).unwrap(),
            ));
        for key in keys {
            assert!(
                OVERRIDABLE.iter().any(|(k, _)| *k == key),
                "{key} cannot be overridden"
            );
        }
        let config = Config::from_yaml(
            "",
            Path::new("."),
            &env(&[
                ("SEALGATE_LIMITS__MAX_CONCURRENT_CALLS", "7"),
                ("SEALGATE_AUDIT__UNAUTHENTICATED_PER_SECOND", "3"),
                ("SEALGATE_CONSOLE__ENABLED", "true"),
            ]),
        )
        .unwrap();
        assert!(config.console.enabled);
        assert_eq!(config.limits.max_concurrent_calls, 7);
        assert_eq!(config.audit.unauthenticated_per_second, 3);
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn every_key_has_a_default() {
        let config = Config::from_yaml("", Path::new(""), &[]).unwrap();
        assert_eq!(config.listen, "127.0.0.1:8089");
        assert_eq!(config.limits.max_body_bytes, 1_048_576);
        assert_eq!(config.limits.max_clock_skew_secs, 30);
        assert_eq!(config.sessions.max_lifetime_secs, 86_400);
        assert_eq!(config.operator_auth.audience, "sealgate-operators");
        assert_eq!(config.store, "embedded");
        assert!(!config.replica_id.is_empty());
        assert!(
            !config.console.enabled,
            "the console is off unless asked for"
        );
    }

    #[test]
    fn replica_id_is_a_key_and_an_override() {
        let config = Config::from_yaml("replica_id: a", Path::new(""), &[]).unwrap();
        assert_eq!(config.replica_id, "a");
        let config =
            Config::from_yaml("", Path::new(""), &env(&[("SEALGATE_REPLICA_ID", "b")])).unwrap();
        assert_eq!(config.replica_id, "b");
        // Text keys take the variable as written, even when it reads as a JSON number.
        let numbered = env(&[("SEALGATE_REPLICA_ID", "1"), ("SEALGATE_LISTEN", "7")]);
        let config = Config::from_yaml("", Path::new(""), &numbered).unwrap();
        assert_eq!(
            (config.replica_id.as_str(), config.listen.as_str()),
            ("1", "7")
        );
        assert!(Config::from_yaml("replica_id: \"\"", Path::new(""), &[]).is_err());
    }

    #[test]
    fn environment_overrides_and_env_values() {
        let yaml = "listen: \"0.0.0.0:1\"\nupstreams:\n  echo:\n    http: { url: \"env:ECHO_URL\" }\n    headers: { Authorization: \"env:TOKEN\" }\n";
        let config = Config::from_yaml(
            yaml,
            Path::new("/etc/sealgate"),
            &env(&[
                ("SEALGATE_LISTEN", "127.0.0.1:0"),
                ("SEALGATE_LIMITS__MAX_CLOCK_SKEW_SECS", "5"),
                ("ECHO_URL", "http://127.0.0.1:9/rpc"),
                ("TOKEN", "Bearer secret"),
            ]),
        )
        .unwrap();
        assert_eq!(config.listen, "127.0.0.1:0");
        assert_eq!(config.limits.max_clock_skew_secs, 5);
        assert_eq!(
            config.upstreams["echo"].headers["Authorization"],
            "Bearer secret"
        );
        assert_eq!(
            config.resolve(Path::new("data")),
            PathBuf::from("/etc/sealgate/data")
        );
        let one = env(&[(
            "SEALGATE_UPSTREAMS__ADDED",
            r#"{"http": {"url": "http://127.0.0.1:9/rpc"}}"#,
        )]);
        let file = "upstreams:\n  kept: { http: { url: \"http://127.0.0.1:8/rpc\" } }\n";
        let config = Config::from_yaml(file, Path::new(""), &one).unwrap();
        let names: Vec<&String> = config.upstreams.keys().collect();
        assert_eq!(names, ["added", "kept"]);
    }

    #[test]
    fn a_variable_that_names_no_key_stops_start_up_unless_it_is_listed_as_not_configuration() {
        let refused = parse_err("", &[("SEALGATE_AUDIT__FLIE", "TopSecret")]);
        assert!(refused.contains("SEALGATE_AUDIT__FLIE"), "{refused}");
        assert!(!refused.contains("TopSecret"), "{refused}");
        let refused = parse_err("", &[("SEALGATE_LOG", "debug")]);
        assert!(refused.contains("SEALGATE_LOG__LEVEL"), "{refused}");
        let listed = env(&[
            ("SEALGATE_GATEWAY", "http://127.0.0.1:8089"),
            ("SEALGATE_KEY_FILE", "k"),
            ("SEALGATE_TOKEN_FILE", "t"),
            ("SEALGATE_TEST_STORE", "postgres"),
            ("SEALGATE_BLESS_SCHEMA", "1"),
        ]);
        Config::from_yaml("", Path::new(""), &listed).unwrap();
    }

    #[test]
    fn null_in_a_variable_is_yaml_null_for_every_key() {
        let yaml = "audit: { file: audit.jsonl }\napprovals: { webhook_url: \"http://h/x\" }\n";
        for null in ["null", "NULL", "~", "", " null "] {
            let vars = env(&[
                ("SEALGATE_AUDIT__FILE", null),
                ("SEALGATE_APPROVALS__WEBHOOK_URL", null),
                ("SEALGATE_METRICS__LISTEN", null),
                ("SEALGATE_POLICIES_DIR", null),
            ]);
            let config = Config::from_yaml(yaml, Path::new(""), &vars).unwrap();
            assert_eq!(config.audit.file, None, "{null:?}");
            assert_eq!(config.approvals.webhook_url, None, "{null:?}");
            assert_eq!(config.metrics.listen, None, "{null:?}");
            assert_eq!(config.policies_dir, None, "{null:?}");
        }
        // A key that cannot be null says so, naming the variable.
        let refused = parse_err("", &[("SEALGATE_LISTEN", "null")]);
        assert!(
            refused.starts_with("environment variable SEALGATE_LISTEN: listen: invalid type: null"),
            "{refused}"
        );
    }

    #[test]
    fn env_values_fill_numbers_and_booleans_and_stay_text_where_text_is_asked() {
        let yaml = "limits: { max_clock_skew_secs: \"env:SKEW\" }\n\
                    audit: { include_payloads: \"env:PAYLOADS\" }\n\
                    replica_id: \"env:REPLICA\"\n\
                    upstreams:\n  a: { http: { url: \"http://127.0.0.1:9/rpc\" }, timeout_ms: \"env:T\", headers: { X-N: \"env:N\" } }\n";
        let vars = env(&[
            ("SKEW", "5"),
            ("PAYLOADS", "true"),
            ("REPLICA", "7"),
            ("T", "250"),
            ("N", "42"),
        ]);
        let config = Config::from_yaml(yaml, Path::new(""), &vars).unwrap();
        assert_eq!(config.limits.max_clock_skew_secs, 5);
        assert!(config.audit.include_payloads);
        assert_eq!(config.replica_id, "7");
        assert_eq!(config.upstreams["a"].timeout_ms, 250);
        assert_eq!(config.upstreams["a"].headers["X-N"], "42");
        // Text that is no number stays an error that names the variable.
        let vars = env(&[
            ("SKEW", "soon"),
            ("PAYLOADS", "true"),
            ("REPLICA", "7"),
            ("T", "1"),
            ("N", "1"),
        ]);
        let err = Config::from_yaml(yaml, Path::new(""), &vars).unwrap_err();
        assert!(err.contains("SKEW"), "{err}");
    }

    #[test]
    fn refuses_unknown_keys_missing_env_and_bad_values() {
        assert!(Config::from_yaml("listn: x", Path::new(""), &[])
            .unwrap_err()
            .contains("listn"));
        assert!(Config::from_yaml("limits: { max_body_bites: 1 }", Path::new(""), &[]).is_err());
        assert!(Config::from_yaml("store: \"env:NOPE\"", Path::new(""), &[])
            .unwrap_err()
            .contains("NOPE"));
        assert!(Config::from_yaml("store: mysql://x", Path::new(""), &[]).is_err());
        assert!(Config::from_yaml("- a list", Path::new(""), &[]).is_err());
        for yaml in [
            "audit: { rotate_bytes: 100 }",
            "audit: { file: a.jsonl, rotate_bytes: 0 }",
        ] {
            let refused = Config::from_yaml(yaml, Path::new(""), &[]).unwrap_err();
            assert!(refused.contains("audit.rotate_bytes"), "{refused}");
        }
    }
    fn parse_err(text: &str, env_pairs: &[(&str, &str)]) -> String {
        let file = Path::new("conf/sealgate.yaml");
        match Config::parse(text, Path::new("conf"), &env(env_pairs), Some(file)) {
            Ok(_) => panic!("should be refused: {text}"),
            Err(e) => e,
        }
    }

    #[test]
    fn errors_name_the_file_line_and_key() {
        let text = "listen: x\nlimits:\n  max_body_bytes: 1MB\n";
        assert_eq!(
            parse_err(text, &[]),
            "conf/sealgate.yaml:3: limits.max_body_bytes: invalid type: string \"1MB\", expected usize"
        );
        let unknown = parse_err("listen: x\nsessions:\n  max_lifetime: 5\n", &[]);
        assert!(
            unknown.starts_with("conf/sealgate.yaml:3: sessions.max_lifetime: unknown field"),
            "{unknown}"
        );
        let rule = parse_err("limits:\n  max_concurrent_calls: 0\n", &[]);
        assert_eq!(
            rule,
            "conf/sealgate.yaml:2: limits.max_concurrent_calls: must be at least 1"
        );
        let nested = parse_err(
            "upstreams:\n  a:\n    http: { url: 5 }\n    timeout_ms: 1s\n",
            &[],
        );
        assert!(
            nested.starts_with("conf/sealgate.yaml:3: upstreams.a.http.url: invalid type"),
            "{nested}"
        );
    }

    #[test]
    fn approval_urls_must_be_http() {
        let config = Config::from_yaml(
            "approvals: { webhook_url: \"https://hooks.example/a\", console_base_url: \"http://c\" }",
            Path::new(""),
            &[],
        )
        .unwrap();
        assert_eq!(
            config.approvals.webhook_url.as_deref(),
            Some("https://hooks.example/a")
        );
        let refused = parse_err("approvals:\n  webhook_url: ftp://x\n", &[]);
        assert_eq!(
            refused,
            "conf/sealgate.yaml:2: approvals.webhook_url: must be an http:// or https:// URL"
        );
        // Values that may hold a credential are never quoted back.
        for (yaml, secret) in [
            ("store: \"mysql://u:TopSecret@h/db\"\n", "TopSecret"),
            (
                "approvals: { webhook_url: \"ftp://hooks/TopSecret\" }\n",
                "TopSecret",
            ),
        ] {
            let refused = parse_err(yaml, &[]);
            assert!(!refused.contains(secret), "{refused}");
        }
        let refused = parse_err(
            "",
            &[(
                "SEALGATE_AGENT_TOKENS__KEYS",
                r#"[{"alg":"HS256","secret":"TopSecret",}]"#,
            )],
        );
        assert!(!refused.contains("TopSecret"), "{refused}");
        assert!(refused.contains("SEALGATE_AGENT_TOKENS__KEYS"), "{refused}");
    }

    #[test]
    fn errors_in_values_from_the_environment_name_the_variable() {
        let overridden = parse_err(
            "limits:\n  max_body_bytes: 10\n",
            &[("SEALGATE_LIMITS__MAX_BODY_BYTES", "1MB")],
        );
        assert_eq!(
            overridden,
            "environment variable SEALGATE_LIMITS__MAX_BODY_BYTES: limits.max_body_bytes: invalid \
             type: string \"1MB\", expected usize"
        );
        let invalid = parse_err("", &[("SEALGATE_LIMITS__MAX_BODY_BYTES", "0")]);
        assert_eq!(
            invalid,
            "environment variable SEALGATE_LIMITS__MAX_BODY_BYTES: limits.max_body_bytes: must be \
             at least 1"
        );
        let whole_section = parse_err("", &[("SEALGATE_UPSTREAMS", "{\"a\": {\"http\": {}}}")]);
        assert!(
            whole_section.starts_with(
                "environment variable SEALGATE_UPSTREAMS: upstreams.a.http: missing field `url`"
            ),
            "{whole_section}"
        );
        let not_a_mapping = parse_err("limits: 5\n", &[("SEALGATE_LIMITS__MAX_BODY_BYTES", "9")]);
        assert!(
            not_a_mapping.starts_with("environment variable SEALGATE_LIMITS__MAX_BODY_BYTES:"),
            "{not_a_mapping}"
        );
        let from_value = parse_err(
            "listen: x\nreplica_id: \"env:REPLICA\"\n",
            &[("REPLICA", "")],
        );
        assert_eq!(
            from_value,
            "conf/sealgate.yaml:2: replica_id: must be 1 to 256 characters (the value of \
             environment variable REPLICA, named by \"env:REPLICA\")"
        );
    }

    #[test]
    fn stdio_commands_with_a_slash_and_cwd_resolve_against_the_config_folder() {
        let yaml = "upstreams:\n  \
                    a: { mcp: { command: ./tools/server.sh, cwd: work } }\n  \
                    b: { mcp: { command: npx } }\n  \
                    c: { mcp: { command: /usr/bin/env, cwd: /srv } }\n";
        let config = Config::from_yaml(yaml, Path::new("/etc/sealgate"), &[]).unwrap();
        let mcp = |name: &str| config.upstreams[name].mcp.clone().unwrap();
        assert_eq!(mcp("a").command.unwrap(), "/etc/sealgate/tools/server.sh");
        assert_eq!(mcp("a").cwd.unwrap(), PathBuf::from("/etc/sealgate/work"));
        assert_eq!(mcp("b").command.unwrap(), "npx");
        assert_eq!(mcp("b").cwd, None);
        assert_eq!(mcp("c").command.unwrap(), "/usr/bin/env");
        assert_eq!(mcp("c").cwd.unwrap(), PathBuf::from("/srv"));
    }

    #[test]
    fn the_policy_folder_must_exist() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::from_yaml("policies_dir: polices", dir.path(), &[]).unwrap();
        let err = config.policies_folder().unwrap_err();
        let missing = dir.path().join("polices");
        assert!(
            err.contains(&format!("{} does not exist", missing.display())),
            "{err}"
        );
        assert!(!missing.exists());
        std::fs::create_dir(&missing).unwrap();
        assert_eq!(config.policies_folder().unwrap(), missing);
    }

    #[test]
    fn the_default_policy_folder_is_made_when_missing() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config::from_yaml("", dir.path(), &[]).unwrap();
        let made = dir.path().join("policies");
        assert_eq!(config.policies_path(), made);
        assert!(!made.exists());
        assert_eq!(config.policies_folder().unwrap(), made);
        assert!(made.is_dir());
    }
}
