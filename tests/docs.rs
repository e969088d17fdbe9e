//! The manual, checked as files: the book's table of contents and its pages agree, every relative link
//! lands on a file and heading that exist, the README stays a front page that opens with the two commands,
//! and the reference pages agree with the code they describe: every configuration key and its default
//! (found by asking the configuration reader itself), every command and flag of `sealgate --help`, the
//! code table, and the served API's endpoints. No gateway is started.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Map, Value};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn read_doc(name: &str) -> String {
    read(&repo().join("docs").join(name))
}

/// Every Markdown file under `dir`, recursively.
fn markdown_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(markdown_files(&path));
        } else if path.extension().is_some_and(|ext| ext == "md") {
            found.push(path);
        }
    }
    found
}

// ---- Markdown, as much of it as links and tables need ----------------------------------------------

/// The lines outside fenced code blocks, with their line numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            lines.push((index + 1, line));
        }
    }
    lines
}

/// The line without its inline code spans, where brackets are text, not links.
fn without_code_spans(line: &str) -> String {
    line.split('`').step_by(2).collect::<Vec<_>>().join(" ")
}

/// A heading's text as rendered: code spans and emphasis lose their marks, a link keeps its text.
fn rendered_text(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    while let Some(start) = rest.find('[') {
        let Some((label, after)) = rest[start + 1..].split_once("](") else {
            break;
        };
        let Some((_, tail)) = after.split_once(')') else {
            break;
        };
        text.push_str(&rest[..start]);
        text.push_str(label);
        rest = tail;
    }
    text.push_str(rest);
    text.replace(['`', '*'], "")
}

/// GitHub's and mdBook's anchor of a heading: lower case, spaces to '-', punctuation other than '-' and
/// '_' dropped.
fn slug(heading: &str) -> String {
    rendered_text(heading)
        .trim()
        .chars()
        .filter_map(|c| match c {
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_ascii_lowercase()),
            c if c.is_whitespace() => Some('-'),
            _ => None,
        })
        .collect()
}

/// The headings of a page: (level, text).
fn headings(text: &str) -> Vec<(usize, &str)> {
    prose_lines(text)
        .into_iter()
        .filter_map(|(_, line)| {
            let level = line.chars().take_while(|&c| c == '#').count();
            let title = line[level..].strip_prefix(' ')?;
            (level > 0).then_some((level, title))
        })
        .collect()
}

/// Every anchor a page offers; a repeated heading gets `-1`, `-2`, … as both renderers number them.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (_, title) in headings(text) {
        let base = slug(title);
        let mut anchor = base.clone();
        let mut n = 0;
        while found.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        found.insert(anchor);
    }
    found
}

/// The targets of the inline links and images of a page, with their line numbers.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (number, line) in prose_lines(text) {
        let line = without_code_spans(line);
        for (_, after) in line.match_indices("](").map(|(i, _)| line.split_at(i + 2)) {
            if let Some((inside, _)) = after.split_once(')') {
                let target = inside.split_whitespace().next().unwrap_or_default();
                found.push((number, target.to_owned()));
            }
        }
    }
    found
}

/// The cells of a table row, trimmed; None for a line that is no row.
fn row_cells(line: &str) -> Option<Vec<&str>> {
    let inner = line.trim().strip_prefix('|')?.strip_suffix('|')?;
    Some(inner.split('|').map(str::trim).collect())
}

