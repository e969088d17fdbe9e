//! One embedded store serves one process (SPEC 20 rule 2). Two writers on one folder would each keep their
//! own replay set, rate windows and budget counts in memory and fork the chain, so the process that opens
//! the store for writing holds an exclusive advisory lock on `data_dir/sealgate.lock` while it lives. The
//! kernel lets go of it when the process ends, however it ends, so a crash never leaves a stale lock.
//! Commands that only read (`store backup`, `store check`) do not take it.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::store::{StoreError, StoreResult};

/// The lock file in `data_dir`; it holds the process id of its holder, for the message of the next one.
pub const LOCK_FILE: &str = "sealgate.lock";

/// Held for as long as the store is open; dropping it (or the process ending) releases the folder.
#[derive(Debug)]
pub struct FolderLock {
    file: File,
}

impl FolderLock {
    /// Takes the folder's lock, or fails at once naming the folder and the process that holds it.
    pub fn take(dir: &Path) -> StoreResult<FolderLock> {
        let path = dir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| StoreError::unavailable(format!("cannot open {}: {e}", path.display())))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(StoreError::unavailable(format!(
                    "the embedded store in {} is in use by {}: one store serves one process; stop \
                     that one first, or give this one another data_dir",
                    dir.display(),
                    holder(&mut file)
                )))
            }
            Err(TryLockError::Error(e)) => {
                return Err(StoreError::unavailable(format!(
                    "cannot lock {}: {e}",
                    path.display()
                )))
            }
        }
        write_holder(&mut file).map_err(|e| {
            StoreError::unavailable(format!("cannot write {}: {e}", path.display()))
        })?;
        Ok(FolderLock { file })
    }
}

impl Drop for FolderLock {
    /// Unlocks before the file closes: a child process forked meanwhile (an upstream's, before it runs
    /// its program) shares the lock until it does, and would keep the folder from being opened again.
    fn drop(&mut self) {
        let _ = self.file.unlock();
    }
}

/// "process 1234", as the holder wrote it; a holder that has not written yet is "another process".
fn holder(file: &mut File) -> String {
    let mut text = String::new();
    let _ = file.read_to_string(&mut text);
    match text.trim().parse::<u32>() {
        Ok(pid) => format!("process {pid}"),
        Err(_) => "another process".to_owned(),
    }
}

fn write_holder(file: &mut File) -> std::io::Result<()> {
    file.set_len(0)?;
    file.rewind()?;
    writeln!(file, "{}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_naming_the_first_until_it_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let first = FolderLock::take(dir.path()).unwrap();
        let refused = FolderLock::take(dir.path()).unwrap_err().to_string();
        assert!(
            refused.contains(&format!("process {}", std::process::id()))
                && refused.contains(&dir.path().display().to_string()),
            "{refused}"
        );
        drop(first);
        FolderLock::take(dir.path()).expect("free again once the holder lets go");
    }
}
