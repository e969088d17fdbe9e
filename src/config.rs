//! The configuration of SPEC section 11: YAML with a default for every key, `env:NAME` values read from
//! the environment, and `SEALGATE_<SECTION>__<KEY>` overrides. Relative paths are resolved against the
//! folder of the configuration file (the working directory when there is none).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

use crate::audit::AuditConfig;
use crate::logging::LogConfig;
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
    pub policies_dir: PathBuf,
    pub limits: Limits,
    pub sessions: Sessions,
    pub agent_tokens: AgentTokenConfig,
    pub operator_auth: OperatorAuthConfig,
    pub upstreams: BTreeMap<String, UpstreamConfig>,
    pub audit: AuditConfig,
    pub log: LogConfig,
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
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Sessions {
    pub max_lifetime_secs: i64,
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

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:8089".into(),
            data_dir: "./data".into(),
            store: "embedded".into(),
            replica_id: host_name(),
            policies_dir: "./policies".into(),
            limits: Limits::default(),
            sessions: Sessions::default(),
            agent_tokens: AgentTokenConfig::default(),
            operator_auth: OperatorAuthConfig::default(),
            upstreams: BTreeMap::new(),
            audit: AuditConfig::default(),
            log: LogConfig::default(),
            base_dir: PathBuf::from("."),
        }
    }
}

/// Every key that a `SEALGATE_*` variable may set (SPEC 11), as paths.
const OVERRIDABLE: &[&str] = &[
    "listen",
    "data_dir",
    "store",
    "replica_id",
    "policies_dir",
    "limits.max_body_bytes",
    "limits.max_clock_skew_secs",
    "limits.header_read_timeout_secs",
    "limits.body_read_timeout_secs",
    "limits.max_concurrent_calls",
    "limits.store_retry_secs",
    "sessions.max_lifetime_secs",
    "agent_tokens.issuer",
    "agent_tokens.audience",
    "agent_tokens.leeway_secs",
    "agent_tokens.keys",
    "agent_tokens.issuer_key",
    "operator_auth.audience",
    "operator_auth.issuer",
    "operator_auth.keys",
    "operator_auth.leeway_secs",
    "upstreams",
    "audit.file",
    "audit.stdout",
    "audit.include_payloads",
    "audit.rotate_bytes",
    "audit.unauthenticated_per_second",
    "log.level",
    "log.format",
];

