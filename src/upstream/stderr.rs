//! What a stdio MCP server writes on stderr, and when the gateway may log it (SPEC 9.1 r3, 20 r11).
//!
//! Lines written before the server's first call are its own (a banner, a traceback at import): the last
//! [`TAIL_LINES`] of them are logged at `warn` when the start ends, and at `error` with a failed start or an
//! exit. Lines written once a call was sent may quote that call's arguments: they are read and dropped,
//! unless the upstream sets `log_stderr: true`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::ChildStderr;
use tokio::sync::watch;

use super::health::{Health, Start};

/// How many of the last lines are kept for the log.
const TAIL_LINES: usize = 20;
/// Longer lines are cut into pieces of this size.
const MAX_LINE_BYTES: u64 = 8 * 1024;
/// How long a failed start waits for the rest of the server's stderr (a traceback is still being read
/// when the server's stdout closes).
const EXIT_GRACE: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Initialisation runs: a failure is reported by the start, with the tail.
    Starting,
    /// Initialised, no call sent yet.
    Running,
    /// A call was sent: lines may hold its argument values.
    Called,
}

struct Tail {
    phase: Phase,
    lines: VecDeque<String>,
    closed: bool,
}

/// The stderr of one server process.
pub(crate) struct StderrLog {
    upstream: Arc<str>,
    log_every_line: bool,
    health: Arc<Health>,
    start: Start,
    tail: Mutex<Tail>,
    closed: watch::Sender<bool>,
}

impl StderrLog {
    /// Starts reading `stderr`, of the server of `start`, on a task of its own.
    pub(crate) fn read(
        upstream: Arc<str>,
        log_every_line: bool,
        (health, start): (Arc<Health>, Start),
        stderr: ChildStderr,
    ) -> Arc<StderrLog> {
        let log = Arc::new(StderrLog {
            upstream,
            log_every_line,
            health,
            start,
            tail: Mutex::new(Tail {
                phase: Phase::Starting,
                lines: VecDeque::new(),
                closed: false,
            }),
            closed: watch::Sender::new(false),
        });
        tokio::spawn(log.clone().forward(stderr));
        log
    }

    /// The server initialised: what it wrote meanwhile is logged at `warn`.
    pub(crate) fn started(&self) {
        let (lines, closed) = {
            let mut tail = self.lock();
            tail.phase = Phase::Running;
            (tail.lines.clone(), tail.closed)
        };
        if !lines.is_empty() && !self.log_every_line {
            tracing::warn!(upstream = %self.upstream, stderr = ?lines, "the MCP server wrote on stderr while starting");
        }
        if closed {
            self.exited();
        }
    }

    /// A call is about to be sent: from now on what the server writes may hold argument values.
    pub(crate) fn calling(&self) {
        self.lock().phase = Phase::Called;
    }

    /// The last lines of a server whose start failed, once its stderr has closed (or after a short grace).
    pub(crate) async fn failed_start_tail(&self) -> VecDeque<String> {
        let mut closed = self.closed.subscribe();
        let _ = tokio::time::timeout(EXIT_GRACE, closed.wait_for(|closed| *closed)).await;
        self.lock().lines.clone()
    }

    async fn forward(self: Arc<Self>, stderr: ChildStderr) {
        let mut reader = BufReader::new(stderr);
        let mut line = Vec::new();
        loop {
            line.clear();
            match (&mut reader)
                .take(MAX_LINE_BYTES)
                .read_until(b'\n', &mut line)
                .await
            {
                Ok(0) | Err(_) => break,
                Ok(_) => self.note(String::from_utf8_lossy(&line).trim_end()),
            }
        }
        let phase = {
            let mut tail = self.lock();
            tail.closed = true;
            tail.phase
        };
        self.closed.send_replace(true);
        // While it starts, the start reports the failure, with the tail.
        if phase != Phase::Starting {
            self.exited();
        }
    }

    fn note(&self, line: &str) {
        if line.is_empty() {
            return;
        }
        let mut tail = self.lock();
        if tail.phase == Phase::Called && !self.log_every_line {
            return;
        }
        if tail.lines.len() == TAIL_LINES {
            tail.lines.pop_front();
        }
        tail.lines.push_back(line.to_owned());
        drop(tail);
        if self.log_every_line {
            tracing::warn!(upstream = %self.upstream, "tool stderr: {line}");
        }
    }

    /// The server's stderr closed after it started: it exited (or is about to).
    fn exited(&self) {
        let (phase, lines) = {
            let tail = self.lock();
            (tail.phase, tail.lines.clone())
        };
        let error = match phase {
            Phase::Called => "exited",
            _ => "exited before its first call",
        };
        if self.health.down(self.start, error) {
            tracing::error!(upstream = %self.upstream, stderr = ?lines, "the MCP server {error}");
        }
    }

    fn lock(&self) -> MutexGuard<'_, Tail> {
        self.tail.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
