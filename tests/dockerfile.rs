//! The image's build stage, replayed without Docker (no daemon runs where the tests run): its `COPY` lines
//! are copied into an empty folder, honouring `.dockerignore`, and its `cargo build` runs there. A manifest
//! that names a file the image does not get (the `audit_group_commit` bench once) fails here.
//!
//! The build shares this crate's target folder. Copies keep their modification times, so cargo finds the
//! artifacts of an identical tree fresh and the replay costs seconds. A file missing from the image is
//! still noticed: the manifest names it, or a compile step that read it no longer finds it and reruns.

use std::path::{Component, Path, PathBuf};
use std::process::Command;

const REPO: &str = env!("CARGO_MANIFEST_DIR");

/// One Dockerfile instruction: the keyword in upper case and the rest, with continuation lines joined.
struct Instruction {
    keyword: String,
    args: String,
}

struct Stage {
    name: Option<String>,
    instructions: Vec<Instruction>,
}

fn parse_dockerfile(text: &str) -> Vec<Stage> {
    let mut logical = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        // Docker drops comment lines even inside a continued instruction.
        if trimmed.starts_with('#') || (trimmed.is_empty() && current.is_empty()) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(head) => {
                current.push_str(head);
                current.push(' ');
            }
            None => {
                current.push_str(trimmed);
                logical.push(std::mem::take(&mut current));
            }
        }
    }
    assert!(
        current.is_empty(),
        "the Dockerfile ends inside a continued line"
    );

    let mut stages: Vec<Stage> = Vec::new();
    for line in logical {
        let (keyword, args) = line.split_once(char::is_whitespace).unwrap_or((&line, ""));
        let instruction = Instruction {
            keyword: keyword.to_ascii_uppercase(),
            args: args.trim().to_string(),
        };
        if instruction.keyword == "FROM" {
            let words: Vec<&str> = instruction.args.split_whitespace().collect();
            let name = match words.as_slice() {
                [_, alias, name] if alias.eq_ignore_ascii_case("as") => Some(name.to_string()),
                [_] => None,
                _ => panic!("unexpected FROM line: {}", instruction.args),
            };
            stages.push(Stage {
                name,
                instructions: Vec::new(),
            });
        } else {
            stages
                .last_mut()
                .expect("an instruction before the first FROM")
                .instructions
                .push(instruction);
        }
    }
    stages
}

/// A `COPY` line's flags, sources and destination (shell form only; the JSON form is not used here).
struct Copy {
    from: Option<String>,
    sources: Vec<String>,
    destination: String,
}

fn parse_copy(args: &str) -> Copy {
    assert!(
        !args.starts_with('['),
        "COPY in JSON form is not replayed: {args}"
    );
    let mut from = None;
    let mut words = Vec::new();
    for word in args.split_whitespace() {
        match word.strip_prefix("--from=") {
            Some(stage) => from = Some(stage.to_string()),
            None if word.starts_with("--") => {
                panic!("COPY flag {word} is not replayed by this test")
            }
            None => words.push(word.to_string()),
        }
    }
    let destination = words.pop().expect("COPY without a destination");
    assert!(!words.is_empty(), "COPY without a source: {args}");
    Copy {
        from,
        sources: words,
        destination,
    }
}

/// `.dockerignore` in the two forms this repository uses: a path from the context root, or `**/NAME`.
struct Ignore(Vec<String>);

impl Ignore {
    fn load() -> Ignore {
        let text =
            std::fs::read_to_string(Path::new(REPO).join(".dockerignore")).unwrap_or_default();
        let patterns: Vec<String> = text
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty() && !line.starts_with('#'))
            .map(|line| {
                line.trim_start_matches('/')
                    .trim_end_matches('/')
                    .to_string()
            })
            .collect();
        for pattern in &patterns {
            // A plain path, or `**/` and one plain name: anything else needs Docker's matcher here.
            let (name, any_depth) = match pattern.strip_prefix("**/") {
                Some(name) => (name, true),
                None => (pattern.as_str(), false),
            };
            let wildcard = name.contains(['*', '?', '[', '!']);
            let nested = any_depth && name.contains('/');
            assert!(
                !wildcard && !nested,
                ".dockerignore pattern {pattern:?} is beyond what this test replays: teach it here"
            );
        }
        Ignore(patterns)
    }

    /// Whether the context path `relative` (or a folder above it) is left out of the build context.
    fn excludes(&self, relative: &Path) -> bool {
        self.0
            .iter()
            .any(|pattern| match pattern.strip_prefix("**/") {
                Some(name) => relative.components().any(|c| c.as_os_str() == name),
                None => relative.starts_with(pattern),
            })
    }
}

/// A path inside the image, as a path under `root` (the replay's stand-in for `/`).
fn in_image(root: &Path, image_path: &Path) -> PathBuf {
    assert!(image_path.is_absolute(), "{}", image_path.display());
    let mut host = root.to_path_buf();
    for component in image_path.components() {
        match component {
            Component::RootDir => {}
            Component::Normal(part) => host.push(part),
            other => panic!("unexpected {other:?} in {}", image_path.display()),
        }
    }
    host
}

