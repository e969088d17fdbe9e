//! The audit log (SPEC section 9): one tamper-evident, hash-chained event per decision and per state
//! change, made durable before the response it describes is sent, copied to an optional JSON-lines file
//! and to standard output, and queryable newest first.
//!
//! The pipeline builds an [`AuditEvent`] where a decision is made and awaits [`AuditLog::record`]; an
//! error there means the event is not durable, and the call must be refused with 5005. The store is
//! behind [`AuditBackend`], so this module knows nothing about sled or PostgreSQL.

mod chain;
mod event;
mod query;
mod sink;
pub mod testing;
mod writer;

#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot};

pub use chain::{format_at, verify_chain, ChainBreak, VerifyReport, GENESIS_HASH};
pub use event::{AuditEvent, Decision, EventType};
pub use query::{AuditPage, AuditQuery, DEFAULT_LIMIT, MAX_LIMIT};
pub use writer::WriterOptions;

use sink::FileSink;
use writer::{Command, Job, Writer};

/// Where events are stored durably: implemented by the store (sled, PostgreSQL). Calls block; the audit
/// log makes them on blocking threads.
pub trait AuditBackend: Send + Sync + 'static {
    /// The last event written (its seq and hash), `None` when the store holds no event.
    fn head(&self) -> Result<Option<ChainHead>, String>;
    /// Stores chained events, given in seq order and continuing the head. `Ok` means every one of them
    /// is durable (flushed); on `Err` the writer re-reads the head before the next batch, so a store that
    /// kept part of the batch is continued from what it kept.
    fn append(&self, events: &[serde_json::Value]) -> Result<(), String>;
    /// Calls `visit` with stored events in descending seq order, starting below `before_seq` (from the
    /// newest when `None`), until `visit` returns false or the events run out.
    fn scan_newest_first(
        &self,
        before_seq: Option<u64>,
        visit: &mut dyn FnMut(&serde_json::Value) -> bool,
    ) -> Result<(), String>;
}

/// The last event of a chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainHead {
    pub seq: u64,
    pub hash: String,
}

/// `audit:` in the configuration (SPEC 11).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuditConfig {
    /// JSON-lines copy of every event.
    pub file: Option<PathBuf>,
    /// Also print every event as one JSON line on standard output.
    pub stdout: bool,
    /// Keep payloads and tool answers in events (SPEC 9.1: off by default).
    pub include_payloads: bool,
    /// Rotate `file` once it reaches this size: it is renamed to `<file>.<first_seq>-<last_seq>`.
    pub rotate_bytes: Option<u64>,
}

/// What a durable event got.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Recorded {
    pub event_id: String,
    pub seq: u64,
    pub at: String,
    pub hash: String,
}

/// Why an event is not durable. Any of them means: refuse the call with 5005, forward nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuditError {
    #[error("audit store unavailable: {0}")]
    Store(String),
    #[error("audit file could not be written: {0}")]
    FileSink(String),
    /// The event breaks the SPEC 9.1 table (a bug in the caller).
    #[error("audit event is invalid: {0}")]
    InvalidEvent(String),
    #[error("audit log is shut down")]
    Closed,
}

/// The audit log handle; cheap to clone.
#[derive(Clone)]
pub struct AuditLog {
    inner: Arc<Inner>,
}

struct Inner {
    tx: mpsc::Sender<Command>,
    backend: Arc<dyn AuditBackend>,
    include_payloads: bool,
    unreadable: Mutex<UnreadableWindow>,
    suppressed: Arc<AtomicU64>,
}

/// A fixed one-second window that admits a few unreadable-body events.
struct UnreadableWindow {
    started: Instant,
    used: u32,
    per_second: u32,
}

impl UnreadableWindow {
    fn admit(&mut self, now: Instant) -> bool {
        if now.duration_since(self.started) >= Duration::from_secs(1) {
            self.started = now;
            self.used = 0;
        }
        if self.used < self.per_second {
            self.used += 1;
            true
        } else {
            false
        }
    }
}

impl AuditLog {
    /// Reads the chain head, opens the file sink and spawns the writer on the current tokio runtime.
    /// Call at start-up: the head and the file's last line are read synchronously.
    pub fn start(backend: Arc<dyn AuditBackend>, cfg: &AuditConfig) -> Result<AuditLog, String> {
        Self::start_with(backend, cfg, WriterOptions::default())
    }

