//! deploy/kubernetes without a cluster. Each setup is rendered as `kubectl apply -k` renders it (kubectl's
//! own kustomize, which the machine image has), every resource is validated against the Kubernetes schemas
//! (kubernetes-validate from PyPI, pinned by scripts/test.sh; it ships the schemas, so it runs offline), and
//! the manifests are held to the Dockerfile: image, port, probe paths, user.
//!
//! Then each Pod is run as the kubelet would run it. Its volumes are laid out as the kubelet lays them out
//! (ConfigMap and Secret files as links into a timestamped folder; under fsGroup, group-owned and
//! group-readable), its init containers run to completion, and the gateway starts chrooted in that layout as
//! the Pod's user, with the container's environment over the image's, its Secrets made as README.md says.
//! Its probes are asked as the kubelet asks them. The root of the layout belongs to root: as under
//! readOnlyRootFilesystem, the gateway can write to its volumes only.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use common::dockerfile::{
    in_image, install_ca_bundle, install_program, json_words, load_stages, parse_copy,
};
use common::{until, Gateway, Keys};
use serde_json::{json, Value};

const REPO: &str = env!("CARGO_MANIFEST_DIR");

/// The oldest Kubernetes whose native sidecars (init containers with `restartPolicy: Always`) are on by
/// default, and the newest that the validator knows.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.29.0", "1.37.0"];

/// Docker's `PATH` for an image that sets none.
const IMAGE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

fn deploy_dir() -> PathBuf {
    Path::new(REPO).join("deploy/kubernetes")
}

// ---------------------------------------------------------------------------------------------------------
// Rendering and schemas

/// A setup as applied: its rendered text and its resources.
struct Rendered {
    text: String,
    docs: Vec<Value>,
}

impl Rendered {
    /// `kubectl kustomize DIR`, as `kubectl apply -k DIR` renders it.
    fn kustomize(dir: &Path) -> Rendered {
        let out = Command::new("kubectl")
            .arg("kustomize")
            .arg(dir)
            .output()
            .expect("kubectl (the machine image has it; its kustomize renders the setups)");
        assert!(
            out.status.success(),
            "kubectl kustomize {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("kustomize's output");
        Rendered { text, docs }
    }

    fn setup(name: &str) -> Rendered {
        Rendered::kustomize(&deploy_dir().join(name))
    }

    /// The replicated setup with the TLS component, through an overlay of the user's own, as README.md
    /// writes it (kustomize takes only relative paths).
    fn replicated_with_tls() -> Rendered {
        let overlay = tempfile::tempdir().unwrap();
        let up = "../".repeat(overlay.path().components().count() - 1);
        let deploy = format!(
            "{up}{}",
            deploy_dir().display().to_string().trim_start_matches('/')
        );
        std::fs::write(
            overlay.path().join("kustomization.yaml"),
            format!("resources: [{deploy}/replicated]\ncomponents: [{deploy}/tls]\n"),
        )
        .unwrap();
        Rendered::kustomize(overlay.path())
    }

    fn all() -> Vec<(&'static str, Rendered)> {
        vec![
            ("sidecar", Rendered::setup("sidecar")),
            ("replicated", Rendered::setup("replicated")),
            ("replicated with tls", Rendered::replicated_with_tls()),
        ]
    }

    fn of_kind(&self, kind: &str) -> Vec<&Value> {
        self.docs.iter().filter(|d| d["kind"] == kind).collect()
    }

    fn named(&self, kind: &str, name: &str) -> &Value {
        self.docs
            .iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name} in the rendered setup"))
    }
}

#[test]
fn every_resource_of_every_setup_passes_the_kubernetes_schemas() {
    let validator =
        Path::new(REPO).join("target/venvs/kubernetes-validate/bin/kubernetes-validate");
    for (setup, rendered) in Rendered::all() {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), &rendered.text).unwrap();
        let mut command = Command::new(&validator);
        command.arg("--strict");
        for version in KUBERNETES_VERSIONS {
            command.args(["-k", version]);
        }
        let out = command
            .arg(file.path())
            .output()
            .expect("kubernetes-validate (scripts/test.sh installs it)");
        let report = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{setup}: {report}");
        // A kind without a schema is only warned about, and passes.
        assert!(!report.contains("WARN"), "{setup}: {report}");
        let passed = report.matches(" passed for resource ").count();
        assert_eq!(
            passed,
            rendered.docs.len() * KUBERNETES_VERSIONS.len(),
            "{setup}: not every resource was validated: {report}"
        );
    }
}

// ---------------------------------------------------------------------------------------------------------
// The image, as the Dockerfile makes it

