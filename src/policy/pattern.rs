//! Tool-name patterns of SPEC 6.2 (r4): an exact name, or a name with `*` anywhere (`*`, `fs.*`,
//! `fs.read*`, `*.delete`), where `*` matches any run of characters, empty included, except that a
//! pattern ending in `.*` wants at least one character after the dot (`fs.*` never matches `fs`).
//!
//! Patterns are parsed once (at load time) into the literal pieces between the stars, so matching is
//! a prefix test, a suffix test and a leftmost search for each middle piece: linear in the name for
//! each piece, with no backtracking, and never the `starts_with("fs")` mistake that lets `fs.*`
//! match `fsx.read`.

use std::fmt;

use super::error::{PatternProblem, RuleError};

pub use super::limits::MAX_TOOL_NAME_BYTES;

/// True when `name` is a valid tool name: `^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$`, at most 128 bytes.
pub fn is_valid_tool_name(name: &str) -> bool {
    name.len() <= MAX_TOOL_NAME_BYTES && is_dotted_segments(name)
}

/// One or more non-empty `[A-Za-z0-9_-]` segments joined by single dots.
fn is_dotted_segments(text: &str) -> bool {
    !text.is_empty()
        && text.split('.').all(|segment| {
            !segment.is_empty()
                && segment
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        })
}

/// A parsed tool pattern.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Pattern {
    /// The literal text between the stars: one piece for an exact name, `stars + 1` otherwise.
    pieces: Vec<String>,
    /// The pattern ends in `.*`: its last star matches at least one character (the `family.*` rule).
    tail_needs_a_character: bool,
    /// The pattern as written, for rules, audit events and the API.
    text: String,
}

