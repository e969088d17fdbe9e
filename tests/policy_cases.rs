//! Black-box tests of `sealgate policy test` (SPEC 6.4 r4): cases files run against a policies folder
//! through the real binary, its failure lines, counts and exit codes, the refusal of bad cases files
//! with file and line, and the JUnit report as a CI server reads it (junitparser, and the Jenkins
//! xunit plugin's junit-10.xsd through xmlschema).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{pinned_tool, run_cli};
use serde_json::Value;

/// The worked example of docs/policy.md: `*` inside a pattern, an option allowlist, and its cases.
const REPO_READER: &str = r#"
name: repo-reader
description: Reads the checkout and its git history; changes nothing.
capabilities:
  - tool_pattern: "fs.read*"
    path_allowlist: ["/workspace"]
    claim: off
  - tool_pattern: "cmd.run"
    path_allowlist: ["/workspace"]
    path_arguments: ["cwd"]
    command_allowlist: ["git"]
    subcommand_allowlist: { git: ["log", "status", "diff"] }
    option_allowlist: { "git log": ["--oneline", "-n", "--format"] }
    claim: off
"#;

/// A context with a capability approval and two flow rules (SPEC 19).
const TRIFECTA: &str = r#"
name: trifecta
capabilities:
  - { tool_pattern: "web.fetch", labels: [untrusted_content] }
  - { tool_pattern: "fs.read*", path_allowlist: ["/srv/customers"], labels: [private_data] }
  - { tool_pattern: "email.send", labels: [external_send] }
  - { tool_pattern: "billing.refund", approval: { required: true } }
flow_rules:
  - { if_session_has: [untrusted_content, private_data], block: [external_send], action: deny }
  - { if_session_has: [untrusted_content], block: [external_send], action: approval }
"#;

/// A folder holding `policies/` with the given contexts; cases files are written beside it.
fn workspace(contexts: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("policies")).unwrap();
    for (name, text) in contexts {
        std::fs::write(dir.path().join("policies").join(name), text).unwrap();
    }
    dir
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// `sealgate policy test DIR CASES… [extra]`: exit status and everything printed.
fn policy_test(dir: &Path, cases: &[&Path], extra: &[&str]) -> (i32, String) {
    let mut args = vec!["policy", "test", s(dir)];
    args.extend(cases.iter().map(|path| s(path)));
    args.extend(extra);
    run_cli(&args)
}

/// The last line printed to stdout: the count.
fn last_line(out: &str) -> &str {
    out.lines().last().unwrap_or_default()
}

const READER_CASES: &str = r#"
cases:
  - name: read-a-file
    context: repo-reader
    tool: fs.read_file
    args: {path: /workspace/README.md}
    expect: allow
  - name: read-several-files
    context: repo-reader
    tool: fs.read_multiple_files
    args: {paths: [/workspace/a.rs, /workspace/b.rs]}
    expect: allow
  - name: read-escapes
    context: repo-reader
    tool: fs.read_text_file
    args: {path: /workspace/../etc/passwd}
    expect: POLICY_VIOLATION_PATH_NOT_ALLOWED
  - name: no-writes
    context: repo-reader
    tool: fs.write_file
    args: {path: /workspace/README.md, content: ""}
    expect: 2006
  - name: git-log-short
    context: repo-reader
    tool: cmd.run
    args: {command: "git log --oneline -n5", cwd: /workspace}
    expect: allow
  - name: git-log-output
    context: repo-reader
    tool: cmd.run
    args: {command: "git log --output=log.txt", cwd: /workspace}
    expect: POLICY_VIOLATION_COMMAND_NOT_ALLOWED
"#;

#[test]
fn the_shipped_cases_pass_against_the_shipped_policies() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let (status, out) = policy_test(&repo.join("policies"), &[&repo.join("policies/tests")], &[]);
    assert_eq!(status, 0, "{out}");
    assert_eq!(out, "51 passed, 0 failed\n");
    // The cases folder is not a policy file: `policy check` reads the folder's own files only.
    let (status, out) = run_cli(&["policy", "check", s(&repo.join("policies"))]);
    assert_eq!(status, 0, "{out}");
    assert!(out.contains("4 security context(s) valid"), "{out}");
}

