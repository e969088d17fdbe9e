//! `answer_guard:` as it is written, gateway-wide in the configuration and in a policy's capability.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What the guard does with text in a well-known secret format or matching an operator's pattern.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SecretsMode {
    /// Replaced with `[REDACTED:KIND]`.
    #[default]
    Redact,
    /// The whole answer is withheld (2011).
    Refuse,
    /// Not looked for (the gateway's own credentials are still redacted).
    Off,
}

/// What the guard does with Unicode general category Cf characters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum InvisibleMode {
    /// Removed from the text.
    #[default]
    Strip,
    /// The whole answer is withheld (2011).
    Refuse,
    /// Left as they are.
    Off,
}

/// The gateway-wide `answer_guard:` of the configuration; an unset key takes its default.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AnswerGuardConfig {
    pub secrets: SecretsMode,
    pub invisible: InvisibleMode,
    /// Kind name → regular expression; see [`AnswerGuardSpec::secret_patterns`].
    pub secret_patterns: BTreeMap<String, String>,
}

/// A capability's `answer_guard: {secrets, invisible, secret_patterns}`: an unset key takes the
/// gateway-wide value, a set one wins (so `secret_patterns: {}` drops the gateway's patterns).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AnswerGuardSpec {
    /// `redact` (default), `refuse` or `off`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets: Option<SecretsMode>,
    /// `strip` (default), `refuse` or `off`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invisible: Option<InvisibleMode>,
    /// Kind name → regular expression (the `regex` crate's syntax: no backreferences, no lookaround).
    /// A match is a secret of that kind, like the well-known formats.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_patterns: Option<BTreeMap<String, String>>,
}
