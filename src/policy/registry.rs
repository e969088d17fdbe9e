//! The live set of security contexts: from policy files (hot-reloaded) and from the store (managed
//! through the API).
//!
//! Readers take one `Arc<SecurityContext>` from an atomically swapped snapshot without locking, so
//! a decision always sees one consistent version and a reload never blocks calls in flight. Writers
//! (reloads, API changes) serialise on a mutex and publish a new snapshot.
//!
//! Reload rules, per file: a valid new or changed file replaces that file's context; a deleted file
//! removes it; an invalid file keeps its last good version in force (a new invalid file does not
//! load) and is reported once. A context name defined by a file hides a store context of that name.
//!
//! Shadow versions (SPEC 6.4 r4) live beside the contexts under the same rules: `NAME.shadow.yaml`
//! files and shadows kept in the store, a file's hiding the store's. A shadow decides nothing; the
//! pipeline asks it too and compares.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use notify::{RecursiveMode, Watcher};

use super::load::{
    digest, duplicate_name_error, load_dir_files, parse_policy_file, policy_files,
    read_policy_file, shadow_name, PolicyError,
};
use super::model::{ContextSource, SecurityContext};

/// Quiet time after the last file-system event before the folder is read again.
pub const DEBOUNCE: Duration = Duration::from_millis(200);
/// Longest wait for quiet, so a stream of writes still applies well within 2 seconds.
pub const MAX_DEBOUNCE: Duration = Duration::from_millis(800);
/// The folder is also compared every so often, in case the watcher misses an event.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// The contexts in force at one moment, and their shadow versions.
#[derive(Default)]
pub struct Snapshot {
    contexts: BTreeMap<String, Arc<SecurityContext>>,
    shadows: BTreeMap<String, Arc<SecurityContext>>,
}

impl Snapshot {
    pub fn get(&self, name: &str) -> Option<&Arc<SecurityContext>> {
        self.contexts.get(name)
    }

    /// The shadow version of the context `name`, when one is set.
    pub fn shadow(&self, name: &str) -> Option<&Arc<SecurityContext>> {
        self.shadows.get(name)
    }

    /// All contexts, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<SecurityContext>> {
        self.contexts.values()
    }

    pub fn len(&self) -> usize {
        self.contexts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.contexts.is_empty()
    }
}

/// What a reload did, for audit (`SecurityContextChanged` / `SecurityContextRejected`) and logs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReloadEvent {
    /// A context was added or replaced.
    Changed {
        name: String,
        version: String,
        source: ContextSource,
        /// The team it belongs to now (SPEC 16): its event is that team's.
        team: String,
    },
    /// A context is gone; `team` is the one it belonged to.
    Removed { name: String, team: String },
    /// A shadow version was set or replaced (SPEC 6.4 r4).
    ShadowChanged {
        name: String,
        version: String,
        source: ContextSource,
        team: String,
    },
    /// A shadow version is gone.
    ShadowRemoved { name: String, team: String },
    /// A file (or the folder) could not be loaded; what was in force stays.
    Rejected { file: PathBuf, error: PolicyError },
}

/// Refusals of the store operations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegistryError {
    /// The name belongs to a policy file, which the API cannot change (409).
    Conflict(String),
    /// No store context has that name (404).
    NotFound(String),
}

impl std::fmt::Display for RegistryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegistryError::Conflict(name) => write!(
                f,
                "security context {name:?} comes from a policy file and is read-only"
            ),
            RegistryError::NotFound(name) => write!(f, "no stored security context {name:?}"),
        }
    }
}

impl std::error::Error for RegistryError {}

/// What the registry remembers about one policy file between reloads.
struct FileState {
    /// SHA-256 of the bytes last read; `None` when the file could not be read.
    digest: Option<String>,
    /// The version this file wants in force: its latest valid content, or its last good version.
    candidate: Option<Arc<SecurityContext>>,
    /// The version actually in force (a candidate can lose its name to another file).
    in_force: Option<Arc<SecurityContext>>,
    /// The last error reported for this file, so an unchanged problem is reported once.
    reported: Option<PolicyError>,
}

/// The contexts, or the shadows, from both sources.
#[derive(Default)]
struct Versions {
    files: BTreeMap<PathBuf, FileState>,
    store: BTreeMap<String, Arc<SecurityContext>>,
}

