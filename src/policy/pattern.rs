//! Tool-name patterns of SPEC 6.2: `*`, `family.*`, or one exact tool name.
//!
//! Patterns are parsed once (at load time) into a typed form, so matching is a
//! plain comparison and can never be the `starts_with("fs")` mistake that lets
//! `fs.*` match `fsx.read`.

use std::fmt;

/// Longest tool name (and pattern) accepted, in bytes (SPEC 2).
pub const MAX_TOOL_NAME_BYTES: usize = 128;

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
    kind: PatternKind,
    /// The pattern as written, for rules, audit events and the API.
    text: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum PatternKind {
    /// `*`: every tool.
    Any,
    /// `family.*`: holds `family.` (with the dot) so matching is one prefix test plus a length test.
    Family(String),
    /// An exact, case-sensitive tool name.
    Exact,
}

impl Pattern {
    /// Parses one of the three forms; anything else (`fs*`, `*.read`, `f?`, `fs.*.x`, empty) is an error.
    pub fn parse(text: &str) -> Result<Pattern, String> {
        if text.len() > MAX_TOOL_NAME_BYTES {
            return Err(format!(
                "pattern is longer than {MAX_TOOL_NAME_BYTES} bytes"
            ));
        }
        if text == "*" {
            return Ok(Pattern {
                kind: PatternKind::Any,
                text: text.to_owned(),
            });
        }
        if let Some(family) = text.strip_suffix(".*") {
            if is_dotted_segments(family) {
                return Ok(Pattern {
                    kind: PatternKind::Family(format!("{family}.")),
                    text: text.to_owned(),
                });
            }
            return Err(format!(
                "invalid pattern {text:?}: the part before \".*\" must be a tool-name prefix (letters, digits, '_', '-', joined by '.')"
            ));
        }
        if is_dotted_segments(text) {
            return Ok(Pattern {
                kind: PatternKind::Exact,
                text: text.to_owned(),
            });
        }
        Err(format!(
            "invalid pattern {text:?}: expected \"*\", \"family.*\" or an exact tool name"
        ))
    }

    /// True when `tool` is matched. Names that are not valid tool names never match,
    /// so a pattern cannot be tricked by `fs.` or `fs..x`.
    pub fn matches(&self, tool: &str) -> bool {
        if !is_valid_tool_name(tool) {
            return false;
        }
        match &self.kind {
            PatternKind::Any => true,
            // A valid name that starts with `family.` has at least one more character.
            PatternKind::Family(prefix) => tool.starts_with(prefix.as_str()),
            PatternKind::Exact => tool == self.text,
        }
    }

    /// True when some tool routed to `upstream` (named `upstream` or `upstream.…`) could be matched.
    pub fn could_match_within(&self, upstream: &str) -> bool {
        let routed = format!("{upstream}.");
        match &self.kind {
            PatternKind::Any => true,
            PatternKind::Family(prefix) => {
                prefix.starts_with(&routed) || routed.starts_with(prefix.as_str())
            }
            PatternKind::Exact => self.text == upstream || self.text.starts_with(&routed),
        }
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }
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
            "fs*",
            "*.read",
            "f?",
            "fs.*.x",
            "**",
            "*fs",
            "fs.",
            ".*",
            "fs..*",
            "fs. *",
            "fs.**",
            "fs.read ",
            " fs.read",
            "fs/read",
            "fs.\u{e9}",
            "fs.[ab]",
        ] {
            assert!(Pattern::parse(text).is_err(), "{text:?} should be refused");
        }
        let too_long = "a".repeat(MAX_TOOL_NAME_BYTES + 1);
        assert!(Pattern::parse(&too_long).is_err());
        assert!(Pattern::parse(&"a".repeat(MAX_TOOL_NAME_BYTES)).is_ok());
    }

    #[test]
    fn as_str_keeps_the_text() {
        for text in ["*", "fs.*", "fs.read"] {
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
    }
}
