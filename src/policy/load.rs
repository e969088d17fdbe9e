//! Reading security contexts: YAML policy files (with file, line and field in every error), JSON
//! bodies from the API, and whole policy folders.
//!
//! The YAML reader is configured to refuse what makes a policy hard to review: duplicate keys,
//! merge keys (`<<`), anchors and aliases, custom tags, several documents in one file, and YAML 1.1
//! booleans such as `no` (so `claim: off` stays the string "off").

use std::collections::BTreeMap;
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::options::{DuplicateKeyPolicy, MergeKeyPolicy};
use serde_saphyr::Spanned;

use super::model::{
    ContextSource, FieldPath, FieldSegment, SecurityContext, SecurityContextSpec, SpecError,
};

/// Largest policy file read, in bytes; a policy is a short, human-written document.
pub const MAX_POLICY_FILE_BYTES: u64 = 1024 * 1024;

/// Why a context could not be loaded, with enough position to fix it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyError {
    /// The policy file (absent for API bodies).
    pub file: Option<PathBuf>,
    /// 1-based line in the file, when known.
    pub line: Option<usize>,
    /// The field, as `capabilities[1].path_allowlist`, when known.
    pub field: Option<String>,
    pub message: String,
}

impl fmt::Display for PolicyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(file) = &self.file {
            write!(f, "{}", file.display())?;
            if let Some(line) = self.line {
                write!(f, ":{line}")?;
            }
            f.write_str(": ")?;
        }
        if let Some(field) = &self.field {
            write!(f, "{field}: ")?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for PolicyError {}

impl PolicyError {
    fn in_file(file: &Path, message: impl Into<String>) -> PolicyError {
        PolicyError {
            file: Some(file.to_path_buf()),
            line: None,
            field: None,
            message: message.into(),
        }
    }
}

pub(crate) fn yaml_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        duplicate_keys: DuplicateKeyPolicy::Error,
        merge_keys: MergeKeyPolicy::Error,
        strict_booleans: true,
        reject_unsupported_tags: true,
        reject_tagged_field_names: true,
        with_snippet: false,
        crop_radius: 0,
        budget: serde_saphyr::budget! {
            max_anchors: 0,
            max_aliases: 0,
            max_documents: 1,
        },
    }
}

/// Parses one context from the text of a policy file. `source_path` is used in errors and as the
/// context's source.
pub fn parse_context_yaml(text: &str, source_path: &Path) -> Result<SecurityContext, PolicyError> {
    let mut track = serde_path_to_error::Track::new();
    let parsed =
        serde_saphyr::with_deserializer_from_str_with_options(text, yaml_options(), |de| {
            SecurityContextSpec::deserialize(serde_path_to_error::Deserializer::new(de, &mut track))
        });
    let spec = match parsed {
        Ok(spec) => spec,
        Err(error) => {
            let mut path = field_path_from(&track.path());
            if let serde_saphyr::Error::DuplicateMappingKey { key: Some(key), .. } =
                error.without_snippet()
            {
                path = path.key(key);
            }
            let line = error
                .location()
                .map(|location| location.line())
                .filter(|line| *line > 0)
                .and_then(|line| usize::try_from(line).ok())
                .or_else(|| locate_line(text, &path));
            return Err(PolicyError {
                file: Some(source_path.to_path_buf()),
                line,
                field: (!path.is_root()).then(|| path.to_string()),
                message: yaml_message(&error),
            });
        }
    };
    SecurityContext::compile(spec, ContextSource::File(source_path.to_path_buf())).map_err(
        |SpecError { path, message }| PolicyError {
            file: Some(source_path.to_path_buf()),
            line: locate_line(text, &path),
            field: (!path.is_root()).then(|| path.to_string()),
            message,
        },
    )
}