    /// [`AuditLog::start`] with explicit writer tuning.
    pub fn start_with(
        backend: Arc<dyn AuditBackend>,
        cfg: &AuditConfig,
        options: WriterOptions,
    ) -> Result<AuditLog, String> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| "the audit log needs a tokio runtime".to_owned())?;
        if options.max_batch == 0 || options.queue_capacity == 0 {
            return Err("audit writer batch size and queue capacity must be at least 1".to_owned());
        }
        if options.suppressed_report_interval.is_zero() {
            return Err("audit suppressed-report interval must not be zero".to_owned());
        }
        let head = backend
            .head()
            .map_err(|e| format!("audit store unavailable: {e}"))?;
        if let Some(head) = &head {
            if head.seq == 0 || !event::is_sha256_hex(&head.hash) {
                return Err(format!(
                    "audit store returned an invalid chain head {head:?}"
                ));
            }
        }
        let file = match &cfg.file {
            Some(path) => Some(Arc::new(Mutex::new(FileSink::open(
                path.clone(),
                cfg.rotate_bytes,
            )?))),
            None if cfg.rotate_bytes.is_some() => {
                return Err("audit.rotate_bytes is set but audit.file is not".to_owned());
            }
            None => None,
        };
        let (tx, rx) = mpsc::channel(options.queue_capacity);
        let suppressed = Arc::new(AtomicU64::new(0));
        let writer = Writer {
            backend: Arc::clone(&backend),
            head: Some(head.unwrap_or_else(|| ChainHead {
                seq: 0,
                hash: GENESIS_HASH.to_owned(),
            })),
            file,
            stdout: cfg.stdout,
            max_batch: options.max_batch,
            report_interval: options.suppressed_report_interval,
            suppressed: Arc::clone(&suppressed),
            rx,
        };
        runtime.spawn(writer.run());
        Ok(AuditLog {
            inner: Arc::new(Inner {
                tx,
                backend,
                include_payloads: cfg.include_payloads,
                unreadable: Mutex::new(UnreadableWindow {
                    started: Instant::now(),
                    used: 0,
                    per_second: options.unreadable_per_second,
                }),
                suppressed,
            }),
        })
    }

    /// Records one event and returns once it is durable in the store (and written to the file sink).
    /// Dropping the future does not withdraw an event that was already queued.
    pub async fn record(&self, event: AuditEvent) -> Result<Recorded, AuditError> {
        let event = event
            .into_object(self.inner.include_payloads)
            .map_err(AuditError::InvalidEvent)?;
        let (reply, answer) = oneshot::channel();
        let job = Job {
            event,
            reply: Some(reply),
            count_decision: true,
        };
        self.inner
            .tx
            .send(Command::Record(job))
            .await
            .map_err(|_| AuditError::Closed)?;
        answer.await.map_err(|_| AuditError::Closed)?
    }

    /// Records that a body could not be read as an envelope (SPEC 3: code 1000, client address and byte
    /// count only). Fire-and-forget and rate-limited, so a flood of garbage cannot flood the store; the
    /// bodies left out are counted and that count is recorded periodically.
    pub fn record_unreadable(&self, client_addr: Option<SocketAddr>, bytes: usize) {
        // Counted here, not by the writer, so suppressed refusals still show in the metric.
        metrics::counter!("sealgate_decisions_total", "decision" => "deny", "code" => "1000")
            .increment(1);
        let admitted = self
            .inner
            .unreadable
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .admit(Instant::now());
        if !admitted {
            self.inner.suppressed.fetch_add(1, Ordering::AcqRel);
            return;
        }
        let mut event = AuditEvent::new(EventType::EnvelopeRejected)
            .code(1000)
            .bytes(u64::try_from(bytes).unwrap_or(u64::MAX));
        if let Some(addr) = client_addr {
            event = event.client_addr(addr);
        }
        let Ok(event) = event.into_object(false) else {
            return;
        };
        let job = Job {
            event,
            reply: None,
            count_decision: false,
        };
        if self.inner.tx.try_send(Command::Record(job)).is_err() {
            // A full queue must not block the request path; the event joins the suppressed count.
            self.inner.suppressed.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// One page of events, newest first (blocking: call it through `spawn_blocking`).
    pub fn query(&self, query: &AuditQuery) -> Result<AuditPage, String> {
        query.run(self.inner.backend.as_ref())
    }

    /// Walks the whole stored chain from its head down to seq 1 (blocking).
    pub fn verify_store(&self) -> Result<VerifyReport, ChainBreak> {
        chain::verify_backend(self.inner.backend.as_ref())
    }

    /// Writes every event already queued, records the suppressed count, and stops the writer. Later
    /// `record` calls get [`AuditError::Closed`].
    pub async fn shutdown(&self) {
        let (done, finished) = oneshot::channel();
        if self.inner.tx.send(Command::Shutdown(done)).await.is_ok() {
            let _ = finished.await;
        }
    }
}
