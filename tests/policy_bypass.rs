//! Adversarial table for the argument checks of SPEC 6.3 (paths 2002, commands 2003, domains 2004).
//!
//! Each row is plain data: the check, the capability's allowlist fields as they appear in a policy
//! file (as JSON), the call's arguments, and the expected outcome. The same rows can be replayed
//! through the full `decide()` by wrapping `config` in a capability with a matching tool pattern.

use std::collections::BTreeMap;

use sealgate::policy::commands::CommandRule;
use sealgate::policy::domains::DomainRule;
use sealgate::policy::paths::PathRule;
use serde_json::{Map, Value};

/// Which argument check a row exercises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    Paths,
    Commands,
    Domains,
}

/// What the call must get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Allow,
    Deny(u16),
}

#[derive(Debug, Clone, Copy)]
pub struct Row {
    pub check: Check,
    /// Capability fields, e.g. `{"path_allowlist": ["/workspace"]}`.
    pub config: &'static str,
    /// The call's `arguments` object.
    pub arguments: &'static str,
    pub expected: Outcome,
    /// What the row attacks or protects.
    pub why: &'static str,
}

use Check::{Commands, Domains, Paths};
use Outcome::{Allow, Deny};

const WORKSPACE: &str = r#"{"path_allowlist": ["/workspace"]}"#;
const GIT: &str = r#"{"command_allowlist": ["git", "ls"], "subcommand_allowlist": {"git": ["status", "log", "diff"]}}"#;
const WEB: &str = r#"{"domain_allowlist": ["example.com", "*.github.com"]}"#;
const LOOPBACK: &str = r#"{"domain_allowlist": ["127.0.0.1"]}"#;

const fn row(
    check: Check,
    config: &'static str,
    arguments: &'static str,
    expected: Outcome,
    why: &'static str,
) -> Row {
    Row {
        check,
        config,
        arguments,
        expected,
        why,
    }
}

