//! `sealgate store backup FILE`, `sealgate store check` and `sealgate store import-sled DIR` (SPEC 12 r3).
//! Each finds the store as `serve` does: `--config FILE`, the same defaults and `SEALGATE_*` variables.
//! Backup and check only read, so they run beside a gateway that is serving.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::config::Config;

#[derive(clap::Subcommand)]
pub enum StoreCommand {
    /// Write a consistent copy of the embedded store to FILE while the gateway runs (SQLite's online
    /// backup); restore it by stopping the gateway and putting FILE in place of data_dir/sealgate.db.
    Backup {
        /// YAML configuration (as for `serve`).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Where the copy goes; an existing file is refused.
        file: PathBuf,
    },
    /// Run the database's integrity check and verify the audit chain it holds; exit 1 on any fault.
    Check {
        /// YAML configuration (as for `serve`).
        #[arg(long)]
        config: Option<PathBuf>,
    },
    /// Copy a sled data folder of an earlier release (sessions, claims with their answers, API
    /// contexts, approvals, budgets and the audit chain, hashes unchanged) into a new embedded store.
    ImportSled {
        /// YAML configuration (as for `serve`); its data_dir must not hold a store yet.
        #[arg(long)]
        config: Option<PathBuf>,
        /// The earlier release's data folder (the one holding sled's `db` and `conf` files).
        dir: PathBuf,
    },
}

pub async fn run(command: StoreCommand) -> ExitCode {
    let outcome = match command {
        StoreCommand::Backup { config, file } => backup(config.as_deref(), &file),
        StoreCommand::Check { config } => check(config.as_deref()).await,
        StoreCommand::ImportSled { config, dir } => match embedded_dir(config.as_deref()) {
            Ok(data_dir) => super::import_sled::run(&data_dir, &dir).await,
            Err(problem) => Err(problem),
        },
    };
    match outcome {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(problem) => {
            eprintln!("{problem}");
            ExitCode::FAILURE
        }
    }
}

/// The embedded store's data folder, as `serve` would open it; an error for a PostgreSQL store, whose
/// backups and checks are PostgreSQL's own tools.
fn embedded_dir(config: Option<&Path>) -> Result<PathBuf, String> {
    let config = Config::load(config)?;
    if config.store != "embedded" {
        return Err(
            "this configuration's store is PostgreSQL: back it up with pg_dump or its provider's \
             backups, and check it with amcheck; `sealgate audit verify` checks the chain of an export"
                .to_owned(),
        );
    }
    Ok(config.resolve(&config.data_dir))
}

fn backup(config: Option<&Path>, file: &Path) -> Result<String, String> {
    let dir = embedded_dir(config)?;
    // Its failures are mostly about FILE (exists, no such folder), which "store unavailable" would misname.
    let events = super::sqlite::backup(&dir, file).map_err(|e| match e {
        super::StoreError::Unavailable(why) => why,
        other => other.to_string(),
    })?;
    Ok(format!(
        "ok: {} written, a consistent copy of {} ({events} audit events)",
        file.display(),
        super::SqliteStore::path_in(&dir).display()
    ))
}

async fn check(config: Option<&Path>) -> Result<String, String> {
    let dir = embedded_dir(config)?;
    let mut walker = crate::audit::ChainWalker::default();
    let mut line = 0;
    super::sqlite::check(&dir, &mut |event| {
        line += 1;
        walker
            .push_line(Ok(event), line)
            .map(drop)
            .map_err(|broken| format!("the audit chain is broken: {broken}"))
    })?;
    if line == 0 {
        return Ok("ok: integrity check passed; the store holds no audit events yet".to_owned());
    }
    let report = walker.finish().map_err(|broken| broken.to_string())?;
    Ok(format!(
        "ok: integrity check passed; {} events, seq {}..{}, chain intact (last hash {})",
        report.events, report.first_seq, report.last_seq, report.last_hash
    ))
}
