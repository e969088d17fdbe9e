//! The image, replayed without Docker (no daemon runs where the tests run). Its build stage: the `COPY` lines
//! are copied into an empty folder, honouring `.dockerignore`, and its `cargo build` runs there. A manifest
//! that names a file the image does not get (the `audit_group_commit` bench once) fails here. Its final
//! stage: the file layout is made in another folder, with docker-compose.yml's mounts on top, and the
//! binary runs chrooted there as a non-root user, as `docker compose up` would run it.
//!
//! The build shares this crate's target folder. Copies keep their modification times, so cargo finds the
//! artifacts of an identical tree fresh and the replay costs seconds. A file missing from the image is
//! still noticed: the manifest names it, or a compile step that read it no longer finds it and reruns.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, OnceLock};

use common::dockerfile::{
    add_libraries, in_image, install_ca_bundle, json_words, load_stages, parse_copy, Copy, Stage,
};
use serde_json::{json, Value};

const REPO: &str = env!("CARGO_MANIFEST_DIR");

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

/// Where the build stage ran its build, and the host folder that stands for its `target`.
struct Built {
    run_in: PathBuf,
    target_dir: PathBuf,
}

impl Built {
    /// The host file for a path of the build stage's image under its target folder.
    fn host_path(&self, image_path: &str) -> PathBuf {
        let relative = Path::new(image_path)
            .strip_prefix(self.run_in.join("target"))
            .unwrap_or_else(|_| panic!("{image_path} is not under the build's target folder"));
        self.target_dir.join(relative)
    }
}

/// Copies a `COPY` line's sources from the build context to where the image at `root` gets them.
fn replay_copy(ignore: &Ignore, root: &Path, workdir: &Path, copy: &Copy) {
    let destination = workdir.join(&copy.destination);
    let into_folder = copy.destination.ends_with('/') || copy.sources.len() > 1;
    for source in &copy.sources {
        check_source(ignore, source);
        let relative = Path::new(source.trim_start_matches("./"));
        let target = if into_folder && Path::new(REPO).join(relative).is_file() {
            destination.join(relative.file_name().unwrap())
        } else {
            destination.clone()
        };
        copy_tree(ignore, relative, &in_image(root, &target));
    }
}

/// The name of the stage that the final stage copies from (all its `COPY --from` must name one stage).
fn build_stage_name(last: &Stage) -> String {
    let froms: Vec<String> = last
        .instructions
        .iter()
        .filter(|i| i.keyword == "COPY")
        .filter_map(|i| parse_copy(&i.args).from)
        .collect();
    let name = froms
        .first()
        .cloned()
        .expect("no COPY --from in the last stage");
    assert!(
        froms.iter().all(|f| *f == name),
        "COPY --from names several stages"
    );
    name
}

/// Replays the build stage once for every test of this file (a second cargo build would only wait).
fn built() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(replay_build_stage)
}

fn replay_build_stage() -> Built {
    let stages = load_stages();
    let ignore = Ignore::load();
    let build_name = build_stage_name(stages.last().expect("a Dockerfile without a stage"));
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
                replay_copy(&ignore, root.path(), &workdir, &copy);
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
    Built {
        run_in,
        target_dir: target_dir.to_path_buf(),
    }
}

#[test]
fn the_images_build_stage_builds_from_its_copied_files_alone() {
    let stages = load_stages();
    let ignore = Ignore::load();
    let last = stages.last().expect("a Dockerfile without a stage");
    for instruction in last.instructions.iter().filter(|i| i.keyword == "COPY") {
        let copy = parse_copy(&instruction.args);
        if copy.from.is_none() {
            copy.sources.iter().for_each(|s| check_source(&ignore, s));
        }
    }
    let built = built();

    // What the final stage takes from the build stage is where that build put it.
    for instruction in last.instructions.iter().filter(|i| i.keyword == "COPY") {
        let copy = parse_copy(&instruction.args);
        if copy.from.is_some() {
            for source in &copy.sources {
                assert!(
                    built.host_path(source).is_file(),
                    "the build made no {source}"
                );
            }
        }
    }
}

/// The non-root user that stands for the image's service user: `nobody`, which every Linux host has.
const SERVICE_UID: u32 = 65534;

/// The final stage, laid out under a folder that stands for the container's `/`.
struct Image {
    root: tempfile::TempDir,
    /// Users made by `useradd`, by name: all of them stand for [`SERVICE_UID`].
    users: Vec<String>,
    /// What `apt-get install` installs.
    packages: Vec<String>,
    uid: u32,
    workdir: PathBuf,
    env: BTreeMap<String, String>,
    exposed: Vec<String>,
    healthcheck: Vec<String>,
    command: Vec<String>,
}

