//! The `upstreams` section of the gateway configuration (SPEC section 11) and its validation.
//!
//! Deserialisation only checks the shape; [`validate`] turns one entry into a [`ValidatedUpstream`]
//! whose target can only be one of the supported kinds, so the clients never see a half-valid entry.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;
use url::Url;

fn default_timeout_ms() -> u64 {
    30_000
}

/// One entry of `upstreams:`; exactly one of `http` and `mcp` must be set.
#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct UpstreamConfig {
    /// A plain JSON-RPC endpoint: the call is POSTed as is.
    pub http: Option<HttpUpstreamConfig>,
    /// An MCP server, over Streamable HTTP (`url`) or stdio (`command`).
    pub mcp: Option<McpUpstreamConfig>,
    /// Budget for one call, from the first byte sent to the last byte of the answer.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Extra HTTP headers sent on every request (credentials). `env:NAME` values are resolved by
    /// the config loader before they reach this module.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// How an MCP upstream's tool definitions are pinned (SPEC 18); default `pin: first_use`.
    pub tools: Option<crate::tools::ToolsConfig>,
}

/// `http: {url}`.
#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct HttpUpstreamConfig {
    pub url: String,
}

/// `mcp: {url}` or `mcp: {command, args, env, cwd}`. A `command` with a `/` and a `cwd` are resolved
/// against the configuration file's folder; without `cwd` the server runs in the gateway's own working
/// directory.
#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct McpUpstreamConfig {
    pub url: Option<String>,
    pub command: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub cwd: Option<PathBuf>,
    /// Log every line the server writes on stderr, its calls' time included, where lines may quote
    /// argument values. Off: only what it writes before its first call is logged (SPEC 20 r11).
    #[serde(default)]
    pub log_stderr: bool,
    /// Names in `env` whose values are credentials: the answer guard replaces them in the server's
    /// answers with `[REDACTED]` (SPEC 18), as it does the headers of an HTTP upstream.
    #[serde(default)]
    pub secret_env: Vec<String>,
}

impl UpstreamConfig {
    /// Makes a stdio upstream's relative `command` (one with a `/`, like `./tools/server.sh`) and `cwd`
    /// absolute against `base`, the configuration file's folder; a bare name (`npx`) stays a PATH lookup.
    /// Absolute, because a relative program started with another working directory is found
    /// differently on different platforms.
    pub fn resolve_paths(&mut self, base: &Path) -> Result<(), String> {
        let Some(mcp) = self.mcp.as_mut() else {
            return Ok(());
        };
        if let Some(command) = mcp.command.as_mut() {
            if command.contains('/') && !Path::new(command.as_str()).is_absolute() {
                let resolved = absolute(&base.join(command.as_str()))?;
                *command = resolved.into_os_string().into_string().map_err(|path| {
                    format!("mcp.command: {} is not UTF-8", Path::new(&path).display())
                })?;
            }
        }
        if let Some(cwd) = mcp.cwd.as_mut() {
            if !cwd.is_absolute() {
                *cwd = absolute(&base.join(&cwd))?;
            }
        }
        Ok(())
    }

    /// What would stop a stdio upstream's server from starting, found without starting it: each
    /// problem with its key (`mcp.command`, `mcp.cwd`). Nothing for HTTP upstreams.
    pub fn launch_problems(&self) -> Vec<(&'static str, String)> {
        let Some(mcp) = &self.mcp else {
            return Vec::new();
        };
        let mut problems = Vec::new();
        if let Some(command) = &mcp.command {
            if let Err(problem) = mcp.locate_program(command) {
                problems.push(("mcp.command", problem));
            }
        }
        if let Some(cwd) = &mcp.cwd {
            if !cwd.is_dir() {
                problems.push(("mcp.cwd", format!("{} is not a folder", cwd.display())));
            }
        }
        problems
    }
}

impl McpUpstreamConfig {
    /// Finds the program as the spawn will: a command with a `/` is that file; a bare name is looked up
    /// in the server's PATH (its `env` may set one, else the gateway's own is passed on).
    fn locate_program(&self, command: &str) -> Result<PathBuf, String> {
        if command.contains('/') {
            let path = PathBuf::from(command);
            return if is_executable_file(&path) {
                Ok(path)
            } else {
                Err(format!("{command} is not an executable file"))
            };
        }
        let search = match self.env.get("PATH") {
            Some(path) => path.into(),
            None => std::env::var_os("PATH").unwrap_or_default(),
        };
        std::env::split_paths(&search)
            .map(|dir| dir.join(command))
            .find(|candidate| is_executable_file(candidate))
            .ok_or_else(|| format!("`{command}` is not found on PATH"))
    }
}

