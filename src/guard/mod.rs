//! The answer guard (SPEC 18): what a tool's answer may not carry back to the agent. Before an answer
//! leaves the gateway, in the text of its `content` items and the string values of its
//! `structuredContent` (never keys, never the JSON structure):
//!
//! 1. every credential the gateway adds to that upstream's calls becomes `[REDACTED]`, always;
//! 2. secrets in well-known formats and the operator's patterns become `[REDACTED:KIND]`, or withhold
//!    the answer (`answer_guard.secrets`);
//! 3. Unicode Cf characters are removed, or withhold the answer (`answer_guard.invisible`).
//!
//! Each text is read a constant number of times: an `is_ascii` pass (and a character pass when it is
//! not ASCII), one Aho-Corasick pass for the credentials and one automaton pass for the secrets. The
//! guard knows nothing of where the answer goes; the pipeline decides what a withheld answer means.

mod invisible;
mod secrets;
mod spec;

use std::collections::BTreeMap;
use std::sync::Arc;

use aho_corasick::{AhoCorasick, MatchKind};
use serde_json::Value;

pub use invisible::is_hidden;
pub use secrets::{PatternError, Scanner, BUILT_IN};
pub use spec::{AnswerGuardConfig, AnswerGuardSpec, InvisibleMode, SecretsMode};

/// What replaces one of the gateway's own credentials.
pub const REDACTED: &str = "[REDACTED]";

/// Shorter credential values are not searched for: they would redact ordinary words and numbers.
pub const MIN_CREDENTIAL_BYTES: usize = 8;

/// The credentials the gateway adds to one upstream's calls, as one automaton.
#[derive(Default)]
pub struct Credentials {
    finder: Option<AhoCorasick>,
}

impl Credentials {
    /// The values to redact; those shorter than [`MIN_CREDENTIAL_BYTES`] are left out.
    pub fn new<I, S>(values: I) -> Result<Credentials, String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut literals: Vec<String> = values
            .into_iter()
            .filter(|v| v.as_ref().len() >= MIN_CREDENTIAL_BYTES)
            .map(|v| v.as_ref().to_owned())
            .collect();
        literals.sort();
        literals.dedup();
        if literals.is_empty() {
            return Ok(Credentials::default());
        }
        // Leftmost-longest: `Bearer abc…` wins over its own `abc…` where both start.
        let finder = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&literals)
            .map_err(|e| format!("the credentials cannot be searched for: {e}"))?;
        Ok(Credentials {
            finder: Some(finder),
        })
    }

    /// Whether there is anything to look for.
    pub fn is_empty(&self) -> bool {
        self.finder.is_none()
    }
}

/// The gateway-wide guard, compiled from `answer_guard` in the configuration.
pub struct Guard {
    secrets: SecretsMode,
    invisible: InvisibleMode,
    scanner: Arc<Scanner>,
}

/// A capability's `answer_guard`, compiled when its policy is loaded: what it sets wins.
#[derive(Clone)]
pub struct Overrides {
    secrets: Option<SecretsMode>,
    invisible: Option<InvisibleMode>,
    scanner: Option<Arc<Scanner>>,
}

impl std::fmt::Debug for Overrides {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Overrides")
            .field("secrets", &self.secrets)
            .field("invisible", &self.invisible)
            .field("secret_patterns", &self.scanner.is_some())
            .finish()
    }
}

/// The rules one answer is guarded by.
#[derive(Clone, Copy)]
pub struct Rules<'a> {
    pub secrets: SecretsMode,
    pub invisible: InvisibleMode,
    scanner: &'a Scanner,
}

impl Guard {
    pub fn new(config: &AnswerGuardConfig) -> Result<Guard, PatternError> {
        Ok(Guard {
            secrets: config.secrets,
            invisible: config.invisible,
            scanner: Scanner::with_patterns(&config.secret_patterns)?,
        })
    }

    /// The rules for a call whose capability has `overrides`, when it has any.
    pub fn rules<'a>(&'a self, overrides: Option<&'a Overrides>) -> Rules<'a> {
        Rules {
            secrets: overrides.and_then(|o| o.secrets).unwrap_or(self.secrets),
            invisible: overrides
                .and_then(|o| o.invisible)
                .unwrap_or(self.invisible),
            scanner: overrides
                .and_then(|o| o.scanner.as_deref())
                .unwrap_or(&self.scanner),
        }
    }
}

impl Overrides {
    pub fn new(spec: &AnswerGuardSpec) -> Result<Overrides, PatternError> {
        Ok(Overrides {
            secrets: spec.secrets,
            invisible: spec.invisible,
            scanner: spec
                .secret_patterns
                .as_ref()
                .map(Scanner::with_patterns)
                .transpose()?,
        })
    }
}

/// What was done to a kind of finding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Redacted,
    Stripped,
    /// Found where the mode is `refuse`: the answer is withheld.
    Refused,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Redacted => "redacted",
            Action::Stripped => "stripped",
            Action::Refused => "refused",
        }
    }
}

/// What the guard found in one answer: per kind, how many and what was done. Never a value.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
    found: BTreeMap<String, (u64, Action)>,
}

