//! `sealgate audit verify FILE... [--keys JWKS]`: one chain across files (archives, then an export),
//! and, with keys, every checkpoint's signature and coverage, and the unsigned tail after the last one.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::checkpoint;
use super::jwks::KeyRing;
use super::key::io_error;
use super::Error;
use crate::audit::{ChainWalker, EventType, VerifyReport};

/// What the files held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrailReport {
    pub chain: VerifyReport,
    /// `AuditCheckpoint` events found (verified when keys were given).
    pub checkpoints: u64,
    /// The seq of the last checkpoint event.
    pub last_checkpoint: Option<u64>,
    /// Events after the last checkpoint (all of them when there is none): not signed yet.
    pub unsigned_tail: u64,
    /// The kids that signed the checkpoints, in order of first use.
    pub kids: Vec<String>,
}

/// Checks `files` as one chain, taken in the order of their first events (so that a shell glob of
/// archive files may come in any order); with `keys`, every checkpoint too, and at least one must be
/// there. The error names the file, line, seq and event that broke.
pub fn verify_files(files: &[PathBuf], keys: Option<&KeyRing>) -> Result<TrailReport, Error> {
    let mut ordered = Vec::with_capacity(files.len());
    for file in files {
        ordered.push((first_seq(file)?, file));
    }
    ordered.sort_by_key(|(seq, _)| *seq);
    let mut walker = ChainWalker::default();
    let mut trail = Trail::default();
    for (_, file) in ordered {
        walk_file(file, &mut walker, &mut trail, keys)?;
    }
    let chain = walker.finish().map_err(Error::Chain)?;
    if keys.is_some() && trail.checkpoints == 0 {
        return Err(Error::NoCheckpoint(chain.events));
    }
    Ok(TrailReport {
        unsigned_tail: chain.last_seq - trail.last_checkpoint.unwrap_or(chain.first_seq - 1),
        chain,
        checkpoints: trail.checkpoints,
        last_checkpoint: trail.last_checkpoint,
        kids: trail.kids,
    })
}

#[derive(Default)]
struct Trail {
    checkpoints: u64,
    last_checkpoint: Option<u64>,
    kids: Vec<String>,
}

fn walk_file(
    file: &Path,
    walker: &mut ChainWalker,
    trail: &mut Trail,
    keys: Option<&KeyRing>,
) -> Result<(), Error> {
    let opened = std::fs::File::open(file).map_err(io_error("open", file))?;
    for (index, line) in BufReader::new(opened).lines().enumerate() {
        let event = walker
            .push_line(line, index + 1)
            .map_err(|broken| Error::Chain(broken).at(file.display().to_string()))?;
        if event.get("type").and_then(Value::as_str) != Some(EventType::AuditCheckpoint.as_str()) {
            continue;
        }
        let seq = event.get("seq").and_then(Value::as_u64).unwrap_or(0);
        if let Some(keys) = keys {
            let kid = checkpoint::check(&event, keys).map_err(|reason| {
                let event_id = event.get("event_id").and_then(Value::as_str).unwrap_or("?");
                reason.at(format!(
                    "{}: line {}, seq {seq}, event_id {event_id}",
                    file.display(),
                    index + 1
                ))
            })?;
            if !trail.kids.contains(&kid) {
                trail.kids.push(kid);
            }
        }
        trail.checkpoints += 1;
        trail.last_checkpoint = Some(seq);
    }
    Ok(())
}

/// The seq of a file's first event, to put the files in chain order.
fn first_seq(file: &Path) -> Result<u64, Error> {
    let opened = std::fs::File::open(file).map_err(io_error("open", file))?;
    let mut first = String::new();
    BufReader::new(opened)
        .read_line(&mut first)
        .map_err(io_error("read", file))?;
    serde_json::from_str::<Value>(&first)
        .ok()
        .and_then(|event| event.get("seq").and_then(Value::as_u64))
        .ok_or_else(|| Error::NoFirstSeq {
            path: file.to_path_buf(),
        })
}
