//! `sealgate policy test` (SPEC 6.4 r4): cases files (what a call should get under a context), read
//! strictly, run through the same decision code as the gateway and `policy explain`, and reported as
//! one line per failing case, a count, and optionally a JUnit XML report for CI.
//!
//! A cases file is YAML, read with the policy loader's options (no duplicate keys, anchors, tags or
//! second documents):
//!
//! ```yaml
//! cases:
//!   - name: git-log-output
//!     context: coding-agent
//!     tool: cmd.run
//!     args: {command: "git log --output=/tmp/x"}
//!     expect: POLICY_VIOLATION_COMMAND_NOT_ALLOWED   # or 2003, allow, approval
//! ```

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::de::{self, Deserialize, Deserializer, Visitor};
use serde_json::{Map, Value};

use super::explain::{explain, rule_text};
use super::load::{field_path_from, locate_line, read_policy_file, yaml_message, yaml_options};
use super::model::{is_label, FieldPath};
use super::{HeldLabel, PolicyError, SecurityContext, Verdict};
use crate::error::Code;

/// The refusal codes a policy decision can give offline, so the only ones a case may expect: the
/// policy's own (2000–2006, 2008, 2010) and 1000 for arguments whose names are equal under case folding.
pub const EXPECTABLE_CODES: &[u16] = &[1000, 2000, 2001, 2002, 2003, 2004, 2005, 2006, 2008, 2010];

impl Verdict {
    /// Reads `expect`: `allow`, `approval`, a code's number or its name from the code table.
    fn parse(raw: &RawExpect) -> Result<Verdict, ExpectError> {
        let code = match raw {
            RawExpect::Text(text) if text == "allow" => return Ok(Verdict::Allow),
            RawExpect::Text(text) if text == "approval" => return Ok(Verdict::Approval),
            RawExpect::Text(text) => Code::ALL.iter().copied().find(|c| c.name() == text),
            RawExpect::Number(number) => u16::try_from(*number).ok().and_then(Code::from_number),
        };
        match code {
            Some(code) if EXPECTABLE_CODES.contains(&code.number()) => Ok(Verdict::Refused(code)),
            Some(code) => Err(ExpectError::NotPolicyCode(code)),
            None => Err(ExpectError::Unknown(raw.to_string())),
        }
    }

    /// The short form used as a JUnit failure's type.
    fn kind(&self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Approval => "approval",
            Verdict::Refused(code) => code.name(),
        }
    }
}

/// An `expect` that no policy decision can give.
#[derive(Debug, thiserror::Error)]
enum ExpectError {
    #[error(
        "{} {} is not a code a policy decision gives; expect allow, approval, or one of {}",
        .0.number(),
        .0.name(),
        expectable_list()
    )]
    NotPolicyCode(Code),
    #[error(
        "unknown expectation {0}; expect allow, approval, or one of {list}",
        list = expectable_list()
    )]
    Unknown(String),
}

fn expectable_list() -> String {
    let numbers: Vec<String> = EXPECTABLE_CODES.iter().map(u16::to_string).collect();
    numbers.join(", ")
}

/// `expect` as written: a string or a whole number.
#[derive(Debug)]
enum RawExpect {
    Text(String),
    Number(i128),
}

impl fmt::Display for RawExpect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RawExpect::Text(text) => write!(f, "{text:?}"),
            RawExpect::Number(number) => write!(f, "{number}"),
        }
    }
}

impl<'de> Deserialize<'de> for RawExpect {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ExpectVisitor;

        impl Visitor<'_> for ExpectVisitor {
            type Value = RawExpect;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("allow, approval, a refusal code (2003) or its name")
            }
            fn visit_str<E: de::Error>(self, text: &str) -> Result<RawExpect, E> {
                Ok(RawExpect::Text(text.to_owned()))
            }
            fn visit_i64<E: de::Error>(self, number: i64) -> Result<RawExpect, E> {
                Ok(RawExpect::Number(number.into()))
            }
            fn visit_u64<E: de::Error>(self, number: u64) -> Result<RawExpect, E> {
                Ok(RawExpect::Number(number.into()))
            }
        }

        deserializer.deserialize_any(ExpectVisitor)
    }
}

/// A cases file as written.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    cases: Vec<RawCase>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCase {
    name: String,
    context: String,
    tool: String,
    args: Value,
    #[serde(default)]
    session_labels: Vec<String>,
    expect: RawExpect,
}

/// One case, checked against the policies it runs on.
#[derive(Debug)]
pub struct Case {
    pub name: String,
    pub context: String,
    pub tool: String,
    pub args: Map<String, Value>,
    pub session_labels: Vec<String>,
    pub expect: Verdict,
}

