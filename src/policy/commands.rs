//! The `command_allowlist` / `subcommand_allowlist` check of a capability (SPEC 6.3, **commands**;
//! a violation is code 2003), and the words it hands to the capability's path check (2002).
//!
//! A string `command` is assumed to reach a POSIX shell, so it is split by a quote-state machine
//! that refuses, escaped or not, anything that could start a second command, a substitution or a
//! redirection, and treats `#` as an ordinary character so that nothing hides behind it. Its words
//! are then compared exactly with the allowlists. An array `command` is argv: taken literally, never
//! scanned for operators (quoting them in a string would make the same words acceptable), but still
//! refused when it holds a NUL, which no argv word can carry. `args` elements are argv words too,
//! except next to a string `command`, where they obey the string's rules (SPEC 6.3 r2).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde_json::{Map, Value};

use super::arguments::single;
use super::error::{
    excerpt, ArgumentAt, ArgvProblem, EntryProblem, PathProblem, RuleError, ShellProblem,
    Violation, WordAt, WordProblem,
};
use super::paths::PathRule;
use crate::envelope::json_kind;

/// Characters that end or chain a command, redirect, or open a subshell: refused outside quotes.
const OPERATORS: &[char] = &[';', '|', '&', '>', '<', '(', ')', '\n'];

/// Characters that start an expansion: refused outside single quotes.
const EXPANSIONS: &[char] = &['$', '`'];
/// Characters that, unquoted, make a shell expand a word into paths: tilde and brace expansion and
/// the glob characters (`/workspace/.?/etc` matches `/workspace/../etc`). Harmless to the command
/// check, refused under a `path_allowlist` (SPEC 6.3 r3).
const PATH_EXPANSIONS: &[char] = &['~', '{', '*', '?', '['];

/// Unquoted at the start of a word, zsh replaces `=name` with the path of the program `name`.
const LEADING_EXPANSION: char = '=';

/// Characters after which a tool may read the rest of a word as a path of its own: `NAME=VALUE`
/// and `--option=VALUE`, and path lists such as `/workspace/a:/etc` or `-Wl,-rpath,/etc`.
const VALUE_SEPARATORS: &[char] = &['=', ':', ','];

/// A compiled command rule: which base commands may run and, for some, which subcommands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandRule {
    /// Base commands compared exactly with the first word. Without a `command_allowlist` these
    /// are the keys of `subcommand_allowlist` (see `new`).
    allowed_commands: BTreeSet<String>,
    /// Base command → the only words allowed right after it (no option may come first).
    allowed_subcommands: BTreeMap<String, BTreeSet<String>>,
    /// `option_allowlist` (SPEC 6.3 r4): `"git"` or `"git log"` → the only options allowed there.
    allowed_options: BTreeMap<String, BTreeSet<String>>,
}

/// Why an `option_allowlist` was refused at load: the entry (its key, and the index of the option in
/// its list) when one is at fault, so that the loader can point at its line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionsError {
    pub key: Option<String>,
    pub index: Option<usize>,
    pub message: String,
}