impl Versions {
    fn file_owns(&self, name: &str) -> bool {
        self.files
            .values()
            .filter_map(|file| file.in_force.as_ref())
            .any(|context| context.name() == name)
    }

    fn in_force(&self) -> BTreeMap<String, Arc<SecurityContext>> {
        let mut in_force = self.store.clone();
        // Files win over the store.
        for context in self
            .files
            .values()
            .filter_map(|file| file.in_force.as_ref())
        {
            in_force.insert(context.name().to_owned(), Arc::clone(context));
        }
        in_force
    }

    fn put_store(
        &mut self,
        context: SecurityContext,
    ) -> Result<Option<Arc<SecurityContext>>, RegistryError> {
        let name = context.name().to_owned();
        if self.file_owns(&name) {
            return Err(RegistryError::Conflict(name));
        }
        let context = SecurityContext {
            source: ContextSource::Store,
            ..context
        };
        Ok(self.store.insert(name, Arc::new(context)))
    }

    fn remove_store(&mut self, name: &str) -> Result<Arc<SecurityContext>, RegistryError> {
        if self.file_owns(name) {
            return Err(RegistryError::Conflict(name.to_owned()));
        }
        self.store
            .remove(name)
            .ok_or_else(|| RegistryError::NotFound(name.to_owned()))
    }
}

#[derive(Default)]
struct State {
    live: Versions,
    shadows: Versions,
    folder_error: Option<PolicyError>,
}

impl State {
    fn snapshot(&self) -> Snapshot {
        Snapshot {
            contexts: self.live.in_force(),
            shadows: self.shadows.in_force(),
        }
    }
}

/// The live set of contexts.
#[derive(Default)]
pub struct ContextRegistry {
    snapshot: ArcSwap<Snapshot>,
    state: Mutex<State>,
    /// One turn for each change kept in the store (an API write, or a replica's poll), held from the
    /// store until the registry has it, so that two changes cannot apply in the opposite order.
    store_changes: tokio::sync::Mutex<()>,
}

impl ContextRegistry {
    /// An empty registry (no files, no store contexts).
    pub fn new() -> ContextRegistry {
        ContextRegistry::default()
    }

