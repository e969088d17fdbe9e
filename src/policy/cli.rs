//! `sealgate policy check [DIR]`, `sealgate policy explain` and `sealgate policy test`: the operator's
//! offline view of the same loading and decision code the gateway runs.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde_json::{Map, Value};

use super::explain::{explain, rule_text};
use super::load::{load_dir_files, load_dir_promoted};
use super::{cases, load_dir, HeldLabel, PolicyError, SecurityContext};

/// `policy explain`'s exit codes (SPEC 6.4 r4), so that a script or a CI step can tell the
/// answers apart without reading the text: allowed, refused, bad usage, allowed after a person's approval.
pub const EXPLAIN_ALLOW: u8 = 0;
pub const EXPLAIN_DENY: u8 = 1;
pub const EXPLAIN_USAGE: u8 = 2;
pub const EXPLAIN_APPROVAL: u8 = 3;

pub enum PolicyCommand {
    Check {
        dir: PathBuf,
    },
    Explain {
        context: String,
        tool: String,
        args: String,
        policies: PathBuf,
        /// Labels the session is assumed to hold (SPEC 19).
        session_labels: Vec<String>,
    },
    /// Run the cases files (or folders of them) `cases` against the policies of `dir` (SPEC 6.4 r4).
    Test {
        dir: PathBuf,
        cases: Vec<PathBuf>,
        /// Also write a JUnit XML report here.
        junit: Option<PathBuf>,
        /// Decide by each context's shadow version where one exists, as if it were promoted.
        shadow: bool,
    },
}

pub fn run(command: PolicyCommand) -> ExitCode {
    match command {
        PolicyCommand::Test {
            dir,
            cases,
            junit,
            shadow,
        } => {
            let contexts = if shadow {
                load_dir_promoted(&dir)
            } else {
                load_dir(&dir)
            };
            ExitCode::from(test(contexts, &cases, junit.as_deref()))
        }
        PolicyCommand::Check { dir } => match load_dir_files(&dir) {
            Ok(loaded) => {
                for (file, shadow) in loaded
                    .live
                    .iter()
                    .map(|file| (file, ""))
                    .chain(loaded.shadows.iter().map(|file| (file, "  shadow")))
                {
                    let context = &file.context;
                    say!(
                        "ok  {}{shadow}  (version {})",
                        context.name(),
                        context.version
                    );
                    for warning in context.flow_warnings() {
                        say!("warning  {}{shadow}: {warning}", context.name());
                    }
                }
                let shadows = match loaded.shadows.len() {
                    0 => String::new(),
                    n => format!(" and {n} shadow version(s)"),
                };
                say!(
                    "{} security context(s){shadows} valid in {}",
                    loaded.live.len(),
                    dir.display()
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("invalid: {e}");
                ExitCode::FAILURE
            }
        },
        PolicyCommand::Explain {
            context,
            tool,
            args,
            policies,
            session_labels,
        } => {
            // Read as the gateway reads a payload: a duplicate key is refused, not resolved.
            let arguments: Map<String, Value> =
                match crate::strict_json::parse_strict_json(args.as_bytes()) {
                    Ok(Value::Object(map)) => map,
                    Ok(_) => {
                        eprintln!("--args must be a JSON object");
                        return ExitCode::from(EXPLAIN_USAGE);
                    }
                    Err(e) => {
                        eprintln!("--args: {e}");
                        return ExitCode::from(EXPLAIN_USAGE);
                    }
                };
            // A call whose argument names are equal under case folding never reaches the policy (1000).
            if let Err(e) = crate::strict_json::refuse_case_folded_names(&arguments) {
                eprintln!("--args: {e}");
                return ExitCode::from(EXPLAIN_USAGE);
            }
            if let Err(e) = crate::envelope::ToolName::parse(&tool) {
                eprintln!("--tool: {e}");
                return ExitCode::from(EXPLAIN_USAGE);
            }
            let contexts = match load_dir(&policies) {
                Ok(contexts) => contexts,
                Err(e) => {
                    eprintln!("invalid: {e}");
                    return ExitCode::from(EXPLAIN_USAGE);
                }
            };
            let Some(found) = contexts.iter().find(|c| c.spec.name == context) else {
                eprintln!("no security context {context:?} in {}", policies.display());
                return ExitCode::from(EXPLAIN_USAGE);
            };
            let mut held = Vec::with_capacity(session_labels.len());
            for label in session_labels.iter().filter(|label| !label.is_empty()) {
                if !super::model::is_label(label) {
                    eprintln!(
                        "--session-labels: invalid label {label:?}: letters, digits, '_' or '-'"
                    );
                    return ExitCode::from(EXPLAIN_USAGE);
                }
                held.push(HeldLabel::assumed(label));
            }
            let answer = explain(found, &tool, &arguments, &held);
            let rule = rule_text(&answer["rule"]);
            let code = match answer["decision"].as_str() {
                Some("allow") if answer["approval"]["required"] == true => {
                    say!("allow, approval required  rule: {rule}");
                    EXPLAIN_APPROVAL
                }
                Some("allow") => {
                    say!("allow  rule: {rule}");
                    EXPLAIN_ALLOW
                }
                _ => {
                    say!(
                        "deny  code: {} {}  rule: {rule}\n{}",
                        answer["code"],
                        answer["name"].as_str().unwrap_or("?"),
                        answer["message"].as_str().unwrap_or("")
                    );
                    EXPLAIN_DENY
                }
            };
            say!("{answer}");
            ExitCode::from(code)
        }
    }
}

/// `policy test`'s exit codes (SPEC 6.4 r4): every case passed, a case failed, and nothing run (bad
/// usage, an unreadable or invalid cases file, invalid policies, or a report that cannot be written).
pub const TEST_PASSED: u8 = 0;
pub const TEST_FAILED: u8 = 1;
pub const TEST_UNUSABLE: u8 = 2;

/// `sealgate policy test [DIR] CASES… [--junit FILE]`: loads the policies and every cases file first
/// (any problem: nothing runs), then runs every case and prints one line per failing case and the count.
fn test(
    contexts: Result<Vec<SecurityContext>, PolicyError>,
    arguments: &[PathBuf],
    junit: Option<&Path>,
) -> u8 {
    let contexts = match contexts {
        Ok(contexts) => contexts,
        Err(e) => {
            eprintln!("invalid policies: {e}");
            return TEST_UNUSABLE;
        }
    };
    let loaded = cases::case_files(arguments).and_then(|paths| {
        paths
            .iter()
            .map(|path| cases::load_cases_file(path, &contexts))
            .collect::<Result<Vec<_>, _>>()
    });
    let files = match loaded {
        Ok(files) => files,
        Err(e) => {
            eprintln!("invalid cases: {e}");
            return TEST_UNUSABLE;
        }
    };
    let results: Vec<_> = files
        .iter()
        .map(|file| cases::run_file(file, &contexts))
        .collect();
    let (mut passed, mut failed) = (0, 0);
    for file in &results {
        for result in &file.results {
            if result.passed() {
                passed += 1;
                continue;
            }
            failed += 1;
            let path = file.file.path.display();
            say!("FAIL {path}: {}: {}", result.case.name, result.mismatch());
        }
    }
    say!("{passed} passed, {failed} failed");
    if let Some(report) = junit {
        if let Err(e) = cases::junit_report(&results).and_then(|xml| std::fs::write(report, xml)) {
            eprintln!("cannot write the JUnit report {}: {e}", report.display());
            return TEST_UNUSABLE;
        }
    }
    if failed == 0 {
        TEST_PASSED
    } else {
        TEST_FAILED
    }
}