/// One row per line: the table reads as data, so rustfmt is told not to explode it.
#[rustfmt::skip]
pub const ROWS: &[Row] = &[
    // ---- paths: bypass attempts -------------------------------------------------------------
    row(Paths, WORKSPACE, r#"{"path": "/workspace/../etc/passwd"}"#, Deny(2002), "dot-dot escape without normalisation (ARCHITECTURE mistake)"),
    row(Paths, WORKSPACE, r#"{"path": "/workspace/a/../../etc"}"#, Deny(2002), "deeper dot-dot escape"),
    row(Paths, WORKSPACE, r#"{"path": "/workspace/.."}"#, Deny(2002), "dot-dot to the parent"),
    row(Paths, WORKSPACE, r#"{"path": "/workspace/./../etc"}"#, Deny(2002), "dot then dot-dot"),
    row(Paths, WORKSPACE, r#"{"path": "/workspace//..//etc"}"#, Deny(2002), "doubled slashes around dot-dot"),
    row(Paths, WORKSPACE, r#"{"path": "/workspace2"}"#, Deny(2002), "string prefix, not a component"),
    row(Paths, WORKSPACE, r#"{"path": "/workspace2/secret"}"#, Deny(2002), "string prefix below"),
    row(Paths, WORKSPACE, r#"{"path": "/workspace.bak/x"}"#, Deny(2002), "sibling with a suffix"),
    row(Paths, WORKSPACE, r#"{"path": "/../workspace/a"}"#, Deny(2002), "dot-dot above / is refused, not clamped"),
    row(Paths, WORKSPACE, r#"{"path": "workspace/a"}"#, Deny(2002), "relative path"),
    row(Paths, WORKSPACE, r#"{"path": "./workspace/a"}"#, Deny(2002), "dot-relative path"),
    row(Paths, WORKSPACE, r#"{"path": "~/workspace"}"#, Deny(2002), "tilde is not expanded, so it is relative"),
    row(Paths, WORKSPACE, r#"{"path": ""}"#, Deny(2002), "empty path"),
    row(Paths, WORKSPACE, r#"{"path": "/workspace/a\u0000/../../etc"}"#, Deny(2002), "NUL byte"),
    row(Paths, WORKSPACE, r#"{"path": "/workspace\\..\\etc"}"#, Deny(2002), "backslashes refused (Windows-style separators)"),
    row(Paths, WORKSPACE, r#"{"path": "/workspace/..\\..\\etc"}"#, Deny(2002), "backslash escape below the allowed directory"),
    row(Paths, WORKSPACE, r#"{"path": "/Workspace/a"}"#, Deny(2002), "case differs"),
    row(Paths, WORKSPACE, r#"{"path": "/w\u043erkspace/a"}"#, Deny(2002), "Cyrillic look-alike letter"),
    row(Paths, WORKSPACE, r#"{"path": "/etc/passwd"}"#, Deny(2002), "plainly outside"),
    row(Paths, WORKSPACE, r#"{"paths": ["/workspace/a", "/etc/shadow"]}"#, Deny(2002), "one bad element in an array"),
    row(Paths, WORKSPACE, r#"{"paths": ["/workspace/a", 7]}"#, Deny(2002), "non-string element in an array"),
    row(Paths, WORKSPACE, r#"{"path": null}"#, Deny(2002), "null value"),
    row(Paths, WORKSPACE, r#"{"path": 1}"#, Deny(2002), "number value"),
    row(Paths, WORKSPACE, r#"{"path": {"value": "/workspace"}}"#, Deny(2002), "object value"),
    row(Paths, WORKSPACE, r#"{"path": [["/workspace"]]}"#, Deny(2002), "nested array"),
    row(Paths, WORKSPACE, r#"{"path": "/workspace/a", "destination": "/etc/cron.d/x"}"#, Deny(2002), "good source, bad destination"),
    row(Paths, WORKSPACE, r#"{"cwd": "/"}"#, Deny(2002), "cwd is a default path argument"),
    row(Paths, WORKSPACE, r#"{"directory": "/workspace/../../"}"#, Deny(2002), "directory argument climbing above /"),
    row(Paths, r#"{"path_allowlist": ["/workspace"], "path_arguments": ["target"]}"#, r#"{"target": "/etc"}"#, Deny(2002), "custom path argument is checked"),
    // ---- paths: what must keep working -------------------------------------------------------
    row(Paths, WORKSPACE, r#"{"path": "/workspace"}"#, Allow, "the directory itself"),
    row(Paths, WORKSPACE, r#"{"path": "/workspace/"}"#, Allow, "trailing slash"),
    row(Paths, WORKSPACE, r#"{"path": "//workspace//a"}"#, Allow, "doubled slashes collapse"),
    row(Paths, WORKSPACE, r#"{"path": "/workspace/./a"}"#, Allow, "dot component"),
    row(Paths, WORKSPACE, r#"{"path": "/workspace/a/../b"}"#, Allow, "dot-dot staying inside"),
    row(Paths, WORKSPACE, r#"{"path": "/workspace/%2e%2e/etc"}"#, Allow, "percent signs are literal file names"),
    row(Paths, WORKSPACE, r#"{"path": "/workspace/..."}"#, Allow, "three dots is a file name"),
    row(Paths, WORKSPACE, r#"{"paths": ["/workspace/a", "/workspace/b"], "mode": 420}"#, Allow, "arrays and unrelated keys"),
    row(Paths, WORKSPACE, r#"{"query": "/etc/passwd"}"#, Allow, "no path argument at all"),
    row(Paths, r#"{"path_allowlist": ["/"]}"#, r#"{"path": "/etc/passwd"}"#, Allow, "root allows every absolute path"),
    row(Paths, r#"{"path_allowlist": ["/workspace"], "path_arguments": ["target"]}"#, r#"{"path": "/etc"}"#, Allow, "custom path_arguments replace the default list"),
    // ---- commands: bypass attempts -----------------------------------------------------------
    row(Commands, GIT, r#"{"command": "git status; rm -rf /"}"#, Deny(2003), "command chaining"),
    row(Commands, GIT, r#"{"command": "git status\\;rm"}"#, Deny(2003), "escaped semicolon is still refused"),
    row(Commands, GIT, r#"{"command": "git status && rm -rf /"}"#, Deny(2003), "and-list"),
    row(Commands, GIT, r#"{"command": "git status || rm -rf /"}"#, Deny(2003), "or-list"),
    row(Commands, GIT, r#"{"command": "git status | sh"}"#, Deny(2003), "pipe"),
    row(Commands, GIT, r#"{"command": "git status & rm -rf /"}"#, Deny(2003), "background job"),
    row(Commands, GIT, r#"{"command": "git log > /etc/passwd"}"#, Deny(2003), "output redirection"),
    row(Commands, GIT, r#"{"command": "git log < /etc/shadow"}"#, Deny(2003), "input redirection"),
    row(Commands, GIT, r#"{"command": "git $(rm -rf /)"}"#, Deny(2003), "command substitution"),
    row(Commands, GIT, r#"{"command": "git `rm -rf /`"}"#, Deny(2003), "backquote substitution"),
    row(Commands, GIT, r#"{"command": "git \"a$b\""}"#, Deny(2003), "dollar inside double quotes"),
    row(Commands, GIT, r#"{"command": "git \"\\$(id)\""}"#, Deny(2003), "escaped dollar inside double quotes"),
    row(Commands, GIT, r#"{"command": "git status $IFS"}"#, Deny(2003), "variable expansion"),
    row(Commands, GIT, r#"{"command": "git status\nrm -rf /"}"#, Deny(2003), "newline"),
    row(Commands, GIT, r#"{"command": "git status \\\nrm -rf /"}"#, Deny(2003), "escaped newline (line continuation)"),
    row(Commands, GIT, r#"{"command": "git status #'\nrm -rf / #'"}"#, Deny(2003), "quote hidden in a comment to mask a newline"),
    row(Commands, GIT, r#"{"command": "(git status)"}"#, Deny(2003), "subshell"),
    row(Commands, GIT, r#"{"command": "git 'status"}"#, Deny(2003), "single quote that never closes"),
    row(Commands, GIT, r#"{"command": "git \"status"}"#, Deny(2003), "double quote that never closes"),
    row(Commands, GIT, r#"{"command": "git status\u0000"}"#, Deny(2003), "NUL byte"),
    row(Commands, GIT, r#"{"command": "gitx status"}"#, Deny(2003), "prefix of an allowed command (starts_with mistake)"),
    row(Commands, GIT, r#"{"command": "GIT status"}"#, Deny(2003), "case differs"),
    row(Commands, GIT, r#"{"command": "/tmp/x/git status"}"#, Deny(2003), "path to another binary named git"),
    row(Commands, GIT, r#"{"command": "./git status"}"#, Deny(2003), "relative path to a binary named git"),
    row(Commands, GIT, r#"{"command": "env git status"}"#, Deny(2003), "wrapper command"),
    row(Commands, GIT, r#"{"command": "FOO=1 git status"}"#, Deny(2003), "environment assignment prefix"),
    row(Commands, GIT, r#"{"command": "git push --force"}"#, Deny(2003), "subcommand not listed"),
    row(Commands, GIT, r#"{"command": "git -c core.pager=sh log"}"#, Deny(2003), "option value taken as the subcommand"),
    row(Commands, GIT, r#"{"command": "git --version"}"#, Deny(2003), "no subcommand at all"),
    row(Commands, GIT, r#"{"command": ""}"#, Deny(2003), "empty command"),
    row(Commands, GIT, r#"{"command": "   "}"#, Deny(2003), "whitespace-only command"),
    row(Commands, GIT, r#"{"command": []}"#, Deny(2003), "empty array command"),
    row(Commands, GIT, r#"{"args": ["status"]}"#, Deny(2003), "missing command"),
    row(Commands, GIT, r#"{"command": ["git status"]}"#, Deny(2003), "array element holding two words"),
    row(Commands, GIT, r#"{"command": ["git", 1]}"#, Deny(2003), "non-string array element"),
    row(Commands, GIT, r#"{"command": {"git": "status"}}"#, Deny(2003), "object command"),
    row(Commands, GIT, r#"{"command": "git", "args": ["push"]}"#, Deny(2003), "subcommand smuggled through args"),
    row(Commands, GIT, r#"{"command": "git", "args": "status"}"#, Deny(2003), "args that is not an array"),
    row(Commands, GIT, r#"{"command": "git", "args": ["status", 2]}"#, Deny(2003), "non-string args element"),
    row(Commands, GIT, r#"{"command": "", "args": ["git", "status"]}"#, Deny(2003), "empty command with the words in args"),
    // ---- commands: what must keep working ----------------------------------------------------
    row(Commands, GIT, r#"{"command": "git status"}"#, Allow, "plain allowed call"),
    row(Commands, GIT, r#"{"command": "git  status"}"#, Allow, "repeated blanks"),
    row(Commands, GIT, r#"{"command": "\"git\" status"}"#, Allow, "quotes removed by splitting"),
    row(Commands, GIT, r#"{"command": "git log 'a$b;c'"}"#, Allow, "operators inside single quotes"),
    row(Commands, GIT, r#"{"command": "git log \"a;b|c\nd\""}"#, Allow, "operators and newline inside double quotes"),
    row(Commands, GIT, r#"{"command": "git --no-pager diff HEAD~1"}"#, Allow, "options before the subcommand"),
    row(Commands, GIT, r#"{"command": ["git", "log", "--grep=a;b"]}"#, Allow, "array words are literal"),
    row(Commands, GIT, r#"{"command": "git", "args": ["status", "--short"]}"#, Allow, "subcommand from args"),
    row(Commands, GIT, r#"{"command": "ls -la /workspace"}"#, Allow, "command without a subcommand list"),
    // ---- domains: bypass attempts ------------------------------------------------------------
    row(Domains, WEB, r#"{"url": "https://evilexample.com/"}"#, Deny(2004), "suffix without a label boundary (ends_with mistake)"),
    row(Domains, WEB, r#"{"url": "https://example.com.evil.test/"}"#, Deny(2004), "allowed name as a prefix"),
    row(Domains, WEB, r#"{"url": "https://example.com@evil.test/"}"#, Deny(2004), "allowed name as userinfo"),
    row(Domains, WEB, r#"{"url": "https://example.com:443@evil.test/"}"#, Deny(2004), "allowed name and port as userinfo"),
    row(Domains, WEB, r#"{"url": "https://a@evil.test@example.com/"}"#, Deny(2004), "two @ signs: parsers disagree on the host"),
    row(Domains, WEB, r#"{"url": "https://example.com\\@evil.test/"}"#, Deny(2004), "backslash: parsers disagree on the host"),
    row(Domains, WEB, r#"{"url": "https://evil.test\\@example.com/"}"#, Deny(2004), "backslash read as / by WHATWG"),
    row(Domains, WEB, r#"{"url": "https://github.com/"}"#, Deny(2004), "wildcard does not match its own base"),
    row(Domains, WEB, r#"{"url": "https://evilgithub.com/"}"#, Deny(2004), "wildcard suffix without a label boundary"),
    row(Domains, WEB, r#"{"url": "https://api.github.com.evil.test/"}"#, Deny(2004), "wildcard match as a prefix"),
    row(Domains, WEB, r#"{"url": "https://evil.test,api.github.com/"}"#, Deny(2004), "comma some clients read as the end of the host"),
    row(Domains, WEB, r#"{"url": "https://ex\u0430mple.com/"}"#, Deny(2004), "Cyrillic look-alike letter (punycode differs)"),
    row(Domains, WEB, r#"{"url": "ftp://example.com/"}"#, Deny(2004), "scheme other than http(s)"),
    row(Domains, WEB, r#"{"url": "file:///etc/passwd"}"#, Deny(2004), "file URL"),
    row(Domains, WEB, r#"{"url": "javascript:alert(1)//example.com"}"#, Deny(2004), "javascript URL"),
    row(Domains, WEB, r#"{"url": "//example.com/x"}"#, Deny(2004), "scheme-relative URL is not absolute"),
    row(Domains, WEB, r#"{"url": "example.com"}"#, Deny(2004), "bare host name is not a URL"),
    row(Domains, WEB, r#"{"url": " https://example.com/"}"#, Deny(2004), "leading whitespace that WHATWG would trim"),
    row(Domains, WEB, r#"{"url": "https://exa\tmple.com/"}"#, Deny(2004), "tab that WHATWG would strip"),
    row(Domains, WEB, r#"{"url": "https://"}"#, Deny(2004), "empty host"),
    row(Domains, WEB, r#"{"url": "https://example.com../"}"#, Deny(2004), "two trailing dots"),
    row(Domains, WEB, r#"{"urls": ["https://example.com/", "https://evil.test/"]}"#, Deny(2004), "one bad element in urls"),
    row(Domains, WEB, r#"{"uri": "https://evil.test/"}"#, Deny(2004), "uri is checked too"),
    row(Domains, WEB, r#"{"url": null}"#, Deny(2004), "null value"),
    row(Domains, WEB, r#"{"urls": ["https://example.com/", 3]}"#, Deny(2004), "non-string element"),
    row(Domains, WEB, r#"{"url": "http://127.0.0.1/"}"#, Deny(2004), "IP host against name entries"),
    row(Domains, LOOPBACK, r#"{"url": "http://127.0.0.1.nip.io/"}"#, Deny(2004), "IP entry is not a name suffix"),
    row(Domains, LOOPBACK, r#"{"url": "http://[::ffff:127.0.0.1]/"}"#, Deny(2004), "IPv4-mapped IPv6 is a different address"),
    row(Domains, LOOPBACK, r#"{"url": "http://localhost/"}"#, Deny(2004), "name is not the address"),
    // ---- domains: what must keep working -----------------------------------------------------
    row(Domains, WEB, r#"{"url": "https://example.com/a?b#c"}"#, Allow, "exact host"),
    row(Domains, WEB, r#"{"url": "HTTPS://EXAMPLE.com./"}"#, Allow, "case and one trailing dot"),
    row(Domains, WEB, r#"{"url": "https://example.com:8443/"}"#, Allow, "ports are ignored"),
    row(Domains, WEB, r#"{"url": "https://evil.test@example.com/"}"#, Allow, "userinfo never changes the host checked"),
    row(Domains, WEB, r#"{"url": "https://api.github.com/repos"}"#, Allow, "wildcard subdomain"),
    row(Domains, WEB, r#"{"url": "https://a.b.github.com/"}"#, Allow, "wildcard deeper subdomain"),
    row(Domains, WEB, r#"{"urls": ["https://example.com/", "http://api.github.com/"]}"#, Allow, "array of allowed URLs"),
    row(Domains, WEB, r#"{"href": "https://evil.test/"}"#, Allow, "no URL argument at all"),
    row(Domains, LOOPBACK, r#"{"url": "http://0x7f.1:8080/"}"#, Allow, "WHATWG reads 0x7f.1 as 127.0.0.1"),
    row(Domains, r#"{"domain_allowlist": ["bücher.example"]}"#, r#"{"url": "https://xn--bcher-kva.example/"}"#, Allow, "IDNA entry matches punycode"),
];

fn object(text: &str, what: &str) -> Result<Map<String, Value>, String> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(format!("{what} is not an object: {other}")),
        Err(problem) => Err(format!("{what} is not JSON: {problem}")),
    }
}

fn strings(value: Option<&Value>) -> Result<Option<Vec<String>>, String> {
    match value {
        None => Ok(None),
        Some(value) => serde_json::from_value(value.clone())
            .map(Some)
            .map_err(|problem| problem.to_string()),
    }
}

/// Builds the row's rule from its config and runs it; `Err` means the row itself is malformed.
fn run(row: &Row) -> Result<Outcome, String> {
    let config = object(row.config, "config")?;
    let arguments = object(row.arguments, "arguments")?;
    let (verdict, code) = match row.check {
        Check::Paths => {
            let allowlist = strings(config.get("path_allowlist"))?.unwrap_or_default();
            let keys = strings(config.get("path_arguments"))?;
            let rule = PathRule::new(&allowlist, keys.as_deref())?;
            (rule.check(&arguments), 2002)
        }
        Check::Commands => {
            let commands = strings(config.get("command_allowlist"))?;
            let subcommands: Option<BTreeMap<String, Vec<String>>> = match config
                .get("subcommand_allowlist")
            {
                None => None,
                Some(value) => Some(
                    serde_json::from_value(value.clone()).map_err(|problem| problem.to_string())?,
                ),
            };
            let rule = CommandRule::new(commands.as_deref(), subcommands.as_ref())?;
            (rule.check(&arguments), 2003)
        }
        Check::Domains => {
            let allowlist = strings(config.get("domain_allowlist"))?.unwrap_or_default();
            let rule = DomainRule::new(&allowlist)?;
            (rule.check(&arguments), 2004)
        }
    };
    Ok(match verdict {
        Ok(()) => Outcome::Allow,
        Err(_) => Outcome::Deny(code),
    })
}

#[test]
fn every_row_gets_its_expected_outcome() {
    let mut failures = Vec::new();
    for row in ROWS {
        match run(row) {
            Ok(outcome) if outcome == row.expected => {}
            Ok(outcome) => failures.push(format!(
                "{:?} {} ({}): expected {:?}, got {outcome:?}",
                row.check, row.arguments, row.why, row.expected
            )),
            Err(problem) => failures.push(format!("{:?} {}: {problem}", row.check, row.why)),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn table_is_large_enough_and_balanced() {
    let denied = ROWS
        .iter()
        .filter(|row| row.expected != Outcome::Allow)
        .count();
    assert!(denied >= 60, "only {denied} bypass attempts");
    for check in [Paths, Commands, Domains] {
        let rows = ROWS.iter().filter(|row| row.check == check);
        let allowed = rows.clone().filter(|row| row.expected == Allow).count();
        let code = match check {
            Paths => 2002,
            Commands => 2003,
            Domains => 2004,
        };
        let denied = rows.filter(|row| row.expected == Deny(code)).count();
        assert!(allowed >= 5, "{check:?}: only {allowed} allowed rows");
        assert!(
            denied >= 20,
            "{check:?}: only {denied} denied rows with code {code}"
        );
    }
}

/// The same rows through the full `decide()`: the row's fields become the only capability of a context
/// loaded as the API would load it, so the model's compilation and the evaluation order are exercised too.
#[test]
fn every_row_gets_its_expected_outcome_through_decide() {
    let any = [sealgate::policy::Pattern::parse("*").unwrap()];
    let mut failures = Vec::new();
    for row in ROWS {
        let mut capability = object(row.config, "config").unwrap();
        capability.insert("tool_pattern".into(), Value::from("t.*"));
        let spec = serde_json::json!({"name": "table", "capabilities": [capability]});
        let context = match sealgate::policy::parse_context_json(&spec) {
            Ok(context) => context,
            Err(e) => {
                failures.push(format!("{}: config refused: {e}", row.why));
                continue;
            }
        };
        let arguments = object(row.arguments, "arguments").unwrap();
        let got = match sealgate::policy::decide(Some(&context), &any, "t.call", &arguments) {
            sealgate::policy::Decision::Allow { .. } => Outcome::Allow,
            sealgate::policy::Decision::Deny { code, .. } => Outcome::Deny(code),
        };
        if got != row.expected {
            failures.push(format!(
                "{}: expected {:?}, got {got:?}",
                row.why, row.expected
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} rows failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