/// Makes folders as `install -d [-o USER] [-g GROUP] [-m MODE] DIR…` does.
fn replay_install(image: &Image, words: &[String]) {
    let mut rest = words.iter();
    let (mut owner, mut mode, mut dirs, mut folders) = (0, 0o755, Vec::new(), false);
    while let Some(word) = rest.next() {
        match word.as_str() {
            "-d" => folders = true,
            "-o" | "-g" => {
                let name = rest.next().expect("-o/-g without a name");
                owner = image.uid_of(name);
            }
            "-m" => {
                let text = rest.next().expect("-m without a mode");
                mode = u32::from_str_radix(text, 8).unwrap_or_else(|_| panic!("mode {text}"));
            }
            flag if flag.starts_with('-') => panic!("install {flag} is not replayed"),
            dir => dirs.push(dir.to_string()),
        }
    }
    assert!(folders, "only `install -d` is replayed");
    for dir in dirs {
        let host = in_image(image.root.path(), Path::new(&dir));
        std::fs::create_dir_all(&host).unwrap();
        std::os::unix::fs::chown(&host, Some(owner), Some(owner)).unwrap();
        std::fs::set_permissions(&host, std::fs::Permissions::from_mode(mode)).unwrap();
    }
}

impl Image {
    fn uid_of(&self, name: &str) -> u32 {
        match name {
            "root" => 0,
            user if self.users.iter().any(|u| u == user) => SERVICE_UID,
            other => panic!("the image has no user {other}"),
        }
    }

    /// One command of a `RUN` line. Packages are not installed: the host's files stand in for those the
    /// gateway uses (see [`Image::add_base_files`]).
    fn replay_run(&mut self, words: &[String]) {
        match words.first().map(String::as_str) {
            Some("apt-get") if words.get(1).is_some_and(|w| w == "install") => self
                .packages
                .extend(words[2..].iter().filter(|w| !w.starts_with('-')).cloned()),
            Some("apt-get") => {}
            Some("rm") => assert!(
                words[1..]
                    .iter()
                    .all(|w| w.starts_with('-') || w.starts_with("/var/lib/apt/lists")),
                "RUN removes more than apt's lists: {words:?}"
            ),
            Some("useradd") => {
                assert!(
                    !words.iter().any(|w| w == "-m" || w == "--create-home"),
                    "useradd --create-home is not replayed: the image makes its folders with install -d"
                );
                self.users.push(words.last().unwrap().clone());
            }
            Some("install") => replay_install(self, &words[1..]),
            _ => panic!("RUN {words:?} is not replayed by this test: teach it here"),
        }
    }

    fn build() -> Image {
        let stages = load_stages();
        let ignore = Ignore::load();
        let last = stages.last().expect("a Dockerfile without a stage");
        let build_name = build_stage_name(last);
        let built = built();
        let root = tempfile::tempdir().unwrap();
        // The container's `/` is world-readable; the temporary folder is made for its owner only.
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut image = Image {
            root,
            users: Vec::new(),
            packages: Vec::new(),
            uid: 0,
            workdir: PathBuf::from("/"),
            env: BTreeMap::new(),
            exposed: Vec::new(),
            healthcheck: Vec::new(),
            command: Vec::new(),
        };
        let mut entrypoint = Vec::new();
        for instruction in &last.instructions {
            let args = instruction.args.as_str();
            match instruction.keyword.as_str() {
                "RUN" => {
                    for part in args.split("&&") {
                        image.replay_run(&shell_words::split(part).expect("RUN words"));
                    }
                }
                "COPY" => {
                    let copy = parse_copy(args);
                    match copy.from.as_deref() {
                        Some(from) => {
                            assert_eq!(from, build_name);
                            let [source] = copy.sources.as_slice() else {
                                panic!("COPY --from with several sources: {args}")
                            };
                            let to = in_image(image.root.path(), Path::new(&copy.destination));
                            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
                            std::fs::copy(built.host_path(source), to).unwrap();
                        }
                        None => replay_copy(&ignore, image.root.path(), &image.workdir, &copy),
                    }
                }
                "USER" => image.uid = image.uid_of(args),
                "WORKDIR" => {
                    image.workdir = image.workdir.join(args);
                    // Docker makes a missing WORKDIR owned by root.
                    std::fs::create_dir_all(in_image(image.root.path(), &image.workdir)).unwrap();
                }
                "ENV" => {
                    for pair in shell_words::split(args).expect("ENV words") {
                        let (name, value) = pair.split_once('=').expect("ENV in NAME=VALUE form");
                        image.env.insert(name.to_string(), value.to_string());
                    }
                }
                "EXPOSE" => image
                    .exposed
                    .extend(args.split_whitespace().map(str::to_string)),
                "HEALTHCHECK" => {
                    let command = args
                        .split_once("CMD ")
                        .map(|(_, command)| command)
                        .expect("HEALTHCHECK without CMD");
                    image.healthcheck = json_words(command, "HEALTHCHECK CMD");
                }
                "ENTRYPOINT" => entrypoint = json_words(args, "ENTRYPOINT"),
                "CMD" => image.command = json_words(args, "CMD"),
                other => {
                    panic!("the final stage uses {other}, which this test does not replay yet")
                }
            }
        }
        image.command.splice(0..0, entrypoint);
        image.add_base_files();
        image
    }

