//! The JSON-lines file sink (`audit.file`), with size-based rotation.
//!
//! Each file must verify on its own with `sealgate audit verify`, so the sink never appends a batch that
//! does not link to the file's last line: after a failed write, a crash between the store and the file,
//! or a torn last line, it first rotates the file away and starts a new one (the store still holds every
//! event). All calls are blocking: [`Copies`] runs them on a thread of its own, after the store's commit.
//!
//! With a store shared by replicas the file is instead a per-replica log (SPEC 12): the events this
//! replica wrote, with the other replicas' seqs missing in between, so it is not a whole chain and only
//! a torn line starts a new file; `audit verify` applies to the export (`GET /v1/audit/export`).

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::chain::{parse_strict, Sealed};

/// Why the audit file cannot be opened, written or rotated. `path` is the live file.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("audit file {} is not a regular file", .0.display())]
    NotAFile(PathBuf),
    #[error("audit file {} cannot be read: {source}", path.display())]
    Unreadable {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("audit file {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("audit file {} cannot be rotated to {}: {source}", path.display(), target.display())]
    Rotate {
        path: PathBuf,
        target: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The folder's entry for the file is not synced; the message is `files::sync_parent`'s own.
    #[error("{0}")]
    SyncFolder(String),
}

impl FileError {
    fn io(path: &Path, source: io::Error) -> Self {
        FileError::Io {
            path: path.to_owned(),
            source,
        }
    }
}

/// Where the file's chain stands, as far as the sink knows.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tail {
    /// The file does not exist or is empty.
    Empty,
    /// The file's first event has `first_seq` and its last is (`last_seq`, `last_hash`).
    Linked {
        first_seq: u64,
        last_seq: u64,
        last_hash: String,
    },
    /// The file holds something the sink cannot link to (a torn line, a failed write).
    Unknown,
}

pub(crate) struct FileSink {
    path: PathBuf,
    rotate_bytes: Option<u64>,
    file: Option<File>,
    size: u64,
    tail: Tail,
    /// False for a per-replica log: a batch need not follow the file's last line.
    whole_chain: bool,
}

impl FileSink {
    /// Opens (or prepares to create) the file and reads where its chain ends. `rotate_bytes` is at
    /// least 1 (the caller checks the setting).
    pub(crate) fn open(path: PathBuf, rotate_bytes: Option<u64>) -> Result<FileSink, FileError> {
        let (size, tail) = match fs::metadata(&path) {
            Ok(meta) if !meta.is_file() => return Err(FileError::NotAFile(path)),
            Ok(meta) if meta.len() == 0 => (0, Tail::Empty),
            Ok(meta) => match read_tail(&path) {
                Ok(tail) => (meta.len(), tail),
                Err(source) => return Err(FileError::Unreadable { path, source }),
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => (0, Tail::Empty),
            Err(e) => return Err(FileError::io(&path, e)),
        };
        let mut sink = FileSink {
            path,
            rotate_bytes,
            file: None,
            size,
            tail,
            whole_chain: true,
        };
        // Open now so that a file that cannot be written stops start-up instead of the first call.
        sink.ensure_open()?;
        crate::files::tighten(&sink.path, 0o600, "audit.file");
        Ok(sink)
    }

    /// Makes the file a per-replica log (a store shared by replicas): batches are appended whether or
    /// not they follow the file's last line.
    pub(crate) fn per_replica_log(mut self) -> FileSink {
        self.whole_chain = false;
        self
    }

    /// The seq of the file's last event, when the file ends on a whole, chained line.
    pub(crate) fn last_seq(&self) -> Option<u64> {
        match &self.tail {
            Tail::Linked { last_seq, .. } => Some(*last_seq),
            Tail::Empty | Tail::Unknown => None,
        }
    }

    /// The highest seq any file of this sink ends at: the live file's last event, or the last seq that
    /// a rotated file's name records (`audit.jsonl.FIRST-LAST`). A live file that was just rotated, or
    /// that ends on a torn line, still leaves the chain's end in its rotated siblings.
    pub(crate) fn highest_seq(&self) -> Option<u64> {
        let prefix = format!("{}.", self.file_name());
        let rotated = self
            .path
            .parent()
            .map(|dir| {
                if dir.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    dir
                }
            })
            .and_then(|dir| fs::read_dir(dir).ok())
            .into_iter()
            .flatten()
            .filter_map(|entry| {
                let name = entry.ok()?.file_name().into_string().ok()?;
                let range = name.strip_prefix(&prefix)?;
                let (_, last) = range.split('.').next()?.split_once('-')?;
                last.parse::<u64>().ok()
            });
        rotated.chain(self.last_seq()).max()
    }

    fn file_name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "audit.jsonl".to_owned())
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one batch of chained events and syncs the file.
    pub(crate) fn write_batch(&mut self, events: &[Sealed]) -> Result<(), FileError> {
        let (Some(first), Some(last)) = (events.first(), events.last()) else {
            return Ok(());
        };
        let (first_seq, first_prev) = (first.seq, first.prev_hash.as_str());
        let (last_seq, last_hash) = (last.seq, last.hash.as_str());

        let links = match &self.tail {
            Tail::Empty => true,
            Tail::Linked {
                last_seq: file_last_seq,
                last_hash: file_last_hash,
                ..
            } => {
                !self.whole_chain
                    || (file_last_hash == first_prev
                        && file_last_seq.checked_add(1) == Some(first_seq))
            }
            Tail::Unknown => false,
        };
        if !links {
            // Appending would leave a file that no longer verifies; start a new one instead.
            self.rotate()?;
        }
        self.ensure_open()?;

        let mut buffer = Vec::with_capacity(events.iter().map(|e| e.line.len() + 1).sum());
        for event in events {
            buffer.extend_from_slice(event.line.as_bytes());
            buffer.push(b'\n');
        }
        let size_before = self.size;
        let tail_before = std::mem::replace(&mut self.tail, Tail::Unknown);
        let written = match self.file.as_mut() {
            Some(file) => file.write_all(&buffer).and_then(|()| file.sync_data()),
            None => Err(io::Error::other("audit file is not open")),
        };
        if let Err(e) = written {
            // Cut the partial batch off so that the file still ends on a whole, linked line.
            let restored = self
                .file
                .as_mut()
                .map(|file| file.set_len(size_before).and_then(|()| file.sync_data()));
            if matches!(restored, Some(Ok(()))) {
                self.tail = tail_before;
            }
            self.file = None;
            return Err(FileError::io(&self.path, e));
        }
        self.size = size_before.saturating_add(buffer.len() as u64);
        let first_in_file = match tail_before {
            Tail::Linked { first_seq, .. } => first_seq,
            _ => first_seq,
        };
        self.tail = Tail::Linked {
            first_seq: first_in_file,
            last_seq,
            last_hash: last_hash.to_owned(),
        };

        if self.rotate_bytes.is_some_and(|limit| self.size >= limit) {
            // The batch is already durable here; a failed rotation only lets the file grow.
            if let Err(e) = self.rotate() {
                tracing::warn!(target: "audit", error = %e, "audit file rotation failed");
            }
        }
        Ok(())
    }

    fn ensure_open(&mut self) -> Result<(), FileError> {
        if self.file.is_some() {
            return Ok(());
        }
        let existed = self.path.exists();
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(|e| FileError::io(&self.path, e))?;
        if !existed {
            crate::files::sync_parent(&self.path).map_err(FileError::SyncFolder)?;
        }
        self.file = Some(file);
        Ok(())
    }

    /// Renames the current file to `<name>.<first_seq>-<last_seq>` (or `<name>.unlinked-<millis>` when
    /// its chain is unknown); the next write starts a new file.
    fn rotate(&mut self) -> Result<(), FileError> {
        if self.size == 0 && self.tail == Tail::Empty {
            return Ok(());
        }
        let file_name = self.file_name();
        let suffix = match &self.tail {
            Tail::Linked {
                first_seq,
                last_seq,
                ..
            } => format!("{first_seq}-{last_seq}"),
            _ => format!("unlinked-{}", chrono::Utc::now().timestamp_millis()),
        };
        let mut target = self.path.with_file_name(format!("{file_name}.{suffix}"));
        let mut attempt = 1u32;
        while target.exists() {
            target = self
                .path
                .with_file_name(format!("{file_name}.{suffix}.{attempt}"));
            attempt = attempt.saturating_add(1);
        }
        self.file = None;
        if let Err(source) = fs::rename(&self.path, &target) {
            return Err(FileError::Rotate {
                path: self.path.clone(),
                target,
                source,
            });
        }
        crate::files::sync_parent(&self.path).map_err(FileError::SyncFolder)?;
        self.size = 0;
        self.tail = Tail::Empty;
        Ok(())
    }
}