impl fmt::Display for OptionsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("option_allowlist")?;
        if let Some(key) = &self.key {
            write!(f, " for {}", excerpt(key))?;
        }
        if let Some(index) = self.index {
            write!(f, "[{index}]")?;
        }
        write!(f, ": {}", self.message)
    }
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
    ) -> Result<CommandRule, RuleError> {
        let mut allowed_subcommands = BTreeMap::new();
        if let Some(table) = subcommand_allowlist {
            if table.is_empty() {
                return Err(RuleError::NoSubcommandTable);
            }
            for (command, subcommands) in table {
                plain_word(command).map_err(in_list("subcommand_allowlist key".to_owned()))?;
                if subcommands.is_empty() {
                    return Err(RuleError::NoSubcommands(command.clone()));
                }
                let mut allowed = BTreeSet::new();
                for subcommand in subcommands {
                    let list = format!("subcommand_allowlist for {}:", excerpt(command));
                    plain_word(subcommand).map_err(in_list(list))?;
                    if subcommand.starts_with('-') {
                        return Err(RuleError::OptionAsSubcommand {
                            command: command.clone(),
                            subcommand: subcommand.clone(),
                        });
                    }
                    allowed.insert(subcommand.clone());
                }
                allowed_subcommands.insert(command.clone(), allowed);
            }
        }
        let allowed_commands = match command_allowlist {
            Some([]) => return Err(RuleError::EmptyAllowlist("command_allowlist")),
            Some(commands) => {
                let mut allowed = BTreeSet::new();
                for command in commands {
                    plain_word(command).map_err(in_list("command_allowlist".to_owned()))?;
                    allowed.insert(command.clone());
                }
                if let Some(stray) = allowed_subcommands
                    .keys()
                    .find(|command| !allowed.contains(*command))
                {
                    return Err(RuleError::StrayCommand(stray.clone()));
                }
                allowed
            }
            None if allowed_subcommands.is_empty() => return Err(RuleError::NoCommandList),
            None => allowed_subcommands.keys().cloned().collect(),
        };
        Ok(CommandRule {
            allowed_commands,
            allowed_subcommands,
            allowed_options: BTreeMap::new(),
        })
    }

    /// Adds an `option_allowlist` (SPEC 6.3 r4), checked at load. A key is a base command of
    /// `command_allowlist`, or `"command subcommand"` whose subcommand `subcommand_allowlist` lists for
    /// that command: only there is the subcommand surely the word after the command (no option may
    /// come before it), so an entry for it cannot be dodged with `git -C x log`. Every option starts
    /// with `-`, holds no `=` (names are compared before it) and is not `--` (which ends the options
    /// and is never compared); each would otherwise never match. An empty list allows no option.
    pub fn with_options(
        mut self,
        table: &BTreeMap<String, Vec<String>>,
    ) -> Result<CommandRule, OptionsError> {
        let refuse = |key: Option<&String>, index: Option<usize>, message: String| OptionsError {
            key: key.cloned(),
            index,
            message,
        };
        if table.is_empty() {
            return Err(refuse(
                None,
                None,
                "is empty and would limit nothing".into(),
            ));
        }
        for (key, options) in table {
            let mut parts = key.split(' ');
            let (command, subcommand) = (parts.next().unwrap_or_default(), parts.next());
            let shape = "a key is a command or \"command subcommand\", one space apart";
            if parts.next().is_some() {
                return Err(refuse(Some(key), None, shape.into()));
            }
            for word in std::iter::once(command).chain(subcommand) {
                plain_word(word).map_err(|problem| refuse(Some(key), None, problem.to_string()))?;
            }
            if !self.allowed_commands.contains(command) {
                let message = format!("{} is not in command_allowlist", excerpt(command));
                return Err(refuse(Some(key), None, message));
            }
            if let Some(subcommand) = subcommand {
                let message = match self.allowed_subcommands.get(command) {
                    None => format!(
                        "an entry for a subcommand needs a subcommand_allowlist for {}",
                        excerpt(command)
                    ),
                    Some(listed) if !listed.contains(subcommand) => format!(
                        "{} is not in subcommand_allowlist for {}",
                        excerpt(subcommand),
                        excerpt(command)
                    ),
                    Some(_) => String::new(),
                };
                if !message.is_empty() {
                    return Err(refuse(Some(key), None, message));
                }
            }
            let mut allowed = BTreeSet::new();
            for (index, option) in options.iter().enumerate() {
                let at = Some(index);
                plain_word(option).map_err(|problem| refuse(Some(key), at, problem.to_string()))?;
                let problem = if !option.starts_with('-') {
                    "is not an option: options start with '-'"
                } else if option.contains('=') {
                    "holds '=' and can never match: an option is compared by its name before '='"
                } else if option == "--" {
                    "ends the options and is never compared"
                } else {
                    allowed.insert(option.clone());
                    continue;
                };
                let message = format!("{} {problem}", excerpt(option));
                return Err(refuse(Some(key), at, message));
            }
            self.allowed_options.insert(key.clone(), allowed);
        }
        Ok(self)
    }

    /// Checks the `command` (and `args`) arguments of one call, found by name without regard to ASCII
    /// case as the path and URL arguments are (SPEC 6.3 r3): a tool that reads `Args` as `args` runs
    /// it. On success returns the call's words, so that a capability with a `path_allowlist` can
    /// check the paths among them ([`CommandWords::check_paths`]).
    pub fn check<'a>(
        &self,
        arguments: &'a Map<String, Value>,
    ) -> Result<CommandWords<'a>, Violation> {
        let command = single(arguments, "command")?;
        let args: &[Value] = match single(arguments, "args")? {
            None => &[],
            Some(Value::Array(items)) => items,
            Some(other) => {
                return Err(Violation::NotWords {
                    at: at("args", None),
                    expected: "an array of strings",
                    got: json_kind(other),
                })
            }
        };
        let mut words = Vec::new();
        // Words a shell would expand into paths, with the character that expands ([`ShellWord::expands`]).
        let mut expanding = Vec::new();
        // Whether a `#` has begun a word so far: joined into one shell text, a comment in the command
        // or in one element runs on into the next elements.
        let mut after_comment = false;
        match command {
            None => return Err(Violation::NoCommand),
            Some(Value::String(text)) => {
                let split = split_shell_text(text, &mut after_comment).map_err(|problem| {
                    Violation::Shell {
                        at: at("command", None),
                        problem,
                    }
                })?;
                for (index, word) in split.into_iter().enumerate() {
                    let at = WordAt::CommandText(index + 1);
                    if let Some(expansion) = word.expands {
                        expanding.push((at, expansion));
                    }
                    words.push((at, Cow::Owned(word.text)));
                }
            }
            Some(Value::Array(items)) => {
                for (index, item) in items.iter().enumerate() {
                    let word = literal_word(item).map_err(|problem| Violation::NotArgv {
                        at: at("command", Some(index)),
                        problem,
                    })?;
                    words.push((WordAt::CommandItem(index), Cow::Borrowed(word)));
                }
            }
            Some(other) => {
                return Err(Violation::NotWords {
                    at: at("command", None),
                    expected: "a string or an array of strings",
                    got: json_kind(other),
                })
            }
        }
        // An empty command is refused on its own, even when `args` would supply words (SPEC 6.3).
        if words.is_empty() {
            return Err(Violation::EmptyCommand);
        }
        // Next to a string command, a tool may join `args` into the same shell text (SPEC 6.3 r2): each
        // element obeys the string's shell-syntax rule, and the words it would split into are checked
        // as paths as well as the element itself.
        let shell_text = matches!(command, Some(Value::String(_)));
        let mut split_args = Vec::new();
        for (index, item) in args.iter().enumerate() {
            let word = literal_word(item).map_err(|problem| Violation::NotArgv {
                at: at("args", Some(index)),
                problem,
            })?;
            if shell_text {
                let split = split_shell_text(word, &mut after_comment).map_err(|problem| {
                    Violation::Shell {
                        at: at("args", Some(index)),
                        problem,
                    }
                })?;
                for (number, word) in split.into_iter().enumerate() {
                    let at = WordAt::ArgsText(index, number + 1);
                    if let Some(expansion) = word.expands {
                        expanding.push((at, expansion));
                    }
                    split_args.push((at, Cow::Owned(word.text)));
                }
            }
            words.push((WordAt::Args(index), Cow::Borrowed(word)));
        }
        self.check_words(&words)?;
        // Options are checked on argv as the program gets it and, next to a string command, on the
        // words of the shell text that a tool may join (`args: ["x --output=y"]`), each with its own
        // `--`: either may be what runs.
        self.check_options(&words)?;
        if shell_text {
            let joined: Vec<_> = words
                .iter()
                .filter(|(at, _)| !matches!(at, WordAt::Args(_)))
                .chain(&split_args)
                .cloned()
                .collect();
            self.check_options(&joined)?;
        }
        words.extend(split_args);
        Ok(CommandWords { words, expanding })
    }

    /// `words`: the command's words followed by `args`, as the program would receive them.
    fn check_words(&self, words: &[(WordAt, Cow<'_, str>)]) -> Result<(), Violation> {
        let Some((at, base)) = words.first() else {
            return Err(Violation::EmptyCommand);
        };
        let at = *at;
        let refuse = |at, problem| Err(Violation::Word { at, problem });
        if base.is_empty() {
            return refuse(at, WordProblem::Empty);
        }
        if !self.allowed_commands.contains(base.as_ref()) {
            return refuse(at, WordProblem::NotCommand);
        }
        let Some(subcommands) = self.allowed_subcommands.get(base.as_ref()) else {
            return Ok(());
        };
        // Options before the subcommand (`git -c …`, `git --git-dir=…`) change what runs (SPEC 6.3 r2).
        match words.get(1) {
            None => refuse(at, WordProblem::NoSubcommand),
            Some((at, word)) if word.starts_with('-') => refuse(*at, WordProblem::OptionFirst),
            Some((_, word)) if subcommands.contains(word.as_ref()) => Ok(()),
            Some((at, _)) => refuse(*at, WordProblem::NotSubcommand),
        }
    }

    /// The `option_allowlist` (SPEC 6.3 r4) over words that passed [`Self::check_words`]: the entry
    /// for `"command subcommand"` when there is one, else the command's; without either, any option.
    fn check_options(&self, words: &[(WordAt, Cow<'_, str>)]) -> Result<(), Violation> {
        let Some((_, base)) = words.first() else {
            return Ok(());
        };
        // With a subcommand_allowlist for the base, its second word is the subcommand (check_words).
        let specific = match (
            self.allowed_subcommands.contains_key(base.as_ref()),
            words.get(1),
        ) {
            (true, Some((_, subcommand))) => {
                let key = format!("{base} {subcommand}");
                self.allowed_options.get_key_value(&key)
            }
            _ => None,
        };
        let Some((key, listed)) =
            specific.or_else(|| self.allowed_options.get_key_value(base.as_ref()))
        else {
            return Ok(());
        };
        for (at, word) in &words[1..] {
            if word == "--" {
                break;
            }
            if !word.starts_with('-') {
                continue;
            }
            if let Some(option) = unlisted_option(word, listed) {
                return Err(Violation::Word {
                    at: *at,
                    problem: WordProblem::UnlistedOption {
                        option: option.into_owned(),
                        key: key.clone(),
                    },
                });
            }
        }
        Ok(())
    }
}

/// The first option of `word` (which starts with `-`) that `listed` lacks (SPEC 6.3 r4), by name only,
/// never a value: the name is what comes before any `=` (`--format=%H` is `--format`). A short-option
/// cluster that is not listed as a whole is its letters (`-abc` is `-a`, `-b`, `-c`), and digits that
/// end it are the value of the option before them (`-n5` is `-n`), as getopt reads them.
pub fn unlisted_option<'w>(word: &'w str, listed: &BTreeSet<String>) -> Option<Cow<'w, str>> {
    let name = word.split('=').next().unwrap_or_default();
    if listed.contains(name) {
        return None;
    }
    let Some(cluster) = name
        .strip_prefix('-')
        .filter(|rest| !rest.starts_with('-') && rest.chars().nth(1).is_some())
    else {
        return Some(Cow::Borrowed(name));
    };
    for (at, letter) in cluster.char_indices() {
        if at > 0 && cluster[at..].bytes().all(|b| b.is_ascii_digit()) {
            break;
        }
        let option = format!("-{letter}");
        if !listed.contains(&option) {
            return Some(Cow::Owned(option));
        }
    }
    None
}

/// The words of a call that passed the command check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandWords<'a> {
    words: Vec<(WordAt, Cow<'a, str>)>,
    /// The words of shell text that a shell would expand into paths, with the character that does it.
    expanding: Vec<(WordAt, char)>,
}

impl CommandWords<'_> {
    /// The capability's `path_allowlist` over the command (SPEC 6.3 r2 and r3, code 2002). Shell text
    /// that a shell would expand into paths (an unquoted glob, `~`, `{`, or a leading `=`) is refused,
    /// since where it leads cannot be checked here. Then every word, and every value a tool may read
    /// as a path inside a word ([`embedded_values`]), must pass [`check_path_value`].
    pub fn check_paths(&self, paths: &PathRule) -> Result<(), Violation> {
        if let Some(&(at, expansion)) = self.expanding.first() {
            return Err(Violation::Expands { at, expansion });
        }
        for (at, word) in &self.words {
            let at = *at;
            let refused = |part| move |problem| Violation::PathInCommand { at, part, problem };
            // A relative word with separators is checked by its parts: `--output=/workspace/../x`
            // climbs with `..` only inside its value.
            let whole = word.strip_prefix('@').unwrap_or(word);
            if whole.starts_with('/') || !whole.contains(VALUE_SEPARATORS) {
                check_path_value(word, paths).map_err(refused("(a path)"))?;
            }
            // The value after an `=` is a path as a whole too: `--output=/workspace:x` names the
            // sibling `/workspace:x`, whatever its parts between `:` and `,` say.
            for value in word.split('=').skip(1) {
                check_path_value(value, paths).map_err(refused("(a value inside it)"))?;
            }
            for value in embedded_values(word).ok_or(Violation::FileUrl { at })? {
                check_path_value(value, paths).map_err(refused("(a value inside it)"))?;
            }
        }
        Ok(())
    }
}