    /// From the host, a Debian like the image's base: the shared libraries the binary loads, and the CA
    /// bundle of the `ca-certificates` package (the HTTP client refuses to start without one).
    fn add_base_files(&self) {
        if self.packages.iter().any(|p| p == "ca-certificates") {
            install_ca_bundle(self.root.path());
        }
        add_libraries(self.root.path(), Path::new(&self.command[0]));
    }

    /// Applies a compose service's volumes: bind mounts are copied over the image's files (`binds` maps a
    /// source to the host folder that stands for it); a named volume starts out as the image's folder.
    fn mount(&self, volumes: &[String], binds: &BTreeMap<&str, PathBuf>) {
        for volume in volumes {
            let parts: Vec<&str> = volume.split(':').collect();
            let (source, target) = (parts[0], Path::new(parts[1]));
            let at = in_image(self.root.path(), target);
            if source.starts_with("./") {
                let from = binds
                    .get(source)
                    .cloned()
                    .unwrap_or_else(|| Path::new(REPO).join(source));
                if at.exists() {
                    std::fs::remove_dir_all(&at).unwrap();
                }
                let copied = Command::new("cp")
                    .arg("-a")
                    .arg(&from)
                    .arg(&at)
                    .status()
                    .unwrap();
                assert!(copied.success(), "cannot copy {}", from.display());
            } else if !at.exists() {
                // Docker makes a mount point the image lacks, owned by root.
                std::fs::create_dir_all(&at).unwrap();
            }
        }
    }

    /// A command run inside the image as its user, in its working folder, with `env` as its environment.
    fn command(&self, words: &[String], env: &BTreeMap<String, String>) -> Command {
        let mut command = Command::new("unshare");
        command
            .arg(format!("--root={}", self.root.path().display()))
            .arg(format!("--wd={}", self.workdir.display()))
            .arg(format!("--setuid={}", self.uid))
            .arg(format!("--setgid={}", self.uid))
            .args(words)
            .env_clear()
            .envs(env);
        command
    }
}