/// Parses one context from a JSON body (the API's PUT); errors name the field.
pub fn parse_context_json(value: &serde_json::Value) -> Result<SecurityContext, PolicyError> {
    let spec: SecurityContextSpec = serde_path_to_error::deserialize(value).map_err(|error| {
        let path = field_path_from(error.path());
        PolicyError {
            file: None,
            line: None,
            field: (!path.is_root()).then(|| path.to_string()),
            message: error.inner().to_string(),
        }
    })?;
    SecurityContext::compile(spec, ContextSource::Store).map_err(|SpecError { path, message }| {
        PolicyError {
            file: None,
            line: None,
            field: (!path.is_root()).then(|| path.to_string()),
            message,
        }
    })
}

/// Loads every policy file of `dir` (strict: the first invalid file, or a context name defined
/// twice, is an error). Files are read in name order. Shadow files (SPEC 6.4 r4) are checked as
/// strictly but not returned: they decide nothing.
pub fn load_dir(dir: &Path) -> Result<Vec<SecurityContext>, PolicyError> {
    Ok(load_dir_files(dir)?
        .live
        .into_iter()
        .map(|file| file.context)
        .collect())
}

/// The contexts of `dir` as they would be with every shadow version promoted (SPEC 6.4 r4): what
/// `policy test --shadow` decides cases by. Checked as strictly as [`load_dir`].
pub fn load_dir_promoted(dir: &Path) -> Result<Vec<SecurityContext>, PolicyError> {
    let loaded = load_dir_files(dir)?;
    let mut by_name: BTreeMap<String, SecurityContext> = BTreeMap::new();
    for file in loaded.live.into_iter().chain(loaded.shadows) {
        by_name.insert(file.context.name().to_owned(), file.context);
    }
    Ok(by_name.into_values().collect())
}

/// One policy file as read: its path, the SHA-256 of its bytes, and its context.
pub(crate) struct LoadedFile {
    pub path: PathBuf,
    pub digest: String,
    pub context: SecurityContext,
}

/// A policy folder as read: the contexts in force and the shadow versions (`NAME.shadow.yaml`).
pub(crate) struct LoadedDir {
    pub live: Vec<LoadedFile>,
    pub shadows: Vec<LoadedFile>,
}

pub(crate) fn load_dir_files(dir: &Path) -> Result<LoadedDir, PolicyError> {
    let mut loaded = LoadedDir {
        live: Vec::new(),
        shadows: Vec::new(),
    };
    let mut owners: BTreeMap<(bool, String), PathBuf> = BTreeMap::new();
    for path in policy_files(dir)? {
        let text = read_policy_file(&path)?;
        let is_shadow = shadow_name(&path).is_some();
        let context = parse_policy_file(&text, &path)?;
        let key = (is_shadow, context.name().to_owned());
        if let Some(first) = owners.get(&key) {
            return Err(duplicate_name_error(&text, &path, context.name(), first));
        }
        owners.insert(key, path.clone());
        let file = LoadedFile {
            digest: digest(&text),
            path,
            context,
        };
        if is_shadow {
            loaded.shadows.push(file);
        } else {
            loaded.live.push(file);
        }
    }
    Ok(loaded)
}

/// The context a shadow file is the candidate version of: `coding-agent` for
/// `coding-agent.shadow.yaml` (or `.yml`); None for a policy file in force.
pub(crate) fn shadow_name(path: &Path) -> Option<&str> {
    let file = path.file_name()?.to_str()?;
    let stem = file
        .strip_suffix(".yaml")
        .or_else(|| file.strip_suffix(".yml"))?;
    stem.strip_suffix(".shadow")
}

/// Parses a policy file, a shadow file included: a shadow's `name` must be the one its file is named
/// after, so that the file says plainly which context it would replace.
pub(crate) fn parse_policy_file(text: &str, path: &Path) -> Result<SecurityContext, PolicyError> {
    let context = parse_context_yaml(text, path)?;
    match shadow_name(path) {
        Some(expected) if context.name() != expected => {
            let field = FieldPath::root().key("name");
            Err(PolicyError {
                file: Some(path.to_path_buf()),
                line: locate_line(text, &field),
                field: Some(field.to_string()),
                message: format!(
                    "a shadow file's name must be {expected:?}, the context its file is named after"
                ),
            })
        }
        _ => Ok(context),
    }
}