fn is_executable_file(path: &Path) -> bool {
    let Ok(meta) = std::fs::metadata(path) else {
        return false;
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        meta.is_file() && meta.permissions().mode() & 0o111 != 0
    }
    #[cfg(not(unix))]
    {
        meta.is_file()
    }
}

fn absolute(path: &Path) -> Result<PathBuf, String> {
    std::path::absolute(path).map_err(|e| format!("cannot resolve {}: {e}", path.display()))
}

/// Where the calls of one upstream go, after validation.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    /// Plain JSON-RPC over HTTP.
    Http { url: Url },
    /// MCP over Streamable HTTP.
    McpHttp { url: Url },
    /// MCP over the stdio of a child process.
    McpStdio(StdioCommand),
}

#[derive(Debug, Clone)]
pub(crate) struct StdioCommand {
    pub command: String,
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: Option<PathBuf>,
    pub log_stderr: bool,
}

#[derive(Debug, Clone)]
pub(crate) struct ValidatedUpstream {
    pub target: Target,
    pub timeout: Duration,
    pub headers: HeaderMap,
    /// What the gateway adds to the calls that is a credential, for the answer guard (SPEC 18).
    pub credentials: Vec<String>,
}

/// Headers that the HTTP clients set themselves; letting the configuration override them would
/// break the protocol (or, for `host`, send credentials somewhere unexpected).
const RESERVED_HEADERS: &[&str] = &[
    "accept",
    "connection",
    "content-length",
    "content-type",
    "host",
    "last-event-id",
    "mcp-protocol-version",
    "mcp-session-id",
    "te",
    "transfer-encoding",
    "upgrade",
];

/// An upstream name is the first segment of a tool name, so it must be one (SPEC section 2).
fn is_valid_upstream_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

pub(crate) fn validate(name: &str, cfg: &UpstreamConfig) -> Result<ValidatedUpstream, String> {
    let fail = |problem: String| format!("upstream `{name}`: {problem}");
    if !is_valid_upstream_name(name) {
        return Err(fail(
            "the name must be 1-128 characters of A-Z a-z 0-9 _ - (it is the first segment of \
             the tool names routed to it)"
                .into(),
        ));
    }
    if cfg.timeout_ms == 0 {
        return Err(fail("timeout_ms must be at least 1".into()));
    }
    if let Some(tools) = &cfg.tools {
        if cfg.mcp.is_none() {
            return Err(fail(
                "tools: only an `mcp` upstream's tool definitions are pinned".into(),
            ));
        }
        crate::tools::compile_denylist(name, &tools.description_denylist)?;
    }
    let target = match (&cfg.http, &cfg.mcp) {
        (Some(_), Some(_)) => {
            return Err(fail("set exactly one of `http` and `mcp`, not both".into()))
        }
        (None, None) => return Err(fail("set exactly one of `http` and `mcp`".into())),
        (Some(http), None) => Target::Http {
            url: parse_url(&http.url).map_err(|e| fail(format!("http.url: {e}")))?,
        },
        (None, Some(mcp)) => match (&mcp.url, &mcp.command) {
            (Some(_), Some(_)) => {
                return Err(fail(
                    "mcp: set exactly one of `url` and `command`, not both".into(),
                ))
            }
            (None, None) => return Err(fail("mcp: set exactly one of `url` and `command`".into())),
            (Some(url), None) => {
                if !mcp.args.is_empty()
                    || !mcp.env.is_empty()
                    || mcp.cwd.is_some()
                    || mcp.log_stderr
                    || !mcp.secret_env.is_empty()
                {
                    return Err(fail(
                        "mcp: `args`, `env`, `cwd`, `log_stderr` and `secret_env` apply only to a \
                         stdio upstream (`command`)"
                            .into(),
                    ));
                }
                Target::McpHttp {
                    url: parse_url(url).map_err(|e| fail(format!("mcp.url: {e}")))?,
                }
            }
            (None, Some(command)) => Target::McpStdio(
                validate_command(command, mcp).map_err(|e| fail(format!("mcp: {e}")))?,
            ),
        },
    };
    if matches!(target, Target::McpStdio(_)) && !cfg.headers.is_empty() {
        return Err(fail(
            "`headers` apply only to HTTP upstreams; pass credentials to a stdio tool through \
             mcp.env"
                .into(),
        ));
    }
    let headers = build_headers(&cfg.headers).map_err(fail)?;
    let credentials = credentials(cfg, &target);
    Ok(ValidatedUpstream {
        target,
        timeout: Duration::from_millis(cfg.timeout_ms),
        headers,
        credentials,
    })
}

