//! The embedded store's schema: the migrations of `src/store/migrations/sqlite`, applied in order at open,
//! the version kept in `PRAGMA user_version`.

use rusqlite::Connection;

use super::sql::db;
use crate::store::{StoreError, StoreResult};

/// The migrations, in order: entry `i` brings the schema (`PRAGMA user_version`) to version `i + 1`.
const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/sqlite/0001_initial.sql"),
    include_str!("../migrations/sqlite/0002_replay_cover.sql"),
    include_str!("../migrations/sqlite/0003_console_sign_in.sql"),
    include_str!("../migrations/sqlite/0004_session_labels.sql"),
    include_str!("../migrations/sqlite/0005_tool_pins.sql"),
    include_str!("../migrations/sqlite/0006_context_shadows.sql"),
];

/// Applies the migrations the file lacks, each in its own transaction with its version.
pub(super) fn migrate(conn: &Connection) -> StoreResult<()> {
    let current: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(db)?;
    let current = usize::try_from(current).unwrap_or(usize::MAX);
    let known = MIGRATIONS.len();
    if current > known {
        return Err(StoreError::Unavailable(format!(
            "the store's schema is at version {current}, newer than the {known} this build knows: \
             refusing to start (upgrade sealgate)"
        )));
    }
    for (index, migration) in MIGRATIONS.iter().enumerate().skip(current) {
        let version = index + 1;
        conn.execute_batch(&format!(
            "BEGIN IMMEDIATE; {migration}; PRAGMA user_version = {version}; COMMIT;"
        ))
        .map_err(|e| {
            let _ = conn.execute_batch("ROLLBACK");
            StoreError::unavailable(format!("store schema migration {version} failed: {e}"))
        })?;
        tracing::info!(version, "store schema migrated");
    }
    Ok(())
}
