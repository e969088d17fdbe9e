//! The `command_allowlist` / `subcommand_allowlist` check of a capability (SPEC 6.3, **commands**;
//! a violation is code 2003).
//!
//! A string `command` is assumed to reach a POSIX shell, so before it is split into words the raw
//! text is scanned with a small quote-state machine: anything that could start a second command,
//! a substitution or a redirection is refused, escaped or not. Only then is it split with POSIX
//! quoting rules (`shell-words`) and its words compared exactly with the allowlists. An array
//! `command` and the `args` array are argv words: taken literally, never scanned for operators
//! (quoting them in a string would make the same words acceptable), but still refused when they
//! hold a NUL, which no argv word can carry.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use super::paths::excerpt;
use crate::envelope::json_kind;

/// Characters that end or chain a command, redirect, or open a subshell: refused outside quotes.
const OPERATORS: &[char] = &[';', '|', '&', '>', '<', '(', ')', '\n'];

/// Characters that start an expansion: refused outside single quotes.
const EXPANSIONS: &[char] = &['$', '`'];

/// An empty command is refused on its own, even when `args` would supply words (SPEC 6.3).
const EMPTY_COMMAND: &str = "argument \"command\" is empty";

/// A compiled command rule: which base commands may run and, for some, which subcommands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandRule {
    /// Base commands compared exactly with the first word. Without a `command_allowlist` these
    /// are the keys of `subcommand_allowlist` (see `new`).
    allowed_commands: BTreeSet<String>,
    /// Base command → the only words allowed as its first non-option word.
    allowed_subcommands: BTreeMap<String, BTreeSet<String>>,
}

impl CommandRule {
    /// Compiles the rule once, at policy load.
    ///
    /// With only a `subcommand_allowlist`, its keys become the allowed base commands: naming the
    /// subcommands of `git` and nothing else is read as "only `git`, only these", never "`git`
    /// restricted, every other program free" (stricter reading of SPEC 6.3).
    pub fn new(
        command_allowlist: Option<&[String]>,
        subcommand_allowlist: Option<&BTreeMap<String, Vec<String>>>,
    ) -> Result<CommandRule, String> {
        let mut allowed_subcommands = BTreeMap::new();
        if let Some(table) = subcommand_allowlist {
            if table.is_empty() {
                return Err("empty subcommand_allowlist would restrict nothing".to_string());
            }
            for (command, subcommands) in table {
                plain_word(command)
                    .map_err(|problem| format!("subcommand_allowlist key {problem}"))?;
                if subcommands.is_empty() {
                    return Err(format!(
                        "subcommand_allowlist for {} is empty and would allow nothing",
                        excerpt(command)
                    ));
                }
                let mut allowed = BTreeSet::new();
                for subcommand in subcommands {
                    plain_word(subcommand).map_err(|problem| {
                        format!("subcommand_allowlist for {}: {problem}", excerpt(command))
                    })?;
                    if subcommand.starts_with('-') {
                        // The check skips words starting with `-`, so this entry could never match.
                        return Err(format!(
                            "subcommand_allowlist for {}: {} starts with '-' and can never match",
                            excerpt(command),
                            excerpt(subcommand)
                        ));
                    }
                    allowed.insert(subcommand.clone());
                }
                allowed_subcommands.insert(command.clone(), allowed);
            }
        }
        let allowed_commands = match command_allowlist {
            Some([]) => return Err("empty command_allowlist would allow nothing".to_string()),
            Some(commands) => {
                let mut allowed = BTreeSet::new();
                for command in commands {
                    plain_word(command)
                        .map_err(|problem| format!("command_allowlist {problem}"))?;
                    allowed.insert(command.clone());
                }
                if let Some(stray) = allowed_subcommands
                    .keys()
                    .find(|command| !allowed.contains(*command))
                {
                    return Err(format!(
                        "subcommand_allowlist names {} which is not in command_allowlist",
                        excerpt(stray)
                    ));
                }
                allowed
            }
            None if allowed_subcommands.is_empty() => {
                return Err(
                    "a command rule needs command_allowlist or subcommand_allowlist".to_string(),
                )
            }
            None => allowed_subcommands.keys().cloned().collect(),
        };
        Ok(CommandRule {
            allowed_commands,
            allowed_subcommands,
        })
    }