/// Every value the gateway adds to this upstream's calls that can be a credential (SPEC 18): each
/// header value, and its token without the scheme (`Bearer abc` → `abc`; a Basic token decoded, and
/// its password); the URL's query values (userinfo is refused above); a stdio server's `secret_env`.
fn credentials(cfg: &UpstreamConfig, target: &Target) -> Vec<String> {
    use base64::Engine as _;
    let mut values = Vec::new();
    for value in cfg.headers.values() {
        values.push(value.clone());
        let Some((scheme, token)) = value.trim().split_once(' ') else {
            continue;
        };
        let token = token.trim();
        values.push(token.to_owned());
        if scheme.eq_ignore_ascii_case("basic") {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(token)
                .ok()
                .and_then(|bytes| String::from_utf8(bytes).ok());
            if let Some(pair) = decoded {
                if let Some((_, password)) = pair.split_once(':') {
                    values.push(password.to_owned());
                }
                values.push(pair);
            }
        }
    }
    match target {
        Target::Http { url } | Target::McpHttp { url } => {
            // As written, and as decoded: a tool may echo either.
            for pair in url.query().unwrap_or_default().split('&') {
                if let Some((_, raw)) = pair.split_once('=') {
                    values.push(raw.to_owned());
                }
            }
            values.extend(url.query_pairs().map(|(_, value)| value.into_owned()));
        }
        Target::McpStdio(command) => {
            for name in cfg.mcp.iter().flat_map(|mcp| &mcp.secret_env) {
                values.extend(command.env.get(name).cloned());
            }
        }
    }
    values
}

/// Problems name the URL's part, never the URL: its query or userinfo may hold a credential.
fn parse_url(raw: &str) -> Result<Url, String> {
    let url = Url::parse(raw).map_err(|e| format!("not a valid URL: {e}"))?;
    if url.scheme() != "http" && url.scheme() != "https" {
        return Err(format!(
            "the URL's scheme is {:?}; it must be http or https",
            url.scheme()
        ));
    }
    if url.host_str().is_none() {
        return Err("the URL has no host".to_owned());
    }
    // Credentials in the URL would be sent as Basic auth and show up in logs; they belong in
    // `headers` with an `env:` value.
    if !url.username().is_empty() || url.password().is_some() {
        return Err("the URL must not carry a user name or password; use `headers`".into());
    }
    Ok(url)
}

fn validate_command(command: &str, mcp: &McpUpstreamConfig) -> Result<StdioCommand, String> {
    if command.trim().is_empty() {
        return Err("`command` is empty".into());
    }
    if command.contains('\0') || mcp.args.iter().any(|a| a.contains('\0')) {
        return Err("`command` and `args` must not contain NUL characters".into());
    }
    if let Some(name) = mcp.secret_env.iter().find(|n| !mcp.env.contains_key(*n)) {
        return Err(format!("secret_env `{name}` is not a key of `env`"));
    }
    for (key, value) in &mcp.env {
        if key.is_empty() || key.contains('=') || key.contains('\0') || value.contains('\0') {
            return Err(format!(
                "env `{key}`: names must be non-empty without `=` or NUL, values without NUL"
            ));
        }
    }
    Ok(StdioCommand {
        command: command.to_owned(),
        args: mcp.args.clone(),
        env: mcp.env.clone(),
        cwd: mcp.cwd.clone(),
        log_stderr: mcp.log_stderr,
    })
}