/// Reads the first event's seq and the last event's seq and hash of an existing, non-empty file.
fn read_tail(path: &Path) -> io::Result<Tail> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    let last_line = read_last_line(&mut file, len)?;
    let Some(last_line) = last_line else {
        return Ok(Tail::Unknown);
    };
    let Ok(last) = parse_strict(&last_line) else {
        return Ok(Tail::Unknown);
    };
    file.seek(SeekFrom::Start(0))?;
    let mut first_line = String::new();
    BufReader::new(&mut file).read_line(&mut first_line)?;
    let first_seq = parse_strict(first_line.trim_end_matches('\n'))
        .ok()
        .and_then(|first| first.get("seq").and_then(Value::as_u64));
    match (
        first_seq,
        last.get("seq").and_then(Value::as_u64),
        last.get("hash").and_then(Value::as_str),
    ) {
        (Some(first_seq), Some(last_seq), Some(last_hash)) => Ok(Tail::Linked {
            first_seq,
            last_seq,
            last_hash: last_hash.to_owned(),
        }),
        _ => Ok(Tail::Unknown),
    }
}

/// The last complete line of a file (without its newline), read backwards in chunks so that a large file
/// is not read whole; `None` when the file does not end with a newline (a torn write).
fn read_last_line(file: &mut File, len: u64) -> io::Result<Option<String>> {
    const CHUNK: u64 = 64 * 1024;
    if len == 0 {
        return Ok(None);
    }
    let mut last_byte = [0u8; 1];
    file.seek(SeekFrom::Start(len - 1))?;
    file.read_exact(&mut last_byte)?;
    if last_byte != [b'\n'] {
        return Ok(None);
    }
    // Bytes of the last line, gathered from the end backwards.
    let mut collected: Vec<u8> = Vec::new();
    let mut end = len - 1;
    while end > 0 {
        let start = end.saturating_sub(CHUNK);
        let mut chunk = vec![0u8; (end - start) as usize];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(&mut chunk)?;
        if let Some(newline) = chunk.iter().rposition(|b| *b == b'\n') {
            let mut line = chunk.split_off(newline + 1);
            line.extend_from_slice(&collected);
            collected = line;
            break;
        }
        chunk.extend_from_slice(&collected);
        collected = chunk;
        end = start;
    }
    Ok(String::from_utf8(collected).ok())
}