    /// Checks the `command` (and `args`) arguments of one call.
    pub fn check(&self, arguments: &Map<String, Value>) -> Result<(), String> {
        let extra_words: &[Value] = match arguments.get("args") {
            None => &[],
            Some(Value::Array(items)) => {
                for (index, item) in items.iter().enumerate() {
                    literal_word(item)
                        .map_err(|problem| format!("argument \"args\"[{index}]: {problem}"))?;
                }
                items
            }
            Some(other) => {
                return Err(format!(
                    "argument \"args\": expected an array of strings, got {}",
                    json_kind(other)
                ))
            }
        };
        let extra_words = extra_words.iter().filter_map(Value::as_str);
        match arguments.get("command") {
            None => Err("argument \"command\" is missing".to_string()),
            Some(Value::String(command)) => {
                refuse_shell_syntax(command)
                    .map_err(|problem| format!("argument \"command\": {problem}"))?;
                let words = shell_words::split(command)
                    .map_err(|_| "argument \"command\": quotes do not close".to_string())?;
                if words.is_empty() {
                    return Err(EMPTY_COMMAND.to_string());
                }
                self.check_words(words.iter().map(String::as_str).chain(extra_words))
            }
            Some(Value::Array(items)) => {
                if items.is_empty() {
                    return Err(EMPTY_COMMAND.to_string());
                }
                for (index, item) in items.iter().enumerate() {
                    literal_word(item)
                        .map_err(|problem| format!("argument \"command\"[{index}]: {problem}"))?;
                }
                self.check_words(items.iter().filter_map(Value::as_str).chain(extra_words))
            }
            Some(other) => Err(format!(
                "argument \"command\": expected a string or an array of strings, got {}",
                json_kind(other)
            )),
        }
    }

    /// `words`: the split command followed by `args`, already validated as strings.
    fn check_words<'a>(&self, mut words: impl Iterator<Item = &'a str>) -> Result<(), String> {
        let base = match words.next() {
            None => return Err(EMPTY_COMMAND.to_string()),
            Some("") => return Err("argument \"command\" starts with an empty word".to_string()),
            Some(base) => base,
        };
        if !self.allowed_commands.contains(base) {
            return Err(format!(
                "command {} is not in command_allowlist",
                excerpt(base)
            ));
        }
        let Some(subcommands) = self.allowed_subcommands.get(base) else {
            return Ok(());
        };
        match words.find(|word| !word.starts_with('-')) {
            None => Err(format!(
                "command {} needs a subcommand from subcommand_allowlist",
                excerpt(base)
            )),
            Some(subcommand) if subcommands.contains(subcommand) => Ok(()),
            Some(subcommand) => Err(format!(
                "subcommand {} of {} is not in subcommand_allowlist",
                excerpt(subcommand),
                excerpt(base)
            )),
        }
    }
}

/// An argv element from a JSON array: must be a string without NUL.
fn literal_word(item: &Value) -> Result<(), String> {
    match item {
        Value::String(word) if word.contains('\0') => Err("contains a NUL byte".to_string()),
        Value::String(_) => Ok(()),
        other => Err(format!("expected a string, got {}", json_kind(other))),
    }
}

/// An allowlist entry must be one plain word: a string command could never produce a first word
/// holding blanks, quotes or shell syntax, so such an entry is a configuration mistake.
fn plain_word(entry: &str) -> Result<(), String> {
    if entry.is_empty() {
        return Err("entry is empty".to_string());
    }
    let is_unusable = |c: char| {
        c.is_whitespace()
            || c.is_control()
            || OPERATORS.contains(&c)
            || EXPANSIONS.contains(&c)
            || matches!(c, '\'' | '"' | '\\')
    };
    if entry.contains(is_unusable) || entry.starts_with('#') {
        return Err(format!("entry {} is not a plain word", excerpt(entry)));
    }
    Ok(())
}

/// Where the scanner stands in the raw command text.
enum Quoting {
    /// Outside quotes; `at_word_start` tells whether a `#` here would open a comment.
    None {
        at_word_start: bool,
    },
    Single,
    Double,
}

