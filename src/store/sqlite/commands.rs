//! The `store backup` and `store check` commands' work on the database file: SQLite's online backup and
//! integrity check, beside a running gateway or without one.

use std::path::{Path, PathBuf};

use rusqlite::Connection;

use super::packed::Stored;
use super::sql::db;
use super::{threads, SqliteStore, FILE_NAME};
use crate::store::{StoreError, StoreResult};

/// Writes a consistent copy of the store in `dir` to `file` (mode 0600, synced) with SQLite's online
/// backup, in one step, so the copy is one committed state even while a gateway writes. Returns how many
/// audit events the copy holds.
pub fn backup(dir: &Path, file: &Path) -> StoreResult<u64> {
    let source = threads::open_reader(&existing_database(dir)?)?;
    let mut target = create_backup_file(file)?;
    let copied = copy_into(&source, file, &mut target);
    if copied.is_err() {
        let _ = std::fs::remove_file(file);
    }
    copied
}

/// FILE, new, with `O_EXCL | O_NOFOLLOW` (SPEC 20 rule 14): the backup is written through this descriptor,
/// so a name swapped for a symlink after it was made cannot send the store's contents elsewhere.
fn create_backup_file(file: &Path) -> StoreResult<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .mode(0o600)
        .open(file)
        .map_err(|e| StoreError::unavailable(format!("cannot create {}: {e}", file.display())))
}

/// SQLite's backup API writes to a database it opens by name, so the copy is made in a private folder of
/// its own beside FILE (mode 0700: nobody else can reach into it), then copied into `target` and synced.
fn copy_into(source: &Connection, file: &Path, target: &mut std::fs::File) -> StoreResult<u64> {
    let beside = file.parent().filter(|p| !p.as_os_str().is_empty());
    let staging = tempfile::Builder::new()
        .prefix(".sealgate-backup-")
        .tempdir_in(beside.unwrap_or(Path::new(".")))
        .map_err(|e| {
            StoreError::unavailable(format!(
                "cannot make a folder beside {}: {e}",
                file.display()
            ))
        })?;
    let copy = staging.path().join(FILE_NAME);
    let events = backup_to(source, &copy)?;
    let mut staged = std::fs::File::open(&copy)
        .map_err(|e| StoreError::unavailable(format!("cannot read {}: {e}", copy.display())))?;
    std::io::copy(&mut staged, target)
        .and_then(|_| target.sync_all())
        .map_err(|e| StoreError::unavailable(format!("cannot write {}: {e}", file.display())))?;
    crate::files::sync_parent(file).map_err(StoreError::unavailable)?;
    Ok(events)
}

/// A consistent copy of `source` as a plain database at `copy` (no WAL beside it to lose); returns how many
/// audit events it holds.
fn backup_to(source: &Connection, copy: &Path) -> StoreResult<u64> {
    let mut target = Connection::open(copy).map_err(db)?;
    {
        let backup = rusqlite::backup::Backup::new(source, &mut target).map_err(db)?;
        match backup.step(-1).map_err(db)? {
            rusqlite::backup::StepResult::Done => {}
            _ => {
                return Err(StoreError::unavailable(
                    "the backup did not complete in one step",
                ))
            }
        }
    }
    target
        .query_row("PRAGMA journal_mode = DELETE", [], |_| Ok(()))
        .map_err(db)?;
    let events: i64 = target
        .query_row("SELECT count(*) FROM audit_events", [], |row| row.get(0))
        .map_err(db)?;
    Ok(u64::try_from(events).unwrap_or(0))
}

/// The database file in `dir`, which must exist (a command that only reads never creates one).
fn existing_database(dir: &Path) -> StoreResult<PathBuf> {
    let path = SqliteStore::path_in(dir);
    if !path.is_file() {
        return Err(StoreError::unavailable(format!(
            "no embedded store at {}",
            path.display()
        )));
    }
    Ok(path)
}

/// `sealgate store check`: SQLite's integrity check, then the audit chain walked from seq 1 (`visit`
/// gets each event's text, in seq order). Fails naming the first problem.
pub fn check(
    dir: &Path,
    visit: &mut dyn FnMut(String) -> Result<(), String>,
) -> Result<(), String> {
    let conn = threads::open_reader(&existing_database(dir).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    let problems: Vec<String> = conn
        .prepare("PRAGMA integrity_check(10)")
        .and_then(|mut s| s.query_map([], |row| row.get(0))?.collect())
        .map_err(|e| format!("integrity check could not run: {e}"))?;
    if problems != ["ok"] {
        return Err(format!("integrity check failed: {}", problems.join("; ")));
    }
    let mut events = conn
        .prepare("SELECT event FROM audit_events ORDER BY seq")
        .map_err(|e| e.to_string())?;
    let mut rows = events.query([]).map_err(|e| e.to_string())?;
    while let Some(row) = rows.next().map_err(|e| e.to_string())? {
        let Stored(text) = row.get(0).map_err(|e| e.to_string())?;
        visit(text)?;
    }
    Ok(())
}