/// The compose file's service `name`: its `build`, volumes and environment.
fn compose_service(name: &str) -> Value {
    let text = std::fs::read_to_string(Path::new(REPO).join("docker-compose.yml")).unwrap();
    let compose: Value = serde_saphyr::from_str(&text).expect("docker-compose.yml is YAML");
    compose["services"][name].clone()
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|v| v.as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_image_runs_the_compose_configuration_as_its_service_user() {
    assert_eq!(
        std::fs::metadata("/proc/self").unwrap().uid(),
        0,
        "this test needs root: it chroots and hands the data folder to another user, as the image does"
    );
    let image = Image::build();
    assert_ne!(image.uid, 0, "the image runs its gateway as root");
    let service = compose_service("sealgate");
    assert_eq!(
        service["build"], ".",
        "the compose service does not run this image"
    );

    // The user's first step (deploy/README.md): make the keys that deploy/sealgate.yaml trusts.
    let keys_dir = tempfile::tempdir().unwrap();
    let (public, private) = (
        keys_dir.path().join("keys"),
        keys_dir.path().join("private"),
    );
    let made = Command::new(Path::new(REPO).join("deploy/make-keys.sh"))
        .args([&public, &private])
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "deploy/make-keys.sh failed: {}",
        String::from_utf8_lossy(&made.stderr)
    );
    image.mount(
        &strings(&service["volumes"]),
        &BTreeMap::from([("./deploy/keys", public.clone())]),
    );
    let read = |path: PathBuf| std::fs::read_to_string(path).unwrap();
    let keys = Arc::new(common::Keys {
        operator_private: read(private.join("operators.key")),
        operator_public: read(public.join("operators.pub.pem")),
        agent_private: read(private.join("agents.key")),
        agent_public: read(public.join("agents.pub.pem")),
    });

    // The image's environment, then the service's; only the port changes, so that tests can run side by side.
    let mut env = image.env.clone();
    env.insert("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into());
    env.insert("SEALGATE_LOG__LEVEL".into(), "warn".into());
    if let Some(vars) = service["environment"].as_object() {
        for (name, value) in vars {
            env.insert(name.clone(), value.as_str().unwrap().to_string());
        }
    }
    let listen = env.insert("SEALGATE_LISTEN".into(), "127.0.0.1:0".into());
    let port = listen
        .as_deref()
        .and_then(|l| l.rsplit_once(':'))
        .map(|(_, port)| port.to_string())
        .expect("the image sets no SEALGATE_LISTEN");
    assert!(
        image.exposed.contains(&port),
        "the image listens on {port} but exposes {:?}",
        image.exposed
    );

    let launch = || common::launch_command(image.command(&image.command, &env));
    let common::Launched {
        child,
        base,
        stderr,
    } = launch();
    let mut gateway = common::Gateway {
        child,
        stderr,
        binary: image
            .root
            .path()
            .join(image.command[0].trim_start_matches('/')),
        wrapper: Vec::new(),
        base,
        dir: image.root.path().to_path_buf(),
        config_path: PathBuf::new(),
        keys: keys.clone(),
        client: reqwest::Client::new(),
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();

    // The HEALTHCHECK, run in the container as Docker does, with the test's port for the image's.
    let health_url_of_image = format!("http://127.0.0.1:{port}/");
    let health = |base: &str| {
        let words: Vec<String> = image
            .healthcheck
            .iter()
            .map(|w| w.replace(&health_url_of_image, &format!("{base}/")))
            .collect();
        assert_ne!(
            words, image.healthcheck,
            "the HEALTHCHECK does not ask {health_url_of_image}"
        );
        image.command(&words, &env).output().unwrap()
    };
    let healthy = health(&gateway.base);
    assert!(
        healthy.status.success(),
        "the HEALTHCHECK fails on a ready gateway: {}",
        String::from_utf8_lossy(&healthy.stderr)
    );

    // A session on the compose stack's context, and a call to its `web` upstream: the policy lets echo
    // through (the example tool is not running here, so the answer is 5001) and nothing else.
    let session = "exec-compose-1";
    let key = sealgate::envelope::generate_signing_key().unwrap();
    let (status, body) = runtime.block_on(gateway.register(
        Some(&keys.operator_token("seal.session.create")),
        json!({"session_id": session, "public_key": sealgate::envelope::public_key_b64(&key.verifying_key()),
               "security_context": "web-example", "expires_at": sealgate::clock::now_secs() + 600}),
    ));
    assert_eq!(status, 201, "registration: {body}");
    let token = keys.agent_token_from(&keys.agent_claims(session, "web-example"));
    let (_, body) = runtime.block_on(gateway.call(
        &key,
        &token,
        common::tool_call(1, "web.echo", json!({"message": "hi"})),
    ));
    assert!(
        body["status"] == "success" || common::code(&body) == 5001,
        "web.echo is not let through to the upstream: {body}"
    );
    let (_, body) = runtime.block_on(gateway.call(
        &key,
        &token,
        common::tool_call(2, "web.get-env", json!({})),
    ));
    assert_eq!(common::code(&body), 2006, "{body}");

    // The data folder is the service user's: the store is written there and the session outlives a restart.
    let data = in_image(image.root.path(), Path::new(&env["SEALGATE_DATA_DIR"]));
    let written: Vec<_> = std::fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(
        !written.is_empty(),
        "nothing was written to {}",
        data.display()
    );
    for path in &written {
        assert_eq!(
            std::fs::metadata(path).unwrap().uid(),
            SERVICE_UID,
            "{}",
            path.display()
        );
    }
    gateway.kill();
    let dead = health(&gateway.base);
    assert!(
        !dead.status.success(),
        "the HEALTHCHECK passes with the gateway stopped"
    );
    let relaunched = launch();
    (gateway.child, gateway.base) = (relaunched.child, relaunched.base);
    let (status, body) = runtime.block_on(gateway.admin(
        reqwest::Method::GET,
        &format!("/v1/seal/sessions/{session}"),
        None,
    ));
    assert_eq!(status, 200, "the session did not survive a restart: {body}");
}