/// Scans the raw command text the way a POSIX shell tokenises it and refuses: NUL; `$` and `` ` ``
/// outside single quotes; `; | & > < ( )` and newline outside any quotes, even after a backslash;
/// a trailing backslash; quotes that do not close. Comments are followed like the shell does, so
/// a quote inside a comment cannot hide a newline (and what follows it) from this scan.
fn refuse_shell_syntax(command: &str) -> Result<(), String> {
    if command.contains('\0') {
        return Err("contains a NUL byte".to_string());
    }
    let mut state = Quoting::None {
        at_word_start: true,
    };
    let mut chars = command.chars();
    while let Some(c) = chars.next() {
        state = match state {
            Quoting::None { at_word_start } => match c {
                '\'' => Quoting::Single,
                '"' => Quoting::Double,
                '\\' => match chars.next() {
                    None => return Err("ends with a backslash".to_string()),
                    Some(escaped) if is_unquoted_hazard(escaped) => {
                        return Err(format!(
                            "{escaped:?} is not allowed outside quotes, even escaped"
                        ))
                    }
                    Some(_) => Quoting::None {
                        at_word_start: false,
                    },
                },
                '#' if at_word_start => {
                    // The shell ignores the rest of the line; only a newline could end the comment.
                    if chars.any(|rest| rest == '\n') {
                        return Err("'\\n' is not allowed outside quotes".to_string());
                    }
                    return Ok(());
                }
                ' ' | '\t' => Quoting::None {
                    at_word_start: true,
                },
                hazard if is_unquoted_hazard(hazard) => {
                    return Err(format!("{hazard:?} is not allowed outside quotes"))
                }
                _ => Quoting::None {
                    at_word_start: false,
                },
            },
            Quoting::Single => match c {
                '\'' => Quoting::None {
                    at_word_start: false,
                },
                _ => Quoting::Single,
            },
            Quoting::Double => match c {
                '"' => Quoting::None {
                    at_word_start: false,
                },
                expansion if EXPANSIONS.contains(&expansion) => {
                    return Err(format!("{expansion:?} is not allowed inside double quotes"))
                }
                // In double quotes a backslash escapes the next character; an escaped `$` or
                // backquote is still refused (SPEC: outside single quotes).
                '\\' => match chars.next() {
                    None => return Err("quotes do not close".to_string()),
                    Some(escaped) if EXPANSIONS.contains(&escaped) => {
                        return Err(format!(
                            "{escaped:?} is not allowed inside double quotes, even escaped"
                        ))
                    }
                    Some(_) => Quoting::Double,
                },
                _ => Quoting::Double,
            },
        };
    }
    match state {
        Quoting::None { .. } => Ok(()),
        Quoting::Single | Quoting::Double => Err("quotes do not close".to_string()),
    }
}

