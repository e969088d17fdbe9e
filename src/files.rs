//! Private state on disk (SPEC 11 r3): the data folder is 0700 and every file the gateway creates (store,
//! audit file and its rotated files, keys, demo files, archives) 0600, whatever the umask it was started
//! with. The class fix is the process umask, set once in `main`: every creation path, ours or a
//! library's (the store's own files), inherits it. Tools that the gateway starts get the operator's
//! umask back: their files are theirs to share.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::Path;
use std::sync::OnceLock;

use nix::sys::stat::Mode;

/// What the gateway's own folders and files may grant: their owner only.
const PRIVATE_UMASK: u32 = 0o077;
const PRIVATE_DIR: u32 = 0o700;

/// The umask the process was started with, for the tools it starts.
static OPERATOR_UMASK: OnceLock<Mode> = OnceLock::new();

/// Sets the process umask to 0o077 and remembers the one it replaces. Called first thing in `main`,
/// before any thread exists (the umask is process-wide).
pub fn private_umask() {
    let previous = nix::sys::stat::umask(Mode::from_bits_truncate(PRIVATE_UMASK));
    let _ = OPERATOR_UMASK.set(previous);
}

/// A tool started by the gateway (a stdio MCP server) creates its files under the umask the operator
/// started the gateway with, not the gateway's private one.
pub fn with_operator_umask(command: &mut tokio::process::Command) {
    let Some(&umask) = OPERATOR_UMASK.get() else {
        return;
    };
    // SAFETY: the closure runs in the child between fork and exec, where only async-signal-safe calls
    // are allowed; it makes one: umask(2), which allocates nothing and takes no lock.
    unsafe {
        command.pre_exec(move || {
            nix::sys::stat::umask(umask);
            Ok(())
        });
    }
}

/// Creates `dir` (and its missing parents) with mode 0700; an existing one is [`tighten`]ed.
pub fn private_dir(dir: &Path) -> Result<(), String> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(PRIVATE_DIR)
        .create(dir)
        .map_err(|e| format!("data_dir: cannot create {}: {e}", dir.display()))?;
    tighten(dir, PRIVATE_DIR, "data_dir");
    Ok(())
}

/// A folder or file of the gateway's that an earlier version (or another umask) left open to group or
/// others is made private (`mode`), with a warning naming `key`; one the gateway cannot change
/// (another owner) is a warning only. Made private rather than refused: it holds the store or the
/// audit trail, which no other user may read, and nobody else should depend on reading it.
pub fn tighten(path: &Path, mode: u32, key: &str) {
    let Ok(meta) = std::fs::metadata(path) else {
        return;
    };
    let was = meta.permissions().mode() & 0o777;
    if was & 0o077 == 0 {
        return;
    }
    match std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)) {
        Ok(()) => tracing::warn!(
            path = %path.display(),
            was = format!("{was:o}"),
            now = format!("{mode:o}"),
            "{key} granted access to other users; made private"
        ),
        Err(e) => tracing::warn!(
            path = %path.display(),
            mode = format!("{was:o}"),
            error = %e,
            "{key} grants access to other users and cannot be made private"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_data_folder_is_private_and_an_open_one_is_tightened() {
        let root = tempfile::tempdir().unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        let fresh = root.path().join("a/b");
        private_dir(&fresh).unwrap();
        assert_eq!(mode(&fresh), 0o700);
        let open = root.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        private_dir(&open).unwrap();
        assert_eq!(mode(&open), 0o700);
        let file = root.path().join("file");
        std::fs::write(&file, "").unwrap();
        assert!(private_dir(&file).unwrap_err().contains("cannot create"));
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        tighten(&file, 0o600, "audit.file");
        assert_eq!(mode(&file), 0o600);
    }
}