    /// The turn a change kept in the store takes, from its store write until the registry has it.
    pub async fn store_change_turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.store_changes.lock().await
    }

    /// Loads the policy folder strictly, as at start-up: any invalid file or duplicate name is an
    /// error that names the file and line.
    pub fn load(dir: &Path) -> Result<ContextRegistry, PolicyError> {
        let mut state = State::default();
        let loaded = load_dir_files(dir)?;
        for (versions, files) in [
            (&mut state.live, loaded.live),
            (&mut state.shadows, loaded.shadows),
        ] {
            for file in files {
                let context = Arc::new(file.context);
                versions.files.insert(
                    file.path,
                    FileState {
                        digest: Some(file.digest),
                        candidate: Some(Arc::clone(&context)),
                        in_force: Some(context),
                        reported: None,
                    },
                );
            }
        }
        let registry = ContextRegistry {
            snapshot: ArcSwap::from_pointee(state.snapshot()),
            state: Mutex::new(state),
            store_changes: tokio::sync::Mutex::default(),
        };
        Ok(registry)
    }

    /// The context named `name` as it is now; the caller keeps this one version for its decision.
    pub fn get(&self, name: &str) -> Option<Arc<SecurityContext>> {
        self.snapshot.load().get(name).cloned()
    }

    /// The context `name` and its shadow version, from one snapshot (SPEC 6.4 r4).
    pub fn get_with_shadow(
        &self,
        name: &str,
    ) -> (Option<Arc<SecurityContext>>, Option<Arc<SecurityContext>>) {
        let snapshot = self.snapshot.load();
        (snapshot.get(name).cloned(), snapshot.shadow(name).cloned())
    }

    /// The shadow version of `name` as it is now.
    pub fn shadow(&self, name: &str) -> Option<Arc<SecurityContext>> {
        self.snapshot.load().shadow(name).cloned()
    }

    /// The whole set as it is now.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.snapshot.load_full()
    }

    /// All contexts in force, by name.
    pub fn list(&self) -> Vec<Arc<SecurityContext>> {
        self.snapshot.load().iter().cloned().collect()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is replaced field by field only after all fallible work, so it stays usable
        // even if a holder panicked.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Adds or replaces a store context (API PUT, or start-up from the store). Returns the store
    /// version it replaced. A name that a policy file defines is refused.
    pub fn put_store_context(
        &self,
        context: SecurityContext,
    ) -> Result<Option<Arc<SecurityContext>>, RegistryError> {
        self.change(|state| state.live.put_store(context))
    }

    /// Removes a store context (API DELETE). A file context is refused; an unknown name is NotFound.
    pub fn remove_store_context(&self, name: &str) -> Result<Arc<SecurityContext>, RegistryError> {
        self.change(|state| state.live.remove_store(name))
    }

    /// Sets or replaces a shadow version kept in the store; a shadow file of that name is refused.
    pub fn put_store_shadow(
        &self,
        shadow: SecurityContext,
    ) -> Result<Option<Arc<SecurityContext>>, RegistryError> {
        self.change(|state| state.shadows.put_store(shadow))
    }

    /// Removes a shadow version kept in the store.
    pub fn remove_store_shadow(&self, name: &str) -> Result<Arc<SecurityContext>, RegistryError> {
        self.change(|state| state.shadows.remove_store(name))
    }

    /// Applies one store change and publishes the new snapshot when it succeeded.
    fn change<T>(
        &self,
        apply: impl FnOnce(&mut State) -> Result<T, RegistryError>,
    ) -> Result<T, RegistryError> {
        let mut state = self.lock();
        let done = apply(&mut state)?;
        self.snapshot.store(Arc::new(state.snapshot()));
        Ok(done)
    }

    /// Reads `dir` again and applies what changed, per file. Returns what happened.
    pub fn reload_now(&self, dir: &Path) -> Vec<ReloadEvent> {
        let mut state = self.lock();
        let mut events = Vec::new();

        let listing = match policy_files(dir) {
            Ok(listing) => {
                state.folder_error = None;
                listing
            }
            Err(error) => {
                // An unreadable folder keeps everything in force: it is more likely a transient
                // problem than a decision to drop every context.
                if state.folder_error.as_ref() != Some(&error) {
                    state.folder_error = Some(error.clone());
                    events.push(ReloadEvent::Rejected {
                        file: dir.to_path_buf(),
                        error,
                    });
                }
                return events;
            }
        };

        let (shadow_listing, live_listing): (Vec<PathBuf>, Vec<PathBuf>) = listing
            .into_iter()
            .partition(|path| shadow_name(path).is_some());
        reload_files(&mut state.live.files, live_listing, &mut events);
        reload_files(&mut state.shadows.files, shadow_listing, &mut events);
        let old = self.snapshot.load_full();
        let new = state.snapshot();
        events.extend(diff(&old.contexts, &new.contexts, Kind::Live));
        events.extend(diff(&old.shadows, &new.shadows, Kind::Shadow));
        self.snapshot.store(Arc::new(new));
        events
    }

    /// Watches `dir` and applies changes within about a second (debounced file-system events, plus
    /// a poll every second in case an event is missed). Events go to `on_event` on the watcher's
    /// own thread. The watch stops when the handle is dropped.
    pub fn spawn_watcher(
        self: Arc<Self>,
        dir: PathBuf,
        on_event: impl Fn(ReloadEvent) + Send + Sync + 'static,
    ) -> Result<WatcherHandle, String> {
        let (sender, receiver) = mpsc::channel::<WatchMessage>();
        let fs_sender = sender.clone();
        let mut watcher =
            notify::recommended_watcher(move |_event: notify::Result<notify::Event>| {
                // Every event (errors included) just triggers a re-read of the folder.
                let _ = fs_sender.send(WatchMessage::FileSystem);
            })
            .map_err(|error| format!("cannot watch {}: {error}", dir.display()))?;
        watcher
            .watch(&dir, RecursiveMode::NonRecursive)
            .map_err(|error| format!("cannot watch {}: {error}", dir.display()))?;

        let stopped = Arc::new(AtomicBool::new(false));
        let thread_stopped = Arc::clone(&stopped);
        let registry = self;
        let thread = std::thread::Builder::new()
            .name("policy-watcher".into())
            .spawn(move || {
                // Catch changes made between the start-up load and the start of the watch.
                for event in registry.reload_now(&dir) {
                    on_event(event);
                }
                while wait_for_change(&receiver) {
                    if thread_stopped.load(Ordering::SeqCst) {
                        break;
                    }
                    for event in registry.reload_now(&dir) {
                        on_event(event);
                    }
                }
            })
            .map_err(|error| format!("cannot start the policy watcher: {error}"))?;

        Ok(WatcherHandle {
            watcher: Some(watcher),
            sender,
            stopped,
            thread: Some(thread),
        })
    }
}