fn is_unquoted_hazard(c: char) -> bool {
    OPERATORS.contains(&c) || EXPANSIONS.contains(&c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn strings(list: &[&str]) -> Vec<String> {
        list.iter().map(|word| word.to_string()).collect()
    }

    fn git_rule() -> CommandRule {
        let mut subcommands = BTreeMap::new();
        subcommands.insert("git".to_string(), strings(&["status", "log", "diff"]));
        match CommandRule::new(Some(&strings(&["git", "ls"])), Some(&subcommands)) {
            Ok(rule) => rule,
            Err(problem) => panic!("test rule refused: {problem}"),
        }
    }

    fn args(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            other => panic!("test arguments must be an object, got {other}"),
        }
    }

    fn command_allowed(command: &str) -> bool {
        git_rule()
            .check(&args(json!({ "command": command })))
            .is_ok()
    }

    #[test]
    fn allowed_string_commands() {
        for command in [
            "git status",
            "git  status",
            "\tgit\tstatus\t",
            "\"git\" status",
            "'git' 'status'",
            "g'i't status",
            "git status --short",
            "git --no-pager log -n 3",
            "git log 'a$b'",
            "git log 'a;b|c&d>e<f(g)'",
            "git log \"a;b|c&d>e<f(g)\"",
            "git log \"line one\nline two\"",
            "git log 'line one\nline two'",
            "git log \\\"x",
            "git log \\'x",
            "git diff \"it's\"",
            "git log \"a\\\"b\"",
            "git log a#b",
            "git status # a comment",
            "\\git status",
            "ls",
            "ls -la /workspace",
            "ls *.rs ~ {a,b}",
        ] {
            assert!(command_allowed(command), "{command:?} refused");
        }
    }

    #[test]
    fn refused_string_commands() {
        for command in [
            "",
            "   ",
            "\t\n",
            "# only a comment",
            "git status; rm -rf /",
            "git status;rm",
            "git status\\;rm",
            "git status \\; rm",
            "git status | sh",
            "git status || rm",
            "git status && rm",
            "git status & rm",
            "git status > /etc/passwd",
            "git status < /etc/passwd",
            "git status >\\> x",
            "git $(rm -rf /)",
            "git `rm -rf /`",
            "git \\$(rm)",
            "git \\`rm\\`",
            "git \"a$b\"",
            "git \"a\\$b\"",
            "git \"`id`\"",
            "git status $HOME",
            "git status ${IFS}",
            "git $'status'",
            "git status\nrm -rf /",
            "git status \\\nrm",
            "git status\r\nrm",
            "(git status)",
            "git status )",
            "git 'status",
            "git \"status",
            "git status \\",
            "git \"status\\",
            "git status \0",
            "git status # it's\nrm -rf / #'",
            "git status #'\nrm -rf / #'",
            "git -c core.pager=x log",
            "git -C /tmp status",
            "git",
            "git --version",
            "git push",
            "git Status",
            "gitx status",
            "GIT status",
            "./git status",
            "/usr/bin/git status",
            "/tmp/x/git status",
            "env git status",
            "command git status",
            "FOO=bar git status",
            "git\u{a0}status",
            "rm -rf /",
            "git \"\" status",
        ] {
            assert!(!command_allowed(command), "{command:?} allowed");
        }
    }

    #[test]
    fn scanner_messages() {
        let cases = [
            ("a;b", "';' is not allowed outside quotes"),
            ("a\\;b", "';' is not allowed outside quotes, even escaped"),
            ("a \"$x\"", "'$' is not allowed inside double quotes"),
            (
                "a \"\\`x\"",
                "'`' is not allowed inside double quotes, even escaped",
            ),
            ("a 'b", "quotes do not close"),
            ("a \"b", "quotes do not close"),
            ("a\\", "ends with a backslash"),
            ("a\0", "contains a NUL byte"),
            ("a #x\nb", "'\\n' is not allowed outside quotes"),
        ];
        for (command, problem) in cases {
            assert_eq!(
                refuse_shell_syntax(command),
                Err(problem.to_string()),
                "{command:?}"
            );
        }
        assert_eq!(refuse_shell_syntax("a 'b;$`\\'"), Ok(()));
    }

    #[test]
    fn array_commands_are_literal_words() {
        let rule = git_rule();
        for allowed in [
            json!(["git", "status"]),
            json!(["git", "log", "a;b $(c) `d`"]),
            json!(["git", "-p", "diff"]),
            json!(["ls"]),
        ] {
            assert!(
                rule.check(&args(json!({ "command": allowed }))).is_ok(),
                "{allowed} refused"
            );
        }
        for refused in [
            json!([]),
            json!([""]),
            json!(["git status"]),
            json!(["git;rm"]),
            json!(["git", "status;rm"]),
            json!(["git", "push"]),
            json!(["git"]),
            json!(["git", 1]),
            json!(["git", null]),
            json!(["git", ["status"]]),
            json!([1, "git"]),
            json!(["git", "status", "a\0b"]),
            json!(["rm", "-rf", "/"]),
        ] {
            assert!(
                rule.check(&args(json!({ "command": refused }))).is_err(),
                "{refused} allowed"
            );
        }
    }

    #[test]
    fn command_of_another_type_or_missing() {
        let rule = git_rule();
        for refused in [
            json!(null),
            json!(1),
            json!(true),
            json!({ "git": "status" }),
        ] {
            assert!(rule.check(&args(json!({ "command": refused }))).is_err());
        }
        assert_eq!(
            rule.check(&Map::new()),
            Err("argument \"command\" is missing".to_string())
        );
        assert!(rule.check(&args(json!({ "args": ["status"] }))).is_err());
    }

    #[test]
    fn args_follow_the_command_words() {
        let rule = git_rule();
        let allowed = [
            json!({ "command": "git", "args": ["status"] }),
            json!({ "command": "git", "args": ["--no-pager", "log"] }),
            json!({ "command": ["git"], "args": ["diff", "x;y"] }),
            json!({ "command": "git status", "args": ["push"] }),
            json!({ "command": "ls", "args": [] }),
        ];
        for call in allowed {
            assert!(rule.check(&args(call.clone())).is_ok(), "{call} refused");
        }
        let refused = [
            json!({ "command": "git", "args": ["push"] }),
            json!({ "command": "git", "args": [] }),
            json!({ "command": "git", "args": ["-c", "x=y", "push"] }),
            json!({ "command": "git", "args": [1] }),
            json!({ "command": "git", "args": ["status", 1] }),
            json!({ "command": "git status", "args": "push" }),
            json!({ "command": "git status", "args": null }),
            json!({ "command": "git status", "args": { "a": "b" } }),
            json!({ "command": "git status", "args": ["a\0"] }),
            json!({ "command": "", "args": ["git", "status"] }),
            json!({ "command": " # git", "args": ["git", "status"] }),
            json!({ "command": [], "args": ["git", "status"] }),
        ];
        for call in refused {
            assert!(rule.check(&args(call.clone())).is_err(), "{call} allowed");
        }
    }

    #[test]
    fn error_messages() {
        let rule = git_rule();
        let check = |call: Value| rule.check(&args(call));
        assert_eq!(
            check(json!({ "command": "git push" })),
            Err("subcommand \"push\" of \"git\" is not in subcommand_allowlist".to_string())
        );
        assert_eq!(
            check(json!({ "command": "git -v" })),
            Err("command \"git\" needs a subcommand from subcommand_allowlist".to_string())
        );
        assert_eq!(
            check(json!({ "command": "/tmp/x/git status" })),
            Err("command \"/tmp/x/git\" is not in command_allowlist".to_string())
        );
        assert_eq!(
            check(json!({ "command": "git status; rm" })),
            Err("argument \"command\": ';' is not allowed outside quotes".to_string())
        );
        assert_eq!(
            check(json!({ "command": ["git", 2] })),
            Err("argument \"command\"[1]: expected a string, got a number".to_string())
        );
        assert_eq!(
            check(json!({ "command": " " })),
            Err("argument \"command\" is empty".to_string())
        );
    }

    #[test]
    fn command_allowlist_without_subcommands() {
        let rule = match CommandRule::new(Some(&strings(&["ls", "cat"])), None) {
            Ok(rule) => rule,
            Err(problem) => panic!("{problem}"),
        };
        assert!(rule
            .check(&args(json!({ "command": "cat /etc/hosts" })))
            .is_ok());
        assert!(rule.check(&args(json!({ "command": "ls" }))).is_ok());
        assert!(rule
            .check(&args(json!({ "command": "git status" })))
            .is_err());
        assert!(rule.check(&Map::new()).is_err());
    }

    #[test]
    fn subcommands_alone_restrict_base_commands_to_their_keys() {
        let mut table = BTreeMap::new();
        table.insert("git".to_string(), strings(&["status"]));
        let rule = match CommandRule::new(None, Some(&table)) {
            Ok(rule) => rule,
            Err(problem) => panic!("{problem}"),
        };
        assert!(rule
            .check(&args(json!({ "command": "git status" })))
            .is_ok());
        assert!(rule.check(&args(json!({ "command": "git log" }))).is_err());
        assert!(rule.check(&args(json!({ "command": "rm -rf /" }))).is_err());
    }

    #[test]
    fn refuses_bad_configurations() {
        let table = |command: &str, subcommands: &[&str]| {
            let mut table = BTreeMap::new();
            table.insert(command.to_string(), strings(subcommands));
            table
        };
        let git = strings(&["git"]);
        assert_eq!(
            CommandRule::new(Some(&[]), None),
            Err("empty command_allowlist would allow nothing".to_string())
        );
        assert!(CommandRule::new(None, None).is_err());
        assert!(CommandRule::new(Some(&git), Some(&BTreeMap::new())).is_err());
        assert!(CommandRule::new(Some(&git), Some(&table("git", &[]))).is_err());
        assert_eq!(
            CommandRule::new(Some(&git), Some(&table("npm", &["test"]))),
            Err("subcommand_allowlist names \"npm\" which is not in command_allowlist".to_string())
        );
        assert!(CommandRule::new(Some(&git), Some(&table("git", &["--force"]))).is_err());
        assert!(CommandRule::new(Some(&git), Some(&table("git", &[""]))).is_err());
        assert!(CommandRule::new(Some(&git), Some(&table("git", &["status now"]))).is_err());
        for bad in [
            "",
            "git status",
            "git;",
            "$git",
            "`git`",
            "'git'",
            "\"git\"",
            "g\\it",
            "#git",
            "git\n",
            "a\0",
        ] {
            assert!(
                CommandRule::new(Some(&strings(&[bad])), None).is_err(),
                "{bad:?} accepted"
            );
        }
        assert!(CommandRule::new(Some(&strings(&["/usr/bin/git", "git-lfs"])), None).is_ok());
    }
}
