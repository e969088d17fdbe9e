//! The Dockerfile as tests read it (tests/dockerfile.rs replays it; tests/kubernetes.rs holds the manifests
//! to it), and a folder that stands for an image's `/`, filled with programs from the host, a Debian like
//! the image's base.

use std::path::{Component, Path, PathBuf};
use std::process::Command;

const REPO: &str = env!("CARGO_MANIFEST_DIR");

/// One Dockerfile instruction: the keyword in upper case and the rest, with continuation lines joined.
pub struct Instruction {
    pub keyword: String,
    pub args: String,
}

pub struct Stage {
    pub name: Option<String>,
    pub instructions: Vec<Instruction>,
}

pub fn parse_dockerfile(text: &str) -> Vec<Stage> {
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
pub struct Copy {
    pub from: Option<String>,
    pub sources: Vec<String>,
    pub destination: String,
}

pub fn parse_copy(args: &str) -> Copy {
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

pub fn load_stages() -> Vec<Stage> {
    parse_dockerfile(&std::fs::read_to_string(Path::new(REPO).join("Dockerfile")).unwrap())
}

pub fn json_words(args: &str, what: &str) -> Vec<String> {
    serde_json::from_str(args)
        .unwrap_or_else(|e| panic!("{what} is not in JSON (exec) form: {args}: {e}"))
}

/// A path inside the image, as a path under `root` (the replay's stand-in for `/`).
pub fn in_image(root: &Path, image_path: &Path) -> PathBuf {
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

/// Copies the host's CA bundle (the `ca-certificates` package) into the image at `root`.
pub fn install_ca_bundle(root: &Path) {
    let bundle = Path::new("/etc/ssl/certs/ca-certificates.crt");
    let to = in_image(root, bundle);
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    std::fs::copy(bundle, to).unwrap();
}

/// Copies the host's `program` into the image at `root` as `image_path`, with the libraries it loads.
pub fn install_program(root: &Path, program: &Path, image_path: &Path) {
    let to = in_image(root, image_path);
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    std::fs::copy(program, to).unwrap();
    add_libraries(root, image_path);
}

/// Copies the shared libraries that the program at `image_path` loads from the host into the image.
pub fn add_libraries(root: &Path, image_path: &Path) {
    let program = in_image(root, image_path);
    let out = Command::new("ldd").arg(&program).output().expect("ldd");
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)` or `/lib64/ld-linux-x86-64.so.2 (0x…)`
        let path = line.split("=>").last().unwrap().split_whitespace().next();
        if let Some(path) = path.filter(|p| p.starts_with('/')) {
            let to = in_image(root, Path::new(path));
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(path, to).unwrap();
        }
    }
}