/// A cases file, read and checked: nothing in it can fail to run.
#[derive(Debug)]
pub struct CasesFile {
    pub path: PathBuf,
    pub cases: Vec<Case>,
}

/// The cases files that CASES arguments name: a file as given, a folder's `*.yaml` and `*.yml`
/// files (not starting with a dot, not in subfolders), in name order.
pub fn case_files(arguments: &[PathBuf]) -> Result<Vec<PathBuf>, PolicyError> {
    let mut files = Vec::new();
    for argument in arguments {
        if argument.is_dir() {
            let found = yaml_files_in(argument)?;
            if found.is_empty() {
                return Err(whole_file(
                    argument,
                    "no *.yaml or *.yml cases files in this folder",
                ));
            }
            files.extend(found);
        } else {
            files.push(argument.clone());
        }
    }
    Ok(files)
}

fn yaml_files_in(dir: &Path) -> Result<Vec<PathBuf>, PolicyError> {
    let cannot =
        |error: std::io::Error| whole_file(dir, format!("cannot read the folder: {error}"));
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(cannot)? {
        let path = entry.map_err(cannot)?.path();
        let Some(name) = path.file_name().and_then(|name| name.to_str()) else {
            continue;
        };
        let is_yaml = name.ends_with(".yaml") || name.ends_with(".yml");
        if is_yaml && !name.starts_with('.') && !path.is_dir() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

fn whole_file(path: &Path, message: impl Into<String>) -> PolicyError {
    PolicyError {
        file: Some(path.to_path_buf()),
        line: None,
        field: None,
        message: message.into(),
    }
}

/// Reads and checks one cases file against `contexts`; the first problem is returned with the file,
/// line and field.
pub fn load_cases_file(
    path: &Path,
    contexts: &[SecurityContext],
) -> Result<CasesFile, PolicyError> {
    let text = read_policy_file(path)?;
    let raw = parse_yaml(&text, path)?;
    let mut cases = Vec::with_capacity(raw.cases.len());
    let mut names = BTreeSet::new();
    if raw.cases.is_empty() {
        return Err(error_at(
            &text,
            path,
            FieldPath::root().key("cases"),
            "holds no cases".into(),
        ));
    }
    for (index, case) in raw.cases.into_iter().enumerate() {
        let at = FieldPath::root().key("cases").index(index);
        if !names.insert(case.name.clone()) {
            let message = format!("duplicate case name {:?} in this file", case.name);
            return Err(error_at(&text, path, at.key("name"), message));
        }
        let case = check_case(case, contexts)
            .map_err(|(field, message)| error_at(&text, path, field.under(at), message))?;
        cases.push(case);
    }
    Ok(CasesFile {
        path: path.to_path_buf(),
        cases,
    })
}

/// Reads the YAML of a cases file with the policy loader's options; errors carry file, line, field.
fn parse_yaml(text: &str, path: &Path) -> Result<RawFile, PolicyError> {
    let mut track = serde_path_to_error::Track::new();
    let parsed =
        serde_saphyr::with_deserializer_from_str_with_options(text, yaml_options(), |de| {
            RawFile::deserialize(serde_path_to_error::Deserializer::new(de, &mut track))
        });
    parsed.map_err(|error| {
        let mut field = field_path_from(&track.path());
        if let serde_saphyr::Error::DuplicateMappingKey { key: Some(key), .. } =
            error.without_snippet()
        {
            field = field.key(key);
        }
        let line = error
            .location()
            .map(|location| location.line())
            .filter(|line| *line > 0)
            .and_then(|line| usize::try_from(line).ok())
            .or_else(|| locate_line(text, &field));
        PolicyError {
            file: Some(path.to_path_buf()),
            line,
            field: (!field.is_root()).then(|| field.to_string()),
            message: yaml_message(&error).replace("policy files", "cases files"),
        }
    })
}

fn error_at(text: &str, path: &Path, field: FieldPath, message: String) -> PolicyError {
    PolicyError {
        file: Some(path.to_path_buf()),
        line: locate_line(text, &field),
        field: (!field.is_root()).then(|| field.to_string()),
        message,
    }
}

/// A field of one case, relative to the case.
struct CaseField(Vec<CaseSegment>);

enum CaseSegment {
    Key(&'static str),
    Index(usize),
}

impl CaseField {
    fn key(key: &'static str) -> CaseField {
        CaseField(vec![CaseSegment::Key(key)])
    }

    fn under(self, mut at: FieldPath) -> FieldPath {
        for segment in self.0 {
            at = match segment {
                CaseSegment::Key(key) => at.key(key),
                CaseSegment::Index(index) => at.index(index),
            };
        }
        at
    }
}

type CaseProblem = (CaseField, String);

fn check_case(raw: RawCase, contexts: &[SecurityContext]) -> Result<Case, CaseProblem> {
    if raw.name.trim().is_empty() {
        return Err((CaseField::key("name"), "a case needs a name".into()));
    }
    if !contexts
        .iter()
        .any(|context| context.spec.name == raw.context)
    {
        let message = format!("no security context {:?} in the policies", raw.context);
        return Err((CaseField::key("context"), message));
    }
    crate::envelope::ToolName::parse(&raw.tool).map_err(|e| (CaseField::key("tool"), e))?;
    let Value::Object(args) = raw.args else {
        let message = "args must be a mapping of argument names to values (`{}` for none)";
        return Err((CaseField::key("args"), message.into()));
    };
    for (index, label) in raw.session_labels.iter().enumerate() {
        if !is_label(label) {
            let field = CaseField(vec![
                CaseSegment::Key("session_labels"),
                CaseSegment::Index(index),
            ]);
            let message =
                format!("invalid label {label:?}: letters, digits, '_' or '-', at most 64 bytes");
            return Err((field, message));
        }
    }
    let expect =
        Verdict::parse(&raw.expect).map_err(|e| (CaseField::key("expect"), e.to_string()))?;
    Ok(Case {
        name: raw.name,
        context: raw.context,
        tool: raw.tool,
        args,
        session_labels: raw.session_labels,
        expect,
    })
}

/// What one case got.
#[derive(Debug)]
pub struct Outcome {
    pub got: Verdict,
    /// The rule that decided, as `policy explain` prints it (`capability #2 cmd.run`).
    pub rule: String,
    /// Why a refusal was made (empty for an allowed call).
    pub message: String,
    pub time: Duration,
}

/// Decides `case` as the gateway would: a call whose argument names are equal under ASCII case
/// folding never reaches the policy and gets 1000 (SPEC 6.3 r3); every other call is decided by
/// `policy explain`'s code, in a session assumed to hold the case's `session_labels`.
pub fn run_case(case: &Case, context: &SecurityContext) -> Outcome {
    let started = Instant::now();
    if let Err(message) = crate::strict_json::refuse_case_folded_names(&case.args) {
        return Outcome {
            got: Verdict::Refused(Code::MalformedEnvelope),
            rule: "arguments".into(),
            message,
            time: started.elapsed(),
        };
    }
    let held: Vec<HeldLabel> = case
        .session_labels
        .iter()
        .map(|l| HeldLabel::assumed(l))
        .collect();
    let answer = explain(context, &case.tool, &case.args, &held);
    let mut outcome = outcome_of(&answer);
    outcome.time = started.elapsed();
    outcome
}

/// Reads `explain()`'s answer into a verdict, the rule and the refusal's message.
fn outcome_of(answer: &Value) -> Outcome {
    let got = match answer["decision"].as_str() {
        Some("allow") if answer["approval"]["required"] == true => Verdict::Approval,
        Some("allow") => Verdict::Allow,
        _ => answer["code"]
            .as_u64()
            .and_then(|number| u16::try_from(number).ok())
            .and_then(Code::from_number)
            .map_or(
                Verdict::Refused(Code::NoMatchingCapability),
                Verdict::Refused,
            ),
    };
    let mut message = answer["message"].as_str().unwrap_or_default().to_owned();
    if got == Verdict::Approval && answer["flow_rule"].is_object() {
        message = format!(
            "flow rule #{} asks a person's approval",
            answer["flow_rule"]["index"]
        );
    }
    Outcome {
        got,
        rule: rule_text(&answer["rule"]),
        message,
        time: Duration::ZERO,
    }
}

/// One case run: the case and what it got.
pub struct CaseResult<'a> {
    pub case: &'a Case,
    pub outcome: Outcome,
}

impl CaseResult<'_> {
    pub fn passed(&self) -> bool {
        self.case.expect == self.outcome.got
    }

    /// `expected allow, got 2003 POLICY_VIOLATION_COMMAND_NOT_ALLOWED (rule: capability #2 cmd.run): …`
    pub fn mismatch(&self) -> String {
        let mut text = format!(
            "expected {}, got {} (rule: {})",
            self.case.expect, self.outcome.got, self.outcome.rule
        );
        if !self.outcome.message.is_empty() {
            text.push_str(": ");
            text.push_str(&self.outcome.message);
        }
        text
    }
}

/// The results of one cases file.
pub struct FileResult<'a> {
    pub file: &'a CasesFile,
    pub results: Vec<CaseResult<'a>>,
}