/// Reads `listing` again into `files` (the contexts' or the shadows'), applying what changed per file.
/// Names go first to files whose version stays in force, then to the others in file order.
fn reload_files(
    files: &mut BTreeMap<PathBuf, FileState>,
    listing: Vec<PathBuf>,
    events: &mut Vec<ReloadEvent>,
) {
    let mut pending: BTreeMap<PathBuf, Pending> = BTreeMap::new();
    for path in listing {
        let previous = files.remove(&path);
        let entry = read_one(&path, previous, events);
        pending.insert(path, entry);
    }
    let mut owners: BTreeMap<String, PathBuf> = BTreeMap::new();
    for (path, entry) in pending.iter_mut() {
        if let (Some(candidate), Some(in_force)) = (&entry.state.candidate, &entry.state.in_force) {
            if Arc::ptr_eq(candidate, in_force) && !owners.contains_key(candidate.name()) {
                owners.insert(candidate.name().to_owned(), path.clone());
                entry.assigned = true;
            }
        }
    }
    for (path, entry) in pending.iter_mut() {
        if !entry.assigned {
            assign(path, entry, &mut owners, events);
        }
    }
    *files = pending
        .into_iter()
        .map(|(path, entry)| (path, entry.state))
        .collect();
}

/// Gives a changed file its name, or refuses it when another file holds the name; the file's previous
/// version then stays if its name is still free.
fn assign(
    path: &Path,
    entry: &mut Pending,
    owners: &mut BTreeMap<String, PathBuf>,
    events: &mut Vec<ReloadEvent>,
) {
    let previous = entry.state.in_force.take();
    let Some(candidate) = entry.state.candidate.clone() else {
        return;
    };
    let Some(owner) = owners.get(candidate.name()) else {
        owners.insert(candidate.name().to_owned(), path.to_path_buf());
        entry.state.in_force = Some(candidate);
        return;
    };
    if let Some(text) = &entry.text {
        let error = duplicate_name_error(text, path, candidate.name(), owner);
        entry.state.reported = Some(error.clone());
        events.push(ReloadEvent::Rejected {
            file: path.to_path_buf(),
            error,
        });
    }
    if let Some(previous) = previous {
        if !owners.contains_key(previous.name()) {
            owners.insert(previous.name().to_owned(), path.to_path_buf());
            entry.state.in_force = Some(previous);
        }
    }
}

/// A file read during a reload, before names are assigned.
struct Pending {
    state: FileState,
    /// The new text, when the file changed and parsed (for the duplicate-name message).
    text: Option<String>,
    assigned: bool,
}

fn read_one(path: &Path, previous: Option<FileState>, events: &mut Vec<ReloadEvent>) -> Pending {
    let last_good = previous.as_ref().and_then(|file| file.in_force.clone());
    let text = match read_policy_file(path) {
        Ok(text) => text,
        Err(error) => {
            let reported = previous.as_ref().and_then(|file| file.reported.as_ref());
            if reported != Some(&error) {
                events.push(ReloadEvent::Rejected {
                    file: path.to_path_buf(),
                    error: error.clone(),
                });
            }
            return Pending {
                state: FileState {
                    digest: None,
                    candidate: last_good.clone(),
                    in_force: last_good,
                    reported: Some(error),
                },
                text: None,
                assigned: false,
            };
        }
    };
    let new_digest = digest(&text);
    if let Some(previous) = previous {
        if previous.digest.as_deref() == Some(new_digest.as_str()) {
            return Pending {
                state: previous,
                text: None,
                assigned: false,
            };
        }
    }
    match parse_policy_file(&text, path) {
        Ok(context) => Pending {
            state: FileState {
                digest: Some(new_digest),
                candidate: Some(Arc::new(context)),
                in_force: last_good,
                reported: None,
            },
            text: Some(text),
            assigned: false,
        },
        Err(error) => {
            events.push(ReloadEvent::Rejected {
                file: path.to_path_buf(),
                error: error.clone(),
            });
            Pending {
                state: FileState {
                    digest: Some(new_digest),
                    candidate: last_good.clone(),
                    in_force: last_good,
                    reported: Some(error),
                },
                text: None,
                assigned: false,
            }
        }
    }
}