/// What the manifests must agree with in the Dockerfile's final stage.
struct Image {
    /// Where the gateway's binary is (`COPY --from=build … DEST`).
    binary: String,
    /// The service user's fixed uid (`useradd --uid`).
    uid: u32,
    workdir: String,
    env: BTreeMap<String, String>,
    exposed: Vec<u16>,
    healthcheck: Vec<String>,
    entrypoint: Vec<String>,
    cmd: Vec<String>,
}

impl Image {
    fn read() -> Image {
        let stages = load_stages();
        let last = stages.last().expect("a Dockerfile without a stage");
        let mut image = Image {
            binary: String::new(),
            uid: 0,
            workdir: "/".into(),
            env: BTreeMap::new(),
            exposed: Vec::new(),
            healthcheck: Vec::new(),
            entrypoint: Vec::new(),
            cmd: Vec::new(),
        };
        for instruction in &last.instructions {
            let args = instruction.args.as_str();
            match instruction.keyword.as_str() {
                "COPY" => {
                    let copy = parse_copy(args);
                    if copy.from.is_some() && copy.destination.ends_with("/sealgate") {
                        image.binary = copy.destination;
                    }
                }
                "RUN" => {
                    if let Some(uid) = useradd_uid(args) {
                        image.uid = uid;
                    }
                }
                "WORKDIR" => image.workdir = args.to_string(),
                "ENV" => {
                    for pair in shell_words::split(args).unwrap() {
                        let (name, value) = pair.split_once('=').expect("ENV in NAME=VALUE form");
                        image.env.insert(name.to_string(), value.to_string());
                    }
                }
                "EXPOSE" => image
                    .exposed
                    .extend(args.split_whitespace().map(|p| p.parse::<u16>().unwrap())),
                "HEALTHCHECK" => {
                    let (_, command) = args.split_once("CMD ").expect("HEALTHCHECK without CMD");
                    image.healthcheck = json_words(command, "HEALTHCHECK CMD");
                }
                "ENTRYPOINT" => image.entrypoint = json_words(args, "ENTRYPOINT"),
                "CMD" => image.cmd = json_words(args, "CMD"),
                _ => {}
            }
        }
        assert!(
            !image.binary.is_empty(),
            "the final stage copies no sealgate binary"
        );
        assert_ne!(image.uid, 0, "the Dockerfile gives its user no fixed uid");
        image
    }

    /// The path that the HEALTHCHECK asks (`…--url http://127.0.0.1:8089/readyz`).
    fn health_path(&self) -> String {
        let url = self
            .healthcheck
            .iter()
            .find_map(|w| url::Url::parse(w).ok())
            .expect("the HEALTHCHECK names no URL");
        url.path().to_string()
    }
}

/// `--uid N` of a `useradd` in a RUN line.
fn useradd_uid(run: &str) -> Option<u32> {
    run.split("&&").find_map(|part| {
        let words = shell_words::split(part).unwrap();
        if words.first().map(String::as_str) != Some("useradd") {
            return None;
        }
        let at = words.iter().position(|w| w == "--uid")?;
        Some(words[at + 1].parse().unwrap())
    })
}

// ---------------------------------------------------------------------------------------------------------
// The manifests, read as the kubelet reads them

/// What a container runs: `command` replaces the image's ENTRYPOINT (and then its CMD too), `args` its CMD.
fn argv(container: &Value, image: &Image) -> Vec<String> {
    let words = |v: &Value| -> Option<Vec<String>> {
        v.as_array()
            .map(|a| a.iter().map(|w| w.as_str().unwrap().to_string()).collect())
    };
    let args = words(&container["args"]);
    match words(&container["command"]) {
        Some(command) => [command, args.unwrap_or_default()].concat(),
        None => [image.entrypoint.clone(), args.unwrap_or(image.cmd.clone())].concat(),
    }
}

fn runs_the_image(container: &Value) -> bool {
    container["image"]
        .as_str()
        .is_some_and(|i| i.split(':').next() == Some("sealgate"))
}

/// The init containers and the containers of a Pod template's spec.
fn containers(spec: &Value) -> Vec<&Value> {
    ["initContainers", "containers"]
        .iter()
        .flat_map(|list| spec[list].as_array().into_iter().flatten())
        .collect()
}

/// The container that serves the gateway.
fn gateway_container<'a>(spec: &'a Value, image: &Image) -> &'a Value {
    let found: Vec<&Value> = containers(spec)
        .into_iter()
        .filter(|c| runs_the_image(c) && argv(c, image).iter().any(|w| w == "serve"))
        .collect();
    assert_eq!(found.len(), 1, "one container runs `sealgate serve`");
    found[0]
}

/// A container's only port.
fn container_port(container: &Value) -> (Option<&str>, u16) {
    let ports = container["ports"]
        .as_array()
        .expect("the gateway names its port");
    assert_eq!(ports.len(), 1, "{ports:?}");
    let number = ports[0]["containerPort"].as_u64().unwrap() as u16;
    (ports[0]["name"].as_str(), number)
}