impl Config {
    /// Reads the file (or the defaults when `path` is None), then the environment.
    pub fn load(path: Option<&Path>) -> Result<Config, String> {
        let env: Vec<(String, String)> = std::env::vars().collect();
        let (text, base_dir) = match path {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("cannot read config {}: {e}", path.display()))?;
                let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
                (text, base)
            }
            None => (String::new(), PathBuf::from(".")),
        };
        let label = path.map_or("(defaults)".to_string(), |p| p.display().to_string());
        Config::from_yaml(&text, &base_dir, &env).map_err(|e| format!("config {label}: {e}"))
    }

    /// Parses YAML text with the given environment (kept explicit so tests need not touch the process env).
    pub fn from_yaml(
        text: &str,
        base_dir: &Path,
        env: &[(String, String)],
    ) -> Result<Config, String> {
        let mut tree: Value = if text.trim().is_empty() {
            Value::Object(Default::default())
        } else {
            serde_saphyr::from_str(text).map_err(|e| e.to_string())?
        };
        if tree.is_null() {
            tree = Value::Object(Default::default());
        }
        if !tree.is_object() {
            return Err("the configuration must be a mapping".into());
        }
        apply_overrides(&mut tree, env);
        resolve_env_values(&mut tree, env)?;
        let mut config: Config = serde_json::from_value(tree).map_err(|e| e.to_string())?;
        config.base_dir = if base_dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            base_dir.to_path_buf()
        };
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), String> {
        if self.limits.max_body_bytes == 0 {
            return Err("limits.max_body_bytes must be at least 1".into());
        }
        if self.limits.max_clock_skew_secs < 0 {
            return Err("limits.max_clock_skew_secs must not be negative".into());
        }
        if self.limits.header_read_timeout_secs == 0 || self.limits.body_read_timeout_secs == 0 {
            return Err(
                "limits.header_read_timeout_secs and body_read_timeout_secs must be at least 1"
                    .into(),
            );
        }
        if self.limits.max_concurrent_calls == 0 {
            return Err("limits.max_concurrent_calls must be at least 1".into());
        }
        if self.sessions.max_lifetime_secs <= 0 {
            return Err("sessions.max_lifetime_secs must be positive".into());
        }
        if self.replica_id.is_empty() || self.replica_id.chars().count() > 256 {
            return Err("replica_id must be 1 to 256 characters".into());
        }
        if self.store != "embedded"
            && !self.store.starts_with("postgres://")
            && !self.store.starts_with("postgresql://")
        {
            return Err(format!(
                "store must be \"embedded\" or a postgres:// URL, not {:?}",
                self.store
            ));
        }
        Ok(())
    }

    /// A path from the configuration, resolved against the configuration file's folder.
    pub fn resolve(&self, path: &Path) -> PathBuf {
        if path.is_absolute() || self.base_dir == Path::new(".") {
            path.to_path_buf()
        } else {
            self.base_dir.join(path)
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

/// `SEALGATE_LIMITS__MAX_CLOCK_SKEW_SECS=5` sets `limits.max_clock_skew_secs`; values are read as JSON
/// when they parse (numbers, booleans, lists), else as strings. Unknown names are ignored with a warning.
fn apply_overrides(tree: &mut Value, env: &[(String, String)]) {
    for (name, raw) in env {
        let Some(rest) = name.strip_prefix("SEALGATE_") else {
            continue;
        };
        // The log filter of earlier versions; say what replaced it rather than "no configuration key".
        if name == "SEALGATE_LOG" {
            tracing::warn!(
                "SEALGATE_LOG is no longer read; set log.level (SEALGATE_LOG__LEVEL) or RUST_LOG"
            );
            continue;
        }
        let path: Vec<String> = rest.split("__").map(str::to_ascii_lowercase).collect();
        let dotted = path.join(".");
        if !OVERRIDABLE.contains(&dotted.as_str()) {
            tracing::warn!(variable = %name, "environment variable names no configuration key; ignored");
            continue;
        }
        let value = serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.clone()));
        let mut node = &mut *tree;
        for (i, segment) in path.iter().enumerate() {
            let Some(obj) = node.as_object_mut() else {
                break;
            };
            if i + 1 == path.len() {
                obj.insert(segment.clone(), value.clone());
                break;
            }
            node = obj
                .entry(segment.clone())
                .or_insert_with(|| Value::Object(Default::default()));
        }
    }
}

/// Replaces every string `env:NAME` by the variable's value; a missing variable is an error (fail closed).
fn resolve_env_values(value: &mut Value, env: &[(String, String)]) -> Result<(), String> {
    match value {
        Value::String(s) => {
            if let Some(name) = s.strip_prefix("env:") {
                let found = env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
                *s = found.ok_or_else(|| {
                    format!("environment variable {name} (named by \"env:{name}\") is not set")
                })?;
            }
            Ok(())
        }
        Value::Array(items) => items
            .iter_mut()
            .try_for_each(|v| resolve_env_values(v, env)),
        Value::Object(map) => map
            .values_mut()
            .try_for_each(|v| resolve_env_values(v, env)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_of_limits_audit_and_log_can_be_set_from_the_environment() {
        // A key added to a section must be added to OVERRIDABLE too (SPEC 11: every key).
        let limits = [
            "max_body_bytes",
            "max_clock_skew_secs",
            "header_read_timeout_secs",
            "body_read_timeout_secs",
            "max_concurrent_calls",
            "store_retry_secs",
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
            ));
        for key in keys {
            assert!(
                OVERRIDABLE.contains(&key.as_str()),
                "{key} cannot be overridden"
            );
        }
        let config = Config::from_yaml(
            "",
            Path::new("."),
            &env(&[
                ("SEALGATE_LIMITS__MAX_CONCURRENT_CALLS", "7"),
                ("SEALGATE_AUDIT__UNAUTHENTICATED_PER_SECOND", "3"),
            ]),
        )
        .unwrap();
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
    }

    #[test]
    fn replica_id_is_a_key_and_an_override() {
        let config = Config::from_yaml("replica_id: a", Path::new(""), &[]).unwrap();
        assert_eq!(config.replica_id, "a");
        let config =
            Config::from_yaml("", Path::new(""), &env(&[("SEALGATE_REPLICA_ID", "b")])).unwrap();
        assert_eq!(config.replica_id, "b");
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
                ("SEALGATE_NOT__A_KEY", "1"),
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
    }
}
