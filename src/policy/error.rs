//! Why a policy rule could not be compiled, and why a capability's argument check refused a call.
//!
//! The rule errors become the message of a [`super::PolicyError`], which names file, line and field:
//! `sealgate policy check`, the reload log and the API's 422 answers show them. The violations are
//! the message of a refusal (2002, 2004; their codes are mapped in `crate::error`). Both keep the
//! wording that the docs and tests quote, and a violation never quotes the value it refused
//! (SPEC 9.1 r2): paths and URLs may carry secrets.

use std::fmt;

use super::arguments::TwoNamed;
use super::limits::{MAX_CAPABILITY_ID_BYTES, MAX_CONTEXT_NAME_BYTES, MAX_TOOL_NAME_BYTES};

/// Longest excerpt of a policy file's entry quoted in a load error; keeps messages bounded.
const EXCERPT_CHARS: usize = 80;

/// Quotes an entry of the operator's policy file for a load error: escaped (no raw control
/// characters reach a log line) and cut to a bounded length. Never used on call arguments.
pub(crate) fn excerpt(value: &str) -> String {
    match value.char_indices().nth(EXCERPT_CHARS) {
        None => format!("{value:?}"),
        Some((cut, _)) => format!("{:?}…", &value[..cut]),
    }
}

/// Where a command word came from: refusals name the place, never the word (SPEC 9.1 r2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WordAt {
    /// Word `n` (counted from 1) of a string `command`.
    CommandText(usize),
    /// Element `i` of an array `command`.
    CommandItem(usize),
    /// Element `i` of `args`.
    Args(usize),
    /// Word `n` (from 1) of element `i` of `args`, read as shell text.
    ArgsText(usize, usize),
}

impl fmt::Display for WordAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WordAt::CommandText(number) => write!(f, "argument \"command\": word {number}"),
            WordAt::CommandItem(index) => write!(f, "argument \"command\"[{index}]"),
            WordAt::Args(index) => write!(f, "argument \"args\"[{index}]"),
            WordAt::ArgsText(index, number) => {
                write!(f, "argument \"args\"[{index}]: word {number}")
            }
        }
    }
}

/// What is wrong with a path, said after the name of what held it (`… is outside path_allowlist`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathProblem {
    #[error("is empty")]
    Empty,
    #[error("contains a NUL byte")]
    Nul,
    #[error("contains a backslash")]
    Backslash,
    #[error("is not absolute")]
    NotAbsolute,
    /// Refused rather than clamped, so that `/../etc` is not `/etc`.
    #[error("climbs above / with ..")]
    ClimbsAboveRoot,
    #[error("is outside path_allowlist")]
    Outside,
    /// A relative path in a command starts from the tool's working directory, which no check knows.
    #[error("climbs with '..' from a working directory that path_allowlist cannot see")]
    ClimbsFromWorkingDirectory,
}

/// What is wrong with a URL argument.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlProblem {
    #[error("control character in the URL")]
    Control,
    #[error("leading or trailing whitespace")]
    Whitespace,
    #[error("backslash in the URL")]
    Backslash,
    /// `ParseError` names the kind of problem only, never the input.
    #[error("not an absolute URL ({0})")]
    NotAbsolute(url::ParseError),
    #[error("scheme other than http or https")]
    Scheme,
    #[error("'@' inside the userinfo")]
    AtInUserinfo,
    #[error("no host")]
    NoHost,
    #[error("empty label or unusual character in the host")]
    UnusualHost,
    #[error("host not in domain_allowlist")]
    NotAllowed,
}

/// The argument a check read (by name, without regard to ASCII case) and, in an array, the element.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArgumentAt {
    pub key: String,
    pub index: Option<usize>,
}

impl fmt::Display for ArgumentAt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "argument {:?}", self.key)?;
        match self.index {
            Some(index) => write!(f, "[{index}]"),
            None => Ok(()),
        }
    }
}