/// The code spans of a cell: "`a`, `b`" gives ["a", "b"].
fn code_spans(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// A cell that is exactly one code span.
fn one_code_span(cell: &str) -> Option<&str> {
    let inner = cell.strip_prefix('`')?.strip_suffix('`')?;
    (!inner.contains('`')).then_some(inner)
}

// ---- The book and its links -----------------------------------------------------------------------

/// The pages docs/SUMMARY.md lists, relative to docs/.
fn summary_pages() -> Vec<String> {
    links(&read_doc("SUMMARY.md"))
        .into_iter()
        .map(|(_, target)| target)
        .collect()
}

#[test]
fn every_page_of_the_summary_exists_and_every_page_is_in_the_summary() {
    let docs = repo().join("docs");
    let listed: BTreeSet<PathBuf> = summary_pages().iter().map(|p| docs.join(p)).collect();
    let missing: Vec<_> = listed.iter().filter(|page| !page.is_file()).collect();
    assert!(
        missing.is_empty(),
        "SUMMARY.md lists pages that do not exist: {missing:?}"
    );
    let orphans: Vec<_> = markdown_files(&docs)
        .into_iter()
        .filter(|page| !page.ends_with("SUMMARY.md") && !listed.contains(page))
        .collect();
    assert!(
        orphans.is_empty(),
        "pages that SUMMARY.md does not list: {orphans:?}"
    );
    let book = read(&docs.join("book.toml"));
    assert!(
        book.contains("src = \".\""),
        "book.toml must keep the pages where they are"
    );
}

/// What is wrong with one link of `page`, if anything.
fn broken(page: &Path, target: &str) -> Option<String> {
    if target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let (file, anchor) = target.split_once('#').unwrap_or((target, ""));
    let landing = match file {
        "" => page.to_path_buf(),
        file => page.parent().unwrap().join(file),
    };
    if !landing.exists() {
        return Some(format!("{target}: no such file"));
    }
    let is_page = landing.extension().is_some_and(|ext| ext == "md");
    if anchor.is_empty() || !is_page {
        return None;
    }
    (!anchors(&read(&landing)).contains(anchor)).then(|| format!("{target}: no such heading"))
}

#[test]
fn every_relative_link_lands_on_a_file_and_heading_that_exist() {
    let root = repo();
    let mut pages = markdown_files(&root.join("docs"));
    for page in [
        "README.md",
        "CHANGELOG.md",
        "deploy/README.md",
        "deploy/kubernetes/README.md",
    ] {
        pages.push(root.join(page));
    }
    let mut problems = Vec::new();
    for page in &pages {
        for (line, target) in links(&read(page)) {
            if let Some(problem) = broken(page, &target) {
                let shown = page.strip_prefix(&root).unwrap().display();
                problems.push(format!("{shown}:{line}: {problem}"));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "broken links:\n{}",
        problems.join("\n")
    );
}

#[test]
fn slugs_follow_the_renderers_rules() {
    assert_eq!(slug("12. Durability"), "12-durability");
    assert_eq!(slug("`agent_tokens`: keys"), "agent_tokens-keys");
    assert_eq!(
        slug("Use it from an MCP host: `sealgate connect`"),
        "use-it-from-an-mcp-host-sealgate-connect"
    );
    assert_eq!(slug("The [audit](x.md) trail (r2)"), "the-audit-trail-r2");
    let repeated = anchors("# A\n## Notes\n```\n# not a heading\n```\n## Notes\n");
    assert_eq!(
        repeated,
        BTreeSet::from(["a".into(), "notes".into(), "notes-1".into()])
    );
}

// ---- The front page -------------------------------------------------------------------------------

/// The commands of the README's first code block, without their comments.
const THE_TWO_COMMANDS: [&str; 2] = ["cargo run --release -- demo", "./scripts/test.sh"];

fn command_of(line: &str) -> &str {
    line.split(" #").next().unwrap_or_default().trim()
}

#[test]
fn the_readme_is_a_short_front_page_that_opens_with_the_two_commands() {
    let readme = read(&repo().join("README.md"));
    let lines: Vec<&str> = readme.lines().collect();
    assert!(
        lines.len() < 150,
        "README.md has {} lines; keep it under 150",
        lines.len()
    );
    assert!(lines[0].starts_with("# "), "README.md opens with its title");
    let fence = lines.iter().position(|l| l.starts_with("```")).unwrap();
    assert!(
        lines[1..fence].iter().all(|l| l.trim().is_empty()),
        "the commands come first after the title"
    );
    let close = fence
        + 1
        + lines[fence + 1..]
            .iter()
            .position(|l| l.starts_with("```"))
            .unwrap();
    let commands: Vec<&str> = lines[fence + 1..close]
        .iter()
        .map(|l| command_of(l))
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(commands, THE_TWO_COMMANDS);
    let ci = read(&repo().join(".ci/run"));
    let runs_tests = ci
        .lines()
        .map(|l| l.trim().trim_start_matches("exec ").trim())
        .any(|l| l == THE_TWO_COMMANDS[1]);
    assert!(runs_tests, ".ci/run must run {}", THE_TWO_COMMANDS[1]);
}

// ---- Configuration: docs/configuration.md against the configuration reader --------------------------

/// A field name no configuration struct has: the reader's refusal of it lists the fields it expects.
const PROBE: &str = "zz_probe";
/// `<name>` in a key stands for a name the user chooses (a mapping's key), `[]` for each list entry.
const ANY_NAME: &str = "<name>";
const EACH: &str = "[]";

/// The configuration tree that puts `leaf` at `path`.
fn placed(path: &[String], leaf: Value) -> Value {
    path.iter()
        .rev()
        .fold(leaf, |inner, segment| match segment.as_str() {
            ANY_NAME => json!({ "x": inner }),
            EACH => json!([inner]),
            key => json!({ key: inner }),
        })
}

/// The configuration read from `tree`, shown with `Debug`, or the reader's error.
fn configured(tree: &Value) -> Result<String, String> {
    sealgate::config::Config::from_yaml(&tree.to_string(), Path::new("."), &[])
        .map(|config| format!("{config:?}"))
}

/// The fields of the struct at `path`, if the reader refuses an unknown field there.
fn fields_at(path: &[String]) -> Option<Vec<String>> {
    let refused = configured(&placed(path, json!({ PROBE: 1 }))).err()?;
    let expected = refused
        .split_once(&format!("unknown field `{PROBE}`, expected "))?
        .1;
    Some(
        code_spans(expected)
            .into_iter()
            .map(str::to_owned)
            .collect(),
    )
}

fn dotted(path: &[String]) -> String {
    let mut key = String::new();
    for segment in path {
        if segment != EACH && !key.is_empty() {
            key.push('.');
        }
        key.push_str(segment);
    }
    key
}

/// Every key of the struct at `path`: leaves, and mappings or lists of structs (with their own keys).
fn keys_under(path: &mut Vec<String>, keys: &mut BTreeSet<String>) {
    for field in fields_at(path).unwrap_or_else(|| panic!("{} is no struct", dotted(path))) {
        path.push(field);
        if fields_at(path).is_some() {
            keys_under(path, keys);
        } else {
            for entry in [ANY_NAME, EACH] {
                path.push(entry.to_owned());
                let entries_are_structs = fields_at(path).is_some();
                if entries_are_structs {
                    keys_under(path, keys);
                }
                path.pop();
                if entries_are_structs {
                    break;
                }
            }
            keys.insert(dotted(path));
        }
        path.pop();
    }
}

fn split_key(key: &str) -> Vec<String> {
    key.replace(EACH, &format!(".{EACH}"))
        .split('.')
        .map(str::to_owned)
        .collect()
}

/// Whether the reader gives the same configuration with `key` left out as with `key: default`.
fn default_problem(key: &str, default: &str) -> Option<String> {
    let path = split_key(key);
    let (leaf, parent) = path.split_last().unwrap();
    let value: Value = match serde_saphyr::from_str(default) {
        Ok(value) => value,
        Err(e) => return Some(format!("{key}: default `{default}` is not YAML: {e}")),
    };
    let mut set = Map::new();
    set.insert(leaf.clone(), value);
    let left_out = configured(&placed(parent, json!({})));
    let written = configured(&placed(parent, Value::Object(set)));
    match (left_out, written) {
        (Ok(left_out), Ok(written)) if left_out == written => None,
        (Ok(_), Ok(_)) => Some(format!("{key}: the code's default is not `{default}`")),
        (Err(refused), _) | (_, Err(refused)) => Some(format!("{key}: {refused}")),
    }
}

#[test]
fn the_configuration_reference_and_the_reader_agree_on_every_key_and_default() {
    let mut code = BTreeSet::new();
    keys_under(&mut Vec::new(), &mut code);
    assert!(code.contains("limits.max_body_bytes") && code.contains("agent_tokens.keys[].alg"));
    let reference = read_doc("configuration.md");
    let mut documented = BTreeSet::new();
    let mut problems = Vec::new();
    for (_, line) in prose_lines(&reference) {
        let Some(cells) = row_cells(line).filter(|c| c.len() == 3 && c[0].starts_with('`')) else {
            continue;
        };
        for key in code_spans(cells[0]) {
            documented.insert(key.to_owned());
            if let Some(default) = one_code_span(cells[1]) {
                problems.extend(default_problem(key, default));
            }
        }
    }
    for key in code.difference(&documented) {
        problems.push(format!("{key}: not in the reference"));
    }
    for key in documented.difference(&code) {
        problems.push(format!("{key}: no such key in the code"));
    }
    assert!(
        problems.is_empty(),
        "docs/configuration.md:\n{}",
        problems.join("\n")
    );
}

// ---- The command line: docs/cli.md against `sealgate --help` ---------------------------------------

fn help(command: &[String]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_sealgate"))
        .args(command)
        .arg("--help")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "sealgate {} --help failed",
        command.join(" ")
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The lines of a help text's section ("Commands:", "Options:"), up to the blank line that ends it.
fn help_section<'a>(help: &'a str, title: &str) -> Vec<&'a str> {
    help.lines()
        .skip_while(|l| *l != title)
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .collect()
}

fn subcommands(help: &str) -> Vec<String> {
    help_section(help, "Commands:")
        .into_iter()
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

/// The long flags a command takes, besides `--help` and `--version`.
fn flags(help: &str) -> Vec<String> {
    help_section(help, "Options:")
        .into_iter()
        .filter_map(|l| {
            l.split_whitespace()
                .map(|word| word.trim_end_matches(','))
                .find(|word| word.starts_with("--"))
        })
        .filter(|flag| !matches!(*flag, "--help" | "--version"))
        .map(str::to_owned)
        .collect()
}

/// The text under each heading of a page, keyed by the heading's first code span.
fn sections_by_code(page: &str) -> Vec<(String, String)> {
    let mut sections: Vec<(String, String)> = Vec::new();
    for line in page.lines() {
        let is_heading = line.starts_with('#');
        match code_spans(line).first() {
            Some(name) if is_heading => sections.push((name.to_string(), String::new())),
            _ if is_heading => sections.push((String::new(), String::new())),
            _ => {
                if let Some((_, text)) = sections.last_mut() {
                    text.push_str(line);
                    text.push('\n');
                }
            }
        }
    }
    sections
}

/// Every command under `command`, each with what the reference lacks of it.
fn cli_problems(
    command: &mut Vec<String>,
    reference: &[(String, String)],
    problems: &mut Vec<String>,
) {
    let text = help(command);
    let name = format!("sealgate {}", command.join(" "))
        .trim_end()
        .to_owned();
    match reference.iter().find(|(heading, _)| *heading == name) {
        None if !command.is_empty() => problems.push(format!("no section for `{name}`")),
        None => {}
        Some((_, section)) => {
            for flag in flags(&text) {
                if !section.contains(&format!("`{flag}")) {
                    problems.push(format!("`{name}`: {flag} is not described"));
                }
            }
        }
    }
    for sub in subcommands(&text) {
        command.push(sub);
        cli_problems(command, reference, problems);
        command.pop();
    }
}

#[test]
fn the_cli_reference_describes_every_command_and_flag() {
    let reference = sections_by_code(&read_doc("cli.md"));
    assert!(subcommands(&help(&[])).contains(&"serve".to_owned()));
    let mut problems = Vec::new();
    cli_problems(&mut Vec::new(), &reference, &mut problems);
    assert!(problems.is_empty(), "docs/cli.md:\n{}", problems.join("\n"));
}

// ---- Codes and endpoints ---------------------------------------------------------------------------

#[test]
fn the_code_table_matches_the_gateway() {
    let code = sealgate::error::Code::ALL
        .iter()
        .map(|c| {
            (
                c.number().to_string(),
                c.name().to_owned(),
                c.status().as_u16().to_string(),
            )
        })
        .collect::<BTreeSet<_>>();
    let documented = prose_lines(&read_doc("codes.md"))
        .into_iter()
        .filter_map(|(_, line)| row_cells(line))
        .filter(|cells| cells.len() >= 3 && cells[0].parse::<u16>().is_ok())
        .map(|cells| {
            let status = cells[2].split_whitespace().next().unwrap_or_default();
            (
                cells[0].to_owned(),
                cells[1].replace('`', ""),
                status.to_owned(),
            )
        })
        .collect::<BTreeSet<_>>();
    assert_eq!(
        documented, code,
        "docs/codes.md: (number, name, HTTP status)"
    );
}

const HTTP_METHODS: [&str; 5] = ["GET", "POST", "PUT", "DELETE", "PATCH"];

#[test]
fn the_api_reference_lists_every_endpoint_of_the_served_document() {
    let document = serde_json::to_value(sealgate::api::openapi_document()).unwrap();
    let served: BTreeSet<(String, String)> = document["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, operations)| {
            let methods = operations.as_object().unwrap().keys();
            let methods = methods.filter(|m| HTTP_METHODS.contains(&m.to_uppercase().as_str()));
            methods.map(move |method| (method.to_uppercase(), path.clone()))
        })
        .collect();
    let documented: BTreeSet<(String, String)> = prose_lines(&read_doc("api.md"))
        .into_iter()
        .filter_map(|(_, line)| row_cells(line))
        .filter_map(|cells| {
            let method = one_code_span(cells.first()?).filter(|m| HTTP_METHODS.contains(m))?;
            let path = one_code_span(cells.get(1)?)?;
            Some((method.to_owned(), path.to_owned()))
        })
        .collect();
    assert_eq!(documented, served, "docs/api.md: (method, path) rows");
}