/// One word, or a value inside one: an absolute path must pass `paths`; a relative one must not climb
/// with `..`, since it starts from the tool's working directory, which this check does not know
/// (`ls ../../etc`). A leading `@` is dropped first: many tools read `@FILE` as the contents of FILE
/// (compilers' response files, `curl -d @FILE`, argparse's `fromfile_prefix_chars`).
fn check_path_value(value: &str, paths: &PathRule) -> Result<(), PathProblem> {
    let value = value.strip_prefix('@').unwrap_or(value);
    if value.starts_with('/') {
        paths.check_value(value)
    } else if value.split('/').any(|part| part == "..") {
        Err(PathProblem::ClimbsFromWorkingDirectory)
    } else {
        Ok(())
    }
}

/// The values that a tool may read as paths inside one word (SPEC 6.3 r3): the parts between `=`,
/// `:` and `,` (`if=/etc/shadow`, `--output=/etc/x`, `-Dkey=/etc/x`, `/workspace/a:/etc`), and the
/// value attached to a short option's letters (`-O/etc/x`; in `-xvf/etc/x` any letter might be the
/// one that takes it). The `//host/…` part of a URL is no local path: it is checked as the relative
/// `host/…`. A `file:` URL names one in a form this check does not read (percent-encoding, a host),
/// so it is refused: `None`.
fn embedded_values(word: &str) -> Option<Vec<&str>> {
    let parts = separated_parts(word);
    let mut values = Vec::new();
    let mut is_authority = false;
    for (index, &(part, separator)) in parts.iter().enumerate() {
        let scheme = separator == Some(':') && is_url_scheme(part);
        if scheme && part.eq_ignore_ascii_case("file") {
            return None;
        }
        match part.strip_prefix("//").filter(|_| is_authority) {
            // `host/path` is relative: only a `..` in it is refused.
            Some(host_and_path) => values.push(host_and_path),
            None if parts.len() > 1 => values.push(part),
            None => {}
        }
        values.extend(attached_value(part));
        is_authority = scheme
            && parts
                .get(index + 1)
                .is_some_and(|(next, _)| next.starts_with("//"));
    }
    Some(values)
}

