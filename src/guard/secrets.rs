//! Secrets in the well-known formats and the operator's patterns, found in one leftmost pass.
//!
//! Every pattern, built-in or the operator's, goes into one multi-pattern `regex_automata::meta::Regex`
//! (the engine of the `regex` crate): finite automata only, so a search takes time linear in the text
//! whatever the pattern, and the patterns' literal prefixes (`ghp_`, `AKIA`, `eyJ`, …) let it skip
//! between candidates. Patterns the engine cannot run in linear time (backreferences, lookaround) are
//! refused when they are loaded, with their key.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};

use base64::Engine as _;
use regex_automata::meta::Regex;
use regex_automata::util::syntax;

/// The built-in formats: kind, pattern. Classes are ASCII and word boundaries `(?-u:\b)`: the fast
/// automata give up on Unicode word boundaries in non-ASCII text, and these formats are ASCII.
pub const BUILT_IN: [(&str, &str); 7] = [
    // A whole block, or from its BEGIN line to the end of the text when it was cut off.
    (
        "pem_private_key",
        r"-----BEGIN[A-Z0-9 ]*PRIVATE KEY-----(?s:.)*?(?:-----END[A-Z0-9 ]*PRIVATE KEY-----|\z)",
    ),
    (
        "aws_access_key_id",
        r"(?-u:\b)(?:AKIA|ASIA|ABIA|ACCA|A3T[A-Z0-9])[A-Z0-9]{16}(?-u:\b)",
    ),
    (
        "github_token",
        r"(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9]{22}_[A-Za-z0-9]{59})",
    ),
    (
        "gitlab_token",
        r"(?:glpat|gldt|glrt|glptt|glft|glsoat|glcbt)-[A-Za-z0-9_-]{20,}",
    ),
    (
        "slack_token",
        r"(?:xox[abposre]-[A-Za-z0-9-]{10,}|xapp-[0-9]-[A-Za-z0-9-]{10,})",
    ),
    ("google_api_key", r"AIza[A-Za-z0-9_-]{35}(?-u:\b)"),
    // Checked after the match: the first part must decode to a JSON object with `alg` (see `is_jwt`).
    (
        "jwt",
        r"eyJ[A-Za-z0-9_-]{2,}={0,2}\.[A-Za-z0-9_-]{2,}={0,2}\.[A-Za-z0-9_-]*",
    ),
];

/// Kinds that operator patterns cannot be named, because the guard's own findings use them.
const RESERVED_KINDS: [&str; 2] = ["credential", "invisible"];

/// Longest operator pattern, in bytes.
const MAX_PATTERN_BYTES: usize = 4096;

/// A pattern the guard will not run, with its kind name and why (never a match, never a value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatternError {
    /// The kind name: the key under `secret_patterns`.
    pub name: String,
    pub reason: String,
}

/// The compiled set of formats and patterns: one automaton, the kind of each pattern, and the marker
/// that replaces its matches.
pub struct Scanner {
    regex: Regex,
    kinds: Vec<Kind>,
}

struct Kind {
    name: String,
    marker: String,
    jwt: bool,
}

static BUILT_IN_ONLY: LazyLock<Arc<Scanner>> = LazyLock::new(|| {
    Arc::new(Scanner::build(&BTreeMap::new()).expect("the built-in formats compile"))
});

/// One found secret: its kind and where it lies in the text.
pub struct Found<'a> {
    pub kind: &'a str,
    pub marker: &'a str,
    pub start: usize,
    pub end: usize,
}

impl Scanner {
    /// The built-in formats alone, compiled once per process.
    pub fn built_in() -> Arc<Scanner> {
        BUILT_IN_ONLY.clone()
    }

    /// The built-in formats and the operator's patterns (kind name → pattern).
    pub fn with_patterns(
        patterns: &BTreeMap<String, String>,
    ) -> Result<Arc<Scanner>, PatternError> {
        if patterns.is_empty() {
            return Ok(Scanner::built_in());
        }
        Scanner::build(patterns).map(Arc::new)
    }

    fn build(patterns: &BTreeMap<String, String>) -> Result<Scanner, PatternError> {
        for (name, pattern) in patterns {
            check_pattern(name, pattern)?;
        }
        let all = BUILT_IN
            .iter()
            .map(|&(name, pattern)| (name, pattern))
            .chain(patterns.iter().map(|(n, p)| (n.as_str(), p.as_str())));
        let (names, sources): (Vec<&str>, Vec<&str>) = all.unzip();
        let regex = Regex::builder()
            .syntax(syntax::Config::new().utf8(true))
            .build_many(&sources)
            .map_err(|e| PatternError {
                name: e
                    .pattern()
                    .and_then(|id| names.get(id.as_usize()))
                    .map_or_else(|| "secret_patterns".to_owned(), |n| (*n).to_owned()),
                reason: format!("the patterns together cannot be compiled: {e}"),
            })?;
        let kinds = names
            .iter()
            .enumerate()
            .map(|(index, name)| Kind {
                name: (*name).to_owned(),
                marker: format!("[REDACTED:{name}]"),
                jwt: index < BUILT_IN.len() && *name == "jwt",
            })
            .collect();
        Ok(Scanner { regex, kinds })
    }