impl Pattern {
    /// Parses a pattern: tool-name characters, dots between non-empty segments, and single `*`s.
    /// `**`, `?`, `[`, `{` or any other character is an error that names the pattern.
    pub fn parse(text: &str) -> Result<Pattern, RuleError> {
        if text.len() > MAX_TOOL_NAME_BYTES {
            return Err(RuleError::PatternTooLong);
        }
        let invalid = |problem| RuleError::Pattern {
            pattern: text.to_owned(),
            problem,
        };
        if text.contains("**") {
            return Err(invalid(PatternProblem::DoubleStar));
        }
        if let Some(other) = text
            .chars()
            .find(|&c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '*')))
        {
            return Err(invalid(
                if matches!(other, '?' | '[' | ']' | '{' | '}' | '!' | '^') {
                    PatternProblem::Glob(other)
                } else {
                    PatternProblem::Character(other)
                },
            ));
        }
        // Each star stands for at least one name character here, so `fs.`, `.*` and `fs..*` are
        // refused the way `fs.` and `fs..x` are refused as names.
        if !is_dotted_segments(&text.replace('*', "x")) {
            return Err(invalid(PatternProblem::NotDotted));
        }
        Ok(Pattern {
            pieces: text.split('*').map(str::to_owned).collect(),
            tail_needs_a_character: text.ends_with(".*"),
            text: text.to_owned(),
        })
    }

    /// True when `tool` is matched. Names that are not valid tool names never match,
    /// so a pattern cannot be tricked by `fs.` or `fs..x`.
    pub fn matches(&self, tool: &str) -> bool {
        if !is_valid_tool_name(tool) {
            return false;
        }
        let name = if self.tail_needs_a_character {
            // `X.*` wanting one character after the dot is `X.*` on the name less its last
            // character (a valid name is ASCII, so that is one byte).
            match tool.len().checked_sub(1) {
                Some(end) => &tool[..end],
                None => return false,
            }
        } else {
            tool
        };
        glob_matches(&self.pieces, name)
    }

    /// True when some tool routed to `upstream` (named `upstream` or `upstream.…`) could be matched.
    pub fn could_match_within(&self, upstream: &str) -> bool {
        if self.matches(upstream) {
            return true;
        }
        let routed = format!("{upstream}.");
        let first = &self.pieces[0];
        if self.pieces.len() == 1 {
            return first.starts_with(&routed);
        }
        // The first star can absorb the rest of `upstream.`, and the rest of the pattern, its stars
        // filled with one character, then still makes a valid name (that is what `parse` checked).
        first.starts_with(&routed) || routed.starts_with(first.as_str())
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

/// Whole-name match of `pieces` joined by `*` (any run, empty included). The first piece is a
/// prefix, the last a suffix, and each middle piece is taken at its leftmost place after the one
/// before: the leftmost place leaves the most room for the rest, so no other choice needs trying.
fn glob_matches(pieces: &[String], name: &str) -> bool {
    let (first, rest) = match pieces.split_first() {
        Some(split) => split,
        None => return false,
    };
    let Some((last, middle)) = rest.split_last() else {
        return name == first;
    };
    if name.len() < first.len() + last.len()
        || !name.starts_with(first.as_str())
        || !name.ends_with(last.as_str())
    {
        return false;
    }
    let mut between = &name[first.len()..name.len() - last.len()];
    for piece in middle {
        match between.find(piece.as_str()) {
            Some(at) => between = &between[at + piece.len()..],
            None => return false,
        }
    }
    true
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl serde::Serialize for Pattern {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(pattern: &str, tool: &str) -> bool {
        match Pattern::parse(pattern) {
            Ok(parsed) => parsed.matches(tool),
            Err(error) => panic!("pattern {pattern:?} should parse: {error}"),
        }
    }

    #[test]
    fn match_table() {
        let table: &[(&str, &str, bool)] = &[
            ("*", "fs.read", true),
            ("*", "x", true),
            ("fs.*", "fs.read", true),
            ("fs.*", "fs.dir.list", true),
            ("fs.*", "fs", false),
            ("fs.*", "fsx.read", false),
            ("fs.*", "Fs.read", false),
            ("fs.*", "xfs.read", false),
            ("fs.dir.*", "fs.dir.list", true),
            ("fs.dir.*", "fs.dir", false),
            ("fs.dir.*", "fs.directory.list", false),
            ("fs.read", "fs.read", true),
            ("fs.read", "fs.Read", false),
            ("fs.read", "fs.read2", false),
            ("fs.read", "fs.rea", false),
            ("fs.read", "fs.read.x", false),
            ("web-fetch_2", "web-fetch_2", true),
        ];
        for (pattern, tool, expected) in table {
            assert_eq!(
                matches(pattern, tool),
                *expected,
                "pattern {pattern:?} against {tool:?}"
            );
        }
    }

    #[test]
    fn invalid_tool_names_never_match() {
        for tool in ["", "fs.", "fs..x", ".fs", "fs.a b", "fs.*", "fs/read"] {
            assert!(!matches("*", tool), "{tool:?}");
            assert!(!matches("fs.*", tool), "{tool:?}");
        }
        let long = format!("fs.{}", "a".repeat(MAX_TOOL_NAME_BYTES));
        assert!(!matches("fs.*", &long));
    }

    #[test]
    fn invalid_pattern_forms_are_refused() {
        for text in [
            "",
            "f?",
            "**",
            "fs.**",
            "**.read",
            "fs.",
            ".*",
            "*.",
            "fs..*",
            "fs.*.",
            "fs. *",
            "fs.read ",
            " fs.read",
            "fs/read",
            "fs.\u{e9}",
            "fs.[ab]",
            "fs.{a,b}",
            "fs.read!",
            "fs.^x",
        ] {
            assert!(Pattern::parse(text).is_err(), "{text:?} should be refused");
        }
        let too_long = "a".repeat(MAX_TOOL_NAME_BYTES + 1);
        assert!(Pattern::parse(&too_long).is_err());
        assert!(Pattern::parse(&"a".repeat(MAX_TOOL_NAME_BYTES)).is_ok());
    }

    #[test]
    fn errors_name_the_pattern_and_the_reason() {
        let error = |text: &str| Pattern::parse(text).unwrap_err().to_string();
        assert!(error("fs.**").contains("\"fs.**\"") && error("fs.**").contains("\"**\""));
        assert!(
            error("fs.rea?").contains("'?' is glob syntax"),
            "{}",
            error("fs.rea?")
        );
        assert!(error("fs.[ab]").contains("'[' is glob syntax"));
        assert!(error("fs.{a,b}").contains("'{' is glob syntax"));
        assert!(error("fs..*").contains("\"fs..*\""));
    }

    #[test]
    fn stars_anywhere() {
        let table: &[(&str, &str, bool)] = &[
            ("fs.read*", "fs.read", true),
            ("fs.read*", "fs.read_file", true),
            ("fs.read*", "fs.read.x", true),
            ("fs.read*", "fs.rea", false),
            ("fs.read*", "fs.Read_file", false),
            ("fs.read*", "xfs.read", false),
            ("*.delete", "fs.delete", true),
            ("*.delete", "db.delete", true),
            ("*.delete", "a.b.delete", true),
            ("*.delete", "delete", false),
            ("*.delete", "fs.delete2", false),
            ("*fs", "fs", true),
            ("fs*", "fsx.read", true),
            ("fs.*.list", "fs.dir.list", true),
            ("fs.*.list", "fs..list", false),
            ("fs.*.list", "fs.list", false),
            ("a*b*c", "abc", true),
            ("a*b*c", "aXbYc", true),
            ("a*b*c", "acb", false),
            ("a*a", "a", false),
            ("a*a", "aa", true),
            // Ending in `.*` keeps the family rule, wherever the other stars are.
            ("*.*", "fs", false),
            ("*.*", "fs.read", true),
            ("f*.*", "fs.read", true),
            ("f*.*", "fs", false),
            ("*s.*", "fs.x", true),
        ];
        for (pattern, tool, expected) in table {
            assert_eq!(
                matches(pattern, tool),
                *expected,
                "pattern {pattern:?} against {tool:?}"
            );
        }
    }

    /// A pattern that would make a backtracking matcher try every split stays one pass per piece.
    #[test]
    fn many_stars_on_a_long_name_stay_linear() {
        let name = "a".repeat(MAX_TOOL_NAME_BYTES);
        let pattern = Pattern::parse("a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b").unwrap();
        assert!(!pattern.matches(&name));
        let pattern = Pattern::parse("a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a").unwrap();
        assert!(pattern.matches(&name));
    }

    #[test]
    fn as_str_keeps_the_text() {
        for text in ["*", "fs.*", "fs.read", "fs.read*", "*.delete"] {
            assert_eq!(
                Pattern::parse(text).map(|p| p.as_str().to_owned()),
                Ok(text.to_owned())
            );
        }
    }

    #[test]
    fn could_match_within_an_upstream() {
        let within = |pattern: &str, upstream: &str| {
            Pattern::parse(pattern)
                .unwrap()
                .could_match_within(upstream)
        };
        for pattern in ["*", "fs.*", "fs.dir.*", "fs.read", "fs"] {
            assert!(within(pattern, "fs"), "{pattern}");
        }
        for pattern in ["fsx.*", "fsx", "f.*", "web.fetch"] {
            assert!(!within(pattern, "fs"), "{pattern}");
        }
        for pattern in ["fs.read*", "f*", "*.delete", "*s", "f*.read", "*.*", "fs*"] {
            assert!(within(pattern, "fs"), "{pattern}");
        }
        for pattern in ["fsx*", "web.*", "w*", "fs.*.x.*"] {
            let expected = pattern == "fs.*.x.*";
            assert_eq!(within(pattern, "fs"), expected, "{pattern}");
        }
    }

    /// The SPEC 6.2 rules written the plain way, one character at a time with every split tried:
    /// slow, but obviously right on short inputs.
    fn reference(pattern: &[u8], name: &[u8]) -> bool {
        fn glob(p: &[u8], n: &[u8]) -> bool {
            match p.split_first() {
                None => n.is_empty(),
                Some((b'*', rest)) => (0..=n.len()).any(|skip| glob(rest, &n[skip..])),
                // `?` is never in a parsed pattern: the reference uses it for "one character".
                Some((b'?', rest)) => !n.is_empty() && glob(rest, &n[1..]),
                Some((c, rest)) => n.first() == Some(c) && glob(rest, &n[1..]),
            }
        }
        let name_ok = std::str::from_utf8(name).is_ok_and(is_valid_tool_name);
        if pattern.ends_with(b".*") {
            let mut wants_one = pattern.to_vec();
            wants_one.push(b'?');
            name_ok && glob(&wants_one, name)
        } else {
            name_ok && glob(pattern, name)
        }
    }

    fn schema_regex() -> regex_automata::meta::Regex {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/policies/schema.json");
        let schema: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let deny = schema["properties"]["deny_list"]["items"]["pattern"]
            .as_str()
            .unwrap();
        let capability = schema["$defs"]["CapabilitySpec"]["properties"]["tool_pattern"]["pattern"]
            .as_str()
            .unwrap();
        assert_eq!(deny, capability);
        regex_automata::meta::Regex::new(deny).unwrap()
    }

    proptest::proptest! {
        #[test]
        fn matching_agrees_with_the_reference(
            pattern in "[ab.*]{1,8}",
            name in "[ab.]{0,10}",
        ) {
            if let Ok(parsed) = Pattern::parse(&pattern) {
                proptest::prop_assert_eq!(
                    parsed.matches(&name),
                    reference(pattern.as_bytes(), name.as_bytes()),
                    "pattern {:?} against {:?}", pattern, name
                );
            }
        }

        /// Editors check `tool_pattern` and `deny_list` with policies/schema.json's regex: it accepts
        /// exactly what `parse` accepts.
        #[test]
        fn the_schema_regex_agrees_with_parse(text in "[ab.*?\\[{]{0,8}") {
            proptest::prop_assert_eq!(
                schema_regex().is_match(&text),
                Pattern::parse(&text).is_ok(),
                "{:?}", text
            );
        }

        /// `could_match_within` says yes exactly when some name routed to the upstream matches.
        #[test]
        fn could_match_within_agrees_with_the_names(
            pattern in "[ab.*]{1,6}",
            upstream in "[ab]{1,2}",
        ) {
            if let Ok(parsed) = Pattern::parse(&pattern) {
                // Every name `upstream` or `upstream.` + up to 7 of [ab.]: long enough for patterns of six.
                let mut names = vec![upstream.clone()];
                let mut frontier = vec![String::new()];
                for _ in 0..7 {
                    let mut next = Vec::new();
                    for tail in &frontier {
                        for c in ['a', 'b', '.'] {
                            let longer = format!("{tail}{c}");
                            names.push(format!("{upstream}.{longer}"));
                            next.push(longer);
                        }
                    }
                    frontier = next;
                }
                let some = names.iter().any(|name| parsed.matches(name));
                proptest::prop_assert_eq!(parsed.could_match_within(&upstream), some, "{:?} within {:?}", pattern, upstream);
            }
        }
    }
}