/// `word` cut at every [`VALUE_SEPARATORS`] character, each part with the separator that ends it.
fn separated_parts(word: &str) -> Vec<(&str, Option<char>)> {
    let mut parts = Vec::new();
    let mut start = 0;
    for (at, separator) in word.match_indices(VALUE_SEPARATORS) {
        parts.push((&word[start..at], separator.chars().next()));
        start = at + separator.len();
    }
    parts.push((&word[start..], None));
    parts
}

/// A URL scheme (RFC 3986): a letter, then letters, digits, `+`, `-` and `.`.
fn is_url_scheme(text: &str) -> bool {
    let mut chars = text.chars();
    chars
        .next()
        .is_some_and(|first| first.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// The value attached to a short option's letters, as in `-C/etc` or `-I../x`: what follows the
/// first character that no option letter is.
fn attached_value(word: &str) -> Option<&str> {
    let letters = word
        .strip_prefix('-')
        .filter(|rest| !rest.starts_with('-'))?;
    let value_at = letters.find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))?;
    Some(&letters[value_at..])
}

/// An argv element from a JSON array: must be a string without NUL. The problem reads after the
/// element's name.
fn literal_word(item: &Value) -> Result<&str, ArgvProblem> {
    match item {
        Value::String(word) if word.contains('\0') => Err(ArgvProblem::Nul),
        Value::String(word) => Ok(word),
        other => Err(ArgvProblem::NotString(json_kind(other))),
    }
}

/// An entry of `list` that is not a plain word.
fn in_list(list: String) -> impl FnOnce(EntryProblem) -> RuleError {
    move |problem| RuleError::CommandEntry { list, problem }
}

/// The argument a command check reads: `command` or `args`, and the element of an array.
fn at(key: &str, index: Option<usize>) -> ArgumentAt {
    ArgumentAt {
        key: key.to_owned(),
        index,
    }
}

/// An allowlist entry must be one plain word: a string command could never produce a first word
/// holding blanks, quotes or shell syntax, so such an entry is a configuration mistake.
fn plain_word(entry: &str) -> Result<(), EntryProblem> {
    if entry.is_empty() {
        return Err(EntryProblem::Empty);
    }
    let is_unusable = |c: char| {
        c.is_whitespace()
            || c.is_control()
            || OPERATORS.contains(&c)
            || EXPANSIONS.contains(&c)
            || matches!(c, '\'' | '"' | '\\')
    };
    if entry.contains(is_unusable) || entry.starts_with('#') {
        return Err(EntryProblem::NotPlain(entry.to_owned()));
    }
    Ok(())
}

/// Where the scanner stands in the text.
enum Quoting {
    None,
    Single,
    Double,
}

/// Splits shell text into words by POSIX quoting rules, refusing what could make a shell run more
/// than one plain command: NUL; `$` and `` ` `` outside single quotes; `; | & > < ( )` and newline
/// outside any quotes, even after a backslash; a trailing backslash; quotes that do not close.
///
/// `#` starts no comment here (SPEC 6.3 r2): what follows it is split and checked like the rest.
/// A shell would still read it as a comment, in which quotes mean nothing, so once an unquoted `#`
/// begins a word a newline anywhere after it is refused, even where this scan sees quotes.
///
/// `after_comment` carries that state in and out, for texts that a tool may join into one.
/// Problems name the word (counted from 1), never its text.
fn split_shell_text(text: &str, after_comment: &mut bool) -> Result<Vec<ShellWord>, ShellProblem> {
    let mut words: Vec<ShellWord> = Vec::new();
    // The word being read, once something (even an empty pair of quotes) has begun it.
    let mut current: Option<ShellWord> = None;
    let mut quoting = Quoting::None;
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        let number = words.len() + 1;
        let refuse = |rule| Err(ShellProblem::Word { number, rule });
        let nul = "holds a NUL byte";
        let comment_newline = "holds a newline after a '#' that a shell reads as a comment";
        if c == '\0' {
            return refuse(nul);
        }
        if c == '\n' && *after_comment {
            return refuse(comment_newline);
        }
        match quoting {
            Quoting::None => match c {
                ' ' | '\t' => words.extend(current.take()),
                '\'' => {
                    current.get_or_insert_with(ShellWord::default);
                    quoting = Quoting::Single;
                }
                '"' => {
                    current.get_or_insert_with(ShellWord::default);
                    quoting = Quoting::Double;
                }
                '\\' => match chars.next() {
                    None => return Err(ShellProblem::TrailingBackslash),
                    Some('\0') => return refuse(nul),
                    Some(escaped) if is_unquoted_hazard(escaped) => {
                        return refuse("is shell syntax outside quotes, even escaped")
                    }
                    Some(escaped) => current
                        .get_or_insert_with(ShellWord::default)
                        .text
                        .push(escaped),
                },
                hazard if is_unquoted_hazard(hazard) => {
                    return refuse("is shell syntax outside quotes")
                }
                other => {
                    let starts_word = current.is_none();
                    if other == '#' && starts_word {
                        *after_comment = true;
                    }
                    let word = current.get_or_insert_with(ShellWord::default);
                    if PATH_EXPANSIONS.contains(&other)
                        || (starts_word && other == LEADING_EXPANSION)
                    {
                        word.expands.get_or_insert(other);
                    }
                    word.text.push(other);
                }
            },
            Quoting::Single => match c {
                '\'' => quoting = Quoting::None,
                other => current
                    .get_or_insert_with(ShellWord::default)
                    .text
                    .push(other),
            },
            Quoting::Double => match c {
                '"' => quoting = Quoting::None,
                expansion if EXPANSIONS.contains(&expansion) => {
                    return refuse("holds an expansion inside double quotes")
                }
                // In double quotes a backslash escapes only `$`, backquote, `"`, `\` and newline; an
                // escaped `$` or backquote is still refused (SPEC: outside single quotes).
                '\\' => match chars.next() {
                    None => return Err(ShellProblem::Unclosed),
                    Some('\0') => return refuse(nul),
                    Some(escaped) if EXPANSIONS.contains(&escaped) => {
                        return refuse("holds an expansion inside double quotes, even escaped")
                    }
                    Some('\n') if *after_comment => return refuse(comment_newline),
                    // Backslash-newline joins the lines.
                    Some('\n') => {}
                    Some(escaped @ ('"' | '\\')) => current
                        .get_or_insert_with(ShellWord::default)
                        .text
                        .push(escaped),
                    Some(escaped) => {
                        let word = &mut current.get_or_insert_with(ShellWord::default).text;
                        word.push('\\');
                        word.push(escaped);
                    }
                },
                other => current
                    .get_or_insert_with(ShellWord::default)
                    .text
                    .push(other),
            },
        }
    }
    match quoting {
        Quoting::None => {
            words.extend(current);
            Ok(words)
        }
        Quoting::Single | Quoting::Double => Err(ShellProblem::Unclosed),
    }
}