fn build_headers(raw: &BTreeMap<String, String>) -> Result<HeaderMap, String> {
    let mut headers = HeaderMap::new();
    for (name, value) in raw {
        let header_name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("header `{name}` is not a valid HTTP header name"))?;
        if RESERVED_HEADERS.contains(&header_name.as_str()) {
            return Err(format!(
                "header `{name}` is set by the gateway and cannot be configured"
            ));
        }
        let mut header_value = HeaderValue::from_str(value).map_err(|_| {
            format!("header `{name}` has a value that is not a valid HTTP header value")
        })?;
        // Header values are credentials: keep them out of Debug output.
        header_value.set_sensitive(true);
        // Names differ only in case in a BTreeMap but are the same header on the wire.
        if headers.insert(header_name, header_value).is_some() {
            return Err(format!(
                "header `{name}` is given twice (names are case-insensitive)"
            ));
        }
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_problems_never_quote_the_url() {
        for raw in [
            "htp://h/rpc?key=TopSecret",
            "http://user:TopSecret@h/",
            "TopSecret",
        ] {
            let problem = parse_url(raw).unwrap_err();
            assert!(!problem.contains("TopSecret"), "{problem}");
        }
    }

    fn parse(yaml_json: serde_json::Value) -> Result<UpstreamConfig, serde_json::Error> {
        serde_json::from_value(yaml_json)
    }

    #[test]
    fn http_upstream_validates_with_default_timeout() {
        let cfg = parse(serde_json::json!({"http": {"url": "http://127.0.0.1:9000/rpc"}})).unwrap();
        let v = validate("echo", &cfg).unwrap();
        assert!(matches!(v.target, Target::Http { .. }));
        assert_eq!(v.timeout, Duration::from_millis(30_000));
    }

    #[test]
    fn unknown_keys_are_refused() {
        assert!(parse(serde_json::json!({"http": {"url": "http://x"}, "timeout": 5})).is_err());
        assert!(parse(serde_json::json!({"http": {"url": "http://x", "method": "GET"}})).is_err());
        assert!(parse(serde_json::json!({"mcp": {"command": "x", "argv": []}})).is_err());
    }

    #[test]
    fn exactly_one_kind_and_one_mcp_transport() {
        let both =
            parse(serde_json::json!({"http": {"url": "http://a"}, "mcp": {"url": "http://b"}}))
                .unwrap();
        let err = validate("up", &both).unwrap_err();
        assert!(
            err.contains("upstream `up`") && err.contains("not both"),
            "{err}"
        );
        let none = parse(serde_json::json!({})).unwrap();
        assert!(validate("up", &none).is_err());
        let mcp_both =
            parse(serde_json::json!({"mcp": {"url": "http://b", "command": "x"}})).unwrap();
        assert!(validate("up", &mcp_both).is_err());
        let mcp_none = parse(serde_json::json!({"mcp": {"args": ["a"]}})).unwrap();
        assert!(validate("up", &mcp_none).is_err());
        let url_with_args =
            parse(serde_json::json!({"mcp": {"url": "http://b", "args": ["a"]}})).unwrap();
        assert!(validate("up", &url_with_args).is_err());
        let url_logging_stderr =
            parse(serde_json::json!({"mcp": {"url": "http://b", "log_stderr": true}})).unwrap();
        let err = validate("up", &url_logging_stderr).unwrap_err();
        assert!(err.contains("log_stderr"), "{err}");
    }

    #[test]
    fn bad_names_urls_timeouts_and_headers_are_refused() {
        let ok = parse(serde_json::json!({"http": {"url": "http://a/rpc"}})).unwrap();
        assert!(validate("has.dot", &ok).is_err());
        assert!(validate("", &ok).is_err());
        for url in ["ftp://a/", "not a url", "http://user:pw@a/"] {
            let cfg = parse(serde_json::json!({"http": {"url": url}})).unwrap();
            assert!(validate("up", &cfg).is_err(), "{url}");
        }
        let zero =
            parse(serde_json::json!({"http": {"url": "http://a"}, "timeout_ms": 0})).unwrap();
        assert!(validate("up", &zero).is_err());
        for (name, value) in [
            ("Content-Type", "x"),
            ("bad name", "x"),
            ("x-key", "a\nb"),
            ("Mcp-Session-Id", "s"),
        ] {
            let cfg =
                parse(serde_json::json!({"http": {"url": "http://a"}, "headers": {name: value}}))
                    .unwrap();
            assert!(validate("up", &cfg).is_err(), "{name}");
        }
        let dup = parse(serde_json::json!({"http": {"url": "http://a"}, "headers": {"X-Key": "1", "x-key": "2"}})).unwrap();
        assert!(validate("up", &dup).is_err());
    }

    #[test]
    fn stdio_upstreams_take_no_headers_and_no_nul() {
        let with_headers =
            parse(serde_json::json!({"mcp": {"command": "node"}, "headers": {"x-key": "1"}}))
                .unwrap();
        assert!(validate("fs", &with_headers).is_err());
        let nul =
            parse(serde_json::json!({"mcp": {"command": "node", "args": ["a\u{0}b"]}})).unwrap();
        assert!(validate("fs", &nul).is_err());
        let bad_env =
            parse(serde_json::json!({"mcp": {"command": "node", "env": {"A=B": "1"}}})).unwrap();
        assert!(validate("fs", &bad_env).is_err());
        let good = parse(
            serde_json::json!({"mcp": {"command": "node", "args": ["x.js"], "env": {"A": "1"}}}),
        )
        .unwrap();
        assert!(matches!(
            validate("fs", &good).unwrap().target,
            Target::McpStdio(_)
        ));
    }
    #[test]
    fn launch_problems_find_missing_programs_and_folders_without_starting_anything() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("server.sh");
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        let problems = |mcp: serde_json::Value| {
            let mut cfg = parse(serde_json::json!({ "mcp": mcp })).unwrap();
            cfg.resolve_paths(dir.path()).unwrap();
            cfg.launch_problems()
        };
        // Not executable yet, then executable.
        let found = problems(serde_json::json!({"command": "./server.sh"}));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, "mcp.command");
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        assert!(problems(serde_json::json!({"command": "./server.sh"})).is_empty());
        assert!(problems(serde_json::json!({"command": "sh"})).is_empty());
        // The server's own PATH is the one searched.
        let elsewhere =
            problems(serde_json::json!({"command": "sh", "env": {"PATH": "/nonexistent"}}));
        assert_eq!(elsewhere[0].0, "mcp.command");
        let no_cwd = problems(serde_json::json!({"command": "sh", "cwd": "missing"}));
        assert_eq!(no_cwd.len(), 1);
        assert_eq!(no_cwd[0].0, "mcp.cwd");
        assert!(no_cwd[0].1.contains("missing"), "{no_cwd:?}");
        let http = parse(serde_json::json!({"http": {"url": "http://a"}})).unwrap();
        assert!(http.launch_problems().is_empty());
    }

    #[test]
    fn guard_credentials_are_every_header_token_query_value_and_secret_env() {
        let validated = |entry: serde_json::Value| {
            let cfg: UpstreamConfig = serde_json::from_value(entry).unwrap();
            validate("u", &cfg).map(|v| v.credentials)
        };
        // "user:pass-word-1" in base64.
        let http = validated(serde_json::json!({
            "http": {"url": "http://h/rpc?key=S3cr%2Bt-value&v=1"},
            "headers": {"Authorization": "Bearer tok-12345678", "X-Api": "Basic dXNlcjpwYXNzLXdvcmQtMQ=="}
        }))
        .unwrap();
        for expected in [
            "Bearer tok-12345678",
            "tok-12345678",
            "Basic dXNlcjpwYXNzLXdvcmQtMQ==",
            "user:pass-word-1",
            "pass-word-1",
            "S3cr%2Bt-value",
            "S3cr+t-value",
            "1",
        ] {
            assert!(http.iter().any(|c| c == expected), "{expected}: {http:?}");
        }
        let stdio = validated(serde_json::json!({"mcp": {
            "command": "sh", "env": {"TOKEN": "stdio-secret", "MODE": "fast"}, "secret_env": ["TOKEN"]
        }}))
        .unwrap();
        assert_eq!(stdio, vec!["stdio-secret".to_owned()]);
        let missing =
            validated(serde_json::json!({"mcp": {"command": "sh", "secret_env": ["NONE"]}}));
        assert!(missing.unwrap_err().contains("secret_env `NONE`"));
        let over_http =
            validated(serde_json::json!({"mcp": {"url": "http://h/mcp", "secret_env": ["X"]}}));
        assert!(over_http.unwrap_err().contains("secret_env"));
    }
}
