//! The `path_allowlist` check of a capability (SPEC 6.3, **paths**; a violation is code 2002).
//!
//! Paths are compared lexically: the gateway never touches the file system, so `.` and `..` are
//! resolved on the text, repeated `/` collapse, and a path is inside an allowlisted directory only
//! when all of that directory's components are its leading components. Symbolic links are the
//! tool's business. Percent signs, `~` and Unicode look-alikes are ordinary characters (no decoding,
//! no home expansion). A backslash is refused outright: a tool on Windows, or one that hands the
//! path to a Windows-style path library, would read `/workspace/..\..\etc` as an escape even though
//! POSIX sees one odd file name.

use std::borrow::Cow;

use serde_json::{Map, Value};

use super::arguments::each_value;
use super::error::{ArgumentAt, PathProblem, RuleError, Violation};
use crate::envelope::json_kind;

/// Argument keys that hold paths when a capability does not name its own `path_arguments`.
pub const DEFAULT_PATH_ARGUMENTS: &[&str] = &[
    "path",
    "paths",
    "source",
    "destination",
    "file",
    "directory",
    "cwd",
];

/// A compiled `path_allowlist`: normalised directories and the argument keys to inspect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathRule {
    /// Normalised absolute directories; `/` allows every absolute path.
    allowed_directories: Vec<String>,
    /// Argument keys whose values are paths, matched without regard to ASCII case (SPEC 6.3 r3).
    path_arguments: Vec<String>,
}

impl PathRule {
    /// Compiles the rule once, at policy load. Entries must be absolute and are normalised here so
    /// that the per-call check can compare plain strings.
    pub fn new(
        allowlist: &[String],
        path_arguments: Option<&[String]>,
    ) -> Result<PathRule, RuleError> {
        if allowlist.is_empty() {
            return Err(RuleError::EmptyAllowlist("path_allowlist"));
        }
        let mut allowed_directories = Vec::with_capacity(allowlist.len());
        for entry in allowlist {
            let normalised = normalize_absolute(entry).map_err(|problem| RuleError::PathEntry {
                entry: entry.clone(),
                problem,
            })?;
            if !allowed_directories.contains(&normalised) {
                allowed_directories.push(normalised);
            }
        }
        let path_arguments = match path_arguments {
            None => DEFAULT_PATH_ARGUMENTS
                .iter()
                .map(|key| (*key).to_string())
                .collect(),
            Some([]) => return Err(RuleError::NoPathArguments),
            Some(keys) => {
                if keys.iter().any(String::is_empty) {
                    return Err(RuleError::EmptyArgumentName);
                }
                keys.to_vec()
            }
        };
        Ok(PathRule {
            allowed_directories,
            path_arguments,
        })
    }

    /// The normalised allowlisted directories, for `policy explain` and tests.
    pub fn allowed_directories(&self) -> &[String] {
        &self.allowed_directories
    }

    /// The argument keys this rule inspects.
    pub fn path_arguments(&self) -> &[String] {
        &self.path_arguments
    }

    /// Checks every path-valued argument of one call. The error names the argument (and the array
    /// index) and the rule it broke, never the value (SPEC 9.1 r2).
    pub fn check(&self, arguments: &Map<String, Value>) -> Result<(), Violation> {
        for (key, index, item) in each_value(arguments, &self.path_arguments) {
            let at = ArgumentAt {
                key: key.to_owned(),
                index,
            };
            match item {
                Value::String(path) => self
                    .check_value(path)
                    .map_err(|problem| Violation::Path { at, problem })?,
                other => {
                    return Err(Violation::NotPath {
                        at,
                        got: json_kind(other),
                    })
                }
            }
        }
        Ok(())
    }

    /// The check of one path value, also applied to paths inside a command (SPEC 6.3 r2). The problem
    /// reads after the name of what held the value (`is outside path_allowlist`) and never quotes it.
    pub fn check_value(&self, path: &str) -> Result<(), PathProblem> {
        let normalised = normalize_cow(path)?;
        if self
            .allowed_directories
            .iter()
            .any(|directory| is_at_or_below(&normalised, directory))
        {
            Ok(())
        } else {
            Err(PathProblem::Outside)
        }
    }
}