/// One word of shell text, as the program would receive it when the shell expands nothing.
#[derive(Debug, Default, PartialEq, Eq)]
struct ShellWord {
    text: String,
    /// The first unquoted character that could make a shell expand the word into a path that the
    /// path check never sees (`~/.ssh`, `{/etc/shadow,a}`, `/workspace/.?/etc`, zsh's `=git`).
    expands: Option<char>,
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

    fn workspace() -> PathRule {
        match PathRule::new(&strings(&["/workspace"]), None) {
            Ok(rule) => rule,
            Err(problem) => panic!("test path rule refused: {problem}"),
        }
    }

    fn args(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            other => panic!("test arguments must be an object, got {other}"),
        }
    }

    fn split(text: &str) -> Result<Vec<String>, String> {
        split_shell_text(text, &mut false)
            .map(|words| words.into_iter().map(|word| word.text).collect())
            .map_err(|problem| problem.to_string())
    }

    fn command_allowed(command: &str) -> bool {
        git_rule()
            .check(&args(json!({ "command": command })))
            .is_ok()
    }

    /// The command check, then the path check over its words: `Err((code, message))`.
    fn with_paths(call: Value) -> Result<(), (u16, String)> {
        let refusal = |violation: Violation| {
            let code = crate::error::Code::from(&violation).number();
            (code, violation.to_string())
        };
        let call = args(call);
        let words = git_rule().check(&call).map_err(refusal)?;
        words.check_paths(&workspace()).map_err(refusal)
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
            "git log -n 3",
            "git log --oneline",
            "git diff --stat",
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
            "git status #",
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
            // `#` hides nothing (SPEC 6.3 r2).
            "git status #; rm -rf /",
            "git status # $(id)",
            "git status #`id`",
            "git status # a | b",
            "git status # it's",
            "git status # it's\nrm -rf / #'",
            "git status #'\nrm -rf / #'",
            "git status #\"\nrm -rf / #\"",
            "git status #\"\\\nrm -rf /\"",
            "# git status",
            // Options before an allowlisted subcommand (SPEC 6.3 r2).
            "git -c core.pager=x log",
            "git -C /tmp status",
            "git --git-dir=/x status",
            "git --no-pager log",
            "git -p diff",
            "git -- status",
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
    fn splits_like_a_shell_without_comments() {
        let cases: [(&str, &[&str]); 9] = [
            ("git status", &["git", "status"]),
            ("  a\t b  ", &["a", "b"]),
            ("'a b' \"c d\"", &["a b", "c d"]),
            ("a'b'\"c\"", &["abc"]),
            ("'' \"\"", &["", ""]),
            ("a\\ b \\'c", &["a b", "'c"]),
            ("\"a\\\"b\\\\c\\d\"", &["a\"b\\c\\d"]),
            ("\"a\\\nb\"", &["ab"]),
            ("git status # x", &["git", "status", "#", "x"]),
        ];
        for (text, words) in cases {
            assert_eq!(split(text), Ok(strings(words)), "{text:?}");
        }
        assert_eq!(split(" \t "), Ok(Vec::new()));
    }

    #[test]
    fn shell_problems_name_the_word_not_its_text() {
        let cases = [
            ("a;b", "word 1 is shell syntax outside quotes"),
            ("git status #; rm", "word 3 is shell syntax outside quotes"),
            (
                "a b\\;c",
                "word 2 is shell syntax outside quotes, even escaped",
            ),
            ("a \"$x\"", "word 2 holds an expansion inside double quotes"),
            (
                "a \"\\`x\"",
                "word 2 holds an expansion inside double quotes, even escaped",
            ),
            ("a 'b", "quotes do not close"),
            ("a \"b", "quotes do not close"),
            ("a\\", "ends with a backslash"),
            ("a b\0", "word 2 holds a NUL byte"),
            (
                "a #x '\nb'",
                "word 3 holds a newline after a '#' that a shell reads as a comment",
            ),
        ];
        for (text, problem) in cases {
            assert_eq!(split(text), Err(problem.to_string()), "{text:?}");
        }
        assert_eq!(split("a 'b;$`\\'"), Ok(strings(&["a", "b;$`\\"])));
    }

    #[test]
    fn array_commands_are_literal_words() {
        let rule = git_rule();
        for allowed in [
            json!(["git", "status"]),
            json!(["git", "log", "a;b $(c) `d`"]),
            json!(["git", "log", "#; rm"]),
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
            json!(["git", "-p", "diff"]),
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
    fn command_and_args_are_found_by_any_case() {
        let rule = git_rule();
        assert!(rule
            .check(&args(json!({ "Command": "git status" })))
            .is_ok());
        for refused in [
            json!({ "COMMAND": "rm -rf /" }),
            json!({ "command": "git status", "Args": ["; rm -rf /"] }),
            json!({ "command": "git", "ARGS": ["push"] }),
            json!({ "command": "git status", "Command": "rm -rf /" }),
        ] {
            assert!(
                rule.check(&args(refused.clone())).is_err(),
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
            rule.check(&Map::new()).map_err(|e| e.to_string()),
            Err("argument \"command\" is missing".to_string())
        );
        assert!(rule.check(&args(json!({ "args": ["status"] }))).is_err());
    }

    #[test]
    fn args_follow_the_command_words() {
        let rule = git_rule();
        let allowed = [
            json!({ "command": "git", "args": ["status"] }),
            json!({ "command": "git", "args": ["log", "--oneline"] }),
            json!({ "command": ["git"], "args": ["diff", "x;y"] }),
            json!({ "command": ["git"], "args": ["log", "--grep=$(x)"] }),
            json!({ "command": "git status", "args": ["push"] }),
            json!({ "command": "git log", "args": ["--grep", "two words"] }),
            json!({ "command": "ls", "args": [] }),
        ];
        for call in allowed {
            assert!(rule.check(&args(call.clone())).is_ok(), "{call} refused");
        }
        let refused = [
            json!({ "command": "git", "args": ["push"] }),
            json!({ "command": "git", "args": [] }),
            json!({ "command": "git", "args": ["-c", "x=y", "status"] }),
            json!({ "command": ["git"], "args": ["--git-dir=/x", "status"] }),
            json!({ "command": "git", "args": ["status now"] }),
            json!({ "command": "git", "args": [1] }),
            json!({ "command": "git", "args": ["status", 1] }),
            json!({ "command": "git status", "args": "push" }),
            json!({ "command": "git status", "args": null }),
            json!({ "command": "git status", "args": { "a": "b" } }),
            json!({ "command": "git status", "args": ["a\0"] }),
            // Next to a string command, args obey the string's shell-syntax rule (SPEC 6.3 r2).
            json!({ "command": "git status", "args": ["; rm -rf /"] }),
            json!({ "command": "git status", "args": ["$(id)"] }),
            json!({ "command": "git log", "args": ["'unclosed"] }),
            json!({ "command": "git log", "args": ["#x", "'\nrm -rf / #'"] }),
            json!({ "command": "git log #x", "args": ["'\nrm -rf / #'"] }),
            json!({ "command": "git", "args": ["status", "a|b"] }),
            json!({ "command": "", "args": ["git", "status"] }),
            json!({ "command": " # git", "args": ["git", "status"] }),
            json!({ "command": [], "args": ["git", "status"] }),
        ];
        for call in refused {
            assert!(rule.check(&args(call.clone())).is_err(), "{call} allowed");
        }
    }

    #[test]
    fn paths_in_command_words() {
        let allowed = [
            json!({ "command": "git diff --output=relative/path" }),
            json!({ "command": "git diff --output=/workspace/x" }),
            json!({ "command": "git diff -- /workspace/a" }),
            json!({ "command": "git log --grep=a=/workspace" }),
            json!({ "command": "ls -la /workspace" }),
            json!({ "command": "git diff --stat", "args": ["/workspace/a"] }),
            json!({ "command": ["git", "diff", "--output=/workspace/../workspace/x"] }),
            // Quoted, escaped, or with no shell to read them, `~`, `{`, globs and `=` are plain text.
            json!({ "command": "ls '~' \"{/etc,a}\"" }),
            json!({ "command": ["ls", "~root", "{/etc,a}"] }),
            json!({ "command": "ls '/workspace/.?/etc' \"*\" \\[a] '=git' a=b" }),
            json!({ "command": ["ls", "/workspace/*", "=git"] }),
            // Values inside words that stay inside the allowlist, or are no paths.
            json!({ "command": "git log --grep=a=/workspace" }),
            json!({ "command": "git diff /workspace/a:b /workspace/c,d" }),
            json!({ "command": "git log --format=%h,%s --grep=https://example.com/a" }),
            json!({ "command": "git log --grep=git@github.com:org/repo" }),
            json!({ "command": "git diff -I./include/x @/workspace/list" }),
            json!({ "command": "git log -n3 --format=a/b" }),
            json!({ "command": "git log HEAD..main" }),
            json!({ "command": "git diff a/b" }),
            json!({ "command": "git diff -C/workspace/x" }),
        ];
        for call in allowed {
            assert_eq!(with_paths(call.clone()), Ok(()), "{call}");
        }
        let refused = [
            json!({ "command": "git diff --output=/etc/x" }),
            json!({ "command": "git diff -o=/etc/x" }),
            json!({ "command": "git diff /etc/passwd" }),
            json!({ "command": "git diff '/etc/passwd'" }),
            json!({ "command": "git diff /workspace/../etc/passwd" }),
            json!({ "command": "git diff --output=/workspace/../../x" }),
            json!({ "command": "ls /" }),
            json!({ "command": "ls /workspace2" }),
            json!({ "command": ["git", "diff", "--output=/etc/x"] }),
            json!({ "command": "git", "args": ["diff", "/etc/x"] }),
            json!({ "command": "git", "args": ["diff", "x --output=/etc/x"] }),
            json!({ "command": "git", "args": ["diff", "x '/etc/x'"] }),
            json!({ "command": "git", "args": ["diff", "/work\"space\"/x"] }),
            // A shell expands these into paths outside the allowlist.
            json!({ "command": "git diff --no-index ~/.ssh/id_ed25519 a" }),
            json!({ "command": "ls -la ~root/.ssh" }),
            json!({ "command": "git diff --no-index {/etc/shadow,/workspace/a}" }),
            json!({ "command": "git diff --output=~/x" }),
            json!({ "command": "git", "args": ["diff", "~/x"] }),
            // Relative paths that climb out of the working directory.
            json!({ "command": "ls ../../etc" }),
            json!({ "command": "git diff --no-index a/../../../etc/shadow b" }),
            json!({ "command": "git diff --output=../x" }),
            json!({ "command": "git diff -I../x" }),
            json!({ "command": ["ls", ".."] }),
            // An option's value attached to its name.
            json!({ "command": "git diff -O/etc/order" }),
            json!({ "command": "git diff --stat -C/etc" }),
            // Globs a shell expands into paths (SPEC 6.3 r3), and zsh's `=program`.
            json!({ "command": "ls /workspace/.?/etc/passwd" }),
            json!({ "command": "ls /workspace/.[.]/etc/shadow" }),
            json!({ "command": "ls /workspace/*" }),
            json!({ "command": "ls =git" }),
            json!({ "command": "git", "args": ["diff", "/workspace/.?/x"] }),
            // Values inside a word: NAME=VALUE, values of values, lists, @FILE, file: URLs.
            json!({ "command": "git diff if=/etc/shadow" }),
            json!({ "command": "git diff DESTDIR=/" }),
            json!({ "command": "git log", "args": ["x=/etc"] }),
            json!({ "command": ["git", "diff", "if=/etc/shadow"] }),
            json!({ "command": "git log --grep=a=/etc" }),
            json!({ "command": "git diff if=../../etc/shadow" }),
            json!({ "command": "git diff /workspace/a:/etc/shadow" }),
            json!({ "command": "git diff /workspace:x" }),
            json!({ "command": "git diff -Wl,-rpath,/etc" }),
            json!({ "command": "git diff --no-index @/etc/shadow a" }),
            json!({ "command": "git diff -d@/etc/passwd" }),
            json!({ "command": "git diff --src=file:///etc/passwd" }),
            json!({ "command": "git diff FILE:/etc/passwd" }),
            json!({ "command": "git diff https://example.com/a,/etc/shadow" }),
            json!({ "command": "git diff x://../../etc/shadow" }),
            json!({ "command": "git diff https:///etc/shadow" }),
        ];
        for call in refused {
            assert_eq!(
                with_paths(call.clone()).map_err(|(code, _)| code),
                Err(2002),
                "{call}"
            );
        }
        // A bad command shape is a 2003 before any path is looked at.
        assert_eq!(
            with_paths(json!({ "command": "git -C /etc status" })).map_err(|(code, _)| code),
            Err(2003)
        );
    }

    #[test]
    fn error_messages_name_the_place_and_the_rule() {
        let rule = git_rule();
        let check = |call: Value| {
            rule.check(&args(call))
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        let cases = [
            (
                json!({ "command": "git push" }),
                "argument \"command\": word 2 is not in subcommand_allowlist",
            ),
            (
                json!({ "command": "git -v" }),
                "argument \"command\": word 2 is an option before the subcommand",
            ),
            (
                json!({ "command": "git" }),
                "argument \"command\": word 1 needs a subcommand from subcommand_allowlist",
            ),
            (
                json!({ "command": "/tmp/x/git status" }),
                "argument \"command\": word 1 is not in command_allowlist",
            ),
            (
                json!({ "command": "git status; rm" }),
                "argument \"command\": word 2 is shell syntax outside quotes",
            ),
            (
                json!({ "command": "git status #; rm -rf /" }),
                "argument \"command\": word 3 is shell syntax outside quotes",
            ),
            (
                json!({ "command": ["git", 2] }),
                "argument \"command\"[1] is a number, not a string",
            ),
            (
                json!({ "command": ["git", "--git-dir=/x", "status"] }),
                "argument \"command\"[1] is an option before the subcommand",
            ),
            (
                json!({ "command": "git", "args": ["push"] }),
                "argument \"args\"[0] is not in subcommand_allowlist",
            ),
            (
                json!({ "command": "git log", "args": ["x", "a;b"] }),
                "argument \"args\"[1]: word 1 is shell syntax outside quotes",
            ),
            (json!({ "command": " " }), "argument \"command\" is empty"),
            (
                json!({ "command": "\"\" status" }),
                "argument \"command\": word 1 is empty",
            ),
        ];
        for (call, message) in cases {
            assert_eq!(check(call.clone()), Err(message.to_string()), "{call}");
        }
        let path_cases = [
            (
                json!({ "command": "git diff --output=/etc/x" }),
                "argument \"command\": word 3 (a value inside it) is outside path_allowlist",
            ),
            (
                json!({ "command": "ls /workspace/.?/etc" }),
                "argument \"command\": word 2 holds an unquoted '?', which a shell expands into \
                 paths that path_allowlist cannot check; quote it",
            ),
            (
                json!({ "command": "ls ../x" }),
                "argument \"command\": word 2 (a path) climbs with '..' from a working directory \
                 that path_allowlist cannot see",
            ),
            (
                json!({ "command": "git diff --src=file:///x" }),
                "argument \"command\": word 3 holds a file: URL, which path_allowlist cannot check",
            ),
            (
                json!({ "command": "git", "args": ["diff", "x /secret/MARKER"] }),
                "argument \"args\"[1]: word 2 (a path) is outside path_allowlist",
            ),
            (
                json!({ "command": ["git", "diff", "/workspace/../../x"] }),
                "argument \"command\"[2] (a path) climbs above / with ..",
            ),
        ];
        for (call, message) in path_cases {
            assert_eq!(
                with_paths(call.clone()),
                Err((2002, message.to_string())),
                "{call}"
            );
        }
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
        assert!(rule.check(&args(json!({ "command": "ls -la" }))).is_ok());
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
            CommandRule::new(Some(&[]), None).map_err(|e| e.to_string()),
            Err("empty command_allowlist would allow nothing".to_string())
        );
        assert!(CommandRule::new(None, None).is_err());
        assert!(CommandRule::new(Some(&git), Some(&BTreeMap::new())).is_err());
        assert!(CommandRule::new(Some(&git), Some(&table("git", &[]))).is_err());
        assert_eq!(
            CommandRule::new(Some(&git), Some(&table("npm", &["test"]))).map_err(|e| e.to_string()),
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

    fn option_rule(options: &[(&str, &[&str])]) -> Result<CommandRule, OptionsError> {
        let table: BTreeMap<String, Vec<String>> = options
            .iter()
            .map(|(key, list)| (key.to_string(), strings(list)))
            .collect();
        git_rule().with_options(&table)
    }

    fn git_log_options() -> CommandRule {
        match option_rule(&[
            ("git log", &["--oneline", "-n", "--format"]),
            ("git", &["-s", "--stat"]),
            ("ls", &["-l", "-a", "-abc"]),
        ]) {
            Ok(rule) => rule,
            Err(problem) => panic!("test option rule refused: {problem}"),
        }
    }

    fn options_check(call: Value) -> Result<(), String> {
        git_log_options()
            .check(&args(call))
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_value_after_equals_is_checked_whole_too() {
        for (command, code) in [
            ("git diff --output=/workspace:x", Some(2002)),
            ("git diff --output=/workspace/a:/workspace/b", None),
            ("ls =/workspace:x/etc", Some(2002)),
            ("ls PATH=/workspace/bin:/workspace/x", None),
        ] {
            assert_eq!(
                with_paths(json!({ "command": command })).map_err(|(code, _)| code),
                code.map_or(Ok(()), Err),
                "{command}"
            );
        }
    }

    #[test]
    fn options_are_compared_by_name_before_any_equals() {
        for command in [
            "git log --oneline",
            "git log -n5 --oneline",
            "git log -n 5",
            "git log --format=%H",
            "git log '--format=%H %s'",
            "git log -- --output=x.txt",
            "git status -s",
            "git diff --stat",
            "ls -la",
            "ls -abc",
            "ls -l /workspace",
            "ls",
        ] {
            assert_eq!(
                options_check(json!({ "command": command })),
                Ok(()),
                "{command}"
            );
        }
        for (command, option) in [
            ("git log --output=x.txt", "\"--output\""),
            ("git log --oneline --output x.txt", "\"--output\""),
            ("git log -p", "\"-p\""),
            ("git log -np", "\"-p\""),
            ("git log -n5x", "\"-5\""),
            ("git log '--output=x.txt'", "\"--output\""),
            // "git log" is the most specific entry: the "git" entry's options do not reach it.
            ("git log --stat", "\"--stat\""),
            ("git status --porcelain", "\"--porcelain\""),
            ("ls -lR", "\"-R\""),
            ("ls -", "\"-\""),
        ] {
            match options_check(json!({ "command": command })) {
                Ok(()) => panic!("{command} should be refused"),
                Err(problem) => assert!(
                    problem.contains(&format!("the option {option},"))
                        && !problem.contains("x.txt"),
                    "{command}: {problem}"
                ),
            }
        }
    }

    #[test]
    fn options_in_args_are_checked_as_argv_and_as_joined_shell_text() {
        for (call, allowed) in [
            (json!({"command": ["git", "log", "--output=x"]}), false),
            (json!({"command": ["git", "log", "--", "--output=x"]}), true),
            (json!({"command": "git log", "args": ["--oneline"]}), true),
            (json!({"command": "git log", "args": ["--output=x"]}), false),
            // Joined into shell text the element is two words, and the second is an option.
            (
                json!({"command": "git log", "args": ["x --output=y"]}),
                false,
            ),
            // As argv, this `--` is no separator, so the next element is an option.
            (
                json!({"command": "git log", "args": ["a -- b", "--output=y"]}),
                false,
            ),
            (json!({"command": "git", "args": ["log", "-n3"]}), true),
            (
                json!({"command": "git", "args": ["log", "--output=y"]}),
                false,
            ),
        ] {
            assert_eq!(options_check(call.clone()).is_ok(), allowed, "{call}");
        }
    }

    #[test]
    fn the_option_splitter() {
        let listed: BTreeSet<String> = strings(&["-a", "-b", "-n", "--format", "-xyz"])
            .into_iter()
            .collect();
        for (word, unlisted) in [
            ("-a", None),
            ("-ab", None),
            ("-abn12", None),
            ("-n5", None),
            ("-n=5", None),
            ("--format=%H", None),
            ("-xyz", None),
            ("-xyz=1", None),
            ("-x", Some("-x")),
            ("-ax", Some("-x")),
            ("-a5b", Some("-5")),
            ("-", Some("-")),
            ("--", Some("--")),
            ("--form", Some("--form")),
            ("--format-x=1", Some("--format-x")),
            ("-é", Some("-é")),
            ("-aé", Some("-é")),
        ] {
            assert_eq!(
                unlisted_option(word, &listed).as_deref(),
                unlisted,
                "{word}"
            );
        }
    }

    #[test]
    fn refuses_bad_option_allowlists() {
        for (table, key, index) in [
            (vec![("cargo", &["-q"][..])], Some("cargo"), None),
            (vec![("git push", &["-q"][..])], Some("git push"), None),
            (vec![("ls -l", &["-a"][..])], Some("ls -l"), None),
            (vec![("ls x", &["-a"][..])], Some("ls x"), None),
            (vec![("git log x", &["-a"][..])], Some("git log x"), None),
            (vec![("git  log", &["-a"][..])], Some("git  log"), None),
            (vec![("git log", &["-a", ""][..])], Some("git log"), Some(1)),
            (
                vec![("git log", &["oneline"][..])],
                Some("git log"),
                Some(0),
            ),
            (
                vec![("git log", &["--format=%H"][..])],
                Some("git log"),
                Some(0),
            ),
            (vec![("git log", &["--"][..])], Some("git log"), Some(0)),
            (vec![("git log", &["--a b"][..])], Some("git log"), Some(0)),
            (vec![], None, None),
        ] {
            match option_rule(&table) {
                Ok(_) => panic!("{table:?} should be refused"),
                Err(refused) => {
                    assert_eq!(refused.key.as_deref(), key, "{refused}");
                    assert_eq!(refused.index, index, "{refused}");
                }
            }
        }
        // An empty list allows the command without any option.
        let rule = option_rule(&[("git status", &[])]);
        assert!(rule.is_ok());
        let rule = rule.unwrap_or_else(|_| git_rule());
        assert!(rule.check(&args(json!({"command": "git status"}))).is_ok());
        assert!(rule
            .check(&args(json!({"command": "git status -s"})))
            .is_err());
        assert!(rule.check(&args(json!({"command": "git log -p"}))).is_ok());
    }
}