    /// Calls `each` for every secret in `text`, leftmost first, never overlapping. A JWT-shaped match
    /// whose header does not decode is passed over.
    pub fn find(&self, text: &str, mut each: impl FnMut(Found<'_>)) {
        for found in self.regex.find_iter(text) {
            let kind = &self.kinds[found.pattern().as_usize()];
            if kind.jwt && !is_jwt(&text[found.range()]) {
                continue;
            }
            each(Found {
                kind: &kind.name,
                marker: &kind.marker,
                start: found.start(),
                end: found.end(),
            });
        }
    }
}

/// Why an operator pattern is refused, before the set is compiled: its name, its syntax (the parser's
/// own sentence: "backreferences are not supported", "look-around … is not supported"), and a pattern
/// that matches the empty string, which would put a marker between every two characters.
fn check_pattern(name: &str, pattern: &str) -> Result<(), PatternError> {
    let refuse = |reason: String| {
        Err(PatternError {
            name: name.to_owned(),
            reason,
        })
    };
    let valid_name = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if !valid_name {
        return refuse("a kind name is 1-64 characters of a-z 0-9 _".to_owned());
    }
    if BUILT_IN.iter().any(|(kind, _)| *kind == name) || RESERVED_KINDS.contains(&name) {
        return refuse(format!("`{name}` is a kind the guard names itself"));
    }
    if pattern.len() > MAX_PATTERN_BYTES {
        return refuse(format!("longer than {MAX_PATTERN_BYTES} bytes"));
    }
    let hir = match syntax::parse_with(pattern, &syntax::Config::new().utf8(true)) {
        Ok(hir) => hir,
        Err(e) => return refuse(parse_reason(&e.to_string())),
    };
    if hir.properties().minimum_len() == Some(0) {
        return refuse("it matches the empty string".to_owned());
    }
    Ok(())
}

/// The parser's error is a small drawing of the pattern with the reason on its last line: the reason.
fn parse_reason(error: &str) -> String {
    let reason = error
        .lines()
        .rev()
        .find_map(|line| line.trim().strip_prefix("error: "))
        .unwrap_or(error);
    format!(
        "not a pattern the guard can run in linear time (the `regex` crate's syntax): {}",
        reason.trim()
    )
}

/// Whether a JWT-shaped token's first part is a JSON object with `alg`: a token's header, not a word
/// that happens to start with `eyJ`.
fn is_jwt(token: &str) -> bool {
    let header = token.split('.').next().unwrap_or_default();
    let Ok(bytes) =
        base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(header.trim_end_matches('='))
    else {
        return false;
    };
    serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&bytes)
        .is_ok_and(|header| header.contains_key("alg"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(scanner: &Scanner, text: &str) -> Vec<String> {
        let mut found = Vec::new();
        scanner.find(text, |f| found.push(format!("{}@{}", f.kind, f.start)));
        found
    }

    #[test]
    fn guard_finds_each_built_in_format() {
        let scanner = Scanner::built_in();
        let jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2lnbmF0dXJl";
        for (text, kind) in [
            (
                "-----BEGIN RSA PRIVATE KEY-----\nMIIB\n-----END RSA PRIVATE KEY-----",
                "pem_private_key",
            ),
            (
                "-----BEGIN PRIVATE KEY-----\nMIIB cut off",
                "pem_private_key",
            ),
            ("key AKIAIOSFODNN7EXAMPLE here", "aws_access_key_id"),
            ("ghp_abcdefghijklmnopqrstuvwxyz0123456789", "github_token"),
            ("glpat-abcdefghij0123456789", "gitlab_token"),
            ("xoxb-1234567890-abcdefghij", "slack_token"),
            ("AIzaSyA1234567890abcdefghijklmnopqrstuv", "google_api_key"),
            (jwt, "jwt"),
        ] {
            let found = kinds(&scanner, text);
            assert_eq!(found.len(), 1, "{text}: {found:?}");
            assert!(found[0].starts_with(kind), "{text}: {found:?}");
        }
    }

    #[test]
    fn guard_passes_over_near_matches() {
        let scanner = Scanner::built_in();
        for text in [
            "-----BEGIN PUBLIC KEY-----\nMIIB\n-----END PUBLIC KEY-----",
            "AKIAIOSFODNN7EXAMPL",
            "ghp_tooshort",
            "glpat-short",
            "xoxb-short",
            "AIzaSyA123",
            // `eyJ` and dots, but the first part is not a JSON header with `alg`.
            "eyJmb28iOiJiYXIifQ.eyJzdWIiOiJ4In0.c2ln",
            "eyJnotbase64!.x.y",
        ] {
            assert!(kinds(&scanner, text).is_empty(), "{text}");
        }
    }

    #[test]
    fn guard_refuses_patterns_the_linear_engine_cannot_run() {
        for (pattern, says) in [
            ("(?=x)", "look-around"),
            (r"(a)\1", "backreferences"),
            ("a*", "empty string"),
            ("(", "unclosed"),
        ] {
            let patterns = BTreeMap::from([("mine".to_owned(), pattern.to_owned())]);
            let error = Scanner::with_patterns(&patterns).err().unwrap();
            assert_eq!(error.name, "mine");
            assert!(error.reason.contains(says), "{pattern}: {}", error.reason);
        }
        for name in ["jwt", "credential", "Bad-Name", ""] {
            let patterns = BTreeMap::from([(name.to_owned(), "x+".to_owned())]);
            assert!(Scanner::with_patterns(&patterns).is_err(), "{name}");
        }
    }

    #[test]
    fn guard_runs_a_pattern_written_to_backtrack_in_one_pass() {
        let patterns = BTreeMap::from([("runs".to_owned(), "(a+)+$".to_owned())]);
        let scanner = Scanner::with_patterns(&patterns).unwrap();
        let text = format!("{}!", "a".repeat(64 * 1024));
        assert!(kinds(&scanner, &text).is_empty());
        assert_eq!(kinds(&scanner, "xx aaaa"), vec!["runs@3"]);
    }
}