/// Lexically normalises an absolute POSIX path: `.` dropped, `..` removes the previous component,
/// repeated and trailing `/` collapse. Refuses an empty or relative path, NUL, backslashes, and a
/// `..` that would climb above `/` (refused rather than clamped, so `/../etc` is not `/etc`).
pub fn normalize_absolute(path: &str) -> Result<String, PathProblem> {
    normalize_cow(path).map(Cow::into_owned)
}

/// Normalisation that borrows the input when it is already normal, so the common per-call case
/// (a clean absolute path) does not allocate.
fn normalize_cow(path: &str) -> Result<Cow<'_, str>, PathProblem> {
    if path.is_empty() {
        return Err(PathProblem::Empty);
    }
    if path.contains('\0') {
        return Err(PathProblem::Nul);
    }
    if path.contains('\\') {
        return Err(PathProblem::Backslash);
    }
    let Some(rest) = path.strip_prefix('/') else {
        return Err(PathProblem::NotAbsolute);
    };
    if rest.is_empty() || rest.split('/').all(is_plain_component) {
        return Ok(Cow::Borrowed(path));
    }
    let mut components: Vec<&str> = Vec::new();
    for component in rest.split('/') {
        match component {
            "" | "." => {}
            ".." => {
                if components.pop().is_none() {
                    return Err(PathProblem::ClimbsAboveRoot);
                }
            }
            name => components.push(name),
        }
    }
    let mut normalised = String::with_capacity(path.len());
    if components.is_empty() {
        normalised.push('/');
    }
    for component in components {
        normalised.push('/');
        normalised.push_str(component);
    }
    Ok(Cow::Owned(normalised))
}

/// A component that normalisation keeps as is.
fn is_plain_component(component: &str) -> bool {
    !matches!(component, "" | "." | "..")
}