/// Whether a diff is of the contexts in force or of their shadows.
#[derive(Clone, Copy)]
enum Kind {
    Live,
    Shadow,
}

fn diff(
    old: &BTreeMap<String, Arc<SecurityContext>>,
    new: &BTreeMap<String, Arc<SecurityContext>>,
    kind: Kind,
) -> Vec<ReloadEvent> {
    let mut events = Vec::new();
    for (name, context) in new {
        let same = old.get(name).is_some_and(|before| {
            before.version == context.version && before.source == context.source
        });
        if !same {
            let (name, version, source, team) = (
                name.clone(),
                context.version.clone(),
                context.source.clone(),
                context.team().to_owned(),
            );
            events.push(match kind {
                Kind::Live => ReloadEvent::Changed {
                    name,
                    version,
                    source,
                    team,
                },
                Kind::Shadow => ReloadEvent::ShadowChanged {
                    name,
                    version,
                    source,
                    team,
                },
            });
        }
    }
    for (name, context) in old {
        if !new.contains_key(name) {
            let (name, team) = (name.clone(), context.team().to_owned());
            events.push(match kind {
                Kind::Live => ReloadEvent::Removed { name, team },
                Kind::Shadow => ReloadEvent::ShadowRemoved { name, team },
            });
        }
    }
    events
}

enum WatchMessage {
    FileSystem,
    Stop,
}

/// Blocks until the folder should be read again: after a burst of events has been quiet for
/// `DEBOUNCE` (at most `MAX_DEBOUNCE`), or after `POLL_INTERVAL` without events. False when the
/// watch is over.
fn wait_for_change(receiver: &mpsc::Receiver<WatchMessage>) -> bool {
    match receiver.recv_timeout(POLL_INTERVAL) {
        Ok(WatchMessage::FileSystem) => {}
        Ok(WatchMessage::Stop) | Err(RecvTimeoutError::Disconnected) => return false,
        Err(RecvTimeoutError::Timeout) => return true,
    }
    let burst_start = Instant::now();
    while burst_start.elapsed() < MAX_DEBOUNCE {
        match receiver.recv_timeout(DEBOUNCE) {
            Ok(WatchMessage::FileSystem) => continue,
            Ok(WatchMessage::Stop) | Err(RecvTimeoutError::Disconnected) => return false,
            Err(RecvTimeoutError::Timeout) => break,
        }
    }
    true
}