/// A probe's or Service's port, by name or number, as the container's port number.
fn resolve_port(container: &Value, port: &Value) -> u16 {
    let (name, number) = container_port(container);
    match port {
        Value::String(named) => {
            assert_eq!(
                Some(named.as_str()),
                name,
                "port {named} is not the container's"
            );
            number
        }
        other => other.as_u64().expect("a port") as u16,
    }
}

/// A key of the container's securityContext, else of the Pod's.
fn security<'a>(spec: &'a Value, container: &'a Value, key: &str) -> &'a Value {
    match &container["securityContext"][key] {
        Value::Null => &spec["securityContext"][key],
        set => set,
    }
}

/// Every Deployment's Pod template, with the Deployment's name.
fn pod_templates(rendered: &Rendered) -> Vec<(&str, &Value)> {
    rendered
        .of_kind("Deployment")
        .into_iter()
        .map(|d| {
            (
                d["metadata"]["name"].as_str().unwrap(),
                &d["spec"]["template"],
            )
        })
        .collect()
}

#[test]
fn the_manifests_agree_with_the_image() {
    let image = Image::read();
    let tag = format!("sealgate:{}", env!("CARGO_PKG_VERSION"));
    for (setup, rendered) in Rendered::all() {
        for (name, template) in pod_templates(&rendered) {
            let spec = &template["spec"];
            let what = format!("{setup}: {name}");
            for container in containers(spec).into_iter().filter(|c| runs_the_image(c)) {
                let what = format!("{what}: container {}", container["name"]);
                // The image's name, tagged with the crate's version (never `latest`).
                assert_eq!(container["image"], tag.as_str(), "{what}");
                assert_hardened(spec, container, &image, &what);
            }

            let gateway = gateway_container(spec, &image);
            let (_, port) = container_port(gateway);
            assert_eq!(
                image.exposed,
                [port],
                "{what}: the image exposes another port"
            );
            let probe = |kind: &str| -> (&str, u16) {
                let get = &gateway[kind]["httpGet"];
                (
                    get["path"]
                        .as_str()
                        .unwrap_or_else(|| panic!("{what}: no {kind}")),
                    resolve_port(gateway, &get["port"]),
                )
            };
            assert_eq!(probe("livenessProbe"), ("/healthz", port), "{what}");
            assert_eq!(probe("readinessProbe"), ("/readyz", port), "{what}");
            assert_eq!(
                image.health_path(),
                "/readyz",
                "the image's HEALTHCHECK and the readiness probe ask different paths"
            );
            if !gateway["startupProbe"].is_null() {
                assert_eq!(probe("startupProbe"), ("/readyz", port), "{what}");
            }
            assert_selected_by_service_and_budget(&rendered, template, gateway, &what);
        }
    }
}

/// The container runs as the image's non-root user, with nothing it does not need.
fn assert_hardened(spec: &Value, container: &Value, image: &Image, what: &str) {
    assert_eq!(security(spec, container, "runAsNonRoot"), true, "{what}");
    assert_eq!(
        security(spec, container, "runAsUser"),
        image.uid,
        "{what}: not the image's user"
    );
    assert_eq!(
        security(spec, container, "runAsGroup"),
        image.uid,
        "{what}: not the image's group"
    );
    assert_eq!(
        security(spec, container, "seccompProfile")["type"],
        "RuntimeDefault",
        "{what}"
    );
    let own = &container["securityContext"];
    assert_eq!(own["allowPrivilegeEscalation"], false, "{what}");
    assert_eq!(own["readOnlyRootFilesystem"], true, "{what}");
    assert_eq!(own["capabilities"]["drop"], json!(["ALL"]), "{what}");
    for bound in ["requests", "limits"] {
        for resource in ["cpu", "memory"] {
            assert!(
                container["resources"][bound][resource].is_string(),
                "{what}: no {bound}.{resource}"
            );
        }
    }
}

/// A Service and a PodDisruptionBudget, when the setup has them, select these Pods; the Service sends to
/// the gateway's port.
fn assert_selected_by_service_and_budget(
    rendered: &Rendered,
    template: &Value,
    gateway: &Value,
    what: &str,
) {
    let labels = template["metadata"]["labels"].as_object().unwrap();
    let selects = |selector: &Value| {
        let selector = selector.as_object().expect("a selector");
        !selector.is_empty() && selector.iter().all(|(k, v)| labels.get(k) == Some(v))
    };
    for service in rendered.of_kind("Service") {
        assert!(selects(&service["spec"]["selector"]), "{what}: {service}");
        for port in service["spec"]["ports"].as_array().unwrap() {
            assert_eq!(
                resolve_port(gateway, &port["targetPort"]),
                container_port(gateway).1,
                "{what}"
            );
        }
    }
    for budget in rendered.of_kind("PodDisruptionBudget") {
        assert!(
            selects(&budget["spec"]["selector"]["matchLabels"]),
            "{what}: {budget}"
        );
    }
}