pub(crate) fn duplicate_name_error(
    text: &str,
    path: &Path,
    name: &str,
    first: &Path,
) -> PolicyError {
    let field = FieldPath::root().key("name");
    PolicyError {
        file: Some(path.to_path_buf()),
        line: locate_line(text, &field),
        field: Some(field.to_string()),
        message: format!(
            "duplicate context name {name:?}: also defined in {}",
            first.display()
        ),
    }
}

/// A file's content fingerprint, to tell a real change from a touch.
pub(crate) fn digest(text: &str) -> String {
    crate::envelope::sha256_hex(text.as_bytes())
}

/// The policy files of `dir`, sorted: regular files (symlinks followed) named `*.yaml` or `*.yml`
/// that do not start with a dot (editor swap and lock files do). `schema.json` and anything else
/// is ignored.
pub(crate) fn policy_files(dir: &Path) -> Result<Vec<PathBuf>, PolicyError> {
    let entries = std::fs::read_dir(dir).map_err(|error| {
        PolicyError::in_file(dir, format!("cannot read the policies folder: {error}"))
    })?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|error| {
            PolicyError::in_file(dir, format!("cannot read the policies folder: {error}"))
        })?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let is_policy =
            (name.ends_with(".yaml") || name.ends_with(".yml")) && !name.starts_with('.');
        if !is_policy {
            continue;
        }
        let path = entry.path();
        match std::fs::metadata(&path) {
            Ok(meta) if meta.is_file() => files.push(path),
            // A link whose target is missing is a policy file that cannot be read: the reader names
            // it, so that `policy check` fails and start-up refuses rather than skip it unseen.
            Err(_) if std::fs::symlink_metadata(&path).is_ok() => files.push(path),
            // A file that vanished between listing and stat is simply no longer there.
            _ => {}
        }
    }
    files.sort();
    Ok(files)
}

/// Reads a policy file as UTF-8, refusing files over `MAX_POLICY_FILE_BYTES`.
pub(crate) fn read_policy_file(path: &Path) -> Result<String, PolicyError> {
    let file = std::fs::File::open(path)
        .map_err(|error| PolicyError::in_file(path, format!("cannot read: {error}")))?;
    let mut bytes = Vec::new();
    file.take(MAX_POLICY_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| PolicyError::in_file(path, format!("cannot read: {error}")))?;
    if bytes.len() as u64 > MAX_POLICY_FILE_BYTES {
        return Err(PolicyError::in_file(
            path,
            format!("larger than {MAX_POLICY_FILE_BYTES} bytes"),
        ));
    }
    String::from_utf8(bytes).map_err(|error| {
        PolicyError::in_file(
            path,
            format!("not UTF-8 (byte {})", error.utf8_error().valid_up_to()),
        )
    })
}

pub(crate) fn field_path_from(path: &serde_path_to_error::Path) -> FieldPath {
    let mut field = FieldPath::root();
    for segment in path {
        field = match segment {
            serde_path_to_error::Segment::Seq { index } => field.index(*index),
            serde_path_to_error::Segment::Map { key } => field.key(key),
            serde_path_to_error::Segment::Enum { variant } => field.key(variant),
            // A key that is not a string (or not yet read): the parent is the best position.
            serde_path_to_error::Segment::Unknown => field,
        };
    }
    field
}

/// The reader's message, in policy terms where the reader's own would mislead (it suggests
/// options that this loader refuses on purpose), without its position suffix.
pub(crate) fn yaml_message(error: &serde_saphyr::Error) -> String {
    use serde_saphyr::budget::BudgetBreach;
    match error.without_snippet() {
        serde_saphyr::Error::DuplicateMappingKey { key: Some(key), .. } => {
            format!("duplicate key `{key}`")
        }
        serde_saphyr::Error::DuplicateMappingKey { key: None, .. } => "duplicate key".to_owned(),
        serde_saphyr::Error::Budget {
            breach: BudgetBreach::Anchors { .. } | BudgetBreach::Aliases { .. },
            ..
        } => "anchors and aliases (& and *) are not allowed in policy files".to_owned(),
        serde_saphyr::Error::Budget {
            breach: BudgetBreach::Documents { .. },
            ..
        } => "a policy file holds exactly one YAML document".to_owned(),
        serde_saphyr::Error::MergeKeyNotAllowed { .. } => {
            "merge keys (<<) are not allowed in policy files".to_owned()
        }
        other => {
            let text = other.to_string();
            match text.rfind(" at line ") {
                Some(cut) => text[..cut].to_owned(),
                None => text,
            }
        }
    }
}