impl Report {
    fn add(&mut self, kind: &str, count: u64, action: Action) {
        if count == 0 {
            return;
        }
        match self.found.get_mut(kind) {
            Some(entry) => entry.0 += count,
            None => {
                self.found.insert(kind.to_owned(), (count, action));
            }
        }
    }

    /// Nothing found: the answer is as the tool sent it.
    pub fn is_clean(&self) -> bool {
        self.found.is_empty()
    }

    /// Something was found where its mode is `refuse`: the answer must not leave.
    pub fn withheld(&self) -> bool {
        self.found.values().any(|(_, a)| *a == Action::Refused)
    }

    /// Kind, count and action of each finding, in kind order.
    pub fn findings(&self) -> impl Iterator<Item = (&str, u64, Action)> {
        self.found.iter().map(|(k, (n, a))| (k.as_str(), *n, *a))
    }

    /// The kinds found, in order.
    pub fn kinds(&self) -> Vec<String> {
        self.found.keys().cloned().collect()
    }

    /// One line for an audit event's `detail`: `credential=1 redacted, invisible=3 stripped`.
    pub fn detail(&self) -> String {
        self.findings()
            .map(|(kind, count, action)| format!("{kind}={count} {}", action.as_str()))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `sealgate_answer_guard_total{kind,action}`, by the count of each finding.
    pub fn count_metrics(&self) {
        for (kind, count, action) in self.findings() {
            metrics::counter!(
                "sealgate_answer_guard_total",
                "kind" => kind.to_owned(),
                "action" => action.as_str()
            )
            .increment(count);
        }
    }
}

/// Guards one JSON-RPC response in place. When the report says [`Report::withheld`], what is left in
/// `response` must not be sent (it may be partly rewritten).
pub fn answer(response: &mut Value, credentials: Option<&Credentials>, rules: Rules<'_>) -> Report {
    let mut report = Report::default();
    for_each_text(response, |text| {
        guard_text(text, credentials, rules, &mut report)
    });
    report
}

/// The texts the guard reads: `result.content[]` items of type `text` (and an embedded resource's
/// `text`), every string value under `result.structuredContent`, and a JSON-RPC error's `message`.
/// Keys are never visited.
fn for_each_text(response: &mut Value, mut each: impl FnMut(&mut String)) {
    if let Some(result) = response.get_mut("result").and_then(Value::as_object_mut) {
        if let Some(Value::Array(items)) = result.get_mut("content") {
            for item in items.iter_mut().filter_map(Value::as_object_mut) {
                let text = match item.get("type").and_then(Value::as_str) {
                    Some("text") => item.get_mut("text"),
                    Some("resource") => item
                        .get_mut("resource")
                        .and_then(|resource| resource.get_mut("text")),
                    _ => None,
                };
                if let Some(Value::String(text)) = text {
                    each(text);
                }
            }
        }
        if let Some(structured) = result.get_mut("structuredContent") {
            // A stack, not recursion: depth is whatever the tool sent.
            let mut pending = vec![structured];
            while let Some(value) = pending.pop() {
                match value {
                    Value::String(text) => each(text),
                    Value::Array(items) => pending.extend(items.iter_mut()),
                    Value::Object(map) => pending.extend(map.values_mut()),
                    _ => {}
                }
            }
        }
    }
    if let Some(Value::String(message)) = response
        .get_mut("error")
        .and_then(|error| error.get_mut("message"))
    {
        each(message);
    }
}

/// One text: hidden characters first (so a zero-width character inside a token does not hide it), then
/// the gateway's credentials, then the secret formats.
fn guard_text(
    text: &mut String,
    credentials: Option<&Credentials>,
    rules: Rules<'_>,
    report: &mut Report,
) {
    match rules.invisible {
        InvisibleMode::Off => {}
        InvisibleMode::Strip => {
            if let Some((kept, hidden)) = invisible::strip(text) {
                *text = kept;
                report.add("invisible", hidden as u64, Action::Stripped);
            }
        }
        InvisibleMode::Refuse => {
            report.add("invisible", invisible::count(text) as u64, Action::Refused);
        }
    }
    if let Some(finder) = credentials.and_then(|c| c.finder.as_ref()) {
        let mut count = 0u64;
        let mut out = String::new();
        let mut last = 0;
        for found in finder.find_iter(text.as_str()) {
            out.push_str(&text[last..found.start()]);
            out.push_str(REDACTED);
            last = found.end();
            count += 1;
        }
        if count > 0 {
            out.push_str(&text[last..]);
            *text = out;
            report.add("credential", count, Action::Redacted);
        }
    }
    if rules.secrets != SecretsMode::Off {
        let redact = rules.secrets == SecretsMode::Redact;
        let action = if redact {
            Action::Redacted
        } else {
            Action::Refused
        };
        let mut out = String::new();
        let mut last = 0;
        let mut any = false;
        rules.scanner.find(text, |found| {
            report.add(found.kind, 1, action);
            any = true;
            if redact {
                out.push_str(&text[last..found.start]);
                out.push_str(found.marker);
                last = found.end;
            }
        });
        if any && redact {
            out.push_str(&text[last..]);
            *text = out;
        }
    }
}

#[cfg(test)]
mod tests;
