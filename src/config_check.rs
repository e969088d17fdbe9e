//! `sealgate serve --check`: every problem of a configuration, found without serving (keys read and
//! parsed, policies loaded, upstreams validated and their stdio servers found, URLs parsed, a PostgreSQL
//! store connected to); and the
//! warnings about sections that leave a feature unusable, which `serve` also logs at start-up.
//! Every line names the key it is about.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitCode;

use crate::config::Config;
use crate::policy::ContextRegistry;
use crate::token::{AgentTokenVerifier, OperatorVerifier, TokenMinter};
use crate::upstream::Upstreams;

/// Sections that are valid but leave a feature unusable, given how many contexts are loaded.
pub fn unusable_features(config: &Config, contexts: usize) -> Vec<String> {
    let mut found = Vec::new();
    if config.operator_auth.keys.is_empty() && config.operator_auth.oidc.is_none() {
        found.push(
            "operator_auth.keys: none configured: the control API refuses every request (6001), \
             so no session can be registered"
                .to_owned(),
        );
    }
    if config.operator_auth.oidc.is_some() && !config.browsers_use_https() {
        found.push(
            "operator_auth.oidc: the listener speaks plain HTTP and approvals.console_base_url is not \
             https://: browsers refuse the console's __Host-sealgate cookie without Secure, so only \
             `sealgate login` can sign in; serve HTTPS (tls.cert_file) or set \
             approvals.console_base_url to the gateway's https:// address"
                .to_owned(),
        );
    }
    if config.agent_tokens.keys.is_empty() && config.agent_tokens.issuer_key.is_none() {
        found.push(
            "agent_tokens.keys: none configured and no agent_tokens.issuer_key: every call is \
             refused (1004)"
                .to_owned(),
        );
    }
    if config.mcp_server.enabled && config.mcp_server.people.is_empty() {
        found.push(
            "mcp_server.people: no rule: every person who connects is refused (403)".to_owned(),
        );
    }
    if config.upstreams.is_empty() {
        found.push(
            "upstreams: none configured: every call that a context allows is refused (5004)"
                .to_owned(),
        );
    }
    if contexts == 0 {
        found.push(format!(
            "policies_dir: no security context is loaded ({} holds none): until one is added \
             there or through the API, no session can be registered and /readyz answers 503",
            config.policies_path().display()
        ));
    }
    found
}

/// Stdio upstreams whose server cannot start as configured.
pub fn launch_problems(config: &Config) -> Vec<String> {
    config
        .upstreams
        .iter()
        .flat_map(|(name, upstream)| {
            upstream
                .launch_problems()
                .into_iter()
                .map(move |(key, problem)| {
                    format!("upstreams.{name}.{key}: {problem}; calls to {name}.* get 5001")
                })
        })
        .collect()
}

/// What `--check` found: problems (the gateway would not start, or a part of it cannot work) and
/// warnings (valid, but a feature is unusable).
struct Report {
    problems: Vec<String>,
    warnings: Vec<String>,
    contexts: Option<usize>,
}