/// An argument that a capability's path, command or URL check refused (SPEC 6.3).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    #[error("{0}")]
    TwoNamed(#[from] TwoNamed),
    #[error("argument \"command\" is missing")]
    NoCommand,
    #[error("argument \"command\" is empty")]
    EmptyCommand,
    /// A `command` or `args` argument of another JSON type than the words it must hold.
    #[error("{at}: expected {expected}, got {got}")]
    NotWords {
        at: ArgumentAt,
        expected: &'static str,
        got: &'static str,
    },
    /// An element of an array `command` or of `args` that no argv word can be.
    #[error("{at} {problem}")]
    NotArgv {
        at: ArgumentAt,
        problem: ArgvProblem,
    },
    /// Shell text (a string `command`, or `args` next to one) that could run more than one plain command.
    #[error("{at}: {problem}")]
    Shell {
        at: ArgumentAt,
        problem: ShellProblem,
    },
    /// A word that the command, subcommand or option allowlists refuse.
    #[error("{at} {problem}")]
    Word { at: WordAt, problem: WordProblem },
    /// Shell text that a shell would expand into paths no check sees.
    #[error(
        "{at} holds an unquoted {expansion:?}, which a shell expands into paths that \
         path_allowlist cannot check; quote it"
    )]
    Expands { at: WordAt, expansion: char },
    /// A word of a command, or a value inside it (`part`), that the path check refuses.
    #[error("{at} {part} {problem}")]
    PathInCommand {
        at: WordAt,
        part: &'static str,
        problem: PathProblem,
    },
    #[error("{at} holds a file: URL, which path_allowlist cannot check")]
    FileUrl { at: WordAt },
    #[error("{at} {problem}")]
    Path {
        at: ArgumentAt,
        problem: PathProblem,
    },
    /// A path argument that is not a string (nor, for the argument itself, an array of them).
    #[error("{at}: expected a path string{}, got {got}", or_array(.at))]
    NotPath { at: ArgumentAt, got: &'static str },
    #[error("{at}: {problem}")]
    Url { at: ArgumentAt, problem: UrlProblem },
    #[error("{at}: expected a URL string{}, got {got}", or_array(.at))]
    NotUrl { at: ArgumentAt, got: &'static str },
}

/// Why an element of an array `command` or of `args` is no argv word.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgvProblem {
    #[error("holds a NUL byte")]
    Nul,
    #[error("is {0}, not a string")]
    NotString(&'static str),
}

/// Why shell text is refused; problems name the word (counted from 1), never its text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShellProblem {
    #[error("word {number} {rule}")]
    Word { number: usize, rule: &'static str },
    #[error("ends with a backslash")]
    TrailingBackslash,
    #[error("quotes do not close")]
    Unclosed,
}

/// Why the allowlists refuse a word of a command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WordProblem {
    #[error("is empty")]
    Empty,
    #[error("is not in command_allowlist")]
    NotCommand,
    #[error("needs a subcommand from subcommand_allowlist")]
    NoSubcommand,
    /// Options before the subcommand (`git -c …`) change what runs.
    #[error("is an option before the subcommand")]
    OptionFirst,
    #[error("is not in subcommand_allowlist")]
    NotSubcommand,
    #[error(
        "is the option {}, which option_allowlist for {} does not list",
        excerpt(.option),
        excerpt(.key)
    )]
    UnlistedOption { option: String, key: String },
}

/// An argument may be a list of values; an element of one may not.
fn or_array(at: &ArgumentAt) -> &'static str {
    match at.index {
        Some(_) => "",
        None => " or an array of them",
    }
}