/// Finds the line of `path` in `text` by reading the YAML again into a tree of positions. Used for
/// rule errors found after parsing; returns `None` if the text cannot be read that way.
pub(crate) fn locate_line(text: &str, path: &FieldPath) -> Option<usize> {
    let root: Spanned<PositionNode> =
        serde_saphyr::from_str_with_options(text, yaml_options()).ok()?;
    let mut node = &root;
    let mut line = root.referenced.line();
    for segment in &path.0 {
        match (segment, &node.value) {
            (FieldSegment::Key(key), PositionNode::Map(entries)) => {
                let (found_key, value) = entries.iter().find(|(name, _)| name.value == *key)?;
                line = found_key.referenced.line();
                node = value;
            }
            (FieldSegment::Index(index), PositionNode::Seq(items)) => {
                node = items.get(*index)?;
                line = node.referenced.line();
            }
            _ => return None,
        }
    }
    usize::try_from(line).ok().filter(|line| *line > 0)
}

/// The shape of a YAML document with the position of every node, nothing else.
enum PositionNode {
    Scalar,
    Seq(Vec<Spanned<PositionNode>>),
    Map(Vec<(Spanned<String>, Spanned<PositionNode>)>),
}

impl<'de> Deserialize<'de> for PositionNode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NodeVisitor;

        impl<'de> Visitor<'de> for NodeVisitor {
            type Value = PositionNode;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any YAML node")
            }

            fn visit_bool<E: de::Error>(self, _: bool) -> Result<PositionNode, E> {
                Ok(PositionNode::Scalar)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<PositionNode, E> {
                Ok(PositionNode::Scalar)
            }
            fn visit_i128<E: de::Error>(self, _: i128) -> Result<PositionNode, E> {
                Ok(PositionNode::Scalar)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<PositionNode, E> {
                Ok(PositionNode::Scalar)
            }
            fn visit_u128<E: de::Error>(self, _: u128) -> Result<PositionNode, E> {
                Ok(PositionNode::Scalar)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<PositionNode, E> {
                Ok(PositionNode::Scalar)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<PositionNode, E> {
                Ok(PositionNode::Scalar)
            }
            fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<PositionNode, E> {
                Ok(PositionNode::Scalar)
            }
            fn visit_unit<E: de::Error>(self) -> Result<PositionNode, E> {
                Ok(PositionNode::Scalar)
            }
            fn visit_none<E: de::Error>(self) -> Result<PositionNode, E> {
                Ok(PositionNode::Scalar)
            }
            fn visit_some<D: Deserializer<'de>>(self, inner: D) -> Result<PositionNode, D::Error> {
                PositionNode::deserialize(inner)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<PositionNode, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element::<Spanned<PositionNode>>()? {
                    items.push(item);
                }
                Ok(PositionNode::Seq(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<PositionNode, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) =
                    map.next_entry::<Spanned<String>, Spanned<PositionNode>>()?
                {
                    entries.push(entry);
                }
                Ok(PositionNode::Map(entries))
            }
        }

        deserializer.deserialize_any(NodeVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::model::ClaimMode;

    const FILE: &str = "policies/x.yaml";

    fn parse(text: &str) -> Result<SecurityContext, PolicyError> {
        parse_context_yaml(text, Path::new(FILE))
    }

    fn parse_err(text: &str) -> PolicyError {
        match parse(text) {
            Ok(context) => panic!("should be refused, loaded {context:?}"),
            Err(error) => error,
        }
    }

    fn parse_ok(text: &str) -> SecurityContext {
        match parse(text) {
            Ok(context) => context,
            Err(error) => panic!("should load: {error}"),
        }
    }

    const GOOD: &str = "\
name: agent-runtime
description: What a coding agent may do inside its workspace.
deny_list: [\"fs.delete\", \"secrets.*\"]
capabilities:
  - tool_pattern: \"fs.*\"
    path_allowlist: [\"/workspace\"]
    max_response_size: 1048576
    claim: off
  - tool_pattern: \"web.fetch\"
    domain_allowlist: [\"example.com\", \"*.github.com\"]
    rate_limit: { calls: 30, per_seconds: 60 }
  - tool_pattern: \"cmd.run\"
    command_allowlist: [\"git\", \"ls\"]
    subcommand_allowlist: { git: [\"status\", \"log\", \"diff\"] }
";

    #[test]
    fn spec_example_loads() {
        let context = parse_ok(GOOD);
        assert_eq!(context.name(), "agent-runtime");
        assert_eq!(context.deny.len(), 2);
        assert_eq!(context.capabilities.len(), 3);
        assert_eq!(context.capabilities[0].claim, ClaimMode::Off);
        assert_eq!(context.capabilities[0].max_response_size, Some(1_048_576));
        // No `claim:` means explicit (SPEC 7.1 r3).
        assert_eq!(context.capabilities[1].claim, ClaimMode::Explicit);
        assert_eq!(
            context.capabilities[1]
                .rate_limit
                .map(|r| (r.calls.get(), r.per_seconds.get())),
            Some((30, 60))
        );
        assert!(context.capabilities[2].commands.is_some());
        assert_eq!(context.source, ContextSource::File(PathBuf::from(FILE)));
        assert_eq!(context.version.len(), 64);
    }

    #[test]
    fn unknown_key_names_file_line_and_field() {
        let error = parse_err(
            "name: c\ncapabilities:\n  - tool_pattern: \"fs.*\"\n  - tool_patern: \"web.*\"\n",
        );
        assert_eq!(error.file, Some(PathBuf::from(FILE)));
        assert_eq!(error.line, Some(4));
        assert!(error.message.contains("tool_patern"), "{error}");
        assert!(
            error.to_string().starts_with("policies/x.yaml:4: "),
            "{error}"
        );
        assert_eq!(
            error
                .field
                .as_deref()
                .map(|f| f.starts_with("capabilities[1]")),
            Some(true)
        );
    }

    #[test]
    fn a_bad_label_names_file_line_and_field() {
        let error = parse_err(
            "name: c\ncapabilities:\n  - tool_pattern: web.fetch\n    labels: [untrusted, \"not ok\"]\n",
        );
        assert_eq!(
            error.to_string(),
            "policies/x.yaml:4: capabilities[0].labels[1]: invalid label \"not ok\": 1 to 64 letters, digits, '_' or '-'"
        );
        let rule = parse_err(
            "name: c\ncapabilities: []\nflow_rules:\n  - if_session_has: [a]\n    block: [b]\n    action: deny\n  - if_session_has: [a]\n    block: [\"b/c\"]\n    action: deny\n",
        );
        assert_eq!(rule.line, Some(8), "{rule}");
        assert_eq!(rule.field.as_deref(), Some("flow_rules[1].block[0]"));
        let unknown = parse_err(
            "name: c\ncapabilities: []\nflow_rules:\n  - if_session_has: [a]\n    block: [b]\n    action: deny\n    unless: [c]\n",
        );
        assert!(
            unknown.to_string().starts_with("policies/x.yaml:7: "),
            "{unknown}"
        );
    }

    #[test]
    fn duplicate_key_is_refused_with_its_line() {
        let error = parse_err("name: a\ncapabilities: []\nname: b\n");
        assert_eq!(
            error.to_string(),
            "policies/x.yaml:3: name: duplicate key `name`"
        );
        let nested = parse_err(
            "name: a\ncapabilities:\n  - tool_pattern: x\n    command_allowlist: [git]\n    subcommand_allowlist:\n      git: [log]\n      git: [push]\n",
        );
        assert_eq!(nested.line, Some(7), "{nested}");
        assert_eq!(
            nested.field.as_deref(),
            Some("capabilities[0].subcommand_allowlist.git")
        );
    }

    #[test]
    fn a_bad_option_allowlist_names_file_line_and_field() {
        let text = "name: c\ncapabilities:\n  - tool_pattern: cmd.run\n    command_allowlist: [git]\n    subcommand_allowlist: { git: [status, log] }\n    option_allowlist:\n      \"git log\": [\"--oneline\", \"-n\"]\n      \"git push\": [\"-q\"]\n";
        assert_eq!(
            parse_err(text).to_string(),
            "policies/x.yaml:8: capabilities[0].option_allowlist.git push: \"push\" is not in subcommand_allowlist for \"git\""
        );
        let text = text.replace("\"git push\": [\"-q\"]", "git: [\"-q\", \"\"]");
        assert_eq!(
            parse_err(&text).to_string(),
            "policies/x.yaml:8: capabilities[0].option_allowlist.git[1]: entry is empty"
        );
        let text = text.replace("\"-q\", \"\"", "\"q\"");
        assert_eq!(
            parse_err(&text).to_string(),
            "policies/x.yaml:8: capabilities[0].option_allowlist.git[0]: \"q\" is not an option: options start with '-'"
        );
        let text = text.replace("git: [\"q\"]", "git: [\"-q\"]");
        assert!(parse_ok(&text).capabilities[0].commands.is_some());
    }

    #[test]
    fn invalid_pattern_names_the_field() {
        let error = parse_err(
            "name: c\ncapabilities:\n  - tool_pattern: x\n  - tool_pattern: \"fs.rea?\"\n",
        );
        assert_eq!(error.line, Some(4));
        assert_eq!(error.field.as_deref(), Some("capabilities[1].tool_pattern"));
        assert!(error.to_string().contains("\"fs.rea?\""), "{error}");
        let error = parse_err("name: c\ndeny_list:\n  - ok\n  - \"fs.**\"\ncapabilities: []\n");
        assert_eq!(error.line, Some(4));
        assert_eq!(error.field.as_deref(), Some("deny_list[1]"));
        assert!(error.to_string().contains("\"fs.**\""), "{error}");
        // `*` anywhere is a pattern now (SPEC 6.2 r4).
        parse_ok(
            "name: c\ndeny_list: [\"*.delete\"]\ncapabilities:\n  - tool_pattern: \"fs.read*\"\n",
        );
    }

    #[test]
    fn empty_allowlist_is_refused() {
        let error = parse_err(
            "name: c\ncapabilities:\n  - tool_pattern: x\n  - tool_pattern: \"fs.*\"\n    path_allowlist: []\n",
        );
        assert_eq!(
            error.to_string(),
            "policies/x.yaml:5: capabilities[1].path_allowlist: empty allowlist would allow nothing"
        );
    }

    #[test]
    fn key_without_value_is_refused() {
        // `path_allowlist:` followed by nothing must not read as "no path check".
        let error =
            parse_err("name: c\ncapabilities:\n  - tool_pattern: \"fs.*\"\n    path_allowlist:\n");
        assert_eq!(
            error.field.as_deref(),
            Some("capabilities[0].path_allowlist"),
            "{error}"
        );
        assert_eq!(error.line, Some(4), "{error}");
    }

    #[test]
    fn empty_capabilities_is_a_context_that_allows_nothing() {
        let context = parse_ok("name: locked\ncapabilities: []\n");
        assert!(context.capabilities.is_empty());
        let error = parse_err("name: locked\n");
        assert!(error.message.contains("capabilities"), "{error}");
    }

    #[test]
    fn claim_values() {
        let claim = |value: &str| {
            parse(&format!(
                "name: c\ncapabilities:\n  - tool_pattern: x\n    claim: {value}\n"
            ))
            .map(|context| context.capabilities[0].claim)
        };
        assert_eq!(claim("off"), Ok(ClaimMode::Off));
        assert_eq!(claim("\"off\""), Ok(ClaimMode::Off));
        assert_eq!(claim("false"), Ok(ClaimMode::Off));
        assert_eq!(claim("explicit"), Ok(ClaimMode::Explicit));
        assert_eq!(claim("auto"), Ok(ClaimMode::Auto));
        for bad in ["maybe", "true", "no", "Off", "1", "[off]"] {
            let error = claim(bad).err();
            assert_eq!(
                error.as_ref().and_then(|e| e.line),
                Some(4),
                "{bad}: {error:?}"
            );
            assert_eq!(
                error.and_then(|e| e.field),
                Some("capabilities[0].claim".to_owned()),
                "{bad}"
            );
        }
    }

    #[test]
    fn wrong_types_are_refused() {
        let cases = [
            ("name: c\ndeny_list: fs.delete\ncapabilities: []\n", 2),
            ("name: c\ncapabilities:\n  - tool_pattern: x\n    rate_limit: { calls: many, per_seconds: 1 }\n", 4),
            ("name: c\ncapabilities:\n  - tool_pattern: x\n    rate_limit: { calls: 0, per_seconds: 1 }\n", 4),
            ("name: c\ncapabilities:\n  - tool_pattern: x\n    max_response_size: -1\n", 4),
            ("name: c\ncapabilities:\n  - tool_pattern: x\n    max_response_size: 0\n", 4),
            ("name: c\ncapabilities:\n  - tool_pattern: [x]\n", 3),
            ("name: c\ncapabilities: {}\n", 2),
            ("name: [c]\ncapabilities: []\n", 1),
        ];
        for (text, line) in cases {
            let error = parse_err(text);
            assert_eq!(error.line, Some(line), "{text:?}: {error}");
        }
    }

    #[test]
    fn review_hostile_yaml_is_refused() {
        let cases = [
            // anchors and aliases
            "name: c\ncapabilities:\n  - tool_pattern: x\n    path_allowlist: &p [/w]\n  - tool_pattern: y\n    path_allowlist: *p\n",
            // merge keys
            "name: c\ncapabilities:\n  - <<: {tool_pattern: x}\n",
            // custom tags
            "name: !secret c\ncapabilities: []\n",
            // several documents
            "name: c\ncapabilities: []\n---\nname: d\ncapabilities: []\n",
            // not a mapping, empty
            "- a\n",
            "",
        ];
        for text in cases {
            let error = parse_err(text);
            assert_eq!(error.file, Some(PathBuf::from(FILE)), "{text:?}");
            assert!(error.line.is_some(), "{text:?}: {error}");
        }
    }

    #[test]
    fn version_ignores_layout_and_follows_content() {
        let compact =
            parse_ok("name: c\ncapabilities: [{tool_pattern: \"fs.*\", path_allowlist: [/w]}]\n");
        let spaced = parse_ok(
            "# comment\nname:   c\n\ncapabilities:\n  - tool_pattern: 'fs.*'\n    path_allowlist:\n      - /w\n",
        );
        let changed =
            parse_ok("name: c\ncapabilities: [{tool_pattern: \"fs.*\", path_allowlist: [/v]}]\n");
        assert_eq!(compact.version, spaced.version);
        assert_ne!(compact.version, changed.version);
    }

    #[test]
    fn json_errors_name_the_field() {
        let error = parse_context_json(&serde_json::json!({
            "name": "c", "capabilities": [{"tool_pattern": "x"}, {"tool_pattern": "y", "path_allowlist": []}]
        }))
        .err();
        assert_eq!(
            error.and_then(|e| e.field),
            Some("capabilities[1].path_allowlist".to_owned())
        );
        let error = parse_context_json(&serde_json::json!({
            "name": "c", "capabilities": [{"tool_pattern": "x", "rate_limit": {"calls": "3", "per_seconds": 1}}]
        }))
        .err();
        assert_eq!(
            error.and_then(|e| e.field),
            Some("capabilities[0].rate_limit.calls".to_owned())
        );
        let context = parse_context_json(&serde_json::json!({
            "name": "c", "capabilities": [{"tool_pattern": "x", "claim": false}]
        }));
        assert_eq!(
            context.map(|c| (c.capabilities[0].claim, c.source)),
            Ok((ClaimMode::Off, ContextSource::Store))
        );
    }

    use crate::policy::test_support::{temp_dir, write};

    #[test]
    fn load_dir_reads_yaml_files_in_order_and_ignores_others() {
        let dir = temp_dir();
        write(dir.path(), "b.yml", "name: bravo\ncapabilities: []\n");
        write(dir.path(), "a.yaml", "name: alpha\ncapabilities: []\n");
        write(dir.path(), "schema.json", "{}");
        write(dir.path(), "notes.txt", "not yaml");
        write(dir.path(), ".a.yaml.swp", "garbage: [");
        let names: Result<Vec<String>, _> = load_dir(dir.path())
            .map(|contexts| contexts.iter().map(|c| c.name().to_owned()).collect());
        assert_eq!(names, Ok(vec!["alpha".to_owned(), "bravo".to_owned()]));
    }

    #[test]
    fn load_dir_refuses_a_duplicate_name_naming_both_files() {
        let dir = temp_dir();
        write(dir.path(), "a.yaml", "name: same\ncapabilities: []\n");
        write(
            dir.path(),
            "b.yaml",
            "# second\nname: same\ncapabilities: []\n",
        );
        let error = load_dir(dir.path()).err();
        let text = error.as_ref().map(ToString::to_string).unwrap_or_default();
        assert!(text.contains("a.yaml") && text.contains("b.yaml"), "{text}");
        assert_eq!(error.as_ref().and_then(|e| e.line), Some(2));
        assert_eq!(error.and_then(|e| e.file), Some(dir.path().join("b.yaml")));
    }

    #[test]
    fn load_dir_refuses_one_invalid_file() {
        let dir = temp_dir();
        write(dir.path(), "a.yaml", "name: ok\ncapabilities: []\n");
        write(
            dir.path(),
            "b.yaml",
            "name: bad\ncapabilities: [{tool_pattern: \"f?\"}]\n",
        );
        let error = load_dir(dir.path()).err();
        assert_eq!(error.and_then(|e| e.file), Some(dir.path().join("b.yaml")));
    }

    #[test]
    fn load_dir_refuses_oversized_and_non_utf8_files() {
        let dir = temp_dir();
        let big = format!(
            "name: big\ndescription: \"{}\"\ncapabilities: []\n",
            "x".repeat(1024 * 1024)
        );
        write(dir.path(), "big.yaml", &big);
        assert!(load_dir(dir.path()).is_err());
        let dir = temp_dir();
        if let Err(error) = std::fs::write(dir.path().join("bin.yaml"), [0xff, 0xfe, 0x00]) {
            panic!("{error}");
        }
        assert!(load_dir(dir.path()).is_err());
    }

    #[test]
    fn example_policies_load() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies");
        let names: Result<Vec<String>, _> =
            load_dir(&dir).map(|contexts| contexts.iter().map(|c| c.name().to_owned()).collect());
        assert_eq!(
            names,
            Ok(vec![
                "agent-runtime".to_owned(),
                "coding-agent".to_owned(),
                "demo".to_owned(),
                "web-example".to_owned()
            ])
        );
    }

    #[test]
    fn committed_schema_matches_the_types() {
        let generated = schemars::schema_for!(SecurityContextSpec);
        let generated = match serde_json::to_string_pretty(&generated) {
            Ok(text) => text + "\n",
            Err(error) => panic!("{error}"),
        };
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("policies/schema.json");
        // SEALGATE_BLESS_SCHEMA=1 rewrites the committed file after a deliberate model change.
        if std::env::var_os("SEALGATE_BLESS_SCHEMA").is_some() {
            if let Err(error) = std::fs::write(&path, &generated) {
                panic!("cannot write {}: {error}", path.display());
            }
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == generated,
            "policies/schema.json is stale: run the tests once with SEALGATE_BLESS_SCHEMA=1"
        );
    }
}