impl FileResult<'_> {
    pub fn failures(&self) -> usize {
        self.results
            .iter()
            .filter(|result| !result.passed())
            .count()
    }

    pub fn time(&self) -> Duration {
        self.results.iter().map(|result| result.outcome.time).sum()
    }
}

/// Runs every case of `file`; `load_cases_file` made sure each names a context of `contexts`.
pub fn run_file<'a>(file: &'a CasesFile, contexts: &[SecurityContext]) -> FileResult<'a> {
    let results = file
        .cases
        .iter()
        .filter_map(|case| {
            let context = contexts.iter().find(|c| c.spec.name == case.context)?;
            Some(CaseResult {
                case,
                outcome: run_case(case, context),
            })
        })
        .collect();
    FileResult { file, results }
}

/// The JUnit XML report (the schema of Jenkins' xunit plugin, `junit-10.xsd`): one `<testsuite>` per
/// cases file, one `<testcase>` per case, named by the case, its class the context.
pub fn junit_report(files: &[FileResult<'_>]) -> std::io::Result<Vec<u8>> {
    use quick_xml::events::{BytesDecl, Event};
    let mut writer = quick_xml::Writer::new_with_indent(Vec::new(), b' ', 2);
    writer.write_event(Event::Decl(BytesDecl::new("1.0", Some("UTF-8"), None)))?;
    let tests: usize = files.iter().map(|file| file.results.len()).sum();
    let failures: usize = files.iter().map(FileResult::failures).sum();
    let time: Duration = files.iter().map(FileResult::time).sum();
    writer
        .create_element("testsuites")
        .with_attribute(("name", "sealgate policy test"))
        .with_attribute(("tests", tests.to_string().as_str()))
        .with_attribute(("failures", failures.to_string().as_str()))
        .with_attribute(("errors", "0"))
        .with_attribute(("time", seconds(time).as_str()))
        .write_inner_content(|writer| {
            files.iter().try_for_each(|file| write_suite(writer, file))
        })?;
    Ok(writer.into_inner())
}

fn write_suite(
    writer: &mut quick_xml::Writer<Vec<u8>>,
    file: &FileResult<'_>,
) -> std::io::Result<()> {
    let name = file.file.path.file_name().map_or_else(
        || file.file.path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    writer
        .create_element("testsuite")
        .with_attribute(("name", xml_text(&name).as_str()))
        .with_attribute(("tests", file.results.len().to_string().as_str()))
        .with_attribute(("failures", file.failures().to_string().as_str()))
        .with_attribute(("errors", "0"))
        .with_attribute(("skipped", "0"))
        .with_attribute(("time", seconds(file.time()).as_str()))
        .with_attribute((
            "file",
            xml_text(&file.file.path.display().to_string()).as_str(),
        ))
        .write_inner_content(|writer| {
            file.results
                .iter()
                .try_for_each(|result| write_case(writer, result))
        })?;
    Ok(())
}

fn write_case(
    writer: &mut quick_xml::Writer<Vec<u8>>,
    result: &CaseResult<'_>,
) -> std::io::Result<()> {
    let element = writer
        .create_element("testcase")
        .with_attribute(("name", xml_text(&result.case.name).as_str()))
        .with_attribute(("classname", xml_text(&result.case.context).as_str()))
        .with_attribute(("time", seconds(result.outcome.time).as_str()));
    if result.passed() {
        element.write_empty()?;
        return Ok(());
    }
    element.write_inner_content(|writer| {
        writer
            .create_element("failure")
            .with_attribute(("message", xml_text(&result.mismatch()).as_str()))
            .with_attribute(("type", result.outcome.got.kind()))
            .write_text_content(quick_xml::events::BytesText::new(&xml_text(&details(
                result,
            ))))?;
        Ok(())
    })?;
    Ok(())
}

/// The failure's body: the call and both answers, one per line.
fn details(result: &CaseResult<'_>) -> String {
    let case = result.case;
    let labels = if case.session_labels.is_empty() {
        "none".to_owned()
    } else {
        case.session_labels.join(", ")
    };
    format!(
        "context: {}\ntool: {}\nargs: {}\nsession_labels: {labels}\nexpected: {}\ngot: {}\nrule: {}\n{}",
        case.context,
        case.tool,
        Value::Object(case.args.clone()),
        case.expect,
        result.outcome.got,
        result.outcome.rule,
        result.outcome.message
    )
    .trim_end()
    .to_owned()
}

/// Seconds with three decimals, as the JUnit schema's `SUREFIRE_TIME` wants.
fn seconds(time: Duration) -> String {
    format!("{:.3}", time.as_secs_f64())
}

/// `text` with the characters XML 1.0 cannot hold at all, even escaped (most control characters,
/// unpaired surrogates cannot occur in a `str`), replaced by U+FFFD; the writer escapes the rest.
fn xml_text(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '\t' | '\n' | '\r' => c,
            c if c < ' ' || c == '\u{FFFE}' || c == '\u{FFFF}' => '\u{FFFD}',
            c => c,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_support::{temp_dir, write};

    const POLICY: &str = "name: ctx\ncapabilities:\n  - tool_pattern: \"fs.read*\"\n    path_allowlist: [/workspace]\n";

    fn contexts() -> Vec<SecurityContext> {
        let dir = temp_dir();
        write(dir.path(), "ctx.yaml", POLICY);
        match crate::policy::load_dir(dir.path()) {
            Ok(contexts) => contexts,
            Err(error) => panic!("{error}"),
        }
    }

    fn load(text: &str) -> Result<CasesFile, PolicyError> {
        let dir = temp_dir();
        write(dir.path(), "cases.yaml", text);
        load_cases_file(&dir.path().join("cases.yaml"), &contexts())
    }

    fn refused(text: &str) -> PolicyError {
        match load(text) {
            Ok(file) => panic!("loaded: {file:?}"),
            Err(error) => error,
        }
    }

    const CASE: &str = "cases:\n  - name: a\n    context: ctx\n    tool: fs.read\n    args: {path: /workspace/a}\n    expect: allow\n";

    #[test]
    fn expectations_by_word_number_and_name() {
        for (written, want) in [
            ("allow", Verdict::Allow),
            ("approval", Verdict::Approval),
            ("2002", Verdict::Refused(Code::PathNotAllowed)),
            (
                "POLICY_VIOLATION_PATH_NOT_ALLOWED",
                Verdict::Refused(Code::PathNotAllowed),
            ),
            ("1000", Verdict::Refused(Code::MalformedEnvelope)),
            ("FLOW_BLOCKED", Verdict::Refused(Code::FlowBlocked)),
        ] {
            let file = match load(&CASE.replace("expect: allow", &format!("expect: {written}"))) {
                Ok(file) => file,
                Err(error) => panic!("{written}: {error}"),
            };
            assert_eq!(file.cases[0].expect, want, "{written}");
        }
    }

    #[test]
    fn codes_no_policy_gives_are_refused_with_their_line() {
        for written in [
            "2007", "4003", "9999", "-1", "deny", "Allow", "1.5", "true", "[allow]",
        ] {
            let error = refused(&CASE.replace("expect: allow", &format!("expect: {written}")));
            assert_eq!(error.line, Some(6), "{written}: {error}");
            assert_eq!(
                error.field.as_deref(),
                Some("cases[0].expect"),
                "{written}: {error}"
            );
        }
    }

    #[test]
    fn missing_fields_and_wrong_shapes_are_refused() {
        let error = refused(&CASE.replace("    expect: allow\n", ""));
        assert!(error.message.contains("expect"), "{error}");
        let error = refused(&CASE.replace("{path: /workspace/a}", "[a]"));
        assert_eq!(
            (error.line, error.field.as_deref()),
            (Some(5), Some("cases[0].args")),
            "{error}"
        );
        let error = refused(&CASE.replace("tool: fs.read", "tool: fs..read"));
        assert_eq!(error.line, Some(4), "{error}");
        let error = refused("cases: []\n");
        assert_eq!(error.line, Some(1), "{error}");
        let error = refused("cases:\n  - name: a\n    name: b\n");
        assert!(error.message.contains("duplicate key"), "{error}");
        let error = refused("cases: *x\n");
        assert_eq!(
            error.file.as_deref().map(Path::is_absolute),
            Some(true),
            "{error}"
        );
    }

    #[test]
    fn a_case_with_twin_argument_names_gets_1000() {
        let file =
            match load(&CASE.replace("{path: /workspace/a}", "{path: /workspace/a, PATH: /etc}")) {
                Ok(file) => file,
                Err(error) => panic!("{error}"),
            };
        let contexts = contexts();
        let outcome = run_case(&file.cases[0], &contexts[0]);
        assert_eq!(outcome.got, Verdict::Refused(Code::MalformedEnvelope));
        assert!(
            outcome.message.contains("case folding"),
            "{}",
            outcome.message
        );
    }

    #[test]
    fn xml_text_drops_what_xml_cannot_hold() {
        assert_eq!(xml_text("a\u{1}b\tc<&>"), "a\u{FFFD}b\tc<&>");
    }
}