/// Both arguments are normalised: `directory` allows itself and anything whose next byte after the
/// directory is a separator, so `/workspace` never allows `/workspace2`.
fn is_at_or_below(path: &str, directory: &str) -> bool {
    if directory == "/" {
        return true;
    }
    match path.strip_prefix(directory) {
        Some("") => true,
        Some(rest) => rest.starts_with('/'),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rule(allowlist: &[&str]) -> PathRule {
        let entries: Vec<String> = allowlist.iter().map(|entry| entry.to_string()).collect();
        match PathRule::new(&entries, None) {
            Ok(rule) => rule,
            Err(problem) => panic!("test allowlist {allowlist:?} refused: {problem}"),
        }
    }

    fn args(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            other => panic!("test arguments must be an object, got {other}"),
        }
    }

    fn path_allowed(rule: &PathRule, path: &str) -> bool {
        rule.check(&args(json!({ "path": path }))).is_ok()
    }

    #[test]
    fn normalises_dots_and_separators() {
        let cases = [
            ("/", "/"),
            ("//", "/"),
            ("///", "/"),
            ("/.", "/"),
            ("/./", "/"),
            ("/workspace", "/workspace"),
            ("/workspace/", "/workspace"),
            ("//workspace//a//", "/workspace/a"),
            ("/workspace/./a", "/workspace/a"),
            ("/workspace/a/..", "/workspace"),
            ("/workspace/a/../b", "/workspace/b"),
            ("/workspace/../etc", "/etc"),
            ("/workspace/a/../../etc", "/etc"),
            ("/a/b/c/../../..", "/"),
            ("/workspace/...", "/workspace/..."),
            ("/workspace/..a", "/workspace/..a"),
            ("/workspace/.a/b.", "/workspace/.a/b."),
            ("/workspace/%2e%2e/etc", "/workspace/%2e%2e/etc"),
            ("/workspace/~", "/workspace/~"),
        ];
        for (input, expected) in cases {
            assert_eq!(
                normalize_absolute(input).as_deref(),
                Ok(expected),
                "input {input:?}"
            );
        }
    }

    #[test]
    fn normalisation_refuses_bad_paths() {
        let cases = [
            ("", "is empty"),
            ("workspace/a", "is not absolute"),
            ("./workspace", "is not absolute"),
            ("~/workspace", "is not absolute"),
            (" /workspace", "is not absolute"),
            ("/..", "climbs above / with .."),
            ("/../workspace", "climbs above / with .."),
            ("/workspace/../../etc", "climbs above / with .."),
            ("/a/./../..", "climbs above / with .."),
            ("/workspace/\0", "contains a NUL byte"),
            ("/workspace\\..\\etc", "contains a backslash"),
            ("C:\\workspace", "contains a backslash"),
        ];
        for (input, problem) in cases {
            assert_eq!(
                normalize_absolute(input).map_err(|e| e.to_string()),
                Err(problem.to_string()),
                "input {input:?}"
            );
        }
    }

    #[test]
    fn clean_paths_are_borrowed_not_copied() {
        assert!(matches!(
            normalize_cow("/workspace/a/b.txt"),
            Ok(Cow::Borrowed(_))
        ));
        assert!(matches!(normalize_cow("/"), Ok(Cow::Borrowed(_))));
        assert!(matches!(normalize_cow("/workspace/"), Ok(Cow::Owned(_))));
    }

    #[test]
    fn compares_whole_components() {
        let workspace = rule(&["/workspace"]);
        for allowed in [
            "/workspace",
            "/workspace/",
            "/workspace/a",
            "/workspace//a/./b",
            "/workspace/a/..",
            "//workspace",
            "/workspace/...",
            "/workspace/%2e%2e/etc",
        ] {
            assert!(path_allowed(&workspace, allowed), "{allowed:?} refused");
        }
        for refused in [
            "/workspace2",
            "/workspace2/a",
            "/workspac",
            "/work",
            "/",
            "/etc/passwd",
            "/workspace/../etc",
            "/workspace/a/../../etc",
            "/workspace/..",
            "/../workspace",
            "/Workspace",
            "/workspace\\..\\etc",
            "workspace/a",
            "~/a",
            "",
            "/workspace/\0",
            "/wоrkspace",
        ] {
            assert!(!path_allowed(&workspace, refused), "{refused:?} allowed");
        }
    }

    #[test]
    fn allowlist_entries_are_normalised_on_load() {
        let messy = rule(&["/workspace/", "//srv/./data/x/.."]);
        assert_eq!(messy.allowed_directories(), ["/workspace", "/srv/data"]);
        assert!(path_allowed(&messy, "/srv/data/file"));
        assert!(!path_allowed(&messy, "/srv/database"));
        let duplicated = rule(&["/a", "/a/", "/a/."]);
        assert_eq!(duplicated.allowed_directories(), ["/a"]);
    }

    #[test]
    fn root_entry_allows_every_absolute_path_only() {
        let root = rule(&["/"]);
        assert!(path_allowed(&root, "/"));
        assert!(path_allowed(&root, "/etc/passwd"));
        assert!(path_allowed(&root, "/a/../b"));
        assert!(!path_allowed(&root, "relative"));
        assert!(!path_allowed(&root, "/../etc"));
        assert!(!path_allowed(&root, ""));
    }

    #[test]
    fn several_directories() {
        let two = rule(&["/workspace", "/tmp/scratch"]);
        assert!(path_allowed(&two, "/tmp/scratch/x"));
        assert!(path_allowed(&two, "/workspace/y"));
        assert!(!path_allowed(&two, "/tmp"));
        assert!(!path_allowed(&two, "/tmp/scratchpad"));
    }

    #[test]
    fn refuses_bad_allowlists() {
        let entries =
            |list: &[&str]| -> Vec<String> { list.iter().map(|s| s.to_string()).collect() };
        assert_eq!(
            PathRule::new(&[], None).map_err(|e| e.to_string()),
            Err("empty path_allowlist would allow nothing".to_string())
        );
        for bad in ["workspace", "", "/../x", "/a\0", "~", "/a\\b"] {
            assert!(
                PathRule::new(&entries(&[bad]), None).is_err(),
                "{bad:?} accepted"
            );
        }
        assert!(PathRule::new(&entries(&["/w"]), Some(&[])).is_err());
        assert!(PathRule::new(&entries(&["/w"]), Some(&entries(&[""]))).is_err());
    }

    #[test]
    fn checks_every_default_key_and_only_those() {
        let workspace = rule(&["/workspace"]);
        for key in DEFAULT_PATH_ARGUMENTS {
            let mut call = Map::new();
            call.insert(key.to_string(), json!("/etc/passwd"));
            assert!(workspace.check(&call).is_err(), "key {key} not checked");
        }
        // Matched without regard to ASCII case (SPEC 6.3 r3): a tool's decoder may read `Path` as `path`.
        for key in ["Path", "FILE", "cWd", "Paths"] {
            let call = args(json!({ key: ["/etc/passwd"] }));
            assert!(workspace.check(&call).is_err(), "key {key} not checked");
        }
        assert!(workspace
            .check(&args(
                json!({ "target": "/etc/passwd", "pathname": "/etc" })
            ))
            .is_ok());
        assert!(workspace.check(&Map::new()).is_ok());
    }

    #[test]
    fn custom_path_arguments_replace_the_default() {
        let keys = vec!["target".to_string()];
        let custom = match PathRule::new(&["/workspace".to_string()], Some(&keys)) {
            Ok(rule) => rule,
            Err(problem) => panic!("{problem}"),
        };
        assert_eq!(custom.path_arguments(), ["target"]);
        assert!(custom.check(&args(json!({ "target": "/etc" }))).is_err());
        assert!(custom.check(&args(json!({ "path": "/etc" }))).is_ok());
        assert!(custom
            .check(&args(json!({ "target": "/workspace/x" })))
            .is_ok());
    }

    #[test]
    fn arrays_and_other_types() {
        let workspace = rule(&["/workspace"]);
        assert!(workspace
            .check(&args(json!({ "paths": ["/workspace/a", "/workspace/b"] })))
            .is_ok());
        assert!(workspace.check(&args(json!({ "paths": [] }))).is_ok());
        assert_eq!(
            workspace
                .check(&args(json!({ "paths": ["/workspace/a", "/etc"] })))
                .map_err(|e| e.to_string()),
            Err("argument \"paths\"[1] is outside path_allowlist".to_string())
        );
        for bad in [
            json!(null),
            json!(1),
            json!(true),
            json!({ "path": "/workspace" }),
            json!(["/workspace", 1]),
            json!(["/workspace", null]),
            json!([["/workspace"]]),
        ] {
            assert!(
                workspace.check(&args(json!({ "path": bad }))).is_err(),
                "{bad} accepted"
            );
        }
    }

    #[test]
    fn error_messages_name_argument_and_rule_never_the_value() {
        let workspace = rule(&["/workspace"]);
        let cases = [
            (
                json!({ "cwd": "/workspace/../secret/MARKER" }),
                "argument \"cwd\" is outside path_allowlist",
            ),
            (
                json!({ "file": "secret/MARKER.txt" }),
                "argument \"file\" is not absolute",
            ),
            (
                json!({ "path": "/workspace/../../secret/MARKER" }),
                "argument \"path\" climbs above / with ..",
            ),
            (
                json!({ "paths": ["/workspace/a", "/workspace\\..\\secret\\MARKER"] }),
                "argument \"paths\"[1] contains a backslash",
            ),
            (
                json!({ "source": 7 }),
                "argument \"source\": expected a path string or an array of them, got a number",
            ),
        ];
        for (call, message) in cases {
            assert_eq!(
                workspace
                    .check(&args(call.clone()))
                    .map_err(|e| e.to_string()),
                Err(message.to_string()),
                "{call}"
            );
        }
    }
}