#[test]
fn a_passing_run_prints_the_count_and_exits_0() {
    let dir = workspace(&[("repo-reader.yaml", REPO_READER)]);
    let cases = write(dir.path(), "reader.yaml", READER_CASES);
    let (status, out) = policy_test(&dir.path().join("policies"), &[&cases], &[]);
    assert_eq!((status, out.as_str()), (0, "6 passed, 0 failed\n"));

    // `[DIR]` defaults to `policies`, as for `policy check`: a lone path is CASES.
    let out = Command::new(env!("CARGO_BIN_EXE_sealgate"))
        .args(["policy", "test", "reader.yaml"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "6 passed, 0 failed\n");
}

#[test]
fn failing_cases_print_one_line_each_and_exit_1() {
    let dir = workspace(&[("repo-reader.yaml", REPO_READER)]);
    let text = READER_CASES
        .replace(
            "expect: POLICY_VIOLATION_COMMAND_NOT_ALLOWED",
            "expect: allow",
        )
        .replace("expect: 2006", "expect: 2002");
    let cases = write(dir.path(), "reader.yaml", &text);
    let (status, out) = policy_test(&dir.path().join("policies"), &[&cases], &[]);
    assert_eq!(status, 1, "{out}");
    let path = s(&cases);
    let expected = format!(
        "FAIL {path}: no-writes: expected 2002 POLICY_VIOLATION_PATH_NOT_ALLOWED, got 2006 \
         POLICY_VIOLATION_NO_MATCHING_CAPABILITY (rule: no_match): no capability of context \
         \"repo-reader\" matches tool \"fs.write_file\"\n\
         FAIL {path}: git-log-output: expected allow, got 2003 POLICY_VIOLATION_COMMAND_NOT_ALLOWED \
         (rule: capability #1 cmd.run): argument \"command\": word 3 is the option \"--output\", \
         which option_allowlist for \"git log\" does not list\n\
         4 passed, 2 failed\n"
    );
    assert_eq!(out, expected);
}

#[test]
fn session_labels_let_a_case_decide_a_flow_rule() {
    let dir = workspace(&[("trifecta.yaml", TRIFECTA)]);
    let cases = write(
        dir.path(),
        "flows.yaml",
        r#"
cases:
  - name: send-in-a-fresh-session
    context: trifecta
    tool: email.send
    args: {to: a@example.com}
    expect: allow
  - name: send-after-untrusted-content
    context: trifecta
    tool: email.send
    args: {to: a@example.com}
    session_labels: [untrusted_content]
    expect: approval
  - name: send-after-the-trifecta
    context: trifecta
    tool: email.send
    args: {to: a@example.com}
    session_labels: [untrusted_content, private_data]
    expect: 2010
  - name: refund-needs-its-capability-approval
    context: trifecta
    tool: billing.refund
    args: {order: 42}
    expect: approval
  - name: reads-are-not-blocked
    context: trifecta
    tool: fs.read_file
    args: {path: /srv/customers/1.json}
    session_labels: [untrusted_content, private_data]
    expect: allow
"#,
    );
    let policies = dir.path().join("policies");
    let (status, out) = policy_test(&policies, &[&cases], &[]);
    assert_eq!((status, out.as_str()), (0, "5 passed, 0 failed\n"));

    // The same calls expected otherwise: each failure names the flow rule that decided.
    let wrong = std::fs::read_to_string(&cases)
        .unwrap()
        .replace("expect: approval", "expect: allow")
        .replace("expect: 2010", "expect: approval");
    let cases = write(dir.path(), "wrong.yaml", &wrong);
    let (status, out) = policy_test(&policies, &[&cases], &[]);
    assert_eq!(status, 1, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    assert!(lines[0].contains(": send-after-untrusted-content: expected allow, got approval (rule: capability #2 email.send): flow rule #1 asks a person's approval"), "{out}");
    assert!(lines[1].contains(": send-after-the-trifecta: expected approval, got 2010 FLOW_BLOCKED (rule: flow_rule #0)"), "{out}");
    assert!(lines[2].contains(": refund-needs-its-capability-approval: expected allow, got approval (rule: capability #3 billing.refund)"), "{out}");
    assert_eq!(lines[3], "2 passed, 3 failed");
}

#[test]
fn twin_argument_names_are_a_1000_refusal_a_case_can_expect() {
    let dir = workspace(&[("repo-reader.yaml", REPO_READER)]);
    let cases = write(
        dir.path(),
        "twins.yaml",
        "cases:\n  - name: twins\n    context: repo-reader\n    tool: fs.read_file\n    \
         args: {path: /workspace/a, PATH: /etc/passwd}\n    expect: 1000\n",
    );
    let (status, out) = policy_test(&dir.path().join("policies"), &[&cases], &[]);
    assert_eq!((status, out.as_str()), (0, "1 passed, 0 failed\n"));
}

/// One case, to be broken one field at a time.
const ONE_CASE: &str = "cases:\n  - name: read\n    context: repo-reader\n    tool: fs.read_file\n    args: {path: /workspace/a}\n    expect: allow\n";

#[test]
fn bad_cases_files_are_refused_with_file_line_and_reason_and_nothing_runs() {
    let dir = workspace(&[("repo-reader.yaml", REPO_READER)]);
    let policies = dir.path().join("policies");
    let duplicate = format!("{ONE_CASE}{}", &ONE_CASE["cases:\n".len()..]);
    let bad: [(&str, String, &str, &str); 7] = [
        (
            "unknown-context",
            ONE_CASE.replace("context: repo-reader", "context: nowhere"),
            ":3: cases[0].context:",
            "no security context \"nowhere\"",
        ),
        (
            "unknown-code",
            ONE_CASE.replace("expect: allow", "expect: 4003"),
            ":6: cases[0].expect:",
            "4003 APPROVAL_REQUIRED is not a code a policy decision gives",
        ),
        (
            "unknown-name",
            ONE_CASE.replace("expect: allow", "expect: POLICY_VIOLATION_EVERYTHING"),
            ":6: cases[0].expect:",
            "unknown expectation",
        ),
        (
            "unknown-key",
            ONE_CASE.replace("    expect: allow", "    expect: allow\n    comment: why"),
            ":7: cases[0].comment:",
            "unknown field `comment`, expected one of name, context",
        ),
        (
            "bad-label",
            ONE_CASE.replace(
                "    expect",
                "    session_labels: [ok, \"not ok\"]\n    expect",
            ),
            ":6: cases[0].session_labels[1]:",
            "invalid label \"not ok\"",
        ),
        (
            "duplicate-name",
            duplicate,
            ":7: cases[1].name:",
            "duplicate case name \"read\"",
        ),
        (
            "bad-tool",
            ONE_CASE.replace("tool: fs.read_file", "tool: fs/read"),
            ":4: cases[0].tool:",
            "tool name \"fs/read\" contains \"/\"",
        ),
    ];
    let good = write(dir.path(), "a-good.yaml", ONE_CASE);
    for (name, text, position, reason) in bad {
        let file = write(dir.path(), &format!("{name}.yaml"), &text);
        let (status, out) = policy_test(&policies, &[&good, &file], &[]);
        assert_eq!(status, 2, "{name}: {out}");
        let expected = format!("{}{position}", s(&file));
        assert!(
            out.contains(&expected) && out.contains(reason),
            "{name}: want {expected} … {reason}, got: {out}"
        );
        assert!(!out.contains("passed"), "{name}: nothing runs: {out}");
    }

    // A file that cannot be read, and a folder without cases files.
    let missing = dir.path().join("missing.yaml");
    let (status, out) = policy_test(&policies, &[&missing], &[]);
    assert_eq!(status, 2, "{out}");
    assert!(
        out.contains(s(&missing)) && out.contains("cannot read"),
        "{out}"
    );
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let (status, out) = policy_test(&policies, &[&empty], &[]);
    assert_eq!(status, 2, "{out}");
    assert!(out.contains("no *.yaml or *.yml cases files"), "{out}");

    // Invalid policies, and bad usage (no CASES at all).
    write(&policies, "broken.yaml", "name: broken\ncapabilities: 3\n");
    let (status, out) = policy_test(&policies, &[&good], &[]);
    assert_eq!(status, 2, "{out}");
    assert!(out.contains("broken.yaml:2"), "{out}");
    let (status, _) = run_cli(&["policy", "test"]);
    assert_eq!(status, 2);
}

#[test]
fn a_folder_of_cases_runs_its_yaml_files_in_name_order_not_its_subfolders() {
    let dir = workspace(&[("repo-reader.yaml", REPO_READER)]);
    let folder = dir.path().join("cases");
    std::fs::create_dir_all(folder.join("sub")).unwrap();
    let failing = ONE_CASE.replace("expect: allow", "expect: 2002");
    write(&folder, "b.yaml", &failing);
    write(&folder, "a.yml", &failing);
    write(&folder, "c.yaml", ONE_CASE);
    // Neither a subfolder, a dot file nor another extension is read (each would be refused).
    write(&folder.join("sub"), "d.yaml", "nonsense: true\n");
    write(&folder, ".e.yaml", "nonsense: true\n");
    write(&folder, "notes.txt", "nonsense: true\n");
    let (status, out) = policy_test(&dir.path().join("policies"), &[&folder], &[]);
    assert_eq!(status, 1, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 3, "{out}");
    assert!(
        lines[0].starts_with(&format!("FAIL {}: read:", s(&folder.join("a.yml")))),
        "{out}"
    );
    assert!(
        lines[1].starts_with(&format!("FAIL {}: read:", s(&folder.join("b.yaml")))),
        "{out}"
    );
    assert_eq!(lines[2], "1 passed, 2 failed");
}

/// Reads a JUnit report as a CI server would: validated against the Jenkins xunit plugin's schema
/// (junit-10.xsd, from pytest's pinned sdist) with xmlschema, then parsed by junitparser.
const READ_REPORT: &str = r#"
import json, sys
import xmlschema
from junitparser import JUnitXml, Failure

report, xsd = sys.argv[1], sys.argv[2]
xmlschema.XMLSchema(xsd).validate(report)
suites = []
for suite in JUnitXml.fromfile(report):
    cases = []
    for case in suite:
        failures = [r for r in case.result if isinstance(r, Failure)]
        cases.append({
            "name": case.name, "classname": case.classname, "time": case.time,
            "message": failures[0].message if failures else None,
            "type": failures[0].type if failures else None,
            "text": failures[0].text if failures else None,
        })
    suites.append({"name": suite.name, "tests": suite.tests, "failures": suite.failures,
                   "errors": suite.errors, "skipped": suite.skipped, "cases": cases})
print(json.dumps(suites))
"#;

fn read_report(report: &Path) -> Value {
    let python = pinned_tool("junit", "python", "JUNIT_PYTHON");
    let xsd = python
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("junit-10.xsd");
    assert!(
        xsd.exists(),
        "{} is missing: run scripts/test.sh",
        xsd.display()
    );
    let out = Command::new(python)
        .args(["-c", READ_REPORT, s(report), s(&xsd)])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the report does not validate or parse: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn the_junit_report_validates_against_the_schema_and_reads_back() {
    let dir = workspace(&[
        ("repo-reader.yaml", REPO_READER),
        ("trifecta.yaml", TRIFECTA),
    ]);
    let reader = write(
        dir.path(),
        "reader.yaml",
        &READER_CASES.replace(
            "expect: POLICY_VIOLATION_COMMAND_NOT_ALLOWED",
            "expect: allow",
        ),
    );
    // Names that XML must escape, and one character it cannot hold at all.
    let flows = write(
        dir.path(),
        "flows.yaml",
        "cases:\n  - name: \"send <after> & \\\"both\\\" 'labels'\\u0001\"\n    context: trifecta\n    \
         tool: email.send\n    args: {}\n    session_labels: [untrusted_content, private_data]\n    expect: 2010\n",
    );
    let report = dir.path().join("out/report.xml");
    std::fs::create_dir(dir.path().join("out")).unwrap();
    let (status, out) = policy_test(
        &dir.path().join("policies"),
        &[&reader, &flows],
        &["--junit", s(&report)],
    );
    assert_eq!(status, 1, "{out}");
    assert_eq!(last_line(&out), "6 passed, 1 failed");

    let suites = read_report(&report);
    let suites = suites.as_array().unwrap();
    assert_eq!(suites.len(), 2, "{suites:?}");
    let (first, second) = (&suites[0], &suites[1]);
    assert_eq!(first["name"], "reader.yaml");
    assert_eq!(
        (first["tests"].as_u64(), first["failures"].as_u64()),
        (Some(6), Some(1))
    );
    assert_eq!(
        (first["errors"].as_u64(), first["skipped"].as_u64()),
        (Some(0), Some(0))
    );
    let cases = first["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 6);
    assert!(cases.iter().all(|case| case["classname"] == "repo-reader"));
    assert_eq!(cases[0]["name"], "read-a-file");
    assert_eq!(cases[0]["message"], Value::Null);
    let failed = &cases[5];
    assert_eq!(failed["name"], "git-log-output");
    assert_eq!(
        failed["message"],
        "expected allow, got 2003 POLICY_VIOLATION_COMMAND_NOT_ALLOWED (rule: capability #1 cmd.run): \
         argument \"command\": word 3 is the option \"--output\", which option_allowlist for \"git log\" \
         does not list"
    );
    assert_eq!(failed["type"], "POLICY_VIOLATION_COMMAND_NOT_ALLOWED");
    let text = failed["text"].as_str().unwrap();
    assert!(
        text.contains("tool: cmd.run") && text.contains("git log --output=log.txt"),
        "{text}"
    );

    assert_eq!(second["name"], "flows.yaml");
    assert_eq!(
        (second["tests"].as_u64(), second["failures"].as_u64()),
        (Some(1), Some(0))
    );
    assert_eq!(
        second["cases"][0]["name"],
        "send <after> & \"both\" 'labels'\u{FFFD}"
    );
    assert_eq!(second["cases"][0]["classname"], "trifecta");
}

/// A candidate for repo-reader that takes `-n` away from `git log` (SPEC 6.4 r4).
const REPO_READER_SHADOW: &str = r#"
name: repo-reader
capabilities:
  - { tool_pattern: "fs.read*", path_allowlist: ["/workspace"], claim: off }
  - tool_pattern: "cmd.run"
    path_allowlist: ["/workspace"]
    path_arguments: ["cwd"]
    command_allowlist: ["git"]
    subcommand_allowlist: { git: ["log", "status", "diff"] }
    option_allowlist: { "git log": ["--oneline", "--format"] }
    claim: off
"#;

#[test]
fn a_shadow_version_is_checked_listed_and_tested_with_shadow() {
    let dir = workspace(&[
        ("repo-reader.yaml", REPO_READER),
        ("repo-reader.shadow.yaml", REPO_READER_SHADOW),
    ]);
    let policies = dir.path().join("policies");
    let (status, out) = run_cli(&["policy", "check", s(&policies)]);
    assert_eq!(status, 0, "{out}");
    assert!(out.contains("ok  repo-reader  shadow  (version "), "{out}");
    assert!(
        out.contains("1 security context(s) and 1 shadow version(s) valid"),
        "{out}"
    );

    // The cases decide by the version in force, or with --shadow by the candidate.
    let cases = write(dir.path(), "reader.yaml", READER_CASES);
    let (status, out) = policy_test(&policies, &[&cases], &[]);
    assert_eq!(
        (status, last_line(&out)),
        (0, "6 passed, 0 failed"),
        "{out}"
    );
    let (status, out) = policy_test(&policies, &[&cases], &["--shadow"]);
    assert_eq!(status, 1, "{out}");
    assert!(
        out.starts_with("FAIL ") && out.contains("git-log-short: expected allow, got 2003"),
        "{out}"
    );
    assert_eq!(last_line(&out), "5 passed, 1 failed");

    // A shadow is checked like any policy file: named after another context, it is refused.
    write(
        &policies,
        "repo-reader.shadow.yaml",
        "name: other\ncapabilities: []\n",
    );
    let (status, out) = run_cli(&["policy", "check", s(&policies)]);
    assert_eq!(status, 1, "{out}");
    assert!(
        out.contains(
            "repo-reader.shadow.yaml:1: name: a shadow file's name must be \"repo-reader\""
        ),
        "{out}"
    );
}
