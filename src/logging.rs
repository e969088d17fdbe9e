//! The process's own log on standard error (not the audit trail): the `log:` section of the configuration
//! (a level, text or JSON lines), `RUST_LOG` for full filter directives, and colour only on a terminal.

use std::io::IsTerminal;
use std::path::Path;

use serde::{Deserialize, Serialize};
use tracing_subscriber::EnvFilter;

use crate::config::Config;

/// `log:` in the configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// The least severe level written; `RUST_LOG`, when set, replaces it with its own directives.
    pub level: LogLevel,
    pub format: LogFormat,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            level: LogLevel::Info,
            format: LogFormat::Text,
        }
    }
}

/// A level name, not a filter directive: a typo is a configuration error instead of a filter that
/// silently matches nothing (per-module directives are what `RUST_LOG` is for).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogLevel {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
    Off,
}

impl LogLevel {
    fn as_str(self) -> &'static str {
        match self {
            LogLevel::Trace => "trace",
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
            LogLevel::Off => "off",
        }
    }
}

/// `text` for people, `json` (one object per line) for log collectors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// `serve`: reads the configuration, starts the log it asks for, then reads it once more so that what
/// loading reports (an ignored variable, say) is written to that log, in its format. Loading has no
/// side effects, so the second read differs from the first only in where its warnings go.
pub fn load_config_and_start(path: Option<&Path>) -> Result<Config, String> {
    let first =
        tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), || {
            Config::load(path)
        })?;
    start(&first.log, std::env::var("RUST_LOG").ok().as_deref())?;
    Config::load(path)
}

/// Every command but `serve`: warnings and errors as text, unless `RUST_LOG` says otherwise.
pub fn start_for_command() -> Result<(), String> {
    let config = LogConfig {
        level: LogLevel::Warn,
        format: LogFormat::Text,
    };
    start(&config, std::env::var("RUST_LOG").ok().as_deref())
}

/// `sealgate connect`: like every command, but the MCP SDK's and the HTTP stack's own lines are never
/// written, whatever `RUST_LOG` says: they quote whole JSON-RPC messages (argument values) and requests.
pub fn start_for_connect() -> Result<(), String> {
    let mut filter = filter(LogLevel::Warn, std::env::var("RUST_LOG").ok().as_deref())?;
    for quiet in ["rmcp", "hyper", "hyper_util", "h2", "reqwest", "rustls"] {
        filter = filter.add_directive(
            format!("{quiet}=off")
                .parse()
                .map_err(|e| format!("log filter: {e}"))?,
        );
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour_on_stderr())
        .try_init();
    Ok(())
}

/// Installs the process-wide subscriber. A host that installed its own first keeps it.
fn start(config: &LogConfig, rust_log: Option<&str>) -> Result<(), String> {
    let filter = filter(config.level, rust_log)?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match config.format {
        LogFormat::Text => builder.with_ansi(colour_on_stderr()).try_init(),
        // Fields at the top level of each object: what log collectors index without a mapping.
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    Ok(())
}

/// `RUST_LOG` wins as a whole when it is set and not empty; a malformed one is refused, not ignored, so
/// that the operator does not lose the lines they asked for without noticing.
fn filter(level: LogLevel, rust_log: Option<&str>) -> Result<EnvFilter, String> {
    match rust_log.map(str::trim).filter(|s| !s.is_empty()) {
        Some(directives) => EnvFilter::builder()
            .parse(directives)
            .map_err(|e| format!("RUST_LOG {directives:?} is not a log filter: {e}")),
        None => Ok(EnvFilter::new(level.as_str())),
    }
}

/// Colour codes only for a person at a terminal, and never when `NO_COLOR` is set (no-color.org): in a
/// file or a collector they are noise.
fn colour_on_stderr() -> bool {
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_log_replaces_the_level_and_a_bad_one_is_refused() {
        assert_eq!(filter(LogLevel::Warn, None).unwrap().to_string(), "warn");
        assert_eq!(
            filter(LogLevel::Warn, Some(" ")).unwrap().to_string(),
            "warn"
        );
        assert_eq!(
            filter(LogLevel::Warn, Some("sealgate=debug"))
                .unwrap()
                .to_string(),
            "sealgate=debug"
        );
        let error = filter(LogLevel::Info, Some("sealgate=loud")).unwrap_err();
        assert!(error.contains("RUST_LOG \"sealgate=loud\""), "{error}");
    }

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
}