/// Writes events to standard output, one JSON line each. Standard output has no durability to offer, so
/// a failure is logged rather than failing the calls.
/// The copies of the chain beside the store — the file and standard output — written on a thread of their
/// own after each commit, so that no caller waits for them. A copy that fails is reported (log and
/// `sealgate_audit_sink_errors_total`); the file catches up from the store at the next start.
pub(crate) struct Copies {
    tx: Option<std::sync::mpsc::Sender<Vec<Sealed>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Copies {
    /// None when there is nothing to copy to.
    pub(crate) fn start(file: Option<FileSink>, stdout: bool) -> io::Result<Option<Copies>> {
        if file.is_none() && !stdout {
            return Ok(None);
        }
        let (tx, rx) = std::sync::mpsc::channel::<Vec<Sealed>>();
        let thread = std::thread::Builder::new()
            .name("sg-audit-copies".into())
            .spawn(move || {
                let mut file = file;
                for batch in rx {
                    if let Some(sink) = file.as_mut() {
                        if let Err(error) = sink.write_batch(&batch) {
                            tracing::error!(target: "audit", %error, "audit file copy failed; the store holds the events");
                            metrics::counter!("sealgate_audit_sink_errors_total", "sink" => "file")
                                .increment(1);
                        }
                    }
                    if stdout {
                        write_stdout(&batch);
                    }
                }
            })?;
        Ok(Some(Copies {
            tx: Some(tx),
            thread: Some(thread),
        }))
    }

    /// Queues a committed batch.
    pub(crate) fn send(&self, batch: Vec<Sealed>) {
        if let Some(tx) = &self.tx {
            let _ = tx.send(batch);
        }
    }

    /// Writes what is queued and stops.
    pub(crate) fn finish(mut self) {
        drop(self.tx.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

pub(crate) fn write_stdout(events: &[Sealed]) {
    let stdout = io::stdout();
    let mut out = stdout.lock();
    let written = events
        .iter()
        .try_for_each(|event| writeln!(out, "{}", event.line))
        .and_then(|()| out.flush());
    if let Err(e) = written {
        metrics::counter!("sealgate_audit_sink_errors_total", "sink" => "stdout").increment(1);
        tracing::warn!(target: "audit", error = %e, "audit events could not be written to stdout");
    }
}