/// Copies a file or a folder's contents, keeping modification times (see the module comment).
fn copy_tree(ignore: &Ignore, relative: &Path, to: &Path) {
    if ignore.excludes(relative) {
        return;
    }
    let from = Path::new(REPO).join(relative);
    let metadata = std::fs::metadata(&from).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
    if metadata.is_dir() {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(&from).unwrap() {
            let name = entry.unwrap().file_name();
            copy_tree(ignore, &relative.join(&name), &to.join(&name));
        }
    } else {
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(&from, to).unwrap();
        let copied = std::fs::File::options().write(true).open(to).unwrap();
        copied.set_modified(metadata.modified().unwrap()).unwrap();
    }
}

fn check_source(ignore: &Ignore, source: &str) {
    assert!(
        !source.contains(['*', '?', '[']),
        "COPY source {source} has a wildcard, which this test does not replay"
    );
    let relative = Path::new(source.trim_start_matches("./"));
    assert!(
        Path::new(REPO).join(relative).exists(),
        "the Dockerfile copies {source}, which the repository does not have"
    );
    assert!(
        !ignore.excludes(relative),
        ".dockerignore leaves out {source}, which the Dockerfile copies"
    );
}

#[test]
fn the_images_build_stage_builds_from_its_copied_files_alone() {
    let text = std::fs::read_to_string(Path::new(REPO).join("Dockerfile")).unwrap();
    let stages = parse_dockerfile(&text);
    let ignore = Ignore::load();
    let last = stages.last().expect("a Dockerfile without a stage");

    // The stage that builds is the one whose output the final stage copies.
    let mut from_build: Vec<Copy> = Vec::new();
    for instruction in last.instructions.iter().filter(|i| i.keyword == "COPY") {
        let copy = parse_copy(&instruction.args);
        match copy.from {
            Some(_) => from_build.push(copy),
            None => copy.sources.iter().for_each(|s| check_source(&ignore, s)),
        }
    }
    let build_name = from_build
        .first()
        .and_then(|c| c.from.clone())
        .expect("no COPY --from in the last stage");
    assert!(from_build
        .iter()
        .all(|c| c.from.as_deref() == Some(build_name.as_str())));
    let build = stages
        .iter()
        .find(|s| s.name.as_deref() == Some(build_name.as_str()))
        .unwrap_or_else(|| panic!("no stage named {build_name}"));

    // Replay it: an empty folder stands for the image's root, with nothing beside the copied files.
    let root = tempfile::tempdir().unwrap();
    let mut workdir = PathBuf::from("/");
    let mut build_command = None;
    for instruction in &build.instructions {
        match instruction.keyword.as_str() {
            "WORKDIR" => {
                workdir = workdir.join(&instruction.args);
                std::fs::create_dir_all(in_image(root.path(), &workdir)).unwrap();
            }
            "COPY" => {
                let copy = parse_copy(&instruction.args);
                assert!(
                    copy.from.is_none(),
                    "the build stage copies from another stage"
                );
                let destination = workdir.join(&copy.destination);
                let into_folder = copy.destination.ends_with('/') || copy.sources.len() > 1;
                for source in &copy.sources {
                    check_source(&ignore, source);
                    let relative = Path::new(source.trim_start_matches("./"));
                    let target = if into_folder && Path::new(REPO).join(relative).is_file() {
                        destination.join(relative.file_name().unwrap())
                    } else {
                        destination.clone()
                    };
                    copy_tree(&ignore, relative, &in_image(root.path(), &target));
                }
            }
            "RUN" => {
                assert!(
                    build_command.is_none(),
                    "the build stage has more than one RUN: replay them here"
                );
                build_command = Some((instruction.args.clone(), workdir.clone()));
            }
            other => panic!("the build stage uses {other}, which this test does not replay yet"),
        }
    }

    let (command, run_in) = build_command.expect("the build stage runs nothing");
    assert!(
        !command.contains(['&', ';', '|', '$', '<', '>', '`', '"', '\'', '\\']),
        "the RUN line is more than one plain command: {command}"
    );
    let words: Vec<&str> = command.split_whitespace().collect();
    assert_eq!(
        words[..2],
        ["cargo", "build"],
        "the RUN line is not a cargo build: {command}"
    );

    // The crate's own target folder: CARGO_TARGET_TMPDIR is `<target>/tmp`.
    let target_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).parent().unwrap();
    let output = Command::new(env!("CARGO"))
        .args(&words[1..])
        .arg("--offline")
        .current_dir(in_image(root.path(), &run_in))
        .env("CARGO_TARGET_DIR", target_dir)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "`{command}` fails on the files the Dockerfile copies:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // What the final stage takes from the build stage is where that build put it.
    for copy in &from_build {
        for source in &copy.sources {
            let built = Path::new(source)
                .strip_prefix(run_in.join("target"))
                .unwrap_or_else(|_| panic!("{source} is not under the build's target folder"));
            assert!(
                target_dir.join(built).is_file(),
                "the build made no {source}"
            );
        }
    }
}
