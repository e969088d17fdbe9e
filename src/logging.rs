//! The process's own log on standard error (not the audit trail): the `log:` section of the configuration
//! (a level, text or JSON lines), `RUST_LOG` for full filter directives, and colour only on a terminal.
//!
//! No line holds a credential (SPEC 9.1 r3): every line passes through [`crate::redact::scrub`] on its
//! way out, and libraries that log the messages they carry are held to a level where they do not. In
//! JSON mode every line the process writes once the configuration is read is one JSON object: the
//! ready line, a fatal error and a panic included.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use tracing_subscriber::filter::{FilterExt, LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

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

/// `serve`: the log that the configuration's `log:` section asks for.
pub fn start_for_serve(config: &LogConfig) -> Result<(), String> {
    start(config, std::env::var("RUST_LOG").ok().as_deref())
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

/// Libraries that log whole messages they carry, held at this level whatever `RUST_LOG` asks (a more
/// specific directive cannot lift the cap, as it could lift a plain directive): rmcp logs every JSON-RPC
/// request and answer, arguments and results included, at debug and trace, and unexpected ones at warn;
/// tokio-postgres logs every statement's parameters (sessions, claims with their stored answers, audit
/// events) at debug.
const CARRIERS: &[(&str, LevelFilter)] = &[
    ("rmcp", LevelFilter::ERROR),
    ("tokio_postgres", LevelFilter::INFO),
];

/// Set once `serve` starts a JSON log: the lines written outside `tracing` follow it.
static JSON_LINES: AtomicBool = AtomicBool::new(false);

/// Installs the process-wide subscriber. A host that installed its own first keeps it.
fn start(config: &LogConfig, rust_log: Option<&str>) -> Result<(), String> {
    let cap = CARRIERS.iter().fold(
        Targets::new().with_default(LevelFilter::TRACE),
        |cap, (target, level)| cap.with_target(*target, *level),
    );
    let filter = filter(config.level, rust_log)?.and(cap);
    let layer = tracing_subscriber::fmt::layer().with_writer(|| Scrubbed(std::io::stderr()));
    let layer = match config.format {
        LogFormat::Text => layer.with_ansi(colour_on_stderr()).boxed(),
        // Fields at the top level of each object: what log collectors index without a mapping.
        LogFormat::Json => layer.json().flatten_event(true).boxed(),
    };
    let installed = tracing_subscriber::registry()
        .with(layer.with_filter(filter))
        .try_init();
    if installed.is_ok() && config.format == LogFormat::Json {
        JSON_LINES.store(true, Ordering::Relaxed);
        std::panic::set_hook(Box::new(|info| {
            let location = info
                .location()
                .map(|l| format!("{}:{}", l.file(), l.line()));
            let message = info
                .payload()
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| info.payload().downcast_ref::<String>().cloned())
                .unwrap_or_default();
            let fields = json!({"panic": message, "location": location});
            write_line(
                &mut std::io::stderr(),
                "ERROR",
                "the process panicked",
                fields,
            );
        }));
    }
    Ok(())
}

/// Standard error with every URL in a line shown without its userinfo and query ([`crate::redact`]).
/// The formatter hands each whole line to one `write`.
struct Scrubbed<W>(W);

impl<W: Write> Write for Scrubbed<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match std::str::from_utf8(buf) {
            Ok(text) => self.0.write_all(crate::redact::scrub(text).as_bytes())?,
            Err(_) => self.0.write_all(buf)?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// One line in the shape of the JSON log's own lines: time, level, target, message, then `fields`.
fn write_line(out: &mut impl Write, level: &str, message: &str, fields: Value) {
    let mut line = Map::new();
    line.insert(
        "timestamp".into(),
        Value::from(chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true)),
    );
    line.insert("level".into(), Value::from(level));
    line.insert("target".into(), Value::from("sealgate"));
    line.insert("message".into(), Value::from(message));
    if let Value::Object(fields) = fields {
        line.extend(fields);
    }
    let text = crate::redact::scrub(&Value::Object(line).to_string()).into_owned();
    // A closed stream must not stop the process: nobody is left to read the line.
    let _ = writeln!(out, "{text}");
}

/// The one line on standard output that says the gateway serves (scripts and tests wait for it and
/// learn the port from it): `sealgate ready on URL`, or in JSON mode
/// `{"message": "sealgate ready", "listen": URL, …}`.
pub fn announce_ready(listen_url: &str) {
    let mut stdout = std::io::stdout().lock();
    if JSON_LINES.load(Ordering::Relaxed) {
        write_line(
            &mut stdout,
            "INFO",
            "sealgate ready",
            json!({"listen": listen_url}),
        );
    } else {
        let _ = writeln!(stdout, "sealgate ready on {listen_url}");
    }
}

/// The error that ends the process, on standard error: `sealgate: MESSAGE`, or a JSON line.
pub fn fatal(message: &str) {
    if JSON_LINES.load(Ordering::Relaxed) {
        write_line(&mut std::io::stderr(), "ERROR", message, Value::Null);
    } else {
        eprintln!("sealgate: {}", crate::redact::scrub(message));
    }
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
}