/// Every check that needs no network: each part is built as `serve` builds it, so the two cannot
/// disagree about what is valid.
fn check(config: &Config) -> Report {
    let mut problems = Vec::new();
    // These messages already name their key (`agent_tokens.keys[0]: …`). The verifier stops at its
    // first bad key before it reads issuer_key, so the minter is asked on its own too.
    let agent = AgentTokenVerifier::new(&config.agent_tokens, &config.base_dir)
        .err()
        .map(|e| e.to_string());
    let minter = TokenMinter::from_config(&config.agent_tokens, &config.base_dir)
        .err()
        .map(|e| e.to_string());
    problems.extend(minter.clone());
    problems.extend(agent.filter(|e| Some(e) != minter.as_ref()));
    if let Err(e) = OperatorVerifier::new(&config.operator_auth, &config.base_dir) {
        problems.push(e.to_string());
    }
    let skew = config.limits.max_clock_skew_secs.unsigned_abs();
    if let Err(e) = crate::token::relying_party(&config.operator_auth, &config.base_dir, skew) {
        problems.push(e);
    }
    let surroundings = config.mcp_server_surroundings();
    if let Err(e) = crate::mcp_server::McpServer::new(&config.mcp_server, &surroundings) {
        problems.push(e);
    }
    if let Err(e) = crate::approval::Notifier::new(&config.approvals) {
        problems.push(e);
    }
    // One upstream at a time, so that every broken one is listed, not only the first.
    for (name, upstream) in &config.upstreams {
        let one = BTreeMap::from([(name.clone(), upstream.clone())]);
        if let Err(e) = Upstreams::new(&one) {
            problems.push(e);
        }
    }
    problems.extend(launch_problems(config));
    // Binding is left to `serve`; a value that cannot be bound anywhere is caught here.
    let port = config
        .listen
        .rsplit_once(':')
        .map(|(_, port)| port.parse::<u16>());
    if !matches!(port, Some(Ok(_))) {
        problems.push(format!(
            "listen: {:?} is not HOST:PORT (e.g. 127.0.0.1:8089)",
            config.listen
        ));
    }
    problems.extend(crate::evidence::config_problems(&config.signing_setup()));
    if let Err(problem) = crate::tls::check(config.tls_files()) {
        problems.push(problem);
    }
    if let Some(file) = &config.audit.file {
        let file = config.resolve(file);
        let folder = file
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        if !folder.is_dir() {
            problems.push(format!(
                "audit.file: the folder of {} does not exist",
                file.display()
            ));
        } else if file.exists() && !file.is_file() {
            problems.push(format!(
                "audit.file: {} is not a regular file",
                file.display()
            ));
        }
    }
    // The default folder is made at start-up; a check only reads, and finds no contexts there.
    let default_missing = config.policies_dir.is_none() && !config.policies_path().exists();
    let folder = if default_missing {
        Ok(None)
    } else {
        config.policies_folder().map(Some)
    };
    let contexts = match folder {
        Ok(None) => Some(0),
        Ok(Some(dir)) => match ContextRegistry::load(&dir) {
            Ok(registry) => Some(registry.list().len()),
            Err(e) => {
                problems.push(format!("policies_dir: {e}"));
                None
            }
        },
        Err(e) => {
            problems.push(e);
            None
        }
    };
    // The count is of policy files: contexts put through the API are in the store, not opened here.
    // Policies that do not load are already a problem, so no "no context" warning then.
    let warnings = unusable_features(config, contexts.unwrap_or(1));
    Report {
        problems,
        warnings,
        contexts,
    }
}

/// A `postgres://` store is checked as start-up finds it: connected to (with its TLS settings), its
/// database present, its schema not newer than this build knows. Nothing is created or migrated.
async fn store_problem(store: &str) -> Option<String> {
    if store == "embedded" {
        return None;
    }
    // The URL may hold a password: the messages name the problem, never the value.
    crate::store::PgStore::check(store)
        .await
        .err()
        .map(|e| format!("store: {e}"))
}

/// `sealgate serve --check [--config FILE]`: prints each problem and warning on its own line
/// (stderr), then a summary; exits 1 when there is any problem.
pub async fn run(path: Option<&Path>) -> ExitCode {
    let label = path.map_or("(defaults)".to_owned(), |p| p.display().to_string());
    let config = match Config::load(path) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("error: {e}");
            eprintln!("{label}: the configuration does not load; nothing else was checked");
            return ExitCode::FAILURE;
        }
    };
    let mut report = check(&config);
    report.problems.extend(store_problem(&config.store).await);
    for problem in &report.problems {
        eprintln!("error: {problem}");
    }
    for warning in &report.warnings {
        eprintln!("warning: {warning}");
    }
    if !report.problems.is_empty() {
        eprintln!("{label}: {} problem(s)", report.problems.len());
        return ExitCode::FAILURE;
    }
    println!(
        "ok: {label}: {} security context(s), {} upstream(s), {} warning(s)",
        report.contexts.unwrap_or(0),
        config.upstreams.len(),
        report.warnings.len()
    );
    ExitCode::SUCCESS
}