// ---------------------------------------------------------------------------------------------------------
// The Secrets, made as README.md tells users to make them

/// Secret name → key → content.
struct Secrets {
    data: BTreeMap<String, BTreeMap<String, Vec<u8>>>,
    keys: Arc<Keys>,
    /// The CA of the certificate in `sealgate-tls`.
    tls_ca: String,
    dir: tempfile::TempDir,
}

impl Secrets {
    /// The keys with `sealgate keygen`, as README.md says; `store_url` for `sealgate-store`.
    fn make(store_url: Option<&str>) -> Secrets {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().to_str().unwrap();
        for name in ["agents", "operators", "signing"] {
            let (code, output) = common::run_cli(&["keygen", "--out", out, "--name", name]);
            assert_eq!(code, 0, "{output}");
        }
        let read = |file: &str| std::fs::read(dir.path().join(file)).unwrap();
        let text = |file: &str| String::from_utf8(read(file)).unwrap();
        let keys = Arc::new(Keys {
            operator_private: text("operators.key"),
            operator_public: text("operators.pub.pem"),
            agent_private: text("agents.key"),
            agent_public: text("agents.pub.pem"),
        });
        let tls = sealgate::tls::made::for_loopback().unwrap();
        let secret = |entries: &[(&str, Vec<u8>)]| -> BTreeMap<String, Vec<u8>> {
            entries
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect()
        };
        let mut data = BTreeMap::from([
            (
                "sealgate-token-keys".to_string(),
                secret(&[
                    ("agents.pub.pem", read("agents.pub.pem")),
                    ("operators.pub.pem", read("operators.pub.pem")),
                ]),
            ),
            (
                "sealgate-signing-key".to_string(),
                secret(&[("signing.key", read("signing.key"))]),
            ),
            (
                "sealgate-upstreams".to_string(),
                secret(&[("example-tool-token", b"Bearer example".to_vec())]),
            ),
            (
                "sealgate-tls".to_string(),
                secret(&[
                    ("tls.crt", tls.certificate.into_bytes()),
                    ("tls.key", tls.private_key.into_bytes()),
                ]),
            ),
        ]);
        if let Some(url) = store_url {
            data.insert(
                "sealgate-store".to_string(),
                secret(&[("url", url.as_bytes().to_vec())]),
            );
        }
        Secrets {
            data,
            keys,
            tls_ca: tls.ca,
            dir,
        }
    }

    fn get(&self, name: &str) -> &BTreeMap<String, Vec<u8>> {
        self.data.get(name).unwrap_or_else(|| {
            panic!("the Pod uses the Secret {name}, which README.md does not have users make")
        })
    }

    fn value(&self, name: &str, key: &str) -> String {
        let bytes = self
            .get(name)
            .get(key)
            .unwrap_or_else(|| panic!("the Secret {name} has no key {key}"));
        String::from_utf8(bytes.clone()).unwrap()
    }

    /// The signing key's kid, as `/v1/keys` lists it.
    fn signing_kid(&self) -> String {
        let pem = std::fs::read_to_string(self.dir.path().join("signing.key")).unwrap();
        let key = sealgate::envelope::signing_key_from_text(&pem).unwrap();
        sealgate::evidence::kid_of(&key.verifying_key().to_bytes())
    }
}