/// A rule of a context that cannot be compiled; the loader names its field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    /// An empty list where an empty one would allow nothing (`path_allowlist`, `domain_allowlist`).
    #[error("empty {0} would allow nothing")]
    EmptyAllowlist(&'static str),
    #[error("empty subcommand_allowlist would restrict nothing")]
    NoSubcommandTable,
    #[error("subcommand_allowlist for {} is empty and would allow nothing", excerpt(.0))]
    NoSubcommands(String),
    /// A word starting with `-` before the subcommand is refused, so this entry could never match.
    #[error(
        "subcommand_allowlist for {}: {} starts with '-' and can never match",
        excerpt(.command),
        excerpt(.subcommand)
    )]
    OptionAsSubcommand { command: String, subcommand: String },
    #[error("subcommand_allowlist names {} which is not in command_allowlist", excerpt(.0))]
    StrayCommand(String),
    #[error("a command rule needs command_allowlist or subcommand_allowlist")]
    NoCommandList,
    /// An entry of a command allowlist that no word of a string command could equal; `list` names
    /// the list, as the sentence begins.
    #[error("{list} {problem}")]
    CommandEntry { list: String, problem: EntryProblem },
    #[error("empty path_arguments would check no argument")]
    NoPathArguments,
    #[error("path_arguments holds an empty argument name")]
    EmptyArgumentName,
    #[error("path_allowlist entry {}: {problem}", excerpt(.entry))]
    PathEntry { entry: String, problem: PathProblem },
    #[error("domain_allowlist entry {}: {problem}", excerpt(.entry))]
    DomainEntry {
        entry: String,
        problem: DomainProblem,
    },
    #[error("pattern is longer than {MAX_TOOL_NAME_BYTES} bytes")]
    PatternTooLong,
    /// A tool pattern that is not a tool name with `*`s; `problem` says how.
    #[error("invalid pattern {pattern:?}: {problem}")]
    Pattern {
        pattern: String,
        problem: PatternProblem,
    },
    #[error("context name must be 1 to {MAX_CONTEXT_NAME_BYTES} bytes")]
    ContextNameLength,
    #[error(
        "invalid context name {0:?}: letters, digits, '_', '-', '.', starting with a letter or digit"
    )]
    ContextName(String),
    #[error(
        "invalid capability id {0:?}: 1 to {MAX_CAPABILITY_ID_BYTES} letters, digits, '_' or '-'"
    )]
    CapabilityId(String),
}

/// Why an allowlist entry is not one plain word.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryProblem {
    #[error("entry is empty")]
    Empty,
    #[error("entry {} is not a plain word", excerpt(.0))]
    NotPlain(String),
}

/// How a tool pattern breaks the pattern syntax.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternProblem {
    #[error(
        "\"**\" is not supported; one \"*\" already matches any run of characters, dots included"
    )]
    DoubleStar,
    #[error("{0:?} is glob syntax other than \"*\" is not supported")]
    Glob(char),
    #[error("{0:?} is not a tool-name character")]
    Character(char),
    #[error(
        "expected a tool name (letters, digits, '_', '-', joined by single dots) where \"*\" may \
         stand for any run of characters"
    )]
    NotDotted,
}

/// What is wrong with a `domain_allowlist` entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DomainProblem {
    #[error("is empty")]
    Empty,
    #[error("contains whitespace or a control character")]
    Whitespace,
    #[error("'*' would allow every host")]
    Star,
    #[error("is not an IPv6 address")]
    NotIpv6,
    #[error("must be a bare host name (no scheme, port, path or userinfo)")]
    NotBare,
    #[error("may hold '*' only as its first label")]
    StarInSuffix,
    #[error("wildcard over an IP address")]
    WildcardAddress,
    #[error("may hold '*' only as a leading '*.'")]
    StarElsewhere,
    #[error("is not a valid host ({0})")]
    NotHost(url::ParseError),
    #[error("has an empty label or a character other than letters, digits, '-' and '_'")]
    UnusualHost,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn excerpt_escapes_and_cuts_on_char_boundaries() {
        assert_eq!(excerpt("a\nb"), "\"a\\nb\"");
        let wide = "é".repeat(100);
        assert_eq!(excerpt(&wide), format!("{:?}…", "é".repeat(80)));
    }
}