/// Keeps the policy watcher running; dropping it stops the watch and joins its thread.
pub struct WatcherHandle {
    watcher: Option<notify::RecommendedWatcher>,
    sender: mpsc::Sender<WatchMessage>,
    stopped: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for WatcherHandle {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::SeqCst);
        let _ = self.sender.send(WatchMessage::Stop);
        drop(self.watcher.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::load::parse_context_json;

    use crate::policy::test_support::{temp_dir, write};

    fn load(dir: &Path) -> ContextRegistry {
        match ContextRegistry::load(dir) {
            Ok(registry) => registry,
            Err(error) => panic!("{error}"),
        }
    }

    fn allowlist(registry: &ContextRegistry, name: &str) -> Option<Vec<String>> {
        registry
            .get(name)
            .and_then(|context| context.spec.capabilities.first().cloned())
            .and_then(|capability| capability.path_allowlist)
    }

    fn context_yaml(name: &str, path: &str) -> String {
        format!("name: {name}\ncapabilities:\n  - tool_pattern: \"fs.*\"\n    path_allowlist: [\"{path}\"]\n")
    }

    fn store_context(name: &str) -> SecurityContext {
        match parse_context_json(&serde_json::json!({"name": name, "capabilities": []})) {
            Ok(context) => context,
            Err(error) => panic!("{error}"),
        }
    }

    fn rejected_files(events: &[ReloadEvent]) -> Vec<PathBuf> {
        events
            .iter()
            .filter_map(|event| match event {
                ReloadEvent::Rejected { file, .. } => Some(file.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn reload_applies_changes_per_file() {
        let dir = temp_dir();
        write(dir.path(), "a.yaml", &context_yaml("a", "/workspace"));
        write(dir.path(), "b.yaml", &context_yaml("b", "/b"));
        let registry = load(dir.path());
        assert!(
            registry.reload_now(dir.path()).is_empty(),
            "nothing changed"
        );

        // Tighten a.
        write(dir.path(), "a.yaml", &context_yaml("a", "/workspace/src"));
        let events = registry.reload_now(dir.path());
        assert!(matches!(events.as_slice(), [ReloadEvent::Changed { name, .. }] if name == "a"));
        assert_eq!(
            allowlist(&registry, "a"),
            Some(vec!["/workspace/src".to_owned()])
        );

        // Break a: the last good version stays, reported once.
        write(
            dir.path(),
            "a.yaml",
            "name: a\ncapabilities: [{tool_patern: x}]\n",
        );
        let events = registry.reload_now(dir.path());
        assert_eq!(rejected_files(&events), vec![dir.path().join("a.yaml")]);
        assert_eq!(events.len(), 1);
        assert_eq!(
            allowlist(&registry, "a"),
            Some(vec!["/workspace/src".to_owned()])
        );
        assert!(registry.reload_now(dir.path()).is_empty(), "reported once");

        // A new invalid file does not load.
        write(dir.path(), "c.yaml", "name: c\n");
        let events = registry.reload_now(dir.path());
        assert_eq!(rejected_files(&events), vec![dir.path().join("c.yaml")]);
        assert!(registry.get("c").is_none());

        // Delete b.
        if let Err(error) = std::fs::remove_file(dir.path().join("b.yaml")) {
            panic!("{error}");
        }
        let events = registry.reload_now(dir.path());
        assert_eq!(
            events,
            vec![ReloadEvent::Removed {
                name: "b".into(),
                team: "default".into()
            }]
        );
        assert!(registry.get("b").is_none());
        assert!(registry.get("a").is_some());
    }

    #[test]
    fn shadow_files_load_apart_from_the_contexts_and_reload_under_the_same_rules() {
        let dir = temp_dir();
        write(dir.path(), "a.yaml", &context_yaml("a", "/workspace"));
        write(
            dir.path(),
            "a.shadow.yaml",
            &context_yaml("a", "/workspace/src"),
        );
        let registry = load(dir.path());
        assert_eq!(
            allowlist(&registry, "a"),
            Some(vec!["/workspace".to_owned()])
        );
        let shadow_paths = |registry: &ContextRegistry| {
            registry
                .shadow("a")
                .map(|shadow| shadow.spec.capabilities[0].path_allowlist.clone())
        };
        assert_eq!(
            shadow_paths(&registry),
            Some(Some(vec!["/workspace/src".to_owned()]))
        );
        assert_eq!(registry.list().len(), 1, "a shadow is not a context");

        // A shadow named after another context is refused; the last good shadow stays.
        write(dir.path(), "a.shadow.yaml", &context_yaml("b", "/b"));
        let events = registry.reload_now(dir.path());
        assert_eq!(
            rejected_files(&events),
            vec![dir.path().join("a.shadow.yaml")]
        );
        assert!(registry.get("b").is_none());
        assert_eq!(
            shadow_paths(&registry),
            Some(Some(vec!["/workspace/src".to_owned()]))
        );

        write(dir.path(), "a.shadow.yml", &context_yaml("a", "/tmp"));
        std::fs::remove_file(dir.path().join("a.shadow.yaml")).unwrap_or_else(|e| panic!("{e}"));
        let events = registry.reload_now(dir.path());
        assert!(
            matches!(events.as_slice(), [ReloadEvent::ShadowChanged { name, .. }] if name == "a"),
            "{events:?}"
        );
        assert_eq!(shadow_paths(&registry), Some(Some(vec!["/tmp".to_owned()])));
        // The store cannot set a shadow that a file sets.
        assert_eq!(
            registry.put_store_shadow(store_context("a")).err(),
            Some(RegistryError::Conflict("a".into()))
        );
        std::fs::remove_file(dir.path().join("a.shadow.yml")).unwrap_or_else(|e| panic!("{e}"));
        let events = registry.reload_now(dir.path());
        assert_eq!(
            events,
            vec![ReloadEvent::ShadowRemoved {
                name: "a".into(),
                team: "default".into()
            }]
        );
        assert!(registry.shadow("a").is_none());
        assert!(registry.put_store_shadow(store_context("a")).is_ok());
        let (live, shadow) = registry.get_with_shadow("a");
        assert_eq!(
            live.map(|c| c.source.clone()),
            Some(ContextSource::File(dir.path().join("a.yaml")))
        );
        assert_eq!(shadow.map(|c| c.source.clone()), Some(ContextSource::Store));
    }

    #[test]
    fn a_decision_keeps_the_version_it_took() {
        let dir = temp_dir();
        write(dir.path(), "a.yaml", &context_yaml("a", "/one"));
        let registry = load(dir.path());
        let taken = registry.get("a");
        write(dir.path(), "a.yaml", &context_yaml("a", "/two"));
        registry.reload_now(dir.path());
        let first = taken.and_then(|c| c.spec.capabilities[0].path_allowlist.clone());
        assert_eq!(first, Some(vec!["/one".to_owned()]));
        assert_eq!(allowlist(&registry, "a"), Some(vec!["/two".to_owned()]));
    }

    #[test]
    fn duplicate_name_at_reload_keeps_the_incumbent() {
        let dir = temp_dir();
        write(dir.path(), "b.yaml", &context_yaml("x", "/b"));
        let registry = load(dir.path());
        // a.yaml sorts first but arrives later: b.yaml keeps the name.
        write(dir.path(), "a.yaml", &context_yaml("x", "/a"));
        let events = registry.reload_now(dir.path());
        assert_eq!(rejected_files(&events), vec![dir.path().join("a.yaml")]);
        assert_eq!(allowlist(&registry, "x"), Some(vec!["/b".to_owned()]));
        // When b.yaml goes, a.yaml's version comes into force.
        if let Err(error) = std::fs::remove_file(dir.path().join("b.yaml")) {
            panic!("{error}");
        }
        let events = registry.reload_now(dir.path());
        assert!(matches!(events.as_slice(), [ReloadEvent::Changed { name, .. }] if name == "x"));
        assert_eq!(allowlist(&registry, "x"), Some(vec!["/a".to_owned()]));
    }

    #[test]
    fn renaming_into_a_taken_name_keeps_the_old_version() {
        let dir = temp_dir();
        write(dir.path(), "a.yaml", &context_yaml("a", "/a"));
        write(dir.path(), "b.yaml", &context_yaml("b", "/b"));
        let registry = load(dir.path());
        write(dir.path(), "b.yaml", &context_yaml("a", "/evil"));
        let events = registry.reload_now(dir.path());
        assert_eq!(rejected_files(&events), vec![dir.path().join("b.yaml")]);
        assert_eq!(allowlist(&registry, "a"), Some(vec!["/a".to_owned()]));
        assert_eq!(allowlist(&registry, "b"), Some(vec!["/b".to_owned()]));
    }

    #[test]
    fn store_contexts_yield_to_files() {
        let dir = temp_dir();
        write(dir.path(), "a.yaml", &context_yaml("a", "/a"));
        let registry = load(dir.path());
        assert_eq!(
            registry.put_store_context(store_context("a")).err(),
            Some(RegistryError::Conflict("a".into()))
        );
        assert_eq!(
            registry.remove_store_context("a").err(),
            Some(RegistryError::Conflict("a".into()))
        );
        assert_eq!(
            registry.remove_store_context("s").err(),
            Some(RegistryError::NotFound("s".into()))
        );
        assert!(matches!(
            registry.put_store_context(store_context("s")),
            Ok(None)
        ));
        assert!(matches!(
            registry.put_store_context(store_context("s")),
            Ok(Some(_))
        ));
        assert_eq!(
            registry.get("s").map(|c| c.source.clone()),
            Some(ContextSource::Store)
        );
        let names: Vec<String> = registry
            .list()
            .iter()
            .map(|c| c.name().to_owned())
            .collect();
        assert_eq!(names, vec!["a".to_owned(), "s".to_owned()]);
        // A file that later defines the same name hides the store context.
        write(dir.path(), "s.yaml", &context_yaml("s", "/s"));
        registry.reload_now(dir.path());
        assert!(matches!(
            registry.get("s").map(|c| c.source.clone()),
            Some(ContextSource::File(_))
        ));
        assert!(registry.remove_store_context("a").is_err());
    }

    #[test]
    fn unreadable_folder_keeps_everything() {
        let dir = temp_dir();
        write(dir.path(), "a.yaml", &context_yaml("a", "/a"));
        let registry = load(dir.path());
        let missing = dir.path().join("gone");
        let events = registry.reload_now(&missing);
        assert_eq!(rejected_files(&events), vec![missing.clone()]);
        assert!(registry.reload_now(&missing).is_empty(), "reported once");
        assert!(registry.get("a").is_some());
    }

    #[test]
    fn the_watch_loop_polls_without_events_and_stops_on_request() {
        let (sender, receiver) = mpsc::channel();
        // No event at all: the loop still wakes up to compare the folder (poll fallback).
        let start = Instant::now();
        assert!(wait_for_change(&receiver));
        assert!(start.elapsed() >= POLL_INTERVAL);
        // A burst of events is read once, after it has gone quiet.
        for _ in 0..5 {
            let _ = sender.send(WatchMessage::FileSystem);
        }
        let start = Instant::now();
        assert!(wait_for_change(&receiver));
        assert!(start.elapsed() >= DEBOUNCE && start.elapsed() < POLL_INTERVAL);
        let _ = sender.send(WatchMessage::Stop);
        assert!(!wait_for_change(&receiver));
        drop(sender);
        assert!(!wait_for_change(&receiver));
    }

    fn wait_until(deadline: Duration, mut condition: impl FnMut() -> bool) -> bool {
        let start = Instant::now();
        while start.elapsed() < deadline {
            if condition() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        condition()
    }

    #[test]
    fn watcher_tightens_rejects_and_restores_within_two_seconds() {
        let dir = temp_dir();
        write(dir.path(), "a.yaml", &context_yaml("a", "/workspace"));
        let registry = Arc::new(load(dir.path()));
        let events: Arc<Mutex<Vec<ReloadEvent>>> = Arc::default();
        let sink = Arc::clone(&events);
        let handle = Arc::clone(&registry).spawn_watcher(dir.path().to_path_buf(), move |event| {
            sink.lock().unwrap_or_else(|p| p.into_inner()).push(event);
        });
        let handle = match handle {
            Ok(handle) => handle,
            Err(error) => panic!("{error}"),
        };
        let limit = Duration::from_secs(2);

        // Tighten.
        let before = registry.get("a").map(|c| c.version.clone());
        write(dir.path(), "a.yaml", &context_yaml("a", "/workspace/src"));
        assert!(wait_until(limit, || allowlist(&registry, "a")
            == Some(vec!["/workspace/src".to_owned()])));
        let tightened = registry.get("a").map(|c| c.version.clone());
        assert_ne!(before, tightened);

        // Break: the last good version stays, and a Rejected event says why.
        write(
            dir.path(),
            "a.yaml",
            "name: a\ncapabilities: [{tool_pattern: \"fs.[ab]\"}]\n",
        );
        let file = dir.path().join("a.yaml");
        assert!(wait_until(limit, || {
            let seen = events.lock().unwrap_or_else(|p| p.into_inner());
            rejected_files(&seen).contains(&file)
        }));
        assert_eq!(registry.get("a").map(|c| c.version.clone()), tightened);

        // Restore.
        write(dir.path(), "a.yaml", &context_yaml("a", "/workspace"));
        assert!(wait_until(limit, || registry
            .get("a")
            .map(|c| c.version.clone())
            == before));
        drop(handle);
    }
}