/// The Secrets made here are the README's, with its keys; the Pods, run below, use no other (a Pod that
/// did would stop there, naming it).
#[test]
fn the_readme_makes_every_secret_that_the_pods_use() {
    let readme = std::fs::read_to_string(deploy_dir().join("README.md")).unwrap();
    let secrets = Secrets::make(Some("postgres://sealgate@db/sealgate"));
    for (name, keys) in &secrets.data {
        let kind = if name == "sealgate-tls" {
            "tls"
        } else {
            "generic"
        };
        assert!(
            readme.contains(&format!("kubectl create secret {kind} {name}")),
            "README.md does not make the Secret {name}"
        );
        if kind == "generic" {
            for key in keys.keys() {
                assert!(
                    readme.contains(&format!("--from-file={key}="))
                        || readme.contains(&format!("--from-literal={key}=")),
                    "README.md makes the Secret {name} without the key {key}"
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------------------
// A Pod, run as the kubelet runs it

/// A name in the timestamped folder's form that the kubelet writes ConfigMap and Secret volumes into.
const KUBELET_DATA_DIR: &str = "..2026_01_01_00_00_00.000000001";

struct Pod<'a> {
    name: String,
    spec: &'a Value,
    rendered: &'a Rendered,
    secrets: &'a Secrets,
    image: &'a Image,
    root: tempfile::TempDir,
}

/// The gateway container of a Pod, started.
struct Running {
    gateway: Gateway,
    /// The port it listens on in the Pod; in the test it listens on a free one.
    port_in_pod: u16,
}

impl<'a> Pod<'a> {
    fn new(
        name: &str,
        template: &'a Value,
        rendered: &'a Rendered,
        secrets: &'a Secrets,
        image: &'a Image,
    ) -> Pod<'a> {
        assert_eq!(
            std::fs::metadata("/proc/self").unwrap().uid(),
            0,
            "this test needs root: it chroots, and runs the gateway as the Pod's user"
        );
        let root = tempfile::tempdir().unwrap();
        // The container's `/` is world-readable, and only root writes there.
        std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        install_program(
            root.path(),
            Path::new(env!("CARGO_BIN_EXE_sealgate")),
            Path::new(&image.binary),
        );
        install_ca_bundle(root.path());
        std::fs::create_dir_all(in_image(root.path(), Path::new(&image.workdir))).unwrap();
        let pod = Pod {
            name: name.to_string(),
            spec: &template["spec"],
            rendered,
            secrets,
            image,
            root,
        };
        pod.lay_out_volumes();
        pod
    }

    fn fs_group(&self) -> Option<u32> {
        self.spec["securityContext"]["fsGroup"]
            .as_u64()
            .map(|g| g as u32)
    }

    /// Volume name → where it is mounted (the harness has one tree for all containers, so a volume must be
    /// mounted at one path only).
    fn mount_paths(&self) -> BTreeMap<&str, PathBuf> {
        let mut mounts = BTreeMap::new();
        for container in containers(self.spec) {
            for mount in container["volumeMounts"].as_array().into_iter().flatten() {
                assert!(mount["subPath"].is_null(), "subPath is not laid out here");
                let name = mount["name"].as_str().unwrap();
                let at = in_image(
                    self.root.path(),
                    Path::new(mount["mountPath"].as_str().unwrap()),
                );
                let earlier = mounts.insert(name, at.clone());
                assert!(
                    earlier.is_none_or(|p| p == at),
                    "volume {name} is mounted at two paths"
                );
            }
        }
        mounts
    }

    fn lay_out_volumes(&self) {
        let mounts = self.mount_paths();
        for volume in self.spec["volumes"].as_array().unwrap() {
            let name = volume["name"].as_str().unwrap();
            let Some(at) = mounts.get(name) else {
                continue;
            };
            let mode = |source: &Value| source["defaultMode"].as_u64().unwrap_or(0o644) as u32;
            if let Some(config_map) = volume.get("configMap") {
                let data = &self
                    .rendered
                    .named("ConfigMap", config_map["name"].as_str().unwrap())["data"];
                let files = data
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap().as_bytes().to_vec()))
                    .collect();
                self.write_projected(at, &files, mode(config_map));
            } else if let Some(secret) = volume.get("secret") {
                let files = self.secrets.get(secret["secretName"].as_str().unwrap());
                self.write_projected(at, files, mode(secret));
            } else if volume.get("emptyDir").is_some() {
                self.make_empty_dir(at);
            } else {
                panic!("volume {name}: only configMap, secret and emptyDir are laid out here");
            }
        }
    }

    /// As the kubelet writes a ConfigMap or Secret volume: the files in a timestamped folder, `..data` a
    /// link to it, and each file's name a link into `..data`.
    fn write_projected(&self, at: &Path, files: &BTreeMap<String, Vec<u8>>, mode: u32) {
        std::fs::create_dir_all(at).unwrap();
        self.write_data(at, KUBELET_DATA_DIR, files, mode);
        for name in files.keys() {
            std::os::unix::fs::symlink(format!("..data/{name}"), at.join(name)).unwrap();
        }
        std::os::unix::fs::chown(at, Some(0), self.fs_group()).unwrap();
    }

    /// The files in the timestamped folder `stamp`, then `..data` pointed at it by a link renamed over the
    /// old one, as the kubelet's atomic writer updates a volume. They belong to root, and under fsGroup to
    /// its group too, then group-readable whatever their mode.
    fn write_data(&self, at: &Path, stamp: &str, files: &BTreeMap<String, Vec<u8>>, mode: u32) {
        let stamped = at.join(stamp);
        std::fs::create_dir(&stamped).unwrap();
        let fs_group = self.fs_group();
        let mode = if fs_group.is_some() {
            mode | 0o440
        } else {
            mode
        };
        for (name, content) in files {
            let file = stamped.join(name);
            std::fs::write(&file, content).unwrap();
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
            std::os::unix::fs::chown(&file, Some(0), fs_group).unwrap();
        }
        std::os::unix::fs::chown(&stamped, Some(0), fs_group).unwrap();
        let link = at.join("..data_tmp");
        std::os::unix::fs::symlink(stamp, &link).unwrap();
        std::fs::rename(&link, at.join("..data")).unwrap();
    }

    /// The Secret `name` changed in the cluster: the kubelet brings the new files into its volume.
    fn update_secret(&self, name: &str, files: &BTreeMap<String, Vec<u8>>) {
        let volume = self.spec["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["secret"]["secretName"] == name)
            .unwrap_or_else(|| panic!("no volume of the Secret {name}"));
        let at = &self.mount_paths()[volume["name"].as_str().unwrap()];
        let mode = volume["secret"]["defaultMode"].as_u64().unwrap_or(0o644) as u32;
        self.write_data(at, "..2026_01_01_00_01_00.000000001", files, mode);
    }

    /// As the kubelet makes an emptyDir: open to all (mode 0777); under fsGroup, its group's, set-group-id.
    fn make_empty_dir(&self, at: &Path) {
        std::fs::create_dir_all(at).unwrap();
        let mode = match self.fs_group() {
            Some(group) => {
                std::os::unix::fs::chown(at, Some(0), Some(group)).unwrap();
                0o2777
            }
            None => 0o777,
        };
        std::fs::set_permissions(at, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    /// The container's environment: the image's, then the kubelet's, then the container's own.
    fn env(&self, container: &Value) -> BTreeMap<String, String> {
        assert!(container["envFrom"].is_null(), "envFrom is not read here");
        let mut env = self.image.env.clone();
        env.entry("PATH".into()).or_insert(IMAGE_PATH.into());
        env.insert("HOSTNAME".into(), self.name.clone());
        for var in container["env"].as_array().into_iter().flatten() {
            let name = var["name"].as_str().unwrap().to_string();
            let value = match (&var["value"], &var["valueFrom"]) {
                (Value::String(value), _) => value.clone(),
                (_, from) if from["fieldRef"]["fieldPath"] == "metadata.name" => self.name.clone(),
                (_, from) if from["secretKeyRef"].is_object() => {
                    let secret = &from["secretKeyRef"];
                    self.secrets.value(
                        secret["name"].as_str().unwrap(),
                        secret["key"].as_str().unwrap(),
                    )
                }
                (_, from) => panic!("{name}: valueFrom {from} is not read here"),
            };
            env.insert(name, value);
        }
        env
    }

    /// `argv` in the container: chrooted in the Pod's layout, as the Pod's user, with `env` alone.
    fn command(
        &self,
        container: &Value,
        argv: &[String],
        env: &BTreeMap<String, String>,
    ) -> Command {
        let program = &argv[0];
        assert!(
            program.starts_with('/'),
            "{program}: name programs by their path"
        );
        if !in_image(self.root.path(), Path::new(program)).exists() {
            // A program of the image's Debian base: the host's stands in for it.
            install_program(self.root.path(), Path::new(program), Path::new(program));
        }
        let id = |key: &str| {
            security(self.spec, container, key)
                .as_u64()
                .unwrap_or_else(|| panic!("{}: no {key}", container["name"]))
        };
        let (uid, gid) = (id("runAsUser"), id("runAsGroup"));
        // unshare drops the supplementary groups: the run is faithful while fsGroup is the user's group.
        if let Some(group) = self.fs_group() {
            assert_eq!(group as u64, gid, "fsGroup differs from runAsGroup");
        }
        let workdir = container["workingDir"]
            .as_str()
            .unwrap_or(&self.image.workdir);
        let mut command = Command::new("unshare");
        command
            .arg(format!("--root={}", self.root.path().display()))
            .arg(format!("--wd={workdir}"))
            .arg(format!("--setuid={uid}"))
            .arg(format!("--setgid={gid}"))
            .args(argv)
            .env_clear()
            .envs(env);
        command
    }

    /// The init containers that run to completion (not the sidecars), in order.
    fn run_init_containers(&self) {
        for container in self.spec["initContainers"].as_array().into_iter().flatten() {
            if container["restartPolicy"] == "Always" {
                continue;
            }
            let argv = argv(container, self.image);
            let out = self
                .command(container, &argv, &self.env(container))
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "init container {}: {}",
                container["name"],
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    /// The configuration file that the gateway container is given, as it reads it.
    fn config_text(&self, argv: &[String]) -> String {
        let at = argv.iter().position(|w| w == "--config").expect("--config");
        std::fs::read_to_string(in_image(self.root.path(), Path::new(&argv[at + 1]))).unwrap()
    }

    /// `sealgate serve --check` in the container: every key and file of the configuration is sound, and
    /// every SEALGATE_* variable names a key.
    fn check(&self) {
        let gateway = gateway_container(self.spec, self.image);
        let mut argv = argv(gateway, self.image);
        let serve = argv.iter().position(|w| w == "serve").unwrap();
        argv.insert(serve + 1, "--check".into());
        let out = self
            .command(gateway, &argv, &self.env(gateway))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "{}: serve --check: {stderr}",
            self.name
        );
        assert!(
            !stderr.contains("names no configuration key"),
            "{}: {stderr}",
            self.name
        );
    }

    /// Starts the gateway container and waits until its probes pass.
    async fn start(&self) -> Running {
        let gateway = gateway_container(self.spec, self.image);
        let argv = argv(gateway, self.image);
        let mut env = self.env(gateway);
        let (_, port_in_pod) = container_port(gateway);
        let pairs: Vec<(String, String)> = env.clone().into_iter().collect();
        let config =
            sealgate::config::Config::from_yaml(&self.config_text(&argv), Path::new("/"), &pairs)
                .unwrap();
        assert!(
            config.listen.ends_with(&format!(":{port_in_pod}")),
            "{}: the gateway listens on {}, the container's port is {port_in_pod}",
            self.name,
            config.listen
        );
        // Only the port changes, so that tests can run side by side.
        env.insert("SEALGATE_LISTEN".into(), "127.0.0.1:0".into());
        env.insert("SEALGATE_LOG__LEVEL".into(), "warn".into());
        let common::Launched {
            child,
            base,
            stderr,
        } = common::launch_command(self.command(gateway, &argv, &env));
        let mut client = reqwest::Client::builder().timeout(Duration::from_secs(10));
        if base.starts_with("https://") {
            let ca = reqwest::Certificate::from_pem(self.secrets.tls_ca.as_bytes()).unwrap();
            client = client.tls_certs_only([ca]);
        }
        let running = Running {
            gateway: Gateway {
                child,
                stderr,
                binary: in_image(self.root.path(), Path::new(&self.image.binary)),
                wrapper: Vec::new(),
                base,
                dir: self.root.path().to_path_buf(),
                config_path: PathBuf::new(),
                keys: self.secrets.keys.clone(),
                client: client.build().unwrap(),
            },
            port_in_pod,
        };
        for kind in ["startupProbe", "readinessProbe", "livenessProbe"] {
            if !gateway[kind].is_null() {
                let what = format!("{}: {kind}", self.name);
                until(Duration::from_secs(30), &what, || {
                    running.probe(gateway, kind)
                })
                .await;
            }
        }
        running
    }
}

impl Running {
    /// An httpGet probe as the kubelet sends it (over HTTPS without checking the certificate): passes on
    /// 2xx and 3xx.
    async fn probe(&self, container: &Value, kind: &str) -> bool {
        let get = &container[kind]["httpGet"];
        assert_eq!(resolve_port(container, &get["port"]), self.port_in_pod);
        let scheme = get["scheme"]
            .as_str()
            .unwrap_or("HTTP")
            .to_ascii_lowercase();
        let address = self.gateway.base.split_once("://").unwrap().1;
        let url = format!("{scheme}://{address}{}", get["path"].as_str().unwrap());
        let kubelet = reqwest::Client::builder()
            .danger_accept_invalid_certs(true)
            .timeout(Duration::from_secs(1))
            .build()
            .unwrap();
        match kubelet.get(url).send().await {
            Ok(response) => (200..400).contains(&response.status().as_u16()),
            Err(_) => false,
        }
    }

    /// Registers a session on the `example` context of deploy/kubernetes/base.
    async fn register(&self, session: &str) {
        let key = sealgate::envelope::generate_signing_key().unwrap();
        let token = self.gateway.keys.operator_token("seal.session.create");
        let (status, body) = self
            .gateway
            .register(
                Some(&token),
                json!({"session_id": session,
                       "public_key": sealgate::envelope::public_key_b64(&key.verifying_key()),
                       "security_context": "example",
                       "expires_at": sealgate::clock::now_secs() + 600}),
            )
            .await;
        assert_eq!(status, 201, "registration: {body}");
    }

    async fn has_session(&self, session: &str) -> bool {
        let path = format!("/v1/seal/sessions/{session}");
        self.gateway
            .admin(reqwest::Method::GET, &path, None)
            .await
            .0
            == 200
    }

    /// The kids that `/v1/keys` lists.
    async fn kids(&self) -> Vec<String> {
        let (status, set) = self
            .gateway
            .operator(reqwest::Method::GET, "/v1/keys", None, None)
            .await;
        assert_eq!(status, 200, "{set}");
        set["keys"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| k["kid"].as_str().unwrap().to_string())
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------------------
// The setups, run

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sidecar_serves_its_agent_on_localhost_and_keeps_its_store_across_restarts() {
    let image = Image::read();
    let rendered = Rendered::setup("sidecar");
    let secrets = Secrets::make(None);
    let template = &rendered.named("Deployment", "agent-runtime")["spec"]["template"];
    let pod = Pod::new(
        "agent-runtime-7d9f-x2x4q",
        template,
        &rendered,
        &secrets,
        &image,
    );
    pod.run_init_containers();
    pod.check();
    let mut sidecar = pod.start().await;

    // The agent finds the gateway on the Pod's loopback, at the sidecar's port.
    let agent = containers(pod.spec)
        .into_iter()
        .find(|c| !runs_the_image(c))
        .expect("an agent container");
    assert_eq!(
        pod.env(agent)["SEALGATE_GATEWAY"],
        format!("http://127.0.0.1:{}", sidecar.port_in_pod)
    );

    // A container restart keeps the Pod's volumes, so the embedded store and its sessions.
    sidecar.register("exec-sidecar-1").await;
    sidecar.gateway.kill();
    let sidecar = pod.start().await;
    assert!(
        sidecar.has_session("exec-sidecar-1").await,
        "the session did not survive a restart of the gateway's container"
    );
}

/// The Pods of the Deployment `sealgate` in `rendered`, all running on one new database.
async fn run_replicas<'a>(
    rendered: &'a Rendered,
    secrets: &'a Secrets,
    image: &'a Image,
) -> Vec<(Pod<'a>, Running)> {
    let deployment = rendered.named("Deployment", "sealgate");
    let replicas = deployment["spec"]["replicas"].as_u64().unwrap();
    assert!(
        replicas >= 2,
        "the replicated setup runs {replicas} replica(s)"
    );
    let mut running = Vec::new();
    for i in 0..replicas {
        let name = format!("sealgate-5c8d7f9b4-{i}");
        let pod = Pod::new(
            &name,
            &deployment["spec"]["template"],
            rendered,
            secrets,
            image,
        );
        pod.run_init_containers();
        pod.check();
        let gateway = pod.start().await;
        running.push((pod, gateway));
    }
    running
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replicas_share_one_database_and_one_signing_key_and_name_themselves_by_pod() {
    let database = sealgate::store::testing::TestDatabase::create().await;
    let image = Image::read();
    let rendered = Rendered::setup("replicated");
    let secrets = Secrets::make(Some(&database.url));
    let replicas = run_replicas(&rendered, &secrets, &image).await;
    let (first, last) = (&replicas[0], &replicas[replicas.len() - 1]);

    // A session registered on one replica is usable on another: they share the database.
    first.1.register("exec-replicated-1").await;
    assert!(last.1.has_session("exec-replicated-1").await);

    // Every replica signs with the key of the Secret sealgate-signing-key, copied to mode 0600.
    for (pod, gateway) in &replicas {
        assert_eq!(
            gateway.kids().await,
            [secrets.signing_kid()],
            "{}",
            pod.name
        );
    }

    // Each audit event names the Pod that wrote it (downward API → SEALGATE_REPLICA_ID).
    let events = last.1.gateway.audit_events("type=SessionCreated").await;
    let replica: Vec<&Value> = events.iter().map(|e| &e["replica"]).collect();
    assert_eq!(replica, [first.0.name.as_str()], "{events:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tls_component_serves_https_to_clients_and_probes() {
    let database = sealgate::store::testing::TestDatabase::create().await;
    let image = Image::read();
    let rendered = Rendered::replicated_with_tls();
    let secrets = Secrets::make(Some(&database.url));
    let replicas = run_replicas(&rendered, &secrets, &image).await;
    let (pod, replica) = &replicas[0];
    assert!(
        replica.gateway.base.starts_with("https://"),
        "{}: {}",
        pod.name,
        replica.gateway.base
    );
    // A client that trusts the certificate's CA registers a session; plain HTTP gets no answer.
    replica.register("exec-tls-1").await;
    let plain = replica.gateway.base.replacen("https://", "http://", 1);
    let answered = reqwest::get(format!("{plain}/healthz")).await;
    assert!(
        answered.is_err(),
        "the listener answered plain HTTP: {answered:?}"
    );

    // The certificate is renewed (by cert-manager, say): the kubelet swaps the Secret's files under the
    // running gateway, which serves the new certificate to new connections without a restart.
    let renewed = sealgate::tls::made::for_loopback().unwrap();
    let trusts_renewed = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(renewed.ca.as_bytes()).unwrap()])
        .build()
        .unwrap();
    let url = format!("{}/healthz", replica.gateway.base);
    assert!(trusts_renewed.get(&url).send().await.is_err());
    pod.update_secret(
        "sealgate-tls",
        &BTreeMap::from([
            ("tls.crt".to_string(), renewed.certificate.into_bytes()),
            ("tls.key".to_string(), renewed.private_key.into_bytes()),
        ]),
    );
    until(
        Duration::from_secs(30),
        "the renewed certificate",
        || async { trusts_renewed.get(&url).send().await.is_ok() },
    )
    .await;
}
